//! What `hive up` reads from an agent's page, and what it sends there, when
//! the agent is hostile (robustness review 2026-12-06, N2, N12, N23): the
//! agent removes its token file (N2: hive up never falls back to its own
//! `HIVE_WEB_TOKEN`; the card shows the page as unavailable), answers custom
//! links with `javascript:` and `data:` URLs (N12: only http(s) links reach
//! the dashboard, as JSON and in Chromium), and answers `/api/state` with
//! 200 MB (N23: read up to a bound, then dropped with a log line; hive up's
//! memory stays put). The hostile page is a std `UnixListener` in the test
//! put in the place of the agent's page socket (`DATA/run/pages/ana.sock`),
//! as an agent that is not isolated could do (an isolated one cannot see
//! it). Every wait has a timeout.

mod common;

use common::browser::{browser, Driver};
use common::hive::*;
use common::up::{Dash, Up};
use hyperhive::proto::cmd::Search;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);
const FLEET: &str = r#"{"agents": [{"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}]}"#;
const MARKER: &str = "up-SECRETMARKER";

/// What a fake page answers: (status, body bytes, a body of this many `x`
/// after the bytes).
type Answer = (u16, Vec<u8>, usize);

/// A page stand-in in the place of ana's page socket that answers each path
/// as `answer` says and keeps every request head it got.
struct FakePage {
    heads: Arc<Mutex<Vec<String>>>,
}

