//! The claude actor: one running claude process, owned by a [`ClaudeRun`]
//! that the turn loop holds in its phase. The child gets explicit stdio, its
//! own process group (a `sys::ProcessGroup`, started by `posix_spawn`), an
//! environment without the operator's variables (built once, `child_env`),
//! the prompt on stdin (from a writer thread when it is big), and one io
//! thread that polls both output pipes and a descriptor that tells claude's
//! exit (a pidfd, or a waiter's pipe where the host gives no pidfds:
//! `sys::process::ExitNotice`), so a full pipe never blocks it, and hands
//! the loop what each wake found as one batch on one bounded channel. These
//! threads are `sys::process::Worker`s, kept idle after a run for the next
//! one, so a turn on a busy harness starts no thread. The loop selects on
//! that channel next to everything else it waits for, so a running turn is a
//! phase of the loop, not a call it is stuck in, and the loop reaps the child
//! itself ([`ClaudeRun::on_exit`]), so no signal of the ladder can reach a
//! recycled pid. Every helper thread exists before claude is started, so a
//! claude that cannot be given its threads is never started at all: that,
//! like a failed spawn, is `NotStarted` and not the message's fault.
//! Stopping a child is a ladder the loop drives from its timer: SIGINT to
//! claude (it then aborts its tools and stops its MCP servers), SIGTERM and
//! finally SIGKILL to the whole group. Once claude exits, whatever is left in
//! its group is killed, so no grandchild outlives the turn; dropping a
//! `ClaudeRun` kills the group and reaps it (on a `claude-reaper` thread when
//! that takes longer than a few seconds).
//!
//! Each stdout line comes with the stdout byte offset of its end, and before
//! the ladder's first signal the run takes the count of bytes claude had
//! written by then ([`ClaudeRun::written_before_stop`]): what the io thread
//! has read plus what still waits in the pipe (`FIONREAD` on a duplicate of
//! its read end), taken so that no read falls between the two. A line that
//! ends within it was written before the harness signalled claude, however
//! late the loop reads it: a `result` there says how the turn went, one past
//! it may be the CLI's answer to the signal.

use crate::agent_proc::{self, StartFault};
use crate::proto::lines::{Line, Splitter};
use crate::sys::fd::{self, poll, PollFd};
use crate::sys::process::{ChildEnv, ExitNotice, Piped, Spawn, Worker};
use crate::sys::ProcessGroup;
use crossbeam_channel::{bounded, Receiver, Sender};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
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

/// One thing read from an output pipe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pipe {
    Line(String),
    /// A line over [`MAX_STDOUT_LINE`], dropped.
    TooLong,
    /// End of the pipe.
    Closed,
}

/// What claude's io thread hands the loop: a line (or the end) of one of
/// its pipes, tagged with the pipe, or its exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// A stdout line (or the end), with the stdout byte offset of its end.
    Stdout(Pipe, u64),
    Stderr(Pipe),
    /// claude has exited (it is not reaped yet: [`ClaudeRun::on_exit`]).
    Exited,
}

/// The read buffer of the io thread, kept by its worker thread between runs,
/// so a turn does not map and unmap one.
const IO_BUFFER: usize = 64 * 1024;

/// The most a batch holds, and the most reads it waits through, before it
/// is handed over though more is ready (a long line arriving in many reads
/// holds up the lines before it no longer than that).
const BATCH_MAX: usize = 256;
const BATCH_READS: usize = 16;

/// How long the io thread holds the end of a pipe, and what it read once
/// both pipes have closed, for the rest of the end of the run to go with it
/// in one hand-over (claude's pipes close one after the other as it exits,
/// a moment before its exit is seen): one wake of the loop at the end of a
/// run, not three.
const EXIT_HOLD: Duration = Duration::from_millis(50);

thread_local! {
    static IO_BUF: std::cell::Cell<Option<Box<[u8]>>> = const { std::cell::Cell::new(None) };
}

