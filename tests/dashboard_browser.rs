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

    // A card's page link stays on the hive's one origin, where the
    // dashboard's login is the page's too.
    let kid_port = up.dashboard().port;
    let link = d.js(
        "return document.querySelector('.card.agent[data-agent=kid] a[href^=\"/agent/\"]').getAttribute('href')",
    );
    assert_eq!(link, "/agent/kid/");
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
    // Its page is on the hive's one origin.
    assert_eq!(kid["url"], "/agent/kid/");
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

fn badge(d: &Driver, agent: &str, kind: &str) -> Option<String> {
    d.text_of(&format!(
        ".card.agent[data-agent=\"{agent}\"] [data-badge=\"{kind}\"]"
    ))
}

const BADGE_FLEET: &str = r#"{"agents": [
  {"name": "boss", "tool_groups": ["messaging", "meta", "inbox", "lifecycle"],
   "env": {"FAKE_CLAUDE_DIR": "@FAKE(boss)", "ANTHROPIC_API_KEY": "sk-test", "HIVE_KILL_GRACE_MS": "2500"}},
  {"name": "kid", "parent": "boss",
   "env": {"FAKE_CLAUDE_DIR": "@FAKE(kid)", "ANTHROPIC_API_KEY": "sk-test",
           "HIVE_RATE_LIMIT_SLEEP_SECS": "3600", "HIVE_FORGE_URL": "http://forge.test:3000"}},
  {"name": "pal", "env": {"FAKE_CLAUDE_DIR": "@FAKE(pal)"}},
  {"name": "zed", "env": {"FAKE_CLAUDE_DIR": "@FAKE(zed)", "ANTHROPIC_API_KEY": "sk-test"}}
]}"#;

