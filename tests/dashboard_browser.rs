//! The operator dashboard of `hive up` in headless Chromium at 390 px: a
//! question an agent asks shows with its options, a click answers it, and the
//! answer reaches the agent's next prompt; a multi-choice question is answered
//! with checkboxes. Also the dashboard's JSON API without a browser.

mod common;

use common::browser::{artifacts, browser, Driver, T};
use common::hive::{ok, wait_for};
use common::up::Up;
use hyperhive::proto::cmd::{Ask, RequestSpawn};
use serde_json::Value;
use std::io::Write;

const FLEET: &str = r#"{"agents": [
  {"name": "boss", "tool_groups": ["messaging", "meta", "inbox", "lifecycle"],
   "env": {"FAKE_CLAUDE_DIR": "@FAKE(boss)"}},
  {"name": "kid", "parent": "boss", "env": {"FAKE_CLAUDE_DIR": "@FAKE(kid)"}}
]}"#;

fn ask(up: &Up, question: &str, options: &[&str], multi: bool) -> i64 {
    let r = ok(
        &mut up.agent("boss"),
        Ask {
            question: question.into(),
            options: options.iter().map(|o| o.to_string()).collect(),
            multi,
            ttl_seconds: None,
            to: None,
        },
    );
    r["id"].as_i64().unwrap()
}

#[test]
fn a_question_is_answered_by_clicking_an_option() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let up = Up::start(FLEET, &["boss", "kid"]);
    let one = ask(&up, "Which colour for the logo?", &["red", "blue"], false);
    let many = ask(&up, "Which days?", &["mon", "tue", "wed"], true);

    // The one-time link hive up printed logs the browser in.
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    wait_for(T, "the dashboard to go live", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    wait_for(T, "both agent cards", || {
        (d.js("return document.querySelectorAll('.card.agent').length") == 2).then_some(())
    });
    d.click("#tabs button[data-tab=questions]");
    wait_for(T, "the question's option buttons", || {
        (d.js(&format!(
            "return document.querySelectorAll('button.opt[data-q=\"{one}\"]').length"
        )) == 2)
            .then_some(())
    });
    d.click(&format!(
        "button.opt[data-q=\"{one}\"][data-answer=\"blue\"]"
    ));
    up.wait_prompt("boss", &format!("[answer to question #{one}]"), 1);
    let fake = up.fake("boss");
    let prompt = (1..=fake.count())
        .map(|n| fake.stdin(n))
        .find(|s| s.contains(&format!("[answer to question #{one}]")))
        .unwrap();
    assert!(prompt.contains("operator answered: blue"), "{prompt}");

    // The multi-choice one: two checkboxes, then send.
    wait_for(T, "the answered question to go away", || {
        (d.js(&format!(
            "return document.querySelectorAll('[data-question=\"{one}\"]').length"
        )) == 0)
            .then_some(())
    });
    d.click(&format!("input[data-q=\"{many}\"][value=\"mon\"]"));
    d.click(&format!("input[data-q=\"{many}\"][value=\"wed\"]"));
    d.click(&format!("button[data-multi=\"{many}\"]"));
    up.wait_prompt("boss", "operator answered: mon, wed", 1);

    let sizes = d.js(
        "const e = document.documentElement; return [e.scrollWidth, e.clientWidth, window.innerWidth];",
    );
    let n = |i: usize| sizes[i].as_u64().unwrap();
    assert!(n(2) <= 420, "not phone-sized: {sizes}");
    assert!(n(0) <= n(1), "the dashboard scrolls sideways: {sizes}");
    d.click("#tabs button[data-tab=agents]");
    let png = d.screenshot();
    let path = artifacts().join("dashboard-390px.png");
    std::fs::write(&path, png).unwrap();
    let _ = writeln!(std::io::stderr(), "screenshot: {}", path.display());

    // A card's page link goes through the dashboard, which logs the browser in
    // to the agent's own page (its cookie for this host) and sends it there.
    let kid_port = up.state("kid").unwrap().port.unwrap();
    let link = d.js(
        "return document.querySelector('.card.agent[data-agent=kid] a[href^=\"/agent/\"]').getAttribute('href')",
    );
    assert_eq!(link, "/agent/kid/open");
    d.goto(&format!(
        "{}{}",
        up.dashboard().base,
        link.as_str().unwrap()
    ));
    wait_for(T, "kid's page to load logged in and go live", || {
        let v = d.js("return location.port + ' ' + (document.body.dataset.live === '1')");
        (v == format!("{kid_port} true").as_str()).then_some(())
    });
}

