//! The hub: the one thread that owns the broker's state — the sqlite store, the
//! config, the long-poll waiters, rows held by `recv` connections, transient wakes
//! and the timers for reminders and question TTLs. Connection threads send it a
//! [`HubMsg`] and get a finished answer line back, so every rule about who may do
//! what lives in [`Hub::handle`] and no lock is ever shared.

mod limits;
mod privileged;

pub use privileged::{merge_patch, MAX_PATCH_BYTES};

use super::db::{Db, NewMessage};
use crate::config::HiveConfig;
use crate::fleet::supervisor::SupCmd;
use crate::wire::{self, Request};
use crossbeam_channel::{Receiver, Sender};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Who is on the other end of a connection: decided by the socket it came in on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    Operator,
    Agent(String),
}

impl Identity {
    pub fn name(&self) -> &str {
        match self {
            Identity::Operator => "operator",
            Identity::Agent(a) => a,
        }
    }
}

pub type ConnId = u64;

/// What a connection thread asks of the hub.
pub enum HubMsg {
    Call {
        who: Identity,
        conn: ConnId,
        req: Request,
        /// False once the caller's wait has run out: answer now, even if empty.
        can_wait: bool,
        /// Signalled when something arrives for the caller while it waits.
        waiter: Sender<()>,
        reply: Sender<Outcome>,
    },
    /// The connection is gone: release what it held.
    Closed { conn: ConnId },
    /// A system event for an agent's (or the operator's) inbox, from the
    /// supervisor's crash_watch.
    System {
        to: String,
        kind: String,
        body: String,
    },
    /// The supervisor (re)started an agent with this config: the hub's rules
    /// follow it.
    ApplyAgent(crate::config::AgentConfig),
    /// The second half of an offloaded request: the connection thread did the
    /// blocking part and the hub now decides and changes its state.
    Followup {
        who: Identity,
        followup: Followup,
        reply: Sender<String>,
    },
    /// The broker is stopping: return and close the store.
    Shutdown,
}

/// Work the hub has authorised but that would block it (running a command,
/// reading a file): the connection thread runs it and sends the answer line it
/// returns. A job that must change the hub's state sends a
/// [`HubMsg::Followup`] on the channel it is given and waits for its answer.
pub type Job = Box<dyn FnOnce(&Sender<HubMsg>) -> String + Send>;

/// What an offloaded job hands back to the hub.
pub enum Followup {
    /// `request_apply_commit` with the patch read from the caller's file.
    ApplyCommit {
        agent: String,
        patch: serde_json::Value,
    },
}

/// The hub's answer to a call.
pub enum Outcome {
    Answer(String),
    /// Nothing yet; the waiter is registered and will be signalled.
    Wait,
    /// Authorised; the caller's connection thread computes the answer.
    Offload(Job),
}

impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Answer(line) => f.debug_tuple("Answer").field(line).finish(),
            Outcome::Wait => f.write_str("Wait"),
            Outcome::Offload(_) => f.write_str("Offload(..)"),
        }
    }
}

/// Payloads longer than this spill from a reminder row to a file.
pub const REMINDER_SPILL_BYTES: usize = 4096;

/// Longest status line.
pub const MAX_STATUS_CHARS: usize = 200;

/// Longest revision a harness reports with `kick`.
const MAX_REV_CHARS: usize = 100;

pub const KICK_BODY: &str = "You were just (re)started. Check your state dir for your notes; \
your --continue session is intact.";

/// Settings the hub needs besides the store and config.
pub struct HubSettings {
    pub state_dir: PathBuf,
    pub hyperhive_rev: String,
    pub remind_max_pending: u64,
    /// The supervisor of `hive up`; `None` under plain `hive broker`.
    pub supervisor: Option<Sender<SupCmd>>,
    /// The fleet file that approved changes are written to.
    pub config_path: Option<PathBuf>,
    /// Where `hive up` keeps the agents' logs.
    pub logs_dir: Option<PathBuf>,
    /// Binds the socket of an agent spawned at run time.
    pub listeners: Option<std::sync::Arc<super::Listeners>>,
}

enum Held {
    Stored(i64),
    Transient(wire::Message),
}

pub struct Hub {
    db: Db,
    cfg: HiveConfig,
    settings: HubSettings,
    waiters: HashMap<String, Vec<Sender<()>>>,
    held: HashMap<ConnId, (String, Vec<Held>)>,
    transient: HashMap<String, VecDeque<wire::Message>>,
    transient_inflight: HashMap<String, wire::Message>,
    next_transient_id: i64,
    harness_conns: HashMap<String, HashSet<ConnId>>,
    /// When the next reminder or question expiry is due (unix s), kept in memory
    /// so the hub's loop costs no query per request.
    next_due: Option<i64>,
}

