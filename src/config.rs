//! The hive config file: the one JSON schema for a whole hive, read by `hive
//! broker --config` and (extended, never forked) by `hive up`. This module owns
//! parsing, validation with errors that name the field, and the topology questions
//! answered from it (an agent's parent, whom it may message). Documented in
//! `docs/config.md`.

use crate::groups::{self, ToolGroup};
use crate::wire::excerpt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Longest agent name.
pub const MAX_NAME_LEN: usize = 9;

/// Names that address something other than an agent.
pub const RESERVED_NAMES: [&str; 5] = ["operator", "system", "self", "parent", "broker"];

/// The whole hive.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HiveConfig {
    /// Shown as `on hive `NAME`` in prompts and returned by `get_agent_meta`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hive_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swarm_name: Option<String>,
    /// Group id given to the host (operator) socket, which is then mode 0660.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_gid: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<AgentConfig>,
}

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
    /// Tool group names; absent or empty means the default preset.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capabilities: Vec<String>,
    /// Owner of the agent's socket, so a harness running as that user connects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_uid: Option<u32>,
    /// Group of the agent's socket; when set the socket is mode 0660.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_gid: Option<u32>,
    /// Extra environment for the agent's harness (`hive up` passes it on).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
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
        groups::parse_groups(&self.tool_groups.join(",")).unwrap_or_default()
    }

    pub fn has_capability(&self, cap: &str) -> bool {
        self.capabilities.iter().any(|c| c == cap)
    }
}

/// Checks an agent name, saying what is wrong with it.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!(
            "agent name {} must be 1 to {MAX_NAME_LEN} characters",
            excerpt(name)
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!(
            "agent name {} may only contain lowercase letters, digits and '-'",
            excerpt(name)
        ));
    }
    if RESERVED_NAMES.contains(&name) {
        return Err(format!("agent name {name:?} is reserved"));
    }
    Ok(())
}

