//! The wire commands as types, in the style of lsp-server's typed requests:
//! one struct per command (in `cmd/`) with its [`Command`] impl — the answer
//! type and the rules on the command's own fields — and one row per command in
//! `commands!`'s table below: its `cmd` tag and who may send it ([`Access`]).
//! From that table come the [`Request`] enum every server parses (one JSON
//! object per line, tagged by `cmd`), [`PRIVILEGES`] and the per-request
//! accessors, so no hand-written mirror of the tags exists.

use super::access::{Access, Gate, ToolGroup};
use super::cmd::*;
pub use super::invalid::Invalid;
use super::lines::ok_line;
use super::text::excerpt;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeSet;
use std::fmt;

/// A command's row of the privilege table; implemented by `commands!`.
pub trait Row {
    /// The `cmd` tag on the wire.
    const CMD: &'static str;
    /// Who may send it.
    const ACCESS: Access;
}

/// One wire command: its fields (the struct), its answer, its rules.
pub trait Command:
    Row
    + Serialize
    + DeserializeOwned
    + Clone
    + fmt::Debug
    + Into<Request>
    + std::marker::Send
    + 'static
{
    /// The fields of the `ok:true` answer.
    type Reply: Serialize + DeserializeOwned + fmt::Debug + std::marker::Send + 'static;

    /// The rules on the command's own fields, checked by every client before it
    /// sends (so each can say it in its own idiom) and by the broker before
    /// anything else; rules that need the hive's state are the handler's.
    fn validate(&self) -> Result<(), Invalid> {
        Ok(())
    }

    /// How long the broker may park the call for an answer (long-polls only).
    fn wait_seconds(&self) -> Option<u64> {
        None
    }

    /// The `ok:true` line of an answer: [`ok_line`]'s.
    fn reply_line(reply: &Self::Reply) -> String {
        ok_line(reply)
    }
}

/// The table: one row per command — its `cmd` tag, its struct and who may send
/// it. It generates [`Request`], [`PRIVILEGES`] and each struct's [`Row`].
macro_rules! commands {
    ($( $tag:literal => $ty:ident : $access:expr; )*) => {
        /// A request, as one JSON object per line with a `cmd` tag.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "cmd")]
        pub enum Request {
            $( #[serde(rename = $tag)] $ty($ty), )*
        }

        $(
            impl Row for $ty {
                const CMD: &'static str = $tag;
                const ACCESS: Access = $access;
            }

            impl From<$ty> for Request {
                fn from(c: $ty) -> Request {
                    Request::$ty(c)
                }
            }
        )*

        /// The privilege table: every command's tag and who may send it.
        pub const PRIVILEGES: &[(&str, Access)] = &[$( ($tag, $access), )*];

        impl Request {
            /// The `cmd` tag of this request, for logs and error messages.
            pub fn cmd(&self) -> &'static str {
                match self { $( Request::$ty(_) => $tag, )* }
            }

            /// Who may send this request.
            pub fn access(&self) -> Access {
                match self { $( Request::$ty(_) => $access, )* }
            }

            /// The command's rules on its own fields.
            pub fn validate(&self) -> Result<(), Invalid> {
                match self { $( Request::$ty(c) => c.validate(), )* }
            }

            /// How long the broker may park this call.
            pub fn wait_seconds(&self) -> Option<u64> {
                match self { $( Request::$ty(c) => c.wait_seconds(), )* }
            }

            /// One example of every command, for the tests of the table.
            #[cfg(test)]
            pub(crate) fn samples() -> Vec<Request> {
                vec![$( Request::$ty(<$ty as super::cmd::Sample>::sample()), )*]
            }
        }
    };
}

use super::access::Capability::ReadHostJournal;
use Access::{Agent, BashDaemon, Both, Bridge, Harness, Operator};
use Gate::{Capability as Cap, Group, Open};
use ToolGroup as G;

