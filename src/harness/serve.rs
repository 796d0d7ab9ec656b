//! `hive serve`: boot wiring and the turn loop. The loop thread is the only one
//! that changes turn state: it asks the poller for the next message, runs claude
//! for it (with the compaction, login and retry paths of the specification),
//! classifies the outcome, acks or requeues, records stats and goes back to
//! sleep. Every trigger — a message, an operator request, a signal, a timer — is
//! one arm of a `select!`, so an idle harness uses no CPU.

use super::bus::{Bus, LiveEvent, TurnState};
use super::classify::{TurnObserver, TurnOutcome, TurnReport};
use super::context;
use super::control::{Control, Shared};
use super::invocation::{self, ToolLists};
use super::login::{self, DirSnapshot};
use super::poller::{FromPoller, Poller};
use super::prompt::PromptVars;
use super::runner::{self, Invocation};
use super::settings::Settings;
use super::stats::{Stats, TurnRow};
use crate::broker::hub::now;
use crate::wire::{Message, Request, StatusReply};
use crossbeam_channel::{after, select, unbounded, Receiver};
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a piece of the loop ended.
#[derive(Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    /// The harness was told to stop.
    Stop,
}

/// One claude run's result as the loop sees it.
struct Attempt {
    report: TurnReport,
    terminated: bool,
    interrupted: bool,
}

/// What one message is, for the loop: a broker row or the synthetic continue.
struct Work {
    id: Option<i64>,
    from: String,
    body: String,
    redelivered: bool,
    /// The queue depth behind this message, when already known.
    unread: Option<u64>,
}

struct TurnLoop {
    s: Arc<Settings>,
    shared: Shared,
    bus: Bus,
    stats: Option<Stats>,
    tools: ToolLists,
    poller: Poller,
    control: Receiver<Control>,
    term: Receiver<()>,
    pending: VecDeque<Control>,
    next_requested: bool,
    /// Messages whose prompt already reached the session (retry sends a note).
    prompt_seen: HashSet<i64>,
    /// Context windows the CLI reported, by model.
    cli_windows: HashMap<String, u64>,
    last_context: Option<u64>,
    last_turn_end: Option<i64>,
    api_failures: u32,
    /// Turns in a row whose claude could not be started.
    start_failures: u32,
}

