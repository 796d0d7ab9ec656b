//! The log's one writer. [`open`] opens (or creates, 0600) `STATE/history.db`
//! through its migrations; the `history-writer` thread owns the read-write
//! connection and runs only while it has work (a [`crate::demand::Slot`]
//! keeps the log between its threads: an event offered starts it, and it
//! ends [`IDLE`] after its last write); the event bus holds the [`Tap`] and
//! offers it each event with the id the live stream gives it. Offering never blocks: the
//! queue is bounded ([`QUEUE`]), an event that does not fit is dropped and
//! counted, and the writer records one `history gap: N events` row where the
//! events are missing. A write that fails (a full disk, a read-only file) is
//! a warning once per burst, never an error of the turn: the events of that
//! batch become a gap row once writing works again.
//!
//! The writer groups events into turns: a `turn_start` opens one, its
//! `turn_end` closes it, and events between turns (the harness's notes, a
//! checkpoint turn, a compaction) go into a `harness` turn of their own. It
//! sums the cost and tokens of the turn's `result` lines, keeps each event's
//! JSON with long strings cut ([`super::CUT_BYTES`]), indexes the words worth
//! searching, and prunes the oldest turns by size and age ([`Bounds`]) — at
//! start, when it writes an hour or more after the last prune, and whenever
//! enough was written — never the turn that is still open.
//!
//! Ids: the live stream's ids continue across restarts from the log's
//! `last_event_id`, so a browser's `Last-Event-ID` keeps working. A writer
//! that did not stop cleanly (a `kill -9`) may have handed out ids it never
//! stored, so the next start skips [`RESTART_SKIP`] ids ahead and no id means
//! two events.

use super::schema;
pub use super::text::View;
use super::text::{cut_strings, searchable, usage};
use super::{Bounds, FILE};
use crate::demand::Slot;
use crate::proto::now;
use crossbeam_channel::{after, at, bounded, never, select, Receiver, Sender, TrySendError};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// Events that may wait for the writer; one more is dropped (and counted).
pub const QUEUE: usize = 4096;

/// How far the ids skip after a writer that did not stop cleanly.
pub const RESTART_SKIP: u64 = 1 << 20;

/// Events one transaction writes at most.
const BATCH: usize = 512;

/// How long the first event of a batch waits for the rest of its turn before
/// the batch is written anyway (a crash loses at most this much of a turn
/// still running; the live stream is not delayed).
const LINGER: Duration = Duration::from_millis(100);

/// How often the age bound is applied, at most (when something is written).
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// How long the writer's thread waits for more events after a write before
/// it ends (the next event starts another).
const IDLE: Duration = Duration::from_secs(2);

/// The writer thread's stack: sqlite, and the JSON of an event (built by
/// the harness from claude's lines, parsed with serde_json's recursion
/// limit) which it walks to cut long strings and pick searchable words. A
/// test writes an event nested to that limit on a thread of this size.
pub const STACK: usize = 512 * 1024;

/// What the log needs of an event of the live stream; the harness's event
/// type implements it, so the log keeps the JSON the live stream sends.
pub trait Loggable: Send + 'static {
    /// The event's fields the log groups turns by; None for an event the log
    /// does not keep.
    fn view(&self) -> Option<View<'_>>;
    /// The event as the live stream sends it, without its id.
    fn to_json(&self) -> Value;
}

/// What the tap hands the writer.
enum Msg<E> {
    Event {
        id: u64,
        event: E,
        /// Events dropped since the last one the queue took.
        dropped_before: u64,
    },
    /// The harness stops: the newest id it gave and the events dropped at
    /// the end; the writer finishes, marks the log clean and drops `done`.
    Stop {
        last_id: u64,
        dropped: u64,
        done: Sender<()>,
    },
}

/// The bus's end of the writer's queue.
pub struct Tap<E> {
    tx: Sender<Msg<E>>,
    /// The writer's end, for the thread a message starts.
    rx: Receiver<Msg<E>>,
    slot: Slot<Log>,
    dropped: u64,
    /// The newest message turn committed (the writer's [`State`]'s).
    told: Told,
}