/// How far the io thread has read claude's stdout, shared with the
/// [`ClaudeRun`]: twice the bytes read, plus one while a read is under way,
/// so the run can tell a count that a read in flight is about to change
/// ([`written`]).
#[derive(Debug, Default)]
struct ReadCount(AtomicU64);

impl ReadCount {
    /// A read is about to take bytes out of the pipe.
    fn reading(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// The read under way took `n` bytes (none at the end or on an error).
    fn read(&self, n: usize) {
        // Adds 2n and takes the one of `reading` back, in one step.
        self.0
            .fetch_add((n as u64 * 2).wrapping_sub(1), Ordering::SeqCst);
    }
}

/// How long [`written`] looks for a moment with no read under way before it
/// settles for what it sees (a read takes microseconds: the io thread reads
/// only what `poll` said is ready, so this is only reached when it is not
/// given the CPU for that long).
const WRITTEN_WAIT: Duration = Duration::from_secs(1);

/// The bytes claude has written to stdout by now: those the io thread has
/// read (`count`) plus those still in the pipe (`pipe`, a duplicate of its
/// read end), looked at when no read was under way and with none between
/// the two looks, so no byte is counted twice or missed.
fn written(count: &ReadCount, pipe: &OwnedFd) -> u64 {
    let queued = || {
        fd::unread(pipe.as_raw_fd()).unwrap_or_else(|e| {
            log::warn!("cannot tell what waits in claude's stdout: {e}");
            0
        })
    };
    let deadline = Instant::now() + WRITTEN_WAIT;
    while Instant::now() < deadline {
        let before = count.0.load(Ordering::SeqCst);
        if before.is_multiple_of(2) {
            let queued = queued();
            if count.0.load(Ordering::SeqCst) == before {
                return before / 2 + queued;
            }
        }
        std::thread::yield_now();
    }
    // What a read under way took is missed: its lines count as written
    // after the signal, which keeps their message rather than lose it.
    let seen = count.0.load(Ordering::SeqCst) / 2 + queued();
    log::warn!("claude's stdout was being read for {WRITTEN_WAIT:?}; counting {seen} bytes");
    seen
}

/// One output pipe as the io thread reads it.
struct Reading {
    file: Option<File>,
    lines: Splitter,
    tag: fn(Pipe, u64) -> Output,
    /// Bytes taken from the pipe so far.
    at: u64,
    /// Where the count is shared (stdout only).
    count: Option<Arc<ReadCount>>,
}

impl Reading {
    fn new(file: File, tag: fn(Pipe, u64) -> Output, count: Option<Arc<ReadCount>>) -> Reading {
        Reading {
            file: Some(file),
            lines: Splitter::new(MAX_STDOUT_LINE),
            tag,
            at: 0,
            count,
        }
    }

