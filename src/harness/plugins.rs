//! Claude Code plugin install at boot: `claude plugin marketplace update` when
//! auto-update is on, then `marketplace add` and `plugin install` for each
//! configured entry. Nothing runs when nothing is configured, so an offline boot
//! never stalls; every command has a timeout and an environment without the
//! operator's variables, and failures are returned as readable strings for the
//! parent instead of stopping the boot.

use super::bus::Bus;
use super::settings::Settings;
use crate::sys::{run_with_timeout, RunError};
use std::process::Command;
use std::time::Duration;

const PLUGIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs one `claude plugin …` command in its own process group, killed at the
/// limit; Err names what failed.
fn claude(s: &Settings, args: &[&str]) -> Result<(), String> {
    let shown = format!("claude {}", args.join(" "));
    let mut cmd = Command::new(&s.claude_bin);
    cmd.args(args).current_dir(&s.state_dir);
    crate::agent_proc::scrub_operator_env(&mut cmd);
    match run_with_timeout(&mut cmd, PLUGIN_TIMEOUT) {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().last().unwrap_or("").trim();
            Err(format!("{shown} failed ({}): {last}", out.status))
        }
        Err(RunError::Start(e)) => Err(format!("{shown}: cannot start {}: {e}", s.claude_bin)),
        Err(RunError::TimedOut(_)) => Err(format!("{shown} timed out after {PLUGIN_TIMEOUT:?}")),
        Err(e) => Err(format!("{shown}: {e}")),
    }
}

/// Installs what is configured; returns one message per failure.
pub fn install(s: &Settings, bus: &Bus) -> Vec<String> {
    let mut failures = Vec::new();
    if s.plugin_marketplaces.is_empty() && s.plugins.is_empty() && !s.plugins_auto_update {
        return failures;
    }
    let mut run = |args: &[&str]| {
        bus.note(format!("plugins: claude {}", args.join(" ")));
        if let Err(e) = claude(s, args) {
            log::warn!("{e}");
            failures.push(e);
        }
    };
    for m in &s.plugin_marketplaces {
        run(&["plugin", "marketplace", "add", m]);
    }
    if s.plugins_auto_update {
        run(&["plugin", "marketplace", "update"]);
    }
    for p in &s.plugins {
        run(&["plugin", "install", p]);
    }
    failures
}
