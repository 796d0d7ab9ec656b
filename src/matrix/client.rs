//! A blocking client for the Matrix client-server API (`/_matrix/client/v3`),
//! the part the bridge needs: `whoami`, joining a room by id or alias, sending
//! `m.room.message` events under a transaction id, long-polling `/sync`, and
//! back-paginating `/messages` after a `limited` timeline (logging in is in
//! [`super::login`]). It owns one `ureq::Agent` (TLS through rustls, so
//! `https://` homeservers work; no redirects, so a token never follows one)
//! and the session's access token, which travels only in the `Authorization`
//! header: no URL built here holds a secret. Each call makes one request and
//! returns an [`Error`] whose kind says whether to stop, wait or retry;
//! retrying is the caller's, with [`super::error::Backoff`].

use super::api::{
    Direction, Messages, RoomEvent, RoomFilter, RoomIdAnswer, SendAnswer, SyncResponse, Whoami,
};
use super::content;
use super::error::{classify, Endpoint, Error, ErrorKind};
use super::secret::Secret;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::io::Read;
use std::time::Duration;

/// The path prefix of every client-server API call.
pub(super) const API: &str = "/_matrix/client/v3";

/// Largest answer read: a sync of 100 events at the 64 KiB cap is 6.5 MiB.
const MAX_BODY: u64 = 32 << 20;

/// Largest error answer read.
const MAX_ERROR_BODY: u64 = 64 << 10;

/// Timeout of one request, connecting included (a sync gets its long-poll
/// timeout on top).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Timeout of the TCP (and TLS) connect alone.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Who the client is logged in as.
#[derive(Debug, Clone)]
pub struct Session {
    /// As the homeserver spells it (it may canonicalise the login's case).
    pub user_id: String,
    pub device_id: String,
    pub(super) token: Secret,
}

/// One page of `/messages`.
#[derive(Debug, Clone, Copy)]
pub struct MessagesRequest<'a> {
    /// A `prev_batch`, `next_batch` or earlier `end` token.
    pub from: &'a str,
    /// Stop at this token (e.g. the `since` of the sync that came back
    /// `limited`).
    pub to: Option<&'a str>,
    pub dir: Direction,
    pub limit: u32,
    pub filter: Option<&'a RoomFilter>,
}

/// A client of one homeserver. Clones share the connection pool and keep the
/// session they were cloned with (a later login of one clone mints a token of
/// its own; the others' stays valid until it is logged out).
#[derive(Debug, Clone)]
pub struct Client {
    /// The homeserver base URL, without a trailing slash.
    pub(super) base: String,
    http: ureq::Agent,
    pub(super) timeout: Duration,
    pub(super) session: Option<Session>,
}

impl Client {
    /// A client of the homeserver at `homeserver` (`http://` or `https://`,
    /// e.g. `https://matrix.example.org`), not logged in yet.
    pub fn new(homeserver: &str) -> Result<Client, Error> {
        let base = homeserver.trim().trim_end_matches('/');
        let rest = base
            .strip_prefix("https://")
            .or_else(|| base.strip_prefix("http://"));
        let bad = |why: &str| {
            Error::new(
                ErrorKind::Invalid,
                format!(
                    "the Matrix homeserver URL {homeserver:?} {why}: give its base URL, \
                     e.g. https://matrix.example.org or http://127.0.0.1:8008"
                ),
            )
        };
        let Some(rest) = rest else {
            return Err(bad("does not start with http:// or https://"));
        };
        if rest.is_empty() || rest.starts_with('/') {
            return Err(bad("names no host"));
        }
        if rest.contains(['?', '#', '@']) || rest.chars().any(|c| c.is_whitespace()) {
            return Err(bad("has a query, fragment, user part or space"));
        }
        let http = ureq::AgentBuilder::new()
            .timeout_connect(CONNECT_TIMEOUT)
            .redirects(0)
            .max_idle_connections_per_host(4)
            .user_agent(concat!("hive/", env!("CARGO_PKG_VERSION")))
            .build();
        Ok(Client {
            base: base.to_string(),
            http,
            timeout: DEFAULT_TIMEOUT,
            session: None,
        })
    }

