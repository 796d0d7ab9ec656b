//! Test kit for `hive up`: a whole hive from a fleet file on a temp data dir,
//! with the scripted fake claude per agent (each agent's `env` in the fleet file
//! names its own `FAKE_CLAUDE_DIR`). Every wait has a timeout.

use super::hive::{hive_bin, wait_for, FakeClaude, TempDir};
use hyperhive::bash::client::call;
use hyperhive::bash::proto::{Request as BashRequest, TaskReply, TaskView};
use hyperhive::proto::cmd::{Agents, Supervision};
use hyperhive::proto::Client;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Up {
    pub dir: TempDir,
    launch: Launch,
    child: Option<Child>,
}

/// How a test starts `hive up`, beyond its fleet.
#[derive(Debug, Clone, Default)]
pub struct Launch {
    /// Run a copy of `hive` at `DIR/hive`, which a test may replace to look
    /// like a rebuild.
    pub own_binary: bool,
    /// `hive up` itself has no `ANTHROPIC_API_KEY`: each agent has credentials
    /// only if its fleet entry's `env` gives it some. Agents are then only
    /// waited for as far as the supervisor running them.
    pub no_api_key: bool,
    /// More environment for `hive up`.
    pub env: Vec<(String, String)>,
    /// A command that runs `hive up` as its last arguments (`setpriv …`).
    pub wrapper: Vec<String>,
    /// The uid (and gid) the temp dir is given to, for a wrapper that changes
    /// user.
    pub owner: Option<u32>,
    /// Do not wait for the agents (for a `hive up` expected to refuse to start).
    pub no_wait: bool,
    /// Fake-claude steps written before `hive up` starts: (agent, invocation,
    /// script), for a first turn (the kick's) that must behave its own way.
    pub steps: Vec<(String, usize, String)>,
}

impl Up {
    /// Starts `hive up` with `fleet` (JSON; `@FAKE(name)` is replaced by that
    /// agent's fake-claude dir) and waits until every agent of it runs.
    pub fn start(fleet: &str, agents: &[&str]) -> Up {
        Up::launch(fleet, agents, Launch::default())
    }

    /// Like [`Up::start`]; with `own_binary` it runs a copy of `hive` at
    /// `DIR/hive`, which a test may replace to look like a rebuild.
    pub fn start_with(fleet: &str, agents: &[&str], own_binary: bool) -> Up {
        Up::start_opts(fleet, agents, own_binary, true)
    }

    /// With `api_key: false`, `hive up` itself has no `ANTHROPIC_API_KEY` (see
    /// [`Launch::no_api_key`]).
    pub fn start_opts(fleet: &str, agents: &[&str], own_binary: bool, api_key: bool) -> Up {
        let launch = Launch {
            own_binary,
            no_api_key: !api_key,
            ..Launch::default()
        };
        Up::launch(fleet, agents, launch)
    }

    /// Like [`Up::start`], with more variables for `hive up` (a restart has
    /// them too).
    pub fn start_env(fleet: &str, agents: &[&str], env: &[(&str, &str)]) -> Up {
        let launch = Launch {
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Launch::default()
        };
        Up::launch(fleet, agents, launch)
    }

