//! `hive up`'s bash-task daemons: one `hive bash-daemon` child per running
//! agent, apart from its `hive serve`, so background tasks outlive a restart,
//! an update or a crash of the harness. The `bash-sup` thread owns every
//! daemon (a [`child::Proc`], its output in `DATA/logs/NAME.bash.log`),
//! started the way the agent is ([`AgentLaunch`]: same uid, environment, umask,
//! working dir and sandbox view, so a task sees what the agent sees and the
//! agent's sandbox reaches the daemon's socket in its own run dir). The
//! supervisor tells it, as closed [`BashCmd`]s, when an agent starts (keep its
//! daemon running) and when it is stopped for good (`hive stop`, the `kill`
//! tool, `hive up` stopping: the daemon gets SIGTERM, kills its tasks and
//! records them `interrupted`); a restart or update of the agent leaves it
//! alone. A daemon that exits by itself is restarted with the agents' capped
//! backoff. Its one `select!` waits on those commands, on the daemons' exits
//! (`sup-children` reports, this thread reaps) and on the nearest deadline (a
//! restart, a stop's grace running out) and the answers of `retire`. When an
//! agent starts onto another binary or config than its running daemon has
//! (`hive update`, an approved change), the daemon is asked to `retire`: it
//! exits only when no task runs, and is started again at once onto the new
//! ones; with tasks running it goes on as it is, until it next starts. The
//! call runs on a short thread of its own (`bash-retire`), so this loop never
//! waits on a socket; the request and its answer are the contract's
//! (`proto::bashwire`), the daemon's own. Each daemon is a
//! [`child::Supervised`] (its phase, backoff and stop ladder, shared with the
//! agents' supervisor and the bridge's).

use super::child::{self, Ended, Exited, Owner, Phase, Supervised, Timing};
use super::logfile::LogFile;
use super::UpSettings;
use crate::broker::lifecycle::FleetTx;
use crate::proto::bashwire::{Request, RetireReply};
use crate::proto::client::CREDENTIAL_FD_VAR;
use crate::proto::lines::{self, Conn};
use crossbeam_channel::{at, never, select, unbounded, Receiver, Sender};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The variable that tells `hive serve` its bash-task daemon runs on its own
/// (`external`), so it starts none inside itself.
pub const PLACEMENT_VAR: &str = "HIVE_BASH_DAEMON";

/// How a process of an agent is started: the same for its `hive serve` and
/// its `hive bash-daemon`, so both run with one environment and one view.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentLaunch {
    /// The `hive` binary.
    pub exe: PathBuf,
    /// The agent's sandbox, and the paths it keeps; `None` when unisolated.
    pub sandbox: Option<(super::isolation::Isolation, Vec<PathBuf>)>,
    /// Variables of `hive up`'s own environment the agent does not get.
    pub env_remove: Vec<OsString>,
    /// The agent's variables, in the order they are set (later ones win).
    pub env: Vec<(OsString, OsString)>,
    /// The umask `hive up` was started with.
    pub umask: u32,
}

impl AgentLaunch {
    /// Starts `hive ARGS…` as the agent runs it, with its environment and
    /// `env` on top (later names win), each descriptor of `fds` inherited
    /// under its number and named by its variable (a page socket, a broker
    /// credential: `(VAR, fd)` sets `VAR=fd`), stdin from /dev/null, stdout
    /// and stderr piped (for the log), SIGTERM when the spawning thread
    /// dies, the umask `hive up` was started with. In its
    /// sandbox when it has one: one process, PID 1 of its own namespaces
    /// (`sandbox::spawn`); else a plain child ([`child::spawn`]). Either way
    /// the leader of its own process group, a direct child of this process.
    /// Call it from the thread that supervises the child (the parent-death
    /// signal follows the spawning thread).
    pub fn start(
        &self,
        args: Vec<OsString>,
        fds: &[(&str, RawFd)],
        env: &[(OsString, OsString)],
    ) -> std::io::Result<child::Spawned> {
        let keep: Vec<RawFd> = fds.iter().map(|(_, fd)| *fd).collect();
        let named = fds
            .iter()
            .map(|(var, fd)| (var.into(), fd.to_string().into()));
        let env: Vec<(OsString, OsString)> = self
            .env
            .iter()
            .cloned()
            .chain(named)
            .chain(env.iter().cloned())
            .collect();
        let Some((iso, own)) = &self.sandbox else {
            let mut cmd = Command::new(&self.exe);
            cmd.args(args);
            for key in &self.env_remove {
                cmd.env_remove(key);
            }
            cmd.envs(env);
            crate::sys::process::child_setup(&mut cmd, libc::SIGTERM, self.umask);
            for fd in keep {
                crate::sys::process::pass_fd(&mut cmd, fd);
            }
            return child::spawn(&mut cmd);
        };
        let mut argv: Vec<OsString> = vec![self.exe.clone().into()];
        argv.extend(args);
        let spec = iso.spec(own, argv);
        let env = super::sandbox::environment(&self.env_remove, &env);
        super::sandbox::spawn(&super::sandbox::Spawn {
            exe: &self.exe,
            spec: &spec,
            env: &env,
            keep: &keep,
            parent_death_signal: libc::SIGTERM,
            umask: self.umask,
        })
    }
}

