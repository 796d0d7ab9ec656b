//! The schema of `broker.db`, version by version: [`MIGRATIONS`], the
//! ordered steps `proto::schema` applies (`PRAGMA user_version`), and the
//! frozen SQL of the steps that write it out. A shipped step never changes:
//! the text here is byte for byte what each release ran.

use super::*;

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
    Step {
        version: 16,
        what: "receipts: each message's hand-out and acking turn, a sender index, pruned ids",
        apply: |tx| tx.execute_batch(messages::SCHEMA_V16),
    },
    Step {
        version: 17,
        what: "traces: the traceparent a message carries",
        apply: |tx| tx.execute_batch(traces::SCHEMA_V17),
    },
    Step {
        version: 18,
        what: "notifications: the outbox of events for the operator, a queue per destination",
        apply: |tx| tx.execute_batch(outbox::SCHEMA_V18),
    },
];

/// Step 10 (issue 40): one run's row counts at most $1000 and 10^9 tokens
/// (and 10^9 cache reads; `proto::cmd::MAX_RUN_USD`, `MAX_RUN_TOKENS`); a
/// report above is kept clamped, with `clamped` set. Rows older releases
/// kept whole above the bounds (they took up to $10^6 and 10^12 tokens) are
/// clamped and flagged the same way, so every row the broker wrote is within
/// them. The figures are written out here: a shipped step never changes.
pub(super) const SPEND_V10: &str = "
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
pub(super) const MESSAGES_V9: &str = "
DROP TRIGGER messages_seq_on_insert;
DROP INDEX messages_seq;
";

/// Step 6: a long reminder's payload used to spill to a file under the
/// broker's state dir, which an agent running as its own user could not read.
/// Each such file is read once into the row's `body`; a row whose file is gone
/// (or unreadable) is kept, its 200-character preview followed by a note that
/// the rest was lost. The `spill_file` column goes; the old files are left
/// where they are (the operator may delete `STATE/agents/*/reminders/`).
pub(super) fn absorb_reminder_spill_files(tx: &rusqlite::Transaction) -> Res<()> {
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
pub(super) const LIMITS_V7: &str = "
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

/// Step 3: `attempts` (hand-outs that count toward the harness's attempt
/// limit), `last_error`, `seq` (the queue position: new rows go last, a
/// message that failed for its own reasons moves behind later mail) and the
/// `failed` state. `done_at` is also when a message was dead-lettered.
pub(super) const MESSAGES_V3: &str = "
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
pub(super) const MESSAGES_V8: &str = "
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

pub(super) const SCHEMA_V1: &str = "
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
