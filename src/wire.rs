//! The wire protocol every hive process speaks to the broker: JSON lines over unix
//! sockets, one request line answered by one response line, many per connection.
//! This module owns the request enum (tagged by `cmd`), the typed payloads of the
//! answers, the bounded line reader that keeps an oversize or malformed line from
//! hurting the connection, and the blocking [`Client`] that `hive wake`, the
//! operator commands, `hive serve` and `hive mcp` all use. It is documented for
//! script authors in `docs/wire-protocol.md`.

use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The protocol version a client can check with `hello`. Bump on any change that
/// an older peer would misread.
pub const PROTOCOL_VERSION: u32 = 1;

/// The agent's broker socket, where every process of an agent finds it
/// unless `HIVE_SOCKET` says otherwise.
pub const DEFAULT_AGENT_SOCKET: &str = "/run/hive/mcp.sock";
/// The operator's socket, unless `HIVE_HOST_SOCKET` (or `--socket`) says
/// otherwise.
pub const DEFAULT_HOST_SOCKET: &str = "/run/hive/host.sock";
/// The bash-task daemon's socket, unless `HIVE_BASH_SOCKET` says otherwise.
pub const DEFAULT_BASH_SOCKET: &str = "/run/hive-bash/socket";
/// An agent's state dir (claude's working directory, the bash tasks' too).
pub const DEFAULT_STATE_DIR: &str = "/state";
/// The bash environment file tasks run with when it exists (`HIVE_BASH_ENV`).
pub const DEFAULT_BASH_ENV: &str = "/etc/hyperhive/bash-env.sh";

/// Longest request or response line accepted, newline excluded.
pub const MAX_LINE: usize = 1024 * 1024;

/// Longest message body any path that creates a message accepts (`send`, `wake`,
/// `send_to_parent`, reminders, scheduled prompts, the MCP tools, the web page
/// and the dashboard), in bytes of UTF-8. Even fully JSON-escaped (six bytes a
/// byte) a body this long leaves room for any envelope under [`MAX_LINE`].
pub const MAX_BODY: usize = 64 * 1024;

/// The byte budget of one `inbox` or `recv` answer: rows are handed out until
/// the next one would pass it (at least one row always goes out).
pub const PAGE_BYTES: usize = 512 * 1024;

/// Longest `recv_next` / `recv` / `inbox` wait the broker honours, in seconds.
pub const MAX_WAIT_SECS: u64 = 180;

/// Most options an `ask` may offer, and the longest option in characters.
pub const MAX_OPTIONS: usize = 32;
pub const MAX_OPTION_CHARS: usize = 200;

/// How many characters of an input an error message echoes (then `…`).
pub const ECHO_CHARS: usize = 80;

/// Longest error text an `ok:false` line carries; longer ones are cut.
pub const MAX_ERROR_BYTES: usize = 4096;

/// At most the first [`ECHO_CHARS`] characters of `s`, quoted and escaped, with
/// `…` when cut: how every error echoes its input, so a huge or hostile value
/// never comes back whole.
pub fn excerpt(s: &str) -> String {
    match s.char_indices().nth(ECHO_CHARS) {
        None => format!("{s:?}"),
        Some((i, _)) => format!("{:?}…", &s[..i]),
    }
}

