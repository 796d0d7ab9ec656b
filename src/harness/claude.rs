//! The claude actor: one running claude process, owned by a [`ClaudeRun`]
//! that the turn loop holds in its phase. The child gets explicit stdio, its
//! own process group (a `sys::ProcessGroup`, started by `posix_spawn`), an
//! environment without the operator's variables (built once, `child_env`),
//! the prompt on stdin (from a writer thread when it is big), and one pump
//! thread per output pipe, so a full pipe never blocks it. The pumps feed one
//! bounded channel of lines and the waiter (which waits without reaping) a
//! one-shot exit notice. These threads are `sys::process::Worker`s, kept idle
//! after a run for the next one, so a turn on a busy harness starts no
//! thread. The loop selects on both next to everything else it waits for, so
//! a running turn is a phase of the loop, not a call it is stuck in, and the loop reaps
//! the child itself ([`ClaudeRun::on_exit`]), so no signal of the ladder can
//! reach a recycled pid. Every helper thread exists before claude is started,
//! so a claude that cannot be given its threads is never started at all:
//! that, like a failed spawn, is `NotStarted` and not the message's fault.
//! Stopping a child is a ladder the loop drives from its timer: SIGINT to
//! claude (it then aborts its tools and stops its MCP servers), SIGTERM and
//! finally SIGKILL to the whole group. Once claude exits, whatever is left in
//! its group is killed, so no grandchild outlives the turn; dropping a
//! `ClaudeRun` kills the group and reaps it (on a `claude-reaper` thread when
//! that takes longer than a few seconds).

use crate::agent_proc::{self, StartFault};
use crate::proto::lines::{self as wire, Line};
use crate::sys::process::{wait_exit_no_reap, ChildEnv, Piped, Spawn, Worker};
use crate::sys::ProcessGroup;
use crossbeam_channel::{bounded, Receiver, Sender};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::OnceLock;
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
pub const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// How long dropping a run waits for the killed child to exit before it leaves
/// the reaping to a thread of its own.
const REAP_WAIT: Duration = Duration::from_secs(5);

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

/// One thing a pump read from an output pipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pipe {
    Line(String),
    /// A line over [`MAX_STDOUT_LINE`], dropped.
    TooLong,
    /// End of the pipe.
    Closed,
}

/// What the pumps hand the loop, tagged with the pipe it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout(Pipe),
    Stderr(Pipe),
}

/// The job of a reader thread for one output pipe: what it reads goes on
/// `tx`, tagged by `tag`, until the pipe closes. Its 64 KiB read buffer is the
/// thread's own, kept for the next run the thread serves ([`KeptBuf`]), so a
/// turn does not map and unmap one per pipe.
fn pump<R: Read + Send + 'static>(
    stream: R,
    tx: Sender<Output>,
    tag: fn(Pipe) -> Output,
) -> impl FnOnce() + Send + 'static {
    move || {
        let mut r = KeptBuf::take(stream);
        loop {
            let ev = match wire::read_line(&mut r, MAX_STDOUT_LINE) {
                Ok(Line::Text(s)) => Pipe::Line(s),
                Ok(Line::NotUtf8) => Pipe::Line("(a line that is not UTF-8)".into()),
                Ok(Line::TooLong) => Pipe::TooLong,
                Ok(Line::Eof) | Err(_) => {
                    let _ = tx.send(tag(Pipe::Closed));
                    return;
                }
            };
            if tx.send(tag(ev)).is_err() {
                return;
            }
        }
    }
}

/// The read buffer of a pump, kept by its worker thread between runs.
const PUMP_BUFFER: usize = 64 * 1024;

thread_local! {
    static PUMP_BUF: std::cell::Cell<Option<Box<[u8]>>> = const { std::cell::Cell::new(None) };
}

/// A buffered reader over the thread's kept buffer, which it gives back when
/// dropped.
struct KeptBuf<R> {
    inner: R,
    buf: Option<Box<[u8]>>,
    pos: usize,
    end: usize,
}

impl<R: Read> KeptBuf<R> {
    fn take(inner: R) -> KeptBuf<R> {
        let buf = PUMP_BUF
            .take()
            .unwrap_or_else(|| vec![0; PUMP_BUFFER].into_boxed_slice());
        KeptBuf {
            inner,
            buf: Some(buf),
            pos: 0,
            end: 0,
        }
    }
}

impl<R> Drop for KeptBuf<R> {
    fn drop(&mut self) {
        PUMP_BUF.set(self.buf.take());
    }
}

