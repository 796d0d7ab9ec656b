//! The cost bench of issue 42: dollars per 1000 messages on a recorded week
//! of one agent's mail (`tests/bench/cost-trace.jsonl`, written by
//! `tests/bench/cost_trace.py`), replayed through `hive serve` and through
//! the naive loop (`claude -p --continue` per message), both running the same
//! real Claude Code CLI, model and message texts against the fake Anthropic
//! API with its prompt-cache model (`tests/common/fake_anthropic.rs`) on
//! virtual time. It owns the fake model's behaviour per message, the trace
//! driver of each side and the report; `make bench-cost` runs it
//! (`--ignored`: it takes minutes). The plain tests here check the cache
//! model's billing on hand-made requests and the fake model's answers.
//!
//! The fake model: every inbox message (its body starts with `[mNNNN]`) needs
//! one reply of [`REPLY_BYTES`] bytes sent with `mcp__hyperhive__send`, so a
//! message costs the same output whether it shares a turn or not; a wake
//! prompt that names more pending messages makes it drain them with one
//! `recv`; a checkpoint prompt gets a short note, a compaction request a
//! summary of [`SUMMARY_BYTES`] bytes; anything else ends the turn with a
//! short text.
//!
//! Virtual time: one file holds the time (unix seconds); the driver sets it
//! to each burst's first message's time before delivering the burst (on both
//! sides), the fake API's cache reads
//! it for expiry and the harness reads it through `HIVE_TEST_CLOCK_FILE` for
//! its cold-cache decision. Nothing waits on it: CLI-side timers run on real
//! time and are not part of the model.

#[path = "../common/mod.rs"]
mod common;

use common::claude_cli::{claude_env, real_cli, run_claude, RealCli, CLI_VERSIONS};
use common::fake_anthropic::{
    estimate_tokens, Bill, FakeAnthropic, PromptCache, RecordedRequest, RequestKind, Scenario,
    Step, VirtualClock, SONNET_4_5_PRICES,
};
use common::hive::*;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

/// The model both sides run (its prices are [`SONNET_4_5_PRICES`]).
const MODEL: &str = "claude-sonnet-4-5";
/// The trace's first day starts at this virtual time (2027-01-04 00:00 UTC, a Monday).
const T0: i64 = 1_799_020_800;
const DAY: i64 = 86_400;
/// One reply's body: N = 200 output tokens at 4 bytes a token.
const REPLY_BYTES: usize = 800;
/// A compaction summary: 2000 tokens.
const SUMMARY_BYTES: usize = 8_000;
/// The send tool, the same name on both sides (both load hive's MCP server).
const SEND: &str = "mcp__hyperhive__send";
const RECV: &str = "mcp__hyperhive__recv";
/// Messages taken per `recv`: four bodies of up to 6 KiB stay below the size
/// at which the CLI saves a tool result to a file and shows the model only
/// a preview.
const RECV_MAX: usize = 4;
/// The OAuth token both sides use under `HIVE_COST_CREDENTIAL=oauth` (a
/// subscriber: the CLI then asks for 1-hour cache entries; with the default
/// API key it asks for 5-minute ones).
const OAUTH_TOKEN: &str = "sk-ant-oat01-cost-bench";

fn oauth() -> bool {
    std::env::var("HIVE_COST_CREDENTIAL").as_deref() == Ok("oauth")
}

/// The agent the harness serves and the broker name the naive loop sends as.
const AGENT: &str = "ruth";
const NAIVE: &str = "naive";

// ---------------------------------------------------------------------------
// The fake model.

/// The `[mNNNN]` ids in `text`, in order.
fn ids_in(text: &str) -> Vec<u32> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("[m") {
        let digits: String = rest[at + 2..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if digits.len() == 4 && rest[at + 2 + 4..].starts_with(']') {
            out.push(digits.parse().unwrap());
        }
        rest = &rest[at + 2..];
    }
    out
}

