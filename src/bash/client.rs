//! The blocking client of the task daemon's socket, used by `hive bash-mcp`,
//! on the transport's client connection (`proto::lines::Conn`). A call can be
//! abandoned through a cancel channel: the socket is shut down and the call
//! returns at once.

use super::proto::MAX_WAIT_SECS;
use crate::proto::bashwire::Request;
use crate::proto::lines::{self, Conn};
use crossbeam_channel::Receiver;
use serde::de::DeserializeOwned;
use std::path::Path;
use std::time::Duration;

/// Who answers, in messages.
const PEER: &str = "the bash task daemon";

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

impl From<lines::CallError> for CallError {
    fn from(e: lines::CallError) -> CallError {
        match e {
            lines::CallError::Refused(e) => CallError::Refused(e),
            lines::CallError::Io(e) => {
                CallError::Io(format!("talking to the bash task daemon: {e}"))
            }
            lines::CallError::Cancelled => CallError::Cancelled,
        }
    }
}

/// Sends `req` to the daemon at `socket` and decodes its answer as `T`. The
/// call returns [`CallError::Cancelled`] as soon as `cancel` fires or is
/// disconnected (pass `never()` for no cancel).
pub fn call<T: DeserializeOwned + Send + 'static>(
    socket: &Path,
    req: &Request,
    cancel: &Receiver<()>,
) -> Result<T, CallError> {
    let mut conn = Conn::connect(socket, PEER).map_err(|e| {
        CallError::NoDaemon(format!(
            "the bash task daemon is not running: cannot connect to {} ({e}). It runs \
             as `hive bash-daemon` next to the harness (under `hive up`, or its own unit), \
             or inside `hive serve`; check that it is up (its log: NAME.bash.log under \
             hive up) and that HIVE_BASH_SOCKET points at its socket.",
            socket.display()
        ))
    })?;
    let wait = match req {
        Request::Run { wait_seconds, .. } | Request::Status { wait_seconds, .. } => {
            wait_seconds.unwrap_or(0).min(MAX_WAIT_SECS)
        }
        Request::List {} | Request::Retire {} => 0,
    };
    conn.set_read_timeout(Some(Duration::from_secs(wait) + ANSWER_MARGIN))
        .map_err(|e| CallError::Io(format!("talking to the bash task daemon: {e}")))?;
    let line = serde_json::to_string(req).map_err(|e| CallError::Io(e.to_string()))?;
    let answer = conn.exchange(&line, req.op(), Some(cancel))?;
    Ok(lines::decode(&answer, PEER, req.op())?)
}
