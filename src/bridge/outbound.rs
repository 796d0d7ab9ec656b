//! The `bridge-send` thread: takes the broker's outbox in id order
//! (`bridge_next`, parked while it is empty) and sends each event to the
//! homeserver under the transaction id `<instance>-<message id>` (the
//! instance of the broker start that committed it, which it keeps for good),
//! awaiting each before the next, so every destination gets its events in
//! order. An event is settled (`bridge_sent`) only after the homeserver
//! answered: a crash, a restart or a restored `broker.db` sends it again
//! under the same transaction id, which the homeserver answers with the first
//! event (and the receiving broker deduplicates by the same pair anyway). A homeserver that is down, slow or rate-limiting is
//! retried with the capped backoff (its `retry_after_ms` honoured) while the
//! rest of the hive runs; one that refuses an event for good gets it settled
//! as failed (`bridge_failed`), and the broker tells its sender.

use super::broker::Broker;
use super::event;
use super::login::{is_fatal, Login};
use super::status::Reporter;
use crate::matrix::{Backoff, Client, Error};
use crate::proto::cmd::{BridgeFailed, BridgeNext, BridgeSent, Outbound};
use std::time::Duration;

/// How long one `bridge_next` parks in the broker.
const NEXT_WAIT_SECS: u64 = 30;

pub struct Outbox {
    pub broker: Broker,
    pub client: Client,
    pub login: Login,
    /// The instance of this broker start: the transaction ids' prefix for
    /// an event of a broker of an older release, which names none.
    pub instance: String,
    /// The swarm room's id.
    pub room: String,
    /// The operator room's id, when there is one.
    pub operator_room: Option<String>,
    pub status: Reporter,
    pub backoff: Backoff,
    pub max_pause: Duration,
}

impl Outbox {
    /// Runs until a fatal login error, which it returns.
    pub fn run(mut self) -> Error {
        loop {
            let next = self.broker.call(&BridgeNext {
                wait_seconds: Some(NEXT_WAIT_SECS),
            });
            let events = match next {
                Ok(r) => r.events,
                Err(e) => {
                    log::error!("the broker refused bridge_next: {e}");
                    std::thread::sleep(self.max_pause);
                    continue;
                }
            };
            for ev in events {
                if let Err(fatal) = self.send(&ev) {
                    return fatal;
                }
            }
        }
    }

    /// Sends one event until the homeserver took or refused it; only a fatal
    /// login error is returned.
    fn send(&mut self, ev: &Outbound) -> Result<(), Error> {
        let room = if ev.dest.is_empty() {
            match &self.operator_room {
                Some(r) => r.clone(),
                None => {
                    self.settle_failed(ev.id, "this hive's bridge has no operator room");
                    return Ok(());
                }
            }
        } else {
            self.room.clone()
        };
        let instance = if ev.instance.is_empty() {
            &self.instance
        } else {
            &ev.instance
        };
        let txn = format!("{instance}-{}", ev.id);
        let content = event::content(ev, instance);
        loop {
            match self.client.send(&room, &txn, &content) {
                Ok(event_id) => {
                    self.backoff.succeeded();
                    self.status.up();
                    log::debug!("event #{} sent as {event_id}", ev.id);
                    if let Err(e) = self.broker.call(&BridgeSent {
                        id: ev.id,
                        event_id,
                    }) {
                        log::error!("the broker refused bridge_sent for #{}: {e}", ev.id);
                    }
                    return Ok(());
                }
                Err(e) if e.is_auth() => self.log_in_again(e)?,
                Err(e) if e.is_retryable() => self.pause(&e),
                Err(e) => {
                    self.settle_failed(ev.id, &e.message);
                    return Ok(());
                }
            }
        }
    }

    fn settle_failed(&mut self, id: i64, why: &str) {
        let cmd = BridgeFailed {
            id,
            error: crate::proto::text::preview(why, 900),
        };
        if let Err(e) = self.broker.call(&cmd) {
            log::error!("the broker refused bridge_failed for #{id}: {e}");
        }
    }

    /// Waits as the backoff says after `e`, telling the broker.
    fn pause(&mut self, e: &Error) {
        let wait = self.backoff.delay(e).unwrap_or(self.max_pause);
        log::warn!("sending: {e}; trying again in {wait:?}");
        self.status.backing_off(e.message.clone());
        std::thread::sleep(wait);
    }

    /// The token was refused: a new session, or the fatal error.
    fn log_in_again(&mut self, refused: Error) -> Result<(), Error> {
        log::warn!("sending: {refused}; logging in again");
        match self.login.client() {
            Ok(c) => {
                self.client = c;
                Ok(())
            }
            Err(e) if is_fatal(&e) => Err(e),
            Err(e) => {
                self.pause(&e);
                Ok(())
            }
        }
    }
}
