//! The broker's limits against a real `hive broker` process, from the probe's
//! reproducers (`docs/reliability.md`, "Broker limits"): descriptors (a low
//! `ulimit -n`, a flood of connections on one agent's socket, `EMFILE` in the
//! accept loop, idle connections), sizes end to end (`hyperhive::proto::limits::MAX_BODY` on every
//! path that creates a message, answers cut to `hyperhive::proto::limits::PAGE_BYTES`, the
//! operator inbox under `hive inbox | head`), and `request_apply_commit` on a
//! FIFO or a huge file.

mod common;

use common::hive::*;
use hyperhive::proto::cmd::{
    AckTurn, Approvals, Ask, Hello, RecvNext, RecvNextReply, RequestApplyCommit, Send, Status,
};
use hyperhive::proto::{Client, ClientError};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

/// Sends one raw line on a fresh connection and returns the answer line.
fn raw_line(path: &std::path::Path, line: &str) -> String {
    let s = UnixStream::connect(path).expect("connect");
    s.set_read_timeout(Some(T)).unwrap();
    let mut r = BufReader::new(s);
    r.get_mut()
        .write_all(format!("{line}\n").as_bytes())
        .unwrap();
    let mut answer = String::new();
    r.read_line(&mut answer).unwrap();
    answer
}

/// One request on an open raw connection: the answer's size in bytes and its
/// value (`ok` included).
fn sized_call(r: &mut BufReader<UnixStream>, req: &Value) -> (usize, Value) {
    r.get_mut()
        .write_all(format!("{req}\n").as_bytes())
        .unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:.200}"));
    assert_eq!(v["ok"], true, "{req:.200}: {line:.300}");
    (line.len(), v)
}

fn raw_conn(path: &std::path::Path) -> BufReader<UnixStream> {
    let s = UnixStream::connect(path).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    BufReader::new(s)
}

