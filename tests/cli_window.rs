//! The supported window of Claude Code CLI versions (`agent_proc::CLAUDE_CLI_WINDOW`):
//! a CLI outside it still runs every turn, and the operator hears of it once.
//! A plain `hive serve` tells its parent once per version (kept across its
//! restarts in the state dir); `hive up` asks each claude binary its version
//! at start and tells the operator once per hive and version, and its
//! harnesses say nothing more. The scripted fake claude reports the version
//! `FAKE_CLAUDE_VERSION` names, in its `system/init` line and to `--version`.

mod common;

use common::hive::*;
use common::up::{Launch, Up};
use hyperhive::proto::MsgKind;
use std::time::Duration;

const OUTSIDE: &str = "outside the versions hive is tested with";

#[test]
fn a_plain_harness_tells_its_parent_once_per_version_and_the_turns_run() {
    let b = Broker::start(&["ana"]);
    let mut h = Harness::start(&b, "ana", &[("FAKE_CLAUDE_VERSION", "2.1.999")]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let notice = wait_for(Duration::from_secs(20), "the version notice", || {
        operator_inbox(&b)
            .into_iter()
            .find(|m| m.body.contains(OUTSIDE))
    });
    assert!(notice.body.contains("2.1.999"), "{notice:?}");
    assert!(notice.body.starts_with("[ana] "), "{notice:?}");

    // The next turn runs as any other, and tells nothing again.
    operator_send(&b, "ana", "work");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    // A restarted harness remembers what it told.
    h.terminate();
    h.spawn();
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    // The restarted harness saw the version again (its log says so, as
    // its page does) and did not tell it: the parent notice, had there been
    // one, goes out with the run's end, before the next hand-out.
    wait_for(
        Duration::from_secs(20),
        "the second harness's warning",
        || (h.log().matches(OUTSIDE).count() >= 2).then_some(()),
    );
    operator_send(&b, "ana", "more work");
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    let again: Vec<_> = operator_inbox(&b)
        .into_iter()
        .filter(|m| m.body.contains(OUTSIDE))
        .collect();
    assert!(again.is_empty(), "told twice: {again:?}");
    let told = std::fs::read_to_string(
        h.state_dir()
            .join(hyperhive::proto::paths::state::CLI_VERSIONS_TOLD),
    )
    .unwrap();
    assert_eq!(told, "2.1.999\n");
}

#[test]
fn a_version_inside_the_window_is_never_told() {
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[("FAKE_CLAUDE_VERSION", "2.1.250")]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    operator_send(&b, "ana", "work");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    assert!(
        !operator_inbox(&b).iter().any(|m| m.body.contains(OUTSIDE)),
        "a version inside the window was told"
    );
}

#[test]
fn hive_up_tells_the_operator_once_per_hive_and_version() {
    let fleet = r#"{"agents": [
        {"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}},
        {"name": "bob", "env": {"FAKE_CLAUDE_DIR": "@FAKE(bob)"}}
    ]}"#;
    let launch = Launch {
        env: vec![("FAKE_CLAUDE_VERSION".into(), "2.1.100".into())],
        ..Launch::default()
    };
    let mut up = Up::launch(fleet, &["ana", "bob"], launch);
    up.wait_prompt("ana", "(re)started", 1);
    up.wait_prompt("bob", "(re)started", 1);
    let notices = |up: &Up| -> Vec<hyperhive::proto::Message> {
        read_inbox(&mut up.host())
            .into_iter()
            .filter(|m| m.body.contains(OUTSIDE))
            .collect()
    };
    let first = wait_for(Duration::from_secs(20), "hive up's notice", || {
        let n = notices(&up);
        (!n.is_empty()).then_some(n)
    });
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].kind, MsgKind::CliVersion, "{first:?}");
    assert!(first[0].body.contains("2.1.100"), "{first:?}");
    assert!(
        up.stdout().contains(OUTSIDE) || up.log().contains(OUTSIDE),
        "hive up printed nothing of it"
    );
    // Both agents ran their kick turns on it; a turn more runs too.
    let mut c = up.host();
    let _: serde_json::Value = c
        .call(&hyperhive::proto::cmd::Send {
            to: "ana".into(),
            body: "work".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .map(|r| serde_json::to_value(r).unwrap())
        .unwrap();
    up.wait_prompt("ana", "work", 1);

    up.terminate();
    up.restart(&["ana", "bob"]);
    up.wait_prompt("ana", "(re)started", 2);
    let later = notices(&up);
    assert!(later.is_empty(), "told again after a restart: {later:?}");
}
