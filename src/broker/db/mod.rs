//! The broker's sqlite store: the connection, its pragmas and the [`Store`]
//! the hub sees it through. A `Db` is owned by the hub thread alone (opened
//! before it starts, then moved in; the connection is never shared between
//! threads); each method is one short transaction, so an answer the broker
//! sends after a write is an answer about committed data. The [`Store`]
//! holds the statements on every message's path prepared, and the `Db` keeps
//! the queues' tail without reading it (`Queues`). The statements live by
//! concern, as the hub's handlers do: the schema's steps, `migrations.rs`
//! ([`MIGRATIONS`], `PRAGMA user_version`, `proto::schema`); messages and
//! what `message_state` reads of them,
//! `messages.rs`; per agent, `agents.rs`; questions, `questions.rs`;
//! reminders, scheduled prompts and the operator's view of them,
//! `timers.rs`; approvals, `approvals.rs`; credential pools, `pools.rs`;
//! spend and budget notices, `spend.rs`; the swarm's outbox and inbox,
//! `swarm.rs`; what retention prunes and each agent's stored bytes,
//! `retention.rs`; the operator's recent activity, `activity.rs`; the page's
//! model override, `models.rs`; agents taken out of the fleet, `fleet.rs`;
//! the notifications' outbox and each destination's queue, `outbox.rs`.

pub use outbox::{DestRow, DestState, NotifyConn, NotifyEvent};
pub use swarm::{new_message, Batch, OutRow, OutboxEntry, PeerInstance, Settle};
pub use timers::Fired;

use crate::proto::cmd::{Bounded, PostTurnCounts};
use crate::proto::schema::{self, Step};
use crate::proto::{
    Approval, ApprovalKind, ApprovalState, FailedMessage, Message, MsgKind, MsgState, Peer,
    Question, Reminder, RunningTask,
};
use rusqlite::{params, Connection, OptionalExtension, Row, Statement};
use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::path::Path;

/// How hard sqlite works to keep a commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// WAL + `synchronous=NORMAL`: survives a crash of any process.
    Normal,
    /// WAL + `synchronous=FULL`: also survives power loss.
    Full,
}

/// The file's name in the broker's state dir.
pub const FILE: &str = "broker.db";

/// A new row for the messages table.
pub struct NewMessage<'a> {
    pub from: &'a Peer,
    pub to: &'a str,
    pub body: &'a str,
    pub kind: &'a MsgKind,
    pub in_reply_to: Option<i64>,
    /// Its sender asked for a receipt once it is acked (issue 43), stored
    /// with the row by the same insert.
    pub receipt: bool,
    /// The W3C `traceparent` the run that handles it links to (issue 43;
    /// validated by the command), stored by the same insert.
    pub traceparent: Option<&'a str>,
}

/// The hub's view of the store: every [`Db`] method, with the statements on
/// every message's path (queue a row, ack one: [`Db::ack`]) prepared once
/// and held here for the life of the hub. rusqlite's statement cache would
/// hash and compare their SQL text on every use and again when the
/// statement goes back (about 3 k instructions each).
/// It borrows the `Db`, so the hub that owns it lives in the frame of the
/// thread that opened it.
pub struct Store<'c> {
    db: &'c Db,
    insert: RefCell<Statement<'c>>,
    transition: RefCell<Statement<'c>>,
}

impl std::ops::Deref for Store<'_> {
    type Target = Db;
    fn deref(&self) -> &Db {
        self.db
    }
}

impl<'c> Store<'c> {
    pub fn new(db: &'c Db) -> Res<Store<'c>> {
        let prepare = |sql| db.conn.prepare(sql).map(RefCell::new);
        Ok(Store {
            db,
            insert: prepare(INSERT_QUEUED)?,
            transition: prepare(TRANSITION)?,
        })
    }

    /// [`Db::insert_message`].
    pub fn insert_message(&self, m: &NewMessage, now: i64) -> Res<i64> {
        self.insert_charged(m, None, now)
    }

    /// [`Db::insert_charged`].
    pub fn insert_charged(&self, m: &NewMessage, charged: Option<&str>, now: i64) -> Res<i64> {
        let held = &mut *self.insert.borrow_mut();
        queue_row_by(&self.db.conn, Some(held), &self.db.queues, m, charged, now)
    }

    /// [`Db::ack`], through the held statement of a transition.
    pub fn ack(
        &self,
        a: Ack,
        receipt: impl FnMut(SentRow) -> Option<(String, String)>,
    ) -> Res<Vec<i64>> {
        let held = &mut *self.transition.borrow_mut();
        self.db.ack_by(Some(held), a, receipt)
    }
}

/// Which side of a question an agent is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Asker,
    Target,
}

