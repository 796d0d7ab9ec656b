//! The turn-outcome classifier: a [`TurnObserver`] is fed every stdout and stderr
//! line of one `claude --print --output-format stream-json` process and, once the
//! process has ended, turns what it saw plus how the process ended into a
//! [`TurnReport`]: the [`TurnOutcome`] that drives the serve loop (ack, requeue and
//! sleep, park for login, compact, report a failure), the context size that drives
//! the watermarks, and the session and cost figures for the stats sink.
//!
//! The real CLI (2.1.197 to 2.1.332, `docs/claude-cli.md`) prints every API error
//! on stdout as JSON and leaves stderr empty, so the structured fields win: the
//! `result` line's `is_error`, `api_error_status`, `terminal_reason` and (since
//! 2.1.292) `api_error` kind, the synthetic assistant line's `error`, `api_error`
//! and `api_error_params.rate_limit_info`, `system/api_retry` and
//! `rate_limit_event` lines (with their `unifiedWindows` since 2.1.3xx). Lines of
//! a type or subtype it does not know are passed over, never an error. Text markers are only a fallback
//! and are only looked for where text cannot come from the conversation: raw stderr
//! lines and parsed `{"type":"error"}` events, never assistant text. Nothing here does
//! I/O; the runner owns the child and calls in from its pump threads' channel.

use crate::proto::cmd::{is_window_name, UsageSeen, UsageStatus};
use crate::proto::TurnOutcomeKind;
use serde_json::Value;
use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

/// What claude prints when the session no longer fits its context window.
pub const PROMPT_TOO_LONG_MARKER: &str = "Prompt is too long";

/// Stderr and error-event markers of a failed login, matched case-insensitively as
/// words (so `401` in `:14010` or `req_4011` is not one).
pub const AUTH_FAIL_MARKERS: &[&str] = &[
    "authentication_failed",
    "authentication_error",
    "401",
    "invalid api key",
    "invalid x-api-key",
    "invalid_api_key",
    "oauth token has expired",
    "failed to authenticate",
    "not logged in",
    "please run /login",
];

/// Stderr and error-event markers of a rate limit, matched case-insensitively as
/// words (so the port `:14290` or the id `req_4291` is not one).
pub const RATE_LIMIT_MARKERS: &[&str] = &[
    "429",
    "rate_limit",
    "rate_limited",
    "rate limit",
    "rate limited",
    "rate-limit",
    "rate-limited",
    "too many requests",
];

/// Texts of the CLI's own "the API could not be reached or is overloaded" results,
/// matched case-insensitively as substrings of the result text. The stalled
/// stream's texts: 2.1.197 "The operation timed out." (and "Response stalled
/// mid-stream", never seen against a gateway), 2.1.332 "The response stopped
/// arriving", "The response stalled before a response was produced", "Stream
/// idle timeout - no chunks received", "stream idle: no bytes for Nms".
const API_UNAVAILABLE_MARKERS: &[&str] = &[
    "request timed out",
    "operation timed out",
    "unable to connect",
    "connection dropped",
    "overloaded",
    "repeated 529",
    "internal server error",
    "connection error",
    "econnreset",
    "service unavailable",
    "stalled mid-stream",
    "response stalled",
    "stopped arriving",
    "stream idle",
];

/// The typed `api_error` of a usage limit (CLI 2.1.292+): the reset is in
/// `api_error_params.rate_limit_info` or the `rate_limit_event`.
pub const USAGE_LIMIT_REACHED: &str = "usage_limit_reached";

/// Typed `api_error` kinds (CLI 2.1.292+) of an API that could not be
/// reached or stopped answering: retried with backoff.
const API_UNAVAILABLE_KINDS: &[&str] = &["connection_failed", "stream_idle_timeout"];

/// The most tokens one turn can report in any one count: the broker's bound
/// on one `post_turn_counts` (`proto::limits`, its one home). A `result` or
/// usage figure past it (or a negative, fractional or missing one) is garbage
/// from a broken or hostile stream and is dropped, so the counters the harness
/// posts and records stay finite, non-negative and bounded.
pub use crate::proto::limits::MAX_TOKENS_PER_POST as MAX_TURN_TOKENS;

/// The most one turn can cost, in dollars (the broker's bound too); a
/// `total_cost_usd` past it, negative or not finite is dropped like
/// [`MAX_TURN_TOKENS`].
pub use crate::proto::limits::MAX_COST_PER_POST as MAX_TURN_COST_USD;

/// How many stderr lines are kept for the message of a crashed turn.
const STDERR_TAIL_LINES: usize = 8;

/// Longest stderr line kept, in bytes; the rest is cut.
const STDERR_LINE_MAX: usize = 500;

/// What one turn came to, for the serve loop: its kind, the one outcome
/// vocabulary ([`TurnOutcomeKind`]: the policy decides on it, turn-stats
/// stores it), and what the kind alone does not say — the CLI's message or
/// the harness's words, the reset of a rate limit. Made by the classifier's
/// constructors below (the observer's, or the loop's for the outcomes it
/// sets itself: an operator interrupt, a hung run, MCP servers that did not
/// start, a claude that could not be started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnOutcome {
    pub kind: TurnOutcomeKind,
    /// The CLI's message or the harness's words; empty when the kind says
    /// it all.
    pub text: String,
    /// For a rate limit: epoch seconds when the CLI said the limit lifts.
    pub resets_at: Option<i64>,
}

/// The `result` subtype CLI 2.1.197 prints when `--max-budget-usd` is reached.
pub const MAX_BUDGET_SUBTYPE: &str = "error_max_budget_usd";

impl TurnOutcome {
    fn of(kind: TurnOutcomeKind, text: String) -> TurnOutcome {
        TurnOutcome {
            kind,
            text,
            resets_at: None,
        }
    }

    /// The turn ran to a successful `result`.
    pub fn ok() -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::Ok, String::new())
    }

    /// The session was compacted: a `/compact` run that printed its
    /// `compact_boundary`, or a turn during which the CLI compacted on its own.
    pub fn compacted() -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::Compacted, String::new())
    }

    /// The API refused for rate limiting; `resets_at` when the CLI said when
    /// the limit lifts.
    pub fn rate_limited(resets_at: Option<i64>) -> TurnOutcome {
        TurnOutcome {
            resets_at,
            ..TurnOutcome::of(TurnOutcomeKind::RateLimited, String::new())
        }
    }

    /// The credentials were refused (401/403) or are missing.
    pub fn auth_failed() -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::AuthFailed, String::new())
    }

    /// The session no longer fits the context window; `/compact` and retry.
    pub fn prompt_too_long() -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::PromptTooLong, String::new())
    }

    /// The API timed out, could not be reached or was overloaded; the text is
    /// the CLI's message.
    pub fn api_unavailable(m: String) -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::ApiUnavailable, m)
    }

    /// The CLI aborted the turn mid-execution (`error_during_execution`,
    /// `aborted_tools`).
    pub fn aborted(m: String) -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::Aborted, m)
    }

    /// The operator interrupted the run. Set by the loop.
    pub fn interrupted(m: String) -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::Interrupted, m)
    }

    /// Anything else: a crash, an error result nothing above explains; a
    /// run killed at its wall-clock limit ("turn timed out …") is
    /// [`TurnOutcomeKind::TimedOut`].
    pub fn failed(m: String) -> TurnOutcome {
        let kind = if m.starts_with("turn timed out") {
            TurnOutcomeKind::TimedOut
        } else {
            TurnOutcomeKind::Failed
        };
        TurnOutcome::of(kind, m)
    }

    /// Claude was never started (no descriptors, memory, processes or
    /// threads, or a missing binary): nothing ran, so the message is not at
    /// fault. Set by the runner, never by the observer.
    pub fn not_started(m: String) -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::NotStarted, m)
    }

    /// `/compact` ran but could not shrink the session ("could not be reduced
    /// below the context limit", "Not enough messages to compact."); the
    /// text is the CLI's.
    pub fn cannot_compact(m: String) -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::CannotCompact, m)
    }

    /// The run printed nothing for `HIVE_TURN_IDLE_SECS` while no tool call
    /// was open, and the harness stopped it. Set by the loop.
    pub fn hung(m: String) -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::Hung, m)
    }

    /// An MCP server of hive's own was not `connected` in the `system/init`
    /// line, and the harness stopped the run; the text names them. Set by
    /// the loop.
    pub fn mcp_not_connected(m: String) -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::McpStartFailed, m)
    }

    /// The run reached the cap passed as `--max-budget-usd` (the fleet
    /// entry's `turn_usd`): CLI 2.1.197 ends it with a `result` of subtype
    /// [`MAX_BUDGET_SUBTYPE`]; the text is the CLI's ("Reached maximum
    /// budget ($0.01)").
    pub fn turn_budget(m: String) -> TurnOutcome {
        TurnOutcome::of(TurnOutcomeKind::TurnBudget, m)
    }

    /// The kind stored in turn-stats and used as the `/metrics` label; the
    /// free text, if any, is [`TurnOutcome::detail`].
    pub fn kind(&self) -> TurnOutcomeKind {
        self.kind
    }

    /// What the kind alone does not say: the CLI's message, the reset time.
    pub fn detail(&self) -> Option<String> {
        use TurnOutcomeKind as K;
        match self.kind {
            K::RateLimited => self.resets_at.map(|t| format!("resets at {t}")),
            K::CannotCompact => Some(format!(
                "compaction cannot shrink the session: {}",
                self.text
            )),
            K::Ok
            | K::Compacted
            | K::AuthFailed
            | K::PromptTooLong
            | K::ApiUnavailable
            | K::Aborted
            | K::Interrupted
            | K::Failed
            | K::TimedOut
            | K::NotStarted
            | K::Hung
            | K::McpStartFailed
            | K::TurnBudget
            | K::Stopped
            | K::Other => Some(self.text.clone()),
        }
        .filter(|d| !d.trim().is_empty())
    }

    /// True for the outcomes whose inflight message is acked.
    pub fn is_ok(&self) -> bool {
        self.kind.is_ok()
    }
}

/// The words older releases stored and the page shows.
impl fmt::Display for TurnOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use TurnOutcomeKind as K;
        let m = &self.text;
        match self.kind {
            K::Ok => f.write_str("ok"),
            K::Compacted => f.write_str("compacted"),
            K::RateLimited => match self.resets_at {
                Some(t) => write!(f, "rate limited (resets at {t})"),
                None => f.write_str("rate limited"),
            },
            K::AuthFailed => f.write_str("authentication failed"),
            K::PromptTooLong => f.write_str("prompt is too long"),
            K::ApiUnavailable => write!(f, "API unavailable: {m}"),
            K::Interrupted | K::Aborted => write!(f, "interrupted: {m}"),
            K::Failed | K::TimedOut => write!(f, "failed: {m}"),
            K::NotStarted => write!(f, "not started: {m}"),
            K::CannotCompact => write!(f, "compaction cannot shrink the session: {m}"),
            K::Hung => write!(f, "hung: {m}"),
            K::McpStartFailed => write!(f, "MCP servers not connected: {m}"),
            K::TurnBudget => write!(f, "turn budget reached: {m}"),
            K::Stopped => write!(f, "stopped: {m}"),
            K::Other => write!(f, "other: {m}"),
        }
    }
}

/// Something the runner may act on while the child is still running.
#[derive(Debug, Clone, PartialEq)]
pub enum Signal {
    /// The CLI is about to retry an API call (`system/api_retry`).
    ApiRetry {
        attempt: u64,
        max_retries: u64,
        error_status: Option<i64>,
        error: Option<String>,
        delay_ms: u64,
    },
    /// An `api_retry` for a 401: the CLI would retry a dead credential for minutes.
    /// Kill the child and finish with `killed_early_for_auth`. Sent once.
    KillEarlyAuth,
    /// A hard rate-limit sign (a rejected `rate_limit_event`, an error event or a
    /// stderr marker), for showing the badge early. Sent once.
    RateLimited { resets_at: Option<i64> },
    /// The `system/init` line lists one of hive's own MCP servers
    /// ([`CORE_MCP_SERVERS`]) as not `connected` (`failed`, `pending`): the turn
    /// would run without its tools. `(name, status)` pairs. Sent once.
    McpNotConnected(Vec<(String, String)>),
}

/// The MCP servers of the harness's own config whose tools every turn needs;
/// servers from `HIVE_EXTRA_MCP_SERVERS` are never checked.
pub const CORE_MCP_SERVERS: [&str; 2] = ["hyperhive", "bash"];

/// How the child ended, as the runner saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code, when it exited.
    pub code: Option<i32>,
    /// Terminating signal, when it was killed.
    pub signal: Option<i32>,
    /// The runner killed it at its wall-clock limit.
    pub timed_out: bool,
    /// The runner killed it after [`Signal::KillEarlyAuth`].
    pub killed_early_for_auth: bool,
    /// How long it ran, for the timeout message.
    pub elapsed: Option<Duration>,
}