commands! {
    // Either socket: every script of the agent says hello and wakes it.
    "hello"                => Hello:             Both(Open);
    "wake"                 => Wake:              Both(Open);
    // The harness's own (issue 40): what it reports moves the hive's state
    // for this agent and others (its pool, the budgets, the attempts that
    // dead-letter a message), so under isolated `hive up` only its
    // credential sends them; where nothing separates harness and claude the
    // agent's socket does (`Via::Shared`), bounded by the spend bounds,
    // quotas and throttled logs.
    //   kick: says "(re)started", queues the kick and marks the harness live.
    "kick"                 => HarnessStarted:    Harness;
    //   recv_next: hands out the turn's message and counts an attempt.
    "recv_next"            => RecvNext:          Harness;
    //   status: read-only counts, open to every script; with `seen` it is
    //   the harness's watch, whose connection counts as the harness's only
    //   where it may speak for the harness (its credential, or `Shared`).
    "status"               => Status:            Agent(Open);
    //   ack_turn, requeue_inflight, dead_letter: end, return or give up the
    //   message in flight; attempts and dead letters are the harness's word.
    "ack_turn"             => AckTurn:           Harness;
    "requeue_inflight"     => RequeueInflight:   Harness;
    "dead_letter"          => DeadLetter:        Harness;
    //   report_state: a pause the broker shows and the operator lifts.
    "report_state"         => ReportState:       Harness;
    //   post_turn_counts: the turn and token counters the dashboard shows.
    "post_turn_counts"     => PostTurnCounts:    Harness;
    //   send_to_parent: the harness's notices, not charged to the agent's
    //   quota; an agent writes to its parent with `send` (`parent`).
    "send_to_parent"       => SendToParent:      Harness;
    //   report_tasks: the bash-task daemon's running tasks (its credential).
    "report_tasks"         => ReportTasks:       BashDaemon;
    //   export_spans (issue 43): finished spans for `hive up`'s exporter.
    "export_spans"         => ExportSpans:       Harness;
    // issue 16: usage limits and budgets
    //   report_pool, report_usage_limit: a pool's park pauses every agent in it.
    "report_pool"          => ReportPool:        Harness;
    "report_usage_limit"   => ReportUsageLimit:  Harness;
    //   report_spend: rows every budget check adds up.
    "report_spend"         => ReportSpend:       Harness;
    //   model: the page's /model override, which claude must not set.
    "model"                => ModelOverride:     Harness;
    "budget"               => GetBudget:         Operator;
    //   own_budget: read-only, the agent's page shows it.
    "own_budget"           => OwnBudget:         Agent(Open);
    "set_budget"           => SetBudget:         Operator;
    "void_spend"           => VoidSpend:         Operator;
    // issue 40: the operator lifts a pause
    "resume"               => Resume:            Operator;
    // messaging
    "send"                 => Send:              Both(Group(G::Messaging));
    "recv"                 => Recv:              Agent(Group(G::Messaging));
    "recv_ack"             => RecvAck:           Agent(Group(G::Messaging));
    //   message_state (issue 43): an agent reads what it sent, the operator any.
    "message_state"        => MessageState:      Both(Group(G::Messaging));
    "ask"                  => Ask:               Agent(Group(G::Messaging));
    "answer"               => Answer:            Both(Group(G::Messaging));
    // meta
    "set_status"           => SetStatus:         Agent(Group(G::Meta));
    "get_agent_meta"       => GetAgentMeta:      Both(Group(G::Meta));
    // inbox
    "get_loose_ends"       => GetLooseEnds:      Agent(Group(G::Inbox));
    "cancel_loose_end"     => CancelLooseEnd:    Agent(Group(G::Inbox));
    "remind"               => Remind:            Agent(Group(G::Inbox));
    // lifecycle
    "request_spawn"        => RequestSpawn:      Agent(Group(G::Lifecycle));
    "kill"                 => Kill:              Agent(Group(G::Lifecycle));
    "start"                => Start:             Agent(Group(G::Lifecycle));
    "restart"              => Restart:           Agent(Group(G::Lifecycle));
    "update"               => Update:            Agent(Group(G::Lifecycle));
    // approvals
    "request_apply_commit" => RequestApplyCommit: Agent(Group(G::Approvals));
    // scheduling
    "schedule_prompt"      => SchedulePrompt:    Agent(Group(G::Scheduling));
    "list_scheduled"       => ListScheduled:     Agent(Group(G::Scheduling));
    "cancel_scheduled"     => CancelScheduled:   Agent(Group(G::Scheduling));
    // diagnostics
    "get_logs"             => GetLogs:           Agent(Group(G::Diagnostics));
    "get_host_journal"     => GetHostJournal:    Agent(Cap(ReadHostJournal));
    // the operator
    "inbox"                => Inbox:             Operator;
    "inbox_ack"            => InboxAck:          Operator;
    "agents"               => Agents:            Operator;
    "questions"            => Questions:         Operator;
    "cancel_question"      => CancelQuestion:    Operator;
    "approvals"            => Approvals:         Operator;
    "approve"              => Approve:           Operator;
    "deny"                 => Deny:              Operator;
    "supervision"          => Supervision:       Operator;
    "start_agent"          => StartAgent:        Operator;
    "stop_agent"           => StopAgent:         Operator;
    "restart_agent"        => RestartAgent:      Operator;
    "update_agent"         => UpdateAgent:       Operator;
    // issue 39: the fleet file applied while the hive runs
    "reload"               => Reload:            Operator;
    "update_all"           => UpdateAll:         Operator;
    "forget_agent"         => ForgetAgent:       Operator;
    "set_permissions"      => SetPermissions:    Operator;
    "version"              => Version:           Operator;
    "failed"               => Failed:            Operator;
    "retry"                => Retry:             Operator;
    "search"               => Search:            Operator;
    "history"              => History:           Operator;
    "activity"             => Activity:          Operator;
    // issue 43: the message rows per recipient and state (the dashboard's /metrics)
    "message_counts"       => MessageCounts:     Operator;
    // issue 39: the operator sees and cancels the agents' timers
    "timers"               => Timers:            Operator;
    "cancel_timer"         => CancelTimer:       Operator;
    // issue 43: notifications
    "notify_test"          => NotifyTest:        Operator;
    "notify_status"        => NotifyStatus:      Operator;
    // the Matrix bridge, on its own socket
    "bridge_hello"         => BridgeHello:       Bridge;
    "bridge_next"          => BridgeNext:        Bridge;
    "bridge_sent"          => BridgeSent:        Bridge;
    "bridge_failed"        => BridgeFailed:      Bridge;
    "bridge_deliver"       => BridgeDeliver:     Bridge;
    "bridge_status"        => BridgeStatus:      Bridge;
}

