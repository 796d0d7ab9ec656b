//! One supervised child of `hive up`, the machinery its three supervisor
//! threads share (the agents' `supervisor.rs`, the bash-task daemons'
//! `bashd.rs`, the Matrix bridge's `bridge.rs`): a plain struct, not a thread,
//! that owns the child's [`Phase`] (running, stopping, stopped, waiting out a
//! restart backoff), the restart backoff itself (capped doubling, started over
//! after a healthy run), and the stop ladder (SIGTERM to the leader, the grace,
//! SIGKILL to the process group, the reaping). A waiter thread per child
//! reports its exit as an [`Exited`] on the owner's channel and leaves the
//! reaping to the owner ([`Supervised::on_exit`]); an owner thread is an
//! [`Owner`], and [`stop_all`] is its shutdown. [`log_output`] pumps a new
//! child's output into its rotated log; [`hand_credential`] gives an isolated
//! agent's harness or bash-task daemon its broker credential. What is not a child's — which command
//! starts it, when it should run, what an exit means to the hive — stays with
//! the owner thread, with its one `select!`, its channels and its state.

use super::logfile::{self, LogFile};
use super::UpSettings;
use crate::sys::ProcessGroup;
use crossbeam_channel::{at, never, select, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Gives the process `cmd` starts a broker credential (issue 40): a socket
/// pair made here, outside the agent's sandbox, one end inherited by the
/// child as [`CREDENTIAL_FD_VAR`] (it marks it close-on-exec at once), the
/// other sent to the hub as `agent`'s process `via`, from then on the only
/// place that process's reports are taken. Returns the child's end, which
/// the caller drops once the child is spawned (a child that never started
/// leaves the hub's end closed, and the hub drops it).
///
/// [`CREDENTIAL_FD_VAR`]: crate::proto::client::CREDENTIAL_FD_VAR
pub fn hand_credential(
    cmd: &mut std::process::Command,
    hub: &crate::broker::lifecycle::FleetTx,
    agent: &str,
    via: crate::proto::access::Via,
) -> Result<std::os::unix::net::UnixStream, String> {
    use std::os::fd::AsRawFd;
    let (broker_end, child_end) = std::os::unix::net::UnixStream::pair()
        .map_err(|e| format!("cannot make the broker credential of {agent}: {e}"))?;
    let sent = hub.send(crate::broker::lifecycle::FleetEvent::Credential {
        agent: agent.to_string(),
        via,
        control: broker_end,
    });
    if !sent {
        return Err(format!(
            "cannot hand {agent} a broker credential: the broker is stopping"
        ));
    }
    crate::sys::process::pass_fd(cmd, child_end.as_raw_fd());
    cmd.env(
        crate::proto::client::CREDENTIAL_FD_VAR,
        child_end.as_raw_fd().to_string(),
    );
    Ok(child_end)
}

/// The restart delay after `failures` consecutive crashes: `base` doubled per
/// crash, capped at `max`.
pub fn backoff(base: Duration, max: Duration, failures: u32) -> Duration {
    let ms = (base.as_millis() as u64).saturating_mul(1u64 << failures.min(20));
    Duration::from_millis(ms).min(max)
}

/// The timings of a supervised child, from `hive up`'s settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timing {
    /// The first restart delay.
    pub restart_base: Duration,
    /// The longest restart delay.
    pub restart_max: Duration,
    /// Uptime after which a child's backoff starts over.
    pub stable: Duration,
    /// How long a stopping child has between SIGTERM and SIGKILL.
    pub stop_grace: Duration,
}

impl Timing {
    /// The timings `hive up` was started with (`HIVE_UP_*`).
    pub fn of(s: &UpSettings) -> Timing {
        Timing {
            restart_base: s.restart_base,
            restart_max: s.restart_max,
            stable: s.stable,
            stop_grace: s.stop_grace,
        }
    }
}

/// Where a supervised child is.
#[derive(Debug)]
pub enum Phase {
    Running(ProcessGroup),
    Stopping {
        child: ProcessGroup,
        /// When the grace runs out (SIGKILL); `None` once it was sent.
        kill_at: Option<Instant>,
    },
    Stopped,
    /// Starts at this instant.
    Backoff(Instant),
}

/// The child of `name` (the owner's key) with pid `pid` has exited; it is
/// not reaped yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exited {
    pub name: String,
    pub pid: u32,
}

/// How a reaped child ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// It exited while it was meant to run, after `up`; `clean` when it
    /// exited with status 0.
    Crashed {
        status: String,
        clean: bool,
        up: Duration,
    },
    /// It exited after it was asked to stop.
    Stopped { status: String },
}

