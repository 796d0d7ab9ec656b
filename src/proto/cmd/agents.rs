//! What the broker keeps per agent and tells about it: `hello`, the harness's
//! start (`kick`) and turn counters, the status line, `get_agent_meta`, the
//! operator's `agents`, and the loose ends (`get_loose_ends`,
//! `cancel_loose_end`, and the bash task daemon's `report_tasks`).

use crate::proto::command::{Command, Invalid};
use crate::proto::kinds::LooseEndKind;
use crate::proto::limits::{
    MAX_COST_PER_POST, MAX_REPORTED_TASKS, MAX_REV_CHARS, MAX_STATUS_CHARS, MAX_TASK_CMD_CHARS,
    MAX_TOKENS_PER_POST, MAX_TURNS_PER_POST,
};
use crate::proto::reply::{
    is_zero, AgentRow, Approval, Empty, Question, Reminder, RunningTask, Scheduled, SentReply,
};
use crate::proto::text::{excerpt, is_control_or_bidi};
use serde::{Deserialize, Serialize};

/// Optional version check; answered with the broker's version and identity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    #[serde(default)]
    pub version: Option<u32>,
}

/// Answer to `hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HelloReply {
    pub version: u32,
    /// `operator` on the host socket, the agent's name on an agent socket.
    pub identity: String,
    pub hyperhive_rev: String,
}

impl Command for Hello {
    type Reply = HelloReply;
}

/// Operator: the broker's version, revision and protocol (`hive version`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Version {}

/// Answer to `version`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionReply {
    /// The release (`Cargo.toml`'s version).
    pub version: String,
    pub hyperhive_rev: String,
    pub protocol: u32,
}

impl Command for Version {
    type Reply = VersionReply;
}

/// The harness at start (`kick` on the wire): records its revision and drops
/// the "you were just (re)started" system message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarnessStarted {
    #[serde(default)]
    pub hyperhive_rev: Option<String>,
}

impl Command for HarnessStarted {
    type Reply = SentReply;
    fn validate(&self) -> Result<(), Invalid> {
        match &self.hyperhive_rev {
            Some(rev)
                if rev.chars().count() > MAX_REV_CHARS || rev.chars().any(is_control_or_bidi) =>
            {
                Err(Invalid::arg(
                    "hyperhive_rev",
                    format!(
                        "{} must be one line of at most {MAX_REV_CHARS} characters",
                        excerpt(rev)
                    ),
                ))
            }
            _ => Ok(()),
        }
    }
}

/// Adds one turn's counters to the caller's dashboard totals.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostTurnCounts {
    #[serde(default)]
    pub turns: u64,
    #[serde(default)]
    pub ok: u64,
    #[serde(default)]
    pub failed: u64,
    #[serde(default)]
    pub tokens_in: u64,
    #[serde(default)]
    pub tokens_out: u64,
    #[serde(default)]
    pub cost_usd: f64,
}

impl Command for PostTurnCounts {
    type Reply = Empty;
    /// One turn's counters: finite, not negative, and within what one turn can
    /// produce, so the totals on the dashboard cannot be corrupted.
    fn validate(&self) -> Result<(), Invalid> {
        let over = |v: u64, max: u64| format!("{v} is over {max}; post one turn's counts");
        for (arg, v) in [
            ("turns", self.turns),
            ("ok", self.ok),
            ("failed", self.failed),
        ] {
            if v > MAX_TURNS_PER_POST {
                return Err(Invalid::arg(arg, over(v, MAX_TURNS_PER_POST)));
            }
        }
        for (arg, v) in [
            ("tokens_in", self.tokens_in),
            ("tokens_out", self.tokens_out),
        ] {
            if v > MAX_TOKENS_PER_POST {
                return Err(Invalid::arg(arg, over(v, MAX_TOKENS_PER_POST)));
            }
        }
        let c = self.cost_usd;
        if !c.is_finite() || !(0.0..=MAX_COST_PER_POST).contains(&c) {
            return Err(Invalid::arg(
                "cost_usd",
                format!("{c} must be between 0 and {MAX_COST_PER_POST}"),
            ));
        }
        Ok(())
    }
}

/// Free-text status line shown on the dashboard and the agent's page; `""`
/// clears.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetStatus {
    pub text: String,
}

impl Command for SetStatus {
    type Reply = Empty;
    fn validate(&self) -> Result<(), Invalid> {
        let n = self.text.chars().count();
        if self.text.contains(['\n', '\r']) || n > MAX_STATUS_CHARS {
            return Err(Invalid::arg(
                "text",
                format!(
                    "must be one line of at most {MAX_STATUS_CHARS} characters, got {n} characters"
                ),
            ));
        }
        Ok(())
    }
}

/// Identity and status of an agent (the caller when `name` is absent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetAgentMeta {
    #[serde(default)]
    pub name: Option<String>,
}

/// Identity and status of one agent (`get_agent_meta`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentMeta {
    pub name: String,
    pub hyperhive_rev: String,
    pub running: bool,
    pub status_text: String,
    pub status_set_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hive_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swarm_name: Option<String>,
}

impl Command for GetAgentMeta {
    type Reply = AgentMeta;
}

/// Operator: every agent with its queue and status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agents {}

/// Answer to `agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentsReply {
    pub agents: Vec<AgentRow>,
    /// Rows that did not fit in the answer's byte budget.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
    /// The Matrix bridge and its outbox, on a hive with a `matrix` section.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bridge: Option<crate::proto::swarm::BridgeRow>,
}

impl Command for Agents {
    type Reply = AgentsReply;
}

