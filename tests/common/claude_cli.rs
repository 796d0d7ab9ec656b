//! The real Claude Code CLI in tests: where each version of the supported
//! window is installed, whether a test may skip without it, the hermetic
//! environment it runs in, the harness's own invocation (argv, MCP config,
//! settings, system prompt, environment) for a test that runs the CLI by
//! hand, and a runner that feeds it stdin, drains its output and kills it
//! when a wall-clock timeout passes.
//!
//! Every real-CLI test runs once per end of the window
//! ([`hyperhive::agent_proc::CLAUDE_CLI_WINDOW`]): `real_cli_tests!(name)`
//! makes `fn name(cli: &RealCli)` the tests `name::oldest` and
//! `name::newest`, and a failure names the version it ran. `.ci/run` installs both versions
//! with npm, side by side, into [`install_dir`] under the crate root;
//! `docs/testing.md` describes the set-up and `docs/claude-cli.md` how to
//! move the window.

use hyperhive::agent_proc::CLAUDE_CLI_WINDOW;
use hyperhive::harness::classify::{ExitInfo, TurnObserver, TurnReport};
use hyperhive::harness::invocation::{self, ToolLists};
use hyperhive::harness::settings::Settings;
use serde_json::Value;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The versions every real-CLI test runs against: both ends of the window.
pub const CLI_VERSIONS: [&str; 2] = [CLAUDE_CLI_WINDOW.0, CLAUDE_CLI_WINDOW.1];

/// The npm package that ships the CLI.
pub const CLAUDE_CLI_PACKAGE: &str = hyperhive::agent_proc::CLAUDE_CLI_PACKAGE;

/// Set to `1` (as `.ci/run` does) to turn a missing CLI into a test failure.
pub const REQUIRE_ENV: &str = "HIVE_REQUIRE_REAL_CLAUDE";

/// Set to a directory holding one npm prefix per version
/// (`DIR/VERSION/node_modules/.bin/claude`) to use instead of [`install_dir`].
pub const OVERRIDE_ENV: &str = "HIVE_CLAUDE_CLI_DIR";

/// One installed CLI of the window.
#[derive(Debug, Clone)]
pub struct RealCli {
    pub path: PathBuf,
    /// What it reports, one of [`CLI_VERSIONS`].
    pub version: &'static str,
}

impl std::ops::Deref for RealCli {
    type Target = Path;

    /// The executable, so `&cli` goes where a `&Path` is wanted.
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl RealCli {
    /// Whether this CLI is `version` or newer, for the few expectations that
    /// differ along the window (each names the version that changed it).
    pub fn at_least(&self, version: &str) -> bool {
        let v = |s: &str| hyperhive::agent_proc::cli_version(s).expect("a CLI version");
        v(self.version) >= v(version)
    }

    /// The newest end of the window.
    pub fn is_newest(&self) -> bool {
        self.version == CLAUDE_CLI_WINDOW.1
    }
}

/// Where `.ci/run` installs the versions: one npm prefix per version under
/// `.cache/claude-cli/` in the crate (git-ignored).
pub fn install_dir() -> PathBuf {
    match std::env::var_os(OVERRIDE_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/claude-cli"),
    }
}

/// The command that installs `version` where [`real_cli`] finds it.
pub fn install_command(version: &str) -> String {
    format!(
        "npm install --prefix {}/{version} --save-exact {CLAUDE_CLI_PACKAGE}@{version}",
        install_dir().display()
    )
}

/// The installed CLI of `version`, or why it cannot be used. Looked up once
/// per test binary and version: `install_dir()/VERSION`, then
/// `$HOME/.cache/hive-claude-cli/VERSION`; the first that exists must report
/// `version`.
fn find_cli(version: &'static str) -> Result<RealCli, String> {
    static FOUND: OnceLock<Mutex<HashMap<&'static str, Result<RealCli, String>>>> = OnceLock::new();
    let found = FOUND.get_or_init(Mutex::default);
    let mut found = found.lock().unwrap_or_else(|e| e.into_inner());
    found
        .entry(version)
        .or_insert_with(|| look_for(version))
        .clone()
}

fn look_for(version: &'static str) -> Result<RealCli, String> {
    let mut candidates = vec![install_dir().join(version)];
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(
            Path::new(&home)
                .join(".cache/hive-claude-cli")
                .join(version),
        );
    }
    let candidates: Vec<PathBuf> = candidates
        .into_iter()
        .map(|prefix| prefix.join("node_modules/.bin/claude"))
        .collect();
    let Some(path) = candidates.iter().find(|path| path.is_file()) else {
        let looked: Vec<String> = candidates
            .iter()
            .map(|path| path.display().to_string())
            .collect();
        return Err(format!("looked for {}", looked.join(", ")));
    };
    let reported = cli_version(path)?;
    if reported.split_whitespace().next() != Some(version) {
        return Err(format!(
            "{} reports version {reported:?}, not {version}",
            path.display()
        ));
    }
    Ok(RealCli {
        path: path.clone(),
        version,
    })
}

