//! The operator's view of the agents' timers (issue 39, item 2), on real
//! processes: `hive timers` lists a reminder an agent set through `hive mcp`
//! and a scheduled prompt, `hive timers cancel KIND ID` cancels each by kind
//! and id and the owner finds `[KIND #ID cancelled by operator]` in its
//! inbox; a stopped agent's repeating prompt leaves one pending copy under
//! `hive up`, however often it comes due, and the dashboard lists and
//! cancels timers behind its guard, in Chromium too.

mod common;

use common::browser::{browser, Driver};
use common::hive::{ok, run_hive, wait_for, Broker, TempDir};
use common::mcp::McpProc;
use common::up::Up;
use hyperhive::proto::cmd::{Agents, AgentsReply, Remind, SchedulePrompt, Timers, TimersReply};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// `hive ARGS --socket HOST`: (exit code, stdout, stderr).
fn hive(host: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all = args.to_vec();
    let host = host.to_str().unwrap().to_string();
    all.push("--socket");
    all.push(&host);
    run_hive(&all, None, &[])
}

/// The number after `PREFIX #` in a tool's answer (`reminder #3 set; …`).
fn id_after(text: &str, prefix: &str) -> i64 {
    text.split_once(&format!("{prefix} #"))
        .and_then(|(_, r)| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} id in {text:?}"))
}

