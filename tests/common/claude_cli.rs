//! The real Claude Code CLI in tests: where it is installed, whether a test may
//! skip without it, the hermetic environment it runs in, and a runner that feeds
//! it stdin, drains its output and kills it when a wall-clock timeout passes.
//!
//! `.ci/run` installs the pinned version with npm into [`install_dir`] under the
//! crate root; `docs/testing.md` describes the set-up.

use serde_json::Value;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The CLI version the reference notes and these tests were written against.
pub const CLAUDE_CLI_VERSION: &str = "2.1.197";

/// The npm package that ships the CLI.
pub const CLAUDE_CLI_PACKAGE: &str = "@anthropic-ai/claude-code";

/// Set to `1` (as `.ci/run` does) to turn a missing CLI into a test failure.
pub const REQUIRE_ENV: &str = "HIVE_REQUIRE_REAL_CLAUDE";

/// Set to a `claude` executable to use it instead of the installed one.
pub const OVERRIDE_ENV: &str = "HIVE_CLAUDE_CLI";

/// The one install location `.ci/run` uses: an npm prefix inside the crate.
pub fn install_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/claude-cli")
}

/// The command that installs the pinned CLI where [`claude_cli_path`] finds it.
pub fn install_command() -> String {
    format!(
        "npm install --prefix {} --save-exact {CLAUDE_CLI_PACKAGE}@{CLAUDE_CLI_VERSION}",
        install_dir().display()
    )
}

/// The pinned CLI, or why it cannot be used. Looked up once per test binary:
/// `$HIVE_CLAUDE_CLI`, then [`install_dir`], then `$HOME/.cache/hive-claude-cli`,
/// and the first candidate that exists must report [`CLAUDE_CLI_VERSION`].
pub fn claude_cli_path() -> Option<PathBuf> {
    find_cli().as_ref().ok().cloned()
}

fn find_cli() -> &'static Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(|| {
        let mut candidates = Vec::new();
        if let Some(path) = std::env::var_os(OVERRIDE_ENV) {
            candidates.push(PathBuf::from(path));
        }
        candidates.push(install_dir().join("node_modules/.bin/claude"));
        if let Some(home) = std::env::var_os("HOME") {
            candidates
                .push(Path::new(&home).join(".cache/hive-claude-cli/node_modules/.bin/claude"));
        }
        let Some(path) = candidates.iter().find(|path| path.is_file()) else {
            let looked: Vec<String> = candidates
                .iter()
                .map(|path| path.display().to_string())
                .collect();
            return Err(format!("looked for {}", looked.join(", ")));
        };
        let version = cli_version(path)?;
        if version.split_whitespace().next() != Some(CLAUDE_CLI_VERSION) {
            return Err(format!(
                "{} reports version {version:?}, the tests need {CLAUDE_CLI_VERSION}",
                path.display()
            ));
        }
        Ok(path.clone())
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

/// The CLI for a test that needs it. Without it the test should return early:
/// this prints a loud SKIPPED line, or panics when `HIVE_REQUIRE_REAL_CLAUDE=1`.
pub fn require_real_claude() -> Option<PathBuf> {
    match find_cli() {
        Ok(path) => Some(path.clone()),
        Err(reason) if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") => panic!(
            "{REQUIRE_ENV}=1 but the real Claude Code CLI cannot be used ({reason}); \
             install it with: {}",
            install_command()
        ),
        Err(reason) => {
            // Written to the stderr handle, not with eprintln!, so that the test
            // harness does not capture the line and hide it.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: real Claude Code CLI not installed ({reason}) (run: {})",
                install_command()
            );
            None
        }
    }
}

/// The whole environment of a hermetic CLI run against the fake API at
/// `base_url`: its own HOME, an API key, no retries, no traffic but the API.
/// Run the CLI with `env_clear()` and these.
pub fn claude_env(home: &Path, base_url: &str) -> Vec<(String, String)> {
    [
        ("HOME", home.to_string_lossy().as_ref()),
        ("PATH", &system_path()),
        ("ANTHROPIC_BASE_URL", base_url),
        ("ANTHROPIC_API_KEY", "sk-test"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
        ("DISABLE_TELEMETRY", "1"),
        ("CLAUDE_CODE_MAX_RETRIES", "0"),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value.to_string()))
    .collect()
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