impl ExitInfo {
    /// A plain exit with `code`.
    pub fn exited(code: i32) -> ExitInfo {
        ExitInfo {
            code: Some(code),
            ..ExitInfo::default()
        }
    }

    fn describe(&self) -> String {
        match (self.code, self.signal) {
            (Some(c), _) => format!("claude exited with code {c}"),
            (None, Some(s)) => format!("claude was killed by signal {s}"),
            (None, None) => "claude ended".to_string(),
        }
    }
}

/// The numbers of a `system/compact_boundary` line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactStats {
    /// `manual` for `/compact`, `auto` when the CLI compacted on its own.
    pub trigger: Option<String>,
    pub pre_tokens: Option<u64>,
    pub post_tokens: Option<u64>,
}

/// Everything one process told us, once it has ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnReport {
    pub outcome: TurnOutcome,
    /// From `system/init`, overridden by the `result` line.
    pub session_id: Option<String>,
    /// The model `system/init` named.
    pub model: Option<String>,
    /// The CLI's version, `system/init`'s `claude_code_version` (checked
    /// against `agent_proc::CLAUDE_CLI_WINDOW`).
    pub cli_version: Option<String>,
    /// Context size after the turn: input + cache read + cache creation tokens of
    /// the last main-session, non-synthetic assistant message; after a successful
    /// compaction with no such message, the boundary's `post_tokens`.
    pub context_tokens: Option<u64>,
    /// The CLI-reported `modelUsage.<model>.contextWindow`.
    pub context_window: Option<u64>,
    /// The CLI-reported `modelUsage.<model>.maxOutputTokens`.
    pub max_output_tokens: Option<u64>,
    pub cost_usd: Option<f64>,
    /// Cumulative over the turn, from `result.usage` (for stats, not context).
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_creation_tokens: u64,
    pub num_turns: Option<u64>,
    /// The `result` line's text.
    pub result_text: Option<String>,
    /// Some assistant or result line was printed: the prompt is in the session's
    /// history, so a retry must send a short note rather than the body again.
    pub prompt_reached_session: bool,
    /// How many `api_retry` lines the CLI printed.
    pub api_retries: u32,
    /// Set when a `compact_boundary` line was seen.
    pub compact: Option<CompactStats>,
    /// The last stderr lines, oldest first.
    pub stderr_tail: Vec<String>,
    /// What the last `rate_limit_event` that did not refuse said: `allowed`,
    /// or the early warning `allowed_warning` (OAuth credentials only).
    pub usage: Option<UsageSeen>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Mode {
    #[default]
    Turn,
    Compaction,
}

/// The fields of a `result` line the classifier uses.
#[derive(Debug, Clone, Default)]
struct ResultLine {
    subtype: String,
    is_error: bool,
    api_error_status: Option<i64>,
    terminal_reason: Option<String>,
    /// The typed error kind of CLI 2.1.292+ (`usage_limit_reached`,
    /// `connection_failed`, `stream_idle_timeout`, …).
    api_error: Option<String>,
    text: Option<String>,
}

impl ResultLine {
    fn is_interrupted(&self) -> bool {
        self.subtype == "error_during_execution"
            || self.terminal_reason.as_deref() == Some("aborted_tools")
    }

    fn text_or(&self, fallback: &str) -> String {
        match self.text.as_deref() {
            Some(t) if !t.trim().is_empty() => t.to_string(),
            _ => fallback.to_string(),
        }
    }
}

/// Error signs seen outside the `result` line, used when the result does not say.
#[derive(Debug, Clone, Default)]
struct Evidence {
    rate_limited: bool,
    auth_failed: bool,
    prompt_too_long: bool,
    api_unavailable: Option<String>,
    /// The message of the last `{"type":"error"}` event.
    error_message: Option<String>,
}

/// Watches one claude process; see the module docs.
#[derive(Debug, Default)]
pub struct TurnObserver {
    mode: Mode,
    session_id: Option<String>,
    model: Option<String>,
    cli_version: Option<String>,
    reached_session: bool,
    last_message_id: Option<String>,
    context_tokens: Option<u64>,
    result: Option<ResultLine>,
    num_turns: Option<u64>,
    cost_usd: Option<f64>,
    usage: [u64; 4],
    model_usage: Option<Value>,
    synthetic_error: Option<String>,
    synthetic_text: Option<String>,
    evidence: Evidence,
    /// The reset of what refused the request: a rejected `rate_limit_info`'s
    /// own `resetsAt` (a `rate_limit_event`'s, or the `usage_limit_reached`
    /// error's `api_error_params`).
    resets_at: Option<i64>,
    /// The latest `resetsAt` among the rejected `unifiedWindows`, for a
    /// refusal whose own `rate_limit_info` names no reset (a weekly limit
    /// whose reset only its window carries).
    window_reset: Option<i64>,
    /// The synthetic assistant line's typed error kind (`api_error`).
    api_error: Option<String>,
    usage_seen: Option<UsageSeen>,
    api_retries: u32,
    sent_kill: bool,
    sent_rate_limited: bool,
    sent_mcp: bool,
    compact: Option<CompactStats>,
    compact_failure: Option<String>,
    stderr_tail: VecDeque<String>,
    /// `tool_use` ids printed with no `tool_result` line yet.
    open_tools: Vec<String>,
    /// The `result` said `--max-budget-usd` was reached: the CLI's text.
    max_budget: Option<String>,
}

impl TurnObserver {
    /// An observer for a normal turn.
    pub fn new() -> TurnObserver {
        TurnObserver::default()
    }

    /// An observer for a `/compact` run: success needs a `compact_boundary` line,
    /// and a `system/status` line with `compact_result:"failed"` is a failure even
    /// though the CLI exits 0.
    pub fn compaction() -> TurnObserver {
        TurnObserver {
            mode: Mode::Compaction,
            ..TurnObserver::default()
        }
    }

    /// Takes one stdout line. Lines that are not JSON are ignored: stream-json
    /// prints nothing else, and text is never classified.
    pub fn on_stdout_line(&mut self, line: &str) -> Vec<Signal> {
        let line = line.trim();
        if line.is_empty() {
            return Vec::new();
        }
        match serde_json::from_str::<Value>(line) {
            Ok(value) => self.on_stdout_value(&value),
            Err(_) => {
                log::debug!("ignoring non-JSON stdout line from claude: {line}");
                Vec::new()
            }
        }
    }

    /// Takes one already-parsed stdout line, for a pump that parses once to forward
    /// the value to the live bus as well.
    pub fn on_stdout_value(&mut self, v: &Value) -> Vec<Signal> {
        let mut signals = Vec::new();
        match str_at(v, "type").unwrap_or("") {
            "system" => self.on_system(v, &mut signals),
            "assistant" => self.on_assistant(v, &mut signals),
            "user" => self.on_user(v),
            "result" => self.on_result(v),
            "rate_limit_event" => self.on_rate_limit_event(v, &mut signals),
            "error" => self.on_error_event(v, &mut signals),
            _ => {}
        }
        signals
    }

    /// Takes one stderr line: kept for a crash message and matched against the
    /// rate-limit, auth and prompt-too-long markers.
    pub fn on_stderr_line(&mut self, line: &str) -> Vec<Signal> {
        let mut signals = Vec::new();
        let line = line.trim_end();
        if line.trim().is_empty() {
            return signals;
        }
        if self.stderr_tail.len() == STDERR_TAIL_LINES {
            self.stderr_tail.pop_front();
        }
        self.stderr_tail.push_back(cut(line, STDERR_LINE_MAX));
        if stderr_rate_limited(line) {
            self.evidence.rate_limited = true;
            self.signal_rate_limited(&mut signals);
        }
        if stderr_auth_failed(line) {
            self.evidence.auth_failed = true;
        }
        if is_prompt_too_long(line) {
            self.evidence.prompt_too_long = true;
        }
        signals
    }

    /// Turns what was seen plus how the process ended into the report.
    pub fn finish(self, exit: ExitInfo) -> TurnReport {
        let outcome = self.outcome(&exit);
        let (context_window, max_output_tokens) = self.cli_window();
        let context_tokens = match (self.context_tokens, &self.compact) {
            (Some(t), _) => Some(t),
            (None, Some(c)) if outcome == TurnOutcome::compacted() => c.post_tokens,
            (None, _) => None,
        };
        TurnReport {
            outcome,
            session_id: self.session_id,
            model: self.model,
            cli_version: self.cli_version,
            context_tokens,
            context_window,
            max_output_tokens,
            cost_usd: self.cost_usd,
            input_tokens: self.usage[0],
            output_tokens: self.usage[1],
            cache_read_tokens: self.usage[2],
            cache_creation_tokens: self.usage[3],
            num_turns: self.num_turns,
            result_text: self.result.and_then(|r| r.text),
            prompt_reached_session: self.reached_session,
            api_retries: self.api_retries,
            compact: self.compact,
            stderr_tail: self.stderr_tail.into_iter().collect(),
            usage: self.usage_seen,
        }
    }

    fn on_system(&mut self, v: &Value, signals: &mut Vec<Signal>) {
        match str_at(v, "subtype").unwrap_or("") {
            "init" => {
                if let Some(s) = str_at(v, "session_id") {
                    self.session_id = Some(s.to_string());
                }
                if let Some(m) = str_at(v, "model") {
                    self.model = Some(m.to_string());
                }
                if let Some(version) = str_at(v, "claude_code_version") {
                    // Bounded: it ends up in a notice.
                    self.cli_version = Some(cut(version, 64));
                }
                let missing = mcp_not_connected(v);
                if !missing.is_empty() && !self.sent_mcp {
                    self.sent_mcp = true;
                    signals.push(Signal::McpNotConnected(missing));
                }
            }
            "api_retry" => {
                self.api_retries += 1;
                let error_status = v.get("error_status").and_then(Value::as_i64);
                signals.push(Signal::ApiRetry {
                    attempt: u64_at(v, "attempt").unwrap_or(0),
                    max_retries: u64_at(v, "max_retries").unwrap_or(0),
                    error_status,
                    error: str_at(v, "error").map(str::to_string),
                    delay_ms: v
                        .get("retry_delay_ms")
                        .and_then(Value::as_f64)
                        .map_or(0, |ms| ms.max(0.0) as u64),
                });
                if error_status == Some(401) && !self.sent_kill {
                    self.sent_kill = true;
                    signals.push(Signal::KillEarlyAuth);
                }
            }
            "status" if str_at(v, "compact_result") == Some("failed") => {
                let err = str_at(v, "compact_error").unwrap_or("compaction failed");
                self.compact_failure = Some(err.to_string());
            }
            "compact_boundary" => {
                let meta = v.get("compact_metadata");
                let field = |k: &str| meta.and_then(|m| m.get(k));
                self.compact = Some(CompactStats {
                    trigger: field("trigger").and_then(Value::as_str).map(str::to_string),
                    pre_tokens: meta.and_then(|m| tokens_at(m, "pre_tokens")),
                    post_tokens: meta.and_then(|m| tokens_at(m, "post_tokens")),
                });
            }
            _ => {}
        }
    }

    /// Tool calls printed and not answered yet; while there is one, a silent
    /// run is waiting for a tool, not hung.
    pub fn open_tool_calls(&self) -> usize {
        self.open_tools.len()
    }

    /// A `user` line: the `tool_result` blocks close their tool calls.
    fn on_user(&mut self, v: &Value) {
        for block in content_blocks(v) {
            if str_at(block, "type") == Some("tool_result") {
                if let Some(id) = str_at(block, "tool_use_id") {
                    self.open_tools.retain(|t| t != id);
                }
            }
        }
    }

    fn on_assistant(&mut self, v: &Value, signals: &mut Vec<Signal>) {
        self.reached_session = true;
        for block in content_blocks(v) {
            if str_at(block, "type") == Some("tool_use") {
                if let Some(id) = str_at(block, "id") {
                    // A bound, so a broken stream cannot grow it without limit.
                    if !self.open_tools.iter().any(|t| t == id) && self.open_tools.len() < 1024 {
                        self.open_tools.push(id.to_string());
                    }
                }
            }
        }
        let Some(msg) = v.get("message") else {
            return;
        };
        if str_at(msg, "model") == Some("<synthetic>") {
            // The CLI's own error reply: all-zero usage, never sent to the API.
            if let Some(e) = str_at(v, "error") {
                self.synthetic_error = Some(e.to_string());
            }
            self.synthetic_text = first_text(msg);
            if let Some(kind) = str_at(v, "api_error") {
                self.api_error = Some(cut(kind, 64));
            }
            if let Some(info) = v.pointer("/api_error_params/rate_limit_info") {
                self.note_refusal(info);
            }
            if self.api_error.as_deref() == Some(USAGE_LIMIT_REACHED) {
                self.evidence.rate_limited = true;
                self.signal_rate_limited(signals);
            }
            return;
        }
        if v.get("parent_tool_use_id").is_some_and(|p| !p.is_null()) {
            // A sub-agent's call: its usage is another context, not the session's.
            return;
        }
        let id = str_at(msg, "id").map(str::to_string);
        if id.is_some() && id == self.last_message_id {
            // One API response prints one line per content block, same usage.
            return;
        }
        if let Some(usage) = msg.get("usage") {
            let tokens = [
                "input_tokens",
                "cache_read_input_tokens",
                "cache_creation_input_tokens",
            ]
            .iter()
            .map(|k| tokens_at(usage, k).unwrap_or(0))
            .sum();
            self.context_tokens = Some(tokens);
            self.last_message_id = id;
        }
    }

