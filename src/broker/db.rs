//! The broker's sqlite store: schema versions, pragmas and every statement the
//! broker runs. A `Db` is owned by the hub thread alone (opened before it
//! starts, then moved in; the connection is never shared between threads);
//! each method is one short transaction, so an answer the broker sends after
//! a write is an answer about committed data. The hub sees it through a
//! [`Store`], which holds the statements on every message's path prepared,
//! and the `Db` keeps what it knows of the queues without reading them
//! (`Queues`: their tail, and an agent's first queued row). The schema is
//! the ordered list [`MIGRATIONS`] (`PRAGMA user_version`, `proto::schema`).
//! The swarm's tables and statements are `db/swarm.rs`; what retention
//! prunes, the prune thread's connection and each agent's stored bytes are
//! `db/retention.rs`; the operator's recent activity, `db/activity.rs`; the
//! operator's view of timers and the coalescing of repeating prompts,
//! `db/timers.rs`; the page's model override, `db/models.rs`.

mod activity;
mod fleet;
mod models;
mod retention;
mod swarm;
mod timers;

pub use retention::{PrunedMessages, Pruner};
pub use swarm::{new_message, Batch, OutRow, OutboxEntry, PeerInstance, Settle};
pub use timers::Fired;

use crate::proto::cmd::{Bounded, PostTurnCounts};
use crate::proto::limits::REMINDER_PREVIEW_CHARS;
use crate::proto::schema::{self, Step};
use crate::proto::{
    Approval, ApprovalKind, ApprovalState, FailedMessage, Message, MsgKind, MsgState, Peer,
    Question, Reminder, RunningTask, Scheduled,
};
use rusqlite::{params, Connection, OptionalExtension, Row, Statement};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
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

/// Every version of the schema, oldest first. Version 1 is the schema of the
/// releases before schema versions (their files are at `user_version` 0 and
/// already hold these tables). A change appends a step; a shipped step never
/// changes.
pub const MIGRATIONS: &[Step] = &[
    Step {
        version: 1,
        what: "messages, questions, reminders, scheduled prompts, approvals, agents",
        apply: |tx| tx.execute_batch(SCHEMA_V1),
    },
    Step {
        version: 2,
        what: "running bash tasks, as each agent's task daemon reports them",
        apply: |tx| {
            tx.execute_batch(
                "CREATE TABLE running_tasks (
                    agent TEXT NOT NULL,
                    id TEXT NOT NULL,
                    cmd TEXT NOT NULL,
                    started_at INTEGER NOT NULL,
                    timeout_secs INTEGER,
                    PRIMARY KEY (agent, id)
                );",
            )
        },
    },
    Step {
        version: 3,
        what: "attempts, last errors, queue positions and the failed state of messages",
        apply: |tx| {
            // The state's CHECK cannot be altered in place: the table is
            // rebuilt (sqlite's documented way), its ids and their sequence
            // kept, and every row starts at its own id in the queue.
            let next: Option<i64> = tx
                .query_row(
                    "SELECT seq FROM sqlite_sequence WHERE name = 'messages'",
                    [],
                    |r| r.get(0),
                )
                .optional()?;
            tx.execute_batch(MESSAGES_V3)?;
            if let Some(n) = next {
                tx.execute(
                    "INSERT INTO sqlite_sequence (name, seq) SELECT 'messages', ?1
                     WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'messages')",
                    params![n],
                )?;
                tx.execute(
                    "UPDATE sqlite_sequence SET seq = MAX(seq, ?1) WHERE name = 'messages'",
                    params![n],
                )?;
            }
            Ok(())
        },
    },
    Step {
        version: 4,
        what: "the swarm: the broker's instance id, the outbox, the inbound log, question mirrors",
        apply: |tx| tx.execute_batch(swarm::SCHEMA_V4),
    },
    Step {
        version: 5,
        what: "agents kept stopped across restarts (hive stop, the kill tool)",
        apply: |tx| {
            tx.execute_batch(
                "CREATE TABLE stopped_agents (
                    name TEXT PRIMARY KEY,
                    stopped_by TEXT NOT NULL,
                    stopped_at INTEGER NOT NULL
                );",
            )
        },
    },
    Step {
        version: 6,
        what: "reminder payloads kept whole in the store (the old spill files read once)",
        apply: absorb_reminder_spill_files,
    },
    Step {
        version: 7,
        what: "credential pools, their usage-limit pauses, spend rows and budget notices, the hive's salt",
        apply: |tx| tx.execute_batch(LIMITS_V7),
    },
    Step {
        version: 8,
        what: "the messages' state check without an IN list (cheaper writes)",
        apply: |tx| tx.execute_batch(MESSAGES_V8),
    },
    Step {
        version: 9,
        what: "queue positions handed out by the broker (the seq index and its insert trigger go)",
        apply: |tx| tx.execute_batch(MESSAGES_V9),
    },
    Step {
        version: 10,
        what: "spend rows bounded per run: the clamped flag, and older rows over the bounds clamped",
        apply: |tx| tx.execute_batch(SPEND_V10),
    },
    Step {
        version: 11,
        what: "the reason of an undeliverable event in the outbox",
        apply: |tx| tx.execute_batch("ALTER TABLE outbox ADD COLUMN reason TEXT;"),
    },
    Step {
        version: 12,
        what: "retention: the agent each message is charged to, its running sums, acked rows by age",
        apply: |tx| tx.execute_batch(retention::SCHEMA_V12),
    },
    Step {
        version: 13,
        what: "the swarm: an instance id per broker start on each outbox row, dedupe by instance",
        apply: |tx| tx.execute_batch(swarm::SCHEMA_V13),
    },
    Step {
        version: 14,
        what: "repeating scheduled prompts coalesced: the last copy delivered and the deliveries skipped",
        apply: |tx| tx.execute_batch(timers::SCHEMA_V14),
    },
    Step {
        version: 15,
        what: "the model an agent's page chose, and the configured default it was chosen against",
        apply: |tx| tx.execute_batch(models::SCHEMA_V15),
    },
];

/// Step 10 (issue 40): one run's row counts at most $1000 and 10^9 tokens
/// (and 10^9 cache reads; `proto::cmd::MAX_RUN_USD`, `MAX_RUN_TOKENS`); a
/// report above is kept clamped, with `clamped` set. Rows older releases
/// kept whole above the bounds (they took up to $10^6 and 10^12 tokens) are
/// clamped and flagged the same way, so every row the broker wrote is within
/// them. The figures are written out here: a shipped step never changes.
const SPEND_V10: &str = "
ALTER TABLE spend ADD COLUMN clamped INTEGER NOT NULL DEFAULT 0;
UPDATE spend SET clamped = 1,
    usd = MIN(usd, 1000.0),
    tokens = MIN(tokens, 1000000000),
    cache_read = MIN(cache_read, 1000000000)
WHERE usd > 1000.0 OR tokens > 1000000000 OR cache_read > 1000000000;
";

/// Step 9 (issue 19): the broker hands out queue positions itself
/// ([`Db`]'s tail, seeded at open from the inbox index), so `messages_seq`
/// (kept only to find the last position, and written on every insert) and
/// the trigger that filled in a missing `seq` go. The rows, their ids and
/// positions stay as they are.
const MESSAGES_V9: &str = "
DROP TRIGGER messages_seq_on_insert;
DROP INDEX messages_seq;
";

