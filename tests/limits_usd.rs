//! The budget side of issue 16 against real `hive broker` and `hive serve`
//! processes: `turn_usd` passed as the CLI's `--max-budget-usd` and a turn
//! stopped at it acked once with a notice to the parent (with the fake claude
//! printing what CLI 2.1.197 prints, and with the real CLI against the fake
//! Anthropic API); a spend row that outlives a harness killed before the broker
//! answered; what one usage-limit report can do to a pool, bounded; the spend
//! and budget gauges of the agent page's `/metrics` over HTTP; a spend row
//! dated yesterday (re-sent after midnight) counting in yesterday's window,
//! not today's; `turn_usd` known before the first run, also one that no
//! hand-out drove: an operator `/compact` asked for under a budget pause,
//! which waits for the pause to end and then runs capped; the hive's budget
//! pausing every agent until it is raised; a run without a `result` line
//! kept as cost unknown and shown as `+?`; the checkpoint and `/compact`
//! after a turn that reached the budget, each kept until a raise, and an
//! operator `/compact` queued behind such a turn; the spend the hub keeps
//! in memory per window agreeing with the store's rows. Issue 40: a run
//! reported over the per-run bounds kept clamped and flagged, told once
//! naming the reporter; `hive budget void` removing a window's rows; spend
//! that cannot be added up — past 2^64 in the store after a restart, or in
//! the hub's memory — holding the agent (the check fails closed), told
//! once, and `hive budget` still answering; a flood of pool moves writing
//! one log line a minute.

mod common;

use common::claude_cli::{claude_env, real_cli_tests, run_claude, RealCli, Sandbox};
use common::fake_anthropic::{FakeAnthropic, RequestKind, Scenario, Step, Usage};
use common::hive::*;
use common::web::Page;
use hyperhive::harness::classify::{ExitInfo, TurnObserver, TurnOutcome};
use hyperhive::proto::cmd::{
    AckTurn, BudgetReply, BudgetReport, GetBudget, OwnBudget, RecvNext, RecvNextReply, ReportPool,
    ReportSpend, ReportUsageLimit, VoidSpend, MAX_RUN_TOKENS, MAX_RUN_USD,
};
use hyperhive::proto::{now, MsgKind};
use rusqlite::Connection;
use serde_json::json;
use std::path::Path;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// What CLI 2.1.197 prints when `--max-budget-usd` is reached (probed with
/// the real CLI against the fake API; `errors` names the cap).
const MAX_BUDGET_STEP: &str = r#"init
say "working on it"
printf '{"type":"result","subtype":"error_max_budget_usd","duration_ms":70,"duration_api_ms":0,"is_error":true,"num_turns":1,"stop_reason":"tool_use","session_id":"%s","total_cost_usd":0.34155,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0,"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0},"service_tier":"standard","cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":0},"inference_geo":"","iterations":[],"speed":"standard"},"modelUsage":{"claude-sonnet-4-5":{"inputTokens":100000,"outputTokens":2000,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"webSearchRequests":0,"costUSD":0.34155,"contextWindow":200000,"maxOutputTokens":32000}},"permission_denials":[],"fast_mode_state":"off","uuid":"u-res","errors":["Reached maximum budget ($0.05)"]}\n' "$SESSION"
exit 1
"#;

/// A run that costs one cent (110 counted tokens, 50 cache reads).
const CENT: &str = r#"init
say "done"
printf '{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"duration_ms":5,"num_turns":1,"result":"done","stop_reason":"end_turn","session_id":"%s","total_cost_usd":0.01,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":50,"output_tokens":10},"modelUsage":{},"permission_denials":[],"terminal_reason":"completed","uuid":"u-res"}\n' "$SESSION"
exit 0
"#;

/// A scenario dir for the fake claude, made before the harness starts (so
/// the boot's kick turn already follows it), with its default step.
fn scenario(default: &str) -> (TempDir, FakeClaude) {
    let dir = TempDir::new("usd");
    std::fs::write(dir.path().join("default.sh"), default).unwrap();
    let fake = FakeClaude {
        dir: dir.path().to_path_buf(),
    };
    (dir, fake)
}

/// The operator's `budget`, as the rows an agent's `own_budget` has.
fn budget(b: &Broker) -> BudgetReply {
    let r: BudgetReport = b.host().call(&GetBudget {}).unwrap();
    BudgetReply {
        rows: r.rows.into_iter().map(|s| s.row).collect(),
    }
}

fn spent(b: &Broker, scope: &str) -> (f64, u64) {
    let r = budget(b);
    let row = r.rows.into_iter().find(|r| r.scope == scope).unwrap();
    (row.spent_usd, row.tokens)
}

fn drained(b: &Broker, agent: &str) -> bool {
    let r = agent_row(b, agent);
    r.unread == 0 && r.inflight.is_none()
}

// ---- turn_usd → --max-budget-usd ----

