//! Background tasks outlive the harness (issue 15 item 4): under a real `hive
//! up` with the fake claude, each agent's bash-task daemon is a child of its
//! own (`src/fleet/bashd.rs`), logged to `DATA/logs/NAME.bash.log`. A task
//! keeps running through `hive restart`, `hive update` and a SIGKILLed
//! harness; a task that ends while the harness is down wakes the agent once it
//! is back; `hive stop` stops the daemon and its tasks (recorded
//! `interrupted`, the wake waiting in the agent's queue until `hive start`); a
//! crashed daemon is restarted. The processes are looked for in the host's
//! `/proc` by a marker in their command line, which holds with the agents
//! isolated (their PID namespaces are visible from outside) or not.

mod common;

use common::hive::{run_hive, wait_for};
use common::up::{Launch, Up};
use hyperhive::bash::client::{call, CallError};
use hyperhive::bash::proto::{Request as BashRequest, TaskReply, TaskStatus};
use std::path::PathBuf;
use std::time::Duration;

const FLEET: &str = r#"{"agents": [
  {"name": "ruth", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ruth)"}}
]}"#;

const KICK: &str = "You were just (re)started";

/// `hive ARGS --socket HOST`; (exit code, stdout, stderr).
fn hive(up: &Up, args: &[&str]) -> (i32, String, String) {
    let socket = up.data().join("run/host.sock");
    let socket = socket.to_str().unwrap().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.push("--socket");
    all.push(&socket);
    run_hive(&all, None, &[])
}

fn lifecycle(up: &Up, verb: &str) {
    let (code, out, err) = hive(up, &[verb, "ruth"]);
    assert_eq!(code, 0, "hive {verb} ruth: {out}{err}");
}

fn socket(up: &Up) -> PathBuf {
    up.data().join("agents/ruth/run/bash.sock")
}

fn state_dir(up: &Up) -> PathBuf {
    up.data().join("agents/ruth/state")
}

fn bash(up: &Up, req: &BashRequest) -> Result<TaskReply, CallError> {
    call(&socket(up), req, &crossbeam_channel::never())
}

/// Starts `cmd` in the background (no inline wait) and returns its id.
fn start_task(up: &Up, cmd: &str) -> String {
    let r = wait_for(Duration::from_secs(30), "the bash-task daemon", || {
        bash(
            up,
            &BashRequest::Run {
                cmd: cmd.into(),
                timeout_secs: None,
                wait_seconds: Some(0),
            },
        )
        .ok()
    });
    assert_eq!(r.task.status, TaskStatus::Running, "{r:?}");
    r.task.id
}

fn status(up: &Up, id: &str) -> Result<TaskReply, CallError> {
    bash(
        up,
        &BashRequest::Status {
            id: id.into(),
            wait_seconds: Some(0),
        },
    )
}