/// Step 6: a long reminder's payload used to spill to a file under the
/// broker's state dir, which an agent running as its own user could not read.
/// Each such file is read once into the row's `body`; a row whose file is gone
/// (or unreadable) is kept, its 200-character preview followed by a note that
/// the rest was lost. The `spill_file` column goes; the old files are left
/// where they are (the operator may delete `STATE/agents/*/reminders/`).
fn absorb_reminder_spill_files(tx: &rusqlite::Transaction) -> Res<()> {
    let spilled: Vec<(i64, String, String)> = {
        let mut stmt = tx.prepare(
            "SELECT id, body, spill_file FROM reminders WHERE spill_file IS NOT NULL ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect::<Res<_>>()?
    };
    for (id, preview, file) in spilled {
        // `remind` never took more than MAX_BODY bytes: a longer file is not
        // what it wrote, and only that much of it is kept.
        let read = std::fs::File::open(&file).and_then(|f| {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(
                &mut std::io::Read::take(f, crate::proto::limits::MAX_BODY as u64),
                &mut bytes,
            )
            .map(|_| bytes)
        });
        let body = match read {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => {
                log::warn!("reminder #{id}: its payload file {file} cannot be read ({e}); the reminder keeps its preview");
                lost_payload(&preview, &file)
            }
        };
        tx.execute(
            "UPDATE reminders SET body = ?1 WHERE id = ?2",
            params![body, id],
        )?;
    }
    tx.execute_batch("ALTER TABLE reminders DROP COLUMN spill_file;")
}

/// The body a reminder keeps when step 6 could not read its spill file.
pub fn lost_payload(preview: &str, file: &str) -> String {
    format!(
        "{preview}… [hive: the rest of this reminder was lost: its payload file {file} could \
         not be read when the broker moved reminder payloads into broker.db]"
    )
}

/// Step 7 (issue 16): `hive_salt` keys the credential fingerprints of pools
/// (one row, random); `agent_pools` is each agent's pool as its harness last
/// reported it; `pool_pauses` a pool's usage limit until its reset (`noticed`:
/// the operator was told about this window); `spend` one row per claude run,
/// keyed by the harness's idempotency key (`usd` null: cost unknown);
/// `budget_notices` the 80 % and 100 % notices sent, once per scope, window
/// and level.
const LIMITS_V7: &str = "
CREATE TABLE hive_salt (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    salt BLOB NOT NULL
);
CREATE TABLE agent_pools (
    agent TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    reported_at INTEGER NOT NULL
);
CREATE TABLE pool_pauses (
    pool TEXT PRIMARY KEY,
    until INTEGER NOT NULL,
    detail TEXT NOT NULL,
    since INTEGER NOT NULL
);
CREATE TABLE spend (
    key TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    at INTEGER NOT NULL,
    usd REAL,
    tokens INTEGER NOT NULL,
    cache_read INTEGER NOT NULL
);
CREATE INDEX spend_agent_at ON spend (agent, at);
CREATE INDEX spend_at ON spend (at);
CREATE TABLE budget_notices (
    scope TEXT NOT NULL,
    window_start INTEGER NOT NULL,
    level INTEGER NOT NULL,
    PRIMARY KEY (scope, window_start, level)
);
";

/// What a scope's spend rows add up to (`Db::spend_since`): dollars, runs
/// of unknown cost, tokens, cache reads, runs kept clamped.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpendTotals {
    pub usd: f64,
    pub unknown: u64,
    pub tokens: u64,
    pub cache_read: u64,
    pub clamped: u64,
}

/// Step 3: `attempts` (hand-outs that count toward the harness's attempt
/// limit), `last_error`, `seq` (the queue position: new rows go last, a
/// message that failed for its own reasons moves behind later mail) and the
/// `failed` state. `done_at` is also when a message was dead-lettered.
const MESSAGES_V3: &str = "
CREATE TABLE messages_v3 (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sender TEXT NOT NULL,
    recipient TEXT NOT NULL,
    body TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT 'message',
    in_reply_to INTEGER,
    state TEXT NOT NULL CHECK (state IN ('queued', 'inflight', 'held', 'acked', 'failed')),
    sent_at INTEGER NOT NULL,
    done_at INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    seq INTEGER
);
INSERT INTO messages_v3 (id, sender, recipient, body, kind, in_reply_to, state, sent_at, done_at, seq)
    SELECT id, sender, recipient, body, kind, in_reply_to, state, sent_at, done_at, id FROM messages;
DROP TABLE messages;
ALTER TABLE messages_v3 RENAME TO messages;
CREATE INDEX messages_inbox ON messages (recipient, state, seq);
CREATE INDEX messages_seq ON messages (seq);
CREATE TRIGGER messages_seq_on_insert AFTER INSERT ON messages WHEN NEW.seq IS NULL
BEGIN
    UPDATE messages SET seq = (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages) WHERE id = NEW.id;
END;
";

/// Step 8 (issue 19): the same table, its `state` check written as a chain
/// of `OR`s. An `IN` list of more than two values makes sqlite build a
/// throw-away b-tree to look the value up in, on every insert and every
/// update of a row, which was a tenth of what a broker request cost. The
/// rows, their ids, the id sequence (AUTOINCREMENT never hands out an id
/// again), the indexes and the trigger stay as they were.
const MESSAGES_V8: &str = "
CREATE TABLE messages_v8 (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sender TEXT NOT NULL,
    recipient TEXT NOT NULL,
    body TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT 'message',
    in_reply_to INTEGER,
    state TEXT NOT NULL CHECK (state = 'queued' OR state = 'inflight' OR state = 'held'
                               OR state = 'acked' OR state = 'failed'),
    sent_at INTEGER NOT NULL,
    done_at INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    seq INTEGER
);
INSERT INTO messages_v8 (id, sender, recipient, body, kind, in_reply_to, state, sent_at, done_at,
                         attempts, last_error, seq)
    SELECT id, sender, recipient, body, kind, in_reply_to, state, sent_at, done_at,
           attempts, last_error, seq FROM messages;
DELETE FROM sqlite_sequence WHERE name = 'messages_v8';
INSERT INTO sqlite_sequence (name, seq) SELECT 'messages_v8', seq FROM sqlite_sequence WHERE name = 'messages';
DROP TABLE messages;
ALTER TABLE messages_v8 RENAME TO messages;
CREATE INDEX messages_inbox ON messages (recipient, state, seq);
CREATE INDEX messages_seq ON messages (seq);
CREATE TRIGGER messages_seq_on_insert AFTER INSERT ON messages WHEN NEW.seq IS NULL
BEGIN
    UPDATE messages SET seq = (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages) WHERE id = NEW.id;
END;
";

const SCHEMA_V1: &str = "
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    sender TEXT NOT NULL,
    recipient TEXT NOT NULL,
    body TEXT NOT NULL,
    kind TEXT NOT NULL DEFAULT 'message',
    in_reply_to INTEGER,
    state TEXT NOT NULL CHECK (state IN ('queued', 'inflight', 'held', 'acked')),
    sent_at INTEGER NOT NULL,
    done_at INTEGER
);
CREATE INDEX IF NOT EXISTS messages_inbox ON messages (recipient, state, id);
CREATE TABLE IF NOT EXISTS questions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    asker TEXT NOT NULL,
    target TEXT NOT NULL,
    question TEXT NOT NULL,
    options TEXT NOT NULL DEFAULT '[]',
    multi INTEGER NOT NULL DEFAULT 0,
    asked_at INTEGER NOT NULL,
    expires_at INTEGER,
    answer TEXT,
    answered_by TEXT,
    answered_at INTEGER
);
CREATE TABLE IF NOT EXISTS reminders (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    body TEXT NOT NULL,
    spill_file TEXT,
    fire_at INTEGER NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS scheduled (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    agent TEXT NOT NULL,
    body TEXT NOT NULL,
    fire_at INTEGER NOT NULL,
    every_seconds INTEGER,
    created_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS approvals (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    requester TEXT NOT NULL,
    agent TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    created_at INTEGER NOT NULL,
    decided_at INTEGER,
    why TEXT
);
CREATE TABLE IF NOT EXISTS agents (
    name TEXT PRIMARY KEY,
    hyperhive_rev TEXT NOT NULL DEFAULT '',
    status_text TEXT NOT NULL DEFAULT '',
    status_set_at INTEGER,
    turns INTEGER NOT NULL DEFAULT 0,
    turns_ok INTEGER NOT NULL DEFAULT 0,
    turns_failed INTEGER NOT NULL DEFAULT 0,
    tokens_in INTEGER NOT NULL DEFAULT 0,
    tokens_out INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL DEFAULT 0
);
";

/// Per-agent counters and status kept for the dashboard.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentStats {
    pub hyperhive_rev: String,
    pub status_text: String,
    pub status_set_at: Option<i64>,
    pub turns: u64,
    pub turns_ok: u64,
    pub turns_failed: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
}

/// A new row for the messages table.
pub struct NewMessage<'a> {
    pub from: &'a Peer,
    pub to: &'a str,
    pub body: &'a str,
    pub kind: &'a MsgKind,
    pub in_reply_to: Option<i64>,
}