fn cli_version(path: &Path) -> Result<String, String> {
    let output = Command::new(path)
        .arg("--version")
        .env_clear()
        .env("PATH", system_path())
        .stdin(Stdio::null())
        .output()
        .map_err(|err| format!("{} --version failed to start: {err}", path.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} --version failed ({}): {}",
            path.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The CLI of `version` for a test that needs it. Without it the test should
/// return early: this prints a loud SKIPPED line, or panics when
/// `HIVE_REQUIRE_REAL_CLAUDE=1`.
pub fn real_cli(version: &'static str) -> Option<RealCli> {
    match find_cli(version) {
        Ok(cli) => Some(cli),
        Err(reason) if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") => panic!(
            "{REQUIRE_ENV}=1 but the real Claude Code CLI {version} cannot be used ({reason}); \
             install it with: {}",
            install_command(version)
        ),
        Err(reason) => {
            // Written to the stderr handle, not with eprintln!, so that the test
            // harness does not capture the line and hide it.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: real Claude Code CLI {version} not installed ({reason}) (run: {})",
                install_command(version)
            );
            None
        }
    }
}

/// Runs `body` with the CLI of `version` (skipping as [`real_cli`] says); a
/// failure inside is re-raised naming the version, so a test's output says
/// which end of the window broke.
pub fn with_cli(version: &'static str, body: impl FnOnce(&RealCli)) {
    let Some(cli) = real_cli(version) else {
        return;
    };
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&cli)));
    if let Err(payload) = run {
        let what = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into());
        panic!("with Claude Code CLI {version}: {what}");
    }
}

/// Makes real-CLI tests of functions `fn name(cli: &RealCli)`, each run once
/// per end of the window:
///
/// ```ignore
/// /// What it checks.
/// fn the_model_sends(cli: &RealCli) { … }
///
/// real_cli_tests!(the_model_sends, …);
/// ```
///
/// gives the tests `the_model_sends::oldest` and `the_model_sends::newest`
/// (a module and a function may share a name). The functions stay plain
/// items, so rustfmt and clippy see them whole.
#[allow(unused_macros)] // the test binaries without real-CLI tests
macro_rules! real_cli_tests {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[test]
                fn oldest() {
                    $crate::common::claude_cli::with_cli(
                        $crate::common::claude_cli::CLI_VERSIONS[0],
                        super::$name,
                    );
                }

                #[test]
                fn newest() {
                    $crate::common::claude_cli::with_cli(
                        $crate::common::claude_cli::CLI_VERSIONS[1],
                        super::$name,
                    );
                }
            }
        )*
    };
}
#[allow(unused_imports)]
pub(crate) use real_cli_tests;

