//! The settings of one `hive serve`: the command-line flags plus every environment
//! variable the harness reads, each with its default, resolved once at start
//! through `sys::env::Env` (trimmed, blank is unset, a bad value names its
//! variable) so the rest of the harness never touches the environment.
//! `docs/env.md` lists them.

use crate::proto::access::{self, Capability, ToolGroup};
use crate::proto::cmd::check_model_name;
use crate::proto::paths::state;
use crate::sys::env::Env;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Everything the harness needs to know, from flags and environment.
#[derive(Debug, Clone)]
pub struct Settings {
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
    /// The agent's broker socket (`HIVE_SOCKET`).
    pub socket: PathBuf,
    /// Where the harness's broker connections come from: its credential
    /// when `hive up` handed one down (`serve.rs` takes it), else `socket`.
    pub broker: crate::proto::Dial,
    /// The bash-task daemon's socket (`HIVE_BASH_SOCKET`).
    pub bash_socket: PathBuf,
    pub label: String,
    pub claude_bin: String,
    pub tool_groups: Vec<ToolGroup>,
    /// `HIVE_CAPABILITIES`: capabilities that grant a tool by themselves
    /// (`read_host_journal`), passed on to `hive mcp`.
    pub capabilities: Vec<Capability>,
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
    /// Tell the parent (once per version) when claude's version is outside
    /// the supported window (`HIVE_CLI_WINDOW_NOTICE`, on by default); `hive
    /// up` turns it off for its harnesses and tells the operator itself.
    pub cli_window_notice: bool,
}

/// The claude config dir the CLI uses: `CLAUDE_CONFIG_DIR`, else `~/.claude`.
pub fn claude_config_dir(env: &Env) -> PathBuf {
    if let Some(d) = env.path("CLAUDE_CONFIG_DIR") {
        return d;
    }
    env.path_or("HOME", "/root").join(".claude")
}

/// Checks a model name as given by the operator (`HIVE_DEFAULT_MODEL`, the
/// page's model endpoint): the wire's rule ([`check_model_name`]: letters,
/// digits and `-_.:[]/@` only, not starting with `-`, which claude would
/// read as an option, at most 100 bytes) after surrounding whitespace is
/// trimmed. The error echoes at most a short prefix of what was given.
pub fn check_model(name: &str) -> Result<String, String> {
    let name = name.trim();
    check_model_name(name)?;
    Ok(name.to_string())
}

impl Settings {
    /// Resolves `hive serve`'s flags (the state and run dirs) and the process
    /// environment.
    pub fn resolve(state_dir: &Path, run_dir: &Path) -> Result<Settings, String> {
        Settings::read(state_dir, run_dir, &Env::process())
    }

