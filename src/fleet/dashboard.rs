//! The operator dashboard of `hive up`: one embedded page (`dashboard.html`, no
//! build step, no CDN) and a small JSON API, as a route table on the web
//! servers' shared core (`http::server`: bounded tiny_http, socket timeouts, the
//! guard before every route). It is bound to 127.0.0.1 by default and wants a
//! token: `HIVE_DASHBOARD_TOKEN`, else one generated into `DATA/dashboard-token`;
//! `hive up` prints a one-time login link instead of the token. It speaks to
//! the broker as the operator, over the host socket, like the operator
//! commands do, and reads each agent's own page with that agent's token for
//! its live badges; its agent links log the browser in to the agent page. A
//! card also carries the agent's lifecycle buttons (start, stop, restart,
//! update: the operator's lifecycle commands), a forge link (when the agent
//! has a forge token) and a link to the dashboard's view of the entry it runs.
//! The Timers tab lists every agent's pending reminders and scheduled prompts
//! and cancels one (`cancel_timer`, as `hive timers cancel` does). A line
//! per notify destination whose last try failed shows its error
//! (`notify_status`, as `hive notify status` does).
//! One producer thread builds the hive snapshot once per tick while live
//! clients are connected and every `GET /events` stream sends that same
//! string (bounded in size: long texts are cut with a marker). `GET /metrics`
//! is the hive's Prometheus exposition, gathered in [`metrics`]. Documented
//! in `docs/fleet.md`, `docs/web.md` and `docs/observability.md`.

use super::pages::MAX_ANSWER;
use crate::config::WebSection;
use crate::http::auth::{self, OneTimeCodes};
use crate::http::guard::{Guard, Names};
use crate::http::server::{self, Access, Ctx, Handler, Method, Path, Route, Site, Timeouts};
use crate::http::sse;
use crate::http::{self, Reply};
use crate::proto::cmd::{
    Agents, Answer, Approvals, Approve, CancelQuestion, Deny, Failed, Inbox, InboxAck, Questions,
    RestartAgent, Retry, Search, SetPermissions, StartAgent, StopAgent, Supervision, UpdateAgent,
};
use crate::proto::{cmd, AgentState, Client, Command};
use crate::sys::env::Env;
use crossbeam_channel::{bounded, select, Receiver, Sender, TrySendError};
use serde_json::{json, Value};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path as FsPath, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

mod metrics;
mod script_pages;

const PAGE: &str = include_str!("dashboard.html");
const MAX_SSE_CLIENTS: usize = 16;
const MAX_SSE_PER_PEER: usize = 8;
/// Live streams of agents' pages passed on at once, all agents together.
const MAX_PAGE_STREAMS: usize = 64;
/// How long the dashboard waits for a page's answer for a card.
const CARD_WAIT: Duration = Duration::from_millis(500);
/// The agent page's HTML and script, built into the binary: `hive up` serves
/// them itself at `/agent/NAME/`, so nothing an agent writes runs as the
/// hive's origin (`hive serve` serves the same file on its own port).
const AGENT_PAGE: &str = include_str!("../web/page.html");
/// The file the generated token is kept in, under DATA.
pub const TOKEN_FILE: &str = "dashboard-token";
/// How long a printed login link works.
pub const LINK_TTL: Duration = Duration::from_secs(10 * 60);
/// Texts in the snapshot longer than this are cut (the whole message is one
/// `GET /api/message?id=N` away).
const CUT_BYTES: usize = 16 * 1024;
/// Entries of a list in the snapshot (questions, approvals, dead letters,
/// timers).
const LIST_MAX: usize = 200;
/// The most dashboard links of one agent a card shows.
const LINKS_MAX: usize = 32;

/// The dashboard's settings (`HIVE_DASHBOARD_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct DashConfig {
    pub bind: IpAddr,
    /// 0 picks a free port; the bound one is written to `DATA/dashboard-port`.
    pub port: u16,
    /// `HIVE_DASHBOARD_TOKEN`; without it one is generated into
    /// `DATA/dashboard-token`.
    pub token: Option<String>,
    /// `HIVE_DASHBOARD_AUTH=off` sets this to false: no token at all.
    pub auth: bool,
    /// `HIVE_DASHBOARD_HOSTS`: more names the dashboard answers to.
    pub hosts: Vec<String>,
    /// How often the live snapshot is rebuilt while clients watch.
    pub poll: Duration,
    /// The web servers' socket timeouts (`HIVE_WEB_READ_TIMEOUT_SECS`,
    /// `HIVE_WEB_SEND_TIMEOUT_SECS`).
    pub timeouts: Timeouts,
    /// `hive up`'s own `HIVE_FORGE_URL`, which the agents inherit unless their
    /// fleet entry sets one.
    pub forge_url: Option<String>,
    /// The fleet file's `web.public_origin` (`https://NAME[:PORT]`): the origin
    /// a reverse proxy serves the hive at, which links then use.
    pub public_origin: Option<String>,
    /// The fleet file's `web.script_pages`: agents whose page is also served
    /// on a loopback listener of its own, with its own scripts
    /// ([`script_pages`]).
    pub script_pages: Vec<(String, SocketAddr)>,
}

/// Where an agent's forge is when neither its entry nor `hive up` say.
const DEFAULT_FORGE_URL: &str = "http://localhost:3000";

impl DashConfig {
    /// The settings from the process environment.
    pub fn from_env() -> Result<DashConfig, String> {
        DashConfig::read(&Env::process())
    }

    /// The settings from `env`; a bad value is an error naming its variable.
    pub fn read(env: &Env) -> Result<DashConfig, String> {
        let cfg = DashConfig {
            bind: env.ip("HIVE_DASHBOARD_BIND", IpAddr::V4(Ipv4Addr::LOCALHOST))?,
            port: env.parse("HIVE_DASHBOARD_PORT", "a port")?.unwrap_or(0),
            token: env.get("HIVE_DASHBOARD_TOKEN"),
            auth: env.switch("HIVE_DASHBOARD_AUTH", true)?,
            hosts: env.list("HIVE_DASHBOARD_HOSTS"),
            poll: env
                .millis("HIVE_DASHBOARD_POLL_MS", 1000)?
                .max(Duration::from_millis(50)),
            timeouts: Timeouts::read(env)?,
            forge_url: env.get("HIVE_FORGE_URL"),
            public_origin: None,
            script_pages: Vec::new(),
        };
        cfg.check()?;
        Ok(cfg)
    }

