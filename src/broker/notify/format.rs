//! What one notification looks like on the wire, per format: `json` (the
//! documented schema, signed with the Standard Webhooks headers), `ntfy`
//! (a text body with `Title`, `Priority` and `Tags` headers) and `slack`
//! (an incoming webhook's `{"text": …}`). Agent text is cut to a
//! [`PREVIEW_CHARS`] preview, escaped for Slack and kept out of headers;
//! a message's whole body leaves the host only for `message_to_operator`.

use super::dest::Destination;
use super::sign::webhook_signature;
use crate::broker::db::NotifyEvent;
use crate::config::notify::Format;

/// The characters of agent text a notification carries, but for a
/// `message_to_operator`'s body.
pub const PREVIEW_CHARS: usize = 200;

/// The most characters of a `message_to_operator` body an ntfy or Slack
/// notification carries (ntfy's own limit is 4 KiB).
const CHAT_BODY_CHARS: usize = 3000;

/// One request to a destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    pub content_type: &'static str,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// The first `n` characters of `text` on one line: every control
/// character (CR, LF, tab, …) a space, runs of spaces kept.
pub fn one_line(text: &str, n: usize) -> String {
    let mut out: String = text
        .chars()
        .take(n)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(n).is_some() {
        out.push('…');
    }
    out
}

/// The first `n` characters of `text`, lines kept.
fn cut(text: &str, n: usize) -> String {
    let mut out: String = text.chars().take(n).collect();
    if text.chars().nth(n).is_some() {
        out.push('…');
    }
    out
}

/// A header value: one line of printable ASCII (ntfy and HTTP/1.1 take
/// nothing else safely), at most 200 characters.
fn header_value(text: &str) -> String {
    text.chars()
        .filter(|c| *c != '\r' && *c != '\n')
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .take(200)
        .collect()
}

/// Escapes Slack's three control characters in text.
pub fn slack_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A one-line title: the hive, and what happened to whom (names only).
pub fn title(ev: &NotifyEvent, hive: &str) -> String {
    let who = header_value(&ev.agent);
    let what = match ev.event.as_str() {
        "question" => format!("{who} asks you a question"),
        "approval" => "an approval waits for you".into(),
        "needs_login" => format!("{who} needs a login"),
        "dead_letter" => format!("a message to {who} was dead-lettered"),
        "budget" => "a budget passed a threshold".into(),
        "usage_limit" => "a usage limit was hit".into(),
        "agent_crashed" => format!("{who} crashed"),
        "message_to_operator" => format!("message from {who}"),
        "test" => "test notification".into(),
        other => header_value(other),
    };
    format!("hive {}: {what}", header_value(hive))
}

/// Whether ntfy should ring for it.
fn urgent(event: &str) -> bool {
    matches!(
        event,
        "question" | "approval" | "needs_login" | "dead_letter" | "agent_crashed" | "usage_limit"
    )
}

