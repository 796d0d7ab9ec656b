//! The broker's log lines about what one agent reports, throttled (issue 40,
//! robustness review N13): any process on an agent's socket may send
//! `report_pool`, `report_usage_limit`, `report_spend` and `report_state` as
//! fast as the hub answers (10 000 in 0.8 s wrote 1.4 MB of warnings). The
//! first line of a [`Kind`] from one agent is written at once; the ones
//! that follow within [`WINDOW_SECS`] are counted, and when the minute is
//! over one line says how many there were and shows the last. The hub's
//! timer writes that line ([`Throttle::due`], [`Throttle::flush`]), so a
//! burst that stops is still counted in the log. What the operator is told
//! in the inbox has rules of its own (once per pool, window or day).

use std::collections::BTreeMap;

/// How long the lines of one kind from one agent are counted after one is
/// written, seconds.
pub const WINDOW_SECS: i64 = 60;

/// A kind of log line about an agent's reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// `report_pool` moved the agent to another pool.
    PoolMove,
    /// `report_pool` said its pool is near its usage limit.
    NearLimit,
    /// `report_usage_limit` named a pool the agent is not in.
    UsageLimitRefused,
    /// `report_usage_limit` asked for a park past the cap.
    UsageLimitCapped,
    /// `report_usage_limit` again, for a pool parked already.
    UsageLimitAgain,
    /// `report_usage_limit` would move a park later sooner than the pools'
    /// renewal gap allows: refused.
    UsageLimitRenewal,
    /// `report_spend` of a run over the per-run bounds.
    SpendClamped,
    /// `report_state` moved the agent into or out of its login park.
    Login,
    /// A send or wake of the agent's was refused over its storage quota or
    /// its limit of a minute (`quotas.rs`).
    Quota,
}

/// The lines of one kind from one agent in the current minute.
struct Counted {
    /// When the minute ends (unix s).
    until: i64,
    /// Lines counted and not written.
    more: u64,
    /// The last of them, and its level.
    last: String,
    level: log::Level,
}

/// Every agent's counted lines, and when the next count is due.
#[derive(Default)]
pub struct Throttle {
    open: BTreeMap<(String, Kind), Counted>,
    due: Option<i64>,
}

impl Throttle {
    /// Writes `text` at `level`, unless a line of `kind` from `agent` was
    /// written less than a minute ago: then it is counted (and kept, as the
    /// last). Returns whether it was written.
    pub fn log(
        &mut self,
        now: i64,
        level: log::Level,
        agent: &str,
        kind: Kind,
        text: String,
    ) -> bool {
        let key = (agent.to_string(), kind);
        if let Some(c) = self.open.get_mut(&key) {
            if now < c.until {
                c.more += 1;
                c.last = text;
                c.level = c.level.min(level);
                self.due = Some(self.due.map_or(c.until, |d| d.min(c.until)));
                return false;
            }
        }
        if let Some(c) = self.open.remove(&key) {
            c.write();
        }
        log::log!(level, "{text}");
        self.open.insert(
            key,
            Counted {
                until: now + WINDOW_SECS,
                more: 0,
                last: String::new(),
                level,
            },
        );
        true
    }

    /// When the next count is to be written (unix s), if one is waiting.
    pub fn due(&self) -> Option<i64> {
        self.due
    }

    /// Writes the counts whose minute is over and forgets those minutes.
    pub fn flush(&mut self, now: i64) {
        self.open.retain(|_, c| {
            if now < c.until {
                return true;
            }
            c.write();
            false
        });
        self.due = self
            .open
            .values()
            .filter(|c| c.more > 0)
            .map(|c| c.until)
            .min();
    }
}

impl Counted {
    /// The line that counts the minute's others, if there were any.
    fn write(&self) {
        if self.more > 0 {
            log::log!(
                self.level,
                "… and {} more in the last minute (the last: {})",
                self.more,
                self.last
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of one kind from one agent is one line and a count; another
    /// kind, or another agent, has its own minute.
    #[test]
    fn a_burst_is_one_line_then_a_count_a_minute_later() {
        let mut t = Throttle::default();
        let warn = log::Level::Warn;
        let t0 = 1_795_300_000;
        assert!(t.log(t0, warn, "ana", Kind::PoolMove, "first".into()));
        for i in 0..9_999 {
            assert!(!t.log(t0 + 1, warn, "ana", Kind::PoolMove, format!("move {i}")));
        }
        assert!(t.log(t0 + 1, warn, "ana", Kind::NearLimit, "near".into()));
        assert!(t.log(t0 + 1, warn, "bob", Kind::PoolMove, "bob's".into()));
        assert_eq!(t.due(), Some(t0 + WINDOW_SECS));
        let c = &t.open[&("ana".to_string(), Kind::PoolMove)];
        assert_eq!((c.more, c.last.as_str()), (9_999, "move 9998"));
        // Before the minute ends nothing is due; at its end the count is
        // written and the minute forgotten.
        t.flush(t0 + 30);
        assert_eq!(t.open.len(), 3);
        t.flush(t0 + WINDOW_SECS + 1);
        assert!(t.open.is_empty());
        assert_eq!(t.due(), None);
        // The next one is written again.
        assert!(t.log(t0 + 100, warn, "ana", Kind::PoolMove, "again".into()));
    }
}