    /// Starts `hive up` as `launch` says.
    pub fn launch(fleet: &str, agents: &[&str], launch: Launch) -> Up {
        let dir = TempDir::new("up");
        // A hive up that runs as another user may not be able to reach the
        // checkout (a clone in a 0700 directory): it gets its own copies of the
        // binary and of the fake claude.
        if launch.own_binary || launch.owner.is_some() {
            std::fs::copy(hive_bin(), dir.path().join("hive")).unwrap();
        }
        if launch.owner.is_some() {
            let bin = dir.path().join("fake-claude-bin");
            std::fs::create_dir_all(&bin).unwrap();
            let src = FakeClaude::bin();
            let src_dir = src.parent().expect("the fake claude's dir");
            for f in ["fake-claude", "lib.sh"] {
                std::fs::copy(src_dir.join(f), bin.join(f)).unwrap();
            }
        }
        let mut text = fleet.to_string();
        for a in agents {
            let fake = dir.path().join(format!("fake-{a}"));
            std::fs::create_dir_all(&fake).unwrap();
            text = text.replace(&format!("@FAKE({a})"), &fake.display().to_string());
        }
        // Every test hive listens on a free port (web.listen's default is
        // the one address a real hive keeps), unless its fleet says where.
        if !text.contains("\"web\"") {
            if let Some(at) = text.find('{') {
                text.insert_str(at + 1, r#""web": {"listen": "127.0.0.1:0"}, "#);
            }
        }
        for (agent, n, script) in &launch.steps {
            let fake = FakeClaude {
                dir: dir.path().join(format!("fake-{agent}")),
            };
            fake.step(*n, script);
        }
        let shared = dir.path().join("fake-shared");
        std::fs::create_dir_all(&shared).unwrap();
        // The fleet file sits in a directory of its own: with isolation, that
        // directory is hidden from the agents (the fake dirs next to it are not).
        std::fs::create_dir_all(dir.path().join("fleet")).unwrap();
        std::fs::write(fleet_path(dir.path()), text).unwrap();
        if let Some(uid) = launch.owner {
            let out = Command::new("chown")
                .arg("-R")
                .arg(format!("{uid}:{uid}"))
                .arg(dir.path())
                .output()
                .unwrap();
            assert!(out.status.success(), "chown: {out:?}");
        }
        let child = spawn(dir.path(), &launch);
        let up = Up {
            dir,
            launch,
            child: Some(child),
        };
        if up.launch.no_wait {
            return up;
        }
        for a in agents {
            if !up.launch.no_api_key {
                up.wait_running(a);
            } else {
                wait_for(Duration::from_secs(30), "the supervisor to run it", || {
                    (up.state(a)?.state == "running").then_some(())
                });
            }
        }
        up
    }

    /// The pid of `hive up` (the supervisor's process).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Waits for `hive up` to exit by itself.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let status = wait_for_exit(&mut c, Duration::from_secs(20));
        self.child = Some(c);
        let status = status.unwrap_or_else(|| panic!("hive up still runs: {}", self.log()));
        self.child = None;
        status
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("up.log")).unwrap_or_default()
    }

    /// Replaces `DIR/hive` with a new file (a rebuild, as far as crash_watch
    /// can tell); only after `start_with(.., true)`.
    pub fn rebuild_binary(&self) {
        let bin = self.dir.path().join("hive");
        let tmp = self.dir.path().join("hive.new");
        std::fs::copy(&bin, &tmp).unwrap();
        let mut f = std::fs::OpenOptions::new().append(true).open(&tmp).unwrap();
        std::io::Write::write_all(&mut f, b"\0").unwrap();
        drop(f);
        std::fs::rename(&tmp, &bin).unwrap();
    }

    /// The `hive` binary this hive runs: its own copy when it has one.
    pub fn binary(&self) -> PathBuf {
        let own = self.dir.path().join("hive");
        if own.exists() {
            own
        } else {
            hive_bin()
        }
    }

    pub fn fleet_file(&self) -> PathBuf {
        fleet_path(self.dir.path())
    }

    pub fn data(&self) -> PathBuf {
        self.dir.path().join("d")
    }

    pub fn fake(&self, agent: &str) -> FakeClaude {
        FakeClaude {
            dir: self.dir.path().join(format!("fake-{agent}")),
        }
    }

    pub fn host(&self) -> Client {
        let path = self.data().join("run/host.sock");
        let c = wait_for(Duration::from_secs(10), "the host socket", || {
            Client::connect(&path).ok()
        });
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c
    }

    pub fn agent(&self, name: &str) -> Client {
        let path = self.data().join("run/agents").join(name).join("mcp.sock");
        let c = wait_for(Duration::from_secs(10), "the agent socket", || {
            Client::connect(&path).ok()
        });
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c
    }

    pub fn states(&self) -> Vec<hyperhive::fleet::supervisor::AgentState> {
        let r: hyperhive::proto::cmd::SupervisionReply = self.host().call(&Supervision {}).unwrap();
        r.agents
    }

    pub fn state(&self, name: &str) -> Option<hyperhive::fleet::supervisor::AgentState> {
        self.states().into_iter().find(|s| s.name == name)
    }

    /// Waits until the supervisor runs `name` and its harness is connected.
    pub fn wait_running(&self, name: &str) -> u32 {
        wait_for(Duration::from_secs(30), &format!("{name} to run"), || {
            let s = self.state(name)?;
            let row: hyperhive::proto::cmd::AgentsReply = self.host().call(&Agents {}).ok()?;
            let connected = row.agents.iter().any(|r| r.name == name && r.running);
            (s.state == "running" && connected).then_some(s.pid?)
        })
    }

    /// How many claude invocations of `agent` had `needle` in their prompt.
    pub fn prompts_with(&self, agent: &str, needle: &str) -> usize {
        let fake = self.fake(agent);
        (1..=fake.count())
            .filter(|n| fake.stdin(*n).contains(needle))
            .count()
    }

    pub fn wait_prompt(&self, agent: &str, needle: &str, n: usize) {
        wait_for(
            Duration::from_secs(30),
            &format!("{n} prompt(s) of {agent} with {needle:?}"),
            || (self.prompts_with(agent, needle) >= n).then_some(()),
        );
    }

    /// SIGTERM and wait for a clean exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        wait_for(Duration::from_secs(20), "hive up to exit", || {
            c.try_wait().ok().flatten()
        })
    }
}

