//! Who may send what: the tool groups and capabilities an agent is granted in
//! its fleet entry, and [`Access`], the rule each command's row of the
//! privilege table ([`super::command::PRIVILEGES`]) carries. The broker
//! enforces a row with [`Access::admits`] on the socket a request came in on
//! (the privilege boundary); `hive mcp` lists a tool when its row's gate is
//! granted ([`Gate::granted`]: its group, or for a capability-gated command its
//! capability alone) and the harness hands claude the same names in
//! `--allowedTools`, so the three cannot disagree. Rules about a command's
//! *target* (only your own children, anyone with `query_agent_state`) are the
//! handler's.

use super::enums::closed_enum;

closed_enum! {
    /// A named set of tools an agent can be granted (`tool_groups`).
    pub enum ToolGroup ("tool group", "groups") {
        Messaging = "messaging",
        Meta = "meta",
        Inbox = "inbox",
        Execution = "execution",
        WebTools = "web_tools",
        Lifecycle = "lifecycle",
        Approvals = "approvals",
        Scheduling = "scheduling",
        Diagnostics = "diagnostics",
    }
}

impl ToolGroup {
    /// The preset an agent gets when its config names no groups.
    pub const AGENT_DEFAULT: [ToolGroup; 4] = [
        ToolGroup::Messaging,
        ToolGroup::Meta,
        ToolGroup::Inbox,
        ToolGroup::Execution,
    ];

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

    /// Built-in claude tools this group adds to `--tools`. `execution` adds
    /// none: the bash tools live in their own MCP server, on for every agent.
    pub fn builtin_tools(self) -> &'static [&'static str] {
        match self {
            ToolGroup::WebTools => &["WebFetch", "WebSearch"],
            _ => &[],
        }
    }

    /// A comma list such as `HIVE_TOOL_GROUPS`, sorted and without repeats;
    /// empty means the default preset.
    pub fn parse_list(list: &str) -> Result<Vec<ToolGroup>, String> {
        let mut out = Vec::new();
        for part in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            out.push(ToolGroup::parse(part)?);
        }
        Ok(ToolGroup::effective(&out))
    }

    /// The groups an agent has when granted `groups`: sorted, without
    /// repeats, the default preset when none.
    pub fn effective(groups: &[ToolGroup]) -> Vec<ToolGroup> {
        let mut out = if groups.is_empty() {
            ToolGroup::AGENT_DEFAULT.to_vec()
        } else {
            groups.to_vec()
        };
        out.sort();
        out.dedup();
        out
    }
}

closed_enum! {
    /// One privileged reach, orthogonal to the tool groups.
    pub enum Capability ("capability", "capabilities") {
        /// Read the loose ends and logs of agents that are not your children.
        QueryAgentState = "query_agent_state",
        /// Read the host's journal (`get_host_journal`).
        ReadHostJournal = "read_host_journal",
    }
}

/// What an agent must be granted to send a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Nothing: harness plumbing and `wake`, which any script of the agent uses.
    Open,
    /// The group.
    Group(ToolGroup),
    /// The capability alone, orthogonal to the groups (`get_host_journal`).
    Capability(Capability),
}

impl Gate {
    /// Is an agent with these groups and capabilities let through? What the
    /// broker enforces and what `tools/list` and `--allowedTools` mirror.
    pub fn granted(self, groups: &[ToolGroup], capabilities: &[Capability]) -> bool {
        match self {
            Gate::Open => true,
            Gate::Group(g) => groups.contains(&g),
            Gate::Capability(c) => capabilities.contains(&c),
        }
    }
}

/// One row of the privilege table: who may send a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The operator only (the host socket).
    Operator,
    /// The Matrix bridge only (its own socket, `RUN/bridge.sock`), which
    /// accepts nothing else.
    Bridge,
    /// Agents only, behind the gate.
    Agent(Gate),
    /// The operator, and agents behind the gate.
    Both(Gate),
}

/// The row as the docs print it: `operator, agents with `messaging``.
impl std::fmt::Display for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let agents = |f: &mut std::fmt::Formatter<'_>, g: &Gate| match g {
            Gate::Open => f.write_str("agents"),
            Gate::Group(g) => write!(f, "agents with `{g}`"),
            Gate::Capability(c) => write!(f, "agents with the `{c}` capability"),
        };
        match self {
            Access::Operator => f.write_str("operator"),
            Access::Bridge => f.write_str("the bridge"),
            Access::Agent(g) => agents(f, g),
            Access::Both(g) => {
                f.write_str("operator, ")?;
                agents(f, g)
            }
        }
    }
}

/// Who sends a request, as the privilege gate needs to know it.
#[derive(Debug, Clone, Copy)]
pub enum Caller<'a> {
    Operator,
    /// The Matrix bridge on its own socket.
    Bridge,
    Agent {
        name: &'a str,
        groups: &'a [ToolGroup],
        capabilities: &'a [Capability],
    },
}

impl Access {
    /// The agents' gate, when agents may send the command at all.
    pub fn gate(self) -> Option<Gate> {
        match self {
            Access::Operator | Access::Bridge => None,
            Access::Agent(g) | Access::Both(g) => Some(g),
        }
    }

    /// The group an agent must be granted, for a group-gated command.
    pub fn group(self) -> Option<ToolGroup> {
        match self.gate()? {
            Gate::Group(g) => Some(g),
            Gate::Open | Gate::Capability(_) => None,
        }
    }

