//! The checks every request to either web server passes before anything else
//! runs (the agent page of `hive serve` and the operator dashboard of `hive up`;
//! [`super::server::dispatch`] is the one caller). In order:
//!
//! 1. **Host**: the `Host` header must name this server — `localhost`, an IP
//!    literal that is loopback or the bound address, with the server's port — or
//!    a name the operator configured (`HIVE_WEB_HOSTS`, `HIVE_DASHBOARD_HOSTS`).
//!    A page on some other name that resolves here (DNS rebinding) gets `421`.
//! 2. **Token** (unless the operator turned it off): `Authorization: Bearer`,
//!    `X-Hive-Token`, or the server's own cookie holding a login session
//!    ([`session::session_id`]) or the token, compared in constant time. This
//!    also says who the client is for the per-client limits ([`Client`]): its
//!    login session, else its address.
//! 3. **State-changing requests** (any method but GET and HEAD) must not come
//!    from another site: `Origin`, when present, is this server's own origin;
//!    `Sec-Fetch-Site`, when present, is `same-origin` or `none`; the body is
//!    `application/json` (a type no page can send cross-site without a CORS
//!    preflight, which these servers never grant). The login form is the one
//!    form post, and it only compares a token.
//!
//! It also keeps the login throttle: a few tries a second per peer address,
//! and a few more in all, so many addresses (or many clients behind a proxy)
//! cannot guess faster than that.

use super::session;
use crate::http::{header_value, prefix, Reply};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tiny_http::Request;

/// Login attempts a peer address may make per `LOGIN_WINDOW`.
pub const LOGIN_TRIES: u32 = 5;
/// Login attempts all peers together may make per `LOGIN_WINDOW`.
pub const LOGIN_TRIES_ALL: u32 = 20;
const LOGIN_WINDOW: Duration = Duration::from_secs(1);
/// Peers remembered by the throttle before the stale ones are dropped.
const LOGIN_PEERS: usize = 4096;

/// Who a server is, for its messages.
#[derive(Debug, Clone, Copy)]
pub struct Names {
    /// "this agent's web page", "the operator dashboard".
    pub what: &'static str,
    /// Where its token comes from, for a 401's hint.
    pub token_hint: &'static str,
    /// The variable that lists extra host names.
    pub hosts_var: &'static str,
}

/// Who a request comes from, for the per-client limits (live-stream places):
/// the login session its cookie holds, else its peer address (a script with a
/// token, a page with authentication off). Behind a proxy every client has
/// the proxy's address, but each browser login is still a client of its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Client {
    /// A session id ([`session::session_id`]).
    Session(String),
    Peer(IpAddr),
}

impl Client {
    /// The peer address of `req` as a client.
    pub fn peer(req: &Request) -> Client {
        Client::Peer(
            req.remote_addr()
                .map(|a| a.ip())
                .unwrap_or(IpAddr::from([0, 0, 0, 0])),
        )
    }
}

impl std::fmt::Display for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Client::Session(id) => write!(f, "login session {}…", &id[..id.len().min(8)]),
            Client::Peer(ip) => write!(f, "{ip}"),
        }
    }
}

pub struct Guard {
    names: Names,
    port: u16,
    bind: IpAddr,
    /// Operator-configured names, lowercase; with a port they match only it.
    hosts: Vec<String>,
    /// `None`: the operator turned authentication off.
    token: Option<String>,
    cookie: String,
    /// The cookie is `Secure`: the browser reaches this server over https
    /// (a TLS reverse proxy in front of it).
    secure_cookie: bool,
    tries: Mutex<Tries>,
}

/// The login throttle's counts: per peer, and all together, each for the
/// window that started at its instant.
#[derive(Default)]
struct Tries {
    peers: HashMap<IpAddr, (Instant, u32)>,
    all: Option<(Instant, u32)>,
}

