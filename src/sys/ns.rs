//! The system calls of the agent sandbox (`fleet::sandbox`, which holds its
//! logic): [`clone_exec`], which starts a program as PID 1 of new namespaces
//! from a multi-threaded process; namespaces, mounts, capabilities; and the
//! process primitives of a single-threaded process that forks its own PID 1
//! and forwards signals to it (a signal set it blocks and takes with
//! `sigtimedwait`, `waitpid`, `_exit`). Each function is one or two calls with
//! its `SAFETY` note; errors name the call. [`fork`] refuses to run in a
//! process with more than one thread.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

/// A path as a C string; a path with a NUL cannot name a file.
pub fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} contains a NUL", p.display()),
        )
    })
}

/// `unshare(2)`: new mount and PID namespaces, and a user namespace with `user`.
pub fn unshare(user: bool) -> io::Result<()> {
    let mut flags = libc::CLONE_NEWNS | libc::CLONE_NEWPID;
    if user {
        flags |= libc::CLONE_NEWUSER;
    }
    // SAFETY: unshare(2) changes only this process's namespaces.
    if unsafe { libc::unshare(flags) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `mount(2)`; `flags` are `libc::MS_*`.
pub fn mount(
    src: &CStr,
    target: &Path,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
) -> io::Result<()> {
    let t = cpath(target)?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call, or null.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            t.as_ptr(),
            fstype.map_or(std::ptr::null(), CStr::as_ptr),
            flags,
            data.map_or(std::ptr::null(), |d| d.as_ptr().cast()),
        )
    };
    if rc == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Opens `path` with `O_PATH` (a handle for a later bind mount, not for I/O).
pub fn open_path(path: &Path) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    // SAFETY: `c` is NUL-terminated; the new descriptor is owned below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd == -1 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Empties the capability bounding set, so no program this process runs can
/// gain a capability again (for root, exec would otherwise grant them all).
pub fn drop_bounding_set() -> io::Result<()> {
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) } == -1 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                break; // past the last capability this kernel knows
            }
            return Err(io::Error::new(
                e.kind(),
                format!("cannot drop capability {cap}: {e}"),
            ));
        }
    }
    Ok(())
}

/// Clears this process's capabilities: effective, permitted, inheritable and
/// ambient.
pub fn clear_capabilities() -> io::Result<()> {
    let header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: prctl with integer arguments; capset(2) reads a version-3 header and
    // two data structs, which live until it returns.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        );
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) == -1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Asks the kernel to send this process `sig` when its parent dies.
pub fn set_parent_death_signal(sig: i32) {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig, 0, 0, 0) };
}

/// This process's pid.
pub fn getpid() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { libc::getpid() }
}

/// Which side of a [`fork`] this is.
pub enum Forked {
    Child,
    Parent(libc::pid_t),
}

/// `fork(2)`, refused (with an error) unless this process has exactly one
/// thread: only then may the child do anything it likes before it execs.
pub fn fork() -> io::Result<Forked> {
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(io::Error::other(format!(
            "refusing to fork a process with {threads} threads"
        )));
    }
    // SAFETY: the process is single-threaded (checked above), so the child may
    // run arbitrary code.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(pid)),
    }
}

/// Leaves the process at once with `code`, without running exit hooks (the
/// way out of a forked child).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) ends the process; nothing of it is used afterwards.
    unsafe { libc::_exit(code) }
}

/// Sends `sig` to process `pid` (a child of ours, not reaped yet).
pub fn kill(pid: libc::pid_t, sig: i32) {
    // SAFETY: kill(2) has no memory effects.
    unsafe { libc::kill(pid, sig) };
}

/// A set of signals.
pub struct SignalSet(libc::sigset_t);

impl SignalSet {
    pub fn new(signals: &[i32]) -> SignalSet {
        // SAFETY: sigemptyset initialises the set before sigaddset uses it.
        unsafe {
            let mut set = std::mem::zeroed::<libc::sigset_t>();
            libc::sigemptyset(&mut set);
            for s in signals {
                libc::sigaddset(&mut set, *s);
            }
            SignalSet(set)
        }
    }

    /// Blocks these signals (they stay pending for [`SignalSet::wait`]).
    pub fn block(&self) {
        self.mask(libc::SIG_BLOCK);
    }

    /// Unblocks these signals.
    pub fn unblock(&self) {
        self.mask(libc::SIG_UNBLOCK);
    }

    /// Makes these signals the whole mask (an empty set unblocks everything).
    pub fn set_mask(&self) {
        self.mask(libc::SIG_SETMASK);
    }

