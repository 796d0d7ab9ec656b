//! A fake Anthropic Messages API on 127.0.0.1 for driving the real Claude Code CLI
//! in tests. It owns a tiny_http server, a scripted [`Scenario`] that decides what
//! each `POST /v1/messages` gets, and the log of every request the CLI sent.
//!
//! The CLI talks to it exactly as it talks to the real API
//! (`shared/reference/claude-cli-2.1.197.md`): one `HEAD /` warm-up per process,
//! then `POST /v1/messages?beta=true` with `stream: true`, answered here with a
//! complete server-sent-event stream or with an error in the API's JSON shape.
//! Compaction requests are ordinary message requests whose last user message asks
//! to "create a detailed summary of the conversation"; they are recorded as
//! [`RequestKind::Compact`] and can be answered automatically.
//!
//! Any answer may carry response headers, fixed or naming unix seconds a
//! given time after it is sent: the unified rate-limit headers an OAuth
//! subscriber's answers carry ([`Step::usage_limit_reached`],
//! [`Step::near_usage_limit`]), which the CLI turns into `rate_limit_event`
//! lines. Each recorded request keeps the headers its answer carried.
//!
//! One accept thread hands each request to a short-lived handler thread, so a
//! [`Reply::Hang`] never blocks the requests after it. Dropping the
//! [`FakeAnthropic`] releases hung handlers, stops the accept thread and joins
//! everything.

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{Read, Write as _};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::fd::{BorrowedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tiny_http::{Header, Method, Request, Response, Server};

/// The phrase that marks a compaction request, as the CLI words it.
const COMPACT_MARKER: &str = "create a detailed summary of the conversation";

/// Request headers worth keeping in a [`RecordedRequest`].
const RECORDED_HEADERS: &[&str] = &[
    "anthropic-beta",
    "anthropic-version",
    "content-type",
    "user-agent",
    "x-api-key",
    "x-claude-code-session-id",
    "x-stainless-retry-count",
];

/// Largest request body read; the CLI's own limit is 32 MB.
const MAX_BODY: u64 = 64 * 1024 * 1024;

/// Token counts reported for one answer. The CLI takes the context size from
/// `input_tokens + cache_read_input_tokens + cache_creation_input_tokens` of the
/// `message_start` event, so tests of context limits set those.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub input_tokens: u64,
    pub cache_read_input_tokens: u64,
    pub cache_creation_input_tokens: u64,
    pub output_tokens: u64,
}

impl Default for Usage {
    fn default() -> Usage {
        Usage {
            input_tokens: 100,
            cache_read_input_tokens: 0,
            cache_creation_input_tokens: 0,
            output_tokens: 10,
        }
    }
}

/// The `error.type` of an API error body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    InvalidRequest,
    Authentication,
    Permission,
    RateLimit,
    Api,
    Overloaded,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::InvalidRequest => "invalid_request_error",
            ErrorType::Authentication => "authentication_error",
            ErrorType::Permission => "permission_error",
            ErrorType::RateLimit => "rate_limit_error",
            ErrorType::Api => "api_error",
            ErrorType::Overloaded => "overloaded_error",
        }
    }
}

/// An HTTP error answer: `{"type":"error","error":{"type":..,"message":..}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub error_type: ErrorType,
    pub message: String,
    /// Extra response headers, e.g. `retry-after` or `x-should-retry`.
    pub headers: Vec<(String, String)>,
}

/// The value of a response header a [`Step`] adds.
#[derive(Debug, Clone, PartialEq)]
pub enum HeaderValue {
    Text(String),
    /// Unix seconds this many seconds after the answer is sent (a reset time).
    SecondsAhead(i64),
}

impl HeaderValue {
    fn resolve(&self, now: i64) -> String {
        match self {
            HeaderValue::Text(t) => t.clone(),
            HeaderValue::SecondsAhead(n) => (now + n).to_string(),
        }
    }
}

