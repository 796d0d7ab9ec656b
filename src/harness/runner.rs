//! Runs one claude process and watches it to the end. The child gets explicit
//! stdio, its own process group, the prompt on stdin from a writer thread, and one
//! pump thread per output pipe, so a full pipe never blocks it; the caller's thread
//! runs one `select!` over the pumps, the child's exit, operator control, the
//! harness's own shutdown and the wall-clock limit. Stopping a child is a ladder:
//! SIGINT to claude (it then aborts its tools and stops its MCP servers), SIGTERM
//! and finally SIGKILL to the whole group. Once claude exits, whatever is left in
//! its group is killed, so no grandchild outlives the turn.

use super::bus::{Bus, LiveEvent};
use super::classify::{ExitInfo, Signal, TurnObserver, TurnReport};
use super::control::Control;
use crate::wire::{self, Line};
use crossbeam_channel::{after, bounded, never, select, Receiver};
use std::io::{BufReader, Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
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

/// One claude process to run.
#[derive(Debug, Clone)]
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

fn pump(name: &str, stream: impl Read + Send + 'static) -> Receiver<Pipe> {
    let (tx, rx) = bounded::<Pipe>(256);
    let spawned = std::thread::Builder::new()
        .name(format!("claude-{name}"))
        .spawn(move || {
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
        });
    if let Err(e) = spawned {
        log::error!("cannot start the {name} pump: {e}");
    }
    rx
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
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("cannot start claude ({}): {e}", inv.bin);
            bus.note(msg.clone());
            observer.on_stderr_line(&msg);
            let report = observer.finish(ExitInfo {
                code: Some(127),
                ..ExitInfo::default()
            });
            return RunResult {
                report,
                terminated: false,
                interrupted: false,
                deferred: Vec::new(),
                elapsed: start.elapsed(),
            };
        }
    };
    let pid = child.id() as i32;
    if let Some(mut stdin) = child.stdin.take() {
        // A child that exits without reading is normal; EPIPE is ignored. A
        // prompt that fits the pipe buffer is written at once; a bigger one from
        // a thread, so a child that reads slowly never blocks the loop.
        if inv.stdin.len() <= SMALL_PROMPT {
            let _ = stdin.write_all(inv.stdin.as_bytes());
        } else {
            let prompt = inv.stdin.clone();
            let _ = std::thread::Builder::new()
                .name("claude-stdin".into())
                .spawn(move || {
                    let _ = stdin.write_all(prompt.as_bytes());
                });
        }
    }
    let mut out = child.stdout.take().map(|s| pump("stdout", s));
    let mut err = child.stderr.take().map(|s| pump("stderr", s));
    let (exit_tx, exit_rx) = bounded::<std::io::Result<ExitStatus>>(1);
    let _ = std::thread::Builder::new()
        .name("claude-wait".into())
        .spawn(move || {
            let _ = exit_tx.send(child.wait());
        });

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
