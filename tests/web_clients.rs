//! The live stream for every kind of HTTP client (issue 38, item 4): a client
//! that sends `Connection: close` (Python's urllib) or speaks HTTP/1.0 gets a
//! close-delimited stream and every later event, not only the replay; so does
//! a client behind a real nginx with its default proxy settings, in front of
//! `hive serve`'s page, of `hive up`'s dashboard and of an agent page at its
//! stable path `/agent/NAME/` on `hive up`'s one listener, and of `hive up`
//! behind nginx with TLS (its `web.public_origin`, a `Secure` cookie). Live-stream
//! places are kept per login session, not per address, so clients behind one
//! proxy do not lock the operator out. Every wait has a timeout.

mod common;

use common::hive::*;
use common::nginx::{free_port, nginx, Nginx, SelfSigned};
use common::up::Up;
use common::web::{Lines, Page};
use std::io::Write;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// A harness for `ana` (its boot turn done) with `env`, and its page.
fn page(env: &[(&str, &str)]) -> (Broker, Harness, Page) {
    let mut all = vec![("HIVE_SSE_PING_SECS", "1")];
    all.extend_from_slice(env);
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &all);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let p = Page::of(&h.state_dir());
    (b, h, p)
}

/// A child process that is killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Python's urllib reading `url` line by line (it sends `Connection: close`),
/// with `headers`; its lines.
fn urllib(url: &str, headers: &[(&str, &str)]) -> (Killed, Lines) {
    let script = r#"
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers=json.loads(sys.argv[2]))
with urllib.request.urlopen(req, timeout=60) as r:
    print("status", r.status, flush=True)
    for line in r:
        sys.stdout.write(line.decode())
        sys.stdout.flush()
"#;
    let headers: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    let mut child = Command::new("python3")
        .arg("-u")
        .arg("-c")
        .arg(script)
        .arg(url)
        .arg(serde_json::Value::Object(headers).to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3");
    let lines = Lines::spawn(child.stdout.take().unwrap());
    (Killed(child), lines)
}

/// A raw request written as given on a fresh connection; the answer's lines.
fn raw(port: u16, request: &str) -> Lines {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    Lines::spawn(s)
}

/// Sends `body` to ana as the operator once the stream's head has arrived
/// (so the turn starts after the client connected), and waits for its live
/// `turn_end` on `lines`.
fn live_turn(b: &Broker, lines: &Lines, body: &str) {
    lines.wait(T, "the stream's retry line", |l| l == "retry: 2000");
    operator_send(b, "ana", body);
    let end = lines.turn_end_of(body, T);
    assert_eq!(end["ok"], true, "{end}");
}

#[test]
fn urllib_and_http_1_0_clients_get_the_live_stream() {
    let (b, _h, p) = page(&[]);
    let t = p.token.clone().unwrap();

    let (_py, lines) = urllib(
        &p.url("/events"),
        &[("X-Hive-Token", &t), ("Accept", "text/event-stream")],
    );
    assert_eq!(lines.next(T).as_deref(), Some("status 200"));
    live_turn(&b, &lines, "for urllib");
    // And the next turn too: the stream goes on.
    operator_send(&b, "ana", "for urllib again");
    lines.turn_end_of("for urllib again", T);

    let http10 = raw(
        p.port,
        &format!(
            "GET /events HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nX-Hive-Token: {t}\r\n\r\n",
            p.port
        ),
    );
    let status = http10.next(T).unwrap();
    assert!(status.ends_with(" 200 OK"), "{status}");
    live_turn(&b, &http10, "for HTTP/1.0");

    let close = raw(
        p.port,
        &format!(
            "GET /events HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\
             X-Hive-Token: {t}\r\n\r\n",
            p.port
        ),
    );
    live_turn(&b, &close, "for Connection: close");
}

/// A GET with ureq (HTTP/1.1 with keep-alive; through nginx the answer comes
/// chunked); the status and the body's lines.
fn stream(url: &str, headers: &[(&str, &str)]) -> (u16, Lines) {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(10))
        .timeout_read(T)
        .redirects(0)
        .build();
    stream_with(&agent, url, headers)
}

