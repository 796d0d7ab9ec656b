//! The supervisor of `hive up`: one thread that owns every agent's `hive serve`
//! child (a [`child::Proc`], killed and reaped when dropped). It starts them
//! (explicit stdio, output pumped into rotated logs, none of the operator's
//! variables, each in its sandbox when agents are isolated: `isolation.rs`),
//! restarts a crashed one with capped exponential backoff, carries out the
//! lifecycle commands the hub forwards (the broker's lifecycle port,
//! [`LifecycleCmd`]), runs crash_watch on every watch tick (looking at every
//! agent only after something happened, so an idle tick costs O(1) per
//! agent whose login is a key) and notices the fleet file changing on disk. Its one `select!`
//! waits on those commands, on exits (`child.rs`'s one `sup-children` thread
//! reports every child's exit and leaves the reaping to the supervisor), on the
//! nearest deadline (a restart after backoff, a stop's grace running out) and
//! on the watch tick. It never waits on the hub: events go to the hub as
//! one-way [`FleetEvent`]s through its narrow [`FleetTx`]. Agents the broker keeps stopped (`hive
//! stop`, the `kill` tool) are not started when `hive up` starts. It keeps what
//! it last applied to each agent, which is the base of every change hive makes
//! to the fleet file (`config::fleetfile`): an approved change or a permissions
//! save is written to the file and applied here in one step, so crash_watch
//! never sees one without the other. Each agent's child is a
//! [`child::Supervised`] (its phase, backoff and stop ladder, shared with the
//! bash-task daemons' and the bridge's supervisors); what follows a stop, the
//! rebuilds and crash_watch are this thread's.

use super::bashd::{self, AgentLaunch, BashCmd, BashSup};
use super::child::{self, Ended, Exited, Owner, Phase, Supervised, Timing};
use super::logfile::LogFile;
use super::watch::{Axes, Watch, WatchEvent};
use super::UpSettings;
use crate::broker::lifecycle::{Activity, EntryChange, FleetEvent, FleetTx, LifecycleCmd};
use crate::config::fleetfile::{self, Change};
use crate::config::{AgentConfig, HiveConfig};
use crate::proto::Rebuild;
use crossbeam_channel::{at, never, select, tick, unbounded, Receiver, Sender};
use std::collections::{BTreeMap, VecDeque};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

pub use crate::proto::AgentState;

/// What happens when a stopping child has exited.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Then {
    Stay,
    Start { rebuild: bool },
}

struct Agent {
    /// The config the current child was started with.
    applied: AgentConfig,
    /// The fleet file's entry, when it differs (read on the watch tick).
    desired: Option<AgentConfig>,
    /// Its `hive serve` child: phase, backoff, stop ladder.
    child: Supervised,
    /// What follows the stop under way, while its child stops.
    then: Then,
    bin_at_start: Option<BinId>,
    watch: Watch,
    rebuilding: bool,
    /// How the last rebuild ended.
    last_rebuild: Option<Rebuild>,
    /// Its harness reported to the broker that claude needs a login (an
    /// expired or refused credential, even with a credentials file present).
    needs_login: bool,
    /// The listening socket of its page (`DATA/run/pages/NAME.sock`), made at
    /// its first start and kept across restarts of its harness, each of which
    /// inherits it: a browser that reconnects while the harness restarts
    /// waits in its queue rather than failing.
    page: Option<std::os::unix::net::UnixListener>,
    /// Taken out of the fleet file (`hive reload`): stopped, kept only to
    /// show it `removed` until the operator forgets it.
    removed: bool,
    /// Its harness holds a message: a turn runs (the broker's
    /// [`Activity`] notices).
    busy: bool,
    /// Where its latest start is on the way to its boot turn's end.
    boot: Boot,
    /// A restart onto its changed entry or the current binary that waits
    /// for the running turn to end, until this instant at the latest.
    after_turn: Option<Instant>,
}

/// How far a started harness got: `update --all` starts the next agent once
/// the one before has run its boot turn (or paused, or failed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Boot {
    /// Spawned; its harness has not said it started.
    Spawned,
    /// Its harness started; its boot kick is queued or running.
    Started,
    /// Its boot turn ended (or it paused): it is settled.
    Done,
}

/// How long `update --all` waits for one agent's boot turn before it goes
/// on with the next (a turn that long is still running, not stuck).
const UPDATE_SETTLE: Duration = Duration::from_secs(300);

/// `hive update --all` under way: agents waiting their turn, and those being
/// updated now (each with when the update began, unix s, and the latest
/// instant it is waited for).
#[derive(Default)]
struct Updates {
    queue: VecDeque<String>,
    active: Vec<(String, i64, Instant)>,
    parallel: usize,
}

impl Agent {
    /// An agent supervised from now on with `applied`, its child stopped.
    fn new(applied: AgentConfig, timing: Timing) -> Agent {
        Agent {
            child: Supervised::new(&applied.name, timing),
            applied,
            desired: None,
            then: Then::Stay,
            bin_at_start: None,
            watch: Watch::default(),
            rebuilding: false,
            last_rebuild: None,
            needs_login: false,
            page: None,
            removed: false,
            busy: false,
            boot: Boot::Done,
            after_turn: None,
        }
    }
}

/// Identity of the `hive` binary on disk: a rebuild changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BinId {
    modified: Option<SystemTime>,
    len: u64,
}

fn bin_id(path: &std::path::Path) -> Option<BinId> {
    let m = std::fs::metadata(path).ok()?;
    Some(BinId {
        modified: m.modified().ok(),
        len: m.len(),
    })
}

pub struct Supervisor {
    s: UpSettings,
    hive: HiveConfig,
    agents: BTreeMap<String, Agent>,
    hub: FleetTx,
    config_mtime: Option<SystemTime>,
    exited_tx: Sender<Exited>,
    exited: Receiver<Exited>,
    /// The agents' bash-task daemons (`bashd.rs`).
    bash: BashSup,
    /// `hive update --all` under way.
    updates: Updates,
    /// Restarts `bridge-sup`'s Matrix bridge, when the hive has one.
    bridge: Option<Sender<()>>,
    /// Something that may move an agent's crash_watch axes happened since
    /// the last watch tick (an exit, a start, a command): the next tick looks
    /// at every agent. An idle tick looks only at what can change unseen.
    watch_dirty: bool,
    /// The binary as the last full crash_watch look found it.
    watched_bin: Option<BinId>,
    /// What each harness gets when `hive up` exports traces (issue 43:
    /// `telemetry::Config::harness_vars`), set at start.
    telemetry_vars: Vec<(String, String)>,
}

/// Variables of `hive up`'s own environment that no agent gets: the operator's
/// socket, the dashboard's settings and token, `hive up`'s own settings, and a
/// page token (each agent's page has its own: its fleet entry's `HIVE_WEB_TOKEN`,
/// or the one it makes).
pub fn operator_only(key: &str) -> bool {
    matches!(
        key,
        "HIVE_HOST_SOCKET" | "HIVE_WEB_TOKEN" | "HIVE_ISOLATION"
    ) || key.starts_with("HIVE_DASHBOARD_")
        || key.starts_with("HIVE_UP_")
}

