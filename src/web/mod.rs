//! The per-agent web UI that `hive serve` runs next to its turn loop: a route
//! table on the shared HTTP core ([`crate::http`]: bounded tiny_http, named
//! worker threads, the guard before every route, the live-stream writer and the
//! token, which is generated into `STATE/web-token` unless the operator sets
//! one), with [`api`] for the JSON endpoints, [`history`] for the turn log
//! (`/api/history`, `/turn/ID`, read on its own thread and connection),
//! [`files`] for the page, the overlay and the icon, and [`metrics`] for
//! Prometheus. It sees the harness
//! only through the narrow handle of [`harness`] (the harness implements it), so
//! it never imports the harness and never blocks a turn. [`start`] binds and
//! returns a [`WebHandle`] that stops it on drop. `docs/web.md` lists every
//! endpoint and variable.

pub mod api;
pub mod files;
pub mod harness;
pub mod history;
pub mod metrics;

use crate::http::guard::{Guard, Names};
use crate::http::server::{Access, Ctx, Handler, Method, Path, Route, Site, Timeouts};
use crate::http::{self, auth, server, sse, Reply};
use crate::sys::env::Env;
use crossbeam_channel::Receiver;
use harness::{Ask, Harness};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tiny_http::Request;

/// `HIVE_PORT` when unset.
pub const DEFAULT_PORT: u16 = 7700;

/// The web UI's settings, from the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct WebConfig {
    /// `HIVE_PORT`; 0 picks a free port.
    pub port: u16,
    /// `HIVE_BIND`.
    pub bind: IpAddr,
    /// `HIVE_WEB_TOKEN`: the token every endpoint but `/login` wants; without
    /// it one is generated into `STATE/web-token`.
    pub token: Option<String>,
    /// `HIVE_WEB_AUTH=off` sets this to false: no token at all.
    pub auth: bool,
    /// `HIVE_WEB_HOSTS`: more names the page answers to (comma-separated).
    pub hosts: Vec<String>,
    /// `HIVE_STATIC_DIR`: files served under their own paths.
    pub static_dir: Option<PathBuf>,
    /// `HIVE_ICON`: an SVG served at `/icon`.
    pub icon: Option<PathBuf>,
    /// `HIVE_WEB_DIST`: a directory that replaces the embedded page.
    pub dist: Option<PathBuf>,
    /// `HIVE_DASHBOARD_LINKS`: the card's links as JSON (`[{label,url,icon}]`),
    /// in place of `STATE/hyperhive-dashboard-links.json`.
    pub dashboard_links: Option<String>,
    /// `HIVE_SSE_MAX_CLIENTS`.
    pub sse_max_clients: usize,
    /// `HIVE_SSE_MAX_PER_PEER`: live clients of one client (a login session,
    /// else an address).
    pub sse_max_per_peer: usize,
    /// `HIVE_SSE_PING_SECS`.
    pub sse_ping: Duration,
    /// `HIVE_WEB_READ_TIMEOUT_SECS`, `HIVE_WEB_SEND_TIMEOUT_SECS`.
    pub timeouts: Timeouts,
}

impl Default for WebConfig {
    fn default() -> WebConfig {
        WebConfig {
            port: DEFAULT_PORT,
            bind: IpAddr::from([127, 0, 0, 1]),
            token: None,
            auth: true,
            hosts: Vec::new(),
            static_dir: None,
            icon: None,
            dist: None,
            dashboard_links: None,
            sse_max_clients: 32,
            sse_max_per_peer: 8,
            sse_ping: Duration::from_secs(15),
            timeouts: Timeouts::default(),
        }
    }
}

impl WebConfig {
    /// The settings from the process environment.
    pub fn from_env() -> Result<WebConfig, String> {
        WebConfig::read(&Env::process())
    }

