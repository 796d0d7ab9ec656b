//! The MCP server loop and its threads. [`serve`] owns one loop that answers
//! `initialize`, `ping` and `tools/list` inline, starts one thread per `tools/call`,
//! routes `notifications/cancelled` to the call it names, and decides which call
//! results reach the writer. Until the first `tools/call` the loop runs alone on
//! the caller's thread, reading stdin and writing stdout itself: claude's
//! start-up messages (`initialize`, `tools/list`) are answered before any thread
//! exists, and a server that is never called never starts one. The first call
//! starts the signal thread, a reader thread that owns stdin and a writer thread
//! that owns stdout, running each result's post-write hook after its line is
//! flushed. The `tools/list` answer is built once and kept. The loop ends on
//! stdin EOF, on an exit signal (see `crate::sys::signals`) or when stdout
//! fails, without waiting for tool threads: their calls are cancelled.

use super::jsonrpc::{Message, Notification, Request, RequestId, Response};
use super::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND};
use super::{AfterWrite, CallCtx, ServerInfo, ToolOutcome, Tools};
use crate::proto::lines::push_json_str;
use crossbeam_channel::{never, select, Receiver, Sender};
use log::{debug, error, info, warn};
use serde_json::{json, Value};
use std::any::Any;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{self, BufRead, Write};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// Protocol versions this server speaks, newest first. A client asking for one of
/// them gets it; any other request gets the first.
pub const SUPPORTED_PROTOCOL_VERSIONS: &[&str] =
    &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// How long `serve` lets the writer flush already queued lines after stdin EOF.
const FLUSH_GRACE: Duration = Duration::from_millis(200);

/// Longest request or result text put in one debug log line.
const LOG_CLIP: usize = 2000;

/// Why [`serve`] returned normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitReason {
    /// Stdin reached end of file: the client is gone or done.
    Eof,
    /// An exit signal arrived on the `signals` channel.
    Signal(i32),
}

impl ExitReason {
    /// The process exit status to use: 0 after EOF, 128 + the signal number after a
    /// signal, as a shell would report it.
    pub fn exit_code(self) -> i32 {
        match self {
            ExitReason::Eof => 0,
            ExitReason::Signal(sig) => 128 + sig,
        }
    }
}

/// Serves MCP on `input` and `output` until EOF, an exit signal or a failed
/// write, which is the `Err` case, as is a failed read. `signals` is called when
/// the first `tools/call` arrives (it installs the signal thread and gives its
/// channel; pass `|| Ok(never())` for none): until then the server runs on this
/// thread alone and a signal takes its default action, ending a process that
/// has nothing in flight. From the first call on, `input` and `output` go to
/// their own threads, which are not joined: a read blocked on stdin must not
/// hold up the exit. Tool threads still running are cancelled and their
/// results dropped.
pub fn serve(
    info: ServerInfo,
    tools: Arc<dyn Tools>,
    mut input: impl BufRead + Send + 'static,
    output: impl Write + Send + 'static,
    signals: impl FnOnce() -> Result<Receiver<i32>, String>,
) -> io::Result<ExitReason> {
    let (events_tx, events_rx) = crossbeam_channel::unbounded();
    let mut server = Server {
        info,
        tools,
        listing: None,
        sink: Sink::Direct(Box::new(output)),
        events: events_tx,
        inflight: BTreeMap::new(),
        next_serial: 0,
    };
    // Alone on this thread until a call needs one of its own.
    let first_call = loop {
        let event = match Message::read(&mut input) {
            Ok(Some(Ok(Message::Request(req)))) if req.method == "tools/call" => break req,
            Ok(Some(incoming)) => Event::Incoming(incoming),
            Ok(None) => Event::InputEnded(Ok(())),
            Err(e) => Event::InputEnded(Err(e)),
        };
        if let Some(exit) = server.on_event(event) {
            return exit;
        }
        if let Some(e) = server.sink.failed() {
            return Err(output_failed(e));
        }
    };

    let signals = signals().map_err(io::Error::other)?;
    let closing = Arc::new(AtomicBool::new(false));
    let reader_events = server.events.clone();
    thread::Builder::new()
        .name("mcp-reader".into())
        .spawn(move || read_loop(input, reader_events))?;
    let output = match std::mem::replace(&mut server.sink, Sink::Gone) {
        Sink::Direct(output) => output,
        _ => return Err(io::Error::other("stdout was lost before the first call")),
    };
    let (writer_tx, writer_rx) = crossbeam_channel::unbounded();
    let (writer_done_tx, writer_done) = crossbeam_channel::bounded::<()>(0);
    let writer_events = server.events.clone();
    let writer_closing = Arc::clone(&closing);
    thread::Builder::new()
        .name("mcp-writer".into())
        .spawn(move || {
            write_loop(output, writer_rx, writer_events, writer_closing);
            drop(writer_done_tx);
        })?;
    server.sink = Sink::Writer(writer_tx);
    server.handle_request(first_call);
    let result = server.run(events_rx, signals);

    // From here on no hook runs: a result still queued may never reach the client.
    closing.store(true, Ordering::SeqCst);
    if !server.inflight.is_empty() {
        info!(
            "exiting with {} call(s) running; cancelling them",
            server.inflight.len()
        );
    }
    // Dropping the loop drops every cancel sender and the writer's only sender.
    drop(server);
    if let Ok(ExitReason::Eof) = result {
        let _ = writer_done.recv_timeout(FLUSH_GRACE);
    }
    result
}

