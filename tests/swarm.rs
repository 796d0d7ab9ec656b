//! Two hives and one homeserver on one machine (issue 17, item 4): two
//! `hive up`, each with its own data dir and a `matrix` section, and one real
//! Synapse. Agents talk across hives in fake claude turns (the fake calls the
//! `hive mcp` tools over stdio, as the real CLI does); a question is asked
//! across hives and answered; 200 messages survive a `kill -9` of the
//! receiving `hive up` and later of the homeserver, each delivered exactly once
//! and in order per sender; a long gap comes back `limited` and loses nothing;
//! an event forged by a room member is ignored; a wrong password or access
//! token stops `hive up` with exit 2; a crashed bridge is restarted. Every
//! wait has a timeout.

mod common;

use common::hive::{ok, wait_for, TempDir};
use common::synapse::{SwarmRoom, Synapse};
use common::up::{Launch, Up};
use hyperhive::proto::cmd::{Agents, AgentsReply, Inbox, Send};
use hyperhive::proto::swarm::{BridgeRow, BridgeState};
use hyperhive::proto::{Message, MessagesReply};
use serde_json::json;
use std::time::Duration;

/// Sourced first by the fake claude steps below: `mcp_call TOOL ARGS` calls a
/// hyperhive tool through the `hive mcp` of this invocation's
/// `--mcp-config`, over stdio (initialize, initialized, tools/call), as the
/// real CLI does, and appends the answer to `$FAKE_CLAUDE_DIR/mcp.log`.
const MCP_CALL: &str = r#"
FAKE_ARGV=("$@")
mcp_call() {
    local cfg="" prev="" a line exe sock groups state
    for a in "${FAKE_ARGV[@]}"; do
        [ "$prev" = --mcp-config ] && cfg="$a"
        prev="$a"
    done
    exe=$(sed -n 's/^ *"command": "\(.*\)",\{0,1\}$/\1/p' "$cfg" | head -1)
    sock=$(sed -n 's/^ *"HIVE_SOCKET": "\(.*\)",\{0,1\}$/\1/p' "$cfg")
    groups=$(sed -n 's/^ *"HIVE_TOOL_GROUPS": "\(.*\)",\{0,1\}$/\1/p' "$cfg")
    state=$(sed -n 's/^ *"HIVE_STATE_DIR": "\(.*\)",\{0,1\}$/\1/p' "$cfg")
    coproc MCP { HIVE_SOCKET="$sock" HIVE_TOOL_GROUPS="$groups" HIVE_STATE_DIR="$state" RUST_LOG=warn "$exe" mcp 2>>"$FAKE_CLAUDE_DIR/mcp.err"; }
    printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"fake-claude","version":"1"}}}' >&"${MCP[1]}"
    read -r -t 20 line <&"${MCP[0]}"
    printf '%s\n' '{"jsonrpc":"2.0","method":"notifications/initialized"}' >&"${MCP[1]}"
    printf '{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"%s","arguments":%s}}\n' "$1" "$2" >&"${MCP[1]}"
    read -r -t 20 line <&"${MCP[0]}"
    printf '%s %s\n' "$1" "$line" >> "$FAKE_CLAUDE_DIR/mcp.log"
    eval "exec ${MCP[1]}>&-"
    wait "$MCP_PID" 2>/dev/null
}
prompt="$(cat "$FAKE_CLAUDE_DIR/inv-$FAKE_N.stdin")"
"#;

/// What `hive up` gets in these tests: short pauses, and debug logs (the
/// bridge logs a skipped event at debug level).
fn launch(extra: &[(&str, &str)]) -> Launch {
    let mut env = vec![
        ("HIVE_BRIDGE_BACKOFF_MS", "100"),
        ("HIVE_BRIDGE_BACKOFF_MAX_MS", "1000"),
    ];
    env.extend_from_slice(extra);
    Launch {
        env: env
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Launch::default()
    }
}

/// The fleet file of `hive` with `agents` (each with its fake claude).
fn fleet(room: &SwarmRoom, hive: &str, agents: &[&str]) -> String {
    let agents: Vec<_> = agents
        .iter()
        .map(|a| json!({"name": a, "env": {"FAKE_CLAUDE_DIR": format!("@FAKE({a})")}}))
        .collect();
    json!({"hive_name": hive, "agents": agents, "matrix": room.matrix_section(hive)}).to_string()
}

fn bridge_row(up: &Up) -> BridgeRow {
    let r: AgentsReply = up.host().call(&Agents {}).unwrap();
    r.bridge.expect("a bridge row")
}

fn wait_bridge(up: &Up, state: BridgeState) {
    wait_for(
        Duration::from_secs(30),
        &format!("the bridge {state}"),
        || (bridge_row(up).state == state).then_some(()),
    );
}

