//! `hive serve`'s boot: the composition root of the harness. It takes what
//! `hive up` handed down (the page's socket, its broker credential: every
//! broker connection of the harness then goes through it) before anything
//! else, installs the signal thread, resolves the settings, writes the boot
//! files, opens the turn-stats db and the turn log (`crate::history`, whose
//! tap it hands the bus), starts the bash-task daemon (unless it runs on its
//! own: `HIVE_BASH_DAEMON=external`, as under `hive up` and the units), the
//! web UI, the forge poller and the poller's broker connections, then hands
//! everything to the [`TurnLoop`] on this thread and, once it returns, shuts
//! the rest down in order (the turn log last, so it keeps every event).

use super::bus::Bus;
use super::context;
use super::control::{self, Control, Shared};
use super::invocation;
use super::poller::Poller;
use super::prompt::PromptVars;
use super::settings::Settings;
use super::stats::Stats;
use super::turn_loop::TurnLoop;
use crossbeam_channel::unbounded;
use std::path::Path;
use std::sync::Arc;

/// Runs the harness until SIGTERM.
pub fn run(state_dir: &Path, run_dir: &Path) -> Result<(), String> {
    // Under `hive up` the page's listening socket is inherited: taken (and
    // made close-on-exec) before anything else runs, and this process made
    // non-dumpable, so neither claude nor anything it starts can trace the
    // harness or take its descriptors.
    let inherited = inherited_listener()?;
    // So is its broker credential (issue 40): its reports are taken only
    // through it, and no process the agent starts can take it.
    let credential =
        crate::sys::fd::Credential::inherited(crate::proto::client::CREDENTIAL_FD_VAR)?;
    // Held to the end, so a first signal while the rest shuts down (after the
    // loop returned by itself) is taken as a signal, not as one nobody hears.
    let signals = crate::sys::signals()?;
    let mut s = Settings::resolve(state_dir, run_dir)?;
    if credential.is_none() {
        log::info!(
            "no broker credential ({}): this harness reports on its agent socket {}, which \
             every process of the agent may use; nothing separates the two here (plain hive \
             serve, HIVE_ISOLATION=off, or an older hive up)",
            crate::proto::client::CREDENTIAL_FD_VAR,
            s.socket.display()
        );
    }
    if let Some(c) = credential {
        s.broker = crate::proto::Dial::through(s.socket.clone(), move || c.connect());
    }
    let s = Arc::new(s);
    let placement = crate::bash::daemon::Placement::read(&crate::sys::env::Env::process())?;
    for dir in [&s.state_dir, &s.run_dir] {
        super::files::create_private_dir(dir)
            .map_err(|e| format!("cannot create directory {}: {e}", dir.display()))?;
    }
    let tools = invocation::write_boot_files(&s)?;
    let vars = PromptVars::from_env(&s.label);
    let (control_tx, control_rx) = unbounded::<Control>();
    let model = control::model(&s);
    let window =
        context::context_window_tokens(&model, None, context::ContextEnv::process().pairs());
    let bus = Bus::new(&s.label, &vars.qualified_label, &model, window);
    // The turn log before the first event: the live stream's ids go on from
    // its. Without it the harness runs as before, its ids starting at 1.
    let bounds = crate::history::Bounds::read(&crate::sys::env::Env::process())?;
    let (history, history_off) = match crate::history::open(&s.state_dir, bounds) {
        Ok(h) => {
            bus.log_to(h.tap, h.next_id);
            (Some(h.writer), None)
        }
        Err(e) => {
            log::warn!("{e}; turns run on, but this run's history is not kept");
            (None, Some(e))
        }
    };
    let shared = Shared::new(bus.clone(), control_tx, s.clone());
    control::take_over_model_file(&shared);
    // The page shows an override in force from the start (the broker's).
    let _ = shared.model();
    let (stats, (last_context, last_turn_end)) = open_stats(&s);
    if let Ok(text) = std::fs::read_to_string(s.status_file()) {
        bus.update(|st| st.status_text = text.trim().to_string());
    }
    bus.update(|st| st.context_tokens = last_context);
    log::info!(
        "hive serve {} ({}): state {}, socket {}, claude {}",
        s.label,
        crate::proto::HYPERHIVE_REV,
        s.state_dir.display(),
        s.socket.display(),
        s.claude_bin
    );
    if let Some(e) = history_off {
        bus.note(format!("{e}; this run's turns are not kept"));
    }
    // The bash-task daemon runs inside the harness unless it runs on its own:
    // either way tasks outlive turns, and a finished task wakes the agent
    // through the broker (also while this harness is down, when it is apart).
    let bash = start_bash(placement, &s, &bus);
    let web = crate::web::WebConfig::from_env()
        .and_then(|cfg| crate::web::start_on(shared.clone(), cfg, inherited))?;
    let _forge = super::forge::ForgeSettings::from_env(&s.state_dir, &s.broker, &s.label)?
        .and_then(super::forge::start);
    let poller = Poller::start(
        s.broker.clone(),
        s.poll_wait_secs,
        s.reconnect_max,
        bus.clone(),
    );
    TurnLoop::new(
        s,
        shared,
        stats,
        tools,
        poller,
        control_rx,
        signals.clone(),
        (last_context, last_turn_end),
    )
    .run();
    // An embedded daemon's running tasks are killed and marked interrupted;
    // their wakes are sent. A daemon of its own goes on.
    if let Some(b) = bash {
        b.shutdown();
    }
    drop(web);
    if let (Some(writer), Some((tap, last))) = (history, bus.end_history()) {
        writer.finish(tap, last);
    }
    log::info!("hive serve stopped");
    Ok(())
}