/// The hub's view of the store: every [`Db`] method, with the statements on
/// every message's path (queue a row, hand out a known first row, move a row
/// between states) prepared once and held here for the life of the hub.
/// rusqlite's statement cache would hash and compare their SQL text on every
/// use and again when the statement goes back (about 3 k instructions each).
/// It borrows the `Db`, so the hub that owns it lives in the frame of the
/// thread that opened it.
pub struct Store<'c> {
    db: &'c Db,
    insert: RefCell<Statement<'c>>,
    hand_out: RefCell<Statement<'c>>,
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
            hand_out: prepare(HAND_OUT_KNOWN)?,
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

    /// [`Db::take_next`].
    pub fn take_next(&self, agent: &str, queued_too: bool) -> Res<(Option<Taken>, u64)> {
        let held = &mut *self.hand_out.borrow_mut();
        self.db.take_next_by(Some(held), agent, queued_too)
    }

    /// [`Db::transition`].
    pub fn transition(
        &self,
        id: i64,
        recipient: &str,
        from_state: &MsgState,
        to_state: &MsgState,
        now: i64,
    ) -> Res<bool> {
        let held = &mut *self.transition.borrow_mut();
        self.db
            .transition_by(Some(held), id, recipient, from_state, to_state, now)
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
    /// This start's instance id (`db/swarm.rs`), made at open.
    instance: String,
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
        charged
    ];
    execute(conn, held, INSERT_QUEUED, p)?;
    let id = conn.last_insert_rowid();
    // Outside a transaction the row is committed; inside one it may still
    // roll back, so what is known of its queue is forgotten.
    queues.queued(m, id, now, conn.is_autocommit());
    Ok(id)
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

/// The first queued row, known to [`Queues`], handed out.
const HAND_OUT_KNOWN: &str = "UPDATE messages SET state = 'inflight', attempts = attempts + 1 \
     WHERE id = ?1 AND state = 'queued'";

/// One row moved between states (an ack, a hold, a release).
const TRANSITION: &str = "UPDATE messages SET state = ?1, done_at = ?2 \
     WHERE id = ?3 AND recipient = ?4 AND state = ?5";

/// A queued row at a place in the queue, and the agent it is charged to.
const INSERT_QUEUED: &str =
    "INSERT INTO messages (sender, recipient, body, kind, in_reply_to, state, sent_at, seq, charged)
     VALUES (?1, ?2, ?3, ?4, ?5, 'queued', ?6, ?7, ?8)";

/// What the one connection that writes `broker.db` knows of the queues
/// without reading them.
///
/// The tail: the last place in the queue handed out (`seq`). A new row, a row
/// moved behind, a dead letter put back each take the next one. Seeded at
/// open with the last place of any row that can still be handed out
/// ([`queue_tail`]); a place taken by a transaction that rolled back is
/// skipped, never reused out of order.
///
/// The heads: for some agents, that their queue is empty, or its first
/// queued row (as [`message_from_row`] would read it, with no hand-out yet)
/// and how many queued rows are behind it. An agent is known only from a
/// hand-out that left its queue empty, and stays known only through committed
/// single-row inserts and hand-outs; every other write that adds, removes or
/// reorders queued rows forgets it (or every agent), so what is known is
/// never stale. An agent working through one message at a time is then
/// handed its next row without a `SELECT`.
struct Queues {
    tail: Cell<i64>,
    heads: RefCell<BTreeMap<String, Head>>,
}

/// The known state of one agent's queue (see [`Queues`]).
enum Head {
    Empty,
    First { message: Message, behind: u64 },
}

impl Queues {
    fn new(tail: i64) -> Queues {
        Queues {
            tail: Cell::new(tail),
            heads: RefCell::new(BTreeMap::new()),
        }
    }

    fn next_place(&self) -> i64 {
        let n = self.tail.get().saturating_add(1);
        self.tail.set(n);
        n
    }

    /// Row `id` was queued for `m.to`; `committed` when no transaction can
    /// take it back.
    fn queued(&self, m: &NewMessage, id: i64, now: i64, committed: bool) {
        let mut heads = self.heads.borrow_mut();
        if !committed {
            heads.remove(m.to);
            return;
        }
        match heads.get_mut(m.to) {
            Some(Head::First { behind, .. }) => *behind += 1,
            Some(h @ Head::Empty) => {
                *h = Head::First {
                    message: Message {
                        id,
                        from: Peer::sender(m.from.as_str()),
                        to: Peer::sender(m.to),
                        body: m.body.to_string(),
                        kind: MsgKind::parse(m.kind.as_str()),
                        in_reply_to: m.in_reply_to,
                        sent_at: now,
                        transient: false,
                    },
                    behind: 0,
                }
            }
            None => {}
        }
    }

    /// `agent`'s queue was found empty (after a hand-out, or none to hand out).
    fn empty(&self, agent: &str) {
        let mut heads = self.heads.borrow_mut();
        match heads.get_mut(agent) {
            Some(h) => *h = Head::Empty,
            None => {
                heads.insert(agent.to_string(), Head::Empty);
            }
        }
    }

    /// Takes what is known of `agent`'s queue: a known first row leaves it
    /// known empty when nothing was behind the row, unknown otherwise.
    fn take_first(&self, agent: &str) -> Option<Head> {
        let mut heads = self.heads.borrow_mut();
        let h = heads.get_mut(agent)?;
        let head = std::mem::replace(h, Head::Empty);
        if matches!(head, Head::First { behind, .. } if behind > 0) {
            heads.remove(agent);
        }
        Some(head)
    }

    fn forget(&self, agent: &str) {
        self.heads.borrow_mut().remove(agent);
    }

