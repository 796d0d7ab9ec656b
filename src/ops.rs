//! The client commands: `hive wake` for scripts inside an agent's container and
//! the operator commands (`send`, `inbox`, `agents`, `failed`, `retry`,
//! `message`,
//! `resume`, `questions`, `answer`, `cancel-question`, `timers`, `approvals`,
//! `approve`, `deny`, `start`, `stop`, `restart`, `update`, and `search` and
//! `history`, which
//! `hive up` answers from the agents' pages) on the host socket. Each
//! builds the contract's command and sends it with the typed client
//! ([`crate::proto::Client`]), printed as plain text for people or `--json`
//! (the answer as the broker sent it) for scripts. A command is checked by its
//! own rules before it is sent, so nothing the broker would refuse leaves, and
//! every text an agent could have written goes through [`printable`] before it
//! reaches the operator's terminal.

use crate::cli::{
    AgentArgs, AnswerArgs, DenyArgs, FailedArgs, HistoryArgs, HostArgs, InboxArgs, Lifecycle,
    NotifyArgs, ResumeArgs, SearchArgs, SendArgs, TimersArgs, WakeArgs,
};
use crate::proto::cmd::{
    self, Agents, Answer, Approvals, Approve, CancelQuestion, Deny, Failed, History, Inbox,
    InboxAck, MessageState, Questions, RestartAgent, Resume, Retry, Search, StartAgent, StopAgent,
    Supervision, SupervisionReply, Turn, TurnKind, UpdateAgent, Version, Wake,
};
use crate::proto::limits::MAX_BODY;
use crate::proto::lines::ok_line;
use crate::proto::paths::{DEFAULT_AGENT_SOCKET, DEFAULT_HOST_SOCKET, UP_HOST_SOCKET};
use crate::proto::text::{fmt_time, is_control_or_bidi, preview};
use crate::proto::{AgentRow, AgentState, Client, Command, HYPERHIVE_REV};
use serde::Serialize;
use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::path::PathBuf;

/// `--socket`, else the environment variable, else the default.
pub fn socket_path(flag: &Option<PathBuf>, env: &str, default: &str) -> PathBuf {
    flag.clone()
        .unwrap_or_else(|| crate::sys::env::Env::process().path_or(env, default))
}

fn host_client(h: &HostArgs) -> Result<Client, String> {
    let fallback = if std::path::Path::new(UP_HOST_SOCKET).exists() {
        UP_HOST_SOCKET
    } else {
        DEFAULT_HOST_SOCKET
    };
    let path = socket_path(&h.socket, "HIVE_HOST_SOCKET", fallback);
    Client::connect(&path).map_err(|e| e.to_string())
}

/// `s` made safe for a terminal: control and bidi characters (ESC and the
/// CSI/OSC sequences it starts, C1 controls, DEL, bidi overrides and isolates)
/// are shown as visible escapes (`\x1b`, `\u{202e}`). Newlines stay when
/// `keep_newlines` (message bodies); tabs always stay.
pub fn printable(s: &str, keep_newlines: bool) -> Cow<'_, str> {
    let escape = |c: char| match c {
        '\n' => !keep_newlines,
        '\t' => false,
        c => is_control_or_bidi(c),
    };
    if !s.chars().any(escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if !escape(c) {
            out.push(c);
        } else if (c as u32) < 0x100 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:04x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// One line of text for a terminal (names, statuses, options).
fn line(s: &str) -> Cow<'_, str> {
    printable(s, false)
}

/// A multi-line text (a message body, a question) made safe for a terminal
/// and indented by two spaces on every line, so no line of it can pass for
/// a header of the listing it is in (robustness review N11).
fn indented(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    for (i, l) in printable(s, true).split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str("  ");
        out.push_str(l);
    }
    out
}

/// An excerpt on one line: its line breaks and runs of white space are one
/// space each (a search snippet is words around a match, not a layout).
fn one_line(s: &str) -> Cow<'_, str> {
    let joined = s.split_whitespace().collect::<Vec<_>>().join(" ");
    Cow::Owned(line(&joined).into_owned())
}

/// A command is refused here, before anything is sent, when the broker would
/// refuse it for its own fields.
fn checked<C: Command>(cmd: C) -> Result<C, String> {
    cmd.validate()
        .map_err(|e| format!("{e}; nothing was sent"))?;
    Ok(cmd)
}

fn too_big(size: u64) -> String {
    format!(
        "the message is {size} bytes; the limit is {MAX_BODY} bytes (64 KiB), so nothing was sent. \
         Send a shorter text, or write it to a file and send its path"
    )
}

/// Sends `cmd` on `c` and returns its answer, the broker's refusal as text.
fn call<C: Command>(c: &mut Client, cmd: &C) -> Result<C::Reply, String> {
    c.call(cmd).map_err(|e| e.to_string())
}

/// Prints an answer as `--json` shows it: the broker's `ok:true` line.
fn print_json<T: Serialize>(reply: &T) {
    println!("{}", ok_line(reply));
}

