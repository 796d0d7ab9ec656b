//! A reader that stops reading (`hive agents | head -1`) ends an operator
//! command quietly, with the status a SIGPIPE death gives (141), as every Unix
//! tool does, and never a panic on the terminal.

mod common;

use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

#[test]
fn a_closed_stdout_ends_a_printing_command_quietly() {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors this test then owns.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both were just made and are owned by nothing else.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // The reader is gone before the command prints a byte.
    drop(read_end);
    let out = Command::new(common::hive::hive_bin())
        .arg("env-script")
        .stdin(Stdio::null())
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .output()
        .expect("run hive env-script");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "a panic reached the user: {err}");
    assert!(err.is_empty(), "nothing is said on stderr: {err}");
    assert_eq!(out.status.code(), Some(141), "{out:?}");
}
