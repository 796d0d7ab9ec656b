//! The claude invocation and the on-boot files it points at. Written once at
//! start next to the socket (under `--run-dir`): `claude-mcp-config.json` (this
//! binary as `hive mcp` and `hive bash-mcp`, plus extra servers), the validated
//! `claude-settings.json` and the rendered `claude-system-prompt.md`, all 0600.
//! The MCP servers get only the variables named in their entries on top of
//! claude's environment, which has no operator variables; hive's own two are
//! `"alwaysLoad": true`, so the CLI waits for them to connect before the turn
//! instead of going on without their tools after 2 s (2.1.197) or hiding them
//! behind `ToolSearch` (2.1.332, when that tool is on), and a `timeout` above
//! their longest wait. This module
//! also owns the tool whitelist: the built-ins in `--tools` and everything in
//! `--allowedTools`.

use super::prompt::{self, PromptVars};
use super::settings::Settings;
use crate::proto::access::{Capability, ToolGroup};
use serde_json::{json, Map, Value};
use std::path::Path;

/// Built-in claude tools every agent gets.
pub const ALLOWED_BUILTIN_TOOLS: [&str; 5] = ["Edit", "Glob", "Grep", "Read", "Write"];

/// Built-ins that are never offered: shell goes through `mcp__bash__run`.
pub const DENIED_BUILTIN_TOOLS: [&str; 4] = ["Bash", "Task", "NotebookEdit", "TodoWrite"];

/// The bash server's tools, on for every agent.
pub const BASH_TOOLS: [&str; 2] = ["mcp__bash__run", "mcp__bash__status"];

/// What the boot files decided about tools.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolLists {
    /// For `--tools`.
    pub builtins: Vec<String>,
    /// For `--allowedTools`.
    pub allowed: Vec<String>,
}

/// The `mcp__hyperhive__*` tools of the enabled groups and capabilities: the
/// same list `hive mcp` shows in `tools/list`, from the one table in
/// `crate::mcp::hyperhive`.
pub fn hyperhive_tools(groups: &[ToolGroup], capabilities: &[Capability]) -> Vec<String> {
    crate::mcp::hyperhive::allowed_hyperhive_tools(groups, capabilities)
}

/// The built-ins for `--tools`.
pub fn builtin_tools(groups: &[ToolGroup]) -> Vec<String> {
    let mut out: Vec<String> = ALLOWED_BUILTIN_TOOLS
        .iter()
        .map(|s| s.to_string())
        .collect();
    for g in groups {
        out.extend(g.builtin_tools().iter().map(|s| s.to_string()));
    }
    out
}

/// The `--settings` blob: auto-compact and auto-memory off (hive owns
/// compaction), medium effort, and the denied built-ins.
pub fn settings_json() -> Value {
    json!({
        "autoCompactEnabled": false,
        "autoMemoryEnabled": false,
        "effortLevel": "medium",
        "permissions": { "deny": DENIED_BUILTIN_TOOLS },
    })
}

/// The CLI silently ignores a whole settings file with one badly typed value, so
/// the written file is read back and checked before claude ever sees it.
pub fn validate_settings(text: &str) -> Result<(), String> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| format!("settings are not valid JSON: {e}"))?;
    for key in ["autoCompactEnabled", "autoMemoryEnabled"] {
        if v.get(key) != Some(&Value::Bool(false)) {
            return Err(format!("settings must set {key} to the boolean false"));
        }
    }
    if !v.get("effortLevel").is_some_and(Value::is_string) {
        return Err("settings effortLevel must be a string".into());
    }
    let deny = v
        .pointer("/permissions/deny")
        .and_then(Value::as_array)
        .ok_or("settings permissions.deny must be a list")?;
    if !deny.iter().all(Value::is_string) {
        return Err("settings permissions.deny must list tool names".into());
    }
    Ok(())
}

