//! One agent's entry in the fleet file, as every process sees it: the fleet
//! file and `hive broker --config` hold a list of them, the supervision row
//! carries the one an agent runs with, an approved spawn or merge patch writes
//! one. The hive-wide config around it, its validation and the topology
//! questions (`config`) sit above the contract.

use super::access::{Capability, ToolGroup};
use super::enums::closed_enum;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One agent of the hive.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// At most 9 characters of `[a-z0-9-]`.
    pub name: String,
    /// Another agent's name; absent means a root agent whose parent is the operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// When non-empty, the only recipients `send` accepts (the parent always is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_recipients: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Absent or empty means the default preset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_groups: Vec<ToolGroup>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<Capability>,
    /// Owner of the agent's socket, so a harness running as that user connects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_uid: Option<u32>,
    /// Group of the agent's socket; when set the socket is mode 0660.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_gid: Option<u32>,
    /// Extra environment for the agent's harness (`hive up` passes it on).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The credential pool it draws on (issue 16): agents with the same
    /// `account` share one usage limit. Needed when several logins or API
    /// keys draw on one account; otherwise the pool comes from the claude
    /// config's account id or the credential itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// What the agent may spend per calendar window (issue 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// The most one claude run may cost, in dollars (issue 16): passed as the
    /// CLI's own `--max-budget-usd` to every run; a turn that reaches it is
    /// acked with a notice to the parent, never run again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_usd: Option<f64>,
    /// The per-agent options of the specification (`hyperhive.*` of an
    /// agent module), keys of the entry itself; boxed, as most entries set
    /// none of them.
    #[serde(flatten)]
    pub options: Box<AgentOptions>,
}

/// The per-agent options of the specification (`hyperhive.*` of an agent
/// module), so that a fleet file declares a whole agent: `hive up` hands each
/// to the harness as the variable the module would set (`HIVE_…`). In the
/// file they are keys of the entry, next to the others.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentOptions {
    /// Proactive compaction at the watermark (`HIVE_AUTO_COMPACT`); absent is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_compact: Option<bool>,
    /// An SVG for the page header and favicon (`HIVE_ICON`): an absolute
    /// path, checked when the file loads, shown read-only in the sandbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icon: Option<String>,
    /// Links on the agent's dashboard card and page header.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dashboard_links: Vec<DashboardLink>,
    /// A directory served under the page's own paths (`HIVE_STATIC_DIR`,
    /// the specification's `frontend.extraFiles`); like `icon`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_dir: Option<String>,
    /// A directory that replaces the built-in page (`HIVE_WEB_DIST`,
    /// `frontend.dist`); like `icon`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_dist: Option<String>,
    /// The Forgejo base URL (`HIVE_FORGE_URL`); `""` switches forge
    /// notifications off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge_url: Option<String>,
    /// The per-agent Matrix homeserver URL (`HIVE_MATRIX_URL`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix_url: Option<String>,
    /// `claude plugin marketplace add` sources at boot
    /// (`HIVE_CLAUDE_MARKETPLACES`); absent keeps the harness's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude_marketplaces: Option<Vec<String>>,
    /// `claude plugin install` specs at boot (`HIVE_CLAUDE_PLUGINS`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claude_plugins: Vec<String>,
    /// `claude plugin marketplace update` at boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claude_plugins_auto_update: Option<bool>,
    /// Bash tasks get the `cargo` function that adds `--message-format
    /// short` (`hive env-script`); absent is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cargo_short_messages: Option<bool>,
    /// The operator's pronouns in the system prompt (`HIVE_OPERATOR_PRONOUNS`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_pronouns: Option<String>,
    /// Context windows by a part of the model name
    /// (`HIVE_CONTEXT_WINDOW_TOKENS_<KEY>`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub context_window_tokens: BTreeMap<String, u64>,
    /// More MCP servers for claude (`HIVE_EXTRA_MCP_SERVERS`): name →
    /// `{command, args, env, allowedTools}` (or `{url}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_mcp_servers: BTreeMap<String, serde_json::Value>,
}

/// One link of an agent's dashboard card: a label, an http(s) URL and an
/// optional icon (an emoji or a short text).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DashboardLink {
    pub label: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub icon: String,
}

closed_enum! {
    /// The calendar window a budget covers, in UTC.
    #[derive(Default)]
    pub enum Per ("per", "windows") {
        /// From 00:00 UTC.
        #[default]
        Day = "day",
        /// From Monday 00:00 UTC.
        Week = "week",
        /// From the 1st, 00:00 UTC.
        Month = "month",
    }
}