/// What the supervisor tells `bash-sup`.
pub enum BashCmd {
    /// Agent `name` runs: keep its daemon running (start it now if it does
    /// not run), from now on started with `launch` on the state dir `state`,
    /// listening on `socket`; a running one on another binary or launch is
    /// asked to retire.
    Keep {
        name: String,
        launch: AgentLaunch,
        state: PathBuf,
        socket: PathBuf,
    },
    /// Agent `name` is stopped for good: stop its daemon (and so its tasks).
    Stop { name: String },
}

/// The running `bash-sup` thread; dropping it (or [`BashSup::stop`]) stops
/// every daemon and waits for them.
pub struct BashSup {
    tx: Option<Sender<BashCmd>>,
    thread: Option<JoinHandle<()>>,
}

impl BashSup {
    /// Starts the thread; no daemon runs until an agent is kept.
    pub fn start(s: &UpSettings, hub: FleetTx) -> Result<BashSup, String> {
        let (tx, rx) = unbounded();
        let sup = Sup::new(s.clone(), hub);
        let thread = std::thread::Builder::new()
            .name("bash-sup".into())
            .spawn(move || sup.run(rx))
            .map_err(|e| format!("cannot start the bash-sup thread: {e}"))?;
        Ok(BashSup {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Sends `cmd` (never blocks).
    pub fn send(&self, cmd: BashCmd) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(cmd);
        }
    }

    /// Stops every daemon (SIGTERM, SIGKILL after the grace) and waits.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BashSup {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The log file of agent `name`'s daemon, under `DATA/logs`. It has a dot
/// in its stem, which no agent name has, so it is never an agent's own log
/// (`NAME-bash.log` was agent `NAME-bash`'s).
pub fn log_name(name: &str) -> String {
    format!("{name}.bash.log")
}

/// Identity of the `hive` binary on disk: a rebuild changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct BinId {
    modified: Option<std::time::SystemTime>,
    len: u64,
}

fn bin_id(path: &std::path::Path) -> Option<BinId> {
    let m = std::fs::metadata(path).ok()?;
    Some(BinId {
        modified: m.modified().ok(),
        len: m.len(),
    })
}

struct Daemon {
    launch: AgentLaunch,
    state: PathBuf,
    socket: PathBuf,
    /// What the running daemon was started with.
    started_with: Option<(AgentLaunch, Option<BinId>)>,
    /// A `retire` call is out.
    retiring: bool,
    log: Arc<Mutex<LogFile>>,
    /// The `hive bash-daemon` child: phase, backoff, stop ladder.
    child: Supervised,
    /// The agent runs, so the daemon should.
    wanted: bool,
}

/// The answer of the daemon of agent `name` with pid `pid` to `retire`.
struct Retired {
    name: String,
    pid: u32,
    answer: Result<RetireReply, String>,
}

struct Sup {
    s: UpSettings,
    /// The broker, which an isolated daemon's credential is handed to.
    hub: FleetTx,
    daemons: BTreeMap<String, Daemon>,
    exited_tx: Sender<Exited>,
    exited: Receiver<Exited>,
    retired_tx: Sender<Retired>,
    retired: Receiver<Retired>,
}

impl Sup {
    fn new(s: UpSettings, hub: FleetTx) -> Sup {
        let (exited_tx, exited) = unbounded();
        let (retired_tx, retired) = unbounded();
        Sup {
            s,
            hub,
            daemons: BTreeMap::new(),
            exited_tx,
            exited,
            retired_tx,
            retired,
        }
    }

