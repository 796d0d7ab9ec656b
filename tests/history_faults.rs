//! The turn log on a filesystem that goes wrong (the small-tmpfs kit, root
//! only; SKIPPED otherwise): a full disk and a read-only state dir are a
//! warning, never a failed turn, and once space is back the log goes on with
//! a `history gap` row where the lost events were.

mod common;

use common::hive::*;
use common::smallfs::{fill, SmallFs};
use common::web::Page;
use serde_json::Value;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

fn skipped(test: &str) {
    eprintln!("SKIPPED {test}: cannot mount a tmpfs (needs root); see docs/reliability.md");
}

fn history(page: &Page, query: &str) -> Value {
    let r = page.get(&format!("/api/history?{query}"));
    assert_eq!(r.status, 200, "/api/history?{query}: {}", r.body);
    r.json()
}

/// The turn whose message holds `needle`, once it ended.
fn ended(page: &Page, needle: &str) -> Value {
    wait_for(T, &format!("the ended turn of {needle:?}"), || {
        history(page, "limit=200")["turns"]
            .as_array()?
            .iter()
            .find(|t| {
                t["body"].as_str().is_some_and(|b| b.contains(needle)) && !t["ended_at"].is_null()
            })
            .cloned()
    })
}

/// A fake turn that prints `lines` assistant lines of 15 000 bytes each.
fn big_turn(lines: usize) -> String {
    format!(
        r#"init; big=$(head -c 15000 /dev/zero | tr '\0' x); for i in $(seq {lines}); do say "$big"; done; result_ok "done"; exit 0"#
    )
}

#[test]
fn a_full_disk_keeps_turns_running_and_leaves_a_gap_row() {
    let Some(fs) = SmallFs::mount("16m") else {
        return skipped("a_full_disk_keeps_turns_running_and_leaves_a_gap_row");
    };
    let state = fs.0.join("state");
    let b = Broker::start(&["ana"]);
    let h = Harness::start_at(&b, "ana", &[], Some(&state));
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let page = Page::of(&state);
    operator_send(&b, "ana", "before-full walrus");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    ended(&page, "before-full walrus");
    fill(&fs.0.join("filler"));
    // Two turns of 1.5 MB each cannot be written; they run all the same.
    for (n, body) in [(3, "during-full one"), (4, "during-full two")] {
        h.fake.step(n, &big_turn(100));
        operator_send(&b, "ana", body);
        h.fake.wait_count(n);
        wait_drained(&b, "ana");
    }
    let row = agent_row(&b, "ana");
    assert_eq!(
        row.turns_ok,
        4,
        "every turn completed: {row:?}\n{}",
        h.log()
    );
    wait_for(T, "the warning", || {
        h.log().contains("history: cannot write").then_some(())
    });
    // The page still reads what was kept.
    ended(&page, "before-full walrus");
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    operator_send(&b, "ana", "after-full heron");
    h.fake.wait_count(5);
    wait_drained(&b, "ana");
    ended(&page, "after-full heron");
    let turns = history(&page, "limit=200")["turns"].clone();
    let gap = turns
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["events"].as_array().unwrap().clone())
        .find(|e| e["type"] == "gap")
        .unwrap_or_else(|| panic!("no gap row in {turns}"));
    let text = gap["text"].as_str().unwrap();
    assert!(
        text.starts_with("history gap: ") && text.contains(" events"),
        "{text}"
    );
    assert!(gap["events"].as_u64().unwrap() > 0);
    assert!(h.log().contains("history: writing again"), "{}", h.log());
    let check: String = rusqlite::Connection::open(state.join("history.db"))
        .unwrap()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok");
}

#[test]
fn a_read_only_state_dir_keeps_turns_running() {
    let Some(fs) = SmallFs::mount("8m") else {
        return skipped("a_read_only_state_dir_keeps_turns_running");
    };
    let state = fs.0.join("state");
    let b = Broker::start(&["ana"]);
    let mut h = Harness::start_at(&b, "ana", &[], Some(&state));
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let old = Page::of(&state);
    h.terminate();
    assert!(fs.read_only(true), "cannot remount read-only");
    // The port file cannot be written now: the page gets a port of its own;
    // nor can a generated token be made private again, so the operator's is
    // set (the page refuses to run with a token file it cannot secure).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    h.set_env("HIVE_PORT", &port.to_string());
    h.set_env("HIVE_WEB_TOKEN", "ro-test-token");
    h.spawn();
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    operator_send(&b, "ana", "read-only otter");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    let row = agent_row(&b, "ana");
    assert_eq!(row.turns_ok, 3, "{row:?}\n{}", h.log());
    assert!(
        h.log().contains("this run's history is not kept"),
        "{}",
        h.log()
    );
    assert!(old.token.is_some());
    let page = Page {
        port,
        token: Some("ro-test-token".into()),
        prefix: String::new(),
    };
    let mut sse = page.sse("/events", &[]);
    let mut said = false;
    for _ in 0..200 {
        let Some(e) = sse.next(T) else { break };
        if e.data.contains("this run's turns are not kept") {
            said = true;
            break;
        }
    }
    assert!(said, "the page says why there is no history this run");
    assert!(fs.read_only(false));
}
