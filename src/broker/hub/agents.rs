//! What the hub keeps and tells per agent: `hello`, the harness's start (its
//! revision and the "you were just (re)started" message), its turn counters,
//! the status line (pushed to a parked `recv_next` that said what it had seen),
//! `get_agent_meta`, the operator's `agents`, and the loose ends: open
//! questions, reminders, scheduled prompts, approvals and the running bash
//! tasks its task daemon reports (`report_tasks`), and `cancel_loose_end`
//! (a scheduled prompt needs the `scheduling` group, as `cancel_scheduled`
//! does; an approval, the requester's root agent).

use super::limits::Budget;
use super::{db_err, ConnId, Hub, Identity};
use crate::broker::db::Side;
use crate::proto::access::{Caller, Capability};
use crate::proto::cmd::{
    AgentMeta, AgentsReply, CancelLooseEnd, CancelScheduled, GetAgentMeta, GetLooseEnds,
    HarnessStarted, Hello, HelloReply, LooseEndsReply, ModelOverride, ModelReply, PostTurnCounts,
    ReportTasks, SetStatus, VersionReply,
};
use crate::proto::command::Row;
use crate::proto::ident::Peer;
use crate::proto::{now, AgentRow, Empty, LooseEndKind, MsgKind, SentReply, PROTOCOL_VERSION};

/// The first message of every harness start.
pub const KICK_BODY: &str = "You were just (re)started. Check your state dir for your notes; \
your --continue session is intact.";