    fn mask(&self, how: libc::c_int) {
        // SAFETY: the set is initialised; the old mask is not asked for.
        unsafe { libc::pthread_sigmask(how, &self.0, std::ptr::null_mut()) };
    }

    /// Takes one pending signal of the (blocked) set, waiting up to `timeout`.
    pub fn wait(&self, timeout: Duration) -> Option<i32> {
        let t = libc::timespec {
            tv_sec: timeout.as_secs() as _,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        // SAFETY: the set is initialised; a null siginfo is allowed.
        let sig = unsafe { libc::sigtimedwait(&self.0, std::ptr::null_mut(), &t) };
        (sig > 0).then_some(sig)
    }
}

/// What [`reap`] found.
pub enum Reaped {
    /// A child exited: its pid and wait status.
    Child(libc::pid_t, libc::c_int),
    /// None has exited yet.
    None,
    /// There is no child to wait for.
    NoChildren,
}

/// `waitpid(which, WNOHANG)`: `which` is a pid, or -1 for any child.
pub fn reap(which: libc::pid_t) -> Reaped {
    let mut st = 0;
    // SAFETY: waitpid writes the status into a local.
    let pid = unsafe { libc::waitpid(which, &mut st, libc::WNOHANG) };
    match pid {
        p if p > 0 => Reaped::Child(p, st),
        -1 if io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) => Reaped::NoChildren,
        _ => Reaped::None,
    }
}

/// Ends this process by `sig` (its default action, unblocked), as a child ended
/// by it would; returns only if `sig` does not end a process.
pub fn die_by(sig: i32) {
    // SAFETY: restoring the default action of `sig`, then raising it.
    unsafe { libc::signal(sig, libc::SIG_DFL) };
    SignalSet::new(&[sig]).unblock();
    // SAFETY: raise(3) with a valid signal number.
    unsafe { libc::raise(sig) };
}

/// What the child of [`clone_exec`] is given, all of it made before the clone
/// (the child allocates nothing).
pub struct CloneExec<'a> {
    /// The program, by path (not looked up in `PATH`).
    pub program: &'a CStr,
    /// Its arguments, the first its name, null-terminated.
    pub argv: &'a [*const libc::c_char],
    /// Its whole environment (`NAME=value`), null-terminated.
    pub envp: &'a [*const libc::c_char],
    /// Its descriptors 0, 1 and 2.
    pub stdio: [RawFd; 3],
    /// Descriptors it keeps under the same number (close-on-exec here).
    pub keep: &'a [RawFd],
    /// A new user namespace as well (the other two need none as root).
    pub userns: bool,
    /// Sent to it when the thread that spawned it dies (`PR_SET_PDEATHSIG`).
    pub parent_death_signal: i32,
    pub umask: u32,
}

