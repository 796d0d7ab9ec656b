//! `fleet::sandbox::spawn` called from this (multi-threaded) test process, as
//! `hive up` calls it: the program runs as one process, a direct child of the
//! caller, PID 1 of a fresh PID namespace with its own `/proc`, seeing only
//! what its sandbox keeps, with the environment and descriptors it was
//! given; its exit status comes back through `waitpid`; when it exits the
//! kernel ends the rest of its namespace. A `hive bash-daemon` run that way
//! reaps the orphans its tasks leave. As root the sandbox has no user
//! namespace; each test then runs itself again as uid 65534, where it has one.
//! Where the kernel refuses namespaces the tests skip loudly (and fail under
//! `HIVE_REQUIRE_REAL_CLAUDE=1`, as in CI).

mod common;

use common::hive::{hive_bin, wait_for, TempDir};
use hyperhive::fleet::child::{Proc, Spawned};
use hyperhive::fleet::sandbox::{self, Spawn, Spec};
use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Set in the run of a test as uid 65534 (it must not run itself again).
const AS_NOBODY: &str = "HIVE_SANDBOX_TEST_AS_NOBODY";
/// In that run: the copy of `hive` it can reach.
const HIVE_COPY: &str = "HIVE_SANDBOX_TEST_HIVE";

/// The `hive` to run: the copy made for a run as uid 65534, else the build's.
fn hive() -> PathBuf {
    std::env::var_os(HIVE_COPY).map_or_else(hive_bin, PathBuf::from)
}

fn is_root() -> bool {
    // SAFETY: geteuid has no arguments.
    unsafe { libc::geteuid() == 0 }
}

/// As root, runs test `name` of this binary again as uid 65534 (the
/// unprivileged sandbox, with a user namespace) and checks it passed.
fn again_as_nobody(name: &str) {
    if !is_root() || std::env::var_os(AS_NOBODY).is_some() {
        return;
    }
    // A clean clone may sit in a 0700 directory uid 65534 cannot enter: the
    // run gets its own copies of this test and of `hive`, in a directory it
    // can reach.
    let dir = PathBuf::from(format!(
        "/tmp/hive-sbx-nobody-{}-{name}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (me, hive) = (dir.join("test"), dir.join("hive"));
    std::fs::copy(std::env::current_exe().unwrap(), &me).unwrap();
    std::fs::copy(hive_bin(), &hive).unwrap();
    for p in [&dir, &me, &hive] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&me)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(AS_NOBODY, "1")
        .env(HIVE_COPY, &hive)
        .current_dir("/")
        .output()
        .expect("setpriv runs");
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} as uid 65534: {text}");
    assert!(text.contains("1 passed"), "{name} ran as uid 65534: {text}");
}

/// A directory to hide, with `keep/` (shown) and `secret` (hidden) in it,
/// readable by whoever runs the test.
fn hidden_dir(tag: &str) -> TempDir {
    let d = TempDir::new(tag);
    std::fs::create_dir_all(d.path().join("keep")).unwrap();
    std::fs::write(d.path().join("keep/own"), "mine\n").unwrap();
    std::fs::write(d.path().join("secret"), "SECRETMARKER\n").unwrap();
    d
}

fn spec(hidden: &Path, script: &str) -> Spec {
    Spec {
        userns: !is_root(),
        covers: vec![hidden.to_path_buf()],
        keeps: vec![hidden.join("keep")],
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        ..Spec::default()
    }
}

/// A program in its sandbox: its process (reaped through it, killed with
/// its group when dropped), and its output.
struct Sandboxed {
    child: Proc,
    stdout: File,
    stderr: File,
}

impl From<Spawned> for Sandboxed {
    fn from(s: Spawned) -> Sandboxed {
        Sandboxed {
            child: s.child,
            stdout: File::from(s.stdout),
            stderr: File::from(s.stderr),
        }
    }
}

/// Spawns `spec` with `env` set on top of this process's environment and
/// `keep` inherited; `None` (a loud skip) where the kernel refuses a sandbox
/// with the same view (`--check`).
fn start(spec: &Spec, env: &[(&str, &str)], keep: &[i32]) -> Option<Sandboxed> {
    let set: Vec<(OsString, OsString)> = env
        .iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect();
    let env = sandbox::environment(&[], &set);
    let spawn = |spec: &Spec| {
        sandbox::spawn(&Spawn {
            exe: &hive(),
            spec,
            env: &env,
            keep,
            parent_death_signal: libc::SIGKILL,
            umask: 0o022,
        })
        .map(Sandboxed::from)
        .expect("hive __sandbox starts")
    };
    let mut probe = spawn(&Spec {
        check: true,
        command: Vec::new(),
        ..spec.clone()
    });
    let st = probe.child.wait().unwrap();
    if !st.success() {
        let mut why = String::new();
        let _ = probe.stderr.read_to_string(&mut why);
        let why = format!("{} ({st})", why.trim());
        if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() == Ok("1") || st.code() != Some(125)
        {
            panic!("the kernel refused a sandbox: {why}");
        }
        eprintln!("SKIPPED: this machine cannot build a sandbox: {why}");
        return None;
    }
    Some(spawn(spec))
}