/// Runs the harness until SIGTERM.
pub fn run(state_dir: &Path, run_dir: &Path) -> Result<(), String> {
    let term = install_signals()?;
    let s = Arc::new(Settings::resolve(state_dir, run_dir)?);
    for dir in [&s.state_dir, &s.run_dir] {
        super::files::create_private_dir(dir)
            .map_err(|e| format!("cannot create directory {}: {e}", dir.display()))?;
    }
    let tools = invocation::write_boot_files(&s)?;
    let vars = PromptVars::from_env(&s.label);
    let (control_tx, control_rx) = unbounded::<Control>();
    let model = {
        let probe = Shared::new(
            Bus::new(&s.label, &vars.qualified_label, "", 0),
            control_tx.clone(),
            s.clone(),
        );
        probe.model()
    };
    let window = context::context_window_tokens(&model, None, context::process_env_pairs());
    let bus = Bus::new(&s.label, &vars.qualified_label, &model, window);
    let shared = Shared::new(bus.clone(), control_tx, s.clone());
    let stats = match Stats::open(&s.stats_db()) {
        Ok(st) => Some(st),
        Err(e) => {
            log::error!("{e}; turns will not be recorded");
            None
        }
    };
    let (last_context, last_turn_end) = stats
        .as_ref()
        .and_then(Stats::last)
        .map(|r| {
            (
                r.context_tokens,
                Some(r.started_at + (r.duration_ms / 1000) as i64),
            )
        })
        .unwrap_or((None, None));
    if let Ok(text) = std::fs::read_to_string(s.status_file()) {
        bus.update(|st| st.status_text = text.trim().to_string());
    }
    bus.update(|st| st.context_tokens = last_context);
    log::info!(
        "hive serve {} ({}): state {}, socket {}, claude {}",
        s.label,
        crate::broker::HYPERHIVE_REV,
        s.state_dir.display(),
        s.socket.display(),
        s.claude_bin
    );
    // The bash-task daemon runs inside the harness: tasks outlive turns, and a
    // finished task wakes the agent through the broker.
    let bash = match crate::bash::start(crate::bash::DaemonSettings::from_env(s.state_dir.clone()))
    {
        Ok(h) => Some(h),
        Err(e) => {
            log::error!("the bash-task daemon did not start: {e}");
            bus.note(format!(
                "the bash-task daemon did not start: {e}; mcp__bash__run will fail"
            ));
            None
        }
    };
    let web =
        crate::web::WebConfig::from_env().and_then(|cfg| crate::web::start(shared.clone(), cfg))?;
    let _forge = super::forge::ForgeSettings::from_env(&s.state_dir, &s.socket, &s.label)
        .map(super::forge::start)?;
    let poller = Poller::start(
        s.socket.clone(),
        s.poll_wait_secs,
        s.reconnect_max,
        bus.clone(),
    );
    let mut lp = TurnLoop {
        s,
        shared,
        bus,
        stats,
        tools,
        poller,
        control: control_rx,
        term,
        pending: VecDeque::new(),
        next_requested: false,
        prompt_seen: HashSet::new(),
        cli_windows: HashMap::new(),
        last_context,
        last_turn_end,
        api_failures: 0,
        start_failures: 0,
    };
    lp.boot();
    let flow = lp.serve();
    lp.poller.shutdown();
    // Running tasks are killed and marked interrupted; their wakes are sent.
    if let Some(b) = bash {
        b.shutdown();
    }
    drop(web);
    log::info!("hive serve stopped ({flow:?})");
    Ok(())
}

/// SIGTERM/SIGINT/SIGHUP close the returned channel, which every `select!` of the
/// harness watches (a closed channel stays ready, so no one can miss it); a
/// second signal exits at once.
fn install_signals() -> Result<Receiver<()>, String> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let (tx, rx) = unbounded::<()>();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut tx = Some(tx);
            for sig in signals.forever() {
                if tx.take().is_none() {
                    log::warn!("second signal {sig}: exiting at once");
                    std::process::exit(128 + sig);
                }
                log::info!("signal {sig}: finishing up (send it again to exit at once)");
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(rx)
}

impl TurnLoop {
    fn boot(&mut self) {
        let kick = self.poller.call(
            Request::Kick {
                hyperhive_rev: Some(crate::broker::HYPERHIVE_REV.into()),
            },
            &self.term,
        );
        if let Err(e) = kick {
            log::warn!("kick refused: {e}");
        }
        let failures = super::plugins::install(&self.s, &self.bus);
        for f in failures {
            self.to_parent(&format!("[system] {} plugin install: {f}", self.s.label));
        }
    }

    fn serve(&mut self) -> Flow {
        let must_park =
            self.s.needs_login_sentinel().exists() || !login::credentials_available(&self.s);
        if must_park && self.wait_for_login() == Flow::Stop {
            return Flow::Stop;
        }
        loop {
            while let Some(c) = self.pending.pop_front() {
                if self.handle_control(c) == Flow::Stop {
                    return Flow::Stop;
                }
            }
            if !self.next_requested {
                self.poller.request_next();
                self.next_requested = true;
            }
            self.bus.set_turn_state(TurnState::Idle);
            let flow = select! {
                recv(self.poller.events) -> ev => match ev {
                    Ok(FromPoller::Message { message, redelivered, unread }) => {
                        self.next_requested = false;
                        self.handle_message(message, redelivered, unread)
                    }
                    Err(_) => Flow::Stop,
                },
                recv(self.control) -> c => match c {
                    Ok(c) => self.handle_control(c),
                    Err(_) => Flow::Continue,
                },
                recv(self.term) -> _ => Flow::Stop,
            };
            if flow == Flow::Stop {
                return Flow::Stop;
            }
        }
    }

