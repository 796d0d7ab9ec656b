//! The swarm in the hub: mail and questions for `NAME@HIVE` become messages
//! with an outbox entry, committed together, and wake the bridge's
//! `bridge_next`; the bridge settles each once the homeserver answered
//! (`bridge_sent`, `bridge_failed`, whose sender is told); a batch of room
//! events (`bridge_deliver`) is delivered once each — deduplicated by (origin
//! hive, instance, `hive.id`), the last instances of each hive remembered —
//! in one transaction with the sync token after it, mail for no agent here
//! bounces to its sender, and questions across hives keep a mirror here with
//! a local id. The bridge's link state (`bridge_status`, and
//! its connections) is kept in memory for `agents`. `docs/swarm.md` tells the
//! whole story.

use super::{db_err, ConnId, Ctx, Done, Handled, Hub, Identity};
use crate::broker::db::{new_message, Batch, NewMessage, OutboxEntry, Settle};
use crate::proto::address::Remote;
use crate::proto::cmd::{
    Ask, BridgeDeliver, BridgeDeliverReply, BridgeFailed, BridgeHelloReply, BridgeNext,
    BridgeNextReply, BridgeSent, BridgeStatus, EventKind, Inbound, Outbound, UndeliverableReason,
    KEEP_PEER_INSTANCES,
};
use crate::proto::limits::{MAX_REMOTE_BODY, PAGE_BYTES};
use crate::proto::swarm::{BridgeRow, BridgeState, MatrixConfig};
use crate::proto::text::excerpt;
use crate::proto::{now, Empty, IdReply, MsgKind, Peer, Question, SentReply};
use std::collections::BTreeSet;

/// The waiter key of a parked `bridge_next` (no agent can have the name).
const BRIDGE: &str = "@bridge";

/// How long a delivered room event is remembered for deduplication (the
/// specification's minimum is 7 days).
pub(super) const DEDUPE_KEEP_SECS: i64 = 30 * 86400;

/// Room events older than this are skipped, so a replay from before the
/// dedupe horizon (a homeserver that pages back too far) delivers nothing.
pub(super) const MAX_EVENT_AGE_SECS: i64 = 28 * 86400;

/// Most outbox rows one `bridge_next` looks at.
const NEXT_ROWS: u32 = 64;

/// The bridge as the hub knows it: what it last reported and the
/// connections it has open (none: it is not running).
#[derive(Debug)]
pub(super) struct BridgeLink {
    state: BridgeState,
    since: i64,
    detail: Option<String>,
    conns: BTreeSet<ConnId>,
}

impl Default for BridgeLink {
    fn default() -> BridgeLink {
        BridgeLink {
            state: BridgeState::NotRunning,
            since: now(),
            detail: None,
            conns: BTreeSet::new(),
        }
    }
}

impl BridgeLink {
    fn set(&mut self, state: BridgeState, detail: Option<String>) {
        if state != self.state {
            log::info!(
                "bridge: {state}{}",
                detail
                    .as_deref()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            );
            self.state = state;
            self.since = now();
        }
        self.detail = detail;
    }
}

/// What became of one room event.
enum Fate {
    Delivered,
    Bounced,
    Ignored(String),
}