    fn forget_all(&self) {
        self.heads.borrow_mut().clear();
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
const Q_COLS: &str = "id, asker, target, question, options, multi, asked_at, expires_at";

fn question_from_row(row: &Row) -> Res<Question> {
    let options: String = row.get(4)?;
    Ok(Question {
        id: row.get(0)?,
        asker: row.get(1)?,
        target: row.get(2)?,
        question: row.get(3)?,
        options: serde_json::from_str(&options).unwrap_or_default(),
        multi: row.get::<_, i64>(5)? != 0,
        asked_at: row.get(6)?,
        expires_at: row.get(7)?,
    })
}

fn reminder_from_row(row: &Row) -> Res<Reminder> {
    let body: String = row.get(2)?;
    Ok(Reminder {
        id: row.get(0)?,
        agent: row.get(1)?,
        preview: body.chars().take(REMINDER_PREVIEW_CHARS).collect(),
        bytes: body.len() as u64,
        fire_at: row.get(3)?,
    })
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

    /// Queues a message at the tail of the queue.
    pub fn insert_message(&self, m: &NewMessage, now: i64) -> Res<i64> {
        queue_row(&self.conn, &self.queues, m, None, now)
    }

    /// Queues a message at the tail of the queue, its body counted in the
    /// stored bytes of agent `charged` (none: of no agent).
    pub fn insert_charged(&self, m: &NewMessage, charged: Option<&str>, now: i64) -> Res<i64> {
        queue_row(&self.conn, &self.queues, m, charged, now)
    }

    /// `agent` may have an inflight row from now on.
    fn mark_inflight(&self, agent: &str) {
        let mut set = self.inflight.borrow_mut();
        if !set.contains(agent) {
            set.insert(agent.to_string());
        }
    }

    /// Keeps [`Db::inflight`] true after a committed write moved `moved`
    /// rows of `agent` from `from` to `to`: into inflight, the agent may
    /// have one; out of it, its one inflight row moved on. Rows into or out
    /// of the queue make what [`Queues`] knows of it stale: forgotten.
    fn moved(&self, agent: &str, from: &MsgState, to: &MsgState, moved: usize) {
        if moved == 0 || from == to {
            return;
        }
        if *from == MsgState::Queued || *to == MsgState::Queued {
            self.queues.forget(agent);
        }
        if *to == MsgState::Inflight {
            self.mark_inflight(agent);
        } else if *from == MsgState::Inflight {
            self.inflight.borrow_mut().remove(agent);
        }
    }

    /// The agent's inflight row, if any (there is at most one; in queue
    /// order, so the inbox index answers without a sort).
    pub fn inflight(&self, agent: &str) -> Res<Option<Message>> {
        self.conn
            .prepare_cached(concat!(
                "SELECT ",
                msg_cols!(),
                " FROM messages WHERE recipient = ?1 AND state = 'inflight' ORDER BY seq, id LIMIT 1"
            ))?
            .query_row(params![agent], message_from_row)
            .optional()
    }

    /// The id of a system event of `kind` still waiting for `agent`
    /// (queued, held, or inflight from a harness that died mid-turn).
    pub fn waiting_event(&self, agent: &str, kind: &MsgKind) -> Res<Option<i64>> {
        self.conn
            .prepare_cached(
                "SELECT id FROM messages WHERE recipient = ?1 AND kind = ?2 \
                 AND state IN ('queued', 'inflight', 'held') ORDER BY seq, id LIMIT 1",
            )?
            .query_row(params![agent, kind.as_str()], |r| r.get(0))
            .optional()
    }

    /// What `recv_next` hands out, in one transaction: the agent's inflight
    /// row again, else (with `queued_too`) its first queued row made
    /// inflight; either way its attempts go up by one. Returns the row, its
    /// attempts with this hand-out, and whether it was inflight already;
    /// and the count of queued rows after it (read by the same statement as
    /// the row).
    pub fn take_next(&self, agent: &str, queued_too: bool) -> Res<(Option<Taken>, u64)> {
        self.take_next_by(None, agent, queued_too)
    }

    /// [`Db::take_next`], through the statement `held` when the hub holds it.
    fn take_next_by(
        &self,
        held: Option<&mut Statement>,
        agent: &str,
        queued_too: bool,
    ) -> Res<(Option<Taken>, u64)> {
        let look_for_inflight = self.inflight.borrow().contains(agent);
        if queued_too && !look_for_inflight {
            if let Some(taken) = self.take_known_first(held, agent)? {
                return Ok(taken);
            }
        }
        let (taken, queued) = self.read_next(agent, queued_too, look_for_inflight)?;
        if queued_too && queued == 0 {
            self.queues.empty(agent);
        }
        Ok((taken, queued))
    }

    /// [`Db::take_next`] when [`Queues`] knows the queue: nothing for a
    /// queue known to be empty (a harness's long-poll after its ack), its
    /// first row by one `UPDATE` by id, no `SELECT`. None when it is not known
    /// (or, which would be a bug, the row was not queued after all: then it
    /// is forgotten, and the queue is read).
    fn take_known_first(
        &self,
        held: Option<&mut Statement>,
        agent: &str,
    ) -> Res<Option<(Option<Taken>, u64)>> {
        let (message, behind) = match self.queues.take_first(agent) {
            None => return Ok(None),
            Some(Head::Empty) => return Ok(Some((None, 0))),
            Some(Head::First { message, behind }) => (message, behind),
        };
        self.mark_inflight(agent);
        let n = execute(&self.conn, held, HAND_OUT_KNOWN, params![message.id])?;
        if n != 1 {
            log::warn!(
                "message {} of {agent} was not queued as the broker knew it; reading the queue",
                message.id
            );
            self.queues.forget(agent);
            return Ok(None);
        }
        let taken = Taken {
            message,
            attempts: 1,
            was_inflight: false,
        };
        Ok(Some((Some(taken), behind)))
    }

    /// [`Db::take_next`] by reading the queue.
    fn read_next(
        &self,
        agent: &str,
        queued_too: bool,
        look_for_inflight: bool,
    ) -> Res<(Option<Taken>, u64)> {
        schema::in_transaction(&self.conn, |c| {
            for state in ["inflight", "queued"] {
                if state == "inflight" && !look_for_inflight {
                    continue;
                }
                if state == "queued" && !queued_too {
                    break;
                }
                let row = c
                    .prepare_cached(concat!(
                        "SELECT ",
                        msg_cols!(),
                        ", attempts, (SELECT COUNT(*) FROM messages \
                         WHERE recipient = ?1 AND state = 'queued') \
                         FROM messages WHERE recipient = ?1 AND state = ?2 \
                         ORDER BY seq, id LIMIT 1"
                    ))?
                    .query_row(params![agent, state], |r| {
                        Ok((
                            message_from_row(r)?,
                            r.get::<_, i64>(7)?,
                            r.get::<_, i64>(8)?,
                        ))
                    })
                    .optional()?;
                let Some((message, attempts, queued)) = row else {
                    if state == "queued" {
                        return Ok((None, 0));
                    }
                    continue;
                };
                let was_inflight = state == "inflight";
                self.mark_inflight(agent);
                c.prepare_cached(
                    "UPDATE messages SET state = 'inflight', attempts = attempts + 1 WHERE id = ?1",
                )?
                .execute(params![message.id])?;
                // The count was read with this row still queued.
                let queued = if was_inflight { queued } else { queued - 1 };
                let taken = Taken {
                    message,
                    attempts: (attempts + 1).clamp(0, u32::MAX as i64) as u32,
                    was_inflight,
                };
                return Ok((Some(taken), queued.max(0) as u64));
            }
            // Nothing handed out, and the queue not looked at.
            Ok((None, self.count_queued(agent)?))
        })
    }

    /// The first queued rows of a recipient, in queue order.
    pub fn queued(&self, recipient: &str, limit: u32) -> Res<Vec<Message>> {
        let mut stmt = self.conn.prepare_cached(concat!(
            "SELECT ",
            msg_cols!(),
            " FROM messages WHERE recipient = ?1 AND state = 'queued' ORDER BY seq, id LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![recipient, limit], message_from_row)?;
        rows.collect()
    }

    /// Queued rows of `recipient` with ids above `after`, oldest first.
    pub fn queued_after(&self, recipient: &str, after: i64, limit: u32) -> Res<Vec<Message>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {MSG_COLS} FROM messages WHERE recipient = ?1 AND state = 'queued' AND id > ?2
             ORDER BY id LIMIT ?3"
        ))?;
        let rows = stmt.query_map(params![recipient, after, limit], message_from_row)?;
        rows.collect()
    }

    pub fn count_queued(&self, recipient: &str) -> Res<u64> {
        self.conn
            .prepare_cached(
                "SELECT COUNT(*) FROM messages WHERE recipient = ?1 AND state = 'queued'",
            )?
            .query_row(params![recipient], |r| r.get::<_, i64>(0).map(|n| n as u64))
    }

    /// Moves one row between states; returns whether it was in `from_state`.
    pub fn transition(
        &self,
        id: i64,
        recipient: &str,
        from_state: &MsgState,
        to_state: &MsgState,
        now: i64,
    ) -> Res<bool> {
        self.transition_by(None, id, recipient, from_state, to_state, now)
    }

    /// [`Db::transition`], through the statement `held` when the hub holds it.
    fn transition_by(
        &self,
        held: Option<&mut Statement>,
        id: i64,
        recipient: &str,
        from_state: &MsgState,
        to_state: &MsgState,
        now: i64,
    ) -> Res<bool> {
        let done_at = (*to_state == MsgState::Acked).then_some(now);
        let p = params![to_state, done_at, id, recipient, from_state];
        let n = execute(&self.conn, held, TRANSITION, p)?;
        self.moved(recipient, from_state, to_state, n);
        Ok(n == 1)
    }

    /// Moves several rows between states in one transaction.
    pub fn transition_many(
        &self,
        ids: &[i64],
        recipient: &str,
        from_state: &MsgState,
        to_state: &MsgState,
        now: i64,
    ) -> Res<usize> {
        let tx = self.conn.unchecked_transaction()?;
        let mut n = 0;
        {
            let done_at = (*to_state == MsgState::Acked).then_some(now);
            let mut stmt = tx.prepare_cached(TRANSITION)?;
            for id in ids {
                n += stmt.execute(params![to_state, done_at, id, recipient, from_state])?;
            }
        }
        tx.commit()?;
        self.moved(recipient, from_state, to_state, n);
        Ok(n)
    }

    /// Puts the inflight row `id` back into the queue. `counted` keeps its
    /// hand-out counted (else one is given back) and records `error`;
    /// `behind` moves it, with the later queued mail of its own sender in
    /// order behind it, to the tail of the queue, so the mail of other senders
    /// goes first; otherwise it keeps its place at the head. False when it was
    /// not inflight.
    pub fn requeue(
        &self,
        id: i64,
        recipient: &str,
        counted: bool,
        behind: bool,
        error: Option<&str>,
    ) -> Res<bool> {
        let tx = self.conn.unchecked_transaction()?;
        let found: Option<(String, i64)> = tx
            .query_row(
                "SELECT sender, seq FROM messages WHERE id = ?1 AND recipient = ?2
                 AND state = 'inflight'",
                params![id, recipient],
                |r| Ok((r.get(0)?, r.get::<_, Option<i64>>(1)?.unwrap_or(id))),
            )
            .optional()?;
        let Some((sender, seq)) = found else {
            return Ok(false);
        };
        tx.execute(
            "UPDATE messages SET state = 'queued',
                attempts = CASE WHEN ?2 THEN attempts ELSE MAX(attempts - 1, 0) END,
                last_error = COALESCE(?3, last_error)
             WHERE id = ?1",
            params![id, counted, error],
        )?;
        if behind {
            let mut ids = vec![id];
            {
                let mut stmt = tx.prepare_cached(
                    "SELECT id FROM messages WHERE recipient = ?1 AND state = 'queued'
                     AND sender = ?2 AND seq > ?3 ORDER BY seq, id",
                )?;
                let later = stmt.query_map(params![recipient, sender, seq], |r| r.get(0))?;
                for l in later {
                    ids.push(l?);
                }
            }
            let mut stmt = tx.prepare_cached("UPDATE messages SET seq = ?1 WHERE id = ?2")?;
            for moved in &ids {
                stmt.execute(params![self.queues.next_place(), moved])?;
            }
        }
        tx.commit()?;
        self.moved(recipient, &MsgState::Inflight, &MsgState::Queued, 1);
        Ok(true)
    }

    /// Dead-letters the inflight row `id`: `failed`, with `error` as its last
    /// error and now as its `done_at` (and its last hand-out given back unless
    /// it `ran`), and `notices` queued, in one transaction. False (and nothing
    /// queued) when it was not inflight, so the notices go out once.
    pub fn dead_letter(
        &self,
        id: i64,
        recipient: &str,
        error: &str,
        ran: bool,
        now: i64,
        notices: &[NewMessage],
    ) -> Res<bool> {
        let tx = self.conn.unchecked_transaction()?;
        let n = tx.execute(
            "UPDATE messages SET state = 'failed', last_error = ?1, done_at = ?2,
                attempts = CASE WHEN ?5 THEN attempts ELSE MAX(attempts - 1, 0) END
             WHERE id = ?3 AND recipient = ?4 AND state = 'inflight'",
            params![error, now, id, recipient, ran],
        )?;
        if n == 1 {
            insert_all(&tx, &self.queues, notices, now)?;
        }
        tx.commit()?;
        self.moved(recipient, &MsgState::Inflight, &MsgState::Failed, n);
        Ok(n == 1)
    }

    /// Stores a transient wake its harness gave up on as a dead letter of its
    /// own, with `notices` (built for its new id by `notices`), in one
    /// transaction; returns the new id.
    pub fn insert_dead_letter(
        &self,
        m: &NewMessage,
        attempts: u32,
        error: &str,
        now: i64,
        notices: impl FnOnce(i64) -> Vec<(Peer, String, String)>,
    ) -> Res<i64> {
        let tx = self.conn.unchecked_transaction()?;
        tx.execute(
            "INSERT INTO messages (sender, recipient, body, kind, in_reply_to, state, sent_at,
                done_at, attempts, last_error, seq)
             VALUES (?1, ?2, ?3, ?4, ?5, 'failed', ?6, ?6, ?7, ?8, ?9)",
            params![
                m.from,
                m.to,
                m.body,
                m.kind,
                m.in_reply_to,
                now,
                attempts,
                error,
                self.queues.next_place()
            ],
        )?;
        let id = tx.last_insert_rowid();
        let built = notices(id);
        let rows: Vec<NewMessage> = built
            .iter()
            .map(|(from, to, body)| NewMessage {
                from,
                to,
                body,
                kind: &MsgKind::DeadLetter,
                in_reply_to: None,
            })
            .collect();
        insert_all(&tx, &self.queues, &rows, now)?;
        tx.commit()?;
        Ok(id)
    }

