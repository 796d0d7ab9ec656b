//! Approvals in `broker.db`: a spawn or a fleet-entry patch an agent asked
//! for, pending until the operator decides it.

use super::*;

impl Db {
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
