//! MCP servers that do not start (issue 14). The real CLI 2.1.197, with
//! `"alwaysLoad": true`, waits for hive's servers and then lists each in its
//! `system/init` line as `connected`, `failed` (the server exited) or `pending`
//! (it did not answer within the connect timeout) and goes on without their
//! tools. The harness stops such a turn at once, keeps the message (the retry
//! carries the body) and tries again after a short pause; three in a row back
//! off and tell the parent once; servers from `HIVE_EXTRA_MCP_SERVERS` never
//! trigger it; `/metrics` counts them. None of it uses up message attempts.
//! Real broker, real `hive serve`, the scripted fake claude.

mod common;

use common::agent_page::AgentPage;
use common::hive::*;
use std::time::Duration;

fn started(agent: &str, env: &[(&str, &str)]) -> (Broker, Harness) {
    let b = Broker::start(&[agent]);
    let h = Harness::start(&b, agent, env);
    h.fake.wait_count(1);
    wait_drained(&b, agent);
    (b, h)
}

/// Each run's outcome kind and note, as `kind: note`.
fn outcomes(h: &Harness) -> Vec<String> {
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let mut st = db
        .prepare(
            "SELECT CASE note WHEN '' THEN outcome ELSE outcome || ': ' || note END
             FROM turns ORDER BY id",
        )
        .unwrap();
    st.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The metric line for `server`.
fn mcp_failures(page: &AgentPage, server: &str) -> u64 {
    let m = page.metrics();
    let key = format!("hive_mcp_start_failures_total{{server=\"{server}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in\n{m}"))
}

#[test]
fn a_turn_without_its_mcp_servers_is_stopped_at_once_and_retried_with_the_body() {
    // The steps would run for ten minutes, far past the waits below: only a
    // turn stopped at its init line lets the next one start in time.
    let (b, h) = started("ana", &[]);
    let page = AgentPage::of(&h);
    assert_eq!(mcp_failures(&page, "hyperhive"), 0);
    h.fake
        .step(2, "init_mcp failed connected; sleep 600; ok_turn never");
    h.fake
        .step(3, "init_mcp connected pending; sleep 600; ok_turn never");
    let id = operator_send(&b, "ana", "needs tools");
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    for n in 3..=4 {
        let s = h.fake.stdin(n);
        assert!(
            s.contains("needs tools") && !s.contains("[system] Retry"),
            "invocation {n} carries the body: {s}"
        );
    }
    assert_eq!(mcp_failures(&page, "hyperhive"), 1);
    assert_eq!(mcp_failures(&page, "bash"), 1);
    let o = outcomes(&h);
    assert!(
        o[1].contains("hyperhive failed") && o[2].contains("bash pending"),
        "{o:?}"
    );
    assert_eq!(o[3], "ok");
    assert!(
        !operator_inbox(&b)
            .iter()
            .any(|m| m.body.contains(&format!("#{id}"))),
        "two in a row tell no one"
    );
}

#[test]
fn three_in_a_row_back_off_and_tell_the_parent_once_without_using_attempts() {
    let (b, h) = started("ana", &[("HIVE_TURN_MAX_ATTEMPTS", "1")]);
    let page = AgentPage::of(&h);
    for n in 2..=5 {
        h.fake
            .step(n, "init_mcp failed failed; sleep 600; ok_turn never");
    }
    let id = operator_send(&b, "ana", "patience");
    let s = page.wait_state("the MCP pause", |s| s["paused"]["reason"] == "mcp_start");
    assert!(
        s["paused"]["detail"].as_str().unwrap_or("").contains("MCP"),
        "{s}"
    );
    h.fake.wait_count(6);
    wait_drained(&b, "ana");
    let notices: Vec<_> = operator_inbox(&b)
        .into_iter()
        .filter(|m| m.body.contains("MCP servers did not start"))
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(
        notices[0].body.contains("3 turns in a row") && notices[0].body.contains(&format!("#{id}")),
        "{}",
        notices[0].body
    );
    assert_eq!(outcomes(&h).last().unwrap(), "ok", "not dead-lettered");
    assert!(h.fake.stdin(6).contains("patience"));
}

#[test]
fn servers_of_hive_extra_mcp_servers_never_stop_a_turn() {
    let (b, h) = started(
        "ana",
        &[(
            "HIVE_EXTRA_MCP_SERVERS",
            r#"{"matrix":{"command":"/nonexistent/matrix-mcp","allowedTools":["*"]}}"#,
        )],
    );
    h.fake.step(
        2,
        r#"printf '{"type":"system","subtype":"init","session_id":"s","tools":["Read"],"mcp_servers":[{"name":"hyperhive","status":"connected"},{"name":"bash","status":"connected"},{"name":"matrix","status":"failed"}],"model":"m","uuid":"u"}\n'; say fine; result_ok fine; exit 0"#,
    );
    operator_send(&b, "ana", "no matrix today");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    assert_eq!(outcomes(&h).last().unwrap(), "ok");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 2);
    let mcp = std::fs::read_to_string(h.run_dir().join("claude-mcp-config.json")).unwrap();
    let cfg: serde_json::Value = serde_json::from_str(&mcp).unwrap();
    assert_eq!(cfg["mcpServers"]["hyperhive"]["alwaysLoad"], true);
    assert!(
        cfg["mcpServers"]["matrix"].get("alwaysLoad").is_none(),
        "extra servers are as the operator wrote them: {mcp}"
    );
}
