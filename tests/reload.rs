//! `hive reload`, `hive forget` and `hive update --all` (issue 39, item 1) on
//! a real `hive up` with the scripted fake claude: the fleet file applied
//! while the hive runs — added agents start, changed ones restart onto their
//! entry (after the turn they are in), removed ones stop and keep their mail
//! until forgotten, and every other agent keeps its harness (same pid); a
//! file that does not load changes nothing; `update --all` restarts the
//! stale agents a few at a time, each after the one before ran its boot turn.

mod common;

use common::hive::{ok, refused, run_hive, wait_for};
use common::up::Up;
use hyperhive::proto::cmd::{
    Agents, AgentsReply, Failed, FailedReply, ForgetAgent, Reload, Retry, Send, StopAgent,
    UpdateAll,
};
use std::collections::BTreeMap;
use std::time::Duration;

const KICK: &str = "You were just (re)started";

/// A fleet of root agents, each with its fake claude; `extra` goes into the
/// entry of the agent it names (e.g. `"model": "sonnet"`).
fn fleet(up: &Up, agents: &[&str], extra: &[(&str, &str)]) -> String {
    let entries: Vec<String> = agents
        .iter()
        .map(|a| {
            let fake = up.dir.path().join(format!("fake-{a}"));
            std::fs::create_dir_all(&fake).unwrap();
            let more: String = extra
                .iter()
                .filter(|(n, _)| n == a)
                .map(|(_, e)| format!(", {e}"))
                .collect();
            format!(
                r#"{{"name": "{a}", "env": {{"FAKE_CLAUDE_DIR": "{}"}}{more}}}"#,
                fake.display()
            )
        })
        .collect();
    format!(
        r#"{{"web": {{"listen": "127.0.0.1:0"}}, "agents": [{}]}}"#,
        entries.join(", ")
    )
}

