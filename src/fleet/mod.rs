//! `hive up`: a whole hive in one command. Runs the broker in this process and a
//! supervisor thread (`supervisor.rs`) that keeps one `hive serve` child per
//! agent of the fleet file alive, with crash_watch (`watch.rs`) and rotated logs
//! (`logfile.rs`). The data dir holds everything: `DATA/broker.db` (the broker's
//! state dir is DATA), `DATA/run/` (sockets), `DATA/agents/NAME/{state,run,claude}` and
//! `DATA/logs/NAME.log`; each agent's bash-task daemon is a child of its own
//! (`bashd.rs`, logged to `DATA/logs/NAME.bash.log`). Each agent runs in a
//! sandbox that hides all of that but its own dirs (`isolation.rs`,
//! `sandbox.rs`). A fleet file with a `matrix` section also gets the Matrix
//! bridge, supervised by `bridge.rs` (its token in `DATA/matrix/`, its log
//! `DATA/logs/matrix.bridge.log`). The three supervisors (agents, bash-task daemons,
//! bridge) share one child's machinery, `child.rs`: its phase, restart backoff
//! and stop ladder. Documented in `docs/fleet.md` and `docs/swarm.md`.

pub mod bashd;
pub mod bridge;
pub mod child;
pub mod cli;
pub mod dashboard;
pub mod declared;
pub mod hostlimits;
pub mod isolation;
pub mod logfile;
pub mod pages;
pub mod proxy;
pub mod sandbox;
pub mod search;
pub mod supervisor;
pub mod watch;

use crate::broker::lifecycle::FleetEvent;
use crate::broker::lifecycle::LifecycleCmd;
use crate::broker::{self, db::Durability, BrokerDeps, BrokerSettings};
use crate::config::{AgentConfig, HiveConfig};
use crate::sys::env::Env;
use crossbeam_channel::unbounded;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use supervisor::Supervisor;

/// The agent `hive up` runs when no fleet file is given.
pub const DEFAULT_AGENT: &str = "ruth";

/// Everything the supervisor needs, resolved once at start.
#[derive(Debug, Clone)]
pub struct UpSettings {
    pub data: PathBuf,
    pub run_dir: PathBuf,
    pub config: Option<PathBuf>,
    /// The `hive` binary the agents run (this one).
    pub exe: PathBuf,
    pub restart_base: Duration,
    pub restart_max: Duration,
    /// Uptime after which a restarted agent's backoff starts over.
    pub stable: Duration,
    pub stop_grace: Duration,
    pub watch_interval: Duration,
    pub log_max_bytes: u64,
    pub log_keep: u32,
    /// The umask `hive up` was started with; the agents get it back (the broker
    /// part of this process runs with 077).
    pub child_umask: u32,
    /// How agents are sandboxed; `None` when they run unisolated.
    pub isolation: Option<isolation::Isolation>,
    /// `hive up`'s own environment names an Anthropic key or OAuth token,
    /// which every agent inherits (so each counts as logged in).
    pub inherited_login: bool,
    /// The hive's one origin and `/` (`http://127.0.0.1:7890/`, or
    /// `web.public_origin`): the links to the agents' pages and turns.
    pub origin: String,
}

impl UpSettings {
    /// The settings of `hive up` for `data` and the fleet file `config`, from
    /// `env` (`HIVE_UP_*`); read once at start.
    pub fn read(data: PathBuf, config: Option<PathBuf>, env: &Env) -> Result<UpSettings, String> {
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find the hive binary to run the agents: {e}"))?;
        Ok(UpSettings {
            run_dir: data.join("run"),
            data,
            config,
            exe,
            restart_base: env.millis("HIVE_UP_RESTART_BASE_MS", 1000)?,
            restart_max: env.millis("HIVE_UP_RESTART_MAX_MS", 60_000)?,
            stable: env.secs("HIVE_UP_STABLE_SECS", 60)?,
            stop_grace: env.millis("HIVE_UP_STOP_GRACE_MS", 10_000)?,
            watch_interval: env
                .millis("HIVE_UP_WATCH_MS", 2000)?
                .max(Duration::from_millis(50)),
            log_max_bytes: env.num("HIVE_UP_LOG_MAX_BYTES", 10 * 1024 * 1024)?,
            log_keep: env
                .parse("HIVE_UP_LOG_KEEP", "a whole number")?
                .unwrap_or(3),
            child_umask: crate::sys::umask(),
            isolation: None,
            inherited_login: ["ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"]
                .iter()
                .any(|k| env.get(k).is_some()),
            origin: format!("http://{}/", crate::config::DEFAULT_LISTEN),
        })
    }
}

