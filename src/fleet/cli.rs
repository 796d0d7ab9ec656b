//! The Claude Code CLI as `hive up` finds it at start: each distinct claude
//! binary the agents will run (`HIVE_CLAUDE_BIN` of `hive up`'s environment
//! or of a fleet entry's `env`, else `claude` on the PATH) is asked
//! `--version` once. A binary that cannot be run gets one line naming
//! `HIVE_CLAUDE_BIN`, the npm package and the supported window (the agents
//! then pause with a notice of their own until it is there); a version
//! outside the window (`agent_proc::CLAUDE_CLI_WINDOW`) is told to the
//! operator once per hive and version, kept in `DATA/claude-cli-versions-told`
//! so a restart does not tell it again. The harnesses under `hive up` leave
//! that notice to it (`HIVE_CLI_WINDOW_NOTICE=off`). Turns run either way.

use crate::agent_proc::{cli_window_notice, CLAUDE_CLI_PACKAGE, CLAUDE_CLI_WINDOW};
use crate::config::HiveConfig;
use std::collections::BTreeSet;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The file of versions already told, in the data dir.
const TOLD: &str = "claude-cli-versions-told";

/// How long `claude --version` may take (it takes about 0.1 s).
const VERSION_TIMEOUT: Duration = Duration::from_secs(10);

/// What one binary said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// Its version line (`2.1.332 (Claude Code)`).
    Version(String),
    /// It could not be run, or failed: why.
    Unusable(String),
}

/// The claude binaries the agents of `cfg` run when `hive up`'s own
/// `HIVE_CLAUDE_BIN` is `own`.
pub fn binaries(cfg: &HiveConfig, own: Option<&str>) -> BTreeSet<String> {
    let default = own.unwrap_or("claude").to_string();
    cfg.agents
        .iter()
        .map(|a| {
            a.env
                .get("HIVE_CLAUDE_BIN")
                .cloned()
                .unwrap_or_else(|| default.clone())
        })
        .collect()
}

/// Runs `bin --version` in `hive up`'s environment less the operator's
/// variables (as a harness would run it), killed after [`VERSION_TIMEOUT`].
pub fn version_of(bin: &str) -> Found {
    let mut cmd = Command::new(bin);
    cmd.arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    crate::agent_proc::scrub_operator_env(&mut cmd);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Found::Unusable(format!("cannot run {bin}: {e}")),
    };
    let end = Instant::now() + VERSION_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(20)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Found::Unusable(format!(
                    "{bin} --version did not answer in {}s",
                    VERSION_TIMEOUT.as_secs()
                ));
            }
            Err(e) => return Found::Unusable(format!("cannot wait for {bin}: {e}")),
        }
    };
    let mut out = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.by_ref().take(4096).read_to_string(&mut out);
    }
    if !status.success() {
        return Found::Unusable(format!("{bin} --version failed ({status})"));
    }
    let line: String = out
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .take(80)
        .collect();
    Found::Version(line)
}

/// The line for a binary that cannot be run: what is missing and the two
/// ways to provide it.
pub fn unusable_line(why: &str) -> String {
    let (lo, hi) = CLAUDE_CLI_WINDOW;
    format!(
        "hive up: the Claude Code CLI cannot be run ({why}); install it with \
         `npm install -g {CLAUDE_CLI_PACKAGE}@{hi}` (hive supports {lo} to {hi}) or set \
         HIVE_CLAUDE_BIN (here or in an agent's \"env\") to its path; agents pause with a \
         notice until it runs"
    )
}

/// Checks every binary of `cfg` once; returns the notices for the operator
/// (outside the window, not told before: each is recorded in `data` as
/// told) and prints the line for each binary that cannot be run.
pub fn check_at_start(cfg: &HiveConfig, own: Option<&str>, data: &Path) -> Vec<String> {
    let told_path = data.join(TOLD);
    let told = std::fs::read_to_string(&told_path).unwrap_or_default();
    let mut notices = Vec::new();
    for bin in binaries(cfg, own) {
        match version_of(&bin) {
            Found::Unusable(why) => {
                let line = unusable_line(&why);
                eprintln!("{line}");
                log::warn!("{line}");
            }
            Found::Version(line) => {
                let version = line.split_whitespace().next().unwrap_or_default();
                log::info!("claude: {bin} is Claude Code CLI {version}");
                let Some(notice) = cli_window_notice(version) else {
                    continue;
                };
                eprintln!("hive up: {notice}");
                log::warn!("{notice}");
                if version.is_empty() || told.lines().any(|l| l == version) {
                    continue;
                }
                let appended = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&told_path)
                    .and_then(|mut f| {
                        std::io::Write::write_all(&mut f, format!("{version}\n").as_bytes())
                    });
                if let Err(e) = appended {
                    log::warn!("cannot write {}: {e}", told_path.display());
                }
                notices.push(format!("[cli_version] {bin}: {notice}"));
            }
        }
    }
    notices
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::AgentConfig;

    #[test]
    fn each_distinct_binary_is_asked_once() {
        let mut a = AgentConfig::named("a");
        let b = AgentConfig::named("b");
        let mut c = AgentConfig::named("c");
        a.env
            .insert("HIVE_CLAUDE_BIN".into(), "/opt/claude-a".into());
        c.env
            .insert("HIVE_CLAUDE_BIN".into(), "/opt/claude-a".into());
        let cfg = HiveConfig {
            agents: vec![a, b, c],
            ..HiveConfig::default()
        };
        let bins: Vec<String> = binaries(&cfg, None).into_iter().collect();
        assert_eq!(bins, ["/opt/claude-a", "claude"]);
        let bins: Vec<String> = binaries(&cfg, Some("/usr/bin/claude"))
            .into_iter()
            .collect();
        assert_eq!(bins, ["/opt/claude-a", "/usr/bin/claude"]);
    }

    #[test]
    fn a_missing_binary_is_unusable_with_the_way_to_install_it() {
        let Found::Unusable(why) = version_of("/nonexistent/claude") else {
            panic!("a missing binary ran");
        };
        let line = unusable_line(&why);
        assert!(line.contains("/nonexistent/claude"), "{line}");
        assert!(
            line.contains("HIVE_CLAUDE_BIN") && line.contains(CLAUDE_CLI_PACKAGE),
            "{line}"
        );
        assert!(line.contains(CLAUDE_CLI_WINDOW.0) && line.contains(CLAUDE_CLI_WINDOW.1));
    }

    #[test]
    fn a_version_outside_the_window_is_told_once_per_data_dir() {
        let dir = std::env::temp_dir().join(format!("hive-cli-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fake = dir.join("claude");
        std::fs::write(&fake, "#!/bin/sh\necho '2.1.100 (Claude Code)'\n").unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let mut a = AgentConfig::named("a");
        a.env
            .insert("HIVE_CLAUDE_BIN".into(), fake.display().to_string());
        let cfg = HiveConfig {
            agents: vec![a],
            ..HiveConfig::default()
        };
        let first = check_at_start(&cfg, None, &dir);
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(first[0].contains("2.1.100"), "{first:?}");
        assert_eq!(check_at_start(&cfg, None, &dir), Vec::<String>::new());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
