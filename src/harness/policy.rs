//! The turn loop's outcome policy: one pure function, [`decide`], from what a
//! claude run came to (a [`TurnOutcomeKind`], the one outcome vocabulary),
//! what was running ([`Running`]) and a few facts about the message and the
//! session ([`Facts`]) to what the loop does next ([`Decision`]); and
//! [`plan`], which turns that decision into the whole [`Plan`] for the run's
//! end: how the work is settled (ack, requeue, dead letter), the pause (its
//! length and reason), the parent notices, the usage limit the broker is
//! told of, the page's words, and what runs next. Nothing here does I/O or
//! reads a clock; the loop passes every fact and figure in ([`End`]) and
//! carries the plan out. `docs/turn-loop.md` carries [`table`]'s rendering,
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
use std::time::Duration;

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
            // The reset drops the session anyway (the others are best
            // effort and never get here).
            R::ResetCheckpoint
            | R::ProactiveCheckpoint
            | R::ProactiveCompact
            | R::OperatorCompact => Decision::Proceed,
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

/// MCP start failures in a row after which the loop backs off and tells the
/// parent.
pub const MCP_FAILURES_BEFORE_BACKOFF: u32 = 3;

/// Why a message is acked. Only these three, and the dead letter, let one go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// The turn completed.
    Completed,
    /// The operator interrupted it; the note says so.
    Interrupted,
    /// The run reached its `turn_usd` cap; a retry would pay again.
    TurnBudget,
}

/// The best-effort runs after a clean turn past the watermark, in order:
/// the checkpoint turn, then `/compact`. Each waits for a `recv_next`
/// answer asked after the run before it, and for the end of the broker's
/// pause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proactive {
    Checkpoint,
    Compact,
}

impl Proactive {
    pub fn what(self) -> &'static str {
        match self {
            Proactive::Checkpoint => "the checkpoint turn",
            Proactive::Compact => "the compaction after the checkpoint",
        }
    }
}

/// Counters of failures in a row, for backoffs and one notice per burst.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Streaks {
    pub api: u32,
    pub start: u32,
    pub mcp: u32,
}

impl Streaks {
    /// One more failure in a row of those `reason` backs off for: their
    /// count now (0 for a reason with no streak).
    fn bump(&mut self, reason: &PauseReason) -> u32 {
        let streak = match reason {
            PauseReason::ApiBackoff => &mut self.api,
            PauseReason::StartFailed => &mut self.start,
            PauseReason::McpStart => &mut self.mcp,
            PauseReason::RateLimit
            | PauseReason::UsageLimit
            | PauseReason::Budget
            | PauseReason::Login
            | PauseReason::Other(_) => return 0,
        };
        *streak += 1;
        *streak
    }
}

/// The waits and thresholds of the settings a plan's pause is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waits {
    /// `HIVE_POLL_MS`: the brief pause, and where the start backoffs begin.
    pub brief: Duration,
    /// `HIVE_RATE_LIMIT_SLEEP_SECS`: a rate limit without a reset time.
    pub rate_limit: Duration,
    /// `HIVE_RATE_LIMIT_MAX_SLEEP_SECS`.
    pub rate_limit_max: Duration,
    pub api_backoff_base: Duration,
    pub api_backoff_max: Duration,
    /// API failures in a row before the parent is told, once.
    pub api_failures_before_notice: u32,
    /// `HIVE_START_BACKOFF_MAX_MS`.
    pub start_backoff_max: Duration,
}

