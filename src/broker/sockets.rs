//! The broker's sockets, served on the hub's own thread: one `epoll(7)` loop
//! over the listening sockets (the host socket, one per agent, the bridge's),
//! every client connection and the wake-up of the hub's channel ([`HubRx`]).
//! Each descriptor's interest is registered once and changed only when the
//! connection's state changes it, and the connections' deadlines (a request's
//! idle limit, a long-poll's end) wait in a heap: a turn of the loop costs
//! what is ready, due or touched, not what is open (a thousand agents'
//! sockets and two or three connections each, every long-poll renewed
//! every 30 s).
//! A request is read, handed to [`Hub::handle`] and answered on this thread,
//! so it costs two wake-ups (the hub's, then the client's), not a hop to a
//! connection thread and back. Nothing here blocks: sockets are non-blocking,
//! an answer the client does not read yet waits in its connection's buffer,
//! and work the hub offloads runs on a thread of its own (`conn-job`) whose
//! one report comes back as [`HubMsg::Finished`].
//!
//! This file owns the connections and their rules: one request at a time per
//! connection, answered in order, the answers to the requests that arrived
//! together written together; request lines bounded by [`MAX_LINE`] (a
//! longer line is consumed up to its newline and refused); no answer longer
//! than that ever leaves (it becomes an error line); a connection that sends
//! no whole request for the idle timeout, or does not read its answer for as
//! long, is closed, while a parked long-poll is not idle; a long-poll ends at
//! its deadline, when the hub wakes it, or when its client hangs up. The
//! accept side keeps the caps of `accept.rs` (a client over one gets one
//! `ok:false` line), and a failed accept (out of descriptors) pauses that
//! socket with a doubling backoff, logging the first failure of a burst and
//! the recovery; the listener is never dropped.
//!
//! A credential (issue 40) is one more kind of source: the broker's end of a
//! socket pair whose other end `hive up` handed a harness or a bash-task
//! daemon. Each descriptor that process sends over it (`SCM_RIGHTS`: one end
//! of a socket pair it made) becomes a connection of the agent, adopted as
//! that process's (`Hub::adopted`) and counted against the credential's own
//! cap, not the agent socket's. Its other end closing (the process ended)
//! ends the credential; the connections it made live on until they close.

use super::accept::{Caps, ConnLimits, Slot, CREDENTIAL_CONNS};
use super::hub::{
    self, ConnId, Hub, HubMsg, HubRx, HubTx, Identity, NewCredential, NewSocket, Outcome,
};
use crate::proto::access::Via;
use crate::proto::limits::{MAX_LINE, MAX_WAIT_SECS};
use crate::proto::lines::{err_line, refuse};
use crate::proto::Request;
use crate::sys::fd::{self, Epoll, PollFd, Ready};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first pause after a failed accept; it doubles per failure in a row.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The cap on that pause.
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Clients accepted from one socket per turn of the loop, so a flood on one
/// socket cannot starve the others.
const ACCEPTS_PER_TURN: usize = 64;
/// Bytes read from one client per turn of the loop.
const READ_CHUNK: usize = 64 * 1024;
/// An output buffer larger than this is given back once it is written; a
/// connection's answers are written once they reach this much, before more
/// of its requests are answered.
const KEEP_OUTPUT: usize = 64 * 1024;
/// Requests answered for one client in a row before the others get a turn
/// (a client that sends many at once waits for the rest in the next turn).
const REQUESTS_PER_TURN: usize = 32;

/// A listening socket as the broker starts with it.
pub struct Listening {
    pub listener: UnixListener,
    pub who: Identity,
    pub path: PathBuf,
}

/// One listening socket and its accept state.
struct Socket {
    listener: UnixListener,
    who: Identity,
    /// The socket in log lines: "the socket of ana".
    what: String,
    path: PathBuf,
    caps: Caps,
    /// Failed accepts in a row, and clients refused in a row (one log line
    /// per burst of each).
    failures: u64,
    refused: u64,
    backoff: Duration,
    /// Not polled until then, after a failed accept.
    paused_until: Option<Instant>,
    /// Registered with the loop's epoll.
    watched: bool,
}

/// A credential's control socket: what comes over it are connections of
/// `agent`'s process `via` names.
struct Credential {
    control: UnixStream,
    agent: String,
    via: Via,
    caps: Caps,
    /// Its other end closed: dropped at the start of the next turn.
    ended: bool,
    /// Registered with the loop's epoll.
    watched: bool,
}

/// Where one connection is.
enum State {
    /// Reading its next request (or writing the answer to the last one).
    Reading,
    /// A long-poll waiting for the hub's wake-up or its deadline.
    Parked { req: Request, until: Instant },
    /// An offloaded job is computing the answer to `cmd`.
    Busy { cmd: &'static str },
}

/// One client connection.
struct Client {
    stream: UnixStream,
    who: Identity,
    _slot: Slot,
    /// Bytes read and not yet a whole line; how far they were searched for
    /// a newline.
    input: Vec<u8>,
    scanned: usize,
    /// A line over [`MAX_LINE`] is being skipped up to its newline.
    too_long: bool,
    /// The client closed its side: what it sent is answered, then it is closed.
    eof: bool,
    /// The answers being written, and how much of them is.
    output: Vec<u8>,
    written: usize,
    /// A write of `output` found the socket full: the client is not reading.
    /// Nothing more of its input is answered until there is room again.
    stalled: bool,
    state: State,
    /// Reading: the idle deadline; writing: when an answer not read is given
    /// up; parked: unused (the wait's own deadline is in the state).
    deadline: Instant,
    /// The process that connected it, once a request needed it
    /// (`hub::wants_peer`).
    peer: Option<u32>,
    /// It came through a credential: the connection itself says whose it
    /// is, and no peer process is looked up.
    adopted: bool,
    /// What the loop's epoll watches it for ([`Interest`]); `None` before
    /// it is registered.
    watched: Option<Interest>,
    /// The earliest time it has in the loop's deadline heap (an entry may be
    /// older than its deadline: a deadline that moved later is found when
    /// that entry comes up, and queued again).
    queued: Option<Instant>,
}

/// What a client's descriptor is watched for besides a hang-up.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Interest {
    read: bool,
    write: bool,
}

/// What the next line of input was: its end in `input` (a whole line, its
/// newline excluded), or a line that was refused.
enum Line {
    /// `input[..end]`, to be consumed up to `next` once handled.
    Text {
        end: usize,
        next: usize,
    },
    TooLong,
}

