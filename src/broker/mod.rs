//! `hive broker`: the host-side message broker. This module owns start-up and
//! shutdown — config, the store, the directories and sockets with their
//! permissions, and the signal thread — and hands every request to the hub
//! thread (`hub/`) through the accept threads (`accept.rs`, which also cap
//! the connections) and the connection threads (`conn.rs`). The sqlite
//! statements and schema versions live in `db.rs`, the port the supervisor of
//! `hive up` implements in `lifecycle.rs`, the changes hive makes to the fleet
//! file in `fleetfile.rs`. The wire contract is `proto`.

pub mod accept;
pub mod conn;
pub mod db;
pub mod fleetfile;
pub mod hub;
pub mod lifecycle;

pub use crate::proto::paths::{agent_socket, host_socket};

use crate::config::HiveConfig;
use accept::{AcceptCtx, Caps, ConnLimits};
use crossbeam_channel::{unbounded, Receiver, Sender};
use db::{Db, Durability};
use hub::{Hub, HubMsg, HubSettings, Identity};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::Arc;

/// Where the broker keeps its store and sockets, and what it serves (from
/// `hive broker`'s flags, or set by `hive up`).
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerSettings {
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
    pub agents: Vec<String>,
    pub config: Option<PathBuf>,
    pub durability: Durability,
}

/// Builds the hive's config from `--config` and `--agents`.
pub fn load_config(args: &BrokerSettings) -> Result<HiveConfig, String> {
    let mut cfg = match &args.config {
        Some(p) => HiveConfig::load(p)?,
        None => HiveConfig::default(),
    };
    for name in &args.agents {
        if cfg.agent(name).is_none() {
            cfg.agents.push(crate::config::AgentConfig::named(name));
        }
    }
    cfg.validate().map_err(|e| format!("--agents: {e}"))?;
    if cfg.agents.is_empty() {
        return Err("no agents: pass --agents a,b or --config FILE with an agents list".into());
    }
    Ok(cfg)
}

