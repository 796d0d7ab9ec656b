//! The hub: the broker's state and its rules — the sqlite store, the config,
//! the long-poll waiters, rows held by `recv` connections, transient wakes and
//! the timers. It lives on one thread, whose loop (`sockets.rs`) reads the
//! requests off the connections and hands each to [`Hub::handle`], which
//! answers with an [`Outcome`]; the other threads (the supervisor, offloaded
//! jobs, `main`) reach it with a [`HubMsg`] through a [`HubTx`], which wakes
//! that loop. Every request passes one gate here, in this order: its row of
//! the privilege table (`proto::command`, checked with [`Access::admits`] on
//! the socket it came in on), its own validation (`Command::validate`), then
//! its handler, one per command, in the file of its concern:
//!
//! - `inbox.rs`: delivery and consumption (`wake`, `send`, `recv_next`, `recv`,
//!   the operator's inbox, …), attempts and dead letters (`requeue_inflight`,
//!   `dead_letter`, `failed`, `retry`) and the harness's reported pause;
//! - `questions.rs`: `ask`, `answer` and the operator's questions;
//! - `timers.rs`: reminders and scheduled prompts, and firing them;
//! - `agents.rs`: what the hub keeps per agent (status, counters, meta,
//!   loose ends, running bash tasks);
//! - `lifecycle.rs`: the lifecycle tools, carried out by the supervisor, and
//!   the operator's `reload`, `update_all` and `forget_agent`;
//! - `approvals.rs`: approvals and permissions;
//! - `diagnostics.rs`: logs and the host journal;
//! - `history.rs`: the operator's search of the agents' histories (`hive up`'s
//!   supervisor asks their pages).
//! - `bridge.rs`: the swarm — mail and questions to and from other hives
//!   through the Matrix bridge's outbox and inbox, and the bridge's state;
//! - `pools.rs`, `budgets.rs`: credential pools, usage limits and budgets;
//! - `pauses.rs`: why the broker hands an agent nothing now, all reasons in
//!   one place (a pool's park, a budget, the harness's reported pause);
//! - `resume.rs`: the operator's lifting of a pause, per reason;
//! - `receipts.rs`: `message_state`, what became of a message a sender sent;
//! - `counts.rs`: `message_counts`, the rows per recipient and state (metrics);
//! - `offload.rs`: the work jobs do off the hub (the supervisor, files,
//!   `journalctl`);
//! - `quotas.rs`: what each agent may have stored, and store in a minute;
//! - `throttle.rs`: log lines about one agent's reports, one a minute per kind;
//! - `notify.rs`: the notification events the hub writes itself (a
//!   crash, a test) and `notify_status`;
//! - `slots.rs`: the hive-wide limit on `claude` processes at once
//!   (`max_claude`): a turn waits in line for a slot.
//!
//! The hub never blocks on another actor or on slow I/O: such work is an
//! [`Outcome::Offload`] run on a thread of its own, which reports once
//! ([`HubMsg::Finished`]): its answer, or what it did for the hub to apply
//! and answer from ([`Finish::Apply`]). A long-poll that finds nothing is
//! parked: the hub remembers which connection waits for what, and lists it in
//! [`Hub::take_woken`] when something arrives, for the loop to ask again.
//! Answers are typed: a handler returns its command's `Reply`, serialized here
//! once.

mod agents;
mod approvals;
mod bridge;
mod budgets;
mod counts;
mod diagnostics;
mod history;
mod inbox;
mod lifecycle;
mod limits;
mod notify;
mod offload;
mod pauses;
mod pools;
mod questions;
mod quotas;
mod receipts;
mod resume;
mod slots;
mod throttle;
mod timers;

pub use budgets::window as budget_window;

#[cfg(test)]
mod tests;

use super::db::Store;
use super::lifecycle::{LifecycleCmd, LogTail};
use crate::config::HiveConfig;
use crate::proto::access::{Access, Caller, Gate, Via};
use crate::proto::cmd::RequestApplyCommit;
use crate::proto::command::Row;
use crate::proto::lines::{err_line, ok_line};
use crate::proto::text::excerpt;
use crate::proto::{Command, Message, Request};
use crossbeam_channel::Sender;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use crate::config::fleetfile::merge_patch;

/// Who is on the other end of a connection: decided by the socket it came in on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    Operator,
    Agent(String),
    /// The Matrix bridge, on `RUN/bridge.sock`.
    Bridge,
}

impl Identity {
    pub fn name(&self) -> &str {
        match self {
            Identity::Operator => "operator",
            Identity::Agent(a) => a,
            Identity::Bridge => "bridge",
        }
    }
}

pub type ConnId = u64;

/// What the other threads tell the hub: the supervisor's events, offloaded
/// jobs' results, `main`'s stop. Sent through a [`HubTx`].
pub enum HubMsg {
    /// An offloaded job finished: its one report, for connection `conn`.
    Finished { conn: ConnId, finish: Finish },
    /// What the fleet told the hub (`broker::lifecycle`'s inbound half).
    FromFleet(Box<crate::broker::lifecycle::FleetEvent>),
    /// The prune thread deleted a batch of messages: the agents' stored
    /// bytes are read again (`quotas.rs`).
    Pruned,
    /// The broker is stopping: return and close the store.
    Shutdown,
}

/// The sending side of the hub's channel: a [`HubMsg`] is queued, then the
/// hub's loop is woken (one byte on a socket pair, written only when no wake
/// is pending, so a burst of messages costs one).
#[derive(Clone)]
pub struct HubTx {
    tx: Sender<HubMsg>,
    wake: Arc<Wake>,
}

