//! `message_counts` (issue 43, item 2): how many of the broker's message rows
//! each recipient has in each state, for the dashboard's hive-wide `/metrics`
//! (`hive_messages`). The states are `message_state`'s words: `queued`,
//! `handed_out` (to a turn or to `recv`), `acked` (kept until retention
//! prunes it) and `dead_lettered`. The dashboard asks it as the operator,
//! over the host socket; the web thread never opens `broker.db` itself.

use crate::proto::command::Command;
use serde::{Deserialize, Serialize};

/// Operator: the message rows per recipient and state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageCounts {}

/// One recipient's rows in one state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageCount {
    /// The recipient: an agent, or `operator`.
    pub agent: String,
    /// `queued`, `handed_out`, `acked` or `dead_lettered`.
    pub state: String,
    pub count: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MessageCountsReply {
    /// By recipient, then state; a state a recipient has no row in is left
    /// out.
    pub counts: Vec<MessageCount>,
}

impl Command for MessageCounts {
    type Reply = MessageCountsReply;
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for MessageCounts {
        fn sample() -> Self {
            MessageCounts {}
        }
    }
}
