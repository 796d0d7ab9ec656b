//! What every process hive starts on an agent's behalf has in common: claude
//! (and through it `hive mcp`, `hive bash-mcp` and any extra MCP server), the
//! `claude plugin` commands and every bash task. [`scrub_operator_env`] keeps the
//! operator's variables out of their environment — [`OPERATOR_VARS`] and
//! [`OPERATOR_PREFIXES`] are the one list of them — while the process that
//! starts them keeps what it needs for itself. [`StartFault`] tells a start that
//! failed for a passing shortage of resources from one that needs a fix, so the
//! caller can keep the work it was about to do instead of failing it.

use std::ffi::OsString;
use std::io;
use std::process::Command;

/// The operator's variables, by exact name: the agent page's and the
/// dashboard's tokens and the operator's broker socket. An agent that saw them
/// could act as the operator.
pub const OPERATOR_VARS: &[&str] = &["HIVE_WEB_TOKEN", "HIVE_DASHBOARD_TOKEN", "HIVE_HOST_SOCKET"];

/// The operator's variables, by prefix: every setting of the agent page
/// (`HIVE_WEB_…`), of the dashboard (`HIVE_DASHBOARD_…`) and of `hive up`'s
/// supervisor (`HIVE_UP_…`), including those added later.
pub const OPERATOR_PREFIXES: &[&str] = &["HIVE_WEB_", "HIVE_DASHBOARD_", "HIVE_UP_"];

/// Is `name` one of the operator's variables?
pub fn is_operator_var(name: &str) -> bool {
    OPERATOR_VARS.contains(&name) || OPERATOR_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Removes every operator variable from `cmd`'s environment: those it would
/// inherit from this process and those set on it explicitly.
pub fn scrub_operator_env(cmd: &mut Command) {
    let inherited = std::env::vars_os().map(|(k, _)| k);
    let explicit: Vec<OsString> = cmd.get_envs().map(|(k, _)| k.to_os_string()).collect();
    let doomed: Vec<OsString> = inherited
        .chain(explicit)
        .filter(|k| k.to_str().is_some_and(is_operator_var))
        .collect();
    for k in doomed {
        cmd.env_remove(k);
    }
}

/// Why a process could not be started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFault {
    /// The host is short of file descriptors, memory, processes or threads
    /// (`EMFILE`, `ENFILE`, `ENOMEM`, `EAGAIN`), or the program is being
    /// replaced (`ETXTBSY`): it passes by itself, so try again later.
    Resources,
    /// The program or the working directory is missing or unusable (`ENOENT`,
    /// `EACCES`, `ENOEXEC`, …): someone has to fix the setup.
    Setup,
}

impl StartFault {
    /// Classifies the error of a failed `spawn`, pipe, file or thread creation.
    pub fn of(e: &io::Error) -> StartFault {
        match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM | libc::EAGAIN | libc::ETXTBSY) => {
                StartFault::Resources
            }
            _ if e.kind() == io::ErrorKind::OutOfMemory => StartFault::Resources,
            _ => StartFault::Setup,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_variables_are_named_and_prefixed() {
        for name in [
            "HIVE_WEB_TOKEN",
            "HIVE_DASHBOARD_TOKEN",
            "HIVE_HOST_SOCKET",
            "HIVE_DASHBOARD_BIND",
            "HIVE_WEB_HOSTS",
            "HIVE_UP_RESTART_MAX_MS",
        ] {
            assert!(is_operator_var(name), "{name}");
        }
        for name in [
            "HIVE_SOCKET",
            "HIVE_BASH_SOCKET",
            "HIVE_LABEL",
            "PATH",
            "HOME",
            "ANTHROPIC_API_KEY",
            "HIVE_WEB",
        ] {
            assert!(!is_operator_var(name), "{name}");
        }
    }

    #[test]
    fn scrub_removes_inherited_and_explicit_operator_variables() {
        let mut cmd = Command::new("env");
        cmd.env("HIVE_DASHBOARD_TOKEN", "x").env("KEEP_ME", "y");
        scrub_operator_env(&mut cmd);
        let envs: Vec<(String, Option<String>)> = cmd
            .get_envs()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.map(|v| v.to_string_lossy().into_owned()),
                )
            })
            .collect();
        assert!(
            envs.contains(&("HIVE_DASHBOARD_TOKEN".into(), None)),
            "{envs:?}"
        );
        assert!(
            envs.contains(&("KEEP_ME".into(), Some("y".into()))),
            "{envs:?}"
        );
    }

    #[test]
    fn start_faults_tell_shortages_from_setup_errors() {
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::EAGAIN] {
            let e = io::Error::from_raw_os_error(errno);
            assert_eq!(StartFault::of(&e), StartFault::Resources, "{e}");
        }
        for errno in [libc::ENOENT, libc::EACCES, libc::ENOEXEC, libc::ENOTDIR] {
            let e = io::Error::from_raw_os_error(errno);
            assert_eq!(StartFault::of(&e), StartFault::Setup, "{e}");
        }
    }
}
