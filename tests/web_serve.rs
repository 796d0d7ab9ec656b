//! The web UI of a running `hive serve` (real broker, real harness, scripted fake
//! claude): `/api/state` follows the turn loop, the SSE stream carries a turn in
//! order, and the control endpoints reach the loop — send, model, new session,
//! compact (queued behind a running turn) and interrupt.

mod common;

use common::hive::*;
use common::web::Page;
use serde_json::Value;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

fn state(p: &Page) -> Value {
    p.get("/api/state").json()
}

/// A harness whose page is found as a script finds it: the port and the
/// generated token from its state dir.
fn started(agent: &str) -> (Broker, Harness, Page) {
    let b = Broker::start(&[agent]);
    let h = Harness::start(&b, agent, &[]);
    h.fake.wait_count(1);
    wait_drained(&b, agent);
    let p = Page::of(&h.state_dir());
    assert!(p.token.is_some(), "hive serve wrote no web-token");
    (b, h, p)
}

#[test]
fn state_follows_the_turn_loop() {
    let (b, h, p) = started("ana");
    let s = state(&p);
    assert_eq!(s["label"], "ana");
    assert_eq!(s["model"], "haiku");
    assert_eq!(s["online"], true);
    wait_for(T, "idle", || {
        (state(&p)["turn_state"] == "idle").then_some(())
    });
    h.fake.step(
        2,
        "init; say working 50000; sleep 1.5; result_ok done; exit 0",
    );
    operator_send(&b, "ana", "think hard");
    wait_for(T, "thinking", || {
        let s = state(&p);
        (s["turn_state"] == "thinking" && s["inflight"].is_number()).then_some(())
    });
    wait_for(T, "idle again", || {
        let s = state(&p);
        (s["turn_state"] == "idle" && s["last_outcome"] == "ok").then_some(s)
    });
    let s = state(&p);
    assert_eq!(s["context_tokens"], 50000);
    assert_eq!(s["context_window_tokens"], 200000);
    assert_eq!(s["context_percent"], 25.0);
    assert!(s["session_id"].as_str().is_some_and(|v| !v.is_empty()));
}

#[test]
fn sse_carries_a_turn_in_order() {
    let (b, h, p) = started("ana");
    let mut sse = p.sse("/events", &[]);
    assert_eq!(sse.status, 200);
    // The replayed history (the kick turn) is skipped until our turn starts.
    h.fake
        .step(2, r#"init; say "hello operator"; result_ok done; exit 0"#);
    let sock = b.agent_socket("ana");
    let (code, _, err) = run_hive(
        &["wake", "--from", "cron", "--body", "the nightly job"],
        None,
        &[("HIVE_SOCKET", sock.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{err}");
    let mut seen = Vec::new();
    let mut last_id = 0;
    wait_for(T, "turn_end of the woken turn", || {
        let ev = sse.next(Duration::from_secs(5))?;
        let id = ev.id.unwrap_or(0);
        assert!(id > last_id, "ids increase");
        last_id = id;
        let v = ev.json();
        let ty = v["type"].as_str().unwrap_or("").to_string();
        let is_ours = v["type"] == "turn_start" && v["body"] == "the nightly job";
        if is_ours || !seen.is_empty() {
            seen.push(v.clone());
        }
        (!seen.is_empty() && ty == "turn_end").then_some(())
    });
    let types: Vec<&str> = seen.iter().map(|v| v["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"turn_start"));
    assert_eq!(types.last(), Some(&"turn_end"));
    let stream_pos = types
        .iter()
        .position(|t| *t == "stream")
        .expect("stream events");
    assert!(seen[stream_pos..]
        .iter()
        .any(|v| v["value"]["type"] == "assistant"));
    assert_eq!(seen[0]["from"], "cron");
    assert_eq!(seen.last().unwrap()["ok"], true);
}

#[test]
fn control_endpoints_reach_the_loop() {
    let (b, h, p) = started("ana");
    // send: a message from the operator through the broker.
    let r = p.post("/api/send", r#"{"body":"from the page"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    assert!(h.fake.stdin(2).contains("from the page"));
    // model: the next turn uses it.
    let r = p.post("/api/model", r#"{"model":"sonnet"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    wait_for(T, "the loop to show the model", || {
        (state(&p)["model"] == "sonnet").then_some(())
    });
    // new-session: the next invocation drops --continue, the one after resumes.
    assert_eq!(p.post("/api/new-session", "{}").status, 200);
    operator_send(&b, "ana", "fresh");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    let argv = h.fake.argv(3);
    assert!(
        argv.windows(2).any(|w| w == ["--model", "sonnet"]),
        "{argv:?}"
    );
    assert!(!argv.contains(&"--continue".to_string()));
    operator_send(&b, "ana", "again");
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    assert!(h.fake.argv(4).contains(&"--continue".to_string()));
}

#[test]
fn compact_is_queued_behind_a_running_turn_and_interrupt_stops_one() {
    let (b, h, p) = started("ana");
    h.fake
        .step(2, "init; say slow; sleep 1.5; result_ok done; exit 0");
    h.fake.step(3, "compact_ok 50000 1000");
    operator_send(&b, "ana", "slow one");
    h.fake.wait_count(2);
    assert_eq!(p.post("/api/compact", "{}").status, 200);
    // The compaction waits for the turn: never two claude processes at once.
    h.fake.wait_count(3);
    assert_eq!(h.fake.stdin(3).trim(), "/compact");
    wait_for(T, "idle", || {
        (state(&p)["turn_state"] == "idle").then_some(())
    });

    // Interrupt: SIGINT reaches claude, which reports aborted_tools.
    h.fake.step(4, "trap aborted INT; init; sleep 60 & wait $!");
    operator_send(&b, "ana", "stop me");
    h.fake.wait_count(4);
    wait_for(T, "thinking", || {
        (state(&p)["turn_state"] == "thinking").then_some(())
    });
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(p.post("/api/interrupt", "{}").status, 200);
    wait_drained(&b, "ana");
    let s = wait_for(T, "the interrupted outcome", || {
        let s = state(&p);
        s["last_outcome"]
            .as_str()
            .is_some_and(|o| o.starts_with("interrupted"))
            .then_some(s)
    });
    assert_eq!(s["turn_state"], "idle");
}
