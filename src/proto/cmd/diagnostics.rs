//! Diagnostics: the tail of an agent's supervised log (`get_logs`) and, with
//! the `read_host_journal` capability, of the host's journal.

use crate::proto::command::{Command, Invalid};
use crate::proto::limits::{DEFAULT_LOG_LINES, MAX_LOG_LINES, MAX_UNIT_CHARS};
use crate::proto::reply::TextReply;
use crate::proto::text::{excerpt, is_control_or_bidi};
use serde::{Deserialize, Serialize};

/// How many lines to read for a `lines` argument.
pub fn log_lines(lines: Option<u64>) -> u64 {
    lines.unwrap_or(DEFAULT_LOG_LINES).clamp(1, MAX_LOG_LINES)
}

/// The tail of an agent's supervised log (the caller's when `agent` is absent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetLogs {
    #[serde(default)]
    pub agent: Option<String>,
    #[serde(default)]
    pub lines: Option<u64>,
}

impl Command for GetLogs {
    type Reply = TextReply;
}

/// The tail of the host's journal, optionally of one systemd unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetHostJournal {
    #[serde(default)]
    pub unit: Option<String>,
    #[serde(default)]
    pub lines: Option<u64>,
}

impl Command for GetHostJournal {
    type Reply = TextReply;
    fn validate(&self) -> Result<(), Invalid> {
        match &self.unit {
            Some(u)
                if u.is_empty()
                    || u.starts_with('-')
                    || u.chars().count() > MAX_UNIT_CHARS
                    || u.contains(char::is_whitespace)
                    || u.chars().any(is_control_or_bidi) =>
            {
                Err(Invalid::arg(
                    "unit",
                    format!("{} is not a unit name", excerpt(u)),
                ))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for GetLogs {
        fn sample() -> Self {
            GetLogs {
                agent: Some("kid".into()),
                lines: Some(10),
            }
        }
    }
    impl Sample for GetHostJournal {
        fn sample() -> Self {
            GetHostJournal {
                unit: Some("nginx.service".into()),
                lines: None,
            }
        }
    }

    #[test]
    fn units_are_names_and_lines_are_clamped() {
        let j = |u: &str| GetHostJournal {
            unit: Some(u.into()),
            lines: None,
        };
        for bad in ["", "--all", "a b", "x\u{1b}"] {
            assert!(
                j(bad)
                    .validate()
                    .unwrap_err()
                    .to_string()
                    .contains("is not a unit name"),
                "{bad:?}"
            );
        }
        assert_eq!(
            (log_lines(None), log_lines(Some(0)), log_lines(Some(9999))),
            (100, 1, 2000)
        );
    }
}