impl Supervisor {
    /// Supervises every agent of `hive`, and through `bash` their bash-task
    /// daemons; those in `stopped` (kept stopped by the broker) stay stopped
    /// until they are started.
    pub fn new(
        s: UpSettings,
        hive: HiveConfig,
        hub: FleetTx,
        stopped: &[String],
        bash: BashSup,
    ) -> Supervisor {
        let timing = Timing::of(&s);
        let agents = hive
            .agents
            .iter()
            .map(|a| {
                let mut agent = Agent::new(a.clone(), timing);
                if stopped.contains(&a.name) {
                    log::info!(
                        "{} stays stopped (it was stopped); `hive start {}` starts it",
                        a.name,
                        a.name
                    );
                } else {
                    agent.child.start_at(Instant::now());
                }
                (a.name.clone(), agent)
            })
            .collect();
        let config_mtime = s.config.as_ref().and_then(|p| mtime(p));
        let (exited_tx, exited) = unbounded();
        Supervisor {
            s,
            hive,
            agents,
            hub,
            config_mtime,
            exited_tx,
            exited,
            bash,
            updates: Updates::default(),
            bridge: None,
            telemetry_vars: Vec::new(),
            watch_dirty: true,
            watched_bin: None,
        }
    }

    /// The Matrix bridge `hive reload` restarts when the `matrix` section
    /// changes.
    pub fn with_bridge(mut self, restart: Option<Sender<()>>) -> Supervisor {
        self.bridge = restart;
        self
    }

    /// The variables that make each harness hand its spans to the broker.
    pub fn with_telemetry(mut self, vars: Vec<(String, String)>) -> Supervisor {
        self.telemetry_vars = vars;
        self
    }

    /// Runs until `Shutdown` or until every sender is gone (then stops the agents).
    pub fn run(mut self, rx: Receiver<LifecycleCmd>) {
        self.on_deadlines();
        let watch = tick(self.s.watch_interval);
        loop {
            let timer = self.next_deadline().map_or_else(never, at);
            select! {
                recv(rx) -> cmd => match cmd {
                    Ok(LifecycleCmd::Shutdown { reply }) => {
                        self.stop_all();
                        let _ = reply.send(());
                        return;
                    }
                    Ok(cmd) => {
                        self.watch_dirty |= moves_axes(&cmd);
                        self.handle(cmd);
                    }
                    Err(_) => {
                        self.stop_all();
                        return;
                    }
                },
                recv(self.exited) -> e => {
                    if let Ok(e) = e {
                        self.watch_dirty = true;
                        self.on_exited(&e);
                    }
                }
                recv(timer) -> _ => {
                    self.watch_dirty = true;
                    self.on_deadlines();
                }
                recv(watch) -> _ => {
                    self.check_config_file();
                    self.crash_watch();
                }
            }
        }
    }

    /// The nearest restart after backoff or end of a stop's grace.
    fn next_deadline(&self) -> Option<Instant> {
        let turns = self.agents.values().filter_map(|a| a.after_turn);
        let updates = self.updates.active.iter().map(|(_, _, until)| *until);
        child::next_deadline(self.agents.values().map(|a| &a.child))
            .into_iter()
            .chain(turns)
            .chain(updates)
            .min()
    }

    fn handle(&mut self, cmd: LifecycleCmd) {
        match cmd {
            LifecycleCmd::Start { name, reply } => {
                let r = self.start_cmd(&name);
                let _ = reply.send(r);
            }
            LifecycleCmd::Kill { name, reply } => {
                let r = self.stop(&name, Then::Stay);
                let _ = reply.send(r.map(|was_running| {
                    if was_running {
                        format!("{name} is stopping and stays stopped")
                    } else {
                        format!(
                            "{name} was not running; it stays stopped until `hive start {name}`"
                        )
                    }
                }));
            }
            LifecycleCmd::Restart { name, reply } => {
                let r = self.stop(&name, Then::Start { rebuild: false });
                let _ = reply.send(r.map(|was_running| {
                    if was_running {
                        format!("{name} is restarting")
                    } else {
                        format!("{name} was not running; it is starting")
                    }
                }));
            }
            LifecycleCmd::Update { name, reply } => {
                let r = self.update(&name);
                let _ = reply.send(r);
            }
            LifecycleCmd::Apply { change, reply } => {
                let r = self.apply(change);
                let _ = reply.send(r);
            }
            LifecycleCmd::States { reply } => {
                let _ = reply.send(self.states());
            }
            LifecycleCmd::Reload { reply } => {
                let r = self.reload();
                let _ = reply.send(r);
            }
            LifecycleCmd::UpdateAll { parallel, reply } => {
                let r = self.update_all(parallel);
                let _ = reply.send(r);
            }
            LifecycleCmd::Forget { name } => {
                if self
                    .agents
                    .get(&name)
                    .is_some_and(|a| a.removed && a.child.is_stopped())
                {
                    self.agents.remove(&name);
                    let _ = std::fs::remove_file(super::pages::socket_path(&self.s.run_dir, &name));
                }
            }
            LifecycleCmd::Activity { name, activity } => self.on_activity(&name, activity),
            LifecycleCmd::NeedsLogin { name, needs } => {
                // crash_watch reports changes since its last look: a login
                // lost before its first look is still news, so it looks now,
                // before the change.
                let before = self
                    .agents
                    .get(&name)
                    .filter(|a| a.watch.last().is_none())
                    .map(|a| self.axes(a));
                if let Some(a) = self.agents.get_mut(&name) {
                    if let Some(axes) = before {
                        a.watch.observe(axes);
                    }
                    a.needs_login = needs;
                }
            }
            // The pages are asked on a thread of the query's own.
            LifecycleCmd::Search {
                query,
                within,
                reply,
            } => {
                let names: Vec<String> = match &query.agent {
                    Some(a) if !self.agents.contains_key(a) => {
                        let _ = reply.send(Err(format!("{a} is not supervised by this hive")));
                        return;
                    }
                    Some(a) => vec![a.clone()],
                    None => self.agents.keys().cloned().collect(),
                };
                let pages = names.iter().map(|n| self.page(n)).collect();
                let origin = self.s.origin.clone();
                super::search::spawn("sup-search", reply, move || {
                    Ok(super::search::search(pages, &query, within, &origin))
                });
            }
            LifecycleCmd::History {
                query,
                within,
                reply,
            } => {
                if !self.agents.contains_key(&query.agent) {
                    let _ = reply.send(Err(format!(
                        "{} is not supervised by this hive",
                        query.agent
                    )));
                    return;
                }
                let page = self.page(&query.agent);
                super::search::spawn("sup-history", reply, move || {
                    super::search::history(page, &query, within)
                });
            }
            LifecycleCmd::Shutdown { .. } => {}
        }
    }

    /// How `name`'s page is reached (its socket while it runs, and its token).
    fn page(&self, name: &str) -> super::pages::Page {
        let a = self.agents.get(name);
        let running = a.is_some_and(|a| a.child.is_running());
        let entry = a.map(|a| &a.applied);
        super::pages::page(&self.s.data, &self.s.run_dir, entry, name, running)
    }

    fn agent(&mut self, name: &str) -> Result<&mut Agent, String> {
        self.agents
            .get_mut(name)
            .ok_or_else(|| format!("{name} is not supervised by this hive"))
    }

