//! Integration tests of `hive serve`: a real broker, a real harness process and a
//! scripted fake claude (`tests/fake-claude/`) that prints what the real CLI
//! prints. Each test asserts what the broker, the state dir and the fake's
//! recorded argv and stdin show afterwards. The harness's boot kick is always
//! invocation 1.

mod common;

use common::hive::*;
use hyperhive::wire::Request;
use std::time::Duration;

fn start(agent: &str, env: &[(&str, &str)]) -> (Broker, Harness) {
    let b = Broker::start(&[agent]);
    let h = Harness::start(&b, agent, env);
    (b, h)
}

/// Starts a harness and waits until its boot kick turn is acked.
fn started(agent: &str, env: &[(&str, &str)]) -> (Broker, Harness) {
    let (b, h) = start(agent, env);
    h.fake.wait_count(1);
    wait_drained(&b, agent);
    (b, h)
}

fn stats_rows(h: &Harness) -> Vec<(String, String, String)> {
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let mut st = db
        .prepare("SELECT kind, outcome, sender FROM turns ORDER BY id")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn boot_kick_then_a_turn_with_the_exact_invocation() {
    let (b, h) = start("ana", &[]);
    h.fake.wait_count(1);
    assert!(
        h.fake.stdin(1).contains("you were just (re)started")
            || h.fake.stdin(1).contains("You were just (re)started")
    );
    wait_drained(&b, "ana");
    h.fake.step(
        2,
        r#"init; tool_use mcp__hyperhive__send '{"to":"operator","body":"hi"}'; say "all done"; result_ok "all done"; exit 0"#,
    );
    operator_send(&b, "ana", "please say hi");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    let argv = h.fake.argv(2);
    let run = h.run_dir().display().to_string();
    let want: Vec<String> = [
        "--print",
        "--verbose",
        "--output-format",
        "stream-json",
        "--model",
        "haiku",
        "--continue",
        "--settings",
        &format!("{run}/claude-settings.json"),
        "--system-prompt-file",
        &format!("{run}/claude-system-prompt.md"),
        "--mcp-config",
        &format!("{run}/claude-mcp-config.json"),
        "--strict-mcp-config",
        "--tools",
        "Edit,Glob,Grep,Read,Write",
        "--allowedTools",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(argv[..want.len()], want[..], "{argv:?}");
    let allowed = &argv[want.len()];
    for t in [
        "Edit",
        "mcp__hyperhive__send",
        "mcp__hyperhive__recv",
        "mcp__bash__run",
        "mcp__bash__status",
    ] {
        assert!(
            allowed.split(',').any(|a| a == t),
            "{t} missing from {allowed}"
        );
    }
    assert!(!allowed.contains("Bash,") && !allowed.contains("TodoWrite"));
    let stdin = h.fake.stdin(2);
    assert!(
        stdin.contains("operator") && stdin.contains("please say hi"),
        "{stdin}"
    );
    let rows = stats_rows(&h);
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1], ("turn".into(), "ok".into(), "operator".into()));
    // The boot files exist and the settings are the validated blob.
    let settings = std::fs::read_to_string(h.run_dir().join("claude-settings.json")).unwrap();
    assert!(settings.contains("\"autoCompactEnabled\": false"));
    let mcp = std::fs::read_to_string(h.run_dir().join("claude-mcp-config.json")).unwrap();
    assert!(
        mcp.contains("\"bash-mcp\"") && mcp.contains("\"mcp\""),
        "{mcp}"
    );
    let prompt = std::fs::read_to_string(h.run_dir().join("claude-system-prompt.md")).unwrap();
    assert!(prompt.contains("ana"));
    let row = agent_row(&b, "ana");
    assert_eq!((row.turns, row.turns_ok), (2, 2));
}

#[test]
fn unread_hint_in_the_wake_prompt() {
    let (b, h) = started("ana", &[]);
    h.fake.step(2, "sleep 0.5; ok_turn first");
    operator_send(&b, "ana", "one");
    h.fake.wait_count(2);
    operator_send(&b, "ana", "two");
    operator_send(&b, "ana", "three");
    h.fake.wait_count(3);
    let s = h.fake.stdin(3);
    assert!(s.contains("two") && s.contains("1 more pending"), "{s}");
    wait_drained(&b, "ana");
}
