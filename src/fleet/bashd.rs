//! `hive up`'s bash-task daemons: one `hive bash-daemon` child per running
//! agent, apart from its `hive serve`, so background tasks outlive a restart,
//! an update or a crash of the harness. The `bash-sup` thread owns every
//! daemon (a `sys::ProcessGroup`, its output in `DATA/logs/NAME-bash.log`),
//! started the way the agent is ([`AgentLaunch`]: same uid, environment, umask,
//! working dir and sandbox view, so a task sees what the agent sees and the
//! agent's sandbox reaches the daemon's socket in its own run dir). The
//! supervisor tells it, as closed [`BashCmd`]s, when an agent starts (keep its
//! daemon running) and when it is stopped for good (`hive stop`, the `kill`
//! tool, `hive up` stopping: the daemon gets SIGTERM, kills its tasks and
//! records them `interrupted`); a restart or update of the agent leaves it
//! alone. A daemon that exits by itself is restarted with the agents' capped
//! backoff. Its one `select!` waits on those commands, on the daemons' exits
//! (`wait-NAME-bash` reports, this thread reaps) and on the nearest deadline (a
//! restart, a stop's grace running out) and the answers of `retire`. When an
//! agent starts onto another binary or config than its running daemon has
//! (`hive update`, an approved change), the daemon is asked to `retire`: it
//! exits only when no task runs, and is started again at once onto the new
//! ones; with tasks running it goes on as it is, until it next starts. The
//! call runs on a short thread of its own (`bash-retire`), so this loop never
//! waits on a socket. Shaped like the Matrix bridge's supervision.