    /// The settings from `env`; a bad value is an error naming its variable.
    pub fn read(env: &Env) -> Result<WebConfig, String> {
        let d = WebConfig::default();
        let max = env.num("HIVE_SSE_MAX_CLIENTS", d.sse_max_clients as u64)?;
        if max == 0 {
            return Err("HIVE_SSE_MAX_CLIENTS must be at least 1".into());
        }
        let per_peer = env.num("HIVE_SSE_MAX_PER_PEER", d.sse_max_per_peer as u64)?;
        if per_peer == 0 {
            return Err("HIVE_SSE_MAX_PER_PEER must be at least 1".into());
        }
        Ok(WebConfig {
            port: env.parse("HIVE_PORT", "a port")?.unwrap_or(d.port),
            bind: env.ip("HIVE_BIND", d.bind)?,
            token: env.get("HIVE_WEB_TOKEN"),
            auth: env.switch("HIVE_WEB_AUTH", true)?,
            hosts: env.list("HIVE_WEB_HOSTS"),
            static_dir: env.path("HIVE_STATIC_DIR"),
            icon: env.path("HIVE_ICON"),
            dist: env.path("HIVE_WEB_DIST"),
            dashboard_links: env.get("HIVE_DASHBOARD_LINKS"),
            sse_max_clients: max as usize,
            sse_max_per_peer: per_peer as usize,
            sse_ping: env
                .secs("HIVE_SSE_PING_SECS", d.sse_ping.as_secs())?
                .max(Duration::from_secs(1)),
            timeouts: Timeouts::read(env)?,
        })
    }

    /// Refuses an exposed bind without a token of the operator's, and a token
    /// together with `HIVE_WEB_AUTH=off`.
    pub fn check(&self) -> Result<(), String> {
        if !self.auth && self.token.is_some() {
            return Err(
                "HIVE_WEB_AUTH=off and HIVE_WEB_TOKEN are both set; unset one of them".into(),
            );
        }
        if !self.bind.is_loopback() && (self.token.is_none() || !self.auth) {
            return Err(format!(
                "HIVE_BIND={} exposes the transcript beyond this host; set HIVE_WEB_TOKEN \
                 to a secret (and leave HIVE_WEB_AUTH on), or bind to 127.0.0.1",
                self.bind
            ));
        }
        Ok(())
    }
}

/// What the worker threads share.
struct App<H> {
    harness: Arc<H>,
    cfg: WebConfig,
    stream: sse::Params,
    /// The broker's spend and budget figures for `/metrics` (issue 16).
    budget: metrics::BudgetCache,
    /// The turn log's reader (`STATE/history.db`, read-only).
    history: crate::history::Reader,
}

/// The running server; dropping it stops it.
pub struct WebHandle {
    port: u16,
    workers: server::Workers,
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
        self.workers.stop();
    }
}

