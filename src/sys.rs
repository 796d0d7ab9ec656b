//! Small operating-system helpers that need `unsafe` and belong to no one
//! subsystem: the process's descriptor limit. Each call is one libc function
//! with its `SAFETY` note; callers get plain values and `io::Error`s.

use std::io;

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
