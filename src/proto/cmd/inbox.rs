//! Delivery and consumption: `wake`, `send`, `send_to_parent`, the harness's
//! `recv_next` / `ack_turn` / `requeue_inflight` / `status`, the MCP tool's
//! `recv` / `recv_ack`, and the operator's `inbox` / `inbox_ack`.

use super::{check_remote_text, check_text};
use crate::proto::command::{Command, Invalid};
use crate::proto::ident::check_sender;
use crate::proto::kinds::{Attempt, Place};
use crate::proto::limits::MAX_LAST_ERROR_CHARS;
use crate::proto::reply::{AckedReply, Empty, Message, MessagesReply, SentReply};
use serde::{Deserialize, Serialize};

/// Pushes a message into the caller's own inbox (agent socket) or an agent's
/// inbox (`to`, host socket), from a script (`from`). `transient` ones never
/// touch sqlite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wake {
    pub from: String,
    pub body: String,
    #[serde(default)]
    pub transient: bool,
    #[serde(default)]
    pub to: Option<String>,
    /// Issue 43: the W3C `traceparent` of what sent it; the run that handles
    /// it links to that span. Not kept for a transient wake.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl Command for Wake {
    type Reply = SentReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_sender(&self.from).map_err(|e| Invalid::arg("from", e))?;
        super::check_traceparent("traceparent", self.traceparent.as_deref())?;
        check_text("body", &self.body)
    }
}

/// Messages a peer, the topology parent (`<parent>`), `operator`, or
/// `NAME@HIVE` on another hive of the swarm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Send {
    pub to: String,
    pub body: String,
    #[serde(default)]
    pub in_reply_to: Option<i64>,
    /// Issue 43: the sender gets a receipt once the message is acked (a
    /// `receipt` row that waits for the sender's next turn or `recv`; a dead
    /// letter's notice, which wakes it, is its receipt of that).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub receipt: bool,
    /// Issue 43: the W3C `traceparent` of the sender's run (`hive mcp` takes
    /// claude's `TRACEPARENT`); the recipient's run links to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl Command for Send {
    type Reply = SentReply;
    fn validate(&self) -> Result<(), Invalid> {
        if self.to.trim().is_empty() {
            return Err(Invalid::arg("to", "must not be empty"));
        }
        if self.to.contains('@') {
            crate::proto::address::check_remote(&self.to).map_err(|e| Invalid::arg("to", e))?;
        }
        check_text("body", &self.body)?;
        super::check_traceparent("traceparent", self.traceparent.as_deref())?;
        if self.receipt && self.to.contains('@') {
            return Err(Invalid::arg(
                "receipt",
                "is for mail on this hive; message_state tells whether NAME@HIVE mail was \
                 posted to the swarm room",
            ));
        }
        check_remote_text("body", &self.body, &self.to)
    }
}

/// Messages the caller's topology parent (the operator for a root agent).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendToParent {
    pub body: String,
}

impl Command for SendToParent {
    type Reply = SentReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_text("body", &self.body)
    }
}

/// The MCP tool's drain: hands out up to `max` rows (1 by default, at most
/// `RECV_MAX`), held for this connection until `recv_ack` confirms them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recv {
    #[serde(default)]
    pub wait_seconds: Option<u64>,
    #[serde(default)]
    pub max: Option<u64>,
}

impl Command for Recv {
    type Reply = MessagesReply;
    fn wait_seconds(&self) -> Option<u64> {
        self.wait_seconds
    }
}

/// Confirms rows handed out by `recv` on this connection.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecvAck {
    pub ids: Vec<i64>,
}

impl Command for RecvAck {
    type Reply = AckedReply;
}

/// What the caller last saw of its own status and inbox (`recv_next`): a
/// parked call returns early, without a message, once either differs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seen {
    pub unread: u64,
    #[serde(default)]
    pub status_text: String,
}

