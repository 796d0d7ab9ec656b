//! A requested continue (`request_next_turn`, the `hyperhive-continue`
//! sentinel) in the turn loop (issue 14): it waits out a rate-limit pause, the
//! login park and the broker's budget pause (issue 16) exactly like a broker
//! message and never runs before them — and runs once the budget is raised,
//! with no new mail —, it is dropped when real mail is waiting, and its turns
//! are recorded with stats kind `continue`. Real broker, real `hive serve`,
//! the scripted fake claude; the boot kick is invocation 1.

mod common;

use common::agent_page::AgentPage;
use common::hive::*;
use std::time::Duration;

fn started(agent: &str, env: &[(&str, &str)]) -> (Broker, Harness) {
    let b = Broker::start(&[agent]);
    let h = Harness::start(&b, agent, env);
    h.fake.wait_count(1);
    wait_drained(&b, agent);
    (b, h)
}

fn stats(h: &Harness) -> Vec<(String, String, String)> {
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let mut st = db
        .prepare("SELECT kind, outcome, sender FROM turns ORDER BY id")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// A step that asks for a continue and ends its turn cleanly.
fn requests_continue(h: &Harness) -> String {
    format!(
        "touch {}/hyperhive-continue; ok_turn again",
        h.state_dir().display()
    )
}

#[test]
fn a_rate_limited_continue_waits_out_the_pause_then_runs() {
    let (b, h) = started("ana", &[("HIVE_RATE_LIMIT_SLEEP_SECS", "300")]);
    let page = AgentPage::of(&h);
    h.fake.step(2, &requests_continue(&h));
    // The continue turn is rate limited; the CLI says the limit lifts in 2 s.
    h.fake.step(
        3,
        r#"rate_limit_event $(( $(date +%s) + 2 )); api_error 429 rate_limit "You've hit your session limit · resets 5:03am (UTC)""#,
    );
    operator_send(&b, "ana", "start a loop");
    h.fake.wait_count(3);
    // A reset time makes it the pool's usage limit (issue 16).
    let s = page.wait_state("the pause", |s| s["paused"]["reason"] == "usage_limit");
    assert_eq!(s["inflight"], serde_json::Value::Null, "{s}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        h.fake.count(),
        3,
        "the continue never runs during the pause"
    );
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    // It resumes the session that saw its prompt: the note names it.
    let retry = h.fake.stdin(4);
    assert!(retry.contains("the continue turn"), "{retry}");
    let rows = wait_for(Duration::from_secs(10), "four stats rows", || {
        Some(stats(&h)).filter(|r| r.len() >= 4)
    });
    let kinds: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(kinds, ["turn", "turn", "continue", "continue"], "{rows:?}");
    assert_eq!(rows[2].1, "rate_limited", "{rows:?}");
    assert_eq!((rows[3].1.as_str(), rows[3].2.as_str()), ("ok", "self"));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 4, "one continue, not two");
}

#[test]
fn a_continue_is_dropped_when_mail_is_waiting() {
    let (b, h) = started("ana", &[]);
    h.fake.step(
        2,
        &format!(
            "touch {}/hyperhive-continue; sleep 0.5; ok_turn again",
            h.state_dir().display()
        ),
    );
    operator_send(&b, "ana", "first");
    h.fake.wait_count(2);
    operator_send(&b, "ana", "second");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    assert!(h.fake.stdin(3).contains("second"), "{}", h.fake.stdin(3));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        h.fake.count(),
        3,
        "the mail drove the turn; no continue ran"
    );
    assert!(!h.state_dir().join("hyperhive-continue").exists());
    assert!(
        stats(&h).iter().all(|r| r.0 != "continue"),
        "{:?}",
        stats(&h)
    );
}

#[test]
fn a_continue_waits_out_the_login_park() {
    let (b, h) = started("ana", &[]);
    h.fake.step(2, &requests_continue(&h));
    let fail = r#"api_error 401 authentication_failed "Invalid API key · Fix external API key""#;
    h.fake.step(3, fail);
    h.fake.step(4, fail);
    operator_send(&b, "ana", "start a loop");
    h.fake.wait_count(4);
    let sentinel = h.state_dir().join("hyperhive-needs-login");
    wait_for(Duration::from_secs(10), "the login park", || {
        sentinel.exists().then_some(())
    });
    let page = AgentPage::of(&h);
    let s = page.wait_state("paused for login", |s| s["paused"]["reason"] == "login");
    assert_eq!(s["needs_login"], true, "{s}");
    assert_eq!(s["paused"]["until"], serde_json::Value::Null, "{s}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(h.fake.count(), 4, "nothing runs while parked");
    // The operator logs in: the continue runs.
    std::fs::write(h.dir.path().join("home/.claude/.credentials.json"), "{}").unwrap();
    h.fake.wait_count(5);
    wait_drained(&b, "ana");
    let rows = wait_for(Duration::from_secs(10), "five stats rows", || {
        Some(stats(&h)).filter(|r| r.len() >= 5)
    });
    let kinds: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        kinds,
        ["turn", "turn", "continue", "continue", "continue"],
        "{rows:?}"
    );
    assert_eq!(rows[4].1, "ok", "{rows:?}");
    assert!(!sentinel.exists());
}

/// The broker's budget pause begins with a continue pending: the continue
/// waits (no peek loop, no run), and when the operator raises the budget it
/// runs with no new message — the broker answers the harness's parked
/// `recv_next` that the pause ended.
#[test]
fn a_continue_waiting_on_a_budget_pause_runs_once_the_budget_is_raised() {
    // Every fake run costs $0.014 (`ok_turn`): the kick and the turn that
    // asks for the continue reach the day's $0.02.
    let b =
        Broker::start_config(r#"{"agents":[{"name":"ana","budget":{"usd":0.02,"per":"day"}}]}"#);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let page = AgentPage::of(&h);
    h.fake.step(2, &requests_continue(&h));
    operator_send(&b, "ana", "start a loop");
    h.fake.wait_count(2);
    page.wait_budget_pause("budget reached");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        h.fake.count(),
        2,
        "the continue never runs during the pause"
    );
    assert_eq!(agent_row(&b, "ana").unread, 0, "no mail is waiting");

    budget_set(&b.host_socket(), &["ana", "--usd", "1"]);
    h.fake.wait_count(3);
    let rows = wait_for(Duration::from_secs(10), "three stats rows", || {
        Some(stats(&h)).filter(|r| r.len() >= 3)
    });
    assert_eq!(
        (rows[2].0.as_str(), rows[2].1.as_str(), rows[2].2.as_str()),
        ("continue", "ok", "self"),
        "{rows:?}"
    );
    page.wait_state("the pause to end", |s| s["paused"].is_null());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 3, "one continue, not two");
}
