//! The wake thread: delivers each finished task's completion wake to the agent's
//! broker socket as a durable `wake` from `bash-task-<id>`, in order. Durable, so
//! a wake the broker accepted survives a broker restart and a harness killed
//! mid-turn gets it again (a transient wake would be lost in both cases). When the
//! broker cannot be reached the wake stays queued and the thread retries after a
//! backoff that doubles up to [`MAX_BACKOFF`]; with nothing queued it just blocks
//! on its channel. A delivered wake is reported back to the coordinator, which
//! clears the task's persisted `wake_pending` flag, so a wake still pending when
//! the daemon stops is sent again by the next daemon.

use super::coordinator::Event;
use super::report::wake_body;
use super::store::TaskRecord;
use crate::wire::{Client, ClientError, Request};
use crossbeam_channel::{after, select, Receiver, Sender};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Longest pause between two attempts while the broker is unreachable.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long one delivery may wait for the broker's answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// Where wakes go and what to tell when one got there.
pub struct Waker {
    pub agent_socket: PathBuf,
    pub tasks_dir: PathBuf,
    pub events: Sender<Event>,
}

/// What one delivery attempt came to.
enum Delivery {
    Delivered,
    /// The broker is unreachable: keep the wake and retry later.
    Unreachable(String),
    /// The broker refused it: retrying would not help.
    Refused(String),
}

impl Waker {
    /// Runs until `queue` is disconnected; wakes still queued then stay pending
    /// on disk.
    pub fn run(self, queue: Receiver<TaskRecord>) {
        let mut pending: VecDeque<TaskRecord> = VecDeque::new();
        let mut backoff = FIRST_BACKOFF;
        loop {
            if pending.is_empty() {
                match queue.recv() {
                    Ok(rec) => pending.push_back(rec),
                    Err(_) => return,
                }
            }
            while let Ok(rec) = queue.try_recv() {
                pending.push_back(rec);
            }
            while let Some(rec) = pending.front() {
                match self.deliver(rec) {
                    Delivery::Delivered => {
                        log::info!("wake from bash-task-{} delivered", rec.id);
                        let _ = self.events.send(Event::WakeDelivered(rec.id.clone()));
                        pending.pop_front();
                        backoff = FIRST_BACKOFF;
                    }
                    Delivery::Refused(e) => {
                        log::error!("the broker refused the wake of bash-task-{}: {e}", rec.id);
                        let _ = self.events.send(Event::WakeDelivered(rec.id.clone()));
                        pending.pop_front();
                    }
                    Delivery::Unreachable(e) => {
                        let level = if backoff == FIRST_BACKOFF {
                            log::Level::Warn
                        } else {
                            log::Level::Debug
                        };
                        log::log!(
                            level,
                            "cannot deliver {} wake(s) yet, retrying with backoff up to \
                             {MAX_BACKOFF:?}: {e}",
                            pending.len()
                        );
                        break;
                    }
                }
            }
            if pending.is_empty() {
                continue;
            }
            select! {
                recv(queue) -> rec => match rec {
                    Ok(rec) => pending.push_back(rec),
                    Err(_) => return,
                },
                recv(after(backoff)) -> _ => backoff = (backoff * 2).min(MAX_BACKOFF),
            }
        }
    }

    fn deliver(&self, rec: &TaskRecord) -> Delivery {
        let mut client = match Client::connect(&self.agent_socket) {
            Ok(c) => c,
            Err(e) => return Delivery::Unreachable(e.to_string()),
        };
        if let Err(e) = client.set_read_timeout(Some(CALL_TIMEOUT)) {
            return Delivery::Unreachable(e.to_string());
        }
        let req = Request::Wake {
            from: format!("bash-task-{}", rec.id),
            body: wake_body(rec, &self.tasks_dir),
            transient: false,
            to: None,
        };
        match client.call(&req) {
            Ok(_) => Delivery::Delivered,
            Err(ClientError::Refused(e)) => Delivery::Refused(e),
            Err(e) => Delivery::Unreachable(e.to_string()),
        }
    }
}