/// The unprivileged tool group a broker command serves, for the commands behind
/// `hive mcp` tools. Harness plumbing (`recv_next`, `ack_turn`, `kick`, …) and
/// `wake` belong to no group.
fn core_group_of(cmd: &str) -> Option<crate::groups::ToolGroup> {
    use crate::groups::ToolGroup;
    match cmd {
        "send" | "recv" | "recv_ack" | "ask" | "answer" => Some(ToolGroup::Messaging),
        "set_status" | "get_agent_meta" => Some(ToolGroup::Meta),
        "get_loose_ends" | "cancel_loose_end" | "remind" => Some(ToolGroup::Inbox),
        _ => None,
    }
}

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

type HubResult = Result<String, String>;

fn db_err(e: rusqlite::Error) -> String {
    format!("message store error: {e}")
}

/// Most rows one `inbox` answer looks at.
const INBOX_ROWS: u32 = 1000;

impl Hub {
    pub fn new(db: Db, cfg: HiveConfig, settings: HubSettings) -> Hub {
        Hub {
            db,
            cfg,
            settings,
            waiters: HashMap::new(),
            held: HashMap::new(),
            transient: HashMap::new(),
            transient_inflight: HashMap::new(),
            next_transient_id: -1,
            harness_conns: HashMap::new(),
            next_due: None,
        }
    }

    /// Runs the hub until every sender of `rx` is gone.
    pub fn run(mut self, rx: Receiver<HubMsg>) {
        self.fire_due();
        self.recompute_due();
        loop {
            let msg = match self.next_due_in() {
                Some(wait) => match rx.recv_timeout(wait) {
                    Ok(m) => m,
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        self.fire_due();
                        continue;
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                },
                None => match rx.recv() {
                    Ok(m) => m,
                    Err(_) => break,
                },
            };
            match msg {
                HubMsg::Call {
                    who,
                    conn,
                    req,
                    can_wait,
                    waiter,
                    reply,
                } => {
                    let out = self.handle(&who, conn, req, can_wait, &waiter);
                    // A caller that went away is a normal outcome.
                    let _ = reply.send(out);
                }
                HubMsg::Closed { conn } => self.release(conn),
                HubMsg::System { to, kind, body } => {
                    if let Err(e) = self.deliver("system", &to, &body, &kind, None) {
                        log::error!("cannot deliver a {kind} event to {to}: {e}");
                    }
                }
                HubMsg::ApplyAgent(a) => self.apply_agent(a),
                HubMsg::Followup {
                    who,
                    followup,
                    reply,
                } => {
                    let line = match self.followup(&who, followup) {
                        Ok(line) => line,
                        Err(e) => wire::err_line(&e),
                    };
                    let _ = reply.send(line);
                }
                HubMsg::Shutdown => break,
            }
            if self.next_due.is_some_and(|t| t <= now()) {
                self.fire_due();
            }
        }
        log::debug!("hub stopped");
    }

    /// Re-reads when the next timer is due; called whenever reminders or
    /// questions change.
    fn recompute_due(&mut self) {
        let r = self.db.next_reminder().ok().flatten();
        let q = self.db.next_question_expiry().ok().flatten();
        let s = self.db.next_scheduled().ok().flatten();
        self.next_due = [r, q, s].into_iter().flatten().min();
    }

    fn next_due_in(&self) -> Option<Duration> {
        let due = self.next_due?;
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        Some(Duration::from_millis((due * 1000 - now_ms).max(0) as u64))
    }

    /// Fires due reminders and expires questions whose TTL ran out.
    fn fire_due(&mut self) {
        let t = now();
        match self.db.due_reminders(t) {
            Ok(due) => {
                for (rem, body) in due {
                    let text = match &rem.spill_file {
                        Some(f) => {
                            format!("[reminder #{}] {}… (full text in {f})", rem.id, rem.preview)
                        }
                        None => format!("[reminder #{}] {body}", rem.id),
                    };
                    let msg = NewMessage {
                        from: "reminder",
                        to: &rem.agent,
                        body: &text,
                        kind: "reminder",
                        in_reply_to: None,
                    };
                    match self.db.fire_reminder(rem.id, &msg, t) {
                        Ok(_) => self.notify(&rem.agent),
                        Err(e) => log::error!("cannot fire reminder {}: {e}", rem.id),
                    }
                }
            }
            Err(e) => log::error!("cannot read due reminders: {e}"),
        }
        match self.db.expired_questions(t) {
            Ok(expired) => {
                for q in expired {
                    if let Err(e) = self.close_question(&q, "[expired]", "system") {
                        log::error!("cannot expire question {}: {e}", q.id);
                    }
                }
            }
            Err(e) => log::error!("cannot read expired questions: {e}"),
        }
        self.fire_scheduled(t);
        self.recompute_due();
    }

    fn notify(&mut self, recipient: &str) {
        if let Some(list) = self.waiters.remove(recipient) {
            for w in list {
                let _ = w.try_send(());
            }
        }
    }

    fn wait_for(&mut self, recipient: &str, waiter: &Sender<()>) {
        let list = self.waiters.entry(recipient.to_string()).or_default();
        list.retain(|w| !w.is_full());
        list.push(waiter.clone());
    }

