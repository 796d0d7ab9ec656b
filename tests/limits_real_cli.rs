//! Usage limits with the real Claude Code CLI, both ends of the supported window (issue 16): two agents
//! of one pool (the fleet's explicit `"account"`), each a `hive serve` running
//! the real CLI with an OAuth token against its own fake Anthropic API, so the
//! requests of each agent are counted apart. The API answers with the unified
//! rate-limit headers of a subscriber, and the `resetsAt` the pool parks on,
//! or the early warning the dashboard shows, comes from the CLI's own
//! `rate_limit_event` line. The last test runs the same pool under a real
//! `hive up` and reads the warning off the dashboard, in its JSON and in
//! headless Chromium. Skips loudly without the CLI (or Chromium, for the
//! last); fails under `HIVE_REQUIRE_REAL_CLAUDE=1`.

mod common;

use common::claude_cli::{real_cli_tests, RealCli};
use common::fake_anthropic::{FakeAnthropic, RecordedRequest, Scenario, Step};
use common::hive::*;
use hyperhive::proto::{Message, MsgKind};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

/// An OAuth token as `claude setup-token` prints them; the CLI sends it as a
/// bearer token and the fake API takes any.
const OAUTH_TOKEN: &str = "sk-ant-oat01-hive-test-not-a-real-token";

/// ana and bob draw on one account, named in the broker's config.
const CONFIG: &str = r#"{"agents": [
  {"name": "ana", "account": "team"},
  {"name": "bob", "account": "team"}
]}"#;

/// One agent: its fake API (answering the boot kick first) and its harness
/// running the real CLI with only an OAuth token.
struct Agent {
    api: FakeAnthropic,
    h: Harness,
}

fn start_agent(b: &Broker, cli: &str, name: &str, scenario: Scenario) -> Agent {
    let api = FakeAnthropic::start(scenario.first(Step::text("noted the restart")));
    let base = api.base_url();
    let h = Harness::start(
        b,
        name,
        &[
            ("HIVE_CLAUDE_BIN", cli),
            ("ANTHROPIC_BASE_URL", base.as_str()),
            // No API key: the rate_limit_event lines are the OAuth path's.
            ("ANTHROPIC_API_KEY", ""),
            ("CLAUDE_CODE_OAUTH_TOKEN", OAUTH_TOKEN),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_TELEMETRY", "1"),
            ("HIVE_CLAUDE_MAX_RETRIES", "0"),
            ("HIVE_TURN_TIMEOUT_SECS", "90"),
        ],
    );
    Agent { api, h }
}

/// A broker with ana and bob, both past their boot kick turn.
fn pool(cli: &std::path::Path, ana: Scenario, bob: Scenario) -> (Broker, Agent, Agent) {
    let b = Broker::start_config(CONFIG);
    let cli = cli.display().to_string();
    let ana = start_agent(&b, &cli, "ana", ana);
    let bob = start_agent(&b, &cli, "bob", bob);
    for (name, a) in [("ana", &ana), ("bob", &bob)] {
        wait_for(T, &format!("{name}'s kick turn"), || {
            (!a.api.posts().is_empty() && agent_row(&b, name).inflight.is_none()).then_some(())
        });
        wait_drained(&b, name);
    }
    assert_eq!(agent_row(&b, "ana").pool.as_deref(), Some("account:team"));
    assert_eq!(agent_row(&b, "bob").pool.as_deref(), Some("account:team"));
    // The OAuth token took the path that sends it as a bearer token.
    let kick = ana.api.posts().remove(0);
    assert_eq!(kick.header("x-api-key"), None, "no API key was sent");
    (b, ana, bob)
}

/// The operator's messages so far, peeked (nothing is marked read).
fn operator_messages(b: &Broker) -> Vec<Message> {
    common::hive::peek_inbox(&mut b.host())
}

