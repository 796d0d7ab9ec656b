//! `hive __sandbox`: the process `hive up` runs in place of an agent's `hive
//! serve` (or `hive bash-daemon`) when agents are isolated (the policy is
//! `isolation.rs`). It gives the agent its own view of the machine and runs it
//! there:
//!
//! - a **mount namespace** in which every `--cover` directory is an empty,
//!   read-only tmpfs with only the `--keep` paths bound back at the same absolute
//!   paths (opened before anything is covered);
//! - every `--read-only` path (an agent's `icon`, `static_dir`, `web_dist`)
//!   bound over itself read-only, covered or not;
//! - a **PID namespace** with a fresh `/proc`, so no process outside it (the
//!   supervisor, the other agents) can be seen, signalled or read;
//! - with `--userns`, for a `hive up` without root, a **user namespace** mapping
//!   its own uid and gid to themselves (the kernel allows that to any user where
//!   user namespaces are enabled). As root the mount and PID namespaces need none.
//!
//! [`spawn`] is how `hive up` starts one: **one process**. A `clone(2)` into
//! the new namespaces runs `hive __sandbox --in-place`, already PID 1 there
//! with every capability of its user namespace; it maps its ids, builds the
//! view, mounts `/proc`, gives up every capability (the agent cannot unmount
//! what hides the rest) and execs the agent in its own place. The agent is
//! then PID 1 of its namespace and a direct child of `hive up`, which reaps
//! it; as PID 1 it gets only the signals it has a handler for and reaps the
//! namespace's orphans (`sys::signals`), and when it exits the kernel kills
//! what is left in the namespace.
//!
//! `hive __sandbox` runs only that way (`--in-place`, started by [`spawn`]):
//! `hive up` starts every isolated harness and bash-task daemon through
//! [`spawn`] (`bashd::AgentLaunch::start`), and the isolation probe builds
//! its sandbox the same way. The system calls are `sys::ns`'s safe
//! functions.

use super::child::{Proc, Spawned};
use crate::sys::fd::pipe;
use crate::sys::ns::{self, cpath, SignalSet};
use std::ffi::{CStr, CString, OsString};
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The hidden subcommand: `hive __sandbox [--userns] [--in-place [--ids
/// UID:GID]] [--cover DIR]… [--keep PATH]… [--read-only PATH]… (--check | --
/// PROGRAM ARGS…)`. Not a user command.
pub const SUBCOMMAND: &str = "__sandbox";

/// What one sandbox hides and shows, and what it runs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Spec {
    /// Create a user namespace (needed without root).
    pub userns: bool,
    /// Directories replaced by an empty read-only tmpfs.
    pub covers: Vec<PathBuf>,
    /// Paths under a cover that stay visible (bound back at the same path).
    pub keeps: Vec<PathBuf>,
    /// Paths shown read-only, under a cover or not.
    pub read_only: Vec<PathBuf>,
    /// Set everything up, then exit 0 instead of running a program (the probe).
    pub check: bool,
    /// Already PID 1 of its namespaces ([`spawn`] made them): set the view
    /// up and exec the program in place, as one process.
    pub in_place: bool,
    /// With `in_place` and `userns`: the uid and gid (outside) mapped to
    /// themselves in the user namespace; [`spawn`] gives them.
    pub ids: Option<(u32, u32)>,
    /// The program and its arguments.
    pub command: Vec<OsString>,
}

