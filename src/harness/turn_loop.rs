//! The turn loop: one thread, one [`Event`] enum, one `select!`, and the
//! loop's `Phase` as data — idle (waiting for mail), running one claude
//! process (a turn, a `/compact` or a checkpoint), paused until a time for a
//! reason (or until the operator's `hive resume`, which the poller passes
//! on), or parked until claude is logged in again. Every trigger — a
//! message, an operator request, a line or the exit of claude, a timer, a
//! signal — arrives as one event and is handled by one function, whatever the
//! phase; sources that do not apply in a phase are `never()`. The loop is the
//! only writer of turn state (the bus state, the turn-stats db, the ledger).
//!
//! What to do when a run ends is [`policy::plan`]'s — how the work is
//! settled, the pause, the notices, what runs next — and this module carries
//! the plan out (`execute`) without deciding any of it again. The message being handled is a [`Work`] whose [`Inflight`] guard
//! requeues it on every way out unless it was acked, and the [`Ledger`]
//! remembers across hand-outs what a retry needs (attempts, the session that
//! saw the prompt, where to start again). Broker requests are sent through the
//! poller without waiting for their answers.
//!
//! A turn that finished is never run again. A clean `success` result that
//! claude wrote before the harness first signalled it (or with no signal at
//! all) completes the turn whatever happens next — a stop of the harness,
//! the turn timeout, the idle watchdog, a nonzero exit: the message is acked
//! (`Reported::Finished`). One written after that signal, or one that says
//! `interrupted_by_shutdown`, finishes nothing: the run ends as its stop says
//! (a stop of the harness or a shutdown from outside gives the message back
//! at the head, not counted; the timeout and the watchdog count as they do
//! without a result). Every run that lets its message go records it
//! in the turn-stats db before the ack is sent, and a message handed out
//! again after such a run (its ack never reached the broker) is acked without
//! running claude.

use super::accounting::Accounting;
use super::bus::{Bus, LiveEvent, Paused, Retrying, TurnState};
use super::classify::{self, ExitInfo, Signal, Success, TurnObserver, TurnOutcome, TurnReport};
use super::claude::{
    ClaudeRun, Invocation, Output, Pipe, DRAIN_GRACE, MAX_EVENT_BYTES, MAX_STDOUT_LINE,
};
use super::context;
use super::control::{Control, Shared};
use super::invocation::{self, ToolLists};
use super::login::{self, DirSnapshot};
use super::policy::{
    self, Decision, Facts, Next, Plan, Proactive, Resume, Running, Settle, Streaks, Waits,
};
use super::poller::{FromPoller, Poller};
use super::settings::Settings;
use super::stats::{MessageKey, Stats, TurnRow};
use super::work::{Ack, Inflight, Ledger, Requeue, Work, WorkKey};
use crate::mcp::hyperhive::reminder_file;
use crate::proto::limits::MAX_PAUSE_DETAIL_CHARS;
use crate::proto::now;
use crate::proto::text::{is_control_or_bidi, preview};
use crate::proto::{cmd, Request};
use crate::proto::{Message, PauseReason, TurnOutcomeKind};
use crossbeam_channel::{at, never, select, Receiver};
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything that can wake the loop.
#[derive(Debug)]
pub enum Event {
    /// A message, a peek's answer or a reachability change from the poller.
    Broker(FromPoller),
    /// A source that should outlive the loop closed (the poller's threads,
    /// the control channel): the harness stops rather than spin.
    SourceGone(&'static str),
    /// An operator request.
    Control(Control),
    /// A line, the end of the pipes, or the exit of the running claude.
    Claude(ClaudeEvent),
    /// The phase's next deadline passed.
    Timer,
    /// SIGTERM, SIGINT or SIGHUP.
    Signal,
}

#[derive(Debug)]
pub enum ClaudeEvent {
    /// What one wake of the io thread found, in order: lines, the ends of
    /// the pipes, the exit (the loop reaps claude: `ClaudeRun::on_exit`).
    Output(Vec<Output>),
    /// The io thread ended (its channel closed).
    IoGone,
}

/// What the loop is doing.
enum Phase {
    /// No claude running and no pause: waiting for mail (or for a peek's
    /// answer), or about to start something.
    Idle,
    Running(Box<Run>),
    /// Waiting until `until` (the reason, if any, is on the bus), or until
    /// the operator resumes the agent.
    Paused {
        until: Instant,
    },
    /// Parked until the claude config dir changes or a token is stored.
    Login {
        snapshot: DirSnapshot,
        check_at: Instant,
    },
}

/// Why the loop is stopping the running claude.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Cause {
    Interrupt,
    TimedOut,
    Hung,
    /// The text names the servers that did not connect.
    Mcp(String),
    /// A 401 the CLI would retry for minutes.
    EarlyAuth,
    /// The harness is shutting down.
    Stopping,
}

impl Cause {
    /// The stop, in words for a note.
    fn what(&self) -> &'static str {
        match self {
            Cause::Interrupt => "the operator's interrupt",
            Cause::TimedOut => "the turn timeout",
            Cause::Hung => "the idle watchdog",
            Cause::Mcp(_) => "the stop for MCP servers that did not start",
            Cause::EarlyAuth => "the stop for a refused credential",
            Cause::Stopping => "the harness's stop",
        }
    }
}

/// What the run's `result` line said of its turn, against the harness's
/// first signal to claude (`ClaudeRun::written_before_stop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reported {
    /// No `result` that says the turn went well.
    Nothing,
    /// A clean `success` written before the harness signalled claude, or
    /// with no signal sent: the turn finished, whatever comes after.
    Finished,
    /// A `success` written after the harness's signal (the CLI may answer
    /// one with it), or one that says `interrupted_by_shutdown`: the turn did
    /// not finish.
    Stopped,
}

/// One running claude process and what the loop knows about it.
struct Run {
    running: Running,
    claude: ClaudeRun,
    observer: TurnObserver,
    resumed: bool,
    epoch: u64,
    model: String,
    started: Instant,
    started_at: i64,
    deadline: Instant,
    last_output: Instant,
    cause: Option<Cause>,
    reported: Reported,
    exit: Option<io::Result<ExitStatus>>,
    drain_until: Option<Instant>,
    /// Its span (issue 43), handed to the tracer when it ends.
    span: trace::RunSpan,
}

/// How a run ended, for [`TurnLoop::conclude`].
struct Ended {
    running: Running,
    report: TurnReport,
    outcome: TurnOutcomeKind,
    /// claude ran (false for `NotStarted`).
    started: bool,
    resumed: bool,
    epoch: u64,
    model: String,
    started_at: i64,
    elapsed: Duration,
    /// When the rule that a finished turn is never run again changed what
    /// the classifier said: the stats row's kind, and a note for the row and
    /// the page.
    said: Option<(TurnOutcomeKind, String)>,
    /// The run's span, finished in `conclude`.
    span: Option<trace::RunSpan>,
}

impl Ended {
    /// The outcome as the page and the notes word it.
    fn text(&self) -> String {
        match &self.said {
            Some((k, d)) if *k != TurnOutcomeKind::Ok => format!("{k}: {d}"),
            _ => self.report.outcome.to_string(),
        }
    }
}

/// Facts about the claude session that outlive a run.
#[derive(Default)]
struct Session {
    /// Bumped when a run starts a fresh session and when a `/compact` succeeds:
    /// a prompt seen in an older epoch is not verbatim in the history any more.
    epoch: u64,
    /// The next run starts a fresh session (an operator new-session request,
    /// an auto reset, the fresh-session fallback); cleared once one started.
    force_fresh: bool,
    last_context: Option<u64>,
    last_turn_end: Option<i64>,
    /// Context windows the CLI reported, by model.
    cli_windows: HashMap<String, u64>,
    /// CLI versions the `system/init` lines named, each checked once
    /// against the supported window (`check_cli_version`).
    cli_versions: HashSet<String>,
}

/// The synthetic runs due, in the order they start once the loop is free
/// and the broker's word allows (`advance`): the proactive checkpoint or
/// its `/compact`, the operator's `/compact`, then a continue (after a peek).
#[derive(Default)]
struct Due {
    /// The proactive checkpoint or its `/compact`, due next (before mail).
    proactive: Option<Proactive>,
    /// The operator asked for `/compact`; it runs once the loop is free.
    compact: bool,
    /// A continue was requested and waits its turn, like a requeued message.
    continue_turn: bool,
}

impl Due {
    /// A checkpoint or a `/compact` is due.
    fn synthetic(&self) -> bool {
        self.proactive.is_some() || self.compact
    }
}

/// The `recv_next` the loop has outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ask {
    LongPoll,
    /// A peek; `checking`: asked after a run, before a synthetic run.
    Peek {
        checking: bool,
    },
}