    /// Puts rows held by a closed connection back into the inbox, in order.
    fn release(&mut self, conn: ConnId) {
        for set in self.harness_conns.values_mut() {
            set.remove(&conn);
        }
        let Some((agent, rows)) = self.held.remove(&conn) else {
            return;
        };
        let stored: Vec<i64> = rows
            .iter()
            .filter_map(|h| match h {
                Held::Stored(id) => Some(*id),
                Held::Transient(_) => None,
            })
            .collect();
        if let Err(e) = self
            .db
            .transition_many(&stored, &agent, "held", "queued", now())
        {
            log::error!("cannot return held rows of {agent}: {e}");
        }
        let queue = self.transient.entry(agent.clone()).or_default();
        for h in rows.into_iter().rev() {
            if let Held::Transient(m) = h {
                queue.push_front(m);
            }
        }
        log::debug!("connection {conn} closed; rows held for {agent} returned to the inbox");
        self.notify(&agent);
    }

    /// Finishes an offloaded request.
    fn followup(&mut self, who: &Identity, f: Followup) -> HubResult {
        match (who, f) {
            (Identity::Agent(caller), Followup::ApplyCommit { agent, patch }) => {
                // Rights are checked again: the config may have changed while
                // the file was read.
                self.check_apply_commit(caller, &agent)?;
                self.queue_apply_commit(caller, &agent, &patch)
            }
            (Identity::Operator, Followup::ApplyCommit { .. }) => {
                Err("request_apply_commit is an agent command".into())
            }
        }
    }

    fn answer(&mut self, r: HubResult) -> Outcome {
        Outcome::Answer(match r {
            Ok(line) => line,
            Err(e) => wire::err_line(&e),
        })
    }

