//! The hub's rules in memory: a real hub on its own thread and a temp sqlite
//! store, driven the way its socket loop drives it (a parsed request line in,
//! the answer line out, offloaded work run on the caller's side and its
//! report applied by the hub, a parked
//! call signalled when the hub wakes it), with literal JSON on both ends.
//! Times in answers are shown as `T`. The sockets themselves are the
//! integration tests' (`tests/broker*.rs`).

use super::*;
use crate::broker::db::{Db, Durability, Store};
use crate::proto::lines::err_line;
use crossbeam_channel::{after, bounded, never, select, unbounded, Receiver};
use std::collections::HashMap;
use std::path::PathBuf;

/// What a test asks of the hub's thread.
enum Drive {
    Call {
        who: Identity,
        conn: ConnId,
        req: Box<Request>,
        can_wait: bool,
        /// Signalled when the hub wakes the parked call.
        waiter: Sender<()>,
        reply: Sender<Outcome>,
    },
    Closed(ConnId),
    /// An offloaded job's report, for the hub to apply as its loop does.
    Finish {
        finish: Box<Finish>,
        reply: Sender<String>,
    },
}

/// The hub's thread in the tests: calls and the other threads' messages in,
/// the timers fired, woken calls signalled.
fn drive(mut hub: Hub, rx: HubRx, calls: Receiver<Drive>) {
    hub.begin();
    let mut waiters: HashMap<ConnId, Sender<()>> = HashMap::new();
    loop {
        let timer = hub.next_deadline().map_or_else(never, after);
        select! {
            recv(calls) -> c => match c {
                Ok(Drive::Call { who, conn, req, can_wait, waiter, reply }) => {
                    let out = hub.handle(&who, conn, *req, can_wait);
                    if matches!(out, Outcome::Wait) {
                        waiters.insert(conn, waiter);
                    }
                    let _ = reply.send(out);
                }
                Ok(Drive::Closed(conn)) => hub.closed(conn),
                Ok(Drive::Finish { finish, reply }) => {
                    let _ = reply.send(hub.finish(*finish));
                }
                Err(_) => return,
            },
            recv(rx.rx) -> m => match m {
                Ok(m) => {
                    if !hub.on_msg(m) {
                        return;
                    }
                }
                Err(_) => return,
            },
            recv(timer) -> _ => {}
        }
        hub.tick();
        for conn in hub.take_woken() {
            if let Some(w) = waiters.remove(&conn) {
                let _ = w.try_send(());
            }
        }
    }
}

/// A hub on its own thread.
struct Mem {
    tx: HubTx,
    calls: Sender<Drive>,
    thread: Option<std::thread::JoinHandle<()>>,
    dir: PathBuf,
    conn: ConnId,
}

