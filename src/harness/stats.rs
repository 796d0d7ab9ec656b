//! `turn-stats.db`: one row per claude process the harness ran (turns,
//! checkpoint turns, compactions), written by the turn loop only. Readers such as
//! the web UI open their own read-only connection per request. Each row also
//! keeps the run's spend row for the broker (issue 16): its idempotency key
//! (the boot id of the harness that ran it and the row id, stored with the row
//! so it is the same after any restart) and whether the broker acknowledged
//! it; at boot the loop sends the unacknowledged ones again, oldest first,
//! each with its run's end (`started_at` + the duration), so the broker
//! counts it in the window the run happened in.
//!
//! The run that lets a message go (acks it) also records the message in the
//! `completed` table, in the row's own transaction and so before the ack is
//! sent: a message handed out again because the ack never reached the
//! broker (the broker was down, the harness was killed) is then known
//! ([`Stats::completed`]) and acked without running claude. The table keeps
//! the newest [`turnstats::COMPLETED_KEEP`] messages.

use super::turnstats;
use crate::proto::cmd::ReportSpend;
use crate::proto::Message;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde::Serialize;
use std::path::Path;

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TurnRow {
    pub id: i64,
    /// Unix seconds when claude was spawned.
    pub started_at: i64,
    pub duration_ms: u64,
    /// `turn`, `checkpoint`, `compact` or `continue`.
    pub kind: String,
    pub outcome: String,
    pub model: String,
    pub sender: String,
    pub message_id: Option<i64>,
    pub context_tokens: Option<u64>,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    pub session_id: Option<String>,
    pub note: String,
}

/// What identifies a broker message among those the harness let go: its
/// id, when it was sent, its sender and its body's digest, so a broker.db
/// restored or rewound that reuses the id for another message does not pass
/// for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageKey {
    pub id: i64,
    pub sent_at: i64,
    pub sender: String,
    /// SHA-256 of the body, hex.
    pub body_sha256: String,
}

impl MessageKey {
    pub fn of(m: &Message) -> MessageKey {
        MessageKey {
            id: m.id,
            sent_at: m.sent_at,
            sender: m.from.to_string(),
            body_sha256: crate::sys::hash::hex(&crate::sys::hash::sha256(m.body.as_bytes())),
        }
    }
}

/// A run's spend row for the broker (issue 16), before it has its key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spend<'a> {
    /// The harness's boot id, the first half of the key.
    pub boot_id: &'a str,
    pub usd: Option<f64>,
    pub tokens: u64,
    pub cache_read: u64,
}

/// The writer, owned by the turn loop.
pub struct Stats {
    conn: Connection,
}

impl Stats {
    /// Opens (creating) the db, 0600 whatever the umask; sqlite gives its `-wal`
    /// and `-shm` files the db file's mode.
    pub fn open(path: &Path) -> Result<Stats, String> {
        super::files::ensure_private_file(path)
            .map_err(|e| format!("cannot open turn stats {}: {e}", path.display()))?;
        let mut conn = Connection::open(path)
            .and_then(|c| {
                c.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")?;
                Ok(c)
            })
            .map_err(|e| format!("cannot open turn stats {}: {e}", path.display()))?;
        turnstats::migrate(&mut conn)?;
        Ok(Stats { conn })
    }

    /// Stores one run; its row id (the spend row's idempotency key uses it).
    pub fn record(&self, r: &TurnRow) -> Result<i64, String> {
        insert_row(&self.conn, r).map_err(|e| format!("cannot record turn stats: {e}"))
    }