impl Guard {
    pub fn new(
        names: Names,
        bind: IpAddr,
        port: u16,
        hosts: &[String],
        token: Option<String>,
        cookie: String,
    ) -> Guard {
        Guard {
            names,
            port,
            bind,
            hosts: hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect(),
            token,
            cookie,
            secure_cookie: false,
            tries: Mutex::new(Tries::default()),
        }
    }

    /// The same guard, whose cookie is `Secure` when `secure`: for a server
    /// the browser reaches over https (`web.public_origin`), so the browser
    /// never sends the login over plain HTTP.
    pub fn with_secure_cookie(mut self, secure: bool) -> Guard {
        self.secure_cookie = secure;
        self
    }

    pub fn names(&self) -> Names {
        self.names
    }

    /// The token, or None when authentication is off.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The name of this server's cookie.
    pub fn cookie(&self) -> &str {
        &self.cookie
    }

    /// Whether this server's cookie is `Secure` ([`Guard::with_secure_cookie`]).
    pub fn secure_cookie(&self) -> bool {
        self.secure_cookie
    }

    /// Step 1: the `Host` header as sent, when it names this server.
    pub fn host(&self, req: &Request) -> Result<String, Reply> {
        let Some(host) = header_value(req, "Host") else {
            return Err(Reply::error(
                400,
                "the request has no Host header; send one (HTTP/1.1 requires it)",
            ));
        };
        if self.host_ok(host) {
            return Ok(host.to_string());
        }
        Err(Reply::error(
            421,
            format!(
                "{} does not answer to the host {:?}: open it as http://localhost:{port}/ or \
                 http://127.0.0.1:{port}/, or add the name to {}",
                self.names.what,
                prefix(host),
                self.names.hosts_var,
                port = self.port
            ),
        ))
    }

    fn host_ok(&self, host: &str) -> bool {
        let host = host.trim().to_ascii_lowercase();
        let Some((name, port)) = split_host(&host) else {
            return false;
        };
        let ours = port == Some(self.port);
        if ours && name == "localhost" {
            return true;
        }
        if let Ok(ip) = name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
        {
            // An address typed in the bar cannot be a rebound name.
            if ours && (ip.is_loopback() || ip == self.bind || self.bind.is_unspecified()) {
                return true;
            }
        }
        self.hosts.iter().any(|h| {
            *h == host || (!h.contains(':') || h.starts_with('[') && h.ends_with(']')) && *h == name
        })
    }

    /// Step 2: who the request comes from, when it carries the token or one
    /// of its sessions (always, with auth off); None when it does not.
    pub fn client(&self, req: &Request) -> Option<Client> {
        let Some(want) = &self.token else {
            return Some(Client::peer(req));
        };
        let is_token = |t: &str| session::ct_eq(t.as_bytes(), want.as_bytes());
        match session::presented(req, &self.cookie)? {
            session::Presented::Header(t) => is_token(&t).then(|| Client::peer(req)),
            session::Presented::Cookie(v) if is_token(&v) => Some(Client::peer(req)),
            session::Presented::Cookie(v) => {
                session::session_id(&v, want).map(|id| Client::Session(id.to_string()))
            }
        }
    }

    /// The answer to a request without the token: a browser asking for a page
    /// goes to the login page, anything else gets a 401 saying what to send.
    pub fn unauthorized(&self, req: &Request, path: &str) -> Reply {
        let wants_html = header_value(req, "Accept").is_some_and(|a| a.contains("text/html"));
        let get = matches!(req.method().as_str(), "GET" | "HEAD");
        if wants_html && get && !path.starts_with("/api/") {
            return Reply::redirect("/login");
        }
        Reply::error(
            401,
            format!(
                "{} wants its token ({}): send `Authorization: Bearer <token>` or \
                 `X-Hive-Token: <token>`, or log in at /login",
                self.names.what, self.names.token_hint
            ),
        )
        .header("WWW-Authenticate", "Bearer")
    }