/// Every text of a content block list or string: text blocks and the text of
/// tool results.
fn block_texts(content: &Value) -> Vec<String> {
    match content {
        Value::String(s) => vec![s.clone()],
        Value::Array(blocks) => blocks
            .iter()
            .flat_map(|b| match b["type"].as_str() {
                Some("text") => vec![b["text"].as_str().unwrap_or("").to_string()],
                Some("tool_result") => block_texts(&b["content"]),
                _ => Vec::new(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn is_tool_results(message: &Value) -> bool {
    message["content"]
        .as_array()
        .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"))
}

/// A deterministic filler of `bytes` bytes.
fn filler(seed: u32, bytes: usize) -> String {
    const WORDS: [&str; 8] = [
        "ack", "done", "queued", "checked", "merged", "noted", "shipped", "fixed",
    ];
    let mut out = String::new();
    let mut i = seed as usize;
    while out.len() < bytes {
        out.push_str(WORDS[i % WORDS.len()]);
        out.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out.truncate(bytes);
    out
}

/// The fake model's answer to one request (see the module's doc).
fn respond(body: &Value, kind: RequestKind) -> Step {
    if kind == RequestKind::Compact {
        return Step::compact(format!(
            "The agent answers operator mail; every message so far is answered. {}",
            filler(1, SUMMARY_BYTES)
        ));
    }
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    // Ids seen in user content (prompts and recv results) and ids replied.
    let mut seen: Vec<u32> = Vec::new();
    let mut replied: BTreeSet<u32> = BTreeSet::new();
    for m in &messages {
        if m["role"] == "user" {
            for text in block_texts(&m["content"]) {
                for id in ids_in(&text) {
                    if !seen.contains(&id) {
                        seen.push(id);
                    }
                }
            }
        } else if let Some(blocks) = m["content"].as_array() {
            for b in blocks.iter().filter(|b| b["type"] == "tool_use") {
                if b["name"] == SEND {
                    if let Some(id) = b["input"]["body"]
                        .as_str()
                        .and_then(|s| s.strip_prefix("re m"))
                        .and_then(|s| s.get(..4))
                        .and_then(|s| s.parse().ok())
                    {
                        replied.insert(id);
                    }
                }
            }
        }
    }
    if let Some(&id) = seen.iter().find(|id| !replied.contains(id)) {
        return Step::tool_use(
            SEND,
            json!({"to": "operator", "body": format!("re m{id:04}: {}", filler(id, REPLY_BYTES))}),
        );
    }
    // This turn: from its prompt (the last user message that is not tool results).
    let start = messages
        .iter()
        .rposition(|m| m["role"] == "user" && !is_tool_results(m))
        .unwrap_or(0);
    let turn = &messages[start..];
    let prompt = block_texts(&turn.first().cloned().unwrap_or(Value::Null)["content"]).join("\n");
    if prompt.contains("[system] Checkpoint") {
        return Step::text("Notes are current: every message is answered, nothing is open.");
    }
    // The result of this turn's last recv, if it called one.
    let last_recv = turn.iter().enumerate().rev().find_map(|(i, m)| {
        let called = m["content"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["name"] == RECV));
        called.then(|| {
            turn.get(i + 1)
                .map(|r| block_texts(&r["content"]).join("\n"))
                .unwrap_or_default()
        })
    });
    // Drain while the last batch was full or the broker cut it short.
    let more = prompt.contains("more pending")
        && last_recv.is_none_or(|t| {
            t.contains("more messages are waiting") || ids_in(&t).len() >= RECV_MAX
        });
    if more {
        return Step::tool_use(RECV, json!({"max": RECV_MAX}));
    }
    Step::text("Replied.")
}

// ---------------------------------------------------------------------------
// The trace and the two drivers.

struct Msg {
    t: i64,
    from: String,
    body: String,
}

fn load_trace() -> Vec<Msg> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bench/cost-trace.jsonl");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            Msg {
                t: v["t"].as_i64().unwrap(),
                from: v["from"].as_str().unwrap().to_string(),
                body: v["body"].as_str().unwrap().to_string(),
            }
        })
        .collect()
}

/// Consecutive messages less than this apart are one burst, delivered
/// together.
const BURST_GAP: i64 = 120;

fn bursts(trace: &[Msg]) -> Vec<&[Msg]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=trace.len() {
        if i == trace.len() || trace[i].t - trace[i - 1].t >= BURST_GAP {
            out.push(&trace[start..i]);
            start = i;
        }
    }
    out
}