    fn start_cmd(&mut self, name: &str) -> Result<String, String> {
        let a = self.agent(name)?;
        if a.removed {
            return Err(removed_text(name));
        }
        match a.child.phase() {
            Phase::Running(_) => Ok(format!("{name} is already running")),
            Phase::Stopping { .. } => {
                a.then = Then::Start { rebuild: false };
                Ok(format!(
                    "{name} is stopping; it starts again once it has exited"
                ))
            }
            Phase::Stopped | Phase::Backoff(_) => {
                a.child.reset_failures();
                self.spawn(name)?;
                Ok(format!("{name} started"))
            }
        }
    }

    /// Asks a running agent to stop (SIGTERM: it requeues its inflight message).
    /// Whether there was a harness to stop (false: it was not running).
    fn stop(&mut self, name: &str, then: Then) -> Result<bool, String> {
        let a = self.agent(name)?;
        a.then = then;
        let was_running = a.child.stop();
        if !was_running && then != Then::Stay {
            // Nothing to stop: start at once (the deadline is now).
            a.child.start_at(Instant::now());
        }
        // A later kill or restart supersedes a rebuild in flight.
        a.rebuilding = then == (Then::Start { rebuild: true });
        // Stopped for good, it takes its bash-task daemon and tasks along; a
        // restart or an update leaves them running.
        if then == Then::Stay {
            self.bash.send(BashCmd::Stop {
                name: name.to_string(),
            });
        }
        Ok(was_running)
    }

    /// Restarts `name` onto the current binary and its entry as the fleet
    /// file says it now (read again here, not the last tick's copy), once
    /// its running turn has ended.
    fn update(&mut self, name: &str) -> Result<String, String> {
        let entry = match self.s.config.clone() {
            Some(path) => {
                let cfg = self.load_fleet(&path, &format!("update {name}"))?;
                let entry = cfg.agent(name).cloned().ok_or_else(|| {
                    format!(
                        "update {name}: {name} is not in the fleet file {} any more; put its \
                         entry back, then update again (or `hive reload` to stop it)",
                        path.display()
                    )
                })?;
                Some(entry)
            }
            None => None,
        };
        let a = self.agent(name)?;
        if let Some(entry) = entry {
            a.desired = (entry != a.applied).then_some(entry);
        }
        self.rebuild(name)
    }

    /// Reads the fleet file, which must load whole (`what` names the
    /// command in the error), and takes its entries as the agents' desired
    /// ones.
    fn load_fleet(&mut self, path: &Path, what: &str) -> Result<HiveConfig, String> {
        let cfg = HiveConfig::load(path).map_err(|e| {
            format!("{what}: the fleet file does not load ({e}); nothing changed: fix it, then try again")
        })?;
        self.config_mtime = mtime(path);
        self.reload_desired(&cfg);
        Ok(cfg)
    }

    /// Whether `a` runs the current binary and its desired entry.
    fn is_current(&self, a: &Agent) -> bool {
        a.desired.is_none() && (a.bin_at_start.is_none() || a.bin_at_start == bin_id(&self.s.exe))
    }

    /// Restarts `name` onto the current binary and its desired entry,
    /// taken into what it runs now; a turn that runs ends first (at most
    /// the stop grace later). Nothing for an agent already current.
    fn rebuild(&mut self, name: &str) -> Result<String, String> {
        let current = self.agents.get(name).is_some_and(|a| self.is_current(a));
        let a = self.agent(name)?;
        if a.removed {
            return Err(removed_text(name));
        }
        if a.rebuilding || a.after_turn.is_some() {
            return Ok(format!("{name} is already being rebuilt"));
        }
        if current && a.child.is_running() {
            return Ok(format!(
                "{name} already runs the current binary and config; nothing to do"
            ));
        }
        if let Some(d) = a.desired.take() {
            a.applied = d;
        }
        let cfg = a.applied.clone();
        self.set_hive_entry(&cfg);
        let _ = self.hub.send(FleetEvent::ApplyAgent(cfg));
        self.restart_after_turn(name)
    }

    /// Restarts `name` onto what it applies now, once the turn it runs has
    /// ended: at once when none runs, else when the broker says it ended or
    /// after the stop grace, whichever comes first.
    fn restart_after_turn(&mut self, name: &str) -> Result<String, String> {
        let grace = self.s.stop_grace;
        let a = self.agent(name)?;
        if a.busy && a.child.is_running() {
            a.after_turn = Some(Instant::now() + grace);
            return Ok(format!(
                "{name} is in a turn: it restarts onto the current binary and config once the \
                 turn ends (within {} s)",
                grace.as_secs()
            ));
        }
        self.stop(name, Then::Start { rebuild: true })?;
        Ok(format!(
            "{name} is rebuilding: it restarts onto the current binary and config"
        ))
    }

    /// What the broker saw `name`'s harness do: a restart that waited for
    /// the turn goes ahead when it ends; `update --all` moves on.
    fn on_activity(&mut self, name: &str, activity: Activity) {
        let Some(a) = self.agents.get_mut(name) else {
            return;
        };
        match activity {
            Activity::Started => {
                a.busy = false;
                if a.boot == Boot::Spawned {
                    a.boot = Boot::Started;
                }
            }
            Activity::Busy => a.busy = true,
            Activity::Idle | Activity::Paused => {
                if activity == Activity::Idle {
                    a.busy = false;
                }
                if a.boot == Boot::Started {
                    a.boot = Boot::Done;
                }
                if a.after_turn.is_some() && !a.busy {
                    a.after_turn = None;
                    log::info!("{name}'s turn ended: it restarts onto its update");
                    let _ = self.stop(name, Then::Start { rebuild: true });
                }
            }
        }
        self.pump_updates();
    }

    /// `hive update --all`: every agent whose binary or entry changed is
    /// queued, and updated `parallel` at a time. Stopped agents take their
    /// entry and stay stopped.
    fn update_all(&mut self, parallel: usize) -> Result<String, String> {
        if let Some(path) = self.s.config.clone() {
            self.load_fleet(&path, "update --all")?;
        }
        let mut stale = Vec::new();
        let mut applied = Vec::new();
        let names: Vec<String> = self.agents.keys().cloned().collect();
        for name in names {
            let Some(a) = self.agents.get(&name) else {
                continue;
            };
            if a.removed || self.is_current(a) || a.rebuilding || a.after_turn.is_some() {
                continue;
            }
            if self.updates.queue.contains(&name)
                || self.updates.active.iter().any(|(n, _, _)| *n == name)
            {
                continue;
            }
            if a.child.is_stopped() {
                if let Some(a) = self.agents.get_mut(&name) {
                    if let Some(d) = a.desired.take() {
                        a.applied = d.clone();
                        self.set_hive_entry(&d);
                        let _ = self.hub.send(FleetEvent::ApplyAgent(d));
                        applied.push(name);
                    }
                }
                continue;
            }
            stale.push(name);
        }
        self.updates.parallel = parallel.max(1);
        self.updates.queue.extend(stale.iter().cloned());
        let mut text = if stale.is_empty() {
            "every running agent runs the current binary and config; nothing to update".to_string()
        } else {
            format!(
                "updating {} agent{}, at most {} at a time, each once the one before has run its \
                 boot turn: {}",
                stale.len(),
                if stale.len() == 1 { "" } else { "s" },
                self.updates.parallel,
                stale.join(", ")
            )
        };
        if !applied.is_empty() {
            text.push_str(&format!(
                "\nstopped, they take their new entry and run it once started: {}",
                applied.join(", ")
            ));
        }
        self.pump_updates();
        Ok(text)
    }

