//! Live streams (Server-Sent Events) for both web servers: the agent page's
//! `/events` (the harness's bus) and the dashboard's (the shared hive
//! snapshot). Each client gets one named writer thread that owns the raw
//! connection (headers written by hand, a flush after every frame, since a
//! streamed tiny_http body stalls in 8 KiB chunks) and pulls its frames from a
//! [`Source`]. A client holds one of a server's [`Slots`] (a cap in all and a
//! cap per peer address) and gives it back as soon as it goes:
//!
//! - it hung up: the socket shows `POLLRDHUP` (checked every 250 ms);
//! - it stopped reading: at every ping interval the bytes it acknowledged
//!   (written minus the socket's unsent queue, `SIOCOUTQ`) did not grow while
//!   some were still waiting;
//! - a write made no progress for the send timeout;
//! - its source ended (the bus dropped a subscription that fell behind) or the
//!   server stops.
//!
//! So a client that never reads cannot keep a slot once data waits for it, and
//! never holds up the turn loop or another client.

use crate::http::Reply;
use std::collections::HashMap;
use std::io::{self, Write};
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiny_http::Request;

/// The header block written by hand before the stream.
pub const HEAD: &str = "HTTP/1.1 200 OK\r\n\
    Content-Type: text/event-stream; charset=utf-8\r\n\
    Cache-Control: no-store\r\n\
    Connection: close\r\n\
    X-Accel-Buffering: no\r\n\
    X-Content-Type-Options: nosniff\r\n\r\n";

/// How often a stream looks for a client that hung up.
const TICK: Duration = Duration::from_millis(250);

/// The live-stream places of one server.
#[derive(Debug)]
pub struct Slots {
    max: usize,
    per_peer: usize,
    /// Variable names for the 503's advice.
    vars: (&'static str, &'static str),
    held: Mutex<HashMap<IpAddr, usize>>,
}

/// One client's place; given back on drop, whichever way its writer ends.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    peer: IpAddr,
}

impl Slots {
    /// `max` clients in all, `per_peer` from one address; `vars` name the
    /// settings (for the 503's advice).
    pub fn new(max: usize, per_peer: usize, vars: (&'static str, &'static str)) -> Arc<Slots> {
        Arc::new(Slots {
            max,
            per_peer: per_peer.min(max),
            vars,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Clients connected now.
    pub fn count(&self) -> usize {
        self.lock().values().sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for a client from `peer`, or the 503 that says why not.
    pub fn take(self: &Arc<Slots>, peer: IpAddr) -> Result<Slot, Reply> {
        let mut held = self.lock();
        let total: usize = held.values().sum();
        let mine = held.get(&peer).copied().unwrap_or(0);
        let why = if total >= self.max {
            format!("too many live clients ({}={})", self.vars.0, self.max)
        } else if mine >= self.per_peer {
            format!(
                "too many live clients from {peer} ({}={})",
                self.vars.1, self.per_peer
            )
        } else {
            held.insert(peer, mine + 1);
            return Ok(Slot {
                slots: self.clone(),
                peer,
            });
        };
        Err(
            Reply::error(503, format!("{why}; close another tab and retry"))
                .header("Retry-After", "10"),
        )
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.slots.lock();
        if let Some(n) = held.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.peer);
            }
        }
    }
}

/// Where a stream's frames come from.
pub trait Source: Send + 'static {
    /// The next frame (whole `id:`/`event:`/`data:` lines and the blank line),
    /// `None` when nothing came within `wait`, or why the stream must end.
    fn next(&mut self, wait: Duration) -> Result<Option<Arc<str>>, String>;
}

/// Settings every stream of a server shares.
pub struct Params {
    pub slots: Arc<Slots>,
    /// Time between `: ping` comments on an idle stream, and between two checks
    /// that the client still reads.
    pub ping: Duration,
    pub stop: Arc<AtomicBool>,
}