    /// The settings of a hive whose fleet file has `web`: its `listen` (the
    /// default, [`crate::config::DEFAULT_LISTEN`], without one) and
    /// `public_origin`, unless `HIVE_DASHBOARD_PORT` or `HIVE_DASHBOARD_BIND`
    /// override them, which they do for one more release, each with a notice
    /// in `notices`.
    pub fn for_hive(
        env: &Env,
        web: Option<&WebSection>,
        notices: &mut Vec<String>,
    ) -> Result<DashConfig, String> {
        let web = web.cloned().unwrap_or_default();
        let addr = web.listen_addr()?;
        let mut cfg = DashConfig::read(&Env::new(&|k| {
            // The old variables are read below, as overrides of web.listen.
            (k != "HIVE_DASHBOARD_BIND" && k != "HIVE_DASHBOARD_PORT")
                .then(|| env.get(k))
                .flatten()
        }))?;
        cfg.bind = addr.ip();
        cfg.port = addr.port();
        if let Some(port) = env.parse::<u16>("HIVE_DASHBOARD_PORT", "a port")? {
            cfg.port = port;
            notices.push(format!(
                "HIVE_DASHBOARD_PORT={port} overrides web.listen's port; it goes away in the \
                 next release: set \"web\": {{\"listen\": \"{}\"}} in the fleet file instead",
                SocketAddr::new(cfg.bind, port)
            ));
        }
        if env.get("HIVE_DASHBOARD_BIND").is_some() {
            cfg.bind = env.ip("HIVE_DASHBOARD_BIND", cfg.bind)?;
            notices.push(format!(
                "HIVE_DASHBOARD_BIND={} overrides web.listen's address; it goes away in the \
                 next release: set \"web\": {{\"listen\": \"{}\"}} in the fleet file instead",
                cfg.bind,
                SocketAddr::new(cfg.bind, cfg.port)
            ));
        }
        cfg.public_origin = web.origin();
        cfg.hosts.extend(web.origin_host());
        cfg.script_pages = web.script_page_addrs()?;
        cfg.check()?;
        Ok(cfg)
    }

    /// Refuses an exposed bind without the operator's token, and a token
    /// together with `HIVE_DASHBOARD_AUTH=off`.
    pub fn check(&self) -> Result<(), String> {
        if !self.auth && self.token.is_some() {
            return Err(
                "HIVE_DASHBOARD_AUTH=off and HIVE_DASHBOARD_TOKEN are both set; unset one of them"
                    .into(),
            );
        }
        if !self.bind.is_loopback() && (self.public_origin.is_none() || !self.auth) {
            return Err(format!(
                "{} (web.listen) exposes the operator dashboard and every agent's page beyond \
                 this host: set web.public_origin to the https:// origin a reverse proxy serves \
                 the hive at (and leave HIVE_DASHBOARD_AUTH on: the token is \
                 HIVE_DASHBOARD_TOKEN, or DATA/dashboard-token), or listen on 127.0.0.1",
                SocketAddr::new(self.bind, self.port)
            ));
        }
        Ok(())
    }
}

/// The latest snapshot, as the frame every live client sends, and the live
/// clients to tell when it changes.
#[derive(Default)]
struct Feed {
    latest: Mutex<Option<(u64, Arc<str>)>>,
    /// One per live client: a pending notice is enough, so each holds one.
    watchers: Mutex<Vec<Sender<()>>>,
}

impl Feed {
    /// Publishes a new snapshot and tells every live client (whose notice
    /// may already wait: then it reads this one too).
    fn publish(&self, latest: Option<(u64, Arc<str>)>) {
        let tell = latest.is_some();
        *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = latest;
        if tell {
            self.watchers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|w| !matches!(w.try_send(()), Err(TrySendError::Disconnected(_))));
        }
    }

    /// The latest snapshot if it is newer than `seen`.
    fn newer(&self, seen: &mut u64) -> Option<Arc<str>> {
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        match latest.as_ref() {
            Some((v, frame)) if *v > *seen => {
                *seen = *v;
                Some(frame.clone())
            }
            _ => None,
        }
    }

    fn watch(&self) -> Receiver<()> {
        let (tx, rx) = bounded(1);
        self.watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(tx);
        rx
    }
}

/// What a new live client tells the producer.
enum FeedCmd {
    /// Build a snapshot now (there may be none yet).
    Wake,
}

struct App {
    host_socket: PathBuf,
    data: PathBuf,
    cfg: DashConfig,
    codes: OneTimeCodes,
    stream: sse::Params,
    feed: Arc<Feed>,
    wake: Sender<FeedCmd>,
    /// The live-stream places of the agents' pages, passed on
    /// (`/agent/NAME/events`): per client, as the dashboard's own.
    pages_stream: sse::Params,
    /// The dashboard's own port.
    port: u16,
    /// The bound port of each page served on a listener of its own
    /// (`web.script_pages`).
    script_ports: Vec<(String, u16)>,
    /// The pages `/metrics` is asking now ([`metrics::Scrapes`]).
    scrapes: metrics::Scrapes,
}

impl App {
    /// The hive's origin and `/` (see [`Dashboard::base_url`]).
    fn base_url(&self) -> String {
        if let Some(o) = &self.cfg.public_origin {
            return format!("{o}/");
        }
        let ip = match self.cfg.bind {
            b if b.is_unspecified() || b.is_loopback() => match b {
                IpAddr::V6(_) if !b.is_unspecified() => "[::1]".to_string(),
                _ => "127.0.0.1".to_string(),
            },
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        };
        format!("http://{ip}:{}/", self.port)
    }

    /// Where `name`'s page with its own scripts answers, when it has one.
    fn script_page_url(&self, name: &str) -> Option<String> {
        let (_, port) = self.script_ports.iter().find(|(n, _)| n == name)?;
        let ip = self
            .cfg
            .script_pages
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.ip())?;
        Some(format!("http://{}/", SocketAddr::new(ip, *port)))
    }
}

/// The running dashboard; dropping it stops the workers.
pub struct Dashboard {
    pub port: u16,
    site: Arc<Site<App>>,
    /// The listeners of the pages with scripts of their own, stopped first.
    script_workers: Vec<server::Workers>,
    workers: server::Workers,
    /// `dashboard-feed`, which ends when the workers' stop switch flips.
    feed: Option<JoinHandle<()>>,
}

impl Dashboard {
    /// A one-time login link for the operator (None with authentication off).
    pub fn login_link(&self) -> Result<Option<String>, String> {
        let base = self.base_url();
        if self.site.guard.token().is_none() {
            return Ok(None);
        }
        let code = self.site.app.codes.issue()?;
        Ok(Some(format!("{base}login?code={code}")))
    }

    /// The hive's origin and `/`: `web.public_origin` when set, else
    /// `http://ADDR:PORT/`, with a loopback address for a wildcard bind.
    pub fn base_url(&self) -> String {
        self.site.app.base_url()
    }

    /// Each page served on a listener of its own (`web.script_pages`): the
    /// agent and the page's URL there.
    pub fn script_pages(&self) -> Vec<(String, String)> {
        let app = &self.site.app;
        app.script_ports
            .iter()
            .filter_map(|(n, _)| Some((n.clone(), app.script_page_url(n)?)))
            .collect()
    }

    /// Where the token is, for the operator.
    pub fn token_hint(&self) -> String {
        match (&self.site.app.cfg.token, self.site.guard.token()) {
            (_, None) => "no token: HIVE_DASHBOARD_AUTH=off".into(),
            (Some(_), Some(_)) => "HIVE_DASHBOARD_TOKEN".into(),
            (None, Some(_)) => self.site.app.data.join(TOKEN_FILE).display().to_string(),
        }
    }
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        for w in &mut self.script_workers {
            w.stop();
        }
        self.workers.stop();
        if let Some(t) = self.feed.take() {
            let _ = t.join();
        }
    }
}