    /// Moves `update --all` on: updates that settled (the agent ran its boot
    /// turn, paused, failed to start, crashed, was stopped, or took longer
    /// than [`UPDATE_SETTLE`]) leave; the next agents start theirs.
    fn pump_updates(&mut self) {
        let now = Instant::now();
        let agents = &self.agents;
        self.updates.active.retain(|(name, since, until)| {
            let Some(a) = agents.get(name) else {
                return false;
            };
            if now >= *until {
                log::warn!(
                    "update --all: {name} has not finished its boot turn in {} s; going on",
                    UPDATE_SETTLE.as_secs()
                );
                return false;
            }
            let settled = a.after_turn.is_none()
                && match a.child.phase() {
                    Phase::Running(_) => !a.rebuilding && a.boot == Boot::Done,
                    Phase::Stopping { .. } => false,
                    Phase::Stopped => a.then == Then::Stay,
                    Phase::Backoff(_) => {
                        !a.rebuilding
                            || a.last_rebuild
                                .as_ref()
                                .is_some_and(|r| !r.ok && r.at >= *since)
                    }
                };
            !settled
        });
        while self.updates.active.len() < self.updates.parallel {
            let Some(name) = self.updates.queue.pop_front() else {
                break;
            };
            match self.rebuild(&name) {
                Ok(text) => {
                    log::info!("update --all: {text}");
                    let busy = self
                        .agents
                        .get(&name)
                        .is_some_and(|a| a.rebuilding || a.after_turn.is_some());
                    if busy {
                        self.updates
                            .active
                            .push((name, crate::proto::now(), now + UPDATE_SETTLE));
                    }
                }
                Err(e) => log::warn!("update --all: {name}: {e}"),
            }
        }
        if self.updates.active.is_empty()
            && self.updates.queue.is_empty()
            && self.updates.parallel > 0
        {
            log::info!("update --all: done");
            self.updates.parallel = 0;
        }
    }

    /// `hive reload`: the fleet file, read whole (a file that does not load
    /// changes nothing), becomes the fleet. Added agents start (a removed
    /// one that comes back finds its mail); removed ones stop and stay
    /// listed as removed; changed ones restart onto their entry once their
    /// turn ends (or take it at once, for the keys that apply live);
    /// unchanged ones keep running, their harness untouched. Top-level keys
    /// apply, or are named as needing a restart of `hive up`.
    fn reload(&mut self) -> Result<String, String> {
        let Some(path) = self.s.config.clone() else {
            return Err(
                "reload: this hive up runs without a fleet file (it was started without \
                 --config), so there is nothing to read again"
                    .into(),
            );
        };
        let does_not_load = |e: String| {
            format!(
                "reload: the fleet file {} does not load, so nothing changed: {e}",
                path.display()
            )
        };
        let cfg = HiveConfig::load(&path).map_err(does_not_load)?;
        // The top level: what applies now, and what waits for a restart.
        // Under a Matrix bridge the hive's names wait for a restart of hive
        // up: the swarm knows the hive by them.
        let bridged = self.hive.matrix.is_some() || cfg.matrix.is_some();
        let names_differ =
            cfg.hive_name != self.hive.hive_name || cfg.swarm_name != self.hive.swarm_name;
        let names_changed = names_differ && !bridged;
        // A changed `notify` block applies now. Its files are read at every
        // reload (a new secret, a `url_file` naming a new URL, with the
        // block itself unchanged), and one that cannot be read refuses the
        // reload as it refuses a start.
        let notify_changed = cfg.notify != self.hive.notify;
        let notify = if notify_changed || cfg.notify.is_some() {
            let named = if names_changed { &cfg } else { &self.hive };
            let block = crate::broker::notify::Reconfig::read(
                cfg.notify.as_deref(),
                path.parent(),
                named.hive_name.as_deref(),
            );
            Some(block.map_err(does_not_load)?)
        } else {
            None
        };
        self.config_mtime = mtime(&path);
        let mut lines = Vec::new();
        let budget_changed = cfg.budget != self.hive.budget;
        let max_claude_changed = cfg.max_claude != self.hive.max_claude;
        let mut later = Vec::new();
        if cfg.web != self.hive.web {
            later.push("web");
        }
        if cfg.operator_gid != self.hive.operator_gid {
            later.push("operator_gid");
        }
        // A changed section restarts the bridge, which reads it from the
        // broker at its start; adding or removing one (the broker's bridge
        // socket) waits for a restart of hive up, as does a new hive name
        // under a bridge (its Matrix device is named after the hive).
        let mut bridge_restart = false;
        if names_differ && bridged {
            later.push("hive_name/swarm_name (under a Matrix bridge)");
        }
        match (&self.hive.matrix, &cfg.matrix) {
            (Some(old), Some(new)) if old != new && !names_differ && self.bridge.is_some() => {
                bridge_restart = true;
            }
            (old, new) if old != new => later.push("matrix"),
            _ => {}
        }
        if cfg.retention != self.hive.retention {
            later.push("retention");
        }
        // The exporter and every harness's environment are made at the start.
        if cfg.telemetry != self.hive.telemetry {
            later.push("telemetry");
        }
        // Removed: stopped, listed as removed, their mail kept.
        let gone: Vec<String> = self
            .agents
            .iter()
            .filter(|(name, a)| !a.removed && cfg.agent(name).is_none())
            .map(|(name, _)| name.clone())
            .collect();
        for name in &gone {
            let _ = self.stop(name, Then::Stay);
            if let Some(a) = self.agents.get_mut(name) {
                a.removed = true;
                a.desired = None;
                a.after_turn = None;
            }
            self.updates.queue.retain(|n| n != name);
            self.hive.agents.retain(|a| a.name != *name);
            lines.push(format!(
                "{name}: removed from the fleet; it stops, and its queued mail is kept until \
                 `hive forget {name}`"
            ));
        }
        // The broker takes the new fleet before anything starts on it.
        if names_changed {
            self.hive.hive_name = cfg.hive_name.clone();
            self.hive.swarm_name = cfg.swarm_name.clone();
        }
        self.hive.budget = cfg.budget.clone();
        self.hive.max_claude = cfg.max_claude;
        let _ = self.hub.send(FleetEvent::Reloaded(Box::new(cfg.clone())));
        if let Some(r) = notify {
            let n = r.dests.len();
            let _ = self.hub.send(FleetEvent::Notify(Box::new(r)));
            if notify_changed {
                self.hive.notify = cfg.notify.clone();
                lines.push(if n == 0 {
                    "notify: removed; no notification is sent, and the queued ones are dropped"
                        .into()
                } else {
                    format!(
                        "notify: applies now ({n} destination{}; `hive notify test` tries them)",
                        if n == 1 { "" } else { "s" }
                    )
                });
            }
        }
        if bridge_restart {
            self.hive.matrix = cfg.matrix.clone();
            if let Some(b) = &self.bridge {
                let _ = b.send(());
            }
            lines.push("matrix: changed; the Matrix bridge restarts onto it".into());
        }
        // Added: supervised and started.
        let timing = Timing::of(&self.s);
        let mut added = std::collections::BTreeSet::new();
        for entry in &cfg.agents {
            let name = &entry.name;
            let back = self.agents.get(name).is_some_and(|a| a.removed);
            if self.agents.contains_key(name) && !back {
                continue;
            }
            if back {
                // Its page socket and state dir are kept; a fresh record.
                if let Some(a) = self.agents.get_mut(name) {
                    if !a.child.is_stopped() {
                        // Still stopping: it starts again once it has exited.
                        a.removed = false;
                        a.applied = entry.clone();
                        a.then = Then::Start { rebuild: false };
                        self.set_hive_entry(entry);
                        added.insert(name.clone());
                        lines.push(format!(
                            "{name}: back in the fleet; it starts once it has stopped"
                        ));
                        continue;
                    }
                }
                self.agents.remove(name);
            }
            self.set_hive_entry(entry);
            added.insert(name.clone());
            self.agents
                .insert(name.clone(), Agent::new(entry.clone(), timing));
            lines.push(match self.spawn(name) {
                Ok(()) if back => {
                    format!("{name}: back in the fleet and started; its kept mail reaches it")
                }
                Ok(()) => format!("{name}: added and started"),
                Err(e) => format!("{name}: added, but it did not start ({e}); it is tried again"),
            });
        }
        // Changed: live keys now, the rest at a restart after the turn.
        self.reload_desired(&cfg);
        let names: Vec<String> = self
            .agents
            .iter()
            .filter(|(n, a)| !a.removed && !added.contains(*n))
            .map(|(n, _)| n.clone())
            .collect();
        let mut unchanged = 0;
        for name in names {
            let Some(a) = self.agents.get(&name) else {
                continue;
            };
            let changed = a.desired.is_some() || (names_changed && !a.child.is_stopped());
            if !changed {
                unchanged += 1;
                continue;
            }
            if a.child.is_stopped() {
                if let Some(a) = self.agents.get_mut(&name) {
                    if let Some(d) = a.desired.take() {
                        a.applied = d.clone();
                        self.set_hive_entry(&d);
                        let _ = self.hub.send(FleetEvent::ApplyAgent(d));
                    }
                }
                lines.push(format!(
                    "{name}: has its new entry; it is stopped and runs it once started"
                ));
                continue;
            }
            let r = match self.agents.get_mut(&name) {
                // Only the hive's names changed: the same entry, restarted.
                Some(a) if a.desired.is_none() => self.restart_after_turn(&name),
                _ => self.rebuild(&name),
            };
            lines.push(format!("{name}: {}", r.unwrap_or_else(|e| e)));
        }
        if names_changed {
            lines.push(format!(
                "hive_name/swarm_name: now {} / {}; every running agent restarts onto them once \
                 its turn ends",
                cfg.hive_name.as_deref().unwrap_or("(none)"),
                cfg.swarm_name.as_deref().unwrap_or("(none)")
            ));
        }
        if budget_changed {
            lines.push("budget: applies now".into());
        }
        if max_claude_changed {
            lines.push(format!(
                "max_claude: applies now (at most {} claude at once)",
                cfg.max_claude()
            ));
        }
        if !later.is_empty() {
            lines.push(format!(
                "{} changed: {} applied at the next start of hive up (restart it to apply {})",
                later.join(", "),
                if later.len() == 1 {
                    "it is"
                } else {
                    "they are"
                },
                if later.len() == 1 { "it" } else { "them" },
            ));
        }
        let total = lines.len();
        let mut text = format!(
            "reloaded {}: {} unchanged agent{} keep running",
            path.display(),
            unchanged,
            if unchanged == 1 { "" } else { "s" }
        );
        if total == 0 {
            text.push_str("; nothing else changed");
        }
        for l in lines {
            text.push('\n');
            text.push_str(&l);
        }
        log::info!("{text}");
        Ok(text)
    }

