//! The one live-stream writer (Server-Sent Events) of both web servers: the
//! agent page's `/events` (the harness's bus) and the dashboard's (the shared
//! hive snapshot). Each client gets one named writer thread that owns the raw
//! connection (headers written by hand, a flush after every frame, since a
//! streamed tiny_http body stalls in 8 KiB chunks) and waits in one `select!`
//! on its [`Source`]'s channel, on the client hanging up (a `sys::fd::
//! HangupWatch` thread, `NAME-watch`), on the server stopping and on the ping
//! timer. A client holds one of a server's [`Slots`] (a cap in all and a cap
//! per client: its login session, else its peer address, so clients behind
//! one proxy are not one client) and gives it back as soon as it goes:
//!
//! - it hung up: the socket shows `POLLRDHUP`;
//! - it stopped reading: at every ping interval the bytes it acknowledged
//!   (written minus the socket's unsent queue, `SIOCOUTQ`) did not grow while
//!   some were still waiting;
//! - a write made no progress for the send timeout;
//! - its source ended (the bus dropped a subscription that fell behind) or the
//!   server stops.
//!
//! So a client that never reads cannot keep a slot once data waits for it, and
//! never holds up the turn loop or another client.

use crate::http::guard::Client;
use crate::http::Reply;
use crate::sys::fd::{self, HangupWatch};
use crossbeam_channel::{at, never, select, Receiver};
use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::RawFd;
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

/// The live-stream places of one server.
#[derive(Debug)]
pub struct Slots {
    max: usize,
    per_client: usize,
    /// Variable names for the 503's advice.
    vars: (&'static str, &'static str),
    held: Mutex<HashMap<Client, usize>>,
}

/// One client's place; given back on drop, whichever way its writer ends.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    client: Client,
}

