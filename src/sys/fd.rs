//! Descriptors and sockets: a close-on-exec pipe and what is waiting in it
//! ([`unread`]), a file opened beneath a
//! directory without following a symlink on the way ([`open_beneath`]), the
//! process at the other end of a unix socket ([`peer_pid`]), a descriptor
//! passed over a unix socket ([`send_fd`], [`recv_fd`], and the
//! [`Credential`] made of them) or inherited ([`inherited_stream`]), the
//! socket options and
//! queries the web servers need (timeouts, the unsent queue, a hang-up, a
//! shutdown), [`poll`] over a few descriptors and [`Epoll`] over many (the
//! broker serves every socket of a thousand agents from one such loop: its
//! cost per wake-up is what is ready, not what is open), and [`HangupWatch`], which turns a peer hanging up
//! into an event on a channel (a thread blocked in `poll` on the socket and on
//! a cancel pipe, so it costs nothing while it waits and ends as soon as it is
//! dropped).

use crossbeam_channel::{bounded, Receiver};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Duration;

/// A pipe whose two ends are closed on exec: (read end, write end).
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills both slots on success; each is then owned exactly once.
    unsafe {
        if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])))
    }
}

/// Opens `rel`, a relative path of plain names (no `..`, no `.`, no root),
/// inside the directory `dir` for reading, walking it one component at a
/// time with `O_NOFOLLOW`: a component that is a symlink — or has become one
/// since the caller looked — fails the open (`ENOTDIR` for a directory
/// component, `ELOOP` for the last one) instead of leading out of `dir`.
/// `extra` adds open flags for the last component (`O_NONBLOCK`, say).
pub fn open_beneath(
    dir: &std::path::Path,
    rel: &std::path::Path,
    extra: libc::c_int,
) -> io::Result<std::fs::File> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Component;
    let cstr = |b: &[u8]| {
        CString::new(b)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a path"))
    };
    let names = rel
        .components()
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{} is not a path of plain names", rel.display()),
            )),
        })
        .collect::<io::Result<Vec<_>>>()?;
    let Some((last, dirs)) = names.split_last() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "an empty path"));
    };
    let walk = libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let top = cstr(dir.as_os_str().as_bytes())?;
    let open_at = |at: Option<&OwnedFd>, name: &CString, flags: libc::c_int| loop {
        let at = at.map_or(libc::AT_FDCWD, |fd| fd.as_raw_fd());
        // SAFETY: `at` is the working directory or an open directory
        // descriptor; the name is NUL-terminated.
        let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
        if fd >= 0 {
            // SAFETY: openat returned a new descriptor nothing else owns.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut at = open_at(None, &top, walk)?;
    for name in dirs {
        at = open_at(Some(&at), &cstr(name.as_bytes())?, walk)?;
    }
    let file = open_at(
        Some(&at),
        &cstr(last.as_bytes())?,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY | extra,
    )?;
    Ok(std::fs::File::from(file))
}

/// Accepts one connection of `listener`, already non-blocking and
/// close-on-exec (`accept4` with both flags: one system call where std's
/// `accept` and `set_nonblocking` take two).
pub fn accept_nonblocking(listener: &UnixListener) -> io::Result<UnixStream> {
    loop {
        // SAFETY: a valid listening fd; no address is asked for.
        let fd = unsafe {
            libc::accept4(
                listener.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if fd >= 0 {
            // SAFETY: accept4 returned a new descriptor that nothing else owns.
            return Ok(unsafe { UnixStream::from_raw_fd(fd) });
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Takes over the listening unix socket this process inherited as `fd` (an
/// agent's page under `hive up`): it is made close-on-exec at once, so no
/// program this process runs gets it, and must be a listening `AF_UNIX`
/// stream socket, or it is refused (and not taken: a number that names
/// something else is left alone).
pub fn inherited_listener(fd: RawFd) -> io::Result<UnixListener> {
    inherited_unix(fd, true)?;
    // SAFETY: the descriptor was handed to this process to own, and is a
    // listening unix socket (checked above).
    Ok(unsafe { UnixListener::from_raw_fd(fd) })
}

/// Takes over the connected unix stream socket this process inherited as
/// `fd` (the harness's credential under `hive up`): made close-on-exec at
/// once, and refused (not taken) unless it is a connected `AF_UNIX` stream
/// socket.
pub fn inherited_stream(fd: RawFd) -> io::Result<UnixStream> {
    inherited_unix(fd, false)?;
    // SAFETY: the descriptor was handed to this process to own, and is a
    // unix stream socket that does not listen (checked above).
    Ok(unsafe { UnixStream::from_raw_fd(fd) })
}

/// A credential: one end of a socket pair whose other end another process
/// (the broker) holds, over which this process hands it connections — each
/// one end of a fresh socket pair ([`send_fd`]), the other end kept. Only
/// this process holds it: taken with [`Credential::inherited`], it is closed
/// on exec and the process non-dumpable, so nothing it starts can take it.
#[derive(Debug)]
pub struct Credential {
    control: UnixStream,
}

impl Credential {
    /// The credential this process inherited as the descriptor named in
    /// variable `var`, taken at once (closed on exec), and the process made
    /// non-dumpable; None without the variable. Call it first thing, before
    /// any thread starts. The error names the variable.
    pub fn inherited(var: &str) -> Result<Option<Credential>, String> {
        let Some(text) = std::env::var_os(var) else {
            return Ok(None);
        };
        let fd: RawFd = text
            .to_str()
            .and_then(|t| t.trim().parse().ok())
            .filter(|fd| *fd > 2)
            .ok_or_else(|| format!("{var}={text:?} is not a descriptor number"))?;
        let control = inherited_stream(fd).map_err(|e| {
            format!("{var}={fd}: cannot take the broker credential hive up handed down: {e}")
        })?;
        super::set_non_dumpable()
            .map_err(|e| format!("cannot make this process non-dumpable: {e}"))?;
        Ok(Some(Credential { control }))
    }

    /// Over an end made here (tests).
    pub fn over(control: UnixStream) -> Credential {
        Credential { control }
    }

    /// A new connection to the other end's process.
    pub fn connect(&self) -> io::Result<UnixStream> {
        let (mine, theirs) = UnixStream::pair()?;
        send_fd(&self.control, std::os::fd::AsFd::as_fd(&theirs))?;
        Ok(mine)
    }
}

/// `fd` as a unix stream socket (one that came over a socket, say), or
/// closed and refused when it is something else or listens.
pub fn unix_stream(fd: OwnedFd) -> io::Result<UnixStream> {
    inherited_unix(fd.as_raw_fd(), false)?;
    Ok(UnixStream::from(fd))
}

/// Marks inherited `fd` close-on-exec, then checks that it is an `AF_UNIX`
/// stream socket that listens (or not, as `listening` says).
fn inherited_unix(fd: RawFd, listening: bool) -> io::Result<()> {
    let int = |opt: libc::c_int| -> io::Result<libc::c_int> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: getsockopt writes at most `len` bytes into `v`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(v)
    };
    // SAFETY: fcntl with integer arguments; a bad fd is EBADF.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let ok = int(libc::SO_DOMAIN)? == libc::AF_UNIX
        && int(libc::SO_TYPE)? == libc::SOCK_STREAM
        && (int(libc::SO_ACCEPTCONN)? == 1) == listening;
    if !ok {
        let what = if listening {
            "a listening unix stream socket"
        } else {
            "a connected unix stream socket"
        };
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("descriptor {fd} is not {what}"),
        ));
    }
    Ok(())
}

/// Sends descriptor `fd` over unix socket `sock` (`SCM_RIGHTS`, with one
/// byte of data, as a stream socket needs some). The receiver gets its own
/// copy; the sender still holds `fd`.
pub fn send_fd(sock: &UnixStream, fd: std::os::fd::BorrowedFd<'_>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: msghdr is plain data; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer holds one header and one descriptor
    // (CMSG_SPACE above), which CMSG_FIRSTHDR and CMSG_DATA stay inside.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), raw);
    }
    loop {
        // SAFETY: a valid socket and a message built above.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n == 1 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if n < 0 && e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(if n < 0 {
            e
        } else {
            io::ErrorKind::WriteZero.into()
        });
    }
}

/// Receives one descriptor sent with [`send_fd`], close-on-exec, without
/// waiting: `Ok(None)` once the other end closed, `WouldBlock` when nothing
/// is waiting, `InvalidData` for a byte that came without a descriptor (it
/// is consumed).
pub fn recv_fd(sock: &UnixStream) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    let mut control = vec![0u8; space];
    loop {
        // SAFETY: msghdr is plain data; every pointer set below outlives the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: a valid socket and buffers of the sizes given.
        let n = unsafe {
            libc::recvmsg(
                sock.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(None);
        }
        // SAFETY: the kernel filled `msg`; CMSG_FIRSTHDR/NXTHDR walk only the
        // headers it wrote, within msg_controllen. Every descriptor that came
        // is owned here: the first is returned, any other closed.
        let mut got: Option<OwnedFd> = None;
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg);
                    let len = (*cmsg).cmsg_len as usize - (data as usize - cmsg as usize);
                    for k in 0..len / std::mem::size_of::<RawFd>() {
                        let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(k));
                        let owned = OwnedFd::from_raw_fd(fd);
                        if got.is_none() {
                            got = Some(owned);
                        }
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        return match got {
            Some(fd) => Ok(Some(fd)),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a byte came without a descriptor",
            )),
        };
    }
}