    fn run(mut self, rx: Receiver<BashCmd>) {
        loop {
            let timer = self.next_deadline().map_or_else(never, at);
            select! {
                recv(rx) -> cmd => match cmd {
                    Ok(cmd) => self.handle(cmd),
                    Err(_) => return self.stop_all(),
                },
                recv(self.exited) -> e => {
                    if let Ok(e) = e {
                        self.on_exited(&e);
                    }
                }
                recv(self.retired) -> r => {
                    if let Ok(r) = r {
                        self.on_retired(r);
                    }
                }
                recv(timer) -> _ => self.on_deadlines(),
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        child::next_deadline(self.daemons.values().map(|d| &d.child))
    }

    fn handle(&mut self, cmd: BashCmd) {
        match cmd {
            BashCmd::Keep {
                name,
                launch,
                state,
                socket,
            } => {
                let d = match self.daemons.get_mut(&name) {
                    Some(d) => {
                        d.launch = launch;
                        d.state = state;
                        d.socket = socket;
                        d
                    }
                    None => {
                        let log = LogFile::open(
                            self.s.data.join("logs").join(log_name(&name)),
                            self.s.log_max_bytes,
                            self.s.log_keep,
                        );
                        self.daemons.entry(name.clone()).or_insert(Daemon {
                            launch,
                            state,
                            socket,
                            started_with: None,
                            retiring: false,
                            log: Arc::new(Mutex::new(log)),
                            child: Supervised::new(
                                format!("the bash-task daemon of {name}"),
                                Timing::of(&self.s),
                            ),
                            wanted: true,
                        })
                    }
                };
                d.wanted = true;
                // A daemon in backoff keeps its wait; a stopping one starts
                // again once it has exited; a running one on another binary
                // or launch is asked to retire.
                match d.child.phase() {
                    Phase::Stopped => self.spawn(&name),
                    Phase::Running(child) => {
                        let now = (d.launch.clone(), bin_id(&d.launch.exe));
                        if d.started_with.as_ref() != Some(&now) && !d.retiring {
                            let pid = child.id();
                            d.retiring = ask_to_retire(
                                &name,
                                pid,
                                d.socket.clone(),
                                self.retired_tx.clone(),
                            );
                        }
                    }
                    _ => {}
                }
            }
            BashCmd::Stop { name } => self.stop(&name),
        }
    }

    /// SIGTERM to `name`'s daemon: it kills its tasks, records them and exits.
    fn stop(&mut self, name: &str) {
        let Some(d) = self.daemons.get_mut(name) else {
            return;
        };
        d.wanted = false;
        if d.child.is_running() {
            log::info!("stopping the bash-task daemon of {name}");
        }
        d.child.stop();
    }

    /// A running daemon answered `retire`: retired, it is exiting and starts
    /// again at once onto the current binary and launch; else it goes on.
    fn on_retired(&mut self, r: Retired) {
        let Some(d) = self.daemons.get_mut(&r.name) else {
            return;
        };
        d.retiring = false;
        let name = &r.name;
        match r.answer {
            Ok(RetireReply { retired: true, .. }) => {
                if !d.child.is_running() || d.child.pid() != Some(r.pid) {
                    return;
                }
                log::info!(
                    "the bash-task daemon of {name} had no task: restarting it onto the \
                     current binary and config"
                );
                d.child.exiting();
            }
            Ok(RetireReply { running, .. }) => log::info!(
                "the bash-task daemon of {name} keeps its binary and config: {running} task(s) \
                 run; it takes the new ones when it next starts"
            ),
            Err(e) => log::warn!(
                "the bash-task daemon of {name} keeps its binary and config (retire: {e})"
            ),
        }
    }

    fn spawn(&mut self, name: &str) {
        let Some(d) = self.daemons.get_mut(name) else {
            return;
        };
        match spawn_child(name, d, &self.hub) {
            Ok(child) => {
                // Unwatched, its exit would never be seen: it is stopped now
                // and tried again after backoff.
                match d
                    .child
                    .run(child, format!("wait-{name}-bash"), name, &self.exited_tx)
                {
                    Ok(pid) => {
                        log::info!("started the bash-task daemon of {name} (pid {pid})");
                        d.started_with = Some((d.launch.clone(), bin_id(&d.launch.exe)));
                        d.retiring = false;
                    }
                    Err(e) => log::error!("cannot watch the bash-task daemon of {name}: {e}"),
                }
            }
            Err(e) => {
                log::error!("cannot start the bash-task daemon of {name}: {e}");
                d.child.back_off();
            }
        }
    }

    /// `hive up` stops: every daemon gets SIGTERM (each kills and records its
    /// tasks), what is left after the grace is killed.
    fn stop_all(mut self) {
        let names: Vec<String> = self.daemons.keys().cloned().collect();
        for name in &names {
            self.stop(name);
        }
        let (exited, grace) = (self.exited.clone(), self.s.stop_grace);
        // Dropping what is left reaps it.
        drop(child::stop_all(&mut self, &exited, grace));
    }
}

impl Owner for Sup {
    fn children(&mut self) -> Box<dyn Iterator<Item = &mut Supervised> + '_> {
        Box::new(self.daemons.values_mut().map(|d| &mut d.child))
    }

    /// Reaps the daemon of `e` if it is the one that exited: a running one is
    /// restarted after backoff, a stopped one stays stopped unless its agent
    /// was started again meanwhile.
    fn on_exited(&mut self, e: &Exited) {
        let Some(d) = self.daemons.get_mut(&e.name) else {
            return;
        };
        let name = &e.name;
        match d.child.on_exit(e.pid) {
            // It retired (its exit came before the answer): start it anew.
            Some(Ended::Crashed { clean: true, .. }) if d.retiring => {
                log::info!("the bash-task daemon of {name} retired; starting it anew");
                d.retiring = false;
                self.spawn(name);
            }
            Some(Ended::Crashed { status, up, .. }) => {
                let wait = d.child.after_crash(up);
                log::warn!(
                    "the bash-task daemon of {name} exited ({status}) after {up:?}; restarting \
                     it in {wait:?} (see logs/{})",
                    log_name(name)
                );
            }
            Some(Ended::Stopped { status }) => {
                log::info!("the bash-task daemon of {name} stopped ({status})");
                if d.wanted {
                    d.child.reset_failures();
                    self.spawn(name);
                }
            }
            None => {}
        }
    }

    fn on_deadlines(&mut self) {
        let now = Instant::now();
        let due: Vec<String> = self
            .daemons
            .iter_mut()
            .filter_map(|(name, d)| d.child.on_deadline(now).then(|| name.clone()))
            .collect();
        for name in due {
            self.spawn(&name);
        }
    }
}

/// Sends `retire` to the daemon on `socket` and reads its answer.
fn retire(socket: &std::path::Path) -> Result<RetireReply, String> {
    const PEER: &str = "the bash task daemon";
    let req = Request::Retire {};
    let line = serde_json::to_string(&req).map_err(|e| e.to_string())?;
    let mut conn = Conn::connect(socket, PEER).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let answer = conn
        .exchange(&line, req.op(), None)
        .map_err(|e| e.to_string())?;
    lines::decode(&answer, PEER, "retire").map_err(|e| e.to_string())
}

/// Asks the daemon of agent `name` (pid `pid`) on `socket` to retire, on a
/// thread of its own; the answer goes to `tx`. False when the thread could not
/// be started (the daemon goes on as it is).
fn ask_to_retire(name: &str, pid: u32, socket: PathBuf, tx: Sender<Retired>) -> bool {
    let who = name.to_string();
    let spawned = std::thread::Builder::new()
        .name("bash-retire".into())
        .spawn(move || {
            let answer = retire(&socket);
            let _ = tx.send(Retired {
                name: who,
                pid,
                answer,
            });
        });
    match spawned {
        Ok(_) => true,
        Err(e) => {
            log::warn!("cannot ask the bash-task daemon of {name} to retire: {e}");
            false
        }
    }
}

/// Starts `hive bash-daemon` for agent `name` on its state dir.
/// An isolated daemon gets a broker credential of its own (issue 40): its
/// `report_tasks` is taken only through it.
fn spawn_child(name: &str, d: &Daemon, hub: &FleetTx) -> Result<child::Proc, String> {
    let args: Vec<OsString> = vec![
        "bash-daemon".into(),
        "--state-dir".into(),
        d.state.clone().into(),
    ];
    let credential = match &d.launch.sandbox {
        Some(_) => Some(child::credential(
            hub,
            name,
            crate::proto::access::Via::BashDaemon,
        )?),
        None => None,
    };
    let fds: Vec<(&str, RawFd)> = credential
        .iter()
        .map(|c| (CREDENTIAL_FD_VAR, c.as_raw_fd()))
        .collect();
    let spawned = d.launch.start(args, &fds, &[]);
    drop(credential);
    let spawned =
        spawned.map_err(|e| format!("cannot run {} bash-daemon: {e}", d.launch.exe.display()))?;
    Ok(child::log_output(spawned, &d.log))
}

#[cfg(test)]
mod tests {
    use crate::proto::ident::check_name;

    /// No daemon's log is an agent's own (`NAME.log`): the stem of each is
    /// no agent name, also next to the agents whose logs they once were.
    #[test]
    fn a_daemon_log_is_never_an_agent_log() {
        for agent in ["x", "ruth", "x-bash", "bridge", "a1-b2"] {
            check_name(agent).unwrap();
            let log = super::log_name(agent);
            let stem = log.strip_suffix(".log").unwrap();
            assert!(
                check_name(stem).is_err(),
                "{log} could be agent {stem}'s log"
            );
        }
        let bridge = super::super::bridge::LOG_NAME;
        let stem = bridge.strip_suffix(".log").unwrap();
        assert!(
            check_name(stem).is_err(),
            "{bridge} could be agent {stem}'s log"
        );
    }
}