/// True for characters that can rewrite a terminal or reorder the text around
/// them: C0 and C1 controls, DEL, and the Unicode bidi marks, embeddings,
/// overrides and isolates.
pub fn is_control_or_bidi(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// A request, as one JSON object per line with a `cmd` tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Optional version check; answered with the broker's version and identity.
    Hello {
        #[serde(default)]
        version: Option<u32>,
    },
    /// Push a message into the caller's own inbox (agent socket) or an agent's
    /// inbox (`to`, host socket). `transient` ones never touch sqlite.
    Wake {
        from: String,
        body: String,
        #[serde(default)]
        transient: bool,
        #[serde(default)]
        to: Option<String>,
    },
    /// Message a peer, the topology parent (`<parent>`) or `operator`.
    Send {
        to: String,
        body: String,
        #[serde(default)]
        in_reply_to: Option<i64>,
    },
    /// The MCP-tool drain: hands out up to `max` rows, held for this connection
    /// until `recv_ack` confirms them.
    Recv {
        #[serde(default)]
        wait_seconds: Option<u64>,
        #[serde(default)]
        max: Option<u32>,
    },
    /// Confirms rows handed out by `recv` on this connection.
    RecvAck { ids: Vec<i64> },
    /// The harness pop: one row becomes inflight (or the inflight row again).
    RecvNext {
        #[serde(default)]
        wait_seconds: Option<u64>,
    },
    /// Unread count and inflight id of the caller.
    Status {},
    /// Finishes the inflight row.
    AckTurn { id: i64 },
    /// Puts the inflight row back at the front of the inbox.
    RequeueInflight { id: i64 },
    /// Adds one turn's counters to the caller's dashboard totals.
    PostTurnCounts {
        #[serde(default)]
        turns: u64,
        #[serde(default)]
        ok: u64,
        #[serde(default)]
        failed: u64,
        #[serde(default)]
        tokens_in: u64,
        #[serde(default)]
        tokens_out: u64,
        #[serde(default)]
        cost_usd: f64,
    },
    /// The harness at boot: drop the "you were just (re)started" system message.
    Kick {
        #[serde(default)]
        hyperhive_rev: Option<String>,
    },
    /// Message the caller's topology parent (the operator for a root agent).
    SendToParent { body: String },
    /// Free-text status line shown on the dashboard; `""` clears.
    SetStatus { text: String },
    /// Identity and status of an agent (the caller when `name` is absent).
    GetAgentMeta {
        #[serde(default)]
        name: Option<String>,
    },
    /// A question for the operator (default) or a peer agent.
    Ask {
        question: String,
        #[serde(default)]
        options: Vec<String>,
        #[serde(default)]
        multi: bool,
        #[serde(default)]
        ttl_seconds: Option<u64>,
        #[serde(default)]
        to: Option<String>,
    },
    /// Answers a question addressed to the caller.
    Answer { id: i64, answer: String },
    /// Pending questions (asked and owed) and reminders.
    GetLooseEnds {
        #[serde(default)]
        agent: Option<String>,
    },
    /// Withdraws a question or deletes a reminder the caller owns.
    CancelLooseEnd { kind: String, id: i64 },
    /// Schedules a message into the caller's own inbox.
    Remind {
        message: String,
        #[serde(default)]
        delay_seconds: Option<u64>,
        #[serde(default)]
        at_unix_timestamp: Option<i64>,
    },
    /// Operator: one page of unread operator messages, oldest first, with ids
    /// above `after` (when given). Nothing is marked read: the client acks the
    /// ids it showed with `inbox_ack` (at-least-once). `peek` is accepted for
    /// older clients and changes nothing.
    Inbox {
        #[serde(default)]
        wait_seconds: Option<u64>,
        #[serde(default)]
        peek: bool,
        #[serde(default)]
        after: Option<i64>,
    },
    /// Operator: marks these operator messages read (ids that are not unread
    /// operator messages are skipped).
    InboxAck { ids: Vec<i64> },
    /// Operator: every agent with its queue and status.
    Agents {},
    /// Operator: pending questions addressed to the operator.
    Questions {},
    /// Operator: withdraws a pending question with `[cancelled by operator]`.
    CancelQuestion { id: i64 },
    /// Lifecycle: asks the operator to approve a new child agent `name`.
    RequestSpawn { name: String },
    /// Lifecycle: stops one of the caller's children (it stays stopped).
    Kill { name: String },
    /// Lifecycle: starts one of the caller's stopped children.
    Start { name: String },
    /// Lifecycle: stops and starts one of the caller's children.
    Restart { name: String },
    /// Lifecycle: restarts a child onto the current binary and fleet-file entry.
    Update { name: String },
    /// Approvals: proposes a change to an agent's fleet-file entry (a JSON merge
    /// patch, inline or in a file), applied once the operator approves.
    RequestApplyCommit { agent: String, commit_ref: String },
    /// Scheduling: a message into the caller's own inbox, once or repeatedly.
    SchedulePrompt {
        body: String,
        #[serde(default)]
        at_unix_timestamp: Option<i64>,
        #[serde(default)]
        delay_seconds: Option<u64>,
        #[serde(default)]
        every_seconds: Option<u64>,
    },
    /// Scheduling: the caller's scheduled prompts.
    ListScheduled {},
    /// Scheduling: deletes one of the caller's scheduled prompts.
    CancelScheduled { id: i64 },
    /// Diagnostics: the tail of an agent's supervised log.
    GetLogs {
        #[serde(default)]
        agent: Option<String>,
        #[serde(default)]
        lines: Option<u64>,
    },
    /// Capability `read_host_journal`: the tail of the host's journal.
    GetHostJournal {
        #[serde(default)]
        unit: Option<String>,
        #[serde(default)]
        lines: Option<u64>,
    },
    /// Operator: pending approvals.
    Approvals {},
    /// Operator: approves and carries out a pending approval.
    Approve { id: i64 },
    /// Operator: denies a pending approval; the requester is told why.
    Deny {
        id: i64,
        #[serde(default)]
        why: Option<String>,
    },
    /// Operator: the supervisor's view of every agent (`hive up` only).
    Supervision {},
    /// Operator: sets an agent's tool groups and capabilities; the fleet file is
    /// rewritten and the agent restarts with them.
    SetPermissions {
        agent: String,
        tool_groups: Vec<String>,
        capabilities: Vec<String>,
    },
}

