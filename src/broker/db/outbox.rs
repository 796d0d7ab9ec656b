//! The notifications' outbox in `broker.db` (issue 43, item 3; schema step
//! 18): `notify_events`, one row per event that needs the operator, and
//! `notify_dests`, one queue per configured destination (a cursor over the
//! events, its retry state, its last success and error, and its counters).
//!
//! Events are written by triggers, so each is committed **in the same
//! transaction as its cause** whichever statement of the hub causes it: a
//! message to the operator (`message_to_operator`, and the hive's notices
//! `approval`, `budget`, `usage_limit`), a question to the operator
//! (`question`), a message dead-lettered (`dead_letter`). The hub writes
//! the events whose cause is no row itself: `needs_login` (a harness
//! reported its login pause), `agent_crashed` (told by the supervisor of
//! `hive up`) and `test` (`hive notify test`).
//! No trigger writes while no destination is configured.
//!
//! A destination's queue is everything after its cursor that it takes, in
//! id order; the sender thread (`broker/notify`) moves the cursor only
//! after a delivery was accepted (or dropped after `notify.give_up_days`),
//! on its own connection ([`NotifyConn`]), so a broker killed at any point
//! sends each event again at worst (at-least-once). Pruning
//! (`retention.rs`) deletes an event only once every destination's cursor
//! is past it.

use super::{Durability, Res};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;

/// Schema step 18. Each trigger's `WHEN` tests the row's own columns
/// first, so the message path (every insert, every state change) pays one
/// comparison or two, and the look at `notify_dests` only for a row that
/// could raise an event.
pub(super) const SCHEMA_V18: &str = "
CREATE TABLE notify_events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    uid TEXT NOT NULL,
    event TEXT NOT NULL,
    agent TEXT NOT NULL,
    msg_id INTEGER,
    text TEXT NOT NULL,
    at INTEGER NOT NULL
);
CREATE INDEX notify_events_at ON notify_events (at);
CREATE TABLE notify_dests (
    dest TEXT PRIMARY KEY,
    shown TEXT NOT NULL,
    format TEXT NOT NULL,
    events TEXT NOT NULL,
    cursor INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at_ms INTEGER NOT NULL DEFAULT 0,
    last_ok_at INTEGER,
    last_error TEXT,
    last_error_at INTEGER,
    delivered INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    dropped INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE TRIGGER notify_on_message AFTER INSERT ON messages
WHEN NEW.recipient = 'operator'
    AND (NEW.kind = 'message' OR NEW.kind = 'approval_requested'
         OR NEW.kind = 'budget' OR NEW.kind = 'usage_limit')
    AND NEW.state != 'failed' AND EXISTS (SELECT 1 FROM notify_dests)
BEGIN
    INSERT INTO notify_events (uid, event, agent, msg_id, text, at) VALUES (
        'evt_' || lower(hex(randomblob(12))),
        CASE NEW.kind WHEN 'message' THEN 'message_to_operator'
                      WHEN 'approval_requested' THEN 'approval' ELSE NEW.kind END,
        NEW.sender, NEW.id,
        substr(NEW.body, 1, CASE NEW.kind WHEN 'message' THEN 65536 ELSE 2000 END),
        NEW.sent_at);
END;
CREATE TRIGGER notify_on_question AFTER INSERT ON questions
WHEN NEW.target = 'operator' AND EXISTS (SELECT 1 FROM notify_dests)
BEGIN
    INSERT INTO notify_events (uid, event, agent, msg_id, text, at) VALUES (
        'evt_' || lower(hex(randomblob(12))), 'question', NEW.asker, NULL,
        'question #' || NEW.id || ': ' || substr(NEW.question, 1, 2000), NEW.asked_at);
END;
CREATE TRIGGER notify_on_dead_letter AFTER UPDATE OF state ON messages
WHEN NEW.state = 'failed' AND OLD.state != 'failed' AND EXISTS (SELECT 1 FROM notify_dests)
BEGIN
    INSERT INTO notify_events (uid, event, agent, msg_id, text, at) VALUES (
        'evt_' || lower(hex(randomblob(12))), 'dead_letter', NEW.recipient, NEW.id,
        'message #' || NEW.id || ' from ' || NEW.sender || ' to ' || NEW.recipient
            || ' dead-lettered: ' || substr(COALESCE(NEW.last_error, ''), 1, 2000),
        COALESCE(NEW.done_at, NEW.sent_at));
END;
CREATE TRIGGER notify_on_dead_letter_insert AFTER INSERT ON messages
WHEN NEW.state = 'failed' AND EXISTS (SELECT 1 FROM notify_dests)
BEGIN
    INSERT INTO notify_events (uid, event, agent, msg_id, text, at) VALUES (
        'evt_' || lower(hex(randomblob(12))), 'dead_letter', NEW.recipient, NEW.id,
        'message #' || NEW.id || ' from ' || NEW.sender || ' to ' || NEW.recipient
            || ' dead-lettered: ' || substr(COALESCE(NEW.last_error, ''), 1, 2000),
        COALESCE(NEW.done_at, NEW.sent_at));
END;
";

/// The events of `notify_events` a destination with events `events` (a
/// comma list, `?N`) takes after its cursor: its own, and every `test`.
const TAKES: &str =
    "(e.event = 'test' OR instr(',' || d.events || ',', ',' || e.event || ',') > 0)";

/// One event as the sender reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotifyEvent {
    pub id: i64,
    /// The webhook id: stable across tries and restarts.
    pub uid: String,
    pub event: String,
    /// The agent it is about, or who sent it (`system` for the hive's own
    /// notices, `operator` for a test).
    pub agent: String,
    pub msg_id: Option<i64>,
    pub text: String,
    pub at: i64,
}