    fn on_result(&mut self, v: &Value) {
        self.reached_session = true;
        if let Some(s) = str_at(v, "session_id") {
            self.session_id = Some(s.to_string());
        }
        self.num_turns = u64_at(v, "num_turns");
        self.cost_usd = v
            .get("total_cost_usd")
            .and_then(Value::as_f64)
            .filter(|c| c.is_finite() && (0.0..=MAX_TURN_COST_USD).contains(c));
        if let Some(u) = v.get("usage") {
            self.usage = [
                tokens_at(u, "input_tokens").unwrap_or(0),
                tokens_at(u, "output_tokens").unwrap_or(0),
                tokens_at(u, "cache_read_input_tokens").unwrap_or(0),
                tokens_at(u, "cache_creation_input_tokens").unwrap_or(0),
            ];
        }
        self.model_usage = v.get("modelUsage").cloned();
        if str_at(v, "subtype") == Some(MAX_BUDGET_SUBTYPE) {
            let said = v
                .pointer("/errors/0")
                .and_then(Value::as_str)
                .or_else(|| str_at(v, "result"))
                .filter(|t| !t.trim().is_empty())
                .unwrap_or("Reached maximum budget");
            self.max_budget = Some(said.chars().take(STDERR_LINE_MAX).collect());
            if self.usage == [0; 4] {
                // CLI 2.1.197 prints this result's `usage` as zeros; the
                // run's tokens are in `modelUsage`, per model.
                self.usage = model_usage_sums(v.get("modelUsage"));
            }
        }
        self.result = Some(ResultLine {
            subtype: str_at(v, "subtype").unwrap_or("").to_string(),
            is_error: v.get("is_error").and_then(Value::as_bool).unwrap_or(false),
            api_error_status: v.get("api_error_status").and_then(Value::as_i64),
            terminal_reason: str_at(v, "terminal_reason").map(str::to_string),
            api_error: str_at(v, "api_error").map(|k| cut(k, 64)),
            text: str_at(v, "result").map(str::to_string),
        });
    }

    fn on_rate_limit_event(&mut self, v: &Value, signals: &mut Vec<Signal>) {
        let Some(info) = v.get("rate_limit_info") else {
            return;
        };
        let resets_at = info.get("resetsAt").and_then(Value::as_i64);
        self.note_windows(info);
        match str_at(info, "status") {
            Some("rejected") => {
                // Only a refusal's reset is the limit's: a warning's names
                // a window that has not run out.
                self.note_refusal(info);
                self.evidence.rate_limited = true;
                self.signal_rate_limited(signals);
            }
            Some("allowed") => {
                self.usage_seen = Some(UsageSeen {
                    status: UsageStatus::Allowed,
                    resets_at: None,
                    window: None,
                    utilization: None,
                })
            }
            Some("allowed_warning") => {
                self.usage_seen = Some(UsageSeen {
                    status: UsageStatus::AllowedWarning,
                    resets_at: resets_at.filter(|t| *t >= 0),
                    window: str_at(info, "rateLimitType")
                        .filter(|w| is_window_name(w))
                        .map(str::to_string),
                    utilization: info
                        .get("utilization")
                        .and_then(Value::as_f64)
                        .filter(|u| u.is_finite() && (0.0..=10.0).contains(u)),
                })
            }
            _ => {}
        }
    }

    fn on_error_event(&mut self, v: &Value, signals: &mut Vec<Signal>) {
        let err = v.get("error");
        let kind = err.and_then(|e| str_at(e, "type")).unwrap_or("");
        let message = err
            .and_then(|e| str_at(e, "message"))
            .or_else(|| err.and_then(Value::as_str))
            .or_else(|| str_at(v, "message"))
            .unwrap_or(kind);
        let text = v.to_string();
        if stderr_rate_limited(&text) {
            self.evidence.rate_limited = true;
            self.signal_rate_limited(signals);
        }
        if stderr_auth_failed(&text) || kind == "permission_error" {
            self.evidence.auth_failed = true;
        }
        if is_prompt_too_long(&text) {
            self.evidence.prompt_too_long = true;
        }
        if matches!(kind, "overloaded_error" | "api_error" | "timeout_error")
            || is_api_unavailable(message)
        {
            self.evidence.api_unavailable = Some(message.to_string());
        }
        self.evidence.error_message = Some(message.to_string());
    }

    /// A `rate_limit_info` that refused the request: its own reset, when it
    /// names one, is the limit's; its windows are noted too.
    fn note_refusal(&mut self, info: &Value) {
        self.note_windows(info);
        if str_at(info, "status") != Some("rejected") {
            return;
        }
        if let Some(at) = info.get("resetsAt").and_then(Value::as_i64) {
            self.resets_at = Some(at);
        }
    }

    /// The latest reset among the `unifiedWindows` that are `rejected`. A
    /// rejected window alone does not say the request was refused (the
    /// top-level `status` does); it only says when, if it was.
    fn note_windows(&mut self, info: &Value) {
        let Some(Value::Object(windows)) = info.get("unifiedWindows") else {
            return;
        };
        let latest = windows
            .values()
            .filter(|w| str_at(w, "status") == Some("rejected"))
            .filter_map(|w| w.get("resetsAt").and_then(Value::as_i64))
            .max();
        if latest.is_some() {
            self.window_reset = self.window_reset.max(latest);
        }
    }

    /// When the limit that refused the run lifts: its own reset, else its
    /// rejected windows' latest.
    fn refusal_reset(&self) -> Option<i64> {
        self.resets_at.or(self.window_reset)
    }

    fn signal_rate_limited(&mut self, signals: &mut Vec<Signal>) {
        if !self.sent_rate_limited {
            self.sent_rate_limited = true;
            signals.push(Signal::RateLimited {
                resets_at: self.refusal_reset(),
            });
        }
    }

    fn outcome(&self, exit: &ExitInfo) -> TurnOutcome {
        if exit.killed_early_for_auth {
            return TurnOutcome::auth_failed();
        }
        if exit.timed_out {
            return TurnOutcome::failed(match exit.elapsed {
                Some(d) => format!("turn timed out after {}s", d.as_secs()),
                None => "turn timed out".to_string(),
            });
        }
        if let Some(m) = &self.max_budget {
            // The CLI stopped the run at its cap, whatever else it saw.
            return TurnOutcome::turn_budget(m.clone());
        }
        if self.mode == Mode::Compaction {
            return self.compaction_outcome(exit);
        }
        match &self.result {
            Some(r) if !r.is_error => {
                if r.is_interrupted() {
                    TurnOutcome::aborted(r.text_or("turn interrupted during execution"))
                } else if r.subtype.starts_with("error") {
                    TurnOutcome::failed(r.text_or(&r.subtype))
                } else if exit.code != Some(0) {
                    TurnOutcome::failed(format!("{} after reporting success", exit.describe()))
                } else if self.compact.is_some() {
                    TurnOutcome::compacted()
                } else {
                    TurnOutcome::ok()
                }
            }
            Some(r) => self.error_outcome(Some(r)).unwrap_or_else(|| {
                let fallback = self
                    .synthetic_text
                    .as_deref()
                    .unwrap_or("claude reported an error");
                TurnOutcome::failed(r.text_or(fallback))
            }),
            None => self
                .error_outcome(None)
                .unwrap_or_else(|| TurnOutcome::failed(self.crash_message(exit))),
        }
    }

    fn compaction_outcome(&self, exit: &ExitInfo) -> TurnOutcome {
        if let Some(err) = &self.compact_failure {
            // What the CLI 2.1.197 prints (`compact_error`): "Compaction failed ·
            // conversation could not be reduced below the context limit", "Not
            // enough messages to compact.", and "Error during compaction: API
            // Error: …" / "Error during compaction: Invalid API key · …" for
            // the API's refusals.
            return if stderr_rate_limited(err) {
                TurnOutcome::rate_limited(self.refusal_reset())
            } else if stderr_auth_failed(err) {
                TurnOutcome::auth_failed()
            } else if is_api_unavailable(err) {
                TurnOutcome::api_unavailable(err.clone())
            } else if cannot_compact(err) {
                TurnOutcome::cannot_compact(err.clone())
            } else {
                TurnOutcome::failed(format!("compaction failed: {err}"))
            };
        }
        if self.compact.is_some() {
            return TurnOutcome::compacted();
        }
        match &self.result {
            Some(r) if r.is_error => self.error_outcome(Some(r)).unwrap_or_else(|| {
                TurnOutcome::failed(format!(
                    "compaction failed: {}",
                    r.text_or("claude reported an error")
                ))
            }),
            Some(r) => TurnOutcome::failed(format!(
                "compaction printed no compact_boundary: {}",
                r.text_or("(empty result)")
            )),
            None => self
                .error_outcome(None)
                .unwrap_or_else(|| TurnOutcome::failed(self.crash_message(exit))),
        }
    }

    /// The error kind, from the most structured source that names one.
    fn error_outcome(&self, result: Option<&ResultLine>) -> Option<TurnOutcome> {
        let rate_limited = TurnOutcome::rate_limited(self.refusal_reset());
        let text = result
            .and_then(|r| r.text.clone())
            .filter(|t| !t.trim().is_empty())
            .or_else(|| self.synthetic_text.clone());
        // The typed kind (2.1.292+), from the result or the synthetic line.
        let kind = result
            .and_then(|r| r.api_error.as_deref())
            .or(self.api_error.as_deref());
        if kind == Some(USAGE_LIMIT_REACHED) {
            return Some(rate_limited);
        }
        if let Some(r) = result {
            match r.api_error_status {
                Some(429) => return Some(rate_limited),
                Some(401 | 403) => return Some(TurnOutcome::auth_failed()),
                _ => {}
            }
            let ptl_reason = matches!(
                r.terminal_reason.as_deref(),
                Some("prompt_too_long" | "blocking_limit")
            );
            if ptl_reason || r.text.as_deref().is_some_and(is_prompt_too_long) {
                return Some(TurnOutcome::prompt_too_long());
            }
        }
        let unavailable = || TurnOutcome::api_unavailable(text.clone().unwrap_or_default());
        match self.synthetic_error.as_deref() {
            Some("rate_limit") => return Some(rate_limited),
            Some("authentication_failed") => return Some(TurnOutcome::auth_failed()),
            Some("invalid_request") if text.as_deref().is_some_and(is_prompt_too_long) => {
                return Some(TurnOutcome::prompt_too_long())
            }
            Some("server_error") => return Some(unavailable()),
            _ => {}
        }
        if matches!(kind, Some(k) if API_UNAVAILABLE_KINDS.contains(&k)) {
            return Some(unavailable());
        }
        if let Some(r) = result {
            let server_status = r.api_error_status.is_some_and(|s| s >= 500);
            if server_status || text.as_deref().is_some_and(is_api_unavailable) {
                return Some(unavailable());
            }
            if r.is_interrupted() {
                return Some(TurnOutcome::aborted(
                    r.text_or("turn interrupted during execution"),
                ));
            }
        }
        let ev = &self.evidence;
        if result.is_some_and(|r| r.terminal_reason.as_deref() == Some("api_error"))
            && !(ev.rate_limited || ev.auth_failed || ev.prompt_too_long)
        {
            // 2.1.332 ends every failed API call with this reason; what no
            // field above names is an API failure, retried with backoff.
            return Some(unavailable());
        }
        if ev.rate_limited {
            Some(rate_limited)
        } else if ev.auth_failed {
            Some(TurnOutcome::auth_failed())
        } else if ev.prompt_too_long {
            Some(TurnOutcome::prompt_too_long())
        } else if let Some(m) = &ev.api_unavailable {
            Some(TurnOutcome::api_unavailable(m.clone()))
        } else if result.is_none() {
            ev.error_message
                .as_ref()
                .map(|m| TurnOutcome::failed(format!("claude reported an error: {m}")))
        } else {
            None
        }
    }

    fn crash_message(&self, exit: &ExitInfo) -> String {
        let mut msg = format!("{} without a result line", exit.describe());
        if self.stderr_tail.is_empty() {
            msg.push_str(" and printed nothing on stderr");
        } else {
            let start = self.stderr_tail.len().saturating_sub(3);
            let tail: Vec<&str> = self
                .stderr_tail
                .iter()
                .skip(start)
                .map(String::as_str)
                .collect();
            msg.push_str("; stderr: ");
            msg.push_str(&tail.join(" | "));
        }
        msg
    }

