//! The coordinator thread: the one owner of every task's state, the task
//! processes included (each a `sys::ProcessGroup`). Connection threads send it
//! requests, waiter threads (one per running task, blocked until its shell
//! exits, which they leave for the coordinator to reap) send it exits, and the
//! wake thread tells it which wakes got through; its single `select!` also fires
//! on the nearest deadline — a task's timeout or the end of a caller's inline
//! wait. It starts processes, kills and reaps process groups, persists records
//! and decides which finished tasks owe their agent a wake.
//!
//! Its thread (`bash-tasks`) runs only while it has work: [`Tasks::send`]
//! queues an event and starts it when none runs (a [`crate::demand::Slot`]
//! keeps the coordinator between its threads), and with no task running, no
//! caller waiting and nothing queued it ends.

use super::proto::{TaskStatus, DEFAULT_RUN_WAIT_SECS, MAX_WAIT_SECS};
use super::spawn::{self, Launch};
use super::store::{now_ms, Store, StoreError, TaskRecord};
use crate::agent_proc::StartFault;
use crate::demand::Slot;
use crate::proto::bashwire::Request;
use crate::sys::ProcessGroup;
use crossbeam_channel::{at, never, select, unbounded, Receiver, Sender};
use std::collections::HashMap;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

/// What the daemon does once the coordinator retired it: tell its owner
/// (a channel, and under `hive bash-daemon` the wait for signals too).
pub type Retired = Box<dyn FnOnce() + Send>;
/// How long shutdown waits for killed tasks to be reaped.
const REAP_GRACE: Duration = Duration::from_secs(3);

/// Where finished tasks' wakes go: the wake thread's handle
/// (`waker::Wakes`, which implements it there, since the wake thread sends
/// this coordinator events).
pub trait WakeSink: Send {
    /// Queues `rec`'s wake without starting the wake thread.
    fn queue(&self, rec: TaskRecord);
    /// Queues `rec`'s wake and starts the wake thread.
    fn wake(&self, rec: TaskRecord);
    /// The daemon stops: returns once the wake thread is done.
    fn stop(&self);
}

/// The coordinator thread's stack: it handles requests already parsed (on
/// the connection threads), starts processes and writes records.
pub const STACK: usize = 256 * 1024;

/// The way to the coordinator: its channel, and its thread, started by an
/// event when none runs.
#[derive(Clone)]
pub struct Tasks {
    tx: Sender<Event>,
    rx: Receiver<Event>,
    slot: Slot<Coordinator>,
}

impl Tasks {
    /// A coordinator's handle, with no coordinator yet ([`Tasks::serve`]
    /// gives it one).
    pub fn new() -> Tasks {
        let (tx, rx) = unbounded();
        Tasks {
            tx,
            rx,
            slot: Slot::vacant(),
        }
    }

    /// Hands the coordinator over; events sent from now on start it.
    pub fn serve(&self, c: Coordinator) {
        self.slot.put(c);
        if !self.rx.is_empty() {
            self.kick();
        }
    }

    fn kick(&self) -> bool {
        let rx = self.rx.clone();
        match self
            .slot
            .wake("bash-tasks", STACK, move |c, slot| c.run(rx, slot))
        {
            Ok(running) => running,
            Err(e) => {
                log::error!("cannot start the task coordinator thread: {e}");
                false
            }
        }
    }

    /// Sends `event`, starting the coordinator's thread when none runs; an
    /// error once the coordinator has stopped (or its thread cannot start),
    /// and then the event is not handled.
    pub fn send(&self, event: Event) -> Result<(), ()> {
        self.tx.send(event).map_err(|_| ())?;
        if self.kick() {
            Ok(())
        } else {
            Err(())
        }
    }
}

impl Default for Tasks {
    fn default() -> Tasks {
        Tasks::new()
    }
}

/// Everything the coordinator reacts to.
pub enum Event {
    /// A request from a connection, answered on `reply`.
    Call { req: Request, reply: Sender<Reply> },
    /// The inline answer to `run` for task `id` did not reach its caller, so the
    /// task owes a wake after all.
    InlineLost(String),
    /// Task `id`'s shell has exited (the coordinator reaps it).
    Exited(String),
    /// The wake of task `id` reached the broker (or was refused for good).
    WakeDelivered(String),
    /// Kill the running tasks, record them, and return.
    Shutdown,
}

