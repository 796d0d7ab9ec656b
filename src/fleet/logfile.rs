//! A size-rotated log file for one supervised agent: `NAME.log`, rotated to
//! `NAME.log.1` … `NAME.log.KEEP` when it passes its size limit. The child's
//! stdout and stderr are each a [`Pipe`] that turns the bytes read into whole
//! lines; `child.rs`'s one thread reads every child's pipes and writes their
//! lines here, behind a mutex held per line.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub struct LogFile {
    path: PathBuf,
    file: Option<File>,
    size: u64,
    max_bytes: u64,
    keep: u32,
}

impl LogFile {
    pub fn open(path: PathBuf, max_bytes: u64, keep: u32) -> LogFile {
        // Whoever starts first (an agent, its bash daemon, the bridge) finds
        // the logs dir there.
        if let Some(dir) = path.parent() {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir);
        }
        let file = OpenOptions::new().create(true).append(true).open(&path);
        if let Err(e) = &file {
            log::warn!("cannot open the log {}: {e}", path.display());
        }
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        LogFile {
            path,
            file: file.ok(),
            size,
            max_bytes: max_bytes.max(1024),
            keep,
        }
    }

    fn rotate(&mut self) {
        self.file = None;
        for n in (1..self.keep).rev() {
            let _ = std::fs::rename(rotated(&self.path, n), rotated(&self.path, n + 1));
        }
        if self.keep == 0 {
            let _ = std::fs::remove_file(&self.path);
        } else {
            let _ = std::fs::rename(&self.path, rotated(&self.path, 1));
        }
        self.file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .ok();
        self.size = 0;
    }

    pub fn write_line(&mut self, line: &[u8]) {
        if self.size + line.len() as u64 > self.max_bytes {
            self.rotate();
        }
        if let Some(f) = self.file.as_mut() {
            if f.write_all(line).is_ok() {
                self.size += line.len() as u64;
            }
        }
    }
}

fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

/// The longest line a [`Pipe`] holds back waiting for its newline: a longer
/// one goes to the log in pieces of this size.
const MAX_LINE: usize = 64 * 1024;

/// One output pipe of a child (its stdout or its stderr), read by the one
/// thread that reads them all (`child.rs`): bytes as they come, written to
/// `log` a whole line at a time, so the two pipes of one child never cut
/// into each other's lines.
pub struct Pipe {
    fd: std::os::fd::OwnedFd,
    /// What came after the last newline.
    partial: Vec<u8>,
    log: Arc<Mutex<LogFile>>,
}

impl Pipe {
    /// The read end `fd` of a child's pipe, made non-blocking here, its
    /// lines going to `log`.
    pub fn new(fd: std::os::fd::OwnedFd, log: Arc<Mutex<LogFile>>) -> Pipe {
        use std::os::fd::AsRawFd;
        // SAFETY: fcntl on a descriptor we own; no memory is shared.
        unsafe {
            let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
            }
        }
        Pipe {
            fd,
            partial: Vec::new(),
            log,
        }
    }

    pub fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// Reads what the pipe holds now (one read, so no pipe keeps the
    /// reader from the others) and writes the whole lines. False once the
    /// pipe is at its end (or failed): the rest went to the log, and the
    /// pipe is done.
    pub fn on_readable(&mut self) -> bool {
        let mut buf = [0u8; 16 * 1024];
        // SAFETY: read(2) into a buffer we own, at most its length.
        let got = unsafe { libc::read(self.fd(), buf.as_mut_ptr().cast(), buf.len()) };
        let read = if got < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(got as usize)
        };
        let n = match read {
            Ok(0) => {
                self.end();
                return false;
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => return true,
            Err(_) => {
                self.end();
                return false;
            }
        };
        self.take(&buf[..n]);
        true
    }

    /// `bytes` just read: the whole lines to the log, the rest kept.
    fn take(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        let Ok(mut log) = self.log.lock() else {
            self.partial.clear();
            return;
        };
        let mut from = 0;
        while let Some(nl) = self.partial[from..].iter().position(|b| *b == b'\n') {
            log.write_line(&self.partial[from..from + nl + 1]);
            from += nl + 1;
        }
        while self.partial.len() - from >= MAX_LINE {
            log.write_line(&self.partial[from..from + MAX_LINE]);
            from += MAX_LINE;
        }
        self.partial.drain(..from);
    }

    /// The end of the pipe: a last line without its newline goes as it is.
    fn end(&mut self) {
        if !self.partial.is_empty() {
            if let Ok(mut log) = self.log.lock() {
                log.write_line(&self.partial);
            }
            self.partial.clear();
        }
    }
}

/// The agents' logs under one directory (`NAME.log`), as the broker reads them
/// for `get_logs` (the lifecycle port's [`LogTail`](crate::broker::lifecycle::LogTail)).
pub struct AgentLogs {
    dir: PathBuf,
}

impl AgentLogs {
    pub fn new(dir: PathBuf) -> AgentLogs {
        AgentLogs { dir }
    }
}

impl crate::broker::lifecycle::LogTail for AgentLogs {
    fn tail(&self, agent: &str, lines: usize) -> Result<String, String> {
        tail(&self.dir.join(format!("{agent}.log")), lines)
    }
}

/// The last `lines` lines of an agent's log, reading the rotated file before it
/// when the current one is short.
pub fn tail(path: &Path, lines: usize) -> Result<String, String> {
    let mut text = String::new();
    let mut found = false;
    for p in [rotated(path, 1), path.to_path_buf()] {
        if let Ok(t) = std::fs::read(&p) {
            found = true;
            text.push_str(&String::from_utf8_lossy(&t));
        }
    }
    if !found {
        return Err(format!("no log at {} yet", path.display()));
    }
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    Ok(all[from..].join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotates_at_the_limit_and_keeps_n() {
        let dir = std::env::temp_dir().join(format!("hive-logfile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.log");
        let mut l = LogFile::open(path.clone(), 1024, 2);
        for i in 0..100 {
            l.write_line(format!("line {i:03} padding padding padding\n").as_bytes());
        }
        assert!(rotated(&path, 1).exists());
        assert!(rotated(&path, 2).exists());
        assert!(!rotated(&path, 3).exists());
        assert!(std::fs::metadata(&path).unwrap().len() <= 1024);
        let t = tail(&path, 3).unwrap();
        assert!(t.ends_with("line 099 padding padding padding"), "{t}");
        assert_eq!(t.lines().count(), 3);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
