//! Who may send what: the tool groups and capabilities an agent is granted in
//! its fleet entry, and [`Access`], the rule each command's row of the
//! privilege table ([`super::command::PRIVILEGES`]) carries. The broker
//! enforces a row with [`Access::admits`] on the socket a request came in on
//! (the privilege boundary), and for an agent on how its connection was made
//! ([`Via`]): the harness's and the bash-task daemon's own reports need a
//! connection their credential made, wherever such a credential exists
//! (isolated `hive up`); `hive mcp` lists a tool when its row's gate is
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
    /// The agent's harness only: its turns, counters, pauses and spend. Taken
    /// on a connection the harness's credential made, or on the agent's
    /// socket where nothing separates the harness from claude ([`Via::Shared`]).
    Harness,
    /// The agent's bash-task daemon only (its running tasks), on a connection
    /// its own credential made, or on a [`Via::Shared`] socket.
    BashDaemon,
}

/// How an agent's connection reached the broker, which decides whether it
/// speaks for the harness (or the bash-task daemon) or for any process of
/// the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Via {
    /// The agent's socket, where its harness has a credential of its own:
    /// any process of the agent (claude, a bash task, an MCP server) may be
    /// at the other end, so the harness's rows are refused.
    Socket,
    /// The agent's socket, where nothing separates the harness from claude
    /// (one uid, no sandbox: plain `hive serve`, `HIVE_ISOLATION=off`, a
    /// harness started without a credential): the harness's and the bash
    /// daemon's rows are open here.
    Shared,
    /// A connection made through the harness's credential.
    Harness,
    /// A connection made through the bash-task daemon's credential.
    BashDaemon,
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
            Access::Harness => f.write_str("the harness"),
            Access::BashDaemon => f.write_str("the bash-task daemon"),
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
        via: Via,
    },
}

impl Access {
    /// The agents' gate, when agents may send the command at all.
    pub fn gate(self) -> Option<Gate> {
        match self {
            Access::Operator | Access::Bridge | Access::Harness | Access::BashDaemon => None,
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
                via,
            } => match self.own(cmd, name, via) {
                Some(admitted) => return admitted,
                None => (name, groups, capabilities),
            },
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

    /// The rule of the harness's and the bash daemon's own rows for agent
    /// `name`'s connection: None for every other row.
    fn own(self, cmd: &str, name: &str, via: Via) -> Option<Result<(), String>> {
        let holder = match self {
            Access::Harness => Via::Harness,
            Access::BashDaemon => Via::BashDaemon,
            _ => return None,
        };
        let whose = if holder == Via::Harness {
            "harness"
        } else {
            "bash-task daemon"
        };
        Some(match via {
            Via::Shared => Ok(()),
            v if v == holder => Ok(()),
            Via::Socket => Err(format!(
                "{cmd} is the {whose}'s own report and {name}'s {whose} has a connection of its \
                 own: it is not taken on {name}'s socket, where any process of the agent may \
                 write (an old {whose} binary? `hive restart {name}` runs the current one)"
            )),
            _ => Err(format!(
                "{cmd} is the {whose}'s own report; this connection is another process's of {name}"
            )),
        })
    }
}

/// Parses a comma list such as `HIVE_TOOL_GROUPS`; empty means the default preset.
pub fn parse_groups(list: &str) -> Result<Vec<ToolGroup>, String> {
    ToolGroup::parse_list(list)
}

/// Parses a comma list such as `HIVE_CAPABILITIES`, sorted and without
/// repeats; empty means none.
pub fn parse_capabilities(list: &str) -> Result<Vec<Capability>, String> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        out.push(Capability::parse(part)?);
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Every capability's name, for the dashboard's permissions tab.
pub const CAPABILITIES: [&str; 2] = [
    Capability::QueryAgentState.name(),
    Capability::ReadHostJournal.name(),
];

#[cfg(test)]
mod tests {
    #[test]
    fn the_capability_list_is_complete() {
        assert_eq!(CAPABILITIES, Capability::ALL.map(|c| c.name()));
    }

    #[test]
    fn capability_lists_parse_and_name_an_unknown_one() {
        assert!(parse_capabilities(" ").unwrap().is_empty());
        assert_eq!(
            parse_capabilities("read_host_journal, query_agent_state,read_host_journal").unwrap(),
            [Capability::QueryAgentState, Capability::ReadHostJournal]
        );
        let e = parse_capabilities("root").unwrap_err();
        assert!(e.starts_with("unknown capability \"root\""), "{e}");
    }

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
            via: Via::Socket,
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
            via: Via::Harness,
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
            Access::Harness,
            Access::BashDaemon,
        ] {
            let e = access.admits("send", Caller::Bridge).unwrap_err();
            assert!(e.contains("send is not a bridge command"), "{e}");
        }
        assert_eq!(Access::Bridge.to_string(), "the bridge");
        assert_eq!(Access::Bridge.group(), None);
        assert!(!Access::Bridge.operator());
    }

    /// The harness's rows are taken from its credential, or where nothing
    /// separates it from claude; the bash daemon's likewise; nobody else's
    /// connection passes for either, whatever the agent is granted.
    #[test]
    fn the_harness_and_the_bash_daemon_report_on_their_own_connections() {
        let all = ToolGroup::ALL;
        let caps = Capability::ALL;
        let on = |via| Caller::Agent {
            name: "ana",
            groups: &all,
            capabilities: &caps,
            via,
        };
        let cases = [
            (Access::Harness, Via::Harness, true),
            (Access::Harness, Via::Shared, true),
            (Access::Harness, Via::Socket, false),
            (Access::Harness, Via::BashDaemon, false),
            (Access::BashDaemon, Via::BashDaemon, true),
            (Access::BashDaemon, Via::Shared, true),
            (Access::BashDaemon, Via::Socket, false),
            (Access::BashDaemon, Via::Harness, false),
            (Access::Agent(Gate::Open), Via::Socket, true),
            (Access::Agent(Gate::Open), Via::Harness, true),
            (Access::Both(Gate::Open), Via::BashDaemon, true),
        ];
        for (access, via, ok) in cases {
            assert_eq!(
                access.admits("report_spend", on(via)).is_ok(),
                ok,
                "{access:?} on {via:?}"
            );
        }
        let e = Access::Harness
            .admits("report_spend", on(Via::Socket))
            .unwrap_err();
        assert!(
            e.contains("report_spend is the harness's own report")
                && e.contains("an old harness binary? `hive restart ana`"),
            "{e}"
        );
        let e = Access::Harness
            .admits("report_spend", Caller::Operator)
            .unwrap_err();
        assert!(e.contains("is an agent command"), "{e}");
        assert_eq!(Access::Harness.gate(), None);
        assert_eq!(Access::Harness.to_string(), "the harness");
        assert_eq!(Access::BashDaemon.to_string(), "the bash-task daemon");
    }
}
