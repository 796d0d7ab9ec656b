//! The JSON endpoints under `/api/`: each takes the harness handle
//! ([`Harness`]) and the request body and returns a [`Reply`]. Bodies are parsed by hand into the
//! fields each endpoint wants (a key given twice is refused), so a bad request
//! gets a message naming the field, and a rejected value is never echoed back
//! whole (a login token not at all).

use super::harness::{Ask, Harness};
use crate::http::{self, Reply};
use crate::proto::cmd::Wake;
use crate::proto::{ClientError, Command, SentReply};
use serde::Serialize;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// The longest model name `POST /api/model` considers.
const MAX_MODEL: usize = 100;

/// The JSON object a POST carries.
fn object(body: &[u8], example: &str) -> Result<Map<String, Value>, Reply> {
    match http::strict_json(body) {
        Ok(Value::Object(m)) => Ok(m),
        Err(e) if e.contains("appears twice") => Err(Reply::error(
            400,
            format!("{e}; send each field once, as in {example}"),
        )),
        _ => Err(Reply::error(
            400,
            format!("the body must be a JSON object like {example}"),
        )),
    }
}

/// A non-empty string field.
fn string_field(m: &Map<String, Value>, key: &str, example: &str) -> Result<String, Reply> {
    match m.get(key) {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.clone()),
        _ => Err(Reply::error(
            400,
            format!("field `{key}` must be a non-empty string, as in {example}"),
        )),
    }
}

pub fn state(h: &impl Harness) -> Reply {
    Reply::json(200, &h.state())
}

pub fn model(h: &impl Harness, body: &[u8]) -> Reply {
    const EX: &str = r#"{"model":"sonnet"} (or {"fleet":true} for the configured one)"#;
    let obj = match object(body, EX) {
        Ok(o) => o,
        Err(r) => return r,
    };
    // `/model --fleet`: back to the configured default.
    if obj.get("fleet") == Some(&serde_json::Value::Bool(true)) && obj.get("model").is_none() {
        return match h.clear_model() {
            Ok(model) => Reply::json(
                200,
                &json!({ "ok": true, "model": model, "override": false }),
            ),
            Err(e) => Reply::error(400, e),
        };
    }
    let name = match string_field(&obj, "model", EX) {
        Ok(n) => n,
        Err(r) => return r,
    };
    if name.len() > MAX_MODEL {
        return Reply::error(
            400,
            format!(
                "{} is not a model name: it is {} bytes long (at most {MAX_MODEL})",
                http::prefix(&name),
                name.len()
            ),
        );
    }
    match h.set_model(&name) {
        Ok(model) => Reply::json(
            200,
            &json!({ "ok": true, "model": model, "override": true }),
        ),
        Err(e) => Reply::error(400, e),
    }
}

pub fn new_session(h: &impl Harness) -> Reply {
    h.new_session();
    Reply::ok()
}

/// Queues a request for the turn loop; 503 when the loop is gone.
pub fn control(h: &impl Harness, ask: Ask, what: &str) -> Reply {
    if h.ask(ask) {
        Reply::json(200, &json!({ "ok": true, "queued": what }))
    } else {
        Reply::error(503, "the turn loop is not running")
    }
}

/// `POST /api/send {body}`: a message to this agent from `operator`.
pub fn send(h: &impl Harness, body: &[u8]) -> Reply {
    const EX: &str = r#"{"body":"hello"}"#;
    let text = match object(body, EX).and_then(|m| string_field(&m, "body", EX)) {
        Ok(t) => t,
        Err(r) => return r,
    };
    // The agent socket is the agent's own: the broker refuses the operator's
    // name there, since any script of the agent could use it.
    let wake = Wake {
        from: "web-ui".into(),
        body: text,
        transient: false,
        to: None,
        traceparent: None,
    };
    if let Err(e) = wake.validate() {
        return Reply::error(400, format!("field {e}"));
    }
    let broker = h.broker();
    let call = || -> Result<SentReply, ClientError> {
        let mut c = broker.connect()?;
        c.set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(|e| ClientError::Io(e.to_string()))?;
        c.call(&wake)
    };
    match call() {
        Ok(sent) => Reply::json(200, &json!({ "ok": true, "id": sent.id })),
        Err(ClientError::Refused(e)) => Reply::error(400, format!("the broker refused: {e}")),
        Err(e) => Reply::error(502, e.to_string()),
    }
}

