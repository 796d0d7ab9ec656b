//! Lifecycle: `request_spawn` (an approval for the operator), the tools that
//! stop and start an agent's own children (`kill`, `start`, `restart`,
//! `update`), the operator's commands that do the same for any agent
//! (`stop_agent`, `start_agent`, `restart_agent`, `update_agent`), the
//! operator's `supervision`, and the supervisor's `ApplyAgent`. The hub checks
//! the rights; the wait for the supervisor (at most
//! [`HubSettings::supervisor_timeout`](super::HubSettings)) runs on the caller's
//! connection thread, so a stuck supervisor holds up that caller only. Once the
//! supervisor has carried a command out, the hub records whether the agent is
//! kept stopped across restarts of `hive up` ([`Followup::Lifecycle`]).

use super::approvals::follow;
use super::{db_err, fmt_wait, Done, Followup, Handled, Hub, Identity, Work};
use crate::broker::lifecycle::{LifecycleCmd, Reply};
use crate::config::AgentConfig;
use crate::proto::cmd::{
    Kill, RequestSpawn, Restart, RestartAgent, Start, StartAgent, StopAgent, SupervisionReply,
    Update, UpdateAgent,
};
use crate::proto::{now, ApprovalKind, QueuedReply, TextReply};
use crossbeam_channel::Sender;
use std::time::Duration;

pub(super) const NO_SUPERVISOR: &str = "this broker runs without a supervisor (plain `hive \
broker`), so agents cannot be started or stopped from here; run the hive with `hive up`";

/// One lifecycle action, as the supervisor is asked for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Start,
    Stop,
    Restart,
    Update,
}

impl Action {
    fn command(self, name: String, reply: Reply) -> LifecycleCmd {
        match self {
            Action::Start => LifecycleCmd::Start { name, reply },
            Action::Stop => LifecycleCmd::Kill { name, reply },
            Action::Restart => LifecycleCmd::Restart { name, reply },
            Action::Update => LifecycleCmd::Update { name, reply },
        }
    }

    /// Whether the agent is kept stopped across restarts afterwards: a stop
    /// keeps it, anything that starts it ends that.
    fn stopped(self) -> bool {
        self == Action::Stop
    }
}

/// Sends one command to the supervisor and waits for its answer; run on a
/// connection thread.
pub(super) fn ask_supervisor(
    sup: &Option<Sender<LifecycleCmd>>,
    timeout: Duration,
    make: impl FnOnce(Reply) -> LifecycleCmd,
) -> Result<String, String> {
    let Some(sup) = sup else {
        return Err(NO_SUPERVISOR.into());
    };
    let (tx, rx) = crossbeam_channel::bounded(1);
    sup.send(make(tx))
        .map_err(|_| "the supervisor has stopped (the hive is shutting down)".to_string())?;
    match rx.recv_timeout(timeout) {
        Ok(answer) => answer,
        Err(_) => Err(format!(
            "the supervisor did not answer in {}",
            fmt_wait(timeout)
        )),
    }
}