/// Why `hive up` cannot listen on `addr`: it is in use, by whom when this
/// user can see it (a process of its own: another `hive up`, most likely).
fn in_use(addr: SocketAddr) -> String {
    let who = match holder_of(addr.port()) {
        Some((pid, name)) => format!("by pid {pid} ({name}): another hive up?"),
        None => "by another process (another hive up?)".into(),
    };
    format!(
        "cannot listen on {addr} (web.listen in the fleet file): it is in use {who} \
         Stop that process, or set \"web\": {{\"listen\": \"127.0.0.1:PORT\"}} to a free port"
    )
}

/// The process listening on TCP `port`, when it is one this user may look
/// at: its pid and name, from `/proc/net/tcp*` and the processes' descriptors.
fn holder_of(port: u16) -> Option<(u32, String)> {
    let want = format!(":{port:04X}");
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address, st (0A: listening), …, inode
            if f.len() > 9 && f[1].ends_with(&want) && f[3] == "0A" {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    for proc in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = proc.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(proc.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else {
                continue;
            };
            if inodes.iter().any(|i| link.as_os_str() == i.as_str()) {
                let name = std::fs::read_to_string(proc.path().join("comm")).unwrap_or_default();
                return Some((pid, name.trim().to_string()));
            }
        }
    }
    None
}

/// The dashboard's token: the operator's, none with auth off, else the one in
/// `DATA/dashboard-token` (generated at first start).
fn resolve_token(cfg: &DashConfig, data: &FsPath) -> Result<Option<String>, String> {
    let file = data.join(TOKEN_FILE);
    if cfg.token.is_none() && cfg.auth {
        return auth::load_or_create(&file).map(Some);
    }
    if std::fs::remove_file(&file).is_ok() {
        log::info!(
            "removed {}: the dashboard's token comes from the environment",
            file.display()
        );
    }
    Ok(cfg.token.clone().filter(|_| cfg.auth))
}

/// Binds the dashboard and starts its workers and its snapshot producer.
/// `data` is `hive up`'s data dir (the token file, the agents' state dirs).
pub fn start(data: &FsPath, host_socket: PathBuf, cfg: DashConfig) -> Result<Dashboard, String> {
    cfg.check()?;
    let addr = SocketAddr::new(cfg.bind, cfg.port);
    let listener =
        server::bind(addr, cfg.timeouts, "the dashboard", "set web.listen").map_err(|e| {
            match std::net::TcpListener::bind(addr) {
                Err(b) if b.kind() == std::io::ErrorKind::AddrInUse => in_use(addr),
                _ => e,
            }
        })?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("cannot read the dashboard's address: {e}"))?
        .port();
    let script_listeners = script_pages::bind(&cfg.script_pages, cfg.timeouts)?;
    let script_ports = script_listeners
        .iter()
        .map(|(n, _, p)| (n.clone(), *p))
        .collect();
    let token = resolve_token(&cfg, data)?;
    let guard = Guard::new(
        Names {
            what: "the operator dashboard",
            token_hint: "HIVE_DASHBOARD_TOKEN, or DATA/dashboard-token",
            hosts_var: "HIVE_DASHBOARD_HOSTS",
        },
        cfg.bind,
        port,
        &cfg.hosts,
        token,
        format!("hive_dashboard_{port}"),
    )
    .with_secure_cookie(cfg.public_origin.is_some());
    let switch = server::StopSwitch::new();
    let (wake, woken) = crossbeam_channel::unbounded();
    let body_time = cfg.timeouts.read;
    let site = Arc::new(Site {
        app: App {
            host_socket,
            data: data.to_path_buf(),
            codes: OneTimeCodes::new(LINK_TTL),
            stream: sse::Params {
                slots: sse::Slots::new(
                    MAX_SSE_CLIENTS,
                    MAX_SSE_PER_PEER,
                    ("the dashboard's 16", "the dashboard's 8 per client"),
                ),
                ping: Duration::from_secs(15),
                stop: switch.watch(),
            },
            feed: Arc::new(Feed::default()),
            wake,
            pages_stream: sse::Params {
                slots: sse::Slots::new(
                    MAX_PAGE_STREAMS,
                    MAX_SSE_PER_PEER,
                    ("the hive's 64 page streams", "the hive's 8 per client"),
                ),
                ping: Duration::from_secs(15),
                stop: switch.watch(),
            },
            cfg,
            port,
            script_ports,
            scrapes: metrics::Scrapes::default(),
        },
        guard,
        routes: ROUTES.to_vec(),
        body_time,
        scoped: Some(agent_token_opens),
    });
    let stopped = switch.watch();
    let workers = server::start("dashboard", listener, site.clone(), switch)?;
    let script_workers = script_pages::start(&site, script_listeners)?;
    let s = site.clone();
    let feed = std::thread::Builder::new()
        .name("dashboard-feed".into())
        .spawn(move || produce(&s.app, &woken, &stopped))
        .map_err(|e| format!("cannot start the dashboard's snapshot thread: {e}"))?;
    Ok(Dashboard {
        port,
        site,
        script_workers,
        workers,
        feed: Some(feed),
    })
}

/// Every endpoint of the dashboard. The guard runs before any of them
/// ([`server::dispatch`]); `docs/fleet.md` documents each.
static ROUTES: &[Route<App>] = &[
    get("/", |_, _| page()),
    get("/index.html", |_, _| page()),
    Route {
        method: Method::Get,
        path: Path::Exact("/login"),
        access: Access::Login,
        handler: Handler::Reply(|a, c| {
            auth::login(c.guard, Some(&a.codes), false, c.query, &c.body)
        }),
    },
    Route {
        method: Method::Post,
        path: Path::Exact("/login"),
        access: Access::Login,
        handler: Handler::Reply(|a, c| {
            auth::login(c.guard, Some(&a.codes), true, c.query, &c.body)
        }),
    },
    get("/api/hive", |a, _| hive(a)),
    get("/api/message", message),
    get("/api/search", search),
    // issue 43: the hive-wide Prometheus exposition (`docs/observability.md`).
    get("/metrics", |a, _| metrics::reply(a)),
    Route {
        method: Method::Get,
        path: Path::Exact("/events"),
        access: Access::Token,
        handler: Handler::Stream(events),
    },
    Route {
        method: Method::Get,
        path: Path::Prefix("/agent/"),
        access: Access::Scoped,
        handler: Handler::Take(agent_route),
    },
    Route {
        method: Method::Post,
        path: Path::Prefix("/agent/"),
        access: Access::Scoped,
        handler: Handler::Take(agent_route),
    },
    post("/api/send", |a, c| call::<cmd::Send>(a, &c.body)),
    post("/api/answer", |a, c| call::<Answer>(a, &c.body)),
    post("/api/approve", |a, c| call::<Approve>(a, &c.body)),
    post("/api/deny", |a, c| call::<Deny>(a, &c.body)),
    post("/api/retry", |a, c| call::<Retry>(a, &c.body)),
    post("/api/read", |a, c| call::<InboxAck>(a, &c.body)),
    post("/api/permissions", |a, c| {
        call::<SetPermissions>(a, &c.body)
    }),
    post("/api/cancel-question", |a, c| {
        call::<CancelQuestion>(a, &c.body)
    }),
    // issue 39: the Timers tab cancels an agent's reminder or scheduled prompt.
    post("/api/cancel-timer", |a, c| {
        call::<cmd::CancelTimer>(a, &c.body)
    }),
    post("/api/start", |a, c| call::<StartAgent>(a, &c.body)),
    post("/api/stop", |a, c| call::<StopAgent>(a, &c.body)),
    post("/api/restart", |a, c| call::<RestartAgent>(a, &c.body)),
    post("/api/update", |a, c| call::<UpdateAgent>(a, &c.body)),
    post("/api/update-all", |a, c| call::<cmd::UpdateAll>(a, &c.body)),
    post("/api/reload", |a, c| call::<cmd::Reload>(a, &c.body)),
    post("/api/forget", |a, c| call::<cmd::ForgetAgent>(a, &c.body)),
    // issue 16: the budget field.
    post("/api/budget", |a, c| call::<cmd::SetBudget>(a, &c.body)),
    // issue 40: lifting a pause, and voiding a window's spend.
    post("/api/resume", |a, c| call::<cmd::Resume>(a, &c.body)),
    post("/api/void-spend", |a, c| call::<cmd::VoidSpend>(a, &c.body)),
];