impl<E: Loggable> Tap<E> {
    /// The id of the turn of message `message_id`, once the writer has
    /// committed it (issue 43: the harness's ack names it). None while the
    /// turn is not written yet, or when a later message's turn was.
    pub fn turn_of(&self, message_id: i64) -> Option<i64> {
        let told = *self.told.lock().unwrap_or_else(|p| p.into_inner());
        told.filter(|(m, _)| *m == message_id).map(|(_, t)| t)
    }

    /// Queues an event without waiting: when the queue is full it is dropped,
    /// and the writer learns how many with the next one that fits.
    pub fn offer(&mut self, id: u64, event: E) {
        let msg = Msg::Event {
            id,
            event,
            dropped_before: self.dropped,
        };
        match self.tx.try_send(msg) {
            Ok(()) => {
                self.dropped = 0;
                self.wake();
            }
            Err(TrySendError::Full(_)) => self.dropped += 1,
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Starts the writer's thread unless it runs; one that cannot start
    /// leaves the queue to the next offer.
    fn wake(&self) -> bool {
        let rx = self.rx.clone();
        match self
            .slot
            .wake("history-writer", STACK, move |log, slot| run(log, rx, slot))
        {
            Ok(running) => running,
            Err(e) => {
                log::warn!("history: cannot start the writer thread: {e}");
                false
            }
        }
    }
}

/// The handle that stops the writer ([`Writer::finish`]).
pub struct Writer {
    _private: (),
}

impl Writer {
    /// Stops the writer once it wrote everything queued: `last_id` is the
    /// newest id the live stream gave. Waits at most a few seconds (a writer
    /// stuck on a dead disk is left behind, and the next start skips ahead).
    pub fn finish<E: Loggable>(self, tap: Tap<E>, last_id: u64) {
        let (done_tx, done) = bounded::<()>(0);
        let stop = Msg::Stop {
            last_id,
            dropped: tap.dropped,
            done: done_tx,
        };
        if tap.tx.send_timeout(stop, Duration::from_secs(5)).is_err() {
            log::warn!("history: the writer did not take the stop in 5 s; leaving it");
            return;
        }
        if !tap.wake() {
            return;
        }
        drop(tap);
        if let Err(crossbeam_channel::RecvTimeoutError::Timeout) =
            done.recv_timeout(Duration::from_secs(10))
        {
            log::warn!("history: the writer did not finish in 10 s; leaving it");
        }
    }
}

/// An opened log: the tap for the bus, the writer, and the id the live
/// stream goes on from.
pub struct Opened<E> {
    pub tap: Tap<E>,
    pub writer: Writer,
    pub next_id: u64,
}

fn meta(db: &Connection, key: &str) -> rusqlite::Result<u64> {
    db.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| {
        r.get::<_, i64>(0)
    })
    .optional()
    .map(|v| v.unwrap_or(0).max(0) as u64)
}

/// Opens the log in `state_dir` and starts its writer. An error says why the
/// log cannot be kept (the harness runs on without it).
pub fn open<E: Loggable>(state_dir: &Path, bounds: Bounds) -> Result<Opened<E>, String> {
    let path = state_dir.join(FILE);
    let fail = |e: String| format!("cannot open the history {}: {e}", path.display());
    // sqlite gives its `-wal` and `-shm` files the same mode.
    crate::sys::fs::ensure_private_file(&path).map_err(|e| fail(e.to_string()))?;
    let mut db = Connection::open_with_flags(
        &path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| fail(e.to_string()))?;
    let setup = |db: &Connection| -> rusqlite::Result<()> {
        db.busy_timeout(Duration::from_secs(2))?;
        if crate::proto::schema::version(db)? == 0 {
            // Only before the first table: lets pruning give pages back.
            db.execute_batch("PRAGMA auto_vacuum = INCREMENTAL;")?;
        }
        db.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")
    };
    setup(&db).map_err(|e| fail(e.to_string()))?;
    schema::migrate(&mut db).map_err(fail)?;
    let start = |db: &Connection| -> rusqlite::Result<u64> {
        let last = meta(db, "last_event_id")?;
        let clean = meta(db, "clean")? == 1;
        let next = last + 1 + if clean { 0 } else { RESTART_SKIP };
        // Reserved before any is handed out: a kill before the first write
        // still makes the next start skip past this run's ids.
        db.execute(
            "UPDATE meta SET value = ?1 WHERE key = 'last_event_id'",
            [(next - 1) as i64],
        )?;
        db.execute("UPDATE meta SET value = 0 WHERE key = 'clean'", [])?;
        if !clean {
            log::info!("history: the last writer did not stop cleanly; ids go on from {next}");
        }
        Ok(next)
    };
    let next_id = start(&db).map_err(|e| fail(e.to_string()))?;
    let (tx, rx) = bounded(QUEUE);
    let told = Told::default();
    let mut log = Log {
        db,
        bounds,
        st: State {
            last_id: next_id - 1,
            told: told.clone(),
            ..State::default()
        },
        pruned_at: Instant::now(),
    };
    log.prune();
    Ok(Opened {
        tap: Tap {
            tx,
            rx,
            slot: Slot::new(log),
            dropped: 0,
            told,
        },
        writer: Writer { _private: () },
        next_id,
    })
}

/// The writer's loop: events gather into a batch that is written in one
/// transaction when [`LINGER`] has passed since its first event, when it is
/// full ([`BATCH`]) or at the stop (not at a turn's end: a turn's last events
/// wait out the linger with the rest). One commit per
/// linger rather than one per event — one per turn or fewer, however short
/// the turns — keeps the writer's share of a turn small (it shares the cores
/// with the turn it records). [`IDLE`] after its last write with nothing
/// queued, the thread ends and the log goes back in the slot.
fn run<E: Loggable>(mut log: Log, rx: Receiver<Msg<E>>, slot: Slot<Log>) {
    let mut batch: Vec<(u64, E, u64)> = Vec::new();
    let mut flush_at: Option<Instant> = None;
    loop {
        // While a batch lingers the queue is not watched: the events of the
        // turn gather in it (it holds far more than a turn sends in
        // [`LINGER`]) and are taken at once when the batch is written, so a
        // turn wakes this thread once, not once per event.
        let (events, linger, idle) = match flush_at {
            Some(t) => (never(), at(t), never()),
            None => (rx.clone(), never(), after(IDLE)),
        };
        let mut flush = false;
        let mut stop = None;
        let mut gone = false;
        select! {
            recv(events) -> msg => {
                match msg {
                    Ok(m) => take(m, &mut batch, &mut stop),
                    Err(_) => gone = true,
                }
                if stop.is_none() && !gone && batch.len() < BATCH {
                    flush_at = Some(Instant::now() + LINGER);
                }
                flush = stop.is_some() || batch.len() >= BATCH;
            }
            recv(linger) -> _ => flush = true,
            recv(idle) -> _ => match slot.park(log, || rx.is_empty()) {
                None => return,
                Some(l) => log = l,
            },
        }
        if flush {
            // Everything queued meanwhile joins the batch, written in
            // transactions of at most BATCH events.
            loop {
                while stop.is_none() && batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(m) => take(m, &mut batch, &mut stop),
                        Err(crossbeam_channel::TryRecvError::Empty) => break,
                        Err(crossbeam_channel::TryRecvError::Disconnected) => {
                            gone = true;
                            break;
                        }
                    }
                }
                if !batch.is_empty() {
                    log.write(&batch);
                    batch.clear();
                }
                if stop.is_some() || gone || rx.is_empty() {
                    break;
                }
            }
            flush_at = None;
        }
        if gone {
            // The bus is gone without a stop (a panic): what is gathered is
            // written, the next start skips ahead.
            if !batch.is_empty() {
                log.write(&batch);
            }
            return;
        }
        if let Some((last_id, dropped, done)) = stop {
            log.stop(last_id, dropped);
            drop(log);
            drop(done);
            return;
        }
        if log.st.written >= log.prune_after() || log.pruned_at.elapsed() >= PRUNE_EVERY {
            log.prune();
        }
    }
}

