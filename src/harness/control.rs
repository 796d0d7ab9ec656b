//! What the outside (the web UI) may ask of a running harness, and the shared
//! handle it asks through. Everything that touches the turn loop's state —
//! compaction, interrupting a turn, a stored login, a new model — travels as
//! [`Control`] on a channel the loop selects on in every phase, so the loop
//! stays the only writer of turn state and a compaction queues behind a
//! running turn instead of starting a second claude process. The persisted
//! model choice and the one-shot new-session flag are plain shared values the
//! loop reads when it starts a run.

use super::bus::{Bus, Numbered, TurnState};
use super::settings::{check_model, Settings};
use super::{files, login, stats};
use crate::web::harness as web;
use crossbeam_channel::{Receiver, Sender};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A request for the turn loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// Run `/compact` on the session (after the running turn, if any).
    Compact,
    /// Stop the running turn: SIGINT to claude, then its process group.
    Interrupt,
    /// The operator stored credentials; end a login park.
    LoginStored,
    /// The operator chose this model (already persisted) for the next turn.
    Model(String),
}

/// The model for the next turn: the persisted choice, else the default.
pub fn model(settings: &Settings) -> String {
    std::fs::read_to_string(&settings.model_file)
        .ok()
        .and_then(|s| check_model(&s).ok())
        .unwrap_or_else(|| settings.default_model.clone())
}

/// The handle the web UI holds.
#[derive(Clone)]
pub struct Shared {
    pub bus: Bus,
    pub control: Sender<Control>,
    pub settings: Arc<Settings>,
    skip_continue: Arc<AtomicBool>,
}

impl Shared {
    pub fn new(bus: Bus, control: Sender<Control>, settings: Arc<Settings>) -> Shared {
        Shared {
            bus,
            control,
            settings,
            skip_continue: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The model for the next turn: the persisted choice, else the default.
    pub fn model(&self) -> String {
        model(&self.settings)
    }

    /// Persists the operator's model choice and tells the loop, which shows it
    /// and uses it from the next turn on.
    pub fn set_model(&self, name: &str) -> Result<String, String> {
        let name = check_model(name)?;
        let path = &self.settings.model_file;
        files::write_private(path, format!("{name}\n").as_bytes())
            .map_err(|e| format!("cannot save the model to {}: {e}", path.display()))?;
        self.send(Control::Model(name.clone()));
        Ok(name)
    }

    /// Arms the one-shot flag: the next claude invocation drops `--continue`.
    pub fn request_new_session(&self) {
        self.skip_continue.store(true, Ordering::SeqCst);
        self.bus
            .note("the next turn starts a new session (no --continue)");
    }

    /// Takes the one-shot flag (true once per request).
    pub fn take_skip_continue(&self) -> bool {
        self.skip_continue.swap(false, Ordering::SeqCst)
    }

    /// Asks the turn loop for something; false when the loop is gone.
    pub fn send(&self, c: Control) -> bool {
        self.control.send(c).is_ok()
    }
}

/// The web page's handle on this harness (`web::harness`).
impl crate::web::harness::Harness for Shared {
    type Event = super::bus::Numbered;

    fn state_dir(&self) -> &Path {
        &self.settings.state_dir
    }

    fn broker(&self) -> &crate::proto::Dial {
        &self.settings.broker
    }

    fn state(&self) -> serde_json::Value {
        serde_json::to_value(self.bus.snapshot()).unwrap_or_default()
    }

    fn gauges(&self) -> web::Gauges {
        let s = self.bus.snapshot();
        web::Gauges {
            phase: match s.turn_state {
                TurnState::Idle => web::TurnPhase::Idle,
                TurnState::Thinking => web::TurnPhase::Thinking,
                TurnState::Compacting => web::TurnPhase::Compacting,
            },
            unread: s.unread,
            inflight: s.inflight.is_some(),
            rate_limited: s.rate_limited,
            rate_limited_seconds: self.bus.rate_limited_seconds(),
            needs_login: s.needs_login,
            online: s.online,
            context_window_tokens: s.context_window_tokens,
            context_tokens: s.context_tokens,
            mcp_start_failures: super::classify::CORE_MCP_SERVERS
                .iter()
                .map(|server| {
                    let n = s.mcp_start_failures.get(*server).copied().unwrap_or(0);
                    (server.to_string(), n)
                })
                .collect(),
        }
    }

    fn subscribe(&self, after: Option<u64>) -> (Vec<Numbered>, Receiver<Numbered>) {
        self.bus.subscribe(after)
    }

    fn last_event_id(&self) -> u64 {
        self.bus.last_id()
    }

    fn event_id(event: &Numbered) -> u64 {
        event.id
    }

    fn event_json(event: &Numbered) -> String {
        event.to_json()
    }

    fn set_model(&self, name: &str) -> Result<String, String> {
        Shared::set_model(self, name)
    }

    fn new_session(&self) {
        self.request_new_session()
    }

    fn ask(&self, ask: web::Ask) -> bool {
        self.send(match ask {
            web::Ask::Compact => Control::Compact,
            web::Ask::Interrupt => Control::Interrupt,
        })
    }

    fn login_state(&self) -> web::LoginState {
        web::LoginState {
            needs_login: self.bus.snapshot().needs_login,
            stored_token: login::stored_token(&self.settings).is_some(),
            credentials_available: login::credentials_available(&self.settings),
        }
    }

    fn store_login(&self, token: &str) -> Result<Option<String>, String> {
        login::check_token_shape(token)?;
        log::info!("checking a token the operator gave on the web page");
        let warning = match login::verify_token(&self.settings, token.trim()) {
            Ok(login::Verdict::Accepted) => None,
            Ok(login::Verdict::Unverified(w)) => Some(w),
            Err(refused) => {
                log::warn!("the token given on the web page was refused; not stored");
                self.bus.note(refused.clone());
                return Err(refused);
            }
        };
        login::store_token(&self.settings, token)?;
        match &warning {
            None => log::info!("the operator stored claude credentials through the web page"),
            Some(w) => log::warn!("stored the credentials given on the web page unverified: {w}"),
        }
        self.bus.note(match &warning {
            None => "credentials checked and stored through the web page".to_string(),
            Some(w) => format!("credentials stored through the web page; {w}"),
        });
        self.send(Control::LoginStored);
        Ok(warning)
    }

    fn recent_turns(&self, limit: u32) -> Result<serde_json::Value, String> {
        let rows = stats::recent(&self.settings.stats_db(), limit)?;
        Ok(serde_json::to_value(rows).unwrap_or_default())
    }

    fn turn_totals(&self) -> Result<Vec<web::TurnTotals>, String> {
        let totals = stats::totals(&self.settings.stats_db())?;
        Ok(totals
            .into_iter()
            .map(|t| web::TurnTotals {
                kind: t.kind,
                outcome: t.outcome,
                count: t.count,
                duration_ms: t.duration_ms,
                tokens_in: t.tokens_in,
                tokens_out: t.tokens_out,
                cost_usd: t.cost_usd,
            })
            .collect())
    }
}
