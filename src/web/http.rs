//! The small HTTP vocabulary the web UI needs on top of tiny_http: a [`Reply`]
//! value every handler returns, percent-decoding, query strings, cookies and
//! bounded request bodies. Pure functions, tested here with literal input.

use serde::Serialize;
use std::fs::File;
use std::io::{Cursor, Read};
use tiny_http::{Header, Request, Response, StatusCode};

/// The largest request body any endpoint accepts.
pub const MAX_BODY: usize = 1 << 20;

/// What a handler answers.
pub enum Body {
    Bytes(Vec<u8>),
    File(File, usize),
}

pub struct Reply {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Body,
    pub headers: Vec<(&'static str, String)>,
}

impl Reply {
    pub fn new(status: u16, content_type: &'static str, body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status,
            content_type,
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
            header("Content-Type", self.content_type),
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

/// Reads the body, refusing more than [`MAX_BODY`] bytes.
/// The body of a POST (bounded), or nothing for any other method.
pub fn post_body(req: &mut Request, method: &str) -> Result<Vec<u8>, Reply> {
    if method == "POST" {
        read_body(req)
    } else {
        Ok(Vec::new())
    }
}

pub fn read_body(req: &mut Request) -> Result<Vec<u8>, Reply> {
    let mut buf = Vec::new();
    req.as_reader()
        .take(MAX_BODY as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Reply::error(400, format!("cannot read the request body: {e}")))?;
    if buf.len() > MAX_BODY {
        return Err(Reply::error(
            413,
            format!("request body over {MAX_BODY} bytes"),
        ));
    }
    Ok(buf)
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

/// Splits a request target into its path and query.
pub fn split_url(url: &str) -> (&str, &str) {
    url.split_once('?').unwrap_or((url, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

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