/// One side's run: its bills and the requests they bill.
struct Side {
    name: String,
    bills: Vec<Bill>,
    requests: Vec<RecordedRequest>,
    messages: usize,
    wall: Duration,
}

/// Whether a process runs the CLI under `dir` (its npm prefix) in `cwd`
/// (the harness runs claude in its state dir).
fn cli_running(dir: &str, cwd: &Path) -> bool {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(dir))
                && std::fs::read_link(e.path().join("cwd")).is_ok_and(|c| c == cwd)
        })
}

/// The replies in the operator's inbox so far, by message id.
fn collect_replies(b: &Broker, replies: &mut BTreeMap<u32, usize>) {
    for m in operator_inbox(b) {
        if let Some(id) = m
            .body
            .strip_prefix("re m")
            .and_then(|s| s.get(..4))
            .and_then(|s| s.parse().ok())
        {
            *replies.entry(id).or_default() += 1;
        }
    }
}

fn check_replies(side: &str, trace: &[Msg], replies: &BTreeMap<u32, usize>) {
    let want: BTreeSet<u32> = trace.iter().flat_map(|m| ids_in(&m.body)).collect();
    let got: BTreeSet<u32> = replies.keys().copied().collect();
    assert_eq!(want, got, "{side}: every message answered");
    let twice: Vec<_> = replies.iter().filter(|(_, n)| **n != 1).collect();
    assert!(
        twice.is_empty(),
        "{side}: answered more than once: {twice:?}"
    );
}

/// How the hive side is run: the harness's knobs and the delivery.
struct HiveRun {
    name: &'static str,
    env: Vec<(&'static str, &'static str)>,
    /// Deliver one message at a time, each once the previous is answered.
    one_by_one: bool,
}

