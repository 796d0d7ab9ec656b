//! One supervised child of `hive up`, the machinery its three supervisor
//! threads share (the agents' `supervisor.rs`, the bash-task daemons'
//! `bashd.rs`, the Matrix bridge's `bridge.rs`): a plain struct, not a thread,
//! that owns the child's [`Phase`] (running, stopping, stopped, waiting out a
//! restart backoff), the restart backoff itself (capped doubling, started over
//! after a healthy run), and the stop ladder (SIGTERM to the leader, the grace,
//! SIGKILL to the process group, the reaping). [`log_output`] takes a new
//! child's output into its rotated log; [`credential`] makes an isolated
//! agent's harness or bash-task daemon its broker credential. What is not a
//! child's — which command starts it, when it should run, what an exit means
//! to the hive — stays with the owner thread, with its one `select!`, its
//! channels and its state.
//!
//! **One thread for every child** (issue 42): `sup-children` waits for the
//! exits of every child of `hive up` (a pidfd each, in one `poll(2)` with a
//! wake pipe for children registered since) and reads every child's stdout
//! and stderr (non-blocking, whole lines into its [`LogFile`], a pipe at its
//! end closed), so `hive up` has the same threads with 1 agent as with 1000.
//! It never reaps: an exit goes as an [`Exited`] on the owner's channel and
//! the owner reaps ([`Supervised::on_exit`]), so no signal of the owner's
//! ever reaches a recycled pid. Where the kernel gives no pidfd (before 5.3,
//! or a seccomp filter refusing it) a child's exit is watched by a thread of
//! its own (`wait-NAME`, `waitid(WNOWAIT)`), as before.
//!
//! **The spawn seam.** Everything here is pid-based: [`spawn`] is the one
//! place a `Command` child is started, and returns a [`Spawned`] — the
//! child as a [`Proc`] (a bare pid, the leader of its own process group,
//! reaped only through it) and the read ends of its stdout and stderr. An
//! isolated agent's harness or bash-task daemon does not go through
//! `std::process::Command`: `sandbox::spawn`'s raw `clone()` into new
//! namespaces returns a bare pid, and makes its `Spawned` with
//! [`Proc::adopt`] and its two pipe read ends; nothing downstream changes
//! (`bashd::AgentLaunch::start` picks one of the two).

use super::logfile::{LogFile, Pipe};
use super::UpSettings;
use crate::sys::fd::{self, PollFd};
use crossbeam_channel::{at, never, select, unbounded, Receiver, Sender};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// A child just started: its leader as a [`Proc`], and the read ends of its
/// stdout and stderr (for [`log_output`]).
#[derive(Debug)]
pub struct Spawned {
    pub child: Proc,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Starts `cmd` as the leader of a new process group, stdin from /dev/null,
/// stdout and stderr on pipes: the one way `hive up` starts a child. The
/// seam for a spawn that is not a `Command` is [`Proc::adopt`] (see the
/// module's doc).
pub fn spawn(cmd: &mut Command) -> io::Result<Spawned> {
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut started = cmd.spawn()?;
    // std's `Child` neither kills nor reaps when dropped: from here the pid
    // is the `Proc`'s alone.
    let child = Proc::adopt(started.id());
    let (out, err) = (started.stdout.take(), started.stderr.take());
    drop(started);
    match (out, err) {
        (Some(out), Some(err)) => Ok(Spawned {
            child,
            stdout: out.into(),
            stderr: err.into(),
        }),
        // Dropping the child kills and reaps it.
        _ => Err(io::Error::other("the child's output pipes were not made")),
    }
}

/// A child of this process that leads its own process group, by pid: the
/// owner signals it and reaps it through this handle alone, so no signal
/// reaches its pid once it was reaped. Dropping it SIGKILLs the group and
/// reaps the leader if it was not yet.
#[derive(Debug)]
pub struct Proc {
    pid: u32,
    /// Set once the leader was reaped.
    status: Option<ExitStatus>,
}

impl Proc {
    /// Takes charge of child `pid`, just started by this process as the
    /// leader of its own process group (its pid is the group id) and not
    /// reaped by anyone else.
    pub fn adopt(pid: u32) -> Proc {
        Proc { pid, status: None }
    }

