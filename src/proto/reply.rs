//! The rows and small answers several commands share: a message, a question, a
//! reminder, a scheduled prompt, an approval, an agent's row and supervision
//! state, a running bash task, and the answers that carry only an id, a text or
//! nothing. A command's own answer type lives with the command (`cmd/`).

use super::fleet::AgentConfig;
use super::ident::Peer;
use super::kinds::{AgentPhase, ApprovalKind, ApprovalState, MsgKind, PauseReason};
use super::lines::{push_int, push_json_str};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub(crate) fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn default_kind() -> MsgKind {
    MsgKind::Message
}

/// One inbox row as handed to a reader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub id: i64,
    pub from: Peer,
    pub to: Peer,
    pub body: String,
    /// `message` for mail; a system event otherwise.
    #[serde(default = "default_kind")]
    pub kind: MsgKind,
    #[serde(default)]
    pub in_reply_to: Option<i64>,
    /// Unix seconds when the broker accepted it.
    pub sent_at: i64,
    /// True for a transient wake, which lives only in the broker's memory.
    #[serde(default)]
    pub transient: bool,
}

impl Message {
    /// Appends the message as JSON text: byte for byte what serde_json writes
    /// for it (its fields in declared order), without serde's machinery. The
    /// harness is handed one with every turn (`recv_next`); the fields are
    /// taken apart whole, so a new field does not compile until it is
    /// written here too, and `cmd::inbox`'s tests compare both ways.
    pub fn push_json(&self, out: &mut String) {
        let Message {
            id,
            from,
            to,
            body,
            kind,
            in_reply_to,
            sent_at,
            transient,
        } = self;
        out.push_str(r#"{"id":"#);
        push_int(out, *id);
        out.push_str(r#","from":"#);
        push_json_str(out, from.as_str());
        out.push_str(r#","to":"#);
        push_json_str(out, to.as_str());
        out.push_str(r#","body":"#);
        push_json_str(out, body);
        out.push_str(r#","kind":"#);
        push_json_str(out, kind.as_str());
        out.push_str(r#","in_reply_to":"#);
        match in_reply_to {
            Some(i) => push_int(out, *i),
            None => out.push_str("null"),
        }
        out.push_str(r#","sent_at":"#);
        push_int(out, *sent_at);
        out.push_str(if *transient {
            r#","transient":true}"#
        } else {
            r#","transient":false}"#
        });
    }
}

/// A question as listed by `questions` and `get_loose_ends`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    pub id: i64,
    pub asker: Peer,
    pub target: Peer,
    pub question: String,
    pub options: Vec<String>,
    pub multi: bool,
    pub asked_at: i64,
    pub expires_at: Option<i64>,
}

impl Question {
    /// `options (choose one): a | b`, when the question offers options: how
    /// every reader shows them.
    pub fn options_line(&self) -> Option<String> {
        if self.options.is_empty() {
            return None;
        }
        let how = if self.multi {
            "choose any"
        } else {
            "choose one"
        };
        Some(format!("options ({how}): {}", self.options.join(" | ")))
    }
}

/// A pending reminder as listed by `get_loose_ends`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reminder {
    pub id: i64,
    pub agent: String,
    /// The message's first 200 characters.
    pub preview: String,
    pub fire_at: i64,
    /// The whole message's length in bytes (the broker keeps all of it).
    #[serde(default)]
    pub bytes: u64,
}

/// A scheduled prompt (`schedule_prompt`, `list_scheduled`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scheduled {
    pub id: i64,
    pub agent: String,
    pub body: String,
    /// Unix seconds of the next delivery.
    pub fire_at: i64,
    /// Repeats every this many seconds; absent for a one-shot.
    #[serde(default)]
    pub every_seconds: Option<u64>,
}

/// A change waiting for the operator (`request_spawn`, `request_apply_commit`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub id: i64,
    pub kind: ApprovalKind,
    pub requester: String,
    /// The agent the change is about.
    pub agent: String,
    /// For `spawn`, the new entry; for `apply_commit`, the merge patch.
    pub payload: Value,
    pub state: ApprovalState,
    pub created_at: i64,
}

/// A background bash task still pending or running, as its agent's bash task
/// daemon reports it (`report_tasks`) and `get_loose_ends` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunningTask {
    pub id: String,
    /// The command line, cut to its first 200 characters.
    pub cmd: String,
    /// Unix seconds when it started.
    pub started_at: i64,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
}

/// Why and until when a harness waits before its next message runs, as it
/// reports it (`report_state`) and `agents` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Paused {
    pub reason: PauseReason,
    /// Unix seconds when the harness goes on by itself; null for a login park.
    #[serde(default)]
    pub until: Option<i64>,
    /// One line saying what happened.
    #[serde(default)]
    pub detail: String,
}

/// A pool near its usage limit: what a run of one of its agents saw in the
/// CLI's `rate_limit_event` with `"status":"allowed_warning"` (issue 16).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NearLimit {
    /// Unix seconds when the window resets; the warning is shown until then.
    pub until: i64,
    /// The CLI's `rateLimitType` (`five_hour`, `seven_day`, …), if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// The share of the window used (0.92), if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<f64>,
    /// The agent whose run saw it.
    pub reported_by: String,
}