pub struct Db {
    /// The hook after each commit ([`Db::on_commit`]); taken off before the
    /// connection closes (`Drop`).
    wal_hook: Option<crate::sys::sqlite::WalHook>,
    conn: Connection,
    queues: Queues,
    /// The agents that may have an inflight row. Only [`Db::take_next`] makes
    /// a row inflight (and at most one per agent), opening the store puts
    /// every inflight row back, and an agent leaves the set only once a
    /// committed write moved its inflight row on; so an agent outside it has
    /// none, and its hand-out needs no look for one.
    inflight: RefCell<BTreeSet<String>>,
    /// The agents that may have receipts riding with a turn not acked yet
    /// (`messages.rs`, [`Db::take_receipts`]); the same kind of hint as
    /// `inflight`, so an ack looks for them only where there may be some.
    riding: RefCell<BTreeSet<String>>,
    /// This start's instance id (`db/swarm.rs`), made at open.
    instance: String,
    /// Answers of reads while nothing changed since (`memo.rs`).
    memo: RefCell<memo::Memo>,
}

type Res<T> = rusqlite::Result<T>;

/// Queues `rows` inside transaction `tx`, each at the next place of the queues.
fn insert_all(
    tx: &rusqlite::Transaction,
    queues: &Queues,
    rows: &[NewMessage],
    now: i64,
) -> Res<()> {
    for m in rows {
        queue_row(tx, queues, m, None, now)?;
    }
    Ok(())
}

/// Queues `m` at the next place of the queues, its body counted in the
/// stored bytes of agent `charged` (step 12's trigger); its id.
fn queue_row(
    conn: &Connection,
    queues: &Queues,
    m: &NewMessage,
    charged: Option<&str>,
    now: i64,
) -> Res<i64> {
    queue_row_by(conn, None, queues, m, charged, now)
}

/// [`queue_row`], through the statement `held` when the hub holds it.
fn queue_row_by(
    conn: &Connection,
    held: Option<&mut Statement>,
    queues: &Queues,
    m: &NewMessage,
    charged: Option<&str>,
    now: i64,
) -> Res<i64> {
    let p = params![
        m.from,
        m.to,
        m.body,
        m.kind,
        m.in_reply_to,
        now,
        queues.next_place(),
        charged,
        m.receipt.then_some(1),
        m.traceparent
    ];
    execute(conn, held, INSERT_QUEUED, p)?;
    Ok(conn.last_insert_rowid())
}

/// Runs `sql` with `p`: through `held` when the hub holds it prepared
/// ([`Store`]), else through rusqlite's statement cache.
fn execute<P: rusqlite::Params>(
    conn: &Connection,
    held: Option<&mut Statement>,
    sql: &str,
    p: P,
) -> Res<usize> {
    match held {
        Some(stmt) => stmt.execute(p),
        None => conn.prepare_cached(sql)?.execute(p),
    }
}

/// One row moved between states (an ack, a hold, a release).
const TRANSITION: &str = "UPDATE messages SET state = ?1, done_at = ?2 \
     WHERE id = ?3 AND recipient = ?4 AND state = ?5";

/// A queued row at a place in the queue, the agent it is charged to, and
/// whether its sender wants a receipt (1, else null).
const INSERT_QUEUED: &str =
    "INSERT INTO messages (sender, recipient, body, kind, in_reply_to, state, sent_at, seq, charged,
        receipt, traceparent)
     VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7, ?8, ?9, ?10)";

/// The tail of the queues, which the one connection that writes `broker.db`
/// keeps without reading it: the last place in the queue handed out (`seq`).
/// A new row, a row moved behind, a dead letter put back each take the next
/// one. Seeded at open with the last place of any row that can still be
/// handed out ([`queue_tail`]); a place taken by a transaction that rolled
/// back is skipped, never reused out of order.
struct Queues {
    tail: Cell<i64>,
}

impl Queues {
    fn new(tail: i64) -> Queues {
        Queues {
            tail: Cell::new(tail),
        }
    }

    fn next_place(&self) -> i64 {
        let n = self.tail.get().saturating_add(1);
        self.tail.set(n);
        n
    }
}

/// The last queue place of the rows that can still be handed out, once
/// opening the store put every inflight and held row back into its queue: the
/// last queued place of each recipient, found through the inbox index one seek
/// at a time. An acked row never returns to a queue, and a dead letter put
/// back takes a new place, so their places need not be passed.
fn queue_tail(conn: &Connection) -> Res<i64> {
    let mut first = conn.prepare("SELECT MIN(recipient) FROM messages")?;
    let mut after = conn.prepare(
        "SELECT recipient FROM messages WHERE recipient > ?1 ORDER BY recipient LIMIT 1",
    )?;
    let mut last =
        conn.prepare("SELECT MAX(seq) FROM messages WHERE recipient = ?1 AND state = 'queued'")?;
    let mut tail = 0;
    let mut recipient: Option<String> = first.query_row([], |r| r.get(0))?;
    while let Some(r) = recipient {
        let seq: Option<i64> = last.query_row([&r], |row| row.get(0))?;
        tail = tail.max(seq.unwrap_or(0));
        recipient = after.query_row([&r], |row| row.get(0)).optional()?;
    }
    Ok(tail)
}

/// The one row mapper of a message: the [`msg_cols!`] columns, first in
/// the statement, as a [`Message`]; a statement's further columns start at
/// [`MSG_N`].
fn message_from_row(row: &Row) -> Res<Message> {
    Ok(Message {
        id: row.get(0)?,
        from: row.get(1)?,
        to: row.get(2)?,
        body: row.get(3)?,
        kind: row.get(4)?,
        in_reply_to: row.get(5)?,
        sent_at: row.get(6)?,
        transient: false,
    })
}

