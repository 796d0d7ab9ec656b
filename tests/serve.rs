//! Integration tests of `hive serve`: a real broker, a real harness process and a
//! scripted fake claude (`tests/fake-claude/`) that prints what the real CLI
//! prints. Each test asserts what the broker, the state dir and the fake's
//! recorded argv and stdin show afterwards. The harness's boot kick is always
//! invocation 1.

mod common;

use common::hive::*;
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

/// Waits for an operator-inbox message matching `pred` (the parent notice is sent
/// after the ack, so a drained inbox does not mean it is there yet).
fn wait_notice(b: &Broker, what: &str, pred: impl Fn(&str) -> bool) -> hyperhive::proto::Message {
    wait_for(Duration::from_secs(20), what, || {
        operator_inbox(b).into_iter().find(|m| pred(&m.body))
    })
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
    assert_eq!(
        rows[1],
        ("turn".into(), "ok".into(), "operator".into()),
        "{}",
        h.log()
    );
    // The boot files exist and the settings are the validated blob.
    let settings = std::fs::read_to_string(h.run_dir().join("claude-settings.json")).unwrap();
    assert!(settings.contains("\"autoCompactEnabled\": false"));
    let mcp = std::fs::read_to_string(h.run_dir().join("claude-mcp-config.json")).unwrap();
    assert!(
        mcp.contains("\"bash-mcp\"") && mcp.contains("\"mcp\""),
        "{mcp}"
    );
    let cfg: serde_json::Value = serde_json::from_str(&mcp).unwrap();
    for server in ["hyperhive", "bash"] {
        assert_eq!(
            cfg["mcpServers"][server]["alwaysLoad"], true,
            "the CLI waits for {server}: {mcp}"
        );
    }
    let prompt = std::fs::read_to_string(h.run_dir().join("claude-system-prompt.md")).unwrap();
    assert!(prompt.contains("ana"));
    let row = agent_row(&b, "ana");
    assert_eq!((row.turns, row.turns_ok), (2, 2));
}

