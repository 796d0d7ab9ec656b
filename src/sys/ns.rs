//! The system calls of the agent sandbox (`fleet::sandbox`, which holds its
//! logic): [`clone_exec`], which starts a program as PID 1 of new namespaces
//! from a multi-threaded process; mounts and capabilities, which `hive
//! __sandbox --in-place` makes there before it execs the agent; a signal set
//! to block or set as the mask (`sys::signals` blocks SIGCHLD with it), and
//! `_exit`. Each function is one or two calls with its `SAFETY` note; errors
//! name the call.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// A path as a C string; a path with a NUL cannot name a file.
pub fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} contains a NUL", p.display()),
        )
    })
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

/// This process's pid.
pub fn getpid() -> i32 {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { libc::getpid() }
}

/// Leaves the process at once with `code`, without running exit hooks (the
/// sandbox's way out when it cannot exec the agent).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) ends the process; nothing of it is used afterwards.
    unsafe { libc::_exit(code) }
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

    /// Blocks these signals.
    pub fn block(&self) {
        self.mask(libc::SIG_BLOCK);
    }

    /// Makes these signals the whole mask (an empty set unblocks everything).
    pub fn set_mask(&self) {
        self.mask(libc::SIG_SETMASK);
    }

    fn mask(&self, how: libc::c_int) {
        // SAFETY: the set is initialised; the old mask is not asked for.
        unsafe { libc::pthread_sigmask(how, &self.0, std::ptr::null_mut()) };
    }
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
