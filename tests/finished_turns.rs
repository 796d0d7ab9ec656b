//! A turn that finished is never run again (issue 37): a real broker, a real
//! `hive serve` and the scripted fake claude. A `success` result claude wrote
//! before the harness signalled it acks the message whatever ends the run
//! (a stop of the harness, the turn timeout, the idle watchdog); a `success`
//! written only in answer to the harness's signal, or one that says
//! `interrupted_by_shutdown`, keeps it, not counted; and a message whose ack
//! never reached the broker is acked at its next hand-out without running
//! claude. Each test counts the fake's invocations (the boot kick is always
//! invocation 1, and again the first after a restart of the harness) and
//! reads the broker's rows and the turn-stats db.

mod common;

use common::hive::*;
use common::web::Page;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// One run as the turn-stats db keeps it.
#[derive(Debug)]
struct Row {
    kind: String,
    outcome: String,
    note: String,
    message_id: Option<i64>,
}

fn stats_rows(h: &Harness) -> Vec<Row> {
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let mut st = db
        .prepare("SELECT kind, outcome, note, message_id FROM turns ORDER BY id")
        .unwrap();
    st.query_map([], |r| {
        Ok(Row {
            kind: r.get(0)?,
            outcome: r.get(1)?,
            note: r.get(2)?,
            message_id: r.get(3)?,
        })
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Waits until the turn-stats db holds the run of message `id`.
fn run_of(h: &Harness, id: i64) -> Row {
    wait_for(T, &format!("the stats row of message #{id}"), || {
        stats_rows(h).into_iter().find(|r| r.message_id == Some(id))
    })
}

/// Waits until the fake has made the file `name` in its scenario dir.
fn wait_file(h: &Harness, name: &str) {
    let f = h.fake.dir.join(name);
    wait_for(T, &format!("the fake's {name}"), || {
        f.exists().then_some(())
    });
}

/// Sends `body` to `ana` as the operator, waits for the fake's file `when`
/// and stops the harness (SIGTERM, as `hive restart` does): what the broker
/// then holds of ana's mail (unread, inflight) and the message's run.
fn stopped_after(b: &Broker, h: &mut Harness, body: &str, when: &str) -> ((u64, Option<i64>), Row) {
    let id = operator_send(b, "ana", body);
    wait_file(h, when);
    let st = h.terminate();
    assert!(st.success(), "{st}: {}", h.log());
    let r = agent_row(b, "ana");
    ((r.unread, r.inflight), run_of(h, id))
}

/// The invocations (from 2 on) whose prompt holds `body`.
fn runs_of(h: &Harness, body: &str) -> Vec<usize> {
    (2..=h.fake.count())
        .filter(|&n| h.fake.stdin(n).contains(body))
        .collect()
}

/// Nothing more runs for a moment: the fake's count stays `n`.
fn settled(h: &Harness, n: usize) {
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), n, "nothing ran again");
}

#[test]
fn success_before_a_stop_of_the_harness_is_acked_and_never_runs_again() {
    let (b, mut h) = started_harness("ana", &[]);
    // The result, then a claude slow to exit: it ignores SIGINT and takes
    // its time over SIGTERM, so the stop lands between the two.
    h.fake.step(
        2,
        r#"init; say deployed; result_ok deployed; touch "$dir/reported"
trap '' INT; trap 'sleep 2; exit 143' TERM; sleep 30 & wait"#,
    );
    let (mail, run) = stopped_after(&b, &mut h, "deploy once", "reported");
    assert_eq!(mail, (0, None), "acked");
    assert_eq!((run.kind.as_str(), run.outcome.as_str()), ("turn", "ok"));
    assert!(
        run.note
            .starts_with("success was reported before the harness's stop; claude then"),
        "{run:?}"
    );

    // The next harness runs its boot kick and nothing else.
    h.spawn();
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    settled(&h, 3);
    assert_eq!(runs_of(&h, "deploy once"), [2]);
}

#[test]
fn success_before_the_turn_timeout_or_the_idle_watchdog_is_acked() {
    for (limit, stop) in [
        ("HIVE_TURN_TIMEOUT_SECS", "the turn timeout"),
        ("HIVE_TURN_IDLE_SECS", "the idle watchdog"),
    ] {
        let (b, h) = started_harness("ana", &[(limit, "1")]);
        // The result, then a claude that neither exits nor prints.
        h.fake
            .step(2, "init; say reported; result_ok reported; sleep 30");
        let id = operator_send(&b, "ana", "reply once");
        let run = run_of(&h, id);
        assert_eq!(run.outcome, "ok", "{limit}: {run:?}");
        assert!(
            run.note
                .starts_with(&format!("success was reported before {stop}; claude then")),
            "{limit}: {run:?}"
        );
        wait_drained(&b, "ana");
        settled(&h, 2);
    }
}

#[test]
fn a_success_written_in_answer_to_the_stop_is_kept_and_not_counted() {
    // With a limit of one attempt, a counted stop would dead-letter the
    // message at its next hand-out instead of running it.
    let (b, mut h) = started_harness("ana", &[("HIVE_TURN_MAX_ATTEMPTS", "1")]);
    // As the CLI can after a SIGTERM mid-tool-call: `success` only once the
    // harness has signalled it.
    h.fake.step(
        2,
        r#"trap 'result_ok "too late"; kill $!; exit 143' INT TERM
init; tool_call mcp__bash__run '{"cmd":"make"}'; touch "$dir/working"; sleep 30 & wait"#,
    );
    let (mail, run) = stopped_after(&b, &mut h, "build once", "working");
    assert_eq!(mail, (1, None), "kept");
    assert_eq!(run.outcome, "stopped", "{run:?}");
    assert!(run.note.contains("came after the signal"), "{run:?}");

    h.spawn();
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    settled(&h, 4);
    assert_eq!(runs_of(&h, "build once").len(), 2, "run again, whole");
    assert_eq!(agent_row(&b, "ana").failed, 0);
    assert!(operator_inbox(&b).is_empty(), "no dead letter");
}

#[test]
fn a_success_that_says_interrupted_by_shutdown_is_kept_and_not_counted() {
    let (b, h) = started_harness("ana", &[("HIVE_TURN_MAX_ATTEMPTS", "1")]);
    // Shut down by someone other than the harness, and the CLI says so.
    h.fake.step(
        2,
        r#"init; say "half done"; result_shutdown "half done"; exit 143"#,
    );
    let id = operator_send(&b, "ana", "migrate once");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    settled(&h, 3);
    let rows = stats_rows(&h);
    let outcomes: Vec<&str> = rows.iter().map(|r| r.outcome.as_str()).collect();
    assert_eq!(outcomes, ["ok", "stopped", "ok"], "{rows:?}");
    assert!(rows[1].note.contains("interrupted_by_shutdown"), "{rows:?}");
    assert_eq!(rows[2].message_id, Some(id), "run again");
    assert!(operator_inbox(&b).is_empty(), "no dead letter");
}

#[test]
fn a_message_whose_ack_was_lost_is_acked_at_its_next_hand_out_without_running() {
    let (mut b, mut h) = started_harness("ana", &[]);
    // The result waits for the test's word (30 s at most).
    h.fake.step(
        2,
        r#"init; say "pushed"; touch "$dir/running"
for _ in $(seq 600); do [ -e "$dir/go" ] && break; sleep 0.05; done
result_ok pushed; exit 0"#,
    );
    let id = operator_send(&b, "ana", "push once");
    wait_file(&h, "running");
    // The broker goes before the ack can reach it; the turn then finishes,
    // is recorded, and the harness is killed with the ack still unsent.
    b.kill9();
    std::fs::write(h.fake.dir.join("go"), "").unwrap();
    let run = run_of(&h, id);
    assert_eq!(run.outcome, "ok", "{run:?}");
    h.kill9();
    b.restart();
    let r = agent_row(&b, "ana");
    assert_eq!(
        (r.unread, r.inflight),
        (1, None),
        "the broker hands it out again"
    );

    let _ = std::fs::remove_file(h.state_dir().join("hyperhive-port"));
    h.spawn();
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    settled(&h, 3);
    assert_eq!(runs_of(&h, "push once"), [2], "not run again");
    assert_eq!(stats_rows(&h).len(), 3, "no run for the hand-out");
    let page = Page::of(&h.state_dir());
    let turn = wait_for(T, "the hand-out in the history", || {
        let r = page.get("/api/history?limit=50");
        assert_eq!(r.status, 200, "{}", r.body);
        let turns = r.json()["turns"].as_array()?.clone();
        turns.into_iter().find(|t| {
            t["note"]
                .as_str()
                .is_some_and(|n| n.contains("not run again"))
        })
    });
    let note = turn["note"].as_str().unwrap();
    assert_eq!(
        note,
        format!("message #{id} from operator was completed before the restart; not run again")
    );
    assert_eq!(
        (turn["ok"].clone(), turn["decision"].clone()),
        (true.into(), "ack".into())
    );
}