/// [`stream`] with `agent` (one that trusts a test's certificate).
fn stream_with(agent: &ureq::Agent, url: &str, headers: &[(&str, &str)]) -> (u16, Lines) {
    let mut r = agent.get(url);
    for (k, v) in headers {
        r = r.set(k, v);
    }
    match r.call() {
        Ok(resp) | Err(ureq::Error::Status(_, resp)) => {
            (resp.status(), Lines::spawn(resp.into_reader()))
        }
        Err(e) => panic!("GET {url}: {e}"),
    }
}

/// Logs in to the page whose token is `token` through `base` (a browser's
/// form post): its cookie, `NAME=SESSION`.
fn log_in(base: &str, token: &str) -> String {
    let r = ureq::AgentBuilder::new()
        .redirects(0)
        .build()
        .post(&format!("{base}/login"))
        .set("Content-Type", "application/x-www-form-urlencoded")
        .send_string(&format!("token={token}"))
        .unwrap_or_else(|e| panic!("POST /login: {e}"));
    assert_eq!(r.status(), 303);
    let set = r.header("Set-Cookie").expect("a cookie").to_string();
    let cookie = set.split(';').next().unwrap().to_string();
    assert!(
        !cookie.contains(token),
        "the cookie holds a session, not the token"
    );
    cookie
}

/// ana's page behind its own nginx (the `Host` it forwards is listed in
/// `HIVE_WEB_HOSTS`, as `docs/fleet.md` says), the page's token and its
/// stream's URL through nginx.
struct Behind {
    b: Broker,
    _h: Harness,
    p: Page,
    n: Nginx,
    token: String,
    events: String,
}

/// [`Behind`], or None after a SKIPPED line.
fn page_behind_nginx() -> Option<Behind> {
    let bin = nginx()?;
    let port = free_port();
    let (b, h, p) = page(&[("HIVE_WEB_HOSTS", &format!("127.0.0.1:{port}"))]);
    let n = Nginx::start(&bin, port, p.port);
    let (token, events) = (p.token.clone().unwrap(), format!("{}/events", n.base()));
    Some(Behind {
        b,
        _h: h,
        p,
        n,
        token,
        events,
    })
}

#[test]
fn a_stream_through_nginx_carries_every_later_turn() {
    let Some(x) = page_behind_nginx() else {
        return;
    };
    let (b, n, t, url) = (&x.b, &x.n, x.token.as_str(), x.events.as_str());
    let (status, lines) = stream(url, &[("X-Hive-Token", t)]);
    assert_eq!(status, 200, "{}", n.log());
    live_turn(b, &lines, "through nginx");
    operator_send(b, "ana", "through nginx again");
    lines.turn_end_of("through nginx again", T);

    // urllib through nginx too (Connection: close on both legs).
    let (_py, py) = urllib(url, &[("X-Hive-Token", t)]);
    assert_eq!(py.next(T).as_deref(), Some("status 200"));
    live_turn(b, &py, "urllib through nginx");
}

#[test]
fn eight_streams_through_nginx_leave_the_operator_its_own() {
    let Some(x) = page_behind_nginx() else {
        return;
    };
    let (b, p, n) = (&x.b, &x.p, &x.n);
    let (t, url) = (x.token.as_str(), x.events.as_str());
    // Eight scripts with the token: all from nginx's address, one client.
    let scripts: Vec<Lines> = (0..8)
        .map(|_| {
            let (status, lines) = stream(url, &[("X-Hive-Token", t)]);
            assert_eq!(status, 200);
            lines.wait(T, "the stream's retry line", |l| l == "retry: 2000");
            lines
        })
        .collect();
    wait_for(T, "eight live clients", || {
        p.get("/metrics")
            .body
            .contains("\nhive_sse_clients 8\n")
            .then_some(())
    });
    // A ninth from that address is one too many (HIVE_SSE_MAX_PER_PEER).
    let (status, refused) = stream(url, &[("X-Hive-Token", t)]);
    assert_eq!(status, 503);
    let why = refused.next(T).unwrap_or_default();
    assert!(
        why.contains("too many live clients from 127.0.0.1"),
        "{why}"
    );

    // The operator's browser logs in through nginx: a session of its own.
    let cookie = log_in(&n.base(), t);
    let (status, operator) = stream(url, &[("Cookie", &cookie)]);
    assert_eq!(status, 200, "the operator's stream beside eight scripts");
    live_turn(b, &operator, "for everyone");
    for s in &scripts {
        s.turn_end_of("for everyone", T);
    }
}

