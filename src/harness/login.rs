//! Credentials and the login park. Decides whether claude has any way to
//! authenticate (an API key or OAuth token in the environment, a token the
//! operator stored through the web page, or a credentials file in the claude
//! config dir), checks a new token by running the agent's own claude once with
//! it ([`verify_token`]) and stores it privately, and implements
//! `wait_for_login`'s resume test: a [`DirSnapshot`] of the claude config dir
//! (newest mtime and file count) that must advance before the harness resumes,
//! so stale credentials already on disk cannot cause a false resume.

use super::classify::{ExitInfo, TurnObserver};
use super::settings::Settings;
use crate::sys::{run_with_timeout, RunError};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime};

/// How long the check of a new token may take.
pub const VERIFY_TIMEOUT: Duration = Duration::from_secs(60);

/// The prompt of the check: one short answer from the cheapest model.
const VERIFY_PROMPT: &str = "Reply with the single word: ok";

/// The variables a token can reach claude through; the check sets only its own.
const TOKEN_VARS: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "ANTHROPIC_AUTH_TOKEN",
];

/// What checking a new token came to, when it is to be stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Anthropic answered a request made with it.
    Accepted,
    /// The check could not tell (the network, a 5xx, a timeout, a claude that
    /// did not start …): the token is stored with this warning.
    Unverified(String),
}

/// The variable that hands `token` to claude: an OAuth token (`sk-ant-oat…`)
/// or an API key.
fn token_var(token: &str) -> &'static str {
    if token.starts_with("sk-ant-oat") {
        "CLAUDE_CODE_OAUTH_TOKEN"
    } else {
        "ANTHROPIC_API_KEY"
    }
}

/// Runs the agent's own claude once with `token` as its only credential
/// (`--print --model haiku`, no retries, no session kept, no MCP server, at
/// most [`VERIFY_TIMEOUT`]) and classifies the run with the turn classifier.
/// It runs with a scratch claude config dir (`RUN/login-check`, removed
/// after), so neither a credentials file there nor what the CLI writes at
/// start touches the agent's: a login park watches that dir.
/// `Err` is the refusal to show when Anthropic refused the token (401/403);
/// anything else stores it. The token is passed in the environment only and
/// is cut out of every text returned; nothing here logs it.
pub fn verify_token(s: &Settings, token: &str) -> Result<Verdict, String> {
    let mut cmd = Command::new(&s.claude_bin);
    cmd.args([
        "--print",
        "--verbose",
        "--output-format",
        "stream-json",
        "--model",
        "haiku",
        "--no-session-persistence",
        "--strict-mcp-config",
        VERIFY_PROMPT,
    ])
    .current_dir(&s.state_dir);
    crate::agent_proc::scrub_operator_env(&mut cmd);
    for k in TOKEN_VARS {
        cmd.env_remove(k);
    }
    let scratch = s.run_dir.join("login-check");
    let _ = fs::remove_dir_all(&scratch);
    if let Err(e) = super::files::create_private_dir(&scratch) {
        return Ok(Verdict::Unverified(format!(
            "could not verify the token: cannot create {}: {e}",
            scratch.display()
        )));
    }
    cmd.env(token_var(token), token)
        .env("CLAUDE_CODE_MAX_RETRIES", "0")
        .env("CLAUDE_CONFIG_DIR", &scratch);
    let hide = |text: &str| text.replace(token, "[the token]");
    let ran = run_with_timeout(&mut cmd, VERIFY_TIMEOUT);
    let _ = fs::remove_dir_all(&scratch);
    let out = match ran {
        Ok(out) => out,
        Err(RunError::TimedOut(t)) => {
            return Ok(Verdict::Unverified(format!(
                "could not verify the token: claude did not answer within {} s",
                t.as_secs()
            )))
        }
        Err(RunError::Start(e)) => {
            return Ok(Verdict::Unverified(format!(
                "could not verify the token: cannot start {}: {e}",
                s.claude_bin
            )))
        }
        Err(e) => {
            return Ok(Verdict::Unverified(hide(&format!(
                "could not verify the token: {e}"
            ))))
        }
    };
    let mut observer = TurnObserver::new();
    let mut status = None;
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in stdout.lines() {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            if v["type"] == "result" {
                status = v["api_error_status"].as_i64();
            }
        }
        observer.on_stdout_line(line);
    }
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        observer.on_stderr_line(line);
    }
    let exit = ExitInfo {
        code: out.status.code(),
        signal: std::os::unix::process::ExitStatusExt::signal(&out.status),
        ..ExitInfo::default()
    };
    let report = observer.finish(exit);
    let said = || {
        report
            .result_text
            .clone()
            .or_else(|| report.stderr_tail.last().cloned())
            .unwrap_or_default()
    };
    use crate::proto::TurnOutcomeKind as K;
    match report.outcome.kind {
        // A rate limit means the token got through.
        K::Ok | K::Compacted | K::RateLimited => Ok(Verdict::Accepted),
        K::AuthFailed => {
            let code = status.map(|c| format!(" ({c})")).unwrap_or_default();
            Err(hide(&format!(
                "Anthropic refused this token{code}: {}",
                said()
            )))
        }
        K::PromptTooLong
        | K::ApiUnavailable
        | K::CannotCompact
        | K::Aborted
        | K::Interrupted
        | K::Failed
        | K::TimedOut
        | K::Hung
        | K::NotStarted
        | K::McpStartFailed
        | K::TurnBudget
        | K::Stopped
        | K::Other => {
            let other = &report.outcome;
            let why = other.detail().unwrap_or_else(said);
            Ok(Verdict::Unverified(hide(&format!(
                "could not verify the token ({}): {why}",
                other.kind()
            ))))
        }
    }
}