    /// Step 3, for a request that changes state: refused unless it comes from
    /// this server's own pages (or from a client that is not a browser). `form`
    /// allows the login form's urlencoded body.
    pub fn same_origin(&self, req: &Request, host: &str, form: bool) -> Result<(), Reply> {
        if let Some(origin) = header_value(req, "Origin") {
            if !self.origin_ok(origin, host) {
                return Err(Reply::error(
                    403,
                    format!(
                        "refused a request from another site (Origin {:?}); {} only takes \
                         changes from its own pages",
                        prefix(origin),
                        self.names.what
                    ),
                ));
            }
        }
        if let Some(site) = header_value(req, "Sec-Fetch-Site") {
            let site = site.trim().to_ascii_lowercase();
            if site != "same-origin" && site != "none" {
                return Err(Reply::error(
                    403,
                    format!(
                        "refused a request the browser marks as {:?} (Sec-Fetch-Site); {} only \
                         takes changes from its own pages",
                        prefix(&site),
                        self.names.what
                    ),
                ));
            }
        }
        let ct = header_value(req, "Content-Type").unwrap_or("");
        let media = ct
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let ok =
            media == "application/json" || form && media == "application/x-www-form-urlencoded";
        if !ok {
            return Err(Reply::error(
                415,
                format!(
                    "send the body as `Content-Type: application/json` (got {:?}; with curl: \
                     --json '{{…}}' or -H 'Content-Type: application/json')",
                    prefix(ct)
                ),
            ));
        }
        Ok(())
    }

    /// Whether `origin` is this server's own, reached as `host`: over http
    /// or https — but over https alone when the browser reaches it so
    /// (`web.public_origin`, [`Guard::with_secure_cookie`]): a page served
    /// over plain http under the same name is another origin, and one an
    /// attacker on the network can write.
    fn origin_ok(&self, origin: &str, host: &str) -> bool {
        let o = origin.trim().to_ascii_lowercase();
        let h = host.trim().to_ascii_lowercase();
        o == format!("https://{h}") || !self.secure_cookie && o == format!("http://{h}")
    }

    /// Counts a login attempt from `peer`: `429` past [`LOGIN_TRIES`] a second
    /// from it, or past [`LOGIN_TRIES_ALL`] a second from all peers.
    pub fn login_attempt(&self, peer: Option<IpAddr>) -> Result<(), Reply> {
        let peer = peer.unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let now = Instant::now();
        let mut tries = self.tries.lock().unwrap_or_else(|p| p.into_inner());
        let count = |entry: &mut (Instant, u32)| {
            if now.duration_since(entry.0) >= LOGIN_WINDOW {
                *entry = (now, 0);
            }
            entry.1 += 1;
            entry.1
        };
        let all = count(tries.all.get_or_insert((now, 0)));
        if tries.peers.len() >= LOGIN_PEERS {
            tries
                .peers
                .retain(|_, (since, _)| now.duration_since(*since) < LOGIN_WINDOW);
        }
        let mine = count(tries.peers.entry(peer).or_insert((now, 0)));
        let why = if mine > LOGIN_TRIES {
            format!("at most {LOGIN_TRIES} a second from one address")
        } else if all > LOGIN_TRIES_ALL {
            format!("at most {LOGIN_TRIES_ALL} a second in all")
        } else {
            return Ok(());
        };
        Err(
            Reply::error(429, format!("too many login attempts ({why}); try again"))
                .header("Retry-After", "1"),
        )
    }
}