    fn handle_control(&mut self, c: Control) -> Flow {
        match c {
            Control::Compact => {
                let (outcome, stop) = self.compact("operator request");
                if !outcome.is_ok() {
                    self.bus.note("compaction requested by the operator failed");
                }
                if stop {
                    return Flow::Stop;
                }
            }
            Control::Interrupt => self.bus.note("nothing to interrupt: no turn is running"),
            Control::LoginStored => {}
        }
        Flow::Continue
    }

    fn status(&self) -> StatusReply {
        self.poller
            .call(Request::Status {}, &self.term)
            .ok()
            .and_then(|m| serde_json::from_value(serde_json::Value::Object(m)).ok())
            .unwrap_or(StatusReply {
                unread: 0,
                inflight: None,
            })
    }

    fn to_parent(&self, body: &str) {
        if let Err(e) = self
            .poller
            .call(Request::SendToParent { body: body.into() }, &self.term)
        {
            log::error!("cannot tell the parent ({e}): {body}");
        }
    }

    fn handle_message(&mut self, m: Message, redelivered: bool, unread: Option<u64>) -> Flow {
        let work = Work {
            id: Some(m.id),
            from: m.from,
            body: m.body,
            redelivered,
            unread,
        };
        let mut flow = self.turn(work);
        // Self-continue: requested, not auth-failed, and nothing real waiting.
        while flow == Flow::Continue && self.take_continue() {
            let st = self.status();
            if st.unread > 0 || st.inflight.is_some() {
                self.bus
                    .note("continue requested, but messages are waiting: they drive the next turn");
                break;
            }
            flow = self.turn(Work {
                id: None,
                from: "self".into(),
                body: "continue".into(),
                redelivered: false,
                unread: Some(0),
            });
        }
        flow
    }

    /// Consumes the `hyperhive-continue` sentinel; true when it was there.
    fn take_continue(&self) -> bool {
        let p = self.s.continue_sentinel();
        p.exists() && std::fs::remove_file(&p).is_ok()
    }

    fn model(&self) -> String {
        self.shared.model()
    }

    fn window(&self, model: &str) -> u64 {
        context::context_window_tokens(
            model,
            self.cli_windows.get(model).copied(),
            context::process_env_pairs(),
        )
    }

    fn invocation(&self, prompt: &str, model: &str, resume: bool) -> Invocation {
        let mut env = vec![(
            "CLAUDE_CODE_MAX_RETRIES".to_string(),
            self.s.claude_max_retries.to_string(),
        )];
        env.extend(login::token_env(&self.s));
        Invocation {
            bin: self.s.claude_bin.clone(),
            args: invocation::claude_args(&self.s, &self.tools, model, resume),
            stdin: prompt.to_string(),
            env,
            cwd: self.s.state_dir.clone(),
            timeout: self.s.turn_timeout,
            grace: self.s.kill_grace,
        }
    }

    /// Runs one claude process and records it.
    fn attempt(
        &mut self,
        prompt: &str,
        kind: &str,
        work: &Work,
        observer: TurnObserver,
        resume: bool,
    ) -> Attempt {
        let model = self.model();
        let started = now();
        let inv = self.invocation(prompt, &model, resume);
        let r = runner::run(&inv, observer, &self.bus, &self.control, &self.term);
        self.pending.extend(r.deferred);
        if let TurnOutcome::NotStarted(_) = r.report.outcome {
            // Nothing ran: no stats row, and `finish` keeps the message.
            return Attempt {
                report: r.report,
                terminated: false,
                interrupted: false,
            };
        }
        if self.start_failures > 0 {
            log::info!(
                "claude starts again after {} failed starts",
                self.start_failures
            );
            self.bus.note("claude starts again");
            self.start_failures = 0;
        }
        let rep = &r.report;
        if let (Some(m), Some(w)) = (&rep.model, rep.context_window) {
            self.cli_windows.insert(m.clone(), w);
        }
        if let Some(ctx) = rep.context_tokens {
            self.last_context = Some(ctx);
        }
        let window = self.window(&model);
        self.bus.update(|s| {
            s.model = model.clone();
            s.context_window_tokens = window;
            s.context_tokens = rep.context_tokens.or(s.context_tokens);
            if rep.session_id.is_some() {
                s.session_id = rep.session_id.clone();
            }
        });
        if let Some(stats) = &self.stats {
            let row = TurnRow {
                id: 0,
                started_at: started,
                duration_ms: r.elapsed.as_millis() as u64,
                kind: kind.into(),
                outcome: rep.outcome.to_string(),
                model,
                sender: work.from.clone(),
                message_id: work.id,
                context_tokens: rep.context_tokens,
                tokens_in: rep.input_tokens,
                tokens_out: rep.output_tokens,
                cost_usd: rep.cost_usd.unwrap_or(0.0),
                session_id: rep.session_id.clone(),
                note: if r.interrupted {
                    "interrupted by the operator".into()
                } else {
                    String::new()
                },
            };
            if let Err(e) = stats.record(&row) {
                log::error!("{e}");
            }
        }
        Attempt {
            report: r.report,
            terminated: r.terminated,
            interrupted: r.interrupted,
        }
    }