/// What the loop knows of the broker's word.
#[derive(Default)]
struct Word {
    ask: Option<Ask>,
    /// A claude run ended and no `recv_next` answered since, nor was a
    /// long-poll sent: what the loop knows of the broker's pause predates
    /// the run's spend row, so no synthetic run starts before it asks.
    after_run: bool,
    /// The broker's pause of this agent (its pool's usage limit, a budget):
    /// no synthetic run (continue, checkpoint, `/compact`) starts while it
    /// stands. Set and cleared by the poller's `BrokerPause`: every
    /// `recv_next` answer without a pause ends it.
    pause: Option<crate::proto::Paused>,
}

impl Word {
    /// A `recv_next` answered (a message, or nothing queued).
    fn answered(&mut self) {
        self.ask = None;
        self.after_run = false;
    }

    /// A peek asked after a run, before a synthetic run, is unanswered.
    fn checking(&self) -> bool {
        self.ask == Some(Ask::Peek { checking: true })
    }
}

pub struct TurnLoop {
    // Drop order matters: the work (and its guard's requeue) goes before the
    // poller, whose shutdown gives queued requests their last try.
    work: Option<Work>,
    /// A message the poller handed over while something else ran.
    arrived: Option<Work>,
    phase: Phase,
    s: Arc<Settings>,
    shared: Shared,
    bus: Bus,
    stats: Option<Stats>,
    tools: ToolLists,
    poller: Poller,
    control: Receiver<Control>,
    /// `sys::signals()`: the first signal, then disconnection.
    signals: Receiver<i32>,
    ledger: Ledger,
    session: Session,
    streaks: Streaks,
    /// Turns completed since start, for the API-outage rule.
    completed_turns: u64,
    /// The synthetic runs due once the loop is free.
    due: Due,
    /// What the loop knows of the broker's word: its ask, whether a run
    /// ended since, the broker's pause.
    word: Word,
    /// The pause last reported to the broker (`report_state`); None when it
    /// must be reported again (at start, after a reconnect).
    reported_pause: Option<Option<crate::proto::Paused>>,
    stopping: bool,
    /// The `HIVE_` variables the context arithmetic reads, taken at boot.
    env: context::ContextEnv,
    /// Spend rows and their acknowledgements, the pool and usage reports,
    /// `turn_usd`.
    acct: Accounting,
    /// The in-memory kit's claude: the runs the loop starts are recorded
    /// here instead of spawned (`kit.rs`).
    #[cfg(test)]
    kit_runs: Option<Vec<(Running, String, bool)>>,
    /// The model file as read during the event being handled (`model`):
    /// read once per event, not once per use (three times a turn).
    model_now: Option<String>,
    /// The spans of the runs and where they go (`trace.rs`).
    tracer: trace::Tracer,
}