fn output_failed(e: io::Error) -> io::Error {
    let msg = format!("writing MCP output failed: {e}");
    io::Error::new(e.kind(), msg)
}

/// Everything the loop sees, from the reader, the writer and the call threads.
enum Event {
    Incoming(Result<Message, Response>),
    InputEnded(io::Result<()>),
    CallDone {
        id: RequestId,
        serial: u64,
        outcome: ToolOutcome,
    },
    OutputFailed(io::Error),
}

/// One line for the writer (serialized on the loop, newline included) and the
/// hook to run once it is flushed.
struct Outgoing {
    line: Vec<u8>,
    after: Option<AfterWrite>,
}

/// Where the loop's answers go.
enum Sink {
    /// Before the threads start: written and flushed on the loop's thread;
    /// the first failure is kept here and ends the loop.
    Direct(Box<dyn Write + Send>),
    Failed(io::Error),
    /// The writer thread's queue.
    Writer(Sender<Outgoing>),
    /// Only while the sink is being swapped.
    Gone,
}

impl Sink {
    /// The error of a failed direct write, once.
    fn failed(&mut self) -> Option<io::Error> {
        match std::mem::replace(self, Sink::Gone) {
            Sink::Failed(e) => Some(e),
            other => {
                *self = other;
                None
            }
        }
    }
}

/// The `tools/list` answer, built once: the provider's list does not change
/// while the server runs.
struct Listing {
    names: Vec<&'static str>,
    /// The `result` member as JSON text, in pieces (a tool's entry is one
    /// piece, not copied: it goes out in the same `writev`).
    result: Vec<Cow<'static, str>>,
}

impl Listing {
    /// Written as JSON text straight from the definitions: the same text as
    /// serializing `{"tools": [{"name", "description", "inputSchema"}, …]}`
    /// (keys in order), without building that value.
    fn of(tools: &dyn Tools) -> Listing {
        let defs = tools.list();
        let mut result = Vec::with_capacity(2 * defs.len() + 2);
        result.push(Cow::Borrowed(r#"{"tools":["#));
        for (i, t) in defs.iter().enumerate() {
            if i > 0 {
                result.push(Cow::Borrowed(","));
            }
            let mut text = String::new();
            t.write_listed(&mut text);
            result.push(Cow::Owned(text));
        }
        result.push(Cow::Borrowed("]}"));
        Listing {
            names: defs.iter().map(|t| t.name).collect(),
            result,
        }
    }
}

fn read_loop(mut input: impl BufRead, events: Sender<Event>) {
    loop {
        let event = match Message::read(&mut input) {
            Ok(Some(incoming)) => Event::Incoming(incoming),
            Ok(None) => Event::InputEnded(Ok(())),
            Err(e) => Event::InputEnded(Err(e)),
        };
        let last = matches!(event, Event::InputEnded(_));
        if events.send(event).is_err() || last {
            return;
        }
    }
}

fn write_loop(
    mut output: Box<dyn Write + Send>,
    outgoing: Receiver<Outgoing>,
    events: Sender<Event>,
    closing: Arc<AtomicBool>,
) {
    for Outgoing { line, after } in outgoing {
        if let Err(e) = output.write_all(&line).and_then(|_| output.flush()) {
            // The hook, if any, is dropped unrun; so is everything still queued.
            let _ = events.send(Event::OutputFailed(e));
            return;
        }
        let Some(after) = after else { continue };
        if closing.load(Ordering::SeqCst) {
            debug!("not running a post-write hook: the server is exiting");
        } else if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(after)) {
            error!("a post-write hook panicked: {}", panic_text(&*payload));
        }
    }
}

/// A call thread that is running.
struct Inflight {
    serial: u64,
    /// Held only to be dropped: that disconnects the call's `CallCtx::cancel`.
    _cancel: Sender<()>,
}

struct Server {
    info: ServerInfo,
    tools: Arc<dyn Tools>,
    listing: Option<Listing>,
    sink: Sink,
    events: Sender<Event>,
    // A map without a random hasher: no `getrandom` before the first answer.
    inflight: BTreeMap<RequestId, Inflight>,
    /// Tells a late result of a cancelled call from a new call reusing its id.
    next_serial: u64,
}

impl Server {
    fn run(
        &mut self,
        events: Receiver<Event>,
        mut signals: Receiver<i32>,
    ) -> io::Result<ExitReason> {
        loop {
            select! {
                recv(events) -> event => {
                    // The loop holds a sender itself, so the channel cannot close.
                    let Ok(event) = event else { return Ok(ExitReason::Eof) };
                    if let Some(exit) = self.on_event(event) {
                        return exit;
                    }
                }
                recv(signals) -> sig => match sig {
                    Ok(sig) => return Ok(ExitReason::Signal(sig)),
                    Err(_) => signals = never(),
                },
            }
        }
    }