    /// Runs `/compact` on the session; (its outcome, harness stopping).
    fn compact(&mut self, why: &str) -> (TurnOutcome, bool) {
        self.bus.set_turn_state(TurnState::Compacting);
        self.bus.note(format!("compacting the session ({why})"));
        let work = Work {
            id: None,
            from: "harness".into(),
            body: "/compact".into(),
            redelivered: false,
            unread: None,
        };
        let a = self.attempt(
            "/compact",
            "compact",
            &work,
            TurnObserver::compaction(),
            true,
        );
        let ok = a.report.outcome.is_ok();
        let detail = match &a.report.compact {
            Some(c) => format!(
                "{} → {} tokens",
                c.pre_tokens.map_or("?".into(), |t| t.to_string()),
                c.post_tokens.map_or("?".into(), |t| t.to_string())
            ),
            None => a.report.outcome.to_string(),
        };
        self.bus.note(format!(
            "compaction {}: {detail}",
            if ok { "done" } else { "failed" }
        ));
        self.bus.set_turn_state(TurnState::Thinking);
        (a.report.outcome, a.terminated)
    }

    /// A best-effort notes turn before compaction or a session reset.
    fn checkpoint(&mut self, prompt: &str, why: &str) -> bool {
        self.bus.note(format!("checkpoint turn: {why}"));
        let work = Work {
            id: None,
            from: "harness".into(),
            body: prompt.into(),
            redelivered: false,
            unread: None,
        };
        let a = self.attempt(prompt, "checkpoint", &work, TurnObserver::new(), true);
        if !a.report.outcome.is_ok() {
            self.bus.note(format!(
                "checkpoint turn failed ({}); going on",
                a.report.outcome
            ));
        }
        a.terminated
    }

