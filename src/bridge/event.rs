//! The swarm's events as Matrix content, both ways. Going out, an outbox event
//! becomes an `m.room.message` whose `body` is the readable text and whose
//! `hive.*` keys carry the rest (`hive.from`, `hive.to`, `hive.id` as a
//! string, `hive.kind`, `hive.instance` (the sending broker start's that
//! committed it), and `hive.in_reply_to`, `hive.question`,
//! `hive.ref_instance`, `hive.options`, `hive.multi`, `hive.reason` (why
//! an `undeliverable` was, from a closed set) when they apply); numbers travel
//! as strings, which canonical JSON never refuses. Coming in, a room event is
//! accepted only when it is well formed, addressed to this hive, and sent by
//! the bridge of the hive its `hive.from` names ([`Room::Swarm`]), or by a
//! listed operator in the operator room ([`Room::Operators`]), and is not an
//! edit (`m.relates_to` with `rel_type` `m.replace`: an edit changes a
//! message already delivered, it is no new one); anything else is skipped
//! with the reason, which the caller logs at debug level.

use crate::matrix::RoomEvent;
use crate::proto::address::Remote;
use crate::proto::cmd::{
    is_instance, EventKind, Inbound, Outbound, UndeliverableReason, MAX_MATRIX_ID,
};
use crate::proto::ident::check_name;
use crate::proto::limits::{MAX_BODY, MAX_OPTIONS};
use crate::proto::swarm::MatrixConfig;
use serde_json::{json, Map, Value};

/// Which of the bridge's rooms an event comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Room {
    /// The swarm's room, where the hives' bridges talk.
    Swarm,
    /// This hive's operator room.
    Operators,
}

/// Who this bridge is, for reading events.
#[derive(Debug, Clone)]
pub struct Me<'a> {
    pub hive: &'a str,
    /// The bridge's own Matrix user (as the homeserver spells it).
    pub user_id: &'a str,
    pub matrix: &'a MatrixConfig,
}

/// The content of the `m.room.message` that carries `ev`, sent by the broker
/// whose instance id is `instance`.
pub fn content(ev: &Outbound, instance: &str) -> Value {
    let mut c = Map::new();
    c.insert("msgtype".into(), json!("m.text"));
    let body = if ev.dest.is_empty() {
        // The operator room is read by people: say who wrote.
        format!("[{}] {}", ev.from, ev.body)
    } else {
        ev.body.clone()
    };
    c.insert("body".into(), json!(body));
    c.insert("hive.from".into(), json!(ev.from));
    c.insert("hive.to".into(), json!(ev.to));
    c.insert("hive.id".into(), json!(ev.id.to_string()));
    c.insert("hive.kind".into(), json!(ev.kind.name()));
    c.insert("hive.instance".into(), json!(instance));
    if let Some(r) = ev.in_reply_to {
        c.insert("hive.in_reply_to".into(), json!(r.to_string()));
    }
    if let Some(q) = ev.question {
        c.insert("hive.question".into(), json!(q.to_string()));
    }
    if let Some(i) = &ev.ref_instance {
        c.insert("hive.ref_instance".into(), json!(i));
    }
    if !ev.options.is_empty() {
        c.insert("hive.options".into(), json!(ev.options));
    }
    if ev.multi {
        c.insert("hive.multi".into(), json!(true));
    }
    if let Some(r) = ev.reason {
        c.insert("hive.reason".into(), json!(r.name()));
    }
    Value::Object(c)
}

/// A room event as the broker delivers it, or why it is skipped.
pub fn decode(ev: &RoomEvent, room: Room, me: &Me<'_>) -> Result<Inbound, String> {
    if ev.kind != "m.room.message" {
        return Err(format!("{} is not a message", ev.kind));
    }
    if ev.sender.eq_ignore_ascii_case(me.user_id) {
        return Err("our own event".into());
    }
    if ev.event_id.is_empty() {
        return Err("an event without an id".into());
    }
    if is_edit(ev) {
        return Err("an edit of an earlier message (m.replace), not a new one".into());
    }
    let inbound = match room {
        Room::Swarm => from_a_peer(ev, me)?,
        Room::Operators => from_an_operator(ev, me)?,
    };
    if inbound.body.len() > MAX_BODY || inbound.options.len() > MAX_OPTIONS {
        return Err(format!(
            "over the limits ({} bytes of body, {} options)",
            inbound.body.len(),
            inbound.options.len()
        ));
    }
    if inbound.to == "system" || inbound.from.len() > MAX_MATRIX_ID {
        return Err(format!("not for an agent or the operator: {}", inbound.to));
    }
    // What the broker would refuse would hold up the whole batch.
    inbound.check()?;
    Ok(inbound)
}

