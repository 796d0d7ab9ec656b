//! The blocking client of the task daemon's socket, used by `hive bash-mcp` and
//! by the hyperhive MCP server's `get_loose_ends` (through [`running_tasks`]).
//! A call can be abandoned through a cancel channel: the socket is shut down and
//! the call returns at once.

use super::proto::{ListReply, Request, TaskSummary, MAX_WAIT_SECS};
use crate::wire::{self, Line};
use crossbeam_channel::{never, select, Receiver};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::io::{BufReader, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// How long an answer may take beyond the request's own inline wait.
const ANSWER_MARGIN: Duration = Duration::from_secs(15);

/// Why a call failed.
#[derive(Debug, Clone, PartialEq)]
pub enum CallError {
    /// Nobody listens on the socket.
    NoDaemon(String),
    /// The daemon answered `ok:false` with this message.
    Refused(String),
    /// The connection broke or the answer was unreadable.
    Io(String),
    /// The caller's cancel channel fired.
    Cancelled,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::NoDaemon(e) | CallError::Refused(e) | CallError::Io(e) => f.write_str(e),
            CallError::Cancelled => f.write_str("the call was cancelled"),
        }
    }
}

/// Sends `req` to the daemon at `socket` and decodes its answer as `T`. The
/// call returns [`CallError::Cancelled`] as soon as `cancel` fires or is
/// disconnected (pass [`never`] for no cancel).
pub fn call<T: DeserializeOwned + Send + 'static>(
    socket: &Path,
    req: &Request,
    cancel: &Receiver<()>,
) -> Result<T, CallError> {
    let stream = UnixStream::connect(socket).map_err(|e| {
        CallError::NoDaemon(format!(
            "the bash task daemon is not running: cannot connect to {} ({e}). It runs \
             inside `hive serve` (or as `hive bash-daemon`); check that the harness is up \
             and that HIVE_BASH_SOCKET points at its socket.",
            socket.display()
        ))
    })?;
    let wait = match req {
        Request::Run { wait_seconds, .. } | Request::Status { wait_seconds, .. } => {
            wait_seconds.unwrap_or(0).min(MAX_WAIT_SECS)
        }
        Request::List {} => 0,
    };
    let io = |e: std::io::Error| CallError::Io(format!("talking to the bash task daemon: {e}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(wait) + ANSWER_MARGIN))
        .map_err(io)?;
    let line = serde_json::to_string(req).map_err(|e| CallError::Io(e.to_string()))?;
    let killer = stream.try_clone().map_err(io)?;
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("bash-client".into())
        .spawn(move || {
            let _ = done_tx.send(exchange(stream, &line));
        })
        .map_err(io)?;
    let answer = select! {
        recv(done_rx) -> r => r.unwrap_or_else(|_| Err(CallError::Io("the call thread died".into()))),
        recv(cancel) -> _ => {
            let _ = killer.shutdown(Shutdown::Both);
            return Err(CallError::Cancelled);
        }
    }?;
    serde_json::from_value(Value::Object(answer)).map_err(|e| {
        CallError::Io(format!(
            "unexpected answer from the bash task daemon to {}: {e}",
            req.op()
        ))
    })
}

fn exchange(stream: UnixStream, line: &str) -> Result<serde_json::Map<String, Value>, CallError> {
    let io = |e: std::io::Error| CallError::Io(format!("talking to the bash task daemon: {e}"));
    let mut writer = stream.try_clone().map_err(io)?;
    writer
        .write_all(format!("{line}\n").as_bytes())
        .map_err(io)?;
    let mut reader = BufReader::new(stream);
    let text = match wire::read_line(&mut reader, wire::MAX_LINE).map_err(io)? {
        Line::Text(s) => s,
        Line::Eof => {
            return Err(CallError::Io(
                "the bash task daemon closed the connection without answering".into(),
            ))
        }
        Line::TooLong | Line::NotUtf8 => {
            return Err(CallError::Io(
                "unreadable answer from the bash task daemon".into(),
            ))
        }
    };
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| CallError::Io(format!("malformed answer from the bash task daemon: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(CallError::Io(
            "answer from the bash task daemon is not an object".into(),
        ));
    };
    match map.remove("ok") {
        Some(Value::Bool(true)) => Ok(map),
        _ => Err(CallError::Refused(
            map.get("error")
                .and_then(Value::as_str)
                .unwrap_or("unknown error")
                .to_string(),
        )),
    }
}

/// The tasks still pending or running, for `get_loose_ends`, which lists them as
/// their own kind (`bash_tasks`) next to questions and reminders.
pub fn running_tasks(socket: &Path) -> Result<Vec<TaskSummary>, String> {
    call::<ListReply>(socket, &Request::List {}, &never())
        .map(|r| r.tasks)
        .map_err(|e| e.to_string())
}
