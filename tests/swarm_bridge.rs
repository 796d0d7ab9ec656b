//! `hive matrix-bridge` as its own process next to a plain `hive broker`, the
//! way nix/systemd deploy it: two hives, each a broker and a bridge, and one
//! real Synapse. The test speaks as the agents on their broker sockets.
//! `tests/swarm.rs` runs whole hives (`hive up`) with fake claude turns.

mod common;

use common::hive::{hive_bin, ok, wait_for, Broker, TempDir};
use common::synapse::{SwarmRoom, Synapse};
use hyperhive::proto::cmd::{AckTurn, Agents, AgentsReply, RecvNext, RecvNextReply, Send};
use hyperhive::proto::swarm::BridgeState;
use hyperhive::proto::Message;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One hive: a broker with a `matrix` section, and its bridge process.
struct Hive {
    broker: Broker,
    bridge: Option<Child>,
    log: PathBuf,
}

impl Hive {
    fn start(room: &SwarmRoom, name: &str, agents: &[&str]) -> Hive {
        let agents: Vec<serde_json::Value> = agents
            .iter()
            .map(|a| serde_json::json!({ "name": a }))
            .collect();
        let config = serde_json::json!({
            "hive_name": name,
            "agents": agents,
            "matrix": room.matrix_section(name),
        });
        let broker = Broker::start_config(&config.to_string());
        let log = broker.dir.path().join("bridge.log");
        let mut hive = Hive {
            broker,
            bridge: None,
            log,
        };
        hive.start_bridge();
        hive
    }

    fn start_bridge(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(hive_bin())
            .arg("matrix-bridge")
            .arg("--socket")
            .arg(self.broker.run_dir().join("bridge.sock"))
            .arg("--state-dir")
            .arg(self.broker.dir.path().join("matrix"))
            .env("RUST_LOG", "debug")
            .env("HIVE_BRIDGE_BACKOFF_MAX_MS", "1000")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.bridge = Some(child);
    }

    fn kill9_bridge(&mut self) {
        if let Some(mut c) = self.bridge.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn bridge_row(&self) -> hyperhive::proto::swarm::BridgeRow {
        let r: AgentsReply = self.broker.host().call(&Agents {}).unwrap();
        r.bridge.expect("a bridge row")
    }

    /// Waits until the bridge reports itself connected.
    fn wait_connected(&self) {
        wait_for(Duration::from_secs(30), "the bridge to connect", || {
            (self.bridge_row().state == BridgeState::Connected).then_some(())
        });
    }

    fn send(&self, from: &str, to: &str, body: &str, in_reply_to: Option<i64>) -> i64 {
        let r = ok(
            &mut self.broker.agent(from),
            Send {
                to: to.into(),
                body: body.into(),
                in_reply_to,
                receipt: false,
                traceparent: None,
            },
        );
        r["id"].as_i64().unwrap()
    }

    /// Restarts the broker on its store (its bridge, when running, stays and
    /// connects again).
    fn restart_broker(&mut self) {
        self.broker.terminate();
        self.broker.restart();
    }

    /// The files of the broker's store.
    fn store_files(&self) -> Vec<PathBuf> {
        ["broker.db", "broker.db-wal", "broker.db-shm"]
            .iter()
            .map(|f| self.broker.state_dir().join(f))
            .collect()
    }

    /// A copy of the stopped broker's store in `to`.
    fn back_up(&self, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for f in self.store_files().iter().filter(|f| f.exists()) {
            std::fs::copy(f, to.join(f.file_name().unwrap())).unwrap();
        }
    }

    /// Puts the copy in `from` back in place of the stopped broker's store.
    fn restore(&self, from: &Path) {
        for f in self.store_files() {
            let _ = std::fs::remove_file(&f);
            let saved = from.join(f.file_name().unwrap());
            if saved.exists() {
                std::fs::copy(saved, f).unwrap();
            }
        }
    }

    /// The next message of `agent` (its start kick skipped), acked.
    fn next(&self, agent: &str) -> Message {
        let mut c = self.broker.agent(agent);
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        loop {
            let r: RecvNextReply = c
                .call(&RecvNext {
                    wait_seconds: Some(45),
                    seen: None,
                })
                .unwrap();
            let m = r.message.unwrap_or_else(|| {
                panic!(
                    "no message for {agent} within 45 s; bridge log:\n{}",
                    self.log()
                )
            });
            ok(
                &mut c,
                AckTurn {
                    id: m.id,
                    turn: None,
                },
            );
            if m.kind.as_str() != "kick" {
                return m;
            }
        }
    }
}

impl Drop for Hive {
    fn drop(&mut self) {
        self.kill9_bridge();
    }
}

fn swarm(hs: &Synapse, dir: &Path) -> SwarmRoom {
    hs.swarm(&["one", "two"], dir)
}

#[test]
fn two_brokers_and_their_bridges_carry_mail_both_ways_and_across_a_bridge_crash() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = swarm(&hs, dir.path());
    let one = Hive::start(&room, "one", &["a"]);
    let mut two = Hive::start(&room, "two", &["b"]);
    one.wait_connected();
    two.wait_connected();