/// The write end of the hub loop's wake-up, and whether a wake is pending.
pub struct Wake {
    pending: AtomicBool,
    fd: std::os::unix::net::UnixStream,
}

/// The hub's side of a [`HubTx`]: the messages, and the socket that is
/// readable while a wake is pending.
pub struct HubRx {
    pub rx: crossbeam_channel::Receiver<HubMsg>,
    pub wake: Arc<Wake>,
    pub readable: std::os::unix::net::UnixStream,
}

/// The hub is gone (the broker stopped).
#[derive(Debug)]
pub struct HubGone;

/// A new hub channel: its sender and the loop's side.
pub fn channel() -> std::io::Result<(HubTx, HubRx)> {
    let (readable, fd) = std::os::unix::net::UnixStream::pair()?;
    readable.set_nonblocking(true)?;
    fd.set_nonblocking(true)?;
    let (tx, rx) = crossbeam_channel::unbounded();
    let wake = Arc::new(Wake {
        pending: AtomicBool::new(false),
        fd,
    });
    Ok((
        HubTx {
            tx,
            wake: wake.clone(),
        },
        HubRx { rx, wake, readable },
    ))
}

impl HubTx {
    /// Queues `msg` and wakes the hub's loop.
    pub fn send(&self, msg: HubMsg) -> Result<(), HubGone> {
        self.tx.send(msg).map_err(|_| HubGone)?;
        if !self.wake.pending.swap(true, Ordering::AcqRel) {
            // A full socket means a wake is pending already.
            let _ = std::io::Write::write(&mut &self.wake.fd, &[1]);
        }
        Ok(())
    }
}

impl HubRx {
    /// Takes the pending wake, before the messages are read: first the
    /// bytes out of the socket, then the flag, so a byte in the socket and a
    /// raised flag always go together. (The other order could drain the byte
    /// of a message sent in between and leave the flag raised with no byte:
    /// every later sender would see a wake pending that never comes.) A
    /// message sent after this wakes the loop again.
    pub fn clear(&self) {
        let mut buf = [0u8; 64];
        while matches!(std::io::Read::read(&mut &self.readable, &mut buf), Ok(n) if n > 0) {}
        self.wake.pending.swap(false, Ordering::AcqRel);
    }
}

/// Work the hub has authorised but that would block it (asking the supervisor,
/// running a command, reading a file): a thread of its own runs it and
/// reports once, with a [`HubMsg::Finished`] (cargo's `job_queue` workers
/// send one `Message::Finish`): the answer for the caller, or what the hub
/// applies before it answers.
pub type Job = Box<dyn FnOnce() -> Finish + Send>;

/// The one report of a [`Job`].
pub enum Finish {
    /// The answer line for the caller: the job changed nothing of the hub's.
    Answer(String),
    /// What the job did, for the hub to apply (record a decision, bind a
    /// socket, keep an agent stopped) and answer the caller from.
    Apply {
        who: Identity,
        followup: Box<Followup>,
    },
}

/// The typed form of a job whose answer is its own, as a handler returns it.
pub type Work<R> = Box<dyn FnOnce() -> Result<R, String> + Send>;

/// A job whose result the hub applies ([`Finish::Apply`]); `Err` is the
/// caller's answer as it is (the job could not do its part).
pub type Then = Box<dyn FnOnce() -> Result<Followup, String> + Send>;

/// What an offloaded job hands back to the hub.
pub enum Followup {
    /// `request_apply_commit` with the patch read from the caller's file.
    ApplyCommit {
        agent: String,
        patch: serde_json::Value,
    },
    /// An approval was carried out: `Ok` with the text for the operator, or
    /// `Err` when nothing was changed (it stays pending). An `apply_commit`
    /// brings its patch, which the hub's rules follow now; a spawn its
    /// entry, in the fleet file now (under `hive up` the supervisor has
    /// already told the hub, which gave the agent its socket before it
    /// started; under plain `hive broker` the hub does that here).
    Approved {
        id: i64,
        result: Result<String, String>,
        patch: Option<(String, serde_json::Value)>,
        spawned: Option<Box<crate::config::AgentConfig>>,
    },
    /// `set_permissions` was carried out (`Err`: nothing was changed); the
    /// hub's rules follow the patch.
    Permissions {
        agent: String,
        patch: serde_json::Value,
        result: Result<String, String>,
    },
    /// `set_budget` was carried out (issue 16; `Err`: nothing was changed):
    /// an agent's entry (`agent`, `patch`) or the hive's budget (`hive`).
    Budget {
        agent: Option<String>,
        patch: serde_json::Value,
        hive: Option<Option<crate::proto::Budget>>,
        result: Result<String, String>,
    },
    /// A lifecycle command was carried out by the supervisor: the hub keeps an
    /// agent stopped across restarts (`stopped: Some(true)`) or no longer
    /// (`Some(false)`).
    Lifecycle {
        agent: String,
        stopped: Option<bool>,
        result: Result<String, String>,
    },
}

/// The hub's answer to a call.
pub enum Outcome {
    Answer(String),
    /// Nothing yet: the connection is parked, and listed by
    /// [`Hub::take_woken`] when something arrives for it.
    Wait,
    /// Authorised; a thread of its own computes the answer.
    Offload(Job),
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Answer(line) => f.debug_tuple("Answer").field(line).finish(),
            Outcome::Wait => f.write_str("Wait"),
            Outcome::Offload(_) => f.write_str("Offload(..)"),
        }
    }
}