fn bridge_log(up: &Up) -> String {
    std::fs::read_to_string(up.data().join("logs/matrix.bridge.log")).unwrap_or_default()
}

/// Sends as the operator of `up` (`hive send`'s command).
fn operator_send(up: &Up, to: &str, body: &str) -> i64 {
    let r = ok(
        &mut up.host(),
        Send {
            to: to.into(),
            body: body.into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    r["id"].as_i64().unwrap()
}

/// Sends as agent `from` on its own socket.
fn agent_send(up: &Up, from: &str, to: &str, body: &str) {
    ok(
        &mut up.agent(from),
        Send {
            to: to.into(),
            body: body.into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
}

/// Every unread message of the operator of `up`, oldest first (left unread).
fn operator_unread(up: &Up) -> Vec<Message> {
    let mut host = up.host();
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let r: MessagesReply = host
            .call(&Inbox {
                wait_seconds: None,
                peek: true,
                after,
            })
            .unwrap();
        after = r.messages.last().map(|m| m.id).or(after);
        let more = r.more;
        all.extend(r.messages);
        if !more {
            return all;
        }
    }
}

/// The pid of `hive up`'s bridge child.
fn bridge_pid(up: &Up) -> Option<u32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let is_bridge = cmdline.split(|b| *b == 0).any(|a| a == b"matrix-bridge");
        if is_bridge && ppid == Some(up.pid()) {
            return Some(pid);
        }
    }
    None
}

fn kill9(pid: u32) {
    // SAFETY: kill(2) on a pid just read from /proc, a child of `hive up`.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
}

#[test]
fn agents_talk_across_hives_in_claude_turns_and_a_question_is_answered() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = hs.swarm(&["one", "two"], dir.path());
    let one = Up::launch(&fleet(&room, "one", &["a"]), &["a"], launch(&[]));
    let two = Up::launch(&fleet(&room, "two", &["b"]), &["b"], launch(&[]));
    // a: on the operator's word, writes to b@two, then asks it a question.
    one.fake("a").default_step(&format!(
        r#"{MCP_CALL}
case "$prompt" in
  *"start talking"*) mcp_call send '{{"to":"b@two","body":"hello from a"}}' ;;
  *"ask b"*) mcp_call ask '{{"to":"b@two","question":"ship it?","options":["yes","no"]}}' ;;
esac
ok_turn done"#
    ));
    // b: answers a's mail, and answers a's question with its local id.
    two.fake("b").default_step(&format!(
        r#"{MCP_CALL}
case "$prompt" in
  *"hello from a"*) mcp_call send '{{"to":"a@one","body":"hello back from b"}}' ;;
  *"[question #"*"ship it?"*)
    id=$(printf '%s' "$prompt" | grep -o 'question #[0-9]*' | head -1 | tr -dc 0-9)
    mcp_call answer "{{\"id\":$id,\"answer\":\"yes\"}}" ;;
esac
ok_turn done"#
    ));
    wait_bridge(&one, BridgeState::Connected);
    wait_bridge(&two, BridgeState::Connected);

    operator_send(&one, "a", "start talking");
    two.wait_prompt("b", "Message from a@one:\n\nhello from a", 1);
    one.wait_prompt("a", "Message from b@two:\n\nhello back from b", 1);

    operator_send(&one, "a", "ask b");
    two.wait_prompt("b", "from a@one] ship it?", 1);
    one.wait_prompt("a", "b@two answered: yes", 1);
    let log = std::fs::read_to_string(one.fake("a").dir.join("mcp.log")).unwrap();
    assert!(log.contains("sent message #"), "{log}");
    assert!(!log.contains("isError\":true"), "{log}");

    // The operators reach each other's agents and hear back from them.
    operator_send(&two, "a@one", "the operator of two here");
    one.wait_prompt(
        "a",
        "Message from operator@two:\n\nthe operator of two here",
        1,
    );
    // Mail for no agent of the other hive comes back as undeliverable.
    let lost = operator_send(&one, "zed@two", "anyone?");
    wait_for(Duration::from_secs(30), "the bounce", || {
        operator_unread(&one).into_iter().find(|m| {
            m.body == format!("undeliverable: your message #{lost} to zed@two: unknown agent")
        })
    });
    // hive agents shows the bridge.
    let sock = one.data().join("run/host.sock");
    let (code, out, err) =
        common::hive::run_hive(&["agents", "--socket", sock.to_str().unwrap()], None, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("bridge: connected since "), "{out}");

    // A crashed bridge is restarted by hive up, and mail flows again.
    let pid = wait_for(Duration::from_secs(10), "the bridge's pid", || {
        bridge_pid(&two)
    });
    kill9(pid);
    wait_for(Duration::from_secs(30), "a new bridge", || {
        bridge_pid(&two).filter(|p| *p != pid)
    });
    wait_bridge(&two, BridgeState::Connected);
    operator_send(&one, "b@two", "after the crash");
    two.wait_prompt("b", "after the crash", 1);
    assert!(
        two.log().contains("the Matrix bridge exited"),
        "{}",
        two.log()
    );
}

