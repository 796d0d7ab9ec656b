//! Approvals: changes an agent proposes and the operator decides — a new child
//! (`request_spawn`, queued in `lifecycle.rs`) or a merge patch of a fleet-file
//! entry (`request_apply_commit`) — and the operator's `approvals`, `approve`,
//! `deny` and `set_permissions`. An approved change is handed to the
//! supervisor off the hub; its answer comes back as a [`Followup`], and only
//! then does the hub record the decision, so a stuck supervisor never holds the
//! hub and an approval is decided once.

use super::{db_err, Done, Followup, Handled, Hub, HubMsg, Identity};
use crate::broker::lifecycle::LifecycleCmd;
use crate::config::{AgentConfig, HiveConfig};
use crate::proto::cmd::{
    parse_patch, ApprovalsReply, Approve, Deny, RequestApplyCommit, SetPermissions,
};
use crate::proto::limits::MAX_PATCH_BYTES;
use crate::proto::text::{excerpt, preview};
use crate::proto::{now, Approval, ApprovalKind, ApprovalState, MsgKind, QueuedReply, TextReply};
use crossbeam_channel::Sender;
use serde_json::{json, Value};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// RFC 7396 JSON merge patch: objects merge, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// Sends a follow-up to the hub and waits for its answer line.
fn follow_up(hub: &Sender<HubMsg>, who: Identity, followup: Followup) -> Result<String, String> {
    let (reply, answer) = crossbeam_channel::bounded(1);
    hub.send(HubMsg::Followup {
        who,
        followup,
        reply,
    })
    .map_err(|_| "broker is stopping".to_string())?;
    answer.recv().map_err(|_| "broker is stopping".to_string())
}

/// Decodes an answer line a follow-up produced, so the job can hand back a
/// typed result (the line is built again from it, unchanged).
fn relay<R: serde::de::DeserializeOwned>(line: Result<String, String>) -> Result<R, String> {
    let line = line?;
    crate::proto::lines::decode(&line, "the hub", "the follow-up").map_err(|e| e.to_string())
}

impl Hub {
    /// The fleet config with `patch` merged into `agent`'s entry, validated.
    fn patched(&self, agent: &str, patch: &Value) -> Result<(HiveConfig, AgentConfig), String> {
        let current = self
            .cfg
            .agent(agent)
            .ok_or_else(|| format!("unknown agent {agent:?}"))?;
        let mut v = serde_json::to_value(current).map_err(|e| e.to_string())?;
        merge_patch(&mut v, patch);
        let entry: AgentConfig = serde_json::from_value(v)
            .map_err(|e| format!("the patched entry of {agent} is not valid: {e}"))?;
        let mut cfg = self.cfg.clone();
        if let Some(slot) = cfg.agents.iter_mut().find(|a| a.name == agent) {
            *slot = entry.clone();
        }
        cfg.validate()
            .map_err(|e| format!("the patched fleet config is not valid: {e}"))?;
        Ok((cfg, entry))
    }