/// The answer to one [`Event::Call`].
#[derive(Debug)]
pub enum Reply {
    /// `run` and `status`: the record now; `inline` when this `run` answer is the
    /// task's result.
    Task { record: TaskRecord, inline: bool },
    /// `list`: the tasks still pending or running.
    Tasks(Vec<TaskRecord>),
    /// `retire`: whether the daemon is exiting, and else how many tasks run.
    Retire { retired: bool, running: usize },
    /// A request that cannot be served, with a message for the model.
    Error(String),
}

/// Why a running task's group was killed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kill {
    Timeout,
    Shutdown,
}

/// A task whose shell has not been reaped yet.
struct Running {
    group: ProcessGroup,
    timeout_at: Option<Instant>,
    killed: Option<Kill>,
}

/// A caller waiting for a task to end.
struct Waiter {
    id: String,
    deadline: Instant,
    /// A `run` call: its answer, when the task ended, is the task's result.
    run: bool,
    reply: Sender<Reply>,
}

/// What the coordinator needs besides its state.
pub struct Coordinator {
    store: Store,
    cwd: PathBuf,
    bash_env: Option<PathBuf>,
    tasks: HashMap<String, TaskRecord>,
    running: HashMap<String, Running>,
    waiters: Vec<Waiter>,
    events: Sender<Event>,
    /// The wake thread's handle.
    wakes: Box<dyn WakeSink>,
    /// Told when the daemon retires (`hive bash-daemon` only): `None` refuses
    /// `retire`.
    retire: Option<Retired>,
    /// It answered `retire` yes: stop after this event.
    retired: bool,
    /// Dropped once the coordinator has stopped (its tasks killed and
    /// recorded).
    stopped: Option<Sender<()>>,
}

impl Coordinator {
    /// Takes over `records`: tasks that were pending or running when the last
    /// daemon stopped are killed if still alive and marked interrupted, and every
    /// wake still pending is queued again.
    pub fn new(
        store: Store,
        records: Vec<TaskRecord>,
        cwd: PathBuf,
        bash_env: Option<PathBuf>,
        tasks: &Tasks,
        wakes: Box<dyn WakeSink>,
        stopped: Sender<()>,
    ) -> Coordinator {
        let mut c = Coordinator {
            store,
            cwd,
            bash_env,
            tasks: HashMap::new(),
            running: HashMap::new(),
            waiters: Vec::new(),
            events: tasks.tx.clone(),
            wakes,
            retire: None,
            retired: false,
            stopped: Some(stopped),
        };
        let boot = spawn::boot_id();
        for mut rec in records {
            if !rec.status.is_finished() {
                if let Some(pgid) = rec.pgid {
                    if rec.boot_id.is_some() && rec.boot_id == boot {
                        spawn::kill_stale_group(pgid, rec.leader_start);
                    }
                }
                log::warn!("task {} was still running; marking it interrupted", rec.id);
                rec.status = TaskStatus::Interrupted;
                rec.ended_at_ms = Some(now_ms());
                rec.wake_pending = true;
                rec.returned_inline = false;
                c.save(&rec);
            }
            if rec.wake_pending {
                c.wakes.queue(rec.clone());
            }
            c.tasks.insert(rec.id.clone(), rec);
        }
        c
    }

    /// Lets this daemon retire when asked and idle; `retired` is called once
    /// it did (on the coordinator's thread).
    pub fn retirable(mut self, retired: Retired) -> Coordinator {
        self.retire = Some(retired);
        self
    }

    /// Serves events until [`Event::Shutdown`] (or it retired), then stops
    /// every running task; with nothing to do meanwhile (no task running, no
    /// caller waiting, nothing queued) it goes back in `slot` and the thread
    /// ends.
    fn run(mut self, events: Receiver<Event>, slot: Slot<Coordinator>) {
        while !self.retired {
            if self.running.is_empty() && self.waiters.is_empty() && events.is_empty() {
                match slot.park(self, || events.is_empty()) {
                    None => return,
                    Some(c) => self = c,
                }
            }
            let timer = self.next_deadline().map_or_else(never, at);
            select! {
                recv(events) -> event => match event {
                    Ok(Event::Shutdown) | Err(_) => break,
                    Ok(event) => self.on_event(event),
                },
                recv(timer) -> _ => self.on_deadlines(Instant::now()),
            }
        }
        if self.retired {
            if let Some(told) = self.retire.take() {
                told();
            }
        }
        slot.close();
        self.shutdown(&events);
        // Whatever came meanwhile has no one to answer it.
        while events.try_recv().is_ok() {}
    }