/// One row of `agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRow {
    pub name: String,
    /// Its credential pool (issue 16): `account:NAME`, `uuid:…`, `key:…`
    /// (8 hex digits of a keyed fingerprint) or `agent:NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    pub parent: String,
    pub unread: u64,
    pub inflight: Option<i64>,
    pub running: bool,
    /// Why its harness waits, as it last reported; else the broker's own
    /// pause of it (its pool's usage limit, a budget); null while neither.
    #[serde(default)]
    pub paused: Option<Paused>,
    /// Its harness last reported that claude needs a login (the login park:
    /// no credentials, or they were refused twice). Kept while no harness
    /// runs; a harness reports its state when it connects.
    #[serde(default)]
    pub needs_login: bool,
    /// Its dead letters: messages kept in the `failed` state (`failed`).
    #[serde(default)]
    pub failed: u64,
    /// Its pool is near its usage limit (the CLI's early warning), until the
    /// window resets; absent while the pool is parked by the limit itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub near_limit: Option<NearLimit>,
    /// The bytes of the message bodies it caused to be stored and that are
    /// not pruned yet: what counts against its storage quota (the fleet
    /// file's `retention.agent_quota_mib`).
    #[serde(default)]
    pub stored_bytes: u64,
    pub status_text: String,
    pub turns: u64,
    pub turns_ok: u64,
    pub turns_failed: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    /// The model its page chose (`/model NAME`), in force until the page
    /// returns to the configured one or that one changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_override: Option<String>,
    /// Taken out of the fleet file: refused as a recipient, its mail kept
    /// until the operator's `forget_agent`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

/// One agent as the supervisor of `hive up` sees it (`supervision`, the
/// dashboard, `hive agents`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentState {
    pub name: String,
    pub state: AgentPhase,
    pub pid: Option<u32>,
    pub restarts: u32,
    pub logged_in: bool,
    pub up_to_date: bool,
    /// The port of the agent's web page, once it wrote its port file.
    pub port: Option<u16>,
    /// The config the running agent was started with.
    pub applied: AgentConfig,
    /// How its last rebuild (`update`, or a restart onto a changed entry)
    /// ended; absent until one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rebuild: Option<Rebuild>,
}

/// How a rebuild ended, for the dashboard's card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rebuild {
    /// Unix seconds.
    pub at: i64,
    /// It runs again (false: it could not be started).
    pub ok: bool,
    /// One line saying what it runs now, or why it does not.
    pub text: String,
}

/// A dead letter as `failed` lists it: a message its recipient's harness gave
/// up on after the attempt limit, kept until the operator retries it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedMessage {
    pub id: i64,
    /// The recipient whose harness gave up on it.
    pub agent: String,
    pub from: Peer,
    pub body: String,
    #[serde(default = "default_kind")]
    pub kind: MsgKind,
    /// Hand-outs that counted toward the limit.
    pub attempts: u32,
    pub last_error: String,
    pub sent_at: i64,
    /// Unix seconds when it was dead-lettered.
    pub failed_at: Option<i64>,
}

/// An answer with nothing in it but `ok`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Empty {}

impl Empty {
    /// Its `ok:true` line, as [`ok_line`](super::lines::ok_line) writes it.
    pub const LINE: &'static str = r#"{"ok":true}"#;
}

/// Answer to `ask`: the new row's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdReply {
    pub id: i64,
}

/// An answer that is one text for a person (lifecycle, approvals, logs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextReply {
    pub text: String,
}

/// Answer to `wake`, `send`, `send_to_parent` and the harness's start: the
/// stored id (absent for a transient wake) and the recipient.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SentReply {
    #[serde(default)]
    pub id: Option<i64>,
    /// The recipient after `<parent>` resolution.
    pub to: Peer,
}

impl SentReply {
    /// The `ok:true` line, byte for byte what
    /// [`ok_line`](super::lines::ok_line) writes for it, by hand: every
    /// `wake` and `send` is answered one (issue 19). The fields are taken
    /// apart whole, so a new one does not compile until it is written here.
    pub fn ok_line(&self) -> String {
        let SentReply { id, to } = self;
        let mut out = String::with_capacity(48 + to.as_str().len());
        out.push_str(r#"{"ok":true,"id":"#);
        match id {
            Some(id) => push_int(&mut out, *id),
            None => out.push_str("null"),
        }
        out.push_str(r#","to":"#);
        push_json_str(&mut out, to.as_str());
        out.push('}');
        out
    }
}

/// Answer to `recv` and `inbox`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagesReply {
    pub messages: Vec<Message>,
    /// True when more rows are waiting than fitted in this answer's byte budget
    /// (`PAGE_BYTES`): ask again (with `after` the last id, for `inbox`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more: bool,
}

/// Answer to `recv_ack` and `inbox_ack`: how many rows were marked read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AckedReply {
    pub acked: u64,
}

/// Answer to `request_spawn` and `request_apply_commit`: the approval queued.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuedReply {
    pub id: i64,
    pub text: String,
}