/// The stop: the newest id, the events dropped at the end, and what tells
/// the harness the log is closed.
type Stop = (u64, u64, Sender<()>);

/// Adds one message of the queue to the batch, or notes the stop.
fn take<E>(msg: Msg<E>, batch: &mut Vec<(u64, E, u64)>, stop: &mut Option<Stop>) {
    match msg {
        Msg::Event {
            id,
            event,
            dropped_before,
        } => batch.push((id, event, dropped_before)),
        Msg::Stop {
            last_id,
            dropped,
            done,
        } => *stop = Some((last_id, dropped, done)),
    }
}

/// The turn being written: its row and what is summed over its events.
#[derive(Debug, Clone, Default)]
struct OpenTurn {
    id: i64,
    bytes: u64,
    cost: f64,
    tokens_in: u64,
    tokens_out: u64,
    last_event: u64,
}

/// What the writer keeps between batches.
#[derive(Default)]
struct State {
    open: Option<OpenTurn>,
    /// The newest id seen (written, lost or dropped).
    last_id: u64,
    /// Events of failed batches since the last write that worked, the first
    /// of their ids, and why they failed.
    lost: u64,
    lost_first: u64,
    failing: Option<String>,
    /// Bytes written since the last prune.
    written: u64,
    /// The open turn alone is over the size bound (said once).
    said_oversize: bool,
    /// The newest message turn of the batch being written: (message id,
    /// turn id), told to [`Tap::turn_of`] once the batch is committed.
    opened: Option<(i64, i64)>,
    /// What [`Tap::turn_of`] reads: the newest message turn committed.
    told: Told,
}

