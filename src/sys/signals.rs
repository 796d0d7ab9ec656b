//! Shutdown signals, handled one way in every process: SIGTERM, SIGINT and
//! SIGHUP are taken by one thread named `signals` (signal-hook's iterator, no
//! handler code of ours runs in signal context). The first one is forwarded on
//! a channel, which then closes, so every `select!` that watches it sees it,
//! and keeps seeing it, however many watch; a second one (or a first that no
//! one is left to receive) exits the process at once with 128 + the signal, as
//! a shell reports a death by that signal.

use crossbeam_channel::Receiver;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

/// Registers the shutdown signals and starts the `signals` thread. Call it
/// early, before the threads that should not see the signals are started.
/// The receiver yields the first signal's number, then reports disconnection.
pub fn signals() -> Result<Receiver<i32>, String> {
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let (tx, rx) = crossbeam_channel::bounded(1);
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut first = Some(tx);
            for sig in signals.forever() {
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
    Ok(rx)
}

#[cfg(test)]
mod tests {
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
