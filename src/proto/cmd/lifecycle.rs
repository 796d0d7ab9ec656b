//! Lifecycle: an agent asks for a new child (`request_spawn`, an approval) or
//! stops and starts its own children (`kill`, `start`, `restart`, `update`);
//! the operator reads the supervisor's view (`supervision`). The supervisor of
//! `hive up` carries them out.

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
}
