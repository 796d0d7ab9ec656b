//! The `hive` binary: parses the command line (`cli`), resolves each
//! command's flags against the environment and the defaults into what its
//! module takes, and dispatches to the library. Usage errors exit with 2,
//! failures with 1.

use hyperhive::cli::{self, BashDaemonArgs, BrokerArgs, Cmd, MatrixBridgeArgs};
use hyperhive::proto::{paths, HYPERHIVE_REV};
use hyperhive::sys::env::Env;
use hyperhive::{bash, bridge, broker, fleet, harness, mcp, ops, sys};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static ALLOC: sys::start::StartAlloc = sys::start::StartAlloc::new();

/// `hive broker`'s flags as the broker takes them.
fn broker_settings(a: BrokerArgs) -> broker::BrokerSettings {
    broker::BrokerSettings {
        state_dir: a.state_dir,
        run_dir: a.run_dir,
        agents: a.agents,
        config: a.config,
        durability: match a.durability {
            cli::Durability::Normal => broker::db::Durability::Normal,
            cli::Durability::Full => broker::db::Durability::Full,
        },
    }
}

/// The settings of `hive bash-daemon`: its flags, else the environment, else
/// the defaults.
fn bash_daemon_settings(a: BashDaemonArgs, env: &Env) -> bash::daemon::DaemonSettings {
    let state_dir = a
        .state_dir
        .unwrap_or_else(|| env.path_or("HIVE_STATE_DIR", paths::DEFAULT_STATE_DIR));
    let mut s = bash::daemon::DaemonSettings::read(state_dir, env);
    if let Some(p) = a.socket {
        s.socket = p;
    }
    if let Some(p) = a.agent_socket {
        s.agent_socket = p;
    }
    if let Some(p) = a.bash_env {
        s.bash_env = Some(p);
    }
    s
}

/// The settings of `hive matrix-bridge`: its flags, else the defaults under
/// `hive broker`'s; the rest from the environment.
fn bridge_settings(a: MatrixBridgeArgs, env: &Env) -> Result<bridge::BridgeSettings, String> {
    let socket = a
        .socket
        .unwrap_or_else(|| PathBuf::from(cli::BROKER_RUN_DIR).join(cli::BRIDGE_SOCKET));
    let state = a
        .state_dir
        .unwrap_or_else(|| PathBuf::from(cli::BROKER_STATE_DIR).join(cli::BRIDGE_STATE));
    bridge::BridgeSettings::read(socket, state, env)
}

/// Whether `cmd` is a daemon: it allocates from the system allocator from the
/// start, since the start-up arena's blocks are never reused and would only
/// add to its memory (the MCP servers, which live for a session of claude,
/// keep it).
fn daemon(cmd: &Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Broker(_) | Cmd::Up(_) | Cmd::Serve(_) | Cmd::BashDaemon(_) | Cmd::MatrixBridge(_)
    )
}

/// Whether `cmd` runs until stopped: those get every descriptor the hard
/// limit allows.
fn long_running(cmd: &Cmd) -> bool {
    matches!(
        cmd,
        Cmd::Broker(_)
            | Cmd::Up(_)
            | Cmd::Serve(_)
            | Cmd::Mcp
            | Cmd::BashMcp(_)
            | Cmd::BashDaemon(_)
            | Cmd::MatrixBridge(_)
    )
}

/// A reader that stops reading (`hive agents | head`) ends a pipe the way
/// every Unix tool takes it: quietly, with the status a SIGPIPE death gives
/// (141), not a panic. Only for the short commands that print; the daemons'
/// and the MCP servers' output is another matter. `std` ignores SIGPIPE, so
/// the print fails with EPIPE and `println!` panics; the hook recognises that
/// one panic and lets every other reach the default hook.
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = (p.downcast_ref::<String>().map(String::as_str))
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info)
    }));
}