/// The newest message turn the writer committed: (message id, turn id).
type Told = std::sync::Arc<std::sync::Mutex<Option<(i64, i64)>>>;

struct Log {
    db: Connection,
    bounds: Bounds,
    st: State,
    /// When the bounds were last applied.
    pruned_at: Instant,
}

impl Log {
    /// Writes a batch in one transaction; a failure loses the batch (kept as
    /// a count for a gap row) and never stops the writer.
    fn write<E: Loggable>(&mut self, batch: &[(u64, E, u64)]) {
        let saved = self.st.open.clone();
        let result = (|| -> rusqlite::Result<()> {
            let tx = self.db.unchecked_transaction()?;
            if self.st.lost > 0 {
                let why = self.st.failing.clone().unwrap_or_default();
                let (first, n) = (self.st.lost_first, self.st.lost);
                self.st.gap(&tx, first, n, &why)?;
            }
            let mut prev = self.st.last_id;
            for (id, event, dropped) in batch {
                if *dropped > 0 {
                    let why = "the log fell behind the live stream";
                    self.st.gap(&tx, prev + 1, *dropped, why)?;
                }
                self.st.put(&tx, *id, event)?;
                prev = *id;
            }
            self.st.flush(&tx, prev)?;
            tx.commit()
        })();
        if let (Ok(()), Some(opened)) = (&result, self.st.opened.take()) {
            *self.st.told.lock().unwrap_or_else(|p| p.into_inner()) = Some(opened);
        }
        let first = batch.first().map_or(0, |b| b.0);
        let last = batch.last().map_or(0, |b| b.0);
        match result {
            Ok(()) => {
                if let Some(why) = self.st.failing.take() {
                    log::info!(
                        "history: writing again; {} events were not kept ({why})",
                        self.st.lost
                    );
                }
                self.st.lost = 0;
            }
            Err(e) => {
                let why = short(&e);
                if self.st.failing.is_none() {
                    log::warn!(
                        "history: cannot write {} events ({why}); turns go on, and the log \
                         records the gap once it can write again",
                        batch.len()
                    );
                } else {
                    log::debug!("history: still cannot write ({why})");
                }
                // A turn opened or closed in the lost batch is not what the
                // next events belong to.
                let bounds = batch.iter().any(|(_, e, _)| {
                    matches!(
                        e.view(),
                        Some(View::TurnStart { .. } | View::TurnEnd { .. })
                    )
                });
                self.st.open = if bounds { None } else { saved };
                if self.st.lost == 0 {
                    self.st.lost_first = first;
                }
                self.st.lost += batch.len() as u64;
                self.st.failing = Some(why);
            }
        }
        self.st.last_id = self.st.last_id.max(last);
    }

    /// The harness stops: records what was dropped at the end, the newest id
    /// and that the log was left cleanly.
    fn stop(&mut self, last_id: u64, dropped: u64) {
        self.st.last_id = self.st.last_id.max(last_id);
        let result = (|| -> rusqlite::Result<()> {
            let tx = self.db.unchecked_transaction()?;
            if self.st.lost > 0 {
                let why = self.st.failing.clone().unwrap_or_default();
                let (first, n) = (self.st.lost_first, self.st.lost);
                self.st.gap(&tx, first, n, &why)?;
            }
            if dropped > 0 {
                let at = self.st.last_id + 1;
                self.st
                    .gap(&tx, at, dropped, "the log fell behind the live stream")?;
                self.st.last_id = at;
            }
            self.st.flush(&tx, self.st.last_id)?;
            tx.execute("UPDATE meta SET value = 1 WHERE key = 'clean'", [])?;
            tx.commit()
        })();
        match result {
            Ok(()) => log::debug!("history: closed at event {}", self.st.last_id),
            Err(e) => log::warn!(
                "history: cannot close the log cleanly ({}); the next start skips ids ahead",
                short(&e)
            ),
        }
    }

