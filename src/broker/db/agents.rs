//! What `broker.db` keeps per agent: its counters and status line for the
//! dashboard, the revision it runs, the running bash tasks its daemon
//! reports, and whether it is kept stopped across restarts of `hive up`.

use super::*;

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

impl Db {
    pub fn stats(&self, agent: &str) -> Res<AgentStats> {
        // The status watch's renewals ask again of an unchanged store (`memo.rs`).
        if let Some(stats) = self.memo_stats(agent) {
            return Ok(stats);
        }
        let stats = self.stats_now(agent)?;
        self.memo_keep_stats(agent, &stats);
        Ok(stats)
    }

    fn stats_now(&self, agent: &str) -> Res<AgentStats> {
        let found = self
            .conn
            .prepare_cached(
                "SELECT hyperhive_rev, status_text, status_set_at, turns, turns_ok, turns_failed,
                        tokens_in, tokens_out, cost_usd FROM agents WHERE name = ?1",
            )?
            .query_row(params![agent], |r| {
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
            })
            .optional()?;
        Ok(found.unwrap_or_default())
    }

    /// Runs `sql`, an `UPDATE agents … WHERE name = ?N`, on `agent`'s row,
    /// creating the row first when it is not there yet. The row of an agent
    /// that was ever seen is there, so this is one held statement and one
    /// commit: `post_turn_counts` runs it at the end of every turn.
    pub(super) fn update_agent<P: rusqlite::Params + Copy>(
        &self,
        agent: &str,
        sql: &str,
        p: P,
    ) -> Res<()> {
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
}