fn from_a_peer(ev: &RoomEvent, me: &Me<'_>) -> Result<Inbound, String> {
    let text = |key: &str| {
        ev.content_str(key)
            .ok_or_else(|| format!("no string {key:?} in its content"))
    };
    let from = Remote::parse(text("hive.from")?).ok_or_else(|| {
        format!(
            "hive.from {:?} is not NAME@HIVE",
            ev.content_str("hive.from")
        )
    })?;
    let listed = me.matrix.peers.get(&from.hive);
    if !listed.is_some_and(|u| u.eq_ignore_ascii_case(&ev.sender)) {
        return Err(format!(
            "forged: {} sent it as {from}, but the bridge of hive {} is {}",
            ev.sender,
            from.hive,
            listed.map_or("not listed", String::as_str)
        ));
    }
    let to = Remote::parse(text("hive.to")?)
        .ok_or_else(|| format!("hive.to {:?} is not NAME@HIVE", ev.content_str("hive.to")))?;
    if to.hive != me.hive {
        return Err(format!("for hive {}", to.hive));
    }
    let id = number(ev, "hive.id")?.ok_or("no hive.id")?;
    let kind = EventKind::from_name(text("hive.kind")?)
        .ok_or_else(|| format!("unknown hive.kind {:?}", ev.content_str("hive.kind")))?;
    let options = match ev.content.get("hive.options") {
        None => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(|o| o.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or("hive.options holds something other than strings")?,
        Some(_) => return Err("hive.options is not a list".into()),
    };
    Ok(Inbound {
        origin: from.hive,
        id: id.to_string(),
        kind,
        from: from.name,
        to: to.name,
        body: text("body")?.to_string(),
        in_reply_to: number(ev, "hive.in_reply_to")?,
        question: number(ev, "hive.question")?,
        options,
        multi: ev.content.get("hive.multi") == Some(&Value::Bool(true)),
        reply_to_event: None,
        sent_at: (ev.origin_server_ts / 1000) as i64,
        instance: instance(ev, "hive.instance")?,
        ref_instance: instance(ev, "hive.ref_instance")?,
        // A reason this release does not know reads as none: the broker
        // then quotes the peer's words as `other`.
        reason: ev
            .content_str("hive.reason")
            .and_then(UndeliverableReason::from_name),
    })
}

/// A broker's instance id under `key`, when there is one.
fn instance(ev: &RoomEvent, key: &str) -> Result<Option<String>, String> {
    match ev.content.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if is_instance(s) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{key} {other} is not an instance id")),
    }
}

/// A positive id sent as a string (`"17"`).
fn number(ev: &RoomEvent, key: &str) -> Result<Option<i64>, String> {
    match ev.content.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => match s.parse::<i64>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!("{key} {s:?} is not an id")),
        },
        Some(other) => Err(format!("{key} is {other}, not an id in a string")),
    }
}

fn from_an_operator(ev: &RoomEvent, me: &Me<'_>) -> Result<Inbound, String> {
    if !me
        .matrix
        .operators
        .iter()
        .any(|o| o.eq_ignore_ascii_case(&ev.sender))
    {
        return Err(format!("{} is not a listed operator", ev.sender));
    }
    let body = ev.content_str("body").ok_or("no body")?;
    let reply_to_event = ev
        .content
        .get("m.relates_to")
        .and_then(|r| r.pointer("/m.in_reply_to/event_id"))
        .and_then(Value::as_str)
        .map(str::to_string);
    let body = if reply_to_event.is_some() {
        without_reply_fallback(body)
    } else {
        body
    };
    let (to, body) = match addressed(body) {
        Some((to, rest)) => (to.to_string(), rest),
        None if reply_to_event.is_some() => (String::new(), body.trim()),
        None => return Err("names no agent (@agent: …) and replies to no post".into()),
    };
    if body.is_empty() {
        return Err("an empty message".into());
    }
    Ok(Inbound {
        origin: String::new(),
        id: ev.event_id.clone(),
        kind: EventKind::Message,
        from: ev.sender.clone(),
        to,
        body: body.to_string(),
        in_reply_to: None,
        question: None,
        ref_instance: None,
        options: Vec::new(),
        multi: false,
        reply_to_event,
        sent_at: (ev.origin_server_ts / 1000) as i64,
        instance: None,
        reason: None,
    })
}