/// What one request is answered with.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// One text block, `stop_reason: end_turn`.
    Text(String),
    /// One `tool_use` block, `stop_reason: tool_use`. The CLI runs the tool and
    /// sends the `tool_result` in its next request, which gets the next step.
    ToolUse { name: String, input: Value },
    /// A compaction answer: `<analysis>…</analysis>` then `<summary>SUMMARY</summary>`.
    Compact(String),
    /// An HTTP error with a JSON error body.
    Error(ApiError),
    /// No answer at all until the fake is dropped.
    Hang,
    /// A stream that stops: `200`, `message_start`, a text block started
    /// with one delta of this text (with `after_block`, that block finished
    /// and a second one started), then nothing more until the fake is
    /// dropped, the connection kept open. A `"stream": false` request (the
    /// CLI's fallback after a broken stream) gets the start of a JSON body,
    /// then the same silence.
    Stall { text: String, after_block: bool },
    /// The connection is shut down without an answer.
    Close,
}

/// One scripted answer: a reply and the usage it reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub reply: Reply,
    pub usage: Usage,
    /// Response headers sent with any reply (an error's own headers too).
    pub headers: Vec<(String, HeaderValue)>,
}

impl Step {
    pub fn text(text: impl Into<String>) -> Step {
        Step::from(Reply::Text(text.into()))
    }

    pub fn tool_use(name: impl Into<String>, input: Value) -> Step {
        Step::from(Reply::ToolUse {
            name: name.into(),
            input,
        })
    }

    pub fn compact(summary: impl Into<String>) -> Step {
        Step::from(Reply::Compact(summary.into()))
    }

    pub fn error(status: u16, error_type: ErrorType, message: impl Into<String>) -> Step {
        Step::from(Reply::Error(ApiError {
            status,
            error_type,
            message: message.into(),
            headers: Vec::new(),
        }))
    }

    /// A stream that stops after one delta of `text` (see [`Reply::Stall`]).
    pub fn stall(text: impl Into<String>) -> Step {
        Step::from(Reply::Stall {
            text: text.into(),
            after_block: false,
        })
    }

    /// The 429 the API sends when a per-minute limit is hit.
    pub fn rate_limited() -> Step {
        Step::error(
            429,
            ErrorType::RateLimit,
            "Number of request tokens has exceeded your per-minute rate limit",
        )
    }

    /// The 429 the API sends an OAuth subscriber whose five-hour usage limit
    /// is reached, with the unified rate-limit headers CLI 2.1.197 reads
    /// (`shared/reference/claude-cli-2.1.197.md` §2): status `rejected`, the
    /// reset `secs_ahead` seconds after the answer, claim `five_hour`. The
    /// CLI prints a `rate_limit_event` with `"status":"rejected"` and that
    /// `resetsAt` (OAuth only), then "You've hit your session limit · resets …".
    pub fn usage_limit_reached(secs_ahead: i64) -> Step {
        Step::error(
            429,
            ErrorType::RateLimit,
            "This request would exceed your account's rate limit. Please try again later.",
        )
        .with_response_header("anthropic-ratelimit-unified-status", "rejected")
        .with_reset_header("anthropic-ratelimit-unified-reset", secs_ahead)
        .with_response_header(
            "anthropic-ratelimit-unified-representative-claim",
            "five_hour",
        )
    }