fn run_hive_side(cli: &RealCli, trace: &[Msg], run: &HiveRun) -> Side {
    let started = Instant::now();
    let dir = TempDir::new("cost-hive");
    let clock = VirtualClock::new(dir.path().join("clock"), T0 + trace[0].t - 60);
    let api = FakeAnthropic::start_with_cache(
        Scenario::new().respond_with(respond),
        PromptCache::new(clock.clone()),
    );
    let b = Broker::start(&[AGENT]);
    let cli_path = cli.display().to_string();
    let base = api.base_url();
    let clock_path = clock.path().display().to_string();
    let mut env = vec![
        ("HIVE_CLAUDE_BIN", cli_path.as_str()),
        ("ANTHROPIC_BASE_URL", base.as_str()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("HIVE_TURN_TIMEOUT_SECS", "120"),
        ("HIVE_DEFAULT_MODEL", MODEL),
        ("HIVE_TEST_CLOCK_FILE", clock_path.as_str()),
        ("RUST_LOG", "info"),
    ];
    if oauth() {
        env.push(("ANTHROPIC_API_KEY", ""));
        env.push(("CLAUDE_CODE_OAUTH_TOKEN", OAUTH_TOKEN));
    }
    env.extend(run.env.iter().copied());
    let h = Harness::start(&b, AGENT, &env);
    let cli_dir = cli_prefix(cli);
    let state_dir = h.state_dir();
    let idle = || {
        wait_for(Duration::from_secs(300), "the harness to go idle", || {
            let r = agent_row(&b, AGENT);
            if r.unread > 0 || r.inflight.is_some() {
                return None;
            }
            // No claude for a while: a checkpoint and its /compact are two runs.
            let quiet = Instant::now();
            while quiet.elapsed() < Duration::from_millis(1500) {
                if cli_running(&cli_dir, &state_dir) {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Some(())
        })
    };
    idle();
    let mut replies = BTreeMap::new();
    let mut sent = 0;
    for burst in bursts(trace) {
        // A burst arrives at once, at its first message's time: advancing the
        // clock message by message while sending would let the harness's
        // first turn read the burst's last time or an earlier one, as it
        // happens to race the sends.
        clock.set(T0 + burst[0].t);
        for m in burst {
            operator_send(&b, AGENT, &m.body);
            sent += 1;
            if run.one_by_one {
                wait_answered(&b, &mut replies, sent, &h);
                idle();
            }
        }
        wait_answered(&b, &mut replies, sent, &h);
        idle();
    }
    check_replies(run.name, trace, &replies);
    let failed = agent_row(&b, AGENT).turns_failed;
    assert_eq!(failed, 0, "{}: no turn failed\n{}", run.name, h.log());
    Side {
        name: run.name.to_string(),
        bills: api.bills(),
        requests: api.requests(),
        messages: trace.len(),
        wall: started.elapsed(),
    }
}

fn wait_answered(b: &Broker, replies: &mut BTreeMap<u32, usize>, sent: usize, h: &Harness) {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        collect_replies(b, replies);
        if replies.len() >= sent {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sent} messages sent, {} answered\n{}",
            replies.len(),
            h.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The npm prefix of the CLI (`…/claude-cli/VERSION`), in its processes'
/// command lines.
fn cli_prefix(cli: &RealCli) -> String {
    let p = cli.display().to_string();
    match p.find("/node_modules/") {
        Some(at) => p[..at].to_string(),
        None => p,
    }
}

fn run_naive_side(cli: &RealCli, trace: &[Msg]) -> Side {
    let started = Instant::now();
    let dir = TempDir::new("cost-naive");
    let clock = VirtualClock::new(dir.path().join("clock"), T0 + trace[0].t);
    let api = FakeAnthropic::start_with_cache(
        Scenario::new().respond_with(respond),
        PromptCache::new(clock.clone()),
    );
    let b = Broker::start(&[NAIVE]);
    let home = dir.path().join("home");
    let cwd = dir.path().join("work");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    let mcp = dir.path().join("mcp.json");
    std::fs::write(
        &mcp,
        json!({"mcpServers": {"hyperhive": {
            "command": hive_bin(),
            "args": ["mcp"],
            "env": {"HIVE_SOCKET": b.agent_socket(NAIVE), "RUST_LOG": "warn"}
        }}})
        .to_string(),
    )
    .unwrap();
    let mut env = claude_env(&home, &api.base_url());
    if oauth() {
        env.retain(|(k, _)| k != "ANTHROPIC_API_KEY");
        env.push(("CLAUDE_CODE_OAUTH_TOKEN".into(), OAUTH_TOKEN.into()));
    }
    let mcp = mcp.display().to_string();
    let mut replies = BTreeMap::new();
    let burst_of: Vec<i64> = bursts(trace)
        .iter()
        .flat_map(|b| b.iter().map(|_| b[0].t))
        .collect();
    for (i, m) in trace.iter().enumerate() {
        // The same virtual time as the hive side: the burst's first message's.
        clock.set(T0 + burst_of[i]);
        let mut args = vec![
            "-p",
            "--verbose",
            "--output-format",
            "stream-json",
            "--model",
            MODEL,
            "--mcp-config",
            &mcp,
            "--allowedTools",
            SEND,
        ];
        if i > 0 {
            args.push("--continue");
        }
        let prompt = format!("Message from {}:\n\n{}", m.from, m.body);
        let run = run_claude(cli, &cwd, &env, &args, &prompt, Duration::from_secs(180));
        assert!(
            !run.timed_out && run.result()["is_error"] == false,
            "naive message {i}: {run}"
        );
    }
    collect_replies(&b, &mut replies);
    check_replies("naive", trace, &replies);
    Side {
        name: "naive".into(),
        bills: api.bills(),
        requests: api.requests(),
        messages: trace.len(),
        wall: started.elapsed(),
    }
}

// ---------------------------------------------------------------------------
// The report.

/// What a billed request was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Purpose {
    Message,
    Checkpoint,
    Compaction,
}

fn purpose(bill: &Bill, requests: &[RecordedRequest]) -> Purpose {
    if bill.compaction {
        return Purpose::Compaction;
    }
    let body = &requests[bill.request].body;
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let prompt = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user" && !is_tool_results(m))
        .map(|m| block_texts(&m["content"]).join("\n"))
        .unwrap_or_default();
    if prompt.contains("[system] Checkpoint") {
        Purpose::Checkpoint
    } else {
        Purpose::Message
    }
}

fn day_of(bill: &Bill) -> i64 {
    (bill.at - T0).div_euclid(DAY)
}

fn sum<'a>(bills: impl Iterator<Item = &'a Bill>) -> (Bill, usize) {
    let mut total = Bill::default();
    let mut n = 0;
    for b in bills {
        total.add(b);
        n += 1;
    }
    (total, n)
}

fn usd(b: &Bill) -> f64 {
    b.dollars(&SONNET_4_5_PRICES)
}

fn row(label: &str, b: &Bill, n: usize) -> String {
    format!(
        "  {label:<12} {n:>5} {:>10} {:>10} {:>10} {:>11} {:>9}  ${:>8.4}",
        b.input,
        b.write_5m,
        b.write_1h,
        b.read,
        b.output,
        usd(b)
    )
}

/// With `HIVE_COST_DUMP=DIR`, each side's request bodies, one JSON file each.
fn dump(side: &Side) {
    let Ok(dir) = std::env::var("HIVE_COST_DUMP") else {
        return;
    };
    let dir = Path::new(&dir).join(side.name.replace([' ', ','], "_"));
    std::fs::create_dir_all(&dir).unwrap();
    for (i, r) in side
        .requests
        .iter()
        .enumerate()
        .filter(|(_, r)| r.is_post())
    {
        std::fs::write(dir.join(format!("{i:04}.json")), r.body.to_string()).unwrap();
    }
}

fn print_side(side: &Side) {
    dump(side);
    println!(
        "\n{} — {} messages, {} billed requests, {:.0} s of wall time",
        side.name,
        side.messages,
        side.bills.len(),
        side.wall.as_secs_f64()
    );
    println!(
        "  {:<12} {:>5} {:>10} {:>10} {:>10} {:>11} {:>9}  {:>9}",
        "", "reqs", "input", "write 5m", "write 1h", "read", "output", "dollars"
    );
    let days: BTreeSet<i64> = side.bills.iter().map(day_of).collect();
    for d in days {
        let (b, n) = sum(side.bills.iter().filter(|b| day_of(b) == d));
        println!("{}", row(&format!("day {d}"), &b, n));
    }
    let (total, n) = sum(side.bills.iter());
    println!("{}", row("total", &total, n));
    for p in [Purpose::Message, Purpose::Checkpoint, Purpose::Compaction] {
        let (b, n) = sum(side
            .bills
            .iter()
            .filter(|b| purpose(b, &side.requests) == p));
        if n > 0 {
            println!("{}", row(&format!("  {p:?}").to_lowercase(), &b, n));
        }
    }
    let overheads: BTreeSet<u64> = side.bills.iter().map(|b| b.overhead).collect();
    println!(
        "  fixed per-request overhead (tools + system prompt): {} tokens per request ({}), {} tokens over the trace",
        overheads
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" / "),
        if overheads.len() == 1 { "every request" } else { "by request kind" },
        total.overhead
    );
    let largest = side
        .bills
        .iter()
        .map(|b| b.input + b.write_5m + b.write_1h + b.read)
        .max()
        .unwrap_or(0);
    println!("  largest request: {largest} tokens");
    // When each checkpoint and compaction ran, on the virtual clock, and
    // the context it carried: where a reset or a compaction was decided.
    for b in &side.bills {
        let p = purpose(b, &side.requests);
        if p != Purpose::Message {
            let t = b.at - T0;
            println!(
                "  {p:?} at day {} {:02}:{:02}:{:02}, {} tokens of context",
                t.div_euclid(DAY),
                t.rem_euclid(DAY) / 3600,
                t.rem_euclid(3600) / 60,
                t.rem_euclid(60),
                b.input + b.write_5m + b.write_1h + b.read
            );
        }
    }
    let (compactions, n) = sum(side.bills.iter().filter(|b| b.compaction));
    if n > 0 {
        println!(
            "  compaction prompt: the CLI's summary instruction, {} uncached tokens a compaction \
             (${:.4} of its ${:.4}; the rest is reading the context and writing the summary)",
            compactions.input / n as u64,
            compactions.input as f64 * SONNET_4_5_PRICES.input / 1e6 / n as f64,
            usd(&compactions) / n as f64
        );
    }
    println!(
        "  dollars per 1000 messages: ${:.2}",
        usd(&total) / side.messages as f64 * 1000.0
    );
}

fn per_day(side: &Side) -> BTreeMap<i64, f64> {
    let mut out = BTreeMap::new();
    for b in &side.bills {
        *out.entry(day_of(b)).or_insert(0.0) += usd(b);
    }
    out
}

fn total_usd(side: &Side) -> f64 {
    side.bills.iter().map(usd).sum()
}

/// Prints hive against the naive loop and says whether the goals are met.
fn compare(hive: &Side, naive: &Side) -> bool {
    println!("\n{} / naive, by day (goal: every day ≤ 1.1×)", hive.name);
    let (h, n) = (per_day(hive), per_day(naive));
    let mut days_met = true;
    for (d, nd) in &n {
        let hd = h.get(d).copied().unwrap_or(0.0);
        let ratio = hd / nd;
        let ok = ratio <= 1.1;
        days_met &= ok;
        println!(
            "  day {d}: ${hd:.4} / ${nd:.4} = {ratio:.3}×  {}",
            if ok { "met" } else { "MISSED" }
        );
    }
    // Hive's boot turn runs before the first message, on day 0.
    let ratio = total_usd(hive) / total_usd(naive);
    let total_met = ratio <= 0.6;
    println!(
        "  total: ${:.4} / ${:.4} = {ratio:.3}× (goal ≤ 0.6×)  {}",
        total_usd(hive),
        total_usd(naive),
        if total_met { "met" } else { "MISSED" }
    );
    println!("  per day: {}", if days_met { "met" } else { "MISSED" });
    total_met && days_met
}

fn newest_cli() -> Option<RealCli> {
    real_cli(CLI_VERSIONS[1])
}

/// The whole cost bench: the naive loop, hive, and hive with each lever
/// off (`HIVE_COST_LEVERS=0` skips the levers, `=all` adds one message per
/// turn; `HIVE_COST_ONLY=TEXT` runs only the levers whose name has TEXT).
#[test]
#[ignore = "minutes of real CLI runs: make bench-cost"]
fn cost_bench() {
    let Some(cli) = newest_cli() else {
        return;
    };
    let mut trace = load_trace();
    // A shorter replay for trying the bench out: the first N messages.
    if let Some(n) = std::env::var("HIVE_COST_MESSAGES")
        .ok()
        .and_then(|n| n.parse().ok())
    {
        trace.truncate(n);
    }
    println!(
        "cost bench: {} messages in {} bursts over {:.1} days, Claude Code {}, model {MODEL}, \
         {}, prices {:?}",
        trace.len(),
        bursts(&trace).len(),
        (trace.last().unwrap().t - trace[0].t) as f64 / DAY as f64,
        cli.version,
        if oauth() {
            "an OAuth token (the CLI asks for 1-hour cache entries)"
        } else {
            "an API key (the CLI asks for 5-minute cache entries)"
        },
        SONNET_4_5_PRICES
    );
    let only = std::env::var("HIVE_COST_ONLY").unwrap_or_default();
    let naive = run_naive_side(&cli, &trace);
    print_side(&naive);
    let hive = run_hive_side(
        &cli,
        &trace,
        &HiveRun {
            name: "hive",
            env: Vec::new(),
            one_by_one: false,
        },
    );
    print_side(&hive);
    let met = compare(&hive, &naive);
    if std::env::var("HIVE_COST_LEVERS").as_deref() != Ok("0") {
        let levers = [
            HiveRun {
                name: "hive, auto session-reset off",
                env: vec![("HIVE_AUTO_RESET_WATERMARK_TOKENS", "0")],
                one_by_one: false,
            },
            HiveRun {
                name: "hive, compact watermark off",
                env: vec![("HIVE_AUTO_COMPACT", "false")],
                one_by_one: false,
            },
            HiveRun {
                name: "hive, cold after 5 minutes (HIVE_CACHE_TTL_SECS=300)",
                env: vec![("HIVE_CACHE_TTL_SECS", "300")],
                one_by_one: false,
            },
            HiveRun {
                name: "hive, one message per turn",
                env: Vec::new(),
                one_by_one: true,
            },
        ];
        // One message per turn waits for each reply: 10 minutes more.
        let all = std::env::var("HIVE_COST_LEVERS").as_deref() == Ok("all");
        for lever in levers
            .iter()
            .filter(|l| all || !l.one_by_one)
            .filter(|l| only.is_empty() || l.name.contains(&only))
        {
            let side = run_hive_side(&cli, &trace, lever);
            print_side(&side);
            compare(&side, &naive);
            println!(
                "  lever effect: {} costs {:.3}× hive with every lever on",
                lever.name,
                total_usd(&side) / total_usd(&hive)
            );
        }
    }
    println!("\ncost bench: {}", if met { "met" } else { "MISSED" });
}

// ---------------------------------------------------------------------------
// Plain tests of the cache model and the fake model.

fn request(system: &str, messages: Value) -> Value {
    json!({
        "model": MODEL,
        "tools": [{"name": "t", "description": "a tool", "input_schema": {}}],
        "system": [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}],
        "messages": messages,
    })
}

