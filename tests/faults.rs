//! Resource faults against real processes: the broker going away under a running
//! harness, a missing claude binary, a claude that floods its stdout, and the
//! broker's state dir on a full filesystem (a small tmpfs, mounted when the test
//! runs as root; otherwise the test says loudly that it skipped).

mod common;

use common::hive::*;
use common::smallfs::{fill, SmallFs};
use hyperhive::proto::cmd::{AckTurn, RecvNext, Send};
use hyperhive::proto::ClientError;
use std::time::Duration;

/// The harness's page (its port and token, from the state dir).
fn web_port(h: &Harness) -> common::web::Page {
    common::web::Page::of(&h.state_dir())
}

fn online(page: &common::web::Page) -> bool {
    let r = page.get("/api/state");
    r.json()["online"].as_bool().expect("online in /api/state")
}

#[test]
fn the_harness_reconnects_when_the_broker_socket_goes_away() {
    let mut b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[("HIVE_RECONNECT_MAX_MS", "400")]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let port = web_port(&h);
    assert!(online(&port));
    // SIGTERM removes the socket files; the harness is left with nothing to
    // connect to.
    b.terminate();
    assert!(!b.agent_socket("ana").exists());
    wait_for(Duration::from_secs(10), "online to turn false", || {
        (!online(&port)).then_some(())
    });
    wait_for(Duration::from_secs(10), "the backoff in the log", || {
        h.log().contains("retrying in").then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let log = h.log();
    let retries = log.matches("retrying in").count();
    assert!(
        (2..=20).contains(&retries),
        "{retries} reconnect attempts in 2 s is not a capped backoff:\n{log}"
    );
    b.restart();
    wait_for(Duration::from_secs(10), "online to turn true", || {
        online(&port).then_some(())
    });
    assert!(h.log().contains("reconnected to the broker"), "{}", h.log());
    operator_send(&b, "ana", "after the outage");
    wait_for(Duration::from_secs(20), "the turn after the outage", || {
        (1..=h.fake.count())
            .any(|n| h.fake.stdin(n).contains("after the outage"))
            .then_some(())
    });
    wait_drained(&b, "ana");
}

#[test]
fn a_missing_claude_binary_keeps_every_message_until_it_appears() {
    // Issue 12 changed this on purpose: the turn used to fail and its message
    // was acked (lost); now the message waits for the binary.
    let b = Broker::start(&["ana"]);
    let bin_dir = TempDir::new("bin");
    let bin = bin_dir.path().join("claude");
    let mut h = Harness::start(
        &b,
        "ana",
        &[
            ("HIVE_CLAUDE_BIN", bin.to_str().unwrap()),
            ("HIVE_START_BACKOFF_MAX_MS", "300"),
        ],
    );
    // The boot kick cannot run; the parent hears about it once.
    let notice = wait_for(Duration::from_secs(20), "a notice to the operator", || {
        operator_inbox(&b)
            .into_iter()
            .find(|m| m.from == "ana" && m.body.contains(bin.to_str().unwrap()))
    });
    assert!(notice.body.starts_with("[system]"), "{}", notice.body);
    assert!(notice.body.contains("is kept"), "{}", notice.body);
    operator_send(&b, "ana", "hello?");
    wait_for(Duration::from_secs(20), "several more attempts", || {
        h.log().contains("(5 in a row)").then_some(())
    });
    assert!(h.exited().is_none(), "hive serve exited: {}", h.log());
    let row = agent_row(&b, "ana");
    assert_eq!(
        row.unread + row.inflight.map_or(0, |_| 1),
        2,
        "the kick and the message are both kept: {row:?}"
    );
    assert_eq!((row.turns, row.turns_failed), (0, 0), "{row:?}");
    assert!(operator_inbox(&b).is_empty(), "one notice for the burst");
    let r = web_port(&h).get("/api/state");
    assert_eq!(r.status, 200);

    // The binary appears (whole, by a rename): both messages run, in order.
    let tmp = bin_dir.path().join("claude.tmp");
    std::fs::write(
        &tmp,
        format!("#!/bin/sh\nexec {} \"$@\"\n", FakeClaude::bin().display()),
    )
    .unwrap();
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::rename(&tmp, &bin).unwrap();
    wait_drained(&b, "ana");
    assert_eq!(h.fake.count(), 2, "{}", h.log());
    assert!(h.fake.stdin(2).contains("hello?"), "{}", h.fake.stdin(2));
    let row = agent_row(&b, "ana");
    assert_eq!((row.turns_ok, row.turns_failed), (2, 0), "{row:?}");
    assert!(h.log().contains("claude starts again"), "{}", h.log());
}

#[test]
fn a_claude_flooding_100_mb_of_stdout_stays_within_a_memory_bound() {
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    // 50 MB of ordinary assistant lines, then one 50 MB line without JSON.
    h.fake.step(
        2,
        r#"init
line=$(say "flood flood flood flood flood flood flood flood")
yes "$line" | head -c 50000000
head -c 50000000 /dev/zero | tr '\0' 'x'
printf '\n'
result_ok "survived"
exit 0"#,
    );
    let before = proc_kb(h.pid(), "VmRSS");
    operator_send(&b, "ana", "flood");
    h.fake.wait_count(2);
    wait_for(Duration::from_secs(120), "the flood turn to end", || {
        let r = agent_row(&b, "ana");
        (r.unread == 0 && r.inflight.is_none()).then_some(())
    });
    let hwm = proc_kb(h.pid(), "VmHWM");
    let rss = proc_kb(h.pid(), "VmRSS");
    eprintln!("flood: harness VmRSS before {before} kB, peak {hwm} kB, after {rss} kB");
    assert!(hwm < 128 * 1024, "peak RSS {hwm} kB over the 128 MiB bound");
    let row = agent_row(&b, "ana");
    assert_eq!(row.turns_ok, 2, "{row:?}\n{}", h.log());
}

#[test]
fn a_full_state_filesystem_gives_clear_errors_and_recovers() {
    let Some(fs) = SmallFs::mount("4m") else {
        eprintln!(
            "SKIPPED a_full_state_filesystem_gives_clear_errors_and_recovers: cannot mount a \
             tmpfs (needs root); see docs/reliability.md for the manual method"
        );
        return;
    };
    let state = fs.0.join("state");
    let b = Broker::start_in(&["ana"], &state);
    let mut host = b.host();
    let mut accepted = Vec::new();
    for i in 0..20 {
        let body = format!("before-{i}");
        ok(
            &mut host,
            Send {
                to: "ana".into(),
                body: body.clone(),
                in_reply_to: None,
                receipt: false,
                traceparent: None,
            },
        );
        accepted.push(body);
    }
    fill(&fs.0.join("filler"));
    // Keep sending bodies big enough to need new pages until one is refused.
    let mut refusal = None;
    for i in 0..400 {
        let body = format!("full-{i}-{}", "y".repeat(8000));
        match host.call(&Send {
            to: "ana".into(),
            body: body.clone(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        }) {
            Ok(_) => accepted.push(body),
            Err(ClientError::Refused(e)) => {
                refusal = Some(e);
                break;
            }
            Err(e) => panic!("the broker did not answer on a full disk: {e}\n{}", b.log()),
        }
    }
    let e = refusal.expect("no send was refused on a full filesystem");
    eprintln!("full filesystem: send refused with: {e}");
    assert!(
        e.contains("full") || e.contains("disk") || e.contains("space"),
        "the error does not say the disk is full: {e}"
    );
    // Space returns: sends work again, nothing accepted was lost or damaged.
    // A clean-clone CI run once saw the first send after the removal refused
    // as the full disk's was (not reproduced since): a refused send stored
    // nothing, so it is sent again until accepted, within a bound, and the
    // refusals are printed.
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    let mut host = b.host();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut refused_after = Vec::new();
    loop {
        match host.call(&Send {
            to: "ana".into(),
            body: "after".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        }) {
            Ok(_) => break,
            Err(ClientError::Refused(e)) if std::time::Instant::now() < deadline => {
                refused_after.push(e);
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => panic!(
                "no send accepted after space returned: {e} (refused before: {refused_after:?})\n{}",
                b.log()
            ),
        }
    }
    if !refused_after.is_empty() {
        eprintln!(
            "space returned: {} send(s) refused before one was accepted: {refused_after:?}\n{}",
            refused_after.len(),
            b.log()
        );
    }
    accepted.push("after".into());
    let mut ana = b.agent("ana");
    let mut got = Vec::new();
    while got.len() < accepted.len() {
        let r: hyperhive::proto::cmd::RecvNextReply = ana
            .call(&RecvNext {
                wait_seconds: Some(2),
                seen: None,
            })
            .unwrap();
        let Some(m) = r.message else { break };
        ok(
            &mut ana,
            AckTurn {
                id: m.id,
                turn: None,
            },
        );
        got.push(m.body);
    }
    assert_eq!(got, accepted);
    let db = std::fs::read_dir(&state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "db"))
        .expect("the broker's sqlite file");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}
