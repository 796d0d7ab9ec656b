//! The `hive` binary: parses the command line and dispatches to the library.
//! Nothing else lives here.

use hyperhive::cli::{self, BashDaemonArgs, BrokerArgs, Command};
use hyperhive::sys::env::Env;
use hyperhive::{bash, broker, fleet, harness, mcp, ops, sys};
use std::path::Path;
use std::process::ExitCode;

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
fn bash_daemon_settings(a: BashDaemonArgs) -> bash::daemon::DaemonSettings {
    let env = Env::process();
    let state_dir = a
        .state_dir
        .unwrap_or_else(|| env.path_or("HIVE_STATE_DIR", bash::daemon::DEFAULT_STATE_DIR));
    let mut s = bash::daemon::DaemonSettings::read(state_dir, &env);
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

/// Whether `command` runs until stopped: those get every descriptor the hard
/// limit allows.
fn long_running(command: &Command) -> bool {
    matches!(
        command,
        Command::Broker(_)
            | Command::Up(_)
            | Command::Serve(_)
            | Command::Mcp
            | Command::BashMcp(_)
            | Command::BashDaemon(_)
    )
}

fn main() -> ExitCode {
    // `hive up`'s re-exec into an agent's sandbox: hidden, and single-threaded.
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|a| a == fleet::sandbox::SUBCOMMAND) {
        fleet::sandbox::run_command(args.collect());
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Stderr)
        // ureq's debug lines print request headers, tokens included: never.
        .filter_module("ureq", log::LevelFilter::Info)
        .filter_module("ureq::unit", log::LevelFilter::Info)
        .init();
    let command = match cli::parse(std::env::args_os().skip(1).collect()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hive: {}\n\n{}", e.message, e.usage);
            return ExitCode::from(2);
        }
    };
    if long_running(&command) {
        match sys::raise_nofile_limit() {
            Ok(n) => log::debug!("descriptor limit: {n}"),
            Err(e) => log::warn!("cannot raise the descriptor limit: {e}"),
        }
    }
    let result = match command {
        Command::Help(None) => {
            print!("{}", cli::main_usage());
            Ok(())
        }
        Command::Help(Some(cmd)) => {
            print!("{}", cli::usage_of(cmd));
            Ok(())
        }
        Command::Version => {
            println!(
                "hive {} ({})",
                env!("CARGO_PKG_VERSION"),
                broker::HYPERHIVE_REV
            );
            Ok(())
        }
        Command::Broker(a) => match broker::run(broker_settings(a)) {
            Err(broker::BrokerError::Config(e)) => {
                eprintln!("hive: {e}");
                return ExitCode::from(2);
            }
            Err(broker::BrokerError::Run(e)) => Err(e),
            Ok(()) => Ok(()),
        },
        Command::Up(a) => fleet::run(
            a.data.as_deref().unwrap_or(Path::new("hive-data")),
            a.config,
        ),
        Command::Approvals(h) => ops::approvals(&h),
        Command::Approve(h, id) => ops::approve(&h, id),
        Command::Deny(a) => ops::deny(&a),
        Command::Serve(a) => harness::serve::run(&a.state_dir, &a.run_dir),
        Command::Mcp => match mcp::hyperhive::main() {
            Ok(code) => std::process::exit(code),
            Err(e) => Err(e),
        },
        Command::Wake(a) => ops::wake(&a),
        Command::Send(a) => ops::send(&a),
        Command::Inbox(a) => ops::inbox(&a),
        Command::Agents(h) => ops::agents(&h),
        Command::Questions(h) => ops::questions(&h),
        Command::Answer(a) => ops::answer(&a),
        Command::CancelQuestion(h, id) => ops::cancel_question(&h, id),
        Command::BashDaemon(a) => bash::daemon::run_command(bash_daemon_settings(a)),
        Command::BashMcp(socket) => bash::mcp::run_server(bash::daemon::socket_or_env(socket)),
        Command::EnvScript => {
            print!("{}", bash::env_script::SCRIPT);
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors may quote what an agent or the broker said.
            eprintln!("hive: {}", ops::printable(&e, true));
            ExitCode::FAILURE
        }
    }
}