impl Request {
    /// The `cmd` tag of this request, for logs and error messages.
    pub fn cmd(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "hello",
            Request::Wake { .. } => "wake",
            Request::Send { .. } => "send",
            Request::Recv { .. } => "recv",
            Request::RecvAck { .. } => "recv_ack",
            Request::RecvNext { .. } => "recv_next",
            Request::Status {} => "status",
            Request::AckTurn { .. } => "ack_turn",
            Request::RequeueInflight { .. } => "requeue_inflight",
            Request::PostTurnCounts { .. } => "post_turn_counts",
            Request::Kick { .. } => "kick",
            Request::SendToParent { .. } => "send_to_parent",
            Request::SetStatus { .. } => "set_status",
            Request::GetAgentMeta { .. } => "get_agent_meta",
            Request::Ask { .. } => "ask",
            Request::Answer { .. } => "answer",
            Request::GetLooseEnds { .. } => "get_loose_ends",
            Request::CancelLooseEnd { .. } => "cancel_loose_end",
            Request::Remind { .. } => "remind",
            Request::Inbox { .. } => "inbox",
            Request::InboxAck { .. } => "inbox_ack",
            Request::Agents {} => "agents",
            Request::Questions {} => "questions",
            Request::CancelQuestion { .. } => "cancel_question",
            Request::RequestSpawn { .. } => "request_spawn",
            Request::Kill { .. } => "kill",
            Request::Start { .. } => "start",
            Request::Restart { .. } => "restart",
            Request::Update { .. } => "update",
            Request::RequestApplyCommit { .. } => "request_apply_commit",
            Request::SchedulePrompt { .. } => "schedule_prompt",
            Request::ListScheduled {} => "list_scheduled",
            Request::CancelScheduled { .. } => "cancel_scheduled",
            Request::GetLogs { .. } => "get_logs",
            Request::GetHostJournal { .. } => "get_host_journal",
            Request::Approvals {} => "approvals",
            Request::Approve { .. } => "approve",
            Request::Deny { .. } => "deny",
            Request::Supervision {} => "supervision",
            Request::SetPermissions { .. } => "set_permissions",
        }
    }

    /// Parses one request line, turning serde's message into one that names the
    /// problem for a script author. A key given twice is refused (JSON parsers
    /// disagree on which one wins), and an error quotes at most a short prefix
    /// of any value it echoes.
    pub fn parse(line: &str) -> Result<Request, String> {
        let value = match serde_json::from_str::<Strict>(line) {
            Ok(Strict(v)) => v,
            Err(e) => {
                let msg = shorten_quoted(&e.to_string());
                return Err(if msg.starts_with(DUPLICATE_KEY) {
                    format!("bad request: {msg}")
                } else {
                    format!("malformed JSON request line: {msg}")
                });
            }
        };
        let Some(obj) = value.as_object() else {
            return Err("request must be a JSON object with a \"cmd\" field".into());
        };
        match obj.get("cmd") {
            None => return Err("request has no \"cmd\" field".into()),
            Some(Value::String(_)) => {}
            Some(_) => return Err("\"cmd\" must be a string".into()),
        }
        serde_json::from_value(value).map_err(|e| {
            let msg = shorten_quoted(&e.to_string());
            if msg.starts_with("unknown variant") {
                format!("unknown cmd: {msg}")
            } else {
                format!("bad request: {msg}")
            }
        })
    }
}

