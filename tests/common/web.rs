//! Test kit for the web UI: `web::start` in-process on a free port with a bus the
//! test drives itself, [`Page`] for any running page (its port and token, read
//! from the state dir like a script would), plus small HTTP clients (ureq for
//! plain requests, raw TCP for paths ureq would normalise and for reading SSE).
//! The free functions send no token; the methods of [`Web`] and [`Page`] send
//! the page's. Every read has a timeout.

use super::hive::TempDir;
use crossbeam_channel::{unbounded, Receiver};
use hyperhive::harness::bus::Bus;
use hyperhive::harness::control::{Control, Shared};
use hyperhive::harness::settings::Settings;
use hyperhive::http::server::Timeouts;
use hyperhive::web::{self, WebConfig, WebHandle};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Web {
    pub dir: TempDir,
    pub bus: Bus,
    pub shared: Shared,
    pub control: Receiver<Control>,
    pub handle: Option<WebHandle>,
    pub port: u16,
    /// The page's token (None with `auth` off).
    pub token: Option<String>,
}

/// Settings on temp dirs, without reading anything a developer's shell set.
pub fn settings(dir: &TempDir) -> Settings {
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let mut s = Settings::resolve(&state, &dir.path().join("run")).expect("settings");
    s.label = "ana".into();
    s.model_file = state.join("hyperhive-model");
    s.socket = dir.path().join("no-broker.sock");
    s.claude_config_dir = dir.path().join("claude");
    // No claude: a token's check cannot run, so it is stored unverified.
    s.claude_bin = dir.path().join("no-claude").display().to_string();
    s
}

impl Web {
    pub fn start() -> Web {
        Web::start_with(|_, _| {})
    }

    /// Starts with a test config (port 0, short timeouts) changed by `f`.
    pub fn start_with(f: impl FnOnce(&mut WebConfig, &mut Settings)) -> Web {
        let dir = TempDir::new("web");
        let mut s = settings(&dir);
        let mut cfg = WebConfig {
            port: 0,
            sse_ping: Duration::from_secs(1),
            timeouts: Timeouts {
                read: Duration::from_secs(5),
                send: Duration::from_secs(2),
            },
            ..WebConfig::default()
        };
        f(&mut cfg, &mut s);
        // The page reaches the broker the way the settings say: a test that
        // points `socket` at a broker means that one.
        if let hyperhive::proto::Dial::Socket(_) = s.broker {
            s.broker = hyperhive::proto::Dial::Socket(s.socket.clone());
        }
        let bus = Bus::new("ana", "ana@hive", "haiku", 200_000);
        let (tx, control) = unbounded();
        let shared = Shared::new(bus.clone(), tx, Arc::new(s));
        let explicit = cfg.token.clone().filter(|_| cfg.auth);
        let handle = web::start(shared.clone(), cfg).expect("web::start");
        let port = handle.port();
        let token = explicit.or_else(|| read_token(&shared.settings.state_dir));
        Web {
            dir,
            bus,
            shared,
            control,
            handle: Some(handle),
            port,
            token,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn state_dir(&self) -> std::path::PathBuf {
        self.shared.settings.state_dir.clone()
    }

    /// The page as a client sees it.
    pub fn page(&self) -> Page {
        Page {
            port: self.port,
            token: self.token.clone(),
            prefix: String::new(),
        }
    }

    pub fn get(&self, path: &str) -> Resp {
        self.page().get(path)
    }

    pub fn post(&self, path: &str, body: &str) -> Resp {
        self.page().post(path, body)
    }

    pub fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Resp {
        self.page().call(method, path, headers, body)
    }

    pub fn sse(&self, path: &str, headers: &[(&str, &str)]) -> Sse {
        self.page().sse(path, headers)
    }

    pub fn raw_get(&self, path: &str) -> (u16, String) {
        self.page().raw(path)
    }
}

/// Logs a browser in to `page` through its login form (typing the token as a
/// user would) and waits until it shows the page.
pub fn browser_login(d: &super::browser::Driver, page: &Page) {
    d.goto(&page.url("/login"));
    let token = page.token.as_deref().expect("the page's token");
    d.type_into("input[name=token]", &format!("{token}\u{E007}"));
    super::hive::wait_for(
        Duration::from_secs(20),
        "the login to reach the page",
        || {
            let path = d.js("return location.pathname");
            (path == "/").then_some(())
        },
    );
}

/// The token a page generated into its state dir, if any.
pub fn read_token(state_dir: &Path) -> Option<String> {
    std::fs::read_to_string(state_dir.join(hyperhive::http::auth::PAGE_TOKEN_FILE))
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
}

/// A running page as a script finds it: the port from `STATE/hyperhive-port`,
/// the token from `STATE/web-token` (or the one given).
#[derive(Debug, Clone)]
pub struct Page {
    pub port: u16,
    pub token: Option<String>,
    /// Where the page's paths start on that port: "" for a `hive serve` of
    /// its own, `/agent/NAME` for an agent of `hive up`.
    pub prefix: String,
}

impl Page {
    /// Waits for the page of the harness whose state dir is `state_dir`.
    pub fn of(state_dir: &Path) -> Page {
        let f = state_dir.join("hyperhive-port");
        let port = super::hive::wait_for(Duration::from_secs(20), "the web port file", || {
            std::fs::read_to_string(&f).ok()?.trim().parse().ok()
        });
        Page {
            port,
            token: read_token(state_dir),
            prefix: String::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}{path}", self.port, self.prefix)
    }

    /// `headers` plus the token header.
    fn with_token<'a>(&'a self, headers: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
        let mut h = headers.to_vec();
        if let Some(t) = &self.token {
            h.push(("X-Hive-Token", t.as_str()));
        }
        h
    }

    pub fn get(&self, path: &str) -> Resp {
        self.call("GET", path, &[], None)
    }

    /// A GET that may fail to connect (a page out of descriptors).
    pub fn try_get(&self, path: &str) -> Option<Resp> {
        try_call("GET", &self.url(path), &self.with_token(&[]), None).ok()
    }

    /// A POST with a JSON body, as the page's own script sends it.
    pub fn post(&self, path: &str, body: &str) -> Resp {
        self.call(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            Some(body),
        )
    }

    pub fn call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Resp {
        call(method, &self.url(path), &self.with_token(headers), body)
    }

    pub fn sse(&self, path: &str, headers: &[(&str, &str)]) -> Sse {
        Sse::connect(
            self.port,
            &format!("{}{path}", self.prefix),
            &self.with_token(headers),
        )
    }

    /// A raw GET with the path exactly as given (after the prefix).
    pub fn raw(&self, path: &str) -> (u16, String) {
        let path = format!("{}{path}", self.prefix);
        raw_request(self.port, "GET", &path, &self.with_token(&[]), "")
    }

    pub fn raw_request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let path = format!("{}{path}", self.prefix);
        raw_request(self.port, method, &path, &self.with_token(headers), body)
    }
}

