//! Background bash tasks end to end: a real `hive broker`, a real `hive
//! bash-daemon` and `hive bash-mcp` spoken to over stdio, as claude would. Wakes
//! are read from the agent's inbox with `recv_next`. Every wait has a timeout.

mod common;

use common::hive::{hive_bin, wait_for, Broker, TempDir};
use crossbeam_channel::Receiver;
use hyperhive::proto::cmd::{AckTurn, RecvNext};
use hyperhive::proto::{Client, Message};
use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

/// A `hive bash-daemon` on a temp state dir, sending wakes to `agent_socket`.
struct Daemon {
    dir: TempDir,
    agent_socket: PathBuf,
    bash_env: PathBuf,
    child: Option<Child>,
}

impl Daemon {
    fn start(agent_socket: &Path) -> Daemon {
        let dir = TempDir::new("bd");
        let bash_env = dir.path().join("no-bash-env.sh");
        Daemon::start_in(dir, agent_socket, bash_env)
    }

    fn start_in(dir: TempDir, agent_socket: &Path, bash_env: PathBuf) -> Daemon {
        let mut d = Daemon {
            dir,
            agent_socket: agent_socket.to_path_buf(),
            bash_env,
            child: None,
        };
        d.spawn();
        d
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("bash.sock")
    }

