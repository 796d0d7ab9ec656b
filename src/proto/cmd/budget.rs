//! Spend and budgets (issue 16): `report_spend`, one row per claude run a
//! harness reports with an idempotency key (re-sent until acknowledged; the
//! broker keeps the first), `budget`, every agent's and the hive's spend
//! against their budgets in the current UTC window, `own_budget`, the same
//! for the calling agent and its hive only (its page's `/metrics` asks it;
//! read-only, so any process holding the agent socket may), and `set_budget`, the
//! operator's change of a budget (written to the fleet file with the merge
//! rule of the operator's other writes). A spend row carries the run's end
//! time (`at`), so a row re-sent after a restart counts in the window its run
//! happened in, not in the one it arrives in.

use crate::proto::command::{Command, Invalid};
use crate::proto::fleet::Per;
use crate::proto::reply::{Empty, TextReply};
use crate::proto::text::excerpt;
use serde::{Deserialize, Serialize};

/// Longest idempotency key.
pub const MAX_SPEND_KEY: usize = 80;

/// How far in the future a spend row's `at` may be (clocks of one machine
/// agree; a little slack for a run ending as the row is sent), seconds.
pub const SPEND_AT_AHEAD: i64 = 60;

/// The oldest `at` a spend row may carry: 2020-01-01 UTC, before any hive
/// ran. Older is a clock that was never set, not a run.
pub const SPEND_AT_MIN: i64 = 1_577_836_800;

/// One claude run's spend. `usd` null: the run printed no `result` line, its
/// cost is unknown (shown as such, counted as 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportSpend {
    /// The harness's boot id and its stats row id: the same run reported
    /// twice (a re-send after a reconnect) is kept once.
    pub key: String,
    #[serde(default)]
    pub usd: Option<f64>,
    /// Input + cache writes + output.
    #[serde(default)]
    pub tokens: u64,
    /// Cache reads, shown apart and not counted against a budget.
    #[serde(default)]
    pub cache_read: u64,
    /// When the run ended, unix seconds: the row counts in the budget window
    /// holding it (a row re-sent after midnight counts in yesterday's). A
    /// harness that does not send it: the broker's time of arrival.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<i64>,
}

