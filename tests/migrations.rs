//! The databases of older releases open with this one: the fixtures in
//! `tests/fixtures/` (see its README) are copied to a temp dir, opened through
//! the code that opens them in production, which migrates them, and every row
//! is found again, unchanged except for what a step changes on purpose. The
//! upgraded broker store also serves a real `hive broker`.

mod common;

use common::hive::{agent_row, ok, operator_inbox, Broker, TempDir};
use hyperhive::broker::db::{self, Db, Durability};
use hyperhive::harness::stats::{self, MessageKey, Spend, Stats};
use hyperhive::harness::turnstats;
use hyperhive::proto::cmd::{
    AckTurn, Approvals, DeadLetter, Failed, Questions, RecvNext, RecvNextReply, Retry, Timers,
    TimersReply, Wake,
};
use hyperhive::proto::{schema, MsgKind, Peer};
use rusqlite::types::Value;
use rusqlite::Connection;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// Every row of `table`, ordered by its first column, as plain values.
fn rows(path: &Path, table: &str) -> Vec<Vec<Value>> {
    let c = Connection::open(path).unwrap();
    let mut stmt = c
        .prepare(&format!("SELECT * FROM {table} ORDER BY 1"))
        .unwrap();
    let n = stmt.column_count();
    let rows = stmt
        .query_map([], |r| (0..n).map(|i| r.get::<_, Value>(i)).collect())
        .unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

/// [`rows`] of a table an old store had, as the later steps left it: step
/// 18's outbox takes a place in `sqlite_sequence` (at 0, none written).
fn kept_rows(path: &Path, table: &str) -> Vec<Vec<Value>> {
    let mut r = rows(path, table);
    if table == "sqlite_sequence" {
        r.retain(|row| row[0] != Value::Text("notify_events".into()));
    }
    r
}

fn copy_fixture(name: &str, dir: &Path, to: &str) -> PathBuf {
    let path = dir.join(to);
    std::fs::copy(fixture(name), &path).unwrap();
    path
}

/// Opens a copy of the broker store `name` (written at schema `version`)
/// with the current code, which migrates it to the last step, and checks
/// that every message and every row of the tables steps 7 to 9 left alone is
/// still there, column by column (step 12's `charged` appended, none for
/// every old row). Opening a store puts rows that were inflight or held
/// when the broker died back into their inbox (the restart rule, not a
/// step). The migrated store, a second connection to it, and the dir that
/// holds them.
fn migrate_broker_fixture(name: &str, version: u32) -> (Db, Connection, TempDir) {
    let dir = TempDir::new("mig-v");
    let path = copy_fixture(name, dir.path(), db::FILE);
    let before = rows(&path, "messages");
    // From version 10 on, bob's run over the bounds brought a notice.
    let messages = if version >= 10 { 10 } else { 9 };
    assert_eq!(
        before.len(),
        messages,
        "the fixture as its README describes it"
    );
    let others = ["agent_pools", "agents", "sqlite_sequence"];
    let kept: Vec<_> = others.iter().map(|t| rows(&path, t)).collect();
    let spend = rows(&path, "spend");
    {
        let c = Connection::open(&path).unwrap();
        assert_eq!(schema::version(&c).unwrap(), version);
    }

    let store = Db::open(&path, Durability::Normal).unwrap();
    let c = Connection::open(&path).unwrap();
    assert_eq!(
        schema::version(&c).unwrap(),
        db::MIGRATIONS.last().unwrap().version
    );
    let mut new = rows(&path, "messages");
    step_16_off(&mut new);
    for n in new.iter_mut() {
        assert_eq!(
            n.pop(),
            Some(Value::Null),
            "step 12: an old row is charged to no agent"
        );
    }
    let state = 6;
    for (o, n) in before.iter().zip(new.iter_mut()) {
        if matches!(&o[state], Value::Text(s) if s == "inflight" || s == "held") {
            assert_eq!(n[state], Value::Text("queued".into()));
            n[state] = o[state].clone();
        }
    }
    assert_eq!(new, before, "every row, every column");
    for (t, old) in others.iter().zip(&kept) {
        assert_eq!(&kept_rows(&path, t), old, "{t}");
    }
    let spend = if version < 10 { bounded(spend) } else { spend };
    assert_eq!(
        spend,
        rows(&path, "spend"),
        "every spend row, clamped to step 10's bounds where it was over them"
    );
    (store, c, dir)
}

/// Spend rows of a store before step 10 (key, agent, at, usd, tokens,
/// cache reads) as step 10 leaves them: each figure at most $1000 or 10^9,
/// and the `clamped` column, 1 where one was cut.
fn bounded(old: Vec<Vec<Value>>) -> Vec<Vec<Value>> {
    old.into_iter()
        .map(|mut r| {
            let mut clamped = 0;
            if let Value::Real(u) = r[3] {
                if u > 1000.0 {
                    r[3] = Value::Real(1000.0);
                    clamped = 1;
                }
            }
            for i in [4, 5] {
                if let Value::Integer(n) = r[i] {
                    if n > 1_000_000_000 {
                        r[i] = Value::Integer(1_000_000_000);
                        clamped = 1;
                    }
                }
            }
            r.push(Value::Integer(clamped));
            r
        })
        .collect()
}

/// `agent`'s queued messages in queue order, as ids and bodies.
fn queue(store: &Db, agent: &str) -> Vec<(i64, String)> {
    store
        .queued(agent, 100)
        .unwrap()
        .into_iter()
        .map(|m| (m.id, m.body))
        .collect()
}

/// The indexes and triggers on the messages table from step 12 on: the
/// inbox's, the acked rows' by age, the two that keep the stored bytes.
const STEP_12_OBJECTS: [&str; 9] = [
    "messages_acked",
    "messages_charged_delete",
    "messages_charged_insert",
    "messages_inbox",
    "messages_receipts",
    "messages_sender",
    // Step 18: the notifications' triggers.
    "notify_on_dead_letter",
    "notify_on_dead_letter_insert",
    "notify_on_message",
];

/// Takes off the columns steps 16 and 17 appended to each message row (when
/// it was handed out, how, the turn that acked it, whether its sender wants
/// a receipt; its traceparent), none for every old row.
fn step_16_off(rows: &mut [Vec<Value>]) {
    for r in rows.iter_mut() {
        assert_eq!(
            r.pop(),
            Some(Value::Null),
            "step 17: an old row carries no traceparent"
        );
        let at = r.len() - 4;
        assert_eq!(
            r.split_off(at),
            [Value::Null, Value::Null, Value::Null, Value::Null],
            "step 16: no hand-out is known of an old row"
        );
    }
}

/// The names of the indexes and triggers on the messages table, sorted.
fn message_objects(c: &Connection) -> Vec<String> {
    let mut objects: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE tbl_name = 'messages' AND type != 'table'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    objects.sort();
    objects
}

/// A message from the operator.
fn operator_mail(to: &'static str, body: &'static str) -> db::NewMessage<'static> {
    db::NewMessage {
        from: &Peer::Operator,
        to,
        body,
        kind: &MsgKind::Message,
        in_reply_to: None,
        receipt: false,
        traceparent: None,
    }
}

