//! `hive up` end to end with the fake claude: a manager (`boss`) with two
//! children and an unrelated root agent (`pal`). Supervision (kill -9 → restart
//! with exactly one kick, nothing lost), a spawn through an approval, lifecycle
//! refusals, crash_watch's needs_update/rebuilt, scheduling, logs and the
//! lifecycle error under plain `hive broker`.

mod common;

use common::hive::{call_raw, ok, refused, run_hive, wait_for, Broker};
use common::up::{Launch, Up};
use hyperhive::proto::cmd::{
    Agents, Approvals, Approve, CancelLooseEnd, CancelScheduled, GetHostJournal, GetLogs,
    GetLooseEnds, Inbox, Kill, ListScheduled, RequestApplyCommit, RequestSpawn, Restart,
    SchedulePrompt, Send, Start, Status, StatusReply, Supervision, Update,
};
use hyperhive::proto::{LooseEndKind, Request};
use std::time::Duration;

const KICK: &str = "You were just (re)started";

const FLEET: &str = r#"{
  "hive_name": "testhive",
  "agents": [
    {"name": "boss",
     "tool_groups": ["messaging", "meta", "inbox", "lifecycle", "approvals", "scheduling", "diagnostics"],
     "env": {"FAKE_CLAUDE_DIR": "@FAKE(boss)"}},
    {"name": "kid1", "parent": "boss", "env": {"FAKE_CLAUDE_DIR": "@FAKE(kid1)"}},
    {"name": "kid2", "parent": "boss", "env": {"FAKE_CLAUDE_DIR": "@FAKE(kid2)"}},
    {"name": "pal", "env": {"FAKE_CLAUDE_DIR": "@FAKE(pal)"}}
  ]
}"#;

const AGENTS: [&str; 4] = ["boss", "kid1", "kid2", "pal"];

fn up() -> Up {
    let up = Up::start(FLEET, &AGENTS);
    for a in AGENTS {
        up.wait_prompt(a, KICK, 1);
    }
    up
}

const DOWN: &str = "while you were down";

/// Kills `agent`'s harness and, while it is down, the operator writes to it;
/// the dead harness's pid.
/// Waits until `agent`'s kick turn is over: a harness killed after claude
/// reported success but before the ack reached the broker acks that kick at
/// its next start without running it again (issue 37), which is one kick
/// prompt, not two.
fn kick_acked(up: &Up, agent: &str) {
    wait_for(Duration::from_secs(30), "the kick turn to be acked", || {
        let s: StatusReply = up.agent(agent).call(&Status::default()).ok()?;
        (s.unread == 0 && s.inflight.is_none()).then_some(())
    });
}

