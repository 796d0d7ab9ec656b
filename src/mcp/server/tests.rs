//! In-memory tests of [`serve`]: literal JSON goes in through a channel-backed
//! stdin, lines come out of a channel-backed stdout, and every wait has a timeout.

use super::*;
use crate::mcp::schema::{self, Arg, Ty};
use crate::mcp::ToolDef;
use crossbeam_channel::{after, unbounded, RecvTimeoutError};
use std::io::Read;

const WAIT: Duration = Duration::from_secs(5);
const QUIET: Duration = Duration::from_millis(300);

/// Stdin: each `Vec` sent is more input; dropping the sender is EOF.
struct ChanReader {
    rx: Receiver<Vec<u8>>,
    buf: Vec<u8>,
    pos: usize,
}

impl Read for ChanReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = {
            let available = self.fill_buf()?;
            let n = available.len().min(out.len());
            out[..n].copy_from_slice(&available[..n]);
            n
        };
        self.consume(n);
        Ok(n)
    }
}

impl BufRead for ChanReader {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.pos >= self.buf.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.buf = chunk;
                    self.pos = 0;
                }
                Err(_) => return Ok(&[]),
            }
        }
        Ok(&self.buf[self.pos..])
    }

    fn consume(&mut self, n: usize) {
        self.pos += n;
    }
}

/// Stdout: every flushed line goes to the journal channel.
struct ChanWriter {
    tx: Sender<String>,
    pending: Vec<u8>,
}

impl Write for ChanWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        while let Some(i) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=i).collect();
            let line = String::from_utf8(line).unwrap();
            let _ = self.tx.send(line.trim_end().to_string());
        }
        Ok(())
    }
}

/// Stdout that is gone.
struct BrokenWriter;

impl Write for BrokenWriter {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::ErrorKind::BrokenPipe.into())
    }

    fn flush(&mut self) -> io::Result<()> {
        Err(io::ErrorKind::BrokenPipe.into())
    }
}

/// Tools whose side effects land in the same journal as stdout, so a test sees
/// in which order lines and hooks happened.
struct TestTools {
    journal: Sender<String>,
    release: Receiver<()>,
    /// How many times `list` was called.
    lists: Arc<std::sync::atomic::AtomicUsize>,
}

impl TestTools {
    fn hook(&self, mark: &'static str) -> AfterWrite {
        let journal = self.journal.clone();
        Box::new(move || {
            let _ = journal.send(mark.into());
        })
    }
}

impl TestTools {
    /// Tools nobody watches (their journal and release go nowhere).
    fn idle() -> TestTools {
        TestTools {
            journal: unbounded().0,
            release: unbounded().1,
            lists: Arc::default(),
        }
    }
}

impl Tools for TestTools {
    fn list(&self) -> Vec<ToolDef> {
        self.lists.fetch_add(1, Ordering::SeqCst);
        ["echo", "park", "boom", "fail", "hooked"]
            .into_iter()
            .map(|name| ToolDef {
                name,
                description: format!("the {name} test tool"),
                input_schema: json!({"type": "object"}).into(),
            })
            .collect()
    }

    fn call(&self, name: &str, args: Value, ctx: &CallCtx) -> ToolOutcome {
        match name {
            "echo" => {
                let spec = [Arg::req("text", Ty::Str, "what to echo")];
                match schema::check(&spec, args) {
                    Ok(v) => ToolOutcome::Ok(v["text"].as_str().unwrap_or_default().into()),
                    Err(e) => ToolOutcome::InvalidParams(e),
                }
            }
            "boom" => panic!("boom!"),
            "fail" => ToolOutcome::Err("the fail tool failed".into()),
            "hooked" => ToolOutcome::OkThen("hooked result".into(), self.hook("hook ran")),
            "park" => {
                let _ = self.journal.send("park started".into());
                // Even when cancelled it answers with a hook, which must not run.
                select! {
                    recv(ctx.cancel) -> _ => {
                        let _ = self.journal.send("park cancelled".into());
                        ToolOutcome::OkThen("late".into(), self.hook("park hook ran"))
                    }
                    recv(self.release) -> _ => {
                        ToolOutcome::OkThen("released".into(), self.hook("park hook ran"))
                    }
                    recv(after(WAIT)) -> _ => ToolOutcome::Err("never released".into()),
                }
            }
            other => ToolOutcome::Err(format!("no tool {other}")),
        }
    }
}