impl Drop for Mem {
    fn drop(&mut self) {
        let _ = self.tx.send(HubMsg::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn temp_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "hive-hub-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Mem {
    fn new(config: &str) -> Mem {
        Mem::with(config, None, Duration::from_secs(10))
    }

    /// The hive of `HIVE` with ana and bob in one pool: both reported the
    /// account `u1`.
    fn pool_of_two() -> Mem {
        let m = Mem::new(HIVE);
        let uuid = r#"{"cmd":"report_pool","account_uuid":"u1"}"#;
        m.call_on("ana", 1, uuid, false);
        m.call_on("bob", 2, uuid, false);
        m
    }

    fn with(config: &str, lifecycle: Option<Sender<LifecycleCmd>>, timeout: Duration) -> Mem {
        let dir = temp_dir();
        let db = Db::open(&dir.join("broker.db"), Durability::Normal).unwrap();
        let cfg = HiveConfig::parse(config).unwrap();
        let settings = HubSettings {
            lifecycle,
            supervisor_timeout: timeout,
            ..HubSettings::for_tests(&dir)
        };
        let (tx, rx) = channel().unwrap();
        let (calls, calls_rx) = unbounded();
        let thread = std::thread::spawn(move || {
            let hub = Hub::new(Store::new(&db).unwrap(), cfg, settings);
            drive(hub, rx, calls_rx)
        });
        Mem {
            tx,
            calls,
            thread: Some(thread),
            dir,
            conn: 0,
        }
    }

    /// One request on a connection of its own; `WAIT` when the hub parked it.
    fn call(&mut self, who: &str, line: &str) -> String {
        self.conn += 1;
        let conn = self.conn;
        self.call_on(who, conn, line, false).0
    }

    /// One request on connection `conn`; with `can_wait`, also the waiter the
    /// hub signals when something arrives.
    fn call_on(
        &self,
        who: &str,
        conn: ConnId,
        line: &str,
        can_wait: bool,
    ) -> (String, Receiver<()>) {
        let who = match who {
            "operator" => Identity::Operator,
            a => Identity::Agent(a.into()),
        };
        let (waiter, woken) = bounded(1);
        let req = match Request::parse(line) {
            Ok(r) => r,
            Err(e) => return (err_line(&e), woken),
        };
        let (reply, answer) = bounded(1);
        self.calls
            .send(Drive::Call {
                who,
                conn,
                req: Box::new(req),
                can_wait,
                waiter,
                reply,
            })
            .unwrap();
        let line = match answer.recv_timeout(Duration::from_secs(20)).unwrap() {
            Outcome::Answer(line) => line,
            Outcome::Wait => "WAIT".into(),
            Outcome::Offload(job) => {
                let (reply, line) = bounded(1);
                self.calls
                    .send(Drive::Finish {
                        finish: Box::new(job()),
                        reply,
                    })
                    .unwrap();
                line.recv_timeout(Duration::from_secs(20)).unwrap()
            }
        };
        (scrub(&sorted(&line)), woken)
    }
}

/// An `ok:true` answer with its fields in name order after `ok` (the order
/// the expected lines below are written in; the wire keeps the declared order).
fn sorted(line: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(line) {
        Ok(serde_json::Value::Object(mut map)) if map.get("ok") == Some(&true.into()) => {
            map.remove("ok");
            if map.is_empty() {
                return r#"{"ok":true}"#.into();
            }
            let rest = serde_json::Value::Object(map).to_string();
            format!(r#"{{"ok":true,{}"#, &rest[1..])
        }
        _ => line.to_string(),
    }
}

/// The answer with every time replaced by `T`.
fn scrub(line: &str) -> String {
    let mut out = line.to_string();
    for key in [
        "sent_at",
        "asked_at",
        "created_at",
        "status_set_at",
        "fire_at",
        "expires_at",
        "failed_at",
    ] {
        let pat = format!("\"{key}\":");
        let mut from = 0;
        while let Some(i) = out[from..].find(&pat) {
            let start = from + i + pat.len();
            let end = out[start..]
                .find(|c: char| !c.is_ascii_digit())
                .map_or(out.len(), |n| start + n);
            if end > start {
                out.replace_range(start..end, "T");
            }
            from = start;
        }
    }
    out
}

const HIVE: &str = r#"{"agents":[
    {"name":"ana"},
    {"name":"bob","tool_groups":["messaging"]},
    {"name":"boss","tool_groups":["messaging","lifecycle","inbox"]},
    {"name":"kid","parent":"boss"}]}"#;

#[test]
fn a_message_goes_in_comes_out_inflight_and_is_acked() {
    let mut m = Mem::new(HIVE);
    assert_eq!(
        m.call("operator", r#"{"cmd":"send","to":"ana","body":"hi"}"#),
        r#"{"ok":true,"id":1,"to":"ana"}"#
    );
    assert_eq!(
        m.call("ana", r#"{"cmd":"recv_next"}"#),
        r#"{"ok":true,"attempts":1,"message":{"body":"hi","from":"operator","id":1,"in_reply_to":null,"kind":"message","sent_at":T,"to":"ana","transient":false},"redelivered":false,"unread":0}"#
    );
    assert_eq!(
        m.call("ana", r#"{"cmd":"status"}"#),
        r#"{"ok":true,"inflight":1,"unread":0}"#
    );
    assert_eq!(
        m.call("ana", r#"{"cmd":"ack_turn","id":2}"#),
        r#"{"ok":false,"error":"ack_turn: 2 is not the inflight message of ana (that is 1)"}"#
    );
    assert_eq!(
        m.call("ana", r#"{"cmd":"ack_turn","id":1}"#),
        r#"{"ok":true}"#
    );
    assert_eq!(
        m.call("ana", r#"{"cmd":"recv_next"}"#),
        r#"{"ok":true,"message":null,"redelivered":false}"#
    );
    assert_eq!(
        m.call("ana", r#"{"cmd":"send","to":"<parent>","body":"done"}"#),
        r#"{"ok":true,"id":2,"to":"operator"}"#
    );
}

#[test]
fn one_gate_for_every_command_then_the_commands_own_rules() {
    let mut m = Mem::new(HIVE);
    let cases = [
        (
            "operator",
            r#"{"cmd":"recv_next"}"#,
            r#"{"ok":false,"error":"recv_next is an agent command; the host socket speaks for the operator"}"#,
        ),
        (
            "ana",
            r#"{"cmd":"agents"}"#,
            r#"{"ok":false,"error":"agents is an operator command; this is the socket of agent ana"}"#,
        ),
        (
            "bob",
            r#"{"cmd":"remind","message":"x","delay_seconds":5}"#,
            r#"{"ok":false,"error":"remind needs the inbox tool group, which bob is not granted; the operator grants it in the fleet file"}"#,
        ),
        (
            "bob",
            r#"{"cmd":"kill","name":"kid"}"#,
            r#"{"ok":false,"error":"kill needs the lifecycle tool group, which bob is not granted; the operator grants it in the fleet file"}"#,
        ),
        (
            "operator",
            r#"{"cmd":"send","to":"ana","body":"  "}"#,
            r#"{"ok":false,"error":"send: body must not be empty"}"#,
        ),
        (
            "ana",
            r#"{"cmd":"remind","message":"x","delay_seconds":5,"at_unix_timestamp":9}"#,
            r#"{"ok":false,"error":"remind: give exactly one of delay_seconds or at_unix_timestamp"}"#,
        ),
        (
            "ana",
            r#"{"cmd":"wake","from":"operator","body":"x"}"#,
            r#"{"ok":false,"error":"wake: from \"operator\" is reserved for the broker's own messages; choose another name (the operator sends with `hive send`)"}"#,
        ),
        (
            "ana",
            r#"{"cmd":"set_status","text":"a\nb"}"#,
            r#"{"ok":false,"error":"set_status: text must be one line of at most 200 characters, got 3 characters"}"#,
        ),
        (
            "bob",
            r#"{"cmd":"send","to":"bob","body":"me"}"#,
            r#"{"ok":false,"error":"an agent cannot send to itself; use remind or request_next_turn"}"#,
        ),
        (
            "operator",
            r#"{"cmd":"send","to":"zed","body":"x"}"#,
            r#"{"ok":false,"error":"unknown agent \"zed\"; the agents are ana, bob, boss, kid"}"#,
        ),
    ];
    for (who, line, want) in cases {
        assert_eq!(m.call(who, line), want, "{who}: {line}");
    }
}

#[test]
fn a_parked_recv_next_returns_early_with_the_new_status() {
    let m = Mem::new(HIVE);
    let seen = r#"{"cmd":"recv_next","wait_seconds":30,"seen":{"unread":0,"status_text":""}}"#;
    let (answer, woken) = m.call_on("ana", 1, seen, true);
    assert_eq!(answer, "WAIT");
    let (set, _) = m.call_on(
        "ana",
        2,
        r#"{"cmd":"set_status","text":"reviewing"}"#,
        false,
    );
    assert_eq!(set, r#"{"ok":true}"#);
    woken
        .recv_timeout(Duration::from_secs(10))
        .expect("the parked call is woken by the status change");
    let (answer, _) = m.call_on("ana", 1, seen, true);
    assert_eq!(
        answer,
        r#"{"ok":true,"message":null,"redelivered":false,"status_set_at":T,"status_text":"reviewing","unread":0}"#
    );
    // What it has seen now: it parks again, and mail still wakes it.
    let again =
        r#"{"cmd":"recv_next","wait_seconds":30,"seen":{"unread":0,"status_text":"reviewing"}}"#;
    let (answer, woken) = m.call_on("ana", 1, again, true);
    assert_eq!(answer, "WAIT");
    m.call_on(
        "operator",
        3,
        r#"{"cmd":"send","to":"ana","body":"x"}"#,
        false,
    );
    woken.recv_timeout(Duration::from_secs(10)).unwrap();
    let (answer, _) = m.call_on("ana", 1, again, true);
    assert!(
        answer.contains(r#""body":"x""#) && answer.contains(r#""unread":0"#),
        "{answer}"
    );
}

#[test]
fn the_hub_answers_others_while_the_supervisor_does_not() {
    let (sup_tx, sup_rx) = unbounded::<LifecycleCmd>();
    let m = Mem::with(HIVE, Some(sup_tx), Duration::from_millis(300));
    let m = std::sync::Arc::new(m);
    let kill = {
        let m = m.clone();
        std::thread::spawn(move || {
            m.call_on("boss", 1, r#"{"cmd":"kill","name":"kid"}"#, false)
                .0
        })
    };
    // The supervisor got the command and sits on it; the hub serves others.
    let cmd = sup_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(matches!(&cmd, LifecycleCmd::Kill { name, .. } if name == "kid"));
    let (hello, _) = m.call_on("ana", 2, r#"{"cmd":"hello"}"#, false);
    assert_eq!(
        hello,
        r#"{"ok":true,"hyperhive_rev":"test-rev","identity":"ana","version":1}"#
    );
    assert_eq!(
        kill.join().unwrap(),
        r#"{"ok":false,"error":"the supervisor did not answer in 300 ms"}"#
    );
    drop(cmd);
    let (not_child, _) = m.call_on("boss", 3, r#"{"cmd":"kill","name":"ana"}"#, false);
    assert_eq!(
        not_child,
        r#"{"ok":false,"error":"kill: ana is not a child of boss; lifecycle tools act on your own children only"}"#
    );
}

#[test]
fn an_approval_is_decided_once_after_the_supervisor_answered() {
    let (sup_tx, sup_rx) = unbounded::<LifecycleCmd>();
    let mut m = Mem::with(
        r#"{"agents":[{"name":"boss","tool_groups":["lifecycle"]}]}"#,
        Some(sup_tx),
        Duration::from_secs(10),
    );
    assert_eq!(
        m.call("boss", r#"{"cmd":"request_spawn","name":"kid2"}"#),
        r#"{"ok":true,"id":1,"text":"approval #1 queued: the operator decides; you get a message either way"}"#
    );
    let m = std::sync::Arc::new(m);
    let approve = {
        let m = m.clone();
        std::thread::spawn(move || {
            m.call_on("operator", 10, r#"{"cmd":"approve","id":1}"#, false)
                .0
        })
    };
    let LifecycleCmd::Apply { change, reply } =
        sup_rx.recv_timeout(Duration::from_secs(10)).unwrap()
    else {
        panic!("the supervisor is asked to apply the new entry");
    };
    assert_eq!(
        (change.agent.as_str(), change.new, &change.patch["parent"]),
        ("kid2", true, &serde_json::json!("boss"))
    );
    let (twice, _) = m.call_on("operator", 11, r#"{"cmd":"approve","id":1}"#, false);
    assert_eq!(
        twice,
        r#"{"ok":false,"error":"approval #1 is being carried out; its answer comes in a moment"}"#
    );
    reply.send(Ok("kid2 started".into())).unwrap();
    assert_eq!(
        approve.join().unwrap(),
        r#"{"ok":true,"text":"kid2 spawned and running"}"#
    );
    let (after, _) = m.call_on("operator", 12, r#"{"cmd":"approvals"}"#, false);
    assert_eq!(after, r#"{"ok":true,"approvals":[]}"#);
    let (meta, _) = m.call_on(
        "operator",
        13,
        r#"{"cmd":"get_agent_meta","name":"kid2"}"#,
        false,
    );
    assert!(meta.contains(r#""name":"kid2""#), "{meta}");
}

#[test]
fn timers_questions_and_tasks_are_loose_ends() {
    let mut m = Mem::new(HIVE);
    assert_eq!(
        m.call(
            "boss",
            r#"{"cmd":"remind","message":"check","delay_seconds":600}"#
        ),
        r#"{"ok":true,"fire_at":T,"id":1}"#
    );
    assert_eq!(
        m.call(
            "boss",
            r#"{"cmd":"ask","question":"ship?","options":["yes","no"],"to":"ana"}"#
        ),
        r#"{"ok":true,"id":1}"#
    );
    assert_eq!(
        m.call(
            "ana",
            r#"{"cmd":"report_tasks","tasks":[{"id":"7","cmd":"make","started_at":5,"timeout_secs":null}]}"#
        ),
        r#"{"ok":true}"#
    );
    assert_eq!(
        m.call("boss", r#"{"cmd":"get_loose_ends"}"#),
        r#"{"ok":true,"agent":"boss","approvals":[],"asked":[{"asked_at":T,"asker":"boss","expires_at":null,"id":1,"multi":false,"options":["yes","no"],"question":"ship?","target":"ana"}],"owed":[],"reminders":[{"agent":"boss","bytes":5,"fire_at":T,"id":1,"preview":"check"}],"scheduled":[],"tasks":[]}"#
    );
    let question = m.call("ana", r#"{"cmd":"recv_next"}"#);
    assert!(
        question.contains(r#""body":"[question #1 from boss] ship?\noptions (choose one): yes | no\nAnswer with mcp__hyperhive__answer(id=1, answer=...).","from":"system""#)
            && question.contains(r#""kind":"question_asked""#),
        "{question}"
    );
    assert_eq!(
        m.call("ana", r#"{"cmd":"answer","id":1,"answer":"yes"}"#),
        r#"{"ok":true}"#
    );
    let answered = m.call("boss", r#"{"cmd":"recv_next"}"#);
    assert!(
        answered.contains(r#""body":"[answer to question #1] \"ship?\" — ana answered: yes""#)
            && answered.contains(r#""kind":"question_answered""#),
        "{answered}"
    );
    assert_eq!(
        m.call(
            "boss",
            r#"{"cmd":"cancel_loose_end","kind":"reminder","id":1}"#
        ),
        r#"{"ok":true}"#
    );
    assert_eq!(
        m.call(
            "boss",
            r#"{"cmd":"cancel_loose_end","kind":"reminder","id":1}"#
        ),
        r#"{"ok":false,"error":"no reminder #1 of boss"}"#
    );
    // The limit of pending reminders (3 here) is the hub's rule.
    for _ in 0..3 {
        m.call(
            "boss",
            r#"{"cmd":"remind","message":"x","delay_seconds":60}"#,
        );
    }
    assert_eq!(
        m.call(
            "boss",
            r#"{"cmd":"remind","message":"x","delay_seconds":60}"#
        ),
        r#"{"ok":false,"error":"boss already has 3 pending reminders (the limit); cancel some with cancel_loose_end"}"#
    );
}

#[test]
fn running_tasks_are_the_agents_own_and_replace_the_last_report() {
    let mut m = Mem::new(r#"{"agents":[{"name":"ana"}]}"#);
    let report = |tasks: &str| format!(r#"{{"cmd":"report_tasks","tasks":{tasks}}}"#);
    m.call("ana", &report(r#"[{"id":"1","cmd":"sleep 60","started_at":5},{"id":"2","cmd":"make","started_at":6,"timeout_secs":600}]"#));
    m.call(
        "ana",
        &report(r#"[{"id":"2","cmd":"make","started_at":6,"timeout_secs":600}]"#),
    );
    let ends = m.call("ana", r#"{"cmd":"get_loose_ends"}"#);
    assert!(
        ends.ends_with(r#""tasks":[{"cmd":"make","id":"2","started_at":6,"timeout_secs":600}]}"#),
        "{ends}"
    );
    assert_eq!(
        m.call("operator", &report("[]")),
        r#"{"ok":false,"error":"report_tasks is an agent command; the host socket speaks for the operator"}"#
    );
}

/// One `recv_next` of `agent`: the id handed out and its attempts.
fn pop(m: &mut Mem, agent: &str) -> (i64, u64) {
    let line = m.call(agent, r#"{"cmd":"recv_next"}"#).replace(":T", ":0");
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    (
        v["message"]["id"]
            .as_i64()
            .unwrap_or_else(|| panic!("{line}")),
        v["attempts"].as_u64().unwrap(),
    )
}

#[test]
fn attempts_count_hand_outs_and_a_failure_of_its_own_goes_behind_other_senders() {
    let mut m = Mem::new(HIVE);
    for (who, to, body) in [
        ("operator", "kid", "a"),
        ("bob", "kid", "b"),
        ("operator", "kid", "c"),
        ("bob", "kid", "d"),
    ] {
        let line = format!(r#"{{"cmd":"send","to":"{to}","body":"{body}"}}"#);
        assert!(m.call(who, &line).starts_with(r#"{"ok":true"#));
    }
    // #1 fails for its own reasons: it goes behind the mail of other senders,
    // with the later mail of its own sender (#3) behind it, in order.
    assert_eq!(pop(&mut m, "kid"), (1, 1));
    assert_eq!(
        m.call(
            "kid",
            r#"{"cmd":"requeue_inflight","id":1,"attempt":"counted","place":"behind","error":"claude crashed"}"#
        ),
        r#"{"ok":true}"#
    );
    // A pause gives the hand-out back and keeps the head.
    assert_eq!(pop(&mut m, "kid"), (2, 1));
    assert_eq!(
        m.call("kid", r#"{"cmd":"requeue_inflight","id":2}"#),
        r#"{"ok":true}"#
    );
    assert_eq!(pop(&mut m, "kid"), (2, 1), "given back, at the head");
    // A redelivery (the harness stopped mid-turn) counts.
    assert_eq!(pop(&mut m, "kid"), (2, 2));
    m.call(
        "kid",
        r#"{"cmd":"requeue_inflight","id":2,"attempt":"counted","place":"behind","error":"hung"}"#,
    );
    // Now 4 (bob) goes with 2, behind 1 and 3.
    assert_eq!(pop(&mut m, "kid"), (1, 2));
    assert_eq!(
        m.call(
            "kid",
            r#"{"cmd":"requeue_inflight","id":1,"attempt":"sometimes"}"#
        ),
        r#"{"ok":false,"error":"bad request: unknown attempt \"sometimes\"; known values: counted, not_counted"}"#
    );
    assert_eq!(
        m.call("kid", r#"{"cmd":"dead_letter","id":3,"error":"x"}"#),
        r#"{"ok":false,"error":"dead_letter: 3 is not the inflight message of kid (that is 1)"}"#
    );
    // The operator sent it: only kid's parent is told.
    assert_eq!(
        m.call(
            "kid",
            r#"{"cmd":"dead_letter","id":1,"error":"claude crashed again"}"#
        ),
        r#"{"ok":true,"id":1,"told":["boss"]}"#
    );
    assert_eq!(
        m.call("kid", r#"{"cmd":"dead_letter","id":1,"error":"again"}"#),
        r#"{"ok":false,"error":"dead_letter: kid has no inflight message (stale id 1)"}"#,
        "told once"
    );
    assert_eq!(pop(&mut m, "kid"), (3, 1));
    m.call("kid", r#"{"cmd":"ack_turn","id":3}"#);
    // bob sent #2: kid's parent and bob are told.
    assert_eq!(pop(&mut m, "kid"), (2, 3));
    assert_eq!(
        m.call(
            "kid",
            r#"{"cmd":"dead_letter","id":2,"error":"hung again"}"#
        ),
        r#"{"ok":true,"id":2,"told":["boss","bob"]}"#
    );
    let boss = m.call("boss", r#"{"cmd":"recv","max":5}"#);
    assert!(
        boss.contains(r#""kind":"dead_letter""#)
            && boss.contains(
                r#"[system] message #1 from operator to kid (\"a\") is dead-lettered after 2 failed attempts; last error: claude crashed again. It is kept: the operator can put it back with `hive retry 1`."#
            ),
        "{boss}"
    );
    let bob = m.call("bob", r#"{"cmd":"recv","max":5}"#);
    assert!(
        bob.contains(r#"[system] your message #2 to kid (\"b\") is dead-lettered after 3 failed attempts; last error: hung again."#),
        "{bob}"
    );
    // The operator's view.
    assert_eq!(
        m.call("operator", r#"{"cmd":"failed","agent":"kid"}"#),
        r#"{"ok":true,"failed":[{"agent":"kid","attempts":2,"body":"a","failed_at":T,"from":"operator","id":1,"kind":"message","last_error":"claude crashed again","sent_at":T},{"agent":"kid","attempts":3,"body":"b","failed_at":T,"from":"bob","id":2,"kind":"message","last_error":"hung again","sent_at":T}]}"#
    );
    assert_eq!(
        m.call("operator", r#"{"cmd":"failed","agent":"ana"}"#),
        r#"{"ok":true,"failed":[]}"#
    );
    let agents: serde_json::Value = serde_json::from_str(
        &m.call("operator", r#"{"cmd":"agents"}"#)
            .replace(":T", ":0"),
    )
    .unwrap();
    let kid = agents["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "kid")
        .unwrap();
    assert_eq!(
        (kid["failed"].as_u64(), kid["unread"].as_u64()),
        (Some(2), Some(1))
    );
    // Retry: back at the tail, attempts reset; anything else is refused.
    assert_eq!(
        m.call("operator", r#"{"cmd":"retry","id":1}"#),
        r#"{"ok":true,"agent":"kid","id":1}"#
    );
    assert_eq!(
        m.call("operator", r#"{"cmd":"retry","id":1}"#),
        r#"{"ok":false,"error":"message #1 is queued, not failed"}"#
    );
    assert_eq!(
        m.call("operator", r#"{"cmd":"retry","id":3}"#),
        r#"{"ok":false,"error":"message #3 is acked, not failed"}"#
    );
    assert_eq!(
        m.call("operator", r#"{"cmd":"retry","id":99}"#),
        r#"{"ok":false,"error":"there is no message #99; `hive failed` lists the dead letters"}"#
    );
    assert_eq!(
        m.call("kid", r#"{"cmd":"retry","id":2}"#),
        r#"{"ok":false,"error":"retry is an operator command; this is the socket of agent kid"}"#
    );
    assert_eq!(
        pop(&mut m, "kid"),
        (4, 1),
        "bob's #4 was queued before the retry"
    );
    m.call("kid", r#"{"cmd":"ack_turn","id":4}"#);
    assert_eq!(pop(&mut m, "kid"), (1, 1), "attempts reset");
    // Given up without running it this time: that hand-out is given back.
    assert_eq!(pop(&mut m, "kid"), (1, 2));
    m.call(
        "kid",
        r#"{"cmd":"dead_letter","id":1,"error":"used up","ran":false}"#,
    );
    let f = m.call("operator", r#"{"cmd":"failed","agent":"kid"}"#);
    assert!(f.contains(r#""attempts":1,"body":"a""#), "{f}");
}

#[test]
fn a_harness_reports_its_pause_while_it_is_connected() {
    let m = Mem::new(HIVE);
    let report = r#"{"cmd":"report_state","paused":{"reason":"rate_limit","until":1795323782,"detail":"rate limited"}}"#;
    assert_eq!(m.call_on("ana", 7, report, false).0, r#"{"ok":true}"#);
    let agents = |m: &Mem| -> serde_json::Value {
        let (line, _) = m.call_on("operator", 99, r#"{"cmd":"agents"}"#, false);
        let v: serde_json::Value = serde_json::from_str(&line.replace(":T", ":0")).unwrap();
        v["agents"][0].clone()
    };
    let ana = agents(&m);
    assert_eq!(
        (ana["paused"].to_string(), ana["running"].clone()),
        (
            r#"{"detail":"rate limited","reason":"rate_limit","until":1795323782}"#.to_string(),
            serde_json::json!(true)
        )
    );
    assert_eq!(
        m.call_on("ana", 7, r#"{"cmd":"report_state","paused":null}"#, false)
            .0,
        r#"{"ok":true}"#
    );
    assert_eq!(agents(&m)["paused"], serde_json::Value::Null);
    m.call_on("ana", 7, report, false);
    // The harness is gone: so is its pause.
    m.calls.send(Drive::Closed(7)).unwrap();
    let ana = agents(&m);
    assert_eq!(
        (ana["paused"].clone(), ana["running"].clone()),
        (serde_json::Value::Null, serde_json::json!(false))
    );
}

#[test]
fn a_parked_status_watch_returns_when_the_status_or_the_inbox_changes() {
    let m = Mem::new(HIVE);
    let (first, _) = m.call_on(
        "ana",
        1,
        r#"{"cmd":"status","seen":{"unread":0,"status_text":""}}"#,
        true,
    );
    assert_eq!(
        first, r#"{"ok":true,"inflight":null,"status_text":"","unread":0}"#,
        "without a wait it answers at once"
    );
    let watch = r#"{"cmd":"status","wait_seconds":30,"seen":{"unread":0,"status_text":""}}"#;
    let (answer, woken) = m.call_on("ana", 1, watch, true);
    assert_eq!(answer, "WAIT");
    m.call_on("ana", 2, r#"{"cmd":"set_status","text":"busy"}"#, false);
    woken.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_eq!(
        m.call_on("ana", 1, watch, true).0,
        r#"{"ok":true,"inflight":null,"status_set_at":T,"status_text":"busy","unread":0}"#
    );
    let watch = r#"{"cmd":"status","wait_seconds":30,"seen":{"unread":0,"status_text":"busy"}}"#;
    let (answer, woken) = m.call_on("ana", 1, watch, true);
    assert_eq!(answer, "WAIT");
    m.call_on(
        "operator",
        3,
        r#"{"cmd":"send","to":"ana","body":"x"}"#,
        false,
    );
    woken.recv_timeout(Duration::from_secs(10)).unwrap();
    assert!(m.call_on("ana", 1, watch, true).0.contains(r#""unread":1"#));
}

#[test]
fn a_transient_wake_counts_its_attempts_and_is_stored_when_dead_lettered() {
    let mut m = Mem::new(HIVE);
    assert_eq!(
        m.call(
            "ana",
            r#"{"cmd":"wake","from":"matrix","body":"new dm","transient":true}"#
        ),
        r#"{"ok":true,"id":null,"to":"ana"}"#
    );
    m.call(
        "ana",
        r#"{"cmd":"wake","from":"cron","body":"tick","transient":true}"#,
    );
    assert_eq!(pop(&mut m, "ana"), (-1, 1));
    m.call(
        "ana",
        r#"{"cmd":"requeue_inflight","id":-1,"attempt":"counted","place":"behind","error":"crashed"}"#,
    );
    assert_eq!(pop(&mut m, "ana"), (-2, 1), "behind the other wake");
    m.call("ana", r#"{"cmd":"ack_turn","id":-2}"#);
    assert_eq!(pop(&mut m, "ana"), (-1, 2));
    assert_eq!(
        m.call(
            "ana",
            r#"{"cmd":"dead_letter","id":-1,"error":"crashed again"}"#
        ),
        r#"{"ok":true,"id":1,"told":["operator"]}"#
    );
    assert_eq!(
        m.call("operator", r#"{"cmd":"failed"}"#),
        r#"{"ok":true,"failed":[{"agent":"ana","attempts":2,"body":"new dm","failed_at":T,"from":"matrix","id":1,"kind":"message","last_error":"crashed again","sent_at":T}]}"#
    );
    let inbox = m.call("operator", r#"{"cmd":"inbox"}"#);
    assert!(
        inbox.contains(
            r#"message #1 from matrix to ana (\"new dm\") is dead-lettered after 2 failed attempts"#
        ),
        "{inbox}"
    );
    assert_eq!(
        m.call("operator", r#"{"cmd":"retry","id":1}"#),
        r#"{"ok":true,"agent":"ana","id":1}"#
    );
    assert_eq!(pop(&mut m, "ana"), (1, 1), "a stored message now");
}

/// The operator stops and starts any agent; the hub keeps it stopped only once
/// the supervisor carried the stop out, and no longer once it started it.
#[test]
fn an_operator_stop_is_kept_once_the_supervisor_carried_it_out() {
    let (sup_tx, sup_rx) = unbounded::<LifecycleCmd>();
    let m = std::sync::Arc::new(Mem::with(HIVE, Some(sup_tx), Duration::from_secs(10)));
    let stopped = |m: &Mem| {
        Db::open(&m.dir.join("broker.db"), Durability::Normal)
            .unwrap()
            .stopped_agents()
            .unwrap()
    };
    // The supervisor answers each command with `answer`.
    let run = |m: &std::sync::Arc<Mem>, line: &'static str, answer: Result<String, String>| {
        let call = {
            let m = m.clone();
            std::thread::spawn(move || m.call_on("operator", 1, line, false).0)
        };
        let reply = match sup_rx.recv_timeout(Duration::from_secs(10)).unwrap() {
            LifecycleCmd::Kill { reply, name } | LifecycleCmd::Start { reply, name } => {
                assert_eq!(name, "ana");
                reply
            }
            _ => panic!("not a stop or a start"),
        };
        reply.send(answer).unwrap();
        call.join().unwrap()
    };
    assert_eq!(
        run(
            &m,
            r#"{"cmd":"stop_agent","name":"ana"}"#,
            Err("ana is not supervised by this hive".into())
        ),
        r#"{"ok":false,"error":"ana is not supervised by this hive"}"#
    );
    assert!(stopped(&m).is_empty(), "a refused stop is not kept");
    assert_eq!(
        run(
            &m,
            r#"{"cmd":"stop_agent","name":"ana"}"#,
            Ok("ana is stopping and stays stopped".into())
        ),
        r#"{"ok":true,"text":"ana is stopping and stays stopped"}"#
    );
    assert_eq!(stopped(&m), ["ana"]);
    assert_eq!(
        run(
            &m,
            r#"{"cmd":"start_agent","name":"ana"}"#,
            Ok("ana started".into())
        ),
        r#"{"ok":true,"text":"ana started"}"#
    );
    assert!(stopped(&m).is_empty());
    // An unknown agent never reaches the supervisor; an agent socket is refused.
    let (unknown, _) = m.call_on(
        "operator",
        2,
        r#"{"cmd":"update_agent","name":"zed"}"#,
        false,
    );
    assert_eq!(
        unknown,
        r#"{"ok":false,"error":"unknown agent \"zed\"; the agents are ana, bob, boss, kid"}"#
    );
    let (agent, _) = m.call_on("boss", 3, r#"{"cmd":"restart_agent","name":"ana"}"#, false);
    assert_eq!(
        agent,
        r#"{"ok":false,"error":"restart_agent is an operator command; this is the socket of agent boss"}"#
    );
    assert!(
        sup_rx.try_recv().is_err(),
        "nothing else reached the supervisor"
    );
}

#[test]
fn without_a_supervisor_the_operators_lifecycle_commands_say_so() {
    let mut m = Mem::new(HIVE);
    assert_eq!(
        m.call("operator", r#"{"cmd":"stop_agent","name":"ana"}"#),
        r#"{"ok":false,"error":"this broker runs without a supervisor (plain `hive broker`), so agents cannot be started or stopped from here; run the hive with `hive up`"}"#
    );
}

// ---- issue 16: credential pools and their usage-limit pauses ----

#[test]
fn a_usage_limit_parks_the_pool_answers_the_pause_once_and_notices_once() {
    let m = Mem::new(HIVE);
    let uuid = r#"{"cmd":"report_pool","account_uuid":"3F1C-AA"}"#;
    assert_eq!(
        m.call_on("ana", 1, uuid, false).0,
        r#"{"ok":true,"pool":"uuid:3f1c-aa"}"#
    );
    assert_eq!(
        m.call_on("bob", 2, uuid, false).0,
        r#"{"ok":true,"pool":"uuid:3f1c-aa"}"#
    );
    // A credential digest becomes 8 hex digits of a keyed fingerprint; the
    // same digest, the same pool.
    let digest = crate::sys::hash::hex(&crate::sys::hash::sha256(b"sk-test"));
    let key = &format!(r#"{{"cmd":"report_pool","credential_sha256":"{digest}"}}"#);
    let kid = m.call_on("kid", 3, key, false).0;
    assert!(
        kid.starts_with(r#"{"ok":true,"pool":"key:"#) && kid.len() == 33,
        "{kid}"
    );
    assert_eq!(m.call_on("boss", 4, key, false).0, kid);
    m.call_on(
        "operator",
        9,
        r#"{"cmd":"send","to":"bob","body":"waits"}"#,
        false,
    );
    let until = crate::proto::now() + 3600;
    let limit = format!(
        r#"{{"cmd":"report_usage_limit","until":{until},"detail":"session limit","credential":{{"account_uuid":"3F1C-AA"}}}}"#
    );
    assert_eq!(m.call_on("ana", 1, &limit, false).0, r#"{"ok":true}"#);
    // A second limit in the same window: no second notice.
    m.call_on("ana", 1, &limit, false);
    // bob gets the pause, not the message; the same connection then parks.
    let next = r#"{"cmd":"recv_next","wait_seconds":30}"#;
    let first: serde_json::Value =
        serde_json::from_str(&m.call_on("bob", 2, next, true).0).unwrap();
    assert_eq!(first["message"], serde_json::Value::Null, "{first}");
    assert_eq!(first["paused"]["reason"], "usage_limit", "{first}");
    assert_eq!(first["paused"]["until"], until, "{first}");
    assert_eq!(first["unread"], 1, "{first}");
    assert_eq!(m.call_on("bob", 2, next, true).0, "WAIT");
    // Without a wait it answers the pause again; the message stays queued.
    let again: serde_json::Value =
        serde_json::from_str(&m.call_on("bob", 2, next, false).0).unwrap();
    assert_eq!(again["paused"]["reason"], "usage_limit");
    // kid is in another pool: its mail flows.
    m.call_on(
        "operator",
        9,
        r#"{"cmd":"send","to":"kid","body":"runs"}"#,
        false,
    );
    assert!(m
        .call_on("kid", 3, next, false)
        .0
        .contains(r#""body":"runs""#));
    let inbox = m.call_on("operator", 9, r#"{"cmd":"inbox"}"#, false).0;
    assert_eq!(
        inbox.matches(r#""kind":"usage_limit""#).count(),
        1,
        "{inbox}"
    );
    assert!(inbox.contains("uuid:3f1c-aa (ana, bob)"), "{inbox}");
    let agents: serde_json::Value =
        serde_json::from_str(&m.call_on("operator", 9, r#"{"cmd":"agents"}"#, false).0).unwrap();
    let bob = &agents["agents"][1];
    assert_eq!(bob["pool"], "uuid:3f1c-aa");
    assert_eq!(bob["paused"]["reason"], "usage_limit");
}

#[test]
fn an_early_warning_marks_the_pool_until_allowed_or_the_limit() {
    let m = Mem::pool_of_two();
    let rows = || -> serde_json::Value {
        let a: serde_json::Value =
            serde_json::from_str(&m.call_on("operator", 9, r#"{"cmd":"agents"}"#, false).0)
                .unwrap();
        a["agents"].clone()
    };
    let near = |name: &str| -> serde_json::Value {
        rows()
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap()["near_limit"]
            .clone()
    };
    assert_eq!(near("bob"), serde_json::Value::Null);
    let until = crate::proto::now() + 3600;
    let warn = format!(
        r#"{{"cmd":"report_pool","account_uuid":"u1","usage":{{"status":"allowed_warning","resets_at":{until},"window":"five_hour","utilization":0.92}}}}"#
    );
    assert_eq!(
        m.call_on("ana", 1, &warn, false).0,
        r#"{"ok":true,"pool":"uuid:u1"}"#
    );
    for name in ["ana", "bob"] {
        assert_eq!(
            near(name),
            serde_json::json!({"until": until, "window": "five_hour", "utilization": 0.92, "reported_by": "ana"}),
            "{name}"
        );
    }
    assert_eq!(near("kid"), serde_json::Value::Null, "another pool");
    // A warning whose window already reset changes nothing.
    let stale = r#"{"cmd":"report_pool","account_uuid":"u1","usage":{"status":"allowed_warning","resets_at":5}}"#;
    m.call_on("bob", 2, stale, false);
    assert_eq!(near("bob")["until"], until);
    // A later run of the pool that says `allowed` clears it.
    let allowed = r#"{"cmd":"report_pool","account_uuid":"u1","usage":{"status":"allowed"}}"#;
    m.call_on("bob", 2, allowed, false);
    assert_eq!(near("ana"), serde_json::Value::Null);
    // The limit itself replaces it.
    m.call_on("ana", 1, &warn, false);
    assert_eq!(near("bob")["reported_by"], "ana");
    let limit = format!(
        r#"{{"cmd":"report_usage_limit","until":{until},"credential":{{"account_uuid":"u1"}}}}"#
    );
    let (said, _) = m.call_on("ana", 1, &limit, false);
    assert_eq!(said, r#"{"ok":true}"#);
    assert_eq!(near("bob"), serde_json::Value::Null);
    assert_eq!(rows()[1]["paused"]["reason"], "usage_limit", "{}", rows());
    // A bad report is refused with what is wrong, and changes nothing.
    let bad = r#"{"cmd":"report_pool","account_uuid":"u1","usage":{"status":"allowed_warning","window":"Five Hours"}}"#;
    let e = m.call_on("ana", 1, bad, false).0;
    assert!(e.contains("usage.window"), "{e}");
}

#[test]
fn an_idle_member_parked_in_recv_next_hears_its_pool_park_at_once() {
    let m = Mem::pool_of_two();
    // bob has no mail: his harness waits in recv_next.
    let next = r#"{"cmd":"recv_next","wait_seconds":30}"#;
    let (parked, woken) = m.call_on("bob", 2, next, true);
    assert_eq!(parked, "WAIT");
    let until = crate::proto::now() + 600;
    let limit = format!(
        r#"{{"cmd":"report_usage_limit","until":{until},"credential":{{"account_uuid":"u1"}}}}"#
    );
    m.call_on("ana", 1, &limit, false);
    woken
        .recv_timeout(Duration::from_secs(20))
        .expect("the park wakes bob's waiting recv_next");
    // Asked again, as the connection thread does, the call answers the pause.
    let got = m.call_on("bob", 2, next, true).0;
    assert!(got.contains(r#""reason":"usage_limit""#), "{got}");
    assert!(got.contains(&format!(r#""until":{until}"#)), "{got}");
    // Told once: the next call parks again until the hub's timer ends it.
    assert_eq!(m.call_on("bob", 2, next, true).0, "WAIT");
}

#[test]
fn a_pool_pause_ends_on_the_hubs_timer_and_hands_out_in_order() {
    let m = Mem::pool_of_two();
    m.call_on(
        "operator",
        9,
        r#"{"cmd":"send","to":"bob","body":"one"}"#,
        false,
    );
    m.call_on(
        "operator",
        9,
        r#"{"cmd":"send","to":"bob","body":"two"}"#,
        false,
    );
    let until = crate::proto::now() + 1;
    let limit = format!(
        r#"{{"cmd":"report_usage_limit","until":{until},"credential":{{"account_uuid":"u1"}}}}"#
    );
    m.call_on("ana", 1, &limit, false);
    let next = r#"{"cmd":"recv_next","wait_seconds":30}"#;
    assert!(m.call_on("bob", 2, next, true).0.contains("usage_limit"));
    let (parked, woken) = m.call_on("bob", 2, next, true);
    assert_eq!(parked, "WAIT");
    // The hub's own timer wakes the parked call (no one polls).
    woken
        .recv_timeout(Duration::from_secs(20))
        .expect("the timer ends the pause");
    let got = m.call_on("bob", 2, next, false).0;
    assert!(got.contains(r#""body":"one""#), "{got}");
    assert!(!got.contains("paused"), "{got}");
}

/// Reports of a parked pool tell the operator nothing more, and one that
/// would move the park later within the renewal gap is refused (issue 40):
/// the park stands. (A move a gap later, and its notice, are `pools.rs`'s
/// unit test, which sets the gap back.)
#[test]
fn a_report_moving_a_park_later_within_the_gap_is_refused_and_tells_nobody() {
    let m = Mem::pool_of_two();
    let limit = |until: i64| {
        format!(
            r#"{{"cmd":"report_usage_limit","until":{until},"detail":"session limit","credential":{{"account_uuid":"u1"}}}}"#
        )
    };
    // The operator's usage-limit notices, in order (answers are scrubbed of
    // times, so they are read as text).
    let notices = || -> Vec<String> {
        let inbox = m
            .call_on("operator", 9, r#"{"cmd":"inbox","peek":true}"#, false)
            .0;
        inbox
            .split(r#""body":""#)
            .skip(1)
            .map(|b| b.split('"').next().unwrap().to_string())
            .filter(|b| b.starts_with("[usage limit]"))
            .collect()
    };
    let t = crate::proto::now();
    assert_eq!(
        m.call_on("ana", 1, &limit(t + 600), false).0,
        r#"{"ok":true}"#
    );
    assert_eq!(notices().len(), 1);
    // Earlier or the same: taken, nothing moves, no notice.
    for (who, conn, until) in [("bob", 2, t + 60), ("ana", 1, t + 600)] {
        assert_eq!(
            m.call_on(who, conn, &limit(until), false).0,
            r#"{"ok":true}"#
        );
    }
    // Later, within the gap: refused, the park stands.
    for (who, conn, until) in [("ana", 1, t + 900), ("bob", 2, t + 600 + 601)] {
        let answer = m.call_on(who, conn, &limit(until), false).0;
        assert!(
            answer.contains(r#""ok":false"#)
                && answer.contains("moves it later at most once every 600s"),
            "{answer}"
        );
    }
    assert_eq!(notices().len(), 1, "{:?}", notices());
    let agents: serde_json::Value =
        serde_json::from_str(&m.call_on("operator", 9, r#"{"cmd":"agents"}"#, false).0).unwrap();
    assert_eq!(agents["agents"][0]["paused"]["until"], t + 600);
}

/// The hub's channel wakes its loop for every message, however senders race
/// the loop taking the wake: four threads send in bursts while a loop like
/// the broker's (poll the wake-up socket, clear it, drain the channel) waits
/// only on the socket; every message arrives.
#[test]
fn racing_senders_never_lose_a_wake() {
    use crate::sys::fd::{poll, PollFd};
    use std::os::fd::AsRawFd;
    let (tx, rx) = channel().unwrap();
    let senders = 4;
    let per = 2000;
    let threads: Vec<_> = (0..senders)
        .map(|_| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for i in 0..per {
                    tx.send(HubMsg::FromFleet(Box::new(
                        crate::broker::lifecycle::FleetEvent::HiveBudget(None),
                    )))
                    .unwrap();
                    if i % 64 == 0 {
                        std::thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let mut got = 0;
    while got < senders * per {
        let mut fds = [PollFd::new(rx.readable.as_raw_fd(), true, false)];
        let n = poll(&mut fds, Some(Duration::from_secs(10))).unwrap();
        assert!(n > 0, "no wake for a pending message: got {got}");
        rx.clear();
        while rx.rx.try_recv().is_ok() {
            got += 1;
        }
    }
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn message_counts_are_the_rows_per_recipient_and_state_for_the_operator() {
    let mut m = Mem::new(HIVE);
    for to in ["ana", "ana", "ana", "bob"] {
        let sent = m.call(
            "operator",
            &format!(r#"{{"cmd":"send","to":"{to}","body":"hi"}}"#),
        );
        assert!(sent.starts_with(r#"{"ok":true"#), "{sent}");
    }
    m.call("ana", r#"{"cmd":"recv_next"}"#);
    m.call("ana", r#"{"cmd":"ack_turn","id":1}"#);
    m.call("ana", r#"{"cmd":"recv_next"}"#);
    assert_eq!(
        m.call("operator", r#"{"cmd":"message_counts"}"#),
        r#"{"ok":true,"counts":[{"agent":"ana","count":1,"state":"acked"},{"agent":"ana","count":1,"state":"handed_out"},{"agent":"ana","count":1,"state":"queued"},{"agent":"bob","count":1,"state":"queued"}]}"#
    );
    let refused = m.call("ana", r#"{"cmd":"message_counts"}"#);
    assert!(refused.starts_with(r#"{"ok":false"#), "{refused}");
}