/// What a handler decided.
enum Done<R> {
    Reply(R),
    /// Park the caller (long-polls).
    Wait,
    /// A job answers the caller itself.
    Offload(Work<R>),
    /// A job reports what it did; the hub applies it for `who` and answers.
    Then(Identity, Then),
}

type Handled<R> = Result<Done<R>, String>;

/// The one who sent the request being handled.
struct Ctx<'a> {
    who: &'a Identity,
    conn: ConnId,
    can_wait: bool,
    /// How the connection came (`Via::Harness` is the harness's credential).
    via: Via,
}

/// Settings the hub needs besides the store and config.
pub struct HubSettings {
    pub state_dir: PathBuf,
    pub hyperhive_rev: String,
    /// Pending reminders, and separately scheduled prompts, per agent.
    pub max_pending_timers: u64,
    /// The supervisor of `hive up`; `None` under plain `hive broker`.
    pub lifecycle: Option<Sender<LifecycleCmd>>,
    /// How long a lifecycle call waits for the supervisor.
    pub supervisor_timeout: Duration,
    /// The fleet file that approved changes are written to.
    pub config_path: Option<PathBuf>,
    /// The agents' supervised logs (`hive up` only).
    pub logs: Option<Arc<dyn LogTail>>,
    /// Where the socket of an agent spawned at run time is bound (`None`:
    /// nowhere, in the hub's tests).
    pub run_dir: Option<PathBuf>,
    /// Nudges the notification sender after the hub wrote an event itself
    /// (`notify.rs`), and hands it a reloaded `notify` block; `None` in the
    /// hub's unit tests.
    pub notify: Option<crate::broker::notify::Control>,
    /// `hive up`'s span exporter (issue 43): `export_spans` hands it the
    /// harnesses' spans. None: this broker exports nothing.
    pub spans: Option<crate::telemetry::Exporter>,
}

#[cfg(test)]
impl HubSettings {
    /// The settings of a hub in the unit tests: its store's dir, no
    /// supervisor, no fleet file, no logs, no sockets bound at run time.
    pub(crate) fn for_tests(state_dir: &std::path::Path) -> HubSettings {
        HubSettings {
            state_dir: state_dir.to_path_buf(),
            hyperhive_rev: "test-rev".into(),
            max_pending_timers: 3,
            lifecycle: None,
            supervisor_timeout: Duration::from_secs(10),
            config_path: None,
            logs: None,
            run_dir: None,
            notify: None,
            spans: None,
        }
    }
}

/// A socket the hub bound at run time (an approved spawn's), for its loop to
/// serve.
pub struct NewSocket {
    pub listener: UnixListener,
    pub who: Identity,
    pub path: PathBuf,
}

/// A credential's control socket, for the loop to serve: every descriptor
/// that comes over it is a connection of `agent`'s process `via` names.
pub struct NewCredential {
    pub agent: String,
    pub via: Via,
    pub control: std::os::unix::net::UnixStream,
}

/// A row handed out by `recv` and not yet confirmed.
enum Held {
    Stored(i64),
    Transient(Message),
}

pub struct Hub<'c> {
    db: Store<'c>,
    cfg: HiveConfig,
    settings: HubSettings,
    /// The parked connections, by what they wait for (an agent's name,
    /// `operator`, the bridge's key).
    waiters: BTreeMap<String, Vec<ConnId>>,
    /// What each parked connection waits for.
    parked: BTreeMap<ConnId, String>,
    /// Parked connections something arrived for, until the loop takes them.
    woken: Vec<ConnId>,
    /// Sockets bound at run time, until the loop takes them.
    new_sockets: Vec<NewSocket>,
    /// Credentials handed out since the loop last looked, until it takes them.
    new_credentials: Vec<NewCredential>,
    /// Connections a credential made, and whose (the harness's or the bash
    /// daemon's); every other agent connection came in on its socket.
    channels: BTreeMap<ConnId, Via>,
    /// Agents whose processes `hive up` started with credentials: the
    /// harness's rows (`Via::Harness`) and the bash daemon's are refused on
    /// their sockets. Everyone else's harness reports on its socket.
    credentialed: BTreeMap<String, BTreeSet<Via>>,
    /// Agents whose socket carried a refused report of a credentialed
    /// process since it was last started: the operator was told once.
    told_old: BTreeSet<String>,
    held: BTreeMap<ConnId, (String, Vec<Held>)>,
    transient: BTreeMap<String, VecDeque<Message>>,
    transient_inflight: BTreeMap<String, Message>,
    /// Hand-outs of transient wakes that counted, by id (stored rows keep
    /// theirs in the store).
    transient_attempts: BTreeMap<i64, u32>,
    /// The `traceparent` a transient wake carries (issue 43), by id, until
    /// it is acked, drained and confirmed, or dead-lettered (stored rows
    /// keep theirs in the store).
    transient_traces: BTreeMap<i64, String>,
    next_transient_id: i64,
    harness_conns: BTreeMap<String, BTreeSet<ConnId>>,
    /// Each harness's pause as it last reported it (`report_state`), while it
    /// is connected.
    paused: BTreeMap<String, crate::proto::Paused>,
    /// Agents whose harness last reported the login park; unlike `paused`,
    /// kept when the harness disconnects (its next one reports at connect).
    needs_login: BTreeSet<String>,
    /// When the next reminder, scheduled prompt or question expiry is due
    /// (unix s), kept in memory so the hub's loop costs no query per request.
    next_due: Option<i64>,
    /// Approvals being carried out (waiting for the supervisor).
    deciding: BTreeSet<i64>,
    /// Agents whose fleet entry a change is being written to (an approval, a
    /// permissions save): one at a time each.
    changing: BTreeSet<String>,
    /// The Matrix bridge's link as it last reported it, and its connections.
    bridge: bridge::BridgeLink,
    /// Credential pools and their usage-limit pauses (`pools.rs`).
    pools: pools::Pools,
    /// Log lines about agents' reports, counted per agent and kind.
    throttle: throttle::Throttle,
    /// The operator's resumes of harnesses' own pauses (`resume.rs`).
    resumes: resume::Resumes,
    /// The process at the other end of agent connections, where a request
    /// needed it ([`wants_peer`]).
    peers: BTreeMap<ConnId, u32>,
    /// What each agent stored, against its quotas (`quotas.rs`).
    quotas: quotas::Quotas,
    /// Agents the broker knows (a row, or mail) that the fleet file no
    /// longer names (`lifecycle.rs`): refused as recipients, their mail kept
    /// until `forget_agent`.
    removed: BTreeSet<String>,
    /// Agents with a socket the loop serves: the fleet's at start, and every
    /// one bound since (an approved spawn, an agent `hive reload` added).
    bound: BTreeSet<String>,
    /// Agents whose harness holds a message (a turn runs), as last told to
    /// the supervisor (`LifecycleCmd::Activity`).
    busy: BTreeSet<String>,
    /// Claude slots, held and waited for (`slots.rs`).
    slots: slots::Slots,
}

