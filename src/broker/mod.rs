//! `hive broker`: the host-side message broker. This module owns start-up and
//! shutdown — config, the store, the sockets with their permissions, the accept
//! threads and the signal thread — and hands every request to the hub thread
//! (`hub.rs`) through the connection threads (`conn.rs`). The sqlite statements
//! live in `db.rs`.

pub mod conn;
pub mod db;
pub mod hub;

use crate::config::HiveConfig;
use crossbeam_channel::{unbounded, Receiver, Sender};
use db::{Db, Durability};
use hub::{Hub, HubMsg, HubSettings, Identity};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Everything `hive broker` is told on its command line.
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerArgs {
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
    pub agents: Vec<String>,
    pub config: Option<PathBuf>,
    pub durability: Durability,
}

/// The revision this binary was built from.
pub const HYPERHIVE_REV: &str = env!("HYPERHIVE_REV");

/// Where the socket of `agent` lives under `run_dir`.
pub fn agent_socket(run_dir: &Path, agent: &str) -> PathBuf {
    run_dir.join("agents").join(agent).join("mcp.sock")
}

/// Where the operator's socket lives under `run_dir`.
pub fn host_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("host.sock")
}

/// Builds the hive's config from `--config` and `--agents`.
pub fn load_config(args: &BrokerArgs) -> Result<HiveConfig, String> {
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

fn create_dir(path: &Path, mode: u32) -> Result<(), String> {
    std::fs::create_dir_all(path)
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

fn accept_loop(
    listener: UnixListener,
    who: Identity,
    hub: Sender<HubMsg>,
    stop: Receiver<()>,
    ids: Arc<AtomicU64>,
) {
    for stream in listener.incoming() {
        match stream {
            Ok(stream) => {
                let conn = ids.fetch_add(1, Ordering::Relaxed);
                let (who, hub, stop) = (who.clone(), hub.clone(), stop.clone());
                let spawned = std::thread::Builder::new()
                    .name(format!("conn-{conn}"))
                    .spawn(move || conn::serve(stream, who, conn, hub, stop));
                if let Err(e) = spawned {
                    log::error!("cannot start a connection thread: {e}");
                }
            }
            Err(e) => {
                log::warn!("accept on the socket of {} failed: {e}", who.name());
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
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

/// Runs the broker until SIGTERM, SIGINT or SIGHUP.
pub fn run(args: BrokerArgs) -> Result<(), BrokerError> {
    let cfg = load_config(&args).map_err(BrokerError::Config)?;
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    // Everything the broker creates (store, reminder files, sockets) is private
    // unless a group is configured for a socket.
    unsafe { libc::umask(0o077) };
    create_dir(&args.state_dir, 0o700)?;
    create_dir(&args.run_dir, 0o755)?;
    let db = Db::open(&args.state_dir.join("broker.db"), args.durability)?;

    let mut listeners = Vec::new();
    let host = host_socket(&args.run_dir);
    listeners.push((
        bind(&host, None, cfg.operator_gid)?,
        Identity::Operator,
        host,
    ));
    for a in &cfg.agents {
        let path = agent_socket(&args.run_dir, &a.name);
        let dir = path.parent().unwrap_or(&args.run_dir).to_path_buf();
        create_dir(&dir, 0o755)?;
        listeners.push((
            bind(&path, a.socket_uid, a.socket_gid)?,
            Identity::Agent(a.name.clone()),
            path,
        ));
    }

    let remind_max_pending = std::env::var("HIVE_REMIND_MAX_PENDING_PER_AGENT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let names: Vec<String> = cfg.agents.iter().map(|a| a.name.clone()).collect();
    let hub = Hub::new(
        db,
        cfg,
        HubSettings {
            state_dir: args.state_dir.clone(),
            hyperhive_rev: HYPERHIVE_REV.into(),
            remind_max_pending,
        },
    );
    let (hub_tx, hub_rx) = unbounded::<HubMsg>();
    let hub_thread = std::thread::Builder::new()
        .name("hub".into())
        .spawn(move || hub.run(hub_rx))
        .map_err(|e| format!("cannot start the hub thread: {e}"))?;

    // Dropping `stop_tx` ends every parked long-poll at once.
    let (stop_tx, stop_rx) = unbounded::<()>();
    let ids = Arc::new(AtomicU64::new(1));
    let mut paths = Vec::new();
    for (listener, who, path) in listeners {
        let (hub, stop, ids) = (hub_tx.clone(), stop_rx.clone(), ids.clone());
        std::thread::Builder::new()
            .name(format!("accept-{}", who.name()))
            .spawn(move || accept_loop(listener, who, hub, stop, ids))
            .map_err(|e| format!("cannot start an accept thread: {e}"))?;
        paths.push(path);
    }
    log::info!(
        "broker ready: host socket {}, agents {} under {}",
        host_socket(&args.run_dir).display(),
        names.join(","),
        args.run_dir.join("agents").display()
    );
    eprintln!(
        "hive broker: serving {} agent(s) [{}]; host socket {}",
        names.len(),
        names.join(", "),
        host_socket(&args.run_dir).display()
    );

    let sig = signals.forever().next();
    log::info!("signal {sig:?}: stopping the broker");
    // A second signal while we clean up exits at once.
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            std::process::exit(130);
        }
    });
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    drop(stop_tx);
    // Accept threads hold hub senders until the process exits, so the hub is told
    // to stop explicitly; it closes the store as it returns.
    let _ = hub_tx.send(HubMsg::Shutdown);
    let _ = hub_thread.join();
    Ok(())
}