const fn get(path: &'static str, f: fn(&App, &Ctx<'_>) -> Reply) -> Route<App> {
    Route {
        method: Method::Get,
        path: Path::Exact(path),
        access: Access::Token,
        handler: Handler::Reply(f),
    }
}

const fn post(path: &'static str, f: fn(&App, &Ctx<'_>) -> Reply) -> Route<App> {
    Route {
        method: Method::Post,
        path: Path::Exact(path),
        access: Access::Token,
        handler: Handler::Reply(f),
    }
}

fn page() -> Reply {
    Reply::new(200, "text/html; charset=utf-8", PAGE)
        .header("Cache-Control", "no-store")
        .header("Content-Security-Policy", http::page_csp(PAGE))
}

/// `GET /api/hive`: a fresh snapshot.
fn hive(app: &App) -> Reply {
    Reply::json(200, &snapshot(app))
}

/// A POST body as command `C` (the same struct every client builds; a key
/// given twice is refused), checked by the command's own rules and forwarded as
/// the operator; the broker's refusal is shown as it is. The answer is the
/// broker's, with `ok`.
fn call<C: Command>(app: &App, body: &[u8]) -> Reply {
    let cmd = match command::<C>(body) {
        Ok(c) => c,
        Err(e) => return Reply::error(400, e),
    };
    match host(app).and_then(|mut c| c.call(&cmd).map_err(|e| e.to_string())) {
        Ok(reply) => {
            let mut v = serde_json::to_value(&reply).unwrap_or_else(|_| json!({}));
            v["ok"] = json!(true);
            Reply::json(200, &v)
        }
        Err(e) => Reply::error(400, e),
    }
}

/// A POST body as command `C`, or why it is not one.
fn command<C: Command>(body: &[u8]) -> Result<C, String> {
    let v = http::strict_json(body).map_err(|e| format!("the body must be JSON: {e}"))?;
    let cmd: C = serde_json::from_value(v).map_err(|e| {
        format!(
            "the body does not fit {}: {}",
            C::CMD,
            http::error_text(&e.to_string())
        )
    })?;
    cmd.validate().map_err(|e| e.to_string())?;
    Ok(cmd)
}

fn host(app: &App) -> Result<Client, String> {
    let c = Client::connect(&app.host_socket).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(15)))
        .map_err(|e| e.to_string())?;
    Ok(c)
}

/// The token of `name`'s page (`pages.rs` says where it comes from).
fn agent_token(app: &App, name: &str, supervision: Option<&AgentState>) -> Option<String> {
    let entry = supervision.map(|s| &s.applied);
    super::pages::token(&app.data, entry, name)
}

/// The supervision row of `name`.
fn supervision_of(app: &App, name: &str) -> Result<AgentState, String> {
    let mut c = host(app)?;
    let sup = c.call(&Supervision {}).map_err(|e| e.to_string())?;
    sup.agents
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| format!("no agent {:?} in this hive", http::prefix(name)))
}

/// The agent's forge link: its Forgejo user's page at its `HIVE_FORGE_URL`
/// (its fleet entry's, else `hive up`'s, else the default), when it has a
/// forge token (`STATE/forge-token`) and the URL is not switched off (`""`).
fn forge_link(app: &App, name: &str, s: &AgentState) -> Option<String> {
    // Read as the page's own files are: not through a symlink the agent left.
    if !super::pages::plain_name(name)
        || super::pages::state_file(&app.data, name, "forge-token").is_none()
    {
        return None;
    }
    let url = match s.applied.env.get("HIVE_FORGE_URL") {
        Some(u) => u.trim().to_string(),
        None => app
            .cfg
            .forge_url
            .clone()
            .unwrap_or_else(|| DEFAULT_FORGE_URL.into()),
    };
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return None;
    }
    let user = s
        .applied
        .env
        .get("HIVE_LABEL")
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .unwrap_or(name);
    Some(format!("{}/{user}", url.trim_end_matches('/')))
}

/// `GET /agent/NAME/config`: the dashboard's view of the fleet entry NAME
/// runs (what hive applied), with whether the fleet file still says the same.
fn agent_config(sup: &AgentState) -> Reply {
    let v = json!({
        "agent": sup.name,
        "state": sup.state,
        "up_to_date": sup.up_to_date,
        "applied": sup.applied,
    });
    let text = serde_json::to_string_pretty(&v).unwrap_or_default();
    Reply::new(200, "application/json", text).header("Cache-Control", "no-store")
}

/// True when `token` is the page token of the agent whose prefix `path` is
/// under (`/agent/NAME/…`): a script with an agent's token reaches that
/// agent's page through the hive, and nothing else.
fn agent_token_opens(app: &App, path: &str, token: &str) -> bool {
    let Some((name, _)) = path
        .strip_prefix("/agent/")
        .and_then(|rest| rest.split_once('/'))
    else {
        return false;
    };
    let Ok(sup) = supervision_of(app, name) else {
        return false;
    };
    agent_token(app, name, Some(&sup))
        .is_some_and(|want| auth::ct_eq(want.as_bytes(), token.as_bytes()))
}

/// Everything under `/agent/NAME/`: the page itself and its turns
/// (`/agent/NAME/`, `/agent/NAME/turn/ID`: the page built into `hive`, served
/// here), the entry it runs (`config`), the old links (`open`), and every
/// other path passed on to the agent's page ([`super::proxy::pass_on`]).
fn agent_route(app: &App, req: tiny_http::Request, c: &Ctx<'_>) {
    let respond = |req: tiny_http::Request, r: Reply| {
        let _ = req.respond(r.into_response());
    };
    let rest = c.path.trim_start_matches("/agent/");
    let (name, what) = rest.split_once('/').unwrap_or((rest, ""));
    if !super::pages::plain_name(name) {
        return respond(req, Reply::not_found());
    }
    if !rest.contains('/') {
        return respond(req, Reply::redirect(&format!("/agent/{name}/")));
    }
    let sup = match supervision_of(app, name) {
        Ok(s) => s,
        Err(e) => return respond(req, Reply::error(404, e)),
    };
    let get = matches!(
        req.method(),
        tiny_http::Method::Get | tiny_http::Method::Head
    );
    let turn = what
        .strip_prefix("turn/")
        .map(|id| id.trim_end_matches('/').parse::<i64>().is_ok());
    match what {
        "config" if get => return respond(req, agent_config(&sup)),
        // The old link of the dashboard's cards (it logged in to the page's
        // own port): the page is here now.
        "open" if get => return respond(req, Reply::redirect(&format!("/agent/{name}/"))),
        // The page with its own scripts, on its own listener: the link the
        // login of that listener returns to.
        "own" if get => {
            let r = match app.script_page_url(name) {
                Some(url) => Reply::redirect(&url),
                None => Reply::error(
                    404,
                    format!(
                        "{name} has no page with scripts of its own: give it a loopback \
                         address in web.script_pages of the fleet file (\"{name}\": \
                         \"127.0.0.1:PORT\")"
                    ),
                ),
            };
            return respond(req, r);
        }
        "" | "index.html" if get => return respond(req, agent_page()),
        _ if get && turn == Some(true) => return respond(req, agent_page()),
        _ => {}
    }
    pass_to_page(app, req, c, &sup, what, false);
}