impl FakePage {
    fn start(up: &Up, answer: fn(&str) -> Answer) -> FakePage {
        let path = up.data().join("run/pages/ana.sock");
        std::fs::remove_file(&path).unwrap();
        let l = UnixListener::bind(&path).unwrap();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let kept = heads.clone();
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let mut w = conn.try_clone().unwrap();
                    let mut r = BufReader::new(conn);
                    let mut head = String::new();
                    loop {
                        let mut line = String::new();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        head.push_str(&line);
                    }
                    let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                    kept.lock().unwrap().push(head);
                    let (status, body, filler) = answer(&path);
                    // Close-delimited, so a client must bound the read itself.
                    let _ = write!(
                        w,
                        "HTTP/1.0 {status} X\r\nContent-Type: application/json\r\n\r\n"
                    );
                    let _ = w.write_all(&body);
                    let chunk = [b'x'; 64 * 1024];
                    let mut left = filler;
                    while left > 0 {
                        let n = left.min(chunk.len());
                        if w.write_all(&chunk[..n]).is_err() {
                            return;
                        }
                        left -= n;
                    }
                });
            }
        });
        FakePage { heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

/// ana's card in a fresh snapshot, once `pred` holds for it.
fn card(dash: &Dash, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    wait_for(T, what, || {
        let h = dash.get("/api/hive").ok()?;
        let ana = h["agents"]
            .as_array()?
            .iter()
            .find(|a| a["name"] == "ana")?;
        pred(ana).then(|| ana.clone())
    })
}

#[test]
fn a_page_without_its_token_file_never_gets_hive_ups_token() {
    let up = Up::start_env(FLEET, &["ana"], &[("HIVE_WEB_TOKEN", MARKER)]);
    up.wait_prompt("ana", "You were just (re)started", 1);
    let dash = up.dashboard();
    // The agent removes its token file and answers in its page's place.
    std::fs::remove_file(up.data().join("agents/ana/state/web-token")).unwrap();
    let page = FakePage::start(&up, |_| (401, br#"{"error":"token"}"#.to_vec(), 0));

    let ana = card(&dash, "ana's page shown as unavailable", |a| {
        a["page_error"].is_string()
    });
    let why = ana["page_error"].as_str().unwrap();
    assert!(why.contains("state/web-token is missing"), "{why}");
    assert!(
        ana.get("open").is_none(),
        "no link to a page hive up cannot open: {ana}"
    );

    // Reading it through the hive is refused with the same reason, and sets
    // no cookie.
    let r = ureq::AgentBuilder::new()
        .redirects(0)
        .build()
        .get(&format!("{}/agent/ana/api/state", dash.base))
        .set("X-Hive-Token", &dash.token)
        .call();
    let Err(ureq::Error::Status(503, r)) = r else {
        panic!("/agent/ana/api/state: {r:?}")
    };
    assert!(r.header("Set-Cookie").is_none());
    assert!(r.into_string().unwrap().contains("web-token is missing"));

    // The operator's search says so too.
    let reply = up
        .host()
        .call(&Search {
            words: "anything".into(),
            agent: None,
            since: None,
            limit: None,
        })
        .unwrap();
    let err = reply
        .errors
        .iter()
        .find(|e| e.agent == "ana")
        .expect("ana's error");
    assert!(err.error.contains("web-token is missing"), "{err:?}");

    let heads = page.heads();
    assert!(heads.len() >= 3, "the page was asked: {heads:?}");
    for h in &heads {
        assert!(!h.contains(MARKER), "hive up sent its own token: {h}");
        assert!(!h.to_ascii_lowercase().contains("x-hive-token"), "{h}");
    }
}

/// The links a hostile page answers: one good, the rest never an href.
const LINKS: &str = r#"[
  {"label":"Stats","icon":"📊","url":"https://stats.test/"},
  {"label":"Evil","url":"javascript:fetch('/api/permissions',{method:'POST'})"},
  {"label":"Data","url":"data:text/html,<script>alert(1)</script>"},
  {"label":"Spaced","url":" javascript:alert(1)"},
  {"label":"Upper","url":"JAVASCRIPT:alert(1)"},
  {"label":"Bare","url":"//evil.example/"},
  {"url":"http://no.label/"}
]"#;

#[test]
fn an_agents_links_reach_the_dashboard_only_when_http() {
    let up = Up::start(FLEET, &["ana"]);
    up.wait_prompt("ana", "You were just (re)started", 1);
    let dash = up.dashboard();
    let _page = FakePage::start(&up, |path| match path {
        "/api/dashboard-links" => (200, LINKS.as_bytes().to_vec(), 0),
        "/api/state" => (200, br#"{"turn_state":"idle"}"#.to_vec(), 0),
        _ => (404, b"{}".to_vec(), 0),
    });
    let ana = card(&dash, "ana's links from the hostile page", |a| {
        a["links"].is_array()
    });
    assert_eq!(
        ana["links"],
        serde_json::json!([{"label":"Stats","icon":"📊","url":"https://stats.test/"}]),
        "{ana}"
    );

    // In the browser: the one http(s) link is the only custom link.
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    let hrefs = wait_for(T, "ana's card with its links", || {
        let v = d.js(
            "return [...document.querySelectorAll('.card.agent[data-agent=\"ana\"] a[data-link=\"custom\"]')].map((a) => a.getAttribute('href'))",
        );
        (v.as_array()?.len() == 1).then_some(v)
    });
    eprintln!("custom hrefs in Chromium: {hrefs}");
    assert_eq!(hrefs, serde_json::json!(["https://stats.test/"]));
    let any_script = d.js(
        "return [...document.querySelectorAll('a')].some((a) => !/^(https?:|\\/)/i.test(a.getAttribute('href') || '/'))",
    );
    assert_eq!(any_script, false, "an href that is not http(s) or a path");
}

#[test]
fn a_200_mb_answer_from_a_page_is_dropped_at_its_bound() {
    let up = Up::start(FLEET, &["ana"]);
    up.wait_prompt("ana", "You were just (re)started", 1);
    let dash = up.dashboard();
    // A first snapshot, so what it costs is in the high-water mark already.
    card(&dash, "ana's live state", |a| a["live"].is_object());
    let page = FakePage::start(&up, |path| match path {
        "/api/state" => (200, br#"{"turn_state":""#.to_vec(), 200 << 20),
        _ => (200, b"[]".to_vec(), 0),
    });
    let before = proc_kb(up.pid(), "VmHWM");
    for _ in 0..3 {
        card(&dash, "a snapshot without ana's state", |a| {
            a["live"].is_null() && a["links"] == serde_json::json!([])
        });
    }
    let after = proc_kb(up.pid(), "VmHWM");
    eprintln!("hive up VmHWM {before} kB before, {after} kB after three 200 MB answers");
    assert!(
        after < before + 16 * 1024,
        "hive up's memory rose from {before} kB to {after} kB"
    );
    wait_for(T, "the log line of the dropped answer", || {
        up.log()
            .contains("ana's page answered /api/state with more than 262144 bytes; dropped")
            .then_some(())
    });
    assert!(page
        .heads()
        .iter()
        .any(|h| h.starts_with("GET /api/state ")));
}
