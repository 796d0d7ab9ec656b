//! What the turn loop relies on the real Claude Code CLI to print when
//! hive's MCP servers do not start, checked against the CLI itself: with
//! `"alwaysLoad": true`, a server that exits is `failed` and one that does not
//! answer within the connect timeout is `pending` (2.1.197) or `failed`
//! (2.1.332) in the `system/init` line, the
//! turn goes on without their tools, and the classifier turns that line into
//! the signal that makes the harness stop the turn. Skips loudly without the
//! CLI; fails under `HIVE_REQUIRE_REAL_CLAUDE=1`.

mod common;

use common::claude_cli::{claude_env, real_cli_tests, run_claude, RealCli, Sandbox};
use common::fake_anthropic::{FakeAnthropic, Scenario, Step};
use hyperhive::harness::classify::{Signal, TurnObserver};
use std::time::Duration;

fn the_init_line_names_hives_servers_that_failed_or_are_pending(cli: &RealCli) {
    let api = FakeAnthropic::start(Scenario::new().otherwise(Step::text("went on without tools")));
    let sb = Sandbox::new("mcp-start");
    // The harness's own invocation, its MCP config then replaced: hyperhive
    // exits at once; bash never answers `initialize`.
    let harness = sb.harness();
    std::fs::write(
        harness.settings.mcp_config_path(),
        r#"{"mcpServers":{
            "hyperhive":{"command":"/bin/false","args":[],"alwaysLoad":true},
            "bash":{"command":"/bin/sleep","args":["60"],"alwaysLoad":true}}}"#,
    )
    .unwrap();
    let run = run_claude(
        cli,
        &sb.cwd,
        &claude_env(&sb.home, &api.base_url()),
        &harness.argv(),
        "hello",
        Duration::from_secs(90),
    );
    let init = run.find("system", Some("init"));
    assert_eq!(init.len(), 1, "{run}");
    let servers = &init[0]["mcp_servers"];
    let status = |name: &str| {
        servers
            .as_array()
            .and_then(|a| a.iter().find(|s| s["name"] == name))
            .map(|s| s["status"].clone())
    };
    assert_eq!(status("hyperhive"), Some("failed".into()), "{servers}");
    // 2.1.197 gives up on a silent server after MCP_CONNECT_TIMEOUT_MS (5 s)
    // and calls it pending; 2.1.332 waits for MCP_TIMEOUT (30 s) and calls
    // it failed.
    let silent = if cli.at_least("2.1.332") {
        "failed"
    } else {
        "pending"
    };
    assert_eq!(status("bash"), Some(silent.into()), "{servers}");
    // Without the harness the CLI carries on blind and reports success.
    assert_eq!(run.result()["is_error"], false, "{run}");

    let mut o = TurnObserver::new();
    let mut signals = Vec::new();
    for line in run.stdout.lines() {
        signals.extend(o.on_stdout_line(line));
    }
    let missing: Vec<_> = signals
        .into_iter()
        .filter_map(|s| match s {
            Signal::McpNotConnected(v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(
        missing,
        [vec![
            ("hyperhive".to_string(), "failed".to_string()),
            ("bash".to_string(), silent.to_string())
        ]],
        "{run}"
    );
}

real_cli_tests!(the_init_line_names_hives_servers_that_failed_or_are_pending,);
