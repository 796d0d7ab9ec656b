//! The usage-limit and budget badges in headless Chromium at 390 px (issue 16),
//! against a real `hive up` whose agents run the fake claude printing CLI
//! 2.1.197's lines: the early warning "⚠ near usage limit · resets HH:MM" on
//! every agent of the pool until the reset; "⊘ usage limit · until HH:MM (in
//! …)" on the dashboard's cards and on the agent's own page while the pool is
//! parked; "budget reached · $X of $Y today" on the card and the page; and the
//! dashboard's budget field raising a budget resumes the agent. Without
//! chromium the test skips loudly, or fails under `HIVE_REQUIRE_REAL_CLAUDE=1`.

mod common;

use common::browser::{artifacts, browser, Driver, T};
use common::hive::{ok, wait_for, FakeClaude, TempDir};
use common::up::{Launch, Up};
use hyperhive::proto::cmd::Send;
use std::io::Write;
use std::time::Duration;

const LONG: Duration = Duration::from_secs(60);

/// A fake claude whose every run costs one cent, in a scenario dir made
/// before `hive up` starts it.
fn cent_per_run() -> (TempDir, String) {
    let dir = TempDir::new("cents");
    std::fs::write(
        dir.path().join("default.sh"),
        r#"init
say "done"
printf '{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"duration_ms":5,"num_turns":1,"result":"done","stop_reason":"end_turn","session_id":"%s","total_cost_usd":0.01,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":10},"modelUsage":{},"permission_denials":[],"terminal_reason":"completed","uuid":"u-res"}\n' "$SESSION"
exit 0
"#,
    )
    .unwrap();
    let path = dir.path().display().to_string();
    (dir, path)
}

/// The line CLI 2.1.197 printed with an OAuth token when the API's headers
/// said the five-hour window was near its limit, resetting `SECS` seconds
/// from now, then a normal turn.
fn warning_turn(secs: i64) -> String {
    format!(
        r#"init
printf '{{"type":"rate_limit_event","rate_limit_info":{{"status":"allowed_warning","resetsAt":%s,"rateLimitType":"five_hour","utilization":0.92,"isUsingOverage":false,"surpassedThreshold":0.9}},"uuid":"u-w","session_id":"%s"}}\n' $(( $(date +%s) + {secs} )) "$SESSION"
say "noted"
result_ok "noted"
exit 0
"#
    )
}