/// Sets a socket's send and receive timeouts (`SO_SNDTIMEO`, `SO_RCVTIMEO`);
/// on a listener, Linux copies them to every accepted socket.
pub fn set_socket_timeouts(sock: &impl AsRawFd, send: Duration, read: Duration) -> io::Result<()> {
    set_timeout(sock.as_raw_fd(), libc::SO_SNDTIMEO, send)?;
    set_timeout(sock.as_raw_fd(), libc::SO_RCVTIMEO, read)
}

/// The receive timeout of socket `fd` (`SO_RCVTIMEO`; zero: none).
pub fn read_timeout(fd: RawFd) -> io::Result<Duration> {
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: a timeval and its size, which getsockopt fills.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&mut tv as *mut libc::timeval).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Duration::new(tv.tv_sec as u64, tv.tv_usec as u32 * 1000))
}

/// Sets the receive timeout of socket `fd` (`SO_RCVTIMEO`; zero: none).
pub fn set_read_timeout(fd: RawFd, d: Duration) -> io::Result<()> {
    set_timeout(fd, libc::SO_RCVTIMEO, d)
}

fn set_timeout(fd: RawFd, opt: libc::c_int, d: Duration) -> io::Result<()> {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as _,
        tv_usec: d.subsec_micros() as _,
    };
    // SAFETY: a valid fd and a timeval of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Bytes written to socket `fd` that its peer has not acknowledged
