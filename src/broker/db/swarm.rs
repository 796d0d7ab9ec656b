//! The swarm's part of `broker.db` (schema steps 4 and 13): the sync token
//! the bridge resumes from, the outbox (one row per message that leaves
//! through the bridge, pending until the homeserver answered, stamped with
//! the instance of the broker start that committed it), the inbound log that
//! deduplicates room events by (origin hive, instance, `hive.id`) and maps
//! them to local messages, the last instances seen of each peer hive, and
//! the mirrors of questions other hives asked here. Each broker start makes
//! a fresh instance id ([`fresh_instance`]): an event keeps its first
//! (instance, id) for good, so a restart or a `broker.db` restored from a
//! backup (whose message ids start again) never reuses one. Several writes
//! that must happen together (a delivered batch and its sync token, a
//! message and its outbox entry) run in one [`Batch`].

use super::{Db, NewMessage, Res};
use crate::proto::cmd::{EventKind, UndeliverableReason};
use crate::proto::{MsgKind, Peer, Question};
use rusqlite::{params, OptionalExtension};

/// Schema step 4.
pub(super) const SCHEMA_V4: &str = "
CREATE TABLE swarm_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
INSERT INTO swarm_meta (key, value)
    SELECT 'instance', lower(substr(h, 1, 8) || '-' || substr(h, 9, 4) || '-4' || substr(h, 14, 3)
        || '-' || substr('89ab', 1 + abs(random()) % 4, 1) || substr(h, 18, 3) || '-'
        || substr(h, 21, 12))
    FROM (SELECT hex(randomblob(16)) AS h);
CREATE TABLE outbox (
    msg_id INTEGER PRIMARY KEY,
    dest TEXT NOT NULL,
    kind TEXT NOT NULL,
    question INTEGER,
    in_reply_to INTEGER,
    state TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'failed')),
    created_at INTEGER NOT NULL,
    done_at INTEGER,
    event_id TEXT,
    error TEXT
);
CREATE INDEX outbox_pending ON outbox (state, msg_id);
CREATE INDEX outbox_event ON outbox (event_id);
CREATE TABLE inbound (
    origin TEXT NOT NULL,
    origin_id TEXT NOT NULL,
    local_id INTEGER,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (origin, origin_id)
);
CREATE INDEX inbound_local ON inbound (local_id);
CREATE INDEX inbound_received ON inbound (received_at);
CREATE TABLE question_mirrors (
    question_id INTEGER PRIMARY KEY,
    origin TEXT NOT NULL,
    origin_id INTEGER NOT NULL,
    UNIQUE (origin, origin_id)
);
";

/// Schema step 13 (issue 40): an instance id per broker start. Every outbox
/// row gets the instance it was first committed under (the old rows the one
/// instance older releases made with `broker.db`), and replies, answers,
/// withdrawals and bounces the instance of the message or question they name
/// (`ref_instance`); the inbound log and the question mirrors are keyed by
/// the sender's instance too (the old rows by the peer's instance older
/// releases kept in `swarm_meta`, which moves to `peer_instances` as the
/// latest seen).
pub(super) const SCHEMA_V13: &str = "
ALTER TABLE outbox ADD COLUMN instance TEXT NOT NULL DEFAULT '';
ALTER TABLE outbox ADD COLUMN ref_instance TEXT;
UPDATE outbox SET instance = COALESCE((SELECT value FROM swarm_meta WHERE key = 'instance'), '');
UPDATE outbox SET ref_instance = CASE kind
        WHEN 'question_cancelled' THEN instance
        ELSE (SELECT value FROM swarm_meta WHERE key = 'peer_instance:' || outbox.dest)
    END
    WHERE kind != 'question_asked' AND (question IS NOT NULL OR in_reply_to IS NOT NULL);