impl Client {
    /// An answer is waiting for room in the socket.
    fn writing(&self) -> bool {
        self.stalled
    }

    /// When it is due: a request's idle limit while it reads, a long-poll's
    /// end while parked; nothing while a job computes its answer.
    fn due(&self) -> Option<Instant> {
        match &self.state {
            State::Reading => Some(self.deadline),
            State::Parked { until, .. } => Some(*until),
            State::Busy { .. } => None,
        }
    }

    /// What it should be watched for now: input while it reads a request
    /// and is not stalled, room while an answer is pending (in every state:
    /// answers queued before a long-poll parked may be waiting for it), a
    /// hang-up always.
    fn interest(&self) -> Interest {
        let reading = matches!(self.state, State::Reading);
        Interest {
            read: reading && !self.writing(),
            write: self.writing(),
        }
    }

    /// The next whole line of input, if there is one; at the end of input a
    /// last line without a newline counts. A line over [`MAX_LINE`] is
    /// skipped up to its newline and reported as too long.
    fn next_line(&mut self) -> Option<Line> {
        let found = self.input[self.scanned..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|i| self.scanned + i);
        let (end, next) = match found {
            Some(end) => (end, end + 1),
            None => {
                if self.input.len() > MAX_LINE {
                    self.too_long = true;
                    self.input.clear();
                }
                self.scanned = self.input.len();
                if !self.eof || (!self.too_long && self.input.is_empty()) {
                    return None;
                }
                (self.input.len(), self.input.len())
            }
        };
        self.scanned = 0;
        if std::mem::take(&mut self.too_long) || end > MAX_LINE {
            self.input.drain(..next);
            return Some(Line::TooLong);
        }
        let end = if end > 0 && self.input[end - 1] == b'\r' {
            end - 1
        } else {
            end
        };
        Some(Line::Text { end, next })
    }