/// One supervised child: its phase, its restart backoff and its stop ladder.
#[derive(Debug)]
pub struct Supervised {
    /// Who it is in log lines ("ruth", "the Matrix bridge").
    label: String,
    timing: Timing,
    phase: Phase,
    /// When the running child was started.
    started: Option<Instant>,
    /// Crashes since its last healthy run.
    failures: u32,
    /// Restarts after a crash, in all.
    restarts: u32,
}

impl Supervised {
    /// A child that does not run yet, logged as `label`.
    pub fn new(label: impl Into<String>, timing: Timing) -> Supervised {
        Supervised {
            label: label.into(),
            timing,
            phase: Phase::Stopped,
            started: None,
            failures: 0,
            restarts: 0,
        }
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// The pid of the child while it runs or stops.
    pub fn pid(&self) -> Option<u32> {
        match &self.phase {
            Phase::Running(c) | Phase::Stopping { child: c, .. } => Some(c.id()),
            Phase::Stopped | Phase::Backoff(_) => None,
        }
    }

    pub fn is_running(&self) -> bool {
        matches!(self.phase, Phase::Running(_))
    }

    pub fn is_stopping(&self) -> bool {
        matches!(self.phase, Phase::Stopping { .. })
    }

    pub fn is_stopped(&self) -> bool {
        matches!(self.phase, Phase::Stopped)
    }

    /// Restarts after a crash, in all.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// Forgets the crashes so far: the next one waits the shortest backoff.
    pub fn reset_failures(&mut self) {
        self.failures = 0;
    }

    /// When this child next needs its owner: the end of a restart backoff,
    /// or of a stop's grace.
    pub fn deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Backoff(t) => Some(t),
            Phase::Stopping { kill_at, .. } => kill_at,
            Phase::Running(_) | Phase::Stopped => None,
        }
    }

    /// Schedules a start at `t`; nothing while a child runs or stops.
    pub fn start_at(&mut self, t: Instant) {
        if matches!(self.phase, Phase::Stopped | Phase::Backoff(_)) {
            self.phase = Phase::Backoff(t);
        }
    }

    /// Makes `child` the running one, watched from now on by a waiter thread
    /// named `waiter` that sends `Exited { name, pid }` to `exits` when it
    /// exits. A child that cannot be watched would never be seen to exit: it
    /// is killed and reaped at once (dropped), a restart is scheduled after
    /// the backoff, and the error is returned. The pid otherwise.
    pub fn run(
        &mut self,
        child: ProcessGroup,
        waiter: String,
        name: &str,
        exits: &Sender<Exited>,
    ) -> Result<u32, std::io::Error> {
        let pid = child.id();
        let tx = exits.clone();
        let name = name.to_string();
        if let Err(e) = child.on_exit(waiter, move || {
            let _ = tx.send(Exited { name, pid });
        }) {
            drop(child);
            self.back_off();
            return Err(e);
        }
        self.phase = Phase::Running(child);
        self.started = Some(Instant::now());
        Ok(pid)
    }

    /// A start failed (or the child crashed): the next start is after the
    /// backoff its crashes so far earn; returns that wait.
    pub fn back_off(&mut self) -> Duration {
        let t = self.timing;
        let wait = backoff(t.restart_base, t.restart_max, self.failures);
        self.failures += 1;
        self.phase = Phase::Backoff(Instant::now() + wait);
        wait
    }

    /// The child crashed after running for `up`: a run of at least the
    /// stable time starts the backoff over; counts the restart and schedules
    /// it, returning the wait.
    pub fn after_crash(&mut self, up: Duration) -> Duration {
        if up >= self.timing.stable {
            self.failures = 0;
        }
        self.restarts += 1;
        self.back_off()
    }

    /// Reaps the child if `pid` is the one that runs or stops here and it
    /// has exited, leaving this one stopped, and says how it ended. `None`
    /// for a notice about an earlier child (already reaped) or one that
    /// finds it still running. Whatever it left in its process group is
    /// killed with it.
    pub fn on_exit(&mut self, pid: u32) -> Option<Ended> {
        let child = match &mut self.phase {
            Phase::Running(c) | Phase::Stopping { child: c, .. } if c.id() == pid => c,
            _ => return None,
        };
        let (status, clean) = match child.try_wait() {
            Ok(Some(st)) => (st.to_string(), st.success()),
            Ok(None) => return None,
            Err(e) => (format!("lost: {e}"), false),
        };
        let up = self.started.map_or(Duration::ZERO, |t| t.elapsed());
        Some(match std::mem::replace(&mut self.phase, Phase::Stopped) {
            Phase::Running(_) => Ended::Crashed { status, clean, up },
            _ => Ended::Stopped { status },
        })
    }

    /// The first rung of the stop ladder: a running child gets SIGTERM and
    /// the grace (then [`Supervised::on_deadline`] SIGKILLs it); a stopping
    /// one keeps its grace; a restart that was due is called off. True when
    /// a child is stopping now.
    pub fn stop(&mut self) -> bool {
        match std::mem::replace(&mut self.phase, Phase::Stopped) {
            Phase::Running(child) => {
                child.signal_leader(libc::SIGTERM);
                self.stopping(child);
                true
            }
            stopping @ Phase::Stopping { .. } => {
                self.phase = stopping;
                true
            }
            Phase::Stopped | Phase::Backoff(_) => false,
        }
    }

    /// The running child is exiting by itself (it was asked otherwise): it
    /// stops with the grace, as if it had got SIGTERM. False when no child
    /// runs.
    pub fn exiting(&mut self) -> bool {
        match std::mem::replace(&mut self.phase, Phase::Stopped) {
            Phase::Running(child) => {
                self.stopping(child);
                true
            }
            other => {
                self.phase = other;
                false
            }
        }
    }

    fn stopping(&mut self, child: ProcessGroup) {
        self.phase = Phase::Stopping {
            child,
            kill_at: Some(Instant::now() + self.timing.stop_grace),
        };
    }

    /// What is due at `now`: a stop past its grace gets SIGKILL (its exit
    /// event then ends the stop); true when a restart's backoff ran out, so
    /// the owner starts the child (this one is stopped until then).
    pub fn on_deadline(&mut self, now: Instant) -> bool {
        match &mut self.phase {
            Phase::Backoff(t) if now >= *t => {
                self.phase = Phase::Stopped;
                true
            }
            Phase::Stopping {
                child,
                kill_at: kill_at @ Some(_),
            } if kill_at.is_some_and(|t| now >= t) => {
                log::warn!("{} did not stop within its grace; SIGKILL", self.label);
                child.kill();
                *kill_at = None;
                false
            }
            _ => false,
        }
    }

    /// The child as it is, SIGKILLed, leaving this one stopped: for the
    /// owner to drop (which reaps it).
    fn take(&mut self) -> Option<ProcessGroup> {
        match std::mem::replace(&mut self.phase, Phase::Stopped) {
            Phase::Running(child) | Phase::Stopping { child, .. } => {
                child.kill();
                Some(child)
            }
            other => {
                self.phase = other;
                None
            }
        }
    }
}