fn absolute(p: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(p).map_err(|e| format!("cannot create {}: {e}", p.display()))?;
    p.canonicalize()
        .map_err(|e| format!("cannot resolve {}: {e}", p.display()))
}

/// Why `hive up` stopped with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpError {
    /// The homeserver refused the Matrix bridge's login (or its secret file
    /// cannot be read): fix the fleet file's `matrix` section (exit 2).
    MatrixLogin(String),
    /// Anything else (exit 1).
    Run(String),
}

impl From<String> for UpError {
    fn from(e: String) -> UpError {
        UpError::Run(e)
    }
}

/// The warning for a fleet file kept in a folder of other things (a project
/// folder): isolation hides that whole folder from every agent, which the
/// operator who ran `hive up --config hive.json` there rarely meant. `None`
/// when the fleet file is in the data dir or in a folder of its own.
fn hidden_folder(data: &Path, fleet: &Path) -> Option<String> {
    if fleet.starts_with(data) {
        return None;
    }
    let dir = fleet.parent()?;
    let mut others: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p != fleet && p != data && !data.starts_with(p))
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    if others.is_empty() {
        return None;
    }
    others.sort();
    let n = others.len();
    let shown = others
        .iter()
        .take(5)
        .map(|n| crate::proto::text::excerpt(n))
        .collect::<Vec<_>>()
        .join(", ");
    let more = if n > 5 {
        format!(" and {} more", n - 5)
    } else {
        String::new()
    };
    Some(format!(
        "agents cannot see {} — the fleet file's folder is hidden from every agent with all \
         {n} other entries in it ({shown}{more}). If agents should work there, move the fleet \
         file to {} and run hive up without --config (or into a folder of its own)",
        dir.display(),
        data.join("hive.json").display()
    ))
}