CREATE INDEX outbox_question ON outbox (question, kind);
CREATE TABLE inbound_v13 (
    origin TEXT NOT NULL,
    instance TEXT NOT NULL,
    origin_id TEXT NOT NULL,
    local_id INTEGER,
    received_at INTEGER NOT NULL,
    PRIMARY KEY (origin, instance, origin_id)
);
INSERT INTO inbound_v13 (origin, instance, origin_id, local_id, received_at)
    SELECT origin,
           COALESCE((SELECT value FROM swarm_meta WHERE key = 'peer_instance:' || inbound.origin), ''),
           origin_id, local_id, received_at
    FROM inbound;
DROP TABLE inbound;
ALTER TABLE inbound_v13 RENAME TO inbound;
CREATE INDEX inbound_local ON inbound (local_id);
CREATE INDEX inbound_received ON inbound (received_at);
CREATE TABLE question_mirrors_v13 (
    question_id INTEGER PRIMARY KEY,
    origin TEXT NOT NULL,
    instance TEXT NOT NULL,
    origin_id INTEGER NOT NULL,
    UNIQUE (origin, instance, origin_id)
);
INSERT INTO question_mirrors_v13 (question_id, origin, instance, origin_id)
    SELECT question_id, origin,
           COALESCE((SELECT value FROM swarm_meta WHERE key = 'peer_instance:' || question_mirrors.origin), ''),
           origin_id
    FROM question_mirrors;
DROP TABLE question_mirrors;
ALTER TABLE question_mirrors_v13 RENAME TO question_mirrors;
CREATE TABLE peer_instances (
    origin TEXT NOT NULL,
    instance TEXT NOT NULL,
    seen INTEGER NOT NULL,
    PRIMARY KEY (origin, instance)
);
INSERT INTO peer_instances (origin, instance, seen)
    SELECT substr(key, 15), value, 1 FROM swarm_meta WHERE key LIKE 'peer_instance:%';
DELETE FROM swarm_meta WHERE key LIKE 'peer_instance:%' OR key = 'instance';
";

/// A fresh instance id (a random uuid, version 4), made at each broker
/// start.
pub(super) fn fresh_instance(conn: &rusqlite::Connection) -> Res<String> {
    let h: String = conn.query_row("SELECT lower(hex(randomblob(16)))", [], |r| r.get(0))?;
    let variant = ["8", "9", "a", "b"][usize::from_str_radix(&h[16..17], 16).unwrap_or(0) % 4];
    Ok(format!(
        "{}-{}-4{}-{variant}{}-{}",
        &h[..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    ))
}

/// What became of a peer's instance when one of its events came in.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PeerInstance {
    /// It was not among the instances remembered of that hive.
    pub new: bool,
    /// The instances it pushed out of the last
    /// [`KEEP_PEER_INSTANCES`](crate::proto::cmd::KEEP_PEER_INSTANCES):
    /// forgotten with the events seen from them.
    pub forgotten: Vec<String>,
}

/// Where an outbox row's event goes and what it carries besides its message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    /// The message it carries (`hive.id`, the transaction id's suffix).
    pub msg_id: i64,
    /// The destination hive; empty for the operator room.
    pub dest: String,
    pub kind: EventKind,
    /// For the question kinds: the asker's question id.
    pub question: Option<i64>,
    /// The instance of the message `in_reply_to` names, or of the question
    /// `question` names (a question's own event: none).
    pub ref_instance: Option<String>,
    /// The message it answers, in the destination's ids.
    pub in_reply_to: Option<i64>,
    /// For an `undeliverable` event: why (step 11's `reason`).
    pub reason: Option<UndeliverableReason>,
}

/// A pending outbox row with its message (and, for a question asked, the
/// question's options).
#[derive(Debug, Clone, PartialEq)]
pub struct OutRow {
    pub entry: OutboxEntry,
    /// The instance it was first committed under.
    pub instance: String,
    pub from: Peer,
    pub to: Peer,
    pub body: String,
    pub options: Vec<String>,
    pub multi: bool,
}

