//! The turn loop's failure paths (issue 14) against a real broker and a real
//! `hive serve` with the scripted fake claude printing what CLI 2.1.197
//! prints: a compaction that hits a rate limit keeps its message and compacts
//! again, a session that stays too long is replaced by a fresh one, a message
//! too long for any session is dead-lettered at the attempt limit, a retry in
//! a fresh session carries the body, a hung turn is stopped and counted while
//! a long tool call is not, and an API outage dead-letters nothing. Each test
//! asserts the invocations (argv, stdin) and the broker's state afterwards.
//! The harness's boot kick is always invocation 1.

mod common;

use common::agent_page::AgentPage;
use common::hive::*;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// Starts a harness and waits until its boot kick turn is acked.
fn started(agent: &str, env: &[(&str, &str)]) -> (Broker, Harness) {
    let b = Broker::start(&[agent]);
    let h = Harness::start(&b, agent, env);
    h.fake.wait_count(1);
    wait_drained(&b, agent);
    (b, h)
}

fn stats_rows(h: &Harness) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let mut st = db
        .prepare("SELECT kind, outcome FROM turns ORDER BY id")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn resumed(h: &Harness, n: usize) -> bool {
    h.fake.argv(n).contains(&"--continue".to_string())
}

/// Waits for an operator-inbox message matching `pred`.
fn wait_notice(b: &Broker, what: &str, pred: impl Fn(&str) -> bool) -> hyperhive::proto::Message {
    wait_for(T, what, || {
        operator_inbox(b).into_iter().find(|m| pred(&m.body))
    })
}

const PTL: &str = r#"api_error 400 invalid_request "Prompt is too long" prompt_too_long"#;
const COMPACT_429: &str = r#"compact_failed "Error during compaction: API Error: Request rejected (429) · Number of request tokens has exceeded your per-minute rate limit""#;

#[test]
fn a_rate_limited_compaction_keeps_the_message_and_compacts_again_before_the_retry() {
    let (b, h) = started("ana", &[("HIVE_RATE_LIMIT_SLEEP_SECS", "2")]);
    let page = AgentPage::of(&h);
    h.fake.step(2, PTL);
    h.fake.step(3, COMPACT_429);
    h.fake.step(4, "compact_ok 191057 183");
    let id = operator_send(&b, "ana", "a big job");
    h.fake.wait_count(3);
    // Parked on the rate limit with the message back in the inbox.
    let s = page.wait_state("the rate-limit pause", |s| {
        s["paused"]["reason"] == "rate_limit"
    });
    assert_eq!(s["rate_limited"], true, "{s}");
    assert!(s["paused"]["until"].is_i64(), "{s}");
    // The page may show the pause a moment before the requeue reaches the
    // broker (the run's end goes to the broker in one batch after `conclude`).
    wait_for(T, "the message back in the inbox", || {
        let row = agent_row(&b, "ana");
        ((row.unread, row.inflight) == (1, None)).then_some(())
    });
    assert_eq!(h.fake.count(), 3, "nothing runs during the pause");

    h.fake.wait_count(5);
    wait_drained(&b, "ana");
    assert_eq!(h.fake.stdin(3).trim(), "/compact");
    assert_eq!(h.fake.stdin(4).trim(), "/compact", "compacted again first");
    assert!(resumed(&h, 4));
    let retry = h.fake.stdin(5);
    assert!(retry.contains("a big job"), "the whole message: {retry}");
    assert!(resumed(&h, 5), "the compacted session");
    let rows = stats_rows(&h);
    let kinds: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        kinds,
        ["turn", "turn", "compact", "compact", "turn"],
        "{rows:?}"
    );
    assert_eq!(rows[2].1, "rate_limited", "{rows:?}");
    assert_eq!(
        (rows[3].1.as_str(), rows[4].1.as_str()),
        ("compacted", "ok")
    );
    assert!(
        !operator_inbox(&b)
            .iter()
            .any(|m| m.body.contains(&format!("#{id}"))),
        "no notice: nothing was lost"
    );
    assert_eq!(page.state()["paused"], serde_json::Value::Null);
}

