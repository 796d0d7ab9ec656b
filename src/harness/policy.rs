//! The turn loop's outcome policy: one pure function, [`decide`], from what a
//! claude run came to (a [`TurnOutcomeKind`], the one outcome vocabulary), what was running ([`Running`]) and a few
//! facts about the message and the session ([`Facts`]) to what the loop does
//! next ([`Decision`]). Nothing here does I/O or knows about time; the loop
//! carries decisions out (acks, requeues, pauses, notices) and owns every
//! counter it passes in. `docs/turn-loop.md` carries [`table`]'s rendering,
//! and a test checks that the two agree.
//!
//! Four decisions ack a message and no others do: a completed turn, an
//! operator interrupt, a dead letter and a turn stopped at its `turn_usd`
//! cap (running it again would pay again). Everything else keeps the message.
//! Only failures tied to the message count toward the attempt limit; rate and
//! usage limits, pauses, login parks, interrupts, shutdowns and faults of the
//! harness itself never do.

use crate::proto::{PauseReason, Place, TurnOutcomeKind};
use std::fmt;

/// Every outcome, in table order: the one vocabulary's.
pub const OUTCOMES: [TurnOutcomeKind; 17] = TurnOutcomeKind::ALL;

/// The outcome's name in the documentation table.
pub fn outcome_name(o: TurnOutcomeKind) -> String {
    format!("{o:?}")
}

/// What the run was for: the phase of the loop the outcome ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Running {
    /// A turn for a message or a requested continue.
    Turn,
    /// `/compact` because the message's turn was too long.
    ReactiveCompact,
    /// The notes turn before an automatic session reset, ahead of a message.
    ResetCheckpoint,
    /// The notes turn after a clean turn past the watermark (the message is
    /// acked already).
    ProactiveCheckpoint,
    /// `/compact` after that notes turn.
    ProactiveCompact,
    /// `/compact` the operator asked for.
    OperatorCompact,
}

/// Every phase, in table order.
pub const RUNNING: [Running; 6] = [
    Running::Turn,
    Running::ReactiveCompact,
    Running::ResetCheckpoint,
    Running::ProactiveCheckpoint,
    Running::ProactiveCompact,
    Running::OperatorCompact,
];

impl Running {
    /// True when a message (or a continue) is at stake: its outcome can keep,
    /// ack or dead-letter it. The others are best effort.
    pub fn for_work(self) -> bool {
        matches!(
            self,
            Running::Turn | Running::ReactiveCompact | Running::ResetCheckpoint
        )
    }

    /// Runs `/compact` rather than a prompt.
    pub fn is_compaction(self) -> bool {
        matches!(
            self,
            Running::ReactiveCompact | Running::ProactiveCompact | Running::OperatorCompact
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Running::Turn => "turn",
            Running::ReactiveCompact => "reactive `/compact`",
            Running::ResetCheckpoint => "reset checkpoint",
            Running::ProactiveCheckpoint => "proactive checkpoint",
            Running::ProactiveCompact => "proactive `/compact`",
            Running::OperatorCompact => "operator `/compact`",
        }
    }
}

/// What the loop knows about the message and the session when a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Facts {
    /// Failures of this message counted so far (before this one): the
    /// broker's count of its hand-outs before this one (every hand-out counts
    /// unless the harness gave it back), so it survives a harness restart.
    pub attempts: u32,
    /// `HIVE_TURN_MAX_ATTEMPTS`.
    pub max_attempts: u32,
    /// The run resumed the session (`--continue`); false for a fresh session.
    pub resumed: bool,
    /// A `/compact` for this message succeeded in the current session.
    pub compacted: bool,
    /// The one at-once retry after a refused credential was made already.
    pub auth_retried: bool,
    /// Another turn completed since this message last failed: an
    /// API-unavailable failure is then the message's, not an outage's.
    pub succeeded_since_failure: bool,
}

impl Default for Facts {
    /// The first try of a message in a resumed session.
    fn default() -> Facts {
        Facts {
            attempts: 0,
            max_attempts: 5,
            resumed: true,
            compacted: false,
            auth_retried: false,
            succeeded_since_failure: false,
        }
    }
}