#[test]
fn the_json_api_shows_the_hive_and_acts_as_the_operator() {
    let up = Up::start(FLEET, &["boss", "kid"]);
    let dash = up.dashboard();
    let get = |path: &str| dash.get(path).unwrap();
    let post = |path: &str, body: Value| dash.post(path, body);
    let h = get("/api/hive");
    let names: Vec<&str> = h["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["boss", "kid"]);
    let kid = &h["agents"][1];
    assert_eq!(kid["supervision"]["state"], "running", "{kid}");
    assert!(kid["url"]
        .as_str()
        .unwrap()
        .starts_with("http://127.0.0.1:"));
    assert_eq!(kid["live"]["needs_login"], false, "{kid}");

    // An approval through the API.
    let r = ok(
        &mut up.agent("boss"),
        RequestSpawn {
            name: "kid2".into(),
        },
    );
    let id = r["id"].as_i64().unwrap();
    let h = get("/api/hive");
    assert_eq!(h["approvals"][0]["id"], id);
    post("/api/approve", serde_json::json!({ "id": id })).unwrap();
    up.wait_running("kid2");

    // The permissions tab: a change is written and the agent restarts.
    post(
        "/api/permissions",
        serde_json::json!({"agent": "kid", "tool_groups": ["messaging", "scheduling"], "capabilities": []}),
    )
    .unwrap();
    wait_for(T, "kid to run with its new groups", || {
        let s = up.state("kid")?;
        (s.state == "running" && s.applied.tool_groups == ["messaging", "scheduling"]).then_some(())
    });
    let cfg = hyperhive::config::HiveConfig::load(&up.fleet_file()).unwrap();
    assert_eq!(
        cfg.agent("kid").unwrap().tool_groups,
        ["messaging", "scheduling"]
    );
    let e = post(
        "/api/permissions",
        serde_json::json!({"agent": "kid", "tool_groups": ["root"], "capabilities": []}),
    )
    .unwrap_err();
    assert_eq!(e.0, 400);
    assert!(e.1.contains("unknown tool group"), "{}", e.1);

    // The inbox with a reply.
    post(
        "/api/send",
        serde_json::json!({"to": "kid", "body": "hello from the dashboard"}),
    )
    .unwrap();
    up.wait_prompt("kid", "hello from the dashboard", 1);

    // A blank or over-long message is refused with the reason, and nothing is sent.
    let e = post("/api/send", serde_json::json!({"to": "kid", "body": "  "})).unwrap_err();
    assert_eq!(e.0, 400);
    assert!(e.1.contains("empty"), "{}", e.1);
    let long = "x".repeat(hyperhive::proto::limits::MAX_BODY + 1);
    let e = post("/api/send", serde_json::json!({"to": "kid", "body": long})).unwrap_err();
    assert!(
        e.1.contains(&hyperhive::proto::limits::MAX_BODY.to_string()),
        "{}",
        e.1
    );

    // Agent icons come through the dashboard (with the agent's token), and may
    // not run anything in the dashboard's origin.
    let icon = ureq::get(&format!("{}/agent/kid/icon", dash.base))
        .set("X-Hive-Token", &dash.token)
        .call()
        .unwrap();
    assert_eq!(icon.content_type(), "image/svg+xml");
    assert!(icon
        .header("Content-Security-Policy")
        .is_some_and(|c| c.contains("sandbox")));
    assert!(icon.into_string().unwrap().starts_with("<svg"));
}
