//! The schema of `turn-stats.db` (one row per claude process the harness ran)
//! and its migrations. The harness's writer opens the file through [`migrate`]
//! and stores outcomes through [`stored_outcome`], so the `outcome` column holds
//! only [`TurnOutcomeKind`] names and `/metrics` exports a small closed set of
//! labels; readers open the file read-only and never migrate it. Since version
//! 3 each row also holds the run's spend row for the broker (`report_spend`:
//! its idempotency key, cost, tokens, cache reads) and whether the broker
//! acknowledged it, so a row a dead harness never got acknowledged is sent
//! again at the next boot. Since version 4 the file also keeps the messages
//! the harness let go (acked after a run), written before the ack is sent, so
//! a message handed out again because the ack never reached the broker is
//! acked without running claude ([`COMPLETED_KEEP`] of them, the newest).

use crate::proto::outcome::TurnOutcomeKind;
use crate::proto::schema::{self, Step};
use rusqlite::{params, Connection, Transaction};

/// The file's name in the state dir.
pub const FILE: &str = "turn-stats.db";

/// How many messages the `completed` table keeps: the newest, by when they
/// were let go. A message whose ack was lost is handed out again at the
/// next hand-out, long before this many others have finished.
pub const COMPLETED_KEEP: i64 = 10_000;

/// Every version of the schema, oldest first.
pub const STEPS: &[Step] = &[
    Step {
        version: 1,
        what: "the turns table",
        apply: |tx| {
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS turns (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    started_at INTEGER NOT NULL,
                    duration_ms INTEGER NOT NULL,
                    kind TEXT NOT NULL,
                    outcome TEXT NOT NULL,
                    model TEXT NOT NULL,
                    sender TEXT NOT NULL,
                    message_id INTEGER,
                    context_tokens INTEGER,
                    tokens_in INTEGER NOT NULL DEFAULT 0,
                    tokens_out INTEGER NOT NULL DEFAULT 0,
                    cost_usd REAL NOT NULL DEFAULT 0,
                    session_id TEXT,
                    note TEXT NOT NULL DEFAULT ''
                );",
            )
        },
    },
    Step {
        version: 2,
        what: "outcomes become closed kinds, their text moves to the note",
        apply: closed_outcomes,
    },
    Step {
        version: 3,
        what: "each run's spend row and whether the broker acknowledged it",
        apply: |tx| {
            // Rows from before were reported in memory only: whether the
            // broker has them is unknown, and they carry no key, so they
            // count as acknowledged and are never re-sent.
            tx.execute_batch(
                "ALTER TABLE turns ADD COLUMN spend_key TEXT;
                 ALTER TABLE turns ADD COLUMN spend_usd REAL;
                 ALTER TABLE turns ADD COLUMN spend_tokens INTEGER NOT NULL DEFAULT 0;
                 ALTER TABLE turns ADD COLUMN spend_cache_read INTEGER NOT NULL DEFAULT 0;
                 ALTER TABLE turns ADD COLUMN spend_acked INTEGER NOT NULL DEFAULT 1;
                 CREATE INDEX turns_spend_unacked ON turns (id) WHERE spend_acked = 0;
                 CREATE UNIQUE INDEX turns_spend_key ON turns (spend_key);",
            )
        },
    },
    Step {
        version: 4,
        what: "the messages the harness let go, so none runs twice",
        apply: |tx| {
            // A message is known by its id, when it was sent, its sender and
            // its body's digest, so a broker.db restored or rewound that
            // hands out another message under a reused id is not taken for
            // it. `id` orders the rows by when they were written (pruning).
            tx.execute_batch(
                "CREATE TABLE completed (
                    id INTEGER PRIMARY KEY,
                    message_id INTEGER NOT NULL,
                    sent_at INTEGER NOT NULL,
                    sender TEXT NOT NULL,
                    body_sha256 TEXT NOT NULL,
                    outcome TEXT NOT NULL,
                    completed_at INTEGER NOT NULL
                 );
                 CREATE UNIQUE INDEX completed_message
                     ON completed (message_id, sent_at, sender, body_sha256);",
            )
        },
    },
];

/// Opens the schema of a writer's connection: creates or upgrades it.
pub fn migrate(conn: &mut Connection) -> Result<u32, String> {
    schema::migrate(conn, FILE, STEPS)
}

/// The `(outcome, note)` to store for an outcome the harness reports (a kind's
/// name, or a free text such as `failed: claude exited with code 1`) and its
/// note: the outcome is always a kind's name, and any detail joins the note.
pub fn stored_outcome(outcome: &str, note: &str) -> (String, String) {
    let (kind, detail) = TurnOutcomeKind::from_stored(outcome);
    let note = match (note.trim().is_empty(), detail) {
        (_, None) => note.to_string(),
        (true, Some(d)) => d,
        (false, Some(d)) => format!("{note}; {d}"),
    };
    (kind.as_str().to_string(), note)
}

fn closed_outcomes(tx: &Transaction) -> rusqlite::Result<()> {
    let rows: Vec<(i64, String, String)> = {
        let mut stmt = tx.prepare("SELECT id, outcome, note FROM turns")?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut update = tx.prepare("UPDATE turns SET outcome = ?1, note = ?2 WHERE id = ?3")?;
    for (id, outcome, note) in rows {
        let (kind, note) = stored_outcome(&outcome, &note);
        if kind != outcome {
            update.execute(params![kind, note, id])?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_are_numbered_and_details_join_the_note() {
        assert!(schema::well_numbered(STEPS));
        assert_eq!(stored_outcome("ok", ""), ("ok".into(), "".into()));
        assert_eq!(
            stored_outcome(
                "interrupted: turn interrupted during execution",
                "interrupted by the operator"
            ),
            (
                "interrupted".into(),
                "interrupted by the operator; turn interrupted during execution".into()
            )
        );
        assert_eq!(
            stored_outcome("rate limited (resets at 5)", ""),
            ("rate_limited".into(), "resets at 5".into())
        );
    }
}
