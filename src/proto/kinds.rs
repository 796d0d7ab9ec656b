//! The closed vocabularies of the broker's rows and answers: message kinds and
//! states, approval kinds and states, what `cancel_loose_end` cancels, and the
//! supervision state of an agent. Kinds and states that rows of an older or
//! newer release may hold are open (an unknown value is `Other`); what a client
//! asks for is closed (an unknown value is refused).

use super::enums::{closed_enum, open_enum};

open_enum! {
    /// What a message is: ordinary mail, or a system event.
    pub enum MsgKind {
        /// Mail from an agent, the operator or a script.
        Message = "message",
        /// The harness (re)started: the first message of every start.
        Kick = "kick",
        /// A question addressed to the recipient.
        QuestionAsked = "question_asked",
        /// The answer to the recipient's question (or its expiry or withdrawal).
        QuestionAnswered = "question_answered",
        /// A question to the recipient was withdrawn by its asker.
        QuestionCancelled = "question_cancelled",
        /// A reminder the recipient set fired.
        Reminder = "reminder",
        /// A scheduled prompt of the recipient fired.
        Scheduled = "scheduled",
        /// An agent asks the operator to approve a change.
        ApprovalRequested = "approval_requested",
        /// The operator decided the recipient's approval.
        ApprovalDecided = "approval_decided",
        /// crash_watch: an agent needs a login.
        NeedsLogin = "needs_login",
        /// crash_watch: an agent logged in again.
        LoggedIn = "logged_in",
        /// crash_watch: an agent runs an old binary or fleet entry; or the
        /// broker, to the operator: an agent's harness (or bash daemon)
        /// reports on its socket though it has a credential (issue 40).
        NeedsUpdate = "needs_update",
        /// crash_watch: an agent runs the current versions again.
        Rebuilt = "rebuilt",
        /// A message was dead-lettered (to the recipient's parent and to its
        /// sender, when that is an agent).
        DeadLetter = "dead_letter",
        /// Mail the recipient sent to another hive could not be delivered
        /// there (no such agent, or the homeserver refused it).
        Undeliverable = "undeliverable",
        /// A credential pool hit its usage limit (once per pool and window).
        UsageLimit = "usage_limit",
        /// A budget passed 80 % or was reached (once per scope, window and
        /// level).
        Budget = "budget",
        /// `hive up` found a Claude Code CLI outside the supported window
        /// (once per hive and version).
        CliVersion = "cli_version",
        /// An agent went over its storage quota (once, until pruning brings
        /// it back under) or passed its limit of a minute (at most once an
        /// hour): its sends and wakes are refused.
        Quota = "quota",
        /// What became of a message the recipient sent with `receipt: true`
        /// (issue 43): its `message_state` line. It wakes nothing: it waits
        /// for the recipient's next turn or `recv` and is not unread.
        Receipt = "receipt",
    }
}

open_enum! {
    /// Where a stored message is in its life.
    pub enum MsgState {
        /// Waiting in the recipient's inbox.
        Queued = "queued",
        /// Handed to the recipient's harness for a turn (`recv_next`).
        Inflight = "inflight",
        /// Handed out by `recv` on a connection that has not confirmed it.
        Held = "held",
        /// Done.
        Acked = "acked",
        /// Dead-lettered: it failed the harness's attempt limit for reasons
        /// of its own. Kept until the operator retries it (`retry`).
        Failed = "failed",
    }
}

open_enum! {
    /// What an approval would change.
    pub enum ApprovalKind {
        /// A new child agent.
        Spawn = "spawn",
        /// A merge patch of an agent's fleet-file entry.
        ApplyCommit = "apply_commit",
    }
}

open_enum! {
    /// Where an approval is in its life.
    pub enum ApprovalState {
        Pending = "pending",
        Approved = "approved",
        Denied = "denied",
        /// Withdrawn by its requester (or its root agent).
        Cancelled = "cancelled",
    }
}

open_enum! {
    /// An agent as the supervisor of `hive up` sees it.
    pub enum AgentPhase {
        Running = "running",
        Stopping = "stopping",
        Stopped = "stopped",
        /// In crash backoff, starting again soon.
        Restarting = "restarting",
        /// Restarting onto the current binary and fleet entry.
        Rebuilding = "rebuilding",
        /// Taken out of the fleet file (`hive reload`): stopped, its mail
        /// kept until `hive forget`.
        Removed = "removed",
    }
}

open_enum! {
    /// Why a harness waits before its next message runs (`report_state`,
    /// `agents`, the agent page's `paused`). Open: a newer harness may report
    /// a reason this broker does not know, and it is shown as it is.
    pub enum PauseReason {
        /// A rate limit of this agent alone (no reset time known).
        RateLimit = "rate_limit",
        /// Its credential pool's usage limit, until the reset the CLI
        /// reported; set by the broker for every agent of the pool.
        UsageLimit = "usage_limit",
        /// Its own or the hive's budget is spent for the current window.
        Budget = "budget",
        /// The API is unavailable: backing off.
        ApiBackoff = "api_backoff",
        /// Parked until claude is logged in again.
        Login = "login",
        /// hive's MCP servers did not start.
        McpStart = "mcp_start",
        /// claude could not be started.
        StartFailed = "start_failed",
    }
}