fn post(api: &FakeAnthropic, body: &Value) -> Value {
    let resp = ureq::post(&format!("{}/v1/messages", api.base_url()))
        .send_json(body.clone())
        .unwrap();
    let text = resp.into_string().unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn the_cache_model_writes_reads_expires_and_splits_by_ttl() {
    let dir = TempDir::new("cost-cache");
    let clock = VirtualClock::new(dir.path().join("clock"), 1_000_000);
    let api = FakeAnthropic::start_with_cache(
        Scenario::new().otherwise(Step::text("abcd")),
        PromptCache::new(clock.clone()),
    );
    let system = "s".repeat(8_000); // ~2000 tokens: above the minimum
    let first = json!([{"role": "user", "content": [
        {"type": "text", "text": "hello", "cache_control": {"type": "ephemeral"}}]}]);
    let r1 = post(&api, &request(&system, first.clone()));
    let u1 = &r1["usage"];
    assert_eq!(u1["cache_read_input_tokens"], 0);
    let written = u1["cache_creation_input_tokens"].as_u64().unwrap();
    assert!(written > 2000, "{u1}");
    assert_eq!(
        u1["cache_creation"]["ephemeral_5m_input_tokens"].as_u64(),
        Some(written)
    );
    assert_eq!(
        u1["input_tokens"], 0,
        "everything up to the last breakpoint is cached"
    );
    assert_eq!(u1["output_tokens"], 1, "four bytes of answer");

    // The next request of the conversation: the old breakpoint's prefix is
    // read, the new part written.
    let second = json!([
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "abcd"}]},
        {"role": "user", "content": [{"type": "text", "text": "more", "cache_control": {"type": "ephemeral"}}]}
    ]);
    clock.set(1_000_000 + 299);
    let u2 = post(&api, &request(&system, second.clone()))["usage"].clone();
    assert_eq!(
        u2["cache_read_input_tokens"].as_u64(),
        Some(written),
        "{u2}"
    );
    assert!(u2["cache_creation_input_tokens"].as_u64().unwrap() > 0);

    // A hit refreshed the entry; 5 minutes without one expire it.
    clock.set(1_000_000 + 299 + 301);
    let u3 = post(&api, &request(&system, second))["usage"].clone();
    assert_eq!(u3["cache_read_input_tokens"], 0, "{u3}");

    // Another caller with the same prefix shares the entry written just now.
    let u4 = post(&api, &request(&system, first))["usage"].clone();
    assert!(
        u4["cache_read_input_tokens"].as_u64().unwrap() > 2000,
        "{u4}"
    );

    // A 1-hour breakpoint is a 1-hour write, still there after 5 minutes.
    let mut long = request(
        &"x".repeat(8_000),
        json!([{"role": "user", "content": "hi"}]),
    );
    long["system"][0]["cache_control"] = json!({"type": "ephemeral", "ttl": "1h"});
    let u5 = post(&api, &long)["usage"].clone();
    assert!(
        u5["cache_creation"]["ephemeral_1h_input_tokens"]
            .as_u64()
            .unwrap()
            > 2000
    );
    assert_eq!(u5["cache_creation"]["ephemeral_5m_input_tokens"], 0);
    clock.set(1_000_000 + 600 + 3000);
    let u6 = post(&api, &long)["usage"].clone();
    assert!(
        u6["cache_read_input_tokens"].as_u64().unwrap() > 2000,
        "{u6}"
    );

    // Below the minimum cacheable length nothing is written.
    let short = request("tiny", json!([{"role": "user", "content": "hi"}]));
    let u7 = post(&api, &short)["usage"].clone();
    assert_eq!(u7["cache_creation_input_tokens"], 0, "{u7}");
    assert!(u7["input_tokens"].as_u64().unwrap() > 0);

    let bills = api.bills();
    assert_eq!(bills.len(), 7);
    let b = bills[0];
    let want = (b.write_5m as f64 * 3.75 + b.output as f64 * 15.0) / 1e6;
    assert!((b.dollars(&SONNET_4_5_PRICES) - want).abs() < 1e-12);
    assert_eq!(
        b.overhead,
        b.write_5m - estimate_tokens(json!({"type": "text", "text": "hello"}).to_string().len())
    );
}

