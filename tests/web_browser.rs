//! The page in a real browser: headless Chromium driven over WebDriver
//! (chromedriver) with a minimal client on ureq. The page must load, show a turn
//! emitted on the bus live, send `/model sonnet` from its input box, and fit a
//! 390 px wide screen without horizontal scrolling. A screenshot is saved under
//! `target/test-artifacts/`. Without chromium and chromedriver the test skips
//! loudly, or fails under `HIVE_REQUIRE_REAL_CLAUDE=1` (as in CI).

mod common;

use common::browser::{artifacts, browser, Driver, T};
use common::hive::wait_for;
use common::web::Web;
use hyperhive::harness::bus::{LiveEvent, TurnState};
use hyperhive::harness::control::Control;
use serde_json::json;
use std::io::Write;

/// A turn like the real CLI streams it: text, a tool call and its result.
fn emit_turn(web: &Web) {
    let bus = &web.bus;
    bus.set_turn_state(TurnState::Thinking);
    bus.emit(LiveEvent::TurnStart {
        from: "operator".into(),
        body: "What is in notes.md? Also: https://example.com/a/very/long/url/that/must/wrap/on/a/phone/screen/without/scrolling/sideways".into(),
        unread: 1,
        message_id: Some(7),
    });
    bus.emit(LiveEvent::Stream {
        value: json!({"type":"system","subtype":"init","session_id":"5f2c9a1e-0000","model":"claude-haiku-4-5"}),
    });
    bus.emit(LiveEvent::Stream {
        value: json!({"type":"assistant","message":{"content":[
            {"type":"text","text":"Let me look at the notes first."},
            {"type":"tool_use","id":"tu_1","name":"Read","input":{"file_path":"/state/notes.md","limit":200}}
        ]}}),
    });
    bus.emit(LiveEvent::Stream {
        value: json!({"type":"user","message":{"content":[
            {"type":"tool_result","tool_use_id":"tu_1","content":"# Notes\n- deploy on friday\n- a_very_long_line_without_any_spaces_".to_string() + &"x".repeat(300)}
        ]}}),
    });
    bus.emit(LiveEvent::Stream {
        value: json!({"type":"assistant","message":{"content":[
            {"type":"text","text":"The answer is 42. The notes say to deploy on Friday.\n\n```\ncargo build --release && ./target/release/hive serve --state-dir /state --run-dir /run/hive\n```"}
        ]}}),
    });
    bus.note("stderr: a warning from claude");
    bus.emit(LiveEvent::Stream {
        value: json!({"type":"result","subtype":"success","is_error":false,"num_turns":2,
            "total_cost_usd":0.0123,"usage":{"input_tokens":1200,"output_tokens":85}}),
    });
    bus.emit(LiveEvent::TurnEnd {
        ok: true,
        note: String::new(),
        outcome: "ok".into(),
        duration_ms: 8400,
        decision: Some("ack".into()),
    });
    bus.update(|s| {
        s.context_tokens = Some(84_000);
        s.unread = 1;
        s.online = true;
        s.status_text = "reviewing the deploy notes".into();
    });
    bus.set_turn_state(TurnState::Idle);
}

#[test]
fn the_page_follows_a_turn_live_takes_commands_and_fits_a_phone() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    // The page's /model is kept by the broker: one serves ana.
    let b = common::hive::Broker::start(&["ana"]);
    b.agent("ana");
    let web = Web::start_with(|_, s| s.socket = b.agent_socket("ana"));
    std::fs::write(
        web.state_dir().join("hyperhive-dashboard-links.json"),
        r#"[{"label":"Stats","icon":"📊","url":"http://localhost:9001/stats"}]"#,
    )
    .unwrap();
    web.bus.note("harness started");
    let d = Driver::start(&chromium, &chromedriver);
    common::web::browser_login(&d, &web.page());
    wait_for(T, "the page to connect to /events", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    let chat = || d.js("return document.getElementById('chat').innerText");
    // `live` is set when the stream opens (its headers); the replay follows.
    wait_for(T, "the replayed history", || {
        chat()
            .as_str()
            .is_some_and(|t| t.contains("harness started"))
            .then_some(())
    });

    emit_turn(&web);
    wait_for(T, "the turn's assistant text to appear live", || {
        chat()
            .as_str()
            .is_some_and(|t| t.contains("The answer is 42") && t.contains("ok"))
            .then_some(())
    });
    let text = chat().as_str().unwrap().to_string();
    for want in [
        "What is in notes.md",
        "Read",
        "file_path",
        "result · 3 lines",
        "stderr: a warning",
    ] {
        assert!(
            text.contains(want),
            "{want:?} missing from the chat:\n{text}"
        );
    }
    assert_eq!(
        text.matches("The answer is 42").count(),
        1,
        "rendered once: {text}"
    );

    d.type_into("#input", "/model sonnet\u{E007}");
    // The page tells the turn loop; here the test plays the loop, the one
    // writer of the bus state.
    let c = web
        .control
        .recv_timeout(T)
        .expect("/model sonnet to reach the loop");
    assert_eq!(c, Control::Model("sonnet".into()));
    web.bus.update(|s| s.model = "sonnet".into());
    wait_for(T, "the header to show the model", || {
        d.js("return document.getElementById('model').textContent")
            .as_str()
            .is_some_and(|m| m.starts_with("sonnet"))
            .then_some(())
    });

    let sizes = d.js(
        "const e = document.documentElement, c = document.getElementById('scroller');
         return [e.scrollWidth, e.clientWidth, c.scrollWidth, c.clientWidth, window.innerWidth];",
    );
    let n = |i: usize| sizes[i].as_u64().unwrap();
    assert!(n(4) <= 420, "the window is not phone-sized: {sizes}");
    assert!(
        n(0) <= n(1),
        "the page scrolls sideways at {} px: {sizes}",
        n(4)
    );
    assert!(
        n(2) <= n(3),
        "the chat scrolls sideways at {} px: {sizes}",
        n(4)
    );

    let png = d.screenshot();
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    let path = artifacts().join("web-390px.png");
    std::fs::write(&path, png).unwrap();
    let _ = writeln!(std::io::stderr(), "screenshot: {}", path.display());
}

#[test]
fn a_hive_wake_makes_a_turn_appear_live_on_a_running_harness() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    use common::hive::{run_hive, wait_drained, Broker, Harness};
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let page = common::web::Page::of(&h.state_dir());
    h.fake.step(
        2,
        r#"init; say "The deploy finished without errors"; result_ok done; exit 0"#,
    );
    let d = Driver::start(&chromium, &chromedriver);
    common::web::browser_login(&d, &page);
    wait_for(T, "the page to connect", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    let sock = b.agent_socket("ana");
    let (code, _, err) = run_hive(
        &["wake", "--from", "deploybot", "--body", "deploy 41 is done"],
        None,
        &[("HIVE_SOCKET", sock.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{err}");
    wait_for(T, "the woken turn to appear live", || {
        d.js("return document.getElementById('chat').innerText")
            .as_str()
            .is_some_and(|t| {
                t.contains("deploy 41 is done") && t.contains("The deploy finished without errors")
            })
            .then_some(())
    });
    d.type_into("#input", "/model sonnet\u{E007}");
    wait_for(T, "/model sonnet to reach the harness", || {
        page.get("/api/state")
            .json()
            .get("model")
            .filter(|m| *m == "sonnet")
            .map(|_| ())
    });
    let png = d.screenshot();
    std::fs::write(artifacts().join("serve-390px.png"), png).unwrap();
}