impl Hub<'_> {
    pub(super) fn hello(&self, who: &Identity, c: Hello) -> Result<HelloReply, String> {
        if let Some(v) = c.version.filter(|v| *v != PROTOCOL_VERSION) {
            return Err(format!(
                "protocol version {v} is not supported; this broker speaks version {PROTOCOL_VERSION}"
            ));
        }
        Ok(HelloReply {
            version: PROTOCOL_VERSION,
            identity: who.name().to_string(),
            hyperhive_rev: self.settings.hyperhive_rev.clone(),
        })
    }

    pub(super) fn version(&self) -> Result<VersionReply, String> {
        Ok(VersionReply {
            version: env!("CARGO_PKG_VERSION").into(),
            hyperhive_rev: self.settings.hyperhive_rev.clone(),
            protocol: PROTOCOL_VERSION,
        })
    }

    /// True while a harness of `agent` holds a connection it started or polls on.
    pub(super) fn running(&self, agent: &str) -> bool {
        self.harness_conns.get(agent).is_some_and(|s| !s.is_empty())
    }

    pub(super) fn harness_started(
        &mut self,
        conn: ConnId,
        agent: &str,
        c: HarnessStarted,
    ) -> Result<SentReply, String> {
        self.harness_conns
            .entry(agent.to_string())
            .or_default()
            .insert(conn);
        if let Some(rev) = c.hyperhive_rev {
            self.db.set_rev(agent, &rev).map_err(db_err)?;
        }
        // A kick still waiting (queued, or inflight from a harness that died
        // before its turn ended) already says "you were just (re)started":
        // the new harness gets that one, not a second.
        if let Some(id) = self
            .db
            .waiting_event(agent, &MsgKind::Kick)
            .map_err(db_err)?
        {
            return Ok(SentReply {
                id: Some(id),
                to: Peer::sender(agent),
            });
        }
        self.tell(agent, MsgKind::Kick, KICK_BODY)
    }

    pub(super) fn post_turn_counts(
        &mut self,
        agent: &str,
        c: PostTurnCounts,
    ) -> Result<Empty, String> {
        self.db.add_counts(agent, &c).map_err(db_err)?;
        Ok(Empty {})
    }

    /// `model`: the page's override of `agent`'s model, asked for, set or
    /// cleared by its harness. One chosen against another configured default
    /// than the harness runs with now is cleared by any of them: a change of
    /// the fleet entry's `model` (or `HIVE_DEFAULT_MODEL`) ends it.
    pub(super) fn model_override(
        &mut self,
        agent: &str,
        c: ModelOverride,
    ) -> Result<ModelReply, String> {
        let stored = self.db.model_override(agent).map_err(db_err)?;
        let mut cleared = None;
        if let Some((model, default)) = &stored {
            if *default != c.default {
                self.db.set_model_override(agent, None).map_err(db_err)?;
                log::info!(
                    "{agent}: the configured model is now {} (was {default}); the page's override {model} is cleared",
                    c.default
                );
                cleared = Some(model.clone());
            }
        }
        let now = if let Some(m) = &c.set {
            self.db
                .set_model_override(agent, Some((m, &c.default)))
                .map_err(db_err)?;
            Some(m.clone())
        } else if c.clear {
            self.db.set_model_override(agent, None).map_err(db_err)?;
            None
        } else if cleared.is_some() {
            None
        } else {
            stored.map(|(m, _)| m)
        };
        Ok(ModelReply {
            model_override: now,
            cleared,
        })
    }

    pub(super) fn set_status(&mut self, agent: &str, c: SetStatus) -> Result<Empty, String> {
        self.db.set_status(agent, &c.text, now()).map_err(db_err)?;
        // A harness parked in `recv_next` with what it had seen learns it now.
        self.notify(agent);
        Ok(Empty {})
    }

    pub(super) fn meta(&self, who: &Identity, c: GetAgentMeta) -> Result<AgentMeta, String> {
        let name = match (c.name, who) {
            (Some(n), _) => n,
            (None, Identity::Agent(a)) => a.clone(),
            (None, Identity::Operator | Identity::Bridge) => {
                return Err("get_agent_meta on the host socket needs \"name\"".into())
            }
        };
        self.check_agent(&name)?;
        let stats = self.db.stats(&name).map_err(db_err)?;
        Ok(AgentMeta {
            running: self.running(&name),
            name,
            hyperhive_rev: stats.hyperhive_rev,
            status_text: stats.status_text,
            status_set_at: stats.status_set_at,
            hive_name: self.cfg.hive_name.clone(),
            swarm_name: self.cfg.swarm_name.clone(),
        })
    }

    pub(super) fn agents(&mut self) -> Result<AgentsReply, String> {
        let mut rows = Vec::new();
        let mut names: Vec<(String, bool)> = self
            .cfg
            .agents
            .iter()
            .map(|a| (a.name.clone(), false))
            .collect();
        // Taken out of the fleet, their mail kept: listed after the fleet.
        names.extend(self.removed_agents().into_iter().map(|n| (n, true)));
        for (name, removed) in names {
            let s = self.db.stats(&name).map_err(db_err)?;
            let pool = self.pool_of(&name);
            let near_limit = self.near_limit(&name);
            rows.push(AgentRow {
                pool: Some(pool),
                name: name.clone(),
                parent: self.cfg.parent_of(&name),
                unread: self.unread(&name)?,
                inflight: self.inflight_id(&name)?,
                running: self.running(&name),
                paused: self.shown_pause(&name),
                needs_login: self.needs_login.contains(&name),
                failed: self.db.count_failed(&name).map_err(db_err)?,
                near_limit,
                stored_bytes: self.quotas.stored(&name),
                status_text: s.status_text,
                turns: s.turns,
                turns_ok: s.turns_ok,
                turns_failed: s.turns_failed,
                tokens_in: s.tokens_in,
                tokens_out: s.tokens_out,
                cost_usd: s.cost_usd,
                model_override: self
                    .db
                    .model_override(&name)
                    .map_err(db_err)?
                    .map(|(m, _)| m),
                removed,
            });
        }
        let mut budget = Budget::new();
        let agents = budget.fit(rows);
        Ok(AgentsReply {
            agents,
            left_off: budget.left_off,
            bridge: self.bridge_row()?,
        })
    }

    /// May `caller` read what the hub keeps about `target`: itself, a direct
    /// child, or anyone with the `query_agent_state` capability.
    pub(super) fn may_inspect(&self, caller: &str, target: &str) -> bool {
        target == caller
            || self.cfg.parent_of(target) == caller
            || self
                .cfg
                .agent(caller)
                .is_some_and(|c| c.has_capability(Capability::QueryAgentState))
    }

    pub(super) fn loose_ends(
        &self,
        caller: &str,
        c: GetLooseEnds,
    ) -> Result<LooseEndsReply, String> {
        let target = match c.agent {
            None => caller.to_string(),
            Some(a) if a == "*" => {
                return Err("the hive-wide \"*\" query is not available on an agent socket".into())
            }
            Some(a) => {
                self.check_agent(&a)?;
                if !self.may_inspect(caller, &a) {
                    return Err(format!(
                        "{a} is not a direct child of {caller}; reading its loose ends needs the query_agent_state capability"
                    ));
                }
                a
            }
        };
        // The lists are filled in the order of the reply's fields, so a
        // crowded answer keeps the agent's own questions first.
        let mut budget = Budget::new();
        let db = &self.db;
        let asked = budget.fit(db.questions_where(Side::Asker, &target).map_err(db_err)?);
        let owed = budget.fit(db.questions_where(Side::Target, &target).map_err(db_err)?);
        let reminders = budget.fit(db.reminders_of(&target).map_err(db_err)?);
        let scheduled = budget.fit(db.scheduled_of(&target).map_err(db_err)?);
        let approvals = budget.fit(self.approvals_of(&target)?);
        let withdrawable = approvals
            .iter()
            .filter(|a| self.may_withdraw(caller, a))
            .map(|a| a.id)
            .collect();
        Ok(LooseEndsReply {
            asked,
            owed,
            reminders,
            scheduled,
            approvals,
            withdrawable,
            tasks: budget.fit(db.tasks_of(&target).map_err(db_err)?),
            left_off: budget.left_off,
            agent: target,
        })
    }

    pub(super) fn cancel_loose_end(
        &mut self,
        agent: &str,
        c: CancelLooseEnd,
    ) -> Result<Empty, String> {
        match c.kind {
            LooseEndKind::Question => self.withdraw_question(agent, c.id),
            LooseEndKind::Reminder => self.cancel_reminder(agent, c.id),
            LooseEndKind::Approval => self.cancel_approval(agent, c.id),
            LooseEndKind::Scheduled => {
                // The same rule as cancel_scheduled's row of the table.
                let caller = Caller::Agent {
                    name: agent,
                    groups: &self
                        .cfg
                        .agent(agent)
                        .map(|e| e.groups())
                        .unwrap_or_default(),
                    capabilities: &[],
                    via: crate::proto::access::Via::Socket,
                };
                CancelScheduled::ACCESS.admits("cancel_loose_end(kind=\"scheduled\")", caller)?;
                self.cancel_scheduled(agent, CancelScheduled { id: c.id })
            }
        }
    }

    pub(super) fn report_tasks(&mut self, agent: &str, c: ReportTasks) -> Result<Empty, String> {
        self.db.set_tasks(agent, &c.tasks).map_err(db_err)?;
        Ok(Empty {})
    }
}