    /// Sets the timeout of one request (a sync gets its long-poll timeout on
    /// top of it).
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.timeout = timeout;
        self
    }

    /// The homeserver base URL, without a trailing slash.
    pub fn homeserver(&self) -> &str {
        &self.base
    }

    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// Whose token the session holds: a cheap check that it is still valid.
    pub fn whoami(&self) -> Result<Whoami, Error> {
        self.call(
            "GET",
            &format!("{API}/account/whoami"),
            &[],
            None,
            self.timeout,
            Endpoint::Other,
        )
    }

    /// The room id an alias (`#swarm:hive.test`) points to.
    pub fn resolve_alias(&self, alias: &str) -> Result<String, Error> {
        if !alias.starts_with('#') || !alias.contains(':') {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("{alias:?} is not a room alias (#name:server)"),
            ));
        }
        let answer: RoomIdAnswer = self.call(
            "GET",
            &format!("{API}/directory/room/{}", encode(alias)),
            &[],
            None,
            self.timeout,
            Endpoint::Other,
        )?;
        non_empty_room_id(answer, alias)
    }

    /// Joins a room by id (`!…`) or alias (`#…:server`) and returns its id.
    /// Joining a room the user is already in is harmless; an invite-only room
    /// needs an invite first.
    pub fn join(&self, room: &str) -> Result<String, Error> {
        if !room.starts_with(['!', '#']) {
            return Err(Error::new(
                ErrorKind::Invalid,
                format!("{room:?} is neither a room id (!…) nor a room alias (#name:server)"),
            ));
        }
        let answer: RoomIdAnswer = self.call(
            "POST",
            &format!("{API}/join/{}", encode(room)),
            &[],
            Some(&json!({})),
            self.timeout,
            Endpoint::Other,
        )?;
        non_empty_room_id(answer, room)
    }

    /// Sends an `m.room.message` event with `content` to `room_id` and returns
    /// its event id. The homeserver keeps `txn_id` per (room, user, device)
    /// for about a day: sending again with the same id returns the first
    /// event's id and posts nothing. Content over the event cap, outside
    /// canonical JSON or without a string `msgtype` and `body` is refused
    /// here, before anything is sent.
    pub fn send(&self, room_id: &str, txn_id: &str, content: &Value) -> Result<String, Error> {
        check_room_id(room_id)?;
        if txn_id.is_empty() {
            return Err(Error::new(
                ErrorKind::Invalid,
                "an event needs a transaction id",
            ));
        }
        content::check_message(content).map_err(|why| {
            Error::new(
                ErrorKind::Invalid,
                format!("not sent to {room_id} (transaction {txn_id}): {why}"),
            )
        })?;
        let answer: SendAnswer = self.call(
            "PUT",
            &format!(
                "{API}/rooms/{}/send/m.room.message/{}",
                encode(room_id),
                encode(txn_id)
            ),
            &[],
            Some(content),
            self.timeout,
            Endpoint::Other,
        )?;
        if answer.event_id.is_empty() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("the send of transaction {txn_id} to {room_id} was answered without an event id"),
            ));
        }
        Ok(answer.event_id)
    }

    /// One `/sync`: waits up to `timeout` for something new after `since`
    /// (none: from now, with a `timeout` of zero, or the whole recent
    /// history). The request's own timeout is `timeout` plus the client's.
    pub fn sync(
        &self,
        since: Option<&str>,
        timeout: Duration,
        filter: Option<&RoomFilter>,
    ) -> Result<SyncResponse, Error> {
        let ms = timeout.as_millis().to_string();
        let mut query = vec![("timeout", ms.as_str())];
        if let Some(since) = since {
            query.push(("since", since));
        }
        if let Some(filter) = filter {
            query.push(("filter", filter.sync_json()));
        }
        let answer: SyncResponse = self.call(
            "GET",
            &format!("{API}/sync"),
            &query,
            None,
            timeout.saturating_add(self.timeout),
            Endpoint::Other,
        )?;
        if answer.next_batch.is_empty() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                "GET /sync was answered without a next_batch token",
            ));
        }
        Ok(answer)
    }

    /// One page of `room_id`'s events from `req.from`.
    pub fn messages(&self, room_id: &str, req: &MessagesRequest<'_>) -> Result<Messages, Error> {
        check_room_id(room_id)?;
        let limit = req.limit.to_string();
        let mut query = vec![
            ("from", req.from),
            ("dir", req.dir.as_param()),
            ("limit", limit.as_str()),
        ];
        if let Some(to) = req.to {
            query.push(("to", to));
        }
        if let Some(filter) = req.filter {
            query.push(("filter", filter.events_json()));
        }
        self.call(
            "GET",
            &format!("{API}/rooms/{}/messages", encode(room_id)),
            &query,
            None,
            self.timeout,
            Endpoint::Other,
        )
    }

    /// The events a `limited` timeline left out: pages `/messages` backwards
    /// from the timeline's `prev_batch` to `since` (the token the sync was
    /// made with), `page` events at a time, and returns them oldest first.
    /// A homeserver that ignores `to` pages back to the room's start: the
    /// caller's deduplication keeps that correct, only slower.
    pub fn fill_gap(
        &self,
        room_id: &str,
        prev_batch: &str,
        since: &str,
        filter: Option<&RoomFilter>,
        page: u32,
    ) -> Result<Vec<RoomEvent>, Error> {
        let mut events = Vec::new();
        let mut from = prev_batch.to_string();
        loop {
            let answer = self.messages(
                room_id,
                &MessagesRequest {
                    from: &from,
                    to: Some(since),
                    dir: Direction::Backward,
                    limit: page,
                    filter,
                },
            )?;
            let got = answer.chunk.len();
            events.extend(answer.chunk);
            match answer.end {
                Some(end) if got > 0 && end != from => from = end,
                _ => break,
            }
        }
        events.reverse();
        Ok(events)
    }

    /// Makes one request and reads its JSON answer. `path` is already
    /// percent-encoded; `query` values are encoded here.
    pub(super) fn call<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
        timeout: Duration,
        endpoint: Endpoint,
    ) -> Result<T, Error> {
        let op = format!("{method} {path}");
        let mut url = format!("{}{path}", self.base);
        for (i, (key, value)) in query.iter().enumerate() {
            url.push(if i == 0 { '?' } else { '&' });
            url.push_str(key);
            url.push('=');
            url.push_str(&encode(value));
        }
        let mut req = self.http.request(method, &url).timeout(timeout);
        if endpoint != Endpoint::Login {
            let Some(session) = &self.session else {
                return Err(Error::new(
                    ErrorKind::Auth,
                    format!("{op}: not logged in to the homeserver"),
                ));
            };
            req = req.set(
                "Authorization",
                &format!("Bearer {}", session.token.expose()),
            );
        }
        let answer = match body {
            Some(body) => req.send_json(body),
            None => req.call(),
        };
        match answer {
            Ok(resp) if (300..400).contains(&resp.status()) => {
                let location = resp.header("location").unwrap_or("nowhere").to_string();
                Err(Error::new(
                    ErrorKind::Refused {
                        status: resp.status(),
                        errcode: None,
                    },
                    format!(
                        "{op}: {} redirected to {location}; put the homeserver's own base URL \
                         in the configuration",
                        self.base
                    ),
                ))
            }
            Ok(resp) => {
                let bytes = read_body(resp, MAX_BODY)
                    .map_err(|e| Error::new(ErrorKind::Unavailable, format!("{op}: {e}")))?;
                serde_json::from_slice(&bytes).map_err(|e| {
                    Error::new(
                        ErrorKind::Unavailable,
                        format!("{op}: the homeserver's answer is not the expected JSON: {e}"),
                    )
                })
            }
            Err(ureq::Error::Status(status, resp)) => {
                let retry_after = resp.header("retry-after").map(str::to_string);
                let bytes = read_body(resp, MAX_ERROR_BODY).unwrap_or_default();
                Err(classify(
                    &op,
                    endpoint,
                    status,
                    &bytes,
                    retry_after.as_deref(),
                ))
            }
            Err(ureq::Error::Transport(t)) => {
                let mut message = format!(
                    "{op}: cannot reach the homeserver at {}: {}",
                    self.base,
                    t.kind()
                );
                if let Some(detail) = t.message() {
                    message.push_str(": ");
                    message.push_str(detail);
                }
                if let Some(source) = std::error::Error::source(&t) {
                    message.push_str(&format!(": {source}"));
                }
                Err(Error::new(ErrorKind::Unavailable, message))
            }
        }
    }
}

