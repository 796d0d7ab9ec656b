//! Retention in `broker.db` (issue 40, item 4; schema step 12): which rows
//! may go, the connection that deletes them, and what each agent has stored.
//!
//! A message row may carry the agent it is charged to (`charged`: what an
//! agent sent, woke itself with or had its timers fire; none for the
//! operator's mail, system notices, the harness's own and rows older than
//! step 12). Two triggers keep `stored_bytes`, each agent's running sum of
//! the bytes of its charged bodies, with every insert and delete, so the sum
//! is read, never counted, and a broker that starts reads a row per agent.
//!
//! An acked message handled before a cutoff is pruned unless a pending
//! outbox entry carries it or it is the event of a question still open; a
//! queued, inflight, held or failed row never is. A notification event
//! (step 18) goes by its age once every destination has it, never while
//! pending. Spend rows go by their
//! run's end, and the budget notices by their window's start. The deletes
//! run on the prune thread's own connection ([`Pruner`], `broker/prune.rs`),
//! one short `IMMEDIATE` transaction per batch, so the hub waits at most one
//! batch for the write lock. Each message deleted leaves its id and
//! sender in `pruned_messages` (step 16), so `message_state` tells its
//! sender it was pruned rather than that it never was.

use super::{Durability, Res};
use rusqlite::{params, Connection};
use std::collections::BTreeMap;
use std::path::Path;

/// Schema step 12.
pub(super) const SCHEMA_V12: &str = "
ALTER TABLE messages ADD COLUMN charged TEXT;
CREATE TABLE stored_bytes (
    agent TEXT PRIMARY KEY,
    bytes INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX messages_acked ON messages (done_at) WHERE state = 'acked';
CREATE TRIGGER messages_charged_insert AFTER INSERT ON messages
WHEN NEW.charged IS NOT NULL
BEGIN
    INSERT INTO stored_bytes (agent, bytes) VALUES (NEW.charged, octet_length(NEW.body))
    ON CONFLICT (agent) DO UPDATE SET bytes = bytes + excluded.bytes;
END;
CREATE TRIGGER messages_charged_delete AFTER DELETE ON messages
WHEN OLD.charged IS NOT NULL
BEGIN
    UPDATE stored_bytes SET bytes = MAX(bytes - octet_length(OLD.body), 0)
    WHERE agent = OLD.charged;
END;
";

/// What keeps an acked message `m` although it is old: a pending outbox
/// entry carries it (the bridge has not sent it), or it is the event of a
/// question that is still open.
const REFERENCED: &str = "EXISTS (SELECT 1 FROM outbox o WHERE o.msg_id = m.id
    AND (o.state = 'pending' OR EXISTS (SELECT 1 FROM questions q
        WHERE q.id = o.question AND q.answer IS NULL)))";

/// The largest total of bodies one batch deletes, besides its row count: a
/// batch of 64 KiB bodies frees 8 MiB at most.
const BATCH_BYTES: u64 = 8 << 20;

impl super::Db {
    /// Each agent's stored bytes: the running sums of step 12's triggers.
    pub fn stored_bytes(&self) -> Res<BTreeMap<String, u64>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT agent, bytes FROM stored_bytes WHERE bytes > 0")?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
        })?;
        rows.collect()
    }
}

/// One batch of messages pruned: how many, and the bytes of their bodies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrunedMessages {
    pub rows: u64,
    pub bytes: u64,
}

/// The prune thread's connection to `broker.db`: the store's second writer,
/// in batches (see the module's text and `docs/architecture.md`).
pub struct Pruner {
    conn: Connection,
}

impl Pruner {
    /// Opens the store at `path`, which the broker opened and migrated
    /// already: the same durability as the hub's connection, sqlite's own
    /// checkpoints off (the `checkpoint` thread's), and a busy timeout, so
    /// a batch waits for a write of the hub's instead of failing.
    pub fn open(path: &Path, durability: Durability) -> Result<Pruner, String> {
        let mut conn = Connection::open(path)
            .map_err(|e| format!("cannot open {} to prune it: {e}", path.display()))?;
        // A batch reads before it deletes: it takes the write lock first.
        conn.set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
        let sync = match durability {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        };
        conn.execute_batch(&format!(
            "PRAGMA busy_timeout=5000; PRAGMA synchronous={sync}; PRAGMA wal_autocheckpoint=0;"
        ))
        .map_err(|e| format!("cannot prepare {} to prune it: {e}", path.display()))?;
        Ok(Pruner { conn })
    }

