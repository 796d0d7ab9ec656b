//! The system calls of the agent sandbox (`fleet::sandbox`, which holds its
//! logic): namespaces, mounts, capabilities, and the process primitives of a
//! single-threaded process that forks its own PID 1 and forwards signals to it
//! (a signal set it blocks and takes with `sigtimedwait`, `waitpid`, `_exit`).
//! Each function is one or two calls with its `SAFETY` note; errors name the
//! call. [`fork`] refuses to run in a process with more than one thread.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
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
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
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
        unsafe { libc::sigprocmask(how, &self.0, std::ptr::null_mut()) };
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