/// The harness's pop: one row becomes inflight (or the inflight row again).
/// With `seen`, the answer also carries the caller's unread count and status
/// line, and a parked call returns early when they change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecvNext {
    #[serde(default)]
    pub wait_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<Seen>,
}

/// Answer to `recv_next`: `message` is null when the wait ended empty (or, with
/// `seen`, when the status or the unread count changed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecvNextReply {
    pub message: Option<Message>,
    /// True when this row was already inflight (a harness restarted mid-turn).
    #[serde(default)]
    pub redelivered: bool,
    /// Rows still queued after this pop (with a message, or with `seen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread: Option<u64>,
    /// The message's hand-outs that count toward the harness's attempt
    /// limit, this one included (with a message). Every hand-out counts,
    /// also a redelivery after the harness stopped mid-turn; a
    /// `requeue_inflight` with `attempt:"not_counted"` gives one back.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub attempts: u32,
    /// The caller's status line (with `seen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_text: Option<String>,
    /// When it was set (with `seen`, once set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_set_at: Option<i64>,
    /// The broker's pause of this agent (its pool's usage limit, a budget):
    /// no message is handed out until it ends. Answered once per connection
    /// and pause; a later call on that connection parks until it ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<crate::proto::Paused>,
    /// The agent's `turn_usd` (issue 16) as the broker's fleet entry has it
    /// now, so a live change reaches the next run: the harness passes it as
    /// `--max-budget-usd`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_usd: Option<f64>,
    /// Issue 43: the handed-out message's `traceparent`, when it carries one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl Command for RecvNext {
    type Reply = RecvNextReply;
    fn wait_seconds(&self) -> Option<u64> {
        self.wait_seconds
    }
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// Unread count and inflight id of the caller. With `seen` (what the caller
/// last saw of its unread count and status line) the answer also carries the
/// status line, and with `wait_seconds` a call whose `seen` is still current
/// parks until either changes: how the harness watches its status while a
/// turn holds its `recv_next`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Status {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<Seen>,
}

/// Answer to `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReply {
    pub unread: u64,
    pub inflight: Option<i64>,
    /// The caller's status line (with `seen`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_text: Option<String>,
    /// When it was set (with `seen`, once set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_set_at: Option<i64>,
    /// With `seen`: the mark of the operator's last `resume` of the agent's
    /// own pause (unix milliseconds, later at every resume, across broker
    /// restarts too); absent before the first. A parked watch is answered
    /// at once when it moves, and the harness that sees it move (not in
    /// its first answer) ends its pause and tries at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed: Option<i64>,
}

impl Command for Status {
    type Reply = StatusReply;
    fn wait_seconds(&self) -> Option<u64> {
        self.wait_seconds
    }
}

/// Finishes the inflight row. `turn` (issue 43) is the harness's id of the
/// turn that handled it, kept with the row for `message_state`; older
/// harnesses send none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AckTurn {
    pub id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<i64>,
}

impl Command for AckTurn {
    type Reply = Empty;
}

/// Puts the inflight row back into the inbox: by default (what older
/// harnesses send) at the head with its hand-out given back. A failure that
/// was the message's own is `attempt:"counted"` with its `error`, and goes
/// `place:"behind"` the mail of other senders.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequeueInflight {
    pub id: i64,
    #[serde(default)]
    pub attempt: Attempt,
    #[serde(default)]
    pub place: Place,
    /// What went wrong, kept as the message's last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Command for RequeueInflight {
    type Reply = Empty;
    fn validate(&self) -> Result<(), Invalid> {
        match &self.error {
            Some(e) => check_error(e),
            None => Ok(()),
        }
    }
}

/// A harness's last error for a message: not blank, at most
/// [`MAX_LAST_ERROR_CHARS`] characters.
pub fn check_error(error: &str) -> Result<(), Invalid> {
    if error.trim().is_empty() {
        return Err(Invalid::arg("error", "must not be empty"));
    }
    let n = error.chars().count();
    if n > MAX_LAST_ERROR_CHARS {
        return Err(Invalid::arg(
            "error",
            format!("is {n} characters; at most {MAX_LAST_ERROR_CHARS} (cut it)"),
        ));
    }
    Ok(())
}