impl Hub<'_> {
    /// Work that asks the supervisor on the caller's thread.
    pub(super) fn supervisor_work(
        &self,
        make: impl FnOnce(Reply) -> LifecycleCmd + std::marker::Send + 'static,
    ) -> Work<String> {
        let sup = self.settings.lifecycle.clone();
        let timeout = self.settings.supervisor_timeout;
        Box::new(move |_| ask_supervisor(&sup, timeout, make))
    }

    fn require_child(&self, caller: &str, target: &str, tool: &str) -> Result<(), String> {
        self.check_agent(target)?;
        if self.cfg.parent_of(target) == caller {
            Ok(())
        } else {
            Err(format!(
                "{tool}: {target} is not a child of {caller}; lifecycle tools act on your own children only"
            ))
        }
    }

    /// A lifecycle action on `name` for `who` (the rights were checked): the
    /// supervisor carries it out off the hub, then the hub records whether
    /// the agent stays stopped.
    fn lifecycle(&self, who: Identity, name: String, action: Action) -> Handled<TextReply> {
        if self.settings.lifecycle.is_none() {
            return Err(NO_SUPERVISOR.into());
        }
        let agent = name.clone();
        let work = self.supervisor_work(move |reply| action.command(name, reply));
        Ok(Done::Offload(Box::new(move |hub| {
            let result = work(hub);
            let followup = Followup::Lifecycle {
                agent,
                stopped: Some(action.stopped()),
                result,
            };
            follow(hub, who, followup)
        })))
    }

    /// One of the tools on a child: rights here, the supervisor off the hub.
    fn on_child(
        &self,
        caller: &str,
        name: String,
        tool: &str,
        action: Action,
    ) -> Handled<TextReply> {
        self.require_child(caller, &name, tool)?;
        self.lifecycle(Identity::Agent(caller.to_string()), name, action)
    }

    pub(super) fn kill(&mut self, caller: &str, c: Kill) -> Handled<TextReply> {
        self.on_child(caller, c.name, "kill", Action::Stop)
    }

    pub(super) fn start(&mut self, caller: &str, c: Start) -> Handled<TextReply> {
        self.on_child(caller, c.name, "start", Action::Start)
    }

    pub(super) fn restart(&mut self, caller: &str, c: Restart) -> Handled<TextReply> {
        self.on_child(caller, c.name, "restart", Action::Restart)
    }

    pub(super) fn update(&mut self, caller: &str, c: Update) -> Handled<TextReply> {
        self.on_child(caller, c.name, "update", Action::Update)
    }

    /// The operator's commands: any agent, root agents included.
    fn on_any(&self, name: String, action: Action) -> Handled<TextReply> {
        self.check_agent(&name)?;
        self.lifecycle(Identity::Operator, name, action)
    }

    pub(super) fn operator_start(&mut self, c: StartAgent) -> Handled<TextReply> {
        self.on_any(c.name, Action::Start)
    }

    pub(super) fn operator_stop(&mut self, c: StopAgent) -> Handled<TextReply> {
        self.on_any(c.name, Action::Stop)
    }

    pub(super) fn operator_restart(&mut self, c: RestartAgent) -> Handled<TextReply> {
        self.on_any(c.name, Action::Restart)
    }

    pub(super) fn operator_update(&mut self, c: UpdateAgent) -> Handled<TextReply> {
        self.on_any(c.name, Action::Update)
    }

    /// The second half of a lifecycle command: the supervisor's answer, and
    /// when it carried the command out, whether the agent stays stopped.
    pub(super) fn lifecycle_done(
        &mut self,
        who: &Identity,
        agent: &str,
        stopped: Option<bool>,
        result: Result<String, String>,
    ) -> Result<TextReply, String> {
        let text = result?;
        match stopped {
            Some(true) => self.db.set_stopped(agent, who.name(), now()),
            Some(false) => self.db.clear_stopped(agent),
            None => Ok(()),
        }
        .map_err(db_err)?;
        Ok(TextReply { text })
    }

    pub(super) fn supervision(&mut self) -> Handled<SupervisionReply> {
        let Some(sup) = self.settings.lifecycle.clone() else {
            return Err("this broker runs without a supervisor (plain `hive broker`)".into());
        };
        let timeout = self.settings.supervisor_timeout;
        Ok(Done::Offload(Box::new(move |_| {
            let (tx, rx) = crossbeam_channel::bounded(1);
            sup.send(LifecycleCmd::States { reply: tx })
                .map_err(|_| "the supervisor has stopped".to_string())?;
            let agents = rx
                .recv_timeout(timeout)
                .map_err(|_| format!("the supervisor did not answer in {}", fmt_wait(timeout)))?;
            Ok(SupervisionReply { agents })
        })))
    }

    /// Tells the operator (inbox) that an approval waits.
    pub(super) fn announce_approval(&mut self, id: i64, what: &str) -> Result<(), String> {
        let body = format!(
            "[approval #{id}] {what}. Approve with `hive approve {id}` or deny with `hive deny {id} --why TEXT` (or on the dashboard)."
        );
        self.tell("operator", crate::proto::MsgKind::ApprovalRequested, &body)
            .map(|_| ())
    }

    pub(super) fn request_spawn(
        &mut self,
        caller: &str,
        c: RequestSpawn,
    ) -> Result<QueuedReply, String> {
        let name = c.name;
        if self.cfg.agent(&name).is_some() {
            return Err(format!(
                "request_spawn: an agent named {name:?} already exists"
            ));
        }
        let pending = self.db.pending_approvals().map_err(db_err)?;
        if let Some(p) = pending
            .iter()
            .find(|p| p.kind == ApprovalKind::Spawn && p.agent == name)
        {
            return Err(format!(
                "request_spawn: approval #{} for {name:?} is already pending",
                p.id
            ));
        }
        let entry = AgentConfig {
            name: name.clone(),
            parent: Some(caller.into()),
            ..AgentConfig::default()
        };
        let payload = serde_json::to_string(&entry).map_err(|e| e.to_string())?;
        let id = self
            .db
            .insert_approval(&ApprovalKind::Spawn, caller, &name, &payload, now())
            .map_err(db_err)?;
        self.announce_approval(
            id,
            &format!("{caller} asks to spawn a child agent {name:?}"),
        )?;
        Ok(QueuedReply {
            id,
            text: format!(
                "approval #{id} queued: the operator decides; you get a message either way"
            ),
        })
    }

    /// The supervisor applied `a`: the hub's rules follow.
    pub(super) fn apply_agent(&mut self, a: AgentConfig) {
        let mut cfg = self.cfg.clone();
        match cfg.agents.iter_mut().find(|x| x.name == a.name) {
            Some(slot) => *slot = a,
            None => cfg.agents.push(a),
        }
        match cfg.validate() {
            Ok(()) => {
                self.cfg = cfg;
                // A changed budget or account may end a pause (issue 16).
                self.wake_all();
            }
            Err(e) => log::warn!("ignoring an agent config the supervisor applied: {e}"),
        }
    }
}
