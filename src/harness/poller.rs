//! The poller thread: the harness's one connection to its agent socket. It
//! long-polls `recv_next` when the turn loop asks for the next message and carries
//! the loop's other broker requests (status, ack, requeue, counts, kick, notices to
//! the parent). When the broker is gone it reconnects with capped backoff, says so
//! in the log and flips `online` on the bus. An answer it cannot use (too long,
//! not UTF-8, malformed) or a connection that breaks is treated the same way:
//! the next connection waits out a backoff that doubles up to the cap and is
//! reset only by a good answer, and the first failure of a burst is logged, so
//! whatever the broker sends, the poller never spins. Shutting it down closes the
//! socket, so a parked long-poll returns at once.

use super::bus::Bus;
use crate::proto::client::decode;
use crate::proto::cmd::{RecvNext, RecvNextReply};
use crate::proto::{Client, ClientError, Command, Message, Request};
use crossbeam_channel::{select, unbounded, Receiver, Sender};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The first pause before reconnecting; it doubles per failure up to the cap.
const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// What the turn loop asks of the poller.
pub enum ToPoller {
    /// Long-poll until the next message arrives.
    Next,
    /// One request; its answer line (or the refusal) goes back on `reply`.
    Call {
        req: Request,
        reply: Sender<Result<String, String>>,
    },
    /// One request nobody waits for (its failure is logged), kept in order with
    /// the calls around it.
    Tell { req: Request },
}

/// What the poller hands the turn loop.
#[derive(Debug)]
pub enum FromPoller {
    /// `unread` is the queue depth after the pop, when the broker said.
    Message {
        message: Message,
        redelivered: bool,
        unread: Option<u64>,
    },
}

/// The turn loop's handle.
pub struct Poller {
    tx: Sender<ToPoller>,
    pub events: Receiver<FromPoller>,
    stop: Option<Sender<()>>,
    stream: Arc<Mutex<Option<UnixStream>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct State {
    socket: PathBuf,
    wait_secs: u64,
    reconnect_max: Duration,
    bus: Bus,
    client: Option<Client>,
    stream: Arc<Mutex<Option<UnixStream>>>,
    stop: Receiver<()>,
    events: Sender<FromPoller>,
    /// The next pause before reconnecting; reset by a good answer.
    backoff: Duration,
    /// The last connection attempt failed (the broker is unreachable).
    unreachable: bool,
    /// Unusable answers and broken connections since the last good answer.
    failures: u32,
    /// No new connection before this, after an unusable answer.
    retry_at: Option<Instant>,
}

impl Poller {
    pub fn start(socket: PathBuf, wait_secs: u64, reconnect_max: Duration, bus: Bus) -> Poller {
        let (tx, rx) = unbounded::<ToPoller>();
        let (ev_tx, ev_rx) = unbounded::<FromPoller>();
        let (stop_tx, stop_rx) = unbounded::<()>();
        let stream = Arc::new(Mutex::new(None));
        let mut st = State {
            socket,
            wait_secs,
            reconnect_max,
            bus,
            client: None,
            stream: stream.clone(),
            stop: stop_rx,
            events: ev_tx,
            backoff: MIN_BACKOFF,
            unreachable: false,
            failures: 0,
            retry_at: None,
        };
        let thread = std::thread::Builder::new()
            .name("poller".into())
            .spawn(move || st.run(rx))
            .ok();
        Poller {
            tx,
            events: ev_rx,
            stop: Some(stop_tx),
            stream,
            thread,
        }
    }

    /// Asks for the next message; it arrives on `events`.
    pub fn request_next(&self) {
        let _ = self.tx.send(ToPoller::Next);
    }

    /// One broker command, retried across reconnects until answered; gives up
    /// when `stop` closes (the harness is shutting down).
    pub fn call<C: Command>(&self, cmd: C, stop: &Receiver<()>) -> Result<C::Reply, String> {
        let (reply, rx) = crossbeam_channel::bounded(1);
        self.tx
            .send(ToPoller::Call {
                req: cmd.into(),
                reply,
            })
            .map_err(|_| "the poller has stopped".to_string())?;
        let line = select! {
            recv(rx) -> r => r.unwrap_or_else(|_| Err("the poller has stopped".into())),
            recv(stop) -> _ => Err("the harness is stopping".into()),
        }?;
        decode::<C>(&line).map_err(|e| match e {
            ClientError::Refused(e) => e,
            e => e.to_string(),
        })
    }

    /// A command whose answer the caller does not wait for.
    pub fn tell(&self, cmd: impl Into<Request>) {
        let _ = self.tx.send(ToPoller::Tell { req: cmd.into() });
    }

