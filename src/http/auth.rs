//! Tokens of the web servers: where a server's token comes from (the operator's
//! variable, else a random one generated at first start into a 0600 file), how
//! a request presents it (`Authorization: Bearer T`, `X-Hive-Token: T` or the
//! server's own `HttpOnly; SameSite=Strict` cookie, `Secure` too behind a TLS
//! proxy, which lets `EventSource` in), the login page that sets that cookie, and the dashboard's one-time
//! login links. The cookie holds a login session, not the token: a random id
//! and its HMAC-SHA-256 under the token, so each login is a client of its own
//! for the per-client limits (behind a proxy every client has one address),
//! any server that knows the token can check (and the dashboard mint) one,
//! and a new token ends every session. Cookies are per host, not per port, so
//! each server's cookie carries its port in its name. Comparisons are
//! constant-time.

use super::guard::Guard;
pub use super::session::{
    cookie_header, ct_eq, new_session, presented, random_hex, session_id, Presented,
};
use crate::http::{form_value, Reply};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The file an agent's page keeps its generated token in, under the agent's
/// state dir (the dashboard reads it to open the page).
pub const PAGE_TOKEN_FILE: &str = "web-token";

/// The token stored at `path`, or a new random one written there (mode 0600,
/// whatever the umask). An existing file is made 0600 too.
pub fn load_or_create(path: &Path) -> Result<String, String> {
    let shown = path.display();
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let token = text.trim().to_string();
            if token.is_empty() {
                return Err(format!(
                    "{shown} is empty; delete it and a new token is generated at the next start"
                ));
            }
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("cannot make {shown} private (0600): {e}"))?;
            return Ok(token);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read the token file {shown}: {e}")),
    }
    let token = random_hex()?;
    let mut f = match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(f) => f,
        // Another process wrote it first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return load_or_create(path),
        Err(e) => return Err(format!("cannot create the token file {shown}: {e}")),
    };
    f.set_permissions(std::fs::Permissions::from_mode(0o600))
        .and_then(|()| f.write_all(format!("{token}\n").as_bytes()))
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("cannot write the token file {shown}: {e}"))?;
    Ok(token)
}

/// Single-use login codes that expire: `hive up` prints one in a link, so the
/// token itself never appears in a URL.
pub struct OneTimeCodes {
    ttl: Duration,
    codes: Mutex<Vec<(String, Instant)>>,
}

impl OneTimeCodes {
    pub fn new(ttl: Duration) -> OneTimeCodes {
        OneTimeCodes {
            ttl,
            codes: Mutex::new(Vec::new()),
        }
    }

    /// A new code, valid once until the time-to-live passes.
    pub fn issue(&self) -> Result<String, String> {
        let code = random_hex()?;
        let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        codes.retain(|(_, until)| *until > now);
        codes.push((code.clone(), now + self.ttl));
        Ok(code)
    }

    /// True (once) for a live code; the code is then used up.
    pub fn redeem(&self, code: &str) -> bool {
        let mut codes = self.codes.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        codes.retain(|(_, until)| *until > now);
        match codes
            .iter()
            .position(|(c, _)| ct_eq(c.as_bytes(), code.as_bytes()))
        {
            Some(i) => {
                codes.remove(i);
                true
            }
            None => false,
        }
    }
}

/// Where a login returns to: `next` when it is a path of this origin (`/…`,
/// not `//host` nor `/\host`, no control character), else `/`.
pub fn next_path(next: Option<&str>) -> String {
    match next.map(str::trim) {
        Some(p)
            if p.starts_with('/')
                && !p.starts_with("//")
                && !p.starts_with("/\\")
                && !p.contains('\\')
                && !p.chars().any(char::is_control)
                && p.len() <= 2048 =>
        {
            p.to_string()
        }
        _ => "/".into(),
    }
}

/// `GET /login` (the form; with `?code=` a one-time link when `codes` is given)
/// and `POST /login` (form field `token`). Both set the server's cookie and go
/// to `next` (the query's, or the form's: [`next_path`]) on success.
pub fn login(
    guard: &Guard,
    codes: Option<&OneTimeCodes>,
    post: bool,
    query: &str,
    body: &[u8],
) -> Reply {
    let form = String::from_utf8_lossy(body);
    let next = next_path(
        if post {
            form_value(&form, "next")
        } else {
            form_value(query, "next")
        }
        .as_deref(),
    );
    let Some(want) = guard.token() else {
        return Reply::redirect(&next);
    };
    let logged_in = || match new_session(want) {
        Ok(session) => {
            let cookie = cookie_header(guard.cookie(), &session, guard.secure_cookie());
            Reply::redirect(&next).header("Set-Cookie", cookie)
        }
        Err(e) => Reply::error(500, e),
    };
    let page = |status: u16, message: &str| {
        let html = login_page(guard, message, &next);
        let csp = crate::http::page_csp(&html);
        Reply::new(status, "text/html; charset=utf-8", html)
            .header("Cache-Control", "no-store")
            .header("Content-Security-Policy", csp)
    };
    if !post {
        return match (form_value(query, "code"), codes) {
            (Some(code), Some(codes)) if codes.redeem(code.trim()) => logged_in(),
            (Some(_), _) => page(
                401,
                "That login link was used already or has expired. Log in with the token.",
            ),
            (None, _) => page(200, ""),
        };
    }
    let got = form_value(&form, "token").unwrap_or_default();
    if !ct_eq(got.trim().as_bytes(), want.as_bytes()) {
        return page(401, "Wrong token.");
    }
    logged_in()
}

