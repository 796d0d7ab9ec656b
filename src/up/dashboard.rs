//! The operator dashboard of `hive up`: one embedded page (`dashboard.html`, no
//! build step, no CDN) and a small JSON API on tiny_http, bound to 127.0.0.1 by
//! default and guarded by a token when exposed (the agent page's `auth` logic).
//! It speaks to the broker as the operator, over the host socket, like the
//! operator commands do, and reads each agent's own page for its live badges.
//! `GET /events` streams the whole hive snapshot whenever it changes (SSE,
//! headers written by hand, one writer thread per client, capped). Documented
//! in `docs/fleet.md`.

use crate::web::auth;
use crate::web::http::{self, Reply};
use crate::wire::{Client, Request};
use serde_json::{json, Value};
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tiny_http::Server;

const PAGE: &str = include_str!("dashboard.html");
const WORKERS: usize = 4;
const MAX_SSE_CLIENTS: usize = 16;

/// The dashboard's settings (`HIVE_DASHBOARD_*`).
#[derive(Debug, Clone, PartialEq)]
pub struct DashConfig {
    pub bind: IpAddr,
    /// 0 picks a free port; the bound one is written to `DATA/dashboard-port`.
    pub port: u16,
    pub token: Option<String>,
    /// How often a live client's snapshot is re-read.
    pub poll: Duration,
}

impl DashConfig {
    pub fn from_env() -> Result<DashConfig, String> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let bind = match get("HIVE_DASHBOARD_BIND") {
            None => IpAddr::V4(Ipv4Addr::LOCALHOST),
            Some(b) => b.trim().parse().map_err(|_| {
                format!("HIVE_DASHBOARD_BIND={b:?} is not an IP address (e.g. 127.0.0.1)")
            })?,
        };
        let port = match get("HIVE_DASHBOARD_PORT") {
            None => 0,
            Some(p) => p
                .trim()
                .parse()
                .map_err(|_| format!("HIVE_DASHBOARD_PORT={p:?} is not a port"))?,
        };
        let poll = match get("HIVE_DASHBOARD_POLL_MS") {
            None => 1000,
            Some(p) => p
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("HIVE_DASHBOARD_POLL_MS={p:?} is not a whole number"))?
                .max(50),
        };
        let token = get("HIVE_DASHBOARD_TOKEN");
        if !bind.is_loopback() && token.is_none() {
            return Err(format!(
                "HIVE_DASHBOARD_BIND={bind} exposes the operator dashboard beyond this host; \
                 set HIVE_DASHBOARD_TOKEN to a secret, or bind to 127.0.0.1"
            ));
        }
        Ok(DashConfig {
            bind,
            port,
            token,
            poll: Duration::from_millis(poll),
        })
    }
}

struct App {
    host_socket: PathBuf,
    cfg: DashConfig,
    stop: Arc<AtomicBool>,
    clients: Arc<AtomicUsize>,
    http: ureq::Agent,
}

