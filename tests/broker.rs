//! Integration tests of `hive broker`: a real broker process on temp dirs, spoken
//! to over its real unix sockets with the wire protocol, killed and restarted.

mod common;

use common::hive::*;
use hyperhive::proto::cmd::{
    AckTurn, Agents, Answer, Ask, CancelLooseEnd, DeadLetter, Failed, FailedReply, GetAgentMeta,
    GetLooseEnds, HarnessStarted, Inbox, Questions, Recv, RecvAck, RecvNext, RecvNextReply, Remind,
    ReportState, RequeueInflight, Retry, Send, SendToParent, SetStatus, Status, StatusReply,
    Version, Wake,
};
use hyperhive::proto::{Attempt, Client, LooseEndKind, Message, MessagesReply, Place, Request};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

fn wake(c: &mut Client, from: &str, body: &str) -> i64 {
    let r = ok(
        c,
        Wake {
            from: from.into(),
            body: body.into(),
            transient: false,
            to: None,
            traceparent: None,
        },
    );
    r["id"].as_i64().expect("stored id")
}

fn recv_next(c: &mut Client, wait: u64) -> RecvNextReply {
    c.call(&RecvNext {
        wait_seconds: Some(wait),
        seen: None,
    })
    .expect("recv_next")
}

fn pop(c: &mut Client) -> Message {
    recv_next(c, 5).message.expect("a message")
}

fn status(c: &mut Client) -> StatusReply {
    c.call(&Status::default()).expect("status")
}

#[test]
fn wake_then_recv_next_then_ack() {
    let b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    let id = wake(&mut a, "cron", "nightly build done");
    let m = pop(&mut a);
    assert_eq!(
        (m.id, m.from.as_str(), m.body.as_str()),
        (id, "cron", "nightly build done")
    );
    assert_eq!(status(&mut a).inflight, Some(id));
    ok(&mut a, AckTurn { id, turn: None });
    let s = status(&mut a);
    assert_eq!((s.unread, s.inflight), (0, None));
    assert!(recv_next(&mut a, 0).message.is_none());
}

#[test]
fn requeue_puts_the_message_back_first_and_one_inflight_at_a_time() {
    let b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    let first = wake(&mut a, "x", "first");
    let _second = wake(&mut a, "x", "second");
    assert_eq!(pop(&mut a).id, first);
    // While a row is inflight, recv_next hands out that row again, never a second.
    let again = recv_next(&mut a, 0);
    assert_eq!(again.message.unwrap().id, first);
    assert!(again.redelivered);
    ok(
        &mut a,
        RequeueInflight {
            id: first,
            ..Default::default()
        },
    );
    assert_eq!(
        status(&mut a),
        StatusReply {
            unread: 2,
            inflight: None,
            status_text: None,
            status_set_at: None,
            resumed: None,
        }
    );
    let m = pop(&mut a);
    assert_eq!((m.id, m.body.as_str()), (first, "first"));
}

#[test]
fn long_poll_returns_when_a_message_arrives() {
    let b = Broker::start(&["ana"]);
    let mut poller = b.agent("ana");
    let sock = b.agent_socket("ana");
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let mut c = Client::connect(&sock).unwrap();
        wake(&mut c, "peer", "ping")
    });
    let start = Instant::now();
    let r = recv_next(&mut poller, 30);
    let id = sender.join().unwrap();
    assert_eq!(r.message.expect("woken with the message").id, id);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "returned before the wait expired"
    );
}

#[test]
fn long_poll_without_mail_ends_empty_after_its_wait() {
    let b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    assert!(recv_next(&mut a, 1).message.is_none());
    // The connection still serves requests afterwards.
    assert_eq!(status(&mut a).unread, 0);
}

#[test]
fn transient_wake_is_delivered_but_not_stored() {
    let mut b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    let r = ok(
        &mut a,
        Wake {
            from: "bash-task-7".into(),
            body: "exit 0".into(),
            transient: true,
            to: None,
            traceparent: None,
        },
    );
    assert!(r.get("id").is_none_or(Value::is_null));
    let m = pop(&mut a);
    assert!(m.transient && m.id < 0);
    ok(
        &mut a,
        AckTurn {
            id: m.id,
            turn: None,
        },
    );
    ok(
        &mut a,
        Wake {
            from: "bash-task-8".into(),
            body: "pending".into(),
            transient: true,
            to: None,
            traceparent: None,
        },
    );
    assert_eq!(status(&mut a).unread, 1);
    b.restart();
    let mut a = b.agent("ana");
    assert_eq!(
        status(&mut a).unread,
        0,
        "transient wakes never reach sqlite"
    );
    let db = rusqlite::Connection::open(b.state_dir().join("broker.db")).unwrap();
    let n: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM messages WHERE sender LIKE 'bash-task-%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(n, 0);
}

