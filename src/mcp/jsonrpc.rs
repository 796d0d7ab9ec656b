//! JSON-RPC 2.0 as MCP's stdio transport uses it: one JSON object per line. This
//! module owns the closed [`Message`] enum (request, notification, response), the
//! request id, the error codes, and the framing: [`Message::read`] turns one input
//! line into a message or into the error response that line deserves, and
//! [`Message::line`] puts one message on one line ([`Message::write`] also
//! flushes it). It knows nothing
//! about MCP methods; `server.rs` gives them meaning.

use crate::proto::lines::{self as wire, Line};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fmt;
use std::io::{self, BufRead, Write};

/// Longest input line accepted, newline excluded. Longer lines are consumed and
/// answered with a parse error; the connection keeps going.
pub const MAX_LINE: usize = 4 * 1024 * 1024;

/// The line is not JSON (or not UTF-8, or too long).
pub const PARSE_ERROR: i32 = -32700;
/// The JSON is not a valid JSON-RPC 2.0 message.
pub const INVALID_REQUEST: i32 = -32600;
/// No such method.
pub const METHOD_NOT_FOUND: i32 = -32601;
/// The method exists but its params are wrong.
pub const INVALID_PARAMS: i32 = -32602;
/// The server failed for a reason that is not the client's fault.
pub const INTERNAL_ERROR: i32 = -32603;

/// One JSON-RPC message, in either direction.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Message {
    Request(Request),
    Notification(Notification),
    Response(Response),
}

impl From<Request> for Message {
    fn from(request: Request) -> Message {
        Message::Request(request)
    }
}

impl From<Notification> for Message {
    fn from(notification: Notification) -> Message {
        Message::Notification(notification)
    }
}

impl From<Response> for Message {
    fn from(response: Response) -> Message {
        Message::Response(response)
    }
}

/// A request id: MCP allows a string or an integer, never null.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RequestId(IdRepr);

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(untagged)]
enum IdRepr {
    Int(i64),
    Str(String),
}

impl RequestId {
    /// Reads an id from JSON; `None` for null, floats, out-of-range integers and
    /// every other type.
    pub fn from_value(value: &Value) -> Option<RequestId> {
        match value {
            Value::Number(n) => n.as_i64().map(|i| RequestId(IdRepr::Int(i))),
            Value::String(s) => Some(RequestId(IdRepr::Str(s.clone()))),
            _ => None,
        }
    }
}

impl From<i64> for RequestId {
    fn from(id: i64) -> RequestId {
        RequestId(IdRepr::Int(id))
    }
}

impl From<String> for RequestId {
    fn from(id: String) -> RequestId {
        RequestId(IdRepr::Str(id))
    }
}

impl From<&str> for RequestId {
    fn from(id: &str) -> RequestId {
        RequestId(IdRepr::Str(id.to_string()))
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            IdRepr::Int(i) => write!(f, "{i}"),
            IdRepr::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// A call that expects an answer carrying the same id.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Request {
    pub id: RequestId,
    pub method: String,
    /// `Value::Null` when the message had no params.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub params: Value,
}

/// A message that is never answered.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Notification {
    pub method: String,
    /// `Value::Null` when the message had no params.
    #[serde(skip_serializing_if = "Value::is_null")]
    pub params: Value,
}

/// The answer to a request: exactly one of `result` and `error` is set. `id` is
/// `None` (written as `null`) only when the request's id could not be read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Response {
    pub id: Option<RequestId>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ResponseError>,
}

/// The `error` member of a failed response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponseError {
    pub code: i32,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl Response {
    /// A successful answer.
    pub fn ok(id: RequestId, result: Value) -> Response {
        Response {
            id: Some(id),
            result: Some(result),
            error: None,
        }
    }

    /// A failed answer with one of the error codes of this module.
    pub fn err(id: Option<RequestId>, code: i32, message: impl Into<String>) -> Response {
        Response {
            id,
            result: None,
            error: Some(ResponseError {
                code,
                message: message.into(),
                data: None,
            }),
        }
    }
}

/// Puts `"jsonrpc":"2.0"` first on every line written.
#[derive(Serialize)]
struct JsonRpc<'a> {
    jsonrpc: &'static str,
    #[serde(flatten)]
    msg: &'a Message,
}

