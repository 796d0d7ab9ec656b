//! What the harness does with what the CLI prints that it has never seen:
//! every frame and field the CLI added after 2.1.197 (field-reports §6.2), a
//! frame type and a `system` subtype no CLI printed yet, and a line that is
//! not JSON (`tests/fixtures/cli-frames.jsonl`, printed by the scripted fake
//! claude). The turn runs and is acked as its `result` says; every frame is
//! kept whole on the live stream and in the history; the line that is not
//! JSON becomes a note.

mod common;

use common::hive::*;
use common::web::Page;
use std::path::Path;
use std::time::Duration;

#[test]
fn frames_it_does_not_know_are_kept_and_the_turn_runs() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/cli-frames.jsonl");
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    h.fake.step(
        2,
        &format!(
            "head -n 3 '{f}'; echo 'plain text the CLI printed, not JSON'; tail -n +4 '{f}'; exit 0",
            f = fixture.display()
        ),
    );
    operator_send(&b, "ana", "a turn of frames never seen");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    let row = agent_row(&b, "ana");
    assert_eq!(row.failed, 0, "{row:?}");

    let page = Page::of(&h.state_dir());
    let turn = wait_for(Duration::from_secs(20), "the turn in the history", || {
        let r = page.get("/api/history?limit=50");
        let v = r.json();
        v["turns"]
            .as_array()?
            .iter()
            .find(|t| {
                t["body"]
                    .as_str()
                    .is_some_and(|b| b.contains("frames never seen"))
                    && !t["ended_at"].is_null()
            })
            .cloned()
    });
    assert_eq!(turn["outcome"], "ok", "{turn}");
    assert_eq!(turn["decision"], "ack", "{turn}");
    let events = turn["events"].as_array().unwrap();
    let streamed: Vec<&serde_json::Value> = events
        .iter()
        .filter(|e| e["type"] == "stream")
        .map(|e| &e["value"])
        .collect();
    let printed: Vec<serde_json::Value> = std::fs::read_to_string(&fixture)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for frame in &printed {
        assert!(
            streamed.contains(&frame),
            "a frame was not kept whole: {frame}\nkept: {streamed:?}"
        );
    }
    assert!(
        events.iter().any(|e| e["type"] == "note"
            && e["text"]
                .as_str()
                .is_some_and(|t| t.contains("stdout: plain text the CLI printed"))),
        "the line that is not JSON is a note: {events:?}"
    );
}
