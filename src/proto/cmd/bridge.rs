//! The Matrix bridge's commands, accepted only on its own socket
//! (`RUN/bridge.sock`): `bridge_hello` (who this hive is, where to resume),
//! the outbox (`bridge_next` hands out events in id order, `bridge_sent` and
//! `bridge_failed` settle them once the homeserver answered), the inbox
//! (`bridge_deliver`: a batch of room events and the sync token after them,
//! committed together) and `bridge_status` (the link's state, for the
//! operator). The events are typed here; their Matrix content is the
//! bridge's (`src/bridge/event.rs`).

use super::{check_option, check_text};
use crate::proto::command::{Command, Invalid};
use crate::proto::enums::closed_enum;
use crate::proto::ident::check_name;
use crate::proto::limits::{MAX_BODY, MAX_OPTIONS};
use crate::proto::reply::Empty;
use crate::proto::swarm::{BridgeState, MatrixConfig};
use crate::proto::text::excerpt;
use serde::{Deserialize, Serialize};

/// Most events one `bridge_deliver` carries.
pub const MAX_DELIVER: usize = 1000;

/// Longest Matrix id (user, event, room) or sync token a bridge command
/// carries, in bytes: the specification caps ids at 255.
pub const MAX_MATRIX_ID: usize = 255;

/// Longest broker instance id an event may carry (a uuid is 36).
pub const MAX_INSTANCE: usize = 64;

/// How many instances (broker starts) of each peer hive this hive
/// remembers, with the events it saw from each: every start sends under a
/// fresh instance, and an event keeps the instance it was first committed
/// under, so a retry from a restored `broker.db` comes under an old one.
/// 32 starts that each sent mail cover a month of daily restarts, past the
/// 30 days the dedupe rows are kept anyway; and a peer that flips its
/// instance on every event costs at most 32 remembered instances. An event
/// under an instance older than the last 32 is taken as new
/// (`docs/swarm.md`).
pub const KEEP_PEER_INSTANCES: usize = 32;

/// Whether `s` can be a broker's instance id (`hive.instance`): 1 to
/// [`MAX_INSTANCE`] hex digits and dashes.
pub fn is_instance(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_INSTANCE
        && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// Longest sync token kept, in bytes (Synapse's are tens of bytes).
pub const MAX_SYNC_TOKEN: usize = 4096;

/// Longest error text or status detail the bridge reports, in characters.
pub const MAX_DETAIL_CHARS: usize = 1000;

closed_enum! {
    /// What a swarm event is (`hive.kind` in the room).
    pub enum EventKind ("event kind", "kinds") {
        /// Mail from one hive's agent (or operator) to another's.
        Message = "message",
        /// A question asked across hives; the asker's broker owns it, the
        /// target's keeps a mirror with a local id.
        QuestionAsked = "question_asked",
        /// The target answered (the asker's question id in `question`).
        QuestionAnswered = "question_answered",
        /// The asker withdrew the question, or it expired.
        QuestionCancelled = "question_cancelled",
        /// Mail or a question could not be delivered on the receiving hive.
        Undeliverable = "undeliverable",
    }
}

closed_enum! {
    /// Why a hive could not deliver mail or a question (`hive.reason` of an
    /// `undeliverable` event): the receiving hive builds its notice from this
    /// and the event's ids alone, never from the peer's text, which it shows
    /// only quoted, as `other`, when the reason is missing or unknown (issue
    /// 40: a peer's words once arrived as from `system`).
    pub enum UndeliverableReason ("undeliverable reason", "reasons") {
        /// No agent of that name on the hive.
        UnknownAgent = "unknown_agent",
        /// Over what the hive takes.
        TooLong = "too_long",
        /// The hive refused it (its rules, its recipient's).
        Refused = "refused",
        /// It waited past its time.
        Expired = "expired",
    }
}

impl UndeliverableReason {
    /// The reason as the notice reads it: `unknown agent`.
    pub fn words(self) -> &'static str {
        match self {
            UndeliverableReason::UnknownAgent => "unknown agent",
            UndeliverableReason::TooLong => "too long",
            UndeliverableReason::Refused => "refused",
            UndeliverableReason::Expired => "expired",
        }
    }
}

