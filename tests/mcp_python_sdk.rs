//! The official MCP Python SDK as the client of `hive mcp`: it initializes, lists
//! the tools and calls each of them against a real broker, checking results,
//! tool errors, bad arguments (isError) and -32602 errors (`tests/mcp_sdk/client.py`). Without the `mcp`
//! package the test skips loudly, and fails under `HIVE_REQUIRE_REAL_CLAUDE=1`,
//! as in CI, where `.ci/run` installs it.

mod common;

use common::hive::{hive_bin, ok, Broker, TempDir};
use hyperhive::proto::cmd::{Inbox, Send as SendMsg};
use hyperhive::proto::MessagesReply;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SCRIPT_TIMEOUT: Duration = Duration::from_secs(90);

/// Whether `python3` can import the SDK; panics instead of skipping in CI.
fn require_python_sdk() -> bool {
    let found = Command::new("python3")
        .args(["-c", "import mcp"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return true;
    }
    let install = "PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install mcp";
    if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() == Ok("1") {
        panic!("HIVE_REQUIRE_REAL_CLAUDE=1 but python3 cannot import the MCP SDK; install it with: {install}");
    }
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED: the MCP Python SDK is not installed (run: {install})"
    );
    false
}

/// Runs the client script; returns (exit code, stdout, stderr). Killed at the timeout.
fn run_script(args: &[&str]) -> (Option<i32>, String, String) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_sdk/client.py");
    let mut child = Command::new("python3")
        .arg(script)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start python3");
    let drain = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = pipe.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let end = Instant::now() + SCRIPT_TIMEOUT;
    let status = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break Some(st);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.and_then(|s| s.code()),
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    )
}

#[test]
fn the_python_sdk_initializes_lists_and_calls_every_tool() {
    if !require_python_sdk() {
        return;
    }
    let broker = Broker::start(&["ruth"]);
    let state = TempDir::new("pysdk");
    let queued = ok(
        &mut broker.host(),
        SendMsg {
            to: "ruth".into(),
            body: "queued for python".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    )["id"]
        .as_i64()
        .unwrap();

    let (code, out, err) = run_script(&[
        hive_bin().to_str().unwrap(),
        broker.agent_socket("ruth").to_str().unwrap(),
        state.path().to_str().unwrap(),
        &queued.to_string(),
    ]);

    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.ends_with("ALL OK\n"), "{out}");
    let inbox = ok(
        &mut broker.host(),
        Inbox {
            wait_seconds: Some(0),
            peek: false,
            after: None,
        },
    );
    let inbox: MessagesReply = serde_json::from_value(Value::Object(inbox)).unwrap();
    let bodies: Vec<&str> = inbox.messages.iter().map(|m| m.body.as_str()).collect();
    assert_eq!(bodies, ["from the python sdk"]);
    assert!(state.path().join("hyperhive-continue").exists());
    assert_eq!(
        std::fs::read_to_string(state.path().join("hyperhive-status")).unwrap(),
        "testing with python\n"
    );
}
