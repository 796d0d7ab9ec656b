//! One client connection: a reader thread that turns the socket into line events,
//! and the connection thread that parses each request, asks the hub, and writes the
//! answer. Long-polls (`recv_next`, `recv`, `inbox` with a wait) park here, on one
//! `select!` over the hub's wake-up, the client hanging up, the broker stopping and
//! the deadline — never in the hub, and never in a sleep loop.

use super::hub::{ConnId, HubMsg, Identity, Outcome};
use crate::wire::{self, Line, Request};
use crossbeam_channel::{after, bounded, select, unbounded, Receiver, Sender};
use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

enum LineEvent {
    Line(Line),
    Error(String),
}

/// Serves one connection until the client hangs up or the broker stops.
pub fn serve(
    stream: UnixStream,
    who: Identity,
    conn: ConnId,
    hub: Sender<HubMsg>,
    stop: Receiver<()>,
) {
    let (line_tx, line_rx) = unbounded::<LineEvent>();
    let reader_stream = match stream.try_clone() {
        Ok(s) => s,
        Err(e) => {
            log::warn!("connection {conn}: cannot clone stream: {e}");
            return;
        }
    };
    let reader = std::thread::Builder::new()
        .name(format!("conn-{conn}-read"))
        .spawn(move || {
            let mut r = BufReader::new(reader_stream);
            loop {
                let ev = match wire::read_line(&mut r, wire::MAX_LINE) {
                    Ok(line) => LineEvent::Line(line),
                    Err(e) => LineEvent::Error(e.to_string()),
                };
                let done = matches!(ev, LineEvent::Line(Line::Eof) | LineEvent::Error(_));
                if line_tx.send(ev).is_err() || done {
                    break;
                }
            }
        });
    if let Err(e) = reader {
        log::warn!("connection {conn}: cannot start reader: {e}");
        return;
    }
    let mut c = Conn {
        who,
        conn,
        hub,
        stop,
        lines: line_rx,
        stash: VecDeque::new(),
        out: stream,
    };
    c.run();
    let _ = c.out.shutdown(std::net::Shutdown::Both);
    let _ = c.hub.send(HubMsg::Closed { conn });
}

struct Conn {
    who: Identity,
    conn: ConnId,
    hub: Sender<HubMsg>,
    stop: Receiver<()>,
    lines: Receiver<LineEvent>,
    /// Lines that arrived while a long-poll was parked.
    stash: VecDeque<LineEvent>,
    out: UnixStream,
}

/// Why a parked call stopped waiting without an answer.
enum Abort {
    Hangup,
    Stopping,
}

impl Conn {
    fn next_event(&mut self) -> Option<LineEvent> {
        if let Some(ev) = self.stash.pop_front() {
            return Some(ev);
        }
        select! {
            recv(self.lines) -> ev => ev.ok(),
            recv(self.stop) -> _ => None,
        }
    }

    fn run(&mut self) {
        while let Some(ev) = self.next_event() {
            let answer = match ev {
                LineEvent::Line(Line::Eof) => return,
                LineEvent::Error(e) => {
                    log::debug!("connection {}: read error: {e}", self.conn);
                    return;
                }
                LineEvent::Line(Line::TooLong) => wire::err_line(&format!(
                    "request line longer than {} bytes refused",
                    wire::MAX_LINE
                )),
                LineEvent::Line(Line::NotUtf8) => wire::err_line("request line is not valid UTF-8"),
                LineEvent::Line(Line::Text(t)) if t.trim().is_empty() => continue,
                LineEvent::Line(Line::Text(t)) => match Request::parse(&t) {
                    Err(e) => wire::err_line(&e),
                    Ok(req) => match self.call(req) {
                        Ok(a) => a,
                        Err(Abort::Hangup) => return,
                        Err(Abort::Stopping) => wire::err_line("broker is stopping"),
                    },
                },
            };
            let mut bytes = answer.into_bytes();
            bytes.push(b'\n');
            if self.out.write_all(&bytes).is_err() {
                return;
            }
        }
    }

    fn wait_of(req: &Request) -> Option<u64> {
        match req {
            Request::RecvNext { wait_seconds }
            | Request::Recv { wait_seconds, .. }
            | Request::Inbox { wait_seconds, .. } => *wait_seconds,
            _ => None,
        }
    }

    /// Asks the hub until it answers, parking between wake-ups for long-polls.
    fn call(&mut self, req: Request) -> Result<String, Abort> {
        let wait = Self::wait_of(&req).unwrap_or(0).min(wire::MAX_WAIT_SECS);
        let deadline = Instant::now() + Duration::from_secs(wait);
        let mut can_wait = wait > 0;
        loop {
            let (waiter, woken) = bounded::<()>(1);
            let (reply_tx, reply_rx) = bounded::<Outcome>(1);
            let msg = HubMsg::Call {
                who: self.who.clone(),
                conn: self.conn,
                req: req.clone(),
                can_wait,
                waiter,
                reply: reply_tx,
            };
            if self.hub.send(msg).is_err() {
                return Err(Abort::Stopping);
            }
            match reply_rx.recv() {
                Ok(Outcome::Answer(line)) => return Ok(line),
                Ok(Outcome::Offload(job)) => return Ok(job()),
                Ok(Outcome::Wait) => {}
                Err(_) => return Err(Abort::Stopping),
            }
            let timeout = after(deadline.saturating_duration_since(Instant::now()));
            loop {
                select! {
                    recv(woken) -> _ => break,
                    recv(timeout) -> _ => { can_wait = false; break; }
                    recv(self.stop) -> _ => return Err(Abort::Stopping),
                    recv(self.lines) -> ev => match ev {
                        Ok(LineEvent::Line(Line::Eof)) | Ok(LineEvent::Error(_)) | Err(_) => {
                            return Err(Abort::Hangup)
                        }
                        Ok(other) => self.stash.push_back(other),
                    },
                }
            }
        }
    }
}
