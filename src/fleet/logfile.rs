//! A size-rotated log file for one supervised agent: `NAME.log`, rotated to
//! `NAME.log.1` … `NAME.log.KEEP` when it passes its size limit. The pump threads
//! of the agent's stdout and stderr share one, behind a mutex held per line.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
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

/// Copies `pipe` line by line into `log` on a thread named `name`, until EOF.
pub fn pump(name: String, pipe: impl Read + Send + 'static, log: Arc<Mutex<LogFile>>) {
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let mut r = BufReader::new(pipe);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if let Ok(mut l) = log.lock() {
                        l.write_line(&line);
                    }
                }
            }
        }
    });
    if let Err(e) = spawned {
        log::error!("cannot start a log pump thread: {e}");
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
