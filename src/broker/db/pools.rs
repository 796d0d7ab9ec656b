//! Credential pools in `broker.db` (issue 16, step 7): the hive's salt for
//! credential fingerprints, each agent's pool, and a pool's usage-limit
//! pause, kept across restarts.

use super::*;

impl Db {
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
}
