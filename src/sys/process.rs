//! Child processes, the one way hive runs them: each in its own process group,
//! owned by a [`ProcessGroup`] that SIGKILLs the group and reaps the leader when
//! it is dropped, so no exit path leaves a child running or a zombie behind (the
//! kill-and-wait-on-drop handle of rust-analyzer's `stdx::process::JodChild`).
//! An owner thread that must not block learns of an exit as an event:
//! [`ProcessGroup::on_exit`] starts a waiter thread that waits *without reaping*
//! (`waitid(…, WNOWAIT)`), so the pid stays the owner's until the owner reaps it
//! and a signal can never reach a recycled pid. [`run_with_timeout`] runs a short
//! command to completion under a wall-clock limit with both pipes drained.
//! [`Worker`]s are threads kept for the next child: a harness that starts a
//! claude per turn, each with its pumps and its waiter, takes them from the
//! threads the last turn left idle instead of starting three new ones.
//! [`ProcessGroup::spawn_piped`] starts a child with `posix_spawn` from an
//! environment built once ([`ChildEnv`]): std's `Command` copies the whole
//! environment into a map and back into a new `envp` at every spawn once one
//! variable is set, which costs a harness 40–90 µs a turn. Every child is
//! registered as this process's own from its spawn to its reaping, so a
//! process that is PID 1 of a namespace (an isolated harness or bash-task
//! daemon) can tell the orphans it inherits from its own children and reap
//! them ([`sweep_orphans`], on SIGCHLD: `signals.rs`).

use std::ffi::{c_char, CString, OsStr};
use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A child that leads its own process group.
#[derive(Debug)]
pub struct ProcessGroup {
    leader: Leader,
    /// Set once the leader was reaped.
    status: Option<ExitStatus>,
    /// Drop leaves the rest of the group running (only after the leader was reaped).
    leave_rest: bool,
}

/// How the leader was started: by std (its pipes in the `Child`), or by
/// [`ProcessGroup::spawn_piped`] (its pipes handed out at the start).
#[derive(Debug)]
enum Leader {
    Std(Child),
    Spawned(u32),
}

impl ProcessGroup {
    /// Starts `cmd` as the leader of a new process group (its pid is the group id).
    pub fn spawn(cmd: &mut Command) -> io::Result<ProcessGroup> {
        cmd.process_group(0);
        let mut owned = owned();
        let child = cmd.spawn()?;
        owned.push(child.id());
        Ok(ProcessGroup {
            leader: Leader::Std(child),
            status: None,
            leave_rest: false,
        })
    }

