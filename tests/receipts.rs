//! Receipts (issue 43, item 0) against a real `hive broker` and its sockets:
//! `message_state` follows a message through every state its rows hold —
//! queued with its position, handed out to a turn and to `recv`, acked with
//! the turn the harness reported, dead-lettered with its reason, handed to
//! the bridge, posted to the swarm room and bounced for `NAME@HIVE`, and
//! pruned once retention deleted its row — and refuses every id the caller
//! did not send with the same words, whether the id exists or not. A real
//! `hive serve` killed with SIGKILL mid-turn leaves its message handed out,
//! and the restarted harness hands it out again and acks it; a broker killed
//! with SIGKILL mid-turn puts it back in the queue, and says so. The
//! operator's `hive message ID` prints the same line (and `--json` the
//! answer).
//!
//! Receipts: a request for one is stored with its message (it survives a
//! broker killed right after the send); a receipt wakes nothing, is never
//! waiting work (not unread, not ahead of anything in a queue) and rides
//! with the sender's next turn — again, when that turn is handed out again
//! after a failed run or a killed harness — or goes out through `recv`; the
//! operator's `hive inbox` sends the receipts of mail to the operator.

mod common;

use common::hive::*;
use hyperhive::proto::cmd::{
    self, AckTurn, BridgeFailed, BridgeHello, BridgeNext, BridgeNextReply, BridgeSent, DeadLetter,
    MessageState, MessageStateReply, Recv, RecvAck, RecvNext, RecvNextReply, Where,
};
use hyperhive::proto::{Client, Message, MessagesReply, MsgKind};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

fn state(c: &mut Client, id: i64) -> MessageStateReply {
    c.call(&MessageState { id }).unwrap()
}

/// The harness's pop on `agent`'s socket: the next message made inflight.
fn take(b: &Broker, agent: &str) -> i64 {
    take_message(b, agent).id
}

/// [`take`], the whole message handed out (receipts ride on its body).
fn take_message(b: &Broker, agent: &str) -> Message {
    let r: RecvNextReply = b
        .agent(agent)
        .call(&RecvNext {
            wait_seconds: None,
            seen: None,
        })
        .unwrap();
    r.message.expect("a message to hand out")
}

/// The one `[receipts]` line of `text`.
fn receipts_line(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("[receipts]")).collect();
    assert_eq!(lines.len(), 1, "one [receipts] line: {text}");
    lines[0].to_string()
}

/// `sender` sends `to` one message with a receipt per body, each handed to a
/// turn of `to` (played on its socket) and acked: a receipt for each waits
/// for `sender`. Their ids.
fn acked_with_receipts(b: &Broker, sender: &str, to: &str, bodies: &[&str]) -> Vec<i64> {
    bodies
        .iter()
        .map(|body| {
            let id = send_on(&mut b.agent(sender), to, body, true);
            assert_eq!(take(b, to), id);
            ok(&mut b.agent(to), AckTurn { id, turn: None });
            id
        })
        .collect()
}

/// The invocations of `h`'s claude whose prompt contains `needle`.
fn runs_with(h: &Harness, needle: &str) -> Vec<usize> {
    (1..=h.fake.count())
        .filter(|&n| h.fake.stdin(n).contains(needle))
        .collect()
}

/// `hive message ARGS` on the broker's host socket: (exit code, stdout, stderr).
fn hive_message(b: &Broker, args: &[&str]) -> (i32, String, String) {
    let sock = b.host_socket();
    let mut argv = vec!["message", "--socket", sock.to_str().unwrap()];
    argv.extend_from_slice(args);
    run_hive(&argv, None, &[])
}

