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

use super::coordinator::{Event, Reply};
use super::report::wake_body;
use super::store::TaskRecord;
use crate::proto::bashwire::Request as BashRequest;
use crate::proto::cmd::{ReportTasks, Wake};
use crate::proto::limits::{MAX_TASK_CMD_CHARS, OVER_QUOTA};
use crate::proto::{ClientError, Command, Dial, RunningTask};
use crossbeam_channel::{after, never, select, Receiver, Sender};
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

/// Where wakes go and what to tell when one got there.
pub struct Waker {
    /// The daemon's way to the broker: its credential under isolated `hive
    /// up`, else the agent's socket.
    pub broker: Dial,
    pub tasks_dir: PathBuf,
    /// The coordinator's channel.
    pub events: Sender<Event>,
    /// A task started in the background: report the running tasks.
    pub report: Receiver<()>,
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
    /// Runs until `queue` is disconnected; wakes still queued then stay pending
    /// on disk, and the broker is told no task runs any more.
    pub fn run(self, queue: Receiver<TaskRecord>) {
        let mut pending: VecDeque<TaskRecord> = VecDeque::new();
        let mut report_due = true;
        let mut reports = self.report.clone();
        let mut backoff = FIRST_BACKOFF;
        // The broker refuses the first wake over the agent's quota (logged
        // once while it does).
        let mut over_quota = false;
        loop {
            while let Ok(rec) = queue.try_recv() {
                pending.push_back(rec);
            }
            while reports.try_recv().is_ok() {
                report_due = true;
            }
            let mut unreachable = None;
            let mut refused_over_quota = false;
            while let Some(rec) = pending.front() {
                match self.deliver(rec) {
                    Delivery::Delivered => {
                        log::info!("wake from bash-task-{} delivered", rec.id);
                        let _ = self.events.send(Event::WakeDelivered(rec.id.clone()));
                        pending.pop_front();
                        report_due = true;
                        backoff = FIRST_BACKOFF;
                        if std::mem::take(&mut over_quota) {
                            log::info!("the broker takes the wakes again");
                        }
                    }
                    Delivery::Refused(e) => {
                        log::error!("the broker refused the wake of bash-task-{}: {e}", rec.id);
                        let _ = self.events.send(Event::WakeDelivered(rec.id.clone()));
                        pending.pop_front();
                    }
                    Delivery::OverQuota(e) => {
                        let level = if over_quota {
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
                        over_quota = true;
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
            if (unreachable.is_none() || refused_over_quota) && report_due {
                match self.running().map(|tasks| self.report(tasks)) {
                    None => report_due = false,
                    Some(Delivery::Delivered) => report_due = false,
                    Some(Delivery::Refused(e) | Delivery::OverQuota(e)) => {
                        log::error!("the broker refused the running tasks: {e}");
                        report_due = false;
                    }
                    Some(Delivery::Unreachable(e)) => unreachable = Some(e),
                }
            }
            if let Some(e) = unreachable {
                let max = if refused_over_quota {
                    MAX_QUOTA_BACKOFF
                } else {
                    MAX_BACKOFF
                };
                if !refused_over_quota {
                    let level = if backoff == FIRST_BACKOFF {
                        log::Level::Warn
                    } else {
                        log::Level::Debug
                    };
                    log::log!(
                        level,
                        "cannot reach the broker yet ({} wake(s) queued), retrying with backoff \
                         up to {MAX_BACKOFF:?}: {e}",
                        pending.len()
                    );
                }
                select! {
                    recv(queue) -> rec => match rec {
                        Ok(rec) => pending.push_back(rec),
                        Err(_) => return self.stop(),
                    },
                    recv(reports) -> t => match t {
                        Ok(()) => report_due = true,
                        Err(_) => reports = never(),
                    },
                    recv(after(backoff)) -> _ => backoff = (backoff * 2).min(max),
                }
                continue;
            }
            select! {
                recv(queue) -> rec => match rec {
                    Ok(rec) => pending.push_back(rec),
                    Err(_) => return self.stop(),
                },
                recv(reports) -> t => match t {
                    Ok(()) => report_due = true,
                    Err(_) => reports = never(),
                },
            }
        }
    }

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
        self.events.send(call).ok()?;
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