impl Command for ReportSpend {
    type Reply = Empty;
    fn validate(&self) -> Result<(), Invalid> {
        if self.key.is_empty()
            || self.key.len() > MAX_SPEND_KEY
            || !self
                .key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_:".contains(&b))
        {
            return Err(Invalid::arg(
                "key",
                format!(
                    "{} must be 1 to {MAX_SPEND_KEY} letters, digits and -_:",
                    excerpt(&self.key)
                ),
            ));
        }
        if self
            .usd
            .is_some_and(|u| !u.is_finite() || !(0.0..=1_000_000.0).contains(&u))
        {
            return Err(Invalid::arg("usd", "must be a cost from 0 to 1000000"));
        }
        if self.tokens > 1_000_000_000_000 || self.cache_read > 1_000_000_000_000 {
            return Err(Invalid::arg("tokens", "must be at most 10^12"));
        }
        if let Some(at) = self.at {
            let latest = crate::proto::now() + SPEND_AT_AHEAD;
            if !(SPEND_AT_MIN..=latest).contains(&at) {
                return Err(Invalid::arg(
                    "at",
                    format!(
                        "{at} must be the run's end in unix seconds: not before 2020 and not \
                         more than {SPEND_AT_AHEAD} s ahead of the broker's clock (is this \
                         machine's clock set?)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Every agent's and the hive's spend against their budgets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetBudget {}

/// One scope's spend in its current window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetRow {
    /// An agent's name, or `hive`.
    pub scope: String,
    pub per: Per,
    /// Unix seconds: the window, UTC.
    pub window_start: i64,
    pub window_end: i64,
    pub spent_usd: f64,
    /// Runs whose cost is unknown (no `result` line).
    pub unknown_runs: u64,
    pub tokens: u64,
    pub cache_read: u64,
    #[serde(default)]
    pub usd: Option<f64>,
    #[serde(default)]
    pub budget_tokens: Option<u64>,
    /// The limit is reached: the scope's agents are paused.
    pub reached: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetReply {
    /// The hive first, then every agent.
    pub rows: Vec<BudgetRow>,
}

impl Command for GetBudget {
    type Reply = BudgetReply;
}

/// The calling agent's spend against its budget and the hive's: `rows` holds
/// the hive's row, then the agent's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OwnBudget {}

impl Command for OwnBudget {
    type Reply = BudgetReply;
}

/// The operator sets an agent's budget (`agent`) or the hive's (`hive`):
/// `usd`/`tokens` set a limit, `clear_usd`/`clear_tokens` remove one, `per`
/// sets the window; what is not named stays.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetBudget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hive: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd: Option<f64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clear_usd: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clear_tokens: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per: Option<Per>,
}

impl Command for SetBudget {
    type Reply = TextReply;
    fn validate(&self) -> Result<(), Invalid> {
        if self.agent.is_some() == self.hive {
            return Err(Invalid::arg(
                "agent",
                "name one agent, or set the hive's budget with hive:true",
            ));
        }
        if self.usd.is_some() && self.clear_usd {
            return Err(Invalid::arg("usd", "set or clear it, not both"));
        }
        if self.tokens.is_some() && self.clear_tokens {
            return Err(Invalid::arg("tokens", "set or clear it, not both"));
        }
        if self.usd.is_none()
            && !self.clear_usd
            && self.tokens.is_none()
            && !self.clear_tokens
            && self.per.is_none()
        {
            return Err(Invalid::arg(
                "usd",
                "nothing to change: give usd, tokens or per (or clear one)",
            ));
        }
        let b = crate::proto::Budget {
            usd: self.usd,
            tokens: self.tokens,
            per: Per::Day,
        };
        b.check("budget").map_err(|e| Invalid::arg("usd", e))
    }
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for ReportSpend {
        fn sample() -> Self {
            ReportSpend {
                key: "b00t1d:17".into(),
                usd: Some(0.014),
                tokens: 2484,
                cache_read: 6000,
                at: Some(1_795_000_000),
            }
        }
    }
    impl Sample for GetBudget {
        fn sample() -> Self {
            GetBudget {}
        }
    }
    impl Sample for OwnBudget {
        fn sample() -> Self {
            OwnBudget {}
        }
    }
    impl Sample for SetBudget {
        fn sample() -> Self {
            SetBudget {
                agent: Some("ana".into()),
                usd: Some(5.0),
                per: Some(Per::Week),
                ..SetBudget::default()
            }
        }
    }

    #[test]
    fn spend_and_budget_changes_are_checked() {
        let mut s = ReportSpend::sample();
        assert!(s.validate().is_ok());
        s.key = "a b".into();
        assert!(s.validate().is_err());
        let mut s = ReportSpend::sample();
        s.usd = Some(f64::NAN);
        assert!(s.validate().is_err());
        // `at`: absent (an older harness) or the run's end, not far ahead,
        // not before 2020.
        let mut s = ReportSpend::sample();
        s.at = None;
        assert!(s.validate().is_ok());
        s.at = Some(crate::proto::now() - 86_400);
        assert!(s.validate().is_ok(), "yesterday's run re-sent");
        s.at = Some(crate::proto::now() + 30);
        assert!(s.validate().is_ok(), "within the minute's slack");
        s.at = Some(crate::proto::now() + 3600);
        let e = s.validate().unwrap_err();
        assert!(e.to_string().starts_with("at "), "{e}");
        s.at = Some(0);
        assert!(s.validate().is_err(), "1970: a clock never set");
        s.at = Some(i64::MAX);
        assert!(s.validate().is_err());
        assert!(SetBudget::sample().validate().is_ok());
        assert!(SetBudget::default().validate().is_err(), "nobody named");
        let both = SetBudget {
            agent: Some("ana".into()),
            hive: true,
            usd: Some(1.0),
            ..SetBudget::default()
        };
        assert!(both.validate().is_err());
        let nothing = SetBudget {
            hive: true,
            ..SetBudget::default()
        };
        assert!(nothing.validate().is_err());
        let negative = SetBudget {
            hive: true,
            usd: Some(-1.0),
            ..SetBudget::default()
        };
        assert!(negative.validate().is_err());
    }
}