/// Everything [`plan`] needs of a run's end: what [`decide`] takes, and
/// the words and figures of the notices and the pause.
#[derive(Debug, Clone)]
pub struct End<'a> {
    pub outcome: TurnOutcomeKind,
    pub running: Running,
    pub facts: Facts,
    /// A message (or a continue) is in hand.
    pub has_work: bool,
    /// The agent's label, for the parent's notices.
    pub label: String,
    /// The work, in words ("message #12 from operator"); empty without one.
    pub what: String,
    /// The outcome as the page words it.
    pub text: &'a str,
    /// The note of the rule that a finished turn is never run again.
    pub said: Option<&'a str>,
    /// The classifier's detail (the CLI's words for a turn budget).
    pub detail: String,
    /// The `result` line's text.
    pub result_text: &'a str,
    /// When the rate limit resets, if the CLI said.
    pub resets_at: Option<i64>,
    pub cost_usd: Option<f64>,
    pub turn_usd: Option<f64>,
    /// The context is at the proactive watermark after this run.
    pub past_watermark: bool,
    /// Unix seconds.
    pub now: i64,
    pub streaks: Streaks,
    pub waits: Waits,
}

/// How the work in hand is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle {
    /// It stays in hand: the next run is for it (or nothing is at stake).
    Hold,
    /// It stays in hand for the one at-once retry after a refused
    /// credential, marked as having had it.
    RetryAuth,
    /// Let go with an ack; the ledger forgets it.
    Ack(Ack),
    /// Given up on; the ledger forgets it. The error is the outcome's text.
    DeadLetter { notice: String },
    /// Kept: requeued (a continue is held in the harness), its ledger row
    /// updated; the error is kept as its last one when the failure counted.
    Requeue {
        counted: bool,
        place: Place,
        then: Resume,
    },
}

/// What the loop does once the work is settled.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// The loop is free: the next thing is asked for; with a proactive
    /// run, that run comes first.
    Advance(Option<Proactive>),
    /// The work's turn, once its reactive `/compact` succeeded (the ledger
    /// marks it compacted for and to start with the turn).
    TurnAfterCompact,
    /// The work's turn in a fresh session: the session is dropped (and the
    /// ledger starts it with the turn).
    FreshTurn,
    /// The same turn once more.
    Turn,
    /// A `/compact` for the work.
    Compact(Running, &'static str),
    /// The reset checkpoint once more.
    ResetCheckpoint,
    /// A pause of the loop's own, for a reason shown on the page (none for
    /// the brief pause).
    Pause {
        wait: Duration,
        reason: Option<PauseReason>,
        detail: String,
    },
    /// The login park.
    Login,
}

/// The usage limit the broker is told of (`report_usage_limit`): it parks
/// the agent's whole credential pool until then.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageLimit {
    pub until: i64,
    pub detail: String,
}

/// The page's end of the work's handling: the `TurnEnd` event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnEnd {
    pub ok: bool,
    pub note: String,
}

/// Everything a run's end comes to, carried out by the loop in this order:
/// the settlement, the usage limit report, the parent notices, the log
/// lines, the page's notes and turn end, then what runs next.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub decision: Decision,
    pub settle: Settle,
    /// A turn completed: the API-outage rule counts it.
    pub completed: bool,
    /// The failure streaks after this run.
    pub streaks: Streaks,
    pub usage_limit: Option<UsageLimit>,
    /// Messages to the parent (the operator for a root agent).
    pub notices: Vec<String>,
    pub logs: Vec<(log::Level, String)>,
    /// Notes on the page, before the turn end.
    pub notes: Vec<String>,
    pub end: Option<TurnEnd>,
    pub next: Next,
}

/// The whole plan for a run's end. Pure, like [`decide`]: the loop passes
/// every fact and figure in and carries the plan out.
pub fn plan(e: &End<'_>) -> Plan {
    let decision = if !e.has_work && e.running.for_work() {
        // Nothing is at stake (cannot happen: work phases run for a work).
        Decision::GoOn
    } else {
        decide(e.outcome, e.running, &e.facts)
    };
    let mut p = Plan {
        decision: decision.clone(),
        settle: Settle::Hold,
        completed: false,
        streaks: e.streaks,
        usage_limit: None,
        notices: Vec::new(),
        logs: Vec::new(),
        notes: Vec::new(),
        end: None,
        next: Next::Advance(None),
    };
    match decision {
        Decision::Complete
        | Decision::AckInterrupted
        | Decision::DeadLetter
        | Decision::AckTurnBudget => let_go(e, &mut p),
        Decision::Proceed
        | Decision::GoOn
        | Decision::RetryNow
        | Decision::CompactThenRetry
        | Decision::FreshSessionThenRetry => go_on(e, &mut p),
        Decision::Keep {
            wait,
            counted,
            place,
            then,
        } => {
            p.settle = Settle::Requeue {
                counted,
                place,
                then,
            };
            keep(e, wait, counted, &mut p);
        }
    }
    p
}

