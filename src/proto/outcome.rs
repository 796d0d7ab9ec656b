//! The closed set of turn outcomes: what one claude process came to, as the
//! turn-stats db stores it, `/metrics` labels it and the page shows it. The
//! harness's classifier produces richer values (a reset time, the CLI's error
//! text); those details go into the row's note, never into the kind, so the
//! set of labels stays small whatever claude prints. Older releases stored the
//! free text itself; [`TurnOutcomeKind::from_stored`] reads both.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What one claude process (a turn, a checkpoint, a compaction) came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnOutcomeKind {
    /// A successful `result`.
    Ok,
    /// The session was compacted (a `/compact` run, or the CLI on its own).
    Compacted,
    /// Aborted mid-execution, by the operator or the CLI.
    Interrupted,
    /// The API refused for rate or usage limits.
    RateLimited,
    /// The API timed out, could not be reached or was overloaded.
    ApiUnavailable,
    /// The credentials were refused or are missing.
    AuthFailed,
    /// The session no longer fits the context window.
    PromptTooLong,
    /// The run passed its wall-clock limit and was killed.
    TimedOut,
    /// The run printed nothing for too long while no tool call was open.
    Hung,
    /// An MCP server of the run did not start.
    McpStartFailed,
    /// The run reached its cap, `--max-budget-usd` (the fleet entry's
    /// `turn_usd`).
    TurnBudget,
    /// Claude was never started (a missing binary, no descriptors…).
    NotStarted,
    /// The harness stopped during the run.
    Stopped,
    /// Anything else: a crash, an error result nothing above explains.
    Failed,
    /// A stored value this release does not know (written by a newer one).
    #[serde(other)]
    Other,
}

impl TurnOutcomeKind {
    pub const ALL: [TurnOutcomeKind; 15] = [
        TurnOutcomeKind::Ok,
        TurnOutcomeKind::Compacted,
        TurnOutcomeKind::Interrupted,
        TurnOutcomeKind::RateLimited,
        TurnOutcomeKind::ApiUnavailable,
        TurnOutcomeKind::AuthFailed,
        TurnOutcomeKind::PromptTooLong,
        TurnOutcomeKind::TimedOut,
        TurnOutcomeKind::Hung,
        TurnOutcomeKind::McpStartFailed,
        TurnOutcomeKind::TurnBudget,
        TurnOutcomeKind::NotStarted,
        TurnOutcomeKind::Stopped,
        TurnOutcomeKind::Failed,
        TurnOutcomeKind::Other,
    ];

