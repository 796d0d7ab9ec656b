//! One connection of the bridge to its broker socket (`RUN/bridge.sock`),
//! made again whenever it breaks: the bridge outlives a broker restart, and
//! every bridge command is safe to send twice (an event settled twice, a batch
//! delivered twice, is deduplicated by the broker). Each of the bridge's
//! threads owns one.

use crate::proto::{Client, ClientError, Command};
use std::path::PathBuf;
use std::time::Duration;

/// How long an answer may take: a parked `bridge_next` answers within its
/// wait (30 s), anything else at once.
const READ_TIMEOUT: Duration = Duration::from_secs(90);

/// The pause before connecting again, doubled up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

pub struct Broker {
    path: PathBuf,
    client: Option<Client>,
}

impl Broker {
    pub fn new(path: PathBuf) -> Broker {
        Broker { path, client: None }
    }

    /// One try: connects when needed and sends; a connection that failed is
    /// dropped, so the next call makes a new one.
    pub fn call_once<C: Command>(&mut self, cmd: &C) -> Result<C::Reply, ClientError> {
        let client = match &mut self.client {
            Some(c) => c,
            None => {
                let c = Client::connect(&self.path)?;
                c.set_read_timeout(Some(READ_TIMEOUT))
                    .map_err(|e| ClientError::Io(e.to_string()))?;
                self.client.insert(c)
            }
        };
        let r = client.call(cmd);
        if matches!(r, Err(ClientError::Io(_) | ClientError::NoBroker { .. })) {
            self.client = None;
        }
        r
    }

    /// Sends `cmd` until the broker answers it, connecting again after a
    /// pause while it cannot be reached; its refusal is returned.
    pub fn call<C: Command>(&mut self, cmd: &C) -> Result<C::Reply, String> {
        let mut pause = RETRY_FIRST;
        let mut told = false;
        loop {
            match self.call_once(cmd) {
                Ok(r) => {
                    if told {
                        log::info!("the broker answers again on {}", self.path.display());
                    }
                    return Ok(r);
                }
                Err(ClientError::Refused(e)) => return Err(e),
                Err(e) => {
                    if !told {
                        log::warn!("{e}; trying again");
                        told = true;
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(RETRY_MAX);
                }
            }
        }
    }
}