impl Spec {
    /// The command line after the subcommand; [`Spec::parse`] reads it back.
    pub fn args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        if self.userns {
            a.push("--userns".into());
        }
        if self.in_place {
            a.push("--in-place".into());
        }
        if let Some((uid, gid)) = self.ids {
            a.push("--ids".into());
            a.push(format!("{uid}:{gid}").into());
        }
        for c in &self.covers {
            a.push("--cover".into());
            a.push(c.into());
        }
        for k in &self.keeps {
            a.push("--keep".into());
            a.push(k.into());
        }
        for r in &self.read_only {
            a.push("--read-only".into());
            a.push(r.into());
        }
        if self.check {
            a.push("--check".into());
        } else {
            a.push("--".into());
            a.extend(self.command.iter().cloned());
        }
        a
    }

    pub fn parse(args: Vec<OsString>) -> Result<Spec, String> {
        use lexopt::prelude::*;
        let mut s = Spec::default();
        let mut p = lexopt::Parser::from_args(args);
        let absolute = |v: OsString| {
            let p = PathBuf::from(v);
            if p.is_absolute() {
                Ok(p)
            } else {
                Err(format!("{} is not an absolute path", p.display()))
            }
        };
        while let Some(arg) = p.next().map_err(|e| e.to_string())? {
            match arg {
                Long("userns") => s.userns = true,
                Long("check") => s.check = true,
                Long("in-place") => s.in_place = true,
                Long("ids") => {
                    let v = p.value().map_err(|e| e.to_string())?;
                    let v = v.to_string_lossy();
                    let ids = v
                        .split_once(':')
                        .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
                    s.ids = Some(ids.ok_or_else(|| format!("--ids {v}: not UID:GID"))?);
                }
                Long("cover") => s
                    .covers
                    .push(absolute(p.value().map_err(|e| e.to_string())?)?),
                Long("keep") => s
                    .keeps
                    .push(absolute(p.value().map_err(|e| e.to_string())?)?),
                Long("read-only") => s
                    .read_only
                    .push(absolute(p.value().map_err(|e| e.to_string())?)?),
                Value(v) => {
                    s.command.push(v);
                    s.command.extend(p.raw_args().map_err(|e| e.to_string())?);
                }
                other => return Err(other.unexpected().to_string()),
            }
        }
        if s.check != s.command.is_empty() {
            return Err("give either --check or `-- PROGRAM ARGS…`".into());
        }
        if s.in_place && s.userns && s.ids.is_none() {
            return Err("--in-place --userns needs --ids UID:GID".into());
        }
        Ok(s)
    }
}

/// The exit code when the sandbox itself could not be set up (like `env`'s 125).
const SETUP_FAILED: i32 = 125;

/// `hive __sandbox …`: runs the agent in its sandbox and exits as it did.
pub fn run_command(args: Vec<OsString>) -> ! {
    let spec = match Spec::parse(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hive {SUBCOMMAND}: {e}");
            std::process::exit(2);
        }
    };
    if !spec.in_place {
        eprintln!(
            "hive {SUBCOMMAND}: runs only --in-place, as PID 1 of the namespaces `hive up` \
             made for it"
        );
        std::process::exit(2);
    }
    match in_place(&spec) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("hive {SUBCOMMAND}: {e}");
            std::process::exit(SETUP_FAILED);
        }
    }
}

/// mount(2) with an error naming the target.
fn mount(
    src: &CStr,
    target: &Path,
    fstype: Option<&CStr>,
    flags: libc::c_ulong,
    data: Option<&CStr>,
    what: &str,
) -> Result<(), String> {
    ns::mount(src, target, fstype, flags, data)
        .map_err(|e| format!("cannot {what} {}: {e}", target.display()))
}

