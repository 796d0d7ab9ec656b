//! The per-agent web UI that `hive serve` runs next to its turn loop: a tiny_http
//! server with a few named worker threads that route requests ([`api`] for the
//! JSON endpoints, [`sse`] for the live stream, [`files`] for the page, the
//! overlay and the icon, [`metrics`] for Prometheus, [`auth`] for the token
//! guard). It reads the harness only through [`Shared`], so it never blocks a
//! turn. [`start`] binds and returns a [`WebHandle`] that stops it on drop.
//! `docs/web.md` lists every endpoint and variable.

pub mod api;
pub mod auth;
pub mod files;
pub mod http;
pub mod metrics;
pub mod sse;

use crate::harness::control::{Control, Shared};
use http::Reply;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;
use tiny_http::{Request, Server};

/// `HIVE_PORT` when unset.
pub const DEFAULT_PORT: u16 = 7700;

/// How many threads answer requests (SSE streams have their own threads).
const WORKERS: usize = 4;

/// The web UI's settings, from the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct WebConfig {
    /// `HIVE_PORT`; 0 picks a free port.
    pub port: u16,
    /// `HIVE_BIND`.
    pub bind: IpAddr,
    /// `HIVE_WEB_TOKEN`: when set, every endpoint but `/login` wants it.
    pub token: Option<String>,
    /// `HIVE_STATIC_DIR`: files served under their own paths.
    pub static_dir: Option<PathBuf>,
    /// `HIVE_ICON`: an SVG served at `/icon`.
    pub icon: Option<PathBuf>,
    /// `HIVE_WEB_DIST`: a directory that replaces the embedded page.
    pub dist: Option<PathBuf>,
    /// `HIVE_SSE_MAX_CLIENTS`.
    pub sse_max_clients: usize,
    /// `HIVE_SSE_PING_SECS`.
    pub sse_ping: Duration,
    /// `HIVE_WEB_SEND_TIMEOUT_SECS`: a write to a client that makes no progress
    /// for this long fails, which drops that client.
    pub send_timeout: Duration,
}

impl Default for WebConfig {
    fn default() -> WebConfig {
        WebConfig {
            port: DEFAULT_PORT,
            bind: IpAddr::from([127, 0, 0, 1]),
            token: None,
            static_dir: None,
            icon: None,
            dist: None,
            sse_max_clients: 32,
            sse_ping: Duration::from_secs(15),
            send_timeout: Duration::from_secs(30),
        }
    }
}

