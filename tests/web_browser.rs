//! The page in a real browser: headless Chromium driven over WebDriver
//! (chromedriver) with a minimal client on ureq. The page must load, show a turn
//! emitted on the bus live, send `/model sonnet` from its input box, and fit a
//! 390 px wide screen without horizontal scrolling. A screenshot is saved under
//! `target/test-artifacts/`. Without chromium and chromedriver the test skips
//! loudly, or fails under `HIVE_REQUIRE_REAL_CLAUDE=1` (as in CI).

mod common;

use common::hive::{wait_for, TempDir};
use common::web::Web;
use hyperhive::harness::bus::{LiveEvent, TurnState};
use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

/// Chromium and chromedriver, or None after a loud SKIPPED line.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let found = (
        which(&["chromium", "chromium-browser"]),
        which(&["chromedriver"]),
    );
    match found {
        (Some(c), Some(d)) => Some((c, d)),
        _ => {
            let msg = "chromium and chromedriver are not installed \
                       (run: apt-get install -y chromium chromium-driver)";
            if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() == Ok("1") {
                panic!("HIVE_REQUIRE_REAL_CLAUDE=1 but {msg}");
            }
            let _ = writeln!(std::io::stderr(), "SKIPPED: {msg}");
            None
        }
    }
}

/// A chromedriver process and one browser session; both end on drop.
struct Driver {
    child: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    _profile: TempDir,
}