/// The running dashboard; dropping it stops the workers.
pub struct Dashboard {
    pub port: u16,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Drop for Dashboard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Binds the dashboard and starts its workers.
pub fn start(host_socket: PathBuf, cfg: DashConfig) -> Result<Dashboard, String> {
    let addr = SocketAddr::new(cfg.bind, cfg.port);
    let server = Arc::new(Server::http(addr).map_err(|e| {
        format!("cannot listen on {addr} for the dashboard: {e} (set HIVE_DASHBOARD_PORT)")
    })?);
    let port = server
        .server_addr()
        .to_ip()
        .map(|a| a.port())
        .ok_or("the dashboard is not on an IP socket")?;
    let stop = Arc::new(AtomicBool::new(false));
    let app = Arc::new(App {
        host_socket,
        cfg,
        stop: stop.clone(),
        clients: Arc::new(AtomicUsize::new(0)),
        http: ureq::AgentBuilder::new()
            .timeout(Duration::from_millis(500))
            .build(),
    });
    let mut threads = Vec::new();
    for i in 0..WORKERS {
        let (server, app) = (server.clone(), app.clone());
        let t = std::thread::Builder::new()
            .name(format!("dashboard-{i}"))
            .spawn(move || {
                while !app.stop.load(Ordering::Relaxed) {
                    match server.recv_timeout(Duration::from_millis(200)) {
                        Ok(Some(req)) => handle(&app, req),
                        Ok(None) => {}
                        Err(e) => log::debug!("dashboard: a connection failed: {e}"),
                    }
                }
            })
            .map_err(|e| format!("cannot start a dashboard thread: {e}"))?;
        threads.push(t);
    }
    Ok(Dashboard {
        port,
        stop,
        threads,
    })
}

fn handle(app: &Arc<App>, mut req: tiny_http::Request) {
    let url = req.url().to_string();
    let (path, _query) = http::split_url(&url);
    let path = path.to_string();
    let method = req.method().as_str().to_ascii_uppercase();
    let token = app.cfg.token.as_deref();
    if path != "/login" && !auth::authorized(token, &req) {
        let reply = refuse(&req, &path);
        let _ = req.respond(reply.into_response());
        return;
    }
    if path == "/events" && method == "GET" {
        events(app, req);
        return;
    }
    let body = match http::post_body(&mut req, &method) {
        Ok(b) => b,
        Err(r) => {
            let _ = req.respond(r.into_response());
            return;
        }
    };
    let reply = route(app, &method, &path, &body);
    if let Err(e) = req.respond(reply.into_response()) {
        log::debug!("dashboard: {method} {path}: the client went away: {e}");
    }
}

/// A request without the token: a browser asking for the page goes to the login
/// page, anything else gets a 401 saying what to send.
fn refuse(req: &tiny_http::Request, path: &str) -> Reply {
    let wants_html = http::header_value(req, "Accept").is_some_and(|a| a.contains("text/html"));
    if wants_html && req.method().as_str() == "GET" && !path.starts_with("/api/") {
        return Reply::redirect("/login");
    }
    Reply::error(
        401,
        "the operator dashboard wants its token: send `Authorization: Bearer \
         <HIVE_DASHBOARD_TOKEN>` or `X-Hive-Token`, or log in at /login",
    )
    .header("WWW-Authenticate", "Bearer")
}

fn route(app: &App, method: &str, path: &str, body: &[u8]) -> Reply {
    match (method, path) {
        ("GET", "/") | ("GET", "/index.html") => {
            Reply::new(200, "text/html; charset=utf-8", PAGE).header("Cache-Control", "no-store")
        }
        (_, "/login") => auth::login(app.cfg.token.as_deref(), method, body),
        ("GET", "/api/hive") => Reply::json(200, &snapshot(app)),
        ("POST", "/api/send") => call(app, body, |v| {
            Ok(Request::Send {
                to: str_field(v, "to")?,
                body: str_field(v, "body")?,
                in_reply_to: v.get("in_reply_to").and_then(Value::as_i64),
            })
        }),
        ("POST", "/api/answer") => call(app, body, |v| {
            Ok(Request::Answer {
                id: int_field(v, "id")?,
                answer: str_field(v, "answer")?,
            })
        }),
        ("POST", "/api/approve") => call(app, body, |v| {
            Ok(Request::Approve {
                id: int_field(v, "id")?,
            })
        }),
        ("POST", "/api/deny") => call(app, body, |v| {
            Ok(Request::Deny {
                id: int_field(v, "id")?,
                why: v.get("why").and_then(Value::as_str).map(str::to_string),
            })
        }),
        ("POST", "/api/read") => call(app, body, |v| {
            let ids = v
                .get("ids")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
                .ok_or("send the ids of the messages the page showed: {\"ids\":[1,2]}")?;
            Ok(Request::InboxAck { ids })
        }),
        ("POST", "/api/permissions") => call(app, body, |v| {
            Ok(Request::SetPermissions {
                agent: str_field(v, "agent")?,
                tool_groups: list_field(v, "tool_groups")?,
                capabilities: list_field(v, "capabilities")?,
            })
        }),
        (_, "/" | "/api/hive" | "/events") => Reply::method_not_allowed(&["GET"]),
        (
            _,
            "/api/send" | "/api/answer" | "/api/approve" | "/api/deny" | "/api/read"
            | "/api/permissions",
        ) => Reply::method_not_allowed(&["POST"]),
        _ => Reply::not_found(),
    }
}

fn str_field(v: &Value, k: &str) -> Result<String, String> {
    v.get(k)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| format!("missing string field {k:?}"))
}

fn int_field(v: &Value, k: &str) -> Result<i64, String> {
    v.get(k)
        .and_then(Value::as_i64)
        .ok_or_else(|| format!("missing integer field {k:?}"))
}

fn list_field(v: &Value, k: &str) -> Result<Vec<String>, String> {
    v.get(k)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .ok_or_else(|| format!("missing array field {k:?}"))
}

/// Parses the JSON body, builds the request and forwards it as the operator.
fn call(app: &App, body: &[u8], make: impl FnOnce(&Value) -> Result<Request, String>) -> Reply {
    let v: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Reply::error(400, format!("the body must be JSON: {e}")),
    };
    let req = match make(&v) {
        Ok(r) => r,
        Err(e) => return Reply::error(400, e),
    };
    match host(app).and_then(|mut c| c.call(&req).map_err(|e| e.to_string())) {
        Ok(mut map) => {
            map.insert("ok".into(), Value::Bool(true));
            Reply::json(200, &Value::Object(map))
        }
        Err(e) => Reply::error(400, e),
    }
}

fn host(app: &App) -> Result<Client, String> {
    let c = Client::connect(&app.host_socket).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(15)))
        .map_err(|e| e.to_string())?;
    Ok(c)
}

