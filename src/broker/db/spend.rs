//! Spend in `broker.db` (issue 16): one keyed row per run, the sums a
//! budget check adds up, the operator's void of a window, and the budget
//! notices already sent (each once per scope, window and level).

use super::*;

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

impl Db {
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
}