/// Boot files are the harness's own: 0600 in a 0700 run dir.
fn write(path: &Path, text: &str) -> Result<(), String> {
    super::files::write_private(path, text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Parses `HIVE_EXTRA_MCP_SERVERS` (`{"name": {command, args?, env?,
/// allowedTools: [...]}}` or the same under `mcpServers`) into config entries and
/// the tools they add to `--allowedTools` (`["*"]` allows the whole server).
pub fn extra_servers(raw: Option<&str>) -> Result<(Map<String, Value>, Vec<String>), String> {
    let Some(raw) = raw else {
        return Ok((Map::new(), Vec::new()));
    };
    let v: Value = serde_json::from_str(raw)
        .map_err(|e| format!("HIVE_EXTRA_MCP_SERVERS is not valid JSON: {e}"))?;
    let servers = match v.get("mcpServers") {
        Some(s) => s.clone(),
        None => v,
    };
    let Value::Object(servers) = servers else {
        return Err("HIVE_EXTRA_MCP_SERVERS must be an object of servers by name".into());
    };
    let mut config = Map::new();
    let mut allowed = Vec::new();
    for (name, mut server) in servers {
        if matches!(name.as_str(), "hyperhive" | "bash") {
            return Err(format!(
                "HIVE_EXTRA_MCP_SERVERS: the server name {name:?} is taken by hive itself"
            ));
        }
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(format!("HIVE_EXTRA_MCP_SERVERS: bad server name {name:?}"));
        }
        let Some(obj) = server.as_object_mut() else {
            return Err(format!("HIVE_EXTRA_MCP_SERVERS.{name} must be an object"));
        };
        if !obj.contains_key("command") && !obj.contains_key("url") {
            return Err(format!(
                "HIVE_EXTRA_MCP_SERVERS.{name} needs a command (or url)"
            ));
        }
        let tools = obj
            .remove("allowedTools")
            .unwrap_or(Value::Array(Vec::new()));
        let Value::Array(tools) = tools else {
            return Err(format!(
                "HIVE_EXTRA_MCP_SERVERS.{name}.allowedTools must be a list"
            ));
        };
        for t in tools {
            match t.as_str() {
                Some("*") => allowed.push(format!("mcp__{name}")),
                Some(t) => allowed.push(format!("mcp__{name}__{t}")),
                None => {
                    return Err(format!(
                        "HIVE_EXTRA_MCP_SERVERS.{name}.allowedTools must list tool names"
                    ))
                }
            }
        }
        config.insert(name, server);
    }
    Ok((config, allowed))
}

/// Writes the three boot files, with this binary as the MCP servers' command;
/// returns the tool lists for every invocation.
pub fn write_boot_files(s: &Settings) -> Result<ToolLists, String> {
    let exe =
        std::env::current_exe().map_err(|e| format!("cannot find the running hive binary: {e}"))?;
    write_boot_files_for(s, &exe)
}

/// [`write_boot_files`] with `exe` as the `hive` binary the MCP servers run
/// (the real-CLI tests give the built `hive`, not the test binary).
pub fn write_boot_files_for(s: &Settings, exe: &Path) -> Result<ToolLists, String> {
    let exe = exe.display().to_string();
    let groups: Vec<&str> = s.tool_groups.iter().map(|g| g.name()).collect();
    let capabilities: Vec<&str> = s.capabilities.iter().map(|c| c.name()).collect();
    let (extra, extra_allowed) = extra_servers(s.extra_mcp_servers.as_deref())?;
    let mut servers = Map::new();
    servers.insert(
        "hyperhive".into(),
        json!({
            "command": exe,
            "args": ["mcp"],
            "alwaysLoad": true,
            "timeout": HYPERHIVE_CALL_TIMEOUT_MS,
            "env": {
                "HIVE_SOCKET": s.socket.display().to_string(),
                "HIVE_STATE_DIR": s.state_dir.display().to_string(),
                "HIVE_TOOL_GROUPS": groups.join(","),
                "HIVE_CAPABILITIES": capabilities.join(","),
                "HIVE_LABEL": s.label,
                "RUST_LOG": "warn",
            }
        }),
    );
    servers.insert(
        "bash".into(),
        json!({
            "command": exe,
            "args": ["bash-mcp"],
            "alwaysLoad": true,
            "timeout": BASH_CALL_TIMEOUT_MS,
            "env": {
                "HIVE_BASH_SOCKET": s.bash_socket.display().to_string(),
                "RUST_LOG": "warn",
            }
        }),
    );
    servers.extend(extra);
    let mcp = json!({ "mcpServers": servers });
    write(
        &s.mcp_config_path(),
        &serde_json::to_string_pretty(&mcp).unwrap_or_default(),
    )?;

    let settings = serde_json::to_string_pretty(&settings_json()).unwrap_or_default();
    write(&s.settings_path(), &settings)?;
    let back = std::fs::read_to_string(s.settings_path())
        .map_err(|e| format!("cannot read back {}: {e}", s.settings_path().display()))?;
    validate_settings(&back).map_err(|e| format!("{}: {e}", s.settings_path().display()))?;

    let vars = PromptVars::from_env(&s.label);
    write(
        &s.system_prompt_path(),
        &prompt::render(prompt::SYSTEM_TEMPLATE, &vars),
    )?;

    let builtins = builtin_tools(&s.tool_groups);
    let mut allowed = builtins.clone();
    allowed.extend(hyperhive_tools(&s.tool_groups, &s.capabilities));
    allowed.extend(BASH_TOOLS.iter().map(|t| t.to_string()));
    allowed.extend(extra_allowed);
    Ok(ToolLists { builtins, allowed })
}

/// The variables every claude run gets on top of the environment it
/// inherits (which has no operator variables): the CLI's own retries, kept
/// low so a refused request comes back to the harness's policy instead of
/// blocking the turn for minutes; and no moving of MCP calls to the
/// background (CLI 2.1.212+, on in print mode with
/// `CLAUDE_AUTO_BACKGROUND_TASKS`): a backgrounded call's result may never
/// reach the model once the turn ends (`docs/claude-cli.md`). The MCP servers
/// inherit them, so `hive mcp` sizes its waits by them.
pub fn claude_vars(max_retries: u32) -> Vec<(String, String)> {
    vec![
        (
            "CLAUDE_CODE_MAX_RETRIES".to_string(),
            max_retries.to_string(),
        ),
        (
            "CLAUDE_CODE_MCP_AUTO_BACKGROUND_MS".to_string(),
            "0".to_string(),
        ),
    ]
}

/// The trace variables of one run (issue 43): `TRACEPARENT`, the run's
/// span, so the CLI's own spans (and `hive mcp`'s sends) nest under or link
/// to it; and, with `telemetry.cli`, the collector's endpoint and headers.
/// No other `OTEL_` variable reaches claude (`agent_proc::is_operator_var`).
pub fn trace_vars(traceparent: String, cli: &[(String, String)]) -> Vec<(String, String)> {
    let mut v = vec![("TRACEPARENT".to_string(), traceparent)];
    v.extend(cli.iter().cloned());
    v
}

/// The per-server `timeout` (ms) of hive's MCP servers in the config: the
/// CLI's own limit on one call (2.1.197 and 2.1.332 honour the key; neither
/// has a default, and `request_timeout_ms` is ignored for stdio), set above
/// the longest any of their tools waits, so it only ends a call that hangs.
/// A call it ends is cancelled (`notifications/cancelled`): a `recv` then
/// confirms nothing.
pub const HYPERHIVE_CALL_TIMEOUT_MS: u64 = (crate::proto::limits::RECV_WAIT_CAP_SECS + 50) * 1000;

/// The bash server's: its waits are at most `bash::proto::MAX_WAIT_SECS`.
pub const BASH_CALL_TIMEOUT_MS: u64 = (crate::bash::proto::MAX_WAIT_SECS + 30) * 1000;

/// The argv after the binary: exactly the specification's invocation. The prompt
/// goes on stdin: `--tools`, `--allowedTools` and `--mcp-config` are variadic.
/// `max_budget_usd` is the fleet entry's `turn_usd` (issue 16), passed as the
/// CLI's own `--max-budget-usd`.
pub fn claude_args(
    s: &Settings,
    tools: &ToolLists,
    model: &str,
    resume: bool,
    max_budget_usd: Option<f64>,
) -> Vec<String> {
    let mut a: Vec<String> = [
        "--print",
        "--verbose",
        "--output-format",
        "stream-json",
        "--model",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect();
    a.push(model.to_string());
    if resume {
        a.push("--continue".into());
    }
    a.push("--settings".into());
    a.push(s.settings_path().display().to_string());
    a.push("--system-prompt-file".into());
    a.push(s.system_prompt_path().display().to_string());
    a.push("--mcp-config".into());
    a.push(s.mcp_config_path().display().to_string());
    a.push("--strict-mcp-config".into());
    a.push("--tools".into());
    a.push(tools.builtins.join(","));
    a.push("--allowedTools".into());
    a.push(tools.allowed.join(","));
    if let Some(usd) = max_budget_usd.filter(|u| u.is_finite() && *u > 0.0) {
        a.push("--max-budget-usd".into());
        a.push(usd.to_string());
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_blob_is_valid_and_typos_are_caught() {
        validate_settings(&settings_json().to_string()).unwrap();
        let bad = r#"{"autoCompactEnabled":"no","autoMemoryEnabled":false,"effortLevel":"medium","permissions":{"deny":[]}}"#;
        assert!(validate_settings(bad)
            .unwrap_err()
            .contains("autoCompactEnabled"));
        assert!(validate_settings("{").is_err());
    }

    #[test]
    fn turn_usd_becomes_the_clis_max_budget_flag() {
        let s = Settings::read(
            std::path::Path::new("/s"),
            std::path::Path::new("/r"),
            &crate::sys::env::Env::new(&|_: &str| None),
        )
        .unwrap();
        let tools = ToolLists::default();
        let without = claude_args(&s, &tools, "m", true, None);
        assert!(!without.iter().any(|a| a == "--max-budget-usd"));
        let with = claude_args(&s, &tools, "m", true, Some(0.25));
        let at = with.iter().position(|a| a == "--max-budget-usd").unwrap();
        assert_eq!(with[at + 1], "0.25");
        let bad = claude_args(&s, &tools, "m", true, Some(f64::NAN));
        assert!(!bad.iter().any(|a| a == "--max-budget-usd"));
    }

    /// The CLI's per-call limit on hive's servers is above their longest
    /// wait, and backgrounding is off for every run.
    #[test]
    fn the_call_timeouts_clear_the_longest_waits() {
        use crate::proto::limits::RECV_WAIT_CAP_SECS;
        const { assert!(HYPERHIVE_CALL_TIMEOUT_MS > RECV_WAIT_CAP_SECS * 1000) };
        const { assert!(BASH_CALL_TIMEOUT_MS > crate::bash::proto::MAX_WAIT_SECS * 1000) };
        let vars = claude_vars(2);
        assert!(vars.contains(&("CLAUDE_CODE_MCP_AUTO_BACKGROUND_MS".into(), "0".into())));
        assert!(vars.contains(&("CLAUDE_CODE_MAX_RETRIES".into(), "2".into())));
    }

    #[test]
    fn whitelist_follows_groups() {
        let groups = crate::proto::access::parse_groups("").unwrap();
        let b = builtin_tools(&groups);
        assert_eq!(b, ["Edit", "Glob", "Grep", "Read", "Write"]);
        assert!(!b.iter().any(|t| DENIED_BUILTIN_TOOLS.contains(&t.as_str())));
        let web = crate::proto::access::parse_groups("messaging,web_tools").unwrap();
        assert!(builtin_tools(&web).contains(&"WebFetch".to_string()));
        let h = hyperhive_tools(&groups, &[]);
        assert!(h.contains(&"mcp__hyperhive__send".to_string()));
        assert!(h.contains(&"mcp__hyperhive__request_next_turn".to_string()));
        assert!(
            !h.iter().any(|t| t.ends_with("__run")),
            "no dead execution entries"
        );
    }

    #[test]
    fn extra_servers_add_their_allowed_tools() {
        let (cfg, allowed) = extra_servers(Some(
            r#"{"matrix":{"command":"hive-matrix","allowedTools":["*"]},
                "notes":{"command":"n","args":["x"],"allowedTools":["read","write"]}}"#,
        ))
        .unwrap();
        assert!(cfg["matrix"].get("allowedTools").is_none());
        assert_eq!(
            allowed,
            ["mcp__matrix", "mcp__notes__read", "mcp__notes__write"]
        );
        for bad in [
            r#"{"bash":{"command":"x"}}"#,
            r#"{"x":{"args":[]}}"#,
            r#"{"x":{"command":"c","allowedTools":"*"}}"#,
            "[1]",
        ] {
            assert!(extra_servers(Some(bad)).is_err(), "{bad}");
        }
    }
}