/// The parent pid of host process `pid`, and its state letter.
fn stat(pid: u32) -> Option<(u32, String)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut rest = s[s.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.to_string();
    Some((rest.next()?.parse().ok()?, state))
}

/// The host pids whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|c| stat(*c).is_some_and(|(p, _)| p == pid))
        .collect()
}

fn gone(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid as i32, 0) != 0 }
}

#[test]
fn the_program_is_pid_1_alone_in_its_view_and_its_status_comes_back() {
    again_as_nobody("the_program_is_pid_1_alone_in_its_view_and_its_status_comes_back");
    let d = hidden_dir("sbx-view");
    let hidden = d.path().display();
    let (pass_r, pass_w) = std::io::pipe().unwrap();
    let fd = pass_w.as_raw_fd();
    // Lines: its pid, what it sees of the hidden dir, its own file, the
    // processes of its /proc, its variable; then it waits for a signal.
    let script = format!(
        "echo pid=$$; ls -A {hidden} | tr '\\n' ' '; echo; cat {hidden}/keep/own; \
         cat {hidden}/secret 2>/dev/null || echo no-secret; \
         ls /proc | grep -c '^[0-9]'; echo \"var=$SBX_VAR\"; echo passed >&{fd}; \
         cat /proc/self/status | grep -E '^Cap(Eff|Prm)' | tr '\\n' ' '; echo; \
         exec sleep 600"
    );
    let Some(mut s) = start(&spec(d.path(), &script), &[("SBX_VAR", "one two")], &[fd]) else {
        return;
    };
    drop(pass_w);
    let pid = s.child.id();
    let mut out = BufReader::new(s.stdout.try_clone().unwrap());
    let lines: Vec<String> = (0..7)
        .map(|_| {
            let mut l = String::new();
            out.read_line(&mut l).unwrap();
            l.trim_end().to_string()
        })
        .collect();
    let mut err = String::new();
    assert_eq!(lines[0], "pid=1", "{lines:?}");
    assert_eq!(lines[1].trim(), "keep", "only the kept path: {lines:?}");
    assert_eq!(lines[2], "mine");
    assert_eq!(lines[3], "no-secret");
    // sh, ls and grep at most: nothing of the host.
    let procs: u32 = lines[4].parse().unwrap();
    assert!(procs <= 3, "{procs} processes in its /proc: {lines:?}");
    assert_eq!(lines[5], "var=one two");
    assert_eq!(
        lines[6], "CapPrm:\t0000000000000000 CapEff:\t0000000000000000",
        "no capability left"
    );
    let mut passed = String::new();
    BufReader::new(pass_r).read_line(&mut passed).unwrap();
    assert_eq!(passed, "passed\n", "the kept descriptor reached it");
    // One process: the program itself (exec'd in place), our direct child,
    // leader of its own process group.
    let (ppid, _) = stat(pid).unwrap();
    assert_eq!(ppid, std::process::id(), "a direct child");
    wait_for(Duration::from_secs(10), "sh to exec sleep", || {
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        cmd.starts_with(b"sleep\0").then_some(())
    });
    assert!(children(pid).is_empty(), "no helper process");
    // SAFETY: getpgid of our child.
    assert_eq!(unsafe { libc::getpgid(pid as i32) }, pid as i32);
    // As PID 1 it ignores a signal it has no handler for; SIGKILL from here
    // always reaches it, and its status comes back through waitpid.
    // SAFETY: signalling our own unreaped child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    std::thread::sleep(Duration::from_millis(200));
    assert!(s.child.try_wait().unwrap().is_none(), "SIGTERM unhandled");
    // SAFETY: as above.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    let st = s.child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st}");
    let _ = s.stderr.read_to_string(&mut err);
    assert!(err.is_empty(), "{err}");
}