    /// Stores one run with its spend row, in one transaction: the row's id
    /// and the spend row to send, keyed `BOOT:ID` and not yet acknowledged.
    /// The same transaction marks the spend rows in `acked` acknowledged (the
    /// broker's acknowledgements since the last run: writing them here costs
    /// the turn no commit of its own) and, when the run lets its message go
    /// (`let_go`), records the message as completed with the row's outcome,
    /// keeping the newest [`turnstats::COMPLETED_KEEP`].
    pub fn record_with_spend(
        &self,
        r: &TurnRow,
        spend: &Spend<'_>,
        acked: &[String],
        let_go: Option<&MessageKey>,
    ) -> Result<(i64, ReportSpend), String> {
        let err = |e: rusqlite::Error| format!("cannot record turn stats: {e}");
        let Spend {
            boot_id,
            usd,
            tokens,
            cache_read,
        } = *spend;
        let (id, key) = crate::proto::schema::in_transaction(&self.conn, |c| {
            for key in acked {
                mark_acked(c, key)?;
            }
            let id = insert_row(c, r)?;
            let key = format!("{boot_id}:{id}");
            c.prepare_cached(
                "UPDATE turns SET spend_key = ?1, spend_usd = ?2, spend_tokens = ?3,
                     spend_cache_read = ?4, spend_acked = 0 WHERE id = ?5",
            )?
            .execute(params![key, usd, tokens as i64, cache_read as i64, id])?;
            if let Some(m) = let_go {
                let (outcome, _) = turnstats::stored_outcome(&r.outcome, "");
                insert_completed(c, m, &outcome, run_end(r.started_at, r.duration_ms as i64))?;
            }
            Ok((id, key))
        })
        .map_err(err)?;
        Ok((
            id,
            ReportSpend {
                key,
                usd,
                tokens,
                cache_read,
                at: Some(run_end(r.started_at, r.duration_ms as i64)),
            },
        ))
    }

    /// The outcome a run of message `m` that let it go was recorded with
    /// (`ok`, `interrupted`, `turn_budget`…), or None when no such run is
    /// known.
    pub fn completed(&self, m: &MessageKey) -> Result<Option<String>, String> {
        self.conn
            .prepare_cached(
                "SELECT outcome FROM completed
                 WHERE message_id = ?1 AND sent_at = ?2 AND sender = ?3 AND body_sha256 = ?4",
            )
            .and_then(|mut st| {
                st.query_row(params![m.id, m.sent_at, m.sender, m.body_sha256], |r| {
                    r.get(0)
                })
                .optional()
            })
            .map_err(|e| format!("cannot read whether message #{} was completed: {e}", m.id))
    }

    /// The broker acknowledged the spend rows `keys`: marked so in one
    /// transaction.
    pub fn spend_acked(&self, keys: &[String]) -> Result<(), String> {
        crate::proto::schema::in_transaction(&self.conn, |c| {
            keys.iter().try_for_each(|key| mark_acked(c, key))
        })
        .map_err(|e| format!("cannot mark {} spend rows acknowledged: {e}", keys.len()))
    }

    /// At most `limit` spend rows the broker never acknowledged, oldest first.
    pub fn unacked_spend(&self, limit: u32) -> Result<Vec<ReportSpend>, String> {
        let read = || -> rusqlite::Result<Vec<ReportSpend>> {
            let mut stmt = self.conn.prepare(
                "SELECT spend_key, spend_usd, spend_tokens, spend_cache_read, started_at,
                        duration_ms FROM turns
                 WHERE spend_acked = 0 AND spend_key IS NOT NULL ORDER BY id LIMIT ?1",
            )?;
            let rows = stmt.query_map(params![limit], |r| {
                Ok(ReportSpend {
                    key: r.get(0)?,
                    usd: r.get(1)?,
                    tokens: r.get::<_, i64>(2)?.max(0) as u64,
                    cache_read: r.get::<_, i64>(3)?.max(0) as u64,
                    at: Some(run_end(r.get(4)?, r.get(5)?)),
                })
            })?;
            rows.collect()
        };
        read().map_err(|e| format!("cannot read the unacknowledged spend rows: {e}"))
    }

    /// The newest row, to seed the context size and last-turn time at boot.
    pub fn last(&self) -> Option<TurnRow> {
        query(&self.conn, 1).ok()?.pop()
    }
}

/// When a run ended, unix seconds: its start plus its duration.
fn run_end(started_at: i64, duration_ms: i64) -> i64 {
    started_at.saturating_add(duration_ms.max(0) / 1000)
}

fn query(conn: &Connection, limit: u32) -> rusqlite::Result<Vec<TurnRow>> {
    let mut stmt = conn.prepare(
        "SELECT id, started_at, duration_ms, kind, outcome, model, sender, message_id,
                context_tokens, tokens_in, tokens_out, cost_usd, session_id, note
         FROM turns ORDER BY id DESC LIMIT ?1",
    )?;
    let rows = stmt.query_map(params![limit], |r| {
        Ok(TurnRow {
            id: r.get(0)?,
            started_at: r.get(1)?,
            duration_ms: r.get::<_, i64>(2)? as u64,
            kind: r.get(3)?,
            outcome: r.get(4)?,
            model: r.get(5)?,
            sender: r.get(6)?,
            message_id: r.get(7)?,
            context_tokens: r.get::<_, Option<i64>>(8)?.map(|t| t as u64),
            tokens_in: r.get::<_, i64>(9)? as u64,
            tokens_out: r.get::<_, i64>(10)? as u64,
            cost_usd: r.get(11)?,
            session_id: r.get(12)?,
            note: r.get(13)?,
        })
    })?;
    rows.collect()
}