    /// Decides one request.
    pub fn handle(
        &mut self,
        who: &Identity,
        conn: ConnId,
        req: Request,
        can_wait: bool,
        waiter: &Sender<()>,
    ) -> Outcome {
        let cmd = req.cmd();
        // The socket is the privilege boundary: an agent's tool groups decide
        // which tool-backed commands it may use, whoever speaks on its socket.
        if let Identity::Agent(a) = who {
            if let Some(g) = core_group_of(cmd) {
                if let Err(e) = self.require_group(a, g, cmd) {
                    return self.answer(Err(e));
                }
            }
        }
        let result = match (who, req) {
            (_, Request::Hello { version }) => self.hello(who, version),
            (
                _,
                Request::Wake {
                    from,
                    body,
                    transient,
                    to,
                },
            ) => self.wake(who, &from, &body, transient, to),
            (
                _,
                Request::Send {
                    to,
                    body,
                    in_reply_to,
                },
            ) => self.send(who.name(), &to, &body, in_reply_to),
            (_, Request::GetAgentMeta { name }) => self.meta(who, name),
            (_, Request::Answer { id, answer }) => self.answer_question(who.name(), id, &answer),
            (Identity::Agent(a), Request::RecvNext { wait_seconds }) => {
                self.harness_conns
                    .entry(a.clone())
                    .or_default()
                    .insert(conn);
                match self.recv_next(a) {
                    Ok(Some(line)) => Ok(line),
                    Ok(None) if can_wait && wait_seconds.unwrap_or(0) > 0 => {
                        self.wait_for(&a.clone(), waiter);
                        return Outcome::Wait;
                    }
                    Ok(None) => Ok(wire::ok_line(&wire::RecvNextReply {
                        message: None,
                        redelivered: false,
                        unread: None,
                    })),
                    Err(e) => Err(e),
                }
            }
            (Identity::Agent(a), Request::Recv { wait_seconds, max }) => {
                let max = max.unwrap_or(1).clamp(1, 32);
                match self.drain(a, conn, max) {
                    Ok(page)
                        if page.messages.is_empty()
                            && can_wait
                            && wait_seconds.unwrap_or(0) > 0 =>
                    {
                        self.wait_for(&a.clone(), waiter);
                        return Outcome::Wait;
                    }
                    Ok(page) => Ok(wire::ok_line(&page)),
                    Err(e) => Err(e),
                }
            }
            (Identity::Agent(a), Request::RecvAck { ids }) => self.recv_ack(a, conn, &ids),
            (Identity::Agent(a), Request::Status {}) => self.status(a),
            (Identity::Agent(a), Request::AckTurn { id }) => self.finish_inflight(a, id, true),
            (Identity::Agent(a), Request::RequeueInflight { id }) => {
                self.finish_inflight(a, id, false)
            }
            (
                Identity::Agent(a),
                Request::PostTurnCounts {
                    turns,
                    ok,
                    failed,
                    tokens_in,
                    tokens_out,
                    cost_usd,
                },
            ) => limits::check_counts(turns, ok, failed, tokens_in, tokens_out, cost_usd).and_then(
                |_| {
                    self.db
                        .add_counts(a, turns, ok, failed, tokens_in, tokens_out, cost_usd)
                        .map(|_| wire::ok_line(&serde_json::json!({})))
                        .map_err(db_err)
                },
            ),
            (Identity::Agent(a), Request::Kick { hyperhive_rev }) => {
                self.harness_conns
                    .entry(a.clone())
                    .or_default()
                    .insert(conn);
                self.kick(a, hyperhive_rev)
            }
            (Identity::Agent(a), Request::SendToParent { body }) => {
                limits::check_body("body", &body).and_then(|_| {
                    let parent = self.cfg.parent_of(a);
                    self.deliver(a, &parent, &body, "message", None)
                })
            }
            (Identity::Agent(a), Request::SetStatus { text }) => self.set_status(a, &text),
            (
                Identity::Agent(a),
                Request::Ask {
                    question,
                    options,
                    multi,
                    ttl_seconds,
                    to,
                },
            ) => self.ask(a, &question, &options, multi, ttl_seconds, to),
            (Identity::Agent(a), Request::GetLooseEnds { agent }) => self.loose_ends(a, agent),
            (Identity::Agent(a), Request::CancelLooseEnd { kind, id }) => {
                self.cancel_loose_end(a, &kind, id)
            }
            (
                Identity::Agent(a),
                Request::Remind {
                    message,
                    delay_seconds,
                    at_unix_timestamp,
                },
            ) => self.remind(a, &message, delay_seconds, at_unix_timestamp),
            (
                Identity::Operator,
                Request::Inbox {
                    wait_seconds,
                    after,
                    ..
                },
            ) => match self.operator_inbox(after) {
                Ok(page)
                    if page.messages.is_empty() && can_wait && wait_seconds.unwrap_or(0) > 0 =>
                {
                    self.wait_for("operator", waiter);
                    return Outcome::Wait;
                }
                Ok(page) => Ok(wire::ok_line(&page)),
                Err(e) => Err(e),
            },
            (Identity::Operator, Request::InboxAck { ids }) => self
                .db
                .transition_many(&ids, "operator", "queued", "acked", now())
                .map(|n| wire::ok_line(&wire::AckedReply { acked: n as u64 }))
                .map_err(db_err),
            (Identity::Operator, Request::Agents {}) => self.agents(),
            (Identity::Operator, Request::Questions {}) => self
                .db
                .questions_where("target", "operator")
                .map(|questions| {
                    let mut budget = limits::Budget::new();
                    let questions = budget.fit(questions);
                    wire::ok_line(&wire::QuestionsReply {
                        questions,
                        left_off: budget.left_off,
                    })
                })
                .map_err(db_err),
            (Identity::Operator, Request::CancelQuestion { id }) => {
                self.cancel_question("operator", id, true)
            }
            (
                Identity::Agent(a),
                req @ (Request::RequestSpawn { .. }
                | Request::Kill { .. }
                | Request::Start { .. }
                | Request::Restart { .. }
                | Request::Update { .. }),
            ) => self.lifecycle(a, req),
            (Identity::Agent(a), Request::RequestApplyCommit { agent, commit_ref }) => {
                match self.request_apply_commit(a, agent, commit_ref) {
                    Ok(out) => return out,
                    Err(e) => Err(e),
                }
            }
            (
                Identity::Agent(a),
                Request::SchedulePrompt {
                    body,
                    at_unix_timestamp,
                    delay_seconds,
                    every_seconds,
                },
            ) => self.schedule_prompt(a, &body, at_unix_timestamp, delay_seconds, every_seconds),
            (Identity::Agent(a), Request::ListScheduled {}) => self.list_scheduled(a),
            (Identity::Agent(a), Request::CancelScheduled { id }) => self.cancel_scheduled(a, id),
            (Identity::Agent(a), Request::GetLogs { agent, lines }) => {
                self.get_logs(a, agent, lines)
            }
            (Identity::Agent(a), Request::GetHostJournal { unit, lines }) => {
                match self.host_journal_job(a, unit, lines) {
                    Ok(job) => return Outcome::Offload(job),
                    Err(e) => Err(e),
                }
            }
            (Identity::Operator, Request::Approvals {}) => self.approvals(),
            (Identity::Operator, Request::Approve { id }) => self.approve(id),
            (Identity::Operator, Request::Deny { id, why }) => {
                match why.as_deref().map(|w| limits::check_body("why", w)) {
                    Some(Err(e)) => Err(e),
                    _ => self.deny(id, why, "operator"),
                }
            }
            (Identity::Operator, Request::Supervision {}) => self.supervision(),
            (
                Identity::Operator,
                Request::SetPermissions {
                    agent,
                    tool_groups,
                    capabilities,
                },
            ) => self.set_permissions(&agent, tool_groups, capabilities),
            (Identity::Operator, _) => Err(format!(
                "{cmd} is an agent command; the host socket speaks for the operator"
            )),
            (Identity::Agent(a), _) => Err(format!(
                "{cmd} is an operator command; this is the socket of agent {a}"
            )),
        };
        if matches!(
            cmd,
            "ask"
                | "answer"
                | "remind"
                | "cancel_loose_end"
                | "cancel_question"
                | "schedule_prompt"
                | "cancel_scheduled"
        ) {
            self.recompute_due();
        }
        self.answer(result)
    }

