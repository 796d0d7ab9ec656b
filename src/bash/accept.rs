//! The bash-task daemon's accept loop ([`Acceptor`]): one listening socket,
//! a thread per client that stays a while for the next one, and a failed
//! accept that pauses with a backoff instead of ending the loop. It came
//! from `proto::lines`, where only the daemon used it.

use crate::proto::lines::refuse;
use crossbeam_channel::bounded;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a connection thread whose client left waits for the next client
/// before it exits: a burst of short connections (`hive wake`, one per tool
/// call of `hive mcp`) is served by the threads of the burst before it, not
/// by a new thread each.
const IDLE_KEEP: Duration = Duration::from_secs(10);

/// The stack of a connection thread: it reads request lines of at most
/// `MAX_LINE` and parses them (serde_json's recursion limit, 128, bounds
/// their nesting; a test parses a request nested to it on a thread of this
/// size) and writes the answers.
pub const CONN_STACK: usize = 256 * 1024;

/// The first pause after a failed accept; it doubles per failure in a row.
const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// The cap on that pause.
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// One listening socket's accept loop.
pub struct Acceptor {
    /// The socket in log lines: "the socket of ana", "the bash task socket".
    pub what: String,
    /// Connection threads are named `{thread}-{id}`.
    pub thread: &'static str,
    /// Connection ids, shared by the sockets of one server.
    pub ids: Arc<AtomicU64>,
    /// Checked after every accept: the loop ends once it is set (whoever sets
    /// it connects once to wake the loop).
    pub stop: Option<Arc<AtomicBool>>,
}