    /// Stops the thread, ending a parked long-poll at once.
    pub fn shutdown(&mut self) {
        self.stop.take();
        if let Some(s) = self
            .stream
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl State {
    fn stopped(&self) -> bool {
        matches!(
            self.stop.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        )
    }

    fn run(&mut self, rx: Receiver<ToPoller>) {
        loop {
            let cmd = select! {
                recv(rx) -> c => match c { Ok(c) => c, Err(_) => return },
                recv(self.stop) -> _ => return,
            };
            match cmd {
                ToPoller::Next => {
                    if let Some(ev) = self.next() {
                        if self.events.send(ev).is_err() {
                            return;
                        }
                    } else {
                        return;
                    }
                }
                ToPoller::Call { req, reply } => {
                    let _ = reply.send(self.call(&req));
                }
                ToPoller::Tell { req } => {
                    if let Err(e) = self.call(&req) {
                        log::warn!("{} refused: {e}", req.cmd());
                    }
                }
            }
        }
    }

    /// A connected client, reconnecting with capped backoff; None once stopped.
    fn client(&mut self) -> Option<&mut Client> {
        while self.client.is_none() {
            if self.stopped() {
                return None;
            }
            if let Some(at) = self.retry_at.take() {
                let wait = crossbeam_channel::at(at);
                select! {
                    recv(wait) -> _ => {},
                    recv(self.stop) -> _ => return None,
                }
            }
            match Client::connect(&self.socket) {
                Ok(c) => {
                    if let Ok(s) = c.shutdown_handle() {
                        *self.stream.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
                    }
                    if self.unreachable {
                        log::info!("reconnected to the broker at {}", self.socket.display());
                        self.bus.note("broker reachable again");
                        self.unreachable = false;
                    }
                    self.bus.update(|s| s.online = true);
                    self.client = Some(c);
                }
                Err(e) => {
                    log::warn!("{e}; retrying in {:?}", self.backoff);
                    if self.bus.snapshot().online {
                        self.bus.note(format!("broker unreachable: {e}"));
                    }
                    self.bus.update(|s| s.online = false);
                    self.unreachable = true;
                    let wait = crossbeam_channel::after(self.backoff);
                    select! {
                        recv(wait) -> _ => {},
                        recv(self.stop) -> _ => return None,
                    }
                    self.backoff = (self.backoff * 2).min(self.reconnect_max);
                }
            }
        }
        self.client.as_mut()
    }

    /// The connection broke or gave an answer that cannot be used: drop it and
    /// wait out the backoff before the next one.
    fn lost(&mut self, e: &ClientError) {
        self.client = None;
        self.bus.update(|s| s.online = false);
        self.failures += 1;
        if self.failures == 1 {
            log::warn!(
                "lost the broker connection: {e}; reconnecting in {:?}, backing off up to {:?} while it lasts",
                self.backoff,
                self.reconnect_max
            );
            self.bus.note(format!("lost the broker connection: {e}"));
        } else {
            log::debug!(
                "lost the broker connection ({} in a row): {e}; reconnecting in {:?}",
                self.failures,
                self.backoff
            );
        }
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(self.reconnect_max.max(MIN_BACKOFF));
    }

    /// The broker gave a well-formed answer: the backoff starts over.
    fn answered(&mut self) {
        if self.failures > 0 {
            log::info!(
                "the broker answers again after {} unusable answers or broken connections",
                self.failures
            );
            self.failures = 0;
        }
        self.backoff = MIN_BACKOFF;
    }

    fn next(&mut self) -> Option<FromPoller> {
        let wait = self.wait_secs;
        loop {
            let c = self.client()?;
            let _ = c.set_read_timeout(Some(Duration::from_secs(wait + 30)));
            let r: Result<RecvNextReply, ClientError> = c.call(&RecvNext {
                wait_seconds: Some(wait),
                seen: None,
            });
            if matches!(r, Ok(_) | Err(ClientError::Refused(_))) {
                self.answered();
            }
            match r {
                Ok(RecvNextReply {
                    message: Some(message),
                    redelivered,
                    unread,
                    ..
                }) => {
                    return Some(FromPoller::Message {
                        message,
                        redelivered,
                        unread,
                    })
                }
                Ok(_) => continue,
                Err(ClientError::Refused(e)) => {
                    log::error!("broker refused recv_next: {e}");
                    self.bus.note(format!("broker refused recv_next: {e}"));
                    let wait = crossbeam_channel::after(self.reconnect_max);
                    select! {
                        recv(wait) -> _ => {},
                        recv(self.stop) -> _ => return None,
                    }
                }
                Err(e) => {
                    if self.stopped() {
                        return None;
                    }
                    self.lost(&e);
                }
            }
        }
    }

    /// The answer line of `req` (its caller decodes it), or the refusal.
    fn call(&mut self, req: &Request) -> Result<String, String> {
        loop {
            let Some(c) = self.client() else {
                return Err("the harness is stopping".into());
            };
            let _ = c.set_read_timeout(Some(Duration::from_secs(60)));
            let answer = c.request(req).and_then(|line| {
                // Only the refusal is read here; the caller decodes the rest.
                match crate::proto::lines::decode::<serde::de::IgnoredAny>(
                    &line,
                    "the broker",
                    req.cmd(),
                ) {
                    Err(crate::proto::lines::CallError::Refused(e)) => Err(ClientError::Refused(e)),
                    _ => Ok(line),
                }
            });
            match answer {
                Ok(m) => {
                    self.answered();
                    return Ok(m);
                }
                Err(ClientError::Refused(e)) => {
                    self.answered();
                    return Err(e);
                }
                Err(e) => {
                    if self.stopped() {
                        return Err("the harness is stopping".into());
                    }
                    self.lost(&e);
                }
            }
        }
    }
}