/// One HTTP answer.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// A request with ureq; any status comes back as a [`Resp`].
pub fn call(method: &str, url: &str, headers: &[(&str, &str)], body: Option<&str>) -> Resp {
    try_call(method, url, headers, body).unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// Like [`call`]; a connection that fails is an error, not a panic.
pub fn try_call(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Result<Resp, String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .redirects(0)
        .build();
    let mut r = agent.request(method, url);
    for (k, v) in headers {
        r = r.set(k, v);
    }
    let res = match body {
        Some(b) => r.send_string(b),
        None => r.call(),
    };
    let resp = match res {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return Err(e.to_string()),
    };
    let status = resp.status();
    let headers = resp
        .headers_names()
        .into_iter()
        .map(|n| {
            let v = resp.header(&n).unwrap_or("").to_string();
            (n, v)
        })
        .collect();
    let body = resp.into_string().unwrap_or_default();
    Ok(Resp {
        status,
        body,
        headers,
    })
}

pub fn get(url: &str) -> Resp {
    call("GET", url, &[], None)
}

pub fn post(url: &str, body: &str) -> Resp {
    call(
        "POST",
        url,
        &[("Content-Type", "application/json")],
        Some(body),
    )
}

/// A raw GET with the path sent exactly as given; returns (status, body).
pub fn raw_get(port: u16, path: &str) -> (u16, String) {
    raw_request(port, "GET", path, &[], "")
}

/// One HTTP/1.1 request written by hand (the path exactly as given, any headers
/// and body), on a fresh connection; returns (status, body).
pub fn raw_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line for {method} {path}: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// One parsed SSE event.
#[derive(Debug, Clone)]
pub struct Event {
    pub id: Option<u64>,
    pub name: Option<String>,
    pub data: String,
}

impl Event {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.data).unwrap()
    }
}