/// (`SIOCOUTQ`); `None` when the socket cannot say.
pub fn unsent(fd: RawFd) -> Option<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: TIOCOUTQ (SIOCOUTQ) writes one int through the pointer.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCOUTQ as _, &mut n) };
    (rc == 0).then(|| n.max(0) as u64)
}

/// Bytes waiting to be read in pipe (or socket) `fd` (`FIONREAD`): what
/// its writer wrote that no reader has taken yet.
pub fn unread(fd: RawFd) -> io::Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int through the pointer.
    let rc = unsafe { libc::ioctl(fd, libc::FIONREAD as _, &mut n) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n.max(0) as u64)
}

/// Shuts both directions of socket `fd` down (the peer sees the end); the
/// descriptor stays open for its owner to close.
pub fn shutdown(fd: RawFd) {
    // SAFETY: shutdown(2) on a descriptor has no memory effects.
    unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
}

/// The process that connected the other end of a unix socket
/// (`SO_PEERCRED`, which the kernel records at `connect`), as its pid in
/// this process's PID namespace.
pub fn peer_pid(sock: &UnixStream) -> io::Result<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a valid socket fd, and a ucred buffer of the length given.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    u32::try_from(cred.pid).map_err(|_| io::Error::other("the peer has no pid here"))
}

/// True when the peer of socket `fd` hung up (or the connection broke), without
/// waiting.
pub fn hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
}

/// One descriptor of a [`poll`]: what to wait for, then what happened.
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub struct PollFd(libc::pollfd);

impl PollFd {
    /// Waits on `fd` for input (`read`), for room to write (`write`), and
    /// always for the peer hanging up or an error.
    pub fn new(fd: RawFd, read: bool, write: bool) -> PollFd {
        let mut events = libc::POLLRDHUP;
        if read {
            events |= libc::POLLIN;
        }
        if write {
            events |= libc::POLLOUT;
        }
        PollFd(libc::pollfd {
            fd,
            events,
            revents: 0,
        })
    }

