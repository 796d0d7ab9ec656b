//! Issue 43, item 2: metrics a real Prometheus accepts. `hive up` with the
//! fake claude runs two agents; after some turns (the kicks, a message
//! handled, one dead-lettered, one agent paused by its budget) the
//! dashboard's hive-wide `/metrics` and an agent page's `/metrics` each pass
//! `promtool check metrics` (the format and Prometheus' naming lint) and
//! carry the hive's figures per agent (decisions, the pause by reason, the
//! budget used as a ratio, message rows by state); the
//! dashboard's wants its token, as every route of it does. Then a real
//! `prometheus` (Debian's package; its own process on 127.0.0.1 with a temp
//! config and store) scrapes `hive up` with the token in an `authorization`
//! `credentials_file`, and a series shows through its HTTP API. Without
//! `promtool` or `prometheus` a test skips with the reason, or fails under
//! `HIVE_REQUIRE_REAL_CLAUDE=1` (CI installs them: `.ci/run`).

mod common;

use common::hive::{wait_for, TempDir};
use common::up::Up;
use hyperhive::proto::cmd::Send;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const KICK: &str = "You were just (re)started";

const FLEET: &str = r#"{
  "hive_name": "promhive",
  "agents": [
    {"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}, "budget": {"usd": 0.02, "per": "day"}},
    {"name": "bob", "env": {"FAKE_CLAUDE_DIR": "@FAKE(bob)", "HIVE_TURN_MAX_ATTEMPTS": "1"}}
  ]
}"#;

/// `/usr/bin/NAME` (or on `PATH`), or None after a SKIPPED line; a panic
/// under `HIVE_REQUIRE_REAL_CLAUDE=1`.
fn tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        let msg = format!(
            "{name} is not installed (run: apt-get install -y --no-install-recommends \
             prometheus; .ci/run does)"
        );
        if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() == Ok("1") {
            panic!("HIVE_REQUIRE_REAL_CLAUDE=1 but {msg}");
        }
        let _ = writeln!(std::io::stderr(), "SKIPPED: {msg}");
    }
    found
}