    /// The settings for the state and run dirs, with the rest from `env`; a
    /// bad value is an error naming the variable.
    pub fn read(state_dir: &Path, run_dir: &Path, env: &Env) -> Result<Settings, String> {
        let model_file = match env.path("HYPERHIVE_MODEL_FILE") {
            Some(f) => f,
            None if Path::new("/harness").is_dir() => Path::new("/harness").join(state::MODEL),
            None => state_dir.join(state::MODEL),
        };
        let tool_groups = access::parse_groups(&env.get("HIVE_TOOL_GROUPS").unwrap_or_default())
            .map_err(|e| format!("HIVE_TOOL_GROUPS: {e}"))?;
        let capabilities =
            access::parse_capabilities(&env.get("HIVE_CAPABILITIES").unwrap_or_default())
                .map_err(|e| format!("HIVE_CAPABILITIES: {e}"))?;
        let label = env.get("HIVE_LABEL").unwrap_or_else(|| "hive".into());
        // The OpenTelemetry settings (issue 43): a bad one stops the start,
        // naming its variable; the turn loop's tracer reads them again.
        crate::telemetry::Config::resolve(env, None)?;
        Ok(Settings {
            state_dir: state_dir.to_path_buf(),
            run_dir: run_dir.to_path_buf(),
            socket: env.path_or("HIVE_SOCKET", crate::proto::paths::DEFAULT_AGENT_SOCKET),
            broker: crate::proto::Dial::Socket(
                env.path_or("HIVE_SOCKET", crate::proto::paths::DEFAULT_AGENT_SOCKET),
            ),
            bash_socket: env.path_or("HIVE_BASH_SOCKET", crate::proto::paths::DEFAULT_BASH_SOCKET),
            label,
            claude_bin: env
                .get("HIVE_CLAUDE_BIN")
                .unwrap_or_else(|| "claude".into()),
            tool_groups,
            capabilities,
            extra_mcp_servers: env.get("HIVE_EXTRA_MCP_SERVERS"),
            model_file,
            default_model: match env.get("HIVE_DEFAULT_MODEL") {
                Some(m) => check_model(&m).map_err(|e| format!("HIVE_DEFAULT_MODEL: {e}"))?,
                None => "haiku".into(),
            },
            claude_max_retries: env
                .num("HIVE_CLAUDE_MAX_RETRIES", 2)?
                .min(u64::from(u32::MAX)) as u32,
            turn_timeout: env.secs("HIVE_TURN_TIMEOUT_SECS", 3600)?,
            turn_idle: Some(env.secs("HIVE_TURN_IDLE_SECS", 900)?).filter(|d| !d.is_zero()),
            max_attempts: env
                .num("HIVE_TURN_MAX_ATTEMPTS", 5)?
                .clamp(1, u64::from(u32::MAX)) as u32,
            kill_grace: env.millis("HIVE_KILL_GRACE_MS", 3000)?,
            poll_wait_secs: env.num("HIVE_POLL_WAIT_SECS", 30)?.clamp(1, 180),
            fail_pause: env.millis("HIVE_POLL_MS", 1000)?,
            rate_limit_sleep: env.secs("HIVE_RATE_LIMIT_SLEEP_SECS", 300)?,
            rate_limit_max_sleep: env.secs("HIVE_RATE_LIMIT_MAX_SLEEP_SECS", 6 * 3600)?,
            api_backoff_base: env.secs("HIVE_API_BACKOFF_SECS", 15)?,
            api_backoff_max: env.secs("HIVE_API_BACKOFF_MAX_SECS", 900)?,
            api_failures_before_notice: env
                .num("HIVE_API_FAILURES_BEFORE_NOTICE", 3)?
                .min(u64::from(u32::MAX)) as u32,
            login_poll: env.millis("HIVE_LOGIN_POLL_MS", 5000)?,
            reconnect_max: env.millis("HIVE_RECONNECT_MAX_MS", 10_000)?,
            start_backoff_max: env.millis("HIVE_START_BACKOFF_MAX_MS", 60_000)?,
            claude_config_dir: claude_config_dir(env),
            plugin_marketplaces: env.list("HIVE_CLAUDE_MARKETPLACES"),
            plugins: env.list("HIVE_CLAUDE_PLUGINS"),
            plugins_auto_update: env.switch("HIVE_CLAUDE_PLUGINS_AUTO_UPDATE", false)?,
            cli_window_notice: env.switch("HIVE_CLI_WINDOW_NOTICE", true)?,
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
        self.state_dir.join(state::CONTINUE)
    }

    /// Present while the harness waits for the operator to log claude in.
    pub fn needs_login_sentinel(&self) -> PathBuf {
        self.state_dir.join(state::NEEDS_LOGIN)
    }

    pub fn stats_db(&self) -> PathBuf {
        self.state_dir.join(super::turnstats::FILE)
    }

    pub fn status_file(&self) -> PathBuf {
        self.state_dir.join(state::STATUS)
    }

    /// A token stored through the web login flow (0600).
    pub fn credentials_file(&self) -> PathBuf {
        self.state_dir.join(state::CREDENTIALS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_come_from_the_env_once_and_a_bad_value_names_its_variable() {
        let read = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let lookup = move |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            Settings::read(Path::new("/s"), Path::new("/r"), &Env::new(&lookup))
        };
        let s = read(&[
            ("HIVE_TURN_TIMEOUT_SECS", " 60 "),
            ("HIVE_LABEL", "   "),
            ("HIVE_CLAUDE_PLUGINS", "a, b\nc"),
            ("HIVE_CLAUDE_PLUGINS_AUTO_UPDATE", "on"),
            ("HIVE_TURN_IDLE_SECS", "0"),
            ("HOME", "/home/ana"),
        ])
        .unwrap();
        assert_eq!(s.turn_timeout, Duration::from_secs(60));
        assert_eq!(s.label, "hive", "blank is unset");
        assert_eq!(s.plugins, ["a", "b", "c"]);
        assert!(s.plugins_auto_update);
        assert_eq!(s.turn_idle, None);
        assert_eq!(s.claude_config_dir, PathBuf::from("/home/ana/.claude"));
        assert_eq!(
            s.socket,
            PathBuf::from(crate::proto::paths::DEFAULT_AGENT_SOCKET)
        );
        for (key, value) in [
            ("HIVE_KILL_GRACE_MS", "soon"),
            ("HIVE_CLAUDE_PLUGINS_AUTO_UPDATE", "maybe"),
            ("HIVE_DEFAULT_MODEL", "--evil"),
        ] {
            let e = read(&[(key, value)]).unwrap_err();
            assert!(e.contains(key), "{key}: {e}");
        }
    }

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
