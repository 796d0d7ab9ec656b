//! The lifecycle port, both ways: what the broker's hub asks of whoever
//! supervises the agents ([`LifecycleCmd`]), how it reads their logs
//! ([`LogTail`]), and what the supervisor tells the hub ([`FleetEvent`],
//! through the narrow [`FleetTx`]: the fleet never holds the hub's own
//! sender). `hive up`'s supervisor implements it
//! (it receives [`LifecycleCmd`]s and its log files implement [`LogTail`]); the
//! broker never imports the supervisor. Under plain `hive broker` there is no
//! supervisor, and the lifecycle tools answer an error saying so.

use crate::config::{AgentConfig, HiveConfig};
use crate::proto::access::Via;
use crate::proto::cmd::{History, HistoryReply, Search, SearchReply};
use crate::proto::AgentState;
use crossbeam_channel::Sender;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// The supervisor's answer to a command: a confirmation for the caller, or why not.
pub type Reply = Sender<Result<String, String>>;

/// What the hub (or `hive up`'s main) asks of the supervisor. Every command
/// carries its reply channel; the hub never waits on one itself (the wait runs
/// on the caller's job thread (`conn-job`)).
pub enum LifecycleCmd {
    /// Start a stopped agent now (also ends a crash backoff).
    Start { name: String, reply: Reply },
    /// Stop an agent and keep it stopped.
    Kill { name: String, reply: Reply },
    /// Stop and start again with the config it runs.
    Restart { name: String, reply: Reply },
    /// Restart onto the current binary and the fleet file's entry as the file
    /// says it now.
    Update { name: String, reply: Reply },
    /// Supervise a new or changed agent (an approved spawn or config change, a
    /// permissions save): start it, or restart it onto its changed entry when
    /// it runs (a stopped one stays stopped). `Err` means nothing changed.
    Apply { change: EntryChange, reply: Reply },
    /// Read the fleet file again and apply it whole (`hive reload`): start
    /// added agents, stop removed ones, restart changed ones once their turn
    /// ends, leave the others running. The answer says what it did; `Err`
    /// (a file that does not load) means nothing changed.
    Reload { reply: Reply },
    /// Update every agent whose binary or entry changed, at most `parallel`
    /// at a time, each after the one before has run its boot turn.
    UpdateAll { parallel: usize, reply: Reply },
    /// A notice, no answer: the broker forgot removed agent `name`
    /// (`hive forget`); the supervisor drops it too.
    Forget { name: String },
    /// A notice, no answer: what `name`'s harness just did, as the broker
    /// saw it. A restart onto a changed entry waits for `Idle`; `update
    /// --all` goes on once a started harness is `Idle` or `Paused`.
    Activity { name: String, activity: Activity },
    /// Every agent's supervision state.
    States { reply: Sender<Vec<AgentState>> },
    /// Search the agents' histories (their pages' `/api/history`); the
    /// answer comes from a thread of the supervisor's, within `within`.
    Search {
        query: Search,
        within: Duration,
        reply: Sender<Result<SearchReply, String>>,
    },
    /// One page of an agent's history, likewise.
    History {
        query: History,
        within: Duration,
        reply: Sender<Result<HistoryReply, String>>,
    },
    /// A notice, no answer: `name`'s harness reported that claude needs a
    /// login (`needs`), or that it no longer does. crash_watch's logged-in
    /// axis reads it.
    NeedsLogin { name: String, needs: bool },
    /// Stop every agent (SIGTERM, then SIGKILL after the grace) and return.
    Shutdown { reply: Sender<()> },
}

/// What a harness did, as the broker's hub tells the supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activity {
    /// It connected and said it started (its boot kick is queued).
    Started,
    /// A message was handed to it: a turn runs.
    Busy,
    /// Its turn ended (acked, requeued or dead-lettered) and none runs.
    Idle,
    /// It reported a pause (a limit, a budget, a login): no turn runs soon.
    Paused,
}

/// A change of one agent's fleet entry.
#[derive(Debug, Clone, PartialEq)]
pub struct EntryChange {
    pub agent: String,
    /// The keys the change owns, as a merge patch of the entry the agent runs
    /// (for a new agent, its whole entry).
    pub patch: Value,
    /// A new agent (an approved spawn), whose entry the fleet file already
    /// holds; for an agent the supervisor runs, the supervisor writes the
    /// change to the fleet file first (`config::fleetfile`), against what it
    /// last applied.
    pub new: bool,
}

/// Reads the end of an agent's supervised log (its harness's stdout and
/// stderr). Called on a job thread (`conn-job`), never on the hub.
pub trait LogTail: Send + Sync + 'static {
    /// The last `lines` lines of `agent`'s log, or why there are none.
    fn tail(&self, agent: &str, lines: usize) -> Result<String, String>;
}

/// What the supervisor of `hive up` (and its bash-task daemons' supervisor)
/// tells the broker's hub: one way, never waited on, so the two cannot
/// deadlock.
pub enum FleetEvent {
    /// A system event for an agent's (or the operator's) inbox: crash_watch,
    /// a CLI outside the supported window.
    System {
        to: String,
        kind: crate::proto::MsgKind,
        body: String,
    },
    /// An agent's harness exited unasked (`detail`: its status and how long
    /// it ran): the `agent_crashed` notification (issue 43).
    Crashed { agent: String, detail: String },
    /// The supervisor (re)started an agent with this config, or is about to
    /// start a new one: the hub's rules follow it (a new agent gets its
    /// socket first).
    ApplyAgent(AgentConfig),
    /// The fleet file's top-level `budget` as the supervisor read it (it
    /// applies live).
    HiveBudget(Option<crate::proto::Budget>),
    /// The fleet file as `hive reload` read it (validated whole): its agents
    /// replace the hub's (an agent no longer there is removed: refused as a
    /// recipient, its mail kept until `forget_agent`; a new one gets its
    /// socket), and its `hive_name` and `swarm_name` apply.
    Reloaded(Box<HiveConfig>),
    /// The fleet file's `notify` block as `hive reload` read it (at every
    /// reload that finds one, and once when it was taken out): the
    /// sender's destinations from now on.
    Notify(Box<crate::broker::notify::Reconfig>),
    /// `hive up` started `agent`'s harness (or bash-task daemon, as `via`
    /// says) with a credential: the other end of `control`, over which it
    /// hands the broker connections of its own. From now on that process's
    /// rows are refused on the agent's socket.
    Credential {
        agent: String,
        via: Via,
        control: std::os::unix::net::UnixStream,
    },
}

/// The fleet's sender to the broker's hub: only [`FleetEvent`]s.
#[derive(Clone)]
pub struct FleetTx(Arc<dyn Fn(FleetEvent) -> bool + Send + Sync>);

impl FleetTx {
    /// A sender that hands each event to `send`, which says whether the
    /// broker still takes them.
    pub fn new(send: impl Fn(FleetEvent) -> bool + Send + Sync + 'static) -> FleetTx {
        FleetTx(Arc::new(send))
    }

    /// Tells the hub; false once the broker has stopped.
    pub fn send(&self, event: FleetEvent) -> bool {
        (self.0)(event)
    }
}