    /// Something to read (or the end of input).
    pub fn readable(&self) -> bool {
        self.0.revents & libc::POLLIN != 0
    }

    /// Room to write.
    pub fn writable(&self) -> bool {
        self.0.revents & libc::POLLOUT != 0
    }

    /// The peer closed its side or hung up, or the descriptor failed.
    pub fn hung_up(&self) -> bool {
        self.0.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
    }

    /// The descriptor failed or is not open (not a mere end of input).
    pub fn failed(&self) -> bool {
        self.0.revents & (libc::POLLERR | libc::POLLNVAL) != 0
    }

    /// Anything happened.
    pub fn any(&self) -> bool {
        self.0.revents != 0
    }
}

/// Waits until something happens on one of `fds`, at most `timeout` (`None`
/// waits as long as it takes); returns how many have news. An interrupted
/// wait returns 0.
pub fn poll(fds: &mut [PollFd], timeout: Option<Duration>) -> io::Result<usize> {
    let ms = match timeout {
        None => -1,
        // Rounded up, so a deadline is never woken for a moment early.
        Some(d) => d.as_micros().div_ceil(1000).min(libc::c_int::MAX as u128) as libc::c_int,
    };
    // SAFETY: PollFd is a transparent pollfd, so the slice is an array of
    // `fds.len()` initialised pollfd structs poll(2) may write `revents` of.
    let n = unsafe { libc::poll(fds.as_mut_ptr().cast(), fds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(n as usize)
}

/// An `epoll(7)` instance, level-triggered: the interest in each descriptor is
/// registered once and changed only when it changes, and a wait returns what
/// is ready, each with the token it was registered with. Events read as
/// [`PollFd`]s (epoll's event bits are poll's).
pub struct Epoll {
    fd: OwnedFd,
    /// What the kernel fills in, kept between waits.
    buf: Vec<libc::epoll_event>,
}

/// Events one [`Epoll::wait`] takes at most; more stay ready for the next.
const EPOLL_BATCH: usize = 1024;

/// What one [`Epoll::wait`] found ready: the registration's token and the
/// events, as a [`PollFd`] would hold them.
#[derive(Clone, Copy)]
pub struct Ready {
    pub token: u64,
    pub events: PollFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes flags only; a valid descriptor is owned.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor just returned, owned by nothing else.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            buf: vec![libc::epoll_event { events: 0, u64: 0 }; EPOLL_BATCH],
        })
    }

    fn ctl(
        &self,
        op: libc::c_int,
        fd: RawFd,
        token: u64,
        read: bool,
        write: bool,
    ) -> io::Result<()> {
        let mut events = libc::EPOLLRDHUP as u32;
        if read {
            events |= libc::EPOLLIN as u32;
        }
        if write {
            events |= libc::EPOLLOUT as u32;
        }
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a valid epoll_event for the call's duration.
        if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for input (`read`), room to write (`write`), and always a
    /// hang-up or an error, reporting it as `token`.
    pub fn add(&self, fd: RawFd, token: u64, read: bool, write: bool) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, read, write)
    }

    /// Changes what `fd` is watched for.
    pub fn modify(&self, fd: RawFd, token: u64, read: bool, write: bool) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, read, write)
    }

    /// Stops watching `fd` (before it is closed, so no copy of it lingers).
    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        // SAFETY: EPOLL_CTL_DEL ignores the event (non-null for old kernels).
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits until something is ready, at most `timeout` (`None` waits as long
    /// as it takes), filling `out`; an interrupted wait finds nothing.
    pub fn wait(&mut self, out: &mut Vec<Ready>, timeout: Option<Duration>) -> io::Result<()> {
        out.clear();
        let ms = match timeout {
            None => -1,
            // Rounded up, so a deadline is never woken for a moment early.
            Some(d) => d.as_micros().div_ceil(1000).min(libc::c_int::MAX as u128) as libc::c_int,
        };
        let cap = self.buf.len();
        // SAFETY: `buf` holds `cap` writable epoll_event structs.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                self.buf.as_mut_ptr(),
                cap as libc::c_int,
                ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(e);
        }
        for ev in &self.buf[..n as usize] {
            // Copied out: the struct is packed on x86_64.
            let (events, token) = (ev.events, ev.u64);
            let mut p = PollFd::new(-1, false, false);
            // epoll's EPOLLIN/OUT/ERR/HUP/RDHUP are poll's bits.
            p.0.revents = events as libc::c_short;
            out.push(Ready { token, events: p });
        }
        Ok(())
    }
}

