//! What the turn loop is handling and what it remembers about it. A [`Work`]
//! is one broker message or the synthetic continue, and while it is in flight
//! an [`Inflight`] guard owns it: every way out of the loop (a return, an
//! error, a signal, a panic) drops the guard, and a guard dropped unsettled
//! requeues its message. Only [`Inflight::ack`] (a completed turn or an
//! operator interrupt) and [`Inflight::dead_letter`] let a message go.
//!
//! The [`Ledger`] remembers, per message, what outlives one hand-out: failures
//! counted toward `HIVE_TURN_MAX_ATTEMPTS` and the last error, which session
//! saw its prompt (so a retry in that session sends a short note, and any
//! other run the whole body), whether it was compacted for, and where it
//! starts again. In stage 1 the ledger lives in the harness, so the count
//! starts over when the harness restarts; the broker will own the count,
//! incrementing it on every hand-out.

use super::policy::Resume;
use super::poller::Teller;
use crate::proto::{cmd, Request};
use std::collections::{HashMap, VecDeque};

/// Which message: a broker row, or the in-process continue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkKey {
    Message(i64),
    /// `request_next_turn`'s `{from:"self", body:"continue"}`.
    Continue,
}

impl WorkKey {
    pub fn id(self) -> Option<i64> {
        match self {
            WorkKey::Message(id) => Some(id),
            WorkKey::Continue => None,
        }
    }
}

/// Why a message is acked. Only these two, and the dead letter, let one go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// The turn completed.
    Completed,
    /// The operator interrupted it; the note says so.
    Interrupted,
}

/// Owns an inflight broker row until it is acked, dead-lettered or requeued;
/// dropped unsettled, it requeues. A continue has no row and nothing to do.
pub struct Inflight {
    id: Option<i64>,
    teller: Teller,
    settled: bool,
}

impl Inflight {
    pub fn new(key: WorkKey, teller: Teller) -> Inflight {
        Inflight {
            id: key.id(),
            teller,
            settled: false,
        }
    }

    pub fn ack(mut self, why: Ack) {
        log::debug!("ack of {:?} ({why:?})", self.id);
        if let Some(id) = self.id {
            self.teller.tell(Request::from(cmd::AckTurn { id }));
        }
        self.settled = true;
    }

    /// Gives up on the message; see [`Teller::dead_letter`].
    pub fn dead_letter(mut self, notice: String) {
        match self.id {
            Some(id) => self.teller.dead_letter(id, notice),
            None => self
                .teller
                .tell(Request::from(cmd::SendToParent { body: notice })),
        }
        self.settled = true;
    }

    /// Puts the message back at the head of the inbox.
    pub fn requeue(self) {
        // Dropping does it.
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        if let Some(id) = self.id {
            self.teller.tell(Request::from(cmd::RequeueInflight { id }));
        }
    }
}

/// The message or continue being handled, with its guard.
pub struct Work {
    pub key: WorkKey,
    pub from: String,
    pub body: String,
    /// The queue depth behind it, for the wake prompt.
    pub unread: u64,
    /// The broker handed it out before (a harness stopped mid-turn).
    pub redelivered: bool,
    /// The one at-once retry after a refused credential was made.
    pub auth_retried: bool,
    pub guard: Inflight,
}

impl Work {
    /// `message #12 from operator`, or `the continue turn`.
    pub fn what(&self) -> String {
        match self.key {
            WorkKey::Message(id) => format!("message #{id} from {}", self.from),
            WorkKey::Continue => "the continue turn".into(),
        }
    }
}

/// What the loop remembers about one message between hand-outs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Failures counted toward the attempt limit.
    pub attempts: u32,
    pub last_error: String,
    /// The session epoch whose history holds the message's prompt.
    pub seen_epoch: Option<u64>,
    /// The session epoch a `/compact` for it produced.
    pub compacted_epoch: Option<u64>,
    /// Where it starts again.
    pub resume: Resume,
    /// The number of completed turns when it last failed.
    pub failed_at: Option<u64>,
}