/// What the harness writes and runs for one turn, as `hive serve` would:
/// the boot files in `run_dir` (written by the harness's own
/// `invocation::write_boot_files_for`, with the built `hive` as the MCP
/// servers' command) and the argv of `invocation::claude_args`.
pub struct HarnessInvocation {
    pub settings: Settings,
    pub tools: ToolLists,
    /// The argv after the binary; the prompt goes on stdin.
    pub args: Vec<String>,
}

/// The harness's invocation for an agent whose environment is `env` (the
/// `HIVE_*` variables `hive serve` would read: `HIVE_SOCKET`,
/// `HIVE_BASH_SOCKET`, `HIVE_TOOL_GROUPS`, `HIVE_EXTRA_MCP_SERVERS`, …), its
/// state in `state_dir` and boot files in `run_dir`, running `model`.
pub fn harness_invocation(
    state_dir: &Path,
    run_dir: &Path,
    env: &[(&str, &str)],
    model: &str,
    resume: bool,
) -> HarnessInvocation {
    let vars: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = |name: &str| vars.get(name).cloned();
    let settings = Settings::read(state_dir, run_dir, &hyperhive::sys::env::Env::new(&lookup))
        .unwrap_or_else(|e| panic!("the harness's settings: {e}"));
    std::fs::create_dir_all(run_dir).expect("the run dir");
    let tools = invocation::write_boot_files_for(&settings, &super::hive::hive_bin())
        .unwrap_or_else(|e| panic!("the harness's boot files: {e}"));
    let args = invocation::claude_args(&settings, &tools, model, resume, None);
    HarnessInvocation {
        settings,
        tools,
        args,
    }
}

impl HarnessInvocation {
    /// The argv as `&str`s, for [`run_claude`].
    pub fn argv(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }

    /// The MCP config the harness wrote, parsed.
    pub fn mcp_config(&self) -> Value {
        let text = std::fs::read_to_string(self.settings.mcp_config_path()).expect("mcp config");
        serde_json::from_str(&text).expect("the mcp config is JSON")
    }
}

/// The whole environment of a hermetic CLI run against the fake API at
/// `base_url`: its own HOME, an API key, no traffic but the API, and the
/// variables the harness sets on every run (`invocation::claude_vars`) with
/// no retries. Run the CLI with `env_clear()` and these.
pub fn claude_env(home: &Path, base_url: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("HOME", home.to_string_lossy().as_ref()),
        ("PATH", &system_path()),
        ("ANTHROPIC_BASE_URL", base_url),
        ("ANTHROPIC_API_KEY", "sk-test"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_TELEMETRY", "1"),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value.to_string()))
    .collect();
    env.extend(invocation::claude_vars(0));
    env
}

fn system_path() -> String {
    std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".to_string())
}

/// A scratch HOME and working directory, removed on drop.
pub struct Sandbox {
    root: PathBuf,
    pub home: PathBuf,
    pub cwd: PathBuf,
}

impl Sandbox {
    pub fn new(label: &str) -> Sandbox {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let root = std::env::temp_dir().join(format!(
            "hive-test-{label}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let home = root.join("home");
        let cwd = root.join("work");
        for dir in [&home, &cwd] {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
        }
        Sandbox { root, home, cwd }
    }

    /// Makes the directory `name` at the sandbox root and returns its path.
    pub fn write_dir(&self, name: &str) -> PathBuf {
        let path = self.root.join(name);
        std::fs::create_dir_all(&path)
            .unwrap_or_else(|err| panic!("creating {}: {err}", path.display()));
        path
    }

    /// The harness's invocation of a first turn on `claude-sonnet-4-5`, its
    /// state and boot files in the sandbox ([`harness_invocation`] with no
    /// agent variables).
    pub fn harness(&self) -> HarnessInvocation {
        harness_invocation(
            &self.write_dir("state"),
            &self.write_dir("run"),
            &[],
            "claude-sonnet-4-5",
            false,
        )
    }

    /// Writes `name` at the sandbox root and returns its path.
    pub fn write(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.root.join(name);
        std::fs::write(&path, contents)
            .unwrap_or_else(|err| panic!("writing {}: {err}", path.display()));
        path
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// What one CLI run left behind.
#[derive(Debug)]
pub struct CliRun {
    /// The exit code; `None` when the run was killed by a signal.
    pub code: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
}

impl CliRun {
    /// The stdout lines that parse as JSON, in order.
    pub fn lines(&self) -> Vec<Value> {
        self.stdout
            .lines()
            .filter_map(|line| serde_json::from_str(line).ok())
            .collect()
    }

    /// The lines of `type` (and `subtype`, when given).
    pub fn find(&self, kind: &str, subtype: Option<&str>) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|line| line["type"] == kind)
            .filter(|line| subtype.is_none_or(|subtype| line["subtype"] == subtype))
            .collect()
    }

    /// What the harness's classifier makes of this run: every stdout and
    /// stderr line through a `TurnObserver`, then the exit.
    pub fn classified(&self) -> TurnReport {
        let mut observer = TurnObserver::new();
        for line in self.stdout.lines() {
            observer.on_stdout_line(line);
        }
        for line in self.stderr.lines() {
            observer.on_stderr_line(line);
        }
        observer.finish(ExitInfo {
            code: self.code,
            timed_out: self.timed_out,
            ..ExitInfo::default()
        })
    }

    /// The final `result` line; panics with the whole output when there is none.
    pub fn result(&self) -> Value {
        self.find("result", None)
            .pop()
            .unwrap_or_else(|| panic!("the CLI printed no result line\n{self}"))
    }
}

impl std::fmt::Display for CliRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit code {:?}{}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.code,
            if self.timed_out {
                " (killed at timeout)"
            } else {
                ""
            },
            self.stdout,
            self.stderr
        )
    }
}

