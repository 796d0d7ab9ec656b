//! The `bridge-sync` thread: the one `/sync` long-poll of the bridge. Its
//! filter keeps the `m.room.message` timeline of the bridge's rooms with a
//! large limit; a timeline that comes back `limited` is completed by paging
//! `/messages` back to the previous token, so a long absence loses nothing.
//! Each event is read by [`super::event::decode`] (forged, foreign, malformed
//! and its own events are skipped with a debug line) and the accepted ones go
//! to the broker in batches with the sync's `next_batch` on the last, which
//! the broker stores in the same transaction as the messages. A start without
//! a stored token begins with a `timeout=0` sync and replays no history.

use super::broker::Broker;
use super::event::{self, Me, Room};
use super::login::{is_fatal, Login};
use super::status::Reporter;
use crate::matrix::{Backoff, Client, Error, RoomEvent, RoomFilter};
use crate::proto::cmd::{BridgeDeliver, Inbound, MAX_DELIVER};
use crate::proto::swarm::MatrixConfig;
use std::time::Duration;

/// Most bytes of events one `bridge_deliver` carries (its line is at most
/// 1 MiB; one event is at most about 400 KiB escaped).
const BATCH_BYTES: usize = 512 * 1024;

/// Events one `/messages` page asks for while filling a gap.
const GAP_PAGE: u32 = 100;

pub struct Sync {
    pub broker: Broker,
    pub client: Client,
    pub login: Login,
    pub hive: String,
    pub matrix: MatrixConfig,
    /// The rooms read, by id.
    pub rooms: Vec<(String, Room)>,
    pub filter: RoomFilter,
    /// The token of the last batch the broker stored.
    pub since: Option<String>,
    /// How long one long-poll waits for something new.
    pub timeout: Duration,
    pub status: Reporter,
    pub backoff: Backoff,
    pub max_pause: Duration,
}

impl Sync {
    /// Runs until a fatal login error, which it returns.
    pub fn run(mut self) -> Error {
        loop {
            match self.once() {
                Ok(()) => {}
                Err(e) if e.is_auth() => {
                    log::warn!("syncing: {e}; logging in again");
                    match self.login.client() {
                        Ok(c) => self.client = c,
                        Err(e) if is_fatal(&e) => return e,
                        Err(e) => self.pause(&e),
                    }
                }
                Err(e) => self.pause(&e),
            }
        }
    }

    fn pause(&mut self, e: &Error) {
        let wait = self.backoff.delay(e).unwrap_or(self.max_pause);
        log::warn!("syncing: {e}; trying again in {wait:?}");
        self.status.backing_off(e.message.clone());
        std::thread::sleep(wait);
    }

    /// One sync, its gaps filled, delivered with its token.
    fn once(&mut self) -> Result<(), Error> {
        let (since, timeout) = match &self.since {
            Some(s) => (Some(s.clone()), self.timeout),
            None => (None, Duration::ZERO),
        };
        let r = self
            .client
            .sync(since.as_deref(), timeout, Some(&self.filter))?;
        let mut events: Vec<(RoomEvent, Room)> = Vec::new();
        // Without a token this is a fresh start: no history is replayed.
        if let Some(since) = &since {
            for (room_id, room) in &self.rooms {
                let Some(tl) = r.timeline(room_id) else {
                    continue;
                };
                if let (true, Some(prev)) = (tl.limited, &tl.prev_batch) {
                    let gap =
                        self.client
                            .fill_gap(room_id, prev, since, Some(&self.filter), GAP_PAGE)?;
                    log::info!(
                        "the sync came back limited: {} earlier event(s) of {room_id} fetched",
                        gap.len()
                    );
                    events.extend(gap.into_iter().map(|e| (e, *room)));
                }
                events.extend(tl.events.iter().cloned().map(|e| (e, *room)));
            }
        }
        self.backoff.succeeded();
        self.status.up();
        let user_id = self
            .client
            .session()
            .map(|s| s.user_id.clone())
            .unwrap_or_else(|| self.login.user_id().to_string());
        let me = Me {
            hive: &self.hive,
            user_id: &user_id,
            matrix: &self.matrix,
        };
        let accepted: Vec<Inbound> = events
            .iter()
            .filter_map(|(e, room)| match event::decode(e, *room, &me) {
                Ok(i) => Some(i),
                Err(why) => {
                    log::debug!("event {} from {} skipped: {why}", e.event_id, e.sender);
                    None
                }
            })
            .collect();
        self.deliver(accepted, &r.next_batch);
        self.since = Some(r.next_batch);
        Ok(())
    }

    /// Hands `events` to the broker in batches, the token with the last; a
    /// batch the broker cannot take now is sent again (it is deduplicated).
    fn deliver(&mut self, events: Vec<Inbound>, token: &str) {
        let batches = batches(events);
        let n = batches.len();
        for (i, events) in batches.into_iter().enumerate() {
            let cmd = BridgeDeliver {
                events,
                next_batch: (i + 1 == n).then(|| token.to_string()),
            };
            loop {
                match self.broker.call(&cmd) {
                    Ok(r) => {
                        if r.delivered + r.bounced + r.ignored > 0 {
                            log::debug!(
                                "delivered {}, bounced {}, ignored {}, seen before {}",
                                r.delivered,
                                r.bounced,
                                r.ignored,
                                r.duplicates
                            );
                        }
                        break;
                    }
                    Err(e) => {
                        log::error!("the broker refused a batch of events: {e}; trying again");
                        std::thread::sleep(self.max_pause);
                    }
                }
            }
        }
    }
}

/// `events` cut into batches of at most [`BATCH_BYTES`] and [`MAX_DELIVER`]
/// events, in order; always at least one (maybe empty), for the token.
fn batches(events: Vec<Inbound>) -> Vec<Vec<Inbound>> {
    let mut out = vec![Vec::new()];
    let mut used = 0;
    for e in events {
        let size = serde_json::to_string(&e).map_or(0, |s| s.len());
        let last = out.last_mut().expect("one batch at least");
        if !last.is_empty() && (used + size > BATCH_BYTES || last.len() >= MAX_DELIVER) {
            out.push(Vec::new());
            used = 0;
        }
        used += size;
        out.last_mut().expect("one batch at least").push(e);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::cmd::EventKind;

    fn ev(body_len: usize) -> Inbound {
        Inbound {
            origin: "two".into(),
            id: "1".into(),
            kind: EventKind::Message,
            from: "b".into(),
            to: "a".into(),
            body: "x".repeat(body_len),
            in_reply_to: None,
            question: None,
            ref_instance: None,
            options: vec![],
            multi: false,
            reply_to_event: None,
            sent_at: 0,
            instance: None,
            reason: None,
        }
    }

    #[test]
    fn batches_keep_order_and_fit_a_line() {
        assert_eq!(batches(Vec::new()).len(), 1, "the token needs a batch");
        let big: Vec<Inbound> = (0..20).map(|_| ev(60_000)).collect();
        let b = batches(big);
        assert_eq!(b.iter().map(Vec::len).sum::<usize>(), 20);
        for batch in &b {
            let line = serde_json::to_string(batch).unwrap();
            assert!(
                line.len() < crate::proto::limits::MAX_LINE,
                "{}",
                line.len()
            );
        }
        let many: Vec<Inbound> = (0..2500).map(|_| ev(1)).collect();
        let lens: Vec<usize> = batches(many).iter().map(Vec::len).collect();
        assert_eq!(lens, [1000, 1000, 500]);
    }
}
