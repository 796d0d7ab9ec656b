//! What the agent page shows of the turn loop (issue 14): `/api/state.paused`
//! (`{reason, until, detail}` for every pause and the login park, with
//! `rate_limited`/`rate_limited_until` kept), `retrying` while the CLI
//! retries an API call inside a running turn (the "rate limited, retrying"
//! badge), and the status line and unread count the broker pushes (issue 13),
//! idle and mid-turn. Real broker, real `hive serve`, the scripted fake claude.

mod common;

use common::agent_page::AgentPage;
use common::hive::*;
use hyperhive::proto::cmd::SetStatus;
use serde_json::Value;

fn started(agent: &str, env: &[(&str, &str)]) -> (Broker, Harness) {
    let b = Broker::start(&[agent]);
    let h = Harness::start(&b, agent, env);
    h.fake.wait_count(1);
    wait_drained(&b, agent);
    (b, h)
}

#[test]
fn a_retrying_cli_shows_on_the_page_until_the_turn_ends() {
    let (b, h) = started("ana", &[]);
    let page = AgentPage::of(&h);
    assert_eq!(page.state()["retrying"], Value::Null);
    // The CLI retries a 429 inside the turn, then the turn succeeds.
    h.fake.step(
        2,
        "init; api_retry 429 rate_limit; sleep 1.5; say fine; result_ok fine; exit 0",
    );
    operator_send(&b, "ana", "go");
    let s = page.wait_state("the retrying badge", |s| s["retrying"].is_object());
    let r = &s["retrying"];
    assert_eq!(r["reason"], "rate_limit", "{s}");
    assert_eq!(
        (r["attempt"].as_u64(), r["max_retries"].as_u64()),
        (Some(1), Some(2))
    );
    assert_eq!(r["error_status"], 429);
    assert_eq!(
        s["paused"],
        Value::Null,
        "retrying inside a turn is not a pause"
    );
    wait_drained(&b, "ana");
    let s = page.wait_state("the badge to clear", |s| {
        s["retrying"].is_null() && s["turn_state"] == "idle"
    });
    assert_eq!(s["last_outcome"], "ok");
}

#[test]
fn every_pause_has_a_reason_an_end_and_a_detail() {
    let (b, h) = started(
        "ana",
        &[
            ("HIVE_RATE_LIMIT_SLEEP_SECS", "2"),
            ("HIVE_API_BACKOFF_SECS", "2"),
        ],
    );
    let page = AgentPage::of(&h);
    assert_eq!(page.state()["paused"], Value::Null);
    h.fake.step(
        2,
        r#"api_error 429 rate_limit "API Error: Request rejected (429) · slow down""#,
    );
    h.fake.step(
        3,
        r#"api_error 500 server_error "API Error: 500 Internal server error""#,
    );
    let id = operator_send(&b, "ana", "patience");
    let s = page.wait_state("the rate-limit pause", |s| {
        s["paused"]["reason"] == "rate_limit"
    });
    let until = s["paused"]["until"].as_i64().expect("until");
    assert_eq!(s["rate_limited"], true);
    assert_eq!(s["rate_limited_until"].as_i64(), Some(until), "{s}");
    assert!(
        s["paused"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains(&format!("#{id}"))),
        "{s}"
    );
    let s = page.wait_state("the API backoff", |s| {
        s["paused"]["reason"] == "api_backoff"
    });
    assert_eq!(s["rate_limited"], false, "{s}");
    assert!(s["paused"]["until"].is_i64(), "{s}");
    wait_drained(&b, "ana");
    let s = page.wait_state("no pause", |s| s["paused"].is_null());
    assert_eq!(s["last_outcome"], "ok");
}

#[test]
fn a_claude_that_cannot_start_is_a_pause_named_start_failed() {
    let (_b, h) = {
        let b = Broker::start(&["ana"]);
        let h = Harness::start(&b, "ana", &[("HIVE_CLAUDE_BIN", "/nonexistent/claude")]);
        (b, h)
    };
    let page = AgentPage::of(&h);
    let s = page.wait_state("the start pause", |s| {
        s["paused"]["reason"] == "start_failed"
    });
    assert!(s["paused"]["until"].is_i64(), "{s}");
    assert_eq!(s["needs_login"], false);
}

#[test]
fn the_status_line_and_the_unread_count_reach_the_page_idle_and_mid_turn() {
    let (b, h) = started("ana", &[]);
    let page = AgentPage::of(&h);
    // Idle: the harness sits in recv_next; set_status (what the agent's own
    // `hive mcp` sends) reaches the page.
    ok(
        &mut b.agent("ana"),
        SetStatus {
            text: "reading the logs".into(),
        },
    );
    page.wait_state("the status while idle", |s| {
        s["status_text"] == "reading the logs"
    });
    // Mid-turn: the turn holds the inflight row until the test releases it.
    h.fake.step(
        2,
        r#"init; say working; while [ ! -f "$dir/release" ]; do sleep 0.05; done; result_ok done; exit 0"#,
    );
    operator_send(&b, "ana", "long job");
    page.wait_state("the turn", |s| s["turn_state"] == "thinking");
    h.fake.wait_count(2);
    ok(
        &mut b.agent("ana"),
        SetStatus {
            text: "halfway".into(),
        },
    );
    operator_send(&b, "ana", "next job");
    let s = page.wait_state("the status and the new mail mid-turn", |s| {
        s["status_text"] == "halfway" && s["unread"] == 1
    });
    assert_eq!(s["turn_state"], "thinking", "{s}");
    assert_eq!(h.fake.count(), 2, "still the first turn");
    std::fs::write(h.fake.dir.join("release"), "").unwrap();
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    page.wait_state("the drained inbox", |s| {
        s["unread"] == 0 && s["turn_state"] == "idle"
    });
    // Cleared, too.
    ok(&mut b.agent("ana"), SetStatus { text: "".into() });
    page.wait_state("the cleared status", |s| s["status_text"] == "");
}
