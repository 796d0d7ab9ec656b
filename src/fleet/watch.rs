//! crash_watch: the per-agent state axes (running, logged in, up to date) and the
//! events their transitions emit to the agent's manager. Pure: the supervisor
//! measures the axes on every watch tick and feeds them here. The first
//! observation only seeds, so nothing fires at boot for an agent that is already
//! in its state.

/// One observation of an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Axes {
    pub running: bool,
    /// Claude credentials present (a credentials file in its `CLAUDE_CONFIG_DIR`,
    /// a token stored through its page, or a key in its environment), and its
    /// harness has not reported to the broker that claude needs a login (an
    /// expired or refused credential).
    pub logged_in: bool,
    /// The recorded binary and config revision match the current ones.
    pub up_to_date: bool,
}

/// An event for the manager's inbox; its `kind` is the message kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchEvent {
    NeedsLogin,
    LoggedIn,
    NeedsUpdate,
    Rebuilt,
}

impl WatchEvent {
    pub fn kind(self) -> &'static str {
        match self {
            WatchEvent::NeedsLogin => "needs_login",
            WatchEvent::LoggedIn => "logged_in",
            WatchEvent::NeedsUpdate => "needs_update",
            WatchEvent::Rebuilt => "rebuilt",
        }
    }

    /// The message for the manager; `to_operator` when that is the operator
    /// (a root agent's events), who acts from the shell or the dashboard.
    pub fn body(self, agent: &str, to_operator: bool) -> String {
        match self {
            WatchEvent::NeedsLogin => format!(
                "[needs_login] {agent} needs a claude login (it has no credentials, or they were \
                 refused); the operator must log it in on its page (a token from `claude \
                 setup-token`) or give it ANTHROPIC_API_KEY"
            ),
            WatchEvent::LoggedIn => format!("[logged_in] {agent} has claude credentials again"),
            WatchEvent::NeedsUpdate if to_operator => format!(
                "[needs_update] {agent} runs an older binary or config than the current one; \
                 run `hive update {agent}` (or press Update on its card on the dashboard) to \
                 restart it onto the current ones"
            ),
            WatchEvent::NeedsUpdate => format!(
                "[needs_update] {agent} runs an older binary or config than the current one; \
                 mcp__hyperhive__update(name=\"{agent}\") restarts it onto the current ones"
            ),
            WatchEvent::Rebuilt => format!("[rebuilt] {agent} runs the current binary and config"),
        }
    }
}

/// The last observation of one agent.
#[derive(Debug, Default)]
pub struct Watch {
    last: Option<Axes>,
}

impl Watch {
    /// Records `now` and returns the events its transitions emit.
    pub fn observe(&mut self, now: Axes) -> Vec<WatchEvent> {
        let Some(last) = self.last.replace(now) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if last.logged_in && !now.logged_in {
            out.push(WatchEvent::NeedsLogin);
        }
        if !last.logged_in && now.logged_in {
            out.push(WatchEvent::LoggedIn);
        }
        if last.up_to_date && !now.up_to_date {
            out.push(WatchEvent::NeedsUpdate);
        }
        // Back to current only counts once the agent runs on it.
        if !last.up_to_date && now.up_to_date && now.running {
            out.push(WatchEvent::Rebuilt);
        }
        if !now.running && !last.up_to_date && now.up_to_date {
            // Not running yet: keep it stale until it runs, so Rebuilt fires then.
            self.last = Some(Axes {
                up_to_date: false,
                ..now
            });
        }
        out
    }

    pub fn last(&self) -> Option<Axes> {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn axes(running: bool, logged_in: bool, up_to_date: bool) -> Axes {
        Axes {
            running,
            logged_in,
            up_to_date,
        }
    }

    #[test]
    fn the_operator_is_told_the_command_a_manager_the_tool() {
        let op = WatchEvent::NeedsUpdate.body("pal", true);
        assert!(op.contains("run `hive update pal`"), "{op}");
        let boss = WatchEvent::NeedsUpdate.body("kid", false);
        assert!(
            boss.contains("mcp__hyperhive__update(name=\"kid\")"),
            "{boss}"
        );
    }

    #[test]
    fn transitions_fire_once_and_the_first_tick_only_seeds() {
        use WatchEvent::*;
        let steps: &[(Axes, &[WatchEvent])] = &[
            (axes(true, false, false), &[]),
            (axes(true, false, false), &[]),
            (axes(true, true, false), &[LoggedIn]),
            (axes(true, true, false), &[]),
            (axes(false, true, true), &[]),
            (axes(true, true, true), &[Rebuilt]),
            (axes(true, true, false), &[NeedsUpdate]),
            (axes(true, false, false), &[NeedsLogin]),
            (axes(true, false, false), &[]),
        ];
        let mut w = Watch::default();
        for (i, (a, want)) in steps.iter().enumerate() {
            assert_eq!(w.observe(*a), want.to_vec(), "step {i}");
        }
    }
}
