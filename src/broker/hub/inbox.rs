//! Delivery and consumption: storing a message and waking whoever waits for
//! its recipient (`deliver`, `wake`, `send`, `send_to_parent`), the harness's
//! pop (`recv_next`, inflight, `ack_turn`, `requeue_inflight`, `status`), the
//! MCP tool's drain (`recv`, rows held per connection until `recv_ack`, given
//! back when the connection closes) and the operator's at-least-once inbox.
//! Transient wakes live here only, in memory (their ids are negative).

use super::limits;
use super::{db_err, ConnId, Ctx, Done, Handled, Held, Hub, Identity};
use crate::broker::db::NewMessage;
use crate::proto::cmd::{
    self, Inbox, InboxAck, Recv, RecvAck, RecvNext, RecvNextReply, StatusReply, Wake,
};
use crate::proto::ident::{Peer, PARENT};
use crate::proto::limits::RECV_MAX;
use crate::proto::text::excerpt;
use crate::proto::{now, AckedReply, Empty, Message, MessagesReply, MsgKind, MsgState, SentReply};
use std::collections::VecDeque;

/// Most rows one `inbox` answer looks at.
const INBOX_ROWS: u32 = 1000;

impl Hub {
    /// Stores a message and wakes whoever waits for the recipient.
    pub(super) fn deliver(
        &mut self,
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
        };
        let id = self.store(&msg)?;
        self.notify(to);
        Ok(SentReply {
            id: Some(id),
            to: Peer::sender(to),
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

    pub(super) fn wake(&mut self, who: &Identity, c: Wake) -> Result<SentReply, String> {
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
        let from = Peer::External(c.from);
        if !c.transient {
            return self.deliver(&from, &target, &c.body, MsgKind::Message, None);
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
        let from = match who {
            Identity::Operator => Peer::Operator,
            Identity::Bridge => return Err("the bridge sends no mail".into()),
            Identity::Agent(a) => {
                if to.as_str() == a {
                    return Err(
                        "an agent cannot send to itself; use remind or request_next_turn".into(),
                    );
                }
                self.cfg.may_send(a, to.as_str())?;
                Peer::Agent(a.clone())
            }
        };
        debug_assert_ne!(to.as_str(), PARENT);
        self.deliver(&from, to.as_str(), &c.body, MsgKind::Message, c.in_reply_to)
    }

    pub(super) fn send_to_parent(
        &mut self,
        agent: &str,
        c: cmd::SendToParent,
    ) -> Result<SentReply, String> {
        let parent = self.cfg.parent_of(agent);
        self.deliver(
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

    pub(super) fn inflight_id(&self, agent: &str) -> Result<Option<i64>, String> {
        Ok(match self.transient_inflight.get(agent) {
            Some(m) => Some(m.id),
            None => self.db.inflight(agent).map_err(db_err)?.map(|m| m.id),
        })
    }

    pub(super) fn recv_next(
        &mut self,
        ctx: &Ctx,
        agent: &str,
        c: RecvNext,
    ) -> Handled<RecvNextReply> {
        self.harness_conns
            .entry(agent.to_string())
            .or_default()
            .insert(ctx.conn);
        let popped = self.pop_next(agent)?;
        let unread = self.unread(agent)?;
        let status = match &c.seen {
            Some(_) => Some(self.db.stats(agent).map_err(db_err)?),
            None => None,
        };
        let changed = match (&c.seen, &status) {
            (Some(seen), Some(s)) => seen.unread != unread || seen.status_text != s.status_text,
            _ => false,
        };
        if popped.is_none() && !changed && ctx.can_wait && c.wait_seconds.unwrap_or(0) > 0 {
            self.wait_for(agent, ctx.waiter);
            return Ok(Done::Wait);
        }
        let with_message = popped.is_some();
        let (message, redelivered) = match popped {
            Some((m, redelivered)) => (Some(limits::fit_message(m)), redelivered),
            None => (None, false),
        };
        Ok(Done::Reply(RecvNextReply {
            message,
            redelivered,
            // The unread count after the pop, so the harness needs no `status`.
            unread: (with_message || c.seen.is_some()).then_some(unread),
            status_text: status.as_ref().map(|s| s.status_text.clone()),
            status_set_at: status.and_then(|s| s.status_set_at),
        }))
    }

    /// The inflight row again, or the next row made inflight.
    fn pop_next(&mut self, agent: &str) -> Result<Option<(Message, bool)>, String> {
        if let Some(m) = self.transient_inflight.get(agent) {
            return Ok(Some((m.clone(), true)));
        }
        if let Some(m) = self.db.inflight(agent).map_err(db_err)? {
            return Ok(Some((m, true)));
        }
        if let Some(m) = self.transient.get_mut(agent).and_then(VecDeque::pop_front) {
            self.transient_inflight.insert(agent.to_string(), m.clone());
            return Ok(Some((m, false)));
        }
        let Some(m) = self.db.queued(agent, 1).map_err(db_err)?.pop() else {
            return Ok(None);
        };
        if !self
            .db
            .transition(m.id, agent, &MsgState::Queued, &MsgState::Inflight, now())
            .map_err(db_err)?
        {
            return Err("message changed state while being popped; try again".into());
        }
        Ok(Some((m, false)))
    }

    pub(super) fn recv(&mut self, ctx: &Ctx, agent: &str, c: Recv) -> Handled<MessagesReply> {
        let max = c.max.unwrap_or(1).clamp(1, RECV_MAX as u64) as u32;
        let page = self.drain(agent, ctx.conn, max)?;
        if page.messages.is_empty() && ctx.can_wait && c.wait_seconds.unwrap_or(0) > 0 {
            self.wait_for(agent, ctx.waiter);
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
            self.db
                .transition_many(&ids, agent, &MsgState::Queued, &MsgState::Held, now())
                .map_err(db_err)?;
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
            if let Held::Stored(id) = h {
                stored.push(*id);
            }
            false
        });
        self.db
            .transition_many(&stored, agent, &MsgState::Held, &MsgState::Acked, now())
            .map_err(db_err)?;
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
        for set in self.harness_conns.values_mut() {
            set.remove(&conn);
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

    pub(super) fn status(&self, agent: &str) -> Result<StatusReply, String> {
        Ok(StatusReply {
            unread: self.unread(agent)?,
            inflight: self.inflight_id(agent)?,
        })
    }

    /// `ack_turn` (`ack`) or `requeue_inflight`: finishes the inflight row.
    pub(super) fn finish_inflight(
        &mut self,
        agent: &str,
        id: i64,
        ack: bool,
    ) -> Result<Empty, String> {
        let verb = if ack { "ack_turn" } else { "requeue_inflight" };
        let current = self.inflight_id(agent)?;
        if current != Some(id) {
            return Err(match current {
                Some(c) => {
                    format!("{verb}: {id} is not the inflight message of {agent} (that is {c})")
                }
                None => format!("{verb}: {agent} has no inflight message (stale id {id})"),
            });
        }
        if id < 0 {
            if let Some(m) = self.transient_inflight.remove(agent) {
                if !ack {
                    self.transient
                        .entry(agent.to_string())
                        .or_default()
                        .push_front(m);
                    self.notify(agent);
                }
            }
        } else {
            let to = if ack {
                MsgState::Acked
            } else {
                MsgState::Queued
            };
            self.db
                .transition(id, agent, &MsgState::Inflight, &to, now())
                .map_err(db_err)?;
            if !ack {
                self.notify(agent);
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
            self.wait_for("operator", ctx.waiter);
            return Ok(Done::Wait);
        }
        Ok(Done::Reply(page))
    }

    pub(super) fn inbox_ack(&mut self, c: InboxAck) -> Result<AckedReply, String> {
        let n = self
            .db
            .transition_many(
                &c.ids,
                "operator",
                &MsgState::Queued,
                &MsgState::Acked,
                now(),
            )
            .map_err(db_err)?;
        Ok(AckedReply { acked: n as u64 })
    }
}