fn kill_and_write(up: &Up, agent: &str) -> u32 {
    let pid = up.wait_running(agent);
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    ok(
        &mut up.host(),
        Send {
            to: agent.into(),
            body: DOWN.into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    pid
}

/// Waits until `agent` runs again after the harness `pid` died, got the
/// operator's message and has nothing left queued or inflight; its new pid.
fn wait_back_and_drained(up: &Up, agent: &str, pid: u32) -> u32 {
    let new_pid = wait_for(Duration::from_secs(30), "the agent to come back", || {
        let s = up.state(agent)?;
        (s.state == "running" && s.pid != Some(pid) && s.restarts >= 1).then_some(s.pid?)
    });
    up.wait_prompt(agent, DOWN, 1);
    wait_for(
        Duration::from_secs(30),
        "the agent's inbox to drain",
        || {
            let s: StatusReply = up.agent(agent).call(&Status::default()).ok()?;
            (s.unread == 0 && s.inflight.is_none()).then_some(())
        },
    );
    new_pid
}

#[test]
fn a_killed_harness_is_restarted_with_one_kick_and_nothing_lost() {
    let up = up();
    kick_acked(&up, "kid1");
    let pid = kill_and_write(&up, "kid1");
    assert_ne!(wait_back_and_drained(&up, "kid1", pid), pid);
    assert_eq!(up.prompts_with("kid1", KICK), 2, "one kick per (re)start");
    assert_eq!(up.prompts_with("kid1", DOWN), 1);
    // The others were not touched.
    assert_eq!(up.prompts_with("kid2", KICK), 1);
}

#[test]
fn a_harness_killed_during_its_kick_turn_gets_that_kick_and_no_second() {
    // kid1's first turn (its kick) waits for `go`, so the kill lands mid-turn.
    let wait_for_go = r#"for _ in $(seq 300); do [ -f "$dir/go" ] && break; sleep 0.1; done
ok_turn "done""#;
    let launch = Launch {
        steps: vec![("kid1".into(), 1, wait_for_go.into())],
        ..Launch::default()
    };
    let up = Up::launch(FLEET, &AGENTS, launch);
    up.wait_prompt("kid1", KICK, 1);
    let pid = kill_and_write(&up, "kid1");
    std::fs::write(up.fake("kid1").dir.join("go"), "").unwrap();
    wait_back_and_drained(&up, "kid1", pid);
    // The kick the dead harness had is handed out again; the new harness's
    // own start queued no second one.
    assert_eq!(
        up.prompts_with("kid1", KICK),
        2,
        "the kick once more, no second"
    );
    assert_eq!(up.prompts_with("kid1", DOWN), 1);
}

#[test]
fn a_spawn_request_runs_after_the_operator_approves() {
    let up = up();
    let r = ok(
        &mut up.agent("boss"),
        RequestSpawn {
            name: "kid3".into(),
        },
    );
    let id = r["id"].as_i64().unwrap();
    assert!(up.state("kid3").is_none(), "nothing runs before approval");
    let socket = up.data().join("run/host.sock");
    let socket = socket.to_str().unwrap();
    let (code, out, err) = run_hive(&["approvals", "--socket", socket], None, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("#{id} spawn of kid3 requested by boss")),
        "{out}"
    );
    let (code, out, err) = run_hive(&["approve", "--socket", socket, &id.to_string()], None, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("kid3 spawned"), "{out}");
    up.wait_running("kid3");
    let (_, out, _) = run_hive(&["agents", "--socket", socket], None, &[]);
    let row = out
        .lines()
        .find(|l| l.starts_with("kid3"))
        .unwrap_or_default();
    assert!(row.contains("boss") && row.contains("running"), "{out}");
    let fleet = std::fs::read_to_string(up.fleet_file()).unwrap();
    let cfg = hyperhive::config::HiveConfig::parse(&fleet).unwrap();
    assert_eq!(cfg.parent_of("kid3"), "boss", "{fleet}");
    // boss hears about the decision; a second spawn of the name is refused.
    up.wait_prompt("boss", &format!("[approval #{id} approved]"), 1);
    let e = refused(
        &mut up.agent("boss"),
        RequestSpawn {
            name: "kid3".into(),
        },
    );
    assert!(e.contains("already exists"), "{e}");
    let e = refused(
        &mut up.agent("boss"),
        RequestSpawn {
            name: "muchtoolong".into(),
        },
    );
    assert!(e.contains("1 to 9"), "{e}");
    // A denied request is told why.
    let r = ok(
        &mut up.agent("boss"),
        RequestSpawn {
            name: "kid4".into(),
        },
    );
    let id = r["id"].as_i64().unwrap();
    let (code, _, err) = run_hive(
        &[
            "deny",
            "--socket",
            socket,
            "--why",
            "not today",
            &id.to_string(),
        ],
        None,
        &[],
    );
    assert_eq!(code, 0, "{err}");
    up.wait_prompt("boss", "not today", 1);
    assert!(up.state("kid4").is_none());
}

#[test]
fn lifecycle_acts_on_own_children_only() {
    let up = up();
    let e = refused(&mut up.agent("boss"), Kill { name: "pal".into() });
    assert!(e.contains("not a child of boss"), "{e}");
    let e = refused(&mut up.agent("boss"), Start { name: "pal".into() });
    assert!(e.contains("not a child of boss"), "{e}");
    let e = refused(
        &mut up.agent("kid1"),
        Kill {
            name: "kid2".into(),
        },
    );
    assert!(e.contains("lifecycle tool group"), "{e}");
    // Its own child: kill keeps it stopped, start brings it back.
    ok(
        &mut up.agent("boss"),
        Kill {
            name: "kid2".into(),
        },
    );
    wait_for(Duration::from_secs(20), "kid2 to stop", || {
        (up.state("kid2")?.state == "stopped").then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        up.state("kid2").unwrap().state,
        "stopped",
        "no restart after kill"
    );
    ok(
        &mut up.agent("boss"),
        Start {
            name: "kid2".into(),
        },
    );
    up.wait_running("kid2");
    up.wait_prompt("kid2", KICK, 2);
    // restart: a new harness, one more kick.
    let pid = up.wait_running("kid1");
    ok(
        &mut up.agent("boss"),
        Restart {
            name: "kid1".into(),
        },
    );
    wait_for(Duration::from_secs(20), "kid1 to restart", || {
        let s = up.state("kid1")?;
        (s.state == "running" && s.pid != Some(pid)).then_some(())
    });
    up.wait_prompt("kid1", KICK, 2);
    // pal was never touched.
    assert_eq!(up.state("pal").unwrap().restarts, 0);
    assert_eq!(up.prompts_with("pal", KICK), 1);
}

#[test]
fn a_root_agent_withdraws_a_pending_approval() {
    let up = up();
    let r = ok(
        &mut up.agent("boss"),
        RequestSpawn {
            name: "kid9".into(),
        },
    );
    let id = r["id"].as_i64().unwrap();
    let ends: hyperhive::proto::cmd::LooseEndsReply = up
        .agent("boss")
        .call(&GetLooseEnds { agent: None })
        .unwrap();
    assert_eq!(ends.approvals.len(), 1, "{ends:?}");
    let e = refused(
        &mut up.agent("pal"),
        CancelLooseEnd {
            kind: LooseEndKind::Approval,
            id,
        },
    );
    assert!(e.contains("may cancel"), "{e}");
    ok(
        &mut up.agent("boss"),
        CancelLooseEnd {
            kind: LooseEndKind::Approval,
            id,
        },
    );
    let pending: hyperhive::proto::cmd::ApprovalsReply = up.host().call(&Approvals {}).unwrap();
    assert!(pending.approvals.is_empty(), "{pending:?}");
    let e = refused(&mut up.host(), Approve { id });
    assert!(e.contains("no pending approval"), "{e}");
}

#[test]
fn a_changed_fleet_entry_fires_needs_update_and_update_rebuilds() {
    let up = up();
    // Let crash_watch seed before the change.
    std::thread::sleep(Duration::from_millis(500));
    let fleet = std::fs::read_to_string(up.fleet_file()).unwrap();
    let changed = fleet.replace(
        r#""name": "kid2", "parent": "boss","#,
        r#""name": "kid2", "parent": "boss", "model": "sonnet","#,
    );
    assert_ne!(fleet, changed);
    std::fs::write(up.fleet_file(), changed).unwrap();
    up.wait_prompt("boss", "[needs_update] kid2", 1);
    assert!(!up.state("kid2").unwrap().up_to_date);
    ok(
        &mut up.agent("boss"),
        Update {
            name: "kid2".into(),
        },
    );
    up.wait_prompt("boss", "[rebuilt] kid2", 1);
    let s = up.state("kid2").unwrap();
    assert!(s.up_to_date);
    assert_eq!(s.applied.model.as_deref(), Some("sonnet"));
    assert_eq!(up.prompts_with("boss", "[needs_update] kid1"), 0);
    // Updating again is harmless.
    ok(
        &mut up.agent("boss"),
        Update {
            name: "kid2".into(),
        },
    );
    up.wait_running("kid2");
}

#[test]
fn scheduling_logs_and_apply_commit() {
    let up = up();
    let mut boss = up.agent("boss");
    let r = ok(
        &mut boss,
        SchedulePrompt {
            body: "check the oven".into(),
            at_unix_timestamp: None,
            delay_seconds: Some(1),
            every_seconds: None,
        },
    );
    assert!(r["id"].as_i64().is_some());
    let r = ok(
        &mut boss,
        SchedulePrompt {
            body: "daily digest".into(),
            at_unix_timestamp: None,
            delay_seconds: Some(3600),
            every_seconds: Some(86400),
        },
    );
    let daily = r["id"].as_i64().unwrap();
    let ends: hyperhive::proto::cmd::LooseEndsReply =
        boss.call(&GetLooseEnds { agent: None }).unwrap();
    assert!(ends.scheduled.iter().any(|s| s.id == daily), "{ends:?}");
    up.wait_prompt("boss", "check the oven", 1);
    let list: hyperhive::proto::cmd::ScheduledReply = boss.call(&ListScheduled {}).unwrap();
    assert_eq!(list.scheduled.len(), 1, "the one-shot is gone: {list:?}");
    ok(&mut boss, CancelScheduled { id: daily });
    let e = refused(&mut boss, CancelScheduled { id: daily });
    assert!(e.contains("no scheduled prompt"), "{e}");
    let e = refused(
        &mut up.agent("pal"),
        SchedulePrompt {
            body: "x".into(),
            at_unix_timestamp: None,
            delay_seconds: Some(1),
            every_seconds: None,
        },
    );
    assert!(e.contains("scheduling tool group"), "{e}");

    // Logs: own child yes, a stranger no.
    let logs: hyperhive::proto::TextReply = boss
        .call(&GetLogs {
            agent: Some("kid1".into()),
            lines: Some(50),
        })
        .unwrap();
    assert!(logs.text.contains("hive serve kid1"), "{}", logs.text);
    let e = refused(
        &mut boss,
        GetLogs {
            agent: Some("pal".into()),
            lines: None,
        },
    );
    assert!(e.contains("query_agent_state"), "{e}");
    let e = refused(
        &mut boss,
        GetHostJournal {
            unit: None,
            lines: None,
        },
    );
    assert!(e.contains("read_host_journal"), "{e}");

    // A fleet-entry change through an approval.
    let r = ok(
        &mut boss,
        RequestApplyCommit {
            agent: "kid1".into(),
            commit_ref: r#"{"model":"opus","env":{"EXTRA":"1"}}"#.into(),
        },
    );
    let id = r["id"].as_i64().unwrap();
    let e = refused(
        &mut boss,
        RequestApplyCommit {
            agent: "pal".into(),
            commit_ref: "{}".into(),
        },
    );
    assert!(e.contains("neither you nor one of your children"), "{e}");
    // A patch file must be in the requester's own dir (relative to its state dir).
    let state = up.data().join("agents/boss/state");
    std::fs::write(state.join("kid2.json"), r#"{"model":"haiku"}"#).unwrap();
    let r = ok(
        &mut boss,
        RequestApplyCommit {
            agent: "kid2".into(),
            commit_ref: "kid2.json".into(),
        },
    );
    assert!(r["id"].as_i64().is_some());
    for outside in ["/etc/hostname", "../../kid1/state/x.json"] {
        let e = refused(
            &mut boss,
            RequestApplyCommit {
                agent: "kid2".into(),
                commit_ref: outside.into(),
            },
        );
        assert!(
            e.contains("outside your own dir") || e.contains("neither a JSON object"),
            "{outside}: {e}"
        );
    }
    ok(&mut up.host(), Approve { id });
    wait_for(Duration::from_secs(20), "kid1 to run its new entry", || {
        let s = up.state("kid1")?;
        (s.state == "running" && s.applied.model.as_deref() == Some("opus")).then_some(())
    });
    let cfg = hyperhive::config::HiveConfig::load(&up.fleet_file()).unwrap();
    let kid1 = cfg.agent("kid1").unwrap();
    assert_eq!(kid1.env.get("EXTRA").map(String::as_str), Some("1"));
    assert!(
        kid1.env.contains_key("FAKE_CLAUDE_DIR"),
        "merge keeps the rest"
    );
}

#[test]
fn sigterm_stops_agents_then_the_broker() {
    let mut up = up();
    let pids: Vec<u32> = up.states().iter().filter_map(|s| s.pid).collect();
    assert_eq!(pids.len(), AGENTS.len());
    let status = up.terminate();
    assert!(status.success(), "{status}: {}", up.log());
    for pid in pids {
        let alive = unsafe { libc::kill(pid as i32, 0) } == 0;
        assert!(!alive, "agent {pid} still runs");
    }
    assert!(!up.data().join("run/host.sock").exists());
}

#[test]
fn plain_broker_answers_lifecycle_with_a_clear_error_and_keeps_schedules() {
    let mut b = Broker::start_config(
        r#"{"agents":[{"name":"boss","tool_groups":["lifecycle","scheduling","diagnostics"]},
                      {"name":"kid","parent":"boss"}]}"#,
    );
    let e = refused(&mut b.agent("boss"), Kill { name: "kid".into() });
    assert!(e.contains("without a supervisor"), "{e}");
    let e = refused(
        &mut b.agent("boss"),
        GetLogs {
            agent: None,
            lines: None,
        },
    );
    assert!(e.contains("without a supervisor"), "{e}");
    ok(
        &mut b.agent("boss"),
        SchedulePrompt {
            body: "later".into(),
            at_unix_timestamp: None,
            delay_seconds: Some(3600),
            every_seconds: None,
        },
    );
    b.restart();
    let list: hyperhive::proto::cmd::ScheduledReply =
        b.agent("boss").call(&ListScheduled {}).unwrap();
    assert_eq!(
        list.scheduled.len(),
        1,
        "scheduled prompts survive a restart"
    );
    let e = refused(&mut b.host(), Supervision {});
    assert!(e.contains("without a supervisor"), "{e}");
}

#[test]
fn the_host_journal_needs_its_capability_and_says_when_there_is_none() {
    let b = Broker::start_config(
        r#"{"agents":[{"name":"ops","tool_groups":["diagnostics"],"capabilities":["read_host_journal"]},
                      {"name":"dev","tool_groups":["diagnostics"]}]}"#,
    );
    let e = refused(
        &mut b.agent("dev"),
        GetHostJournal {
            unit: None,
            lines: None,
        },
    );
    assert!(e.contains("read_host_journal capability"), "{e}");
    let journal = Request::from(GetHostJournal {
        unit: Some("hive-test-nonexistent.service".into()),
        lines: Some(5),
    });
    let r = call_raw(
        &mut b.agent("ops"),
        &serde_json::to_string(&journal).unwrap(),
    );
    match r {
        Ok(m) => assert!(m["text"].is_string(), "{m:?}"),
        Err(hyperhive::proto::ClientError::Refused(e)) => assert!(
            e.contains("journalctl is not available") || e.contains("journalctl failed"),
            "{e}"
        ),
        Err(e) => panic!("{e}"),
    }
    let e = refused(
        &mut b.agent("ops"),
        GetHostJournal {
            unit: Some("--all".into()),
            lines: None,
        },
    );
    assert!(e.contains("not a unit name"), "{e}");
}