impl TurnLoop {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        s: Arc<Settings>,
        shared: Shared,
        stats: Option<Stats>,
        tools: ToolLists,
        poller: Poller,
        control: Receiver<Control>,
        signals: Receiver<i32>,
        last: (Option<u64>, Option<i64>),
    ) -> TurnLoop {
        let bus = shared.bus.clone();
        // Settings::read checked the variables; a thread that cannot start
        // leaves the harness without traces, not without turns.
        let tracer = trace::Tracer::from_env(&crate::sys::env::Env::process(), poller.teller())
            .unwrap_or_else(|e| {
                log::error!("telemetry: {e}; no traces are exported");
                trace::Tracer::off()
            });
        TurnLoop {
            work: None,
            arrived: None,
            phase: Phase::Idle,
            s,
            shared,
            bus,
            stats,
            tools,
            poller,
            control,
            signals,
            ledger: Ledger::default(),
            session: Session {
                last_context: last.0,
                last_turn_end: last.1,
                ..Session::default()
            },
            streaks: Streaks::default(),
            completed_turns: 0,
            due: Due::default(),
            word: Word::default(),
            reported_pause: Some(None),
            stopping: false,
            env: context::ContextEnv::process(),
            acct: Accounting::new(),
            #[cfg(test)]
            kit_runs: None,
            model_now: None,
            tracer,
        }
    }

    /// Runs until a signal, then stops the running claude, requeues what is
    /// inflight and shuts the poller down.
    pub fn run(mut self) {
        self.boot();
        while !self.stopping || matches!(self.phase, Phase::Running(_)) {
            let ev = self.next_event();
            // The operator's model choice may have changed since.
            self.model_now = None;
            self.handle(ev);
            self.report_pause();
        }
        for w in [self.work.take(), self.arrived.take()]
            .into_iter()
            .flatten()
        {
            if w.key.id().is_some() {
                self.bus.emit(LiveEvent::TurnEnd {
                    ok: false,
                    note: "the harness is stopping; the message was requeued".into(),
                    outcome: "stopped".into(),
                    duration_ms: 0,
                    decision: None,
                });
            }
            drop(w);
        }
        self.poller.shutdown();
        // The acknowledgements heard up to the end are written down (had
        // the harness died first, the rows would be sent again at its next
        // boot and counted once).
        let keys = self.poller.events.try_iter().filter_map(|ev| match ev {
            FromPoller::SpendAcked(key) => Some(key),
            _ => None,
        });
        self.acct
            .last_acks(keys.collect::<Vec<_>>(), self.stats.as_ref());
        self.tracer.finish_all();
    }

    fn boot(&mut self) {
        self.poller.tell(Request::from(cmd::HarnessStarted {
            hyperhive_rev: Some(crate::proto::HYPERHIVE_REV.into()),
        }));
        self.acct.resend_spend(self.stats.as_ref(), &self.poller);
        for f in super::plugins::install(&self.s, &self.bus) {
            self.to_parent(format!("[system] {} plugin install: {f}", self.s.label));
        }
        if login::park_at_boot(&self.s) {
            self.enter_login();
        } else {
            self.advance();
        }
    }

    // ---- the one select -------------------------------------------------

    fn next_event(&self) -> Event {
        let no_output = never::<Vec<Output>>();
        let no_signal = never::<i32>();
        let output = match &self.phase {
            Phase::Running(r) => r.claude.output().unwrap_or(&no_output),
            _ => &no_output,
        };
        let timer = self.next_deadline().map_or_else(never, at);
        // A closed signal channel stays ready: watch it until acted on.
        let signals = if self.stopping {
            &no_signal
        } else {
            &self.signals
        };
        select! {
            recv(self.poller.events) -> e => e.map_or(Event::SourceGone("the poller"), Event::Broker),
            recv(self.control) -> c => match c {
                Ok(c) => Event::Control(c),
                // Never closed: the loop's own `shared` holds a sender.
                Err(_) => Event::SourceGone("the control channel"),
            },
            recv(output) -> o => Event::Claude(o.map_or(ClaudeEvent::IoGone, ClaudeEvent::Output)),
            recv(timer) -> _ => Event::Timer,
            recv(signals) -> _ => Event::Signal,
        }
    }

    fn handle(&mut self, ev: Event) {
        match ev {
            Event::Broker(FromPoller::Message {
                message,
                redelivered,
                unread,
                attempts,
                turn_usd,
                traceparent,
            }) => {
                if let Some(tp) = traceparent {
                    self.tracer.message_from(WorkKey::Message(message.id), tp);
                }
                self.on_message(message, redelivered, unread, attempts, turn_usd)
            }
            Event::Broker(FromPoller::BrokerPause(p)) => self.on_broker_pause(p),
            Event::Broker(FromPoller::Resumed) => self.on_resumed(),
            Event::Broker(FromPoller::TurnUsd(u)) => {
                // Every `recv_next` answer, after its pause (or its end):
                // what the loop knows of the pause is current again.
                let first = self.acct.heard_turn_usd(u);
                let was_after_run = std::mem::replace(&mut self.word.after_run, false);
                let synthetic = self.due.synthetic();
                if self.free() && !self.word.checking() && synthetic && (first || was_after_run) {
                    // A compaction asked for before the broker answered, or
                    // a synthetic run that waited for an answer to a
                    // long-poll sent before the last run (its window ended).
                    self.advance();
                }
            }
            // Marked in the stats db with the next run's row: no commit on
            // the way to the next turn.
            Event::Broker(FromPoller::SpendAcked(key)) => {
                self.acct.spend_acked(key, self.stats.as_ref())
            }
            Event::Broker(FromPoller::Empty) => self.on_empty(),
            Event::Broker(FromPoller::Online(online)) => {
                if online && !self.bus.snapshot().online {
                    // The broker may have restarted: what it knew of the
                    // pause (and of the pool) is gone.
                    self.reported_pause = None;
                    self.acct.broker_back();
                }
                self.bus.update(|s| s.online = online)
            }
            Event::Broker(FromPoller::Status {
                unread,
                status_text,
            }) => self.bus.update(|s| {
                s.unread = unread;
                s.status_text = status_text;
            }),
            Event::SourceGone(what) => {
                log::error!("{what} is gone; the harness stops");
                self.stop();
            }
            Event::Control(c) => self.on_control(c),
            Event::Claude(c) => self.on_claude(c),
            Event::Timer => {
                let now = Instant::now();
                if self.acct.acks_due().is_some_and(|t| t <= now) {
                    self.acct.write_spend_acks(self.stats.as_ref());
                }
                if self.phase_deadline().is_some_and(|t| t <= now) {
                    self.on_timer();
                }
            }
            Event::Signal => self.stop(),
        }
    }

    /// A message handed out: acked at once when a run let it go before,
    /// dead-lettered when its attempts were used up, handed back behind a
    /// proactive run, else run now or once the loop is free.
    fn on_message(
        &mut self,
        message: Message,
        redelivered: bool,
        unread: Option<u64>,
        attempts: u32,
        turn_usd: Option<f64>,
    ) {
        self.word.answered();
        self.acct.heard_turn_usd(turn_usd);
        let identity = MessageKey::of(&message);
        if let Some(outcome) = self.let_go_before(&identity) {
            return self.ack_again(&message, unread, &outcome);
        }
        let key = WorkKey::Message(message.id);
        let work = Work {
            key,
            identity: Some(identity),
            from: message.from.to_string(),
            // A long reminder's text goes to a file in the state dir.
            body: reminder_file::for_model(Some(&self.s.state_dir), &message),
            unread: unread.unwrap_or(0),
            redelivered,
            attempts,
            auth_retried: false,
            guard: Inflight::new(key, self.poller.teller()),
        };
        if self.used_up(&work) {
            return self.dead_letter_used_up(work);
        }
        if let Some(p) = self.due.proactive {
            // The hand-out says the broker does not pause the agent,
            // but the checkpoint and its `/compact` come first: the
            // message goes back (at the head, its hand-out given
            // back) and is asked for again after them.
            self.give_back(work, p);
            if self.free() {
                self.advance();
            }
            return;
        }
        if self.due.continue_turn {
            // Mail drives the next turn; the continue is dropped.
            self.due.continue_turn = false;
            self.ledger.forget(WorkKey::Continue);
            self.bus
                .note("continue requested, but messages are waiting: they drive the next turn");
        }
        if self.free() {
            self.start_work(work);
        } else {
            self.arrived = Some(work);
        }
    }

    /// Nothing is queued: a waiting continue runs now (unless the broker
    /// pauses the agent or a synthetic run is due), else the loop goes on.
    fn on_empty(&mut self) {
        self.word.answered();
        // Under the broker's pause the continue waits (`advance`
        // parks a `recv_next`, answered when the pause ends); a
        // checkpoint or a `/compact` due goes first.
        let synthetic = self.due.synthetic();
        if self.free() && self.due.continue_turn && self.word.pause.is_none() && !synthetic {
            self.due.continue_turn = false;
            let key = WorkKey::Continue;
            self.start_work(Work {
                key,
                identity: None,
                from: "self".into(),
                body: "continue".into(),
                unread: 0,
                redelivered: false,
                attempts: 0,
                auth_retried: false,
                guard: Inflight::new(key, self.poller.teller()),
            });
        } else if self.free() {
            self.advance();
        }
    }

    /// The outcome of the run that let `m` go, when one did (its ack may
    /// never have reached the broker).
    fn let_go_before(&self, m: &MessageKey) -> Option<String> {
        let stats = self.stats.as_ref()?;
        stats.completed(m).unwrap_or_else(|e| {
            log::error!("{e}");
            None
        })
    }

    /// Acks message `m`, handed out again after a run that let it go (with
    /// `outcome`), without running claude: the ack of that run never reached
    /// the broker (it was down, or the harness was killed first). The page
    /// shows it as a turn that says so.
    fn ack_again(&mut self, m: &Message, unread: Option<u64>, outcome: &str) {
        // The ack and the ask for the next message in one write.
        let _cork = self.poller.teller().cork();
        let what = format!("message #{} from {}", m.id, m.from);
        let note = if TurnOutcomeKind::from_stored(outcome).0.is_ok() {
            format!("{what} was completed before the restart; not run again")
        } else {
            format!("{what} was finished before the restart ({outcome}); not run again")
        };
        log::info!("{note}: acked");
        self.bus.update(|s| s.unread = unread.unwrap_or(0));
        self.bus.emit(LiveEvent::TurnStart {
            from: m.from.to_string(),
            body: m.body.clone(),
            unread: unread.unwrap_or(0),
            message_id: Some(m.id),
        });
        let key = WorkKey::Message(m.id);
        Inflight::new(key, self.poller.teller()).ack(Ack::Completed);
        self.ledger.forget(key);
        self.bus
            .update(|s| s.last_outcome = Some(outcome.to_string()));
        self.bus.emit(LiveEvent::TurnEnd {
            ok: true,
            note,
            outcome: outcome.to_string(),
            duration_ms: 0,
            decision: Some(policy::describe(&Decision::Complete, Running::Turn)),
        });
        if self.free() {
            self.advance();
        }
    }

    /// Nothing runs, nothing is paused and no message is in hand.
    fn free(&self) -> bool {
        matches!(self.phase, Phase::Idle) && self.work.is_none() && self.arrived.is_none()
    }

    /// The phase's next deadline, or when the spend acknowledgements are
    /// written if that comes first.
    fn next_deadline(&self) -> Option<Instant> {
        match (self.phase_deadline(), self.acct.acks_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn phase_deadline(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Idle => None,
            Phase::Paused { until } => Some(*until),
            Phase::Login { check_at, .. } => Some(*check_at),
            Phase::Running(r) => {
                let mut next = r.drain_until;
                let mut consider = |t: Option<Instant>| {
                    if let Some(t) = t {
                        next = Some(next.map_or(t, |n| n.min(t)));
                    }
                };
                consider(r.claude.ladder_due());
                if r.exit.is_none() && r.cause.is_none() {
                    consider(Some(r.deadline));
                    consider(self.idle_deadline(r));
                }
                next
            }
        }
    }

    /// When a silent run counts as hung: only while no tool call is open.
    fn idle_deadline(&self, r: &Run) -> Option<Instant> {
        let idle = self.s.turn_idle?;
        (r.observer.open_tool_calls() == 0).then(|| r.last_output + idle)
    }

    // ---- operator controls: one rule in every phase ---------------------

    fn on_control(&mut self, c: Control) {
        match c {
            Control::Interrupt => match &mut self.phase {
                Phase::Running(r) if r.exit.is_none() && r.cause.is_none() => {
                    self.bus.note("interrupt requested: stopping claude");
                    r.cause = Some(Cause::Interrupt);
                    r.claude.stop(false);
                }
                Phase::Running(_) => self.bus.note("claude is already being stopped"),
                _ => self.bus.note("nothing to interrupt: no turn is running"),
            },
            Control::Compact => {
                let known = !self.word.after_run && self.due.proactive.is_none();
                if self.free() && self.acct.turn_usd_known() && self.word.pause.is_none() && known {
                    self.start_compaction(Running::OperatorCompact, "operator request");
                } else if self.free() && !self.acct.turn_usd_known() {
                    self.due.compact = true;
                    self.bus.note(
                        "compaction queued: it runs once the broker has answered (it says the \
                         agent's turn_usd)",
                    );
                } else if self.free() && self.word.pause.is_some() {
                    self.due.compact = true;
                    self.bus.note(
                        "compaction queued: the broker pauses this agent (its pool's usage \
                         limit or a budget); it runs once the pause ends",
                    );
                } else if self.free() {
                    self.due.compact = true;
                    self.bus.note(
                        "compaction queued: it runs once the broker has answered whether the \
                         last run's spend pauses this agent",
                    );
                } else {
                    self.due.compact = true;
                    self.bus
                        .note("compaction queued: it runs when the loop is free");
                }
            }
            Control::LoginStored => {
                if matches!(self.phase, Phase::Login { .. }) {
                    self.leave_login();
                }
            }
            Control::Model(name) => {
                self.bus.update(|s| s.model = name.clone());
                self.bus
                    .note(format!("model set to {name} for the next turn"));
            }
        }
    }

    // ---- what comes next -------------------------------------------------

    /// The loop is free: an arrived message, the proactive checkpoint or
    /// its `/compact`, a queued compaction, a waiting continue (after a
    /// peek), or the next message, in that order. Nothing runs before a
    /// `recv_next` answer said the agent's `turn_usd`, and no synthetic run
    /// (checkpoint, compaction, continue) while the broker pauses the agent:
    /// the loop then parks a `recv_next`, which the broker answers when the
    /// pause ends (with a message, which drops the continue and waits behind
    /// a checkpoint, or without one). After a run the loop knows nothing of
    /// the pause its spend row may have caused (a budget reached) or that
    /// began meanwhile (its pool parked): a synthetic run first asks (a peek,
    /// answered after the spend row).
    fn advance(&mut self) {
        self.phase = Phase::Idle;
        self.bus.set_turn_state(TurnState::Idle);
        if self.stopping {
            return;
        }
        if let Some(w) = self.arrived.take() {
            match self.due.proactive {
                Some(p) => self.give_back(w, p),
                None => return self.start_work(w),
            }
        }
        let synthetic = self.due.synthetic();
        if synthetic
            && self.acct.turn_usd_known()
            && self.word.pause.is_none()
            && !self.word.after_run
        {
            if let Some(p) = self.due.proactive.take() {
                return self.start_proactive(p);
            }
            self.due.compact = false;
            return self.start_compaction(Running::OperatorCompact, "operator request");
        }
        if self.word.ask.is_some() {
            return;
        }
        // A peek is answered at once: before a continue, before a synthetic
        // run after a run, and at boot, so `turn_usd` is known before any
        // run. A long-poll sent while the loop knows of no pause is answered
        // at once if the broker pauses the agent, so it stands for an answer.
        let peek = !self.acct.turn_usd_known()
            || (self.word.pause.is_none() && (self.due.continue_turn || synthetic));
        if peek {
            self.word.ask = Some(Ask::Peek {
                checking: synthetic,
            });
            self.poller.peek();
        } else {
            if let (Some(p), Some(pause)) = (self.due.proactive, &self.word.pause) {
                self.bus.note(format!(
                    "{} waits: the broker pauses this agent ({}); it runs once the pause ends",
                    p.what(),
                    pause.detail
                ));
            }
            self.word.ask = Some(Ask::LongPoll);
            self.word.after_run = false;
            self.poller.next();
        }
    }

    /// Gives a handed-out message back (at the head, its hand-out given
    /// back): `p` runs first, and the message is asked for again after it.
    fn give_back(&mut self, w: Work, p: Proactive) {
        self.bus
            .note(format!("{} waits behind {}", w.what(), p.what()));
        w.guard.requeue(Requeue::head());
    }

    /// The checkpoint turn or the `/compact` after it.
    fn start_proactive(&mut self, p: Proactive) {
        match p {
            Proactive::Checkpoint => {
                self.bus.note("checkpoint turn: context is filling up");
                self.start_run(
                    Running::ProactiveCheckpoint,
                    context::CHECKPOINT_PROMPT.into(),
                    true,
                );
            }
            Proactive::Compact => {
                self.start_compaction(Running::ProactiveCompact, "context watermark reached")
            }
        }
    }

    fn start_work(&mut self, work: Work) {
        self.bus.update(|s| {
            s.unread = work.unread;
            s.inflight = work.key.id();
        });
        self.bus.emit(LiveEvent::TurnStart {
            from: work.from.clone(),
            body: work.body.clone(),
            unread: work.unread,
            message_id: work.key.id(),
        });
        if work.redelivered {
            self.bus
                .note("this message was inflight when the harness last stopped; handling it again");
        }
        if work.key != WorkKey::Continue && work.attempts > 0 {
            // The broker's count is the truth: it survives a harness restart.
            // (A broker that does not count says 0: the ledger's own count
            // stands, for as long as this harness runs.)
            let before = work.attempts - 1;
            self.ledger.update(work.key, |r| r.attempts = before);
        }
        let resume = self.ledger.get(work.key).resume;
        self.work = Some(work);
        match resume {
            Resume::CompactThenTurn => self.start_compaction(
                Running::ReactiveCompact,
                "compacting again before the retry",
            ),
            Resume::Turn => self.start_turn_checked(),
        }
    }

    /// Now, for the cold-cache decision only: the system clock, or the
    /// unix seconds in the test-only `HIVE_TEST_CLOCK_FILE` when it is set
    /// (virtual time for the cost bench; an unreadable file falls back to
    /// the system clock).
    fn cache_clock(&self) -> i64 {
        self.env
            .get(context::TEST_CLOCK_FILE_ENV)
            .and_then(|path| std::fs::read_to_string(path).ok())
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or_else(now)
    }

    /// The auto session-reset check, then the turn: a big context and a cold
    /// cache make a fresh session cheaper than resuming.
    fn start_turn_checked(&mut self) {
        if self.shared.take_skip_continue() {
            self.session.force_fresh = true;
        }
        let model = self.model();
        let window = self.window(&model);
        let env = |k: &str| self.env.get(k);
        let since = self
            .session
            .last_turn_end
            .map(|t| Duration::from_secs((self.cache_clock() - t).max(0) as u64))
            .unwrap_or_default();
        let reset = !self.session.force_fresh
            && context::needs_auto_reset(
                self.session.last_context,
                context::auto_reset_watermark(window, &env),
                since,
                context::cache_ttl(&env),
            );
        if reset {
            self.bus
                .note("checkpoint turn: the cache is cold; resetting the session");
            self.start_run(
                Running::ResetCheckpoint,
                context::AUTO_RESET_CHECKPOINT_PROMPT.into(),
                true,
            );
        } else {
            self.start_turn();
        }
    }

    /// The work's turn: the whole message, or a short note when this very
    /// session already holds its prompt.
    fn start_turn(&mut self) {
        let Some(w) = &self.work else {
            return self.advance();
        };
        let resume = !self.session.force_fresh;
        let seen = self.ledger.get(w.key).seen_epoch == Some(self.session.epoch);
        let prompt = if resume && seen {
            context::retry_note(&w.what())
        } else {
            context::wake_prompt(&w.from, &w.body, w.unread)
        };
        self.bus.set_turn_state(TurnState::Thinking);
        self.start_run(Running::Turn, prompt, resume);
    }

    fn start_compaction(&mut self, running: Running, why: &str) {
        self.bus.note(format!("compacting the session ({why})"));
        self.start_run(running, "/compact".into(), true);
    }

    /// The model the next run uses: the operator's choice (the model file)
    /// or the default, read once per event.
    fn model(&mut self) -> String {
        self.model_now
            .get_or_insert_with(|| self.shared.model())
            .clone()
    }

    fn window(&self, model: &str) -> u64 {
        context::context_window_tokens(
            model,
            self.session.cli_windows.get(model).copied(),
            self.env.pairs(),
        )
    }

    fn invocation(
        &self,
        prompt: String,
        model: &str,
        resume: bool,
        traceparent: String,
    ) -> Invocation {
        let mut env = invocation::claude_vars(self.s.claude_max_retries);
        env.extend(login::token_env(&self.s));
        env.extend(invocation::trace_vars(traceparent, self.tracer.cli_vars()));
        Invocation {
            bin: self.s.claude_bin.clone(),
            args: invocation::claude_args(
                &self.s,
                &self.tools,
                model,
                resume,
                self.acct.turn_usd(),
            ),
            stdin: prompt,
            env,
            cwd: self.s.state_dir.clone(),
            timeout: self.s.turn_timeout,
            grace: self.s.kill_grace,
        }
    }

    /// Starts one claude process; one that cannot be started ends at once as
    /// `NotStarted`.
    fn start_run(&mut self, running: Running, prompt: String, resume: bool) {
        self.bus.set_turn_state(if running.is_compaction() {
            TurnState::Compacting
        } else {
            TurnState::Thinking
        });
        let model = self.model();
        let key = self.work.as_ref().map(|w| w.key);
        let span = self.tracer.start(key);
        let inv = self.invocation(prompt, &model, resume, span.traceparent());
        let started_at = now();
        let started = Instant::now();
        let observer = if running.is_compaction() {
            TurnObserver::compaction()
        } else {
            TurnObserver::new()
        };
        #[cfg(test)]
        if let Some(runs) = &mut self.kit_runs {
            runs.push((running, inv.stdin.clone(), resume));
            return;
        }
        self.acct.report_pool(&self.s, &self.poller);
        match ClaudeRun::start(&inv) {
            Err(why) => {
                self.bus.note(why.clone());
                let mut report = observer.finish(ExitInfo {
                    code: Some(127),
                    ..ExitInfo::default()
                });
                report.outcome = TurnOutcome::not_started(why);
                self.conclude(Ended {
                    running,
                    report,
                    outcome: TurnOutcomeKind::NotStarted,
                    started: false,
                    resumed: resume,
                    epoch: self.session.epoch,
                    model,
                    started_at,
                    elapsed: started.elapsed(),
                    said: None,
                    span: Some(span),
                });
            }
            Ok(claude) => {
                if self.streaks.start > 0 {
                    log::info!(
                        "claude starts again after {} failed starts",
                        self.streaks.start
                    );
                    self.bus.note("claude starts again");
                    self.streaks.start = 0;
                }
                if !resume {
                    self.session.epoch += 1;
                    self.session.force_fresh = false;
                }
                self.phase = Phase::Running(Box::new(Run {
                    running,
                    claude,
                    observer,
                    resumed: resume,
                    epoch: self.session.epoch,
                    model,
                    started,
                    started_at,
                    deadline: started + inv.timeout,
                    last_output: started,
                    cause: None,
                    reported: Reported::Nothing,
                    exit: None,
                    drain_until: None,
                    span,
                }));
            }
        }
    }

    // ---- a running claude ------------------------------------------------

    fn on_claude(&mut self, ev: ClaudeEvent) {
        match ev {
            ClaudeEvent::Output(batch) => {
                for o in batch {
                    self.on_output(o);
                }
            }
            ClaudeEvent::IoGone => {
                let Phase::Running(r) = &mut self.phase else {
                    return;
                };
                r.claude.io_gone();
                // An io thread that ended before it saw the exit is taken as
                // the exit: `on_exit` kills the group before it reaps, so
                // that cannot block.
                if !r.claude.has_exited() {
                    self.on_output(Output::Exited);
                }
            }
        }
        if let Phase::Running(r) = &self.phase {
            if r.exit.is_some() && !r.claude.pipes_open() {
                self.finish_run();
            }
        }
    }

    /// One line of claude's output, the end of a pipe, or its exit.
    fn on_output(&mut self, o: Output) {
        let Phase::Running(r) = &mut self.phase else {
            return;
        };
        r.claude.on_output(&o);
        if !matches!(o, Output::Exited) {
            r.last_output = Instant::now();
        }
        let signals = match o {
            Output::Exited => {
                r.exit = Some(r.claude.on_exit());
                r.drain_until = Some(Instant::now() + DRAIN_GRACE);
                return;
            }
            Output::Stdout(Pipe::Line(line), end) => {
                if line.trim().is_empty() {
                    return;
                }
                match serde_json::from_str::<serde_json::Value>(&line) {
                    Ok(v) => {
                        let signals = r.observer.on_stdout_value(&v);
                        r.span.on_stdout(&v);
                        if let Some(s) = classify::success_of(&v) {
                            let before = r.claude.written_before_stop(end);
                            r.reported = if s == Success::Finished && before {
                                Reported::Finished
                            } else {
                                Reported::Stopped
                            };
                        }
                        if line.len() > MAX_EVENT_BYTES {
                            let ty = v.get("type").cloned().unwrap_or_default();
                            self.bus.emit(LiveEvent::Stream {
                                value: serde_json::json!({"type": ty, "hive_truncated": true, "bytes": line.len()}),
                            });
                            self.bus.note(format!(
                                "a {} byte stdout line is not shown in full",
                                line.len()
                            ));
                        } else {
                            self.bus.emit(LiveEvent::Stream { value: v });
                        }
                        signals
                    }
                    Err(_) => {
                        self.bus.note(format!("stdout: {line}"));
                        Vec::new()
                    }
                }
            }
            Output::Stdout(Pipe::TooLong, _) => {
                self.bus.note(format!(
                    "a stdout line over {MAX_STDOUT_LINE} bytes was dropped"
                ));
                Vec::new()
            }
            Output::Stderr(Pipe::Line(line)) => {
                let signals = r.observer.on_stderr_line(&line);
                self.bus.note(line);
                signals
            }
            Output::Stderr(Pipe::TooLong) => {
                self.bus.note("a stderr line too long to show was dropped");
                Vec::new()
            }
            Output::Stdout(Pipe::Closed, _) | Output::Stderr(Pipe::Closed) => Vec::new(),
        };
        for s in signals {
            self.on_signal(s);
        }
    }

    /// What the classifier noticed while claude runs.
    fn on_signal(&mut self, sig: Signal) {
        let Phase::Running(r) = &mut self.phase else {
            return;
        };
        let alive = r.exit.is_none();
        match sig {
            Signal::KillEarlyAuth => {
                if alive && r.cause.is_none() {
                    self.bus
                        .note("claude is retrying a refused credential (401): stopping it early");
                    r.cause = Some(Cause::EarlyAuth);
                    r.claude.stop(true);
                }
            }
            Signal::McpNotConnected(servers) => {
                if r.running != Running::Turn || !alive || r.cause.is_some() {
                    return;
                }
                let text = servers
                    .iter()
                    .map(|(n, st)| format!("{n} {st}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                self.bus.note(format!(
                    "the MCP servers of this turn did not start ({text}): stopping claude, the message is kept"
                ));
                r.cause = Some(Cause::Mcp(text));
                r.claude.stop(true);
                self.bus.update(|s| {
                    for (name, _) in &servers {
                        *s.mcp_start_failures.entry(name.clone()).or_default() += 1;
                    }
                });
            }
            Signal::RateLimited { .. } => self.bus.update(|s| {
                s.retrying = Some(Retrying {
                    reason: "rate_limit",
                    attempt: None,
                    max_retries: None,
                    error_status: Some(429),
                })
            }),
            Signal::ApiRetry {
                attempt,
                max_retries,
                error_status,
                error,
                ..
            } => {
                let rate = error_status == Some(429) || error.as_deref() == Some("rate_limit");
                self.bus.update(|s| {
                    s.retrying = Some(Retrying {
                        reason: if rate { "rate_limit" } else { "api_error" },
                        attempt: Some(attempt),
                        max_retries: Some(max_retries),
                        error_status,
                    })
                });
            }
        }
    }

    fn on_timer(&mut self) {
        let now_i = Instant::now();
        match &mut self.phase {
            Phase::Idle => {}
            Phase::Paused { until } => {
                if now_i >= *until {
                    self.end_pause();
                }
            }
            Phase::Login { snapshot, check_at } => {
                if now_i >= *check_at {
                    if DirSnapshot::take(&self.s.claude_config_dir).advanced_from(snapshot) {
                        self.leave_login();
                    } else {
                        *check_at = now_i + self.s.login_poll;
                    }
                }
            }
            Phase::Running(r) => {
                if r.exit.is_none() && r.cause.is_none() {
                    if now_i >= r.deadline {
                        self.bus.note(format!(
                            "turn timed out after {:?}: stopping claude",
                            self.s.turn_timeout
                        ));
                        r.cause = Some(Cause::TimedOut);
                        r.claude.stop(false);
                    } else if let Some(idle) = self.s.turn_idle {
                        if r.observer.open_tool_calls() == 0 && now_i >= r.last_output + idle {
                            self.bus.note(format!(
                                "claude printed nothing for {}s with no tool call open: stopping it",
                                idle.as_secs()
                            ));
                            r.cause = Some(Cause::Hung);
                            r.claude.stop(false);
                        }
                    }
                }
                if r.claude.ladder_due().is_some_and(|t| now_i >= t) {
                    r.claude.step();
                }
                if r.drain_until.is_some_and(|t| now_i >= t) {
                    self.bus.note(
                        "claude exited but something still holds its output pipes; not waiting for them",
                    );
                    self.finish_run();
                }
            }
        }
    }

    fn stop(&mut self) {
        if !self.stopping {
            log::info!("stopping: the running claude is stopped and inflight work requeued");
        }
        self.stopping = true;
        if let Phase::Running(r) = &mut self.phase {
            if r.cause.is_none() {
                r.cause = Some(Cause::Stopping);
            }
            r.claude.stop(true);
        }
    }

    /// claude exited and its pipes are drained (or the drain grace passed).
    fn finish_run(&mut self) {
        let Phase::Running(run) = std::mem::replace(&mut self.phase, Phase::Idle) else {
            return;
        };
        let run = *run;
        let (code, signal) = match &run.exit {
            Some(Ok(st)) => (st.code(), st.signal()),
            Some(Err(e)) => {
                log::error!("cannot read how claude exited: {e}");
                (None, None)
            }
            None => (None, None),
        };
        let elapsed = run.started.elapsed();
        log::debug!(
            "claude exited: {:?} ({:?}, stopped for {:?})",
            run.exit,
            run.running,
            run.cause
        );
        let mut report = run.observer.finish(ExitInfo {
            code,
            signal,
            timed_out: run.cause == Some(Cause::TimedOut),
            killed_early_for_auth: run.cause == Some(Cause::EarlyAuth),
            elapsed: Some(elapsed),
        });
        // A success after the harness's signal finishes nothing.
        let ok = report.outcome.is_ok() && run.reported != Reported::Stopped;
        let rule = finished_rule(
            run.running,
            run.reported,
            run.cause.as_ref(),
            run.claude.stopping(),
            report.outcome.is_ok(),
            &ended_words(code, signal),
        );
        let (outcome, said) = match rule {
            Some((outcome, said)) => {
                if outcome.is_ok() && !report.outcome.is_ok() {
                    report.outcome = TurnOutcome::ok();
                }
                (outcome, said)
            }
            None => (self.stopped_for(run.cause.as_ref(), ok, &mut report), None),
        };
        drop(run.claude);
        self.bus.update(|s| s.retrying = None);
        self.conclude(Ended {
            running: run.running,
            report,
            outcome,
            started: true,
            resumed: run.resumed,
            epoch: run.epoch,
            model: run.model,
            started_at: run.started_at,
            elapsed,
            said,
            span: Some(run.span),
        });
    }

    /// The outcome of a run the loop stopped for `cause` (the classifier's,
    /// with no cause), the report's outcome set to match; `ok`: the run
    /// succeeded, by the classifier and against the stop.
    fn stopped_for(
        &self,
        cause: Option<&Cause>,
        ok: bool,
        report: &mut TurnReport,
    ) -> TurnOutcomeKind {
        match cause {
            Some(Cause::Interrupt) if !ok => {
                report.outcome = TurnOutcome::interrupted("interrupted by the operator".into());
                TurnOutcomeKind::Interrupted
            }
            Some(Cause::Hung) if !ok => {
                let idle = self.s.turn_idle.unwrap_or_default().as_secs();
                report.outcome = TurnOutcome::hung(format!(
                    "no output for {idle}s with no tool call open; stopped"
                ));
                TurnOutcomeKind::Hung
            }
            Some(Cause::Mcp(text)) => {
                report.outcome = TurnOutcome::mcp_not_connected(text.clone());
                TurnOutcomeKind::McpStartFailed
            }
            Some(Cause::TimedOut) if !ok => TurnOutcomeKind::TimedOut,
            _ => report.outcome.kind(),
        }
    }

    // ---- after a run: bookkeeping, then the policy -----------------------

    fn conclude(&mut self, mut e: Ended) {
        // What the end of a run tells the broker (its spend, its counters,
        // the ack or requeue, an ask for the next message) goes out in one
        // write when this returns.
        let _cork = self.poller.teller().cork();
        // Its spend row goes to the broker before any later ask.
        self.word.after_run = true;
        // The context window the CLI reported, before the plan's watermark
        // and the run's row read it.
        if let (Some(m), Some(w), true) = (&e.report.model, e.report.context_window, e.started) {
            self.session.cli_windows.insert(m.clone(), w);
        }
        // A stop of the harness gives the message back as it is (its guard
        // requeues it), unless its turn finished: then it is acked first.
        let finished = e.running == Running::Turn && e.outcome.is_ok();
        if self.stopping && !finished {
            if e.started {
                self.record(&e, false);
            }
            self.trace_run(&mut e, None);
            return;
        }
        let key = self.work.as_ref().map(|w| w.key);
        if e.running == Running::Turn {
            if e.started {
                self.session.last_turn_end = Some(self.cache_clock());
            }
            // A harness that stops leaves the sentinel to its next boot.
            if !self.stopping && self.take_continue() {
                self.due.continue_turn = true;
            }
        }
        if let Some(key) = key {
            // A turn's prompt is the message (a checkpoint's is not).
            if e.report.prompt_reached_session && e.running == Running::Turn {
                self.ledger.update(key, |r| r.seen_epoch = Some(e.epoch));
            }
        }
        if e.running.is_compaction() {
            let ok = e.outcome.is_ok();
            let detail = match e.report.compact.as_ref().filter(|_| ok) {
                Some(c) => format!(
                    "{} → {} tokens",
                    c.pre_tokens.map_or("?".into(), |t| t.to_string()),
                    c.post_tokens.map_or("?".into(), |t| t.to_string())
                ),
                None => e.report.outcome.to_string(),
            };
            self.bus.note(format!(
                "compaction {}: {detail}",
                if ok { "done" } else { "failed" }
            ));
            if ok {
                // The history is a summary now: no prompt is in it verbatim.
                self.session.epoch += 1;
                self.session.last_context = e.report.context_tokens;
            }
        }
        let text = e.text();
        let plan = policy::plan(&self.end_of(&e, &text));
        log::debug!(
            "{:?} during {:?}: {:?}",
            e.outcome,
            e.running,
            plan.decision
        );
        // A message let go is recorded as such before its ack is sent.
        let lets_go = plan.decision.acks() && plan.decision != Decision::DeadLetter;
        if e.started {
            self.record(&e, lets_go);
        }
        let decision = policy::describe(&plan.decision, e.running);
        self.trace_run(&mut e, Some(decision));
        if plan.decision.acks() {
            if let Some(k) = self.work.as_ref().map(|w| w.key) {
                self.tracer.forget(k);
            }
        }
        self.execute(plan, &e, &text);
    }

    /// Hands the run's span to the tracer, with what the run came to.
    fn trace_run(&mut self, e: &mut Ended, decision: Option<String>) {
        let Some(span) = e.span.take() else {
            return;
        };
        let work = self.work.as_ref();
        let kind = run_kind(e.running, work.map(|w| w.key));
        let outcome = match &e.said {
            Some((k, _)) => k.as_str().to_string(),
            None => e.outcome.as_str().to_string(),
        };
        let ok = e.outcome.is_ok();
        let end = trace::RunEnd {
            agent: &self.s.label,
            run_kind: kind,
            request_model: &e.model,
            report: &e.report,
            outcome: &outcome,
            ok,
            decision,
            message_id: work.and_then(|w| w.key.id()),
            sender: work.map(|w| w.from.as_str()),
        };
        self.tracer.finish(span, end);
    }

    /// What the policy's plan is made of: the run's end, the facts of its
    /// work and session, the figures of its notices and pause.
    fn end_of<'a>(&mut self, e: &'a Ended, text: &'a str) -> policy::End<'a> {
        let key = self.work.as_ref().map(|w| w.key);
        let rec = key.map(|k| self.ledger.get(k)).unwrap_or_default();
        let facts = Facts {
            attempts: rec.attempts,
            max_attempts: self.s.max_attempts,
            resumed: e.resumed,
            compacted: rec.compacted_epoch == Some(self.session.epoch),
            auth_retried: self.work.as_ref().is_some_and(|w| w.auth_retried),
            succeeded_since_failure: rec.failed_at.is_some_and(|n| self.completed_turns > n),
        };
        let model = self.model();
        let window = self.window(&model);
        let env = |k: &str| self.env.get(k);
        let past_watermark = context::needs_proactive_compact(
            e.report.context_tokens,
            context::compact_watermark(window, &env),
        );
        let t = now();
        let result_text = e.report.result_text.as_deref().unwrap_or_default();
        let resets_at = e
            .report
            .outcome
            .resets_at
            .or_else(|| classify::utc_reset_in_text(result_text, t));
        policy::End {
            outcome: e.outcome,
            running: e.running,
            facts,
            has_work: key.is_some(),
            label: self.s.label.clone(),
            what: self.work.as_ref().map(Work::what).unwrap_or_default(),
            text,
            said: e.said.as_ref().map(|(_, n)| n.as_str()),
            detail: e.report.outcome.detail().unwrap_or_default(),
            result_text,
            resets_at,
            cost_usd: e.report.cost_usd,
            turn_usd: self.acct.turn_usd(),
            past_watermark,
            now: t,
            streaks: self.streaks,
            waits: Waits {
                brief: self.s.fail_pause,
                rate_limit: self.s.rate_limit_sleep,
                rate_limit_max: self.s.rate_limit_max_sleep,
                api_backoff_base: self.s.api_backoff_base,
                api_backoff_max: self.s.api_backoff_max,
                api_failures_before_notice: self.s.api_failures_before_notice,
                start_backoff_max: self.s.start_backoff_max,
            },
        }
    }

    /// Carries out the plan for a run's end, in its order: the work's
    /// settlement, the usage limit report, the parent notices, the log
    /// lines, the page, then what runs next.
    fn execute(&mut self, plan: Plan, e: &Ended, text: &str) {
        self.streaks = plan.streaks;
        if plan.completed {
            self.completed_turns += 1;
        }
        self.settle(plan.settle, text);
        if let Some(u) = plan.usage_limit {
            self.poller.tell(Request::from(cmd::ReportUsageLimit {
                // What identified the run's credential at its spawn.
                credential: self.acct.credential(&self.s),
                until: u.until,
                detail: one_line(&u.detail, MAX_PAUSE_DETAIL_CHARS),
            }));
        }
        for n in plan.notices {
            self.to_parent(n);
        }
        for (level, line) in plan.logs {
            log::log!(level, "{line}");
        }
        for n in plan.notes {
            self.bus.note(n);
        }
        if let Some(end) = plan.end {
            self.end_work(&plan.decision, end.ok, end.note, text, e);
        }
        self.go(plan.next);
    }

    /// Settles the work in hand as the plan says.
    fn settle(&mut self, settle: Settle, text: &str) {
        let completed = self.completed_turns;
        match settle {
            Settle::Hold => {}
            Settle::RetryAuth => {
                if let Some(w) = &mut self.work {
                    w.auth_retried = true;
                }
            }
            Settle::Ack(why) => {
                if let Some(w) = self.work.take() {
                    self.ledger.forget(w.key);
                    // The turn log's id of its turn, once written (a turn
                    // of a few milliseconds may not be yet: no turn named).
                    let turn = w.key.id().and_then(|id| self.bus.history_turn(id));
                    w.guard.ack_turn(why, turn);
                }
            }
            Settle::DeadLetter { notice } => {
                if let Some(w) = self.work.take() {
                    self.ledger.forget(w.key);
                    w.guard.dead_letter(text, true, notice);
                }
            }
            Settle::Requeue {
                counted,
                place,
                then,
            } => {
                let Some(w) = self.work.take() else {
                    return;
                };
                self.ledger.update(w.key, |r| {
                    if counted {
                        r.attempts += 1;
                    }
                    r.last_error = text.to_string();
                    r.resume = then;
                    r.failed_at = Some(completed);
                });
                if w.key == WorkKey::Continue {
                    self.due.continue_turn = true;
                }
                // The error is kept as the message's last one when it counted.
                w.guard.requeue(Requeue {
                    counted,
                    place,
                    error: counted.then(|| text.to_string()),
                });
            }
        }
    }

    /// What runs next, as the plan says.
    fn go(&mut self, next: Next) {
        match next {
            Next::Advance(proactive) => {
                if proactive.is_some() {
                    self.due.proactive = proactive;
                }
                self.advance();
            }
            Next::TurnAfterCompact => {
                if let Some(w) = &self.work {
                    let epoch = self.session.epoch;
                    self.ledger.update(w.key, |r| {
                        r.compacted_epoch = Some(epoch);
                        r.resume = Resume::Turn;
                    });
                }
                self.start_turn();
            }
            Next::FreshTurn => {
                if let Some(w) = &self.work {
                    self.ledger.update(w.key, |r| r.resume = Resume::Turn);
                }
                self.session.force_fresh = true;
                self.session.last_context = None;
                self.start_turn();
            }
            Next::Turn => self.start_turn(),
            Next::Compact(running, why) => self.start_compaction(running, why),
            Next::ResetCheckpoint => self.start_run(
                Running::ResetCheckpoint,
                context::AUTO_RESET_CHECKPOINT_PROMPT.into(),
                true,
            ),
            Next::Pause {
                wait,
                reason,
                detail,
            } => self.pause(wait, reason, detail),
            Next::Login => self.enter_login(),
        }
    }

    /// The stats row, the counters and the bus figures of a run that
    /// started; with `lets_go`, the row also records its message as let go.
    fn record(&mut self, e: &Ended, lets_go: bool) {
        let rep = &e.report;
        if let Some(v) = &rep.cli_version {
            self.check_cli_version(v);
        }
        if let Some(ctx) = rep.context_tokens {
            self.session.last_context = Some(ctx);
        }
        let window = self.window(&e.model);
        self.bus.update(|s| {
            s.model = e.model.clone();
            s.context_window_tokens = window;
            s.context_tokens = rep.context_tokens.or(s.context_tokens);
            if rep.session_id.is_some() {
                s.session_id = rep.session_id.clone();
            }
        });
        let work = self.work.as_ref();
        let kind = run_kind(e.running, work.map(|w| w.key));
        let (outcome, note) = match &e.said {
            Some((k, note)) => (*k, note.clone()),
            None => (
                rep.outcome.kind(),
                match (
                    e.outcome == TurnOutcomeKind::Interrupted,
                    rep.outcome.detail(),
                ) {
                    (true, Some(d)) => format!("interrupted by the operator; {d}"),
                    (true, None) => "interrupted by the operator".into(),
                    (false, d) => d.unwrap_or_default(),
                },
            ),
        };
        let row = TurnRow {
            id: 0,
            started_at: e.started_at,
            duration_ms: e.elapsed.as_millis() as u64,
            kind: kind.into(),
            outcome: outcome.as_str().to_string(),
            model: e.model.clone(),
            sender: work.map_or_else(|| "harness".into(), |w| w.from.clone()),
            message_id: work.and_then(|w| w.key.id()),
            context_tokens: rep.context_tokens,
            tokens_in: rep.input_tokens,
            tokens_out: rep.output_tokens,
            cost_usd: rep.cost_usd.unwrap_or(0.0),
            session_id: rep.session_id.clone(),
            note,
        };
        let let_go = work.and_then(|w| w.identity.as_ref()).filter(|_| lets_go);
        self.acct.record_run(
            &self.s,
            self.stats.as_ref(),
            &row,
            rep,
            let_go,
            &self.poller,
        );
    }

    /// The message's attempts were used up before this hand-out: the
    /// harness stopped (crashed, or was killed) during each of its last runs,
    /// so no outcome was ever recorded for them.
    fn used_up(&self, w: &Work) -> bool {
        w.key != WorkKey::Continue && w.attempts > self.s.max_attempts.max(1)
    }

    /// Dead-letters a message whose attempts were used up by runs that never
    /// ended (the harness stopped during each), without running it again.
    fn dead_letter_used_up(&mut self, w: Work) {
        let n = w.attempts - 1;
        let known = self.ledger.get(w.key).last_error;
        let text = if known.is_empty() {
            format!(
                "handed out {n} times without an outcome: the harness stopped (crashed or was killed) while it ran"
            )
        } else {
            format!("handed out {n} times; the harness stopped while it ran (before: {known})")
        };
        let what = w.what();
        log::warn!("{what} is dead-lettered: {text}");
        self.bus.note(format!("{what} is dead-lettered: {text}"));
        let notice = format!(
            "[system] {}: {what} is dead-lettered after {n} attempts; last error: {text}",
            self.s.label
        );
        self.ledger.forget(w.key);
        w.guard.dead_letter(&text, false, notice);
        if self.free() {
            self.advance();
        }
    }

    /// A CLI version outside the supported window is shown on the page and
    /// logged once per harness, and told to the parent once per version for
    /// good (the versions told are kept in the state dir), unless `hive up`
    /// tells the operator itself (`cli_window_notice` off). The turn runs
    /// either way.
    fn check_cli_version(&mut self, version: &str) {
        let version: String = version.chars().filter(|c| !c.is_control()).collect();
        let version = version.as_str();
        if !self.session.cli_versions.insert(version.to_string()) {
            return;
        }
        let Some(notice) = crate::agent_proc::cli_window_notice(version) else {
            return;
        };
        log::warn!("{notice}");
        self.bus.note(notice.clone());
        if !self.s.cli_window_notice {
            return;
        }
        let told = self
            .s
            .state_dir
            .join(crate::proto::paths::state::CLI_VERSIONS_TOLD);
        let before = std::fs::read_to_string(&told).unwrap_or_default();
        if before.lines().any(|l| l == version) {
            return;
        }
        // Appended before the notice is sent: a crash in between loses one
        // notice rather than repeating it at every start.
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&told)
            .and_then(|mut f| std::io::Write::write_all(&mut f, format!("{version}\n").as_bytes()));
        if let Err(e) = appended {
            log::warn!("cannot write {}: {e}", told.display());
        }
        self.to_parent(format!("[{}] {notice}", self.s.label));
    }

    /// The broker pauses this agent (or no longer does): shown on the page
    /// while the loop has no pause of its own.
    fn on_broker_pause(&mut self, p: Option<crate::proto::Paused>) {
        self.word.pause = p.clone();
        let shown = p.map(|p| Paused {
            reason: p.reason,
            until: p.until,
            detail: p.detail,
        });
        if matches!(self.phase, Phase::Idle) {
            self.bus.update(|s| {
                let broker_owned = s.paused.as_ref().is_none_or(|c| c.reason.held_by_broker());
                if broker_owned {
                    s.paused = shown.clone();
                }
            });
        }
    }

    /// The operator resumed the agent (`hive resume`): a pause of the
    /// loop's own (a rate limit, an API backoff, MCP servers or a claude
    /// that did not start, a usage limit) ends now, its message tried again
    /// at once; the backoff's count stays, so a failure again waits longer.
    /// The broker lifts its own pauses itself, and a login park ends only
    /// with credentials.
    fn on_resumed(&mut self) {
        match &self.phase {
            Phase::Paused { .. } => {
                let what = self.bus.paused().map_or_else(
                    || "the pause".to_string(),
                    |p| format!("the {} pause", p.reason),
                );
                log::info!("the operator resumed {}: {what} ends now", self.s.label);
                self.bus
                    .note(format!("the operator lifted {what}: trying again now"));
                self.end_pause();
            }
            Phase::Login { .. } => self
                .bus
                .note("the operator's resume cannot end the login park: claude needs credentials"),
            Phase::Idle | Phase::Running(_) => {
                log::debug!("the operator's resume found no pause of the loop's own")
            }
        }
    }

    /// The loop's own pause is over (its time, or the operator's resume).
    fn end_pause(&mut self) {
        self.bus.update(|s| {
            s.paused = None;
            s.rate_limited = false;
            s.rate_limited_until = None;
        });
        self.advance();
    }

    /// Tells the broker the pause, when it changed since it was last told.
    fn report_pause(&mut self) {
        let now = self.bus.paused().map(|p| crate::proto::Paused {
            reason: p.reason,
            until: p.until,
            detail: one_line(&p.detail, MAX_PAUSE_DETAIL_CHARS),
        });
        if self.reported_pause.as_ref() == Some(&now) {
            return;
        }
        self.poller.tell(Request::from(cmd::ReportState {
            paused: now.clone(),
        }));
        self.reported_pause = Some(now);
    }

    fn pause(&mut self, d: Duration, reason: Option<PauseReason>, detail: String) {
        let until = now() + d.as_secs() as i64;
        self.bus.set_turn_state(TurnState::Idle);
        self.bus.update(|s| {
            if reason.as_ref().is_some_and(PauseReason::is_rate_limit) {
                s.rate_limited = true;
                s.rate_limited_until = Some(until);
            }
            s.paused = reason.map(|reason| Paused {
                reason,
                until: Some(until),
                detail,
            });
        });
        self.phase = Phase::Paused {
            until: Instant::now() + d,
        };
    }

    /// `TurnEnd` on the bus, for a work whose handling ends here (for now),
    /// with the decision that ended it.
    fn end_work(&self, d: &Decision, ok: bool, note: String, outcome: &str, e: &Ended) {
        self.bus.update(|s| {
            s.last_outcome = Some(outcome.to_string());
            s.inflight = None;
        });
        self.bus.emit(LiveEvent::TurnEnd {
            ok,
            note,
            outcome: outcome.to_string(),
            duration_ms: e.elapsed.as_millis() as u64,
            decision: Some(policy::describe(d, e.running)),
        });
    }

    fn to_parent(&self, body: String) {
        self.poller.tell(Request::from(cmd::SendToParent { body }));
    }

    /// Consumes the `hyperhive-continue` sentinel; true when it was there.
    fn take_continue(&self) -> bool {
        let p = self.s.continue_sentinel();
        p.exists() && std::fs::remove_file(&p).is_ok()
    }

    // ---- the login park --------------------------------------------------

    fn enter_login(&mut self) {
        let sentinel = self.s.needs_login_sentinel();
        let text = login::sentinel_text(&self.s, now());
        if let Err(e) = super::files::write_private(&sentinel, text.as_bytes()) {
            log::error!("cannot write {}: {e}", sentinel.display());
        }
        self.bus.set_turn_state(TurnState::Idle);
        self.bus.update(|s| {
            s.needs_login = true;
            s.paused = Some(Paused {
                reason: PauseReason::Login,
                until: None,
                detail: "claude needs a login".into(),
            });
        });
        self.bus.note(format!(
            "claude needs a login: log in (claude /login with CLAUDE_CONFIG_DIR={}) or store a token on this page",
            self.s.claude_config_dir.display()
        ));
        self.phase = Phase::Login {
            snapshot: DirSnapshot::take(&self.s.claude_config_dir),
            check_at: Instant::now() + self.s.login_poll,
        };
    }

    fn leave_login(&mut self) {
        let _ = std::fs::remove_file(self.s.needs_login_sentinel());
        self.bus.update(|s| {
            s.needs_login = false;
            s.paused = None;
        });
        self.bus.note("login detected: resuming");
        self.advance();
    }
}