impl<R: Read> Read for KeptBuf<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = {
            let available = io::BufRead::fill_buf(self)?;
            let n = available.len().min(out.len());
            out[..n].copy_from_slice(&available[..n]);
            n
        };
        io::BufRead::consume(self, n);
        Ok(n)
    }
}

impl<R: Read> io::BufRead for KeptBuf<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        let buf = self.buf.as_deref_mut().unwrap_or_default();
        if self.pos >= self.end {
            self.end = self.inner.read(buf)?;
            self.pos = 0;
        }
        Ok(&buf[self.pos..self.end])
    }

    fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.end);
    }
}

/// What every claude inherits: this process's environment less the
/// operator's variables (`agent_proc::is_operator_var`). The environment does
/// not change while the harness runs, so it is read once, not at every spawn.
fn child_env() -> &'static ChildEnv {
    static ENV: OnceLock<ChildEnv> = OnceLock::new();
    ENV.get_or_init(|| {
        ChildEnv::inherited(|k| !k.to_str().is_some_and(agent_proc::is_operator_var))
    })
}

/// The name of the helper threads; a thread is kept idle after its run and
/// serves the next one (`sys::process::Worker`), so one name fits every job.
const THREAD: &str = "claude-io";

/// Reserves the helper threads (idle ones of earlier runs, or new ones),
/// then starts claude, then hands each thread its part. A thread, pipe or
/// process that cannot be created leaves nothing running and returns why,
/// with what to do about it.
fn start(inv: &Invocation) -> Result<ClaudeRun, String> {
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
    let out_worker = Worker::reserve(THREAD).map_err(thread)?;
    let err_worker = Worker::reserve(THREAD).map_err(thread)?;
    let waiter = Worker::reserve(THREAD).map_err(thread)?;
    // A prompt that fits the pipe buffer is written at once; a bigger one from
    // a thread, so a child that reads slowly never blocks the loop.
    let writer = if inv.stdin.len() > SMALL_PROMPT {
        Some(Worker::reserve(THREAD).map_err(thread)?)
    } else {
        None
    };

    // The operator's variables stay out (`child_env`, and none is set here).
    let set: Vec<(String, String)> = inv
        .env
        .iter()
        .filter(|(k, _)| !agent_proc::is_operator_var(k))
        .cloned()
        .collect();
    let Piped {
        group,
        mut stdin,
        stdout,
        stderr,
    } = ProcessGroup::spawn_piped(&Spawn {
        program: Path::new(&inv.bin),
        args: &inv.args,
        env: child_env(),
        set: &set,
        cwd: &inv.cwd,
    })
    .map_err(|e| fault(&format!("cannot start claude ({})", inv.bin), e))?;
    // Bulk output is bounded: a claude that prints faster than the loop reads
    // waits on its pipe.
    let (lines_tx, output) = bounded::<Output>(256);
    let (exit_tx, exit) = bounded::<()>(1);
    let pid = group.id();
    // A child that exits without reading is normal; EPIPE is ignored.
    match writer {
        Some(w) => {
            let prompt = inv.stdin.clone();
            w.run(move || {
                let _ = stdin.write_all(prompt.as_bytes());
            });
        }
        None => {
            let _ = stdin.write_all(inv.stdin.as_bytes());
            drop(stdin);
        }
    }
    out_worker.run(pump(stdout, lines_tx.clone(), Output::Stdout));
    err_worker.run(pump(stderr, lines_tx, Output::Stderr));
    // Waits without reaping: the loop reaps (`on_exit`), so the pid stays
    // claude's until then.
    waiter.run(move || {
        wait_exit_no_reap(pid);
        let _ = exit_tx.send(());
    });
    Ok(ClaudeRun {
        group: Some(group),
        output,
        exit,
        open_pipes: 2,
        exited: false,
        stop: Stop::Running,
        ladder_at: None,
        grace: inv.grace,
        quick: false,
    })
}

/// Where the stop ladder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Running,
    SentInt,
    SentTerm,
    SentKill,
}