/// The task's record as the daemon persisted it.
fn record(up: &Up, id: &str) -> serde_json::Value {
    let p = state_dir(up).join(format!("harness/bash-tasks/{id}.json"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// Host pids of the processes whose command line holds `marker` and whose
/// parent's does not: the task's shell, without the copies of itself it forks
/// for a moment before each `sleep` is exec'd.
fn pids_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(marker) && pid != std::process::id() {
            // The parent pid is the field after the command's parenthesis.
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            found.push((pid, ppid));
        }
    }
    let pids: Vec<u32> = found.iter().map(|(p, _)| *p).collect();
    found
        .into_iter()
        .filter(|(_, ppid)| !ppid.is_some_and(|pp| pids.contains(&pp)))
        .map(|(p, _)| p)
        .collect()
}

/// The pids `hive up` logged for ruth's daemon, in order of starting.
fn daemon_pids(up: &Up) -> Vec<u32> {
    up.log()
        .lines()
        .filter_map(|l| {
            let rest = l
                .split("started the bash-task daemon of ruth (pid ")
                .nth(1)?;
            rest.split(')').next()?.parse().ok()
        })
        .collect()
}

fn one_daemon(up: &Up) -> u32 {
    wait_for(Duration::from_secs(30), "ruth's bash-task daemon", || {
        daemon_pids(up).last().copied()
    })
}

/// A task that waits for the file `go` in the state dir, then prints `marker`.
fn gated(marker: &str) -> String {
    format!("while [ ! -e go ]; do sleep 0.05; done; echo {marker}-done")
}

#[test]
fn a_task_outlives_restart_update_and_a_crash_and_wakes_the_agent_after() {
    // A crashed harness waits ten minutes before its restart, so the test
    // decides when it comes back (`hive start`).
    let launch = Launch {
        own_binary: true,
        env: vec![
            ("HIVE_UP_RESTART_BASE_MS".into(), "600000".into()),
            ("HIVE_UP_RESTART_MAX_MS".into(), "600000".into()),
        ],
        ..Launch::default()
    };
    let up = Up::launch(FLEET, &["ruth"], launch);
    up.wait_prompt("ruth", KICK, 1);
    let daemon = one_daemon(&up);
    let marker = "SURVIVOR-4f1c";
    let id = start_task(&up, &gated(marker));
    let task_pids = wait_for(Duration::from_secs(10), "the task's process", || {
        let p = pids_with(marker);
        (!p.is_empty()).then_some(p)
    });
    let log = up.data().join("logs/ruth.bash.log");
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(logged.contains(&format!("task {id} started")), "{logged}");
    // The harness started no daemon of its own.
    let harness = std::fs::read_to_string(up.data().join("logs/ruth.log")).unwrap();
    assert!(
        harness.contains("the bash-task daemon runs on its own (HIVE_BASH_DAEMON=external)"),
        "{harness}"
    );
    assert!(!harness.contains("bash task daemon listening"), "{harness}");

    // A restart of the harness leaves the daemon and the task alone.
    let pid = up.wait_running("ruth");
    lifecycle(&up, "restart");
    wait_for(Duration::from_secs(30), "ruth to restart", || {
        let s = up.state("ruth")?;
        (s.state == "running" && s.pid != Some(pid)).then_some(())
    });
    up.wait_prompt("ruth", KICK, 2);
    // An update onto a rebuilt binary too.
    up.rebuild_binary();
    let pid = up.wait_running("ruth");
    lifecycle(&up, "update");
    wait_for(
        Duration::from_secs(30),
        "ruth to run the new binary",
        || {
            let s = up.state("ruth")?;
            (s.state == "running" && s.pid != Some(pid) && s.up_to_date).then_some(())
        },
    );
    up.wait_prompt("ruth", KICK, 3);
    assert_eq!(status(&up, &id).unwrap().task.status, TaskStatus::Running);
    assert_eq!(
        pids_with(marker),
        task_pids,
        "the same task process runs on"
    );
    // Busy, the daemon was not moved onto the new binary.
    wait_for(Duration::from_secs(30), "the daemon to decline", || {
        up.log()
            .contains("the bash-task daemon of ruth keeps its binary and config: 1 task(s) run")
            .then_some(())
    });

    // The harness crashes; the task ends while it is down.
    let pid = up.wait_running("ruth");
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_for(Duration::from_secs(30), "ruth's crash to be seen", || {
        (up.state("ruth")?.state == "restarting").then_some(())
    });
    std::fs::write(state_dir(&up).join("go"), "").unwrap();
    let r = wait_for(Duration::from_secs(30), "the task to end", || {
        let r = status(&up, &id).ok()?;
        r.task.status.is_finished().then_some(r)
    });
    assert_eq!(
        (r.task.status, r.task.exit_code),
        (TaskStatus::Done, Some(0)),
        "{r:?}"
    );
    assert!(
        r.task.stdout_tail.contains(&format!("{marker}-done")),
        "{r:?}"
    );
    // Its wake reached the broker while the harness was still down.
    wait_for(
        Duration::from_secs(30),
        "the wake to reach the broker",
        || (record(&up, &id)["wake_pending"] == false).then_some(()),
    );
    assert_eq!(up.state("ruth").unwrap().state, "restarting");
    assert_eq!(
        up.prompts_with("ruth", &format!("bash task {id} finished")),
        0
    );

    // One daemon all along, through restart, update and crash.
    assert_eq!(daemon_pids(&up), vec![daemon], "{}", up.log());

    lifecycle(&up, "start");
    up.wait_running("ruth");
    up.wait_prompt(
        "ruth",
        &format!("bash task {id} finished: done, exit code 0"),
        1,
    );
    // Idle now, the daemon moves onto the binary the update brought, and
    // answers again.
    let pids = wait_for(Duration::from_secs(30), "the daemon to retire", || {
        let p = daemon_pids(&up);
        (p.len() == 2).then_some(p)
    });
    assert_eq!(pids[0], daemon);
    let log = up.log();
    assert!(
        log.contains("the bash-task daemon of ruth had no task: restarting it")
            || log.contains("the bash-task daemon of ruth retired; starting it anew"),
        "{log}"
    );
    assert!(
        !log.contains("the bash-task daemon of ruth exited"),
        "{log}"
    );
    let r = wait_for(Duration::from_secs(30), "the new daemon", || {
        status(&up, &id).ok()
    });
    assert_eq!(r.task.status, TaskStatus::Done);
    let again = start_task(&up, "sleep 1");
    assert_eq!(status(&up, &again).unwrap().task.id, again);
}

#[test]
fn hive_stop_stops_the_daemon_and_its_tasks_and_start_brings_it_back() {
    let up = Up::start(FLEET, &["ruth"]);
    up.wait_prompt("ruth", KICK, 1);
    let first = one_daemon(&up);
    let marker = "STOPPED-7d2e";
    let id = start_task(&up, &format!("sleep 300; echo {marker}"));
    wait_for(Duration::from_secs(10), "the task's process", || {
        (!pids_with(marker).is_empty()).then_some(())
    });

    lifecycle(&up, "stop");
    wait_for(Duration::from_secs(30), "ruth to stop", || {
        (up.state("ruth")?.state == "stopped").then_some(())
    });
    wait_for(Duration::from_secs(30), "the task to be recorded", || {
        (record(&up, &id)["status"] == "interrupted").then_some(())
    });
    wait_for(
        Duration::from_secs(30),
        "the task's processes to end",
        || pids_with(marker).is_empty().then_some(()),
    );
    wait_for(Duration::from_secs(30), "the daemon to stop", || {
        up.log()
            .contains("the bash-task daemon of ruth stopped")
            .then_some(())
    });
    match bash(&up, &BashRequest::List {}) {
        Err(CallError::NoDaemon(_)) => {}
        other => panic!("the daemon still answers: {other:?}"),
    }
    // Stopped, the agent hears nothing; its wake waits in its queue.
    assert_eq!(up.prompts_with("ruth", &format!("bash task {id}")), 0);

    lifecycle(&up, "start");
    up.wait_running("ruth");
    up.wait_prompt("ruth", &format!("bash task {id} finished: interrupted"), 1);
    let pids = wait_for(Duration::from_secs(30), "a new daemon", || {
        let p = daemon_pids(&up);
        (p.len() == 2).then_some(p)
    });
    assert_eq!(pids[0], first);
    let r = wait_for(Duration::from_secs(30), "the new daemon to answer", || {
        status(&up, &id).ok()
    });
    assert_eq!(r.task.status, TaskStatus::Interrupted);
}

#[test]
fn a_crashed_daemon_is_restarted_and_the_agent_hears_of_its_lost_task() {
    let up = Up::start(FLEET, &["ruth"]);
    up.wait_prompt("ruth", KICK, 1);
    let first = one_daemon(&up);
    let id = start_task(&up, "sleep 300");
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    let second = wait_for(Duration::from_secs(30), "the daemon's restart", || {
        daemon_pids(&up).get(1).copied()
    });
    assert_ne!(second, first);
    assert!(
        up.log()
            .contains("the bash-task daemon of ruth exited (signal: 9"),
        "{}",
        up.log()
    );
    // The new daemon took over the records: the task it could not keep is
    // interrupted and the agent is told.
    let r = wait_for(Duration::from_secs(30), "the new daemon to answer", || {
        status(&up, &id).ok()
    });
    assert_eq!(r.task.status, TaskStatus::Interrupted);
    up.wait_prompt("ruth", &format!("bash task {id} finished: interrupted"), 1);
    // The harness was not touched.
    assert_eq!(up.state("ruth").unwrap().restarts, 0);
}

#[test]
fn hive_serve_refuses_a_bad_placement_naming_it() {
    let dir = common::hive::TempDir::new("placement");
    let state = dir.path().join("state");
    let run = dir.path().join("run");
    let (code, out, err) = run_hive(
        &[
            "serve",
            "--state-dir",
            state.to_str().unwrap(),
            "--run-dir",
            run.to_str().unwrap(),
        ],
        None,
        &[
            ("HIVE_BASH_DAEMON", "beside"),
            ("HIVE_SOCKET", run.join("none.sock").to_str().unwrap()),
        ],
    );
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("HIVE_BASH_DAEMON=\"beside\" is not one of embedded, external"),
        "{err}"
    );
}

