//! Retention and quotas (issue 40, item 4) against real `hive broker`, `hive
//! serve` and `hive bash-daemon` processes on temp dirs: pruning removes old
//! acked messages and spend rows and keeps every failed, unhandled, held,
//! inflight or referenced row and every row of a current budget window
//! (old rows are written into the store before the broker starts, as the
//! code base has no clock to set); the quota stops a self-waking agent while
//! the operator's mail still goes; the limit of a minute refuses one sender;
//! a bash task's completion wake refused over the quota waits in its daemon
//! until pruning makes room; `hive agents --json` shows what each agent
//! stored. Every wait has a timeout.

mod common;

use common::hive::*;
use hyperhive::proto::cmd::{AckTurn, Recv, RecvNext, RecvNextReply, Send, SendToParent, Wake};
use hyperhive::proto::{Client, MsgKind};
use rusqlite::{params, Connection};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const T: Duration = Duration::from_secs(60);
const DAY: i64 = 86_400;

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// The start of the UTC month that holds `t`, unix seconds (the budget
/// windows' own reckoning).
fn month_start(t: i64) -> i64 {
    hyperhive::broker::hub::budget_window(&hyperhive::proto::fleet::Per::Month, t).0
}

/// A message row written into a stopped broker's store: id, sender,
/// recipient, body, state, when it was handled, the agent it is charged to.
type Row = (
    i64,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Option<i64>,
    Option<&'static str>,
);

fn store(b: &Broker) -> Connection {
    Connection::open(b.state_dir().join("broker.db")).unwrap()
}

/// `hive agents --json` on the broker's host socket: each agent's stored
/// bytes.
fn stored_bytes(b: &Broker, name: &str) -> u64 {
    let sock = b.host_socket().display().to_string();
    let (code, out, err) = run_hive(&["agents", "--json", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "hive agents --json: {out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let row = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {out}"));
    row["stored_bytes"].as_u64().expect("stored_bytes")
}

/// How many prune passes the broker's log says are done.
fn passes(b: &Broker) -> usize {
    b.log()
        .lines()
        .filter(|l| l.contains("prune pass") && l.ends_with("done"))
        .count()
}

/// Waits until a prune pass started after this call is done.
fn wait_for_a_whole_pass(b: &Broker) {
    let done = passes(b);
    wait_for(T, "a whole prune pass", || {
        (passes(b) >= done + 2).then_some(())
    });
}

/// The quota notices in the operator's inbox (read and marked read).
fn quota_notices(b: &Broker) -> Vec<String> {
    operator_inbox(b)
        .into_iter()
        .filter(|m| m.kind == MsgKind::Quota)
        .map(|m| m.body)
        .collect()
}

fn wake(from: &str, body: &str) -> Wake {
    Wake {
        from: from.into(),
        body: body.into(),
        transient: false,
        to: None,
        traceparent: None,
    }
}

/// The largest body a message may have: 64 KiB.
fn big_body() -> String {
    "x".repeat(hyperhive::proto::limits::MAX_BODY)
}

