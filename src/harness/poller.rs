//! The harness's three connections to the broker (through its credential
//! under isolated `hive up`, else on its agent socket: [`Dial`]), each owned
//! by a thread: `poller` long-polls `recv_next` when the turn loop asks for the
//! next message (or peeks once, without waiting, before a requested
//! continue, before a checkpoint or `/compact` after a run, and at boot;
//! every answer carries the agent's `turn_usd`),
//! `broker-calls` carries the loop's other requests (kick, ack, requeue,
//! dead letters, counters, its pause, notices to the parent) in the order
//! they were sent, and `status-watch` keeps a `status` call parked with
//! what it has `seen` of the agent's status line and unread count, so a
//! change reaches the loop (and the page) at once, also while a turn runs —
//! when no `recv_next` can be parked, since the broker answers it with the
//! inflight row — and so does the operator's `hive resume` of a pause the
//! loop waits out by itself (the answer's resume mark moves). Nothing the loop sends waits for an answer: a refusal is
//! logged. An ask for the next message goes through the calls thread too, so
//! it reaches the long-poll only after every earlier request was answered —
//! an ack always lands before the next `recv_next`, and while the broker is
//! unreachable the loop simply gets no message, using up no attempt. An ask
//! right behind other requests (the end of a run) is first put in their write
//! as a `recv_next` that does not wait: a queued message comes back with the
//! ack's answer, and only an empty inbox sends the ask on to the long-poll.
//!
//! When the broker is gone each connection reconnects with a backoff that
//! doubles up to `HIVE_RECONNECT_MAX_MS`. An answer it cannot use (too long,
//! not UTF-8, malformed) or a connection that breaks is treated the same way,
//! and the first failure of a burst is logged, so whatever the broker sends,
//! the poller never spins. Reachability goes to the loop as
//! [`FromPoller::Online`]; the loop is the one writer of the bus state.
//! Shutting the poller down closes the long-poll and watch sockets, so a
//! parked call returns at once, and gives each request still queued one last
//! try.

use super::bus::Bus;
use crate::proto::cmd::{self, RecvNext, RecvNextReply, Seen, Status, StatusReply};
use crate::proto::{Client, ClientError, Dial, Message, Request};
use crossbeam_channel::{select, unbounded, Receiver, Sender};
use std::collections::VecDeque;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The first pause before reconnecting; it doubles per failure up to the cap.
const MIN_BACKOFF: Duration = Duration::from_millis(100);

/// How long the status watch waits after a change before it asks again: the
/// page shows a burst of changes this late at most.
const STATUS_COALESCE: Duration = Duration::from_millis(50);

/// How long one broker call may take to answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// What the poller hands the turn loop.
#[derive(Debug)]
pub enum FromPoller {
    /// `unread` is the queue depth after the pop, when the broker said.
    Message {
        message: Message,
        redelivered: bool,
        unread: Option<u64>,
        /// Its hand-outs that count toward the attempt limit, this one
        /// included (0 from a broker that does not count them).
        attempts: u32,
        /// The agent's `turn_usd` now (issue 16).
        turn_usd: Option<f64>,
        /// The `traceparent` it carries (issue 43): its run links to it.
        /// One that does not parse is left out.
        traceparent: Option<crate::proto::cmd::TraceParent>,
    },
    /// A peek found the inbox empty and nothing inflight, or a long-poll
    /// was answered that the broker's pause ended with nothing to hand out.
    Empty,
    /// The agent's status line or unread count changed (or this is the
    /// first look at them).
    Status { unread: u64, status_text: String },
    /// The broker became reachable (true) or unreachable (false).
    Online(bool),
    /// The broker pauses this agent (its pool's usage limit, a budget) and
    /// hands out nothing until the pause ends; `None` once an answer without
    /// a pause shows it ended — a hand-out, or an empty answer, which then
    /// also comes as [`FromPoller::Empty`] (issue 16).
    BrokerPause(Option<crate::proto::Paused>),
    /// The broker acknowledged the spend row with this key (issue 16).
    SpendAcked(String),
    /// The agent's `turn_usd` as a `recv_next` answer gave it, after the
    /// answer's pause (or its end) and before its message or `Empty`
    /// (issue 16).
    TurnUsd(Option<f64>),
    /// The operator resumed the agent (`hive resume`, issue 40): the status
    /// watch saw the broker's resume mark move. A harness waiting out a
    /// pause of its own tries again at once.
    Resumed,
}

/// What the long-poll thread is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    /// Long-poll until a message arrives.
    Next,
    /// One `recv_next` that does not wait.
    Peek,
}

/// What the calls thread is sent.
enum ToCalls {
    Tell(Request),
    Ask(Ask),
    /// What a [`Cork`] held, in the order it was sent.
    Batch(Vec<ToCalls>),
    /// The harness stops: what is queued before this gets one last try,
    /// then `done` is dropped.
    Stop(Sender<()>),
}

