//! What every process hive starts on an agent's behalf has in common: claude
//! (and through it `hive mcp`, `hive bash-mcp` and any extra MCP server), the
//! `claude plugin` commands and every bash task. [`scrub_operator_env`] keeps the
//! operator's variables out of their environment — [`OPERATOR_VARS`] and
//! [`OPERATOR_PREFIXES`] are the one list of them — while the process that
//! starts them keeps what it needs for itself. [`StartFault`] tells a start that
//! failed for a passing shortage of resources from one that needs a fix, so the
//! caller can keep the work it was about to do instead of failing it.
//! [`CLAUDE_CLI_WINDOW`] is the range of Claude Code CLI versions hive is
//! tested against, and [`cli_window_notice`] what a run outside it is told.

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

/// The OpenTelemetry settings (`OTEL_…`): the collector's endpoint and its
/// headers (often a token) are the operator's (issue 43). Only with the fleet
/// file's `telemetry.cli: true` does the harness set them on claude itself.
pub const TELEMETRY_PREFIX: &str = "OTEL_";

/// Is `name` one of the OpenTelemetry settings?
pub fn is_telemetry_var(name: &str) -> bool {
    name.starts_with(TELEMETRY_PREFIX)
}

/// Is `name` one of the operator's variables (the OpenTelemetry settings
/// included)?
pub fn is_operator_var(name: &str) -> bool {
    OPERATOR_VARS.contains(&name)
        || OPERATOR_PREFIXES.iter().any(|p| name.starts_with(p))
        || is_telemetry_var(name)
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

/// The Claude Code CLI versions hive supports, oldest and newest: CI runs
/// every real-CLI test against both ends (`docs/claude-cli.md` says how the
/// window moves). A version outside it still runs, with one notice.
pub const CLAUDE_CLI_WINDOW: (&str, &str) = ("2.1.197", "2.1.332");

/// The npm package of the CLI, named in notices about it.
pub const CLAUDE_CLI_PACKAGE: &str = "@anthropic-ai/claude-code";

/// A CLI version as `MAJOR.MINOR.PATCH` numbers; None for anything else
/// (`claude --version` prints `2.1.332 (Claude Code)`: the first word counts).
pub fn cli_version(text: &str) -> Option<(u32, u32, u32)> {
    let word = text.split_whitespace().next()?;
    let mut parts = word.split('.').map(|p| p.parse::<u32>().ok());
    let v = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(v)
}

/// Whether `version` lies inside [`CLAUDE_CLI_WINDOW`]; an unreadable
/// version is outside.
pub fn cli_in_window(version: &str) -> bool {
    let (Some(v), Some(lo), Some(hi)) = (
        cli_version(version),
        cli_version(CLAUDE_CLI_WINDOW.0),
        cli_version(CLAUDE_CLI_WINDOW.1),
    ) else {
        return false;
    };
    (lo..=hi).contains(&v)
}

/// What the operator is told, once per hive and version, of a CLI outside
/// the window; None inside it. The turn runs either way.
pub fn cli_window_notice(version: &str) -> Option<String> {
    if cli_in_window(version) {
        return None;
    }
    let (lo, hi) = CLAUDE_CLI_WINDOW;
    let shown: String = version
        .chars()
        .filter(|c| !c.is_control())
        .take(40)
        .collect();
    Some(format!(
        "Claude Code CLI {shown:?} is outside the versions hive is tested with \
         ({lo} to {hi}); turns run, but what the CLI prints may be read wrong. \
         Install one inside the window (npm install -g {CLAUDE_CLI_PACKAGE}@{hi}) \
         or point HIVE_CLAUDE_BIN at one."
    ))
}

/// The `BASH_ENV` script of an agent's bash (`hive env-script` prints it,
/// the nix module installs it, and `hive up` writes it into an agent's run
/// dir when its entry's `cargo_short_messages` is on): it lives in
/// `src/bash/bash-env.sh`, read and linted as shell there.
pub const BASH_ENV_SCRIPT: &str = include_str!("bash/bash-env.sh");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cli_window_holds_its_ends_and_refuses_the_rest() {
        let (lo, hi) = CLAUDE_CLI_WINDOW;
        assert_eq!(cli_version("2.1.332 (Claude Code)"), Some((2, 1, 332)));
        for v in [lo, hi, "2.1.250", "2.1.250 (Claude Code)"] {
            assert!(cli_in_window(v), "{v}");
            assert_eq!(cli_window_notice(v), None, "{v}");
        }
        for v in [
            "2.1.196", "2.1.333", "2.2.0", "1.9.999", "", "2.1", "2.1.x", "v2.1.200",
        ] {
            assert!(!cli_in_window(v), "{v}");
        }
        let notice = cli_window_notice("2.1.400\u{1b}[2J").unwrap();
        assert!(
            notice.contains("2.1.400") && notice.contains(hi),
            "{notice}"
        );
        assert!(!notice.contains('\u{1b}'), "{notice}");
    }

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