#[test]
fn pruning_keeps_unhandled_failed_held_referenced_and_current_rows_and_removes_old_acked_ones() {
    let config = r#"{"agents":[{"name":"ana"},{"name":"bob"}],"retention":{"spend_days":1}}"#;
    let process = Process {
        env: vec![("HIVE_PRUNE_SECS".into(), "1".into())],
        ..Process::default()
    };
    let mut b = Broker::start_process(&[], Some(config), process);
    assert_eq!(b.terminate().code(), Some(0));

    // The store before the broker starts again, with rows as old as a test
    // needs: (id, sender, recipient, body, state, handled at, charged).
    let t = now();
    let old = t - 40 * DAY;
    let rows: [Row; 9] = [
        (
            1,
            "cron",
            "ana",
            "old and acked: pruned",
            "acked",
            Some(old),
            Some("ana"),
        ),
        (
            2,
            "cron",
            "ana",
            "acked yesterday: kept",
            "acked",
            Some(t - DAY),
            Some("ana"),
        ),
        (
            3,
            "cron",
            "ana",
            "old and failed: kept",
            "failed",
            Some(old),
            Some("ana"),
        ),
        (
            4,
            "operator",
            "ana",
            "old and unhandled: kept",
            "queued",
            None,
            None,
        ),
        (
            5,
            "ana",
            "b@two",
            "for the bridge: kept",
            "acked",
            Some(old),
            Some("ana"),
        ),
        (
            6,
            "ana",
            "b@two",
            "an open question's: kept",
            "acked",
            Some(old),
            None,
        ),
        (
            7,
            "ana",
            "b@two",
            "an answered question's: pruned",
            "acked",
            Some(old),
            None,
        ),
        (
            8,
            "operator",
            "bob",
            "inflight soon: kept",
            "queued",
            None,
            None,
        ),
        (
            9,
            "operator",
            "bob",
            "held soon: kept",
            "queued",
            None,
            None,
        ),
    ];
    let db = store(&b);
    for (id, from, to, body, state, done, charged) in rows {
        db.execute(
            "INSERT INTO messages (id, sender, recipient, body, kind, state, sent_at, done_at,
                 seq, charged)
             VALUES (?1, ?2, ?3, ?4, 'message', ?5, ?6, ?7, ?1, ?8)",
            params![id, from, to, body, state, old - 60, done, charged],
        )
        .unwrap();
    }
    db.execute_batch(&format!(
        "INSERT INTO questions (id, asker, target, question, asked_at) VALUES
             (1, 'ana', 'b@two', 'still open?', {old});
         INSERT INTO questions (id, asker, target, question, asked_at, answer, answered_by,
             answered_at) VALUES (2, 'ana', 'b@two', 'answered?', {old}, 'yes', 'b@two', {old});
         INSERT INTO outbox (msg_id, dest, kind, question, state, created_at) VALUES
             (5, 'two', 'message', NULL, 'pending', {old}),
             (6, 'two', 'question_asked', 1, 'sent', {old}),
             (7, 'two', 'question_asked', 2, 'sent', {old});
         INSERT INTO spend (key, agent, at, usd, tokens, cache_read) VALUES
             ('old', 'ana', {}, 1.0, 10, 0),
             ('this-month', 'ana', {}, 1.0, 10, 0),
             ('an-hour-ago', 'ana', {}, 1.0, 10, 0);
         INSERT INTO budget_notices (scope, window_start, level) VALUES
             ('ana', {}, 100), ('ana', {}, 80);",
        t - 100 * DAY,
        month_start(t),
        t - 3600,
        t - 100 * DAY,
        month_start(t),
    ))
    .unwrap();
    // The triggers count ana's charged bodies.
    let charged = |ids: &[usize]| -> u64 { ids.iter().map(|&i| rows[i - 1].3.len() as u64).sum() };
    let sum: i64 = db
        .query_row(
            "SELECT bytes FROM stored_bytes WHERE agent = 'ana'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(sum as u64, charged(&[1, 2, 3, 5]));
    drop(db);

    // The first start may have logged a pass of its own (the log is
    // appended to): wait for one of the restarted broker's.
    let before = passes(&b);
    b.restart();
    wait_for(T, "the first prune pass", || {
        (passes(&b) > before).then_some(())
    });
    // It runs on a thread of its own, not the hub's.
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", b.pid()))
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect();
    assert!(threads.iter().any(|c| c == "prune"), "{threads:?}");

    // A column of every row, as text.
    let ids = |c: &Connection, sql: &str| -> BTreeSet<String> {
        let mut stmt = c.prepare(sql).unwrap();
        let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    };
    let db = store(&b);
    let messages = ids(&db, "SELECT CAST(id AS TEXT) FROM messages");
    assert_eq!(
        messages,
        ["2", "3", "4", "5", "6", "8", "9"].map(String::from).into(),
        "the old acked rows that nothing refers to are gone, the rest stay"
    );
    assert_eq!(
        ids(&db, "SELECT CAST(msg_id AS TEXT) FROM outbox"),
        ["5", "6"].map(String::from).into(),
        "a pruned message's settled outbox row goes with it"
    );
    assert_eq!(
        ids(&db, "SELECT key FROM spend"),
        ["an-hour-ago", "this-month"].map(String::from).into(),
        "spend rows go only when older than spend_days and every current window"
    );
    assert_eq!(
        ids(&db, "SELECT CAST(level AS TEXT) FROM budget_notices"),
        ["80"].map(String::from).into()
    );
    assert!(b.log().contains("pruned 2 acked messages"), "{}", b.log());
    assert_eq!(stored_bytes(&b, "ana"), charged(&[2, 3, 5]));

    // Old rows of bob's handed out as inflight and held survive the passes
    // that run meanwhile.
    let r: RecvNextReply = b
        .agent("bob")
        .call(&RecvNext {
            wait_seconds: None,
            seen: None,
        })
        .unwrap();
    assert_eq!(r.message.unwrap().id, 8);
    let mut holder = b.agent("bob");
    let held = ok(
        &mut holder,
        Recv {
            max: Some(1),
            wait_seconds: None,
        },
    );
    assert_eq!(held["messages"][0]["id"], 9, "{held:?}");
    wait_for_a_whole_pass(&b);
    let state = |id: i64| -> String {
        db.query_row("SELECT state FROM messages WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .unwrap()
    };
    assert_eq!((state(8), state(9)), ("inflight".into(), "held".into()));
    assert_eq!(
        ids(&db, "SELECT CAST(id AS TEXT) FROM messages"),
        messages,
        "nothing else went"
    );
}

#[test]
fn the_quota_stops_a_self_waking_agent_and_the_operators_mail_still_goes() {
    let config = r#"{"agents":[{"name":"ana"}],"retention":{"agent_quota_mib":1}}"#;
    let b = Broker::start_config(config);
    let bin = hive_bin().display().to_string();
    let h = Harness::start(&b, "ana", &[("SELF_WAKE_HIVE", &bin)]);
    // Every turn wakes the agent again with 64 KiB from a script on its
    // socket, as `hive wake` in a bash tool would; a refusal is kept.
    h.fake.default_step(&format!(
        r#"
body="$dir/body"
[ -f "$body" ] || head -c {} /dev/zero | tr '\0' x > "$body"
if ! "$SELF_WAKE_HIVE" wake --from loop --body - < "$body" 2>> "$dir/refused"; then
    echo "--- refused" >> "$dir/refused"
fi
ok_turn woke
"#,
        hyperhive::proto::limits::MAX_BODY
    ));
    let refused = h.fake.dir.join("refused");
    let refusals = || {
        std::fs::read_to_string(&refused)
            .unwrap_or_default()
            .matches("--- refused")
            .count()
    };
    wait_for(T, "a refused wake", || (refusals() >= 1).then_some(()));
    let text = std::fs::read_to_string(&refused).unwrap();
    assert!(
        text.contains("over quota: ana has 1.0 MiB (1048576 bytes) stored and this 65536-byte message would pass its quota of 1 MiB (retention.agent_quota_mib)"),
        "{text}"
    );
    let woke: i64 = store(&b)
        .query_row(
            "SELECT COUNT(*) FROM messages WHERE sender = 'loop'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(woke, 16, "16 wakes of 64 KiB fill 1 MiB");
    assert_eq!(stored_bytes(&b, "ana"), 1 << 20);

    // The operator's mail still reaches the agent (whose turn tries to wake
    // it again, refused again).
    operator_send(&b, "ana", "the operator gets through");
    wait_for(T, "the operator's message in a turn", || {
        (1..=h.fake.count())
            .any(|n| h.fake.stdin(n).contains("the operator gets through"))
            .then_some(())
    });
    wait_for(T, "a second refusal", || (refusals() >= 2).then_some(()));
    wait_drained(&b, "ana");
    let told = quota_notices(&b);
    assert_eq!(told.len(), 1, "the operator is told once: {told:?}");
    assert!(
        told[0].contains(
            "ana is over its storage quota: 1.0 MiB (1048576 bytes) stored, its quota is 1 MiB"
        ),
        "{told:?}"
    );
    assert_eq!(
        stored_bytes(&b, "ana"),
        1 << 20,
        "the operator's mail is not ana's"
    );
}

#[test]
fn the_limit_of_a_minute_refuses_one_sender_and_not_the_operator_or_another() {
    let config = r#"{"agents":[{"name":"ana"},{"name":"bob"}],
        "retention":{"agent_mib_per_minute":1}}"#;
    let b = Broker::start_config(config);
    let body = big_body();
    let mut ana = b.agent("ana");
    for _ in 0..16 {
        ok(&mut ana, wake("cron", &body));
    }
    let e = refused(&mut ana, wake("cron", &body));
    assert_eq!(
        e,
        "over quota: ana stored 1.0 MiB (1048576 bytes) in the last minute and this 65536-byte \
         message would pass its limit of 1 MiB a minute (retention.agent_mib_per_minute); try \
         again in a minute"
    );
    // Whatever ana sends is hers: a send to bob, a send_to_parent from a
    // script (not its harness).
    let e = refused(
        &mut ana,
        Send {
            to: "bob".into(),
            body: "hi".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    assert!(e.starts_with("over quota: ana stored"), "{e}");
    let e = refused(&mut ana, SendToParent { body: "hi".into() });
    assert!(e.starts_with("over quota: ana stored"), "{e}");
    // Another sender, and the operator, are not held.
    ok(&mut b.agent("bob"), wake("cron", "bob's"));
    operator_send(&b, "ana", "from the operator");
    ok(
        &mut b.host(),
        Wake {
            to: Some("ana".into()),
            ..wake("ops", "the operator's wake")
        },
    );
    assert_eq!(stored_bytes(&b, "ana"), 1 << 20);
    assert_eq!(stored_bytes(&b, "bob"), "bob's".len() as u64);
    let told = quota_notices(&b);
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].contains("ana passed its limit of 1 MiB a minute"),
        "{told:?}"
    );
}

/// One request line to the bash daemon's socket; its answer.
fn bash_call(socket: &Path, line: &str) -> Value {
    let s = UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    let mut r = BufReader::new(s);
    r.get_mut()
        .write_all(format!("{line}\n").as_bytes())
        .unwrap();
    let mut answer = String::new();
    r.read_line(&mut answer).unwrap();
    serde_json::from_str(&answer).unwrap()
}

/// Hands out ana's next message as a harness would and acks it.
fn take_next(ana: &mut Client) -> Option<hyperhive::proto::Message> {
    let r: RecvNextReply = ana
        .call(&RecvNext {
            wait_seconds: Some(2),
            seen: None,
        })
        .unwrap();
    let m = r.message?;
    ana.call(&AckTurn {
        id: m.id,
        turn: None,
    })
    .unwrap();
    Some(m)
}

#[test]
fn a_bash_wake_refused_over_the_quota_waits_in_the_daemon_until_pruning_makes_room() {
    let config = r#"{"agents":[{"name":"ana"}],
        "retention":{"agent_quota_mib":1,"messages_days":0}}"#;
    let process = Process {
        env: vec![("HIVE_PRUNE_SECS".into(), "1".into())],
        ..Process::default()
    };
    let b = Broker::start_process(&[], Some(config), process);
    let body = big_body();
    let mut ana = b.agent("ana");
    for _ in 0..16 {
        ok(&mut ana, wake("fill", &body));
    }

    let dir = TempDir::new("bd");
    let socket = dir.path().join("bash.sock");
    let log = dir.path().join("daemon.log");
    let mut daemon = std::process::Command::new(hive_bin())
        .arg("bash-daemon")
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--socket")
        .arg(&socket)
        .arg("--agent-socket")
        .arg(b.agent_socket("ana"))
        .arg("--bash-env")
        .arg(dir.path().join("no-bash-env.sh"))
        .env("RUST_LOG", "debug")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for(T, "the bash daemon's socket", || {
        UnixStream::connect(&socket).ok()
    });
    let r = bash_call(
        &socket,
        r#"{"op":"run","cmd":"echo the-task-is-done","wait_seconds":0}"#,
    );
    assert_eq!(r["ok"], true, "{r}");
    let daemon_log = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_for(T, "the daemon to keep a refused wake", || {
        daemon_log()
            .contains("waits: over quota: ana has 1.0 MiB")
            .then_some(())
    });
    let told = quota_notices(&b);
    assert_eq!(told.len(), 1, "{told:?}");

    // ana works through her mail; pruning frees what she handled, and the
    // kept wake gets in.
    let mut fills = 0;
    let task = wait_for(Duration::from_secs(120), "the bash task's wake", || {
        let m = take_next(&mut ana)?;
        if m.from.as_str() == "fill" {
            fills += 1;
            return None;
        }
        Some(m)
    });
    assert!(task.from.as_str().starts_with("bash-task-"), "{task:?}");
    assert!(task.body.contains("the-task-is-done"), "{}", task.body);
    assert_eq!(fills, 16);
    let warned = daemon_log()
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains("waits: over quota"))
        .count();
    assert_eq!(warned, 1, "logged once while it waits: {}", daemon_log());
    assert!(quota_notices(&b).is_empty(), "the operator was told once");
    let _ = daemon.kill();
    let _ = daemon.wait();
}
