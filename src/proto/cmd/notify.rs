//! Notifications (issue 43, item 3): the operator's `notify_test` (a test
//! event to every destination) and `notify_status` (each destination's
//! queue, last success, last error and counters — the figures a metrics
//! endpoint renders as deliveries by result and drops).

use crate::proto::command::Command;
use serde::{Deserialize, Serialize};

/// Operator: queue a test event for every destination.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyTest {}

/// Answer to `notify_test`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NotifyTestReply {
    /// The outbox row of the test event.
    pub event: i64,
    /// The destinations it goes to.
    pub destinations: u64,
}

impl Command for NotifyTest {
    type Reply = NotifyTestReply;
}

/// Operator: every destination's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyStatus {}

/// One destination in `notify_status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NotifyDest {
    /// Scheme and host only.
    pub url: String,
    pub format: String,
    pub events: Vec<String>,
    /// Events waiting for it (the one being retried included).
    pub pending: u64,
    /// Failed tries of the event at its head.
    pub attempts: u64,
    /// When the next try of a failing queue is (unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_try_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_ok_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_at: Option<i64>,
    /// Events it accepted.
    pub delivered: u64,
    /// Tries it refused or that did not reach it.
    pub failed: u64,
    /// Events given up on after `notify.give_up_days`.
    pub dropped: u64,
}

/// Answer to `notify_status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NotifyStatusReply {
    pub destinations: Vec<NotifyDest>,
}

impl Command for NotifyStatus {
    type Reply = NotifyStatusReply;
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for NotifyTest {
        fn sample() -> Self {
            NotifyTest {}
        }
    }
    impl Sample for NotifyStatus {
        fn sample() -> Self {
            NotifyStatus {}
        }
    }
}