    /// Starts `what` as the leader of a new process group with its three
    /// standard descriptors on pipes, as std would with `process_group(0)`
    /// and piped stdio (signal mask emptied, `SIGPIPE` at its default, the
    /// program looked up in `PATH` when its name has no `/`), but with the
    /// environment built once ([`ChildEnv`]) plus `what.set`, so nothing of
    /// the environment is copied at the spawn.
    pub fn spawn_piped(what: &Spawn) -> io::Result<Piped> {
        // The error names what held the NUL, never a variable's value (a
        // token).
        let c = |b: &[u8], what: &dyn Fn() -> String| {
            CString::new(b).map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} holds a NUL byte, which no program can be given", what()),
                )
            })
        };
        let path = what.program.as_os_str().as_bytes();
        let program = c(path, &|| format!("the program name {:?}", what.program))?;
        let mut args = Vec::with_capacity(what.args.len());
        for (i, a) in what.args.iter().enumerate() {
            args.push(c(a.as_bytes(), &|| format!("argument {}", i + 1))?);
        }
        let cwd = c(what.cwd.as_os_str().as_bytes(), &|| {
            format!("the working directory {:?}", what.cwd)
        })?;
        let mut set = Vec::with_capacity(what.set.len());
        for (k, v) in what.set {
            set.push(c(format!("{k}={v}").as_bytes(), &|| {
                format!("the variable {k:?}")
            })?);
        }
        let mut argv: Vec<*const c_char> = std::iter::once(&program)
            .chain(&args)
            .map(|a| a.as_ptr())
            .collect();
        argv.push(std::ptr::null());
        let mut envp: Vec<*const c_char> = what
            .env
            .except(what.set)
            .chain(&set)
            .map(|v| v.as_ptr())
            .collect();
        envp.push(std::ptr::null());
        let (stdin, to_stdin) = super::fd::pipe()?;
        let (from_stdout, stdout) = super::fd::pipe()?;
        let (from_stderr, stderr) = super::fd::pipe()?;
        let search = !path.contains(&b'/');
        let mut owned = owned();
        let pid = posix_spawn(
            &program,
            search,
            &argv,
            &envp,
            &cwd,
            [stdin.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()],
        )?;
        owned.push(pid);
        drop(owned);
        // The child's ends close here; the child has its own.
        drop((stdin, stdout, stderr));
        Ok(Piped {
            group: ProcessGroup {
                leader: Leader::Spawned(pid),
                status: None,
                leave_rest: false,
            },
            stdin: File::from(to_stdin),
            stdout: File::from(from_stdout),
            stderr: File::from(from_stderr),
        })
    }

    /// The leader's pid, which is also the process group id.
    pub fn id(&self) -> u32 {
        match &self.leader {
            Leader::Std(c) => c.id(),
            Leader::Spawned(pid) => *pid,
        }
    }

    /// The leader as std started it, to take its pipes ([`ProcessGroup::spawn`]).
    pub fn child_mut(&mut self) -> Option<&mut Child> {
        match &mut self.leader {
            Leader::Std(c) => Some(c),
            Leader::Spawned(_) => None,
        }
    }

    /// Sends `sig` to every process of the group. A group that is gone is fine.
    pub fn signal(&self, sig: i32) {
        signal_group(self.id() as i32, sig);
    }

    /// Sends `sig` to the leader alone, while it is not reaped (so its pid is
    /// still its own).
    pub fn signal_leader(&self, sig: i32) {
        if self.status.is_some() {
            return;
        }
        // SAFETY: kill(2) has no memory effects; the pid is our unreaped child.
        if unsafe { libc::kill(self.id() as i32, sig) } != 0 {
            let e = io::Error::last_os_error();
            log::debug!("cannot signal process {}: {e}", self.id());
        }
    }

    /// SIGKILLs the whole group.
    pub fn kill(&self) {
        self.signal(libc::SIGKILL);
    }

    /// Reaps the leader if it has exited.
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(st) = self.status {
            return Ok(Some(st));
        }
        let st = match &mut self.leader {
            Leader::Std(c) => c.try_wait()?,
            Leader::Spawned(pid) => reap(*pid, false)?,
        };
        self.status = st;
        if st.is_some() {
            disown(self.id());
        }
        Ok(st)
    }

    /// Waits for the leader and reaps it.
    pub fn wait(&mut self) -> io::Result<ExitStatus> {
        if let Some(st) = self.status {
            return Ok(st);
        }
        let st = match &mut self.leader {
            Leader::Std(c) => c.wait()?,
            Leader::Spawned(pid) => match reap(*pid, true)? {
                Some(st) => st,
                None => return Err(io::Error::other("waitpid returned no status")),
            },
        };
        self.status = Some(st);
        disown(self.id());
        Ok(st)
    }

    /// Starts a thread named `name` that waits until the leader has exited,
    /// without reaping it, and then calls `notify` (which typically sends an
    /// event to the owner, who then calls [`ProcessGroup::try_wait`]). `notify`
    /// also runs if the leader was reaped meanwhile, so the owner must take a
    /// notice that finds its child still running as nothing.
    pub fn on_exit(&self, name: String, notify: impl FnOnce() + Send + 'static) -> io::Result<()> {
        ExitWatch::start(name, notify)?.watch(self);
        Ok(())
    }

    /// Waits for the leader, reaps it, and leaves whatever it started in the
    /// group running (a bash task's background processes outlive its shell).
    pub fn wait_leaving_rest(mut self) -> io::Result<ExitStatus> {
        let st = self.wait();
        self.leave_rest = st.is_ok();
        st
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if !self.leave_rest {
            self.kill();
        }
        if self.status.is_none() {
            // The leader was just SIGKILLed (its group was), so this is short.
            if let Err(e) = self.wait() {
                log::warn!("cannot reap process {}: {e}", self.id());
                disown(self.id());
            }
        }
    }
}

/// What [`ProcessGroup::spawn_piped`] starts.
pub struct Spawn<'a> {
    pub program: &'a Path,
    /// The arguments after the program's name.
    pub args: &'a [String],
    pub env: &'a ChildEnv,
    /// Variables set on top of `env` (replacing its own of the same name).
    pub set: &'a [(String, String)],
    pub cwd: &'a Path,
}

/// A child [`ProcessGroup::spawn_piped`] started, and its three pipes.
pub struct Piped {
    pub group: ProcessGroup,
    pub stdin: File,
    pub stdout: File,
    pub stderr: File,
}

/// An environment for children, as `envp` wants it (`NAME=value`), built
/// once: hive never changes its own environment (`sys::env`), so what a
/// child inherits is the same at every spawn.
pub struct ChildEnv {
    /// Each variable with the length of its name.
    vars: Vec<(CString, usize)>,
}