const DUPLICATE_KEY: &str = "duplicate key";

/// A JSON value read with one rule more than serde_json's: no object may
/// repeat a key.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        Strict::deserialize(d).map(|s| s.0)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "{DUPLICATE_KEY} {}; give each field once",
                    excerpt(&key)
                )));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Cuts every quoted (`"…"`) or backquoted run of a message after
/// [`ECHO_CHARS`] characters: serde's messages quote the offending value whole.
fn shorten_quoted(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len().min(1024));
    let mut chars = msg.chars();
    let mut open: Option<char> = None;
    let mut inside = 0usize;
    while let Some(c) = chars.next() {
        match open {
            None => {
                if c == '"' || c == '`' {
                    open = Some(c);
                    inside = 0;
                }
                out.push(c);
            }
            Some(q) if c == q => {
                if inside > ECHO_CHARS {
                    out.push('…');
                }
                open = None;
                out.push(c);
            }
            Some(_) => {
                inside += 1;
                let escaped = if c == '\\' { chars.next() } else { None };
                if inside <= ECHO_CHARS {
                    out.push(c);
                    out.extend(escaped);
                }
            }
        }
    }
    if open.is_some() && inside > ECHO_CHARS {
        out.push('…');
    }
    out
}

/// One inbox row as handed to a reader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    pub id: i64,
    pub from: String,
    pub to: String,
    pub body: String,
    /// `message` for a normal message; a system event name (`kick`,
    /// `question_asked`, `question_answered`, `reminder`, …) otherwise.
    #[serde(default = "default_kind")]
    pub kind: String,
    #[serde(default)]
    pub in_reply_to: Option<i64>,
    /// Unix seconds when the broker accepted it.
    pub sent_at: i64,
    /// True for a transient wake, which lives only in the broker's memory.
    #[serde(default)]
    pub transient: bool,
}

fn default_kind() -> String {
    "message".into()
}

/// Answer to `hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HelloReply {
    pub version: u32,
    /// `operator` on the host socket, the agent's name on an agent socket.
    pub identity: String,
    pub hyperhive_rev: String,
}

/// Answer to `wake` and `send`: the stored id (absent for a transient wake).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SentReply {
    #[serde(default)]
    pub id: Option<i64>,
    /// The recipient after `<parent>` resolution.
    pub to: String,
}

/// Answer to `recv` and `inbox`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessagesReply {
    pub messages: Vec<Message>,
    /// True when more rows are waiting than fitted in this answer's byte budget
    /// ([`PAGE_BYTES`]): ask again (with `after` the last id, for `inbox`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more: bool,
}

/// Answer to `inbox_ack`: how many rows were marked read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AckedReply {
    pub acked: u64,
}