impl PauseReason {
    /// The pauses the broker holds (a pool's usage limit, a budget) rather
    /// than the harness's own loop; one this release does not know is the
    /// broker's too (a newer broker's), shown as it is.
    pub fn held_by_broker(&self) -> bool {
        match self {
            PauseReason::UsageLimit | PauseReason::Budget | PauseReason::Other(_) => true,
            PauseReason::RateLimit
            | PauseReason::ApiBackoff
            | PauseReason::Login
            | PauseReason::McpStart
            | PauseReason::StartFailed => false,
        }
    }

    /// The harness's pause is a rate or usage limit: `/api/state` also sets
    /// the older `rate_limited` and `rate_limited_until` for it.
    pub fn is_rate_limit(&self) -> bool {
        match self {
            PauseReason::RateLimit | PauseReason::UsageLimit => true,
            PauseReason::Budget
            | PauseReason::ApiBackoff
            | PauseReason::Login
            | PauseReason::McpStart
            | PauseReason::StartFailed
            | PauseReason::Other(_) => false,
        }
    }
}

closed_enum! {
    /// Whether a requeued hand-out counts toward the harness's attempt limit
    /// (`requeue_inflight`). The default is what older harnesses, which say
    /// nothing, mean.
    #[derive(Default)]
    pub enum Attempt ("attempt", "values") {
        /// The failure was the message's own: the hand-out stays counted.
        Counted = "counted",
        /// A pause, a limit, a stop of the harness: the hand-out is given back.
        #[default]
        NotCounted = "not_counted",
    }
}

closed_enum! {
    /// Where a requeued message goes back into its inbox (`requeue_inflight`).
    #[derive(Default)]
    pub enum Place ("place", "places") {
        /// At the head: it runs next, queue order is kept.
        #[default]
        Head = "head",
        /// Behind the mail queued from other senders (with the later mail of
        /// its own sender behind it), so it cannot hold up the inbox.
        Behind = "behind",
    }
}

closed_enum! {
    /// What `cancel_loose_end` closes.
    pub enum LooseEndKind ("loose-end kind", "kinds") {
        Question = "question",
        Reminder = "reminder",
        Approval = "approval",
        /// A scheduled prompt (`schedule_prompt`); needs the `scheduling` group.
        Scheduled = "scheduled",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_enums_keep_unknown_values_and_closed_ones_name_the_known() {
        assert_eq!(MsgKind::parse("kick"), MsgKind::Kick);
        assert_eq!(
            MsgKind::parse("teleport"),
            MsgKind::Other("teleport".into())
        );
        let j = serde_json::to_string(&MsgKind::Other("teleport".into())).unwrap();
        assert_eq!(j, "\"teleport\"");
        assert_eq!(
            serde_json::from_str::<MsgState>("\"archived\"").unwrap(),
            MsgState::Other("archived".into())
        );
        assert_eq!(MsgState::parse("failed"), MsgState::Failed);
        assert_eq!(AgentPhase::Running, "running");
        for k in MsgKind::KNOWN {
            assert_eq!(MsgKind::parse(k).as_str(), *k);
        }
        let e = serde_json::from_str::<LooseEndKind>("\"task\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "unknown loose-end kind \"task\"; known kinds: question, reminder, approval, scheduled"
            ),
            "{e}"
        );
        assert_eq!(LooseEndKind::ALL.len(), 4);
    }

    /// The pause reasons are one vocabulary: the harness's `/api/state`,
    /// `report_state`, `agents`, the agent page and the dashboard. The pages
    /// are JavaScript, so this reads them: every reason they compare against
    /// is a known one, the page has words for every reason it shows, and the
    /// dashboard offers Resume for exactly the ones `hive resume` lifts.
    #[test]
    fn the_pages_know_every_pause_reason_and_no_other() {
        assert_eq!(
            PauseReason::KNOWN,
            [
                "rate_limit",
                "usage_limit",
                "budget",
                "api_backoff",
                "login",
                "mcp_start",
                "start_failed"
            ]
        );
        let page = include_str!("../web/page.html");
        let dashboard = include_str!("../fleet/dashboard.html");
        for (file, text) in [("page.html", page), ("dashboard.html", dashboard)] {
            for op in ["reason === \"", "reason !== \""] {
                for rest in text.split(op).skip(1) {
                    let named = rest.split('"').next().unwrap_or_default();
                    assert!(
                        PauseReason::KNOWN.contains(&named),
                        "{file} compares a pause reason with {named:?}, which is not one"
                    );
                }
            }
        }
        for r in PauseReason::KNOWN {
            // The login park shows the login form, not a badge.
            let worded = page.contains(&format!("reason === \"{r}\""))
                || page.contains(&format!(" {r}: \""));
            assert!(*r == "login" || worded, "page.html has no words for {r}");
        }
        let liftable = dashboard
            .split("const LIFTABLE = [")
            .nth(1)
            .and_then(|r| r.split(']').next())
            .unwrap_or_default();
        let liftable: Vec<&str> = liftable
            .split(',')
            .map(|s| s.trim().trim_matches('"'))
            .collect();
        let lifted: Vec<&str> = PauseReason::KNOWN
            .iter()
            .copied()
            .filter(|r| !matches!(*r, "budget" | "login"))
            .collect();
        let mut sorted = liftable.clone();
        sorted.sort_unstable();
        let mut want = lifted.clone();
        want.sort_unstable();
        assert_eq!(sorted, want, "the dashboard's LIFTABLE");
    }
}