pub fn turns(h: &impl Harness, query: &str) -> Reply {
    let limit = match crate::http::form_value(query, "limit") {
        None => 50,
        Some(v) => match v.parse::<u32>() {
            Ok(n) if (1..=1000).contains(&n) => n,
            _ => return Reply::error(400, "limit must be a whole number from 1 to 1000"),
        },
    };
    match h.recent_turns(limit) {
        Ok(rows) => Reply::json(200, &rows),
        Err(e) => Reply::error(500, e),
    }
}

/// One entry of `<state>/hyperhive-dashboard-links.json`.
#[derive(Debug, Serialize, PartialEq)]
pub struct Link {
    pub label: String,
    pub url: String,
    pub icon: String,
}

/// The well-formed http(s) links in the file's JSON; the rest are skipped.
pub fn parse_links(text: &str) -> Vec<Link> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) else {
        log::warn!("hyperhive-dashboard-links.json is not a JSON array; showing no links");
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|v| {
            let label = v.get("label")?.as_str()?.to_string();
            let url = v.get("url")?.as_str()?.to_string();
            let icon = v
                .get("icon")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            http::web_url(&url).then_some(Link { label, url, icon })
        })
        .collect()
}

pub fn dashboard_links(h: &impl Harness) -> Reply {
    let path = h.state_dir().join("hyperhive-dashboard-links.json");
    let links = std::fs::read_to_string(path)
        .map(|t| parse_links(&t))
        .unwrap_or_default();
    Reply::json(200, &links)
}

pub fn login_state(h: &impl Harness) -> Reply {
    let l = h.login_state();
    Reply::json(
        200,
        &json!({
            "needs_login": l.needs_login,
            "stored_token": l.stored_token,
            "credentials_available": l.credentials_available,
        }),
    )
}

/// `POST /api/login {token}`: checks it with one run of the agent's claude,
/// stores it for the next claude run and ends a login park: `{"ok":true,
/// "verified":true}`, or `"verified":false` with a `warning` when the check
/// could not tell (network, 5xx). A token Anthropic refused (401/403) is a
/// 400 with the reason and is not stored. The token is never logged or echoed.
pub fn login(h: &impl Harness, body: &[u8]) -> Reply {
    const EX: &str = r#"{"token":"sk-ant-…"}"#;
    let token = match object(body, EX).and_then(|m| string_field(&m, "token", EX)) {
        Ok(t) => t,
        Err(r) => return r,
    };
    match h.store_login(&token) {
        Ok(None) => Reply::json(200, &json!({"ok": true, "verified": true})),
        Ok(Some(w)) => Reply::json(200, &json!({"ok": true, "verified": false, "warning": w})),
        Err(e) => Reply::error(400, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_keep_only_http_urls_with_labels() {
        let text = r#"[
            {"label":"Stats","icon":"📊","url":"http://localhost:9001/stats"},
            {"label":"Pad","url":"https://pad"},
            {"label":"Evil","url":"javascript:alert(1)"},
            {"url":"http://nolabel"},
            7
        ]"#;
        let links = parse_links(text);
        assert_eq!(
            links.iter().map(|l| l.label.as_str()).collect::<Vec<_>>(),
            ["Stats", "Pad"]
        );
        assert_eq!(links[1].icon, "");
        assert!(parse_links("{}").is_empty());
    }

    #[test]
    fn bad_bodies_name_the_field_and_never_echo() {
        let Err(r) = object(b"not json", "{}") else {
            panic!("accepted")
        };
        assert_eq!(r.status, 400);
        let Ok(m) = object(br#"{"token": 12345}"#, "{}") else {
            panic!("refused")
        };
        let Err(r) = string_field(&m, "token", "{}") else {
            panic!("accepted")
        };
        let crate::http::Body::Bytes(b) = r.body else {
            panic!()
        };
        let text = String::from_utf8(b).unwrap();
        assert!(
            text.contains("`token`") && !text.contains("12345"),
            "{text}"
        );
    }
}
