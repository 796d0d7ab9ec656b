//! Delivery and consumption: storing a message and waking whoever waits for
//! its recipient (`deliver`, `wake`, `send`, `send_to_parent`), the harness's
//! pop (`recv_next`, inflight, `ack_turn`, `requeue_inflight`, `status` and
//! its watch), the MCP tool's drain (`recv`, rows held per connection until
//! `recv_ack`, given back when the connection closes) and the operator's
//! at-least-once inbox. Transient wakes live here only, in memory (their ids
//! are negative).
//!
//! Attempts and dead letters: every hand-out of a message by `recv_next`
//! counts one attempt (also a redelivery after the harness stopped mid-turn);
//! `requeue_inflight` says whether the failure counted (a pause gives the
//! hand-out back) and where the message goes (a failure of its own puts it
//! behind the mail of other senders). The harness decides when to give up
//! (`dead_letter`): the message is kept `failed` and the recipient's parent
//! and its sender are told once; the operator lists them (`failed`) and puts
//! one back (`retry`). The harness's pause (`report_state`) is kept here while
//! it is connected, for `agents`.
//!
//! What an agent causes to be stored is charged to it (`deliver_charged`)
//! and refused over its limits (`quotas.rs`).
//!
//! A message `recv_next` hands out takes one of the hive's claude slots
//! (`slots.rs`), given back when its turn is acked, requeued or
//! dead-lettered, or its harness disconnects.

use super::limits;
use super::{db_err, ConnId, Ctx, Done, Handled, Held, Hub, Identity};
use crate::broker::db::NewMessage;
use crate::proto::access::Via;
use crate::proto::cmd::{
    self, DeadLetter, DeadLetterReply, Failed, FailedReply, Inbox, InboxAck, Recv, RecvAck,
    RecvNext, RecvNextReply, ReportState, RequeueInflight, Retry, RetryReply, Seen, Status,
    StatusReply, Wake,
};
use crate::proto::ident::{Peer, PAGE_SENDER, PARENT};
use crate::proto::limits::RECV_MAX;
use crate::proto::text::{excerpt, preview};
use crate::proto::{
    now, AckedReply, Attempt, Empty, Message, MessagesReply, MsgKind, MsgState, Place, SentReply,
};
use std::collections::VecDeque;

/// Most rows one `inbox` answer looks at.
const INBOX_ROWS: u32 = 1000;

