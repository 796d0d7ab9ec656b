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

/// The id of the running kernel boot, so a pgid recorded before a reboot is not
/// mistaken for a live task.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}