    /// Carries out a change of an agent's entry: for an agent it runs, the
    /// change is written to the fleet file first (against what it last
    /// applied; a conflict with a hand edit or a file it cannot write refuses
    /// it with nothing changed), then applied, in one step of this thread. A
    /// running agent restarts onto it, a stopped one stays stopped; a new one
    /// starts.
    fn apply(&mut self, change: EntryChange) -> Result<String, String> {
        let name = change.agent.clone();
        if change.new && self.agents.contains_key(&name) {
            return Err(format!("{name} is supervised already"));
        }
        let Some(a) = self.agents.get(&name) else {
            if !change.new {
                return Err(format!("{name} is not supervised by this hive"));
            }
            let mut entry = fleetfile::patched(&AgentConfig::named(&name), &change.patch)?;
            entry.name = name.clone();
            self.set_hive_entry(&entry);
            // The broker gives it its socket and rules before it starts.
            let _ = self.hub.send(FleetEvent::ApplyAgent(entry.clone()));
            self.agents
                .insert(name.clone(), Agent::new(entry, Timing::of(&self.s)));
            return match self.spawn(&name) {
                Ok(()) => Ok(format!("{name} started")),
                Err(e) => Ok(format!("{name} did not start ({e}); it is tried again")),
            };
        };
        let base = a.applied.clone();
        let applied = fleetfile::patched(&base, &change.patch)?;
        if let Some(path) = self.s.config.clone() {
            let written = fleetfile::apply(
                &path,
                &Change {
                    agent: &name,
                    base: Some(&base),
                    patch: &change.patch,
                },
            )?;
            self.config_mtime = mtime(&path);
            self.reload_desired(&written.config);
        }
        self.set_hive_entry(&applied);
        let unchanged = applied == base;
        let restarts = applied.restarts_from(&base);
        let a = self.agent(&name)?;
        a.desired = a.desired.take().filter(|d| *d != applied);
        a.applied = applied;
        if unchanged {
            // A patch of the values the entry has: nothing to restart for.
            return Ok(format!(
                "{name}'s config already had these values: nothing changes, no restart"
            ));
        }
        if !restarts {
            // issue 16: budget, turn_usd and account apply without a restart.
            let applied = a.applied.clone();
            let _ = self.hub.send(FleetEvent::ApplyAgent(applied));
            return Ok(format!("{name} has its new config; it applies at once"));
        }
        if a.child.is_stopped() {
            return Ok(format!(
                "{name} has its new config; it is stopped and runs it once it is started"
            ));
        }
        self.stop(&name, Then::Start { rebuild: true })?;
        Ok(format!("{name} restarts with its new config"))
    }

    /// Keeps the supervisor's copy of the topology (for `manager_of`) in step.
    fn set_hive_entry(&mut self, agent: &AgentConfig) {
        match self.hive.agents.iter_mut().find(|a| a.name == agent.name) {
            Some(slot) => *slot = agent.clone(),
            None => self.hive.agents.push(agent.clone()),
        }
    }

    fn agent_dir(&self, name: &str) -> PathBuf {
        self.s.data.join("agents").join(name)
    }