#[test]
fn still_too_long_after_a_compaction_runs_in_a_fresh_session_with_the_body() {
    let (b, h) = started("ana", &[]);
    h.fake.step(2, PTL);
    h.fake.step(3, "compact_ok 191057 175000");
    h.fake.step(4, PTL);
    let id = operator_send(&b, "ana", "still huge");
    h.fake.wait_count(5);
    wait_drained(&b, "ana");
    assert!(resumed(&h, 4) && h.fake.stdin(4).contains("still huge"));
    assert!(!resumed(&h, 5), "a fresh session: {:?}", h.fake.argv(5));
    assert!(
        h.fake.stdin(5).contains("still huge"),
        "{}",
        h.fake.stdin(5)
    );
    let notice = wait_notice(&b, "the parent notice", |t| t.contains("fresh session"));
    assert!(notice.body.contains(&format!("#{id}")), "{}", notice.body);
    // The next message resumes the new session.
    operator_send(&b, "ana", "after");
    h.fake.wait_count(6);
    wait_drained(&b, "ana");
    assert!(resumed(&h, 6));
}

#[test]
fn a_message_too_long_for_any_session_is_dead_lettered_at_the_limit_and_never_acked_before() {
    let (b, h) = started("ana", &[("HIVE_TURN_MAX_ATTEMPTS", "2")]);
    // Every /compact works; every turn is too long, fresh sessions included.
    h.fake.default_step(&format!(
        r#"case "$(head -c 8 "$dir/inv-$FAKE_N.stdin")" in /compact*) compact_ok 191000 170000 ;; esac
{PTL}"#
    ));
    let id = operator_send(&b, "ana", "way too big");
    let notice = wait_notice(&b, "the dead-letter notice", |t| {
        t.contains("dead-lettered")
    });
    let what = format!("message #{id} from operator");
    for what in [what.as_str(), "2 failed attempts", "prompt is too long"] {
        assert!(notice.body.contains(what), "{what}: {}", notice.body);
    }
    wait_drained(&b, "ana");
    // turn, /compact, turn, fresh turn (1), turn, /compact, turn, fresh turn (2).
    let n = h.fake.count();
    assert_eq!(n, 9, "{:?}", stats_rows(&h));
    let fresh: Vec<usize> = (2..=n).filter(|&i| !resumed(&h, i)).collect();
    assert_eq!(fresh, [5, 9], "only the fallbacks drop --continue");
    for i in fresh {
        assert!(h.fake.stdin(i).contains("way too big"), "{i}");
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 9, "dead-lettered: not looped");
}

#[test]
fn an_operator_new_session_makes_the_retry_carry_the_body() {
    let (b, h) = started("ana", &[("HIVE_RATE_LIMIT_SLEEP_SECS", "300")]);
    let page = AgentPage::of(&h);
    h.fake.step(
        2,
        r#"rate_limit_event $(( $(date +%s) + 2 )); api_error 429 rate_limit "You've hit your session limit · resets 5:03am (UTC)""#,
    );
    operator_send(&b, "ana", "report please");
    // A reset time makes it the pool's usage limit (issue 16).
    page.wait_state("the pause", |s| s["paused"]["reason"] == "usage_limit");
    let r = page.post("/api/new-session", "{}");
    assert_eq!(r.status, 200, "{}", r.body);
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    // The session that saw the prompt is gone: the whole message, not a note.
    assert!(!resumed(&h, 3), "{:?}", h.fake.argv(3));
    let retry = h.fake.stdin(3);
    assert!(
        retry.contains("report please") && !retry.contains("[system] Retry"),
        "{retry}"
    );
}