    let sent = one.send("a", "b@two", "hello b", None);
    let got = two.next("b");
    assert_eq!((got.from.as_str(), got.body.as_str()), ("a@one", "hello b"));
    two.send("b", "a@one", "hello a", Some(got.id));
    let back = one.next("a");
    assert_eq!(
        (back.from.as_str(), back.body.as_str(), back.in_reply_to),
        ("b@two", "hello a", Some(sent))
    );
    wait_for(Duration::from_secs(10), "the outboxes to empty", || {
        (one.bridge_row().outbox == 0 && two.bridge_row().outbox == 0).then_some(())
    });

    // The receiving bridge dies; what is sent meanwhile arrives once, in
    // order, when it is back.
    two.kill9_bridge();
    wait_for(Duration::from_secs(10), "the broker to see it gone", || {
        (two.bridge_row().state == BridgeState::NotRunning).then_some(())
    });
    for i in 0..3 {
        one.send("a", "b@two", &format!("while away {i}"), None);
    }
    wait_for(Duration::from_secs(20), "one's outbox to empty", || {
        (one.bridge_row().outbox == 0).then_some(())
    });
    two.start_bridge();
    for i in 0..3 {
        assert_eq!(two.next("b").body, format!("while away {i}"));
    }
    let mut c = two.broker.agent("b");
    let r: RecvNextReply = c
        .call(&RecvNext {
            wait_seconds: Some(3),
            seen: None,
        })
        .unwrap();
    assert!(r.message.is_none(), "delivered twice: {:?}", r.message);
    // The bridge logged in once and reused its token after the crash.
    let log = two.log();
    assert_eq!(
        log.matches("logged in as @hive-two-bridge:hive.test")
            .count(),
        1,
        "{log}"
    );
    assert!(log.contains("reusing the access token"), "{log}");
}

#[test]
fn the_deploy_steps_of_docs_swarm_md_join_two_hives() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = hs.swarm_as_documented(&["one", "two"], dir.path());
    let one = Hive::start(&room, "one", &["a"]);
    let two = Hive::start(&room, "two", &["b"]);
    one.wait_connected();
    two.wait_connected();
    let id = one.send("a", "b@two", "deployed as documented", None);
    let m = two.next("b");
    assert_eq!(
        (m.from.as_str(), m.body.as_str()),
        ("a@one", "deployed as documented")
    );
    two.send("b", "a@one", "and heard", Some(m.id));
    let m = one.next("a");
    assert_eq!(
        (m.from.as_str(), m.body.as_str(), m.in_reply_to),
        ("b@two", "and heard", Some(id))
    );
}

#[test]
fn a_rate_limited_bridge_waits_as_told_and_loses_nothing() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = swarm(&hs, dir.path());
    let one = Hive::start(&room, "one", &["a"]);
    let two = Hive::start(&room, "two", &["b"]);
    one.wait_connected();
    two.wait_connected();
    hs.set_message_rate_limit(&room.bridge("one").user_id, 1, 1);
    for i in 0..5 {
        one.send("a", "b@two", &format!("slow {i}"), None);
    }
    for i in 0..5 {
        assert_eq!(two.next("b").body, format!("slow {i}"));
    }
    let log = one.log();
    assert!(log.contains("M_LIMIT_EXCEEDED"), "{log}");
    assert!(log.contains("trying again in"), "{log}");
}