/// Passes `req` on to the page of the agent `sup` supervises, at path
/// `/what` (with the request's query): through the hive's origin, or
/// (`own_origin`) through the page's own listener.
fn pass_to_page(
    app: &App,
    req: tiny_http::Request,
    c: &Ctx<'_>,
    sup: &AgentState,
    what: &str,
    own_origin: bool,
) {
    let respond = |req: tiny_http::Request, r: Reply| {
        let _ = req.respond(r.into_response());
    };
    let name = sup.name.as_str();
    let token = agent_token(app, name, Some(sup));
    let running = sup.pid.is_some();
    if !running {
        let r = Reply::error(
            503,
            format!(
                "{name} does not run now (it is {}); its page is back when it runs",
                sup.state
            ),
        )
        .header("Retry-After", "2");
        return respond(req, r);
    }
    let socket = super::pages::socket_path(&app.data.join("run"), name);
    let target = if c.query.is_empty() {
        format!("/{what}")
    } else {
        format!("/{what}?{}", c.query)
    };
    let passing = super::proxy::Passing {
        agent: name,
        socket: &socket,
        target: &target,
        token: token.as_deref(),
        body: &c.body,
        client: c.client,
        refused: token.is_none().then(|| super::pages::no_token(name)),
        own_origin,
    };
    super::proxy::pass_on(req, &passing, &app.pages_stream);
}

/// The agent page, as `hive` has it built in.
fn agent_page() -> Reply {
    Reply::new(200, "text/html; charset=utf-8", AGENT_PAGE)
        .header("Cache-Control", "no-store")
        .header("Content-Security-Policy", http::page_csp(AGENT_PAGE))
}

/// What the card says of a page that answered 401 to `token`.
fn refused(name: &str, token: Option<&str>) -> String {
    match token {
        None => super::pages::no_token(name),
        Some(_) => "its page refused the token hive up has for it (its fleet entry's \
                    HIVE_WEB_TOKEN, or its state dir's web-token)"
            .into(),
    }
}

/// `GET /api/search?q=WORDS[&agent=A][&since=UNIX]`: `hive search` for the
/// page, with each hit's link through the dashboard (`/agent/NAME/turn/ID`,
/// which logs the browser in to the agent's page).
fn search(app: &App, c: &Ctx<'_>) -> Reply {
    let Some(words) = http::form_value(c.query, "q") else {
        return Reply::error(400, "give the words: /api/search?q=WORDS");
    };
    let since = match http::form_value(c.query, "since").filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match s.parse::<i64>() {
            Ok(t) => Some(t),
            Err(_) => return Reply::error(400, "since must be a unix time in seconds"),
        },
    };
    let cmd = Search {
        words,
        agent: http::form_value(c.query, "agent").filter(|a| !a.is_empty()),
        since,
        limit: None,
    };
    if let Err(e) = cmd.validate() {
        return Reply::error(400, e.to_string());
    }
    let mut broker = match host(app) {
        Ok(h) => h,
        Err(e) => return Reply::error(502, e),
    };
    match broker.call(&cmd) {
        Ok(mut r) => {
            for h in &mut r.hits {
                h.link = format!("/agent/{}/turn/{}", h.agent, h.turn);
            }
            Reply::json(200, &r)
        }
        Err(crate::proto::ClientError::Refused(why)) => Reply::error(400, why),
        Err(e) => Reply::error(502, e.to_string()),
    }
}

/// `GET /api/message?id=N`: one unread operator message whole (the snapshot
/// cuts long ones).
fn message(app: &App, c: &Ctx<'_>) -> Reply {
    let Some(id) = http::form_value(c.query, "id").and_then(|v| v.parse::<i64>().ok()) else {
        return Reply::error(400, "give the message's id: /api/message?id=N");
    };
    let page = host(app).and_then(|mut h| {
        h.call(&Inbox {
            wait_seconds: None,
            peek: true,
            after: Some(id.saturating_sub(1)),
        })
        .map_err(|e| e.to_string())
    });
    match page {
        Err(e) => Reply::error(502, e),
        Ok(p) => match p.messages.iter().find(|m| m.id == id) {
            Some(m) => Reply::json(200, m),
            None => Reply::error(404, format!("no unread operator message #{id}")),
        },
    }
}

/// The dashboard links an agent's page answered, as a card shows them: only
/// entries with a label and an http(s) URL ([`http::web_url`]; the page
/// filters its file the same way, but the answer is the agent's), at most
/// [`LINKS_MAX`], each with its three fields as strings and nothing else.
/// A link to this machine (a loopback address) or to the hive's own `hosts`
/// on another port carries `risky` (why), and the card shows it as text:
/// it could lead the operator's browser to a listener the agent runs.
fn links(answer: Value, hosts: &[String], port: u16) -> Value {
    let Value::Array(list) = answer else {
        return json!([]);
    };
    let kept = list.iter().filter_map(|l| {
        let (label, url) = (l["label"].as_str()?, l["url"].as_str()?);
        let icon = l["icon"].as_str().unwrap_or("");
        if !http::web_url(url) {
            return None;
        }
        let mut link = json!({"label": label, "url": url, "icon": icon});
        if let Some(why) = risky(url, hosts, port) {
            link["risky"] = json!(why);
        }
        Some(link)
    });
    Value::Array(kept.take(LINKS_MAX).collect())
}

/// Why `url` (an http(s) URL) is not shown as a link, if it is not: it
/// points at a loopback address (any spelling a browser reads as one:
/// `localhost`, `127.1`, `2130706433`, `[::1]`) or at one of `hosts`, the
/// hive's own names, on a port other than `port`.
fn risky(url: &str, hosts: &[String], port: u16) -> Option<&'static str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#', '\\']).next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, their_port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(':') && p.bytes().all(|b| b.is_ascii_digit()) => {
            (h, p.parse::<u16>().ok())
        }
        _ => (hostport, None),
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .trim_end_matches('.')
        .to_ascii_lowercase();
    let loopback = host == "localhost"
        || host.ends_with(".localhost")
        || host == "0.0.0.0"
        || loose_ipv4(&host).is_some_and(|ip| ip.is_loopback() || ip.is_unspecified())
        || host.parse::<std::net::Ipv6Addr>().is_ok_and(|ip| {
            ip.is_loopback()
                || ip.is_unspecified()
                || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        });
    if loopback {
        return Some("it points at this machine");
    }
    let default = if url.to_ascii_lowercase().starts_with("https:") {
        443
    } else {
        80
    };
    let theirs = their_port.unwrap_or(default);
    let ours = hosts.iter().any(|h| {
        let h = h.to_ascii_lowercase();
        let name = h
            .rsplit_once(':')
            .map_or(h.as_str(), |(n, _)| n)
            .to_string();
        name == host
    });
    (ours && theirs != port).then_some("it points at the hive's host on another port")
}

