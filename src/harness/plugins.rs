//! Claude Code plugin install at boot: `claude plugin marketplace update` when
//! auto-update is on, then `marketplace add` and `plugin install` for each
//! configured entry. Nothing runs when nothing is configured, so an offline boot
//! never stalls; every command has a timeout and an environment without the
//! operator's variables, and failures are returned as readable strings for the
//! parent instead of stopping the boot.

use super::bus::Bus;
use super::settings::Settings;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const PLUGIN_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs one `claude plugin …` command; Err names what failed.
fn claude(s: &Settings, args: &[&str]) -> Result<(), String> {
    let shown = format!("claude {}", args.join(" "));
    // The waiter thread exists before the child, so a child is never left
    // unwaited for want of a thread.
    let (child_tx, child_rx) = crossbeam_channel::bounded::<Child>(1);
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("claude-plugin".into())
        .spawn(move || {
            if let Ok(child) = child_rx.recv() {
                let _ = tx.send(child.wait_with_output());
            }
        })
        .map_err(|e| format!("{shown}: cannot start a thread for it: {e}"))?;
    let mut cmd = Command::new(&s.claude_bin);
    cmd.args(args)
        .current_dir(&s.state_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0);
    crate::agent_proc::scrub_operator_env(&mut cmd);
    let child = cmd
        .spawn()
        .map_err(|e| format!("{shown}: cannot start {}: {e}", s.claude_bin))?;
    let pid = child.id() as i32;
    let _ = child_tx.send(child);
    match rx.recv_timeout(PLUGIN_TIMEOUT) {
        Ok(Ok(out)) if out.status.success() => Ok(()),
        Ok(Ok(out)) => {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().last().unwrap_or("").trim();
            Err(format!("{shown} failed ({}): {last}", out.status))
        }
        Ok(Err(e)) => Err(format!("{shown}: {e}")),
        Err(_) => {
            // SAFETY: signalling our own child's process group.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            Err(format!("{shown} timed out after {PLUGIN_TIMEOUT:?}"))
        }
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