    /// Starts `name`'s harness; on failure the agent goes into crash backoff.
    fn spawn(&mut self, name: &str) -> Result<(), String> {
        let result = self.spawn_child(name);
        let exited = self.exited_tx.clone();
        let a = self.agent(name)?;
        match result {
            Ok(child) => {
                log::info!("started {name} (pid {})", child.id());
                a.boot = Boot::Spawned;
                a.busy = false;
                // Unwatched, its exit would never be seen: it is stopped now
                // and tried again after backoff.
                if let Err(e) = a.child.run(child, format!("wait-{name}"), name, &exited) {
                    let e = format!("cannot watch {name}'s exit: {e}");
                    log::error!("{e}");
                    return Err(e);
                }
                if std::mem::take(&mut a.rebuilding) {
                    let text = match a.desired {
                        None => format!("{name} runs the current binary and config"),
                        Some(_) => format!(
                            "{name} runs the current binary and the config hive applied; its \
                             fleet-file entry still differs (edited by hand): `hive update \
                             {name}` applies it"
                        ),
                    };
                    a.last_rebuild = Some(Rebuild {
                        at: crate::proto::now(),
                        ok: true,
                        text,
                    });
                }
                Ok(())
            }
            Err(e) => {
                a.child.back_off();
                log::error!("cannot start {name}: {e}");
                if a.rebuilding {
                    a.last_rebuild = Some(Rebuild {
                        at: crate::proto::now(),
                        ok: false,
                        text: format!("{name} could not be started ({e}); it is tried again"),
                    });
                }
                Err(e)
            }
        }
    }

    fn spawn_child(&mut self, name: &str) -> Result<child::Proc, String> {
        let dir = self.agent_dir(name);
        let state = dir.join("state");
        let run = dir.join("run");
        let claude = dir.join("claude");
        for d in [&state, &run, &claude] {
            own_dir(d)?;
        }
        let logs = self.s.data.join("logs");
        std::fs::create_dir_all(&logs)
            .map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
        // A fresh port file is written by this start.
        let _ = std::fs::remove_file(state.join("hyperhive-port"));
        let cfg = self
            .agents
            .get(name)
            .map(|a| a.applied.clone())
            .ok_or_else(|| format!("{name} is not supervised"))?;
        let socket = crate::broker::agent_socket(&self.s.run_dir, name);
        let socket_dir = socket.parent().unwrap_or(&self.s.run_dir).to_path_buf();
        std::fs::create_dir_all(&socket_dir)
            .map_err(|e| format!("cannot create {}: {e}", socket_dir.display()))?;
        let serve: Vec<OsString> = vec![
            "serve".into(),
            "--state-dir".into(),
            state.clone().into(),
            "--run-dir".into(),
            run.clone().into(),
        ];
        let sandbox = match &self.s.isolation {
            Some(iso) => {
                let mut own = vec![dir.clone(), socket_dir, self.s.exe.clone()];
                // A claude config dir the fleet entry names stays the agent's own.
                if let Some(c) = cfg.env.get("CLAUDE_CONFIG_DIR").map(PathBuf::from) {
                    if c.is_absolute() {
                        std::fs::create_dir_all(&c)
                            .map_err(|e| format!("cannot create {}: {e}", c.display()))?;
                        own.push(c);
                    }
                }
                // Its path keys (icon, static_dir, web_dist): read-only.
                let shown = cfg
                    .path_keys()
                    .iter()
                    .map(|(_, p)| PathBuf::from(p))
                    .collect();
                Some((iso.reading(shown), own))
            }
            None => None,
        };
        let env_remove = std::env::vars_os()
            .map(|(key, _)| key)
            .filter(|key| key.to_str().is_some_and(operator_only))
            .collect();
        let mut env: Vec<(OsString, OsString)> = Vec::new();
        let mut set = |k: &str, v: OsString| env.push((k.into(), v));
        set("HIVE_SOCKET", socket.into());
        set("HIVE_BASH_SOCKET", run.join("bash.sock").into());
        set("HIVE_LABEL", name.into());
        set("CLAUDE_CONFIG_DIR", claude.into());
        set("HIVE_TOOL_GROUPS", {
            let g: Vec<&str> = cfg.groups().iter().map(|g| g.name()).collect();
            g.join(",").into()
        });
        set("HIVE_CAPABILITIES", {
            let c: Vec<&str> = cfg.capabilities.iter().map(|c| c.name()).collect();
            c.join(",").into()
        });
        if let Some(m) = &cfg.model {
            set("HIVE_DEFAULT_MODEL", m.into());
        }
        if let Some(h) = &self.hive.hive_name {
            set("HIVE_HIVE_NAME", h.into());
        }
        if let Some(h) = &self.hive.swarm_name {
            set("HIVE_SWARM_NAME", h.into());
        }
        // hive up tells the operator of a CLI outside the supported window
        // itself, once per hive and version (`cli::check_at_start`).
        set("HIVE_CLI_WINDOW_NOTICE", "off".into());
        // Traces: the harness hands its spans to hive up (issue 43).
        for (k, v) in &self.telemetry_vars {
            set(k, v.into());
        }
        // The entry's per-agent options (icon, static_dir, dashboard_links,
        // …) as the variables an agent module sets; its `env` wins.
        for (k, v) in cfg.option_env() {
            set(&k, v.into());
        }
        set("HIVE_BASH_ENV", super::declared::bash_env(&cfg, &run)?);
        for (k, v) in &cfg.env {
            set(k, v.into());
        }
        // SIGTERM comes if this thread (the supervisor) dies without stopping
        // the child; the umask is the one hive up was started with.
        let launch = AgentLaunch {
            exe: self.s.exe.clone(),
            sandbox,
            env_remove,
            env,
            umask: self.s.child_umask,
        };
        // Its page listens on a socket of hive up's, which the harness
        // inherits (no TCP port of its own: hive up passes the browser's
        // requests on), under a path its sandbox does not show.
        let page = self.page_socket(name)?;
        let mut fds = vec![(crate::http::server::INHERITED_FD_VAR, page)];
        // Under isolation the harness has a broker credential (issue 40):
        // its reports are taken only through it. Without a sandbox nothing
        // separates it from claude, and it reports on the agent's socket.
        let credential = match &self.s.isolation {
            Some(_) => Some(child::credential(
                &self.hub,
                name,
                crate::proto::access::Via::Harness,
            )?),
            None => None,
        };
        if let Some(c) = &credential {
            use std::os::fd::AsRawFd;
            fds.push((crate::proto::client::CREDENTIAL_FD_VAR, c.as_raw_fd()));
        }
        // Its bash-task daemon runs apart (bashd.rs), started with the same
        // launch, so its tasks outlive a restart of the harness.
        let placement = [(bashd::PLACEMENT_VAR.into(), "external".into())];
        self.bash.send(BashCmd::Keep {
            name: name.to_string(),
            launch: launch.clone(),
            state: state.clone(),
            socket: run.join("bash.sock"),
        });
        let bin = bin_id(&self.s.exe);
        // Isolated, one process: `sandbox::spawn` (bashd::AgentLaunch::start).
        let spawned = launch.start(serve, &fds, &placement);
        drop(credential);
        let spawned =
            spawned.map_err(|e| format!("cannot run {} serve: {e}", self.s.exe.display()))?;
        let log = Arc::new(Mutex::new(LogFile::open(
            self.s.data.join("logs").join(format!("{name}.log")),
            self.s.log_max_bytes,
            self.s.log_keep,
        )));
        let child = child::log_output(spawned, &log);
        if let Some(a) = self.agents.get_mut(name) {
            a.bin_at_start = bin;
        }
        Ok(child)
    }

