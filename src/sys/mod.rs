//! The operating system, in one place: every `unsafe` of hive is in this
//! module — outside it only the vendored tiny_http and a test's `waitpid` in
//! `fleet/child.rs` — each call one libc function with its
//! `SAFETY` note, and callers get safe functions, plain values and
//! `io::Error`s. It owns the mechanisms every process uses one way:
//! [`process`] (children in their own process group, killed and reaped on drop,
//! each registered until reaped so a PID 1 reaps only the orphans it inherits;
//! run-with-timeout), [`signals`](mod@signals) (first signal forwarded, a second exits with
//! 128 + the signal), [`env`](mod@env) (settings from environment variables), [`fd`]
//! (pipes, socket options, a hang-up as an event), [`fs`] (files only their
//! owner reads, written whole), [`hash`] (SHA-256, HMAC), [`ns`] (the sandbox's
//! clone into new namespaces, mounts and capabilities) and [`start`] (the binary's start-up
//! allocator) and [`sqlite`](mod@sqlite) (sqlite's WAL hook, which rusqlite
//! does not wrap); here, the descriptor limit, the umask, the
//! effective ids and whether the process is dumpable. It imports nothing else of the crate.

pub mod env;
pub mod fd;
pub mod fs;
pub mod hash;
pub mod ns;
pub mod process;
pub mod signals;
pub mod sqlite;
pub mod start;

pub use process::{kill_group, run_with_timeout, ExitWatch, ProcessGroup, RunError};
pub use signals::signals;

use std::io;

/// Sets the process umask; returns the old one.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask(2) cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// The process umask (read by setting it and putting it back).
pub fn umask() -> u32 {
    let old = set_umask(0o022);
    set_umask(old);
    old
}

/// The effective user and group ids.
pub fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid have no arguments and cannot fail.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    effective_ids().0 == 0
}

/// The soft and hard `RLIMIT_NOFILE` of this process.
// `rlim_t` is `u64` on the 64-bit targets hive is built for, not on every libc
// target; the casts keep this API in plain `u64`.
#[allow(clippy::unnecessary_cast)]
pub fn nofile_limit() -> io::Result<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((lim.rlim_cur as u64, lim.rlim_max as u64))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit, so a long-running process
/// gets every descriptor it is allowed (systemd and most shells start services
/// at a soft 1024). An unlimited hard limit is read as the kernel's
/// `fs.nr_open`. Returns the soft limit now in force.
#[allow(clippy::unnecessary_cast)]
pub fn raise_nofile_limit() -> io::Result<u64> {
    let (soft, hard) = nofile_limit()?;
    let target = if hard == libc::RLIM_INFINITY as u64 {
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20)
    } else {
        hard
    };
    if soft >= target {
        return Ok(soft);
    }
    let lim = libc::rlimit {
        rlim_cur: target as libc::rlim_t,
        rlim_max: hard as libc::rlim_t,
    };
    // SAFETY: setrlimit reads one rlimit struct we own.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(target)
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE` 0): no process of its
/// uid without `CAP_SYS_PTRACE` may trace it, read its memory, open its
/// `/proc/PID/fd` or take a descriptor of it with `pidfd_getfd`. An exec
/// makes a process dumpable again, so a program it runs is not covered.
pub fn set_non_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    #[allow(clippy::unnecessary_cast)]
    fn the_soft_limit_ends_at_the_hard_limit() {
        let now = super::raise_nofile_limit().unwrap();
        let (soft, hard) = super::nofile_limit().unwrap();
        assert_eq!(now, soft);
        assert!(
            soft == hard || hard == libc::RLIM_INFINITY as u64,
            "{soft} {hard}"
        );
    }
}