struct Harness {
    input: Option<Sender<Vec<u8>>>,
    journal: Receiver<String>,
    signals: Sender<i32>,
    release: Sender<()>,
    done: Receiver<io::Result<ExitReason>>,
    /// One `()` when `serve` asked for its signal channel (its first call).
    signals_asked: Receiver<()>,
    lists: Arc<std::sync::atomic::AtomicUsize>,
}

fn info() -> ServerInfo {
    ServerInfo {
        name: "hyperhive".into(),
        version: "0.1.0".into(),
        instructions: None,
    }
}

impl Harness {
    fn start() -> Harness {
        Harness::with(info(), None)
    }

    /// Starts `serve` on a thread; `output` replaces the journal-backed stdout.
    fn with(info: ServerInfo, output: Option<Box<dyn Write + Send>>) -> Harness {
        let (input, input_rx) = unbounded();
        let (journal_tx, journal) = unbounded();
        let (signals, signals_rx) = unbounded();
        let (release, release_rx) = unbounded();
        let (done_tx, done) = unbounded();
        let (asked_tx, signals_asked) = unbounded();
        let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let tools = Arc::new(TestTools {
            journal: journal_tx.clone(),
            release: release_rx,
            lists: Arc::clone(&lists),
        });
        let reader = ChanReader {
            rx: input_rx,
            buf: Vec::new(),
            pos: 0,
        };
        let output = output.unwrap_or_else(|| {
            Box::new(ChanWriter {
                tx: journal_tx,
                pending: Vec::new(),
            })
        });
        thread::spawn(move || {
            let signals = move || {
                let _ = asked_tx.send(());
                Ok(signals_rx)
            };
            let _ = done_tx.send(serve(info, tools, reader, output, signals));
        });
        Harness {
            input: Some(input),
            journal,
            signals,
            release,
            done,
            signals_asked,
            lists,
        }
    }

    fn send(&self, line: &str) {
        let mut bytes = line.as_bytes().to_vec();
        bytes.push(b'\n');
        self.input.as_ref().unwrap().send(bytes).unwrap();
    }

    /// The next stdout line or hook mark.
    fn next(&self) -> String {
        match self.journal.recv_timeout(WAIT) {
            Ok(line) => line,
            Err(e) => panic!("nothing arrived within {WAIT:?}: {e}"),
        }
    }

    fn next_json(&self) -> Value {
        let line = self.next();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON: {line}: {e}"))
    }

    fn request(&self, line: &str) -> Value {
        self.send(line);
        self.next_json()
    }

    fn assert_quiet(&self) {
        match self.journal.recv_timeout(QUIET) {
            // Disconnected: every tool and hook is gone, so nothing can come.
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
            Ok(line) => panic!("expected nothing, got {line}"),
        }
    }

    fn close_input(&mut self) {
        self.input = None;
    }

    fn exit(&self) -> io::Result<ExitReason> {
        self.done
            .recv_timeout(WAIT)
            .unwrap_or_else(|e| panic!("serve did not return within {WAIT:?}: {e}"))
    }
}

fn expect(got: Value, want: &str) {
    let want: Value = serde_json::from_str(want).unwrap();
    assert_eq!(got, want);
}