/// The stack of each of the three threads: they read the broker's one-line
/// answers (at most `MAX_LINE`) and parse them with serde_json, whose
/// recursion limit (128) bounds their nesting; a test has each parse an
/// answer nested to it on a thread of this size.
pub const STACK: usize = 256 * 1024;

/// What the calls thread keeps between its threads.
struct Calls {
    conn: Conn,
    queue: VecDeque<ToCalls>,
    asks: Sender<Ask>,
}

/// The calls thread, which runs only while it has requests: a request sent
/// starts it when none runs, and with nothing queued it ends.
#[derive(Clone)]
struct CallsThread {
    rx: Receiver<ToCalls>,
    slot: crate::demand::Slot<Calls>,
}

impl CallsThread {
    fn wake(&self) -> bool {
        let rx = self.rx.clone();
        match self
            .slot
            .wake("broker-calls", STACK, move |c, slot| run_calls(c, rx, slot))
        {
            Ok(running) => running,
            Err(e) => {
                log::error!("cannot start the broker-calls thread: {e}; the requests wait");
                false
            }
        }
    }
}

/// Requests in a row the calls thread writes at once, at most.
const PIPELINE_MAX: usize = 32;

/// A handle that sends broker requests in order; cheap to clone (the
/// inflight guard holds one).
#[derive(Clone)]
pub struct Teller {
    tx: Sender<ToCalls>,
    /// While a [`Cork`] stands, what every clone sends is held here.
    corked: Arc<Mutex<Option<Vec<ToCalls>>>>,
    /// The thread that sends them (None in the tests that read `tx`).
    calls: Option<CallsThread>,
}

/// Holds what every clone of a [`Teller`] sends until it is dropped, then
/// hands it to the calls thread at once, which writes it in one go: the end
/// of a turn (its spend, its counters, its ack) costs one round trip to the
/// broker instead of one each.
pub struct Cork {
    teller: Teller,
}

impl Drop for Cork {
    fn drop(&mut self) {
        let held = self.teller.held().take();
        if let Some(held) = held.filter(|h| !h.is_empty()) {
            self.teller.put(ToCalls::Batch(held));
        }
    }
}

impl Teller {
    fn held(&self) -> std::sync::MutexGuard<'_, Option<Vec<ToCalls>>> {
        self.corked.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, c: ToCalls) {
        let mut held = self.held();
        match held.as_mut() {
            Some(h) => h.push(c),
            None => {
                drop(held);
                self.put(c);
            }
        }
    }

    /// Queues `c` for the calls thread and starts it when none runs.
    fn put(&self, c: ToCalls) {
        let _ = self.tx.send(c);
        if let Some(calls) = &self.calls {
            calls.wake();
        }
    }

    /// Sends `req`; its answer is not waited for (a refusal is logged).
    pub fn tell(&self, req: Request) {
        self.send(ToCalls::Tell(req));
    }

    /// Holds what is sent from now on until the guard is dropped (a cork
    /// already standing keeps holding; the outer one sends).
    pub fn cork(&self) -> Option<Cork> {
        let mut held = self.held();
        if held.is_some() {
            return None;
        }
        *held = Some(Vec::new());
        Some(Cork {
            teller: self.clone(),
        })
    }

    /// Tells the broker to dead-letter the inflight message `id`: it keeps
    /// it in the `failed` state with `error` as its last error and tells its
    /// parent and its sender once (`dead_letter`). Nothing acks it. `ran` is
    /// false when this hand-out was not run.
    pub fn dead_letter(&self, id: i64, error: String, ran: bool) {
        self.tell(Request::from(cmd::DeadLetter { id, error, ran }));
    }
}

/// The turn loop's handle on the two connections.
pub struct Poller {
    teller: Teller,
    pub events: Receiver<FromPoller>,
    stop: Option<Sender<()>>,
    /// The long-poll and status-watch connections, shut down to end a parked
    /// call.
    parked: Vec<Arc<Mutex<Option<UnixStream>>>>,
    threads: Vec<JoinHandle<()>>,
}

/// One connection to the broker and its reconnect state.
struct Conn {
    what: &'static str,
    broker: Dial,
    reconnect_max: Duration,
    bus: Bus,
    events: Sender<FromPoller>,
    client: Option<Client>,
    stream: Arc<Mutex<Option<UnixStream>>>,
    stop: Receiver<()>,
    /// The next pause before reconnecting; reset by a good answer.
    backoff: Duration,
    /// The last connection attempt failed (the broker is unreachable).
    unreachable: bool,
    /// Unusable answers and broken connections since the last good answer.
    failures: u32,
    /// No new connection before this, after an unusable answer.
    retry_at: Option<Instant>,
    /// A broker pause was passed to the loop and not yet seen to end (the
    /// long-poll sets it; the calls thread asks for no message while it is).
    pause_shown: Arc<AtomicBool>,
}

