//! Notifications, on the hub's side (issue 43, item 3). Most events are
//! written by the store's triggers in the transaction of their cause
//! (`db/outbox.rs`); the hub writes those it learns of itself — a harness
//! reported its login pause (`needs_login`), an agent's harness crashed
//! (told by the supervisor of `hive up`) and the operator's `notify_test` —
//! and nudges the sender thread (`broker/notify`), never waiting for it; a
//! `notify` block `hive reload` read has its queues registered here and
//! goes to that thread the same way. `notify_status` reads each
//! destination's queue from the store.

use super::{db_err, Hub};
use crate::proto::cmd::{NotifyDest, NotifyStatusReply, NotifyTestReply};

impl Hub<'_> {
    /// Wakes the sender thread: it looks at its queues now (a full
    /// channel means it will anyway).
    fn nudge_notify(&self) {
        if let Some(n) = &self.settings.notify {
            n.nudge();
        }
    }

    /// `hive reload` read the `notify` block again: its queues are
    /// registered here, so a command after the reload's answer sees them,
    /// and the sender thread takes the destinations without the hub
    /// waiting for it. A store that refuses them keeps the ones before.
    pub(super) fn notify_reloaded(&mut self, r: crate::broker::notify::Reconfig) {
        use crate::broker::notify::{log_dests, rows};
        if let Err(e) = self.db.notify_register(&rows(&r.dests)) {
            log::error!(
                "notify: cannot register the reloaded destinations ({e}); the ones before stay"
            );
            return;
        }
        log_dests(&r.dests);
        if r.dests.is_empty() {
            log::info!("notify: the block was taken out; nothing is sent");
        }
        if let Some(n) = &self.settings.notify {
            n.reconfigure(r);
        }
    }

    /// Writes an event about `agent` whose cause is no row of the store
    /// (`needs_login`, `agent_crashed`) and nudges the sender.
    pub(super) fn notify_event(&mut self, event: &str, agent: &str, text: &str) {
        match self
            .db
            .notify_event(event, agent, text, crate::proto::now())
        {
            Ok(Some(_)) => self.nudge_notify(),
            Ok(None) => {}
            Err(e) => log::error!("cannot record {event} of {agent} for notify: {e}"),
        }
    }

    /// The supervisor saw `agent`'s harness exit unasked (`detail`: its
    /// status and how long it ran).
    pub(super) fn agent_crashed(&mut self, agent: &str, detail: &str) {
        let text = format!("{agent}'s harness exited: {detail}; hive up restarts it");
        self.notify_event("agent_crashed", agent, &text);
    }

    /// `notify_test`: a test event for every destination.
    pub(super) fn notify_test(&mut self) -> Result<NotifyTestReply, String> {
        let n = self.db.notify_states().map_err(db_err)?.len() as u64;
        let id = self
            .db
            .notify_event(
                "test",
                "operator",
                "a test notification from `hive notify test`",
                crate::proto::now(),
            )
            .map_err(db_err)?;
        match id {
            Some(event) if n > 0 => {
                self.nudge_notify();
                Ok(NotifyTestReply {
                    event,
                    destinations: n,
                })
            }
            _ => Err(
                "no notify destinations: add a `notify` block to the fleet file \
                 (docs/config.md) and run `hive reload` (or start the broker again)"
                    .into(),
            ),
        }
    }

    /// `notify_status`: each destination's queue and counters.
    pub(super) fn notify_status(&mut self) -> Result<NotifyStatusReply, String> {
        let rows = self.db.notify_states().map_err(db_err)?;
        Ok(NotifyStatusReply {
            destinations: rows
                .into_iter()
                .map(|d| NotifyDest {
                    url: d.shown,
                    format: d.format,
                    events: d.events.split(',').map(str::to_string).collect(),
                    pending: d.pending,
                    attempts: d.attempts,
                    next_try_at: (d.attempts > 0 && d.next_at_ms > 0)
                        .then(|| d.next_at_ms.div_euclid(1000)),
                    last_ok_at: d.last_ok_at,
                    last_error: d.last_error,
                    last_error_at: d.last_error_at,
                    delivered: d.delivered,
                    failed: d.failed,
                    dropped: d.dropped,
                })
                .collect(),
        })
    }
}