/// The columns [`message_from_row`] reads, as a literal (so the hot
/// statements are `concat!`ed at compile time, not formatted per call).
macro_rules! msg_cols {
    () => {
        "id, sender, recipient, body, kind, in_reply_to, sent_at"
    };
}

/// How many columns [`msg_cols!`] names: the index of a statement's first
/// column after them.
const MSG_N: usize = 7;

/// A count column (attempts) as a count: a stored value out of range (a
/// hand-edited row) is clamped, never an error.
fn count_at(row: &Row, i: usize) -> Res<u32> {
    Ok(row.get::<_, i64>(i)?.clamp(0, u32::MAX as i64) as u32)
}

/// The kind of a receipt row as an SQL literal, for the statements
/// `concat!`ed around it (the partial index `messages_receipts` is on it,
/// and a bound value would not use that index): [`MsgKind::Receipt`],
/// which a test holds it to.
macro_rules! receipt_kind {
    () => {
        "'receipt'"
    };
}

mod activity;
mod agents;
mod approvals;
mod fleet;
mod memo;
mod messages;
mod migrations;
mod models;
mod outbox;
mod pools;
mod questions;
mod retention;
mod spend;
mod swarm;
mod timers;
mod traces;

pub use agents::AgentStats;
pub use messages::{Ack, SentOutbox, SentRow};
pub use migrations::{lost_payload, MIGRATIONS};
pub use retention::{PrunedMessages, Pruner};
pub use spend::SpendTotals;
const MSG_COLS: &str = msg_cols!();