/// The bridge at start: the hive's name and the broker's instance id, the
/// `matrix` section, and the sync token stored with the last delivered batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeHello {}

/// Answer to `bridge_hello`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BridgeHelloReply {
    pub hive_name: String,
    /// The uuid this broker start made: events first committed during it
    /// carry it (each [`Outbound`] says its own, kept across restarts).
    pub instance: String,
    pub matrix: MatrixConfig,
    /// Where the last delivered batch ended; None before the first sync.
    #[serde(default)]
    pub next_batch: Option<String>,
}

impl Command for BridgeHello {
    type Reply = BridgeHelloReply;
}

/// One event of the outbox, as the bridge sends it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outbound {
    /// The message id here: `hive.id`, and the transaction id's suffix.
    pub id: i64,
    /// The instance of the broker start that committed it (`hive.instance`,
    /// and the transaction id's prefix): with `id`, what identifies the
    /// event for good, across retries, restarts and a restored `broker.db`.
    /// Empty from a broker of an older release: the bridge then uses the
    /// instance of `bridge_hello`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance: String,
    /// The hive it goes to; empty for this hive's operator room.
    pub dest: String,
    pub kind: EventKind,
    /// The sender, qualified (`a@one`).
    pub from: String,
    /// The recipient, qualified (`b@two`); `operator` in the operator room.
    pub to: String,
    pub body: String,
    /// The message this answers, in the receiving hive's ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<i64>,
    /// For the question kinds: the asker's question id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<i64>,
    /// The instance of what this event refers to (`hive.ref_instance`):
    /// for a reply or a bounce, the instance the message it names
    /// (`in_reply_to`) was sent under; for an answer, a withdrawal or a
    /// bounce of a question, the instance that asked it. So a restored hive,
    /// whose ids start again, takes no reply or answer meant for an older
    /// message or question of the same id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ref_instance: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multi: bool,
    /// For an `undeliverable` event: why (`hive.reason`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UndeliverableReason>,
}

/// The oldest events not yet accepted by the homeserver, in id order (which
/// is the order of each destination's events); parks up to `wait_seconds`
/// while there are none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeNext {
    #[serde(default)]
    pub wait_seconds: Option<u64>,
}

/// Answer to `bridge_next`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BridgeNextReply {
    pub events: Vec<Outbound>,
}

impl Command for BridgeNext {
    type Reply = BridgeNextReply;
    fn wait_seconds(&self) -> Option<u64> {
        self.wait_seconds
    }
}

/// The homeserver accepted event `id` as `event_id`: it leaves the outbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeSent {
    pub id: i64,
    pub event_id: String,
}

impl Command for BridgeSent {
    type Reply = Empty;
    fn validate(&self) -> Result<(), Invalid> {
        check_matrix_id("event_id", &self.event_id, '$')
    }
}

/// The homeserver refused event `id` for good (`error` says why): it leaves
/// the outbox, and its sender is told it was not delivered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeFailed {
    pub id: i64,
    pub error: String,
}

impl Command for BridgeFailed {
    type Reply = Empty;
    fn validate(&self) -> Result<(), Invalid> {
        check_detail("error", &self.error)
    }
}

/// One room event the bridge accepted (its sender is the listed peer, or a
/// listed operator in the operator room), as the broker delivers it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inbound {
    /// The hive it comes from; empty for an operator's message.
    pub origin: String,
    /// `hive.id` (the message id on its hive), or the event id of an
    /// operator's message: with `origin` and `instance`, what deduplicates
    /// it.
    pub id: String,
    pub kind: EventKind,
    /// The sender's name on its hive (`a`, `operator`, `system`), or the
    /// Matrix user of an operator.
    pub from: String,
    /// The recipient's name here; empty for an operator's reply to an agent's
    /// post (`reply_to_event` then says whose).
    pub to: String,
    pub body: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_reply_to: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<i64>,
    /// `hive.ref_instance`: the instance of the message `in_reply_to` names
    /// or of the question `question` names ([`Outbound`]); none from a peer
    /// of an older release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ref_instance: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub multi: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_event: Option<String>,
    /// When the homeserver received it (unix s).
    #[serde(default)]
    pub sent_at: i64,
    /// `hive.instance`: the instance of the sending broker's start that
    /// first committed the event. Events are deduplicated by (origin,
    /// instance, id), and the last [`KEEP_PEER_INSTANCES`] instances of each
    /// hive are remembered, so neither a restart (a new instance) nor a
    /// restored `broker.db` (ids that start again) loses or repeats one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// For an `undeliverable` event: why, when the peer said so in the
    /// closed set (`hive.reason`; the bridge leaves out a value it does
    /// not know).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<UndeliverableReason>,
}

