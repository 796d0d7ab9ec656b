//! Why the broker hands an agent nothing now, in one place: its credential
//! pool's usage-limit park or the staggered resume after it (`pools.rs`
//! keeps the pools), its own or the hive's budget (`budgets.rs` keeps the
//! sums), and the pause its harness reported (`report_state`, kept while it
//! is connected) and a login it needs. `recv_next` asks [`Hub::broker_pause`]
//! before it hands anything out, `agents` shows [`Hub::shown_pause`], and
//! `resume` reads [`Pause`]. A new reason to hold an agent (a `hive pause`)
//! is one more arm here and one more [`PauseReason`].

use super::Hub;
use crate::proto::{PauseReason, Paused};

/// What an agent's pause is, as `resume` sees it.
pub(super) enum Pause {
    Login,
    /// The broker's: its pool's park (or its wait for its turn after one)
    /// or a budget.
    Broker(Paused),
    /// The harness's own wait, which it ends when told.
    Harness(Paused),
    /// A harness pause this release cannot lift (a reason it does not know,
    /// or the harness's copy of a broker pause that has ended).
    Other(Paused),
    None,
}

impl Hub<'_> {
    /// Why the broker hands `agent` nothing now, if it does not: its pool's
    /// park, else a budget.
    pub(super) fn broker_pause(&mut self, agent: &str) -> Option<Paused> {
        self.pool_pause(agent).or_else(|| self.budget_pause(agent))
    }

    /// The pause `agents` shows: the harness's own as it reported it, else
    /// the broker's (asked either way: a budget's check sets the hub's
    /// timer to the window's end).
    pub(super) fn shown_pause(&mut self, agent: &str) -> Option<Paused> {
        let broker = self.broker_pause(agent);
        self.paused.get(agent).cloned().or(broker)
    }

    pub(super) fn pause_of(&mut self, agent: &str) -> Pause {
        let own = self.paused.get(agent).cloned();
        if self.needs_login.contains(agent)
            || own.as_ref().is_some_and(|p| p.reason == PauseReason::Login)
        {
            return Pause::Login;
        }
        if let Some(p) = self.broker_pause(agent) {
            return Pause::Broker(p);
        }
        match own {
            Some(p) if harness_lifts(&p.reason) => Pause::Harness(p),
            Some(p) => Pause::Other(p),
            None => Pause::None,
        }
    }
}

/// The reasons a harness waits out by itself, which it ends when the
/// operator resumes it.
fn harness_lifts(r: &PauseReason) -> bool {
    matches!(
        r,
        PauseReason::RateLimit
            | PauseReason::ApiBackoff
            | PauseReason::McpStart
            | PauseReason::StartFailed
            | PauseReason::UsageLimit
    )
}
