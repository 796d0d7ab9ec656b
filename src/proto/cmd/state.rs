//! What a harness reports about itself besides its turns: `report_state`, its
//! pause (why and until when it waits before the next message runs), which
//! the broker keeps in memory while the harness is connected and shows in
//! `agents`.

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
