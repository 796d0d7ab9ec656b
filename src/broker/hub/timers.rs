//! Timers: reminders (`remind`, once, from `reminder`) and scheduled prompts
//! (`schedule_prompt`, once or repeating, from `scheduler`), both stored, so
//! they survive restarts, and fired by the hub's own loop, which sleeps until
//! the earliest of them or of a question's TTL (`next_due`, kept in memory).
//! A reminder's whole payload stays in `broker.db` and fires as one message;
//! the broker writes no file for it (the agent's `hive mcp` or harness writes
//! a long one into the agent's own state dir when it delivers it).
//! A timer that fires is charged to its agent, which set it (`quotas.rs`):
//! one is refused when it is set past the agent's limits, never when it
//! fires. A repeating prompt whose last copy is still unread (its agent
//! stopped, paused or busy) is coalesced into that copy (`db/timers.rs`).
//! The operator lists every agent's timers (`timers`) and cancels one
//! (`cancel_timer`); its agent is told, as the asker of a question the
//! operator cancels is.

use super::limits::Budget;
use super::{db_err, Hub};
use crate::broker::db::{Fired, NewMessage};
use crate::proto::cmd::{
    cancelled_notice, CancelScheduled, CancelTimer, CancelTimerReply, Remind, RemindReply,
    SchedulePrompt, ScheduledIdReply, ScheduledReply, TimerKind, Timers, TimersReply,
};
use crate::proto::ident::Peer;
use crate::proto::{now, Empty, MsgKind};