#[test]
fn hive_mcp_lists_privileged_tools_but_the_broker_decides() {
    use common::mcp::McpProc;
    use serde_json::json;
    let up = up();
    let socket = |a: &str| {
        up.data()
            .join("run/agents")
            .join(a)
            .join("mcp.sock")
            .display()
            .to_string()
    };
    let boss_sock = socket("boss");
    let mut boss = McpProc::start(
        &[
            ("HIVE_SOCKET", boss_sock.as_str()),
            ("HIVE_TOOL_GROUPS", "messaging,lifecycle,scheduling"),
        ],
        &up.dir.path().join("mcp-boss.log"),
    );
    boss.initialize();
    let list = boss.request(1, "tools/list", json!({}));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for want in [
        "request_spawn",
        "kill",
        "update",
        "schedule_prompt",
        "cancel_scheduled",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(!names.contains(&"get_logs"), "diagnostics is not enabled");
    let text = boss.ok(
        2,
        "schedule_prompt",
        json!({"body": "tea", "delay_seconds": 3600}),
    );
    assert!(text.contains("fire_at"), "{text}");
    let text = boss.tool_error(3, "kill", json!({"name": "pal"}));
    assert!(text.starts_with("refused by the broker:"), "{text}");

    // kid1's fleet entry has no lifecycle group: listing it does not grant it.
    let kid_sock = socket("kid1");
    let mut kid = McpProc::start(
        &[
            ("HIVE_SOCKET", kid_sock.as_str()),
            ("HIVE_TOOL_GROUPS", "messaging,lifecycle"),
        ],
        &up.dir.path().join("mcp-kid1.log"),
    );
    kid.initialize();
    let text = kid.tool_error(1, "kill", json!({"name": "kid2"}));
    assert!(text.contains("lifecycle tool group"), "{text}");
    assert_eq!(up.state("kid2").unwrap().state, "running");
}

#[test]
fn hive_up_without_a_config_runs_ruth_in_hive_data_and_prints_the_pages() {
    use common::hive::{hive_bin, FakeClaude, TempDir};
    use std::io::BufRead;
    let dir = TempDir::new("up0");
    let fake = dir.path().join("fake");
    std::fs::create_dir_all(&fake).unwrap();
    let mut child = std::process::Command::new(hive_bin())
        .arg("up")
        .current_dir(dir.path())
        .env("HIVE_CLAUDE_BIN", FakeClaude::bin())
        .env("FAKE_CLAUDE_DIR", &fake)
        .env("ANTHROPIC_API_KEY", "sk-test")
        .env("HIVE_UP_STOP_GRACE_MS", "3000")
        // Not web.listen's default, 127.0.0.1:7890, which a hive of the
        // machine's own may hold: the old override, still honoured.
        .env("HIVE_DASHBOARD_PORT", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.starts_with("ruth: ")) {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(l) => lines.push(l),
            Err(_) => {
                let _ = child.kill();
                panic!("no page printed: {lines:?}");
            }
        }
    }
    let ruth = lines.iter().find(|l| l.starts_with("ruth: ")).unwrap();
    assert!(ruth.starts_with("ruth: http://127.0.0.1:"), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("dashboard: http://127.0.0.1:")),
        "{lines:?}"
    );
    let data = dir.path().join("hive-data");
    // The agent runs with the umask hive up was started with, not the broker's 077.
    let umask = unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old as u32
    };
    use std::os::unix::fs::PermissionsExt;
    // A file claude writes (the fake's invocation counter); hive's own state
    // files are 0600 whatever the umask.
    let count = fake.join("count");
    wait_for(Duration::from_secs(20), "ruth's first turn", || {
        count.exists().then_some(())
    });
    let mode = std::fs::metadata(&count).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666 & !umask, "umask {umask:o}");
    // Its page is at /agent/ruth/ on hive up's listener: the harness opens
    // no port of its own and writes no port file.
    assert!(ruth.contains("/agent/ruth/"), "{ruth}");
    assert!(!data.join("agents/ruth/state/hyperhive-port").exists());
    let token_file = data.join("agents/ruth/state/web-token");
    let mode = std::fs::metadata(token_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let cfg = hyperhive::config::HiveConfig::load(&data.join("hive.json")).unwrap();
    assert_eq!(cfg.agents.len(), 1);
    assert_eq!(cfg.agents[0].name, "ruth");
    // The operator commands find ./hive-data/run/host.sock by themselves.
    let out = std::process::Command::new(hive_bin())
        .arg("agents")
        .current_dir(dir.path())
        .env_remove("HIVE_HOST_SOCKET")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ruth"), "{text}");
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = wait_for(Duration::from_secs(20), "hive up to stop", || {
        child.try_wait().ok().flatten()
    });
    assert!(status.success(), "{status}");
}

