//! Runs one claude process and watches it to the end. The child gets explicit
//! stdio, its own process group, an environment without the operator's variables,
//! the prompt on stdin (from a writer thread when it is big), and one pump thread
//! per output pipe, so a full pipe never blocks it; the caller's thread runs one
//! `select!` over the pumps, the child's exit, operator control, the harness's own
//! shutdown and the wall-clock limit. Every helper thread exists before claude is
//! started, so a claude that cannot be given its threads is never started at all:
//! that, like a failed spawn, is [`TurnOutcome::NotStarted`] and not the
//! message's fault. Stopping a child is a ladder: SIGINT to claude (it then
//! aborts its tools and stops its MCP servers), SIGTERM and finally SIGKILL to
//! the whole group. Once claude exits, whatever is left in its group is killed,
//! so no grandchild outlives the turn.

use super::bus::{Bus, LiveEvent};
use super::classify::{ExitInfo, Signal, TurnObserver, TurnOutcome, TurnReport};
use super::control::Control;
use crate::agent_proc::{self, StartFault};
use crate::proto::lines::{self as wire, Line};
use crossbeam_channel::{after, bounded, never, select, Receiver, Sender};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Longest stdout line parsed; longer ones are dropped with a note.
pub const MAX_STDOUT_LINE: usize = 16 * 1024 * 1024;

/// Largest stdout line put on the bus whole; a bigger one is classified in full
/// but shown as a summary, so one huge tool result cannot fill the history.
pub const MAX_EVENT_BYTES: usize = 256 * 1024;

/// Prompts up to this size are written without a thread: every pipe holds at
/// least one page, even under the per-user pipe limits, so the write cannot block.
const SMALL_PROMPT: usize = 4096;

/// How long pipes may stay open after claude exited (a grandchild that left the
/// group can hold them) before the turn ends without them.
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// One claude process to run. Its `Debug` shows the names of the extra
/// environment variables but never their values (a stored token is one).
#[derive(Clone)]
pub struct Invocation {
    pub bin: String,
    pub args: Vec<String>,
    pub stdin: String,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub timeout: Duration,
    /// Time between the steps of the stop ladder.
    pub grace: Duration,
}

impl std::fmt::Debug for Invocation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let env: Vec<&str> = self.env.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Invocation")
            .field("bin", &self.bin)
            .field("args", &self.args)
            .field("stdin_bytes", &self.stdin.len())
            .field("env", &env)
            .field("cwd", &self.cwd)
            .field("timeout", &self.timeout)
            .field("grace", &self.grace)
            .finish()
    }
}

/// What happened besides the report.
#[derive(Debug)]
pub struct RunResult {
    pub report: TurnReport,
    /// The harness was told to shut down during the run.
    pub terminated: bool,
    /// The operator interrupted the turn.
    pub interrupted: bool,
    /// Control requests that arrived during the run, for after it.
    pub deferred: Vec<Control>,
    pub elapsed: Duration,
}

enum Pipe {
    Line(String),
    TooLong,
    Closed,
}

/// A thread started ahead of the thing it works on, which it gets through the
/// returned sender; dropping the sender unused ends the thread.
fn worker<T: Send + 'static>(
    name: &str,
    job: impl FnOnce(T) + Send + 'static,
) -> io::Result<Sender<T>> {
    let (tx, rx) = bounded::<T>(1);
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Ok(x) = rx.recv() {
                job(x);
            }
        })?;
    Ok(tx)
}

/// A reader thread for one output pipe, waiting for the pipe.
fn pump<R: Read + Send + 'static>(name: &str) -> io::Result<(Sender<R>, Receiver<Pipe>)> {
    let (tx, rx) = bounded::<Pipe>(256);
    let input = worker(&format!("claude-{name}"), move |stream: R| {
        let mut r = BufReader::with_capacity(64 * 1024, stream);
        loop {
            let ev = match wire::read_line(&mut r, MAX_STDOUT_LINE) {
                Ok(Line::Text(s)) => Pipe::Line(s),
                Ok(Line::NotUtf8) => Pipe::Line("(a line that is not UTF-8)".into()),
                Ok(Line::TooLong) => Pipe::TooLong,
                Ok(Line::Eof) | Err(_) => {
                    let _ = tx.send(Pipe::Closed);
                    return;
                }
            };
            if tx.send(ev).is_err() {
                return;
            }
        }
    })?;
    Ok((input, rx))
}

/// A started claude: its pid and what its helper threads report.
struct Started {
    pid: i32,
    out: Receiver<Pipe>,
    err: Receiver<Pipe>,
    exit: Receiver<io::Result<ExitStatus>>,
}