/// Operator: one page of unread operator messages, oldest first, with ids
/// above `after` (when given). Nothing is marked read: the client acks the ids
/// it showed with `inbox_ack` (at-least-once). `peek` is accepted for older
/// clients and changes nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inbox {
    #[serde(default)]
    pub wait_seconds: Option<u64>,
    #[serde(default)]
    pub peek: bool,
    #[serde(default)]
    pub after: Option<i64>,
}

impl Command for Inbox {
    type Reply = MessagesReply;
    fn wait_seconds(&self) -> Option<u64> {
        self.wait_seconds
    }
}

/// Operator: marks these operator messages read (ids that are not unread
/// operator messages are skipped).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InboxAck {
    pub ids: Vec<i64>,
}

impl Command for InboxAck {
    type Reply = AckedReply;
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for Wake {
        fn sample() -> Self {
            Wake {
                from: "matrix".into(),
                body: "new dm".into(),
                transient: true,
                to: Some("ana".into()),
                traceparent: None,
            }
        }
    }
    impl Sample for Send {
        fn sample() -> Self {
            Send {
                to: "<parent>".into(),
                body: "hi".into(),
                in_reply_to: Some(3),
                receipt: false,
                traceparent: None,
            }
        }
    }
    impl Sample for SendToParent {
        fn sample() -> Self {
            SendToParent {
                body: "done".into(),
            }
        }
    }
    impl Sample for Recv {
        fn sample() -> Self {
            Recv {
                wait_seconds: Some(5),
                max: Some(2),
            }
        }
    }
    impl Sample for RecvAck {
        fn sample() -> Self {
            RecvAck { ids: vec![1, 2] }
        }
    }
    impl Sample for RecvNext {
        fn sample() -> Self {
            RecvNext {
                wait_seconds: Some(30),
                seen: Some(Seen {
                    unread: 2,
                    status_text: "x".into(),
                }),
            }
        }
    }
    impl Sample for Status {
        fn sample() -> Self {
            Status {
                wait_seconds: Some(30),
                seen: Some(Seen {
                    unread: 1,
                    status_text: "reviewing".into(),
                }),
            }
        }
    }
    impl Sample for AckTurn {
        fn sample() -> Self {
            AckTurn {
                id: 3,
                turn: Some(5),
            }
        }
    }
    impl Sample for RequeueInflight {
        fn sample() -> Self {
            RequeueInflight {
                id: 3,
                attempt: Attempt::Counted,
                place: Place::Behind,
                error: Some("failed: claude exited with code 1 without a result line".into()),
            }
        }
    }
    impl Sample for Inbox {
        fn sample() -> Self {
            Inbox {
                wait_seconds: Some(1),
                peek: false,
                after: Some(7),
            }
        }
    }
    impl Sample for InboxAck {
        fn sample() -> Self {
            InboxAck { ids: vec![7] }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::ident::Peer;
    use crate::proto::kinds::{MsgKind, PauseReason};
    use crate::proto::lines::ok_line;
    use crate::proto::Paused;

    /// The answers on every message's path, byte for byte as the wire has
    /// them (`wake`'s and `send`'s with and without an id, `ack_turn`'s,
    /// `recv_next`'s with and without a message), and `recv_next`'s for every
    /// shape the broker answers — no message, a message of every kind of
    /// sender and recipient with bodies that need escaping, a redelivery,
    /// and each of the optional fields there and absent — read back as the
    /// same reply.
    #[test]
    fn the_answers_on_every_message_path_are_pinned_and_read_back() {
        let message = |from: Peer, to: Peer, body: &str, kind: MsgKind| Message {
            id: 1_795_833_464,
            from,
            to,
            body: body.into(),
            kind,
            in_reply_to: None,
            sent_at: 1_764_300_000,
            transient: false,
        };
        let mut messages = vec![
            message(
                Peer::Operator,
                Peer::Agent("bench".into()),
                "cycle 1",
                MsgKind::Message,
            ),
            message(
                Peer::sender("cron\"job"),
                Peer::Agent("a-b".into()),
                "a \"quoted\"\\ body\nwith\ttabs \u{0}\u{1f}\u{7f}, é→ and 🐝\u{2028}",
                MsgKind::Kick,
            ),
            message(
                Peer::System,
                Peer::Parent,
                "",
                MsgKind::Other("teleport".into()),
            ),
            message(
                Peer::Reminder,
                Peer::Remote("x@y".into()),
                "r",
                MsgKind::Reminder,
            ),
        ];
        messages[1].in_reply_to = Some(-3);
        messages[2].transient = true;
        messages[3].id = i64::MAX;
        messages[3].in_reply_to = Some(i64::MIN);
        let paused = Paused {
            reason: PauseReason::UsageLimit,
            until: Some(1_764_303_600),
            detail: "pool p: \"limit\"".into(),
        };
        let mut replies = vec![RecvNextReply {
            message: None,
            redelivered: false,
            unread: None,
            attempts: 0,
            status_text: None,
            status_set_at: None,
            paused: None,
            turn_usd: None,
            traceparent: None,
        }];
        for m in messages {
            replies.push(RecvNextReply {
                message: Some(m),
                unread: Some(0),
                attempts: 1,
                ..replies[0].clone()
            });
        }
        replies.push(RecvNextReply {
            redelivered: true,
            unread: Some(u64::MAX),
            attempts: u32::MAX,
            status_text: Some("working on \"it\"\n".into()),
            status_set_at: Some(-1),
            paused: Some(paused.clone()),
            turn_usd: Some(0.25),
            ..replies[1].clone()
        });
        replies.push(RecvNextReply {
            unread: Some(3),
            status_text: Some(String::new()),
            paused: Some(Paused {
                until: None,
                ..paused
            }),
            turn_usd: Some(1e21),
            ..replies[0].clone()
        });
        let sent = [
            SentReply {
                id: Some(42),
                to: Peer::Agent("bench".into()),
            },
            SentReply {
                id: None,
                to: Peer::Remote("ana@other \"hive\"".into()),
            },
            SentReply {
                id: Some(-1),
                to: Peer::Operator,
            },
        ];
        let pinned = [
            r#"{"ok":true,"id":42,"to":"bench"}"#,
            r#"{"ok":true,"id":null,"to":"ana@other \"hive\""}"#,
            r#"{"ok":true,"id":-1,"to":"operator"}"#,
        ];
        for (r, want) in sent.iter().zip(pinned) {
            assert_eq!(Wake::reply_line(r), want);
            assert_eq!(Send::reply_line(r), want);
        }
        assert_eq!(AckTurn::reply_line(&Empty {}), r#"{"ok":true}"#);
        assert_eq!(
            RecvNext::reply_line(&replies[0]),
            r#"{"ok":true,"message":null,"redelivered":false}"#
        );
        assert_eq!(
            RecvNext::reply_line(&replies[1]),
            concat!(
                r#"{"ok":true,"message":{"id":1795833464,"from":"operator","to":"bench","#,
                r#""body":"cycle 1","kind":"message","in_reply_to":null,"sent_at":1764300000,"#,
                r#""transient":false},"redelivered":false,"unread":0,"attempts":1}"#
            )
        );
        for r in &replies {
            let line = RecvNext::reply_line(r);
            assert_eq!(line, ok_line(r));
            let mut back: serde_json::Value = serde_json::from_str(&line).unwrap();
            back.as_object_mut().unwrap().remove("ok");
            assert_eq!(&serde_json::from_value::<RecvNextReply>(back).unwrap(), r);
        }
    }
}
