//! The page's narrow handle on the agent's harness: the [`Harness`] trait says
//! everything the web UI reads of the harness and asks of it, in the web's own
//! types, and `harness::control::Shared` implements it. So the web depends on
//! this file, never on the harness's internals; the harness, which starts the
//! web server, depends on the web. Every method answers from shared state or
//! queues a request for the turn loop: none waits for a turn.

use crossbeam_channel::Receiver;
use serde_json::Value;
use std::path::Path;

/// What the turn loop is doing, for the `hive_turn_state` gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnPhase {
    Idle,
    Thinking,
    Compacting,
}

impl TurnPhase {
    pub const ALL: [TurnPhase; 3] = [TurnPhase::Idle, TurnPhase::Thinking, TurnPhase::Compacting];

    pub fn name(self) -> &'static str {
        match self {
            TurnPhase::Idle => "idle",
            TurnPhase::Thinking => "thinking",
            TurnPhase::Compacting => "compacting",
        }
    }
}

/// The live numbers `/metrics` exports.
#[derive(Debug, Clone, PartialEq)]
pub struct Gauges {
    pub phase: TurnPhase,
    pub unread: u64,
    pub inflight: bool,
    pub rate_limited: bool,
    /// Seconds spent rate-limited since the harness started
    /// (`hive_rate_limited_seconds_total`).
    pub rate_limited_seconds: f64,
    pub needs_login: bool,
    pub online: bool,
    pub context_window_tokens: u64,
    pub context_tokens: Option<u64>,
    /// Turns stopped because one of hive's own MCP servers was not connected,
    /// by server (`hive_mcp_start_failures_total`): every such server is
    /// listed, those that never failed with 0.
    pub mcp_start_failures: Vec<(String, u64)>,
    /// The turn ends by outcome and decision and the pauses by reason the
    /// harness counted since it started (`hive_turn_decisions_total`,
    /// `hive_pauses_total`, `hive_paused_seconds_total`, `hive_paused`).
    pub counted: Counted,
}

/// What the harness counted since it started, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counted {
    /// (outcome kind, decision kind, turn ends).
    pub turn_ends: Vec<(String, String, u64)>,
    /// (reason, pauses entered, seconds paused), the pause in force counted
    /// up to now.
    pub pauses: Vec<(String, u64, f64)>,
    /// The reason of the pause in force.
    pub paused: Option<String>,
}

/// Sums over the recorded turns of one kind and outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnTotals {
    pub kind: String,
    pub outcome: String,
    pub count: u64,
    pub duration_ms: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// Cache reads, and cache writes (the budget's tokens less input and
    /// output).
    pub cache_read: u64,
    pub cache_creation: u64,
    pub cost_usd: f64,
}

/// What `/api/login` shows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoginState {
    pub needs_login: bool,
    pub stored_token: bool,
    pub credentials_available: bool,
}

/// A request for the turn loop, which runs it after the running turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Run `/compact` on the session.
    Compact,
    /// Stop the running turn.
    Interrupt,
}

/// The web UI's view of one harness.
pub trait Harness: Send + Sync + 'static {
    /// One event of the live stream.
    type Event: Send + 'static;

    /// The agent's state dir (the port file, the token file, the links file).
    fn state_dir(&self) -> &Path;
    /// The harness's way to the broker (the page's messages go there as
    /// wakes): its credential under isolated `hive up`, else the agent's
    /// socket.
    fn broker(&self) -> &crate::proto::Dial;
    /// The live state, as `GET /api/state` shows it.
    fn state(&self) -> Value;
    /// The live numbers of `/metrics`.
    fn gauges(&self) -> Gauges;
    /// The events after `after` still kept, and a subscription to the rest
    /// (which disconnects when the subscriber falls too far behind).
    fn subscribe(&self, after: Option<u64>) -> (Vec<Self::Event>, Receiver<Self::Event>);
    /// The newest event's id.
    fn last_event_id(&self) -> u64;
    /// An event's id.
    fn event_id(event: &Self::Event) -> u64;
    /// An event as one JSON object with its id, for SSE `data:`.
    fn event_json(event: &Self::Event) -> String;
    /// Sets the model for the next turn; the name as stored, or why not.
    fn set_model(&self, name: &str) -> Result<String, String>;
    /// Ends the page's model choice: the configured default runs again.
    fn clear_model(&self) -> Result<String, String>;
    /// The next turn starts a new session.
    fn new_session(&self);
    /// Queues `ask` for the turn loop; false when the loop is gone.
    fn ask(&self, ask: Ask) -> bool;
    fn login_state(&self) -> LoginState;
    /// Checks the operator's token (one claude run with it), stores it for
    /// claude and ends a wait for a login. `Ok` carries a warning when the
    /// check could not tell; `Err` says why it was refused (not stored).
    fn store_login(&self, token: &str) -> Result<Option<String>, String>;
    /// The newest `limit` recorded turns, newest first.
    fn recent_turns(&self, limit: u32) -> Result<Value, String>;
    /// Sums over every recorded turn, per kind and outcome.
    fn turn_totals(&self) -> Result<Vec<TurnTotals>, String>;
}