#[test]
fn kill_9_keeps_every_accepted_message_in_order() {
    let mut b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    let ids: Vec<i64> = (0..100)
        .map(|i| wake(&mut a, "load", &format!("m{i}")))
        .collect();
    b.kill9();
    b.restart();
    let mut a = b.agent("ana");
    assert_eq!(status(&mut a).unread, 100);
    for (i, id) in ids.iter().enumerate() {
        let m = pop(&mut a);
        assert_eq!((m.id, m.body.clone()), (*id, format!("m{i}")));
        ok(
            &mut a,
            AckTurn {
                id: m.id,
                turn: None,
            },
        );
    }
}

#[test]
fn inflight_at_kill_time_is_requeued_after_restart() {
    let mut b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    let first = wake(&mut a, "x", "one");
    wake(&mut a, "x", "two");
    assert_eq!(pop(&mut a).id, first);
    b.restart();
    let mut a = b.agent("ana");
    assert_eq!(
        status(&mut a),
        StatusReply {
            unread: 2,
            inflight: None,
            status_text: None,
            status_set_at: None,
            resumed: None,
        }
    );
    assert_eq!(pop(&mut a).id, first);
}

#[test]
fn a_harness_killed_mid_turn_gets_its_inflight_row_again() {
    let b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    let id = wake(&mut a, "x", "work");
    assert_eq!(pop(&mut a).id, id);
    drop(a); // the harness dies mid-turn
    let mut a2 = b.agent("ana");
    let r = recv_next(&mut a2, 5);
    assert_eq!(r.message.unwrap().id, id);
    assert!(r.redelivered);
}

fn kick(c: &mut Client) -> i64 {
    let r = ok(
        c,
        HarnessStarted {
            hyperhive_rev: None,
        },
    );
    r["id"].as_i64().expect("the kick's id")
}

#[test]
fn a_harness_killed_during_its_kick_turn_gets_that_kick_and_no_second() {
    let b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    let k1 = kick(&mut a);
    assert_eq!(pop(&mut a).id, k1);
    let mail = wake(&mut a, "x", "while you were down");
    drop(a); // the harness dies before its kick turn ends
    let mut a2 = b.agent("ana");
    assert_eq!(kick(&mut a2), k1, "the waiting kick is the kick");
    let r = recv_next(&mut a2, 5);
    assert_eq!(r.message.as_ref().map(|m| m.id), Some(k1));
    assert!(r.redelivered);
    ok(&mut a2, AckTurn { id: k1, turn: None });
    let m = pop(&mut a2);
    assert_eq!(m.id, mail);
    ok(
        &mut a2,
        AckTurn {
            id: m.id,
            turn: None,
        },
    );
    assert!(recv_next(&mut a2, 0).message.is_none(), "no second kick");
    // Started again before its kick was handed out: still one kick.
    drop(a2);
    let mut a3 = b.agent("ana");
    let k2 = kick(&mut a3);
    assert_ne!(k2, k1, "an acked kick is not the next start's kick");
    let mut a4 = b.agent("ana");
    assert_eq!(kick(&mut a4), k2);
    assert_eq!(pop(&mut a4).id, k2);
    ok(&mut a4, AckTurn { id: k2, turn: None });
    assert!(recv_next(&mut a4, 0).message.is_none());
}

#[test]
fn ack_with_a_stale_or_foreign_id_is_refused() {
    let b = Broker::start(&["ana", "bob"]);
    let mut a = b.agent("ana");
    let mut bob = b.agent("bob");
    let first = wake(&mut a, "x", "one");
    assert_eq!(pop(&mut a).id, first);
    ok(
        &mut a,
        AckTurn {
            id: first,
            turn: None,
        },
    );
    let e = refused(
        &mut a,
        AckTurn {
            id: first,
            turn: None,
        },
    );
    assert!(e.contains("no inflight"), "{e}");
    let second = wake(&mut a, "x", "two");
    assert_eq!(pop(&mut a).id, second);
    let e = refused(
        &mut a,
        AckTurn {
            id: second + 100,
            turn: None,
        },
    );
    assert!(e.contains("not the inflight"), "{e}");
    // Another agent's socket cannot ack or requeue this row.
    let e = refused(
        &mut bob,
        AckTurn {
            id: second,
            turn: None,
        },
    );
    assert!(e.contains("bob has no inflight"), "{e}");
    refused(
        &mut bob,
        RequeueInflight {
            id: second,
            ..Default::default()
        },
    );
    ok(
        &mut a,
        AckTurn {
            id: second,
            turn: None,
        },
    );
}