/// Every badge, link and button of a card as the operator sees them: state
/// (running, stopped, rebuilding with its spinner), turn, unread, inflight,
/// "⊘ rate limited until HH:MM", needs login, needs update, restarts; the page,
/// forge, config and dashboard links; Stop, Start and Update with their
/// results; and a question cancelled from its card.
#[test]
fn every_badge_link_and_button_of_a_card() {
    use common::up::Launch;
    use hyperhive::proto::cmd::Send;
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let up = Up::launch(
        BADGE_FLEET,
        &["boss", "kid", "pal", "zed"],
        Launch {
            no_api_key: true,
            env: vec![("HIVE_DASHBOARD_POLL_MS".into(), "100".into())],
            ..Launch::default()
        },
    );
    for a in ["boss", "kid", "zed"] {
        up.wait_prompt(a, "You were just (re)started", 1);
    }
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    wait_for(T, "the four cards", || {
        (d.js("return document.querySelectorAll('.card.agent').length") == 4).then_some(())
    });

    // A question cancelled on its card; the asker gets the answer.
    let q = ask(&up, "Deploy on Friday?", &["yes", "no"], false);
    d.click("#tabs button[data-tab=questions]");
    wait_for(T, "the question's cancel button", || {
        d.text_of(&format!("button[data-cancel-q=\"{q}\"]"))
            .filter(|t| t == "Cancel question")
    });
    d.press(&format!("button[data-cancel-q=\"{q}\"]"));
    wait_for(T, "the question to go", || {
        (d.js(&format!(
            "return document.querySelectorAll('[data-question=\"{q}\"]').length"
        )) == 0)
            .then_some(())
    });
    up.wait_prompt("boss", "[cancelled by operator]", 1);
    d.click("#tabs button[data-tab=agents]");

    // zed: stopped with its button; the card then offers Start.
    // Stop asks first: the first tap arms it, the second stops.
    let stop = ".card.agent[data-agent=\"zed\"] button[data-act=\"stop\"]";
    d.press(stop);
    assert_eq!(d.text_of(stop).as_deref(), Some("Stop zed? (tap again)"));
    assert_eq!(badge(&d, "zed", "state").as_deref(), Some("running"));
    d.press(stop);
    wait_for(T, "zed's stopped badge", || {
        badge(&d, "zed", "state").filter(|t| t == "stopped")
    });
    wait_for(T, "zed's stop result", || {
        d.text_of(".card.agent[data-agent=\"zed\"] [data-result=\"done\"]")
            .filter(|t| t == "zed is stopping and stays stopped")
    });
    assert!(d
        .text_of(".card.agent[data-agent=\"zed\"] button[data-act=\"start\"]")
        .is_some());
    assert!(d
        .text_of(".card.agent[data-agent=\"zed\"] button[data-act=\"stop\"]")
        .is_none());
    wait_for(T, "zed's page link to go", || {
        (d.js("return !!document.querySelector('.card.agent[data-agent=\"zed\"] a[data-link=\"page\"]')")
            == false)
            .then_some(())
    });

    // kid: rate limited until a known time, one message unread; a forge token,
    // dashboard links.
    let kid = up.fake("kid");
    kid.step(
        kid.count() + 1,
        r#"api_error 429 rate_limit "API Error: Request rejected (429) · slow down""#,
    );
    let kid_state = up.data().join("agents/kid/state");
    std::fs::write(kid_state.join("forge-token"), "t0k3n\n").unwrap();
    std::fs::write(
        kid_state.join("hyperhive-dashboard-links.json"),
        r#"[{"label":"Stats","icon":"📊","url":"http://stats.test:9001/"}]"#,
    )
    .unwrap();
    ok(
        &mut up.host(),
        Send {
            to: "kid".into(),
            body: "please".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    let dash = up.dashboard();
    let until = wait_for(T, "kid's rate-limit pause", || {
        let h = dash.get("/api/hive").ok()?;
        let kid = h["agents"]
            .as_array()?
            .iter()
            .find(|a| a["name"] == "kid")?;
        (kid["live"]["paused"]["reason"] == "rate_limit")
            .then(|| kid["live"]["paused"]["until"].as_i64())
            .flatten()
    });
    let want = format!("⊘ rate limited until {}", d.local_hhmm(until));
    wait_for(T, "kid's rate-limit badge", || {
        badge(&d, "kid", "rate").filter(|t| *t == want)
    });
    wait_for(T, "kid's unread badge", || {
        badge(&d, "kid", "unread").filter(|t| t == "1 unread")
    });

    // boss and kid: edited by hand in the fleet file, so needs update.
    let path = up.fleet_file();
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["agents"][0]["env"]["EXTRA"] = serde_json::json!("1");
    cfg["agents"][1]["model"] = serde_json::json!("sonnet");
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    for a in ["boss", "kid"] {
        wait_for(T, &format!("{a}'s needs-update badge"), || {
            badge(&d, a, "update").filter(|t| t == "needs update")
        });
    }

    // pal: no credentials, and one crash.
    wait_for(T, "pal's needs-login badge", || {
        badge(&d, "pal", "login").filter(|t| t == "needs login →")
    });
    let pal = up.state("pal").unwrap().pid.unwrap();
    unsafe { libc::kill(pal as i32, libc::SIGKILL) };
    wait_for(T, "pal's restarts badge", || {
        badge(&d, "pal", "restarts").filter(|t| t == "1 restarts")
    });

    // boss: in a turn that ignores SIGINT, so a rebuild takes a while.
    let fake = up.fake("boss");
    let n = fake.count() + 1;
    fake.step(n, "trap '' INT; sleep 60; ok_turn late");
    let sent = ok(
        &mut up.host(),
        Send {
            to: "boss".into(),
            body: "a long job".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    fake.wait_count(n);
    let id = sent["id"].as_i64().unwrap();
    wait_for(T, "boss's inflight and turn badges", || {
        let inflight = badge(&d, "boss", "inflight")?;
        let turn = badge(&d, "boss", "turn")?;
        (inflight == format!("inflight #{id}") && turn == "thinking").then_some(())
    });
    assert_eq!(badge(&d, "boss", "state").as_deref(), Some("running"));
    assert_eq!(
        d.js("return document.querySelector('.card.agent[data-agent=\"boss\"] [data-badge=\"state\"]').classList.contains('ok')"),
        true
    );

    // The links of kid's card.
    let href = |kind: &str| {
        d.js(&format!(
            "const a = document.querySelector('.card.agent[data-agent=\"kid\"] a[data-link=\"{kind}\"]'); return a ? a.getAttribute('href') : null"
        ))
    };
    wait_for(T, "kid's forge and custom links", || {
        (href("forge") == "http://forge.test:3000/kid"
            && href("custom") == "http://stats.test:9001/")
            .then_some(())
    });
    assert_eq!(href("page"), "/agent/kid/");
    assert_eq!(href("config"), "/agent/kid/config");
    assert_eq!(
        d.js("return document.querySelector('.card.agent[data-agent=\"zed\"] a[data-link=\"forge\"]')"),
        Value::Null,
        "no forge token, no forge link"
    );
    let view = dash.get("/agent/kid/config").unwrap();
    assert_eq!(view["applied"]["name"], "kid");
    assert_eq!(view["up_to_date"], false);
    assert!(
        view["applied"].get("model").is_none(),
        "what it runs: {view}"
    );

    // Update on boss: a spinner while it rebuilds, then how it ended.
    let update = ".card.agent[data-agent=\"boss\"] button[data-act=\"update\"]";
    d.press(update);
    d.press(update);
    wait_for(T, "boss's rebuilding badge with its spinner", || {
        let spin = d.js(
            "return !!document.querySelector('.card.agent[data-agent=\"boss\"] [data-badge=\"state\"] .spin')",
        );
        (spin == true && badge(&d, "boss", "state").as_deref() == Some("rebuilding")).then_some(())
    });
    assert_eq!(
        d.js("return !!document.querySelector('.card.agent[data-agent=\"boss\"] [data-result=\"busy\"] .spin')"),
        true
    );
    let png = d.screenshot();
    std::fs::write(artifacts().join("dashboard-rebuilding.png"), png).unwrap();
    wait_for(T, "boss's update result", || {
        d.text_of(".card.agent[data-agent=\"boss\"] [data-result=\"updated\"]")
            .filter(|t| t.starts_with("✓ boss runs the current binary and config ("))
    });
    // crash_watch's next tick sees it current.
    wait_for(T, "boss's needs-update badge to go", || {
        badge(&d, "boss", "update").is_none().then_some(())
    });
    assert_eq!(badge(&d, "boss", "state").as_deref(), Some("running"));

    // Start brings zed back.
    d.press(".card.agent[data-agent=\"zed\"] button[data-act=\"start\"]");
    wait_for(T, "zed to run", || {
        badge(&d, "zed", "state").filter(|t| t == "running")
    });
}

/// The new endpoints want the token like every other, and do nothing
/// without it.
#[test]
fn the_lifecycle_and_cancel_endpoints_want_the_token() {
    let up = Up::start(FLEET, &["boss", "kid"]);
    let dash = up.dashboard();
    let q = ask(&up, "Still there?", &[], false);
    let status = |r: Result<ureq::Response, ureq::Error>| match r {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(c, _)) => c,
        Err(e) => panic!("{e}"),
    };
    for (path, body) in [
        ("/api/stop", serde_json::json!({"name": "kid"})),
        ("/api/start", serde_json::json!({"name": "kid"})),
        ("/api/restart", serde_json::json!({"name": "kid"})),
        ("/api/update", serde_json::json!({"name": "kid"})),
        ("/api/cancel-question", serde_json::json!({"id": q})),
    ] {
        let r = ureq::post(&format!("{}{path}", dash.base)).send_json(body);
        assert_eq!(status(r), 401, "{path}");
    }
    let r = ureq::get(&format!("{}/agent/kid/config", dash.base)).call();
    assert_eq!(status(r), 401);
    let pid = up.wait_running("kid");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let s = up.state("kid").unwrap();
    assert_eq!(
        (s.state.as_str(), s.pid, s.restarts),
        ("running", Some(pid), 0)
    );
    let h = dash.get("/api/hive").unwrap();
    assert_eq!(h["questions"][0]["id"], q, "the question is still pending");

    // With the token they act as the operator.
    let r = dash
        .post("/api/stop", serde_json::json!({"name": "kid"}))
        .unwrap();
    assert_eq!(r["text"], "kid is stopping and stays stopped");
    let e = dash
        .post("/api/stop", serde_json::json!({"name": "nobody"}))
        .unwrap_err();
    assert_eq!(e.0, 400);
    assert!(e.1.contains("unknown agent"), "{}", e.1);
    let e = dash
        .post("/api/update", serde_json::json!({"name": " "}))
        .unwrap_err();
    assert!(e.1.contains("name must name an agent"), "{}", e.1);
    dash.post("/api/cancel-question", serde_json::json!({"id": q}))
        .unwrap();
    up.wait_prompt("boss", "[cancelled by operator]", 1);
    dash.post("/api/start", serde_json::json!({"name": "kid"}))
        .unwrap();
    up.wait_running("kid");
    let view = dash.get("/agent/kid/config").unwrap();
    assert_eq!(view["state"], "running");
    assert_eq!(view["applied"]["parent"], "boss");
}

/// A scenario dir whose every run costs $0.0003: three turns are $0.0009,
/// which a cents-rounded card showed as $0.00.
fn tiny_cost_runs() -> (common::hive::TempDir, String) {
    let dir = common::hive::TempDir::new("tiny");
    std::fs::write(
        dir.path().join("default.sh"),
        r#"init
say "done"
printf '{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"duration_ms":5,"num_turns":1,"result":"done","stop_reason":"end_turn","session_id":"%s","total_cost_usd":0.0003,"usage":{"input_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":2},"modelUsage":{},"permission_denials":[],"terminal_reason":"completed","uuid":"u-res"}\n' "$SESSION"
exit 0
"#,
    )
    .unwrap();
    let path = dir.path().display().to_string();
    (dir, path)
}

/// The dashboard for watching (issue 39, item 6), at a desktop's 1280×800
/// and a phone's 390×844: the parent/child tree, each agent's "now" line and
/// last-active time, spend to four significant digits, the hive's recent
/// activity (turn ends newest first, live), and a Deny that asks first.
/// Screenshots of both sizes go to the test artifacts.
#[test]
fn the_dashboard_for_watching_at_desktop_and_phone_sizes() {
    use hyperhive::proto::cmd::Send;
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let (_tiny, path) = tiny_cost_runs();
    let fleet = format!(
        r#"{{"agents": [
  {{"name": "boss", "tool_groups": ["messaging", "meta", "inbox", "lifecycle"], "env": {{"FAKE_CLAUDE_DIR": "@FAKE(boss)"}}}},
  {{"name": "kid", "parent": "boss", "env": {{"FAKE_CLAUDE_DIR": "{path}"}}}}
]}}"#
    );
    let up = Up::start(&fleet, &["boss", "kid"]);
    up.wait_prompt("boss", "You were just (re)started", 1);
    for i in 1..=2 {
        ok(
            &mut up.host(),
            Send {
                to: "kid".into(),
                body: format!("job {i} of the night"),
                in_reply_to: None,
                receipt: false,
                traceparent: None,
            },
        );
    }
    let spawn = ok(&mut up.agent("boss"), RequestSpawn { name: "pup".into() });
    let approval = spawn["id"].as_i64().unwrap();

    for (w, h) in [(1280, 800), (390, 844)] {
        let d = Driver::start_sized(&chromium, &chromedriver, w, h);
        d.goto(&format!("{}/login", up.dashboard().base));
        d.type_into("input[name=token]", &up.dashboard().token);
        d.click("form button[type=submit]");
        wait_for(T, "the dashboard to go live", || {
            (d.js("return document.body.dataset.live === '1'") == true).then_some(())
        });
        // The tree: kid under boss.
        wait_for(T, "kid under boss in the tree", || {
            (d.js("return !!document.querySelector('#tree li[data-tree=\"boss\"] > ul > li[data-tree=\"kid\"]')") == true)
                .then_some(())
        });
        // kick + 2 jobs at $0.0003 each.
        wait_for(T, "kid's three runs in its spend", || {
            d.text_of(".card.agent[data-agent=\"kid\"] .mute")
                .filter(|t| t.contains("3 turns · $0.0009"))
        });
        let now = wait_for(T, "kid's now line", || {
            d.text_of("[data-now=\"kid\"]")
                .filter(|t| t.starts_with("now: idle") && t.contains("last active"))
        });
        assert!(now.contains("last: "), "the last outcome: {now}");

        d.click("#tabs button[data-tab=activity]");
        let first = wait_for(T, "the activity list", || {
            d.text_of("#activity-list .ev[data-event=\"turn_end\"]")
                .filter(|t| t.contains("kid handled #"))
        });
        assert!(
            first.contains("job 2 of the night"),
            "newest first: {first}"
        );
        assert!(
            d.text_of("#activity-list [data-event=\"approval_requested\"]")
                .is_some_and(|t| t.contains("pup")),
            "the spawn request is in the timeline"
        );
        let png = d.screenshot();
        let shot = artifacts().join(format!("dashboard-watching-{w}x{h}.png"));
        std::fs::write(&shot, png).unwrap();
        println!("screenshot: {}", shot.display());

        // Deny asks first; nothing is denied by the first tap.
        d.click("#tabs button[data-tab=approvals]");
        let deny = format!("button[data-deny=\"{approval}\"]");
        wait_for(T, "the approval's deny button", || d.text_of(&deny));
        d.press(&deny);
        assert_eq!(d.text_of(&deny).as_deref(), Some("Deny it? (tap again)"));
        let pending = up.dashboard().get("/api/hive").unwrap();
        assert_eq!(pending["approvals"].as_array().unwrap().len(), 1);
        d.click("#tabs button[data-tab=agents]");
        let png = d.screenshot();
        std::fs::write(
            artifacts().join(format!("dashboard-cards-{w}x{h}.png")),
            png,
        )
        .unwrap();
    }
}