impl Driver {
    fn start(chromium: &PathBuf, chromedriver: &PathBuf) -> Driver {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chromedriver");
        let agent = ureq::AgentBuilder::new().timeout(T).build();
        let base = format!("http://127.0.0.1:{port}");
        let profile = TempDir::new("chrome");
        let mut d = Driver {
            child,
            base,
            session: String::new(),
            agent,
            _profile: profile,
        };
        wait_for(T, "chromedriver to listen", || {
            d.agent
                .get(&format!("{}/status", d.base))
                .call()
                .ok()
                .and_then(|r| r.into_json::<Value>().ok())
                .filter(|v| v["value"]["ready"] == true)
        });
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                // Desktop windows cannot be narrower than 500 px; a phone's
                // metrics can.
                "mobileEmulation": {"deviceMetrics": {"width": 390, "height": 844, "pixelRatio": 2}},
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--hide-scrollbars", "--window-size=390,844",
                    format!("--user-data-dir={}", d._profile.path().display()),
                ]
            }
        }}});
        let v = d.post_raw("/session", &caps);
        d.session = v["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {v}"))
            .to_string();
        d
    }

    fn post_raw(&self, path: &str, body: &Value) -> Value {
        let url = format!("{}{path}", self.base);
        let r = match self.agent.post(&url).send_json(body.clone()) {
            Ok(r) => r,
            Err(ureq::Error::Status(code, r)) => {
                panic!("{path}: {code} {}", r.into_string().unwrap_or_default())
            }
            Err(e) => panic!("{path}: {e}"),
        };
        let v: Value = r.into_json().expect("WebDriver JSON");
        v["value"].clone()
    }

    fn post(&self, path: &str, body: Value) -> Value {
        self.post_raw(&format!("/session/{}{path}", self.session), &body)
    }

    fn get(&self, path: &str) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let v: Value = self.agent.get(&url).call().unwrap().into_json().unwrap();
        v["value"].clone()
    }

    fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url }));
    }

    fn js(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({ "script": script, "args": [] }))
    }

    fn element(&self, css: &str) -> String {
        let v = self.post("/element", json!({"using": "css selector", "value": css}));
        v["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.post(&format!("/element/{id}/value"), json!({ "text": text }));
    }

    fn screenshot(&self) -> Vec<u8> {
        base64_decode(self.get("/screenshot").as_str().expect("base64 PNG"))
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let url = format!("{}/session/{}", self.base, self.session);
            let _ = self.agent.delete(&url).call();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= u32::from(val(c)) << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

fn artifacts() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A turn like the real CLI streams it: text, a tool call and its result.
fn emit_turn(web: &Web) {
    let bus = &web.bus;
    bus.set_turn_state(TurnState::Thinking);
    bus.emit(LiveEvent::TurnStart {
        from: "operator".into(),
        body: "What is in notes.md? Also: https://example.com/a/very/long/url/that/must/wrap/on/a/phone/screen/without/scrolling/sideways".into(),
        unread: 1,
        message_id: Some(7),
    });
    bus.emit(LiveEvent::Stream {
        value: json!({"type":"system","subtype":"init","session_id":"5f2c9a1e-0000","model":"claude-haiku-4-5"}),
    });
    bus.emit(LiveEvent::Stream {
        value: json!({"type":"assistant","message":{"content":[
            {"type":"text","text":"Let me look at the notes first."},
            {"type":"tool_use","id":"tu_1","name":"Read","input":{"file_path":"/state/notes.md","limit":200}}
        ]}}),
    });
    bus.emit(LiveEvent::Stream {
        value: json!({"type":"user","message":{"content":[
            {"type":"tool_result","tool_use_id":"tu_1","content":"# Notes\n- deploy on friday\n- a_very_long_line_without_any_spaces_".to_string() + &"x".repeat(300)}
        ]}}),
    });
    bus.emit(LiveEvent::Stream {
        value: json!({"type":"assistant","message":{"content":[
            {"type":"text","text":"The answer is 42. The notes say to deploy on Friday.\n\n```\ncargo build --release && ./target/release/hive serve --state-dir /state --run-dir /run/hive\n```"}
        ]}}),
    });
    bus.note("stderr: a warning from claude");
    bus.emit(LiveEvent::Stream {
        value: json!({"type":"result","subtype":"success","is_error":false,"num_turns":2,
            "total_cost_usd":0.0123,"usage":{"input_tokens":1200,"output_tokens":85}}),
    });
    bus.emit(LiveEvent::TurnEnd {
        ok: true,
        note: String::new(),
        outcome: "ok".into(),
        duration_ms: 8400,
    });
    bus.update(|s| {
        s.context_tokens = Some(84_000);
        s.unread = 1;
        s.online = true;
        s.status_text = "reviewing the deploy notes".into();
    });
    bus.set_turn_state(TurnState::Idle);
}

#[test]
fn the_page_follows_a_turn_live_takes_commands_and_fits_a_phone() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let web = Web::start();
    std::fs::write(
        web.state_dir().join("hyperhive-dashboard-links.json"),
        r#"[{"label":"Stats","icon":"📊","url":"http://localhost:9001/stats"}]"#,
    )
    .unwrap();
    web.bus.note("harness started");
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&web.url("/"));
    wait_for(T, "the page to connect to /events", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    let chat = || d.js("return document.getElementById('chat').innerText");
    assert!(
        chat().as_str().unwrap().contains("harness started"),
        "replayed history"
    );

    emit_turn(&web);
    wait_for(T, "the turn's assistant text to appear live", || {
        chat()
            .as_str()
            .is_some_and(|t| t.contains("The answer is 42") && t.contains("ok"))
            .then_some(())
    });
    let text = chat().as_str().unwrap().to_string();
    for want in [
        "What is in notes.md",
        "Read",
        "file_path",
        "result · 3 lines",
        "stderr: a warning",
    ] {
        assert!(
            text.contains(want),
            "{want:?} missing from the chat:\n{text}"
        );
    }
    assert_eq!(
        text.matches("The answer is 42").count(),
        1,
        "rendered once: {text}"
    );

    d.type_into("#input", "/model sonnet\u{E007}");
    wait_for(T, "/model sonnet to reach /api/state", || {
        (web.bus.snapshot().model == "sonnet").then_some(())
    });
    wait_for(T, "the header to show the model", || {
        d.js("return document.getElementById('model').textContent")
            .as_str()
            .is_some_and(|m| m.starts_with("sonnet"))
            .then_some(())
    });

    let sizes = d.js(
        "const e = document.documentElement, c = document.getElementById('scroller');
         return [e.scrollWidth, e.clientWidth, c.scrollWidth, c.clientWidth, window.innerWidth];",
    );
    let n = |i: usize| sizes[i].as_u64().unwrap();
    assert!(n(4) <= 420, "the window is not phone-sized: {sizes}");
    assert!(
        n(0) <= n(1),
        "the page scrolls sideways at {} px: {sizes}",
        n(4)
    );
    assert!(
        n(2) <= n(3),
        "the chat scrolls sideways at {} px: {sizes}",
        n(4)
    );

    let png = d.screenshot();
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    let path = artifacts().join("web-390px.png");
    std::fs::write(&path, png).unwrap();
    let _ = writeln!(std::io::stderr(), "screenshot: {}", path.display());
}

#[test]
fn a_hive_wake_makes_a_turn_appear_live_on_a_running_harness() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    use common::hive::{run_hive, wait_drained, Broker, Harness};
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let port: u16 = wait_for(T, "the port file", || {
        std::fs::read_to_string(h.state_dir().join("hyperhive-port"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    h.fake.step(
        2,
        r#"init; say "The deploy finished without errors"; result_ok done; exit 0"#,
    );
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&format!("http://127.0.0.1:{port}/"));
    wait_for(T, "the page to connect", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    let sock = b.agent_socket("ana");
    let (code, _, err) = run_hive(
        &["wake", "--from", "deploybot", "--body", "deploy 41 is done"],
        None,
        &[("HIVE_SOCKET", sock.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{err}");
    wait_for(T, "the woken turn to appear live", || {
        d.js("return document.getElementById('chat').innerText")
            .as_str()
            .is_some_and(|t| {
                t.contains("deploy 41 is done") && t.contains("The deploy finished without errors")
            })
            .then_some(())
    });
    d.type_into("#input", "/model sonnet\u{E007}");
    wait_for(T, "/model sonnet to reach the harness", || {
        common::web::get(&format!("http://127.0.0.1:{port}/api/state"))
            .json()
            .get("model")
            .filter(|m| *m == "sonnet")
            .map(|_| ())
    });
    let png = d.screenshot();
    std::fs::write(artifacts().join("serve-390px.png"), png).unwrap();
}