/// The plan of the four decisions that let the work go.
fn let_go(e: &End<'_>, p: &mut Plan) {
    let (what, text) = (e.what.as_str(), e.text);
    let end = |ok: bool, note: String| Some(TurnEnd { ok, note });
    match p.decision {
        Decision::Complete => {
            p.completed = true;
            p.streaks.api = 0;
            p.streaks.mcp = 0;
            p.settle = Settle::Ack(Ack::Completed);
            p.end = end(true, e.said.unwrap_or_default().to_string());
            // It waits for the broker's word first: this turn's spend may
            // have reached a budget.
            p.next = Next::Advance(e.past_watermark.then_some(Proactive::Checkpoint));
        }
        Decision::AckInterrupted => {
            p.settle = Settle::Ack(Ack::Interrupted);
            p.end = end(
                false,
                format!("{what} was interrupted by the operator; it will not be retried"),
            );
        }
        Decision::DeadLetter => {
            let n = e.facts.attempts + 1;
            p.settle = Settle::DeadLetter {
                notice: format!(
                    "[system] {}: {what} is dead-lettered after {n} failed attempts; last error: {text}",
                    e.label,
                ),
            };
            p.logs.push((
                log::Level::Warn,
                format!("{what} is dead-lettered after {n} failed attempts: {text}"),
            ));
            p.end = end(
                false,
                format!("{what} failed {n} times and is dead-lettered: {text}"),
            );
        }
        Decision::AckTurnBudget => {
            p.settle = Settle::Ack(Ack::TurnBudget);
            let cap = e
                .turn_usd
                .map_or_else(|| "its turn_usd".to_string(), |u| format!("turn_usd ${u}"));
            let cost = e
                .cost_usd
                .map_or_else(|| "an unknown cost".to_string(), |c| format!("${c:.4}"));
            let said = &e.detail;
            p.logs.push((
                log::Level::Warn,
                format!("{what} reached its turn budget ({cap}, {said}) at {cost}: acked"),
            ));
            p.notices.push(format!(
                "[system] {}: {what} stopped at its per-run budget ({cap}; claude said: {said}) after costing {cost}; it is acked and not run again (a retry would pay again)",
                e.label
            ));
            p.end = end(
                false,
                format!("{what} stopped at its per-run budget ({cap}) after costing {cost}; acked, not retried"),
            );
        }
        Decision::Proceed
        | Decision::GoOn
        | Decision::RetryNow
        | Decision::CompactThenRetry
        | Decision::FreshSessionThenRetry
        | Decision::Keep { .. } => {}
    }
}

