//! How `hive up` speaks HTTP to an agent's page, which listens on a unix
//! socket of `hive up`'s own (`DATA/run/pages/NAME.sock`, inherited by the
//! harness; no sandbox shows it): one HTTP/1.0 request per connection, its
//! answer's head read under bounds ([`request`]), for the dashboard's own
//! reads (`pages::fetch`) and for the browser's requests it passes on under
//! `/agent/NAME/…` ([`pass_on`]). A page is the agent's, so what passes
//! through is chosen, never copied: the request takes only a few headers
//! (never the operator's cookie, its `Authorization` or its `Origin`), with
//! the page's own token added; the answer keeps only its data and a few
//! headers (never `Set-Cookie`, `Link`, `Refresh`, `Clear-Site-Data`,
//! `Service-Worker-Allowed`, nor a `Location` outside `/agent/NAME/`), and
//! always carries `X-Content-Type-Options: nosniff` and
//! `Content-Security-Policy: sandbox`, so nothing a page answers runs as the
//! hive's origin (on a page's own listener, `web.script_pages`, an origin
//! apart, its own policy passes instead and its scripts run). A live stream (`text/event-stream`) is relayed frame by
//! frame through the one SSE writer (`http::sse`), with the hive's places per
//! client, its pings and `X-Accel-Buffering: no`.

use crate::http::guard::Client;
use crate::http::{self, sse, Reply};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The longest line of an answer's head, and the most header lines.
const MAX_LINE: u64 = 8 * 1024;
const MAX_HEADERS: usize = 100;

/// The most bytes of one answer passed on to a browser (a history page holds
/// at most 4 MiB of events, and at least one turn whatever its size).
pub const MAX_PASSED: u64 = 32 * 1024 * 1024;

/// The longest a page's live stream may stay silent (it pings every 15 s)
/// before the relay gives it up.
const STREAM_SILENCE: Duration = Duration::from_secs(60);

/// The policy every answer of a page carries: an overlay's HTML, a
/// `frontend.dist` or an icon opened on its own runs no script and is an
/// origin of its own.
pub const SANDBOX: &str = "sandbox";

/// The request headers of a browser passed on to a page.
const REQUEST_HEADERS: &[&str] = &[
    "Accept",
    "Content-Type",
    "Last-Event-ID",
    "If-None-Match",
    "If-Modified-Since",
];

/// The answer headers of a page passed on to a browser (besides its
/// `Content-Type` and a `Location` inside its prefix).
const ANSWER_HEADERS: &[&str] = &[
    "Cache-Control",
    "ETag",
    "Last-Modified",
    "Retry-After",
    "Allow",
];

/// A page's answer: its status and headers, and the connection to read its
/// body from.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: BufReader<UnixStream>,
}

impl Answer {
    /// The first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body, at most `max` bytes: a longer one is an error (not read
    /// past `max`).
    pub fn read_body(mut self, max: u64) -> Result<Vec<u8>, String> {
        let said = self
            .header("Content-Length")
            .and_then(|l| l.trim().parse::<u64>().ok());
        if said.is_some_and(|n| n > max) {
            return Err(format!("its page's answer is over {max} bytes; dropped"));
        }
        let mut body = Vec::new();
        (&mut self.body)
            .take(said.unwrap_or(max + 1).min(max + 1))
            .read_to_end(&mut body)
            .map_err(|e| format!("cannot read its page's answer: {e}"))?;
        if body.len() as u64 > max {
            return Err(format!("its page's answer is over {max} bytes; dropped"));
        }
        Ok(body)
    }
}