/// Runs `cli args…` in `cwd` with exactly `env`, `stdin` written then closed,
/// both output pipes drained. The CLI runs in its own process group, which is
/// killed once the CLI exited or `timeout` passed, so nothing it spawned
/// outlives the run.
pub fn run_claude(
    cli: &Path,
    cwd: &Path,
    env: &[(String, String)],
    args: &[&str],
    stdin: &str,
    timeout: Duration,
) -> CliRun {
    let mut child = Command::new(cli)
        .args(args)
        .current_dir(cwd)
        .env_clear()
        .envs(env.iter().map(|(name, value)| (name, value)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|err| panic!("starting {}: {err}", cli.display()));

    let mut input = child.stdin.take().expect("stdin is piped");
    let prompt = stdin.to_string();
    let writer = thread::spawn(move || {
        // The CLI may exit before reading everything; that shows in its output.
        let _ = input.write_all(prompt.as_bytes());
    });
    let stdout = drain(child.stdout.take().expect("stdout is piped"));
    let stderr = drain(child.stderr.take().expect("stderr is piped"));

    let (status, timed_out) = wait_with_timeout(&mut child, timeout);
    let _ = writer.join();
    CliRun {
        code: status.and_then(|status| status.code()),
        timed_out,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> (Option<ExitStatus>, bool) {
    let deadline = Instant::now() + timeout;
    let mut timed_out = false;
    while !has_exited(child) {
        if Instant::now() >= deadline {
            timed_out = true;
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    // The child is not reaped yet, so its pid still names its process group.
    kill_group(child);
    (child.wait().ok(), timed_out)
}

/// Whether the child exited, without reaping it.
fn has_exited(child: &Child) -> bool {
    let pid: libc::id_t = child.id();
    // SAFETY: waitid only writes into the zeroed siginfo_t we own; WNOWAIT
    // leaves the child to be reaped by `Child::wait`.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        libc::waitid(libc::P_PID, pid, &mut info, flags) != 0 || info.si_pid() != 0
    }
}

fn kill_group(child: &Child) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        return;
    };
    // SAFETY: kill(2) with a negative pid signals the process group the child
    // leads (it was spawned with process_group(0)); no memory is involved.
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
    }
}
