//! The notification sender (issue 43, item 3): one thread that owns a
//! connection of its own to `broker.db` ([`NotifyConn`]) and the
//! destinations of the fleet file's `notify` block, and pushes each event
//! of the outbox (`db/outbox.rs`, written by the hub's transactions) to
//! every destination that takes it. Each destination is one queue: its
//! events go one at a time, in order, so order holds per destination (and
//! so per agent); a failed try waits an exponential backoff (from
//! `HIVE_NOTIFY_BACKOFF_MS`, one second, doubling up to a day) and holds
//! that queue only. An event tried for longer than `notify.give_up_days`
//! is dropped and counted. Progress is written back after each try, so a
//! broker that restarts — or was killed — resumes: each event is sent at
//! least once. The hub never waits for this thread: it only nudges it,
//! or hands it the destinations of a fleet file that `hive reload` read
//! ([`Reconfig`]), whose queues the hub registered first.
//! HTTP is `ureq` with short timeouts. URLs are logged as scheme and host,
//! secrets never.

pub mod dest;
pub mod format;
pub mod sign;

use crate::broker::db::{DestRow, Durability, NotifyConn, NotifyEvent};
use crate::config::notify::NotifySection;
use crossbeam_channel::{after, bounded, never, select, unbounded, Receiver, Sender};
use dest::Destination;
use std::path::Path;
use std::time::Duration;

/// The longest wait between two tries of one event.
pub const MAX_BACKOFF_MS: i64 = 86_400_000;

/// How often the queues are looked at without a nudge: the events the
/// store's triggers write are found this late at most.
const DEFAULT_POLL_MS: u64 = 1000;

/// The settings of the sender.
#[derive(Debug, Clone)]
pub struct Settings {
    pub hive: String,
    pub give_up_days: u32,
    /// The wait after a first failed try (doubling).
    pub backoff: Duration,
    pub poll: Duration,
    /// How long one request may take.
    pub timeout: Duration,
}

impl Settings {
    /// The settings from the fleet file's values and the environment
    /// (`HIVE_NOTIFY_BACKOFF_MS`, `HIVE_NOTIFY_POLL_MS`).
    pub fn read(
        hive: String,
        give_up_days: u32,
        env: &crate::sys::env::Env,
    ) -> Result<Settings, String> {
        let backoff = env.num("HIVE_NOTIFY_BACKOFF_MS", 1000)?;
        let poll = env.num("HIVE_NOTIFY_POLL_MS", DEFAULT_POLL_MS)?;
        if backoff == 0 || poll == 0 {
            return Err("HIVE_NOTIFY_BACKOFF_MS and HIVE_NOTIFY_POLL_MS: at least 1".into());
        }
        Ok(Settings {
            hive,
            give_up_days,
            backoff: Duration::from_millis(backoff),
            poll: Duration::from_millis(poll),
            timeout: Duration::from_secs(10),
        })
    }
}

/// How long dropping the [`Handle`] waits for the thread: a request to a
/// receiver that does not answer is left to end on its own (the thread
/// holds nothing the hub needs; an event it was sending is sent again at
/// the next start).
const STOP_WAIT: Duration = Duration::from_secs(1);

/// The running thread: the hub nudges and reconfigures it through
/// [`Handle::control`]; dropping it stops the thread between two requests,
/// waiting [`STOP_WAIT`] at most.
pub struct Handle {
    stop: Option<Sender<()>>,
    control: Control,
    ended: Receiver<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Handle {
    /// What the hub keeps to reach the thread.
    pub fn control(&self) -> Control {
        self.control.clone()
    }
}

/// The fleet file's `notify` block as a start or `hive reload` read it
/// (files read, names checked), with the hive's name for the titles: the
/// destinations the thread sends to from then on.
pub struct Reconfig {
    pub dests: Vec<Destination>,
    pub hive: String,
    pub give_up_days: u32,
}

impl Reconfig {
    /// The block `section` (none: no destination) of the fleet file in
    /// `base`, for the hive named `hive_name`; a file that cannot be read
    /// is an error naming it.
    pub fn read(
        section: Option<&NotifySection>,
        base: Option<&Path>,
        hive_name: Option<&str>,
    ) -> Result<Reconfig, String> {
        Ok(Reconfig {
            dests: match section {
                Some(n) => dest::destinations(n, base)?,
                None => Vec::new(),
            },
            hive: hive_name.unwrap_or("hive").to_string(),
            give_up_days: section.map_or(
                NotifySection::DEFAULT_GIVE_UP_DAYS,
                NotifySection::give_up_days,
            ),
        })
    }
}

/// The hub's end of the thread: neither call ever waits.
#[derive(Clone)]
pub struct Control {
    nudge: Sender<()>,
    reconfig: Sender<Reconfig>,
}

impl Control {
    /// An event was written: look at the queues now (a full channel means
    /// the thread will anyway).
    pub fn nudge(&self) {
        let _ = self.nudge.try_send(());
    }

