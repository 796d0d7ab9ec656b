//! Reminders and scheduled prompts in `broker.db`: set, listed, due, fired
//! into their agent's queue, cancelled; the operator's view of them and the
//! coalescing of repeating prompts (issue 39; schema step 14).
//!
//! Every pending reminder and scheduled prompt is listed with its owner,
//! and the operator cancels one by kind and id: the row goes and its agent's
//! notice is queued in one transaction, so neither is ever without the
//! other. A repeating prompt remembers the message of its last delivered
//! copy (`last_copy`); when it comes due while that copy is still unread
//! (queued, inflight or held: its agent is stopped, paused or busy), no new
//! copy is queued: the prompt moves to its next slot and counts the
//! delivery in `skipped`. So a stopped agent finds one copy, never a pile.

use super::*;
use crate::proto::cmd::{Timer, TimerKind};
use crate::proto::limits::REMINDER_PREVIEW_CHARS;
use crate::proto::text::preview;
use crate::proto::Scheduled;
use rusqlite::{params, OptionalExtension};

/// Schema step 14: a scheduled prompt's coalesced deliveries and the message
/// of its last copy (none for the rows of older releases).
pub(super) const SCHEMA_V14: &str = "
ALTER TABLE scheduled ADD COLUMN skipped INTEGER NOT NULL DEFAULT 0;
ALTER TABLE scheduled ADD COLUMN last_copy INTEGER;
";

/// The states of a message its recipient has not finished with.
const UNREAD: &str = "('queued', 'inflight', 'held')";

/// What became of a scheduled prompt that came due.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fired {
    /// A copy was queued: its message id.
    Delivered(i64),
    /// Its last copy (this message id) is still unread: nothing was queued.
    Coalesced(i64),
}

/// The first line of `body`, cut to the previews' length.
fn first_line(body: &str) -> String {
    preview(
        body.lines().next().unwrap_or_default(),
        REMINDER_PREVIEW_CHARS,
    )
}

impl Db {
    /// Every pending reminder and scheduled prompt, of `agent` or of all
    /// agents, soonest first.
    pub fn timers(&self, agent: Option<&str>) -> Res<Vec<Timer>> {
        let sql = format!(
            "SELECT 'reminder', id, agent, body, fire_at, NULL, 0, NULL
               FROM reminders WHERE ?1 IS NULL OR agent = ?1
             UNION ALL
             SELECT 'scheduled', s.id, s.agent, s.body, s.fire_at, s.every_seconds, s.skipped,
                    (SELECT m.id FROM messages m WHERE m.id = s.last_copy AND m.state IN {UNREAD})
               FROM scheduled s WHERE ?1 IS NULL OR s.agent = ?1
             ORDER BY 5, 1, 2"
        );
        let mut stmt = self.conn.prepare_cached(&sql)?;
        let rows = stmt.query_map(params![agent], |r| {
            let kind: String = r.get(0)?;
            let body: String = r.get(3)?;
            Ok(Timer {
                kind: match kind.as_str() {
                    "reminder" => TimerKind::Reminder,
                    _ => TimerKind::Scheduled,
                },
                id: r.get(1)?,
                agent: r.get(2)?,
                fire_at: r.get(4)?,
                every_seconds: r.get::<_, Option<i64>>(5)?.map(|e| e.max(0) as u64),
                first_line: first_line(&body),
                bytes: body.len() as u64,
                skipped: r.get::<_, i64>(6)?.max(0) as u64,
                unread_copy: r.get(7)?,
            })
        })?;
        rows.collect()
    }

    /// The agent whose timer `kind` `id` is, if it is pending.
    pub fn timer_owner(&self, kind: TimerKind, id: i64) -> Res<Option<String>> {
        let sql = match kind {
            TimerKind::Reminder => "SELECT agent FROM reminders WHERE id = ?1",
            TimerKind::Scheduled => "SELECT agent FROM scheduled WHERE id = ?1",
        };
        self.conn
            .query_row(sql, params![id], |r| r.get(0))
            .optional()
    }

    /// Deletes the timer `kind` `id` of `notice.to` and queues `notice` to
    /// that agent, in one transaction: the notice's message id, or `None`
    /// (and nothing queued) when the agent has no such timer.
    pub fn cancel_timer(
        &self,
        kind: TimerKind,
        id: i64,
        notice: &NewMessage,
        now: i64,
    ) -> Res<Option<i64>> {
        let sql = match kind {
            TimerKind::Reminder => "DELETE FROM reminders WHERE id = ?1 AND agent = ?2",
            TimerKind::Scheduled => "DELETE FROM scheduled WHERE id = ?1 AND agent = ?2",
        };
        let tx = self.conn.unchecked_transaction()?;
        if tx.execute(sql, params![id, notice.to])? != 1 {
            return Ok(None);
        }
        let notice_id = queue_row(&tx, &self.queues, notice, None, now)?;
        tx.commit()?;
        Ok(Some(notice_id))
    }

