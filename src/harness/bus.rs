//! The event bus of one harness: the authoritative turn state (`Idle`, `Thinking`,
//! `Compacting` with `since`, the status flags and the pause), a bounded ring of
//! recent [`LiveEvent`]s with increasing ids, and the fan-out of new events to
//! subscribers (the SSE writers). The turn loop is the only writer of the state
//! ([`Bus::update`]); other threads only publish notes, and readers take
//! snapshots. Publishing never blocks: each subscriber has a bounded queue and
//! one that falls behind is dropped, so a slow web client can never slow a turn.
//! Every event but a state change is also offered to the durable turn log
//! ([`Bus::log_to`]), whose tap never waits either; the ids then continue
//! from the log's, across restarts. The bus also counts, for the page's
//! `/metrics` ([`Bus::counted`]), the turn ends by outcome and decision and
//! the pauses by reason with the time spent in each, since it was made.

use crate::history::{Loggable, Tap, View};
use crate::proto::PauseReason;
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// How many events the ring keeps for replay to new SSE clients.
pub const HISTORY: usize = 2000;

/// How many bytes of events the ring keeps at most; the oldest go first.
pub const HISTORY_BYTES: usize = 16 * 1024 * 1024;

/// How many events may wait for one subscriber before it is dropped.
pub const SUBSCRIBER_QUEUE: usize = 1024;

/// What the harness is doing right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnState {
    /// Sitting on `recv_next`, waiting for mail.
    Idle,
    /// `claude --print` is running a turn.
    Thinking,
    /// `/compact` is running.
    Compacting,
}

/// One event on the live stream.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum LiveEvent {
    TurnStart {
        from: String,
        body: String,
        unread: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        message_id: Option<i64>,
    },
    /// One stdout JSON line of claude.
    Stream { value: Value },
    /// A stderr line of claude, or a note of the harness.
    Note { text: String },
    TurnEnd {
        ok: bool,
        note: String,
        outcome: String,
        duration_ms: u64,
        /// What the turn loop decided (`policy::describe`), when it decided.
        #[serde(skip_serializing_if = "Option::is_none")]
        decision: Option<String>,
    },
    /// The turn state or a status flag changed; carries the new state.
    State { state: Box<StateSnapshot> },
}

/// The turn log keeps every event but the state changes, as the live stream
/// sends them.
impl Loggable for LiveEvent {
    fn view(&self) -> Option<View<'_>> {
        Some(match self {
            LiveEvent::TurnStart {
                from,
                body,
                message_id,
                ..
            } => View::TurnStart {
                from,
                body,
                message_id: *message_id,
            },
            LiveEvent::Stream { value } => View::Stream(value),
            LiveEvent::Note { text } => View::Note(text),
            LiveEvent::TurnEnd {
                ok,
                note,
                outcome,
                duration_ms,
                decision,
            } => View::TurnEnd {
                ok: *ok,
                outcome,
                note,
                duration_ms: *duration_ms,
                decision: decision.as_deref(),
            },
            LiveEvent::State { .. } => return None,
        })
    }

    fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// An event with its position in the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Numbered {
    pub id: u64,
    pub event: LiveEvent,
}

impl Numbered {
    /// The event as one JSON object with its id, for SSE `data:`.
    pub fn to_json(&self) -> String {
        let mut v = serde_json::to_value(&self.event).unwrap_or(Value::Null);
        if let Value::Object(m) = &mut v {
            m.insert("id".into(), Value::from(self.id));
        }
        v.to_string()
    }
}

/// Why and until when the loop waits before the next message runs
/// (`/api/state`'s `paused`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Paused {
    /// The loop's own (`rate_limit`, `usage_limit`, `api_backoff`, `login`,
    /// `mcp_start`, `start_failed`) or the broker's (`usage_limit`,
    /// `budget`): the contract's one vocabulary.
    pub reason: PauseReason,
    /// Unix seconds when the loop goes on by itself; null for the login park.
    pub until: Option<i64>,
    /// One line saying what happened.
    pub detail: String,
}