#[test]
fn an_exit_code_comes_back_and_the_rest_of_the_namespace_ends_with_it() {
    again_as_nobody("an_exit_code_comes_back_and_the_rest_of_the_namespace_ends_with_it");
    let d = hidden_dir("sbx-exit");
    // A background sleep, then an exit once told (by its stdout closing is
    // not possible: stdin is /dev/null, so by a file it waits for).
    let go = d.path().join("keep/go");
    let script = format!(
        "sleep 600 & echo started; while [ ! -e {go} ]; do sleep 0.05; done; exit 7",
        go = go.display()
    );
    let Some(mut s) = start(&spec(d.path(), &script), &[], &[]) else {
        return;
    };
    let pid = s.child.id();
    let mut line = String::new();
    BufReader::new(s.stdout.try_clone().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    let sleep = wait_for(Duration::from_secs(10), "the background sleep", || {
        children(pid).into_iter().find(|c| {
            std::fs::read(format!("/proc/{c}/cmdline")).is_ok_and(|c| c == b"sleep\x00600\x00")
        })
    });
    std::fs::write(&go, "").unwrap();
    let st = s.child.wait().unwrap();
    assert_eq!(st.code(), Some(7), "{st}");
    wait_for(
        Duration::from_secs(10),
        "the kernel to end the namespace",
        || gone(sleep).then_some(()),
    );
}

/// A `hive bash-daemon` in its sandbox is PID 1 there: the background
/// process a task leaves is reaped when it exits, not left a zombie.
#[test]
fn a_bash_daemon_as_pid_1_reaps_what_its_tasks_leave_behind() {
    again_as_nobody("a_bash_daemon_as_pid_1_reaps_what_its_tasks_leave_behind");
    use hyperhive::bash::client::call;
    use hyperhive::bash::proto::{Request, TaskReply};
    let d = hidden_dir("sbx-bashd");
    let keep = d.path().join("keep");
    let socket = keep.join("bash.sock");
    let mut spec = spec(d.path(), "");
    spec.command = vec![
        hive().into(),
        "bash-daemon".into(),
        "--state-dir".into(),
        keep.join("state").into(),
        "--socket".into(),
        socket.clone().into(),
        "--agent-socket".into(),
        keep.join("no-agent.sock").into(),
        "--bash-env".into(),
        keep.join("no-bash-env.sh").into(),
    ];
    let Some(mut s) = start(&spec, &[("RUST_LOG", "debug")], &[]) else {
        return;
    };
    let pid = s.child.id();
    let never = crossbeam_channel::never();
    let run = |cmd: &str| -> TaskReply {
        wait_for(Duration::from_secs(20), "the bash socket", || {
            call(
                &socket,
                &Request::Run {
                    cmd: cmd.into(),
                    timeout_secs: Some(60),
                    wait_seconds: Some(25),
                },
                &never,
            )
            .ok()
        })
    };
    // The daemon is PID 1 of its namespace.
    let t = run("echo $PPID");
    assert_eq!(t.task.exit_code, Some(0), "{:?}", t.task);
    assert_eq!(t.task.stdout_tail.trim(), "1", "{:?}", t.task);
    // A detached sleep outlives its task's shell, so it is the daemon's
    // orphan when it exits.
    let t = run("setsid sleep 2 > /dev/null 2>&1 &");
    assert_eq!(t.task.exit_code, Some(0), "{:?}", t.task);
    // The sleep, seen from here: a child of the daemon once its shell ended.
    let orphan = wait_for(
        Duration::from_secs(10),
        "the sleep to be the daemon's",
        || {
            children(pid).into_iter().find(|c| {
                std::fs::read(format!("/proc/{c}/cmdline")).is_ok_and(|c| c == b"sleep\x002\x00")
            })
        },
    );
    wait_for(Duration::from_secs(10), "the orphan to be reaped", || {
        gone(orphan).then_some(())
    });
    // Its own children's statuses stay its own while orphans come and go: a
    // task's exit code is read by the daemon, never swept away.
    for _ in 0..3 {
        let t = run("setsid sleep 0.1 & setsid sleep 0.2 & exit 3");
        assert_eq!(t.task.exit_code, Some(3), "{:?}", t.task);
    }
    // No zombie under the daemon.
    wait_for(Duration::from_secs(10), "no zombie child", || {
        children(pid)
            .iter()
            .all(|c| stat(*c).is_some_and(|(_, st)| st != "Z"))
            .then_some(())
    });
    // It stops on SIGTERM (it has a handler; as PID 1 nothing else would).
    // SAFETY: signalling our own unreaped child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let st = s.child.wait().unwrap();
    let mut log = String::new();
    let _ = s.stderr.read_to_string(&mut log);
    assert!(st.success(), "{st}: {log}");
    assert!(!log.contains("cannot reap"), "{log}");
}

#[test]
fn a_program_that_cannot_start_says_why() {
    let d = hidden_dir("sbx-fail");
    let mut sp = spec(d.path(), "");
    sp.command = vec![PathBuf::from("/nonexistent/prog").into()];
    let Some(mut s) = start(&sp, &[], &[]) else {
        return;
    };
    let st = s.child.wait().unwrap();
    let mut err = String::new();
    let _ = s.stderr.read_to_string(&mut err);
    assert_eq!(st.code(), Some(127), "{err}");
    assert!(err.contains("cannot run /nonexistent/prog"), "{err}");
    // A missing hive binary is the spawn's own error.
    let env = sandbox::environment(&[], &[]);
    let e = sandbox::spawn(&Spawn {
        exe: Path::new("/nonexistent/hive"),
        spec: &sp,
        env: &env,
        keep: &[],
        parent_death_signal: libc::SIGKILL,
        umask: 0o022,
    })
    .map(|_| ())
    .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    assert!(e.to_string().contains("execve"), "{e}");
}