/// Copies the new `child`'s stdout and stderr into `log`, on the threads
/// `THREADS-out` and `THREADS-err`.
pub fn log_output(child: &mut ProcessGroup, threads: &str, log: &Arc<Mutex<LogFile>>) {
    if let Some(out) = child.child_mut().and_then(|c| c.stdout.take()) {
        logfile::pump(format!("{threads}-out"), out, log.clone());
    }
    if let Some(err) = child.child_mut().and_then(|c| c.stderr.take()) {
        logfile::pump(format!("{threads}-err"), err, log.clone());
    }
}

/// The nearest deadline of `children`.
pub fn next_deadline<'a>(children: impl Iterator<Item = &'a Supervised>) -> Option<Instant> {
    children.filter_map(Supervised::deadline).min()
}

/// A supervisor thread, as its loop and [`stop_all`] drive it: its children,
/// and what it does with an exit and with a deadline.
pub trait Owner {
    /// Every child it supervises.
    fn children(&mut self) -> Box<dyn Iterator<Item = &mut Supervised> + '_>;
    /// Handles an exit its waiters reported: reaps the child
    /// ([`Supervised::on_exit`]) and does what the exit means to it.
    fn on_exited(&mut self, e: &Exited);
    /// Handles what is due now ([`Supervised::on_deadline`] of each child):
    /// a restart whose backoff ran out, a stop past its grace.
    fn on_deadlines(&mut self);
}