/// A spending limit per calendar window (UTC): dollars (`total_cost_usd`,
/// the API-equivalent price for subscription users) and tokens (input +
/// cache writes + output; cache reads are not counted). Either may be absent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default)]
    pub per: Per,
}

impl Budget {
    /// Every rule of a budget, the error naming the field under `at`.
    pub fn check(&self, at: &str) -> Result<(), String> {
        if let Some(u) = self.usd {
            if !u.is_finite() || !(0.0..=1_000_000.0).contains(&u) {
                return Err(format!(
                    "{at}.usd: {u} must be a number of dollars from 0 to 1000000"
                ));
            }
        }
        if self.tokens.is_some_and(|t| t > 1_000_000_000_000) {
            return Err(format!("{at}.tokens: must be at most 10^12"));
        }
        Ok(())
    }
}

/// `HIVE_CONTEXT_WINDOW_TOKENS_<KEY>` for a `context_window_tokens` key: upper
/// case, `-` and `.` as `_` (as `nix/env.nix` names it).
pub fn window_var(key: &str) -> String {
    let k: String = key
        .chars()
        .map(|c| match c {
            '-' | '.' => '_',
            c => c.to_ascii_uppercase(),
        })
        .collect();
    format!("HIVE_CONTEXT_WINDOW_TOKENS_{k}")
}

/// The rule of `turn_usd`, the error naming the field under `at`.
pub fn check_turn_usd(v: Option<f64>, at: &str) -> Result<(), String> {
    match v {
        Some(u) if !u.is_finite() || u <= 0.0 || u > 1_000_000.0 => Err(format!(
            "{at}.turn_usd: {u} must be a number of dollars above 0 and at most 1000000"
        )),
        _ => Ok(()),
    }
}

impl AgentConfig {
    /// A root agent with every default, as `hive broker --agents` makes them.
    pub fn named(name: &str) -> AgentConfig {
        AgentConfig {
            name: name.to_string(),
            ..AgentConfig::default()
        }
    }

    /// The agent's tool groups, the default preset when none are configured.
    pub fn groups(&self) -> Vec<ToolGroup> {
        ToolGroup::effective(&self.tool_groups)
    }

    pub fn has_capability(&self, cap: Capability) -> bool {
        self.capabilities.contains(&cap)
    }

    /// Every key of an entry, in the order of the struct (the options' last).
    pub const KEYS: [&'static str; 26] = [
        "name",
        "parent",
        "allowed_recipients",
        "model",
        "tool_groups",
        "capabilities",
        "socket_uid",
        "socket_gid",
        "env",
        "account",
        "budget",
        "turn_usd",
        "auto_compact",
        "icon",
        "dashboard_links",
        "static_dir",
        "web_dist",
        "forge_url",
        "matrix_url",
        "claude_marketplaces",
        "claude_plugins",
        "claude_plugins_auto_update",
        "cargo_short_messages",
        "operator_pronouns",
        "context_window_tokens",
        "extra_mcp_servers",
    ];

    /// The keys that apply without a restart (issue 16): `budget`,
    /// `account` and `turn_usd`, which the broker reads at every hand-out
    /// (`turn_usd` travels with the hand-out to the harness). The supervisor
    /// leaves them out of its up-to-date comparison.
    pub const LIVE_KEYS: [&'static str; 3] = ["budget", "account", "turn_usd"];

    /// The live keys a merge patch sets (or removes), in [`Self::LIVE_KEYS`]
    /// order: what the approval card and the operator's notice flag.
    pub fn live_keys_in(patch: &serde_json::Value) -> Vec<&'static str> {
        Self::LIVE_KEYS
            .into_iter()
            .filter(|k| patch.get(*k).is_some())
            .collect()
    }

    /// What the approval card and the operator's notice say of a merge
    /// patch that touches live keys: that they apply at once, and whether
    /// the patch's other keys restart the agent; `None` without live keys.
    /// Given the entry as it is and as the patch would make it (`entries`),
    /// the restart is judged as the supervisor judges it
    /// ([`Self::restarts_from`]): other keys that keep their values restart
    /// nothing, and a patch that changes nothing says so. Without them, any
    /// other key counts as a change.
    pub fn live_flag(
        patch: &serde_json::Value,
        entries: Option<(&AgentConfig, &AgentConfig)>,
    ) -> Option<String> {
        let live = Self::live_keys_in(patch);
        if live.is_empty() {
            return None;
        }
        let keys = live.join(", ");
        let restarts = match entries {
            Some((current, patched)) if current == patched => {
                let values = if live.len() == 1 {
                    "its current value"
                } else {
                    "their current values"
                };
                return Some(format!(
                    "sets {keys} to {values}: changes nothing, no restart"
                ));
            }
            Some((current, patched)) => patched.restarts_from(current),
            None => patch
                .as_object()
                .is_some_and(|o| o.keys().any(|k| !Self::LIVE_KEYS.contains(&k.as_str()))),
        };
        Some(format!(
            "sets {keys}: applies at once, {}",
            if restarts {
                "but its other keys restart the agent"
            } else {
                "no restart"
            }
        ))
    }