/// Reads at most `max` bytes of an answer; more is an error, not a cut.
fn read_body(resp: ureq::Response, max: u64) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    resp.into_reader()
        .take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("reading the answer failed: {e}"))?;
    if bytes.len() as u64 > max {
        return Err(format!("the answer is over {max} bytes"));
    }
    Ok(bytes)
}

/// Percent-encodes `s` for a path segment or a query value: everything but
/// the unreserved characters of RFC 3986.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn non_empty_room_id(answer: RoomIdAnswer, asked: &str) -> Result<String, Error> {
    if answer.room_id.is_empty() {
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!("the homeserver answered no room id for {asked}"),
        ));
    }
    Ok(answer.room_id)
}

fn check_room_id(room_id: &str) -> Result<(), Error> {
    if !room_id.starts_with('!') {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!("{room_id:?} is not a room id (!…); join the room first to learn its id"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    #[test]
    fn path_segments_and_query_values_are_percent_encoded() {
        assert_eq!(
            encode("!SccUzeuOaO_yJZvftDDZI5g-1G1HtlH-dAYo8LZKf7g"),
            "%21SccUzeuOaO_yJZvftDDZI5g-1G1HtlH-dAYo8LZKf7g"
        );
        assert_eq!(encode("#swarm:hive.test"), "%23swarm%3Ahive.test");
        assert_eq!(encode("a/b c?d&e=é"), "a%2Fb%20c%3Fd%26e%3D%C3%A9");
        assert_eq!(encode("s72595_4483~1.x"), "s72595_4483~1.x");
    }

    #[test]
    fn homeserver_urls_are_checked() {
        let c = Client::new("https://matrix.example.org/").unwrap();
        assert_eq!(c.homeserver(), "https://matrix.example.org");
        assert_eq!(
            Client::new(" http://127.0.0.1:8008 ").unwrap().homeserver(),
            "http://127.0.0.1:8008"
        );
        for bad in [
            "matrix.example.org",
            "ftp://x",
            "https://",
            "https://x/?a=1",
            "http://user:pw@x",
            "http://a b",
        ] {
            let e = Client::new(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Invalid, "{bad}");
            assert!(e.message.contains("homeserver URL"), "{e}");
        }
    }

    #[test]
    fn bad_ids_are_refused_before_any_request() {
        // Nothing listens on port 9 of loopback: a request would fail with
        // Unavailable, not Invalid.
        let mut c = Client::new("http://127.0.0.1:9").unwrap();
        let pw = Secret::new("x");
        for (user, device) in [
            ("hive", "D"),
            ("@hive", "D"),
            ("@:x", "D"),
            ("@a:x", ""),
            ("@a:x", "A B"),
        ] {
            let e = c.login_password(user, &pw, device, None).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Invalid, "{user} {device}: {e}");
        }
        assert_eq!(c.join("swarm").unwrap_err().kind, ErrorKind::Invalid);
        assert_eq!(c.resolve_alias("!x").unwrap_err().kind, ErrorKind::Invalid);
        assert_eq!(
            c.send("#swarm:x", "t1", &json!({})).unwrap_err().kind,
            ErrorKind::Invalid
        );
        let e = c.send("!r", "t1", &json!({"n": 0.5})).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.message.contains("not sent to !r (transaction t1)"), "{e}");
        let e = c
            .send("!r", "t1", &json!({"body": "no msgtype"}))
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid);
        assert!(e.message.contains(r#"needs a string "msgtype""#), "{e}");
        // Without a session nothing authenticated is sent.
        let e = c.whoami().unwrap_err();
        assert!(e.is_auth() && e.message.contains("not logged in"), "{e}");
    }

    #[test]
    fn a_homeserver_that_is_not_there_is_unavailable() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut c = Client::new(&format!("http://127.0.0.1:{port}")).unwrap();
        let e = c
            .login_password("@a:hive.test", &Secret::new("pw"), "D", None)
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
        assert!(e.message.contains("cannot reach the homeserver"), "{e}");
        assert!(
            e.message
                .contains("the Matrix login of @a:hive.test failed"),
            "{e}"
        );
    }

    /// A one-shot HTTP server on loopback: answers `answer` to the first
    /// request and hands over the request head.
    fn serve_once(answer: &'static str) -> (String, mpsc::Receiver<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let mut stream = stream;
            let _ = stream.write_all(answer.as_bytes());
            let _ = tx.send(head);
        });
        (url, rx)
    }

    #[test]
    fn the_token_goes_in_the_header_only() {
        let (url, head) = serve_once(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        );
        let mut c = Client::new(&url).unwrap();
        c.session = Some(Session {
            user_id: "@a:hive.test".into(),
            device_id: "D".into(),
            token: Secret::new("syt_secret_token"),
        });
        let filter = RoomFilter::messages("!r", 100);
        let e = c
            .sync(Some("s1_2"), Duration::from_millis(0), Some(&filter))
            .unwrap_err();
        // `{}` has no next_batch.
        assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
        let head = head.recv_timeout(Duration::from_secs(10)).unwrap();
        let request_line = head.lines().next().unwrap();
        assert!(
            request_line.starts_with("GET /_matrix/client/v3/sync?timeout=0&since=s1_2&filter=%7B")
        );
        assert!(!request_line.contains("syt_"), "{request_line}");
        assert!(
            head.contains("Authorization: Bearer syt_secret_token"),
            "{head}"
        );
        assert!(!format!("{c:?}").contains("syt_secret_token"));
        assert!(!e.message.contains("syt_"), "{e}");
    }

    #[test]
    fn a_redirect_is_not_followed() {
        let (url, _head) = serve_once(
            "HTTP/1.1 301 Moved\r\nLocation: https://elsewhere.example/\r\nContent-Length: 0\r\n\r\n",
        );
        let mut c = Client::new(&url).unwrap();
        c.session = Some(Session {
            user_id: "@a:hive.test".into(),
            device_id: "D".into(),
            token: Secret::new("syt_x"),
        });
        let e = c.whoami().unwrap_err();
        assert_eq!(
            e.kind,
            ErrorKind::Refused {
                status: 301,
                errcode: None
            }
        );
        assert!(
            e.message
                .contains("redirected to https://elsewhere.example/"),
            "{e}"
        );
    }

    #[test]
    fn https_homeservers_are_spoken_to_with_tls() {
        // A plain-HTTP server behind an https:// URL: the TLS handshake is
        // attempted (and fails), which shows TLS is compiled in.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        });
        let mut c = Client::new(&url).unwrap();
        c.session = Some(Session {
            user_id: "@a:hive.test".into(),
            device_id: "D".into(),
            token: Secret::new("syt_x"),
        });
        let e = c.whoami().unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unavailable, "{e}");
        assert!(e.message.contains("tls connection init failed"), "{e}");
    }
}