    /// The descriptor of `name`'s page socket, made (or made again, after a
    /// start that found it gone) under `DATA/run/pages/`, a directory only
    /// `hive up`'s user reads and no sandbox shows.
    fn page_socket(&mut self, name: &str) -> Result<std::os::fd::RawFd, String> {
        use std::os::fd::AsRawFd;
        let path = super::pages::socket_path(&self.s.run_dir, name);
        let a = self.agent(name)?;
        if let Some(l) = &a.page {
            if path.exists() {
                return Ok(l.as_raw_fd());
            }
        }
        let dir = path.parent().unwrap_or(&path).to_path_buf();
        std::fs::create_dir_all(&dir)
            .and_then(|()| {
                std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            })
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let _ = std::fs::remove_file(&path);
        let l = std::os::unix::net::UnixListener::bind(&path)
            .map_err(|e| format!("cannot listen on {} for {name}'s page: {e}", path.display()))?;
        let fd = l.as_raw_fd();
        self.agent(name)?.page = Some(l);
        Ok(fd)
    }

    /// SIGTERM to every agent (each requeues its inflight message), then SIGKILL
    /// to whatever is left after the grace.
    fn stop_all(&mut self) {
        let names: Vec<String> = self.agents.keys().cloned().collect();
        for name in &names {
            let _ = self.stop(name, Then::Stay);
        }
        let (exited, grace) = (self.exited.clone(), self.s.stop_grace);
        let left = child::stop_all(self, &exited, grace);
        // Whatever is left is reaped on a thread of its own, so a child stuck
        // in the kernel does not hold up the shutdown.
        if !left.is_empty() {
            let _ = std::thread::Builder::new()
                .name("sup-reaper".into())
                .spawn(move || drop(left));
        }
    }

    /// Re-reads the fleet file when its mtime moved; entries that differ from
    /// what an agent runs become its `desired` config (and make it stale).
    fn check_config_file(&mut self) {
        let Some(path) = self.s.config.clone() else {
            return;
        };
        let m = mtime(&path);
        if m == self.config_mtime {
            return;
        }
        self.config_mtime = m;
        self.watch_dirty = true;
        let cfg = match HiveConfig::load(&path) {
            Ok(c) => c,
            Err(e) => {
                log::warn!("the fleet file changed but does not load, ignoring it: {e}");
                return;
            }
        };
        for entry in &cfg.agents {
            if self.agents.get(&entry.name).is_none_or(|a| a.removed) {
                log::warn!(
                    "{} is in the fleet file but not supervised yet: `hive reload` starts it",
                    entry.name
                );
            }
        }
        self.reload_desired(&cfg);
    }

    /// Each agent's `desired` entry from the fleet file `cfg`: its entry there
    /// when it differs from what the agent runs.
    fn reload_desired(&mut self, cfg: &HiveConfig) {
        // issue 16: `budget`, `turn_usd` and `account` apply live — taken
        // into what the agent runs and handed to the broker, never a
        // reason for an update.
        let mut live = Vec::new();
        for (name, a) in self.agents.iter_mut() {
            if let Some(entry) = cfg.agent(name) {
                let applied = a.applied.with_live_keys_of(entry);
                if applied != a.applied {
                    a.applied = applied;
                    live.push(a.applied.clone());
                }
            }
            match cfg.agent(name) {
                Some(entry) if *entry != a.applied => a.desired = Some(entry.clone()),
                _ => a.desired = None,
            }
        }
        for entry in live {
            self.set_hive_entry(&entry);
            let _ = self.hub.send(FleetEvent::ApplyAgent(entry));
        }
        let _ = self.hub.send(FleetEvent::HiveBudget(cfg.budget.clone()));
    }

    /// Whether `a`'s login is a key (in `hive up`'s environment or its
    /// entry's), which only a command changes, rather than files of its own.
    fn key_login(&self, a: &AgentConfig) -> bool {
        let key_in = |k: &str| a.env.get(k).is_some_and(|v| !v.trim().is_empty());
        self.s.inherited_login || key_in("ANTHROPIC_API_KEY") || key_in("CLAUDE_CODE_OAUTH_TOKEN")
    }

    fn logged_in(&self, a: &AgentConfig) -> bool {
        if self.key_login(a) {
            return true;
        }
        let dir = self.agent_dir(&a.name);
        let claude = a
            .env
            .get("CLAUDE_CONFIG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| dir.join("claude"));
        claude.join(".credentials.json").exists()
            || dir.join("state").join("hyperhive-credentials").exists()
    }

    /// The agent's page on the hive's one origin.
    fn page_url(&self, name: &str) -> Option<String> {
        Some(page_link(&self.s.origin, name))
    }

    fn axes(&self, a: &Agent) -> Axes {
        self.axes_with(a, bin_id(&self.s.exe))
    }

    /// `a`'s axes, the binary on disk being `bin_now`.
    fn axes_with(&self, a: &Agent, bin_now: Option<BinId>) -> Axes {
        Axes {
            running: a.child.is_running(),
            logged_in: !a.needs_login && self.logged_in(&a.applied),
            up_to_date: a.desired.is_none()
                && (a.bin_at_start.is_none() || a.bin_at_start == bin_now),
        }
    }

    /// The agent that hears about `name`: its topmost ancestor, or the operator
    /// for a root agent.
    fn manager_of(&self, name: &str) -> String {
        let mut cur = name.to_string();
        for _ in 0..=self.hive.agents.len() {
            let parent = self.hive.parent_of(&cur);
            if parent == "operator" {
                break;
            }
            cur = parent;
        }
        if cur == name {
            "operator".into()
        } else {
            cur
        }
    }

    /// Looks at the agents' axes and tells their managers of the changes.
    /// Idle work is O(what can change unseen), not O(agents): every agent is
    /// looked at after anything happened (an exit, a start, a command, the
    /// fleet file or the binary changing: `watch_dirty`); otherwise only the
    /// agents whose login rests on files of their own (a credentials file
    /// can appear or go without an event). Nothing is noticed later than
    /// before: whatever moves an axis is looked at on the next tick.
    fn crash_watch(&mut self) {
        let bin_now = bin_id(&self.s.exe);
        let full = std::mem::take(&mut self.watch_dirty) || bin_now != self.watched_bin;
        self.watched_bin = bin_now;
        let names: Vec<String> = self
            .agents
            .iter()
            .filter(|(_, a)| !a.removed && (full || !self.key_login(&a.applied)))
            .map(|(n, _)| n.clone())
            .collect();
        for name in names {
            let axes = match self.agents.get(&name) {
                Some(a) => self.axes_with(a, bin_now),
                None => continue,
            };
            let events = match self.agents.get_mut(&name) {
                Some(a) => a.watch.observe(axes),
                None => continue,
            };
            for e in events {
                let to = self.manager_of(&name);
                if e == WatchEvent::NeedsLogin {
                    log::warn!(
                        "{}",
                        needs_login_line(&name, self.page_url(&name).as_deref())
                    );
                }
                log::info!("crash_watch: {name}: {} → {to}", e.kind());
                let body = e.body(&name, to == "operator");
                let _ = self.hub.send(FleetEvent::System {
                    to,
                    kind: e.kind().into(),
                    body,
                });
            }
        }
    }

    fn states(&self) -> Vec<AgentState> {
        self.agents
            .iter()
            .map(|(name, a)| {
                let axes = a.watch.last().unwrap_or_else(|| self.axes(a));
                let (state, pid) = match a.child.phase() {
                    _ if a.removed => ("removed", a.child.pid()),
                    Phase::Running(c) if a.after_turn.is_some() => ("rebuilding", Some(c.id())),
                    Phase::Running(c) => ("running", Some(c.id())),
                    Phase::Stopping { child, .. } if a.rebuilding => {
                        ("rebuilding", Some(child.id()))
                    }
                    Phase::Stopping { child, .. } => ("stopping", Some(child.id())),
                    Phase::Stopped => ("stopped", None),
                    Phase::Backoff(_) if a.rebuilding => ("rebuilding", None),
                    Phase::Backoff(_) => ("restarting", None),
                };
                AgentState {
                    name: name.clone(),
                    state: state.into(),
                    pid,
                    restarts: a.child.restarts(),
                    logged_in: axes.logged_in,
                    up_to_date: axes.up_to_date,
                    // Its page is at /agent/NAME/ on hive up's listener.
                    port: None,
                    applied: a.applied.clone(),
                    last_rebuild: a.last_rebuild.clone(),
                }
            })
            .collect()
    }
}

impl Owner for Supervisor {
    fn children(&mut self) -> Box<dyn Iterator<Item = &mut Supervised> + '_> {
        Box::new(self.agents.values_mut().map(|a| &mut a.child))
    }

