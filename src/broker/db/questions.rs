//! Questions in `broker.db`: asked, open, expired and closed (answered or
//! cancelled), on either side of the asker and target.

use super::*;

pub(super) const Q_COLS: &str = "id, asker, target, question, options, multi, asked_at, expires_at";

pub(super) fn question_from_row(row: &Row) -> Res<Question> {
    let options: String = row.get(4)?;
    Ok(Question {
        id: row.get(0)?,
        asker: row.get(1)?,
        target: row.get(2)?,
        question: row.get(3)?,
        options: serde_json::from_str(&options).unwrap_or_default(),
        multi: row.get::<_, i64>(5)? != 0,
        asked_at: row.get(6)?,
        expires_at: row.get(7)?,
    })
}

impl Db {
    #[allow(clippy::too_many_arguments)]
    pub fn insert_question(
        &self,
        asker: &str,
        target: &Peer,
        question: &str,
        options: &[String],
        multi: bool,
        now: i64,
        expires_at: Option<i64>,
    ) -> Res<i64> {
        let options = serde_json::to_string(options).unwrap_or_else(|_| "[]".into());
        self.conn.execute(
            "INSERT INTO questions (asker, target, question, options, multi, asked_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                asker,
                target,
                question,
                options,
                multi as i64,
                now,
                expires_at
            ],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// A question that has not been answered, cancelled or expired.
    pub fn open_question(&self, id: i64) -> Res<Option<Question>> {
        self.conn
            .query_row(
                &format!("SELECT {Q_COLS} FROM questions WHERE id = ?1 AND answer IS NULL"),
                params![id],
                question_from_row,
            )
            .optional()
    }

    /// The open questions `who` asked, or that are addressed to `who`.
    pub fn questions_where(&self, side: Side, who: &str) -> Res<Vec<Question>> {
        let col = match side {
            Side::Asker => "asker",
            Side::Target => "target",
        };
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {Q_COLS} FROM questions WHERE {col} = ?1 AND answer IS NULL ORDER BY id"
        ))?;
        let rows = stmt.query_map(params![who], question_from_row)?;
        rows.collect()
    }

    pub fn expired_questions(&self, now: i64) -> Res<Vec<Question>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {Q_COLS} FROM questions
             WHERE answer IS NULL AND expires_at IS NOT NULL AND expires_at <= ?1 ORDER BY id"
        ))?;
        let rows = stmt.query_map(params![now], question_from_row)?;
        rows.collect()
    }

    /// Records an answer and queues the notice for `notify` in one transaction.
    pub fn close_question(
        &self,
        id: i64,
        answer: &str,
        by: &Peer,
        now: i64,
        notice: Option<&NewMessage>,
    ) -> Res<bool> {
        let tx = self.conn.unchecked_transaction()?;
        let n = tx.execute(
            "UPDATE questions SET answer = ?1, answered_by = ?2, answered_at = ?3
             WHERE id = ?4 AND answer IS NULL",
            params![answer, by, now, id],
        )?;
        if n == 1 {
            if let Some(m) = notice {
                queue_row(&tx, &self.queues, m, None, now)?;
            }
        }
        tx.commit()?;
        Ok(n == 1)
    }

    pub fn next_question_expiry(&self) -> Res<Option<i64>> {
        self.conn.query_row(
            "SELECT MIN(expires_at) FROM questions WHERE answer IS NULL",
            [],
            |r| r.get(0),
        )
    }
}