impl ChildEnv {
    /// This process's environment, less the variables `keep` refuses.
    pub fn inherited(keep: impl Fn(&OsStr) -> bool) -> ChildEnv {
        let vars = std::env::vars_os()
            .filter(|(k, _)| keep(k))
            .filter_map(|(k, v)| {
                let mut var = k.into_encoded_bytes();
                let name = var.len();
                var.push(b'=');
                var.extend(v.into_encoded_bytes());
                Some((CString::new(var).ok()?, name))
            })
            .collect();
        ChildEnv { vars }
    }

    /// Its `NAME=value` strings, less those named in `set`.
    fn except<'a>(&'a self, set: &'a [(String, String)]) -> impl Iterator<Item = &'a CString> + 'a {
        self.vars
            .iter()
            .filter(|(var, name)| {
                let name = &var.as_bytes()[..*name];
                !set.iter().any(|(k, _)| k.as_bytes() == name)
            })
            .map(|(var, _)| var)
    }
}

/// `posix_spawn` (or `posix_spawnp` when `search`) of `program` with `argv`
/// and `envp` (both null-terminated), in `cwd`, with `stdio` as its
/// descriptors 0, 1 and 2, as the leader of a new process group, its signal
/// mask empty and `SIGPIPE` at its default; its pid.
fn posix_spawn(
    program: &CString,
    search: bool,
    argv: &[*const c_char],
    envp: &[*const c_char],
    cwd: &CString,
    stdio: [i32; 3],
) -> io::Result<u32> {
    /// The file actions and attributes, destroyed on every way out.
    struct Setup {
        actions: libc::posix_spawn_file_actions_t,
        attr: libc::posix_spawnattr_t,
    }
    impl Drop for Setup {
        fn drop(&mut self) {
            // SAFETY: both were initialised (`Setup` exists only then) and are
            // destroyed once.
            unsafe {
                libc::posix_spawn_file_actions_destroy(&mut self.actions);
                libc::posix_spawnattr_destroy(&mut self.attr);
            }
        }
    }
    let check = |rc: i32| match rc {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    };
    // SAFETY: zeroed file actions and attributes are only passed to their
    // init functions, which must succeed before `Setup` owns them; every
    // pointer handed to libc (the C strings, the null-terminated argv and
    // envp, the sigsets, the pid) lives across the calls that read it.
    unsafe {
        let mut actions = std::mem::zeroed::<libc::posix_spawn_file_actions_t>();
        check(libc::posix_spawn_file_actions_init(&mut actions))?;
        let mut attr = std::mem::zeroed::<libc::posix_spawnattr_t>();
        if let Err(e) = check(libc::posix_spawnattr_init(&mut attr)) {
            libc::posix_spawn_file_actions_destroy(&mut actions);
            return Err(e);
        }
        let mut s = Setup { actions, attr };
        for (fd, to) in stdio.into_iter().zip(0..) {
            check(libc::posix_spawn_file_actions_adddup2(
                &mut s.actions,
                fd,
                to,
            ))?;
        }
        check(libc::posix_spawn_file_actions_addchdir_np(
            &mut s.actions,
            cwd.as_ptr(),
        ))?;
        let mut none = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut none);
        check(libc::posix_spawnattr_setsigmask(&mut s.attr, &none))?;
        let mut pipe = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        check(libc::posix_spawnattr_setsigdefault(&mut s.attr, &pipe))?;
        check(libc::posix_spawnattr_setpgroup(&mut s.attr, 0))?;
        let flags = libc::POSIX_SPAWN_SETPGROUP
            | libc::POSIX_SPAWN_SETSIGDEF
            | libc::POSIX_SPAWN_SETSIGMASK;
        check(libc::posix_spawnattr_setflags(&mut s.attr, flags as _))?;
        let mut pid: libc::pid_t = 0;
        let spawn = if search {
            libc::posix_spawnp
        } else {
            libc::posix_spawn
        };
        check(spawn(
            &mut pid,
            program.as_ptr(),
            &s.actions,
            &s.attr,
            argv.as_ptr() as *const *mut c_char,
            envp.as_ptr() as *const *mut c_char,
        ))?;
        Ok(pid as u32)
    }
}

/// Reaps child `pid`: waits for it when `block`, else only if it has
/// exited (`None` while it runs).
fn reap(pid: u32, block: bool) -> io::Result<Option<ExitStatus>> {
    let flags = if block { 0 } else { libc::WNOHANG };
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int we own.
        let rc = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, flags) };
        match rc {
            0 => return Ok(None),
            -1 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            _ => return Ok(Some(ExitStatus::from_raw(status))),
        }
    }
}

/// The children this process started and has not reaped yet: every spawn
/// of this module adds its child under the lock, held across the spawn, and
/// its reaping takes it out. What is not here and is a child of this process
/// is an orphan the kernel handed it (as PID 1 of a namespace) and
/// [`sweep_orphans`] reaps. A child another way started (std's `Command`
/// alone) would be taken for one: every child of a process that can be a
/// PID 1 (`hive serve`, `hive bash-daemon`) is started here.
static OWNED: Mutex<Vec<u32>> = Mutex::new(Vec::new());