    /// Sends to `r`'s destinations from now on: their queues are
    /// registered already ([`rows`]).
    pub fn reconfigure(&self, r: Reconfig) {
        let _ = self.reconfig.send(r);
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            // `ended` disconnects as the thread returns.
            if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) =
                self.ended.recv_timeout(STOP_WAIT)
            {
                let _ = t.join();
            } else {
                log::info!("notify: a request is still out; not waiting for it");
            }
        }
    }
}

/// Registers `dests` as the queues of the store at `path` and starts the
/// sender. Without a destination the queues are cleared and the thread
/// only waits for a [`Reconfig`].
pub fn start(
    path: &Path,
    durability: Durability,
    dests: Vec<Destination>,
    settings: Settings,
) -> Result<Handle, String> {
    let conn = NotifyConn::open(path, durability)?;
    conn.register(&rows(&dests))
        .map_err(|e| format!("cannot register the notify destinations: {e}"))?;
    log_dests(&dests);
    let (stop_tx, stop) = bounded::<()>(0);
    let (nudge, nudged) = bounded::<()>(1);
    let (reconfig, reconfigs) = unbounded::<Reconfig>();
    let (end_tx, ended) = bounded::<()>(0);
    let thread = std::thread::Builder::new()
        .name("notify".into())
        .spawn(move || {
            Worker::new(conn, dests, settings).run(&stop, &nudged, &reconfigs);
            drop(end_tx);
        })
        .map_err(|e| format!("cannot start the notify thread: {e}"))?;
    Ok(Handle {
        stop: Some(stop_tx),
        control: Control { nudge, reconfig },
        ended,
        thread: Some(thread),
    })
}

/// The rows that register `dests` as the store's queues (a kept one
/// resumes, a new one starts after the last event, a gone one is
/// forgotten).
pub fn rows(dests: &[Destination]) -> Vec<DestRow<'_>> {
    dests
        .iter()
        .map(|d| DestRow {
            dest: &d.key,
            shown: &d.shown,
            format: d.format.name(),
            events: &d.events,
        })
        .collect()
}

/// Logs `dests` as scheme and host, their format and events.
pub fn log_dests(dests: &[Destination]) {
    for d in dests {
        log::info!(
            "notify: {} ({}) for {}",
            d.shown,
            d.format.name(),
            d.events.join(",")
        );
    }
}

/// The thread's state.
struct Worker {
    conn: NotifyConn,
    dests: Vec<Destination>,
    settings: Settings,
    http: ureq::Agent,
}

/// What one try of one destination came to.
#[derive(Debug)]
enum Tried {
    /// Nothing waits there.
    Idle,
    /// Its backoff runs until this time (unix ms).
    Waiting(i64),
    /// One event was handled (sent, failed or dropped): look again.
    Moved,
}

impl Worker {
    fn new(conn: NotifyConn, dests: Vec<Destination>, settings: Settings) -> Worker {
        let http = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            .timeout(settings.timeout)
            .redirects(0)
            .build();
        Worker {
            conn,
            dests,
            settings,
            http,
        }
    }

    fn run(&mut self, stop: &Receiver<()>, nudged: &Receiver<()>, reconfigs: &Receiver<Reconfig>) {
        loop {
            let mut wait = self.settings.poll;
            for i in 0..self.dests.len() {
                // One event per destination per round: a destination with a
                // long queue does not hold the others back.
                match self.try_one(i) {
                    Tried::Idle => {}
                    Tried::Moved => wait = Duration::ZERO,
                    Tried::Waiting(at) => {
                        let left = (at - now_ms()).max(0) as u64;
                        wait = wait.min(Duration::from_millis(left));
                    }
                }
                if matches!(
                    stop.try_recv(),
                    Err(crossbeam_channel::TryRecvError::Disconnected)
                ) {
                    return;
                }
            }
            // Without a destination nothing is due until a reload.
            let timer = if self.dests.is_empty() {
                never()
            } else {
                after(wait)
            };
            select! {
                recv(stop) -> _ => return,
                recv(nudged) -> _ => {}
                recv(reconfigs) -> r => match r {
                    Ok(r) => self.reconfigure(r),
                    Err(_) => return,
                },
                recv(timer) -> _ => {}
            }
        }
    }

