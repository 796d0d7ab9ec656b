//! The wake thread: the daemon's one route to the agent's broker socket. It
//! delivers each finished task's completion wake as a durable `wake` from
//! `bash-task-<id>`, in order, and reports the tasks still running
//! (`report_tasks`, a snapshot it asks the coordinator for) at start, after a
//! task started in the background and after each wake, so the broker can list
//! them in `get_loose_ends`. Durable wakes, so a wake the broker accepted
//! survives a broker restart and a harness killed mid-turn gets it again. When
//! the broker cannot be reached the work stays queued and the thread retries
//! after a backoff that doubles up to [`MAX_BACKOFF`]; with nothing queued it
//! just blocks on its channels. A wake the broker refuses because the agent
//! is over its storage quota or its limit of a minute (`OVER_QUOTA`, the
//! fleet file's `retention`) is kept the same way, tried again after a
//! backoff up to [`MAX_QUOTA_BACKOFF`] (the broker tells the operator once).
//! Any other refusal is final. A delivered wake is reported back to the
//! coordinator, which clears the task's persisted `wake_pending` flag, so a
//! wake still pending when the daemon stops is sent again by the next daemon.
//!
//! The thread (`bash-wakes`) runs only while it has work: [`Wakes`] queues a
//! wake or a report and starts it when none runs (a [`crate::demand::Slot`]
//! keeps what is queued and the backoff between its threads); with nothing
//! queued and nothing to retry it ends.

use super::coordinator::{Event, Reply, Tasks, WakeSink};
use super::report::wake_body;
use super::store::TaskRecord;
use crate::demand::Slot;
use crate::proto::bashwire::Request as BashRequest;
use crate::proto::cmd::{ReportTasks, Wake};
use crate::proto::limits::{MAX_TASK_CMD_CHARS, OVER_QUOTA};
use crate::proto::{ClientError, Command, Dial, RunningTask};
use crossbeam_channel::{after, select, unbounded, Receiver, Sender};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// Longest pause between two attempts while the broker is unreachable.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Longest pause between two attempts while the agent is over its quota:
/// room comes back as the broker prunes, or within a minute for the limit
/// of a minute.
pub const MAX_QUOTA_BACKOFF: Duration = Duration::from_secs(60);
/// How long one delivery may wait for the broker's answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How long the coordinator may take to list the running tasks (it does not
/// answer while it shuts down).
const LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// The wake thread's stack: it writes requests and reads the broker's
/// one-line answers (parsed with serde_json's recursion limit; a test reads
/// an answer nested to it on a thread of this size).
pub const STACK: usize = 256 * 1024;

/// Where wakes go and what to tell when one got there.
pub struct Waker {
    /// The daemon's way to the broker: its credential under isolated `hive
    /// up`, else the agent's socket.
    pub broker: Dial,
    pub tasks_dir: PathBuf,
    /// The coordinator.
    pub tasks: Tasks,
}

/// What the wake thread is sent.
enum ToWaker {
    /// A finished task owes its agent this wake.
    Wake(TaskRecord),
    /// A task started in the background: report the running tasks.
    Report,
    /// The daemon stops: tell the broker no task runs, then drop `done`.
    Stop(Sender<()>),
}

/// What the wake thread keeps between its threads.
struct Work {
    waker: Waker,
    pending: VecDeque<TaskRecord>,
    report_due: bool,
    backoff: Duration,
    /// The broker refuses wakes over the agent's quota (logged once while
    /// it does).
    over_quota: bool,
    /// The daemon stops once this is dropped.
    stop: Option<Sender<()>>,
}

/// The way to the wake thread, which runs while it has work.
#[derive(Clone)]
pub struct Wakes {
    tx: Sender<ToWaker>,
    rx: Receiver<ToWaker>,
    slot: Slot<Work>,
}

impl Wakes {
    /// The wake thread's handle; nothing runs until [`Wakes::kick`] or the
    /// first wake. Its first run reports the running tasks.
    pub fn new(waker: Waker) -> Wakes {
        let (tx, rx) = unbounded();
        Wakes {
            tx,
            rx,
            slot: Slot::new(Work {
                waker,
                pending: VecDeque::new(),
                report_due: true,
                backoff: FIRST_BACKOFF,
                over_quota: false,
                stop: None,
            }),
        }
    }