#[test]
fn initialize_negotiates_the_protocol_version() {
    let cases = [
        (r#""2025-11-25""#, "2025-11-25"),
        (r#""2025-06-18""#, "2025-06-18"),
        (r#""2025-03-26""#, "2025-03-26"),
        (r#""2024-11-05""#, "2024-11-05"),
        (r#""2099-01-01""#, "2025-11-25"),
        (r#""2024-10-07""#, "2025-11-25"),
        ("5", "2025-11-25"),
        ("null", "2025-11-25"),
    ];
    let h = Harness::start();
    for (asked, answered) in cases {
        let got = h.request(&format!(
            r#"{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":{asked},"capabilities":{{}},"clientInfo":{{"name":"claude-code","version":"2.1.197"}}}}}}"#
        ));
        expect(
            got,
            &format!(
                r#"{{"jsonrpc":"2.0","id":0,"result":{{"protocolVersion":"{answered}","capabilities":{{"tools":{{"listChanged":false}}}},"serverInfo":{{"name":"hyperhive","version":"0.1.0"}}}}}}"#
            ),
        );
    }
    let got = h.request(r#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#);
    assert_eq!(got["result"]["protocolVersion"], "2025-11-25");
}

#[test]
fn initialize_carries_instructions_when_given() {
    let mut info = info();
    info.instructions = Some("Use recv to read mail.".into());
    let h = Harness::with(info, None);
    let got = h.request(
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#,
    );
    assert_eq!(got["result"]["instructions"], "Use recv to read mail.");
}

#[test]
fn the_claude_handshake_then_list_and_call() {
    let h = Harness::start();
    h.send(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{"roots":{},"elicitation":{}},"clientInfo":{"name":"claude-code","version":"2.1.197"}}}"#);
    h.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    h.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert_eq!(h.next_json()["id"], 0);
    let list = h.next_json();
    assert_eq!(list["id"], 1);
    let tools = list["result"]["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 5);
    expect(
        tools[0].clone(),
        r#"{"name":"echo","description":"the echo test tool","inputSchema":{"type":"object"}}"#,
    );
    let got = h.request(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"},"_meta":{"claudecode/toolUseId":"toolu_1","progressToken":2}}}"#);
    expect(
        got,
        r#"{"jsonrpc":"2.0","id":2,"result":{"content":[{"type":"text","text":"hi"}]}}"#,
    );
    let got = h.request(r#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#);
    expect(got, r#"{"jsonrpc":"2.0","id":"p","result":{}}"#);
}

#[test]
fn every_error_code_has_its_exact_error_object() {
    let cases = [
        (
            "{not json",
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: key must be a string at line 1 column 2"}}"#,
        ),
        (
            r#""just a string""#,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: a message must be a JSON object (batches are not supported)"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.1","id":1,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32600,"message":"Invalid Request: \"jsonrpc\" must be \"2.0\""}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":[1],"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: \"id\" must be a string or an integer"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":2}"#,
            r#"{"jsonrpc":"2.0","id":2,"error":{"code":-32600,"message":"Invalid Request: missing \"method\""}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":3,"method":"resources/list"}"#,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32601,"message":"Method not found: resources/list"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"nope","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":4,"error":{"code":-32602,"message":"unknown tool: nope"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":5,"error":{"code":-32602,"message":"tools/call is missing \"name\""}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":7}}"#,
            r#"{"jsonrpc":"2.0","id":6,"error":{"code":-32602,"message":"tools/call \"name\" must be a string"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":"text=hi"}}"#,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"tools/call \"arguments\" must be an object"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/call"}"#,
            r#"{"jsonrpc":"2.0","id":8,"error":{"code":-32602,"message":"tools/call params must be an object with \"name\" and \"arguments\""}}"#,
        ),
        // Before any initialize: CLI 2.1.332 probes with `server/discover`
        // (a string id) and goes on to `initialize` as soon as it is refused.
        (
            r#"{"jsonrpc":"2.0","id":"server-discover-probe-1","method":"server/discover","params":{"_meta":{"protocolVersion":"2026-07-28"}}}"#,
            r#"{"jsonrpc":"2.0","id":"server-discover-probe-1","error":{"code":-32601,"message":"Method not found: server/discover"}}"#,
        ),
        // Wrong arguments are a result the model reads (`isError`), naming
        // the argument, quoting the value and saying what is allowed.
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"echo","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":9,"result":{"content":[{"text":"missing required argument \"text\" (a string)","type":"text"}],"isError":true}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"echo","arguments":{"text":3}}}"#,
            r#"{"jsonrpc":"2.0","id":10,"result":{"content":[{"text":"argument \"text\" must be a string, got 3","type":"text"}],"isError":true}}"#,
        ),
    ];
    let h = Harness::start();
    for (input, want) in cases {
        h.send(input);
        assert_eq!(h.next(), want, "for input {input}");
    }
}

#[test]
fn notifications_are_never_answered() {
    let h = Harness::start();
    h.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    h.send(r#"{"jsonrpc":"2.0","method":"notifications/unknown","params":{}}"#);
    h.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":99}}"#);
    h.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled"}"#);
    h.send(r#"{"jsonrpc":"2.0","id":50,"result":{}}"#);
    let got = h.request(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    expect(got, r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
}

#[test]
fn tool_errors_are_results_with_is_error() {
    let h = Harness::start();
    let got =
        h.request(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fail"}}"#);
    expect(
        got,
        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"the fail tool failed"}],"isError":true}}"#,
    );
}

#[test]
fn a_panicking_tool_becomes_an_error_result_and_the_server_lives() {
    let h = Harness::start();
    let got = h.request(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"boom","arguments":{}}}"#,
    );
    expect(
        got,
        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"tool \"boom\" panicked: boom!. This is a bug in hive; the server is still running, so other tools keep working."}],"isError":true}}"#,
    );
    let got = h.request(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    assert_eq!(got["id"], 2);
}

#[test]
fn a_parked_call_does_not_block_ping_or_list() {
    let h = Harness::start();
    h.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"park"}}"#);
    assert_eq!(h.next(), "park started");
    let got = h.request(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    expect(got, r#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
    let got = h.request(r#"{"jsonrpc":"2.0","id":3,"method":"tools/list"}"#);
    assert_eq!(got["id"], 3);
    h.release.send(()).unwrap();
    expect(
        h.next_json(),
        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"released"}]}}"#,
    );
    assert_eq!(h.next(), "park hook ran");
}