impl Acceptor {
    /// Accepts clients until `stop`, each on its own thread running `serve`
    /// with the connection, its id and what `admit` gave it (a slot under a
    /// cap, released when dropped). A thread whose client has left (and whose
    /// slot is released) waits up to `IDLE_KEEP` for the next client, which
    /// it is handed when it is idle; only when no thread is idle is a new one
    /// started. A client `admit` refuses gets one `ok:false` line saying why
    /// and is closed. A failed accept or a thread that cannot be started (out
    /// of descriptors, memory or threads) never ends the loop or drops the
    /// listener: it pauses with a doubling, capped backoff and logs the first
    /// failure of each burst and the recovery.
    pub fn run<G: Send + 'static>(
        self,
        listener: UnixListener,
        admit: impl Fn() -> Result<G, String>,
        serve: impl Fn(UnixStream, u64, G) + Send + Sync + 'static,
    ) {
        let serve = Arc::new(serve);
        // Zero capacity: a send succeeds only into an idle thread's receive.
        let (idle_tx, idle_rx) = bounded::<(UnixStream, u64, G)>(0);
        let what = &self.what;
        let mut failures: u64 = 0;
        let mut refused: u64 = 0;
        let mut backoff = BACKOFF_MIN;
        loop {
            let accepted = listener.accept();
            if self.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
                return;
            }
            let failed = match accepted {
                Err(e) => Some(format!("accept on {what} failed: {e}")),
                Ok((stream, _)) => match admit() {
                    Err(why) => {
                        if refused == 0 {
                            log::warn!("refusing connections: {why}");
                        }
                        refused += 1;
                        refuse(stream, &why);
                        continue;
                    }
                    Ok(guard) => {
                        if refused > 0 {
                            log::info!(
                                "accepting on {what} again after refusing {refused} connections"
                            );
                            refused = 0;
                        }
                        let id = self.ids.fetch_add(1, Ordering::Relaxed);
                        match idle_tx.try_send((stream, id, guard)) {
                            Ok(()) => None,
                            Err(e) => {
                                let (stream, id, guard) = e.into_inner();
                                let serve = serve.clone();
                                let idle = idle_rx.clone();
                                std::thread::Builder::new()
                                    .stack_size(CONN_STACK)
                                    .name(format!("{}-{id}", self.thread))
                                    .spawn(move || {
                                        let mut next = Some((stream, id, guard));
                                        while let Some((stream, id, guard)) = next {
                                            serve(stream, id, guard);
                                            next = idle.recv_timeout(IDLE_KEEP).ok();
                                        }
                                    })
                                    .err()
                                    .map(|e| {
                                        format!("cannot start a connection thread for {what}: {e}")
                                    })
                            }
                        }
                    }
                },
            };
            match failed {
                None if failures > 0 => {
                    log::info!(
                        "accepting on {what} again after {failures} failures: it accepts again"
                    );
                    failures = 0;
                    backoff = BACKOFF_MIN;
                }
                None => {}
                Some(e) => {
                    failures += 1;
                    if failures == 1 {
                        log::warn!(
                            "{e}; the socket stays open, retrying with a backoff up to {BACKOFF_MAX:?}"
                        );
                    } else {
                        log::debug!("{what}: {failures} failures in a row");
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::lines::{ok_line, serve_conn, CallError, Conn};

    #[test]
    fn a_server_and_a_cancellable_client_talk_in_lines() {
        let dir = std::env::temp_dir().join(format!("hive-lines-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let acceptor = Acceptor {
            what: "the test socket".into(),
            thread: "test-conn",
            ids: Arc::new(AtomicU64::new(1)),
            stop: None,
        };
        std::thread::spawn(move || {
            acceptor.run(
                listener,
                || Ok(()),
                |stream, _, ()| {
                    serve_conn(
                        stream,
                        "busy",
                        |line| {
                            if line == "sleep" {
                                std::thread::sleep(Duration::from_secs(30));
                            }
                            (ok_line(&serde_json::json!({ "echo": line })), None::<()>)
                        },
                        |_| {},
                    )
                },
            )
        });
        let mut c = Conn::connect(&path, "the test server").unwrap();
        let line = c.exchange("hi", "hi", None).unwrap();
        assert_eq!(line, r#"{"ok":true,"echo":"hi"}"#);
        let (cancel_tx, cancel) = bounded::<()>(0);
        let t = std::thread::spawn(move || c.exchange("sleep", "sleep", Some(&cancel)));
        std::thread::sleep(Duration::from_millis(100));
        drop(cancel_tx);
        assert_eq!(t.join().unwrap(), Err(CallError::Cancelled));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Short connections one after another are served by the threads of the
    /// ones before (a thread whose client left takes the next client), each
    /// with its own id and its own slot, released when its client leaves.
    #[test]
    fn connections_in_a_row_reuse_idle_threads_and_release_their_slots() {
        let dir = std::env::temp_dir().join(format!("hive-lines-reuse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let acceptor = Acceptor {
            what: "the test socket".into(),
            thread: "test-conn",
            ids: Arc::new(AtomicU64::new(1)),
            stop: None,
        };
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let slots = open.clone();
        let (seen_tx, seen) = crossbeam_channel::unbounded();
        std::thread::spawn(move || {
            acceptor.run(
                listener,
                move || {
                    // A slot: counted while a client holds it.
                    struct Slot(Arc<std::sync::atomic::AtomicUsize>);
                    impl Drop for Slot {
                        fn drop(&mut self) {
                            self.0.fetch_sub(1, Ordering::SeqCst);
                        }
                    }
                    slots.fetch_add(1, Ordering::SeqCst);
                    Ok(Slot(slots.clone()))
                },
                move |stream, id, _slot| {
                    let _ = seen_tx.send((id, std::thread::current().id()));
                    serve_conn(
                        stream,
                        "busy",
                        |l| (ok_line(&serde_json::json!({ "echo": l })), None::<()>),
                        |_| {},
                    );
                },
            )
        });
        let rounds = 20;
        let mut threads = std::collections::HashSet::new();
        let mut ids = std::collections::HashSet::new();
        for i in 0..rounds {
            let mut c = Conn::connect(&path, "the test server").unwrap();
            let line = c.exchange(&format!("m{i}"), "m", None).unwrap();
            assert_eq!(line, format!(r#"{{"ok":true,"echo":"m{i}"}}"#));
            drop(c);
            let (id, thread) = seen.recv_timeout(Duration::from_secs(10)).unwrap();
            ids.insert(id);
            threads.insert(thread);
            // The client left: its slot is given back.
            let end = std::time::Instant::now() + Duration::from_secs(10);
            while open.load(Ordering::SeqCst) != 0 {
                assert!(std::time::Instant::now() < end, "the slot was not released");
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        assert_eq!(ids.len(), rounds, "each connection has its own id");
        assert!(
            threads.len() < rounds,
            "{} threads served {rounds} connections in a row",
            threads.len()
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