fn db_err(e: rusqlite::Error) -> String {
    format!("message store error: {e}")
}

/// How long until `due` (unix s), from now.
fn until(due: i64) -> Duration {
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    Duration::from_millis((due * 1000 - now_ms).max(0) as u64)
}

/// A duration as a person reads it in an error: `10 s`, `250 ms`.
fn fmt_wait(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

impl<'c> Hub<'c> {
    pub fn new(db: Store<'c>, cfg: HiveConfig, settings: HubSettings) -> Hub<'c> {
        // Read once; each charged row moves it from then on.
        let stored = db.stored_bytes().unwrap_or_else(|e| {
            log::error!("cannot read the agents' stored bytes: {e}; they count from zero");
            Default::default()
        });
        let bound = cfg.agents.iter().map(|a| a.name.clone()).collect();
        Hub {
            db,
            cfg,
            settings,
            waiters: BTreeMap::new(),
            parked: BTreeMap::new(),
            woken: Vec::new(),
            new_sockets: Vec::new(),
            new_credentials: Vec::new(),
            channels: BTreeMap::new(),
            credentialed: BTreeMap::new(),
            told_old: BTreeSet::new(),
            held: BTreeMap::new(),
            transient: BTreeMap::new(),
            transient_inflight: BTreeMap::new(),
            transient_attempts: BTreeMap::new(),
            transient_traces: BTreeMap::new(),
            next_transient_id: -1,
            harness_conns: BTreeMap::new(),
            paused: BTreeMap::new(),
            needs_login: BTreeSet::new(),
            next_due: None,
            deciding: BTreeSet::new(),
            changing: BTreeSet::new(),
            bridge: bridge::BridgeLink::default(),
            pools: pools::Pools::default(),
            throttle: throttle::Throttle::default(),
            resumes: resume::Resumes::default(),
            peers: BTreeMap::new(),
            quotas: quotas::Quotas::new(stored),
            removed: BTreeSet::new(),
            bound,
            busy: BTreeSet::new(),
            slots: slots::Slots::default(),
        }
    }

    /// Fires what fell due while the broker was down; the loop calls it once
    /// before serving.
    pub fn begin(&mut self) {
        self.find_removed();
        self.fire_due();
        self.fire_pauses();
    }

    /// Handles one message from another thread; false for
    /// [`HubMsg::Shutdown`]. ([`HubMsg::Finished`] is the loop's, which
    /// has the hub apply it ([`Hub::finish`]) and answers the connection.)
    pub fn on_msg(&mut self, msg: HubMsg) -> bool {
        match msg {
            HubMsg::Finished { conn, finish } => {
                log::error!("connection {conn}: an offloaded job's report reached the hub itself");
                self.finish(finish);
            }
            HubMsg::FromFleet(e) => self.on_fleet(*e),
            HubMsg::Pruned => self.pruned(),
            HubMsg::Shutdown => return false,
        }
        true
    }

    /// Applies what the fleet told the hub.
    fn on_fleet(&mut self, e: crate::broker::lifecycle::FleetEvent) {
        use crate::broker::lifecycle::FleetEvent;
        match e {
            FleetEvent::System { to, kind, body } => {
                if let Err(e) = self.deliver(&crate::proto::Peer::System, &to, &body, kind, None) {
                    log::error!("cannot deliver a system event to {to}: {e}");
                }
            }
            FleetEvent::Crashed { agent, detail } => self.agent_crashed(&agent, &detail),
            FleetEvent::ApplyAgent(a) => self.apply_agent(a),
            FleetEvent::Reloaded(cfg) => {
                // `max_claude` applies live (`slots.rs`).
                let max_claude = cfg.validate().is_ok().then_some(cfg.max_claude);
                self.set_fleet(*cfg);
                if let Some(max) = max_claude {
                    self.cfg.max_claude = max;
                    self.slots_resized();
                }
            }
            FleetEvent::Notify(r) => self.notify_reloaded(*r),
            FleetEvent::HiveBudget(b) => {
                if self.cfg.budget != b {
                    self.cfg.budget = b;
                    self.wake_all();
                }
            }
            FleetEvent::Credential {
                agent,
                via,
                control,
            } => {
                self.told_old.remove(&agent);
                self.credentialed
                    .entry(agent.clone())
                    .or_default()
                    .insert(via);
                self.new_credentials.push(NewCredential {
                    agent,
                    via,
                    control,
                });
            }
        }
    }

    /// Fires the timers and ends the pauses that are due.
    pub fn tick(&mut self) {
        let now = crate::proto::now();
        if self.next_due.is_some_and(|t| t <= now) {
            self.fire_due();
        }
        if self.next_pause_deadline().is_some_and(|t| t <= now) {
            self.fire_pauses();
        }
        if self.throttle.due().is_some_and(|t| t <= now) {
            self.throttle.flush(now);
        }
    }

    /// How long until the hub's next deadline, if it has one.
    pub fn next_deadline(&mut self) -> Option<Duration> {
        self.next_wake().map(until)
    }

    /// The process that connected agent connection `conn` (`SO_PEERCRED`),
    /// told by the loop before a request [`wants_peer`] is handled.
    pub fn peer(&mut self, conn: ConnId, pid: u32) {
        self.peers.insert(conn, pid);
    }

    /// Connection `conn` was made through the credential of `via`'s process
    /// (the loop tells it before the connection's first request).
    pub fn adopted(&mut self, conn: ConnId, via: Via) {
        self.channels.insert(conn, via);
    }

    /// How an agent's connection `conn` came: its credential's, or the
    /// socket, shared with the harness only where no credential was handed
    /// out for that process.
    fn via(&self, who: &Identity, conn: ConnId, access: Access) -> Via {
        if let Some(v) = self.channels.get(&conn) {
            return *v;
        }
        let Identity::Agent(a) = who else {
            return Via::Socket;
        };
        let holder = match access {
            Access::BashDaemon => Via::BashDaemon,
            _ => Via::Harness,
        };
        match self.credentialed.get(a) {
            Some(set) if set.contains(&holder) => Via::Socket,
            _ => Via::Shared,
        }
    }

    /// Connection `conn` is gone: release what it held and stop waiting for it.
    pub fn closed(&mut self, conn: ConnId) {
        self.peers.remove(&conn);
        self.channels.remove(&conn);
        self.resumes.closed(conn);
        self.unpark(conn);
        self.release(conn);
        self.bridge_closed(conn);
    }

    /// The parked connections something arrived for since the last call.
    pub fn take_woken(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.woken)
    }

    /// The sockets bound since the last call.
    pub fn take_sockets(&mut self) -> Vec<NewSocket> {
        std::mem::take(&mut self.new_sockets)
    }

    /// The credentials handed out since the last call.
    pub fn take_credentials(&mut self) -> Vec<NewCredential> {
        std::mem::take(&mut self.new_credentials)
    }

    /// The hub's next deadline: a timer (`timers.rs`), a pause's end
    /// (`pools.rs`) or a count of throttled log lines (`throttle.rs`).
    fn next_wake(&mut self) -> Option<i64> {
        [
            self.next_due,
            self.next_pause_deadline(),
            self.throttle.due(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Logs a line about what `agent` reported, at most one of `kind` a
    /// minute (the rest are counted: `throttle.rs`).
    fn throttled(&mut self, level: log::Level, agent: &str, kind: throttle::Kind, text: String) {
        self.throttle
            .log(crate::proto::now(), level, agent, kind, text);
    }

    /// Decides one request: the gate, the command's own rules, its handler.
    /// `can_wait` is false once the caller's wait has run out: answer now,
    /// even if empty. A connection asking again is no longer parked.
    pub fn handle(
        &mut self,
        who: &Identity,
        conn: ConnId,
        req: Request,
        can_wait: bool,
    ) -> Outcome {
        if !self.parked.is_empty() {
            self.unpark(conn);
        }
        let cmd = req.cmd();
        let access = req.access();
        let via = self.via(who, conn, access);
        if let Err(e) = self.admit(who, via, cmd, access) {
            if via == Via::Socket && matches!(access, Access::Harness | Access::BashDaemon) {
                self.old_reporter(who.name(), access, cmd);
            }
            return Outcome::Answer(err_line(&e));
        }
        if let Err(e) = req.validate() {
            return Outcome::Answer(err_line(&format!("{cmd}: {e}")));
        }
        let ctx = Ctx {
            who,
            conn,
            can_wait,
            via,
        };
        let out = self.dispatch(&ctx, req);
        if let (Identity::Agent(a), Access::Harness) = (who, access) {
            self.tell_activity(a, cmd);
        }
        out
    }

    /// A report of `agent`'s harness (or bash daemon) came in on its socket
    /// though that process has a credential: an old binary that does not
    /// take it, or another process of the agent posing as it. Refused; the
    /// operator is told once per start, naming the agent.
    fn old_reporter(&mut self, agent: &str, access: Access, cmd: &str) {
        if !self.told_old.insert(agent.to_string()) {
            return;
        }
        let whose = match access {
            Access::BashDaemon => "bash-task daemon",
            _ => "harness",
        };
        let body = format!(
            "{agent}'s {whose} sent {cmd} on {agent}'s socket, though hive up gave it a \
             connection of its own; it was refused (and so is every such report until it \
             restarts). Either {agent} runs an old {whose} that does not take its credential \
             (`hive restart {agent}` runs the current binary), or another process of the agent \
             posed as it."
        );
        log::warn!("{body}");
        if let Err(e) = self.deliver(
            &crate::proto::Peer::System,
            "operator",
            &body,
            crate::proto::MsgKind::NeedsUpdate,
            None,
        ) {
            log::error!("cannot tell the operator about {agent}'s {whose}: {e}");
        }
    }

    /// The privilege gate: `access` (a row of the table) for this caller, with
    /// the groups and capabilities its fleet entry grants.
    fn admit(&self, who: &Identity, via: Via, cmd: &str, access: Access) -> Result<(), String> {
        match who {
            Identity::Operator => access.admits(cmd, Caller::Operator),
            Identity::Bridge => access.admits(cmd, Caller::Bridge),
            // What every agent may send (`wake`, `status`) needs no look at
            // its grants.
            Identity::Agent(_) if access.gate() == Some(Gate::Open) => Ok(()),
            Identity::Agent(a) => {
                let entry = self.cfg.agent(a);
                let groups = entry.map(|e| e.groups()).unwrap_or_default();
                let capabilities = entry.map(|e| e.capabilities.clone()).unwrap_or_default();
                access.admits(
                    cmd,
                    Caller::Agent {
                        name: a,
                        groups: &groups,
                        capabilities: &capabilities,
                        via,
                    },
                )
            }
        }
    }

    /// One arm per command; the gate has run. Handlers of agent-only commands
    /// take the caller's name, of operator-only commands nothing, of commands
    /// either side sends the identity.
    fn dispatch(&mut self, ctx: &Ctx, req: Request) -> Outcome {
        let agent = match ctx.who {
            Identity::Agent(a) => a.as_str(),
            Identity::Operator => "",
            Identity::Bridge => {
                self.bridge_seen(ctx.conn);
                ""
            }
        };
        match req {
            // inbox.rs
            Request::Wake(c) => self.now(c, |h, c| h.wake(ctx, c)),
            Request::Send(c) => self.now(c, |h, c| h.send(ctx.who, c)),
            Request::SendToParent(c) => self.now(c, |h, c| h.send_to_parent(ctx, agent, c)),
            Request::RecvNext(c) => self.done(c, |h, c| h.recv_next(ctx, agent, c)),
            Request::Recv(c) => self.done(c, |h, c| h.recv(ctx, agent, c)),
            Request::RecvAck(c) => self.now(c, |h, c| h.recv_ack(ctx.conn, agent, c)),
            Request::Status(c) => self.done(c, |h, c| h.status(ctx, agent, c)),
            Request::AckTurn(c) => self.now(c, |h, c| h.ack_turn(agent, c.id, c.turn)),
            Request::MessageState(c) => self.now(c, |h, c| h.message_state(ctx.who, c)),
            Request::RequeueInflight(c) => self.now(c, |h, c| h.requeue_inflight(agent, c)),
            Request::DeadLetter(c) => self.now(c, |h, c| h.dead_letter(agent, c)),
            Request::ReportState(c) => self.now(c, |h, c| h.report_state(ctx.conn, agent, c)),
            Request::Failed(c) => self.now(c, |h, c| h.failed(c)),
            Request::Activity(c) => self.now(c, |h, c| {
                h.db.activity(c.limit())
                    .map(|events| crate::proto::cmd::ActivityReply { events })
                    .map_err(db_err)
            }),
            // counts.rs (issue 43)
            Request::MessageCounts(c) => self.now(c, |h, _| h.message_counts()),
            Request::Retry(c) => self.now(c, |h, c| h.retry(c)),
            Request::Inbox(c) => self.done(c, |h, c| h.operator_inbox(ctx, c)),
            Request::InboxAck(c) => self.now(c, |h, c| h.inbox_ack(c)),
            // questions.rs
            Request::Ask(c) => self.now(c, |h, c| h.ask(agent, c)),
            Request::Answer(c) => self.now(c, |h, c| h.answer_question(ctx.who, c)),
            Request::Questions(c) => self.now(c, |h, _| h.questions()),
            Request::CancelQuestion(c) => self.now(c, |h, c| h.cancel_question_as_operator(c)),
            // timers.rs
            Request::Remind(c) => self.now(c, |h, c| h.remind(agent, c)),
            Request::SchedulePrompt(c) => self.now(c, |h, c| h.schedule_prompt(agent, c)),
            Request::ListScheduled(c) => self.now(c, |h, _| h.list_scheduled(agent)),
            Request::CancelScheduled(c) => self.now(c, |h, c| h.cancel_scheduled(agent, c)),
            Request::Timers(c) => self.now(c, |h, c| h.timers(c)),
            Request::CancelTimer(c) => self.now(c, |h, c| h.cancel_timer(c)),
            // notify.rs (issue 43)
            Request::NotifyTest(c) => self.now(c, |h, _| h.notify_test()),
            Request::NotifyStatus(c) => self.now(c, |h, _| h.notify_status()),
            // agents.rs
            Request::Hello(c) => self.now(c, |h, c| h.hello(ctx.who, c)),
            Request::HarnessStarted(c) => self.now(c, |h, c| h.harness_started(ctx.conn, agent, c)),
            Request::PostTurnCounts(c) => self.now(c, |h, c| h.post_turn_counts(agent, c)),
            Request::ModelOverride(c) => self.now(c, |h, c| h.model_override(agent, c)),
            Request::SetStatus(c) => self.now(c, |h, c| h.set_status(agent, c)),
            Request::GetAgentMeta(c) => self.now(c, |h, c| h.meta(ctx.who, c)),
            Request::Agents(c) => self.now(c, |h, _| h.agents()),
            Request::Version(c) => self.now(c, |h, _| h.version()),
            Request::GetLooseEnds(c) => self.now(c, |h, c| h.loose_ends(agent, c)),
            Request::CancelLooseEnd(c) => self.now(c, |h, c| h.cancel_loose_end(agent, c)),
            Request::ReportTasks(c) => self.now(c, |h, c| h.report_tasks(agent, c)),
            Request::ExportSpans(c) => self.now(c, |h, c| {
                // Queued for `hive up`'s exporter thread; never waits.
                let exporting = h.settings.spans.is_some();
                if let Some(x) = &h.settings.spans {
                    x.offer(c.spans);
                }
                Ok(crate::proto::cmd::ExportSpansReply {
                    exporting,
                    dropped: crate::telemetry::exporter::dropped_total(),
                })
            }),
            // pools.rs (issue 16)
            Request::ReportPool(c) => self.now(c, |h, c| h.report_pool(agent, c)),
            Request::ReportUsageLimit(c) => self.now(c, |h, c| h.report_usage_limit(agent, c)),
            // budgets.rs (issue 16)
            Request::ReportSpend(c) => self.now(c, |h, c| h.report_spend(agent, c)),
            Request::GetBudget(c) => self.now(c, |h, _| h.get_budget()),
            Request::OwnBudget(c) => self.now(c, |h, _| h.own_budget(agent)),
            Request::SetBudget(c) => self.done(c, |h, c| h.set_budget(c)),
            Request::VoidSpend(c) => self.now(c, |h, c| h.void_spend(c)),
            // resume.rs (issue 40)
            Request::Resume(c) => self.now(c, |h, c| h.resume(c)),
            // lifecycle.rs
            Request::RequestSpawn(c) => self.now(c, |h, c| h.request_spawn(agent, c)),
            Request::Kill(c) => self.done(c, |h, c| h.kill(agent, c)),
            Request::Start(c) => self.done(c, |h, c| h.start(agent, c)),
            Request::Restart(c) => self.done(c, |h, c| h.restart(agent, c)),
            Request::Update(c) => self.done(c, |h, c| h.update(agent, c)),
            Request::Supervision(c) => self.done(c, |h, _| h.supervision()),
            Request::StartAgent(c) => self.done(c, |h, c| h.operator_start(c)),
            Request::StopAgent(c) => self.done(c, |h, c| h.operator_stop(c)),
            Request::RestartAgent(c) => self.done(c, |h, c| h.operator_restart(c)),
            Request::UpdateAgent(c) => self.done(c, |h, c| h.operator_update(c)),
            Request::Reload(c) => self.done(c, |h, _| h.reload()),
            Request::UpdateAll(c) => self.done(c, |h, c| h.update_all(c)),
            Request::ForgetAgent(c) => self.now(c, |h, c| h.forget(c)),
            // approvals.rs
            Request::RequestApplyCommit(c) => self.done(c, |h, c| h.request_apply_commit(agent, c)),
            Request::Approvals(c) => self.now(c, |h, _| h.approvals()),
            Request::Approve(c) => self.done(c, |h, c| h.approve(c)),
            Request::Deny(c) => self.now(c, |h, c| h.deny_as_operator(c)),
            Request::SetPermissions(c) => self.done(c, |h, c| h.set_permissions(c)),
            // diagnostics.rs
            Request::GetLogs(c) => self.done(c, |h, c| h.get_logs(agent, c)),
            Request::GetHostJournal(c) => self.done(c, |h, c| h.host_journal(c)),
            // history.rs
            Request::Search(c) => self.done(c, |h, c| h.search(c)),
            Request::History(c) => self.done(c, |h, c| h.history(c)),
            // bridge.rs
            Request::BridgeHello(c) => self.now(c, |h, _| h.bridge_hello()),
            Request::BridgeNext(c) => self.done(c, |h, c| h.bridge_next(ctx, c)),
            Request::BridgeSent(c) => self.now(c, |h, c| h.bridge_sent(c)),
            Request::BridgeFailed(c) => self.now(c, |h, c| h.bridge_failed(c)),
            Request::BridgeDeliver(c) => self.now(c, |h, c| h.bridge_deliver(c)),
            Request::BridgeStatus(c) => self.now(c, |h, c| h.bridge_status(c)),
        }
    }

    /// Runs a handler that answers at once.
    fn now<C: Command>(
        &mut self,
        cmd: C,
        f: impl FnOnce(&mut Hub, C) -> Result<C::Reply, String>,
    ) -> Outcome {
        Outcome::Answer(match f(self, cmd) {
            Ok(r) => C::reply_line(&r),
            Err(e) => err_line(&e),
        })
    }

    /// Runs a handler that may park the caller or offload its work.
    fn done<C: Command>(
        &mut self,
        cmd: C,
        f: impl FnOnce(&mut Hub, C) -> Handled<C::Reply>,
    ) -> Outcome {
        match f(self, cmd) {
            Ok(Done::Reply(r)) => Outcome::Answer(C::reply_line(&r)),
            Ok(Done::Wait) => Outcome::Wait,
            Ok(Done::Offload(work)) => {
                Outcome::Offload(Box::new(move || Finish::Answer(line(work()))))
            }
            Ok(Done::Then(who, work)) => Outcome::Offload(Box::new(move || match work() {
                Ok(followup) => Finish::Apply {
                    who,
                    followup: Box::new(followup),
                },
                Err(e) => Finish::Answer(err_line(&e)),
            })),
            Err(e) => Outcome::Answer(err_line(&e)),
        }
    }

    /// The answer line of an offloaded job's report: its own, or what the
    /// hub's state says once it applied what the job did.
    pub fn finish(&mut self, finish: Finish) -> String {
        match finish {
            Finish::Answer(line) => line,
            Finish::Apply { who, followup } => self.followup(&who, *followup),
        }
    }

    /// Finishes an offloaded request.
    fn followup(&mut self, who: &Identity, f: Followup) -> String {
        match (who, f) {
            (Identity::Agent(caller), Followup::ApplyCommit { agent, patch }) => {
                // Rights are checked again: the config may have changed while
                // the file was read.
                let caller = caller.clone();
                line(
                    self.admit(
                        who,
                        Via::Socket,
                        RequestApplyCommit::CMD,
                        RequestApplyCommit::ACCESS,
                    )
                    .and_then(|_| self.check_apply_commit(&caller, &agent))
                    .and_then(|_| self.queue_apply_commit(&caller, &agent, &patch)),
                )
            }
            (
                Identity::Operator,
                Followup::Approved {
                    id,
                    result,
                    patch,
                    spawned,
                },
            ) => line(self.approved(id, result, patch, spawned.map(|e| *e))),
            (
                Identity::Operator,
                Followup::Permissions {
                    agent,
                    patch,
                    result,
                },
            ) => line(self.permissions_applied(&agent, &patch, result)),
            (
                Identity::Operator,
                Followup::Budget {
                    agent,
                    patch,
                    hive,
                    result,
                },
            ) => line(self.budget_applied(agent, &patch, hive, result)),
            (
                who,
                Followup::Lifecycle {
                    agent,
                    stopped,
                    result,
                },
            ) => line(self.lifecycle_done(who, &agent, stopped, result)),
            (who, _) => err_line(&format!(
                "a follow-up for the other socket came in on the socket of {}",
                who.name()
            )),
        }
    }

    fn check_agent(&self, name: &str) -> Result<(), String> {
        if self.cfg.agent(name).is_some() {
            Ok(())
        } else {
            Err(self.unknown_agent(name))
        }
    }

    /// The refusal of a name no agent has, listing the agents there are (the
    /// first 20, then how many more).
    fn unknown_agent(&self, name: &str) -> String {
        const SHOWN: usize = 20;
        if self.removed.contains(name) {
            return format!(
                "{name} was removed from the fleet; its queued mail is kept until the operator \
                 runs `hive forget {name}`, and reaches it if its entry comes back (`hive reload`)"
            );
        }
        let names: Vec<&str> = self.cfg.agents.iter().map(|a| a.name.as_str()).collect();
        let mut known = names
            .iter()
            .take(SHOWN)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        if names.len() > SHOWN {
            known.push_str(&format!(
                " and {} more (hive agents lists them)",
                names.len() - SHOWN
            ));
        }
        if names.is_empty() {
            known = "none".into();
        }
        format!("unknown agent {}; the agents are {known}", excerpt(name))
    }

    /// Something arrived for `recipient`: its parked connections are woken.
    fn notify(&mut self, recipient: &str) {
        if let Some(list) = self.waiters.remove(recipient) {
            for conn in list {
                self.parked.remove(&conn);
                self.woken.push(conn);
            }
        }
    }

    /// Parks connection `conn` until something arrives for `recipient`.
    fn wait_for(&mut self, recipient: &str, conn: ConnId) {
        self.unpark(conn);
        self.waiters
            .entry(recipient.to_string())
            .or_default()
            .push(conn);
        self.parked.insert(conn, recipient.to_string());
    }

    /// Connection `conn` waits for nothing any more.
    fn unpark(&mut self, conn: ConnId) {
        if let Some(key) = self.parked.remove(&conn) {
            if let Some(list) = self.waiters.get_mut(&key) {
                list.retain(|c| *c != conn);
                if list.is_empty() {
                    self.waiters.remove(&key);
                }
            }
        }
    }
}

/// Whether the hub needs to know which process sent `req` on an agent's
/// socket: the harness's own requests (which mark its connections), a
/// `wake` from the agent's page, taken only from the harness's process, and
/// `send_to_parent`, charged to the agent unless its harness sends it. Only
/// where the harness has no credential (`Via::Shared`) does the answer
/// decide anything; a credential's connections are not looked up.
pub fn wants_peer(req: &Request) -> bool {
    match req {
        Request::RecvNext(_)
        | Request::Status(_)
        | Request::HarnessStarted(_)
        | Request::ReportState(_)
        | Request::SendToParent(_) => true,
        Request::Wake(w) => w.from == crate::proto::ident::PAGE_SENDER,
        _ => false,
    }
}

/// An answer line for a handler's result.
fn line<R: serde::Serialize>(r: Result<R, String>) -> String {
    match r {
        Ok(r) => ok_line(&r),
        Err(e) => err_line(&e),
    }
}
