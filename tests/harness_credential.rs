//! The harness's credential (issue 40, item 1), on a real `hive up` with the
//! fake claude. Isolated, ana's harness and bash-task daemon each get a broker
//! connection of their own from the supervisor: claude's first turn, a child
//! it starts the way it starts an MCP server, and a bash task all try the
//! harness's reports on ana's socket and are refused (the operator is told
//! once, naming ana), none of them holds the credential, and none can take
//! the harness's descriptors; 64 connections held open on ana's socket do not
//! keep a restarted harness from its turn. Without a sandbox
//! (`HIVE_ISOLATION=off`) the harness reports on the socket as before and
//! says so once. On a machine that cannot isolate, the isolated cases skip
//! loudly (they fail under `HIVE_REQUIRE_REAL_CLAUDE=1`, as in CI).

mod common;

use common::hive::wait_for;
use common::up::{Launch, Up};
use hyperhive::bash::client::call;
use hyperhive::bash::proto::{Request as BashRequest, TaskReply};
use hyperhive::proto::cmd::{Agents, AgentsReply, GetLooseEnds, LooseEndsReply, Send};
use serde_json::Value;
use std::path::Path;
use std::time::Duration;

const FLEET: &str = r#"{"agents": [
  {"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}
]}"#;

/// What a process of the agent tries (`probe.py SOCKET OUT [PID]`): the
/// harness's three reports a forger would want on the agent's socket, its own
/// descriptors, and with PID (the harness, or the bash daemon) that
/// process's descriptors, through `/proc/PID/fd` and by `pidfd_getfd`. The
/// answers go to OUT as JSON.
const PROBE: &str = r#"
import ctypes, json, os, socket, sys, time
sock_path, out = sys.argv[1], sys.argv[2]
res = {}
lines = [
    {"cmd": "report_usage_limit", "until": int(time.time()) + 3600, "detail": "forged"},
    {"cmd": "report_spend", "key": "forged-%d" % os.getpid(), "usd": 1000000.0, "tokens": 1},
    {"cmd": "post_turn_counts", "turns": 1, "tokens_in": 999},
]
s = socket.socket(socket.AF_UNIX)
s.connect(sock_path)
f = s.makefile("rwb")
for l in lines:
    f.write((json.dumps(l) + "\n").encode())
    f.flush()
    res[l["cmd"]] = json.loads(f.readline())
fds = {}
for fd in os.listdir("/proc/self/fd"):
    try:
        fds[fd] = os.readlink("/proc/self/fd/" + fd)
    except OSError as e:
        fds[fd] = str(e)
res["fds"] = fds
if len(sys.argv) > 3:
    pid = int(sys.argv[3])
    # A root hive's agents may list the numbers (the directory is root's);
    # what matters is whether a descriptor can be read or taken.
    try:
        names = os.listdir("/proc/%d/fd" % pid)
    except OSError as e:
        names = []
        res["their_fds"] = "refused: %s" % e
    read = []
    for n in names:
        try:
            read.append(os.readlink("/proc/%d/fd/%s" % (pid, n)))
        except OSError:
            pass
    if names:
        res["their_fds"] = "read %s" % read if read else "refused: none of %d readable" % len(names)
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = libc.syscall(434, pid, 0)
    if pidfd < 0:
        res["pidfd"] = "refused: pidfd_open errno %d" % ctypes.get_errno()
    else:
        took = [n for n in range(3, 64) if libc.syscall(438, pidfd, n, 0) >= 0]
        res["pidfd"] = "took %s" % took if took else "refused: pidfd_getfd errno %d" % ctypes.get_errno()
json.dump(res, open(out, "w"))
"#;