/// One destination's queue as `hive notify status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestState {
    pub dest: String,
    pub shown: String,
    pub format: String,
    pub events: String,
    pub pending: u64,
    pub attempts: u64,
    pub next_at_ms: i64,
    pub last_ok_at: Option<i64>,
    pub last_error: Option<String>,
    pub last_error_at: Option<i64>,
    pub delivered: u64,
    pub failed: u64,
    pub dropped: u64,
}

/// Makes the queues those of `dests`, in one transaction: a queue no
/// longer configured goes (its pending events with it), a new one
/// starts after the last event stored, a kept one resumes where it was.
fn register(conn: &Connection, dests: &[DestRow]) -> Res<()> {
    let tx = conn.unchecked_transaction()?;
    let keep: Vec<&str> = dests.iter().map(|d| d.dest).collect();
    {
        let mut all = tx.prepare("SELECT dest FROM notify_dests")?;
        let have: Vec<String> = all
            .query_map([], |r| r.get(0))?
            .collect::<Res<Vec<String>>>()?;
        for d in have.iter().filter(|d| !keep.contains(&d.as_str())) {
            tx.execute("DELETE FROM notify_dests WHERE dest = ?1", params![d])?;
        }
    }
    for d in dests {
        tx.execute(
            "INSERT INTO notify_dests (dest, shown, format, events, cursor)
             VALUES (?1, ?2, ?3, ?4, (SELECT COALESCE(MAX(id), 0) FROM notify_events))
             ON CONFLICT (dest) DO UPDATE SET shown = excluded.shown,
                format = excluded.format, events = excluded.events",
            params![d.dest, d.shown, d.format, d.events.join(",")],
        )?;
    }
    if dests.is_empty() {
        // Nothing will send them: the stored events go.
        tx.execute("DELETE FROM notify_events", [])?;
    }
    tx.commit()
}