impl Slots {
    /// `max` streams in all, `per_client` for one [`Client`]; `vars` name
    /// the settings (for the 503's advice).
    pub fn new(max: usize, per_client: usize, vars: (&'static str, &'static str)) -> Arc<Slots> {
        Arc::new(Slots {
            max,
            per_client: per_client.min(max),
            vars,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// Clients connected now.
    pub fn count(&self) -> usize {
        self.lock().values().sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Client, usize>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for `client`, or the 503 that says why not.
    pub fn take(self: &Arc<Slots>, client: &Client) -> Result<Slot, Reply> {
        let mut held = self.lock();
        let total: usize = held.values().sum();
        let mine = held.get(client).copied().unwrap_or(0);
        let why = if total >= self.max {
            format!("too many live clients ({}={})", self.vars.0, self.max)
        } else if mine >= self.per_client {
            format!(
                "too many live clients from {client} ({}={})",
                self.vars.1, self.per_client
            )
        } else {
            held.insert(client.clone(), mine + 1);
            return Ok(Slot {
                slots: self.clone(),
                client: client.clone(),
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
        if let Some(n) = held.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.client);
            }
        }
    }
}

/// Where a stream's frames come from.
pub trait Source: Send + 'static {
    /// What arrives on the source's channel.
    type Item: Send + 'static;
    /// Frames to write before anything new (a replay), once.
    fn first(&mut self) -> Vec<Arc<str>> {
        Vec::new()
    }
    /// The channel new items arrive on.
    fn items(&self) -> Receiver<Self::Item>;
    /// The frame (whole `id:`/`event:`/`data:` lines and the blank line) an
    /// item makes, if any.
    fn frame(&mut self, item: Self::Item) -> Option<Arc<str>>;
    /// Why the stream ends when the channel disconnects.
    fn ended(&self) -> String;
}

/// Settings every stream of a server shares.
pub struct Params {
    pub slots: Arc<Slots>,
    /// Time between `: ping` comments on an idle stream, and between two checks
    /// that the client still reads.
    pub ping: Duration,
    /// Disconnects when the server stops (its sender is never used).
    pub stop: Receiver<()>,
}

/// Answers a stream request of `client`: a 503 without a free slot, else
/// hands the connection to a writer thread named `thread` and returns at once.
/// The writer makes its source with `source` (a subscription, a replay): a
/// refused client costs nothing, and no worker builds a replay.
pub fn start<S: Source>(
    req: Request,
    client: &Client,
    p: &Params,
    thread: &str,
    source: impl FnOnce() -> S + Send + 'static,
) {
    let peer = client.to_string();
    let slot = match p.slots.take(client) {
        Ok(s) => s,
        Err(reply) => {
            let _ = req.respond(reply.into_response());
            return;
        }
    };
    let socket = req.socket_fd();
    let writer = req.into_writer();
    let (ping, stop) = (p.ping, p.stop.clone());
    let name = thread.to_string();
    let spawned = std::thread::Builder::new()
        .name(name.clone())
        .spawn(move || {
            let _slot = slot;
            let mut writer = writer;
            let mut source = source();
            let stream = Stream {
                name: &name,
                socket,
                ping,
                stop: &stop,
            };
            match stream.pump(&mut writer, &mut source) {
                Ok(()) => log::debug!("live client {peer}: the server stops"),
                Err(e) => log::debug!("live client {peer} dropped: {e}"),
            }
            // tiny_http would keep the socket for a next request the client
            // never sends; end it so the client sees the end (and reconnects).
            // The writer is still alive here, so the descriptor is too.
            if let Some(socket) = socket {
                fd::shutdown(socket);
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start a live-stream writer thread: {e}");
    }
}

/// One client's stream, as its writer thread sees it.
struct Stream<'a> {
    name: &'a str,
    socket: Option<RawFd>,
    ping: Duration,
    stop: &'a Receiver<()>,
}

impl Stream<'_> {
    /// Writes the stream until the client goes, the source ends or the server
    /// stops.
    fn pump(&self, w: &mut dyn Write, source: &mut impl Source) -> io::Result<()> {
        let items = source.items();
        // The watch is dropped (its thread joined) before the socket can close.
        let watch = match self
            .socket
            .map(|s| HangupWatch::start(&format!("{}-watch", self.name), s))
        {
            Some(Ok(w)) => Some(w),
            Some(Err(e)) => {
                log::debug!("cannot watch a live client for a hang-up: {e}");
                None
            }
            None => None,
        };
        let no_watch = never();
        let hung_up = watch.as_ref().map_or(&no_watch, |w| w.hung_up());
        let mut out = Out { w, written: 0 };
        out.send(HEAD.as_bytes())?;
        out.send(b"retry: 2000\n\n")?;
        for frame in source.first() {
            out.send(frame.as_bytes())?;
        }
        let mut stall = self.socket.map(Stall::new);
        let mut last_write = Instant::now();
        loop {
            select! {
                recv(items) -> item => match item {
                    Ok(item) => {
                        if let Some(frame) = source.frame(item) {
                            out.send(frame.as_bytes())?;
                            last_write = Instant::now();
                        }
                    }
                    Err(_) => return Err(io::Error::other(source.ended())),
                },
                recv(hung_up) -> _ => return Err(io::Error::other("the client hung up")),
                recv(self.stop) -> _ => return Ok(()),
                recv(at(last_write + self.ping)) -> _ => {
                    out.send(b": ping\n\n")?;
                    last_write = Instant::now();
                }
            }
            if let Some(stall) = &mut stall {
                if stall.stalled(out.written, self.ping) {
                    return Err(io::Error::other(
                        "it stopped reading (nothing acknowledged for a whole ping interval)",
                    ));
                }
            }
        }
    }
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

/// What a stream knows of its socket's send queue, to tell a client that
/// stopped reading.
struct Stall {
    fd: RawFd,
    acked: u64,
    checked: Instant,
}

impl Stall {
    fn new(fd: RawFd) -> Stall {
        Stall {
            fd,
            acked: 0,
            checked: Instant::now(),
        }
    }

    /// Once per `every`: true when bytes are waiting for the client and it
    /// acknowledged none since the last check.
    fn stalled(&mut self, written: u64, every: Duration) -> bool {
        if self.checked.elapsed() < every {
            return false;
        }
        self.checked = Instant::now();
        let Some(queued) = fd::unsent(self.fd) else {
            return false;
        };
        let acked = written.saturating_sub(queued);
        let stalled = queued > 0 && acked <= self.acked;
        self.acked = acked;
        stalled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_capped_in_all_and_per_client_and_freed() {
        let slots = Slots::new(3, 2, ("MAX", "PER_CLIENT"));
        let a = Client::Peer(std::net::IpAddr::from([127, 0, 0, 1]));
        let b = Client::Session("0123456789abcdef0123456789abcdef".into());
        let a1 = slots.take(&a).unwrap();
        let _a2 = slots.take(&a).unwrap();
        let e = slots.take(&a).unwrap_err();
        assert_eq!(e.status, 503);
        let _b1 = slots.take(&b).unwrap();
        assert_eq!(slots.count(), 3);
        assert!(slots.take(&b).is_err(), "the total cap");
        drop(a1);
        assert_eq!(slots.count(), 2);
        assert!(slots.take(&b).is_ok(), "a session beside its address");
    }

    #[test]
    fn a_client_that_stops_reading_is_told_from_one_that_reads() {
        use std::io::Read;
        use std::os::fd::AsRawFd;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut server, _) = l.accept().unwrap();
        let mut stall = Stall::new(server.as_raw_fd());
        server.write_all(b"hello").unwrap();
        let mut buf = [0; 5];
        client.read_exact(&mut buf).unwrap();
        assert!(!stall.stalled(5, Duration::ZERO), "read and acknowledged");
        // Fill the client's receive window and the send queue: then the queue
        // stays and nothing more is acknowledged.
        server.set_nonblocking(true).unwrap();
        let mut written = 5u64;
        let chunk = [b'x'; 65536];
        while let Ok(n) = server.write(&chunk) {
            written += n as u64;
        }
        std::thread::sleep(Duration::from_millis(50));
        stall.stalled(written, Duration::ZERO);
        assert!(stall.stalled(written, Duration::ZERO), "no progress");
    }
}