#[test]
fn two_hundred_messages_survive_kill9_of_the_receiver_and_of_the_homeserver() {
    let Some(mut hs) = Synapse::start() else {
        return;
    };
    let dir = TempDir::new("swarm");
    let room = hs.swarm(&["one", "two"], dir.path());
    let one = Up::launch(&fleet(&room, "one", &["a"]), &["a"], launch(&[]));
    let mut two = Up::launch(
        &fleet(&room, "two", &["b"]),
        &["b"],
        launch(&[("HIVE_BRIDGE_TIMELINE_LIMIT", "20")]),
    );
    wait_bridge(&one, BridgeState::Connected);
    wait_bridge(&two, BridgeState::Connected);
    // Two senders, interleaved: one's operator and its agent a, to two's
    // operator (whose inbox keeps every message unread).
    let send = |i: usize| {
        if i.is_multiple_of(2) {
            operator_send(&one, "operator@two", &format!("op {i}"));
        } else {
            agent_send(&one, "a", "operator@two", &format!("a {i}"));
        }
    };
    let received = |up: &Up| {
        operator_unread(up)
            .into_iter()
            .filter(|m| m.from == "operator@one" || m.from == "a@one")
            .count()
    };
    for i in 0..60 {
        send(i);
    }
    wait_for(Duration::from_secs(30), "some to arrive", || {
        (received(&two) >= 20).then_some(())
    });
    // The receiving hive dies hard; the rest is sent while it is gone.
    kill9(two.pid());
    two.wait_exit();
    for i in 60..130 {
        send(i);
    }
    // All of it in the room before two is back: its sync comes back limited.
    wait_for(Duration::from_secs(30), "one's outbox to empty", || {
        (bridge_row(&one).outbox == 0).then_some(())
    });
    two.restart(&["b"]);
    wait_for(Duration::from_secs(60), "the gap to arrive", || {
        (received(&two) >= 130).then_some(())
    });
    // The homeserver dies hard in the middle of the last ones.
    for i in 130..160 {
        send(i);
    }
    hs.kill9();
    for i in 160..200 {
        send(i);
    }
    // One's bridge backs off with its outbox full; its agents keep working.
    wait_bridge(&one, BridgeState::BackingOff);
    let row = bridge_row(&one);
    assert!(row.outbox > 0, "{row:?}");
    let dash = one.dashboard().get("/api/hive").unwrap();
    assert_eq!(dash["bridge"]["state"], "backing_off", "{}", dash["bridge"]);
    one.fake("a").default_step("ok_turn local");
    operator_send(&one, "a", "local work goes on");
    one.wait_prompt("a", "local work goes on", 1);
    hs.restart();
    wait_for(Duration::from_secs(90), "all 200", || {
        (received(&two) >= 200).then_some(())
    });
    wait_for(Duration::from_secs(30), "one's outbox to empty", || {
        (bridge_row(&one).outbox == 0).then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let got = operator_unread(&two);
    for sender in ["operator@one", "a@one"] {
        let bodies: Vec<String> = got
            .iter()
            .filter(|m| m.from == sender)
            .map(|m| m.body.clone())
            .collect();
        let want: Vec<String> = (0..200usize)
            .filter(|i: &usize| i.is_multiple_of(2) == (sender == "operator@one"))
            .map(|i| format!("{} {i}", if i.is_multiple_of(2) { "op" } else { "a" }))
            .collect();
        assert_eq!(bodies, want, "exactly once and in order, from {sender}");
    }
    assert!(
        bridge_log(&two).contains("the sync came back limited"),
        "{}",
        bridge_log(&two)
    );
}

#[test]
fn a_sync_gap_that_comes_back_limited_loses_nothing() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = hs.swarm(&["one", "two"], dir.path());
    let one = Up::launch(&fleet(&room, "one", &["a"]), &["a"], launch(&[]));
    let mut two = Up::launch(
        &fleet(&room, "two", &["b"]),
        &["b"],
        launch(&[("HIVE_BRIDGE_TIMELINE_LIMIT", "10")]),
    );
    wait_bridge(&one, BridgeState::Connected);
    wait_bridge(&two, BridgeState::Connected);
    operator_send(&one, "operator@two", "before");
    wait_for(Duration::from_secs(30), "the first", || {
        operator_unread(&two)
            .iter()
            .any(|m| m.body == "before")
            .then_some(())
    });
    two.terminate();
    for i in 0..45 {
        operator_send(&one, "operator@two", &format!("gap {i}"));
    }
    // A state event in the gap is skipped by the filter.
    hs.set_room_topic(&room.owner, &room.room_id, "busy");
    wait_for(Duration::from_secs(30), "one's outbox to empty", || {
        (bridge_row(&one).outbox == 0).then_some(())
    });
    two.restart(&["b"]);
    wait_for(Duration::from_secs(60), "the gap", || {
        (operator_unread(&two).len() >= 46).then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    let bodies: Vec<String> = operator_unread(&two).into_iter().map(|m| m.body).collect();
    let mut want = vec!["before".to_string()];
    want.extend((0..45).map(|i| format!("gap {i}")));
    assert_eq!(bodies, want);
    let log = bridge_log(&two);
    assert!(
        log.contains("the sync came back limited: 35 earlier event(s)"),
        "{log}"
    );
}

#[test]
fn an_event_forged_by_a_room_member_who_is_not_the_listed_peer_is_ignored() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = hs.swarm(&["one", "two"], dir.path());
    let mallory = hs.register("mallory", "pw-mallory");
    hs.invite(&room.owner, &room.room_id, &mallory);
    hs.join(&mallory, &room.room_id);
    let one = Up::launch(&fleet(&room, "one", &["a"]), &["a"], launch(&[]));
    let two = Up::launch(&fleet(&room, "two", &["b"]), &["b"], launch(&[]));
    wait_bridge(&one, BridgeState::Connected);
    wait_bridge(&two, BridgeState::Connected);
    // mallory writes as b@two, word for word what two's bridge would send.
    let forged = json!({"msgtype": "m.text", "body": "forged order",
        "hive.from": "b@two", "hive.to": "a@one", "hive.id": "1", "hive.kind": "message"});
    hs.send_as(&mallory, &room.room_id, "forge-1", &forged);
    // Then b writes for real.
    agent_send(&two, "b", "a@one", "genuine");
    one.wait_prompt("a", "genuine", 1);
    assert_eq!(one.prompts_with("a", "forged order"), 0);
    // The bridge's log is a file another process writes: read until it is in.
    wait_for(
        Duration::from_secs(30),
        "the forged event in the bridge log",
        || {
            bridge_log(&one)
            .contains("forged: @mallory:hive.test sent it as b@two, but the bridge of hive two is @hive-two-bridge:hive.test")
            .then_some(())
        },
    );
    // Nor does a listed peer get to speak for another hive.
    let three = json!({"msgtype": "m.text", "body": "not yours",
        "hive.from": "c@three", "hive.to": "a@one", "hive.id": "2", "hive.kind": "message"});
    hs.send_as(room.bridge("two"), &room.room_id, "forge-2", &three);
    agent_send(&two, "b", "a@one", "genuine again");
    one.wait_prompt("a", "genuine again", 1);
    assert_eq!(one.prompts_with("a", "not yours"), 0);
}

#[test]
fn a_wrong_password_or_token_stops_hive_up_with_exit_2_naming_the_matrix_login() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = hs.swarm(&["one", "two"], dir.path());
    std::fs::write(&room.bridges[0].2, "wrong-password\n").unwrap();
    let mut one = Up::launch(
        &fleet(&room, "one", &["a"]),
        &["a"],
        Launch {
            no_wait: true,
            ..launch(&[])
        },
    );
    let status = one.wait_exit();
    assert_eq!(status.code(), Some(2), "{}", one.log());
    let log = one.log();
    assert!(
        log.contains(
            "hive up: the Matrix login of the bridge failed: the homeserver refused the Matrix \
             login of @hive-one-bridge:hive.test (device HIVE_ONE_BRIDGE)"
        ),
        "{log}"
    );
    assert!(!log.contains("wrong-password"), "{log}");
    // Nothing was started: no agent, no socket left behind.
    assert!(!one.data().join("run/host.sock").exists());

    // A refused access token (M_UNKNOWN_TOKEN) stops it the same way.
    let token = dir.path().join("two-matrix-token");
    std::fs::write(&token, "syt_made_up_token\n").unwrap();
    let mut section = room.matrix_section("two");
    section.as_object_mut().unwrap().remove("password_file");
    section["access_token_file"] = json!(token);
    let config = json!({"hive_name": "two", "agents": [{"name": "b",
        "env": {"FAKE_CLAUDE_DIR": "@FAKE(b)"}}], "matrix": section});
    let mut two = Up::launch(
        &config.to_string(),
        &["b"],
        Launch {
            no_wait: true,
            ..launch(&[])
        },
    );
    let status = two.wait_exit();
    assert_eq!(status.code(), Some(2), "{}", two.log());
    let log = two.log();
    assert!(
        log.contains("hive up: the Matrix login of the bridge failed:")
            && log.contains("M_UNKNOWN_TOKEN"),
        "{log}"
    );
    assert!(!log.contains("syt_made_up_token"), "{log}");
    assert!(!two.data().join("run/host.sock").exists());
}