/// Sums over every row of one kind and outcome, for `/metrics`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Totals {
    pub kind: String,
    pub outcome: String,
    pub count: u64,
    pub duration_ms: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    /// Cache reads (`spend_cache_read`).
    pub cache_read: u64,
    /// Cache writes: the spend row's tokens (input + cache writes + output)
    /// less input and output.
    pub cache_creation: u64,
}

/// Per-(kind, outcome) sums over the whole table, through a read-only connection.
/// Inserts one run's row; its id.
fn insert_row(c: &Connection, r: &TurnRow) -> rusqlite::Result<i64> {
    let (outcome, note) = turnstats::stored_outcome(&r.outcome, &r.note);
    // Prepared once per connection (the statement cache), not per run.
    c.prepare_cached(
        "INSERT INTO turns (started_at, duration_ms, kind, outcome, model, sender,
            message_id, context_tokens, tokens_in, tokens_out, cost_usd, session_id, note)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
    )?
    .execute(params![
        r.started_at,
        r.duration_ms as i64,
        r.kind,
        outcome,
        r.model,
        r.sender,
        r.message_id,
        r.context_tokens.map(|t| t as i64),
        r.tokens_in as i64,
        r.tokens_out as i64,
        r.cost_usd,
        r.session_id,
        note
    ])?;
    Ok(c.last_insert_rowid())
}

/// Records message `m` as let go with `outcome` at `at`, and drops the
/// records past the newest [`turnstats::COMPLETED_KEEP`].
fn insert_completed(
    c: &Connection,
    m: &MessageKey,
    outcome: &str,
    at: i64,
) -> rusqlite::Result<()> {
    // Recorded again (a run that finished once more), it is the newest.
    c.prepare_cached(
        "INSERT OR REPLACE INTO completed
             (message_id, sent_at, sender, body_sha256, outcome, completed_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?
    .execute(params![
        m.id,
        m.sent_at,
        m.sender,
        m.body_sha256,
        outcome,
        at
    ])?;
    let newest = c.last_insert_rowid();
    c.prepare_cached("DELETE FROM completed WHERE id <= ?1")?
        .execute(params![newest - turnstats::COMPLETED_KEEP])?;
    Ok(())
}

/// Marks the spend row `key` acknowledged.
fn mark_acked(c: &Connection, key: &str) -> rusqlite::Result<()> {
    c.prepare_cached("UPDATE turns SET spend_acked = 1 WHERE spend_key = ?1 AND spend_acked = 0")?
        .execute(params![key])
        .map(|_| ())
}

pub fn totals(path: &Path) -> Result<Vec<Totals>, String> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("cannot read turn stats {}: {e}", path.display()))?;
    let read = || -> rusqlite::Result<Vec<Totals>> {
        let mut stmt = conn.prepare(
            "SELECT kind, outcome, COUNT(*), SUM(duration_ms), SUM(tokens_in), SUM(tokens_out),
                    SUM(cost_usd), SUM(spend_cache_read),
                    SUM(MAX(spend_tokens - tokens_in - tokens_out, 0))
             FROM turns GROUP BY kind, outcome ORDER BY kind, outcome",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok(Totals {
                kind: r.get(0)?,
                outcome: r.get(1)?,
                count: r.get::<_, i64>(2)? as u64,
                duration_ms: r.get::<_, i64>(3)? as u64,
                tokens_in: r.get::<_, i64>(4)? as u64,
                tokens_out: r.get::<_, i64>(5)? as u64,
                cost_usd: r.get(6)?,
                cache_read: r.get::<_, i64>(7)?.max(0) as u64,
                cache_creation: r.get::<_, i64>(8)?.max(0) as u64,
            })
        })?;
        rows.collect()
    };
    read().map_err(|e| format!("cannot read turn stats: {e}"))
}