    /// Starts the thread unless it runs.
    pub fn kick(&self) -> bool {
        let rx = self.rx.clone();
        match self
            .slot
            .wake("bash-wakes", STACK, move |w, slot| run(w, rx, slot))
        {
            Ok(running) => running,
            Err(e) => {
                log::error!("cannot start the wake thread: {e}; what it has to do stays queued");
                false
            }
        }
    }

    /// Has the running tasks reported.
    pub fn report(&self) {
        let _ = self.tx.send(ToWaker::Report);
        self.kick();
    }
}

impl WakeSink for Wakes {
    /// Queues `rec`'s wake without starting the thread (the daemon's start,
    /// before the coordinator can answer; [`Wakes::kick`] follows).
    fn queue(&self, rec: TaskRecord) {
        let _ = self.tx.send(ToWaker::Wake(rec));
    }

    /// Queues `rec`'s wake and starts the thread.
    fn wake(&self, rec: TaskRecord) {
        self.queue(rec);
        self.kick();
    }

    /// The daemon stops (its tasks were killed): tries what is queued once
    /// more, tells the broker no task runs and returns once done; wakes not
    /// delivered stay pending on disk for the next daemon.
    fn stop(&self) {
        let (done_tx, done) = crossbeam_channel::bounded::<()>(0);
        let _ = self.tx.send(ToWaker::Stop(done_tx));
        if self.kick() {
            let _ = done.recv();
        }
    }
}

/// The wake thread: works until nothing is left to do (the state goes back
/// in the slot) or the daemon stops.
fn run(mut work: Work, rx: Receiver<ToWaker>, slot: Slot<Work>) {
    loop {
        work.run(&rx);
        if work.stop.is_some() {
            slot.close();
            return;
        }
        match slot.park(work, || rx.is_empty()) {
            None => return,
            Some(w) => work = w,
        }
    }
}

impl Work {
    fn take(&mut self, m: ToWaker) {
        match m {
            ToWaker::Wake(rec) => self.pending.push_back(rec),
            ToWaker::Report => self.report_due = true,
            ToWaker::Stop(done) => self.stop = Some(done),
        }
    }

    /// Delivers what is queued, retrying with backoff while the broker is
    /// unreachable, until nothing is left to do or the daemon stops (then
    /// what is queued gets one more try and the broker hears that no task
    /// runs; wakes not delivered stay pending on disk).
    fn run(&mut self, queue: &Receiver<ToWaker>) {
        loop {
            while let Ok(m) = queue.try_recv() {
                self.take(m);
            }
            if self.stop.is_some() {
                for rec in std::mem::take(&mut self.pending) {
                    if let Delivery::Delivered | Delivery::Refused(_) = self.waker.deliver(&rec) {
                        let _ = self.waker.tasks.send(Event::WakeDelivered(rec.id.clone()));
                    }
                }
                self.waker.stop();
                return;
            }
            let mut unreachable = None;
            let mut refused_over_quota = false;
            while let Some(rec) = self.pending.front() {
                match self.waker.deliver(rec) {
                    Delivery::Delivered => {
                        log::info!("wake from bash-task-{} delivered", rec.id);
                        let _ = self.waker.tasks.send(Event::WakeDelivered(rec.id.clone()));
                        self.pending.pop_front();
                        self.report_due = true;
                        self.backoff = FIRST_BACKOFF;
                        if std::mem::take(&mut self.over_quota) {
                            log::info!("the broker takes the wakes again");
                        }
                    }
                    Delivery::Refused(e) => {
                        log::error!("the broker refused the wake of bash-task-{}: {e}", rec.id);
                        let _ = self.waker.tasks.send(Event::WakeDelivered(rec.id.clone()));
                        self.pending.pop_front();
                    }
                    Delivery::OverQuota(e) => {
                        let level = if self.over_quota {
                            log::Level::Debug
                        } else {
                            log::Level::Warn
                        };
                        log::log!(
                            level,
                            "the wake of bash-task-{} waits: {e}; it is kept and tried again with \
                             backoff up to {MAX_QUOTA_BACKOFF:?}",
                            rec.id
                        );
                        self.over_quota = true;
                        refused_over_quota = true;
                        unreachable = Some(e);
                        break;
                    }
                    Delivery::Unreachable(e) => {
                        unreachable = Some(e);
                        break;
                    }
                }
            }
            if (unreachable.is_none() || refused_over_quota) && self.report_due {
                let w = &self.waker;
                match w.running().map(|tasks| w.report(tasks)) {
                    None => self.report_due = false,
                    Some(Delivery::Delivered) => self.report_due = false,
                    Some(Delivery::Refused(e) | Delivery::OverQuota(e)) => {
                        log::error!("the broker refused the running tasks: {e}");
                        self.report_due = false;
                    }
                    Some(Delivery::Unreachable(e)) => unreachable = Some(e),
                }
            }
            let Some(e) = unreachable else {
                if self.pending.is_empty() && !self.report_due && queue.is_empty() {
                    return;
                }
                continue;
            };
            let max = if refused_over_quota {
                MAX_QUOTA_BACKOFF
            } else {
                MAX_BACKOFF
            };
            if !refused_over_quota {
                let level = if self.backoff == FIRST_BACKOFF {
                    log::Level::Warn
                } else {
                    log::Level::Debug
                };
                log::log!(
                    level,
                    "cannot reach the broker yet ({} wake(s) queued), retrying with backoff \
                     up to {MAX_BACKOFF:?}: {e}",
                    self.pending.len()
                );
            }
            select! {
                recv(queue) -> m => {
                    if let Ok(m) = m {
                        self.take(m);
                    }
                }
                recv(after(self.backoff)) -> _ => self.backoff = (self.backoff * 2).min(max),
            }
        }
    }
}

