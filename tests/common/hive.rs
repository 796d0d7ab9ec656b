//! Test kit for integration tests: short temp dirs (unix socket paths are limited
//! to 108 bytes), a real `hive broker` process with kill/restart, and clients on
//! its real sockets. Every wait here has a timeout, so no test can hang.

use hyperhive::proto::cmd::{Agents, Inbox, InboxAck, Send};
use hyperhive::proto::{Client, ClientError, Request};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Path of the `hive` binary under test.
pub fn hive_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_hive"))
}

/// A fresh directory under /tmp with a short name, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = PathBuf::from(format!("/tmp/hv-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Polls `f` every 10 ms until it returns Some or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > end {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A value in kB from /proc/PID/status (`VmHWM`, `VmRSS`).
pub fn proc_kb(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// A running `hive broker` on temp dirs.
pub struct Broker {
    pub dir: TempDir,
    pub args: Vec<String>,
    child: Option<Child>,
    process: Process,
}

/// How the broker process is started besides its arguments.
#[derive(Debug, Clone, Default)]
pub struct Process {
    /// Extra environment (e.g. `HIVE_BROKER_IDLE_SECS`).
    pub env: Vec<(String, String)>,
    /// Soft and hard `RLIMIT_NOFILE`, as `ulimit -n N` would set them.
    pub nofile: Option<u64>,
    /// The umask the broker starts with.
    pub umask: Option<u32>,
}

impl Broker {
    /// Starts a broker serving root agents `names`.
    pub fn start(names: &[&str]) -> Broker {
        Broker::start_with(&["--agents".to_string(), names.join(",")], None)
    }

    /// Starts a broker with a config file holding `config` (JSON).
    pub fn start_config(config: &str) -> Broker {
        Broker::start_with(&[], Some(config))
    }

    /// Starts a broker serving root agents `names` with its state in `state`
    /// (for tests that put it on a filesystem of their own).
    pub fn start_in(names: &[&str], state: &Path) -> Broker {
        Broker::start_at(
            &["--agents".to_string(), names.join(",")],
            None,
            Some(state),
        )
    }

    /// Starts a broker serving root agents `names` (or the hive of `config`
    /// when given), as `process` says.
    pub fn start_process(names: &[&str], config: Option<&str>, process: Process) -> Broker {
        let extra = if names.is_empty() {
            Vec::new()
        } else {
            vec!["--agents".to_string(), names.join(",")]
        };
        Broker::start_full(&extra, config, None, process)
    }

    fn start_with(extra: &[String], config: Option<&str>) -> Broker {
        Broker::start_at(extra, config, None)
    }

    fn start_at(extra: &[String], config: Option<&str>, state: Option<&Path>) -> Broker {
        Broker::start_full(extra, config, state, Process::default())
    }

    fn start_full(
        extra: &[String],
        config: Option<&str>,
        state: Option<&Path>,
        process: Process,
    ) -> Broker {
        let dir = TempDir::new("b");
        let state = state.map_or_else(|| dir.path().join("s"), Path::to_path_buf);
        let mut args = vec![
            "broker".to_string(),
            "--state-dir".into(),
            state.display().to_string(),
            "--run-dir".into(),
            dir.path().join("r").display().to_string(),
        ];
        if let Some(cfg) = config {
            let p = dir.path().join("hive.json");
            std::fs::write(&p, cfg).unwrap();
            args.push("--config".into());
            args.push(p.display().to_string());
        }
        args.extend(extra.iter().cloned());
        let mut b = Broker {
            dir,
            args,
            child: None,
            process,
        };
        b.spawn();
        b
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("broker.log"))
            .unwrap();
        // Counted before the spawn: a fast broker can log "ready" before the
        // parent reads the log, and counting after would then wait forever.
        let ready_before = self.log().matches("broker ready:").count();
        let mut cmd = Command::new(hive_bin());
        cmd.args(&self.args)
            .env("RUST_LOG", "debug")
            .envs(self.process.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        let (nofile, umask) = (self.process.nofile, self.process.umask);
        if nofile.is_some() || umask.is_some() {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit and umask are async-signal-safe.
            unsafe {
                cmd.pre_exec(move || {
                    if let Some(n) = nofile {
                        let lim = libc::rlimit {
                            rlim_cur: n as libc::rlim_t,
                            rlim_max: n as libc::rlim_t,
                        };
                        if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    if let Some(m) = umask {
                        libc::umask(m as libc::mode_t);
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().expect("spawn hive broker");
        self.child = Some(child);
        // The host socket is bound before the agent sockets, and after a restart
        // the old agent socket files are still there; "broker ready" is logged
        // once every socket listens.
        wait_for(Duration::from_secs(30), "the broker to be ready", || {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!("broker exited early with {st}: {}", self.log());
                }
            }
            (self.log().matches("broker ready:").count() > ready_before).then_some(())
        });
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }

    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("r")
    }

    pub fn state_dir(&self) -> PathBuf {
        let i = self.args.iter().position(|a| a == "--state-dir").unwrap();
        PathBuf::from(&self.args[i + 1])
    }

    pub fn host_socket(&self) -> PathBuf {
        self.run_dir().join("host.sock")
    }

    pub fn agent_socket(&self, name: &str) -> PathBuf {
        self.run_dir().join("agents").join(name).join("mcp.sock")
    }

    /// A client on `name`'s socket. `spawn` waits only for the host socket, which
    /// the broker binds first, so this waits for the agent socket too.
    pub fn agent(&self, name: &str) -> Client {
        let path = self.agent_socket(name);
        let c = wait_for(Duration::from_secs(30), "the agent socket", || {
            Client::connect(&path).ok()
        });
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        c
    }

    pub fn host(&self) -> Client {
        let c = Client::connect(&self.host_socket()).expect("connect host socket");
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        c
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL, as a crash would.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait for a clean exit; returns the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        wait_for(Duration::from_secs(10), "the broker to exit", || {
            c.try_wait().ok().flatten()
        })
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Sends one line as it is: the answer's fields for `ok:true`, the broker's
/// error as [`ClientError::Refused`] for `ok:false` (tests read answers as
/// JSON, whatever the typed client would make of them).
pub fn call_raw(c: &mut Client, line: &str) -> Result<Map<String, Value>, ClientError> {
    let answer = c.call_line(line)?;
    let mut map: Map<String, Value> = serde_json::from_str(&answer)
        .unwrap_or_else(|e| panic!("the broker's answer is not a JSON object ({e}): {answer}"));
    match map.remove("ok") {
        Some(Value::Bool(true)) => Ok(map),
        _ => Err(ClientError::Refused(
            map.get("error")
                .and_then(Value::as_str)
                .unwrap_or("unknown error")
                .to_string(),
        )),
    }
}

/// Sends a command and expects `ok:true`; returns the answer's fields.
pub fn ok(c: &mut Client, cmd: impl Into<Request>) -> Map<String, Value> {
    let req: Request = cmd.into();
    match call_raw(c, &serde_json::to_string(&req).unwrap()) {
        Ok(m) => m,
        Err(e) => panic!("{} failed: {e}", req.cmd()),
    }
}

/// Sends a command and expects `ok:false`; returns the error text.
pub fn refused(c: &mut Client, cmd: impl Into<Request>) -> String {
    let req: Request = cmd.into();
    match call_raw(c, &serde_json::to_string(&req).unwrap()) {
        Ok(m) => panic!("{} unexpectedly succeeded: {m:?}", req.cmd()),
        Err(ClientError::Refused(e)) => e,
        Err(e) => panic!("{} failed without an answer: {e}", req.cmd()),
    }
}

/// `hive budget set ARGS` through the operator's `host_socket`; it must exit 0.
pub fn budget_set(host_socket: &Path, args: &[&str]) {
    let sock = host_socket.display().to_string();
    let mut argv = vec!["budget", "set"];
    argv.extend_from_slice(args);
    argv.extend(["--socket", sock.as_str()]);
    let (code, out, err) = run_hive(&argv, None, &[]);
    assert_eq!(code, 0, "hive {argv:?}: {out}{err}");
}

/// Runs `hive ARGS` with a timeout; returns (exit code, stdout, stderr).
pub fn run_hive(args: &[&str], stdin: Option<&str>, env: &[(&str, &str)]) -> (i32, String, String) {
    run_hive_in(None, args, stdin, env)
}

/// [`run_hive`] in working directory `cwd` (where `hive up` keeps
/// `hive-data`), without the socket variables of the test's environment.
pub fn run_hive_in(
    cwd: Option<&Path>,
    args: &[&str],
    stdin: Option<&str>,
    env: &[(&str, &str)],
) -> (i32, String, String) {
    use std::io::Write;
    let mut cmd = Command::new(hive_bin());
    if let Some(dir) = cwd {
        cmd.current_dir(dir)
            .env_remove("HIVE_HOST_SOCKET")
            .env_remove("HIVE_SOCKET");
    }
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn hive");
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    // A hung command is killed after 60 s; the guard stands down as soon as the
    // child is reaped, so it never signals a pid the kernel has handed out since.
    let pid = child.id();
    let (done_tx, done_rx) = crossbeam_channel::bounded::<()>(0);
    let guard = std::thread::spawn(move || {
        if let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
            done_rx.recv_timeout(Duration::from_secs(60))
        {
            // SAFETY: kill(2); the child is not reaped yet (the sender lives).
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    });
    let out = child.wait_with_output();
    drop(done_tx);
    let _ = guard.join();
    let out = out.expect("wait hive");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A scenario directory for `tests/fake-claude/fake-claude`.
pub struct FakeClaude {
    pub dir: PathBuf,
}

impl FakeClaude {
    pub fn new(root: &Path) -> FakeClaude {
        let dir = root.join("fake");
        std::fs::create_dir_all(&dir).unwrap();
        FakeClaude { dir }
    }

    pub fn bin() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fake-claude/fake-claude")
    }

    /// What invocation `n` (1-based) does: a bash snippet using lib.sh.
    pub fn step(&self, n: usize, script: &str) {
        std::fs::write(self.dir.join(format!("step-{n}.sh")), script).unwrap();
    }

    /// What every invocation without its own step does.
    pub fn default_step(&self, script: &str) {
        std::fs::write(self.dir.join("default.sh"), script).unwrap();
    }

    pub fn count(&self) -> usize {
        std::fs::read_to_string(self.dir.join("count"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0)
    }

    pub fn argv(&self, n: usize) -> Vec<String> {
        let raw = std::fs::read(self.dir.join(format!("inv-{n}.argv"))).unwrap_or_default();
        raw.split(|b| *b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()
    }

    pub fn stdin(&self, n: usize) -> String {
        std::fs::read_to_string(self.dir.join(format!("inv-{n}.stdin"))).unwrap_or_default()
    }

    /// Waits until at least `n` invocations have started.
    pub fn wait_count(&self, n: usize) {
        wait_for(
            Duration::from_secs(30),
            &format!("{n} claude invocations"),
            || (self.count() >= n).then_some(()),
        );
    }
}

/// A running `hive serve` for one agent of a broker.
pub struct Harness {
    pub dir: TempDir,
    pub fake: FakeClaude,
    child: Option<Child>,
    env: Vec<(String, String)>,
    agent: String,
    /// A state dir elsewhere than `DIR/state` (a small filesystem).
    state: Option<PathBuf>,
}

impl Harness {
    /// Starts `hive serve` for `agent` with a fake claude; `env` overrides.
    pub fn start(b: &Broker, agent: &str, env: &[(&str, &str)]) -> Harness {
        Harness::start_at(b, agent, env, None)
    }

    /// Like [`Harness::start`], with the state dir at `state` when given.
    pub fn start_at(
        b: &Broker,
        agent: &str,
        env: &[(&str, &str)],
        state: Option<&Path>,
    ) -> Harness {
        let dir = TempDir::new("h");
        let fake = FakeClaude::new(dir.path());
        let claude_home = dir.path().join("home");
        std::fs::create_dir_all(claude_home.join(".claude")).unwrap();
        let mut all: Vec<(String, String)> = vec![
            (
                "HIVE_SOCKET".into(),
                b.agent_socket(agent).display().to_string(),
            ),
            (
                "HIVE_BASH_SOCKET".into(),
                dir.path().join("bash.sock").display().to_string(),
            ),
            (
                "HIVE_CLAUDE_BIN".into(),
                FakeClaude::bin().display().to_string(),
            ),
            ("FAKE_CLAUDE_DIR".into(), fake.dir.display().to_string()),
            ("HIVE_LABEL".into(), agent.into()),
            ("HOME".into(), claude_home.display().to_string()),
            (
                "CLAUDE_CONFIG_DIR".into(),
                claude_home.join(".claude").display().to_string(),
            ),
            ("ANTHROPIC_API_KEY".into(), "sk-test".into()),
            ("HIVE_PORT".into(), "0".into()),
            ("HIVE_POLL_MS".into(), "50".into()),
            ("HIVE_LOGIN_POLL_MS".into(), "100".into()),
            ("HIVE_KILL_GRACE_MS".into(), "300".into()),
            ("HIVE_RECONNECT_MAX_MS".into(), "300".into()),
            ("RUST_LOG".into(), "debug".into()),
        ];
        for (k, v) in env {
            all.retain(|(key, _)| key != k);
            if !v.is_empty() {
                all.push((k.to_string(), v.to_string()));
            }
        }
        let mut h = Harness {
            dir,
            fake,
            child: None,
            env: all,
            agent: agent.into(),
            state: state.map(Path::to_path_buf),
        };
        h.spawn();
        h
    }

    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("serve.log"))
            .unwrap();
        let mut cmd = Command::new(hive_bin());
        cmd.arg("serve")
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--run-dir")
            .arg(self.run_dir())
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("CLAUDE_CODE_OAUTH_TOKEN")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn hive serve"));
    }

    pub fn state_dir(&self) -> PathBuf {
        self.state
            .clone()
            .unwrap_or_else(|| self.dir.path().join("state"))
    }

    /// Changes one variable for the next [`Harness::spawn`] (empty unsets it).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        if !value.is_empty() {
            self.env.push((key.into(), value.into()));
        }
    }

    /// Sets one variable for the next [`Harness::spawn`], an empty value
    /// included (which [`Harness::set_env`] takes for unset).
    pub fn set_env_raw(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.into(), value.into()));
    }

    pub fn run_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    pub fn agent(&self) -> &str {
        &self.agent
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Sends SIGTERM and waits for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        wait_for(Duration::from_secs(15), "hive serve to exit", || {
            c.try_wait().ok().flatten()
        })
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The agent's row in `agents` on the host socket.
pub fn agent_row(b: &Broker, name: &str) -> hyperhive::proto::AgentRow {
    let r: hyperhive::proto::cmd::AgentsReply = b.host().call(&Agents {}).unwrap();
    r.agents
        .into_iter()
        .find(|a| a.name == name)
        .expect("agent row")
}

/// A broker serving root agent `agent` and its harness (`env` overriding
/// [`Harness::start`]'s), once the harness's boot kick turn is acked.
pub fn started_harness(agent: &str, env: &[(&str, &str)]) -> (Broker, Harness) {
    let b = Broker::start(&[agent]);
    let h = Harness::start(&b, agent, env);
    h.fake.wait_count(1);
    wait_drained(&b, agent);
    (b, h)
}

/// Waits until the agent has nothing unread and nothing inflight.
pub fn wait_drained(b: &Broker, name: &str) {
    wait_for(Duration::from_secs(30), "the inbox to drain", || {
        let r = agent_row(b, name);
        (r.unread == 0 && r.inflight.is_none()).then_some(())
    });
}

/// The operator's unread messages (then marked read, as `hive inbox` does).
pub fn operator_inbox(b: &Broker) -> Vec<hyperhive::proto::Message> {
    read_inbox(&mut b.host())
}

/// The inbox of a host connection (the operator's), read and marked read.
pub fn read_inbox(host: &mut Client) -> Vec<hyperhive::proto::Message> {
    let r: hyperhive::proto::MessagesReply = host
        .call(&Inbox {
            wait_seconds: None,
            peek: false,
            after: None,
        })
        .unwrap();
    let ids = r.messages.iter().map(|m| m.id).collect();
    host.call(&InboxAck { ids }).unwrap();
    r.messages
}

/// The inbox of a host connection (the operator's), peeked: nothing is
/// marked read.
pub fn peek_inbox(host: &mut Client) -> Vec<hyperhive::proto::Message> {
    let r: hyperhive::proto::MessagesReply = host
        .call(&Inbox {
            wait_seconds: None,
            peek: true,
            after: None,
        })
        .unwrap();
    r.messages
}

/// Sends `body` to `to` as the operator.
pub fn operator_send(b: &Broker, to: &str, body: &str) -> i64 {
    send_on(&mut b.host(), to, body, false)
}

/// `from` (an agent) sends `body` to `to` on its socket; the new id.
pub fn agent_send(b: &Broker, from: &str, to: &str, body: &str) -> i64 {
    send_on(&mut b.agent(from), to, body, false)
}

/// `send` of `body` to `to` on connection `c`, with a receipt when
/// `receipt` (issue 43); the new id.
pub fn send_on(c: &mut Client, to: &str, body: &str, receipt: bool) -> i64 {
    let r = ok(
        c,
        Send {
            to: to.into(),
            body: body.into(),
            in_reply_to: None,
            receipt,
            traceparent: None,
        },
    );
    r["id"].as_i64().unwrap()
}

/// Everything in `agent`'s inbox as its `recv` (the MCP tool) hands it out
/// now, confirmed (no harness runs for it).
pub fn recv_all(b: &Broker, agent: &str) -> Vec<hyperhive::proto::Message> {
    use hyperhive::proto::cmd::{Recv, RecvAck};
    let mut c = b.agent(agent);
    let r: hyperhive::proto::MessagesReply = c
        .call(&Recv {
            wait_seconds: None,
            max: Some(32),
        })
        .unwrap();
    let ids: Vec<i64> = r.messages.iter().map(|m| m.id).collect();
    if !ids.is_empty() {
        c.call(&RecvAck { ids }).unwrap();
    }
    r.messages
}