    /// The leader's pid, which is also the process group id.
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Sends `sig` to the leader alone, while it is not reaped.
    pub fn signal_leader(&self, sig: i32) {
        if self.status.is_some() {
            return;
        }
        // SAFETY: kill(2) has no memory effects; the pid is our unreaped child.
        if unsafe { libc::kill(self.pid as libc::pid_t, sig) } != 0 {
            log::debug!(
                "cannot signal process {}: {}",
                self.pid,
                io::Error::last_os_error()
            );
        }
    }

    /// SIGKILLs the whole group (a group that is gone is fine).
    pub fn kill(&self) {
        crate::sys::process::kill_group(self.pid as i32);
    }

    /// Reaps the leader if it has exited.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        self.reap(libc::WNOHANG)
    }

    /// Waits for the leader to exit and reaps it.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        self.reap(0)?
            .ok_or_else(|| io::Error::other("waitpid returned no status"))
    }

    fn reap(&mut self, flags: libc::c_int) -> io::Result<Option<ExitStatus>> {
        if let Some(st) = self.status {
            return Ok(Some(st));
        }
        loop {
            let mut status = 0;
            // SAFETY: waitpid writes one int we own; the pid is our child.
            let rc = unsafe { libc::waitpid(self.pid as libc::pid_t, &mut status, flags) };
            if rc == 0 {
                return Ok(None);
            }
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let st = ExitStatus::from_raw(status);
            self.status = Some(st);
            return Ok(Some(st));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if self.status.is_none() {
            // The leader was just SIGKILLed (its group was), so this is short.
            if let Err(e) = self.reap(0) {
                log::warn!("cannot reap process {}: {e}", self.pid);
            }
        }
    }
}

/// What `sup-children` is given to watch.
enum Watch {
    /// Tell `exits` when child `pid` (of owner key `name`) has exited; `fd`
    /// is its pidfd.
    Exit {
        fd: OwnedFd,
        exited: Exited,
        exits: Sender<Exited>,
    },
    /// Read a child's output pipe into its log.
    Output(Pipe),
}

/// The `sup-children` thread of this process: where its work is sent, and
/// the write end of its wake pipe.
struct Children {
    tx: Sender<Watch>,
    wake: OwnedFd,
}

/// The one `sup-children` thread, started at the first child.
fn children() -> Result<&'static Children, String> {
    static CHILDREN: OnceLock<Result<Children, String>> = OnceLock::new();
    CHILDREN
        .get_or_init(|| Children::start().map_err(|e| format!("cannot start sup-children: {e}")))
        .as_ref()
        .map_err(Clone::clone)
}

impl Children {
    fn start() -> io::Result<Children> {
        let (read, wake) = fd::pipe()?;
        set_nonblocking(read.as_raw_fd());
        set_nonblocking(wake.as_raw_fd());
        let (tx, rx) = unbounded();
        std::thread::Builder::new()
            .name("sup-children".into())
            .stack_size(256 * 1024)
            .spawn(move || watch_loop(read, rx))?;
        Ok(Children { tx, wake })
    }