    fn prune_after(&self) -> u64 {
        (self.bounds.max_bytes / 64).max(1024 * 1024)
    }

    /// Drops the turns older than the age bound, then the oldest turns until
    /// the file is under the size bound; never the open turn.
    fn prune(&mut self) {
        self.st.written = 0;
        self.pruned_at = Instant::now();
        let keep = self.st.open.as_ref().map_or(0, |o| o.id);
        let mut dropped = 0usize;
        let cutoff = now() - self.bounds.max_age.as_secs() as i64;
        let old = ids(
            &self.db,
            "SELECT id FROM turns WHERE started_at < ?1 AND id != ?2 ORDER BY id",
            params![cutoff, keep],
        );
        match old.and_then(|ids| delete_turns(&self.db, &ids).map(|()| ids.len())) {
            Ok(n) => dropped += n,
            Err(e) => log::debug!("history: cannot prune by age ({})", short(&e)),
        }
        for _ in 0..32 {
            let used = match used_bytes(&self.db) {
                Ok(u) => u,
                Err(e) => {
                    log::debug!("history: cannot read its size ({})", short(&e));
                    break;
                }
            };
            if used <= self.bounds.max_bytes {
                break;
            }
            // Down to 90 %, so a full log is not pruned per event; the stored
            // bytes leave out the indexes, hence the factor.
            let free = used - self.bounds.max_bytes / 10 * 9;
            let chosen = oldest_to_free(&self.db, keep, free / 2 + 1);
            match chosen {
                Ok(ids) if ids.is_empty() => {
                    if !self.st.said_oversize {
                        log::warn!(
                            "history: the turn being written alone is over the size bound; \
                             it is kept until it ends"
                        );
                        self.st.said_oversize = true;
                    }
                    break;
                }
                Ok(ids) => match delete_turns(&self.db, &ids) {
                    Ok(()) => dropped += ids.len(),
                    Err(e) => {
                        log::debug!("history: cannot prune by size ({})", short(&e));
                        break;
                    }
                },
                Err(e) => {
                    log::debug!("history: cannot choose turns to prune ({})", short(&e));
                    break;
                }
            }
        }
        if dropped > 0 {
            self.st.said_oversize = false;
            if let Err(e) = self.db.execute_batch("PRAGMA incremental_vacuum;") {
                log::debug!("history: cannot give pages back ({})", short(&e));
            }
            log::info!(
                "history: pruned the {dropped} oldest turns (bounds: {} MiB, {} days)",
                self.bounds.max_bytes / (1024 * 1024),
                self.bounds.max_age.as_secs() / 86400
            );
        }
    }
}