    /// A 429 of a weekly usage limit whose reset only its window names, the
    /// way the user met it: status `rejected`, claim `seven_day`, no
    /// `…-unified-reset`, and the per-window headers `…-7d-{status,reset,
    /// utilization}` (rejected, `secs_ahead` after the answer, 1.0) beside an
    /// allowed five-hour window. CLI 2.1.332 (OAuth) prints a rejected
    /// `rate_limit_event` without `resetsAt` whose `unifiedWindows.seven_day`
    /// carries the reset, and "You've hit your weekly limit" with no time;
    /// 2.1.197 prints no windows at all.
    pub fn weekly_limit_reset_only_in_window(secs_ahead: i64) -> Step {
        Step::error(
            429,
            ErrorType::RateLimit,
            "This request would exceed your account's rate limit. Please try again later.",
        )
        .with_response_header("anthropic-ratelimit-unified-status", "rejected")
        .with_response_header(
            "anthropic-ratelimit-unified-representative-claim",
            "seven_day",
        )
        .with_response_header("anthropic-ratelimit-unified-7d-status", "rejected")
        .with_reset_header("anthropic-ratelimit-unified-7d-reset", secs_ahead)
        .with_response_header("anthropic-ratelimit-unified-7d-utilization", "1.0")
        .with_response_header("anthropic-ratelimit-unified-5h-status", "allowed")
        .with_reset_header("anthropic-ratelimit-unified-5h-reset", secs_ahead / 3)
        .with_response_header("anthropic-ratelimit-unified-5h-utilization", "0.4")
    }

    /// A text answer whose unified rate-limit headers say the five-hour
    /// window is near its limit: status `allowed`, `…-5h-utilization`,
    /// `…-5h-reset` `secs_ahead` seconds after the answer and
    /// `…-5h-surpassed-threshold: 0.9`. CLI 2.1.197 with an OAuth token then
    /// prints `rate_limit_event` `{"status":"allowed_warning","resetsAt":…,
    /// "rateLimitType":"five_hour","utilization":…,"surpassedThreshold":0.9}`.
    pub fn near_usage_limit(text: impl Into<String>, utilization: f64, secs_ahead: i64) -> Step {
        Step::text(text)
            .with_response_header("anthropic-ratelimit-unified-status", "allowed")
            .with_response_header(
                "anthropic-ratelimit-unified-5h-utilization",
                utilization.to_string(),
            )
            .with_reset_header("anthropic-ratelimit-unified-5h-reset", secs_ahead)
            .with_response_header("anthropic-ratelimit-unified-5h-surpassed-threshold", "0.9")
    }

    /// The 400 the API sends when the context is over the model's window.
    pub fn prompt_too_long() -> Step {
        Step::error(
            400,
            ErrorType::InvalidRequest,
            "prompt is too long: 210000 tokens > 200000 maximum",
        )
    }

    pub fn hang() -> Step {
        Step::from(Reply::Hang)
    }

    pub fn close() -> Step {
        Step::from(Reply::Close)
    }

    /// Replaces the usage this step reports.
    pub fn with_usage(mut self, usage: Usage) -> Step {
        self.usage = usage;
        self
    }

    /// Adds a response header to any reply (a [`Reply::Hang`] or
    /// [`Reply::Close`] sends none).
    pub fn with_response_header(
        mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Step {
        self.headers
            .push((name.into(), HeaderValue::Text(value.into())));
        self
    }

    /// Adds a response header whose value is the unix time `secs_ahead`
    /// seconds after the answer is sent.
    pub fn with_reset_header(mut self, name: impl Into<String>, secs_ahead: i64) -> Step {
        self.headers
            .push((name.into(), HeaderValue::SecondsAhead(secs_ahead)));
        self
    }

    /// Adds a response header to an error step; other replies ignore headers.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Step {
        if let Reply::Error(error) = &mut self.reply {
            error.headers.push((name.into(), value.into()));
        }
        self
    }
}

impl From<Reply> for Step {
    fn from(reply: Reply) -> Step {
        Step {
            reply,
            usage: Usage::default(),
            headers: Vec::new(),
        }
    }
}

/// The script: steps consumed one per message request, then a default.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    steps: VecDeque<Step>,
    otherwise: Step,
    auto_compact: Option<Step>,
}

impl Default for Scenario {
    fn default() -> Scenario {
        Scenario {
            steps: VecDeque::new(),
            otherwise: Step::text("ok"),
            auto_compact: None,
        }
    }
}

impl Scenario {
    /// Answers every request with the text "ok".
    pub fn new() -> Scenario {
        Scenario::default()
    }

    /// A scenario that plays `steps` in order, then answers "ok".
    pub fn of(steps: impl IntoIterator<Item = Step>) -> Scenario {
        Scenario::new().then_all(steps)
    }