impl Poller {
    pub fn start(broker: Dial, wait_secs: u64, reconnect_max: Duration, bus: Bus) -> Poller {
        let (calls_tx, calls_rx) = unbounded::<ToCalls>();
        let (asks_tx, asks_rx) = unbounded::<Ask>();
        let (ev_tx, ev_rx) = unbounded::<FromPoller>();
        let (stop_tx, stop_rx) = unbounded::<()>();
        let poll_stream = Arc::new(Mutex::new(None));
        let watch_stream = Arc::new(Mutex::new(None));
        let pause_shown = Arc::new(AtomicBool::new(false));
        let conn = |what, stream| Conn {
            what,
            broker: broker.clone(),
            reconnect_max,
            bus: bus.clone(),
            events: ev_tx.clone(),
            client: None,
            stream,
            stop: stop_rx.clone(),
            backoff: MIN_BACKOFF,
            unreachable: false,
            failures: 0,
            retry_at: None,
            pause_shown: pause_shown.clone(),
        };
        let mut poll = conn("long-poll", poll_stream.clone());
        let calls = conn("calls", Arc::new(Mutex::new(None)));
        let mut watch = conn("status-watch", watch_stream.clone());
        let mut threads = Vec::new();
        let spawned = std::thread::Builder::new()
            .name("poller".into())
            .stack_size(STACK)
            .spawn(move || poll.run_polls(asks_rx, wait_secs));
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => log::error!("cannot start the poller thread: {e}"),
        }
        let calls = CallsThread {
            rx: calls_rx,
            slot: crate::demand::Slot::new(Calls {
                conn: calls,
                queue: VecDeque::new(),
                asks: asks_tx,
            }),
        };
        let spawned = std::thread::Builder::new()
            .name("status-watch".into())
            .stack_size(STACK)
            .spawn(move || watch.run_watch(wait_secs));
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => log::error!("cannot start the status-watch thread: {e}"),
        }
        Poller {
            teller: Teller {
                tx: calls_tx,
                corked: Arc::new(Mutex::new(None)),
                calls: Some(calls),
            },
            events: ev_rx,
            stop: Some(stop_tx),
            parked: vec![poll_stream, watch_stream],
            threads,
        }
    }

    /// Asks for the next message (after every request sent before); it arrives
    /// on `events`.
    pub fn next(&self) {
        self.teller.send(ToCalls::Ask(Ask::Next));
    }

    /// Asks, without waiting, whether anything is queued or inflight: a
    /// [`FromPoller::Message`] (now inflight) or [`FromPoller::Empty`].
    pub fn peek(&self) {
        self.teller.send(ToCalls::Ask(Ask::Peek));
    }

    /// Sends `req` in order with the others; nobody waits for the answer.
    pub fn tell(&self, req: Request) {
        self.teller.tell(req);
    }

    pub fn teller(&self) -> Teller {
        self.teller.clone()
    }

    /// Stops the threads: a parked long-poll or watch returns at once, and
    /// every request still queued gets one last try.
    pub fn shutdown(&mut self) {
        if self.stop.take().is_none() {
            return;
        }
        for parked in &self.parked {
            if let Some(s) = parked.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(calls) = &self.teller.calls {
            let (done_tx, done) = crossbeam_channel::bounded::<()>(0);
            let _ = self.teller.tx.send(ToCalls::Stop(done_tx));
            if calls.wake() {
                let _ = done.recv();
            }
        }
    }
}

impl Drop for Poller {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Conn {
    fn stopped(&self) -> bool {
        matches!(
            self.stop.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        )
    }

    fn set_online(&self, online: bool) {
        let _ = self.events.send(FromPoller::Online(online));
    }

    /// The long-poll thread: one ask at a time, each answered on `events`.
    fn run_polls(&mut self, asks: Receiver<Ask>, wait_secs: u64) {
        loop {
            let ask = select! {
                recv(asks) -> a => match a { Ok(a) => a, Err(_) => return },
                recv(self.stop) -> _ => return,
            };
            let Some(ev) = self.poll(ask, wait_secs) else {
                return;
            };
            if self.events.send(ev).is_err() {
                return;
            }
        }
    }