fn owned() -> std::sync::MutexGuard<'static, Vec<u32>> {
    OWNED.lock().unwrap_or_else(|p| p.into_inner())
}

/// `pid` was reaped: it is no child of ours any more.
fn disown(pid: u32) {
    let mut owned = owned();
    if let Some(i) = owned.iter().position(|p| *p == pid) {
        owned.swap_remove(i);
    }
}

/// Reaps every exited child of this process that it did not start (see
/// [`OWNED`]): as PID 1 of a PID namespace it inherits every orphan there,
/// and each one that exits stays a zombie until it is reaped. Reads the
/// `/proc` of that namespace for zombies whose parent is this process;
/// never touches a child of its own (its owner reaps it and reads its
/// status). Returns how many it reaped.
pub fn sweep_orphans() -> usize {
    let me = std::process::id();
    let owned = owned();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut reaped = 0;
    for e in dir.filter_map(Result::ok) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me || owned.contains(&pid) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid …": the name may hold anything, so the
        // fields are read after the last `)`.
        let mut rest = stat[stat.rfind(')').map_or(0, |i| i + 1)..].split_whitespace();
        let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse::<u32>().ok()));
        if state == Some("Z") && ppid == Some(me) && matches!(reap(pid, false), Ok(Some(_))) {
            reaped += 1;
        }
    }
    reaped
}

/// The waiter thread of [`ProcessGroup::on_exit`], started before its child:
/// an owner that must not start a child it could not watch starts this first,
/// then the child, then hands it over with [`ExitWatch::watch`]. Dropped
/// unused, it ends its thread.
pub struct ExitWatch {
    pid: crossbeam_channel::Sender<libc::id_t>,
}

impl ExitWatch {
    /// Starts the thread `name`, which waits for its child, then until that
    /// child has exited (without reaping it), then calls `notify`.
    pub fn start(name: String, notify: impl FnOnce() + Send + 'static) -> io::Result<ExitWatch> {
        let (pid, rx) = crossbeam_channel::bounded::<libc::id_t>(1);
        std::thread::Builder::new().name(name).spawn(move || {
            if let Ok(pid) = rx.recv() {
                wait_no_reap(pid);
                notify();
            }
        })?;
        Ok(ExitWatch { pid })
    }

    /// Watches the leader of `group` from now on.
    pub fn watch(self, group: &ProcessGroup) {
        let _ = self.pid.send(group.id() as libc::id_t);
    }
}

/// How long an idle [`Worker`] thread waits for its next job before it ends.
pub const WORKER_IDLE: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send>;

/// Where a [`Worker`]'s next job is handed over: a job slot under a mutex and
/// the condition variable its thread sleeps on. Not a channel: a crossbeam
/// receive that finds nothing spins, then calls `sched_yield` four times
/// before it sleeps, and the three threads of every turn, idle for the rest
/// of it, spent about a tenth of a busy harness's samples in those yields
/// (`perf`, docs/performance.md).
///
/// A slot is reachable only through its thread's entry among the idle ones
/// or the one [`Worker`] that took that entry, and the thread ends only after
/// taking its entry out (or when a job panics, after its reservation was
/// used), so a job put in a slot always has a thread to run it.
struct Slot {
    job: Mutex<Option<Job>>,
    ready: Condvar,
}

