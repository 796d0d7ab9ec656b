//! A turn that finished is never run again (issue 37), with the real Claude
//! Code CLI (each end of the supported window) under `hive broker` and `hive
//! serve`, against the fake Anthropic API on 127.0.0.1: a stop of the harness
//! in the middle of a tool call keeps the message, uncounted, whatever the
//! CLI prints in answer to the signal (an aborted `result`, or the `success`
//! it can still print then: `shared/reference/claude-cli-mcp-client.md` row
//! 6a), and a turn the CLI reported `success` for, whose process then hangs
//! until the turn timeout, is acked and not run again. Skips loudly without
//! the CLI; fails under `HIVE_REQUIRE_REAL_CLAUDE=1`.

mod common;

use common::claude_cli::{real_cli_tests, RealCli, Sandbox};
use common::fake_anthropic::{FakeAnthropic, Scenario, Step};
use common::hive::*;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// A broker, the fake API answering `scenario` after the boot kick turn, and
/// a harness running `bin` (the real CLI, or a wrapper around it) against
/// it, with the kick turn done.
fn ready(
    bin: &str,
    scenario: Scenario,
    extra_env: &[(&str, &str)],
) -> (Broker, FakeAnthropic, Harness) {
    let b = Broker::start(&["ruth"]);
    let api = FakeAnthropic::start(scenario.first(Step::text("noted the restart")));
    let base = api.base_url();
    let mut env = vec![
        ("HIVE_CLAUDE_BIN", bin),
        ("ANTHROPIC_BASE_URL", base.as_str()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_TELEMETRY", "1"),
    ];
    env.extend_from_slice(extra_env);
    let h = Harness::start(&b, "ruth", &env);
    wait_for(T, "the kick turn", || {
        (!api.posts().is_empty() && agent_row(&b, "ruth").inflight.is_none()).then_some(())
    });
    wait_drained(&b, "ruth");
    (b, api, h)
}

/// The harness's runs of message `id`, as (outcome, note), in order.
fn runs_of(h: &Harness, id: i64) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let rows: Vec<(String, String)> = db
        .prepare("SELECT outcome, note FROM turns WHERE message_id = ?1 ORDER BY id")
        .unwrap()
        .query_map([id], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

/// The API requests whose conversation holds `body`.
fn asked_with(api: &FakeAnthropic, body: &str) -> usize {
    api.posts().iter().filter(|r| r.mentions(body)).count()
}

fn a_stop_of_the_harness_mid_tool_call_keeps_the_message_uncounted(cli: &RealCli) {
    // With a limit of one attempt, a counted stop would dead-letter the
    // message at its next hand-out instead of running it.
    let bin = cli.display().to_string();
    let (b, api, mut h) = ready(
        &bin,
        Scenario::new()
            .then(Step::tool_use(
                "mcp__bash__run",
                json!({"cmd": "sleep 30; echo built", "wait_seconds": 30}),
            ))
            .otherwise(Step::text("built it")),
        &[("HIVE_TURN_MAX_ATTEMPTS", "1")],
    );
    let id = operator_send(&b, "ruth", "build the release once");
    // The tool call is open once its task runs.
    let tasks = h.state_dir().join("harness/bash-tasks");
    wait_for(T, "the build task", || {
        std::fs::read_dir(&tasks)
            .ok()?
            .filter_map(Result::ok)
            .any(|e| e.path().extension().is_some_and(|x| x == "out"))
            .then_some(())
    });
    let st = h.terminate();
    assert!(st.success(), "{st}: {}", h.log());
    let r = agent_row(&b, "ruth");
    assert_eq!((r.unread, r.inflight), (1, None), "kept");
    let runs = runs_of(&h, id);
    assert_eq!(runs.len(), 1, "{runs:?}");
    assert_eq!(runs[0].0, "stopped", "{runs:?}");

    let before = asked_with(&api, "build the release once");
    h.spawn();
    wait_for(T, "the message's second run", || {
        (runs_of(&h, id).len() == 2).then_some(())
    });
    wait_drained(&b, "ruth");
    let runs = runs_of(&h, id);
    assert_eq!(runs[1].0, "ok", "{runs:?}");
    assert!(asked_with(&api, "build the release once") > before);
    assert_eq!(agent_row(&b, "ruth").failed, 0, "not dead-lettered");
}

fn a_success_then_a_hang_until_the_timeout_is_acked_and_not_run_again(cli: &RealCli) {
    // claude as the harness sees it: the real CLI, and then, once the test
    // says so, a process that does not end after the CLI's `result`.
    let sandbox = Sandbox::new("finished");
    let hang = sandbox.write_dir("flags").join("hang");
    let wrapper = sandbox.write(
        "claude",
        "#!/bin/sh\n\"$REAL_CLAUDE\" \"$@\"\nrc=$?\n[ -e \"$HANG_AFTER\" ] && sleep 60\nexit $rc\n",
    );
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let real = cli.display().to_string();
    let hang_after = hang.display().to_string();
    let (b, api, h) = ready(
        &wrapper.display().to_string(),
        Scenario::new()
            .then(Step::text("replied to the customer"))
            .otherwise(Step::text("done")),
        &[
            ("REAL_CLAUDE", real.as_str()),
            ("HANG_AFTER", hang_after.as_str()),
            ("HIVE_TURN_TIMEOUT_SECS", "25"),
        ],
    );
    std::fs::write(&hang, "").unwrap();
    let id = operator_send(&b, "ruth", "reply to the customer once");
    let runs = wait_for(T, "the message's run", || {
        Some(runs_of(&h, id)).filter(|r| !r.is_empty())
    });
    wait_drained(&b, "ruth");
    assert_eq!(runs.len(), 1, "{runs:?}");
    let (outcome, note) = &runs[0];
    assert_eq!(outcome, "ok", "{runs:?}");
    assert!(
        note.starts_with("success was reported before the turn timeout"),
        "{runs:?}"
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(runs_of(&h, id).len(), 1, "run once");
    assert!(asked_with(&api, "reply to the customer once") > 0);
}

real_cli_tests!(
    a_stop_of_the_harness_mid_tool_call_keeps_the_message_uncounted,
    a_success_then_a_hang_until_the_timeout_is_acked_and_not_run_again,
);