/// Runs `cmd`; `Err` is a failure to report (exit 1).
fn run(cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::Help(None) => print!("{}", cli::main_usage()),
        Cmd::Help(Some(name)) => print!("{}", cli::usage_of(name)),
        Cmd::Version => println!("hive {} ({})", env!("CARGO_PKG_VERSION"), HYPERHIVE_REV),
        Cmd::Up(a) => {
            let data = a
                .data
                .unwrap_or_else(|| PathBuf::from(cli::DEFAULT_DATA_DIR));
            match fleet::run(&data, a.config) {
                Err(fleet::UpError::MatrixLogin(e)) => {
                    // The operator fixes the fleet file's matrix section.
                    eprintln!("hive up: {e}");
                    std::process::exit(2);
                }
                Err(fleet::UpError::Run(e)) => return Err(e),
                Ok(()) => {}
            }
        }
        Cmd::Broker(a) => match broker::run(broker_settings(a)) {
            Err(broker::BrokerError::Config(e)) => {
                // A config that does not load is a usage error.
                eprintln!("hive: {e}");
                std::process::exit(2);
            }
            Err(broker::BrokerError::Run(e)) => return Err(e),
            Ok(()) => {}
        },
        Cmd::Serve(a) => harness::serve::run(&a.state_dir, &a.run_dir)?,
        Cmd::Mcp => std::process::exit(mcp::hyperhive::main()?),
        Cmd::Wake(a) => ops::wake(&a)?,
        Cmd::Send(a) => ops::send(&a)?,
        Cmd::Inbox(a) => ops::inbox(&a)?,
        Cmd::Agents(h) => ops::agents(&h)?,
        Cmd::Failed(a) => ops::failed(&a)?,
        Cmd::Retry(a) => ops::retry(&a.host, a.id)?,
        Cmd::Message(a) => ops::message(&a.host, a.id)?,
        Cmd::Resume(a) => ops::resume(&a)?,
        Cmd::Budget(a) => ops::budget(&a)?,
        Cmd::Questions(h) => ops::questions(&h)?,
        Cmd::Versions(h) => ops::versions(&h)?,
        Cmd::Answer(a) => ops::answer(&a)?,
        Cmd::CancelQuestion(a) => ops::cancel_question(&a.host, a.id)?,
        Cmd::Timers(a) => ops::timers(&a)?,
        Cmd::Notify(a) => ops::notify(&a)?,
        Cmd::Approvals(h) => ops::approvals(&h)?,
        Cmd::Approve(a) => ops::approve(&a.host, a.id)?,
        Cmd::Deny(a) => ops::deny(&a)?,
        Cmd::Lifecycle(what, a) => ops::lifecycle(what, &a)?,
        Cmd::UpdateAll { host, parallel } => ops::update_all(&host, parallel)?,
        Cmd::Reload(h) => ops::reload(&h)?,
        Cmd::Forget(a) => ops::forget(&a)?,
        Cmd::Search(a) => ops::search(&a)?,
        Cmd::History(a) => ops::history(&a)?,
        Cmd::BashDaemon(a) => bash::daemon::run_command(bash_daemon_settings(a, &Env::process()))?,
        Cmd::BashMcp(a) => bash::mcp::run_server(bash::daemon::socket_or_env(a.socket))?,
        Cmd::EnvScript => print!("{}", bash::env_script::SCRIPT),
        Cmd::Fleet(cli::FleetArgs::Check { file }) => {
            println!("{}", fleet::declared::check(&file)?)
        }
        Cmd::Fleet(cli::FleetArgs::Merge {
            declared,
            into,
            base,
        }) => println!(
            "{}",
            fleet::declared::merge(&declared, &into, base.as_deref())?
        ),
        Cmd::MatrixBridge(a) => match bridge::run(bridge_settings(a, &Env::process())?) {
            Err(bridge::BridgeError::Fatal(e)) => {
                // The Matrix login or the configuration: the operator fixes it.
                eprintln!("hive matrix-bridge: {e}");
                std::process::exit(2);
            }
            Err(bridge::BridgeError::Run(e)) => return Err(e),
            Ok(()) => {}
        },
    }
    Ok(())
}

/// The logger on stderr: `RUST_LOG` (default `info`) and `RUST_LOG_STYLE`
/// as `env_logger::Builder::from_env` reads them, but from `sys::env`'s one
/// pass over the environment, and without the colour probe's three lookups
/// when stderr is no terminal: there its answer is "no colour" unless
/// `CLICOLOR_FORCE` is set, which leaves the probe to decide. ureq's debug
/// lines print request headers, tokens included: a filter that lets debug
/// lines through gets ureq capped at info. Only such a filter gets the cap,
/// which would otherwise raise the level every `log!` call checks (the
/// arguments of an `info!` are built when the level allows it) from the
/// asked `warn` to `info`.
fn logger() {
    use env_logger::WriteStyle;
    use log::LevelFilter;
    use std::io::IsTerminal;
    let filters = sys::env::var("RUST_LOG");
    let style = sys::env::var("RUST_LOG_STYLE");
    let auto = style
        .as_deref()
        .is_none_or(|s| !matches!(s, "always" | "never"));
    let plain = auto && !sys::env::is_set("CLICOLOR_FORCE") && !std::io::stderr().is_terminal();
    let build = |cap_ureq: bool| {
        let mut b = env_logger::Builder::new();
        b.parse_filters(filters.as_deref().unwrap_or("info"));
        if let Some(s) = &style {
            b.parse_write_style(s);
        }
        if plain {
            b.write_style(WriteStyle::Never);
        }
        if cap_ureq {
            b.filter_module("ureq", LevelFilter::Info)
                .filter_module("ureq::unit", LevelFilter::Info);
        }
        b.target(env_logger::Target::Stderr).build()
    };
    let mut logger = build(false);
    if logger.filter() > LevelFilter::Info {
        logger = build(true);
    }
    let max = logger.filter();
    if log::set_boxed_logger(Box::new(logger)).is_ok() {
        log::set_max_level(max);
    }
}

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // `hive up`'s re-exec into an agent's sandbox: hidden, and single-threaded.
    if args
        .first()
        .is_some_and(|a| a == fleet::sandbox::SUBCOMMAND)
    {
        fleet::sandbox::run_command(args.split_off(1));
    }
    logger();
    let cmd = match cli::parse(args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hive: {}\n\n{}", e.message, e.usage);
            return ExitCode::from(2);
        }
    };
    if daemon(&cmd) {
        ALLOC.close();
    }
    if !long_running(&cmd) {
        quiet_broken_pipe();
    }
    if long_running(&cmd) {
        match sys::raise_nofile_limit() {
            Ok(n) => log::debug!("descriptor limit: {n}"),
            Err(e) => log::warn!("cannot raise the descriptor limit: {e}"),
        }
    }
    match run(cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors may quote what an agent or the broker said.
            eprintln!("hive: {}", ops::printable(&e, true));
            ExitCode::FAILURE
        }
    }
}
