//! The whole loop with the real Claude Code CLI: `hive broker` + `hive serve`
//! running the real CLI (each end of the supported window) against the fake Anthropic API on 127.0.0.1.
//! `hive wake` → a turn → the model calls `mcp__hyperhive__send` → the message is
//! in the operator inbox; the next turn's request carries the first turn's history
//! (`--continue`); a prompt-too-long turn is compacted by the harness and retried;
//! a compaction that hits a rate limit keeps the message and compacts again; a
//! session `/compact` cannot shrink is replaced by a fresh one.
//! Skips loudly without the CLI; fails under `HIVE_REQUIRE_REAL_CLAUDE=1`.

mod common;

use common::claude_cli::{real_cli_tests, RealCli};
use common::fake_anthropic::{FakeAnthropic, RequestKind, Scenario, Step};
use common::hive::*;
use serde_json::json;
use std::time::Duration;

/// A broker, the fake API answering `scenario` after the boot kick turn, and a
/// harness running the real CLI `cli` against it, with the kick turn done.
fn ready(
    cli: &RealCli,
    scenario: Scenario,
    extra_env: &[(&str, &str)],
) -> (Broker, FakeAnthropic, Harness) {
    let b = Broker::start(&["ruth"]);
    let api = FakeAnthropic::start(scenario.first(Step::text("noted the restart")));
    let cli = cli.display().to_string();
    let base = api.base_url();
    let mut env = vec![
        ("HIVE_CLAUDE_BIN", cli.as_str()),
        ("ANTHROPIC_BASE_URL", base.as_str()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("HIVE_TURN_TIMEOUT_SECS", "90"),
    ];
    env.extend_from_slice(extra_env);
    let h = Harness::start(&b, "ruth", &env);
    wait_for(Duration::from_secs(60), "the kick turn", || {
        (!api.posts().is_empty() && agent_row(&b, "ruth").inflight.is_none()).then_some(())
    });
    wait_drained(&b, "ruth");
    (b, api, h)
}

/// The harness's turns so far, as (kind, outcome) in order.
fn stats(h: &Harness) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let rows: Vec<(String, String)> = db
        .prepare("SELECT kind, outcome FROM turns ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

/// The note of the harness's first turn of `kind`.
fn first_note(h: &Harness, kind: &str) -> String {
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    db.query_row(
        "SELECT note FROM turns WHERE kind = ?1 ORDER BY id LIMIT 1",
        [kind],
        |r| r.get(0),
    )
    .unwrap()
}

fn wake_turn_tool_call_and_continue_through_hive_serve(cli: &RealCli) {
    let (b, api, _h) = ready(
        cli,
        Scenario::new()
            // The woken turn: a tool call, then text.
            .then(Step::tool_use(
                "mcp__hyperhive__send",
                json!({"to": "operator", "body": "hello from real claude"}),
            ))
            .then(Step::text("sent it"))
            .otherwise(Step::text("second turn done")),
        &[],
    );
    let sock = b.agent_socket("ruth");
    let (code, _, err) = run_hive(
        &["wake", "--from", "cron", "--body", "nightly report please"],
        None,
        &[("HIVE_SOCKET", sock.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{err}");
    let m = wait_for(Duration::from_secs(60), "the operator message", || {
        operator_inbox(&b)
            .into_iter()
            .find(|m| m.body == "hello from real claude")
    });
    assert_eq!(m.from, "ruth");
    wait_drained(&b, "ruth");

    operator_send(&b, "ruth", "and now the summary");
    wait_for(Duration::from_secs(60), "the second turn", || {
        api.posts()
            .iter()
            .any(|r| r.mentions("and now the summary"))
            .then_some(())
    });
    wait_drained(&b, "ruth");
    let second = api
        .posts()
        .into_iter()
        .find(|r| r.mentions("and now the summary"))
        .unwrap();
    assert!(
        second.mentions("nightly report please") && second.mentions("sent it"),
        "--continue carries the first turn's history"
    );
}

fn prompt_too_long_is_compacted_by_the_harness_and_retried(cli: &RealCli) {
    let (b, api, h) = ready(
        cli,
        Scenario::new()
            .then(Step::prompt_too_long())
            .auto_compact("COMPACT-SUMMARY: the agent restarted")
            .otherwise(Step::text("handled after compaction")),
        &[],
    );
    operator_send(&b, "ruth", "a big job");
    wait_for(Duration::from_secs(90), "the retried turn", || {
        let posts = api.posts();
        let compacted = posts.iter().any(|r| r.kind == RequestKind::Compact);
        let retried = posts
            .iter()
            .filter(|r| r.kind == RequestKind::Messages && r.mentions("a big job"))
            .count()
            >= 2;
        (compacted && retried).then_some(())
    });
    wait_drained(&b, "ruth");
    let kinds = stats(&h);
    assert_eq!(
        kinds.iter().map(|k| k.0.as_str()).collect::<Vec<_>>(),
        ["turn", "turn", "compact", "turn"],
        "{kinds:?}"
    );
    assert_eq!(kinds[1].1, "prompt_too_long");
    assert_eq!(kinds[2].1, "compacted");
    assert_eq!(kinds[3].1, "ok");
}

fn a_rate_limited_compaction_keeps_the_message_then_compacts_again_and_retries(cli: &RealCli) {
    let (b, api, h) = ready(
        cli,
        Scenario::new()
            .then(Step::prompt_too_long())
            // The first /compact's request is refused (and not retried: the
            // CLI may not retry), the second one is summarised.
            .then(Step::rate_limited())
            .then(Step::compact("COMPACT-SUMMARY: a big job is pending"))
            .otherwise(Step::text("handled after compaction")),
        &[
            ("HIVE_CLAUDE_MAX_RETRIES", "0"),
            ("HIVE_RATE_LIMIT_SLEEP_SECS", "1"),
        ],
    );
    let id = operator_send(&b, "ruth", "a big job");
    wait_for(Duration::from_secs(90), "the retried turn", || {
        (stats(&h).len() >= 5).then_some(())
    });
    wait_drained(&b, "ruth");
    let rows = stats(&h);
    let kinds: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(
        kinds,
        ["turn", "turn", "compact", "compact", "turn"],
        "{rows:?}"
    );
    assert_eq!(rows[1].1, "prompt_too_long", "{rows:?}");
    assert_eq!(rows[2].1, "rate_limited", "{rows:?}");
    assert_eq!(
        (rows[3].1.as_str(), rows[4].1.as_str()),
        ("compacted", "ok")
    );
    let posts = api.posts();
    let compacts = posts
        .iter()
        .filter(|r| r.kind == RequestKind::Compact)
        .count();
    assert_eq!(compacts, 2, "compacted again after the pause");
    let last = posts.last().unwrap();
    assert_eq!(last.kind, RequestKind::Messages);
    assert!(
        last.mentions("a big job") && last.mentions("COMPACT-SUMMARY"),
        "the whole message, in the compacted session"
    );
    assert!(
        !operator_inbox(&b)
            .iter()
            .any(|m| m.body.contains(&format!("#{id}"))),
        "nothing was dropped, so no one is told"
    );
}

fn a_session_compaction_cannot_shrink_is_replaced_by_a_fresh_one(cli: &RealCli) {
    let (b, api, h) = ready(
        cli,
        Scenario::new()
            .then(Step::prompt_too_long())
            // Every compaction request is too long too: after trimming and
            // retrying, the CLI prints "Compaction failed · conversation could
            // not be reduced below the context limit".
            .compact_always(Step::prompt_too_long())
            .otherwise(Step::text("handled in a fresh session")),
        &[],
    );
    let id = operator_send(&b, "ruth", "a big job");
    let notice = wait_for(Duration::from_secs(90), "the parent notice", || {
        operator_inbox(&b)
            .into_iter()
            .find(|m| m.body.contains("fresh session"))
    });
    assert!(notice.body.contains(&format!("#{id}")), "{}", notice.body);
    wait_drained(&b, "ruth");
    let rows = stats(&h);
    let kinds: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(kinds, ["turn", "turn", "compact", "turn"], "{rows:?}");
    // The kind is closed; the CLI's words are kept in the note.
    assert_eq!(rows[2].1, "prompt_too_long", "{rows:?}");
    let note = first_note(&h, "compact");
    assert!(
        note.contains("could not be reduced below the context limit"),
        "{note}"
    );
    assert_eq!(rows[3].1, "ok");
    let last = api.posts().pop().unwrap();
    assert_eq!(last.kind, RequestKind::Messages);
    assert!(last.mentions("a big job"), "the whole message");
    assert!(
        !last.mentions("noted the restart"),
        "a fresh session: the old history is gone"
    );
}

fn a_429_is_requeued_and_retried_after_the_pause(cli: &RealCli) {
    let (b, api, h) = ready(
        cli,
        Scenario::new()
            .then(Step::rate_limited())
            .otherwise(Step::text("done after the limit")),
        &[
            ("HIVE_CLAUDE_MAX_RETRIES", "0"),
            ("HIVE_RATE_LIMIT_SLEEP_SECS", "1"),
        ],
    );
    operator_send(&b, "ruth", "limited job");
    wait_for(Duration::from_secs(90), "the retry", || {
        (api.posts().len() >= 3).then_some(())
    });
    wait_drained(&b, "ruth");
    let outcomes: Vec<String> = stats(&h).into_iter().map(|(_, o)| o).collect();
    assert_eq!(outcomes[1], "rate_limited", "{outcomes:?}");
    assert_eq!(outcomes.last().unwrap(), "ok");
    // The retry sent a note, not the prompt a second time.
    let last = api.posts().pop().unwrap();
    assert!(last.mentions("[system] Retry"), "the retry is a short note");
}

/// A stream that stops mid-answer: 2.1.332, whose byte watchdog works with a
/// gateway (`CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS`, at least 10 s), ends the run
/// itself with `api_error: stream_idle_timeout`, an API failure the harness
/// retries after its backoff; 2.1.197 ignores that variable for a gateway
/// and would wait 300 s, so the harness's idle watchdog stops it as hung.
/// Either way the message is kept and answered on the next try.
fn a_stalled_stream_keeps_the_message_and_the_retry_answers_it(cli: &RealCli) {
    let env: &[(&str, &str)] = if cli.at_least("2.1.332") {
        &[
            ("CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS", "10000"),
            ("CLAUDE_CODE_DISABLE_NONSTREAMING_FALLBACK", "1"),
            ("HIVE_API_BACKOFF_SECS", "1"),
        ]
    } else {
        &[("HIVE_TURN_IDLE_SECS", "3")]
    };
    let (b, api, h) = ready(
        cli,
        Scenario::new()
            .then(Step::stall("I was about to say"))
            .otherwise(Step::text("answered after the stall")),
        env,
    );
    operator_send(&b, "ruth", "a job the stream drops");
    wait_for(Duration::from_secs(90), "the retry", || {
        (api.posts().len() >= 3).then_some(())
    });
    wait_drained(&b, "ruth");
    let outcomes: Vec<String> = stats(&h).into_iter().map(|(_, o)| o).collect();
    let stalled = if cli.at_least("2.1.332") {
        "api_unavailable"
    } else {
        "hung"
    };
    assert_eq!(outcomes[1], stalled, "{outcomes:?}");
    assert_eq!(outcomes.last().unwrap(), "ok", "{outcomes:?}");
    if cli.at_least("2.1.332") {
        let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
        let note: String = db
            .query_row(
                "SELECT note FROM turns ORDER BY id LIMIT 1 OFFSET 1",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert!(note.contains("Stream idle timeout"), "{note}");
    }
}

fn the_real_cli_honours_the_harness_settings_file(cli: &RealCli) {
    use common::claude_cli::{claude_env, run_claude, Sandbox};
    // The CLI silently ignores a settings file with one badly typed value; the
    // evidence that ours is read whole is that auto-memory is off (no
    // `memory_paths` in system/init).
    let api = FakeAnthropic::start(Scenario::new().otherwise(Step::text("ok")));
    let sb = Sandbox::new("settings");
    let harness = sb.harness();
    let run = run_claude(
        cli,
        &sb.cwd,
        &claude_env(&sb.home, &api.base_url()),
        &harness.argv(),
        "hello",
        Duration::from_secs(60),
    );
    let init = run.find("system", Some("init"));
    assert_eq!(init.len(), 1, "{run:?}");
    assert!(
        init[0].get("memory_paths").is_none(),
        "settings ignored: {}",
        init[0]
    );
    assert_eq!(run.code, Some(0), "{run:?}");
}

fn a_background_bash_task_wakes_the_agent_for_a_new_turn(cli: &RealCli) {
    let (b, api, h) = ready(
        cli,
        Scenario::new()
            // The woken turn starts a slow task without waiting for it.
            .then(Step::tool_use(
                "mcp__bash__run",
                json!({"cmd": "sleep 1; echo built-ok", "wait_seconds": 0}),
            ))
            .then(Step::text("started the build"))
            .otherwise(Step::text("the build finished")),
        &[],
    );
    operator_send(&b, "ruth", "run the build");
    // The tool answered `task started`, the turn ended, and the task's
    // completion wake (from bash-task-N, transient) started another turn.
    let woken = wait_for(Duration::from_secs(60), "the completion turn", || {
        api.posts()
            .into_iter()
            .find(|r| r.mentions("bash-task-") && r.mentions("built-ok"))
    });
    let started = api
        .posts()
        .into_iter()
        .find(|r| r.body.to_string().contains("task started: id="));
    assert!(started.is_some(), "the run tool answered with the task id");
    let _ = woken;
    wait_drained(&b, "ruth");
    let out = std::fs::read_dir(h.state_dir().join("harness/bash-tasks"))
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.path().extension().is_some_and(|x| x == "out"))
        .expect("the task's output file");
    assert_eq!(std::fs::read_to_string(out.path()).unwrap(), "built-ok\n");
}

real_cli_tests!(
    a_stalled_stream_keeps_the_message_and_the_retry_answers_it,
    wake_turn_tool_call_and_continue_through_hive_serve,
    prompt_too_long_is_compacted_by_the_harness_and_retried,
    a_rate_limited_compaction_keeps_the_message_then_compacts_again_and_retries,
    a_session_compaction_cannot_shrink_is_replaced_by_a_fresh_one,
    a_429_is_requeued_and_retried_after_the_pause,
    a_background_bash_task_wakes_the_agent_for_a_new_turn,
    the_real_cli_honours_the_harness_settings_file,
);
