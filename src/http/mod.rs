//! HTTP for both of hive's web servers — the agent page of `hive serve`
//! (`web`) and the operator dashboard of `hive up` (`fleet::dashboard`): the
//! shared core ([`server`]: bounded tiny_http, socket timeouts, named workers,
//! one dispatch that runs the [`guard`] before every route), the tokens and
//! login ([`auth`]) on top of the login sessions ([`session`]), the one live-stream writer ([`sse`]), the Prometheus text format both write ([`prometheus`]), and here the small
//! vocabulary on top of tiny_http: a [`Reply`] value every handler returns,
//! request bodies read under a size and a time bound, JSON bodies that refuse
//! duplicate keys, percent-decoding, query strings and cookies (pure
//! functions, tested here with literal input). Nothing here knows either
//! server's routes.

pub mod auth;
pub mod guard;
pub mod prometheus;
pub mod server;
pub mod session;
pub mod sse;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Serialize;
use serde_json::{Map, Value};
use std::fmt;
use std::fs::File;
use std::io::{Cursor, ErrorKind, Read};
use std::time::{Duration, Instant};
use tiny_http::{Header, Request, Response, StatusCode};

/// The largest request body any endpoint accepts.
pub const MAX_BODY: usize = 1 << 20;

/// How much of a rejected input an error message quotes.
pub const ECHO_CHARS: usize = 80;

/// What a handler answers.
pub enum Body {
    Bytes(Vec<u8>),
    File(File, usize),
}

pub struct Reply {
    pub status: u16,
    pub content_type: std::borrow::Cow<'static, str>,
    pub body: Body,
    pub headers: Vec<(&'static str, String)>,
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reply")
            .field("status", &self.status)
            .field("content_type", &self.content_type)
            .finish_non_exhaustive()
    }
}

impl Reply {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            content_type: content_type.into(),
            body: Body::Bytes(body.into()),
            headers: Vec::new(),
        }
    }

    pub fn json<T: Serialize + ?Sized>(status: u16, value: &T) -> Reply {
        let body = serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec());
        Reply::new(status, "application/json", body).header("Cache-Control", "no-store")
    }

    /// `{"error": msg}` with `status`.
    pub fn error(status: u16, msg: impl Into<String>) -> Reply {
        Reply::json(status, &serde_json::json!({ "error": msg.into() }))
    }

    pub fn ok() -> Reply {
        Reply::json(200, &serde_json::json!({ "ok": true }))
    }

    pub fn not_found() -> Reply {
        Reply::error(404, "no such path")
    }

    pub fn method_not_allowed(allowed: &[&str]) -> Reply {
        Reply::error(
            405,
            format!("method not allowed; use {}", allowed.join(" or ")),
        )
        .header("Allow", allowed.join(", "))
    }

    pub fn redirect(location: &str) -> Reply {
        Reply::new(303, "text/plain; charset=utf-8", "see other").header("Location", location)
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    pub fn into_response(self) -> Response<Box<dyn Read + Send>> {
        let mut headers = vec![
            header("Content-Type", &self.content_type),
            header("X-Content-Type-Options", "nosniff"),
        ];
        headers.extend(self.headers.iter().map(|(k, v)| header(k, v)));
        let (data, len): (Box<dyn Read + Send>, usize) = match self.body {
            Body::Bytes(b) => {
                let len = b.len();
                (Box::new(Cursor::new(b)), len)
            }
            Body::File(f, len) => (Box::new(f), len),
        };
        Response::new(StatusCode(self.status), headers, data, Some(len), None)
    }
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes())
        .unwrap_or_else(|_| Header::from_bytes("X-Invalid-Header", "1").expect("static header"))
}

/// A request header's value, by case-insensitive name.
pub fn header_value<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.headers()
        .iter()
        .find(|h| h.field.as_str().as_str().eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// Reads a request body of at most `max` bytes that must arrive by `deadline`:
/// `413` past the size, `408` past the time (each read waits at most until
/// the deadline: for a body still on the socket its read timeout is cut to
/// it, and put back after),
/// so a client that stalls its body holds its reader no longer than that. A
/// body refused here is left on the socket, which closes the connection
/// after the answer (see the vendored tiny_http's PATCHES.md).
pub fn read_body(req: &mut Request, max: usize, deadline: Instant) -> Result<Vec<u8>, Reply> {
    if req.body_length().is_some_and(|n| n > max) {
        return Err(too_large(max));
    }
    // Only a body still on the socket waits on the client; then the
    // connection's own thread waits for this read to end, so the timeout is
    // this read's alone.
    let socket = req
        .socket_fd()
        .filter(|_| req.body_pending())
        .and_then(|fd| Some((fd, crate::sys::fd::read_timeout(fd).ok()?)));
    let read = read_until(req, max, deadline, socket.map(|(fd, _)| fd));
    if let Some((fd, timeout)) = socket {
        let _ = crate::sys::fd::set_read_timeout(fd, timeout);
    }
    read
}

fn read_until(
    req: &mut Request,
    max: usize,
    deadline: Instant,
    socket: Option<std::os::fd::RawFd>,
) -> Result<Vec<u8>, Reply> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    let reader = req.as_reader();
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Err(body_timeout());
        };
        if let Some(fd) = socket {
            // Zero would mean no timeout at all.
            let _ = crate::sys::fd::set_read_timeout(fd, left.max(Duration::from_millis(1)));
        }
        match reader.read(&mut chunk) {
            Ok(0) => return Ok(buf),
            Ok(n) if buf.len() + n > max => return Err(too_large(max)),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(body_timeout())
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Reply::error(
                    400,
                    format!("cannot read the request body: {e}"),
                ))
            }
        }
    }
}