/// The argument itself, or stdin for `-` (read up to just past the body
/// limit; the rest is counted, not kept, to say how big it was).
fn read_text(arg: &str, what: &str) -> Result<String, String> {
    if arg != "-" {
        return Ok(arg.to_string());
    }
    read_stdin(what)
}

/// [`read_text`] of stdin. A function of its own: `io::copy`'s 8 KiB buffer
/// on the stack would otherwise be in the frame of every `hive wake` and
/// `hive send`, whose stack probes touch (and fault in) two more pages of
/// stack even when the text is an argument.
#[inline(never)]
fn read_stdin(what: &str) -> Result<String, String> {
    let cannot = |e: std::io::Error| format!("cannot read {what} from stdin: {e}");
    let mut stdin = std::io::stdin().lock();
    let mut buf = Vec::new();
    (&mut stdin)
        .take(MAX_BODY as u64 + 2)
        .read_to_end(&mut buf)
        .map_err(cannot)?;
    if buf.len() > MAX_BODY + 1 {
        let rest = std::io::copy(&mut stdin, &mut std::io::sink()).map_err(cannot)?;
        return Err(too_big(buf.len() as u64 + rest));
    }
    let mut s = String::from_utf8(buf)
        .map_err(|_| format!("cannot read {what} from stdin: it is not valid UTF-8 text"))?;
    if s.ends_with('\n') {
        s.pop();
    }
    Ok(s)
}

/// A broker older than traces refuses the `traceparent` field as unknown:
/// the error says so in words (issue 43).
fn too_old_for_traceparent(e: String, tp: &Option<String>) -> String {
    if tp.is_some() && e.contains("unknown field") && e.contains("traceparent") {
        format!(
            "the broker is too old for --traceparent (it refuses the field: {e}); upgrade the \
             broker (restart hive up or hive broker with this hive), or leave --traceparent out"
        )
    } else {
        e
    }
}

pub fn wake(a: &WakeArgs) -> Result<(), String> {
    let body = read_text(&a.body, "the body")?;
    let wake = checked(Wake {
        from: a.from.clone(),
        body,
        transient: a.transient,
        to: a.to.clone(),
        traceparent: a.traceparent.clone(),
    })?;
    let mut c = match &a.to {
        Some(_) => host_client(&HostArgs {
            socket: a.socket.clone(),
            json: false,
        })?,
        None => {
            let path = socket_path(&a.socket, "HIVE_SOCKET", DEFAULT_AGENT_SOCKET);
            Client::connect(&path).map_err(|e| {
                // Run where `hive up` keeps its hive, the operator most
                // likely meant one of its agents.
                if a.socket.is_none() && std::path::Path::new(UP_HOST_SOCKET).exists() {
                    format!(
                        "{e}; here is a hive up directory: wake one of its agents with \
                         hive wake --to AGENT (through {UP_HOST_SOCKET})"
                    )
                } else {
                    e.to_string()
                }
            })?
        }
    };
    let r = call(&mut c, &wake).map_err(|e| too_old_for_traceparent(e, &a.traceparent))?;
    // One line for the script's log; a closed stdout (cron, a daemon) is no
    // reason to fail: the message is stored already.
    let said = match r.id {
        Some(id) if !a.transient => format!("queued #{id} for {}", line(&r.to.to_string())),
        _ => format!("delivered to {} (not stored)", line(&r.to.to_string())),
    };
    let _ = writeln!(std::io::stdout(), "{said}");
    Ok(())
}

pub fn send(a: &SendArgs) -> Result<(), String> {
    let body = read_text(&a.text, "the message")?;
    let send = checked(cmd::Send {
        to: a.to.clone(),
        body,
        in_reply_to: a.reply_to,
        receipt: false,
        traceparent: a.traceparent.clone(),
    })?;
    let mut c = host_client(&a.host)?;
    let r = call(&mut c, &send).map_err(|e| too_old_for_traceparent(e, &a.traceparent))?;
    if a.host.json {
        print_json(&r);
    } else {
        println!("sent #{} to {}", r.id.unwrap_or_default(), line(&a.to));
    }
    Ok(())
}
/// Prints the operator's unread messages page by page; each page is acked only
/// after it was written and flushed, so `hive inbox | head` or a broken pipe
/// leaves what was not shown unread (`--peek` acks nothing).
pub fn inbox(a: &InboxArgs) -> Result<(), String> {
    let mut c = host_client(&a.host)?;
    let mut after = None;
    let mut wait = Some(a.wait);
    let mut shown = 0usize;
    loop {
        let req = Inbox {
            wait_seconds: wait.take(),
            peek: a.peek,
            after,
        };
        let r = call(&mut c, &req)?;
        let ids: Vec<i64> = r.messages.iter().map(|m| m.id).collect();
        let mut out = std::io::stdout().lock();
        let written = if a.host.json {
            writeln!(out, "{}", ok_line(&r))
        } else {
            r.messages.iter().try_for_each(|m| {
                let reply = m
                    .in_reply_to
                    .map(|i| format!(" (re #{i})"))
                    .unwrap_or_default();
                writeln!(
                    out,
                    "#{} {} from {}{reply}:\n{}\n",
                    m.id,
                    fmt_time(m.sent_at),
                    line(m.from.as_str()),
                    indented(&m.body)
                )
            })
        };
        written
            .and_then(|_| out.flush())
            .map_err(|e| format!("cannot write the inbox: {e} (nothing was marked read)"))?;
        shown += ids.len();
        if !a.peek && !ids.is_empty() {
            call(&mut c, &InboxAck { ids: ids.clone() })?;
        }
        after = ids.last().copied().or(after);
        if !r.more {
            break;
        }
    }
    if shown == 0 && !a.host.json {
        println!("no unread messages");
    }
    Ok(())
}