#[test]
fn the_post_write_hook_runs_after_the_line_is_written() {
    let h = Harness::start();
    h.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"hooked","arguments":{}}}"#);
    expect(
        h.next_json(),
        r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"hooked result"}]}}"#,
    );
    assert_eq!(h.next(), "hook ran");
}

#[test]
fn the_post_write_hook_does_not_run_when_the_write_fails() {
    let h = Harness::with(info(), Some(Box::new(BrokenWriter)));
    h.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"hooked","arguments":{}}}"#);
    let err = h.exit().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    assert!(
        err.to_string().starts_with("writing MCP output failed"),
        "{err}"
    );
    h.assert_quiet();
}

#[test]
fn cancel_ends_a_parked_call_with_no_response_and_no_hook() {
    let h = Harness::start();
    h.send(
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"park","arguments":{}}}"#,
    );
    assert_eq!(h.next(), "park started");
    h.send(r#"{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"McpError: MCP error -32001: Request timed out"}}"#);
    assert_eq!(h.next(), "park cancelled");
    h.assert_quiet();
    // The id is free again, and the late result of the old call is not mistaken
    // for the new one's.
    h.send(r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"echo","arguments":{"text":"again"}}}"#);
    expect(
        h.next_json(),
        r#"{"jsonrpc":"2.0","id":5,"result":{"content":[{"type":"text","text":"again"}]}}"#,
    );
}

#[test]
fn a_reused_id_of_a_running_call_is_refused() {
    let h = Harness::start();
    h.send(r#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"park"}}"#);
    assert_eq!(h.next(), "park started");
    h.send(r#"{"jsonrpc":"2.0","id":"c","method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}"#);
    assert_eq!(
        h.next(),
        r#"{"jsonrpc":"2.0","id":"c","error":{"code":-32600,"message":"Invalid Request: id \"c\" is already used by a running call"}}"#
    );
}

#[test]
fn eof_mid_call_returns_promptly_and_cancels_the_call() {
    let mut h = Harness::start();
    h.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"park"}}"#);
    assert_eq!(h.next(), "park started");
    let started = Instant::now();
    h.close_input();
    assert_eq!(h.exit().unwrap(), ExitReason::Eof);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(h.next(), "park cancelled");
    h.assert_quiet();
}

