//! Dead letters: the harness's `dead_letter` (it gives up on its inflight
//! message at its attempt limit; the broker keeps it `failed` and tells the
//! recipient's parent and the sender), and the operator's `failed` (list them)
//! and `retry` (put one back at the tail of its agent's queue).

use super::inbox::check_error;
use crate::proto::command::{Command, Invalid};
use crate::proto::ident::check_name;
use crate::proto::reply::{is_zero, FailedMessage};
use crate::proto::text::excerpt;
use serde::{Deserialize, Serialize};

/// The harness gives up on its inflight message: it failed the attempt limit
/// for reasons of its own. The broker keeps it in the `failed` state (never
/// deleted automatically) with `error` as its last error, and tells the
/// recipient's parent and the message's sender (when that is an agent) once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeadLetter {
    pub id: i64,
    pub error: String,
    /// False when the harness gives up without running it this time (its
    /// attempts were used up by runs it never finished): this hand-out is
    /// given back, so the count says how often it ran.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub ran: bool,
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// Answer to `dead_letter`: who was told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetterReply {
    /// The id the dead letter is kept under (a transient wake gets a stored
    /// row of its own).
    pub id: i64,
    pub told: Vec<String>,
}

impl Command for DeadLetter {
    type Reply = DeadLetterReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_error(&self.error)
    }
}

/// Operator: the dead letters, oldest first, of every agent or of `agent`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failed {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
}

/// Answer to `failed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedReply {
    pub failed: Vec<FailedMessage>,
    /// Dead letters that did not fit in the answer's byte budget.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
}

impl Command for Failed {
    type Reply = FailedReply;
    fn validate(&self) -> Result<(), Invalid> {
        match &self.agent {
            Some(a) => check_name(a).map_err(|e| Invalid::arg("agent", e)),
            None => Ok(()),
        }
    }
}

/// Operator: puts a dead letter back at the tail of its agent's queue with its
/// attempts reset. Any other message is refused (`message #ID is acked, not
/// failed`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    pub id: i64,
}

/// Answer to `retry`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetryReply {
    pub id: i64,
    /// The agent whose queue it is back in.
    pub agent: String,
}

impl Command for Retry {
    type Reply = RetryReply;
    fn validate(&self) -> Result<(), Invalid> {
        if self.id <= 0 {
            return Err(Invalid::arg(
                "id",
                format!(
                    "{} is not a message id; `hive failed` lists the dead letters",
                    excerpt(&self.id.to_string())
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for DeadLetter {
        fn sample() -> Self {
            DeadLetter {
                id: 12,
                error: "failed: claude exited with code 1 without a result line".into(),
                ran: false,
            }
        }
    }
    impl Sample for Failed {
        fn sample() -> Self {
            Failed {
                agent: Some("ana".into()),
            }
        }
    }
    impl Sample for Retry {
        fn sample() -> Self {
            Retry { id: 12 }
        }
    }

    #[test]
    fn errors_ids_and_names_are_checked() {
        let e = DeadLetter {
            id: 1,
            error: " ".into(),
            ran: true,
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.to_string(), "error must not be empty");
        let e = DeadLetter {
            id: 1,
            error: "x".repeat(2001),
            ran: true,
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("2001 characters"), "{e}");
        assert!(Retry { id: 0 }.validate().is_err());
        assert!(Failed {
            agent: Some("NO".into())
        }
        .validate()
        .is_err());
    }
}