impl Drop for WebHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// The page's token: the operator's, none with auth off, else the one in
/// `STATE/web-token` (generated at first start). A generated file that no
/// longer names the page's token is removed, so the file never misleads the
/// dashboard or a script.
fn resolve_token(cfg: &WebConfig, state_dir: &std::path::Path) -> Result<Option<String>, String> {
    let file = state_dir.join(auth::PAGE_TOKEN_FILE);
    if cfg.token.is_none() && cfg.auth {
        return auth::load_or_create(&file).map(Some);
    }
    match std::fs::remove_file(&file) {
        Ok(()) => log::info!(
            "removed {}: this page's token comes from {}",
            file.display(),
            if cfg.auth {
                "HIVE_WEB_TOKEN"
            } else {
                "nowhere (HIVE_WEB_AUTH=off)"
            }
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => log::warn!("cannot remove the stale {}: {e}", file.display()),
    }
    Ok(cfg.token.clone().filter(|_| cfg.auth))
}

/// Starts the web UI on its own TCP port. The bound port is logged and
/// written to `<state>/hyperhive-port` (0600).
pub fn start<H: Harness>(harness: H, cfg: WebConfig) -> Result<WebHandle, String> {
    start_on(harness, cfg, None)
}

/// Starts the web UI: on `inherited`, the listening unix socket `hive up`
/// handed this harness (which opens no TCP port then, writes no port file,
/// and answers only `hive up`, which passes on each browser's request), else
/// on its own TCP port as [`start`] does.
pub fn start_on<H: Harness>(
    harness: H,
    mut cfg: WebConfig,
    inherited: Option<std::os::unix::net::UnixListener>,
) -> Result<WebHandle, String> {
    cfg.check()?;
    let state_dir = harness.state_dir().to_path_buf();
    let token = resolve_token(&cfg, &state_dir)?;
    let how = match (&token, &cfg.token) {
        (None, _) => " (no token: HIVE_WEB_AUTH=off)",
        (Some(_), Some(_)) => " (token: HIVE_WEB_TOKEN)",
        (Some(_), None) => " (token in the state dir's web-token)",
    };
    let (listener, port): (tiny_http::Listener, u16) = match inherited {
        Some(l) => {
            log::info!("web UI on the socket hive up handed it{how}");
            // Every request comes from hive up, which keeps each browser's
            // live-stream places itself: here it is one client.
            cfg.sse_max_per_peer = cfg.sse_max_clients;
            cfg.hosts = vec![server::SOCKET_HOST.to_string()];
            (l.into(), 0)
        }
        None => {
            let listener = server::bind(
                SocketAddr::new(cfg.bind, cfg.port),
                cfg.timeouts,
                "the web UI",
                "set HIVE_PORT to a free port, or 0",
            )?;
            let port = listener
                .local_addr()
                .map_err(|e| format!("cannot read the web UI's address: {e}"))?
                .port();
            let port_file = state_dir.join("hyperhive-port");
            if let Err(e) =
                crate::sys::fs::write_private(&port_file, format!("{port}\n").as_bytes())
            {
                log::warn!("cannot write {}: {e}", port_file.display());
            }
            log::info!("web UI on http://{}{how}", SocketAddr::new(cfg.bind, port));
            (listener.into(), port)
        }
    };
    let guard = Guard::new(
        Names {
            what: "this agent's web page",
            token_hint: "HIVE_WEB_TOKEN, or the state dir's web-token",
            hosts_var: "HIVE_WEB_HOSTS",
        },
        cfg.bind,
        port,
        &cfg.hosts,
        token,
        format!("hive_token_{port}"),
    );
    let switch = server::StopSwitch::new();
    let body_time = cfg.timeouts.read;
    let history = crate::history::Reader::start(&state_dir)?;
    let site = Arc::new(Site {
        app: App {
            stream: sse::Params {
                slots: sse::Slots::new(
                    cfg.sse_max_clients,
                    cfg.sse_max_per_peer,
                    ("HIVE_SSE_MAX_CLIENTS", "HIVE_SSE_MAX_PER_PEER"),
                ),
                ping: cfg.sse_ping,
                stop: switch.watch(),
            },
            harness: Arc::new(harness),
            cfg,
            budget: metrics::BudgetCache::default(),
            history,
        },
        guard,
        routes: routes(),
        body_time,
        scoped: None,
    });
    let workers = server::start("web", listener, site, switch)?;
    Ok(WebHandle { port, workers })
}

/// Every endpoint of the page. The guard runs before any of them
/// ([`server::dispatch`]); `docs/web.md` documents each.
fn routes<H: Harness>() -> Vec<Route<App<H>>> {
    vec![
        route(Method::Get, "/events", Handler::Stream(events)),
        route(
            Method::Get,
            "/api/state",
            Handler::Reply(|a, _| api::state(&*a.harness)),
        ),
        route(
            Method::Get,
            "/api/turns",
            Handler::Reply(|a, c| api::turns(&*a.harness, c.query)),
        ),
        route(
            Method::Get,
            "/api/history",
            Handler::Reply(|a, c| history::api(&a.history, c.query)),
        ),
        Route {
            method: Method::Get,
            path: Path::Prefix("/turn/"),
            access: Access::Token,
            handler: Handler::Reply(|a, c| {
                history::turn_page(&a.history, c.path, || {
                    files::serve(a.cfg.dist.as_deref(), None, "/").unwrap_or_else(files::page)
                })
            }),
        },
        route(
            Method::Get,
            "/api/dashboard-links",
            Handler::Reply(|a, _| match &a.cfg.dashboard_links {
                // The fleet entry's `dashboard_links`, as `hive up` hands them on.
                Some(text) => Reply::json(200, &api::parse_links(text)),
                None => api::dashboard_links(&*a.harness),
            }),
        ),
        route(
            Method::Get,
            "/api/login",
            Handler::Reply(|a, _| api::login_state(&*a.harness)),
        ),
        route(
            Method::Get,
            "/icon",
            Handler::Reply(|a, _| files::icon(a.cfg.icon.as_deref())),
        ),
        route(Method::Get, "/metrics", Handler::Reply(metrics_reply)),
        route(
            Method::Post,
            "/api/model",
            Handler::Reply(|a, c| api::model(&*a.harness, &c.body)),
        ),
        route(
            Method::Post,
            "/api/new-session",
            Handler::Reply(|a, _| api::new_session(&*a.harness)),
        ),
        route(
            Method::Post,
            "/api/compact",
            Handler::Reply(|a, _| api::control(&*a.harness, Ask::Compact, "compact")),
        ),
        route(
            Method::Post,
            "/api/interrupt",
            Handler::Reply(|a, _| api::control(&*a.harness, Ask::Interrupt, "interrupt")),
        ),
        route(
            Method::Post,
            "/api/send",
            Handler::Reply(|a, c| api::send(&*a.harness, &c.body)),
        ),
        route(
            Method::Post,
            "/api/login",
            Handler::Reply(|a, c| api::login(&*a.harness, &c.body)),
        ),
        Route {
            method: Method::Get,
            path: Path::Exact("/login"),
            access: Access::Login,
            handler: Handler::Reply(|_, c| login(c, false)),
        },
        Route {
            method: Method::Post,
            path: Path::Exact("/login"),
            access: Access::Login,
            handler: Handler::Reply(|_, c| login(c, true)),
        },
        Route {
            method: Method::Get,
            path: Path::Any,
            access: Access::Token,
            handler: Handler::Reply(|a, c| {
                files::serve(a.cfg.dist.as_deref(), a.cfg.static_dir.as_deref(), c.path)
                    .unwrap_or_else(Reply::not_found)
            }),
        },
    ]
}

/// A route on an exact path that wants the token.
fn route<H: Harness>(
    method: Method,
    path: &'static str,
    handler: Handler<App<H>>,
) -> Route<App<H>> {
    Route {
        method,
        path: Path::Exact(path),
        access: Access::Token,
        handler,
    }
}

/// `GET /login` and `POST /login`.
fn login(c: &Ctx<'_>, post: bool) -> Reply {
    auth::login(c.guard, None, post, c.query, &c.body)
}

fn metrics_reply<H: Harness>(app: &App<H>, _: &Ctx<'_>) -> Reply {
    let h = &*app.harness;
    let totals = match h.turn_totals() {
        Ok(t) => t,
        Err(e) => return Reply::error(500, e),
    };
    let text = metrics::render(
        &totals,
        &h.gauges(),
        app.stream.slots.count(),
        app.budget.get(h.broker()).as_ref(),
    );
    Reply::new(200, "text/plain; version=0.0.4; charset=utf-8", text)
}

/// `GET /events`: the harness's recent events from `Last-Event-ID` (or
/// `?last_event_id=`), then every event live.
fn events<H: Harness>(app: &App<H>, req: Request, c: &Ctx<'_>) {
    let last_id = http::header_value(&req, "Last-Event-ID")
        .map(str::to_string)
        .or_else(|| http::form_value(c.query, "last_event_id"))
        .and_then(|v| v.trim().parse::<u64>().ok());
    let h = app.harness.clone();
    sse::start(req, c.client, &app.stream, "web-sse", move || {
        // A client that saw ids beyond ours saw an earlier run: start it afresh.
        let reset = last_id.is_some_and(|l| l > h.last_event_id());
        let (replay, rx) = h.subscribe(if reset { None } else { last_id });
        let mut first: Vec<Arc<str>> = Vec::with_capacity(replay.len() + 1);
        if reset {
            first.push(Arc::from("event: reset\ndata: {}\n\n"));
        }
        first.extend(replay.iter().map(frame::<H>));
        LiveFeed::<H> { first, rx }
    });
}

/// One SSE frame for an event of the live stream.
fn frame<H: Harness>(e: &H::Event) -> Arc<str> {
    Arc::from(format!(
        "id: {}\ndata: {}\n\n",
        H::event_id(e),
        H::event_json(e)
    ))
}

/// A page client's frames: the replayed events, then the live subscription.
struct LiveFeed<H: Harness> {
    first: Vec<Arc<str>>,
    rx: Receiver<H::Event>,
}

impl<H: Harness> sse::Source for LiveFeed<H> {
    type Item = H::Event;

    fn first(&mut self) -> Vec<Arc<str>> {
        std::mem::take(&mut self.first)
    }

    fn items(&self) -> Receiver<H::Event> {
        self.rx.clone()
    }

    fn frame(&mut self, e: H::Event) -> Option<Arc<str>> {
        Some(frame::<H>(&e))
    }

    fn ended(&self) -> String {
        "it fell too far behind the live stream".into()
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
        WebConfig::read(&Env::new(&|k| m.get(k).cloned()))
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
            ("HIVE_WEB_HOSTS", " hive.lan, box:8080 ,"),
            ("HIVE_SSE_MAX_PER_PEER", "2"),
            ("HIVE_WEB_READ_TIMEOUT_SECS", "3"),
        ])
        .unwrap();
        assert_eq!((c.port, c.sse_max_clients, c.sse_max_per_peer), (0, 3, 2));
        assert_eq!(c.sse_ping, Duration::from_secs(2));
        assert_eq!(c.dist, Some(PathBuf::from("/d")));
        assert_eq!(c.hosts, ["hive.lan", "box:8080"]);
        assert_eq!(c.timeouts.read, Duration::from_secs(3));
        assert!(c.auth);
        assert!(c.check().is_ok());
        assert!(!cfg(&[("HIVE_WEB_AUTH", "OFF")]).unwrap().auth);
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (k, v) in [
            ("HIVE_PORT", "70000"),
            ("HIVE_PORT", "x"),
            ("HIVE_BIND", "localhost"),
            ("HIVE_SSE_MAX_CLIENTS", "0"),
            ("HIVE_SSE_MAX_PER_PEER", "0"),
            ("HIVE_WEB_AUTH", "maybe"),
            ("HIVE_WEB_READ_TIMEOUT_SECS", "soon"),
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
        // Turning authentication off is for loopback only, and not with a token.
        let off = cfg(&[("HIVE_WEB_AUTH", "off")]).unwrap();
        assert!(off.check().is_ok());
        let exposed = cfg(&[("HIVE_BIND", "0.0.0.0"), ("HIVE_WEB_AUTH", "off")]).unwrap();
        assert!(exposed.check().unwrap_err().contains("HIVE_WEB_AUTH"));
        let both = cfg(&[("HIVE_WEB_TOKEN", "t"), ("HIVE_WEB_AUTH", "off")]).unwrap();
        assert!(both.check().unwrap_err().contains("both"));
    }
}