/// Starts the helper threads, then claude, then hands each thread its part. A
/// thread, pipe or process that cannot be created leaves nothing running and
/// returns why, with what to do about it.
fn start(inv: &Invocation) -> Result<Started, String> {
    let fault = |what: &str, e: io::Error| match StartFault::of(&e) {
        StartFault::Resources => {
            format!("{what}: {e} (the host is short of file descriptors, memory or processes)")
        }
        StartFault::Setup => format!(
            "{what}: {e} (HIVE_CLAUDE_BIN must name the Claude Code CLI, executable, and \
             the state dir must exist)"
        ),
    };
    let thread = |e| fault("cannot start a thread for claude", e);
    let (out_tx, out) = pump::<ChildStdout>("stdout").map_err(thread)?;
    let (err_tx, err) = pump::<ChildStderr>("stderr").map_err(thread)?;
    let (exit_tx, exit) = bounded::<io::Result<ExitStatus>>(1);
    let waiter = worker("claude-wait", move |mut child: Child| {
        let _ = exit_tx.send(child.wait());
    })
    .map_err(thread)?;
    // A prompt that fits the pipe buffer is written at once; a bigger one from
    // a thread, so a child that reads slowly never blocks the loop.
    let writer = if inv.stdin.len() > SMALL_PROMPT {
        let prompt = inv.stdin.clone();
        let w = worker("claude-stdin", move |mut stdin: ChildStdin| {
            let _ = stdin.write_all(prompt.as_bytes());
        })
        .map_err(thread)?;
        Some(w)
    } else {
        None
    };

    let mut cmd = Command::new(&inv.bin);
    cmd.args(&inv.args)
        .current_dir(&inv.cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    for (k, v) in &inv.env {
        cmd.env(k, v);
    }
    agent_proc::scrub_operator_env(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| fault(&format!("cannot start claude ({})", inv.bin), e))?;
    let pid = child.id() as i32;
    // A child that exits without reading is normal; EPIPE is ignored.
    if let Some(mut stdin) = child.stdin.take() {
        match writer {
            Some(w) => {
                let _ = w.send(stdin);
            }
            None => {
                let _ = stdin.write_all(inv.stdin.as_bytes());
            }
        }
    }
    if let Some(s) = child.stdout.take() {
        let _ = out_tx.send(s);
    }
    if let Some(s) = child.stderr.take() {
        let _ = err_tx.send(s);
    }
    let _ = waiter.send(child);
    Ok(Started {
        pid,
        out,
        err,
        exit,
    })
}

/// Sends `sig` to one process, or to a whole group when `pid` is negative.
fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a pid or negated process-group id has no memory effects.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Where the stop ladder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Running,
    SentInt,
    SentTerm,
    SentKill,
}

