//! What a harness reports about itself besides its turns: `report_state`, its
//! pause (why and until when it waits before the next message runs), which
//! the broker keeps in memory while the harness is connected and shows in
//! `agents`; and what makes the broker the authority for pauses (issue 16):
//! `report_pool`, what identifies the credential the harness's claude runs
//! on, and `report_usage_limit`, a usage limit with its reset, which parks
//! the whole pool. `report_pool` also carries what a run's `rate_limit_event`
//! said when it did not refuse ([`UsageSeen`]): the CLI's early warning that
//! the account is near its usage limit, shown on the pool's agents until the
//! window resets.

use crate::proto::command::{Command, Invalid};
use crate::proto::kinds::PauseReason;
use crate::proto::limits::MAX_PAUSE_DETAIL_CHARS;
use crate::proto::reply::{Empty, Paused};
use crate::proto::text::{excerpt, is_control_or_bidi};
use serde::{Deserialize, Serialize};

/// The harness's pause now: `null` when it does not wait.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportState {
    pub paused: Option<Paused>,
}

impl Command for ReportState {
    type Reply = Empty;
    fn validate(&self) -> Result<(), Invalid> {
        let Some(p) = &self.paused else {
            return Ok(());
        };
        if let PauseReason::Other(r) = &p.reason {
            // A reason this release does not know is shown as it is: a word.
            if r.is_empty()
                || r.len() > 32
                || !r.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
            {
                return Err(Invalid::arg(
                    "paused.reason",
                    format!(
                        "{} must be a word of at most 32 lowercase letters and _",
                        excerpt(r)
                    ),
                ));
            }
        }
        let n = p.detail.chars().count();
        if n > MAX_PAUSE_DETAIL_CHARS || p.detail.chars().any(is_control_or_bidi) {
            return Err(Invalid::arg(
                "paused.detail",
                format!(
                    "must be one line of at most {MAX_PAUSE_DETAIL_CHARS} characters, got {n} characters"
                ),
            ));
        }
        if p.until.is_some_and(|t| t < 0) {
            return Err(Invalid::arg("paused.until", "must be unix seconds"));
        }
        Ok(())
    }
}

/// Longest account id (`oauthAccount.accountUuid`) or digest reported.
pub const MAX_POOL_ID: usize = 128;

/// What identifies the credential the harness's claude runs on, computed at
/// every spawn: the account id of the claude config
/// (`oauthAccount.accountUuid` in `$CLAUDE_CONFIG_DIR/.claude.json`), else
/// the SHA-256 of the credential (the broker keys it with the hive's salt and
/// keeps only that). Both absent: the agent is a pool of its own. A fleet
/// entry's `account` wins over both.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportPool {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_sha256: Option<String>,
    /// What the last run's `rate_limit_event` said, sent after a run when it
    /// changed; absent at a spawn (no news).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<UsageSeen>,
}

/// The `status` of a `rate_limit_event` that did not refuse. CLI 2.1.197
/// prints one such line on every run with an OAuth credential (none with an
/// API key): `allowed`, or `allowed_warning` when the API's unified
/// rate-limit headers say a window is near its limit (a
/// `anthropic-ratelimit-unified-<5h|7d|…>-surpassed-threshold` header, or
/// `-5h-utilization` ≥ 0.9 early in the window; `docs/turn-loop.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageStatus {
    Allowed,
    AllowedWarning,
}

/// What one run's `rate_limit_event` said about the account's usage limit
/// when it did not refuse.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageSeen {
    pub status: UsageStatus,
    /// Unix seconds when the window that is near its limit resets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resets_at: Option<i64>,
    /// The CLI's `rateLimitType`: `five_hour`, `seven_day`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// The share of the window used (0.92), when the CLI said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<f64>,
}

/// Longest `rateLimitType` kept.
pub const MAX_WINDOW_NAME: usize = 40;

/// Whether `w` is a `rateLimitType` as the CLI names them: a short word of
/// lowercase letters, digits and `_`.
pub fn is_window_name(w: &str) -> bool {
    !w.is_empty()
        && w.len() <= MAX_WINDOW_NAME
        && w.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

impl UsageSeen {
    fn validate(&self) -> Result<(), Invalid> {
        if self.resets_at.is_some_and(|t| t < 0) {
            return Err(Invalid::arg("usage.resets_at", "must be unix seconds"));
        }
        if let Some(w) = &self.window {
            if !is_window_name(w) {
                return Err(Invalid::arg(
                    "usage.window",
                    format!(
                        "{} must be a word of at most {MAX_WINDOW_NAME} lowercase letters, digits and _",
                        excerpt(w)
                    ),
                ));
            }
        }
        if self
            .utilization
            .is_some_and(|u| !u.is_finite() || !(0.0..=10.0).contains(&u))
        {
            return Err(Invalid::arg(
                "usage.utilization",
                "must be a share of the window between 0 and 10",
            ));
        }
        Ok(())
    }
}

/// Answer to `report_pool`: the agent's pool as the broker names it
/// (`account:NAME`, `uuid:…`, `key:` and 8 hex digits, or `agent:NAME`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolReply {
    pub pool: String,
}

fn id_word(field: &'static str, v: &Option<String>) -> Result<(), Invalid> {
    match v {
        Some(s)
            if s.is_empty()
                || s.len() > MAX_POOL_ID
                || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') =>
        {
            Err(Invalid::arg(
                field,
                format!(
                    "{} must be at most {MAX_POOL_ID} letters, digits and -",
                    excerpt(s)
                ),
            ))
        }
        _ => Ok(()),
    }
}