    fn state(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    fn tasks_dir(&self) -> PathBuf {
        self.state().join("harness").join("bash-tasks")
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("daemon.log"))
            .unwrap();
        let child = Command::new(hive_bin())
            .arg("bash-daemon")
            .arg("--state-dir")
            .arg(self.state())
            .arg("--socket")
            .arg(self.socket())
            .arg("--agent-socket")
            .arg(&self.agent_socket)
            .arg("--bash-env")
            .arg(&self.bash_env)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn hive bash-daemon");
        self.child = Some(child);
        let socket = self.socket();
        wait_for(Duration::from_secs(10), "the bash daemon socket", || {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("bash-daemon exited early with {st}: {}", self.log());
            }
            std::os::unix::net::UnixStream::connect(&socket).ok()
        });
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("daemon.log")).unwrap_or_default()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        wait_for(Duration::from_secs(10), "the bash daemon to exit", || {
            c.try_wait().ok().flatten()
        })
    }

    /// The persisted record of task `id`.
    fn record(&self, id: &str) -> Value {
        let text = std::fs::read_to_string(self.tasks_dir().join(format!("{id}.json"))).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn pgid(&self, id: &str) -> i32 {
        self.record(id)["pgid"].as_i64().expect("a pgid") as i32
    }

    fn mcp(&self) -> Mcp {
        Mcp::start(&self.socket())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A `hive bash-mcp` spoken to over its stdin and stdout.
struct Mcp {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<Value>,
    /// Responses read while waiting for another id.
    early: HashMap<i64, Value>,
    next_id: i64,
}

impl Mcp {
    fn start(socket: &Path) -> Mcp {
        let mut child = Command::new(hive_bin())
            .arg("bash-mcp")
            .env("HIVE_BASH_SOCKET", socket)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn hive bash-mcp");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = crossbeam_channel::unbounded();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let v: Value = serde_json::from_str(&line).expect("stdout is JSON-RPC only");
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        let mut m = Mcp {
            child,
            stdin,
            lines,
            early: HashMap::new(),
            next_id: 1,
        };
        m.write(json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"test","version":"0"}}}));
        let init = m.response(0);
        assert_eq!(init["result"]["serverInfo"]["name"], "bash");
        m.write(json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        m
    }

    fn write(&mut self, msg: Value) {
        writeln!(self.stdin, "{msg}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Sends a `tools/call` without waiting; returns its id.
    fn send(&mut self, tool: &str, args: Value) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        self.write(json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":args}}));
        id
    }

    /// The whole JSON-RPC response to request `id`.
    fn response(&mut self, id: i64) -> Value {
        if let Some(v) = self.early.remove(&id) {
            return v;
        }
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self
                .lines
                .recv_deadline(end)
                .unwrap_or_else(|_| panic!("no answer to request {id} within 60s"));
            match v["id"].as_i64() {
                Some(got) if got == id => return v,
                Some(got) => {
                    self.early.insert(got, v);
                }
                None => {}
            }
        }
    }

    /// Calls a tool; returns (text, is_error).
    fn call(&mut self, tool: &str, args: Value) -> (String, bool) {
        let id = self.send(tool, args);
        let v = self.response(id);
        text_of(&v)
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn text_of(v: &Value) -> (String, bool) {
    let result = v
        .get("result")
        .unwrap_or_else(|| panic!("not a tool result: {v}"));
    let text = result["content"][0]["text"].as_str().unwrap().to_string();
    (text, result["isError"] == json!(true))
}

/// The id in `task started: id=<id>`.
fn started_id(text: &str) -> String {
    let first = text.lines().next().unwrap_or_default();
    first
        .strip_prefix("task started: id=")
        .unwrap_or_else(|| panic!("not a started answer: {text}"))
        .to_string()
}

/// The next message in the agent's inbox within `secs`, acknowledged.
fn next_wake(agent: &mut Client, secs: u64) -> Option<Message> {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let left = end.saturating_duration_since(Instant::now()).as_secs();
        let r: hyperhive::proto::cmd::RecvNextReply = agent
            .call(&RecvNext {
                wait_seconds: Some(left.max(1)),
                seen: None,
            })
            .expect("recv_next");
        if let Some(m) = r.message {
            agent
                .call(&AckTurn {
                    id: m.id,
                    turn: None,
                })
                .expect("ack_turn");
            return Some(m);
        }
        if Instant::now() >= end {
            return None;
        }
    }
}

fn group_gone(pgid: i32) -> bool {
    let rc = unsafe { libc::kill(-pgid, 0) };
    rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

#[test]
fn a_fast_task_answers_inline_and_fires_no_wake() {
    let broker = Broker::start(&["ana"]);
    let daemon = Daemon::start(&broker.agent_socket("ana"));
    let mut mcp = daemon.mcp();
    let (text, err) = mcp.call("run", json!({"cmd": "echo hello; echo oops >&2; exit 3"}));
    assert!(!err, "{text}");
    assert!(text.starts_with("task 1: done, exit code 3"), "{text}");
    assert!(text.contains("hello") && text.contains("oops"), "{text}");
    let mut agent = broker.agent("ana");
    assert_eq!(
        next_wake(&mut agent, 2),
        None,
        "an inline result must not wake"
    );
    // The socket is private to its owner.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(daemon.socket())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// `hive bash-mcp` answers claude's start-up on its main thread alone; the
/// first call starts the signal, reader and writer threads.
#[test]
fn bash_mcp_answers_its_start_up_on_one_thread() {
    let threads = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let mut mcp = Mcp::start(Path::new("/nonexistent/bash.sock"));
    mcp.write(json!({"jsonrpc":"2.0","id":100,"method":"tools/list"}));
    let list = mcp.response(100);
    let tools = list["result"]["tools"].as_array().expect("a tool list");
    assert_eq!(tools.len(), 2, "{list}");
    assert_eq!(
        threads(mcp.child.id()),
        1,
        "only the main thread before any call"
    );
    let (text, err) = mcp.call("status", json!({"id": "1"}));
    assert!(err, "{text}");
    assert!(
        threads(mcp.child.id()) >= 4,
        "signals, reader and writer after the first call"
    );
}

#[test]
fn a_slow_task_returns_an_id_then_wakes_the_agent() {
    let broker = Broker::start(&["ana"]);
    let daemon = Daemon::start(&broker.agent_socket("ana"));
    let mut mcp = daemon.mcp();
    let (text, err) = mcp.call(
        "run",
        json!({"cmd": "sleep 1; echo finished-ok", "wait_seconds": 0}),
    );
    assert!(!err, "{text}");
    let id = started_id(&text);
    let (text, _) = mcp.call("status", json!({"id": id}));
    assert!(text.contains(": running for"), "{text}");
    // The CLI SIGINTs its MCP servers at the end of every turn; the task lives on.
    unsafe { libc::kill(mcp.child.id() as i32, libc::SIGINT) };
    let status = wait_for(Duration::from_secs(5), "bash-mcp to exit", || {
        mcp.child.try_wait().ok().flatten()
    });
    assert_eq!(status.code(), Some(130));
    let mut mcp = daemon.mcp();
    let mut agent = broker.agent("ana");
    let wake = next_wake(&mut agent, 20).expect("a completion wake");
    assert_eq!(wake.from, format!("bash-task-{id}"));
    // Durable, so a broker restart or a harness killed mid-turn cannot lose it.
    assert!(!wake.transient && wake.id > 0, "{wake:?}");
    assert!(wake.body.contains("done, exit code 0"), "{}", wake.body);
    assert!(wake.body.contains("finished-ok"), "{}", wake.body);
    let (text, _) = mcp.call("status", json!({"id": id.parse::<u64>().unwrap()}));
    assert!(text.contains("done, exit code 0"), "{text}");
    // The record says the wake got through, so no later daemon sends it again.
    wait_for(Duration::from_secs(5), "wake_pending cleared", || {
        (daemon.record(&id)["wake_pending"] == json!(false)).then_some(())
    });
}

#[test]
fn status_waits_inline_and_the_bash_env_file_applies() {
    let broker = Broker::start(&["ana"]);
    let dir = TempDir::new("bd");
    let env_file = dir.path().join("bash-env.sh");
    std::fs::write(&env_file, "greet() { echo \"hi from $0 env\"; }\n").unwrap();
    let daemon = Daemon::start_in(dir, &broker.agent_socket("ana"), env_file);
    let mut mcp = daemon.mcp();
    let (text, _) = mcp.call(
        "run",
        json!({"cmd": "sleep 1; greet; pwd", "wait_seconds": 0}),
    );
    let id = started_id(&text);
    let (text, err) = mcp.call("status", json!({"id": id, "wait_seconds": 20}));
    assert!(!err, "{text}");
    assert!(text.contains("done, exit code 0"), "{text}");
    assert!(text.contains("hi from bash env"), "{text}");
    let state = std::fs::canonicalize(daemon.state()).unwrap();
    assert!(text.contains(&state.display().to_string()), "{text}");
}

#[test]
fn a_timeout_kills_the_task_and_everything_it_started() {
    let broker = Broker::start(&["ana"]);
    let daemon = Daemon::start(&broker.agent_socket("ana"));
    let mut mcp = daemon.mcp();
    let cmd = "sleep 300 & echo $!; sh -c 'sleep 300' & echo $!; wait";
    let (text, _) = mcp.call(
        "run",
        json!({"cmd": cmd, "timeout_secs": 1, "wait_seconds": 0}),
    );
    let id = started_id(&text);
    let pgid = daemon.pgid(&id);
    let mut agent = broker.agent("ana");
    let wake = next_wake(&mut agent, 20).expect("a wake after the timeout");
    assert_eq!(wake.from, format!("bash-task-{id}"));
    assert!(wake.body.contains("timed_out"), "{}", wake.body);
    let (text, _) = mcp.call("status", json!({"id": id}));
    assert!(text.contains("timed_out"), "{text}");
    wait_for(
        Duration::from_secs(5),
        "the process group to be gone",
        || group_gone(pgid).then_some(()),
    );
    let out = std::fs::read_to_string(daemon.tasks_dir().join(format!("{id}.out"))).unwrap();
    let pids: Vec<i32> = out.lines().map(|l| l.trim().parse().unwrap()).collect();
    assert_eq!(pids.len(), 2, "{out}");
    for pid in pids {
        wait_for(Duration::from_secs(5), "a grandchild to be gone", || {
            let rc = unsafe { libc::kill(pid, 0) };
            (rc != 0).then_some(())
        });
    }
}

#[test]
fn big_output_is_tailed_in_status_and_whole_in_the_file() {
    let broker = Broker::start(&["ana"]);
    let daemon = Daemon::start(&broker.agent_socket("ana"));
    let mut mcp = daemon.mcp();
    let (text, err) = mcp.call("run", json!({"cmd": "seq 1 5000", "wait_seconds": 20}));
    assert!(!err, "{text}");
    let expected: String = (1..=5000).map(|n| format!("{n}\n")).collect();
    let header = format!(
        "stdout (last 4096 of {} bytes; all of it in ",
        expected.len()
    );
    assert!(text.contains(&header), "{text}");
    assert!(text.contains("4999\n5000\nstderr: empty"), "{text}");
    assert!(!text.contains("\n1000\n"), "the head must not be shown");
    let file = std::fs::read_to_string(daemon.tasks_dir().join("1.out")).unwrap();
    assert_eq!(file, expected);
}

#[test]
fn a_daemon_restart_mid_task_marks_it_interrupted_and_wakes() {
    let broker = Broker::start(&["ana"]);
    let mut daemon = Daemon::start(&broker.agent_socket("ana"));
    let mut mcp = daemon.mcp();
    let (text, _) = mcp.call("run", json!({"cmd": "sleep 300", "wait_seconds": 0}));
    let id = started_id(&text);
    let pgid = daemon.pgid(&id);
    daemon.kill9();
    assert!(!group_gone(pgid), "the task outlives a crashed daemon");
    daemon.spawn();
    let mut agent = broker.agent("ana");
    let wake = next_wake(&mut agent, 20).expect("a wake for the interrupted task");
    assert_eq!(wake.from, format!("bash-task-{id}"));
    assert!(wake.body.contains("interrupted"), "{}", wake.body);
    let mut mcp = daemon.mcp();
    let (text, _) = mcp.call("status", json!({"id": id}));
    assert!(text.contains(&format!("task {id}: interrupted")), "{text}");
    wait_for(
        Duration::from_secs(5),
        "the old process group to be gone",
        || group_gone(pgid).then_some(()),
    );
    // A new task gets a new id.
    let (text, _) = mcp.call("run", json!({"cmd": "true"}));
    assert!(text.starts_with("task 2: done"), "{text}");
}

#[test]
fn sigterm_kills_running_tasks_and_records_them_interrupted() {
    let broker = Broker::start(&["ana"]);
    let mut daemon = Daemon::start(&broker.agent_socket("ana"));
    let mut mcp = daemon.mcp();
    let (text, _) = mcp.call("run", json!({"cmd": "sleep 300", "wait_seconds": 0}));
    let id = started_id(&text);
    let pgid = daemon.pgid(&id);
    let mut agent = broker.agent("ana");
    assert!(daemon.terminate().success(), "{}", daemon.log());
    wait_for(
        Duration::from_secs(5),
        "the process group to be gone",
        || group_gone(pgid).then_some(()),
    );
    assert_eq!(daemon.record(&id)["status"], "interrupted");
    assert!(!daemon.socket().exists(), "the socket is removed");
    let wake = next_wake(&mut agent, 20).expect("a wake for the interrupted task");
    assert!(wake.body.contains("interrupted"), "{}", wake.body);
}

#[test]
fn missing_or_bad_ids_and_a_missing_daemon_get_clear_errors() {
    let broker = Broker::start(&["ana"]);
    let daemon = Daemon::start(&broker.agent_socket("ana"));
    let mut mcp = daemon.mcp();
    // Wrong arguments are a result the model reads (isError), not a
    // JSON-RPC error.
    let (msg, err) = mcp.call("status", json!({}));
    assert!(err, "{msg}");
    assert!(msg.contains("missing required argument \"id\""), "{msg}");
    for bad in [json!("nope"), json!("999"), json!(42)] {
        let (text, err) = mcp.call("status", json!({ "id": bad }));
        assert!(err, "{text}");
        assert!(text.starts_with("no task with id"), "{text}");
    }
    let (msg, err) = mcp.call("run", json!({"cmd": "true", "wait_secs": 1}));
    assert!(err, "{msg}");
    assert!(msg.contains("unknown argument \"wait_secs\""), "{msg}");
    let dir = TempDir::new("bm");
    let mut lonely = Mcp::start(&dir.path().join("nobody.sock"));
    let (text, err) = lonely.call("run", json!({"cmd": "true"}));
    assert!(err, "{text}");
    assert!(
        text.starts_with("the bash task daemon is not running"),
        "{text}"
    );
}

#[test]
fn twenty_concurrent_tasks_all_complete_and_all_wake() {
    let broker = Broker::start(&["ana"]);
    let daemon = Daemon::start(&broker.agent_socket("ana"));
    let mut mcp = daemon.mcp();
    let calls: Vec<i64> = (0..20)
        .map(|i| {
            mcp.send(
                "run",
                json!({"cmd": format!("sleep 1; echo task-{i}"), "wait_seconds": 0}),
            )
        })
        .collect();
    let ids: HashSet<String> = calls
        .into_iter()
        .map(|c| started_id(&text_of(&mcp.response(c)).0))
        .collect();
    assert_eq!(ids.len(), 20);
    let mut agent = broker.agent("ana");
    let mut woken = HashSet::new();
    while woken.len() < 20 {
        let Some(wake) = next_wake(&mut agent, 30) else {
            panic!("only {} of 20 wakes arrived: {woken:?}", woken.len());
        };
        assert!(wake.body.contains("done, exit code 0"), "{}", wake.body);
        woken.insert(
            wake.from
                .as_str()
                .trim_start_matches("bash-task-")
                .to_string(),
        );
    }
    assert_eq!(woken, ids);
    assert_eq!(next_wake(&mut agent, 1), None, "one wake per task");
}

#[test]
fn a_wake_missed_while_the_broker_is_down_arrives_when_it_is_back() {
    let mut broker = Broker::start(&["ana"]);
    let daemon = Daemon::start(&broker.agent_socket("ana"));
    let mut mcp = daemon.mcp();
    let (text, _) = mcp.call(
        "run",
        json!({"cmd": "sleep 1; echo while-you-were-out", "wait_seconds": 0}),
    );
    let id = started_id(&text);
    broker.kill9();
    let (text, _) = mcp.call("status", json!({"id": id, "wait_seconds": 20}));
    assert!(text.contains("done, exit code 0"), "{text}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(daemon.record(&id)["wake_pending"], json!(true));
    broker.restart();
    let mut agent = broker.agent("ana");
    let wake = next_wake(&mut agent, 30).expect("the wake once the broker is back");
    assert_eq!(wake.from, format!("bash-task-{id}"));
    assert!(wake.body.contains("while-you-were-out"), "{}", wake.body);
}

/// `retire` (what `hive up` asks after an update): a daemon with a running task
/// declines and keeps it; an idle one exits by itself, cleanly, its socket
/// gone, and a daemon started again finds every record.
#[test]
fn retire_is_declined_while_a_task_runs_and_ends_an_idle_daemon() {
    use hyperhive::bash::client::call;
    use hyperhive::bash::proto::{Request, RetireReply};
    let broker = Broker::start(&["ana"]);
    let mut daemon = Daemon::start(&broker.agent_socket("ana"));
    let mut mcp = daemon.mcp();
    let gate = daemon.state().join("go");
    let (text, _) = mcp.call(
        "run",
        json!({"cmd": format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display()), "wait_seconds": 0}),
    );
    let id = started_id(&text);
    let never = crossbeam_channel::never();
    let r: RetireReply = call(&daemon.socket(), &Request::Retire {}, &never).unwrap();
    assert_eq!(
        r,
        RetireReply {
            retired: false,
            running: 1
        }
    );
    assert_eq!(daemon.record(&id)["status"], "running");
    std::fs::write(&gate, "").unwrap();
    wait_for(Duration::from_secs(20), "the task to end", || {
        (daemon.record(&id)["status"] == "done").then_some(())
    });
    let r: RetireReply = call(&daemon.socket(), &Request::Retire {}, &never).unwrap();
    assert_eq!(
        r,
        RetireReply {
            retired: true,
            running: 0
        }
    );
    let mut child = daemon.child.take().unwrap();
    let status = wait_for(Duration::from_secs(20), "the daemon to exit", || {
        child.try_wait().ok().flatten()
    });
    assert!(status.success(), "{status}: {}", daemon.log());
    assert!(!daemon.socket().exists(), "the socket is removed");
    assert!(daemon.log().contains("retired"), "{}", daemon.log());
    daemon.spawn();
    let (text, _) = mcp_status(&daemon, &id);
    assert!(text.contains(&format!("task {id}: done")), "{text}");
}

fn mcp_status(daemon: &Daemon, id: &str) -> (String, bool) {
    daemon.mcp().call("status", json!({"id": id}))
}
