//! Approvals: changes an agent proposes and the operator decides — a new child
//! (`request_spawn`, queued in `lifecycle.rs`) or a merge patch of a fleet-file
//! entry (`request_apply_commit`) — and the operator's `approvals`, `approve`,
//! `deny` and `set_permissions`. Carrying one out never blocks the hub: the
//! fleet file is changed (three-way, keeping every hand edit:
//! `broker::fleetfile`) and the supervisor asked on the caller's connection
//! thread, and what that changes comes back as a [`Followup`]; only then does
//! the hub record the decision, so a stuck supervisor never holds the hub and
//! an approval is decided once. A change the fleet file refuses (a conflict
//! with a hand edit, a file hive cannot write) changes nothing: the approval
//! stays pending.

use super::lifecycle::{ask_supervisor, NO_SUPERVISOR};
use super::{db_err, Done, Followup, Handled, Hub, HubMsg, HubTx, Identity, NewSocket, Work};
use crate::broker::fleetfile::{self, Change};
use crate::broker::lifecycle::{EntryChange, LifecycleCmd};
use crate::config::{AgentConfig, HiveConfig};
use crate::proto::cmd::{
    parse_patch, ApprovalsReply, Approve, Deny, RequestApplyCommit, SetPermissions,
};
use crate::proto::limits::MAX_PATCH_BYTES;
use crate::proto::text::{excerpt, preview};
use crate::proto::{
    now, Approval, ApprovalKind, ApprovalState, Empty, MsgKind, QueuedReply, TextReply,
};
use serde_json::{json, Value};
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// Sends a follow-up to the hub and waits for its answer line.
fn follow_up(hub: &HubTx, who: Identity, followup: Followup) -> Result<String, String> {
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
pub(super) fn relay<R: serde::de::DeserializeOwned>(
    line: Result<String, String>,
) -> Result<R, String> {
    let line = line?;
    crate::proto::lines::decode(&line, "the hub", "the follow-up").map_err(|e| e.to_string())
}

/// Sends a follow-up and decodes its answer.
pub(super) fn follow<R: serde::de::DeserializeOwned>(
    hub: &HubTx,
    who: Identity,
    followup: Followup,
) -> Result<R, String> {
    relay(follow_up(hub, who, followup))
}

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
        Ok(Box::new(move |_| {
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
            follow(hub, who, followup)
        })))
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
    /// then the hub gives the agent its socket and rules ([`Followup::Joined`])
    /// and the supervisor starts it; an apply_commit's patch goes to the
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
                Ok(Done::Offload(Box::new(move |hub| {
                    let name = entry.name.clone();
                    if let Some(path) = &path {
                        let patch = serde_json::to_value(&entry).map_err(|e| e.to_string())?;
                        let change = Change {
                            agent: &name,
                            base: None,
                            patch: &patch,
                        };
                        if let Err(e) = fleetfile::apply(path, &change) {
                            let followup = Followup::Approved {
                                id,
                                result: Err(e),
                                patch: None,
                            };
                            return follow(hub, Identity::Operator, followup);
                        }
                    }
                    follow::<Empty>(hub, Identity::Operator, Followup::Joined { id, entry })?;
                    let result = Ok(match start(hub) {
                        Ok(_) => format!("{name} spawned and running"),
                        Err(e) => format!("{name} added to the fleet, but not started: {e}"),
                    });
                    let followup = Followup::Approved {
                        id,
                        result,
                        patch: None,
                    };
                    follow(hub, Identity::Operator, followup)
                })))
            }
            ApprovalKind::ApplyCommit => {
                self.patched(&a.agent, &a.payload)?;
                let work = self.entry_work(&a.agent, a.payload.clone())?;
                self.deciding.insert(id);
                let patch = Some((a.agent, a.payload));
                Ok(Done::Offload(Box::new(move |hub| {
                    let result = work(hub);
                    let followup = Followup::Approved { id, result, patch };
                    follow(hub, Identity::Operator, followup)
                })))
            }
            ApprovalKind::Other(kind) => {
                Err(format!("approval #{id} has an unknown kind {kind:?}"))
            }
        }
    }

    /// A spawned agent's entry is in the fleet file: its socket and its rules.
    pub(super) fn joined(&mut self, id: i64, entry: AgentConfig) -> Result<Empty, String> {
        let mut cfg = self.cfg.clone();
        cfg.agents.push(entry.clone());
        let added = cfg
            .validate()
            .map_err(|e| format!("approval #{id} cannot be applied: {e}"))
            .and_then(|_| match &self.settings.run_dir {
                Some(run_dir) => {
                    let (listener, path) = crate::broker::bind::agent_listener(run_dir, &entry)?;
                    self.bound.insert(entry.name.clone());
                    self.new_sockets.push(NewSocket {
                        listener,
                        who: Identity::Agent(entry.name.clone()),
                        path,
                    });
                    Ok(())
                }
                None => Ok(()),
            });
        if let Err(e) = added {
            self.deciding.remove(&id);
            return Err(e);
        }
        self.cfg = cfg;
        Ok(Empty {})
    }

    /// The second half of `approve`, once the change was carried out (or
    /// refused: then the approval stays pending).
    pub(super) fn approved(
        &mut self,
        id: i64,
        result: Result<String, String>,
        patch: Option<(String, Value)>,
    ) -> Result<TextReply, String> {
        self.deciding.remove(&id);
        if let Some((agent, _)) = &patch {
            self.changing.remove(agent);
        }
        let text = result?;
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
        Ok(Done::Offload(Box::new(move |hub| {
            let result = work(hub);
            let followup = Followup::Permissions {
                agent,
                patch,
                result,
            };
            follow(hub, Identity::Operator, followup)
        })))
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

/// Reads the patch file `commit_ref`, on a connection thread. The file must lie
/// inside the caller's own dir `own` = `STATE/agents/CALLER/` (under `hive up`
/// that holds its state dir, claude's cwd, against which a relative path is
/// resolved), so the broker never reads a file for an agent that the agent
/// could not have written; it must be a regular file (opened without blocking,
/// so a FIFO is refused rather than waited on) of at most [`MAX_PATCH_BYTES`].
///
/// Containment is checked on the path's words first, and the file is then
/// opened beneath `own` one name at a time without following a symlink: the
/// broker resolves nothing outside the agent's dir, and a path that is not
/// there, is outside, or leads through a symlink gets one and the same
/// answer, so an agent cannot learn whether a path outside its dir exists
/// (robustness review N10: `/etc/shadow` and `/etc/shadowx` were told apart).
fn read_patch_file(own: &Path, commit_ref: &str) -> Result<Value, String> {
    let shown = excerpt(commit_ref);
    let not_here = || {
        format!(
            "commit_ref {shown} is not there or outside your own dir {} (its path is read \
             there without following a symlink); write the patch into a regular file in your \
             state dir, or pass it inline",
            own.display()
        )
    };
    let rel = beneath(own, commit_ref).ok_or_else(not_here)?;
    // The dir itself is the broker's: a symlink on its path is followed.
    let own = own.canonicalize().unwrap_or_else(|_| own.to_path_buf());
    let not_readable = |e: std::io::Error| {
        format!(
            "commit_ref {shown} is neither a JSON object nor a readable file in your state dir: {e}"
        )
    };
    if rel.as_os_str().is_empty() {
        return Err(format!(
            "commit_ref {shown} is a directory, not a regular file; write the patch into a regular file in your state dir, or pass it inline"
        ));
    }
    let file = crate::sys::fd::open_beneath(&own, &rel, libc::O_NONBLOCK).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP) => not_here(),
            _ => not_readable(e),
        }
    })?;
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