    /// The entry with its live keys taken from `from`.
    pub fn with_live_keys_of(&self, from: &AgentConfig) -> AgentConfig {
        AgentConfig {
            budget: from.budget.clone(),
            account: from.account.clone(),
            turn_usd: from.turn_usd,
            ..self.clone()
        }
    }

    /// Whether bash tasks get the cargo short-messages function (the default).
    pub fn cargo_short_messages(&self) -> bool {
        self.options.cargo_short_messages.unwrap_or(true)
    }

    /// The entry's per-agent options as the harness's environment, the
    /// variables an agent module sets for the same options
    /// (`nix/env.nix`); `HIVE_BASH_ENV` is the caller's, which owns the
    /// script's file. The entry's `env` goes after these and wins.
    pub fn option_env(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        let mut set = |k: &str, v: String| out.push((k.to_string(), v));
        let flag = |b: bool| if b { "true" } else { "false" }.to_string();
        if let Some(b) = self.options.auto_compact {
            set("HIVE_AUTO_COMPACT", flag(b));
        }
        if let Some(p) = &self.options.icon {
            set("HIVE_ICON", p.clone());
        }
        if let Some(p) = &self.options.static_dir {
            set("HIVE_STATIC_DIR", p.clone());
        }
        if let Some(p) = &self.options.web_dist {
            set("HIVE_WEB_DIST", p.clone());
        }
        if !self.options.dashboard_links.is_empty() {
            set(
                "HIVE_DASHBOARD_LINKS",
                serde_json::to_string(&self.options.dashboard_links).unwrap_or_default(),
            );
        }
        if let Some(u) = &self.options.forge_url {
            set("HIVE_FORGE_URL", u.clone());
        }
        if let Some(u) = &self.options.matrix_url {
            set("HIVE_MATRIX_URL", u.clone());
        }
        if let Some(m) = &self.options.claude_marketplaces {
            set("HIVE_CLAUDE_MARKETPLACES", m.join(","));
        }
        if !self.options.claude_plugins.is_empty() {
            set("HIVE_CLAUDE_PLUGINS", self.options.claude_plugins.join(","));
        }
        if let Some(b) = self.options.claude_plugins_auto_update {
            set("HIVE_CLAUDE_PLUGINS_AUTO_UPDATE", flag(b));
        }
        if let Some(p) = &self.options.operator_pronouns {
            set("HIVE_OPERATOR_PRONOUNS", p.clone());
        }
        for (k, v) in &self.options.context_window_tokens {
            set(&window_var(k), v.to_string());
        }
        if !self.options.extra_mcp_servers.is_empty() {
            set(
                "HIVE_EXTRA_MCP_SERVERS",
                serde_json::to_string(&self.options.extra_mcp_servers).unwrap_or_default(),
            );
        }
        out
    }

    /// The entry's path keys (`icon`, `static_dir`, `web_dist`) with their
    /// names: checked when the fleet file loads, shown read-only to the
    /// agent.
    pub fn path_keys(&self) -> Vec<(&'static str, &str)> {
        [
            ("icon", &self.options.icon),
            ("static_dir", &self.options.static_dir),
            ("web_dist", &self.options.web_dist),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect()
    }

    /// Whether an agent running `base` must restart to run `self`: a key
    /// other than the live ones differs. Equal entries restart nothing, nor
    /// do entries that differ in live keys only.
    pub fn restarts_from(&self, base: &AgentConfig) -> bool {
        self.with_live_keys_of(base) != *base
    }
}

#[cfg(test)]
mod tests {
    use super::AgentConfig;
    use serde_json::json;

