//! `GET /events`: Server-Sent Events from the bus. Each client gets one named
//! writer thread that owns the raw connection (headers written by hand, a flush
//! after every event, since a streamed tiny_http body stalls in 8 KiB chunks)
//! and the bounded bus subscription that feeds it. The bus drops a subscription
//! that falls behind, and a write that makes no progress for the send timeout
//! fails, so a slow or gone client ends its own thread and never holds up the
//! turn loop or another client. The number of clients is capped.

use crate::harness::bus::{Bus, Numbered};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use std::io::{self, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiny_http::Request;

use super::http::Reply;

/// One SSE frame for a numbered event.
pub fn frame(n: &Numbered) -> String {
    format!("id: {}\ndata: {}\n\n", n.id, n.to_json())
}

/// The header block written by hand before the stream.
pub const HEAD: &str = "HTTP/1.1 200 OK\r\n\
    Content-Type: text/event-stream; charset=utf-8\r\n\
    Cache-Control: no-store\r\n\
    Connection: close\r\n\
    X-Accel-Buffering: no\r\n\
    X-Content-Type-Options: nosniff\r\n\r\n";

/// Holds one client slot; frees it on drop, whichever way the writer ends.
pub struct Slot(Arc<AtomicUsize>);

impl Slot {
    /// Takes a slot, or None when `max` clients are already connected.
    pub fn take(count: &Arc<AtomicUsize>, max: usize) -> Option<Slot> {
        count
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Slot(count.clone()))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

pub struct SseParams {
    /// The server's port, to find a client's socket by its two ends.
    pub local_port: u16,
    pub max_clients: usize,
    pub ping: Duration,
    pub clients: Arc<AtomicUsize>,
    pub stop: Arc<AtomicBool>,
}

/// Answers `GET /events`: a 503 beyond the cap, else hands the connection to a
/// writer thread and returns at once.
pub fn serve(bus: &Bus, p: &SseParams, req: Request, last_id: Option<u64>) {
    let Some(slot) = Slot::take(&p.clients, p.max_clients) else {
        let reply = Reply::error(
            503,
            format!(
                "too many live clients (HIVE_SSE_MAX_CLIENTS={}); close another tab and retry",
                p.max_clients
            ),
        )
        .header("Retry-After", "10");
        let _ = req.respond(reply.into_response());
        return;
    };
    // A client that saw ids beyond ours saw an earlier run: start it afresh.
    let reset = last_id.is_some_and(|l| l > bus.last_id());
    let (replay, rx) = bus.subscribe(if reset { None } else { last_id });
    let ends = req.remote_addr().copied().map(|peer| (p.local_port, peer));
    let writer = req.into_writer();
    let ping = p.ping;
    let stop = p.stop.clone();
    let spawned = std::thread::Builder::new()
        .name("web-sse".into())
        .spawn(move || {
            let _slot = slot;
            match stream(writer, reset, replay, &rx, ping, &stop) {
                Ok(()) => log::debug!("SSE client finished"),
                Err(e) => log::debug!("SSE client dropped: {e}"),
            }
            // tiny_http keeps the socket for a next request the client will
            // never send; close it so the client sees the end and reconnects.
            // The writer is still alive here, so the connection's fds are too.
            if let Some((port, peer)) = ends {
                close_connection(port, peer);
            }
        });
    if let Err(e) = spawned {
        log::warn!("cannot start an SSE writer thread: {e}");
    }
}

/// Writes the stream until the client goes, the bus drops the subscription or
/// the server stops.
fn stream(
    mut w: Box<dyn Write + Send>,
    reset: bool,
    replay: Vec<Numbered>,
    rx: &Receiver<Numbered>,
    ping: Duration,
    stop: &AtomicBool,
) -> io::Result<()> {
    w.write_all(HEAD.as_bytes())?;
    w.write_all(b"retry: 2000\n\n")?;
    if reset {
        w.write_all(b"event: reset\ndata: {}\n\n")?;
    }
    w.flush()?;
    for n in &replay {
        w.write_all(frame(n).as_bytes())?;
        w.flush()?;
    }
    let tick = ping.min(Duration::from_millis(250));
    let mut last_write = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        match rx.recv_timeout(tick) {
            Ok(n) => {
                w.write_all(frame(&n).as_bytes())?;
                w.flush()?;
                last_write = Instant::now();
            }
            Err(RecvTimeoutError::Timeout) => {
                if last_write.elapsed() >= ping {
                    w.write_all(b": ping\n\n")?;
                    w.flush()?;
                    last_write = Instant::now();
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(io::Error::other("fell too far behind the bus"))
            }
        }
    }
    Ok(())
}

/// The address of one end of socket `fd` (`getsockname` or `getpeername`).
fn socket_end(fd: i32, peer: bool) -> Option<SocketAddr> {
    // SAFETY: the storage is zeroed, large enough for any address, and its
    // length is passed; the fd may be anything, which the call reports.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let sa = (&mut st as *mut libc::sockaddr_storage).cast::<libc::sockaddr>();
    let rc = unsafe {
        if peer {
            libc::getpeername(fd, sa, &mut len)
        } else {
            libc::getsockname(fd, sa, &mut len)
        }
    };
    if rc != 0 {
        return None;
    }
    match i32::from(st.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says this is a sockaddr_in.
            let a = unsafe { *(&st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::new(ip.into(), u16::from_be(a.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this is a sockaddr_in6.
            let a = unsafe { *(&st as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::new(ip.into(), u16::from_be(a.sin6_port)))
        }
        _ => None,
    }
}

/// Shuts down (both ways) the TCP connection between our `port` and `peer`,
/// found among this process's open fds.
fn close_connection(port: u16, peer: SocketAddr) {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let ours = socket_end(fd, false).is_some_and(|l| l.port() == port);
        if ours && socket_end(fd, true) == Some(peer) {
            // SAFETY: shutdown on a socket fd has no memory effects.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::bus::LiveEvent;

    #[test]
    fn frames_carry_the_id_and_one_data_line() {
        let n = Numbered {
            id: 7,
            event: LiveEvent::Note {
                text: "two\nlines".into(),
            },
        };
        let f = frame(&n);
        assert!(f.starts_with("id: 7\ndata: {"), "{f}");
        assert_eq!(f.matches('\n').count(), 3, "{f}");
    }

    #[test]
    fn a_closed_stream_is_shut_down_for_the_client() {
        use std::io::Read;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_server_side, peer) = l.accept().unwrap();
        close_connection(port, peer);
        client
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(client.read(&mut [0; 8]).unwrap(), 0, "the client sees EOF");
    }

    #[test]
    fn slots_are_capped_and_freed() {
        let count = Arc::new(AtomicUsize::new(0));
        let a = Slot::take(&count, 2).unwrap();
        let _b = Slot::take(&count, 2).unwrap();
        assert!(Slot::take(&count, 2).is_none());
        drop(a);
        assert!(Slot::take(&count, 2).is_some());
    }
}
