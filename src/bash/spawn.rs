//! Starting one task process. A task runs as `sh -c CMD`, or `bash -c CMD` with
//! `BASH_ENV` pointing at the bash env file when that file exists, in its own
//! process group (a `sys::ProcessGroup`), with stdin from /dev/null,
//! the state dir as its working directory, the daemon's environment without the
//! operator's variables (`crate::agent_proc`), and its stdout and stderr written
//! straight into the task's `.out` and `.err` files by the kernel, so nothing has
//! to be drained. A start that fails says whether it was a passing shortage of
//! resources ([`StartFault`]).

use crate::agent_proc::{self, StartFault};
use crate::sys::ProcessGroup;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// Where and how tasks run.
#[derive(Debug, Clone)]
pub struct Launch<'a> {
    /// The working directory of every task.
    pub cwd: &'a Path,
    /// The bash env file; used (with bash) only when it exists at start time.
    pub bash_env: Option<&'a Path>,
}

/// Why a task could not be started.
#[derive(Debug)]
pub struct SpawnError {
    /// What was being done, for the message.
    pub what: String,
    pub source: io::Error,
}

impl SpawnError {
    pub fn fault(&self) -> StartFault {
        StartFault::of(&self.source)
    }
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.source)
    }
}

fn output_file(path: &Path) -> Result<File, SpawnError> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|source| SpawnError {
            what: format!("cannot create the output file {}", path.display()),
            source,
        })
}

/// Starts `cmd`; returns its process group and the shell used.
pub fn spawn(
    launch: &Launch,
    cmd: &str,
    out: &Path,
    err: &Path,
) -> Result<(ProcessGroup, &'static str), SpawnError> {
    let (stdout, stderr) = (output_file(out)?, output_file(err)?);
    let env_file = launch.bash_env.filter(|p| p.is_file());
    let (shell, mut command) = match env_file {
        Some(file) => {
            let mut c = Command::new("bash");
            c.env("BASH_ENV", file);
            ("bash", c)
        }
        None => ("sh", Command::new("sh")),
    };
    command
        .arg("-c")
        .arg(cmd)
        .current_dir(launch.cwd)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr);
    agent_proc::scrub_operator_env(&mut command);
    let group = ProcessGroup::spawn(&mut command).map_err(|source| SpawnError {
        what: format!("cannot start `{shell} -c`"),
        source,
    })?;
    Ok((group, shell))
}

/// When process `pid` started, in clock ticks since boot (`/proc/PID/stat`
/// field 22); None when there is no such process.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: the fields
    // after it start past the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// SIGKILLs what is left of a task's group recorded by an earlier run of the
/// daemon, unless the number now belongs to someone else. While any member of
/// the old group lives, the kernel gives its number to no new process; so a
/// live process with that pid is either the old leader (same start time) or a
/// stranger that got the number after the whole group was gone (left alone).
/// Without a recorded start time (a record from an older daemon) a live
/// process with that pid cannot be told apart and is left alone.
pub fn kill_stale_group(pgid: i32, leader_start: Option<u64>) {
    match (start_time(pgid), leader_start) {
        (None, _) => crate::sys::kill_group(pgid),
        (Some(now), Some(then)) if now == then => crate::sys::kill_group(pgid),
        (Some(_), _) => log::info!(
            "process group {pgid} of an earlier run is gone; its number belongs to another \
             process now, which is left alone"
        ),
    }
}

/// The id of the running kernel boot, so a pgid recorded before a reboot is not
/// mistaken for a live task.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

#[cfg(test)]
mod stale_tests {
    use super::*;
    use std::os::unix::process::CommandExt;

    #[test]
    fn a_reused_group_number_is_never_signalled() {
        let mut c = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = c.id() as i32;
        let start = start_time(pid).expect("a live process has a start time");
        // Another start time: the number "belongs to someone else" and lives on.
        kill_stale_group(pid, Some(start + 1));
        kill_stale_group(pid, None);
        assert!(c.try_wait().unwrap().is_none(), "left alone");
        kill_stale_group(pid, Some(start));
        let status = c.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