#[test]
fn a_message_reads_every_state_of_its_life_and_only_to_its_sender() {
    let b = Broker::start(&["ana", "bob", "carl"]);
    let mut ana = b.agent("ana");
    let first = agent_send(&b, "ana", "bob", "first");
    let second = agent_send(&b, "ana", "bob", "second");

    // Queued, with the place in bob's queue.
    let s = state(&mut ana, second);
    assert_eq!((s.state, s.position), (Where::Queued, Some(2)), "{s:?}");
    assert_eq!(s.to.as_deref(), Some("bob"));
    assert_eq!(
        s.text,
        format!("message #{second} to bob: queued, position 2 in bob's queue")
    );

    // Not a message you sent: the recipient, another agent, and ids that
    // never were get the same words.
    let never = second + 1000;
    for (who, id) in [
        ("bob", first),
        ("carl", first),
        ("carl", never),
        ("ana", never),
    ] {
        let e = refused(&mut b.agent(who), MessageState { id });
        assert_eq!(e, format!("message #{id}: not a message you sent"), "{who}");
    }
    // The operator's own send is the operator's to read, and the operator
    // reads any message; an id that never was is said so to the operator.
    let from_operator = operator_send(&b, "carl", "hello carl");
    assert_eq!(state(&mut b.host(), from_operator).state, Where::Queued);
    assert_eq!(state(&mut b.host(), second).position, Some(2));
    let e = refused(&mut b.host(), MessageState { id: never });
    assert_eq!(e, format!("there is no message #{never}"));
    let e = refused(&mut ana, MessageState { id: 0 });
    assert!(e.contains("not a message id"), "{e}");

    // Handed out to a turn (the harness's recv_next); the next moves up.
    assert_eq!(take(&b, "bob"), first);
    let s = state(&mut ana, first);
    assert_eq!(
        (s.state, s.via.as_deref(), s.attempts),
        (Where::HandedOut, Some("turn"), Some(1)),
        "{s:?}"
    );
    assert!(s.at.is_some());
    assert!(
        s.text
            .starts_with(&format!("message #{first} to bob: handed out at "))
            && s.text.ends_with(" to a turn, attempt 1, not acked yet"),
        "{}",
        s.text
    );
    assert_eq!(state(&mut ana, second).position, Some(1));

    // Acked, with the turn the harness reported.
    ok(
        &mut b.agent("bob"),
        AckTurn {
            id: first,
            turn: Some(12),
        },
    );
    let s = state(&mut ana, first);
    assert_eq!(
        (s.state, s.via.as_deref(), s.turn),
        (Where::Acked, Some("turn"), Some(12)),
        "{s:?}"
    );
    assert!(s.text.ends_with(" by bob's turn 12"), "{}", s.text);

    // Handed out to recv (the MCP tool), then acked through it.
    let mut bob = b.agent("bob");
    let r: MessagesReply = bob
        .call(&Recv {
            wait_seconds: None,
            max: Some(5),
        })
        .unwrap();
    assert_eq!(r.messages.len(), 1);
    assert_eq!(r.messages[0].id, second);
    let s = state(&mut ana, second);
    assert_eq!(
        (s.state, s.via.as_deref()),
        (Where::HandedOut, Some("recv"))
    );
    assert!(s.text.contains(" to recv, not acked yet"), "{}", s.text);
    bob.call(&RecvAck { ids: vec![second] }).unwrap();
    let s = state(&mut ana, second);
    assert_eq!(
        (s.state, s.via.as_deref(), s.turn),
        (Where::Acked, Some("recv"), None)
    );
    assert!(s.text.ends_with(" by bob through recv"), "{}", s.text);

    // An older harness's ack carries no turn: acked by a turn, none named.
    let third = agent_send(&b, "ana", "bob", "third");
    assert_eq!(take(&b, "bob"), third);
    let raw = call_raw(
        &mut b.agent("bob"),
        &format!(r#"{{"cmd":"ack_turn","id":{third}}}"#),
    );
    assert!(raw.is_ok(), "{raw:?}");
    let s = state(&mut ana, third);
    assert_eq!((s.state, s.turn), (Where::Acked, None));
    assert!(s.text.ends_with(" by a turn of bob"), "{}", s.text);

    // Dead-lettered, with the reason.
    let poison = agent_send(&b, "ana", "bob", "poison");
    assert_eq!(take(&b, "bob"), poison);
    ok(
        &mut b.agent("bob"),
        DeadLetter {
            id: poison,
            error: "claude crashed on it 5 times".into(),
            ran: true,
        },
    );
    let s = state(&mut ana, poison);
    assert_eq!(s.state, Where::DeadLettered);
    assert_eq!(s.error.as_deref(), Some("claude crashed on it 5 times"));
    assert!(
        s.text.contains("dead-lettered at ")
            && s.text
                .ends_with("after 1 attempts: claude crashed on it 5 times"),
        "{}",
        s.text
    );

    // The operator's `hive message ID`: the same line; --json the answer;
    // an id that never was is a refusal.
    let (code, out, err) = hive_message(&b, &[&poison.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim_end(), s.text);
    let (code, out, err) = hive_message(&b, &["--json", &format!("#{first}")]);
    assert_eq!(code, 0, "{err}");
    let json: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(json["state"], "acked", "{json}");
    assert_eq!(json["turn"], 12, "{json}");
    assert_eq!(json["via"], "turn", "{json}");
    let (code, _, err) = hive_message(&b, &[&never.to_string()]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("there is no message #{never}")),
        "{err}"
    );
}

/// The swarm test hive of `tests/swarm_broker.rs`: the test plays the bridge.
const SWARM: &str = r##"{
  "hive_name": "one",
  "agents": [{"name": "a"}, {"name": "c"}],
  "matrix": {
    "homeserver": "http://127.0.0.1:9",
    "user_id": "@hive-one-bridge:hive.test",
    "password_file": "/nonexistent/pw",
    "room": "#swarm:hive.test",
    "peers": {"two": "@hive-two-bridge:hive.test"}
  }
}"##;