pub fn agents(h: &HostArgs) -> Result<(), String> {
    let mut c = host_client(h)?;
    let r = call(&mut c, &Agents {})?;
    if h.json {
        print_json(&r);
        return Ok(());
    }
    // Under `hive up` the supervisor's view replaces the bare yes/no.
    let sup: Option<SupervisionReply> = c.call(&Supervision {}).ok();
    println!(
        "{:<10} {:<10} {:>6} {:>9} {:>6} {:<16} {:<26} STATUS",
        "NAME", "PARENT", "UNREAD", "INFLIGHT", "FAILED", "POOL", "STATE"
    );
    for a in r.agents {
        let inflight = a
            .inflight
            .map(|i| format!("#{i}"))
            .unwrap_or_else(|| "-".into());
        let s = sup
            .as_ref()
            .and_then(|s| s.agents.iter().find(|x| x.name == a.name));
        println!(
            "{:<10} {:<10} {:>6} {:>9} {:>6} {:<16} {:<26} {}",
            line(&a.name),
            line(&a.parent),
            a.unread,
            inflight,
            a.failed,
            line(&short_pool(a.pool.as_deref())),
            line(&agent_state(&a, s)),
            line(&match &a.model_override {
                // The page's choice in force shows before the status line.
                Some(m) => format!("[model {m}, set on its page] {}", a.status_text),
                None => a.status_text.clone(),
            })
        );
    }
    left_off(r.left_off, "agents");
    if let Some(b) = &r.bridge {
        println!("{}", bridge_line(b));
    }
    Ok(())
}

/// `hive agents`' POOL: the pool as `--json` names it (`account:NAME`,
/// `key:` and its 8 hex digits, `agent:NAME` for a pool of its own), an
/// account id cut to its first 8 characters, anything longer than 16
/// characters cut with `…`; `-` from a broker that does not say.
fn short_pool(pool: Option<&str>) -> String {
    let Some(p) = pool else {
        return "-".into();
    };
    let p = match p.strip_prefix("uuid:") {
        Some(id) => format!("uuid:{}", id.chars().take(8).collect::<String>()),
        None => p.to_string(),
    };
    if p.chars().count() > 16 {
        format!("{}…", p.chars().take(15).collect::<String>())
    } else {
        p
    }
}

/// One word or two for `hive agents`' STATE: `needs login` while its harness
/// reported that claude needs one (also while no harness runs), why the
/// harness waits (with when it goes on), else the supervisor's state (`*` for
/// an old binary or fleet entry), else whether a harness is connected.
fn agent_state(a: &AgentRow, sup: Option<&AgentState>) -> String {
    if a.removed {
        return "removed (mail kept)".into();
    }
    if a.needs_login {
        return "needs login".into();
    }
    if let Some(p) = &a.paused {
        return match p.until {
            // The time of day is enough: pauses are hours at most.
            Some(t) => format!("{} until {}", p.reason, &fmt_time(t)[11..]),
            None => p.reason.to_string(),
        };
    }
    match sup {
        Some(s) => {
            let mut t = s.state.to_string();
            if !s.up_to_date {
                t.push('*');
            }
            t
        }
        None if a.running => "running".into(),
        None => "offline".into(),
    }
}

/// `hive failed`: the dead letters, oldest first, bodies cut.
pub fn failed(a: &FailedArgs) -> Result<(), String> {
    let mut c = host_client(&a.host)?;
    let req = checked(Failed {
        agent: a.agent.clone(),
    })?;
    let r = call(&mut c, &req)?;
    if a.host.json {
        print_json(&r);
        return Ok(());
    }
    if r.failed.is_empty() {
        match &a.agent {
            Some(name) => println!("no dead letters for {}", line(name)),
            None => println!("no dead letters"),
        }
    }
    for m in &r.failed {
        let when = m
            .failed_at
            .map(fmt_time)
            .unwrap_or_else(|| "an unknown time".into());
        println!(
            "#{} to {} from {}, {} attempts, failed {when} (sent {}):\n  {}\n  last error: {}",
            m.id,
            line(&m.agent),
            line(m.from.as_str()),
            m.attempts,
            fmt_time(m.sent_at),
            line(&preview(&m.body, 120)),
            line(&preview(&m.last_error, 300))
        );
    }
    if !r.failed.is_empty() {
        println!("`hive retry ID` puts one back at the tail of its agent's queue.");
    }
    left_off(r.left_off, "dead letters");
    Ok(())
}

