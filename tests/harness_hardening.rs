//! Hardening of `hive serve` and its bash-task daemon, against real processes:
//! a real broker (or a small fake broker socket that answers garbage), a real
//! harness and the scripted fake claude. A harness out of file descriptors keeps
//! its message and its bash socket; a poller fed unreadable answers backs off;
//! no process started for the agent sees an operator variable; the harness's own
//! files are private while claude's and the bash tasks' keep the umask; absurd
//! turn counters are never posted. Each test asserts what the broker holds
//! afterwards and what claude and the tasks were started with.

mod common;

use common::hive::*;
use crossbeam_channel::never;
use hyperhive::bash::client::call as bash_call;
use hyperhive::bash::proto::{Request as BashRequest, TaskReply, TaskStatus};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A NUL-separated environment dump (`env -0`) as a map.
fn env_file(path: &Path) -> HashMap<String, String> {
    let raw = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    raw.split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .filter_map(|s| {
            let s = String::from_utf8_lossy(s);
            let (k, v) = s.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The umask of a process, from /proc/PID/status.
fn umask_of(pid: u32) -> u32 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let v = s
        .lines()
        .find_map(|l| l.strip_prefix("Umask:"))
        .expect("Umask in /proc/PID/status");
    u32::from_str_radix(v.trim(), 8).unwrap()
}

fn fds(pid: u32) -> Vec<u64> {
    let mut used: Vec<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    used.sort_unstable();
    used
}

/// The `n` lowest descriptor numbers the process does not show as used, once
/// its descriptors have stopped changing (connections just closed by a client
/// are closed by the server a moment later). A thread blocked in `accept`
/// holds a reserved number that /proc does not show, so some of these may be
/// taken.
fn free_fds(pid: u32, n: usize) -> Vec<u64> {
    let mut last = fds(pid);
    let mut same = 0;
    while same < 3 {
        std::thread::sleep(Duration::from_millis(100));
        let now = fds(pid);
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    (0..).filter(|n| !last.contains(n)).take(n).collect()
}

/// Sets the soft RLIMIT_NOFILE of another process; returns the old soft limit.
fn set_soft_nofile(pid: u32, soft: u64) -> u64 {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit with a null new limit only reads into `old`.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            std::ptr::null(),
            &mut old,
        )
    };
    assert_eq!(rc, 0, "prlimit read: {}", std::io::Error::last_os_error());
    let new = libc::rlimit {
        rlim_cur: soft,
        rlim_max: old.rlim_max,
    };
    // SAFETY: `new` is a valid rlimit; the old value is not asked for.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &new,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit set: {}", std::io::Error::last_os_error());
    old.rlim_cur
}

/// One raw connection to the bash task daemon, for requests on a connection
/// opened earlier.
struct RawBash {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl RawBash {
    fn connect(socket: &Path) -> RawBash {
        let s = UnixStream::connect(socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        RawBash {
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    fn call(&mut self, req: Value) -> Value {
        writeln!(self.writer, "{req}").unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }
}

fn run_task(socket: &Path, cmd: &str, wait: u64) -> TaskReply {
    bash_call(
        socket,
        &BashRequest::Run {
            cmd: cmd.into(),
            timeout_secs: None,
            wait_seconds: Some(wait),
        },
        &never(),
    )
    .unwrap_or_else(|e| panic!("run {cmd}: {e}"))
}

/// Lines of the log at `level` that contain `text`.
fn log_lines(log: &str, level: &str, text: &str) -> usize {
    log.lines()
        .filter(|l| l.contains(level) && l.contains(text))
        .count()
}

#[test]
fn out_of_descriptors_the_message_waits_and_the_bash_socket_survives() {
    let b = Broker::start(&["ana"]);
    let mut h = Harness::start(&b, "ana", &[("HIVE_START_BACKOFF_MAX_MS", "400")]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let sock = h.dir.path().join("bash.sock");
    // A task from before, and a connection opened before the shortage.
    let before = run_task(&sock, "sleep 60", 0);
    assert_eq!(before.task.status, TaskStatus::Running);
    let mut early = RawBash::connect(&sock);
    assert_eq!(early.call(json!({"op": "list"}))["ok"], true);

    // From here on the harness cannot open a single new descriptor.
    let pid = h.pid();
    let old_soft = set_soft_nofile(pid, free_fds(pid, 1)[0]);
    let queued: Vec<UnixStream> = (0..4)
        .map(|_| UnixStream::connect(&sock).expect("the listener takes connections"))
        .collect();
    let id = operator_send(&b, "ana", "sent while out of descriptors");
    let notice = wait_for(Duration::from_secs(20), "a notice to the parent", || {
        operator_inbox(&b)
            .into_iter()
            .find(|m| m.from == "ana" && m.body.contains("could not be started"))
    });
    assert!(notice.body.starts_with("[system]"), "{}", notice.body);
    assert!(
        notice.body.contains("Too many open files"),
        "{}",
        notice.body
    );
    assert!(notice.body.contains(&format!("#{id}")), "{}", notice.body);
    // The task daemon answers a clear error on the connection it already had.
    let r = early.call(json!({"op": "run", "cmd": "echo never", "wait_seconds": 0}));
    assert_eq!(r["ok"], false, "{r}");
    let err = r["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("Too many open files") && err.contains("Nothing ran"),
        "{err}"
    );
    // Several more attempts, and the message is still the broker's.
    wait_for(Duration::from_secs(20), "more failed starts", || {
        h.log().contains("(3 in a row)").then_some(())
    });
    let row = agent_row(&b, "ana");
    assert_eq!(row.inflight.map_or(0, |_| 1) + row.unread, 1, "{row:?}");
    assert_eq!((row.turns, row.turns_failed), (1, 0), "{row:?}");
    assert_eq!(h.fake.count(), 1, "no claude ran meanwhile");
    assert!(h.exited().is_none(), "{}", h.log());

    // The cause goes away: the message runs and is acked, once.
    set_soft_nofile(pid, old_soft);
    wait_drained(&b, "ana");
    assert_eq!(h.fake.count(), 2);
    assert!(
        h.fake.stdin(2).contains("sent while out of descriptors"),
        "{}",
        h.fake.stdin(2)
    );
    let row = agent_row(&b, "ana");
    assert_eq!((row.turns_ok, row.turns_failed), (2, 0), "{row:?}");
    assert!(operator_inbox(&b).is_empty(), "one notice for the burst");

    // The listener survived: each queued client is served, or was told the
    // daemon was short of descriptors (when one freed up for the accept but
    // not for its second handle); new clients are served, and the task from
    // before is still known.
    for mut s in queued {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = writeln!(s, "{}", json!({"op": "list"}));
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"));
        let busy = v["error"]
            .as_str()
            .is_some_and(|e| e.contains("short of file descriptors"));
        assert!(v["ok"] == true || busy, "{v}");
    }
    let back = run_task(&sock, "echo back", 10);
    assert!(back.inline, "{back:?}");
    assert_eq!(back.task.stdout_tail.trim(), "back");
    let st: TaskReply = bash_call(
        &sock,
        &BashRequest::Status {
            id: before.task.id.clone(),
            wait_seconds: None,
        },
        &never(),
    )
    .unwrap();
    assert_eq!(st.task.status, TaskStatus::Running, "{st:?}");

    // One to three descriptors to spare (of the three lowest free numbers, the
    // blocked accepts of the page and of the task socket may hold two): the
    // task is recorded, but its output files, /dev/null and the exec pipe do
    // not all fit. A clear error, and no wake owed.
    set_soft_nofile(pid, free_fds(pid, 3)[2] + 1);
    let r = early.call(json!({"op": "run", "cmd": "echo never", "wait_seconds": 0}));
    set_soft_nofile(pid, old_soft);
    assert_eq!(r["ok"], false, "{r}");
    let err = r["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("not started")
            && err.contains("Too many open files")
            && err.contains("Nothing ran"),
        "{err}"
    );
    let r = early.call(json!({"op": "list"}));
    let live: Vec<&str> = r["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["cmd"].as_str())
        .collect();
    assert_eq!(live, ["sleep 60"], "{r}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        agent_row(&b, "ana").unread,
        0,
        "no wake for a task that never ran"
    );

    let log = h.log();
    assert_eq!(
        log_lines(&log, "ERROR", "could not be started"),
        1,
        "one log line per burst:\n{log}"
    );
    assert_eq!(
        log_lines(&log, "WARN", "the socket stays open"),
        1,
        "one accept warning per burst:\n{log}"
    );
    assert!(log.contains("claude starts again"), "{log}");
    assert!(log.contains("accepts again"), "{log}");
    assert!(h.terminate().success());
}

/// A broker socket that answers `recv_next` with garbage until healed, then
/// hands out one message and records acks.
struct FakeBroker {
    connections: Arc<AtomicUsize>,
    garbage: Arc<AtomicUsize>,
    healed: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<i64>>>,
}

impl FakeBroker {
    fn start(path: &Path) -> FakeBroker {
        let listener = UnixListener::bind(path).unwrap();
        let fb = FakeBroker {
            connections: Arc::new(AtomicUsize::new(0)),
            garbage: Arc::new(AtomicUsize::new(0)),
            healed: Arc::new(AtomicBool::new(false)),
            acked: Arc::new(Mutex::new(Vec::new())),
        };
        let (conns, garbage, healed, acked) = (
            fb.connections.clone(),
            fb.garbage.clone(),
            fb.healed.clone(),
            fb.acked.clone(),
        );
        let delivered = Arc::new(AtomicBool::new(false));
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { return };
                conns.fetch_add(1, Ordering::SeqCst);
                let (garbage, healed, acked, delivered) = (
                    garbage.clone(),
                    healed.clone(),
                    acked.clone(),
                    delivered.clone(),
                );
                std::thread::spawn(move || {
                    let mut w = s.try_clone().unwrap();
                    for line in BufReader::new(s).lines() {
                        let Ok(line) = line else { return };
                        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                        let answer: Vec<u8> = match v["cmd"].as_str().unwrap_or("") {
                            "recv_next" if !healed.load(Ordering::SeqCst) => {
                                match garbage.fetch_add(1, Ordering::SeqCst) % 4 {
                                    0 => {
                                        let mut long = vec![b'x'; (1 << 20) + 100];
                                        long.push(b'\n');
                                        long
                                    }
                                    1 => b"\xff\xfe not UTF-8\n".to_vec(),
                                    2 => b"{not json\n".to_vec(),
                                    _ => b"{\"ok\":true,\"message\":\"not a message\"}\n".to_vec(),
                                }
                            }
                            "recv_next" if !delivered.swap(true, Ordering::SeqCst) => {
                                let m = json!({"ok": true, "message": {"id": 7, "from": "operator",
                                    "to": "ana", "body": "after the garbage", "sent_at": 1},
                                    "unread": 0});
                                format!("{m}\n").into_bytes()
                            }
                            "recv_next" => {
                                std::thread::sleep(Duration::from_millis(300));
                                b"{\"ok\":true,\"message\":null}\n".to_vec()
                            }
                            "status" => b"{\"ok\":true,\"unread\":0,\"inflight\":null}\n".to_vec(),
                            "ack_turn" => {
                                acked.lock().unwrap().push(v["id"].as_i64().unwrap_or(-1));
                                b"{\"ok\":true}\n".to_vec()
                            }
                            _ => b"{\"ok\":true}\n".to_vec(),
                        };
                        if w.write_all(&answer).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        fb
    }
}

#[test]
fn the_poller_backs_off_from_answers_it_cannot_read() {
    let b = Broker::start(&["ana"]);
    let dir = TempDir::new("fb");
    let sock = dir.path().join("fake.sock");
    let fake = FakeBroker::start(&sock);
    let mut h = Harness::start(
        &b,
        "ana",
        &[
            ("HIVE_SOCKET", sock.to_str().unwrap()),
            ("HIVE_RECONNECT_MAX_MS", "1000"),
        ],
    );
    wait_for(Duration::from_secs(20), "the first garbage answer", || {
        (fake.garbage.load(Ordering::SeqCst) >= 1).then_some(())
    });
    let c0 = fake.connections.load(Ordering::SeqCst);
    std::thread::sleep(Duration::from_secs(3));
    let n = fake.connections.load(Ordering::SeqCst) - c0;
    // 100 ms doubling to the 1 s cap: about five in 3 s. Without a backoff it
    // was thousands.
    assert!(
        (2..=12).contains(&n),
        "{n} connections in 3 s is not a capped backoff"
    );
    assert!(
        fake.garbage.load(Ordering::SeqCst) >= 4,
        "every kind of garbage was tried"
    );
    let log = h.log();
    assert_eq!(
        log_lines(&log, "WARN", "lost the broker connection"),
        1,
        "one warning per burst:\n{log}"
    );
    assert!(h.exited().is_none(), "{log}");

    // The broker answers sensibly again: the message is handled and acked.
    fake.healed.store(true, Ordering::SeqCst);
    wait_for(Duration::from_secs(20), "the ack of message 7", || {
        fake.acked.lock().unwrap().contains(&7).then_some(())
    });
    assert!(
        h.fake.stdin(1).contains("after the garbage"),
        "{}",
        h.fake.stdin(1)
    );
    assert!(h.log().contains("the broker answers again"), "{}", h.log());
}

#[test]
fn operator_variables_never_reach_claude_its_tools_or_bash_tasks() {
    let b = Broker::start(&["ana"]);
    let secrets = [
        ("HIVE_WEB_TOKEN", "web-SECRETMARKER"),
        ("HIVE_DASHBOARD_TOKEN", "dash-SECRETMARKER"),
        ("HIVE_HOST_SOCKET", "/tmp/SECRETMARKER/host.sock"),
        ("HIVE_DASHBOARD_BIND", "SECRETMARKER"),
        ("HIVE_UP_STOP_GRACE_MS", "SECRETMARKER"),
    ];
    let mut env = secrets.to_vec();
    env.push(("HIVE_AGENT_VISIBLE", "kept"));
    env.push(("HIVE_CLAUDE_PLUGINS", "demo@market"));
    let h = Harness::start(&b, "ana", &env);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let check = |what: &str, vars: &HashMap<String, String>| {
        for (k, _) in &secrets {
            assert!(!vars.contains_key(*k), "{what} has {k}");
        }
        assert!(
            !vars.values().any(|v| v.contains("SECRETMARKER")),
            "{what}: {vars:?}"
        );
        assert_eq!(
            vars.get("HIVE_AGENT_VISIBLE").map(String::as_str),
            Some("kept"),
            "{what} keeps the rest"
        );
    };
    check("claude", &env_file(&h.fake.dir.join("inv-1.env")));
    check("claude plugin", &env_file(&h.fake.dir.join("plugin.env")));
    // `hive mcp` and `hive bash-mcp` get claude's environment plus their own
    // entries in the MCP config, which name no operator variable.
    let cfg = std::fs::read_to_string(h.run_dir().join("claude-mcp-config.json")).unwrap();
    let cfg: Value = serde_json::from_str(&cfg).unwrap();
    for (name, server) in cfg["mcpServers"].as_object().unwrap() {
        for k in server["env"].as_object().unwrap().keys() {
            assert!(
                !hyperhive::agent_proc::is_operator_var(k),
                "{name} gets {k}"
            );
        }
    }
    assert!(!cfg.to_string().contains("SECRETMARKER"));
    // A bash task.
    let sock = h.dir.path().join("bash.sock");
    let r = run_task(&sock, "env -0 > task.env", 10);
    assert!(r.inline && r.task.exit_code == Some(0), "{r:?}");
    check("a bash task", &env_file(&h.state_dir().join("task.env")));
    // The harness kept what it needs: its page still wants the token.
    let port: u16 = wait_for(Duration::from_secs(10), "the web port", || {
        std::fs::read_to_string(h.state_dir().join("hyperhive-port"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    let url = format!("http://127.0.0.1:{port}/api/state");
    assert_eq!(common::web::get(&url).status, 401);
    let auth = [("Authorization", "Bearer web-SECRETMARKER")];
    assert_eq!(common::web::call("GET", &url, &auth, None).status, 200);
    // Nothing of it reached the debug log.
    assert!(!h.log().contains("SECRETMARKER"), "{}", h.log());
}

#[test]
fn the_harness_files_are_private_and_claudes_and_tasks_keep_the_umask() {
    let b = Broker::start(&["ana", "bob"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake
        .step(2, "touch claude-made.txt; mkdir claude-dir; ok_turn made");
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    operator_send(&b, "ana", "make a file");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    let umask = umask_of(std::process::id());
    assert_eq!(umask_of(h.pid()), umask, "the harness keeps the umask");
    assert_ne!(
        umask & 0o044,
        0o044,
        "the test needs a umask that lets group or others read"
    );

    let (state, run) = (h.state_dir(), h.run_dir());
    for d in [&state, &run] {
        assert_eq!(mode(d), 0o700, "{}", d.display());
    }
    let mut private: Vec<PathBuf> = [
        "claude-mcp-config.json",
        "claude-settings.json",
        "claude-system-prompt.md",
    ]
    .iter()
    .map(|f| run.join(f))
    .collect();
    private.push(state.join("turn-stats.db"));
    for f in ["turn-stats.db-wal", "turn-stats.db-shm"] {
        if state.join(f).exists() {
            private.push(state.join(f));
        }
    }
    for f in &private {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    // What claude and a bash task make is theirs: the user's umask applies.
    assert_eq!(mode(&state.join("claude-made.txt")), 0o666 & !umask);
    assert_eq!(mode(&state.join("claude-dir")), 0o777 & !umask);
    let sock = h.dir.path().join("bash.sock");
    let r = run_task(&sock, "echo x > task-made.txt", 10);
    assert!(r.inline, "{r:?}");
    assert_eq!(mode(&state.join("task-made.txt")), 0o666 & !umask);

    // The login sentinel of a harness without credentials.
    let bob = Harness::start(&b, "bob", &[("ANTHROPIC_API_KEY", "")]);
    let sentinel = bob.state_dir().join("hyperhive-needs-login");
    wait_for(Duration::from_secs(20), "the login sentinel", || {
        sentinel.exists().then_some(())
    });
    assert_eq!(mode(&sentinel), 0o600);

    // `hive mcp` writes the status line and the continue sentinel for the
    // harness: 0600 as well.
    let dir = TempDir::new("mcpst");
    let log = dir.path().join("mcp.log");
    let mut m = common::mcp::McpProc::start(
        &[
            ("HIVE_SOCKET", b.agent_socket("ana").to_str().unwrap()),
            ("HIVE_STATE_DIR", dir.path().to_str().unwrap()),
            ("HIVE_TOOL_GROUPS", "messaging,meta,inbox"),
            ("HIVE_LABEL", "ana"),
        ],
        &log,
    );
    m.initialize();
    m.ok(2, "set_status", json!({"text": "busy"}));
    m.ok(3, "request_next_turn", json!({}));
    assert_eq!(mode(&dir.path().join("hyperhive-status")), 0o600);
    assert_eq!(mode(&dir.path().join("hyperhive-continue")), 0o600);
}

#[test]
fn absurd_turn_counters_are_never_posted() {
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let before = agent_row(&b, "ana");
    let results = [
        r#"{"type":"result","subtype":"success","is_error":false,"result":"x","total_cost_usd":1.7976931348623157e308,"usage":{"input_tokens":18446744073709551615,"output_tokens":-5}}"#,
        r#"{"type":"result","subtype":"success","is_error":false,"result":"x","total_cost_usd":-3.5,"usage":{"input_tokens":1e300,"output_tokens":2.5}}"#,
    ];
    for (i, result) in results.iter().enumerate() {
        h.fake
            .step(i + 2, &format!("init\nprintf '%s\\n' '{result}'\nexit 0"));
        operator_send(&b, "ana", &format!("weird numbers {i}"));
        h.fake.wait_count(i + 2);
        wait_drained(&b, "ana");
    }
    let row = wait_for(Duration::from_secs(10), "the counters", || {
        let r = agent_row(&b, "ana");
        (r.turns == before.turns + 2).then_some(r)
    });
    assert_eq!(row.turns_ok, before.turns_ok + 2, "{row:?}");
    assert_eq!(row.tokens_in, before.tokens_in, "{row:?}");
    assert_eq!(row.tokens_out, before.tokens_out, "{row:?}");
    assert!(
        row.cost_usd.is_finite() && row.cost_usd == before.cost_usd,
        "{row:?}"
    );
    let db = rusqlite::Connection::open(h.state_dir().join("turn-stats.db")).unwrap();
    let (tin, tout, cost): (i64, i64, f64) = db
        .query_row(
            "SELECT SUM(tokens_in), SUM(tokens_out), SUM(cost_usd) FROM turns WHERE sender = 'operator'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((tin, tout, cost), (0, 0, 0.0));
}

#[test]
fn a_model_name_that_claude_would_read_as_an_option_stops_the_start() {
    let dir = TempDir::new("model");
    let state = dir.path().join("state");
    let run = dir.path().join("run");
    for bad in [
        "--dangerously-skip-permissions",
        "-x",
        "two words",
        "esc\u{1b}]0;x",
    ] {
        let (code, _, err) = run_hive(
            &[
                "serve",
                "--state-dir",
                state.to_str().unwrap(),
                "--run-dir",
                run.to_str().unwrap(),
            ],
            None,
            &[("HIVE_DEFAULT_MODEL", bad)],
        );
        assert_ne!(code, 0, "{bad:?} was accepted");
        assert!(
            err.contains("HIVE_DEFAULT_MODEL") && err.contains("is not a model name"),
            "{bad:?}: {err}"
        );
        assert!(
            !err.contains('\u{1b}'),
            "the error escapes what it echoes: {err:?}"
        );
    }
    assert!(!state.exists(), "nothing was created");
}