/// The plan of the decisions that keep the work in hand and run on.
fn go_on(e: &End<'_>, p: &mut Plan) {
    let (what, text) = (e.what.as_str(), e.text);
    match p.decision {
        Decision::Proceed => {
            let checkpoint = matches!(
                e.running,
                Running::ResetCheckpoint | Running::ProactiveCheckpoint
            );
            if checkpoint && !e.outcome.is_ok() {
                p.notes
                    .push(format!("checkpoint turn failed ({text}); going on"));
            }
            p.next = match e.running {
                Running::ReactiveCompact => Next::TurnAfterCompact,
                Running::ResetCheckpoint => Next::FreshTurn,
                Running::ProactiveCheckpoint => Next::Advance(Some(Proactive::Compact)),
                Running::Turn | Running::ProactiveCompact | Running::OperatorCompact => {
                    Next::Advance(None)
                }
            };
        }
        Decision::GoOn => {
            if !e.outcome.is_ok() {
                p.notes
                    .push(format!("{} failed ({text}); going on", e.running.name()));
            }
        }
        Decision::RetryNow => {
            p.settle = Settle::RetryAuth;
            p.notes
                .push("authentication failed: retrying once at once".into());
            p.next = match e.running {
                Running::ReactiveCompact => {
                    Next::Compact(Running::ReactiveCompact, "retry after a refused credential")
                }
                Running::ResetCheckpoint => Next::ResetCheckpoint,
                Running::Turn
                | Running::ProactiveCheckpoint
                | Running::ProactiveCompact
                | Running::OperatorCompact => Next::Turn,
            };
        }
        Decision::CompactThenRetry => {
            p.notes
                .push("the session is past its context window: compacting, then retrying".into());
            p.next = Next::Compact(Running::ReactiveCompact, "prompt too long");
        }
        Decision::FreshSessionThenRetry => {
            p.notices.push(format!(
                "[system] {}: the session could not be compacted below the context window ({text}); it was dropped and {what} runs again in a fresh session",
                e.label
            ));
            p.notes.push(
                "the session cannot be compacted: starting a fresh one for this message".into(),
            );
            p.next = Next::FreshTurn;
        }
        Decision::Complete
        | Decision::AckInterrupted
        | Decision::DeadLetter
        | Decision::AckTurnBudget
        | Decision::Keep { .. } => {}
    }
}

/// The pause of a kept work: its length and reason, the notices and the
/// usage limit report that go with it, and the page's words.
fn keep(e: &End<'_>, wait: Wait, counted: bool, p: &mut Plan) {
    let (what, text, w) = (e.what.as_str(), e.text, &e.waits);
    let (pause, reason, detail) = match wait {
        Wait::Brief => (w.brief, None, String::new()),
        Wait::For(PauseReason::Login) => {
            p.end = Some(TurnEnd {
                ok: false,
                note: format!(
                    "authentication failed twice: {what} requeued until claude is logged in again"
                ),
            });
            p.next = Next::Login;
            return;
        }
        Wait::For(PauseReason::RateLimit | PauseReason::UsageLimit) => rate_limited(e, p),
        Wait::For(
            r @ (PauseReason::ApiBackoff | PauseReason::StartFailed | PauseReason::McpStart),
        ) => backing_off(e, p, r),
        // The broker's pauses: the policy never waits for them itself.
        Wait::For(r @ (PauseReason::Budget | PauseReason::Other(_))) => {
            (w.brief, Some(r), String::new())
        }
    };
    let note = if detail.is_empty() {
        let counts = if counted {
            ", counted toward the attempt limit"
        } else {
            ""
        };
        format!("{what} failed ({text}){counts}; retrying in {pause:?}")
    } else {
        format!("{detail}; resuming in {}s", pause.as_secs())
    };
    if what.is_empty() {
        p.notes.push(note);
    } else {
        p.end = Some(TurnEnd { ok: false, note });
    }
    p.next = Next::Pause {
        wait: pause,
        reason,
        detail,
    };
}

/// A pause's length, reason and words.
type Pause = (Duration, Option<PauseReason>, String);

/// A rate limit: until the CLI's reset (then the pool's usage limit, which
/// the broker is told of), or the configured sleep.
fn rate_limited(e: &End<'_>, p: &mut Plan) -> Pause {
    let (what, text, w) = (e.what.as_str(), e.text, &e.waits);
    let t = e.now;
    let sleep = match e.resets_at {
        Some(at) if at > t => Duration::from_secs((at - t) as u64),
        _ => w.rate_limit,
    }
    .min(w.rate_limit_max);
    match e.resets_at {
        // A usage limit with its reset: the broker parks the whole
        // pool.
        Some(at) if at > t => {
            let said = e.result_text;
            p.usage_limit = Some(UsageLimit {
                until: t + sleep.as_secs() as i64,
                detail: if said.is_empty() { text } else { said }.to_string(),
            });
            (
                sleep,
                Some(PauseReason::UsageLimit),
                format!("usage limit: {what} requeued"),
            )
        }
        _ => (
            sleep,
            Some(PauseReason::RateLimit),
            format!("rate limited: {what} requeued"),
        ),
    }
}