#[test]
fn the_operator_lists_and_cancels_a_reminder_set_through_mcp_and_a_scheduled_prompt() {
    let b = Broker::start_config(
        r#"{"agents":[
            {"name":"ana","tool_groups":["messaging","meta","inbox","scheduling"]},
            {"name":"bob"}
        ]}"#,
    );
    let tmp = TempDir::new("timers");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let socket = b.agent_socket("ana");
    let mut mcp = McpProc::start(
        &[
            ("HIVE_SOCKET", socket.to_str().unwrap()),
            ("HIVE_STATE_DIR", state.to_str().unwrap()),
        ],
        &tmp.path().join("mcp.log"),
    );
    mcp.initialize();
    let set = mcp.ok(
        1,
        "remind",
        json!({"message": "check the build\nand then the deploy", "delay_seconds": 3600}),
    );
    let rem = id_after(&set, "reminder");
    let sched = ok(
        &mut b.agent("ana"),
        SchedulePrompt {
            body: "morning digest".into(),
            at_unix_timestamp: None,
            delay_seconds: Some(7200),
            every_seconds: Some(86400),
        },
    )["id"]
        .as_i64()
        .unwrap();
    // bob's reminder: the second of its kind, while ana's prompt is the first
    // of its own.
    let bobs = ok(
        &mut b.agent("bob"),
        Remind {
            message: "bob's own".into(),
            delay_seconds: Some(10_800),
            at_unix_timestamp: None,
        },
    )["id"]
        .as_i64()
        .unwrap();
    assert_eq!((rem, sched, bobs), (1, 1, 2), "ids are per kind");

    let host = b.host_socket();
    let (code, out, err) = hive(&host, &["timers", "--json"]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    let got: Vec<(String, String, i64, Option<u64>, String)> = v["timers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["agent"].as_str().unwrap().to_string(),
                t["kind"].as_str().unwrap().to_string(),
                t["id"].as_i64().unwrap(),
                t["every_seconds"].as_u64(),
                t["first_line"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (
                "ana".into(),
                "reminder".into(),
                1,
                None,
                "check the build".into()
            ),
            (
                "ana".into(),
                "scheduled".into(),
                1,
                Some(86400),
                "morning digest".into()
            ),
            ("bob".into(), "reminder".into(), 2, None, "bob's own".into()),
        ],
        "soonest first: {out}"
    );
    let (code, out, err) = hive(&host, &["timers", "--agent", "ana"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with("ana  reminder  #1 ")
            && lines[0].ends_with("once         check the build"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("ana  scheduled #1 ")
            && lines[1].ends_with("every 1d     morning digest"),
        "{out}"
    );
    assert_eq!(
        lines[2],
        "`hive timers cancel KIND ID` cancels one; its agent is told."
    );
    let (code, _, err) = hive(&host, &["timers", "--agent", "zed"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("unknown agent \"zed\"; the agents are ana, bob"),
        "{err}"
    );

    // The reminder, by kind and id: it goes, and ana is told.
    let (code, out, err) = hive(&host, &["timers", "cancel", "reminder", "1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        "cancelled reminder #1 of ana; it was told: [reminder #1 cancelled by operator]"
    );
    let got = mcp.ok(3, "recv", json!({"wait_seconds": 10}));
    assert!(
        got.contains("from system (reminder): [reminder #1 cancelled by operator]"),
        "{got}"
    );
    let ends = mcp.ok(4, "get_loose_ends", json!({}));
    assert!(!ends.contains("reminder #1"), "{ends}");
    assert!(ends.contains("scheduled #1"), "{ends}");
    // Once gone, the same id is refused, naming the kind and where ids are.
    let (code, _, err) = hive(&host, &["timers", "cancel", "reminder", "1"]);
    assert_eq!(code, 1);
    assert!(
        err.contains(
            "no pending reminder #1: ids are per kind; `hive timers` lists the pending \
             reminders and scheduled prompts with their kind and id"
        ),
        "{err}"
    );

    // The scheduled prompt, by its kind: the reminder #1 that is gone names
    // nothing, but scheduled #1 is ana's prompt.
    let (code, out, err) = hive(&host, &["timers", "cancel", "scheduled", "1", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), r#"{"ok":true,"agent":"ana"}"#);
    let got = mcp.ok(5, "recv", json!({"wait_seconds": 10}));
    assert!(
        got.contains("[scheduled #1 cancelled by operator]"),
        "{got}"
    );
    let ends = mcp.ok(6, "get_loose_ends", json!({}));
    assert!(!ends.contains("morning digest"), "{ends}");

    // bob's reminder is untouched; ana has none left.
    let r: TimersReply = b.host().call(&Timers { agent: None }).unwrap();
    assert_eq!(r.timers.len(), 1);
    assert_eq!((r.timers[0].agent.as_str(), r.timers[0].id), ("bob", 2));
    let (code, out, _) = hive(&host, &["timers", "--agent", "ana"]);
    assert_eq!(
        (code, out.trim()),
        (0, "no pending reminders or scheduled prompts of ana")
    );
}

const FLEET: &str = r#"{
  "agents": [
    {"name": "pal",
     "tool_groups": ["messaging", "meta", "inbox", "scheduling"],
     "env": {"FAKE_CLAUDE_DIR": "@FAKE(pal)"}}
  ]
}"#;

const KICK: &str = "You were just (re)started";

fn unread(up: &Up, name: &str) -> u64 {
    let r: AgentsReply = up.host().call(&Agents {}).unwrap();
    r.agents.iter().find(|a| a.name == name).unwrap().unread
}

fn pals_timers(up: &Up) -> TimersReply {
    up.host()
        .call(&Timers {
            agent: Some("pal".into()),
        })
        .unwrap()
}

/// Moves every scheduled prompt's next delivery to a second ago, in the
/// store of a stopped `hive up`: the time a repeating prompt waits between
/// slots (at least a minute) passes at once.
fn make_due(up: &Up) {
    let c = rusqlite::Connection::open(up.data().join("broker.db")).unwrap();
    c.execute(
        "UPDATE scheduled SET fire_at = CAST(strftime('%s','now') AS INTEGER) - 1",
        [],
    )
    .unwrap();
}

#[test]
fn a_stopped_agents_repeating_prompt_leaves_one_pending_copy() {
    let mut up = Up::start(FLEET, &["pal"]);
    up.wait_prompt("pal", KICK, 1);
    wait_for(T, "pal's first turn to end", || {
        (unread(&up, "pal") == 0).then_some(())
    });
    let host = up.data().join("run/host.sock");
    let (code, out, err) = hive(&host, &["stop", "pal"]);
    assert_eq!(code, 0, "{err}{out}");
    wait_for(T, "pal to stop", || {
        (up.state("pal")?.state == "stopped").then_some(())
    });

    // Due now, then every minute.
    let now = hyperhive::proto::now();
    ok(
        &mut up.agent("pal"),
        SchedulePrompt {
            body: "hourly check".into(),
            at_unix_timestamp: Some(now - 1),
            delay_seconds: None,
            every_seconds: Some(60),
        },
    );
    let first = wait_for(T, "the first copy", || {
        pals_timers(&up).timers[0].unread_copy
    });
    assert_eq!(unread(&up, "pal"), 1);

    // It comes due twice more while pal is stopped (across restarts of
    // hive up): each delivery is coalesced into the unread copy.
    for skipped in 1..=2 {
        assert!(up.terminate().success());
        make_due(&up);
        up.restart(&[]);
        let t = wait_for(T, &format!("delivery {skipped} coalesced"), || {
            let t = pals_timers(&up).timers.remove(0);
            (t.skipped == skipped).then_some(t)
        });
        assert_eq!(t.unread_copy, Some(first));
        assert_eq!(unread(&up, "pal"), 1, "one pending copy, never a pile");
        assert_eq!(up.state("pal").unwrap().state, "stopped");
    }
    let (code, out, err) = hive(&host, &["timers"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(
            "every 1m     hourly check · skipped 2 · its copy #{first} is unread"
        )),
        "{out}"
    );

    // Started, pal runs the one copy, once.
    let (code, _, err) = hive(&host, &["start", "pal"]);
    assert_eq!(code, 0, "{err}");
    up.wait_prompt("pal", "[scheduled #1] hourly check", 1);
    wait_for(T, "the copy to be handled", || {
        pals_timers(&up).timers[0]
            .unread_copy
            .is_none()
            .then_some(())
    });
    assert_eq!(up.prompts_with("pal", "hourly check"), 1);

    // The dashboard lists it and cancels it, behind its guard.
    let dash = up.dashboard();
    let h = dash.get("/api/hive").unwrap();
    assert_eq!(h["timers"][0]["kind"], "scheduled", "{h}");
    assert_eq!(h["timers"][0]["skipped"], 2, "{h}");
    assert_eq!(h["timers_more"], 0);
    // What a hostile page in the operator's browser can send, with and
    // without the token, is refused, and the prompt stays.
    let token = dash.token.as_str();
    let attacks: [&[(&str, &str)]; 5] = [
        &[("Content-Type", "application/json")],
        &[
            ("Origin", "http://evil.example"),
            ("Content-Type", "text/plain"),
        ],
        &[
            ("Origin", "http://evil.example"),
            ("Content-Type", "application/json"),
            ("X-Hive-Token", token),
        ],
        &[
            ("Sec-Fetch-Site", "cross-site"),
            ("Content-Type", "application/json"),
            ("X-Hive-Token", token),
        ],
        &[("Content-Type", "text/plain"), ("X-Hive-Token", token)],
    ];
    for headers in attacks {
        let mut req = ureq::post(&format!("{}/api/cancel-timer", dash.base));
        for (k, v) in headers {
            req = req.set(k, v);
        }
        let r = req.send_string(r#"{"kind":"scheduled","id":1}"#);
        assert!(
            matches!(r, Err(ureq::Error::Status(401 | 403 | 415, _))),
            "{headers:?}: {r:?}"
        );
    }
    assert_eq!(pals_timers(&up).timers.len(), 1, "nothing was cancelled");
    let (code, body) = dash
        .post("/api/cancel-timer", json!({"kind": "reminder", "id": 1}))
        .unwrap_err();
    assert_eq!(code, 400);
    assert!(
        body.contains("no pending reminder #1: ids are per kind"),
        "{body}"
    );
    let (code, body) = dash
        .post("/api/cancel-timer", json!({"kind": "task", "id": 1}))
        .unwrap_err();
    assert_eq!(code, 400);
    assert!(body.contains("unknown timer kind \\\"task\\\""), "{body}");
    let r = dash
        .post("/api/cancel-timer", json!({"kind": "scheduled", "id": 1}))
        .unwrap();
    assert_eq!(r, json!({"ok": true, "agent": "pal"}));
    assert!(pals_timers(&up).timers.is_empty());
    up.wait_prompt("pal", "[scheduled #1 cancelled by operator]", 1);
}

#[test]
fn the_dashboards_timers_tab_lists_and_cancels_by_a_click() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let up = Up::start(FLEET, &["pal"]);
    up.wait_prompt("pal", KICK, 1);
    let mut pal = up.agent("pal");
    ok(
        &mut pal,
        Remind {
            message: "look at the <b>build</b>\nsecond line".into(),
            delay_seconds: Some(3600),
            at_unix_timestamp: None,
        },
    );
    ok(
        &mut pal,
        SchedulePrompt {
            body: "hourly check".into(),
            at_unix_timestamp: None,
            delay_seconds: Some(7200),
            every_seconds: Some(3600),
        },
    );
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    wait_for(T, "the dashboard to go live", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    d.click("#tabs button[data-tab=timers]");
    wait_for(T, "two timer cards", || {
        (d.js("return document.querySelectorAll('#t-list .card.timer').length") == 2).then_some(())
    });
    assert_eq!(
        d.js("return document.getElementById('n-timers').textContent"),
        "(2)"
    );
    let reminder = d.text_of("[data-timer=\"reminder:1\"]").unwrap();
    assert!(
        reminder.contains("pal · reminder #1") && reminder.contains("once"),
        "{reminder}"
    );
    // The agent's text is shown as text, its first line only.
    assert!(reminder.contains("look at the <b>build</b>"), "{reminder}");
    assert!(!reminder.contains("second line"), "{reminder}");
    let scheduled = d.text_of("[data-timer=\"scheduled:1\"]").unwrap();
    assert!(
        scheduled.contains("scheduled #1") && scheduled.contains("every 1h"),
        "{scheduled}"
    );
    // A cancel asks first: one click arms it, the second cancels.
    let cancel = "button[data-cancel-timer=\"reminder:1\"]";
    d.press(cancel);
    assert_eq!(d.text_of(cancel).as_deref(), Some("Cancel it? (tap again)"));
    assert_eq!(
        pals_timers(&up).timers.len(),
        2,
        "one click cancels nothing"
    );
    d.press(cancel);
    up.wait_prompt("pal", "[reminder #1 cancelled by operator]", 1);
    wait_for(T, "the cancelled card to go", || {
        (d.js("return document.querySelectorAll('#t-list .card.timer').length") == 1).then_some(())
    });
    assert!(d.text_of("[data-timer=\"scheduled:1\"]").is_some());
}