impl State {
    /// Writes one event: opens a turn for a `turn_start` (or a harness turn
    /// when none is open), stores its JSON and its words, sums its usage, and
    /// closes the turn at its `turn_end`.
    fn put<E: Loggable>(&mut self, db: &Connection, id: u64, event: &E) -> rusqlite::Result<()> {
        let Some(view) = event.view() else {
            return Ok(());
        };
        let at = now();
        if let View::TurnStart {
            from,
            body,
            message_id,
        } = view
        {
            // A turn the harness never ended (stopped meanwhile) stays open-ended.
            self.close(db)?;
            db.prepare_cached("INSERT INTO turns (kind, started_at, sender, body, message_id, first_event, last_event)
                 VALUES ('message', ?1, ?2, ?3, ?4, ?5, ?5)")?.execute(
                params![at, from, body, message_id, id as i64],
            )?;
            self.open = Some(OpenTurn {
                id: db.last_insert_rowid(),
                last_event: id,
                ..OpenTurn::default()
            });
            if let Some(m) = message_id {
                self.opened = Some((m, db.last_insert_rowid()));
            }
        }
        let turn = self.ensure_open(db, id, at)?;
        let mut json = event.to_json();
        if let Value::Object(m) = &mut json {
            m.insert("id".into(), Value::from(id));
            m.insert("at".into(), Value::from(at));
        }
        cut_strings(&mut json);
        let json = json.to_string();
        db.prepare_cached("INSERT INTO events (id, turn, at, json) VALUES (?1, ?2, ?3, ?4)")?
            .execute(params![id as i64, turn, at, json])?;
        let words = searchable(&view);
        if !words.is_empty() {
            db.prepare_cached(
                "INSERT INTO search (rowid, text, turn, at) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![id as i64, words, turn, at])?;
        }
        let bytes = (json.len() + words.len()) as u64;
        self.written += bytes;
        if let Some(o) = self.open.as_mut() {
            o.bytes += bytes;
            o.last_event = id;
            if let View::Stream(v) = view {
                if let Some((cost, tin, tout)) = usage(v) {
                    o.cost += cost;
                    o.tokens_in = o.tokens_in.saturating_add(tin);
                    o.tokens_out = o.tokens_out.saturating_add(tout);
                }
            }
        }
        if let View::TurnEnd {
            ok,
            outcome,
            note,
            duration_ms,
            decision,
        } = view
        {
            db.prepare_cached(
                "UPDATE turns SET ended_at = ?2, ok = ?3, outcome = ?4, note = ?5,
                    duration_ms = ?6, decision = ?7 WHERE id = ?1",
            )?
            .execute(params![
                turn,
                at,
                ok,
                outcome,
                note,
                duration_ms as i64,
                decision
            ])?;
            self.close(db)?;
        }
        Ok(())
    }

    /// The open turn's id, opening a harness turn when none is.
    fn ensure_open(&mut self, db: &Connection, id: u64, at: i64) -> rusqlite::Result<i64> {
        if let Some(o) = &self.open {
            return Ok(o.id);
        }
        db.prepare_cached(
            "INSERT INTO turns (kind, started_at, first_event, last_event)
             VALUES ('harness', ?1, ?2, ?2)",
        )?
        .execute(params![at, id as i64])?;
        let turn = db.last_insert_rowid();
        self.open = Some(OpenTurn {
            id: turn,
            last_event: id,
            ..OpenTurn::default()
        });
        Ok(turn)
    }

    /// One `history gap: N events` row where events are missing.
    fn gap(&mut self, db: &Connection, id: u64, n: u64, why: &str) -> rusqlite::Result<()> {
        let at = now();
        let turn = self.ensure_open(db, id, at)?;
        let text = format!("history gap: {n} events ({why})");
        let json =
            json!({"id": id, "type": "gap", "events": n, "text": text, "at": at}).to_string();
        db.prepare_cached("INSERT INTO events (id, turn, at, json) VALUES (?1, ?2, ?3, ?4)")?
            .execute(params![id as i64, turn, at, json])?;
        if let Some(o) = self.open.as_mut() {
            o.bytes += json.len() as u64;
            o.last_event = o.last_event.max(id);
        }
        Ok(())
    }

    /// Stores the open turn's sums and the newest id.
    fn flush(&mut self, db: &Connection, last_id: u64) -> rusqlite::Result<()> {
        if let Some(o) = &self.open {
            store_sums(db, o)?;
        }
        db.prepare_cached("UPDATE meta SET value = ?1 WHERE key = 'last_event_id' AND value < ?1")?
            .execute([last_id as i64])?;
        Ok(())
    }

    /// Ends the open turn's writing (its sums stored).
    fn close(&mut self, db: &Connection) -> rusqlite::Result<()> {
        if let Some(o) = self.open.take() {
            store_sums(db, &o)?;
        }
        Ok(())
    }
}

fn store_sums(db: &Connection, o: &OpenTurn) -> rusqlite::Result<()> {
    db.prepare_cached(
        "UPDATE turns SET last_event = max(last_event, ?2), bytes = ?3, cost_usd = ?4,
            tokens_in = ?5, tokens_out = ?6 WHERE id = ?1",
    )?
    .execute(params![
        o.id,
        o.last_event as i64,
        o.bytes as i64,
        o.cost,
        o.tokens_in as i64,
        o.tokens_out as i64
    ])?;
    Ok(())
}

/// The ids a query lists.
fn ids(db: &Connection, sql: &str, p: impl rusqlite::Params) -> rusqlite::Result<Vec<i64>> {
    let mut stmt = db.prepare(sql)?;
    let rows = stmt.query_map(p, |r| r.get(0))?;
    rows.collect()
}

/// The oldest turns (not `keep`) whose stored bytes add up to `free`.
fn oldest_to_free(db: &Connection, keep: i64, free: u64) -> rusqlite::Result<Vec<i64>> {
    let mut stmt = db.prepare("SELECT id, bytes FROM turns WHERE id != ?1 ORDER BY id")?;
    let mut rows = stmt.query([keep])?;
    let (mut out, mut sum) = (Vec::new(), 0u64);
    while let Some(r) = rows.next()? {
        if sum >= free {
            break;
        }
        out.push(r.get::<_, i64>(0)?);
        sum += r.get::<_, i64>(1)?.max(0) as u64 + 256;
    }
    Ok(out)
}

/// Deletes turns with their events and their words, in one transaction.
fn delete_turns(db: &Connection, turns: &[i64]) -> rusqlite::Result<()> {
    if turns.is_empty() {
        return Ok(());
    }
    let tx = db.unchecked_transaction()?;
    {
        let mut words = tx
            .prepare("DELETE FROM search WHERE rowid IN (SELECT id FROM events WHERE turn = ?1)")?;
        let mut events = tx.prepare("DELETE FROM events WHERE turn = ?1")?;
        let mut turn = tx.prepare("DELETE FROM turns WHERE id = ?1")?;
        for t in turns {
            words.execute([t])?;
            events.execute([t])?;
            turn.execute([t])?;
        }
    }
    tx.commit()
}

/// Bytes the file's pages in use take.
fn used_bytes(db: &Connection) -> rusqlite::Result<u64> {
    let pragma = |name: &str| -> rusqlite::Result<u64> {
        db.query_row(&format!("PRAGMA {name}"), [], |r| r.get::<_, i64>(0))
            .map(|v| v.max(0) as u64)
    };
    let pages = pragma("page_count")?.saturating_sub(pragma("freelist_count")?);
    Ok(pages * pragma("page_size")?)
}

/// A sqlite error as one short line.
fn short(e: &rusqlite::Error) -> String {
    crate::proto::text::preview(&e.to_string(), 200)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A note, or a turn's start or end.
    enum Ev {
        Start,
        Note(&'static str),
        End,
    }

    impl Loggable for Ev {
        fn view(&self) -> Option<View<'_>> {
            Some(match self {
                Ev::Start => View::TurnStart {
                    from: "operator",
                    body: "hi",
                    message_id: Some(1),
                },
                Ev::Note(t) => View::Note(t),
                Ev::End => View::TurnEnd {
                    ok: true,
                    outcome: "ok",
                    note: "",
                    duration_ms: 1,
                    decision: Some("ack"),
                },
            })
        }
        fn to_json(&self) -> Value {
            json!({"type": "x"})
        }
    }

    fn log() -> Log {
        let mut db = Connection::open_in_memory().unwrap();
        schema::migrate(&mut db).unwrap();
        Log {
            db,
            bounds: Bounds::default(),
            st: State::default(),
            pruned_at: Instant::now(),
        }
    }

    fn events(db: &Connection) -> Vec<(i64, i64, String)> {
        let mut stmt = db
            .prepare("SELECT id, turn, json FROM events ORDER BY id")
            .unwrap();
        let rows = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .unwrap();
        rows.map(Result::unwrap).collect()
    }

    #[test]
    fn a_full_queue_drops_and_counts_without_waiting() {
        let (tx, rx) = bounded(2);
        let mut tap = Tap {
            tx,
            rx: rx.clone(),
            slot: Slot::vacant(),
            dropped: 0,
            told: Told::default(),
        };
        for id in 1..=5 {
            tap.offer(id, Ev::Note("n"));
        }
        assert_eq!(tap.dropped, 3);
        assert_eq!(rx.len(), 2);
        rx.try_recv().unwrap();
        tap.offer(6, Ev::Note("n"));
        assert_eq!(tap.dropped, 0);
        rx.try_recv().unwrap();
        let Ok(Msg::Event {
            id, dropped_before, ..
        }) = rx.try_recv()
        else {
            panic!("no event")
        };
        assert_eq!((id, dropped_before), (6, 3));
    }

    #[test]
    fn dropped_events_become_one_gap_row_in_their_place() {
        let mut l = log();
        l.write(&[
            (1, Ev::Start, 0),
            (5, Ev::Note("after"), 3),
            (6, Ev::End, 0),
        ]);
        let rows = events(&l.db);
        assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2, 5, 6]);
        assert!(rows.iter().all(|r| r.1 == rows[0].1), "one turn: {rows:?}");
        let gap: Value = serde_json::from_str(&rows[1].2).unwrap();
        assert_eq!(gap["type"], "gap");
        assert_eq!(
            gap["text"],
            "history gap: 3 events (the log fell behind the live stream)"
        );
    }

    #[test]
    fn a_failed_write_is_counted_and_becomes_a_gap_when_writing_works_again() {
        let mut l = log();
        l.write(&[(1, Ev::Start, 0)]);
        l.db.execute_batch("PRAGMA query_only = 1;").unwrap();
        l.write(&[(2, Ev::Note("lost"), 0), (3, Ev::Note("lost too"), 0)]);
        assert_eq!(l.st.lost, 2);
        assert!(l.st.failing.is_some());
        l.db.execute_batch("PRAGMA query_only = 0;").unwrap();
        l.write(&[(4, Ev::End, 0)]);
        assert_eq!(l.st.lost, 0);
        let rows = events(&l.db);
        assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), [1, 2, 4]);
        let gap: Value = serde_json::from_str(&rows[1].2).unwrap();
        assert_eq!(gap["events"], 2);
        assert!(gap["text"]
            .as_str()
            .unwrap()
            .starts_with("history gap: 2 events ("));
        let (ended, decision): (Option<i64>, Option<String>) =
            l.db.query_row(
                "SELECT ended_at, decision FROM turns WHERE id = 1",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert!(ended.is_some());
        assert_eq!(decision.as_deref(), Some("ack"));
    }

    #[test]
    fn events_between_turns_go_into_a_harness_turn() {
        let mut l = log();
        l.write(&[
            (1, Ev::Note("boot"), 0),
            (2, Ev::Start, 0),
            (3, Ev::End, 0),
            (4, Ev::Note("checkpoint"), 0),
        ]);
        let kinds: Vec<(i64, String)> = {
            let mut stmt =
                l.db.prepare("SELECT id, kind FROM turns ORDER BY id")
                    .unwrap();
            let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
            rows.map(Result::unwrap).collect()
        };
        assert_eq!(
            kinds,
            [
                (1, "harness".into()),
                (2, "message".into()),
                (3, "harness".into())
            ]
        );
    }

    /// An event whose JSON nests arrays `depth` deep.
    struct Deep(usize);

    impl Loggable for Deep {
        fn view(&self) -> Option<View<'_>> {
            Some(View::Note("deep"))
        }
        fn to_json(&self) -> Value {
            let mut v = json!("x");
            for _ in 0..self.0 {
                v = json!([v]);
            }
            json!({"type": "note", "deep": v})
        }
    }

    /// The writer and the reader each run on a thread of their own small
    /// stack (`STACK`): an event nested to serde_json's recursion limit (and
    /// past it) is written and read back on those very threads, no crash.
    #[test]
    fn an_event_nested_to_the_parsers_limit_is_written_and_read_on_the_small_stacks() {
        let dir = std::env::temp_dir().join(format!(
            "hive-history-deep-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let Opened {
            mut tap,
            writer,
            next_id,
        } = open::<Deep>(&dir, Bounds::default()).unwrap();
        tap.offer(next_id, Deep(120));
        tap.offer(next_id + 1, Deep(300));
        writer.finish(tap, next_id + 1);
        let reader = super::super::Reader::start(&dir).unwrap();
        let page = reader.before(None, 10).unwrap();
        let events: Vec<&Value> = page.turns.iter().flat_map(|t| t.events.iter()).collect();
        assert_eq!(events.len(), 2, "both events were kept: {events:?}");
        // Read back within the limit it parses whole; past it the reader
        // refuses the stored text and shows null.
        assert!(events[0].get("deep").is_some(), "{:?}", events[0]);
        assert_eq!(*events[1], Value::Null);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