/// A backoff of the loop's own — the API, claude's start, the MCP servers —
/// for one more failure in a row: its length, the page's words, and the
/// parent notice and log lines once per burst.
fn backing_off(e: &End<'_>, p: &mut Plan, reason: PauseReason) -> Pause {
    let (what, text, label, w) = (e.what.as_str(), e.text, e.label.as_str(), &e.waits);
    let n = p.streaks.bump(&reason);
    let max = w.start_backoff_max;
    let (wait, detail) = match reason {
        PauseReason::ApiBackoff => {
            if n == w.api_failures_before_notice {
                p.notices.push(format!(
                    "[system] {label}: the Claude API has been unavailable for {n} turns in a row ({text}); {what} is kept and retried every {}s at most",
                    w.api_backoff_max.as_secs()
                ));
            }
            (
                backoff(w.api_backoff_base, w.api_backoff_max, n),
                format!("API unavailable ({text}): {what} requeued"),
            )
        }
        PauseReason::StartFailed => {
            // One log line and one parent notice per burst of failures.
            if n == 1 {
                p.logs.push((log::Level::Error, format!(
                    "claude could not be started: {text}; {what} requeued, retrying with a backoff up to {max:?}"
                )));
                p.notices.push(format!(
                    "[system] {label}: claude could not be started ({}); {what} is kept and retried every {max:?} at most",
                    text.trim_start_matches("not started: ")
                ));
            } else {
                let line = format!("claude could not be started ({n} in a row): {text}");
                p.logs.push((log::Level::Debug, line));
            }
            (
                backoff(w.brief, max, n),
                format!("claude could not be started: {what} requeued"),
            )
        }
        PauseReason::McpStart => {
            if n == MCP_FAILURES_BEFORE_BACKOFF {
                let line = format!("the MCP servers did not start for {n} turns in a row: {text}");
                p.logs.push((log::Level::Error, line));
                p.notices.push(format!(
                    "[system] {label}: the MCP servers did not start for {n} turns in a row ({text}); {what} is kept and retried with a backoff up to {max:?}"
                ));
            }
            // Short pauses first, then doubling from twice the short one.
            let wait = if n < MCP_FAILURES_BEFORE_BACKOFF {
                w.brief
            } else {
                backoff(w.brief, max, n - MCP_FAILURES_BEFORE_BACKOFF + 2)
            };
            (
                wait,
                format!("MCP servers did not start ({text}): {what} requeued"),
            )
        }
        // Not backoffs of the loop's own (`keep` never asks for them here).
        PauseReason::RateLimit
        | PauseReason::UsageLimit
        | PauseReason::Budget
        | PauseReason::Login
        | PauseReason::Other(_) => (w.brief, String::new()),
    };
    (wait, Some(reason), detail)
}