const TWO: &str = r#"{"agents": [
  {"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}},
  {"name": "bob", "env": {"FAKE_CLAUDE_DIR": "@FAKE(bob)"}}
]}"#;

/// From inside the harness (claude's turn, in the agent's sandbox when
/// agents are isolated) the daemon's socket is reached, and a task sees the
/// data dir as claude does: only the agent's own dirs when isolated.
#[test]
fn claude_reaches_the_daemon_and_a_task_sees_what_claude_sees() {
    let up = Up::start(TWO, &["ana", "bob"]);
    up.wait_prompt("ana", KICK, 1);
    let isolated = up.log().contains("hive up: agents are isolated");
    eprintln!("agents isolated: {isolated}");
    let agents = up.data().join("agents");
    let fake = up.fake("ana");
    let step = format!(
        r#"ls {agents} > "$dir/claude-view" 2>&1
python3 - > "$dir/task-answer" 2>&1 <<'PY'
import json, os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["HIVE_BASH_SOCKET"])
s.sendall(json.dumps({{"op": "run", "cmd": "ls {agents}", "wait_seconds": 20}}).encode() + b"\n")
line = b""
while not line.endswith(b"\n"):
    chunk = s.recv(65536)
    if not chunk:
        break
    line += chunk
print(line.decode())
PY
ok_turn "done"
"#,
        agents = agents.display()
    );
    std::fs::write(fake.dir.join("default.sh"), step).unwrap();
    let mut host = up.host();
    let _sent = host
        .call(&hyperhive::proto::cmd::Send {
            to: "ana".into(),
            body: "look around".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .unwrap();
    up.wait_prompt("ana", "look around", 1);
    let answer = wait_for(Duration::from_secs(30), "the task's answer", || {
        let a = std::fs::read_to_string(fake.dir.join("task-answer")).ok()?;
        (!a.is_empty()).then_some(a)
    });
    let reply: serde_json::Value =
        serde_json::from_str(answer.trim()).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(reply["ok"], true, "{answer}");
    assert_eq!(reply["task"]["exit_code"], 0, "{answer}");
    let task_view = reply["task"]["stdout_tail"].as_str().unwrap().to_string();
    let claude_view = std::fs::read_to_string(fake.dir.join("claude-view")).unwrap();
    assert_eq!(task_view, claude_view);
    if isolated {
        assert_eq!(claude_view.trim(), "ana", "bob is hidden from ana");
    } else {
        assert!(claude_view.contains("bob"), "{claude_view}");
    }
}