#[test]
fn mail_to_another_hive_reads_only_its_local_states() {
    let b = Broker::start_config(SWARM);
    let mut br = Client::connect(&b.run_dir().join("bridge.sock")).expect("the bridge socket");
    br.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _: cmd::BridgeHelloReply = br.call(&BridgeHello {}).unwrap();
    let mut a = b.agent("a");
    let posted = agent_send(&b, "a", "x@two", "to x");
    let bounced = agent_send(&b, "a", "y@two", "to y");
    for id in [posted, bounced] {
        let s = state(&mut a, id);
        assert_eq!(s.state, Where::HandedToBridge, "{s:?}");
        assert_eq!(
            s.text,
            format!(
                "message #{id} to {}@two: handed to the bridge, not posted yet",
                if id == posted { "x" } else { "y" }
            )
        );
    }
    assert_eq!(
        refused(&mut b.agent("c"), MessageState { id: posted }),
        format!("message #{posted}: not a message you sent")
    );
    let events: BridgeNextReply = br.call(&BridgeNext { wait_seconds: None }).unwrap();
    assert_eq!(events.events.len(), 2);
    ok(
        &mut br,
        BridgeSent {
            id: posted,
            event_id: "$posted".into(),
        },
    );
    ok(
        &mut br,
        BridgeFailed {
            id: bounced,
            error: "M_FORBIDDEN: not in the room".into(),
        },
    );
    let s = state(&mut a, posted);
    assert_eq!(
        (s.state, s.event_id.as_deref()),
        (Where::Posted, Some("$posted"))
    );
    assert!(
        s.text.starts_with(&format!(
            "message #{posted} to x@two: posted to the swarm room at "
        )) && s.text.ends_with(" (event $posted)"),
        "{}",
        s.text
    );
    let s = state(&mut a, bounced);
    assert_eq!(s.state, Where::Bounced);
    assert!(
        s.text.ends_with(": M_FORBIDDEN: not in the room"),
        "{}",
        s.text
    );
}

#[test]
fn a_pruned_message_reads_pruned_to_its_sender_only() {
    let config = r#"{"agents":[{"name":"ana"},{"name":"bob"},{"name":"carl"}],
        "retention":{"messages_days":0}}"#;
    let process = Process {
        env: vec![("HIVE_PRUNE_SECS".into(), "1".into())],
        ..Process::default()
    };
    let b = Broker::start_process(&[], Some(config), process);
    let id = agent_send(&b, "ana", "bob", "soon gone");
    assert_eq!(take(&b, "bob"), id);
    ok(&mut b.agent("bob"), AckTurn { id, turn: Some(3) });
    let mut ana = b.agent("ana");
    let s = wait_for(T, "the acked row to be pruned", || {
        let s = state(&mut ana, id);
        (s.state == Where::Pruned).then_some(s)
    });
    assert_eq!(
        s.text,
        format!(
            "message #{id}: pruned (it was handled, and retention.messages_days deleted its row)"
        )
    );
    assert_eq!(s.to, None);
    assert_eq!(
        refused(&mut b.agent("carl"), MessageState { id }),
        format!("message #{id}: not a message you sent")
    );
    assert_eq!(state(&mut b.host(), id).state, Where::Pruned);
    let (code, out, err) = hive_message(&b, &[&id.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(": pruned ("), "{out}");
}