/// Maps this user's uid and gid to themselves in the new user namespace.
fn map_ids(uid: u32, gid: u32) -> Result<(), String> {
    let write = |file: &str, text: String| {
        std::fs::write(file, text).map_err(|e| format!("cannot write {file}: {e}"))
    };
    // Without CAP_SETGID outside, the kernel wants setgroups denied before gid_map.
    match std::fs::write("/proc/self/setgroups", "deny") {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("cannot write /proc/self/setgroups: {e}"))
        }
        _ => {}
    }
    write("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
    write("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
}

/// Covers each `--cover` with a tmpfs and binds each `--keep` back.
fn build_view(spec: &Spec) -> Result<(), String> {
    // Nothing mounted here propagates back to the host.
    mount(
        c"none",
        Path::new("/"),
        None,
        libc::MS_REC | libc::MS_SLAVE,
        None,
        "make private the mounts under",
    )?;
    // What stays visible is opened before anything is covered, in this namespace
    // (a bind mount's source must be a mount of the caller's namespace).
    let mut keeps = Vec::new();
    for k in &spec.keeps {
        if !spec.covers.iter().any(|c| k.starts_with(c)) {
            continue;
        }
        let fd =
            ns::open_path(k).map_err(|e| format!("cannot open {} to keep it: {e}", k.display()))?;
        let is_dir = std::fs::metadata(k).map(|m| m.is_dir()).unwrap_or(true);
        keeps.push((k, fd, is_dir));
    }
    let mut shown = Vec::new();
    for r in &spec.read_only {
        let fd = ns::open_path(r)
            .map_err(|e| format!("cannot open {} to show it read-only: {e}", r.display()))?;
        let is_dir = std::fs::metadata(r).map(|m| m.is_dir()).unwrap_or(true);
        shown.push((r, fd, is_dir));
    }
    let mut covers: Vec<&PathBuf> = spec.covers.iter().collect();
    covers.sort_by_key(|c| c.components().count());
    for c in &covers {
        mountpoint(c, true, &spec.covers)?;
        mount(
            c"hive-sandbox",
            c,
            Some(c"tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            Some(c"mode=0755,size=1m"),
            "mount an empty tmpfs over",
        )?;
    }
    for (path, fd, is_dir) in &keeps {
        mountpoint(path, *is_dir, &spec.covers)?;
        let src =
            CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| e.to_string())?;
        mount(
            &src,
            path,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
            "bind back",
        )?;
    }
    for (path, fd, is_dir) in &shown {
        mountpoint(path, *is_dir, &spec.covers)?;
        let src =
            CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|e| e.to_string())?;
        mount(&src, path, None, libc::MS_BIND, None, "bind read-only")?;
        remount_read_only(path)?;
    }
    for c in &covers {
        mount(
            c"none",
            c,
            None,
            libc::MS_REMOUNT
                | libc::MS_BIND
                | libc::MS_RDONLY
                | libc::MS_NOSUID
                | libc::MS_NODEV
                | libc::MS_NOEXEC,
            None,
            "make read-only the tmpfs over",
        )?;
    }
    Ok(())
}

/// Makes the bind mount at `path` read-only (and nosuid, nodev, noexec). In a
/// user namespace the source's access-time flags are locked and must be
/// given again as they are; they are not known here, so each is tried.
fn remount_read_only(path: &Path) -> Result<(), String> {
    let base = libc::MS_REMOUNT
        | libc::MS_BIND
        | libc::MS_RDONLY
        | libc::MS_NOSUID
        | libc::MS_NODEV
        | libc::MS_NOEXEC;
    let mut last = Ok(());
    for atime in [
        0,
        libc::MS_NOATIME,
        libc::MS_STRICTATIME,
        libc::MS_NODIRATIME,
        libc::MS_NODIRATIME | libc::MS_NOATIME,
        libc::MS_NODIRATIME | libc::MS_STRICTATIME,
    ] {
        last = mount(c"none", path, None, base | atime, None, "make read-only");
        if last.is_ok() {
            break;
        }
    }
    last
}

/// Makes sure `path` exists to mount on; only ever creates inside a cover.
fn mountpoint(path: &Path, dir: bool, covers: &[PathBuf]) -> Result<(), String> {
    if std::fs::symlink_metadata(path).is_ok() {
        return Ok(());
    }
    if !covers.iter().any(|c| path.starts_with(c) && path != c) {
        return Err(format!("{} does not exist", path.display()));
    }
    let made = match (dir, path.parent()) {
        (true, _) => std::fs::create_dir_all(path),
        (false, Some(parent)) => {
            std::fs::create_dir_all(parent).and_then(|_| File::create(path).map(drop))
        }
        (false, None) => Ok(()),
    };
    made.map_err(|e| format!("cannot create {} in the sandbox: {e}", path.display()))
}

/// Parts of `/proc` the agent may read but not write.
const PROC_READ_ONLY: [&str; 5] = [
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/fs",
];

/// Binds `path` over itself read-only.
fn read_only(path: &Path) -> Result<(), String> {
    let src = cpath(path).map_err(|e| e.to_string())?;
    mount(&src, path, None, libc::MS_BIND | libc::MS_REC, None, "bind")?;
    mount(
        c"none",
        path,
        None,
        libc::MS_REMOUNT
            | libc::MS_BIND
            | libc::MS_RDONLY
            | libc::MS_NOSUID
            | libc::MS_NODEV
            | libc::MS_NOEXEC,
        None,
        "make read-only",
    )
}