/// What one delivery attempt came to.
enum Delivery {
    Delivered,
    /// The broker is unreachable: keep the work and retry later.
    Unreachable(String),
    /// The broker refused it over the agent's quota: keep it and retry
    /// later.
    OverQuota(String),
    /// The broker refused it: retrying would not help.
    Refused(String),
}

impl Waker {
    /// The daemon is stopping: its tasks were killed, so none runs any more.
    fn stop(&self) {
        if let Delivery::Unreachable(e) | Delivery::Refused(e) | Delivery::OverQuota(e) =
            self.report(Vec::new())
        {
            log::debug!("could not tell the broker that no task runs: {e}");
        }
    }

    /// The tasks still pending or running, as the coordinator sees them now;
    /// None when it does not answer (it is stopping).
    fn running(&self) -> Option<Vec<RunningTask>> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let call = Event::Call {
            req: BashRequest::List {},
            reply: tx,
        };
        self.tasks.send(call).ok()?;
        match rx.recv_timeout(LIST_TIMEOUT).ok()? {
            Reply::Tasks(records) => Some(
                records
                    .iter()
                    .map(|r| {
                        let s = r.summary();
                        RunningTask {
                            id: s.id,
                            cmd: s.cmd.chars().take(MAX_TASK_CMD_CHARS).collect(),
                            started_at: s.started_at,
                            timeout_secs: s.timeout_secs,
                        }
                    })
                    .collect(),
            ),
            _ => None,
        }
    }

    fn report(&self, tasks: Vec<RunningTask>) -> Delivery {
        self.call(&ReportTasks { tasks })
    }

    fn deliver(&self, rec: &TaskRecord) -> Delivery {
        self.call(&Wake {
            from: format!("bash-task-{}", rec.id),
            body: wake_body(rec, &self.tasks_dir),
            transient: false,
            to: None,
            traceparent: None,
        })
    }

    fn call<C: Command>(&self, cmd: &C) -> Delivery {
        let mut client = match self.broker.connect() {
            Ok(c) => c,
            Err(e) => return Delivery::Unreachable(e.to_string()),
        };
        if let Err(e) = client.set_read_timeout(Some(CALL_TIMEOUT)) {
            return Delivery::Unreachable(e.to_string());
        }
        match client.call(cmd) {
            Ok(_) => Delivery::Delivered,
            Err(ClientError::Refused(e)) if e.starts_with(OVER_QUOTA) => Delivery::OverQuota(e),
            Err(ClientError::Refused(e)) => Delivery::Refused(e),
            Err(e) => Delivery::Unreachable(e.to_string()),
        }
    }
}
