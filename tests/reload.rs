//! `hive reload`, `hive forget` and `hive update --all` (issue 39, item 1) on
//! a real `hive up` with the scripted fake claude: the fleet file applied
//! while the hive runs — added agents start, changed ones restart onto their
//! entry (after the turn they are in), removed ones stop and keep their mail
//! until forgotten, and every other agent keeps its harness (same pid); a
//! file that does not load changes nothing; `update --all` restarts the
//! stale agents a few at a time, each after the one before ran its boot turn.

mod common;

use common::hive::{ok, refused, run_hive, wait_for};
use common::up::Up;
use hyperhive::proto::cmd::{
    Agents, AgentsReply, Failed, FailedReply, ForgetAgent, Reload, Retry, Send, StopAgent,
    UpdateAll,
};
use std::collections::BTreeMap;
use std::time::Duration;

const KICK: &str = "You were just (re)started";

/// A fleet of root agents, each with its fake claude; `extra` goes into the
/// entry of the agent it names (e.g. `"model": "sonnet"`).
fn fleet(up: &Up, agents: &[&str], extra: &[(&str, &str)]) -> String {
    let entries: Vec<String> = agents
        .iter()
        .map(|a| {
            let fake = up.dir.path().join(format!("fake-{a}"));
            std::fs::create_dir_all(&fake).unwrap();
            let more: String = extra
                .iter()
                .filter(|(n, _)| n == a)
                .map(|(_, e)| format!(", {e}"))
                .collect();
            format!(
                r#"{{"name": "{a}", "env": {{"FAKE_CLAUDE_DIR": "{}"}}{more}}}"#,
                fake.display()
            )
        })
        .collect();
    format!(
        r#"{{"web": {{"listen": "127.0.0.1:0"}}, "agents": [{}]}}"#,
        entries.join(", ")
    )
}