    fn next_deadline(&self) -> Option<Instant> {
        let timeouts = self
            .running
            .values()
            .filter(|r| r.killed.is_none())
            .filter_map(|r| r.timeout_at);
        let waits = self.waiters.iter().map(|w| w.deadline);
        timeouts.chain(waits).min()
    }

    fn save(&self, rec: &TaskRecord) {
        if let Err(e) = self.store.save(rec) {
            log::error!("task {}: {e}", rec.id);
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::Call { req, reply } => self.on_call(req, reply),
            Event::InlineLost(id) => {
                let Some(rec) = self.tasks.get_mut(&id) else {
                    return;
                };
                if rec.returned_inline {
                    log::info!("the inline result of task {id} was not delivered; waking instead");
                    rec.returned_inline = false;
                    rec.wake_pending = true;
                    let rec = rec.clone();
                    self.save(&rec);
                    self.wakes.wake(rec);
                }
            }
            Event::Exited(id) => self.on_exited(&id),
            Event::WakeDelivered(id) => {
                if let Some(rec) = self.tasks.get_mut(&id) {
                    rec.wake_pending = false;
                    let rec = rec.clone();
                    self.save(&rec);
                }
            }
            Event::Shutdown => {}
        }
    }

    fn on_call(&mut self, req: Request, reply: Sender<Reply>) {
        match req {
            Request::Run {
                cmd,
                timeout_secs,
                wait_seconds,
            } => {
                let wait = wait_seconds.unwrap_or(DEFAULT_RUN_WAIT_SECS);
                match self.start(cmd, timeout_secs) {
                    Ok(id) => self.answer_or_wait(id, wait, true, reply),
                    Err(e) => {
                        let _ = reply.send(Reply::Error(e));
                    }
                }
            }
            Request::Status { id, wait_seconds } => {
                if self.tasks.contains_key(&id) {
                    self.answer_or_wait(id, wait_seconds.unwrap_or(0), false, reply);
                } else {
                    let _ = reply.send(Reply::Error(unknown_id(&id)));
                }
            }
            Request::List {} => {
                let mut live: Vec<TaskRecord> = self
                    .tasks
                    .values()
                    .filter(|r| !r.status.is_finished())
                    .cloned()
                    .collect();
                live.sort_by_key(|r| r.id.parse::<u64>().unwrap_or(0));
                let _ = reply.send(Reply::Tasks(live));
            }
            Request::Retire {} => {
                if self.retire.is_none() {
                    let _ = reply.send(Reply::Error(
                        "this bash task daemon runs inside hive serve and does not retire".into(),
                    ));
                    return;
                }
                let running = self
                    .tasks
                    .values()
                    .filter(|r| !r.status.is_finished())
                    .count();
                // Idle: no task and nobody waiting on one. From here on the
                // coordinator takes no request (it stops after this event).
                let idle = running == 0 && self.waiters.is_empty();
                if idle {
                    log::info!("no task runs: retiring, so the daemon can start anew");
                    self.retired = true;
                }
                let _ = reply.send(Reply::Retire {
                    retired: idle,
                    running,
                });
            }
        }
    }

    /// Answers now when the task has ended or `wait_secs` is 0, else parks the
    /// caller until the task ends or the (capped) wait is over.
    fn answer_or_wait(&mut self, id: String, wait_secs: u64, run: bool, reply: Sender<Reply>) {
        let Some(rec) = self.tasks.get_mut(&id) else {
            return;
        };
        if rec.status.is_finished() {
            // A `run` whose task is already over (it failed to start) carries its
            // result, so it owes no wake.
            let inline = run;
            if run && !rec.returned_inline {
                rec.returned_inline = true;
                rec.wake_pending = false;
                let rec = rec.clone();
                self.save(&rec);
            }
            let record = self.tasks[&id].clone();
            let _ = reply.send(Reply::Task { record, inline });
            return;
        }
        let wait = Duration::from_secs(wait_secs.min(MAX_WAIT_SECS));
        if wait.is_zero() {
            let _ = reply.send(Reply::Task {
                record: rec.clone(),
                inline: false,
            });
            return;
        }
        self.waiters.push(Waiter {
            id,
            deadline: Instant::now() + wait,
            run,
            reply,
        });
    }