    /// One read of the pipe, which `poll` said is readable (so it does not
    /// block): its whole lines, or its last line and its end, each with the
    /// offset of its end.
    fn read(&mut self, buf: &mut [u8], out: &mut Vec<Output>) {
        let Some(file) = self.file.as_mut() else {
            return;
        };
        if let Some(c) = &self.count {
            c.reading();
        }
        let got = file.read(buf);
        let n = *got.as_ref().unwrap_or(&0);
        if let Some(c) = &self.count {
            c.read(n);
        }
        let n = match got {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return,
            Err(_) => 0,
        };
        let at = self.at;
        if n == 0 {
            out.extend(piped(self.lines.end()).map(|p| (self.tag)(p, at)));
            out.push((self.tag)(Pipe::Closed, at));
            self.file = None;
            return;
        }
        let mut data = &buf[..n];
        while !data.is_empty() {
            let (used, line) = self.lines.feed(data);
            data = &data[used..];
            self.at += used as u64;
            let at = self.at;
            out.extend(line.and_then(piped).map(|p| (self.tag)(p, at)));
        }
    }
}

/// A line as the loop is given it (`None` for the end of input).
fn piped(line: Line) -> Option<Pipe> {
    match line {
        Line::Text(s) => Some(Pipe::Line(s)),
        Line::NotUtf8 => Some(Pipe::Line("(a line that is not UTF-8)".into())),
        Line::TooLong => Some(Pipe::TooLong),
        Line::Eof => None,
    }
}

/// The job of claude's io thread: one `poll` over both output pipes and the
/// descriptor that tells claude's exit ([`ExitNotice`]), so one thread serves
/// a run where a thread per pipe and a waiter took three and woke the loop
/// once each at the end of every run. What it reads (every pipe's lines,
/// their ends, the exit) goes to the loop in batches: lines as soon as
/// nothing more is ready (or at [`BATCH_MAX`] items or [`BATCH_READS`]
/// reads), the end of a pipe held up to [`EXIT_HOLD`] for the rest of the
/// end of the run. The job ends when both pipes have closed and claude has
/// exited, or when the loop has dropped the run.
fn io(
    stdout: File,
    stderr: File,
    exited: OwnedFd,
    count: Arc<ReadCount>,
    tx: Sender<Vec<Output>>,
) -> impl FnOnce() + Send {
    move || {
        let mut buf = IO_BUF
            .take()
            .unwrap_or_else(|| vec![0; IO_BUFFER].into_boxed_slice());
        let mut pipes = [
            Reading::new(stdout, Output::Stdout, Some(count)),
            Reading::new(stderr, |p, _| Output::Stderr(p), None),
        ];
        let mut exited = Some(exited);
        let mut batch = Vec::new();
        // The poll set, refilled each time round: two pipes and the exit.
        let mut fds: Vec<PollFd> = Vec::with_capacity(3);
        let mut reads = 0;
        loop {
            let open = pipes.iter().any(|p| p.file.is_some());
            if !open && exited.is_none() {
                if !batch.is_empty() {
                    let _ = tx.send(batch);
                }
                break;
            }
            // Lines (and the exit) go to the loop as soon as nothing more is
            // ready; the end of a pipe waits for the rest of the end of the
            // run (the other pipe, the exit), for at most EXIT_HOLD.
            let urgent = batch.iter().any(|o| {
                !matches!(
                    o,
                    Output::Stdout(Pipe::Closed, _) | Output::Stderr(Pipe::Closed)
                )
            });
            let wait = if batch.is_empty() {
                None
            } else if urgent && open {
                Some(Duration::ZERO)
            } else {
                Some(EXIT_HOLD)
            };
            fds.clear();
            fds.extend(
                pipes
                    .iter()
                    .filter_map(|p| p.file.as_ref())
                    .map(|f| PollFd::new(f.as_raw_fd(), true, false))
                    .chain(
                        exited
                            .as_ref()
                            .map(|e| PollFd::new(e.as_raw_fd(), true, false)),
                    ),
            );
            let ready = match poll(&mut fds, wait) {
                Ok(n) => n,
                Err(e) => {
                    // Cannot happen with open descriptors; the loop takes a
                    // vanished io thread as the exit and kills the group.
                    log::error!("cannot wait on claude's pipes: {e}");
                    if !batch.is_empty() {
                        let _ = tx.send(batch);
                    }
                    break;
                }
            };
            if ready == 0 {
                if !batch.is_empty() && tx.send(std::mem::take(&mut batch)).is_err() {
                    break;
                }
                continue;
            }
            reads += 1;
            let mut at = 0;
            for p in pipes.iter_mut().filter(|p| p.file.is_some()) {
                if fds[at].any() {
                    p.read(&mut buf, &mut batch);
                }
                at += 1;
            }
            if exited.is_some() && fds[at].any() {
                exited = None;
                batch.push(Output::Exited);
            }
            if batch.is_empty() {
                reads = 0;
            } else if batch.len() >= BATCH_MAX || reads >= BATCH_READS {
                reads = 0;
                if tx.send(std::mem::take(&mut batch)).is_err() {
                    break;
                }
            }
        }
        IO_BUF.set(Some(buf));
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
    start_watched(inv, ExitNotice::prepare)
}

/// [`start`], with claude's exit told through the notice `notice` prepares
/// (a test asks for the waiter a host without pidfds gets).
fn start_watched(
    inv: &Invocation,
    notice: fn(&str) -> io::Result<ExitNotice>,
) -> Result<ClaudeRun, String> {
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
    let io_worker = Worker::reserve(THREAD).map_err(thread)?;
    let notice = notice(THREAD).map_err(thread)?;
    // A prompt that fits the pipe buffer is written at once; a bigger one from
    // a thread, so a child that reads slowly never blocks the loop.
    let writer = if inv.stdin.len() > SMALL_PROMPT {
        Some(Worker::reserve(THREAD).map_err(thread)?)
    } else {
        None
    };

    // The operator's variables stay out (`child_env`, and none is set here
    // but the OpenTelemetry settings `telemetry.cli` passes on).
    let set: Vec<(String, String)> = inv
        .env
        .iter()
        .filter(|(k, _)| !agent_proc::is_operator_var(k) || agent_proc::is_telemetry_var(k))
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
    // A second handle on claude's stdout, which the stop ladder asks what
    // still waits in it (`written`); a claude whose pipe cannot be
    // duplicated (no descriptor left) is dropped, killed and reaped, like one
    // whose exit cannot be watched.
    let stdout_end = stdout
        .try_clone()
        .map(OwnedFd::from)
        .map_err(|e| fault("cannot watch claude's output", e))?;
    // Waits without reaping: the loop reaps (`on_exit`), so the pid stays
    // claude's until then. A pidfd that cannot be had (no descriptor left)
    // drops the group, which kills and reaps the claude just started.
    let exited = notice
        .watch(&group)
        .map_err(|e| fault("cannot watch claude's exit", e))?;
    // Bulk output is bounded: a claude that prints faster than the loop reads
    // waits on its pipe.
    let (tx, output) = bounded::<Vec<Output>>(4);
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
    let count = Arc::new(ReadCount::default());
    io_worker.run(io(stdout, stderr, exited, count.clone(), tx));
    Ok(ClaudeRun {
        group: Some(group),
        output,
        stdout_read: count,
        stdout_end,
        before_stop: None,
        io_running: true,
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

/// One running claude. The loop selects on [`ClaudeRun::output`] while the
/// io thread runs, passes each [`Output`] to [`ClaudeRun::on_output`], calls
/// [`ClaudeRun::on_exit`] at [`Output::Exited`] (or when the io thread is
/// gone, [`ClaudeRun::io_gone`]), calls [`ClaudeRun::stop`] to start the stop
/// ladder and [`ClaudeRun::step`] when [`ClaudeRun::ladder_due`] passes.
/// Dropping it kills the whole group and reaps it.
pub struct ClaudeRun {
    /// The child; `None` once dropped by [`Drop`].
    group: Option<ProcessGroup>,
    /// What the io thread hands over, a batch at a time.
    output: Receiver<Vec<Output>>,
    /// How far the io thread has read claude's stdout.
    stdout_read: Arc<ReadCount>,
    /// A duplicate of the read end of claude's stdout, to ask what waits in it.
    stdout_end: OwnedFd,
    /// The stdout bytes claude had written when the ladder took its first
    /// step: taken just before that signal was sent.
    before_stop: Option<u64>,
    io_running: bool,
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

    /// The batches of the io thread (lines of both pipes, their ends, the
    /// exit), while it runs.
    pub fn output(&self) -> Option<&Receiver<Vec<Output>>> {
        self.io_running.then_some(&self.output)
    }

    /// Notes a pipe that closed.
    pub fn on_output(&mut self, o: &Output) {
        if matches!(
            o,
            Output::Stdout(Pipe::Closed, _) | Output::Stderr(Pipe::Closed)
        ) {
            self.open_pipes = self.open_pipes.saturating_sub(1);
        }
    }

    /// The io thread has ended (its channel disconnected): nothing more can
    /// be read. It ends once it has handed over both pipes' ends and the
    /// exit; ending sooner (a failed `poll`) is taken as the exit.
    pub fn io_gone(&mut self) {
        self.io_running = false;
        self.open_pipes = 0;
    }

    /// claude exited (or its io thread is gone): whatever it left in its group
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

    /// True when the stdout line that ends at offset `end` was written
    /// before the harness first signalled claude (or no signal was sent).
    pub fn written_before_stop(&self, end: u64) -> bool {
        self.before_stop.is_none_or(|b| end <= b)
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
                // What claude wrote before it is signalled, counted first.
                self.before_stop = Some(written(&self.stdout_read, &self.stdout_end));
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
        // The io thread tells the exit; what comes before it is dropped.
        let deadline = Instant::now() + REAP_WAIT;
        let exited = std::iter::from_fn(|| self.output.recv_deadline(deadline).ok())
            .any(|batch| batch.contains(&Output::Exited));
        if exited {
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
    use crossbeam_channel::RecvTimeoutError;
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

    /// Everything the io thread hands over until it ends, in order.
    fn outputs(run: &mut ClaudeRun) -> Vec<Output> {
        let mut out = Vec::new();
        while let Some(rx) = run.output() {
            match rx.recv_timeout(Duration::from_secs(10)) {
                Ok(batch) => {
                    assert!(!batch.is_empty(), "an empty batch woke the loop");
                    for o in batch {
                        run.on_output(&o);
                        out.push(o);
                    }
                }
                Err(RecvTimeoutError::Disconnected) => run.io_gone(),
                Err(RecvTimeoutError::Timeout) => panic!("the io thread went quiet: {out:?}"),
            }
        }
        out
    }

    #[test]
    fn the_io_thread_reads_lines_longer_than_its_buffer_and_keeps_it_for_the_next_run() {
        let long = "x".repeat(3 * IO_BUFFER + 17);
        let input = format!("short\n{long}\nlast without a newline");
        let all = input.len();
        let run = |input: String| {
            let (out_r, out_w) = crate::sys::fd::pipe().unwrap();
            let (err_r, err_w) = crate::sys::fd::pipe().unwrap();
            let (exit_r, exit_w) = crate::sys::fd::pipe().unwrap();
            // More than a pipe holds: written while the io thread reads.
            let writer = std::thread::spawn(move || {
                File::from(out_w).write_all(input.as_bytes()).unwrap();
                File::from(err_w).write_all(b"err\n").unwrap();
                drop(exit_w);
            });
            let (tx, rx) = crossbeam_channel::unbounded();
            let count = Arc::new(ReadCount::default());
            io(
                File::from(out_r),
                File::from(err_r),
                exit_r,
                count.clone(),
                tx,
            )();
            writer.join().unwrap();
            let read = count.0.load(Ordering::SeqCst);
            assert_eq!(read, 2 * all as u64, "every byte counted once");
            rx.try_iter().flatten().collect::<Vec<_>>()
        };
        let first = run(input.clone());
        let kept = IO_BUF.take().expect("the buffer is kept");
        let at = kept.as_ptr();
        IO_BUF.set(Some(kept));
        let second = run(input);
        let stdout = |got: &[Output]| -> Vec<Output> {
            got.iter()
                .filter(|o| matches!(o, Output::Stdout(..)))
                .cloned()
                .collect()
        };
        assert_eq!(stdout(&first), stdout(&second));
        // Each line with the offset of its end: its newline, or the end.
        let line = |l: &str, end: usize| Output::Stdout(Pipe::Line(l.into()), end as u64);
        assert_eq!(
            stdout(&first),
            [
                line("short", 6),
                line(&long, 6 + long.len() + 1),
                line("last without a newline", all),
                Output::Stdout(Pipe::Closed, all as u64)
            ]
        );
        for got in [&first, &second] {
            assert!(got.contains(&Output::Stderr(Pipe::Line("err".into()))));
            assert!(got.contains(&Output::Stderr(Pipe::Closed)));
            assert_eq!(got.iter().filter(|o| **o == Output::Exited).count(), 1);
        }
        assert_eq!(
            IO_BUF.take().map(|b| b.as_ptr()),
            Some(at),
            "the second run read through the first one's buffer"
        );
    }

    #[test]
    fn both_pipes_and_the_exit_reach_one_channel_with_a_pidfd_or_a_waiter() {
        let notices: [fn(&str) -> io::Result<ExitNotice>; 2] =
            [ExitNotice::prepare, ExitNotice::with_waiter];
        for notice in notices {
            let inv = sh("echo out; echo err >&2; exit 3");
            let mut run = start_watched(&inv, notice).unwrap();
            let got = outputs(&mut run);
            for want in [
                Output::Stdout(Pipe::Line("out".into()), 4),
                Output::Stderr(Pipe::Line("err".into())),
                Output::Stdout(Pipe::Closed, 4),
                Output::Stderr(Pipe::Closed),
                Output::Exited,
            ] {
                assert!(got.contains(&want), "{want:?} in {got:?}");
            }
            assert!(!run.pipes_open());
            let st = run.on_exit().unwrap();
            assert_eq!(st.code(), Some(3));
            assert!(run.output().is_none());
        }
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
        assert_eq!(first, [Output::Stdout(Pipe::Line("ready".into()), 6)]);
        run.stop(false);
        assert!(run.stopping());
        let due = run.ladder_due().expect("a next step");
        assert!(due > Instant::now());
        run.step(); // SIGTERM to the group
        let got = outputs(&mut run);
        assert!(got.contains(&Output::Exited), "{got:?}");
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
    fn what_was_written_counts_the_bytes_read_and_those_still_in_the_pipe() {
        let (r, w) = crate::sys::fd::pipe().unwrap();
        let count = Arc::new(ReadCount::default());
        File::from(w).write_all(b"0123456789").unwrap();
        assert_eq!(written(&count, &r), 10, "nothing read yet");
        let mut pipe = File::from(r.try_clone().unwrap());
        let mut buf = [0u8; 4];
        count.reading();
        pipe.read_exact(&mut buf).unwrap();
        // A read under way: the count waits for its end.
        let reader = count.clone();
        let end = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            reader.read(4);
        });
        assert_eq!(written(&count, &r), 10, "4 read and 6 in the pipe");
        end.join().unwrap();
        count.reading();
        count.read(0);
        assert_eq!(written(&count, &r), 10, "an end of input takes nothing");
    }

    #[test]
    fn lines_written_before_the_first_signal_are_told_from_the_answer_to_it() {
        // The shell answers SIGINT with a line of its own, as the CLI may
        // answer a stop with a `result`.
        let mut run = ClaudeRun::start(&sh(
            "trap 'echo late; kill $!; exit 0' INT; echo early; echo also early; sleep 60 & wait",
        ))
        .unwrap();
        let mut got = Vec::new();
        while !got.contains(&Output::Stdout(Pipe::Line("also early".into()), 17)) {
            let batch = run
                .output()
                .unwrap()
                .recv_timeout(Duration::from_secs(10))
                .expect("the early lines");
            got.extend(batch);
        }
        assert!(run.written_before_stop(u64::MAX), "no signal sent yet");
        run.stop(false);
        got.extend(outputs(&mut run));
        let lines: Vec<(String, bool)> = got
            .iter()
            .filter_map(|o| match o {
                Output::Stdout(Pipe::Line(l), end) => {
                    Some((l.clone(), run.written_before_stop(*end)))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            lines,
            [
                ("early".to_string(), true),
                ("also early".to_string(), true),
                ("late".to_string(), false)
            ]
        );
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
