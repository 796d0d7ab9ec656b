//! Lifecycle: an agent asks for a new child (`request_spawn`, an approval) or
//! stops and starts its own children (`kill`, `start`, `restart`, `update`);
//! the operator reads the supervisor's view (`supervision`) and stops and
//! starts any agent, root agents included (`stop_agent`, `start_agent`,
//! `restart_agent`, `update_agent`: `hive stop|start|restart|update` and the
//! dashboard's buttons). The supervisor of `hive up` carries them out; a
//! stopped agent stays stopped across restarts of `hive up` until it is started.

use crate::proto::command::{Command, Invalid};
use crate::proto::ident::check_name;
use crate::proto::reply::{AgentState, QueuedReply, TextReply};
use serde::{Deserialize, Serialize};

/// Asks the operator to approve a new child agent `name`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestSpawn {
    pub name: String,
}

impl Command for RequestSpawn {
    type Reply = QueuedReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_name(&self.name).map_err(Invalid::Whole)
    }
}

/// Stops one of the caller's children (it stays stopped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kill {
    pub name: String,
}

impl Command for Kill {
    type Reply = TextReply;
}

/// Starts one of the caller's stopped children.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Start {
    pub name: String,
}

impl Command for Start {
    type Reply = TextReply;
}

/// Stops and starts one of the caller's children.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Restart {
    pub name: String,
}

impl Command for Restart {
    type Reply = TextReply;
}

/// Restarts a child onto the current binary and fleet-file entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Update {
    pub name: String,
}

impl Command for Update {
    type Reply = TextReply;
}

/// Operator: starts any stopped agent (`hive start`); it is no longer kept
/// stopped across restarts of `hive up`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartAgent {
    pub name: String,
}

impl Command for StartAgent {
    type Reply = TextReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_agent_arg(&self.name)
    }
}

/// Operator: stops any agent and keeps it stopped, across restarts of `hive
/// up` too, until it is started (`hive stop`, the CLI name of the `kill` tool).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopAgent {
    pub name: String,
}

impl Command for StopAgent {
    type Reply = TextReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_agent_arg(&self.name)
    }
}

/// Operator: stops and starts any agent with the config it runs (`hive
/// restart`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartAgent {
    pub name: String,
}

impl Command for RestartAgent {
    type Reply = TextReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_agent_arg(&self.name)
    }
}

/// Operator: restarts any agent onto the current binary and its fleet-file
/// entry as the file says it now (`hive update`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateAgent {
    pub name: String,
}

impl Command for UpdateAgent {
    type Reply = TextReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_agent_arg(&self.name)
    }
}

/// Operator: re-reads the fleet file and applies it whole (`hive reload`, the
/// dashboard's Reload, `ExecReload`): added agents start, removed ones stop
/// (their mail is kept until `forget_agent`), changed ones restart onto their
/// entry once their turn ends, unchanged ones keep running. A file that does
/// not load changes nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Reload {}

impl Command for Reload {
    type Reply = TextReply;
}

/// The most agents `update_all` restarts at once.
pub const MAX_PARALLEL_UPDATES: u32 = 64;

/// Operator: updates every agent whose binary or fleet entry changed
/// (`hive update --all`), at most `parallel` at a time (2 when absent), each
/// after the one before it has run its boot turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateAll {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel: Option<u32>,
}

impl Command for UpdateAll {
    type Reply = TextReply;
    fn validate(&self) -> Result<(), Invalid> {
        match self.parallel {
            Some(n) if n == 0 || n > MAX_PARALLEL_UPDATES => Err(Invalid::arg(
                "parallel",
                format!("got {n}; it must be from 1 to {MAX_PARALLEL_UPDATES}"),
            )),
            _ => Ok(()),
        }
    }
}

/// Operator: an agent removed from the fleet is forgotten (`hive forget`):
/// its queued mail is dead-lettered (`failed` and `retry` still see it) and
/// the broker's row of it is dropped. Its data dir stays.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForgetAgent {
    pub name: String,
}

impl Command for ForgetAgent {
    type Reply = TextReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_agent_arg(&self.name)
    }
}

/// The agent an operator lifecycle command names: not blank.
fn check_agent_arg(name: &str) -> Result<(), Invalid> {
    if name.trim().is_empty() {
        return Err(Invalid::arg("name", "must name an agent"));
    }
    Ok(())
}

/// Operator: the supervisor's view of every agent (`hive up` only).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Supervision {}

/// Answer to `supervision`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SupervisionReply {
    pub agents: Vec<AgentState>,
}

impl Command for Supervision {
    type Reply = SupervisionReply;
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for RequestSpawn {
        fn sample() -> Self {
            RequestSpawn {
                name: "kid2".into(),
            }
        }
    }
    impl Sample for Kill {
        fn sample() -> Self {
            Kill { name: "kid".into() }
        }
    }
    impl Sample for Start {
        fn sample() -> Self {
            Start { name: "kid".into() }
        }
    }
    impl Sample for Restart {
        fn sample() -> Self {
            Restart { name: "kid".into() }
        }
    }
    impl Sample for Update {
        fn sample() -> Self {
            Update { name: "kid".into() }
        }
    }
    impl Sample for Supervision {
        fn sample() -> Self {
            Supervision {}
        }
    }
    impl Sample for StartAgent {
        fn sample() -> Self {
            StartAgent {
                name: "ruth".into(),
            }
        }
    }
    impl Sample for StopAgent {
        fn sample() -> Self {
            StopAgent {
                name: "ruth".into(),
            }
        }
    }
    impl Sample for RestartAgent {
        fn sample() -> Self {
            RestartAgent {
                name: "ruth".into(),
            }
        }
    }
    impl Sample for UpdateAgent {
        fn sample() -> Self {
            UpdateAgent {
                name: "ruth".into(),
            }
        }
    }

    impl Sample for Reload {
        fn sample() -> Self {
            Reload {}
        }
    }
    impl Sample for UpdateAll {
        fn sample() -> Self {
            UpdateAll { parallel: Some(2) }
        }
    }
    impl Sample for ForgetAgent {
        fn sample() -> Self {
            ForgetAgent { name: "old".into() }
        }
    }

    #[test]
    fn update_all_takes_from_1_to_64_at_a_time() {
        assert!(UpdateAll { parallel: None }.validate().is_ok());
        assert!(UpdateAll { parallel: Some(64) }.validate().is_ok());
        let e = UpdateAll { parallel: Some(0) }.validate().unwrap_err();
        assert_eq!(e.to_string(), "parallel got 0; it must be from 1 to 64");
        assert!(UpdateAll { parallel: Some(65) }.validate().is_err());
    }

    #[test]
    fn an_operator_lifecycle_command_names_an_agent() {
        let e = StopAgent { name: " ".into() }.validate().unwrap_err();
        assert_eq!(e.to_string(), "name must name an agent");
        assert!(UpdateAgent { name: "pal".into() }.validate().is_ok());
    }
}
