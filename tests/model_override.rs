//! The model has one owner at a time (issue 39, item 3), end to end under
//! `hive up` with the fake claude: the page's `/model NAME` is an override
//! the broker keeps, which the next turn runs with, `hive agents` and the
//! page show as such; claude itself cannot set it on its socket (isolated);
//! a new configured model (the fleet entry's `model`, applied by `hive
//! update`) clears it, and the page says so; `/model --fleet` ends it.

mod common;

use common::hive::{ok, refused, run_hive, wait_for};
use common::up::Up;
use hyperhive::proto::cmd::{ModelOverride, Send};
use serde_json::Value;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// The `--model` of the fake claude's `n`th run.
fn model_of(up: &Up, n: usize) -> String {
    let argv = up.fake("ana").argv(n);
    let i = argv.iter().position(|a| a == "--model").expect("--model");
    argv[i + 1].clone()
}

fn send(up: &Up, body: &str) {
    ok(
        &mut up.host(),
        Send {
            to: "ana".into(),
            body: body.into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
}

fn agents_json(up: &Up) -> Value {
    let sock = up.data().join("run/host.sock").display().to_string();
    let (code, out, err) = run_hive(&["agents", "--json", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(out.trim()).unwrap()
}

#[test]
fn the_pages_model_is_an_override_the_configured_one_clears() {
    let up = Up::start(
        r#"{"agents": [{"name": "ana", "model": "sonnet", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}]}"#,
        &["ana"],
    );
    let fake = up.fake("ana");
    fake.wait_count(1);
    assert_eq!(model_of(&up, 1), "sonnet", "the configured one");

    // The page chooses opus: the next turn runs it, and it shows as such.
    let page = up.page("ana");
    let r = page.post("/api/model", r#"{"model":"opus"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    send(&up, "first");
    fake.wait_count(2);
    assert_eq!(model_of(&up, 2), "opus");
    let row = agents_json(&up)["agents"][0].clone();
    assert_eq!(row["model_override"], "opus", "{row}");
    let sock = up.data().join("run/host.sock").display().to_string();
    let (_, text, _) = run_hive(&["agents", "--socket", &sock], None, &[]);
    assert!(text.contains("[model opus, set on its page]"), "{text}");
    let state = page.get("/api/state").json();
    assert_eq!(
        (
            state["model_override"].clone(),
            state["model_default"].clone()
        ),
        (Value::from("opus"), Value::from("sonnet"))
    );

    // claude, on the agent's socket, cannot set it where the harness has a
    // credential (isolated hive up).
    if up.log().contains("hive up: agents are isolated (") {
        let e = refused(
            &mut up.agent("ana"),
            ModelOverride {
                default: "sonnet".into(),
                set: Some("haiku".into()),
                clear: false,
            },
        );
        assert!(e.contains("model"), "{e}");
        assert_eq!(agents_json(&up)["agents"][0]["model_override"], "opus");
    }

    // A new configured model, applied by `hive update`, clears it.
    let path = up.fleet_file();
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["agents"][0]["model"] = "haiku".into();
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let (code, out, err) = run_hive(&["update", "ana", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let n = wait_for(T, "ana's restart onto haiku", || {
        let n = fake.count();
        (n >= 3).then_some(n)
    });
    assert_eq!(
        model_of(&up, n),
        "haiku",
        "the new configured one, not opus"
    );
    wait_for(T, "the override to be gone", || {
        agents_json(&up)["agents"][0]["model_override"]
            .is_null()
            .then_some(())
    });
    // The page says so: its live stream replays the note from its start.
    let page = up.page("ana");
    let token = page.token.clone().unwrap();
    let mut sse = common::web::Sse::connect(
        page.port,
        "/agent/ana/events",
        &[("X-Hive-Token", token.as_str())],
    );
    assert_eq!(sse.status, 200);
    let note = "the configured model is now haiku: the page's override opus is cleared";
    let deadline = std::time::Instant::now() + T;
    loop {
        let e = sse.next(Duration::from_secs(5));
        if e.as_ref().is_some_and(|e| e.data.contains(note)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no note {note:?} on the page"
        );
        if e.is_none() {
            sse = common::web::Sse::connect(
                page.port,
                "/agent/ana/events",
                &[("X-Hive-Token", token.as_str())],
            );
        }
    }
    assert!(up.log().contains("the page's override opus is cleared"));
    assert!(page.get("/api/state").json()["model_override"].is_null());
}
