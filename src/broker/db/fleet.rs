//! Agents taken out of the fleet file (issue 39, `hive reload`) in
//! `broker.db`: no table of their own. An agent the broker knows is one
//! with a row in `agents` or mail addressed to it; one of those the fleet
//! file no longer names is removed. Its mail stays queued until the
//! operator forgets it (`hive forget`): then the mail is dead-lettered, so
//! `hive failed` and `hive retry` still reach it, and the row goes.

use super::{Db, Res};
use crate::proto::MsgState;
use rusqlite::params;

impl Db {
    /// Every name with a row in `agents` or a queued or inflight message
    /// addressed to it (local names only: a remote `NAME@HIVE` has an `@`).
    pub fn known_agents(&self) -> Res<Vec<String>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT name FROM agents
             UNION
             SELECT DISTINCT recipient FROM messages
              WHERE state IN ('queued', 'inflight') AND recipient <> 'operator'
                AND instr(recipient, '@') = 0
             ORDER BY 1",
        )?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect()
    }

    /// Keeps a row for `agent`, so it is known as removed across restarts
    /// even if it never reported anything.
    pub fn keep_agent_row(&self, agent: &str) -> Res<()> {
        self.conn
            .prepare_cached("INSERT OR IGNORE INTO agents (name) VALUES (?1)")?
            .execute(params![agent])?;
        Ok(())
    }

    /// Forgets removed agent `agent`: its queued and inflight mail becomes
    /// dead letters with `error` as their last error, and its row in
    /// `agents` and `stopped_agents` goes, in one transaction. The number of
    /// messages dead-lettered.
    pub fn forget_agent(&self, agent: &str, error: &str, now: i64) -> Res<usize> {
        let tx = self.conn.unchecked_transaction()?;
        let queued = tx.execute(
            "UPDATE messages SET state = 'failed', last_error = ?1, done_at = ?2
             WHERE recipient = ?3 AND state = 'queued'",
            params![error, now, agent],
        )?;
        let inflight = tx.execute(
            "UPDATE messages SET state = 'failed', last_error = ?1, done_at = ?2
             WHERE recipient = ?3 AND state = 'inflight'",
            params![error, now, agent],
        )?;
        tx.execute("DELETE FROM agents WHERE name = ?1", params![agent])?;
        tx.execute("DELETE FROM stopped_agents WHERE name = ?1", params![agent])?;
        tx.commit()?;
        self.moved(agent, &MsgState::Queued, &MsgState::Failed, queued);
        self.moved(agent, &MsgState::Inflight, &MsgState::Failed, inflight);
        Ok(queued + inflight)
    }
}