/// `agent`'s next hand-out: its id, attempts, whether it was inflight, and
/// the count queued behind it.
fn hand_out(store: &Db, agent: &str) -> (i64, u32, bool, u64) {
    let (taken, queued) = store.take_next(agent, true).unwrap();
    let t = taken.expect("a row to hand out");
    (t.message.id, t.attempts, t.was_inflight, queued)
}

fn assert_intact(c: &Connection) {
    let check: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

#[test]
fn an_old_broker_store_migrates_with_every_row() {
    let dir = TempDir::new("mig");
    let path = copy_fixture("broker-v0.db", dir.path(), db::FILE);
    let tables = [
        "messages",
        "questions",
        "reminders",
        "scheduled",
        "approvals",
        "agents",
    ];
    let before: Vec<_> = tables.iter().map(|t| rows(&path, t)).collect();
    let counts: Vec<usize> = before.iter().map(Vec::len).collect();
    assert_eq!(
        counts,
        [23, 6, 2, 2, 4, 1],
        "the fixture as its README describes it"
    );

    drop(Db::open(&path, Durability::Normal).unwrap());
    let c = Connection::open(&path).unwrap();
    let last = db::MIGRATIONS.last().unwrap().version;
    assert_eq!(schema::version(&c).unwrap(), last);
    for (table, old) in tables.iter().zip(&before) {
        let mut new = rows(&path, table);
        if *table == "reminders" {
            // Step 6 read the spilled payloads into the rows and dropped the
            // `spill_file` column (the fourth). Reminder #2's file is gone
            // (it was in the generator's temp dir): the row stays, with its
            // preview and a note that the rest was lost.
            let mut want = old.clone();
            for o in want.iter_mut() {
                let file = o.remove(3);
                if let Value::Text(f) = file {
                    let Value::Text(preview) = &o[2] else {
                        panic!("{o:?}")
                    };
                    assert!(!Path::new(&f).exists(), "{f}");
                    o[2] = Value::Text(db::lost_payload(preview, &f));
                    let Value::Text(lost) = &o[2] else {
                        unreachable!()
                    };
                    assert!(
                        lost.starts_with("long long ")
                            && lost.ends_with(&format!(
                                "… [hive: the rest of this reminder was lost: its payload file {f} \
                                 could not be read when the broker moved reminder payloads into \
                                 broker.db]"
                            )),
                        "{lost}"
                    );
                }
            }
            assert_eq!(new, want, "reminders");
            continue;
        }
        if *table == "scheduled" {
            // Step 14 appended the deliveries skipped (0) and the last copy
            // delivered (none) to every prompt.
            for n in new.iter_mut() {
                assert_eq!(n.split_off(6), [Value::Integer(0), Value::Null]);
            }
        }
        if *table == "agents" {
            // Step 15 appended the page's model override and its default
            // (none) to every agent.
            for n in new.iter_mut() {
                assert_eq!(n.split_off(10), [Value::Null, Value::Null]);
            }
        }
        if *table == "messages" {
            // Step 3 appended attempts (0), the last error (none) and the
            // queue position (the row's own id) to every row, step 12 the
            // agent it is charged to (none), step 16 its hand-out (none).
            step_16_off(&mut new);
            for n in new.iter_mut() {
                let added = n.split_off(9);
                assert_eq!(
                    added,
                    [Value::Integer(0), Value::Null, n[0].clone(), Value::Null]
                );
            }
            // Opening the store puts rows that were inflight or held when the
            // broker died back into their inbox (the restart rule, not a step).
            let state = 6;
            for (o, n) in old.iter().zip(new.iter_mut()) {
                if matches!(&o[state], Value::Text(s) if s == "inflight" || s == "held") {
                    assert_eq!(n[state], Value::Text("queued".into()));
                    n[state] = o[state].clone();
                }
            }
        }
        assert_eq!(&new, old, "{table}");
    }
    // Step 2 added the table of running bash tasks, empty.
    assert!(rows(&path, "running_tasks").is_empty());
    // Step 3: ids go on where they were, and a new row queues last.
    let db = Db::open(&path, Durability::Normal).unwrap();
    let id = db
        .insert_message(&operator_mail("kid", "after the upgrade"), 1)
        .unwrap();
    assert_eq!(id, 24);
    let kid: Vec<i64> = db
        .queued("kid", 100)
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(kid, [3, 10, 13, 14, 15, 24]);
    drop(db);
    // Step 5 added the agents kept stopped: none yet, and the table works.
    assert!(rows(&path, "stopped_agents").is_empty());
    let store = Db::open(&path, Durability::Full).unwrap();
    assert!(store.stopped_agents().unwrap().is_empty());
    store.set_stopped("kid", "operator", 1795327382).unwrap();
    drop(store);
    // Step 4 (the swarm) made empty outbox, inbound log and question
    // mirrors, and an instance id that step 13 took away again: each broker
    // start makes its own.
    let meta = rows(&path, "swarm_meta");
    assert!(meta.is_empty(), "{meta:?}");
    for table in ["outbox", "inbound", "question_mirrors", "peer_instances"] {
        assert!(rows(&path, table).is_empty(), "{table}");
    }
    // Opening again changes nothing.
    let store = Db::open(&path, Durability::Full).unwrap();
    assert_eq!(store.stopped_agents().unwrap(), ["kid"]);
    drop(store);
    // Step 7 (issue 16) added the pools, their pauses, spend rows, budget
    // notices and the salt: empty, and they work; the salt is made once.
    for t in [
        "agent_pools",
        "pool_pauses",
        "spend",
        "budget_notices",
        "hive_salt",
    ] {
        assert!(rows(&path, t).is_empty(), "{t}");
    }
    let store = Db::open(&path, Durability::Full).unwrap();
    let salt = store.salt().unwrap();
    assert_eq!(salt.len(), 32);
    assert_eq!(store.salt().unwrap(), salt, "one salt per hive");
    store.set_pool("kid", "uuid:abc", 1795327382).unwrap();
    store
        .set_pool_pause("uuid:abc", 1795330000, "session limit", 1795327382)
        .unwrap();
    drop(store);
    let store = Db::open(&path, Durability::Full).unwrap();
    assert_eq!(store.salt().unwrap(), salt);
    assert_eq!(store.pools().unwrap(), [("kid".into(), "uuid:abc".into())]);
    assert_eq!(
        store.pool_pauses().unwrap(),
        [("uuid:abc".into(), 1795330000, "session limit".into())]
    );
    drop(store);
    assert_eq!(rows(&path, "approvals"), before[4]);
    assert_eq!(rows(&path, "swarm_meta"), meta);
    for (table, old) in tables
        .iter()
        .zip(&before)
        .filter(|(t, _)| **t != "messages" && **t != "reminders")
    {
        let mut now = rows(&path, table);
        if *table == "scheduled" {
            // Step 14's two columns, as above.
            now.iter_mut().for_each(|n| n.truncate(6));
        }
        if *table == "agents" {
            // Step 15's two columns, as above.
            now.iter_mut().for_each(|n| n.truncate(10));
        }
        assert_eq!(&now, old, "{table}");
    }
}

/// The store of the release before step 8 (schema 7, written by a real
/// broker and killed): step 8 rebuilds `messages` with its state check as a
/// chain of ORs, and every row, the id sequence, the indexes, the trigger and
/// the check itself are what they were.
#[test]
fn a_version_7_store_keeps_every_message_through_step_8() {
    let (store, c, _dir) = migrate_broker_fixture("broker-v7.db", 7);
    let sql: String = c
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'messages'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(
        sql.contains("state = 'queued' OR state = 'inflight'") && !sql.contains(" IN ("),
        "{sql}"
    );
    // Step 8 kept the seq index and its trigger; step 9 then drops them,
    // and step 12 adds its own.
    assert_eq!(message_objects(&c), STEP_12_OBJECTS);
    // The check still refuses a state it does not know.
    let bad = c.execute("UPDATE messages SET state = 'lost' WHERE id = 1", []);
    assert!(
        format!("{bad:?}").contains("CHECK constraint failed"),
        "{bad:?}"
    );
    // Ids go on after the sequence, and a new row queues last in ana's inbox.
    let id = store
        .insert_message(&operator_mail("ana", "after step 8"), 1)
        .unwrap();
    assert_eq!(id, 10);
    assert_eq!(
        queue(&store, "ana"),
        [
            (4, "from bob, inflight".to_string()),
            (5, "queued one".to_string()),
            (6, "queued two".to_string()),
            (10, "after step 8".to_string()),
        ]
    );
    assert_eq!(
        hand_out(&store, "ana"),
        (4, 3, false, 3),
        "the row that was inflight comes back first, its attempts counted on"
    );
    assert_intact(&c);
}

/// Step 9: the seq index and its insert trigger go, every row stays, and the
/// broker's own queue tail starts after the last place of a live row — here
/// ana's message put behind the others before the old broker died, whose
/// place is above every id.
#[test]
fn a_version_8_store_keeps_every_message_through_step_9() {
    let (store, c, _dir) = migrate_broker_fixture("broker-v8.db", 8);
    assert_eq!(message_objects(&c), STEP_12_OBJECTS);
    let place = |id: i64| -> i64 {
        c.query_row("SELECT seq FROM messages WHERE id = ?1", [id], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(place(4), 10, "the fixture's message put behind");
    let id = store
        .insert_message(&operator_mail("ana", "after step 9"), 1)
        .unwrap();
    assert_eq!(id, 10, "ids go on after the sequence");
    assert!(place(10) > 10, "a new row goes behind every live row");
    let bob = store
        .insert_message(&operator_mail("bob", "bob's after step 9"), 1)
        .unwrap();
    assert!(place(bob) > place(10), "places only grow");
    assert_eq!(
        queue(&store, "ana"),
        [
            (5, "queued one".to_string()),
            (6, "queued two".to_string()),
            (4, "from bob, inflight".to_string()),
            (10, "after step 9".to_string()),
        ]
    );
    assert_eq!(hand_out(&store, "ana"), (5, 1, false, 3));
    assert_intact(&c);
}

/// Step 10: the spend rows gain their `clamped` flag; a row the previous
/// release kept whole above the per-run bounds (bob's $2500 and 5·10^9
/// tokens) is clamped and flagged, the others stay as they were (the
/// helper checks every column), and the sums `budget` makes of them are
/// the bounded ones.
#[test]
fn a_version_9_store_bounds_its_spend_rows_through_step_10() {
    let (store, c, _dir) = migrate_broker_fixture("broker-v9.db", 9);
    let flagged: Vec<(String, f64, i64, i64)> = c
        .prepare("SELECT key, usd, tokens, cache_read FROM spend WHERE clamped = 1")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(
        flagged,
        [("boot-2:1".to_string(), 1000.0, 1_000_000_000, 1_000_000_000)]
    );
    let bob = store.spend_since(Some("bob"), 0).unwrap().unwrap();
    assert_eq!(
        (bob.usd, bob.unknown, bob.tokens, bob.clamped),
        (1000.0, 1, 1_000_000_010, 1)
    );
    assert_intact(&c);
}

/// Step 12 (issue 40) on the store of the release before it: every message
/// stays (charged to no agent), the running sums start empty, the index of
/// acked rows by age and the two triggers are there, and a row charged from
/// now on counts until it is deleted. A real broker then serves the store
/// and counts what ana wakes herself with in `agents`.
#[test]
fn a_version_11_store_charges_new_messages_through_step_12() {
    let (store, c, dir) = migrate_broker_fixture("broker-v11.db", 11);
    assert_eq!(message_objects(&c), STEP_12_OBJECTS);
    assert!(rows(&dir.path().join(db::FILE), "stored_bytes").is_empty());
    let id = store
        .insert_charged(&operator_mail("bob", "twelve bytes"), Some("ana"), 1)
        .unwrap();
    assert_eq!(id, 11, "ids go on after the sequence");
    assert_eq!(
        store.stored_bytes().unwrap(),
        [("ana".to_string(), 12)].into()
    );
    c.execute("DELETE FROM messages WHERE id = ?1", [id])
        .unwrap();
    assert!(
        store.stored_bytes().unwrap().is_empty(),
        "a deleted row stops counting"
    );
    assert_intact(&c);
    drop((store, c));

    let state = dir.path().join("s");
    std::fs::create_dir_all(&state).unwrap();
    copy_fixture("broker-v11.db", &state, db::FILE);
    let b = Broker::start_in(&["ana", "bob"], &state);
    assert_eq!(agent_row(&b, "ana").stored_bytes, 0);
    let body = "w".repeat(1000);
    ok(
        &mut b.agent("ana"),
        Wake {
            from: "cron".into(),
            body,
            transient: false,
            to: None,
            traceparent: None,
        },
    );
    assert_eq!(agent_row(&b, "ana").stored_bytes, 1000);
    assert_eq!(agent_row(&b, "bob").stored_bytes, 0);
}

/// Steps 14 and 15 (issue 39) on the previous release's store
/// (`broker-v12.db`, the release before steps 13 to 15): its scheduled
/// prompts gain a count of skipped deliveries and the message of their last
/// copy, its agent rows an empty model override, every other row stays, a repeating prompt stored as that release stored it is coalesced
/// from its first delivery on, and a real broker serves the operator's
/// `timers` from it.
#[test]
fn the_previous_releases_store_coalesces_repeating_prompts_through_step_14() {
    let dir = TempDir::new("mig-v12-timers");
    let path = copy_fixture("broker-v12.db", dir.path(), db::FILE);
    {
        let c = Connection::open(&path).unwrap();
        assert_eq!(schema::version(&c).unwrap(), 12);
    }
    let kept = ["questions", "reminders", "approvals"];
    let before: Vec<_> = kept.iter().map(|t| rows(&path, t)).collect();
    let agents = rows(&path, "agents");
    let scheduled = rows(&path, "scheduled");
    let store = Db::open(&path, Durability::Normal).unwrap();
    let c = Connection::open(&path).unwrap();
    assert_eq!(
        schema::version(&c).unwrap(),
        db::MIGRATIONS.last().unwrap().version
    );
    for (t, old) in kept.iter().zip(&before) {
        assert_eq!(&rows(&path, t), old, "{t}");
    }
    let columns: Vec<String> = c
        .prepare("SELECT name FROM pragma_table_info('scheduled') ORDER BY cid")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap();
    assert_eq!(
        columns,
        [
            "id",
            "agent",
            "body",
            "fire_at",
            "every_seconds",
            "created_at",
            "skipped",
            "last_copy"
        ]
    );
    let mut now = rows(&path, "scheduled");
    for n in now.iter_mut() {
        assert_eq!(n.split_off(6), [Value::Integer(0), Value::Null]);
    }
    assert_eq!(now, scheduled, "every prompt, every column");
    // Step 15 (issue 39): every agent row gains no model override.
    let mut now = rows(&path, "agents");
    for n in now.iter_mut() {
        assert_eq!(n.split_off(10), [Value::Null, Value::Null]);
    }
    assert_eq!(now, agents, "every agent row, every column");
    assert_eq!(store.model_override("ana").unwrap(), None);
    store
        .set_model_override("ana", Some(("opus", "sonnet")))
        .unwrap();
    assert_eq!(
        store.model_override("ana").unwrap(),
        Some(("opus".to_string(), "sonnet".to_string()))
    );
    assert_eq!(store.timers(None).unwrap().len(), scheduled.len());
    // A prompt as the old release stored it (no step 14 column written).
    c.execute(
        "INSERT INTO scheduled (agent, body, fire_at, every_seconds, created_at)
         VALUES ('ana', 'digest', 100, 60, 1)",
        [],
    )
    .unwrap();
    let s = store
        .scheduled_of("ana")
        .unwrap()
        .into_iter()
        .find(|s| s.body == "digest")
        .unwrap();
    let body = format!("[scheduled #{}] digest", s.id);
    let msg = db::NewMessage {
        from: &Peer::Scheduler,
        to: "ana",
        body: &body,
        kind: &MsgKind::Scheduled,
        in_reply_to: None,
        receipt: false,
        traceparent: None,
    };
    let db::Fired::Delivered(copy) = store.fire_scheduled(&s, Some(160), &msg, 100).unwrap() else {
        panic!("an old prompt has no copy yet: it delivers")
    };
    assert_eq!(
        store.fire_scheduled(&s, Some(220), &msg, 160).unwrap(),
        db::Fired::Coalesced(copy)
    );
    let t = store
        .timers(Some("ana"))
        .unwrap()
        .into_iter()
        .find(|t| t.id == s.id && t.first_line == "digest")
        .unwrap();
    assert_eq!((t.skipped, t.unread_copy), (1, Some(copy)));
    assert_eq!(
        queue(&store, "ana")
            .iter()
            .filter(|(_, b)| b.ends_with("] digest"))
            .count(),
        1
    );
    assert_intact(&c);
    drop((store, c));

    let state = dir.path().join("s");
    std::fs::create_dir_all(&state).unwrap();
    copy_fixture("broker-v12.db", &state, db::FILE);
    let b = Broker::start_in(&["ana", "bob"], &state);
    let r: TimersReply = b.host().call(&Timers { agent: None }).unwrap();
    assert_eq!(r.timers.len(), scheduled.len() + before[1].len(), "{r:?}");
}

/// Step 6 with the spill file still there: the payload is read into the row
/// once, and the reminder fires with the whole text.
#[test]
fn a_spilled_reminder_payload_moves_into_the_store() {
    let dir = TempDir::new("mig");
    let state = dir.path().join("s");
    std::fs::create_dir_all(&state).unwrap();
    let path = copy_fixture("broker-v0.db", &state, db::FILE);
    let payload = format!("the whole payload {}", "long ".repeat(1200));
    let file = dir.path().join("2.md");
    std::fs::write(&file, &payload).unwrap();
    {
        // The fixture's row, pointed at a file that exists and due now.
        let c = Connection::open(&path).unwrap();
        c.execute(
            "UPDATE reminders SET spill_file = ?1, fire_at = 0 WHERE id = 2",
            [file.to_str().unwrap()],
        )
        .unwrap();
    }
    drop(Db::open(&path, Durability::Normal).unwrap());
    let after = rows(&path, "reminders");
    assert_eq!(after[1][2], Value::Text(payload.clone()));
    assert_eq!(after[1].len(), 5, "spill_file is gone: {:?}", after[1]);
    // Read once: changing the file afterwards changes nothing.
    std::fs::write(&file, "changed").unwrap();
    drop(Db::open(&path, Durability::Normal).unwrap());
    assert_eq!(rows(&path, "reminders")[1][2], Value::Text(payload.clone()));

    let b = Broker::start_in(&["ruth", "kid", "bob"], &state);
    let mut ruth = b.agent("ruth");
    // ruth's inflight kick from the fixture comes back first; then the reminder.
    let mut bodies = Vec::new();
    for _ in 0..10 {
        let r: RecvNextReply = ruth
            .call(&RecvNext {
                wait_seconds: Some(10),
                seen: None,
            })
            .unwrap();
        let Some(m) = r.message else { break };
        ok(
            &mut ruth,
            AckTurn {
                id: m.id,
                turn: None,
            },
        );
        let done = m.kind == MsgKind::Reminder && m.body.starts_with("[reminder #2]");
        bodies.push(m.body);
        if done {
            break;
        }
    }
    assert_eq!(
        bodies.last().map(String::as_str),
        Some(format!("[reminder #2] {payload}").as_str()),
        "{bodies:?}"
    );
}

#[test]
fn a_real_broker_serves_an_old_store() {
    let dir = TempDir::new("mig");
    let state = dir.path().join("s");
    std::fs::create_dir_all(&state).unwrap();
    copy_fixture("broker-v0.db", &state, db::FILE);
    let b = Broker::start_in(&["ruth", "kid", "bob"], &state);

    let ruth = agent_row(&b, "ruth");
    assert_eq!((ruth.turns, ruth.turns_ok, ruth.tokens_in), (3, 2, 2400));
    assert_eq!(ruth.status_text, "writing the fixtures");
    // ruth's inflight kick comes back first, as after any broker crash.
    let r: RecvNextReply = b
        .agent("ruth")
        .call(&RecvNext {
            wait_seconds: None,
            seen: None,
        })
        .unwrap();
    let m = r.message.unwrap();
    assert_eq!(
        (m.id, m.kind.as_str(), m.from.as_str()),
        (1, "kick", "system")
    );

    let inbox = operator_inbox(&b);
    let ids: Vec<i64> = inbox.iter().map(|m| m.id).collect();
    assert_eq!(ids, [7, 17, 18, 20, 22], "the unread operator messages");
    // An old row can be dead-lettered and retried like a new one. Hand-outs
    // before the upgrade were not counted: this is its first.
    assert_eq!(r.attempts, 1);
    let dead = ok(
        &mut b.agent("ruth"),
        DeadLetter {
            id: 1,
            error: "claude crashed".into(),
            ran: true,
        },
    );
    assert_eq!(dead["told"], serde_json::json!(["operator"]));
    let notice = operator_inbox(&b);
    assert!(
        notice.len() == 1 && notice[0].body.contains("message #1 from system to ruth"),
        "{notice:?}"
    );
    let f = ok(&mut b.host(), Failed { agent: None });
    assert_eq!(f["failed"][0]["id"], 1, "{f:?}");
    ok(&mut b.host(), Retry { id: 1 });
    assert_eq!(agent_row(&b, "ruth").failed, 0);
    let q = ok(&mut b.host(), Questions {});
    assert_eq!(q["questions"].as_array().unwrap().len(), 1, "{q:?}");
    let a = ok(&mut b.host(), Approvals {});
    assert_eq!(a["approvals"][0]["agent"], "newkid", "{a:?}");
}

#[test]
fn old_turn_stats_migrate_to_closed_outcome_kinds() {
    let dir = TempDir::new("mig");
    let path = copy_fixture("turn-stats-v0.db", dir.path(), turnstats::FILE);
    let before = rows(&path, "turns");
    assert_eq!(before.len(), 14);

    drop(Stats::open(&path).unwrap());
    let c = Connection::open(&path).unwrap();
    assert_eq!(schema::version(&c).unwrap(), turnstats::STEPS.len() as u32);
    let after = rows(&path, "turns");
    let (outcome, note) = (4, 13);
    let text = |v: &Value| match v {
        Value::Text(s) => s.clone(),
        other => panic!("{other:?}"),
    };
    let mut kinds = Vec::new();
    for (o, n) in before.iter().zip(&after) {
        for i in (0..o.len()).filter(|i| *i != outcome && *i != note) {
            assert_eq!(o[i], n[i], "column {i} of turn {:?}", o[0]);
        }
        kinds.push(text(&n[outcome]));
        // The free text is kept in the note.
        let (old, new_note) = (text(&o[outcome]), text(&n[note]));
        if let Some((_, detail)) = old.split_once(": ") {
            assert!(new_note.ends_with(detail), "{old} -> {new_note}");
        }
    }
    assert_eq!(
        kinds,
        [
            "ok",
            "compacted",
            "compacted",
            "ok",
            "rate_limited",
            "rate_limited",
            "auth_failed",
            "prompt_too_long",
            "api_unavailable",
            "interrupted",
            "failed",
            "timed_out",
            "failed",
            "not_started"
        ]
    );
    assert_eq!(
        text(&after[9][note]),
        "interrupted by the operator; turn interrupted during execution"
    );
    assert_eq!(text(&after[4][note]), "resets at 1795323782");

    // The export groups by the closed kinds only.
    let totals = stats::totals(&path).unwrap();
    let labels: Vec<&str> = totals.iter().map(|t| t.outcome.as_str()).collect();
    assert!(labels.iter().all(|l| !l.contains(' ')), "{labels:?}");
    assert_eq!(totals.iter().map(|t| t.count).sum::<u64>(), 14);
}

#[test]
fn new_rows_store_the_kind_and_keep_the_text_in_the_note() {
    let dir = TempDir::new("mig");
    let path = dir.path().join(turnstats::FILE);
    let s = Stats::open(&path).unwrap();
    s.record(&stats::TurnRow {
        id: 0,
        started_at: 1,
        duration_ms: 2,
        kind: "turn".into(),
        outcome: "failed: claude exited with code 1 without a result line".into(),
        model: "m".into(),
        sender: "operator".into(),
        message_id: None,
        context_tokens: None,
        tokens_in: 0,
        tokens_out: 0,
        cost_usd: 0.0,
        session_id: None,
        note: String::new(),
    })
    .unwrap();
    let row = stats::recent(&path, 1).unwrap().pop().unwrap();
    assert_eq!(row.outcome, "failed");
    assert_eq!(row.note, "claude exited with code 1 without a result line");
}

/// Step 3 of turn-stats.db (issue 16): every run keeps its spend row and
/// whether the broker acknowledged it. The old rows are all still there and
/// count as acknowledged (they carry no key, so they are never sent again); a
/// new row keeps its key with it across reopenings until it is acknowledged.
#[test]
fn old_turn_stats_gain_spend_rows_and_new_ones_wait_for_their_ack() {
    let dir = TempDir::new("mig");
    let path = copy_fixture("turn-stats-v0.db", dir.path(), turnstats::FILE);
    let before = rows(&path, "turns");
    let s = Stats::open(&path).unwrap();
    let after = rows(&path, "turns");
    assert_eq!(after.len(), before.len(), "every row is found again");
    let c = Connection::open(&path).unwrap();
    let (keys, acked): (i64, i64) = c
        .query_row(
            "SELECT COUNT(spend_key), SUM(spend_acked) FROM turns",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!((keys, acked), (0, before.len() as i64));
    assert!(
        s.unacked_spend(10).unwrap().is_empty(),
        "nothing to re-send"
    );

    let row = stats::TurnRow {
        id: 0,
        started_at: 1,
        duration_ms: 2,
        kind: "turn".into(),
        outcome: "ok".into(),
        model: "m".into(),
        sender: "operator".into(),
        message_id: Some(7),
        context_tokens: None,
        tokens_in: 100,
        tokens_out: 10,
        cost_usd: 0.01,
        session_id: None,
        note: String::new(),
    };
    let spend = |usd, tokens, cache_read| Spend {
        boot_id: "b00t",
        usd,
        tokens,
        cache_read,
    };
    let (id1, s1) = s
        .record_with_spend(&row, &spend(Some(0.01), 110, 50), &[], None)
        .unwrap();
    let (_, s2) = s
        .record_with_spend(&row, &spend(None, 5, 0), &[], None)
        .unwrap();
    assert_eq!(s1.key, format!("b00t:{id1}"));
    drop(s);
    // A new boot of the harness finds both, oldest first, keys unchanged.
    let s = Stats::open(&path).unwrap();
    assert_eq!(s.unacked_spend(10).unwrap(), vec![s1.clone(), s2.clone()]);
    assert_eq!(s.unacked_spend(1).unwrap(), vec![s1.clone()], "bounded");
    s.spend_acked(std::slice::from_ref(&s1.key)).unwrap();
    assert_eq!(s.unacked_spend(10).unwrap(), vec![s2.clone()]);
    assert_eq!(s2.usd, None, "a run of unknown cost stays unknown");
    assert_eq!(rows(&path, "turns").len(), before.len() + 2);
}

/// Step 4 of turn-stats.db: the messages the harness let go. The previous
/// release's file (schema 3, `turn-stats-v3.db`) opens with every run, its
/// spend row and whether the broker acknowledged it unchanged, and no message
/// recorded; a run that lets its message go is then found again after a
/// reopening, and only that message.
#[test]
fn the_previous_releases_turn_stats_gain_the_messages_let_go() {
    let dir = TempDir::new("mig");
    let path = copy_fixture("turn-stats-v3.db", dir.path(), turnstats::FILE);
    {
        let c = Connection::open(&path).unwrap();
        assert_eq!(schema::version(&c).unwrap(), 3);
    }
    let before = rows(&path, "turns");
    assert_eq!(before.len(), 6, "the fixture as its README describes it");
    let s = Stats::open(&path).unwrap();
    let c = Connection::open(&path).unwrap();
    assert_eq!(schema::version(&c).unwrap(), turnstats::STEPS.len() as u32);
    assert_eq!(turnstats::STEPS.last().unwrap().version, 4);
    assert_eq!(rows(&path, "turns"), before, "every run, every column");
    assert!(rows(&path, "completed").is_empty());
    let keys: Vec<String> = s
        .unacked_spend(10)
        .unwrap()
        .into_iter()
        .map(|r| r.key)
        .collect();
    assert_eq!(keys, ["f1x7ure0:5", "f1x7ure0:6"], "still to be sent");

    let message = |id: i64, body: &str| {
        let m: hyperhive::proto::Message = serde_json::from_value(serde_json::json!({
            "id": id, "from": "operator", "to": "ana", "body": body, "sent_at": 1_795_400_400,
        }))
        .unwrap();
        MessageKey::of(&m)
    };
    // Message 43 ran and was let go; nothing else was.
    let run = stats::TurnRow {
        id: 0,
        started_at: 1_795_400_500,
        duration_ms: 1500,
        kind: "turn".into(),
        outcome: "ok".into(),
        model: "m".into(),
        sender: "operator".into(),
        message_id: Some(43),
        context_tokens: None,
        tokens_in: 1,
        tokens_out: 1,
        cost_usd: 0.0,
        session_id: None,
        note: String::new(),
    };
    let spend = Spend {
        boot_id: "b00t",
        usd: None,
        tokens: 2,
        cache_read: 0,
    };
    let done = message(43, "ship it");
    s.record_with_spend(&run, &spend, &[], Some(&done)).unwrap();
    drop(s);
    let s = Stats::open(&path).unwrap();
    assert_eq!(s.completed(&done).unwrap().as_deref(), Some("ok"));
    assert_eq!(s.completed(&message(43, "another body")).unwrap(), None);
    assert_eq!(s.completed(&message(41, "ship it")).unwrap(), None);
    assert_eq!(rows(&path, "turns").len(), 7);
    assert_intact(&c);
}

/// The text in `swarm_meta` under `key`, in rows of that table.
fn meta_text(meta: &[Vec<Value>], key: &str) -> String {
    let row = meta
        .iter()
        .find(|r| r[0] == Value::Text(key.into()))
        .unwrap_or_else(|| panic!("no {key} in {meta:?}"));
    match &row[1] {
        Value::Text(t) => t.clone(),
        other => panic!("{key}: {other:?}"),
    }
}

/// Step 13 (issue 40) on the store of the release before it, a hive in a
/// swarm: every message and question stays; each outbox row, sent or
/// pending, keeps the one instance id that release made with `broker.db`
/// (so a pending event goes out under the transaction id it had), and the
/// inbound log and the question mirror are keyed by the instance of hive two
/// that release kept, which is now the latest of two's remembered
/// instances. A real broker then serves the store: the pending events under
/// the old instance, new mail under the start's own, hive two's event seen
/// before a replay, and the same id under another instance of two new.
#[test]
fn a_version_12_swarm_store_keeps_every_event_id_through_step_13() {
    use hyperhive::proto::cmd::{
        BridgeDeliver, BridgeDeliverReply, BridgeHello, BridgeHelloReply, BridgeNext,
        BridgeNextReply, EventKind, Inbound, Send,
    };
    let dir = TempDir::new("mig-v12");
    let path = copy_fixture("broker-v12.db", dir.path(), db::FILE);
    let kept = ["messages", "questions", "agents", "sqlite_sequence"];
    let before: Vec<_> = kept.iter().map(|t| rows(&path, t)).collect();
    assert_eq!(before[0].len(), 5, "the fixture as its README describes it");
    let (outbox, inbound, mirrors) = (
        rows(&path, "outbox"),
        rows(&path, "inbound"),
        rows(&path, "question_mirrors"),
    );
    assert_eq!((outbox.len(), inbound.len(), mirrors.len()), (3, 2, 1));
    let meta = rows(&path, "swarm_meta");
    let old = meta_text(&meta, "instance");
    let peer = meta_text(&meta, "peer_instance:two");
    {
        let c = Connection::open(&path).unwrap();
        assert_eq!(schema::version(&c).unwrap(), 12);
    }

    let store = Db::open(&path, Durability::Normal).unwrap();
    let c = Connection::open(&path).unwrap();
    // Migrated through step 13 and every later one (step 14: timers).
    assert_eq!(
        schema::version(&c).unwrap(),
        db::MIGRATIONS.last().unwrap().version
    );
    assert!(db::MIGRATIONS.iter().any(|s| s.version == 13));
    for (t, old) in kept.iter().zip(&before) {
        let mut now = kept_rows(&path, t);
        if *t == "messages" {
            step_16_off(&mut now);
        }
        assert_eq!(&now, old, "{t}");
    }
    // The outbox: every column, then the instance and no question instance
    // (none of the rows answers or withdraws a question).
    let want: Vec<Vec<Value>> = outbox
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.extend([Value::Text(old.clone()), Value::Null]);
            r
        })
        .collect();
    assert_eq!(rows(&path, "outbox"), want);
    let want: Vec<Vec<Value>> = inbound
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r.insert(1, Value::Text(peer.clone()));
            r
        })
        .collect();
    assert_eq!(rows(&path, "inbound"), want, "keyed by two's instance");
    let mut mirror = mirrors[0].clone();
    mirror.insert(2, Value::Text(peer.clone()));
    assert_eq!(rows(&path, "question_mirrors"), [mirror]);
    assert_eq!(
        store.peer_instances("two").unwrap(),
        std::slice::from_ref(&peer)
    );
    assert_eq!(
        rows(&path, "swarm_meta"),
        [vec![
            Value::Text("next_batch".into()),
            Value::Text("s1_fixture".into())
        ]],
        "the one instance id is gone: each start makes its own"
    );
    let shape: Vec<usize> = store.instance().split('-').map(str::len).collect();
    assert_eq!(shape, [8, 4, 4, 4, 12], "a uuid: {}", store.instance());
    assert!(store.instance()[14..].starts_with('4'), "version 4");
    assert_ne!(store.instance(), old);
    assert_intact(&c);
    drop((store, c));

    let b = broker_on_v12();
    let mut br = hyperhive::proto::Client::connect(&b.run_dir().join("bridge.sock")).unwrap();
    br.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let hello: BridgeHelloReply = br.call(&BridgeHello {}).unwrap();
    assert_ne!(hello.instance, old);
    ok(
        &mut b.agent("ana"),
        Send {
            to: "b@two".into(),
            body: "third out".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    let next: BridgeNextReply = br.call(&BridgeNext { wait_seconds: None }).unwrap();
    let got: Vec<(i64, &str)> = next
        .events
        .iter()
        .map(|e| (e.id, e.instance.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (2, old.as_str()),
            (3, old.as_str()),
            (6, hello.instance.as_str())
        ],
        "the pending events keep their instance; new mail has the start's"
    );
    let from_two = |instance: &str| Inbound {
        origin: "two".into(),
        id: "5".into(),
        kind: EventKind::Message,
        from: "b".into(),
        to: "ana".into(),
        body: "hello from two".into(),
        in_reply_to: None,
        question: None,
        ref_instance: None,
        options: vec![],
        multi: false,
        reply_to_event: None,
        sent_at: hyperhive::proto::now(),
        instance: Some(instance.into()),
        reason: None,
    };
    let r: BridgeDeliverReply = br
        .call(&BridgeDeliver {
            events: vec![
                from_two(&peer),
                from_two("3333aaaa-0000-4000-8000-000000000003"),
            ],
            next_batch: Some("s2".into()),
        })
        .unwrap();
    assert_eq!((r.delivered, r.duplicates), (1, 1));
}

/// Step 16 (issue 43, receipts) on the previous release's store
/// (`broker-v12.db`): its messages gain no hand-out (none is known), the
/// sender index and an empty table of pruned ids come, and a real broker
/// reads each old row's state from it: ana's mail to hive two posted
/// (with its event id) or still with the bridge, the message from two queued
/// first in ana's queue, and not ana's to read.
#[test]
fn the_previous_releases_store_reads_message_states_through_step_16() {
    use hyperhive::proto::cmd::{MessageState, MessageStateReply, Where};
    let dir = TempDir::new("mig-v12-receipts");
    let path = copy_fixture("broker-v12.db", dir.path(), db::FILE);
    let before = rows(&path, "messages");
    {
        let store = Db::open(&path, Durability::Normal).unwrap();
        let c = Connection::open(&path).unwrap();
        assert!(schema::version(&c).unwrap() >= 16);
        let mut now = rows(&path, "messages");
        step_16_off(&mut now);
        assert_eq!(now, before, "every row, every column");
        assert_eq!(message_objects(&c), STEP_12_OBJECTS);
        assert!(rows(&path, "pruned_messages").is_empty());
        let row = store.sent_row(1).unwrap().unwrap();
        assert_eq!((row.message.from.as_str(), row.handed_at), ("ana", None));
        assert_eq!(store.pruned_sender(1).unwrap(), None);
        assert_intact(&c);
    }

    let b = broker_on_v12();
    let mut ana = b.agent("ana");
    let s: MessageStateReply = ana.call(&MessageState { id: 1 }).unwrap();
    assert_eq!(
        (s.state, s.event_id.as_deref()),
        (Where::Posted, Some("$fixture-sent-1"))
    );
    let s: MessageStateReply = ana.call(&MessageState { id: 2 }).unwrap();
    assert_eq!(s.state, Where::HandedToBridge);
    let e = common::hive::refused(&mut ana, MessageState { id: 4 });
    assert_eq!(e, "message #4: not a message you sent");
    let s: MessageStateReply = b.host().call(&MessageState { id: 4 }).unwrap();
    assert_eq!((s.state, s.position), (Where::Queued, Some(1)));
    assert_eq!(
        s.text,
        "message #4 to ana: queued, position 1 in ana's queue"
    );
}

/// Step 18 (issue 43, notifications) on the previous release's store
/// (`broker-v12.db`): every message stays as it was, the outbox and the
/// destinations' queues come empty, the old rows raise no event, and the
/// triggers write one for a new message to the operator only once a
/// destination is registered, in the message's own transaction.
#[test]
fn the_previous_releases_store_gains_the_notify_outbox_through_step_18() {
    let dir = TempDir::new("mig-v12-notify");
    let path = copy_fixture("broker-v12.db", dir.path(), db::FILE);
    let before = rows(&path, "messages");
    let store = Db::open(&path, Durability::Normal).unwrap();
    let c = Connection::open(&path).unwrap();
    assert!(schema::version(&c).unwrap() >= 18);
    let mut now = rows(&path, "messages");
    step_16_off(&mut now);
    assert_eq!(now, before, "every row, every column");
    assert!(
        rows(&path, "notify_events").is_empty(),
        "old rows raise none"
    );
    assert!(rows(&path, "notify_dests").is_empty());
    assert_intact(&c);

    let ana = Peer::Agent("ana".into());
    let to_operator = db::NewMessage {
        from: &ana,
        to: "operator",
        body: "done with the migration",
        kind: &MsgKind::Message,
        in_reply_to: None,
        receipt: false,
        traceparent: None,
    };
    store.insert_message(&to_operator, 1_800_000_000).unwrap();
    assert!(
        rows(&path, "notify_events").is_empty(),
        "no destination, no event"
    );

    let sender = db::NotifyConn::open(&path, Durability::Normal).unwrap();
    let events = vec!["message_to_operator".to_string()];
    sender
        .register(&[db::DestRow {
            dest: "d1",
            shown: "http://127.0.0.1:9",
            format: "json",
            events: &events,
        }])
        .unwrap();
    assert_eq!(sender.next("d1").unwrap(), None, "a new queue starts empty");
    let id = store.insert_message(&to_operator, 1_800_000_001).unwrap();
    store
        .insert_message(&operator_mail("ana", "not for the operator"), 1_800_000_002)
        .unwrap();
    let (ev, attempts, _) = sender.next("d1").unwrap().expect("an event");
    assert_eq!(
        (
            ev.event.as_str(),
            ev.agent.as_str(),
            ev.msg_id,
            ev.at,
            attempts
        ),
        ("message_to_operator", "ana", Some(id), 1_800_000_001, 0)
    );
    assert_eq!(ev.text, "done with the migration");
    assert!(
        ev.uid.starts_with("evt_") && ev.uid.len() == 28,
        "{}",
        ev.uid
    );
    sender.delivered("d1", ev.id, 1_800_000_005).unwrap();
    assert_eq!(sender.next("d1").unwrap(), None);
    let st = store.notify_states().unwrap();
    assert_eq!((st[0].delivered, st[0].pending), (1, 0));
    assert_intact(&c);
}

/// A broker of hive `one` (ana, bob, a Matrix section) restarted onto the
/// previous release's store (`broker-v12.db`).
fn broker_on_v12() -> Broker {
    let config = r##"{
      "hive_name": "one",
      "agents": [{"name": "ana"}, {"name": "bob"}],
      "matrix": {
        "homeserver": "http://127.0.0.1:9",
        "user_id": "@hive-one-bridge:hive.test",
        "password_file": "/nonexistent/pw",
        "room": "#swarm:hive.test",
        "peers": {"two": "@hive-two-bridge:hive.test"}
      }
    }"##;
    let mut b = Broker::start_config(config);
    b.terminate();
    for f in ["broker.db", "broker.db-wal", "broker.db-shm"] {
        let _ = std::fs::remove_file(b.state_dir().join(f));
    }
    copy_fixture("broker-v12.db", &b.state_dir(), db::FILE);
    b.restart();
    b
}

/// Step 17 (issue 43): a store of the release before it (schema 16: the
/// previous release's fixture migrated to 16, steps 17 and 18 not there)
/// gains the `traceparent` column (and step 18's outbox), every old row without one, and keeps
/// every row; a message stored then carries its traceparent.
#[test]
fn a_version_16_store_gains_the_traceparent_of_each_message_through_step_17() {
    let dir = TempDir::new("mig-v16");
    let path = copy_fixture("broker-v12.db", dir.path(), db::FILE);
    drop(Db::open(&path, Durability::Normal).unwrap());
    {
        // Back to the schema release 16 wrote: no step 17, and no step 18
        // (the notification outbox, which came with it).
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "DROP TRIGGER notify_on_message; DROP TRIGGER notify_on_question;
             DROP TRIGGER notify_on_dead_letter; DROP TRIGGER notify_on_dead_letter_insert;
             DROP TABLE notify_events; DROP TABLE notify_dests;
             DELETE FROM sqlite_sequence WHERE name = 'notify_events';
             ALTER TABLE messages DROP COLUMN traceparent; PRAGMA user_version = 16;",
        )
        .unwrap();
        assert_eq!(schema::version(&c).unwrap(), 16);
    }
    let before = rows(&path, "messages");
    let store = Db::open(&path, Durability::Normal).unwrap();
    let c = Connection::open(&path).unwrap();
    assert_eq!(schema::version(&c).unwrap(), 18);
    assert_eq!(db::MIGRATIONS.last().unwrap().version, 18);
    let mut now = rows(&path, "messages");
    for r in now.iter_mut() {
        assert_eq!(r.pop(), Some(Value::Null), "an old row has no traceparent");
    }
    assert_eq!(now, before, "every row, every column");
    assert_eq!(store.traceparent(1).unwrap(), None);
    let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = db::NewMessage {
        traceparent: Some(tp),
        ..operator_mail("ana", "traced")
    };
    let id = store.insert_message(&traced, 100).unwrap();
    assert_eq!(store.traceparent(id).unwrap().as_deref(), Some(tp));
    assert_eq!(store.traceparent(id + 100).unwrap(), None);
    assert_intact(&c);
}