#[test]
fn eof_still_flushes_answers_already_due() {
    let mut h = Harness::start();
    h.send(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    h.close_input();
    assert_eq!(h.exit().unwrap(), ExitReason::Eof);
    assert_eq!(h.next(), r#"{"jsonrpc":"2.0","id":1,"result":{}}"#);
}

#[test]
fn a_signal_returns_at_once_and_runs_no_hook() {
    let h = Harness::start();
    h.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"park"}}"#);
    assert_eq!(h.next(), "park started");
    let started = Instant::now();
    h.signals.send(2).unwrap();
    let reason = h.exit().unwrap();
    assert_eq!(reason, ExitReason::Signal(2));
    assert_eq!(reason.exit_code(), 130);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(h.next(), "park cancelled");
    h.assert_quiet();
}

/// Claude's start-up (initialize, initialized, tools/list, ping, a bad line)
/// is answered before `serve` starts anything: the signal channel is asked for
/// only when the first call arrives, and then once.
#[test]
fn start_up_is_answered_before_the_signal_thread_and_the_first_call_starts_it() {
    let h = Harness::start();
    let got = h.request(r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25"}}"#);
    assert_eq!(got["result"]["protocolVersion"], "2025-11-25");
    h.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#);
    let got = h.request(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert_eq!(got["result"]["tools"].as_array().unwrap().len(), 5);
    let got = h.request("{oops");
    assert_eq!(got["error"]["code"], -32700);
    let got = h.request(r#"{"jsonrpc":"2.0","id":2,"method":"ping"}"#);
    expect(got, r#"{"jsonrpc":"2.0","id":2,"result":{}}"#);
    assert!(
        h.signals_asked.try_recv().is_err(),
        "no signal thread before the first call"
    );
    let got = h.request(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}"#);
    assert_eq!(got["result"]["content"][0]["text"], "hi");
    h.signals_asked
        .recv_timeout(WAIT)
        .expect("asked at the first call");
    let got = h.request(r#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"echo","arguments":{"text":"again"}}}"#);
    assert_eq!(got["result"]["content"][0]["text"], "again");
    assert!(h.signals_asked.try_recv().is_err(), "asked once");
}

/// The provider's list is read once, for the first tools/list, and serves every
/// later listing and every call's name check; the kept answer is the same line
/// each time.
#[test]
fn the_tool_list_is_built_once_and_kept() {
    let h = Harness::start();
    let first = {
        h.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        h.next()
    };
    h.send(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert_eq!(h.next(), first, "the same answer, byte for byte");
    let got = h.request(r#"{"jsonrpc":"2.0","id":"s","method":"tools/list"}"#);
    assert_eq!(got["id"], "s");
    let got = h.request(r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"text":"x"}}}"#);
    assert_eq!(got["result"]["content"][0]["text"], "x");
    let got =
        h.request(r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"nope"}}"#);
    assert_eq!(got["error"]["message"], "unknown tool: nope");
    let got = h.request(r#"{"jsonrpc":"2.0","id":4,"method":"tools/list"}"#);
    assert_eq!(got["result"]["tools"][0]["name"], "echo");
    assert_eq!(h.lists.load(Ordering::SeqCst), 1);
}

/// Before the first call stdout is written on `serve`'s own thread: a failed
/// write ends it with the same error the writer thread would give, and EOF
/// ends it at once, both without a thread or a signal handler started.
#[test]
fn before_the_first_call_a_failed_write_or_eof_ends_serve_on_its_own_thread() {
    let h = Harness::with(info(), Some(Box::new(BrokenWriter)));
    h.send(r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#);
    let err = h.exit().unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe);
    assert!(
        err.to_string().starts_with("writing MCP output failed"),
        "{err}"
    );
    assert!(h.signals_asked.try_recv().is_err());

    let mut h = Harness::start();
    let got = h.request(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
    assert_eq!(got["id"], 1);
    h.close_input();
    assert_eq!(h.exit().unwrap(), ExitReason::Eof);
    assert!(h.signals_asked.try_recv().is_err());
}

/// The listing written as text is what serializing the listing as a value
/// gives, byte for byte, for every hyperhive tool (the bash server's schemas:
/// `bash::mcp`'s tests).
#[test]
fn the_written_listing_is_the_serialized_listing() {
    use crate::proto::access::{Capability, ToolGroup};
    let hyperhive = crate::mcp::hyperhive::HyperhiveTools::new(
        ToolGroup::ALL.to_vec(),
        Capability::ALL.to_vec(),
        "/nonexistent/mcp.sock".into(),
        None,
    );
    let providers: [&dyn Tools; 2] = [&hyperhive, &TestTools::idle()];
    for tools in providers {
        let listing = Listing::of(tools);
        let list: Vec<Value> = tools
            .list()
            .into_iter()
            .map(|t| {
                json!({"name": t.name, "description": t.description, "inputSchema": t.input_schema.to_value()})
            })
            .collect();
        assert!(list.len() >= 2);
        assert_eq!(
            listing.result.concat(),
            json!({ "tools": list }).to_string()
        );
        assert_eq!(listing.names.len(), list.len());
    }
}

#[test]
fn exit_codes_follow_shell_conventions() {
    assert_eq!(ExitReason::Eof.exit_code(), 0);
    assert_eq!(ExitReason::Signal(15).exit_code(), 143);
}

/// The `initialize` answer as `Message::line` wrote it from a JSON value
/// before it was written as text.
fn initialize_line_from_value(id: RequestId, info: &ServerInfo, version: &str) -> Vec<u8> {
    let mut result = json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": info.name, "version": info.version},
    });
    if let Some(instructions) = &info.instructions {
        result["instructions"] = Value::String(instructions.clone());
    }
    Message::from(Response::ok(id, result)).line().unwrap()
}

#[test]
fn the_written_initialize_answer_is_the_serialized_answer() {
    let plain = info();
    let with_text = ServerInfo {
        name: "na\"me".into(),
        version: "1.2.3-\u{7f}\u{1}".into(),
        instructions: Some("Use \"these\"\ttools\\ wisely.\nÜber \u{2028} \u{0}".into()),
    };
    let ids: [RequestId; 4] = [0.into(), (-7).into(), "x-1".into(), "q\"\\\n".into()];
    for info in [&plain, &with_text] {
        for version in SUPPORTED_PROTOCOL_VERSIONS {
            for id in &ids {
                let mut line = result_head(id).unwrap().into_bytes();
                line.extend_from_slice(initialize_result(info, version).as_bytes());
                line.extend_from_slice(b"}\n");
                let want = initialize_line_from_value(id.clone(), info, version);
                assert_eq!(
                    String::from_utf8(line).unwrap(),
                    String::from_utf8(want).unwrap()
                );
            }
        }
    }
}

/// Takes at most `n` bytes per call and no vectored writes: `write_parts`
/// must still write every byte, in order.
struct Trickle {
    n: usize,
    out: Vec<u8>,
    flushed: bool,
}

impl Write for Trickle {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(self.n);
        self.out.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.flushed = true;
        Ok(())
    }
}

#[test]
fn a_line_in_parts_is_written_whole_and_flushed() {
    for n in [1, 3, 1000] {
        let mut w = Trickle {
            n,
            out: Vec::new(),
            flushed: false,
        };
        write_parts(&mut w, &[b"{\"id\":", b"", b"1", b"", b"}\n"]).unwrap();
        assert_eq!(w.out, b"{\"id\":1}\n");
        assert!(w.flushed);
    }
}
