//! The limits every process agrees on, one home for each: line and body sizes,
//! answer budgets, waits, the status line, question options, reminder and
//! schedule horizons, and the bounds of one turn's counters. The broker
//! enforces them (through each command's `validate` and its answer budget); the
//! clients check the same constants before they send.

/// Longest request or response line accepted, newline excluded.
pub const MAX_LINE: usize = 1024 * 1024;

/// The start of every refusal of a send or wake that would take its agent
/// past its storage quota or its limit of a minute (the fleet file's
/// `retention`): a client that can wait (the bash daemon's completion wakes)
/// keeps the message and tries again later; any other refusal is final.
pub const OVER_QUOTA: &str = "over quota: ";

/// Longest message body any path that creates a message accepts (`send`,
/// `wake`, `send_to_parent`, questions, answers, reminders, scheduled prompts,
/// the MCP tools, the web page and the dashboard), in bytes of UTF-8. Even
/// fully JSON-escaped (six bytes a byte) a body this long leaves room for any
/// envelope under [`MAX_LINE`].
pub const MAX_BODY: usize = 64 * 1024;

/// Longest body of mail to another hive (`NAME@HIVE`), in bytes of UTF-8: it
/// travels as a Matrix event, which is capped at 64 KiB with its envelope and
/// its JSON escapes.
pub const MAX_REMOTE_BODY: usize = 48 * 1024;

/// A delivered reminder whose text is longer than this (in bytes) reaches the
/// model as a file in the agent's own state dir (`reminders/ID.md`), written by
/// the agent's side on delivery, and a preview; the broker keeps the whole
/// text in `broker.db`.
pub const REMINDER_FILE_BYTES: usize = 4096;

/// How many characters of a long reminder the preview shows.
pub const REMINDER_PREVIEW_CHARS: usize = 200;

/// The byte budget of one list answer (`inbox`, `recv`, `agents`, …): rows are
/// handed out until the next one would pass it (at least one message always
/// goes out).
pub const PAGE_BYTES: usize = 512 * 1024;

/// Longest `recv_next` / `recv` / `inbox` wait the broker honours, in seconds.
pub const MAX_WAIT_SECS: u64 = 180;

/// The longest the MCP tool `recv` waits, in seconds: below every limit the
/// supported CLIs put on a tool call by default (2.1.332 moves a call past
/// 120 s to the background when background tasks are on, and then may never
/// hand its result to the model; `docs/claude-cli.md`). `hive mcp` waits less
/// when claude's environment sets a lower limit (`mcp::hyperhive::recv_cap`).
pub const RECV_WAIT_CAP_SECS: u64 = 100;

/// Most messages one `recv` hands out.
pub const RECV_MAX: u32 = 32;

/// Most options an `ask` may offer, and the longest option in characters.
pub const MAX_OPTIONS: usize = 32;
pub const MAX_OPTION_CHARS: usize = 200;

/// Longest status line, in characters.
pub const MAX_STATUS_CHARS: usize = 200;

/// Longest revision a harness reports at start, in characters.
pub const MAX_REV_CHARS: usize = 100;

/// Longest `from` of a `wake`, in characters.
pub const MAX_SENDER_CHARS: usize = 64;

/// How far ahead a reminder or a scheduled prompt may be set with a delay:
/// longer delays are cut to this (ten years).
pub const TIMER_HORIZON_SECS: u64 = 10 * 365 * 86400;

/// The shortest period of a repeating scheduled prompt.
pub const MIN_EVERY_SECS: u64 = 60;

/// Pending reminders (and, separately, scheduled prompts) per agent by default
/// (`HIVE_REMIND_MAX_PENDING_PER_AGENT`).
pub const DEFAULT_MAX_PENDING_TIMERS: u64 = 50;

/// Lines `get_logs` and `get_host_journal` return by default and at most.
pub const DEFAULT_LOG_LINES: u64 = 100;
pub const MAX_LOG_LINES: u64 = 2000;

/// Longest systemd unit name `get_host_journal` takes.
pub const MAX_UNIT_CHARS: usize = 256;

/// Most bytes of a merge patch `request_apply_commit` accepts, inline or in a
/// file.
pub const MAX_PATCH_BYTES: usize = MAX_BODY;

/// Bounds of one `post_turn_counts`: a turn's counters, never a total.
pub const MAX_TURNS_PER_POST: u64 = 1_000_000;
pub const MAX_TOKENS_PER_POST: u64 = 1_000_000_000_000;
pub const MAX_COST_PER_POST: f64 = 1_000_000.0;

/// Most running tasks one `report_tasks` lists, and the longest command line
/// it keeps per task (in characters).
pub const MAX_REPORTED_TASKS: usize = 256;
pub const MAX_TASK_CMD_CHARS: usize = 200;

/// Longest last error a harness reports for a message (`requeue_inflight`,
/// `dead_letter`), in characters; the harness cuts a longer one.
pub const MAX_LAST_ERROR_CHARS: usize = 2000;

/// Longest pause detail a harness reports (`report_state`), in characters.
pub const MAX_PAUSE_DETAIL_CHARS: usize = 200;

/// Turns a history page (`/api/history`, `history`) or search hits (`search`)
/// hold without a `limit`, and at most.
pub const HISTORY_LIMIT_DEFAULT: u32 = 20;
pub const HISTORY_LIMIT_MAX: u32 = 200;

/// Longest search text (`search`, `/api/history?q=`), in characters.
pub const MAX_SEARCH_CHARS: usize = 1000;

/// How many characters of an input an error message echoes (then `…`).
pub const ECHO_CHARS: usize = 80;

/// Longest error text an `ok:false` line carries; longer ones are cut.
pub const MAX_ERROR_BYTES: usize = 4096;