    /// The CLI-reported window and max output of the model `system/init` named, or
    /// of the largest-window model in `modelUsage` when it did not name one there.
    fn cli_window(&self) -> (Option<u64>, Option<u64>) {
        let Some(Value::Object(models)) = &self.model_usage else {
            return (None, None);
        };
        let pick = |m: &Value| {
            (
                tokens_at(m, "contextWindow"),
                tokens_at(m, "maxOutputTokens"),
            )
        };
        if let Some(m) = self.model.as_deref().and_then(|name| models.get(name)) {
            return pick(m);
        }
        models
            .values()
            .map(pick)
            .max_by_key(|(window, _)| *window)
            .unwrap_or((None, None))
    }
}

/// True when a raw stderr line carries a rate-limit marker as a word.
pub fn stderr_rate_limited(line: &str) -> bool {
    has_marker(line, RATE_LIMIT_MARKERS)
}

/// True when a raw stderr line carries an auth-failure marker as a word.
pub fn stderr_auth_failed(line: &str) -> bool {
    has_marker(line, AUTH_FAIL_MARKERS)
}

/// True when the text carries [`PROMPT_TOO_LONG_MARKER`], in any case (the CLI
/// matches the API's lowercase "prompt is too long: N tokens > M" the same way).
pub fn is_prompt_too_long(text: &str) -> bool {
    text.to_lowercase()
        .contains(&PROMPT_TOO_LONG_MARKER.to_lowercase())
}

/// What a `result` line says of a turn that went well, for the rule that a
/// turn which finished is never run again (`turn_loop`): a `success` that is
/// not an error nor an abort, and whether the CLI added that a shutdown
/// interrupted it (`interrupted_by_shutdown: true`, which newer CLIs print).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Success {
    /// The turn ran to its end.
    Finished,
    /// The CLI was being shut down: the turn did not finish.
    Shutdown,
}

/// The [`Success`] a stdout line reports, if it is such a `result`.
pub fn success_of(v: &Value) -> Option<Success> {
    let clean = str_at(v, "type") == Some("result")
        && str_at(v, "subtype") == Some("success")
        && v.get("is_error").and_then(Value::as_bool) != Some(true)
        && str_at(v, "terminal_reason") != Some("aborted_tools");
    let shutdown = v.get("interrupted_by_shutdown").and_then(Value::as_bool) == Some(true);
    clean.then_some(if shutdown {
        Success::Shutdown
    } else {
        Success::Finished
    })
}

/// True for the CLI's texts of a compaction that ran but cannot make the
/// session smaller.
fn cannot_compact(text: &str) -> bool {
    let lower = text.to_lowercase();
    lower.contains("could not be reduced") || lower.contains("not enough messages to compact")
}

/// hive's own MCP servers that the `system/init` line lists as not
/// `connected`, as `(name, status)`.
fn mcp_not_connected(init: &Value) -> Vec<(String, String)> {
    let Some(servers) = init.get("mcp_servers").and_then(Value::as_array) else {
        return Vec::new();
    };
    servers
        .iter()
        .filter_map(|s| {
            let name = str_at(s, "name")?;
            let status = str_at(s, "status").unwrap_or("unknown");
            (CORE_MCP_SERVERS.contains(&name) && status != "connected")
                .then(|| (name.to_string(), status.to_string()))
        })
        .collect()
}

