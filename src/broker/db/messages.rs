//! Messages in `broker.db`: queueing a row at the tail of its recipient's
//! queue, handing the first one out, moving rows between states (acked,
//! requeued behind later mail, dead-lettered), and what the operator reads
//! of them (the queue, the dead letters, one message's state). Receipts
//! (issue 43): the request stored by the row's insert, an ack and the
//! receipts it sends in one transaction ([`Db::ack`]), and the receipts that
//! ride with a turn held until it is acked ([`Db::take_receipts`]). The
//! queue's tail, the inflight set and the agents with receipts riding live
//! on the `Db` (`Queues`, hints), kept in step by every move here.

use super::*;

/// The receipts of agent `?1` riding with its turn ([`Db::take_receipts`]).
macro_rules! riding {
    () => {
        concat!(
            "recipient = ?1 AND state = 'held' AND kind = ",
            receipt_kind!(),
            " AND handed_via = 'turn'"
        )
    };
}

/// The receipts of an agent that rode with a turn not acked go back to
/// its queue (`take_receipts`).
const RIDING_BACK: &str = concat!("UPDATE messages SET state = 'queued' WHERE ", riding!());

/// The receipts of an agent that rode with its turn are acked with it.
const RIDING_ACKED: &str = concat!(
    "UPDATE messages SET state = 'acked', done_at = ?2 WHERE ",
    riding!()
);

/// What [`Db::ack`] acks: rows `ids` of `recipient` in `from_state`, at
/// `now`, with the harness's `turn`; `turn_acked` for an `ack_turn`.
pub struct Ack<'a> {
    pub ids: &'a [i64],
    pub recipient: &'a str,
    pub from_state: &'a MsgState,
    pub turn: Option<i64>,
    pub turn_acked: bool,
    pub now: i64,
}

/// Schema step 16 (issue 43, receipts): when and how each row was last
/// handed out (`handed_via`: `turn` for the harness's `recv_next`, `recv`
/// for the MCP tool) and the turn the harness said acked it; the index that
/// finds a sender's messages; `receipt` (1: its sender asked for a receipt)
/// and the partial index of the receipts waiting for their agent's next turn
/// or `recv`; and `pruned_messages`, the one thing kept of a
/// row retention deleted: its id and the agent that sent it (empty when the
/// row was no agent's own send), so `message_state` says "pruned" to its
/// sender and to nobody else. About 20 bytes a pruned row.
pub(super) const SCHEMA_V16: &str = "
ALTER TABLE messages ADD COLUMN handed_at INTEGER;
ALTER TABLE messages ADD COLUMN handed_via TEXT;
ALTER TABLE messages ADD COLUMN turn INTEGER;
ALTER TABLE messages ADD COLUMN receipt INTEGER;
CREATE INDEX messages_sender ON messages (sender, id);
CREATE INDEX messages_receipts ON messages (recipient, seq)
    WHERE kind = 'receipt' AND state = 'queued';
CREATE TABLE pruned_messages (
    id INTEGER PRIMARY KEY,
    sender TEXT NOT NULL
);
";

/// One message's row as `message_state` reads it, with its outbox entry
/// when it left for another hive.
#[derive(Debug, Clone, PartialEq)]
pub struct SentRow {
    /// The message, as every statement reads one (`message_from_row`).
    pub message: Message,
    /// The agent the row is charged to (step 12; none for older rows and
    /// for the harness's own notices).
    pub charged: Option<String>,
    pub state: MsgState,
    pub done_at: Option<i64>,
    pub attempts: u32,
    pub last_error: Option<String>,
    pub handed_at: Option<i64>,
    pub handed_via: Option<String>,
    pub turn: Option<i64>,
    /// Its place among the recipient's queued rows, 1 first (queued only).
    pub position: Option<u64>,
    /// The outbox entry of mail to another hive.
    pub outbox: Option<SentOutbox>,
}

/// What [`Db::sent_row`] reads after the message's own columns, in
/// [`SentRow`]'s order (the queue place last, for its position).
macro_rules! life_cols {
    () => {
        "charged, state, done_at, attempts, last_error, handed_at, handed_via, turn, seq"
    };
}

/// The outbox entry of a message to another hive, as `message_state` reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct SentOutbox {
    /// `pending`, `sent` or `failed`.
    pub state: String,
    /// When it settled.
    pub done_at: Option<i64>,
    pub event_id: Option<String>,
    pub error: Option<String>,
}