    /// Writes the hub's config to the fleet file (through a rename).
    fn write_fleet_file(&self) -> Result<(), String> {
        let Some(path) = &self.settings.config_path else {
            return Ok(());
        };
        let text = serde_json::to_string_pretty(&self.cfg).map_err(|e| e.to_string())?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, format!("{text}\n"))
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| format!("cannot write the fleet file {}: {e}", path.display()))
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
    /// caller's connection thread (it may be slow, huge or a FIFO); the hub
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
        Ok(Done::Offload(Box::new(move |hub| {
            let patch = read_patch_file(&own, &c.commit_ref)?;
            let followup = Followup::ApplyCommit {
                agent: c.agent,
                patch,
            };
            relay(follow_up(hub, who, followup))
        })))
    }

    /// Validates `patch` against the fleet and queues it for the operator.
    pub(super) fn queue_apply_commit(
        &mut self,
        caller: &str,
        agent: &str,
        patch: &Value,
    ) -> Result<QueuedReply, String> {
        self.patched(agent, patch)?;
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
        self.announce_approval(
            id,
            &format!(
                "{caller} proposes a change to the fleet entry of {agent}: {}",
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

    /// `approve`: a spawn's entry joins the fleet (socket, config, fleet file)
    /// at once and the supervisor starts it; an apply_commit's patch goes to the
    /// supervisor first (so it never sees the file change under a running
    /// agent) and into the config when it answered.
    pub(super) fn approve(&mut self, c: Approve) -> Handled<TextReply> {
        let id = c.id;
        let a = self.pending_approval(id)?;
        let (entry, patch) = match a.kind {
            ApprovalKind::Spawn => {
                let entry: AgentConfig = serde_json::from_value(a.payload.clone())
                    .map_err(|e| format!("approval #{id} holds a bad entry: {e}"))?;
                let mut cfg = self.cfg.clone();
                cfg.agents.push(entry.clone());
                cfg.validate()
                    .map_err(|e| format!("approval #{id} cannot be applied: {e}"))?;
                if let Some(l) = &self.settings.listeners {
                    l.add_agent(&entry)?;
                }
                self.cfg = cfg;
                self.write_fleet_file()?;
                (entry, None)
            }
            ApprovalKind::ApplyCommit => {
                let (_, entry) = self.patched(&a.agent, &a.payload)?;
                (entry, Some((a.agent.clone(), a.payload.clone())))
            }
            ApprovalKind::Other(kind) => {
                return Err(format!("approval #{id} has an unknown kind {kind:?}"))
            }
        };
        self.deciding.insert(id);
        let name = entry.name.clone();
        let spawn = patch.is_none();
        let work = self.supervisor_work(move |reply| LifecycleCmd::Apply {
            agent: entry,
            reply,
        });
        Ok(Done::Offload(Box::new(move |hub| {
            let text = match (work(hub), spawn) {
                (Ok(_), true) => format!("{name} spawned and running"),
                (Err(e), true) => format!("{name} added to the fleet, but not started: {e}"),
                (Ok(_), false) => format!("{name} restarts with its new entry"),
                (Err(e), false) => format!("the fleet entry of {name} changed; restart it: {e}"),
            };
            relay(follow_up(
                hub,
                Identity::Operator,
                Followup::Approved { id, text, patch },
            ))
        })))
    }

    /// The second half of `approve`, once the supervisor answered.
    pub(super) fn approved(
        &mut self,
        id: i64,
        text: String,
        patch: Option<(String, Value)>,
    ) -> Result<TextReply, String> {
        self.deciding.remove(&id);
        let a = self.pending_approval(id)?;
        if let Some((agent, patch)) = patch {
            let (cfg, _) = self.patched(&agent, &patch)?;
            self.cfg = cfg;
            self.write_fleet_file()?;
        }
        self.db
            .decide_approval(id, &ApprovalState::Approved, None, now())
            .map_err(db_err)?;
        let body = format!("[approval #{id} approved] {text}");
        self.tell_requester(&a.requester, &body);
        Ok(TextReply { text })
    }

    /// The operator's permissions tab: new groups and capabilities for an
    /// agent. The supervisor restarts it with them; then the hub's config and
    /// the fleet file follow.
    pub(super) fn set_permissions(&mut self, c: SetPermissions) -> Handled<TextReply> {
        let patch = json!({ "tool_groups": c.tool_groups, "capabilities": c.capabilities });
        let (_, entry) = self.patched(&c.agent, &patch)?;
        let work = self.supervisor_work(move |reply| LifecycleCmd::Apply {
            agent: entry,
            reply,
        });
        let agent = c.agent;
        Ok(Done::Offload(Box::new(move |hub| {
            let started = work(hub);
            relay(follow_up(
                hub,
                Identity::Operator,
                Followup::Permissions {
                    agent,
                    patch,
                    started,
                },
            ))
        })))
    }

    /// The second half of `set_permissions`.
    pub(super) fn permissions_applied(
        &mut self,
        agent: &str,
        patch: &Value,
        started: Result<String, String>,
    ) -> Result<TextReply, String> {
        let (cfg, _) = self.patched(agent, patch)?;
        self.cfg = cfg;
        self.write_fleet_file()?;
        let text = match started {
            Ok(_) => format!("{agent} restarts with its new permissions"),
            Err(e) => format!("the fleet entry of {agent} changed; restart it: {e}"),
        };
        Ok(TextReply { text })
    }

    pub(super) fn deny_as_operator(&mut self, c: Deny) -> Result<TextReply, String> {
        self.deny(c.id, c.why, "operator")
    }

    /// Denies (the operator) or cancels (its requester or root agent) a pending
    /// approval; the requester is told unless it cancelled it itself.
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

    /// `cancel_loose_end(kind="approval")`: the requester or its root agent
    /// withdraws a pending approval.
    pub(super) fn cancel_approval(
        &mut self,
        agent: &str,
        id: i64,
    ) -> Result<crate::proto::Empty, String> {
        if !self.approvals_of(agent)?.iter().any(|a| a.id == id) {
            return Err(format!(
                "no pending approval #{id} that {agent} may cancel (its own requests, or its tree's for a root agent)"
            ));
        }
        self.deny(id, None, agent).map(|_| crate::proto::Empty {})
    }
}

/// Reads the patch file `commit_ref`, on a connection thread. The file must lie
/// inside the caller's own dir `own` = `STATE/agents/CALLER/` (under `hive up`
/// that holds its state dir, claude's cwd, against which a relative path is
/// resolved), so the broker never reads a file for an agent that the agent
/// could not have written; it must be a regular file (opened without blocking,
/// so a FIFO is refused rather than waited on) of at most [`MAX_PATCH_BYTES`].
fn read_patch_file(own: &Path, commit_ref: &str) -> Result<Value, String> {
    let shown = excerpt(commit_ref);
    let not_readable = |e: std::io::Error| {
        format!(
            "commit_ref {shown} is neither a JSON object nor a readable file in your state dir: {e}"
        )
    };
    let path: PathBuf = own.join("state").join(commit_ref);
    let real = path.canonicalize().map_err(not_readable)?;
    let own = own.canonicalize().map_err(not_readable)?;
    if !real.starts_with(&own) {
        return Err(format!(
            "commit_ref {shown} is outside your own dir {}; write the patch into your state dir, or pass it inline",
            own.display()
        ));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(&real)
        .map_err(not_readable)?;
    let meta = file.metadata().map_err(not_readable)?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(format!(
            "commit_ref {shown} is {kind}, not a regular file; write the patch into a regular file in your state dir, or pass it inline"
        ));
    }
    if meta.len() > MAX_PATCH_BYTES as u64 {
        return Err(format!(
            "commit_ref {shown} is {} bytes; a patch file may be at most {MAX_PATCH_BYTES} bytes",
            meta.len()
        ));
    }
    let mut text = String::new();
    file.take(MAX_PATCH_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(not_readable)?;
    if text.len() > MAX_PATCH_BYTES {
        return Err(format!(
            "commit_ref {shown} grew past {MAX_PATCH_BYTES} bytes while it was read"
        ));
    }
    parse_patch(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let cases = [
            (
                json!({"a":1,"b":2}),
                json!({"b":null,"c":3}),
                json!({"a":1,"c":3}),
            ),
            (
                json!({"env":{"X":"1"}}),
                json!({"env":{"Y":"2"}}),
                json!({"env":{"X":"1","Y":"2"}}),
            ),
            (
                json!({"tool_groups":["a"]}),
                json!({"tool_groups":["b"]}),
                json!({"tool_groups":["b"]}),
            ),
        ];
        for (mut t, p, want) in cases {
            merge_patch(&mut t, &p);
            assert_eq!(t, want);
        }
    }
}