/// Claude's first turn (the kick's): the probe from claude itself and from a
/// child it starts as it starts an MCP server (a process of its own, with its
/// environment and descriptors), both aimed at the harness (claude's parent).
fn kick_step() -> String {
    format!(
        r#"cat > "$dir/probe.py" <<'PY'
{PROBE}
PY
ls -l /proc/$$/fd > "$dir/claude.fd" 2>&1
python3 "$dir/probe.py" "$HIVE_SOCKET" "$dir/claude.json" "$PPID"
( exec python3 "$dir/probe.py" "$HIVE_SOCKET" "$dir/mcp.json" "$PPID" ) &
wait $!
ok_turn "probed"
"#
    )
}

/// Whether `hive up` isolates its agents; where this kernel refuses every
/// sandbox the test skips loudly (and fails under `HIVE_REQUIRE_REAL_CLAUDE=1`).
fn isolated(up: &Up) -> bool {
    let log = up.log();
    if log.contains("hive up: agents are isolated (") {
        return true;
    }
    let refused = "hive up: agents are NOT isolated (the kernel refused a sandbox";
    match log.lines().find(|l| l.starts_with(refused)) {
        Some(why) if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() != Ok("1") => {
            eprintln!("SKIPPED: this machine cannot isolate agents: {why}");
            false
        }
        _ => panic!("hive up did not say whether it isolates: {log}"),
    }
}

/// The pid (in this namespace) of the process of `agent` whose command line
/// has `sub` (`serve`, `bash-daemon`), not its sandbox's.
fn process_of(up: &Up, agent: &str, sub: &str) -> u32 {
    let state = up.data().join("agents").join(agent).join("state");
    let state = state.display().to_string();
    wait_for(Duration::from_secs(20), &format!("{agent}'s {sub}"), || {
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args: Vec<String> = cmd
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            let mine = args.iter().any(|a| a == sub)
                && args.contains(&state)
                && !args.iter().any(|a| a == "__sandbox");
            mine.then_some(pid)
        })
    })
}

/// The credential `pid` holds: its descriptor's target (`socket:[INODE]`),
/// after checking that it is closed on exec. The process is non-dumpable, so
/// only root reads its `/proc` entries: for a test run as another user this
/// is None, and the checks that need it are skipped, loudly.
fn credential_of(pid: u32) -> Option<String> {
    let env = match std::fs::read(format!("/proc/{pid}/environ")) {
        Ok(env) => env,
        // SAFETY: geteuid has no arguments.
        Err(e) if unsafe { libc::geteuid() } != 0 => {
            eprintln!("SKIPPED: the credential of {pid} is root's to read ({e})");
            return None;
        }
        Err(e) => panic!("cannot read the environment of {pid}: {e}"),
    };
    let fd: u32 = env
        .split(|b| *b == 0)
        .find_map(|v| {
            std::str::from_utf8(v)
                .ok()?
                .strip_prefix("HIVE_UP_BROKER_FD=")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("process {pid} was handed no credential"));
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).unwrap();
    let flags = info
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
        .unwrap();
    assert_ne!(
        flags & libc::O_CLOEXEC as u32,
        0,
        "process {pid}'s credential is closed on exec: {info}"
    );
    let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap();
    let target = target.display().to_string();
    assert!(target.starts_with("socket:["), "{target}");
    Some(target)
}

fn probe(path: &Path) -> Value {
    let text = wait_for(
        Duration::from_secs(30),
        &format!("{}", path.display()),
        || {
            std::fs::read_to_string(path)
                .ok()
                .filter(|t| t.ends_with('}'))
        },
    );
    serde_json::from_str(&text).unwrap()
}

/// A probe's three reports were refused as the harness's own, it holds none
/// of `credentials`, and it could not take the descriptors of `pid`.
fn refused_everything(p: &Value, who: &str, credentials: &[String]) {
    for cmd in ["report_usage_limit", "report_spend", "post_turn_counts"] {
        let a = &p[cmd];
        assert_eq!(a["ok"], false, "{who}: {cmd} was taken: {a}");
        let e = a["error"].as_str().unwrap_or_default();
        assert!(
            e.contains(&format!("{cmd} is the harness's own report")),
            "{who}: {cmd}: {e}"
        );
    }
    let fds = p["fds"].to_string();
    for c in credentials {
        assert!(!fds.contains(c), "{who} holds the credential {c}: {fds}");
    }
    let theirs = p["their_fds"].as_str().unwrap_or_default();
    assert!(theirs.starts_with("refused"), "{who}: {theirs}");
    let pidfd = p["pidfd"].as_str().unwrap_or_default();
    assert!(pidfd.starts_with("refused"), "{who}: {pidfd}");
}

