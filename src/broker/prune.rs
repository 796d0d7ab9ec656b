//! The prune thread (issue 40, item 4): it deletes what the fleet file's
//! `retention` lets go — acked messages handled more than
//! `retention.messages_days` ago that nothing refers to, notification
//! events as old that no destination still has to send, spend rows older
//! than both `retention.spend_days` and the start of every budget window
//! that could be current — from a connection of its own
//! (`db::Pruner`), never on the hub's thread. A pass runs when the broker
//! starts and then every `HIVE_PRUNE_SECS` (an hour); it deletes in batches
//! of at most [`BATCH`] rows, each its own short transaction holding the
//! store's write lock, with a pause between two, so a write of the hub's
//! waits for one batch at most (its busy timeout). After a batch of
//! messages the hub is told (`HubMsg::Pruned`) and reads the agents'
//! stored bytes again. The thread ends when its handle is dropped.

use super::db::{Durability, Pruner};
use super::hub::{budget_window, HubMsg, HubTx};
use crate::proto::Per;
use crossbeam_channel::{after, bounded, select, Receiver, Sender};
use std::path::Path;
use std::time::Duration;

/// Most rows one batch deletes.
pub const BATCH: u32 = 500;

/// Seconds between two passes without `HIVE_PRUNE_SECS`.
pub const DEFAULT_EVERY_SECS: u64 = 3600;

/// The pause between two batches: the hub's writes go first.
const PAUSE: Duration = Duration::from_millis(20);

/// How long the rows stay, and how often a pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub messages_days: u32,
    pub spend_days: u32,
    pub every: Duration,
}

