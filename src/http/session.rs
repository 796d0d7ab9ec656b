//! A server's login sessions and how a request presents its token: the
//! session a browser's cookie holds (a random id and its HMAC-SHA-256 under
//! the server's token, [`new_session`], [`session_id`]), the `Set-Cookie`
//! that logs a browser in ([`cookie_header`]), what a request presents
//! (`Authorization: Bearer T`, `X-Hive-Token: T` or the cookie,
//! [`presented`]), and the constant-time comparison every check uses. Below
//! both the [`guard`](super::guard) (which checks them) and the login of
//! [`auth`](super::auth) (which makes them).

use crate::http::{cookie, header_value, percent_decode, percent_encode};
use std::io::Read;
use tiny_http::Request;

/// Equality whose time depends only on the lengths, not on where bytes differ.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// What a request presents: a token in a header, or the value of the
/// server's cookie (a session, or a token a client put there itself).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Presented {
    Header(String),
    Cookie(String),
}

/// What a request presents, from a header or the cookie `cookie_name`; a
/// header wins over the cookie.
pub fn presented(req: &Request, cookie_name: &str) -> Option<Presented> {
    if let Some(auth) = header_value(req, "Authorization") {
        if let Some(t) = auth.strip_prefix("Bearer ") {
            return Some(Presented::Header(t.trim().to_string()));
        }
    }
    if let Some(t) = header_value(req, "X-Hive-Token") {
        return Some(Presented::Header(t.trim().to_string()));
    }
    req.headers()
        .iter()
        .filter(|h| h.field.as_str().as_str().eq_ignore_ascii_case("Cookie"))
        .find_map(|h| cookie(h.value.as_str(), cookie_name))
        .and_then(|v| percent_decode(v, false))
        .map(Presented::Cookie)
}

/// The `Set-Cookie` value that logs a browser in to the server whose cookie is
/// `name`, with `session` (from [`new_session`]); `Secure` when the browser
/// reaches the server over https (behind a TLS reverse proxy), so it never
/// sends the cookie over plain HTTP.
pub fn cookie_header(name: &str, session: &str, secure: bool) -> String {
    format!(
        "{name}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age=31536000{}",
        percent_encode(session),
        if secure { "; Secure" } else { "" }
    )
}

/// Hex digits of a session id.
pub(super) const SESSION_ID_HEX: usize = 32;

/// A new login session of the server whose token is `token`: `ID.MAC`, a
/// random id and its HMAC-SHA-256 under the token, both as hex.
pub fn new_session(token: &str) -> Result<String, String> {
    let id = &random_hex()?[..SESSION_ID_HEX];
    Ok(format!("{id}.{}", session_mac(token, id)))
}

fn session_mac(token: &str, id: &str) -> String {
    let mac =
        crate::sys::hash::hmac_sha256(token.as_bytes(), format!("hive-session {id}").as_bytes());
    crate::sys::hash::hex(&mac)
}

/// The id of the session `value` holds, when it is one of `token`'s.
pub fn session_id<'a>(value: &'a str, token: &str) -> Option<&'a str> {
    let (id, mac) = value.split_once('.')?;
    let well_formed = id.len() == SESSION_ID_HEX && id.bytes().all(|b| b.is_ascii_hexdigit());
    (well_formed && ct_eq(mac.as_bytes(), session_mac(token, id).as_bytes())).then_some(id)
}

/// 32 random bytes from the kernel, as 64 hex digits.
pub fn random_hex() -> Result<String, String> {
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| format!("cannot read /dev/urandom for a token: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}