// ---- issue 16: budgets ----

/// `hive budget`: each scope's spend against its budget this window (UTC).
pub fn budget(a: &crate::cli::BudgetArgs) -> Result<(), String> {
    let s = match a {
        crate::cli::BudgetArgs::Show(h) => {
            let mut c = host_client(h)?;
            let r = call(&mut c, &checked(cmd::GetBudget {})?)?;
            if h.json {
                print_json(&r);
                return Ok(());
            }
            println!(
                "{:<10} {:<6} {:>10} {:>10} {:>12} {:>12} {:>10} {:>7}  STATE",
                "SCOPE", "PER", "SPENT", "BUDGET", "TOKENS", "TOKEN LIMIT", "CACHE RD", "CLAMPED"
            );
            for report in &r.rows {
                let b = &report.row;
                let spent = if b.unknown_runs > 0 {
                    format!("${:.2}+?", b.spent_usd)
                } else {
                    format!("${:.2}", b.spent_usd)
                };
                let until = &fmt_time(b.window_end)[..16];
                let state = match (&report.error, b.reached) {
                    (Some(e), _) => format!(
                        "held: its spend cannot be added up ({}); `hive budget void {}`",
                        line(&preview(e, 200)),
                        if b.scope == "hive" {
                            "--hive".to_string()
                        } else {
                            line(&b.scope).into_owned()
                        }
                    ),
                    (None, true) => format!("budget reached (until {until} UTC)"),
                    (None, false) => String::new(),
                };
                println!(
                    "{:<10} {:<6} {:>10} {:>10} {:>12} {:>12} {:>10} {:>7}  {state}",
                    line(&b.scope),
                    b.per.to_string(),
                    spent,
                    b.usd.map_or_else(|| "-".into(), |u| format!("${u:.2}")),
                    b.tokens,
                    b.budget_tokens
                        .map_or_else(|| "-".into(), |t| t.to_string()),
                    b.cache_read,
                    report.clamped_runs,
                );
            }
            if r.rows.iter().any(|b| b.row.unknown_runs > 0) {
                println!("+? : some runs printed no result line; their cost is unknown");
            }
            if r.rows.iter().any(|b| b.clamped_runs > 0) {
                println!(
                    "CLAMPED: runs reported over the per-run bounds (${}, {} tokens), kept at \
                     the bounds; `hive budget void SCOPE` removes a window's rows",
                    cmd::MAX_RUN_USD,
                    cmd::MAX_RUN_TOKENS
                );
            }
            return Ok(());
        }
        crate::cli::BudgetArgs::Void(v) => {
            let mut c = host_client(&v.host)?;
            let req = checked(cmd::VoidSpend {
                agent: v.agent.clone(),
                hive: v.hive,
            })?;
            let r = call(&mut c, &req)?;
            if v.host.json {
                print_json(&r);
            } else {
                println!("{}", line(&r.text));
            }
            return Ok(());
        }
        crate::cli::BudgetArgs::Set(s) => s,
    };
    let mut c = host_client(&s.host)?;
    let req = checked(cmd::SetBudget {
        agent: s.agent.clone(),
        hive: s.hive,
        usd: s.usd.flatten(),
        clear_usd: s.usd == Some(None),
        tokens: s.tokens.flatten(),
        clear_tokens: s.tokens == Some(None),
        per: s.per,
    })?;
    let r = call(&mut c, &req)?;
    if s.host.json {
        print_json(&r);
    } else {
        println!("{}", line(&r.text));
    }
    Ok(())
}

/// `hive retry ID`: a dead letter back into its agent's queue.
pub fn retry(h: &HostArgs, id: i64) -> Result<(), String> {
    let mut c = host_client(h)?;
    let req = checked(Retry { id })?;
    let r = call(&mut c, &req)?;
    if h.json {
        print_json(&r);
    } else {
        println!(
            "message #{} is back in {}'s queue, behind what is queued",
            r.id,
            line(&r.agent)
        );
    }
    Ok(())
}

/// `hive message ID`: what became of one message, as the broker's rows
/// say (`message_state`); an unknown id is a refusal (exit 1).
pub fn message(h: &HostArgs, id: i64) -> Result<(), String> {
    let mut c = host_client(h)?;
    let req = checked(MessageState { id })?;
    let r = call(&mut c, &req)?;
    if h.json {
        print_json(&r);
    } else {
        println!("{}", line(&r.text));
    }
    Ok(())
}