impl Command for ReportPool {
    type Reply = PoolReply;
    fn validate(&self) -> Result<(), Invalid> {
        id_word("account_uuid", &self.account_uuid)?;
        if let Some(u) = &self.usage {
            u.validate()?;
        }
        match &self.credential_sha256 {
            Some(d) if d.len() != 64 || !d.bytes().all(|b| b.is_ascii_hexdigit()) => Err(
                Invalid::arg("credential_sha256", "must be 64 hex digits (a SHA-256)"),
            ),
            _ => Ok(()),
        }
    }
}

/// A usage limit with a reset time, as the harness's run ended: the broker
/// parks the agent's whole pool until `until` (the harness has capped it at
/// `HIVE_RATE_LIMIT_MAX_SLEEP_SECS`; the broker caps it too). `credential`
/// is what identified the run's credential, as `report_pool` sent it before
/// the run: a report whose credential is not the agent's pool is refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportUsageLimit {
    pub until: i64,
    #[serde(default)]
    pub detail: String,
    #[serde(default)]
    pub credential: ReportPool,
}

impl Command for ReportUsageLimit {
    type Reply = Empty;
    fn validate(&self) -> Result<(), Invalid> {
        if self.until < 0 {
            return Err(Invalid::arg("until", "must be unix seconds"));
        }
        self.credential.validate()?;
        let n = self.detail.chars().count();
        if n > MAX_PAUSE_DETAIL_CHARS || self.detail.chars().any(is_control_or_bidi) {
            return Err(Invalid::arg(
                "detail",
                format!(
                    "must be one line of at most {MAX_PAUSE_DETAIL_CHARS} characters, got {n} characters"
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

    impl Sample for ReportState {
        fn sample() -> Self {
            ReportState {
                paused: Some(Paused {
                    reason: PauseReason::RateLimit,
                    until: Some(1_795_323_782),
                    detail: "rate limited: message #12 from operator requeued".into(),
                }),
            }
        }
    }

    impl Sample for ReportPool {
        fn sample() -> Self {
            ReportPool {
                account_uuid: Some("3f1c2a9e-0000-4000-8000-000000000001".into()),
                credential_sha256: None,
                usage: Some(UsageSeen {
                    status: UsageStatus::AllowedWarning,
                    resets_at: Some(1_795_447_359),
                    window: Some("five_hour".into()),
                    utilization: Some(0.92),
                }),
            }
        }
    }

    impl Sample for ReportUsageLimit {
        fn sample() -> Self {
            ReportUsageLimit {
                until: 1_795_323_782,
                detail: "You've hit your session limit · resets 5:03am (UTC)".into(),
                credential: ReportPool::sample(),
            }
        }
    }

    #[test]
    fn pool_ids_are_words() {
        let uuid = |s: &str| ReportPool {
            account_uuid: Some(s.into()),
            ..ReportPool::default()
        };
        assert!(uuid("3f1c2a9e-0000").validate().is_ok());
        assert!(uuid("").validate().is_err());
        assert!(uuid("a b").validate().is_err());
        assert!(uuid(&"a".repeat(129)).validate().is_err());
        assert!(ReportPool::default().validate().is_ok());
        let digest = |s: &str| ReportPool {
            credential_sha256: Some(s.into()),
            ..ReportPool::default()
        };
        assert!(digest(&"ab".repeat(32)).validate().is_ok());
        assert!(digest("ab12").validate().is_err());
        assert!(digest(&"zz".repeat(32)).validate().is_err());
        let limit = |until, detail: &str| ReportUsageLimit {
            until,
            detail: detail.into(),
            credential: ReportPool::default(),
        };
        assert!(limit(5, "x").validate().is_ok());
        assert!(limit(-1, "x").validate().is_err());
        assert!(limit(5, "a\nb").validate().is_err());
        let mut bad = limit(5, "x");
        bad.credential = uuid("a b");
        assert!(bad.validate().is_err(), "the credential is checked too");
    }

    #[test]
    fn a_usage_report_is_checked() {
        let seen = |resets_at, window: &str, utilization| ReportPool {
            usage: Some(UsageSeen {
                status: UsageStatus::AllowedWarning,
                resets_at,
                window: Some(window.into()),
                utilization,
            }),
            ..ReportPool::default()
        };
        assert!(seen(Some(5), "five_hour", Some(0.92)).validate().is_ok());
        assert!(seen(Some(5), "seven_day_overage_included", None)
            .validate()
            .is_ok());
        assert!(seen(Some(-1), "five_hour", None).validate().is_err());
        let e = seen(None, "Five Hour", None).validate().unwrap_err();
        assert!(e.to_string().contains("usage.window"), "{e}");
        assert!(seen(None, "five_hour", Some(f64::NAN)).validate().is_err());
        assert!(seen(None, "five_hour", Some(-0.5)).validate().is_err());
        let wire = r#"{"usage":{"status":"allowed_warning","resets_at":7,"window":"five_hour","utilization":0.9}}"#;
        let r: ReportPool = serde_json::from_str(wire).unwrap();
        assert_eq!(
            r.usage.as_ref().map(|u| u.status),
            Some(UsageStatus::AllowedWarning)
        );
        assert_eq!(serde_json::to_string(&r).unwrap(), wire);
        assert!(serde_json::from_str::<ReportPool>(r#"{"usage":{"status":"rejected"}}"#).is_err());
    }

    #[test]
    fn reasons_are_words_and_details_one_line() {
        let with = |reason: &str, detail: &str| ReportState {
            paused: Some(Paused {
                reason: PauseReason::parse(reason),
                until: None,
                detail: detail.into(),
            }),
        };
        assert!(with("usage_limit", "x").validate().is_ok());
        assert!(with("Budget!", "x").validate().is_err());
        assert!(with("login", "a\nb").validate().is_err());
        assert!(with("login", &"d".repeat(201)).validate().is_err());
        assert!(ReportState { paused: None }.validate().is_ok());
    }
}
