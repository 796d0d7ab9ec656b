//! The operator's side of a running `hive up`, end to end with the fake
//! claude: `hive stop|start|restart|update` on any agent (a root agent
//! included; a stop lasts across restarts of `hive up`, the agent's mail
//! queues meanwhile), their refusals (an agent socket, an unknown agent, a
//! plain `hive broker`), a root agent's needs_update naming the command; the
//! fleet file as the operator's (hand edits survive an approval and a
//! permissions save, a conflicting change and an unwritable file are refused
//! with nothing changed); the loose ends an agent's model sees and may close
//! (approvals with who may withdraw them, scheduled prompts); and
//! `get_host_journal` granted by its capability alone.

mod common;

use common::hive::{ok, refused, run_hive, wait_for, Broker};
use common::mcp::McpProc;
use common::up::{Launch, Up};
use hyperhive::config::HiveConfig;
use hyperhive::proto::cmd::{
    Agents, AgentsReply, Approve, CancelLooseEnd, RequestApplyCommit, RequestSpawn, SchedulePrompt,
    Send, SetPermissions, StopAgent,
};
use hyperhive::proto::{Capability, LooseEndKind, MessagesReply, ToolGroup};
use serde_json::json;
use std::time::Duration;

const KICK: &str = "You were just (re)started";

const FLEET: &str = r#"{
  "agents": [
    {"name": "boss",
     "tool_groups": ["messaging", "meta", "inbox", "lifecycle", "approvals", "scheduling"],
     "env": {"FAKE_CLAUDE_DIR": "@FAKE(boss)"}},
    {"name": "kid", "parent": "boss",
     "tool_groups": ["messaging", "meta", "inbox", "approvals"],
     "env": {"FAKE_CLAUDE_DIR": "@FAKE(kid)"}},
    {"name": "pal", "env": {"FAKE_CLAUDE_DIR": "@FAKE(pal)"}}
  ]
}"#;

const AGENTS: [&str; 3] = ["boss", "kid", "pal"];

/// A `hive up` of the three agents, each done with its first turn: the
/// kick acknowledged, nothing inflight (a stop during that turn would
/// requeue the kick, and the counts below would be off by one).
fn up() -> Up {
    let up = Up::start(FLEET, &AGENTS);
    for a in AGENTS {
        up.wait_prompt(a, KICK, 1);
    }
    for a in AGENTS {
        wait_for(
            Duration::from_secs(20),
            &format!("{a}'s first turn to end"),
            || {
                let r: AgentsReply = up.host().call(&Agents {}).ok()?;
                let row = r.agents.into_iter().find(|r| r.name == a)?;
                (row.inflight.is_none() && row.unread == 0).then_some(())
            },
        );
    }
    up
}

/// `hive ARGS --socket HOST`; (exit code, stdout, stderr).
fn hive(up: &Up, args: &[&str]) -> (i32, String, String) {
    let socket = up.data().join("run/host.sock");
    let mut all: Vec<&str> = args.to_vec();
    let socket = socket.to_str().unwrap().to_string();
    all.push("--socket");
    all.push(&socket);
    run_hive(&all, None, &[])
}

fn agents_row(up: &Up, name: &str) -> String {
    let (code, out, err) = hive(up, &["agents"]);
    assert_eq!(code, 0, "{err}");
    out.lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_default()
        .to_string()
}

fn unread(up: &Up, name: &str) -> u64 {
    let r: AgentsReply = up.host().call(&Agents {}).unwrap();
    r.agents.iter().find(|a| a.name == name).unwrap().unread
}

fn operator_inbox(up: &Up) -> Vec<hyperhive::proto::Message> {
    let r: MessagesReply = up
        .host()
        .call(&hyperhive::proto::cmd::Inbox {
            wait_seconds: None,
            peek: true,
            after: None,
        })
        .unwrap();
    r.messages
}

