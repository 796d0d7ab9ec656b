//! The privileged tool groups on the hub — lifecycle, approvals, scheduling,
//! diagnostics and the `read_host_journal` capability — and the operator's
//! approval commands. Each agent request is checked against the caller's
//! configured groups and capabilities here, on the socket that identifies it:
//! this is the privilege boundary, `hive mcp` only decides what is listed.
//! Lifecycle work is forwarded to the supervisor of `hive up`; under plain
//! `hive broker` there is none and those tools answer an error.

use super::{db_err, limits, now, Followup, Hub, HubMsg, HubResult, Identity, Outcome};
use crate::broker::db::NewMessage;
use crate::config::{check_name, AgentConfig, HiveConfig};
use crate::fleet::supervisor::{Reply, SupCmd};
use crate::groups::ToolGroup;
use crate::wire;
use crossbeam_channel::Sender;
use serde_json::{json, Value};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long the hub waits for the supervisor to confirm a lifecycle command.
const SUPERVISOR_TIMEOUT: Duration = Duration::from_secs(10);

/// Most lines `get_logs` and `get_host_journal` return.
const MAX_LINES: u64 = 2000;

/// Most bytes of a merge patch `request_apply_commit` accepts, inline or in a
/// file.
pub const MAX_PATCH_BYTES: usize = wire::MAX_BODY;

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