    /// A due scheduled prompt, atomically: a one-shot is delivered and
    /// deleted; a repeating one moves to `next` and is delivered unless its
    /// last copy is still unread, when the delivery is counted in `skipped`
    /// instead. A delivered copy is charged to its agent.
    pub fn fire_scheduled(
        &self,
        s: &Scheduled,
        next: Option<i64>,
        msg: &NewMessage,
        now: i64,
    ) -> Res<Fired> {
        let tx = self.conn.unchecked_transaction()?;
        let Some(at) = next else {
            let id = queue_row(&tx, &self.queues, msg, Some(msg.to), now)?;
            tx.execute("DELETE FROM scheduled WHERE id = ?1", params![s.id])?;
            tx.commit()?;
            return Ok(Fired::Delivered(id));
        };
        let unread: Option<i64> = tx
            .query_row(
                &format!(
                    "SELECT m.id FROM scheduled s JOIN messages m ON m.id = s.last_copy
                     WHERE s.id = ?1 AND m.state IN {UNREAD}"
                ),
                params![s.id],
                |r| r.get(0),
            )
            .optional()?;
        if let Some(copy) = unread {
            tx.execute(
                "UPDATE scheduled SET fire_at = ?1, skipped = skipped + 1 WHERE id = ?2",
                params![at, s.id],
            )?;
            tx.commit()?;
            return Ok(Fired::Coalesced(copy));
        }
        let id = queue_row(&tx, &self.queues, msg, Some(msg.to), now)?;
        tx.execute(
            "UPDATE scheduled SET fire_at = ?1, last_copy = ?2 WHERE id = ?3",
            params![at, id, s.id],
        )?;
        tx.commit()?;
        Ok(Fired::Delivered(id))
    }
}

pub(super) fn reminder_from_row(row: &Row) -> Res<Reminder> {
    let body: String = row.get(2)?;
    Ok(Reminder {
        id: row.get(0)?,
        agent: row.get(1)?,
        preview: body.chars().take(REMINDER_PREVIEW_CHARS).collect(),
        bytes: body.len() as u64,
        fire_at: row.get(3)?,
    })
}

impl Db {
    /// Stores a reminder with its whole payload.
    pub fn insert_reminder(&self, agent: &str, body: &str, fire_at: i64, now: i64) -> Res<i64> {
        self.conn.execute(
            "INSERT INTO reminders (agent, body, fire_at, created_at)
             VALUES (?1, ?2, ?3, ?4)",
            params![agent, body, fire_at, now],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    pub fn count_reminders(&self, agent: &str) -> Res<u64> {
        self.conn.query_row(
            "SELECT COUNT(*) FROM reminders WHERE agent = ?1",
            params![agent],
            |r| r.get::<_, i64>(0).map(|n| n as u64),
        )
    }

    pub fn reminders_of(&self, agent: &str) -> Res<Vec<Reminder>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, agent, body, fire_at FROM reminders
             WHERE agent = ?1 ORDER BY fire_at, id",
        )?;
        let rows = stmt.query_map(params![agent], reminder_from_row)?;
        rows.collect()
    }