/// Mounts the namespace's own `/proc`, its kernel settings read-only.
fn mount_proc() -> Result<(), String> {
    mount(
        c"proc",
        Path::new("/proc"),
        Some(c"proc"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
        "mount a fresh proc on",
    )?;
    // The kernel's settings stay read-only: a `hive up` run as root makes its
    // agents uid 0, which may write them without any capability.
    for p in PROC_READ_ONLY.iter().map(Path::new) {
        if p.exists() {
            read_only(p)?;
        }
    }
    Ok(())
}

/// `hive __sandbox --in-place`, started by [`spawn`] as PID 1 of its new
/// namespaces with the capabilities it has there: maps its ids (in a user
/// namespace), builds the view, mounts `/proc`, gives up every capability
/// and execs the program in its own place, so the agent is PID 1 and the
/// sandbox one process. Returns only with `--check` (everything was set up)
/// or an error; an exec that fails exits 127.
fn in_place(spec: &Spec) -> Result<(), String> {
    let pid = ns::getpid();
    if pid != 1 {
        return Err(format!(
            "--in-place runs as PID 1 of its namespace, not as pid {pid}"
        ));
    }
    if spec.userns {
        let (uid, gid) = spec.ids.ok_or("--in-place --userns needs --ids")?;
        map_ids(uid, gid)?;
    }
    build_view(spec)?;
    mount_proc()?;
    ns::drop_bounding_set().map_err(|e| e.to_string())?;
    if spec.check {
        return Ok(());
    }
    exec_agent(spec)
}

/// In the agent's process: unblocks signals, gives up every capability and
/// execs the program. Never returns.
fn exec_agent(spec: &Spec) -> ! {
    SignalSet::new(&[]).set_mask();
    if let Err(e) = ns::clear_capabilities() {
        eprintln!("hive {SUBCOMMAND}: cannot clear the capabilities: {e}");
        ns::exit_now(SETUP_FAILED);
    }
    let e = Command::new(&spec.command[0])
        .args(&spec.command[1..])
        .exec();
    eprintln!(
        "hive {SUBCOMMAND}: cannot run {}: {e}",
        Path::new(&spec.command[0]).display()
    );
    ns::exit_now(127)
}

/// How [`spawn`] starts a program in its sandbox.
pub struct Spawn<'a> {
    /// The `hive` binary, which sets the sandbox up (`hive __sandbox
    /// --in-place`) and then becomes the program.
    pub exe: &'a Path,
    /// What the sandbox hides and shows, and the program with its arguments
    /// (`spec.command`); its `in_place` and `ids` are [`spawn`]'s to set.
    pub spec: &'a Spec,
    /// The program's whole environment, in order (a later name wins); see
    /// [`environment`].
    pub env: &'a [(OsString, OsString)],
    /// Descriptors of this process the program inherits under the same
    /// number (a broker credential, a page's socket); they stay
    /// close-on-exec here, so no other child gets them.
    pub keep: &'a [RawFd],
    /// Sent to the program when the thread that called [`spawn`] dies
    /// (`PR_SET_PDEATHSIG`); the program as PID 1 gets it only once it has a
    /// handler for it (the harness and the bash-task daemon have one for
    /// SIGTERM), SIGKILL always.
    pub parent_death_signal: i32,
    /// The umask it starts with.
    pub umask: u32,
}