    /// Writes what it can of the pending answers: true once all of them
    /// are out.
    fn flush(&mut self) -> io::Result<bool> {
        while self.written < self.output.len() {
            match (&self.stream).write(&self.output[self.written..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.stalled = true;
                    return Ok(false);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.stalled = false;
        self.output.clear();
        self.written = 0;
        if self.output.capacity() > KEEP_OUTPUT {
            self.output = Vec::new();
        }
        Ok(true)
    }
}

/// Why [`Loop::answer_requests`] stopped.
enum Stop {
    /// No whole request is left.
    Drained,
    /// The client waits (parked, busy, stalled) or is gone.
    Held,
    /// Its share of this turn is used: the rest in the next.
    Capped,
}

/// What [`Loop::accept_one`] found.
enum Accepted {
    /// Nothing is waiting (or accepting failed and backs off).
    None,
    /// A connection came and went: refused, or aborted before its accept.
    Skipped,
    Client(ConnId),
}

/// What an epoll registration stands for, encoded in its token: the kind in
/// the top byte, the index or id below.
#[derive(Clone, Copy)]
enum Target {
    Wake,
    Socket(usize),
    Credential(u64),
    Client(ConnId),
}

const KIND_SHIFT: u32 = 56;
const ID_MASK: u64 = (1 << KIND_SHIFT) - 1;

impl Target {
    fn token(self) -> u64 {
        match self {
            Target::Wake => 0,
            Target::Socket(k) => (1 << KIND_SHIFT) | k as u64,
            Target::Credential(id) => (2 << KIND_SHIFT) | (id & ID_MASK),
            Target::Client(id) => (3 << KIND_SHIFT) | (id & ID_MASK),
        }
    }

    fn of(token: u64) -> Option<Target> {
        let id = token & ID_MASK;
        match token >> KIND_SHIFT {
            0 => Some(Target::Wake),
            1 => Some(Target::Socket(id as usize)),
            2 => Some(Target::Credential(id)),
            3 => Some(Target::Client(id)),
            _ => None,
        }
    }
}

/// The hub and its sockets, run by [`Loop::run`] on the hub's thread.
pub struct Loop<'c> {
    hub: Hub<'c>,
    rx: HubRx,
    /// For offloaded jobs: their follow-ups and answers.
    tx: HubTx,
    sockets: Vec<Socket>,
    credentials: BTreeMap<u64, Credential>,
    next_credential: u64,
    clients: BTreeMap<ConnId, Client>,
    next_id: ConnId,
    limits: ConnLimits,
    /// Open connections on every agent socket together.
    agents_open: Arc<AtomicUsize>,
    /// Every descriptor above and the hub's wake-up; what a wait found
    /// ready (reused); a read buffer.
    epoll: Epoll,
    ready: Vec<Ready>,
    scratch: Vec<u8>,
    /// Clients with whole requests read and not yet answered because they
    /// had their share of a turn: the next poll does not sleep.
    backlog: Vec<ConnId>,
    /// Clients whose state, deadline or output this turn may have changed:
    /// their interest and deadline are brought up to date before the wait.
    touched: Vec<ConnId>,
    /// Every client's next deadline (some entries stale, dropped when they
    /// come up).
    deadlines: BinaryHeap<Reverse<(Instant, ConnId)>>,
    /// A socket was added or paused: the sockets' registrations are looked
    /// at before the next wait (and while any stays paused).
    sockets_dirty: bool,
    /// Credentials whose other end closed, dropped at the next turn.
    ended: Vec<u64>,
    /// Where the whole seconds of [`Loop::wait_end`] count from.
    epoch: Instant,
}

impl<'c> Loop<'c> {
    pub fn new(hub: Hub<'c>, rx: HubRx, tx: HubTx, limits: ConnLimits) -> io::Result<Loop<'c>> {
        let epoll = Epoll::new()?;
        epoll.add(rx.readable.as_raw_fd(), Target::Wake.token(), true, false)?;
        Ok(Loop {
            hub,
            rx,
            tx,
            sockets: Vec::new(),
            credentials: BTreeMap::new(),
            next_credential: 1,
            clients: BTreeMap::new(),
            next_id: 1,
            limits,
            agents_open: Arc::new(AtomicUsize::new(0)),
            epoll,
            ready: Vec::new(),
            scratch: vec![0; READ_CHUNK],
            backlog: Vec::new(),
            touched: Vec::new(),
            deadlines: BinaryHeap::new(),
            sockets_dirty: false,
            ended: Vec::new(),
            epoch: Instant::now(),
        })
    }

    /// When a request that may wait `wait` seconds is answered at the
    /// latest: `wait` from now, brought back to the whole second of the
    /// loop's clock before it (issue 42). The waits that end within one
    /// second end together, so a thousand idle agents' renewals wake the
    /// loop once a second at most, not once each; a wait ends less than a
    /// second early, which only renews it a little sooner.
    fn wait_end(&self, wait: u64) -> Instant {
        let end = Instant::now() + Duration::from_secs(wait);
        let whole = end.saturating_duration_since(self.epoch).as_secs();
        (self.epoch + Duration::from_secs(whole)).max(Instant::now())
    }

    /// Serves `l` from now on, under the caps of its kind of socket.
    pub fn listen(&mut self, l: Listening) -> Result<(), String> {
        l.listener.set_nonblocking(true).map_err(|e| {
            format!(
                "cannot make the socket {} non-blocking: {e}",
                l.path.display()
            )
        })?;
        let caps = match &l.who {
            Identity::Operator => Caps::host(&self.limits),
            Identity::Agent(_) => Caps::agent(&self.limits, &self.agents_open),
            Identity::Bridge => Caps::bridge(),
        };
        self.sockets.push(Socket {
            what: format!("the socket of {}", l.who.name()),
            listener: l.listener,
            who: l.who,
            path: l.path,
            caps,
            failures: 0,
            refused: 0,
            backoff: BACKOFF_MIN,
            paused_until: None,
            watched: false,
        });
        self.sockets_dirty = true;
        Ok(())
    }

    /// Serves until [`HubMsg::Shutdown`]; then removes the socket files,
    /// tells every parked client the broker is stopping, and returns (the
    /// hub, dropped with the loop, closes the store).
    pub fn run(mut self) {
        self.hub.begin();
        loop {
            for s in self.hub.take_sockets() {
                let NewSocket {
                    listener,
                    who,
                    path,
                } = s;
                if let Err(e) = self.listen(Listening {
                    listener,
                    who,
                    path,
                }) {
                    log::error!("{e}");
                }
            }
            for c in self.hub.take_credentials() {
                self.take_credential(c);
            }
            for id in std::mem::take(&mut self.ended) {
                if let Some(c) = self.credentials.remove(&id) {
                    if c.watched {
                        let _ = self.epoll.delete(c.control.as_raw_fd());
                    }
                }
            }
            self.watch(Instant::now());
            let timeout = if self.backlog.is_empty() {
                self.timeout(Instant::now())
            } else {
                Some(Duration::ZERO)
            };
            let mut ready = std::mem::take(&mut self.ready);
            if let Err(e) = self.epoll.wait(&mut ready, timeout) {
                log::error!("the broker cannot wait for its sockets: {e}");
                std::thread::sleep(BACKOFF_MIN);
            }
            let mut woken = false;
            for r in &ready {
                match Target::of(r.token) {
                    Some(Target::Wake) => woken = true,
                    Some(Target::Socket(k)) => self.accept(k),
                    Some(Target::Credential(id)) => self.adopt(id),
                    Some(Target::Client(id)) => self.client_event(id, &r.events),
                    None => {}
                }
            }
            self.ready = ready;
            for id in std::mem::take(&mut self.backlog) {
                self.pump(id);
            }
            if woken {
                self.rx.clear();
                while let Ok(msg) = self.rx.rx.try_recv() {
                    if !self.message(msg) {
                        self.shutdown();
                        return;
                    }
                }
            }
            self.expire(Instant::now());
            self.hub.tick();
            self.wake_parked();
        }
    }

    /// How long the loop may sleep: until the nearest deadline of the hub,
    /// a client or a paused socket.
    fn timeout(&mut self, now: Instant) -> Option<Duration> {
        let mut next = self.hub.next_deadline().map(|d| now + d);
        let mut nearer = |t: Instant| {
            if next.is_none_or(|n| t < n) {
                next = Some(t);
            }
        };
        if let Some(t) = self.next_due() {
            nearer(t);
        }
        if self.sockets_dirty {
            for s in &self.sockets {
                if let Some(t) = s.paused_until {
                    nearer(t);
                }
            }
        }
        next.map(|t| t.saturating_duration_since(now))
    }

    /// The earliest deadline of a client, the heap's stale entries dropped
    /// and its moved ones queued again on the way.
    fn next_due(&mut self) -> Option<Instant> {
        while let Some(&Reverse((t, id))) = self.deadlines.peek() {
            let Some(c) = self.clients.get_mut(&id) else {
                self.deadlines.pop();
                continue;
            };
            if c.queued != Some(t) {
                // Superseded by an earlier entry of the same client.
                self.deadlines.pop();
                continue;
            }
            match c.due() {
                Some(d) if d <= t => return Some(t),
                Some(d) => {
                    self.deadlines.pop();
                    self.deadlines.push(Reverse((d, id)));
                    c.queued = Some(d);
                }
                None => {
                    self.deadlines.pop();
                    c.queued = None;
                }
            }
        }
        None
    }

    /// Queues client `id`'s deadline unless an entry at or before it is
    /// queued already.
    fn schedule(&mut self, id: ConnId) {
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        if let Some(d) = c.due() {
            if c.queued.is_none_or(|q| d < q) {
                self.deadlines.push(Reverse((d, id)));
                c.queued = Some(d);
            }
        }
    }

    /// Brings the epoll's interest up to date: the sockets not paused, every
    /// credential, every client (for input while it reads a request, for room
    /// while an answer is pending, for a hang-up always). Only a change is a
    /// system call.
    fn watch(&mut self, now: Instant) {
        if self.sockets_dirty {
            self.watch_sockets(now);
        }
        let mut touched = std::mem::take(&mut self.touched);
        touched.sort_unstable();
        touched.dedup();
        let mut failed = Vec::new();
        for id in touched.drain(..) {
            self.schedule(id);
            let Some(c) = self.clients.get_mut(&id) else {
                continue;
            };
            let want = c.interest();
            if c.watched == Some(want) {
                continue;
            }
            let (fd, token) = (c.stream.as_raw_fd(), Target::Client(id).token());
            let r = match c.watched {
                None => self.epoll.add(fd, token, want.read, want.write),
                Some(_) => self.epoll.modify(fd, token, want.read, want.write),
            };
            match r {
                Ok(()) => c.watched = Some(want),
                Err(e) => {
                    log::error!("cannot watch connection {id} of {}: {e}", c.who.name());
                    failed.push(id);
                }
            }
        }
        self.touched = touched;
        for id in failed {
            self.close(id);
        }
    }

    /// The listening sockets' registrations, after one was added or paused:
    /// a paused socket is not watched until its pause ends.
    fn watch_sockets(&mut self, now: Instant) {
        let mut paused_any = false;
        for (k, s) in self.sockets.iter_mut().enumerate() {
            let paused = s.paused_until.is_some_and(|t| t > now);
            if !paused {
                s.paused_until = None;
            }
            paused_any |= paused;
            if s.watched != paused {
                continue;
            }
            let fd = s.listener.as_raw_fd();
            let r = if paused {
                self.epoll.delete(fd)
            } else {
                self.epoll.add(fd, Target::Socket(k).token(), true, false)
            };
            match r {
                Ok(()) => s.watched = !paused,
                Err(e) => log::error!("cannot watch {}: {e}", s.what),
            }
        }
        self.sockets_dirty = paused_any;
    }

    /// Accepts what socket `k` has waiting, up to [`ACCEPTS_PER_TURN`], and
    /// answers what each new client has sent already (a client like `hive
    /// wake` writes its request as soon as it is connected) before the next
    /// accept: the `accept` that finds the queue empty comes after the
    /// answer, not on the client's path.
    /// Serves credential `c` from now on.
    fn take_credential(&mut self, c: NewCredential) {
        if let Err(e) = c.control.set_nonblocking(true) {
            log::error!(
                "cannot serve the credential of {}: {e}; its reports are refused until it \
                 restarts",
                c.agent
            );
            return;
        }
        let id = self.next_credential;
        self.next_credential += 1;
        let token = Target::Credential(id).token();
        if let Err(e) = self.epoll.add(c.control.as_raw_fd(), token, true, false) {
            log::error!(
                "cannot watch the credential of {}: {e}; its reports are refused until it \
                 restarts",
                c.agent
            );
            return;
        }
        self.credentials.insert(
            id,
            Credential {
                control: c.control,
                agent: c.agent,
                via: c.via,
                caps: Caps::credential(),
                ended: false,
                watched: true,
            },
        );
    }

    /// Takes the connections waiting on credential `k`, serving each as a
    /// connection of the credential's agent and process.
    fn adopt(&mut self, k: u64) {
        for _ in 0..ACCEPTS_PER_TURN {
            let Some(c) = self.credentials.get_mut(&k) else {
                return;
            };
            let whose = match c.via {
                Via::BashDaemon => "bash-task daemon",
                _ => "harness",
            };
            let fd = match fd::recv_fd(&c.control) {
                Ok(Some(fd)) => fd,
                Ok(None) => {
                    log::debug!("{}'s {whose} closed its credential", c.agent);
                    c.ended = true;
                    self.ended.push(k);
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => continue,
                Err(e) => {
                    log::warn!(
                        "the credential of {}'s {whose} failed: {e}; it is dropped",
                        c.agent
                    );
                    c.ended = true;
                    self.ended.push(k);
                    return;
                }
            };
            let stream = match fd::unix_stream(fd) {
                Ok(stream) => stream,
                Err(e) => {
                    log::warn!(
                        "{}'s {whose} sent a descriptor that is no connection: {e}",
                        c.agent
                    );
                    continue;
                }
            };
            let who = Identity::Agent(c.agent.clone());
            let slot = match c.caps.take(&who) {
                Ok(slot) => slot,
                Err(_) => {
                    let why = format!(
                        "too many connections through the credential of {}'s {whose} \
                         ({CREDENTIAL_CONNS}, its limit); close some and try again",
                        c.agent
                    );
                    log::warn!("{why}");
                    refuse(stream, &why);
                    continue;
                }
            };
            let via = c.via;
            if let Err(e) = stream.set_nonblocking(true) {
                log::warn!("a connection of {}'s {whose} is dropped: {e}", c.agent);
                continue;
            }
            let id = self.client(stream, who, slot);
            if let Some(c) = self.clients.get_mut(&id) {
                c.adopted = true;
            }
            self.hub.adopted(id, via);
            if self.read(id) {
                self.pump(id);
            }
        }
    }

    /// A new client: the next id, reading its first request.
    fn client(&mut self, stream: UnixStream, who: Identity, slot: Slot) -> ConnId {
        let id = self.next_id;
        self.next_id += 1;
        self.clients.insert(
            id,
            Client {
                stream,
                who,
                _slot: slot,
                input: Vec::new(),
                scanned: 0,
                too_long: false,
                eof: false,
                output: Vec::new(),
                written: 0,
                stalled: false,
                state: State::Reading,
                deadline: Instant::now() + self.limits.idle,
                peer: None,
                adopted: false,
                watched: None,
                queued: None,
            },
        );
        self.touched.push(id);
        id
    }

    fn accept(&mut self, k: usize) {
        for _ in 0..ACCEPTS_PER_TURN {
            match self.accept_one(k) {
                Accepted::None => return,
                Accepted::Skipped => {}
                Accepted::Client(id) => {
                    if self.read(id) {
                        self.pump(id);
                    }
                }
            }
        }
    }

    /// Accepts the next client of socket `k`, if one is waiting.
    fn accept_one(&mut self, k: usize) -> Accepted {
        let s = &mut self.sockets[k];
        let stream = match fd::accept_nonblocking(&s.listener) {
            Ok(stream) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Accepted::None,
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => return Accepted::Skipped,
            Err(e) => {
                s.failures += 1;
                if s.failures == 1 {
                    log::warn!(
                        "accept on {} failed: {e}; the socket stays open, retrying with a backoff up to {BACKOFF_MAX:?}",
                        s.what
                    );
                } else {
                    log::debug!("{}: {} failures in a row", s.what, s.failures);
                }
                s.paused_until = Some(Instant::now() + s.backoff);
                self.sockets_dirty = true;
                s.backoff = (s.backoff * 2).min(BACKOFF_MAX);
                return Accepted::None;
            }
        };
        if s.failures > 0 {
            log::info!(
                "accepting on {} again after {} failures: it accepts again",
                s.what,
                s.failures
            );
            s.failures = 0;
            s.backoff = BACKOFF_MIN;
        }
        let slot = match s.caps.take(&s.who) {
            Ok(slot) => slot,
            Err(why) => {
                if s.refused == 0 {
                    log::warn!("refusing connections: {why}");
                }
                s.refused += 1;
                refuse(stream, &why);
                return Accepted::Skipped;
            }
        };
        if s.refused > 0 {
            log::info!(
                "accepting on {} again after refusing {} connections",
                s.what,
                s.refused
            );
            s.refused = 0;
        }
        let who = s.who.clone();
        Accepted::Client(self.client(stream, who, slot))
    }

    /// Something happened on client `id`'s connection.
    fn client_event(&mut self, id: ConnId, fd: &PollFd) {
        self.touched.push(id);
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        if fd.failed() {
            self.close(id);
            return;
        }
        if c.writing() {
            if self.write_out(id) != Some(true) {
                return;
            }
            let Some(c) = self.clients.get_mut(&id) else {
                return;
            };
            if matches!(c.state, State::Reading) {
                c.deadline = Instant::now() + self.limits.idle;
                self.pump(id);
                return;
            }
        }
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        match c.state {
            State::Parked { .. } | State::Busy { .. } => {
                // Only a hang-up is watched for here.
                if fd.hung_up() {
                    log::debug!("connection {id} of {}: the client hung up", c.who.name());
                    self.close(id);
                }
            }
            State::Reading => {
                if self.read(id) {
                    self.pump(id);
                }
            }
        }
    }

    /// Reads what client `id` sent (one chunk); false when the connection
    /// broke and was closed.
    fn read(&mut self, id: ConnId) -> bool {
        let Some(c) = self.clients.get_mut(&id) else {
            return false;
        };
        loop {
            match (&c.stream).read(&mut self.scratch) {
                Ok(0) => {
                    c.eof = true;
                    return true;
                }
                Ok(n) => {
                    c.input.extend_from_slice(&self.scratch[..n]);
                    return true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    log::debug!("connection {id}: read error: {e}");
                    self.close(id);
                    return false;
                }
            }
        }
    }

    /// Answers the requests client `id` has sent, one at a time, while it is
    /// free (not parked, busy or stalled), then writes the answers in one go
    /// (a harness sends the end of a turn as four requests at once: it is
    /// woken once, not four times); closes it at the end of its input once
    /// they are out. After [`REQUESTS_PER_TURN`] requests, or
    /// [`KEEP_OUTPUT`] bytes of answers, the rest wait for the next turn.
    fn pump(&mut self, id: ConnId) {
        self.touched.push(id);
        let stop = self.answer_requests(id);
        // Not all out: resumed when there is room (`client_event`).
        if self.write_out(id) != Some(true) {
            return;
        }
        let eof = self.clients.get(&id).is_some_and(|c| c.eof);
        match stop {
            Stop::Capped => self.backlog.push(id),
            Stop::Drained if eof => self.close(id),
            Stop::Drained | Stop::Held => {}
        }
    }

    /// Writes what the socket takes of client `id`'s answers: whether all of
    /// them are out, or None when the client is gone (a failed write closes
    /// it).
    fn write_out(&mut self, id: ConnId) -> Option<bool> {
        self.touched.push(id);
        match self.clients.get_mut(&id)?.flush() {
            Ok(done) => Some(done),
            Err(e) => {
                log::debug!("connection {id}: cannot write the answer: {e}");
                self.close(id);
                None
            }
        }
    }

    /// Answers client `id`'s whole requests into its output buffer, in order,
    /// while it is free; says why it stopped.
    fn answer_requests(&mut self, id: ConnId) -> Stop {
        for _ in 0..REQUESTS_PER_TURN {
            let Some(c) = self.clients.get_mut(&id) else {
                return Stop::Held;
            };
            if !matches!(c.state, State::Reading) || c.stalled {
                return Stop::Held;
            }
            if c.output.len() >= KEEP_OUTPUT {
                return Stop::Capped;
            }
            let Some(line) = c.next_line() else {
                return Stop::Drained;
            };
            let (end, next) = match line {
                Line::TooLong => {
                    let e = format!("request line longer than {MAX_LINE} bytes refused");
                    self.respond(id, err_line(&e), "request");
                    continue;
                }
                Line::Text { end, next } => (end, next),
            };
            let parsed = match std::str::from_utf8(&c.input[..end]) {
                Err(_) => Err("request line is not valid UTF-8".to_string()),
                Ok(t) if t.trim().is_empty() => Ok(None),
                Ok(t) => Request::parse(t).map(Some),
            };
            c.input.drain(..next);
            let answer = match parsed {
                Ok(None) => continue,
                Ok(Some(req)) => {
                    let wait = req.wait_seconds().unwrap_or(0).min(MAX_WAIT_SECS);
                    let until = self.wait_end(wait);
                    self.call(id, req, wait > 0, until);
                    continue;
                }
                Err(e) => err_line(&e),
            };
            self.respond(id, answer, "request");
        }
        Stop::Capped
    }

    /// Asks the hub; answers, parks or offloads as it says.
    fn call(&mut self, id: ConnId, req: Request, can_wait: bool, until: Instant) {
        self.touched.push(id);
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        let cmd = req.cmd();
        if c.peer.is_none()
            && !c.adopted
            && matches!(c.who, Identity::Agent(_))
            && hub::wants_peer(&req)
        {
            // Once per connection, and only where the hub needs it.
            match fd::peer_pid(&c.stream) {
                Ok(pid) => {
                    c.peer = Some(pid);
                    self.hub.peer(id, pid);
                }
                Err(e) => log::debug!("connection {id}: no peer process: {e}"),
            }
        }
        let kept = can_wait.then(|| req.clone());
        match self.hub.handle(&c.who, id, req, can_wait) {
            Outcome::Answer(line) => {
                // The long-polls this request woke (a message for a parked
                // `recv_next`) are answered first: a harness waiting for its
                // next message is on the way to a turn, the request's sender
                // only waits for its `ok`, and answering it first would let it
                // take the CPU back before the harness is told.
                self.wake_parked();
                self.respond(id, line, cmd)
            }
            Outcome::Wait => match kept {
                Some(req) if !c.eof => c.state = State::Parked { req, until },
                // Nobody would read the answer; the ones before it go out.
                Some(_) => {
                    let _ = c.flush();
                    self.close(id)
                }
                None => self.respond(
                    id,
                    err_line(&format!(
                        "the broker parked {cmd}, which cannot wait (a broker bug: please report it)"
                    )),
                    cmd,
                ),
            },
            Outcome::Offload(job) => {
                c.state = State::Busy { cmd };
                let tx = self.tx.clone();
                let started = std::thread::Builder::new()
                    .name("conn-job".into())
                    .spawn(move || {
                        // A job that panics (a bug) still answers its caller.
                        let finish = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                            .unwrap_or_else(|_| {
                                hub::Finish::Answer(err_line(&format!(
                                    "the broker failed while carrying out {cmd} (a broker bug: please report it); check whether it took effect before trying again"
                                )))
                            });
                        let _ = tx.send(HubMsg::Finished { conn: id, finish });
                    });
                if let Err(e) = started {
                    log::warn!("connection {id}: cannot start a thread for {cmd}: {e}");
                    self.respond(
                        id,
                        err_line(&format!(
                            "the broker cannot start a thread for {cmd} now ({e}); try again"
                        )),
                        cmd,
                    );
                }
            }
        }
    }

    /// Asks again for parked client `id`: woken (`can_wait`) or at its
    /// deadline (answer now).
    fn ask_again(&mut self, id: ConnId, can_wait: bool) {
        self.touched.push(id);
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        let State::Parked { until, .. } = c.state else {
            return;
        };
        let State::Parked { req, .. } = std::mem::replace(&mut c.state, State::Reading) else {
            return;
        };
        self.call(id, req, can_wait, until);
        self.pump(id);
    }

    /// Queues `line` as the answer to `cmd` on client `id`; the [`Loop::pump`]
    /// that follows every answer writes it.
    fn respond(&mut self, id: ConnId, line: String, cmd: &str) {
        self.touched.push(id);
        let Some(c) = self.clients.get_mut(&id) else {
            return;
        };
        // The last line of defence: no reader accepts a longer line, so a
        // longer answer (a bug) becomes an error the client can read.
        let line = if line.len() > MAX_LINE {
            log::error!(
                "connection {id}: the answer to {cmd} is {} bytes, over the line limit; sent an error instead",
                line.len()
            );
            err_line(&format!(
                "the answer to {cmd} would be {} bytes, over the {MAX_LINE}-byte line limit, and was not sent (a broker bug: please report it)",
                line.len()
            ))
        } else {
            line
        };
        c.state = State::Reading;
        c.output.reserve(line.len() + 1);
        c.output.extend_from_slice(line.as_bytes());
        c.output.push(b'\n');
        c.deadline = Instant::now() + self.limits.idle;
    }

    /// Handles a message from another thread; false to stop.
    fn message(&mut self, msg: HubMsg) -> bool {
        match msg {
            HubMsg::Finished { conn, finish } => {
                // What the job did is applied even when its caller has gone.
                let line = self.hub.finish(finish);
                if let Some(State::Busy { cmd }) = self.clients.get(&conn).map(|c| &c.state) {
                    let cmd = *cmd;
                    self.respond(conn, line, cmd);
                    self.pump(conn);
                }
                true
            }
            msg => self.hub.on_msg(msg),
        }
    }

    /// Ends the waits that are due and closes connections idle too long.
    fn expire(&mut self, now: Instant) {
        let mut due = Vec::new();
        let mut idle = Vec::new();
        while self.next_due().is_some_and(|t| t <= now) {
            let Some(Reverse((_, id))) = self.deadlines.pop() else {
                break;
            };
            let Some(c) = self.clients.get_mut(&id) else {
                continue;
            };
            c.queued = None;
            match &c.state {
                State::Parked { .. } => due.push(id),
                State::Reading => idle.push(id),
                State::Busy { .. } => {}
            }
        }
        for id in due {
            self.ask_again(id, false);
        }
        for id in idle {
            let Some(c) = self.clients.get(&id) else {
                continue;
            };
            if c.writing() {
                log::debug!(
                    "connection {id} of {}: the answer was not read for {} s, closed",
                    c.who.name(),
                    self.limits.idle.as_secs()
                );
            } else {
                log::debug!(
                    "connection {id} of {}: idle for {} s, closed",
                    c.who.name(),
                    self.limits.idle.as_secs()
                );
            }
            self.close(id);
        }
    }

    /// Asks again for every parked connection the hub woke: the harnesses'
    /// `recv_next` first (a turn waits on it), then the rest (status
    /// watches, `recv`, the operator's inbox) in the order they parked.
    fn wake_parked(&mut self) {
        loop {
            let mut woken = self.hub.take_woken();
            if woken.is_empty() {
                return;
            }
            woken.sort_by_key(|id| {
                !matches!(
                    self.clients.get(id).map(|c| &c.state),
                    Some(State::Parked {
                        req: Request::RecvNext(_),
                        ..
                    })
                )
            });
            for id in woken {
                self.ask_again(id, true);
            }
        }
    }

    /// Closes client `id`: the hub releases what it held.
    fn close(&mut self, id: ConnId) {
        if let Some(c) = self.clients.remove(&id) {
            if c.watched.is_some() {
                let _ = self.epoll.delete(c.stream.as_raw_fd());
            }
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
            self.hub.closed(id);
        }
    }

    fn shutdown(&mut self) {
        for s in &self.sockets {
            let _ = std::fs::remove_file(&s.path);
        }
        let parked: Vec<ConnId> = self
            .clients
            .iter()
            .filter(|(_, c)| matches!(c.state, State::Parked { .. }))
            .map(|(id, _)| *id)
            .collect();
        for id in parked {
            self.respond(id, err_line("broker is stopping"), "request");
            if let Some(c) = self.clients.get_mut(&id) {
                let _ = c.flush();
            }
        }
        self.clients.clear();
        log::debug!("hub stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::db::{Db, Durability, Store};
    use crate::broker::hub::{channel, HubSettings};
    use crate::config::HiveConfig;
    use std::io::{BufRead, BufReader};

    /// A hub serving one agent socket (`ana`) and the host socket from its
    /// own thread, on a temp store; stopped and removed when dropped.
    struct Served {
        dir: PathBuf,
        tx: HubTx,
        thread: Option<std::thread::JoinHandle<()>>,
    }

    impl Served {
        fn start(tag: &str) -> Served {
            Served::start_with(tag, ConnLimits::new(1024, 1, 8, Duration::from_secs(60)))
        }

        fn start_with(tag: &str, limits: ConnLimits) -> Served {
            let dir =
                std::env::temp_dir().join(format!("hive-sockets-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            let db = Db::open(&dir.join("broker.db"), Durability::Normal).unwrap();
            let cfg = HiveConfig::parse(r#"{"agents":[{"name":"ana"}]}"#).unwrap();
            let (tx, rx) = channel().unwrap();
            let mut listening = Vec::new();
            for (name, who) in [
                ("ana.sock", Identity::Agent("ana".into())),
                ("host.sock", Identity::Operator),
            ] {
                let path = dir.join(name);
                let listener = UnixListener::bind(&path).unwrap();
                listening.push(Listening {
                    listener,
                    who,
                    path,
                });
            }
            let (loop_tx, settings) = (tx.clone(), HubSettings::for_tests(&dir));
            let thread = std::thread::spawn(move || {
                let hub = Hub::new(Store::new(&db).unwrap(), cfg, settings);
                let mut serve = Loop::new(hub, rx, loop_tx, limits).unwrap();
                for l in listening {
                    serve.listen(l).unwrap();
                }
                serve.run()
            });
            Served {
                dir,
                tx,
                thread: Some(thread),
            }
        }

        fn connect(&self, name: &str) -> (UnixStream, BufReader<UnixStream>) {
            let s = UnixStream::connect(self.dir.join(name)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let r = BufReader::new(s.try_clone().unwrap());
            (s, r)
        }
    }

    impl Drop for Served {
        fn drop(&mut self) {
            let _ = self.tx.send(HubMsg::Shutdown);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn answer(r: &mut BufReader<UnixStream>) -> serde_json::Value {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    /// A credential's connections speak for the harness, whatever holds the
    /// agent's socket; on the socket the harness's rows are then refused,
    /// and the operator is told once. Its own cap bounds it, not the
    /// socket's.
    #[test]
    fn a_credential_makes_the_harnesss_connections_and_the_socket_loses_its_rows() {
        use crate::proto::Client;
        use crate::sys::fd::Credential;
        let s = Served::start("credential");
        // The socket's connections, all of them (its cap is 8 here).
        let mut held: Vec<_> = (0..8).map(|_| s.connect("ana.sock")).collect();
        let (mut w, mut r) = s.connect("ana.sock");
        let _ = w.write_all(b"{\"cmd\":\"hello\"}\n");
        assert!(answer(&mut r)["error"]
            .as_str()
            .unwrap()
            .contains("too many connections"));
        // Before a credential, the socket is the harness's too (`Shared`).
        let (w, r) = &mut held[0];
        let counts = b"{\"cmd\":\"post_turn_counts\",\"tokens_in\":1}\n";
        w.write_all(counts).unwrap();
        assert_eq!(answer(r)["ok"], true);
        let (broker_end, harness_end) = UnixStream::pair().unwrap();
        s.tx.send(HubMsg::FromFleet(Box::new(
            crate::broker::lifecycle::FleetEvent::Credential {
                agent: "ana".into(),
                via: Via::Harness,
                control: broker_end,
            },
        )))
        .unwrap_or_else(|_| panic!("the hub is gone"));
        let credential = Credential::over(harness_end);
        let mut conns = Vec::new();
        for _ in 0..CREDENTIAL_CONNS {
            let mut c = Client::over(credential.connect().unwrap(), std::path::Path::new("ana"));
            c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let line = c
                .call_line("{\"cmd\":\"post_turn_counts\",\"tokens_in\":1}")
                .unwrap();
            assert!(line.starts_with("{\"ok\":true"), "{line}");
            conns.push(c);
        }
        let mut over = Client::over(credential.connect().unwrap(), std::path::Path::new("ana"));
        over.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let line = over.call_line("{\"cmd\":\"hello\"}").unwrap();
        assert!(
            line.contains("through the credential of ana's harness"),
            "{line}"
        );
        // The socket is now any process's: the harness's rows are refused.
        for _ in 0..2 {
            w.write_all(counts).unwrap();
            let a = answer(r);
            assert!(
                a["error"]
                    .as_str()
                    .unwrap()
                    .contains("post_turn_counts is the harness's own report"),
                "{a}"
            );
        }
        w.write_all(b"{\"cmd\":\"hello\"}\n").unwrap();
        assert_eq!(answer(r)["ok"], true);
        let (mut w2, mut r2) = s.connect("host.sock");
        w2.write_all(b"{\"cmd\":\"inbox\",\"peek\":true}\n")
            .unwrap();
        let inbox = answer(&mut r2);
        let told: Vec<_> = inbox["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["body"].as_str().unwrap().contains("ana's harness sent"))
            .collect();
        assert_eq!(told.len(), 1, "{inbox}");
        drop(conns);
    }

    #[test]
    fn many_requests_sent_at_once_are_answered_in_order() {
        let s = Served::start("order");
        let (mut w, mut r) = s.connect("ana.sock");
        let n = 3 * REQUESTS_PER_TURN + 5;
        let mut all = String::new();
        for i in 0..n {
            all.push_str(&format!(
                "{{\"cmd\":\"wake\",\"from\":\"cron\",\"body\":\"m{i}\"}}\n"
            ));
        }
        w.write_all(all.as_bytes()).unwrap();
        let ids: Vec<i64> = (0..n)
            .map(|_| answer(&mut r)["id"].as_i64().unwrap())
            .collect();
        assert_eq!(ids, (1..=n as i64).collect::<Vec<_>>());
        // Meanwhile and after, another client is served.
        let (mut w2, mut r2) = s.connect("host.sock");
        w2.write_all(b"{\"cmd\":\"agents\"}\n").unwrap();
        assert_eq!(answer(&mut r2)["ok"], true);
    }

    /// Every answer line of `text`, parsed.
    fn answers(text: &str) -> Vec<serde_json::Value> {
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[test]
    fn requests_sent_at_once_are_answered_in_one_write() {
        let s = Served::start("batch");
        let (mut w, r) = s.connect("ana.sock");
        // What a harness sends at the end of a turn, in one write.
        let batch = concat!(
            "{\"cmd\":\"wake\",\"from\":\"cron\",\"body\":\"a\"}\n",
            "{\"cmd\":\"wake\",\"from\":\"cron\",\"body\":\"b\"}\n",
            "{\"cmd\":\"status\"}\n",
            "{\"cmd\":\"recv_next\",\"wait_seconds\":0}\n",
        );
        w.write_all(batch.as_bytes()).unwrap();
        // One read gets all four answers: they were written together.
        let mut buf = vec![0u8; 64 * 1024];
        let n = r.get_ref().read(&mut buf).unwrap();
        let text = std::str::from_utf8(&buf[..n]).unwrap();
        let lines = answers(text);
        assert_eq!(lines.len(), 4, "{text}");
        assert_eq!(lines[0]["id"], 1);
        assert_eq!(lines[1]["id"], 2);
        assert_eq!(lines[2]["unread"], 2);
        assert_eq!(lines[3]["message"]["body"], "a");
    }

    #[test]
    fn a_client_that_stops_sending_gets_every_answer_before_the_close() {
        let s = Served::start("halfclose");
        let (w, mut r) = s.connect("ana.sock");
        // Two requests, then a long-poll on an empty inbox that nobody would
        // read: the two answers still go out, then the connection closes.
        (&w).write_all(
            concat!(
                "{\"cmd\":\"status\"}\n",
                "{\"cmd\":\"hello\"}\n",
                "{\"cmd\":\"recv_next\",\"wait_seconds\":30}\n",
            )
            .as_bytes(),
        )
        .unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap();
        let mut rest = String::new();
        r.read_to_string(&mut rest).unwrap();
        let lines = answers(&rest);
        assert_eq!(lines.len(), 2, "{rest:?}");
        assert_eq!(lines[0]["unread"], 0);
        assert_eq!(lines[1]["identity"], "ana");
    }

    #[test]
    fn a_parked_call_holds_up_nobody_and_its_hang_up_returns_what_it_held() {
        let s = Served::start("park");
        let (mut parked, mut parked_r) = s.connect("ana.sock");
        parked
            .write_all(b"{\"cmd\":\"recv_next\",\"wait_seconds\":30}\n")
            .unwrap();
        // The boot of an empty inbox parks it; others are answered meanwhile.
        let (mut w, mut r) = s.connect("host.sock");
        w.write_all(b"{\"cmd\":\"send\",\"to\":\"ana\",\"body\":\"hello\"}\n")
            .unwrap();
        assert_eq!(answer(&mut r)["ok"], true);
        let got = answer(&mut parked_r);
        assert_eq!(got["message"]["body"], "hello", "{got}");
        // A `recv` holds rows for its connection until confirmed; a client
        // that hangs up while parked gives them back.
        let (mut m, mut mr) = s.connect("ana.sock");
        m.write_all(b"{\"cmd\":\"ack_turn\",\"id\":1}\n").unwrap();
        assert_eq!(answer(&mut mr)["ok"], true);
        w.write_all(b"{\"cmd\":\"send\",\"to\":\"ana\",\"body\":\"held\"}\n")
            .unwrap();
        assert_eq!(answer(&mut r)["ok"], true);
        m.write_all(b"{\"cmd\":\"recv\"}\n").unwrap();
        assert_eq!(answer(&mut mr)["messages"][0]["body"], "held");
        m.write_all(b"{\"cmd\":\"recv\",\"wait_seconds\":30}\n")
            .unwrap();
        drop(mr);
        drop(m);
        let (mut again, mut again_r) = s.connect("ana.sock");
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            again.write_all(b"{\"cmd\":\"recv\"}\n").unwrap();
            let got = answer(&mut again_r);
            if got["messages"][0]["body"] == "held" {
                break;
            }
            assert!(Instant::now() < end, "the held row came back: {got}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_long_line_in_pieces_and_a_last_line_without_newline_are_answered() {
        let s = Served::start("lines");
        let (mut w, mut r) = s.connect("ana.sock");
        let chunk = vec![b'x'; 256 * 1024];
        for _ in 0..5 {
            w.write_all(&chunk).unwrap();
        }
        w.write_all(b"\n{\"cmd\":\"hello\"}\n").unwrap();
        let e = answer(&mut r);
        assert!(e["error"].as_str().unwrap().contains("longer than"), "{e}");
        assert_eq!(answer(&mut r)["identity"], "ana");
        w.write_all(b"{\"cmd\":\"hello\"}").unwrap();
        w.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(answer(&mut r)["identity"], "ana");
        let mut rest = String::new();
        assert_eq!(r.read_line(&mut rest).unwrap(), 0, "then closed: {rest}");
    }

    #[test]
    fn a_client_that_does_not_read_holds_up_nobody() {
        let s = Served::start("slow");
        let (mut w, mut r) = s.connect("host.sock");
        // Twenty messages of 60 KB: each inbox page is a large answer.
        let body = "y".repeat(60_000);
        for _ in 0..20 {
            let line = format!("{{\"cmd\":\"send\",\"to\":\"ana\",\"body\":\"{body}\"}}\n");
            w.write_all(line.as_bytes()).unwrap();
            assert_eq!(answer(&mut r)["ok"], true);
        }
        let (mut slow, _slow_r) = s.connect("ana.sock");
        for _ in 0..20 {
            slow.write_all(b"{\"cmd\":\"recv\",\"max\":20}\n").unwrap();
        }
        // The slow client never reads; the hub answers others meanwhile.
        let (mut w2, mut r2) = s.connect("host.sock");
        for _ in 0..10 {
            w2.write_all(b"{\"cmd\":\"agents\"}\n").unwrap();
            assert_eq!(answer(&mut r2)["ok"], true);
        }
    }

    #[test]
    fn what_a_closed_client_left_unread_never_reaches_the_next_one() {
        // One connection per agent: the next is accepted only once the
        // first is closed, right behind it on the same socket.
        let limits = ConnLimits::new(1024, 1, 1, Duration::from_secs(60));
        let s = Served::start_with("spare", limits);
        for round in 0..3 {
            let (mut w, r) = s.connect("ana.sock");
            // A long-poll on an empty inbox parks; half a request behind it
            // stays unread in the connection's input, and an answer is
            // never asked for.
            w.write_all(b"{\"cmd\":\"recv_next\",\"wait_seconds\":30}\n{\"cmd\":\"hel")
                .unwrap();
            drop((w, r));
            let mut tries = 0;
            let hello = loop {
                let (mut w, mut r) = s.connect("ana.sock");
                w.write_all(b"{\"cmd\":\"hello\"}\n").unwrap();
                let a = answer(&mut r);
                if a["ok"] == true {
                    break a;
                }
                let why = a["error"].as_str().unwrap_or_default().to_string();
                assert!(why.contains("connections"), "round {round}: {a}");
                tries += 1;
                assert!(
                    tries < 1000,
                    "round {round}: the first connection was never closed"
                );
                std::thread::sleep(Duration::from_millis(10));
            };
            assert_eq!(hello["identity"], "ana", "round {round}: {hello}");
        }
    }
}
