//! The schema of `history.db` and its migrations, on the shared machinery of
//! `proto::schema` (`PRAGMA user_version`, one numbered step per change, each
//! in its own transaction). The writer opens the file through [`migrate`];
//! the reader opens it read-only and never migrates it, and refuses a file
//! whose version it does not know.
//!
//! - `turns`: one row per turn, its message and how it ended; `id` is
//!   `AUTOINCREMENT`, so a pruned turn's id is never given again and
//!   `sqlite_sequence` tells a pruned turn from one that never was.
//! - `events`: one row per event, keyed by its live-stream id, with the JSON
//!   the live stream sent (strings over 16 KiB cut).
//! - `search`: an FTS5 table over the words of the events worth searching
//!   (message bodies, assistant text, tool names and inputs, notes), its
//!   rowid the event's id.
//! - `meta`: the newest live-stream id handed out (`last_event_id`) and
//!   whether the last writer stopped cleanly (`clean`).

use crate::proto::schema::{self, Step};
use rusqlite::Connection;

/// Every version of the schema, oldest first.
pub const STEPS: &[Step] = &[Step {
    version: 1,
    what: "turns, their events, the search index and the id counter",
    apply: |tx| {
        tx.execute_batch(
            "CREATE TABLE turns (
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                kind TEXT NOT NULL,
                started_at INTEGER NOT NULL,
                ended_at INTEGER,
                sender TEXT,
                body TEXT,
                message_id INTEGER,
                ok INTEGER,
                outcome TEXT,
                note TEXT,
                decision TEXT,
                duration_ms INTEGER,
                cost_usd REAL NOT NULL DEFAULT 0,
                tokens_in INTEGER NOT NULL DEFAULT 0,
                tokens_out INTEGER NOT NULL DEFAULT 0,
                first_event INTEGER NOT NULL,
                last_event INTEGER NOT NULL,
                bytes INTEGER NOT NULL DEFAULT 0
            );
            CREATE INDEX turns_started ON turns (started_at);
            CREATE TABLE events (
                id INTEGER PRIMARY KEY,
                turn INTEGER NOT NULL,
                at INTEGER NOT NULL,
                json TEXT NOT NULL
            );
            CREATE INDEX events_turn ON events (turn, id);
            CREATE VIRTUAL TABLE search USING fts5(text, turn UNINDEXED, at UNINDEXED);
            CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
            INSERT INTO meta (key, value) VALUES ('last_event_id', 0), ('clean', 1);",
        )
    },
}];

/// Creates or upgrades the schema of a writer's connection; returns the
/// version the file was at.
pub fn migrate(conn: &mut Connection) -> Result<u32, String> {
    schema::migrate(conn, super::FILE, STEPS)
}

/// The version a reader can read: the last step's. A newer file is refused.
pub fn check_readable(conn: &Connection) -> Result<(), String> {
    let latest = STEPS.last().map_or(0, |s| s.version);
    match schema::version(conn) {
        Ok(v) if v == latest => Ok(()),
        Ok(0) => Err("the history is not created yet".into()),
        Ok(v) => Err(format!(
            "{} has schema version {v}, this hive reads version {latest}",
            super::FILE
        )),
        Err(e) => Err(format!(
            "cannot read the schema version of {}: {e}",
            super::FILE
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_are_numbered_and_build_a_searchable_file() {
        assert!(schema::well_numbered(STEPS));
        let mut c = Connection::open_in_memory().unwrap();
        assert_eq!(migrate(&mut c).unwrap(), 0);
        assert_eq!(migrate(&mut c).unwrap(), 1, "nothing left to run");
        check_readable(&c).unwrap();
        c.execute(
            "INSERT INTO search (rowid, text, turn, at) VALUES (5, 'hello world', 1, 2)",
            [],
        )
        .unwrap();
        let n: i64 = c
            .query_row(
                "SELECT count(*) FROM search WHERE search MATCH '\"world\"'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, 1, "the bundled sqlite has FTS5");
    }
}