/// Newest modification time and file count under a directory (two levels deep).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirSnapshot {
    pub newest: Option<SystemTime>,
    pub files: usize,
}

impl DirSnapshot {
    pub fn take(dir: &Path) -> DirSnapshot {
        let mut snap = DirSnapshot::default();
        snap.walk(dir, 2);
        snap
    }

    fn walk(&mut self, dir: &Path, depth: u32) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                if depth > 0 {
                    self.walk(&e.path(), depth - 1);
                }
                continue;
            }
            self.files += 1;
            // Either axis advancing resumes; mtime may error on some filesystems.
            if let Ok(m) = meta.modified() {
                if self.newest.is_none_or(|n| m > n) {
                    self.newest = Some(m);
                }
            }
        }
    }

    /// Has `self` (taken later) moved on from `earlier`?
    pub fn advanced_from(&self, earlier: &DirSnapshot) -> bool {
        self.files != earlier.files
            || match (self.newest, earlier.newest) {
                (Some(a), Some(b)) => a > b,
                (Some(_), None) => true,
                _ => false,
            }
    }
}

/// A token the operator stored through the web page, if any.
pub fn stored_token(settings: &Settings) -> Option<String> {
    fs::read_to_string(settings.credentials_file())
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Is `token` one word an API key or OAuth token could be?
pub fn check_token_shape(token: &str) -> Result<(), String> {
    let token = token.trim();
    if token.is_empty() || token.contains(char::is_whitespace) || token.len() > 4096 {
        return Err(
            "token must be one word: an API key (sk-ant-api…) or OAuth token (sk-ant-oat…)".into(),
        );
    }
    Ok(())
}

/// Stores an operator's API key or OAuth token (mode 0600, never logged).
pub fn store_token(settings: &Settings, token: &str) -> Result<(), String> {
    check_token_shape(token)?;
    let token = token.trim();
    let path = settings.credentials_file();
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("cannot store the token in {}: {e}", path.display()))?;
    f.write_all(token.as_bytes())
        .and_then(|_| f.sync_all())
        .and_then(|_| fs::rename(&tmp, &path))
        .map_err(|e| format!("cannot store the token in {}: {e}", path.display()))
}

/// The environment that hands a stored token to claude.
pub fn token_env(settings: &Settings) -> Vec<(String, String)> {
    match stored_token(settings) {
        Some(t) if t.starts_with("sk-ant-oat") => {
            vec![("CLAUDE_CODE_OAUTH_TOKEN".into(), t)]
        }
        Some(t) => vec![("ANTHROPIC_API_KEY".into(), t)],
        None => Vec::new(),
    }
}

/// The credential sources claude has now, as the login park's sentinel
/// records them: the names of the variables that are set (never a value), and
/// the stored token and the credentials file with their mtimes, so that a new
/// login written while no harness ran counts as new.
fn sources(settings: &Settings) -> Vec<String> {
    let mut out: Vec<String> = TOKEN_VARS
        .iter()
        .filter(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()))
        .map(|k| k.to_string())
        .collect();
    let stamped = |name: &str, path: &Path| {
        let t = fs::metadata(path).and_then(|m| m.modified()).ok()?;
        let ns = t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_nanos();
        Some(format!("{name}@{ns}"))
    };
    if stored_token(settings).is_some() {
        out.extend(stamped("stored-token", &settings.credentials_file()));
    }
    out.extend(stamped(
        "credentials-file",
        &settings.claude_config_dir.join(".credentials.json"),
    ));
    out
}

/// What the login park's sentinel holds: when it parked, and the credential
/// sources claude had then (all of which failed, or there were none).
pub fn sentinel_text(settings: &Settings, now: i64) -> String {
    format!("{now}\n{}\n", sources(settings).join(","))
}

/// At boot: must the harness park for a login? When claude has no
/// credentials, or when the last park's sentinel is there and no credential
/// source appeared or changed since it was written (the ones it recorded were
/// refused). A sentinel whose park a new source ends is removed. A sentinel
/// of an older release (no list) keeps the old rule: park.
pub fn park_at_boot(settings: &Settings) -> bool {
    if !credentials_available(settings) {
        return true;
    }
    let path = settings.needs_login_sentinel();
    let Ok(text) = fs::read_to_string(&path) else {
        return false;
    };
    let Some(then) = text.lines().nth(1) else {
        return true;
    };
    let then: Vec<&str> = then.split(',').filter(|s| !s.is_empty()).collect();
    let new: Vec<String> = sources(settings)
        .into_iter()
        .filter(|s| !then.contains(&s.as_str()))
        .collect();
    if new.is_empty() {
        return true;
    }
    log::info!(
        "the last login park is over: claude has credentials it did not have then ({})",
        new.iter()
            .map(|s| s.split('@').next().unwrap_or(s))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = fs::remove_file(&path);
    false
}

/// Is there any credential claude could use?
pub fn credentials_available(settings: &Settings) -> bool {
    let env_set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    env_set("ANTHROPIC_API_KEY")
        || env_set("CLAUDE_CODE_OAUTH_TOKEN")
        || env_set("ANTHROPIC_AUTH_TOKEN")
        || stored_token(settings).is_some()
        || settings
            .claude_config_dir
            .join(".credentials.json")
            .is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_advances_on_new_or_newer_files() {
        let dir = std::env::temp_dir().join(format!("hive-snap-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let empty = DirSnapshot::take(&dir);
        assert!(!DirSnapshot::take(&dir).advanced_from(&empty));
        fs::write(dir.join(".credentials.json"), "{}").unwrap();
        let one = DirSnapshot::take(&dir);
        assert!(one.advanced_from(&empty));
        assert!(
            !DirSnapshot::take(&dir).advanced_from(&one),
            "stale files do not resume"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