/// `base` doubled per failure after the first (`n` ≥ 1), capped at `max`.
pub fn backoff(base: Duration, max: Duration, n: u32) -> Duration {
    (base * 2u32.saturating_pow(n.saturating_sub(1).min(16))).min(max)
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
            Running::Turn
            | Running::ReactiveCompact
            | Running::ProactiveCompact
            | Running::OperatorCompact => "go on: the turn, whole".into(),
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
        #[rustfmt::skip]
        let want: [(Outcome, [Decision; 6]); 17] = [
            (Outcome::Ok, [D::Complete, D::Proceed, D::Proceed, D::Proceed, D::GoOn, D::GoOn]),
            (Outcome::Compacted, [D::Complete, D::Proceed, D::Proceed, D::Proceed, D::GoOn, D::GoOn]),
            (Outcome::RateLimited, [keep(For(P::RateLimit), false, Turn), keep(For(P::RateLimit), false, CompactThenTurn), keep(For(P::RateLimit), false, Turn), D::GoOn, D::GoOn, D::GoOn]),
            (Outcome::AuthFailed, [D::RetryNow, D::RetryNow, D::RetryNow, D::GoOn, D::GoOn, D::GoOn]),
            (Outcome::PromptTooLong, [D::CompactThenRetry, D::FreshSessionThenRetry, D::Proceed, D::Proceed, D::GoOn, D::GoOn]),
            (Outcome::ApiUnavailable, [keep(For(P::ApiBackoff), false, Turn), keep(For(P::ApiBackoff), false, CompactThenTurn), keep(For(P::ApiBackoff), false, Turn), D::GoOn, D::GoOn, D::GoOn]),
            (Outcome::CannotCompact, [D::FreshSessionThenRetry, D::FreshSessionThenRetry, D::Proceed, D::Proceed, D::GoOn, D::GoOn]),
            (Outcome::Aborted, [keep(Brief, true, Turn), keep(Brief, true, CompactThenTurn), D::Proceed, D::Proceed, D::GoOn, D::GoOn]),
            (Outcome::Interrupted, [D::AckInterrupted, D::AckInterrupted, D::AckInterrupted, D::GoOn, D::GoOn, D::GoOn]),
            (Outcome::Failed, [keep(Brief, true, Turn), keep(Brief, true, CompactThenTurn), D::Proceed, D::Proceed, D::GoOn, D::GoOn]),
            (Outcome::TimedOut, [keep(Brief, true, Turn), keep(Brief, true, CompactThenTurn), keep(Brief, true, Turn), D::Proceed, D::GoOn, D::GoOn]),
            (Outcome::Hung, [keep(Brief, true, Turn), keep(Brief, true, CompactThenTurn), keep(Brief, true, Turn), D::Proceed, D::GoOn, D::GoOn]),
            (Outcome::NotStarted, [keep(For(P::StartFailed), false, Turn), keep(For(P::StartFailed), false, CompactThenTurn), keep(For(P::StartFailed), false, Turn), D::GoOn, D::GoOn, D::GoOn]),
            (Outcome::McpStartFailed, [keep(For(P::McpStart), false, Turn), keep(For(P::McpStart), false, CompactThenTurn), keep(For(P::McpStart), false, Turn), D::GoOn, D::GoOn, D::GoOn]),
            (Outcome::TurnBudget, [D::AckTurnBudget, D::AckTurnBudget, D::Proceed, D::Proceed, D::GoOn, D::GoOn]),
            (Outcome::Stopped, [keep(Brief, false, Turn), keep(Brief, false, CompactThenTurn), keep(Brief, false, Turn), D::GoOn, D::GoOn, D::GoOn]),
            (Outcome::Other, [keep(Brief, true, Turn), keep(Brief, true, CompactThenTurn), D::Proceed, D::Proceed, D::GoOn, D::GoOn]),
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
    fn backoff_doubles_from_the_base_to_the_cap() {
        let s = Duration::from_secs;
        let got: Vec<u64> = (1..=6)
            .map(|n| backoff(s(15), s(100), n).as_secs())
            .collect();
        assert_eq!(got, [15, 30, 60, 100, 100, 100]);
        assert_eq!(backoff(s(1), s(60), u32::MAX), s(60));
    }

    fn end(outcome: Outcome, streaks: Streaks) -> End<'static> {
        let s = Duration::from_secs;
        End {
            outcome,
            running: Running::Turn,
            facts: Facts::default(),
            has_work: true,
            label: "ana".into(),
            what: "message #12 from bob".into(),
            text: "boom",
            said: None,
            detail: "Reached maximum budget ($0.5)".into(),
            result_text: "",
            resets_at: None,
            cost_usd: Some(0.61),
            turn_usd: Some(0.5),
            past_watermark: false,
            now: 1000,
            streaks,
            waits: Waits {
                brief: Duration::from_millis(500),
                rate_limit: s(300),
                rate_limit_max: s(3600),
                api_backoff_base: s(15),
                api_backoff_max: s(900),
                api_failures_before_notice: 3,
                start_backoff_max: s(60),
            },
        }
    }

    fn pause_of(p: &Plan) -> (Duration, Option<PauseReason>) {
        match &p.next {
            Next::Pause { wait, reason, .. } => (*wait, reason.clone()),
            other => panic!("not a pause: {other:?}"),
        }
    }

    #[test]
    fn the_plan_says_the_pause_the_notices_and_the_streaks() {
        let s = Duration::from_secs;
        // The API backoff doubles per failure in a row; the parent is told
        // once, at the threshold; a completed turn ends the streak.
        let mut streaks = Streaks::default();
        let mut waits = Vec::new();
        for n in 1..=4 {
            let p = plan(&end(Outcome::ApiUnavailable, streaks));
            assert_eq!(p.streaks.api, n);
            assert_eq!(p.notices.len(), usize::from(n == 3), "failure {n}");
            waits.push(pause_of(&p));
            streaks = p.streaks;
        }
        assert_eq!(
            waits,
            [15, 30, 60, 120].map(|n| (s(n), Some(PauseReason::ApiBackoff)))
        );
        let done = plan(&end(Outcome::Ok, streaks));
        assert_eq!(done.settle, Settle::Ack(Ack::Completed));
        assert_eq!((done.streaks.api, done.completed), (0, true));
        // claude that cannot start: one notice and one error line per burst.
        let first = plan(&end(Outcome::NotStarted, Streaks::default()));
        let again = plan(&end(Outcome::NotStarted, first.streaks));
        assert_eq!((first.notices.len(), again.notices.len()), (1, 0));
        assert_eq!(first.logs[0].0, log::Level::Error);
        assert_eq!(pause_of(&again).0, Duration::from_millis(1000));
        // MCP servers: brief twice, then a backoff and one notice.
        let mut streaks = Streaks::default();
        let mut got = Vec::new();
        for _ in 0..4 {
            let p = plan(&end(Outcome::McpStartFailed, streaks));
            got.push((pause_of(&p).0.as_millis(), p.notices.len()));
            streaks = p.streaks;
        }
        assert_eq!(got, [(500, 0), (500, 0), (1000, 1), (2000, 0)]);
        // A rate limit with a reset: the pool's usage limit, until the
        // reset, and the broker told; without one, this agent's sleep.
        let mut e = end(Outcome::RateLimited, Streaks::default());
        e.resets_at = Some(1000 + 7200);
        let p = plan(&e);
        assert_eq!(pause_of(&p), (s(3600), Some(PauseReason::UsageLimit)));
        assert_eq!(
            p.usage_limit,
            Some(UsageLimit {
                until: 1000 + 3600,
                detail: "boom".into()
            })
        );
        e.resets_at = None;
        let p = plan(&e);
        assert_eq!(pause_of(&p), (s(300), Some(PauseReason::RateLimit)));
        assert_eq!(p.usage_limit, None);
        // The turn budget: acked, the parent told the cap, the CLI's words
        // and the cost.
        let p = plan(&end(Outcome::TurnBudget, Streaks::default()));
        assert_eq!(p.settle, Settle::Ack(Ack::TurnBudget));
        assert_eq!(
            p.notices,
            ["[system] ana: message #12 from bob stopped at its per-run budget (turn_usd $0.5; claude said: Reached maximum budget ($0.5)) after costing $0.6100; it is acked and not run again (a retry would pay again)"]
        );
        // A crash at the limit: the dead letter's notice names the attempts.
        let mut e = end(Outcome::Failed, Streaks::default());
        e.facts.attempts = 4;
        let p = plan(&e);
        assert_eq!(
            p.settle,
            Settle::DeadLetter {
                notice: "[system] ana: message #12 from bob is dead-lettered after 5 failed attempts; last error: boom".into()
            }
        );
        assert_eq!(p.next, Next::Advance(None));
        // A clean turn past the watermark: the proactive checkpoint next.
        let mut e = end(Outcome::Ok, Streaks::default());
        e.past_watermark = true;
        assert_eq!(plan(&e).next, Next::Advance(Some(Proactive::Checkpoint)));
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