impl Hub {
    pub(super) fn require_group(
        &self,
        agent: &str,
        g: ToolGroup,
        tool: &str,
    ) -> Result<(), String> {
        let has = self
            .cfg
            .agent(agent)
            .is_some_and(|a| a.groups().contains(&g));
        if has {
            Ok(())
        } else {
            Err(format!(
                "{tool} needs the {} tool group, which {agent} is not granted; the operator grants it in the fleet file",
                g.name()
            ))
        }
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

    fn supervisor_call(&self, make: impl FnOnce(Reply) -> SupCmd) -> HubResult {
        let Some(sup) = &self.settings.supervisor else {
            return Err("this broker runs without a supervisor (plain `hive broker`), so agents cannot be started or stopped from here; run the hive with `hive up`".into());
        };
        let (tx, rx) = crossbeam_channel::bounded(1);
        sup.send(make(tx))
            .map_err(|_| "the supervisor has stopped (the hive is shutting down)".to_string())?;
        match rx.recv_timeout(SUPERVISOR_TIMEOUT) {
            Ok(Ok(text)) => Ok(wire::ok_line(&wire::TextReply { text })),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the supervisor did not answer in time; try again".into()),
        }
    }

    pub(super) fn lifecycle(&mut self, caller: &str, req: wire::Request) -> HubResult {
        let tool = req.cmd();
        self.require_group(caller, ToolGroup::Lifecycle, tool)?;
        match req {
            wire::Request::RequestSpawn { name } => self.request_spawn(caller, &name),
            wire::Request::Kill { name } => {
                self.require_child(caller, &name, tool)?;
                self.supervisor_call(|reply| SupCmd::Kill { name, reply })
            }
            wire::Request::Start { name } => {
                self.require_child(caller, &name, tool)?;
                self.supervisor_call(|reply| SupCmd::Start { name, reply })
            }
            wire::Request::Restart { name } => {
                self.require_child(caller, &name, tool)?;
                self.supervisor_call(|reply| SupCmd::Restart { name, reply })
            }
            wire::Request::Update { name } => {
                self.require_child(caller, &name, tool)?;
                self.supervisor_call(|reply| SupCmd::Update { name, reply })
            }
            other => Err(format!("{} is not a lifecycle command", other.cmd())),
        }
    }

    /// Tells the operator (inbox) that an approval waits.
    fn announce_approval(&mut self, id: i64, what: &str) -> Result<(), String> {
        let body = format!(
            "[approval #{id}] {what}. Approve with `hive approve {id}` or deny with `hive deny {id} --why TEXT` (or on the dashboard)."
        );
        self.deliver("system", "operator", &body, "approval_requested", None)
            .map(|_| ())
    }

    fn request_spawn(&mut self, caller: &str, name: &str) -> HubResult {
        check_name(name).map_err(|e| format!("request_spawn: {e}"))?;
        if self.cfg.agent(name).is_some() {
            return Err(format!(
                "request_spawn: an agent named {name:?} already exists"
            ));
        }
        let pending = self.db.pending_approvals().map_err(db_err)?;
        if let Some(p) = pending
            .iter()
            .find(|p| p.kind == "spawn" && p.agent == name)
        {
            return Err(format!(
                "request_spawn: approval #{} for {name:?} is already pending",
                p.id
            ));
        }
        let entry = AgentConfig {
            name: name.into(),
            parent: Some(caller.into()),
            ..AgentConfig::default()
        };
        let payload = serde_json::to_string(&entry).map_err(|e| e.to_string())?;
        let id = self
            .db
            .insert_approval("spawn", caller, name, &payload, now())
            .map_err(db_err)?;
        self.announce_approval(
            id,
            &format!("{caller} asks to spawn a child agent {name:?}"),
        )?;
        Ok(wire::ok_line(&json!({
            "id": id,
            "text": format!("approval #{id} queued: the operator decides; you get a message either way")
        })))
    }

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

    /// May `caller` propose a change to `agent`'s entry?
    pub(super) fn check_apply_commit(&self, caller: &str, agent: &str) -> Result<(), String> {
        self.require_group(caller, ToolGroup::Approvals, "request_apply_commit")?;
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
        agent: String,
        commit_ref: String,
    ) -> Result<Outcome, String> {
        self.check_apply_commit(caller, &agent)?;
        if commit_ref.trim_start().starts_with('{') {
            if commit_ref.len() > MAX_PATCH_BYTES {
                return Err(format!(
                    "commit_ref is {} bytes; a patch may be at most {MAX_PATCH_BYTES} bytes",
                    commit_ref.len()
                ));
            }
            let patch = parse_patch(&commit_ref)?;
            return self
                .queue_apply_commit(caller, &agent, &patch)
                .map(Outcome::Answer);
        }
        let own = self.settings.state_dir.join("agents").join(caller);
        let who = Identity::Agent(caller.to_string());
        Ok(Outcome::Offload(Box::new(move |hub: &Sender<HubMsg>| {
            let patch = match read_patch_file(&own, &commit_ref) {
                Ok(p) => p,
                Err(e) => return wire::err_line(&e),
            };
            let (reply, answer) = crossbeam_channel::bounded(1);
            let msg = HubMsg::Followup {
                who,
                followup: Followup::ApplyCommit { agent, patch },
                reply,
            };
            if hub.send(msg).is_err() {
                return wire::err_line("broker is stopping");
            }
            answer
                .recv()
                .unwrap_or_else(|_| wire::err_line("broker is stopping"))
        })))
    }

    /// Validates `patch` against the fleet and queues it for the operator.
    pub(super) fn queue_apply_commit(
        &mut self,
        caller: &str,
        agent: &str,
        patch: &Value,
    ) -> HubResult {
        self.patched(agent, patch)?;
        let id = self
            .db
            .insert_approval("apply_commit", caller, agent, &patch.to_string(), now())
            .map_err(db_err)?;
        self.announce_approval(
            id,
            &format!(
                "{caller} proposes a change to the fleet entry of {agent}: {}",
                limits::preview(&patch.to_string(), 2000)
            ),
        )?;
        Ok(wire::ok_line(&json!({
            "id": id,
            "text": format!("approval #{id} queued: the operator decides; you get a message either way")
        })))
    }

    pub(super) fn approvals(&self) -> HubResult {
        let mut budget = limits::Budget::new();
        let approvals = budget.fit(self.db.pending_approvals().map_err(db_err)?);
        Ok(wire::ok_line(&wire::ApprovalsReply {
            approvals,
            left_off: budget.left_off,
        }))
    }

    fn pending_approval(&self, id: i64) -> Result<wire::Approval, String> {
        self.db
            .pending_approvals()
            .map_err(db_err)?
            .into_iter()
            .find(|a| a.id == id)
            .ok_or_else(|| format!("no pending approval #{id}"))
    }

    fn tell(&mut self, to: &str, kind: &str, body: &str) {
        if self.cfg.agent(to).is_none() {
            return;
        }
        if let Err(e) = self.deliver("system", to, body, kind, None) {
            log::error!("cannot tell {to} about an approval: {e}");
        }
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

    pub(super) fn approve(&mut self, id: i64) -> HubResult {
        let a = self.pending_approval(id)?;
        let text = match a.kind.as_str() {
            "spawn" => {
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
                let started = self.supervisor_call(|reply| SupCmd::Apply {
                    agent: entry.clone(),
                    reply,
                });
                match started {
                    Ok(_) => format!("{} spawned and running", entry.name),
                    Err(e) => format!("{} added to the fleet, but not started: {e}", entry.name),
                }
            }
            "apply_commit" => {
                let (cfg, entry) = self.patched(&a.agent, &a.payload)?;
                // The supervisor learns the new entry before the file changes, so
                // crash_watch does not see a stale agent in between.
                let started = self.supervisor_call(|reply| SupCmd::Apply {
                    agent: entry.clone(),
                    reply,
                });
                self.cfg = cfg;
                self.write_fleet_file()?;
                match started {
                    Ok(_) => format!("{} restarts with its new entry", entry.name),
                    Err(e) => format!("the fleet entry of {} changed; restart it: {e}", entry.name),
                }
            }
            other => return Err(format!("approval #{id} has an unknown kind {other:?}")),
        };
        self.db
            .decide_approval(id, "approved", None, now())
            .map_err(db_err)?;
        let body = format!("[approval #{id} approved] {text}");
        self.tell(&a.requester.clone(), "approval_decided", &body);
        Ok(wire::ok_line(&wire::TextReply { text }))
    }

    /// The operator's permissions tab: new groups and capabilities for `agent`,
    /// written to the fleet file; the agent restarts with them.
    pub(super) fn set_permissions(
        &mut self,
        agent: &str,
        tool_groups: Vec<String>,
        capabilities: Vec<String>,
    ) -> HubResult {
        let patch = json!({ "tool_groups": tool_groups, "capabilities": capabilities });
        let (cfg, entry) = self.patched(agent, &patch)?;
        let started = self.supervisor_call(|reply| SupCmd::Apply {
            agent: entry.clone(),
            reply,
        });
        self.cfg = cfg;
        self.write_fleet_file()?;
        let text = match started {
            Ok(_) => format!("{agent} restarts with its new permissions"),
            Err(e) => format!("the fleet entry of {agent} changed; restart it: {e}"),
        };
        Ok(wire::ok_line(&wire::TextReply { text }))
    }

    pub(super) fn deny(&mut self, id: i64, why: Option<String>, by: &str) -> HubResult {
        let a = self.pending_approval(id)?;
        let state = if by == "operator" {
            "denied"
        } else {
            "cancelled"
        };
        self.db
            .decide_approval(id, state, why.as_deref(), now())
            .map_err(db_err)?;
        let body = format!(
            "[approval #{id} {state} by {by}] {} of {}{}",
            a.kind,
            a.agent,
            why.map(|w| format!(": {w}")).unwrap_or_default()
        );
        if a.requester != by {
            self.tell(&a.requester.clone(), "approval_decided", &body);
        }
        Ok(wire::ok_line(&wire::TextReply { text: body }))
    }

    /// The root of `agent`'s tree.
    fn root_of(&self, agent: &str) -> String {
        let mut cur = agent.to_string();
        for _ in 0..=self.cfg.agents.len() {
            let p = self.cfg.parent_of(&cur);
            if p == "operator" {
                break;
            }
            cur = p;
        }
        cur
    }

    /// Pending approvals an agent sees as loose ends: its own requests, and for
    /// a root agent every one from its tree.
    pub(super) fn approvals_of(&self, agent: &str) -> Result<Vec<wire::Approval>, String> {
        let root = self.cfg.parent_of(agent) == "operator";
        Ok(self
            .db
            .pending_approvals()
            .map_err(db_err)?
            .into_iter()
            .filter(|a| a.requester == agent || (root && self.root_of(&a.requester) == agent))
            .collect())
    }

    /// `cancel_loose_end(kind="approval")`: the requester or its root agent
    /// withdraws a pending approval.
    pub(super) fn cancel_approval(&mut self, agent: &str, id: i64) -> HubResult {
        if !self.approvals_of(agent)?.iter().any(|a| a.id == id) {
            return Err(format!(
                "no pending approval #{id} that {agent} may cancel (its own requests, or its tree's for a root agent)"
            ));
        }
        self.deny(id, None, agent)
    }

    pub(super) fn schedule_prompt(
        &mut self,
        agent: &str,
        body: &str,
        at: Option<i64>,
        delay: Option<u64>,
        every: Option<u64>,
    ) -> HubResult {
        self.require_group(agent, ToolGroup::Scheduling, "schedule_prompt")?;
        limits::check_body("body", body)?;
        if every.is_some_and(|e| e < 60) {
            return Err("every_seconds must be at least 60".into());
        }
        let t = now();
        let fire_at =
            match (at, delay) {
                (Some(at), None) => at,
                (None, Some(d)) => t + d.min(10 * 365 * 86400) as i64,
                (None, None) => match every {
                    Some(e) => t + e as i64,
                    None => return Err(
                        "schedule_prompt needs at_unix_timestamp, delay_seconds or every_seconds"
                            .into(),
                    ),
                },
                (Some(_), Some(_)) => {
                    return Err("give at_unix_timestamp or delay_seconds, not both".into())
                }
            };
        let pending = self.db.scheduled_of(agent).map_err(db_err)?.len() as u64;
        if pending >= self.settings.remind_max_pending {
            return Err(format!(
                "{agent} already has {pending} scheduled prompts (the limit); cancel some with cancel_scheduled"
            ));
        }
        let id = self
            .db
            .insert_scheduled(agent, body, fire_at, every, t)
            .map_err(db_err)?;
        Ok(wire::ok_line(&json!({ "id": id, "fire_at": fire_at })))
    }

    pub(super) fn list_scheduled(&self, agent: &str) -> HubResult {
        self.require_group(agent, ToolGroup::Scheduling, "list_scheduled")?;
        let mut budget = limits::Budget::new();
        let scheduled = budget.fit(self.db.scheduled_of(agent).map_err(db_err)?);
        Ok(wire::ok_line(&wire::ScheduledReply {
            scheduled,
            left_off: budget.left_off,
        }))
    }

    pub(super) fn cancel_scheduled(&mut self, agent: &str, id: i64) -> HubResult {
        self.require_group(agent, ToolGroup::Scheduling, "cancel_scheduled")?;
        if self.db.delete_scheduled(agent, id).map_err(db_err)? {
            Ok(wire::ok_line(&json!({})))
        } else {
            Err(format!("no scheduled prompt #{id} of {agent}"))
        }
    }

    /// Delivers due scheduled prompts; a repeating one moves to its next slot
    /// (missed slots are skipped, not delivered in a burst).
    pub(super) fn fire_scheduled(&mut self, t: i64) {
        let due = match self.db.due_scheduled(t) {
            Ok(d) => d,
            Err(e) => {
                log::error!("cannot read due scheduled prompts: {e}");
                return;
            }
        };
        for s in due {
            let next = s.every_seconds.map(|e| {
                let e = e.max(1) as i64;
                let mut at = s.fire_at + e;
                if at <= t {
                    at += ((t - at) / e + 1) * e;
                }
                at
            });
            let body = format!("[scheduled #{}] {}", s.id, s.body);
            let msg = NewMessage {
                from: "scheduler",
                to: &s.agent,
                body: &body,
                kind: "scheduled",
                in_reply_to: None,
            };
            match self.db.fire_scheduled(&s, next, &msg, t) {
                Ok(()) => self.notify(&s.agent),
                Err(e) => log::error!("cannot fire scheduled prompt {}: {e}", s.id),
            }
        }
    }

    pub(super) fn get_logs(
        &self,
        caller: &str,
        agent: Option<String>,
        lines: Option<u64>,
    ) -> HubResult {
        self.require_group(caller, ToolGroup::Diagnostics, "get_logs")?;
        let target = agent.unwrap_or_else(|| caller.to_string());
        self.check_agent(&target)?;
        let cap = self
            .cfg
            .agent(caller)
            .is_some_and(|c| c.has_capability("query_agent_state"));
        if target != caller && self.cfg.parent_of(&target) != caller && !cap {
            return Err(format!(
                "get_logs: {target} is not a child of {caller}; other agents' logs need the query_agent_state capability"
            ));
        }
        let Some(dir) = &self.settings.logs_dir else {
            return Err("this broker runs without a supervisor (plain `hive broker`), so it keeps no agent logs; run the hive with `hive up`".into());
        };
        let n = lines.unwrap_or(100).clamp(1, MAX_LINES) as usize;
        let text = crate::fleet::logfile::tail(&dir.join(format!("{target}.log")), n)?;
        Ok(wire::ok_line(&wire::TextReply {
            text: limits::fit_text_tail(text),
        }))
    }

    /// Checks the `read_host_journal` capability and the arguments; the
    /// returned job runs journalctl on the caller's connection thread, so a slow
    /// journal never holds up the hub.
    pub(super) fn host_journal_job(
        &self,
        caller: &str,
        unit: Option<String>,
        lines: Option<u64>,
    ) -> Result<super::Job, String> {
        let cap = self
            .cfg
            .agent(caller)
            .is_some_and(|c| c.has_capability("read_host_journal"));
        if !cap {
            return Err(format!(
                "get_host_journal needs the read_host_journal capability, which {caller} is not granted"
            ));
        }
        if let Some(u) = &unit {
            if u.is_empty()
                || u.starts_with('-')
                || u.len() > 256
                || u.contains(char::is_whitespace)
                || u.chars().any(wire::is_control_or_bidi)
            {
                return Err(format!("unit {} is not a unit name", wire::excerpt(u)));
            }
        }
        let n = lines.unwrap_or(100).clamp(1, MAX_LINES);
        Ok(Box::new(move |_: &Sender<HubMsg>| {
            match read_journal(unit.as_deref(), n) {
                Ok(text) => wire::ok_line(&wire::TextReply {
                    text: limits::fit_text_tail(text),
                }),
                Err(e) => wire::err_line(&e),
            }
        }))
    }

    /// The supervisor applied `a`: the hub's rules follow.
    pub(super) fn apply_agent(&mut self, a: AgentConfig) {
        let mut cfg = self.cfg.clone();
        match cfg.agents.iter_mut().find(|x| x.name == a.name) {
            Some(slot) => *slot = a,
            None => cfg.agents.push(a),
        }
        match cfg.validate() {
            Ok(()) => self.cfg = cfg,
            Err(e) => log::warn!("ignoring an agent config the supervisor applied: {e}"),
        }
    }

    pub(super) fn supervision(&self) -> HubResult {
        let Some(sup) = &self.settings.supervisor else {
            return Err("this broker runs without a supervisor (plain `hive broker`)".into());
        };
        let (tx, rx) = crossbeam_channel::bounded(1);
        sup.send(SupCmd::States { reply: tx })
            .map_err(|_| "the supervisor has stopped".to_string())?;
        let agents = rx
            .recv_timeout(SUPERVISOR_TIMEOUT)
            .map_err(|_| "the supervisor did not answer in time".to_string())?;
        Ok(wire::ok_line(&wire::SupervisionReply { agents }))
    }
}

/// Parses a merge patch: a JSON object that does not rename the agent.
fn parse_patch(text: &str) -> Result<Value, String> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| format!("commit_ref is not valid JSON: {e}"))?;
    if !v.is_object() {
        return Err("commit_ref must be a JSON object (a merge patch of the agent's entry)".into());
    }
    if v.get("name").is_some_and(|n| n != &Value::Null) {
        return Err("commit_ref cannot rename an agent (drop \"name\" from the patch)".into());
    }
    Ok(v)
}

