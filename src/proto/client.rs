//! The typed client of the broker's sockets that `hive wake`, the operator
//! commands, the dashboard, `hive serve`, `hive mcp` and the bash task daemon
//! all use: [`Client::call`] sends a command and returns its own answer type,
//! so no caller digs in an untyped map. Errors say which socket and what to do.
//!
//! A harness or bash-task daemon that `hive up` started with a credential
//! (a socket pair's end, inherited) makes every broker connection through it
//! rather than on the agent's socket: [`Dial`] is where a process's
//! connections come from, the one value its threads share.

use super::command::{Command, Request};
use super::lines::{self, CallError, Conn};
use crossbeam_channel::Receiver;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The variable that names the descriptor of an inherited credential (see
/// [`Dial`]; a `HIVE_UP_…` one: no process an agent starts gets it, and the
/// number alone gives nothing, as the descriptor is closed on exec).
pub const CREDENTIAL_FD_VAR: &str = "HIVE_UP_BROKER_FD";

/// How a [`Dial::Credential`] makes a connection.
type Connect = Arc<dyn Fn() -> io::Result<UnixStream> + Send + Sync>;

/// Where a process's broker connections come from: the agent's socket, or
/// its own credential (the socket's path kept for messages). A credential
/// (`sys::fd::Credential`) is one end of a socket pair whose other end the
/// broker holds: `hive up` made it outside the agent's sandbox and handed it
/// down as [`CREDENTIAL_FD_VAR`]. Each connection is a fresh socket pair, one
/// end sent over it; the broker serves that as a connection of the process
/// that holds the credential, and takes its own reports only there.
#[derive(Clone)]
pub enum Dial {
    Socket(PathBuf),
    Credential { socket: PathBuf, connect: Connect },
}

impl std::fmt::Debug for Dial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dial::Socket(p) => write!(f, "Socket({})", p.display()),
            Dial::Credential { socket, .. } => write!(f, "Credential({})", socket.display()),
        }
    }
}

impl Dial {
    /// Connections made by `connect` (through a credential); `socket` is
    /// the agent's, named in messages.
    pub fn through(
        socket: PathBuf,
        connect: impl Fn() -> io::Result<UnixStream> + Send + Sync + 'static,
    ) -> Dial {
        Dial::Credential {
            socket,
            connect: Arc::new(connect),
        }
    }

    /// The agent's socket (for messages; a credential's connections are not
    /// made there).
    pub fn socket(&self) -> &Path {
        match self {
            Dial::Socket(p) | Dial::Credential { socket: p, .. } => p,
        }
    }

    /// A new connection to the broker.
    pub fn connect(&self) -> Result<Client, ClientError> {
        match self {
            Dial::Socket(p) => Client::connect(p),
            Dial::Credential { socket, connect } => {
                let stream = connect().map_err(|e| ClientError::NoBroker {
                    path: socket.clone(),
                    detail: format!("the credential hive up handed down failed: {e}"),
                })?;
                Ok(Client::over(stream, socket))
            }
        }
    }
}

/// Who answers on a broker socket, in messages.
const PEER: &str = "the broker";