    /// Hands `w` to the thread and wakes it.
    fn send(&self, w: Watch) {
        if self.tx.send(w).is_ok() {
            // SAFETY: write(2) of one byte from a buffer we own. A full pipe
            // (EAGAIN) already holds a wake-up.
            unsafe { libc::write(self.wake.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        }
    }
}

fn set_nonblocking(fd: RawFd) {
    // SAFETY: fcntl on a descriptor we own; no memory is shared.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

/// `sup-children`'s loop: one `poll(2)` over the wake pipe, every watched
/// child's pidfd and every open output pipe; it sleeps until one of them has
/// news, so an idle hive costs it nothing.
fn watch_loop(wake: OwnedFd, rx: Receiver<Watch>) {
    let mut exits: Vec<(OwnedFd, Exited, Sender<Exited>)> = Vec::new();
    let mut pipes: Vec<Pipe> = Vec::new();
    let mut fds: Vec<PollFd> = Vec::new();
    loop {
        for w in rx.try_iter() {
            match w {
                Watch::Exit {
                    fd,
                    exited,
                    exits: tx,
                } => exits.push((fd, exited, tx)),
                Watch::Output(p) => pipes.push(p),
            }
        }
        fds.clear();
        fds.push(PollFd::new(wake.as_raw_fd(), true, false));
        fds.extend(
            exits
                .iter()
                .map(|(fd, ..)| PollFd::new(fd.as_raw_fd(), true, false)),
        );
        fds.extend(pipes.iter().map(|p| PollFd::new(p.fd(), true, false)));
        if let Err(e) = fd::poll(&mut fds, None) {
            log::error!("sup-children cannot poll: {e}");
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        if fds[0].any() {
            let mut buf = [0u8; 256];
            // SAFETY: read(2) into a buffer we own; the pipe is non-blocking.
            while unsafe { libc::read(wake.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
        }
        let mut at = fds.iter().skip(1);
        exits.retain(|(_, exited, tx)| {
            if !at.next().is_some_and(PollFd::any) {
                return true;
            }
            // An owner that is gone has nothing left to reap.
            let _ = tx.send(exited.clone());
            false
        });
        pipes.retain_mut(|p| {
            if at.next().is_some_and(PollFd::any) {
                p.on_readable()
            } else {
                true
            }
        });
    }
}

/// Watches child `pid` (key `name` of its owner) until it exits, without
/// reaping it: then sends `Exited { name, pid }` to `exits`. By
/// `sup-children` through a pidfd; where there is none, by a thread of its
/// own named `waiter`.
fn watch_exit(pid: u32, waiter: String, name: &str, exits: &Sender<Exited>) -> io::Result<()> {
    let exited = Exited {
        name: name.to_string(),
        pid,
    };
    let tx = exits.clone();
    match (pidfd_open(pid), children()) {
        (Ok(fd), Ok(c)) => {
            c.send(Watch::Exit {
                fd,
                exited,
                exits: tx,
            });
            Ok(())
        }
        (Err(e), _) if e.raw_os_error() == Some(libc::EMFILE) => Err(e),
        (pidfd, c) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let why = match (pidfd.err(), c.err()) {
                    (Some(e), _) => e.to_string(),
                    (None, Some(e)) => e,
                    (None, None) => String::new(),
                };
                log::info!("no pidfds here ({why}): a waiter thread watches each child's exit");
            });
            std::thread::Builder::new()
                .name(waiter)
                .stack_size(64 * 1024)
                .spawn(move || {
                    wait_no_reap(pid);
                    let _ = tx.send(exited);
                })
                .map(drop)
        }
    }
}

/// A pidfd for process `pid`: readable once it has exited.
fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new
    // descriptor, owned here exactly once.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor just returned by the kernel (close-on-exec, as
    // every pidfd), open and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Blocks until child `pid` has exited (or is no child of ours any more),
/// leaving it for its owner to reap.
fn wait_no_reap(pid: u32) {
    loop {
        // SAFETY: waitid writes one siginfo_t we own; WNOWAIT leaves the child
        // waitable.
        let rc = unsafe {
            let mut info = std::mem::zeroed::<libc::siginfo_t>();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// A broker credential for `agent`'s process `via` (issue 40): a socket
/// pair made here, outside the agent's sandbox, one end sent to the hub, from
/// then on the only place that process's reports are taken; the other end is
/// returned, for the child to inherit under its number (a spawn's `keep`,
/// with [`CREDENTIAL_FD_VAR`] set to it; the child marks it close-on-exec at
/// once). The caller drops it once the child is spawned (a child that never
/// started leaves the hub's end closed, and the hub drops it).
///
/// [`CREDENTIAL_FD_VAR`]: crate::proto::client::CREDENTIAL_FD_VAR
pub fn credential(
    hub: &crate::broker::lifecycle::FleetTx,
    agent: &str,
    via: crate::proto::access::Via,
) -> Result<std::os::unix::net::UnixStream, String> {
    let (broker_end, child_end) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| format!("cannot make the broker credential of {agent}: {e}"))?;
    let sent = hub.send(crate::broker::lifecycle::FleetEvent::Credential {
        agent: agent.to_string(),
        via,
        control: broker_end,
    });
    if !sent {
        return Err(format!(
            "cannot hand {agent} a broker credential: the broker is stopping"
        ));
    }
    Ok(child_end)
}

/// The restart delay after `failures` consecutive crashes: `base` doubled per
/// crash, capped at `max`.
pub fn backoff(base: Duration, max: Duration, failures: u32) -> Duration {
    let ms = (base.as_millis() as u64).saturating_mul(1u64 << failures.min(20));
    Duration::from_millis(ms).min(max)
}

/// The timings of a supervised child, from `hive up`'s settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// The first restart delay.
    pub restart_base: Duration,
    /// The longest restart delay.
    pub restart_max: Duration,
    /// Uptime after which a child's backoff starts over.
    pub stable: Duration,
    /// How long a stopping child has between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
}

impl Timing {
    /// The timings `hive up` was started with (`HIVE_UP_*`).
    pub fn of(s: &UpSettings) -> Timing {
        Timing {
            restart_base: s.restart_base,
            restart_max: s.restart_max,
            stable: s.stable,
            stop_grace: s.stop_grace,
        }
    }
}

/// Where a supervised child is.
#[derive(Debug)]
pub enum Phase {
    Running(Proc),
    Stopping {
        child: Proc,
        /// When the grace runs out (SIGKILL); `None` once it was sent.
        kill_at: Option<Instant>,
    },
    Stopped,
    /// Starts at this instant.
    Backoff(Instant),
}

/// The child of `name` (the owner's key) with pid `pid` has exited; it is
/// not reaped yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    pub name: String,
    pub pid: u32,
}

/// How a reaped child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// It exited while it was meant to run, after `up`; `clean` when it
    /// exited with status 0.
    Crashed {
        status: String,
        clean: bool,
        up: Duration,
    },
    /// It exited after it was asked to stop.
    Stopped { status: String },
}

/// One supervised child: its phase, its restart backoff and its stop ladder.
#[derive(Debug)]
pub struct Supervised {
    /// Who it is in log lines ("ruth", "the Matrix bridge").
    label: String,
    timing: Timing,
    phase: Phase,
    /// When the running child was started.
    started: Option<Instant>,
    /// Crashes since its last healthy run.
    failures: u32,
    /// Restarts after a crash, in all.
    restarts: u32,
}

impl Supervised {
    /// A child that does not run yet, logged as `label`.
    pub fn new(label: impl Into<String>, timing: Timing) -> Supervised {
        Supervised {
            label: label.into(),
            timing,
            phase: Phase::Stopped,
            started: None,
            failures: 0,
            restarts: 0,
        }
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The pid of the child while it runs or stops.
    pub fn pid(&self) -> Option<u32> {
        match &self.phase {
            Phase::Running(c) | Phase::Stopping { child: c, .. } => Some(c.id()),
            Phase::Stopped | Phase::Backoff(_) => None,
        }
    }

    pub fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Running(_))
    }

    pub fn is_stopping(&self) -> bool {
        matches!(self.phase, Phase::Stopping { .. })
    }

    pub fn is_stopped(&self) -> bool {
        matches!(self.phase, Phase::Stopped)
    }

    /// Restarts after a crash, in all.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Forgets the crashes so far: the next one waits the shortest backoff.
    pub fn reset_failures(&mut self) {
        self.failures = 0;
    }

    /// When this child next needs its owner: the end of a restart backoff,
    /// or of a stop's grace.
    pub fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Backoff(t) => Some(t),
            Phase::Stopping { kill_at, .. } => kill_at,
            Phase::Running(_) | Phase::Stopped => None,
        }
    }

    /// Schedules a start at `t`; nothing while a child runs or stops.
    pub fn start_at(&mut self, t: Instant) {
        if matches!(self.phase, Phase::Stopped | Phase::Backoff(_)) {
            self.phase = Phase::Backoff(t);
        }
    }

    /// Makes `child` the running one, watched from now on by `sup-children`
    /// (or, without pidfds, a thread named `waiter`), which sends
    /// `Exited { name, pid }` to `exits` when it exits. A child that cannot
    /// be watched would never be seen to exit: it is killed and reaped at
    /// once (dropped), a restart is scheduled after the backoff, and the
    /// error is returned. The pid otherwise.
    pub fn run(
        &mut self,
        child: Proc,
        waiter: String,
        name: &str,
        exits: &Sender<Exited>,
    ) -> Result<u32, std::io::Error> {
        let pid = child.id();
        if let Err(e) = watch_exit(pid, waiter, name, exits) {
            drop(child);
            self.back_off();
            return Err(e);
        }
        self.phase = Phase::Running(child);
        self.started = Some(Instant::now());
        Ok(pid)
    }

    /// A start failed (or the child crashed): the next start is after the
    /// backoff its crashes so far earn; returns that wait.
    pub fn back_off(&mut self) -> Duration {
        let t = self.timing;
        let wait = backoff(t.restart_base, t.restart_max, self.failures);
        self.failures += 1;
        self.phase = Phase::Backoff(Instant::now() + wait);
        wait
    }

    /// The child crashed after running for `up`: a run of at least the
    /// stable time starts the backoff over; counts the restart and schedules
    /// it, returning the wait.
    pub fn after_crash(&mut self, up: Duration) -> Duration {
        if up >= self.timing.stable {
            self.failures = 0;
        }
        self.restarts += 1;
        self.back_off()
    }

    /// Reaps the child if `pid` is the one that runs or stops here and it
    /// has exited, leaving this one stopped, and says how it ended. `None`
    /// for a notice about an earlier child (already reaped) or one that
    /// finds it still running. Whatever it left in its process group is
    /// killed with it.
    pub fn on_exit(&mut self, pid: u32) -> Option<Ended> {
        let child = match &mut self.phase {
            Phase::Running(c) | Phase::Stopping { child: c, .. } if c.id() == pid => c,
            _ => return None,
        };
        let (status, clean) = match child.try_wait() {
            Ok(Some(st)) => (st.to_string(), st.success()),
            Ok(None) => return None,
            Err(e) => (format!("lost: {e}"), false),
        };
        let up = self.started.map_or(Duration::ZERO, |t| t.elapsed());
        Some(match std::mem::replace(&mut self.phase, Phase::Stopped) {
            Phase::Running(_) => Ended::Crashed { status, clean, up },
            _ => Ended::Stopped { status },
        })
    }

    /// The first rung of the stop ladder: a running child gets SIGTERM and
    /// the grace (then [`Supervised::on_deadline`] SIGKILLs it); a stopping
    /// one keeps its grace; a restart that was due is called off. True when
    /// a child is stopping now.
    pub fn stop(&mut self) -> bool {
        match std::mem::replace(&mut self.phase, Phase::Stopped) {
            Phase::Running(child) => {
                child.signal_leader(libc::SIGTERM);
                self.stopping(child);
                true
            }
            stopping @ Phase::Stopping { .. } => {
                self.phase = stopping;
                true
            }
            Phase::Stopped | Phase::Backoff(_) => false,
        }
    }

    /// The running child is exiting by itself (it was asked otherwise): it
    /// stops with the grace, as if it had got SIGTERM. False when no child
    /// runs.
    pub fn exiting(&mut self) -> bool {
        match std::mem::replace(&mut self.phase, Phase::Stopped) {
            Phase::Running(child) => {
                self.stopping(child);
                true
            }
            other => {
                self.phase = other;
                false
            }
        }
    }

    fn stopping(&mut self, child: Proc) {
        self.phase = Phase::Stopping {
            child,
            kill_at: Some(Instant::now() + self.timing.stop_grace),
        };
    }

    /// What is due at `now`: a stop past its grace gets SIGKILL (its exit
    /// event then ends the stop); true when a restart's backoff ran out, so
    /// the owner starts the child (this one is stopped until then).
    pub fn on_deadline(&mut self, now: Instant) -> bool {
        match &mut self.phase {
            Phase::Backoff(t) if now >= *t => {
                self.phase = Phase::Stopped;
                true
            }
            Phase::Stopping {
                child,
                kill_at: kill_at @ Some(_),
            } if kill_at.is_some_and(|t| now >= t) => {
                log::warn!("{} did not stop within its grace; SIGKILL", self.label);
                child.kill();
                *kill_at = None;
                false
            }
            _ => false,
        }
    }

    /// The child as it is, SIGKILLed, leaving this one stopped: for the
    /// owner to drop (which reaps it).
    fn take(&mut self) -> Option<Proc> {
        match std::mem::replace(&mut self.phase, Phase::Stopped) {
            Phase::Running(child) | Phase::Stopping { child, .. } => {
                child.kill();
                Some(child)
            }
            other => {
                self.phase = other;
                None
            }
        }
    }
}