/// Starts `c.program` as PID 1 of new PID and mount namespaces (and a new
/// user namespace with `c.userns`), the leader of a new process group, and
/// returns its pid (as this process sees it) once it has exec'd. `clone(2)`
/// with fork semantics (no shared memory), safe in a multi-threaded process:
/// between the clone and the exec the child makes only async-signal-safe
/// system calls — every handled signal back to its default and the mask
/// emptied (no handler of this process runs in it), its process group, its
/// parent-death signal and umask, its descriptors, and, in a new user
/// namespace, every capability it has there raised into its ambient set, so
/// the program keeps them across the exec though its uid is not 0 there
/// (the program must then write its uid and gid maps itself, and clear the
/// capabilities before it runs anything else). A step that fails is sent
/// back on a close-on-exec pipe and is this function's error; the child is
/// then reaped.
pub fn clone_exec(c: &CloneExec) -> io::Result<libc::pid_t> {
    let (err_r, err_w) = super::fd::pipe()?;
    let mut flags = libc::CLONE_NEWPID | libc::CLONE_NEWNS | libc::SIGCHLD;
    if c.userns {
        flags |= libc::CLONE_NEWUSER;
    }
    // SAFETY: the sets are initialised before use; blocking every signal on
    // this thread across the clone keeps a handler from running in the child
    // before it has reset it (it would write to this process's pipes); the
    // old mask is put back right after.
    let old = unsafe {
        let mut all = std::mem::zeroed::<libc::sigset_t>();
        let mut old = std::mem::zeroed::<libc::sigset_t>();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        old
    };
    // SAFETY: clone with no new stack and no CLONE_VM is fork(2) with
    // namespace flags; the child runs only `after_clone`, which makes
    // async-signal-safe system calls on memory prepared before and never
    // returns.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    if pid == 0 {
        after_clone(c, err_w.as_raw_fd());
    }
    let clone_err = io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(err_w);
    if pid < 0 {
        return Err(io::Error::new(
            clone_err.kind(),
            format!("clone: {clone_err}"),
        ));
    }
    let pid = pid as libc::pid_t;
    let mut report = [0u8; 8];
    let mut got = 0;
    let mut f = std::fs::File::from(err_r);
    while got < report.len() {
        match std::io::Read::read(&mut f, &mut report[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    if got == 0 {
        return Ok(pid); // the pipe closed on exec
    }
    let mut st = 0;
    // SAFETY: waitpid writes one int we own; the child is ours and exits.
    while unsafe { libc::waitpid(pid, &mut st, 0) } == -1
        && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted
    {}
    let step = i32::from_ne_bytes([report[0], report[1], report[2], report[3]]);
    let errno = i32::from_ne_bytes([report[4], report[5], report[6], report[7]]);
    let e = io::Error::from_raw_os_error(errno);
    let what = STEPS.get(step as usize).copied().unwrap_or("start");
    Err(io::Error::new(e.kind(), format!("cannot {what}: {e}")))
}

/// What the child of [`clone_exec`] was doing when it failed, by index.
const STEPS: [&str; 6] = [
    "set the process group",
    "set the standard descriptors",
    "keep a descriptor",
    "raise the capabilities into the ambient set",
    "run the program (execve)",
    "set the parent-death signal",
];

/// The child of [`clone_exec`]: async-signal-safe calls only, then exec.
fn after_clone(c: &CloneExec, err: RawFd) -> ! {
    let fail = |step: i32| -> ! {
        // SAFETY: errno, write(2) of a local array and _exit(2), all
        // async-signal-safe.
        unsafe {
            let errno = *libc::__errno_location();
            let mut buf = [0u8; 8];
            let (s, e) = (step.to_ne_bytes(), errno.to_ne_bytes());
            let mut i = 0;
            while i < 4 {
                buf[i] = s[i];
                buf[i + 4] = e[i];
                i += 1;
            }
            libc::write(err, buf.as_ptr().cast(), 8);
            libc::_exit(127)
        }
    };
    // SAFETY: sigaction, setpgid, prctl, umask, dup2, fcntl, capget/capset
    // and execve are system calls, async-signal-safe; every pointer is to
    // memory of the parent's copy, prepared before the clone, or a local.
    unsafe {
        for sig in 1..65 {
            let mut old = std::mem::zeroed::<libc::sigaction>();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0
                && (old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN
                    || sig == libc::SIGPIPE)
            {
                let mut dfl = std::mem::zeroed::<libc::sigaction>();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &dfl, std::ptr::null_mut());
            }
        }
        if libc::setpgid(0, 0) != 0 {
            fail(0);
        }
        if libc::prctl(libc::PR_SET_PDEATHSIG, c.parent_death_signal, 0, 0, 0) != 0 {
            fail(5);
        }
        libc::umask(c.umask as libc::mode_t);
        for (fd, to) in c.stdio.iter().zip(0..) {
            let rc = if *fd == to {
                libc::fcntl(to, libc::F_SETFD, 0)
            } else {
                libc::dup2(*fd, to)
            };
            if rc == -1 {
                fail(1);
            }
        }
        for fd in c.keep {
            if libc::fcntl(*fd, libc::F_SETFD, 0) != 0 {
                fail(2);
            }
        }
        if c.userns && raise_ambient().is_err() {
            fail(3);
        }
        let mut none = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut none);
        libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
        libc::execve(c.program.as_ptr(), c.argv.as_ptr(), c.envp.as_ptr());
        fail(4)
    }
}

/// The version-3 header and data of capget(2) and capset(2).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_VERSION_3: u32 = 0x2008_0522;

/// Makes every permitted capability inheritable and raises it into the
/// ambient set. System calls only (the child of [`clone_exec`] calls it).
fn raise_ambient() -> Result<(), ()> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capget/capset read and write a version-3 header and two data
    // structs, locals that outlive the calls; prctl takes integers.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) == -1 {
            return Err(());
        }
        for d in data.iter_mut() {
            d.inheritable = d.permitted;
        }
        if libc::syscall(libc::SYS_capset, &header, data.as_ptr()) == -1 {
            return Err(());
        }
        for cap in 0..64 {
            let rc = libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_RAISE, cap, 0, 0);
            if rc == -1 {
                if *libc::__errno_location() == libc::EINVAL {
                    break; // past the last capability this kernel knows
                }
                return Err(());
            }
        }
    }
    Ok(())
}