impl Db {
    /// Queues a message at the tail of the queue.
    pub fn insert_message(&self, m: &NewMessage, now: i64) -> Res<i64> {
        queue_row(&self.conn, &self.queues, m, None, now)
    }

    /// Queues a message at the tail of the queue, its body counted in the
    /// stored bytes of agent `charged` (none: of no agent).
    pub fn insert_charged(&self, m: &NewMessage, charged: Option<&str>, now: i64) -> Res<i64> {
        queue_row(&self.conn, &self.queues, m, charged, now)
    }

    /// `agent` may have an inflight row from now on.
    pub(super) fn mark_inflight(&self, agent: &str) {
        let mut set = self.inflight.borrow_mut();
        if !set.contains(agent) {
            set.insert(agent.to_string());
        }
    }

    /// Keeps [`Db::inflight`] true after a committed write moved `moved`
    /// rows of `agent` from `from` to `to`: into inflight, the agent may
    /// have one; out of it, its one inflight row moved on.
    pub(super) fn moved(&self, agent: &str, from: &MsgState, to: &MsgState, moved: usize) {
        if moved == 0 || from == to {
            return;
        }
        if *to == MsgState::Inflight {
            self.mark_inflight(agent);
        } else if *from == MsgState::Inflight {
            self.inflight.borrow_mut().remove(agent);
        }
    }

    /// The agent's inflight row, if any (there is at most one; in queue
    /// order, so the inbox index answers without a sort).
    pub fn inflight(&self, agent: &str) -> Res<Option<Message>> {
        // An agent outside the set has no inflight row (`Db::inflight`).
        if !self.inflight.borrow().contains(agent) {
            return Ok(None);
        }
        self.conn
            .prepare_cached(concat!(
                "SELECT ",
                msg_cols!(),
                " FROM messages WHERE recipient = ?1 AND state = 'inflight' ORDER BY seq, id LIMIT 1"
            ))?
            .query_row(params![agent], message_from_row)
            .optional()
    }

    /// The id of a system event of `kind` still waiting for `agent`
    /// (queued, held, or inflight from a harness that died mid-turn).
    pub fn waiting_event(&self, agent: &str, kind: &MsgKind) -> Res<Option<i64>> {
        self.conn
            .prepare_cached(
                "SELECT id FROM messages WHERE recipient = ?1 AND kind = ?2 \
                 AND state IN ('queued', 'inflight', 'held') ORDER BY seq, id LIMIT 1",
            )?
            .query_row(params![agent, kind.as_str()], |r| r.get(0))
            .optional()
    }

    /// What `recv_next` hands out, in one transaction: the agent's inflight
    /// row again, else (with `queued_too`) its first queued row made
    /// inflight; either way its attempts go up by one. Returns the row, its
    /// attempts with this hand-out, and whether it was inflight already;
    /// and the count of queued rows after it (read by the same statement as
    /// the row).
    pub fn take_next(&self, agent: &str, queued_too: bool) -> Res<(Option<Taken>, u64)> {
        let look_for_inflight = self.inflight.borrow().contains(agent);
        self.read_next(agent, queued_too, look_for_inflight)
    }

    /// [`Db::take_next`] by reading the queue.
    pub(super) fn read_next(
        &self,
        agent: &str,
        queued_too: bool,
        look_for_inflight: bool,
    ) -> Res<(Option<Taken>, u64)> {
        // An idle agent's renewal asks again of an unchanged store (`memo.rs`).
        if let Some(queued) = self.memo_nothing_next(agent, queued_too, look_for_inflight) {
            return Ok((None, queued));
        }
        let read = self.read_next_now(agent, queued_too, look_for_inflight)?;
        if read.0.is_none() {
            self.memo_keep_nothing_next(agent, queued_too, look_for_inflight, read.1);
        }
        Ok(read)
    }