impl Hub<'_> {
    /// This hive's name and `matrix` section, when it is in a swarm.
    fn swarm(&self) -> Option<(&str, &MatrixConfig)> {
        Some((self.cfg.hive_name.as_deref()?, self.cfg.matrix.as_ref()?))
    }

    /// Whether `to` can be reached: a bridge is configured and its hive is a
    /// peer.
    fn check_reachable(&self, to: &Remote) -> Result<(), String> {
        let Some((_, m)) = self.swarm() else {
            return Err(format!(
                "{to} is on another hive, and this hive has no bridge to a swarm: the operator \
                 adds a matrix section to the fleet file (docs/swarm.md)"
            ));
        };
        if !m.peers.contains_key(&to.hive) {
            let known: Vec<&str> = m.peers.keys().map(String::as_str).collect();
            return Err(format!(
                "no hive {} in this hive's swarm; its peers are {}",
                excerpt(&to.hive),
                known.join(", ")
            ));
        }
        Ok(())
    }

    /// `p` as other hives know it (`a@one`).
    fn qualified(&self, p: &Peer) -> String {
        match p {
            Peer::Remote(n) => n.clone(),
            other => format!(
                "{}@{}",
                other.as_str(),
                self.cfg.hive_name.as_deref().unwrap_or_default()
            ),
        }
    }

    /// `send` to `NAME@HIVE`: the message and its outbox entry in one
    /// transaction. `in_reply_to` (an id here) travels as the id it has there,
    /// when it is a message that came from there.
    pub(super) fn send_remote(
        &mut self,
        who: &Identity,
        to: &Remote,
        body: &str,
        in_reply_to: Option<i64>,
    ) -> Result<SentReply, String> {
        let (from, charged) = match who {
            Identity::Operator => (Peer::Operator, None),
            Identity::Agent(a) => {
                self.cfg.may_send(a, &to.to_string())?;
                (Peer::Agent(a.clone()), Some(a.as_str()))
            }
            Identity::Bridge => return Err("the bridge sends no mail".into()),
        };
        self.check_reachable(to)?;
        if let Some(a) = charged {
            self.may_store(a, body.len())?;
        }
        let theirs = match in_reply_to {
            Some(id) => self.db.origin_id_of(id, &to.hive).map_err(db_err)?,
            None => None,
        };
        let to_name = to.to_string();
        let msg = new_message(&from, &to_name, body, &MsgKind::Message, in_reply_to);
        let id = self.store_outbound(&msg, charged, &to.hive, theirs)?;
        if let Some(a) = charged {
            self.stored(a, body.len());
        }
        Ok(SentReply {
            id: Some(id),
            to: Peer::Remote(to_name),
        })
    }

    /// One message (charged to agent `charged`) and its outbox entry,
    /// committed together; wakes the bridge. `in_reply_to` is the id (and
    /// instance) on `dest` of the message it answers.
    fn store_outbound(
        &mut self,
        msg: &NewMessage,
        charged: Option<&str>,
        dest: &str,
        in_reply_to: Option<(i64, Option<String>)>,
    ) -> Result<i64, String> {
        let (in_reply_to, ref_instance) = in_reply_to.unzip();
        let t = now();
        let b = self.db.batch().map_err(db_err)?;
        let id = b.insert_charged(msg, charged, t).map_err(db_err)?;
        b.insert_outbox(
            &OutboxEntry {
                msg_id: id,
                dest: dest.to_string(),
                kind: EventKind::Message,
                question: None,
                ref_instance: ref_instance.flatten(),
                in_reply_to,
                reason: None,
            },
            t,
        )
        .map_err(db_err)?;
        b.commit().map_err(db_err)?;
        self.notify(BRIDGE);
        Ok(id)
    }

    /// The swarm's hook on local delivery (`inbox.rs`'s `store`): a message
    /// to the operator stored with its copy for the operator room, in one
    /// transaction.
    pub(super) fn store_mirrored(
        &mut self,
        m: &NewMessage,
        charged: Option<&str>,
    ) -> Result<i64, String> {
        let t = now();
        let b = self.db.batch().map_err(db_err)?;
        let id = b.insert_charged(m, charged, t).map_err(db_err)?;
        self.copy_to_operator_room(&b, id, m.kind, t)
            .map_err(db_err)?;
        b.commit().map_err(db_err)?;
        self.notify(BRIDGE);
        Ok(id)
    }

    /// Whether a message of `kind` to the operator is posted to the operator
    /// room: mail and bounces, when the room is configured.
    pub(super) fn posts_to_operator_room(&self, kind: &MsgKind) -> bool {
        let room = self.swarm().and_then(|(_, m)| m.operator_room.as_ref());
        room.is_some() && matches!(kind, MsgKind::Message | MsgKind::Undeliverable)
    }

    fn copy_to_operator_room(
        &self,
        b: &Batch,
        msg_id: i64,
        kind: &MsgKind,
        t: i64,
    ) -> rusqlite::Result<bool> {
        if !self.posts_to_operator_room(kind) {
            return Ok(false);
        }
        let kind = match kind {
            MsgKind::Undeliverable => EventKind::Undeliverable,
            _ => EventKind::Message,
        };
        b.insert_outbox(
            &OutboxEntry {
                msg_id,
                dest: String::new(),
                kind,
                question: None,
                ref_instance: None,
                in_reply_to: None,
                reason: None,
            },
            t,
        )?;
        Ok(true)
    }

    /// `ask` to `NAME@HIVE`: the question is this broker's; its outbox event
    /// makes the mirror there.
    pub(super) fn ask_remote(
        &mut self,
        asker: &str,
        to: &Remote,
        c: Ask,
    ) -> Result<IdReply, String> {
        self.check_reachable(to)?;
        let t = now();
        let expires = c.ttl_seconds.filter(|s| *s > 0).map(|s| t + s as i64);
        let target = Peer::Remote(to.to_string());
        let from = Peer::Agent(asker.to_string());
        let to_name = to.to_string();
        let b = self.db.batch().map_err(db_err)?;
        let qid = b
            .insert_question(asker, &target, &c.question, &c.options, c.multi, t, expires)
            .map_err(db_err)?;
        let msg = new_message(&from, &to_name, &c.question, &MsgKind::QuestionAsked, None);
        let id = b.insert_message(&msg, t).map_err(db_err)?;
        b.insert_outbox(
            &OutboxEntry {
                msg_id: id,
                dest: to.hive.clone(),
                kind: EventKind::QuestionAsked,
                question: Some(qid),
                ref_instance: None,
                in_reply_to: None,
                reason: None,
            },
            t,
        )
        .map_err(db_err)?;
        b.commit().map_err(db_err)?;
        self.notify(BRIDGE);
        self.recompute_due();
        Ok(IdReply { id: qid })
    }

    /// A question another hive asked here (a mirror) was answered (or
    /// cancelled by the operator here): the answer goes back to its asker's
    /// broker, which owns it.
    pub(super) fn answer_remote_asker(
        &mut self,
        q: &Question,
        answer: &str,
        by: &Peer,
    ) -> Result<(), String> {
        let Some((origin, instance, their_id)) = self.db.mirror_origin(q.id).map_err(db_err)?
        else {
            return Err(format!(
                "question #{} from {} has no record of where it came from",
                q.id, q.asker
            ));
        };
        if answer.len() > MAX_REMOTE_BODY {
            return Err(format!(
                "the answer is {} bytes; question #{} comes from hive {origin}, and answers to \
                 another hive are at most {MAX_REMOTE_BODY} bytes (48 KiB)",
                answer.len(),
                q.id
            ));
        }
        let t = now();
        let asker = q.asker.as_str().to_string();
        let b = self.db.batch().map_err(db_err)?;
        if !b.settle_question(q.id, answer, by, t).map_err(db_err)? {
            return Ok(());
        }
        let msg = new_message(by, &asker, answer, &MsgKind::QuestionAnswered, None);
        let id = b.insert_message(&msg, t).map_err(db_err)?;
        b.insert_outbox(
            &OutboxEntry {
                msg_id: id,
                dest: origin,
                kind: EventKind::QuestionAnswered,
                question: Some(their_id),
                ref_instance: Some(instance).filter(|i| !i.is_empty()),
                in_reply_to: None,
                reason: None,
            },
            t,
        )
        .map_err(db_err)?;
        b.commit().map_err(db_err)?;
        self.notify(BRIDGE);
        Ok(())
    }

    /// A question asked to another hive is closed here (withdrawn by its
    /// asker, expired): the mirror there is cancelled with `text`. `notice`
    /// tells the asker, as for any closed question.
    pub(super) fn close_for_remote_target(
        &mut self,
        q: &Question,
        text: &str,
        by: &Peer,
        notice: Option<&NewMessage>,
    ) -> Result<(), String> {
        let Some(target) = q.target.remote() else {
            return Err(format!("question #{} is not asked to another hive", q.id));
        };
        let t = now();
        let to_name = target.to_string();
        let asked_under = self.db.asked_under(q.id).map_err(db_err)?;
        let b = self.db.batch().map_err(db_err)?;
        if !b.settle_question(q.id, text, by, t).map_err(db_err)? {
            return Ok(());
        }
        if let Some(n) = notice {
            b.insert_message(n, t).map_err(db_err)?;
        }
        let msg = new_message(&q.asker, &to_name, text, &MsgKind::QuestionCancelled, None);
        let id = b.insert_message(&msg, t).map_err(db_err)?;
        b.insert_outbox(
            &OutboxEntry {
                msg_id: id,
                dest: target.hive.clone(),
                kind: EventKind::QuestionCancelled,
                question: Some(q.id),
                ref_instance: asked_under.filter(|i| !i.is_empty()),
                in_reply_to: None,
                reason: None,
            },
            t,
        )
        .map_err(db_err)?;
        b.commit().map_err(db_err)?;
        if notice.is_some() {
            self.notify(q.asker.as_str());
        }
        self.notify(BRIDGE);
        Ok(())
    }

    pub(super) fn bridge_hello(&mut self) -> Result<BridgeHelloReply, String> {
        let Some((own, m)) = self.swarm() else {
            return Err("this hive has no matrix section in its fleet file".into());
        };
        let reply = BridgeHelloReply {
            hive_name: own.to_string(),
            instance: self.db.instance().to_string(),
            matrix: m.clone(),
            next_batch: self.db.next_batch().map_err(db_err)?,
        };
        Ok(reply)
    }

    /// A bridge command came in on `conn`: the bridge runs (connecting,
    /// until it reports how its link is).
    pub(super) fn bridge_seen(&mut self, conn: ConnId) {
        self.bridge.conns.insert(conn);
        if self.bridge.state == BridgeState::NotRunning {
            self.bridge.set(BridgeState::Connecting, None);
        }
    }

    pub(super) fn bridge_status(&mut self, c: BridgeStatus) -> Result<Empty, String> {
        self.bridge.set(c.state, c.detail);
        Ok(Empty {})
    }

    /// A connection closed: when it was the bridge's last, the bridge is not
    /// running.
    pub(super) fn bridge_closed(&mut self, conn: ConnId) {
        if self.bridge.conns.remove(&conn) && self.bridge.conns.is_empty() {
            self.bridge.set(BridgeState::NotRunning, None);
        }
    }

    /// The bridge's row of `agents`, on a hive in a swarm.
    pub(super) fn bridge_row(&self) -> Result<Option<BridgeRow>, String> {
        if self.swarm().is_none() {
            return Ok(None);
        }
        let (outbox, failed) = self.db.outbox_counts().map_err(db_err)?;
        Ok(Some(BridgeRow {
            state: self.bridge.state.clone(),
            since: self.bridge.since,
            detail: self.bridge.detail.clone(),
            outbox,
            failed,
        }))
    }

    /// The oldest events of the outbox, in id order, within one answer's
    /// budget; parks while there are none.
    pub(super) fn bridge_next(&mut self, ctx: &Ctx, c: BridgeNext) -> Handled<BridgeNextReply> {
        let rows = self.db.outbox_pending(NEXT_ROWS).map_err(db_err)?;
        if rows.is_empty() && ctx.can_wait && c.wait_seconds.unwrap_or(0) > 0 {
            self.wait_for(BRIDGE, ctx.conn);
            return Ok(Done::Wait);
        }
        let mut events = Vec::new();
        let mut used = 0;
        for r in rows {
            let to = if r.entry.dest.is_empty() {
                "operator".to_string()
            } else {
                r.to.as_str().to_string()
            };
            let ev = Outbound {
                id: r.entry.msg_id,
                instance: r.instance,
                dest: r.entry.dest,
                kind: r.entry.kind,
                from: self.qualified(&r.from),
                to,
                body: r.body,
                in_reply_to: r.entry.in_reply_to,
                question: r.entry.question,
                ref_instance: r.entry.ref_instance,
                options: r.options,
                multi: r.multi,
                reason: r.entry.reason,
            };
            let size = serde_json::to_string(&ev).map_or(0, |s| s.len());
            if !events.is_empty() && used + size > PAGE_BYTES {
                break;
            }
            used += size;
            events.push(ev);
        }
        Ok(Done::Reply(BridgeNextReply { events }))
    }

    pub(super) fn bridge_sent(&mut self, c: BridgeSent) -> Result<Empty, String> {
        let how = Settle::Sent {
            event_id: &c.event_id,
        };
        self.db.settle_outbox(c.id, how, now()).map_err(db_err)?;
        Ok(Empty {})
    }

    /// The homeserver refused an event for good: its sender hears that it was
    /// not delivered (a question asked is closed with that as its answer).
    pub(super) fn bridge_failed(&mut self, c: BridgeFailed) -> Result<Empty, String> {
        let how = Settle::Failed { error: &c.error };
        let Some(row) = self.db.settle_outbox(c.id, how, now()).map_err(db_err)? else {
            return Ok(Empty {});
        };
        log::warn!(
            "bridge: event #{} ({} to {}) was refused for good: {}",
            c.id,
            row.entry.kind.name(),
            if row.entry.dest.is_empty() {
                "the operator room"
            } else {
                row.to.as_str()
            },
            c.error
        );
        if row.entry.dest.is_empty() {
            // The message itself is in the operator's inbox.
            return Ok(Empty {});
        }
        let text = format!(
            "[undeliverable] message #{} to {} was not sent: the homeserver refused it ({})",
            c.id, row.to, c.error
        );
        let qid = row
            .entry
            .question
            .filter(|_| row.entry.kind == EventKind::QuestionAsked);
        if let Some(qid) = qid {
            if let Some((q, true)) = self.db.question(qid).map_err(db_err)? {
                let notice_body = super::questions::answer_notice(&q, &text, &Peer::System);
                let t = now();
                let b = self.db.batch().map_err(db_err)?;
                if b.settle_question(qid, &text, &Peer::System, t)
                    .map_err(db_err)?
                {
                    let n = new_message(
                        &Peer::System,
                        q.asker.as_str(),
                        &notice_body,
                        &MsgKind::QuestionAnswered,
                        None,
                    );
                    b.insert_message(&n, t).map_err(db_err)?;
                }
                b.commit().map_err(db_err)?;
                self.notify(q.asker.as_str());
                self.recompute_due();
            }
            return Ok(Empty {});
        }
        if matches!(row.from, Peer::Agent(_) | Peer::Operator) {
            let to = row.from.as_str().to_string();
            let n = new_message(
                &Peer::System,
                &to,
                &text,
                &MsgKind::Undeliverable,
                Some(c.id),
            );
            self.store(&n, None)?;
            self.notify(&to);
        }
        Ok(Empty {})
    }

    /// A batch of room events: each delivered once, with the sync token, in
    /// one transaction.
    pub(super) fn bridge_deliver(
        &mut self,
        c: BridgeDeliver,
    ) -> Result<BridgeDeliverReply, String> {
        let Some((own, _)) = self.swarm() else {
            return Err("this hive has no matrix section in its fleet file".into());
        };
        let own = own.to_string();
        let t = now();
        let mut out = BridgeDeliverReply::default();
        let mut woken = BTreeSet::new();
        {
            let b = self.db.batch().map_err(db_err)?;
            for e in &c.events {
                // Events are known by (origin, instance, id): an instance is
                // one start of the sender's broker, and an event keeps the
                // one it was first committed under (`docs/swarm.md`).
                let instance = e.instance.as_deref().unwrap_or_default();
                if !e.origin.is_empty() {
                    let seen = b
                        .note_peer_instance(&e.origin, instance, KEEP_PEER_INSTANCES)
                        .map_err(db_err)?;
                    if seen.new {
                        log::info!(
                            "bridge: hive {} sends under instance {instance} (a start of its broker)",
                            e.origin
                        );
                    }
                    for old in seen.forgotten {
                        log::info!(
                            "bridge: hive {}'s instance {old} is older than its last \
                             {KEEP_PEER_INSTANCES}: the events seen from it are forgotten",
                            e.origin
                        );
                    }
                }
                if b.seen_inbound(&e.origin, instance, &e.id).map_err(db_err)? {
                    out.duplicates += 1;
                    continue;
                }
                if e.sent_at > 0 && e.sent_at < t - MAX_EVENT_AGE_SECS {
                    log::warn!(
                        "bridge: event {} of {} is older than {} days, past the dedupe \
                         horizon: skipped",
                        e.id,
                        origin_name(e),
                        MAX_EVENT_AGE_SECS / 86400
                    );
                    out.ignored += 1;
                    continue;
                }
                let (fate, local) = self
                    .inbound_one(&b, &own, e, t, &mut woken)
                    .map_err(db_err)?;
                match fate {
                    Fate::Delivered => out.delivered += 1,
                    Fate::Bounced => out.bounced += 1,
                    Fate::Ignored(why) => {
                        log::info!(
                            "bridge: {} event {} of {} ignored: {why}",
                            e.kind.name(),
                            e.id,
                            origin_name(e)
                        );
                        out.ignored += 1;
                    }
                }
                b.record_inbound(&e.origin, instance, &e.id, local, t)
                    .map_err(db_err)?;
            }
            if let Some(token) = &c.next_batch {
                b.set_next_batch(token).map_err(db_err)?;
            }
            b.prune_inbound(t - DEDUPE_KEEP_SECS).map_err(db_err)?;
            b.commit().map_err(db_err)?;
        }
        for r in woken {
            self.notify(&r);
        }
        if out.delivered + out.bounced > 0 {
            self.recompute_due();
        }
        Ok(out)
    }

    /// One room event not seen before, inside the batch: its fate and the
    /// local message it became.
    fn inbound_one(
        &self,
        b: &Batch,
        own: &str,
        e: &Inbound,
        t: i64,
        woken: &mut BTreeSet<String>,
    ) -> rusqlite::Result<(Fate, Option<i64>)> {
        if e.origin.is_empty() {
            return self.operator_on_matrix(b, own, e, t, woken);
        }
        let from = Peer::Remote(Remote::new(&e.from, &e.origin).to_string());
        let here = |name: &str| name == "operator" || self.cfg.agent(name).is_some();
        match e.kind {
            EventKind::Message => {
                if !here(&e.to) {
                    return self.bounce(b, own, e, t, woken);
                }
                let irt = self.their_reply(b, e)?;
                let msg = new_message(&from, &e.to, &e.body, &MsgKind::Message, irt);
                let id = b.insert_message(&msg, t)?;
                if e.to == "operator" && self.copy_to_operator_room(b, id, &MsgKind::Message, t)? {
                    woken.insert(BRIDGE.to_string());
                }
                woken.insert(e.to.clone());
                Ok((Fate::Delivered, Some(id)))
            }
            EventKind::QuestionAsked => {
                let Some(their_id) = e.question else {
                    return Ok((Fate::Ignored("a question without its id".into()), None));
                };
                if !here(&e.to) {
                    return self.bounce(b, own, e, t, woken);
                }
                let instance = e.instance.as_deref().unwrap_or_default();
                if b.mirror_of(&e.origin, Some(instance), their_id)?.is_some() {
                    return Ok((
                        Fate::Ignored(format!("question {their_id} has a mirror here already")),
                        None,
                    ));
                }
                let target = Peer::address(&e.to);
                let qid = b.insert_question(
                    from.as_str(),
                    &target,
                    &e.body,
                    &e.options,
                    e.multi,
                    t,
                    None,
                )?;
                b.insert_mirror(qid, &e.origin, instance, their_id)?;
                let q = Question {
                    id: qid,
                    asker: from.clone(),
                    target,
                    question: e.body.clone(),
                    options: e.options.clone(),
                    multi: e.multi,
                    asked_at: t,
                    expires_at: None,
                };
                let mut local = None;
                if e.to != "operator" {
                    let body = super::questions::question_notice(&q);
                    let n = new_message(&Peer::System, &e.to, &body, &MsgKind::QuestionAsked, None);
                    local = Some(b.insert_message(&n, t)?);
                }
                woken.insert(e.to.clone());
                Ok((Fate::Delivered, local))
            }
            EventKind::QuestionAnswered => {
                let Some(qid) = e.question else {
                    return Ok((Fate::Ignored("an answer without its question".into()), None));
                };
                let q = match b.question(qid)? {
                    Some((q, open)) if q.target == from => (q, open),
                    _ => {
                        return Ok((
                            Fate::Ignored(format!("{from} was asked no question #{qid}")),
                            None,
                        ))
                    }
                };
                let (q, open) = q;
                if !self.names_our_question(b, qid, e)? {
                    return Ok((
                        Fate::Ignored(format!(
                            "question #{qid} here is not the one answered (asked under another \
                             instance: a restored broker.db)"
                        )),
                        None,
                    ));
                }
                if !open || !b.settle_question(qid, &e.body, &from, t)? {
                    return Ok((
                        Fate::Ignored(format!("question #{qid} is closed already")),
                        None,
                    ));
                }
                answered(b, &q, &e.body, &from, t, woken)
            }
            EventKind::QuestionCancelled => {
                let asked_under = e.ref_instance.as_deref();
                let mirror = match e.question {
                    Some(their_id) => b.mirror_of(&e.origin, asked_under, their_id)?,
                    None => None,
                };
                let Some(qid) = mirror else {
                    return Ok((
                        Fate::Ignored("no mirror of that question here".into()),
                        None,
                    ));
                };
                let Some((q, true)) = b.question(qid)? else {
                    return Ok((
                        Fate::Ignored(format!("question #{qid} is closed already")),
                        None,
                    ));
                };
                if !b.settle_question(qid, &e.body, &from, t)? {
                    return Ok((
                        Fate::Ignored(format!("question #{qid} is closed already")),
                        None,
                    ));
                }
                let mut local = None;
                if let Some(target) = q.target.agent() {
                    let body = format!("[question #{qid} from {from}] withdrawn: {}", e.body);
                    let n = new_message(
                        &Peer::System,
                        target,
                        &body,
                        &MsgKind::QuestionCancelled,
                        None,
                    );
                    local = Some(b.insert_message(&n, t)?);
                }
                woken.insert(q.target.as_str().to_string());
                Ok((Fate::Delivered, local))
            }
            EventKind::Undeliverable => {
                // The notice is built here from the event's ids and its
                // reason: the peer's text is shown only quoted, as `other`.
                let reason = undeliverable_reason(e);
                if let Some(qid) = e.question {
                    let Some((q, true)) = b.question(qid)? else {
                        return Ok((
                            Fate::Ignored(format!("question #{qid} is closed already")),
                            None,
                        ));
                    };
                    let asked_there = q.target.remote().is_some_and(|r| r.hive == e.origin)
                        && self.names_our_question(b, qid, e)?;
                    let text = format!(
                        "undeliverable: your question #{qid} to {}: {reason}",
                        q.target
                    );
                    if !asked_there || !b.settle_question(qid, &text, &Peer::System, t)? {
                        return Ok((
                            Fate::Ignored(format!("question #{qid} was not asked there")),
                            None,
                        ));
                    }
                    return answered(b, &q, &text, &Peer::System, t, woken);
                }
                if !here(&e.to) {
                    // Never a bounce of a bounce.
                    return Ok((Fate::Ignored(format!("no agent {} here", e.to)), None));
                }
                let irt = self.their_reply(b, e)?;
                let what = match irt {
                    Some(id) => match b.recipient_of(id)? {
                        Some(to) => format!("your message #{id} to {to}"),
                        None => format!("your message #{id} to hive {}", e.origin),
                    },
                    None => format!("a message of yours to hive {}", e.origin),
                };
                let text = format!("undeliverable: {what}: {reason}");
                let n = new_message(&Peer::System, &e.to, &text, &MsgKind::Undeliverable, irt);
                let id = b.insert_message(&n, t)?;
                if e.to == "operator"
                    && self.copy_to_operator_room(b, id, &MsgKind::Undeliverable, t)?
                {
                    woken.insert(BRIDGE.to_string());
                }
                woken.insert(e.to.clone());
                Ok((Fate::Delivered, Some(id)))
            }
        }
    }

    /// Whether this hive's question `qid` is the one an answer or a bounce
    /// `e` names: asked under the instance it says (a restored `broker.db`
    /// asks new questions under the old ids). A peer of an older release
    /// names none, and is taken at its word.
    fn names_our_question(&self, b: &Batch, qid: i64, e: &Inbound) -> rusqlite::Result<bool> {
        let Some(named) = &e.ref_instance else {
            return Ok(true);
        };
        Ok(b.asked_under(qid)?.as_deref() == Some(named.as_str()))
    }

    /// The `in_reply_to` of an event, kept only when it names a message this
    /// hive sent to the event's hive (under the instance it names: a
    /// restored `broker.db` sends new messages under the old ids).
    fn their_reply(&self, b: &Batch, e: &Inbound) -> rusqlite::Result<Option<i64>> {
        match e.in_reply_to {
            Some(id) if b.sent_to(id, &e.origin, e.ref_instance.as_deref())? => Ok(Some(id)),
            _ => Ok(None),
        }
    }

    /// Mail or a question for no agent of this hive goes back to its sender
    /// as `[undeliverable] no agent b on hive two`.
    fn bounce(
        &self,
        b: &Batch,
        own: &str,
        e: &Inbound,
        t: i64,
        woken: &mut BTreeSet<String>,
    ) -> rusqlite::Result<(Fate, Option<i64>)> {
        let sender = Remote::new(&e.from, &e.origin).to_string();
        let text = format!("[undeliverable] no agent {} on hive {own}", e.to);
        let msg = new_message(&Peer::System, &sender, &text, &MsgKind::Undeliverable, None);
        let id = b.insert_message(&msg, t)?;
        b.insert_outbox(
            &OutboxEntry {
                msg_id: id,
                dest: e.origin.clone(),
                kind: EventKind::Undeliverable,
                question: e.question.filter(|_| e.kind == EventKind::QuestionAsked),
                ref_instance: e.instance.clone(),
                in_reply_to: e.id.parse().ok(),
                reason: Some(UndeliverableReason::UnknownAgent),
            },
            t,
        )?;
        woken.insert(BRIDGE.to_string());
        Ok((Fate::Bounced, Some(id)))
    }

    /// A message a listed operator wrote in the operator room: to the agent
    /// it names (`@agent:`) or whose post it replies to, as from the
    /// operator.
    fn operator_on_matrix(
        &self,
        b: &Batch,
        own: &str,
        e: &Inbound,
        t: i64,
        woken: &mut BTreeSet<String>,
    ) -> rusqlite::Result<(Fate, Option<i64>)> {
        if e.kind != EventKind::Message {
            return Ok((
                Fate::Ignored("operators on Matrix only send messages".into()),
                None,
            ));
        }
        let to = if !e.to.is_empty() {
            Some(e.to.clone())
        } else {
            match &e.reply_to_event {
                Some(ev) => b
                    .operator_post_sender(ev)?
                    .and_then(|p| p.agent().map(str::to_string)),
                None => None,
            }
        };
        let Some(to) = to else {
            return Ok((
                Fate::Ignored(format!(
                    "{} wrote in the operator room without @agent: or a reply to an agent",
                    e.from
                )),
                None,
            ));
        };
        if self.cfg.agent(&to).is_none() {
            let text = format!(
                "[undeliverable] {} wrote on Matrix to {to}, which is no agent of hive {own}",
                e.from
            );
            let n = new_message(
                &Peer::System,
                "operator",
                &text,
                &MsgKind::Undeliverable,
                None,
            );
            let id = b.insert_message(&n, t)?;
            if self.copy_to_operator_room(b, id, &MsgKind::Undeliverable, t)? {
                woken.insert(BRIDGE.to_string());
            }
            woken.insert("operator".into());
            return Ok((Fate::Bounced, Some(id)));
        }
        let n = new_message(&Peer::Operator, &to, &e.body, &MsgKind::Message, None);
        let id = b.insert_message(&n, t)?;
        woken.insert(to);
        Ok((Fate::Delivered, Some(id)))
    }
}