    /// Reaps the child of `e` if it is the one that exited: a running agent
    /// goes into crash backoff, a stopping one stays stopped or starts again.
    /// Whatever it left in its process group is killed with it.
    fn on_exited(&mut self, e: &Exited) {
        let Some(a) = self.agents.get_mut(&e.name) else {
            return;
        };
        let name = &e.name;
        match a.child.on_exit(e.pid) {
            Some(Ended::Crashed { status, up, .. }) => {
                // Its turn, if one ran, ended with it (the next harness
                // requeues the message); a restart that waited for it is due.
                a.busy = false;
                a.after_turn = None;
                let wait = a.child.after_crash(up);
                log::warn!("{name} exited ({status}) after {up:?}; restarting in {wait:?}");
                let detail = format!("{status} after {} s", up.as_secs());
                let _ = self.hub.send(FleetEvent::Crashed {
                    agent: name.clone(),
                    detail,
                });
            }
            Some(Ended::Stopped { status }) => {
                log::info!("{name} stopped ({status})");
                a.busy = false;
                if matches!(a.then, Then::Start { .. }) {
                    let _ = self.spawn(name);
                }
            }
            None => {} // an earlier child, already reaped
        }
    }

    /// Restarts agents whose backoff ran out and SIGKILLs stops past their grace.
    fn on_deadlines(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .agents
            .iter_mut()
            .filter_map(|(name, a)| a.child.on_deadline(now).then(|| name.clone()))
            .collect();
        for name in due {
            let _ = self.spawn(&name);
        }
        // Restarts that waited for a turn longer than the stop grace go
        // ahead: the turn is cut, its message requeued by the harness.
        let late: Vec<String> = self
            .agents
            .iter_mut()
            .filter(|(_, a)| a.after_turn.is_some_and(|t| t <= now))
            .map(|(name, a)| {
                a.after_turn = None;
                name.clone()
            })
            .collect();
        for name in late {
            log::warn!(
                "{name}'s turn did not end within the stop grace; it restarts onto its update \
                 now (the message is requeued)"
            );
            let _ = self.stop(&name, Then::Start { rebuild: true });
        }
        self.pump_updates();
    }
}

/// Whether `cmd` may move an agent's crash_watch axes (running, logged in,
/// up to date): any but the queries.
fn moves_axes(cmd: &LifecycleCmd) -> bool {
    !matches!(
        cmd,
        LifecycleCmd::States { .. } | LifecycleCmd::Search { .. } | LifecycleCmd::History { .. }
    )
}

/// The refusal of a command on an agent taken out of the fleet.
fn removed_text(name: &str) -> String {
    format!(
        "{name} was removed from the fleet; put its entry back in the fleet file and run `hive \
         reload` to start it again (or `hive forget {name}` to drop its kept mail)"
    )
}

/// `name`'s page on the hive's `origin` (`http://127.0.0.1:7890/`): the same
/// across restarts of the agent and of `hive up`.
pub fn page_link(origin: &str, name: &str) -> String {
    format!("{origin}agent/{name}/")
}

/// What `hive up` prints and logs for an agent claude cannot run for: where
/// to log it in.
pub fn needs_login_line(name: &str, url: Option<&str>) -> String {
    let page = match url {
        Some(u) => format!("its page {u}"),
        None => "its page".to_string(),
    };
    format!(
        "{name} needs a login, one of two ways: set ANTHROPIC_API_KEY (in hive up's \
         environment, or in {name}'s \"env\" in the fleet file) and restart it; or log in to \
         the dashboard with the link above, open {page} from there and paste an API key or a \
         token of `claude setup-token` into its login form"
    )
}

fn mtime(p: &std::path::Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Makes sure `d`, a dir inside an agent's own dir, is a directory, creating
/// it when missing. The agent can write its own dir, so it could have left a
/// symlink there; `hive up` (which reads and removes files in these dirs, and
/// mounts them into the agent's sandbox) refuses to follow it, to another
/// agent's dir or anywhere else on the host.
fn own_dir(d: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(d) {
        Ok(m) if m.file_type().is_symlink() => Err(format!(
            "{} is a symlink, not a directory: hive up does not follow an agent's own dirs \
             through symlinks; replace it with a directory",
            d.display()
        )),
        Ok(m) if !m.is_dir() => Err(format!(
            "{} is not a directory; move it away so hive up can create it",
            d.display()
        )),
        Ok(_) => Ok(()),
        Err(_) => {
            std::fs::create_dir_all(d).map_err(|e| format!("cannot create {}: {e}", d.display()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agents_own_dir_is_created_but_never_followed_through_a_symlink() {
        let root = std::env::temp_dir().join(format!("hive-own-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let ana = root.join("agents/ana");
        own_dir(&ana.join("state")).unwrap();
        assert!(ana.join("state").is_dir());
        own_dir(&ana.join("state")).unwrap();
        std::fs::create_dir_all(root.join("agents/bob/run")).unwrap();
        std::os::unix::fs::symlink(root.join("agents/bob/run"), ana.join("run")).unwrap();
        let e = own_dir(&ana.join("run")).unwrap_err();
        assert!(e.contains("is a symlink"), "{e}");
        std::fs::write(ana.join("claude"), "").unwrap();
        let e = own_dir(&ana.join("claude")).unwrap_err();
        assert!(e.contains("is not a directory"), "{e}");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn operator_variables_are_told_from_agent_ones() {
        for key in [
            "HIVE_DASHBOARD_TOKEN",
            "HIVE_DASHBOARD_BIND",
            "HIVE_HOST_SOCKET",
            "HIVE_WEB_TOKEN",
            "HIVE_UP_STOP_GRACE_MS",
            "HIVE_ISOLATION",
        ] {
            assert!(operator_only(key), "{key}");
        }
        for key in [
            "ANTHROPIC_API_KEY",
            "HIVE_POLL_MS",
            "HIVE_SOCKET",
            "PATH",
            "HIVE_WEB_HOSTS",
        ] {
            assert!(!operator_only(key), "{key}");
        }
    }
}
