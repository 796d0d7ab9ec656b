//! The hive-wide limit on claude processes at once (issue 42, the fleet
//! file's `max_claude`) on a real `hive up` with the scripted fake claude:
//! four agents woken together under a limit of 2 never run more than two
//! claude at once, every turn is done in the end, a harness killed in its
//! turn gives its slot to the next in line, and `hive reload` applies a new
//! limit at once. `hive up` refuses to start a fleet a host limit cannot
//! hold.

mod common;

use common::hive::{ok, wait_for};
use common::up::{Launch, Up};
use hyperhive::proto::cmd::{Agents, AgentsReply, Reload};
use std::path::PathBuf;
use std::time::Duration;

const KICK: &str = "You were just (re)started";
const AGENTS: [&str; 4] = ["ana", "bob", "cal", "dan"];

/// A boot turn that holds a lock on a file of its own under the test's
/// `fake-shared` dir while it runs, counts the files locked (writing `over`
/// there when it finds more than `max`), and holds until `release` exists
/// there.
fn held_turn(max: usize) -> String {
    format!(
        r#"init
shared="$dir/../fake-shared"
exec 9>"$shared/run-$(basename "$dir")-$$"
flock 9
n=0
for f in "$shared"/run-*; do flock -n "$f" true 2>/dev/null || n=$((n+1)); done
if [ "$n" -gt {max} ]; then echo "$n" >> "$shared/over"; fi
while [ ! -f "$shared/release" ]; do sleep 0.05; done
result_ok booted
exit 0
"#
    )
}

/// The agents whose fake claude runs now (under `up`'s dir), each with the
/// host pids of its processes, found in `/proc` (a sandbox's pid namespace
/// hides them from the fake itself).
fn live(up: &Up) -> Vec<(String, Vec<u32>)> {
    let root = up.dir.path().display().to_string();
    let mut out: Vec<(String, Vec<u32>)> = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if !cmdline.contains("fake-claude") || cmdline.contains("--version") {
            continue;
        }
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        if stat
            .rsplit_once(')')
            .is_none_or(|(_, r)| r.trim_start().starts_with('Z'))
        {
            continue;
        }
        let environ = std::fs::read(e.path().join("environ")).unwrap_or_default();
        let Some(dir) = environ
            .split(|b| *b == 0)
            .filter_map(|v| std::str::from_utf8(v).ok())
            .find_map(|v| v.strip_prefix("FAKE_CLAUDE_DIR="))
        else {
            continue;
        };
        let Some(agent) = dir
            .strip_prefix(&root)
            .and_then(|d| d.trim_start_matches('/').strip_prefix("fake-"))
        else {
            continue;
        };
        match out.iter_mut().find(|(a, _)| a == agent) {
            Some((_, pids)) => pids.push(pid),
            None => out.push((agent.to_string(), vec![pid])),
        }
    }
    out.sort();
    out
}

/// The agents whose fake claude runs now; never more than `max`.
fn running(up: &Up, max: usize) -> Vec<String> {
    let l: Vec<String> = live(up).into_iter().map(|(a, _)| a).collect();
    assert!(l.len() <= max, "more than {max} claude at once: {l:?}");
    l
}

fn rows(up: &Up) -> Vec<hyperhive::proto::AgentRow> {
    let r: AgentsReply = up.host().call(&Agents {}).unwrap();
    r.agents
}