    /// Records and starts a task; returns its id. A task that cannot be started
    /// still gets an id and a record saying why; when the reason is a passing
    /// shortage (descriptors, memory, processes) the caller gets an error to try
    /// again, and no wake is owed.
    fn start(&mut self, cmd: String, timeout_secs: Option<u64>) -> Result<String, String> {
        if cmd.trim().is_empty() {
            return Err("argument \"cmd\" is empty; give a shell command to run".into());
        }
        let id = self.store.allocate_id().map_err(|e| not_recorded(&e))?;
        let mut rec = TaskRecord::new(id.clone(), cmd, timeout_secs);
        self.store.save(&rec).map_err(|e| not_recorded(&e))?;
        let launch = Launch {
            cwd: &self.cwd,
            bash_env: self.bash_env.as_deref(),
        };
        let (out, err) = (self.store.out_path(&id), self.store.err_path(&id));
        match spawn::spawn(&launch, &rec.cmd, &out, &err) {
            Ok((group, shell)) => {
                let pgid = group.id() as i32;
                rec.status = TaskStatus::Running;
                rec.pgid = Some(pgid);
                rec.boot_id = spawn::boot_id();
                rec.leader_start = spawn::start_time(pgid);
                rec.shell = shell.into();
                self.save(&rec);
                log::info!("task {id} started ({shell}, pgid {pgid}): {}", rec.cmd);
                self.running.insert(
                    id.clone(),
                    Running {
                        group,
                        timeout_at: timeout_secs.map(|s| Instant::now() + Duration::from_secs(s)),
                        killed: None,
                    },
                );
                self.tasks.insert(id.clone(), rec);
                self.watch(&id);
            }
            Err(e) if e.fault() == StartFault::Resources => {
                log::warn!("task {id} not started: {e}");
                rec.status = TaskStatus::Done;
                rec.error = Some(format!("not started: {e}"));
                rec.ended_at_ms = Some(now_ms());
                rec.returned_inline = true;
                self.save(&rec);
                self.tasks.insert(id, rec);
                return Err(format!(
                    "the task was not started: {e}. Nothing ran: {SHORTAGE}"
                ));
            }
            Err(e) => {
                log::warn!("task {id} failed to start: {e}");
                rec.status = TaskStatus::Done;
                rec.error = Some(format!("failed to start: {e}"));
                rec.ended_at_ms = Some(now_ms());
                rec.wake_pending = true;
                self.save(&rec);
                self.tasks.insert(id.clone(), rec);
            }
        }
        Ok(id)
    }

    /// Starts the waiter thread of a running task (`bash-task-ID`), which
    /// reports when its shell exits.
    fn watch(&mut self, id: &str) {
        let Some(r) = self.running.get(id) else {
            return;
        };
        let events = self.events.clone();
        let task = id.to_string();
        let spawned = r.group.on_exit(format!("bash-task-{id}"), move || {
            let _ = events.send(Event::Exited(task));
        });
        if let Err(e) = spawned {
            // Unwatched, the task could never end: kill it now.
            log::error!("cannot start a waiter thread for task {id}: {e}");
            if let Some(r) = self.running.remove(id) {
                drop(r.group); // killed and reaped
                let err = io::Error::other(format!("cannot watch the task: {e}"));
                self.finish(id, r.killed, Err(err));
            }
        }
    }

    /// Reaps task `id`'s shell once it has exited. Background processes it
    /// left in its group keep running when it ended by itself; a killed task's
    /// group is killed whole.
    fn on_exited(&mut self, id: &str) {
        let Some(run) = self.running.get_mut(id) else {
            return;
        };
        let status = match run.group.try_wait() {
            Ok(None) => return, // not this task's exit after all
            Ok(Some(st)) => Ok(st),
            Err(e) => Err(e),
        };
        let Some(run) = self.running.remove(id) else {
            return;
        };
        if run.killed.is_none() {
            let _ = run.group.wait_leaving_rest();
        } else {
            drop(run.group);
        }
        self.finish(id, run.killed, status)
    }

    /// Records how task `id` ended, answers its waiters and decides its wake.
    fn finish(&mut self, id: &str, killed: Option<Kill>, status: io::Result<ExitStatus>) {
        let Some(rec) = self.tasks.get_mut(id) else {
            return;
        };
        rec.ended_at_ms = Some(now_ms());
        rec.status = match killed {
            Some(Kill::Timeout) => TaskStatus::TimedOut,
            Some(Kill::Shutdown) => TaskStatus::Interrupted,
            None => TaskStatus::Done,
        };
        match status {
            Ok(st) => {
                rec.exit_code = st.code();
                rec.signal = st.signal();
            }
            Err(e) => rec.error = Some(format!("lost track of the process: {e}")),
        }
        log::info!(
            "task {id} ended: {} (exit code {:?}, signal {:?})",
            rec.status.as_str(),
            rec.exit_code,
            rec.signal
        );
        let record = rec.clone();
        let mut inline = false;
        let mut i = 0;
        while i < self.waiters.len() {
            if self.waiters[i].id != id {
                i += 1;
                continue;
            }
            let w = self.waiters.swap_remove(i);
            let answer = Reply::Task {
                record: record.clone(),
                inline: w.run,
            };
            if w.reply.send(answer).is_ok() && w.run {
                inline = true;
            }
        }
        let mut rec = record;
        rec.returned_inline = inline;
        rec.wake_pending = !inline;
        self.save(&rec);
        self.tasks.insert(id.to_string(), rec.clone());
        if rec.wake_pending {
            self.wakes.wake(rec);
        }
    }