/// The running thread; dropping it stops the thread (between two batches)
/// and waits for it.
pub struct Handle {
    stop: Option<Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the prune thread on the store at `path` (opened and migrated by
/// the broker already).
pub fn start(
    path: &Path,
    durability: Durability,
    schedule: Schedule,
    hub: HubTx,
) -> Result<Handle, String> {
    let pruner = Pruner::open(path, durability)?;
    let (stop_tx, stop) = bounded::<()>(0);
    let thread = std::thread::Builder::new()
        .name("prune".into())
        .spawn(move || run(&pruner, schedule, &stop, &hub))
        .map_err(|e| format!("cannot start the prune thread: {e}"))?;
    Ok(Handle {
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

/// The pass was cut short by the handle's drop.
struct Stopped;

fn run(pruner: &Pruner, schedule: Schedule, stop: &Receiver<()>, hub: &HubTx) {
    let mut passes = 0u64;
    let mut wait = Duration::ZERO;
    loop {
        select! {
            recv(stop) -> _ => return,
            recv(after(wait)) -> _ => {}
        }
        passes += 1;
        match pass(pruner, schedule, stop, hub, crate::proto::now()) {
            Ok(Ok(())) => log::debug!("prune pass {passes} done"),
            Ok(Err(e)) => log::warn!(
                "prune pass {passes}: {e}; the next pass tries again in {} s",
                schedule.every.as_secs()
            ),
            Err(Stopped) => return,
        }
        wait = schedule.every;
    }
}

/// One pass at `now`: the messages, then the spend rows. The outer `Err`
/// when the handle was dropped meanwhile, the inner one a store error.
fn pass(
    pruner: &Pruner,
    schedule: Schedule,
    stop: &Receiver<()>,
    hub: &HubTx,
    now: i64,
) -> Result<Result<(), String>, Stopped> {
    let before = now.saturating_sub(i64::from(schedule.messages_days) * 86_400);
    let (mut rows, mut bytes) = (0u64, 0u64);
    loop {
        let ids = match pruner.prunable(before, BATCH) {
            Ok(ids) => ids,
            Err(e) => return Ok(Err(format!("cannot read the acked messages: {e}"))),
        };
        if ids.is_empty() {
            break;
        }
        let done = match pruner.delete_messages(&ids, before) {
            Ok(done) => done,
            Err(e) => return Ok(Err(format!("cannot prune acked messages: {e}"))),
        };
        rows += done.rows;
        bytes += done.bytes;
        if done.rows > 0 && hub.send(HubMsg::Pruned).is_err() {
            return Err(Stopped);
        }
        if ids.len() < BATCH as usize && done.rows == ids.len() as u64 {
            break;
        }
        if done.rows == 0 {
            // Every row changed since it was read (which nothing does to an
            // acked row): the next pass looks again.
            break;
        }
        pause(stop)?;
    }
    if rows > 0 {
        log::info!(
            "pruned {rows} acked messages ({bytes} bytes of bodies) handled before {} \
             (retention.messages_days {})",
            crate::proto::text::fmt_time(before),
            schedule.messages_days
        );
    }
    // Notification events every destination is done with, by the messages'
    // age; a pending one stays (`db/outbox.rs`).
    let before_events = now.saturating_sub(i64::from(schedule.messages_days) * 86_400);
    loop {
        let n = match pruner.delete_notify_events(before_events, BATCH) {
            Ok(n) => n,
            Err(e) => return Ok(Err(format!("cannot prune notification events: {e}"))),
        };
        if n < u64::from(BATCH) {
            break;
        }
        pause(stop)?;
    }
    let before = spend_cutoff(now, schedule.spend_days);
    let mut spend = 0;
    loop {
        let n = match pruner.delete_spend(before, BATCH) {
            Ok(n) => n,
            Err(e) => return Ok(Err(format!("cannot prune spend rows: {e}"))),
        };
        spend += n;
        if n < u64::from(BATCH) {
            break;
        }
        pause(stop)?;
    }
    if spend > 0 {
        log::info!(
            "pruned {spend} spend rows of runs that ended before {} (retention.spend_days {}, \
             and before every current budget window)",
            crate::proto::text::fmt_time(before),
            schedule.spend_days
        );
    }
    Ok(Ok(()))
}

/// Waits out the pause between two batches; `Err` when the handle was
/// dropped meanwhile.
fn pause(stop: &Receiver<()>) -> Result<(), Stopped> {
    select! {
        recv(stop) -> _ => Err(Stopped),
        default(PAUSE) => Ok(()),
    }
}

/// The time before which a spend row may go at `now`: `spend_days` ago, or
/// the start of the earliest budget window holding `now` (a day, a week
/// from Monday, a month) when that is earlier. Every period counts, set or
/// not: `hive budget set` may start one at any moment, and its window must
/// find its rows.
pub fn spend_cutoff(now: i64, spend_days: u32) -> i64 {
    [Per::Day, Per::Week, Per::Month]
        .iter()
        .map(|per| budget_window(per, now).0)
        .fold(now.saturating_sub(i64::from(spend_days) * 86_400), i64::min)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unix seconds of a UTC date and time.
    fn utc(y: i64, m: i64, d: i64, hour: i64) -> i64 {
        // Days from 1970-01-01 (Howard Hinnant's days_from_civil).
        let y = if m <= 2 { y - 1 } else { y };
        let era = y.div_euclid(400);
        let yoe = y - era * 400;
        let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        (era * 146_097 + doe - 719_468) * 86_400 + hour * 3600
    }

    #[test]
    fn spend_rows_outlive_their_days_and_every_current_window() {
        // Wednesday 2026-12-09 at noon: the week began on Monday the 7th,
        // the month on the 1st.
        let now = utc(2026, 12, 9, 12);
        for (days, want, why) in [
            (
                90,
                now - 90 * 86_400,
                "90 days ago is before the month began",
            ),
            (3, utc(2026, 12, 1, 0), "the month began before 3 days ago"),
            (
                0,
                utc(2026, 12, 1, 0),
                "none kept by age: the month's window",
            ),
        ] {
            assert_eq!(spend_cutoff(now, days), want, "{why}");
        }
        // Thursday 2026-10-01: the month began today, the week on Monday
        // 2026-09-28, in the month before.
        let now = utc(2026, 10, 1, 6);
        assert_eq!(spend_cutoff(now, 1), utc(2026, 9, 28, 0), "the week's");
    }
}