fn fleet(max: usize) -> String {
    let entries: Vec<String> = AGENTS
        .iter()
        .map(|a| format!(r#"{{"name": "{a}", "env": {{"FAKE_CLAUDE_DIR": "@FAKE({a})"}}}}"#))
        .collect();
    format!(
        r#"{{"max_claude": {max}, "agents": [{}]}}"#,
        entries.join(", ")
    )
}

fn start(max: usize) -> Up {
    let launch = Launch {
        steps: AGENTS
            .iter()
            .map(|a| (a.to_string(), 1, held_turn(max)))
            .collect(),
        // Restarts come quickly: the killed harness is back in a moment.
        env: vec![("HIVE_UP_RESTART_BASE_MS".into(), "200".into())],
        ..Launch::default()
    };
    Up::launch(&fleet(max), &AGENTS, launch)
}

fn shared(up: &Up) -> PathBuf {
    up.dir.path().join("fake-shared")
}

#[test]
fn four_boot_turns_under_a_limit_of_two_run_two_at_a_time_and_a_killed_harness_frees_its_slot() {
    let up = start(2);
    let shared = shared(&up);
    // Two boot turns run; the other two wait for a slot.
    let first = wait_for(Duration::from_secs(30), "two claude to run", || {
        let l = running(&up, 2);
        (l.len() == 2).then_some(l)
    });
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(running(&up, 2), first, "still those two, and no third");
    for a in AGENTS.iter().filter(|a| !first.iter().any(|f| f == *a)) {
        assert_eq!(up.fake(a).count(), 0, "{a} ran a claude without a slot");
        let r = rows(&up).into_iter().find(|r| r.name == *a).unwrap();
        assert!(r.running && r.unread >= 1, "{a} waits with its kick: {r:?}");
    }
    assert!(!shared.join("over").exists());
    // A harness killed in its turn (its claude first) gives its slot back:
    // one of the waiting agents runs.
    let victim = first[0].clone();
    let claude = live(&up)
        .into_iter()
        .find(|(a, _)| *a == victim)
        .map(|(_, pids)| pids)
        .unwrap_or_default();
    let harness = up.state(&victim).unwrap().pid.unwrap();
    // SAFETY: kill(2) of processes this test's hive started.
    unsafe {
        for pid in claude {
            libc::kill(pid as i32, libc::SIGKILL);
        }
        libc::kill(harness as i32, libc::SIGKILL);
    }
    let next = wait_for(
        Duration::from_secs(30),
        "a waiting agent to take the freed slot",
        || running(&up, 2).into_iter().find(|a| !first.contains(a)),
    );
    eprintln!("{victim} killed; {next} took its slot");
    // Released, every turn is done: each agent ran its kick (the killed one
    // again, on its new harness), nothing is left inflight or queued.
    std::fs::write(shared.join("release"), "").unwrap();
    wait_for(Duration::from_secs(60), "every turn done", || {
        running(&up, 2);
        let done = rows(&up)
            .iter()
            .filter(|r| AGENTS.contains(&r.name.as_str()))
            .all(|r| r.running && r.inflight.is_none() && r.unread == 0);
        let ran = AGENTS.iter().all(|a| up.prompts_with(a, KICK) >= 1);
        (done && ran).then_some(())
    });
    assert!(up.prompts_with(&victim, KICK) >= 2, "its kick ran again");
    assert!(
        !shared.join("over").exists(),
        "more than two claude ran at once: {:?}",
        std::fs::read_to_string(shared.join("over"))
    );
}

#[test]
fn a_raised_limit_applies_on_reload() {
    let up = start(1);
    let shared = shared(&up);
    let first = wait_for(Duration::from_secs(30), "one claude to run", || {
        let l = running(&up, 1);
        (l.len() == 1).then_some(l)
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(running(&up, 1), first, "one at a time");
    // Four slots: the three waiting start now, while the first still holds.
    let text = std::fs::read_to_string(up.fleet_file()).unwrap();
    std::fs::write(
        up.fleet_file(),
        text.replace(r#""max_claude": 1"#, r#""max_claude": 4"#),
    )
    .unwrap();
    let r = ok(&mut up.host(), Reload {});
    let text = r["text"].as_str().unwrap_or_default();
    assert!(text.contains("max_claude: applies now"), "{text}");
    wait_for(Duration::from_secs(30), "four claude to run", || {
        (running(&up, 4).len() == 4).then_some(())
    });
    std::fs::write(shared.join("release"), "").unwrap();
    wait_for(Duration::from_secs(60), "every turn done", || {
        rows(&up)
            .iter()
            .filter(|r| AGENTS.contains(&r.name.as_str()))
            .all(|r| r.inflight.is_none() && r.unread == 0)
            .then_some(())
    });
}

/// `hive up` names a host limit the fleet would pass before it starts
/// anything: under a hard `RLIMIT_NOFILE` of 100 it refuses, naming the
/// descriptors it needs, the limit and how to raise it; with
/// `HIVE_UP_HOST_LIMITS=warn` it starts anyway, and says so.
#[test]
fn a_host_limit_the_fleet_would_pass_is_named_before_anything_starts() {
    let fleet = r#"{"agents": [{"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}]}"#;
    let wrapper = vec!["prlimit".to_string(), "--nofile=100:100".to_string()];
    let mut up = Up::launch(
        fleet,
        &["ana"],
        Launch {
            wrapper: wrapper.clone(),
            no_wait: true,
            ..Launch::default()
        },
    );
    let status = up.wait_exit();
    assert!(!status.success(), "{status:?}");
    let log = up.log();
    assert!(
        log.contains("this host's limits do not hold the fleet, so nothing was started"),
        "{log}"
    );
    assert!(
        log.contains("RLIMIT_NOFILE: 1 agents need 144 (idle, before any claude runs) descriptors in hive up, but the limit is 100"),
        "{log}"
    );
    assert!(log.contains("LimitNOFILE="), "{log}");
    assert!(
        !up.data().join("agents/ana").exists(),
        "ana was not started"
    );
    // Told to only warn, it starts, and says what it would hit.
    let up = Up::launch(
        fleet,
        &["ana"],
        Launch {
            wrapper,
            env: vec![("HIVE_UP_HOST_LIMITS".into(), "warn".into())],
            ..Launch::default()
        },
    );
    up.wait_prompt("ana", KICK, 1);
    assert!(
        up.log()
            .contains("hive up: RLIMIT_NOFILE: 1 agents need 144"),
        "{}",
        up.log()
    );
}
