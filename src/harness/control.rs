//! What the outside (the web UI) may ask of a running harness, and the shared
//! handle it asks through. Everything that touches the turn loop's state —
//! compaction, interrupting a turn, a stored login, a new model — travels as
//! [`Control`] on a channel the loop selects on in every phase, so the loop
//! stays the only writer of turn state and a compaction queues behind a
//! running turn instead of starting a second claude process. The persisted
//! model choice and the one-shot new-session flag are plain shared values the
//! loop reads when it starts a run.

use super::bus::Bus;
use super::files;
use super::settings::{check_model, Settings};
use crossbeam_channel::Sender;
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