fn too_large(max: usize) -> Reply {
    Reply::error(413, format!("request body over {max} bytes"))
}

fn body_timeout() -> Reply {
    Reply::error(
        408,
        "the request body did not arrive in time; send it whole",
    )
}

/// At most [`ECHO_CHARS`] characters of `s`, marked when cut, for quoting a
/// rejected input in an error.
pub fn prefix(s: &str) -> String {
    match s.char_indices().nth(ECHO_CHARS) {
        None => s.to_string(),
        Some((i, _)) => format!("{}… ({} bytes)", &s[..i], s.len()),
    }
}

/// Most characters of an error of our own that quotes an input (serde's
/// `unknown field `x`, expected one of …`): enough for the list of valid
/// values whole, short enough that a hostile input is not echoed at length.
pub const ERROR_CHARS: usize = 400;

/// An error text of at most [`ERROR_CHARS`] characters, cut (when it must
/// be) after the last whole word, so a list of valid values is never cut
/// mid-word; marked when cut.
pub fn error_text(s: &str) -> String {
    let Some((end, _)) = s.char_indices().nth(ERROR_CHARS) else {
        return s.to_string();
    };
    let head = &s[..end];
    let cut = head
        .rfind(|c: char| c.is_whitespace())
        .filter(|&i| i > 0)
        .unwrap_or(end);
    format!("{}… ({} bytes)", head[..cut].trim_end(), s.len())
}

/// Parses a JSON body, refusing a key that appears twice in one object (which
/// serde_json would otherwise resolve silently, last one wins).
pub fn strict_json(body: &[u8]) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let v = StrictValue
        .deserialize(&mut de)
        .map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(v)
}

/// Builds a [`Value`] like serde_json does, failing on a duplicate key.
struct StrictValue;

impl<'de> DeserializeSeed<'de> for StrictValue {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for StrictValue {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
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
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(StrictValue)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(serde::de::Error::custom(format!(
                    "the key `{}` appears twice",
                    prefix(&key)
                )));
            }
            let v = map.next_value_seed(StrictValue)?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

/// Decodes `%XX` escapes (and `+` as space when `plus` is set); None when an
/// escape is malformed or the result is not UTF-8.
pub fn percent_decode(s: &str, plus: bool) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if plus => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// Encodes everything but unreserved characters, for cookie values.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || b"-_.~".contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

/// The decoded value of `key` in a query string or form body.
pub fn form_value(query: &str, key: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k, true)? == key)
            .then(|| percent_decode(v, true))
            .flatten()
    })
}

/// The value of cookie `name` in a `Cookie:` header.
pub fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.split(';').find_map(|c| {
        let (k, v) = c.trim().split_once('=')?;
        (k == name).then_some(v)
    })
}

/// The `Content-Security-Policy` of a page hive builds in (`html`, the
/// agent page or the dashboard): its own inline scripts run, by their
/// SHA-256, and no other script, inline or from anywhere (no
/// `'unsafe-inline'`); it fetches and connects to its own origin only, and
/// cannot be framed.
pub fn page_csp(html: &str) -> String {
    let mut scripts = String::new();
    let mut rest = html;
    while let Some(start) = rest.find("<script>") {
        let body = &rest[start + "<script>".len()..];
        let Some(end) = body.find("</script>") else {
            break;
        };
        let hash = crate::sys::hash::sha256(&body.as_bytes()[..end]);
        scripts.push_str(&format!(" 'sha256-{}'", base64(&hash)));
        rest = &body[end..];
    }
    format!(
        "default-src 'self'; script-src{}; style-src 'self' 'unsafe-inline'; \
         img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; \
         form-action 'self'; frame-ancestors 'none'",
        if scripts.is_empty() {
            " 'none'"
        } else {
            &scripts
        }
    )
}

/// Standard base64, with padding.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(ABC[(n >> shift) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// True for a URL a page may show as a link an agent supplied: `http://` or
/// `https://` (in any case) from its first character, and no control
/// character a browser would strip or read past. Anything else
/// (`javascript:`, `data:`, a leading space) is never an `href`.
pub fn web_url(url: &str) -> bool {
    let scheme = |s: &str| {
        url.get(..s.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(s))
    };
    (scheme("http://") || scheme("https://")) && !url.chars().any(|c| c.is_control())
}