/// Copies a new child's `stdout` and `stderr` into `log`, line by line, on
/// `sup-children` until each pipe's end; the child of `spawned`, whose pipes
/// these were, is returned.
pub fn log_output(spawned: Spawned, log: &Arc<Mutex<LogFile>>) -> Proc {
    let Spawned {
        child,
        stdout,
        stderr,
    } = spawned;
    match children() {
        Ok(c) => {
            c.send(Watch::Output(Pipe::new(stdout, log.clone())));
            c.send(Watch::Output(Pipe::new(stderr, log.clone())));
        }
        // Its pipes close here: what it writes is lost (it gets EPIPE).
        Err(e) => log::error!("the output of process {} is not logged: {e}", child.id()),
    }
    child
}

/// The nearest deadline of `children`.
pub fn next_deadline<'a>(children: impl Iterator<Item = &'a Supervised>) -> Option<Instant> {
    children.filter_map(Supervised::deadline).min()
}

/// A supervisor thread, as its loop and [`stop_all`] drive it: its children,
/// and what it does with an exit and with a deadline.
pub trait Owner {
    /// Every child it supervises.
    fn children(&mut self) -> Box<dyn Iterator<Item = &mut Supervised> + '_>;
    /// Handles an exit `sup-children` reported: reaps the child
    /// ([`Supervised::on_exit`]) and does what the exit means to it.
    fn on_exited(&mut self, e: &Exited);
    /// Handles what is due now ([`Supervised::on_deadline`] of each child):
    /// a restart whose backoff ran out, a stop past its grace.
    fn on_deadlines(&mut self);
}