/// One running claude. The loop selects on [`ClaudeRun::output`] and
/// [`ClaudeRun::exit`] while they are open, calls [`ClaudeRun::stop`] to start
/// the stop ladder and [`ClaudeRun::step`] when [`ClaudeRun::ladder_due`]
/// passes, and [`ClaudeRun::on_exit`] once [`ClaudeRun::exit`] said claude
/// exited. Dropping it kills the whole group and reaps it.
pub struct ClaudeRun {
    /// The child; `None` once dropped by [`Drop`].
    group: Option<ProcessGroup>,
    output: Receiver<Output>,
    /// One notice when claude has exited (not reaped yet).
    exit: Receiver<()>,
    open_pipes: u8,
    exited: bool,
    stop: Stop,
    ladder_at: Option<Instant>,
    grace: Duration,
    /// The ladder runs at the quick pace (a stop of the harness, a dead
    /// credential, MCP servers that did not start).
    quick: bool,
}

impl ClaudeRun {
    /// Starts claude as `inv` says, or says why it could not be started.
    pub fn start(inv: &Invocation) -> Result<ClaudeRun, String> {
        start(inv)
    }

    /// The lines of both pipes, while either is open.
    pub fn output(&self) -> Option<&Receiver<Output>> {
        (self.open_pipes > 0).then_some(&self.output)
    }

    /// The notice that claude exited, until it was taken ([`ClaudeRun::on_exit`]).
    pub fn exit(&self) -> Option<&Receiver<()>> {
        (!self.exited).then_some(&self.exit)
    }

    /// Notes a pipe that closed (the output channel stays open while the
    /// other pump runs).
    pub fn on_output(&mut self, o: &Output) {
        if matches!(
            o,
            Output::Stdout(Pipe::Closed) | Output::Stderr(Pipe::Closed)
        ) {
            self.open_pipes = self.open_pipes.saturating_sub(1);
        }
    }

    /// Both pumps are gone (their channel disconnected).
    pub fn pipes_gone(&mut self) {
        self.open_pipes = 0;
    }

    /// claude exited (or its waiter is gone): whatever it left in its group
    /// dies with the turn, while the group's number is still claude's (it is
    /// not reaped yet), and then claude is reaped; its exit status.
    pub fn on_exit(&mut self) -> io::Result<ExitStatus> {
        self.exited = true;
        self.ladder_at = None;
        let group = self
            .group
            .as_mut()
            .ok_or_else(|| io::Error::other("claude is gone"))?;
        group.kill();
        group.wait()
    }

    pub fn has_exited(&self) -> bool {
        self.exited
    }

    pub fn pipes_open(&self) -> bool {
        self.open_pipes > 0
    }

    /// Starts the stop ladder (SIGINT to claude first); at `quick` pace each
    /// step waits at most half a second. A second call can only quicken it.
    pub fn stop(&mut self, quick: bool) {
        if self.exited {
            return;
        }
        if quick && !self.quick {
            self.quick = true;
            if let Some(at) = self.ladder_at {
                self.ladder_at = Some(at.min(Instant::now() + self.step_pause()));
            }
        }
        if self.stop == Stop::Running {
            self.step();
        }
    }

    /// The stop ladder has begun.
    pub fn stopping(&self) -> bool {
        self.stop != Stop::Running
    }

    /// When the ladder takes its next step.
    pub fn ladder_due(&self) -> Option<Instant> {
        self.ladder_at
    }

    fn step_pause(&self) -> Duration {
        if self.quick {
            self.grace.min(Duration::from_millis(500))
        } else {
            self.grace
        }
    }

    /// The next step of the ladder: SIGINT to claude, SIGTERM to its group,
    /// SIGKILL to its group.
    pub fn step(&mut self) {
        if self.exited {
            return;
        }
        let Some(group) = &self.group else {
            return;
        };
        self.stop = match self.stop {
            Stop::Running => {
                group.signal_leader(libc::SIGINT);
                Stop::SentInt
            }
            Stop::SentInt => {
                group.signal(libc::SIGTERM);
                Stop::SentTerm
            }
            Stop::SentTerm | Stop::SentKill => {
                group.kill();
                Stop::SentKill
            }
        };
        self.ladder_at = (self.stop != Stop::SentKill).then(|| Instant::now() + self.step_pause());
    }
}