#[test]
fn the_dashboard_streams_through_nginx() {
    let Some(bin) = nginx() else {
        return;
    };
    use hyperhive::proto::cmd::Ask;
    let port = free_port();
    let up = Up::start_env(
        r#"{"agents": [{"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}]}"#,
        &["ana"],
        &[
            ("HIVE_DASHBOARD_HOSTS", &format!("127.0.0.1:{port}")),
            ("HIVE_DASHBOARD_POLL_MS", "100"),
        ],
    );
    let dash = up.dashboard();
    let n = Nginx::start(&bin, port, dash.port);
    let (status, lines) = stream(
        &format!("{}/events", n.base()),
        &[("X-Hive-Token", &dash.token)],
    );
    assert_eq!(status, 200, "{}", n.log());
    lines.wait(T, "the first snapshot", |l| l.starts_with("data: {"));
    // A change after the client connected reaches it.
    ok(
        &mut up.agent("ana"),
        Ask {
            question: "Ship it through the proxy?".into(),
            options: vec!["yes".into(), "no".into()],
            multi: false,
            ttl_seconds: None,
            to: None,
        },
    );
    lines.wait(T, "a snapshot with ana's question", |l| {
        l.starts_with("data: {") && l.contains("Ship it through the proxy?")
    });
}

/// An agent's page of `hive up`, at its stable path `/agent/ana/` on the
/// hive's one listener, behind nginx: ureq and urllib (with the agent's own
/// token, which opens that prefix alone) each get the live `turn_end` of a
/// turn that starts after they connected, relayed by `hive up` from the
/// harness's socket and on through nginx.
#[test]
fn an_agent_page_of_hive_up_streams_through_nginx() {
    let Some(bin) = nginx() else {
        return;
    };
    let port = free_port();
    let up = Up::start_env(
        r#"{"agents": [{"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}]}"#,
        &["ana"],
        &[
            ("HIVE_DASHBOARD_HOSTS", &format!("127.0.0.1:{port}")),
            ("HIVE_SSE_PING_SECS", "1"),
        ],
    );
    up.wait_prompt("ana", "(re)started", 1);
    let page = up.page("ana");
    let n = Nginx::start(&bin, port, page.port);
    let token = page.token.clone().unwrap();
    let url = format!("{}/agent/ana/events", n.base());
    let send = |body: &str| {
        ok(
            &mut up.host(),
            hyperhive::proto::cmd::Send {
                to: "ana".into(),
                body: body.into(),
                in_reply_to: None,
                receipt: false,
                traceparent: None,
            },
        );
    };
    let (status, lines) = stream(&url, &[("X-Hive-Token", &token)]);
    assert_eq!(status, 200, "{}", n.log());
    lines.wait(T, "the stream's retry line", |l| l == "retry: 2000");
    send("to ana through hive up and nginx");
    let end = lines.turn_end_of("to ana through hive up and nginx", T);
    assert_eq!(end["ok"], true, "{end}");

    let (_py, py) = urllib(&url, &[("X-Hive-Token", &token)]);
    assert_eq!(py.next(T).as_deref(), Some("status 200"));
    py.wait(T, "the stream's retry line", |l| l == "retry: 2000");
    send("to ana for urllib through nginx");
    py.turn_end_of("to ana for urllib through nginx", T);
}