/// An IPv4 address as a browser reads a host: one to four parts, each
/// decimal, octal (`0…`) or hex (`0x…`), the last filling the rest.
fn loose_ipv4(host: &str) -> Option<std::net::Ipv4Addr> {
    let parts: Vec<&str> = host.split('.').collect();
    if parts.is_empty() || parts.len() > 4 {
        return None;
    }
    let num = |p: &str| -> Option<u64> {
        if let Some(h) = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")) {
            u64::from_str_radix(h, 16).ok()
        } else if p.len() > 1 && p.starts_with('0') {
            u64::from_str_radix(&p[1..], 8).ok()
        } else {
            p.parse().ok()
        }
    };
    let nums: Vec<u64> = parts.iter().map(|p| num(p)).collect::<Option<_>>()?;
    let (last, head) = nums.split_last()?;
    if head.iter().any(|n| *n > 255) || *last >= 1u64 << (8 * (4 - head.len())) {
        return None;
    }
    let mut v: u64 = 0;
    for (i, n) in head.iter().enumerate() {
        v |= n << (24 - 8 * i);
    }
    Some(std::net::Ipv4Addr::from((v | last) as u32))
}

/// Cuts `s` to [`CUT_BYTES`] (on a character boundary) with a marker; true when
/// it did.
fn cut(s: &mut String) -> bool {
    if s.len() <= CUT_BYTES {
        return false;
    }
    let mut end = CUT_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let rest = s.len() - end;
    s.truncate(end);
    s.push_str(&format!("… [cut: {rest} more bytes]"));
    true
}

/// Cuts every long text in `v`.
fn bound(v: &mut Value) {
    match v {
        Value::String(s) => {
            cut(s);
        }
        Value::Array(a) => a.iter_mut().for_each(bound),
        Value::Object(m) => m.values_mut().for_each(bound),
        _ => {}
    }
}