#[test]
fn the_fake_model_replies_once_per_message_and_drains_pending_ones() {
    let prompt = |text: &str| json!({"role": "user", "content": [{"type": "text", "text": text}]});
    let body = |messages: Value| json!({"model": MODEL, "messages": messages});
    let send_of = |step: &Step| match &step.reply {
        common::fake_anthropic::Reply::ToolUse { name, input } if name == SEND => {
            input["body"].as_str().map(|b| b[..9].to_string())
        }
        _ => None,
    };
    // A wake prompt naming two more: send, then recv, then one send each.
    let wake = prompt(
        "Message from operator:\n\n[m0007] hi\n\n(2 more pending — drain via mcp__hyperhive__recv)",
    );
    let s1 = respond(&body(json!([wake])), RequestKind::Messages);
    assert_eq!(send_of(&s1).as_deref(), Some("re m0007:"));
    let sent = json!({"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": SEND,
        "input": {"to": "operator", "body": "re m0007: x"}}]});
    let result = |text: &str| json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": text}]});
    let s2 = respond(
        &body(json!([wake, sent, result("sent")])),
        RequestKind::Messages,
    );
    assert!(
        matches!(&s2.reply, common::fake_anthropic::Reply::ToolUse { name, .. } if name == RECV)
    );
    let asked = json!({"role": "assistant", "content": [{"type": "tool_use", "id": "b", "name": RECV, "input": {}}]});
    let got =
        result("#8 from operator (message): [m0008] a\n#9 from operator (message): [m0009] b");
    let s3 = respond(
        &body(json!([wake, sent, result("sent"), asked, got])),
        RequestKind::Messages,
    );
    assert_eq!(send_of(&s3).as_deref(), Some("re m0008:"));
    // Everything answered and drained: the turn ends.
    let all = json!([wake, sent, result("sent"), asked, got,
        {"role": "assistant", "content": [{"type": "tool_use", "id": "c", "name": SEND, "input": {"body": "re m0008: x"}}]},
        result("sent"),
        {"role": "assistant", "content": [{"type": "tool_use", "id": "d", "name": SEND, "input": {"body": "re m0009: x"}}]},
        result("sent")]);
    let s4 = respond(&body(all), RequestKind::Messages);
    assert_eq!(
        s4.reply,
        common::fake_anthropic::Reply::Text("Replied.".into())
    );
    // A checkpoint is a note, a compaction a summary.
    let cp = respond(
        &body(json!([prompt("[system] Checkpoint: flush")])),
        RequestKind::Messages,
    );
    assert!(matches!(cp.reply, common::fake_anthropic::Reply::Text(_)));
    let c = respond(&body(json!([prompt("summarise")])), RequestKind::Compact);
    assert!(
        matches!(c.reply, common::fake_anthropic::Reply::Compact(ref s) if s.len() > SUMMARY_BYTES)
    );
}