    /// Queues one more step.
    pub fn then(mut self, step: impl Into<Step>) -> Scenario {
        self.steps.push_back(step.into());
        self
    }

    pub fn then_all(mut self, steps: impl IntoIterator<Item = Step>) -> Scenario {
        self.steps.extend(steps);
        self
    }

    /// Puts a step in front of the queue.
    pub fn first(mut self, step: impl Into<Step>) -> Scenario {
        self.steps.push_front(step.into());
        self
    }

    /// The answer once the queue is empty.
    pub fn otherwise(mut self, step: impl Into<Step>) -> Scenario {
        self.otherwise = step.into();
        self
    }

    /// Answers every compaction request with this summary, without consuming a
    /// queued step; other requests still take the queue in order.
    pub fn auto_compact(mut self, summary: impl Into<String>) -> Scenario {
        self.auto_compact = Some(Step::compact(summary));
        self
    }

    /// Answers every compaction request with `step` (an error, typically),
    /// without consuming a queued one.
    pub fn compact_always(mut self, step: impl Into<Step>) -> Scenario {
        self.auto_compact = Some(step.into());
        self
    }

    /// The step for a request of `kind`, consuming a queued one unless an
    /// automatic compaction answer applies.
    fn next_step(&mut self, kind: RequestKind) -> Step {
        if kind == RequestKind::Compact {
            if let Some(step) = &self.auto_compact {
                return step.clone();
            }
        }
        self.steps
            .pop_front()
            .unwrap_or_else(|| self.otherwise.clone())
    }
}

/// What a request was, as the fake understood it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// The CLI's `HEAD /` connection warm-up.
    Warmup,
    /// `POST /v1/messages` for a normal model turn.
    Messages,
    /// `POST /v1/messages` asking for a conversation summary.
    Compact,
    /// Anything else; answered 404.
    Other,
}

/// One request as the CLI sent it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// The URL path with its query, e.g. `/v1/messages?beta=true`.
    pub path: String,
    /// The headers named in `RECORDED_HEADERS`, lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The parsed JSON body; `Value::Null` when there was none or it was not JSON.
    pub body: Value,
    pub kind: RequestKind,
    /// When the request arrived, for measuring retry gaps.
    pub at: Instant,
    /// When the request arrived, as wall-clock time (to compare with a reset).
    pub wall: SystemTime,
    /// The headers the [`Step`] that answered it added, with their values
    /// as sent.
    pub answered_headers: Vec<(String, String)>,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// The `messages` array of a message request; empty for anything else.
    pub fn messages(&self) -> &[Value] {
        self.body["messages"].as_array().map_or(&[], Vec::as_slice)
    }

    /// Every text the request carries for `role` ("user" or "assistant"), one
    /// entry per text block, in order.
    pub fn texts(&self, role: &str) -> Vec<String> {
        self.messages()
            .iter()
            .filter(|message| message["role"] == role)
            .flat_map(message_texts)
            .collect()
    }

    /// Whether any message of the request contains `needle` in a text block.
    pub fn mentions(&self, needle: &str) -> bool {
        ["user", "assistant"]
            .iter()
            .flat_map(|role| self.texts(role))
            .any(|text| text.contains(needle))
    }

    /// A header the answer carried (one a [`Step`] added).
    pub fn answered_header(&self, name: &str) -> Option<&str> {
        self.answered_headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }

    /// Unix seconds when it arrived.
    pub fn unix(&self) -> f64 {
        unix_now(self.wall)
    }

    pub fn is_post(&self) -> bool {
        matches!(self.kind, RequestKind::Messages | RequestKind::Compact)
    }
}

/// The fake API server. Stops when dropped.
pub struct FakeAnthropic {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    server: Arc<Server>,
    /// Never sent on; dropping it releases hung handlers and ends the acceptor.
    stop: Option<Sender<()>>,
    acceptor: Option<JoinHandle<()>>,
}