fn dest_states(conn: &Connection) -> Res<Vec<DestState>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT d.dest, d.shown, d.format, d.events,
            (SELECT COUNT(*) FROM notify_events e WHERE e.id > d.cursor AND {TAKES}),
            d.attempts, d.next_at_ms, d.last_ok_at, d.last_error, d.last_error_at,
            d.delivered, d.failed, d.dropped
         FROM notify_dests d ORDER BY d.shown, d.dest"
    ))?;
    let rows = stmt.query_map([], |r| {
        let n = |i| r.get::<_, i64>(i).map(|v| v.max(0) as u64);
        Ok(DestState {
            dest: r.get(0)?,
            shown: r.get(1)?,
            format: r.get(2)?,
            events: r.get(3)?,
            pending: n(4)?,
            attempts: n(5)?,
            next_at_ms: r.get(6)?,
            last_ok_at: r.get(7)?,
            last_error: r.get(8)?,
            last_error_at: r.get(9)?,
            delivered: n(10)?,
            failed: n(11)?,
            dropped: n(12)?,
        })
    })?;
    rows.collect()
}

impl super::Db {
    /// Records an event the hub notices itself (`agent_crashed`, `test`),
    /// when a destination is configured; its id, if one was written.
    pub fn notify_event(&self, event: &str, agent: &str, text: &str, now: i64) -> Res<Option<i64>> {
        let n = self
            .conn
            .prepare_cached(
                "INSERT INTO notify_events (uid, event, agent, msg_id, text, at)
             SELECT 'evt_' || lower(hex(randomblob(12))), ?1, ?2, NULL, substr(?3, 1, 2000), ?4
             WHERE EXISTS (SELECT 1 FROM notify_dests)",
            )?
            .execute(params![event, agent, text, now])?;
        Ok((n == 1).then(|| self.conn.last_insert_rowid()))
    }

    /// Makes the queues those of `dests` ([`register`]): `hive reload`
    /// changed the `notify` block, and a command after its answer sees them.
    pub fn notify_register(&self, dests: &[DestRow]) -> Res<()> {
        register(&self.conn, dests)
    }

    /// Every destination's queue (a read).
    pub fn notify_states(&self) -> Res<Vec<DestState>> {
        dest_states(&self.conn)
    }
}

/// The sender thread's connection to `broker.db`: it reads the queues and
/// writes each destination's progress, never on the hub's thread.
pub struct NotifyConn {
    conn: Connection,
}

/// One destination to register: its key, how it is shown, its format and
/// the events it takes.
pub struct DestRow<'a> {
    pub dest: &'a str,
    pub shown: &'a str,
    pub format: &'a str,
    pub events: &'a [String],
}

impl NotifyConn {
    /// Opens the store at `path`, which the broker opened and migrated
    /// already (as `Pruner::open` does: a busy timeout, no checkpoints of
    /// its own).
    pub fn open(path: &Path, durability: Durability) -> Result<NotifyConn, String> {
        let mut conn = Connection::open(path)
            .map_err(|e| format!("cannot open {} for notifications: {e}", path.display()))?;
        conn.set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
        let sync = match durability {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        };
        conn.execute_batch(&format!(
            "PRAGMA busy_timeout=5000; PRAGMA synchronous={sync}; PRAGMA wal_autocheckpoint=0;"
        ))
        .map_err(|e| format!("cannot prepare {} for notifications: {e}", path.display()))?;
        Ok(NotifyConn { conn })
    }

    /// Makes the queues those of `dests` ([`register`]).
    pub fn register(&self, dests: &[DestRow]) -> Res<()> {
        register(&self.conn, dests)
    }

    /// The next event of `dest`'s queue, and the failed tries of it so far.
    pub fn next(&self, dest: &str) -> Res<Option<(NotifyEvent, u64, i64)>> {
        self.conn
            .prepare_cached(&format!(
                "SELECT e.id, e.uid, e.event, e.agent, e.msg_id, e.text, e.at,
                        d.attempts, d.next_at_ms
                 FROM notify_dests d JOIN notify_events e ON e.id > d.cursor AND {TAKES}
                 WHERE d.dest = ?1 ORDER BY e.id LIMIT 1"
            ))?
            .query_row(params![dest], |r| {
                Ok((
                    NotifyEvent {
                        id: r.get(0)?,
                        uid: r.get(1)?,
                        event: r.get(2)?,
                        agent: r.get(3)?,
                        msg_id: r.get(4)?,
                        text: r.get(5)?,
                        at: r.get(6)?,
                    },
                    r.get::<_, i64>(7)?.max(0) as u64,
                    r.get(8)?,
                ))
            })
            .optional()
    }

