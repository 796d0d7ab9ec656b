//! A `hive mcp` process driven over its real stdio: lines go to its stdin, a
//! reader thread turns its stdout into a channel, stderr goes to a log file.
//! Every wait has a timeout, and the process is killed and reaped on drop.

use super::hive::hive_bin;
use crossbeam_channel::{unbounded, Receiver, RecvTimeoutError};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long any one answer may take.
pub const ANSWER_WAIT: Duration = Duration::from_secs(15);

pub struct McpProc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Held by a test to stop the stdout reader, so the pipe fills up.
    gate: Arc<Mutex<()>>,
    /// Lines read while waiting for another id.
    stash: Vec<Value>,
    log: PathBuf,
}

impl McpProc {
    /// Starts `hive mcp` with `env` added, logging to `log`.
    pub fn start(env: &[(&str, &str)], log: &Path) -> McpProc {
        let err = std::fs::File::create(log).expect("create the mcp log");
        let mut cmd = Command::new(hive_bin());
        cmd.arg("mcp")
            .env("RUST_LOG", "debug")
            .env_remove("HIVE_TOOL_GROUPS")
            .env_remove("HIVE_STATE_DIR")
            .env_remove("HIVE_SOCKET")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(err);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn hive mcp");
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, lines) = unbounded();
        let gate = Arc::new(Mutex::new(()));
        let reader_gate = Arc::clone(&gate);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                drop(reader_gate.lock());
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        McpProc {
            stdin: child.stdin.take(),
            child,
            lines,
            gate,
            stash: Vec::new(),
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The stdout reader's gate: while a test holds its lock, stdout is not
    /// read, the pipe fills, and `hive mcp`'s writer blocks once it is full.
    pub fn stdout_gate(&self) -> Arc<Mutex<()>> {
        Arc::clone(&self.gate)
    }

    /// Writes one raw line (a newline is added).
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin is open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .expect("write to hive mcp");
        stdin.flush().expect("flush hive mcp stdin");
    }

    pub fn send(&mut self, msg: &Value) {
        self.send_line(&msg.to_string());
    }

    pub fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// The next raw stdout line.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        match self.lines.recv_timeout(timeout) {
            Ok(line) => Some(line),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// The response with id `id`; other lines are kept for later.
    pub fn response(&mut self, id: &Value) -> Value {
        if let Some(i) = self.stash.iter().position(|m| &m["id"] == id) {
            return self.stash.remove(i);
        }
        let end = Instant::now() + ANSWER_WAIT;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            let Some(line) = self.next_line(left) else {
                panic!(
                    "no response to id {id} within {ANSWER_WAIT:?}\n{}",
                    self.log()
                );
            };
            let msg: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line}"));
            if &msg["id"] == id {
                return msg;
            }
            self.stash.push(msg);
        }
    }

    /// Sends a request and returns its response.
    pub fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}));
        self.response(&json!(id))
    }

    /// `initialize` and `notifications/initialized`.
    pub fn initialize(&mut self) -> Value {
        let r = self.request(
            0,
            "initialize",
            json!({"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"test","version":"0"}}),
        );
        self.send(&json!({"jsonrpc":"2.0","method":"notifications/initialized"}));
        r
    }

    /// Starts a `tools/call` without waiting for its answer.
    pub fn start_call(&mut self, id: i64, name: &str, args: Value) {
        self.send(&json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":name,"arguments":args}}));
    }

    /// A `tools/call`; returns the whole response.
    pub fn call(&mut self, id: i64, name: &str, args: Value) -> Value {
        self.start_call(id, name, args);
        self.response(&json!(id))
    }

    /// A `tools/call` that must succeed; returns its text.
    pub fn ok(&mut self, id: i64, name: &str, args: Value) -> String {
        let r = self.call(id, name, args.clone());
        let result = &r["result"];
        assert!(
            result.is_object() && result["isError"] != true,
            "{name}({args}) failed: {r}"
        );
        text_of(result)
    }

    /// A `tools/call` that must come back with `isError: true`; returns its text.
    pub fn tool_error(&mut self, id: i64, name: &str, args: Value) -> String {
        let r = self.call(id, name, args.clone());
        assert_eq!(r["result"]["isError"], true, "{name}({args}): {r}");
        text_of(&r["result"])
    }

    /// Waits up to `timeout` for the process to exit; returns its exit code, or
    /// 128 + signal when a signal ended it.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        let end = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Some(st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0)));
            }
            if Instant::now() > end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn signal(&self, sig: i32) {
        unsafe { libc::kill(self.pid(), sig) };
    }
}

impl Drop for McpProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The text of a `tools/call` result's content blocks.
pub fn text_of(result: &Value) -> String {
    result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}