/// What the rule that a turn which finished is never run again makes of a
/// run's end where it decides (None: the usual rules do): the outcome, and,
/// when it changes what the classifier said, the stats row's kind and a note.
/// `signalled`: the stop ladder sent claude a signal; `classified_ok`: the
/// classifier called the run a success; `ended`: how claude ended, in words.
fn finished_rule(
    running: Running,
    reported: Reported,
    cause: Option<&Cause>,
    signalled: bool,
    classified_ok: bool,
    ended: &str,
) -> Option<(TurnOutcomeKind, Option<(TurnOutcomeKind, String)>)> {
    let stopped = |note: String| {
        Some((
            TurnOutcomeKind::Stopped,
            Some((TurnOutcomeKind::Stopped, note)),
        ))
    };
    match cause {
        // The turn finished before any stop: whatever came after, it is done.
        _ if running == Running::Turn && reported == Reported::Finished => {
            let note = match cause {
                Some(c) => format!(
                    "success was reported before {}; claude then {ended}",
                    c.what()
                ),
                None => format!("success was reported; claude then {ended}"),
            };
            Some((
                TurnOutcomeKind::Ok,
                (!classified_ok).then_some((TurnOutcomeKind::Ok, note)),
            ))
        }
        // The harness is stopping: the message goes back as it is.
        Some(Cause::Stopping) if signalled || reported == Reported::Stopped => {
            let result = match reported {
                Reported::Stopped => "; its success came after the signal or says it was shut down",
                _ => "",
            };
            stopped(format!("the harness stopped claude{result}; it {ended}"))
        }
        // Shut down from outside, and the CLI says so.
        None if reported == Reported::Stopped => stopped(format!(
            "claude was shut down before its turn finished (interrupted_by_shutdown); it {ended}"
        )),
        _ => None,
    }
}