impl Message {
    /// Reads the next message. `Ok(None)` is a clean end of input; `Ok(Some(Err(r)))`
    /// is a line that is not a valid message, with the error response `r` it should
    /// get; blank lines are skipped. Only a failing reader gives `Err`.
    pub fn read(r: &mut dyn BufRead) -> io::Result<Option<Result<Message, Response>>> {
        loop {
            let text = match wire::read_line(r, MAX_LINE)? {
                Line::Eof => return Ok(None),
                Line::TooLong => {
                    let msg = format!("Parse error: line longer than {MAX_LINE} bytes");
                    return Ok(Some(Err(Response::err(None, PARSE_ERROR, msg))));
                }
                Line::NotUtf8 => {
                    let msg = "Parse error: line is not valid UTF-8";
                    return Ok(Some(Err(Response::err(None, PARSE_ERROR, msg))));
                }
                Line::Text(text) => text,
            };
            if !text.trim().is_empty() {
                return Ok(Some(Message::parse(&text)));
            }
        }
    }

    /// Parses one line, or returns the error response it deserves.
    pub fn parse(line: &str) -> Result<Message, Response> {
        match Message::parse_plain(line) {
            Some(msg) => Ok(msg),
            None => Message::parse_any(line),
        }
    }

    /// The shape nearly every line has, read straight into its parts: a
    /// request or a notification, `"jsonrpc":"2.0"` spelled plainly, an id
    /// that is an integer or a string, params that are absent, null, an
    /// object or an array, no key twice. `None` for every other line, which
    /// [`Message::parse_any`] reads (and gives its error, if it deserves
    /// one); where this gives a message, it is the one `parse_any` gives.
    fn parse_plain(line: &str) -> Option<Message> {
        // A struct also reads from a JSON array: only objects come here.
        if !line.trim_start().starts_with('{') {
            return None;
        }
        let plain: Plain = serde_json::from_str(line).ok()?;
        if plain.jsonrpc != "2.0"
            || !matches!(
                plain.params,
                Value::Null | Value::Object(_) | Value::Array(_)
            )
        {
            return None;
        }
        let (method, params) = (plain.method, plain.params);
        Some(match plain.id {
            PlainId::Absent => Notification { method, params }.into(),
            PlainId::Id(id) => Request { id, method, params }.into(),
        })
    }

    /// Parses any line as a JSON value first, then as a message.
    fn parse_any(line: &str) -> Result<Message, Response> {
        let value: Value = serde_json::from_str(line)
            .map_err(|e| Response::err(None, PARSE_ERROR, format!("Parse error: {e}")))?;
        let Value::Object(mut obj) = value else {
            return Err(invalid(
                None,
                "a message must be a JSON object (batches are not supported)",
            ));
        };
        let id = match obj.remove("id") {
            None => None,
            Some(v) => match RequestId::from_value(&v) {
                Some(id) => Some(id),
                None => return Err(invalid(None, "\"id\" must be a string or an integer")),
            },
        };
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(invalid(id, "\"jsonrpc\" must be \"2.0\""));
        }
        match obj.remove("method") {
            Some(Value::String(method)) => {
                let params = match obj.remove("params") {
                    None | Some(Value::Null) => Value::Null,
                    Some(p @ (Value::Object(_) | Value::Array(_))) => p,
                    Some(_) => return Err(invalid(id, "\"params\" must be an object or an array")),
                };
                Ok(match id {
                    Some(id) => Request { id, method, params }.into(),
                    None => Notification { method, params }.into(),
                })
            }
            Some(_) => Err(invalid(id, "\"method\" must be a string")),
            None => match id {
                Some(id) if obj.contains_key("result") || obj.contains_key("error") => {
                    Ok(parse_response(id, obj).into())
                }
                _ => Err(invalid(id, "missing \"method\"")),
            },
        }
    }

    /// The message as one line, its newline included.
    pub fn line(&self) -> io::Result<Vec<u8>> {
        let mut line = serde_json::to_vec(&JsonRpc {
            jsonrpc: "2.0",
            msg: self,
        })?;
        line.push(b'\n');
        Ok(line)
    }

    /// Writes the message as one line and flushes.
    pub fn write(&self, w: &mut dyn Write) -> io::Result<()> {
        w.write_all(&self.line()?)?;
        w.flush()
    }
}

/// A request or a notification as [`Message::parse_plain`] reads it: a
/// repeated key, an escaped `jsonrpc` (it is borrowed) or a missing `method`
/// fails to deserialize; unknown keys are ignored, as `parse_any` ignores them.
#[derive(Deserialize)]
struct Plain<'a> {
    jsonrpc: &'a str,
    #[serde(default)]
    id: PlainId,
    method: String,
    #[serde(default)]
    params: Value,
}