/// `hive resume AGENT|--pool POOL`: what the broker lifted, or why it
/// cannot (a refusal: exit 1).
pub fn resume(a: &ResumeArgs) -> Result<(), String> {
    let req = checked(Resume {
        agent: a.agent.clone(),
        pool: a.pool.clone(),
    })?;
    let mut c = host_client(&a.host)?;
    let r = call(&mut c, &req)?;
    if a.host.json {
        print_json(&r);
    } else {
        println!("{}", line(&r.text));
    }
    Ok(())
}

/// The Matrix bridge under `hive agents`: its link and its outbox.
fn bridge_line(b: &crate::proto::swarm::BridgeRow) -> String {
    let mut text = format!(
        "bridge: {} since {}, outbox {}",
        line(&b.state.as_str().replace('_', " ")),
        fmt_time(b.since),
        b.outbox
    );
    if b.failed > 0 {
        let _ = write!(text, " ({} refused by the homeserver)", b.failed);
    }
    if let Some(d) = &b.detail {
        let _ = write!(text, " — {}", line(d));
    }
    text
}

/// `hive version`: this binary's version and revision, and the broker's.
/// This binary's version, always, then the broker's; without a broker the
/// command still fails (exit 1, the reason on stderr), after printing its
/// own.
pub fn versions(h: &HostArgs) -> Result<(), String> {
    let broker = host_client(h).and_then(|mut c| call(&mut c, &Version {}));
    if h.json {
        let own = serde_json::json!({"version": env!("CARGO_PKG_VERSION"), "rev": HYPERHIVE_REV});
        let (broker_v, error) = match &broker {
            Ok(r) => (serde_json::to_value(r).unwrap_or_default(), None),
            Err(e) => (serde_json::Value::Null, Some(e.clone())),
        };
        println!(
            "{}",
            serde_json::json!({"hive": own, "broker": broker_v, "error": error})
        );
    } else {
        println!("hive {} ({})", env!("CARGO_PKG_VERSION"), HYPERHIVE_REV);
        if let Ok(r) = &broker {
            println!(
                "broker {} ({}), protocol {}",
                line(&r.version),
                line(&r.hyperhive_rev),
                r.protocol
            );
        }
    }
    broker.map(|_| ())
}

pub fn questions(h: &HostArgs) -> Result<(), String> {
    let mut c = host_client(h)?;
    let r = call(&mut c, &Questions {})?;
    if h.json {
        print_json(&r);
        return Ok(());
    }
    if r.questions.is_empty() {
        println!("no pending questions");
    }
    for q in r.questions {
        let expires = q
            .expires_at
            .map(|t| format!(" (expires {})", fmt_time(t)))
            .unwrap_or_default();
        println!(
            "#{} from {} at {}{expires}:\n{}",
            q.id,
            line(q.asker.as_str()),
            fmt_time(q.asked_at),
            indented(&q.question)
        );
        if let Some(options) = q.options_line() {
            println!("  {}", line(&options));
        }
    }
    left_off(r.left_off, "questions");
    Ok(())
}

pub fn answer(a: &AnswerArgs) -> Result<(), String> {
    let mut c = host_client(&a.host)?;
    let answer = checked(Answer {
        id: a.id,
        answer: a.answer.join(", "),
    })?;
    let r = call(&mut c, &answer)?;
    if a.host.json {
        print_json(&r);
    } else {
        println!("answered #{}: {}", a.id, line(&answer.answer));
    }
    Ok(())
}

pub fn cancel_question(h: &HostArgs, id: i64) -> Result<(), String> {
    let mut c = host_client(h)?;
    let r = call(&mut c, &CancelQuestion { id })?;
    if h.json {
        print_json(&r);
    } else {
        println!("cancelled #{id}");
    }
    Ok(())
}

/// `hive notify test` queues a test event for every destination; `hive
/// notify status` shows each destination's queue, last success and last
/// error (issue 43).
pub fn notify(a: &NotifyArgs) -> Result<(), String> {
    match a {
        NotifyArgs::Test(host) => {
            let mut c = host_client(host)?;
            let r = call(&mut c, &checked(cmd::NotifyTest {})?)?;
            if host.json {
                print_json(&r);
            } else {
                println!(
                    "test event #{} queued for {} destination(s); `hive notify status` shows \
                     whether each took it",
                    r.event, r.destinations
                );
            }
        }
        NotifyArgs::Status(host) => {
            let mut c = host_client(host)?;
            let r = call(&mut c, &checked(cmd::NotifyStatus {})?)?;
            if host.json {
                print_json(&r);
                return Ok(());
            }
            if r.destinations.is_empty() {
                println!("no notify destinations (the fleet file's `notify` block)");
            }
            for d in &r.destinations {
                println!("{}", notify_line(d));
            }
        }
    }
    Ok(())
}