/// The rest of the stop ladder for every child of `owner`, after the owner
/// told each to stop: waits for their exits on `exits` (each handled by the
/// owner) and SIGKILLs those past their grace, for at most the grace and a
/// second. Returns what is left, SIGKILLed, for the owner to reap.
pub fn stop_all(
    owner: &mut impl Owner,
    exits: &Receiver<Exited>,
    grace: Duration,
) -> Vec<ProcessGroup> {
    let end = Instant::now() + grace + Duration::from_secs(1);
    loop {
        if !owner.children().any(|c| c.is_stopping()) {
            break;
        }
        let timer = next_deadline(owner.children().map(|c| &*c)).map_or_else(never, at);
        select! {
            recv(exits) -> e => {
                if let Ok(e) = e {
                    owner.on_exited(&e);
                }
            }
            recv(timer) -> _ => owner.on_deadlines(),
            recv(at(end)) -> _ => break,
        }
    }
    owner.children().filter_map(Supervised::take).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam_channel::unbounded;
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    fn timing(stable: Duration, grace: Duration) -> Timing {
        Timing {
            restart_base: Duration::from_millis(10),
            restart_max: Duration::from_millis(80),
            stable,
            stop_grace: grace,
        }
    }

    /// `sh -c SCRIPT` in its own process group, its stdout piped.
    fn sh(script: &str) -> ProcessGroup {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        ProcessGroup::spawn(&mut cmd).expect("sh runs")
    }

    /// Waits (at most 20 s) until `sv`'s child has ended, driving its
    /// deadlines as an owner's loop would.
    fn until_ended(sv: &mut Supervised, exits: &Receiver<Exited>) -> Ended {
        let end = Instant::now() + Duration::from_secs(20);
        loop {
            assert!(Instant::now() < end, "the child did not end in 20 s");
            let timer = sv.deadline().map_or_else(never, at);
            select! {
                recv(exits) -> e => {
                    let e = e.unwrap();
                    assert_eq!(e.name, "kid");
                    if let Some(ended) = sv.on_exit(e.pid) {
                        return ended;
                    }
                }
                recv(timer) -> _ => assert!(!sv.on_deadline(Instant::now()), "no restart is due"),
                recv(at(end)) -> _ => {}
            }
        }
    }

    /// Starts `script` as `sv`'s child and waits for its first line.
    fn run_ready(sv: &mut Supervised, exits: &Sender<Exited>, script: &str) -> u32 {
        let mut child = sh(script);
        let out = child.child_mut().unwrap().stdout.take().unwrap();
        let pid = sv.run(child, "wait-kid".into(), "kid", exits).unwrap();
        let mut line = String::new();
        BufReader::new(out).read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        pid
    }

    #[test]
    fn restart_backoff_doubles_and_is_capped() {
        let (base, max) = (Duration::from_secs(1), Duration::from_secs(60));
        let waits: Vec<u64> = (0..9).map(|f| backoff(base, max, f).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 60, 60, 60]);
        assert_eq!(backoff(base, max, u32::MAX), max);
    }

    #[test]
    fn crashes_grow_the_backoff_and_a_healthy_run_starts_it_over() {
        let (tx, rx) = unbounded();
        // No run is long enough to count as healthy, at first.
        let mut sv = Supervised::new(
            "kid",
            timing(Duration::from_secs(3600), Duration::from_secs(5)),
        );
        let mut waits = Vec::new();
        for _ in 0..5 {
            sv.run(sh("exit 3"), "wait-kid".into(), "kid", &tx).unwrap();
            let Ended::Crashed { status, clean, up } = until_ended(&mut sv, &rx) else {
                panic!("a crash");
            };
            assert!(status.contains('3') && !clean, "{status}");
            waits.push(sv.after_crash(up).as_millis());
            assert!(matches!(sv.phase(), Phase::Backoff(_)));
            // The restart comes once its backoff ran out, not before.
            assert!(!sv.on_deadline(Instant::now() - Duration::from_secs(1)));
            assert!(sv.on_deadline(Instant::now() + Duration::from_secs(1)));
            assert!(sv.is_stopped());
        }
        assert_eq!(waits, [10, 20, 40, 80, 80]);
        assert_eq!(sv.restarts(), 5);
        // A run longer than the stable time starts the backoff over.
        sv.timing.stable = Duration::from_millis(200);
        run_ready(&mut sv, &tx, "echo ready; sleep 1; exit 1");
        let Ended::Crashed { up, .. } = until_ended(&mut sv, &rx) else {
            panic!("a crash");
        };
        assert!(up >= Duration::from_millis(200), "{up:?}");
        assert_eq!(sv.after_crash(up), Duration::from_millis(10));
        assert_eq!(sv.back_off(), Duration::from_millis(20), "counting again");
    }

    #[test]
    fn the_stop_ladder_escalates_to_sigkill_for_a_child_that_ignores_sigterm() {
        let (tx, rx) = unbounded();
        let mut sv = Supervised::new(
            "kid",
            timing(Duration::from_secs(60), Duration::from_millis(200)),
        );
        let pid = run_ready(
            &mut sv,
            &tx,
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        );
        assert!(sv.stop());
        assert_eq!(sv.pid(), Some(pid));
        assert!(sv.deadline().is_some(), "the grace runs");
        assert!(sv.stop(), "a second stop keeps the grace");
        let Ended::Stopped { status } = until_ended(&mut sv, &rx) else {
            panic!("a stop");
        };
        assert!(
            status.contains("signal: 9"),
            "SIGKILL after the grace: {status}"
        );
        assert!(sv.is_stopped());
        assert_eq!(sv.restarts(), 0);
        // Its group is gone and reaped: the pid is no child of ours any more.
        // SAFETY: waitpid with WNOHANG on a pid; no memory is shared.
        let rc = unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), libc::WNOHANG) };
        assert_eq!(rc, -1);
    }

    #[test]
    fn a_child_that_honours_sigterm_stops_on_the_first_rung() {
        let (tx, rx) = unbounded();
        let mut sv = Supervised::new(
            "kid",
            timing(Duration::from_secs(60), Duration::from_secs(30)),
        );
        run_ready(
            &mut sv,
            &tx,
            "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done",
        );
        assert!(sv.stop());
        let ended = until_ended(&mut sv, &rx);
        assert_eq!(
            ended,
            Ended::Stopped {
                status: "exit status: 0".into()
            }
        );
        // Stopped, a stop is nothing, and a restart that was due is called off.
        assert!(!sv.stop());
        sv.start_at(Instant::now());
        assert!(!sv.stop());
        assert!(sv.is_stopped());
    }

    #[test]
    fn a_notice_about_another_child_is_nothing() {
        let (tx, rx) = unbounded();
        let mut sv = Supervised::new(
            "kid",
            timing(Duration::from_secs(60), Duration::from_millis(200)),
        );
        let pid = run_ready(&mut sv, &tx, "echo ready; exec sleep 30");
        assert_eq!(sv.on_exit(pid + 100_000), None, "not its pid");
        assert_eq!(sv.on_exit(pid), None, "still running");
        assert!(sv.is_running());
        // A child said to be exiting by itself gets the grace, then SIGKILL
        // when it does not exit.
        assert!(sv.exiting());
        assert!(sv.is_stopping());
        let Ended::Stopped { status } = until_ended(&mut sv, &rx) else {
            panic!("a stop");
        };
        assert!(status.contains("signal: 9"), "{status}");
    }

    /// Two children, one ignoring SIGTERM, stopped the way an owner does.
    struct Two {
        kids: Vec<Supervised>,
        seen: Vec<Ended>,
    }

    impl Owner for Two {
        fn children(&mut self) -> Box<dyn Iterator<Item = &mut Supervised> + '_> {
            Box::new(self.kids.iter_mut())
        }
        fn on_exited(&mut self, e: &Exited) {
            for k in &mut self.kids {
                if let Some(ended) = k.on_exit(e.pid) {
                    self.seen.push(ended);
                }
            }
        }
        fn on_deadlines(&mut self) {
            let now = Instant::now();
            for k in &mut self.kids {
                assert!(!k.on_deadline(now), "no restart is due");
            }
        }
    }

    #[test]
    fn stop_all_stops_every_child_and_leaves_none() {
        let (tx, rx) = unbounded();
        let t = timing(Duration::from_secs(60), Duration::from_millis(200));
        let mut owner = Two {
            kids: vec![Supervised::new("kid", t), Supervised::new("kid", t)],
            seen: Vec::new(),
        };
        run_ready(
            &mut owner.kids[0],
            &tx,
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        );
        run_ready(&mut owner.kids[1], &tx, "echo ready; exec sleep 30");
        // One waits out its backoff: a stop calls its restart off.
        let mut waiting = Supervised::new("kid", t);
        waiting.start_at(Instant::now() + Duration::from_secs(60));
        owner.kids.push(waiting);
        for k in &mut owner.kids {
            k.stop();
        }
        let left = stop_all(&mut owner, &rx, t.stop_grace);
        assert!(left.is_empty(), "{left:?}");
        let mut statuses: Vec<String> = owner
            .seen
            .iter()
            .map(|e| match e {
                Ended::Stopped { status } => status.clone(),
                other => panic!("{other:?}"),
            })
            .collect();
        statuses.sort();
        assert_eq!(statuses.len(), 2);
        assert!(statuses[0].contains("signal: 15"), "{statuses:?}");
        assert!(statuses[1].contains("signal: 9"), "{statuses:?}");
        assert!(owner.kids.iter().all(Supervised::is_stopped));
    }
}