/// A row [`Db::take_next`] handed out.
#[derive(Debug, Clone, PartialEq)]
pub struct Taken {
    pub message: Message,
    /// Its hand-outs, this one included.
    pub attempts: u32,
    /// It was inflight already (handed out again).
    pub was_inflight: bool,
}
impl Db {
    /// Opens (creating when needed) the store at `path`, and puts rows that were
    /// inflight or held when the last broker died back into their inboxes.
    pub fn open(path: &Path, durability: Durability) -> Result<Db, String> {
        let mut conn = Connection::open(path)
            .map_err(|e| format!("cannot open message store {}: {e}", path.display()))?;
        let sync = match durability {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        };
        let setup = format!(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync}; PRAGMA busy_timeout=5000; \
             PRAGMA foreign_keys=ON;"
        );
        conn.execute_batch(&setup)
            .map_err(|e| format!("cannot prepare message store {}: {e}", path.display()))?;
        schema::migrate(&mut conn, &path.display().to_string(), MIGRATIONS)?;
        // Another connection writes too (the prune thread's): a transaction
        // that reads before it writes takes the write lock at its `BEGIN`,
        // or a commit of the other in between would fail it with
        // SQLITE_BUSY_SNAPSHOT, which no busy timeout waits out.
        conn.set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
        conn.execute(
            "UPDATE messages SET state = 'queued' WHERE state IN ('inflight', 'held')",
            [],
        )
        .map_err(|e| format!("cannot requeue interrupted messages: {e}"))?;
        let tail = queue_tail(&conn)
            .map_err(|e| format!("cannot read the queues of {}: {e}", path.display()))?;
        let instance = swarm::fresh_instance(&conn)
            .map_err(|e| format!("cannot make an instance id in {}: {e}", path.display()))?;
        Ok(Db {
            instance,
            wal_hook: None,
            conn,
            queues: Queues::new(tail),
            inflight: RefCell::new(BTreeSet::new()),
            riding: RefCell::new(BTreeSet::new()),
            memo: RefCell::default(),
        })
    }

    /// Calls `hook` after every commit with the frames in the store's log, in
    /// place of sqlite's auto-checkpoint (`checkpoint.rs` checkpoints instead);
    /// `hook` may checkpoint in the commit (`Wal::checkpoint`).
    pub fn on_commit(&mut self, hook: impl FnMut(u32, &crate::sys::sqlite::Wal) + Send + 'static) {
        // The old hook goes first: dropping it puts the auto-checkpoint back,
        // which would replace a new hook set before it.
        self.wal_hook = None;
        self.wal_hook = Some(crate::sys::sqlite::on_wal_commit(&self.conn, hook));
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        // The hook goes before the connection it is set on closes.
        self.wal_hook = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg<'a>(to: &'a str, body: &'a str) -> NewMessage<'a> {
        NewMessage {
            from: &Peer::System,
            to,
            body,
            kind: &MsgKind::Message,
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        }
    }

    /// A database path in a temp dir of this test's own (`tag`), empty; the
    /// dir goes when this is dropped (after the `Db`, declared later).
    struct FreshDb {
        dir: std::path::PathBuf,
        path: std::path::PathBuf,
    }

    impl Drop for FreshDb {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn fresh_db(tag: &str) -> FreshDb {
        let dir = std::env::temp_dir().join(format!("hive-db-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        FreshDb {
            path: dir.join("b.db"),
            dir,
        }
    }

    /// Counters near 2^63 stop there: the next post is taken (not an
    /// `integer overflow` error that freezes them) and adds what fits.
    #[test]
    fn turn_counters_stop_at_the_largest_integer_instead_of_overflowing() {
        let fresh = fresh_db("agent-row-max");
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        let big = PostTurnCounts {
            turns: 1,
            ok: 0,
            failed: 1,
            tokens_in: crate::proto::limits::MAX_TOKENS_PER_POST,
            tokens_out: 5,
            cost_usd: 0.0,
        };
        db.add_counts("zed", &big).unwrap();
        db.conn
            .execute(
                "UPDATE agents SET tokens_in = ?1, turns = ?1 WHERE name = 'zed'",
                [i64::MAX - 10],
            )
            .unwrap();
        db.add_counts("zed", &big).unwrap();
        db.add_counts("zed", &big).unwrap();
        let zed = db.stats("zed").unwrap();
        assert_eq!(
            (zed.tokens_in, zed.turns, zed.turns_failed, zed.tokens_out),
            (i64::MAX as u64, i64::MAX as u64 - 8, 3, 15)
        );
    }

    /// The counters, the status line and the rev land on an agent's row
    /// whether or not it was there before, and add up.
    #[test]
    fn an_agent_row_is_made_by_its_first_update_and_kept_by_the_next() {
        let fresh = fresh_db("agent-row");
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        let counts = PostTurnCounts {
            turns: 1,
            ok: 1,
            failed: 0,
            tokens_in: 10,
            tokens_out: 2,
            cost_usd: 0.25,
        };
        db.add_counts("zed", &counts).unwrap();
        db.add_counts("zed", &counts).unwrap();
        db.set_status("yan", "reviewing", 1_795_000_000).unwrap();
        db.set_rev("xi", "abc123").unwrap();
        let zed = db.stats("zed").unwrap();
        assert_eq!(
            (zed.turns, zed.turns_ok, zed.tokens_in, zed.tokens_out),
            (2, 2, 20, 4)
        );
        assert!((zed.cost_usd - 0.5).abs() < 1e-9);
        let yan = db.stats("yan").unwrap();
        assert_eq!(
            (yan.status_text.as_str(), yan.status_set_at),
            ("reviewing", Some(1_795_000_000))
        );
        assert_eq!(db.stats("xi").unwrap().hyperhive_rev, "abc123");
        let rows: i64 = db
            .conn
            .query_row(
                "SELECT count(*) FROM agents WHERE name IN ('zed', 'yan', 'xi')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(rows, 3);
    }

    #[test]
    fn the_migrations_are_numbered() {
        assert!(schema::well_numbered(MIGRATIONS));
    }

    #[test]
    fn a_failure_of_its_own_goes_behind_other_senders_with_its_own_later_mail() {
        let fresh = fresh_db("seq");
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        let bob = Peer::Agent("bob".into());
        let from = |p: &'static Peer, body: &'static str| NewMessage {
            from: p,
            to: "a",
            body,
            kind: &MsgKind::Message,
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        };
        static SYS: Peer = Peer::System;
        let ids: Vec<i64> = ["1", "2", "3"]
            .iter()
            .map(|b| db.insert_message(&from(&SYS, b), 1).unwrap())
            .collect();
        let bobs = db
            .insert_message(
                &NewMessage {
                    from: &bob,
                    ..from(&SYS, "4")
                },
                1,
            )
            .unwrap();
        let order = |db: &Db| -> Vec<String> {
            db.queued("a", 10)
                .unwrap()
                .into_iter()
                .map(|m| m.body)
                .collect()
        };
        assert_eq!(order(&db), ["1", "2", "3", "4"]);
        let taken = |db: &Db| {
            let (t, queued) = db.take_next("a", true).unwrap();
            let t = t.unwrap();
            (t.message.id, t.attempts, t.was_inflight, queued)
        };
        assert_eq!(taken(&db), (ids[0], 1, false, 3));
        assert_eq!(taken(&db), (ids[0], 2, true, 3), "the inflight row again");
        assert!(db
            .requeue(ids[0], "a", true, true, Some("crashed"))
            .unwrap());
        assert_eq!(
            order(&db),
            ["4", "1", "2", "3"],
            "its sender's later mail goes with it"
        );
        assert_eq!(taken(&db), (bobs, 1, false, 3));
        assert!(db.requeue(bobs, "a", false, false, None).unwrap());
        assert_eq!(order(&db), ["4", "1", "2", "3"], "at the head");
        assert_eq!(db.attempts(bobs).unwrap(), Some(0), "given back");
        assert_eq!(db.attempts(ids[0]).unwrap(), Some(2), "kept");
        let later = db.insert_message(&from(&SYS, "5"), 2).unwrap();
        assert_eq!(order(&db), ["4", "1", "2", "3", "5"], "new mail goes last");
        assert!(
            !db.requeue(later, "a", true, true, None).unwrap(),
            "not inflight"
        );
    }

    /// The answers kept for idle renewals (`memo.rs`) go with any write:
    /// the hub's own, a status line, and another connection's commit once
    /// the hub is told of it.
    #[test]
    fn an_answer_kept_for_an_idle_agent_goes_with_any_write() {
        let fresh = fresh_db("memo");
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        assert_eq!(db.take_next("a", true).unwrap(), (None, 0));
        assert_eq!(db.take_next("a", true).unwrap(), (None, 0), "kept");
        assert_eq!(db.stats("a").unwrap().status_text, "");
        // The hub's own write.
        db.insert_message(&msg("a", "1"), 1).unwrap();
        let (t, queued) = db.take_next("a", true).unwrap();
        assert_eq!(t.map(|t| t.message.body), Some("1".to_string()));
        assert_eq!(queued, 0);
        db.conn
            .execute("UPDATE messages SET state = 'acked'", [])
            .unwrap();
        db.inflight.borrow_mut().clear();
        assert_eq!(db.take_next("a", true).unwrap(), (None, 0));
        // A status line, read through the same memo.
        db.conn
            .execute(
                "INSERT INTO agents (name, status_text) VALUES ('a', 'busy')",
                [],
            )
            .unwrap();
        assert_eq!(db.stats("a").unwrap().status_text, "busy");
        // Another connection's commit (retention's is the one there is),
        // which the hub hears of.
        let other = Connection::open(&fresh.path).unwrap();
        other
            .execute(
                "UPDATE messages SET state = 'queued', seq = seq WHERE recipient = 'a'",
                [],
            )
            .unwrap();
        db.forget_memo();
        assert_eq!(db.take_next("a", false).unwrap(), (None, 1));
        other
            .execute("UPDATE agents SET status_text = 'idle'", [])
            .unwrap();
        db.forget_memo();
        assert_eq!(db.stats("a").unwrap().status_text, "idle");
    }

    #[test]
    fn each_row_is_handed_out_as_it_was_stored() {
        let fresh = fresh_db("known");
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        assert_eq!(db.take_next("a", true).unwrap(), (None, 0));
        // A long-poll on an empty queue again finds nothing.
        assert_eq!(db.take_next("a", true).unwrap(), (None, 0));
        let remote = Peer::sender("bob@other");
        let kinds = [
            MsgKind::Kick,
            MsgKind::parse("custom_event"),
            MsgKind::Message,
        ];
        let froms = [Peer::System, remote, Peer::Operator];
        let bodies = ["first \u{1F41D} \"q\"", "", "third"];
        let mut ids = Vec::new();
        for i in 0..3 {
            let m = NewMessage {
                from: &froms[i],
                to: "a",
                body: bodies[i],
                kind: &kinds[i],
                in_reply_to: (i == 1).then_some(7),
                receipt: false,
                traceparent: None,
            };
            ids.push(db.insert_message(&m, 100 + i as i64).unwrap());
        }
        // Each row handed out is the row as stored.
        for (i, id) in ids.iter().enumerate() {
            let (t, queued) = db.take_next("a", true).unwrap();
            let t = t.unwrap();
            assert_eq!(t.message.id, *id);
            assert_eq!(queued, 2 - i as u64);
            assert_eq!((t.attempts, t.was_inflight), (1, false));
            assert_eq!(Some(t.message.clone()), db.inflight("a").unwrap());
            assert_eq!(db.attempts(*id).unwrap(), Some(1));
            assert!(db
                .transition(*id, "a", &MsgState::Inflight, &MsgState::Acked, 200)
                .unwrap());
        }
        // The queue is empty again; a new row is handed out next.
        assert_eq!(db.take_next("a", true).unwrap(), (None, 0));
        db.insert_message(&msg("a", "next"), 300).unwrap();
        let (t, queued) = db.take_next("a", true).unwrap();
        assert_eq!((t.unwrap().message.body, queued), ("next".to_string(), 0));
    }

    #[test]
    fn a_hand_out_follows_every_other_write() {
        let fresh = fresh_db("forget");
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        let body = |db: &Db| {
            let (t, _) = db.take_next("a", true).unwrap();
            t.map(|t| t.message.body)
        };
        assert_eq!(body(&db), None);
        let first = db.insert_message(&msg("a", "1"), 1).unwrap();
        assert_eq!(body(&db).as_deref(), Some("1"));
        db.insert_message(&msg("a", "2"), 1).unwrap();
        // The inflight row put back at the head goes before the next row.
        assert!(db.requeue(first, "a", false, false, None).unwrap());
        assert_eq!(body(&db).as_deref(), Some("1"));
        assert!(db
            .transition(first, "a", &MsgState::Inflight, &MsgState::Acked, 2)
            .unwrap());
        let (t, queued) = db.take_next("a", true).unwrap();
        let second = t.unwrap().message;
        assert_eq!((second.body.as_str(), queued), ("2", 0), "none behind it");
        assert!(db
            .transition(second.id, "a", &MsgState::Inflight, &MsgState::Acked, 2)
            .unwrap());
        // Drained by the MCP tool (held), a queued row is not handed out.
        let held = db.insert_message(&msg("a", "3"), 1).unwrap();
        let moved = db
            .transition_many(&[held], "a", &MsgState::Queued, &MsgState::Held, 3)
            .unwrap();
        assert_eq!(moved, 1);
        assert_eq!(db.take_next("a", false).unwrap().0, None);
        // A row inserted in a transaction that rolls back is never handed out.
        assert_eq!(
            db.take_next("a", true).unwrap().0.map(|t| t.message.id),
            None
        );
        {
            let batch = db.batch().unwrap();
            batch.insert_message(&msg("a", "rolled back"), 4).unwrap();
        }
        assert_eq!(body(&db), None);
        // A dead letter put back goes to the tail of its queue.
        db.insert_message(&msg("a", "4"), 5).unwrap();
        let (t, _) = db.take_next("a", true).unwrap();
        let dead = t.unwrap().message.id;
        assert!(db.dead_letter(dead, "a", "gave up", true, 6, &[]).unwrap());
        assert_eq!(body(&db), None);
        db.insert_message(&msg("a", "5"), 7).unwrap();
        assert!(db.retry(dead).unwrap());
        assert_eq!(body(&db).as_deref(), Some("5"));
    }

    /// The hand-out looks for an inflight row only for agents that may have
    /// one: a row made inflight any way is handed out again first, and once
    /// it moved on (acked, requeued, dead-lettered) the queue comes next.
    #[test]
    fn an_inflight_row_is_handed_out_again_until_it_moves_on() {
        let fresh = fresh_db("inflight");
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        static SYS: Peer = Peer::System;
        let new = |body: &'static str| NewMessage {
            from: &SYS,
            to: "a",
            body,
            kind: &MsgKind::Message,
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        };
        let ids: Vec<i64> = ["1", "2", "3", "4"]
            .iter()
            .map(|b| db.insert_message(&new(b), 1).unwrap())
            .collect();
        let next = |db: &Db| {
            let (t, queued) = db.take_next("a", true).unwrap();
            let t = t.unwrap();
            (t.message.body, t.was_inflight, queued)
        };
        // Made inflight by a plain transition, not a hand-out.
        assert!(db
            .transition(ids[2], "a", &MsgState::Queued, &MsgState::Inflight, 2)
            .unwrap());
        assert_eq!(next(&db), ("3".to_string(), true, 3));
        assert!(db
            .transition(ids[2], "a", &MsgState::Inflight, &MsgState::Acked, 2)
            .unwrap());
        assert_eq!(next(&db), ("1".to_string(), false, 2));
        assert_eq!(next(&db), ("1".to_string(), true, 2), "not acked yet");
        assert!(db.requeue(ids[0], "a", false, false, None).unwrap());
        assert_eq!(next(&db), ("1".to_string(), false, 2), "back at the head");
        assert!(db
            .dead_letter(ids[0], "a", "gave up", true, 3, &[])
            .unwrap());
        assert_eq!(next(&db), ("2".to_string(), false, 1));
        assert_eq!(
            db.transition_many(&[ids[1]], "a", &MsgState::Inflight, &MsgState::Acked, 4)
                .unwrap(),
            1
        );
        assert_eq!(next(&db), ("4".to_string(), false, 0));
        // A restart puts the inflight row back, at its place.
        drop(db);
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        assert_eq!(next(&db), ("4".to_string(), false, 0));
        let (t, queued) = db.take_next("a", false).unwrap();
        assert_eq!((t.map(|t| t.was_inflight), queued), (Some(true), 0));
        let (t, queued) = db.take_next("nobody", false).unwrap();
        assert_eq!((t, queued), (None, 0));
    }

    #[test]
    fn a_stopped_agent_is_kept_until_it_is_started() {
        let fresh = fresh_db("stop");
        let path = &fresh.path;
        {
            let db = Db::open(path, Durability::Normal).unwrap();
            db.set_stopped("kid", "operator", 1).unwrap();
            db.set_stopped("pal", "boss", 2).unwrap();
            db.set_stopped("kid", "boss", 3).unwrap();
        }
        let db = Db::open(path, Durability::Normal).unwrap();
        assert_eq!(db.stopped_agents().unwrap(), ["kid", "pal"]);
        db.clear_stopped("kid").unwrap();
        db.clear_stopped("nobody").unwrap();
        assert_eq!(db.stopped_agents().unwrap(), ["pal"]);
    }

    #[test]
    fn restart_requeues_inflight_and_held_rows() {
        let fresh = fresh_db("restart");
        let path = &fresh.path;
        {
            let db = Db::open(path, Durability::Normal).unwrap();
            let a = db.insert_message(&msg("a", "1"), 1).unwrap();
            let b = db.insert_message(&msg("a", "2"), 1).unwrap();
            use MsgState::{Acked, Held, Inflight, Queued};
            assert!(db.transition(a, "a", &Queued, &Inflight, 2).unwrap());
            assert!(db.transition(b, "a", &Queued, &Held, 2).unwrap());
            assert!(!db.transition(b, "zz", &Held, &Acked, 2).unwrap());
        }
        let db = Db::open(path, Durability::Full).unwrap();
        let q = db.queued("a", 10).unwrap();
        assert_eq!(
            q.iter().map(|m| m.body.as_str()).collect::<Vec<_>>(),
            ["1", "2"]
        );
        assert_eq!(db.inflight("a").unwrap(), None);
    }

    /// The receipt rows' SQL literal is [`MsgKind::Receipt`].
    #[test]
    fn the_receipt_kind_in_the_statements_is_the_closed_variant() {
        assert_eq!(format!("'{}'", MsgKind::Receipt.as_str()), receipt_kind!());
        assert_eq!(MsgKind::parse("receipt"), MsgKind::Receipt);
        assert_eq!(msg_cols!().split(',').count(), MSG_N);
    }

    /// Issue 43: the receipt flag is part of the row's own insert, so a
    /// row stored is a row whose receipt request is stored — in a batch
    /// that commits, and gone with one that rolls back — and it stays
    /// across a reopen.
    #[test]
    fn the_receipt_flag_is_stored_by_the_rows_own_insert() {
        let fresh = fresh_db("receipt-flag");
        let with = |body: &'static str| NewMessage {
            receipt: true,
            traceparent: None,
            ..msg("b", body)
        };
        let (asked, plain, committed) = {
            let db = Db::open(&fresh.path, Durability::Normal).unwrap();
            let asked = db.insert_charged(&with("asked"), Some("a"), 1).unwrap();
            let plain = db.insert_message(&msg("b", "plain"), 1).unwrap();
            let batch = db.batch().unwrap();
            let committed = batch.insert_message(&with("in a batch"), 2).unwrap();
            batch.commit().unwrap();
            {
                let batch = db.batch().unwrap();
                let gone = batch.insert_message(&with("rolled back"), 3).unwrap();
                assert!(db.wants_receipt(gone).unwrap(), "one statement");
            }
            (asked, plain, committed)
        };
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        assert!(db.wants_receipt(asked).unwrap());
        assert!(db.wants_receipt(committed).unwrap());
        assert!(!db.wants_receipt(plain).unwrap());
        assert!(!db.wants_receipt(committed + 1).unwrap(), "rolled back");
    }

    /// Receipts ride with a turn held, not acked: a hand-out of the turn
    /// again carries them again (with those that came meanwhile), `recv`
    /// does not hand them out meanwhile, the turn's ack acks them, and a
    /// restart puts them back in the queue. They are never waiting work:
    /// not unread, not the oldest queued message, not ahead in a queue.
    #[test]
    fn receipts_ride_with_a_turn_until_it_is_acked() {
        let fresh = fresh_db("receipts-ride");
        let receipt = |body: &'static str| NewMessage {
            kind: &MsgKind::Receipt,
            ..msg("a", body)
        };
        let bodies = |rows: Vec<(i64, String)>| -> Vec<String> {
            rows.into_iter().map(|(_, b)| b).collect()
        };
        {
            let db = Db::open(&fresh.path, Durability::Normal).unwrap();
            db.insert_message(&receipt("r1"), 1).unwrap();
            db.insert_message(&receipt("r2"), 1).unwrap();
            assert_eq!(db.count_queued("a").unwrap(), 0);
            assert_eq!(db.oldest_queued_seq("a").unwrap(), None);
            let work = db.insert_message(&msg("a", "work"), 2).unwrap();
            let seq: i64 = db
                .conn
                .query_row("SELECT seq FROM messages WHERE id = ?1", [work], |r| {
                    r.get(0)
                })
                .unwrap();
            assert_eq!(db.oldest_queued_seq("a").unwrap(), Some(seq));
            let row = db.sent_row(work).unwrap().unwrap();
            assert_eq!(row.position, Some(1), "receipts are not ahead of it");
            assert_eq!(row.message.body, "work");
            assert_eq!(db.count_queued("a").unwrap(), 1);

            // The turn's hand-out: both ride; recv sees neither.
            assert_eq!(bodies(db.take_receipts("a", 10, 3).unwrap()), ["r1", "r2"]);
            assert_eq!(
                db.queued("a", 10)
                    .unwrap()
                    .iter()
                    .map(|m| m.body.as_str())
                    .collect::<Vec<_>>(),
                ["work"]
            );
            // Handed out again (the run failed): again, with the new one;
            // past the limit the last waits for the next turn.
            db.insert_message(&receipt("r3"), 4).unwrap();
            assert_eq!(bodies(db.take_receipts("a", 2, 5).unwrap()), ["r1", "r2"]);
            assert_eq!(
                bodies(db.take_receipts("a", 10, 5).unwrap()),
                ["r1", "r2", "r3"]
            );
            // A broker killed now: the restart puts them back.
        }
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        assert_eq!(
            db.ack_receipts("a", 6).unwrap(),
            0,
            "none ride after a restart"
        );
        assert_eq!(
            bodies(db.take_receipts("a", 10, 6).unwrap()),
            ["r1", "r2", "r3"]
        );
        // The turn's ack acks them: no hand-out carries them again.
        assert_eq!(db.ack_receipts("a", 7).unwrap(), 3);
        assert_eq!(db.ack_receipts("a", 7).unwrap(), 0);
        assert!(db.take_receipts("a", 10, 8).unwrap().is_empty());
        let acked: i64 = db
            .conn
            .query_row(
                "SELECT COUNT(*) FROM messages WHERE kind = 'receipt' AND state = 'acked'
                 AND handed_via = 'turn' AND done_at = 7",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(acked, 3);
    }

    /// An ack is one transaction with what goes with it: the rows that
    /// were in the state named (each once), the turn id, the receipts that
    /// rode with the turn, and the receipts it sends. When any part fails
    /// (here a receipt row refused by a trigger, as a full disk would) none
    /// of it is done, and the row is handed out again as inflight.
    #[test]
    fn an_ack_is_one_transaction_with_its_turn_and_receipts() {
        let fresh = fresh_db("ack");
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        let ana = Peer::Agent("ana".into());
        let asked = |to: &'static str, body: &'static str| NewMessage {
            receipt: true,
            traceparent: None,
            ..msg(to, body)
        };
        let said = |row: SentRow| {
            Some((
                row.message.from.as_str().to_string(),
                format!("#{} {} turn {:?}", row.message.id, row.state, row.turn),
            ))
        };
        let receipts = |db: &Db| -> Vec<(String, String, Option<i64>)> {
            let mut stmt = db
                .conn
                .prepare(
                    "SELECT recipient, body, in_reply_to FROM messages
                     WHERE kind = 'receipt' ORDER BY id",
                )
                .unwrap();
            let rows = stmt
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .unwrap();
            rows.map(Result::unwrap).collect()
        };
        // The operator's inbox ack: the rows that were queued, each once.
        let a = db
            .insert_message(
                &NewMessage {
                    from: &ana,
                    ..asked("operator", "1")
                },
                1,
            )
            .unwrap();
        let b = db.insert_message(&msg("operator", "2"), 1).unwrap();
        let other = db.insert_message(&msg("bob", "3"), 1).unwrap();
        use MsgState::{Acked, Inflight, Queued};
        let ack = |ids: &[i64]| {
            let a = Ack {
                ids,
                recipient: "operator",
                from_state: &Queued,
                turn: None,
                turn_acked: false,
                now: 2,
            };
            db.ack(a, said).unwrap()
        };
        // bob's `ack_turn` of `ids` (one) with `turn`.
        fn turn_ack(ids: &[i64], turn: i64, now: i64) -> Ack<'_> {
            static INFLIGHT: MsgState = MsgState::Inflight;
            Ack {
                ids,
                recipient: "bob",
                from_state: &INFLIGHT,
                turn: Some(turn),
                turn_acked: true,
                now,
            }
        }
        assert_eq!(ack(&[a, other, b + 100]), [a]);
        assert_eq!(ack(&[a, b]), [b]);
        assert!(ack(&[a, b]).is_empty());
        assert_eq!(
            receipts(&db),
            [("ana".to_string(), format!("#{a} acked turn None"), Some(a))]
        );

        // A turn's ack: its turn id, the receipts that rode with it.
        let work = db
            .insert_message(
                &NewMessage {
                    from: &ana,
                    ..asked("bob", "work")
                },
                3,
            )
            .unwrap();
        db.insert_message(
            &NewMessage {
                kind: &MsgKind::Receipt,
                ..msg("bob", "r")
            },
            3,
        )
        .unwrap();
        let (t, _) = db.take_next("bob", true).unwrap();
        assert_eq!(t.unwrap().message.id, other);
        assert_eq!(db.take_receipts("bob", 10, 4).unwrap().len(), 1);
        db.conn
            .execute_batch(
                "CREATE TEMP TRIGGER no_receipt BEFORE INSERT ON messages
                 WHEN NEW.kind = 'receipt' BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
            )
            .unwrap();
        // `other` asked for no receipt: its ack stands, with the riding one.
        assert_eq!(db.ack(turn_ack(&[other], 7, 5), said).unwrap(), [other]);
        assert_eq!(db.sent_row(other).unwrap().unwrap().turn, Some(7));
        assert!(
            db.take_receipts("bob", 10, 6).unwrap().is_empty(),
            "acked with it"
        );
        // `work` asked for one, and its receipt cannot be stored: nothing moves.
        let (t, _) = db.take_next("bob", true).unwrap();
        assert_eq!(t.unwrap().message.id, work);
        let e = db.ack(turn_ack(&[work], 8, 6), said).unwrap_err();
        assert!(e.to_string().contains("disk full"), "{e}");
        let row = db.sent_row(work).unwrap().unwrap();
        assert_eq!((row.state, row.turn), (Inflight, None));
        let (t, _) = db.take_next("bob", true).unwrap();
        let t = t.unwrap();
        assert_eq!(
            (t.message.id, t.was_inflight),
            (work, true),
            "still inflight"
        );
        db.conn.execute_batch("DROP TRIGGER no_receipt").unwrap();
        assert_eq!(db.ack(turn_ack(&[work], 8, 7), said).unwrap(), [work]);
        assert_eq!(
            receipts(&db).last().cloned(),
            Some((
                "ana".to_string(),
                format!("#{work} acked turn Some(8)"),
                Some(work)
            ))
        );
        assert_eq!(db.sent_row(work).unwrap().unwrap().state, Acked);
    }
}