    #[test]
    fn a_patch_of_live_keys_is_flagged_and_says_whether_it_restarts() {
        for (patch, keys, flag) in [
            (
                json!({"turn_usd": 0.5}),
                vec!["turn_usd"],
                Some("sets turn_usd: applies at once, no restart"),
            ),
            (
                json!({"account": "team", "budget": null}),
                vec!["budget", "account"],
                Some("sets budget, account: applies at once, no restart"),
            ),
            (
                json!({"turn_usd": 1, "model": "opus"}),
                vec!["turn_usd"],
                Some("sets turn_usd: applies at once, but its other keys restart the agent"),
            ),
            (json!({"model": "opus"}), vec![], None),
        ] {
            assert_eq!(AgentConfig::live_keys_in(&patch), keys, "{patch}");
            assert_eq!(
                AgentConfig::live_flag(&patch, None).as_deref(),
                flag,
                "{patch}"
            );
        }
    }

    /// [`AgentConfig::KEYS`] is every key: an entry with all of them set
    /// loads and writes each of them back, and no other.
    #[test]
    fn the_list_of_keys_is_the_entry() {
        let full = json!({"name": "a", "parent": "b", "allowed_recipients": ["b"],
            "model": "m", "tool_groups": ["messaging"], "capabilities": ["query_agent_state"],
            "socket_uid": 1, "socket_gid": 1, "env": {"A": "1"}, "account": "x",
            "budget": {"usd": 1.0, "per": "day"}, "turn_usd": 1.0, "auto_compact": false,
            "icon": "/i", "dashboard_links": [{"label": "l", "url": "https://u"}],
            "static_dir": "/s", "web_dist": "/d", "forge_url": "", "matrix_url": "",
            "claude_marketplaces": ["m"], "claude_plugins": ["p"],
            "claude_plugins_auto_update": true, "cargo_short_messages": false,
            "operator_pronouns": "they/them", "context_window_tokens": {"sonnet": 1},
            "extra_mcp_servers": {"s": {"command": "/x"}}});
        let a: AgentConfig = serde_json::from_value(full.clone()).unwrap();
        let back = serde_json::to_value(&a).unwrap();
        assert_eq!(back, full);
        let mut keys: Vec<&str> = back
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        let mut want = AgentConfig::KEYS.to_vec();
        keys.sort();
        want.sort();
        assert_eq!(keys, want);
    }

    fn entry(v: serde_json::Value) -> AgentConfig {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn only_a_change_of_a_key_that_is_not_live_restarts_the_agent() {
        let base = entry(json!({"name": "kid", "model": "opus", "turn_usd": 0.5,
            "budget": {"usd": 5.0, "per": "day"}}));
        for (now, restarts) in [
            // A patch that changed nothing (every key as it was).
            (base.clone(), false),
            (
                entry(json!({"name": "kid", "model": "opus", "turn_usd": 2.0,
                "budget": {"usd": 5.0, "per": "day"}, "account": "team"})),
                false,
            ),
            (entry(json!({"name": "kid", "model": "opus"})), false),
            (
                entry(json!({"name": "kid", "model": "sonnet", "turn_usd": 0.5,
                "budget": {"usd": 5.0, "per": "day"}})),
                true,
            ),
            (
                entry(json!({"name": "kid", "model": "sonnet", "turn_usd": 1.0})),
                true,
            ),
        ] {
            assert_eq!(now.restarts_from(&base), restarts, "{now:?}");
        }
    }

    #[test]
    fn the_flag_judges_a_patch_against_the_entry_it_changes() {
        let base = entry(json!({"name": "kid", "model": "opus", "turn_usd": 0.5}));
        let flag = |patch: serde_json::Value, now: serde_json::Value| {
            AgentConfig::live_flag(&patch, Some((&base, &entry(now))))
        };
        assert_eq!(
            flag(
                json!({"turn_usd": 0.5}),
                json!({"name": "kid", "model": "opus", "turn_usd": 0.5})
            )
            .as_deref(),
            Some("sets turn_usd to its current value: changes nothing, no restart")
        );
        // The model is opus already: the patch restarts nothing.
        assert_eq!(
            flag(
                json!({"turn_usd": 1, "model": "opus"}),
                json!({"name": "kid", "model": "opus", "turn_usd": 1.0})
            )
            .as_deref(),
            Some("sets turn_usd: applies at once, no restart")
        );
        assert_eq!(
            flag(
                json!({"turn_usd": 1, "model": "sonnet"}),
                json!({"name": "kid", "model": "sonnet", "turn_usd": 1.0})
            )
            .as_deref(),
            Some("sets turn_usd: applies at once, but its other keys restart the agent")
        );
        assert_eq!(
            flag(
                json!({"model": "opus"}),
                json!({"name": "kid", "model": "opus", "turn_usd": 0.5})
            ),
            None
        );
    }
}
