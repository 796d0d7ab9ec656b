//! The settings of one `hive serve`: the command-line flags plus every environment
//! variable the harness reads, each with its default, resolved once at start so the
//! rest of the harness never touches the environment. `docs/env.md` lists them.

use crate::groups::{self, ToolGroup};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Everything the harness needs to know, from flags and environment.
#[derive(Debug, Clone)]
pub struct Settings {
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
    /// The agent's broker socket (`HIVE_SOCKET`).
    pub socket: PathBuf,
    /// The bash-task daemon's socket (`HIVE_BASH_SOCKET`).
    pub bash_socket: PathBuf,
    pub label: String,
    pub claude_bin: String,
    pub tool_groups: Vec<ToolGroup>,
    /// Raw `HIVE_EXTRA_MCP_SERVERS` JSON, validated when the boot files are written.
    pub extra_mcp_servers: Option<String>,
    pub model_file: PathBuf,
    pub default_model: String,
    /// Value of `CLAUDE_CODE_MAX_RETRIES` for the child.
    pub claude_max_retries: u32,
    pub turn_timeout: Duration,
    /// A run that prints nothing this long with no tool call open is hung
    /// (`HIVE_TURN_IDLE_SECS`; `None` when 0).
    pub turn_idle: Option<Duration>,
    /// Failures of one message, for reasons of its own, before it is
    /// dead-lettered (`HIVE_TURN_MAX_ATTEMPTS`, at least 1).
    pub max_attempts: u32,
    pub kill_grace: Duration,
    pub poll_wait_secs: u64,
    /// Pause after a failed turn, against tight loops.
    pub fail_pause: Duration,
    pub rate_limit_sleep: Duration,
    pub rate_limit_max_sleep: Duration,
    pub api_backoff_base: Duration,
    pub api_backoff_max: Duration,
    /// Consecutive API-unavailable turns before the parent is told.
    pub api_failures_before_notice: u32,
    pub login_poll: Duration,
    pub reconnect_max: Duration,
    /// Cap on the pause after claude could not be started (it doubles from
    /// `fail_pause` per failure in a row).
    pub start_backoff_max: Duration,
    pub claude_config_dir: PathBuf,
    pub plugin_marketplaces: Vec<String>,
    pub plugins: Vec<String>,
    pub plugins_auto_update: bool,
}

fn env(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.trim().is_empty())
}

fn env_num(key: &str, default: u64) -> Result<u64, String> {
    match env(key) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("{key}={v:?} is not a whole number")),
    }
}

fn env_secs(key: &str, default: u64) -> Result<Duration, String> {
    env_num(key, default).map(Duration::from_secs)
}

fn env_millis(key: &str, default: u64) -> Result<Duration, String> {
    env_num(key, default).map(Duration::from_millis)
}

