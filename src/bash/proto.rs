//! The task daemon's socket protocol: JSON lines over a unix socket, one request
//! line answered by one response line, many per connection. The closed request
//! enum (tagged by `op`) and the answer to `retire` are in the contract
//! (`proto::bashwire`), since `hive up`'s supervisor speaks them too; this file
//! owns the task status enum and the typed answer payloads shared by the daemon
//! and `hive bash-mcp`, and the daemon's waits. The framing is the crate's
//! JSON-lines transport (`proto::lines`).

use serde::{Deserialize, Serialize};

/// The requests and the answer to `retire`, for the daemon's clients outside
/// the crate that know them by this path.
pub use crate::proto::bashwire::{Request, RetireReply};

/// Longest inline wait the daemon honours for `run` and `status`, in seconds.
pub const MAX_WAIT_SECS: u64 = 30;

/// The inline wait of `run` when the caller gives none, in seconds.
pub const DEFAULT_RUN_WAIT_SECS: u64 = 3;

/// How much of the end of stdout and of stderr a task view carries, in bytes.
pub const TAIL_BYTES: u64 = 4096;

/// Where a task is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    /// Recorded, not yet started.
    Pending,
    /// Its process is running.
    Running,
    /// It ended by itself (or could not be started; then `error` says why).
    Done,
    /// It ran past `timeout_secs` and its process group was killed.
    TimedOut,
    /// Its process group was killed because the daemon stopped or restarted.
    Interrupted,
}

impl TaskStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::Pending => "pending",
            TaskStatus::Running => "running",
            TaskStatus::Done => "done",
            TaskStatus::TimedOut => "timed_out",
            TaskStatus::Interrupted => "interrupted",
        }
    }

    /// True once the task will not change any more.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            TaskStatus::Done | TaskStatus::TimedOut | TaskStatus::Interrupted
        )
    }
}

/// Everything a caller sees of one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskView {
    pub id: String,
    pub cmd: String,
    pub status: TaskStatus,
    /// The exit code, when the process exited by itself.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// The signal that ended the process, when one did.
    #[serde(default)]
    pub signal: Option<i32>,
    /// Why the task could not be started or watched.
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Unix seconds when the task was started.
    pub started_at: i64,
    /// Wall-clock run time so far (running) or in total (finished).
    pub duration_secs: f64,
    pub stdout_path: String,
    pub stderr_path: String,
    /// Size of the whole output files.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// The last [`TAIL_BYTES`] of each file.
    pub stdout_tail: String,
    pub stderr_tail: String,
}

/// Answer to `run` and `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskReply {
    pub task: TaskView,
    /// `run` only: the task ended inside the wait window and this answer is its
    /// result, so no completion wake will fire.
    #[serde(default)]
    pub inline: bool,
}

/// A task that is still pending or running, as `get_loose_ends` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskSummary {
    pub id: String,
    pub cmd: String,
    pub status: TaskStatus,
    /// Unix seconds when the task was started.
    pub started_at: i64,
    pub running_secs: f64,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// Answer to `list`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListReply {
    pub tasks: Vec<TaskSummary>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_use_the_documented_names() {
        for (s, name) in [
            (TaskStatus::Pending, "pending"),
            (TaskStatus::Running, "running"),
            (TaskStatus::Done, "done"),
            (TaskStatus::TimedOut, "timed_out"),
            (TaskStatus::Interrupted, "interrupted"),
        ] {
            assert_eq!(s.as_str(), name);
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{name}\""));
        }
    }
}