/// Splits a request target into its path and query.
pub fn split_url(url: &str) -> (&str, &str) {
    url.split_once('?').unwrap_or((url, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_in_page_runs_its_own_scripts_by_hash_and_nothing_inline_else() {
        assert_eq!(base64(b"ab"), "YWI=");
        assert_eq!(base64(b"abc"), "YWJj");
        assert_eq!(base64(b"a"), "YQ==");
        let csp = page_csp("<p>x</p><script>alert(1)</script><script>b()</script>");
        let script = csp
            .split(';')
            .find(|d| d.trim().starts_with("script-src"))
            .unwrap();
        assert!(!script.contains("unsafe-inline"), "{csp}");
        let want = base64(&crate::sys::hash::sha256(b"alert(1)"));
        assert!(
            csp.contains(&format!("script-src 'sha256-{want}' 'sha256-")),
            "{csp}"
        );
        assert!(page_csp("<p>no script</p>").contains("script-src 'none'"));
    }

    #[test]
    fn percent_decoding() {
        let cases = [
            ("/a%20b", false, Some("/a b")),
            ("a+b", true, Some("a b")),
            ("a+b", false, Some("a+b")),
            ("%2e%2E", false, Some("..")),
            ("%zz", false, None),
            ("%4", false, None),
            ("%ff", false, None),
            ("%00", false, Some("\0")),
        ];
        for (input, plus, want) in cases {
            assert_eq!(percent_decode(input, plus).as_deref(), want, "{input}");
        }
    }

    #[test]
    fn encode_round_trips() {
        let s = "sk-ant; x=y/é";
        assert_eq!(percent_decode(&percent_encode(s), false).unwrap(), s);
    }

    #[test]
    fn duplicate_keys_are_refused_at_any_depth() {
        assert_eq!(
            strict_json(br#"{"a":1,"b":[{"c":true}],"d":null}"#).unwrap(),
            serde_json::json!({"a":1,"b":[{"c":true}],"d":null})
        );
        for bad in [
            &br#"{"body":"x","body":"y"}"#[..],
            br#"{"a":{"k":1,"k":2}}"#,
            br#"[{"k":1,"k":1}]"#,
        ] {
            let e = strict_json(bad).unwrap_err();
            assert!(e.contains("appears twice"), "{e}");
        }
        assert!(strict_json(b"{} x").is_err(), "trailing input");
        assert!(strict_json(b"1e999").is_err());
    }

    /// The newcomer's case: serde's list of the fields a body may have is
    /// shown whole; a long hostile key is cut, after a whole word.
    #[test]
    fn an_error_keeps_its_list_of_valid_values_whole() {
        let serde = "unknown field `name`, expected one of `agent`, `hive`, `usd`, `clear_usd`, `tokens`, `clear_tokens`, `per`";
        assert_eq!(error_text(serde), serde);
        let hostile = format!(
            "unknown field `{}`, expected one of `agent`",
            "k ".repeat(500)
        );
        let cut = error_text(&hostile);
        assert!(cut.chars().count() < ERROR_CHARS + 20, "{cut}");
        assert!(
            cut.ends_with(&format!("k… ({} bytes)", hostile.len())),
            "{cut}"
        );
        let one_word = "x".repeat(1000);
        assert!(error_text(&one_word).starts_with(&"x".repeat(ERROR_CHARS)));
    }

    #[test]
    fn echoes_are_short() {
        assert_eq!(prefix("sonnet"), "sonnet");
        let long = "é".repeat(1000);
        let p = prefix(&long);
        assert!(p.starts_with(&"é".repeat(ECHO_CHARS)), "{p}");
        assert!(p.ends_with("… (2000 bytes)"), "{p}");
    }

    #[test]
    fn only_http_urls_are_links() {
        for ok in [
            "http://stats.test:9001/",
            "https://pad",
            "HTTPS://X.example/a?b",
        ] {
            assert!(web_url(ok), "{ok}");
        }
        for bad in [
            "javascript:alert(1)",
            "JavaScript:fetch('/api/permissions')",
            "data:text/html,<script>alert(1)</script>",
            " http://x",
            "\u{1}javascript:alert(1)",
            "http://x\ny",
            "//evil.example",
            "/agent/x/open",
            "vbscript:x",
            "http:x",
            "",
        ] {
            assert!(!web_url(bad), "{bad:?}");
        }
    }

    #[test]
    fn forms_and_cookies() {
        assert_eq!(form_value("a=1&token=x%2By+z", "token").unwrap(), "x+y z");
        assert_eq!(form_value("a=1", "token"), None);
        assert_eq!(form_value("limit", "limit").unwrap(), "");
        assert_eq!(cookie("a=1; hive_token=abc", "hive_token"), Some("abc"));
        assert_eq!(cookie("xhive_token=abc", "hive_token"), None);
        assert_eq!(
            split_url("/events?last_event_id=3"),
            ("/events", "last_event_id=3")
        );
        assert_eq!(split_url("/"), ("/", ""));
    }
}