    /// One message, start to finish.
    fn turn(&mut self, work: Work) -> Flow {
        let started = Instant::now();
        let unread = match work.unread {
            Some(n) => n,
            None => self.status().unread,
        };
        self.bus.update(|s| {
            s.unread = unread;
            s.inflight = work.id;
        });
        self.bus.emit(LiveEvent::TurnStart {
            from: work.from.clone(),
            body: work.body.clone(),
            unread,
            message_id: work.id,
        });
        self.bus.set_turn_state(TurnState::Thinking);

        // Auto session-reset: a big context and a cold cache make a fresh session
        // cheaper than resuming.
        let model = self.model();
        let window = self.window(&model);
        let env = |k: &str| context::process_env(k);
        let mut resume = !self.shared.take_skip_continue();
        let since = self
            .last_turn_end
            .map(|t| Duration::from_secs((now() - t).max(0) as u64))
            .unwrap_or_default();
        if resume
            && context::needs_auto_reset(
                self.last_context,
                context::auto_reset_watermark(window, &env),
                since,
                context::cache_ttl(&env),
            )
        {
            if self.checkpoint(
                context::AUTO_RESET_CHECKPOINT_PROMPT,
                "the cache is cold; resetting the session",
            ) {
                return self.stop_with(&work);
            }
            resume = false;
            self.last_context = None;
        }

        let seen = work.id.is_some_and(|id| self.prompt_seen.contains(&id));
        if work.redelivered {
            self.bus
                .note("this message was inflight when the harness last stopped; handling it again");
        }
        let prompt = if seen {
            context::retry_note(&work.from)
        } else {
            context::wake_prompt(&work.from, &work.body, unread)
        };
        let mut a = self.attempt(&prompt, "turn", &work, TurnObserver::new(), resume);
        if a.terminated {
            return self.stop_with(&work);
        }
        match a.report.outcome {
            TurnOutcome::PromptTooLong => {
                self.bus
                    .note("the session is past its context window: compacting, then retrying once");
                let (compacted, stop) = self.compact("prompt too long");
                if stop {
                    return self.stop_with(&work);
                }
                if compacted.is_ok() {
                    let full = context::wake_prompt(&work.from, &work.body, unread);
                    a = self.attempt(&full, "turn", &work, TurnObserver::new(), true);
                } else if let TurnOutcome::NotStarted(_) = compacted {
                    // The message is not at fault when claude cannot start.
                    a.report.outcome = compacted;
                }
            }
            TurnOutcome::AuthFailed => {
                self.bus
                    .note("authentication failed: retrying once at once");
                let retry = if a.report.prompt_reached_session {
                    context::retry_note(&work.from)
                } else {
                    prompt.clone()
                };
                a = self.attempt(&retry, "turn", &work, TurnObserver::new(), resume);
            }
            _ => {}
        }
        if a.terminated {
            return self.stop_with(&work);
        }
        if a.report.prompt_reached_session {
            if let Some(id) = work.id {
                self.prompt_seen.insert(id);
            }
        }
        if !matches!(a.report.outcome, TurnOutcome::NotStarted(_)) {
            self.last_turn_end = Some(now());
        }
        self.finish(work, a, started)
    }

    /// The harness is stopping mid-turn: the message goes back to the inbox.
    fn stop_with(&mut self, work: &Work) -> Flow {
        if let Some(id) = work.id {
            self.requeue(id);
        }
        self.bus.emit(LiveEvent::TurnEnd {
            ok: false,
            note: "the harness is stopping; the message was requeued".into(),
            outcome: "stopped".into(),
            duration_ms: 0,
        });
        Flow::Stop
    }

    fn ack(&self, id: i64) {
        if let Err(e) = self.poller.call(Request::AckTurn { id }, &self.term) {
            log::error!("ack of message {id} refused: {e}");
            self.bus.note(format!("ack of message {id} refused: {e}"));
        }
    }

    fn requeue(&self, id: i64) {
        // The poller's connection first: it needs no new descriptor, which
        // matters when requeueing because the process ran out of them. At
        // shutdown the poller may be parked or gone; a fresh connection works
        // then, and a broker restart requeues inflight rows by itself.
        let req = Request::RequeueInflight { id };
        let stopping = matches!(
            self.term.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        );
        match self.poller.call(req.clone(), &self.term) {
            Ok(_) => return,
            Err(e) if !stopping => {
                log::warn!("requeue of message {id} failed: {e}");
                return;
            }
            Err(_) => {}
        }
        let r = crate::wire::Client::connect(&self.s.socket).and_then(|mut c| c.call(&req));
        if let Err(e) = r {
            log::warn!("requeue of message {id} failed: {e}");
        }
    }

    /// Sleeps, but wakes for a stop signal; operator requests wait until after.
    fn pause(&mut self, d: Duration) -> Flow {
        let timer = after(d);
        loop {
            select! {
                recv(timer) -> _ => return Flow::Continue,
                recv(self.term) -> _ => return Flow::Stop,
                recv(self.control) -> c => match c {
                    Ok(Control::LoginStored) | Err(_) => {}
                    Ok(c) => self.pending.push_back(c),
                },
            }
        }
    }