/// A raw SSE client.
pub struct Sse {
    pub status: u16,
    reader: BufReader<TcpStream>,
    pub pings: usize,
}

impl Sse {
    pub fn connect(port: u16, path: &str, headers: &[(&str, &str)]) -> Sse {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut req = format!(
            "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n"
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut reader = BufReader::new(s);
        let mut line = String::new();
        reader.read_line(&mut line).expect("status line");
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or_else(|| panic!("no status line: {line:?}"));
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
        }
        Sse {
            status,
            reader,
            pings: 0,
        }
    }

    /// The next event (skipping comments and `retry:`), or None after `timeout`
    /// or when the server closes.
    pub fn next(&mut self, timeout: Duration) -> Option<Event> {
        let end = Instant::now() + timeout;
        let (mut id, mut name, mut data) = (None, None, None::<String>);
        let mut line = String::new();
        loop {
            let left = end.checked_duration_since(Instant::now())?;
            self.reader
                .get_ref()
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .ok()?;
            line.clear();
            match self.reader.read_line(&mut line) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(_) => return None,
            }
            let l = line.trim_end_matches(['\r', '\n']);
            if l.is_empty() {
                if let Some(data) = data.take() {
                    return Some(Event { id, name, data });
                }
                continue;
            }
            if l.starts_with(':') {
                self.pings += 1;
            } else if let Some(v) = l.strip_prefix("id: ") {
                id = v.parse().ok();
            } else if let Some(v) = l.strip_prefix("event: ") {
                name = Some(v.to_string());
            } else if let Some(v) = l.strip_prefix("data: ") {
                data = Some(v.to_string());
            }
        }
    }

    /// The next `n` events, panicking when they do not come within `timeout`.
    pub fn take(&mut self, n: usize, timeout: Duration) -> Vec<Event> {
        let end = Instant::now() + timeout;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let left = end
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("only {} of {n} events in {timeout:?}", out.len()));
            match self.next(left) {
                Some(e) => out.push(e),
                None => panic!(
                    "only {} of {n} events in {timeout:?}; last id {:?}",
                    out.len(),
                    out.last().and_then(|e: &Event| e.id)
                ),
            }
        }
        out
    }
}

/// The lines a live-stream client receives (a raw socket, a child's stdout,
/// a body through a proxy), read on a thread of their own so every wait has a
/// timeout whatever the client is.
pub struct Lines {
    rx: Receiver<String>,
}

impl Lines {
    pub fn spawn(r: impl Read + Send + 'static) -> Lines {
        let (tx, rx) = unbounded();
        std::thread::spawn(move || {
            for line in BufReader::new(r).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines { rx }
    }

    /// The next line (without its line end), or None after `timeout` or at the
    /// end of the stream.
    pub fn next(&self, timeout: Duration) -> Option<String> {
        self.rx
            .recv_timeout(timeout)
            .ok()
            .map(|l| l.trim_end_matches('\r').to_string())
    }

    /// Waits (at most `timeout`) for the first line that `pred` takes.
    pub fn wait(&self, timeout: Duration, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + timeout;
        loop {
            let left = end
                .checked_duration_since(Instant::now())
                .unwrap_or_else(|| panic!("no {what} within {timeout:?}"));
            match self.next(left) {
                Some(l) if pred(&l) => return l,
                Some(_) => {}
                None => panic!("no {what} within {timeout:?}: the stream ended or stalled"),
            }
        }
    }

    /// Waits for the `data:` events of one turn of the agent page's stream: the
    /// `turn_start` of the message whose body is `body`, then its `turn_end`,
    /// which it returns.
    pub fn turn_end_of(&self, body: &str, timeout: Duration) -> serde_json::Value {
        let end = Instant::now() + timeout;
        let event = |l: &str| -> Option<serde_json::Value> {
            serde_json::from_str(l.strip_prefix("data: ")?).ok()
        };
        self.wait(timeout, &format!("the turn_start of {body:?}"), |l| {
            event(l).is_some_and(|v| v["type"] == "turn_start" && v["body"] == body)
        });
        let left = end.saturating_duration_since(Instant::now());
        let l = self.wait(left, &format!("the turn_end of {body:?}"), |l| {
            event(l).is_some_and(|v| v["type"] == "turn_end")
        });
        event(&l).unwrap()
    }
}