impl HiveConfig {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<HiveConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        HiveConfig::parse(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    /// Parses and validates config text.
    pub fn parse(text: &str) -> Result<HiveConfig, String> {
        let cfg: HiveConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// A hive of root agents with default settings.
    pub fn from_names(names: &[String]) -> Result<HiveConfig, String> {
        let cfg = HiveConfig {
            agents: names.iter().map(|n| AgentConfig::named(n)).collect(),
            ..HiveConfig::default()
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// Every rule a config must satisfy, each error naming the field.
    pub fn validate(&self) -> Result<(), String> {
        for (field, value) in [
            ("hive_name", &self.hive_name),
            ("swarm_name", &self.swarm_name),
        ] {
            if let Some(v) = value {
                if v.contains('\n') || v.len() > 64 {
                    return Err(format!(
                        "{field}: must be one line of at most 64 characters"
                    ));
                }
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, a) in self.agents.iter().enumerate() {
            let at = format!("agents[{i}]");
            check_name(&a.name).map_err(|e| format!("{at}.name: {e}"))?;
            if !seen.insert(a.name.as_str()) {
                return Err(format!("{at}.name: duplicate agent name {:?}", a.name));
            }
            groups::parse_groups(&a.tool_groups.join(","))
                .map_err(|e| format!("{at}.tool_groups: {e}"))?;
            for c in &a.capabilities {
                if !groups::CAPABILITIES.contains(&c.as_str()) {
                    return Err(format!(
                        "{at}.capabilities: unknown capability {}; known: {}",
                        excerpt(c),
                        groups::CAPABILITIES.join(", ")
                    ));
                }
            }
            if let Some(m) = &a.model {
                if m.trim().is_empty() || m.contains(char::is_whitespace) {
                    return Err(format!("{at}.model: {} is not a model name", excerpt(m)));
                }
            }
        }
        for (i, a) in self.agents.iter().enumerate() {
            let at = format!("agents[{i}]");
            if let Some(p) = &a.parent {
                if p != "operator" && !seen.contains(p.as_str()) {
                    return Err(format!(
                        "{at}.parent: no agent named {} in this config",
                        excerpt(p)
                    ));
                }
                if p == &a.name {
                    return Err(format!("{at}.parent: an agent cannot be its own parent"));
                }
            }
            for r in &a.allowed_recipients {
                if r != "operator" && !seen.contains(r.as_str()) {
                    return Err(format!(
                        "{at}.allowed_recipients: no agent named {} in this config",
                        excerpt(r)
                    ));
                }
            }
            // Walk up to make sure the parent chain ends at the operator.
            let mut cur = a;
            for _ in 0..=self.agents.len() {
                match self.parent_agent(&cur.name) {
                    Some(p) => cur = p,
                    None => break,
                }
                if cur.name == a.name {
                    return Err(format!(
                        "{at}.parent: the parent chain of {:?} is a cycle",
                        a.name
                    ));
                }
            }
        }
        Ok(())
    }

    pub fn agent(&self, name: &str) -> Option<&AgentConfig> {
        self.agents.iter().find(|a| a.name == name)
    }

    fn parent_agent(&self, name: &str) -> Option<&AgentConfig> {
        let p = self.agent(name)?.parent.as_deref()?;
        self.agent(p)
    }

    /// The topology parent of an agent: another agent's name or `operator`.
    pub fn parent_of(&self, name: &str) -> String {
        match self.agent(name).and_then(|a| a.parent.clone()) {
            Some(p) => p,
            None => "operator".into(),
        }
    }

    /// The agents whose parent is `name`.
    pub fn children_of(&self, name: &str) -> Vec<String> {
        self.agents
            .iter()
            .filter(|a| a.parent.as_deref() == Some(name))
            .map(|a| a.name.clone())
            .collect()
    }

    /// May `from` send to `to` (`to` already resolved from `<parent>`)?
    pub fn may_send(&self, from: &str, to: &str) -> Result<(), String> {
        if to != "operator" && self.agent(to).is_none() {
            return Err(format!(
                "unknown recipient {}; known: operator, <parent>, {}",
                excerpt(to),
                self.agents
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let Some(a) = self.agent(from) else {
            return Ok(());
        };
        if a.allowed_recipients.is_empty() || self.parent_of(from) == to {
            return Ok(());
        }
        if a.allowed_recipients.iter().any(|r| r == to) {
            return Ok(());
        }
        Err(format!(
            "{from} may not send to {}: allowed recipients are {} and the parent ({})",
            excerpt(to),
            a.allowed_recipients.join(", "),
            self.parent_of(from)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_err(text: &str) -> String {
        HiveConfig::parse(text).unwrap_err()
    }

    #[test]
    fn bad_configs_name_the_field() {
        let cases = [
            (r#"{"agents":[{"name":"Ruth"}]}"#, "agents[0].name"),
            (r#"{"agents":[{"name":"toolongname"}]}"#, "1 to 9"),
            (r#"{"agents":[{"name":"operator"}]}"#, "reserved"),
            (r#"{"agents":[{"name":"a"},{"name":"a"}]}"#, "duplicate"),
            (
                r#"{"agents":[{"name":"a","parent":"b"}]}"#,
                "agents[0].parent",
            ),
            (
                r#"{"agents":[{"name":"a","tool_groups":["x"]}]}"#,
                "agents[0].tool_groups",
            ),
            (
                r#"{"agents":[{"name":"a","capabilities":["root"]}]}"#,
                "capabilities",
            ),
            (
                r#"{"agents":[{"name":"a","colour":"red"}]}"#,
                "unknown field `colour`",
            ),
            (r#"{"agentz":[]}"#, "unknown field `agentz`"),
            (
                r#"{"agents":[{"name":"a","allowed_recipients":["zed"]}]}"#,
                "allowed_recipients",
            ),
            (
                r#"{"agents":[{"name":"a","parent":"b"},{"name":"b","parent":"a"}]}"#,
                "cycle",
            ),
        ];
        for (text, want) in cases {
            let err = parse_err(text);
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn topology_and_recipients() {
        let cfg = HiveConfig::parse(
            r#"{"hive_name":"pr1ma","agents":[
                {"name":"ruth"},
                {"name":"kid","parent":"ruth","allowed_recipients":["operator"]},
                {"name":"pal"}]}"#,
        )
        .unwrap();
        assert_eq!(cfg.parent_of("ruth"), "operator");
        assert_eq!(cfg.parent_of("kid"), "ruth");
        assert_eq!(cfg.children_of("ruth"), vec!["kid".to_string()]);
        assert!(cfg.may_send("kid", "operator").is_ok());
        assert!(cfg.may_send("kid", "ruth").is_ok(), "parent always allowed");
        assert!(cfg
            .may_send("kid", "pal")
            .unwrap_err()
            .contains("may not send"));
        assert!(cfg.may_send("pal", "kid").is_ok());
        assert!(cfg
            .may_send("pal", "ghost")
            .unwrap_err()
            .contains("unknown recipient"));
    }
}