/// The rest of the stop ladder for every child of `owner`, after the owner
/// told each to stop: waits for their exits on `exits` (each handled by the
/// owner) and SIGKILLs those past their grace, for at most the grace and a
/// second. Returns what is left, SIGKILLed, for the owner to reap.
pub fn stop_all(owner: &mut impl Owner, exits: &Receiver<Exited>, grace: Duration) -> Vec<Proc> {
    let end = Instant::now() + grace + Duration::from_secs(1);
    loop {
        if !owner.children().any(|c| c.is_stopping()) {
            break;
        }
        let timer = next_deadline(owner.children().map(|c| &*c)).map_or_else(never, at);
        select! {
            recv(exits) -> e => {
                if let Ok(e) = e {
                    owner.on_exited(&e);
                }
            }
            recv(timer) -> _ => owner.on_deadlines(),
            recv(at(end)) -> _ => break,
        }
    }
    owner.children().filter_map(Supervised::take).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::unbounded;
    use std::io::{BufRead, BufReader};

    fn timing(stable: Duration, grace: Duration) -> Timing {
        Timing {
            restart_base: Duration::from_millis(10),
            restart_max: Duration::from_millis(80),
            stable,
            stop_grace: grace,
        }
    }

    /// `sh -c SCRIPT` in its own process group, its output piped.
    fn sh(script: &str) -> Spawned {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg(script);
        spawn(&mut cmd).expect("sh runs")
    }

    /// Waits (at most 20 s) until `sv`'s child has ended, driving its
    /// deadlines as an owner's loop would.
    fn until_ended(sv: &mut Supervised, exits: &Receiver<Exited>) -> Ended {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(Instant::now() < end, "the child did not end in 20 s");
            let timer = sv.deadline().map_or_else(never, at);
            select! {
                recv(exits) -> e => {
                    let e = e.unwrap();
                    assert_eq!(e.name, "kid");
                    if let Some(ended) = sv.on_exit(e.pid) {
                        return ended;
                    }
                }
                recv(timer) -> _ => assert!(!sv.on_deadline(Instant::now()), "no restart is due"),
                recv(at(end)) -> _ => {}
            }
        }
    }

    /// Starts `script` as `sv`'s child and waits for its first line.
    fn run_ready(sv: &mut Supervised, exits: &Sender<Exited>, script: &str) -> u32 {
        let child = sh(script);
        let out = std::fs::File::from(child.stdout);
        let pid = sv
            .run(child.child, "wait-kid".into(), "kid", exits)
            .unwrap();
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        pid
    }

    #[test]
    fn restart_backoff_doubles_and_is_capped() {
        let (base, max) = (Duration::from_secs(1), Duration::from_secs(60));
        let waits: Vec<u64> = (0..9).map(|f| backoff(base, max, f).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(base, max, u32::MAX), max);
    }

    #[test]
    fn crashes_grow_the_backoff_and_a_healthy_run_starts_it_over() {
        let (tx, rx) = unbounded();
        // No run is long enough to count as healthy, at first.
        let mut sv = Supervised::new(
            "kid",
            timing(Duration::from_secs(3600), Duration::from_secs(5)),
        );
        let mut waits = Vec::new();
        for _ in 0..5 {
            sv.run(sh("exit 3").child, "wait-kid".into(), "kid", &tx)
                .unwrap();
            let Ended::Crashed { status, clean, up } = until_ended(&mut sv, &rx) else {
                panic!("a crash");
            };
            assert!(status.contains('3') && !clean, "{status}");
            waits.push(sv.after_crash(up).as_millis());
            assert!(matches!(sv.phase(), Phase::Backoff(_)));
            // The restart comes once its backoff ran out, not before.
            assert!(!sv.on_deadline(Instant::now() - Duration::from_secs(1)));
            assert!(sv.on_deadline(Instant::now() + Duration::from_secs(1)));
            assert!(sv.is_stopped());
        }
        assert_eq!(waits, [10, 20, 40, 80, 80]);
        assert_eq!(sv.restarts(), 5);
        // A run longer than the stable time starts the backoff over.
        sv.timing.stable = Duration::from_millis(200);
        run_ready(&mut sv, &tx, "echo ready; sleep 1; exit 1");
        let Ended::Crashed { up, .. } = until_ended(&mut sv, &rx) else {
            panic!("a crash");
        };
        assert!(up >= Duration::from_millis(200), "{up:?}");
        assert_eq!(sv.after_crash(up), Duration::from_millis(10));
        assert_eq!(sv.back_off(), Duration::from_millis(20), "counting again");
    }

    #[test]
    fn the_stop_ladder_escalates_to_sigkill_for_a_child_that_ignores_sigterm() {
        let (tx, rx) = unbounded();
        let mut sv = Supervised::new(
            "kid",
            timing(Duration::from_secs(60), Duration::from_millis(200)),
        );
        let pid = run_ready(
            &mut sv,
            &tx,
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        );
        assert!(sv.stop());
        assert_eq!(sv.pid(), Some(pid));
        assert!(sv.deadline().is_some(), "the grace runs");
        assert!(sv.stop(), "a second stop keeps the grace");
        let Ended::Stopped { status } = until_ended(&mut sv, &rx) else {
            panic!("a stop");
        };
        assert!(
            status.contains("signal: 9"),
            "SIGKILL after the grace: {status}"
        );
        assert!(sv.is_stopped());
        assert_eq!(sv.restarts(), 0);
        // Its group is gone and reaped: the pid is no child of ours any more.
        // SAFETY: waitpid with WNOHANG on a pid; no memory is shared.
        let rc = unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), libc::WNOHANG) };
        assert_eq!(rc, -1);
    }

    #[test]
    fn a_child_that_honours_sigterm_stops_on_the_first_rung() {
        let (tx, rx) = unbounded();
        let mut sv = Supervised::new(
            "kid",
            timing(Duration::from_secs(60), Duration::from_secs(30)),
        );
        run_ready(
            &mut sv,
            &tx,
            "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done",
        );
        assert!(sv.stop());
        let ended = until_ended(&mut sv, &rx);
        assert_eq!(
            ended,
            Ended::Stopped {
                status: "exit status: 0".into()
            }
        );
        // Stopped, a stop is nothing, and a restart that was due is called off.
        assert!(!sv.stop());
        sv.start_at(Instant::now());
        assert!(!sv.stop());
        assert!(sv.is_stopped());
    }

    #[test]
    fn a_notice_about_another_child_is_nothing() {
        let (tx, rx) = unbounded();
        let mut sv = Supervised::new(
            "kid",
            timing(Duration::from_secs(60), Duration::from_millis(200)),
        );
        let pid = run_ready(&mut sv, &tx, "echo ready; exec sleep 30");
        assert_eq!(sv.on_exit(pid + 100_000), None, "not its pid");
        assert_eq!(sv.on_exit(pid), None, "still running");
        assert!(sv.is_running());
        // A child said to be exiting by itself gets the grace, then SIGKILL
        // when it does not exit.
        assert!(sv.exiting());
        assert!(sv.is_stopping());
        let Ended::Stopped { status } = until_ended(&mut sv, &rx) else {
            panic!("a stop");
        };
        assert!(status.contains("signal: 9"), "{status}");
    }

    /// Two children, one ignoring SIGTERM, stopped the way an owner does.
    struct Two {
        kids: Vec<Supervised>,
        seen: Vec<Ended>,
    }

    impl Owner for Two {
        fn children(&mut self) -> Box<dyn Iterator<Item = &mut Supervised> + '_> {
            Box::new(self.kids.iter_mut())
        }
        fn on_exited(&mut self, e: &Exited) {
            for k in &mut self.kids {
                if let Some(ended) = k.on_exit(e.pid) {
                    self.seen.push(ended);
                }
            }
        }
        fn on_deadlines(&mut self) {
            let now = Instant::now();
            for k in &mut self.kids {
                assert!(!k.on_deadline(now), "no restart is due");
            }
        }
    }

    #[test]
    fn stop_all_stops_every_child_and_leaves_none() {
        let (tx, rx) = unbounded();
        let t = timing(Duration::from_secs(60), Duration::from_millis(200));
        let mut owner = Two {
            kids: vec![Supervised::new("kid", t), Supervised::new("kid", t)],
            seen: Vec::new(),
        };
        run_ready(
            &mut owner.kids[0],
            &tx,
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        );
        run_ready(&mut owner.kids[1], &tx, "echo ready; exec sleep 30");
        // One waits out its backoff: a stop calls its restart off.
        let mut waiting = Supervised::new("kid", t);
        waiting.start_at(Instant::now() + Duration::from_secs(60));
        owner.kids.push(waiting);
        for k in &mut owner.kids {
            k.stop();
        }
        let left = stop_all(&mut owner, &rx, t.stop_grace);
        assert!(left.is_empty(), "{left:?}");
        let mut statuses: Vec<String> = owner
            .seen
            .iter()
            .map(|e| match e {
                Ended::Stopped { status } => status.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        statuses.sort();
        assert_eq!(statuses.len(), 2);
        assert!(statuses[0].contains("signal: 15"), "{statuses:?}");
        assert!(statuses[1].contains("signal: 9"), "{statuses:?}");
        assert!(owner.kids.iter().all(Supervised::is_stopped));
    }

    /// The names of this process's threads now.
    fn thread_names() -> Vec<String> {
        let mut names = Vec::new();
        for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
            if let Ok(n) = std::fs::read_to_string(t.path().join("comm")) {
                names.push(n.trim().to_string());
            }
        }
        names
    }

    #[test]
    fn one_thread_watches_many_children_and_logs_their_lines() {
        let (tx, rx) = unbounded();
        let dir = std::env::temp_dir().join(format!("hive-child-logs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let t = timing(Duration::from_secs(60), Duration::from_secs(5));
        let mut kids: Vec<Supervised> = Vec::new();
        let mut logs = Vec::new();
        for i in 0..30 {
            let path = dir.join(format!("kid{i}.log"));
            let log = Arc::new(Mutex::new(LogFile::open(path.clone(), 1 << 20, 1)));
            // A line on each pipe, one cut in two writes, a last one
            // without its newline; then it waits for its stdin's end.
            let child = log_output(
                sh(&format!(
                    "echo out {i}; echo err {i} >&2; printf 'half '; printf 'line\\n'; \
                     printf 'no newline'; exec sleep 2"
                )),
                &log,
            );
            let mut sv = Supervised::new(format!("kid{i}"), t);
            sv.run(child, format!("wait-kid{i}"), &format!("kid{i}"), &tx)
                .unwrap();
            kids.push(sv);
            logs.push(path);
        }
        // No thread per child: no waiter, no pump.
        let names = thread_names();
        assert!(
            !names
                .iter()
                .any(|n| n.starts_with("wait-kid") || n.starts_with("log-")),
            "{names:?}"
        );
        assert!(names.iter().any(|n| n == "sup-children"), "{names:?}");
        let mut ended = 0;
        let end = Instant::now() + Duration::from_secs(20);
        while ended < kids.len() {
            let e = rx
                .recv_deadline(end)
                .expect("every child's exit is reported within 20 s");
            let i: usize = e.name.trim_start_matches("kid").parse().unwrap();
            match kids[i].on_exit(e.pid) {
                Some(Ended::Crashed { clean: true, .. }) => ended += 1,
                other => panic!("{other:?}"),
            }
        }
        // Each log has every line once the pipes reached their end.
        for (i, path) in logs.iter().enumerate() {
            let want = [
                format!("out {i}"),
                format!("err {i}"),
                "half line".into(),
                "no newline".into(),
            ];
            let end = Instant::now() + Duration::from_secs(20);
            loop {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                let mut lines: Vec<&str> = text.lines().collect();
                lines.sort();
                let mut w: Vec<&str> = want.iter().map(String::as_str).collect();
                w.sort();
                if lines == w {
                    break;
                }
                assert!(Instant::now() < end, "kid{i}'s log: {text:?}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