    /// Handles one event; `Some` ends the loop with that result.
    fn on_event(&mut self, event: Event) -> Option<io::Result<ExitReason>> {
        match event {
            Event::Incoming(Ok(msg)) => self.handle(msg),
            Event::Incoming(Err(reply)) => {
                let why = reply.error.as_ref().map_or("", |e| &e.message);
                warn!("bad input: {why}");
                self.send(reply, None);
            }
            Event::InputEnded(Ok(())) => {
                info!("stdin closed");
                return Some(Ok(ExitReason::Eof));
            }
            Event::InputEnded(Err(e)) => {
                let msg = format!("reading MCP input failed: {e}");
                return Some(Err(io::Error::new(e.kind(), msg)));
            }
            Event::CallDone {
                id,
                serial,
                outcome,
            } => self.finish_call(id, serial, outcome),
            Event::OutputFailed(e) => return Some(Err(output_failed(e))),
        }
        None
    }

    fn send(&mut self, response: Response, after: Option<AfterWrite>) {
        match Message::from(response).line() {
            Ok(line) => self.send_line(line, after),
            Err(e) => error!("cannot serialize a response: {e}"),
        }
    }

    /// Sends one serialized line: written here before the threads start, else
    /// queued for the writer.
    fn send_line(&mut self, line: Vec<u8>, after: Option<AfterWrite>) {
        match &mut self.sink {
            Sink::Direct(out) => {
                if let Err(e) = out.write_all(&line).and_then(|_| out.flush()) {
                    self.sink = Sink::Failed(e);
                }
                // Only tool results carry hooks, and none runs before the threads.
                debug_assert!(after.is_none());
            }
            Sink::Writer(tx) => {
                if tx.send(Outgoing { line, after }).is_err() {
                    debug!("the writer is gone; dropping a response");
                }
            }
            Sink::Failed(_) | Sink::Gone => debug!("stdout failed; dropping a response"),
        }
    }

    fn listing(&mut self) -> &Listing {
        self.listing
            .get_or_insert_with(|| Listing::of(&*self.tools))
    }

    fn handle(&mut self, msg: Message) {
        match msg {
            Message::Request(req) => self.handle_request(req),
            Message::Notification(note) => self.handle_notification(note),
            Message::Response(resp) => debug!("ignoring a response to id {:?}", resp.id),
        }
    }

    fn handle_request(&mut self, req: Request) {
        let Request { id, method, params } = req;
        let result = match method.as_str() {
            "initialize" => return self.initialize(&id, &params),
            "ping" => json!({}),
            "tools/list" => return self.tools_list(&id),
            "tools/call" => return self.start_call(id, params),
            _ => {
                let msg = format!("Method not found: {method}");
                return self.send(Response::err(Some(id), METHOD_NOT_FOUND, msg), None);
            }
        };
        self.send(Response::ok(id, result), None);
    }