fn login_page(guard: &Guard, message: &str, next: &str) -> String {
    let next = next
        .replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;");
    let names = guard.names();
    let what = names.what;
    let hint = names.token_hint;
    let message = message.replace('<', "&lt;");
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
<form method="post" action="/login"><input type="hidden" name="next" value="{next}">
<h1 style="font-size:20px;margin:0 0 8px">hive · log in</h1>
<p style="margin:0;color:#5b6673">Log in to {what} with its token ({hint}).</p>
<input type="password" name="token" autocomplete="current-password" placeholder="token" autofocus>
<p class="err">{message}</p>
<button type="submit">Log in</button>
</form></body></html>"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::guard::Names;

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

    fn guard(token: Option<&str>) -> Guard {
        let names = Names {
            what: "the test page",
            token_hint: "T",
            hosts_var: "H",
        };
        let bind = std::net::IpAddr::from([127, 0, 0, 1]);
        Guard::new(names, bind, 1, &[], token.map(str::to_string), "c_1".into())
    }

    #[test]
    fn login_sets_the_cookie_only_for_the_right_token() {
        let g = guard(Some("t0k;en"));
        let ok = login(&g, None, true, "", b"token=t0k%3Ben");
        assert_eq!(ok.status, 303);
        let cookie = &ok.headers.iter().find(|h| h.0 == "Set-Cookie").unwrap().1;
        let value = cookie
            .strip_prefix("c_1=")
            .unwrap()
            .split(';')
            .next()
            .unwrap();
        assert!(session_id(value, "t0k;en").is_some(), "{cookie}");
        assert!(
            !cookie.contains("t0k"),
            "the token is not in the cookie: {cookie}"
        );
        assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
        let bad = login(&g, None, true, "", b"token=nope");
        assert_eq!(bad.status, 401);
        assert!(bad.headers.iter().all(|h| h.0 != "Set-Cookie"));
        assert_eq!(login(&guard(None), None, false, "", b"").status, 303);
    }

    #[test]
    fn the_cookie_is_secure_only_behind_tls() {
        let set_cookie = |g: &Guard| {
            let r = login(g, None, true, "", b"token=tok");
            assert_eq!(r.status, 303);
            let c = r.headers.iter().find(|h| h.0 == "Set-Cookie").unwrap();
            c.1.split("; ")
                .skip(1)
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let plain = set_cookie(&guard(Some("tok")));
        assert!(!plain.iter().any(|a| a == "Secure"), "{plain:?}");
        let tls = set_cookie(&guard(Some("tok")).with_secure_cookie(true));
        for want in ["Path=/", "HttpOnly", "SameSite=Strict", "Secure"] {
            assert!(tls.iter().any(|a| a == want), "{want} missing: {tls:?}");
        }
        // A one-time link sets the same cookie.
        let g = guard(Some("tok")).with_secure_cookie(true);
        let codes = OneTimeCodes::new(Duration::from_secs(60));
        let q = format!("code={}", codes.issue().unwrap());
        let r = login(&g, Some(&codes), false, &q, b"");
        let c = &r.headers.iter().find(|h| h.0 == "Set-Cookie").unwrap().1;
        assert!(c.ends_with("; Secure"), "{c}");
    }

    #[test]
    fn a_session_is_one_login_of_one_token() {
        let a = new_session("tok").unwrap();
        let b = new_session("tok").unwrap();
        let (ida, idb) = (
            session_id(&a, "tok").unwrap(),
            session_id(&b, "tok").unwrap(),
        );
        assert_ne!(ida, idb, "each login is a session of its own");
        assert_eq!(ida.len(), super::super::session::SESSION_ID_HEX);
        assert_eq!(session_id(&a, "another token"), None, "a new token ends it");
        let (id, mac) = a.split_once('.').unwrap();
        let forged = format!(
            "{}{}.{mac}",
            &id[..31],
            if id.ends_with('0') { '1' } else { '0' }
        );
        assert_eq!(session_id(&forged, "tok"), None);
        for bad in ["tok", "", ".", &format!("{id}."), &format!("x{}", &a[1..])] {
            assert_eq!(session_id(bad, "tok"), None, "{bad}");
        }
    }

    #[test]
    fn a_one_time_code_works_once_and_expires() {
        let g = guard(Some("tok"));
        let codes = OneTimeCodes::new(Duration::from_secs(60));
        let code = codes.issue().unwrap();
        assert_eq!(code.len(), 64);
        let q = format!("code={code}");
        let first = login(&g, Some(&codes), false, &q, b"");
        assert_eq!(first.status, 303);
        assert!(first.headers.iter().any(|h| h.0 == "Set-Cookie"));
        let again = login(&g, Some(&codes), false, &q, b"");
        assert_eq!(again.status, 401);
        assert!(again.headers.iter().all(|h| h.0 != "Set-Cookie"));
        let short = OneTimeCodes::new(Duration::ZERO);
        let code = short.issue().unwrap();
        assert!(!short.redeem(&code), "expired");
    }

    #[test]
    fn a_token_file_is_created_private_and_reused() {
        let dir = std::env::temp_dir().join(format!("hive-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("web-token");
        let _ = std::fs::remove_file(&path);
        let t = load_or_create(&path).unwrap();
        assert_eq!(t.len(), 64);
        assert!(t.bytes().all(|b| b.is_ascii_hexdigit()));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(load_or_create(&path).unwrap(), t);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "made private again");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
