//! The client commands: `hive wake` for scripts inside an agent's container and
//! the operator commands (`send`, `inbox`, `agents`, `questions`, `answer`,
//! `cancel-question`, `approvals`,
//! `approve`, `deny`) on the host socket. Each is one or two requests over
//! [`crate::wire::Client`], printed as plain text for people or `--json` for
//! scripts. Every text an agent could have written goes through
//! [`printable`] before it reaches the operator's terminal, and a message is
//! checked against [`wire::MAX_BODY`] before it is sent.

use crate::cli::{self, AnswerArgs, DenyArgs, HostArgs, InboxArgs, SendArgs, WakeArgs};
use crate::wire::{self, Client, Request};
use serde_json::Value;
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
    let up = cli::up_host_socket();
    let fallback = if std::path::Path::new(&up).exists() {
        &up
    } else {
        wire::DEFAULT_HOST_SOCKET
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
        c => wire::is_control_or_bidi(c),
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

/// A message is refused here, before anything is sent, when the broker would
/// refuse it: blank, or longer than [`wire::MAX_BODY`].
fn check_message(body: &str) -> Result<(), String> {
    if body.trim().is_empty() {
        return Err("the message is empty; nothing was sent".into());
    }
    if body.len() > wire::MAX_BODY {
        return Err(too_big(body.len() as u64));
    }
    Ok(())
}

fn too_big(size: u64) -> String {
    format!(
        "the message is {size} bytes; the limit is {} bytes (64 KiB), so nothing was sent. \
         Send a shorter text, or write it to a file and send its path",
        wire::MAX_BODY
    )
}

/// The argument itself, or stdin for `-` (read up to just past the body
/// limit; the rest is counted, not kept, to say how big it was).
fn read_text(arg: &str, what: &str) -> Result<String, String> {
    if arg != "-" {
        return Ok(arg.to_string());
    }
    let cannot = |e: std::io::Error| format!("cannot read {what} from stdin: {e}");
    let mut stdin = std::io::stdin().lock();
    let mut buf = Vec::new();
    (&mut stdin)
        .take(wire::MAX_BODY as u64 + 2)
        .read_to_end(&mut buf)
        .map_err(cannot)?;
    if buf.len() > wire::MAX_BODY + 1 {
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

fn print_json(map: serde_json::Map<String, Value>) {
    let mut map = map;
    map.insert("ok".into(), Value::Bool(true));
    println!("{}", Value::Object(map));
}

pub fn wake(a: &WakeArgs) -> Result<(), String> {
    let body = read_text(&a.body, "the body")?;
    if body.trim().is_empty() {
        return Err("the body is empty; nothing to wake the agent with".into());
    }
    check_message(&body)?;
    let path = socket_path(&a.socket, "HIVE_SOCKET", wire::DEFAULT_AGENT_SOCKET);
    let mut c = Client::connect(&path).map_err(|e| e.to_string())?;
    c.call(&Request::Wake {
        from: a.from.clone(),
        body,
        transient: a.transient,
        to: None,
    })
    .map_err(|e| e.to_string())?;
    Ok(())
}

pub fn send(a: &SendArgs) -> Result<(), String> {
    let body = read_text(&a.text, "the message")?;
    check_message(&body)?;
    let mut c = host_client(&a.host)?;
    let r = c
        .call(&Request::Send {
            to: a.to.clone(),
            body,
            in_reply_to: a.reply_to,
        })
        .map_err(|e| e.to_string())?;
    if a.host.json {
        print_json(r);
    } else {
        let id = r.get("id").and_then(Value::as_i64).unwrap_or_default();
        println!("sent #{id} to {}", line(&a.to));
    }
    Ok(())
}

/// A unix time as `YYYY-MM-DD HH:MM:SSZ` (UTC).
pub fn fmt_time(unix: i64) -> String {
    // UTC, from the civil-from-days algorithm, to avoid a time dependency.
    let days = unix.div_euclid(86400);
    let secs = unix.rem_euclid(86400);
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
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
        let req = Request::Inbox {
            wait_seconds: wait.take(),
            peek: a.peek,
            after,
        };
        let r: wire::MessagesReply = c.call_as(&req).map_err(|e| e.to_string())?;
        let ids: Vec<i64> = r.messages.iter().map(|m| m.id).collect();
        let mut out = std::io::stdout().lock();
        let written = if a.host.json {
            writeln!(out, "{}", wire::ok_line(&r))
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
                    line(&m.from),
                    printable(&m.body, true)
                )
            })
        };
        written
            .and_then(|_| out.flush())
            .map_err(|e| format!("cannot write the inbox: {e} (nothing was marked read)"))?;
        shown += ids.len();
        if !a.peek && !ids.is_empty() {
            c.call(&Request::InboxAck { ids: ids.clone() })
                .map_err(|e| e.to_string())?;
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
    let r: wire::AgentsReply = c.call_as(&Request::Agents {}).map_err(|e| e.to_string())?;
    if h.json {
        println!("{}", wire::ok_line(&r));
        return Ok(());
    }
    // Under `hive up` the supervisor's view replaces the bare yes/no.
    let sup: Option<wire::SupervisionReply> = c.call_as(&Request::Supervision {}).ok();
    println!(
        "{:<10} {:<10} {:>6} {:>9} {:<10} STATUS",
        "NAME", "PARENT", "UNREAD", "INFLIGHT", "RUNNING"
    );
    for a in r.agents {
        let inflight = a
            .inflight
            .map(|i| format!("#{i}"))
            .unwrap_or_else(|| "-".into());
        let state = sup
            .as_ref()
            .and_then(|s| s.agents.iter().find(|x| x.name == a.name))
            .map(|s| {
                let mut t = s.state.clone();
                if !s.up_to_date {
                    t.push('*');
                }
                t
            });
        let running = state.unwrap_or_else(|| if a.running { "yes" } else { "no" }.into());
        println!(
            "{:<10} {:<10} {:>6} {:>9} {:<10} {}",
            line(&a.name),
            line(&a.parent),
            a.unread,
            inflight,
            line(&running),
            line(&a.status_text)
        );
    }
    left_off(r.left_off, "agents");
    Ok(())
}

pub fn questions(h: &HostArgs) -> Result<(), String> {
    let mut c = host_client(h)?;
    let r: wire::QuestionsReply = c
        .call_as(&Request::Questions {})
        .map_err(|e| e.to_string())?;
    if h.json {
        println!("{}", wire::ok_line(&r));
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
            "#{} from {} at {}{expires}:\n  {}",
            q.id,
            line(&q.asker),
            fmt_time(q.asked_at),
            printable(&q.question, true)
        );
        if !q.options.is_empty() {
            let how = if q.multi { "choose any" } else { "choose one" };
            println!("  options ({how}): {}", line(&q.options.join(" | ")));
        }
    }
    left_off(r.left_off, "questions");
    Ok(())
}