#[test]
fn an_auto_reset_after_a_long_pause_makes_the_retry_carry_the_body() {
    let (b, h) = started(
        "ana",
        &[
            ("HIVE_CACHE_TTL_SECS", "1"),
            ("HIVE_RATE_LIMIT_SLEEP_SECS", "300"),
        ],
    );
    h.fake.step(2, "ok_turn warm 120000");
    operator_send(&b, "ana", "first");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    // A 429 whose reset is two seconds away: longer than the cache lives.
    h.fake.step(
        3,
        r#"rate_limit_event $(( $(date +%s) + 2 )); api_error 429 rate_limit "You've hit your session limit · resets 5:03am (UTC)""#,
    );
    operator_send(&b, "ana", "second");
    h.fake.wait_count(5);
    wait_drained(&b, "ana");
    assert!(
        h.fake.stdin(4).contains("cache is cold"),
        "{}",
        h.fake.stdin(4)
    );
    assert!(
        resumed(&h, 4),
        "the checkpoint writes notes in the old session"
    );
    assert!(!resumed(&h, 5), "{:?}", h.fake.argv(5));
    let retry = h.fake.stdin(5);
    assert!(
        retry.contains("second") && !retry.contains("[system] Retry"),
        "{retry}"
    );
}

#[test]
fn a_hung_turn_is_stopped_and_counted_but_an_open_tool_call_is_not_a_hang() {
    let (b, h) = started(
        "ana",
        &[
            ("HIVE_TURN_IDLE_SECS", "1"),
            ("HIVE_TURN_MAX_ATTEMPTS", "2"),
        ],
    );
    // Silent after a line, no tool call open: hung, twice, so dead-lettered.
    h.fake
        .step(2, "init; say thinking; sleep 60; ok_turn never");
    h.fake
        .step(3, "init; say thinking; sleep 60; ok_turn never");
    let id = operator_send(&b, "ana", "hang");
    let notice = wait_notice(&b, "the dead-letter notice", |t| {
        t.contains(&format!("#{id}"))
    });
    assert!(
        notice.body.contains("dead-lettered") && notice.body.contains("no output for 1s"),
        "{}",
        notice.body
    );
    wait_drained(&b, "ana");
    // The hung turn printed an assistant line: the resumed retry is a note.
    assert!(
        h.fake.stdin(3).contains("[system] Retry"),
        "{}",
        h.fake.stdin(3)
    );
    let rows = stats_rows(&h);
    assert!(rows[1].1.starts_with("hung"), "{rows:?}");

    // A tool call that runs longer than the idle limit is not a hang.
    h.fake.step(
        4,
        r#"init; tool_call mcp__bash__run '{"cmd":"make"}'; sleep 2.5; tool_done; say built; result_ok built; exit 0"#,
    );
    operator_send(&b, "ana", "build it");
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    assert_eq!(stats_rows(&h).last().unwrap().1, "ok");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 4);
}

#[test]
fn an_api_outage_dead_letters_nothing() {
    let (b, h) = started(
        "ana",
        &[
            ("HIVE_TURN_MAX_ATTEMPTS", "1"),
            ("HIVE_API_BACKOFF_SECS", "1"),
            ("HIVE_API_BACKOFF_MAX_SECS", "1"),
            ("HIVE_API_FAILURES_BEFORE_NOTICE", "9"),
        ],
    );
    let page = AgentPage::of(&h);
    let overloaded =
        r#"api_error 529 server_error "API Error: 529 Overloaded. This is a server-side issue""#;
    for n in 2..=4 {
        h.fake.step(n, overloaded);
    }
    operator_send(&b, "ana", "keep me");
    page.wait_state("the API backoff", |s| {
        s["paused"]["reason"] == "api_backoff"
    });
    h.fake.wait_count(5);
    wait_drained(&b, "ana");
    let rows = stats_rows(&h);
    assert_eq!(rows.last().unwrap().1, "ok", "{rows:?}");
    assert!(
        operator_inbox(&b).is_empty(),
        "three failures with a limit of one, and nothing dead-lettered"
    );
}