/// Splits `name[:port]` (`[v6]:port` for IPv6); None when the port is not a
/// number.
fn split_host(host: &str) -> Option<(&str, Option<u16>)> {
    let (name, port) = if host.starts_with('[') {
        let end = host.find(']')?;
        let rest = &host[end + 1..];
        let port = match rest.strip_prefix(':') {
            Some(p) => Some(p),
            None if rest.is_empty() => None,
            None => return None,
        };
        (&host[..=end], port)
    } else {
        match host.rsplit_once(':') {
            Some((n, p)) => (n, Some(p)),
            None => (host, None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse().ok()?),
        None => None,
    };
    (!name.is_empty()).then_some((name, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: Names = Names {
        what: "the test server",
        token_hint: "T",
        hosts_var: "HIVE_TEST_HOSTS",
    };

    fn guard(bind: &str, hosts: &[&str]) -> Guard {
        let hosts: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        Guard::new(NAMES, bind.parse().unwrap(), 7700, &hosts, None, "c".into())
    }

    #[test]
    fn hosts_name_this_server_or_are_refused() {
        let g = guard("127.0.0.1", &["hive.example", "box.lan:8080", "[fd00::1]"]);
        for ok in [
            "localhost:7700",
            "LOCALHOST:7700",
            "127.0.0.1:7700",
            "127.0.0.2:7700",
            "[::1]:7700",
            "hive.example",
            "hive.example:443",
            "box.lan:8080",
            "[fd00::1]:7700",
        ] {
            assert!(g.host_ok(ok), "{ok} refused");
        }
        for bad in [
            "attacker.example:7700",
            "localhost",
            "localhost:7701",
            "127.0.0.1",
            "127.0.0.1:80",
            "10.0.0.5:7700",
            "box.lan",
            "box.lan:8081",
            "localhost.:7700",
            "localhost:7700x",
            "[::1]x:7700",
            ":7700",
            "",
            "hive.example.attacker.example",
        ] {
            assert!(!g.host_ok(bad), "{bad} accepted");
        }
        let any = guard("0.0.0.0", &[]);
        assert!(
            any.host_ok("10.0.0.5:7700"),
            "an exposed bind answers to its IPs"
        );
        assert!(!any.host_ok("evil.example:7700"));
        let one = guard("10.0.0.5", &[]);
        assert!(one.host_ok("10.0.0.5:7700") && !one.host_ok("10.0.0.6:7700"));
    }

    #[test]
    fn an_origin_is_this_servers_and_only_https_behind_a_public_https_origin() {
        let plain = guard("127.0.0.1", &["hive.example"]);
        for ok in [
            "http://hive.example",
            "HTTPS://hive.example",
            "http://127.0.0.1:7700",
        ] {
            let host = ok.split("://").nth(1).unwrap();
            assert!(plain.origin_ok(ok, host), "{ok} refused");
        }
        assert!(!plain.origin_ok("http://evil.example", "hive.example"));
        assert!(!plain.origin_ok("null", "hive.example"));
        let tls = guard("127.0.0.1", &["hive.example"]).with_secure_cookie(true);
        assert!(tls.origin_ok("https://hive.example", "hive.example"));
        assert!(
            !tls.origin_ok("http://hive.example", "hive.example"),
            "plain http is another origin behind https"
        );
    }

    #[test]
    fn the_login_throttle_counts_per_peer_and_per_second() {
        let g = guard("127.0.0.1", &[]);
        let a = Some(IpAddr::from([127, 0, 0, 1]));
        let b = Some(IpAddr::from([127, 0, 0, 2]));
        for _ in 0..LOGIN_TRIES {
            assert!(g.login_attempt(a).is_ok());
        }
        assert_eq!(g.login_attempt(a).unwrap_err().status, 429);
        assert!(g.login_attempt(b).is_ok(), "another peer has its own count");
    }

    #[test]
    fn the_login_throttle_has_a_bucket_for_all_peers() {
        let g = guard("127.0.0.1", &[]);
        // One attempt from each of many addresses within a second.
        let refused: Vec<u16> = (1..=LOGIN_TRIES_ALL + 5)
            .filter_map(|i| {
                let peer = IpAddr::from([127, 0, (i / 256) as u8, (i % 256) as u8]);
                g.login_attempt(Some(peer)).err().map(|r| r.status)
            })
            .collect();
        assert_eq!(refused, [429; 5], "past {LOGIN_TRIES_ALL} a second in all");
    }
}
