//! What the turn loop is handling and what it remembers about it. A [`Work`]
//! is one broker message or the synthetic continue, and while it is in flight
//! an [`Inflight`] guard owns it: every way out of the loop (a return, an
//! error, a signal, a panic) drops the guard, and a guard dropped unsettled
//! requeues its message (at the head, its hand-out given back — but a panic
//! counts against the message, so one that breaks the harness reaches the
//! limit). Only [`Inflight::ack`] (a completed turn or an operator interrupt)
//! and [`Inflight::dead_letter`] let a message go; [`Inflight::requeue`] says
//! whether the failure counted and where the message goes.
//!
//! The [`Ledger`] remembers, per message, what outlives one hand-out: failures
//! counted toward `HIVE_TURN_MAX_ATTEMPTS` and the last error, which session
//! saw its prompt (so a retry in that session sends a short note, and any
//! other run the whole body), whether it was compacted for, and where it
//! starts again. The count of a broker message is a view of the broker's,
//! which counts every hand-out (`recv_next` says it): it survives a restart
//! of the harness, and a message that crashes the harness reaches the limit.

pub use super::policy::Ack;
use super::policy::Resume;
use super::poller::Teller;
use super::stats::MessageKey;
use crate::proto::limits::MAX_LAST_ERROR_CHARS;
use crate::proto::text::preview;
use crate::proto::{cmd, Attempt, Place, Request};
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

/// How a kept message goes back to the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeue {
    /// The failure was the message's own: the hand-out stays counted.
    pub counted: bool,
    pub place: Place,
    /// What went wrong, kept by the broker as the message's last error.
    pub error: Option<String>,
}

impl Requeue {
    /// Back at the head, the hand-out given back: a pause, a stop.
    pub fn head() -> Requeue {
        Requeue {
            counted: false,
            place: Place::Head,
            error: None,
        }
    }
}

/// An error text as the broker keeps it: at most [`MAX_LAST_ERROR_CHARS`].
pub fn error_text(e: &str) -> String {
    let e = e.trim();
    let e = if e.is_empty() { "unknown error" } else { e };
    preview(e, MAX_LAST_ERROR_CHARS - 1)
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

    pub fn ack(self, why: Ack) {
        self.ack_turn(why, None)
    }

    /// [`Inflight::ack`], naming the turn (the turn log's id) that handled
    /// the message when it is known (issue 43: `message_state` shows it).
    pub fn ack_turn(mut self, why: Ack, turn: Option<i64>) {
        log::debug!("ack of {:?} ({why:?}, turn {turn:?})", self.id);
        if let Some(id) = self.id {
            self.teller.tell(Request::from(cmd::AckTurn { id, turn }));
        }
        self.settled = true;
    }

    /// Gives up on the message: the broker keeps a message in its `failed`
    /// state with `error` and tells its parent and sender
    /// ([`Teller::dead_letter`]); a continue has no row, so its `notice` goes
    /// to the parent.
    /// `ran` is false when it was not run this time (its attempts were used
    /// up by runs the harness never finished).
    pub fn dead_letter(mut self, error: &str, ran: bool, notice: String) {
        match self.id {
            Some(id) => self.teller.dead_letter(id, error_text(error), ran),
            None => self
                .teller
                .tell(Request::from(cmd::SendToParent { body: notice })),
        }
        self.settled = true;
    }

    /// Puts the message back into the inbox, as `how` says.
    pub fn requeue(mut self, how: Requeue) {
        if let Some(id) = self.id {
            self.teller.tell(Request::from(cmd::RequeueInflight {
                id,
                attempt: if how.counted {
                    Attempt::Counted
                } else {
                    Attempt::NotCounted
                },
                place: how.place,
                error: how.error.as_deref().map(error_text),
            }));
        }
        self.settled = true;
    }
}

impl Drop for Inflight {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let Some(id) = self.id else {
            return;
        };
        // A stop, a signal, an error: not the message's fault. A panic while
        // it is in hand may be, and counts, so it cannot loop the harness.
        let req = if std::thread::panicking() {
            cmd::RequeueInflight {
                id,
                attempt: Attempt::Counted,
                place: Place::Behind,
                error: Some("the harness panicked while handling it".into()),
            }
        } else {
            cmd::RequeueInflight {
                id,
                ..cmd::RequeueInflight::default()
            }
        };
        self.teller.tell(Request::from(req));
    }
}

/// The message or continue being handled, with its guard.
pub struct Work {
    pub key: WorkKey,
    /// What the turn-stats db knows a broker message by once a run let it
    /// go (None for a continue).
    pub identity: Option<MessageKey>,
    pub from: String,
    pub body: String,
    /// The queue depth behind it, for the wake prompt.
    pub unread: u64,
    /// The broker handed it out before (a harness stopped mid-turn).
    pub redelivered: bool,
    /// Its hand-outs that counted so far, this one included (the broker's
    /// count; 0 for a continue).
    pub attempts: u32,
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
        let given_back = Request::from(cmd::RequeueInflight {
            id: 7,
            ..Default::default()
        });
        // Dropped: a return, an error, a signal: at the head, not counted.
        drop(Inflight::new(key, teller.clone()));
        assert_eq!(sent(), std::slice::from_ref(&given_back));
        Inflight::new(key, teller.clone()).requeue(Requeue::head());
        assert_eq!(sent(), [given_back]);
        // A failure of the message's own: counted, behind, with its error.
        Inflight::new(key, teller.clone()).requeue(Requeue {
            counted: true,
            place: Place::Behind,
            error: Some("x".repeat(5000)),
        });
        let got = sent();
        let Request::RequeueInflight(r) = &got[0] else {
            panic!("{got:?}")
        };
        assert_eq!((r.attempt, r.place), (Attempt::Counted, Place::Behind));
        assert!(r.error.as_ref().unwrap().chars().count() <= MAX_LAST_ERROR_CHARS);
        assert!(got[0].validate().is_ok(), "the broker takes it");
        // A panic while it is held counts against the message.
        let t = teller.clone();
        let r = std::panic::catch_unwind(move || {
            let _g = Inflight::new(key, t);
            panic!("the loop broke");
        });
        assert!(r.is_err());
        assert_eq!(
            sent(),
            [Request::from(cmd::RequeueInflight {
                id: 7,
                attempt: Attempt::Counted,
                place: Place::Behind,
                error: Some("the harness panicked while handling it".into()),
            })]
        );
        // The acks let it go, once.
        Inflight::new(key, teller.clone()).ack(Ack::Completed);
        Inflight::new(key, teller.clone()).ack(Ack::Interrupted);
        assert_eq!(
            sent(),
            [
                Request::from(cmd::AckTurn { id: 7, turn: None }),
                Request::from(cmd::AckTurn { id: 7, turn: None })
            ]
        );
        // The dead letter is the broker's: one command, no ack.
        Inflight::new(key, teller.clone()).dead_letter("crashed", true, "unused".into());
        assert_eq!(
            sent(),
            [Request::from(cmd::DeadLetter {
                id: 7,
                error: "crashed".into(),
                ran: true,
            })]
        );
        // A continue has no row: nothing to requeue or ack; its dead letter
        // is a notice to the parent.
        drop(Inflight::new(WorkKey::Continue, teller.clone()));
        Inflight::new(WorkKey::Continue, teller.clone()).ack(Ack::Completed);
        assert!(sent().is_empty());
        Inflight::new(WorkKey::Continue, teller).dead_letter("x", true, "gone".into());
        assert_eq!(
            sent(),
            [Request::from(cmd::SendToParent {
                body: "gone".into()
            })]
        );
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
