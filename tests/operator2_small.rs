//! Small things the spec audit found untested or broken (issue 15 item 10),
//! each against real `hive broker` and `hive serve` processes with the fake
//! claude: the hive-wide `"*"` loose-ends query refused on an agent socket
//! (M15); the cap of 50 pending reminders per agent (M23); claude's working
//! directory is the state dir (T10); the label defaults to `hive` (C2);
//! `HIVE_CLAUDE_PLUGINS_AUTO_UPDATE` runs `marketplace update` before the
//! installs (N15); `HIVE_FORGE_URL=""` switches forge notifications off.

mod common;

use common::hive::{ok, refused, wait_for, Broker, Harness};
use hyperhive::proto::cmd::{CancelLooseEnd, GetLooseEnds, LooseEndsReply, Remind};
use hyperhive::proto::LooseEndKind;
use std::time::Duration;

#[test]
fn the_hive_wide_star_query_is_refused_on_an_agent_socket() {
    let b = Broker::start(&["ana", "bob"]);
    let mut ana = b.agent("ana");
    let e = refused(
        &mut ana,
        GetLooseEnds {
            agent: Some("*".into()),
        },
    );
    assert!(
        e.contains("the hive-wide \"*\" query is not available on an agent socket"),
        "{e}"
    );
    // Its own loose ends it reads.
    let own: LooseEndsReply = ana.call(&GetLooseEnds { agent: None }).unwrap();
    assert_eq!(own.agent, "ana");
}

fn remind(msg: &str) -> Remind {
    Remind {
        message: msg.into(),
        delay_seconds: Some(3600),
        at_unix_timestamp: None,
    }
}

#[test]
fn an_agent_holds_at_most_fifty_pending_reminders() {
    let b = Broker::start(&["ana", "bob"]);
    let mut ana = b.agent("ana");
    let mut ids = Vec::new();
    for n in 0..50 {
        let r = ok(&mut ana, remind(&format!("reminder {n}")));
        ids.push(r["id"].as_i64().unwrap());
    }
    let e = refused(&mut ana, remind("one too many"));
    assert!(
        e.contains("ana already has 50 pending reminders (the limit)")
            && e.contains("cancel_loose_end"),
        "{e}"
    );
    let ends: LooseEndsReply = ana.call(&GetLooseEnds { agent: None }).unwrap();
    assert_eq!(ends.reminders.len(), 50, "the refused one was not kept");
    // The cap is per agent: bob is not held up by ana's.
    ok(&mut b.agent("bob"), remind("bob's own"));
    // Cancelling one makes room for one.
    ok(
        &mut ana,
        CancelLooseEnd {
            kind: LooseEndKind::Reminder,
            id: ids[0],
        },
    );
    ok(&mut ana, remind("fits again"));
    refused(&mut ana, remind("full again"));
}

/// The fake claude's first turn (the boot kick) writes its working directory.
fn record_cwd(h: &Harness) {
    std::fs::write(
        h.fake.dir.join("default.sh"),
        "pwd -P > \"$dir/cwd-$FAKE_N\"\nok_turn \"done\"\n",
    )
    .unwrap();
}

#[test]
fn claude_runs_in_the_state_dir_and_the_label_defaults_to_hive() {
    let b = Broker::start(&["ana"]);
    // No HIVE_LABEL (an empty value unsets it in the kit); the first start has
    // no step script yet, so stop it and start again with one.
    let mut h = Harness::start(&b, "ana", &[("HIVE_LABEL", "")]);
    h.fake.wait_count(1);
    h.terminate();
    record_cwd(&h);
    h.spawn();
    h.fake.wait_count(2);
    let cwd = wait_for(Duration::from_secs(20), "the recorded cwd", || {
        // The shell makes the file, then writes the line: wait for all of it.
        let text = std::fs::read_to_string(h.fake.dir.join("cwd-2")).ok()?;
        text.ends_with('\n').then_some(text)
    });
    let state = h.state_dir().canonicalize().unwrap();
    assert_eq!(cwd.trim(), state.display().to_string());
    let prompt = std::fs::read_to_string(h.run_dir().join("claude-system-prompt.md")).unwrap();
    assert!(prompt.starts_with("# You are hive\n"), "{prompt}");
    assert!(prompt.contains("You are `hive`"), "{prompt}");
    h.terminate();
}