#[test]
fn operators_on_matrix_read_the_operators_mail_and_write_to_agents() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = swarm(&hs, dir.path());
    let alice = hs.register("alice", "pw-alice");
    let bob = hs.register("bob", "pw-bob");
    let ops = hs.create_room(&alice, Some("one-ops"), &[room.bridge("one"), &bob]);
    hs.join(&bob, &ops);
    let mut section = room.matrix_section("one");
    section["operators"] = serde_json::json!([alice.user_id]);
    section["operator_room"] = serde_json::json!("#one-ops:hive.test");
    let config = serde_json::json!({
        "hive_name": "one",
        "agents": [{"name": "a"}],
        "matrix": section,
    });
    let broker = Broker::start_config(&config.to_string());
    let log = broker.dir.path().join("bridge.log");
    let mut one = Hive {
        broker,
        bridge: None,
        log,
    };
    one.start_bridge();
    one.wait_connected();
    // The operator's mail is posted in the operator room.
    one.send("a", "operator", "the build is green", None);
    let post = wait_for(Duration::from_secs(30), "the post", || {
        hs.room_messages(&alice, &ops, 20)
            .into_iter()
            .find(|e| e["content"]["body"] == "[a@one] the build is green")
    });
    // A listed operator names the agent, or replies to its post.
    hs.send_as(
        &alice,
        &ops,
        "op-1",
        &serde_json::json!({"msgtype": "m.text", "body": "@a: thanks, ship it"}),
    );
    let m = one.next("a");
    assert_eq!(
        (m.from.as_str(), m.body.as_str()),
        ("operator", "thanks, ship it")
    );
    let reply = serde_json::json!({"msgtype": "m.text",
        "body": "> <@hive-one-bridge:hive.test> [a@one] the build is green\n\nnice",
        "m.relates_to": {"m.in_reply_to": {"event_id": post["event_id"]}}});
    hs.send_as(&alice, &ops, "op-2", &reply);
    // An edit is no new message, with or without the `* ` clients put
    // before its body (robustness review N9).
    for (txn, body) in [
        ("op-edit-1", "@a: T42 edit without star"),
        ("op-edit-2", "* @a: T42 edit"),
    ] {
        hs.send_as(
            &alice,
            &ops,
            txn,
            &serde_json::json!({"msgtype": "m.text", "body": body,
                "m.new_content": {"msgtype": "m.text", "body": "@a: T42"},
                "m.relates_to": {"rel_type": "m.replace", "event_id": post["event_id"]}}),
        );
    }
    // Anyone else in the room is ignored.
    hs.send_as(
        &bob,
        &ops,
        "op-3",
        &serde_json::json!({"msgtype": "m.text", "body": "@a: delete everything"}),
    );
    let m = one.next("a");
    assert_eq!((m.from.as_str(), m.body.as_str()), ("operator", "nice"));
    let mut c = one.broker.agent("a");
    let r: RecvNextReply = c
        .call(&RecvNext {
            wait_seconds: Some(3),
            seen: None,
        })
        .unwrap();
    assert!(r.message.is_none(), "{:?}", r.message);
    assert!(one
        .log()
        .contains("@bob:hive.test is not a listed operator"));
}