impl Hub<'_> {
    /// Re-reads when the next timer is due; called whenever reminders,
    /// scheduled prompts or questions change.
    pub(super) fn recompute_due(&mut self) {
        let r = self.db.next_reminder().ok().flatten();
        let q = self.db.next_question_expiry().ok().flatten();
        let s = self.db.next_scheduled().ok().flatten();
        self.next_due = [r, q, s].into_iter().flatten().min();
    }

    /// Fires due reminders and scheduled prompts and expires questions whose
    /// TTL ran out.
    pub(super) fn fire_due(&mut self) {
        let t = now();
        match self.db.due_reminders(t) {
            Ok(due) => {
                for (rem, body) in due {
                    let text = format!("[reminder #{}] {body}", rem.id);
                    let msg = NewMessage {
                        from: &Peer::Reminder,
                        to: &rem.agent,
                        body: &text,
                        kind: &MsgKind::Reminder,
                        in_reply_to: None,
                        receipt: false,
                        traceparent: None,
                    };
                    match self.db.fire_reminder(rem.id, &msg, t) {
                        Ok(fired) => {
                            if fired.is_some() {
                                self.stored(&rem.agent, text.len());
                            }
                            self.notify(&rem.agent)
                        }
                        Err(e) => log::error!("cannot fire reminder {}: {e}", rem.id),
                    }
                }
            }
            Err(e) => log::error!("cannot read due reminders: {e}"),
        }
        match self.db.expired_questions(t) {
            Ok(expired) => {
                for q in expired {
                    if let Err(e) = self.close_question(&q, "[expired]", &Peer::System) {
                        log::error!("cannot expire question {}: {e}", q.id);
                    }
                }
            }
            Err(e) => log::error!("cannot read expired questions: {e}"),
        }
        self.fire_scheduled(t);
        self.recompute_due();
    }

    pub(super) fn remind(&mut self, agent: &str, c: Remind) -> Result<RemindReply, String> {
        let t = now();
        let fire_at = c.fire_at(t);
        let pending = self.db.count_reminders(agent).map_err(db_err)?;
        if pending >= self.settings.max_pending_timers {
            return Err(format!(
                "{agent} already has {pending} pending reminders (the limit); cancel some with cancel_loose_end"
            ));
        }
        self.may_store(agent, c.message.len())?;
        let id = self
            .db
            .insert_reminder(agent, &c.message, fire_at, t)
            .map_err(db_err)?;
        self.recompute_due();
        Ok(RemindReply { id, fire_at })
    }

    /// `cancel_loose_end(kind="reminder")`: deletes one of the agent's reminders.
    pub(super) fn cancel_reminder(&mut self, agent: &str, id: i64) -> Result<Empty, String> {
        if !self.db.delete_reminder(agent, id).map_err(db_err)? {
            return Err(format!("no reminder #{id} of {agent}"));
        }
        self.recompute_due();
        Ok(Empty {})
    }

    pub(super) fn schedule_prompt(
        &mut self,
        agent: &str,
        c: SchedulePrompt,
    ) -> Result<ScheduledIdReply, String> {
        let t = now();
        let fire_at = c.first_fire(t);
        let pending = self.db.scheduled_of(agent).map_err(db_err)?.len() as u64;
        if pending >= self.settings.max_pending_timers {
            return Err(format!(
                "{agent} already has {pending} scheduled prompts (the limit); cancel some with cancel_scheduled"
            ));
        }
        self.may_store(agent, c.body.len())?;
        let id = self
            .db
            .insert_scheduled(agent, &c.body, fire_at, c.every_seconds, t)
            .map_err(db_err)?;
        self.recompute_due();
        Ok(ScheduledIdReply { id, fire_at })
    }

    pub(super) fn list_scheduled(&self, agent: &str) -> Result<ScheduledReply, String> {
        let mut budget = Budget::new();
        let scheduled = budget.fit(self.db.scheduled_of(agent).map_err(db_err)?);
        Ok(ScheduledReply {
            scheduled,
            left_off: budget.left_off,
        })
    }

    pub(super) fn cancel_scheduled(
        &mut self,
        agent: &str,
        c: CancelScheduled,
    ) -> Result<Empty, String> {
        if !self.db.delete_scheduled(agent, c.id).map_err(db_err)? {
            return Err(format!("no scheduled prompt #{} of {agent}", c.id));
        }
        self.recompute_due();
        Ok(Empty {})
    }

    /// Delivers due scheduled prompts; a repeating one moves to its next slot
    /// (missed slots are skipped, not delivered in a burst).
    fn fire_scheduled(&mut self, t: i64) {
        let due = match self.db.due_scheduled(t) {
            Ok(d) => d,
            Err(e) => {
                log::error!("cannot read due scheduled prompts: {e}");
                return;
            }
        };
        for s in due {
            let next = s.every_seconds.map(|e| {
                let e = e.max(1) as i64;
                let mut at = s.fire_at + e;
                if at <= t {
                    at += ((t - at) / e + 1) * e;
                }
                at
            });
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
            match self.db.fire_scheduled(&s, next, &msg, t) {
                Ok(Fired::Delivered(_)) => {
                    self.stored(&s.agent, body.len());
                    self.notify(&s.agent)
                }
                Ok(Fired::Coalesced(copy)) => log::debug!(
                    "scheduled prompt #{} of {}: message #{copy} is still unread; this delivery is coalesced into it",
                    s.id,
                    s.agent
                ),
                Err(e) => log::error!("cannot fire scheduled prompt {}: {e}", s.id),
            }
        }
    }

    /// `timers`: every pending reminder and scheduled prompt, of one agent or
    /// of all, soonest first.
    pub(super) fn timers(&self, c: Timers) -> Result<TimersReply, String> {
        let timers = self.db.timers(c.agent.as_deref()).map_err(db_err)?;
        if let Some(a) = c.agent.as_deref() {
            // A name the fleet no longer has may still own timers.
            if timers.is_empty() && self.cfg.agent(a).is_none() {
                return Err(self.unknown_agent(a));
            }
        }
        let mut budget = Budget::new();
        let timers = budget.fit(timers);
        Ok(TimersReply {
            timers,
            left_off: budget.left_off,
        })
    }

    /// `cancel_timer`: the operator cancels one agent's reminder or scheduled
    /// prompt; the timer goes and its agent gets `[KIND #ID cancelled by
    /// operator]` in one transaction, so it stops waiting for it.
    pub(super) fn cancel_timer(&mut self, c: CancelTimer) -> Result<CancelTimerReply, String> {
        let missing = || {
            format!(
                "no pending {} #{}: ids are per kind; `hive timers` lists the pending \
                 reminders and scheduled prompts with their kind and id",
                c.kind, c.id
            )
        };
        let agent = self
            .db
            .timer_owner(c.kind, c.id)
            .map_err(db_err)?
            .ok_or_else(missing)?;
        let body = cancelled_notice(c.kind, c.id);
        let kind = match c.kind {
            TimerKind::Reminder => MsgKind::Reminder,
            TimerKind::Scheduled => MsgKind::Scheduled,
        };
        let notice = NewMessage {
            from: &Peer::System,
            to: &agent,
            body: &body,
            kind: &kind,
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        };
        self.db
            .cancel_timer(c.kind, c.id, &notice, now())
            .map_err(db_err)?
            .ok_or_else(missing)?;
        self.notify(&agent);
        self.recompute_due();
        Ok(CancelTimerReply { agent })
    }
}