    fn hello(&self, who: &Identity, version: Option<u32>) -> HubResult {
        if let Some(v) = version {
            if v != wire::PROTOCOL_VERSION {
                return Err(format!(
                    "protocol version {v} is not supported; this broker speaks version {}",
                    wire::PROTOCOL_VERSION
                ));
            }
        }
        Ok(wire::ok_line(&wire::HelloReply {
            version: wire::PROTOCOL_VERSION,
            identity: who.name().to_string(),
            hyperhive_rev: self.settings.hyperhive_rev.clone(),
        }))
    }

    fn check_agent(&self, name: &str) -> Result<(), String> {
        if self.cfg.agent(name).is_some() {
            Ok(())
        } else {
            Err(format!("unknown agent {}", wire::excerpt(name)))
        }
    }

    /// Stores a message and wakes whoever waits for the recipient.
    fn deliver(
        &mut self,
        from: &str,
        to: &str,
        body: &str,
        kind: &str,
        in_reply_to: Option<i64>,
    ) -> HubResult {
        let msg = NewMessage {
            from,
            to,
            body,
            kind,
            in_reply_to,
        };
        let id = self.db.insert_message(&msg, now()).map_err(db_err)?;
        self.notify(to);
        Ok(wire::ok_line(&wire::SentReply {
            id: Some(id),
            to: to.to_string(),
        }))
    }

    fn wake(
        &mut self,
        who: &Identity,
        from: &str,
        body: &str,
        transient: bool,
        to: Option<String>,
    ) -> HubResult {
        limits::check_sender(from)?;
        limits::check_body("body", body)?;
        let target = match (who, to) {
            (Identity::Agent(a), None) => a.clone(),
            (Identity::Agent(a), Some(t)) if &t == a => t,
            (Identity::Agent(a), Some(t)) => {
                return Err(format!(
                    "wake on the socket of {a} can only wake {a}, not {}; use send to message another agent",
                    wire::excerpt(&t)
                ))
            }
            (Identity::Operator, Some(t)) => {
                self.check_agent(&t)?;
                t
            }
            (Identity::Operator, None) => {
                return Err("wake on the host socket needs \"to\": the agent to wake".into())
            }
        };
        if !transient {
            return self.deliver(from, &target, body, "message", None);
        }
        let msg = wire::Message {
            id: self.next_transient_id,
            from: from.to_string(),
            to: target.clone(),
            body: body.to_string(),
            kind: "message".into(),
            in_reply_to: None,
            sent_at: now(),
            transient: true,
        };
        self.next_transient_id -= 1;
        self.transient
            .entry(target.clone())
            .or_default()
            .push_back(msg);
        self.notify(&target);
        Ok(wire::ok_line(&wire::SentReply {
            id: None,
            to: target,
        }))
    }

    fn send(&mut self, from: &str, to: &str, body: &str, in_reply_to: Option<i64>) -> HubResult {
        limits::check_body("body", body)?;
        let to = if to == "<parent>" {
            if from == "operator" {
                return Err("the operator has no parent".into());
            }
            self.cfg.parent_of(from)
        } else {
            to.to_string()
        };
        if from == "operator" {
            if to == "operator" {
                return Err("the operator cannot send to the operator".into());
            }
            self.check_agent(&to)?;
        } else {
            if to == from {
                return Err(
                    "an agent cannot send to itself; use remind or request_next_turn".into(),
                );
            }
            self.cfg.may_send(from, &to)?;
        }
        self.deliver(from, &to, body, "message", in_reply_to)
    }

    fn recv_next(&mut self, agent: &str) -> Result<Option<String>, String> {
        let Some((message, redelivered)) = self.pop_next(agent)? else {
            return Ok(None);
        };
        // The unread count after the pop, so the harness needs no `status` call.
        let transient = self.transient.get(agent).map_or(0, |q| q.len() as u64);
        let unread = self.db.count_queued(agent).map_err(db_err)? + transient;
        Ok(Some(wire::ok_line(&wire::RecvNextReply {
            message: Some(limits::fit_message(message)),
            redelivered,
            unread: Some(unread),
        })))
    }

    /// The inflight row again, or the next row made inflight.
    fn pop_next(&mut self, agent: &str) -> Result<Option<(wire::Message, bool)>, String> {
        if let Some(m) = self.transient_inflight.get(agent) {
            return Ok(Some((m.clone(), true)));
        }
        if let Some(m) = self.db.inflight(agent).map_err(db_err)? {
            return Ok(Some((m, true)));
        }
        if let Some(m) = self.transient.get_mut(agent).and_then(VecDeque::pop_front) {
            self.transient_inflight.insert(agent.to_string(), m.clone());
            return Ok(Some((m, false)));
        }
        let Some(m) = self.db.queued(agent, 1).map_err(db_err)?.pop() else {
            return Ok(None);
        };
        if !self
            .db
            .transition(m.id, agent, "queued", "inflight", now())
            .map_err(db_err)?
        {
            return Err("message changed state while being popped; try again".into());
        }
        Ok(Some((m, false)))
    }