/// `hive up` behind nginx with TLS, with the config `docs/fleet.md` shows
/// (`Nginx::start_tls`: a self-signed certificate for 127.0.0.1, which the
/// client trusts alone). The fleet file's `web.public_origin` is nginx's https
/// origin, and that is all the hive needs to answer through it (no
/// `HIVE_DASHBOARD_HOSTS`): the login link `hive up` prints is on that origin
/// and sets a `Secure` cookie, the dashboard answers through the proxy with
/// it, a change is taken from that origin and refused from any other, and an
/// agent page's live stream carries the turn of a message sent after the
/// client connected.
#[test]
fn hive_up_behind_nginx_over_tls() {
    let Some(bin) = nginx() else {
        return;
    };
    let Some(tls) = SelfSigned::make() else {
        return;
    };
    let port = free_port();
    let origin = format!("https://127.0.0.1:{port}");
    let up = Up::start_env(
        &format!(
            r#"{{"web": {{"listen": "127.0.0.1:0", "public_origin": "{origin}"}},
                "agents": [{{"name": "ana", "env": {{"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}}}]}}"#
        ),
        &["ana"],
        &[("HIVE_SSE_PING_SECS", "1")],
    );
    up.wait_prompt("ana", "(re)started", 1);
    let dash = up.dashboard();
    let n = Nginx::start_tls(&bin, port, dash.port, &tls);
    let https = tls.agent();

    // The operator follows the printed link: on the proxy's origin, and its
    // cookie goes over https only.
    let link = up.login_link();
    assert!(link.starts_with(&format!("{origin}/login?code=")), "{link}");
    let r = https
        .get(&link)
        .call()
        .unwrap_or_else(|e| panic!("GET {link}: {e}; nginx: {}", n.log()));
    assert_eq!(r.status(), 303);
    assert_eq!(r.header("Location"), Some("/"));
    let set = r.header("Set-Cookie").expect("a cookie").to_string();
    let attrs: Vec<&str> = set.split("; ").collect();
    for want in ["Path=/", "HttpOnly", "SameSite=Strict", "Secure"] {
        assert!(attrs.contains(&want), "{want} missing: {set}");
    }
    let cookie = attrs[0].to_string();

    // The dashboard and its API answer through the proxy.
    let get = |path: &str| {
        https
            .get(&format!("{origin}{path}"))
            .set("Cookie", &cookie)
            .call()
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
    };
    let page = get("/");
    assert_eq!(page.content_type(), "text/html");
    let html = page.into_string().unwrap();
    assert!(html.contains("<title>hive — operator dashboard</title>"));
    let hive: serde_json::Value = get("/api/hive").into_json().unwrap();
    assert_eq!(hive["agents"][0]["name"], "ana", "{hive}");

    // A change from the proxy's origin is taken, from any other refused.
    let send = |from: &str, body: &str| -> (u16, String) {
        let r = https
            .post(&format!("{origin}/api/send"))
            .set("Cookie", &cookie)
            .set("Content-Type", "application/json")
            .set("Origin", from)
            .send_string(&serde_json::json!({"to": "ana", "body": body}).to_string());
        match r {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => panic!("POST /api/send: {e}"),
        }
    };
    let listener = format!("http://127.0.0.1:{}", dash.port);
    for other in ["https://evil.example", "https://127.0.0.1:1", &listener] {
        let (status, why) = send(other, "from elsewhere");
        assert_eq!(status, 403, "Origin {other}: {why}");
    }

    // ana's live stream through the proxy, with the same cookie, carries the
    // turn of a message sent (from the proxy's origin) after it connected.
    let events = format!("{origin}/agent/ana/events");
    let (status, lines) = stream_with(&https, &events, &[("Cookie", &cookie)]);
    assert_eq!(status, 200, "{}", n.log());
    lines.wait(T, "the stream's retry line", |l| l == "retry: 2000");
    let (status, why) = send(&origin, "to ana over TLS");
    assert_eq!(status, 200, "{why}");
    let end = lines.turn_end_of("to ana over TLS", T);
    assert_eq!(end["ok"], true, "{end}");
    assert_eq!(up.prompts_with("ana", "from elsewhere"), 0);
}

/// The two nginx configs `docs/fleet.md` shows are the ones the tests run
/// (`nginx::server`), with its ports and placeholder paths, comments aside.
#[test]
fn the_nginx_configs_in_the_docs_are_the_tested_ones() {
    use common::nginx::{listen, server, tls_listen};
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/fleet.md")).unwrap();
    let shown: Vec<String> = doc
        .split("```nginx\n")
        .skip(1)
        .map(|b| {
            let block = b.split("```").next().unwrap();
            block
                .lines()
                .map(|l| l.split('#').next().unwrap().trim_end())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    let tested = |listen: &str| {
        server(listen, 7890)
            .lines()
            .map(|l| l.strip_prefix("    ").unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let tls = tls_listen(
        8443,
        Path::new("/path/to/cert.pem"),
        Path::new("/path/to/key.pem"),
    );
    assert_eq!(shown, [tested(&listen(8080)), tested(&tls)]);
}
