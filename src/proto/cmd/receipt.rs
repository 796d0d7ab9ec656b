//! Receipts (issue 43, item 0): `message_state`, what became of one message,
//! read from the broker's rows. An agent reads the messages it sent (any
//! other id is "not a message you sent", whether it exists or not); the
//! operator (`hive message ID`) reads any message.

use crate::proto::command::{Command, Invalid};
use crate::proto::text::excerpt;
use serde::{Deserialize, Serialize};

/// The state of message `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MessageState {
    pub id: i64,
}

/// Where a message is, one of the states the broker's rows hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Where {
    /// In its recipient's queue (`position`: 1 is next).
    Queued,
    /// Handed out (`at`; `via`: `turn` or `recv`), not done yet.
    HandedOut,
    /// Done (`at`; `via`, and the harness's `turn` when it said).
    Acked,
    /// Given up on (`error`, `at`); `hive retry` puts it back.
    DeadLettered,
    /// To another hive: in the bridge's outbox, not posted yet.
    HandedToBridge,
    /// To another hive: posted to the swarm room (`at`, `event_id`).
    Posted,
    /// To another hive: the homeserver refused it for good (`error`).
    Bounced,
    /// The id was this sender's, and retention deleted its row.
    Pruned,
}

impl Where {
    pub fn name(self) -> &'static str {
        match self {
            Where::Queued => "queued",
            Where::HandedOut => "handed_out",
            Where::Acked => "acked",
            Where::DeadLettered => "dead_lettered",
            Where::HandedToBridge => "handed_to_bridge",
            Where::Posted => "posted",
            Where::Bounced => "bounced",
            Where::Pruned => "pruned",
        }
    }
}

/// Answer to `message_state`. `text` says it in one line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageStateReply {
    pub id: i64,
    pub state: Where,
    /// The recipient (absent once pruned).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_at: Option<i64>,
    /// Queued: its place in the recipient's queue of stored rows, 1 first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// When it was handed out, acked, dead-lettered, posted or bounced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<i64>,
    /// Handed out or acked: `turn` (the harness's `recv_next`) or `recv`
    /// (the MCP tool); absent for rows handed out before the broker kept it
    /// and for the operator's inbox.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<String>,
    /// Acked by a turn: the turn id the harness reported with its ack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<i64>,
    /// Hand-outs that counted as attempts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Dead-lettered or bounced: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Posted: the room event's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    pub text: String,
}

impl Command for MessageState {
    type Reply = MessageStateReply;
    fn validate(&self) -> Result<(), Invalid> {
        if self.id <= 0 {
            return Err(Invalid::arg(
                "id",
                format!(
                    "{} is not a message id (send answers the id of what it stored)",
                    excerpt(&self.id.to_string())
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for MessageState {
        fn sample() -> Self {
            MessageState { id: 12 }
        }
    }

    #[test]
    fn ids_are_positive_and_states_have_wire_names() {
        assert!(MessageState { id: 0 }.validate().is_err());
        assert!(MessageState { id: -3 }.validate().is_err());
        assert!(MessageState { id: 1 }.validate().is_ok());
        for w in [
            Where::Queued,
            Where::HandedOut,
            Where::Acked,
            Where::DeadLettered,
            Where::HandedToBridge,
            Where::Posted,
            Where::Bounced,
            Where::Pruned,
        ] {
            let json = serde_json::to_string(&w).unwrap();
            assert_eq!(json, format!("\"{}\"", w.name()));
        }
    }
}