    /// Hands out up to `max` rows, oldest first, within one answer's byte
    /// budget, and holds them for `conn` until `recv_ack`.
    fn drain(
        &mut self,
        agent: &str,
        conn: ConnId,
        max: u32,
    ) -> Result<wire::MessagesReply, String> {
        let mut out = Vec::new();
        let mut held = Vec::new();
        let mut used = 0;
        let mut more = false;
        if let Some(q) = self.transient.get_mut(agent) {
            while out.len() < max as usize {
                let Some(m) = q.front() else { break };
                let m = limits::fit_message(m.clone());
                if !limits::take_into_page(&m, &mut used, out.len()) {
                    more = true;
                    break;
                }
                if let Some(raw) = q.pop_front() {
                    held.push(Held::Transient(raw));
                }
                out.push(m);
            }
        }
        let room = max - out.len() as u32;
        if room > 0 && !more {
            let rows = self.db.queued(agent, room).map_err(db_err)?;
            let mut ids = Vec::new();
            for m in rows {
                let m = limits::fit_message(m);
                if !limits::take_into_page(&m, &mut used, out.len()) {
                    more = true;
                    break;
                }
                ids.push(m.id);
                held.push(Held::Stored(m.id));
                out.push(m);
            }
            self.db
                .transition_many(&ids, agent, "queued", "held", now())
                .map_err(db_err)?;
        }
        if !held.is_empty() {
            self.held
                .entry(conn)
                .or_insert_with(|| (agent.to_string(), Vec::new()))
                .1
                .extend(held);
        }
        Ok(wire::MessagesReply {
            messages: out,
            more,
        })
    }

    fn recv_ack(&mut self, agent: &str, conn: ConnId, ids: &[i64]) -> HubResult {
        let Some((_, rows)) = self.held.get_mut(&conn) else {
            return Err("no rows are held by this connection; recv_ack confirms rows handed out by recv on the same connection".into());
        };
        let mut stored = Vec::new();
        let mut acked = 0usize;
        rows.retain(|h| {
            let id = match h {
                Held::Stored(id) => *id,
                Held::Transient(m) => m.id,
            };
            if !ids.contains(&id) {
                return true;
            }
            acked += 1;
            if let Held::Stored(id) = h {
                stored.push(*id);
            }
            false
        });
        self.db
            .transition_many(&stored, agent, "held", "acked", now())
            .map_err(db_err)?;
        if acked < ids.len() {
            return Err(format!(
                "only {acked} of {} ids were held by this connection",
                ids.len()
            ));
        }
        Ok(wire::ok_line(&serde_json::json!({ "acked": acked })))
    }

    fn status(&self, agent: &str) -> HubResult {
        let transient = self.transient.get(agent).map_or(0, |q| q.len() as u64);
        let unread = self.db.count_queued(agent).map_err(db_err)? + transient;
        let inflight = match self.transient_inflight.get(agent) {
            Some(m) => Some(m.id),
            None => self.db.inflight(agent).map_err(db_err)?.map(|m| m.id),
        };
        Ok(wire::ok_line(&wire::StatusReply { unread, inflight }))
    }

    fn finish_inflight(&mut self, agent: &str, id: i64, ack: bool) -> HubResult {
        let verb = if ack { "ack_turn" } else { "requeue_inflight" };
        let current = match self.transient_inflight.get(agent) {
            Some(m) => Some(m.id),
            None => self.db.inflight(agent).map_err(db_err)?.map(|m| m.id),
        };
        if current != Some(id) {
            return Err(match current {
                Some(c) => {
                    format!("{verb}: {id} is not the inflight message of {agent} (that is {c})")
                }
                None => format!("{verb}: {agent} has no inflight message (stale id {id})"),
            });
        }
        if id < 0 {
            if let Some(m) = self.transient_inflight.remove(agent) {
                if !ack {
                    self.transient
                        .entry(agent.to_string())
                        .or_default()
                        .push_front(m);
                    self.notify(agent);
                }
            }
        } else {
            let to = if ack { "acked" } else { "queued" };
            self.db
                .transition(id, agent, "inflight", to, now())
                .map_err(db_err)?;
            if !ack {
                self.notify(agent);
            }
        }
        Ok(wire::ok_line(&serde_json::json!({})))
    }

    fn kick(&mut self, agent: &str, rev: Option<String>) -> HubResult {
        if let Some(rev) = rev {
            if rev.len() > MAX_REV_CHARS || rev.chars().any(wire::is_control_or_bidi) {
                return Err(format!(
                    "kick: hyperhive_rev {} must be one line of at most {MAX_REV_CHARS} characters",
                    wire::excerpt(&rev)
                ));
            }
            self.db.set_rev(agent, &rev).map_err(db_err)?;
        }
        self.deliver("system", agent, KICK_BODY, "kick", None)
    }

    fn set_status(&mut self, agent: &str, text: &str) -> HubResult {
        if text.contains('\n') || text.chars().count() > MAX_STATUS_CHARS {
            return Err(format!(
                "status must be one line of at most {MAX_STATUS_CHARS} characters"
            ));
        }
        self.db.set_status(agent, text, now()).map_err(db_err)?;
        Ok(wire::ok_line(&serde_json::json!({})))
    }