/// The whole hive as the page draws it, bounded in size: the inbox is one page
/// of the broker's (`PAGE_BYTES`), long texts are cut (a cut message is
/// marked `cut`), lists keep [`LIST_MAX`] entries.
fn snapshot(app: &App) -> Value {
    let mut c = match host(app) {
        Ok(c) => c,
        Err(e) => return json!({ "error": e }),
    };
    fn get<C: Command>(c: &mut Client, cmd: C) -> Value {
        c.call(&cmd)
            .map(|r| serde_json::to_value(r).unwrap_or_default())
            .unwrap_or_else(|e| json!({ "error": e.to_string() }))
    }
    let agents = get(&mut c, Agents {});
    let sup_rows: Vec<AgentState> = c
        .call(&Supervision {})
        .map(|s| s.agents)
        .unwrap_or_default();
    let questions = get(&mut c, Questions {});
    let approvals = get(&mut c, Approvals {});
    let failed = get(&mut c, Failed { agent: None });
    // issue 39: every agent's pending reminders and scheduled prompts.
    let timers = get(&mut c, cmd::Timers { agent: None });
    // issue 16: every scope's spend against its budget.
    let budget = get(&mut c, cmd::GetBudget {});
    // issue 39: the hive's recent activity, newest first.
    let activity = get(&mut c, cmd::Activity { limit: Some(50) });
    // issue 43: a line per notify destination whose last try failed.
    let notify = notify_errors(&get(&mut c, cmd::NotifyStatus {}));
    let budget_of = |scope: &str| -> Value {
        budget["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["scope"] == scope).cloned())
            .unwrap_or(Value::Null)
    };
    let inbox = get(
        &mut c,
        Inbox {
            wait_seconds: None,
            peek: true,
            after: None,
        },
    );
    let mut cards = Vec::new();
    // The hive's own names, for the links that point back at its host.
    let mut hive_hosts = app.cfg.hosts.clone();
    if !app.cfg.bind.is_unspecified() {
        hive_hosts.push(app.cfg.bind.to_string());
    }
    for row in agents["agents"].as_array().cloned().unwrap_or_default() {
        let name = row["name"].as_str().unwrap_or_default().to_string();
        let s = sup_rows.iter().find(|s| s.name == name);
        let mut card = row.clone();
        card["supervision"] = serde_json::to_value(s).unwrap_or(Value::Null);
        card["budget"] = budget_of(&name);
        if let Some(s) = s {
            card["config"] = json!(format!("/agent/{name}/config"));
            if let Some(forge) = forge_link(app, &name, s) {
                card["forge"] = json!(forge);
            }
        }
        if s.is_some_and(|s| s.pid.is_some()) && super::pages::plain_name(&name) {
            let token = agent_token(app, &name, s);
            let socket = super::pages::socket_path(&app.data.join("run"), &name);
            // Null when the page does not answer 200 with JSON in time.
            let fetch = |path: &str| -> Result<Value, u16> {
                let fetched = super::pages::fetch(
                    &socket,
                    &name,
                    path,
                    token.as_deref(),
                    MAX_ANSWER,
                    CARD_WAIT,
                );
                match fetched {
                    Ok((200, body)) => Ok(serde_json::from_slice(&body).unwrap_or(Value::Null)),
                    Ok((code, _)) => Err(code),
                    Err(_) => Ok(Value::Null),
                }
            };
            match fetch("/api/state") {
                Err(401) => card["page_error"] = json!(refused(&name, token.as_deref())),
                live => {
                    card["live"] = live.unwrap_or(Value::Null);
                    card["links"] = fetch("/api/dashboard-links")
                        .map_or(Value::Null, |l| links(l, &hive_hosts, app.cfg.port));
                    card["url"] = json!(format!("/agent/{name}/"));
                    card["open"] = json!(format!("/agent/{name}/"));
                    card["icon"] = json!(format!("/agent/{name}/icon"));
                }
            }
        }
        cards.push(card);
    }
    let mut messages = inbox["messages"].clone();
    if let Some(list) = messages.as_array_mut() {
        for m in list {
            if let Some(Value::String(body)) = m.get_mut("body") {
                if cut(body) {
                    m["cut"] = json!(true);
                }
            }
        }
    }
    let capped = |v: &Value| -> (Value, usize) {
        match v.as_array() {
            Some(a) if a.len() > LIST_MAX => (json!(a[..LIST_MAX]), a.len() - LIST_MAX),
            _ => (v.clone(), 0),
        }
    };
    let (questions, questions_more) = capped(&questions["questions"]);
    let (mut approvals, approvals_more) = capped(&approvals["approvals"]);
    // issue 16: the keys of a merge patch that apply live, and the card's
    // flag, judged against the entry the agent runs with (as the supervisor
    // judges it when the patch is approved).
    for a in approvals.as_array_mut().into_iter().flatten() {
        if a["kind"] == "apply_commit" {
            let patch = &a["payload"];
            let current = sup_rows.iter().find(|s| a["agent"] == s.name.as_str());
            let patched =
                current.and_then(|s| crate::config::fleetfile::patched(&s.applied, patch).ok());
            let entries = current.zip(patched.as_ref()).map(|(s, p)| (&s.applied, p));
            let keys = crate::proto::AgentConfig::live_keys_in(patch);
            let flag = crate::proto::AgentConfig::live_flag(patch, entries);
            a["live_keys"] = json!(keys);
            a["live_flag"] = json!(flag);
        }
    }
    let (failed, failed_more) = capped(&failed["failed"]);
    let (timers, timers_more) = capped(&timers["timers"]);
    let timers_more = timers_more as u64 + timers["left_off"].as_u64().unwrap_or(0);
    let mut snap = json!({
        "agents": cards,
        "questions": questions,
        "questions_more": questions_more,
        "approvals": approvals,
        "approvals_more": approvals_more,
        "failed": failed,
        "failed_more": failed_more,
        "timers": timers,
        "timers_more": timers_more,
        "budget": budget_of("hive"),
        "activity": activity["events"],
        "notify": notify,
        "inbox": messages,
        "inbox_more": inbox["more"].as_bool().unwrap_or(false),
        "bridge": agents["bridge"],
        "groups": crate::proto::access::ToolGroup::ALL.map(|g| g.name()),
        "capabilities": crate::proto::access::CAPABILITIES,
    });
    bound(&mut snap);
    snap
}

/// The notify destinations of a `notify_status` answer whose last try
/// failed (the event at their head has failed tries), for the dashboard's
/// notify line: URL (scheme and host), format, error, when, what waits.
fn notify_errors(status: &Value) -> Value {
    let failing = status["destinations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["attempts"].as_u64().is_some_and(|n| n > 0))
        .map(|d| {
            json!({
                "url": d["url"],
                "format": d["format"],
                "last_error": d["last_error"],
                "last_error_at": d["last_error_at"],
                "pending": d["pending"],
                "next_try_at": d["next_try_at"],
            })
        })
        .collect();
    Value::Array(failing)
}

/// The snapshot producer: while live clients are connected, one snapshot per
/// tick, published to all of them when it changed; while none are, it waits
/// for the next one to come (a [`FeedCmd::Wake`]) or the server to stop.
fn produce(app: &App, woken: &Receiver<FeedCmd>, stop: &Receiver<()>) {
    let mut version = 0u64;
    let mut last: Option<Arc<str>> = None;
    loop {
        let watched = app.stream.slots.count() > 0;
        if !watched {
            // Nobody watches: drop the old one, so a new client never starts
            // from a stale snapshot.
            if last.take().is_some() {
                app.feed.publish(None);
            }
        } else {
            let frame: Arc<str> = Arc::from(format!("data: {}\n\n", snapshot(app)));
            if last.as_deref() != Some(&*frame) {
                version += 1;
                app.feed.publish(Some((version, frame.clone())));
                last = Some(frame);
            }
        }
        let tick = if watched {
            crossbeam_channel::after(app.cfg.poll)
        } else {
            crossbeam_channel::never()
        };
        select! {
            recv(woken) -> cmd => match cmd {
                Ok(FeedCmd::Wake) => {}
                Err(_) => return,
            },
            recv(stop) -> _ => return,
            recv(tick) -> _ => {}
        }
    }
}

/// A live client's frames: each new snapshot the producer publishes.
struct SnapshotFeed {
    feed: Arc<Feed>,
    notices: Receiver<()>,
    seen: u64,
}

impl sse::Source for SnapshotFeed {
    type Item = ();

    fn first(&mut self) -> Vec<Arc<str>> {
        self.feed.newer(&mut self.seen).into_iter().collect()
    }

    fn items(&self) -> Receiver<()> {
        self.notices.clone()
    }

    fn frame(&mut self, _: ()) -> Option<Arc<str>> {
        self.feed.newer(&mut self.seen)
    }

    fn ended(&self) -> String {
        "the dashboard stops".into()
    }
}

/// `GET /events`: the snapshot, again whenever it changes, with pings between.
fn events(app: &App, req: tiny_http::Request, c: &Ctx<'_>) {
    let (feed, wake) = (app.feed.clone(), app.wake.clone());
    sse::start(req, c.client, &app.stream, "dashboard-sse", move || {
        let notices = feed.watch();
        let _ = wake.send(FeedCmd::Wake);
        SnapshotFeed {
            feed,
            notices,
            seen: 0,
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn the_page_is_embedded_and_self_contained() {
        assert!(PAGE.contains("<title>"));
        assert!(
            !PAGE.contains("http://") && !PAGE.contains("https://"),
            "no CDN"
        );
    }

    fn cfg(vars: &[(&str, &str)]) -> Result<DashConfig, String> {
        let m: std::collections::HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        DashConfig::read(&Env::new(&|k| m.get(k).cloned()))
    }

    #[test]
    fn settings_and_their_refusals() {
        let d = cfg(&[]).unwrap();
        assert!(d.auth && d.token.is_none() && d.bind.is_loopback());
        assert!(cfg(&[("HIVE_DASHBOARD_BIND", "0.0.0.0")])
            .unwrap_err()
            .contains("HIVE_DASHBOARD_TOKEN"));
        assert!(cfg(&[
            ("HIVE_DASHBOARD_BIND", "0.0.0.0"),
            ("HIVE_DASHBOARD_AUTH", "off")
        ])
        .is_err());
        assert!(cfg(&[
            ("HIVE_DASHBOARD_AUTH", "off"),
            ("HIVE_DASHBOARD_TOKEN", "t")
        ])
        .unwrap_err()
        .contains("both"));
        assert!(cfg(&[("HIVE_DASHBOARD_AUTH", "nah")])
            .unwrap_err()
            .contains("HIVE_DASHBOARD_AUTH"));
        let h = cfg(&[("HIVE_DASHBOARD_HOSTS", "hive.lan")]).unwrap();
        assert_eq!(h.hosts, ["hive.lan"]);
    }

    #[test]
    fn a_token_guards_every_endpoint_but_login() {
        let data = std::env::temp_dir().join(format!("hive-dash-{}", std::process::id()));
        std::fs::create_dir_all(&data).unwrap();
        let cfg = DashConfig {
            token: Some("s3cret".into()),
            poll: Duration::from_millis(100),
            ..cfg(&[]).unwrap()
        };
        let d = start(&data, PathBuf::from("/nonexistent/host.sock"), cfg).unwrap();
        let url = format!("http://127.0.0.1:{}", d.port);
        let status = |r: Result<ureq::Response, ureq::Error>| match r {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(c, _)) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(status(ureq::get(&format!("{url}/api/hive")).call()), 401);
        let ok = ureq::get(&format!("{url}/api/hive"))
            .set("Authorization", "Bearer s3cret")
            .call()
            .unwrap();
        let v: Value = ok.into_json().unwrap();
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("/nonexistent/host.sock"),
            "{v}"
        );
        assert_eq!(status(ureq::get(&format!("{url}/login")).call()), 200);
        assert_eq!(
            status(
                ureq::post(&format!("{url}/api/hive"))
                    .set("X-Hive-Token", "s3cret")
                    .call()
            ),
            405
        );
        assert!(
            !data.join(TOKEN_FILE).exists(),
            "the operator's token is not stored"
        );
        drop(d);
        std::fs::remove_dir_all(&data).unwrap();
    }

    /// A broker stand-in on a unix socket: an empty hive whose operator inbox
    /// holds one 100 kB message; counts the `inbox` requests.
    fn fake_broker(path: &FsPath) -> Arc<std::sync::atomic::AtomicUsize> {
        use std::io::{BufRead, BufReader, Write};
        let inboxes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let l = std::os::unix::net::UnixListener::bind(path).unwrap();
        let n = inboxes.clone();
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let n = n.clone();
                std::thread::spawn(move || {
                    let mut w = conn.try_clone().unwrap();
                    for line in BufReader::new(conn).lines().map_while(Result::ok) {
                        let cmd: Value = serde_json::from_str(&line).unwrap();
                        let answer = match cmd["cmd"].as_str().unwrap() {
                            "inbox" => {
                                n.fetch_add(1, Ordering::SeqCst);
                                json!({"ok": true, "messages": [{"id": 7, "from": "kid",
                                    "to": "operator", "body": "r".repeat(100_000), "sent_at": 1}]})
                            }
                            "questions" => json!({"ok": true, "questions": []}),
                            "approvals" => json!({"ok": true, "approvals": []}),
                            "failed" => json!({"ok": true, "failed": []}),
                            "activity" => json!({"ok": true, "events": []}),
                            _ => json!({"ok": true, "agents": []}),
                        };
                        if writeln!(w, "{answer}").is_err() {
                            return;
                        }
                    }
                });
            }
        });
        inboxes
    }

    #[test]
    fn live_clients_share_one_bounded_snapshot_per_tick() {
        let data = std::env::temp_dir().join(format!("hive-dash-feed-{}", std::process::id()));
        std::fs::create_dir_all(&data).unwrap();
        let sock = data.join("host.sock");
        let _ = std::fs::remove_file(&sock);
        let inboxes = fake_broker(&sock);
        let cfg = DashConfig {
            auth: false,
            poll: Duration::from_millis(100),
            ..cfg(&[]).unwrap()
        };
        let d = start(&data, sock, cfg).unwrap();
        let frames: Vec<_> = (0..8)
            .map(|_| {
                let port = d.port;
                std::thread::spawn(move || {
                    use std::io::{BufRead, BufReader, Write};
                    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    write!(s, "GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").unwrap();
                    let mut r = BufReader::new(s);
                    let mut line = String::new();
                    loop {
                        line.clear();
                        r.read_line(&mut line).unwrap();
                        if line.starts_with("data: ") {
                            break line;
                        }
                    }
                })
            })
            .collect();
        let frames: Vec<String> = frames.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(
            frames.iter().all(|f| *f == frames[0]),
            "clients got different snapshots"
        );
        let v: Value = serde_json::from_str(frames[0].trim_start_matches("data: ")).unwrap();
        assert_eq!(v["inbox"][0]["cut"], true);
        assert!(frames[0].len() < 20_000, "{} bytes", frames[0].len());
        // Eight clients at one tick per 100 ms: one snapshot (one inbox read)
        // per tick, not one per client per tick.
        let (before, t0) = (inboxes.load(Ordering::SeqCst), std::time::Instant::now());
        std::thread::sleep(Duration::from_secs(1));
        let ticks = inboxes.load(Ordering::SeqCst) - before;
        let at_most = t0.elapsed().as_millis() as usize / 100 + 2;
        assert!(
            ticks <= at_most,
            "{ticks} inbox reads in {:?}",
            t0.elapsed()
        );
        drop(d);
        std::fs::remove_dir_all(&data).unwrap();
    }

    #[test]
    fn links_to_this_machine_or_the_hives_host_on_another_port_are_marked() {
        let hosts = vec!["hive.lan".to_string(), "10.0.0.5".to_string()];
        for url in [
            "http://localhost:9999/",
            "http://LOCALHOST./x",
            "http://foo.localhost/",
            "http://127.0.0.1:1/",
            "http://127.1/",
            "http://2130706433/",
            "http://0x7f.0.0.1/",
            "http://[::1]:80/",
            "http://[::ffff:127.0.0.1]/",
            "http://user@127.0.0.1/",
            "http://0.0.0.0/",
        ] {
            assert_eq!(
                risky(url, &hosts, 7890),
                Some("it points at this machine"),
                "{url}"
            );
        }
        for url in [
            "http://hive.lan:8000/",
            "https://10.0.0.5/",
            "http://HIVE.lan/",
        ] {
            assert!(risky(url, &hosts, 7890).is_some(), "{url}");
        }
        for url in [
            "https://stats.test/",
            "http://hive.lan:7890/agent/x/",
            "http://128.0.0.1/",
            "https://example.com/127.0.0.1",
        ] {
            assert_eq!(risky(url, &hosts, 7890), None, "{url}");
        }
    }

    #[test]
    fn the_notify_line_lists_destinations_whose_last_try_failed() {
        let status = json!({"destinations": [
            {"url": "https://ntfy.sh", "format": "ntfy", "pending": 2, "last_ok_at": 10,
             "last_error": "HTTP 503", "last_error_at": 20, "next_try_at": 24, "attempts": 3},
            {"url": "https://hooks.slack.com", "format": "slack", "pending": 0, "attempts": 0,
             "last_ok_at": 20, "last_error": "HTTP 500", "last_error_at": 20},
            {"url": "http://127.0.0.1:9", "format": "json", "pending": 0},
        ]});
        assert_eq!(
            notify_errors(&status),
            json!([{"url": "https://ntfy.sh", "format": "ntfy", "last_error": "HTTP 503",
                    "last_error_at": 20, "pending": 2, "next_try_at": 24}])
        );
        assert_eq!(notify_errors(&json!({"error": "old broker"})), json!([]));
    }

    #[test]
    fn long_texts_are_cut_with_a_marker() {
        let mut s = "é".repeat(CUT_BYTES);
        assert!(cut(&mut s));
        assert!(s.len() < CUT_BYTES + 64, "{}", s.len());
        assert!(
            s.ends_with(&format!("… [cut: {} more bytes]", CUT_BYTES)),
            "{}",
            &s[s.len() - 40..]
        );
        let mut short = "ok".to_string();
        assert!(!cut(&mut short));
        let mut v = json!({"a": ["x".repeat(CUT_BYTES + 1)]});
        bound(&mut v);
        assert!(v["a"][0].as_str().unwrap().contains("[cut: 1 more bytes]"));
    }

    #[test]
    fn bodies_are_the_commands_and_names_are_plain() {
        for (body, want) in [
            (
                r#"{"to":1,"body":"x"}"#,
                "the body does not fit send: invalid type",
            ),
            (r#"{"to":"kid","body":"  "}"#, "body must not be empty"),
            (r#"{"to":"kid","body":"x","cc":"y"}"#, "unknown field `cc`"),
            ("nope", "the body must be JSON"),
        ] {
            let e = command::<cmd::Send>(body.as_bytes()).unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
        }
        let ok = command::<cmd::Send>(br#"{"to":"kid","body":"hi","in_reply_to":3}"#).unwrap();
        assert_eq!(ok.in_reply_to, Some(3));
        assert!(
            super::super::pages::plain_name("kid-2")
                && !super::super::pages::plain_name("..")
                && !super::super::pages::plain_name("a/b")
        );
    }
}
