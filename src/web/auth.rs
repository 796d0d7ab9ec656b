//! The web token guard: when `HIVE_WEB_TOKEN` is set every endpoint but the
//! login page wants it, as `Authorization: Bearer T`, `X-Hive-Token: T` or the
//! `hive_token` cookie the login page sets (so `EventSource`, which cannot send
//! headers, works). Comparison is constant-time in the token's content.

use super::http::{cookie, form_value, header_value, percent_decode, percent_encode, Reply};
use tiny_http::Request;

pub const COOKIE: &str = "hive_token";

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

/// The token a request presents, from header or cookie.
fn presented(req: &Request) -> Option<String> {
    if let Some(auth) = header_value(req, "Authorization") {
        if let Some(t) = auth.strip_prefix("Bearer ") {
            return Some(t.trim().to_string());
        }
    }
    if let Some(t) = header_value(req, "X-Hive-Token") {
        return Some(t.trim().to_string());
    }
    let c = header_value(req, "Cookie")?;
    percent_decode(cookie(c, COOKIE)?, false)
}

/// Does `req` carry the token (always true when no token is configured)?
pub fn authorized(token: Option<&str>, req: &Request) -> bool {
    match token {
        None => true,
        Some(want) => presented(req).is_some_and(|got| ct_eq(got.as_bytes(), want.as_bytes())),
    }
}

/// The answer to a request without the token: browsers asking for a page go to
/// the login page, everything else gets a 401 that says what to send.
pub fn refuse(req: &Request, path: &str) -> Reply {
    let wants_html = header_value(req, "Accept").is_some_and(|a| a.contains("text/html"));
    if wants_html && req.method().as_str() == "GET" && !path.starts_with("/api/") {
        return Reply::redirect("/login");
    }
    Reply::error(
        401,
        "this agent's web UI wants its token: send `Authorization: Bearer <HIVE_WEB_TOKEN>` \
         or `X-Hive-Token`, or log in at /login",
    )
    .header("WWW-Authenticate", "Bearer")
}

/// `GET /login` and `POST /login` (form field `token`).
pub fn login(token: Option<&str>, method: &str, body: &[u8]) -> Reply {
    let Some(want) = token else {
        return Reply::redirect("/");
    };
    if method == "GET" {
        return Reply::new(200, "text/html; charset=utf-8", login_page(""));
    }
    let form = String::from_utf8_lossy(body);
    let got = form_value(&form, "token").unwrap_or_default();
    if !ct_eq(got.trim().as_bytes(), want.as_bytes()) {
        return Reply::new(401, "text/html; charset=utf-8", login_page("Wrong token."));
    }
    Reply::redirect("/").header(
        "Set-Cookie",
        format!(
            "{COOKIE}={}; Path=/; HttpOnly; SameSite=Strict; Max-Age=31536000",
            percent_encode(want)
        ),
    )
}

fn login_page(message: &str) -> String {
    format!(
        r#"<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>hive · log in</title>
<style>
body{{font:16px/1.4 system-ui,sans-serif;background:#f6f7f9;color:#1d232b;margin:0;display:flex;
min-height:100vh;align-items:center;justify-content:center}}
form{{background:#fff;padding:24px;border-radius:12px;box-shadow:0 1px 4px #0002;width:min(340px,90vw)}}
input{{width:100%;box-sizing:border-box;font:inherit;padding:10px;margin:12px 0;border:1px solid #c6ccd4;
border-radius:8px}}
button{{font:inherit;padding:10px 16px;border:0;border-radius:8px;background:#2f6fde;color:#fff;width:100%}}
p.err{{color:#b3261e;margin:0}}
</style></head><body>
<form method="post" action="/login">
<h1 style="font-size:20px;margin:0 0 8px">hive web UI</h1>
<p style="margin:0;color:#5b6673">This page needs the agent's web token (<code>HIVE_WEB_TOKEN</code>).</p>
<input type="password" name="token" autocomplete="current-password" placeholder="token" autofocus>
<p class="err">{message}</p>
<button type="submit">Log in</button>
</form></body></html>"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_equality() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"secret", b"secret2"));
        assert!(!ct_eq(b"", b"x"));
        assert!(ct_eq(b"", b""));
        // Lengths that differ by a multiple of 256 still differ.
        assert!(!ct_eq(&[0; 256], b""));
    }

    #[test]
    fn login_sets_the_cookie_only_for_the_right_token() {
        let ok = login(Some("t0k;en"), "POST", b"token=t0k%3Ben");
        assert_eq!(ok.status, 303);
        let cookie = &ok.headers.iter().find(|h| h.0 == "Set-Cookie").unwrap().1;
        assert!(cookie.starts_with("hive_token=t0k%3Ben;"), "{cookie}");
        assert!(cookie.contains("HttpOnly"));
        let bad = login(Some("t0k;en"), "POST", b"token=nope");
        assert_eq!(bad.status, 401);
        assert!(bad.headers.is_empty());
        assert_eq!(login(None, "GET", b"").status, 303);
    }
}