/// Answers a stream request: a 503 without a free slot, else hands the
/// connection to a writer thread named `thread` and returns at once.
pub fn start(req: Request, p: &Params, thread: &str, source: impl Source) {
    let peer = req
        .remote_addr()
        .map(|a| a.ip())
        .unwrap_or(IpAddr::from([0, 0, 0, 0]));
    let slot = match p.slots.take(peer) {
        Ok(s) => s,
        Err(reply) => {
            let _ = req.respond(reply.into_response());
            return;
        }
    };
    let fd = req.socket_fd();
    let writer = req.into_writer();
    let (ping, stop) = (p.ping, p.stop.clone());
    let spawned = std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || {
            let _slot = slot;
            let mut writer = writer;
            let mut source = source;
            match pump(&mut writer, fd, &mut source, ping, &stop) {
                Ok(()) => log::debug!("live client {peer}: the server stops"),
                Err(e) => log::debug!("live client {peer} dropped: {e}"),
            }
            // tiny_http would keep the socket for a next request the client
            // never sends; end it so the client sees the end (and reconnects).
            // The writer is still alive here, so the descriptor is too.
            if let Some(fd) = fd {
                // SAFETY: shutdown on a socket fd has no memory effects.
                unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start a live-stream writer thread: {e}");
    }
}

/// Writes the stream until the client goes, the source ends or the server
/// stops.
fn pump(
    w: &mut dyn Write,
    fd: Option<RawFd>,
    source: &mut dyn Source,
    ping: Duration,
    stop: &AtomicBool,
) -> io::Result<()> {
    let mut out = Out { w, written: 0 };
    out.send(HEAD.as_bytes())?;
    out.send(b"retry: 2000\n\n")?;
    let mut watch = fd.map(Watch::new);
    let mut last_write = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if let Some(w) = &watch {
            if w.peer_gone() {
                return Err(io::Error::other("the client hung up"));
            }
        }
        match source.next(ping.min(TICK)) {
            Ok(Some(frame)) => {
                out.send(frame.as_bytes())?;
                last_write = Instant::now();
            }
            Ok(None) if last_write.elapsed() >= ping => {
                out.send(b": ping\n\n")?;
                last_write = Instant::now();
            }
            Ok(None) => {}
            Err(e) => return Err(io::Error::other(e)),
        }
        if let Some(watch) = &mut watch {
            if watch.stalled(out.written, ping) {
                return Err(io::Error::other(
                    "it stopped reading (nothing acknowledged for a whole ping interval)",
                ));
            }
        }
    }
    Ok(())
}

/// The stream's writer and the bytes handed to the kernel so far.
struct Out<'a> {
    w: &'a mut dyn Write,
    written: u64,
}

impl Out<'_> {
    fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.w.write_all(bytes)?;
        self.w.flush()?;
        self.written += bytes.len() as u64;
        Ok(())
    }
}

/// What a stream knows of its socket, to tell a client that left or stopped
/// reading.
struct Watch {
    fd: RawFd,
    acked: u64,
    checked: Instant,
}

impl Watch {
    fn new(fd: RawFd) -> Watch {
        Watch {
            fd,
            acked: 0,
            checked: Instant::now(),
        }
    }

    /// The client closed its end (or the connection broke).
    fn peer_gone(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd, no wait.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }

    /// Once per `every`: true when bytes are waiting for the client and it
    /// acknowledged none since the last check.
    fn stalled(&mut self, written: u64, every: Duration) -> bool {
        if self.checked.elapsed() < every {
            return false;
        }
        self.checked = Instant::now();
        let Some(queued) = unsent(self.fd) else {
            return false;
        };
        let acked = written.saturating_sub(queued);
        let stalled = queued > 0 && acked <= self.acked;
        self.acked = acked;
        stalled
    }
}

/// Bytes written to the socket that the peer has not acknowledged (`SIOCOUTQ`).
fn unsent(fd: RawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int through the pointer.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ as _, &mut n) };
    (rc == 0).then(|| n.max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_in_all_and_per_peer_and_freed() {
        let slots = Slots::new(3, 2, ("MAX", "PER_PEER"));
        let a = IpAddr::from([127, 0, 0, 1]);
        let b = IpAddr::from([127, 0, 0, 2]);
        let a1 = slots.take(a).unwrap();
        let _a2 = slots.take(a).unwrap();
        let e = slots.take(a).unwrap_err();
        assert_eq!(e.status, 503);
        let _b1 = slots.take(b).unwrap();
        assert_eq!(slots.count(), 3);
        assert!(slots.take(b).is_err(), "the total cap");
        drop(a1);
        assert_eq!(slots.count(), 2);
        assert!(slots.take(b).is_ok());
    }

    #[test]
    fn a_socket_that_is_not_read_shows_unacknowledged_bytes_or_a_hang_up() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut server, _) = l.accept().unwrap();
        let mut watch = Watch::new(server.as_raw_fd());
        assert!(!watch.peer_gone());
        server.write_all(b"hello").unwrap();
        let mut buf = [0; 5];
        client.read_exact(&mut buf).unwrap();
        assert!(!watch.stalled(5, Duration::ZERO), "read and acknowledged");
        // Fill the client's receive window and the send queue: then the queue
        // stays and nothing more is acknowledged.
        server.set_nonblocking(true).unwrap();
        let mut written = 5u64;
        let chunk = [b'x'; 65536];
        while let Ok(n) = server.write(&chunk) {
            written += n as u64;
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(unsent(server.as_raw_fd()).unwrap() > 0);
        watch.stalled(written, Duration::ZERO);
        assert!(watch.stalled(written, Duration::ZERO), "no progress");
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
        assert!(watch.peer_gone());
    }
}
