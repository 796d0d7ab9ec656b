//! The per-agent web UI over real HTTP: `web::start` in-process with a bus the
//! test drives the way the turn loop will, and a real broker for `/api/send`.

mod common;

use common::hive::{wait_for, Broker};
use common::web::{call, get, post, Sse, Web};
use hyperhive::harness::bus::{LiveEvent, TurnState};
use hyperhive::harness::control::Control;
use hyperhive::harness::stats::{Stats, TurnRow};
use hyperhive::proto::cmd::{RecvNext, RecvNextReply};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);

fn turn(web: &Web, body: &str, text: &str) {
    web.bus.emit(LiveEvent::TurnStart {
        from: "operator".into(),
        body: body.into(),
        unread: 0,
        message_id: Some(1),
    });
    web.bus.emit(LiveEvent::Stream {
        value: json!({"type":"assistant","message":{"content":[{"type":"text","text":text}]}}),
    });
    web.bus.emit(LiveEvent::TurnEnd {
        ok: true,
        note: String::new(),
        outcome: "ok".into(),
        duration_ms: 1200,
        decision: None,
    });
}

fn row(outcome: &str, ms: u64) -> TurnRow {
    TurnRow {
        id: 0,
        started_at: 1_700_000_000,
        duration_ms: ms,
        kind: "turn".into(),
        outcome: outcome.into(),
        model: "haiku".into(),
        sender: "operator".into(),
        message_id: Some(1),
        context_tokens: Some(1000),
        tokens_in: 100,
        tokens_out: 20,
        cost_usd: 0.01,
        session_id: None,
        note: String::new(),
    }
}

#[test]
fn state_shows_exactly_the_documented_keys_and_follows_the_bus() {
    let web = Web::start();
    let port_file = std::fs::read_to_string(web.state_dir().join("hyperhive-port")).unwrap();
    assert_eq!(port_file.trim(), web.port.to_string());

    let s = web.get("/api/state").json();
    let mut keys: Vec<&str> = s.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    let mut want = vec![
        "label",
        "qualified_label",
        "turn_state",
        "turn_state_since",
        "online",
        "rate_limited",
        "rate_limited_until",
        "needs_login",
        "paused",
        "retrying",
        "model",
        "model_override",
        "model_default",
        "context_window_tokens",
        "context_tokens",
        "context_percent",
        "unread",
        "inflight",
        "status_text",
        "session_id",
        "last_outcome",
    ];
    want.sort_unstable();
    assert_eq!(keys, want);
    assert_eq!(s["turn_state"], "idle");

    web.bus.set_turn_state(TurnState::Thinking);
    web.bus.update(|s| {
        s.context_tokens = Some(50_000);
        s.rate_limited = true;
        s.rate_limited_until = Some(1_900_000_000);
    });
    let s = web.get("/api/state").json();
    assert_eq!(s["turn_state"], "thinking");
    assert_eq!(s["context_percent"], 25.0);
    assert_eq!(s["rate_limited_until"], 1_900_000_000);
    web.bus.set_turn_state(TurnState::Compacting);
    assert_eq!(web.get("/api/state").json()["turn_state"], "compacting");
}