    fn on_deadlines(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.waiters.len() {
            if self.waiters[i].deadline > now {
                i += 1;
                continue;
            }
            let w = self.waiters.swap_remove(i);
            if let Some(rec) = self.tasks.get(&w.id) {
                let _ = w.reply.send(Reply::Task {
                    record: rec.clone(),
                    inline: false,
                });
            }
        }
        for (id, r) in self.running.iter_mut() {
            if r.killed.is_none() && r.timeout_at.is_some_and(|t| t <= now) {
                log::info!(
                    "task {id} timed out; killing process group {}",
                    r.group.id()
                );
                r.group.kill();
                r.killed = Some(Kill::Timeout);
            }
        }
    }

    /// Kills every running task's group, waits a little for the reaps, and
    /// records the tasks interrupted; their wakes go out now if the broker is
    /// reachable, or from the next daemon.
    fn shutdown(mut self, events: &Receiver<Event>) {
        for (id, r) in self.running.iter_mut() {
            log::info!(
                "stopping: killing task {id} (process group {})",
                r.group.id()
            );
            r.group.kill();
            r.killed = Some(Kill::Shutdown);
        }
        let end = Instant::now() + REAP_GRACE;
        while !self.running.is_empty() {
            match events.recv_deadline(end) {
                Ok(Event::Exited(id)) => self.on_exited(&id),
                Ok(Event::Call { reply, .. }) => {
                    let _ = reply.send(Reply::Error(STOPPING.into()));
                }
                Ok(event) => self.on_event(event),
                Err(_) => break,
            }
        }
        let stuck: Vec<String> = self.running.keys().cloned().collect();
        let mut unreaped = Vec::new();
        for id in stuck {
            log::warn!("task {id} was not reaped in time; recording it interrupted");
            let Some(run) = self.running.remove(&id) else {
                continue;
            };
            // Its group is reaped on a thread of its own (below): a shell stuck
            // in the kernel must not hold up the shutdown.
            unreaped.push(run.group);
            let err = io::Error::other("not reaped before the daemon stopped");
            self.finish(&id, run.killed, Err(err));
        }
        if !unreaped.is_empty() {
            let _ = std::thread::Builder::new()
                .name("bash-reaper".into())
                .spawn(move || drop(unreaped));
        }
        for w in self.waiters.drain(..) {
            let _ = w.reply.send(Reply::Error(STOPPING.into()));
        }
        // The wake thread tries what is queued once more and ends when its queue
        // is gone; wakes it delivered meanwhile are recorded, the rest stay
        // pending for the next daemon.
        let Coordinator {
            store,
            mut tasks,
            wakes,
            stopped,
            ..
        } = self;
        wakes.stop();
        for event in events.try_iter() {
            if let Event::WakeDelivered(id) = event {
                if let Some(rec) = tasks.get_mut(&id) {
                    rec.wake_pending = false;
                    if let Err(e) = store.save(rec) {
                        log::error!("task {id}: {e}");
                    }
                }
            }
        }
        drop(stopped);
    }
}

const SHORTAGE: &str = "the host is short of file descriptors, memory or processes \
     for the moment; run it again in a little while";

/// The error for a task that could not even be recorded.
fn not_recorded(e: &StoreError) -> String {
    match StartFault::of(&e.source) {
        StartFault::Resources => format!("cannot record a new task ({e}). Nothing ran: {SHORTAGE}"),
        StartFault::Setup => format!("cannot record a new task: {e}"),
    }
}

const STOPPING: &str = "the bash task daemon is stopping; try again once it is back";

fn unknown_id(id: &str) -> String {
    format!(
        "no task with id \"{id}\": ids are the numbers returned by run \
         (\"task started: id=7\"); check the id and try again"
    )
}