    /// The capability an agent must be granted, for a capability-gated command.
    pub fn capability(self) -> Option<Capability> {
        match self.gate()? {
            Gate::Capability(c) => Some(c),
            Gate::Open | Gate::Group(_) => None,
        }
    }

    /// May the operator send it?
    pub fn operator(self) -> bool {
        matches!(self, Access::Operator | Access::Both(_))
    }

    /// Lets `caller` send command `cmd`, or says why not and what to do.
    pub fn admits(self, cmd: &str, caller: Caller<'_>) -> Result<(), String> {
        let (name, groups, capabilities) = match caller {
            Caller::Bridge if self == Access::Bridge => return Ok(()),
            Caller::Bridge => {
                return Err(format!(
                    "{cmd} is not a bridge command; this socket is the Matrix bridge's and \
                     accepts only bridge commands"
                ))
            }
            _ if self == Access::Bridge => {
                return Err(format!(
                    "{cmd} is the Matrix bridge's command; it is accepted only on the \
                     bridge's socket (RUN/bridge.sock)"
                ))
            }
            Caller::Operator if self.operator() => return Ok(()),
            Caller::Operator => {
                return Err(format!(
                    "{cmd} is an agent command; the host socket speaks for the operator"
                ))
            }
            Caller::Agent {
                name,
                groups,
                capabilities,
            } => (name, groups, capabilities),
        };
        let Some(gate) = self.gate() else {
            return Err(format!(
                "{cmd} is an operator command; this is the socket of agent {name}"
            ));
        };
        if gate.granted(groups, capabilities) {
            return Ok(());
        }
        let needs = match gate {
            Gate::Open => return Ok(()),
            Gate::Group(g) => format!("the {g} tool group"),
            Gate::Capability(c) => format!("the {c} capability"),
        };
        Err(format!(
            "{cmd} needs {needs}, which {name} is not granted; the operator grants it in the \
             fleet file"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_lists_parse_to_the_effective_set() {
        assert_eq!(
            ToolGroup::parse_list("").unwrap(),
            ToolGroup::AGENT_DEFAULT.to_vec()
        );
        assert!(ToolGroup::AGENT_DEFAULT.iter().all(|g| !g.privileged()));
        for g in ToolGroup::ALL {
            assert_eq!(ToolGroup::from_name(g.name()), Some(g));
        }
        let err = ToolGroup::parse_list("messaging, nope").unwrap_err();
        assert!(
            err.contains("unknown tool group \"nope\"; known groups: messaging,"),
            "{err}"
        );
        assert_eq!(
            ToolGroup::parse_list("meta,meta,web_tools").unwrap(),
            vec![ToolGroup::Meta, ToolGroup::WebTools]
        );
        let err = serde_json::from_str::<Capability>("\"root\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown capability \"root\"; known capabilities: query_agent_state, read_host_journal"), "{err}");
    }

    #[test]
    fn the_gate_names_what_is_missing() {
        let agent = |groups, capabilities| Caller::Agent {
            name: "ana",
            groups,
            capabilities,
        };
        let journal = Access::Agent(Gate::Capability(Capability::ReadHostJournal));
        let e = journal
            .admits("get_host_journal", agent(&[ToolGroup::Diagnostics], &[]))
            .unwrap_err();
        assert!(
            e.contains("needs the read_host_journal capability, which ana"),
            "{e}"
        );
        // The capability alone lets it through: no group is needed.
        assert!(journal
            .admits(
                "get_host_journal",
                agent(&[], &[Capability::ReadHostJournal])
            )
            .is_ok());
        let e = Access::Agent(Gate::Group(ToolGroup::Diagnostics))
            .admits("get_logs", agent(&[], &[Capability::ReadHostJournal]))
            .unwrap_err();
        assert!(e.contains("needs the diagnostics tool group"), "{e}");
        let e = journal
            .admits("get_host_journal", Caller::Operator)
            .unwrap_err();
        assert!(e.contains("is an agent command"), "{e}");
        let e = Access::Operator
            .admits("agents", agent(&[], &[]))
            .unwrap_err();
        assert_eq!(
            e,
            "agents is an operator command; this is the socket of agent ana"
        );
        assert!(Access::Both(Gate::Group(ToolGroup::Messaging))
            .admits("send", Caller::Operator)
            .is_ok());
        assert!(Access::Agent(Gate::Open)
            .admits("recv_next", agent(&[], &[]))
            .is_ok());
    }

    #[test]
    fn the_bridge_sends_bridge_commands_only_and_nobody_else_does() {
        assert!(Access::Bridge.admits("bridge_next", Caller::Bridge).is_ok());
        let all = ToolGroup::ALL;
        let caps = Capability::ALL;
        let ana = Caller::Agent {
            name: "ana",
            groups: &all,
            capabilities: &caps,
        };
        for caller in [Caller::Operator, ana] {
            let e = Access::Bridge.admits("bridge_next", caller).unwrap_err();
            assert!(e.contains("accepted only on the bridge's socket"), "{e}");
        }
        for access in [
            Access::Operator,
            Access::Both(Gate::Open),
            Access::Agent(Gate::Open),
            Access::Both(Gate::Group(ToolGroup::Messaging)),
        ] {
            let e = access.admits("send", Caller::Bridge).unwrap_err();
            assert!(e.contains("send is not a bridge command"), "{e}");
        }
        assert_eq!(Access::Bridge.to_string(), "the bridge");
        assert_eq!(Access::Bridge.group(), None);
        assert!(!Access::Bridge.operator());
    }
}