    /// Acts on the outcome as the specification's table says.
    fn finish(&mut self, work: Work, a: Attempt, started: Instant) -> Flow {
        let rep = a.report;
        let outcome = if a.interrupted && !rep.outcome.is_ok() {
            TurnOutcome::Interrupted("interrupted by the operator".into())
        } else {
            rep.outcome.clone()
        };
        let ok = outcome.is_ok();
        // Counters are not worth waiting for; the poller keeps them in order. A
        // claude that never started ran no turn. The classifier has already
        // dropped figures that are not finite, negative or absurd.
        if !matches!(outcome, TurnOutcome::NotStarted(_)) {
            self.poller.tell(Request::PostTurnCounts {
                turns: 1,
                ok: u64::from(ok),
                failed: u64::from(!ok),
                tokens_in: rep.input_tokens,
                tokens_out: rep.output_tokens,
                cost_usd: rep.cost_usd.unwrap_or(0.0),
            });
        }
        let what = match work.id {
            Some(id) => format!("message #{id} from {}", work.from),
            None => format!("the {} turn", work.from),
        };
        let mut flow = Flow::Continue;
        let note = match &outcome {
            TurnOutcome::Ok | TurnOutcome::Compacted => {
                if let Some(id) = work.id {
                    self.ack(id);
                }
                self.api_failures = 0;
                String::new()
            }
            TurnOutcome::Interrupted(why) => {
                if let Some(id) = work.id {
                    self.ack(id);
                }
                format!("{what} was interrupted ({why}); it will not be retried")
            }
            TurnOutcome::RateLimited { resets_at } => {
                let t = now();
                let sleep = match resets_at {
                    Some(at) if *at > t => Duration::from_secs((*at - t) as u64),
                    _ => self.s.rate_limit_sleep,
                }
                .min(self.s.rate_limit_max_sleep);
                let until = t + sleep.as_secs() as i64;
                if let Some(id) = work.id {
                    self.requeue(id);
                }
                self.bus.update(|s| {
                    s.rate_limited = true;
                    s.rate_limited_until = Some(until);
                });
                self.emit_end(
                    false,
                    format!(
                        "rate limited: {what} requeued; resuming in {}s",
                        sleep.as_secs()
                    ),
                    &outcome,
                    started,
                );
                flow = self.pause(sleep);
                self.bus.update(|s| {
                    s.rate_limited = false;
                    s.rate_limited_until = None;
                });
                return flow;
            }
            TurnOutcome::ApiUnavailable(why) => {
                self.api_failures += 1;
                if let Some(id) = work.id {
                    self.requeue(id);
                }
                let n = self.api_failures;
                let backoff = (self.s.api_backoff_base
                    * 2u32.saturating_pow(n.saturating_sub(1).min(16)))
                .min(self.s.api_backoff_max);
                if n == self.s.api_failures_before_notice {
                    self.to_parent(&format!(
                        "[system] {}: the Claude API has been unavailable for {n} turns in a row ({why}); {what} is kept and retried every {}s at most",
                        self.s.label,
                        self.s.api_backoff_max.as_secs()
                    ));
                }
                self.emit_end(
                    false,
                    format!(
                        "API unavailable ({why}): {what} requeued; retrying in {}s",
                        backoff.as_secs()
                    ),
                    &outcome,
                    started,
                );
                return self.pause(backoff);
            }
            TurnOutcome::AuthFailed => {
                if let Some(id) = work.id {
                    self.requeue(id);
                }
                self.emit_end(false, format!("authentication failed twice: {what} requeued until claude is logged in again"), &outcome, started);
                return self.wait_for_login();
            }
            TurnOutcome::NotStarted(why) => {
                if let Some(id) = work.id {
                    self.requeue(id);
                }
                self.start_failures += 1;
                let n = self.start_failures;
                let max = self.s.start_backoff_max;
                let backoff =
                    (self.s.fail_pause * 2u32.saturating_pow(n.saturating_sub(1).min(16))).min(max);
                // One log line and one parent notice per burst of failures.
                if n == 1 {
                    log::error!(
                        "claude could not be started: {why}; {what} requeued, retrying with a backoff up to {max:?}"
                    );
                    self.to_parent(&format!(
                        "[system] {}: claude could not be started ({why}); {what} is kept and retried every {max:?} at most",
                        self.s.label
                    ));
                } else {
                    log::debug!("claude could not be started ({n} in a row): {why}");
                }
                self.emit_end(
                    false,
                    format!(
                        "claude could not be started: {what} requeued; retrying in {backoff:?}"
                    ),
                    &outcome,
                    started,
                );
                return self.pause(backoff);
            }
            TurnOutcome::PromptTooLong | TurnOutcome::Failed(_) => {
                if let Some(id) = work.id {
                    self.ack(id);
                }
                let why = outcome.to_string();
                self.to_parent(&format!(
                    "[system] {}: the turn for {what} failed and will not be retried: {why}",
                    self.s.label
                ));
                flow = self.pause(self.s.fail_pause);
                format!("{what} failed: {why}")
            }
        };
        self.bus
            .update(|s| s.last_outcome = Some(outcome.to_string()));
        self.emit_end(ok, note, &outcome, started);
        if flow == Flow::Stop {
            return flow;
        }
        if ok {
            return self.maybe_compact(&rep);
        }
        flow
    }

