//! What the outside (the web UI) may ask of a running harness, and the shared
//! handle it asks through. Everything that touches the turn loop's state —
//! compaction, interrupting a turn, a stored login, a new model — travels as
//! [`Control`] on a channel the loop selects on in every phase, so the loop
//! stays the only writer of turn state and a compaction queues behind a
//! running turn instead of starting a second claude process. The page's
//! model choice is the broker's to keep (`model`, outside the agent's
//! sandbox), asked for when a run starts; the one-shot new-session flag is a
//! plain shared value the loop reads when it starts a run.

use super::bus::{Bus, Numbered, TurnState};
use super::settings::{check_model, Settings};
use super::{login, stats};
use crate::proto::cmd::ModelOverride;
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

/// The model a harness starts with, before it asked the broker: the
/// configured default.
pub fn model(settings: &Settings) -> String {
    settings.default_model.clone()
}

/// A model choice an older release kept in a file (`STATE/hyperhive-model`,
/// `/harness/hyperhive-model` or `HYPERHIVE_MODEL_FILE`), taken over once at
/// start: moved into the broker from a file the agent cannot write (outside
/// its state dir), dropped with a note from one it can (it may have written
/// it). The file goes either way; the broker keeps the override from now on.
pub fn take_over_model_file(shared: &Shared) {
    let s = &shared.settings;
    let Ok(text) = std::fs::read_to_string(&s.model_file) else {
        return;
    };
    let _ = std::fs::remove_file(&s.model_file);
    let Ok(name) = check_model(&text) else {
        return;
    };
    if s.model_file.starts_with(&s.state_dir) {
        let note = format!(
            "an older release's model choice ({name}) was in {}, which the agent can write: \
             it is not taken over; choose it again with /model {name}",
            s.model_file.display()
        );
        log::warn!("{note}");
        shared.bus.note(note);
    } else if let Err(e) = shared.set_model(&name) {
        log::warn!(
            "cannot take over the model choice {name} of {}: {e}",
            s.model_file.display()
        );
    }
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

    /// The model for the next turn: the page's override the broker keeps,
    /// else the configured default (also when the broker cannot be asked:
    /// no turn runs without it anyway).
    pub fn model(&self) -> String {
        let default = self.settings.default_model.clone();
        match self.ask_model(None, false) {
            Ok(over) => over.unwrap_or(default),
            Err(e) => {
                log::debug!("the model override could not be read ({e}); the default runs");
                default
            }
        }
    }

    /// Asks the broker (through the harness's own connection) for the
    /// override, setting or clearing it on the way; shows the answer on the
    /// page, and says so when a change of the configured default ended one.
    fn ask_model(&self, set: Option<&str>, clear: bool) -> Result<Option<String>, String> {
        let default = self.settings.default_model.clone();
        let req = ModelOverride {
            default: default.clone(),
            set: set.map(str::to_string),
            clear,
        };
        let r = self
            .settings
            .broker
            .connect()
            .and_then(|mut c| c.call(&req))
            .map_err(|e| e.to_string())?;
        if let Some(old) = &r.cleared {
            self.bus.note(format!(
                "the configured model is now {default}: the page's override {old} is cleared"
            ));
        }
        let over = r.model_override.clone();
        self.bus.update(|s| {
            s.model_override = over.clone();
            s.model_default = default.clone();
            s.model = over.clone().unwrap_or_else(|| default.clone());
        });
        Ok(r.model_override)
    }

    /// The operator's model choice on the page: kept by the broker as the
    /// agent's override (against the configured default), then the loop is
    /// told, which shows it and uses it from the next turn on.
    pub fn set_model(&self, name: &str) -> Result<String, String> {
        let name = check_model(name)?;
        self.ask_model(Some(&name), false)
            .map_err(|e| format!("cannot keep the model choice: {e}"))?;
        self.send(Control::Model(name.clone()));
        Ok(name)
    }

    /// `/model --fleet`: the override ends and the configured default runs.
    pub fn clear_model(&self) -> Result<String, String> {
        self.ask_model(None, true)
            .map_err(|e| format!("cannot clear the model choice: {e}"))?;
        let default = self.settings.default_model.clone();
        self.send(Control::Model(default.clone()));
        Ok(default)
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
            counted: self.bus.counted(),
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

    fn clear_model(&self) -> Result<String, String> {
        Shared::clear_model(self)
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
                cache_read: t.cache_read,
                cache_creation: t.cache_creation,
                cost_usd: t.cost_usd,
            })
            .collect())
    }
}