/// The CLI is retrying an API call inside the running turn (`system/api_retry`
/// lines, a rejected `rate_limit_event`): the page shows "rate limited,
/// retrying" before the turn ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Retrying {
    /// `rate_limit` or `api_error`.
    pub reason: &'static str,
    /// The CLI's attempt number and its limit, when it said.
    pub attempt: Option<u64>,
    pub max_retries: Option<u64>,
    pub error_status: Option<i64>,
}

/// Everything `/api/state` shows, kept current by the turn loop.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StateSnapshot {
    pub label: String,
    pub qualified_label: String,
    pub turn_state: TurnState,
    /// Unix seconds of the last turn-state change.
    pub turn_state_since: i64,
    /// The broker is reachable and the harness is serving.
    pub online: bool,
    /// Kept for clients of the first `/api/state`; `paused` says more.
    pub rate_limited: bool,
    pub rate_limited_until: Option<i64>,
    pub needs_login: bool,
    /// Null while the loop is not waiting out a pause or a login park.
    pub paused: Option<Paused>,
    /// Set while the CLI retries an API call inside the running turn.
    pub retrying: Option<Retrying>,
    pub model: String,
    /// The page's `/model` choice in force (the broker's), if any.
    pub model_override: Option<String>,
    /// The configured default the agent returns to without one.
    pub model_default: String,
    pub context_window_tokens: u64,
    pub context_tokens: Option<u64>,
    pub context_percent: Option<f64>,
    pub unread: u64,
    pub inflight: Option<i64>,
    pub status_text: String,
    pub session_id: Option<String>,
    pub last_outcome: Option<String>,
    /// Turns stopped because one of hive's MCP servers was not connected, by
    /// server, for `/metrics` (`hive_mcp_start_failures_total`); not in
    /// `/api/state`.
    #[serde(skip)]
    pub mcp_start_failures: BTreeMap<String, u64>,
}

struct Inner {
    next_id: u64,
    history: VecDeque<Numbered>,
    /// Serialized size of each event in `history`, and their sum.
    sizes: VecDeque<usize>,
    history_bytes: usize,
    subscribers: Vec<Sender<Numbered>>,
    state: StateSnapshot,
    /// The turn log's queue, while the log is kept.
    log: Option<Tap<LiveEvent>>,
    /// Since when the state says rate-limited, and the time it said so
    /// before (the page's `hive_rate_limited_seconds_total`).
    rate_limited_since: Option<std::time::Instant>,
    rate_limited_before: std::time::Duration,
    /// The pause in force (its reason, since when), and per reason the
    /// pauses entered and the time spent in them before (the page's
    /// `hive_pauses_total` and `hive_paused_seconds_total`).
    pause_since: Option<(String, std::time::Instant)>,
    pauses: BTreeMap<String, (u64, std::time::Duration)>,
    /// The turn ends since the bus was made, by outcome kind and decision
    /// kind (`hive_turn_decisions_total`).
    turn_ends: BTreeMap<(String, String), u64>,
}

/// What the bus counted since it was made, in the web's words.
pub use crate::web::harness::Counted;

/// A cheap, cloneable handle on the bus.
#[derive(Clone)]
pub struct Bus {
    inner: Arc<Mutex<Inner>>,
}

fn now() -> i64 {
    crate::proto::now()
}

impl Bus {
    pub fn new(label: &str, qualified_label: &str, model: &str, window: u64) -> Bus {
        let state = StateSnapshot {
            label: label.into(),
            qualified_label: qualified_label.into(),
            turn_state: TurnState::Idle,
            turn_state_since: now(),
            online: false,
            rate_limited: false,
            rate_limited_until: None,
            needs_login: false,
            paused: None,
            retrying: None,
            model: model.into(),
            model_override: None,
            model_default: model.into(),
            context_window_tokens: window,
            context_tokens: None,
            context_percent: None,
            unread: 0,
            inflight: None,
            status_text: String::new(),
            session_id: None,
            last_outcome: None,
            mcp_start_failures: BTreeMap::new(),
        };
        Bus {
            inner: Arc::new(Mutex::new(Inner {
                next_id: 1,
                history: VecDeque::new(),
                sizes: VecDeque::new(),
                history_bytes: 0,
                subscribers: Vec::new(),
                state,
                log: None,
                rate_limited_since: None,
                rate_limited_before: std::time::Duration::ZERO,
                pause_since: None,
                pauses: BTreeMap::new(),
                turn_ends: BTreeMap::new(),
            })),
        }
    }