impl Up {
    /// Starts `hive up` again on the same fleet file and data dir (after
    /// [`Up::terminate`]).
    pub fn restart(&mut self, agents: &[&str]) {
        assert!(self.child.is_none(), "terminate first");
        self.child = Some(spawn(self.dir.path(), &self.launch));
        for a in agents {
            self.wait_running(a);
        }
    }
}

fn fleet_path(dir: &std::path::Path) -> PathBuf {
    dir.join("fleet").join("hive.json")
}

/// The dashboard of a running `hive up` as a script finds it: the port from
/// `DATA/dashboard-port`, the token from `DATA/dashboard-token`.
pub struct Dash {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub port: u16,
    pub token: String,
}

impl Up {
    pub fn dashboard(&self) -> Dash {
        let data = self.data();
        let port = wait_for(Duration::from_secs(30), "the dashboard port file", || {
            std::fs::read_to_string(data.join("dashboard-port"))
                .ok()?
                .trim()
                .parse::<u16>()
                .ok()
        });
        let token = std::fs::read_to_string(data.join("dashboard-token"))
            .expect("DATA/dashboard-token")
            .trim()
            .to_string();
        Dash {
            base: format!("http://127.0.0.1:{port}"),
            port,
            token,
        }
    }

    /// Agent `name`'s page as a script reaches it under `hive up`: at
    /// `/agent/NAME/` on the hive's one listener, with the agent's own token
    /// (`STATE/web-token`), which opens that prefix alone.
    pub fn page(&self, name: &str) -> super::web::Page {
        let d = self.dashboard();
        let state = self.data().join("agents").join(name).join("state");
        let token = wait_for(Duration::from_secs(30), "the page's token file", || {
            super::web::read_token(&state)
        });
        super::web::Page {
            port: d.port,
            token: Some(token),
            prefix: format!("/agent/{name}"),
        }
    }

    /// What `hive up` printed to stdout so far.
    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("up.out")).unwrap_or_default()
    }

    /// The session cookie the one-time login link sets (`HttpOnly;
    /// Path=/`), as `NAME=VALUE`.
    pub fn operator_cookie(&self) -> String {
        let r = ureq::AgentBuilder::new()
            .redirects(0)
            .build()
            .get(&self.login_link())
            .call()
            .expect("the login link");
        let set = r.header("Set-Cookie").expect("a cookie").to_string();
        assert!(set.contains("HttpOnly") && set.contains("Path=/"), "{set}");
        set.split(';').next().unwrap().to_string()
    }

    /// The one-time login link `hive up` printed last.
    pub fn login_link(&self) -> String {
        wait_for(
            Duration::from_secs(30),
            "the dashboard's login link",
            || {
                self.stdout()
                    .lines()
                    .rev()
                    .find_map(|l| l.strip_prefix("dashboard: "))
                    .and_then(|l| l.split_whitespace().next())
                    .filter(|u| u.contains("/login?code="))
                    .map(str::to_string)
            },
        )
    }
}