/// One destination of `hive notify status`, on one line.
fn notify_line(d: &cmd::NotifyDest) -> String {
    let mut s = format!(
        "{} ({}): {} pending, {} delivered, {} failed tries, {} dropped",
        line(&d.url),
        line(&d.format),
        d.pending,
        d.delivered,
        d.failed,
        d.dropped
    );
    match d.last_ok_at {
        Some(t) => {
            let _ = write!(s, "; last success {}", fmt_time(t));
        }
        None => s.push_str("; no success yet"),
    }
    if let (Some(e), Some(t)) = (&d.last_error, d.last_error_at) {
        let _ = write!(s, "; last error {} at {}", line(e), fmt_time(t));
    }
    if d.attempts > 0 {
        let _ = write!(s, "; failing ({} tries of the next event)", d.attempts);
    }
    if let Some(t) = d.next_try_at {
        let _ = write!(s, "; next try {}", fmt_time(t));
    }
    s
}

/// `hive timers`: every pending reminder and scheduled prompt, soonest
/// first, one line each; `hive timers cancel KIND ID` cancels one.
pub fn timers(a: &TimersArgs) -> Result<(), String> {
    let (host, agent) = match a {
        TimersArgs::Cancel { host, kind, id } => {
            let mut c = host_client(host)?;
            let r = call(
                &mut c,
                &checked(cmd::CancelTimer {
                    kind: *kind,
                    id: *id,
                })?,
            )?;
            if host.json {
                print_json(&r);
            } else {
                println!(
                    "cancelled {kind} #{id} of {}; it was told: {}",
                    line(&r.agent),
                    cmd::cancelled_notice(*kind, *id)
                );
            }
            return Ok(());
        }
        TimersArgs::List { host, agent } => (host, agent),
    };
    let mut c = host_client(host)?;
    let r = call(
        &mut c,
        &checked(cmd::Timers {
            agent: agent.clone(),
        })?,
    )?;
    if host.json {
        print_json(&r);
        return Ok(());
    }
    if r.timers.is_empty() {
        match agent {
            Some(name) => println!(
                "no pending reminders or scheduled prompts of {}",
                line(name)
            ),
            None => println!("no pending reminders or scheduled prompts"),
        }
    }
    let width = r
        .timers
        .iter()
        .map(|t| line(&t.agent).chars().count())
        .max()
        .unwrap_or(0);
    for t in &r.timers {
        let repeat = match t.every_seconds {
            Some(e) => format!("every {}", span(e)),
            None => "once".into(),
        };
        let mut extra = String::new();
        if t.skipped > 0 {
            let _ = write!(extra, " · skipped {}", t.skipped);
        }
        if let Some(copy) = t.unread_copy {
            let _ = write!(extra, " · its copy #{copy} is unread");
        }
        println!(
            "{:<width$}  {:<9} #{:<4} {}  {:<12} {}{extra}",
            line(&t.agent),
            t.kind.name(),
            t.id,
            fmt_time(t.fire_at),
            repeat,
            line(&t.first_line),
        );
    }
    if !r.timers.is_empty() {
        println!("`hive timers cancel KIND ID` cancels one; its agent is told.");
    }
    left_off(r.left_off, "timers");
    Ok(())
}