impl WebConfig {
    pub fn from_env() -> Result<WebConfig, String> {
        WebConfig::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the variables through `get`; a bad value is an error naming it.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<WebConfig, String> {
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let num = |k: &str, default: u64| -> Result<u64, String> {
            get(k).map_or(Ok(default), |v| {
                v.parse()
                    .map_err(|_| format!("{k}={v:?} is not a whole number"))
            })
        };
        let d = WebConfig::default();
        let port = num("HIVE_PORT", d.port.into())?;
        let port = u16::try_from(port).map_err(|_| format!("HIVE_PORT={port} is not a port"))?;
        let bind = match get("HIVE_BIND") {
            None => d.bind,
            Some(b) => b.parse().map_err(|_| {
                format!("HIVE_BIND={b:?} is not an IP address (e.g. 127.0.0.1 or 0.0.0.0)")
            })?,
        };
        let max = num("HIVE_SSE_MAX_CLIENTS", d.sse_max_clients as u64)?;
        if max == 0 {
            return Err("HIVE_SSE_MAX_CLIENTS must be at least 1".into());
        }
        let ping = num("HIVE_SSE_PING_SECS", d.sse_ping.as_secs())?.max(1);
        let send = num("HIVE_WEB_SEND_TIMEOUT_SECS", d.send_timeout.as_secs())?.max(1);
        Ok(WebConfig {
            port,
            bind,
            token: get("HIVE_WEB_TOKEN"),
            static_dir: get("HIVE_STATIC_DIR").map(PathBuf::from),
            icon: get("HIVE_ICON").map(PathBuf::from),
            dist: get("HIVE_WEB_DIST").map(PathBuf::from),
            sse_max_clients: max as usize,
            sse_ping: Duration::from_secs(ping),
            send_timeout: Duration::from_secs(send),
        })
    }

    /// Refuses an exposed bind without a token.
    pub fn check(&self) -> Result<(), String> {
        if !self.bind.is_loopback() && self.token.is_none() {
            return Err(format!(
                "HIVE_BIND={} exposes the transcript beyond this host; set HIVE_WEB_TOKEN \
                 to a secret, or bind to 127.0.0.1",
                self.bind
            ));
        }
        Ok(())
    }
}

/// What the worker threads share.
struct App {
    shared: Shared,
    cfg: WebConfig,
    sse: sse::SseParams,
    rate_clock: Arc<metrics::RateClock>,
}

/// The running server; dropping it stops it.
pub struct WebHandle {
    port: u16,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl WebHandle {
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops accepting, ends the SSE streams and joins the workers.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for WebHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Binds with a send timeout that accepted connections inherit (Linux copies
/// socket options to accepted sockets), since tiny_http sets none.
fn bind(cfg: &WebConfig) -> Result<TcpListener, String> {
    let addr = SocketAddr::new(cfg.bind, cfg.port);
    let l = TcpListener::bind(addr).map_err(|e| {
        format!("cannot listen on {addr} for the web UI: {e} (set HIVE_PORT to a free port, or 0)")
    })?;
    let tv = libc::timeval {
        tv_sec: cfg.send_timeout.as_secs() as _,
        tv_usec: cfg.send_timeout.subsec_micros() as _,
    };
    // SAFETY: a valid fd and a timeval of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            l.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        log::warn!(
            "cannot set a send timeout on the web socket: {}; a stuck client may hold a thread",
            std::io::Error::last_os_error()
        );
    }
    Ok(l)
}

/// Starts the web UI. The bound port is logged and written to
/// `<state>/hyperhive-port`.
pub fn start(shared: Shared, cfg: WebConfig) -> Result<WebHandle, String> {
    cfg.check()?;
    let listener = bind(&cfg)?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("cannot read the web UI's address: {e}"))?
        .port();
    let server = Arc::new(
        Server::from_listener(listener, None)
            .map_err(|e| format!("cannot start the web server: {e}"))?,
    );
    let port_file = shared.settings.state_dir.join("hyperhive-port");
    if let Err(e) = std::fs::write(&port_file, format!("{port}\n")) {
        log::warn!("cannot write {}: {e}", port_file.display());
    }
    log::info!(
        "web UI on http://{}{}",
        SocketAddr::new(cfg.bind, port),
        if cfg.token.is_some() {
            " (token required)"
        } else {
            ""
        }
    );
    let stop = Arc::new(AtomicBool::new(false));
    let rate_clock = Arc::new(metrics::RateClock::default());
    let app = Arc::new(App {
        sse: sse::SseParams {
            local_port: port,
            max_clients: cfg.sse_max_clients,
            ping: cfg.sse_ping,
            clients: Arc::new(AtomicUsize::new(0)),
            stop: stop.clone(),
        },
        shared,
        cfg,
        rate_clock: rate_clock.clone(),
    });
    let mut threads = Vec::new();
    let spawn_err = |e: std::io::Error| format!("cannot start a web thread: {e}");
    for i in 0..WORKERS {
        let (server, app, stop) = (server.clone(), app.clone(), stop.clone());
        let t = std::thread::Builder::new()
            .name(format!("web-{i}"))
            .spawn(move || worker(&server, &app, &stop))
            .map_err(spawn_err)?;
        threads.push(t);
    }
    let (bus, stop2) = (app.shared.bus.clone(), stop.clone());
    let t = std::thread::Builder::new()
        .name("web-rate-clock".into())
        .spawn(move || metrics::watch(bus, rate_clock, stop2))
        .map_err(spawn_err)?;
    threads.push(t);
    Ok(WebHandle {
        port,
        stop,
        threads,
    })
}

fn worker(server: &Server, app: &App, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match server.recv_timeout(Duration::from_millis(200)) {
            Ok(Some(req)) => handle(app, req),
            Ok(None) => {}
            Err(e) => log::debug!("web: a connection failed: {e}"),
        }
    }
}

/// Methods each known path answers.
fn allowed(path: &str) -> Option<&'static [&'static str]> {
    const GET: &[&str] = &["GET"];
    const POST: &[&str] = &["POST"];
    const BOTH: &[&str] = &["GET", "POST"];
    Some(match path {
        "/events" | "/api/state" | "/api/turns" | "/api/dashboard-links" | "/icon" | "/metrics" => {
            GET
        }
        "/api/model" | "/api/new-session" | "/api/compact" | "/api/send" | "/api/interrupt" => POST,
        "/api/login" | "/login" => BOTH,
        _ => return None,
    })
}