/// A model file in the state dir (where the agent can write) is no override
/// (issue 39): written between turns it changes nothing; found at a start,
/// it is removed, not taken over, and the page says to choose the model
/// again. The page's choice lives in the broker.
#[test]
fn a_model_file_in_the_state_dir_is_no_override() {
    let (b, mut h) = started("ana", &[]);
    operator_send(&b, "ana", "one");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    let model = |h: &Harness, n: usize| {
        let argv = h.fake.argv(n);
        let i = argv.iter().position(|a| a == "--model").unwrap();
        argv[i + 1].clone()
    };
    assert_eq!(model(&h, 2), "haiku");
    let file = h.state_dir().join("hyperhive-model");
    std::fs::write(&file, "sonnet\n").unwrap();
    operator_send(&b, "ana", "two");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    assert_eq!(
        model(&h, 3),
        "haiku",
        "a file the agent can write is not read"
    );
    h.terminate();
    h.spawn();
    wait_for(Duration::from_secs(30), "the file to be taken away", || {
        (!file.exists()).then_some(())
    });
    assert!(
        h.log().contains("choose it again with /model sonnet"),
        "{}",
        h.log()
    );
    operator_send(&b, "ana", "three");
    let n = h.fake.count() + 1;
    h.fake.wait_count(n);
    wait_drained(&b, "ana");
    assert_eq!(model(&h, n), "haiku");
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

#[test]
fn stderr_429_markers_rate_limit_then_retry() {
    let (b, h) = started("ana", &[("HIVE_RATE_LIMIT_SLEEP_SECS", "1")]);
    h.fake.step(
        2,
        "init; echo 'Error: 429 rate_limit_error: slow down' >&2; exit 1",
    );
    let id = operator_send(&b, "ana", "work");
    h.fake.wait_count(2);
    // Parked as rate limited with the message requeued.
    wait_for(Duration::from_secs(10), "requeue", || {
        let r = agent_row(&b, "ana");
        (r.unread == 1 && r.inflight.is_none()).then_some(())
    });
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    assert!(h.fake.stdin(3).contains("work") || h.fake.stdin(3).contains("Retry"));
    let rows = stats_rows(&h);
    assert_eq!(rows[1].1, "rate_limited", "{rows:?}");
    let _ = id;
}

#[test]
fn real_cli_429_uses_resets_at_and_a_retry_note() {
    let (b, h) = started("ana", &[("HIVE_RATE_LIMIT_SLEEP_SECS", "300")]);
    // The CLI said when the limit lifts: one second from now.
    h.fake.step(
        2,
        r#"rate_limit_event $(( $(date +%s) + 1 )); api_error 429 rate_limit "You've hit your session limit · resets 5:03am (UTC)""#,
    );
    let id = operator_send(&b, "ana", "report please");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    // The failed turn left its prompt in the session it resumes: the retry is
    // a short note naming the message and its sender.
    let retry = h.fake.stdin(3);
    assert!(
        retry.contains("[system] Retry") && !retry.contains("report please"),
        "{retry}"
    );
    assert!(
        retry.contains(&format!("message #{id} from operator")),
        "{retry}"
    );
    assert!(h.fake.argv(3).contains(&"--continue".to_string()));
}

#[test]
fn a_conversation_about_rate_limits_is_not_a_rate_limit() {
    let (b, h) = started("ana", &[("HIVE_RATE_LIMIT_SLEEP_SECS", "300")]);
    h.fake.step(
        2,
        r#"init; say "the API returned rate_limit_error 429 and 401 yesterday; Prompt is too long too"; result_ok fine; exit 0"#,
    );
    operator_send(&b, "ana", "explain the outage");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    assert_eq!(stats_rows(&h)[1].1, "ok");
}

#[test]
fn auth_failure_once_retries_at_once() {
    let (b, h) = started("ana", &[]);
    h.fake.step(
        2,
        r#"api_error 401 authentication_failed "Invalid API key · Fix external API key""#,
    );
    operator_send(&b, "ana", "task");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    assert!(!h.state_dir().join("hyperhive-needs-login").exists());
    assert_eq!(stats_rows(&h)[2].1, "ok");
}

#[test]
fn auth_failure_twice_parks_until_the_config_dir_changes() {
    let (b, h) = started("ana", &[]);
    let fail = r#"api_error 401 authentication_failed "Invalid API key · Fix external API key""#;
    h.fake.step(2, fail);
    h.fake.step(3, fail);
    operator_send(&b, "ana", "task");
    h.fake.wait_count(3);
    let sentinel = h.state_dir().join("hyperhive-needs-login");
    wait_for(Duration::from_secs(10), "the needs-login sentinel", || {
        sentinel.exists().then_some(())
    });
    wait_for(Duration::from_secs(10), "requeue", || {
        let r = agent_row(&b, "ana");
        (r.unread == 1 && r.inflight.is_none()).then_some(())
    });
    // Stale credentials do not resume: nothing runs while the dir is unchanged.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(h.fake.count(), 3);
    // The operator logs in: the claude config dir changes.
    std::fs::write(h.dir.path().join("home/.claude/.credentials.json"), "{}").unwrap();
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    assert!(!sentinel.exists());
}

#[test]
fn api_retry_401_kills_the_child_early() {
    let (b, h) = started("ana", &[]);
    // A CLI that would retry a dead key for minutes: the harness stops it.
    h.fake.step(
        2,
        "init; api_retry 401 authentication_failed; sleep 60; ok_turn late",
    );
    operator_send(&b, "ana", "task");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
}

#[test]
fn prompt_too_long_compacts_and_retries_once() {
    let (b, h) = started("ana", &[]);
    h.fake.step(
        2,
        r#"api_error 400 invalid_request "Prompt is too long" prompt_too_long"#,
    );
    h.fake.step(3, "compact_ok 191057 183");
    operator_send(&b, "ana", "big job");
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    assert_eq!(h.fake.stdin(3).trim(), "/compact");
    assert!(h.fake.argv(3).contains(&"--continue".to_string()));
    assert!(h.fake.stdin(4).contains("big job"));
    let kinds: Vec<String> = stats_rows(&h).into_iter().map(|r| r.0).collect();
    assert_eq!(kinds, ["turn", "turn", "compact", "turn"]);
}

#[test]
fn a_session_compaction_cannot_shrink_is_dropped_and_the_message_runs_fresh() {
    // Issue 14 changed this on purpose: the message used to be acked as failed
    // (and every later one after it); now the session is dropped instead.
    let (b, h) = started("ana", &[]);
    h.fake.step(
        2,
        r#"api_error null invalid_request "Prompt is too long" blocking_limit"#,
    );
    h.fake.step(3, r#"compact_failed "Compaction failed · conversation could not be reduced below the context limit""#);
    let id = operator_send(&b, "ana", "huge job");
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    let notice = wait_notice(&b, "the parent notice", |t| t.contains("fresh session"));
    assert!(notice.body.contains(&format!("#{id}")), "{}", notice.body);
    assert!(
        notice.body.contains("could not be compacted"),
        "{}",
        notice.body
    );
    assert!(h.fake.stdin(4).contains("huge job"), "the whole message");
    assert!(
        !h.fake.argv(4).contains(&"--continue".to_string()),
        "a fresh session: {:?}",
        h.fake.argv(4)
    );
    assert_eq!(h.fake.count(), 4);
    let row = agent_row(&b, "ana");
    assert_eq!((row.turns_ok, row.turns_failed), (2, 1), "{row:?}");
}

#[test]
fn proactive_compaction_after_a_turn_past_the_watermark() {
    let (b, h) = started("ana", &[]);
    h.fake.step(2, "ok_turn big 160000");
    h.fake.step(4, "compact_ok 160000 2000");
    operator_send(&b, "ana", "grow");
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    assert!(
        h.fake.stdin(3).contains("Checkpoint"),
        "{}",
        h.fake.stdin(3)
    );
    assert_eq!(h.fake.stdin(4).trim(), "/compact");
    // Disabled by HIVE_COMPACT_WATERMARK_TOKENS=0 (checked in another harness).
    let (b2, h2) = started("bob", &[("HIVE_COMPACT_WATERMARK_TOKENS", "0")]);
    h2.fake.step(2, "ok_turn big 190000");
    operator_send(&b2, "bob", "grow");
    h2.fake.wait_count(2);
    wait_drained(&b2, "bob");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h2.fake.count(), 2);
}

#[test]
fn auto_reset_after_idle_drops_continue_for_the_real_turn() {
    let (b, h) = started("ana", &[("HIVE_CACHE_TTL_SECS", "1")]);
    h.fake.step(2, "ok_turn warm 120000");
    operator_send(&b, "ana", "first");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    std::thread::sleep(Duration::from_millis(2100));
    operator_send(&b, "ana", "second");
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    assert!(
        h.fake.stdin(3).contains("cache is cold"),
        "{}",
        h.fake.stdin(3)
    );
    assert!(h.fake.argv(3).contains(&"--continue".to_string()));
    assert!(h.fake.stdin(4).contains("second"));
    assert!(
        !h.fake.argv(4).contains(&"--continue".to_string()),
        "fresh session"
    );
}

#[test]
fn a_hung_claude_is_stopped_by_the_turn_timeout_and_retried() {
    // Issue 14 changed this on purpose: a timed-out turn used to be acked as
    // failed; now it counts toward the attempt limit and is retried.
    let (b, h) = started("ana", &[("HIVE_TURN_TIMEOUT_SECS", "1")]);
    h.fake.step(2, "init; sleep 60; ok_turn never");
    operator_send(&b, "ana", "hang");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    // It never printed an assistant line: the retry carries the whole body.
    assert!(h.fake.stdin(3).contains("hang"), "{}", h.fake.stdin(3));
    let rows = stats_rows(&h);
    assert_eq!(rows[1].1, "timed_out", "{rows:?}");
    assert_eq!(rows[2].1, "ok", "{rows:?}");
}

#[test]
fn api_unavailable_requeues_with_backoff_then_succeeds() {
    let (b, h) = started(
        "ana",
        &[
            ("HIVE_API_BACKOFF_SECS", "1"),
            ("HIVE_API_FAILURES_BEFORE_NOTICE", "2"),
        ],
    );
    h.fake.step(
        2,
        r#"api_error 529 server_error "API Error: 529 Overloaded. This is a server-side issue""#,
    );
    h.fake.step(
        3,
        r#"api_error 500 server_error "API Error: 500 Internal server error""#,
    );
    operator_send(&b, "ana", "keep me");
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    let inbox = operator_inbox(&b);
    assert!(
        inbox
            .iter()
            .any(|m| m.body.contains("unavailable for 2 turns")),
        "{inbox:?}"
    );
    assert!(h.fake.stdin(4).contains("Retry") || h.fake.stdin(4).contains("keep me"));
}

#[test]
fn a_crashing_claude_is_retried_then_dead_lettered_with_one_notice() {
    // Issue 14 changed this on purpose: a crash used to ack the message after
    // one try; now it is retried up to HIVE_TURN_MAX_ATTEMPTS and then
    // dead-lettered (stage 1: acked with a notice naming it dead-lettered).
    let (b, h) = started("ana", &[("HIVE_TURN_MAX_ATTEMPTS", "2")]);
    h.fake.step(2, "echo 'panic: something broke' >&2; exit 3");
    h.fake.step(3, "echo 'panic: something broke' >&2; exit 3");
    let id = operator_send(&b, "ana", "crash me");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    let m = wait_notice(&b, "the dead-letter notice", |t| {
        t.contains(&format!("#{id}"))
    });
    for what in [
        "dead-lettered",
        "from operator",
        "2 failed attempts",
        "code 3",
        "something broke",
    ] {
        assert!(m.body.contains(what), "{what}: {}", m.body);
    }
    assert!(h.fake.stdin(3).contains("crash me"), "{}", h.fake.stdin(3));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 3, "a dead-lettered message is not looped");
    assert!(operator_inbox(&b).is_empty(), "one notice");
}