use super::logfile::{self, LogFile};
use super::supervisor::backoff;
use super::UpSettings;
use crate::proto::lines::{self, Conn};
use crate::sys::ProcessGroup;
use crossbeam_channel::{at, never, select, unbounded, Receiver, Sender};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};
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
    /// `hive ARGS…` as the agent runs it: in its sandbox when it has one, with
    /// its environment, stdin from /dev/null and stdout and stderr piped (for
    /// the log), SIGTERM when the spawning thread dies.
    pub fn command(&self, args: Vec<OsString>) -> Command {
        let mut cmd = match &self.sandbox {
            Some((iso, own)) => {
                let mut argv: Vec<OsString> = vec![self.exe.clone().into()];
                argv.extend(args);
                iso.spec(own, argv).command(&self.exe)
            }
            None => {
                let mut c = Command::new(&self.exe);
                c.args(args);
                c
            }
        };
        for key in &self.env_remove {
            cmd.env_remove(key);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        crate::sys::process::child_setup(&mut cmd, libc::SIGTERM, self.umask);
        cmd
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
    pub fn start(s: &UpSettings) -> Result<BashSup, String> {
        let (tx, rx) = unbounded();
        let sup = Sup::new(s.clone());
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

/// The log file of agent `name`'s daemon, under `DATA/logs`.
pub fn log_name(name: &str) -> String {
    format!("{name}-bash.log")
}

enum Phase {
    Running(ProcessGroup),
    Stopping {
        child: ProcessGroup,
        /// When the grace runs out (SIGKILL); `None` once it was sent.
        kill_at: Option<Instant>,
    },
    Stopped,
    /// Starts at this instant.
    Backoff(Instant),
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
    phase: Phase,
    /// The agent runs, so the daemon should.
    wanted: bool,
    started: Option<Instant>,
    failures: u32,
}

/// A daemon of agent `name` with pid `pid` has exited (not reaped yet).
struct Exited {
    name: String,
    pid: u32,
}

/// The answer of the daemon of agent `name` with pid `pid` to `retire`.
struct Retired {
    name: String,
    pid: u32,
    answer: Result<RetireReply, String>,
}

struct Sup {
    s: UpSettings,
    daemons: BTreeMap<String, Daemon>,
    exited_tx: Sender<Exited>,
    exited: Receiver<Exited>,
    retired_tx: Sender<Retired>,
    retired: Receiver<Retired>,
}

impl Sup {
    fn new(s: UpSettings) -> Sup {
        let (exited_tx, exited) = unbounded();
        let (retired_tx, retired) = unbounded();
        Sup {
            s,
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
        self.daemons
            .values()
            .filter_map(|d| match d.phase {
                Phase::Backoff(t) => Some(t),
                Phase::Stopping { kill_at, .. } => kill_at,
                _ => None,
            })
            .min()
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
                            phase: Phase::Stopped,
                            wanted: true,
                            started: None,
                            failures: 0,
                        })
                    }
                };
                d.wanted = true;
                // A daemon in backoff keeps its wait; a stopping one starts
                // again once it has exited; a running one on another binary
                // or launch is asked to retire.
                match &d.phase {
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
        let grace = self.s.stop_grace;
        let Some(d) = self.daemons.get_mut(name) else {
            return;
        };
        d.wanted = false;
        d.phase = match std::mem::replace(&mut d.phase, Phase::Stopped) {
            Phase::Running(child) => {
                log::info!("stopping the bash-task daemon of {name}");
                child.signal_leader(libc::SIGTERM);
                Phase::Stopping {
                    child,
                    kill_at: Some(Instant::now() + grace),
                }
            }
            Phase::Backoff(_) => Phase::Stopped,
            other => other,
        };
    }

    /// A running daemon answered `retire`: retired, it is exiting and starts
    /// again at once onto the current binary and launch; else it goes on.
    fn on_retired(&mut self, r: Retired) {
        let grace = self.s.stop_grace;
        let Some(d) = self.daemons.get_mut(&r.name) else {
            return;
        };
        d.retiring = false;
        let name = &r.name;
        match r.answer {
            Ok(RetireReply { retired: true, .. }) => {
                if !matches!(&d.phase, Phase::Running(c) if c.id() == r.pid) {
                    return;
                }
                log::info!(
                    "the bash-task daemon of {name} had no task: restarting it onto the \
                     current binary and config"
                );
                if let Phase::Running(child) = std::mem::replace(&mut d.phase, Phase::Stopped) {
                    d.phase = Phase::Stopping {
                        child,
                        kill_at: Some(Instant::now() + grace),
                    };
                }
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
        let wait = self.backoff(name);
        let exited = self.exited_tx.clone();
        let Some(d) = self.daemons.get_mut(name) else {
            return;
        };
        match spawn_child(name, d) {
            Ok(child) => {
                let pid = child.id();
                let who = name.to_string();
                if let Err(e) = child.on_exit(format!("wait-{name}-bash"), move || {
                    let _ = exited.send(Exited { name: who, pid });
                }) {
                    // Unwatched, its exit would never be seen: stop it now
                    // (dropping it kills and reaps it) and retry after backoff.
                    log::error!("cannot watch the bash-task daemon of {name}: {e}");
                    drop(child);
                    d.failures += 1;
                    d.phase = Phase::Backoff(Instant::now() + wait);
                    return;
                }
                log::info!("started the bash-task daemon of {name} (pid {pid})");
                d.started_with = Some((d.launch.clone(), bin_id(&d.launch.exe)));
                d.retiring = false;
                d.phase = Phase::Running(child);
                d.started = Some(Instant::now());
            }
            Err(e) => {
                log::error!("cannot start the bash-task daemon of {name}: {e}");
                d.failures += 1;
                d.phase = Phase::Backoff(Instant::now() + wait);
            }
        }
    }

    fn backoff(&self, name: &str) -> Duration {
        let failures = self.daemons.get(name).map_or(0, |d| d.failures);
        backoff(self.s.restart_base, self.s.restart_max, failures)
    }

    /// Reaps the daemon of `e` if it is the one that exited: a running one is
    /// restarted after backoff, a stopped one stays stopped unless its agent
    /// was started again meanwhile.
    fn on_exited(&mut self, e: &Exited) {
        let (stable, base, max) = (self.s.stable, self.s.restart_base, self.s.restart_max);
        let Some(d) = self.daemons.get_mut(&e.name) else {
            return;
        };
        let child = match &mut d.phase {
            Phase::Running(c) | Phase::Stopping { child: c, .. } if c.id() == e.pid => c,
            _ => return,
        };
        let (status, clean) = match child.try_wait() {
            Ok(Some(st)) => (st.to_string(), st.success()),
            Ok(None) => return,
            Err(err) => (format!("lost: {err}"), false),
        };
        let name = &e.name;
        match std::mem::replace(&mut d.phase, Phase::Stopped) {
            // It retired (its exit came before the answer): start it anew.
            Phase::Running(_) if d.retiring && clean => {
                log::info!("the bash-task daemon of {name} retired; starting it anew");
                d.retiring = false;
                let name = name.clone();
                self.spawn(&name);
            }
            Phase::Running(_) => {
                let up = d.started.map_or(Duration::ZERO, |t| t.elapsed());
                if up >= stable {
                    d.failures = 0;
                }
                let wait = backoff(base, max, d.failures);
                d.failures += 1;
                log::warn!(
                    "the bash-task daemon of {name} exited ({status}) after {up:?}; restarting \
                     it in {wait:?} (see logs/{})",
                    log_name(name)
                );
                d.phase = Phase::Backoff(Instant::now() + wait);
            }
            _ => {
                log::info!("the bash-task daemon of {name} stopped ({status})");
                if d.wanted {
                    d.failures = 0;
                    let name = name.clone();
                    self.spawn(&name);
                }
            }
        }
    }

    fn on_deadlines(&mut self) {
        let now = Instant::now();
        let names: Vec<String> = self.daemons.keys().cloned().collect();
        for name in names {
            let Some(d) = self.daemons.get_mut(&name) else {
                continue;
            };
            match &mut d.phase {
                Phase::Backoff(t) if now >= *t => {
                    d.phase = Phase::Stopped;
                    self.spawn(&name);
                }
                Phase::Stopping {
                    child,
                    kill_at: kill_at @ Some(_),
                } if kill_at.is_some_and(|t| now >= t) => {
                    log::warn!(
                        "the bash-task daemon of {name} did not stop within its grace; SIGKILL"
                    );
                    child.kill();
                    *kill_at = None;
                }
                _ => {}
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
        let end = Instant::now() + self.s.stop_grace + Duration::from_secs(1);
        loop {
            let stopping = self
                .daemons
                .values()
                .any(|d| matches!(d.phase, Phase::Stopping { .. }));
            if !stopping {
                break;
            }
            let timer = self.next_deadline().map_or_else(never, at);
            select! {
                recv(self.exited) -> e => {
                    if let Ok(e) = e {
                        self.on_exited(&e);
                    }
                }
                recv(timer) -> _ => self.on_deadlines(),
                recv(at(end)) -> _ => break,
            }
        }
        // Dropping what is left kills and reaps it.
    }
}

/// The daemon's answer to `{"op":"retire"}` (`bash::proto::RetireReply`,
/// read here on the shared transport: `fleet` sits above `bash` in the
/// layers, so it speaks the one line itself).
#[derive(Debug, Deserialize)]
struct RetireReply {
    retired: bool,
    #[serde(default)]
    running: usize,
}

/// The line `bash::proto::Request::Retire` is on the wire.
const RETIRE: &str = r#"{"op":"retire"}"#;

/// Sends `retire` to the daemon on `socket` and reads its answer.
fn retire(socket: &std::path::Path) -> Result<RetireReply, String> {
    const PEER: &str = "the bash task daemon";
    let mut conn = Conn::connect(socket, PEER).map_err(|e| e.to_string())?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let answer = conn
        .exchange(RETIRE, "retire", None)
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
fn spawn_child(name: &str, d: &Daemon) -> Result<ProcessGroup, String> {
    let args: Vec<OsString> = vec![
        "bash-daemon".into(),
        "--state-dir".into(),
        d.state.clone().into(),
    ];
    let mut cmd = d.launch.command(args);
    let mut child = ProcessGroup::spawn(&mut cmd)
        .map_err(|e| format!("cannot run {} bash-daemon: {e}", d.launch.exe.display()))?;
    if let Some(out) = child.child_mut().stdout.take() {
        logfile::pump(format!("log-{name}-bash-out"), out, d.log.clone());
    }
    if let Some(err) = child.child_mut().stderr.take() {
        logfile::pump(format!("log-{name}-bash-err"), err, d.log.clone());
    }
    Ok(child)
}