struct State {
    scenario: Scenario,
    requests: Vec<RecordedRequest>,
    answered: u64,
}

impl FakeAnthropic {
    /// Binds 127.0.0.1 on a free port and starts serving `scenario`.
    pub fn start(scenario: Scenario) -> FakeAnthropic {
        let server = Server::http("127.0.0.1:0")
            .unwrap_or_else(|err| panic!("fake Anthropic API: cannot bind 127.0.0.1:0: {err}"));
        let addr = server
            .server_addr()
            .to_ip()
            .expect("a tiny_http server bound to an IP address has an IP address");
        let server = Arc::new(server);
        let state = Arc::new(Mutex::new(State {
            scenario,
            requests: Vec::new(),
            answered: 0,
        }));
        let (stop, stopped) = crossbeam_channel::bounded(0);
        let acceptor = thread::Builder::new()
            .name("fake-anthropic-accept".into())
            .spawn({
                let server = Arc::clone(&server);
                let state = Arc::clone(&state);
                move || accept_loop(&server, &state, &stopped)
            })
            .expect("spawning the fake API's accept thread");
        FakeAnthropic {
            addr,
            state,
            server,
            stop: Some(stop),
            acceptor: Some(acceptor),
        }
    }

    /// `http://127.0.0.1:PORT`, for `ANTHROPIC_BASE_URL`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// The message and compaction requests received so far.
    pub fn posts(&self) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(RecordedRequest::is_post)
            .collect()
    }

    /// Replaces the script; requests that arrive from now on follow it.
    pub fn set_scenario(&self, scenario: Scenario) {
        self.lock().scenario = scenario;
    }

    /// Waits until at least `count` requests arrived, or `timeout` passed, and
    /// returns what arrived.
    pub fn wait_for_requests(&self, count: usize, timeout: Duration) -> Vec<RecordedRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            let requests = self.requests();
            if requests.len() >= count || Instant::now() >= deadline {
                return requests;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl Drop for FakeAnthropic {
    fn drop(&mut self) {
        drop(self.stop.take());
        self.server.unblock();
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

/// A handler that panicked must not take the rest of the test's asserts with it.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn accept_loop(server: &Server, state: &Arc<Mutex<State>>, stopped: &Receiver<()>) {
    let mut handlers = Vec::new();
    loop {
        match server.recv() {
            Ok(request) => {
                let state = Arc::clone(state);
                let stopped = stopped.clone();
                let handler = thread::Builder::new()
                    .name("fake-anthropic-request".into())
                    .spawn(move || handle(request, &state, &stopped))
                    .expect("spawning a fake API request thread");
                handlers.push(handler);
            }
            // `unblock` and accept errors look alike; only the stop signal ends us.
            Err(_) if is_stopped(stopped) => break,
            Err(err) => eprintln!("fake Anthropic API: accept failed: {err}"),
        }
    }
    for handler in handlers {
        let _ = handler.join();
    }
}

fn is_stopped(stopped: &Receiver<()>) -> bool {
    matches!(stopped.try_recv(), Err(TryRecvError::Disconnected))
}

fn handle(mut request: Request, state: &Mutex<State>, stopped: &Receiver<()>) {
    let method = request.method().clone();
    let path = request.url().to_string();
    let headers = recorded_headers(&request);
    let mut raw = String::new();
    if let Err(err) = request.as_reader().take(MAX_BODY).read_to_string(&mut raw) {
        eprintln!("fake Anthropic API: reading the body of {method} {path} failed: {err}");
    }
    let body = serde_json::from_str(&raw).unwrap_or(Value::Null);
    let kind = classify(&method, &path, &body);

    let (step, number, extra) = {
        let mut state = lock(state);
        let wall = SystemTime::now();
        let (step, number) = match kind {
            RequestKind::Messages | RequestKind::Compact => {
                state.answered += 1;
                (Some(state.scenario.next_step(kind)), state.answered)
            }
            RequestKind::Warmup | RequestKind::Other => (None, 0),
        };
        let sent_at = unix_now(wall).floor() as i64;
        let extra: Vec<(String, String)> = step
            .iter()
            .flat_map(|step| &step.headers)
            .map(|(name, value)| (name.clone(), value.resolve(sent_at)))
            .collect();
        state.requests.push(RecordedRequest {
            method: method.to_string(),
            path,
            headers,
            body: body.clone(),
            kind,
            at: Instant::now(),
            wall,
            answered_headers: extra.clone(),
        });
        (step, number, extra)
    };

    let Some(step) = step else {
        let status = if kind == RequestKind::Warmup {
            200
        } else {
            404
        };
        let _ = request.respond(Response::empty(status));
        return;
    };
    let model = body["model"].as_str().unwrap_or("claude-sonnet-4-5");
    let ids = Ids::new(number);
    // 2.1.332 sends `"stream": false` once a stream broke (2.1.197 leaves
    // `stream` out then): the answer is one JSON message, not events.
    let streaming = body["stream"].as_bool().unwrap_or(false);
    if !streaming {
        let _ = respond_whole(request, &ids, model, step, &extra, stopped);
        return;
    }
    // A gone client is a normal outcome for a fake: the CLI may have been killed.
    let _ = match step.reply {
        Reply::Text(text) => respond_sse(
            request,
            &ids,
            &text_stream(&ids, model, &text, step.usage),
            &extra,
        ),
        Reply::Compact(summary) => {
            let text = format!(
                "<analysis>The fake API summarises without analysing.</analysis>\n<summary>{summary}</summary>"
            );
            respond_sse(
                request,
                &ids,
                &text_stream(&ids, model, &text, step.usage),
                &extra,
            )
        }
        Reply::ToolUse { name, input } => respond_sse(
            request,
            &ids,
            &tool_use_stream(&ids, model, &name, &input, step.usage),
            &extra,
        ),
        Reply::Error(error) => respond_error(request, &ids, &error, &extra),
        Reply::Hang => {
            // Returns only when the fake is dropped and the sender with it.
            let _ = stopped.recv();
            Ok(())
        }
        Reply::Close => {
            shut_down_connection(&request);
            Ok(())
        }
        Reply::Stall { text, after_block } => {
            let mut events = text_start(&ids, model, &text, step.usage);
            if after_block {
                events.push(json!({"type": "content_block_stop", "index": 0}));
                events.push(json!({
                    "type": "content_block_start",
                    "index": 1,
                    "content_block": {"type": "text", "text": ""}
                }));
                events.push(json!({
                    "type": "content_block_delta",
                    "index": 1,
                    "delta": {"type": "text_delta", "text": "and then"}
                }));
            }
            let mut head = String::from(
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n\
                 Cache-Control: no-cache\r\nConnection: close\r\n",
            );
            let _ = write!(head, "request-id: {}\r\n", ids.request);
            for (name, value) in &extra {
                let _ = write!(head, "{name}: {value}\r\n");
            }
            head.push_str("\r\n");
            for event in &events {
                let name = event["type"].as_str().unwrap_or("message");
                let _ = write!(head, "event: {name}\ndata: {event}\n\n");
            }
            stall_after(request, &head, stopped)
        }
    };
}

/// Writes `bytes` raw on the connection (a response the client has only
/// part of), flushes it, then holds the connection open until the fake is
/// dropped.
fn stall_after(request: Request, bytes: &str, stopped: &Receiver<()>) -> std::io::Result<()> {
    let mut writer = request.into_writer();
    writer.write_all(bytes.as_bytes())?;
    writer.flush()?;
    let _ = stopped.recv();
    Ok(())
}

/// The answer to a `"stream": false` request: the step's message as one JSON
/// body, an error as usual, and the start of a body then silence for a stall.
fn respond_whole(
    request: Request,
    ids: &Ids,
    model: &str,
    step: Step,
    extra: &[(String, String)],
    stopped: &Receiver<()>,
) -> std::io::Result<()> {
    let message = |content: Value, stop_reason: &str| {
        json!({
            "id": ids.message,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": null,
            "usage": {
                "input_tokens": step.usage.input_tokens,
                "cache_read_input_tokens": step.usage.cache_read_input_tokens,
                "cache_creation_input_tokens": step.usage.cache_creation_input_tokens,
                "output_tokens": step.usage.output_tokens
            }
        })
    };
    let body = match &step.reply {
        Reply::Text(text) => message(json!([{"type": "text", "text": text}]), "end_turn"),
        Reply::Compact(summary) => message(
            json!([{"type": "text", "text": format!(
                "<analysis>The fake API summarises without analysing.</analysis>\n<summary>{summary}</summary>"
            )}]),
            "end_turn",
        ),
        Reply::ToolUse { name, input } => message(
            json!([{"type": "tool_use", "id": ids.tool_use, "name": name, "input": input}]),
            "tool_use",
        ),
        Reply::Error(error) => return respond_error(request, ids, error, extra),
        Reply::Hang => {
            let _ = stopped.recv();
            return Ok(());
        }
        Reply::Close => {
            shut_down_connection(&request);
            return Ok(());
        }
        Reply::Stall { .. } => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\
                 request-id: {}\r\n\r\n{{\"id\":\"{}\",\"type\":\"message\",",
                ids.request, ids.message
            );
            return stall_after(request, &head, stopped);
        }
    };
    let mut response = Response::from_string(body.to_string())
        .with_header(header("Content-Type", "application/json"))
        .with_header(header("request-id", &ids.request));
    for (name, value) in extra {
        response.add_header(header(name, value));
    }
    request.respond(response)
}

fn recorded_headers(request: &Request) -> Vec<(String, String)> {
    request
        .headers()
        .iter()
        .map(|header| {
            (
                header.field.as_str().as_str().to_ascii_lowercase(),
                header.value.to_string(),
            )
        })
        .filter(|(name, _)| RECORDED_HEADERS.contains(&name.as_str()))
        .collect()
}

fn classify(method: &Method, path: &str, body: &Value) -> RequestKind {
    let route = path.split('?').next().unwrap_or(path);
    match (method, route) {
        (Method::Head, "/") => RequestKind::Warmup,
        (Method::Post, "/v1/messages") if is_compaction(body) => RequestKind::Compact,
        (Method::Post, "/v1/messages") => RequestKind::Messages,
        _ => RequestKind::Other,
    }
}

/// True when the last user message asks for a conversation summary.
fn is_compaction(body: &Value) -> bool {
    body["messages"]
        .as_array()
        .and_then(|messages| {
            messages
                .iter()
                .rev()
                .find(|message| message["role"] == "user")
        })
        .is_some_and(|message| {
            message_texts(message)
                .iter()
                .any(|text| text.contains(COMPACT_MARKER))
        })
}

/// The texts of one message, whose `content` is a string or a list of blocks.
fn message_texts(message: &Value) -> Vec<String> {
    match &message["content"] {
        Value::String(text) => vec![text.clone()],
        Value::Array(blocks) => blocks
            .iter()
            .filter(|block| block["type"] == "text")
            .filter_map(|block| block["text"].as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// The identifiers of the n-th answer, which show up in the CLI's stdout.
struct Ids {
    message: String,
    request: String,
    tool_use: String,
}

impl Ids {
    fn new(number: u64) -> Ids {
        Ids {
            message: format!("msg_fake_{number}"),
            request: format!("req_fake_{number}"),
            tool_use: format!("toolu_fake_{number}"),
        }
    }
}

fn text_stream(ids: &Ids, model: &str, text: &str, usage: Usage) -> Vec<Value> {
    let mut events = text_start(ids, model, text, usage);
    events.push(json!({"type": "content_block_stop", "index": 0}));
    events.extend(message_end("end_turn", usage));
    events
}

/// The start of a text answer: the message and its text block begun, with
/// `text` as its one delta (a stall stops here).
fn text_start(ids: &Ids, model: &str, text: &str, usage: Usage) -> Vec<Value> {
    vec![
        message_start(ids, model, usage),
        json!({
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""}
        }),
        json!({"type": "ping"}),
        json!({
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text}
        }),
    ]
}

fn tool_use_stream(ids: &Ids, model: &str, name: &str, input: &Value, usage: Usage) -> Vec<Value> {
    let mut events = vec![message_start(ids, model, usage)];
    events.push(json!({
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "tool_use", "id": ids.tool_use, "name": name, "input": {}}
    }));
    events.push(json!({
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "input_json_delta", "partial_json": input.to_string()}
    }));
    events.push(json!({"type": "content_block_stop", "index": 0}));
    events.extend(message_end("tool_use", usage));
    events
}

fn message_start(ids: &Ids, model: &str, usage: Usage) -> Value {
    json!({
        "type": "message_start",
        "message": {
            "id": ids.message,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [],
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {
                "input_tokens": usage.input_tokens,
                "cache_read_input_tokens": usage.cache_read_input_tokens,
                "cache_creation_input_tokens": usage.cache_creation_input_tokens,
                "output_tokens": 1
            }
        }
    })
}

fn message_end(stop_reason: &str, usage: Usage) -> [Value; 2] {
    [
        json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": {"output_tokens": usage.output_tokens}
        }),
        json!({"type": "message_stop"}),
    ]
}