    /// Event `id` was accepted by `dest` at `now`: its cursor moves past it.
    pub fn delivered(&self, dest: &str, id: i64, now: i64) -> Res<()> {
        self.conn
            .prepare_cached(
                "UPDATE notify_dests SET cursor = ?2, attempts = 0, next_at_ms = 0,
                    last_ok_at = ?3, delivered = delivered + 1
                 WHERE dest = ?1 AND cursor < ?2",
            )?
            .execute(params![dest, id, now])?;
        Ok(())
    }

    /// A try of `dest`'s next event failed with `error`; the next try is at
    /// `next_at_ms`.
    pub fn failed(&self, dest: &str, error: &str, now: i64, next_at_ms: i64) -> Res<()> {
        self.conn
            .prepare_cached(
                "UPDATE notify_dests SET attempts = attempts + 1, failed = failed + 1,
                    last_error = ?2, last_error_at = ?3, next_at_ms = ?4
                 WHERE dest = ?1",
            )?
            .execute(params![dest, error, now, next_at_ms])?;
        Ok(())
    }

    /// Event `id` was given up on (`notify.give_up_days`): the cursor moves
    /// past it and it is counted.
    pub fn dropped(&self, dest: &str, id: i64, why: &str, now: i64) -> Res<()> {
        self.conn
            .prepare_cached(
                "UPDATE notify_dests SET cursor = ?2, attempts = 0, next_at_ms = 0,
                    dropped = dropped + 1, last_error = ?3, last_error_at = ?4
                 WHERE dest = ?1 AND cursor < ?2",
            )?
            .execute(params![dest, id, why, now])?;
        Ok(())
    }

    /// Every destination's queue (a read).
    pub fn states(&self) -> Res<Vec<DestState>> {
        dest_states(&self.conn)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Db, NewMessage};
    use super::*;
    use crate::proto::{MsgKind, Peer};

