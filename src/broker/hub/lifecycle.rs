//! Lifecycle: `request_spawn` (an approval for the operator), the tools that
//! stop and start an agent's own children (`kill`, `start`, `restart`,
//! `update`), the operator's commands that do the same for any agent
//! (`stop_agent`, `start_agent`, `restart_agent`, `update_agent`), the
//! operator's `supervision`, `reload`, `update_all` and `forget_agent`, the
//! supervisor's `ApplyAgent` and `RemoveAgent`, and what the hub tells the
//! supervisor of each harness's turns ([`Activity`]). The hub checks
//! the rights; the wait for the supervisor (at most
//! [`HubSettings::supervisor_timeout`](super::HubSettings)) runs on the caller's
//! connection thread, so a stuck supervisor holds up that caller only. Once the
//! supervisor has carried a command out, the hub records whether the agent is
//! kept stopped across restarts of `hive up` ([`Followup::Lifecycle`]).

use super::approvals::follow;
use super::{db_err, fmt_wait, Done, Followup, Handled, Hub, Identity, Work};
use crate::broker::lifecycle::{Activity, LifecycleCmd, Reply};
use crate::config::AgentConfig;
use crate::proto::cmd::{
    ForgetAgent, Kill, RequestSpawn, Restart, RestartAgent, Start, StartAgent, StopAgent,
    SupervisionReply, Update, UpdateAgent, UpdateAll,
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

    /// `hive reload` applied the fleet file `new`: its agents are the
    /// hub's from now on. One new to the hub gets its socket; one that was
    /// removed is back and finds its mail; one no longer there is removed:
    /// refused as a recipient, its mail and its row kept (so it is still
    /// known as removed after a restart of the broker) until `forget`.
    pub(super) fn set_fleet(&mut self, new: crate::config::HiveConfig) {
        if let Err(e) = new.validate() {
            log::error!("ignoring a fleet the supervisor reloaded: {e}");
            return;
        }
        let gone: Vec<String> = self
            .cfg
            .agents
            .iter()
            .filter(|a| new.agent(&a.name).is_none())
            .map(|a| a.name.clone())
            .collect();
        for entry in &new.agents {
            let name = &entry.name;
            if !self.bound.contains(name) {
                if let Some(run_dir) = &self.settings.run_dir {
                    match crate::broker::bind::agent_listener(run_dir, entry) {
                        Ok((listener, path)) => {
                            self.bound.insert(name.clone());
                            self.new_sockets.push(super::NewSocket {
                                listener,
                                who: Identity::Agent(name.clone()),
                                path,
                            });
                        }
                        Err(e) => log::error!("{name}'s socket was not bound: {e}"),
                    }
                }
            }
            if self.removed.remove(name) {
                log::info!("{name} is back in the fleet; the mail kept for it is delivered");
            }
            // Added to the file, it is meant to run: not kept stopped.
            if self.cfg.agent(name).is_none() {
                if let Err(e) = self.db.clear_stopped(name) {
                    log::error!("cannot clear {name}'s stopped mark: {e}");
                }
            }
        }
        self.cfg.agents = new.agents;
        self.cfg.budget = new.budget;
        // Under a Matrix bridge the hive's names wait for a restart of hive
        // up (the swarm knows the hive by them), as does adding or removing
        // the bridge (its socket); a changed section reaches the bridge at
        // the restart `hive reload` asks of it.
        let same_names =
            self.cfg.hive_name == new.hive_name && self.cfg.swarm_name == new.swarm_name;
        if self.cfg.matrix.is_none() && new.matrix.is_none() {
            self.cfg.hive_name = new.hive_name;
            self.cfg.swarm_name = new.swarm_name;
        } else if self.cfg.matrix.is_some() && new.matrix.is_some() && same_names {
            self.cfg.matrix = new.matrix;
        }
        for name in gone {
            self.busy.remove(&name);
            self.paused.remove(&name);
            if let Err(e) = self.db.keep_agent_row(&name) {
                log::error!("cannot keep {name}'s row: {e}");
            }
            let queued = self.db.count_queued(&name).unwrap_or(0);
            log::info!(
                "{name} was removed from the fleet; its {queued} queued messages are kept until `hive forget {name}`"
            );
            self.removed.insert(name);
        }
        // A changed budget or account may end a pause (issue 16).
        self.wake_all();
    }

    /// At start: the agents the store knows that the fleet file does not
    /// name (taken out while the hive was down) are removed.
    pub(super) fn find_removed(&mut self) {
        match self.db.known_agents() {
            Ok(names) => {
                for name in names {
                    if self.cfg.agent(&name).is_none()
                        && crate::proto::ident::check_name(&name).is_ok()
                    {
                        self.removed.insert(name);
                    }
                }
            }
            Err(e) => log::error!("cannot read the agents the store knows: {e}"),
        }
        if !self.removed.is_empty() {
            let names: Vec<&str> = self.removed.iter().map(String::as_str).collect();
            log::info!(
                "not in the fleet file, kept as removed (mail kept until `hive forget NAME`): {}",
                names.join(", ")
            );
        }
    }

    /// The agents the fleet took out, for `hive agents`.
    pub(super) fn removed_agents(&self) -> Vec<String> {
        self.removed.iter().cloned().collect()
    }

    /// `forget_agent`: a removed agent's mail becomes dead letters and its
    /// row goes; its data dir stays.
    pub(super) fn forget(&mut self, c: ForgetAgent) -> Result<TextReply, String> {
        let name = c.name;
        if self.cfg.agent(&name).is_some() {
            return Err(format!(
                "forget {name}: {name} is in the fleet; forget is for agents taken out of the \
                 fleet file: remove its entry, run `hive reload`, then forget it"
            ));
        }
        if !self.removed.contains(&name) {
            return Err(format!("forget: {}", self.unknown_agent(&name)));
        }
        let error = format!("{name} was removed from the fleet and forgotten (hive forget)");
        let n = self.db.forget_agent(&name, &error, now()).map_err(db_err)?;
        self.removed.remove(&name);
        self.busy.remove(&name);
        self.needs_login.remove(&name);
        if let Some(sup) = &self.settings.lifecycle {
            let _ = sup.send(LifecycleCmd::Forget { name: name.clone() });
        }
        log::info!("{name} forgotten: {n} messages dead-lettered");
        Ok(TextReply {
            text: format!(
                "forgot {name}: {n} queued message{} now dead letter{} (`hive failed --agent \
                 {name}` lists them; `hive retry ID` sends one again once {name} is back); its \
                 data dir stays",
                if n == 1 { " is" } else { "s are" },
                if n == 1 { "" } else { "s" },
            ),
        })
    }

    /// `reload`: the supervisor reads the fleet file again and applies it.
    pub(super) fn reload(&mut self) -> Handled<TextReply> {
        if self.settings.lifecycle.is_none() {
            return Err(NO_SUPERVISOR.into());
        }
        let work = self.supervisor_work(|reply| LifecycleCmd::Reload { reply });
        Ok(Done::Offload(Box::new(move |hub| {
            work(hub).map(|text| TextReply { text })
        })))
    }

    /// `update_all`: the supervisor updates every stale agent, a few at a time.
    pub(super) fn update_all(&mut self, c: UpdateAll) -> Handled<TextReply> {
        if self.settings.lifecycle.is_none() {
            return Err(NO_SUPERVISOR.into());
        }
        let parallel = c.parallel.unwrap_or(2) as usize;
        let work = self.supervisor_work(move |reply| LifecycleCmd::UpdateAll { parallel, reply });
        Ok(Done::Offload(Box::new(move |hub| {
            work(hub).map(|text| TextReply { text })
        })))
    }

    /// After a harness row of `agent`'s: tells the supervisor when it
    /// started, paused, or began or ended a turn (whether it holds a message
    /// changed). Under plain `hive broker` nobody listens.
    pub(super) fn tell_activity(&mut self, agent: &str, cmd: &str) {
        if self.settings.lifecycle.is_none() {
            return;
        }
        let activity = match cmd {
            // `kick` is the harness's start (`HarnessStarted`).
            "kick" => Some(Activity::Started),
            "report_state" if self.paused.contains_key(agent) => Some(Activity::Paused),
            "recv_next" | "ack_turn" | "requeue_inflight" | "dead_letter" => {
                let busy = matches!(self.inflight_id(agent), Ok(Some(_)));
                if busy == self.busy.contains(agent) {
                    None
                } else if busy {
                    self.busy.insert(agent.to_string());
                    Some(Activity::Busy)
                } else {
                    self.busy.remove(agent);
                    Some(Activity::Idle)
                }
            }
            _ => None,
        };
        if let (Some(activity), Some(sup)) = (activity, &self.settings.lifecycle) {
            // Unbounded: never blocks the hub.
            let _ = sup.send(LifecycleCmd::Activity {
                name: agent.to_string(),
                activity,
            });
        }
    }
}