    /// [`Db::read_next`] by reading the store.
    fn read_next_now(
        &self,
        agent: &str,
        queued_too: bool,
        look_for_inflight: bool,
    ) -> Res<(Option<Taken>, u64)> {
        schema::in_transaction(&self.conn, |c| {
            for state in ["inflight", "queued"] {
                if state == "inflight" && !look_for_inflight {
                    continue;
                }
                if state == "queued" && !queued_too {
                    break;
                }
                let row = c
                    .prepare_cached(concat!(
                        "SELECT ",
                        msg_cols!(),
                        ", attempts, (SELECT COUNT(*) FROM messages \
                         WHERE recipient = ?1 AND state = 'queued') - (SELECT COUNT(*) \
                         FROM messages INDEXED BY messages_receipts WHERE recipient = ?1 \
                         AND kind = ",
                        receipt_kind!(),
                        " AND state = 'queued') \
                         FROM messages WHERE recipient = ?1 AND state = ?2 \
                         AND kind != ",
                        receipt_kind!(),
                        " ORDER BY seq, id LIMIT 1"
                    ))?
                    .query_row(params![agent, state], |r| {
                        Ok((
                            message_from_row(r)?,
                            count_at(r, MSG_N)?,
                            r.get::<_, i64>(MSG_N + 1)?,
                        ))
                    })
                    .optional()?;
                let Some((message, attempts, queued)) = row else {
                    if state == "queued" {
                        return Ok((None, 0));
                    }
                    continue;
                };
                let was_inflight = state == "inflight";
                self.mark_inflight(agent);
                c.prepare_cached(
                    "UPDATE messages SET state = 'inflight', attempts = attempts + 1, \
                     handed_at = ?2, handed_via = 'turn' WHERE id = ?1",
                )?
                .execute(params![message.id, crate::proto::now()])?;
                // The count was read with this row still queued.
                let queued = if was_inflight { queued } else { queued - 1 };
                let taken = Taken {
                    message,
                    attempts: attempts.saturating_add(1),
                    was_inflight,
                };
                return Ok((Some(taken), queued.max(0) as u64));
            }
            // Nothing handed out, and the queue not looked at.
            Ok((None, self.count_queued(agent)?))
        })
    }