impl Inbound {
    /// What `bridge_deliver` checks of each event: the bridge checks it too
    /// before it sends a batch, so one bad event never holds up the rest.
    pub fn check(&self) -> Result<(), String> {
        if !self.origin.is_empty() {
            crate::proto::address::check_hive_name(&self.origin)?;
        }
        let id_ok = !self.id.is_empty() && self.id.len() <= MAX_MATRIX_ID;
        if !id_ok || self.from.is_empty() || self.from.len() > MAX_MATRIX_ID {
            return Err(format!(
                "an event needs an id and a sender of 1 to {MAX_MATRIX_ID} bytes"
            ));
        }
        if !self.to.is_empty() && self.to != "operator" {
            check_name(&self.to)?;
        }
        for i in [&self.instance, &self.ref_instance].into_iter().flatten() {
            if !is_instance(i) {
                return Err(format!(
                    "event {}: its instance {:?} is not a broker's instance id",
                    excerpt(&self.id),
                    excerpt(i)
                ));
            }
        }
        if self.body.len() > MAX_BODY || self.options.len() > MAX_OPTIONS {
            return Err(format!(
                "event {} is over the limits (body {} bytes, {} options)",
                excerpt(&self.id),
                self.body.len(),
                self.options.len()
            ));
        }
        for o in &self.options {
            check_option(o).map_err(|why| format!("event {}: {why}", excerpt(&self.id)))?;
        }
        Ok(())
    }
}

/// A batch of room events and the sync token after them, committed in one
/// transaction: each event is delivered once (a repeat of (origin, id) is
/// skipped), and the token is stored only with the events before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeDeliver {
    pub events: Vec<Inbound>,
    #[serde(default)]
    pub next_batch: Option<String>,
}

/// Answer to `bridge_deliver`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeDeliverReply {
    /// Events that became messages, questions or answers here.
    pub delivered: u64,
    /// Events delivered before (a replay).
    pub duplicates: u64,
    /// Events for no agent of this hive, bounced to their sender.
    pub bounced: u64,
    /// Events that fit nothing here (an answer to a closed question, a reply
    /// to a post that is not an agent's): dropped with a log line.
    pub ignored: u64,
}

impl Command for BridgeDeliver {
    type Reply = BridgeDeliverReply;
    fn validate(&self) -> Result<(), Invalid> {
        if self.events.len() > MAX_DELIVER {
            return Err(Invalid::arg(
                "events",
                format!(
                    "has {} entries; at most {MAX_DELIVER} per batch",
                    self.events.len()
                ),
            ));
        }
        for e in &self.events {
            e.check().map_err(|why| Invalid::arg("events", why))?;
        }
        match &self.next_batch {
            Some(t) if t.is_empty() || t.len() > MAX_SYNC_TOKEN => Err(Invalid::arg(
                "next_batch",
                format!("must be 1 to {MAX_SYNC_TOKEN} bytes"),
            )),
            _ => Ok(()),
        }
    }
}

/// The bridge's link to the homeserver changed (or is reported again).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BridgeStatus {
    pub state: BridgeState,
    #[serde(default)]
    pub detail: Option<String>,
}