/// `GET URL` with `headers`: the status and body.
fn get(url: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut r = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
        .get(url);
    for (k, v) in headers {
        r = r.set(k, v);
    }
    match r.call() {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_string().unwrap_or_default()),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

/// The value of the sample whose line starts with `series` (name and
/// labels as written), if there is one.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// A hive with two agents past their kicks, one message handled by ana and
/// one dead-lettered by bob (its turn fails, one attempt allowed). Each fake
/// run costs $0.014: ana's two reach its $0.02 a day, and it pauses.
fn hive_with_turns() -> Up {
    let up = Up::start(FLEET, &["ana", "bob"]);
    up.wait_prompt("ana", KICK, 1);
    up.wait_prompt("bob", KICK, 1);
    up.fake("bob").default_step("exit 1");
    for (to, body) in [("ana", "count the bees"), ("bob", "this one fails")] {
        let send: Send =
            serde_json::from_value(serde_json::json!({"to": to, "body": body})).unwrap();
        up.host().call(&send).expect("the operator's send");
    }
    up.wait_prompt("ana", "count the bees", 1);
    up.wait_prompt("bob", "this one fails", 1);
    up
}

/// The dashboard's `/metrics` once it shows `series` at `want` or more.
fn dashboard_metrics_with(up: &Up, series: &str, want: f64) -> String {
    let d = up.dashboard();
    let auth = format!("Bearer {}", d.token);
    wait_for(Duration::from_secs(60), series, || {
        let (status, text) = get(
            &format!("{}/metrics", d.base),
            &[("Authorization", auth.as_str())],
        );
        assert_eq!(status, 200, "{text}");
        (value(&text, series)? >= want).then_some(text)
    })
}

/// The sum of `agent`'s `family` series (on the dashboard) whose labels
/// hold `label`.
fn sum_of(text: &str, family: &str, agent: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{agent=\"{agent}\"")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// `promtool check metrics` on `text`: its exit status and what it said.
fn promtool_check(promtool: &Path, text: &str) -> (bool, String) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn promtool_accepts_the_dashboards_and_a_pages_metrics() {
    let Some(promtool) = tool("promtool") else {
        return;
    };
    let up = hive_with_turns();
    // ana: its kick and the message, both acked.
    let text = dashboard_metrics_with(&up, r#"hive_messages{agent="ana",state="acked"}"#, 2.0);
    let text = if value(&text, r#"hive_messages{agent="bob",state="dead_lettered"}"#).is_some() {
        text
    } else {
        dashboard_metrics_with(
            &up,
            r#"hive_messages{agent="bob",state="dead_lettered"}"#,
            1.0,
        )
    };
    let (ok, said) = promtool_check(&promtool, &text);
    assert!(
        ok,
        "promtool check metrics refused the dashboard's:\n{said}\n{text}"
    );
    assert!(said.trim().is_empty(), "promtool: {said}");
    for want in [
        "hive_broker_up 1",
        "hive_budget_up 1",
        // No collector: hive up exports nothing and drops nothing.
        "hive_spans_dropped_total 0",
        r#"hive_agent_running{agent="ana""#,
        r#"hive_page_up{agent="ana""#,
        r#"hive_page_up{agent="bob""#,
        r#"hive_turns_total{agent="ana""#,
        r#"hive_tokens_total{agent="ana""#,
        r#"hive_cost_usd_total{agent="ana""#,
        r#"hive_mcp_start_failures_total{agent="ana""#,
        r#"hive_paused{agent="bob""#,
        r#"hive_spend_usd{scope="hive",per="day"}"#,
        r#"hive_spend_usd{scope="agent",agent="ana""#,
    ] {
        assert!(text.contains(want), "{want} missing:\n{text}");
    }
    // The turn loop's decisions, per agent: ana's turns acked, bob's
    // message given up; ana's budget used up, and ana paused for it.
    let text = wait_for(Duration::from_secs(30), "decisions and the pause", || {
        let text = dashboard_metrics_with(&up, "hive_broker_up", 1.0);
        let d = "hive_turn_decisions_total";
        (sum_of(&text, d, "ana", r#"decision="ack""#) >= 2.0
            && sum_of(&text, d, "bob", r#"decision="dead_letter""#) >= 1.0
            && sum_of(&text, "hive_pauses_total", "ana", r#"reason="budget""#) >= 1.0)
            .then_some(text)
    });
    assert_eq!(
        sum_of(&text, "hive_paused", "ana", r#"reason="budget""#),
        1.0,
        "{text}"
    );
    let used = text
        .lines()
        .find(|l| {
            l.starts_with(r#"hive_budget_used_ratio{scope="agent",agent="ana""#)
                && l.contains(r#"limit="usd""#)
        })
        .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
    assert!(used.is_some_and(|u| u >= 1.0), "{text}");
    let (ok, said) = promtool_check(&promtool, &text);
    assert!(ok && said.trim().is_empty(), "promtool: {said}\n{text}");
    // No id of a message or a turn is a label.
    assert!(!text.contains("id=\""), "{text}");

    // The dashboard's wants its token.
    let d = up.dashboard();
    let (status, _) = get(&format!("{}/metrics", d.base), &[]);
    assert_eq!(status, 401);

    // An agent's page, through the hive as a script reaches it.
    let page = up.page("ana");
    let r = page.get("/metrics");
    assert_eq!(r.status, 200, "{}", r.body);
    let (ok, said) = promtool_check(&promtool, &r.body);
    assert!(
        ok,
        "promtool check metrics refused the page's:\n{said}\n{}",
        r.body
    );
    assert!(said.trim().is_empty(), "promtool: {said}");
    assert!(
        value(&r.body, r#"hive_turns_total{kind="turn",outcome="ok"}"#).is_some_and(|v| v >= 2.0),
        "{}",
        r.body
    );
    assert!(
        r.body
            .contains("hive_turn_decisions_total{outcome=\"ok\",decision=\"ack\"}"),
        "{}",
        r.body
    );
}

/// A `prometheus` of the test's own, killed on drop.
struct Prometheus {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Prometheus {
    /// Scrapes `target` (`127.0.0.1:PORT`) every second with `token` as its
    /// bearer credentials, read from a file.
    fn start(bin: &Path, target: &str, token: &str) -> Prometheus {
        let dir = TempDir::new("prom");
        let cred = dir.path().join("hive-token");
        std::fs::write(&cred, token).unwrap();
        let config = dir.path().join("prometheus.yml");
        // The scrape config docs/observability.md shows, with a short interval.
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\
                 scrape_configs:\n  - job_name: hive\n    metrics_path: /metrics\n    \
                 authorization:\n      credentials_file: {}\n    \
                 static_configs:\n      - targets: ['{target}']\n",
                cred.display()
            ),
        )
        .unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        Prometheus { child, port, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// The samples of an instant query: (labels, value) each.
    fn query(&self, q: &str) -> Option<Vec<(serde_json::Value, f64)>> {
        let url = format!("http://127.0.0.1:{}/api/v1/query", self.port);
        let r = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(10))
            .build()
            .get(&url)
            .query("query", q)
            .call()
            .ok()?;
        let v: serde_json::Value = r.into_json().ok()?;
        let result = v["data"]["result"].as_array()?;
        Some(
            result
                .iter()
                .filter_map(|s| {
                    let x = s["value"][1].as_str()?.parse::<f64>().ok()?;
                    Some((s["metric"].clone(), x))
                })
                .collect(),
        )
    }
}

#[test]
fn a_real_prometheus_scrapes_hive_up_with_a_bearer_credentials_file() {
    let Some(bin) = tool("prometheus") else {
        return;
    };
    let up = hive_with_turns();
    dashboard_metrics_with(&up, r#"hive_messages{agent="ana",state="acked"}"#, 2.0);
    let d = up.dashboard();
    let mut prom = Prometheus::start(&bin, &format!("127.0.0.1:{}", d.port), &d.token);
    let series = wait_for(Duration::from_secs(90), "the series in prometheus", || {
        if let Ok(Some(status)) = prom.child.try_wait() {
            panic!("prometheus exited ({status}):\n{}", prom.log());
        }
        let s = prom.query(r#"hive_messages{job="hive",agent="ana",state="acked"}"#)?;
        s.into_iter().find(|(_, v)| *v >= 2.0)
    });
    assert_eq!(series.0["instance"], format!("127.0.0.1:{}", d.port));
    // The scrape itself succeeded, token and all.
    let up_series = wait_for(Duration::from_secs(30), "up{job=hive}", || {
        prom.query(r#"up{job="hive"}"#)?.into_iter().next()
    });
    assert_eq!(up_series.1, 1.0, "{}", prom.log());
    let turns = prom
        .query(r#"sum(hive_turns_total{job="hive",agent="ana"})"#)
        .expect("a sum of ana's turns");
    assert!(turns.first().is_some_and(|(_, v)| *v >= 2.0), "{turns:?}");
}
