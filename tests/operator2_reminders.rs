//! Long reminders the agent can read (issue 15, item 5): the broker keeps the
//! whole payload in `broker.db` and writes no file; the agent's own side —
//! `hive mcp`'s `recv`, and `hive serve` when the reminder starts a turn —
//! writes `<state>/reminders/<id>.md` on delivery and shows its path.

mod common;

use common::hive::{ok, wait_drained, Broker, Harness, TempDir};
use common::mcp::McpProc;
use hyperhive::proto::cmd::Remind;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Nothing under the broker's state dir but its database files.
fn broker_wrote_no_file(b: &Broker) {
    let mut names: Vec<String> = std::fs::read_dir(b.state_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with("broker.db"))
        .collect();
    names.sort();
    assert!(
        !b.state_dir().join("agents").exists(),
        "the broker wrote {names:?}"
    );
}

#[test]
fn recv_writes_a_long_reminder_into_the_agents_state_dir_and_shows_its_path() {
    let b = Broker::start(&["ana"]);
    let tmp = TempDir::new("rem");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let socket = b.agent_socket("ana");
    let mut mcp = McpProc::start(
        &[
            ("HIVE_SOCKET", socket.to_str().unwrap()),
            ("HIVE_STATE_DIR", state.to_str().unwrap()),
        ],
        &tmp.path().join("mcp.log"),
    );
    mcp.initialize();
    // A name-like start must not steer the file: its name is the row id.
    let text = format!("../../escape {}", "long text ".repeat(600));
    let set = mcp.ok(1, "remind", json!({"message": text, "delay_seconds": 3600}));
    let id: i64 = set
        .strip_prefix("reminder #")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{set}"));
    let ends = mcp.ok(2, "get_loose_ends", json!({}));
    assert!(
        ends.contains(&format!("reminder #{id} fires "))
            && ends.ends_with(&format!(
                "… ({} bytes; it arrives as a file in your state dir)",
                text.len()
            )),
        "{ends}"
    );
    broker_wrote_no_file(&b);

    // One that fires now: delivered through recv.
    let now = mcp.ok(3, "remind", json!({"message": text, "delay_seconds": 0}));
    let now_id: i64 = now
        .strip_prefix("reminder #")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap();
    let got = mcp.ok(4, "recv", json!({"wait_seconds": 10}));
    let file = state.join(format!("reminders/{now_id}.md"));
    let preview: String = text.chars().take(200).collect();
    assert!(
        got.ends_with(&format!(
            "from reminder (reminder): [reminder #{now_id}] {preview}… (the whole text, {} bytes, is in {})",
            text.len(),
            file.display()
        )),
        "{got}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    assert_eq!(mode(&file), 0o600);
    assert_eq!(mode(&state.join("reminders")), 0o700);
    let in_dir: Vec<_> = std::fs::read_dir(state.join("reminders"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(in_dir, [format!("{now_id}.md")]);
    assert!(!tmp.path().join("escape").exists());
    broker_wrote_no_file(&b);
}

#[test]
fn a_long_reminder_that_starts_a_turn_is_a_file_and_a_preview_in_the_prompt() {
    let b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    let text = format!("the whole plan: {}", "step ".repeat(1500));
    let r = ok(
        &mut a,
        Remind {
            message: text.clone(),
            delay_seconds: Some(0),
            at_unix_timestamp: None,
        },
    );
    let id = r["id"].as_i64().unwrap();
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let file = h.state_dir().join(format!("reminders/{id}.md"));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), text);
    let prompt = h.fake.stdin(1);
    let preview: String = text.chars().take(200).collect();
    assert!(
        prompt.contains(&format!(
            "[reminder #{id}] {preview}… (the whole text, {} bytes, is in {})",
            text.len(),
            file.display()
        )),
        "{prompt}"
    );
    assert!(prompt.len() < 1024, "the prompt carries the preview only");
    broker_wrote_no_file(&b);
}

#[test]
fn a_short_reminder_arrives_whole_and_writes_no_file() {
    let b = Broker::start(&["ana"]);
    let mut a = b.agent("ana");
    ok(
        &mut a,
        Remind {
            message: "check the oven".into(),
            delay_seconds: Some(0),
            at_unix_timestamp: None,
        },
    );
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    assert!(
        h.fake.stdin(1).contains("] check the oven"),
        "{}",
        h.fake.stdin(1)
    );
    assert!(!h.state_dir().join("reminders").exists());
}