/// How long a kept message waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// `HIVE_POLL_MS`, against tight loops.
    Brief,
    /// A pause (or the login park) for a reason shown on the page.
    For(PauseReason),
}

/// Where a kept message starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// With its turn (after the auto-reset check).
    Turn,
    /// With `/compact`, then its turn: its session was too long.
    CompactThenTurn,
}

/// What the loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Ack: the turn completed. (Ack 1 of 3.)
    Complete,
    /// Ack with a note: the operator interrupted it. (Ack 2 of 3.)
    AckInterrupted,
    /// Give up on it: it failed `HIVE_TURN_MAX_ATTEMPTS` times for reasons of
    /// its own. (Ack 3 of 4, in stage 1; the broker keeps it in stage 2.)
    DeadLetter,
    /// Ack with one notice to the parent naming the cap and the cost: the
    /// run reached its `turn_usd` (`--max-budget-usd`); a retry would pay
    /// again, so it is never requeued. (Ack 4 of 4.)
    AckTurnBudget,
    /// Go on with the next step: the turn after a reactive `/compact` or a
    /// reset checkpoint, `/compact` after a proactive checkpoint.
    Proceed,
    /// A best-effort run ended; nothing is at stake, the loop goes on.
    GoOn,
    /// The same turn once more, at once (a first refused credential).
    RetryNow,
    /// `/compact`, then the turn again with the whole message.
    CompactThenRetry,
    /// Drop the session: the turn again in a fresh one, with the whole
    /// message; the parent is told in one line.
    FreshSessionThenRetry,
    /// Keep the message (requeue it), wait, then start it again.
    Keep {
        wait: Wait,
        /// This failure counts toward the attempt limit.
        counted: bool,
        /// Where it goes back: behind the mail of other senders when the
        /// failure may be its own (counted, or an API failure that counts once
        /// other turns succeed), so it cannot hold up the inbox; at the head
        /// for a pause.
        place: Place,
        then: Resume,
    },
}

impl Decision {
    /// True for the four decisions that ack.
    pub fn acks(&self) -> bool {
        matches!(
            self,
            Decision::Complete
                | Decision::AckInterrupted
                | Decision::DeadLetter
                | Decision::AckTurnBudget
        )
    }
}

/// The policy. See the module docs and `docs/turn-loop.md`.
pub fn decide(outcome: TurnOutcomeKind, running: Running, f: &Facts) -> Decision {
    use Running as R;
    use TurnOutcomeKind as O;
    if !running.for_work() {
        return best_effort(outcome, running);
    }
    let then = if running == R::ReactiveCompact {
        Resume::CompactThenTurn
    } else {
        Resume::Turn
    };
    let keep = |wait: Wait, counted: bool| {
        if counted && f.attempts.saturating_add(1) >= f.max_attempts.max(1) {
            Decision::DeadLetter
        } else {
            // An API failure may be the message's own: behind, so that other
            // turns can succeed meanwhile and the outage rule can tell.
            let suspect = counted || wait == Wait::For(PauseReason::ApiBackoff);
            Decision::Keep {
                wait,
                counted,
                place: if suspect { Place::Behind } else { Place::Head },
                then,
            }
        }
    };
    match outcome {
        O::Ok | O::Compacted if running == R::Turn => Decision::Complete,
        O::Ok | O::Compacted => Decision::Proceed,
        O::Interrupted => Decision::AckInterrupted,
        // The notes turn stopped at its cap is a note; the turn goes on.
        O::TurnBudget if running == R::ResetCheckpoint => Decision::Proceed,
        // It paid its cap once: a retry would pay again.
        O::TurnBudget => Decision::AckTurnBudget,
        O::RateLimited => keep(Wait::For(PauseReason::RateLimit), false),
        O::AuthFailed if !f.auth_retried => Decision::RetryNow,
        O::AuthFailed => keep(Wait::For(PauseReason::Login), false),
        // During an outage everything fails and nothing is dead-lettered; a
        // message that fails while others succeed is at fault.
        O::ApiUnavailable => keep(
            Wait::For(PauseReason::ApiBackoff),
            f.succeeded_since_failure,
        ),
        O::NotStarted => keep(Wait::For(PauseReason::StartFailed), false),
        O::Stopped => keep(Wait::Brief, false),
        O::McpStartFailed => keep(Wait::For(PauseReason::McpStart), false),
        O::PromptTooLong | O::CannotCompact => match running {
            // The message alone does not fit a fresh session.
            R::Turn if !f.resumed => keep(Wait::Brief, true),
            R::Turn if f.compacted || outcome == O::CannotCompact => {
                Decision::FreshSessionThenRetry
            }
            R::Turn => Decision::CompactThenRetry,
            R::ReactiveCompact => Decision::FreshSessionThenRetry,
            // The reset drops the session anyway.
            _ => Decision::Proceed,
        },
        O::Hung | O::TimedOut => keep(Wait::Brief, true),
        // A failed notes turn is a note; the reset and the turn go on. (The
        // classifier never says `Other`: it is a crash here.)
        O::Aborted | O::Failed | O::Other if running == R::ResetCheckpoint => Decision::Proceed,
        O::Aborted | O::Failed | O::Other => keep(Wait::Brief, true),
    }
}