fn plugin_log(h: &Harness) -> Vec<String> {
    std::fs::read_to_string(h.fake.dir.join("plugins.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn plugins_auto_update_runs_marketplace_update_before_the_installs() {
    let b = Broker::start(&["ana", "bob"]);
    let env = [
        ("HIVE_CLAUDE_MARKETPLACES", "me/market"),
        ("HIVE_CLAUDE_PLUGINS", "formatter@me,lint@me"),
    ];
    let mut on = env.to_vec();
    on.push(("HIVE_CLAUDE_PLUGINS_AUTO_UPDATE", "true"));
    let h = Harness::start(&b, "ana", &on);
    h.fake.wait_count(1);
    assert_eq!(
        plugin_log(&h),
        [
            "plugin marketplace add me/market",
            "plugin marketplace update",
            "plugin install formatter@me",
            "plugin install lint@me",
        ]
    );
    // Off (the default): no update.
    let mut off = env.to_vec();
    off.push(("HIVE_CLAUDE_PLUGINS_AUTO_UPDATE", "false"));
    let h = Harness::start(&b, "bob", &off);
    h.fake.wait_count(1);
    assert_eq!(
        plugin_log(&h),
        [
            "plugin marketplace add me/market",
            "plugin install formatter@me",
            "plugin install lint@me",
        ]
    );
}

#[test]
fn an_empty_forge_url_switches_forge_notifications_off() {
    let b = Broker::start(&["ana"]);
    let mut h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    h.terminate();
    // A token is there, which would start the poller and write the tea login.
    std::fs::write(h.state_dir().join("forge-token"), "t0ken").unwrap();
    h.set_env_raw("HIVE_FORGE_URL", "");
    h.spawn();
    h.fake.wait_count(2);
    wait_for(Duration::from_secs(20), "the harness to say so", || {
        h.log()
            .contains("HIVE_FORGE_URL is empty: forge notifications are off")
            .then_some(())
    });
    let tea = h.dir.path().join("home/.config/tea/config.yml");
    assert!(!tea.exists(), "the tea login was written");
    assert!(
        !h.log().contains("forge notifications: polling"),
        "{}",
        h.log()
    );
    h.terminate();
    // Unset, the default URL is used again and the same token starts it.
    h.set_env("HIVE_FORGE_URL", "");
    h.spawn();
    wait_for(Duration::from_secs(20), "the tea login", || {
        std::fs::read_to_string(&tea).ok()
    });
    assert!(
        std::fs::read_to_string(&tea)
            .unwrap()
            .contains("http://localhost:3000"),
        "the default URL"
    );
}

fn stats_rows(h: &Harness) -> Vec<(String, String)> {
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let mut st = db
        .prepare("SELECT kind, outcome FROM turns ORDER BY id")
        .unwrap();
    st.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// K9: the checkpoint turn and the `/compact` after a turn past the watermark
/// are best effort: both failing costs the message nothing (acked once, not
/// retried, no dead letter, no failure notice), and the next message runs.
#[test]
fn a_failed_proactive_checkpoint_and_compact_never_fail_the_turn() {
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    common::hive::wait_drained(&b, "ana");
    h.fake.step(2, "ok_turn big 160000");
    // The checkpoint crashes; the /compact after it fails.
    h.fake.step(3, "init; echo boom >&2; exit 3");
    h.fake
        .step(4, "compact_failed \"Compaction failed: the API said no\"");
    common::hive::operator_send(&b, "ana", "grow");
    h.fake.wait_count(4);
    common::hive::wait_drained(&b, "ana");
    assert!(
        h.fake.stdin(3).contains("Checkpoint"),
        "{}",
        h.fake.stdin(3)
    );
    assert_eq!(h.fake.stdin(4).trim(), "/compact");
    common::hive::operator_send(&b, "ana", "after");
    h.fake.wait_count(5);
    common::hive::wait_drained(&b, "ana");
    assert!(h.fake.stdin(5).contains("after"), "{}", h.fake.stdin(5));
    assert_eq!(
        (1..=h.fake.count())
            .filter(|n| h.fake.stdin(*n).contains("grow"))
            .count(),
        1,
        "the message was not retried"
    );
    let row = common::hive::agent_row(&b, "ana");
    assert_eq!((row.turns_ok, row.turns_failed), (3, 0), "{row:?}");
    assert!(
        common::hive::operator_inbox(&b).is_empty(),
        "no failure notice: {:?}",
        common::hive::operator_inbox(&b)
    );
    let rows = stats_rows(&h);
    assert_eq!(rows.len(), 5, "{rows:?}");
    assert_ne!(rows[2].1, "ok", "the checkpoint failed: {rows:?}");
    assert_ne!(rows[3].1, "ok", "the compact failed: {rows:?}");
    assert_eq!(rows[4].1, "ok", "{rows:?}");
}
