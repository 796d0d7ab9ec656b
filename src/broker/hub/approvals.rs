//! Approvals: changes an agent proposes and the operator decides — a new child
//! (`request_spawn`, queued in `lifecycle.rs`) or a merge patch of a fleet-file
//! entry (`request_apply_commit`) — and the operator's `approvals`, `approve`,
//! `deny` and `set_permissions`. Carrying one out never blocks the hub: the
//! fleet file is changed (three-way, keeping every hand edit:
//! `config::fleetfile`) and the supervisor asked on a job's thread, whose
//! one report is a [`Followup`] the hub applies; only then does
//! the hub record the decision, so a stuck supervisor never holds the hub and
//! an approval is decided once. A change the fleet file refuses (a conflict
//! with a hand edit, a file hive cannot write) changes nothing: the approval
//! stays pending.

use super::offload::{ask_supervisor, read_patch_file, NO_SUPERVISOR};
use super::{db_err, Done, Followup, Handled, Hub, Identity, NewSocket, Work};
use crate::broker::lifecycle::{EntryChange, LifecycleCmd};
use crate::config::fleetfile::{self, Change};
use crate::config::{AgentConfig, HiveConfig};
use crate::proto::cmd::{
    parse_patch, ApprovalsReply, Approve, Deny, RequestApplyCommit, SetPermissions,
};
use crate::proto::text::preview;
use crate::proto::{
    now, Approval, ApprovalKind, ApprovalState, Empty, MsgKind, QueuedReply, TextReply,
};
use serde_json::{json, Value};