#[test]
fn an_agent_socket_acts_only_as_that_agent() {
    let b = Broker::start(&["ana", "bob"]);
    let mut ana = b.agent("ana");
    let mut bob = b.agent("bob");
    let mut host = b.host();
    ok(
        &mut host,
        Send {
            to: "bob".into(),
            body: "for bob only".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    assert!(recv_next(&mut ana, 0).message.is_none());
    let drained: MessagesReply = ana
        .call(&Recv {
            wait_seconds: None,
            max: Some(32),
        })
        .unwrap();
    assert!(drained.messages.is_empty());
    let e = refused(
        &mut ana,
        Wake {
            from: "x".into(),
            body: "y".into(),
            transient: false,
            to: Some("bob".into()),
            traceparent: None,
        },
    );
    assert!(e.contains("can only wake ana"), "{e}");
    let reqs: [Request; 5] = [
        Inbox {
            wait_seconds: None,
            peek: true,
            after: None,
        }
        .into(),
        Agents {}.into(),
        Questions {}.into(),
        Failed { agent: None }.into(),
        Retry { id: 1 }.into(),
    ];
    for req in reqs {
        let e = refused(&mut ana, req);
        assert!(e.contains("operator command"), "{e}");
    }
    let agent_only: [Request; 3] = [
        Status::default().into(),
        DeadLetter {
            id: 1,
            error: "x".into(),
            ran: true,
        }
        .into(),
        ReportState { paused: None }.into(),
    ];
    for req in agent_only {
        let e = refused(&mut host, req);
        assert!(e.contains("agent command"), "{e}");
    }
    assert_eq!(pop(&mut bob).body, "for bob only");
}

#[test]
fn parent_sentinel_and_allowed_recipients() {
    let b = Broker::start_config(
        r#"{"hive_name":"pr1ma","agents":[
            {"name":"ruth"},
            {"name":"kid","parent":"ruth","allowed_recipients":["operator"]},
            {"name":"pal"}]}"#,
    );
    let mut kid = b.agent("kid");
    let mut ruth = b.agent("ruth");
    let r = ok(
        &mut kid,
        Send {
            to: "<parent>".into(),
            body: "done".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    assert_eq!(r["to"], "ruth");
    let m = pop(&mut ruth);
    assert_eq!((m.from.as_str(), m.body.as_str()), ("kid", "done"));
    // A root agent's parent is the operator.
    let r = ok(
        &mut ruth,
        Send {
            to: "<parent>".into(),
            body: "hi boss".into(),
            in_reply_to: Some(m.id),
            receipt: false,
            traceparent: None,
        },
    );
    assert_eq!(r["to"], "operator");
    let e = refused(
        &mut kid,
        Send {
            to: "pal".into(),
            body: "psst".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    assert!(e.contains("may not send"), "{e}");
    let e = refused(
        &mut kid,
        Send {
            to: "nobody".into(),
            body: "x".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    assert!(e.contains("unknown recipient"), "{e}");
    ok(
        &mut kid,
        SendToParent {
            body: "[system] hello".into(),
        },
    );
    assert_eq!(pop_after_ack(&mut ruth, m.id).body, "[system] hello");
    let mut host = b.host();
    let inbox: MessagesReply = host
        .call(&Inbox {
            wait_seconds: None,
            peek: false,
            after: None,
        })
        .unwrap();
    assert_eq!(inbox.messages.len(), 1);
    assert_eq!(inbox.messages[0].in_reply_to, Some(m.id));
    let meta = ok(&mut kid, GetAgentMeta { name: None });
    assert_eq!(meta["hive_name"], "pr1ma");
}

fn pop_after_ack(c: &mut Client, id: i64) -> Message {
    ok(c, AckTurn { id, turn: None });
    pop(c)
}

#[test]
fn malformed_input_gets_ok_false_and_the_broker_keeps_serving() {
    let b = Broker::start(&["ana"]);
    let stream = UnixStream::connect(b.agent_socket("ana")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    let huge = format!(
        r#"{{"cmd":"wake","from":"x","body":"{}"}}"#,
        "a".repeat(hyperhive::proto::limits::MAX_LINE + 10)
    );
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{not json".to_vec(), "malformed JSON"),
        (b"42".to_vec(), "JSON object"),
        (br#"{"from":"x"}"#.to_vec(), "no \"cmd\""),
        (br#"{"cmd":"teleport"}"#.to_vec(), "unknown cmd"),
        (
            br#"{"cmd":"wake","from":"x"}"#.to_vec(),
            "missing field `body`",
        ),
        (
            br#"{"cmd":"ack_turn","id":"seven"}"#.to_vec(),
            "invalid type",
        ),
        (br#"{"cmd":"status","junk":true}"#.to_vec(), "unknown field"),
        (b"\xff\xfe\xfd".to_vec(), "UTF-8"),
        (huge.into_bytes(), "longer than"),
        (
            br#"{"cmd":"wake","from":"","body":"x"}"#.to_vec(),
            "from must not be empty",
        ),
        (br#"{"cmd":"hello","version":99}"#.to_vec(), "not supported"),
        (
            br#"{"cmd":"remind","message":"x"}"#.to_vec(),
            "delay_seconds or at_unix_timestamp",
        ),
        (
            br#"{"cmd":"set_status","text":"two\nlines"}"#.to_vec(),
            "one line",
        ),
    ];
    for (line, want) in cases {
        w.write_all(&line).unwrap();
        w.write_all(b"\n").unwrap();
        let mut answer = String::new();
        r.read_line(&mut answer).unwrap();
        let v: Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(v["ok"], false, "{answer}");
        let err = v["error"].as_str().unwrap();
        assert!(err.contains(want), "want {want:?} in {err:?}");
    }
    // The same connection, and a new one, still work.
    w.write_all(b"{\"cmd\":\"hello\",\"version\":1}\n").unwrap();
    let mut answer = String::new();
    r.read_line(&mut answer).unwrap();
    assert!(answer.starts_with(r#"{"ok":true"#), "{answer}");
    assert!(answer.contains(r#""identity":"ana""#), "{answer}");
    let mut a = b.agent("ana");
    wake(&mut a, "x", "still alive");
}

#[test]
fn recv_holds_rows_until_confirmed_and_returns_them_in_order_on_hangup() {
    let b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    let ids: Vec<i64> = (0..3)
        .map(|i| wake(&mut a, "x", &format!("r{i}")))
        .collect();
    let mut mcp = b.agent("ana");
    let got: MessagesReply = mcp
        .call(&Recv {
            wait_seconds: None,
            max: Some(2),
        })
        .unwrap();
    assert_eq!(
        got.messages.iter().map(|m| m.id).collect::<Vec<_>>(),
        ids[..2]
    );
    assert_eq!(status(&mut a).unread, 1);
    drop(mcp); // killed before confirming
    wait_for(Duration::from_secs(5), "held rows to return", || {
        (status(&mut a).unread == 3).then_some(())
    });
    let mut mcp = b.agent("ana");
    let got: MessagesReply = mcp
        .call(&Recv {
            wait_seconds: Some(5),
            max: Some(32),
        })
        .unwrap();
    assert_eq!(got.messages.iter().map(|m| m.id).collect::<Vec<_>>(), ids);
    let r = ok(&mut mcp, RecvAck { ids: ids.clone() });
    assert_eq!(r["acked"], 3);
    drop(mcp);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(status(&mut a).unread, 0);
}

#[test]
fn sigterm_stops_cleanly_and_removes_sockets_even_mid_long_poll() {
    let mut b = Broker::start(&["ana"]);
    let sock = b.agent_socket("ana");
    let poll = std::thread::spawn(move || {
        let mut c = Client::connect(&sock).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let start = Instant::now();
        let r = c.call(&RecvNext {
            wait_seconds: Some(120),
            seen: None,
        });
        (start.elapsed(), r.is_err() || r.unwrap().message.is_none())
    });
    std::thread::sleep(Duration::from_millis(300));
    let st = b.terminate();
    assert!(st.success(), "exit status {st}");
    let (elapsed, ended) = poll.join().unwrap();
    assert!(ended);
    assert!(
        elapsed < Duration::from_secs(120),
        "the long-poll did not wait out its 120 s"
    );
    assert!(!b.host_socket().exists());
    assert!(!b.agent_socket("ana").exists());
}

#[test]
fn sockets_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let b = Broker::start(&["ana"]);
    for p in [b.host_socket(), b.agent_socket("ana")] {
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", p.display());
    }
}

#[test]
fn hive_wake_from_a_shell_script_reads_the_body_from_stdin() {
    let b = Broker::start(&["ana"]);
    let script = b.dir.path().join("notify.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\nprintf 'line one\\nline two\\n' | {} wake --from webhook --body -\n",
            hive_bin().display()
        ),
    )
    .unwrap();
    let out = std::process::Command::new("sh")
        .arg(&script)
        .env("HIVE_SOCKET", b.agent_socket("ana"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut a = b.agent("ana");
    let m = pop(&mut a);
    assert_eq!(
        (m.from.as_str(), m.body.as_str()),
        ("webhook", "line one\nline two")
    );
}

#[test]
fn hive_wake_without_a_broker_says_so() {
    let dir = TempDir::new("nob");
    let sock = dir.path().join("missing.sock");
    let (code, _, err) = run_hive(
        &[
            "wake",
            "--from",
            "x",
            "--body",
            "y",
            "--socket",
            sock.to_str().unwrap(),
        ],
        None,
        &[],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("no broker at") && err.contains("is hive broker running"),
        "{err}"
    );
    let (code, _, err) = run_hive(&["wake", "--from", "x"], None, &[]);
    assert_eq!(code, 2);
    assert!(
        err.contains("missing --body") && err.contains("Usage"),
        "{err}"
    );
}

#[test]
fn operator_commands_over_the_host_socket() {
    let b = Broker::start_config(r#"{"agents":[{"name":"ruth"},{"name":"kid","parent":"ruth"}]}"#);
    let host = b.host_socket();
    let env = [("HIVE_HOST_SOCKET", host.to_str().unwrap())];
    let (code, out, err) = run_hive(&["send", "--to", "ruth", "please", "review"], None, &env);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("sent #"), "{out}");
    let (code, out, _) = run_hive(&["agents"], None, &env);
    assert_eq!(code, 0);
    assert!(out.contains("ruth") && out.contains("kid"), "{out}");
    let (_, out, _) = run_hive(&["agents", "--json"], None, &env);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["agents"][0]["unread"], 1);
    assert_eq!(v["agents"][1]["parent"], "ruth");

    let mut ruth = b.agent("ruth");
    ok(
        &mut ruth,
        SetStatus {
            text: "reviewing".into(),
        },
    );
    ok(
        &mut ruth,
        Send {
            to: "operator".into(),
            body: "looks good".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    let (_, out, _) = run_hive(&["inbox", "--peek"], None, &env);
    assert!(
        out.contains("from ruth") && out.contains("looks good"),
        "{out}"
    );
    let (_, out, _) = run_hive(&["inbox", "--json"], None, &env);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["messages"][0]["body"], "looks good");
    let (_, out, _) = run_hive(&["inbox"], None, &env);
    assert!(out.contains("no unread"), "read messages are gone: {out}");
    let (_, out, _) = run_hive(&["agents"], None, &env);
    assert!(out.contains("reviewing"), "{out}");

    // Questions: asked by an agent, listed and answered by the operator.
    let q = ok(
        &mut ruth,
        Ask {
            question: "ship it?".into(),
            options: vec!["yes".into(), "no".into()],
            multi: false,
            ttl_seconds: None,
            to: None,
        },
    );
    let qid = q["id"].as_i64().unwrap();
    let (_, out, _) = run_hive(&["questions"], None, &env);
    assert!(
        out.contains("ship it?") && out.contains("yes | no"),
        "{out}"
    );
    let (code, _, _) = run_hive(&["answer", &qid.to_string(), "yes"], None, &env);
    assert_eq!(code, 0);
    let (code, _, err) = run_hive(&["answer", &qid.to_string(), "again"], None, &env);
    assert_ne!(code, 0);
    assert!(err.contains("no open question"), "{err}");
    let first = pop(&mut ruth); // the operator's message
    ok(
        &mut ruth,
        AckTurn {
            id: first.id,
            turn: None,
        },
    );
    let m = pop(&mut ruth);
    assert_eq!(m.kind, "question_answered");
    assert!(
        m.body.contains("yes") && m.body.contains("ship it?"),
        "{}",
        m.body
    );

    let (code, _, err) = run_hive(&["send", "--to", "ghost", "hi"], None, &env);
    assert_ne!(code, 0);
    assert!(err.contains("unknown agent"), "{err}");
}

#[test]
fn questions_between_agents_ttl_and_cancel() {
    let b = Broker::start(&["ana", "bob"]);
    let mut ana = b.agent("ana");
    let mut bob = b.agent("bob");
    let q = ok(
        &mut ana,
        Ask {
            question: "which branch?".into(),
            options: vec!["main".into(), "dev".into()],
            multi: true,
            ttl_seconds: None,
            to: Some("bob".into()),
        },
    );
    let qid = q["id"].as_i64().unwrap();
    let asked = pop(&mut bob);
    assert_eq!(asked.kind, "question_asked");
    assert!(asked.body.contains("which branch?") && asked.body.contains("main | dev"));
    ok(
        &mut bob,
        AckTurn {
            id: asked.id,
            turn: None,
        },
    );
    let e = refused(
        &mut ana,
        Answer {
            id: qid,
            answer: "main".into(),
        },
    );
    assert!(e.contains("only they may answer"), "{e}");
    let ends: hyperhive::proto::cmd::LooseEndsReply =
        bob.call(&GetLooseEnds { agent: None }).unwrap();
    assert_eq!(ends.owed.len(), 1);
    ok(
        &mut bob,
        Answer {
            id: qid,
            answer: "main, dev".into(),
        },
    );
    let ans = pop(&mut ana);
    assert!(ans.body.contains("main, dev"), "{}", ans.body);
    ok(
        &mut ana,
        AckTurn {
            id: ans.id,
            turn: None,
        },
    );

    // TTL expiry answers [expired].
    ok(
        &mut ana,
        Ask {
            question: "quick?".into(),
            options: vec![],
            multi: false,
            ttl_seconds: Some(1),
            to: None,
        },
    );
    let exp = recv_next(&mut ana, 10).message.expect("expiry notice");
    assert!(exp.body.contains("[expired]"), "{}", exp.body);
    ok(
        &mut ana,
        AckTurn {
            id: exp.id,
            turn: None,
        },
    );

    // The asker may withdraw; nobody else may.
    let q = ok(
        &mut ana,
        Ask {
            question: "later?".into(),
            options: vec![],
            multi: false,
            ttl_seconds: None,
            to: Some("bob".into()),
        },
    );
    let qid = q["id"].as_i64().unwrap();
    let e = refused(
        &mut bob,
        CancelLooseEnd {
            kind: LooseEndKind::Question,
            id: qid,
        },
    );
    assert!(e.contains("not yours"), "{e}");
    ok(
        &mut ana,
        CancelLooseEnd {
            kind: LooseEndKind::Question,
            id: qid,
        },
    );
    let e = refused(
        &mut ana,
        CancelLooseEnd {
            kind: LooseEndKind::Approval,
            id: 1,
        },
    );
    assert!(e.contains("approval"), "{e}");
}

#[test]
fn reminders_fire_across_a_broker_restart_with_their_whole_payload() {
    let mut b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    let big = "x".repeat(5000);
    let r = ok(
        &mut a,
        Remind {
            message: big.clone(),
            delay_seconds: Some(3600),
            at_unix_timestamp: None,
        },
    );
    let big_id = r["id"].as_i64().unwrap();
    // The broker keeps the payload in its store and writes no file.
    assert!(!b.state_dir().join("agents").exists());
    ok(
        &mut a,
        Remind {
            message: "check the deploy".into(),
            delay_seconds: Some(1),
            at_unix_timestamp: None,
        },
    );
    ok(
        &mut a,
        Remind {
            message: big.clone(),
            delay_seconds: Some(1),
            at_unix_timestamp: None,
        },
    );
    let ends: hyperhive::proto::cmd::LooseEndsReply =
        a.call(&GetLooseEnds { agent: None }).unwrap();
    assert_eq!(ends.reminders.len(), 3);
    let long = ends.reminders.iter().find(|r| r.id == big_id).unwrap();
    assert_eq!((long.preview.len(), long.bytes), (200, 5000));
    b.restart();
    let mut a = b.agent("ana");
    let m = recv_next(&mut a, 10).message.expect("the reminder fires");
    assert_eq!((m.from.as_str(), m.kind.as_str()), ("reminder", "reminder"));
    assert!(m.body.ends_with("] check the deploy"), "{}", m.body);
    ok(
        &mut a,
        AckTurn {
            id: m.id,
            turn: None,
        },
    );
    let m = recv_next(&mut a, 10).message.expect("the long one fires");
    assert_eq!(m.body, format!("[reminder #{}] {big}", big_id + 2));
    ok(
        &mut a,
        AckTurn {
            id: m.id,
            turn: None,
        },
    );
    ok(
        &mut a,
        CancelLooseEnd {
            kind: LooseEndKind::Reminder,
            id: big_id,
        },
    );
    let ends: hyperhive::proto::cmd::LooseEndsReply =
        a.call(&GetLooseEnds { agent: None }).unwrap();
    assert!(ends.reminders.is_empty(), "{ends:?}");
    assert!(!b.state_dir().join("agents").exists());
}

#[test]
fn a_bad_config_names_the_field_and_exits_2() {
    let dir = TempDir::new("cfg");
    let cfg = dir.path().join("hive.json");
    let s = dir.path().join("s").display().to_string();
    let r = dir.path().join("r").display().to_string();
    for (text, want) in [
        (
            r#"{"agents":[{"name":"ruth"},{"name":"kid","parent":"rut"}]}"#,
            "agents[1].parent",
        ),
        (
            r#"{"agents":[{"name":"ruth","colour":"red"}]}"#,
            "unknown field `colour`",
        ),
        (r#"{"agents":[]}"#, "no agents"),
        ("{", "EOF"),
    ] {
        std::fs::write(&cfg, text).unwrap();
        let (code, _, err) = run_hive(
            &[
                "broker",
                "--config",
                cfg.to_str().unwrap(),
                "--state-dir",
                &s,
                "--run-dir",
                &r,
            ],
            None,
            &[],
        );
        assert_eq!(code, 2, "{text}: {err}");
        assert!(err.contains(want), "{text}: {err}");
    }
}

#[test]
fn an_agent_socket_can_be_given_to_the_agents_user() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if unsafe { libc::geteuid() } != 0 {
        let _ = writeln_skip("giving sockets away needs root");
        return;
    }
    let b = Broker::start_config(
        r#"{"operator_gid":65534,"agents":[{"name":"ana","socket_uid":65534,"socket_gid":65534},{"name":"bob"}]}"#,
    );
    let meta = std::fs::metadata(b.agent_socket("ana")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);
    let host = std::fs::metadata(b.host_socket()).unwrap();
    assert_eq!(
        (host.gid(), host.permissions().mode() & 0o777),
        (65534, 0o660)
    );
    let bob = std::fs::metadata(b.agent_socket("bob")).unwrap();
    assert_eq!(bob.permissions().mode() & 0o777, 0o600);
}

fn writeln_skip(why: &str) -> std::io::Result<()> {
    use std::io::Write;
    writeln!(std::io::stderr(), "SKIPPED: {why}")
}

#[test]
fn hive_version_asks_the_broker_over_the_host_socket() {
    let b = Broker::start(&["ana"]);
    let sock = b.host_socket();
    let (code, out, err) = run_hive(&["version", "--socket", sock.to_str().unwrap()], None, &[]);
    assert_eq!(code, 0, "{err}");
    let rev = hyperhive::proto::HYPERHIVE_REV;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0],
        format!("hive {} ({rev})", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        lines[1],
        format!("broker {} ({rev}), protocol 1", env!("CARGO_PKG_VERSION"))
    );
    let (code, out, _) = run_hive(
        &["version", "--json", "--socket", sock.to_str().unwrap()],
        None,
        &[],
    );
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(
        (v["hive"]["rev"].clone(), v["broker"]["protocol"].clone()),
        (Value::from(rev), 1.into())
    );
    // It is the operator's: an agent's socket refuses it.
    let e = refused(&mut b.agent("ana"), Version {});
    assert_eq!(
        e,
        "version is an operator command; this is the socket of agent ana"
    );
}

#[test]
fn attempts_positions_and_dead_letters_survive_a_broker_restart() {
    let mut b = Broker::start(&["ana"]);
    let mut host = b.host();
    ok(
        &mut host,
        Send {
            to: "ana".into(),
            body: "one".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    // Another sender: a script.
    ok(
        &mut host,
        Wake {
            from: "cron".into(),
            body: "two".into(),
            transient: false,
            to: Some("ana".into()),
            traceparent: None,
        },
    );
    let mut a = b.agent("ana");
    let r = recv_next(&mut a, 0);
    let one = r.message.unwrap().id;
    assert_eq!(r.attempts, 1);
    ok(
        &mut a,
        RequeueInflight {
            id: one,
            attempt: Attempt::Counted,
            place: Place::Behind,
            error: Some("claude crashed".into()),
        },
    );
    b.restart();
    let mut a = b.agent("ana");
    // "one" went behind "two", for good.
    let r = recv_next(&mut a, 0);
    assert_eq!((r.message.unwrap().body.as_str(), r.attempts), ("two", 1));
    ok(
        &mut a,
        AckTurn {
            id: one + 1,
            turn: None,
        },
    );
    // Its count survived; a hand-out interrupted by a broker crash counts.
    let r = recv_next(&mut a, 0);
    assert_eq!((r.message.unwrap().id, r.attempts), (one, 2));
    b.restart();
    let mut a = b.agent("ana");
    let r = recv_next(&mut a, 0);
    assert_eq!((r.message.unwrap().id, r.attempts), (one, 3));
    ok(
        &mut a,
        DeadLetter {
            id: one,
            error: "claude crashed again".into(),
            ran: true,
        },
    );
    b.restart();
    let mut a = b.agent("ana");
    // Kept, never handed out, not unread.
    assert!(recv_next(&mut a, 0).message.is_none());
    assert_eq!(status(&mut a).unread, 0);
    let f: FailedReply = b.host().call(&Failed { agent: None }).unwrap();
    assert_eq!(
        (
            f.failed.len(),
            f.failed[0].attempts,
            f.failed[0].last_error.as_str()
        ),
        (1, 3, "claude crashed again")
    );
    assert_eq!(agent_row(&b, "ana").failed, 1);
    ok(&mut b.host(), Retry { id: one });
    let r = recv_next(&mut a, 0);
    assert_eq!((r.message.unwrap().id, r.attempts), (one, 1));
}

/// `hive` ignores SIGPIPE, and a process started with its standard descriptors
/// closed still gets `/dev/null` on them, so the store it opens never takes descriptor 0, 1 or
/// 2 (where a log line or a stray print would land in `broker.db`), and
/// `hive wake`, its stdout closed, still stores its message.
#[test]
fn a_hive_started_with_its_standard_descriptors_closed_keeps_its_files_off_them() {
    use std::process::{Command, Stdio};
    let dir = TempDir::new("fds");
    let (state, run) = (dir.path().join("s"), dir.path().join("r"));
    // `exec` with 0, 1 and 2 closed, as a careless init script would start it.
    let mut broker = Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"exec "$0" "$@" <&- >&- 2>&-"#)
        .arg(hive_bin())
        .args(["broker", "--agents", "ana", "--state-dir"])
        .arg(&state)
        .arg("--run-dir")
        .arg(&run)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let socket = run.join("agents").join("ana").join("mcp.sock");
    let mut a = wait_for(Duration::from_secs(30), "the agent socket", || {
        Client::connect(&socket).ok()
    });
    a.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let fd = |n: u32| {
        std::fs::read_link(format!("/proc/{}/fd/{n}", broker.id()))
            .unwrap()
            .display()
            .to_string()
    };
    for n in 0..3 {
        assert_eq!(fd(n), "/dev/null", "descriptor {n} of the broker");
    }
    // And SIGPIPE is ignored, as std's start had it: a client gone is EPIPE.
    let status = std::fs::read_to_string(format!("/proc/{}/status", broker.id())).unwrap();
    let ignored = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .map(|m| u64::from_str_radix(m.trim(), 16).unwrap())
        .unwrap();
    assert_ne!(
        ignored & (1 << (libc::SIGPIPE - 1)),
        0,
        "SigIgn {ignored:x}"
    );
    let one = wake(&mut a, "cron", "first");
    // The wake command, its stdout and stderr closed.
    let st = Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"exec "$0" "$@" >&- 2>&-"#)
        .arg(hive_bin())
        .args(["wake", "--socket"])
        .arg(&socket)
        .args(["--from", "cron", "--body", "second"])
        .stdin(Stdio::null())
        .status()
        .unwrap();
    assert!(
        st.success(),
        "hive wake with stdout and stderr closed: {st}"
    );
    let r = recv_next(&mut a, 0);
    assert_eq!(r.message.unwrap().id, one);
    ok(
        &mut a,
        AckTurn {
            id: one,
            turn: None,
        },
    );
    assert_eq!(recv_next(&mut a, 0).message.unwrap().body, "second");
    let _ = broker.kill();
    let _ = broker.wait();
}