/// Answer to `recv_next`: `message` is null when the wait ended empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecvNextReply {
    pub message: Option<Message>,
    /// True when this row was already inflight (a harness restarted mid-turn).
    #[serde(default)]
    pub redelivered: bool,
    /// Rows still queued after this pop (absent when `message` is null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread: Option<u64>,
}

/// Answer to `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReply {
    pub unread: u64,
    pub inflight: Option<i64>,
}

/// Identity and status of one agent (`get_agent_meta`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentMeta {
    pub name: String,
    pub hyperhive_rev: String,
    pub running: bool,
    pub status_text: String,
    pub status_set_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hive_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swarm_name: Option<String>,
}

/// One row of `agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentRow {
    pub name: String,
    pub parent: String,
    pub unread: u64,
    pub inflight: Option<i64>,
    pub running: bool,
    pub status_text: String,
    pub turns: u64,
    pub turns_ok: u64,
    pub turns_failed: u64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
}

/// Answer to `agents`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentsReply {
    pub agents: Vec<AgentRow>,
    /// Rows that did not fit in the answer's byte budget ([`PAGE_BYTES`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A question as listed by `questions` and `get_loose_ends`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Question {
    pub id: i64,
    pub asker: String,
    pub target: String,
    pub question: String,
    pub options: Vec<String>,
    pub multi: bool,
    pub asked_at: i64,
    pub expires_at: Option<i64>,
}

/// Answer to `questions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuestionsReply {
    pub questions: Vec<Question>,
    /// Questions that did not fit in the answer's byte budget ([`PAGE_BYTES`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
}

/// Answer to `ask` and `remind`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IdReply {
    pub id: i64,
}

/// A pending reminder as listed by `get_loose_ends`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reminder {
    pub id: i64,
    pub agent: String,
    /// The message, or its first 200 characters when the payload spilled to a file.
    pub preview: String,
    pub fire_at: i64,
    #[serde(default)]
    pub spill_file: Option<String>,
}

/// Answer to `get_loose_ends`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LooseEndsReply {
    pub agent: String,
    /// Questions this agent asked that are still open.
    pub asked: Vec<Question>,
    /// Questions addressed to this agent that it has not answered.
    pub owed: Vec<Question>,
    pub reminders: Vec<Reminder>,
    /// Prompts this agent scheduled (`schedule_prompt`).
    #[serde(default)]
    pub scheduled: Vec<Scheduled>,
    /// Pending approvals: those the agent requested, and for a root agent every
    /// pending approval of its tree.
    #[serde(default)]
    pub approvals: Vec<Approval>,
    /// Entries (of any list) that did not fit in the answer's byte budget
    /// ([`PAGE_BYTES`]); the lists are filled in the order above.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
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

/// Answer to `list_scheduled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduledReply {
    pub scheduled: Vec<Scheduled>,
    /// Prompts that did not fit in the answer's byte budget ([`PAGE_BYTES`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
}

/// A change waiting for the operator (`request_spawn`, `request_apply_commit`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Approval {
    pub id: i64,
    /// `spawn` or `apply_commit`.
    pub kind: String,
    pub requester: String,
    /// The agent the change is about.
    pub agent: String,
    /// For `spawn`, the new entry; for `apply_commit`, the merge patch.
    pub payload: Value,
    /// `pending`, `approved`, `denied` or `cancelled`.
    pub state: String,
    pub created_at: i64,
}

/// Answer to `approvals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalsReply {
    pub approvals: Vec<Approval>,
    /// Approvals that did not fit in the answer's byte budget ([`PAGE_BYTES`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
}

/// Answer to `get_logs` and `get_host_journal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TextReply {
    pub text: String,
}

/// Answer to `supervision`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SupervisionReply {
    pub agents: Vec<crate::fleet::supervisor::AgentState>,
}