/// The newest `limit` rows, newest first, through a read-only connection.
pub fn recent(path: &Path, limit: u32) -> Result<Vec<TurnRow>, String> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(|e| format!("cannot read turn stats {}: {e}", path.display()))?;
    query(&conn, limit).map_err(|e| format!("cannot read turn stats: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(started_at: i64, duration_ms: u64) -> TurnRow {
        TurnRow {
            id: 0,
            started_at,
            duration_ms,
            kind: "turn".into(),
            outcome: "ok".into(),
            model: "sonnet".into(),
            sender: "operator".into(),
            message_id: Some(1),
            context_tokens: None,
            tokens_in: 100,
            tokens_out: 10,
            cost_usd: 0.01,
            session_id: None,
            note: String::new(),
        }
    }

    #[test]
    fn a_spend_row_carries_its_runs_end_also_when_sent_again() {
        let dir = std::env::temp_dir().join(format!("hive-stats-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("turn-stats.db");
        let stats = Stats::open(&path).unwrap();
        // A run that started yesterday at 23:59:50 and took 20.5 s.
        let start = 1_795_305_590;
        let spend = Spend {
            boot_id: "b00t",
            usd: Some(0.01),
            tokens: 110,
            cache_read: 50,
        };
        let (_, sent) = stats
            .record_with_spend(&row(start, 20_500), &spend, &[], None)
            .unwrap();
        assert_eq!(sent.at, Some(start + 20));
        // After a restart the unacknowledged row goes again, with the same
        // end: the broker counts it in the run's window, not the re-send's.
        drop(stats);
        let stats = Stats::open(&path).unwrap();
        let again = stats.unacked_spend(10).unwrap();
        assert_eq!(again, vec![sent.clone()]);
        stats.spend_acked(std::slice::from_ref(&sent.key)).unwrap();
        assert!(stats.unacked_spend(10).unwrap().is_empty());
        drop(stats);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_message_let_go_is_known_by_its_id_time_sender_and_body_and_the_newest_are_kept() {
        let dir = std::env::temp_dir().join(format!("hive-completed-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("turn-stats.db");
        let stats = Stats::open(&path).unwrap();
        let message = |id: i64, sent_at: i64, from: &str, body: &str| {
            let m: Message = serde_json::from_value(serde_json::json!({
                "id": id, "from": from, "to": "ana", "body": body, "sent_at": sent_at,
            }))
            .unwrap();
            MessageKey::of(&m)
        };
        let spend = Spend {
            boot_id: "b00t",
            usd: None,
            tokens: 0,
            cache_read: 0,
        };
        let done = message(7, 1_795_300_000, "operator", "deploy it");
        assert_eq!(stats.completed(&done).unwrap(), None);
        stats
            .record_with_spend(&row(1, 2), &spend, &[], Some(&done))
            .unwrap();
        assert_eq!(stats.completed(&done).unwrap().as_deref(), Some("ok"));
        // The same id for another message (a rewound broker.db): unknown.
        for other in [
            message(7, 1_795_300_001, "operator", "deploy it"),
            message(7, 1_795_300_000, "bob", "deploy it"),
            message(7, 1_795_300_000, "operator", "deploy it again"),
        ] {
            assert_eq!(stats.completed(&other).unwrap(), None, "{other:?}");
        }
        // A run that does not let its message go records nothing.
        let kept = message(8, 1, "operator", "x");
        stats
            .record_with_spend(&row(1, 2), &spend, &[], None)
            .unwrap();
        assert_eq!(stats.completed(&kept).unwrap(), None);
        // Bounded: past the newest COMPLETED_KEEP, the oldest go.
        // `done` is row 1; a record written as the KEEPth after it makes
        // the next one the first past the bound.
        stats
            .conn
            .execute(
                "INSERT INTO completed VALUES (?1, 9, 9, 'x', 'x', 'ok', 9)",
                params![turnstats::COMPLETED_KEEP],
            )
            .unwrap();
        let mut again = row(1, 2);
        again.outcome = "interrupted".into();
        stats
            .record_with_spend(&again, &spend, &[], Some(&kept))
            .unwrap();
        assert_eq!(stats.completed(&done).unwrap(), None, "pruned");
        assert_eq!(
            stats.completed(&kept).unwrap().as_deref(),
            Some("interrupted")
        );
        drop(stats);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
