//! The task daemon's socket protocol: JSON lines over a unix socket, one request
//! line answered by one response line, many per connection. This file owns the
//! closed request enum (tagged by `op`), the task status enum and the typed answer
//! payloads shared by the daemon and `hive bash-mcp`. The framing is the
//! crate's JSON-lines transport (`proto::lines`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Longest inline wait the daemon honours for `run` and `status`, in seconds.
pub const MAX_WAIT_SECS: u64 = 30;

/// The inline wait of `run` when the caller gives none, in seconds.
pub const DEFAULT_RUN_WAIT_SECS: u64 = 3;

/// How much of the end of stdout and of stderr a task view carries, in bytes.
pub const TAIL_BYTES: u64 = 4096;

/// A request to the task daemon, as one JSON object per line with an `op` tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Starts `cmd` and waits up to `wait_seconds` (default 3, capped at 30, 0 for
    /// none) for it to end. An answer with `inline: true` means the task ended in
    /// the window and no completion wake will fire.
    Run {
        cmd: String,
        #[serde(default)]
        timeout_secs: Option<u64>,
        #[serde(default)]
        wait_seconds: Option<u64>,
    },
    /// The task's status, after waiting up to `wait_seconds` (default 0, capped at
    /// 30) for it to end.
    Status {
        id: String,
        #[serde(default)]
        wait_seconds: Option<u64>,
    },
    /// The tasks still pending or running.
    List {},
    /// Exit if no task is pending or running, so the supervisor can start the
    /// daemon again onto a new binary or config; refused by a daemon embedded
    /// in `hive serve`. Only `hive up` sends it.
    Retire {},
}

impl Request {
    /// The `op` tag of this request, for logs.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Run { .. } => "run",
            Request::Status { .. } => "status",
            Request::List {} => "list",
            Request::Retire {} => "retire",
        }
    }

    /// Parses one request line, with an error that names the problem.
    pub fn parse(line: &str) -> Result<Request, String> {
        let value: Value =
            serde_json::from_str(line).map_err(|e| format!("malformed JSON request line: {e}"))?;
        match value.get("op") {
            _ if !value.is_object() => {
                return Err("request must be a JSON object with an \"op\" field".into())
            }
            None => return Err("request has no \"op\" field (run, status or list)".into()),
            Some(Value::String(_)) => {}
            Some(_) => return Err("\"op\" must be a string".into()),
        }
        serde_json::from_value(value).map_err(|e| {
            let msg = e.to_string();
            if msg.starts_with("unknown variant") {
                format!("unknown op: {msg}")
            } else {
                format!("bad request: {msg}")
            }
        })
    }
}

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

/// Answer to `retire`: `retired` when the daemon had no task and is exiting;
/// else it goes on, with `running` tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetireReply {
    pub retired: bool,
    #[serde(default)]
    pub running: usize,
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
    fn requests_parse_with_defaults() {
        let cases = [
            (
                r#"{"op":"run","cmd":"ls"}"#,
                Request::Run {
                    cmd: "ls".into(),
                    timeout_secs: None,
                    wait_seconds: None,
                },
            ),
            (
                r#"{"op":"status","id":"4","wait_seconds":5}"#,
                Request::Status {
                    id: "4".into(),
                    wait_seconds: Some(5),
                },
            ),
            (r#"{"op":"list"}"#, Request::List {}),
            (r#"{"op":"retire"}"#, Request::Retire {}),
        ];
        for (line, want) in cases {
            let got = Request::parse(line).unwrap();
            assert_eq!(got, want);
            let again = serde_json::to_string(&got).unwrap();
            assert!(
                again.contains(&format!("\"op\":\"{}\"", got.op())),
                "{again}"
            );
        }
    }

    #[test]
    fn bad_requests_say_why() {
        let cases = [
            ("nope", "malformed JSON"),
            ("[1]", "JSON object"),
            (r#"{"cmd":"ls"}"#, "no \"op\""),
            (r#"{"op":1}"#, "must be a string"),
            (r#"{"op":"kill","id":"1"}"#, "unknown op"),
            (r#"{"op":"run"}"#, "missing field `cmd`"),
            (r#"{"op":"status","id":"1","x":1}"#, "unknown field `x`"),
        ];
        for (line, want) in cases {
            let e = Request::parse(line).unwrap_err();
            assert!(e.contains(want), "{line}: {e}");
        }
    }

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