/// Whether `ev` edits an earlier event: `m.relates_to.rel_type` is
/// `m.replace` (what clients send; the `* ` they put before the body is a
/// fallback for other clients, and not what tells an edit).
fn is_edit(ev: &RoomEvent) -> bool {
    ev.content
        .get("m.relates_to")
        .and_then(|r| r.get("rel_type"))
        .and_then(Value::as_str)
        == Some("m.replace")
}

/// `@agent: text` → (agent, text).
fn addressed(body: &str) -> Option<(&str, &str)> {
    let rest = body.trim_start().strip_prefix('@')?;
    let (name, text) = rest.split_once(':')?;
    check_name(name).ok()?;
    Some((name, text.trim()))
}

/// A reply's body without the quoted fallback clients put before it (`> …`
/// lines and the blank line after them).
fn without_reply_fallback(body: &str) -> &str {
    let mut rest = body;
    while let Some(line_end) = rest.strip_prefix('>').and(rest.find('\n')) {
        rest = &rest[line_end + 1..];
    }
    rest.trim_start_matches('\n')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix() -> MatrixConfig {
        MatrixConfig {
            homeserver: "http://127.0.0.1:8008".into(),
            user_id: "@hive-one-bridge:hive.test".into(),
            room: "#swarm:hive.test".into(),
            peers: [("two".to_string(), "@hive-two-bridge:hive.test".to_string())].into(),
            operators: vec!["@alice:hive.test".into()],
            operator_room: Some("!ops".into()),
            ..MatrixConfig::default()
        }
    }

    fn event(sender: &str, content: Value) -> RoomEvent {
        RoomEvent::from_value(&json!({
            "type": "m.room.message", "event_id": "$e1", "sender": sender,
            "origin_server_ts": 1_763_880_000_123u64, "content": content,
        }))
    }

    #[test]
    fn an_outbound_event_is_readable_content_with_the_hive_fields() {
        let ev = Outbound {
            id: 17,
            instance: String::new(),
            ref_instance: None,
            dest: "two".into(),
            kind: EventKind::QuestionAsked,
            from: "a@one".into(),
            to: "b@two".into(),
            body: "ship it?".into(),
            in_reply_to: Some(4),
            question: Some(9),
            options: vec!["yes".into(), "no".into()],
            multi: false,
            reason: None,
        };
        let c = content(&ev, "6f1c2a9e-4b7d-4e21-9c3a-0d5e8f7a1b2c");
        assert_eq!(
            c.to_string(),
            r#"{"body":"ship it?","hive.from":"a@one","hive.id":"17","hive.in_reply_to":"4","hive.instance":"6f1c2a9e-4b7d-4e21-9c3a-0d5e8f7a1b2c","hive.kind":"question_asked","hive.options":["yes","no"],"hive.question":"9","hive.to":"b@two","msgtype":"m.text"}"#
        );
        assert!(crate::matrix::content::check_message(&c).is_ok());
        let post = Outbound {
            dest: String::new(),
            to: "operator".into(),
            kind: EventKind::Message,
            question: None,
            options: vec![],
            in_reply_to: None,
            ..ev
        };
        assert_eq!(content(&post, "i")["body"], "[a@one] ship it?");
    }

    /// An `undeliverable` carries its reason as `hive.reason`; one from the
    /// closed set comes back in as itself, any other value (or none) as
    /// none, which the broker shows as `other` with the peer's words.
    #[test]
    fn an_undeliverables_reason_travels_and_an_unknown_one_is_none() {
        let ev = Outbound {
            id: 8,
            instance: String::new(),
            ref_instance: None,
            dest: "one".into(),
            kind: EventKind::Undeliverable,
            from: "system@two".into(),
            to: "a@one".into(),
            body: "[undeliverable] no agent zed on hive two".into(),
            in_reply_to: Some(5),
            question: None,
            options: vec![],
            multi: false,
            reason: Some(UndeliverableReason::UnknownAgent),
        };
        let c = content(&ev, "0a-1b");
        assert_eq!(c["hive.reason"], "unknown_agent");
        let m = matrix();
        let me = Me {
            hive: "one",
            user_id: "@hive-one-bridge:hive.test",
            matrix: &m,
        };
        let read = |c: Value| {
            decode(&event("@hive-two-bridge:hive.test", c), Room::Swarm, &me)
                .unwrap()
                .reason
        };
        assert_eq!(read(c.clone()), Some(UndeliverableReason::UnknownAgent));
        let mut other = c.clone();
        other["hive.reason"] = json!("cosmic rays");
        assert_eq!(read(other), None);
        let mut none = c;
        none.as_object_mut().unwrap().remove("hive.reason");
        assert_eq!(read(none), None);
    }

    #[test]
    fn what_goes_out_comes_back_in_on_the_other_hive() {
        let ev = Outbound {
            id: 17,
            instance: String::new(),
            ref_instance: None,
            dest: "one".into(),
            kind: EventKind::Message,
            from: "b@two".into(),
            to: "a@one".into(),
            body: "hello \u{0}é".into(),
            in_reply_to: Some(3),
            question: None,
            options: vec![],
            multi: false,
            reason: None,
        };
        let m = matrix();
        let me = Me {
            hive: "one",
            user_id: "@hive-one-bridge:hive.test",
            matrix: &m,
        };
        let got = decode(
            &event("@hive-two-bridge:hive.test", content(&ev, "0a-1b")),
            Room::Swarm,
            &me,
        )
        .unwrap();
        assert_eq!(
            (
                got.origin.as_str(),
                got.id.as_str(),
                got.from.as_str(),
                got.to.as_str(),
                got.body.as_str()
            ),
            ("two", "17", "b", "a", "hello \u{0}é")
        );
        assert_eq!((got.in_reply_to, got.sent_at), (Some(3), 1_763_880_000));
        assert_eq!(got.instance.as_deref(), Some("0a-1b"));
        assert_eq!(got.ref_instance, None);
        let answer = Outbound {
            kind: EventKind::QuestionAnswered,
            question: Some(9),
            ref_instance: Some("77-aa".into()),
            ..ev
        };
        let c = content(&answer, "0a-1b");
        assert_eq!(c["hive.ref_instance"], "77-aa");
        let got = decode(&event("@hive-two-bridge:hive.test", c), Room::Swarm, &me).unwrap();
        assert_eq!(
            (got.question, got.ref_instance.as_deref()),
            (Some(9), Some("77-aa"))
        );
    }

    #[test]
    fn forged_malformed_foreign_and_own_events_are_skipped_with_the_reason() {
        let m = matrix();
        let me = Me {
            hive: "one",
            user_id: "@hive-one-bridge:hive.test",
            matrix: &m,
        };
        let good = json!({"msgtype":"m.text","body":"hi","hive.from":"b@two","hive.to":"a@one",
                          "hive.id":"5","hive.kind":"message"});
        let with = |key: &str, v: Value| {
            let mut c = good.clone();
            c[key] = v;
            c
        };
        let cases = [
            (
                "@mallory:hive.test",
                good.clone(),
                "forged: @mallory:hive.test sent it as b@two",
            ),
            ("@hive-one-bridge:hive.test", good.clone(), "our own event"),
            (
                "@hive-two-bridge:hive.test",
                with("hive.to", json!("a@three")),
                "for hive three",
            ),
            (
                "@hive-two-bridge:hive.test",
                with("hive.from", json!("b@four")),
                "not listed",
            ),
            (
                "@hive-two-bridge:hive.test",
                with("hive.id", json!(5)),
                "not an id in a string",
            ),
            (
                "@hive-two-bridge:hive.test",
                with("hive.id", json!("-1")),
                "is not an id",
            ),
            (
                "@hive-two-bridge:hive.test",
                with("hive.kind", json!("teleport")),
                "unknown hive.kind",
            ),
            (
                "@hive-two-bridge:hive.test",
                with("hive.from", json!("b")),
                "is not NAME@HIVE",
            ),
            (
                "@hive-two-bridge:hive.test",
                with("body", json!(7)),
                "no string \"body\"",
            ),
            (
                "@hive-two-bridge:hive.test",
                with("hive.options", json!([1])),
                "other than strings",
            ),
            (
                "@hive-two-bridge:hive.test",
                with("hive.instance", json!("<script>")),
                "is not an instance id",
            ),
            (
                "@hive-two-bridge:hive.test",
                with("hive.ref_instance", json!("x y")),
                "is not an instance id",
            ),
            // As local `ask` refuses them (robustness review N9).
            (
                "@hive-two-bridge:hive.test",
                with("hive.options", json!(["a\nb", "c"])),
                "must be one line",
            ),
            (
                "@hive-two-bridge:hive.test",
                with(
                    "m.relates_to",
                    json!({"rel_type": "m.replace", "event_id": "$old"}),
                ),
                "an edit of an earlier message",
            ),
        ];
        for (sender, content, want) in cases {
            let e = decode(&event(sender, content.clone()), Room::Swarm, &me).unwrap_err();
            assert!(e.contains(want), "{content}: {e}");
        }
        let mut state = event("@hive-two-bridge:hive.test", good);
        state.kind = "m.room.topic".into();
        assert!(decode(&state, Room::Swarm, &me).is_err());
    }

    #[test]
    fn operators_write_to_an_agent_by_name_or_by_replying_to_its_post() {
        let m = matrix();
        let me = Me {
            hive: "one",
            user_id: "@hive-one-bridge:hive.test",
            matrix: &m,
        };
        let named = decode(
            &event(
                "@alice:hive.test",
                json!({"msgtype":"m.text","body":"@ana: look at #4"}),
            ),
            Room::Operators,
            &me,
        )
        .unwrap();
        assert_eq!(
            (
                named.to.as_str(),
                named.body.as_str(),
                named.origin.as_str(),
                named.id.as_str()
            ),
            ("ana", "look at #4", "", "$e1")
        );
        // What the broker would refuse is skipped here, not sent to hold up
        // the batch: an event id past the specification's 255 bytes.
        let mut long = event(
            "@alice:hive.test",
            json!({"msgtype":"m.text","body":"@ana: hi"}),
        );
        long.event_id = format!("${}", "x".repeat(300));
        let e = decode(&long, Room::Operators, &me).unwrap_err();
        assert!(e.contains("an event needs an id"), "{e}");
        let reply = decode(
            &event(
                "@alice:hive.test",
                json!({"msgtype":"m.text","body":"> <@hive-one-bridge:hive.test> [ana@one] done\n> more\n\nthanks",
                       "m.relates_to":{"m.in_reply_to":{"event_id":"$post"}}}),
            ),
            Room::Operators,
            &me,
        )
        .unwrap();
        assert_eq!(
            (
                reply.to.as_str(),
                reply.body.as_str(),
                reply.reply_to_event.as_deref()
            ),
            ("", "thanks", Some("$post"))
        );
        // An edit is told by its relation, whatever its body says (an edit
        // without the `* ` fallback once arrived as a second message: N9).
        for body in ["@ana: T42 edit without star", "* @ana: T42 edit"] {
            let e = decode(
                &event(
                    "@alice:hive.test",
                    json!({"msgtype":"m.text","body":body,
                           "m.new_content":{"msgtype":"m.text","body":"@ana: T42"},
                           "m.relates_to":{"rel_type":"m.replace","event_id":"$first"}}),
                ),
                Room::Operators,
                &me,
            )
            .unwrap_err();
            assert!(e.contains("an edit of an earlier message"), "{body}: {e}");
        }
        for (sender, body, want) in [
            ("@bob:hive.test", "@ana: hi", "not a listed operator"),
            ("@alice:hive.test", "hello all", "names no agent"),
            ("@alice:hive.test", "@ana:   ", "an empty message"),
        ] {
            let e = decode(
                &event(sender, json!({"msgtype":"m.text","body":body})),
                Room::Operators,
                &me,
            )
            .unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
        }
    }
}