impl Hub<'_> {
    /// Stores a message and wakes whoever waits for the recipient.
    pub(super) fn deliver(
        &mut self,
        from: &Peer,
        to: &str,
        body: &str,
        kind: MsgKind,
        in_reply_to: Option<i64>,
    ) -> Result<SentReply, String> {
        self.deliver_charged(None, from, to, body, kind, in_reply_to)
    }

    /// [`Hub::deliver`], the message charged to agent `charged`
    /// (`quotas.rs`): refused when it would take that agent past a limit.
    pub(super) fn deliver_charged(
        &mut self,
        charged: Option<&str>,
        from: &Peer,
        to: &str,
        body: &str,
        kind: MsgKind,
        in_reply_to: Option<i64>,
    ) -> Result<SentReply, String> {
        let msg = NewMessage {
            from,
            to,
            body,
            kind: &kind,
            in_reply_to,
            receipt: false,
            traceparent: None,
        };
        self.deliver_row(charged, &msg)
    }

    /// [`Hub::deliver_charged`] of a row built whole (`send`'s, which
    /// may ask for a receipt).
    fn deliver_row(
        &mut self,
        charged: Option<&str>,
        msg: &NewMessage,
    ) -> Result<SentReply, String> {
        if let Some(a) = charged {
            self.may_store(a, msg.body.len())?;
        }
        let id = self.store(msg, charged)?;
        if let Some(a) = charged {
            self.stored(a, msg.body.len());
        }
        self.notify(msg.to);
        Ok(SentReply {
            id: Some(id),
            to: Peer::sender(msg.to),
        })
    }

    /// A system event for `to`'s inbox.
    pub(super) fn tell(
        &mut self,
        to: &str,
        kind: MsgKind,
        body: &str,
    ) -> Result<SentReply, String> {
        self.deliver(&Peer::System, to, body, kind, None)
    }

    pub(super) fn wake(&mut self, ctx: &Ctx, c: Wake) -> Result<SentReply, String> {
        let who = ctx.who;
        if c.from == PAGE_SENDER {
            self.check_page(ctx)?;
        }
        let target = match (who, c.to) {
            (Identity::Agent(a), None) => a.clone(),
            (Identity::Agent(a), Some(t)) if &t == a => t,
            (Identity::Agent(a), Some(t)) => {
                return Err(format!(
                    "wake on the socket of {a} can only wake {a}, not {}; use send to message another agent",
                    excerpt(&t)
                ))
            }
            (Identity::Operator, Some(t)) => {
                self.check_agent(&t)?;
                t
            }
            (Identity::Operator, None) => {
                return Err("wake on the host socket needs \"to\": the agent to wake".into())
            }
            (Identity::Bridge, _) => return Err("the bridge wakes no agent".into()),
        };
        let from = if c.from == PAGE_SENDER {
            Peer::Page
        } else {
            Peer::External(c.from)
        };
        if !c.transient {
            // A wake on the agent's socket is its own, but for its page's
            // (the harness's, checked above).
            let charged = match who {
                Identity::Agent(a) if from != Peer::Page => Some(a.as_str()),
                _ => None,
            };
            // Issue 43: the run that handles it links to `traceparent`,
            // stored by the row's own insert.
            let msg = NewMessage {
                from: &from,
                to: &target,
                body: &c.body,
                kind: &MsgKind::Message,
                in_reply_to: None,
                receipt: false,
                traceparent: c.traceparent.as_deref(),
            };
            return self.deliver_row(charged, &msg);
        }
        let msg = Message {
            id: self.next_transient_id,
            from,
            to: Peer::Agent(target.clone()),
            body: c.body,
            kind: MsgKind::Message,
            in_reply_to: None,
            sent_at: now(),
            transient: true,
        };
        self.next_transient_id -= 1;
        // Issue 43: the run that handles it links to `traceparent` too.
        if let Some(tp) = c.traceparent {
            self.transient_traces.insert(msg.id, tp);
        }
        self.transient
            .entry(target.clone())
            .or_default()
            .push_back(msg);
        self.notify(&target);
        Ok(SentReply {
            id: None,
            to: Peer::Agent(target),
        })
    }

    /// A `wake` from the agent's page (`web-ui`) is taken only from the
    /// process of the agent's harness, which runs the page: the connection's
    /// peer must be the process of one of the agent's harness connections
    /// (those that poll `recv_next` or `status`, or reported its start or
    /// pause). A script on the socket, `hive wake` or the host socket gets a
    /// refusal. Where the harness has a credential (isolated `hive up`), only
    /// its credential's connections pass.
    fn check_page(&self, ctx: &Ctx) -> Result<(), String> {
        if self.harness_sent(ctx) {
            return Ok(());
        }
        Err(format!(
            "from {PAGE_SENDER:?} is the sender of the agent's own page (its /api/send) and is \
             taken only from its harness; choose another name"
        ))
    }

    /// The request came from the process of the agent's harness: a
    /// connection its credential made, or where it has none (`Via::Shared`),
    /// one whose peer is the process of one of its harness connections (see
    /// [`Hub::check_page`]; a process that polls as the harness passes too,
    /// as nothing else separates the two there).
    fn harness_sent(&self, ctx: &Ctx) -> bool {
        match ctx.via {
            Via::Harness => return true,
            Via::Shared => {}
            Via::Socket | Via::BashDaemon => return false,
        }
        let Identity::Agent(agent) = ctx.who else {
            return false;
        };
        let Some(pid) = self.peers.get(&ctx.conn) else {
            return false;
        };
        self.harness_conns
            .get(agent)
            .is_some_and(|conns| conns.iter().any(|c| self.peers.get(c) == Some(pid)))
    }

    pub(super) fn send(&mut self, who: &Identity, c: cmd::Send) -> Result<SentReply, String> {
        // The swarm: `NAME@HIVE` on another hive goes through the outbox
        // (`bridge.rs`); `NAME@` this hive is plain `NAME`.
        let to_text = self.cfg.own_name(&c.to).unwrap_or(&c.to).to_string();
        if let Some(remote) = Peer::address(&to_text).remote() {
            return self.send_remote(who, &remote, &c.body, c.in_reply_to);
        }
        let to = match (who, Peer::address(&to_text)) {
            (Identity::Operator, Peer::Parent) => return Err("the operator has no parent".into()),
            (Identity::Operator, Peer::Operator) => {
                return Err("the operator cannot send to the operator".into())
            }
            (Identity::Operator, to) => {
                self.check_agent(to.as_str())?;
                to
            }
            (Identity::Agent(a), Peer::Parent) => Peer::address(&self.cfg.parent_of(a)),
            (Identity::Agent(_), to) => to,
            (Identity::Bridge, _) => return Err("the bridge sends no mail".into()),
        };
        let (from, charged) = match who {
            Identity::Operator => (Peer::Operator, None),
            Identity::Bridge => return Err("the bridge sends no mail".into()),
            Identity::Agent(a) => {
                if to.as_str() == a {
                    return Err(
                        "an agent cannot send to itself; use remind or request_next_turn".into(),
                    );
                }
                self.cfg.may_send(a, to.as_str())?;
                (Peer::Agent(a.clone()), Some(a.as_str()))
            }
        };
        debug_assert_ne!(to.as_str(), PARENT);
        let msg = NewMessage {
            from: &from,
            to: to.as_str(),
            body: &c.body,
            kind: &MsgKind::Message,
            in_reply_to: c.in_reply_to,
            // Issue 43: a receipt once it is acked (`receipts.rs`), asked
            // for by the row's own insert, which also stores the
            // `traceparent` the recipient's run links to.
            receipt: c.receipt,
            traceparent: c.traceparent.as_deref(),
        };
        self.deliver_row(charged, &msg)
    }

    /// `send_to_parent`: the harness's notices (not charged), or the same
    /// from any other process on the agent's socket (charged to the agent).
    pub(super) fn send_to_parent(
        &mut self,
        ctx: &Ctx,
        agent: &str,
        c: cmd::SendToParent,
    ) -> Result<SentReply, String> {
        let parent = self.cfg.parent_of(agent);
        let charged = (!self.harness_sent(ctx)).then_some(agent);
        self.deliver_charged(
            charged,
            &Peer::Agent(agent.into()),
            &parent,
            &c.body,
            MsgKind::Message,
            None,
        )
    }

    /// Rows queued for `agent`, stored and transient.
    pub(super) fn unread(&self, agent: &str) -> Result<u64, String> {
        let transient = self.transient.get(agent).map_or(0, |q| q.len() as u64);
        Ok(self.db.count_queued(agent).map_err(db_err)? + transient)
    }

    /// Stores a message for this hive, charged to agent `charged`. Mail to
    /// the operator that the swarm's operator room mirrors goes through the
    /// bridge's hook (`bridge.rs`), which adds its copy in the same
    /// transaction.
    pub(super) fn store(&mut self, m: &NewMessage, charged: Option<&str>) -> Result<i64, String> {
        if m.to == "operator" && self.posts_to_operator_room(m.kind) {
            return self.store_mirrored(m, charged);
        }
        self.db.insert_charged(m, charged, now()).map_err(db_err)
    }

    pub(super) fn inflight_id(&self, agent: &str) -> Result<Option<i64>, String> {
        Ok(match self.transient_inflight.get(agent) {
            Some(m) => Some(m.id),
            None => self.db.inflight(agent).map_err(db_err)?.map(|m| m.id),
        })
    }

    /// `recv_next`'s answer when nothing is handed out now (a pause, or no
    /// claude slot free) and the caller cannot wait.
    fn nothing_handed_out(
        &mut self,
        agent: &str,
        paused: Option<crate::proto::reply::Paused>,
    ) -> Handled<RecvNextReply> {
        Ok(Done::Reply(RecvNextReply {
            message: None,
            redelivered: false,
            unread: Some(self.unread(agent)?),
            attempts: 0,
            status_text: None,
            status_set_at: None,
            paused,
            turn_usd: self.cfg.agent(agent).and_then(|e| e.turn_usd),
            traceparent: None,
        }))
    }

    pub(super) fn recv_next(
        &mut self,
        ctx: &Ctx,
        agent: &str,
        c: RecvNext,
    ) -> Handled<RecvNextReply> {
        match self.harness_conns.get_mut(agent) {
            Some(conns) => {
                conns.insert(ctx.conn);
            }
            None => {
                self.harness_conns
                    .insert(agent.to_string(), [ctx.conn].into());
            }
        }
        // issue 16: while the broker pauses the agent nothing is handed out
        // (so nothing counts as an attempt); the pause is answered once per
        // connection, and a later call parks until the pause ends (the hub's
        // timer, a raised budget), which is answered once too.
        if let Some(p) = self.broker_pause(agent) {
            // A paused agent waits for no claude slot (`slots.rs`).
            self.slot_left(agent);
            let told = self.pause_told(ctx.conn, &p);
            if told && ctx.can_wait && c.wait_seconds.unwrap_or(0) > 0 {
                self.wait_for(agent, ctx.conn);
                return Ok(Done::Wait);
            }
            return self.nothing_handed_out(agent, Some(p));
        }
        // issue 42: a message handed out runs a claude, which takes one of
        // the hive's `max_claude` slots; without one the call waits in line.
        if !self.slot_for_turn(agent)? {
            if ctx.can_wait && c.wait_seconds.unwrap_or(0) > 0 {
                self.wait_for(agent, ctx.conn);
                return Ok(Done::Wait);
            }
            return self.nothing_handed_out(agent, None);
        }
        let (popped, unread) = self.pop_next(agent)?;
        if popped.is_none() {
            self.slot_unused(agent);
        }
        let status = match &c.seen {
            Some(_) => Some(self.db.stats(agent).map_err(db_err)?),
            None => None,
        };
        let changed = match (&c.seen, &status) {
            (Some(seen), Some(s)) => seen.unread != unread || seen.status_text != s.status_text,
            _ => false,
        };
        // A connection that was answered a pause hears its end at once, also
        // with nothing to hand out: its harness may have a continue waiting.
        let pause_ended = self.pause_end_untold(ctx.conn);
        if popped.is_none()
            && !changed
            && !pause_ended
            && ctx.can_wait
            && c.wait_seconds.unwrap_or(0) > 0
        {
            self.wait_for(agent, ctx.conn);
            return Ok(Done::Wait);
        }
        let with_message = popped.is_some();
        // Issue 43: the traceparent the handed-out row carries.
        let traceparent = match &popped {
            Some(p) if p.message.id > 0 => self.db.traceparent(p.message.id).map_err(db_err)?,
            Some(p) => self.transient_traces.get(&p.message.id).cloned(),
            None => None,
        };
        let (message, redelivered, attempts) = match popped {
            Some(p) => {
                // Issue 43: the receipts waiting ride with the turn's message.
                let mut m = p.message;
                self.ride_along(agent, &mut m);
                (Some(limits::fit_message(m)), p.redelivered, p.attempts)
            }
            None => (None, false, 0),
        };
        Ok(Done::Reply(RecvNextReply {
            message,
            redelivered,
            // The unread count after the pop, so the harness needs no `status`.
            unread: (with_message || c.seen.is_some()).then_some(unread),
            attempts,
            status_text: status.as_ref().map(|s| s.status_text.clone()),
            status_set_at: status.and_then(|s| s.status_set_at),
            paused: None,
            turn_usd: self.cfg.agent(agent).and_then(|e| e.turn_usd),
            traceparent,
        }))
    }

    /// The inflight row again, or the next row made inflight; either way one
    /// more attempt. Also the unread count after it. Transient wakes take
    /// their turn between the inflight row and the queued ones.
    fn pop_next(&mut self, agent: &str) -> Result<(Option<Popped>, u64), String> {
        let transient = |hub: &Hub| hub.transient.get(agent).map_or(0, |q| q.len() as u64);
        if let Some(m) = self.transient_inflight.get(agent).cloned() {
            let attempts = self.transient_attempt(m.id);
            return Ok((Some(Popped::new(m, true, attempts)), self.unread(agent)?));
        }
        let queued_too = transient(self) == 0;
        let (taken, queued) = self.db.take_next(agent, queued_too).map_err(db_err)?;
        if let Some(t) = taken {
            let popped = Popped::new(t.message, t.was_inflight, t.attempts);
            return Ok((Some(popped), queued + transient(self)));
        }
        if let Some(m) = self.transient.get_mut(agent).and_then(VecDeque::pop_front) {
            self.transient_inflight.insert(agent.to_string(), m.clone());
            let attempts = self.transient_attempt(m.id);
            return Ok((
                Some(Popped::new(m, false, attempts)),
                queued + transient(self),
            ));
        }
        Ok((None, queued))
    }

    /// One more attempt of transient wake `id`; the count so far.
    fn transient_attempt(&mut self, id: i64) -> u32 {
        let n = self.transient_attempts.entry(id).or_default();
        *n = n.saturating_add(1);
        *n
    }

    pub(super) fn recv(&mut self, ctx: &Ctx, agent: &str, c: Recv) -> Handled<MessagesReply> {
        let max = c.max.unwrap_or(1).clamp(1, RECV_MAX as u64) as u32;
        let page = self.drain(agent, ctx.conn, max)?;
        if page.messages.is_empty() && ctx.can_wait && c.wait_seconds.unwrap_or(0) > 0 {
            self.wait_for(agent, ctx.conn);
            return Ok(Done::Wait);
        }
        Ok(Done::Reply(page))
    }

    /// Hands out up to `max` rows, oldest first, within one answer's byte
    /// budget, and holds them for `conn` until `recv_ack`.
    fn drain(&mut self, agent: &str, conn: ConnId, max: u32) -> Result<MessagesReply, String> {
        let mut out = Vec::new();
        let mut held = Vec::new();
        let mut used = 0;
        let mut more = false;
        if let Some(q) = self.transient.get_mut(agent) {
            while out.len() < max as usize {
                let Some(m) = q.front() else { break };
                let m = limits::fit_message(m.clone());
                if !limits::take_into_page(&m, &mut used, out.len()) {
                    more = true;
                    break;
                }
                if let Some(raw) = q.pop_front() {
                    // Drained by a tool, it is no turn's attempt any more.
                    self.transient_attempts.remove(&raw.id);
                    held.push(Held::Transient(raw));
                }
                out.push(m);
            }
        }
        let room = max - out.len() as u32;
        if room > 0 && !more {
            let rows = self.db.queued(agent, room).map_err(db_err)?;
            let mut ids = Vec::new();
            for m in rows {
                let m = limits::fit_message(m);
                if !limits::take_into_page(&m, &mut used, out.len()) {
                    more = true;
                    break;
                }
                ids.push(m.id);
                held.push(Held::Stored(m.id));
                out.push(m);
            }
            let t = now();
            self.db
                .transition_many(&ids, agent, &MsgState::Queued, &MsgState::Held, t)
                .map_err(db_err)?;
            // When and how, for `message_state` (`receipts.rs`).
            self.db.mark_handed(&ids, "recv", t).map_err(db_err)?;
        }
        if !held.is_empty() {
            self.held
                .entry(conn)
                .or_insert_with(|| (agent.to_string(), Vec::new()))
                .1
                .extend(held);
        }
        Ok(MessagesReply {
            messages: out,
            more,
        })
    }

    pub(super) fn recv_ack(
        &mut self,
        conn: ConnId,
        agent: &str,
        c: RecvAck,
    ) -> Result<AckedReply, String> {
        let Some((_, rows)) = self.held.get_mut(&conn) else {
            return Err("no rows are held by this connection; recv_ack confirms rows handed out by recv on the same connection".into());
        };
        let mut stored = Vec::new();
        let mut acked = 0usize;
        rows.retain(|h| {
            let id = match h {
                Held::Stored(id) => *id,
                Held::Transient(m) => m.id,
            };
            if !c.ids.contains(&id) {
                return true;
            }
            acked += 1;
            match h {
                Held::Stored(id) => stored.push(*id),
                Held::Transient(m) => {
                    self.transient_traces.remove(&m.id);
                }
            }
            false
        });
        // With the receipts of those that asked for one (`receipts.rs`).
        self.ack_rows(&stored, agent, &MsgState::Held, None, false)?;
        if acked < c.ids.len() {
            return Err(format!(
                "only {acked} of {} ids were held by this connection",
                c.ids.len()
            ));
        }
        Ok(AckedReply {
            acked: acked as u64,
        })
    }

    /// Puts rows held by a closed connection back into the inbox, in order.
    pub(super) fn release(&mut self, conn: ConnId) {
        self.pause_conn_closed(conn);
        let mut gone = Vec::new();
        for (agent, set) in self.harness_conns.iter_mut() {
            // The harness is gone: so is what it reported, and its claude
            // slot (`slots.rs`).
            if set.remove(&conn) && set.is_empty() {
                self.paused.remove(agent);
                gone.push(agent.clone());
            }
        }
        for agent in gone {
            self.slot_left(&agent);
        }
        let Some((agent, rows)) = self.held.remove(&conn) else {
            return;
        };
        let stored: Vec<i64> = rows
            .iter()
            .filter_map(|h| match h {
                Held::Stored(id) => Some(*id),
                Held::Transient(_) => None,
            })
            .collect();
        if let Err(e) =
            self.db
                .transition_many(&stored, &agent, &MsgState::Held, &MsgState::Queued, now())
        {
            log::error!("cannot return held rows of {agent}: {e}");
        }
        let queue = self.transient.entry(agent.clone()).or_default();
        for h in rows.into_iter().rev() {
            if let Held::Transient(m) = h {
                queue.push_front(m);
            }
        }
        log::debug!("connection {conn} closed; rows held for {agent} returned to the inbox");
        self.notify(&agent);
    }

    /// `status`; with `seen` also the status line and the operator's resume
    /// mark, and with a wait a call whose `seen` is current parks until the
    /// unread count or the status line changes or the operator resumes the
    /// agent (the harness's watch: its connection counts as the harness's,
    /// so an agent whose turn loop is paused still runs).
    pub(super) fn status(&mut self, ctx: &Ctx, agent: &str, c: Status) -> Handled<StatusReply> {
        let unread = self.unread(agent)?;
        let inflight = self.inflight_id(agent)?;
        let Some(seen) = c.seen else {
            return Ok(Done::Reply(StatusReply {
                unread,
                inflight,
                status_text: None,
                status_set_at: None,
                resumed: None,
            }));
        };
        // The harness's watch: its connection counts as the harness's, but
        // only on a connection that may speak for the harness.
        if matches!(ctx.via, Via::Harness | Via::Shared) {
            self.harness_conns
                .entry(agent.to_string())
                .or_default()
                .insert(ctx.conn);
        }
        let stats = self.db.stats(agent).map_err(db_err)?;
        let current = Seen {
            unread,
            status_text: stats.status_text.clone(),
        };
        let resumed = self.resumes.untold(ctx.conn, agent);
        if current == seen && !resumed && ctx.can_wait && c.wait_seconds.unwrap_or(0) > 0 {
            self.wait_for(agent, ctx.conn);
            return Ok(Done::Wait);
        }
        Ok(Done::Reply(StatusReply {
            unread,
            inflight,
            status_text: Some(stats.status_text),
            status_set_at: stats.status_set_at,
            resumed: self.resumes.tell(ctx.conn, agent),
        }))
    }

    /// The inflight row of `agent` is `id`, or why not.
    fn check_inflight(&self, verb: &str, agent: &str, id: i64) -> Result<(), String> {
        let current = self.inflight_id(agent)?;
        if current == Some(id) {
            return Ok(());
        }
        Err(match current {
            Some(c) => format!("{verb}: {id} is not the inflight message of {agent} (that is {c})"),
            None => format!("{verb}: {agent} has no inflight message (stale id {id})"),
        })
    }

    /// `ack_turn`: the inflight row is done; the harness's `turn` id, when
    /// it sent one, is kept with it (`message_state`).
    pub(super) fn ack_turn(
        &mut self,
        agent: &str,
        id: i64,
        turn: Option<i64>,
    ) -> Result<Empty, String> {
        // The usual case: the row is the agent's inflight one (there is at
        // most one, and no transient wake is inflight), acked with its turn
        // id and receipts in one transaction (`receipts.rs`).
        let inflight = &MsgState::Inflight;
        if id >= 0
            && !self.transient_inflight.contains_key(agent)
            && !self
                .ack_rows(&[id], agent, inflight, turn, true)?
                .is_empty()
        {
            self.slot_done(agent);
            return Ok(Empty {});
        }
        self.check_inflight("ack_turn", agent, id)?;
        if id < 0 {
            self.transient_inflight.remove(agent);
            self.transient_attempts.remove(&id);
            self.transient_traces.remove(&id);
            self.riding_acked(agent);
        } else {
            self.ack_rows(&[id], agent, inflight, turn, true)?;
        }
        self.slot_done(agent);
        Ok(Empty {})
    }

    /// `requeue_inflight`: the inflight row goes back into the queue, at the
    /// head or behind the mail of other senders, its hand-out counted or
    /// given back.
    pub(super) fn requeue_inflight(
        &mut self,
        agent: &str,
        c: RequeueInflight,
    ) -> Result<Empty, String> {
        self.check_inflight("requeue_inflight", agent, c.id)?;
        let counted = c.attempt == Attempt::Counted;
        let behind = c.place == Place::Behind;
        if c.id < 0 {
            if let Some(m) = self.transient_inflight.remove(agent) {
                if !counted {
                    if let Some(n) = self.transient_attempts.get_mut(&m.id) {
                        *n = n.saturating_sub(1);
                    }
                }
                let queue = self.transient.entry(agent.to_string()).or_default();
                if behind {
                    queue.push_back(m);
                } else {
                    queue.push_front(m);
                }
            }
        } else {
            self.db
                .requeue(c.id, agent, counted, behind, c.error.as_deref())
                .map_err(db_err)?;
        }
        self.slot_done(agent);
        self.notify(agent);
        Ok(Empty {})
    }

    /// `dead_letter`: the harness gives up on its inflight message. It is
    /// kept `failed`; the recipient's parent and the sender (when that is an
    /// agent) are told once.
    pub(super) fn dead_letter(
        &mut self,
        agent: &str,
        c: DeadLetter,
    ) -> Result<DeadLetterReply, String> {
        self.check_inflight("dead_letter", agent, c.id)?;
        let t = now();
        if c.id < 0 {
            let Some(m) = self.transient_inflight.remove(agent) else {
                return Err(format!("dead_letter: {agent} has no inflight message"));
            };
            let handed = self.transient_attempts.remove(&m.id).unwrap_or(1);
            let traceparent = self.transient_traces.remove(&m.id);
            let attempts = if c.ran {
                handed
            } else {
                handed.saturating_sub(1)
            };
            let row = NewMessage {
                from: &m.from,
                to: agent,
                body: &m.body,
                kind: &m.kind,
                in_reply_to: m.in_reply_to,
                receipt: false,
                traceparent: traceparent.as_deref(),
            };
            let told = self.told_of(agent, &m);
            let id = self
                .db
                .insert_dead_letter(&row, attempts, &c.error, t, |id| {
                    notices(&told, agent, id, &m, attempts, &c.error)
                })
                .map_err(db_err)?;
            log::warn!("transient wake {} of {agent} dead-lettered as #{id}", m.id);
            self.slot_done(agent);
            for to in &told {
                self.notify(to);
            }
            return Ok(DeadLetterReply { id, told });
        }
        let Some(m) = self.db.inflight(agent).map_err(db_err)? else {
            return Err(format!("dead_letter: {agent} has no inflight message"));
        };
        let handed = self.db.attempts(c.id).map_err(db_err)?.unwrap_or_default();
        let attempts = if c.ran {
            handed
        } else {
            handed.saturating_sub(1)
        };
        let told = self.told_of(agent, &m);
        let notices = notices(&told, agent, c.id, &m, attempts, &c.error);
        let rows: Vec<NewMessage> = notices
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
        if !self
            .db
            .dead_letter(c.id, agent, &c.error, c.ran, t, &rows)
            .map_err(db_err)?
        {
            return Err(format!(
                "dead_letter: message #{} is no longer inflight",
                c.id
            ));
        }
        log::warn!(
            "message #{} to {agent} dead-lettered after {attempts} attempts: {}",
            c.id,
            c.error
        );
        self.slot_done(agent);
        for to in &told {
            self.notify(to);
        }
        Ok(DeadLetterReply { id: c.id, told })
    }

    /// Who is told of a dead letter of `agent`: its parent (the operator for
    /// a root agent), then the sender when that is another agent of this hive.
    fn told_of(&self, agent: &str, m: &Message) -> Vec<String> {
        let parent = self.cfg.parent_of(agent);
        let mut out = vec![parent.clone()];
        if let Peer::Agent(sender) = &m.from {
            if *sender != parent && sender != agent && self.cfg.agent(sender).is_some() {
                out.push(sender.clone());
            }
        }
        out
    }

    /// `failed`: the dead letters, of every agent or of one.
    pub(super) fn failed(&self, c: Failed) -> Result<FailedReply, String> {
        if let Some(a) = &c.agent {
            // A forgotten agent's dead letters are still listed by its name.
            if self.check_agent(a).is_err() && self.db.count_failed(a).map_err(db_err)? == 0 {
                self.check_agent(a)?;
            }
        }
        let rows = self.db.failed(c.agent.as_deref()).map_err(db_err)?;
        let mut budget = limits::Budget::new();
        Ok(FailedReply {
            failed: budget.fit(rows),
            left_off: budget.left_off,
        })
    }

    /// `retry`: a dead letter goes back at the tail of its agent's queue.
    pub(super) fn retry(&mut self, c: Retry) -> Result<RetryReply, String> {
        let Some((agent, state)) = self.db.message_state(c.id).map_err(db_err)? else {
            return Err(format!(
                "there is no message #{}; `hive failed` lists the dead letters",
                c.id
            ));
        };
        if state != MsgState::Failed {
            return Err(format!("message #{} is {state}, not failed", c.id));
        }
        // Mail of an agent taken out of the fleet waits for it to be back.
        if agent != "operator" && !agent.contains('@') && self.cfg.agent(&agent).is_none() {
            return Err(format!(
                "message #{} is for {agent}, which is not in the fleet; put its entry back \
                 (`hive reload`), then retry",
                c.id
            ));
        }
        if !self.db.retry(c.id).map_err(db_err)? {
            return Err(format!("message #{} changed state; try again", c.id));
        }
        log::info!(
            "message #{} is back in {agent}'s queue (operator retry)",
            c.id
        );
        self.notify(&agent);
        Ok(RetryReply { id: c.id, agent })
    }

    /// `report_state`: the harness's pause, kept while it is connected.
    pub(super) fn report_state(
        &mut self,
        conn: ConnId,
        agent: &str,
        c: ReportState,
    ) -> Result<Empty, String> {
        self.harness_conns
            .entry(agent.to_string())
            .or_default()
            .insert(conn);
        let needs = c
            .paused
            .as_ref()
            .is_some_and(|p| p.reason == crate::proto::PauseReason::Login);
        match c.paused {
            Some(p) => self.paused.insert(agent.to_string(), p),
            None => self.paused.remove(agent),
        };
        let changed = if needs {
            self.needs_login.insert(agent.to_string())
        } else {
            self.needs_login.remove(agent)
        };
        if changed {
            let text = format!(
                "{agent}: {}",
                if needs {
                    "claude needs a login"
                } else {
                    "logged in again"
                }
            );
            self.throttled(log::Level::Info, agent, super::throttle::Kind::Login, text);
            if needs {
                self.notify_event("needs_login", agent, "claude needs a login");
            }
            if let Some(sup) = &self.settings.lifecycle {
                // Unbounded: never blocks the hub.
                let _ = sup.send(crate::broker::lifecycle::LifecycleCmd::NeedsLogin {
                    name: agent.to_string(),
                    needs,
                });
            }
        }
        Ok(Empty {})
    }

    /// One page of unread operator messages above `after`, within the answer's
    /// byte budget. Nothing is marked read here: `inbox_ack` does that once the
    /// client has shown them.
    pub(super) fn operator_inbox(&mut self, ctx: &Ctx, c: Inbox) -> Handled<MessagesReply> {
        let rows = self
            .db
            .queued_after("operator", c.after.unwrap_or(0), INBOX_ROWS)
            .map_err(db_err)?;
        let had_more = rows.len() >= INBOX_ROWS as usize;
        let page = limits::page(rows, had_more);
        if page.messages.is_empty() && ctx.can_wait && c.wait_seconds.unwrap_or(0) > 0 {
            self.wait_for("operator", ctx.conn);
            return Ok(Done::Wait);
        }
        Ok(Done::Reply(page))
    }

    pub(super) fn inbox_ack(&mut self, c: InboxAck) -> Result<AckedReply, String> {
        // Mail an agent sent the operator with `receipt: true` gets its
        // receipt with the ack (issue 43, `receipts.rs`).
        let acked = self.ack_rows(&c.ids, "operator", &MsgState::Queued, None, false)?;
        Ok(AckedReply {
            acked: acked.len() as u64,
        })
    }
}

