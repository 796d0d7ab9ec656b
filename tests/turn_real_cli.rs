//! What the turn loop relies on the real Claude Code CLI 2.1.197 to print when
//! hive's MCP servers do not start, checked against the CLI itself: with
//! `"alwaysLoad": true`, a server that exits is `failed` and one that does not
//! answer within the connect timeout is `pending` in the `system/init` line, the
//! turn goes on without their tools, and the classifier turns that line into
//! the signal that makes the harness stop the turn. Skips loudly without the
//! CLI; fails under `HIVE_REQUIRE_REAL_CLAUDE=1`.

mod common;

use common::claude_cli::{claude_env, require_real_claude, run_claude, Sandbox};
use common::fake_anthropic::{FakeAnthropic, Scenario, Step};
use hyperhive::harness::classify::{Signal, TurnObserver};
use std::time::Duration;

#[test]
fn the_init_line_names_hives_servers_that_failed_or_are_pending() {
    let Some(cli) = require_real_claude() else {
        return;
    };
    let api = FakeAnthropic::start(Scenario::new().otherwise(Step::text("went on without tools")));
    let sb = Sandbox::new("mcp-start");
    let settings = hyperhive::harness::invocation::settings_json().to_string();
    let settings = sb.write("settings.json", &settings);
    // hyperhive exits at once; bash never answers `initialize`.
    let mcp = sb.write(
        "mcp.json",
        r#"{"mcpServers":{
            "hyperhive":{"command":"/bin/false","args":[],"alwaysLoad":true},
            "bash":{"command":"/bin/sleep","args":["60"],"alwaysLoad":true}}}"#,
    );
    let run = run_claude(
        &cli,
        &sb.cwd,
        &claude_env(&sb.home, &api.base_url()),
        &[
            "--print",
            "--verbose",
            "--output-format",
            "stream-json",
            "--model",
            "claude-sonnet-4-5",
            "--settings",
            settings.to_str().unwrap(),
            "--mcp-config",
            mcp.to_str().unwrap(),
            "--strict-mcp-config",
            "--tools",
            "Read",
        ],
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
    assert_eq!(status("bash"), Some("pending".into()), "{servers}");
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
            ("bash".to_string(), "pending".to_string())
        ]],
        "{run}"
    );
}