/// Runs with no message at stake: a failure is a note. A proactive checkpoint
/// is followed by `/compact` unless the API or the harness is what failed.
fn best_effort(outcome: TurnOutcomeKind, running: Running) -> Decision {
    use TurnOutcomeKind as O;
    if running != Running::ProactiveCheckpoint {
        return Decision::GoOn;
    }
    match outcome {
        O::Ok
        | O::Compacted
        | O::PromptTooLong
        | O::CannotCompact
        | O::Aborted
        | O::Failed
        | O::Other
        | O::TimedOut
        | O::Hung
        | O::TurnBudget => Decision::Proceed,
        O::RateLimited
        | O::AuthFailed
        | O::ApiUnavailable
        | O::Interrupted
        | O::NotStarted
        | O::McpStartFailed
        | O::Stopped => Decision::GoOn,
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Wait::Brief => f.write_str("brief pause"),
            Wait::For(PauseReason::Login) => f.write_str("park for login"),
            Wait::For(r) => write!(f, "pause `{r}`"),
        }
    }
}

/// The decision as the documentation table words it; `running` names what a
/// [`Decision::Proceed`] goes on to.
pub fn describe(d: &Decision, running: Running) -> String {
    match d {
        Decision::Complete => "ack".into(),
        Decision::AckInterrupted => "ack with a note".into(),
        Decision::DeadLetter => "dead-letter".into(),
        Decision::AckTurnBudget => "ack; tell parent".into(),
        Decision::Proceed => match running {
            Running::ProactiveCheckpoint => "go on: `/compact`".into(),
            Running::ResetCheckpoint => "go on: the turn, fresh".into(),
            _ => "go on: the turn, whole".into(),
        },
        Decision::GoOn => "note".into(),
        Decision::RetryNow => "retry at once".into(),
        Decision::CompactThenRetry => "`/compact`, retry".into(),
        Decision::FreshSessionThenRetry => "fresh session, retry whole; tell parent".into(),
        Decision::Keep {
            wait,
            counted,
            place,
            then,
        } => {
            let mut s = String::from("keep");
            if *place == Place::Behind {
                s.push_str(" behind");
            }
            if *counted {
                s.push_str(", counted");
            }
            s.push_str(&format!("; {wait}"));
            if *then == Resume::CompactThenTurn {
                s.push_str("; `/compact` again");
            }
            s
        }
    }
}

/// The fact sets the table shows besides the first try: a label and the facts.
pub fn table_variants(max_attempts: u32) -> Vec<(&'static str, Facts)> {
    let base = Facts {
        max_attempts,
        ..Facts::default()
    };
    let at_limit = Facts {
        attempts: max_attempts.saturating_sub(1),
        ..base
    };
    vec![
        ("at the limit", at_limit),
        (
            "fresh session",
            Facts {
                resumed: false,
                ..base
            },
        ),
        (
            "fresh, at the limit",
            Facts {
                resumed: false,
                ..at_limit
            },
        ),
        (
            "compacted for it",
            Facts {
                compacted: true,
                ..base
            },
        ),
        (
            "retried at once",
            Facts {
                auth_retried: true,
                ..base
            },
        ),
        (
            "others succeeded",
            Facts {
                succeeded_since_failure: true,
                ..base
            },
        ),
        (
            "others succeeded, at the limit",
            Facts {
                succeeded_since_failure: true,
                ..at_limit
            },
        ),
    ]
}

