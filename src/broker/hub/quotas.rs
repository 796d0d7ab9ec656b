//! Storage quotas (issue 40, item 4): what one agent may have stored. A
//! message an agent causes — its `send` (to an agent here or another hive),
//! its `send_to_parent` from anything but its harness, a `wake` on its
//! socket, its reminders and scheduled prompts when they fire — is charged
//! to it (`db/retention.rs`: the row's `charged`, and the running sum in
//! `stored_bytes`) until the row is pruned; the operator's mail, system
//! notices and the harness's own (its notices to the parent, the page's
//! `web-ui` wake) are charged to no one. A charged message is refused when
//! it would take the agent past `retention.agent_quota_mib` of stored bytes,
//! or past `retention.agent_mib_per_minute` stored in the last minute; the
//! refusal names the agent, the limit and the figure, and starts with
//! `proto::limits::OVER_QUOTA`, by which the bash daemon knows to keep a
//! completion wake and try again. The operator is told once when an agent
//! goes over its quota (again only after pruning brought it back under),
//! and at most once an hour when it passes its limit of a minute.
//!
//! The hub keeps each agent's sum in memory: read from the store when the
//! hub starts, moved by each charged row it stores, read again after each
//! batch the prune thread deleted (`HubMsg::Pruned`). The minute's figure is
//! kept per second, in memory only.

use super::throttle::Kind;
use super::Hub;
use crate::proto::limits::OVER_QUOTA;
use crate::proto::MsgKind;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// The seconds one figure of a minute covers.
const MINUTE: u64 = 60;

/// How often the operator hears at most that one agent passed its limit of
/// a minute.
const RATE_NOTICE_EVERY: Duration = Duration::from_secs(3600);

/// What the hub knows of what each agent stored.
pub struct Quotas {
    /// Each agent's stored bytes (the store's `stored_bytes`).
    stored: BTreeMap<String, u64>,
    /// Each agent's bytes stored in the last minute: (second since
    /// `started`, bytes), oldest first, and their sum.
    recent: BTreeMap<String, (VecDeque<(u64, u64)>, u64)>,
    /// Agents the operator was told are over their quota, until pruning
    /// brings them under it.
    over: BTreeSet<String>,
    /// When the operator was last told that an agent passed its limit of a
    /// minute.
    rate_told: BTreeMap<String, Instant>,
    started: Instant,
}

impl Quotas {
    /// The sums as the store holds them.
    pub fn new(stored: BTreeMap<String, u64>) -> Quotas {
        Quotas {
            stored,
            recent: BTreeMap::new(),
            over: BTreeSet::new(),
            rate_told: BTreeMap::new(),
            started: Instant::now(),
        }
    }

    pub fn stored(&self, agent: &str) -> u64 {
        self.stored.get(agent).copied().unwrap_or(0)
    }

    fn second(&self) -> u64 {
        self.started.elapsed().as_secs()
    }

    /// What `agent` stored in the last minute (older seconds dropped).
    fn last_minute(&mut self, agent: &str) -> u64 {
        let now = self.second();
        let Some((seconds, sum)) = self.recent.get_mut(agent) else {
            return 0;
        };
        while let Some(&(s, b)) = seconds.front() {
            if s + MINUTE > now {
                break;
            }
            *sum -= b;
            seconds.pop_front();
        }
        *sum
    }

    /// A row of `bytes` charged to `agent` was stored.
    fn add(&mut self, agent: &str, bytes: u64) {
        let now = self.second();
        let total = self.stored.entry(agent.to_string()).or_default();
        *total = total.saturating_add(bytes);
        let (seconds, sum) = self.recent.entry(agent.to_string()).or_default();
        match seconds.back_mut() {
            Some((s, b)) if *s == now => *b += bytes,
            _ => seconds.push_back((now, bytes)),
        }
        *sum += bytes;
    }
}

/// `bytes` as a person reads it: `1.0 MiB (1048576 bytes)`.
fn figure(bytes: u64) -> String {
    format!(
        "{:.1} MiB ({bytes} bytes)",
        bytes as f64 / f64::from(1 << 20)
    )
}

/// Which of the two limits a message would pass.
enum Over {
    Quota { stored: u64, quota: u64 },
    Minute { stored: u64, limit: u64 },
}