#[test]
fn control_endpoints_reach_the_loop_and_bad_requests_are_explained() {
    // The page's model choice is the broker's to keep: a broker serves ana.
    let b = Broker::start(&["ana"]);
    b.agent("ana");
    let sock = b.agent_socket("ana");
    let web = Web::start_with(|_, s| {
        s.socket = sock.clone();
        s.default_model = "haiku".into();
    });
    let r = web.post("/api/model", r#"{"model":"sonnet"}"#);
    assert_eq!(
        (
            r.status,
            r.json()["model"].clone(),
            r.json()["override"].clone()
        ),
        (200, json!("sonnet"), json!(true))
    );
    // The turn loop is the one writer of the state: the page tells it.
    assert_eq!(
        web.control.recv_timeout(T).unwrap(),
        Control::Model("sonnet".into())
    );
    assert_eq!(web.shared.model(), "sonnet", "kept for the next turn");
    let s = web.get("/api/state").json();
    assert_eq!(
        (s["model_override"].clone(), s["model_default"].clone()),
        (json!("sonnet"), json!("haiku")),
        "the page shows the override as such"
    );
    // `/model --fleet`: back to the configured one.
    let r = web.post("/api/model", r#"{"fleet":true}"#);
    assert_eq!(
        (
            r.status,
            r.json()["model"].clone(),
            r.json()["override"].clone()
        ),
        (200, json!("haiku"), json!(false))
    );
    assert_eq!(
        web.control.recv_timeout(T).unwrap(),
        Control::Model("haiku".into())
    );
    assert_eq!(web.shared.model(), "haiku");
    assert!(web.get("/api/state").json()["model_override"].is_null());

    assert_eq!(web.post("/api/new-session", "").status, 200);
    assert!(web.shared.take_skip_continue());
    assert_eq!(web.post("/api/compact", "").status, 200);
    assert_eq!(web.control.recv_timeout(T).unwrap(), Control::Compact);
    assert_eq!(web.post("/api/interrupt", "").status, 200);
    assert_eq!(web.control.recv_timeout(T).unwrap(), Control::Interrupt);

    let cases: &[(&str, &str, Option<&str>, u16, &str)] = &[
        ("POST", "/api/model", Some("not json"), 400, "JSON object"),
        ("POST", "/api/model", Some(r#"{"model":5}"#), 400, "`model`"),
        (
            "POST",
            "/api/model",
            Some(r#"{"model":"a b"}"#),
            400,
            "not a model name",
        ),
        ("POST", "/api/send", Some(r#"{"text":"hi"}"#), 400, "`body`"),
        ("POST", "/api/login", Some("[]"), 400, "JSON object"),
        ("GET", "/api/turns?limit=abc", None, 400, "limit"),
        ("GET", "/api/turns?limit=0", None, 400, "limit"),
        ("GET", "/api/nope", None, 404, "no such path"),
        ("GET", "/nope.js", None, 404, "no such path"),
        ("GET", "/api/model", None, 405, "POST"),
        ("POST", "/api/state", Some("{}"), 405, "GET"),
        ("DELETE", "/events", None, 405, "GET"),
        ("POST", "/", Some("{}"), 405, "GET"),
    ];
    for (method, path, body, status, says) in cases {
        let r = web.call(method, path, &[("Content-Type", "application/json")], *body);
        assert_eq!(r.status, *status, "{method} {path}: {}", r.body);
        let err = r.json()["error"].as_str().unwrap_or_default().to_string();
        assert!(err.contains(says), "{method} {path}: {err}");
    }
}

#[test]
fn send_goes_to_the_agent_inbox_through_the_broker() {
    let broker = Broker::start(&["ana"]);
    let sock = broker.agent_socket("ana");
    let web = Web::start_with(|_, s| s.socket = sock);
    // The page runs in this process, as in the harness's: the broker takes
    // the page's sender (`web-ui`) only from the process of a harness
    // connection, which this one (reporting the harness's state) is.
    let mut harness = broker.agent("ana");
    let _: hyperhive::proto::Empty = harness
        .call(&hyperhive::proto::cmd::ReportState { paused: None })
        .unwrap();
    let r = web.post("/api/send", r#"{"body":"ship it"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_i64().expect("the stored id");
    let mut a = broker.agent("ana");
    let got: RecvNextReply = a
        .call(&RecvNext {
            wait_seconds: Some(5),
            seen: None,
        })
        .unwrap();
    let m = got.message.expect("a message");
    assert_eq!(
        (m.id, m.from.as_str(), m.body.as_str()),
        (id, "web-ui", "ship it")
    );

    drop(broker);
    let r = web.post("/api/send", r#"{"body":"anyone?"}"#);
    assert_eq!(r.status, 502, "{}", r.body);
    assert!(r.body.contains("no broker"), "{}", r.body);
}

#[test]
fn turns_links_and_icon() {
    let icon_dir = common::hive::TempDir::new("icon");
    let icon = icon_dir.path().join("me.svg");
    std::fs::write(&icon, "<svg id=\"mine\"/>").unwrap();
    let web = Web::start();
    let stats = Stats::open(&web.shared.settings.stats_db()).unwrap();
    for i in 0..3 {
        stats.record(&row("ok", 1000 + i)).unwrap();
    }
    let rows = web.get("/api/turns?limit=2").json();
    assert_eq!(rows.as_array().unwrap().len(), 2);
    assert_eq!(rows[0]["duration_ms"], 1002, "newest first");

    assert_eq!(web.get("/api/dashboard-links").json(), json!([]));
    std::fs::write(
        web.state_dir().join("hyperhive-dashboard-links.json"),
        r#"[{"label":"Stats","icon":"📊","url":"http://localhost:9001/stats"},{"label":"x","url":"javascript:1"}]"#,
    )
    .unwrap();
    let links = web.get("/api/dashboard-links").json();
    assert_eq!(
        links,
        json!([{"label":"Stats","icon":"📊","url":"http://localhost:9001/stats"}])
    );

    let r = web.get("/icon");
    assert_eq!(r.header("content-type"), Some("image/svg+xml"));
    assert!(r.body.starts_with("<svg"));
    let mine = Web::start_with(|c, _| c.icon = Some(icon));
    assert_eq!(mine.get("/icon").body, "<svg id=\"mine\"/>");

    let page = web.get("/");
    assert_eq!(page.status, 200);
    assert!(page.body.contains("EventSource"));
}

#[test]
fn sse_delivers_in_order_and_resumes_without_gaps_or_duplicates() {
    let web = Web::start();
    turn(&web, "hello", "hi there");
    let mut a = web.sse("/events", &[]);
    assert_eq!(a.status, 200);
    let evs = a.take(3, T);
    let kinds: Vec<String> = evs
        .iter()
        .map(|e| e.json()["type"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(kinds, ["turn_start", "stream", "turn_end"]);
    assert_eq!(
        evs.iter().map(|e| e.id.unwrap()).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(evs[0].json()["id"], 1);

    // Live events follow the replay.
    web.bus.note("live");
    assert_eq!(a.take(1, T)[0].id, Some(4));

    // Resume by header and by query.
    let mut b = web.sse("/events", &[("Last-Event-ID", "2")]);
    assert_eq!(
        b.take(2, T)
            .iter()
            .map(|e| e.id.unwrap())
            .collect::<Vec<_>>(),
        [3, 4]
    );
    let mut c = web.sse("/events?last_event_id=3", &[]);
    assert_eq!(c.take(1, T)[0].id, Some(4));

    // A client from an earlier run (ids beyond ours) is told to start afresh.
    let mut d = web.sse("/events", &[("Last-Event-ID", "999")]);
    let first = d.take(2, T);
    assert_eq!(first[0].name.as_deref(), Some("reset"));
    assert_eq!(first[1].id, Some(1));

    // Pings keep an idle stream alive.
    let quiet_until = Instant::now() + Duration::from_millis(1500);
    assert!(c.next(Duration::from_millis(1500)).is_none());
    assert!(Instant::now() >= quiet_until - Duration::from_millis(50));
    assert!(
        c.pings >= 1,
        "no `: ping` in 1.5 s with a 1 s ping interval"
    );
}

#[test]
fn a_reconnect_while_events_flow_misses_nothing_and_repeats_nothing() {
    let web = Web::start();
    let bus = web.bus.clone();
    let emitter = std::thread::spawn(move || {
        for i in 0..400 {
            bus.note(format!("n{i}"));
            if i % 20 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    });
    let mut seen = Vec::new();
    let mut last = None::<u64>;
    // Three short-lived connections, each dropped mid-stream.
    while seen.len() < 400 {
        let hdr = last.map(|l| l.to_string());
        let headers: Vec<(&str, &str)> =
            hdr.iter().map(|l| ("Last-Event-ID", l.as_str())).collect();
        let mut s = web.sse("/events", &headers);
        let want = (400 - seen.len()).min(150);
        for e in s.take(want, T) {
            seen.push(e.id.unwrap());
            last = e.id;
        }
    }
    emitter.join().unwrap();
    assert_eq!(seen, (1..=400).collect::<Vec<u64>>());
}

#[test]
fn a_client_that_never_reads_slows_neither_a_fast_one_nor_the_bus() {
    let web = Web::start();
    // Connects and never reads a byte.
    let stalled = web.sse("/events", &[]);
    let mut fast = web.sse("/events", &[]);
    wait_for(T, "both clients subscribed", || {
        (web.bus.subscriber_count() >= 2).then_some(())
    });
    let big = "x".repeat(32 * 1024);
    let n = 1500;
    let (bus, text) = (web.bus.clone(), big.clone());
    let emitter = std::thread::spawn(move || {
        let mut slowest = Duration::ZERO;
        let start = Instant::now();
        for i in 0..n {
            let t = Instant::now();
            bus.note(format!("{i} {text}"));
            slowest = slowest.max(t.elapsed());
            // About 30 MB/s: far above a real turn, within a debug-build reader.
            std::thread::sleep(Duration::from_millis(1));
        }
        (start.elapsed(), slowest)
    });
    let got = fast.take(n, Duration::from_secs(30));
    assert_eq!(got.last().unwrap().id, Some(n as u64));
    let (total, slowest) = emitter.join().unwrap();
    assert!(
        slowest < Duration::from_millis(200),
        "one emit took {slowest:?}"
    );
    assert!(total < Duration::from_secs(10), "emits took {total:?}");
    // The stalled client is dropped: its writer's send times out (2 s here).
    wait_for(
        Duration::from_secs(15),
        "the stalled client to be dropped",
        || {
            let m = web.get("/metrics").body;
            m.contains("\nhive_sse_clients 1\n").then_some(())
        },
    );
    drop(stalled);
}

#[test]
fn clients_beyond_the_cap_get_a_503() {
    let web = Web::start_with(|c, _| c.sse_max_clients = 2);
    let a = web.sse("/events", &[]);
    let _b = web.sse("/events", &[]);
    assert_eq!(a.status, 200);
    let c = web.sse("/events", &[]);
    assert_eq!(c.status, 503);
    drop(a);
    // The freed slot is noticed at the next write (a ping within 1 s).
    wait_for(T, "a slot to free up", || {
        let d = web.sse("/events", &[]);
        (d.status == 200).then_some(())
    });
}

#[test]
fn the_token_guards_every_endpoint_and_the_login_page_sets_a_cookie() {
    let web = Web::start_with(|c, _| c.token = Some("s3cret".into()));
    for path in [
        "/api/state",
        "/events",
        "/metrics",
        "/icon",
        "/api/turns",
        "/",
    ] {
        let r = get(&web.url(path));
        assert_eq!(r.status, 401, "{path} without a token");
        assert!(!r.body.contains("ana"), "{path} leaks: {}", r.body);
    }
    assert_eq!(post(&web.url("/api/compact"), "").status, 401);
    assert!(web.control.try_recv().is_err(), "nothing reached the loop");
    let with = |h: (&str, &str)| call("GET", &web.url("/api/state"), &[h], None).status;
    assert_eq!(with(("Authorization", "Bearer s3cret")), 200);
    assert_eq!(with(("X-Hive-Token", "s3cret")), 200);
    assert_eq!(with(("Authorization", "Bearer s3cre")), 401);
    assert_eq!(with(("X-Hive-Token", "s3cret2")), 401);
    assert_eq!(with(("Cookie", "hive_token=nope")), 401);

    // A browser without the cookie is sent to the login page.
    let r = call("GET", &web.url("/"), &[("Accept", "text/html")], None);
    assert_eq!((r.status, r.header("location")), (303, Some("/login")));
    assert_eq!(get(&web.url("/login")).status, 200);
    let form = |t: &str| {
        call(
            "POST",
            &web.url("/login"),
            &[("Content-Type", "application/x-www-form-urlencoded")],
            Some(&format!("token={t}")),
        )
    };
    assert_eq!(form("wrong").status, 401);
    let r = form("s3cret");
    assert_eq!(r.status, 303);
    let cookie = r
        .header("set-cookie")
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    // Cookies are per host, not per port: each page's carries its port.
    assert!(
        cookie.starts_with(&format!("hive_token_{}=", web.port)),
        "{cookie}"
    );
    assert_eq!(with(("Cookie", &cookie)), 200);
    let sse = Sse::connect(web.port, "/events", &[("Cookie", &cookie)]);
    assert_eq!(sse.status, 200, "EventSource works with the cookie");
}

#[test]
fn an_exposed_bind_without_a_token_is_refused_at_start() {
    let dir = common::hive::TempDir::new("bind");
    let settings = common::web::settings(&dir);
    let bus = hyperhive::harness::bus::Bus::new("a", "a", "haiku", 1000);
    let (tx, _rx) = crossbeam_channel::unbounded();
    let shared = hyperhive::harness::control::Shared::new(bus, tx, std::sync::Arc::new(settings));
    let cfg = hyperhive::web::WebConfig {
        port: 0,
        bind: "0.0.0.0".parse().unwrap(),
        ..Default::default()
    };
    let Err(e) = hyperhive::web::start(shared, cfg) else {
        panic!("started on 0.0.0.0 without a token")
    };
    assert!(e.contains("HIVE_WEB_TOKEN"), "{e}");
}

#[test]
fn static_paths_cannot_escape_their_root() {
    let outside = common::hive::TempDir::new("out");
    std::fs::write(outside.path().join("secret.txt"), "TOPSECRET").unwrap();
    let root = outside.path().join("static");
    std::fs::create_dir_all(root.join("games/bb")).unwrap();
    std::fs::write(root.join("games/bb/index.html"), "<p>bitburner</p>").unwrap();
    std::fs::write(root.join("my-page.html"), "mine").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), root.join("leak.txt")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("up")).unwrap();
    let r2 = root.clone();
    let web = Web::start_with(move |c, _| c.static_dir = Some(r2));

    assert_eq!(web.raw_get("/my-page.html"), (200, "mine".into()));
    assert_eq!(web.raw_get("/games/bb/").1, "<p>bitburner</p>");
    assert!(
        web.raw_get("/").1.contains("EventSource"),
        "the page wins at /"
    );
    for path in [
        "/../secret.txt",
        "/games/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/%2E%2E%2Fsecret.txt",
        "/games/%2e%2e/%2e%2e/secret.txt",
        "/my-page.html%00.txt",
        "/leak.txt",
        "/up/secret.txt",
        "/..%5csecret.txt",
    ] {
        let (status, body) = web.raw_get(path);
        assert!(status == 400 || status == 404, "{path}: {status} {body}");
        assert!(!body.contains("TOPSECRET"), "{path} leaked");
    }

    // A replacement dist takes over `/` entirely.
    let dist = outside.path().join("dist");
    std::fs::create_dir_all(&dist).unwrap();
    std::fs::write(dist.join("index.html"), "custom ui").unwrap();
    let web = Web::start_with(move |c, _| c.dist = Some(dist));
    assert_eq!(web.raw_get("/"), (200, "custom ui".into()));
}

/// Checks the Prometheus text format: HELP/TYPE comments before their samples,
/// well-formed names and labels, numeric values. Returns name+labels → value.
fn parse_prometheus(text: &str) -> Vec<(String, f64)> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut typed = std::collections::HashMap::new();
    let mut samples = Vec::new();
    assert!(text.ends_with('\n'), "must end with a newline");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kw, name, arg) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
            assert!(name_ok(name), "bad name in {line:?}");
            match kw {
                Some("HELP") => {}
                Some("TYPE") => {
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&arg),
                        "{line:?}"
                    );
                    assert!(
                        typed.insert(name.to_string(), arg.to_string()).is_none(),
                        "TYPE twice: {name}"
                    );
                }
                _ => panic!("unknown comment {line:?}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("{line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("value in {line:?}"));
        let name = series.split('{').next().unwrap();
        assert!(name_ok(name), "bad metric name in {line:?}");
        assert!(typed.contains_key(name), "sample before its TYPE: {line:?}");
        if let Some(labels) = series.strip_prefix(name) {
            if !labels.is_empty() {
                let inner = labels
                    .strip_prefix('{')
                    .and_then(|l| l.strip_suffix('}'))
                    .unwrap_or_else(|| panic!("labels in {line:?}"));
                // Split on `",` outside escapes: good enough for the values we emit.
                for pair in inner.split("\",").filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("{line:?}"));
                    assert!(name_ok(k), "label name {k:?}");
                    assert!(!v.trim_end_matches('"').contains('\n'));
                }
            }
        }
        samples.push((series.to_string(), value));
    }
    samples
}

#[test]
fn metrics_parse_as_prometheus_text() {
    let web = Web::start();
    let stats = Stats::open(&web.shared.settings.stats_db()).unwrap();
    stats.record(&row("ok", 2000)).unwrap();
    stats.record(&row("ok", 1000)).unwrap();
    stats.record(&row("rate_limited", 500)).unwrap();
    web.bus.update(|s| {
        s.unread = 4;
        s.inflight = Some(9);
    });
    let _sse = web.sse("/events", &[]);
    wait_for(T, "the SSE client to count", || {
        web.get("/metrics")
            .body
            .contains("hive_sse_clients 1\n")
            .then_some(())
    });
    let r = web.get("/metrics");
    assert!(r
        .header("content-type")
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    let samples = parse_prometheus(&r.body);
    let v = |k: &str| {
        samples
            .iter()
            .find(|(s, _)| s == k)
            .unwrap_or_else(|| panic!("{k} missing from:\n{}", r.body))
            .1
    };
    assert_eq!(v(r#"hive_turns_total{kind="turn",outcome="ok"}"#), 2.0);
    assert_eq!(
        v(r#"hive_turns_total{kind="turn",outcome="rate_limited"}"#),
        1.0
    );
    assert_eq!(
        v(r#"hive_turn_duration_seconds_total{kind="turn",outcome="ok"}"#),
        3.0
    );
    assert_eq!(
        v(r#"hive_tokens_total{kind="turn",outcome="ok",type="output"}"#),
        40.0
    );
    assert_eq!(v("hive_unread"), 4.0);
    assert_eq!(v("hive_inflight"), 1.0);
    assert_eq!(v("hive_sse_clients"), 1.0);

    web.bus.update(|s| s.rate_limited = true);
    std::thread::sleep(Duration::from_millis(300));
    web.bus.update(|s| s.rate_limited = false);
    let secs = wait_for(T, "rate-limited seconds", || {
        let s = parse_prometheus(&web.get("/metrics").body);
        let x = s
            .iter()
            .find(|(k, _)| k == "hive_rate_limited_seconds_total")?
            .1;
        (x > 0.0).then_some(x)
    });
    assert!((0.25..5.0).contains(&secs), "{secs}");
}

#[test]
fn a_stored_login_token_is_private_and_never_echoed() {
    let web = Web::start();
    let secret = "sk-ant-api03-VERYSECRETTOKEN";
    let before = web.get("/api/login").json();
    assert_eq!(before["stored_token"], false);
    let r = web.post("/api/login", &json!({ "token": secret }).to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains("VERYSECRET"));
    assert_eq!(web.control.recv_timeout(T).unwrap(), Control::LoginStored);

    let file = web.shared.settings.credentials_file();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), secret);
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let after = web.get("/api/login");
    assert_eq!(after.json()["stored_token"], true);
    for path in ["/api/login", "/api/state", "/metrics"] {
        assert!(!web.get(path).body.contains("VERYSECRET"), "{path}");
    }
    let mut sse = web.sse("/events", &[]);
    let events = sse.take(1, T);
    assert!(events.iter().all(|e| !e.data.contains("VERYSECRET")));

    let bad = web.post("/api/login", r#"{"token":"two words"}"#);
    assert_eq!(bad.status, 400);
    assert!(!bad.body.contains("two words"));
    let bad = web.post("/api/login", r#"{"token":123456789}"#);
    assert_eq!(bad.status, 400);
    assert!(!bad.body.contains("123456789"));
    let _: Value = bad.json();
}

#[test]
fn shutdown_ends_the_streams_and_frees_the_port() {
    let mut web = Web::start();
    let mut sse = web.sse("/events", &[]);
    web.bus.note("before");
    assert_eq!(sse.take(1, T)[0].id, Some(1));
    let started = Instant::now();
    web.handle.take().unwrap().shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "shutdown took {:?}",
        started.elapsed()
    );
    assert!(sse.next(T).is_none(), "the stream ends");
    wait_for(T, "the port to close", || {
        std::net::TcpStream::connect(("127.0.0.1", web.port))
            .is_err()
            .then_some(())
    });
}

#[test]
fn a_live_stream_outlives_the_read_timeout_and_a_closed_one_frees_its_slot_at_once() {
    let web = Web::start_with(|c, _| {
        c.timeouts.read = Duration::from_secs(1);
        c.sse_ping = Duration::from_secs(30);
        c.sse_max_clients = 1;
    });
    let mut s = web.sse("/events", &[]);
    assert_eq!(s.status, 200);
    // Past the read timeout the connection's reading side gives up on a next
    // request; the stream must go on.
    std::thread::sleep(Duration::from_millis(2500));
    web.bus.note("still here");
    let e = s.take(1, T);
    assert!(e[0].data.contains("still here"), "{:?}", e[0]);
    // A client that hangs up frees its slot long before the next ping (30 s).
    drop(s);
    wait_for(Duration::from_secs(5), "the slot to be freed", || {
        (web.sse("/events", &[]).status == 200).then_some(())
    });
}

/// Every request is answered on its connection's thread (`web-conn`, with
/// `http::server::CONN_STACK` of stack): a body nested to serde_json's
/// recursion limit, and one far past it, is refused there as a bad request,
/// and the page answers on.
#[test]
fn a_body_nested_to_the_parsers_limit_is_refused_on_the_connection_thread() {
    let web = Web::start();
    for depth in [126, 127, 5000] {
        let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
        for path in ["/api/send", "/api/model", "/api/login"] {
            let r = web.post(path, &format!(r#"{{"body":{deep},"model":{deep}}}"#));
            assert_eq!(r.status, 400, "{path} at depth {depth}: {}", r.body);
        }
    }
    let r = web.get("/api/state");
    assert_eq!(r.status, 200, "{}", r.body);
}
