//! Shutdown signals, handled one way in every process: SIGTERM, SIGINT and
//! SIGHUP are taken by one thread named `signals` (signal-hook's iterator, no
//! handler code of ours runs in signal context). The first one is forwarded on
//! a channel, which then closes, so every `select!` that watches it sees it,
//! and keeps seeing it, however many watch; a second one (or a first that no
//! one is left to receive) exits the process at once with 128 + the signal, as
//! a shell reports a death by that signal.
//!
//! A process that is PID 1 of its PID namespace (an isolated harness or
//! bash-task daemon, which `fleet::sandbox` execs in place) gets only the
//! signals it has a handler for — these three have one, and SIGKILL always
//! reaches it from `hive up` — and inherits every orphan of the namespace:
//! there the same thread also takes SIGCHLD — it alone: the threads started
//! after it block it — and reaps the orphans that exited
//! (`process::sweep_orphans`), so no other thread is needed.
//!
//! A process whose main thread has nothing else to do waits on that thread
//! instead ([`here`]): the same signals, the same orphan reaping, no thread
//! of their own until the first signal (then one, for the second), and a
//! [`Closer`] another thread ends the wait with (the bash-task daemon's
//! retirement).

use crossbeam_channel::Receiver;
use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::{Handle, Signals};

/// The shutdown signals waited for on the caller's thread ([`here`]).
pub struct Here {
    signals: Signals,
    reaper: bool,
}

/// Ends a [`Here::wait`] from another thread.
pub struct Closer(Handle);

impl Closer {
    pub fn close(&self) {
        self.0.close();
    }
}

/// SIGTERM, SIGINT and SIGHUP (and SIGCHLD as PID 1) for the calling
/// thread to wait for with [`Here::wait`]. Call it before any other thread
/// starts: as PID 1 it blocks SIGCHLD on this thread, so every thread
/// started after it inherits the block, and the wait takes it alone.
pub fn here() -> Result<(Here, Closer), String> {
    let reaper = std::process::id() == 1;
    let mut wanted = vec![SIGTERM, SIGINT, SIGHUP];
    if reaper {
        wanted.push(SIGCHLD);
    }
    let signals =
        Signals::new(wanted).map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let closer = Closer(signals.handle());
    if reaper {
        super::ns::SignalSet::new(&[SIGCHLD]).block();
    }
    Ok((Here { signals, reaper }, closer))
}

impl Here {
    /// Waits for the first shutdown signal (`Some`), or until the [`Closer`]
    /// closes it (`None`), reaping the namespace's orphans meanwhile when
    /// PID 1. After a signal a thread of its own waits for a second one,
    /// which exits at once with 128 + the signal.
    pub fn wait(mut self) -> Option<i32> {
        if self.reaper {
            unblock_sigchld();
            super::process::sweep_orphans();
        }
        let mut first = None;
        for sig in self.signals.forever() {
            if sig == SIGCHLD {
                let n = super::process::sweep_orphans();
                if n > 0 {
                    log::debug!("reaped {n} orphan(s) of this namespace");
                }
                continue;
            }
            log::info!("signal {sig}: stopping (send it again to exit at once)");
            first = Some(sig);
            break;
        }
        let (mut signals, reaper) = (self.signals, self.reaper);
        if reaper {
            super::ns::SignalSet::new(&[SIGCHLD]).block();
        }
        if first.is_some() {
            let _ = std::thread::Builder::new()
                .name("signals".into())
                .stack_size(256 * 1024)
                .spawn(move || {
                    if reaper {
                        unblock_sigchld();
                    }
                    for sig in signals.forever() {
                        if sig == SIGCHLD {
                            super::process::sweep_orphans();
                            continue;
                        }
                        log::warn!("signal {sig} again: exiting at once");
                        std::process::exit(128 + sig);
                    }
                });
        }
        first
    }
}

/// Lets SIGCHLD reach the calling thread again.
fn unblock_sigchld() {
    // SAFETY: a signal set built and changed on this stack, passed to
    // pthread_sigmask for the calling thread only.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, SIGCHLD);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Registers the shutdown signals (and SIGCHLD, as PID 1) and starts the
/// `signals` thread. Call it early, before the threads that should not see
/// the signals are started. The receiver yields the first signal's number,
/// then reports disconnection.
pub fn signals() -> Result<Receiver<i32>, String> {
    let mut wanted = vec![SIGTERM, SIGINT, SIGHUP];
    let reaper = std::process::id() == 1;
    if reaper {
        wanted.push(SIGCHLD);
    }
    let mut signals = signal_hook::iterator::Signals::new(wanted)
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut first = Some(tx);
            if reaper {
                // Orphans that exited before the handler was there.
                super::process::sweep_orphans();
            }
            for sig in signals.forever() {
                if sig == SIGCHLD {
                    let n = super::process::sweep_orphans();
                    if n > 0 {
                        log::debug!("reaped {n} orphan(s) of this namespace");
                    }
                    continue;
                }
                match first.take().map(|tx| tx.send(sig)) {
                    Some(Ok(())) => {
                        log::info!("signal {sig}: stopping (send it again to exit at once)")
                    }
                    _ => {
                        log::warn!("signal {sig} again: exiting at once");
                        std::process::exit(128 + sig);
                    }
                }
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    if reaper {
        // Only the `signals` thread takes SIGCHLD: the caller, and every
        // thread it starts from now on, blocks it, so no system call of
        // theirs is interrupted by a child's exit (children start with an
        // empty mask: `process`).
        super::ns::SignalSet::new(&[SIGCHLD]).block();
    }
    Ok(rx)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_wait_here_ends_when_closed_from_another_thread() {
        let (here, closer) = super::here().unwrap();
        let t = std::thread::spawn(move || here.wait());
        closer.close();
        assert_eq!(t.join().unwrap(), None);
    }

    /// The only test of the library that raises a signal: one is forwarded and
    /// nothing else is raised, so the exit-on-second-signal path never fires.
    #[test]
    fn the_first_signal_is_forwarded_and_the_channel_then_closes() {
        let rx = super::signals().unwrap();
        signal_hook::low_level::raise(super::SIGHUP).unwrap();
        let wait = std::time::Duration::from_secs(10);
        assert_eq!(rx.recv_timeout(wait), Ok(super::SIGHUP));
        assert_eq!(
            rx.recv_timeout(wait),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected),
            "a closed channel stays ready for every watcher"
        );
    }
}