/// The whole hive as the page draws it.
fn snapshot(app: &App) -> Value {
    let mut c = match host(app) {
        Ok(c) => c,
        Err(e) => return json!({ "error": e }),
    };
    let mut get = |req: Request| -> Value {
        c.call(&req)
            .map(Value::Object)
            .unwrap_or_else(|e| json!({ "error": e.to_string() }))
    };
    let agents = get(Request::Agents {});
    let sup = get(Request::Supervision {});
    let questions = get(Request::Questions {});
    let approvals = get(Request::Approvals {});
    let inbox = get(Request::Inbox {
        wait_seconds: None,
        peek: true,
        after: None,
    });
    let sup_rows = sup["agents"].as_array().cloned().unwrap_or_default();
    let mut cards = Vec::new();
    for row in agents["agents"].as_array().cloned().unwrap_or_default() {
        let name = row["name"].as_str().unwrap_or_default().to_string();
        let s = sup_rows
            .iter()
            .find(|s| s["name"] == name.as_str())
            .cloned()
            .unwrap_or(Value::Null);
        let mut card = row.clone();
        card["supervision"] = s.clone();
        if let Some(port) = s["port"].as_u64() {
            let base = format!("http://127.0.0.1:{port}");
            // The agent's own token, else the one every agent inherits from hive up.
            let token = s["applied"]["env"]["HIVE_WEB_TOKEN"]
                .as_str()
                .map(str::to_string)
                .or_else(|| std::env::var("HIVE_WEB_TOKEN").ok())
                .filter(|t| !t.trim().is_empty());
            let fetch = |path: &str| -> Value {
                let mut r = app.http.get(&format!("{base}{path}"));
                if let Some(t) = &token {
                    r = r.set("X-Hive-Token", t);
                }
                r.call()
                    .ok()
                    .and_then(|r| r.into_json::<Value>().ok())
                    .unwrap_or(Value::Null)
            };
            card["live"] = fetch("/api/state");
            card["links"] = fetch("/api/dashboard-links");
            card["url"] = json!(format!("{base}/"));
        }
        cards.push(card);
    }
    json!({
        "agents": cards,
        "questions": questions["questions"],
        "approvals": approvals["approvals"],
        "inbox": inbox["messages"],
        "groups": crate::groups::ToolGroup::ALL.map(|g| g.name()),
        "capabilities": crate::groups::CAPABILITIES,
    })
}

/// `GET /events`: the snapshot, again whenever it changes, with pings between.
fn events(app: &Arc<App>, req: tiny_http::Request) {
    let taken = app
        .clients
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
            (n < MAX_SSE_CLIENTS).then_some(n + 1)
        })
        .is_ok();
    if !taken {
        let r = Reply::error(
            503,
            "too many live dashboard clients; close a tab and retry",
        );
        let _ = req.respond(r.into_response());
        return;
    }
    let app = app.clone();
    let mut w = req.into_writer();
    let spawned = std::thread::Builder::new()
        .name("dashboard-sse".into())
        .spawn(move || {
            let result = (|| -> std::io::Result<()> {
                w.write_all(crate::web::sse::HEAD.as_bytes())?;
                w.write_all(b"retry: 2000\n\n")?;
                w.flush()?;
                let mut last = String::new();
                let mut last_write = Instant::now();
                while !app.stop.load(Ordering::Relaxed) {
                    let now = snapshot(&app).to_string();
                    if now != last {
                        w.write_all(format!("data: {now}\n\n").as_bytes())?;
                        w.flush()?;
                        last = now;
                        last_write = Instant::now();
                    } else if last_write.elapsed() > Duration::from_secs(15) {
                        w.write_all(b": ping\n\n")?;
                        w.flush()?;
                        last_write = Instant::now();
                    }
                    std::thread::sleep(app.cfg.poll);
                }
                Ok(())
            })();
            if let Err(e) = result {
                log::debug!("dashboard SSE client dropped: {e}");
            }
            app.clients.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = spawned {
        log::warn!("cannot start a dashboard SSE thread: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_embedded_and_self_contained() {
        assert!(PAGE.contains("<title>"));
        assert!(
            !PAGE.contains("http://") && !PAGE.contains("https://"),
            "no CDN"
        );
    }

    #[test]
    fn a_token_guards_every_endpoint_but_login() {
        let cfg = DashConfig {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: 0,
            token: Some("s3cret".into()),
            poll: Duration::from_millis(100),
        };
        let d = start(PathBuf::from("/nonexistent/host.sock"), cfg).unwrap();
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
    }

    #[test]
    fn bodies_need_their_fields() {
        assert!(str_field(&json!({"to": 1}), "to").is_err());
        assert_eq!(int_field(&json!({"id": 3}), "id"), Ok(3));
        assert_eq!(
            list_field(&json!({"g": ["a", "b"]}), "g").unwrap(),
            vec!["a", "b"]
        );
    }
}