/// Builds the `{"ok":true,...}` line for a typed answer.
pub fn ok_line<T: Serialize>(payload: &T) -> String {
    match serde_json::to_value(payload) {
        Ok(Value::Object(mut map)) => {
            map.remove("ok");
            if map.is_empty() {
                return r#"{"ok":true}"#.into();
            }
            // `ok` first reads better in logs and for people using socat.
            let rest = Value::Object(map).to_string();
            format!(r#"{{"ok":true,{}"#, &rest[1..])
        }
        _ => r#"{"ok":true}"#.into(),
    }
}

/// Builds the `{"ok":false,"error":...}` line; an error longer than
/// [`MAX_ERROR_BYTES`] is cut.
pub fn err_line(error: &str) -> String {
    let error = if error.len() > MAX_ERROR_BYTES {
        let mut end = MAX_ERROR_BYTES;
        while !error.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &error[..end])
    } else {
        error.to_string()
    };
    format!(r#"{{"ok":false,"error":{}}}"#, Value::String(error))
}

/// What reading one line produced.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A complete line (without its newline). May be empty.
    Text(String),
    /// A line longer than the limit; it was consumed up to its newline.
    TooLong,
    /// A line that is not UTF-8; it was consumed.
    NotUtf8,
    /// Clean end of input.
    Eof,
}

/// Reads one newline-terminated line of at most `max` bytes without ever holding
/// more than `max` bytes of it in memory. A final line without a newline counts.
pub fn read_line(reader: &mut dyn BufRead, max: usize) -> io::Result<Line> {
    let mut buf: Vec<u8> = Vec::new();
    let mut too_long = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            if buf.is_empty() && !too_long {
                return Ok(Line::Eof);
            }
            break;
        }
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], Some(i)),
            None => (available, None),
        };
        if !too_long {
            if buf.len() + chunk.len() > max {
                too_long = true;
                buf = Vec::new();
            } else {
                buf.extend_from_slice(chunk);
            }
        }
        let used = found.map(|i| i + 1).unwrap_or(chunk.len());
        reader.consume(used);
        if found.is_some() {
            break;
        }
    }
    if too_long {
        return Ok(Line::TooLong);
    }
    if buf.last() == Some(&b'\r') {
        buf.pop();
    }
    match String::from_utf8(buf) {
        Ok(s) => Ok(Line::Text(s)),
        Err(_) => Ok(Line::NotUtf8),
    }
}

/// Why a call to the broker failed.
#[derive(Debug)]
pub enum ClientError {
    /// The socket is missing or nobody listens on it.
    NoBroker { path: PathBuf, detail: String },
    /// The socket is there but this user may not connect to it.
    PermissionDenied { path: PathBuf },
    /// The broker answered `ok:false`.
    Refused(String),
    /// The connection broke or the answer was unreadable.
    Io(String),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NoBroker { path, detail } => write!(
                f,
                "no broker at {} — is hive broker running? ({detail})",
                path.display()
            ),
            ClientError::PermissionDenied { path } => write!(
                f,
                "permission denied on {}: run as the agent's user (the socket's owner or \
                 group), or have the operator give the socket to your user with \
                 socket_uid/socket_gid (operator_gid for the host socket) in the hive config",
                path.display()
            ),
            ClientError::Refused(e) => write!(f, "broker refused: {e}"),
            ClientError::Io(e) => write!(f, "broker connection failed: {e}"),
        }
    }
}

impl std::error::Error for ClientError {}