fn send(up: &Up, to: &str, body: &str) {
    ok(
        &mut up.host(),
        Send {
            to: to.into(),
            body: body.into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
}

fn badge(d: &Driver, agent: &str, kind: &str) -> Option<String> {
    d.shown_text_of(&format!(
        ".card.agent[data-agent=\"{agent}\"] [data-badge=\"{kind}\"]"
    ))
}

/// Whether `t` reads "⊘ usage limit · until HH:MM (in N…)" for `until`.
fn usage_badge_reads(t: &str, hhmm: &str) -> bool {
    let Some(rest) = t.strip_prefix(&format!("⊘ usage limit · until {hhmm} (in ")) else {
        return false;
    };
    let span = rest.trim_end_matches(')');
    rest.ends_with(')')
        && span.len() >= 2
        && span[..span.len() - 1].bytes().all(|b| b.is_ascii_digit())
        && (span.ends_with('s') || span.ends_with('m'))
}

/// Opens `agent`'s own page through the dashboard (which logs the browser
/// in there) and returns its pause badge once it reads as `want` says.
fn page_badge(d: &Driver, up: &Up, agent: &str, want: impl Fn(&str) -> bool) -> String {
    d.goto(&format!("{}/agent/{agent}/open", up.dashboard().base));
    wait_for(LONG, &format!("{agent}'s page badge"), || {
        d.shown_text_of("#rl").filter(|t| want(t))
    })
}

fn dashboard(d: &Driver, up: &Up) {
    d.goto(&format!("{}/", up.dashboard().base));
    wait_for(T, "the dashboard to go live", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
}

#[test]
fn the_limit_and_budget_badges_and_the_budget_field() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let (_cents, cents) = cent_per_run();
    let fleet = format!(
        r#"{{"agents": [
  {{"name": "ana", "account": "team", "env": {{"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}}},
  {{"name": "bob", "account": "team", "env": {{"FAKE_CLAUDE_DIR": "@FAKE(bob)"}}}},
  {{"name": "cat", "budget": {{"usd": 0.02, "per": "day"}}, "env": {{"FAKE_CLAUDE_DIR": "{cents}"}}}}
]}}"#
    );
    let up = Up::launch(
        &fleet,
        &["ana", "bob", "cat"],
        Launch {
            env: vec![("HIVE_DASHBOARD_POLL_MS".into(), "100".into())],
            ..Launch::default()
        },
    );
    let cat = FakeClaude {
        dir: std::path::PathBuf::from(&cents),
    };
    for a in ["ana", "bob"] {
        up.wait_prompt(a, "You were just (re)started", 1);
    }
    cat.wait_count(1);
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    wait_for(T, "the three cards", || {
        (d.js("return document.querySelectorAll('.card.agent').length") == 3).then_some(())
    });

    // The early warning: ana's run printed it, both agents of the pool show
    // it until the window resets.
    let ana = up.fake("ana");
    let bob = up.fake("bob");
    ana.step(ana.count() + 1, &warning_turn(15));
    send(&up, "ana", "a job near the limit");
    let dash = up.dashboard();
    let near_until = wait_for(LONG, "the pool's warning in the rows", || {
        let h = dash.get("/api/hive").ok()?;
        h["agents"]
            .as_array()?
            .iter()
            .find(|a| a["name"] == "bob")?["near_limit"]["until"]
            .as_i64()
    });
    let want = format!("⚠ near usage limit · resets {}", d.local_hhmm(near_until));
    for a in ["ana", "bob"] {
        wait_for(LONG, &format!("{a}'s near-limit badge"), || {
            badge(&d, a, "near-limit").filter(|t| *t == want)
        });
    }
    assert_eq!(
        badge(&d, "cat", "near-limit"),
        None,
        "cat is in no pool of theirs"
    );
    let png = d.screenshot();
    let path = artifacts().join("limits-near-390px.png");
    std::fs::write(&path, png).unwrap();
    let _ = writeln!(std::io::stderr(), "screenshot: {}", path.display());
    wait_for(LONG, "the warning to go at the reset", || {
        (badge(&d, "bob", "near-limit").is_none() && badge(&d, "ana", "near-limit").is_none())
            .then_some(())
    });
    assert!(hyperhive::proto::now() >= near_until);

    // The budget: cat's kick and one job cost its two cents; the next job
    // waits, paused, with the badge on its card.
    send(&up, "cat", "job 1");
    cat.wait_count(2);
    let want = "budget reached · $0.02 of $0.02 today";
    wait_for(LONG, "cat's budget badge", || {
        badge(&d, "cat", "budget").filter(|t| t == want)
    });
    send(&up, "cat", "over budget");
    wait_for(LONG, "the job to wait", || {
        let h = dash.get("/api/hive").ok()?;
        let cat = h["agents"]
            .as_array()?
            .iter()
            .find(|a| a["name"] == "cat")?;
        (cat["unread"] == 1).then_some(())
    });
    assert_eq!(cat.count(), 2, "no run over the budget");

    // The usage limit: ana's run is refused with a reset half a minute
    // ahead; the whole pool is parked, bob's mail waits.
    ana.step(
        ana.count() + 1,
        r#"rate_limit_event $(( $(date +%s) + 30 )); api_error 429 rate_limit "You've hit your session limit · resets 5:03am (UTC)""#,
    );
    let bob_runs = bob.count();
    send(&up, "ana", "a job over the limit");
    let until = wait_for(LONG, "the pool's pause in the rows", || {
        let h = dash.get("/api/hive").ok()?;
        let bob = h["agents"]
            .as_array()?
            .iter()
            .find(|a| a["name"] == "bob")?;
        (bob["paused"]["reason"] == "usage_limit")
            .then(|| bob["paused"]["until"].as_i64())
            .flatten()
    });
    send(&up, "bob", "bob's job while parked");
    let hhmm = d.local_hhmm(until);
    for a in ["ana", "bob"] {
        let t = wait_for(LONG, &format!("{a}'s usage-limit badge"), || {
            badge(&d, a, "usage").filter(|t| usage_badge_reads(t, &hhmm))
        });
        let _ = writeln!(std::io::stderr(), "{a}: {t}");
    }
    assert_eq!(
        badge(&d, "bob", "near-limit"),
        None,
        "the limit, not the warning"
    );
    let png = d.screenshot();
    let path = artifacts().join("limits-badges-390px.png");
    std::fs::write(&path, png).unwrap();
    let _ = writeln!(std::io::stderr(), "screenshot: {}", path.display());

    // The agents' own pages say the same.
    let t = page_badge(&d, &up, "bob", |t| usage_badge_reads(t, &hhmm));
    assert!(hyperhive::proto::now() < until, "read while parked: {t}");
    assert_eq!(bob.count(), bob_runs, "bob's claude did not start");
    page_badge(&d, &up, "cat", |t| t == want);

    // The budget field raises cat's budget: the queued job runs.
    dashboard(&d, &up);
    wait_for(T, "cat's budget field", || {
        (d.js("return !!document.getElementById('budget-cat')") == true).then_some(())
    });
    d.type_into("#budget-cat", "0.05");
    d.press("button[data-budget=\"cat\"]");
    wait_for(LONG, "the queued job to run", || {
        (cat.count() >= 3).then_some(())
    });
    assert!(cat.stdin(3).contains("over budget"), "{}", cat.stdin(3));
    wait_for(LONG, "cat's budget badge to go", || {
        badge(&d, "cat", "budget").is_none().then_some(())
    });
    let file = std::fs::read_to_string(up.fleet_file()).unwrap();
    assert!(file.contains("0.05"), "written to the fleet file: {file}");

    // After the reset both resume and their badges go.
    wait_for(LONG, "bob's job to run after the reset", || {
        (bob.count() > bob_runs).then_some(())
    });
    assert!(bob.stdin(bob.count()).contains("bob's job while parked"));
    for a in ["ana", "bob"] {
        wait_for(LONG, &format!("{a}'s usage-limit badge to go"), || {
            badge(&d, a, "usage").is_none().then_some(())
        });
    }
}