#[test]
fn turn_usd_is_passed_and_a_turn_stopped_at_it_is_acked_once_with_a_notice() {
    let (_d, fake) = scenario(CENT);
    let b = Broker::start_config(r#"{"agents":[{"name":"ana","turn_usd":0.05}]}"#);
    let fake_dir = fake.dir.display().to_string();
    let h = Harness::start(&b, "ana", &[("FAKE_CLAUDE_DIR", &fake_dir)]);
    fake.wait_count(1);
    wait_for(T, "the kick turn", || drained(&b, "ana").then_some(()));
    let argv = fake.argv(1);
    let at = argv
        .iter()
        .position(|a| a == "--max-budget-usd")
        .unwrap_or_else(|| panic!("no --max-budget-usd in {argv:?}"));
    assert_eq!(argv[at + 1], "0.05");
    operator_inbox(&b);

    fake.step(2, MAX_BUDGET_STEP);
    let id = operator_send(&b, "ana", "an expensive job");
    fake.wait_count(2);
    let notice = wait_for(T, "the parent's notice", || {
        operator_inbox(&b)
            .into_iter()
            .find(|m| m.body.contains("per-run budget"))
    });
    assert!(
        notice.body.contains(&format!("message #{id}"))
            && notice.body.contains("turn_usd $0.05")
            && notice.body.contains("Reached maximum budget ($0.05)")
            && notice.body.contains("after costing $0.341"),
        "names the message, the cap, the CLI's words and the cost: {}",
        notice.body
    );
    wait_for(T, "the message to be acked", || {
        drained(&b, "ana").then_some(())
    });
    let row = agent_row(&b, "ana");
    assert_eq!(row.failed, 0, "acked, not dead-lettered");
    // Its spend is reported like any run's: the kick's cent and this run.
    wait_for(T, "the spend of the stopped run", || {
        let (usd, tokens) = spent(&b, "ana");
        ((usd - 0.35155).abs() < 1e-9 && tokens == 110 + 102_000).then_some(())
    });
    // Never requeued: a peek of the inbox and a pause show nothing more runs.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(fake.count(), 2, "the turn is not run again");
    let stats = Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let outcome: String = stats
        .query_row(
            "SELECT outcome FROM turns ORDER BY id DESC LIMIT 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(outcome, "turn_budget");
}

/// `turn_usd` applies live under `hive up`: a hand edit of the fleet file
/// reaches the next run's `--max-budget-usd`, with no restart and no
/// `needs_update`.
#[test]
fn turn_usd_applies_live_under_hive_up() {
    let up = common::up::Up::start(
        r#"{"agents":[{"name":"ana","turn_usd":0.05,"env":{"FAKE_CLAUDE_DIR":"@FAKE(ana)"}}]}"#,
        &["ana"],
    );
    let fake = up.fake("ana");
    fake.wait_count(1);
    let flag = |n: usize| {
        let argv = fake.argv(n);
        argv.iter()
            .position(|a| a == "--max-budget-usd")
            .map(|i| argv[i + 1].clone())
    };
    assert_eq!(flag(1).as_deref(), Some("0.05"));
    let pid = up.wait_running("ana");
    let path = up.fleet_file();
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["agents"][0]["turn_usd"] = json!(0.2);
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    wait_for(T, "the supervisor to take the edit", || {
        up.state("ana")
            .filter(|s| s.applied.turn_usd == Some(0.2))
            .map(|_| ())
    });
    let _: hyperhive::proto::SentReply = up
        .host()
        .call(&hyperhive::proto::cmd::Send {
            to: "ana".into(),
            body: "after the edit".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .unwrap();
    fake.wait_count(2);
    assert_eq!(flag(2).as_deref(), Some("0.2"), "{:?}", fake.argv(2));
    let st = up.state("ana").unwrap();
    assert!(st.up_to_date, "a live key is no reason to update: {st:?}");
    assert_eq!(st.pid, Some(pid), "no restart");
}

/// What the real CLI 2.1.197 prints when `--max-budget-usd` is reached, run
/// by hand against the fake API answering a tool call with a large `usage`:
/// the line the fake claude above and the classifier's unit test copy, and
/// the classifier's reading of it.
fn the_real_cli_ends_a_run_past_max_budget_usd_with_error_max_budget_usd(cli: &RealCli) {
    let big = Usage {
        input_tokens: 200_000,
        output_tokens: 1000,
        ..Usage::default()
    };
    let api = FakeAnthropic::start(
        Scenario::new()
            .then(Step::tool_use("Read", json!({"file_path": "/etc/hostname"})).with_usage(big))
            .otherwise(Step::text("went on past the cap")),
    );
    let sb = Sandbox::new("max-budget");
    let run = run_claude(
        cli,
        &sb.cwd,
        &claude_env(&sb.home, &api.base_url()),
        &[
            "--print",
            "--verbose",
            "--output-format",
            "stream-json",
            "--model",
            "claude-sonnet-4-5",
            "--tools",
            "Read",
            "--allowedTools",
            "Read",
            "--max-budget-usd",
            "0.01",
        ],
        "read the hostname",
        Duration::from_secs(90),
    );
    let result = run.result();
    assert_eq!(result["subtype"], "error_max_budget_usd", "{run}");
    assert_eq!(result["is_error"], true, "{run}");
    assert_eq!(
        result["errors"][0], "Reached maximum budget ($0.01)",
        "{run}"
    );
    assert!(result["total_cost_usd"].as_f64().unwrap() > 0.01, "{run}");
    let calls = api
        .posts()
        .iter()
        .filter(|r| r.kind == RequestKind::Messages)
        .count();
    assert_eq!(calls, 1, "stopped before the next call: {run}");
    let mut o = TurnObserver::new();
    for line in run.stdout.lines() {
        o.on_stdout_line(line);
    }
    let report = o.finish(ExitInfo {
        code: run.code,
        ..ExitInfo::default()
    });
    assert_eq!(
        report.outcome,
        TurnOutcome::turn_budget("Reached maximum budget ($0.01)".into())
    );
    assert_eq!(
        (report.input_tokens, report.output_tokens),
        (200_000, 1000),
        "the tokens, from modelUsage (the line's usage is zeros)"
    );
}

/// The real CLI 2.1.197 against the fake API: the harness passes
/// `--max-budget-usd` (without it the CLI would go on to the tool's next
/// call), the CLI stops the run with `error_max_budget_usd`, and the turn is
/// acked, not retried.
fn the_real_cli_stops_at_the_turn_budget_and_the_turn_is_not_retried(cli: &RealCli) {
    let big = Usage {
        input_tokens: 200_000,
        output_tokens: 1000,
        ..Usage::default()
    };
    let api = FakeAnthropic::start(
        Scenario::new()
            .first(Step::text("noted the restart"))
            .then(Step::tool_use("Read", json!({"file_path": "/etc/hostname"})).with_usage(big))
            .otherwise(Step::text("went on past the cap")),
    );
    let b = Broker::start_config(r#"{"agents":[{"name":"ruth","turn_usd":0.01}]}"#);
    let cli = cli.display().to_string();
    let base = api.base_url();
    let h = Harness::start(
        &b,
        "ruth",
        &[
            ("HIVE_CLAUDE_BIN", cli.as_str()),
            ("ANTHROPIC_BASE_URL", base.as_str()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_TELEMETRY", "1"),
            ("HIVE_TURN_TIMEOUT_SECS", "90"),
        ],
    );
    wait_for(Duration::from_secs(90), "the kick turn", || {
        (!api.posts().is_empty() && drained(&b, "ruth")).then_some(())
    });
    operator_inbox(&b);
    let posts_before = api.posts().len();
    operator_send(&b, "ruth", "read the hostname");
    let notice = wait_for(Duration::from_secs(90), "the parent's notice", || {
        operator_inbox(&b)
            .into_iter()
            .find(|m| m.body.contains("per-run budget"))
    });
    assert!(
        notice.body.contains("Reached maximum budget"),
        "the CLI's own words: {}",
        notice.body
    );
    wait_for(T, "the message to be acked", || {
        drained(&b, "ruth").then_some(())
    });
    let stats = Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let (outcome, cost): (String, f64) = stats
        .query_row(
            "SELECT outcome, cost_usd FROM turns ORDER BY id DESC LIMIT 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(outcome, "turn_budget");
    assert!(cost > 0.01, "the run cost past its cap: {cost}");
    std::thread::sleep(Duration::from_secs(2));
    let mentions = api
        .posts()
        .iter()
        .skip(posts_before)
        .filter(|r| r.mentions("read the hostname"))
        .count();
    assert_eq!(
        mentions, 1,
        "one API call for the message: stopped, not retried"
    );
    assert_eq!(agent_row(&b, "ruth").failed, 0);
}

// ---- spend rows survive a harness death ----

fn stats_keys(state: &Path) -> Vec<(String, bool)> {
    let c = Connection::open(state.join("turn-stats.db")).unwrap();
    let mut stmt = c
        .prepare("SELECT spend_key, spend_acked FROM turns WHERE spend_key IS NOT NULL ORDER BY id")
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get::<_, i64>(1)? == 1)))
        .unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

fn broker_keys(b: &Broker) -> Vec<String> {
    let c = Connection::open(b.state_dir().join("broker.db")).unwrap();
    let mut stmt = c.prepare("SELECT key FROM spend ORDER BY key").unwrap();
    let rows = stmt.query_map([], |r| r.get(0)).unwrap();
    rows.collect::<rusqlite::Result<_>>().unwrap()
}

#[test]
fn a_spend_row_outlives_a_harness_killed_before_the_broker_answered() {
    let (_d, fake) = scenario(CENT);
    let mut b = Broker::start_config(r#"{"agents":[{"name":"ana"}]}"#);
    let fake_dir = fake.dir.display().to_string();
    let mut h = Harness::start(&b, "ana", &[("FAKE_CLAUDE_DIR", &fake_dir)]);
    fake.wait_count(1);
    wait_for(T, "the kick's spend", || {
        (broker_keys(&b).len() == 1).then_some(())
    });

    // The next run waits for a go, so the broker can be stopped under it.
    let go = fake.dir.join("go");
    fake.step(
        2,
        &format!(
            "touch \"$dir/running\"\nfor i in $(seq 300); do [ -e '{}' ] && break; sleep 0.1; done\n{CENT}",
            go.display()
        ),
    );
    operator_send(&b, "ana", "a job during the outage");
    wait_for(T, "the run to start", || {
        fake.dir.join("running").exists().then_some(())
    });
    b.kill9();
    std::fs::write(&go, "").unwrap();
    let lost = wait_for(T, "the run's stats row", || {
        let k = stats_keys(&h.state_dir());
        (k.len() == 2).then_some(k)
    });
    assert!(!lost[1].1, "the broker never answered: {lost:?}");
    let lost_key = lost[1].0.clone();
    h.kill9();

    b.restart();
    assert_eq!(broker_keys(&b).len(), 1, "the row was never delivered");
    h.spawn();
    // At boot the harness sends it again; the broker keeps it once, and every
    // later run (the redelivered job, the new kick) is counted too.
    let broker = wait_for(T, "every run's spend row acknowledged", || {
        let rows = stats_keys(&h.state_dir());
        let mut harness: Vec<String> = rows.iter().map(|(k, _)| k.clone()).collect();
        harness.sort();
        let broker = broker_keys(&b);
        let settled = rows.len() >= 3
            && rows.iter().all(|(_, acked)| *acked)
            && drained(&b, "ana")
            && broker == harness;
        settled.then_some(broker)
    });
    assert!(broker.contains(&lost_key), "{broker:?}");
    assert_eq!(
        broker.iter().filter(|k| **k == lost_key).count(),
        1,
        "the lost run counted exactly once"
    );
    let (usd, tokens) = spent(&b, "ana");
    assert!(
        (usd - 0.01 * broker.len() as f64).abs() < 1e-9,
        "{usd} for {} runs",
        broker.len()
    );
    assert_eq!(tokens, 110 * broker.len() as u64);
}

// ---- what one report can do to a pool ----

fn uuid(u: &str) -> ReportPool {
    ReportPool {
        account_uuid: Some(u.into()),
        credential_sha256: None,
        usage: None,
    }
}

#[test]
fn usage_limit_reports_are_capped_and_refused_for_a_pool_not_the_agents() {
    let b = Broker::start_config(
        r#"{"agents":[{"name":"ana"},{"name":"bob"},{"name":"cat"},{"name":"dan","account":"own"}]}"#,
    );
    let (mut ana, mut bob, mut cat, mut dan) = (
        b.agent("ana"),
        b.agent("bob"),
        b.agent("cat"),
        b.agent("dan"),
    );
    ok(&mut ana, uuid("u-1"));
    ok(&mut bob, uuid("u-1"));
    ok(&mut cat, uuid("u-2"));
    let limit = |until, credential| ReportUsageLimit {
        until,
        detail: "You've hit your session limit".into(),
        credential,
    };
    let t = now();
    // cat names ana's pool without being in it: refused, nothing parked.
    let e = refused(&mut cat, limit(t + 600, uuid("u-1")));
    assert!(
        e.contains("the credential named is pool uuid:u-1, but cat draws on pool uuid:u-2"),
        "{e}"
    );
    // A report that names no credential is not the pool's either.
    let e = refused(&mut ana, limit(t + 600, ReportPool::default()));
    assert!(e.contains("agent:ana"), "{e}");
    assert!(agent_row(&b, "ana").paused.is_none());
    assert!(agent_row(&b, "bob").paused.is_none());
    assert!(
        !operator_inbox(&b)
            .iter()
            .any(|m| m.kind == MsgKind::UsageLimit),
        "no notice for a refused report"
    );

    // A reset 30 days ahead parks the pool for 6 h at most.
    ok(&mut ana, limit(t + 30 * 86_400, uuid("u-1")));
    let paused = agent_row(&b, "bob").paused.expect("bob shares ana's pool");
    let until = paused.until.unwrap();
    assert!(
        until <= now() + 6 * 3600 && until >= t + 6 * 3600,
        "capped at 6 h: {until}"
    );
    assert!(
        agent_row(&b, "cat").paused.is_none(),
        "another pool runs on"
    );
    let notice = operator_inbox(&b)
        .into_iter()
        .find(|m| m.kind == MsgKind::UsageLimit)
        .expect("one notice");
    assert!(notice.body.contains("reported by ana"), "{}", notice.body);

    // dan's fleet entry names its account: its reports cannot move it, and
    // its limit parks its own account only.
    ok(&mut dan, uuid("u-2"));
    ok(&mut dan, limit(now() + 600, uuid("u-2")));
    let notice = operator_inbox(&b)
        .into_iter()
        .find(|m| m.kind == MsgKind::UsageLimit)
        .expect("dan's notice");
    assert!(
        notice.body.contains("pool account:own (dan)") && notice.body.contains("reported by dan"),
        "{}",
        notice.body
    );
    assert!(
        agent_row(&b, "cat").paused.is_none(),
        "uuid:u-2 is not parked"
    );

    // A move between pools is the broker's to log.
    ok(&mut cat, uuid("u-1"));
    wait_for(T, "the move in the broker's log", || {
        b.log()
            .contains("cat moves from pool uuid:u-2 to pool uuid:u-1")
            .then_some(())
    });
}

// ---- /metrics ----

#[test]
fn the_agent_page_exports_spend_and_budget_gauges_and_own_budget_is_the_agents() {
    let (_d, fake) = scenario(CENT);
    let b = Broker::start_config(
        r#"{"budget":{"usd":7.0,"per":"week"},"agents":[{"name":"ana","budget":{"usd":0.01,"tokens":5000,"per":"day"}}]}"#,
    );
    let fake_dir = fake.dir.display().to_string();
    let h = Harness::start(&b, "ana", &[("FAKE_CLAUDE_DIR", &fake_dir)]);
    fake.wait_count(1);
    wait_for(T, "the kick's spend", || {
        (spent(&b, "ana").0 > 0.0).then_some(())
    });
    let page = Page::of(&h.state_dir());
    // The figures are cached for 10 s: wait until they include the kick.
    let text = wait_for(Duration::from_secs(40), "the spend in /metrics", || {
        let r = page.get("/metrics");
        assert_eq!(r.status, 200, "{}", r.body);
        r.body
            .contains("hive_spend_usd{scope=\"agent\",per=\"day\"} 0.01\n")
            .then_some(r.body)
    });
    for want in [
        "hive_budget_up 1\n",
        "hive_spend_tokens{scope=\"agent\",per=\"day\"} 110\n",
        "hive_spend_cache_read_tokens{scope=\"agent\",per=\"day\"} 50\n",
        "hive_budget_usd{scope=\"agent\",per=\"day\"} 0.01\n",
        "hive_budget_tokens{scope=\"agent\",per=\"day\"} 5000\n",
        "hive_budget_usd{scope=\"hive\",per=\"week\"} 7\n",
        "hive_spend_usd{scope=\"hive\",per=\"week\"} 0.01\n",
        "hive_budget_reached{scope=\"agent\",per=\"day\"} 1\n",
        "hive_budget_reached{scope=\"hive\",per=\"week\"} 0\n",
        "hive_paused_by_budget 1\n",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    // Without its token the page answers nothing of it.
    let bare = common::web::get(&page.url("/metrics"));
    assert_eq!(bare.status, 401);
    assert!(!bare.body.contains("hive_spend"), "{}", bare.body);
    // own_budget is the agent's: the hive's row and its own, never another's;
    // the operator's socket is refused it.
    let own: BudgetReply = b.agent("ana").call(&OwnBudget {}).unwrap();
    let scopes: Vec<&str> = own.rows.iter().map(|r| r.scope.as_str()).collect();
    assert_eq!(scopes, ["hive", "ana"]);
    let e = refused(&mut b.host(), OwnBudget {});
    assert!(e.contains("own_budget"), "{e}");
}

// ---- a spend row counts in its run's window ----

/// A run of ana's, reported on her socket as a harness reports it.
fn spend(b: &Broker, key: &str, usd: f64, at: Option<i64>) -> ReportSpend {
    let c = ReportSpend {
        key: key.into(),
        usd: Some(usd),
        tokens: 1000,
        cache_read: 0,
        at,
    };
    let _: hyperhive::proto::Empty = b.agent("ana").call(&c).unwrap();
    c
}

fn spend_at(b: &Broker, key: &str) -> i64 {
    let c = Connection::open(b.state_dir().join("broker.db")).unwrap();
    c.query_row("SELECT at FROM spend WHERE key = ?1", [key], |r| r.get(0))
        .unwrap()
}

#[test]
fn a_spend_row_dated_yesterday_counts_in_yesterdays_window_not_todays() {
    let b = Broker::start_config(
        r#"{"budget":{"usd":0.05,"per":"day"},"agents":[{"name":"ana","budget":{"usd":0.05,"per":"day"}}]}"#,
    );
    // A run that ended yesterday, re-sent today (after a restart): a dollar,
    // twenty times the day's budget.
    let yesterday = now() - 86_400;
    spend(&b, "b00t:1", 1.0, Some(yesterday));
    assert_eq!(spend_at(&b, "b00t:1"), yesterday, "kept at the run's end");
    assert_eq!(spent(&b, "ana"), (0.0, 0), "not today's spend");
    assert_eq!(spent(&b, "hive"), (0.0, 0), "nor the hive's today");
    let r = budget(&b);
    assert!(r.rows.iter().all(|r| !r.reached), "{r:?}");
    // Its own window is over: nobody is told.
    let told = operator_inbox(&b);
    assert!(
        told.iter().all(|m| !m.body.contains("[budget]")),
        "{told:?}"
    );
    // The re-send of the same key is still kept once, where it was.
    spend(&b, "b00t:1", 1.0, Some(yesterday));
    assert_eq!(spent(&b, "ana"), (0.0, 0));

    // A row without `at` (an older harness) counts when it arrives; one of
    // a run that ended a minute ago counts today too, and reaching the
    // budget is told once.
    spend(&b, "old:1", 0.01, None);
    assert!(spend_at(&b, "old:1") >= yesterday + 86_400);
    spend(&b, "b00t:2", 0.04, Some(now() - 60));
    let (usd, tokens) = spent(&b, "ana");
    assert!((usd - 0.05).abs() < 1e-9, "{usd}");
    assert_eq!(tokens, 2000);
    let told: Vec<String> = operator_inbox(&b)
        .into_iter()
        .map(|m| m.body)
        .filter(|b| b.contains("budget reached"))
        .collect();
    assert_eq!(told.len(), 2, "ana's and the hive's: {told:?}");

    // A run ending an hour from now, or in 1970, is refused, naming `at`.
    for at in [now() + 3600, 0] {
        let e = refused(
            &mut b.agent("ana"),
            ReportSpend {
                key: format!("bad:{at}"),
                usd: Some(0.01),
                tokens: 1,
                cache_read: 0,
                at: Some(at),
            },
        );
        assert!(e.contains(&format!("at {at} must be the run's end")), "{e}");
    }
    let (usd, _) = spent(&b, "ana");
    assert!((usd - 0.05).abs() < 1e-9, "nothing refused was kept: {usd}");
}

/// The hub keeps each scope's spend in its window in memory (a month of a
/// busy hive is too many rows to sum at every `recv_next`): what `budget`
/// shows must be what the store holds, through rows of several agents, of
/// unknown cost, re-sent, dated yesterday, reported before and after the
/// sums were first read, and after a restart reads them afresh.
#[test]
fn the_spend_the_hub_keeps_in_memory_is_what_the_store_holds() {
    let mut b = Broker::start_config(
        r#"{"budget":{"usd":100,"per":"month"},"agents":[{"name":"ana","budget":{"usd":50,"per":"day"}},{"name":"bob"}]}"#,
    );
    let report = |b: &Broker, agent: &str, key: &str, usd: Option<f64>, at: Option<i64>| {
        let c = ReportSpend {
            key: key.into(),
            usd,
            tokens: 1000,
            cache_read: 7,
            at,
        };
        let _: hyperhive::proto::Empty = b.agent(agent).call(&c).unwrap();
    };
    // Before anything asked for the sums: read from the store at the first ask.
    report(&b, "ana", "a:1", Some(0.25), None);
    report(&b, "bob", "b:1", Some(0.5), None);
    let rows = |b: &Broker| -> Vec<(String, f64, u64, u64, u64)> {
        let r = budget(b);
        r.rows
            .into_iter()
            .map(|r| (r.scope, r.spent_usd, r.unknown_runs, r.tokens, r.cache_read))
            .collect()
    };
    let first = rows(&b);
    // After: moved by each new row, once per key, in the windows it falls in.
    report(&b, "ana", "a:2", None, None);
    report(&b, "ana", "a:2", None, None);
    report(&b, "bob", "b:2", Some(0.125), Some(now() - 60));
    report(&b, "ana", "a:3", Some(9.0), Some(now() - 86_400 * 40));
    report(&b, "ana", "a:4", Some(1.0), Some(now() - 86_400));
    let kept = rows(&b);
    assert_ne!(first, kept);
    // What the store says, summed the way `budget` sums a window.
    let db = Connection::open(b.state_dir().join("broker.db")).unwrap();
    let stored = |scope: &str, start: i64| -> (f64, u64, u64, u64) {
        db.query_row(
            "SELECT COALESCE(SUM(usd), 0), COALESCE(SUM(usd IS NULL), 0),
                    COALESCE(SUM(tokens), 0), COALESCE(SUM(cache_read), 0)
             FROM spend WHERE at >= ?1 AND (?2 = 'hive' OR agent = ?2)",
            rusqlite::params![start, scope],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .unwrap()
    };
    let r = budget(&b);
    for row in &r.rows {
        let (usd, unknown, tokens, cache_read) = stored(&row.scope, row.window_start);
        assert!((row.spent_usd - usd).abs() < 1e-9, "{row:?} vs {usd}");
        assert_eq!(
            (row.unknown_runs, row.tokens, row.cache_read),
            (unknown, tokens, cache_read),
            "{row:?}"
        );
    }
    let ana = kept.iter().find(|r| r.0 == "ana").unwrap();
    assert_eq!(
        (ana.2, ana.3, ana.4),
        (1, 2000, 14),
        "today's two rows: {kept:?}"
    );
    assert!((ana.1 - 0.25).abs() < 1e-9, "{kept:?}");
    // A restarted broker reads the sums afresh: the same figures.
    b.restart();
    let again = rows(&b);
    for (k, a) in kept.iter().zip(&again) {
        assert_eq!((&k.0, k.2, k.3, k.4), (&a.0, a.2, a.3, a.4));
        assert!((k.1 - a.1).abs() < 1e-9, "{kept:?} vs {again:?}");
    }
}

// ---- turn_usd before the first hand-out ----

/// An operator `/compact` is a synthetic run: under the broker's pause (here
/// a budget reached before the harness started, so no `recv_next` answer
/// ever handed out a message) it is kept, not run and not dropped; once the
/// operator raises the budget it runs, capped by `turn_usd` like any run.
#[test]
fn a_compaction_asked_for_under_a_budget_pause_waits_for_it_and_carries_max_budget_usd() {
    // The compaction's run compacts; any other run costs a cent.
    let (_d, fake) = scenario(&format!(
        "grep -qx /compact \"$dir/inv-$FAKE_N.stdin\" && compact_ok 50000 1000\n{CENT}"
    ));
    let b = Broker::start_config(
        r#"{"agents":[{"name":"ana","turn_usd":0.05,"budget":{"usd":0.01,"per":"day"}}]}"#,
    );
    // The day's budget is spent: the broker hands ana nothing, not even
    // the boot's kick.
    spend(&b, "earlier:1", 0.02, None);
    let fake_dir = fake.dir.display().to_string();
    let h = Harness::start(&b, "ana", &[("FAKE_CLAUDE_DIR", &fake_dir)]);
    let page = Page::of(&h.state_dir());
    wait_for(T, "the budget pause on the page", || {
        let s = page.get("/api/state").json();
        (s["paused"]["reason"] == "budget").then_some(())
    });
    // The operator compacts the session: it waits for the pause to end.
    assert_eq!(page.post("/api/compact", "{}").status, 200);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(fake.count(), 0, "nothing ran under the pause");

    // The budget is raised: the kick and the kept compaction run, capped.
    budget_set(&b.host_socket(), &["ana", "--usd", "1"]);
    let n = wait_for(T, "the /compact run", || {
        (1..=fake.count()).find(|n| fake.stdin(*n).trim() == "/compact")
    });
    let argv = fake.argv(n);
    let at = argv
        .iter()
        .position(|a| a == "--max-budget-usd")
        .unwrap_or_else(|| panic!("no --max-budget-usd in {argv:?}"));
    assert_eq!(argv[at + 1], "0.05");
    wait_for(T, "ana to drain", || drained(&b, "ana").then_some(()));
    std::thread::sleep(Duration::from_millis(500));
    let compactions = (1..=fake.count())
        .filter(|n| fake.stdin(*n).trim() == "/compact")
        .count();
    assert_eq!(compactions, 1, "kept once, run once");
}

// ---- the hive's budget ----

/// The fleet file's top-level `budget` covers every agent: once the hive's
/// spend reaches it, no agent is handed its mail (each shows the hive's
/// budget pause), and `hive budget set --hive` raising it resumes them all.
#[test]
fn a_hive_budget_pauses_every_agent_and_raising_it_resumes_them() {
    let b = Broker::start_config(
        r#"{"budget":{"usd":0.02,"per":"day"},"agents":[{"name":"ana"},{"name":"bob"}]}"#,
    );
    // Every fake run costs $0.014 (`ok_turn`): the two kicks pass $0.02.
    let ha = Harness::start(&b, "ana", &[]);
    let hb = Harness::start(&b, "bob", &[]);
    ha.fake.wait_count(1);
    hb.fake.wait_count(1);
    wait_for(T, "both kicks' spend", || {
        (spent(&b, "hive").0 > 0.0279).then_some(())
    });
    operator_send(&b, "ana", "for ana");
    operator_send(&b, "bob", "for bob");
    for a in ["ana", "bob"] {
        let p = wait_for(T, "the hive's budget pause", || {
            agent_row(&b, a)
                .paused
                .filter(|p| p.reason.as_str() == "budget")
        });
        assert!(
            p.detail
                .starts_with("the hive's budget reached · $0.03 of $0.02 today"),
            "{a}: {p:?}"
        );
    }
    std::thread::sleep(Duration::from_millis(1000));
    for (a, h) in [("ana", &ha), ("bob", &hb)] {
        assert_eq!(h.fake.count(), 1, "{a} ran nothing over the hive's budget");
        assert_eq!(agent_row(&b, a).unread, 1, "{a}'s mail waits");
    }

    budget_set(&b.host_socket(), &["--hive", "--usd", "1"]);
    for (a, h) in [("ana", &ha), ("bob", &hb)] {
        h.fake.wait_count(2);
        assert!(h.fake.stdin(2).contains(&format!("for {a}")), "{a}");
        wait_for(T, "the mail to run", || drained(&b, a).then_some(()));
        assert!(agent_row(&b, a).paused.is_none(), "{a}");
    }
}

// ---- a run of unknown cost ----

/// A run that printed no `result` line has no cost: the broker keeps its
/// spend row as cost unknown, and `hive budget` shows the spend with `+?`.
#[test]
fn a_run_without_a_result_line_is_kept_as_cost_unknown_and_shown_so() {
    let b = Broker::start_config(r#"{"agents":[{"name":"ana"}]}"#);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    // The message's first run dies before its result; the retry is a
    // normal $0.014 turn, like the kick.
    h.fake.step(2, "init\nsay \"half way\"\nexit 1");
    operator_send(&b, "ana", "a job");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    let r = wait_for(T, "the three spend rows", || {
        let r = budget(&b);
        let row = r.rows.into_iter().find(|r| r.scope == "ana").unwrap();
        (row.unknown_runs == 1 && (row.spent_usd - 0.028).abs() < 1e-9).then_some(row)
    });
    assert_eq!(broker_keys(&b).len(), 3, "{r:?}");
    let sock = b.host_socket().display().to_string();
    let (code, out, err) = run_hive(&["budget", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{err}");
    let line = out.lines().find(|l| l.starts_with("ana ")).unwrap();
    assert!(line.contains(" $0.03+? "), "{out}");
    assert!(
        out.contains("+? : some runs printed no result line; their cost is unknown"),
        "{out}"
    );
}

// ---- a checkpoint after a turn that reached the budget ----

/// The turn that fills the context past the watermark also reaches the
/// agent's budget. The checkpoint turn and its `/compact` are synthetic
/// runs: no claude starts while the broker pauses the agent. A raised budget
/// lets the checkpoint run, whose own cost reaches the new budget, so the
/// `/compact` waits in turn for the next raise; mail sent meanwhile waits
/// behind both, and nothing is dropped.
#[test]
fn a_checkpoint_after_a_turn_that_reaches_the_budget_waits_until_it_is_raised() {
    // Every fake turn costs $0.014 (`ok_turn`): the kick and the big turn
    // reach the day's $0.02.
    let b =
        Broker::start_config(r#"{"agents":[{"name":"ana","budget":{"usd":0.02,"per":"day"}}]}"#);
    let h = Harness::start(&b, "ana", &[("HIVE_COMPACT_WATERMARK_TOKENS", "10000")]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let page = common::agent_page::AgentPage::of(&h);
    h.fake.default_step(
        "grep -qx /compact \"$dir/inv-$FAKE_N.stdin\" && compact_ok 50000 1000\nok_turn done",
    );
    h.fake.step(2, "ok_turn \"read it all\" 20000");
    operator_send(&b, "ana", "read everything");
    h.fake.wait_count(2);
    page.wait_budget_pause("of $0.02 today");
    wait_drained(&b, "ana");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(h.fake.count(), 2, "no checkpoint under the pause");
    let id = operator_send(&b, "ana", "later mail");

    // $0.028 of $0.04: the checkpoint runs, and its $0.014 reaches it.
    budget_set(&b.host_socket(), &["ana", "--usd", "0.04"]);
    h.fake.wait_count(3);
    assert!(
        h.fake
            .stdin(3)
            .contains("Checkpoint: context is filling up"),
        "the checkpoint first, before the mail: {}",
        h.fake.stdin(3)
    );
    page.wait_state("the pause before the /compact", |s| {
        s["paused"]["reason"] == "budget"
            && s["paused"]["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("of $0.04 today")
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(h.fake.count(), 3, "no /compact under the pause");
    assert_eq!(agent_row(&b, "ana").unread, 1, "the mail waits");

    budget_set(&b.host_socket(), &["ana", "--usd", "1"]);
    h.fake.wait_count(5);
    assert_eq!(h.fake.stdin(4).trim(), "/compact");
    assert!(
        h.fake.stdin(5).contains("later mail"),
        "{}",
        h.fake.stdin(5)
    );
    wait_drained(&b, "ana");
    let db = Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let rows: Vec<(String, String, Option<i64>)> = db
        .prepare("SELECT kind, outcome, message_id FROM turns ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let kinds: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        kinds,
        ["turn", "turn", "checkpoint", "compact", "turn"],
        "{rows:?}"
    );
    assert_eq!(rows[4].2, Some(id), "{rows:?}");
    let outcomes: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(outcomes, ["ok", "ok", "ok", "compacted", "ok"], "{rows:?}");
    let row = agent_row(&b, "ana");
    assert_eq!(row.failed, 0, "{row:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 5, "each ran once");
}

/// An operator `/compact` queued behind a running turn whose spend reaches
/// the budget: after the turn the harness asks the broker first, so the
/// compaction waits for the raise instead of running under the new pause.
#[test]
fn an_operator_compact_queued_behind_a_turn_that_reaches_the_budget_waits_for_a_raise() {
    let b =
        Broker::start_config(r#"{"agents":[{"name":"ana","budget":{"usd":0.02,"per":"day"}}]}"#);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let page = common::agent_page::AgentPage::of(&h);
    h.fake.default_step(
        "grep -qx /compact \"$dir/inv-$FAKE_N.stdin\" && compact_ok 50000 1000\nok_turn done",
    );
    // The turn waits for the operator's /compact to be queued behind it.
    let go = h.fake.dir.join("go");
    h.fake.step(
        2,
        &format!(
            "init\nfor i in $(seq 300); do [ -e '{}' ] && break; sleep 0.1; done\nsay done\nresult_ok done\nexit 0",
            go.display()
        ),
    );
    operator_send(&b, "ana", "a job");
    h.fake.wait_count(2);
    // Answered once the request is on the loop's channel, well before the
    // turn can end.
    assert_eq!(page.post("/api/compact", "{}").status, 200);
    std::fs::write(&go, "").unwrap();
    page.wait_state("the budget pause", |s| s["paused"]["reason"] == "budget");
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(h.fake.count(), 2, "no /compact under the pause");

    budget_set(&b.host_socket(), &["ana", "--usd", "1"]);
    h.fake.wait_count(3);
    assert_eq!(h.fake.stdin(3).trim(), "/compact");
    page.wait_state("idle again", |s| {
        s["turn_state"] == "idle" && s["paused"].is_null()
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 3, "kept once, run once");
}

real_cli_tests!(
    the_real_cli_ends_a_run_past_max_budget_usd_with_error_max_budget_usd,
    the_real_cli_stops_at_the_turn_budget_and_the_turn_is_not_retried,
);

// ---- issue 40: spend that adds up ----

/// A run of `agent`'s, reported on its socket.
fn report(b: &Broker, agent: &str, key: &str, usd: Option<f64>, tokens: u64, at: Option<i64>) {
    let c = ReportSpend {
        key: key.into(),
        usd,
        tokens,
        cache_read: 0,
        at,
    };
    let _: hyperhive::proto::Empty = b.agent(agent).call(&c).unwrap();
}

/// The operator's `budget` row of `scope`, with its clamped runs and error.
fn report_of(b: &Broker, scope: &str) -> hyperhive::proto::cmd::ScopeReport {
    let r: BudgetReport = b.host().call(&GetBudget {}).unwrap();
    r.rows.into_iter().find(|r| r.row.scope == scope).unwrap()
}

/// What `agent`'s harness would be handed now, on a fresh connection (a
/// pause is answered once per connection).
fn hand_out(b: &Broker, agent: &str) -> RecvNextReply {
    b.agent(agent)
        .call(&RecvNext {
            wait_seconds: Some(0),
            seen: None,
        })
        .unwrap()
}

/// The operator's unread notices holding `needle`, marked read.
fn notices(b: &Broker, needle: &str) -> Vec<String> {
    operator_inbox(b)
        .into_iter()
        .map(|m| m.body)
        .filter(|body| body.contains(needle))
        .collect()
}

/// Rows no broker writes, put into `b`'s store while it is stopped: `agent`'s
/// runs of now with these token counts. The broker starts again on them.
fn craft_rows(b: &mut Broker, agent: &str, tokens: &[i64]) {
    b.kill9();
    let db = Connection::open(b.state_dir().join("broker.db")).unwrap();
    for (i, t) in tokens.iter().enumerate() {
        db.execute(
            "INSERT INTO spend (key, agent, at, usd, tokens, cache_read) VALUES (?1, ?2, ?3, 0.0, ?4, 0)",
            rusqlite::params![format!("crafted:{i}"), agent, now(), t],
        )
        .unwrap();
    }
    drop(db);
    b.restart();
}

/// A report over the per-run bounds ($1000, 10^9 tokens) is kept at the
/// bounds and flagged, in the row and in `hive budget`; the operator hears
/// once, naming the agent whose socket reported it; a run within them is
/// kept as it is.
#[test]
fn a_run_over_the_per_run_bounds_is_kept_clamped_flagged_and_told_once() {
    let b = Broker::start_config(r#"{"agents":[{"name":"ana"},{"name":"eve"}]}"#);
    report(&b, "eve", "forged:1", Some(1e6), 1_000_000_000_000, None);
    report(&b, "eve", "forged:2", Some(5000.0), 10, None);
    report(&b, "ana", "real:1", Some(0.5), 2000, None);
    let db = Connection::open(b.state_dir().join("broker.db")).unwrap();
    let row = |key: &str| -> (f64, i64, bool) {
        db.query_row(
            "SELECT usd, tokens, clamped FROM spend WHERE key = ?1",
            [key],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap()
    };
    assert_eq!(row("forged:1"), (MAX_RUN_USD, MAX_RUN_TOKENS as i64, true));
    assert_eq!(row("forged:2"), (MAX_RUN_USD, 10, true));
    assert_eq!(row("real:1"), (0.5, 2000, false));

    let eve = report_of(&b, "eve");
    assert_eq!(eve.clamped_runs, 2, "{eve:?}");
    assert!(
        (eve.row.spent_usd - 2.0 * MAX_RUN_USD).abs() < 1e-6,
        "{eve:?}"
    );
    assert_eq!(eve.row.tokens, MAX_RUN_TOKENS + 10);
    assert_eq!(report_of(&b, "ana").clamped_runs, 0);
    assert_eq!(report_of(&b, "hive").clamped_runs, 2);
    let told = notices(&b, "over the per-run bounds");
    assert_eq!(told.len(), 1, "once, not per row: {told:?}");
    assert!(told[0].contains("eve reported a run"), "{told:?}");
    assert!(told[0].contains("hive budget void eve"), "{told:?}");

    let sock = b.host_socket().display().to_string();
    let (code, out, err) = run_hive(&["budget", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("CLAMPED"), "{out}");
    let line = out.lines().find(|l| l.starts_with("eve ")).unwrap();
    assert!(line.split_whitespace().any(|w| w == "2"), "{out}");
    // The log says it once a minute, however many come.
    assert_eq!(b.log().matches("eve reported a run over").count(), 1);
}

/// `hive budget void AGENT` removes the agent's rows of its current window
/// (not yesterday's, not another agent's), tells the operator, and an agent
/// paused on its budget is handed its mail again; `--hive` voids every
/// agent's rows of the hive's window. Only the operator may.
#[test]
fn void_removes_the_current_windows_rows_and_the_pause_ends() {
    let b = Broker::start_config(
        r#"{"budget":{"usd":10,"per":"day"},"agents":[{"name":"ana","budget":{"usd":1,"per":"day"}},{"name":"bob"}]}"#,
    );
    report(&b, "ana", "ana:old", Some(0.5), 10, Some(now() - 86_400));
    report(&b, "ana", "ana:1", Some(2.0), 10, None);
    report(&b, "bob", "bob:1", Some(1.0), 10, None);
    operator_send(&b, "ana", "for ana");
    let r = hand_out(&b, "ana");
    assert!(r.message.is_none(), "{r:?}");
    assert_eq!(
        r.paused.map(|p| p.reason.as_str().to_string()).as_deref(),
        Some("budget")
    );

    let e = refused(
        &mut b.agent("ana"),
        VoidSpend {
            agent: Some("ana".into()),
            hive: false,
        },
    );
    assert!(e.contains("void_spend"), "{e}");
    let e = refused(
        &mut b.host(),
        VoidSpend {
            agent: Some("zed".into()),
            hive: false,
        },
    );
    assert!(e.contains("unknown agent"), "{e}");

    let _ = operator_inbox(&b);
    let sock = b.host_socket().display().to_string();
    let (code, out, err) = run_hive(&["budget", "void", "ana", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 run rows"), "{out}");
    let keys = broker_keys(&b);
    assert_eq!(keys, ["ana:old", "bob:1"], "today's row of ana's went");
    let told = notices(&b, "is voided");
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(told[0].contains("the spend of ana today"), "{told:?}");
    assert_eq!(spent(&b, "ana"), (0.0, 0));
    let r = hand_out(&b, "ana");
    assert_eq!(r.message.map(|m| m.body).as_deref(), Some("for ana"));

    let (code, out, err) = run_hive(
        &["budget", "void", "--hive", "--json", "--socket", &sock],
        None,
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        (v["scope"].clone(), v["voided"].clone()),
        (json!("hive"), json!(1))
    );
    assert_eq!(broker_keys(&b), ["ana:old"], "yesterday's stays");
    assert_eq!(spent(&b, "hive"), (0.0, 0));
    assert!(b.log().contains("the operator voided spend"), "logged");
}

/// Spend past 2^64 in the store: after a restart the broker's sum cannot
/// be made, and instead of handing out mail as if nothing were spent (it
/// did: robustness review N4) the agent is held — its budget check fails
/// closed — the operator is told once, `hive budget` answers and names the
/// scope, and a void lets the agent run again. An agent without a budget
/// runs on.
#[test]
fn spend_past_two_to_the_64_in_the_store_fails_closed_after_a_restart() {
    // A dollar budget only: tokens alone never reach it.
    let mut b = Broker::start_config(
        r#"{"agents":[{"name":"ana","budget":{"usd":5,"per":"day"}},{"name":"bob"}]}"#,
    );
    craft_rows(&mut b, "ana", &[i64::MAX, i64::MAX, i64::MAX]);
    operator_send(&b, "ana", "for ana");
    operator_send(&b, "bob", "for bob");
    for _ in 0..3 {
        let r = hand_out(&b, "ana");
        assert!(r.message.is_none(), "fails closed: {r:?}");
        let p = r.paused.expect("the budget pause");
        assert_eq!(p.reason.as_str(), "budget");
        assert!(p.detail.contains("cannot be added up"), "{p:?}");
        assert!(p.detail.contains("hive budget void ana"), "{p:?}");
    }
    let r = hand_out(&b, "bob");
    assert_eq!(r.message.map(|m| m.body).as_deref(), Some("for bob"));
    let told = notices(&b, "cannot be added up");
    assert_eq!(told.len(), 1, "once: {told:?}");
    assert!(told[0].contains("the spend of ana today"), "{told:?}");

    let ana = report_of(&b, "ana");
    assert!(ana.row.reached, "{ana:?}");
    assert!(ana.error.as_deref().unwrap().contains("2^64"), "{ana:?}");
    let sock = b.host_socket().display().to_string();
    let (code, out, err) = run_hive(&["budget", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let line = out.lines().find(|l| l.starts_with("ana ")).unwrap();
    assert!(line.contains("held: its spend cannot be added up"), "{out}");
    // The failed sum was kept: one scan, not one per check.
    assert_eq!(
        b.log()
            .matches("the spend of ana cannot be added up")
            .count(),
        1
    );

    budget_set(&b.host_socket(), &["ana", "--usd", "9"]);
    assert!(
        hand_out(&b, "ana").message.is_none(),
        "a raise is no remedy"
    );
    let (code, out, err) = run_hive(&["budget", "void", "ana", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{out}{err}");
    let r = hand_out(&b, "ana");
    assert_eq!(r.message.map(|m| m.body).as_deref(), Some("for ana"));
}

/// Spend the store can add up (just below 2^64 tokens) and one more run
/// on top, in the hub's memory: the sum is checked, not wrapped, so the
/// agent is held from then on (it ran before), the operator is told once,
/// and a restart, which reads the store again, holds it still.
#[test]
fn spend_past_two_to_the_64_in_memory_fails_closed() {
    let mut b =
        Broker::start_config(r#"{"agents":[{"name":"ana","budget":{"usd":5,"per":"day"}}]}"#);
    craft_rows(&mut b, "ana", &[i64::MAX, i64::MAX]);
    operator_send(&b, "ana", "first");
    let r = hand_out(&b, "ana");
    let m = r
        .message
        .expect("2^64 - 2 tokens and $0: under the dollar budget");
    let _: hyperhive::proto::Empty = b
        .agent("ana")
        .call(&AckTurn {
            id: m.id,
            turn: None,
        })
        .unwrap();
    assert_eq!(report_of(&b, "ana").row.tokens, u64::MAX - 1);

    report(&b, "ana", "run:1", Some(0.01), 10, None);
    operator_send(&b, "ana", "second");
    let r = hand_out(&b, "ana");
    assert!(r.message.is_none(), "fails closed: {r:?}");
    assert!(r.paused.unwrap().detail.contains("cannot be added up"));
    assert_eq!(notices(&b, "cannot be added up").len(), 1);
    assert!(report_of(&b, "ana").error.is_some());

    b.restart();
    let r = hand_out(&b, "ana");
    assert!(r.message.is_none(), "still held after a restart: {r:?}");
    assert!(report_of(&b, "ana").error.unwrap().contains("2^64"));
}

/// A flood of reports from one agent's socket writes one log line a minute
/// per kind, not one per report (robustness review N13: 10 000 pool moves
/// and near-limit reports wrote 1.4 MB); another agent's lines are its own.
#[test]
fn a_flood_of_pool_moves_writes_one_line_a_minute_per_agent() {
    let b = Broker::start(&["ana", "bob"]);
    let mut ana = b.agent("ana");
    for i in 0..500 {
        let _: hyperhive::proto::cmd::PoolReply = ana
            .call(&uuid(if i % 2 == 0 { "u-even" } else { "u-odd" }))
            .unwrap();
    }
    let mut bob = b.agent("bob");
    for u in ["u-one", "u-two"] {
        let _: hyperhive::proto::cmd::PoolReply = bob.call(&uuid(u)).unwrap();
    }
    // The hub answers in order: once bob's last report is answered, every
    // line of ana's is written or counted.
    let log = b.log();
    assert_eq!(log.matches("ana moves from pool").count(), 1, "{log}");
    assert_eq!(log.matches("bob moves from pool").count(), 1);
}