    fn running(&self, agent: &str) -> bool {
        self.harness_conns.get(agent).is_some_and(|s| !s.is_empty())
    }

    fn meta(&self, who: &Identity, name: Option<String>) -> HubResult {
        let name = match (name, who) {
            (Some(n), _) => n,
            (None, Identity::Agent(a)) => a.clone(),
            (None, Identity::Operator) => {
                return Err("get_agent_meta on the host socket needs \"name\"".into())
            }
        };
        self.check_agent(&name)?;
        let stats = self.db.stats(&name).map_err(db_err)?;
        Ok(wire::ok_line(&wire::AgentMeta {
            running: self.running(&name),
            name,
            hyperhive_rev: stats.hyperhive_rev,
            status_text: stats.status_text,
            status_set_at: stats.status_set_at,
            hive_name: self.cfg.hive_name.clone(),
            swarm_name: self.cfg.swarm_name.clone(),
        }))
    }

    fn agents(&self) -> HubResult {
        let mut rows = Vec::new();
        for a in &self.cfg.agents {
            let s = self.db.stats(&a.name).map_err(db_err)?;
            let transient = self.transient.get(&a.name).map_or(0, |q| q.len() as u64);
            let inflight = match self.transient_inflight.get(&a.name) {
                Some(m) => Some(m.id),
                None => self.db.inflight(&a.name).map_err(db_err)?.map(|m| m.id),
            };
            rows.push(wire::AgentRow {
                name: a.name.clone(),
                parent: self.cfg.parent_of(&a.name),
                unread: self.db.count_queued(&a.name).map_err(db_err)? + transient,
                inflight,
                running: self.running(&a.name),
                status_text: s.status_text,
                turns: s.turns,
                turns_ok: s.turns_ok,
                turns_failed: s.turns_failed,
                tokens_in: s.tokens_in,
                tokens_out: s.tokens_out,
                cost_usd: s.cost_usd,
            });
        }
        let mut budget = limits::Budget::new();
        let agents = budget.fit(rows);
        Ok(wire::ok_line(&wire::AgentsReply {
            agents,
            left_off: budget.left_off,
        }))
    }

    /// One page of unread operator messages above `after`, within the answer's
    /// byte budget. Nothing is marked read here: `inbox_ack` does that once the
    /// client has shown them.
    fn operator_inbox(&mut self, after: Option<i64>) -> Result<wire::MessagesReply, String> {
        let rows = self
            .db
            .queued_after("operator", after.unwrap_or(0), INBOX_ROWS)
            .map_err(db_err)?;
        let had_more = rows.len() >= INBOX_ROWS as usize;
        Ok(limits::page(rows, had_more))
    }

    fn ask(
        &mut self,
        asker: &str,
        question: &str,
        options: &[String],
        multi: bool,
        ttl: Option<u64>,
        to: Option<String>,
    ) -> HubResult {
        limits::check_question(question, options)?;
        let target = to.unwrap_or_else(|| "operator".into());
        let target = if target == "<parent>" {
            self.cfg.parent_of(asker)
        } else {
            target
        };
        if target != "operator" {
            self.check_agent(&target)?;
            if target == asker {
                return Err("an agent cannot ask itself".into());
            }
        }
        let t = now();
        let expires = ttl.filter(|s| *s > 0).map(|s| t + s as i64);
        let id = self
            .db
            .insert_question(asker, &target, question, options, multi, t, expires)
            .map_err(db_err)?;
        if target != "operator" {
            let mut body = format!("[question #{id} from {asker}] {question}");
            if !options.is_empty() {
                let how = if multi { "choose any" } else { "choose one" };
                body.push_str(&format!("\noptions ({how}): {}", options.join(" | ")));
            }
            body.push_str(&format!(
                "\nAnswer with mcp__hyperhive__answer(id={id}, answer=...)."
            ));
            self.deliver("system", &target, &body, "question_asked", None)?;
        } else {
            self.notify("operator");
        }
        Ok(wire::ok_line(&wire::IdReply { id }))
    }

    fn close_question(&mut self, q: &wire::Question, answer: &str, by: &str) -> Result<(), String> {
        let body = format!(
            "[answer to question #{}] {:?} — {by} answered: {answer}",
            q.id,
            limits::preview(&q.question, 200)
        );
        let notice = NewMessage {
            from: "system",
            to: &q.asker,
            body: &body,
            kind: "question_answered",
            in_reply_to: None,
        };
        if self
            .db
            .close_question(q.id, answer, by, now(), Some(&notice))
            .map_err(db_err)?
        {
            self.notify(&q.asker);
        }
        Ok(())
    }

    fn answer_question(&mut self, who: &str, id: i64, answer: &str) -> HubResult {
        limits::check_body("answer", answer)?;
        let q = self
            .db
            .open_question(id)
            .map_err(db_err)?
            .ok_or_else(|| format!("no open question #{id}"))?;
        if q.target != who {
            return Err(format!(
                "question #{id} is addressed to {}; only they may answer it",
                q.target
            ));
        }
        self.close_question(&q, answer, who)?;
        Ok(wire::ok_line(&serde_json::json!({})))
    }

