//! The turn loop's bookkeeping with the broker about money and credentials:
//! every run's spend row (kept with its stats row until the broker
//! acknowledges it, sent again at the next boot when it never did), the
//! credential pool and the usage the CLI last reported (told again only
//! when they change), and the agent's `turn_usd` as the broker hands it out.
//! The loop owns one [`Accounting`] and passes it the poller and the stats
//! db it needs; nothing here calls back into the loop or decides anything
//! about a message.

use super::classify::TurnReport;
use super::poller::Poller;
use super::pool::{self, PoolCache};
use super::settings::Settings;
use super::stats::{MessageKey, Spend, Stats, TurnRow};
use crate::proto::{cmd, now, Request};
use std::time::{Duration, Instant};

/// The most spend rows a boot sends again (oldest first) that an earlier
/// harness recorded but the broker never acknowledged.
pub const SPEND_RESEND_MAX: u32 = 1000;

/// How long the broker's spend acknowledgements wait for the next run's
/// stats row, which writes them in its own commit, before they are written
/// on their own.
const SPEND_ACKS_AFTER: Duration = Duration::from_millis(250);

/// Spend rows, their acknowledgements, the pool and usage reports and
/// `turn_usd`.
pub struct Accounting {
    /// This harness's boot id, the first half of every spend row's
    /// idempotency key (the stats row id, or a counter, is the second).
    boot_id: String,
    spend_seq: u64,
    /// Spend rows the broker acknowledged, not yet marked so in the stats
    /// db: written with the next run's row (one commit), or on their own
    /// at `acks_due` when no run came first, or at the end.
    spend_acked: Vec<String>,
    acks_due: Option<Instant>,
    /// The pool last reported to the broker (`report_pool`), sent again
    /// when what identifies the credential changes.
    pool_reported: Option<cmd::ReportPool>,
    /// The pool report, computed again only when a credential file changed.
    pool: PoolCache,
    /// What a run's `rate_limit_event` last said of the usage limit, as told
    /// to the broker with the pool (the early warning).
    usage_reported: Option<cmd::UsageSeen>,
    /// The agent's `turn_usd` as the broker last handed it out, passed to
    /// every run as `--max-budget-usd`; `None` until a `recv_next` answer
    /// said it (no run starts before, so none runs uncapped).
    turn_usd: Option<Option<f64>>,
}

impl Default for Accounting {
    fn default() -> Accounting {
        Accounting::new()
    }
}

impl Accounting {
    pub fn new() -> Accounting {
        Accounting {
            boot_id: crate::sys::hash::random_bytes(6).map_or_else(
                |_| format!("p{}t{}", std::process::id(), now()),
                |b| crate::sys::hash::hex(&b),
            ),
            spend_seq: 0,
            spend_acked: Vec::new(),
            acks_due: None,
            pool_reported: None,
            pool: PoolCache::default(),
            usage_reported: None,
            turn_usd: None,
        }
    }

    /// The broker said the agent's `turn_usd`; true the first time.
    pub fn heard_turn_usd(&mut self, u: Option<f64>) -> bool {
        self.turn_usd.replace(u).is_none()
    }

    /// A `recv_next` answer said `turn_usd`: a run may start.
    pub fn turn_usd_known(&self) -> bool {
        self.turn_usd.is_some()
    }

    /// The cap every run is passed, as last heard.
    pub fn turn_usd(&self) -> Option<f64> {
        self.turn_usd.flatten()
    }

    /// The broker acknowledged the spend row `key`: marked in the stats db
    /// with the next run's row, or on its own a little later.
    pub fn spend_acked(&mut self, key: String, stats: Option<&Stats>) {
        if stats.is_some() {
            self.spend_acked.push(key);
            self.acks_due
                .get_or_insert_with(|| Instant::now() + SPEND_ACKS_AFTER);
        }
    }

    /// When the acknowledgements heard are written on their own.
    pub fn acks_due(&self) -> Option<Instant> {
        self.acks_due
    }

    /// Writes the spend acknowledgements heard since the last run's row.
    pub fn write_spend_acks(&mut self, stats: Option<&Stats>) {
        self.acks_due = None;
        if let (Some(stats), false) = (stats, self.spend_acked.is_empty()) {
            match stats.spend_acked(&self.spend_acked) {
                Ok(()) => self.spend_acked.clear(),
                Err(e) => log::error!("{e}"),
            }
        }
    }