/// Starts `s.spec.command` in its sandbox as one process, a direct child of
/// the caller: a `clone(2)` into new PID and mount namespaces (and a user
/// namespace when `spec.userns`) runs `hive __sandbox --in-place`, which is
/// PID 1 there, sets up the view ([`Spec`]), gives up every capability and
/// execs the program in its own place. So the program is PID 1 of its
/// namespace (it gets only the signals it has a handler for, SIGKILL from
/// the caller always, and inherits the namespace's orphans:
/// `sys::signals`), its exit status is the caller's to reap (through the
/// [`Proc`] of the returned [`Spawned`], as for every child of `hive up`:
/// `child.rs`), and when it exits the kernel kills whatever is left in the
/// namespace. stdin is `/dev/null`, stdout and stderr are pipes (their read
/// ends in the `Spawned`). Safe to call from any thread of a multi-threaded
/// process (`sys::ns::clone_exec`); the parent-death signal comes when the
/// calling *thread* exits, so call it from a thread that lives as long as
/// the program should.
///
/// An `Err` is a failure to start `hive __sandbox`; one of the sandbox
/// itself (a mount the kernel refuses) is the child's exit with 125 and its
/// reason on stderr, one to exec the program an exit with 127.
pub fn spawn(s: &Spawn) -> std::io::Result<Spawned> {
    use std::io::{Error, ErrorKind};
    use std::os::unix::ffi::OsStrExt;
    let c = |b: &[u8], what: &dyn Fn() -> String| {
        CString::new(b).map_err(|_| {
            Error::new(
                ErrorKind::InvalidInput,
                format!("{} holds a NUL byte, which no program can be given", what()),
            )
        })
    };
    let spec = Spec {
        in_place: true,
        ids: s.spec.userns.then(crate::sys::effective_ids),
        ..s.spec.clone()
    };
    let program = c(s.exe.as_os_str().as_bytes(), &|| {
        format!("the program name {:?}", s.exe)
    })?;
    let mut args = vec![program.clone(), CString::from(c"__sandbox")];
    for (i, a) in spec.args().iter().enumerate() {
        args.push(c(a.as_bytes(), &|| format!("argument {}", i + 1))?);
    }
    let mut env = Vec::with_capacity(s.env.len());
    for (k, v) in s.env {
        let mut var = k.as_bytes().to_vec();
        var.push(b'=');
        var.extend_from_slice(v.as_bytes());
        env.push(c(&var, &|| format!("the variable {k:?}"))?);
    }
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|v| v.as_ptr()).collect();
    envp.push(std::ptr::null());
    let null = File::open("/dev/null")?;
    let (from_stdout, stdout) = pipe()?;
    let (from_stderr, stderr) = pipe()?;
    let pid = ns::clone_exec(&ns::CloneExec {
        program: &program,
        argv: &argv,
        envp: &envp,
        stdio: [null.as_raw_fd(), stdout.as_raw_fd(), stderr.as_raw_fd()],
        keep: s.keep,
        userns: spec.userns,
        parent_death_signal: s.parent_death_signal,
        umask: s.umask,
    })
    .map_err(|e| Error::new(e.kind(), format!("cannot start {}: {e}", s.exe.display())))?;
    Ok(Spawned {
        child: Proc::adopt(pid as u32),
        stdout: from_stdout,
        stderr: from_stderr,
    })
}

/// A child's whole environment: this process's, less `remove`, then `set`
/// in order (a later name wins, as `Command::env` would).
pub fn environment(remove: &[OsString], set: &[(OsString, OsString)]) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !remove.contains(k) && !set.iter().any(|(s, _)| s == k))
        .collect();
    for (k, v) in set {
        match env.iter_mut().find(|(e, _)| e == k) {
            Some(e) => e.1 = v.clone(),
            None => env.push((k.clone(), v.clone())),
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_round_trips_and_bad_ones_say_why() {
        let spec = Spec {
            userns: true,
            covers: vec!["/d".into(), "/etc/hive".into()],
            keeps: vec!["/d/agents/a".into(), "/d/run/agents/a".into()],
            read_only: vec!["/nix/store/x-static".into(), "/d/icon.svg".into()],
            check: false,
            in_place: false,
            ids: None,
            command: vec![
                "/bin/hive".into(),
                "serve".into(),
                "--state-dir".into(),
                "/x".into(),
            ],
        };
        assert_eq!(Spec::parse(spec.args()).unwrap(), spec);
        let check = Spec {
            check: true,
            command: Vec::new(),
            ..spec.clone()
        };
        assert_eq!(Spec::parse(check.args()).unwrap(), check);
        let in_place = Spec {
            in_place: true,
            ids: Some((1000, 100)),
            ..spec
        };
        assert_eq!(Spec::parse(in_place.args()).unwrap(), in_place);
        let cases: &[(&[&str], &str)] = &[
            (&["--cover", "rel"], "not an absolute path"),
            (&["--cover", "/d"], "either --check"),
            (&["--check", "--", "/bin/true"], "either --check"),
            (&["--bogus"], "--bogus"),
            (&["--ids", "1000", "--check"], "not UID:GID"),
            (&["--in-place", "--userns", "--check"], "needs --ids"),
        ];
        for (args, want) in cases {
            let e = Spec::parse(args.iter().map(OsString::from).collect()).unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
    }
}