impl Slot {
    fn job(&self) -> std::sync::MutexGuard<'_, Option<Job>> {
        self.job.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Idle worker threads, by id, each with the slot of its jobs.
struct Pool {
    idle: Mutex<Vec<(u64, Arc<Slot>)>>,
    keep: Duration,
}

impl Pool {
    const fn new(keep: Duration) -> Pool {
        Pool {
            idle: Mutex::new(Vec::new()),
            keep,
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, Vec<(u64, Arc<Slot>)>> {
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reserve(&'static self, name: &str) -> io::Result<Worker> {
        if let Some((id, slot)) = self.idle().pop() {
            return Ok(Worker {
                pool: self,
                id,
                slot: Some(slot),
            });
        }
        let slot = Arc::new(Slot {
            job: Mutex::new(None),
            ready: Condvar::new(),
        });
        let id = WORKER_IDS.fetch_add(1, Ordering::Relaxed);
        let own = Arc::clone(&slot);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || self.serve(id, own))?;
        Ok(Worker {
            pool: self,
            id,
            slot: Some(slot),
        })
    }

    /// A worker thread: its jobs, one at a time, until it sat idle for
    /// `keep` without being reserved.
    fn serve(&self, id: u64, slot: Arc<Slot>) {
        loop {
            let job = {
                let (mut job, _) = slot
                    .ready
                    .wait_timeout_while(slot.job(), self.keep, |j| j.is_none())
                    .unwrap_or_else(|p| p.into_inner());
                job.take()
            };
            match job {
                Some(job) => {
                    job();
                    self.idle().push((id, Arc::clone(&slot)));
                }
                None => {
                    let mut idle = self.idle();
                    if let Some(i) = idle.iter().position(|(x, _)| *x == id) {
                        idle.swap_remove(i);
                        return;
                    }
                    // Reserved meanwhile: its job (or its return to the idle
                    // ones) is on the way.
                }
            }
        }
    }
}

static WORKERS: Pool = Pool::new(WORKER_IDLE);
static WORKER_IDS: AtomicU64 = AtomicU64::new(0);

/// A thread that exists and waits for one job: an idle one left by an earlier
/// job, or a new one (named `name`) when none is idle. Reserving before a
/// child is started is what lets an owner refuse to start a child it could
/// not serve. After its job the thread waits [`WORKER_IDLE`] for the next
/// reservation, then ends; a reservation dropped unused leaves it idle. A
/// reused thread keeps the name it was started with.
pub struct Worker {
    pool: &'static Pool,
    id: u64,
    slot: Option<Arc<Slot>>,
}

impl Worker {
    /// An idle thread, or a new one named `name`.
    pub fn reserve(name: &str) -> io::Result<Worker> {
        WORKERS.reserve(name)
    }

    /// Runs `job` on the reserved thread.
    pub fn run(mut self, job: impl FnOnce() + Send + 'static) {
        if let Some(slot) = self.slot.take() {
            *slot.job() = Some(Box::new(job));
            slot.ready.notify_one();
        }
    }
}

impl Drop for Worker {
    /// Unused: the thread goes back to the idle ones.
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            self.pool.idle().push((self.id, slot));
        }
    }
}

/// How an owner that polls descriptors learns that its child exited, without
/// reaping it (the pid stays the owner's until it reaps): a descriptor that
/// becomes readable, or hangs up, once the child has exited. That is a pidfd
/// where the kernel gives one (Linux 5.3 and later, with no seccomp filter
/// refusing `pidfd_open`); elsewhere it is the read end of a pipe whose
/// write end an [`ExitWatch`] closes once the child has exited. Made before
/// the child is started ([`ExitNotice::prepare`]), so the waiter thread,
/// when one is needed, exists before there is a child to watch.
pub struct ExitNotice {
    /// The waiter and its pipe's read end, where pidfds cannot be had.
    waiter: Option<(ExitWatch, OwnedFd)>,
}

impl ExitNotice {
    /// A notice for the next child: a pidfd where this host gives them, or
    /// a waiter thread named `name` (started now) and its pipe.
    pub fn prepare(name: &str) -> io::Result<ExitNotice> {
        if pidfds_work() {
            Ok(ExitNotice { waiter: None })
        } else {
            ExitNotice::with_waiter(name)
        }
    }

    /// A notice through a waiter thread and a pipe, whatever the host gives
    /// (what [`ExitNotice::prepare`] falls back to).
    pub fn with_waiter(name: &str) -> io::Result<ExitNotice> {
        let (read, write) = super::fd::pipe()?;
        let watch = ExitWatch::start(name.into(), move || drop(write))?;
        Ok(ExitNotice {
            waiter: Some((watch, read)),
        })
    }

    /// The descriptor that tells when the leader of `group`, just started,
    /// has exited. Only a pidfd can fail here (the process is out of
    /// descriptors).
    pub fn watch(self, group: &ProcessGroup) -> io::Result<OwnedFd> {
        match self.waiter {
            Some((watch, read)) => {
                watch.watch(group);
                Ok(read)
            }
            None => pidfd_open(group.id()),
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
    // SAFETY: a descriptor just returned by the kernel, open and ours.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Whether this host gives pidfds, asked once (of this process's own pid):
/// a kernel before 5.3 says ENOSYS, a container's seccomp filter may say
/// EPERM.
fn pidfds_work() -> bool {
    static WORK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WORK.get_or_init(|| match pidfd_open(std::process::id()) {
        Ok(_) => true,
        Err(e) => {
            log::info!("no pidfds here ({e}): a waiter thread watches each child's exit");
            false
        }
    })
}

/// Makes the child `cmd` starts get `parent_death_signal` when the thread that
/// spawned it dies (`PR_SET_PDEATHSIG`) and run with `umask`.
pub fn child_setup(cmd: &mut Command, parent_death_signal: i32, umask: u32) {
    let umask = umask as libc::mode_t;
    // SAFETY: the closure runs in the forked child before exec and calls only
    // prctl and umask, which are async-signal-safe and allocate nothing.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, parent_death_signal);
            libc::umask(umask);
            Ok(())
        });
    }
}

/// Makes `cmd`'s child keep descriptor `fd` of this process, under the same
/// number, across its exec: the descriptor stays close-on-exec here (so no
/// other child of this multi-threaded process gets it), and only the forked
/// child clears the flag.
pub fn pass_fd(cmd: &mut Command, fd: std::os::fd::RawFd) {
    // SAFETY: the closure runs in the forked child before exec and calls only
    // fcntl, which is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// SIGKILLs process group `pgid` (one recorded by an earlier run, say). A group
/// that is gone is fine; `pgid` 0 or 1 is refused.
pub fn kill_group(pgid: i32) {
    signal_group(pgid, libc::SIGKILL);
}

fn signal_group(pgid: i32, sig: i32) {
    if pgid <= 1 {
        log::error!("refusing to signal process group {pgid}");
        return;
    }
    // SAFETY: kill(2) has no memory effects; a negative pid names a group.
    if unsafe { libc::kill(-pgid, sig) } != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ESRCH) {
            log::warn!("cannot signal process group {pgid}: {e}");
        }
    }
}