/// A row `recv_next` hands out.
struct Popped {
    message: Message,
    /// It was inflight already (the harness stopped mid-turn).
    redelivered: bool,
    /// Its attempts, this hand-out included.
    attempts: u32,
}

impl Popped {
    fn new(message: Message, redelivered: bool, attempts: u32) -> Popped {
        Popped {
            message,
            redelivered,
            attempts,
        }
    }
}

/// The notices of dead letter `id` (of `agent`, from `m`) for `told`: the
/// recipient's parent first, then the sender; each says its id, its sender and
/// its last error.
fn notices(
    told: &[String],
    agent: &str,
    id: i64,
    m: &Message,
    attempts: u32,
    error: &str,
) -> Vec<(Peer, String, String)> {
    let excerpt = preview(&m.body, 100);
    let retry = |who: &str| {
        if who == "operator" {
            format!("`hive retry {id}` puts it back in {agent}'s queue")
        } else {
            format!("the operator can put it back with `hive retry {id}`")
        }
    };
    told
        .iter()
        .enumerate()
        .map(|(i, to)| {
            let body = if i == 0 {
                format!(
                    "[system] message #{id} from {} to {agent} (\"{excerpt}\") is dead-lettered after {attempts} failed attempts; last error: {error}. It is kept: {}.",
                    m.from.as_str(),
                    retry(to)
                )
            } else {
                format!(
                    "[system] your message #{id} to {agent} (\"{excerpt}\") is dead-lettered after {attempts} failed attempts; last error: {error}. {}.",
                    retry(to)
                )
            };
            (Peer::System, to.clone(), body)
        })
        .collect()
}