fn start(agents: &[&str], env: &[(&str, &str)]) -> Up {
    let entries: Vec<String> = agents
        .iter()
        .map(|a| format!(r#"{{"name": "{a}", "env": {{"FAKE_CLAUDE_DIR": "@FAKE({a})"}}}}"#))
        .collect();
    let text = format!(r#"{{"agents": [{}]}}"#, entries.join(", "));
    let up = Up::start_env(&text, agents, env);
    for a in agents {
        up.wait_prompt(a, KICK, 1);
    }
    up
}

fn pids(up: &Up) -> BTreeMap<String, Option<u32>> {
    up.states().into_iter().map(|s| (s.name, s.pid)).collect()
}

fn reload(up: &Up) -> String {
    ok(&mut up.host(), Reload {})["text"]
        .as_str()
        .unwrap()
        .to_string()
}

fn send(up: &Up, to: &str, body: &str) -> Result<(), String> {
    let mut c = up.host();
    let req = Send {
        to: to.into(),
        body: body.into(),
        in_reply_to: None,
        receipt: false,
        traceparent: None,
    };
    let line = serde_json::to_string(&hyperhive::proto::Request::from(req)).unwrap();
    common::hive::call_raw(&mut c, &line)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn row(up: &Up, name: &str) -> Option<hyperhive::proto::AgentRow> {
    let r: AgentsReply = up.host().call(&Agents {}).unwrap();
    r.agents.into_iter().find(|a| a.name == name)
}

/// Stops `name` (it stays stopped) and, once it has, writes it `body`.
fn stop_and_write(up: &Up, name: &str, body: &str) {
    ok(&mut up.host(), StopAgent { name: name.into() });
    wait_for(Duration::from_secs(30), &format!("{name} to stop"), || {
        (up.state(name)?.state == "stopped").then_some(())
    });
    send(up, name, body).unwrap();
}

/// Waits until `name` has no message queued or in a turn.
fn drained(up: &Up, name: &str) {
    wait_for(
        Duration::from_secs(30),
        &format!("{name}'s inbox to drain"),
        || {
            let r = row(up, name)?;
            (r.unread == 0 && r.inflight.is_none()).then_some(())
        },
    );
}

#[test]
fn reload_adds_changes_and_removes_agents_and_keeps_every_other_harness() {
    let up = start(&["ana", "bob", "cal"], &[]);
    let before = pids(&up);
    let host_socket = up.data().join("run/host.sock");
    let sock = host_socket.display().to_string();

    // A file that does not load changes nothing, and says where it is wrong.
    let good = std::fs::read_to_string(up.fleet_file()).unwrap();
    std::fs::write(
        up.fleet_file(),
        fleet(&up, &["ana", "bob"], &[("bob", r#""modle": "sonnet""#)]),
    )
    .unwrap();
    let (code, out, err) = run_hive(&["reload", "--socket", &sock], None, &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("does not load") && err.contains("modle"),
        "{err}"
    );
    assert!(err.contains("nothing changed"), "{err}");
    assert_eq!(pids(&up), before, "a bad file restarted an agent");
    assert_eq!(up.state("cal").unwrap().state, "running");
    std::fs::write(up.fleet_file(), &good).unwrap();

    // cal gets mail while it is stopped; then it leaves the fleet.
    drained(&up, "cal");
    stop_and_write(&up, "cal", "cal's first letter");

    // Remove cal, add dan, change bob's model; ana is untouched.
    std::fs::write(
        up.fleet_file(),
        fleet(
            &up,
            &["ana", "bob", "dan"],
            &[("bob", r#""model": "sonnet""#)],
        ),
    )
    .unwrap();
    let (code, out, err) = run_hive(&["reload", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 unchanged agent keep"), "{out}");
    assert!(out.contains("dan: added and started"), "{out}");
    assert!(out.contains("cal: removed from the fleet"), "{out}");
    assert!(out.contains("bob: "), "{out}");
    up.wait_running("dan");
    up.wait_prompt("dan", KICK, 1);
    let bob = wait_for(Duration::from_secs(30), "bob to run its new entry", || {
        let s = up.state("bob")?;
        (s.state == "running"
            && s.pid != before["bob"]
            && s.applied.model.as_deref() == Some("sonnet"))
        .then_some(s)
    });
    assert!(bob.up_to_date);
    assert_eq!(
        up.state("ana").unwrap().pid,
        before["ana"],
        "ana was restarted"
    );

    // cal: removed, its mail kept, and refused as a recipient.
    assert_eq!(up.state("cal").unwrap().state, "removed");
    let cal = row(&up, "cal").expect("cal is listed");
    assert!(cal.removed && cal.unread == 1, "{cal:?}");
    let e = send(&up, "cal", "another").unwrap_err();
    assert!(e.contains("cal was removed from the fleet"), "{e}");
    let (code, out, _) = run_hive(&["agents", "--socket", &sock], None, &[]);
    assert_eq!(code, 0);
    let line = out.lines().find(|l| l.starts_with("cal ")).expect(&out);
    assert!(line.contains("removed"), "{line}");
    let e = refused(
        &mut up.host(),
        hyperhive::proto::cmd::StartAgent { name: "cal".into() },
    );
    assert!(e.contains("was removed from the fleet"), "{e}");

    // Back in the fleet, cal finds its letter.
    std::fs::write(
        up.fleet_file(),
        fleet(
            &up,
            &["ana", "bob", "cal", "dan"],
            &[("bob", r#""model": "sonnet""#)],
        ),
    )
    .unwrap();
    let text = reload(&up);
    assert!(text.contains("cal: back in the fleet"), "{text}");
    up.wait_prompt("cal", "cal's first letter", 1);
    drained(&up, "cal");
    assert!(!row(&up, "cal").unwrap().removed);

    // Out again with a letter waiting; forgotten, the letter is a dead letter.
    stop_and_write(&up, "cal", "cal's second letter");
    std::fs::write(
        up.fleet_file(),
        fleet(
            &up,
            &["ana", "bob", "dan"],
            &[("bob", r#""model": "sonnet""#)],
        ),
    )
    .unwrap();
    reload(&up);
    let e = refused(&mut up.host(), ForgetAgent { name: "ana".into() });
    assert!(e.contains("ana is in the fleet"), "{e}");
    let (code, out, err) = run_hive(&["forget", "cal", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("forgot cal: 1 queued message is now dead letter"),
        "{out}"
    );
    let failed: FailedReply = up
        .host()
        .call(&Failed {
            agent: Some("cal".into()),
        })
        .unwrap();
    let letter = failed
        .failed
        .iter()
        .find(|m| m.body == "cal's second letter")
        .unwrap_or_else(|| panic!("{failed:?}"));
    let e = refused(&mut up.host(), Retry { id: letter.id });
    assert!(e.contains("which is not in the fleet"), "{e}");
    assert!(row(&up, "cal").is_none(), "cal is still listed");
    assert!(up.state("cal").is_none(), "cal is still supervised");
    let e = send(&up, "cal", "x").unwrap_err();
    assert!(e.contains("unknown agent \"cal\""), "{e}");
    // Its data dir stays.
    assert!(up.data().join("agents/cal/state").is_dir());
    // Nobody else moved through all of it.
    assert_eq!(up.state("ana").unwrap().pid, before["ana"]);
}

#[test]
fn a_changed_agent_in_a_turn_restarts_once_the_turn_ends() {
    // The stop grace is long: only the turn's end may start the restart.
    let up = start(&["ana", "bob"], &[("HIVE_UP_STOP_GRACE_MS", "120000")]);
    let fake = up.fake("ana");
    let release = fake.dir.join("release");
    fake.step(
        2,
        &format!(
            r#"init; say working; while [ ! -f "{}" ]; do sleep 0.05; done; result_ok done; exit 0"#,
            release.display()
        ),
    );
    let before = pids(&up);
    send(&up, "ana", "a long job").unwrap();
    fake.wait_count(2);
    wait_for(
        Duration::from_secs(30),
        "ana's turn to hold its message",
        || row(&up, "ana")?.inflight.map(|_| ()),
    );
    std::fs::write(
        up.fleet_file(),
        fleet(&up, &["ana", "bob"], &[("ana", r#""model": "opus""#)]),
    )
    .unwrap();
    let text = reload(&up);
    assert!(text.contains("ana: ana is in a turn"), "{text}");
    assert!(text.contains("1 unchanged agent"), "{text}");
    // The turn keeps running on the old harness.
    std::thread::sleep(Duration::from_millis(700));
    let s = up.state("ana").unwrap();
    assert_eq!(
        (s.state.to_string(), s.pid),
        ("rebuilding".to_string(), before["ana"])
    );
    assert!(row(&up, "ana").unwrap().inflight.is_some());
    std::fs::write(&release, "").unwrap();
    let s = wait_for(
        Duration::from_secs(30),
        "ana to restart after its turn",
        || {
            let s = up.state("ana")?;
            (s.state == "running" && s.pid != before["ana"]).then_some(s)
        },
    );
    assert_eq!(s.applied.model.as_deref(), Some("opus"));
    up.wait_prompt("ana", KICK, 2);
    drained(&up, "ana");
    // The message was handled once: acked by its turn, never run again.
    assert_eq!(up.prompts_with("ana", "a long job"), 1);
    assert_eq!(up.state("bob").unwrap().pid, before["bob"]);
}

#[test]
fn update_all_restarts_stale_agents_one_after_the_others_boot_turn() {
    let up = Up::start_with(
        r#"{"agents": [
          {"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}},
          {"name": "bob", "env": {"FAKE_CLAUDE_DIR": "@FAKE(bob)"}},
          {"name": "cal", "env": {"FAKE_CLAUDE_DIR": "@FAKE(cal)"}}
        ]}"#,
        &["ana", "bob", "cal"],
        true,
    );
    for a in ["ana", "bob", "cal"] {
        up.wait_prompt(a, KICK, 1);
    }
    let sock = up.data().join("run/host.sock").display().to_string();
    let (code, out, _) = run_hive(&["update", "--all", "--socket", &sock], None, &[]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing to update"), "{out}");
    // ana's boot turn after its update holds until released.
    let fake = up.fake("ana");
    let release = fake.dir.join("release");
    fake.step(
        2,
        &format!(
            r#"init; while [ ! -f "{}" ]; do sleep 0.05; done; result_ok booted; exit 0"#,
            release.display()
        ),
    );
    let before = pids(&up);
    std::thread::sleep(Duration::from_millis(300));
    up.rebuild_binary();
    let (code, out, err) = run_hive(
        &["update", "--all", "--parallel", "1", "--socket", &sock],
        None,
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("updating 3 agents, at most 1 at a time") && out.contains("ana, bob, cal"),
        "{out}"
    );
    // ana goes first; while its boot turn runs, nobody else restarts.
    fake.wait_count(2);
    assert_ne!(up.state("ana").unwrap().pid, before["ana"]);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        up.state("bob").unwrap().pid,
        before["bob"],
        "bob went before ana's boot turn ended"
    );
    assert_eq!(up.state("cal").unwrap().pid, before["cal"]);
    std::fs::write(&release, "").unwrap();
    for a in ["bob", "cal"] {
        wait_for(
            Duration::from_secs(60),
            &format!("{a} to be updated"),
            || {
                let s = up.state(a)?;
                (s.state == "running" && s.pid != before[a] && s.up_to_date).then_some(())
            },
        );
        up.wait_prompt(a, KICK, 2);
    }
    assert!(up.state("ana").unwrap().up_to_date);
    wait_for(Duration::from_secs(30), "update --all to finish", || {
        up.log().contains("update --all: done").then_some(())
    });
    // Bad input: a count out of range names itself.
    let (code, _, err) = run_hive(
        &["update", "--all", "--parallel", "0", "--socket", &sock],
        None,
        &[],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("parallel got 0; it must be from 1 to 64"),
        "{err}"
    );
    let (code, _, err) = run_hive(
        &["update", "ana", "--parallel", "2", "--socket", &sock],
        None,
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--parallel goes with --all"), "{err}");
    let e = refused(&mut up.host(), UpdateAll { parallel: Some(65) });
    assert!(e.contains("from 1 to 64"), "{e}");
}

#[test]
fn top_level_keys_apply_live_or_are_named_as_waiting_for_a_restart() {
    let up = start(&["ana", "bob"], &[]);
    let before = pids(&up);
    // hive_name restarts every agent onto it (each prompt names the hive);
    // budget applies at once; web and telemetry wait for a restart of hive
    // up.
    let body = fleet(&up, &["ana", "bob"], &[]).replacen(
        r#"{"web": {"listen": "127.0.0.1:0"}"#,
        r#"{"hive_name": "renamed", "budget": {"usd": 50}, "telemetry": {"endpoint": "http://127.0.0.1:9"}, "web": {"listen": "127.0.0.1:0", "public_origin": "https://hive.example"}"#,
        1,
    );
    std::fs::write(up.fleet_file(), body).unwrap();
    let text = reload(&up);
    assert!(text.contains("hive_name/swarm_name: now renamed"), "{text}");
    assert!(text.contains("budget: applies now"), "{text}");
    assert!(
        text.contains("web, telemetry changed: they are applied at the next start of hive up"),
        "{text}"
    );
    let meta: hyperhive::proto::cmd::AgentMeta = up
        .host()
        .call(&hyperhive::proto::cmd::GetAgentMeta {
            name: Some("ana".into()),
        })
        .unwrap();
    assert_eq!(meta.hive_name.as_deref(), Some("renamed"));
    for a in ["ana", "bob"] {
        wait_for(Duration::from_secs(30), &format!("{a} to restart"), || {
            let s = up.state(a)?;
            (s.state == "running" && s.pid != before[a]).then_some(())
        });
    }
    let budget: hyperhive::proto::cmd::BudgetReport = up
        .host()
        .call(&hyperhive::proto::cmd::GetBudget {})
        .unwrap();
    let hive = budget.rows.iter().find(|r| r.row.scope == "hive");
    assert_eq!(hive.and_then(|r| r.row.usd), Some(50.0), "{budget:?}");
    // Reloading the same file again changes nothing.
    let after = pids(&up);
    let text = reload(&up);
    assert!(text.contains("2 unchanged agents keep running"), "{text}");
    assert!(!text.contains("hive_name"), "{text}");
    assert_eq!(pids(&up), after);
}

#[test]
fn a_changed_matrix_section_restarts_the_bridge_onto_it() {
    // Homeservers on ports nothing listens on: the bridge backs off, and its
    // error names the port it tried.
    let closed = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (one, two) = (closed(), closed());
    let dir = common::hive::TempDir::new("reload-matrix");
    let password = dir.path().join("matrix-password");
    std::fs::write(&password, "pw-one\n").unwrap();
    let matrix = |port: u16| {
        serde_json::json!({
            "homeserver": format!("http://127.0.0.1:{port}"),
            "user_id": "@hive-one-bridge:hive.test",
            "password_file": password,
            "room": "#swarm:hive.test",
            "peers": {"two": "@hive-two-bridge:hive.test"},
        })
    };
    let fleet_json = |port: u16, hive: &str| {
        serde_json::json!({
            "hive_name": hive,
            "agents": [{"name": "a", "env": {"FAKE_CLAUDE_DIR": "@FAKE(a)"}}],
            "matrix": matrix(port),
        })
        .to_string()
    };
    let up = Up::launch(
        &fleet_json(one, "one"),
        &["a"],
        common::up::Launch {
            env: vec![
                ("HIVE_BRIDGE_BACKOFF_MS".into(), "100".into()),
                ("HIVE_BRIDGE_BACKOFF_MAX_MS".into(), "1000".into()),
            ],
            ..Default::default()
        },
    );
    let detail = |port: u16| {
        wait_for(
            Duration::from_secs(30),
            &format!("the bridge to try port {port}"),
            || {
                let r: AgentsReply = up.host().call(&Agents {}).unwrap();
                r.bridge?
                    .detail
                    .filter(|d| d.contains(&format!("127.0.0.1:{port}")))
            },
        )
    };
    detail(one);
    let a = up.state("a").unwrap().pid;
    let written = std::fs::read_to_string(up.fleet_file()).unwrap();
    let moved = written.replace(&format!("127.0.0.1:{one}"), &format!("127.0.0.1:{two}"));
    assert_ne!(written, moved);
    std::fs::write(up.fleet_file(), &moved).unwrap();
    let text = reload(&up);
    assert!(
        text.contains("matrix: changed; the Matrix bridge restarts onto it"),
        "{text}"
    );
    detail(two);
    assert_eq!(up.state("a").unwrap().pid, a, "the agent was restarted");
    // Under a bridge the hive's name waits for a restart of hive up.
    std::fs::write(up.fleet_file(), moved.replace("\"one\"", "\"uno\"")).unwrap();
    let text = reload(&up);
    assert!(
        text.contains("hive_name/swarm_name (under a Matrix bridge) changed"),
        "{text}"
    );
    assert_eq!(up.state("a").unwrap().pid, a);
}

#[test]
fn an_agent_taken_out_while_the_hive_was_down_is_found_removed_with_its_mail() {
    let mut up = start(&["ana", "bob"], &[]);
    // Its kick turn over, so the stop leaves only the letter queued.
    drained(&up, "bob");
    stop_and_write(&up, "bob", "bob's letter");
    assert!(up.terminate().success());
    std::fs::write(up.fleet_file(), fleet(&up, &["ana"], &[])).unwrap();
    up.restart(&["ana"]);
    let bob = row(&up, "bob").expect("bob is listed");
    assert!(bob.removed && bob.unread == 1, "{bob:?}");
    assert!(up.state("bob").is_none(), "nothing supervises bob");
    let e = send(&up, "bob", "more").unwrap_err();
    assert!(e.contains("bob was removed from the fleet"), "{e}");
    assert!(up.log().contains("kept as removed"), "{}", up.log());
    // Back in the file, a reload starts it and it reads its letter.
    std::fs::write(up.fleet_file(), fleet(&up, &["ana", "bob"], &[])).unwrap();
    let text = reload(&up);
    assert!(text.contains("bob: added and started"), "{text}");
    up.wait_prompt("bob", "bob's letter", 1);
}

/// The dashboard's Reload, Update all and Forget: the operator's token and
/// the one origin's guard, like every other action; with them, the same
/// answers as the commands.
#[test]
fn the_dashboards_reload_update_all_and_forget_want_the_operator() {
    let up = start(&["ana", "bob"], &[]);
    let dash = up.dashboard();
    let before = pids(&up);
    std::fs::write(up.fleet_file(), fleet(&up, &["ana"], &[])).unwrap();
    let token = dash.token.clone();
    let attacks: &[&[(&str, &str)]] = &[
        &[("Content-Type", "application/json")],
        &[
            ("Origin", "http://evil.example"),
            ("Content-Type", "application/json"),
            ("X-Hive-Token", &token),
        ],
        &[
            ("Sec-Fetch-Site", "cross-site"),
            ("Content-Type", "application/json"),
            ("X-Hive-Token", &token),
        ],
        &[("Content-Type", "text/plain"), ("X-Hive-Token", &token)],
    ];
    for path in ["/api/reload", "/api/update-all", "/api/forget"] {
        for headers in attacks {
            let mut req = ureq::post(&format!("{}{path}", dash.base));
            for (k, v) in *headers {
                req = req.set(k, v);
            }
            let r = req.send_string(r#"{"name":"bob"}"#);
            assert!(
                matches!(r, Err(ureq::Error::Status(401 | 403 | 415, _))),
                "{path} {headers:?}: {r:?}"
            );
        }
    }
    assert_eq!(pids(&up), before, "a refused request changed the fleet");
    assert_eq!(up.state("bob").unwrap().state, "running");

    let r = dash.post("/api/reload", serde_json::json!({})).unwrap();
    let text = r["text"].as_str().unwrap();
    assert!(text.contains("bob: removed from the fleet"), "{text}");
    let r = dash.post("/api/update-all", serde_json::json!({})).unwrap();
    assert!(
        r["text"].as_str().unwrap().contains("nothing to update"),
        "{r:?}"
    );
    let h = dash.get("/api/hive").unwrap();
    let bob = h["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "bob")
        .cloned()
        .expect("bob is on the dashboard");
    assert_eq!(bob["removed"], true, "{bob}");
    let r = dash
        .post("/api/forget", serde_json::json!({"name": "bob"}))
        .unwrap();
    assert!(
        r["text"].as_str().unwrap().starts_with("forgot bob"),
        "{r:?}"
    );
    let e = dash
        .post("/api/forget", serde_json::json!({"name": "ana"}))
        .unwrap_err();
    assert!(e.1.contains("ana is in the fleet"), "{}", e.1);
}