/// A period as a person reads it: `90s`, `15m`, `2h`, `1d`.
fn span(secs: u64) -> String {
    match secs {
        s if s >= 86400 && s % 86400 == 0 => format!("{}d", s / 86400),
        s if s >= 3600 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s >= 60 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

pub fn approvals(h: &HostArgs) -> Result<(), String> {
    let mut c = host_client(h)?;
    let r = call(&mut c, &Approvals {})?;
    if h.json {
        print_json(&r);
        return Ok(());
    }
    if r.approvals.is_empty() {
        println!("no pending approvals");
    }
    for a in r.approvals {
        println!(
            "#{} {} of {} requested by {} at {}:\n  {}",
            a.id,
            line(a.kind.as_str()),
            line(&a.agent),
            line(&a.requester),
            fmt_time(a.created_at),
            line(&a.payload.to_string())
        );
    }
    left_off(r.left_off, "approvals");
    Ok(())
}

pub fn approve(h: &HostArgs, id: i64) -> Result<(), String> {
    let mut c = host_client(h)?;
    let r = call(&mut c, &Approve { id })?;
    if h.json {
        print_json(&r);
    } else {
        println!("approved #{id}: {}", line(&r.text));
    }
    Ok(())
}

pub fn deny(a: &DenyArgs) -> Result<(), String> {
    let mut c = host_client(&a.host)?;
    let deny = checked(Deny {
        id: a.id,
        why: a.why.clone(),
    })?;
    let r = call(&mut c, &deny)?;
    if a.host.json {
        print_json(&r);
    } else {
        println!("denied #{}", a.id);
    }
    Ok(())
}

/// `hive start|stop|restart|update AGENT`: the supervisor's answer.
pub fn lifecycle(what: Lifecycle, a: &AgentArgs) -> Result<(), String> {
    let mut c = host_client(&a.host)?;
    let name = a.name.clone();
    let r = match what {
        Lifecycle::Start => call(&mut c, &checked(StartAgent { name })?)?,
        Lifecycle::Stop => call(&mut c, &checked(StopAgent { name })?)?,
        Lifecycle::Restart => call(&mut c, &checked(RestartAgent { name })?)?,
        Lifecycle::Update => call(&mut c, &checked(UpdateAgent { name })?)?,
    };
    if a.host.json {
        print_json(&r);
    } else {
        println!("{}", line(&r.text));
    }
    Ok(())
}

/// Prints an operator command's text answer (or its JSON): every line of
/// it, each made safe to print.
fn print_text(json: bool, r: &crate::proto::TextReply) {
    if json {
        print_json(r);
    } else {
        for l in r.text.lines() {
            println!("{}", line(l));
        }
    }
}

/// `hive update --all`: every stale agent, a few at a time.
pub fn update_all(h: &HostArgs, parallel: Option<u32>) -> Result<(), String> {
    let mut c = host_client(h)?;
    let r = call(&mut c, &checked(crate::proto::cmd::UpdateAll { parallel })?)?;
    print_text(h.json, &r);
    Ok(())
}

/// `hive reload`: the fleet file applied while the hive runs.
pub fn reload(h: &HostArgs) -> Result<(), String> {
    let mut c = host_client(h)?;
    let r = call(&mut c, &crate::proto::cmd::Reload {})?;
    print_text(h.json, &r);
    Ok(())
}

/// `hive forget AGENT`: a removed agent's kept mail dead-lettered.
pub fn forget(a: &AgentArgs) -> Result<(), String> {
    let mut c = host_client(&a.host)?;
    let r = call(
        &mut c,
        &checked(crate::proto::cmd::ForgetAgent {
            name: a.name.clone(),
        })?,
    )?;
    print_text(a.host.json, &r);
    Ok(())
}

/// `hive search`: the newest matching turns of every agent (or one).
pub fn search(a: &SearchArgs) -> Result<(), String> {
    let search = checked(Search {
        words: a.words.clone(),
        agent: a.agent.clone(),
        since: a.since.map(|s| s.resolve(crate::proto::now())),
        limit: a.limit,
    })?;
    let mut c = host_client(&a.host)?;
    let r = call(&mut c, &search)?;
    if a.host.json {
        print_json(&r);
        return Ok(());
    }
    for e in &r.errors {
        eprintln!(
            "hive: {} was not searched: {}",
            line(&e.agent),
            line(&e.error)
        );
    }
    if r.hits.is_empty() {
        println!("no turn matches {}", line(&a.words));
    }
    for h in &r.hits {
        println!(
            "{} {} turn #{} {}\n  {}",
            line(&h.agent),
            fmt_time(h.at),
            h.turn,
            line(&h.link),
            one_line(&h.snippet)
        );
    }
    if r.more {
        println!("… more turns match: add words, --agent, --since or a larger --limit");
    }
    Ok(())
}

/// `hive history`: an agent's turns, oldest first, a page at a time; a
/// closed pipe (`| head`) ends it quietly.
pub fn history(a: &HistoryArgs) -> Result<(), String> {
    let mut c = host_client(&a.host)?;
    let since = a.since.map(|s| s.resolve(crate::proto::now()));
    let mut after = None;
    let mut shown = 0usize;
    loop {
        let req = checked(History {
            agent: a.agent.clone(),
            since,
            after,
            limit: Some(50),
        })?;
        let r = call(&mut c, &req)?;
        let mut out = std::io::stdout().lock();
        let written = r.turns.iter().try_for_each(|t| {
            if a.host.json {
                writeln!(out, "{}", serde_json::to_string(t).unwrap_or_default())
            } else {
                write_turn(&mut out, t)
            }
        });
        match written.and_then(|_| out.flush()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return Err(format!("cannot write the history: {e}")),
            Ok(()) => {}
        }
        shown += r.turns.len();
        match r.turns.last() {
            Some(t) if r.more => after = Some(t.id),
            _ => break,
        }
    }
    if shown == 0 && !a.host.json {
        println!(
            "{} has no turns in its history{}",
            line(&a.agent),
            if since.is_some() { " since then" } else { "" }
        );
    }
    Ok(())
}

/// One turn as text: a header line, then its message, claude's text, tool
/// calls and results, and notes, everything an agent wrote made printable.
fn write_turn(out: &mut impl Write, t: &Turn) -> std::io::Result<()> {
    let mut head = format!("── turn #{} · {}", t.id, fmt_time(t.started_at));
    match (&t.kind, &t.from) {
        (TurnKind::Harness, _) => head.push_str(" · the harness"),
        (TurnKind::Message, Some(f)) => head.push_str(&format!(" · from {}", line(f))),
        (TurnKind::Message, None) => {}
    }
    match (t.ok, &t.outcome) {
        (Some(ok), Some(o)) => {
            head.push_str(&format!(" · {} {}", if ok { "✓" } else { "✗" }, line(o)))
        }
        _ if t.ended_at.is_none() && t.kind == TurnKind::Message => head.push_str(" · unfinished"),
        _ => {}
    }
    if let Some(d) = &t.decision {
        head.push_str(&format!(" ({})", line(d)));
    }
    if let Some(ms) = t.duration_ms {
        head.push_str(&format!(" · {:.1}s", ms as f64 / 1000.0));
    }
    if t.cost_usd > 0.0 {
        head.push_str(&format!(" · ${:.4}", t.cost_usd));
    }
    if t.tokens_in + t.tokens_out > 0 {
        head.push_str(&format!(" · {} in / {} out", t.tokens_in, t.tokens_out));
    }
    writeln!(out, "{head}")?;
    let text = |v: &serde_json::Value, key: &str| v[key].as_str().unwrap_or_default().to_string();
    for e in &t.events {
        match e["type"].as_str().unwrap_or_default() {
            "turn_start" => {
                for l in text(e, "body").lines() {
                    writeln!(out, "> {}", printable(l, false))?;
                }
            }
            "note" | "gap" => writeln!(out, "· {}", printable(&text(e, "text"), true))?,
            "turn_end" if !text(e, "note").is_empty() => {
                writeln!(out, "· {}", printable(&text(e, "note"), true))?
            }
            "stream" => write_stream(out, &e["value"])?,
            _ => {}
        }
    }
    if t.events_left_off > 0 {
        writeln!(
            out,
            "… {} more events: open the turn on the agent's page (/turn/{})",
            t.events_left_off, t.id
        )?;
    }
    writeln!(out)
}

/// What a person reads of one stdout line of claude.
fn write_stream(out: &mut impl Write, v: &serde_json::Value) -> std::io::Result<()> {
    let blocks = v["message"]["content"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    match v["type"].as_str().unwrap_or_default() {
        "assistant" => {
            for b in &blocks {
                match b["type"].as_str().unwrap_or_default() {
                    "text" => writeln!(
                        out,
                        "{}",
                        printable(b["text"].as_str().unwrap_or_default(), true)
                    )?,
                    "tool_use" => writeln!(
                        out,
                        "⚙ {} {}",
                        line(b["name"].as_str().unwrap_or_default()),
                        line(&preview(&b["input"].to_string(), 300))
                    )?,
                    _ => {}
                }
            }
        }
        "user" => {
            for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
                let content = match &b["content"] {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Array(parts) => parts
                        .iter()
                        .filter_map(|p| p["text"].as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                    _ => String::new(),
                };
                let n = content.lines().count();
                let what = if b["is_error"] == true {
                    "error"
                } else {
                    "result"
                };
                writeln!(out, "  → {what}: {n} line{}", if n == 1 { "" } else { "s" })?;
            }
        }
        "result" if v["is_error"] == true => writeln!(
            out,
            "✗ {}",
            line(&preview(v["result"].as_str().unwrap_or("error"), 300))
        )?,
        _ => {}
    }
    Ok(())
}

/// Says that an answer was cut to the broker's size limit.
fn left_off(n: u64, what: &str) {
    if n > 0 {
        println!("… and {n} more {what} not shown: the broker's answer has a size limit");
    }
}

#[cfg(test)]
mod tests {
    use super::{indented, one_line};

    /// A search snippet prints on one line: no `\x0a` where the turn had
    /// a line break; a control character is still escaped.
    #[test]
    fn a_snippet_is_one_line() {
        assert_eq!(
            one_line("runs Linux and\n\n```\nhistory.db  turn"),
            "runs Linux and ``` history.db turn"
        );
        assert_eq!(one_line("a\u{1b}[31m b"), "a\\x1b[31m b");
    }

    #[test]
    fn a_body_is_indented_on_every_line() {
        assert_eq!(
            indented("one\n#2 from operator:\n"),
            "  one\n  #2 from operator:\n  "
        );
    }

    #[test]
    fn control_and_bidi_characters_become_visible() {
        let hostile = "done \u{1b}]0;PWNED\u{7}\u{1b}[2J\u{9b}x \u{202e}evil\nnext\tcol";
        assert_eq!(
            super::printable(hostile, true),
            "done \\x1b]0;PWNED\\x07\\x1b[2J\\x9bx \\u{202e}evil\nnext\tcol"
        );
        assert_eq!(super::printable("a\nb", false), "a\\x0ab");
        assert!(matches!(
            super::printable("plain text", true),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn the_pool_column_is_short() {
        for (pool, shown) in [
            (Some("key:1a2b3c4d"), "key:1a2b3c4d"),
            (
                Some("uuid:3f1c2a9e-7d1b-4c55-9e0a-2b6f8d9c1e00"),
                "uuid:3f1c2a9e",
            ),
            (Some("account:team"), "account:team"),
            (Some("account:research-team"), "account:researc…"),
            (Some("agent:ana"), "agent:ana"),
            (None, "-"),
        ] {
            assert_eq!(super::short_pool(pool), shown, "{pool:?}");
        }
    }
}