/// Where an event came from, for logs.
/// Tells the asker of `q` that `by` answered it with `answer` (a local
/// notice in its inbox), and wakes it.
fn answered(
    b: &Batch,
    q: &Question,
    answer: &str,
    by: &Peer,
    t: i64,
    woken: &mut BTreeSet<String>,
) -> rusqlite::Result<(Fate, Option<i64>)> {
    let body = super::questions::answer_notice(q, answer, by);
    let n = new_message(
        &Peer::System,
        q.asker.as_str(),
        &body,
        &MsgKind::QuestionAnswered,
        None,
    );
    let id = b.insert_message(&n, t)?;
    woken.insert(q.asker.as_str().to_string());
    Ok((Fate::Delivered, Some(id)))
}

/// Longest part of a peer's own words an `undeliverable` notice quotes, in
/// characters.
const PEER_WORDS_CHARS: usize = 200;

/// The reason of a peer's `undeliverable`, as the local notice reads it:
/// one of the closed set, else `other` with the peer's words quoted (control
/// and format characters escaped, quotes too) and cut.
fn undeliverable_reason(e: &Inbound) -> String {
    match e.reason {
        Some(r) => r.words().to_string(),
        None => format!(
            "other: {:?}",
            crate::proto::text::preview(&e.body, PEER_WORDS_CHARS)
        ),
    }
}

fn origin_name(e: &Inbound) -> String {
    if e.origin.is_empty() {
        format!("{} in the operator room", e.from)
    } else {
        format!("hive {}", e.origin)
    }
}