    pub fn due_reminders(&self, now: i64) -> Res<Vec<(Reminder, String)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, agent, body, fire_at FROM reminders
             WHERE fire_at <= ?1 ORDER BY fire_at, id",
        )?;
        let rows = stmt.query_map(params![now], |r| Ok((reminder_from_row(r)?, r.get(2)?)))?;
        rows.collect()
    }

    pub fn next_reminder(&self) -> Res<Option<i64>> {
        self.conn
            .query_row("SELECT MIN(fire_at) FROM reminders", [], |r| r.get(0))
    }

    /// Turns a due reminder into an inbox message, atomically; the message
    /// is charged to its agent.
    pub fn fire_reminder(&self, id: i64, msg: &NewMessage, now: i64) -> Res<Option<i64>> {
        let tx = self.conn.unchecked_transaction()?;
        let n = tx.execute("DELETE FROM reminders WHERE id = ?1", params![id])?;
        let mut new_id = None;
        if n == 1 {
            new_id = Some(queue_row(&tx, &self.queues, msg, Some(msg.to), now)?);
        }
        tx.commit()?;
        Ok(new_id)
    }

    /// Deletes a reminder the agent owns; false when it has no such reminder.
    pub fn delete_reminder(&self, agent: &str, id: i64) -> Res<bool> {
        let n = self.conn.execute(
            "DELETE FROM reminders WHERE id = ?1 AND agent = ?2",
            params![id, agent],
        )?;
        Ok(n == 1)
    }

    pub fn insert_scheduled(
        &self,
        agent: &str,
        body: &str,
        fire_at: i64,
        every: Option<u64>,
        now: i64,
    ) -> Res<i64> {
        self.conn.execute(
            "INSERT INTO scheduled (agent, body, fire_at, every_seconds, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![agent, body, fire_at, every.map(|e| e as i64), now],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    pub(super) fn scheduled_where(
        &self,
        cond: &str,
        p: impl rusqlite::Params,
    ) -> Res<Vec<Scheduled>> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT id, agent, body, fire_at, every_seconds FROM scheduled WHERE {cond}
             ORDER BY fire_at, id"
        ))?;
        let rows = stmt.query_map(p, |r| {
            Ok(Scheduled {
                id: r.get(0)?,
                agent: r.get(1)?,
                body: r.get(2)?,
                fire_at: r.get(3)?,
                every_seconds: r.get::<_, Option<i64>>(4)?.map(|e| e as u64),
            })
        })?;
        rows.collect()
    }

    pub fn scheduled_of(&self, agent: &str) -> Res<Vec<Scheduled>> {
        self.scheduled_where("agent = ?1", params![agent])
    }

    pub fn due_scheduled(&self, now: i64) -> Res<Vec<Scheduled>> {
        self.scheduled_where("fire_at <= ?1", params![now])
    }

    pub fn next_scheduled(&self) -> Res<Option<i64>> {
        self.conn
            .query_row("SELECT MIN(fire_at) FROM scheduled", [], |r| r.get(0))
    }

    pub fn delete_scheduled(&self, agent: &str, id: i64) -> Res<bool> {
        Ok(self.conn.execute(
            "DELETE FROM scheduled WHERE id = ?1 AND agent = ?2",
            params![id, agent],
        )? == 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::db::Durability;
    use crate::proto::{MsgKind, Peer};

    fn prompt(db: &Db, every: Option<u64>) -> Scheduled {
        let id = db
            .insert_scheduled("ana", "digest\nsecond line", 100, every, 1)
            .unwrap();
        db.scheduled_of("ana")
            .unwrap()
            .into_iter()
            .find(|s| s.id == id)
            .unwrap()
    }

    fn fire(db: &Db, s: &Scheduled, next: Option<i64>) -> Fired {
        let body = format!("[scheduled #{}] {}", s.id, s.body);
        let msg = NewMessage {
            from: &Peer::Scheduler,
            to: &s.agent,
            body: &body,
            kind: &MsgKind::Scheduled,
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        };
        db.fire_scheduled(s, next, &msg, 100).unwrap()
    }

    #[test]
    fn a_repeating_prompt_keeps_one_unread_copy_and_counts_the_rest() {
        let dir = tempfile_dir();
        let db = Db::open(&dir.join("broker.db"), Durability::Normal).unwrap();
        let s = prompt(&db, Some(60));
        let Fired::Delivered(first) = fire(&db, &s, Some(160)) else {
            panic!("the first delivery is queued")
        };
        assert_eq!(fire(&db, &s, Some(220)), Fired::Coalesced(first));
        assert_eq!(fire(&db, &s, Some(280)), Fired::Coalesced(first));
        let t = db.timers(Some("ana")).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(
            (t[0].kind, t[0].skipped, t[0].unread_copy, t[0].fire_at),
            (TimerKind::Scheduled, 2, Some(first), 280)
        );
        assert_eq!(t[0].first_line, "digest");
        // Once the copy is read, the next slot delivers again.
        db.conn
            .execute(
                "UPDATE messages SET state = 'acked' WHERE id = ?1",
                params![first],
            )
            .unwrap();
        assert!(matches!(fire(&db, &s, Some(340)), Fired::Delivered(n) if n != first));
        // A one-shot is delivered and goes.
        let once = prompt(&db, None);
        assert!(matches!(fire(&db, &once, None), Fired::Delivered(_)));
        assert_eq!(db.timers(None).unwrap().len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_cancelled_timer_goes_with_its_notice_queued_and_ids_are_per_kind() {
        let dir = tempfile_dir();
        let db = Db::open(&dir.join("broker.db"), Durability::Normal).unwrap();
        let r = db.insert_reminder("ana", "check", 500, 1).unwrap();
        let s = prompt(&db, Some(60));
        assert_eq!((r, s.id), (1, 1), "each kind numbers its own");
        assert_eq!(
            db.timer_owner(TimerKind::Reminder, r).unwrap().as_deref(),
            Some("ana")
        );
        let notice = NewMessage {
            from: &Peer::System,
            to: "bob",
            body: "[reminder #1 cancelled by operator]",
            kind: &MsgKind::Reminder,
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        };
        assert_eq!(
            db.cancel_timer(TimerKind::Reminder, r, &notice, 2).unwrap(),
            None,
            "not bob's: nothing goes, nothing is queued"
        );
        let notice = NewMessage {
            to: "ana",
            ..notice
        };
        assert!(db
            .cancel_timer(TimerKind::Reminder, r, &notice, 2)
            .unwrap()
            .is_some());
        let left = db.timers(None).unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].kind, TimerKind::Scheduled);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hive-db-timers-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