/// Blocks until child `pid` has exited (or is no child of ours any more),
/// leaving it for its owner to reap.
fn wait_no_reap(pid: libc::id_t) {
    loop {
        // SAFETY: waitid writes one siginfo_t we own; WNOWAIT leaves the child
        // waitable.
        let rc = unsafe {
            let mut info = std::mem::zeroed::<libc::siginfo_t>();
            libc::waitid(libc::P_PID, pid, &mut info, libc::WEXITED | libc::WNOWAIT)
        };
        if rc == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Why [`run_with_timeout`] has no output to give.
#[derive(Debug)]
pub enum RunError {
    /// The program could not be started (missing, not executable, no resources).
    Start(io::Error),
    /// It ran past the limit; its group was killed.
    TimedOut(Duration),
    /// It could not be waited for.
    Wait(io::Error),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::Start(e) => write!(f, "cannot be started: {e}"),
            RunError::TimedOut(d) => write!(f, "did not finish within {} s", d.as_secs()),
            RunError::Wait(e) => write!(f, "could not be waited for: {e}"),
        }
    }
}

/// The most of each output stream [`run_with_timeout`] keeps; the rest is read
/// and dropped, so a chatty command never blocks on a full pipe.
pub const OUTPUT_MAX: usize = 4 << 20;

/// Runs `cmd` in its own process group with stdin from /dev/null and both
/// outputs captured (each up to [`OUTPUT_MAX`]), until it exits or `limit`
/// passes; then the group is SIGKILLed and the leader reaped either way.
pub fn run_with_timeout(cmd: &mut Command, limit: Duration) -> Result<Output, RunError> {
    let deadline = Instant::now() + limit;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let name = cmd
        .get_program()
        .to_string_lossy()
        .rsplit('/')
        .next()
        .unwrap_or("child")
        .chars()
        .take(8)
        .collect::<String>();
    let mut group = ProcessGroup::spawn(cmd).map_err(RunError::Start)?;
    let (exited_tx, exited) = crossbeam_channel::bounded::<()>(1);
    let out = drain(
        &name,
        "out",
        group.child_mut().and_then(|c| c.stdout.take()),
    );
    let err = drain(
        &name,
        "err",
        group.child_mut().and_then(|c| c.stderr.take()),
    );
    group
        .on_exit(format!("{name}-wait"), move || {
            let _ = exited_tx.send(());
        })
        .map_err(RunError::Wait)?;
    if exited.recv_deadline(deadline).is_err() {
        // `group` is dropped on return: the group is killed and the leader reaped.
        return Err(RunError::TimedOut(limit));
    }
    let status = group.wait().map_err(RunError::Wait)?;
    // Whatever the leader left in its group goes now, which closes the pipes.
    group.kill();
    let grace = deadline.max(Instant::now() + Duration::from_secs(1));
    Ok(Output {
        status,
        stdout: out.recv_deadline(grace).unwrap_or_default(),
        stderr: err.recv_deadline(grace).unwrap_or_default(),
    })
}