/// The policy as a markdown table: one row per outcome, one column per
/// phase; each cell is the decision for a first try in a resumed session,
/// then, for each other decision the listed fact sets lead to, the first fact
/// set that leads there.
pub fn table() -> String {
    let base = Facts::default();
    let variants = table_variants(base.max_attempts);
    let mut out = String::from("| outcome |");
    for r in RUNNING {
        out.push_str(&format!(" {} |", r.name()));
    }
    out.push_str("\n|---|");
    for _ in RUNNING {
        out.push_str("---|");
    }
    out.push('\n');
    for o in OUTCOMES {
        out.push_str(&format!("| {} |", outcome_name(o)));
        for r in RUNNING {
            let first = decide(o, r, &base);
            let mut cell = describe(&first, r);
            let mut seen = vec![first];
            for (label, facts) in &variants {
                let d = decide(o, r, facts);
                if !seen.contains(&d) {
                    cell.push_str(&format!("; *{label}:* {}", describe(&d, r)));
                    seen.push(d);
                }
            }
            out.push_str(&format!(" {cell} |"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::TurnOutcomeKind as Outcome;

    /// Every fact combination the policy can see, with a limit of 3.
    fn all_facts() -> Vec<Facts> {
        let mut out = Vec::new();
        for attempts in 0..3 {
            for bits in 0..16u8 {
                out.push(Facts {
                    attempts,
                    max_attempts: 3,
                    resumed: bits & 1 != 0,
                    compacted: bits & 2 != 0,
                    auth_retried: bits & 4 != 0,
                    succeeded_since_failure: bits & 8 != 0,
                });
            }
        }
        out
    }

    #[test]
    fn every_outcome_and_phase_on_a_first_try() {
        use Decision as D;
        use PauseReason as P;
        use Resume::*;
        use Wait::*;
        let keep = |wait: Wait, counted, then| D::Keep {
            place: if counted || wait == For(P::ApiBackoff) {
                Place::Behind
            } else {
                Place::Head
            },
            wait,
            counted,
            then,
        };
        // The literal table: (outcome, [turn, reactive compact, reset
        // checkpoint, proactive checkpoint, proactive compact, operator compact]).
        let want: [(Outcome, [Decision; 6]); 17] = [
            (
                Outcome::Ok,
                [
                    D::Complete,
                    D::Proceed,
                    D::Proceed,
                    D::Proceed,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::Compacted,
                [
                    D::Complete,
                    D::Proceed,
                    D::Proceed,
                    D::Proceed,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::RateLimited,
                [
                    keep(For(P::RateLimit), false, Turn),
                    keep(For(P::RateLimit), false, CompactThenTurn),
                    keep(For(P::RateLimit), false, Turn),
                    D::GoOn,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::AuthFailed,
                [
                    D::RetryNow,
                    D::RetryNow,
                    D::RetryNow,
                    D::GoOn,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::PromptTooLong,
                [
                    D::CompactThenRetry,
                    D::FreshSessionThenRetry,
                    D::Proceed,
                    D::Proceed,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::ApiUnavailable,
                [
                    keep(For(P::ApiBackoff), false, Turn),
                    keep(For(P::ApiBackoff), false, CompactThenTurn),
                    keep(For(P::ApiBackoff), false, Turn),
                    D::GoOn,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::CannotCompact,
                [
                    D::FreshSessionThenRetry,
                    D::FreshSessionThenRetry,
                    D::Proceed,
                    D::Proceed,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::Aborted,
                [
                    keep(Brief, true, Turn),
                    keep(Brief, true, CompactThenTurn),
                    D::Proceed,
                    D::Proceed,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::Interrupted,
                [
                    D::AckInterrupted,
                    D::AckInterrupted,
                    D::AckInterrupted,
                    D::GoOn,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::Failed,
                [
                    keep(Brief, true, Turn),
                    keep(Brief, true, CompactThenTurn),
                    D::Proceed,
                    D::Proceed,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::TimedOut,
                [
                    keep(Brief, true, Turn),
                    keep(Brief, true, CompactThenTurn),
                    keep(Brief, true, Turn),
                    D::Proceed,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::Hung,
                [
                    keep(Brief, true, Turn),
                    keep(Brief, true, CompactThenTurn),
                    keep(Brief, true, Turn),
                    D::Proceed,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::NotStarted,
                [
                    keep(For(P::StartFailed), false, Turn),
                    keep(For(P::StartFailed), false, CompactThenTurn),
                    keep(For(P::StartFailed), false, Turn),
                    D::GoOn,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::McpStartFailed,
                [
                    keep(For(P::McpStart), false, Turn),
                    keep(For(P::McpStart), false, CompactThenTurn),
                    keep(For(P::McpStart), false, Turn),
                    D::GoOn,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::TurnBudget,
                [
                    D::AckTurnBudget,
                    D::AckTurnBudget,
                    D::Proceed,
                    D::Proceed,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::Stopped,
                [
                    keep(Brief, false, Turn),
                    keep(Brief, false, CompactThenTurn),
                    keep(Brief, false, Turn),
                    D::GoOn,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
            (
                Outcome::Other,
                [
                    keep(Brief, true, Turn),
                    keep(Brief, true, CompactThenTurn),
                    D::Proceed,
                    D::Proceed,
                    D::GoOn,
                    D::GoOn,
                ],
            ),
        ];
        assert_eq!(
            want.iter().map(|(o, _)| *o).collect::<Vec<_>>(),
            OUTCOMES,
            "the literal table covers every outcome in order"
        );
        let base = Facts::default();
        for (o, row) in want {
            for (r, d) in RUNNING.iter().zip(row) {
                assert_eq!(decide(o, *r, &base), d, "{o:?} during {r:?}");
            }
        }
    }

    #[test]
    fn only_the_four_ack_decisions_ack_and_only_where_they_belong() {
        for f in all_facts() {
            for o in OUTCOMES {
                for r in RUNNING {
                    let d = decide(o, r, &f);
                    let why = format!("{o:?} during {r:?} with {f:?}: {d:?}");
                    if !d.acks() {
                        continue;
                    }
                    assert!(r.for_work(), "a best-effort run never acks: {why}");
                    match d {
                        Decision::Complete => {
                            assert!(o.is_ok() && r == Running::Turn, "{why}")
                        }
                        Decision::AckInterrupted => assert_eq!(o, Outcome::Interrupted, "{why}"),
                        Decision::DeadLetter => {
                            assert_eq!(f.attempts + 1, f.max_attempts, "only at the limit: {why}")
                        }
                        Decision::AckTurnBudget => assert_eq!(o, Outcome::TurnBudget, "{why}"),
                        _ => unreachable!(),
                    }
                }
            }
        }
    }

    #[test]
    fn limits_pauses_parks_interrupts_and_harness_faults_never_count() {
        let never_counted = [
            Outcome::RateLimited,
            Outcome::AuthFailed,
            Outcome::Interrupted,
            Outcome::NotStarted,
            Outcome::McpStartFailed,
            Outcome::Ok,
            Outcome::Compacted,
            Outcome::Stopped,
        ];
        for f in all_facts() {
            for o in OUTCOMES {
                for r in RUNNING {
                    let d = decide(o, r, &f);
                    let counted = matches!(d, Decision::Keep { counted: true, .. })
                        || d == Decision::DeadLetter;
                    if never_counted.contains(&o) {
                        assert!(!counted, "{o:?} during {r:?} with {f:?}: {d:?}");
                    }
                    if o == Outcome::ApiUnavailable && !f.succeeded_since_failure {
                        assert!(!counted, "an outage dead-letters nothing: {f:?} {d:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn failures_that_may_be_the_messages_own_go_behind_and_pauses_keep_the_order() {
        for f in all_facts() {
            for o in OUTCOMES {
                for r in RUNNING {
                    if let Decision::Keep {
                        wait,
                        counted,
                        place,
                        ..
                    } = decide(o, r, &f)
                    {
                        let why = format!("{o:?} during {r:?} with {f:?}");
                        match (counted, wait) {
                            (true, _) | (false, Wait::For(PauseReason::ApiBackoff)) => {
                                assert_eq!(place, Place::Behind, "{why}")
                            }
                            _ => assert_eq!(place, Place::Head, "{why}"),
                        }
                    }
                }
            }
        }
        let rate = decide(Outcome::RateLimited, Running::Turn, &Facts::default());
        assert!(matches!(
            rate,
            Decision::Keep {
                place: Place::Head,
                ..
            }
        ));
        let crash = decide(Outcome::Failed, Running::Turn, &Facts::default());
        assert!(matches!(
            crash,
            Decision::Keep {
                place: Place::Behind,
                counted: true,
                ..
            }
        ));
    }

    #[test]
    fn a_run_at_its_turn_budget_is_never_requeued_nor_counted() {
        for f in all_facts() {
            for r in RUNNING {
                let d = decide(Outcome::TurnBudget, r, &f);
                let why = format!("during {r:?} with {f:?}: {d:?}");
                assert!(!matches!(d, Decision::Keep { .. }), "never kept: {why}");
                assert!(
                    !matches!(
                        d,
                        Decision::RetryNow
                            | Decision::CompactThenRetry
                            | Decision::FreshSessionThenRetry
                            | Decision::DeadLetter
                    ),
                    "never retried nor counted: {why}"
                );
                if matches!(r, Running::Turn | Running::ReactiveCompact) {
                    assert_eq!(d, Decision::AckTurnBudget, "{why}");
                }
            }
        }
    }

    #[test]
    fn prompt_too_long_never_acks_but_by_dead_letter_in_a_fresh_session() {
        for f in all_facts() {
            for r in RUNNING {
                let d = decide(Outcome::PromptTooLong, r, &f);
                if d.acks() {
                    assert_eq!(d, Decision::DeadLetter);
                    assert!(r == Running::Turn && !f.resumed, "{r:?} {f:?}");
                }
            }
        }
        // Resumed: compact first; still too long after a compaction: a fresh
        // session; too long in a fresh session: the message's own failure.
        let f = Facts::default();
        let turn = |f: &Facts| decide(Outcome::PromptTooLong, Running::Turn, f);
        assert_eq!(turn(&f), Decision::CompactThenRetry);
        assert_eq!(
            turn(&Facts {
                compacted: true,
                ..f
            }),
            Decision::FreshSessionThenRetry
        );
        assert!(matches!(
            turn(&Facts {
                resumed: false,
                ..f
            }),
            Decision::Keep { counted: true, .. }
        ));
    }

    #[test]
    fn transient_compaction_failures_keep_the_message_and_compact_again() {
        for o in [
            Outcome::RateLimited,
            Outcome::ApiUnavailable,
            Outcome::NotStarted,
            Outcome::Hung,
            Outcome::TimedOut,
        ] {
            let d = decide(
                o,
                Running::ReactiveCompact,
                &Facts {
                    auth_retried: true,
                    ..Facts::default()
                },
            );
            assert!(
                matches!(
                    d,
                    Decision::Keep {
                        then: Resume::CompactThenTurn,
                        ..
                    }
                ),
                "{o:?}: {d:?}"
            );
        }
        let park = decide(
            Outcome::AuthFailed,
            Running::ReactiveCompact,
            &Facts {
                auth_retried: true,
                ..Facts::default()
            },
        );
        assert_eq!(
            park,
            Decision::Keep {
                wait: Wait::For(PauseReason::Login),
                counted: false,
                place: Place::Head,
                then: Resume::CompactThenTurn
            }
        );
    }

    #[test]
    fn the_documented_table_is_the_codes() {
        let doc = include_str!("../../docs/turn-loop.md");
        let table = table();
        assert!(
            doc.contains(&table),
            "docs/turn-loop.md does not carry the policy table; paste this:\n\n{table}"
        );
    }
}