impl Request {
    /// Parses one request line, turning serde's message into one that names the
    /// problem for a script author. A key given twice is refused (JSON parsers
    /// disagree on which one wins), and an error quotes at most a short prefix
    /// of any value it echoes.
    ///
    /// A good line is read twice, never built as a [`Value`]: once for keys
    /// given twice ([`NoDupes`], with keys borrowed from the line), then as
    /// the typed request. A line either refuses is read again the slow way,
    /// which words every error.
    pub fn parse(line: &str) -> Result<Request, String> {
        let fast = if serde_json::from_str::<NoDupes>(line).is_ok() {
            serde_json::from_str::<Request>(line).ok()
        } else {
            None
        };
        match fast {
            Some(req) => Ok(req),
            None => Request::parse_slowly(line),
        }
    }

    /// [`Request::parse`] through a [`Value`], with every error worded.
    fn parse_slowly(line: &str) -> Result<Request, String> {
        let words = |e: serde_json::Error| {
            let msg = shorten_quoted(&e.to_string());
            if msg.starts_with(DUPLICATE_KEY) {
                format!("bad request: {msg}")
            } else {
                format!("malformed JSON request line: {msg}")
            }
        };
        serde_json::from_str::<NoDupes>(line).map_err(words)?;
        let value: Value = serde_json::from_str(line).map_err(words)?;
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

/// Any JSON value in which no object repeats a key (JSON parsers disagree on
/// which one wins), read without keeping anything: each object's keys are
/// looked up among the ones before them (borrowed from the line when they
/// hold no escapes), its values checked the same way and dropped.
struct NoDupes;

impl<'de> Deserialize<'de> for NoDupes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NoDupes, D::Error> {
        d.deserialize_any(NoDupesVisitor)
    }
}

struct NoDupesVisitor;

impl<'de> Visitor<'de> for NoDupesVisitor {
    type Value = NoDupes;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<NoDupes, E> {
        Ok(NoDupes)
    }
    fn visit_i64<E>(self, _: i64) -> Result<NoDupes, E> {
        Ok(NoDupes)
    }
    fn visit_u64<E>(self, _: u64) -> Result<NoDupes, E> {
        Ok(NoDupes)
    }
    fn visit_f64<E>(self, _: f64) -> Result<NoDupes, E> {
        Ok(NoDupes)
    }
    fn visit_str<E>(self, _: &str) -> Result<NoDupes, E> {
        Ok(NoDupes)
    }
    fn visit_unit<E>(self) -> Result<NoDupes, E> {
        Ok(NoDupes)
    }
    fn visit_none<E>(self) -> Result<NoDupes, E> {
        Ok(NoDupes)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<NoDupes, D::Error> {
        NoDupes::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NoDupes, A::Error> {
        while seq.next_element::<NoDupes>()?.is_some() {}
        Ok(NoDupes)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NoDupes, A::Error> {
        let mut keys = BTreeSet::new();
        while let Some(Key(key)) = map.next_key()? {
            if keys.contains(&key) {
                return Err(de::Error::custom(format!(
                    "{DUPLICATE_KEY} {}; give each field once",
                    excerpt(&key)
                )));
            }
            keys.insert(key);
            map.next_value::<NoDupes>()?;
        }
        Ok(NoDupes)
    }
}

/// An object's key, borrowed from the line unless it held an escape.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key<'de>, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Cuts every quoted (`"…"`) or backquoted run of a message after
/// `ECHO_CHARS` characters: serde's messages quote the offending value whole.
fn shorten_quoted(msg: &str) -> String {
    use super::limits::ECHO_CHARS;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::limits::MAX_ERROR_BYTES;
    use crate::proto::lines::err_line;

    #[test]
    fn every_request_round_trips_with_its_cmd_tag() {
        let samples = Request::samples();
        assert_eq!(samples.len(), PRIVILEGES.len());
        for (r, (tag, access)) in samples.iter().zip(PRIVILEGES) {
            assert_eq!(r.cmd(), *tag);
            assert_eq!(r.access(), *access, "{tag}");
            let line = serde_json::to_string(r).unwrap();
            assert!(line.starts_with(&format!("{{\"cmd\":\"{tag}\"")), "{line}");
            assert_eq!(&Request::parse(&line).unwrap(), r, "{line}");
            assert!(r.validate().is_ok(), "the sample of {tag} is valid");
        }
        let mut tags: Vec<&str> = PRIVILEGES.iter().map(|(t, _)| *t).collect();
        tags.sort();
        tags.dedup();
        assert_eq!(tags.len(), PRIVILEGES.len(), "one row per tag");
    }

    #[test]
    fn parses_a_bare_shell_wake() {
        let r = Request::parse(r#"{"cmd":"wake","from":"matrix","body":"new dm"}"#).unwrap();
        assert_eq!(
            r,
            Request::Wake(Wake {
                from: "matrix".into(),
                body: "new dm".into(),
                transient: false,
                to: None,
                traceparent: None,
            })
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
            (
                r#"{"cmd":"cancel_loose_end","kind":"task","id":1}"#,
                "unknown loose-end kind \"task\"",
            ),
            (
                r#"{"cmd":"set_permissions","agent":"a","tool_groups":["root"],"capabilities":[]}"#,
                "unknown tool group \"root\"",
            ),
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
            // The same key, once written with an escape.
            r#"{"cmd":"wake","from":"a","\u0066rom":"operator","body":"x"}"#,
            r#"{"cmd":"wake","from":"a","body":"x","x":[{"k":1},{"k":1,"k":2}]}"#,
        ] {
            let err = Request::parse(line).unwrap_err();
            assert!(err.contains("duplicate key"), "{line}: {err}");
        }
        assert!(Request::parse(r#"{"cmd":"ask","question":"q","options":["a","a"]}"#).is_ok());
    }

    /// A good line is read without a `Value` tree; whatever that way takes
    /// or refuses, the way through a `Value` takes or refuses the same, with
    /// the same words.
    #[test]
    fn the_fast_way_reads_every_line_as_the_slow_way_does() {
        let many_keys = (0..40)
            .map(|i| format!("\"k{i}\":{i}"))
            .collect::<Vec<_>>()
            .join(",");
        let lines = [
            r#"{"cmd":"hello"}"#.to_string(),
            r#"{"cmd":"wake","from":"cron","body":"a \"quoted\" \u00e9 body","transient":false}"#
                .to_string(),
            r#"{"cmd":"recv_next","wait_seconds":30,"seen":{"unread":2,"status_text":"busy"}}"#
                .to_string(),
            r#"{"cmd":"ack_turn","id":17}"#.to_string(),
            r#" {"id":17,"cmd":"ack_turn"} "#.to_string(),
            r#"{"cmd":"ask","question":"q","options":["a","a"]}"#.to_string(),
            r#"{"cmd":"ack_turn","id":-1}"#.to_string(),
            r#"{"cmd":"ack_turn","id":1.5}"#.to_string(),
            r#"{"cmd":"ack_turn"}"#.to_string(),
            r#"{"cmd":"ack_turn","id":1,"extra":true}"#.to_string(),
            r#"{"cmd":"no_such_command"}"#.to_string(),
            r#"{"cmd":7}"#.to_string(),
            r#"{"id":7}"#.to_string(),
            r#"[1,2]"#.to_string(),
            r#"{"cmd":"hello""#.to_string(),
            r#"{"cmd":"hello"} trailing"#.to_string(),
            r#"{"cmd":"hello","cmd":"hello"}"#.to_string(),
            format!(r#"{{"cmd":"hello","x":{{{many_keys}}}}}"#),
            format!(r#"{{"cmd":"hello",{many_keys},"k3":0}}"#),
            r#"{"cmd":"hello","\u0063md":"hello"}"#.to_string(),
            r#"{"cmd":"wake","from":"a","body":"{\"from\":1,\"from\":2}, [\"x\"]"}"#.to_string(),
            r#"{"cmd":"wake","from":"a","body":"b","x":[{"k":1},{"k":1,"k":2}]}"#.to_string(),
            r#"{"cmd":"wake","x":{"from":1},"from":"a","body":"b"}"#.to_string(),
            r#"{"cmd":"wake","from":"a","x":{"y":{"from":1}},"body":"b","from":"c"}"#.to_string(),
            format!(
                r#"{{"cmd":"hello","x":{}1{}}}"#,
                "[".repeat(20),
                "]".repeat(20)
            ),
            r#"{"cmd":"hello","x":"unterminated}"#.to_string(),
            r#"{"cmd":"hello"}}"#.to_string(),
        ];
        for line in &lines[..6] {
            assert!(Request::parse(line).is_ok(), "{line}");
        }
        for line in &lines {
            assert_eq!(Request::parse(line), Request::parse_slowly(line), "{line}");
        }
        // Every command as hive's clients write it, and the commands on
        // every turn's path spelled every way their struct may refuse.
        for r in Request::samples() {
            let line = serde_json::to_string(&r).unwrap();
            assert_eq!(Request::parse(&line), Ok(r), "{line}");
        }
        let hot = [
            r#"{"cmd":"wake","from":"cron","body":"b","transient":true,"to":null}"#,
            r#"{"cmd":"wake","from":"cron","body":"b","body":"c"}"#,
            r#"{"cmd":"wake","from":"cron"}"#,
            r#"{"cmd":"wake","from":7,"body":"b"}"#,
            r#"{"cmd":"wake"}"#,
            r#"{"cmd":"wake","from":"cron","body":"b","cmd":"wake"}"#,
            r#"{"cmd":"wake" ,"from":"cron","body":"b"}"#,
            r#"{"cmd":"wake","from":"cron","body":"b"}   "#,
            r#"{"cmd":"send","to":"peer","body":"b","in_reply_to":3}"#,
            r#"{"cmd":"send","to":"peer","body":"b","in_reply_to":-3}"#,
            r#"{"cmd":"recv_next"}"#,
            r#"{"cmd":"recv_next","wait_seconds":null}"#,
            r#"{"cmd":"recv_next","wait_seconds":0,"seen":{"unread":1,"unread":2}}"#,
            r#"{"cmd":"recv_next","wait_seconds":0,"seen":{"unread":1,"other":2}}"#,
            r#"{"cmd":"recv_next","wait_seconds":-1}"#,
            r#"{"cmd":"ack_turn","id":17}"#,
            r#"{"cmd":"ack_turn","id":17.0}"#,
            r#"{"cmd":"ack_turn","id":"17"}"#,
            r#"{"cmd":"ack_turn","id":9223372036854775808}"#,
            r#"{"cmd":"report_spend","usd":1,"turns":1}"#,
            r#"{"cmd":"report_spend","usd":0.25}"#,
            r#"{"cmd":"post_turn_counts","tokens_in":1}"#,
            r#"{"cmd":"report_state","state":"idle"}"#,
            r#"{"cmd":"report_state","state":"no_such_state"}"#,
            r#"{"cmd":"hello","extra":1}"#,
        ];
        for line in hot {
            assert_eq!(Request::parse(line), Request::parse_slowly(line), "{line}");
        }
    }

    /// A key given twice is refused at every depth, also when one of the two
    /// is spelled with an escape; the same key in sibling objects, or in a
    /// string, is no repeat.
    #[test]
    fn a_key_given_twice_is_found_at_every_depth() {
        let unique = |line: &str| serde_json::from_str::<NoDupes>(line).is_ok();
        let cases: &[(&str, bool)] = &[
            (r#"{"cmd":"ack_turn","id":17}"#, true),
            (r#"{"cmd":"ack_turn","id":17,"cmd":"x"}"#, false),
            (
                r#"{"a":{"b":1,"c":2},"b":{"a":3},"c":[{"a":1},{"a":2}]}"#,
                true,
            ),
            (r#"{"a":{"b":1,"b":2}}"#, false),
            (r#"{"a":{"b":1},"c":2,"a":3}"#, false),
            (r#"[{"a":1},{"a":1}]"#, true),
            (
                r#"{"a":"\"a\":1,\"a\":2 {\"a\"} [","b":"\\","c":"x"}"#,
                true,
            ),
            (r#"{"a":1,"\u0061":2}"#, false),
            (r#"{"a\"":1,"a\"":2}"#, false),
            (r#"{"a":"unterminated}"#, false),
            ("{}", true),
            ("7", true),
        ];
        for (line, want) in cases {
            assert_eq!(unique(line), *want, "{line}");
        }
        let deep = format!("{}1{}", "[".repeat(17), "]".repeat(17));
        assert!(unique(&deep));
        let many = (0..33).map(|i| format!("\"k{i}\":{i}")).collect::<Vec<_>>();
        let many = format!("{{{}}}", many.join(","));
        assert!(unique(&many));
        let err = Request::parse(r#"{"cmd":"hello","\u0063md":"hello"}"#).unwrap_err();
        assert!(err.starts_with("bad request: duplicate key"), "{err}");
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
        let huge = err_line(&"e".repeat(100_000));
        assert!(huge.len() < MAX_ERROR_BYTES + 100);
    }

    /// `docs/wire-protocol.md` prints the privilege table; it says what the
    /// code does, row by row.
    #[test]
    fn the_documented_privilege_table_is_the_codes() {
        let doc = include_str!("../../docs/wire-protocol.md");
        let rows: Vec<&str> = doc
            .lines()
            .skip_while(|l| *l != "| cmd | who may send it |")
            .skip(2)
            .take_while(|l| l.starts_with("| `"))
            .collect();
        let want: Vec<String> = PRIVILEGES
            .iter()
            .map(|(cmd, access)| format!("| `{cmd}` | {access} |"))
            .collect();
        assert_eq!(rows, want);
    }

    /// The bridge's socket accepts the bridge's rows and nothing else; no
    /// other socket accepts them, whatever an agent is granted.
    #[test]
    fn only_the_bridge_sends_bridge_commands_and_it_sends_nothing_else() {
        use crate::proto::access::{Caller, Capability, Via};
        let groups = ToolGroup::ALL;
        let caps = Capability::ALL;
        let everything = Caller::Agent {
            name: "ana",
            groups: &groups,
            capabilities: &caps,
            via: Via::Shared,
        };
        let mut bridge_rows = 0;
        for (cmd, access) in PRIVILEGES {
            let bridge = *access == Access::Bridge;
            assert_eq!(
                access.admits(cmd, Caller::Bridge).is_ok(),
                bridge,
                "{cmd} on the bridge's socket"
            );
            if bridge {
                bridge_rows += 1;
                assert!(cmd.starts_with("bridge_"), "{cmd}");
                assert!(access.admits(cmd, Caller::Operator).is_err(), "{cmd}");
                assert!(access.admits(cmd, everything).is_err(), "{cmd}");
            }
        }
        assert_eq!(bridge_rows, 6);
    }

    #[test]
    fn invalid_reads_in_each_idiom() {
        let e = Invalid::arg("body", "must not be empty");
        assert_eq!(e.to_string(), "body must not be empty");
        assert_eq!(e.for_tool(), "argument \"body\" must not be empty");
        assert_eq!(Invalid::Whole("x".into()).for_tool(), "x");
    }
}