/// Pending questions (asked and owed), reminders, scheduled prompts,
/// approvals and running bash tasks of the caller or of `agent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetLooseEnds {
    #[serde(default)]
    pub agent: Option<String>,
}

/// Answer to `get_loose_ends`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LooseEndsReply {
    pub agent: String,
    /// Questions this agent asked that are still open.
    pub asked: Vec<Question>,
    /// Questions addressed to this agent that it has not answered.
    pub owed: Vec<Question>,
    pub reminders: Vec<Reminder>,
    /// Prompts this agent scheduled (`schedule_prompt`).
    #[serde(default)]
    pub scheduled: Vec<Scheduled>,
    /// Pending approvals: those the agent requested, and for a root agent every
    /// pending approval of its tree.
    #[serde(default)]
    pub approvals: Vec<Approval>,
    /// The ids of `approvals` the caller may withdraw with
    /// `cancel_loose_end(kind="approval")`: those of its tree, for a root
    /// agent. A requester's own are withdrawn by its root agent or the operator.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub withdrawable: Vec<i64>,
    /// Background bash tasks still running, as the agent's bash task daemon
    /// last reported them.
    #[serde(default)]
    pub tasks: Vec<RunningTask>,
    /// Entries (of any list) that did not fit in the answer's byte budget; the
    /// lists are filled in the order above.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
}

impl Command for GetLooseEnds {
    type Reply = LooseEndsReply;
}

/// Withdraws a question the caller asked, deletes one of its reminders or (with
/// the `scheduling` group) scheduled prompts, or, for a root agent, withdraws a
/// pending approval of its tree.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelLooseEnd {
    pub kind: LooseEndKind,
    pub id: i64,
}

impl Command for CancelLooseEnd {
    type Reply = Empty;
}

/// The bash task daemon of the caller's agent: the background tasks that are
/// running now (the whole list, replacing the last one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportTasks {
    pub tasks: Vec<RunningTask>,
}

impl Command for ReportTasks {
    type Reply = Empty;
    fn validate(&self) -> Result<(), Invalid> {
        if self.tasks.len() > MAX_REPORTED_TASKS {
            return Err(Invalid::arg(
                "tasks",
                format!(
                    "has {} entries; at most {MAX_REPORTED_TASKS}",
                    self.tasks.len()
                ),
            ));
        }
        for t in &self.tasks {
            if t.id.is_empty() || t.id.len() > 64 || t.id.chars().any(is_control_or_bidi) {
                return Err(Invalid::Whole(format!(
                    "task id {} is not an id",
                    excerpt(&t.id)
                )));
            }
            if t.cmd.chars().count() > MAX_TASK_CMD_CHARS {
                return Err(Invalid::Whole(format!(
                    "the cmd of task {} is longer than {MAX_TASK_CMD_CHARS} characters; send its start",
                    t.id
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for Hello {
        fn sample() -> Self {
            Hello { version: Some(1) }
        }
    }
    impl Sample for Version {
        fn sample() -> Self {
            Version {}
        }
    }
    impl Sample for HarnessStarted {
        fn sample() -> Self {
            HarnessStarted {
                hyperhive_rev: Some("8d963ab".into()),
            }
        }
    }
    impl Sample for PostTurnCounts {
        fn sample() -> Self {
            PostTurnCounts {
                turns: 1,
                ok: 1,
                failed: 0,
                tokens_in: 2400,
                tokens_out: 84,
                cost_usd: 0.014,
            }
        }
    }
    impl Sample for SetStatus {
        fn sample() -> Self {
            SetStatus {
                text: "reviewing".into(),
            }
        }
    }
    impl Sample for GetAgentMeta {
        fn sample() -> Self {
            GetAgentMeta {
                name: Some("ana".into()),
            }
        }
    }
    impl Sample for Agents {
        fn sample() -> Self {
            Agents {}
        }
    }
    impl Sample for GetLooseEnds {
        fn sample() -> Self {
            GetLooseEnds { agent: None }
        }
    }
    impl Sample for CancelLooseEnd {
        fn sample() -> Self {
            CancelLooseEnd {
                kind: LooseEndKind::Reminder,
                id: 2,
            }
        }
    }
    impl Sample for ReportTasks {
        fn sample() -> Self {
            ReportTasks {
                tasks: vec![RunningTask {
                    id: "7".into(),
                    cmd: "make".into(),
                    started_at: 5,
                    timeout_secs: Some(600),
                }],
            }
        }
    }

    #[test]
    fn counters_and_status_lines_are_bounded() {
        assert!(PostTurnCounts::sample().validate().is_ok());
        let bad = [
            PostTurnCounts {
                turns: u64::MAX,
                ..PostTurnCounts::sample()
            },
            PostTurnCounts {
                tokens_in: u64::MAX,
                ..PostTurnCounts::sample()
            },
            PostTurnCounts {
                cost_usd: f64::NAN,
                ..PostTurnCounts::sample()
            },
            PostTurnCounts {
                cost_usd: -0.5,
                ..PostTurnCounts::sample()
            },
            PostTurnCounts {
                cost_usd: f64::INFINITY,
                ..PostTurnCounts::sample()
            },
        ];
        for b in bad {
            assert!(b.validate().is_err(), "{b:?}");
        }
        let e = SetStatus {
            text: "a\nb".into(),
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.for_tool(),
            "argument \"text\" must be one line of at most 200 characters, got 3 characters"
        );
        let e = HarnessStarted {
            hyperhive_rev: Some("x".repeat(101)),
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().starts_with("hyperhive_rev \"xxx"), "{e}");
    }
}