fn handle(app: &App, mut req: Request) {
    let url = req.url().to_string();
    let (path, query) = http::split_url(&url);
    let method = req.method().as_str().to_ascii_uppercase();
    let token = app.cfg.token.as_deref();
    if path != "/login" && !auth::authorized(token, &req) {
        let reply = auth::refuse(&req, path);
        let _ = req.respond(reply.into_response());
        return;
    }
    let reply = match allowed(path) {
        Some(methods) if !methods.contains(&method.as_str()) => Reply::method_not_allowed(methods),
        Some(_) if path == "/events" => {
            let last_id = http::header_value(&req, "Last-Event-ID")
                .map(str::to_string)
                .or_else(|| http::form_value(query, "last_event_id"))
                .and_then(|v| v.trim().parse().ok());
            sse::serve(&app.shared.bus, &app.sse, req, last_id);
            return;
        }
        Some(_) => {
            let body = match http::post_body(&mut req, &method) {
                Ok(b) => b,
                Err(r) => {
                    let _ = req.respond(r.into_response());
                    return;
                }
            };
            route(app, &method, path, query, &body)
        }
        None if method == "GET" || method == "HEAD" => {
            files::serve(app.cfg.dist.as_deref(), app.cfg.static_dir.as_deref(), path)
                .unwrap_or_else(Reply::not_found)
        }
        None => {
            let known = files::serve(app.cfg.dist.as_deref(), app.cfg.static_dir.as_deref(), path)
                .is_some_and(|r| r.status == 200);
            if known {
                Reply::method_not_allowed(&["GET"])
            } else {
                Reply::not_found()
            }
        }
    };
    if let Err(e) = req.respond(reply.into_response()) {
        log::debug!("web: {method} {path}: the client went away: {e}");
    }
}

fn route(app: &App, method: &str, path: &str, query: &str, body: &[u8]) -> Reply {
    let s = &app.shared;
    match (method, path) {
        (_, "/login") => auth::login(app.cfg.token.as_deref(), method, body),
        ("GET", "/api/state") => api::state(s),
        ("GET", "/api/turns") => api::turns(s, query),
        ("GET", "/api/dashboard-links") => api::dashboard_links(s),
        ("GET", "/api/login") => api::login_state(s),
        ("GET", "/icon") => files::icon(app.cfg.icon.as_deref()),
        ("GET", "/metrics") => {
            let totals = match crate::harness::stats::totals(&s.settings.stats_db()) {
                Ok(t) => t,
                Err(e) => return Reply::error(500, e),
            };
            let text = metrics::render(
                &totals,
                &s.bus.snapshot(),
                app.sse.clients.load(Ordering::SeqCst),
                app.rate_clock.seconds(),
            );
            Reply::new(200, "text/plain; version=0.0.4; charset=utf-8", text)
        }
        ("POST", "/api/model") => api::model(s, body),
        ("POST", "/api/new-session") => api::new_session(s),
        ("POST", "/api/compact") => api::control(s, Control::Compact, "compact"),
        ("POST", "/api/interrupt") => api::control(s, Control::Interrupt, "interrupt"),
        ("POST", "/api/send") => api::send(s, body),
        ("POST", "/api/login") => api::login(s, body),
        _ => Reply::not_found(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<WebConfig, String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        WebConfig::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn config_defaults_and_overrides() {
        assert_eq!(cfg(&[]).unwrap(), WebConfig::default());
        let c = cfg(&[
            ("HIVE_PORT", "0"),
            ("HIVE_BIND", "0.0.0.0"),
            ("HIVE_WEB_TOKEN", "t"),
            ("HIVE_SSE_MAX_CLIENTS", "3"),
            ("HIVE_SSE_PING_SECS", "2"),
            ("HIVE_WEB_DIST", "/d"),
        ])
        .unwrap();
        assert_eq!((c.port, c.sse_max_clients), (0, 3));
        assert_eq!(c.sse_ping, Duration::from_secs(2));
        assert_eq!(c.dist, Some(PathBuf::from("/d")));
        assert!(c.check().is_ok());
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("HIVE_PORT", "70000"),
            ("HIVE_PORT", "x"),
            ("HIVE_BIND", "localhost"),
            ("HIVE_SSE_MAX_CLIENTS", "0"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            assert!(e.contains(k), "{e}");
        }
    }

    #[test]
    fn an_exposed_bind_without_a_token_is_refused() {
        let e = cfg(&[("HIVE_BIND", "0.0.0.0")])
            .unwrap()
            .check()
            .unwrap_err();
        assert!(e.contains("HIVE_WEB_TOKEN"), "{e}");
        assert!(cfg(&[("HIVE_BIND", "::1")]).unwrap().check().is_ok());
    }
}