    /// The stored and exported name.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnOutcomeKind::Ok => "ok",
            TurnOutcomeKind::Compacted => "compacted",
            TurnOutcomeKind::Interrupted => "interrupted",
            TurnOutcomeKind::RateLimited => "rate_limited",
            TurnOutcomeKind::ApiUnavailable => "api_unavailable",
            TurnOutcomeKind::AuthFailed => "auth_failed",
            TurnOutcomeKind::PromptTooLong => "prompt_too_long",
            TurnOutcomeKind::TimedOut => "timed_out",
            TurnOutcomeKind::Hung => "hung",
            TurnOutcomeKind::McpStartFailed => "mcp_start_failed",
            TurnOutcomeKind::TurnBudget => "turn_budget",
            TurnOutcomeKind::NotStarted => "not_started",
            TurnOutcomeKind::Stopped => "stopped",
            TurnOutcomeKind::Failed => "failed",
            TurnOutcomeKind::Other => "other",
        }
    }

    /// True for the outcomes after which the message is done.
    pub fn is_ok(self) -> bool {
        matches!(self, TurnOutcomeKind::Ok | TurnOutcomeKind::Compacted)
    }

    /// The kind of a stored outcome and the detail it carried: a kind's name
    /// as this release stores it, or the free text older releases stored
    /// (`rate limited (resets at 1795323782)`, `failed: claude exited with
    /// code 1 …`), whose detail then belongs in the note. Text that matches
    /// nothing is [`TurnOutcomeKind::Other`] with the whole text as detail.
    pub fn from_stored(text: &str) -> (TurnOutcomeKind, Option<String>) {
        if let Some(k) = TurnOutcomeKind::ALL
            .into_iter()
            .find(|k| k.as_str() == text && *k != TurnOutcomeKind::Other)
        {
            return (k, None);
        }
        let detail = |rest: &str| Some(rest.trim().to_string()).filter(|d| !d.is_empty());
        // The texts of the harness's `TurnOutcome` display before schema
        // version 2 of turn-stats.db.
        if text == "rate limited" {
            return (TurnOutcomeKind::RateLimited, None);
        }
        if let Some(rest) = text.strip_prefix("rate limited (") {
            return (
                TurnOutcomeKind::RateLimited,
                detail(rest.trim_end_matches(')')),
            );
        }
        match text {
            "authentication failed" => return (TurnOutcomeKind::AuthFailed, None),
            "prompt is too long" => return (TurnOutcomeKind::PromptTooLong, None),
            _ => {}
        }
        let prefixed: [(&str, TurnOutcomeKind); 4] = [
            ("API unavailable:", TurnOutcomeKind::ApiUnavailable),
            ("interrupted:", TurnOutcomeKind::Interrupted),
            ("not started:", TurnOutcomeKind::NotStarted),
            ("failed:", TurnOutcomeKind::Failed),
        ];
        for (prefix, kind) in prefixed {
            if let Some(rest) = text.strip_prefix(prefix) {
                let kind = if kind == TurnOutcomeKind::Failed
                    && rest.trim_start().starts_with("turn timed out")
                {
                    TurnOutcomeKind::TimedOut
                } else {
                    kind
                };
                return (kind, detail(rest));
            }
        }
        (TurnOutcomeKind::Other, detail(text))
    }
}

impl fmt::Display for TurnOutcomeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_old_free_text_maps_to_a_kind() {
        for k in TurnOutcomeKind::ALL {
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            assert_eq!(serde_json::from_str::<TurnOutcomeKind>(&json).unwrap(), k);
            if k != TurnOutcomeKind::Other {
                assert_eq!(TurnOutcomeKind::from_stored(k.as_str()), (k, None));
            }
        }
        let d = |s: &str| Some(s.to_string());
        let cases = [
            (
                "rate limited (resets at 1795323782)",
                TurnOutcomeKind::RateLimited,
                d("resets at 1795323782"),
            ),
            ("rate limited", TurnOutcomeKind::RateLimited, None),
            ("authentication failed", TurnOutcomeKind::AuthFailed, None),
            ("prompt is too long", TurnOutcomeKind::PromptTooLong, None),
            (
                "API unavailable: Overloaded",
                TurnOutcomeKind::ApiUnavailable,
                d("Overloaded"),
            ),
            (
                "interrupted: turn interrupted during execution",
                TurnOutcomeKind::Interrupted,
                d("turn interrupted during execution"),
            ),
            (
                "failed: claude exited with code 1 without a result line",
                TurnOutcomeKind::Failed,
                d("claude exited with code 1 without a result line"),
            ),
            (
                "failed: turn timed out after 3600s",
                TurnOutcomeKind::TimedOut,
                d("turn timed out after 3600s"),
            ),
            (
                "not started: cannot run claude",
                TurnOutcomeKind::NotStarted,
                d("cannot run claude"),
            ),
            ("something new", TurnOutcomeKind::Other, d("something new")),
        ];
        for (text, kind, detail) in cases {
            assert_eq!(TurnOutcomeKind::from_stored(text), (kind, detail), "{text}");
        }
        assert_eq!(
            serde_json::from_str::<TurnOutcomeKind>("\"usage_limit\"").unwrap(),
            TurnOutcomeKind::Other
        );
    }
}
