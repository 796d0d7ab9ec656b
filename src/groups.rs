//! Tool groups and capabilities: the one list of what an agent may be granted.
//! The broker enforces them on the agent's socket (the privilege boundary), `hive
//! mcp` mirrors them in `tools/list`, and `hive serve` turns them into the
//! `--allowedTools` it hands claude; all three read the tables here.

/// A named set of tools an agent can be granted in its config (`tool_groups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ToolGroup {
    Messaging,
    Meta,
    Inbox,
    Execution,
    WebTools,
    Lifecycle,
    Approvals,
    Scheduling,
    Diagnostics,
}

impl ToolGroup {
    pub const ALL: [ToolGroup; 9] = [
        ToolGroup::Messaging,
        ToolGroup::Meta,
        ToolGroup::Inbox,
        ToolGroup::Execution,
        ToolGroup::WebTools,
        ToolGroup::Lifecycle,
        ToolGroup::Approvals,
        ToolGroup::Scheduling,
        ToolGroup::Diagnostics,
    ];

    /// The preset an agent gets when its config names no groups.
    pub const AGENT_DEFAULT: [ToolGroup; 4] = [
        ToolGroup::Messaging,
        ToolGroup::Meta,
        ToolGroup::Inbox,
        ToolGroup::Execution,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ToolGroup::Messaging => "messaging",
            ToolGroup::Meta => "meta",
            ToolGroup::Inbox => "inbox",
            ToolGroup::Execution => "execution",
            ToolGroup::WebTools => "web_tools",
            ToolGroup::Lifecycle => "lifecycle",
            ToolGroup::Approvals => "approvals",
            ToolGroup::Scheduling => "scheduling",
            ToolGroup::Diagnostics => "diagnostics",
        }
    }

    pub fn from_name(name: &str) -> Option<ToolGroup> {
        ToolGroup::ALL.into_iter().find(|g| g.name() == name.trim())
    }

    /// Privileged groups are opt-in only (never part of the default preset).
    pub fn privileged(self) -> bool {
        matches!(
            self,
            ToolGroup::Lifecycle
                | ToolGroup::Approvals
                | ToolGroup::Scheduling
                | ToolGroup::Diagnostics
        )
    }

    /// The `mcp__hyperhive__*` tools this group contributes. `execution` has none:
    /// the bash tools live in their own server and are on for every agent.
    pub fn hyperhive_tools(self) -> &'static [&'static str] {
        match self {
            ToolGroup::Messaging => &["send", "recv", "ask", "answer"],
            ToolGroup::Meta => &["set_status", "get_agent_meta"],
            ToolGroup::Inbox => &[
                "get_loose_ends",
                "cancel_loose_end",
                "remind",
                "request_next_turn",
            ],
            ToolGroup::Execution | ToolGroup::WebTools => &[],
            ToolGroup::Lifecycle => &["request_spawn", "kill", "start", "restart", "update"],
            ToolGroup::Approvals => &["request_apply_commit"],
            ToolGroup::Scheduling => &["schedule_prompt", "list_scheduled", "cancel_scheduled"],
            // Listed with the group; the broker also wants the read_host_journal
            // capability for get_host_journal.
            ToolGroup::Diagnostics => &["get_logs", "get_host_journal"],
        }
    }

    /// Built-in claude tools this group adds to `--tools`.
    pub fn builtin_tools(self) -> &'static [&'static str] {
        match self {
            ToolGroup::WebTools => &["WebFetch", "WebSearch"],
            _ => &[],
        }
    }
}

/// Parses a comma list such as `HIVE_TOOL_GROUPS`; empty means the default preset.
pub fn parse_groups(list: &str) -> Result<Vec<ToolGroup>, String> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let g = ToolGroup::from_name(part).ok_or_else(|| {
            format!(
                "unknown tool group {}; known groups: {}",
                crate::wire::excerpt(part),
                ToolGroup::ALL.map(|g| g.name()).join(", ")
            )
        })?;
        if !out.contains(&g) {
            out.push(g);
        }
    }
    if out.is_empty() {
        out = ToolGroup::AGENT_DEFAULT.to_vec();
    }
    out.sort();
    Ok(out)
}

/// Capabilities are orthogonal to tool groups: each unlocks one privileged reach.
pub const CAPABILITIES: [&str; 2] = ["query_agent_state", "read_host_journal"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_list_is_the_default_preset() {
        assert_eq!(parse_groups("").unwrap(), ToolGroup::AGENT_DEFAULT.to_vec());
        assert!(ToolGroup::AGENT_DEFAULT.iter().all(|g| !g.privileged()));
    }

    #[test]
    fn names_round_trip_and_unknown_is_named() {
        for g in ToolGroup::ALL {
            assert_eq!(ToolGroup::from_name(g.name()), Some(g));
        }
        let err = parse_groups("messaging, nope").unwrap_err();
        assert!(err.contains("\"nope\""), "{err}");
        assert_eq!(
            parse_groups("meta,meta,web_tools").unwrap(),
            vec![ToolGroup::Meta, ToolGroup::WebTools]
        );
    }
}