    /// The dead letters of `agent` (or of every agent), oldest first.
    pub fn failed(&self, agent: Option<&str>) -> Res<Vec<FailedMessage>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, recipient, sender, body, kind, attempts, last_error, sent_at, done_at
             FROM messages WHERE state = 'failed' AND (?1 IS NULL OR recipient = ?1)
             ORDER BY done_at, id",
        )?;
        let rows = stmt.query_map(params![agent], |r| {
            Ok(FailedMessage {
                id: r.get(0)?,
                agent: r.get(1)?,
                from: r.get(2)?,
                body: r.get(3)?,
                kind: r.get(4)?,
                attempts: r.get::<_, i64>(5)?.clamp(0, u32::MAX as i64) as u32,
                last_error: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
                sent_at: r.get(7)?,
                failed_at: r.get(8)?,
            })
        })?;
        rows.collect()
    }

    pub fn count_failed(&self, recipient: &str) -> Res<u64> {
        self.conn
            .prepare_cached(
                "SELECT COUNT(*) FROM messages WHERE recipient = ?1 AND state = 'failed'",
            )?
            .query_row(params![recipient], |r| r.get::<_, i64>(0).map(|n| n as u64))
    }

    /// The attempts of message `id`, if it exists.
    pub fn attempts(&self, id: i64) -> Res<Option<u32>> {
        self.conn
            .prepare_cached("SELECT attempts FROM messages WHERE id = ?1")?
            .query_row(params![id], |r| r.get::<_, i64>(0))
            .optional()
            .map(|a| a.map(|a| a.clamp(0, u32::MAX as i64) as u32))
    }

    /// The recipient and state of message `id`, if it exists.
    pub fn message_state(&self, id: i64) -> Res<Option<(String, MsgState)>> {
        self.conn
            .prepare_cached("SELECT recipient, state FROM messages WHERE id = ?1")?
            .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
    }

    /// Puts the dead letter `id` back at the tail of its recipient's queue,
    /// its attempts and last error reset; false when it was not `failed`.
    pub fn retry(&self, id: i64) -> Res<bool> {
        // Its recipient is not at hand: forget every agent's queue.
        self.queues.forget_all();
        Ok(self.conn.execute(
            "UPDATE messages SET state = 'queued', attempts = 0, last_error = NULL,
                done_at = NULL, seq = ?2
             WHERE id = ?1 AND state = 'failed'",
            params![id, self.queues.next_place()],
        )? == 1)
    }

    pub fn stats(&self, agent: &str) -> Res<AgentStats> {
        let found = self
            .conn
            .query_row(
                "SELECT hyperhive_rev, status_text, status_set_at, turns, turns_ok, turns_failed,
                        tokens_in, tokens_out, cost_usd FROM agents WHERE name = ?1",
                params![agent],
                |r| {
                    Ok(AgentStats {
                        hyperhive_rev: r.get(0)?,
                        status_text: r.get(1)?,
                        status_set_at: r.get(2)?,
                        turns: r.get::<_, i64>(3)? as u64,
                        turns_ok: r.get::<_, i64>(4)? as u64,
                        turns_failed: r.get::<_, i64>(5)? as u64,
                        tokens_in: r.get::<_, i64>(6)? as u64,
                        tokens_out: r.get::<_, i64>(7)? as u64,
                        cost_usd: r.get(8)?,
                    })
                },
            )
            .optional()?;
        Ok(found.unwrap_or_default())
    }

    /// Runs `sql`, an `UPDATE agents … WHERE name = ?N`, on `agent`'s row,
    /// creating the row first when it is not there yet. The row of an agent
    /// that was ever seen is there, so this is one held statement and one
    /// commit: `post_turn_counts` runs it at the end of every turn.
    fn update_agent<P: rusqlite::Params + Copy>(&self, agent: &str, sql: &str, p: P) -> Res<()> {
        if self.conn.prepare_cached(sql)?.execute(p)? == 0 {
            self.conn
                .prepare_cached("INSERT OR IGNORE INTO agents (name) VALUES (?1)")?
                .execute(params![agent])?;
            self.conn.prepare_cached(sql)?.execute(p)?;
        }
        Ok(())
    }

    pub fn set_status(&self, agent: &str, text: &str, now: i64) -> Res<()> {
        let at = (!text.is_empty()).then_some(now);
        self.update_agent(
            agent,
            "UPDATE agents SET status_text = ?1, status_set_at = ?2 WHERE name = ?3",
            params![text, at, agent],
        )
    }

    pub fn set_rev(&self, agent: &str, rev: &str) -> Res<()> {
        self.update_agent(
            agent,
            "UPDATE agents SET hyperhive_rev = ?1 WHERE name = ?2",
            params![rev, agent],
        )
    }

    pub fn add_counts(&self, agent: &str, c: &PostTurnCounts) -> Res<()> {
        self.update_agent(
            agent,
            // The totals stop at 2^63 - 1 instead of overflowing: each post
            // is bounded (`PostTurnCounts::validate`), their number is not,
            // and a sum that fails would freeze the agent's counters.
            "UPDATE agents SET
                turns = CASE WHEN turns > ?8 - ?1 THEN ?8 ELSE turns + ?1 END,
                turns_ok = CASE WHEN turns_ok > ?8 - ?2 THEN ?8 ELSE turns_ok + ?2 END,
                turns_failed = CASE WHEN turns_failed > ?8 - ?3 THEN ?8 ELSE turns_failed + ?3 END,
                tokens_in = CASE WHEN tokens_in > ?8 - ?4 THEN ?8 ELSE tokens_in + ?4 END,
                tokens_out = CASE WHEN tokens_out > ?8 - ?5 THEN ?8 ELSE tokens_out + ?5 END,
                cost_usd = cost_usd + ?6 WHERE name = ?7",
            params![
                c.turns as i64,
                c.ok as i64,
                c.failed as i64,
                c.tokens_in as i64,
                c.tokens_out as i64,
                c.cost_usd,
                agent,
                i64::MAX
            ],
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn insert_question(
        &self,
        asker: &str,
        target: &Peer,
        question: &str,
        options: &[String],
        multi: bool,
        now: i64,
        expires_at: Option<i64>,
    ) -> Res<i64> {
        let options = serde_json::to_string(options).unwrap_or_else(|_| "[]".into());
        self.conn.execute(
            "INSERT INTO questions (asker, target, question, options, multi, asked_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                asker,
                target,
                question,
                options,
                multi as i64,
                now,
                expires_at
            ],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// A question that has not been answered, cancelled or expired.
    pub fn open_question(&self, id: i64) -> Res<Option<Question>> {
        self.conn
            .query_row(
                &format!("SELECT {Q_COLS} FROM questions WHERE id = ?1 AND answer IS NULL"),
                params![id],
                question_from_row,
            )
            .optional()
    }

    /// The open questions `who` asked, or that are addressed to `who`.
    pub fn questions_where(&self, side: Side, who: &str) -> Res<Vec<Question>> {
        let col = match side {
            Side::Asker => "asker",
            Side::Target => "target",
        };
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {Q_COLS} FROM questions WHERE {col} = ?1 AND answer IS NULL ORDER BY id"
        ))?;
        let rows = stmt.query_map(params![who], question_from_row)?;
        rows.collect()
    }

    pub fn expired_questions(&self, now: i64) -> Res<Vec<Question>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {Q_COLS} FROM questions
             WHERE answer IS NULL AND expires_at IS NOT NULL AND expires_at <= ?1 ORDER BY id"
        ))?;
        let rows = stmt.query_map(params![now], question_from_row)?;
        rows.collect()
    }

    /// Records an answer and queues the notice for `notify` in one transaction.
    pub fn close_question(
        &self,
        id: i64,
        answer: &str,
        by: &Peer,
        now: i64,
        notice: Option<&NewMessage>,
    ) -> Res<bool> {
        let tx = self.conn.unchecked_transaction()?;
        let n = tx.execute(
            "UPDATE questions SET answer = ?1, answered_by = ?2, answered_at = ?3
             WHERE id = ?4 AND answer IS NULL",
            params![answer, by, now, id],
        )?;
        if n == 1 {
            if let Some(m) = notice {
                queue_row(&tx, &self.queues, m, None, now)?;
            }
        }
        tx.commit()?;
        Ok(n == 1)
    }

    pub fn next_question_expiry(&self) -> Res<Option<i64>> {
        self.conn.query_row(
            "SELECT MIN(expires_at) FROM questions WHERE answer IS NULL",
            [],
            |r| r.get(0),
        )
    }

    /// Stores a reminder with its whole payload.
    pub fn insert_reminder(&self, agent: &str, body: &str, fire_at: i64, now: i64) -> Res<i64> {
        self.conn.execute(
            "INSERT INTO reminders (agent, body, fire_at, created_at)
             VALUES (?1, ?2, ?3, ?4)",
            params![agent, body, fire_at, now],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    pub fn count_reminders(&self, agent: &str) -> Res<u64> {
        self.conn.query_row(
            "SELECT COUNT(*) FROM reminders WHERE agent = ?1",
            params![agent],
            |r| r.get::<_, i64>(0).map(|n| n as u64),
        )
    }

    pub fn reminders_of(&self, agent: &str) -> Res<Vec<Reminder>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, agent, body, fire_at FROM reminders
             WHERE agent = ?1 ORDER BY fire_at, id",
        )?;
        let rows = stmt.query_map(params![agent], reminder_from_row)?;
        rows.collect()
    }

    pub fn due_reminders(&self, now: i64) -> Res<Vec<(Reminder, String)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, agent, body, fire_at FROM reminders
             WHERE fire_at <= ?1 ORDER BY fire_at, id",
        )?;
        let rows = stmt.query_map(params![now], |r| Ok((reminder_from_row(r)?, r.get(2)?)))?;
        rows.collect()
    }

    pub fn next_reminder(&self) -> Res<Option<i64>> {
        self.conn
            .query_row("SELECT MIN(fire_at) FROM reminders", [], |r| r.get(0))
    }

    /// Turns a due reminder into an inbox message, atomically; the message
    /// is charged to its agent.
    pub fn fire_reminder(&self, id: i64, msg: &NewMessage, now: i64) -> Res<Option<i64>> {
        let tx = self.conn.unchecked_transaction()?;
        let n = tx.execute("DELETE FROM reminders WHERE id = ?1", params![id])?;
        let mut new_id = None;
        if n == 1 {
            new_id = Some(queue_row(&tx, &self.queues, msg, Some(msg.to), now)?);
        }
        tx.commit()?;
        Ok(new_id)
    }

    /// Deletes a reminder the agent owns; false when it has no such reminder.
    pub fn delete_reminder(&self, agent: &str, id: i64) -> Res<bool> {
        let n = self.conn.execute(
            "DELETE FROM reminders WHERE id = ?1 AND agent = ?2",
            params![id, agent],
        )?;
        Ok(n == 1)
    }
}