fn operator_messages(up: &Up) -> Vec<hyperhive::proto::Message> {
    common::hive::peek_inbox(&mut up.host())
}

fn row(up: &Up, name: &str) -> hyperhive::proto::AgentRow {
    let r: AgentsReply = up.host().call(&Agents {}).unwrap();
    r.agents.into_iter().find(|a| a.name == name).unwrap()
}

#[test]
fn claudes_processes_cannot_report_as_the_harness_nor_take_its_credential() {
    let up = Up::launch(
        FLEET,
        &["ana"],
        Launch {
            steps: vec![("ana".into(), 1, kick_step())],
            ..Launch::default()
        },
    );
    if !isolated(&up) {
        return;
    }
    let fake = up.fake("ana").dir;
    let harness = credential_of(process_of(&up, "ana", "serve"));
    let daemon = credential_of(process_of(&up, "ana", "bash-daemon"));
    if harness.is_some() {
        assert_ne!(harness, daemon, "each has a credential of its own");
    }
    let credentials: Vec<String> = harness.into_iter().chain(daemon).collect();

    // Claude, and a child it started as it starts an MCP server.
    let claude = probe(&fake.join("claude.json"));
    refused_everything(&claude, "claude", &credentials);
    let mcp = probe(&fake.join("mcp.json"));
    refused_everything(&mcp, "claude's MCP server", &credentials);
    let claude_fds = std::fs::read_to_string(fake.join("claude.fd")).unwrap();
    assert!(
        !credentials.iter().any(|c| claude_fds.contains(c.as_str())),
        "claude holds a credential: {claude_fds}"
    );

    // A bash task, aimed at its daemon.
    let socket = up.data().join("run/agents/ana/mcp.sock");
    let t = up.bash_task(
        "ana",
        &format!(
            "d=$(for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^[^ ]* bash-daemon' && basename $p; done | head -1); \
             python3 {fake}/probe.py {socket} {fake}/task.json $d",
            fake = fake.display(),
            socket = socket.display()
        ),
    );
    assert_eq!(t.exit_code, Some(0), "{t:?}");
    let task = probe(&fake.join("task.json"));
    refused_everything(&task, "a bash task", &credentials);

    // The harness's own reports went through its credential: the kick's
    // turn was counted, and nothing the forgers sent was.
    wait_for(Duration::from_secs(30), "ana's turn counted", || {
        let r = row(&up, "ana");
        (r.turns >= 1 && r.unread == 0 && r.inflight.is_none()).then_some(())
    });
    let r = row(&up, "ana");
    assert!(r.paused.is_none(), "no forged usage limit: {:?}", r.paused);
    // Each of the fake's turns counts 2400 input tokens; a forged 999 is not
    // among them.
    assert_eq!(r.tokens_in, 2400 * r.turns, "no forged counts: {r:?}");
    // The bash-task daemon's own report went through its credential: a task
    // left running in the background is listed among ana's loose ends.
    let sock = up.data().join("agents/ana/run/bash.sock");
    let _: TaskReply = call(
        &sock,
        &BashRequest::Run {
            cmd: "sleep 30".into(),
            timeout_secs: Some(60),
            wait_seconds: Some(0),
        },
        &crossbeam_channel::never(),
    )
    .unwrap();
    wait_for(
        Duration::from_secs(20),
        "the task among the loose ends",
        || {
            let r: LooseEndsReply = up.agent("ana").call(&GetLooseEnds { agent: None }).ok()?;
            r.tasks.iter().any(|t| t.cmd == "sleep 30").then_some(())
        },
    );
    // The operator heard of the forgers once, naming ana, and never of the
    // bash-task daemon.
    let messages = operator_messages(&up);
    assert!(
        !messages
            .iter()
            .any(|m| m.body.contains("ana's bash-task daemon sent")),
        "{messages:?}"
    );
    let told: Vec<_> = messages
        .into_iter()
        .filter(|m| m.body.contains("ana's harness sent"))
        .collect();
    assert_eq!(told.len(), 1, "{told:?}");
    assert!(
        told[0].body.contains("old harness") && told[0].body.contains("hive restart ana"),
        "{}",
        told[0].body
    );
    // And the next message still makes a turn.
    up.host()
        .call(&Send {
            to: "ana".into(),
            body: "after-the-forgers".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .unwrap();
    up.wait_prompt("ana", "after-the-forgers", 1);
}

#[test]
fn sixty_four_connections_on_the_agent_socket_do_not_stop_a_turn() {
    let up = Up::start(FLEET, &["ana"]);
    if !isolated(&up) {
        return;
    }
    // Every connection ana's socket takes, held open.
    let path = up.data().join("run/agents/ana/mcp.sock");
    let mut held = Vec::new();
    let refused = loop {
        let mut c = hyperhive::proto::Client::connect(&path).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        match c.call_line(r#"{"cmd":"hello"}"#) {
            Ok(line) if line.contains("\"ok\":true") => held.push(c),
            Ok(line) => break line,
            Err(e) => break e.to_string(),
        }
        assert!(held.len() <= 64, "the socket took more than 64");
    };
    assert!(refused.contains("too many connections"), "{refused}");
    assert_eq!(held.len(), 64);
    // A harness that starts now has no connection yet: its kick, its
    // long-poll and its reports all go through its credential.
    let pid = up.wait_running("ana");
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_for(Duration::from_secs(30), "ana to come back", || {
        let s = up.state("ana")?;
        (s.state == "running" && s.pid != Some(pid)).then_some(())
    });
    up.wait_running("ana");
    up.host()
        .call(&Send {
            to: "ana".into(),
            body: "through-the-flood".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .unwrap();
    up.wait_prompt("ana", "through-the-flood", 1);
    wait_for(Duration::from_secs(30), "the turn acked", || {
        let r = row(&up, "ana");
        (r.unread == 0 && r.inflight.is_none()).then_some(())
    });
    // The held connections are still the agent's, and still answered.
    let hello = held[63].call_line(r#"{"cmd":"hello"}"#).unwrap();
    assert!(hello.contains("\"ok\":true"), "{hello}");
}

#[test]
fn without_a_sandbox_the_harness_reports_on_its_socket_and_says_so_once() {
    let up = Up::launch(
        FLEET,
        &["ana"],
        Launch {
            env: vec![("HIVE_ISOLATION".into(), "off".into())],
            ..Launch::default()
        },
    );
    up.host()
        .call(&Send {
            to: "ana".into(),
            body: "plain-turn".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .unwrap();
    up.wait_prompt("ana", "plain-turn", 1);
    // Nothing separates the harness from claude here: its reports are taken
    // on the socket, from any process of the agent.
    let socket = up.data().join("run/agents/ana/mcp.sock");
    let t = up.bash_task(
        "ana",
        &format!(
            r#"python3 -c 'import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"{{\"cmd\":\"post_turn_counts\",\"turns\":0,\"tokens_in\":7}}\n")
print(s.recv(4096).decode())' {}"#,
            socket.display()
        ),
    );
    assert!(t.stdout_tail.contains("\"ok\":true"), "{t:?}");
    let log = std::fs::read_to_string(up.data().join("logs/ana.log")).unwrap();
    assert_eq!(
        log.matches("no broker credential (HIVE_UP_BROKER_FD)")
            .count(),
        1,
        "{log}"
    );
    assert!(
        !operator_messages(&up)
            .iter()
            .any(|m| m.body.contains("ana's harness sent")),
        "no notice where nothing was refused"
    );
}