/// An outbox row's `reason` as stored: a name this release does not know is
/// none.
fn reason(stored: Option<String>) -> Option<UndeliverableReason> {
    stored.and_then(|r| UndeliverableReason::from_name(&r))
}

/// How the homeserver settled an outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settle<'a> {
    Sent { event_id: &'a str },
    Failed { error: &'a str },
}

/// Several writes committed together (`BEGIN IMMEDIATE` … `COMMIT`), rolled
/// back when dropped uncommitted. Inside one, use the store's single-statement
/// methods and the batch's own; never a method that opens its own transaction.
pub struct Batch<'a> {
    db: &'a Db,
    done: bool,
}

impl std::ops::Deref for Batch<'_> {
    type Target = Db;
    fn deref(&self) -> &Db {
        self.db
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Err(e) = self.db.conn.execute_batch("ROLLBACK") {
                log::error!("cannot roll back a failed batch: {e}");
            }
        }
    }
}

impl Batch<'_> {
    pub fn commit(mut self) -> Res<()> {
        self.db.conn.execute_batch("COMMIT")?;
        self.done = true;
        Ok(())
    }
}

impl Db {
    /// Starts a [`Batch`].
    pub fn batch(&self) -> Res<Batch<'_>> {
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        Ok(Batch {
            db: self,
            done: false,
        })
    }

    /// The instance id of this broker start: what the outbox rows it
    /// commits are stamped with.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The sync token stored with the last delivered batch.
    pub fn next_batch(&self) -> Res<Option<String>> {
        self.conn
            .query_row(
                "SELECT value FROM swarm_meta WHERE key = 'next_batch'",
                [],
                |r| r.get(0),
            )
            .optional()
    }

    pub fn set_next_batch(&self, token: &str) -> Res<()> {
        self.conn.execute(
            "INSERT INTO swarm_meta (key, value) VALUES ('next_batch', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            params![token],
        )?;
        Ok(())
    }

    pub fn insert_outbox(&self, e: &OutboxEntry, now: i64) -> Res<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO outbox (msg_id, dest, kind, question, in_reply_to, created_at, reason,
                                     instance, ref_instance)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                e.msg_id,
                e.dest,
                e.kind.name(),
                e.question,
                e.in_reply_to,
                now,
                e.reason.map(UndeliverableReason::name),
                self.instance,
                e.ref_instance
            ])?;
        Ok(())
    }

    /// The oldest pending outbox rows, in id order.
    pub fn outbox_pending(&self, limit: u32) -> Res<Vec<OutRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT o.msg_id, o.dest, o.kind, o.question, o.in_reply_to,
                    m.sender, m.recipient, m.body, q.options, q.multi, o.reason,
                    o.instance, o.ref_instance
             FROM outbox o JOIN messages m ON m.id = o.msg_id
             LEFT JOIN questions q ON o.kind = 'question_asked' AND q.id = o.question
             WHERE o.state = 'pending' ORDER BY o.msg_id LIMIT ?1",
        )?;
        let rows = stmt.query_map(params![limit], |r| {
            let kind: String = r.get(2)?;
            let options: Option<String> = r.get(8)?;
            Ok(OutRow {
                entry: OutboxEntry {
                    msg_id: r.get(0)?,
                    dest: r.get(1)?,
                    kind: EventKind::from_name(&kind).unwrap_or(EventKind::Message),
                    question: r.get(3)?,
                    ref_instance: r.get(12)?,
                    in_reply_to: r.get(4)?,
                    reason: reason(r.get(10)?),
                },
                instance: r.get(11)?,
                from: r.get(5)?,
                to: r.get(6)?,
                body: r.get(7)?,
                options: options
                    .and_then(|o| serde_json::from_str(&o).ok())
                    .unwrap_or_default(),
                multi: r.get::<_, Option<i64>>(9)?.unwrap_or(0) != 0,
            })
        })?;
        rows.collect()
    }

    /// Settles a pending outbox row; the message of mail to another hive is
    /// done with it. Returns the row as it was, or None when it was not
    /// pending (settled before: a repeat is harmless).
    pub fn settle_outbox(&self, msg_id: i64, how: Settle, now: i64) -> Res<Option<OutRow>> {
        let Some(row) = self.outbox_pending_row(msg_id)? else {
            return Ok(None);
        };
        let tx = self.conn.unchecked_transaction()?;
        match how {
            Settle::Sent { event_id } => tx.execute(
                "UPDATE outbox SET state = 'sent', done_at = ?1, event_id = ?2
                 WHERE msg_id = ?3 AND state = 'pending'",
                params![now, event_id, msg_id],
            )?,
            Settle::Failed { error } => tx.execute(
                "UPDATE outbox SET state = 'failed', done_at = ?1, error = ?2
                 WHERE msg_id = ?3 AND state = 'pending'",
                params![now, error, msg_id],
            )?,
        };
        if !row.entry.dest.is_empty() {
            tx.execute(
                "UPDATE messages SET state = 'acked', done_at = ?1 WHERE id = ?2 AND state = 'queued'",
                params![now, msg_id],
            )?;
        }
        tx.commit()?;
        Ok(Some(row))
    }

    fn outbox_pending_row(&self, msg_id: i64) -> Res<Option<OutRow>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT o.msg_id, o.dest, o.kind, o.question, o.in_reply_to,
                    m.sender, m.recipient, m.body, o.reason, o.instance, o.ref_instance
             FROM outbox o JOIN messages m ON m.id = o.msg_id
             WHERE o.msg_id = ?1 AND o.state = 'pending'",
        )?;
        stmt.query_row(params![msg_id], |r| {
            let kind: String = r.get(2)?;
            Ok(OutRow {
                entry: OutboxEntry {
                    msg_id: r.get(0)?,
                    dest: r.get(1)?,
                    kind: EventKind::from_name(&kind).unwrap_or(EventKind::Message),
                    question: r.get(3)?,
                    ref_instance: r.get(10)?,
                    in_reply_to: r.get(4)?,
                    reason: reason(r.get(8)?),
                },
                instance: r.get(9)?,
                from: r.get(5)?,
                to: r.get(6)?,
                body: r.get(7)?,
                options: Vec::new(),
                multi: false,
            })
        })
        .optional()
    }

    /// Pending and failed outbox rows.
    pub fn outbox_counts(&self) -> Res<(u64, u64)> {
        self.conn.query_row(
            "SELECT COALESCE(SUM(state = 'pending'), 0), COALESCE(SUM(state = 'failed'), 0)
             FROM outbox",
            [],
            |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
        )
    }

    /// Who posted the operator-room event `event_id` (the sender of its
    /// message), if this hive's bridge posted it.
    pub fn operator_post_sender(&self, event_id: &str) -> Res<Option<Peer>> {
        self.conn
            .query_row(
                "SELECT m.sender FROM outbox o JOIN messages m ON m.id = o.msg_id
                 WHERE o.event_id = ?1 AND o.dest = ''",
                params![event_id],
                |r| r.get(0),
            )
            .optional()
    }

    /// Notes that an event of hive `origin` came under `instance`: it becomes
    /// the hive's latest, and the oldest beyond the last `keep` instances are
    /// forgotten with the events seen from them (an event of theirs would be
    /// new again). The question mirrors stay: their questions are open until
    /// answered or cancelled.
    pub fn note_peer_instance(
        &self,
        origin: &str,
        instance: &str,
        keep: usize,
    ) -> Res<PeerInstance> {
        let latest: Option<String> = self
            .conn
            .prepare_cached(
                "SELECT instance FROM peer_instances WHERE origin = ?1 ORDER BY seen DESC LIMIT 1",
            )?
            .query_row(params![origin], |r| r.get(0))
            .optional()?;
        if latest.as_deref() == Some(instance) {
            return Ok(PeerInstance::default());
        }
        let new = self
            .conn
            .prepare_cached("SELECT 1 FROM peer_instances WHERE origin = ?1 AND instance = ?2")?
            .query_row(params![origin, instance], |_| Ok(()))
            .optional()?
            .is_none();
        self.conn
            .prepare_cached(
                "INSERT INTO peer_instances (origin, instance, seen)
                 VALUES (?1, ?2, (SELECT COALESCE(MAX(seen), 0) + 1 FROM peer_instances))
                 ON CONFLICT (origin, instance) DO UPDATE SET seen = excluded.seen",
            )?
            .execute(params![origin, instance])?;
        let forgotten: Vec<String> = self
            .conn
            .prepare_cached(
                "SELECT instance FROM peer_instances WHERE origin = ?1
                 ORDER BY seen DESC LIMIT -1 OFFSET ?2",
            )?
            .query_map(params![origin, keep as i64], |r| r.get(0))?
            .collect::<Res<_>>()?;
        for old in &forgotten {
            self.conn.execute(
                "DELETE FROM inbound WHERE origin = ?1 AND instance = ?2",
                params![origin, old],
            )?;
            self.conn.execute(
                "DELETE FROM peer_instances WHERE origin = ?1 AND instance = ?2",
                params![origin, old],
            )?;
        }
        Ok(PeerInstance { new, forgotten })
    }

    /// The instances remembered of hive `origin`, the latest first.
    pub fn peer_instances(&self, origin: &str) -> Res<Vec<String>> {
        self.conn
            .prepare_cached(
                "SELECT instance FROM peer_instances WHERE origin = ?1 ORDER BY seen DESC",
            )?
            .query_map(params![origin], |r| r.get(0))?
            .collect()
    }

    /// Whether the room event (origin, instance, id) was delivered before.
    pub fn seen_inbound(&self, origin: &str, instance: &str, id: &str) -> Res<bool> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT 1 FROM inbound WHERE origin = ?1 AND instance = ?2 AND origin_id = ?3",
            )?
            .query_row(params![origin, instance, id], |_| Ok(()))
            .optional()?
            .is_some())
    }

    pub fn record_inbound(
        &self,
        origin: &str,
        instance: &str,
        id: &str,
        local_id: Option<i64>,
        now: i64,
    ) -> Res<()> {
        self.conn
            .prepare_cached(
                "INSERT INTO inbound (origin, instance, origin_id, local_id, received_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![origin, instance, id, local_id, now])?;
        Ok(())
    }

    /// Forgets room events received before `before` (their replays are
    /// refused by age instead).
    pub fn prune_inbound(&self, before: i64) -> Res<usize> {
        self.conn.execute(
            "DELETE FROM inbound WHERE received_at < ?1",
            params![before],
        )
    }

    /// The id on hive `origin` of the local message `local_id` that came from
    /// there: what a reply to it names there.
    /// With it, the instance it came under (none from a peer of an older
    /// release).
    pub fn origin_id_of(&self, local_id: i64, origin: &str) -> Res<Option<(i64, Option<String>)>> {
        let row: Option<(String, String)> = self
            .conn
            .prepare_cached(
                "SELECT origin_id, instance FROM inbound WHERE local_id = ?1 AND origin = ?2",
            )?
            .query_row(params![local_id, origin], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        Ok(row.and_then(|(id, instance)| {
            let id = id.parse().ok()?;
            Some((id, Some(instance).filter(|i| !i.is_empty())))
        }))
    }

    /// The recipient of message `msg_id` (`b@two` for mail to another hive).
    pub fn recipient_of(&self, msg_id: i64) -> Res<Option<String>> {
        self.conn
            .prepare_cached("SELECT recipient FROM messages WHERE id = ?1")?
            .query_row(params![msg_id], |r| r.get(0))
            .optional()
    }

    /// Whether `msg_id` is a message this hive sent to hive `dest` (under
    /// `instance`, when it is named): what an `in_reply_to` from there may
    /// name.
    pub fn sent_to(&self, msg_id: i64, dest: &str, instance: Option<&str>) -> Res<bool> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT 1 FROM outbox WHERE msg_id = ?1 AND dest = ?2
                 AND (?3 IS NULL OR instance = ?3)",
            )?
            .query_row(params![msg_id, dest, instance], |_| Ok(()))
            .optional()?
            .is_some())
    }

    /// Records that question `question_id` here mirrors question
    /// `origin_id` that hive `origin` asked under `instance`. False when
    /// that question has a mirror already (a repeat under another event id).
    pub fn insert_mirror(
        &self,
        question_id: i64,
        origin: &str,
        instance: &str,
        origin_id: i64,
    ) -> Res<bool> {
        Ok(self.conn.execute(
            "INSERT INTO question_mirrors (question_id, origin, instance, origin_id)
             VALUES (?1, ?2, ?3, ?4) ON CONFLICT (origin, instance, origin_id) DO NOTHING",
            params![question_id, origin, instance, origin_id],
        )? == 1)
    }

    /// The local mirror of question `origin_id` that hive `origin` asked
    /// under `instance`; without one (a peer of an older release), the
    /// latest mirror of that id.
    pub fn mirror_of(
        &self,
        origin: &str,
        instance: Option<&str>,
        origin_id: i64,
    ) -> Res<Option<i64>> {
        self.conn
            .query_row(
                "SELECT question_id FROM question_mirrors
                 WHERE origin = ?1 AND origin_id = ?2 AND (?3 IS NULL OR instance = ?3)
                 ORDER BY question_id DESC LIMIT 1",
                params![origin, origin_id, instance],
                |r| r.get(0),
            )
            .optional()
    }

    /// Where the mirror `question_id` came from: (hive, the instance that
    /// asked it, the asker's id).
    pub fn mirror_origin(&self, question_id: i64) -> Res<Option<(String, String, i64)>> {
        self.conn
            .query_row(
                "SELECT origin, instance, origin_id FROM question_mirrors WHERE question_id = ?1",
                params![question_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
            .optional()
    }

    /// The instance that asked question `id` of this hive on another hive
    /// (its `question_asked` event's).
    pub fn asked_under(&self, id: i64) -> Res<Option<String>> {
        self.conn
            .prepare_cached(
                "SELECT instance FROM outbox WHERE question = ?1 AND kind = 'question_asked'",
            )?
            .query_row(params![id], |r| r.get(0))
            .optional()
    }

    /// Records an answer to an open question; false when it was closed.
    /// (Inside a [`Batch`]; [`Db::close_question`] is the one-off form.)
    pub fn settle_question(&self, id: i64, answer: &str, by: &Peer, now: i64) -> Res<bool> {
        Ok(self.conn.execute(
            "UPDATE questions SET answer = ?1, answered_by = ?2, answered_at = ?3
             WHERE id = ?4 AND answer IS NULL",
            params![answer, by, now, id],
        )? == 1)
    }

    /// The question `id`, open or not.
    pub fn question(&self, id: i64) -> Res<Option<(Question, bool)>> {
        self.conn
            .query_row(
                &format!(
                    "SELECT {}, answer IS NULL FROM questions WHERE id = ?1",
                    super::questions::Q_COLS
                ),
                params![id],
                |r| {
                    Ok((
                        super::questions::question_from_row(r)?,
                        r.get::<_, bool>(8)?,
                    ))
                },
            )
            .optional()
    }
}

/// A new message row, for the batch-built deliveries.
pub fn new_message<'a>(
    from: &'a Peer,
    to: &'a str,
    body: &'a str,
    kind: &'a MsgKind,
    in_reply_to: Option<i64>,
) -> NewMessage<'a> {
    NewMessage {
        from,
        to,
        body,
        kind,
        in_reply_to,
        receipt: false,
        traceparent: None,
    }
}
