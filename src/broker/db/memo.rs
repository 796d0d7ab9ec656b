//! Answers the store gave while nothing has changed since (issue 42). Every
//! idle harness renews a parked `recv_next` and its status watch every
//! `HIVE_POLL_WAIT_SECS`, and each renewal asks the store the same questions
//! — is anything queued or inflight, how many wait, what is the agent's
//! status line — of a store that has not changed. [`Memo`] keeps those answers while this
//! connection's total changes (every row it inserted, updated or deleted,
//! triggers included, committed or rolled back) stay what they were when the
//! answers were read: any write through any method forgets them all, so a
//! kept answer is never one a read would not give. The one other connection
//! that writes, retention's (`prune.rs`), deletes acked rows only, which no
//! kept answer counts, and the hub forgets them anyway when it hears of a
//! pruned batch ([`Db::forget_memo`]); a new writer elsewhere must do the
//! same.

use super::agents::AgentStats;
use super::Db;
use std::collections::HashMap;

/// This connection's total changes when the kept answers were read.
type Stamp = u64;

#[derive(Default)]
pub(super) struct Memo {
    stamp: Stamp,
    /// `read_next`'s count of queued rows when it handed nothing out, per
    /// agent and per its two flags (`queued_too`, `look_for_inflight`).
    nothing_next: HashMap<String, [Option<u64>; 4]>,
    /// `stats` per agent.
    stats: HashMap<String, AgentStats>,
    /// `count_queued` per recipient.
    queued: HashMap<String, u64>,
}

impl Memo {
    fn forget(&mut self, stamp: Stamp) {
        self.nothing_next.clear();
        self.stats.clear();
        self.queued.clear();
        self.stamp = stamp;
    }
}

fn slot(queued_too: bool, look_for_inflight: bool) -> usize {
    usize::from(queued_too) * 2 + usize::from(look_for_inflight)
}

impl Db {
    /// Forgets the kept answers when the store changed since they were read.
    fn memo_fresh(&self) {
        let now = self.conn.total_changes();
        let mut memo = self.memo.borrow_mut();
        if memo.stamp != now {
            memo.forget(now);
        }
    }

    /// Forgets every kept answer: another connection wrote.
    pub fn forget_memo(&self) {
        self.memo.borrow_mut().forget(self.conn.total_changes());
    }

    /// `read_next`'s answer when it handed nothing out and nothing changed
    /// since: the count of queued rows.
    pub(super) fn memo_nothing_next(
        &self,
        agent: &str,
        queued_too: bool,
        look_for_inflight: bool,
    ) -> Option<u64> {
        self.memo_fresh();
        let memo = self.memo.borrow();
        memo.nothing_next
            .get(agent)
            .and_then(|s| s[slot(queued_too, look_for_inflight)])
    }

    /// Keeps `read_next`'s answer that handed nothing out; read at the stamp
    /// [`Db::memo_nothing_next`] checked, with no write since.
    pub(super) fn memo_keep_nothing_next(
        &self,
        agent: &str,
        queued_too: bool,
        look_for_inflight: bool,
        queued: u64,
    ) {
        let mut memo = self.memo.borrow_mut();
        let s = memo.nothing_next.entry(agent.to_string()).or_default();
        s[slot(queued_too, look_for_inflight)] = Some(queued);
    }

    /// `stats` of `agent` as last read, when nothing changed since.
    pub(super) fn memo_stats(&self, agent: &str) -> Option<AgentStats> {
        self.memo_fresh();
        self.memo.borrow().stats.get(agent).cloned()
    }

    /// Keeps `stats` of `agent`, read at the stamp [`Db::memo_stats`] checked.
    pub(super) fn memo_keep_stats(&self, agent: &str, stats: &AgentStats) {
        self.memo
            .borrow_mut()
            .stats
            .insert(agent.to_string(), stats.clone());
    }

    /// `count_queued` of `recipient` as last read, when nothing changed since.
    pub(super) fn memo_queued(&self, recipient: &str) -> Option<u64> {
        self.memo_fresh();
        self.memo.borrow().queued.get(recipient).copied()
    }

    /// Keeps `count_queued` of `recipient`, read at the stamp
    /// [`Db::memo_queued`] checked.
    pub(super) fn memo_keep_queued(&self, recipient: &str, n: u64) {
        self.memo
            .borrow_mut()
            .queued
            .insert(recipient.to_string(), n);
    }
}