/// Runs `inv`, feeding every line to `observer` and the bus, until claude exits.
pub fn run(
    inv: &Invocation,
    mut observer: TurnObserver,
    bus: &Bus,
    control: &Receiver<Control>,
    term: &Receiver<()>,
) -> RunResult {
    let start = Instant::now();
    let started = match self::start(inv) {
        Ok(s) => s,
        Err(why) => {
            bus.note(why.clone());
            let mut report = observer.finish(ExitInfo {
                code: Some(127),
                ..ExitInfo::default()
            });
            report.outcome = TurnOutcome::NotStarted(why);
            return RunResult {
                report,
                terminated: false,
                interrupted: false,
                deferred: Vec::new(),
                elapsed: start.elapsed(),
            };
        }
    };
    let pid = started.pid;
    let exit_rx = started.exit;
    let mut out = Some(started.out);
    let mut err = Some(started.err);

    let deadline = after(inv.timeout);
    let mut ladder = never();
    let mut stop = Stop::Running;
    let mut status: Option<std::io::Result<ExitStatus>> = None;
    let mut drain_deadline = never();
    let (mut timed_out, mut early_auth, mut terminated, mut interrupted) =
        (false, false, false, false);
    let mut deferred = Vec::new();
    let never_pipe = never::<Pipe>();
    let never_ctl = never::<Control>();
    let never_term = never::<()>();
    let never_exit = never::<std::io::Result<ExitStatus>>();

    // Starts or advances the stop ladder.
    let escalate = |stop: &mut Stop, ladder: &mut Receiver<Instant>, quick: bool| {
        let step = if quick {
            inv.grace.min(Duration::from_millis(500))
        } else {
            inv.grace
        };
        *stop = match *stop {
            Stop::Running => {
                signal(pid, libc::SIGINT);
                Stop::SentInt
            }
            Stop::SentInt => {
                signal(-pid, libc::SIGTERM);
                Stop::SentTerm
            }
            Stop::SentTerm | Stop::SentKill => {
                signal(-pid, libc::SIGKILL);
                Stop::SentKill
            }
        };
        *ladder = if *stop == Stop::SentKill {
            never()
        } else {
            after(step)
        };
    };

    loop {
        if status.is_some() && out.is_none() && err.is_none() {
            break;
        }
        let out_rx = out.as_ref().unwrap_or(&never_pipe);
        let err_rx = err.as_ref().unwrap_or(&never_pipe);
        let alive = status.is_none();
        let ctl = if alive { control } else { &never_ctl };
        let exit_src = if alive { &exit_rx } else { &never_exit };
        // The stop channel stays ready once closed: watch it only until acted on.
        let trm = if alive && !terminated {
            term
        } else {
            &never_term
        };
        select! {
            recv(out_rx) -> ev => match ev {
                Ok(Pipe::Line(line)) => {
                    if line.trim().is_empty() {
                        continue;
                    }
                    match serde_json::from_str::<serde_json::Value>(&line) {
                        Ok(v) => {
                            for s in observer.on_stdout_value(&v) {
                                if s == Signal::KillEarlyAuth && alive && stop == Stop::Running {
                                    bus.note("claude is retrying a refused credential (401): stopping it early");
                                    early_auth = true;
                                    escalate(&mut stop, &mut ladder, true);
                                }
                            }
                            if line.len() > MAX_EVENT_BYTES {
                                let ty = v.get("type").cloned().unwrap_or_default();
                                bus.emit(LiveEvent::Stream {
                                    value: serde_json::json!({"type": ty, "hive_truncated": true, "bytes": line.len()}),
                                });
                                bus.note(format!("a {} byte stdout line is not shown in full", line.len()));
                            } else {
                                bus.emit(LiveEvent::Stream { value: v });
                            }
                        }
                        Err(_) => {
                            observer.on_stdout_line(&line);
                            bus.note(format!("stdout: {line}"));
                        }
                    }
                }
                Ok(Pipe::TooLong) => bus.note(format!("a stdout line over {MAX_STDOUT_LINE} bytes was dropped")),
                Ok(Pipe::Closed) | Err(_) => out = None,
            },
            recv(err_rx) -> ev => match ev {
                Ok(Pipe::Line(line)) => {
                    observer.on_stderr_line(&line);
                    bus.note(line);
                }
                Ok(Pipe::TooLong) => bus.note("a stderr line too long to show was dropped"),
                Ok(Pipe::Closed) | Err(_) => err = None,
            },
            recv(exit_src) -> st => {
                status = Some(st.unwrap_or_else(|_| Err(std::io::Error::other("waiter thread gone"))));
                // Whatever claude left in its group dies with the turn.
                signal(-pid, libc::SIGKILL);
                drain_deadline = after(DRAIN_GRACE);
                ladder = never();
            },
            recv(ctl) -> c => match c {
                Ok(Control::Interrupt) => {
                    if stop == Stop::Running {
                        bus.note("interrupt requested: stopping claude");
                        interrupted = true;
                        escalate(&mut stop, &mut ladder, false);
                    }
                }
                Ok(other) => deferred.push(other),
                Err(_) => {}
            },
            recv(trm) -> _ => {
                if !terminated {
                    terminated = true;
                    escalate(&mut stop, &mut ladder, true);
                }
            },
            recv(deadline) -> _ => {
                if alive && stop == Stop::Running {
                    bus.note(format!("turn timed out after {:?}: stopping claude", inv.timeout));
                    timed_out = true;
                    escalate(&mut stop, &mut ladder, false);
                }
            },
            recv(ladder) -> _ => escalate(&mut stop, &mut ladder, terminated || early_auth),
            recv(drain_deadline) -> _ => {
                bus.note("claude exited but something still holds its output pipes; not waiting for them");
                break;
            },
        }
    }
    let (code, sig) = match &status {
        Some(Ok(st)) => (st.code(), st.signal()),
        Some(Err(e)) => {
            log::error!("cannot read how claude exited: {e}");
            (None, None)
        }
        None => (None, None),
    };
    let elapsed = start.elapsed();
    log::debug!("claude exited: {status:?} (timed out {timed_out}, early auth {early_auth})");
    let report = observer.finish(ExitInfo {
        code,
        signal: sig,
        timed_out,
        killed_early_for_auth: early_auth,
        elapsed: Some(elapsed),
    });
    RunResult {
        report,
        terminated,
        interrupted,
        deferred,
        elapsed,
    }
}