impl Hub<'_> {
    /// Whether `agent` may store `bytes` more: an error naming the agent,
    /// the limit and the figure when it would pass its quota or its limit
    /// of a minute (logged once a minute, the operator told as the module
    /// says).
    pub(super) fn may_store(&mut self, agent: &str, bytes: usize) -> Result<(), String> {
        let r = self.cfg.retention();
        let bytes = bytes as u64;
        let stored = self.quotas.stored(agent);
        let quota = r.agent_quota_bytes();
        let over = if stored.saturating_add(bytes) > quota {
            Over::Quota { stored, quota }
        } else {
            let minute = self.quotas.last_minute(agent);
            let limit = r.agent_bytes_per_minute();
            if minute.saturating_add(bytes) <= limit {
                return Ok(());
            }
            Over::Minute {
                stored: minute,
                limit,
            }
        };
        let refusal = match &over {
            Over::Quota { stored, quota } => format!(
                "{OVER_QUOTA}{agent} has {} stored and this {bytes}-byte message would pass its \
                 quota of {} MiB (retention.agent_quota_mib); its handled mail is pruned {} \
                 days after it was handled (retention.messages_days)",
                figure(*stored),
                quota >> 20,
                r.messages_days()
            ),
            Over::Minute { stored, limit } => format!(
                "{OVER_QUOTA}{agent} stored {} in the last minute and this {bytes}-byte message \
                 would pass its limit of {} MiB a minute (retention.agent_mib_per_minute); try \
                 again in a minute",
                figure(*stored),
                limit >> 20
            ),
        };
        self.throttled(log::Level::Warn, agent, Kind::Quota, refusal.clone());
        self.tell_over(agent, &over, r.messages_days());
        Err(refusal)
    }

    /// A row of `bytes` charged to `agent` was stored.
    pub(super) fn stored(&mut self, agent: &str, bytes: usize) {
        self.quotas.add(agent, bytes as u64);
    }

    /// The prune thread deleted a batch: the sums are read again, and an
    /// agent back under its quota is told of again when it passes it next.
    pub(super) fn pruned(&mut self) {
        // Another connection wrote: the store's kept answers go (`db/memo.rs`).
        self.db.forget_memo();
        match self.db.stored_bytes() {
            Ok(stored) => self.quotas.stored = stored,
            Err(e) => {
                log::error!("cannot read the agents' stored bytes after a prune: {e}");
                return;
            }
        }
        let quota = self.cfg.retention().agent_quota_bytes();
        let under: Vec<String> = self
            .quotas
            .over
            .iter()
            .filter(|a| self.quotas.stored(a) < quota)
            .cloned()
            .collect();
        for agent in under {
            log::info!("{agent} is under its storage quota again");
            self.quotas.over.remove(&agent);
        }
    }

    /// Tells the operator that `agent` is over a limit, as the module says.
    fn tell_over(&mut self, agent: &str, over: &Over, days: u32) {
        let body = match over {
            Over::Quota { stored, quota } => {
                if !self.quotas.over.insert(agent.to_string()) {
                    return;
                }
                format!(
                    "[quota] {agent} is over its storage quota: {} stored, its quota is {} MiB \
                     (retention.agent_quota_mib). Its sends and wakes are refused (a bash task's \
                     completion wake waits in its daemon and is tried again) until pruning \
                     brings it under the quota (handled mail goes {days} days after it was \
                     handled: retention.messages_days) or the quota is raised in the fleet file \
                     (read when the broker starts). `hive agents --json` shows each agent's \
                     stored_bytes.",
                    figure(*stored),
                    quota >> 20
                )
            }
            Over::Minute { stored, limit } => {
                let now = Instant::now();
                let recent = self
                    .quotas
                    .rate_told
                    .get(agent)
                    .is_some_and(|t| now.duration_since(*t) < RATE_NOTICE_EVERY);
                if recent {
                    return;
                }
                self.quotas.rate_told.insert(agent.to_string(), now);
                format!(
                    "[quota] {agent} passed its limit of {} MiB a minute \
                     (retention.agent_mib_per_minute) with {} stored in the last minute: its \
                     sends and wakes are refused until its last minute is under the limit \
                     (this notice comes at most once an hour).",
                    limit >> 20,
                    figure(*stored)
                )
            }
        };
        if let Err(e) = self.tell("operator", MsgKind::Quota, &body) {
            log::error!("cannot tell the operator that {agent} is over a limit: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_minute_forgets_its_old_seconds() {
        let mut q = Quotas::new(BTreeMap::from([("ana".to_string(), 10)]));
        q.add("ana", 5);
        q.add("ana", 7);
        assert_eq!(q.stored("ana"), 22);
        assert_eq!(q.last_minute("ana"), 12);
        assert_eq!(q.last_minute("bob"), 0);
        // The same figures a minute later: the seconds are gone, the sum
        // stays.
        q.started = q
            .started
            .checked_sub(Duration::from_secs(MINUTE))
            .expect("a clock a minute old");
        assert_eq!(q.last_minute("ana"), 0);
        assert_eq!(q.stored("ana"), 22);
    }
}