/// The content blocks of an `assistant` or `user` line's message.
fn content_blocks(v: &Value) -> &[Value] {
    v.get("message")
        .and_then(|m| m.get("content"))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn is_api_unavailable(text: &str) -> bool {
    let lower = text.to_lowercase();
    API_UNAVAILABLE_MARKERS.iter().any(|m| lower.contains(m))
}

fn has_marker(line: &str, markers: &[&str]) -> bool {
    let lower = line.to_lowercase();
    markers.iter().any(|m| contains_word(&lower, m))
}

/// True when `needle` occurs in `hay` with no ASCII letter or digit right before or
/// after it.
fn contains_word(hay: &str, needle: &str) -> bool {
    let bytes = hay.as_bytes();
    hay.match_indices(needle).any(|(at, _)| {
        let end = at + needle.len();
        let before = at == 0 || !bytes[at - 1].is_ascii_alphanumeric();
        let after = end == bytes.len() || !bytes[end].is_ascii_alphanumeric();
        before && after
    })
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn u64_at(v: &Value, key: &str) -> Option<u64> {
    v.get(key).and_then(Value::as_u64)
}

/// A token count, or None when it is missing or past [`MAX_TURN_TOKENS`].
/// Input, output, cache-read and cache-write tokens summed over the models
/// of a `modelUsage` object (each figure bounded like [`tokens_at`]).
fn model_usage_sums(m: Option<&Value>) -> [u64; 4] {
    let mut sums = [0u64; 4];
    for u in m
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|o| o.values())
    {
        let keys = [
            "inputTokens",
            "outputTokens",
            "cacheReadInputTokens",
            "cacheCreationInputTokens",
        ];
        for (sum, key) in sums.iter_mut().zip(keys) {
            *sum = sum
                .saturating_add(tokens_at(u, key).unwrap_or(0))
                .min(MAX_TURN_TOKENS);
        }
    }
    sums
}

fn tokens_at(v: &Value, key: &str) -> Option<u64> {
    u64_at(v, key).filter(|t| *t <= MAX_TURN_TOKENS)
}

fn first_text(msg: &Value) -> Option<String> {
    msg.get("content")?
        .as_array()?
        .iter()
        .find(|block| str_at(block, "type") == Some("text"))
        .and_then(|block| str_at(block, "text"))
        .map(str::to_string)
}

fn cut(line: &str, max: usize) -> String {
    if line.len() <= max {
        return line.to_string();
    }
    let mut end = max;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

/// The reset a usage-limit text names, when it names it in UTC: "resets
/// 5:03am (UTC)" (CLI 2.1.197's result text) is the next 05:03 UTC after
/// `now`. Any other zone, or no time, gives None: the caller falls back to
/// `HIVE_RATE_LIMIT_SLEEP_SECS` (issue 16).
pub fn utc_reset_in_text(text: &str, now: i64) -> Option<i64> {
    let at = text.find("resets ")? + "resets ".len();
    let rest = &text[at..];
    let end = rest.find(" (UTC)")?;
    let clock = rest[..end].trim().to_ascii_lowercase();
    let (digits, pm) = if let Some(d) = clock.strip_suffix("am") {
        (d, false)
    } else if let Some(d) = clock.strip_suffix("pm") {
        (d, true)
    } else {
        return None;
    };
    let (h, m) = match digits.split_once(':') {
        Some((h, m)) => (h.parse::<i64>().ok()?, m.parse::<i64>().ok()?),
        None => (digits.parse::<i64>().ok()?, 0),
    };
    if !(1..=12).contains(&h) || !(0..60).contains(&m) {
        return None;
    }
    let h24 = h % 12 + if pm { 12 } else { 0 };
    let day = now - now.rem_euclid(86_400);
    let mut t = day + h24 * 3600 + m * 60;
    if t <= now {
        t += 86_400;
    }
    Some(t)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_utc_reset_text_names_the_next_such_time() {
        use super::utc_reset_in_text as r;
        let now = 1_795_305_600; // 00:00 UTC
        let text = "You've hit your session limit · resets 5:03am (UTC)";
        assert_eq!(r(text, now), Some(now + 5 * 3600 + 3 * 60));
        assert_eq!(r("resets 12pm (UTC)", now), Some(now + 12 * 3600));
        assert_eq!(
            r("resets 12:30am (UTC)", now + 3600),
            Some(now + 86_400 + 1800)
        );
        assert_eq!(r("resets 5:03am (Europe/Berlin)", now), None);
        assert_eq!(r("resets 13:03am (UTC)", now), None);
        assert_eq!(r("rate limited", now), None);
    }

    use super::*;

    // Lines copied from reference/claude-cli-2.1.197.md; where the reference elides
    // part of an object with "…", the elided part is dropped or filled with zeros
    // so that the line parses.
    const INIT: &str = r#"{"type":"system","subtype":"init","cwd":"w1","session_id":"9954aa9f-init","tools":["Edit","Read","mcp__hyperhive__send"],"mcp_servers":[{"name":"hyperhive","status":"connected"}],"model":"claude-sonnet-4-5","permissionMode":"default","slash_commands":["compact"],"apiKeySource":"ANTHROPIC_API_KEY","claude_code_version":"2.1.197","output_style":"default","agents":[],"skills":[],"plugins":[],"analytics_disabled":true,"product_feedback_disabled":true,"uuid":"u1","memory_paths":{"auto":"h1/.claude/projects/-tmp-probe-w1/memory/"},"fast_mode_state":"off"}"#;
    const TOOL_USE: &str = r#"{"type":"assistant","message":{"id":"msg_fake_3","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"tool_use","id":"toolu_fake_3","name":"mcp__hyperhive__send","input":{"to":"operator","body":"hello from real claude"}}],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":1200,"cache_read_input_tokens":3000,"cache_creation_input_tokens":500,"output_tokens":1},"context_management":null},"parent_tool_use_id":null,"session_id":"9954aa9f-init","uuid":"u2","request_id":"req_fake_3","tool_use_meta":[{"id":"toolu_fake_3","display_name":"Send","server_display_name":"fake"}]}"#;
    const TOOL_RESULT: &str = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"toolu_fake_3","type":"tool_result","content":[{"type":"text","text":"sent"}]}]},"parent_tool_use_id":null,"session_id":"9954aa9f-init","uuid":"u3","timestamp":"2026-11-22T03:57:02.015Z","tool_use_result":[{"type":"text","text":"sent"}]}"#;
    const DONE: &str = r#"{"type":"assistant","message":{"id":"msg_fake_4","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[{"type":"text","text":"done"}],"stop_reason":null,"usage":{"input_tokens":1300,"cache_read_input_tokens":3000,"cache_creation_input_tokens":500,"output_tokens":1}},"parent_tool_use_id":null,"session_id":"9954aa9f-init","request_id":"req_fake_4"}"#;
    const RESULT_OK: &str = r#"{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"duration_ms":107,"duration_api_ms":74,"ttft_ms":30,"ttft_stream_ms":25,"time_to_request_ms":20,"num_turns":2,"result":"done","stop_reason":"end_turn","session_id":"9954aa9f-result","total_cost_usd":0.01401,"usage":{"input_tokens":2400,"cache_creation_input_tokens":1000,"cache_read_input_tokens":6000,"output_tokens":84,"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0},"service_tier":"standard","cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":0},"inference_geo":"","iterations":[],"speed":"standard"},"modelUsage":{"claude-sonnet-4-5":{"inputTokens":2400,"outputTokens":84,"cacheReadInputTokens":6000,"cacheCreationInputTokens":1000,"webSearchRequests":0,"costUSD":0.01401,"contextWindow":200000,"maxOutputTokens":32000}},"permission_denials":[],"terminal_reason":"completed","fast_mode_state":"off","uuid":"u5"}"#;

    const RETRY_429: &str = r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":547.571881210828,"error_status":429,"error":"rate_limit","session_id":"da8c3ebd-x","uuid":"u"}"#;
    const RETRY_401: &str = r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":10,"retry_delay_ms":507.46,"error_status":401,"error":"authentication_failed","session_id":"s","uuid":"u"}"#;
    const RETRY_CLOSE: &str = r#"{"type":"system","subtype":"api_retry","attempt":1,"max_retries":1,"retry_delay_ms":512.0,"error_status":null,"error":"unknown","session_id":"s","uuid":"u"}"#;

    const SYN_429: &str = r#"{"type":"assistant","message":{"id":"681f698b-x","container":null,"model":"<synthetic>","role":"assistant","stop_details":null,"stop_reason":"stop_sequence","stop_sequence":"","type":"message","usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"content":[{"type":"text","text":"API Error: Request rejected (429) · Number of request tokens has exceeded your per-minute rate limit"}],"context_management":null},"parent_tool_use_id":null,"session_id":"47aac8c3-x","uuid":"u","error":"rate_limit","request_id":"req_fake_2"}"#;
    const RESULT_429: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"duration_ms":86,"duration_api_ms":0,"num_turns":1,"result":"API Error: Request rejected (429) · Number of request tokens has exceeded your per-minute rate limit","stop_reason":"stop_sequence","session_id":"47aac8c3-x","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"modelUsage":{},"permission_denials":[],"terminal_reason":"completed","fast_mode_state":"off","uuid":"u"}"#;
    const RLE_RESET: &str = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1795323782,"rateLimitType":"five_hour","isUsingOverage":false},"session_id":"s","uuid":"u"}"#;
    const RLE_NO_RESET: &str = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","isUsingOverage":false},"session_id":"s","uuid":"u"}"#;
    const RESULT_429_OAUTH: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":429,"num_turns":1,"result":"You've hit your session limit · resets 5:03am (UTC)","session_id":"s","total_cost_usd":0,"modelUsage":{},"terminal_reason":"completed"}"#;

    const SYN_401: &str = r#"{"type":"assistant","message":{"id":"a1","model":"<synthetic>","role":"assistant","type":"message","usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0},"content":[{"type":"text","text":"Invalid API key · Fix external API key"}]},"parent_tool_use_id":null,"session_id":"s","error":"authentication_failed"}"#;
    const RESULT_401: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":401,"num_turns":1,"result":"Invalid API key · Fix external API key","session_id":"s","total_cost_usd":0,"terminal_reason":"completed"}"#;
    const RESULT_403: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":403,"num_turns":1,"result":"Failed to authenticate. API Error: 403 forbidden","session_id":"s","terminal_reason":"completed"}"#;

    const SYN_PTL: &str = r#"{"type":"assistant","message":{"id":"f81e5d79-x","container":null,"model":"<synthetic>","role":"assistant","content":[{"type":"text","text":"Prompt is too long"}],"context_management":null},"parent_tool_use_id":null,"session_id":"0726fc52-x","uuid":"u","error":"invalid_request","request_id":"req_fake_2"}"#;
    const RESULT_PTL: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":400,"duration_ms":83,"duration_api_ms":0,"num_turns":1,"result":"Prompt is too long","stop_reason":"stop_sequence","session_id":"0726fc52-x","total_cost_usd":0,"usage":{"input_tokens":0,"output_tokens":0},"modelUsage":{},"permission_denials":[],"terminal_reason":"prompt_too_long","fast_mode_state":"off","uuid":"u"}"#;
    const RESULT_BLOCKING: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":null,"num_turns":1,"result":"Prompt is too long","session_id":"s","terminal_reason":"blocking_limit"}"#;

    const SYN_SERVER: &str = r#"{"type":"assistant","message":{"id":"a5","model":"<synthetic>","role":"assistant","content":[{"type":"text","text":"API Error: 500 Internal server error."}]},"parent_tool_use_id":null,"session_id":"s","error":"server_error"}"#;
    const RESULT_500: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":500,"num_turns":1,"result":"API Error: 500 Internal server error. This is a server-side issue, usually temporary — try again in a moment. If it persists, check your inference gateway (127.0.0.1:18804).","session_id":"s","terminal_reason":"completed"}"#;
    const RESULT_529: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":529,"num_turns":1,"result":"API Error: 529 Overloaded. This is a server-side issue, usually temporary.","session_id":"s","terminal_reason":"completed"}"#;
    const RESULT_REPEATED_529: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":null,"num_turns":1,"result":"API Error: Repeated 529 Overloaded errors. The API is at capacity — this is usually temporary. Try again in a moment. If it persists, check your inference gateway (127.0.0.1:18820).","session_id":"s","terminal_reason":"completed"}"#;
    const RESULT_TIMEOUT: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":null,"num_turns":1,"result":"Request timed out","session_id":"s","terminal_reason":"completed"}"#;
    const RESULT_ECONNRESET: &str = r#"{"type":"result","subtype":"success","is_error":true,"api_error_status":null,"num_turns":1,"result":"API Error: Unable to connect to API (ECONNRESET)","session_id":"s","terminal_reason":"completed"}"#;
    const RESULT_EXEC_ERROR: &str = r#"{"type":"result","subtype":"error_during_execution","is_error":true,"api_error_status":null,"num_turns":3,"session_id":"s"}"#;
    const RESULT_ABORTED_TOOLS: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":2,"result":"","session_id":"s","terminal_reason":"aborted_tools"}"#;

    const COMPACTING: &str = r#"{"type":"system","subtype":"status","status":"compacting","session_id":"7f1a4964-x","uuid":"u"}"#;
    const COMPACT_OK_STATUS: &str = r#"{"type":"system","subtype":"status","status":null,"compact_result":"success","session_id":"7f1a4964-x","uuid":"u"}"#;
    const BOUNDARY: &str = r#"{"type":"system","subtype":"compact_boundary","session_id":"7f1a4964-x","uuid":"u","compact_metadata":{"trigger":"manual","pre_tokens":191057,"post_tokens":183,"cumulative_dropped_tokens":190874,"duration_ms":38,"preserved_segment":{},"preserved_messages":{}}}"#;
    const SUMMARY_USER: &str = r#"{"type":"user","message":{"role":"user","content":"This session is being continued from a previous conversation that ran out of context."},"isReplay":false,"isSynthetic":true}"#;
    const COMPACTED_REPLAY: &str = r#"{"type":"user","message":{"role":"user","content":"<local-command-stdout>Compacted </local-command-stdout>"},"isReplay":true}"#;
    const COMPACT_RESULT_OK: &str = r#"{"type":"result","subtype":"success","is_error":false,"duration_ms":48,"duration_api_ms":20,"num_turns":0,"result":"","stop_reason":null,"session_id":"7f1a4964-x","total_cost_usd":0.000375,"usage":{"input_tokens":0,"output_tokens":0},"modelUsage":{"claude-sonnet-4-5":{"inputTokens":100}},"permission_denials":[],"fast_mode_state":"off","uuid":"u"}"#;
    const COMPACT_FAILED_STATUS: &str = r#"{"type":"system","subtype":"status","status":null,"compact_result":"failed","compact_error":"Compaction failed · conversation could not be reduced below the context limit","session_id":"s","uuid":"u"}"#;
    const COMPACT_FAILED_SYN: &str = r#"{"type":"assistant","message":{"id":"a9","model":"<synthetic>","role":"assistant","content":[{"type":"text","text":"Compaction failed · conversation could not be reduced below the context limit"}]},"parent_tool_use_id":null,"session_id":"s"}"#;
    const COMPACT_FAILED_RESULT: &str = r#"{"type":"result","subtype":"success","is_error":false,"num_turns":0,"result":"Compaction failed · conversation could not be reduced below the context limit","session_id":"s"}"#;
    // Printed by the real CLI against the fake API (500 and 401 during /compact).
    const COMPACT_500_ERROR: &str = "Error during compaction: API Error: 500 Internal server error. This is a server-side issue, usually temporary — try again in a moment. If it persists, check your inference gateway (127.0.0.1:46419).";
    const COMPACT_500_STATUS: &str = r#"{"type":"system","subtype":"status","status":null,"compact_result":"failed","compact_error":"Error during compaction: API Error: 500 Internal server error. This is a server-side issue, usually temporary — try again in a moment. If it persists, check your inference gateway (127.0.0.1:46419).","session_id":"s","uuid":"u"}"#;
    const COMPACT_401_STATUS: &str = r#"{"type":"system","subtype":"status","status":null,"compact_result":"failed","compact_error":"Error during compaction: Invalid API key · Fix external API key","session_id":"s","uuid":"u"}"#;
    const COMPACT_429_STATUS: &str = r#"{"type":"system","subtype":"status","status":null,"compact_result":"failed","compact_error":"Error during compaction: API Error: Request rejected (429) · Number of request tokens has exceeded your per-minute rate limit","session_id":"s","uuid":"u"}"#;

    fn run(lines: &[&str], stderr: &[&str], exit: ExitInfo) -> TurnReport {
        observe(TurnObserver::new(), lines, stderr, exit)
    }

    fn observe(mut o: TurnObserver, lines: &[&str], stderr: &[&str], exit: ExitInfo) -> TurnReport {
        for l in lines {
            o.on_stdout_line(l);
        }
        for l in stderr {
            o.on_stderr_line(l);
        }
        o.finish(exit)
    }

    fn rate_limited(resets_at: Option<i64>) -> TurnOutcome {
        TurnOutcome::rate_limited(resets_at)
    }

    #[test]
    fn a_normal_tool_using_turn_is_ok_with_its_numbers() {
        let r = run(
            &[INIT, TOOL_USE, TOOL_RESULT, DONE, RESULT_OK],
            &[],
            ExitInfo::exited(0),
        );
        assert_eq!(r.outcome, TurnOutcome::ok());
        assert_eq!(r.session_id.as_deref(), Some("9954aa9f-result"));
        assert_eq!(r.model.as_deref(), Some("claude-sonnet-4-5"));
        assert_eq!(r.context_tokens, Some(1300 + 3000 + 500));
        assert_eq!(r.context_window, Some(200_000));
        assert_eq!(r.max_output_tokens, Some(32_000));
        assert_eq!(r.cost_usd, Some(0.01401));
        assert_eq!((r.input_tokens, r.output_tokens), (2400, 84));
        assert_eq!((r.cache_read_tokens, r.cache_creation_tokens), (6000, 1000));
        assert_eq!(r.num_turns, Some(2));
        assert_eq!(r.result_text.as_deref(), Some("done"));
        assert!(r.prompt_reached_session);
        assert_eq!(r.compact, None);
    }

    /// What CLI 2.1.197 prints when `--max-budget-usd` is reached (the real
    /// CLI against the fake API answering a tool call with a large `usage`,
    /// `tests/limits_usd.rs`): `usage` zeros, the tokens in `modelUsage`, no
    /// `terminal_reason`, the cap in `errors`.
    const RESULT_MAX_BUDGET: &str = r#"{"type":"result","subtype":"error_max_budget_usd","duration_ms":70,"duration_api_ms":0,"is_error":true,"num_turns":1,"stop_reason":"tool_use","session_id":"1b7f2545-x","total_cost_usd":0.6150000000000001,"usage":{"input_tokens":0,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":0,"server_tool_use":{"web_search_requests":0,"web_fetch_requests":0},"service_tier":"standard","cache_creation":{"ephemeral_1h_input_tokens":0,"ephemeral_5m_input_tokens":0},"inference_geo":"","iterations":[],"speed":"standard"},"modelUsage":{"claude-sonnet-4-5":{"inputTokens":200000,"outputTokens":1000,"cacheReadInputTokens":0,"cacheCreationInputTokens":0,"webSearchRequests":0,"costUSD":0.6150000000000001,"contextWindow":200000,"maxOutputTokens":32000}},"permission_denials":[],"fast_mode_state":"off","uuid":"83bd7425-x","errors":["Reached maximum budget ($0.01)"]}"#;

    #[test]
    fn a_run_stopped_at_its_max_budget_is_its_own_outcome_with_its_cost() {
        for o in [TurnObserver::new(), TurnObserver::compaction()] {
            let r = observe(
                o,
                &[INIT, DONE, RESULT_MAX_BUDGET],
                &[],
                ExitInfo::exited(1),
            );
            assert_eq!(
                r.outcome,
                TurnOutcome::turn_budget("Reached maximum budget ($0.01)".into())
            );
            assert_eq!(r.outcome.kind(), TurnOutcomeKind::TurnBudget);
            assert_eq!(
                r.cost_usd,
                Some(0.6150000000000001),
                "the spend row carries the cost"
            );
            // `usage` is zeros in this line: the tokens come from `modelUsage`.
            assert_eq!((r.input_tokens, r.output_tokens), (200_000, 1000));
        }
        // Without the errors list the subtype alone says it.
        let bare = r#"{"type":"result","subtype":"error_max_budget_usd","is_error":true,"total_cost_usd":0.2}"#;
        let r = run(&[INIT, bare], &[], ExitInfo::exited(1));
        assert_eq!(
            r.outcome,
            TurnOutcome::turn_budget("Reached maximum budget".into())
        );
    }

    #[test]
    fn absurd_counts_in_a_result_line_are_dropped_not_posted() {
        let huge_usage = r#"{"type":"assistant","message":{"id":"m1","role":"assistant","content":[{"type":"text","text":"x"}],"usage":{"input_tokens":18446744073709551615,"cache_read_input_tokens":18446744073709551615,"cache_creation_input_tokens":1}},"parent_tool_use_id":null}"#;
        let cases = [
            r#"{"type":"result","subtype":"success","is_error":false,"result":"x","total_cost_usd":1.7976931348623157e308,"usage":{"input_tokens":18446744073709551615,"output_tokens":-5}}"#,
            r#"{"type":"result","subtype":"success","is_error":false,"result":"x","total_cost_usd":-0.5,"usage":{"input_tokens":1e300,"output_tokens":2.5}}"#,
            r#"{"type":"result","subtype":"success","is_error":false,"result":"x","total_cost_usd":"NaN","usage":{"input_tokens":"inf","output_tokens":null}}"#,
        ];
        for result in cases {
            let r = run(&[INIT, huge_usage, result], &[], ExitInfo::exited(0));
            assert_eq!(r.outcome, TurnOutcome::ok(), "{result}");
            assert_eq!(r.cost_usd, None, "{result}");
            assert_eq!((r.input_tokens, r.output_tokens), (0, 0), "{result}");
            assert_eq!(r.context_tokens, Some(1), "{result}");
        }
        let fine = r#"{"type":"result","subtype":"success","is_error":false,"result":"x","total_cost_usd":0.25,"usage":{"input_tokens":1000000000000,"output_tokens":7}}"#;
        let r = run(&[INIT, fine], &[], ExitInfo::exited(0));
        assert_eq!(r.cost_usd, Some(0.25));
        assert_eq!((r.input_tokens, r.output_tokens), (MAX_TURN_TOKENS, 7));
    }

    #[test]
    fn the_table_of_error_results_from_the_reference() {
        let cases: &[(&str, &[&str], TurnOutcome)] = &[
            (
                "429 api key",
                &[INIT, SYN_429, RESULT_429],
                rate_limited(None),
            ),
            (
                "429 after retries",
                &[INIT, RETRY_429, RETRY_429, SYN_429, RESULT_429],
                rate_limited(None),
            ),
            (
                "429 oauth",
                &[INIT, RLE_NO_RESET, SYN_429, RESULT_429_OAUTH],
                rate_limited(None),
            ),
            (
                "429 oauth with reset",
                &[INIT, RLE_RESET, SYN_429, RESULT_429_OAUTH],
                rate_limited(Some(1_795_323_782)),
            ),
            (
                "401",
                &[INIT, SYN_401, RESULT_401],
                TurnOutcome::auth_failed(),
            ),
            (
                "403",
                &[INIT, SYN_401, RESULT_403],
                TurnOutcome::auth_failed(),
            ),
            (
                "prompt too long",
                &[INIT, SYN_PTL, RESULT_PTL],
                TurnOutcome::prompt_too_long(),
            ),
            (
                "blocking limit",
                &[INIT, SYN_PTL, RESULT_BLOCKING],
                TurnOutcome::prompt_too_long(),
            ),
            (
                "500",
                &[INIT, SYN_SERVER, RESULT_500],
                TurnOutcome::api_unavailable(text_of(RESULT_500)),
            ),
            (
                "529",
                &[INIT, SYN_SERVER, RESULT_529],
                TurnOutcome::api_unavailable(text_of(RESULT_529)),
            ),
            (
                "repeated 529",
                &[INIT, RESULT_REPEATED_529],
                TurnOutcome::api_unavailable(text_of(RESULT_REPEATED_529)),
            ),
            (
                "timeout",
                &[INIT, SYN_SERVER, RESULT_TIMEOUT],
                TurnOutcome::api_unavailable("Request timed out".into()),
            ),
            (
                "connection reset",
                &[INIT, RETRY_CLOSE, RESULT_ECONNRESET],
                TurnOutcome::api_unavailable(text_of(RESULT_ECONNRESET)),
            ),
            (
                "error during execution",
                &[INIT, TOOL_USE, RESULT_EXEC_ERROR],
                TurnOutcome::aborted("turn interrupted during execution".into()),
            ),
        ];
        for (name, lines, want) in cases {
            let r = run(lines, &[], ExitInfo::exited(1));
            assert_eq!(&r.outcome, want, "{name}");
            assert!(r.prompt_reached_session, "{name}");
        }
    }

    // What CLI 2.1.332 prints (probed against the fake API, usage blocks cut):
    // every API failure ends with `terminal_reason: api_error`, the result line's
    // keys come in another order, and the synthetic line carries the typed kind.
    const INIT_332: &str = r#"{"type":"system","subtype":"init","cwd":"w","session_id":"s332","tools":[],"mcp_servers":[{"name":"hyperhive","status":"connected","source":"dynamic"},{"name":"bash","status":"connected","source":"dynamic"}],"model":"claude-sonnet-4-5","claude_code_version":"2.1.332","uuid":"u"}"#;
    const RLE_5H_332: &str = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","resetsAt":1796540511,"rateLimitType":"five_hour","isUsingOverage":false,"unifiedWindows":{"five_hour":{"utilization":1,"resetsAt":1796540511,"status":"rejected"},"seven_day":{"utilization":0.63,"resetsAt":1796792511,"status":"allowed"}}},"uuid":"u","session_id":"s332"}"#;
    const SYN_5H_332: &str = r#"{"type":"assistant","message":{"diagnostics":null,"id":"de09","container":null,"model":"<synthetic>","role":"assistant","stop_reason":"stop_sequence","type":"message","usage":{"input_tokens":0,"output_tokens":0},"content":[{"type":"text","text":"You've hit your 5-hour limit · resets 7:01am (UTC)"}],"context_management":null},"parent_tool_use_id":null,"session_id":"s332","uuid":"u","error":"rate_limit","request_id":"req_fake_13","is_api_error_message":true,"api_error_status":429,"api_error":"usage_limit_reached","api_error_params":{"rate_limit_info":{"status":"rejected","resetsAt":1796540511,"rateLimitType":"five_hour","isUsingOverage":false}},"api_error_type":"rate_limit_error"}"#;
    const RESULT_5H_332: &str = r#"{"duration_api_ms":0,"stop_reason":"stop_sequence","session_id":"s332","total_cost_usd":0,"modelUsage":{},"permission_denials":[],"terminal_reason":"api_error","safety_stops":0,"is_error":true,"num_turns":1,"subtype":"success","api_error_status":429,"api_error_type":"rate_limit_error","api_error":"usage_limit_reached","result":"You've hit your 5-hour limit · resets 7:01am (UTC)","type":"result","duration_ms":166,"uuid":"u"}"#;
    // A weekly limit whose reset only its window carries: no `resetsAt` at
    // the top, none in `api_error_params`, no time in the text.
    const RLE_WEEK_332: &str = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"rejected","rateLimitType":"seven_day","isUsingOverage":false,"unifiedWindows":{"five_hour":{"utilization":0.4,"resetsAt":1796537853,"status":"allowed"},"seven_day":{"utilization":1,"resetsAt":1796543853,"status":"rejected"}}},"uuid":"u","session_id":"s332"}"#;
    const SYN_WEEK_332: &str = r#"{"type":"assistant","message":{"id":"4460","model":"<synthetic>","role":"assistant","type":"message","usage":{"input_tokens":0,"output_tokens":0},"content":[{"type":"text","text":"You've hit your weekly limit"}]},"parent_tool_use_id":null,"session_id":"s332","uuid":"u","error":"rate_limit","request_id":"req_fake_1","is_api_error_message":true,"api_error_status":429,"api_error":"usage_limit_reached","api_error_params":{"rate_limit_info":{"status":"rejected","rateLimitType":"seven_day","isUsingOverage":false}},"api_error_type":"rate_limit_error"}"#;
    const RESULT_WEEK_332: &str = r#"{"duration_api_ms":0,"session_id":"s332","total_cost_usd":0,"modelUsage":{},"terminal_reason":"api_error","is_error":true,"num_turns":1,"subtype":"success","api_error_status":429,"api_error_type":"rate_limit_error","api_error":"usage_limit_reached","result":"You've hit your weekly limit","type":"result","uuid":"u"}"#;
    const SYN_DROP_332: &str = r#"{"type":"assistant","message":{"id":"d","model":"<synthetic>","role":"assistant","type":"message","content":[{"type":"text","text":"API Error: Connection dropped (ECONNRESET). Check the gateway set in ANTHROPIC_BASE_URL, then try again."}]},"parent_tool_use_id":null,"session_id":"s332","uuid":"u","error":"server_error","is_api_error_message":true,"api_error":"connection_failed"}"#;
    const RESULT_DROP_332: &str = r#"{"session_id":"s332","is_error":true,"api_error_status":null,"api_error":"connection_failed","terminal_reason":"api_error","result":"API Error: Connection dropped (ECONNRESET). Check the gateway set in ANTHROPIC_BASE_URL, then try again.","num_turns":1,"subtype":"success","type":"result"}"#;
    const SYN_STALL_332: &str = r#"{"type":"assistant","message":{"id":"st","model":"<synthetic>","role":"assistant","type":"message","content":[{"type":"text","text":"API Error: The response stopped arriving. The response above may be incomplete."}]},"parent_tool_use_id":null,"session_id":"s332","uuid":"u","error":"server_error","is_api_error_message":true,"api_error":"stream_idle_timeout"}"#;
    const RESULT_STALL_332: &str = r#"{"session_id":"s332","is_error":true,"api_error_status":null,"api_error":"stream_idle_timeout","terminal_reason":"api_error","result":"API Error: The response stopped arriving. The response above may be incomplete.","num_turns":4,"subtype":"success","type":"result"}"#;
    const SYN_IDLE_332: &str = r#"{"type":"assistant","message":{"id":"si","model":"<synthetic>","role":"assistant","type":"message","content":[{"type":"text","text":"API Error: stream idle: no bytes for 10000ms"}]},"parent_tool_use_id":null,"session_id":"s332","uuid":"u","error":"unknown","is_api_error_message":true}"#;
    const RESULT_IDLE_332: &str = r#"{"session_id":"s332","is_error":true,"api_error_status":null,"terminal_reason":"api_error","result":"API Error: stream idle: no bytes for 10000ms","num_turns":1,"subtype":"success","type":"result"}"#;
    const RESULT_TIMEOUT_332: &str = r#"{"session_id":"s332","is_error":true,"api_error_status":null,"terminal_reason":"api_error","result":"Request timed out. If the API is slow to answer, or a proxy or gateway holds responses, set API_TIMEOUT_MS above 3000.","num_turns":1,"subtype":"success","type":"result"}"#;
    const RESULT_401_332: &str = r#"{"session_id":"s332","is_error":true,"api_error_status":401,"api_error_type":"authentication_error","terminal_reason":"api_error","result":"Invalid API key · Fix external API key","num_turns":1,"subtype":"success","type":"result"}"#;
    const RESULT_PTL_332: &str = r#"{"session_id":"s332","is_error":true,"api_error_status":400,"api_error_type":"invalid_request_error","terminal_reason":"prompt_too_long","result":"Prompt is too long","num_turns":1,"subtype":"success","type":"result"}"#;
    // A kind no version printed yet: still an API failure.
    const RESULT_NEW_KIND: &str = r#"{"session_id":"s332","is_error":true,"api_error_status":null,"api_error":"gateway_melted","terminal_reason":"api_error","result":"API Error: something new","num_turns":1,"subtype":"success","type":"result"}"#;

    /// Every frame and field the CLI added after 2.1.197 (field-reports §6.2:
    /// new `system` subtypes, `task_*` frames, `tool_progress`, `stream_event`
    /// fields, the init line's `mcp_server_errors`, the result's new fields),
    /// a frame type and a `system` subtype no CLI printed yet, and a line
    /// that is not JSON: the turn is what its `result` says, and no line
    /// but the init's version is read as anything.
    const DRIFT: &str = include_str!("../../tests/fixtures/cli-frames.jsonl");

    #[test]
    fn frames_and_fields_it_does_not_know_change_nothing() {
        let mut lines: Vec<&str> = DRIFT.lines().collect();
        lines.insert(3, "plain text the CLI printed, not JSON");
        let mut o = TurnObserver::new();
        let mut signals = Vec::new();
        for line in &lines {
            signals.extend(o.on_stdout_line(line));
        }
        assert_eq!(signals, [], "no signal from a frame it does not know");
        let r = o.finish(ExitInfo::exited(0));
        assert_eq!(r.outcome, TurnOutcome::ok());
        assert_eq!(r.result_text.as_deref(), Some("drift handled"));
        assert_eq!(r.cli_version.as_deref(), Some("2.1.332"));
        assert_eq!(r.context_tokens, Some(4700));
        assert_eq!((r.input_tokens, r.output_tokens), (200, 20));
        assert_eq!(r.session_id.as_deref(), Some("drift-1"));
    }

    #[test]
    fn the_table_of_error_results_of_cli_2_1_332() {
        let cases: &[(&str, &[&str], TurnOutcome)] = &[
            (
                "5-hour usage limit",
                &[INIT_332, RLE_5H_332, SYN_5H_332, RESULT_5H_332],
                rate_limited(Some(1_796_540_511)),
            ),
            (
                "usage limit from the typed kind alone",
                &[INIT_332, SYN_5H_332, RESULT_5H_332],
                rate_limited(Some(1_796_540_511)),
            ),
            (
                "weekly limit, its reset only in its window",
                &[INIT_332, RLE_WEEK_332, SYN_WEEK_332, RESULT_WEEK_332],
                rate_limited(Some(1_796_543_853)),
            ),
            (
                "dropped connection",
                &[INIT_332, SYN_DROP_332, RESULT_DROP_332],
                TurnOutcome::api_unavailable(text_of(RESULT_DROP_332)),
            ),
            (
                "stalled stream after a block",
                &[INIT_332, SYN_STALL_332, RESULT_STALL_332],
                TurnOutcome::api_unavailable(text_of(RESULT_STALL_332)),
            ),
            (
                "stalled stream, no kind",
                &[INIT_332, SYN_IDLE_332, RESULT_IDLE_332],
                TurnOutcome::api_unavailable(text_of(RESULT_IDLE_332)),
            ),
            (
                "timeout",
                &[INIT_332, SYN_SERVER, RESULT_TIMEOUT_332],
                TurnOutcome::api_unavailable(text_of(RESULT_TIMEOUT_332)),
            ),
            (
                "401",
                &[INIT_332, SYN_401, RESULT_401_332],
                TurnOutcome::auth_failed(),
            ),
            (
                "prompt too long",
                &[INIT_332, SYN_PTL, RESULT_PTL_332],
                TurnOutcome::prompt_too_long(),
            ),
            (
                "an api_error kind never seen",
                &[INIT_332, RESULT_NEW_KIND],
                TurnOutcome::api_unavailable("API Error: something new".into()),
            ),
        ];
        for (name, lines, want) in cases {
            let r = run(lines, &[], ExitInfo::exited(1));
            assert_eq!(&r.outcome, want, "{name}");
            assert_eq!(r.cli_version.as_deref(), Some("2.1.332"), "{name}");
        }
    }

    #[test]
    fn a_usage_limit_signals_early_with_the_reset_of_what_refused() {
        let mut o = TurnObserver::new();
        let mut signals = Vec::new();
        for line in [INIT_332, RLE_WEEK_332, SYN_WEEK_332] {
            signals.extend(o.on_stdout_line(line));
        }
        assert_eq!(
            signals,
            [Signal::RateLimited {
                resets_at: Some(1_796_543_853)
            }]
        );
        // A rejected window in an event that did not refuse says nothing.
        let allowed = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","unifiedWindows":{"seven_day":{"utilization":1,"resetsAt":5,"status":"rejected"}}}}"#;
        let r = run(
            &[INIT_332, allowed, DONE, RESULT_OK],
            &[],
            ExitInfo::exited(0),
        );
        assert_eq!(r.outcome, TurnOutcome::ok());
    }

    fn text_of(result_line: &str) -> String {
        let v: Value = serde_json::from_str(result_line).unwrap();
        v["result"].as_str().unwrap().to_string()
    }

    #[test]
    fn aborted_tools_is_interrupted_even_without_is_error() {
        let r = run(
            &[INIT, TOOL_USE, RESULT_ABORTED_TOOLS],
            &[],
            ExitInfo::exited(0),
        );
        assert_eq!(
            r.outcome,
            TurnOutcome::aborted("turn interrupted during execution".into())
        );
    }

    #[test]
    fn success_after_retries_is_ok() {
        let r = run(
            &[INIT, RETRY_429, RETRY_429, DONE, RESULT_OK],
            &[],
            ExitInfo::exited(0),
        );
        assert_eq!(r.outcome, TurnOutcome::ok());
        assert_eq!(r.api_retries, 2);
    }

    #[test]
    fn api_retry_lines_become_signals_and_a_401_asks_for_one_early_kill() {
        let mut o = TurnObserver::new();
        assert_eq!(
            o.on_stdout_line(RETRY_429),
            vec![Signal::ApiRetry {
                attempt: 1,
                max_retries: 10,
                error_status: Some(429),
                error: Some("rate_limit".into()),
                delay_ms: 547,
            }]
        );
        let first = o.on_stdout_line(RETRY_401);
        assert_eq!(first.last(), Some(&Signal::KillEarlyAuth));
        let second = o.on_stdout_line(RETRY_401);
        assert!(!second.contains(&Signal::KillEarlyAuth), "{second:?}");
        let exit = ExitInfo {
            signal: Some(9),
            killed_early_for_auth: true,
            ..ExitInfo::default()
        };
        let r = o.finish(exit);
        assert_eq!(r.outcome, TurnOutcome::auth_failed());
        assert!(!r.prompt_reached_session);
    }

    #[test]
    fn a_rejected_rate_limit_event_signals_once_with_its_reset() {
        let mut o = TurnObserver::new();
        assert_eq!(
            o.on_stdout_line(RLE_RESET),
            vec![Signal::RateLimited {
                resets_at: Some(1_795_323_782)
            }]
        );
        assert_eq!(o.on_stdout_line(RLE_RESET), vec![]);
        let allowed = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","resetsAt":1,"isUsingOverage":false}}"#;
        let mut o = TurnObserver::new();
        assert_eq!(o.on_stdout_line(allowed), vec![]);
        for l in [INIT, DONE, RESULT_OK] {
            o.on_stdout_line(l);
        }
        assert_eq!(o.finish(ExitInfo::exited(0)).outcome, TurnOutcome::ok());
    }

    /// What CLI 2.1.197 printed with an OAuth token when the fake API's
    /// headers said the five-hour window was near its limit
    /// (`anthropic-ratelimit-unified-5h-surpassed-threshold: 0.9`).
    const RLE_WARNING: &str = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"allowed_warning","resetsAt":1795436569,"rateLimitType":"five_hour","utilization":0.92,"isUsingOverage":false,"surpassedThreshold":0.9},"uuid":"d1465113-f62e-4a91-aace-ba8e4d6458ef","session_id":"s"}"#;
    /// What it printed on every other OAuth run.
    const RLE_ALLOWED: &str = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"allowed","isUsingOverage":false},"uuid":"u","session_id":"s"}"#;

    #[test]
    fn the_early_warning_is_reported_and_is_no_limit() {
        let r = run(
            &[INIT, RLE_WARNING, DONE, RESULT_OK],
            &[],
            ExitInfo::exited(0),
        );
        assert_eq!(r.outcome, TurnOutcome::ok());
        assert_eq!(
            r.usage,
            Some(UsageSeen {
                status: UsageStatus::AllowedWarning,
                resets_at: Some(1_795_436_569),
                window: Some("five_hour".into()),
                utilization: Some(0.92),
            })
        );
        let mut o = TurnObserver::new();
        assert_eq!(
            o.on_stdout_line(RLE_WARNING),
            vec![],
            "no rate-limit signal"
        );
        let r = run(
            &[INIT, RLE_ALLOWED, DONE, RESULT_OK],
            &[],
            ExitInfo::exited(0),
        );
        assert_eq!(r.usage.map(|u| u.status), Some(UsageStatus::Allowed));
        let r = run(&[INIT, DONE, RESULT_OK], &[], ExitInfo::exited(0));
        assert_eq!(r.usage, None, "an API key prints no rate_limit_event");
        // A warning, then a refusal without a reset (a per-minute limit):
        // the warning's window is not the limit's reset.
        let r = run(
            &[INIT, RLE_WARNING, RLE_NO_RESET, SYN_429, RESULT_429_OAUTH],
            &[],
            ExitInfo::exited(1),
        );
        assert_eq!(r.outcome, rate_limited(None));
        // A bad window name or share is dropped, the warning kept.
        let odd = r#"{"type":"rate_limit_event","rate_limit_info":{"status":"allowed_warning","resetsAt":5,"rateLimitType":"Five Hours!","utilization":"high"}}"#;
        let r = run(&[INIT, odd, DONE, RESULT_OK], &[], ExitInfo::exited(0));
        let u = r.usage.unwrap();
        assert_eq!(
            (u.window, u.utilization, u.resets_at),
            (None, None, Some(5))
        );
    }

    #[test]
    fn assistant_text_about_errors_never_classifies() {
        let chatty = r#"{"type":"assistant","message":{"id":"msg_c","model":"claude-sonnet-4-5","content":[{"type":"text","text":"The API returned rate_limit_error (429), then 401 authentication_error: invalid api key. Prompt is too long. Request timed out."}],"usage":{"input_tokens":10,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"output_tokens":1}},"parent_tool_use_id":null,"session_id":"s"}"#;
        let tool_result = r#"{"type":"user","message":{"role":"user","content":[{"tool_use_id":"t","type":"tool_result","content":"HTTP 429 Too Many Requests; rate_limit; 401"}]}}"#;
        let r = run(
            &[INIT, chatty, tool_result, RESULT_OK],
            &[],
            ExitInfo::exited(0),
        );
        assert_eq!(r.outcome, TurnOutcome::ok());
        // The same lines in a crashed turn do not turn the crash into a rate limit.
        let r = run(&[INIT, chatty, tool_result], &[], ExitInfo::exited(3));
        assert!(r.outcome.kind == TurnOutcomeKind::Failed, "{:?}", r.outcome);
    }

    #[test]
    fn stdout_error_events_classify_a_turn_without_result() {
        let cases: &[(&str, TurnOutcome)] = &[
            (
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"Number of request tokens has exceeded your per-minute rate limit"}}"#,
                rate_limited(None),
            ),
            (
                r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#,
                TurnOutcome::auth_failed(),
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
                TurnOutcome::prompt_too_long(),
            ),
            (
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
                TurnOutcome::api_unavailable("Overloaded".into()),
            ),
            (
                r#"{"type":"error","error":{"type":"weird_error","message":"something odd"}}"#,
                TurnOutcome::failed("claude reported an error: something odd".into()),
            ),
        ];
        for (line, want) in cases {
            let r = run(&[INIT, line], &[], ExitInfo::exited(1));
            assert_eq!(&r.outcome, want, "{line}");
        }
    }

    #[test]
    fn stderr_markers_classify_a_turn_without_result() {
        let cases: &[(&str, TurnOutcome)] = &[
            ("Error: 429 Too Many Requests", rate_limited(None)),
            ("API error: rate_limit_error", rate_limited(None)),
            ("you are being rate limited", rate_limited(None)),
            ("Error: 401 Unauthorized", TurnOutcome::auth_failed()),
            (
                "OAuth token has expired. Please run /login",
                TurnOutcome::auth_failed(),
            ),
            (
                "Invalid API key · Please run /login",
                TurnOutcome::auth_failed(),
            ),
            ("Error: Prompt is too long", TurnOutcome::prompt_too_long()),
        ];
        for (line, want) in cases {
            let r = run(&[], &[line], ExitInfo::exited(1));
            assert_eq!(&r.outcome, want, "{line}");
            assert!(!r.prompt_reached_session);
        }
    }

    #[test]
    fn an_init_line_without_our_mcp_servers_connected_signals_once() {
        // What the real CLI prints with `"alwaysLoad": true`: `failed` when the
        // server exits, `pending` when it did not answer within the connect
        // timeout. Extra servers are never our business.
        let init = |servers: &str| {
            format!(
                r#"{{"type":"system","subtype":"init","session_id":"s","model":"m","mcp_servers":{servers}}}"#
            )
        };
        let cases: &[(&str, Vec<(String, String)>)] = &[
            (
                r#"[{"name":"hyperhive","status":"connected"},{"name":"bash","status":"connected"}]"#,
                vec![],
            ),
            (
                r#"[{"name":"hyperhive","status":"connected"},{"name":"matrix","status":"failed"}]"#,
                vec![],
            ),
            (r#"[]"#, vec![]),
            (
                r#"[{"name":"hyperhive","status":"failed"},{"name":"bash","status":"connected"}]"#,
                vec![("hyperhive".into(), "failed".into())],
            ),
            (
                r#"[{"name":"hyperhive","status":"pending"},{"name":"bash","status":"failed"}]"#,
                vec![
                    ("hyperhive".into(), "pending".into()),
                    ("bash".into(), "failed".into()),
                ],
            ),
        ];
        for (servers, want) in cases {
            let mut o = TurnObserver::new();
            let line = init(servers);
            let signals = o.on_stdout_line(&line);
            let got: Vec<_> = signals
                .into_iter()
                .filter_map(|s| match s {
                    Signal::McpNotConnected(v) => Some(v),
                    _ => None,
                })
                .collect();
            if want.is_empty() {
                assert!(got.is_empty(), "{servers}: {got:?}");
            } else {
                assert_eq!(got, std::slice::from_ref(want), "{servers}");
                assert!(o.on_stdout_line(&line).is_empty(), "sent once");
            }
        }
    }

    #[test]
    fn open_tool_calls_are_counted_until_their_results() {
        let mut o = TurnObserver::new();
        o.on_stdout_line(INIT);
        assert_eq!(o.open_tool_calls(), 0);
        o.on_stdout_line(TOOL_USE);
        o.on_stdout_line(TOOL_USE);
        assert_eq!(o.open_tool_calls(), 1, "one id, printed twice");
        o.on_stdout_line(TOOL_RESULT);
        assert_eq!(o.open_tool_calls(), 0);
        o.on_stdout_line(DONE);
        assert_eq!(o.open_tool_calls(), 0);
    }

    #[test]
    fn a_stderr_rate_limit_signals_once() {
        let mut o = TurnObserver::new();
        assert_eq!(o.on_stderr_line("listening on :14290"), vec![]);
        assert_eq!(
            o.on_stderr_line("HTTP 429 Too Many Requests"),
            vec![Signal::RateLimited { resets_at: None }]
        );
        assert_eq!(o.on_stderr_line("HTTP 429 again"), vec![]);
    }

    #[test]
    fn stderr_marker_helpers_match_words_only() {
        let rate = [
            ("HTTP 429", true),
            ("status=429;", true),
            ("rate_limit_error", true),
            ("Rate limit reached", true),
            ("rate-limited by upstream", true),
            ("connecting to 127.0.0.1:14290", false),
            ("request req_4291 done", false),
            ("took 1429ms", false),
            ("generate_limits()", false),
            ("", false),
        ];
        for (line, want) in rate {
            assert_eq!(stderr_rate_limited(line), want, "{line:?}");
        }
        let auth = [
            ("HTTP 401", true),
            ("{\"type\":\"authentication_error\"}", true),
            ("Invalid API key · Fix external API key", true),
            (
                "Failed to authenticate. API Error: 401 OAuth token has expired",
                true,
            ),
            ("listening on :14010", false),
            ("id=req_4011", false),
            ("4401 items", false),
        ];
        for (line, want) in auth {
            assert_eq!(stderr_auth_failed(line), want, "{line:?}");
        }
    }

    #[test]
    fn a_crash_without_result_names_the_exit_and_the_last_stderr_lines() {
        let stderr = [
            "starting",
            "loading",
            "Error: boom",
            "at foo.js:1",
            "at bar.js:2",
        ];
        let r = run(&[INIT], &stderr, ExitInfo::exited(3));
        assert_eq!(
            r.outcome,
            TurnOutcome::failed(
                "claude exited with code 3 without a result line; stderr: Error: boom | at foo.js:1 | at bar.js:2".into()
            )
        );
        assert_eq!(r.stderr_tail, stderr.map(String::from).to_vec());
        assert!(!r.prompt_reached_session);

        let killed = ExitInfo {
            signal: Some(9),
            ..ExitInfo::default()
        };
        let r = run(&[], &[], killed);
        assert_eq!(
            r.outcome,
            TurnOutcome::failed(
                "claude was killed by signal 9 without a result line and printed nothing on stderr"
                    .into()
            )
        );
    }

    #[test]
    fn the_missing_settings_file_error_is_a_plain_failure() {
        let r = run(
            &[],
            &["Error: Settings file not found: does_not_exist.json"],
            ExitInfo::exited(1),
        );
        assert_eq!(
            r.outcome,
            TurnOutcome::failed(
                "claude exited with code 1 without a result line; stderr: Error: Settings file not found: does_not_exist.json".into()
            )
        );
    }

    #[test]
    fn a_timeout_is_a_failure_naming_the_duration() {
        let exit = ExitInfo {
            signal: Some(9),
            timed_out: true,
            elapsed: Some(Duration::from_secs(600)),
            ..ExitInfo::default()
        };
        let r = run(&[INIT, RETRY_429], &[], exit);
        assert_eq!(
            r.outcome,
            TurnOutcome::failed("turn timed out after 600s".into())
        );
    }

    #[test]
    fn a_clean_result_with_a_bad_exit_is_a_failure() {
        let r = run(&[INIT, DONE, RESULT_OK], &[], ExitInfo::exited(2));
        assert_eq!(
            r.outcome,
            TurnOutcome::failed("claude exited with code 2 after reporting success".into())
        );
    }

    #[test]
    fn context_size_skips_synthetic_subagent_and_duplicate_lines() {
        let text_block = r#"{"type":"assistant","message":{"id":"msg_fake_4","model":"claude-sonnet-4-5","content":[{"type":"text","text":"x"}],"usage":{"input_tokens":7,"cache_read_input_tokens":8,"cache_creation_input_tokens":9,"output_tokens":1}},"parent_tool_use_id":null}"#;
        let tool_block = r#"{"type":"assistant","message":{"id":"msg_fake_4","model":"claude-sonnet-4-5","content":[{"type":"tool_use","id":"t","name":"Read","input":{}}],"usage":{"input_tokens":7,"cache_read_input_tokens":8,"cache_creation_input_tokens":9,"output_tokens":1}},"parent_tool_use_id":null}"#;
        let subagent = r#"{"type":"assistant","message":{"id":"msg_sub","model":"claude-haiku-4-5","content":[{"type":"text","text":"sub"}],"usage":{"input_tokens":99999,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"output_tokens":1}},"parent_tool_use_id":"toolu_1"}"#;
        let r = run(
            &[
                INIT, TOOL_USE, text_block, tool_block, subagent, SYN_429, RESULT_429,
            ],
            &[],
            ExitInfo::exited(1),
        );
        assert_eq!(r.context_tokens, Some(24));
        // result.usage is cumulative and never used for the context size.
        let r = run(&[INIT, RESULT_OK], &[], ExitInfo::exited(0));
        assert_eq!(r.context_tokens, None);
    }

    #[test]
    fn the_cli_window_prefers_the_init_model_then_the_largest() {
        let two = r#"{"type":"result","subtype":"success","is_error":false,"result":"ok","modelUsage":{"claude-haiku-4-5":{"contextWindow":200000,"maxOutputTokens":8000},"claude-sonnet-4-5":{"contextWindow":1000000,"maxOutputTokens":32000}}}"#;
        let r = run(&[two], &[], ExitInfo::exited(0));
        assert_eq!(
            (r.context_window, r.max_output_tokens),
            (Some(1_000_000), Some(32_000))
        );
        let init_haiku =
            r#"{"type":"system","subtype":"init","session_id":"s","model":"claude-haiku-4-5"}"#;
        let r = run(&[init_haiku, two], &[], ExitInfo::exited(0));
        assert_eq!(
            (r.context_window, r.max_output_tokens),
            (Some(200_000), Some(8000))
        );
    }

    #[test]
    fn garbage_and_blank_stdout_lines_are_ignored() {
        let r = run(
            &[
                "",
                "not json",
                "[1,2]",
                "{\"type\":\"stream_event\",\"event\":{}}",
                INIT,
                DONE,
                RESULT_OK,
            ],
            &["", "   "],
            ExitInfo::exited(0),
        );
        assert_eq!(r.outcome, TurnOutcome::ok());
        assert!(r.stderr_tail.is_empty());
    }

    #[test]
    fn only_assistant_or_result_lines_mean_the_prompt_reached_the_session() {
        let r = run(&[COMPACTING, INIT, RETRY_429], &[], ExitInfo::exited(1));
        assert!(!r.prompt_reached_session);
        let r = run(&[INIT, RESULT_BLOCKING], &[], ExitInfo::exited(1));
        assert!(r.prompt_reached_session);
    }

    #[test]
    fn a_successful_compaction_reports_its_tokens() {
        let r = observe(
            TurnObserver::compaction(),
            &[
                COMPACTING,
                COMPACT_OK_STATUS,
                INIT,
                BOUNDARY,
                SUMMARY_USER,
                COMPACTED_REPLAY,
                COMPACT_RESULT_OK,
            ],
            &[],
            ExitInfo::exited(0),
        );
        assert_eq!(r.outcome, TurnOutcome::compacted());
        assert_eq!(
            r.compact,
            Some(CompactStats {
                trigger: Some("manual".into()),
                pre_tokens: Some(191_057),
                post_tokens: Some(183),
            })
        );
        assert_eq!(r.context_tokens, Some(183));
        assert_eq!(r.num_turns, Some(0));
    }

    #[test]
    fn compaction_failures_exit_zero_but_are_failures() {
        let cases: &[(&str, &[&str], TurnOutcome)] = &[
            (
                "could not reduce",
                &[COMPACTING, COMPACT_FAILED_STATUS, INIT, COMPACT_FAILED_SYN, COMPACT_FAILED_RESULT],
                TurnOutcome::cannot_compact("Compaction failed · conversation could not be reduced below the context limit".into()),
            ),
            (
                "429 during compaction",
                &[COMPACTING, COMPACT_429_STATUS, INIT, COMPACT_FAILED_RESULT],
                rate_limited(None),
            ),
            (
                "no boundary",
                &[INIT, COMPACT_FAILED_RESULT],
                TurnOutcome::failed("compaction printed no compact_boundary: Compaction failed · conversation could not be reduced below the context limit".into()),
            ),
            (
                "not enough messages",
                &[
                    r#"{"type":"system","subtype":"status","status":null,"compact_result":"failed","compact_error":"Not enough messages to compact."}"#,
                    r#"{"type":"result","subtype":"success","is_error":false,"num_turns":0,"result":"Not enough messages to compact."}"#,
                ],
                TurnOutcome::cannot_compact("Not enough messages to compact.".into()),
            ),
            (
                "500 during compaction",
                &[COMPACTING, COMPACT_500_STATUS, INIT, COMPACT_FAILED_RESULT],
                TurnOutcome::api_unavailable(COMPACT_500_ERROR.into()),
            ),
            (
                "401 during compaction",
                &[COMPACTING, COMPACT_401_STATUS, INIT, COMPACT_FAILED_RESULT],
                TurnOutcome::auth_failed(),
            ),
            (
                "a crash during compaction",
                &[COMPACTING, r#"{"type":"system","subtype":"status","status":null,"compact_result":"failed","compact_error":"Error during compaction: something odd"}"#],
                TurnOutcome::failed("compaction failed: Error during compaction: something odd".into()),
            ),
        ];
        for (name, lines, want) in cases {
            let r = observe(TurnObserver::compaction(), lines, &[], ExitInfo::exited(0));
            assert_eq!(&r.outcome, want, "{name}");
            assert_eq!(r.compact, None, "{name}");
        }
    }

    #[test]
    fn a_turn_the_cli_compacted_on_its_own_is_compacted() {
        let auto = r#"{"type":"system","subtype":"compact_boundary","compact_metadata":{"trigger":"auto","pre_tokens":180000,"post_tokens":2000}}"#;
        let r = run(
            &[INIT, auto, SUMMARY_USER, DONE, RESULT_OK],
            &[],
            ExitInfo::exited(0),
        );
        assert_eq!(r.outcome, TurnOutcome::compacted());
        assert_eq!(r.context_tokens, Some(4800));
        assert_eq!(r.compact.and_then(|c| c.trigger).as_deref(), Some("auto"));
    }

    #[test]
    fn outcomes_display_for_notes() {
        assert_eq!(
            rate_limited(Some(5)).to_string(),
            "rate limited (resets at 5)"
        );
        assert_eq!(TurnOutcome::failed("x".into()).to_string(), "failed: x");
        assert_eq!(TurnOutcome::hung("x".into()).to_string(), "hung: x");
        assert!(TurnOutcome::compacted().is_ok() && !TurnOutcome::auth_failed().is_ok());
    }

    #[test]
    fn only_a_clean_success_result_reports_a_finished_turn() {
        let line = |l: &str| serde_json::from_str::<Value>(l).unwrap();
        assert_eq!(success_of(&line(RESULT_OK)), Some(Success::Finished));
        let mut shut = line(RESULT_OK);
        shut["interrupted_by_shutdown"] = Value::Bool(true);
        assert_eq!(success_of(&shut), Some(Success::Shutdown));
        shut["interrupted_by_shutdown"] = Value::Bool(false);
        assert_eq!(success_of(&shut), Some(Success::Finished));
        for not in [
            RESULT_429,
            RESULT_EXEC_ERROR,
            RESULT_ABORTED_TOOLS,
            RESULT_MAX_BUDGET,
            r#"{"type":"assistant","subtype":"success","is_error":false}"#,
        ] {
            assert_eq!(success_of(&line(not)), None, "{not}");
        }
    }

    /// The words the page shows and older turn-stats rows hold, byte for
    /// byte what the classifier's outcomes always printed.
    #[test]
    fn the_outcome_texts_are_pinned() {
        let m = || "m".to_string();
        let cases = [
            (TurnOutcome::ok(), "ok"),
            (TurnOutcome::compacted(), "compacted"),
            (
                TurnOutcome::rate_limited(Some(7)),
                "rate limited (resets at 7)",
            ),
            (TurnOutcome::rate_limited(None), "rate limited"),
            (TurnOutcome::auth_failed(), "authentication failed"),
            (TurnOutcome::prompt_too_long(), "prompt is too long"),
            (TurnOutcome::api_unavailable(m()), "API unavailable: m"),
            (TurnOutcome::aborted(m()), "interrupted: m"),
            (TurnOutcome::interrupted(m()), "interrupted: m"),
            (TurnOutcome::failed(m()), "failed: m"),
            (
                TurnOutcome::failed("turn timed out after 3s".into()),
                "failed: turn timed out after 3s",
            ),
            (TurnOutcome::not_started(m()), "not started: m"),
            (
                TurnOutcome::cannot_compact(m()),
                "compaction cannot shrink the session: m",
            ),
            (TurnOutcome::hung(m()), "hung: m"),
            (
                TurnOutcome::mcp_not_connected(m()),
                "MCP servers not connected: m",
            ),
            (TurnOutcome::turn_budget(m()), "turn budget reached: m"),
        ];
        for (o, text) in cases {
            assert_eq!(o.to_string(), text);
            // What older releases stored (they stored these texts before
            // the kinds) reads back as the same kind.
            let (kind, _) = TurnOutcomeKind::from_stored(text);
            if kind != TurnOutcomeKind::Other {
                assert_eq!(kind.as_str(), o.kind().as_str(), "{text}");
            }
        }
        assert_eq!(
            TurnOutcome::failed("turn timed out after 3s".into()).kind(),
            TurnOutcomeKind::TimedOut
        );
    }
}