pub fn answer(a: &AnswerArgs) -> Result<(), String> {
    let mut c = host_client(&a.host)?;
    let answer = a.answer.join(", ");
    let r = c
        .call(&Request::Answer {
            id: a.id,
            answer: answer.clone(),
        })
        .map_err(|e| e.to_string())?;
    if a.host.json {
        print_json(r);
    } else {
        println!("answered #{}: {}", a.id, line(&answer));
    }
    Ok(())
}

pub fn cancel_question(h: &HostArgs, id: i64) -> Result<(), String> {
    let mut c = host_client(h)?;
    let r = c
        .call(&Request::CancelQuestion { id })
        .map_err(|e| e.to_string())?;
    if h.json {
        print_json(r);
    } else {
        println!("cancelled #{id}");
    }
    Ok(())
}

pub fn approvals(h: &HostArgs) -> Result<(), String> {
    let mut c = host_client(h)?;
    let r: wire::ApprovalsReply = c
        .call_as(&Request::Approvals {})
        .map_err(|e| e.to_string())?;
    if h.json {
        println!("{}", wire::ok_line(&r));
        return Ok(());
    }
    if r.approvals.is_empty() {
        println!("no pending approvals");
    }
    for a in r.approvals {
        println!(
            "#{} {} of {} requested by {} at {}:\n  {}",
            a.id,
            line(&a.kind),
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
    let r = c
        .call(&Request::Approve { id })
        .map_err(|e| e.to_string())?;
    if h.json {
        print_json(r);
    } else {
        println!(
            "approved #{id}: {}",
            line(r.get("text").and_then(Value::as_str).unwrap_or(""))
        );
    }
    Ok(())
}

pub fn deny(a: &DenyArgs) -> Result<(), String> {
    let mut c = host_client(&a.host)?;
    let r = c
        .call(&Request::Deny {
            id: a.id,
            why: a.why.clone(),
        })
        .map_err(|e| e.to_string())?;
    if a.host.json {
        print_json(r);
    } else {
        println!("denied #{}", a.id);
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
    fn formats_utc_times() {
        assert_eq!(super::fmt_time(0), "1970-01-01 00:00:00Z");
        assert_eq!(super::fmt_time(1_795_323_782), "2026-11-22 05:03:02Z");
    }
}
