//! A hive in a swarm whose homeserver is away, seen by its operator (issue
//! 17): `hive up` starts anyway (an unreachable homeserver is not a refused
//! login), mail to another hive waits in the outbox, and the bridge's state —
//! backing off since when, the outbox depth, the error — shows in `hive
//! agents` and on the dashboard in headless Chromium, while the local agent
//! keeps working. No homeserver is needed: the fleet file names a closed port.

mod common;

use common::browser::{browser, Driver, T};
use common::hive::{ok, run_hive, wait_for, TempDir};
use common::up::{Launch, Up};
use hyperhive::proto::cmd::{Agents, AgentsReply, Send};
use hyperhive::proto::swarm::BridgeState;
use serde_json::json;
use std::time::Duration;

#[test]
fn the_operator_sees_the_bridge_backing_off_with_its_outbox() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let dir = TempDir::new("swarm-dash");
    let password = dir.path().join("matrix-password");
    std::fs::write(&password, "pw-one\n").unwrap();
    // A port nothing listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let fleet = json!({
        "hive_name": "one",
        "agents": [{"name": "a", "env": {"FAKE_CLAUDE_DIR": "@FAKE(a)"}}],
        "matrix": {
            "homeserver": format!("http://127.0.0.1:{port}"),
            "user_id": "@hive-one-bridge:hive.test",
            "password_file": password,
            "room": "#swarm:hive.test",
            "peers": {"two": "@hive-two-bridge:hive.test"},
        },
    });
    let up = Up::launch(
        &fleet.to_string(),
        &["a"],
        Launch {
            env: vec![
                ("HIVE_BRIDGE_BACKOFF_MS".into(), "100".into()),
                ("HIVE_BRIDGE_BACKOFF_MAX_MS".into(), "1000".into()),
            ],
            ..Launch::default()
        },
    );
    assert!(
        up.log()
            .contains("the Matrix homeserver cannot be reached now"),
        "{}",
        up.log()
    );
    ok(
        &mut up.host(),
        Send {
            to: "b@two".into(),
            body: "waits for the homeserver".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    let row = wait_for(Duration::from_secs(30), "the bridge backing off", || {
        let r: AgentsReply = up.host().call(&Agents {}).unwrap();
        r.bridge
            .filter(|b| b.state == BridgeState::BackingOff && b.outbox == 1)
    });
    assert!(row.detail.is_some(), "{row:?}");
    let sock = up.data().join("run/host.sock");
    let (code, out, err) = run_hive(&["agents", "--socket", sock.to_str().unwrap()], None, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("bridge: backing off since "), "{out}");
    assert!(out.contains(", outbox 1"), "{out}");
    assert!(!out.contains("pw-one"), "{out}");

    // The dashboard shows the same line above the agents.
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    wait_for(T, "the dashboard to go live", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    let line = wait_for(T, "the bridge's line", || {
        let text = d.js("return document.getElementById('bridge').textContent");
        text.as_str()
            .filter(|t| t.starts_with("Matrix bridge: backing off since "))
            .map(str::to_string)
    });
    assert!(line.contains("· outbox 1"), "{line}");
    assert!(line.contains("127.0.0.1"), "the error says where: {line}");

    // The local agent works meanwhile.
    up.fake("a").default_step("ok_turn local");
    ok(
        &mut up.host(),
        Send {
            to: "a".into(),
            body: "local work goes on".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    up.wait_prompt("a", "local work goes on", 1);
}