#[test]
fn sigterm_requeues_an_inflight_turn_and_the_next_hive_up_finishes_it() {
    let mut up = up();
    let fake = up.fake("pal");
    let next = fake.count() + 1;
    fake.step(next, "sleep 30; ok_turn slow");
    ok(
        &mut up.host(),
        Send {
            to: "pal".into(),
            body: "a long job".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    fake.wait_count(next);
    let status = up.terminate();
    assert!(status.success(), "{status}");
    up.restart(&AGENTS);
    up.wait_prompt("pal", "a long job", 2);
    wait_for(Duration::from_secs(30), "pal's inbox to drain", || {
        let r: hyperhive::proto::cmd::AgentsReply = up.host().call(&Agents {}).ok()?;
        let pal = r.agents.into_iter().find(|a| a.name == "pal")?;
        (pal.unread == 0 && pal.inflight.is_none()).then_some(())
    });
}

#[test]
fn a_rebuilt_binary_makes_every_agent_stale_until_updated() {
    let up = Up::start_with(FLEET, &AGENTS, true);
    for a in AGENTS {
        up.wait_prompt(a, KICK, 1);
    }
    std::thread::sleep(Duration::from_millis(500));
    up.rebuild_binary();
    // boss hears about its children; pal (a root) is the operator's.
    up.wait_prompt("boss", "[needs_update] kid1", 1);
    up.wait_prompt("boss", "[needs_update] kid2", 1);
    wait_for(
        Duration::from_secs(20),
        "the operator to hear about pal",
        || {
            let r: hyperhive::proto::MessagesReply = up
                .host()
                .call(&Inbox {
                    wait_seconds: None,
                    peek: true,
                    after: None,
                })
                .ok()?;
            r.messages
                .iter()
                .any(|m| m.kind == "needs_update" && m.body.contains("pal"))
                .then_some(())
        },
    );
    ok(
        &mut up.agent("boss"),
        Update {
            name: "kid1".into(),
        },
    );
    up.wait_prompt("boss", "[rebuilt] kid1", 1);
    assert!(up.state("kid1").unwrap().up_to_date);
    assert!(
        !up.state("kid2").unwrap().up_to_date,
        "kid2 was not updated"
    );
    assert_eq!(up.prompts_with("boss", "[rebuilt] kid2"), 0);
}

#[test]
fn credentials_appearing_and_going_are_reported_to_the_manager() {
    let fleet = r#"{"agents": [
      {"name": "boss", "env": {"FAKE_CLAUDE_DIR": "@FAKE(boss)", "ANTHROPIC_API_KEY": "sk-test"}},
      {"name": "kid", "parent": "boss", "env": {"FAKE_CLAUDE_DIR": "@FAKE(kid)"}}
    ]}"#;
    let up = Up::start_opts(fleet, &["boss", "kid"], false, false);
    up.wait_prompt("boss", KICK, 1);
    assert!(!up.state("kid").unwrap().logged_in);
    // Seeded as logged out: nothing fires for that at boot.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(up.prompts_with("boss", "[needs_login] kid"), 0);
    let creds = up.data().join("agents/kid/claude/.credentials.json");
    std::fs::write(&creds, "{}").unwrap();
    up.wait_prompt("boss", "[logged_in] kid", 1);
    // The harness resumes from its login park and runs its kick turn.
    up.wait_prompt("kid", KICK, 1);
    std::fs::remove_file(&creds).unwrap();
    up.wait_prompt("boss", "[needs_login] kid", 1);
    assert_eq!(up.prompts_with("boss", "[logged_in] kid"), 1);
}