impl Command for BridgeStatus {
    type Reply = Empty;
    fn validate(&self) -> Result<(), Invalid> {
        let reportable = [
            BridgeState::Connecting,
            BridgeState::Connected,
            BridgeState::BackingOff,
        ];
        if !reportable.contains(&self.state) {
            return Err(Invalid::arg(
                "state",
                format!(
                    "{} is not one the bridge reports: connecting, connected or backing_off",
                    excerpt(self.state.as_str())
                ),
            ));
        }
        match &self.detail {
            Some(d) => check_detail("detail", d),
            None => Ok(()),
        }
    }
}

fn check_matrix_id(arg: &'static str, id: &str, sigil: char) -> Result<(), Invalid> {
    if !id.starts_with(sigil) || id.len() > MAX_MATRIX_ID || id.chars().any(char::is_control) {
        return Err(Invalid::arg(
            arg,
            format!(
                "{} must be a Matrix id starting with {sigil}, at most {MAX_MATRIX_ID} bytes",
                excerpt(id)
            ),
        ));
    }
    Ok(())
}

fn check_detail(arg: &'static str, text: &str) -> Result<(), Invalid> {
    check_text(arg, text)?;
    if text.chars().count() > MAX_DETAIL_CHARS {
        return Err(Invalid::arg(
            arg,
            format!("must be at most {MAX_DETAIL_CHARS} characters"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for BridgeHello {
        fn sample() -> Self {
            BridgeHello {}
        }
    }
    impl Sample for BridgeNext {
        fn sample() -> Self {
            BridgeNext {
                wait_seconds: Some(30),
            }
        }
    }
    impl Sample for BridgeSent {
        fn sample() -> Self {
            BridgeSent {
                id: 17,
                event_id: "$yGOB9MSg".into(),
            }
        }
    }
    impl Sample for BridgeFailed {
        fn sample() -> Self {
            BridgeFailed {
                id: 17,
                error: "PUT … answered 400 M_BAD_JSON".into(),
            }
        }
    }
    impl Sample for BridgeDeliver {
        fn sample() -> Self {
            BridgeDeliver {
                events: vec![Inbound {
                    origin: "two".into(),
                    id: "9".into(),
                    kind: EventKind::QuestionAsked,
                    from: "b".into(),
                    to: "a".into(),
                    body: "ship it?".into(),
                    in_reply_to: None,
                    question: Some(4),
                    ref_instance: None,
                    options: vec!["yes".into(), "no".into()],
                    multi: false,
                    reply_to_event: None,
                    sent_at: 1_763_880_000,
                    instance: Some("6f1c2a9e-4b7d-4e21-9c3a-0d5e8f7a1b2c".into()),
                    reason: None,
                }],
                next_batch: Some("s72595_4483_1934".into()),
            }
        }
    }
    impl Sample for BridgeStatus {
        fn sample() -> Self {
            BridgeStatus {
                state: BridgeState::BackingOff,
                detail: Some("cannot reach the homeserver".into()),
            }
        }
    }

    #[test]
    fn bridge_commands_check_their_fields() {
        let e = BridgeSent {
            id: 1,
            event_id: "x".into(),
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("starting with $"), "{e}");
        let e = BridgeStatus {
            state: BridgeState::NotRunning,
            detail: None,
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("not one the bridge reports"), "{e}");
        let mut d = BridgeDeliver::sample();
        d.events[0].to = "Bad Name".into();
        assert!(d.validate().is_err());
        let mut d = BridgeDeliver::sample();
        d.events[0].instance = Some("not a uuid!".into());
        let e = d.validate().unwrap_err();
        assert!(e.to_string().contains("not a broker's instance id"), "{e}");
        let mut d = BridgeDeliver::sample();
        d.events[0].options[1] = "no\nyes".into();
        let e = d.validate().unwrap_err();
        assert!(e.to_string().contains("must be one line"), "{e}");
        let mut d = BridgeDeliver::sample();
        d.next_batch = Some(String::new());
        assert!(d.validate().is_err());
        let mut d = BridgeDeliver::sample();
        d.events = vec![d.events[0].clone(); MAX_DELIVER + 1];
        let e = d.validate().unwrap_err();
        assert!(e.to_string().contains("at most 1000 per batch"), "{e}");
        let e = serde_json::from_str::<EventKind>("\"teleport\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown event kind \"teleport\""), "{e}");
    }
}