    fn handle_notification(&mut self, note: Notification) {
        match note.method.as_str() {
            "notifications/initialized" => debug!("client initialized"),
            "notifications/cancelled" => self.cancel(&note.params),
            other => debug!("ignoring notification {other}"),
        }
    }

    fn initialize(&mut self, id: &RequestId, params: &Value) {
        let asked = params.get("protocolVersion").and_then(Value::as_str);
        let version = negotiate(asked);
        info!(
            "initialize from {}: asked protocol {asked:?}, answering {version}",
            params.get("clientInfo").unwrap_or(&Value::Null)
        );
        let result = initialize_result(&self.info, version);
        if let Some(head) = result_head(id) {
            let mut line = head.into_bytes();
            line.extend_from_slice(result.as_bytes());
            line.extend_from_slice(b"}\n");
            self.send_line(line, None);
        }
    }

    /// The kept listing in a response line, as `Message::line` would write it.
    /// Before the threads start it goes out in one `writev` of the line's
    /// head, the listing's pieces and the tail, not copied into a line of its
    /// own.
    fn tools_list(&mut self, id: &RequestId) {
        let Some(head) = result_head(id) else { return };
        let tools = &*self.tools;
        let result = &self
            .listing
            .get_or_insert_with(|| Listing::of(tools))
            .result;
        let parts: Vec<&[u8]> = std::iter::once(head.as_bytes())
            .chain(result.iter().map(|p| p.as_bytes()))
            .chain(std::iter::once(&b"}\n"[..]))
            .collect();
        if let Sink::Direct(out) = &mut self.sink {
            if let Err(e) = write_parts(out, &parts) {
                self.sink = Sink::Failed(e);
            }
            return;
        }
        let line = parts.concat();
        self.send_line(line, None);
    }