    struct Dir(std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A fresh store with one destination taking `events`.
    fn store(tag: &str, events: &[&str]) -> (Dir, Db, NotifyConn) {
        let dir = std::env::temp_dir().join(format!("hive-outbox-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("b.db");
        let db = Db::open(&path, Durability::Normal).unwrap();
        let n = NotifyConn::open(&path, Durability::Normal).unwrap();
        let events: Vec<String> = events.iter().map(|e| e.to_string()).collect();
        n.register(&[DestRow {
            dest: "d",
            shown: "http://h",
            format: "json",
            events: &events,
        }])
        .unwrap();
        (Dir(dir), db, n)
    }

    fn tell(db: &Db, from: &Peer, to: &str, kind: MsgKind, body: &str) -> i64 {
        db.insert_message(
            &NewMessage {
                from,
                to,
                body,
                kind: &kind,
                in_reply_to: None,
                receipt: false,
                traceparent: None,
            },
            100,
        )
        .unwrap()
    }

    /// Every event of `d`'s queue, marking each delivered.
    fn drain(n: &NotifyConn) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while let Some((e, _, _)) = n.next("d").unwrap() {
            n.delivered("d", e.id, 1).unwrap();
            out.push((e.event, e.agent));
        }
        out
    }

    #[test]
    fn each_cause_writes_its_event_and_other_rows_none() {
        let all: Vec<&str> = crate::config::notify::EVENTS.to_vec();
        let (_d, db, n) = store("causes", &all);
        let ana = Peer::Agent("ana".into());
        tell(
            &db,
            &Peer::System,
            "operator",
            MsgKind::ApprovalRequested,
            "[approval #1] spawn",
        );
        tell(
            &db,
            &Peer::System,
            "operator",
            MsgKind::Budget,
            "[budget] 80 %",
        );
        tell(
            &db,
            &Peer::System,
            "operator",
            MsgKind::UsageLimit,
            "pool p parked",
        );
        tell(&db, &ana, "operator", MsgKind::Message, "hello");
        // None of these is for the operator to act on.
        tell(&db, &Peer::System, "ana", MsgKind::Budget, "[budget] yours");
        tell(&db, &ana, "bob", MsgKind::Message, "between agents");
        tell(&db, &Peer::System, "operator", MsgKind::CliVersion, "cli");
        tell(
            &db,
            &Peer::System,
            "operator",
            MsgKind::QuestionAnswered,
            "yes",
        );
        db.insert_question("ana", &Peer::Operator, "ship?", &[], false, 100, None)
            .unwrap();
        db.insert_question(
            "ana",
            &Peer::Agent("bob".into()),
            "bob?",
            &[],
            false,
            100,
            None,
        )
        .unwrap();
        // Bob's first mail (ana's) is dead-lettered.
        let (taken, _) = db.take_next("bob", true).unwrap();
        let id = taken.unwrap().message.id;
        assert!(db
            .dead_letter(id, "bob", "it failed", true, 101, &[])
            .unwrap());
        db.notify_event("agent_crashed", "bob", "exited", 102)
            .unwrap();
        assert_eq!(
            drain(&n),
            [
                ("approval", "system"),
                ("budget", "system"),
                ("usage_limit", "system"),
                ("message_to_operator", "ana"),
                ("question", "ana"),
                ("dead_letter", "bob"),
                ("agent_crashed", "bob"),
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
    }

    #[test]
    fn a_queue_takes_its_events_and_tests_and_pruning_keeps_the_pending() {
        let (_d, db, n) = store("filter", &["question"]);
        let ana = Peer::Agent("ana".into());
        tell(&db, &ana, "operator", MsgKind::Message, "not taken");
        db.insert_question("ana", &Peer::Operator, "taken?", &[], false, 100, None)
            .unwrap();
        db.notify_event("test", "operator", "t", 100).unwrap();
        let st = db.notify_states().unwrap();
        assert_eq!(st[0].pending, 2, "the question and the test");
        let (first, attempts, _) = n.next("d").unwrap().unwrap();
        assert_eq!((first.event.as_str(), attempts), ("question", 0));
        n.failed("d", "HTTP 503", 100, 5).unwrap();
        let (again, attempts, next_at) = n.next("d").unwrap().unwrap();
        assert_eq!((again.id, attempts, next_at), (first.id, 1, 5));
        n.dropped("d", first.id, "gave up", 200).unwrap();
        let st = db.notify_states().unwrap();
        assert_eq!((st[0].dropped, st[0].failed, st[0].pending), (1, 1, 1));
        // Pruning by age leaves what a queue still holds.
        let path = _d.0.join("b.db");
        let p = super::super::Pruner::open(&path, Durability::Normal).unwrap();
        assert_eq!(
            p.delete_notify_events(i64::MAX, 100).unwrap(),
            2,
            "the message and the question"
        );
        let (last, _, _) = n.next("d").unwrap().unwrap();
        assert_eq!(last.event, "test", "pending: kept");
        n.delivered("d", last.id, 300).unwrap();
        assert_eq!(p.delete_notify_events(i64::MAX, 100).unwrap(), 1);
        // Unregistered, a queue's events go and no trigger writes more.
        n.register(&[]).unwrap();
        tell(&db, &ana, "operator", MsgKind::Message, "nobody listens");
        assert_eq!(db.notify_event("test", "operator", "t", 1).unwrap(), None);
        assert!(db.notify_states().unwrap().is_empty());
    }
}