/// A thread that reports the hang-up of one socket's peer as an event. The
/// socket must outlive the watch; dropping the watch ends the thread.
pub struct HangupWatch {
    hung_up: Receiver<()>,
    cancel: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HangupWatch {
    /// Watches socket `sock` from a thread named `name`.
    pub fn start(name: &str, sock: RawFd) -> io::Result<HangupWatch> {
        let (read_end, cancel) = pipe()?;
        let (tx, hung_up) = bounded::<()>(1);
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if wait_hangup(sock, read_end.as_raw_fd()) {
                    let _ = tx.send(());
                }
            })?;
        Ok(HangupWatch {
            hung_up,
            cancel: Some(cancel),
            thread: Some(thread),
        })
    }

    /// Ready (once) when the peer hung up.
    pub fn hung_up(&self) -> &Receiver<()> {
        &self.hung_up
    }
}

impl Drop for HangupWatch {
    fn drop(&mut self) {
        drop(self.cancel.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Blocks until `sock`'s peer hangs up (true) or `cancel` is readable or closed
/// (false).
fn wait_hangup(sock: RawFd, cancel: RawFd) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: sock,
            events: libc::POLLRDHUP,
            revents: 0,
        },
        libc::pollfd {
            fd: cancel,
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: fds points at two initialised pollfd structs.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return false;
        }
        if fds[1].revents != 0 {
            return false;
        }
        if fds[0].revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
        {
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    use std::path::Path;

    /// Both ends of a pair made here were connected by this process.
    #[test]
    fn the_peer_of_a_socket_is_the_process_that_connected_it() {
        let (a, b) = UnixStream::pair().unwrap();
        assert_eq!(peer_pid(&a).unwrap(), std::process::id());
        assert_eq!(peer_pid(&b).unwrap(), std::process::id());
    }

    #[test]
    fn a_passed_descriptor_arrives_close_on_exec_and_a_closed_end_says_so() {
        let (ctl_a, ctl_b) = UnixStream::pair().unwrap();
        ctl_b.set_nonblocking(true).unwrap();
        let err = recv_fd(&ctl_b).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
        let (mut mine, theirs) = UnixStream::pair().unwrap();
        send_fd(&ctl_a, std::os::fd::AsFd::as_fd(&theirs)).unwrap();
        drop(theirs);
        let got = recv_fd(&ctl_b).unwrap().expect("a descriptor");
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let flags = unsafe { libc::fcntl(got.as_raw_fd(), libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        let mut got = UnixStream::from(got);
        mine.write_all(b"x").unwrap();
        let mut buf = [0u8; 1];
        got.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"x");
        (&ctl_a).write_all(b"y").unwrap();
        let err = recv_fd(&ctl_b).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        drop(ctl_a);
        assert!(recv_fd(&ctl_b).unwrap().is_none());
    }

    #[test]
    fn an_inherited_stream_must_be_a_connected_unix_socket() {
        let (a, _b) = UnixStream::pair().unwrap();
        let fd = std::os::fd::IntoRawFd::into_raw_fd(a);
        // SAFETY: clearing FD_CLOEXEC on a descriptor this test owns.
        unsafe { libc::fcntl(fd, libc::F_SETFD, 0) };
        let s = inherited_stream(fd).unwrap();
        // SAFETY: F_GETFD only reads the descriptor's flags.
        let flags = unsafe { libc::fcntl(s.as_raw_fd(), libc::F_GETFD) };
        assert_ne!(flags & libc::FD_CLOEXEC, 0);
        let (r, _w) = pipe().unwrap();
        assert!(inherited_stream(r.as_raw_fd()).is_err(), "a pipe");
        assert!(unix_stream(r).is_err(), "a pipe");
        let dir = std::env::temp_dir().join(format!("hive-fd-inherit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("s")).unwrap();
        let err = inherited_stream(listener.as_raw_fd()).unwrap_err();
        assert!(err.to_string().contains("not a connected unix"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_accepted_connection_is_non_blocking_and_closed_on_exec() {
        let dir = std::env::temp_dir().join(format!("hive-fd-accept-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let listener = UnixListener::bind(dir.join("s")).unwrap();
        listener.set_nonblocking(true).unwrap();
        let err = accept_nonblocking(&listener).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
        let mut client = UnixStream::connect(dir.join("s")).unwrap();
        client.write_all(b"ping").unwrap();
        let mut conn = accept_nonblocking(&listener).unwrap();
        // SAFETY: F_GETFL and F_GETFD only read the descriptor's flags.
        let (fl, fd) = unsafe {
            (
                libc::fcntl(conn.as_raw_fd(), libc::F_GETFL),
                libc::fcntl(conn.as_raw_fd(), libc::F_GETFD),
            )
        };
        assert_ne!(fl & libc::O_NONBLOCK, 0);
        assert_ne!(fd & libc::FD_CLOEXEC, 0);
        let mut buf = [0u8; 8];
        assert_eq!(conn.read(&mut buf).unwrap(), 4);
        let err = conn.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock, "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_beneath_a_dir_opens_only_along_real_directories() {
        let root = std::env::temp_dir().join(format!("hive-fd-beneath-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let own = root.join("own");
        std::fs::create_dir_all(own.join("a/b")).unwrap();
        std::fs::create_dir_all(root.join("elsewhere/b")).unwrap();
        std::fs::write(own.join("a/b/patch.json"), "inside").unwrap();
        std::fs::write(root.join("elsewhere/b/patch.json"), "outside").unwrap();
        let mut text = String::new();
        open_beneath(&own, Path::new("a/b/patch.json"), 0)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        assert_eq!(text, "inside");
        // A directory on the way that is a symlink out of `own` (what a path
        // checked a moment before can turn into) is not followed.
        std::os::unix::fs::symlink(root.join("elsewhere"), own.join("link")).unwrap();
        let e = open_beneath(&own, Path::new("link/b/patch.json"), 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR), "{e}");
        // Nor is a last component that is a symlink.
        std::os::unix::fs::symlink(root.join("elsewhere/b/patch.json"), own.join("p.json"))
            .unwrap();
        let e = open_beneath(&own, Path::new("p.json"), 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        // Only plain names.
        for bad in [
            "../elsewhere/b/patch.json",
            "/etc/hostname",
            "./a/b/patch.json",
            "",
        ] {
            let e = open_beneath(&own, Path::new(bad), 0).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}: {e}");
        }
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn unread_counts_what_is_in_a_pipe_and_nothing_once_it_is_read() {
        let (r, w) = pipe().unwrap();
        let (mut r, mut w) = (std::fs::File::from(r), std::fs::File::from(w));
        assert_eq!(unread(r.as_raw_fd()).unwrap(), 0);
        w.write_all(b"hello\nworld").unwrap();
        assert_eq!(unread(r.as_raw_fd()).unwrap(), 11);
        let mut buf = [0u8; 6];
        r.read_exact(&mut buf).unwrap();
        assert_eq!(unread(r.as_raw_fd()).unwrap(), 5);
        assert!(unread(-1).is_err());
    }

    #[test]
    fn a_hang_up_is_an_event_and_dropping_the_watch_ends_its_thread() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let watch = HangupWatch::start("test-watch", a.as_raw_fd()).unwrap();
        assert!(watch.hung_up().try_recv().is_err());
        drop(b);
        watch
            .hung_up()
            .recv_timeout(Duration::from_secs(10))
            .expect("the hang-up");
        let (c, _d) = std::os::unix::net::UnixStream::pair().unwrap();
        let idle = HangupWatch::start("test-watch", c.as_raw_fd()).unwrap();
        drop(idle); // joins: the thread saw the cancel
    }

    #[test]
    fn a_socket_that_is_not_read_shows_unacknowledged_bytes_or_a_hang_up() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut server, _) = l.accept().unwrap();
        assert!(!hung_up(server.as_raw_fd()));
        server.write_all(b"hello").unwrap();
        let mut buf = [0; 5];
        client.read_exact(&mut buf).unwrap();
        server.set_nonblocking(true).unwrap();
        let chunk = [b'x'; 65536];
        while server.write(&chunk).is_ok() {}
        std::thread::sleep(Duration::from_millis(50));
        assert!(unsent(server.as_raw_fd()).unwrap() > 0);
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
        assert!(hung_up(server.as_raw_fd()));
    }
}