/// Creates `path` and its missing parents with `mode`, whatever the umask;
/// directories that exist already keep theirs.
pub(crate) fn create_dirs(path: &Path, mode: u32) -> std::io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dirs(parent, mode)?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates a directory the broker owns (with missing parents) and gives it
/// `mode`, whether it was there or not.
fn create_dir(path: &Path, mode: u32) -> Result<(), String> {
    create_dirs(path, mode)
        .and_then(|_| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
        .map_err(|e| format!("cannot create directory {}: {e}", path.display()))
}

/// Binds a socket, refusing to steal one a live broker is serving.
fn bind(path: &Path, uid: Option<u32>, gid: Option<u32>) -> Result<UnixListener, String> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(format!(
                "another broker is already listening on {}; stop it first",
                path.display()
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::chown(path, uid, gid).map_err(|e| {
            format!(
                "cannot give socket {} to uid {uid:?} gid {gid:?}: {e} (the broker must run as root to do that)",
                path.display()
            )
        })?;
    }
    let mode = if gid.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set permissions of {}: {e}", path.display()))?;
    Ok(listener)
}

/// Why `hive broker` stopped with an error.
#[derive(Debug)]
pub enum BrokerError {
    /// The config or `--agents` is wrong: a usage error (exit status 2).
    Config(String),
    /// Anything else: sockets, the store, threads (exit status 1).
    Run(String),
}

impl From<String> for BrokerError {
    fn from(s: String) -> BrokerError {
        BrokerError::Run(s)
    }
}

/// What whoever runs the broker gives it besides its arguments: the lifecycle
/// port of `hive up` (its supervisor and the agents' logs) and the fleet file
/// approvals write to. Plain `hive broker` has no supervisor and no logs, and
/// the lifecycle and log tools answer an error saying so.
pub struct BrokerDeps {
    /// The supervisor's channel (`lifecycle::LifecycleCmd`).
    pub lifecycle: Option<Sender<lifecycle::LifecycleCmd>>,
    /// The fleet file approvals write to.
    pub config_path: Option<PathBuf>,
    /// The agents' supervised logs (`get_logs`).
    pub logs: Option<Arc<dyn lifecycle::LogTail>>,
}

/// How long a lifecycle call waits for the supervisor.
pub const SUPERVISOR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A running broker: its hub thread and sockets. [`BrokerHandle::stop`] removes
/// the sockets, ends every parked long-poll and stops the hub.
pub struct BrokerHandle {
    hub_tx: Sender<HubMsg>,
    hub_thread: Option<std::thread::JoinHandle<()>>,
    stop_tx: Option<Sender<()>>,
    listeners: Arc<Listeners>,
    stopped: Vec<String>,
}

/// Binds agent sockets and starts their accept threads; shared with the hub so a
/// spawned agent gets its socket without a broker restart.
pub struct Listeners {
    run_dir: PathBuf,
    hub_tx: Sender<HubMsg>,
    stop_rx: Receiver<()>,
    ids: Arc<AtomicU64>,
    paths: std::sync::Mutex<Vec<PathBuf>>,
    limits: ConnLimits,
    /// Open connections on every agent socket together.
    agents_open: Arc<AtomicUsize>,
}

impl Listeners {
    fn listen(&self, listener: UnixListener, who: Identity, path: PathBuf) -> Result<(), String> {
        let caps = match who {
            Identity::Operator => Caps::host(&self.limits),
            Identity::Agent(_) => Caps::agent(&self.limits, &self.agents_open),
        };
        let ctx = AcceptCtx {
            who: who.clone(),
            caps,
            idle: self.limits.idle,
            hub: self.hub_tx.clone(),
            stop: self.stop_rx.clone(),
            ids: self.ids.clone(),
        };
        std::thread::Builder::new()
            .name(format!("accept-{}", who.name()))
            .spawn(move || accept::serve_socket(listener, ctx))
            .map_err(|e| format!("cannot start an accept thread: {e}"))?;
        if let Ok(mut p) = self.paths.lock() {
            p.push(path);
        }
        Ok(())
    }

    /// Binds the socket of an agent and starts serving it. `RUN/agents` and
    /// `RUN/agents/NAME` let everyone through (0755), so a harness running as
    /// the socket's `socket_uid` reaches it; the socket's own mode decides who
    /// may connect.
    pub fn add_agent(&self, a: &crate::config::AgentConfig) -> Result<(), String> {
        let path = agent_socket(&self.run_dir, &a.name);
        let dir = path.parent().unwrap_or(&self.run_dir).to_path_buf();
        create_dir(&self.run_dir.join("agents"), 0o755)?;
        create_dir(&dir, 0o755)?;
        let l = bind(&path, a.socket_uid, a.socket_gid)?;
        self.listen(l, Identity::Agent(a.name.clone()), path)
    }
}

impl BrokerHandle {
    /// The hub's channel, for in-process senders (the supervisor's events).
    pub fn hub(&self) -> Sender<HubMsg> {
        self.hub_tx.clone()
    }

    /// The agents kept stopped (`hive stop`, the `kill` tool) when the broker
    /// started: a supervisor leaves them stopped until they are started.
    pub fn stopped_agents(&self) -> &[String] {
        &self.stopped
    }

    /// Removes the sockets, ends the long-polls, stops the hub and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Ok(paths) = self.listeners.paths.lock() {
            for p in paths.iter() {
                let _ = std::fs::remove_file(p);
            }
        }
        drop(self.stop_tx.take());
        // Accept threads hold hub senders until the process exits, so the hub is
        // told to stop explicitly; it closes the store as it returns.
        let _ = self.hub_tx.send(HubMsg::Shutdown);
        if let Some(t) = self.hub_thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BrokerHandle {
    fn drop(&mut self) {
        if self.hub_thread.is_some() {
            self.shutdown();
        }
    }
}

/// Starts the broker in this process: store, sockets, hub and accept threads.
/// The caller owns signals and calls [`BrokerHandle::stop`].
pub fn start(
    args: &BrokerSettings,
    cfg: HiveConfig,
    deps: BrokerDeps,
) -> Result<BrokerHandle, String> {
    // Everything the broker creates (store, reminder files, sockets) is private
    // unless a group is configured for a socket.
    crate::sys::set_umask(0o077);
    create_dir(&args.state_dir, 0o700)?;
    create_dir(&args.run_dir, 0o755)?;
    let db_path = args.state_dir.join(db::FILE);
    let db = Db::open(&db_path, args.durability)?;
    let stopped = db.stopped_agents().map_err(|e| {
        format!(
            "cannot read the stopped agents from {}: {e}",
            db_path.display()
        )
    })?;
    // The store and its journal are private whatever the umask was.
    for suffix in ["", "-wal", "-shm"] {
        let mut p = db_path.clone().into_os_string();
        p.push(suffix);
        let p = PathBuf::from(p);
        if p.exists() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("cannot make {} private: {e}", p.display()))?;
        }
    }
    let nofile = crate::sys::nofile_limit()
        .map(|(soft, _)| soft)
        .map_err(|e| format!("cannot read the descriptor limit: {e}"))?;
    let env = crate::sys::env::Env::process();
    let limits = ConnLimits::read(nofile, cfg.agents.len(), &env)?;

    let host = host_socket(&args.run_dir);
    let host_listener = bind(&host, None, cfg.operator_gid)?;
    let max_pending_timers = env.num(
        "HIVE_REMIND_MAX_PENDING_PER_AGENT",
        crate::proto::limits::DEFAULT_MAX_PENDING_TIMERS,
    )?;
    let names: Vec<String> = cfg.agents.iter().map(|a| a.name.clone()).collect();
    let agents = cfg.agents.clone();
    let (hub_tx, hub_rx) = unbounded::<HubMsg>();
    // Dropping `stop_tx` ends every parked long-poll at once.
    let (stop_tx, stop_rx) = unbounded::<()>();
    let listeners = Arc::new(Listeners {
        run_dir: args.run_dir.clone(),
        hub_tx: hub_tx.clone(),
        stop_rx,
        ids: Arc::new(AtomicU64::new(1)),
        paths: std::sync::Mutex::new(Vec::new()),
        limits,
        agents_open: Arc::new(AtomicUsize::new(0)),
    });
    let hub = Hub::new(
        db,
        cfg,
        HubSettings {
            state_dir: args.state_dir.clone(),
            hyperhive_rev: crate::proto::HYPERHIVE_REV.into(),
            max_pending_timers,
            lifecycle: deps.lifecycle,
            supervisor_timeout: SUPERVISOR_TIMEOUT,
            config_path: deps.config_path,
            logs: deps.logs,
            listeners: Some(listeners.clone()),
        },
    );
    let hub_thread = std::thread::Builder::new()
        .name("hub".into())
        .spawn(move || hub.run(hub_rx))
        .map_err(|e| format!("cannot start the hub thread: {e}"))?;
    let handle = BrokerHandle {
        hub_tx,
        hub_thread: Some(hub_thread),
        stop_tx: Some(stop_tx),
        listeners: listeners.clone(),
        stopped,
    };
    listeners.listen(host_listener, Identity::Operator, host.clone())?;
    for a in &agents {
        listeners.add_agent(a)?;
    }
    log::info!(
        "connection limits: {} per agent socket, {} on all agent sockets, {} on the host socket \
         (descriptor limit {nofile}); connections idle for {} s are closed",
        limits.per_agent,
        limits.agents,
        limits.host,
        limits.idle.as_secs()
    );
    log::info!(
        "broker ready: host socket {}, agents {} under {}",
        host.display(),
        names.join(","),
        args.run_dir.join("agents").display()
    );
    Ok(handle)
}

/// Runs the broker until SIGTERM, SIGINT or SIGHUP (a second one exits at once).
pub fn run(args: BrokerSettings) -> Result<(), BrokerError> {
    let cfg = load_config(&args).map_err(BrokerError::Config)?;
    let signals = crate::sys::signals()?;
    let names: Vec<String> = cfg.agents.iter().map(|a| a.name.clone()).collect();
    let handle = start(
        &args,
        cfg,
        BrokerDeps {
            lifecycle: None,
            config_path: args.config.clone(),
            logs: None,
        },
    )?;
    eprintln!(
        "hive broker: serving {} agent(s) [{}]; host socket {}",
        names.len(),
        names.join(", "),
        host_socket(&args.run_dir).display()
    );
    let _ = signals.recv();
    log::info!("stopping the broker");
    handle.stop();
    Ok(())
}