fn start(agents: &[&str], env: &[(&str, &str)]) -> Up {
    let entries: Vec<String> = agents
        .iter()
        .map(|a| format!(r#"{{"name": "{a}", "env": {{"FAKE_CLAUDE_DIR": "@FAKE({a})"}}}}"#))
        .collect();
    let text = format!(r#"{{"agents": [{}]}}"#, entries.join(", "));
    let up = Up::start_env(&text, agents, env);
    for a in agents {
        up.wait_prompt(a, KICK, 1);
    }
    up
}

fn pids(up: &Up) -> BTreeMap<String, Option<u32>> {
    up.states().into_iter().map(|s| (s.name, s.pid)).collect()
}

fn reload(up: &Up) -> String {
    ok(&mut up.host(), Reload {})["text"]
        .as_str()
        .unwrap()
        .to_string()
}

fn send(up: &Up, to: &str, body: &str) -> Result<(), String> {
    let mut c = up.host();
    let req = Send {
        to: to.into(),
        body: body.into(),
        in_reply_to: None,
    };
    let line = serde_json::to_string(&hyperhive::proto::Request::from(req)).unwrap();
    common::hive::call_raw(&mut c, &line)
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn row(up: &Up, name: &str) -> Option<hyperhive::proto::AgentRow> {
    let r: AgentsReply = up.host().call(&Agents {}).unwrap();
    r.agents.into_iter().find(|a| a.name == name)
}

/// Waits until `name` has no message queued or in a turn.
fn drained(up: &Up, name: &str) {
    wait_for(
        Duration::from_secs(30),
        &format!("{name}'s inbox to drain"),
        || {
            let r = row(up, name)?;
            (r.unread == 0 && r.inflight.is_none()).then_some(())
        },
    );
}

#[test]
fn reload_adds_changes_and_removes_agents_and_keeps_every_other_harness() {
    let up = start(&["ana", "bob", "cal"], &[]);
    let before = pids(&up);
    let host_socket = up.data().join("run/host.sock");
    let sock = host_socket.display().to_string();

    // A file that does not load changes nothing, and says where it is wrong.
    let good = std::fs::read_to_string(up.fleet_file()).unwrap();
    std::fs::write(
        up.fleet_file(),
        fleet(&up, &["ana", "bob"], &[("bob", r#""modle": "sonnet""#)]),
    )
    .unwrap();
    let (code, out, err) = run_hive(&["reload", "--socket", &sock], None, &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("does not load") && err.contains("modle"),
        "{err}"
    );
    assert!(err.contains("nothing changed"), "{err}");
    assert_eq!(pids(&up), before, "a bad file restarted an agent");
    assert_eq!(up.state("cal").unwrap().state, "running");
    std::fs::write(up.fleet_file(), &good).unwrap();

    // cal gets mail while it is stopped; then it leaves the fleet.
    ok(&mut up.host(), StopAgent { name: "cal".into() });
    wait_for(Duration::from_secs(30), "cal to stop", || {
        (up.state("cal")?.state == "stopped").then_some(())
    });
    send(&up, "cal", "cal's first letter").unwrap();

    // Remove cal, add dan, change bob's model; ana is untouched.
    std::fs::write(
        up.fleet_file(),
        fleet(
            &up,
            &["ana", "bob", "dan"],
            &[("bob", r#""model": "sonnet""#)],
        ),
    )
    .unwrap();
    let (code, out, err) = run_hive(&["reload", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("1 unchanged agent keep"), "{out}");
    assert!(out.contains("dan: added and started"), "{out}");
    assert!(out.contains("cal: removed from the fleet"), "{out}");
    assert!(out.contains("bob: "), "{out}");
    up.wait_running("dan");
    up.wait_prompt("dan", KICK, 1);
    let bob = wait_for(Duration::from_secs(30), "bob to run its new entry", || {
        let s = up.state("bob")?;
        (s.state == "running"
            && s.pid != before["bob"]
            && s.applied.model.as_deref() == Some("sonnet"))
        .then_some(s)
    });
    assert!(bob.up_to_date);
    assert_eq!(
        up.state("ana").unwrap().pid,
        before["ana"],
        "ana was restarted"
    );

    // cal: removed, its mail kept, and refused as a recipient.
    assert_eq!(up.state("cal").unwrap().state, "removed");
    let cal = row(&up, "cal").expect("cal is listed");
    assert!(cal.removed && cal.unread == 1, "{cal:?}");
    let e = send(&up, "cal", "another").unwrap_err();
    assert!(e.contains("cal was removed from the fleet"), "{e}");
    let (code, out, _) = run_hive(&["agents", "--socket", &sock], None, &[]);
    assert_eq!(code, 0);
    let line = out.lines().find(|l| l.starts_with("cal ")).expect(&out);
    assert!(line.contains("removed"), "{line}");
    let e = refused(
        &mut up.host(),
        hyperhive::proto::cmd::StartAgent { name: "cal".into() },
    );
    assert!(e.contains("was removed from the fleet"), "{e}");

    // Back in the fleet, cal finds its letter.
    std::fs::write(
        up.fleet_file(),
        fleet(
            &up,
            &["ana", "bob", "cal", "dan"],
            &[("bob", r#""model": "sonnet""#)],
        ),
    )
    .unwrap();
    let text = reload(&up);
    assert!(text.contains("cal: back in the fleet"), "{text}");
    up.wait_prompt("cal", "cal's first letter", 1);
    drained(&up, "cal");
    assert!(!row(&up, "cal").unwrap().removed);

    // Out again with a letter waiting; forgotten, the letter is a dead letter.
    ok(&mut up.host(), StopAgent { name: "cal".into() });
    wait_for(Duration::from_secs(30), "cal to stop", || {
        (up.state("cal")?.state == "stopped").then_some(())
    });
    send(&up, "cal", "cal's second letter").unwrap();
    std::fs::write(
        up.fleet_file(),
        fleet(
            &up,
            &["ana", "bob", "dan"],
            &[("bob", r#""model": "sonnet""#)],
        ),
    )
    .unwrap();
    reload(&up);
    let e = refused(&mut up.host(), ForgetAgent { name: "ana".into() });
    assert!(e.contains("ana is in the fleet"), "{e}");
    let (code, out, err) = run_hive(&["forget", "cal", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("forgot cal: 1 queued message is now dead letter"),
        "{out}"
    );
    let failed: FailedReply = up
        .host()
        .call(&Failed {
            agent: Some("cal".into()),
        })
        .unwrap();
    let letter = failed
        .failed
        .iter()
        .find(|m| m.body == "cal's second letter")
        .unwrap_or_else(|| panic!("{failed:?}"));
    let e = refused(&mut up.host(), Retry { id: letter.id });
    assert!(e.contains("which is not in the fleet"), "{e}");
    assert!(row(&up, "cal").is_none(), "cal is still listed");
    assert!(up.state("cal").is_none(), "cal is still supervised");
    let e = send(&up, "cal", "x").unwrap_err();
    assert!(e.contains("unknown agent \"cal\""), "{e}");
    // Its data dir stays.
    assert!(up.data().join("agents/cal/state").is_dir());
    // Nobody else moved through all of it.
    assert_eq!(up.state("ana").unwrap().pid, before["ana"]);
}

#[test]
fn a_changed_agent_in_a_turn_restarts_once_the_turn_ends() {
    // The stop grace is long: only the turn's end may start the restart.
    let up = start(&["ana", "bob"], &[("HIVE_UP_STOP_GRACE_MS", "120000")]);
    let fake = up.fake("ana");
    let release = fake.dir.join("release");
    fake.step(
        2,
        &format!(
            r#"init; say working; while [ ! -f "{}" ]; do sleep 0.05; done; result_ok done; exit 0"#,
            release.display()
        ),
    );
    let before = pids(&up);
    send(&up, "ana", "a long job").unwrap();
    fake.wait_count(2);
    wait_for(
        Duration::from_secs(30),
        "ana's turn to hold its message",
        || row(&up, "ana")?.inflight.map(|_| ()),
    );
    std::fs::write(
        up.fleet_file(),
        fleet(&up, &["ana", "bob"], &[("ana", r#""model": "opus""#)]),
    )
    .unwrap();
    let text = reload(&up);
    assert!(text.contains("ana: ana is in a turn"), "{text}");
    assert!(text.contains("1 unchanged agent"), "{text}");
    // The turn keeps running on the old harness.
    std::thread::sleep(Duration::from_millis(700));
    let s = up.state("ana").unwrap();
    assert_eq!(
        (s.state.to_string(), s.pid),
        ("rebuilding".to_string(), before["ana"])
    );
    assert!(row(&up, "ana").unwrap().inflight.is_some());
    std::fs::write(&release, "").unwrap();
    let s = wait_for(
        Duration::from_secs(30),
        "ana to restart after its turn",
        || {
            let s = up.state("ana")?;
            (s.state == "running" && s.pid != before["ana"]).then_some(s)
        },
    );
    assert_eq!(s.applied.model.as_deref(), Some("opus"));
    up.wait_prompt("ana", KICK, 2);
    drained(&up, "ana");
    // The message was handled once: acked by its turn, never run again.
    assert_eq!(up.prompts_with("ana", "a long job"), 1);
    assert_eq!(up.state("bob").unwrap().pid, before["bob"]);
}

#[test]
fn update_all_restarts_stale_agents_one_after_the_others_boot_turn() {
    let up = Up::start_with(
        r#"{"agents": [
          {"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}},
          {"name": "bob", "env": {"FAKE_CLAUDE_DIR": "@FAKE(bob)"}},
          {"name": "cal", "env": {"FAKE_CLAUDE_DIR": "@FAKE(cal)"}}
        ]}"#,
        &["ana", "bob", "cal"],
        true,
    );
    for a in ["ana", "bob", "cal"] {
        up.wait_prompt(a, KICK, 1);
    }
    let sock = up.data().join("run/host.sock").display().to_string();
    let (code, out, _) = run_hive(&["update", "--all", "--socket", &sock], None, &[]);
    assert_eq!(code, 0);
    assert!(out.contains("nothing to update"), "{out}");
    // ana's boot turn after its update holds until released.
    let fake = up.fake("ana");
    let release = fake.dir.join("release");
    fake.step(
        2,
        &format!(
            r#"init; while [ ! -f "{}" ]; do sleep 0.05; done; result_ok booted; exit 0"#,
            release.display()
        ),
    );
    let before = pids(&up);
    std::thread::sleep(Duration::from_millis(300));
    up.rebuild_binary();
    let (code, out, err) = run_hive(
        &["update", "--all", "--parallel", "1", "--socket", &sock],
        None,
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("updating 3 agents, at most 1 at a time") && out.contains("ana, bob, cal"),
        "{out}"
    );
    // ana goes first; while its boot turn runs, nobody else restarts.
    fake.wait_count(2);
    assert_ne!(up.state("ana").unwrap().pid, before["ana"]);
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        up.state("bob").unwrap().pid,
        before["bob"],
        "bob went before ana's boot turn ended"
    );
    assert_eq!(up.state("cal").unwrap().pid, before["cal"]);
    std::fs::write(&release, "").unwrap();
    for a in ["bob", "cal"] {
        wait_for(
            Duration::from_secs(60),
            &format!("{a} to be updated"),
            || {
                let s = up.state(a)?;
                (s.state == "running" && s.pid != before[a] && s.up_to_date).then_some(())
            },
        );
        up.wait_prompt(a, KICK, 2);
    }
    assert!(up.state("ana").unwrap().up_to_date);
    wait_for(Duration::from_secs(30), "update --all to finish", || {
        up.log().contains("update --all: done").then_some(())
    });
    // Bad input: a count out of range names itself.
    let (code, _, err) = run_hive(
        &["update", "--all", "--parallel", "0", "--socket", &sock],
        None,
        &[],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("parallel got 0; it must be from 1 to 64"),
        "{err}"
    );
    let (code, _, err) = run_hive(
        &["update", "ana", "--parallel", "2", "--socket", &sock],
        None,
        &[],
    );
    assert_eq!(code, 2);
    assert!(err.contains("--parallel goes with --all"), "{err}");
    let e = refused(&mut up.host(), UpdateAll { parallel: Some(65) });
    assert!(e.contains("from 1 to 64"), "{e}");
}