impl Dash {
    fn agent() -> ureq::Agent {
        ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(30))
            .redirects(0)
            .build()
    }

    /// `GET PATH` with the token; the JSON answer, or the status and body.
    pub fn get(&self, path: &str) -> Result<serde_json::Value, (u16, String)> {
        let r = Dash::agent()
            .get(&format!("{}{path}", self.base))
            .set("X-Hive-Token", &self.token)
            .call();
        answer(r)
    }

    /// `POST PATH` with a JSON body and the token, as the page sends it.
    pub fn post(
        &self,
        path: &str,
        body: serde_json::Value,
    ) -> Result<serde_json::Value, (u16, String)> {
        let r = Dash::agent()
            .post(&format!("{}{path}", self.base))
            .set("X-Hive-Token", &self.token)
            .send_json(body);
        answer(r)
    }
}

fn answer(r: Result<ureq::Response, ureq::Error>) -> Result<serde_json::Value, (u16, String)> {
    match r {
        Ok(r) => Ok(r.into_json().expect("a JSON answer")),
        Err(ureq::Error::Status(code, r)) => Err((code, r.into_string().unwrap_or_default())),
        Err(e) => panic!("{e}"),
    }
}

fn spawn(dir: &std::path::Path, launch: &Launch) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("up.log"))
        .unwrap();
    // What hive up prints (the dashboard's one-time login link).
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("up.out"))
        .unwrap();
    let own = dir.join("hive");
    let bin = if own.exists() { own } else { hive_bin() };
    let mut cmd = match launch.wrapper.split_first() {
        Some((program, args)) => {
            let mut c = Command::new(program);
            c.args(args).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    // A test that wants an agent without credentials says so; the others get
    // their key from the fleet file then.
    if !launch.no_api_key {
        cmd.env("ANTHROPIC_API_KEY", "sk-test");
    } else {
        cmd.env_remove("ANTHROPIC_API_KEY");
    }
    cmd.arg("up")
        .arg("--config")
        .arg(fleet_path(dir))
        .arg("--data")
        .arg(dir.join("d"))
        .env("HIVE_CLAUDE_BIN", {
            let own = dir.join("fake-claude-bin/fake-claude");
            if own.exists() {
                own
            } else {
                FakeClaude::bin()
            }
        })
        .env("FAKE_CLAUDE_DIR", dir.join("fake-shared"))
        .env_remove("CLAUDE_CODE_OAUTH_TOKEN")
        .env("HIVE_UP_RESTART_BASE_MS", "100")
        .env("HIVE_UP_WATCH_MS", "100")
        .env("HIVE_UP_STOP_GRACE_MS", "3000")
        .env("HIVE_POLL_MS", "50")
        .env("HIVE_KILL_GRACE_MS", "300")
        .env("HIVE_RECONNECT_MAX_MS", "300")
        .env("HIVE_LOGIN_POLL_MS", "100")
        .env("RUST_LOG", "debug")
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(log);
    cmd.spawn().expect("spawn hive up")
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = wait_for_exit(&mut c, Duration::from_secs(10));
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn wait_for_exit(c: &mut Child, t: Duration) -> Option<std::process::ExitStatus> {
    let end = std::time::Instant::now() + t;
    while std::time::Instant::now() < end {
        if let Ok(Some(s)) = c.try_wait() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

impl Up {
    /// Runs `cmd` as a bash task of `agent` and returns it once it has ended.
    pub fn bash_task(&self, agent: &str, cmd: &str) -> TaskView {
        let sock = self.data().join("agents").join(agent).join("run/bash.sock");
        let never = crossbeam_channel::never();
        let r: TaskReply = wait_for(Duration::from_secs(20), "the bash socket", || {
            call(
                &sock,
                &BashRequest::Run {
                    cmd: cmd.into(),
                    timeout_secs: Some(60),
                    wait_seconds: Some(25),
                },
                &never,
            )
            .ok()
        });
        let mut t = r.task;
        for _ in 0..3 {
            if t.status.is_finished() {
                return t;
            }
            let r: TaskReply = call(
                &sock,
                &BashRequest::Status {
                    id: t.id.clone(),
                    wait_seconds: Some(25),
                },
                &never,
            )
            .unwrap();
            t = r.task;
        }
        panic!("task {cmd:?} did not end: {t:?}");
    }
}