/// `(kind, outcome, note, started_at)` of every run in the harness's stats.
fn stats(h: &Harness) -> Vec<(String, String, String, i64)> {
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let rows = db
        .prepare("SELECT kind, outcome, note, started_at FROM turns ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

fn mentions(posts: &[RecordedRequest], needle: &str) -> bool {
    posts.iter().any(|r| r.mentions(needle))
}

fn the_real_clis_usage_limit_parks_the_pool_until_the_reset_it_reported(cli: &RealCli) {
    let (b, ana, bob) = pool(
        cli,
        Scenario::new().otherwise(Step::text("ana's job done")),
        Scenario::new().otherwise(Step::text("bob's job done")),
    );
    let bob_kicked = bob.api.posts().len();

    // ana's next request hits the five-hour limit, resetting 15 s after the
    // answer.
    ana.api.set_scenario(
        Scenario::new()
            .then(Step::usage_limit_reached(15))
            .otherwise(Step::text("ana's job done after the reset")),
    );
    let first = operator_send(&b, "ana", "ana's job");
    let paused = wait_for(T, "the pool to be parked", || {
        agent_row(&b, "bob")
            .paused
            .filter(|p| p.reason.as_str() == "usage_limit")
    });
    let limited = ana.api.posts().pop().unwrap();
    let reset: i64 = limited
        .answered_header("anthropic-ratelimit-unified-reset")
        .unwrap()
        .parse()
        .unwrap();
    // The CLI's own rate_limit_event carried the reset: the classifier
    // noted it (the result text only says "resets 12:22pm (UTC)", to the
    // minute), and the broker parks the pool until exactly then.
    let rows = stats(&ana.h);
    let limited_row = rows.last().unwrap();
    assert_eq!(
        (limited_row.1.as_str(), limited_row.2.as_str()),
        ("rate_limited", format!("resets at {reset}").as_str()),
        "{rows:?}"
    );
    assert_eq!(paused.until, Some(reset), "{paused:?}");
    // 2.1.197 says "session limit", 2.1.332 "5-hour limit".
    let wording = if cli.at_least("2.1.332") {
        "You've hit your 5-hour limit"
    } else {
        "You've hit your session limit"
    };
    assert!(paused.detail.contains(wording), "{paused:?}");

    // bob has mail while the pool is parked: it waits, and bob's claude does
    // not start (its API sees nothing) before the reset.
    let second = operator_send(&b, "bob", "bob's job");
    wait_for(T, "ana's and bob's jobs to run after the reset", || {
        let a = ana.api.posts();
        let done = mentions(&bob.api.posts(), "bob's job")
            && a.len() >= 3
            && agent_row(&b, "ana").unread == 0
            && agent_row(&b, "bob").unread == 0
            && agent_row(&b, "ana").inflight.is_none()
            && agent_row(&b, "bob").inflight.is_none();
        done.then_some(())
    });
    let bob_posts = bob.api.posts();
    assert!(
        bob_posts[bob_kicked..]
            .iter()
            .all(|r| r.unix() >= reset as f64),
        "bob's claude sent a request before the reset at {reset}: {:?}",
        bob_posts
            .iter()
            .map(RecordedRequest::unix)
            .collect::<Vec<_>>()
    );
    assert_eq!(bob_posts.len(), bob_kicked + 1, "bob ran its job once");
    assert!(bob_posts.last().unwrap().mentions("bob's job"));
    let bob_rows = stats(&bob.h);
    assert_eq!(
        bob_rows.len(),
        2,
        "bob spawned claude once more: {bob_rows:?}"
    );
    assert!(bob_rows[1].3 >= reset, "{bob_rows:?} vs {reset}");
    assert_eq!(bob_rows[1].1, "ok", "{bob_rows:?}");

    // ana retried once, after the reset, in the session that has its job.
    let ana_posts = ana.api.posts();
    let after: Vec<&RecordedRequest> = ana_posts
        .iter()
        .skip_while(|r| {
            r.answered_header("anthropic-ratelimit-unified-reset")
                .is_none()
        })
        .skip(1)
        .collect();
    assert_eq!(after.len(), 1, "one retry");
    assert!(
        after[0].unix() >= reset as f64,
        "ana retried before the reset"
    );
    assert!(after[0].mentions("ana's job"), "the job is in the session");
    assert_eq!(stats(&ana.h).last().unwrap().1, "ok");

    // Nothing lost, nothing paused any more, one notice for the pool.
    for name in ["ana", "bob"] {
        let r = agent_row(&b, name);
        assert_eq!(r.failed, 0, "{name}: nothing dead-lettered");
        assert!(r.paused.is_none(), "{name}: {:?}", r.paused);
    }
    let notices: Vec<Message> = operator_messages(&b)
        .into_iter()
        .filter(|m| m.kind == MsgKind::UsageLimit)
        .collect();
    assert_eq!(
        notices.len(),
        1,
        "one notice per pool and window: {notices:?}"
    );
    assert!(notices[0].body.contains("ana, bob"), "{}", notices[0].body);
    assert!(
        !operator_messages(&b).iter().any(
            |m| m.body.contains(&format!("#{first}")) || m.body.contains(&format!("#{second}"))
        ),
        "no message was given up on"
    );
}

fn the_real_clis_early_warning_marks_the_pool_until_the_reset(cli: &RealCli) {
    let (b, ana, _bob) = pool(
        cli,
        Scenario::new().otherwise(Step::text("done")),
        Scenario::new().otherwise(Step::text("done")),
    );
    // The kick turns said `allowed`: no warning.
    assert_eq!(agent_row(&b, "bob").near_limit, None);

    // An answer whose headers say the five-hour window is at 92 %, resetting
    // in an hour: both agents of the pool show it, the run itself is fine.
    ana.api.set_scenario(
        Scenario::new()
            .then(Step::near_usage_limit("noted", 0.92, 3600))
            .otherwise(Step::text("done")),
    );
    operator_send(&b, "ana", "a job near the limit");
    let near = wait_for(T, "bob's row to show the warning", || {
        agent_row(&b, "bob").near_limit
    });
    let warned = ana
        .api
        .posts()
        .into_iter()
        .find(|r| {
            r.answered_header("anthropic-ratelimit-unified-5h-reset")
                .is_some()
        })
        .unwrap();
    let reset: i64 = warned
        .answered_header("anthropic-ratelimit-unified-5h-reset")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(near.until, reset, "{near:?}");
    assert_eq!(near.window.as_deref(), Some("five_hour"));
    assert_eq!(near.utilization, Some(0.92));
    assert_eq!(near.reported_by, "ana");
    assert_eq!(agent_row(&b, "ana").near_limit, Some(near));
    wait_drained(&b, "ana");
    assert_eq!(
        stats(&ana.h).last().unwrap().1,
        "ok",
        "a warning is no failure"
    );
    assert!(agent_row(&b, "ana").paused.is_none());

    // The next run's answer says `allowed` again: the warning goes.
    operator_send(&b, "ana", "a job after the window moved");
    wait_for(T, "the warning to be cleared", || {
        agent_row(&b, "bob").near_limit.is_none().then_some(())
    });
    wait_drained(&b, "ana");

    // A warning for a window that resets in a few seconds is shown until then.
    ana.api.set_scenario(
        Scenario::new()
            .then(Step::near_usage_limit("noted", 0.97, 10))
            .otherwise(Step::text("done")),
    );
    operator_send(&b, "ana", "a job just before the reset");
    let near = wait_for(T, "the short warning", || agent_row(&b, "bob").near_limit);
    assert_eq!(near.utilization, Some(0.97));
    wait_for(T, "the warning to end at the reset", || {
        agent_row(&b, "bob").near_limit.is_none().then_some(())
    });
    assert!(
        hyperhive::proto::now() >= near.until,
        "shown until the reset at {}",
        near.until
    );
    assert!(
        !operator_messages(&b)
            .iter()
            .any(|m| m.kind == MsgKind::UsageLimit),
        "a warning parks nothing and sends no usage-limit notice"
    );
}

/// The same pool under a real `hive up`, the real CLI for both agents and
/// one fake API: the warning ana's run printed is on both agents' cards of
/// the dashboard, in its JSON and as the badge in headless Chromium.
fn the_real_clis_early_warning_is_on_the_dashboard_of_hive_up(cli: &RealCli) {
    use common::browser::{browser, Driver};
    use common::up::{Launch, Up};
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let api = FakeAnthropic::start(Scenario::new().otherwise(Step::text("noted")));
    let base = api.base_url();
    let entry = |name: &str| {
        format!(
            r#"{{"name": "{name}", "account": "team", "env": {{
              "ANTHROPIC_BASE_URL": "{base}", "CLAUDE_CODE_OAUTH_TOKEN": "{OAUTH_TOKEN}",
              "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
              "HIVE_CLAUDE_MAX_RETRIES": "0", "HIVE_TURN_TIMEOUT_SECS": "90"}}}}"#
        )
    };
    let fleet = format!(r#"{{"agents": [{}, {}]}}"#, entry("ana"), entry("bob"));
    let up = Up::launch(
        &fleet,
        &["ana", "bob"],
        Launch {
            // Only the fleet file's OAuth token: no API key anywhere.
            no_api_key: true,
            env: vec![
                ("HIVE_CLAUDE_BIN".into(), cli.display().to_string()),
                ("HIVE_DASHBOARD_POLL_MS".into(), "100".into()),
            ],
            ..Launch::default()
        },
    );
    let row = |name: &str| -> hyperhive::proto::AgentRow {
        let r: hyperhive::proto::cmd::AgentsReply =
            up.host().call(&hyperhive::proto::cmd::Agents {}).unwrap();
        r.agents.into_iter().find(|a| a.name == name).unwrap()
    };
    wait_for(T, "both kick turns", || {
        let idle = |n: &str| {
            let r = row(n);
            r.running && r.unread == 0 && r.inflight.is_none()
        };
        (api.posts().len() >= 2 && idle("ana") && idle("bob")).then_some(())
    });
    assert!(
        api.posts().iter().all(|r| r.header("x-api-key").is_none()),
        "the CLI ran on the OAuth token"
    );
    api.set_scenario(
        Scenario::new()
            .then(Step::near_usage_limit("noted", 0.91, 3600))
            .otherwise(Step::text("noted")),
    );
    let _: hyperhive::proto::SentReply = up
        .host()
        .call(&hyperhive::proto::cmd::Send {
            to: "ana".into(),
            body: "a job near the limit".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .unwrap();
    let dash = up.dashboard();
    let cards = wait_for(T, "the warning on both cards", || {
        let h = dash.get("/api/hive").ok()?;
        let cards: Vec<serde_json::Value> = h["agents"].as_array()?.clone();
        cards
            .iter()
            .all(|c| c["near_limit"].is_object())
            .then_some(cards)
    });
    let reset: i64 = api
        .posts()
        .iter()
        .find_map(|r| r.answered_header("anthropic-ratelimit-unified-5h-reset"))
        .unwrap()
        .parse()
        .unwrap();
    for c in &cards {
        assert_eq!(c["near_limit"]["until"], reset, "{c}");
        assert_eq!(c["near_limit"]["utilization"], 0.91, "{c}");
        assert_eq!(c["near_limit"]["reported_by"], "ana", "{c}");
        assert_eq!(c["pool"], "account:team", "{c}");
    }

    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    let offset = d
        .js(&format!(
            "return new Date({reset} * 1000).getTimezoneOffset()"
        ))
        .as_i64()
        .unwrap();
    let local = reset - offset * 60;
    let want = format!(
        "⚠ near usage limit · resets {:02}:{:02}",
        local.rem_euclid(86400) / 3600,
        local.rem_euclid(3600) / 60
    );
    for name in ["ana", "bob"] {
        wait_for(T, &format!("{name}'s badge"), || {
            let v = d.js(&format!(
                "const e = document.querySelector('.card.agent[data-agent=\"{name}\"] [data-badge=\"near-limit\"]'); return e ? e.textContent.trim() : null"
            ));
            (v.as_str() == Some(want.as_str())).then_some(())
        });
    }
}

/// A weekly limit whose reset only its window names (2.5 h ahead, no time in
/// the CLI's text): 2.1.332's `unifiedWindows` give the reset, and the pool
/// is parked until exactly then; 2.1.197 prints no windows, so its agent
/// waits the rate-limit default (`HIVE_RATE_LIMIT_SLEEP_SECS`) and nothing
/// parks the pool.
fn a_weekly_limit_parks_the_pool_until_its_windows_reset(cli: &RealCli) {
    let (b, ana, _bob) = pool(
        cli,
        Scenario::new().otherwise(Step::text("ana's job done")),
        Scenario::new().otherwise(Step::text("bob's job done")),
    );
    ana.api.set_scenario(
        Scenario::new()
            .then(Step::weekly_limit_reset_only_in_window(9000))
            .otherwise(Step::text("ana's job done after the reset")),
    );
    operator_send(&b, "ana", "ana's job");
    let paused = wait_for(T, "ana to pause", || agent_row(&b, "ana").paused);
    let limited = ana.api.posts().pop().unwrap();
    let reset: i64 = limited
        .answered_header("anthropic-ratelimit-unified-7d-reset")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        limited
            .answered_header("anthropic-ratelimit-unified-reset")
            .is_none(),
        "the reset is only in the window"
    );
    if cli.at_least("2.1.332") {
        assert_eq!(paused.reason.as_str(), "usage_limit", "{paused:?}");
        assert_eq!(paused.until, Some(reset), "{paused:?}");
        let bob = wait_for(T, "the pool to be parked", || {
            agent_row(&b, "bob")
                .paused
                .filter(|p| p.reason.as_str() == "usage_limit")
        });
        assert_eq!(bob.until, Some(reset), "{bob:?}");
        assert!(
            bob.detail.contains("You've hit your weekly limit"),
            "{bob:?}"
        );
    } else {
        // No window, no reset: the default pause of this agent alone.
        assert_eq!(paused.reason.as_str(), "rate_limit", "{paused:?}");
        let until = paused.until.expect("a pause ends");
        assert!(until < reset, "{paused:?} against the window's {reset}");
        assert_eq!(agent_row(&b, "bob").paused, None);
    }
}

real_cli_tests!(
    a_weekly_limit_parks_the_pool_until_its_windows_reset,
    the_real_clis_early_warning_is_on_the_dashboard_of_hive_up,
    the_real_clis_usage_limit_parks_the_pool_until_the_reset_it_reported,
    the_real_clis_early_warning_marks_the_pool_until_the_reset,
);