impl Drop for ClaudeRun {
    /// Nothing claude started outlives its run, and the child is reaped: here
    /// once it has exited, or, when a killed claude does not exit within
    /// `REAP_WAIT` (stuck in the kernel), on a `claude-reaper` thread, so the
    /// loop is never held up.
    fn drop(&mut self) {
        let Some(group) = self.group.take() else {
            return;
        };
        if self.exited {
            // `on_exit` killed the group while its number was claude's and
            // reaped claude; the number may be another's now.
            let _ = group.wait_leaving_rest();
            return;
        }
        group.kill();
        if self.exit.recv_timeout(REAP_WAIT).is_ok() {
            drop(group); // claude has exited: reaped now
            return;
        }
        log::error!(
            "claude (pid {}) was killed but has not exited in {REAP_WAIT:?}; reaping it later",
            group.id()
        );
        let reaper = std::thread::Builder::new()
            .name("claude-reaper".into())
            .spawn(move || drop(group));
        if let Err(e) = reaper {
            log::error!("cannot start a thread to reap claude: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn sh(script: &str) -> Invocation {
        Invocation {
            bin: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            stdin: String::new(),
            env: Vec::new(),
            cwd: std::env::temp_dir(),
            timeout: Duration::from_secs(60),
            grace: Duration::from_millis(200),
        }
    }

    fn lines(run: &mut ClaudeRun) -> Vec<Output> {
        let mut out = Vec::new();
        while let Some(rx) = run.output() {
            let o = rx.recv_timeout(Duration::from_secs(10)).expect("a line");
            run.on_output(&o);
            out.push(o);
        }
        out
    }

    #[test]
    fn a_pump_reads_lines_longer_than_its_buffer_and_keeps_it_for_the_next_run() {
        let long = "x".repeat(3 * PUMP_BUFFER + 17);
        let input = format!("short\n{long}\nlast without a newline");
        let run = |input: String| {
            let (tx, rx) = crossbeam_channel::unbounded();
            pump(std::io::Cursor::new(input.into_bytes()), tx, Output::Stdout)();
            rx.try_iter().collect::<Vec<_>>()
        };
        let first = run(input.clone());
        let kept = PUMP_BUF.take().expect("the buffer is kept");
        let at = kept.as_ptr();
        PUMP_BUF.set(Some(kept));
        let second = run(input);
        assert_eq!(first, second);
        let lines: Vec<String> = first
            .into_iter()
            .filter_map(|o| match o {
                Output::Stdout(Pipe::Line(l)) => Some(l),
                _ => None,
            })
            .collect();
        assert_eq!(lines, ["short", long.as_str(), "last without a newline"]);
        assert_eq!(
            PUMP_BUF.take().map(|b| b.as_ptr()),
            Some(at),
            "the second run read through the first one's buffer"
        );
    }

    #[test]
    fn both_pipes_reach_one_channel_and_the_exit_its_own() {
        let mut run = ClaudeRun::start(&sh("echo out; echo err >&2; exit 3")).unwrap();
        let got = lines(&mut run);
        assert!(
            got.contains(&Output::Stdout(Pipe::Line("out".into()))),
            "{got:?}"
        );
        assert!(
            got.contains(&Output::Stderr(Pipe::Line("err".into()))),
            "{got:?}"
        );
        run.exit()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        let st = run.on_exit().unwrap();
        assert_eq!(st.code(), Some(3));
        assert!(run.exit().is_none() && run.output().is_none());
    }

    #[test]
    fn the_ladder_interrupts_first_and_dropping_kills_the_group() {
        // The shell ignores SIGINT (once it says so); its child sleeps in the
        // same group.
        let mut run = ClaudeRun::start(&sh("trap '' INT; echo ready; sleep 60 & wait")).unwrap();
        let first = run
            .output()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        assert_eq!(first, Output::Stdout(Pipe::Line("ready".into())));
        run.stop(false);
        assert!(run.stopping());
        let due = run.ladder_due().expect("a next step");
        assert!(due > Instant::now());
        run.step(); // SIGTERM to the group
        run.exit()
            .unwrap()
            .recv_timeout(Duration::from_secs(10))
            .unwrap();
        let st = run.on_exit().unwrap();
        assert_eq!(st.signal(), Some(libc::SIGTERM));
        assert_eq!(run.ladder_due(), None);

        let run = ClaudeRun::start(&sh("sleep 60")).unwrap();
        let pid = run.group.as_ref().unwrap().id();
        drop(run);
        // A zombie keeps its /proc entry: gone means killed and reaped.
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        assert!(!alive, "dropped and reaped");
    }

    #[test]
    fn a_missing_binary_is_an_error_that_says_what_to_fix() {
        let mut inv = sh("");
        inv.bin = "/nonexistent/claude".into();
        let e = ClaudeRun::start(&inv).err().unwrap();
        assert!(
            e.contains("HIVE_CLAUDE_BIN") && e.contains("/nonexistent/claude"),
            "{e}"
        );
    }
}