impl Hub<'_> {
    /// The fleet config with `patch` merged into `agent`'s entry, validated.
    pub(super) fn patched(
        &self,
        agent: &str,
        patch: &Value,
    ) -> Result<(HiveConfig, AgentConfig), String> {
        let current = self
            .cfg
            .agent(agent)
            .ok_or_else(|| format!("unknown agent {agent:?}"))?;
        let entry = fleetfile::patched(current, patch)?;
        let mut cfg = self.cfg.clone();
        if let Some(slot) = cfg.agents.iter_mut().find(|a| a.name == agent) {
            *slot = entry.clone();
        }
        cfg.validate()
            .map_err(|e| format!("the patched fleet config is not valid: {e}"))?;
        Ok((cfg, entry))
    }

    /// Work that carries out a change of an existing agent's entry: the
    /// supervisor writes it to the fleet file (against what it last applied)
    /// and restarts the agent onto it; without a supervisor the file is
    /// written here (against the hub's rules, which are what was applied) and
    /// the agent is left as it runs. `Err`: nothing was changed.
    pub(super) fn entry_work(&mut self, agent: &str, patch: Value) -> Result<Work<String>, String> {
        if !self.changing.insert(agent.to_string()) {
            return Err(format!(
                "a change to the fleet entry of {agent} is being carried out; try again in a moment"
            ));
        }
        let sup = self.settings.lifecycle.clone();
        let timeout = self.settings.supervisor_timeout;
        let path = self.settings.config_path.clone();
        let base = self.cfg.agent(agent).cloned();
        let agent = agent.to_string();
        Ok(Box::new(move || {
            if sup.is_some() {
                let change = EntryChange {
                    agent,
                    patch,
                    new: false,
                };
                return ask_supervisor(&sup, timeout, |reply| LifecycleCmd::Apply {
                    change,
                    reply,
                });
            }
            if let Some(path) = &path {
                let change = Change {
                    agent: &agent,
                    base: base.as_ref(),
                    patch: &patch,
                };
                fleetfile::apply(path, &change)?;
            }
            Ok(format!(
                "the fleet entry of {agent} changed; restart it to run it ({NO_SUPERVISOR})"
            ))
        }))
    }

    /// May `caller` propose a change to `agent`'s entry?
    pub(super) fn check_apply_commit(&self, caller: &str, agent: &str) -> Result<(), String> {
        self.check_agent(agent)?;
        if agent != caller && self.cfg.parent_of(agent) != caller {
            return Err(format!(
                "request_apply_commit: {agent} is neither you nor one of your children"
            ));
        }
        Ok(())
    }

    /// `request_apply_commit`: `commit_ref` is an inline JSON object, or the
    /// path of a file holding one. The file is read off the hub, on the
    /// caller's job thread (`conn-job`) (it may be slow, huge or a FIFO); the hub
    /// then gets the patch back as a [`Followup`].
    pub(super) fn request_apply_commit(
        &mut self,
        caller: &str,
        c: RequestApplyCommit,
    ) -> Handled<QueuedReply> {
        self.check_apply_commit(caller, &c.agent)?;
        if c.inline() {
            let patch = parse_patch(&c.commit_ref)?;
            return self
                .queue_apply_commit(caller, &c.agent, &patch)
                .map(Done::Reply);
        }
        let own = self.settings.state_dir.join("agents").join(caller);
        let who = Identity::Agent(caller.to_string());
        Ok(Done::Then(
            who,
            Box::new(move || {
                let patch = read_patch_file(&own, &c.commit_ref)?;
                Ok(Followup::ApplyCommit {
                    agent: c.agent,
                    patch,
                })
            }),
        ))
    }

    /// Validates `patch` against the fleet and queues it for the operator.
    pub(super) fn queue_apply_commit(
        &mut self,
        caller: &str,
        agent: &str,
        patch: &Value,
    ) -> Result<QueuedReply, String> {
        let (_, entry) = self.patched(agent, patch)?;
        let current = self.cfg.agent(agent).map(|c| (c, &entry));
        let id = self
            .db
            .insert_approval(
                &ApprovalKind::ApplyCommit,
                caller,
                agent,
                &patch.to_string(),
                now(),
            )
            .map_err(db_err)?;
        // issue 16: keys that apply live are named on the card.
        let flag = crate::proto::AgentConfig::live_flag(patch, current)
            .map_or_else(String::new, |f| format!(" [{f}]"));
        self.announce_approval(
            id,
            &format!(
                "{caller} proposes a change to the fleet entry of {agent}: {}{flag}",
                preview(&patch.to_string(), 2000)
            ),
        )?;
        Ok(QueuedReply {
            id,
            text: format!(
                "approval #{id} queued: the operator decides; you get a message either way"
            ),
        })
    }

    pub(super) fn approvals(&self) -> Result<ApprovalsReply, String> {
        let mut budget = super::limits::Budget::new();
        let approvals = budget.fit(self.db.pending_approvals().map_err(db_err)?);
        Ok(ApprovalsReply {
            approvals,
            left_off: budget.left_off,
        })
    }

    /// A pending approval that is not being carried out right now.
    fn pending_approval(&self, id: i64) -> Result<Approval, String> {
        if self.deciding.contains(&id) {
            return Err(format!(
                "approval #{id} is being carried out; its answer comes in a moment"
            ));
        }
        self.db
            .pending_approvals()
            .map_err(db_err)?
            .into_iter()
            .find(|a| a.id == id)
            .ok_or_else(|| format!("no pending approval #{id}"))
    }

    /// Tells an agent about its approval (nothing when it is gone).
    fn tell_requester(&mut self, to: &str, body: &str) {
        if self.cfg.agent(to).is_none() {
            return;
        }
        if let Err(e) = self.tell(to, MsgKind::ApprovalDecided, body) {
            log::error!("cannot tell {to} about an approval: {e}");
        }
    }

    /// `approve`, off the hub: a spawn's entry is added to the fleet file,
    /// and the supervisor starts it (having told the hub, which gives the
    /// agent its socket and rules first: `apply_agent`); an apply_commit's patch goes to the
    /// supervisor, which writes it to the fleet file and restarts the agent.
    /// A fleet file that refuses the change leaves the approval pending.
    pub(super) fn approve(&mut self, c: Approve) -> Handled<TextReply> {
        let id = c.id;
        let a = self.pending_approval(id)?;
        match a.kind {
            ApprovalKind::Spawn => {
                let entry: AgentConfig = serde_json::from_value(a.payload.clone())
                    .map_err(|e| format!("approval #{id} holds a bad entry: {e}"))?;
                let mut cfg = self.cfg.clone();
                cfg.agents.push(entry.clone());
                cfg.validate()
                    .map_err(|e| format!("approval #{id} cannot be applied: {e}"))?;
                self.deciding.insert(id);
                let path = self.settings.config_path.clone();
                let change = EntryChange {
                    agent: entry.name.clone(),
                    patch: a.payload,
                    new: true,
                };
                let start =
                    self.supervisor_work(move |reply| LifecycleCmd::Apply { change, reply });
                Ok(Done::Then(
                    Identity::Operator,
                    Box::new(move || {
                        let name = entry.name.clone();
                        if let Some(path) = &path {
                            let patch = serde_json::to_value(&entry).map_err(|e| e.to_string())?;
                            let change = Change {
                                agent: &name,
                                base: None,
                                patch: &patch,
                            };
                            if let Err(e) = fleetfile::apply(path, &change) {
                                return Ok(Followup::Approved {
                                    id,
                                    result: Err(e),
                                    patch: None,
                                    spawned: None,
                                });
                            }
                        }
                        let result = Ok(match start() {
                            Ok(_) => format!("{name} spawned and running"),
                            Err(e) => format!("{name} added to the fleet, but not started: {e}"),
                        });
                        Ok(Followup::Approved {
                            id,
                            result,
                            patch: None,
                            spawned: Some(Box::new(entry)),
                        })
                    }),
                ))
            }
            ApprovalKind::ApplyCommit => {
                self.patched(&a.agent, &a.payload)?;
                let work = self.entry_work(&a.agent, a.payload.clone())?;
                self.deciding.insert(id);
                let patch = Some((a.agent, a.payload));
                Ok(Done::Then(
                    Identity::Operator,
                    Box::new(move || {
                        Ok(Followup::Approved {
                            id,
                            result: work(),
                            patch,
                            spawned: None,
                        })
                    }),
                ))
            }
            ApprovalKind::Other(kind) => {
                Err(format!("approval #{id} has an unknown kind {kind:?}"))
            }
        }
    }

    /// A new agent's entry is in the fleet file: it gets its socket (unless
    /// it has one) and the hub's rules, unless the hub knows it already.
    pub(super) fn join(&mut self, entry: AgentConfig) -> Result<(), String> {
        if self.cfg.agent(&entry.name).is_some() {
            return Ok(());
        }
        let mut cfg = self.cfg.clone();
        cfg.agents.push(entry.clone());
        cfg.validate()?;
        if !self.bound.contains(&entry.name) {
            if let Some(run_dir) = &self.settings.run_dir {
                let (listener, path) = crate::broker::bind::agent_listener(run_dir, &entry)?;
                self.bound.insert(entry.name.clone());
                self.new_sockets.push(NewSocket {
                    listener,
                    who: Identity::Agent(entry.name.clone()),
                    path,
                });
            }
        }
        if self.removed.remove(&entry.name) {
            log::info!(
                "{} is back in the fleet; the mail kept for it is delivered",
                entry.name
            );
        }
        self.cfg = cfg;
        Ok(())
    }

    /// The second half of `approve`, once the change was carried out (or
    /// refused: then the approval stays pending).
    pub(super) fn approved(
        &mut self,
        id: i64,
        result: Result<String, String>,
        patch: Option<(String, Value)>,
        spawned: Option<AgentConfig>,
    ) -> Result<TextReply, String> {
        self.deciding.remove(&id);
        if let Some((agent, _)) = &patch {
            self.changing.remove(agent);
        }
        let text = result?;
        if let Some(entry) = spawned {
            // Under plain `hive broker` nobody else adds it (under `hive up`
            // the supervisor did before it started the agent).
            self.join(entry)
                .map_err(|e| format!("approval #{id} cannot be applied: {e}"))?;
        }
        let a = self.pending_approval(id)?;
        if let Some((agent, patch)) = patch {
            let (cfg, _) = self.patched(&agent, &patch)?;
            self.cfg = cfg;
        }
        self.db
            .decide_approval(id, &ApprovalState::Approved, None, now())
            .map_err(db_err)?;
        let body = format!("[approval #{id} approved] {text}");
        self.tell_requester(&a.requester, &body);
        Ok(TextReply { text })
    }

    /// The operator's permissions tab: new groups and capabilities for an
    /// agent, written to the fleet file (only those two keys, and only where
    /// they change) and applied by the supervisor, which restarts it.
    pub(super) fn set_permissions(&mut self, c: SetPermissions) -> Handled<TextReply> {
        let patch = json!({ "tool_groups": c.tool_groups, "capabilities": c.capabilities });
        self.patched(&c.agent, &patch)?;
        let work = self.entry_work(&c.agent, patch.clone())?;
        let agent = c.agent;
        Ok(Done::Then(
            Identity::Operator,
            Box::new(move || {
                Ok(Followup::Permissions {
                    agent,
                    patch,
                    result: work(),
                })
            }),
        ))
    }

    /// The second half of `set_permissions`.
    pub(super) fn permissions_applied(
        &mut self,
        agent: &str,
        patch: &Value,
        result: Result<String, String>,
    ) -> Result<TextReply, String> {
        self.changing.remove(agent);
        result?;
        let (cfg, _) = self.patched(agent, patch)?;
        self.cfg = cfg;
        Ok(TextReply {
            text: format!(
                "{agent} has its new permissions in the fleet file and restarts with them"
            ),
        })
    }

    pub(super) fn deny_as_operator(&mut self, c: Deny) -> Result<TextReply, String> {
        self.deny(c.id, c.why, "operator")
    }

    /// Denies (the operator) or withdraws (a root agent, for its tree) a
    /// pending approval; the requester is told unless it withdrew it itself.
    fn deny(&mut self, id: i64, why: Option<String>, by: &str) -> Result<TextReply, String> {
        let a = self.pending_approval(id)?;
        let state = if by == "operator" {
            ApprovalState::Denied
        } else {
            ApprovalState::Cancelled
        };
        self.db
            .decide_approval(id, &state, why.as_deref(), now())
            .map_err(db_err)?;
        let body = format!(
            "[approval #{id} {state} by {by}] {} of {}{}",
            a.kind,
            a.agent,
            why.map(|w| format!(": {w}")).unwrap_or_default()
        );
        if a.requester != by {
            self.tell_requester(&a.requester, &body);
        }
        Ok(TextReply { text: body })
    }

    /// Pending approvals an agent sees as loose ends: its own requests, and for
    /// a root agent every one from its tree.
    pub(super) fn approvals_of(&self, agent: &str) -> Result<Vec<Approval>, String> {
        let root = self.cfg.parent_of(agent) == "operator";
        Ok(self
            .db
            .pending_approvals()
            .map_err(db_err)?
            .into_iter()
            .filter(|a| a.requester == agent || (root && self.cfg.root_of(&a.requester) == agent))
            .collect())
    }

    /// May `agent` withdraw `a`? Only the root agent of the requester's tree
    /// (and the operator, who denies it).
    pub(super) fn may_withdraw(&self, agent: &str, a: &Approval) -> bool {
        self.cfg.parent_of(agent) == "operator" && self.cfg.root_of(&a.requester) == agent
    }

    /// `cancel_loose_end(kind="approval")`: a root agent withdraws a pending
    /// approval of its tree. A requester that is not a root agent cannot: its
    /// root agent or the operator decides.
    pub(super) fn cancel_approval(&mut self, agent: &str, id: i64) -> Result<Empty, String> {
        let pending = self.db.pending_approvals().map_err(db_err)?;
        let Some(a) = pending.iter().find(|a| a.id == id) else {
            return Err(format!("no pending approval #{id}"));
        };
        if !self.may_withdraw(agent, a) {
            let root = self.cfg.root_of(&a.requester);
            return Err(if a.requester == agent {
                format!(
                    "approval #{id} can be withdrawn only by your root agent ({root}) or the \
                     operator; ask them"
                )
            } else {
                format!(
                    "{agent} may cancel only the approvals of its own tree, as its root agent; \
                     approval #{id} is of {root}'s tree"
                )
            });
        }
        self.deny(id, None, agent).map(|_| Empty {})
    }
}