/// Runs a hive until SIGTERM or SIGINT: the broker, then the agents (and the
/// Matrix bridge); on the signal the agents stop first (each requeues its
/// inflight message), then the bridge, then the broker.
/// `data` is the data dir (`--data`), `config` the fleet file (`--config`).
pub fn run(data: &Path, config: Option<PathBuf>) -> Result<(), UpError> {
    let signals = crate::sys::signals()?;
    let data = absolute(data)?;
    // Without --config the hive's fleet file is DATA/hive.json, written with one
    // agent the first time, so approvals and the permissions tab have a file.
    let config_path = match config {
        Some(p) => p,
        None => {
            let p = data.join("hive.json");
            if !p.exists() {
                let cfg = HiveConfig {
                    agents: vec![AgentConfig::named(DEFAULT_AGENT)],
                    ..HiveConfig::default()
                };
                let text = serde_json::to_string_pretty(&cfg).map_err(|e| e.to_string())?;
                std::fs::write(&p, format!("{text}\n"))
                    .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
            }
            p
        }
    };
    let config_path = config_path
        .canonicalize()
        .map_err(|e| format!("cannot read the fleet file {}: {e}", config_path.display()))?;
    let cfg = HiveConfig::load(&config_path)?;
    if cfg.agents.is_empty() {
        return Err(UpError::Run(format!(
            "the fleet file {} lists no agents; add one to \"agents\"",
            config_path.display()
        )));
    }
    bridge::check_login(&cfg, &data).map_err(UpError::MatrixLogin)?;
    let env = Env::process();
    check_host_limits(&cfg, &env)?;
    let mut settings = UpSettings::read(data.clone(), Some(config_path.clone()), &env)?;
    settings.isolation = isolation::at_start(&settings.exe, &data, &config_path, &env)?;
    if settings.isolation.is_some() {
        if let Some(warning) = hidden_folder(&data, &config_path) {
            eprintln!("hive up: {warning}");
            log::warn!("{warning}");
        }
    }
    let config = Some(config_path);
    let mut notices = Vec::new();
    let dash_cfg = dashboard::DashConfig::for_hive(&env, cfg.web.as_ref(), &mut notices)?;
    for n in notices {
        eprintln!("hive up: {n}");
        log::warn!("{n}");
    }
    // The listener first: an address in use stops hive up before any agent
    // starts.
    let dash = dashboard::start(&data, broker::host_socket(&settings.run_dir), dash_cfg)?;
    settings.origin = dash.base_url();
    // Traces (issue 43): one exporter for the hive, fed by the harnesses
    // through the broker (`export_spans`); none without an endpoint.
    let telemetry =
        crate::telemetry::Config::resolve(&env, cfg.telemetry.as_deref()).map_err(UpError::Run)?;
    let spans = crate::telemetry::Exporter::start(
        &telemetry,
        crate::telemetry::otlp::Resource::new(
            &telemetry,
            &crate::telemetry::span::uuid4(),
            cfg.hive_name.as_deref(),
        ),
    )?;
    let (sup_tx, sup_rx) = unbounded::<LifecycleCmd>();
    let broker = broker::start(
        &BrokerSettings {
            state_dir: data.clone(),
            run_dir: settings.run_dir.clone(),
            agents: Vec::new(),
            config: config.clone(),
            durability: Durability::Normal,
        },
        cfg.clone(),
        BrokerDeps {
            lifecycle: Some(sup_tx.clone()),
            config_path: config,
            logs: Some(std::sync::Arc::new(logfile::AgentLogs::new(
                data.join("logs"),
            ))),
            spans: spans.clone(),
        },
    )?;
    for body in cli::check_at_start(&cfg, env.get("HIVE_CLAUDE_BIN").as_deref(), &data) {
        let _ = broker.fleet().send(FleetEvent::System {
            to: "operator".into(),
            kind: crate::proto::MsgKind::CliVersion,
            body,
        });
    }
    let (bridge_restart, bridge_restart_rx) = crossbeam_channel::unbounded();
    let sup = Supervisor::new(
        settings.clone(),
        cfg.clone(),
        broker.fleet(),
        broker.stopped_agents(),
        bashd::BashSup::start(&settings, broker.fleet())?,
    )
    .with_bridge(cfg.matrix.as_ref().map(|_| bridge_restart))
    .with_telemetry(telemetry.harness_vars());
    let sup_thread = std::thread::Builder::new()
        .name("supervisor".into())
        .spawn(move || sup.run(sup_rx))
        .map_err(|e| format!("cannot start the supervisor thread: {e}"))?;
    let bridge = match &cfg.matrix {
        Some(_) => Some(bridge::BridgeSup::start(&settings, bridge_restart_rx)?),
        None => None,
    };
    eprintln!(
        "hive up: {} agent(s) in {}; operator socket {}",
        cfg.agents.len(),
        data.display(),
        broker::host_socket(&settings.run_dir).display()
    );
    let port_file = data.join("dashboard-port");
    if let Err(e) = crate::sys::fs::write_private(&port_file, format!("{}\n", dash.port).as_bytes())
    {
        log::warn!("cannot write {}: {e}", port_file.display());
    }
    match dash.login_link()? {
        Some(link) => println!(
            "dashboard: {link} (a one-time login link for {} minutes; then log in with the token: {})",
            dashboard::LINK_TTL.as_secs() / 60,
            dash.token_hint()
        ),
        None => println!("dashboard: {} ({})", dash.base_url(), dash.token_hint()),
    }
    for (name, url) in dash.script_pages() {
        println!("{name}'s page with scripts of its own: {url} (the dashboard's login opens it)");
        log::info!("{name}'s page with scripts of its own: {url}");
    }
    print_pages(&sup_tx, &settings.origin);

    let _ = signals.recv();
    log::info!("stopping the agents, then the broker");
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    if sup_tx
        .send(LifecycleCmd::Shutdown { reply: done_tx })
        .is_ok()
    {
        let _ = done_rx.recv_timeout(settings.stop_grace + Duration::from_secs(5));
    }
    drop(sup_tx);
    let _ = sup_thread.join();
    if let Some(b) = bridge {
        b.stop();
    }
    drop(dash);
    let _ = std::fs::remove_file(&port_file);
    broker.stop();
    if let Some(x) = spans {
        x.finish(Duration::from_secs(5));
    }
    eprintln!("hive up: stopped");
    Ok(())
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one, then names the host
/// limits the fleet would hit (`hostlimits.rs`): one the idle fleet passes
/// refuses to start (unless `HIVE_UP_HOST_LIMITS=warn`), one only the
/// claude processes of busy turns pass is a warning.
fn check_host_limits(cfg: &HiveConfig, env: &Env) -> Result<(), UpError> {
    let nofile = hostlimits::raise_nofile();
    let need = hostlimits::Need::new(cfg.agents.len(), cfg.max_claude());
    let findings = hostlimits::check(&need, &hostlimits::read_host(nofile));
    if findings.is_empty() {
        return Ok(());
    }
    let text = hostlimits::message(&need, &findings);
    let warn_only = env.get("HIVE_UP_HOST_LIMITS").as_deref() == Some("warn");
    if findings.iter().any(|f| f.refuse) && !warn_only {
        return Err(UpError::Run(format!(
            "this host's limits do not hold the fleet, so nothing was started:\n{text}\n\
             (HIVE_UP_HOST_LIMITS=warn starts it anyway)"
        )));
    }
    for line in text.lines() {
        eprintln!("hive up: {line}");
        log::warn!("{line}");
    }
    Ok(())
}

/// Prints each agent's page (on the hive's `origin`) once its harness runs
/// (at most a few seconds).
fn print_pages(sup: &crossbeam_channel::Sender<LifecycleCmd>, origin: &str) {
    let end = Instant::now() + Duration::from_secs(10);
    let mut printed = std::collections::BTreeSet::new();
    loop {
        let (tx, rx) = crossbeam_channel::bounded(1);
        if sup.send(LifecycleCmd::States { reply: tx }).is_err() {
            return;
        }
        let Ok(states) = rx.recv_timeout(Duration::from_secs(5)) else {
            return;
        };
        for s in &states {
            if s.state == crate::proto::AgentPhase::Stopped && printed.insert(s.name.clone()) {
                println!(
                    "{}: stopped (it was stopped; `hive start {}` starts it)",
                    s.name, s.name
                );
            }
            if s.state == crate::proto::AgentPhase::Running && printed.insert(s.name.clone()) {
                let url = supervisor::page_link(origin, &s.name);
                println!("{}: {url} (the dashboard's login opens it)", s.name);
                if !s.logged_in {
                    let line = supervisor::needs_login_line(&s.name, Some(&url));
                    println!("{line}");
                    log::warn!("{line}");
                }
            }
        }
        if printed.len() == states.len() || Instant::now() > end {
            for s in states.iter().filter(|s| !printed.contains(&s.name)) {
                println!("{}: no page yet (see its log)", s.name);
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::hidden_folder;

    /// A fleet file among a project's files is warned about, naming some of
    /// them and the move that helps; one in the data dir or alone is not.
    #[test]
    fn a_fleet_file_in_a_project_folder_is_warned_about() {
        let dir = std::env::temp_dir().join(format!("hive-hidden-{}", std::process::id()));
        let data = dir.join("hive-data");
        std::fs::create_dir_all(data.join("run")).unwrap();
        let fleet = dir.join("hive.json");
        std::fs::write(&fleet, "{}").unwrap();
        assert_eq!(
            hidden_folder(&data, &fleet),
            None,
            "only the fleet file and the data dir"
        );
        assert_eq!(hidden_folder(&data, &data.join("hive.json")), None);
        std::fs::write(dir.join("Cargo.toml"), "").unwrap();
        std::fs::create_dir(dir.join("src")).unwrap();
        let w = hidden_folder(&data, &fleet).expect("a warning");
        assert!(
            w.contains(&format!("agents cannot see {}", dir.display())),
            "{w}"
        );
        assert!(
            w.contains("2 other entries in it (\"Cargo.toml\", \"src\")"),
            "{w}"
        );
        assert!(
            w.contains(&data.join("hive.json").display().to_string()),
            "{w}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
