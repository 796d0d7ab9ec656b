//! Spend and budgets (issue 16): `report_spend`, one row per claude run a
//! harness reports with an idempotency key (re-sent until acknowledged; the
//! broker keeps the first), `budget`, every agent's and the hive's spend
//! against their budgets in the current UTC window, `own_budget`, the same
//! for the calling agent and its hive only (its page's `/metrics` asks it;
//! read-only, so any process holding the agent socket may), and `set_budget`, the
//! operator's change of a budget (written to the fleet file with the merge
//! rule of the operator's other writes), and `void_spend`, the operator's
//! removal of a scope's rows in its current window. A spend row carries the
//! run's end time (`at`), so a row re-sent after a restart counts in the
//! window its run happened in, not in the one it arrives in. One row counts
//! at most [`MAX_RUN_USD`] and [`MAX_RUN_TOKENS`] (issue 40): a report above
//! is kept clamped to them and flagged ([`ReportSpend::bounded`]), since
//! any process on the agent's socket may report spend.

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

/// The most dollars one run's row counts: a report above is clamped to it
/// and flagged. `--max-budget-usd` (`turn_usd`) keeps real runs far below.
pub const MAX_RUN_USD: f64 = 1_000.0;

/// The most tokens (and, apart, cache reads) one run's row counts: a report
/// above is clamped to it and flagged. A run of a day at full speed stays
/// well below.
pub const MAX_RUN_TOKENS: u64 = 1_000_000_000;

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
        // A cost above the bound is clamped, not refused: the row is kept
        // (it is spend the harness saw) and flagged (`bounded`).
        if self.usd.is_some_and(|u| !u.is_finite() || u < 0.0) {
            return Err(Invalid::arg("usd", "must be a cost of 0 dollars or more"));
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

/// What one run's row counts: its figures within [`MAX_RUN_USD`] and
/// [`MAX_RUN_TOKENS`], and whether any had to be clamped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounded {
    pub usd: Option<f64>,
    pub tokens: u64,
    pub cache_read: u64,
    pub clamped: bool,
}

impl ReportSpend {
    /// The row as the broker keeps it: each figure clamped to its bound.
    pub fn bounded(&self) -> Bounded {
        let usd = self.usd.map(|u| u.min(MAX_RUN_USD));
        let tokens = self.tokens.min(MAX_RUN_TOKENS);
        let cache_read = self.cache_read.min(MAX_RUN_TOKENS);
        Bounded {
            usd,
            tokens,
            cache_read,
            clamped: usd != self.usd || tokens != self.tokens || cache_read != self.cache_read,
        }
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
    /// The limit is reached: the scope's agents are paused. Also true when
    /// the scope's spend cannot be added up (the operator's row says why):
    /// a budget check that fails holds the agents (it fails closed).
    pub reached: bool,
}

/// One scope's row of the operator's `budget`: the row `own_budget` shows
/// an agent, and what the operator acts on (issue 40).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScopeReport {
    #[serde(flatten)]
    pub row: BudgetRow,
    /// Runs of this window whose report was over a per-run bound, kept
    /// clamped ([`MAX_RUN_USD`], [`MAX_RUN_TOKENS`]).
    #[serde(default)]
    pub clamped_runs: u64,
    /// Why the scope's spend cannot be added up (a sum past 2^64, a row the
    /// store cannot read); the figures are then 0 and the budget counts as
    /// reached until the window ends or the operator voids the rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The operator's `budget`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetReport {
    /// The hive first, then every agent.
    pub rows: Vec<ScopeReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetReply {
    /// The hive first, then every agent.
    pub rows: Vec<BudgetRow>,
}

impl Command for GetBudget {
    type Reply = BudgetReport;
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

/// The operator removes the spend rows of an agent (`agent`) or of the
/// whole hive (`hive`) in the scope's current window (its budget's, or the
/// day's without one): what a forged or runaway report added is gone, and
/// the budget counts from zero again.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoidSpend {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hive: bool,
}

/// What `void_spend` removed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VoidReply {
    /// An agent's name, or `hive`.
    pub scope: String,
    /// Unix seconds: the window whose rows went.
    pub window_start: i64,
    pub window_end: i64,
    /// Rows removed.
    pub voided: u64,
    pub text: String,
}

impl Command for VoidSpend {
    type Reply = VoidReply;
    fn validate(&self) -> Result<(), Invalid> {
        if self.agent.is_some() == self.hive {
            return Err(Invalid::arg(
                "agent",
                "name one agent, or void the hive's spend with hive:true",
            ));
        }
        Ok(())
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
    impl Sample for VoidSpend {
        fn sample() -> Self {
            VoidSpend {
                agent: Some("ana".into()),
                hive: false,
            }
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
        for bad in [f64::NAN, f64::INFINITY, -0.5] {
            s.usd = Some(bad);
            assert!(s.validate().is_err(), "{bad}");
        }
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
        assert!(VoidSpend::sample().validate().is_ok());
        assert!(VoidSpend::default().validate().is_err(), "nobody named");
        let both = VoidSpend {
            agent: Some("ana".into()),
            hive: true,
        };
        assert!(both.validate().is_err());
        let negative = SetBudget {
            hive: true,
            usd: Some(-1.0),
            ..SetBudget::default()
        };
        assert!(negative.validate().is_err());
    }

    /// A run above a bound is kept clamped and flagged, whatever it says;
    /// one within them is kept as it is.
    #[test]
    fn a_run_over_the_bounds_is_clamped_and_flagged() {
        let run = |usd: Option<f64>, tokens: u64, cache_read: u64| ReportSpend {
            usd,
            tokens,
            cache_read,
            ..ReportSpend::sample()
        };
        let cases = [
            (run(Some(0.5), 10, 5), (Some(0.5), 10, 5, false)),
            (run(None, 0, 0), (None, 0, 0, false)),
            (
                run(Some(MAX_RUN_USD), MAX_RUN_TOKENS, MAX_RUN_TOKENS),
                (Some(MAX_RUN_USD), MAX_RUN_TOKENS, MAX_RUN_TOKENS, false),
            ),
            (run(Some(1e6), 1, 1), (Some(MAX_RUN_USD), 1, 1, true)),
            (
                run(Some(1.0), u64::MAX, 0),
                (Some(1.0), MAX_RUN_TOKENS, 0, true),
            ),
            (
                run(None, 0, MAX_RUN_TOKENS + 1),
                (None, 0, MAX_RUN_TOKENS, true),
            ),
        ];
        for (report, (usd, tokens, cache_read, clamped)) in cases {
            assert!(report.validate().is_ok(), "{report:?}");
            let b = report.bounded();
            assert_eq!(
                (b.usd, b.tokens, b.cache_read, b.clamped),
                (usd, tokens, cache_read, clamped),
                "{report:?}"
            );
        }
    }
}