/// `METHOD target` on the page at `socket` with `headers` and `body`, one
/// request on a new connection; `wait` bounds the connection, the sending
/// and each read of the answer. The answer's head is read under bounds.
pub fn request(
    socket: &Path,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    wait: Duration,
) -> io::Result<Answer> {
    let conn = UnixStream::connect(socket)?;
    conn.set_read_timeout(Some(wait))?;
    conn.set_write_timeout(Some(wait))?;
    let mut head = format!(
        "{method} {target} HTTP/1.0\r\nHost: {}\r\nConnection: close\r\n",
        crate::http::server::SOCKET_HOST
    );
    for (k, v) in headers {
        // A value with a line break would be a header of its own.
        if !v.contains(['\r', '\n']) {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut w = &conn;
    w.write_all(head.as_bytes())?;
    w.write_all(body)?;
    let mut r = BufReader::new(conn);
    let status_line = line(&mut r)?;
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|s| (100..600).contains(s))
        .ok_or_else(|| bad("a status line that is not HTTP"))?;
    let mut headers = Vec::new();
    loop {
        let l = line(&mut r)?;
        if l.is_empty() {
            break;
        }
        if headers.len() == MAX_HEADERS {
            return Err(bad("more than 100 header lines"));
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok(Answer {
        status,
        headers,
        body: r,
    })
}

fn bad(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("the page answered {what}"),
    )
}

/// One line of an answer's head, without its line end, at most [`MAX_LINE`].
fn line(r: &mut BufReader<UnixStream>) -> io::Result<String> {
    let mut buf = Vec::new();
    r.by_ref().take(MAX_LINE + 1).read_until(b'\n', &mut buf)?;
    if !buf.ends_with(b"\n") {
        return Err(bad(if buf.len() as u64 > MAX_LINE {
            "a header line over 8 KiB"
        } else {
            "a head cut short"
        }));
    }
    while buf.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        buf.pop();
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

/// A browser's request for agent `agent`'s page, as `hive up` passes it on.
pub struct Passing<'a> {
    pub agent: &'a str,
    /// The page's socket.
    pub socket: &'a Path,
    /// The path and query on the page (`/api/state?x=1`).
    pub target: &'a str,
    /// The page's token, which `hive up` adds.
    pub token: Option<&'a str>,
    pub body: &'a [u8],
    /// Who the browser is, for the live-stream places.
    pub client: &'a Client,
    /// Why the page is unavailable if it refuses the request (a 401): `hive
    /// up` has no token for it. Such an answer becomes a 503 saying so.
    pub refused: Option<String>,
    /// The request came to the page's own listener (`web.script_pages`), an
    /// origin apart from the hive's: the page's own scripts may run there,
    /// so its `Content-Security-Policy` is passed on instead of `sandbox`, it
    /// may install a service worker (for its own origin), and its paths are
    /// its own (a `Location` of `/x` stays `/x`).
    pub own_origin: bool,
}

/// Passes `req` on to its agent's page as `p` says and answers it with the
/// page's answer, filtered (see the module's note); a live stream is
/// relayed with `stream`'s places and pings.
pub fn pass_on(req: tiny_http::Request, p: &Passing<'_>, stream: &sse::Params) {
    let method = req.method().as_str().to_ascii_uppercase();
    if !p.own_origin && http::header_value(&req, "Service-Worker").is_some() {
        let r = Reply::error(
            403,
            "an agent's page cannot install a service worker on the hive's origin",
        );
        return respond(req, r);
    }
    let mut headers: Vec<(&str, &str)> = REQUEST_HEADERS
        .iter()
        .filter_map(|h| http::header_value(&req, h).map(|v| (*h, v)))
        .collect();
    if let Some(t) = p.token {
        headers.push(("X-Hive-Token", t));
    }
    // A stream waits for its next event as long as the page is up; anything
    // else answers within the page's own timeouts.
    let wait = Duration::from_secs(30);
    let answer = match request(p.socket, &method, p.target, &headers, p.body, wait) {
        Ok(a) => a,
        Err(e) => {
            log::debug!(
                "{}'s page did not answer {method} {}: {e}",
                p.agent,
                path_of(p.target)
            );
            let r = Reply::error(
                502,
                format!(
                    "{}'s page did not answer (it may be restarting; see DATA/logs/{}.log): {e}",
                    p.agent, p.agent
                ),
            )
            .header("Retry-After", "2");
            return respond(req, r);
        }
    };
    if let (401, Some(why)) = (answer.status, &p.refused) {
        return respond(req, Reply::error(503, format!("{}: {why}", p.agent)));
    }
    let ct = answer.header("Content-Type").unwrap_or("").to_string();
    if answer.status == 200 && ct.starts_with("text/event-stream") && method == "GET" {
        return relay(req, answer, p, stream);
    }
    let mut reply = Reply::new(answer.status, "application/octet-stream", Vec::new());
    if !ct.is_empty() {
        reply.content_type = ct.into();
    }
    let prefix = if p.own_origin {
        String::new()
    } else {
        format!("/agent/{}", p.agent)
    };
    let mut csp = None;
    for (k, v) in &answer.headers {
        if let Some(name) = ANSWER_HEADERS.iter().find(|h| h.eq_ignore_ascii_case(k)) {
            reply = reply.header(name, v.clone());
        } else if k.eq_ignore_ascii_case("Location") {
            if let Some(to) = within(&prefix, v) {
                reply = reply.header("Location", to);
            }
        } else if k.eq_ignore_ascii_case("Content-Security-Policy") && p.own_origin {
            csp = Some(v.clone());
        }
    }
    let status = answer.status;
    let body = if method == "HEAD" {
        Vec::new()
    } else {
        match answer.read_body(MAX_PASSED) {
            Ok(b) => b,
            Err(e) => {
                log::warn!("{}'s page answered {}: {e}", p.agent, path_of(p.target));
                return respond(req, Reply::error(502, e));
            }
        }
    };
    reply.body = http::Body::Bytes(body);
    reply.status = status;
    let csp = if p.own_origin {
        csp
    } else {
        Some(SANDBOX.into())
    };
    if let Some(csp) = csp {
        reply = reply.header("Content-Security-Policy", csp);
    }
    respond(req, reply)
}

/// A `Location` of a page, as a path of the origin it is served at: a path
/// of the page (`/x`) becomes `PREFIX/x` (`/agent/NAME/x` on the hive's
/// origin, `/x` on the page's own); anything else (another host, a
/// scheme-relative `//host`) is dropped.
fn within(prefix: &str, location: &str) -> Option<String> {
    let l = location.trim();
    let rest = l.strip_prefix('/')?;
    if rest.starts_with('/') || rest.starts_with('\\') || l.contains(['\r', '\n']) {
        return None;
    }
    Some(format!("{prefix}/{rest}"))
}

fn path_of(target: &str) -> &str {
    http::split_url(target).0
}

fn respond(req: tiny_http::Request, reply: Reply) {
    let _ = req.respond(reply.into_response());
}

/// A page's live stream, as frames: the reader thread `proxy-read` sends
/// each frame it reads (pings and the reconnect delay left out: the hive's
/// writer sends its own); shutting the connection down ends it.
struct Relayed {
    frames: crossbeam_channel::Receiver<Arc<str>>,
    conn: UnixStream,
    agent: String,
}

impl sse::Source for Relayed {
    type Item = Arc<str>;

    fn items(&self) -> crossbeam_channel::Receiver<Arc<str>> {
        self.frames.clone()
    }

    fn frame(&mut self, f: Arc<str>) -> Option<Arc<str>> {
        Some(f)
    }

    fn ended(&self) -> String {
        format!(
            "{}'s page ended its stream (it restarts, or stops)",
            self.agent
        )
    }
}

impl Drop for Relayed {
    fn drop(&mut self) {
        let _ = self.conn.shutdown(std::net::Shutdown::Both);
    }
}

/// Relays the live stream of `answer` to `req`'s client through the one SSE
/// writer (its places, pings and hang-up watch).
fn relay(req: tiny_http::Request, answer: Answer, p: &Passing<'_>, stream: &sse::Params) {
    let Ok(conn) = answer.body.get_ref().try_clone() else {
        return respond(req, Reply::error(502, "cannot hold the page's stream"));
    };
    // The page pings every 15 s while its stream is open: a page silent for
    // STREAM_SILENCE hangs (a stopped harness, a full pipe), and the relay
    // ends, so the browser reconnects rather than waiting for ever. The
    // hive's writer also ends it by shutting it down.
    let _ = conn.set_read_timeout(Some(STREAM_SILENCE));
    let (tx, rx) = crossbeam_channel::bounded::<Arc<str>>(256);
    let mut body = answer.body;
    let agent = p.agent.to_string();
    let reader = std::thread::Builder::new()
        .name("proxy-read".into())
        .spawn(move || {
            let mut frame = String::new();
            let mut line = String::new();
            loop {
                line.clear();
                match (&mut body).take(1 << 20).read_line(&mut line) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if line.trim_end_matches(['\r', '\n']).is_empty() {
                    let keep = frame
                        .lines()
                        .any(|l| !l.starts_with(':') && !l.starts_with("retry:"));
                    if keep && tx.send(Arc::from(format!("{frame}\n"))).is_err() {
                        return;
                    }
                    frame.clear();
                } else if frame.len() + line.len() <= 4 << 20 {
                    frame.push_str(&line);
                }
            }
        });
    if let Err(e) = reader {
        log::warn!("cannot start a thread to relay a page's stream: {e}");
        return respond(
            req,
            Reply::error(503, "the hive is out of threads; try again"),
        );
    }
    sse::start(req, p.client, stream, "proxy-sse", move || Relayed {
        frames: rx,
        conn,
        agent,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_location_stays_under_the_agents_prefix() {
        assert_eq!(within("/agent/ana", "/").as_deref(), Some("/agent/ana/"));
        assert_eq!(
            within("/agent/ana", "/login").as_deref(),
            Some("/agent/ana/login")
        );
        assert_eq!(within("", "/login").as_deref(), Some("/login"));
        for away in [
            "http://evil.example/",
            "//evil.example/",
            "/\\evil",
            "login",
            "",
        ] {
            assert_eq!(within("/agent/ana", away), None, "{away}");
            assert_eq!(within("", away), None, "{away}");
        }
    }
}