/// Why a call to the broker failed.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientError {
    /// The socket is missing or nobody listens on it.
    NoBroker { path: PathBuf, detail: String },
    /// The socket is there but this user may not connect to it.
    PermissionDenied { path: PathBuf },
    /// The broker answered `ok:false`.
    Refused(String),
    /// The connection broke or the answer was unreadable.
    Io(String),
    /// The caller gave up (its cancel channel fired).
    Cancelled,
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NoBroker { path, detail } => write!(
                f,
                "no broker at {} — is hive broker running? ({detail})",
                path.display()
            ),
            ClientError::PermissionDenied { path } => write!(
                f,
                "permission denied on {}: run as the agent's user (the socket's owner or \
                 group), or have the operator give the socket to your user with \
                 socket_uid/socket_gid (operator_gid for the host socket) in the hive config",
                path.display()
            ),
            ClientError::Refused(e) => write!(f, "broker refused: {e}"),
            ClientError::Io(e) => write!(f, "broker connection failed: {e}"),
            ClientError::Cancelled => f.write_str("the call was cancelled"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<CallError> for ClientError {
    fn from(e: CallError) -> ClientError {
        match e {
            CallError::Refused(e) => ClientError::Refused(e),
            CallError::Io(e) => ClientError::Io(e),
            CallError::Cancelled => ClientError::Cancelled,
        }
    }
}

/// Decodes the broker's answer line to command `C`.
pub fn decode<C: Command>(answer: &str) -> Result<C::Reply, ClientError> {
    lines::decode(answer, PEER, C::CMD).map_err(ClientError::from)
}

/// A blocking connection to one broker socket. Not shared between threads.
pub struct Client {
    path: PathBuf,
    conn: Conn,
}

impl Client {
    /// Connects to the socket at `path`.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let conn = Conn::connect(path, PEER).map_err(|e| match e.kind() {
            io::ErrorKind::PermissionDenied => ClientError::PermissionDenied {
                path: path.to_path_buf(),
            },
            _ => ClientError::NoBroker {
                path: path.to_path_buf(),
                detail: e.to_string(),
            },
        })?;
        Ok(Client {
            path: path.to_path_buf(),
            conn,
        })
    }

    /// A client on a stream made another way (a credential's); `path` is
    /// the socket named in its messages.
    pub fn over(stream: UnixStream, path: &Path) -> Client {
        Client {
            path: path.to_path_buf(),
            conn: Conn::over(stream, PEER),
        }
    }

    /// The socket path this client is connected to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sets the read timeout for answers (None blocks forever).
    pub fn set_read_timeout(&self, dur: Option<Duration>) -> io::Result<()> {
        self.conn.set_read_timeout(dur)
    }

    /// A second handle on the stream; `shutdown(Both)` on it makes a blocked call
    /// return at once with an error.
    pub fn shutdown_handle(&self) -> io::Result<UnixStream> {
        self.conn.shutdown_handle()
    }

    /// Sends `cmd` and returns its answer, or the broker's refusal.
    pub fn call<C: Command>(&mut self, cmd: &C) -> Result<C::Reply, ClientError> {
        let line = self.exchange(&cmd.clone().into(), None)?;
        decode::<C>(&line)
    }

    /// [`Client::call`], abandoned with [`ClientError::Cancelled`] as soon as
    /// `cancel` fires or is dropped.
    pub fn call_cancellable<C: Command>(
        &mut self,
        cmd: &C,
        cancel: &Receiver<()>,
    ) -> Result<C::Reply, ClientError> {
        let line = self.exchange(&cmd.clone().into(), Some(cancel))?;
        decode::<C>(&line)
    }

    /// Sends a request and returns the broker's answer line as it came (`ok`
    /// or not), for a caller that decodes it later with [`decode`] (a thread
    /// that forwards requests of several types).
    pub fn request(&mut self, req: &Request) -> Result<String, ClientError> {
        self.exchange(req, None)
    }

    /// Sends `reqs` in one write and returns their answer lines as they
    /// came, in order ([`Conn::exchange_all`]): the answers before a broken
    /// connection, then its error.
    pub fn request_all(&mut self, reqs: &[Request]) -> Vec<Result<String, ClientError>> {
        let mut lines = Vec::with_capacity(reqs.len());
        for req in reqs {
            match serde_json::to_string(req) {
                Ok(line) => lines.push((line, req.cmd())),
                Err(e) => return vec![Err(ClientError::Io(e.to_string()))],
            }
        }
        self.conn
            .exchange_all(&lines)
            .into_iter()
            .map(|r| r.map_err(ClientError::from))
            .collect()
    }

    /// Sends one line as it is and returns the answer line as it came: for
    /// scripts and tests that speak the protocol by hand (including lines no
    /// [`Request`] can produce).
    pub fn call_line(&mut self, line: &str) -> Result<String, ClientError> {
        Ok(self.conn.exchange(line, "the request", None)?)
    }

    fn exchange(
        &mut self,
        req: &Request,
        cancel: Option<&Receiver<()>>,
    ) -> Result<String, ClientError> {
        let line = serde_json::to_string(req).map_err(|e| ClientError::Io(e.to_string()))?;
        Ok(self.conn.exchange(&line, req.cmd(), cancel)?)
    }
}