/// `commit_ref` as a path of plain names inside `own`, resolved against its
/// `state` dir on the path's words alone (`.` and `..` applied, an absolute
/// path taken when it starts with `own`); None when it is outside.
fn beneath(own: &Path, commit_ref: &str) -> Option<PathBuf> {
    use std::path::Component;
    let path = Path::new(commit_ref);
    let (mut names, rest): (Vec<&std::ffi::OsStr>, &Path) = if path.is_absolute() {
        let canonical = own.canonicalize().ok();
        let rest = path
            .strip_prefix(own)
            .ok()
            .or_else(|| path.strip_prefix(canonical.as_deref()?).ok())?;
        (Vec::new(), rest)
    } else {
        (vec![std::ffi::OsStr::new("state")], path)
    };
    for c in rest.components() {
        match c {
            Component::Normal(n) => names.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                names.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(names.iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// An agent that swaps a directory of its patch's path for a symlink out
    /// of its own dir, over and over, while the broker reads the patch: the
    /// broker reads its own file or refuses, and never the file outside.
    #[test]
    fn a_directory_swapped_for_a_symlink_never_leads_the_read_outside() {
        let root = std::env::temp_dir().join(format!("hive-patch-swap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let own = root.join("agents/ana");
        let state = own.join("state");
        std::fs::create_dir_all(state.join("d")).unwrap();
        std::fs::write(state.join("d/patch.json"), r#"{"model":"opus"}"#).unwrap();
        std::fs::create_dir_all(root.join("outside")).unwrap();
        std::fs::write(root.join("outside/patch.json"), r#"{"model":"stolen"}"#).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, state, outside) = (stop.clone(), state.clone(), root.join("outside"));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::fs::rename(state.join("d"), state.join("d.real")).unwrap();
                    std::os::unix::fs::symlink(&outside, state.join("d")).unwrap();
                    std::fs::remove_file(state.join("d")).unwrap();
                    std::fs::rename(state.join("d.real"), state.join("d")).unwrap();
                }
            })
        };
        let (mut read, mut refused, mut tries) = (0, 0, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while tries < 5000 || read == 0 || refused == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the race was not seen both ways in a minute: read {read}, refused {refused}"
            );
            tries += 1;
            match read_patch_file(&own, "d/patch.json") {
                Ok(v) => {
                    assert_eq!(v, json!({"model":"opus"}), "read outside the agent's dir");
                    read += 1;
                }
                Err(e) => {
                    assert!(!e.contains("stolen"), "{e}");
                    refused += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A path outside the agent's dir is refused on its words, in the same
    /// words whether it exists or not, and so is a symlink out of the dir.
    #[test]
    fn a_missing_and_a_forbidden_path_get_the_same_answer() {
        let root = std::env::temp_dir().join(format!("hive-patch-oracle-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let own = root.join("agents/ana");
        std::fs::create_dir_all(own.join("state")).unwrap();
        std::fs::create_dir_all(root.join("agents/bob")).unwrap();
        std::fs::write(root.join("agents/bob/secret.json"), "{}").unwrap();
        let outside = root.join("agents/bob/secret.json");
        std::os::unix::fs::symlink(&outside, own.join("state/there.json")).unwrap();
        std::os::unix::fs::symlink(root.join("nope"), own.join("state/gone.json")).unwrap();
        let answer = |r: &str| read_patch_file(&own, r).unwrap_err().replace(r, "REF");
        let alike = answer("../../bob/secret.json");
        assert!(
            alike.contains("not there or outside your own dir"),
            "{alike}"
        );
        for r in [
            "../../bob/nope.json",
            "/etc/hostname",
            "/etc/hostnamex",
            outside.to_str().unwrap(),
            "there.json",
            "gone.json",
            "missing.json",
            "./../state/../../ana/../bob/secret.json",
        ] {
            assert_eq!(answer(r), alike, "{r}");
        }
        std::fs::write(own.join("state/p.json"), r#"{"model":"opus"}"#).unwrap();
        let absolute = own.join("state/p.json");
        for r in ["p.json", "./d/../p.json", absolute.to_str().unwrap()] {
            assert_eq!(
                read_patch_file(&own, r).unwrap(),
                json!({"model":"opus"}),
                "{r}"
            );
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
