//! The one vocabulary of turn outcomes: what one claude process came to, as
//! the turn loop's policy decides on it, the turn-stats db stores it,
//! `/metrics` labels it and the page shows it. The harness's classifier
//! produces richer values (a reset time, the CLI's error text); those details
//! go into the row's note, never into the kind, so the set of labels stays
//! small whatever claude prints. Two kinds the policy tells apart share the
//! stored name of another ([`TurnOutcomeKind::Aborted`] is stored as
//! `interrupted`, [`TurnOutcomeKind::CannotCompact`] as `prompt_too_long`):
//! the stored names are frozen (a rename needs a migration of turn-stats.db
//! and a line in `docs/turn-loop.md`), and a test pins the whole table. Older
//! releases stored the free text itself; [`TurnOutcomeKind::from_stored`]
//! reads both.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What one claude process (a turn, a checkpoint, a compaction) came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TurnOutcomeKind {
    /// A successful `result`.
    Ok,
    /// The session was compacted (a `/compact` run, or the CLI on its own).
    Compacted,
    /// The operator interrupted the run.
    Interrupted,
    /// The CLI aborted the turn on its own (`aborted_tools`,
    /// `error_during_execution`); stored as `interrupted`.
    Aborted,
    /// `/compact` ran but could not shrink the session; stored as
    /// `prompt_too_long`.
    CannotCompact,
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
    /// The harness stopped during the run, or claude was shut down by a
    /// signal the harness did not send (`interrupted_by_shutdown`).
    Stopped,
    /// Anything else: a crash, an error result nothing above explains.
    Failed,
    /// A stored value this release does not know (written by a newer one).
    Other,
}

impl TurnOutcomeKind {
    /// Every kind, in the order of the turn loop's policy table.
    pub const ALL: [TurnOutcomeKind; 17] = [
        TurnOutcomeKind::Ok,
        TurnOutcomeKind::Compacted,
        TurnOutcomeKind::RateLimited,
        TurnOutcomeKind::AuthFailed,
        TurnOutcomeKind::PromptTooLong,
        TurnOutcomeKind::ApiUnavailable,
        TurnOutcomeKind::CannotCompact,
        TurnOutcomeKind::Aborted,
        TurnOutcomeKind::Interrupted,
        TurnOutcomeKind::Failed,
        TurnOutcomeKind::TimedOut,
        TurnOutcomeKind::Hung,
        TurnOutcomeKind::NotStarted,
        TurnOutcomeKind::McpStartFailed,
        TurnOutcomeKind::TurnBudget,
        TurnOutcomeKind::Stopped,
        TurnOutcomeKind::Other,
    ];

    /// The kind a stored name reads as: not `Other`, and not the two kinds
    /// stored under another's name.
    fn of_name(text: &str) -> Option<TurnOutcomeKind> {
        TurnOutcomeKind::ALL.into_iter().find(|k| {
            k.as_str() == text
                && !matches!(
                    k,
                    TurnOutcomeKind::Other
                        | TurnOutcomeKind::Aborted
                        | TurnOutcomeKind::CannotCompact
                )
        })
    }

    /// The stored and exported name (turn-stats.db, `/metrics`, the page's
    /// history): frozen, see the module docs.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnOutcomeKind::Ok => "ok",
            TurnOutcomeKind::Compacted => "compacted",
            TurnOutcomeKind::Interrupted | TurnOutcomeKind::Aborted => "interrupted",
            TurnOutcomeKind::CannotCompact => "prompt_too_long",
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
    /// as this release stores it (a name two kinds share reads as the one
    /// that owns it: `interrupted`, `prompt_too_long`), or the free text older releases stored
    /// (`rate limited (resets at 1795323782)`, `failed: claude exited with
    /// code 1 …`), whose detail then belongs in the note. Text that matches
    /// nothing is [`TurnOutcomeKind::Other`] with the whole text as detail.
    pub fn from_stored(text: &str) -> (TurnOutcomeKind, Option<String>) {
        if let Some(k) = TurnOutcomeKind::of_name(text) {
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

/// As its stored name.
impl Serialize for TurnOutcomeKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A stored name; one this release does not know is [`TurnOutcomeKind::Other`].
impl<'de> Deserialize<'de> for TurnOutcomeKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<TurnOutcomeKind, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(TurnOutcomeKind::of_name(&text).unwrap_or(TurnOutcomeKind::Other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stored names are frozen: turn-stats.db rows, `/metrics` labels
    /// and the page's history carry them. A change here needs a migration
    /// and a line in `docs/turn-loop.md`.
    #[test]
    fn the_stored_names_are_pinned() {
        use TurnOutcomeKind as K;
        let table = [
            (K::Ok, "ok"),
            (K::Compacted, "compacted"),
            (K::RateLimited, "rate_limited"),
            (K::AuthFailed, "auth_failed"),
            (K::PromptTooLong, "prompt_too_long"),
            (K::ApiUnavailable, "api_unavailable"),
            (K::CannotCompact, "prompt_too_long"),
            (K::Aborted, "interrupted"),
            (K::Interrupted, "interrupted"),
            (K::Failed, "failed"),
            (K::TimedOut, "timed_out"),
            (K::Hung, "hung"),
            (K::NotStarted, "not_started"),
            (K::McpStartFailed, "mcp_start_failed"),
            (K::TurnBudget, "turn_budget"),
            (K::Stopped, "stopped"),
            (K::Other, "other"),
        ];
        assert_eq!(table.map(|(k, _)| k), K::ALL, "every kind, in order");
        for (k, name) in table {
            assert_eq!(k.as_str(), name, "{k:?}");
            assert_eq!(serde_json::to_string(&k).unwrap(), format!("\"{name}\""));
        }
    }

    #[test]
    fn names_round_trip_and_old_free_text_maps_to_a_kind() {
        for k in TurnOutcomeKind::ALL {
            let json = serde_json::to_string(&k).unwrap();
            assert_eq!(json, format!("\"{}\"", k.as_str()));
            // The two kinds stored under another's name read as that one.
            let canonical = match k {
                TurnOutcomeKind::Aborted => TurnOutcomeKind::Interrupted,
                TurnOutcomeKind::CannotCompact => TurnOutcomeKind::PromptTooLong,
                k => k,
            };
            assert_eq!(
                serde_json::from_str::<TurnOutcomeKind>(&json).unwrap(),
                canonical
            );
            if k != TurnOutcomeKind::Other {
                assert_eq!(TurnOutcomeKind::from_stored(k.as_str()), (canonical, None));
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