/// What a run was, as the stats row and the span say it: `turn`,
/// `continue`, `compact` or `checkpoint`.
fn run_kind(running: Running, key: Option<WorkKey>) -> &'static str {
    match running {
        Running::Turn if key == Some(WorkKey::Continue) => "continue",
        Running::Turn => "turn",
        Running::ReactiveCompact | Running::ProactiveCompact | Running::OperatorCompact => {
            "compact"
        }
        Running::ResetCheckpoint | Running::ProactiveCheckpoint => "checkpoint",
    }
}

/// How claude ended, in words for a note: "exited with code 143".
fn ended_words(code: Option<i32>, signal: Option<i32>) -> String {
    match (code, signal) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by signal {s}"),
        (None, None) => "ended".into(),
    }
}

/// `s` as one line of at most `max` characters (controls become spaces).
fn one_line(s: &str, max: usize) -> String {
    let flat: String = s
        .chars()
        .map(|c| if is_control_or_bidi(c) { ' ' } else { c })
        .collect();
    preview(&flat, max.saturating_sub(1))
}

#[cfg(test)]
mod kit;
mod trace;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_that_finished_before_any_stop_completes_and_a_later_success_does_not() {
        use Reported::*;
        let ended = "exited with code 143";
        let causes = [
            None,
            Some(Cause::Interrupt),
            Some(Cause::TimedOut),
            Some(Cause::Hung),
            Some(Cause::Mcp("bash failed".into())),
            Some(Cause::EarlyAuth),
            Some(Cause::Stopping),
        ];
        for cause in &causes {
            let rule = |reported, signalled, ok| {
                finished_rule(
                    Running::Turn,
                    reported,
                    cause.as_ref(),
                    signalled,
                    ok,
                    ended,
                )
            };
            // Finished: done whatever stopped it, and the row says why.
            let (o, said) = rule(Finished, cause.is_some(), false).unwrap();
            assert_eq!(o, TurnOutcomeKind::Ok, "{cause:?}");
            let (kind, note) = said.unwrap();
            assert_eq!(kind, TurnOutcomeKind::Ok);
            let want = match cause {
                Some(c) => format!(
                    "success was reported before {}; claude then {ended}",
                    c.what()
                ),
                None => format!("success was reported; claude then {ended}"),
            };
            assert_eq!(note, want);
            assert_eq!(
                rule(Finished, false, true),
                Some((TurnOutcomeKind::Ok, None)),
                "the classifier agrees: nothing to say"
            );
            // A success after the signal, or a shutdown: a stop of the
            // harness or from outside is `Stopped`; the other stops keep
            // their own outcome (the loop's usual rules).
            let late = rule(Stopped, cause.is_some(), true);
            match cause {
                None | Some(Cause::Stopping) => {
                    let (o, said) = late.unwrap();
                    assert_eq!(o, TurnOutcomeKind::Stopped, "{cause:?}");
                    assert_eq!(said.unwrap().0, TurnOutcomeKind::Stopped);
                }
                _ => assert_eq!(late, None, "{cause:?}"),
            }
        }
        // A stop of the harness that signalled claude, no result: `Stopped`;
        // one that came after claude had ended by itself: the run's own.
        let stop = Some(&Cause::Stopping);
        let (o, said) = finished_rule(Running::Turn, Nothing, stop, true, false, ended).unwrap();
        assert_eq!(o, TurnOutcomeKind::Stopped);
        assert_eq!(
            said.unwrap().1,
            "the harness stopped claude; it exited with code 143"
        );
        assert_eq!(
            finished_rule(Running::Turn, Nothing, stop, false, false, ended),
            None
        );
        assert_eq!(
            finished_rule(Running::Turn, Nothing, None, false, false, ended),
            None
        );
        // Only a turn finishes its message: a compaction stopped is a stop.
        let (o, _) =
            finished_rule(Running::ReactiveCompact, Finished, stop, true, true, ended).unwrap();
        assert_eq!(o, TurnOutcomeKind::Stopped);
        assert_eq!(
            finished_rule(
                Running::ResetCheckpoint,
                Finished,
                None,
                false,
                false,
                ended
            ),
            None
        );
    }

    #[test]
    fn every_classifier_outcome_maps_to_a_policy_outcome() {
        let cases = [
            (TurnOutcome::ok(), TurnOutcomeKind::Ok),
            (TurnOutcome::compacted(), TurnOutcomeKind::Compacted),
            (
                TurnOutcome::rate_limited(None),
                TurnOutcomeKind::RateLimited,
            ),
            (TurnOutcome::auth_failed(), TurnOutcomeKind::AuthFailed),
            (
                TurnOutcome::prompt_too_long(),
                TurnOutcomeKind::PromptTooLong,
            ),
            (
                TurnOutcome::api_unavailable("x".into()),
                TurnOutcomeKind::ApiUnavailable,
            ),
            (TurnOutcome::aborted("x".into()), TurnOutcomeKind::Aborted),
            (TurnOutcome::failed("x".into()), TurnOutcomeKind::Failed),
            (
                TurnOutcome::not_started("x".into()),
                TurnOutcomeKind::NotStarted,
            ),
            (
                TurnOutcome::cannot_compact("x".into()),
                TurnOutcomeKind::CannotCompact,
            ),
            (TurnOutcome::hung("x".into()), TurnOutcomeKind::Hung),
            (
                TurnOutcome::mcp_not_connected("x".into()),
                TurnOutcomeKind::McpStartFailed,
            ),
        ];
        for (o, want) in cases {
            assert_eq!(o.kind(), want, "{o}");
        }
    }
}