    /// Sends the requests at the head of `queue` (or passes its ask on to
    /// the long-poll thread).
    fn calls_once(&mut self, queue: &mut VecDeque<ToCalls>, asks: &Sender<Ask>) {
        let mut tells = Vec::new();
        while tells.len() < PIPELINE_MAX {
            match queue.front() {
                Some(ToCalls::Tell(_)) => {
                    if let Some(ToCalls::Tell(req)) = queue.pop_front() {
                        tells.push(req);
                    }
                }
                _ => break,
            }
        }
        if tells.is_empty() {
            if let Some(ToCalls::Ask(a)) = queue.pop_front() {
                let _ = asks.send(a);
            }
            return;
        }
        // The next message asked for right behind these requests (the end
        // of a run: its ack, then the ask) is asked in the same write, as
        // a `recv_next` that does not wait: when one is queued it comes
        // back with the answers, without a second round trip and the
        // long-poll thread's hop. Otherwise, and while a broker pause is
        // shown (the long-poll thread tracks its end), the ask goes on to
        // the long-poll as before.
        let peek = matches!(queue.front(), Some(ToCalls::Ask(_)))
            && !self.pause_shown.load(Ordering::SeqCst);
        if peek {
            tells.push(Request::from(RecvNext {
                wait_seconds: Some(0),
                seen: None,
            }));
        }
        let mut results = self.call_all(&tells, peek);
        let handed_out = if peek {
            tells.pop();
            results
                .pop()
                .and_then(|r| r.ok())
                .and_then(|line| handed_out(&line))
        } else {
            None
        };
        for (req, r) in tells.iter().zip(results) {
            match r {
                Ok(_) => {
                    if let Request::ReportSpend(c) = req {
                        let _ = self.events.send(FromPoller::SpendAcked(c.key.clone()));
                    }
                }
                Err(e) => log::warn!("{} refused: {e}", req.cmd()),
            }
        }
        if let Some(message) = handed_out {
            queue.pop_front();
            // As the long-poll thread tells it: `turn_usd`, then the message.
            if let FromPoller::Message { turn_usd, .. } = &message {
                let _ = self.events.send(FromPoller::TurnUsd(*turn_usd));
            }
            let _ = self.events.send(message);
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
            match self.broker.connect() {
                Ok(c) => {
                    if let Ok(s) = c.shutdown_handle() {
                        *self.stream.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
                    }
                    // `Poller::shutdown` ends the stop channel, then shuts
                    // down the streams it finds: a stream put in place after
                    // it looked is this thread's to drop. Without this look a
                    // long-poll connected just then (its first, typically)
                    // parked for its whole wait, and `hive serve` took that
                    // long to exit on SIGTERM.
                    if self.stopped() {
                        return None;
                    }
                    if self.unreachable {
                        log::info!(
                            "reconnected to the broker at {}",
                            self.broker.socket().display()
                        );
                        self.bus.note("broker reachable again");
                        self.unreachable = false;
                    }
                    self.set_online(true);
                    self.client = Some(c);
                }
                Err(e) => {
                    log::warn!("{e}; retrying in {:?}", self.backoff);
                    if !self.unreachable {
                        self.bus.note(format!("broker unreachable: {e}"));
                    }
                    self.set_online(false);
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
        self.set_online(false);
        self.failures += 1;
        if self.failures == 1 {
            log::warn!(
                "lost the broker connection ({}): {e}; reconnecting in {:?}, backing off up to {:?} while it lasts",
                self.what,
                self.backoff,
                self.reconnect_max
            );
            self.bus.note(format!("lost the broker connection: {e}"));
        } else {
            log::debug!(
                "lost the broker connection ({}, {} in a row): {e}; reconnecting in {:?}",
                self.what,
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

    /// One `recv_next`: the message, or (for a peek) `Empty`; None once stopped.
    fn poll(&mut self, ask: Ask, wait_secs: u64) -> Option<FromPoller> {
        let wait = if ask == Ask::Peek { 0 } else { wait_secs };
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
            // The pause first, then `turn_usd`: the loop knows whether it may
            // start a queued `/compact` when it learns the cap.
            let paused = match &r {
                Ok(RecvNextReply {
                    message: None,
                    paused: Some(p),
                    ..
                }) => Some(p.clone()),
                _ => None,
            };
            // Any answer without a pause ends the one shown — a hand-out, or
            // the broker's word that it ended with nothing to hand out — and
            // the loop hears that (a waiting continue may run now).
            let ended = self.pause_shown.load(Ordering::SeqCst)
                && matches!(&r, Ok(RecvNextReply { paused: None, .. }));
            if let Some(p) = paused.clone() {
                self.pause_shown.store(true, Ordering::SeqCst);
                let _ = self.events.send(FromPoller::BrokerPause(Some(p)));
            } else if ended {
                self.pause_shown.store(false, Ordering::SeqCst);
                let _ = self.events.send(FromPoller::BrokerPause(None));
            }
            if let Ok(reply) = &r {
                // Every answer says the agent's `turn_usd`, also one that
                // hands out nothing: the loop knows it before its first run.
                let _ = self.events.send(FromPoller::TurnUsd(reply.turn_usd));
            }
            if paused.is_some() {
                // Answered once per pause: the next call parks until it ends.
                if ask == Ask::Peek {
                    return Some(FromPoller::Empty);
                }
                continue;
            }
            match r.map(message_of) {
                Ok(Some(message)) => return Some(message),
                Ok(None) if ask == Ask::Peek || ended => return Some(FromPoller::Empty),
                Ok(None) => continue,
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

    /// The status-watch thread: a `status` call parked with what it has seen;
    /// each answer that differs goes to the loop. The first call (and the
    /// first after a reconnect, since the broker may have restarted) does not
    /// wait, so the loop learns the current values.
    fn run_watch(&mut self, wait_secs: u64) {
        let mut seen: Option<Seen> = None;
        let mut published: Option<Seen> = None;
        // The broker's resume mark as last answered (None: no answer yet).
        // Kept across reconnects: a mark that moved meanwhile is a resume
        // the loop has not heard; the first answer of the process is not.
        let mut resumed: Option<Option<i64>> = None;
        loop {
            let fresh = self.client.is_none();
            let Some(c) = self.client() else {
                return;
            };
            if fresh {
                seen = None;
            }
            let wait = seen.as_ref().map(|_| wait_secs);
            let _ = c.set_read_timeout(Some(Duration::from_secs(wait.unwrap_or(0) + 30)));
            let r: Result<StatusReply, ClientError> = c.call(&Status {
                wait_seconds: wait,
                seen: Some(seen.clone().unwrap_or_default()),
            });
            match r {
                Ok(reply) => {
                    self.answered();
                    if let Some(before) = resumed {
                        if reply.resumed > before && self.events.send(FromPoller::Resumed).is_err()
                        {
                            return;
                        }
                    }
                    resumed = Some(resumed.flatten().max(reply.resumed));
                    let now = Seen {
                        unread: reply.unread,
                        status_text: reply.status_text.unwrap_or_default(),
                    };
                    let changed = seen.as_ref().is_some_and(|s| *s != now);
                    if published.as_ref() != Some(&now) {
                        let ev = FromPoller::Status {
                            unread: now.unread,
                            status_text: now.status_text.clone(),
                        };
                        if self.events.send(ev).is_err() {
                            return;
                        }
                        published = Some(now.clone());
                    }
                    seen = Some(now);
                    // Changes that come in a burst (the unread count of an
                    // agent working through its queue moves twice a turn)
                    // reach the page at most every STATUS_COALESCE, not at
                    // the cost of a round trip each.
                    if changed {
                        select! {
                            recv(crossbeam_channel::after(STATUS_COALESCE)) -> _ => {},
                            recv(self.stop) -> _ => return,
                        }
                    }
                }
                Err(ClientError::Refused(e)) => {
                    // A broker from before the watch: the status line shows
                    // what the harness read at boot.
                    log::warn!("the broker does not push status changes ({e}); not watching");
                    return;
                }
                Err(e) => {
                    if self.stopped() {
                        return;
                    }
                    self.lost(&e);
                }
            }
        }
    }

    /// Sends `reqs` in one write and reads their answers: each `Ok` or the
    /// broker's refusal. A broken connection is reopened and the requests
    /// not yet answered are sent again (at least once, as a single call
    /// always was), with the backoff of [`Conn::lost`] when it keeps failing.
    /// With `last_optional` (the pipelined `recv_next` of the end of a run)
    /// an unusable answer to the last request is not tried again: the
    /// connection is dropped, to be reopened for the next requests, and the
    /// ask goes on to the long-poll, which owns that trouble: the requests
    /// behind it are not held up by a broker that cannot answer it.
    fn call_all(&mut self, reqs: &[Request], last_optional: bool) -> Vec<Result<String, String>> {
        let mut results = Vec::with_capacity(reqs.len());
        let mut fresh = self.client.is_none();
        while results.len() < reqs.len() {
            let Some(c) = self.client() else {
                results.resize(reqs.len(), Err("the harness is stopping".to_string()));
                break;
            };
            let _ = c.set_read_timeout(Some(CALL_TIMEOUT));
            let rest = &reqs[results.len()..];
            let mut broken = None;
            for (req, answer) in rest.iter().zip(c.request_all(rest)) {
                match answer.and_then(|line| refusal(req, &line).map(|()| line)) {
                    Ok(line) => results.push(Ok(line)),
                    Err(ClientError::Refused(e)) => results.push(Err(e)),
                    Err(e) => {
                        broken = Some(e);
                        break;
                    }
                }
            }
            let Some(e) = broken else {
                self.answered();
                continue;
            };
            if last_optional && results.len() + 1 == reqs.len() {
                log::debug!("no next message with the answers ({}): {e}", self.what);
                self.client = None;
                results.push(Err(e.to_string()));
                break;
            }
            if self.stopped() {
                results.resize(reqs.len(), Err("the harness is stopping".to_string()));
                break;
            }
            if !fresh {
                log::debug!("reopening the broker connection ({}): {e}", self.what);
                self.client = None;
                fresh = true;
                continue;
            }
            self.lost(&e);
        }
        results
    }

    /// One try while stopping, on the open connection or one fresh one.
    fn last_try(&mut self, req: &Request) -> Result<(), String> {
        for _ in 0..2 {
            let c = match self.client.as_mut() {
                Some(c) => c,
                None => {
                    let c = self.broker.connect().map_err(|e| e.to_string())?;
                    self.client.insert(c)
                }
            };
            let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
            match c.request(req).and_then(|line| refusal(req, &line)) {
                Ok(_) => return Ok(()),
                Err(ClientError::Refused(e)) => return Err(e),
                Err(_) => self.client = None,
            }
        }
        Err("the broker did not answer".into())
    }
}

/// The calls thread: requests in order; an ask is passed to the long-poll
/// thread once everything before it was answered. Requests waiting in a
/// row (a corked batch, or several sent meanwhile) are written at once
/// and their answers read in order. With nothing queued the thread ends
/// (its connection stays open in the slot for the next one).
fn run_calls(mut st: Calls, rx: Receiver<ToCalls>, slot: crate::demand::Slot<Calls>) {
    let done = loop {
        while let Ok(c) = rx.try_recv() {
            flatten(c, &mut st.queue);
        }
        if st.queue.is_empty() {
            match slot.park(st, || rx.is_empty()) {
                None => return,
                Some(s) => {
                    st = s;
                    continue;
                }
            }
        }
        if matches!(st.queue.front(), Some(ToCalls::Stop(_))) {
            match st.queue.pop_front() {
                Some(ToCalls::Stop(done)) => break done,
                _ => continue,
            }
        }
        let Calls { conn, queue, asks } = &mut st;
        conn.calls_once(queue, asks);
    };
    // Stopping: whatever is still queued (a requeue from the inflight
    // guard, typically) gets one try, without waiting out a backoff.
    slot.close();
    while let Ok(c) = rx.try_recv() {
        flatten(c, &mut st.queue);
    }
    for c in std::mem::take(&mut st.queue) {
        if let ToCalls::Tell(req) = c {
            if let Err(e) = st.conn.last_try(&req) {
                log::warn!("{} not sent while stopping: {e}", req.cmd());
            }
        }
    }
    drop(done);
}

/// The broker's refusal in an answer line, if it is one; the answer itself is
/// not needed by anyone who only tells.
fn refusal(req: &Request, line: &str) -> Result<(), ClientError> {
    // The broker writes `ok` first: most answers are read no further.
    if line.starts_with(r#"{"ok":true"#) {
        return Ok(());
    }
    match crate::proto::lines::decode::<serde::de::IgnoredAny>(line, "the broker", req.cmd()) {
        Err(crate::proto::lines::CallError::Refused(e)) => Err(ClientError::Refused(e)),
        _ => Ok(()),
    }
}

/// The message a `recv_next` that did not wait handed out, for the loop;
/// None when it handed out nothing or says a pause.
fn handed_out(line: &str) -> Option<FromPoller> {
    let reply: RecvNextReply = crate::proto::lines::decode(line, "the broker", "recv_next").ok()?;
    if reply.paused.is_some() {
        return None;
    }
    message_of(reply)
}

/// The message a `recv_next` answer handed out, as the loop gets it.
fn message_of(reply: RecvNextReply) -> Option<FromPoller> {
    Some(FromPoller::Message {
        message: reply.message?,
        redelivered: reply.redelivered,
        unread: reply.unread,
        attempts: reply.attempts,
        turn_usd: reply.turn_usd,
        traceparent: reply
            .traceparent
            .as_deref()
            .and_then(|t| crate::proto::cmd::TraceParent::parse(t).ok()),
    })
}

/// A teller whose requests a test reads back instead of a broker.
#[cfg(test)]
pub(crate) fn test_teller() -> (Teller, impl Fn() -> Vec<Request>) {
    let (poller, _, read) = test_poller();
    let read = move || {
        read()
            .into_iter()
            .filter_map(|s| match s {
                Sent::Tell(r) => Some(r),
                Sent::Next | Sent::Peek => None,
            })
            .collect()
    };
    (poller.teller(), read)
}

/// What a test broker was sent: a request, or an ask for the next message.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Sent {
    Tell(Request),
    /// A long-poll `recv_next`.
    Next,
    /// A `recv_next` that does not wait.
    Peek,
}

/// A poller with no threads and no broker: a test sends its events and
/// reads back, in order, what the loop sent (the turn loop's in-memory kit).
#[cfg(test)]
pub(crate) fn test_poller() -> (Poller, Sender<FromPoller>, impl Fn() -> Vec<Sent>) {
    let (tx, rx) = unbounded::<ToCalls>();
    let (ev_tx, ev_rx) = unbounded::<FromPoller>();
    let read = move || {
        let mut queue = VecDeque::new();
        for c in rx.try_iter() {
            flatten(c, &mut queue);
        }
        queue
            .into_iter()
            .filter_map(|c| match c {
                ToCalls::Tell(r) => Some(Sent::Tell(r)),
                ToCalls::Ask(Ask::Next) => Some(Sent::Next),
                ToCalls::Ask(Ask::Peek) => Some(Sent::Peek),
                ToCalls::Batch(_) | ToCalls::Stop(_) => None,
            })
            .collect()
    };
    let poller = Poller {
        teller: Teller {
            tx,
            corked: Arc::new(Mutex::new(None)),
            calls: None,
        },
        events: ev_rx,
        stop: None,
        parked: Vec::new(),
        threads: Vec::new(),
    };
    (poller, ev_tx, read)
}

/// Appends `c` to `queue`, a batch as the requests it holds.
fn flatten(c: ToCalls, queue: &mut VecDeque<ToCalls>) {
    match c {
        ToCalls::Batch(held) => {
            for c in held {
                flatten(c, queue);
            }
        }
        c => queue.push_back(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;

    /// A message with this body, as the broker hands it out.
    const HI: &str = r#"{"ok":true,"message":{"id":8,"from":"bob","to":"ana","body":"hi","kind":"message","in_reply_to":null,"sent_at":1,"transient":false},"redelivered":false,"unread":0,"attempts":1,"turn_usd":0.5}"#;

    /// A broker stand-in on `socket`: it answers every request at once,
    /// except a `recv_next` that may wait (it never answers those), answers
    /// the first `recv_next` that does not wait with `first` (then with
    /// nothing queued), and records each request as (connection number,
    /// line).
    fn fake_broker(
        socket: &std::path::Path,
        first: Option<&'static str>,
    ) -> Arc<Mutex<Vec<(usize, String)>>> {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let listener = UnixListener::bind(socket).unwrap();
        let log = seen.clone();
        let queued = Arc::new(Mutex::new(first));
        std::thread::spawn(move || {
            for (n, conn) in listener.incoming().enumerate() {
                let Ok(conn) = conn else { return };
                let (log, queued) = (log.clone(), queued.clone());
                std::thread::spawn(move || {
                    let mut out = conn.try_clone().unwrap();
                    for line in BufReader::new(conn).lines() {
                        let Ok(line) = line else { return };
                        log.lock().unwrap().push((n, line.clone()));
                        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                        let answer = match v["cmd"].as_str().unwrap() {
                            "recv_next" if v["wait_seconds"].as_u64().unwrap_or(0) > 0 => continue,
                            "recv_next" => match queued.lock().unwrap().take() {
                                Some(line) => line.to_string(),
                                None => r#"{"ok":true,"message":null,"redelivered":false}"#.into(),
                            },
                            "status" if v["wait_seconds"].as_u64().unwrap_or(0) > 0 => continue,
                            "status" => {
                                r#"{"ok":true,"unread":0,"inflight":null,"status_text":""}"#.into()
                            }
                            _ => r#"{"ok":true}"#.into(),
                        };
                        if writeln!(out, "{answer}").is_err() {
                            return;
                        }
                    }
                });
            }
        });
        seen
    }

    fn poller_on(socket: &std::path::Path) -> Poller {
        let bus = Bus::new("ana", "ana", "haiku", 200_000);
        Poller::start(
            Dial::Socket(socket.to_path_buf()),
            30,
            Duration::from_millis(200),
            bus,
        )
    }

    /// The next event of `p` that is not about reachability or the status line.
    fn next_event(p: &Poller) -> FromPoller {
        loop {
            match p.events.recv_timeout(Duration::from_secs(10)) {
                Ok(FromPoller::Online(_) | FromPoller::Status { .. }) => {}
                Ok(ev) => return ev,
                Err(e) => panic!("no event from the poller: {e}"),
            }
        }
    }

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("hive-poller-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The end of a run asks for the next message in the same write as its
    /// ack: a queued message comes back with the ack's answer, and the
    /// long-poll is never asked.
    #[test]
    fn the_next_message_is_asked_for_in_the_same_write_as_the_ack() {
        let d = dir("pipelined");
        let socket = d.join("s.sock");
        let seen = fake_broker(&socket, Some(HI));
        let p = poller_on(&socket);
        {
            let _cork = p.teller().cork();
            p.tell(Request::from(cmd::AckTurn { id: 7, turn: None }));
            p.next();
        }
        assert!(matches!(next_event(&p), FromPoller::TurnUsd(Some(u)) if u == 0.5));
        match next_event(&p) {
            FromPoller::Message {
                message, attempts, ..
            } => {
                assert_eq!((message.id, message.body.as_str(), attempts), (8, "hi", 1));
            }
            ev => panic!("expected the message, got {ev:?}"),
        }
        let seen = seen.lock().unwrap().clone();
        let ack = seen
            .iter()
            .position(|(_, l)| l.contains("ack_turn"))
            .unwrap();
        // The next line on the ack's connection (the status watch's lines,
        // on its own connection, may come in between in `seen`).
        let conn = seen[ack].0;
        let peek = seen[ack + 1..]
            .iter()
            .find(|(c, _)| *c == conn)
            .map(|(_, l)| l)
            .unwrap_or_else(|| panic!("nothing after the ack on its connection: {seen:?}"));
        assert!(
            peek.contains(r#""cmd":"recv_next""#) && peek.contains(r#""wait_seconds":0"#),
            "the ask went on the ack's connection, right behind it: {seen:?}"
        );
        assert!(
            !seen
                .iter()
                .any(|(_, l)| l.contains("recv_next") && !l.contains(r#""wait_seconds":0"#)),
            "the long-poll was asked as well: {seen:?}"
        );
        drop(p);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Only an `ok:false` answer is a refusal; an answer that cannot be read
    /// is not one either (the connection's reader already judged it).
    #[test]
    fn only_an_ok_false_answer_is_a_refusal() {
        let req = Request::from(cmd::AckTurn { id: 7, turn: None });
        assert!(refusal(&req, r#"{"ok":true}"#).is_ok());
        assert!(refusal(&req, r#"{"ok":true,"acked":1}"#).is_ok());
        assert!(refusal(&req, "not json").is_ok());
        match refusal(&req, r#"{"ok":false,"error":"stale id 7"}"#) {
            Err(ClientError::Refused(e)) => assert!(e.contains("stale id 7"), "{e}"),
            r => panic!("expected a refusal, got {r:?}"),
        }
    }

    /// With nothing queued, an answer that cannot be read or a pause, the
    /// ask goes on to the long-poll, which waits (and tells the loop of a
    /// pause); the requests after it still go out.
    #[test]
    fn with_nothing_queued_the_ask_goes_on_to_the_long_poll() {
        let paused = r#"{"ok":true,"message":null,"paused":{"reason":"rate_limit","until":null,"detail":"limit"}}"#;
        for (tag, first) in [
            ("empty", None),
            ("garbage", Some("{not json")),
            ("paused", Some(paused)),
        ] {
            ask_goes_on_to_the_long_poll(tag, first);
        }
    }

    fn ask_goes_on_to_the_long_poll(tag: &str, first: Option<&'static str>) {
        let d = dir(tag);
        let socket = d.join("s.sock");
        let seen = fake_broker(&socket, first);
        let p = poller_on(&socket);
        {
            let _cork = p.teller().cork();
            p.tell(Request::from(cmd::AckTurn { id: 7, turn: None }));
            p.next();
        }
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let polled = seen.lock().unwrap().iter().any(|(_, l)| {
                l.contains(r#""cmd":"recv_next""#) && l.contains(r#""wait_seconds":30"#)
            });
            if polled {
                break;
            }
            assert!(
                Instant::now() < end,
                "the long-poll was not asked: {:?}",
                seen.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            p.events
                .try_iter()
                .all(|ev| !matches!(ev, FromPoller::Message { .. } | FromPoller::Empty)),
            "an empty peek is not an answer to the ask"
        );
        p.tell(Request::from(cmd::AckTurn { id: 9, turn: None }));
        let end = Instant::now() + Duration::from_secs(10);
        while !seen
            .lock()
            .unwrap()
            .iter()
            .any(|(_, l)| l.contains(r#""id":9"#))
        {
            assert!(
                Instant::now() < end,
                "a later request was held up: {:?}",
                seen.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let peeks = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, l)| l.contains(r#""wait_seconds":0"#))
            .count();
        assert_eq!(
            peeks,
            1,
            "an unusable peek is not tried again: {:?}",
            seen.lock().unwrap()
        );
        drop(p);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A broker whose every answer carries an array nested `depth` deep.
    fn deep_broker(socket: &std::path::Path, depth: usize) {
        let listener = UnixListener::bind(socket).unwrap();
        let deep = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let deep = deep.clone();
                std::thread::spawn(move || {
                    let mut out = conn.try_clone().unwrap();
                    for line in BufReader::new(conn).lines() {
                        let Ok(line) = line else { return };
                        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                        let waits = v["wait_seconds"].as_u64().unwrap_or(0) > 0;
                        let answer = match v["cmd"].as_str().unwrap() {
                            "recv_next" | "status" if waits => continue,
                            "recv_next" => format!(
                                r#"{{"ok":true,"message":null,"redelivered":false,"deep":{deep}}}"#
                            ),
                            "status" => format!(
                                r#"{{"ok":true,"unread":3,"inflight":null,"status_text":"","deep":{deep}}}"#
                            ),
                            _ => format!(r#"{{"ok":false,"error":"no","deep":{deep}}}"#),
                        };
                        if writeln!(out, "{answer}").is_err() {
                            return;
                        }
                    }
                });
            }
        });
    }

    /// The three threads parse the broker's answers on their small stacks
    /// ([`STACK`]): answers nested to serde_json's recursion limit are read
    /// (the long-poll thread's, the status watch's, the calls thread's
    /// refusal), and nothing crashes.
    #[test]
    fn answers_nested_to_the_parsers_limit_are_read_on_the_small_stacks() {
        let d = dir("deep");
        let socket = d.join("agent.sock");
        // With the object around it, 126 arrays nest 127 deep: the deepest
        // serde_json reads (one more is refused, an answer it cannot use).
        deep_broker(&socket, 126);
        let p = poller_on(&socket);
        p.tell(Request::from(cmd::ReportState { paused: None }));
        p.peek();
        // The peek's answer and the watch's first answer, in either order.
        let (mut empty, mut status) = (false, None);
        while !empty || status.is_none() {
            match p.events.recv_timeout(Duration::from_secs(10)) {
                Ok(FromPoller::Empty) => empty = true,
                Ok(FromPoller::Status { unread, .. }) => status = Some(unread),
                Ok(FromPoller::Online(false)) => panic!("an answer could not be read"),
                Ok(_) => {}
                Err(e) => panic!("no answer from the poller: {e}"),
            }
        }
        assert_eq!(status, Some(3));
        // Still alive after the calls thread read its deep refusal.
        p.peek();
        assert!(matches!(next_event(&p), FromPoller::TurnUsd(None)));
        assert!(matches!(next_event(&p), FromPoller::Empty));
        drop(p);
        let _ = std::fs::remove_dir_all(&d);
    }
}
