//! The hive config file: the one JSON schema for a whole hive, read by `hive
//! broker --config` and (extended, never forked) by `hive up`. This module owns
//! parsing, validation with errors that name the field, and the topology questions
//! answered from it (an agent's parent, its root, whom it may message). One
//! agent's entry is the contract's (`proto::fleet`). Documented in
//! `docs/config.md`.

use crate::proto::access::{Capability, ToolGroup};
use crate::proto::ident::check_name;
use crate::proto::text::excerpt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

pub use crate::proto::fleet::AgentConfig;

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
    /// What the whole hive may spend per calendar window (issue 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::proto::Budget>,
}

impl HiveConfig {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<HiveConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        HiveConfig::parse(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    /// Parses and validates config text. Tool groups and capabilities are
    /// checked before the text becomes a config, so their errors name the field.
    pub fn parse(text: &str) -> Result<HiveConfig, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        check_grants(&v)?;
        let cfg: HiveConfig = serde_json::from_value(v).map_err(|e| e.to_string())?;
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
        if let Some(b) = &self.budget {
            b.check("budget")?;
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, a) in self.agents.iter().enumerate() {
            let at = format!("agents[{i}]");
            if let Some(b) = &a.budget {
                b.check(&format!("{at}.budget"))?;
            }
            check_name(&a.name).map_err(|e| format!("{at}.name: {e}"))?;
            if !seen.insert(a.name.as_str()) {
                return Err(format!("{at}.name: duplicate agent name {:?}", a.name));
            }
            if let Some(acc) = &a.account {
                if acc.is_empty()
                    || acc.len() > 64
                    || !acc
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
                {
                    return Err(format!(
                        "{at}.account: {} must be 1 to 64 letters, digits and -_.@ (a name for the account its agents share)",
                        excerpt(acc)
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

    /// The root of `agent`'s tree: the ancestor whose parent is the operator
    /// (the agent itself for a root agent).
    pub fn root_of(&self, agent: &str) -> String {
        let mut cur = agent.to_string();
        for _ in 0..=self.agents.len() {
            let p = self.parent_of(&cur);
            if p == "operator" {
                break;
            }
            cur = p;
        }
        cur
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

/// The `tool_groups` and `capabilities` of every agent in a config not yet
/// read, each error naming its field (`agents[2].tool_groups: unknown tool
/// group "x"; known groups: …`).
fn check_grants(v: &Value) -> Result<(), String> {
    let agents = v.get("agents").and_then(Value::as_array);
    for (i, a) in agents.into_iter().flatten().enumerate() {
        let names = |field: &str| -> Vec<String> {
            a.get(field)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect()
        };
        for g in names("tool_groups") {
            ToolGroup::parse(&g).map_err(|e| format!("agents[{i}].tool_groups: {e}"))?;
        }
        for c in names("capabilities") {
            Capability::parse(&c).map_err(|e| format!("agents[{i}].capabilities: {e}"))?;
        }
    }
    Ok(())
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
        assert_eq!(
            (cfg.root_of("kid"), cfg.root_of("ruth")),
            ("ruth".into(), "ruth".into())
        );
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