/// Reads `pipe` to its end on a thread of its own; the bytes (at most
/// [`OUTPUT_MAX`]) arrive on the returned channel.
fn drain(
    name: &str,
    which: &str,
    pipe: Option<impl Read + Send + 'static>,
) -> crossbeam_channel::Receiver<Vec<u8>> {
    let (tx, rx) = crossbeam_channel::bounded(1);
    let Some(mut pipe) = pipe else {
        let _ = tx.send(Vec::new());
        return rx;
    };
    let spawned = std::thread::Builder::new()
        .name(format!("{name}-{which}"))
        .spawn(move || {
            let mut kept = Vec::new();
            let mut buf = [0u8; 8192];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let room = OUTPUT_MAX.saturating_sub(kept.len());
                        kept.extend_from_slice(&buf[..n.min(room)]);
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = tx.send(kept);
        });
    if let Err(e) = spawned {
        log::warn!("cannot start a thread to read {name}'s std{which}: {e}");
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn gone(pid: i32) -> bool {
        // SAFETY: signal 0 only checks that the process or group exists.
        unsafe { libc::kill(pid, 0) != 0 }
    }

    #[test]
    fn dropping_a_group_kills_every_process_in_it_and_reaps_the_leader() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "sleep 30 & sleep 30 & wait"]);
        let group = ProcessGroup::spawn(&mut cmd).unwrap();
        let pgid = group.id() as i32;
        std::thread::sleep(Duration::from_millis(100));
        assert!(!gone(-pgid), "the group runs");
        drop(group);
        let end = Instant::now() + Duration::from_secs(5);
        while !gone(-pgid) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(gone(-pgid), "no process of the group is left");
        assert!(gone(pgid), "the leader was reaped, not left a zombie");
    }

    #[test]
    fn a_piped_spawn_gets_the_built_environment_its_pipes_and_a_group_of_its_own() {
        let dir = std::env::temp_dir().join(format!("hv-spawn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // PATH stays (`sh` is looked up in it); HOME is left out and set again.
        let env = ChildEnv::inherited(|k| k != "HOME");
        let script = r#"read line; echo "in:$line"; echo "home:${HOME-unset}"; echo "x:$HV_X"; pwd; echo oops >&2; exit 7"#;
        let args = ["-c".to_string(), script.to_string()];
        let set = [
            ("HV_X".to_string(), "one two".to_string()),
            ("HOME".to_string(), "/nowhere".to_string()),
        ];
        let Piped {
            mut group,
            mut stdin,
            mut stdout,
            mut stderr,
        } = ProcessGroup::spawn_piped(&Spawn {
            program: Path::new("sh"),
            args: &args,
            env: &env,
            set: &set,
            cwd: &dir,
        })
        .unwrap();
        assert!(group.child_mut().is_none());
        use std::io::Write;
        stdin.write_all(b"hello\n").unwrap();
        drop(stdin);
        let (mut out, mut err) = (String::new(), String::new());
        stdout.read_to_string(&mut out).unwrap();
        stderr.read_to_string(&mut err).unwrap();
        let st = group.wait().unwrap();
        assert_eq!(st.code(), Some(7));
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[..4],
            [
                "in:hello",
                "home:/nowhere",
                "x:one two",
                &*dir.display().to_string()
            ]
        );
        assert_eq!(lines.len(), 4, "{out}");
        assert_eq!(err, "oops\n");
        let _ = std::fs::remove_dir_all(&dir);
        // What the program runs with, read by the program itself (a shell
        // would show its own transient mask while it waits for a child).
        let args = [
            "/proc/self/stat".to_string(),
            "/proc/self/status".to_string(),
        ];
        let mut p = ProcessGroup::spawn_piped(&Spawn {
            program: Path::new("cat"),
            args: &args,
            env: &env,
            set: &[],
            cwd: Path::new("/"),
        })
        .unwrap();
        drop(p.stdin);
        let mut out = String::new();
        p.stdout.read_to_string(&mut out).unwrap();
        assert!(p.group.wait().unwrap().success());
        // /proc/PID/stat: "pid (comm) state ppid pgrp ...".
        let after_comm = &out[out.find(") ").unwrap() + 2..];
        let pgrp: u32 = after_comm.split(' ').nth(2).unwrap().parse().unwrap();
        assert_eq!(pgrp, p.group.id(), "a group of its own");
        let mask = |name: &str| {
            let l = out.lines().find(|l| l.starts_with(name)).unwrap();
            u64::from_str_radix(l[name.len()..].trim(), 16).unwrap()
        };
        // No signal blocked, SIGPIPE (13) at its default.
        assert_eq!(mask("SigBlk:"), 0);
        assert_eq!(mask("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0);
    }

    #[test]
    fn a_piped_spawn_that_cannot_start_says_why() {
        let env = ChildEnv::inherited(|_| true);
        let spawn = |program: &str, cwd: &str| {
            ProcessGroup::spawn_piped(&Spawn {
                program: Path::new(program),
                args: &[],
                env: &env,
                set: &[],
                cwd: Path::new(cwd),
            })
            .map(|_| ())
            .unwrap_err()
        };
        assert_eq!(
            spawn("/nonexistent/claude", "/").kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            spawn("no-such-program-hv", "/").kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(
            spawn("sh", "/nonexistent-dir").kind(),
            io::ErrorKind::NotFound
        );
        let nul = ProcessGroup::spawn_piped(&Spawn {
            program: Path::new("sh"),
            args: &["a\0b".to_string()],
            env: &env,
            set: &[],
            cwd: Path::new("/"),
        })
        .map(|_| ())
        .unwrap_err();
        assert_eq!(nul.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(
            nul.to_string(),
            "argument 1 holds a NUL byte, which no program can be given"
        );
        // A variable's value (a token) is never in the error.
        let secret = ProcessGroup::spawn_piped(&Spawn {
            program: Path::new("sh"),
            args: &[],
            env: &env,
            set: &[("ANTHROPIC_API_KEY".to_string(), "sk-se\0cret".to_string())],
            cwd: Path::new("/"),
        })
        .map(|_| ())
        .unwrap_err()
        .to_string();
        assert!(!secret.contains("sk-se"), "{secret}");
        assert!(secret.contains("ANTHROPIC_API_KEY"), "{secret}");
    }

    #[test]
    fn an_exit_is_an_event_and_the_pid_stays_the_owners_until_it_reaps() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "exit 3"]);
        let mut group = ProcessGroup::spawn(&mut cmd).unwrap();
        let (tx, rx) = crossbeam_channel::bounded(1);
        group
            .on_exit("test-wait".into(), move || {
                let _ = tx.send(());
            })
            .unwrap();
        rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(
            !gone(group.id() as i32),
            "a zombie until its owner reaps it"
        );
        assert_eq!(group.try_wait().unwrap().and_then(|s| s.code()), Some(3));
    }

    #[test]
    fn waiting_leaving_the_rest_keeps_background_processes() {
        let dir = std::env::temp_dir().join(format!("hive-pg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let pid_file = dir.join("pid");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("sleep 30 & echo $! > {}", pid_file.display()));
        let group = ProcessGroup::spawn(&mut cmd).unwrap();
        assert!(group.wait_leaving_rest().unwrap().success());
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(!gone(pid), "the background sleep outlives its shell");
        // SAFETY: ending the sleep this test started.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn run_with_timeout_captures_both_outputs_or_kills_at_the_limit() {
        let out = run_with_timeout(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 4"]),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(out.status.code(), Some(4));
        assert_eq!(
            (out.stdout.as_slice(), out.stderr.as_slice()),
            (&b"out\n"[..], &b"err\n"[..])
        );
        let e = run_with_timeout(
            Command::new("sh").args(["-c", "sleep 30 & sleep 30"]),
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(matches!(e, RunError::TimedOut(_)), "{e}");
        let missing = run_with_timeout(
            &mut Command::new("/nonexistent/hive-no-such-program"),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(matches!(missing, RunError::Start(_)), "{missing}");
    }

    /// The thread a job ran on, by its kernel id.
    fn tid() -> i64 {
        // SAFETY: gettid has no memory effects.
        unsafe { libc::syscall(libc::SYS_gettid) }
    }

    fn job_on(w: Worker) -> i64 {
        let (tx, rx) = crossbeam_channel::bounded(1);
        w.run(move || {
            let _ = tx.send(tid());
        });
        rx.recv_timeout(Duration::from_secs(10)).unwrap()
    }

    fn wait_idle(pool: &Pool, n: usize) {
        let until = Instant::now() + Duration::from_secs(10);
        while pool.idle().len() != n {
            assert!(
                Instant::now() < until,
                "{} idle, not {n}",
                pool.idle().len()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn workers_serve_the_next_job_on_the_same_thread_and_end_when_idle() {
        let pool: &'static Pool = Box::leak(Box::new(Pool::new(Duration::from_secs(2))));
        let first = job_on(pool.reserve("test-worker").unwrap());
        wait_idle(pool, 1);
        // Two at once: the idle thread and a new one.
        let (a, b) = (
            pool.reserve("test-worker").unwrap(),
            pool.reserve("test-worker").unwrap(),
        );
        assert_eq!(pool.idle().len(), 0);
        let (ta, tb) = (job_on(a), job_on(b));
        assert!(ta == first || tb == first, "{first} reused: {ta} {tb}");
        assert_ne!(ta, tb);
        wait_idle(pool, 2);
        // A reservation dropped unused leaves its thread idle, still there.
        drop(pool.reserve("test-worker").unwrap());
        assert_eq!(pool.idle().len(), 2);
        // Idle past `keep`, every thread ends.
        wait_idle(pool, 0);
        std::thread::sleep(Duration::from_millis(50));
        for t in [ta, tb] {
            let alive = std::path::Path::new(&format!("/proc/self/task/{t}")).exists();
            assert!(!alive, "thread {t} ended");
        }
        // And a reservation then starts a new one.
        let later = job_on(pool.reserve("test-worker").unwrap());
        assert!(later != ta && later != tb);
    }
}