impl Db {
    pub fn insert_scheduled(
        &self,
        agent: &str,
        body: &str,
        fire_at: i64,
        every: Option<u64>,
        now: i64,
    ) -> Res<i64> {
        self.conn.execute(
            "INSERT INTO scheduled (agent, body, fire_at, every_seconds, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![agent, body, fire_at, every.map(|e| e as i64), now],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    fn scheduled_where(&self, cond: &str, p: impl rusqlite::Params) -> Res<Vec<Scheduled>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT id, agent, body, fire_at, every_seconds FROM scheduled WHERE {cond}
             ORDER BY fire_at, id"
        ))?;
        let rows = stmt.query_map(p, |r| {
            Ok(Scheduled {
                id: r.get(0)?,
                agent: r.get(1)?,
                body: r.get(2)?,
                fire_at: r.get(3)?,
                every_seconds: r.get::<_, Option<i64>>(4)?.map(|e| e as u64),
            })
        })?;
        rows.collect()
    }

    pub fn scheduled_of(&self, agent: &str) -> Res<Vec<Scheduled>> {
        self.scheduled_where("agent = ?1", params![agent])
    }

    pub fn due_scheduled(&self, now: i64) -> Res<Vec<Scheduled>> {
        self.scheduled_where("fire_at <= ?1", params![now])
    }

    pub fn next_scheduled(&self) -> Res<Option<i64>> {
        self.conn
            .query_row("SELECT MIN(fire_at) FROM scheduled", [], |r| r.get(0))
    }

    pub fn delete_scheduled(&self, agent: &str, id: i64) -> Res<bool> {
        Ok(self.conn.execute(
            "DELETE FROM scheduled WHERE id = ?1 AND agent = ?2",
            params![id, agent],
        )? == 1)
    }

    pub fn insert_approval(
        &self,
        kind: &ApprovalKind,
        requester: &str,
        agent: &str,
        payload: &str,
        now: i64,
    ) -> Res<i64> {
        self.conn.execute(
            "INSERT INTO approvals (kind, requester, agent, payload, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![kind, requester, agent, payload, now],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    pub fn pending_approvals(&self) -> Res<Vec<Approval>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, kind, requester, agent, payload, state, created_at FROM approvals
             WHERE state = 'pending' ORDER BY id",
        )?;
        let rows = stmt.query_map([], |r| {
            let payload: String = r.get(4)?;
            Ok(Approval {
                id: r.get(0)?,
                kind: r.get(1)?,
                requester: r.get(2)?,
                agent: r.get(3)?,
                payload: serde_json::from_str(&payload).unwrap_or_default(),
                state: r.get(5)?,
                created_at: r.get(6)?,
            })
        })?;
        rows.collect()
    }

    /// Moves a pending approval to `state`; false when it was not pending.
    pub fn decide_approval(
        &self,
        id: i64,
        state: &ApprovalState,
        why: Option<&str>,
        now: i64,
    ) -> Res<bool> {
        Ok(self.conn.execute(
            "UPDATE approvals SET state = ?1, why = ?2, decided_at = ?3
             WHERE id = ?4 AND state = 'pending'",
            params![state, why, now, id],
        )? == 1)
    }
}

