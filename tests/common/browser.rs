//! Test kit for browser tests: headless Chromium driven over WebDriver
//! (chromedriver) with a minimal client on ureq. Without chromium and
//! chromedriver a test skips loudly, or fails under `HIVE_REQUIRE_REAL_CLAUDE=1`.

use super::hive::{wait_for, TempDir};
use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const T: Duration = Duration::from_secs(20);

fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|n| {
        std::env::split_paths(&path)
            .map(|d| d.join(n))
            .find(|p| p.is_file())
    })
}

/// Chromium and chromedriver, or None after a loud SKIPPED line.
pub fn browser() -> Option<(PathBuf, PathBuf)> {
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
pub struct Driver {
    child: Child,
    base: String,
    session: String,
    agent: ureq::Agent,
    _profile: TempDir,
}

impl Driver {
    pub fn start(chromium: &PathBuf, chromedriver: &PathBuf) -> Driver {
        Driver::start_sized(chromium, chromedriver, 390, 844)
    }

    /// A browser whose viewport is `width` × `height` CSS pixels (a phone's
    /// metrics, emulated: a desktop window cannot be narrower than 500 px).
    pub fn start_sized(
        chromium: &PathBuf,
        chromedriver: &PathBuf,
        width: u32,
        height: u32,
    ) -> Driver {
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
                "mobileEmulation": {"deviceMetrics": {"width": width, "height": height, "pixelRatio": 2}},
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--hide-scrollbars", format!("--window-size={width},{height}"),
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

    pub fn post_raw(&self, path: &str, body: &Value) -> Value {
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

    pub fn post(&self, path: &str, body: Value) -> Value {
        self.post_raw(&format!("/session/{}{path}", self.session), &body)
    }

    pub fn get(&self, path: &str) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let v: Value = self.agent.get(&url).call().unwrap().into_json().unwrap();
        v["value"].clone()
    }

    pub fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url }));
    }

    pub fn js(&self, script: &str) -> Value {
        self.post("/execute/sync", json!({ "script": script, "args": [] }))
    }

    pub fn element(&self, css: &str) -> String {
        let v = self.post("/element", json!({"using": "css selector", "value": css}));
        v["element-6066-11e4-a52e-4f735466cecf"]
            .as_str()
            .unwrap_or_else(|| panic!("no element {css}: {v}"))
            .to_string()
    }

    pub fn type_into(&self, css: &str, text: &str) {
        let id = self.element(css);
        self.post(&format!("/element/{id}/value"), json!({ "text": text }));
    }

    pub fn screenshot(&self) -> Vec<u8> {
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

pub fn artifacts() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Driver {
    /// Clicks the element `css` matches.
    pub fn click(&self, css: &str) {
        let id = self.element(css);
        self.post(&format!("/element/{id}/click"), json!({}));
    }

    /// Clicks the element `css` matches from inside the page, once it
    /// exists: cards are redrawn whenever the live snapshot changes, so an
    /// element found over WebDriver may be gone by the time its click
    /// arrives (typed text survives a redraw).
    pub fn press(&self, css: &str) {
        wait_for(T, css, || {
            (self.js(&format!(
                "const e = document.querySelector({css:?}); if (!e) return false; e.click(); return true"
            )) == true)
                .then_some(())
        });
    }

    /// The trimmed text of the first element `css` matches (hidden or not),
    /// or None.
    pub fn text_of(&self, css: &str) -> Option<String> {
        let v = self.js(&format!(
            "const e = document.querySelector({css:?}); return e ? e.textContent.trim() : null"
        ));
        v.as_str().map(str::to_string)
    }

    /// The same, but None when the element is hidden.
    pub fn shown_text_of(&self, css: &str) -> Option<String> {
        let v = self.js(&format!(
            "const e = document.querySelector({css:?}); return e && !e.hidden ? e.textContent.trim() : null"
        ));
        v.as_str().map(str::to_string)
    }

    /// "HH:MM" of unix time `t` in the browser's time zone, computed here
    /// from the browser's offset (not with the page's own code).
    pub fn local_hhmm(&self, t: i64) -> String {
        let offset = self
            .js(&format!("return new Date({t} * 1000).getTimezoneOffset()"))
            .as_i64()
            .unwrap();
        let local = t - offset * 60;
        format!(
            "{:02}:{:02}",
            local.rem_euclid(86400) / 3600,
            local.rem_euclid(3600) / 60
        )
    }
}