/// `id` as `parse_any` takes it: an integer that fits an `i64` or a string;
/// `null` and every other type fail to deserialize.
#[derive(Default)]
enum PlainId {
    #[default]
    Absent,
    Id(RequestId),
}

impl<'de> Deserialize<'de> for PlainId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PlainId, D::Error> {
        struct IdVisitor;
        impl serde::de::Visitor<'_> for IdVisitor {
            type Value = PlainId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an integer")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<PlainId, E> {
                Ok(PlainId::Id(v.into()))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<PlainId, E> {
                let v = i64::try_from(v).map_err(|_| E::custom("id out of range"))?;
                Ok(PlainId::Id(v.into()))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<PlainId, E> {
                Ok(PlainId::Id(v.into()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<PlainId, E> {
                Ok(PlainId::Id(v.into()))
            }
        }
        d.deserialize_any(IdVisitor)
    }
}

fn invalid(id: Option<RequestId>, detail: &str) -> Response {
    Response::err(id, INVALID_REQUEST, format!("Invalid Request: {detail}"))
}

/// A response from the peer is never answered, so a malformed `error` member is
/// kept as text instead of being rejected.
fn parse_response(id: RequestId, mut obj: Map<String, Value>) -> Response {
    let error = obj.remove("error").map(|e| {
        serde_json::from_value(e.clone()).unwrap_or(ResponseError {
            code: INTERNAL_ERROR,
            message: format!("malformed error object: {e}"),
            data: None,
        })
    });
    Response {
        id: Some(id),
        result: if error.is_some() {
            None
        } else {
            obj.remove("result")
        },
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn line(msg: impl Into<Message>) -> String {
        let mut out = Vec::new();
        msg.into().write(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn valid_lines_become_messages() {
        let cases: Vec<(&str, Message)> = vec![
            (
                r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"a":1}}"#,
                Request {
                    id: 0.into(),
                    method: "initialize".into(),
                    params: json!({"a":1}),
                }
                .into(),
            ),
            (
                r#"{"jsonrpc":"2.0","id":"x-1","method":"ping"}"#,
                Request {
                    id: "x-1".into(),
                    method: "ping".into(),
                    params: Value::Null,
                }
                .into(),
            ),
            (
                r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
                Notification {
                    method: "notifications/initialized".into(),
                    params: Value::Null,
                }
                .into(),
            ),
            (
                r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
                Response::ok(7.into(), json!({})).into(),
            ),
            (
                r#"{"jsonrpc":"2.0","id":8,"error":{"code":-32601,"message":"no"}}"#,
                Response::err(Some(8.into()), METHOD_NOT_FOUND, "no").into(),
            ),
        ];
        for (text, want) in cases {
            assert_eq!(Message::parse(text), Ok(want), "{text}");
        }
    }

    /// Every line the plain way reads, it reads as the general way does; it
    /// reads claude's start-up messages and calls; it leaves every odd line
    /// (responses, repeated keys, wrong types, escapes it would have to
    /// decode) to the general way.
    #[test]
    fn the_plain_way_reads_every_line_as_the_general_way_does() {
        let plain = [
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{"roots":{},"elicitation":{}},"clientInfo":{"name":"claude-code","version":"2.1.197"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#,
            r#"{"method":"tools/call","params":{"name":"send","arguments":{"to":"a","body":"x\ny \u00e9"}},"jsonrpc":"2.0","id":2}"#,
            r#" {"jsonrpc":"2.0","id":"s-\"1","method":"ping","params":null}"#,
            r#"{"jsonrpc":"2.0","id":-9223372036854775808,"method":"a\u002fb","params":[1,2]}"#,
            r#"{"jsonrpc":"2.0","id":9223372036854775807,"method":"x","extra":{"y":[1]}}"#,
            r#"{"jsonrpc":"2.0","id":3,"method":"m","result":{},"error":7}"#,
            r#"{"jsonrpc":"2.0","id":4,"method":"m","params":{"k":1,"k":2}}"#,
        ];
        let odd = [
            r#"{"jsonrpc":"2.0","id":7,"result":{}}"#,
            r#"{"jsonrpc":"2.0","id":8,"error":{"code":-32601,"message":"no"}}"#,
            r#"{"jsonrpc":"2\u002e0","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","method":"a","method":"b"}"#,
            r#"{"jsonrpc":"2.0","jsonrpc":"2.0","method":"a"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":1,"params":{}}"#,
            r#"{"jsonrpc":"2.0","id":9223372036854775808,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1e3,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1.0,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":true,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":null}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":["x"]}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":"p"}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x","params":false}"#,
            r#"{"jsonrpc":"1.0","id":1,"method":"x"}"#,
            r#"{"jsonrpc":2.0,"id":1,"method":"x"}"#,
            r#"{"id":1,"method":"x"}"#,
            r#"["2.0",1,"x",{}]"#,
            r#"[{"jsonrpc":"2.0","id":1,"method":"x"}]"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x"} {}"#,
            r#"{"jsonrpc":"2.0","id":1,"method":"x""#,
            "\u{a0}{\"jsonrpc\":\"2.0\",\"method\":\"x\"}",
            "",
            "null",
        ];
        for line in plain {
            let got = Message::parse_plain(line);
            assert!(got.is_some(), "the plain way should read {line}");
            assert_eq!(got.map(Ok), Some(Message::parse_any(line)), "{line}");
        }
        for line in odd {
            assert_eq!(Message::parse_plain(line), None, "{line}");
            assert_eq!(Message::parse(line), Message::parse_any(line), "{line}");
        }
    }

    #[test]
    fn invalid_lines_get_the_exact_error_response() {
        let cases = [
            (
                "{nope",
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: key must be a string at line 1 column 2"}}"#,
            ),
            (
                "[1,2]",
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: a message must be a JSON object (batches are not supported)"}}"#,
            ),
            (
                r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#,
                r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32600,"message":"Invalid Request: \"jsonrpc\" must be \"2.0\""}}"#,
            ),
            (
                r#"{"id":"a","method":"ping"}"#,
                r#"{"jsonrpc":"2.0","id":"a","error":{"code":-32600,"message":"Invalid Request: \"jsonrpc\" must be \"2.0\""}}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: \"id\" must be a string or an integer"}}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: \"id\" must be a string or an integer"}}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#,
                r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: \"id\" must be a string or an integer"}}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":4}"#,
                r#"{"jsonrpc":"2.0","id":4,"error":{"code":-32600,"message":"Invalid Request: missing \"method\""}}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":5,"method":7}"#,
                r#"{"jsonrpc":"2.0","id":5,"error":{"code":-32600,"message":"Invalid Request: \"method\" must be a string"}}"#,
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"ping","params":"x"}"#,
                r#"{"jsonrpc":"2.0","id":6,"error":{"code":-32600,"message":"Invalid Request: \"params\" must be an object or an array"}}"#,
            ),
        ];
        for (text, want) in cases {
            let err = Message::parse(text).unwrap_err();
            assert_eq!(line(err), format!("{want}\n"), "{text}");
        }
    }

    #[test]
    fn written_lines_start_with_jsonrpc_and_round_trip() {
        let msgs: Vec<Message> = vec![
            Response::ok(1.into(), json!({"tools":[]})).into(),
            Response::err(Some("s".into()), INVALID_PARAMS, "bad").into(),
            Notification {
                method: "notifications/tools/list_changed".into(),
                params: Value::Null,
            }
            .into(),
        ];
        for msg in msgs {
            let text = line(msg.clone());
            assert!(text.starts_with(r#"{"jsonrpc":"2.0","#), "{text}");
            assert!(text.ends_with('\n') && !text[..text.len() - 1].contains('\n'));
            assert_eq!(Message::parse(text.trim_end()), Ok(msg));
        }
    }

    #[test]
    fn read_skips_blank_lines_and_survives_bad_ones() {
        let mut input: &[u8] = b"\n  \n\xff\n{\"jsonrpc\":\"2.0\",\"method\":\"x\"}\r\n";
        let r: &mut dyn BufRead = &mut input;
        let err = Message::read(r).unwrap().unwrap().unwrap_err();
        assert_eq!(err.error.unwrap().code, PARSE_ERROR);
        let msg = Message::read(r).unwrap().unwrap().unwrap();
        assert!(matches!(msg, Message::Notification(n) if n.method == "x"));
        assert!(Message::read(r).unwrap().is_none());
    }

    #[test]
    fn read_rejects_an_oversize_line_and_keeps_going() {
        let mut input = vec![b'x'; MAX_LINE + 1];
        input.extend_from_slice(b"\n{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}\n");
        let mut input: &[u8] = &input;
        let r: &mut dyn BufRead = &mut input;
        let err = Message::read(r).unwrap().unwrap().unwrap_err();
        assert_eq!(
            line(err),
            format!(
                "{{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{{\"code\":-32700,\"message\":\"Parse error: line longer than {MAX_LINE} bytes\"}}}}\n"
            )
        );
        let msg = Message::read(r).unwrap().unwrap().unwrap();
        assert!(matches!(msg, Message::Request(r) if r.method == "ping"));
    }
}