    /// `hive reload` read the block again: its destinations from now on
    /// (the hub registered their queues before it handed them over).
    fn reconfigure(&mut self, r: Reconfig) {
        self.dests = r.dests;
        self.settings.hive = r.hive;
        self.settings.give_up_days = r.give_up_days;
    }

    /// Sends destination `i`'s next event if its backoff allows.
    fn try_one(&mut self, i: usize) -> Tried {
        let d = &self.dests[i];
        let (ev, attempts, next_at_ms) = match self.conn.next(&d.key) {
            Ok(Some(next)) => next,
            Ok(None) => return Tried::Idle,
            Err(e) => {
                log::warn!("notify: cannot read the queue of {}: {e}", d.shown);
                return Tried::Waiting(now_ms() + self.settings.poll.as_millis() as i64);
            }
        };
        if next_at_ms > now_ms() {
            return Tried::Waiting(next_at_ms);
        }
        let now = crate::proto::now();
        let give_up = i64::from(self.settings.give_up_days) * 86_400;
        if attempts > 0 && now.saturating_sub(ev.at) > give_up {
            let why = format!(
                "event {} ({}) dropped after {} tries over {} days",
                ev.uid, ev.event, attempts, self.settings.give_up_days
            );
            log::warn!("notify: {}: {why}", d.shown);
            if let Err(e) = self.conn.dropped(&d.key, ev.id, &why, now) {
                log::warn!("notify: cannot record a dropped event: {e}");
            }
            return Tried::Moved;
        }
        match self.post(d, &ev, now) {
            Ok(()) => {
                log::debug!("notify: {} took {} ({})", d.shown, ev.uid, ev.event);
                if let Err(e) = self.conn.delivered(&d.key, ev.id, now) {
                    log::warn!("notify: cannot record a delivery: {e}");
                }
                Tried::Moved
            }
            Err(error) => {
                let delay = backoff_ms(self.settings.backoff, attempts + 1);
                let at = now_ms() + delay;
                log::warn!(
                    "notify: {} refused {} ({}): {error}; try {} in {} ms",
                    d.shown,
                    ev.uid,
                    ev.event,
                    attempts + 2,
                    delay
                );
                if let Err(e) = self.conn.failed(&d.key, &error, now, at) {
                    log::warn!("notify: cannot record a failed try: {e}");
                }
                Tried::Waiting(at)
            }
        }
    }

    /// One request; the error as it may be shown (never the URL's path).
    fn post(&self, d: &Destination, ev: &NotifyEvent, now: i64) -> Result<(), String> {
        let out = format::render(d, ev, &self.settings.hive, now);
        let mut req = self
            .http
            .post(&d.url)
            .set("Content-Type", out.content_type)
            .set("User-Agent", "hive-notify");
        for (k, v) in &out.headers {
            req = req.set(k, v);
        }
        match req.send_bytes(&out.body) {
            Ok(_) => Ok(()),
            Err(ureq::Error::Status(code, _)) => Err(format!("HTTP {code}")),
            Err(ureq::Error::Transport(t)) => {
                // ureq's own text carries the URL: only its kind and cause.
                let cause = std::error::Error::source(&t)
                    .map(|s| format!(": {s}"))
                    .unwrap_or_default();
                Err(format!("{}{cause}", t.kind()))
            }
        }
    }
}

/// The wait after the `n`th failed try (n ≥ 1): `base`·2^(n−1), at most a day.
pub fn backoff_ms(base: Duration, n: u64) -> i64 {
    let base = base.as_millis().min(MAX_BACKOFF_MS as u128) as i64;
    let shift = n.saturating_sub(1).min(40) as u32;
    base.saturating_mul(1i64 << shift).min(MAX_BACKOFF_MS)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_a_day() {
        let s = Duration::from_secs(1);
        assert_eq!(backoff_ms(s, 1), 1000);
        assert_eq!(backoff_ms(s, 2), 2000);
        assert_eq!(backoff_ms(s, 5), 16_000);
        assert_eq!(backoff_ms(s, 17), 65_536_000, "2^16 s is under a day");
        assert_eq!(backoff_ms(s, 18), MAX_BACKOFF_MS, "2^17 s is past a day");
        assert_eq!(backoff_ms(s, u64::MAX), MAX_BACKOFF_MS);
    }
}