/// Reads the patch file `commit_ref`, on a connection thread. The file must lie
/// inside the caller's own dir `own` = `STATE/agents/CALLER/` (under `hive up`
/// that holds its state dir, claude's cwd, against which a relative path is
/// resolved), so the broker never reads a file for an agent that the agent
/// could not have written; it must be a regular file (opened without blocking,
/// so a FIFO is refused rather than waited on) of at most [`MAX_PATCH_BYTES`].
fn read_patch_file(own: &Path, commit_ref: &str) -> Result<Value, String> {
    let shown = wire::excerpt(commit_ref);
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

/// `journalctl --no-pager -q -n N [-u UNIT]`, with a wall-clock limit.
fn read_journal(unit: Option<&str>, n: u64) -> Result<String, String> {
    let mut cmd = std::process::Command::new("journalctl");
    cmd.args(["--no-pager", "-q", "-n", &n.to_string()]);
    if let Some(u) = unit {
        cmd.args(["-u", u]);
    }
    match crate::sys::run_with_timeout(&mut cmd, Duration::from_secs(10)) {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Ok(out) => Err(format!(
            "journalctl failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(crate::sys::RunError::Start(e)) => Err(format!(
            "journalctl is not available on this host ({e}); there is no host journal to read"
        )),
        Err(e) => Err(format!("journalctl {e}")),
    }
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