    /// Withdraws a question: by its asker (agents) or by the operator when it is
    /// addressed to the operator.
    fn cancel_question(&mut self, who: &str, id: i64, as_target: bool) -> HubResult {
        let q = self
            .db
            .open_question(id)
            .map_err(db_err)?
            .ok_or_else(|| format!("no open question #{id}"))?;
        let owner = if as_target { &q.target } else { &q.asker };
        if owner != who {
            return Err(format!("question #{id} is not yours to cancel"));
        }
        let text = format!("[cancelled by {who}]");
        if as_target {
            self.close_question(&q, &text, who)?;
        } else {
            self.db
                .close_question(id, &text, who, now(), None)
                .map_err(db_err)?;
            if q.target != "operator" {
                let body = format!("[question #{id} from {}] withdrawn: {text}", q.asker);
                self.deliver("system", &q.target, &body, "question_cancelled", None)?;
            }
        }
        Ok(wire::ok_line(&serde_json::json!({})))
    }

    fn loose_ends(&self, caller: &str, agent: Option<String>) -> HubResult {
        let target = match agent {
            None => caller.to_string(),
            Some(a) if a == "*" => {
                return Err("the hive-wide \"*\" query is not available on an agent socket".into())
            }
            Some(a) => {
                self.check_agent(&a)?;
                let child = self.cfg.parent_of(&a) == caller;
                let cap = self
                    .cfg
                    .agent(caller)
                    .is_some_and(|c| c.has_capability("query_agent_state"));
                if a != caller && !child && !cap {
                    return Err(format!(
                        "{a} is not a direct child of {caller}; reading its loose ends needs the query_agent_state capability"
                    ));
                }
                a
            }
        };
        let mut budget = limits::Budget::new();
        Ok(wire::ok_line(&wire::LooseEndsReply {
            asked: budget.fit(self.db.questions_where("asker", &target).map_err(db_err)?),
            owed: budget.fit(self.db.questions_where("target", &target).map_err(db_err)?),
            reminders: budget.fit(self.db.reminders_of(&target).map_err(db_err)?),
            scheduled: budget.fit(self.db.scheduled_of(&target).map_err(db_err)?),
            approvals: budget.fit(self.approvals_of(&target)?),
            left_off: budget.left_off,
            agent: target,
        }))
    }

    fn cancel_loose_end(&mut self, agent: &str, kind: &str, id: i64) -> HubResult {
        match kind {
            "question" => self.cancel_question(agent, id, false),
            "reminder" => match self.db.delete_reminder(agent, id).map_err(db_err)? {
                None => Err(format!("no reminder #{id} of {agent}")),
                Some(spill) => {
                    if let Some(f) = spill {
                        let _ = std::fs::remove_file(f);
                    }
                    Ok(wire::ok_line(&serde_json::json!({})))
                }
            },
            "approval" => self.cancel_approval(agent, id),
            other => Err(format!(
                "unknown loose-end kind {}; use question, reminder or approval",
                wire::excerpt(other)
            )),
        }
    }

    fn remind(
        &mut self,
        agent: &str,
        message: &str,
        delay: Option<u64>,
        at: Option<i64>,
    ) -> HubResult {
        limits::check_body("message", message)?;
        let t = now();
        let fire_at = match (delay, at) {
            (Some(d), None) => t + d.min(10 * 365 * 86400) as i64,
            (None, Some(at)) => at,
            (None, None) => return Err("remind needs delay_seconds or at_unix_timestamp".into()),
            (Some(_), Some(_)) => {
                return Err("give delay_seconds or at_unix_timestamp, not both".into())
            }
        };
        let pending = self.db.count_reminders(agent).map_err(db_err)?;
        if pending >= self.settings.remind_max_pending {
            return Err(format!(
                "{agent} already has {pending} pending reminders (the limit); cancel some with cancel_loose_end"
            ));
        }
        let id = self
            .db
            .insert_reminder(agent, message, None, fire_at, t)
            .map_err(db_err)?;
        if message.len() > REMINDER_SPILL_BYTES {
            // The file name is made here from the agent (a config name) and the row
            // id, never from input, so it cannot leave the reminders dir.
            let dir = self
                .settings
                .state_dir
                .join("agents")
                .join(agent)
                .join("reminders");
            let file = dir.join(format!("{id}.md"));
            let written = super::create_dirs(&dir, 0o700)
                .and_then(|_| super::write_private(&file, message.as_bytes()));
            if let Err(e) = written {
                let _ = self.db.delete_reminder(agent, id);
                return Err(format!(
                    "cannot store the reminder payload in {}: {e}",
                    file.display()
                ));
            }
            let preview: String = message.chars().take(200).collect();
            self.db
                .set_reminder_spill(id, &preview, &file.to_string_lossy())
                .map_err(db_err)?;
        }
        Ok(wire::ok_line(&wire::IdReply { id }))
    }
}
