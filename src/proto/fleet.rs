//! One agent's entry in the fleet file, as every process sees it: the fleet
//! file and `hive broker --config` hold a list of them, the supervision row
//! carries the one an agent runs with, an approved spawn or merge patch writes
//! one. The hive-wide config around it, its validation and the topology
//! questions (`config.rs`) sit above the contract.

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
    pub fn live_flag(patch: &serde_json::Value) -> Option<String> {
        let live = Self::live_keys_in(patch);
        if live.is_empty() {
            return None;
        }
        let others = patch
            .as_object()
            .is_some_and(|o| o.keys().any(|k| !Self::LIVE_KEYS.contains(&k.as_str())));
        Some(format!(
            "sets {}: applies at once, {}",
            live.join(", "),
            if others {
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

    /// True when `self` and `other` differ in their live keys only.
    pub fn differs_only_live(&self, other: &AgentConfig) -> bool {
        self != other && self.with_live_keys_of(other) == *other
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
            assert_eq!(AgentConfig::live_flag(&patch).as_deref(), flag, "{patch}");
        }
    }
}