    /// At the end: what the poller still holds of acknowledgements, then
    /// all of them written (had the harness died first, the rows would be
    /// sent again at its next boot and counted once).
    pub fn last_acks(&mut self, keys: impl IntoIterator<Item = String>, stats: Option<&Stats>) {
        self.spend_acked.extend(keys);
        self.write_spend_acks(stats);
    }

    /// The broker may have restarted: what it knew of the pool and the
    /// usage is gone, so both are told again.
    pub fn broker_back(&mut self) {
        self.pool_reported = None;
        self.usage_reported = None;
    }

    /// Sends again the spend rows an earlier harness recorded but the broker
    /// never acknowledged (it died first), oldest first, at most
    /// [`SPEND_RESEND_MAX`]; the broker keeps each key once.
    pub fn resend_spend(&self, stats: Option<&Stats>, poller: &Poller) {
        let Some(stats) = stats else {
            return;
        };
        match stats.unacked_spend(SPEND_RESEND_MAX) {
            Ok(rows) => {
                if !rows.is_empty() {
                    log::info!(
                        "sending {} spend rows the broker never acknowledged",
                        rows.len()
                    );
                }
                for r in rows {
                    poller.tell(Request::from(r));
                }
            }
            Err(e) => log::error!("{e}"),
        }
    }

    /// Tells the broker what identifies the credential of the claude about
    /// to start, when it changed since it was last told.
    pub fn report_pool(&mut self, s: &Settings, poller: &Poller) {
        let r = self.pool.report(s);
        if self.pool_reported.as_ref() == Some(&r) {
            return;
        }
        poller.tell(Request::from(r.clone()));
        self.pool_reported = Some(r);
    }

    /// What identified the last run's credential at its spawn.
    pub fn credential(&self, s: &Settings) -> cmd::ReportPool {
        self.pool_reported
            .clone()
            .unwrap_or_else(|| pool::report(s))
    }

    /// Tells the broker, with the pool, what the run's `rate_limit_event`
    /// said of the usage limit when it changed: the early warning marks the
    /// pool near its limit, `allowed` clears that.
    fn report_usage(&mut self, s: &Settings, u: &cmd::UsageSeen, poller: &Poller) {
        if self.usage_reported.as_ref() == Some(u) {
            return;
        }
        let mut r = pool::report(s);
        r.usage = Some(u.clone());
        poller.tell(Request::from(r));
        self.usage_reported = Some(u.clone());
    }

    /// What a run that started costs, told once: its stats row with its
    /// spend (and, with `let_go`, its message as let go) in one commit, the
    /// spend row to the broker (re-sent by the poller until acknowledged,
    /// and at the next boot if the harness dies first; the key makes a
    /// re-send count once), the usage the CLI reported, and for a turn the
    /// counters.
    pub fn record_run(
        &mut self,
        s: &Settings,
        stats: Option<&Stats>,
        row: &TurnRow,
        rep: &TurnReport,
        let_go: Option<&MessageKey>,
        poller: &Poller,
    ) {
        let tokens = rep.input_tokens + rep.cache_creation_tokens + rep.output_tokens;
        let mut spend = None;
        if let Some(stats) = stats {
            let spend_row = Spend {
                boot_id: &self.boot_id,
                usd: rep.cost_usd,
                tokens,
                cache_read: rep.cache_read_tokens,
            };
            match stats.record_with_spend(row, &spend_row, &self.spend_acked, let_go) {
                Ok((_, s)) => {
                    spend = Some(s);
                    self.spend_acked.clear();
                    self.acks_due = None;
                }
                Err(err) => log::error!("{err}"),
            }
        }
        if let Some(u) = &rep.usage {
            self.report_usage(s, u, poller);
        }
        let spend = spend.unwrap_or_else(|| {
            // No stats db: the row lives in memory only.
            self.spend_seq += 1;
            cmd::ReportSpend {
                key: format!("{}:n{}", self.boot_id, self.spend_seq),
                usd: rep.cost_usd,
                tokens,
                cache_read: rep.cache_read_tokens,
                at: Some(now()),
            }
        });
        poller.tell(Request::from(spend));
        if row.kind == "turn" || row.kind == "continue" {
            // Not worth waiting for; the poller keeps them in order. The
            // classifier has already dropped figures that are not finite,
            // negative or absurd.
            let ok = rep.outcome.is_ok();
            poller.tell(Request::from(cmd::PostTurnCounts {
                turns: 1,
                ok: u64::from(ok),
                failed: u64::from(!ok),
                tokens_in: rep.input_tokens,
                tokens_out: rep.output_tokens,
                cost_usd: rep.cost_usd.unwrap_or(0.0),
            }));
        }
    }
}