/// Sends the whole stream at once. The CLI parses events as they arrive, so a
/// complete body is a valid stream; nothing here waits between events.
fn respond_sse(
    request: Request,
    ids: &Ids,
    events: &[Value],
    extra: &[(String, String)],
) -> std::io::Result<()> {
    let mut body = String::new();
    for event in events {
        let name = event["type"].as_str().unwrap_or("message");
        let _ = write!(body, "event: {name}\ndata: {event}\n\n");
    }
    let mut response = Response::from_string(body)
        .with_header(header("Content-Type", "text/event-stream; charset=utf-8"))
        .with_header(header("Cache-Control", "no-cache"))
        .with_header(header("request-id", &ids.request));
    for (name, value) in extra {
        response.add_header(header(name, value));
    }
    request.respond(response)
}

fn respond_error(
    request: Request,
    ids: &Ids,
    error: &ApiError,
    extra: &[(String, String)],
) -> std::io::Result<()> {
    let body = json!({
        "type": "error",
        "error": {"type": error.error_type.as_str(), "message": error.message},
        "request_id": ids.request,
    });
    let mut response = Response::from_string(body.to_string())
        .with_status_code(error.status)
        .with_header(header("Content-Type", "application/json"))
        .with_header(header("request-id", &ids.request));
    for (name, value) in error.headers.iter().chain(extra) {
        response.add_header(header(name, value));
    }
    request.respond(response)
}

fn unix_now(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn header(name: &str, value: &str) -> Header {
    Header::from_bytes(name.as_bytes(), value.as_bytes())
        .unwrap_or_else(|()| panic!("fake Anthropic API: invalid header {name}: {value}"))
}

/// Shuts down the TCP connection `request` came on, so the client sees it drop
/// with no answer. tiny_http does not expose the socket, so this finds it among
/// the process's descriptors by its peer address (the client's ephemeral port,
/// which only this connection has) and shuts down a duplicate of it; `shutdown`
/// acts on the socket, not on the descriptor.
fn shut_down_connection(request: &Request) {
    let Some(peer) = request.remote_addr().copied() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        eprintln!("fake Anthropic API: cannot list /proc/self/fd to close a connection");
        return;
    };
    for entry in entries.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<RawFd>().ok())
        else {
            continue;
        };
        // SAFETY: the descriptor is only duplicated; if it was closed meanwhile the
        // duplication fails, and a reused number is filtered out by the peer check.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let Ok(owned) = borrowed.try_clone_to_owned() else {
            continue;
        };
        let stream = TcpStream::from(owned);
        if stream.peer_addr().is_ok_and(|addr| addr == peer) {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    }
}
