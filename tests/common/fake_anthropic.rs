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
//!
//! Opt-in, for the cost bench: a prompt-cache model ([`PromptCache`], on a
//! [`VirtualClock`]) that bills each answer and reports that bill as its
//! `usage`, and a [`Responder`] that answers from the request body.

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
    /// The 5-minute / 1-hour split of `usage.cache_creation_input_tokens`,
    /// reported as `usage.cache_creation` when set (the cache model sets it).
    pub cache_creation: Option<CacheCreation>,
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

impl Step {
    fn reported(&self) -> Reported {
        Reported {
            usage: self.usage,
            split: self.cache_creation,
        }
    }
}

/// `usage.cache_creation` of an answer: the cache writes by lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheCreation {
    pub ephemeral_5m_input_tokens: u64,
    pub ephemeral_1h_input_tokens: u64,
}

/// The usage an answer reports, as sent.
#[derive(Debug, Clone, Copy)]
struct Reported {
    usage: Usage,
    split: Option<CacheCreation>,
}

impl Reported {
    /// The `usage` object with `output_tokens` as given (`message_start`
    /// reports 1, the final count comes in `message_delta`).
    fn json(&self, output_tokens: u64) -> Value {
        let mut usage = json!({
            "input_tokens": self.usage.input_tokens,
            "cache_read_input_tokens": self.usage.cache_read_input_tokens,
            "cache_creation_input_tokens": self.usage.cache_creation_input_tokens,
            "output_tokens": output_tokens
        });
        if let Some(split) = self.split {
            usage["cache_creation"] = json!({
                "ephemeral_5m_input_tokens": split.ephemeral_5m_input_tokens,
                "ephemeral_1h_input_tokens": split.ephemeral_1h_input_tokens,
            });
        }
        usage
    }
}

impl From<Reply> for Step {
    fn from(reply: Reply) -> Step {
        Step {
            reply,
            usage: Usage::default(),
            headers: Vec::new(),
            cache_creation: None,
        }
    }
}

/// A model written as a function: the answer to each message or compaction
/// request, decided from its body (see [`Scenario::respond_with`]).
#[derive(Clone)]
pub struct Responder(Arc<RespondFn>);

/// What a [`Responder`] calls: the request body and its kind to an answer.
type RespondFn = dyn Fn(&Value, RequestKind) -> Step + Send + Sync;

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Responder(..)")
    }
}

impl PartialEq for Responder {
    fn eq(&self, other: &Responder) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The script: steps consumed one per message request, then a default.
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    steps: VecDeque<Step>,
    otherwise: Step,
    auto_compact: Option<Step>,
    responder: Option<Responder>,
}