#[test]
fn the_operator_stops_and_starts_any_agent_and_a_stop_lasts_across_restarts() {
    let mut up = up();
    // A root agent, which no manager can reach.
    let (code, out, err) = hive(&up, &["stop", "pal"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "pal is stopping and stays stopped");
    wait_for(Duration::from_secs(20), "pal to stop", || {
        (up.state("pal")?.state == "stopped").then_some(())
    });
    assert!(
        agents_row(&up, "pal").contains("stopped"),
        "{}",
        agents_row(&up, "pal")
    );
    // Its mail queues.
    ok(
        &mut up.host(),
        Send {
            to: "pal".into(),
            body: "read me when you are back".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    assert_eq!(unread(&up, "pal"), 1);

    // A restart of hive up keeps it stopped; the others run.
    let status = up.terminate();
    assert!(status.success(), "{status}");
    up.restart(&["boss", "kid"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(up.state("pal").unwrap().state, "stopped");
    assert_eq!(up.prompts_with("pal", "read me when you are back"), 0);
    assert!(up.stdout().contains("pal: stopped"), "{}", up.stdout());

    let (code, out, err) = hive(&up, &["start", "pal"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), "pal started");
    up.wait_running("pal");
    up.wait_prompt("pal", "read me when you are back", 1);

    // Started, it is no longer kept stopped: the next hive up runs it.
    let status = up.terminate();
    assert!(status.success(), "{status}");
    up.restart(&AGENTS);

    // restart and update on a root agent, --json for scripts.
    let pid = up.wait_running("pal");
    let (code, out, err) = hive(&up, &["restart", "pal", "--json"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim(), r#"{"ok":true,"text":"pal is restarting"}"#);
    wait_for(Duration::from_secs(20), "pal to restart", || {
        let s = up.state("pal")?;
        (s.state == "running" && s.pid != Some(pid)).then_some(())
    });
    let (code, out, err) = hive(&up, &["update", "pal"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("already runs the current binary and config"),
        "{out}"
    );
}

#[test]
fn the_lifecycle_commands_refuse_clearly() {
    let up = up();
    let (code, _, err) = hive(&up, &["stop", "zed"]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown agent \"zed\""), "{err}");
    let (code, _, err) = hive(&up, &["update"]);
    assert_eq!(code, 2, "a usage error");
    assert!(err.contains("missing AGENT"), "{err}");
    // Agents cannot send the operator's commands, not even with lifecycle.
    let e = refused(&mut up.agent("boss"), StopAgent { name: "pal".into() });
    assert_eq!(
        e,
        "stop_agent is an operator command; this is the socket of agent boss"
    );
    // A manager still acts on its own children only.
    let e = refused(
        &mut up.agent("boss"),
        hyperhive::proto::cmd::Kill { name: "pal".into() },
    );
    assert!(e.contains("not a child of boss"), "{e}");
    assert_eq!(up.state("pal").unwrap().state, "running");

    // Without a supervisor.
    let b = Broker::start(&["ana"]);
    let socket = b.host_socket();
    let socket = socket.to_str().unwrap();
    for verb in ["start", "stop", "restart", "update"] {
        let (code, _, err) = run_hive(&[verb, "ana", "--socket", socket], None, &[]);
        assert_eq!(code, 1, "{verb}");
        assert!(
            err.contains("this broker runs without a supervisor (plain `hive broker`)"),
            "{verb}: {err}"
        );
    }
}

/// A manager's `kill` is the same stop: it lasts across restarts too.
#[test]
fn a_child_killed_by_its_manager_stays_stopped_across_restarts() {
    let mut up = up();
    ok(
        &mut up.agent("boss"),
        hyperhive::proto::cmd::Kill { name: "kid".into() },
    );
    wait_for(Duration::from_secs(20), "kid to stop", || {
        (up.state("kid")?.state == "stopped").then_some(())
    });
    let status = up.terminate();
    assert!(status.success(), "{status}");
    up.restart(&["boss", "pal"]);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(up.state("kid").unwrap().state, "stopped");
    ok(
        &mut up.agent("boss"),
        hyperhive::proto::cmd::Start { name: "kid".into() },
    );
    up.wait_running("kid");
}

#[test]
fn a_root_agents_needs_update_names_the_command_that_updates_it() {
    let up = Up::start_with(FLEET, &AGENTS, true);
    for a in AGENTS {
        up.wait_prompt(a, KICK, 1);
    }
    std::thread::sleep(Duration::from_millis(500));
    up.rebuild_binary();
    let notice = wait_for(Duration::from_secs(20), "pal's needs_update", || {
        operator_inbox(&up)
            .into_iter()
            .find(|m| m.kind == "needs_update" && m.body.contains("pal"))
    });
    assert!(
        notice.body.contains("run `hive update pal`"),
        "{}",
        notice.body
    );
    // boss hears about kid with the tool it has.
    up.wait_prompt("boss", "mcp__hyperhive__update(name=\"kid\")", 1);
    let (code, out, err) = hive(&up, &["update", "pal"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("pal is rebuilding"), "{out}");
    wait_for(
        Duration::from_secs(20),
        "the operator to hear pal is rebuilt",
        || {
            operator_inbox(&up)
                .iter()
                .any(|m| m.kind == "rebuilt" && m.body.contains("pal"))
                .then_some(())
        },
    );
    let s = up.state("pal").unwrap();
    assert!(s.up_to_date);
    assert!(s.last_rebuild.unwrap().ok);
}

/// Hand edits to the fleet file survive an approved spawn, an approved patch
/// and a permissions save; an agent whose entry was edited by hand stays
/// needs_update (no false `[rebuilt]`); the file keeps its mode.
#[test]
fn hand_edits_to_the_fleet_file_survive_approvals_and_permission_saves() {
    use std::os::unix::fs::PermissionsExt;
    let up = up();
    std::thread::sleep(Duration::from_millis(500));
    let path = up.fleet_file();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    // As root, a file of another user: hive keeps its owner too.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    }
    // By hand: pal gets a model, kid an extra variable.
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["agents"][2]["model"] = json!("sonnet");
    cfg["agents"][1]["env"]["BY_HAND"] = json!("1");
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let by_hand = HiveConfig::load(&path).unwrap();
    assert_eq!(
        by_hand.agent("pal").unwrap().model.as_deref(),
        Some("sonnet")
    );
    wait_for(Duration::from_secs(20), "pal to be stale", || {
        (!up.state("pal")?.up_to_date).then_some(())
    });
    up.wait_prompt("boss", "[needs_update] kid", 1);

    // An approved spawn adds its entry and keeps both hand edits.
    let r = ok(
        &mut up.agent("boss"),
        RequestSpawn {
            name: "kid3".into(),
        },
    );
    let id = r["id"].as_i64().unwrap();
    let (code, out, err) = hive(&up, &["approve", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("kid3 spawned and running"), "{out}");
    up.wait_running("kid3");
    let cfg = HiveConfig::load(&path).unwrap();
    assert_eq!(cfg.parent_of("kid3"), "boss");
    assert_eq!(cfg.agent("pal").unwrap().model.as_deref(), Some("sonnet"));
    assert_eq!(cfg.agent("kid").unwrap().env["BY_HAND"], "1");

    // A permissions save changes kid's groups only: it restarts onto them,
    // but not onto the hand edit, so it stays stale.
    let r = ok(
        &mut up.host(),
        SetPermissions {
            agent: "kid".into(),
            tool_groups: vec![ToolGroup::Messaging, ToolGroup::Inbox],
            capabilities: vec![Capability::QueryAgentState],
        },
    );
    assert!(r["text"].as_str().unwrap().contains("kid"), "{r:?}");
    wait_for(Duration::from_secs(20), "kid to run its new groups", || {
        let s = up.state("kid")?;
        (s.state == "running" && s.applied.tool_groups == ["messaging", "inbox"]).then_some(s)
    });
    let s = up.state("kid").unwrap();
    assert!(
        !s.applied.env.contains_key("BY_HAND"),
        "hive applies only its change"
    );
    let cfg = HiveConfig::load(&path).unwrap();
    let kid = cfg.agent("kid").unwrap();
    assert_eq!(kid.tool_groups, ["messaging", "inbox"]);
    assert_eq!(kid.capabilities, [Capability::QueryAgentState]);
    assert_eq!(kid.env["BY_HAND"], "1", "the hand edit stays");
    assert_eq!(cfg.agent("pal").unwrap().model.as_deref(), Some("sonnet"));
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(
        meta.permissions().mode() & 0o777,
        0o640,
        "the file keeps its mode"
    );
    if root {
        assert_eq!((meta.uid(), meta.gid()), (65534, 65534), "and its owner");
    }

    // An approved patch of boss's own entry, likewise.
    let r = ok(
        &mut up.agent("boss"),
        RequestApplyCommit {
            agent: "boss".into(),
            commit_ref: r#"{"model":"opus"}"#.into(),
        },
    );
    ok(
        &mut up.host(),
        Approve {
            id: r["id"].as_i64().unwrap(),
        },
    );
    wait_for(Duration::from_secs(20), "boss to run opus", || {
        let s = up.state("boss")?;
        (s.state == "running" && s.applied.model.as_deref() == Some("opus")).then_some(())
    });
    let cfg = HiveConfig::load(&path).unwrap();
    assert_eq!(cfg.agent("boss").unwrap().model.as_deref(), Some("opus"));
    assert_eq!(cfg.agent("kid").unwrap().env["BY_HAND"], "1");
    assert!(cfg.agent("kid3").is_some());

    // Still stale, both: no false [rebuilt], for the operator or for boss.
    std::thread::sleep(Duration::from_millis(800));
    assert!(!up.state("pal").unwrap().up_to_date);
    assert!(!up.state("kid").unwrap().up_to_date);
    assert!(!operator_inbox(&up)
        .iter()
        .any(|m| m.kind == "rebuilt" && m.body.contains("pal")));
    assert_eq!(up.prompts_with("boss", "[rebuilt] kid"), 0);
    // `hive update` applies the hand edit.
    let (code, _, err) = hive(&up, &["update", "kid"]);
    assert_eq!(code, 0, "{err}");
    wait_for(Duration::from_secs(20), "kid to run the hand edit", || {
        let s = up.state("kid")?;
        (s.state == "running" && s.up_to_date && s.applied.env.contains_key("BY_HAND"))
            .then_some(())
    });
    up.wait_prompt("boss", "[rebuilt] kid", 1);
}

/// The same key changed by hand and by a permissions save is refused, with
/// the file and the agent as they were.
#[test]
fn a_change_to_a_key_edited_by_hand_is_refused_with_nothing_changed() {
    let up = up();
    let path = up.fleet_file();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["agents"][1]["tool_groups"] = json!(["messaging", "meta"]);
    let by_hand = serde_json::to_string_pretty(&cfg).unwrap();
    std::fs::write(&path, &by_hand).unwrap();
    let pid = up.wait_running("kid");
    let e = refused(
        &mut up.host(),
        SetPermissions {
            agent: "kid".into(),
            tool_groups: vec![ToolGroup::Messaging, ToolGroup::Scheduling],
            capabilities: vec![],
        },
    );
    assert!(
        e.starts_with("kid's tool_groups was changed by hand in the fleet file"),
        "{e}"
    );
    assert!(e.contains("nothing was changed"), "{e}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), by_hand);
    let s = up.state("kid").unwrap();
    assert_eq!((s.state.as_str(), s.pid), ("running", Some(pid)));
    assert_eq!(
        s.applied.tool_groups,
        ["messaging", "meta", "inbox", "approvals"]
    );
    // The same value by hand and by the save is no conflict.
    ok(
        &mut up.host(),
        SetPermissions {
            agent: "kid".into(),
            tool_groups: vec![ToolGroup::Meta, ToolGroup::Messaging],
            capabilities: vec![],
        },
    );
}

/// A fleet file hive cannot write refuses the approval: nothing changes, the
/// approval stays pending, the message names the file.
#[test]
fn a_fleet_file_hive_cannot_write_refuses_the_approval() {
    use std::os::unix::fs::PermissionsExt;
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: running hive up as uid 65534 needs root");
        return;
    }
    let up = Up::launch(
        FLEET,
        &AGENTS,
        Launch {
            wrapper: [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
            ]
            .map(String::from)
            .to_vec(),
            owner: Some(65534),
            ..Launch::default()
        },
    );
    let path = up.fleet_file();
    let dir = path.parent().unwrap().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    let before = std::fs::read_to_string(&path).unwrap();
    let r = ok(
        &mut up.agent("boss"),
        RequestSpawn {
            name: "kid3".into(),
        },
    );
    let id = r["id"].as_i64().unwrap();
    let (code, _, err) = hive(&up, &["approve", &id.to_string()]);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("cannot write the fleet file {}", path.display())),
        "{err}"
    );
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    assert!(up.state("kid3").is_none());
    let (code, out, _) = hive(&up, &["approvals"]);
    assert_eq!(code, 0);
    assert!(
        out.contains(&format!("#{id} spawn of kid3")),
        "still pending: {out}"
    );
    // Writable again, the same approval goes through.
    let (code, out, err) = hive(&up, &["approve", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("kid3 spawned"), "{out}");
}

/// `get_loose_ends` as the model reads it (through a real `hive mcp`): kinds
/// and ids `cancel_loose_end` takes, who may withdraw an approval; the root
/// agent withdraws its tree's, the requester cannot; a scheduled prompt
/// needs the scheduling group.
#[test]
fn loose_ends_show_approvals_and_scheduled_prompts_and_who_may_close_them() {
    let up = up();
    let mcp = |agent: &str, groups: &str| {
        let socket = up.data().join("run/agents").join(agent).join("mcp.sock");
        let socket = socket.display().to_string();
        let log = up.dir.path().join(format!("mcp-{agent}.log"));
        let mut p = McpProc::start(
            &[
                ("HIVE_SOCKET", socket.as_str()),
                ("HIVE_TOOL_GROUPS", groups),
            ],
            &log,
        );
        p.initialize();
        p
    };
    let mut boss = mcp("boss", "messaging,inbox,lifecycle,approvals,scheduling");
    let mut kid = mcp("kid", "messaging,inbox,approvals");
    let mut pal = mcp("pal", "messaging,inbox");

    let own = kid.ok(
        1,
        "request_apply_commit",
        json!({"agent": "kid", "commit_ref": "{\"model\":\"opus\"}"}),
    );
    let own: serde_json::Value = serde_json::from_str(&own).unwrap();
    let kid_id = own["id"].as_i64().unwrap();
    let spawn = ok(
        &mut up.agent("boss"),
        RequestSpawn {
            name: "kid9".into(),
        },
    );
    let boss_id = spawn["id"].as_i64().unwrap();
    let sched = ok(
        &mut up.agent("boss"),
        SchedulePrompt {
            body: "daily digest".into(),
            at_unix_timestamp: None,
            delay_seconds: Some(3600),
            every_seconds: Some(86400),
        },
    );
    let sched_id = sched["id"].as_i64().unwrap();

    let text = kid.ok(2, "get_loose_ends", json!({}));
    assert!(
        text.contains(&format!(
            "approval #{kid_id} (apply_commit of kid, requested by kid): pending; only your root \
             agent or the operator can withdraw it"
        )),
        "{text}"
    );
    assert!(!text.contains(&format!("approval #{boss_id}")), "{text}");
    let text = boss.ok(2, "get_loose_ends", json!({}));
    for id in [kid_id, boss_id] {
        assert!(
            text.contains(&format!(
                "; cancel_loose_end(kind=\"approval\", id={id}) withdraws it"
            )),
            "{text}"
        );
    }
    assert!(
        text.contains(&format!(
            "scheduled #{sched_id} (a scheduled prompt) fires "
        )),
        "{text}"
    );
    assert!(text.contains(", then every 86400s: daily digest"), "{text}");

    // The requester cannot withdraw it; a stranger neither; its root can.
    let e = kid.tool_error(
        3,
        "cancel_loose_end",
        json!({"kind": "approval", "id": kid_id}),
    );
    assert_eq!(
        e,
        format!(
            "refused by the broker: approval #{kid_id} can be withdrawn only by your root agent \
             (boss) or the operator; ask them"
        )
    );
    let e = pal.tool_error(
        3,
        "cancel_loose_end",
        json!({"kind": "approval", "id": kid_id}),
    );
    assert!(
        e.contains("pal may cancel only the approvals of its own tree"),
        "{e}"
    );
    let done = boss.ok(
        3,
        "cancel_loose_end",
        json!({"kind": "approval", "id": kid_id}),
    );
    assert_eq!(
        done,
        format!("withdrew approval #{kid_id}; its requester is told")
    );
    up.wait_prompt("kid", &format!("[approval #{kid_id} cancelled by boss]"), 1);

    // Scheduled prompts: the scheduling group's, like cancel_scheduled.
    let e = refused(
        &mut up.agent("kid"),
        CancelLooseEnd {
            kind: LooseEndKind::Scheduled,
            id: sched_id,
        },
    );
    assert!(
        e.starts_with(
            "cancel_loose_end(kind=\"scheduled\") needs the scheduling tool group, which kid is \
             not granted"
        ),
        "{e}"
    );
    let done = boss.ok(
        4,
        "cancel_loose_end",
        json!({"kind": "scheduled", "id": sched_id}),
    );
    assert_eq!(done, format!("deleted scheduled prompt #{sched_id}"));
    let text = boss.ok(5, "get_loose_ends", json!({}));
    assert!(!text.contains("scheduled #"), "{text}");

    // The tool says exactly this.
    let list = boss.request(6, "tools/list", json!({}));
    let tools = list["result"]["tools"].as_array().unwrap();
    let cancel = tools
        .iter()
        .find(|t| t["name"] == "cancel_loose_end")
        .unwrap();
    let description = cancel["description"].as_str().unwrap();
    for want in [
        "kind \"scheduled\"",
        "needs the scheduling tool group",
        "only a root agent may",
        "its root agent or the operator can",
    ] {
        assert!(description.contains(want), "{want}: {description}");
    }
    assert_eq!(
        cancel["inputSchema"]["properties"]["kind"]["enum"],
        json!(["question", "reminder", "approval", "scheduled"])
    );
}

/// `read_host_journal` grants get_host_journal by itself: the broker admits
/// it, `hive mcp` lists it and `hive up` puts it in the agent's
/// `--allowedTools`, without the diagnostics group.
#[test]
fn the_host_journal_is_granted_by_its_capability_alone() {
    let fleet = r#"{"agents": [
      {"name": "ops", "capabilities": ["read_host_journal"], "env": {"FAKE_CLAUDE_DIR": "@FAKE(ops)"}},
      {"name": "dev", "tool_groups": ["messaging", "diagnostics"], "env": {"FAKE_CLAUDE_DIR": "@FAKE(dev)"}}
    ]}"#;
    let up = Up::start(fleet, &["ops", "dev"]);
    up.wait_prompt("ops", KICK, 1);
    up.wait_prompt("dev", KICK, 1);
    let allowed = |agent: &str| {
        let argv = up.fake(agent).argv(1);
        let i = argv.iter().position(|a| a == "--allowedTools").unwrap();
        argv[i + 1].clone()
    };
    assert!(
        allowed("ops").contains("mcp__hyperhive__get_host_journal"),
        "{}",
        allowed("ops")
    );
    assert!(!allowed("ops").contains("get_logs"));
    assert!(
        !allowed("dev").contains("get_host_journal"),
        "{}",
        allowed("dev")
    );
    assert!(allowed("dev").contains("mcp__hyperhive__get_logs"));

    let socket = up.data().join("run/agents/ops/mcp.sock");
    let socket = socket.display().to_string();
    let mut ops = McpProc::start(
        &[
            ("HIVE_SOCKET", socket.as_str()),
            ("HIVE_TOOL_GROUPS", "messaging,meta,inbox,execution"),
            ("HIVE_CAPABILITIES", "read_host_journal"),
        ],
        &up.dir.path().join("mcp-ops.log"),
    );
    ops.initialize();
    let list = ops.request(1, "tools/list", json!({}));
    let names: Vec<&str> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"get_host_journal"), "{names:?}");
    assert!(!names.contains(&"get_logs"), "{names:?}");
    // The broker lets it through (journalctl may be missing on this host:
    // then it says so, which is not a refusal of the capability).
    let r = ops.call(2, "get_host_journal", json!({"lines": 5}));
    let text = common::mcp::text_of(&r["result"]);
    assert!(!text.contains("needs the"), "{text}");
    let e = refused(
        &mut up.agent("dev"),
        hyperhive::proto::cmd::GetHostJournal {
            unit: None,
            lines: None,
        },
    );
    assert!(e.contains("needs the read_host_journal capability"), "{e}");
}
