//! The turn loop's in-memory kit: a [`TurnLoop`] on a poller with no
//! broker behind it (`poller::test_poller`: the test reads back, in order,
//! every request and ask the loop sends) and no claude process (the runs
//! the loop starts are recorded, and the test ends them with scripted
//! stream-json lines through the real classifier). So a row of the policy
//! is tested as the loop carries it out — the broker requests, the page's
//! pause and turn end, the next run — without processes.

use super::*;
use crate::harness::bus::Numbered;
use crate::harness::poller::{test_poller, Sent};
use crate::proto::{Attempt, Peer, Place};
use crate::sys::env::Env;
use crossbeam_channel::Sender;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

const RESULT_OK: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":1,"result":"done","session_id":"s1","total_cost_usd":0.01,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":10}}"#;
const RESULT_429: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"num_turns":1,"result":"You've hit your session limit","session_id":"s1","total_cost_usd":0}"#;
const RESULT_TOO_LONG: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":400,"num_turns":1,"result":"Prompt is too long","session_id":"s1","total_cost_usd":0}"#;

/// A temp dir removed at drop.
struct Dir(PathBuf);

impl Dir {
    fn new() -> Dir {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "hive-loop-kit-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).unwrap();
        Dir(p)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A loop, what it sent, what the page got.
struct Kit {
    lp: TurnLoop,
    _events: Sender<FromPoller>,
    sent: Box<dyn Fn() -> Vec<Sent>>,
    page: Receiver<Numbered>,
    _dir: Dir,
}

impl Kit {
    fn new(vars: &[(&str, &str)]) -> Kit {
        let dir = Dir::new();
        let state = dir.0.join("state");
        let run = dir.0.join("run");
        let config = dir.0.join("claude");
        for d in [&state, &run, &config] {
            std::fs::create_dir_all(d).unwrap();
        }
        let mut all: Vec<(String, String)> = vec![
            ("HIVE_LABEL".into(), "ana".into()),
            ("CLAUDE_CONFIG_DIR".into(), config.display().to_string()),
            ("HIVE_CLAUDE_BIN".into(), "/nonexistent/claude".into()),
        ];
        all.extend(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let lookup = move |k: &str| all.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let s = Arc::new(Settings::read(&state, &run, &Env::new(&lookup)).unwrap());
        let bus = Bus::new("ana", "ana", "haiku", 200_000);
        let (_, page) = bus.subscribe(None);
        let (control_tx, control_rx) = crossbeam_channel::unbounded();
        let shared = Shared::new(bus, control_tx, s.clone());
        let (poller, events, sent) = test_poller();
        let (_, signals) = crossbeam_channel::unbounded();
        let tools = ToolLists {
            builtins: Vec::new(),
            allowed: Vec::new(),
        };
        let mut lp = TurnLoop::new(
            s,
            shared,
            None,
            tools,
            poller,
            control_rx,
            signals,
            (None, None),
        );
        lp.kit_runs = Some(Vec::new());
        lp.acct.heard_turn_usd(Some(0.5));
        Kit {
            lp,
            _events: events,
            sent: Box::new(sent),
            page,
            _dir: dir,
        }
    }

    /// The broker hands out message `id` from the operator, its `attempts`th
    /// hand-out.
    fn hand_out(&mut self, id: i64, attempts: u32) {
        let message = Message {
            id,
            from: Peer::Operator,
            to: Peer::Agent("ana".into()),
            body: "run the migration".into(),
            kind: crate::proto::MsgKind::Message,
            in_reply_to: None,
            sent_at: 1_700_000_000,
            transient: false,
        };
        self.lp.handle(Event::Broker(FromPoller::Message {
            message,
            redelivered: false,
            unread: Some(0),
            attempts,
            turn_usd: Some(0.5),
            traceparent: None,
        }));
    }

    /// The runs the loop started since the last look: what and whether it
    /// resumed the session.
    fn runs(&mut self) -> Vec<(Running, bool)> {
        let runs = self.lp.kit_runs.as_mut().unwrap();
        runs.drain(..).map(|(r, _, resume)| (r, resume)).collect()
    }

    /// Ends the run the loop started as `running` with these stdout lines and
    /// exit code, through the classifier.
    fn end(&mut self, running: Running, resumed: bool, lines: &[&str], code: i32) {
        let mut o = if running.is_compaction() {
            TurnObserver::compaction()
        } else {
            TurnObserver::new()
        };
        for l in lines {
            o.on_stdout_line(l);
        }
        let report = o.finish(ExitInfo {
            code: Some(code),
            ..ExitInfo::default()
        });
        let outcome = report.outcome.kind();
        self.conclude(running, resumed, report, outcome);
    }

    fn conclude(
        &mut self,
        running: Running,
        resumed: bool,
        report: TurnReport,
        o: TurnOutcomeKind,
    ) {
        let epoch = self.lp.session.epoch;
        self.lp.conclude(Ended {
            running,
            report,
            outcome: o,
            started: o != TurnOutcomeKind::NotStarted,
            resumed,
            epoch,
            model: "haiku".into(),
            started_at: now(),
            elapsed: Duration::from_millis(5),
            said: None,
            span: None,
        });
    }

    /// What the loop sent the broker since the last look, without the
    /// bookkeeping every run sends (spend, counters, pool, state).
    fn sent(&self) -> Vec<Sent> {
        (self.sent)()
            .into_iter()
            .filter(|s| {
                !matches!(
                    s,
                    Sent::Tell(
                        Request::ReportSpend(_)
                            | Request::PostTurnCounts(_)
                            | Request::ReportPool(_)
                            | Request::ReportState(_)
                    )
                )
            })
            .collect()
    }

    /// The `TurnEnd` events on the page since the last look: ok, decision.
    fn turn_ends(&self) -> Vec<(bool, Option<String>)> {
        self.page
            .try_iter()
            .filter_map(|n| match n.event {
                LiveEvent::TurnEnd { ok, decision, .. } => Some((ok, decision)),
                _ => None,
            })
            .collect()
    }

    fn paused(&self) -> Option<PauseReason> {
        self.lp.bus.paused().map(|p| p.reason)
    }
}

fn tell(r: impl Into<Request>) -> Sent {
    Sent::Tell(r.into())
}

fn requeue(id: i64, counted: bool, place: Place, error: Option<&str>) -> Sent {
    tell(cmd::RequeueInflight {
        id,
        attempt: if counted {
            Attempt::Counted
        } else {
            Attempt::NotCounted
        },
        place,
        error: error.map(str::to_string),
    })
}

/// A report that classifies as `o`, for the rows the scripted lines do not
/// reach directly.
fn report_of(o: TurnOutcomeKind) -> TurnReport {
    use TurnOutcomeKind as K;
    let mut r = TurnObserver::new().finish(ExitInfo {
        code: Some(0),
        ..ExitInfo::default()
    });
    r.outcome = match o {
        K::Ok => TurnOutcome::ok(),
        K::Compacted => TurnOutcome::compacted(),
        K::RateLimited => TurnOutcome::rate_limited(None),
        K::AuthFailed => TurnOutcome::auth_failed(),
        K::PromptTooLong => TurnOutcome::prompt_too_long(),
        K::ApiUnavailable => TurnOutcome::api_unavailable("Overloaded".into()),
        K::CannotCompact => TurnOutcome::cannot_compact("Not enough messages to compact.".into()),
        K::Aborted => TurnOutcome::aborted("turn interrupted during execution".into()),
        K::Interrupted => TurnOutcome::interrupted("interrupted by the operator".into()),
        K::Failed | K::Other | K::Stopped => {
            TurnOutcome::failed("claude exited with code 1 without a result line".into())
        }
        K::TimedOut => TurnOutcome::failed("turn timed out after 60s".into()),
        K::Hung => TurnOutcome::hung("no output for 900s with no tool call open; stopped".into()),
        K::NotStarted => TurnOutcome::not_started("cannot run claude".into()),
        K::McpStartFailed => TurnOutcome::mcp_not_connected("bash failed".into()),
        K::TurnBudget => TurnOutcome::turn_budget("Reached maximum budget ($0.5)".into()),
    };
    r
}

/// Every row of the policy table, each fact set the table shows, carried
/// out by the loop: what it sends the broker, shows on the page and runs
/// next is what the plan says, and nothing else.
#[test]
fn the_loop_carries_out_every_policy_row_as_planned() {
    let mut rows = 0;
    for o in policy::OUTCOMES {
        for running in policy::RUNNING {
            let mut variants = vec![("first try", Facts::default())];
            variants.extend(policy::table_variants(5));
            for (label, facts) in variants {
                check_row(
                    o,
                    running,
                    facts,
                    &format!("{o:?} during {running:?}, {label}"),
                );
                rows += 1;
            }
        }
    }
    assert_eq!(rows, 17 * 6 * 8);
}

/// Sets the loop up as `facts` say for a run of `running` that ended in
/// `o`, and checks that it does what the plan says.
fn check_row(o: TurnOutcomeKind, running: Running, facts: Facts, why: &str) {
    let mut k = Kit::new(&[]);
    let id = 12;
    if running.for_work() {
        k.hand_out(id, facts.attempts + 1);
        // The hand-out started the turn; the run under test replaces it.
        k.runs();
        let epoch = k.lp.session.epoch;
        let done = k.lp.completed_turns;
        k.lp.completed_turns = done + 1;
        k.lp.ledger.update(WorkKey::Message(id), |r| {
            if facts.compacted {
                r.compacted_epoch = Some(epoch);
            }
            if facts.succeeded_since_failure {
                r.failed_at = Some(done);
            }
        });
        if let Some(w) = &mut k.lp.work {
            w.auth_retried = facts.auth_retried;
        }
    }
    k.sent();
    k.turn_ends();
    let report = report_of(o);
    let e = Ended {
        running,
        report: report.clone(),
        outcome: o,
        started: o != TurnOutcomeKind::NotStarted,
        resumed: facts.resumed,
        epoch: k.lp.session.epoch,
        model: "haiku".into(),
        started_at: now(),
        elapsed: Duration::from_millis(5),
        said: None,
        span: None,
    };
    let text = e.text();
    let want = policy::plan(&k.lp.end_of(&e, &text));
    assert_eq!(
        want.decision,
        policy::decide(o, running, &facts),
        "{why}: the plan's decision is the table's"
    );
    k.conclude(running, facts.resumed, report, o);
    let sent = k.sent();
    // The settlement first, then the usage limit, then the notices.
    let mut expect: Vec<Sent> = Vec::new();
    match &want.settle {
        Settle::Hold | Settle::RetryAuth => {}
        Settle::Ack(_) => expect.push(tell(cmd::AckTurn { id, turn: None })),
        Settle::DeadLetter { .. } => expect.push(tell(cmd::DeadLetter {
            id,
            error: crate::harness::work::error_text(&text),
            ran: true,
        })),
        Settle::Requeue { counted, place, .. } => {
            let error = counted.then(|| crate::harness::work::error_text(&text));
            expect.push(requeue(id, *counted, *place, error.as_deref()))
        }
    }
    let asks: Vec<&Sent> = sent
        .iter()
        .filter(|s| matches!(s, Sent::Tell(Request::ReportUsageLimit(_))))
        .collect();
    assert_eq!(asks.len(), usize::from(want.usage_limit.is_some()), "{why}");
    for n in &want.notices {
        expect.push(tell(cmd::SendToParent { body: n.clone() }));
    }
    let got: Vec<Sent> = sent
        .iter()
        .filter(|s| {
            !matches!(
                s,
                Sent::Next | Sent::Peek | Sent::Tell(Request::ReportUsageLimit(_))
            )
        })
        .cloned()
        .collect();
    assert_eq!(
        got, expect,
        "{why}: the broker gets the plan's settlement and notices"
    );
    // The page: one turn end with the plan's decision, when the plan says.
    let ends = k.turn_ends();
    match &want.end {
        Some(end) => assert_eq!(
            ends,
            [(end.ok, Some(policy::describe(&want.decision, running)))],
            "{why}"
        ),
        None => assert!(ends.is_empty(), "{why}: {ends:?}"),
    }
    check_next(&mut k, &want.next, why);
    // A work the plan lets go is gone; one it keeps or holds is not lost.
    let in_hand = k.lp.work.is_some();
    match want.settle {
        Settle::Ack(_) | Settle::DeadLetter { .. } | Settle::Requeue { .. } => {
            assert!(!in_hand, "{why}")
        }
        Settle::Hold | Settle::RetryAuth => {
            assert_eq!(in_hand, running.for_work(), "{why}")
        }
    }
}

/// The loop runs, pauses or asks for what the plan says comes next.
fn check_next(k: &mut Kit, next: &Next, why: &str) {
    let runs = k.runs();
    match next {
        Next::Advance(_) => {
            assert!(runs.is_empty(), "{why}: {runs:?}");
            assert!(matches!(k.lp.phase, Phase::Idle), "{why}");
        }
        Next::Turn | Next::TurnAfterCompact => {
            assert_eq!(runs, [(Running::Turn, true)], "{why}")
        }
        Next::FreshTurn => assert_eq!(runs, [(Running::Turn, false)], "{why}"),
        Next::Compact(r, _) => assert_eq!(runs, [(*r, true)], "{why}"),
        Next::ResetCheckpoint => {
            assert_eq!(runs, [(Running::ResetCheckpoint, true)], "{why}")
        }
        Next::Pause { reason, .. } => {
            assert!(runs.is_empty(), "{why}");
            assert!(matches!(k.lp.phase, Phase::Paused { .. }), "{why}");
            assert_eq!(k.paused(), *reason, "{why}");
        }
        Next::Login => {
            assert!(matches!(k.lp.phase, Phase::Login { .. }), "{why}");
            assert_eq!(k.paused(), Some(PauseReason::Login), "{why}");
        }
    }
}

/// A whole turn from scripted lines: the hand-out starts it, a clean
/// `result` acks it, and the loop asks for the next message.
#[test]
fn a_clean_turn_is_acked_and_the_next_message_asked_for() {
    let mut k = Kit::new(&[]);
    k.hand_out(7, 1);
    assert_eq!(k.runs(), [(Running::Turn, true)]);
    k.end(Running::Turn, true, &[RESULT_OK], 0);
    let sent = k.sent();
    assert_eq!(
        sent.first(),
        Some(&tell(cmd::AckTurn { id: 7, turn: None })),
        "{sent:?}"
    );
    assert!(
        matches!(sent.last(), Some(Sent::Next | Sent::Peek)),
        "{sent:?}"
    );
    assert_eq!(k.turn_ends(), [(true, Some("ack".into()))]);
    assert!(k.lp.work.is_none());
}

/// A usage limit with its reset: the message goes back at the head, not
/// counted, the broker is told to park the pool, and the page shows
/// `usage_limit`.
#[test]
fn a_usage_limit_requeues_at_the_head_and_parks_the_pool() {
    let mut k = Kit::new(&[]);
    k.hand_out(7, 1);
    k.runs();
    let resets = now() + 3600;
    let rle = format!(
        r#"{{"type":"rate_limit_event","rate_limit_info":{{"status":"rejected","resetsAt":{resets},"rateLimitType":"five_hour"}},"session_id":"s1"}}"#
    );
    k.end(Running::Turn, true, &[&rle, RESULT_429], 1);
    let sent = k.sent();
    assert_eq!(sent[0], requeue(7, false, Place::Head, None), "{sent:?}");
    match &sent[1] {
        Sent::Tell(Request::ReportUsageLimit(u)) => {
            assert_eq!(u.until, resets);
            assert_eq!(u.detail, "You've hit your session limit");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(k.paused(), Some(PauseReason::UsageLimit));
    assert!(matches!(k.lp.phase, Phase::Paused { .. }));
}

/// A crash counts: behind the other senders' mail, with its error; at the
/// limit the message is dead-lettered instead.
#[test]
fn a_crash_counts_and_at_the_limit_dead_letters() {
    let mut k = Kit::new(&[("HIVE_TURN_MAX_ATTEMPTS", "2")]);
    k.hand_out(7, 1);
    k.runs();
    k.end(Running::Turn, true, &[], 1);
    let sent = k.sent();
    match &sent[0] {
        Sent::Tell(Request::RequeueInflight(r)) => {
            assert_eq!((r.attempt, r.place), (Attempt::Counted, Place::Behind));
            assert!(r
                .error
                .as_deref()
                .unwrap_or_default()
                .starts_with("failed:"));
        }
        other => panic!("{other:?}"),
    }
    assert!(k.paused().is_none(), "a brief pause has no reason");
    // The second hand-out fails the same way: the last attempt.
    k.lp.end_pause();
    k.sent();
    k.hand_out(7, 2);
    k.runs();
    k.end(Running::Turn, true, &[], 1);
    let sent = k.sent();
    assert!(
        matches!(&sent[0], Sent::Tell(Request::DeadLetter(d)) if d.id == 7 && d.ran),
        "{sent:?}"
    );
    assert_eq!(
        k.turn_ends().last().and_then(|e| e.1.clone()).as_deref(),
        Some("dead-letter")
    );
}

/// Too long: `/compact` runs, then the turn with the whole message.
#[test]
fn a_prompt_too_long_compacts_then_runs_the_turn_again() {
    let mut k = Kit::new(&[]);
    k.hand_out(7, 1);
    k.runs();
    k.end(Running::Turn, true, &[RESULT_TOO_LONG], 1);
    assert_eq!(k.runs(), [(Running::ReactiveCompact, true)]);
    assert!(k.sent().is_empty(), "the message stays in hand");
    let boundary = r#"{"type":"system","subtype":"compact_boundary","compact_metadata":{"trigger":"manual","pre_tokens":180000}}"#;
    k.end(Running::ReactiveCompact, true, &[boundary, RESULT_OK], 0);
    assert_eq!(k.runs(), [(Running::Turn, true)]);
    let prompt_whole =
        k.lp.ledger.get(WorkKey::Message(7)).compacted_epoch == Some(k.lp.session.epoch);
    assert!(prompt_whole, "compacted for it in this session");
}