impl Default for Scenario {
    fn default() -> Scenario {
        Scenario {
            steps: VecDeque::new(),
            otherwise: Step::text("ok"),
            auto_compact: None,
            responder: None,
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

    /// Answers every message and compaction request with what `respond`
    /// makes of its body, once the queued steps are used up (a queued step
    /// or an automatic compaction answer still comes first).
    pub fn respond_with(
        mut self,
        respond: impl Fn(&Value, RequestKind) -> Step + Send + Sync + 'static,
    ) -> Scenario {
        self.responder = Some(Responder(Arc::new(respond)));
        self
    }

    /// The step for a request of `kind`, consuming a queued one unless an
    /// automatic compaction answer applies.
    fn next_step(&mut self, kind: RequestKind, body: &Value) -> Step {
        if kind == RequestKind::Compact {
            if let Some(step) = &self.auto_compact {
                return step.clone();
            }
        }
        if let Some(step) = self.steps.pop_front() {
            return step;
        }
        match &self.responder {
            Some(respond) => (respond.0)(body, kind),
            None => self.otherwise.clone(),
        }
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
    /// The prompt-cache model, when the fake was started with one.
    cache: Option<PromptCache>,
    /// One bill per answered request while the cache model is on.
    bills: Vec<Bill>,
}

impl FakeAnthropic {
    /// Binds 127.0.0.1 on a free port and starts serving `scenario`.
    pub fn start(scenario: Scenario) -> FakeAnthropic {
        FakeAnthropic::start_inner(scenario, None)
    }

    /// Like [`FakeAnthropic::start`], with the prompt-cache model on: every
    /// answer's `usage` is what `cache` bills for the request (see
    /// [`PromptCache`]), and [`FakeAnthropic::bills`] lists the bills.
    pub fn start_with_cache(scenario: Scenario, cache: PromptCache) -> FakeAnthropic {
        FakeAnthropic::start_inner(scenario, Some(cache))
    }

    fn start_inner(scenario: Scenario, cache: Option<PromptCache>) -> FakeAnthropic {
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
            cache,
            bills: Vec::new(),
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

    /// The bills of the prompt-cache model so far, in answer order (empty
    /// without the model).
    pub fn bills(&self) -> Vec<Bill> {
        self.lock().bills.clone()
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
                let mut step = state.scenario.next_step(kind, &body);
                let request_index = state.requests.len();
                if let Some(cache) = state.cache.as_mut() {
                    if let Some(bill) = cache.bill(&body, kind, &mut step, request_index) {
                        state.bills.push(bill);
                    }
                }
                (Some(step), state.answered)
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
    let reported = step.reported();
    let _ = match step.reply {
        Reply::Text(text) => respond_sse(
            request,
            &ids,
            &text_stream(&ids, model, &text, reported),
            &extra,
        ),
        Reply::Compact(summary) => {
            let text = format!(
                "<analysis>The fake API summarises without analysing.</analysis>\n<summary>{summary}</summary>"
            );
            respond_sse(
                request,
                &ids,
                &text_stream(&ids, model, &text, reported),
                &extra,
            )
        }
        Reply::ToolUse { name, input } => respond_sse(
            request,
            &ids,
            &tool_use_stream(&ids, model, &name, &input, reported),
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
            let mut events = text_start(&ids, model, &text, reported);
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
            "usage": step.reported().json(step.usage.output_tokens)
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

fn text_stream(ids: &Ids, model: &str, text: &str, usage: Reported) -> Vec<Value> {
    let mut events = text_start(ids, model, text, usage);
    events.push(json!({"type": "content_block_stop", "index": 0}));
    events.extend(message_end("end_turn", usage));
    events
}

/// The start of a text answer: the message and its text block begun, with
/// `text` as its one delta (a stall stops here).
fn text_start(ids: &Ids, model: &str, text: &str, usage: Reported) -> Vec<Value> {
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

fn tool_use_stream(
    ids: &Ids,
    model: &str,
    name: &str,
    input: &Value,
    usage: Reported,
) -> Vec<Value> {
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

fn message_start(ids: &Ids, model: &str, usage: Reported) -> Value {
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
            "usage": usage.json(1)
        }
    })
}

fn message_end(stop_reason: &str, usage: Reported) -> [Value; 2] {
    [
        json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": {"output_tokens": usage.usage.output_tokens}
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

// ---------------------------------------------------------------------------
// The prompt-cache model and its virtual clock (the cost bench's; opt-in with
// `FakeAnthropic::start_with_cache`).
//
// Modelled on the real API's prompt caching
// (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching):
// - a request is a sequence of blocks in API order: each tool, each system
//   block, then each content block of each message (a string content is one
//   text block); the model name and the role of each message are part of the
//   key;
// - a block carrying `cache_control` is a breakpoint (the API takes at most 4;
//   every one the request carries counts here); the entry of a breakpoint is
//   keyed by the exact prefix up to and including its block, `cache_control`
//   markers themselves left out of the key, so the next request of a
//   conversation, whose marker moved on, still hits;
// - a lookup at a breakpoint also tries the 20 block boundaries before it, as
//   the API does; the longest live prefix found is read;
// - each breakpoint past the read prefix whose prefix is at least the model's
//   minimum cacheable length is written, the tokens from the end of the
//   previous cached part to it billed as a 5-minute or a 1-hour write by its
//   `ttl` (`"1h"`, else 5 minutes); what follows the last cached breakpoint
//   is uncached input;
// - an entry lives its ttl from its write or its last hit, read on the
//   virtual clock; entries are shared by every request to this fake (agents,
//   sessions, processes);
// - tokens are estimated as ceil(bytes/4) of each block's compact JSON
//   (without `cache_control`); output tokens as ceil(bytes/4) of the answer's
//   text, or of a tool call's name and JSON input.
// ---------------------------------------------------------------------------

/// How far before a breakpoint a lookup tries earlier block boundaries.
const CACHE_LOOKBACK_BLOCKS: usize = 20;

/// Sonnet-class models' minimum cacheable prefix, in tokens.
pub const SONNET_MIN_CACHEABLE_TOKENS: u64 = 1024;

/// The estimate of tokens in `bytes` bytes of text or JSON: a quarter, rounded up.
pub fn estimate_tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// A clock in a file: unix seconds as decimal text. The trace driver sets
/// it; the fake API's cache and the harness (`HIVE_TEST_CLOCK_FILE`) read it.
#[derive(Debug, Clone)]
pub struct VirtualClock {
    path: std::path::PathBuf,
}

impl VirtualClock {
    /// A clock kept at `path`, set to `start`.
    pub fn new(path: impl Into<std::path::PathBuf>, start: i64) -> VirtualClock {
        let clock = VirtualClock { path: path.into() };
        clock.set(start);
        clock
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Sets the time, atomically (a reader sees the old or the new value).
    pub fn set(&self, unix: i64) {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, format!("{unix}\n")).expect("writing the virtual clock");
        std::fs::rename(&tmp, &self.path).expect("renaming the virtual clock into place");
    }

    pub fn now(&self) -> i64 {
        std::fs::read_to_string(&self.path)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .expect("the virtual clock file holds unix seconds")
    }
}

/// One model's list prices, dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prices {
    pub model: &'static str,
    pub input: f64,
    pub write_5m: f64,
    pub write_1h: f64,
    pub read: f64,
    pub output: f64,
}

/// Claude Sonnet 4.5 at Anthropic's published list prices
/// (https://docs.anthropic.com/en/docs/about-claude/pricing): $3 input,
/// $3.75 5-minute write (1.25×), $6 1-hour write (2×), $0.30 read (0.1×),
/// $15 output, per million tokens.
pub const SONNET_4_5_PRICES: Prices = Prices {
    model: "claude-sonnet-4-5",
    input: 3.0,
    write_5m: 3.75,
    write_1h: 6.0,
    read: 0.30,
    output: 15.0,
};

/// What one answered request cost, by kind of token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bill {
    /// The virtual time of the request.
    pub at: i64,
    /// Its index in [`FakeAnthropic::requests`].
    pub request: usize,
    pub compaction: bool,
    pub input: u64,
    pub write_5m: u64,
    pub write_1h: u64,
    pub read: u64,
    pub output: u64,
    /// The tokens of the request's tools and system prompt: the fixed part
    /// every request of that caller carries (billed within the kinds above).
    pub overhead: u64,
}

impl Bill {
    pub fn dollars(&self, p: &Prices) -> f64 {
        (self.input as f64 * p.input
            + self.write_5m as f64 * p.write_5m
            + self.write_1h as f64 * p.write_1h
            + self.read as f64 * p.read
            + self.output as f64 * p.output)
            / 1e6
    }

    /// The sum of two bills' tokens (`at`, `request` and `compaction` of `self`).
    pub fn add(&mut self, other: &Bill) {
        self.input += other.input;
        self.write_5m += other.write_5m;
        self.write_1h += other.write_1h;
        self.read += other.read;
        self.output += other.output;
        self.overhead += other.overhead;
    }
}

/// The prompt cache: live entries by prefix key, on a virtual clock.
#[derive(Debug)]
pub struct PromptCache {
    clock: VirtualClock,
    min_tokens: u64,
    /// Prefix key → (expiry, ttl), unix seconds on the clock.
    entries: std::collections::HashMap<u64, (i64, i64)>,
}

/// One block of a request: the key of the prefix ending with it, the tokens
/// up to and including it, and its breakpoint's ttl if it is one.
struct Boundary {
    key: u64,
    tokens: u64,
    breakpoint: Option<i64>,
}

impl PromptCache {
    /// An empty cache on `clock` with a Sonnet-class minimum length.
    pub fn new(clock: VirtualClock) -> PromptCache {
        PromptCache {
            clock,
            min_tokens: SONNET_MIN_CACHEABLE_TOKENS,
            entries: std::collections::HashMap::new(),
        }
    }

    /// Bills the request `body` answered by `step`, and sets the step's
    /// usage to the bill. Errors and non-answers are not billed (`None`).
    fn bill(
        &mut self,
        body: &Value,
        kind: RequestKind,
        step: &mut Step,
        request: usize,
    ) -> Option<Bill> {
        let output = match &step.reply {
            Reply::Text(text) => estimate_tokens(text.len()),
            Reply::Compact(summary) => estimate_tokens(summary.len() + 80),
            Reply::ToolUse { name, input } => estimate_tokens(name.len() + input.to_string().len()),
            _ => return None,
        };
        let now = self.clock.now();
        self.entries.retain(|_, (expiry, _)| *expiry > now);
        let (boundaries, overhead) = boundaries(body);
        let total = boundaries.last().map_or(0, |b| b.tokens);
        let breakpoints: Vec<usize> = (0..boundaries.len())
            .filter(|&i| boundaries[i].breakpoint.is_some())
            .collect();
        // The longest live prefix at or just before a breakpoint.
        let mut hit: Option<usize> = None;
        for &bp in &breakpoints {
            for i in (bp.saturating_sub(CACHE_LOOKBACK_BLOCKS)..=bp).rev() {
                if self.entries.contains_key(&boundaries[i].key) {
                    hit = hit.max(Some(i));
                    break;
                }
            }
        }
        let read = hit.map_or(0, |i| boundaries[i].tokens);
        if let Some(i) = hit {
            if let Some((expiry, ttl)) = self.entries.get_mut(&boundaries[i].key) {
                *expiry = now + *ttl;
            }
        }
        let (mut write_5m, mut write_1h, mut cached_to) = (0, 0, read);
        for &bp in &breakpoints {
            let b = &boundaries[bp];
            if hit.is_some_and(|i| bp <= i) || b.tokens < self.min_tokens || b.tokens <= cached_to {
                continue;
            }
            let ttl = b.breakpoint.unwrap_or(300);
            if ttl >= 3600 {
                write_1h += b.tokens - cached_to;
            } else {
                write_5m += b.tokens - cached_to;
            }
            cached_to = b.tokens;
            self.entries.insert(b.key, (now + ttl, ttl));
        }
        let input = total - cached_to;
        step.usage = Usage {
            input_tokens: input,
            cache_read_input_tokens: read,
            cache_creation_input_tokens: write_5m + write_1h,
            output_tokens: output,
        };
        step.cache_creation = Some(CacheCreation {
            ephemeral_5m_input_tokens: write_5m,
            ephemeral_1h_input_tokens: write_1h,
        });
        Some(Bill {
            at: now,
            request,
            compaction: kind == RequestKind::Compact,
            input,
            write_5m,
            write_1h,
            read,
            output,
            overhead,
        })
    }
}

/// The request's blocks in API order as prefix boundaries, and the tokens of
/// its tools and system prompt.
fn boundaries(body: &Value) -> (Vec<Boundary>, u64) {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body["model"].as_str().unwrap_or("").hash(&mut hasher);
    let mut out = Vec::new();
    let mut tokens = 0;
    let mut push = |section: &str, block: &Value, out: &mut Vec<Boundary>| {
        let breakpoint = block
            .get("cache_control")
            .map(|c| if c["ttl"] == "1h" { 3600 } else { 300 });
        let mut keyed = block.clone();
        if let Some(map) = keyed.as_object_mut() {
            map.remove("cache_control");
        }
        let text = keyed.to_string();
        section.hash(&mut hasher);
        text.hash(&mut hasher);
        tokens += estimate_tokens(text.len());
        out.push(Boundary {
            key: hasher.finish(),
            tokens,
            breakpoint,
        });
    };
    for tool in body["tools"].as_array().into_iter().flatten() {
        push("tool", tool, &mut out);
    }
    match &body["system"] {
        Value::String(text) => push("system", &json!({"type": "text", "text": text}), &mut out),
        Value::Array(blocks) => blocks.iter().for_each(|b| push("system", b, &mut out)),
        _ => {}
    }
    let overhead = out.last().map_or(0, |b| b.tokens);
    for message in body["messages"].as_array().into_iter().flatten() {
        let role = message["role"].as_str().unwrap_or("user");
        match &message["content"] {
            Value::String(text) => push(role, &json!({"type": "text", "text": text}), &mut out),
            Value::Array(blocks) => blocks.iter().for_each(|b| push(role, b, &mut out)),
            _ => {}
        }
    }
    (out, overhead)
}