/// The request for `ev` to `dest`, signed at `now` (unix seconds).
pub fn render(dest: &Destination, ev: &NotifyEvent, hive: &str, now: i64) -> Outgoing {
    let title = title(ev, hive);
    let is_message = ev.event == "message_to_operator";
    let preview = one_line(&ev.text, PREVIEW_CHARS);
    match dest.format {
        Format::Json => {
            let mut data = serde_json::json!({
                "id": ev.uid,
                "hive": hive,
                "agent": ev.agent,
                "title": title,
                "preview": preview,
            });
            if let Some(m) = ev.msg_id {
                data["message_id"] = m.into();
            }
            if is_message {
                data["body"] = ev.text.clone().into();
            }
            let body = serde_json::json!({
                "type": ev.event,
                "timestamp": crate::proto::text::fmt_time(ev.at).replacen(' ', "T", 1),
                "data": data,
            })
            .to_string()
            .into_bytes();
            let mut headers = vec![
                ("webhook-id", ev.uid.clone()),
                ("webhook-timestamp", now.to_string()),
            ];
            if let Some(key) = &dest.secret {
                headers.push((
                    "webhook-signature",
                    webhook_signature(key, &ev.uid, now, &body),
                ));
            }
            Outgoing {
                content_type: "application/json",
                headers,
                body,
            }
        }
        Format::Ntfy => {
            let text = if is_message {
                cut(&ev.text, CHAT_BODY_CHARS)
            } else {
                preview
            };
            Outgoing {
                content_type: "text/plain; charset=utf-8",
                headers: vec![
                    ("Title", header_value(&title)),
                    (
                        "Priority",
                        if urgent(&ev.event) { "high" } else { "default" }.into(),
                    ),
                    ("Tags", header_value(&format!("hive,{}", ev.event))),
                ],
                body: text.into_bytes(),
            }
        }
        Format::Slack => {
            let text = if is_message {
                cut(&ev.text, CHAT_BODY_CHARS)
            } else {
                preview
            };
            let body = serde_json::json!({
                "text": format!("*{}*\n{}", slack_escape(&title), slack_escape(&text)),
            })
            .to_string()
            .into_bytes();
            Outgoing {
                content_type: "application/json",
                headers: vec![],
                body,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dest(format: Format, secret: Option<&[u8]>) -> Destination {
        Destination {
            key: "k".into(),
            url: "http://127.0.0.1:9/x".into(),
            shown: "http://127.0.0.1:9".into(),
            format,
            events: vec![],
            secret: secret.map(<[u8]>::to_vec),
        }
    }

    fn ev(event: &str, text: &str) -> NotifyEvent {
        NotifyEvent {
            id: 3,
            uid: "evt_00ff".into(),
            event: event.into(),
            agent: "ana".into(),
            msg_id: Some(12),
            text: text.into(),
            at: 1_700_000_000,
        }
    }

    #[test]
    fn a_title_names_the_agent_where_the_event_is_about_one() {
        assert_eq!(
            title(&ev("needs_login", "x"), "prod"),
            "hive prod: ana needs a login"
        );
        assert_eq!(
            title(&ev("agent_crashed", "x"), "prod"),
            "hive prod: ana crashed"
        );
        assert_eq!(
            title(&ev("budget", "x"), "prod"),
            "hive prod: a budget passed a threshold"
        );
    }

    #[test]
    fn json_is_the_documented_schema_signed_over_id_timestamp_body() {
        let o = render(
            &dest(Format::Json, Some(b"key")),
            &ev("question", "question #4: deploy?\nnow"),
            "prod",
            1_700_000_100,
        );
        let v: serde_json::Value = serde_json::from_slice(&o.body).unwrap();
        assert_eq!(v["type"], "question");
        assert_eq!(v["timestamp"], "2023-11-14T22:13:20Z");
        assert_eq!(v["data"]["id"], "evt_00ff");
        assert_eq!(v["data"]["agent"], "ana");
        assert_eq!(v["data"]["hive"], "prod");
        assert_eq!(v["data"]["message_id"], 12);
        assert_eq!(v["data"]["preview"], "question #4: deploy? now");
        assert!(v["data"].get("body").is_none(), "no body but a message's");
        let h = |n| o.headers.iter().find(|(k, _)| *k == n).unwrap().1.clone();
        assert_eq!(h("webhook-id"), "evt_00ff");
        assert_eq!(h("webhook-timestamp"), "1700000100");
        let mut signed = b"evt_00ff.1700000100.".to_vec();
        signed.extend_from_slice(&o.body);
        let want = format!(
            "v1,{}",
            super::super::sign::base64(&super::super::sign::hmac_sha256(b"key", &signed))
        );
        assert_eq!(h("webhook-signature"), want);
        let m = render(
            &dest(Format::Json, None),
            &ev("message_to_operator", "all\nof it"),
            "prod",
            1,
        );
        let v: serde_json::Value = serde_json::from_slice(&m.body).unwrap();
        assert_eq!(v["data"]["body"], "all\nof it");
        assert!(m.headers.iter().all(|(k, _)| *k != "webhook-signature"));
    }

    #[test]
    fn ntfy_headers_hold_one_clean_line_and_slack_text_is_escaped() {
        let mut e = ev("agent_crashed", &"x".repeat(500));
        e.agent = "evil\r\nX-Injected: 1".into();
        let o = render(&dest(Format::Ntfy, None), &e, "h\nive", 1);
        for (k, v) in &o.headers {
            assert!(!v.contains('\r') && !v.contains('\n'), "{k}: {v:?}");
        }
        let t = &o.headers.iter().find(|(k, _)| *k == "Title").unwrap().1;
        assert_eq!(t, "hive hive: evilX-Injected: 1 crashed");
        assert_eq!(o.headers[1], ("Priority", "high".to_string()));
        assert_eq!(o.headers[2], ("Tags", "hive,agent_crashed".to_string()));
        assert_eq!(
            String::from_utf8(o.body).unwrap().chars().count(),
            PREVIEW_CHARS + 1,
            "a preview and its ellipsis"
        );
        let s = render(
            &dest(Format::Slack, None),
            &ev("message_to_operator", "a <b> & <!channel>"),
            "prod",
            1,
        );
        let v: serde_json::Value = serde_json::from_slice(&s.body).unwrap();
        assert_eq!(
            v["text"],
            "*hive prod: message from ana*\na &lt;b&gt; &amp; &lt;!channel&gt;"
        );
    }
}