    fn start_call(&mut self, id: RequestId, params: Value) {
        let invalid = |msg: String| Response::err(Some(id.clone()), INVALID_PARAMS, msg);
        let (name, args) = match call_params(&params) {
            Ok(parsed) => parsed,
            Err(msg) => return self.send(invalid(msg), None),
        };
        if !self.listing().names.contains(&name.as_str()) {
            return self.send(invalid(format!("unknown tool: {name}")), None);
        }
        if self.inflight.contains_key(&id) {
            let msg = format!("Invalid Request: id {id} is already used by a running call");
            return self.send(Response::err(Some(id), INVALID_REQUEST, msg), None);
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        let (ctx, cancel) = CallCtx::new(id.clone());
        let tools = Arc::clone(&self.tools);
        let events = self.events.clone();
        let thread_name = format!("mcp-call-{name}");
        let spawned = thread::Builder::new().name(thread_name).spawn(move || {
            let outcome = run_tool(&*tools, &name, args, &ctx);
            let id = ctx.id.clone();
            // A closed channel means the server has exited; the result is dropped.
            let _ = events.send(Event::CallDone {
                id,
                serial,
                outcome,
            });
        });
        match spawned {
            Ok(_) => {
                self.inflight.insert(
                    id,
                    Inflight {
                        serial,
                        _cancel: cancel,
                    },
                );
            }
            Err(e) => {
                let msg = format!("could not start a thread for the call: {e}");
                self.send(Response::err(Some(id), INTERNAL_ERROR, msg), None);
            }
        }
    }

    fn cancel(&mut self, params: &Value) {
        let reason = params.get("reason").and_then(Value::as_str).unwrap_or("");
        let Some(id) = params.get("requestId").and_then(RequestId::from_value) else {
            warn!("ignoring notifications/cancelled without a usable requestId: {params}");
            return;
        };
        match self.inflight.remove(&id) {
            Some(_) => info!("call {id} cancelled by the client: {reason}"),
            None => debug!("cancel for call {id}, which is not running: {reason}"),
        }
    }

    fn finish_call(&mut self, id: RequestId, serial: u64, outcome: ToolOutcome) {
        match self.inflight.get(&id) {
            Some(call) if call.serial == serial => {
                self.inflight.remove(&id);
            }
            _ => {
                debug!("dropping the result of cancelled call {id}");
                return;
            }
        }
        let (result, after) = match outcome {
            ToolOutcome::Ok(text) => (text_result(text, false), None),
            ToolOutcome::OkThen(text, after) => (text_result(text, false), Some(after)),
            ToolOutcome::Err(text) | ToolOutcome::InvalidParams(text) => {
                (text_result(text, true), None)
            }
        };
        self.send(Response::ok(id, result), after);
    }
}

/// The start of a response line to `id` up to its `result` member's value:
/// what `Message::line` writes before it. `None` (logged) if the id cannot be
/// written.
fn result_head(id: &RequestId) -> Option<String> {
    match serde_json::to_string(id) {
        Ok(id) => Some(format!(r#"{{"jsonrpc":"2.0","id":{id},"result":"#)),
        Err(e) => {
            error!("cannot serialize id {id}: {e}");
            None
        }
    }
}

/// The `result` of an `initialize` answered with protocol `version`, as JSON
/// text: the same text as serializing `{"protocolVersion", "capabilities",
/// "serverInfo", "instructions"}` (keys in order), without building that value.
fn initialize_result(info: &ServerInfo, version: &str) -> String {
    let extra = info.instructions.as_ref().map_or(0, String::len);
    let mut r = String::with_capacity(160 + extra);
    r.push_str(r#"{"capabilities":{"tools":{"listChanged":false}},"#);
    if let Some(instructions) = &info.instructions {
        r.push_str(r#""instructions":"#);
        push_json_str(&mut r, instructions);
        r.push(',');
    }
    r.push_str(r#""protocolVersion":"#);
    push_json_str(&mut r, version);
    r.push_str(r#","serverInfo":{"name":"#);
    push_json_str(&mut r, &info.name);
    r.push_str(r#","version":"#);
    push_json_str(&mut r, &info.version);
    r.push_str("}}");
    r
}

/// Writes `parts` as one line with as few `write`s as `out` allows (one
/// `writev` on stdout) and flushes.
fn write_parts(out: &mut dyn Write, parts: &[&[u8]]) -> io::Result<()> {
    let mut slices: Vec<io::IoSlice> = parts.iter().map(|p| io::IoSlice::new(p)).collect();
    let mut rest = &mut slices[..];
    io::IoSlice::advance_slices(&mut rest, 0);
    while !rest.is_empty() {
        match out.write_vectored(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    out.flush()
}

/// The answer to an `initialize` asking for `asked`.
fn negotiate(asked: Option<&str>) -> &'static str {
    SUPPORTED_PROTOCOL_VERSIONS
        .iter()
        .find(|v| Some(**v) == asked)
        .unwrap_or(&SUPPORTED_PROTOCOL_VERSIONS[0])
}

/// Reads `name` and `arguments` of a `tools/call`; absent or null arguments are `{}`.
fn call_params(params: &Value) -> Result<(String, Value), String> {
    let Some(params) = params.as_object() else {
        return Err("tools/call params must be an object with \"name\" and \"arguments\"".into());
    };
    let name = match params.get("name") {
        Some(Value::String(name)) => name.clone(),
        None => return Err("tools/call is missing \"name\"".into()),
        Some(_) => return Err("tools/call \"name\" must be a string".into()),
    };
    let args = match params.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(args @ Value::Object(_)) => args.clone(),
        Some(_) => return Err("tools/call \"arguments\" must be an object".into()),
    };
    Ok((name, args))
}

fn text_result(text: String, is_error: bool) -> Value {
    let mut result = json!({ "content": [{"type": "text", "text": text}] });
    if is_error {
        result["isError"] = Value::Bool(true);
    }
    result
}

/// The envelope around every tool call: logs the request and the result and turns
/// a panic into an error result the model can read.
fn run_tool(tools: &dyn Tools, name: &str, args: Value, ctx: &CallCtx) -> ToolOutcome {
    debug!("call {} {name} <- {}", ctx.id, clip(&args.to_string()));
    let started = Instant::now();
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| tools.call(name, args, ctx)))
        .unwrap_or_else(|payload| {
            let what = panic_text(&*payload);
            error!("tool {name} panicked in call {}: {what}", ctx.id);
            ToolOutcome::Err(format!(
                "tool \"{name}\" panicked: {what}. This is a bug in hive; the server is \
                 still running, so other tools keep working."
            ))
        });
    debug!(
        "call {} {name} -> {} after {:?}",
        ctx.id,
        clip(&format!("{outcome:?}")),
        started.elapsed()
    );
    outcome
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".into()
    }
}

fn clip(text: &str) -> &str {
    match text.char_indices().nth(LOG_CLIP) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

#[cfg(test)]
mod tests;