/// The turn-stats db (None when it cannot be opened: turns then run
/// unrecorded), and the context size and end of the last turn it holds.
fn open_stats(s: &Settings) -> (Option<Stats>, (Option<u64>, Option<i64>)) {
    let stats = match Stats::open(&s.stats_db()) {
        Ok(st) => Some(st),
        Err(e) => {
            log::error!("{e}; turns will not be recorded");
            None
        }
    };
    let last = stats
        .as_ref()
        .and_then(Stats::last)
        .map(|r| {
            (
                r.context_tokens,
                Some(r.started_at + (r.duration_ms / 1000) as i64),
            )
        })
        .unwrap_or((None, None));
    (stats, last)
}

/// The bash-task daemon, inside the harness unless it runs on its own:
/// either way tasks outlive turns, and a finished task wakes the agent
/// through the broker (also while this harness is down, when it is apart).
fn start_bash(
    placement: crate::bash::daemon::Placement,
    s: &Settings,
    bus: &Bus,
) -> Option<crate::bash::daemon::DaemonHandle> {
    match placement {
        crate::bash::daemon::Placement::External => {
            log::info!(
                "the bash-task daemon runs on its own (HIVE_BASH_DAEMON=external) at {}",
                s.bash_socket.display()
            );
            None
        }
        crate::bash::daemon::Placement::Embedded => {
            match crate::bash::start(crate::bash::DaemonSettings::from_env(s.state_dir.clone())) {
                Ok(h) => Some(h),
                Err(e) => {
                    log::error!("the bash-task daemon did not start: {e}");
                    bus.note(format!(
                        "the bash-task daemon did not start: {e}; mcp__bash__run will fail"
                    ));
                    None
                }
            }
        }
    }
}

/// The page's listening socket `hive up` handed this harness
/// ([`crate::http::server::INHERITED_FD_VAR`]), taken over at once (the
/// variable is a `HIVE_WEB_…` one, which no process the harness starts gets:
/// `agent_proc`). With one, the harness is made non-dumpable.
fn inherited_listener() -> Result<Option<std::os::unix::net::UnixListener>, String> {
    let var = crate::http::server::INHERITED_FD_VAR;
    let Some(text) = std::env::var_os(var) else {
        return Ok(None);
    };
    let fd: i32 = text
        .to_str()
        .and_then(|t| t.trim().parse().ok())
        .filter(|fd| *fd > 2)
        .ok_or_else(|| format!("{var}={text:?} is not a descriptor number"))?;
    let l = crate::sys::fd::inherited_listener(fd)
        .map_err(|e| format!("{var}={fd}: cannot take the page's socket: {e}"))?;
    crate::sys::set_non_dumpable()
        .map_err(|e| format!("cannot make the harness non-dumpable: {e}"))?;
    Ok(Some(l))
}