impl Db {
    /// Replaces the running bash tasks of `agent` with `tasks`.
    pub fn set_tasks(&self, agent: &str, tasks: &[RunningTask]) -> Res<()> {
        let tx = self.conn.unchecked_transaction()?;
        tx.execute("DELETE FROM running_tasks WHERE agent = ?1", params![agent])?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT OR REPLACE INTO running_tasks (agent, id, cmd, started_at, timeout_secs)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for t in tasks {
                stmt.execute(params![
                    agent,
                    t.id,
                    t.cmd,
                    t.started_at,
                    t.timeout_secs.map(|s| s as i64)
                ])?;
            }
        }
        tx.commit()
    }

    /// Keeps `agent` stopped across restarts of `hive up` (it was stopped by
    /// `by`: the operator or its manager).
    pub fn set_stopped(&self, agent: &str, by: &str, now: i64) -> Res<()> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO stopped_agents (name, stopped_by, stopped_at)
                 VALUES (?1, ?2, ?3)",
            )?
            .execute(params![agent, by, now])?;
        Ok(())
    }

    /// `agent` was started: it no longer stays stopped.
    pub fn clear_stopped(&self, agent: &str) -> Res<()> {
        self.conn
            .prepare_cached("DELETE FROM stopped_agents WHERE name = ?1")?
            .execute(params![agent])?;
        Ok(())
    }

    /// The agents kept stopped, by name.
    pub fn stopped_agents(&self) -> Res<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT name FROM stopped_agents ORDER BY name")?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect()
    }

    // ---- issue 16: pools, pauses, spend (step 7) ----

    /// The hive's salt for credential fingerprints, made on first use.
    pub fn salt(&self) -> Res<Vec<u8>> {
        let have: Option<Vec<u8>> = self
            .conn
            .query_row("SELECT salt FROM hive_salt WHERE id = 1", [], |r| r.get(0))
            .optional()?;
        if let Some(s) = have {
            return Ok(s);
        }
        let fresh = crate::sys::hash::random_bytes(32)
            .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
        self.conn.execute(
            "INSERT OR IGNORE INTO hive_salt (id, salt) VALUES (1, ?1)",
            params![fresh],
        )?;
        self.conn
            .query_row("SELECT salt FROM hive_salt WHERE id = 1", [], |r| r.get(0))
    }

    pub fn set_pool(&self, agent: &str, pool: &str, now: i64) -> Res<()> {
        self.conn
            .prepare_cached(
                "INSERT OR REPLACE INTO agent_pools (agent, pool, reported_at) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![agent, pool, now])?;
        Ok(())
    }

    /// Every agent's last reported pool.
    pub fn pools(&self) -> Res<Vec<(String, String)>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT agent, pool FROM agent_pools ORDER BY agent")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect()
    }

    /// Sets (or extends) `pool`'s pause.
    pub fn set_pool_pause(&self, pool: &str, until: i64, detail: &str, now: i64) -> Res<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO pool_pauses (pool, until, detail, since) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (pool) DO UPDATE SET until = ?2, detail = ?3",
            )?
            .execute(params![pool, until, detail, now])?;
        Ok(())
    }

    pub fn clear_pool_pause(&self, pool: &str) -> Res<()> {
        self.conn
            .prepare_cached("DELETE FROM pool_pauses WHERE pool = ?1")?
            .execute(params![pool])?;
        Ok(())
    }

    /// Every pool pause: (pool, until, detail).
    pub fn pool_pauses(&self) -> Res<Vec<(String, i64, String)>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT pool, until, detail FROM pool_pauses ORDER BY pool")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect()
    }

    /// The oldest queued message of `agent`, as its queue position.
    pub fn oldest_queued_seq(&self, agent: &str) -> Res<Option<i64>> {
        self.conn
            .prepare_cached(
                "SELECT MIN(seq) FROM messages WHERE recipient = ?1 AND state IN ('queued', 'inflight')",
            )?
            .query_row(params![agent], |r| r.get(0))
    }

    /// Keeps one run's spend, its figures already within the per-run bounds
    /// (`clamped`: they had to be cut); false when `key` was kept before (a
    /// re-send).
    pub fn insert_spend(&self, key: &str, agent: &str, at: i64, row: &Bounded) -> Res<bool> {
        let n = self
            .conn
            .prepare_cached(
                "INSERT OR IGNORE INTO spend (key, agent, at, usd, tokens, cache_read, clamped)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                key,
                agent,
                at,
                row.usd,
                i64::try_from(row.tokens).unwrap_or(i64::MAX),
                i64::try_from(row.cache_read).unwrap_or(i64::MAX),
                row.clamped
            ])?;
        Ok(n == 1)
    }

    /// What the spend rows since `since` (unix s) of `agent`, or of every
    /// agent, add up to, exactly. sqlite's `SUM` of integers stops with an
    /// error past 2^63, so each count is summed as its high and low 32 bits
    /// (neither sum can pass 2^63 below 2^32 rows; beyond, sqlite's error
    /// stands) and put together here in 128 bits: a total past `u64::MAX`,
    /// or a negative figure (a row no broker wrote), is an `Err` naming it,
    /// never a wrapped number. The outer `Err` is the store's.
    pub fn spend_since(&self, agent: Option<&str>, since: i64) -> Res<Result<SpendTotals, String>> {
        // Two statements, so an agent's is a range of `spend_agent_at` (one
        // with `?2 IS NULL OR agent = ?2` walked every agent's rows of the
        // window through `spend_at`).
        const SUMS: &str = "SELECT COALESCE(SUM(usd), 0), COUNT(*) - COUNT(usd),
                COALESCE(SUM(tokens >> 32), 0), COALESCE(SUM(tokens & 4294967295), 0),
                COALESCE(SUM(cache_read >> 32), 0), COALESCE(SUM(cache_read & 4294967295), 0),
                COALESCE(SUM(clamped != 0), 0),
                COALESCE(MIN(MIN(tokens, cache_read)), 0), COALESCE(MIN(usd), 0)
             FROM spend";
        let sql = match agent {
            Some(_) => format!("{SUMS} WHERE agent = ?2 AND at >= ?1"),
            None => format!("{SUMS} WHERE at >= ?1 AND ?2 IS NULL"),
        };
        let row = self
            .conn
            .prepare_cached(&sql)?
            .query_row(params![since, agent], |r| {
                Ok((
                    r.get::<_, f64>(0)?,
                    r.get::<_, i64>(1)?,
                    [r.get::<_, i64>(2)?, r.get::<_, i64>(3)?],
                    [r.get::<_, i64>(4)?, r.get::<_, i64>(5)?],
                    r.get::<_, i64>(6)?,
                    r.get::<_, i64>(7)?,
                    r.get::<_, f64>(8)?,
                ))
            })?;
        let (usd, unknown, tokens, cache_read, clamped, least, least_usd) = row;
        if least < 0 || least_usd < 0.0 {
            return Ok(Err(
                "a spend row holds a negative figure (no broker writes one)".into(),
            ));
        }
        let whole = |[high, low]: [i64; 2], what: &str| -> Result<u64, String> {
            let total = (i128::from(high) << 32) + i128::from(low);
            u64::try_from(total)
                .map_err(|_| format!("the {what} of the spend rows add up past 2^64 ({total})"))
        };
        let totals = || -> Result<SpendTotals, String> {
            Ok(SpendTotals {
                usd,
                unknown: unknown.max(0) as u64,
                tokens: whole(tokens, "tokens")?,
                cache_read: whole(cache_read, "cache reads")?,
                clamped: clamped.max(0) as u64,
            })
        };
        Ok(totals())
    }

    /// Removes the spend rows since `since` (unix s) of `agent`, or of every
    /// agent, with the budget notices of the windows they were in (so a
    /// budget reached again is told again); how many rows went.
    pub fn void_spend(&self, agent: Option<&str>, since: i64) -> Res<u64> {
        let tx = self.conn.unchecked_transaction()?;
        let n = match agent {
            Some(a) => tx.execute(
                "DELETE FROM spend WHERE agent = ?1 AND at >= ?2",
                params![a, since],
            )?,
            None => tx.execute("DELETE FROM spend WHERE at >= ?1", params![since])?,
        };
        match agent {
            Some(a) => tx.execute(
                "DELETE FROM budget_notices WHERE (scope = ?1 OR scope = 'hive') AND window_start >= ?2",
                params![a, since],
            )?,
            None => tx.execute(
                "DELETE FROM budget_notices WHERE window_start >= ?1",
                params![since],
            )?,
        };
        tx.commit()?;
        Ok(n as u64)
    }

    /// Records a budget notice; false when it was sent before.
    pub fn budget_notice(&self, scope: &str, window_start: i64, level: u32) -> Res<bool> {
        let n = self
            .conn
            .prepare_cached(
                "INSERT OR IGNORE INTO budget_notices (scope, window_start, level) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![scope, window_start, level])?;
        Ok(n == 1)
    }

    /// The running bash tasks `agent`'s daemon last reported, oldest first.
    pub fn tasks_of(&self, agent: &str) -> Res<Vec<RunningTask>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, cmd, started_at, timeout_secs FROM running_tasks WHERE agent = ?1
             ORDER BY started_at, id",
        )?;
        let rows = stmt.query_map(params![agent], |r| {
            Ok(RunningTask {
                id: r.get(0)?,
                cmd: r.get(1)?,
                started_at: r.get(2)?,
                timeout_secs: r.get::<_, Option<i64>>(3)?.map(|s| s as u64),
            })
        })?;
        rows.collect()
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

    /// What [`Queues`] knows of `agent`'s queue: None, or the known first
    /// row's id and the count behind it (0, 0 for a known empty queue).
    fn known(db: &Db, agent: &str) -> Option<(i64, u64)> {
        db.queues.heads.borrow().get(agent).map(|h| match h {
            Head::Empty => (0, 0),
            Head::First { message, behind } => (message.id, *behind),
        })
    }

    #[test]
    fn a_known_first_row_is_handed_out_as_the_queue_would_hand_it_out() {
        let fresh = fresh_db("known");
        let db = Db::open(&fresh.path, Durability::Normal).unwrap();
        assert_eq!(db.take_next("a", true).unwrap(), (None, 0));
        assert_eq!(known(&db, "a"), Some((0, 0)), "found empty");
        // A long-poll on a queue known to be empty reads nothing.
        assert_eq!(db.take_next("a", true).unwrap(), (None, 0));
        assert_eq!(known(&db, "a"), Some((0, 0)));
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
            };
            ids.push(db.insert_message(&m, 100 + i as i64).unwrap());
        }
        assert_eq!(known(&db, "a"), Some((ids[0], 2)));
        // Each row handed out, whether known or read, is the row as stored.
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
        // The last hand-out left the queue known empty again.
        assert_eq!(known(&db, "a"), Some((0, 0)));
        let id = db.insert_message(&msg("a", "next"), 300).unwrap();
        assert_eq!(known(&db, "a"), Some((id, 0)));
        let (t, queued) = db.take_next("a", true).unwrap();
        assert_eq!((t.unwrap().message.body, queued), ("next".to_string(), 0));
    }

    #[test]
    fn what_is_known_of_a_queue_is_forgotten_by_every_other_write() {
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
        assert!(known(&db, "a").is_some());
        // The inflight row put back at the head goes before the known row.
        assert!(db.requeue(first, "a", false, false, None).unwrap());
        assert_eq!(known(&db, "a"), None);
        assert_eq!(body(&db).as_deref(), Some("1"));
        assert!(db
            .transition(first, "a", &MsgState::Inflight, &MsgState::Acked, 2)
            .unwrap());
        let (t, _) = db.take_next("a", true).unwrap();
        let second = t.unwrap().message;
        assert_eq!((second.body.as_str(), known(&db, "a")), ("2", Some((0, 0))));
        assert!(db
            .transition(second.id, "a", &MsgState::Inflight, &MsgState::Acked, 2)
            .unwrap());
        // Drained by the MCP tool (held), the known row is not handed out.
        let held = db.insert_message(&msg("a", "3"), 1).unwrap();
        assert!(known(&db, "a").is_some());
        let moved = db
            .transition_many(&[held], "a", &MsgState::Queued, &MsgState::Held, 3)
            .unwrap();
        assert_eq!(moved, 1);
        assert_eq!(known(&db, "a"), None);
        assert_eq!(db.take_next("a", false).unwrap().0, None);
        // A row inserted in a transaction that rolls back is never handed out.
        assert_eq!(
            db.take_next("a", true).unwrap().0.map(|t| t.message.id),
            None
        );
        assert_eq!(known(&db, "a"), Some((0, 0)));
        {
            let batch = db.batch().unwrap();
            batch.insert_message(&msg("a", "rolled back"), 4).unwrap();
            assert_eq!(known(&db, "a"), None);
        }
        assert_eq!(body(&db), None);
        // A dead letter put back (its recipient not at hand) forgets them all.
        db.insert_message(&msg("a", "4"), 5).unwrap();
        let (t, _) = db.take_next("a", true).unwrap();
        let dead = t.unwrap().message.id;
        assert!(db.dead_letter(dead, "a", "gave up", true, 6, &[]).unwrap());
        assert_eq!(body(&db), None);
        db.insert_message(&msg("a", "5"), 7).unwrap();
        assert!(known(&db, "a").is_some());
        assert!(db.retry(dead).unwrap());
        assert_eq!(known(&db, "a"), None);
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
}