    fn emit_end(&self, ok: bool, note: String, outcome: &TurnOutcome, started: Instant) {
        self.bus.update(|s| {
            s.last_outcome = Some(outcome.to_string());
            s.inflight = None;
        });
        self.bus.emit(LiveEvent::TurnEnd {
            ok,
            note,
            outcome: outcome.to_string(),
            duration_ms: started.elapsed().as_millis() as u64,
        });
    }

    /// Proactive compaction after a clean turn at or past the watermark.
    fn maybe_compact(&mut self, rep: &TurnReport) -> Flow {
        let model = self.model();
        let window = self.window(&model);
        let env = |k: &str| context::process_env(k);
        let wm = context::compact_watermark(window, &env);
        if !context::needs_proactive_compact(rep.context_tokens, wm) {
            return Flow::Continue;
        }
        self.bus.set_turn_state(TurnState::Thinking);
        if self.checkpoint(context::CHECKPOINT_PROMPT, "context is filling up") {
            return Flow::Stop;
        }
        let (_, stop) = self.compact("context watermark reached");
        if stop {
            Flow::Stop
        } else {
            Flow::Continue
        }
    }

    /// Parks until the claude config dir changes or the operator stores a token.
    fn wait_for_login(&mut self) -> Flow {
        let sentinel = self.s.needs_login_sentinel();
        if let Err(e) = super::files::write_private(&sentinel, format!("{}\n", now()).as_bytes()) {
            log::error!("cannot write {}: {e}", sentinel.display());
        }
        self.bus.set_turn_state(TurnState::Idle);
        self.bus.update(|s| s.needs_login = true);
        self.bus.note(format!(
            "claude needs a login: log in (claude /login with CLAUDE_CONFIG_DIR={}) or store a token on this page",
            self.s.claude_config_dir.display()
        ));
        let snap = DirSnapshot::take(&self.s.claude_config_dir);
        let flow = loop {
            let tick = after(self.s.login_poll);
            select! {
                recv(self.term) -> _ => break Flow::Stop,
                recv(self.control) -> c => match c {
                    Ok(Control::LoginStored) => break Flow::Continue,
                    Ok(Control::Interrupt) | Err(_) => {}
                    Ok(c) => self.pending.push_back(c),
                },
                recv(tick) -> _ => {
                    if DirSnapshot::take(&self.s.claude_config_dir).advanced_from(&snap) {
                        break Flow::Continue;
                    }
                }
            }
        };
        if flow == Flow::Continue {
            let _ = std::fs::remove_file(&sentinel);
            self.bus.update(|s| s.needs_login = false);
            self.bus.note("login detected: resuming");
        }
        flow
    }
}