    /// Offers every later event but state changes to the turn log, and
    /// numbers them from `next_id` (the log's, so ids go on across restarts).
    /// Called before the first event.
    pub fn log_to(&self, tap: Tap<LiveEvent>, next_id: u64) {
        let mut inner = self.lock();
        inner.next_id = inner.next_id.max(next_id);
        inner.log = Some(tap);
    }

    /// The turn log's id of the turn of message `message_id`, once its
    /// writer committed it (None before, or without a turn log).
    pub fn history_turn(&self, message_id: i64) -> Option<i64> {
        self.lock().log.as_ref()?.turn_of(message_id)
    }

    /// Stops offering events to the turn log: its tap and the newest id.
    pub fn end_history(&self) -> Option<(Tap<LiveEvent>, u64)> {
        let mut inner = self.lock();
        let last = inner.next_id - 1;
        inner.log.take().map(|tap| (tap, last))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves plain data behind; keep serving it.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes an event: numbered, kept in the ring, offered to every
    /// subscriber without waiting.
    pub fn emit(&self, event: LiveEvent) {
        let size = match &event {
            LiveEvent::Stream { value } => serde_json::to_string(value).map_or(0, |s| s.len()),
            _ => 256,
        };
        let mut inner = self.lock();
        let n = Numbered {
            id: inner.next_id,
            event,
        };
        inner.next_id += 1;
        if let LiveEvent::TurnEnd {
            outcome, decision, ..
        } = &n.event
        {
            let key = (
                crate::proto::TurnOutcomeKind::from_stored(outcome)
                    .0
                    .as_str()
                    .to_string(),
                crate::http::prometheus::decision_kind(decision.as_deref()).to_string(),
            );
            *inner.turn_ends.entry(key).or_default() += 1;
        }
        if let Some(tap) = inner.log.as_mut() {
            if !matches!(n.event, LiveEvent::State { .. }) {
                tap.offer(n.id, n.event.clone());
            }
        }
        inner.subscribers.retain(|s| match s.try_send(n.clone()) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                log::info!("dropping an SSE subscriber that fell {SUBSCRIBER_QUEUE} events behind");
                false
            }
            Err(TrySendError::Disconnected(_)) => false,
        });
        inner.history.push_back(n);
        inner.sizes.push_back(size);
        inner.history_bytes += size;
        while inner.history.len() > HISTORY
            || (inner.history_bytes > HISTORY_BYTES && inner.history.len() > 1)
        {
            inner.history.pop_front();
            let dropped = inner.sizes.pop_front().unwrap_or(0);
            inner.history_bytes -= dropped;
        }
    }

    pub fn note(&self, text: impl Into<String>) {
        self.emit(LiveEvent::Note { text: text.into() });
    }

    /// Events after `last_id` still in the ring, and a receiver for every later
    /// one — taken under one lock, so nothing falls between them.
    pub fn subscribe(&self, last_id: Option<u64>) -> (Vec<Numbered>, Receiver<Numbered>) {
        let (tx, rx) = bounded(SUBSCRIBER_QUEUE);
        let mut inner = self.lock();
        let replay = inner
            .history
            .iter()
            .filter(|n| last_id.is_none_or(|l| n.id > l))
            .cloned()
            .collect();
        inner.subscribers.push(tx);
        (replay, rx)
    }

    /// The id of the newest event so far (0 before the first). A client that
    /// claims a higher one saw an earlier run of the harness.
    pub fn last_id(&self) -> u64 {
        self.lock().next_id - 1
    }

    pub fn subscriber_count(&self) -> usize {
        self.lock().subscribers.len()
    }

    pub fn snapshot(&self) -> StateSnapshot {
        self.lock().state.clone()
    }

    /// The pause alone, without copying the rest of the state.
    pub fn paused(&self) -> Option<Paused> {
        self.lock().state.paused.clone()
    }

    /// Changes the state with `f` and, when anything changed, publishes it.
    pub fn update(&self, f: impl FnOnce(&mut StateSnapshot)) {
        let changed = {
            let mut inner = self.lock();
            let before = inner.state.clone();
            f(&mut inner.state);
            let s = &mut inner.state;
            s.context_percent = s
                .context_tokens
                .filter(|_| s.context_window_tokens > 0)
                .map(|t| (t as f64 * 1000.0 / s.context_window_tokens as f64).round() / 10.0);
            match (inner.rate_limited_since, inner.state.rate_limited) {
                (None, true) => inner.rate_limited_since = Some(std::time::Instant::now()),
                (Some(since), false) => {
                    inner.rate_limited_before += since.elapsed();
                    inner.rate_limited_since = None;
                }
                _ => {}
            }
            let reason = inner
                .state
                .paused
                .as_ref()
                .map(|p| crate::http::prometheus::pause_kind(p.reason.as_str()).to_string());
            if inner.pause_since.as_ref().map(|(r, _)| r) != reason.as_ref() {
                if let Some((r, since)) = inner.pause_since.take() {
                    inner.pauses.entry(r).or_default().1 += since.elapsed();
                }
                if let Some(r) = reason {
                    inner.pauses.entry(r.clone()).or_default().0 += 1;
                    inner.pause_since = Some((r, std::time::Instant::now()));
                }
            }
            (inner.state != before).then(|| Box::new(inner.state.clone()))
        };
        if let Some(state) = changed {
            self.emit(LiveEvent::State { state });
        }
    }

    /// Seconds the state said rate-limited since the bus was made.
    pub fn rate_limited_seconds(&self) -> f64 {
        let inner = self.lock();
        (inner.rate_limited_before
            + inner
                .rate_limited_since
                .map(|s| s.elapsed())
                .unwrap_or_default())
        .as_secs_f64()
    }

    /// The turn ends and pauses counted since the bus was made.
    pub fn counted(&self) -> Counted {
        let inner = self.lock();
        let mut pauses: BTreeMap<String, (u64, std::time::Duration)> = inner.pauses.clone();
        if let Some((r, since)) = &inner.pause_since {
            pauses.entry(r.clone()).or_default().1 += since.elapsed();
        }
        Counted {
            turn_ends: inner
                .turn_ends
                .iter()
                .map(|((o, d), n)| (o.clone(), d.clone(), *n))
                .collect(),
            pauses: pauses
                .into_iter()
                .map(|(r, (n, d))| (r, n, d.as_secs_f64()))
                .collect(),
            paused: inner.pause_since.as_ref().map(|(r, _)| r.clone()),
        }
    }

    pub fn set_turn_state(&self, t: TurnState) {
        self.update(|s| {
            if s.turn_state != t {
                s.turn_state = t;
                s.turn_state_since = now();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_limited_clock_adds_up_the_time_the_state_said_so() {
        let bus = Bus::new("a", "a", "haiku", 200_000);
        assert_eq!(bus.rate_limited_seconds(), 0.0);
        bus.update(|s| s.rate_limited = true);
        std::thread::sleep(std::time::Duration::from_millis(30));
        bus.update(|s| s.rate_limited = false);
        let s = bus.rate_limited_seconds();
        assert!(s >= 0.03, "{s}");
        bus.note("other events do not count");
        std::thread::sleep(std::time::Duration::from_millis(10));
        assert_eq!(bus.rate_limited_seconds(), s);
    }

    #[test]
    fn turn_ends_and_pauses_are_counted_by_closed_labels() {
        let bus = Bus::new("a", "a", "haiku", 200_000);
        let end = |outcome: &str, decision: Option<&str>| LiveEvent::TurnEnd {
            ok: outcome == "ok",
            note: String::new(),
            outcome: outcome.into(),
            duration_ms: 1,
            decision: decision.map(str::to_string),
        };
        bus.emit(end("ok", Some("ack")));
        bus.emit(end("ok", Some("ack")));
        bus.emit(end(
            "failed: claude exited with code 1",
            Some("keep behind, counted; 30 s"),
        ));
        bus.emit(end("stopped", None));
        let paused = |reason: &str| Paused {
            reason: PauseReason::parse(reason),
            until: None,
            detail: String::new(),
        };
        bus.update(|s| s.paused = Some(paused("rate_limit")));
        std::thread::sleep(std::time::Duration::from_millis(30));
        bus.update(|s| s.paused = Some(paused("budget")));
        bus.update(|s| s.paused = None);
        bus.update(|s| s.paused = Some(paused("a_newer_reason")));
        let c = bus.counted();
        assert_eq!(
            c.turn_ends,
            [
                ("failed".to_string(), "keep".to_string(), 1),
                ("ok".into(), "ack".into(), 2),
                ("stopped".into(), "none".into(), 1),
            ]
        );
        let reasons: Vec<(&str, u64)> = c.pauses.iter().map(|(r, n, _)| (r.as_str(), *n)).collect();
        assert_eq!(reasons, [("budget", 1), ("other", 1), ("rate_limit", 1)]);
        let rate_limited = c.pauses.iter().find(|p| p.0 == "rate_limit").unwrap().2;
        assert!(rate_limited >= 0.03, "{rate_limited}");
        assert_eq!(c.paused.as_deref(), Some("other"));
    }

    #[test]
    fn replay_then_live_without_gaps_or_duplicates() {
        let bus = Bus::new("a", "a", "haiku", 200_000);
        for i in 0..5 {
            bus.note(format!("n{i}"));
        }
        let (replay, rx) = bus.subscribe(Some(3));
        assert_eq!(replay.iter().map(|n| n.id).collect::<Vec<_>>(), [4, 5]);
        bus.note("live");
        assert_eq!(rx.try_recv().unwrap().id, 6);
        assert!(replay[0].to_json().contains(r#""id":4"#));
    }

    #[test]
    fn the_ring_is_bounded_by_bytes_as_well_as_count() {
        let bus = Bus::new("a", "a", "haiku", 200_000);
        let big = Value::String("x".repeat(1024 * 1024));
        for _ in 0..40 {
            bus.emit(LiveEvent::Stream { value: big.clone() });
        }
        let (replay, _) = bus.subscribe(None);
        assert!(
            replay.len() <= HISTORY_BYTES / (1024 * 1024) + 1,
            "{}",
            replay.len()
        );
        assert_eq!(replay.last().unwrap().id, 40, "the newest are kept");
    }

    #[test]
    fn a_subscriber_that_never_reads_is_dropped_not_waited_on() {
        let bus = Bus::new("a", "a", "haiku", 200_000);
        let (_, slow) = bus.subscribe(None);
        for i in 0..(SUBSCRIBER_QUEUE + 10) {
            bus.note(format!("{i}"));
        }
        assert_eq!(bus.subscriber_count(), 0);
        assert_eq!(slow.len(), SUBSCRIBER_QUEUE);
    }

    #[test]
    fn state_changes_are_published_with_percent() {
        let bus = Bus::new("a", "a", "haiku", 200_000);
        let (_, rx) = bus.subscribe(None);
        bus.update(|s| s.context_tokens = Some(50_000));
        let ev = rx.try_recv().unwrap();
        let LiveEvent::State { state } = ev.event else {
            panic!("not a state event")
        };
        assert_eq!(state.context_percent, Some(25.0));
        bus.update(|s| s.context_tokens = Some(50_000));
        assert!(rx.try_recv().is_err(), "no event when nothing changed");
    }
}
