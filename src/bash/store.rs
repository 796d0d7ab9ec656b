//! The task records on disk, under `<state>/harness/bash-tasks/`: one
//! `<id>.json` per task next to its `<id>.out` and `<id>.err`, and `next-id`, the
//! counter that makes ids unique and never reused. Every file is written whole to a
//! temporary name and renamed, so a crash leaves the old or the new version. Only
//! the daemon's coordinator thread writes here.

use super::proto::{TaskStatus, TaskSummary};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// What is known about one task, as persisted in `<id>.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub id: String,
    pub cmd: String,
    pub status: TaskStatus,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Unix milliseconds.
    pub started_at_ms: i64,
    #[serde(default)]
    pub ended_at_ms: Option<i64>,
    /// The process group of a started task (the leader's pid).
    #[serde(default)]
    pub pgid: Option<i32>,
    /// The kernel boot the pgid belongs to; a pgid from another boot is never
    /// signalled.
    #[serde(default)]
    pub boot_id: Option<String>,
    /// When the group's leader started (`/proc/PID/stat` field 22, clock ticks
    /// since boot): a pgid from an earlier run is signalled only while it still
    /// names this task, never a process that got the number since.
    #[serde(default)]
    pub leader_start: Option<u64>,
    /// `sh`, or `bash` when the bash env file was used.
    #[serde(default)]
    pub shell: String,
    /// The task ended and its completion wake has not reached the broker yet.
    #[serde(default)]
    pub wake_pending: bool,
    /// The task's result was the answer to its `run` call, so no wake is due.
    #[serde(default)]
    pub returned_inline: bool,
}

impl TaskRecord {
    pub fn new(id: String, cmd: String, timeout_secs: Option<u64>) -> TaskRecord {
        TaskRecord {
            id,
            cmd,
            status: TaskStatus::Pending,
            exit_code: None,
            leader_start: None,
            signal: None,
            error: None,
            timeout_secs,
            started_at_ms: now_ms(),
            ended_at_ms: None,
            pgid: None,
            boot_id: None,
            shell: String::new(),
            wake_pending: false,
            returned_inline: false,
        }
    }

    /// Wall-clock run time: until the end, or until now while running.
    pub fn duration_secs(&self) -> f64 {
        let end = self.ended_at_ms.unwrap_or_else(now_ms);
        (end - self.started_at_ms).max(0) as f64 / 1000.0
    }

    pub fn summary(&self) -> TaskSummary {
        TaskSummary {
            id: self.id.clone(),
            cmd: self.cmd.clone(),
            status: self.status,
            started_at: self.started_at_ms / 1000,
            running_secs: self.duration_secs(),
            timeout_secs: self.timeout_secs,
        }
    }
}

/// Unix time in milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A record or the id counter could not be written.
#[derive(Debug)]
pub struct StoreError {
    pub path: PathBuf,
    pub source: io::Error,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "cannot write {}: {}", self.path.display(), self.source)
    }
}

/// The task directory and the id counter.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    next_id: u64,
}

impl Store {
    /// Opens (creating) `dir` and loads every task record in it. Unreadable
    /// records are logged and skipped.
    pub fn open(dir: &Path) -> Result<(Store, Vec<TaskRecord>), String> {
        fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create the task directory {}: {e}", dir.display()))?;
        let entries = fs::read_dir(dir)
            .map_err(|e| format!("cannot read the task directory {}: {e}", dir.display()))?;
        let mut records = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let parsed = fs::read_to_string(&path)
                .map_err(|e| e.to_string())
                .and_then(|text| {
                    serde_json::from_str::<TaskRecord>(&text).map_err(|e| e.to_string())
                });
            match parsed {
                Ok(rec) => records.push(rec),
                Err(e) => log::warn!("skipping the task record {}: {e}", path.display()),
            }
        }
        records.sort_by_key(|r| r.id.parse::<u64>().unwrap_or(0));
        let counter = fs::read_to_string(dir.join("next-id"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .unwrap_or(1);
        let past = records
            .iter()
            .filter_map(|r| r.id.parse::<u64>().ok())
            .max()
            .map_or(1, |n| n + 1);
        let store = Store {
            dir: dir.to_path_buf(),
            next_id: counter.max(past),
        };
        Ok((store, records))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A fresh id; the counter is persisted before the id is handed out.
    pub fn allocate_id(&mut self) -> Result<String, StoreError> {
        let id = self.next_id;
        write_atomic(
            &self.dir.join("next-id"),
            format!("{}\n", id + 1).as_bytes(),
        )?;
        self.next_id = id + 1;
        Ok(id.to_string())
    }

    pub fn save(&self, rec: &TaskRecord) -> Result<(), StoreError> {
        let path = self.dir.join(format!("{}.json", rec.id));
        let text = serde_json::to_vec_pretty(rec).map_err(|e| StoreError {
            path: path.clone(),
            source: io::Error::other(e),
        })?;
        write_atomic(&path, &text)
    }

    pub fn out_path(&self, id: &str) -> PathBuf {
        out_path(&self.dir, id)
    }

    pub fn err_path(&self, id: &str) -> PathBuf {
        err_path(&self.dir, id)
    }
}

/// Where task `id`'s stdout goes.
pub fn out_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.out"))
}

/// Where task `id`'s stderr goes.
pub fn err_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!("{id}.err"))
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(bytes)?;
        fs::rename(&tmp, path)
    };
    write().map_err(|source| StoreError {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_never_reused_across_reopens() {
        let dir = std::env::temp_dir().join(format!("hive-store-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (mut store, recs) = Store::open(&dir).unwrap();
        assert!(recs.is_empty());
        let a = store.allocate_id().unwrap();
        let b = store.allocate_id().unwrap();
        assert_eq!((a.as_str(), b.as_str()), ("1", "2"));
        let mut rec = TaskRecord::new(b.clone(), "true".into(), Some(5));
        rec.status = TaskStatus::Running;
        store.save(&rec).unwrap();
        // A lost counter file must not bring back an id that has a record.
        fs::remove_file(dir.join("next-id")).unwrap();
        let (mut store, recs) = Store::open(&dir).unwrap();
        assert_eq!(recs, vec![rec]);
        assert_eq!(store.allocate_id().unwrap(), "3");
        let (mut store, _) = Store::open(&dir).unwrap();
        assert_eq!(store.allocate_id().unwrap(), "4");
        fs::remove_dir_all(&dir).unwrap();
    }
}