    /// The first queued rows of a recipient, in queue order.
    pub fn queued(&self, recipient: &str, limit: u32) -> Res<Vec<Message>> {
        let mut stmt = self.conn.prepare_cached(concat!(
            "SELECT ",
            msg_cols!(),
            " FROM messages WHERE recipient = ?1 AND state = 'queued' ORDER BY seq, id LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![recipient, limit], message_from_row)?;
        rows.collect()
    }

    /// Queued rows of `recipient` with ids above `after`, oldest first.
    pub fn queued_after(&self, recipient: &str, after: i64, limit: u32) -> Res<Vec<Message>> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {MSG_COLS} FROM messages WHERE recipient = ?1 AND state = 'queued' AND id > ?2
             ORDER BY id LIMIT ?3"
        ))?;
        let rows = stmt.query_map(params![recipient, after, limit], message_from_row)?;
        rows.collect()
    }

    /// Queued rows of `recipient` but its receipts (which wait for its next
    /// turn or `recv` and wake nothing: issue 43).
    pub fn count_queued(&self, recipient: &str) -> Res<u64> {
        // The status watch's renewals ask again of an unchanged store (`memo.rs`).
        if let Some(n) = self.memo_queued(recipient) {
            return Ok(n);
        }
        let n = self.count_queued_now(recipient)?;
        self.memo_keep_queued(recipient, n);
        Ok(n)
    }

    fn count_queued_now(&self, recipient: &str) -> Res<u64> {
        self.conn
            .prepare_cached(concat!(
                "SELECT (SELECT COUNT(*) FROM messages WHERE recipient = ?1 AND state = 'queued')
                 - (SELECT COUNT(*) FROM messages INDEXED BY messages_receipts
                    WHERE recipient = ?1 AND kind = ",
                receipt_kind!(),
                " AND state = 'queued')"
            ))?
            .query_row(params![recipient], |r| {
                r.get::<_, i64>(0).map(|n| n.max(0) as u64)
            })
    }

    /// Whether the sender of message `id` asked for a receipt.
    pub fn wants_receipt(&self, id: i64) -> Res<bool> {
        self.conn
            .prepare_cached("SELECT 1 FROM messages WHERE id = ?1 AND receipt = 1")?
            .query_row(params![id], |_| Ok(()))
            .optional()
            .map(|r| r.is_some())
    }

    /// The receipts that ride with the message `agent`'s turn is handed at
    /// `now` (oldest first, at most `limit`), in one transaction: those that
    /// rode with an earlier hand-out not acked yet (the turn failed, the
    /// harness died, the message went back to the queue) and those waiting.
    /// They are held for the turn (`held`, handed out `turn`) — not acked,
    /// not handed out by `recv` — until [`Db::ack`] of the turn's message
    /// (or [`Db::ack_receipts`]); a later hand-out carries them again, and a
    /// restart of the broker puts them back in the queue as it does every
    /// held row.
    pub fn take_receipts(&self, agent: &str, limit: u32, now: i64) -> Res<Vec<(i64, String)>> {
        let tx = self.conn.unchecked_transaction()?;
        if self.riding.borrow().contains(agent) {
            tx.prepare_cached(RIDING_BACK)?.execute(params![agent])?;
        }
        let rows: Vec<(i64, String)> = {
            let mut stmt = tx.prepare_cached(concat!(
                "SELECT id, body FROM messages INDEXED BY messages_receipts
                 WHERE recipient = ?1 AND kind = ",
                receipt_kind!(),
                " AND state = 'queued' ORDER BY seq LIMIT ?2"
            ))?;
            let rows = stmt.query_map(params![agent, limit], |r| Ok((r.get(0)?, r.get(1)?)))?;
            rows.collect::<Res<_>>()?
        };
        {
            let mut stmt = tx.prepare_cached(
                "UPDATE messages SET state = 'held', handed_at = ?1, handed_via = 'turn'
                 WHERE id = ?2 AND state = 'queued'",
            )?;
            for (id, _) in &rows {
                stmt.execute(params![now, id])?;
            }
        }
        tx.commit()?;
        let mut riding = self.riding.borrow_mut();
        if rows.is_empty() {
            riding.remove(agent);
        } else if !riding.contains(agent) {
            riding.insert(agent.to_string());
        }
        Ok(rows)
    }

    /// Acks the rows `ids` of `recipient` that are in `from_state`, with
    /// everything that goes with an ack, in one transaction: the harness's
    /// `turn` kept with each; with `turn_acked`, the receipts that rode with
    /// the recipient's turn ([`Db::take_receipts`]); and for each row whose
    /// sender asked for a receipt, the receipt `receipt` makes of its row as
    /// acked — its recipient and body, or none (the sender is no agent of
    /// this hive). A failure anywhere leaves it all undone (and a crash
    /// leaves all or nothing). The ids acked.
    pub fn ack(
        &self,
        a: Ack,
        receipt: impl FnMut(SentRow) -> Option<(String, String)>,
    ) -> Res<Vec<i64>> {
        self.ack_by(None, a, receipt)
    }

    /// [`Db::ack`], each row moved through the statement `held` when the
    /// hub holds it.
    pub(super) fn ack_by(
        &self,
        mut held: Option<&mut Statement>,
        a: Ack,
        mut receipt: impl FnMut(SentRow) -> Option<(String, String)>,
    ) -> Res<Vec<i64>> {
        let Ack {
            ids,
            recipient,
            from_state,
            turn,
            turn_acked,
            now,
        } = a;
        let riding = turn_acked && self.riding.borrow().contains(recipient);
        let acked = schema::in_transaction(&self.conn, |c| {
            let mut acked = Vec::new();
            for &id in ids {
                let p = params![MsgState::Acked, now, id, recipient, from_state];
                if execute(c, held.as_deref_mut(), TRANSITION, p)? == 1 {
                    acked.push(id);
                }
            }
            if let Some(t) = turn {
                let mut stmt = c.prepare_cached("UPDATE messages SET turn = ?1 WHERE id = ?2")?;
                for id in &acked {
                    stmt.execute(params![t, id])?;
                }
            }
            if riding {
                c.prepare_cached(RIDING_ACKED)?
                    .execute(params![recipient, now])?;
            }
            for &id in &acked {
                if !self.wants_receipt(id)? {
                    continue;
                }
                let Some((to, body)) = self.sent_row(id)?.and_then(&mut receipt) else {
                    continue;
                };
                let row = NewMessage {
                    from: &Peer::System,
                    to: &to,
                    body: &body,
                    kind: &MsgKind::Receipt,
                    in_reply_to: Some(id),
                    receipt: false,
                    traceparent: None,
                };
                queue_row(c, &self.queues, &row, None, now)?;
            }
            Ok(acked)
        })?;
        self.moved(recipient, from_state, &MsgState::Acked, acked.len());
        if riding {
            self.riding.borrow_mut().remove(recipient);
        }
        Ok(acked)
    }

    /// The receipts that rode with `agent`'s turn are acked at `now` (a
    /// turn whose message is no stored row: a transient wake); how many.
    pub fn ack_receipts(&self, agent: &str, now: i64) -> Res<usize> {
        if !self.riding.borrow().contains(agent) {
            return Ok(0);
        }
        let n = self
            .conn
            .prepare_cached(RIDING_ACKED)?
            .execute(params![agent, now])?;
        self.riding.borrow_mut().remove(agent);
        Ok(n)
    }

    /// The oldest queued or inflight message of `agent`, as its queue
    /// position; receipts, which wake nothing, are not waiting work.
    pub fn oldest_queued_seq(&self, agent: &str) -> Res<Option<i64>> {
        self.conn
            .prepare_cached(concat!(
                "SELECT MIN(seq) FROM messages WHERE recipient = ?1
                 AND state IN ('queued', 'inflight') AND kind != ",
                receipt_kind!()
            ))?
            .query_row(params![agent], |r| r.get(0))
    }

    /// Moves one row between states; returns whether it was in `from_state`.
    pub fn transition(
        &self,
        id: i64,
        recipient: &str,
        from_state: &MsgState,
        to_state: &MsgState,
        now: i64,
    ) -> Res<bool> {
        let done_at = (*to_state == MsgState::Acked).then_some(now);
        let p = params![to_state, done_at, id, recipient, from_state];
        let n = self.conn.prepare_cached(TRANSITION)?.execute(p)?;
        self.moved(recipient, from_state, to_state, n);
        Ok(n == 1)
    }

    /// Moves several rows between states in one transaction.
    pub fn transition_many(
        &self,
        ids: &[i64],
        recipient: &str,
        from_state: &MsgState,
        to_state: &MsgState,
        now: i64,
    ) -> Res<usize> {
        let tx = self.conn.unchecked_transaction()?;
        let mut n = 0;
        {
            let done_at = (*to_state == MsgState::Acked).then_some(now);
            let mut stmt = tx.prepare_cached(TRANSITION)?;
            for id in ids {
                n += stmt.execute(params![to_state, done_at, id, recipient, from_state])?;
            }
        }
        tx.commit()?;
        self.moved(recipient, from_state, to_state, n);
        Ok(n)
    }

    /// Puts the inflight row `id` back into the queue. `counted` keeps its
    /// hand-out counted (else one is given back) and records `error`;
    /// `behind` moves it, with the later queued mail of its own sender in
    /// order behind it, to the tail of the queue, so the mail of other senders
    /// goes first; otherwise it keeps its place at the head. False when it was
    /// not inflight.
    pub fn requeue(
        &self,
        id: i64,
        recipient: &str,
        counted: bool,
        behind: bool,
        error: Option<&str>,
    ) -> Res<bool> {
        let tx = self.conn.unchecked_transaction()?;
        let found: Option<(String, i64)> = tx
            .query_row(
                "SELECT sender, seq FROM messages WHERE id = ?1 AND recipient = ?2
                 AND state = 'inflight'",
                params![id, recipient],
                |r| Ok((r.get(0)?, r.get::<_, Option<i64>>(1)?.unwrap_or(id))),
            )
            .optional()?;
        let Some((sender, seq)) = found else {
            return Ok(false);
        };
        tx.execute(
            "UPDATE messages SET state = 'queued',
                attempts = CASE WHEN ?2 THEN attempts ELSE MAX(attempts - 1, 0) END,
                last_error = COALESCE(?3, last_error)
             WHERE id = ?1",
            params![id, counted, error],
        )?;
        if behind {
            let mut ids = vec![id];
            {
                let mut stmt = tx.prepare_cached(
                    "SELECT id FROM messages WHERE recipient = ?1 AND state = 'queued'
                     AND sender = ?2 AND seq > ?3 ORDER BY seq, id",
                )?;
                let later = stmt.query_map(params![recipient, sender, seq], |r| r.get(0))?;
                for l in later {
                    ids.push(l?);
                }
            }
            let mut stmt = tx.prepare_cached("UPDATE messages SET seq = ?1 WHERE id = ?2")?;
            for moved in &ids {
                stmt.execute(params![self.queues.next_place(), moved])?;
            }
        }
        tx.commit()?;
        self.moved(recipient, &MsgState::Inflight, &MsgState::Queued, 1);
        Ok(true)
    }

    /// Dead-letters the inflight row `id`: `failed`, with `error` as its last
    /// error and now as its `done_at` (and its last hand-out given back unless
    /// it `ran`), and `notices` queued, in one transaction. False (and nothing
    /// queued) when it was not inflight, so the notices go out once.
    pub fn dead_letter(
        &self,
        id: i64,
        recipient: &str,
        error: &str,
        ran: bool,
        now: i64,
        notices: &[NewMessage],
    ) -> Res<bool> {
        let tx = self.conn.unchecked_transaction()?;
        let n = tx.execute(
            "UPDATE messages SET state = 'failed', last_error = ?1, done_at = ?2,
                attempts = CASE WHEN ?5 THEN attempts ELSE MAX(attempts - 1, 0) END
             WHERE id = ?3 AND recipient = ?4 AND state = 'inflight'",
            params![error, now, id, recipient, ran],
        )?;
        if n == 1 {
            insert_all(&tx, &self.queues, notices, now)?;
        }
        tx.commit()?;
        self.moved(recipient, &MsgState::Inflight, &MsgState::Failed, n);
        Ok(n == 1)
    }

    /// Stores a transient wake its harness gave up on as a dead letter of its
    /// own, with `notices` (built for its new id by `notices`), in one
    /// transaction; returns the new id.
    pub fn insert_dead_letter(
        &self,
        m: &NewMessage,
        attempts: u32,
        error: &str,
        now: i64,
        notices: impl FnOnce(i64) -> Vec<(Peer, String, String)>,
    ) -> Res<i64> {
        let tx = self.conn.unchecked_transaction()?;
        tx.execute(
            "INSERT INTO messages (sender, recipient, body, kind, in_reply_to, state, sent_at,
                done_at, attempts, last_error, seq, traceparent)
             VALUES (?1, ?2, ?3, ?4, ?5, 'failed', ?6, ?6, ?7, ?8, ?9, ?10)",
            params![
                m.from,
                m.to,
                m.body,
                m.kind,
                m.in_reply_to,
                now,
                attempts,
                error,
                self.queues.next_place(),
                m.traceparent
            ],
        )?;
        let id = tx.last_insert_rowid();
        let built = notices(id);
        let rows: Vec<NewMessage> = built
            .iter()
            .map(|(from, to, body)| NewMessage {
                from,
                to,
                body,
                kind: &MsgKind::DeadLetter,
                in_reply_to: None,
                receipt: false,
                traceparent: None,
            })
            .collect();
        insert_all(&tx, &self.queues, &rows, now)?;
        tx.commit()?;
        Ok(id)
    }

    /// The dead letters of `agent` (or of every agent), oldest first.
    pub fn failed(&self, agent: Option<&str>) -> Res<Vec<FailedMessage>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT id, recipient, sender, body, kind, attempts, last_error, sent_at, done_at
             FROM messages WHERE state = 'failed' AND (?1 IS NULL OR recipient = ?1)
             ORDER BY done_at, id",
        )?;
        let rows = stmt.query_map(params![agent], |r| {
            Ok(FailedMessage {
                id: r.get(0)?,
                agent: r.get(1)?,
                from: r.get(2)?,
                body: r.get(3)?,
                kind: r.get(4)?,
                attempts: count_at(r, 5)?,
                last_error: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
                sent_at: r.get(7)?,
                failed_at: r.get(8)?,
            })
        })?;
        rows.collect()
    }

    pub fn count_failed(&self, recipient: &str) -> Res<u64> {
        self.conn
            .prepare_cached(
                "SELECT COUNT(*) FROM messages WHERE recipient = ?1 AND state = 'failed'",
            )?
            .query_row(params![recipient], |r| r.get::<_, i64>(0).map(|n| n as u64))
    }

    /// The attempts of message `id`, if it exists.
    pub fn attempts(&self, id: i64) -> Res<Option<u32>> {
        self.conn
            .prepare_cached("SELECT attempts FROM messages WHERE id = ?1")?
            .query_row(params![id], |r| count_at(r, 0))
            .optional()
    }

    /// The rows per recipient and state (`message_counts`), by recipient
    /// then state: one pass over the `messages_inbox` index, which covers
    /// both columns.
    pub fn message_counts(&self) -> Res<Vec<(String, MsgState, u64)>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT recipient, state, COUNT(*) FROM messages
             GROUP BY recipient, state ORDER BY recipient, state",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)?.max(0) as u64))
        })?;
        rows.collect()
    }

    /// The recipient and state of message `id`, if it exists.
    pub fn message_state(&self, id: i64) -> Res<Option<(String, MsgState)>> {
        self.conn
            .prepare_cached("SELECT recipient, state FROM messages WHERE id = ?1")?
            .query_row(params![id], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()
    }

    /// Notes that rows `ids` were handed out at `now` through `via` (`recv`).
    pub fn mark_handed(&self, ids: &[i64], via: &str, now: i64) -> Res<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let tx = self.conn.unchecked_transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "UPDATE messages SET handed_at = ?1, handed_via = ?2 WHERE id = ?3",
            )?;
            for id in ids {
                stmt.execute(params![now, via, id])?;
            }
        }
        tx.commit()
    }

    /// Message `id` as `message_state` reads it, if its row is there: the
    /// message (the one row mapper), where it is in its life, its outbox
    /// entry, and when queued its place among the rows its recipient's
    /// turns wait for (receipts, which wake nothing, are not counted).
    pub fn sent_row(&self, id: i64) -> Res<Option<SentRow>> {
        let row = self
            .conn
            .prepare_cached(concat!(
                "SELECT ",
                msg_cols!(),
                ", ",
                life_cols!(),
                " FROM messages WHERE id = ?1"
            ))?
            .query_row(params![id], |r| {
                let at = |i: usize| MSG_N + i;
                let row = SentRow {
                    message: message_from_row(r)?,
                    charged: r.get(at(0))?,
                    state: r.get(at(1))?,
                    done_at: r.get(at(2))?,
                    attempts: count_at(r, at(3))?,
                    last_error: r.get(at(4))?,
                    handed_at: r.get(at(5))?,
                    handed_via: r.get(at(6))?,
                    turn: r.get(at(7))?,
                    position: None,
                    outbox: None,
                };
                Ok((row, r.get::<_, Option<i64>>(at(8))?.unwrap_or(id)))
            })
            .optional()?;
        let Some((mut row, seq)) = row else {
            return Ok(None);
        };
        row.outbox = self
            .conn
            .prepare_cached(
                "SELECT state, done_at, event_id, error FROM outbox
                 WHERE msg_id = ?1 AND dest != ''",
            )?
            .query_row(params![id], |r| {
                Ok(SentOutbox {
                    state: r.get(0)?,
                    done_at: r.get(1)?,
                    event_id: r.get(2)?,
                    error: r.get(3)?,
                })
            })
            .optional()?;
        if row.state == MsgState::Queued && row.outbox.is_none() {
            let ahead: i64 = self
                .conn
                .prepare_cached(concat!(
                    "SELECT COUNT(*) FROM messages WHERE recipient = ?1 AND state = 'queued'
                     AND kind != ",
                    receipt_kind!(),
                    " AND (seq < ?2 OR (seq = ?2 AND id < ?3))"
                ))?
                .query_row(params![row.message.to.as_str(), seq, id], |r| r.get(0))?;
            row.position = Some(ahead.max(0) as u64 + 1);
        }
        Ok(Some(row))
    }

    /// The sender kept of message `id` when retention deleted its row
    /// (empty when it was no agent's own send).
    pub fn pruned_sender(&self, id: i64) -> Res<Option<String>> {
        self.conn
            .prepare_cached("SELECT sender FROM pruned_messages WHERE id = ?1")?
            .query_row(params![id], |r| r.get(0))
            .optional()
    }

    /// Puts the dead letter `id` back at the tail of its recipient's queue,
    /// its attempts and last error reset; false when it was not `failed`.
    pub fn retry(&self, id: i64) -> Res<bool> {
        Ok(self.conn.execute(
            "UPDATE messages SET state = 'queued', attempts = 0, last_error = NULL,
                done_at = NULL, seq = ?2
             WHERE id = ?1 AND state = 'failed'",
            params![id, self.queues.next_place()],
        )? == 1)
    }
}