#[test]
fn a_grandchild_holding_the_pipes_does_not_hold_the_turn() {
    let (b, h) = started("ana", &[]);
    h.fake.step(
        2,
        "init; (sleep 60; echo late) & say done; result_ok done; exit 0",
    );
    operator_send(&b, "ana", "spawn");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    assert_eq!(stats_rows(&h)[1].1, "ok");
}

#[test]
fn sigterm_during_a_long_poll_exits_promptly() {
    let (_b, mut h) = started("ana", &[("HIVE_POLL_WAIT_SECS", "120")]);
    std::thread::sleep(Duration::from_millis(200));
    let st = h.terminate();
    assert!(st.success(), "{st}: {}", h.log());
}

#[test]
fn sigterm_during_a_turn_requeues_the_message() {
    let (b, mut h) = started("ana", &[]);
    h.fake.step(2, "init; sleep 60; ok_turn never");
    operator_send(&b, "ana", "long job");
    h.fake.wait_count(2);
    std::thread::sleep(Duration::from_millis(200));
    let st = h.terminate();
    assert!(st.success(), "{st}: {}", h.log());
    let r = agent_row(&b, "ana");
    assert_eq!((r.unread, r.inflight), (1, None));
}

#[test]
fn boot_without_credentials_parks_and_with_an_api_key_does_not() {
    let (b, h) = start("ana", &[("ANTHROPIC_API_KEY", "")]);
    let sentinel = h.state_dir().join("hyperhive-needs-login");
    wait_for(Duration::from_secs(10), "the login park", || {
        sentinel.exists().then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 0, "no claude while parked");
    assert_eq!(agent_row(&b, "ana").unread, 1, "the kick waits");
    std::fs::write(h.dir.path().join("home/.claude/.credentials.json"), "{}").unwrap();
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    assert!(!sentinel.exists());
}

#[test]
fn request_next_turn_continues_in_process_when_the_inbox_is_empty() {
    let (b, h) = started("ana", &[]);
    let state = h.state_dir();
    h.fake.step(
        2,
        &format!(
            "touch {}/hyperhive-continue; ok_turn again",
            state.display()
        ),
    );
    operator_send(&b, "ana", "start a loop");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    let s = h.fake.stdin(3);
    assert!(s.contains("self") && s.contains("continue"), "{s}");
    assert!(!state.join("hyperhive-continue").exists());
    let rows = wait_for(
        Duration::from_secs(10),
        "the continue turn's stats row",
        || {
            let rows = stats_rows(&h);
            (rows.len() >= 3).then_some(rows)
        },
    );
    assert_eq!(rows[2].2, "self");
}

#[test]
fn an_aborted_turn_nobody_interrupted_is_retried() {
    // Issue 14 changed this on purpose: only an operator interrupt acks an
    // aborted turn; a CLI that aborts on its own fails the attempt, which is
    // retried like a crash.
    let (b, h) = started("ana", &[]);
    h.fake.step(2, "init; aborted");
    let id = operator_send(&b, "ana", "slow tool");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    // The aborted turn's result line shows its prompt is in the session the
    // retry resumes: a note, not the body again.
    let retry = h.fake.stdin(3);
    assert!(
        retry.contains(&format!("message #{id} from operator")) && !retry.contains("slow tool"),
        "{retry}"
    );
    let rows = stats_rows(&h);
    assert!(rows[1].1.starts_with("interrupted"), "{rows:?}");
    assert_eq!(rows[2].1, "ok", "{rows:?}");
}

#[test]
fn a_missing_claude_binary_keeps_the_message_and_says_what_to_fix() {
    // A claude that cannot be started is the harness's fault, not the
    // message's: the message stays queued (issue 12 changed this from "failed
    // and will not be retried").
    let (b, h) = start("ana", &[("HIVE_CLAUDE_BIN", "/nonexistent/claude")]);
    let notice = wait_for(Duration::from_secs(20), "the parent notice", || {
        operator_inbox(&b)
            .into_iter()
            .find(|m| m.body.contains("cannot start claude (/nonexistent/claude)"))
    });
    for what in [
        "could not be started",
        "HIVE_CLAUDE_BIN",
        "is kept and retried",
    ] {
        assert!(notice.body.contains(what), "{what}: {}", notice.body);
    }
    wait_for(Duration::from_secs(20), "a few more attempts", || {
        h.log().contains("(2 in a row)").then_some(())
    });
    let row = agent_row(&b, "ana");
    assert_eq!(row.unread + row.inflight.map_or(0, |_| 1), 1, "{row:?}");
    assert_eq!((row.turns, row.turns_failed), (0, 0), "{row:?}");
}

#[test]
fn sigterm_kills_running_bash_tasks_and_marks_them_interrupted() {
    use hyperhive::bash::client::call;
    use hyperhive::bash::proto::{Request as BashRequest, TaskReply};
    let (b, mut h) = started("ana", &[]);
    let sock = h.dir.path().join("bash.sock");
    let r: TaskReply = call(
        &sock,
        &BashRequest::Run {
            cmd: "sleep 300".into(),
            timeout_secs: None,
            wait_seconds: Some(0),
        },
        &crossbeam_channel::never(),
    )
    .unwrap();
    assert!(!r.inline);
    let id = r.task.id.clone();
    let st = h.terminate();
    assert!(st.success(), "{st}: {}", h.log());
    // The task's record says interrupted, and its best-effort wake went out.
    let rec = std::fs::read_dir(h.state_dir().join("harness/bash-tasks"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .find(|t| t.contains("sleep 300") && t.contains(&format!("\"{id}\"")))
        .expect("the task record");
    assert!(rec.contains("interrupted"), "{rec}");
    let pending = agent_row(&b, "ana").unread;
    assert_eq!(pending, 1, "the interrupted task's wake is in the inbox");
}

#[test]
fn plugin_install_failures_reach_the_parent_and_do_not_stop_the_boot() {
    let (b, h) = start(
        "ana",
        &[
            ("HIVE_CLAUDE_MARKETPLACES", "acme/market"),
            ("HIVE_CLAUDE_PLUGINS", "fmt@acme,lint@acme"),
            ("FAKE_PLUGIN_EXIT", "1"),
        ],
    );
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let log = std::fs::read_to_string(h.fake.dir.join("plugins.log")).unwrap();
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        [
            "plugin marketplace add acme/market",
            "plugin install fmt@acme",
            "plugin install lint@acme"
        ]
    );
    let inbox = operator_inbox(&b);
    let notices: Vec<_> = inbox
        .iter()
        .filter(|m| m.body.contains("plugin install"))
        .collect();
    assert_eq!(notices.len(), 3, "{inbox:?}");
    assert!(
        notices[1]
            .body
            .contains("claude plugin install fmt@acme failed"),
        "{}",
        notices[1].body
    );
}

#[test]
fn running_bash_tasks_are_loose_ends_in_hive_mcp() {
    use common::mcp::McpProc;
    use hyperhive::bash::client::call;
    use hyperhive::bash::proto::{Request as BashRequest, TaskReply};
    let (b, h) = started("ana", &[]);
    let bash = h.dir.path().join("bash.sock");
    let r: TaskReply = call(
        &bash,
        &BashRequest::Run {
            cmd: "sleep 30".into(),
            timeout_secs: Some(20),
            wait_seconds: Some(0),
        },
        &crossbeam_channel::never(),
    )
    .unwrap();
    let sock = b.agent_socket("ana");
    let mut mcp = McpProc::start(
        &[
            ("HIVE_SOCKET", sock.to_str().unwrap()),
            ("HIVE_BASH_SOCKET", bash.to_str().unwrap()),
        ],
        &h.dir.path().join("mcp.log"),
    );
    mcp.initialize();
    // The daemon reports its running tasks to the broker as they start: ask
    // until the report is in.
    let mut id = 1;
    let want = format!("bash_task {} running", r.task.id);
    let text = wait_for(
        Duration::from_secs(10),
        "the task among the loose ends",
        || {
            id += 1;
            let text = mcp.ok(id, "get_loose_ends", serde_json::json!({}));
            text.contains(&want).then_some(text)
        },
    );
    assert!(text.contains("sleep 30"), "{text}");
}

#[test]
fn sigterm_while_the_broker_is_down_still_exits_and_loses_nothing() {
    let (mut b, mut h) = started("ana", &[]);
    h.fake
        .step(2, "init; say slow; sleep 1; result_ok done; exit 0");
    operator_send(&b, "ana", "ack me later");
    h.fake.wait_count(2);
    // The broker dies mid-turn: the harness cannot ack and keeps reconnecting.
    b.kill9();
    std::thread::sleep(Duration::from_millis(1500));
    let st = h.terminate();
    assert!(st.success(), "{st}: {}", h.log());
    // The message was never acked: after a broker restart it is back in the inbox.
    b.restart();
    let r = agent_row(&b, "ana");
    assert_eq!((r.unread, r.inflight), (1, None));
}
