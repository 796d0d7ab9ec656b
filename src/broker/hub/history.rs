//! The agents' turn history for the operator: `search` and `history`. The
//! broker keeps no history itself — each agent's page does — so both are
//! `hive up`'s: the hub checks the agent, then the caller's job thread (`conn-job`)
//! hands the query to the supervisor (through the lifecycle port) and waits
//! for its answer, which the supervisor computes on a thread of its own by
//! asking the agents' pages. Under plain `hive broker` both are refused with
//! where to look instead. The answer is cut to the answer budget here.

use super::{fmt_wait, Done, Handled, Hub};
use crate::broker::lifecycle::LifecycleCmd;
use crate::proto::cmd::{History, HistoryReply, Search, SearchReply, Turn};
use crate::proto::limits::PAGE_BYTES;
use crossbeam_channel::{bounded, Sender};
use std::time::Duration;

const SEARCH_NEEDS_UP: &str = "search needs hive up; use the agent page's /api/history";
const HISTORY_NEEDS_UP: &str = "history needs hive up; use the agent page's /api/history";

/// Asks the supervisor and waits for it at most `timeout`; run on a
/// job thread (`conn-job`). The supervisor answers within most of that time.
fn ask<T>(
    sup: &Sender<LifecycleCmd>,
    timeout: Duration,
    make: impl FnOnce(Duration, Sender<Result<T, String>>) -> LifecycleCmd,
) -> Result<T, String> {
    let (tx, rx) = bounded(1);
    sup.send(make(timeout / 5 * 4, tx))
        .map_err(|_| "the supervisor has stopped (the hive is shutting down)".to_string())?;
    rx.recv_timeout(timeout)
        .map_err(|_| format!("the supervisor did not answer in {}", fmt_wait(timeout)))?
}

impl Hub<'_> {
    pub(super) fn search(&mut self, c: Search) -> Handled<SearchReply> {
        if let Some(a) = &c.agent {
            self.check_agent(a)?;
        }
        let Some(sup) = self.settings.lifecycle.clone() else {
            return Err(SEARCH_NEEDS_UP.into());
        };
        let timeout = self.settings.supervisor_timeout;
        Ok(Done::Offload(Box::new(move || {
            let mut r = ask(&sup, timeout, |within, reply| LifecycleCmd::Search {
                query: c,
                within,
                reply,
            })?;
            let mut budget = super::limits::Budget::new();
            r.hits = budget.fit(std::mem::take(&mut r.hits));
            r.more |= budget.left_off > 0;
            Ok(r)
        })))
    }

    pub(super) fn history(&mut self, c: History) -> Handled<HistoryReply> {
        self.check_agent(&c.agent)?;
        let Some(sup) = self.settings.lifecycle.clone() else {
            return Err(HISTORY_NEEDS_UP.into());
        };
        let timeout = self.settings.supervisor_timeout;
        Ok(Done::Offload(Box::new(move || {
            let r = ask(&sup, timeout, |within, reply| LifecycleCmd::History {
                query: c,
                within,
                reply,
            })?;
            let (turns, left) = fit_turns(r.turns);
            Ok(HistoryReply {
                turns,
                more: r.more || left,
            })
        })))
    }
}

/// Bytes `v` takes as JSON.
fn size<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_string(v).map_or(usize::MAX, |s| s.len() + 1)
}

/// The turns that fit the answer budget, in order; true when some were left
/// for the next page. The first always goes out: when it alone is too large,
/// with its first events only (`events_left_off` counts the rest).
fn fit_turns(turns: Vec<Turn>) -> (Vec<Turn>, bool) {
    let budget = PAGE_BYTES - 1024;
    let total = turns.len();
    let (mut out, mut used) = (Vec::new(), 0usize);
    for mut t in turns {
        let mut n = size(&t);
        if out.is_empty() && n > budget {
            let (mut kept, mut left) = (Vec::new(), 0u64);
            let events = std::mem::take(&mut t.events);
            t.events_left_off = u64::MAX;
            let mut used_events = size(&t);
            for e in events {
                let s = size(&e);
                if left == 0 && used_events + s <= budget {
                    used_events += s;
                    kept.push(e);
                } else {
                    left += 1;
                }
            }
            t.events = kept;
            t.events_left_off = left;
            n = size(&t);
        }
        if !out.is_empty() && used + n > budget {
            break;
        }
        used += n;
        out.push(t);
    }
    let left = out.len() < total;
    (out, left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::cmd::TurnKind;
    use serde_json::json;

    fn turn(id: i64, events: usize, each: usize) -> Turn {
        Turn {
            id,
            kind: TurnKind::Message,
            started_at: 0,
            ended_at: None,
            from: None,
            body: None,
            message_id: None,
            ok: None,
            outcome: None,
            note: None,
            decision: None,
            duration_ms: None,
            cost_usd: 0.0,
            tokens_in: 0,
            tokens_out: 0,
            events: (0..events)
                .map(|i| json!({"id": i, "type": "note", "text": "x".repeat(each)}))
                .collect(),
            events_left_off: 0,
        }
    }

    #[test]
    fn turns_fit_the_budget_and_a_huge_first_one_is_cut() {
        let (out, left) = fit_turns(vec![turn(1, 2, 10), turn(2, 2, 10)]);
        assert_eq!((out.len(), left), (2, false));
        let (out, left) = fit_turns(vec![turn(1, 100, 10_000), turn(2, 3, 10_000)]);
        assert_eq!(out.len(), 1);
        assert!(left, "the second waits for the next page");
        let first = &out[0];
        assert!(first.events_left_off > 0 && !first.events.is_empty());
        assert_eq!(first.events.len() as u64 + first.events_left_off, 100);
        assert!(size(first) <= PAGE_BYTES);
        let (out, left) = fit_turns(vec![turn(1, 30, 10_000), turn(2, 30, 10_000)]);
        assert_eq!((out.len(), left), (1, true));
        assert_eq!(out[0].events_left_off, 0);
    }
}
