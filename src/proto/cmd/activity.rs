//! The hive's recent activity for the operator (`activity`, the dashboard's
//! timeline): turn ends, dead letters, and the notices the broker and the
//! supervisor write — logins, approvals, usage limits, budgets, quotas,
//! updates — newest first. Read from the store, so it is the same after a
//! restart of `hive up` and whether or not a dashboard was open.

use crate::proto::command::{Command, Invalid};
use serde::{Deserialize, Serialize};

/// Most events one `activity` answers.
pub const MAX_ACTIVITY: u32 = 200;

/// Operator: the newest `limit` events (default 50, at most
/// [`MAX_ACTIVITY`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Activity {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

impl Activity {
    pub fn limit(&self) -> u32 {
        self.limit.unwrap_or(50)
    }
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActivityEvent {
    /// Unix seconds.
    pub at: i64,
    /// `turn_end` (an agent handled a message), `dead_letter` (a harness
    /// gave one up), or the kind of the notice (`needs_login`, `logged_in`,
    /// `approval_requested`, `approval_decided`, `usage_limit`, `budget`,
    /// `quota`, `needs_update`, `rebuilt`, `cli_version`).
    pub kind: String,
    /// The message it is about.
    pub id: i64,
    /// The agent that handled or gave up the message; none for a notice,
    /// whose text names whom it is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// One line, at most 200 characters.
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActivityReply {
    /// Newest first.
    pub events: Vec<ActivityEvent>,
}

impl Command for Activity {
    type Reply = ActivityReply;
    fn validate(&self) -> Result<(), Invalid> {
        match self.limit {
            Some(n) if n == 0 || n > MAX_ACTIVITY => Err(Invalid::arg(
                "limit",
                format!("{n} is not between 1 and {MAX_ACTIVITY}"),
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for Activity {
        fn sample() -> Self {
            Activity { limit: Some(20) }
        }
    }

    #[test]
    fn the_limit_is_bounded() {
        assert!(Activity::default().validate().is_ok());
        assert_eq!(Activity::default().limit(), 50);
        for n in [0, MAX_ACTIVITY + 1] {
            let e = Activity { limit: Some(n) }.validate().unwrap_err();
            assert!(e.to_string().contains("between 1 and 200"), "{e}");
        }
    }
}
