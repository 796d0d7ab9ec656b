//! One client connection, served by one thread: it reads a request line, asks
//! the hub, writes the answer, and reads the next. Long-polls (`recv_next`,
//! `recv`, `inbox` with a wait) park here, on one `select!` over the hub's
//! wake-up, the client hanging up, the broker stopping and the deadline — never in
//! the hub, and never in a sleep loop. Hang-ups during a wait are noticed by a
//! watcher thread that exists only while the wait lasts and sleeps in `poll(2)`.
//! A connection that sends no request for the idle timeout, or does not read
//! its answer for as long, is closed; a parked one is not idle. No answer
//! longer than [`MAX_LINE`] ever leaves: it becomes an error line. The framing
//! is the transport's (`proto::lines`); this file adds the long-poll parking.

use super::hub::{ConnId, HubMsg, Identity, Outcome};
use crate::proto::limits::{MAX_LINE, MAX_WAIT_SECS};
use crate::proto::lines::{err_line, read_line, Line};
use crate::proto::Request;
use crate::sys::fd::HangupWatch;
use crossbeam_channel::{after, bounded, select, Receiver, Sender};
use std::io::{self, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Serves one connection until the client hangs up, stays idle for `idle`, or
/// the broker stops.
pub fn serve(
    stream: UnixStream,
    who: Identity,
    conn: ConnId,
    hub: Sender<HubMsg>,
    stop: Receiver<()>,
    idle: Duration,
) {
    if let Err(e) = stream.set_write_timeout(Some(idle)) {
        log::warn!("connection {conn}: cannot set a write timeout: {e}");
        return;
    }
    let mut c = Conn {
        who,
        conn,
        hub,
        stop,
        input: BufReader::new(IdleReader {
            stream,
            idle,
            deadline: Instant::now() + idle,
        }),
    };
    c.run();
    let _ = c.stream().shutdown(std::net::Shutdown::Both);
    let _ = c.hub.send(HubMsg::Closed { conn });
}

/// The connection's stream as read between requests: a read fails with
/// `TimedOut` once the deadline set at the last answer has passed, however
/// the bytes trickle in.
struct IdleReader {
    stream: UnixStream,
    idle: Duration,
    deadline: Instant,
}

impl Read for IdleReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        match self.stream.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(io::ErrorKind::TimedOut.into()),
            r => r,
        }
    }
}

struct Conn {
    who: Identity,
    conn: ConnId,
    hub: Sender<HubMsg>,
    stop: Receiver<()>,
    input: BufReader<IdleReader>,
}

/// Why a parked call stopped waiting without an answer.
enum Abort {
    Hangup,
    Stopping,
}

impl Conn {
    fn stream(&self) -> &UnixStream {
        &self.input.get_ref().stream
    }

    fn run(&mut self) {
        loop {
            let idle = self.input.get_ref().idle;
            self.input.get_mut().deadline = Instant::now() + idle;
            let mut cmd = "request";
            let answer = match read_line(&mut self.input, MAX_LINE) {
                Ok(Line::Eof) => return,
                Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                    log::debug!(
                        "connection {} of {}: idle for {} s, closed",
                        self.conn,
                        self.who.name(),
                        idle.as_secs()
                    );
                    return;
                }
                Err(e) => {
                    log::debug!("connection {}: read error: {e}", self.conn);
                    return;
                }
                Ok(Line::TooLong) => err_line(&format!(
                    "request line longer than {} bytes refused",
                    MAX_LINE
                )),
                Ok(Line::NotUtf8) => err_line("request line is not valid UTF-8"),
                Ok(Line::Text(t)) if t.trim().is_empty() => continue,
                Ok(Line::Text(t)) => match Request::parse(&t) {
                    Err(e) => err_line(&e),
                    Ok(req) => {
                        cmd = req.cmd();
                        match self.call(req) {
                            Ok(a) => a,
                            Err(Abort::Hangup) => return,
                            Err(Abort::Stopping) => err_line("broker is stopping"),
                        }
                    }
                },
            };
            // The last line of defence: no reader accepts a longer line, so a
            // longer answer (a bug) becomes an error the client can read.
            let answer = if answer.len() > MAX_LINE {
                log::error!(
                    "connection {}: the answer to {cmd} is {} bytes, over the line limit; sent an error instead",
                    self.conn,
                    answer.len()
                );
                err_line(&format!(
                    "the answer to {cmd} would be {} bytes, over the {}-byte line limit, and was not sent (a broker bug: please report it)",
                    answer.len(),
                    MAX_LINE
                ))
            } else {
                answer
            };
            let mut bytes = answer.into_bytes();
            bytes.push(b'\n');
            let mut out: &UnixStream = self.stream();
            if let Err(e) = out.write_all(&bytes) {
                log::debug!("connection {}: cannot write the answer: {e}", self.conn);
                return;
            }
        }
    }

    /// Asks the hub until it answers, parking between wake-ups for long-polls.
    fn call(&mut self, req: Request) -> Result<String, Abort> {
        let wait = req.wait_seconds().unwrap_or(0).min(MAX_WAIT_SECS);
        let deadline = Instant::now() + Duration::from_secs(wait);
        let mut can_wait = wait > 0;
        let mut watch: Option<HangupWatch> = None;
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
                Ok(Outcome::Offload(job)) => return Ok(job(&self.hub)),
                Ok(Outcome::Wait) => {}
                Err(_) => return Err(Abort::Stopping),
            }
            if watch.is_none() {
                match HangupWatch::start("conn-watch", self.stream().as_raw_fd()) {
                    Ok(w) => watch = Some(w),
                    Err(e) => log::warn!("connection {}: cannot watch for hang-up: {e}", self.conn),
                }
            }
            let never = crossbeam_channel::never();
            let hung_up = watch.as_ref().map_or(&never, |w| w.hung_up());
            let timeout = after(deadline.saturating_duration_since(Instant::now()));
            select! {
                recv(woken) -> _ => {},
                recv(timeout) -> _ => can_wait = false,
                recv(self.stop) -> _ => return Err(Abort::Stopping),
                recv(hung_up) -> _ => return Err(Abort::Hangup),
            }
        }
    }
}