/// A blocking connection to one broker socket. Not shared between threads; clone
/// the stream with [`Client::shutdown_handle`] to interrupt a blocked call.
pub struct Client {
    path: PathBuf,
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    /// Connects to the socket at `path`.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let stream = UnixStream::connect(path).map_err(|e| match e.kind() {
            io::ErrorKind::PermissionDenied => ClientError::PermissionDenied {
                path: path.to_path_buf(),
            },
            _ => ClientError::NoBroker {
                path: path.to_path_buf(),
                detail: e.to_string(),
            },
        })?;
        let writer = stream
            .try_clone()
            .map_err(|e| ClientError::Io(e.to_string()))?;
        Ok(Client {
            path: path.to_path_buf(),
            reader: BufReader::new(stream),
            writer,
        })
    }

    /// The socket path this client is connected to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A second handle on the stream; `shutdown(Both)` on it makes a blocked call
    /// return at once with an error.
    pub fn shutdown_handle(&self) -> io::Result<UnixStream> {
        self.writer.try_clone()
    }

    /// Sends one request and returns the answer object (with `ok` removed), or the
    /// broker's error.
    pub fn call(&mut self, req: &Request) -> Result<Map<String, Value>, ClientError> {
        let line = serde_json::to_string(req).map_err(|e| ClientError::Io(e.to_string()))?;
        self.call_line(&line, req.cmd())
    }

    /// Sends one already-encoded request line.
    pub fn call_raw(&mut self, line: &str) -> Result<Map<String, Value>, ClientError> {
        self.call_line(line, "the request")
    }

    fn call_line(&mut self, line: &str, cmd: &str) -> Result<Map<String, Value>, ClientError> {
        let io = |e: io::Error| ClientError::Io(e.to_string());
        let mut out = Vec::with_capacity(line.len() + 1);
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
        let sent = self
            .writer
            .write_all(&out)
            .and_then(|_| self.writer.flush());
        if let Err(e) = sent {
            // A broker that refuses a connection (too many on its socket) says
            // why in one line and closes: that line is the better error.
            if !matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) {
                return Err(io(e));
            }
            return match read_line(&mut self.reader, MAX_LINE) {
                Ok(Line::Text(s)) if s.starts_with('{') => parse_answer(&s),
                _ => Err(io(e)),
            };
        }
        let answer = match read_line(&mut self.reader, MAX_LINE).map_err(io)? {
            Line::Text(s) => s,
            Line::Eof => return Err(ClientError::Io("broker closed the connection".into())),
            Line::TooLong => {
                return Err(ClientError::Io(format!(
                    "the broker's answer to {cmd} is longer than {MAX_LINE} bytes, more than \
                     this client reads, and was skipped (a broker older than this client, or \
                     a bug: please report it)"
                )))
            }
            Line::NotUtf8 => {
                return Err(ClientError::Io(format!(
                    "the broker's answer to {cmd} is not UTF-8 and was skipped"
                )))
            }
        };
        parse_answer(&answer)
    }

    /// Sends a request and decodes the answer as `T`.
    pub fn call_as<T: DeserializeOwned>(&mut self, req: &Request) -> Result<T, ClientError> {
        let map = self.call(req)?;
        serde_json::from_value(Value::Object(map))
            .map_err(|e| ClientError::Io(format!("unexpected answer to {}: {e}", req.cmd())))
    }

    /// Sets the read timeout for answers (None blocks forever).
    pub fn set_read_timeout(&self, dur: Option<Duration>) -> io::Result<()> {
        self.reader.get_ref().set_read_timeout(dur)
    }
}