impl Default for Record {
    fn default() -> Record {
        Record {
            attempts: 0,
            last_error: String::new(),
            seen_epoch: None,
            compacted_epoch: None,
            resume: Resume::Turn,
            failed_at: None,
        }
    }
}

/// Records by message, bounded: the oldest go first past [`Ledger::CAP`].
#[derive(Debug, Default)]
pub struct Ledger {
    records: HashMap<WorkKey, Record>,
    order: VecDeque<WorkKey>,
}

impl Ledger {
    /// More records than messages that can be waiting on one harness's retries.
    pub const CAP: usize = 1024;

    pub fn get(&self, key: WorkKey) -> Record {
        self.records.get(&key).cloned().unwrap_or_default()
    }

    pub fn update(&mut self, key: WorkKey, f: impl FnOnce(&mut Record)) {
        if !self.records.contains_key(&key) {
            if self.order.len() >= Self::CAP {
                if let Some(old) = self.order.pop_front() {
                    self.records.remove(&old);
                }
            }
            self.order.push_back(key);
        }
        f(self.records.entry(key).or_default());
    }

    /// Forgets a message that was acked or dead-lettered.
    pub fn forget(&mut self, key: WorkKey) {
        if self.records.remove(&key).is_some() {
            self.order.retain(|k| *k != key);
        }
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::poller::test_teller;

    #[test]
    fn the_guard_requeues_on_every_way_out_but_the_three_acks() {
        let (teller, sent) = test_teller();
        let key = WorkKey::Message(7);
        // Dropped: a return, an error, a signal.
        drop(Inflight::new(key, teller.clone()));
        assert_eq!(sent(), [Request::from(cmd::RequeueInflight { id: 7 })]);
        Inflight::new(key, teller.clone()).requeue();
        assert_eq!(sent(), [Request::from(cmd::RequeueInflight { id: 7 })]);
        // A panic while it is held.
        let t = teller.clone();
        let r = std::panic::catch_unwind(move || {
            let _g = Inflight::new(key, t);
            panic!("the loop broke");
        });
        assert!(r.is_err());
        assert_eq!(sent(), [Request::from(cmd::RequeueInflight { id: 7 })]);
        // The acks let it go, once.
        Inflight::new(key, teller.clone()).ack(Ack::Completed);
        Inflight::new(key, teller.clone()).ack(Ack::Interrupted);
        assert_eq!(
            sent(),
            [
                Request::from(cmd::AckTurn { id: 7 }),
                Request::from(cmd::AckTurn { id: 7 })
            ]
        );
        // Stage 1's dead letter: the notice, then the ack.
        Inflight::new(key, teller.clone()).dead_letter("gone".into());
        assert_eq!(
            sent(),
            [
                Request::from(cmd::SendToParent {
                    body: "gone".into()
                }),
                Request::from(cmd::AckTurn { id: 7 })
            ]
        );
        // A continue has no row: nothing to requeue or ack.
        drop(Inflight::new(WorkKey::Continue, teller.clone()));
        Inflight::new(WorkKey::Continue, teller).ack(Ack::Completed);
        assert!(sent().is_empty());
    }

    #[test]
    fn the_ledger_is_bounded_and_forgets() {
        let mut l = Ledger::default();
        for id in 0..(Ledger::CAP as i64 + 10) {
            l.update(WorkKey::Message(id), |r| r.attempts = 1);
        }
        assert_eq!(l.len(), Ledger::CAP);
        assert_eq!(l.get(WorkKey::Message(0)).attempts, 0, "the oldest went");
        assert_eq!(l.get(WorkKey::Message(20)).attempts, 1);
        l.forget(WorkKey::Message(20));
        assert_eq!(l.get(WorkKey::Message(20)), Record::default());
        assert_eq!(l.len(), Ledger::CAP - 1);
    }
}