fn env_list(key: &str) -> Vec<String> {
    env(key)
        .map(|v| {
            v.split([',', '\n'])
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

fn env_bool(key: &str, default: bool) -> Result<bool, String> {
    match env(key).as_deref().map(str::trim) {
        None => Ok(default),
        Some("1" | "true" | "yes" | "on") => Ok(true),
        Some("0" | "false" | "no" | "off") => Ok(false),
        Some(v) => Err(format!("{key}={v:?} must be true or false")),
    }
}

/// The claude config dir the CLI uses: `CLAUDE_CONFIG_DIR`, else `~/.claude`.
pub fn claude_config_dir() -> PathBuf {
    if let Some(d) = env("CLAUDE_CONFIG_DIR") {
        return PathBuf::from(d);
    }
    let home = env("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".claude")
}

/// The longest model name accepted.
const MAX_MODEL_NAME: usize = 100;

/// Checks a model name as given by the operator (`HIVE_DEFAULT_MODEL`, the
/// page's model endpoint, the persisted choice): letters, digits and `-_.:[]/@`
/// only, not starting with `-` (claude would read it as an option), at most 100
/// bytes. Surrounding whitespace is trimmed. The error echoes at most a short
/// prefix of what was given.
pub fn check_model(name: &str) -> Result<String, String> {
    let name = name.trim();
    let ok = !name.is_empty()
        && name.len() <= MAX_MODEL_NAME
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:[]/@".contains(c));
    if ok {
        return Ok(name.to_string());
    }
    let shown: String = name.chars().take(40).collect();
    let cut = if shown.len() < name.len() { "…" } else { "" };
    Err(format!(
        "{shown:?}{cut} is not a model name (letters, digits and -_.:[]/@ only, not starting \
         with -, at most {MAX_MODEL_NAME} bytes; e.g. haiku, sonnet, claude-sonnet-4-5)"
    ))
}

impl Settings {
    /// Resolves `hive serve`'s flags (the state and run dirs) and the
    /// environment; a bad value is an error naming the variable.
    pub fn resolve(state_dir: &Path, run_dir: &Path) -> Result<Settings, String> {
        let model_file = match env("HYPERHIVE_MODEL_FILE") {
            Some(f) => PathBuf::from(f),
            None if Path::new("/harness").is_dir() => PathBuf::from("/harness/hyperhive-model"),
            None => state_dir.join("hyperhive-model"),
        };
        let tool_groups = groups::parse_groups(&env("HIVE_TOOL_GROUPS").unwrap_or_default())
            .map_err(|e| format!("HIVE_TOOL_GROUPS: {e}"))?;
        let label = env("HIVE_LABEL").unwrap_or_else(|| "hive".into());
        Ok(Settings {
            state_dir: state_dir.to_path_buf(),
            run_dir: run_dir.to_path_buf(),
            socket: PathBuf::from(
                env("HIVE_SOCKET")
                    .unwrap_or_else(|| crate::proto::paths::DEFAULT_AGENT_SOCKET.into()),
            ),
            bash_socket: PathBuf::from(
                env("HIVE_BASH_SOCKET")
                    .unwrap_or_else(|| crate::proto::paths::DEFAULT_BASH_SOCKET.into()),
            ),
            label,
            claude_bin: env("HIVE_CLAUDE_BIN").unwrap_or_else(|| "claude".into()),
            tool_groups,
            extra_mcp_servers: env("HIVE_EXTRA_MCP_SERVERS"),
            model_file,
            default_model: match env("HIVE_DEFAULT_MODEL") {
                Some(m) => check_model(&m).map_err(|e| format!("HIVE_DEFAULT_MODEL: {e}"))?,
                None => "haiku".into(),
            },
            claude_max_retries: env_num("HIVE_CLAUDE_MAX_RETRIES", 2)? as u32,
            turn_timeout: env_secs("HIVE_TURN_TIMEOUT_SECS", 3600)?,
            turn_idle: Some(env_secs("HIVE_TURN_IDLE_SECS", 900)?).filter(|d| !d.is_zero()),
            max_attempts: env_num("HIVE_TURN_MAX_ATTEMPTS", 5)?.clamp(1, u64::from(u32::MAX))
                as u32,
            kill_grace: env_millis("HIVE_KILL_GRACE_MS", 3000)?,
            poll_wait_secs: env_num("HIVE_POLL_WAIT_SECS", 30)?.clamp(1, 180),
            fail_pause: env_millis("HIVE_POLL_MS", 1000)?,
            rate_limit_sleep: env_secs("HIVE_RATE_LIMIT_SLEEP_SECS", 300)?,
            rate_limit_max_sleep: env_secs("HIVE_RATE_LIMIT_MAX_SLEEP_SECS", 6 * 3600)?,
            api_backoff_base: env_secs("HIVE_API_BACKOFF_SECS", 15)?,
            api_backoff_max: env_secs("HIVE_API_BACKOFF_MAX_SECS", 900)?,
            api_failures_before_notice: env_num("HIVE_API_FAILURES_BEFORE_NOTICE", 3)? as u32,
            login_poll: env_millis("HIVE_LOGIN_POLL_MS", 5000)?,
            reconnect_max: env_millis("HIVE_RECONNECT_MAX_MS", 10_000)?,
            start_backoff_max: env_millis("HIVE_START_BACKOFF_MAX_MS", 60_000)?,
            claude_config_dir: claude_config_dir(),
            plugin_marketplaces: env_list("HIVE_CLAUDE_MARKETPLACES"),
            plugins: env_list("HIVE_CLAUDE_PLUGINS"),
            plugins_auto_update: env_bool("HIVE_CLAUDE_PLUGINS_AUTO_UPDATE", false)?,
        })
    }

    pub fn mcp_config_path(&self) -> PathBuf {
        self.run_dir.join("claude-mcp-config.json")
    }

    pub fn settings_path(&self) -> PathBuf {
        self.run_dir.join("claude-settings.json")
    }

    pub fn system_prompt_path(&self) -> PathBuf {
        self.run_dir.join("claude-system-prompt.md")
    }

    /// Dropped by the `request_next_turn` tool, consumed after each turn.
    pub fn continue_sentinel(&self) -> PathBuf {
        self.state_dir.join("hyperhive-continue")
    }

    /// Present while the harness waits for the operator to log claude in.
    pub fn needs_login_sentinel(&self) -> PathBuf {
        self.state_dir.join("hyperhive-needs-login")
    }

    pub fn stats_db(&self) -> PathBuf {
        self.state_dir.join("turn-stats.db")
    }

    pub fn status_file(&self) -> PathBuf {
        self.state_dir.join("hyperhive-status")
    }

    /// A token stored through the web login flow (0600).
    pub fn credentials_file(&self) -> PathBuf {
        self.state_dir.join("hyperhive-credentials")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_that_could_be_options_or_garbage_are_refused() {
        for good in [
            "haiku",
            " sonnet\n",
            "claude-sonnet-4-5",
            "opus[1m]",
            "a/b@c:d_e.f",
        ] {
            assert_eq!(check_model(good).unwrap(), good.trim(), "{good:?}");
        }
        for bad in [
            "",
            "   ",
            "-x",
            "--model",
            "--foo",
            "has space",
            "tab\there",
            "nul\0",
            "esc\u{1b}[2J",
            "bidi\u{202e}",
            "é",
        ] {
            let e = check_model(bad).unwrap_err();
            assert!(e.contains("is not a model name"), "{bad:?}: {e}");
        }
        let long = "m".repeat(1 << 20);
        let e = check_model(&long).unwrap_err();
        assert!(
            e.len() < 300,
            "the error echoes only a prefix: {} bytes",
            e.len()
        );
        assert!(e.contains('…'), "{e}");
    }
}