fn hello(c: &mut Client) -> String {
    ok(c, Hello { version: None })["identity"]
        .as_str()
        .unwrap()
        .to_string()
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Unread operator messages, straight from the store.
fn operator_unread(b: &Broker) -> i64 {
    let db = rusqlite::Connection::open(b.state_dir().join("broker.db")).unwrap();
    db.query_row(
        "SELECT COUNT(*) FROM messages WHERE recipient = 'operator' AND state = 'queued'",
        [],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn three_hundred_connections_on_one_agent_socket_lock_out_nobody_under_ulimit_256() {
    let b = Broker::start_process(
        &["ana", "bob"],
        None,
        Process {
            nofile: Some(256),
            ..Process::default()
        },
    );
    let sock = b.agent_socket("ana");
    // Kept open: a connection closing during the flood would free a place and
    // start a second burst of refusals.
    let _probe = b.agent("ana");
    let mut held = Vec::new();
    for _ in 0..300 {
        held.push(UnixStream::connect(&sock).expect("connect to ana's socket"));
    }
    let (mut served, mut refused) = (0, 0);
    for s in &held {
        s.set_read_timeout(Some(T)).unwrap();
        let _ = (&*s).write_all(b"{\"cmd\":\"hello\"}\n");
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["ok"] == true {
            served += 1;
        } else {
            let e = v["error"].as_str().unwrap();
            assert!(
                e.contains("too many connections on the socket of ana"),
                "{e}"
            );
            refused += 1;
        }
    }
    assert!(
        served >= 1 && refused >= 200,
        "served {served}, refused {refused}"
    );
    assert!(fd_count(b.pid()) < 256, "{} descriptors", fd_count(b.pid()));

    // The operator and the other agent are served meanwhile, and a message sent
    // to the flooded agent is stored.
    assert_eq!(hello(&mut b.host()), "operator");
    let mut bob = b.agent("bob");
    assert_eq!(hello(&mut bob), "bob");
    let meanwhile = operator_send(&b, "ana", "sent meanwhile");
    ok(
        &mut bob,
        Send {
            to: "ana".into(),
            body: "from bob meanwhile".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    let refusing = b.log().matches("refusing connections").count();
    assert_eq!(refusing, 1, "one log line per burst of refusals");

    drop(held);
    let mut ana = wait_for(T, "ana's socket to serve again", || {
        let mut c = Client::connect(&sock).ok()?;
        c.set_read_timeout(Some(T)).ok()?;
        c.call(&Hello { version: None }).ok().map(|_| c)
    });
    let first: RecvNextReply = ana
        .call(&RecvNext {
            wait_seconds: Some(5),
            seen: None,
        })
        .unwrap();
    let m = first.message.expect("the message sent meanwhile");
    assert_eq!((m.id, m.body.as_str()), (meanwhile, "sent meanwhile"));
    ok(
        &mut ana,
        AckTurn {
            id: m.id,
            turn: None,
        },
    );
    let second: RecvNextReply = ana
        .call(&RecvNext {
            wait_seconds: Some(5),
            seen: None,
        })
        .unwrap();
    assert_eq!(second.message.unwrap().body, "from bob meanwhile");
}

#[test]
fn the_accept_loop_survives_emfile_logs_once_and_serves_again() {
    let b = Broker::start(&["ana"]);
    let sock = b.agent_socket("ana");
    let mut host = b.host();
    let mut ana = b.agent("ana");
    let pid = b.pid();
    // Leave the broker three descriptors: the connections below run it out.
    let lim = libc::rlimit {
        rlim_cur: (fd_count(pid) + 3) as libc::rlim_t,
        rlim_max: 20_000,
    };
    // SAFETY: prlimit on our own child with a struct we own.
    let r = unsafe { libc::prlimit(pid as i32, libc::RLIMIT_NOFILE, &lim, std::ptr::null_mut()) };
    assert_eq!(r, 0, "prlimit: {}", std::io::Error::last_os_error());
    let held: Vec<UnixStream> = (0..12)
        .map(|_| UnixStream::connect(&sock).expect("connect"))
        .collect();
    wait_for(T, "accept to fail", || {
        b.log()
            .contains("accept on the socket of ana failed")
            .then_some(())
    });
    // The backoff retries for a while; connections already open keep working.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(hello(&mut host), "operator");
    assert_eq!(hello(&mut ana), "ana");
    let log = b.log();
    assert_eq!(
        log.matches("accept on the socket of ana failed").count(),
        1,
        "one line per burst: {log}"
    );
    drop(held);
    let restore = libc::rlimit {
        rlim_cur: 20_000,
        rlim_max: 20_000,
    };
    // SAFETY: as above.
    unsafe {
        libc::prlimit(
            pid as i32,
            libc::RLIMIT_NOFILE,
            &restore,
            std::ptr::null_mut(),
        )
    };
    let answer = raw_line(&sock, r#"{"cmd":"hello"}"#);
    assert!(answer.contains("\"identity\":\"ana\""), "{answer}");
    wait_for(T, "the recovery line", || {
        b.log()
            .contains("accepting on the socket of ana again after")
            .then_some(())
    });
}

#[test]
fn idle_connections_are_closed_and_parked_ones_are_not() {
    let b = Broker::start_process(
        &["ana"],
        None,
        Process {
            env: vec![("HIVE_BROKER_IDLE_SECS".into(), "1".into())],
            ..Process::default()
        },
    );
    let sock = b.agent_socket("ana");
    let _ = b.agent("ana");
    let mut idle = UnixStream::connect(&sock).unwrap();
    idle.set_read_timeout(Some(T)).unwrap();
    let mut slow = UnixStream::connect(&sock).unwrap();
    slow.set_read_timeout(Some(T)).unwrap();
    slow.write_all(b"{\"cmd\":").unwrap();
    let mut parked = b.agent("ana");
    let mut client = b.agent("ana");
    ok(&mut client, Status::default());

    // A long-poll longer than the idle timeout is answered, not cut off.
    let r: RecvNextReply = parked
        .call(&RecvNext {
            wait_seconds: Some(3),
            seen: None,
        })
        .unwrap();
    assert!(r.message.is_none());
    ok(&mut parked, Status::default());

    let mut buf = [0u8; 64];
    assert_eq!(
        std::io::Read::read(&mut idle, &mut buf).unwrap(),
        0,
        "idle closed"
    );
    assert_eq!(
        std::io::Read::read(&mut slow, &mut buf).unwrap(),
        0,
        "a request that trickles in counts as idle"
    );
    // A client on a connection closed for idleness gets an I/O error (so it
    // reconnects), never a refusal.
    match client.call(&Status::default()) {
        Err(ClientError::Io(_)) => {}
        other => panic!("expected an I/O error, got {other:?}"),
    }
    assert!(b.log().contains("idle for 1 s, closed"));
}

#[test]
fn a_body_of_the_old_wedging_size_is_refused_and_the_agent_keeps_working() {
    let b = Broker::start(&["ana", "bob"]);
    let big = "p".repeat(1_048_500);
    let mut bob = b.agent("bob");
    let e = refused(
        &mut bob,
        Send {
            to: "ana".into(),
            body: big.clone(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    assert!(e.contains("1048500 bytes") && e.contains("65536"), "{e}");
    let host = b.host_socket();
    let env = [("HIVE_HOST_SOCKET", host.to_str().unwrap())];
    let (code, _, err) = run_hive(&["send", "--to", "ana", "-"], Some(&big), &env);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("1048500 bytes") && err.contains("65536"),
        "{err}"
    );
    let agent = b.agent_socket("ana");
    let (code, _, err) = run_hive(
        &["wake", "--from", "cron", "--body", "-"],
        Some(&format!("{big}\n")),
        &[("HIVE_SOCKET", agent.to_str().unwrap())],
    );
    assert_eq!(code, 1, "{err}");
    // The size of what came on stdin, its newline included.
    assert!(
        err.contains("1048501 bytes") && err.contains("65536"),
        "{err}"
    );

    let id = operator_send(&b, "ana", "follow-up");
    let mut ana = b.agent("ana");
    let r: RecvNextReply = ana
        .call(&RecvNext {
            wait_seconds: Some(5),
            seen: None,
        })
        .unwrap();
    let m = r.message.expect("the follow-up");
    assert_eq!(
        (m.id, m.body.as_str(), r.unread),
        (id, "follow-up", Some(0))
    );
}

#[test]
fn every_path_that_creates_a_message_checks_its_size_and_refuses_blank_text() {
    let b = Broker::start_config(
        r#"{"agents":[{"name":"ana","tool_groups":["messaging","meta","inbox","scheduling"]},{"name":"bob"}]}"#,
    );
    let (mut ana, mut bob, mut host) = (b.agent("ana"), b.agent("bob"), b.host());
    let to_ana = ok(
        &mut bob,
        Ask {
            question: "for ana".into(),
            options: vec![],
            multi: false,
            ttl_seconds: None,
            to: Some("ana".into()),
        },
    )["id"]
        .as_i64()
        .unwrap();
    let to_op = ok(
        &mut ana,
        Ask {
            question: "for the operator".into(),
            options: vec![],
            multi: false,
            ttl_seconds: None,
            to: None,
        },
    )["id"]
        .as_i64()
        .unwrap();
    type Make = Box<dyn Fn(&str) -> Value>;
    let on_ana: Vec<(&str, Make)> = vec![
        (
            "send",
            Box::new(|t| json!({"cmd":"send","to":"bob","body":t})),
        ),
        (
            "wake",
            Box::new(|t| json!({"cmd":"wake","from":"cron","body":t})),
        ),
        (
            "send_to_parent",
            Box::new(|t| json!({"cmd":"send_to_parent","body":t})),
        ),
        (
            "remind",
            Box::new(|t| json!({"cmd":"remind","message":t,"delay_seconds":600})),
        ),
        (
            "schedule_prompt",
            Box::new(|t| json!({"cmd":"schedule_prompt","body":t,"delay_seconds":600})),
        ),
        ("ask", Box::new(|t| json!({"cmd":"ask","question":t}))),
        (
            "answer",
            Box::new(move |t| json!({"cmd":"answer","id":to_ana,"answer":t})),
        ),
    ];
    let on_host: Vec<(&str, Make)> = vec![
        (
            "send",
            Box::new(|t| json!({"cmd":"send","to":"ana","body":t})),
        ),
        (
            "wake",
            Box::new(|t| json!({"cmd":"wake","to":"ana","from":"cron","body":t})),
        ),
        (
            "answer",
            Box::new(move |t| json!({"cmd":"answer","id":to_op,"answer":t})),
        ),
    ];
    let over = "x".repeat(hyperhive::proto::limits::MAX_BODY + 1);
    for (client, cases) in [(&mut ana, on_ana), (&mut host, on_host)] {
        for (name, make) in cases {
            for (text, want) in [(over.as_str(), "65537 bytes"), ("  \n\t ", "empty")] {
                let e = match call_raw(client, &make(text).to_string()) {
                    Err(ClientError::Refused(e)) => e,
                    other => panic!("{name} with {want}: {other:?}"),
                };
                assert!(e.contains(want), "{name}: {e}");
                if want != "empty" {
                    assert!(e.contains("65536"), "{name} names the limit: {e}");
                }
            }
        }
    }
    for (options, want) in [
        (vec!["o".to_string(); 33], "at most 32"),
        (vec!["o".repeat(201)], "200 characters"),
        (vec![" ".to_string()], "200 characters"),
    ] {
        let e = refused(
            &mut ana,
            Ask {
                question: "pick".into(),
                options,
                multi: false,
                ttl_seconds: None,
                to: None,
            },
        );
        assert!(e.contains(want), "{e}");
    }
    // Exactly the limit goes through, and nothing over it was stored.
    ok(
        &mut host,
        Send {
            to: "ana".into(),
            body: "y".repeat(hyperhive::proto::limits::MAX_BODY),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    let db = rusqlite::Connection::open(b.state_dir().join("broker.db")).unwrap();
    let (over, blank): (i64, i64) = db
        .query_row(
            "SELECT SUM(length(body) > 65536), SUM(trim(body) = '') FROM messages",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((over, blank), (0, 0));
}

#[test]
fn recv_and_every_list_answer_fit_in_one_line() {
    let b = Broker::start_config(
        r#"{"agents":[{"name":"ana","tool_groups":["messaging","meta","inbox","scheduling","approvals"]}]}"#,
    );
    for i in 0..20 {
        operator_send(&b, "ana", &format!("m{i} {}", "r".repeat(60_000)));
    }
    let mut ana = raw_conn(&b.agent_socket("ana"));
    let mut got = Vec::new();
    loop {
        let (size, v) = sized_call(&mut ana, &json!({"cmd":"recv","max":32}));
        assert!(
            size <= hyperhive::proto::limits::PAGE_BYTES + 70_000,
            "{size}"
        );
        let msgs = v["messages"].as_array().unwrap().clone();
        if msgs.is_empty() {
            break;
        }
        assert!(msgs.len() < 20, "a page holds what fits, not all 20");
        let ids: Vec<i64> = msgs.iter().map(|m| m["id"].as_i64().unwrap()).collect();
        got.extend(
            msgs.iter()
                .map(|m| m["body"].as_str().unwrap()[..3].to_string()),
        );
        sized_call(&mut ana, &json!({"cmd":"recv_ack","ids":ids}));
        if v["more"] != true {
            break;
        }
    }
    let want: Vec<String> = (0..20).map(|i| format!("m{i} ")[..3].to_string()).collect();
    assert_eq!(got, want);

    for i in 0..20 {
        let q = format!("q{i} {}", "?".repeat(60_000));
        sized_call(&mut ana, &json!({"cmd":"ask","question":q}));
        let s = format!("s{i} {}", "s".repeat(60_000));
        sized_call(
            &mut ana,
            &json!({"cmd":"schedule_prompt","body":s,"delay_seconds":3600}),
        );
    }
    for _ in 0..10 {
        let patch = json!({"env":{"K":"v".repeat(60_000)}}).to_string();
        sized_call(
            &mut ana,
            &json!({"cmd":"request_apply_commit","agent":"ana","commit_ref":patch}),
        );
    }
    let mut host = raw_conn(&b.host_socket());
    let checks = [
        (false, json!({"cmd":"get_loose_ends"}), "asked", 20),
        (false, json!({"cmd":"list_scheduled"}), "scheduled", 20),
        (true, json!({"cmd":"questions"}), "questions", 20),
        (true, json!({"cmd":"approvals"}), "approvals", 10),
    ];
    for (on_host, req, list, all) in checks {
        let conn = if on_host { &mut host } else { &mut ana };
        let (size, v) = sized_call(conn, &req);
        assert!(
            size <= hyperhive::proto::limits::PAGE_BYTES + 1024,
            "{req}: {size}"
        );
        let shown = v[list].as_array().unwrap().len() as u64;
        let left = v["left_off"].as_u64().unwrap_or(0);
        assert!(
            shown > 0 && left > 0,
            "{req}: {shown} shown, {left} left off"
        );
        if req["cmd"] != "get_loose_ends" {
            assert_eq!(shown + left, all, "{req}");
        }
    }
    let host_sock = b.host_socket();
    let (code, out, err) = run_hive(
        &["questions"],
        None,
        &[("HIVE_HOST_SOCKET", host_sock.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("more questions not shown"), "{:.300}", out);
}

#[test]
fn hive_inbox_prints_twenty_big_messages_and_a_hang_up_or_head_loses_none() {
    let b = Broker::start(&["bob"]);
    let mut bob = b.agent("bob");
    for i in 0..20 {
        ok(
            &mut bob,
            Send {
                to: "operator".into(),
                body: format!("report {i}: {}", "r".repeat(60_000)),
                in_reply_to: None,
                receipt: false,
                traceparent: None,
            },
        );
    }
    // A client that asks and hangs up without reading.
    let mut s = UnixStream::connect(b.host_socket()).unwrap();
    s.write_all(b"{\"cmd\":\"inbox\"}\n").unwrap();
    drop(s);
    let host = b.host_socket();
    let env = [("HIVE_HOST_SOCKET", host.to_str().unwrap())];
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{} inbox | head -c 10", hive_bin().display()))
        .env("HIVE_HOST_SOCKET", &host)
        .output()
        .unwrap();
    assert_eq!(out.stdout.len(), 10);
    assert_eq!(operator_unread(&b), 20, "nothing was marked read");

    let (code, out, err) = run_hive(&["inbox"], None, &env);
    assert_eq!(code, 0, "{err}");
    for i in 0..20 {
        assert_eq!(
            out.matches(&format!("report {i}: ")).count(),
            1,
            "report {i} printed once"
        );
    }
    assert_eq!(operator_unread(&b), 0);
    let (_, out, _) = run_hive(&["inbox"], None, &env);
    assert!(out.contains("no unread messages"), "{out}");
}

#[test]
fn a_fifo_or_a_huge_patch_file_is_refused_and_the_hub_keeps_answering() {
    let b = Broker::start_config(
        r#"{"agents":[{"name":"ana","tool_groups":["messaging","approvals"]}]}"#,
    );
    let state = b.state_dir().join("agents/ana/state");
    std::fs::create_dir_all(&state).unwrap();
    let fifo = state.join("patch.json");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    std::fs::File::create(state.join("big.json"))
        .unwrap()
        .set_len(1 << 30)
        .unwrap();
    std::fs::write(state.join("ok.json"), r#"{"model":"opus"}"#).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", state.join("out.json")).unwrap();

    let sock = b.agent_socket("ana");
    let asker = std::thread::spawn(move || {
        let mut ana = Client::connect(&sock).unwrap();
        ana.set_read_timeout(Some(T)).unwrap();
        let req = RequestApplyCommit {
            agent: "ana".into(),
            commit_ref: "patch.json".into(),
        };
        ana.call(&req)
    });
    assert_eq!(hello(&mut b.host()), "operator");
    match asker.join().unwrap() {
        Err(ClientError::Refused(e)) => assert!(e.contains("a FIFO"), "{e}"),
        other => panic!("the FIFO patch: {other:?}"),
    }
    let mut ana = b.agent("ana");
    let mut answer = |commit_ref: &str| {
        refused(
            &mut ana,
            RequestApplyCommit {
                agent: "ana".into(),
                commit_ref: commit_ref.into(),
            },
        )
        .replace(commit_ref, "REF")
    };
    for (commit_ref, want) in [("big.json", "1073741824 bytes"), (".", "a directory")] {
        let e = answer(commit_ref);
        assert!(e.contains(want), "{commit_ref}: {e}");
    }
    // A path that is missing and one that is forbidden (outside ana's dir,
    // or a symlink out of it) get the same answer, so no agent learns what
    // exists outside its dir (robustness review N10).
    std::fs::create_dir_all(b.state_dir().join("agents/bob")).unwrap();
    std::fs::write(b.state_dir().join("agents/bob/secret.json"), "{}").unwrap();
    let alike = answer("missing.json");
    assert!(
        alike.contains("not there or outside your own dir"),
        "{alike}"
    );
    for commit_ref in [
        "out.json",
        "/etc/hostname",
        "/etc/hostnamex",
        "../../bob/secret.json",
        "../../bob/nope.json",
    ] {
        assert_eq!(answer(commit_ref), alike, "{commit_ref}");
    }
    let mut ana = b.agent("ana");
    let r = ok(
        &mut ana,
        RequestApplyCommit {
            agent: "ana".into(),
            commit_ref: "ok.json".into(),
        },
    );
    assert!(r["id"].as_i64().is_some(), "{r:?}");
    let pending: hyperhive::proto::cmd::ApprovalsReply = b.host().call(&Approvals {}).unwrap();
    assert_eq!(pending.approvals.len(), 1);
    assert_eq!(pending.approvals[0].payload, json!({"model":"opus"}));
}

/// `hive mcp`'s `recv` tool takes what fits in one answer and tells the model
/// that more is waiting; every message arrives once over the calls.
#[test]
fn the_mcp_recv_tool_says_when_more_messages_are_waiting() {
    let b = Broker::start(&["ana"]);
    for i in 0..20 {
        operator_send(&b, "ana", &format!("m{i:02} {}", "r".repeat(60_000)));
    }
    let socket = b.agent_socket("ana");
    let log = b.dir.path().join("mcp.log");
    let mut mcp = common::mcp::McpProc::start(&[("HIVE_SOCKET", socket.to_str().unwrap())], &log);
    mcp.initialize();
    let mut seen = Vec::new();
    for call in 1..=20 {
        let text = mcp.ok(call, "recv", json!({"max":32}));
        let ids: Vec<String> = text
            .lines()
            .filter(|l| l.starts_with('#'))
            .map(|l| l.split(' ').next().unwrap().to_string())
            .collect();
        assert!(ids.len() < 20, "one page, not everything");
        seen.extend(ids);
        if !text.ends_with("(more messages are waiting: call recv again)") {
            break;
        }
    }
    assert_eq!(seen.len(), 20, "{seen:?}");
    let db = rusqlite::Connection::open(b.state_dir().join("broker.db")).unwrap();
    wait_for(T, "every page to be confirmed", || {
        let acked: i64 = db
            .query_row(
                "SELECT COUNT(*) FROM messages WHERE recipient = 'ana' AND state = 'acked'",
                [],
                |r| r.get(0),
            )
            .ok()?;
        (acked == 20).then_some(())
    });
}
