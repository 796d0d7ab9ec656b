//! `hive broker`: the host-side message broker. This module owns start-up and
//! shutdown — config, the store, the directories and sockets with their
//! permissions (`bind.rs`: the host socket, one per agent, and the Matrix
//! bridge's for a hive in a swarm) — and starts the hub thread, which serves
//! every socket itself (`sockets.rs`: one poll loop, under the caps of
//! `accept.rs`) and decides every request (`hub/`). The sqlite statements and
//! schema versions live in `db/` (by concern, as `hub/` is), the port the supervisor of `hive up`
//! implements in `lifecycle.rs` (the changes hive makes to the fleet file
//! are `config::fleetfile`, beside the reader). The wire contract is `proto`.

pub mod accept;
pub mod bind;
pub mod checkpoint;
pub mod db;
pub mod hub;
pub mod lifecycle;
pub mod notify;
pub mod prune;
pub mod sockets;

pub use crate::proto::paths::{agent_socket, bridge_socket, host_socket};

use crate::config::HiveConfig;
use accept::ConnLimits;
use bind::{bind, create_dir};
use crossbeam_channel::Sender;
use db::{Db, Durability, Store};
use hub::{Hub, HubMsg, HubSettings, HubTx, Identity};
use sockets::{Listening, Loop};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
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
    /// `hive up`'s span exporter (`export_spans`); None under plain `hive broker`.
    pub spans: Option<crate::telemetry::Exporter>,
}

/// How long a lifecycle call waits for the supervisor.
pub const SUPERVISOR_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A running broker: its hub thread, which serves the sockets.
/// [`BrokerHandle::stop`] removes the sockets, ends every parked long-poll and
/// stops the hub.
pub struct BrokerHandle {
    hub_tx: HubTx,
    hub_thread: Option<std::thread::JoinHandle<()>>,
    /// The prune thread; stopped before the hub.
    prune: Option<prune::Handle>,
    /// The notification sender (idle without a destination); stopped
    /// before the hub.
    notify: Option<notify::Handle>,
    stopped: Vec<String>,
}

impl BrokerHandle {
    /// The hub's channel, for in-process senders (the supervisor's events).
    pub fn hub(&self) -> HubTx {
        self.hub_tx.clone()
    }

    /// The fleet's narrow sender to the hub (`hive up`'s supervisors).
    pub fn fleet(&self) -> crate::broker::lifecycle::FleetTx {
        let hub = self.hub_tx.clone();
        crate::broker::lifecycle::FleetTx::new(move |e| {
            hub.send(HubMsg::FromFleet(Box::new(e))).is_ok()
        })
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
        // Between two batches at most.
        self.prune.take();
        self.notify.take();
        // The hub's loop removes the socket files, answers the parked
        // long-polls and closes the store as it returns.
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

/// Starts the broker in this process: store, sockets and the hub thread.
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
    let mut db = Db::open(&db_path, args.durability)?;
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
    // Checkpoints run on a thread of their own, never inside a request; a
    // broker that cannot start that thread still serves, checkpointing in
    // its commits as sqlite does by itself.
    if let Err(e) = checkpoint::start(&mut db, &db_path) {
        log::warn!("{e}; the store checkpoints in its commits instead");
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
    let retention = cfg.retention();
    let schedule = prune::Schedule {
        messages_days: retention.messages_days(),
        spend_days: retention.spend_days(),
        every: env.secs("HIVE_PRUNE_SECS", prune::DEFAULT_EVERY_SECS)?,
    };
    if schedule.every.is_zero() {
        return Err("HIVE_PRUNE_SECS: at least 1 second between two prune passes".into());
    }
    // The bridge's own socket, for a hive in a swarm: only the bridge's
    // commands are accepted there (mode 0600, the broker's user).
    let bridge_listener = match &cfg.matrix {
        Some(_) => {
            let path = bridge_socket(&args.run_dir);
            Some((bind(&path, None, None)?, path))
        }
        None => None,
    };
    // Notifications: the destinations' files are read now (a bad one is a
    // start error naming it), their queues registered before the hub can
    // write an event, and the sender started on a connection of its own.
    let notify = {
        let base = args.config.as_deref().and_then(|p| p.parent());
        let block = notify::Reconfig::read(cfg.notify.as_deref(), base, cfg.hive_name.as_deref())?;
        let s = notify::Settings::read(block.hive, block.give_up_days, &env)?;
        notify::start(&db_path, args.durability, block.dests, s)?
    };
    let names: Vec<String> = cfg.agents.iter().map(|a| a.name.clone()).collect();
    let mut listening = vec![Listening {
        listener: host_listener,
        who: Identity::Operator,
        path: host.clone(),
    }];
    if let Some((listener, path)) = bridge_listener {
        listening.push(Listening {
            listener,
            who: Identity::Bridge,
            path,
        });
    }
    for a in &cfg.agents {
        let (listener, path) = bind::agent_listener(&args.run_dir, a)?;
        listening.push(Listening {
            listener,
            who: Identity::Agent(a.name.clone()),
            path,
        });
    }
    let (hub_tx, hub_rx) =
        hub::channel().map_err(|e| format!("cannot make the hub's wake-up socket: {e}"))?;
    let settings = HubSettings {
        state_dir: args.state_dir.clone(),
        hyperhive_rev: crate::proto::HYPERHIVE_REV.into(),
        max_pending_timers,
        lifecycle: deps.lifecycle,
        supervisor_timeout: SUPERVISOR_TIMEOUT,
        config_path: deps.config_path,
        logs: deps.logs,
        run_dir: Some(args.run_dir.clone()),
        notify: Some(notify.control()),
        spans: deps.spans,
    };
    // The hub holds statements that borrow the store, so both live in the
    // frame of the hub thread; it says whether it could start before it
    // serves.
    let (started_tx, started_rx) = crossbeam_channel::bounded::<Result<(), String>>(1);
    let loop_tx = hub_tx.clone();
    let hub_thread = std::thread::Builder::new()
        .name("hub".into())
        .spawn(move || {
            let store = match Store::new(&db) {
                Ok(store) => store,
                Err(e) => {
                    let _ = started_tx.send(Err(format!("cannot prepare the message store: {e}")));
                    return;
                }
            };
            let hub = Hub::new(store, cfg, settings);
            let mut serve = match Loop::new(hub, hub_rx, loop_tx, limits) {
                Ok(serve) => serve,
                Err(e) => {
                    let _ = started_tx.send(Err(format!(
                        "cannot wait for the broker's sockets (epoll): {e}"
                    )));
                    return;
                }
            };
            for l in listening {
                if let Err(e) = serve.listen(l) {
                    let _ = started_tx.send(Err(e));
                    return;
                }
            }
            let _ = started_tx.send(Ok(()));
            serve.run()
        })
        .map_err(|e| format!("cannot start the hub thread: {e}"))?;
    let started = started_rx
        .recv()
        .unwrap_or_else(|_| Err("the hub thread ended before it started serving".into()));
    if let Err(e) = started {
        let _ = hub_thread.join();
        return Err(e);
    }
    // Pruning runs on a connection and a thread of its own; a broker that
    // cannot start them still serves, and keeps every row.
    let prune = match prune::start(&db_path, args.durability, schedule, hub_tx.clone()) {
        Ok(p) => Some(p),
        Err(e) => {
            log::error!("{e}; nothing is pruned until the broker starts again");
            None
        }
    };
    let handle = BrokerHandle {
        hub_tx,
        hub_thread: Some(hub_thread),
        prune,
        notify: Some(notify),
        stopped,
    };
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
            spans: None,
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