/// Decodes one answer line: the fields of an `ok:true` answer, or the error.
fn parse_answer(answer: &str) -> Result<Map<String, Value>, ClientError> {
    let value: Value = serde_json::from_str(answer)
        .map_err(|e| ClientError::Io(format!("malformed answer from broker: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(ClientError::Io(
            "answer from broker is not an object".into(),
        ));
    };
    match map.remove("ok") {
        Some(Value::Bool(true)) => Ok(map),
        _ => {
            let err = map
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("unknown error")
                .to_string();
            Err(ClientError::Refused(err))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_bare_shell_wake() {
        let r = Request::parse(r#"{"cmd":"wake","from":"matrix","body":"new dm"}"#).unwrap();
        assert_eq!(
            r,
            Request::Wake {
                from: "matrix".into(),
                body: "new dm".into(),
                transient: false,
                to: None
            }
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let cases = [
            ("{nope", "malformed JSON"),
            ("[1,2]", "JSON object"),
            (r#"{"body":"x"}"#, "no \"cmd\""),
            (r#"{"cmd":7}"#, "must be a string"),
            (r#"{"cmd":"frobnicate"}"#, "unknown cmd"),
            (r#"{"cmd":"wake","from":"x"}"#, "missing field `body`"),
            (r#"{"cmd":"ack_turn","id":"x"}"#, "invalid type"),
            (r#"{"cmd":"status","extra":1}"#, "unknown field `extra`"),
        ];
        for (line, want) in cases {
            let err = Request::parse(line).unwrap_err();
            assert!(err.contains(want), "{line}: {err}");
        }
    }

    #[test]
    fn a_key_given_twice_is_refused() {
        for line in [
            r#"{"cmd":"hello","cmd":"agents"}"#,
            r#"{"cmd":"wake","from":"a","from":"operator","body":"x"}"#,
            r#"{"cmd":"recv_ack","ids":[1],"x":{"a":1,"a":2}}"#,
        ] {
            let err = Request::parse(line).unwrap_err();
            assert!(err.contains("duplicate key"), "{line}: {err}");
        }
        assert!(Request::parse(r#"{"cmd":"ask","question":"q","options":["a","a"]}"#).is_ok());
    }

    #[test]
    fn errors_echo_only_a_short_prefix_of_the_input() {
        let long = "v".repeat(1 << 20);
        for line in [
            format!(r#"{{"cmd":"{long}"}}"#),
            format!(r#"{{"cmd":"ack_turn","id":"{long}"}}"#),
            format!(r#"{{"cmd":"status","{long}":1}}"#),
            format!(r#"{{"cmd":"hello","{long}":1,"{long}":2}}"#),
        ] {
            let err = Request::parse(&line).unwrap_err();
            assert!(err.len() < 2000, "{}", &err[..200]);
            assert!(err.contains("vvvv…") || err.contains("vvvv\"…"), "{err}");
        }
        assert_eq!(excerpt("short"), "\"short\"");
        assert_eq!(excerpt(&"é".repeat(100)), format!("{:?}…", "é".repeat(80)));
        let huge = err_line(&"e".repeat(100_000));
        assert!(huge.len() < MAX_ERROR_BYTES + 100);
    }

    #[test]
    fn every_request_round_trips_with_its_cmd_tag() {
        let reqs = [
            Request::Status {},
            Request::AckTurn { id: 3 },
            Request::RecvNext {
                wait_seconds: Some(30),
            },
            Request::Agents {},
        ];
        for r in reqs {
            let line = serde_json::to_string(&r).unwrap();
            assert!(line.contains(&format!("\"cmd\":\"{}\"", r.cmd())), "{line}");
            assert_eq!(Request::parse(&line).unwrap(), r);
        }
    }

    #[test]
    fn ok_line_puts_ok_first() {
        let line = ok_line(&IdReply { id: 4 });
        assert_eq!(line, r#"{"ok":true,"id":4}"#);
        assert_eq!(err_line("x"), r#"{"ok":false,"error":"x"}"#);
    }

    #[test]
    fn read_line_bounds_memory_and_recovers() {
        let mut input: &[u8] = b"short\r\n0123456789abc\nnext\nlast";
        let r: &mut dyn BufRead = &mut input;
        assert_eq!(read_line(r, 10).unwrap(), Line::Text("short".into()));
        assert_eq!(read_line(r, 10).unwrap(), Line::TooLong);
        assert_eq!(read_line(r, 10).unwrap(), Line::Text("next".into()));
        assert_eq!(read_line(r, 10).unwrap(), Line::Text("last".into()));
        assert_eq!(read_line(r, 10).unwrap(), Line::Eof);
        let mut bad: &[u8] = b"\xff\xfe\nok\n";
        let r: &mut dyn BufRead = &mut bad;
        assert_eq!(read_line(r, 10).unwrap(), Line::NotUtf8);
        assert_eq!(read_line(r, 10).unwrap(), Line::Text("ok".into()));
    }
}
