//! The bash task daemon's requests and its answer to `retire`, as they are on
//! its socket (one JSON object per line, on the crate's JSON-lines transport):
//! the contract between the daemon (`bash/`) and the two that ask it, `hive
//! bash-mcp` and `hive up`'s supervisor of the daemons (`fleet/bashd.rs`,
//! which asks an idle daemon to `retire` onto a new binary). The task views
//! the other answers carry stay with the daemon (`bash::proto`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// Answer to `retire`: `retired` when the daemon had no task and is exiting;
/// else it goes on, with `running` tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetireReply {
    pub retired: bool,
    #[serde(default)]
    pub running: usize,
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
    fn retire_is_one_line_each_way() {
        assert_eq!(
            serde_json::to_string(&Request::Retire {}).unwrap(),
            r#"{"op":"retire"}"#
        );
        let r: RetireReply = serde_json::from_str(r#"{"retired":false,"running":2}"#).unwrap();
        assert_eq!(
            r,
            RetireReply {
                retired: false,
                running: 2
            }
        );
        let r: RetireReply = serde_json::from_str(r#"{"retired":true}"#).unwrap();
        assert_eq!(r.running, 0);
    }
}
