//! Threads that live only while they have work: the one way an actor of an
//! idle agent (the history's reader and writer, the harness's broker calls,
//! the bash daemon's coordinator and waker) gives its thread back. A
//! [`Slot`] holds the actor's state while no thread runs it and says whether
//! one does; whoever sends the actor a message first puts it on the actor's
//! channel and then calls [`Slot::wake`], which starts the thread (with the
//! state) when none runs. The thread, when it finds nothing more to do,
//! calls [`Slot::park`] with its state and a look at its channel: under the
//! slot's lock, an empty channel ends the thread (the state goes back in the
//! slot), anything that arrived meanwhile keeps it running. A message is
//! sent before the wake takes the lock and the thread looks under it, so
//! no message is ever left on a channel without a thread to take it.

use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

/// The state of an actor whose thread runs only while it has work.
pub struct Slot<S> {
    inner: Arc<Mutex<Inner<S>>>,
}

struct Inner<S> {
    running: bool,
    state: Option<S>,
}

impl<S> Clone for Slot<S> {
    fn clone(&self) -> Self {
        Slot {
            inner: self.inner.clone(),
        }
    }
}

impl<S: Send + 'static> Slot<S> {
    /// A slot holding `state`, with no thread running.
    pub fn new(state: S) -> Slot<S> {
        Slot {
            inner: Arc::new(Mutex::new(Inner {
                running: false,
                state: Some(state),
            })),
        }
    }

    /// A slot with no state yet ([`Slot::put`] gives it one): a wake starts
    /// nothing until then.
    pub fn vacant() -> Slot<S> {
        Slot {
            inner: Arc::new(Mutex::new(Inner {
                running: false,
                state: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<S>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `state` in a vacant slot.
    pub fn put(&self, state: S) {
        self.lock().state = Some(state);
    }

    /// The actor is gone for good (its thread consumed the state, or a
    /// panic ended it): every later wake starts nothing and says so.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.running = false;
        inner.state = None;
    }

    /// Starts a thread named `name` with a stack of `stack` bytes that runs
    /// `run` on the state, unless one runs already (then the message just
    /// sent is its). True when a thread runs now. A thread that cannot be
    /// started leaves the state in the slot, for the next wake to try again.
    pub fn wake(
        &self,
        name: &str,
        stack: usize,
        run: impl FnOnce(S, Slot<S>) + Send + 'static,
    ) -> io::Result<bool> {
        let mut inner = self.lock();
        if inner.running {
            return Ok(true);
        }
        let Some(state) = inner.state.take() else {
            // A thread that panicked took it along: nothing runs any more.
            return Ok(false);
        };
        let slot = self.clone();
        // The state goes to the thread once it runs, so a thread that cannot
        // start leaves it here.
        let (tx, rx) = crossbeam_channel::bounded::<S>(1);
        let spawned = std::thread::Builder::new()
            .name(name.to_string())
            .stack_size(stack)
            .spawn(move || {
                // A panic ends the actor for good: later wakes say so.
                let closer = Closer(slot.clone());
                if let Ok(state) = rx.recv() {
                    run(state, slot);
                }
                std::mem::forget(closer);
            });
        match spawned {
            Ok(_) => {
                inner.running = true;
                let _ = tx.send(state);
                Ok(true)
            }
            Err(e) => {
                inner.state = Some(state);
                Err(e)
            }
        }
    }

    /// Called by the running thread when it has nothing more to do: when
    /// `idle` still holds under the lock, the state goes back in the slot and
    /// the thread should end (None); otherwise the thread keeps its state
    /// and goes on (work arrived meanwhile).
    pub fn park(&self, state: S, idle: impl FnOnce() -> bool) -> Option<S> {
        let mut inner = self.lock();
        if idle() {
            inner.state = Some(state);
            inner.running = false;
            None
        } else {
            Some(state)
        }
    }

    /// True while a thread runs the actor (false once it closed).
    pub fn running(&self) -> bool {
        self.lock().running
    }

    /// Runs `f` on the state while no thread has it (None while one does).
    pub fn with_parked<T>(&self, f: impl FnOnce(&mut S) -> T) -> Option<T> {
        let mut inner = self.lock();
        if inner.running {
            return None;
        }
        inner.state.as_mut().map(f)
    }
}

/// Closes its slot when dropped, which only a panic of the actor's thread
/// lets happen.
struct Closer<S: Send + 'static>(Slot<S>);

impl<S: Send + 'static> Drop for Closer<S> {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::unbounded;
    use std::time::Duration;

    /// A counter actor: every message sent is counted by some thread, and
    /// no thread is left once the channel is empty.
    #[test]
    fn every_message_is_taken_and_the_thread_ends_when_idle() {
        let (tx, rx) = unbounded::<u32>();
        let slot = Slot::new(0u64);
        let (done_tx, done_rx) = unbounded::<()>();
        for i in 0..2000u32 {
            tx.send(i).unwrap();
            let (rx, done_tx) = (rx.clone(), done_tx.clone());
            slot.wake("demand-test", 64 * 1024, move |mut n, slot| loop {
                while rx.try_recv().is_ok() {
                    n += 1;
                    let _ = done_tx.send(());
                }
                match slot.park(n, || rx.is_empty()) {
                    None => return,
                    Some(s) => n = s,
                }
            })
            .unwrap();
        }
        for _ in 0..2000 {
            done_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while slot.running() {
            assert!(
                std::time::Instant::now() < deadline,
                "the thread never ended"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(slot.with_parked(|n| *n), Some(2000));
    }
}
