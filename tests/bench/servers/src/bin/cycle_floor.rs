//! The floor of a broker cycle: a static server on one thread that answers
//! `wake`, `recv_next` and `ack_turn` over a Unix socket doing, per request,
//! exactly the statement the bench's bare-rusqlite baseline does — the insert
//! (committed before its `ok`), the move to inflight (committed before the
//! message is handed out), the ack (committed before its `ok`) — with the
//! same schema, pragmas and sqlite build, its statements prepared once, the
//! queue kept in memory so the hand-out needs no query, and requests read by
//! string search instead of a JSON parser. Nothing a real broker must also do
//! (agents, pools, budgets, counts, checks, a second index) is here: what it
//! shows is what serving the same commits behind a socket costs any broker on
//! this machine, the server waking cold for every request where the bare loop
//! runs hot. `make bench` runs it with the same client as `hive broker`.
//! With `poll` it learns of each request from `poll(2)` on the connection
//! before it reads it, as a server of many sockets on one thread (the broker)
//! must, instead of sleeping in the read itself: the floor of that design.
//! Usage: `cycle-floor SOCKET DB normal|full [read|poll]` (`read` when not
//! given); it serves one connection after another until it is killed.

use rusqlite::{params, Connection};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::process::ExitCode;

/// The string value of `"key":"…"` in a request line (the bench's values
/// hold no escapes).
fn string_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(&format!("\"{key}\":\""))? + key.len() + 4;
    let rest = &line[at..];
    Some(&rest[..rest.find('"')?])
}

/// The number of `"key":N` in a request line.
fn number_field(line: &str, key: &str) -> Option<i64> {
    let at = line.find(&format!("\"{key}\":"))? + key.len() + 3;
    let rest = &line[at..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn serve(socket: &str, db: &str, sync: &str, poll: bool) -> Result<(), String> {
    let conn = Connection::open(db).map_err(|e| format!("{db}: {e}"))?;
    conn.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync};
         CREATE TABLE IF NOT EXISTS m (id INTEGER PRIMARY KEY AUTOINCREMENT, sender TEXT,
           recipient TEXT, body TEXT, state TEXT, sent_at INTEGER, done_at INTEGER);
         CREATE INDEX IF NOT EXISTS mi ON m (recipient, state, id);"
    ))
    .map_err(|e| format!("{db}: {e}"))?;
    let mut insert = conn
        .prepare(
            "INSERT INTO m (sender, recipient, body, state, sent_at) VALUES ('bench','bench',?1,'queued',1)",
        )
        .map_err(|e| e.to_string())?;
    let mut hand_out = conn
        .prepare("UPDATE m SET state='inflight' WHERE id=?1")
        .map_err(|e| e.to_string())?;
    let mut ack = conn
        .prepare("UPDATE m SET state='acked', done_at=2 WHERE id=?1")
        .map_err(|e| e.to_string())?;
    let mut queue: VecDeque<(i64, String)> = VecDeque::new();
    let listener = UnixListener::bind(socket).map_err(|e| format!("{socket}: {e}"))?;
    for stream in listener.incoming() {
        let stream = stream.map_err(|e| e.to_string())?;
        let mut out = stream.try_clone().map_err(|e| e.to_string())?;
        let mut lines = BufReader::new(stream);
        let mut line = String::new();
        let mut answer = String::with_capacity(512);
        loop {
            line.clear();
            if poll && lines.buffer().is_empty() {
                let mut p = libc::pollfd {
                    fd: out.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd of a descriptor this thread holds open.
                if unsafe { libc::poll(&mut p, 1, -1) } < 0 {
                    return Err(std::io::Error::last_os_error().to_string());
                }
            }
            if lines.read_line(&mut line).map_err(|e| e.to_string())? == 0 {
                break;
            }
            answer.clear();
            let cmd = string_field(&line, "cmd").unwrap_or("");
            match cmd {
                "wake" => {
                    let body = string_field(&line, "body").unwrap_or("");
                    insert.execute([body]).map_err(|e| e.to_string())?;
                    let id = conn.last_insert_rowid();
                    queue.push_back((id, body.to_string()));
                    answer.push_str(&format!("{{\"ok\":true,\"id\":{id},\"to\":\"bench\"}}\n"));
                }
                "recv_next" => match queue.pop_front() {
                    Some((id, body)) => {
                        hand_out.execute([id]).map_err(|e| e.to_string())?;
                        answer.push_str(&format!(
                            "{{\"ok\":true,\"message\":{{\"id\":{id},\"from\":\"bench\",\"to\":\"bench\",\
                             \"body\":\"{body}\",\"kind\":\"message\",\"in_reply_to\":null,\"sent_at\":1,\
                             \"transient\":false}},\"redelivered\":false,\"unread\":{},\"attempts\":1}}\n",
                            queue.len()
                        ));
                    }
                    None => answer.push_str(
                        "{\"ok\":true,\"message\":null,\"redelivered\":false,\"attempts\":0}\n",
                    ),
                },
                "ack_turn" => {
                    let id = number_field(&line, "id").unwrap_or(-1);
                    ack.execute(params![id]).map_err(|e| e.to_string())?;
                    answer.push_str("{\"ok\":true}\n");
                }
                "hello" => answer.push_str("{\"ok\":true,\"version\":1,\"identity\":\"bench\"}\n"),
                _ => answer.push_str("{\"ok\":false,\"error\":\"cycle-floor: unknown cmd\"}\n"),
            }
            if out.write_all(answer.as_bytes()).is_err() {
                break;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(socket), Some(db), Some(mode)) = (args.get(1), args.get(2), args.get(3)) else {
        eprintln!("usage: cycle-floor SOCKET DB normal|full [read|poll]");
        return ExitCode::from(2);
    };
    let sync = if mode == "full" { "FULL" } else { "NORMAL" };
    let poll = match args.get(4).map(String::as_str) {
        None | Some("read") => false,
        Some("poll") => true,
        Some(other) => {
            eprintln!("cycle-floor: {other}: say read or poll");
            return ExitCode::from(2);
        }
    };
    match serve(socket, db, sync, poll) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cycle-floor: {e}");
            ExitCode::FAILURE
        }
    }
}