#[test]
fn a_wrong_password_makes_the_bridge_exit_2_naming_the_matrix_login() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = swarm(&hs, dir.path());
    std::fs::write(&room.bridges[0].2, "not-the-password\n").unwrap();
    let mut one = Hive::start(&room, "one", &["a"]);
    let status = wait_for(Duration::from_secs(30), "the bridge to exit", || {
        one.bridge.as_mut().unwrap().try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(2), "{}", one.log());
    let log = one.log();
    assert!(
        log.contains(
            "hive matrix-bridge: the homeserver refused the Matrix login of \
             @hive-one-bridge:hive.test (device HIVE_ONE_BRIDGE)"
        ),
        "{log}"
    );
    assert!(!log.contains("not-the-password"), "{log}");
    // A wrong access token (M_UNKNOWN_TOKEN) too.
    let token = dir.path().join("token");
    std::fs::write(&token, "syt_not_a_token\n").unwrap();
    let mut section = room.matrix_section("two");
    section.as_object_mut().unwrap().remove("password_file");
    section["access_token_file"] = serde_json::json!(token);
    let config =
        serde_json::json!({"hive_name": "two", "agents": [{"name": "b"}], "matrix": section});
    let broker = Broker::start_config(&config.to_string());
    let log = broker.dir.path().join("bridge.log");
    let mut two = Hive {
        broker,
        bridge: None,
        log,
    };
    two.start_bridge();
    let status = wait_for(Duration::from_secs(30), "the bridge to exit", || {
        two.bridge.as_mut().unwrap().try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(2), "{}", two.log());
    let log = two.log();
    assert!(
        log.contains("hive matrix-bridge: the Matrix access token of @hive-two-bridge:hive.test:"),
        "{log}"
    );
    assert!(log.contains("M_UNKNOWN_TOKEN"), "{log}");
    assert!(!log.contains("syt_not_a_token"), "{log}");
}

/// A `broker.db` restored from a backup starts its message ids again where
/// the backup left them, and sends the backup's pending event again: hive
/// one is backed up with an event still in its outbox, sends more, and is
/// restored. The backup's event goes out under the (instance, id) it was
/// first committed under, which hive two has seen, and is not delivered
/// again; the restored hive's new mail reuses the ids sent after the backup,
/// under its new start's instance, and is all delivered (robustness review
/// N9: it was dropped as replays for 30 days). A last message behind
/// everything shows nothing came twice. Mail that reached the restored hive
/// after the backup, which its store no longer holds, comes again.
#[test]
fn a_restored_broker_db_loses_and_duplicates_nothing() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = swarm(&hs, dir.path());
    let mut one = Hive::start(&room, "one", &["a"]);
    let two = Hive::start(&room, "two", &["b"]);
    one.wait_connected();
    two.wait_connected();
    one.send("a", "b@two", "before the backup", None);
    assert_eq!(two.next("b").body, "before the backup");

    // The backup holds an event the homeserver has not seen yet.
    one.kill9_bridge();
    one.send("a", "b@two", "pending in the backup", None);
    one.broker.terminate();
    let backup = dir.path().join("backup");
    one.back_up(&backup);
    one.broker.restart();
    one.start_bridge();
    assert_eq!(two.next("b").body, "pending in the backup");
    two.send("b", "a@one", "to a after the backup", None);
    assert_eq!(one.next("a").body, "to a after the backup");
    let after: Vec<i64> = (1..=2)
        .map(|i| one.send("a", "b@two", &format!("after the backup {i}"), None))
        .collect();
    for i in 1..=2 {
        assert_eq!(two.next("b").body, format!("after the backup {i}"));
    }
    wait_for(Duration::from_secs(20), "one's outbox to empty", || {
        (one.bridge_row().outbox == 0).then_some(())
    });

    // Restored: the backup's pending event goes out again, and the ids
    // sent after the backup are handed out again.
    one.kill9_bridge();
    one.broker.terminate();
    one.restore(&backup);
    one.broker.restart();
    one.start_bridge();
    one.wait_connected();
    // The restored store does not hold what came in after the backup: its
    // sync token is the backup's, and that mail comes again.
    assert_eq!(one.next("a").body, "to a after the backup");
    wait_for(
        Duration::from_secs(20),
        "the backup's event to go out",
        || (one.bridge_row().outbox == 0).then_some(()),
    );
    let again: Vec<i64> = (1..=2)
        .map(|i| one.send("a", "b@two", &format!("after the restore {i}"), None))
        .collect();
    assert_eq!(again, after, "the restored store hands out the same ids");
    for i in 1..=2 {
        assert_eq!(two.next("b").body, format!("after the restore {i}"));
    }
    one.send("a", "b@two", "last", None);
    assert_eq!(two.next("b").body, "last", "nothing came twice");
}

/// Hive two's broker restarts twice, once with an event in its outbox, and
/// its bridge outlives the restarts: each start sends under a new instance,
/// the pending event under the one it was committed under, and hive one
/// delivers each message once. Then two's bridge user sends the first
/// events again as new room events (a replay under an old instance, which a
/// flip made this hive take for new: robustness review N9), and nothing is
/// delivered twice.
#[test]
fn a_peers_instance_flips_and_replays_lose_and_duplicate_nothing() {
    let Some(hs) = Synapse::start() else { return };
    let dir = TempDir::new("swarm");
    let room = swarm(&hs, dir.path());
    let one = Hive::start(&room, "one", &["a"]);
    let mut two = Hive::start(&room, "two", &["b"]);
    one.wait_connected();
    two.wait_connected();
    two.send("b", "a@one", "first start", None);
    assert_eq!(one.next("a").body, "first start");
    two.restart_broker();
    two.send("b", "a@one", "second start", None);
    assert_eq!(one.next("a").body, "second start");
    two.kill9_bridge();
    two.send("b", "a@one", "pending across a restart", None);
    two.restart_broker();
    two.start_bridge();
    two.send("b", "a@one", "third start", None);
    assert_eq!(one.next("a").body, "pending across a restart");
    assert_eq!(one.next("a").body, "third start");

    let events = hs.room_messages(room.bridge("two"), &room.room_id, 50);
    let content = |body: &str| {
        events
            .iter()
            .find(|e| e["content"]["body"] == body)
            .unwrap_or_else(|| panic!("no event {body:?} in {events:?}"))["content"]
            .clone()
    };
    let instances: std::collections::BTreeSet<String> =
        ["first start", "second start", "third start"]
            .iter()
            .map(|b| content(b)["hive.instance"].as_str().unwrap().to_string())
            .collect();
    assert_eq!(instances.len(), 3, "one instance per start: {instances:?}");
    for (i, body) in ["first start", "second start", "pending across a restart"]
        .iter()
        .enumerate()
    {
        hs.send_as(
            room.bridge("two"),
            &room.room_id,
            &format!("replay-{i}"),
            &content(body),
        );
    }
    two.send("b", "a@one", "last", None);
    assert_eq!(one.next("a").body, "last", "no replay was delivered");
}