    /// The next acked messages handled before `before` that nothing
    /// refers to, oldest first: at most `limit` rows and [`BATCH_BYTES`] of
    /// bodies (at least one row). A read, outside any write lock.
    pub fn prunable(&self, before: i64, limit: u32) -> Res<Vec<i64>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT m.id, octet_length(m.body) FROM messages m INDEXED BY messages_acked
             WHERE m.state = 'acked' AND m.done_at < ?1 AND NOT {REFERENCED}
             ORDER BY m.done_at LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![before, limit], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
        })?;
        let mut ids = Vec::new();
        let mut bytes = 0;
        for row in rows {
            let (id, len) = row?;
            if !ids.is_empty() && bytes + len > BATCH_BYTES {
                break;
            }
            bytes += len;
            ids.push(id);
        }
        Ok(ids)
    }

    /// Deletes the messages `ids` in one transaction, each only while it is
    /// still acked before `before` and unreferenced, with its settled
    /// outbox rows.
    pub fn delete_messages(&self, ids: &[i64], before: i64) -> Res<PrunedMessages> {
        let tx = self.conn.unchecked_transaction()?;
        let mut done = PrunedMessages::default();
        {
            let mut size = tx.prepare_cached(&format!(
                "SELECT octet_length(m.body) FROM messages m
                 WHERE m.id = ?1 AND m.state = 'acked' AND m.done_at < ?2 AND NOT {REFERENCED}"
            ))?;
            // The tombstone `message_state` reads (step 16): the sender,
            // when the row was an agent's own send (charged to it, or older
            // than charging).
            let mut tombstone = tx.prepare_cached(
                "INSERT OR IGNORE INTO pruned_messages (id, sender)
                 SELECT id, CASE WHEN charged IS NULL OR charged = sender THEN sender ELSE '' END
                 FROM messages WHERE id = ?1",
            )?;
            let mut message = tx.prepare_cached("DELETE FROM messages WHERE id = ?1")?;
            let mut outbox =
                tx.prepare_cached("DELETE FROM outbox WHERE msg_id = ?1 AND state != 'pending'")?;
            for id in ids {
                let len: Option<i64> = rusqlite::OptionalExtension::optional(
                    size.query_row(params![id, before], |r| r.get(0)),
                )?;
                let Some(len) = len else { continue };
                tombstone.execute(params![id])?;
                message.execute(params![id])?;
                outbox.execute(params![id])?;
                done.rows += 1;
                done.bytes += len.max(0) as u64;
            }
        }
        tx.commit()?;
        Ok(done)
    }

    /// Deletes up to `limit` notification events older than `before` that
    /// every destination's queue is past (step 18); a pending one — after
    /// some destination's cursor — is never deleted.
    pub fn delete_notify_events(&self, before: i64, limit: u32) -> Res<u64> {
        let n = self
            .conn
            .prepare_cached(
                "DELETE FROM notify_events WHERE id IN (SELECT id FROM notify_events
                    WHERE at < ?1
                      AND id <= (SELECT COALESCE(MIN(cursor), 9223372036854775807) FROM notify_dests)
                    ORDER BY id LIMIT ?2)",
            )?
            .execute(params![before, limit])?;
        Ok(n as u64)
    }

    /// Deletes up to `limit` spend rows of runs that ended before `before`,
    /// and the budget notices of windows that started before it, in one
    /// transaction; the spend rows deleted.
    pub fn delete_spend(&self, before: i64, limit: u32) -> Res<u64> {
        let tx = self.conn.unchecked_transaction()?;
        let n = tx
            .prepare_cached(
                "DELETE FROM spend WHERE key IN
                 (SELECT key FROM spend WHERE at < ?1 ORDER BY at LIMIT ?2)",
            )?
            .execute(params![before, limit])?;
        tx.prepare_cached("DELETE FROM budget_notices WHERE window_start < ?1")?
            .execute(params![before])?;
        tx.commit()?;
        Ok(n as u64)
    }
}