/// bob sends kid a message whose run hangs; kid's harness is killed with
/// SIGKILL mid-turn (claude with it).
#[test]
fn a_harness_killed_mid_turn_leaves_its_message_handed_out_until_it_runs_again() {
    let b = Broker::start(&["kid", "bob"]);
    let mut h = Harness::start(&b, "kid", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "kid");
    // The first run's marker is written before the pid the test kills by;
    // the second waits for the test's `go`.
    h.fake.default_step(
        r#"if grep -q slowpoke "$dir/inv-$FAKE_N.stdin" && [ ! -e "$dir/pid-done" ]; then echo x > "$dir/pid-done"; echo $$ > "$dir/pid-$FAKE_N"; init; sleep 60; fi
if grep -q slowpoke "$dir/inv-$FAKE_N.stdin"; then i=0; while [ ! -e "$dir/go" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; fi
ok_turn done"#,
    );
    let id = agent_send(&b, "bob", "kid", "slowpoke");
    let n = wait_for(T, "the slow run", || {
        (1..=h.fake.count()).find(|&n| h.fake.stdin(n).contains("slowpoke"))
    });
    let pid = wait_for(T, "the fake claude's pid", || {
        std::fs::read_to_string(h.fake.dir.join(format!("pid-{n}")))
            .ok()?
            .trim()
            .parse::<i32>()
            .ok()
    });
    let mut bob = b.agent("bob");
    let s = state(&mut bob, id);
    assert_eq!(
        (s.state, s.via.as_deref(), s.attempts),
        (Where::HandedOut, Some("turn"), Some(1)),
        "{s:?}"
    );
    let handed = s.at;
    h.kill9();
    // SAFETY: kill(2) on the fake claude's process group.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    // The broker keeps the row inflight: still handed out to that turn.
    let s = state(&mut bob, id);
    assert_eq!(
        (s.state, s.attempts, s.at),
        (Where::HandedOut, Some(1), handed),
        "{s:?}"
    );
    // The harness comes back and is handed the message again: attempt 2,
    // at a later hand-out, which `hive message` says too.
    h.spawn();
    let s = wait_for(T, "the second hand-out", || {
        let s = state(&mut bob, id);
        (s.attempts == Some(2)).then_some(s)
    });
    assert_eq!(
        (s.state, s.via.as_deref()),
        (Where::HandedOut, Some("turn")),
        "{s:?}"
    );
    assert!(s.at >= handed, "{s:?}");
    assert!(
        s.text.ends_with(" to a turn, attempt 2, not acked yet"),
        "{}",
        s.text
    );
    let (code, out, err) = hive_message(&b, &[&id.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim_end(), s.text);
    // Its run ends: acked.
    std::fs::write(h.fake.dir.join("go"), "").unwrap();
    let s = wait_for(T, "the message to be acked", || {
        let s = state(&mut bob, id);
        (s.state == Where::Acked).then_some(s)
    });
    assert_eq!(
        (s.via.as_deref(), s.attempts),
        (Some("turn"), Some(2)),
        "{s:?}"
    );
    assert!(s.text.contains(" by "), "{}", s.text);
}

/// A real harness acks its message with the turn it ran in: the id of the
/// turn in its turn log (`history.db`), which `message_state` and `hive
/// message ID` then show.
#[test]
fn the_harness_acks_with_the_turn_of_its_turn_log() {
    let b = Broker::start(&["kid", "bob"]);
    let h = Harness::start(&b, "kid", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "kid");
    // The run of the message waits until the test has seen its turn in the
    // turn log, so the log has it when the run ends.
    h.fake.default_step(
        r#"if grep -q turn-id-please "$dir/inv-$FAKE_N.stdin"; then init; while [ ! -e "$dir/go-$FAKE_N" ]; do sleep 0.05; done; fi
ok_turn done"#,
    );
    let id = agent_send(&b, "bob", "kid", "turn-id-please");
    let n = wait_for(T, "the run of the message", || {
        (1..=h.fake.count()).find(|&n| h.fake.stdin(n).contains("turn-id-please"))
    });
    let log = h.state_dir().join("history.db");
    let turn: i64 = wait_for(T, "the turn in the turn log", || {
        let db =
            rusqlite::Connection::open_with_flags(&log, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .ok()?;
        db.query_row("SELECT id FROM turns WHERE message_id = ?1", [id], |r| {
            r.get(0)
        })
        .ok()
    });
    std::fs::write(h.fake.dir.join(format!("go-{n}")), "").unwrap();
    let mut bob = b.agent("bob");
    let s = wait_for(T, "the message to be acked", || {
        let s = state(&mut bob, id);
        (s.state == Where::Acked).then_some(s)
    });
    assert_eq!(
        (s.via.as_deref(), s.turn),
        (Some("turn"), Some(turn)),
        "{s:?}"
    );
    assert!(
        s.text.ends_with(&format!(" by kid's turn {turn}")),
        "{}",
        s.text
    );
    let (code, out, err) = hive_message(&b, &[&id.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains(&format!("by kid's turn {turn}")), "{out}");
}

/// ana (a real `hive serve` with the fake claude) sends bob 20 messages with
/// `receipt: true`; bob's side is played on his socket (10 acked by turns,
/// 10 through `recv`). The 20 receipts wake nothing: ana's harness runs no
/// turn for them, and her next turn — for the operator's message — carries
/// all of them on one `[receipts]` line.
#[test]
fn twenty_sends_with_receipts_cost_no_turn_of_the_sender() {
    let b = Broker::start(&["ana", "bob"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let mut ana = b.agent("ana");
    let ids: Vec<i64> = (0..20)
        .map(|i| send_on(&mut ana, "bob", &format!("job {i}"), true))
        .collect();
    for (turn, want) in ids[..10].iter().enumerate() {
        assert_eq!(take(&b, "bob"), *want);
        ok(
            &mut b.agent("bob"),
            AckTurn {
                id: *want,
                turn: Some(turn as i64 + 1),
            },
        );
    }
    let mut bob = b.agent("bob");
    let r: MessagesReply = bob
        .call(&Recv {
            wait_seconds: None,
            max: Some(10),
        })
        .unwrap();
    assert_eq!(
        r.messages.iter().map(|m| m.id).collect::<Vec<_>>(),
        ids[10..]
    );
    bob.call(&RecvAck {
        ids: ids[10..].to_vec(),
    })
    .unwrap();
    for id in &ids {
        assert_eq!(state(&mut ana, *id).state, Where::Acked);
    }
    // Stored, and not unread: nothing woke ana.
    assert_eq!(agent_row(&b, "ana").unread, 0);
    assert_eq!(h.fake.count(), 1, "no turn of ana's for a receipt");

    operator_send(&b, "ana", "what is new?");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    assert_eq!(h.fake.count(), 2, "one turn: the operator's message");
    let prompt = h.fake.stdin(2);
    assert!(prompt.contains("what is new?"), "{prompt}");
    let lines: Vec<&str> = prompt
        .lines()
        .filter(|l| l.contains("[receipts]"))
        .collect();
    assert_eq!(lines.len(), 1, "{prompt}");
    for (i, id) in ids.iter().enumerate() {
        let by = if i < 10 {
            format!(" by bob's turn {}", i + 1)
        } else {
            " by bob through recv".to_string()
        };
        let head = format!("message #{id} to bob: acked at ");
        let at = lines[0]
            .find(&head)
            .unwrap_or_else(|| panic!("#{id}: {}", lines[0]));
        assert!(lines[0][at..].contains(&by), "#{id}: {}", lines[0]);
    }
    // Given with that turn: no receipt is left for recv.
    let r: MessagesReply = ana
        .call(&Recv {
            wait_seconds: None,
            max: Some(32),
        })
        .unwrap();
    assert!(r.messages.is_empty(), "{:?}", r.messages);
    // A receipt is for mail on this hive.
    let e = refused(
        &mut ana,
        cmd::Send {
            to: "x@two".into(),
            body: "hi".into(),
            in_reply_to: None,
            receipt: true,
            traceparent: None,
        },
    );
    assert!(e.contains("receipt is for mail on this hive"), "{e}");
}

/// A broker killed with SIGKILL right after a send with a receipt, then
/// again mid-turn: the request was stored with the message; the message
/// goes back to the queue and its state (and `hive message`) says it was
/// handed out before; handed out again and acked, its receipt waits for
/// ana without waking her and goes out through her `recv`.
#[test]
fn a_broker_killed_mid_turn_puts_the_message_back_and_keeps_its_receipt_request() {
    let mut b = Broker::start(&["ana", "bob"]);
    let id = send_on(&mut b.agent("ana"), "bob", "keep me", true);
    b.restart();
    assert_eq!(take(&b, "bob"), id);
    let s = state(&mut b.agent("ana"), id);
    assert_eq!((s.state, s.attempts), (Where::HandedOut, Some(1)), "{s:?}");
    b.restart();
    let s = state(&mut b.agent("ana"), id);
    assert_eq!(
        (s.state, s.position, s.attempts),
        (Where::Queued, Some(1), Some(1)),
        "{s:?}"
    );
    assert!(
        s.text.starts_with(&format!(
            "message #{id} to bob: queued, position 1 in bob's queue (handed out before, last at "
        )) && s.text.ends_with(" to a turn; back in the queue)"),
        "{}",
        s.text
    );
    let (code, out, err) = hive_message(&b, &[&id.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.trim_end(), s.text);

    assert_eq!(take(&b, "bob"), id);
    let s = state(&mut b.agent("ana"), id);
    assert_eq!((s.state, s.attempts), (Where::HandedOut, Some(2)), "{s:?}");
    ok(&mut b.agent("bob"), AckTurn { id, turn: Some(4) });
    let s = state(&mut b.agent("ana"), id);
    assert_eq!((s.state, s.attempts), (Where::Acked, Some(2)), "{s:?}");
    assert_eq!(agent_row(&b, "ana").unread, 0, "a receipt wakes nothing");
    let got = recv_all(&b, "ana");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (&got[0].kind, got[0].in_reply_to),
        (&MsgKind::Receipt, Some(id))
    );
    assert_eq!(got[0].body, s.text);
    assert!(got[0].body.ends_with(" by bob's turn 4"), "{}", got[0].body);
}

/// The operator's `hive inbox` acks what it shows: mail an agent sent the
/// operator with `receipt: true` gets its receipt, once, like an agent's ack.
#[test]
fn the_operators_inbox_sends_the_receipts_of_mail_to_the_operator() {
    let b = Broker::start(&["ana"]);
    let asked = send_on(&mut b.agent("ana"), "operator", "please look", true);
    let plain = send_on(&mut b.agent("ana"), "operator", "just so you know", false);
    let sock = b.host_socket();
    let inbox = || run_hive(&["inbox", "--socket", sock.to_str().unwrap()], None, &[]);
    let (code, out, err) = inbox();
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("please look") && out.contains("just so you know"),
        "{out}"
    );
    let s = state(&mut b.agent("ana"), asked);
    assert_eq!(s.state, Where::Acked, "{s:?}");
    assert!(
        s.text
            .starts_with(&format!("message #{asked} to operator: acked at ")),
        "{}",
        s.text
    );
    assert_eq!(agent_row(&b, "ana").unread, 0, "a receipt wakes nothing");
    // Read again, acked again: nothing moves, no second receipt.
    let (code, out, _) = inbox();
    assert_eq!((code, out.trim()), (0, "no unread messages"));
    let again: hyperhive::proto::AckedReply = b
        .host()
        .call(&cmd::InboxAck {
            ids: vec![asked, plain],
        })
        .unwrap();
    assert_eq!(again.acked, 0);
    let got = recv_all(&b, "ana");
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (&got[0].kind, got[0].in_reply_to),
        (&MsgKind::Receipt, Some(asked))
    );
    assert_eq!(got[0].body, s.text);
}

/// Receipts are no waiting work: bob, with two receipts waiting, has
/// nothing unread; a message sent him then is first in his queue, and his
/// turn for it carries both receipts.
#[test]
fn receipts_are_never_waiting_work() {
    let b = Broker::start(&["ana", "bob", "carl"]);
    let ids = acked_with_receipts(&b, "bob", "carl", &["one", "two"]);
    assert_eq!(agent_row(&b, "bob").unread, 0);
    let work = agent_send(&b, "ana", "bob", "work");
    let s = state(&mut b.agent("ana"), work);
    assert_eq!((s.state, s.position), (Where::Queued, Some(1)), "{s:?}");
    assert!(
        s.text.ends_with(": queued, position 1 in bob's queue"),
        "{}",
        s.text
    );
    assert_eq!(agent_row(&b, "bob").unread, 1);
    let m = take_message(&b, "bob");
    assert_eq!(m.id, work);
    let line = receipts_line(&m.body);
    for id in ids {
        assert!(
            line.contains(&format!("message #{id} to carl: acked at ")),
            "#{id}: {line}"
        );
    }
}

/// ana (a real `hive serve`) has receipts waiting. The run of her next
/// message crashes and is run again: the retry carries the same
/// `[receipts]` line. Then her harness and claude are killed with SIGKILL
/// mid-turn: the restarted harness's run of the message carries the
/// receipt that came meanwhile again. Once a turn is acked its receipts are
/// done: none is left for `recv`.
#[test]
fn a_turn_handed_out_again_carries_its_receipts_again() {
    let b = Broker::start(&["ana", "bob"]);
    let mut h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    // The once-markers are written before the pid the test kills by, so
    // the kill never lands between the two.
    h.fake.default_step(
        r#"if grep -q crash-once "$dir/inv-$FAKE_N.stdin" && [ ! -e "$dir/crashed" ]; then touch "$dir/crashed"; init; echo "claude: segmentation fault" >&2; exit 139; fi
if grep -q hang-once "$dir/inv-$FAKE_N.stdin" && [ ! -e "$dir/hung" ]; then touch "$dir/hung"; echo $$ > "$dir/pid-$FAKE_N"; init; sleep 60; fi
ok_turn done"#,
    );
    let ids = acked_with_receipts(&b, "ana", "bob", &["job 1", "job 2"]);
    assert_eq!(h.fake.count(), 1, "receipts start no turn");

    operator_send(&b, "ana", "crash-once");
    wait_for(T, "the retried run", || {
        (runs_with(&h, "crash-once").len() == 2).then_some(())
    });
    wait_drained(&b, "ana");
    let runs = runs_with(&h, "crash-once");
    let first = receipts_line(&h.fake.stdin(runs[0]));
    for id in &ids {
        assert!(
            first.contains(&format!("message #{id} to bob: acked at ")),
            "#{id}: {first}"
        );
    }
    assert_eq!(receipts_line(&h.fake.stdin(runs[1])), first, "the retry");
    assert!(recv_all(&b, "ana").is_empty(), "acked with the turn");

    let late = acked_with_receipts(&b, "ana", "bob", &["job 3"])[0];
    let hang = operator_send(&b, "ana", "hang-once");
    let n = wait_for(T, "the hung run", || {
        runs_with(&h, "hang-once").first().copied()
    });
    let pid = wait_for(T, "the fake claude's pid", || {
        std::fs::read_to_string(h.fake.dir.join(format!("pid-{n}")))
            .ok()?
            .trim()
            .parse::<i32>()
            .ok()
    });
    h.kill9();
    // SAFETY: kill(2) on the fake claude's process group.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    h.spawn();
    let s = wait_for(T, "the message to be acked", || {
        let s = state(&mut b.host(), hang);
        (s.state == Where::Acked).then_some(s)
    });
    assert_eq!(s.attempts, Some(2), "{s:?}");
    wait_drained(&b, "ana");
    let runs = runs_with(&h, "hang-once");
    assert_eq!(runs.len(), 2, "{runs:?}");
    let want = format!("message #{late} to bob: acked at ");
    for n in runs {
        let line = receipts_line(&h.fake.stdin(n));
        assert!(line.contains(&want), "run {n}: {line}");
        assert!(
            !ids.iter()
                .any(|id| line.contains(&format!("message #{id} to bob"))),
            "done with the first turn: {line}"
        );
    }
    assert!(recv_all(&b, "ana").is_empty(), "acked with the turn");
}
