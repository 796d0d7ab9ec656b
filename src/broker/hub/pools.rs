//! Credential pools and their usage-limit pauses (issue 16): the broker is
//! the authority for pauses. A harness reports what identifies its claude's
//! credential at every spawn (`report_pool`); agents on the same credential
//! form one pool — the fleet entry's `account` wins, then the account id of
//! the claude config, then a keyed fingerprint (HMAC-SHA-256 of the
//! credential's SHA-256 under the hive's random salt, `sys::hash`; 8 hex
//! digits are kept, the credential never reaches the broker). A usage limit
//! with a reset (`report_usage_limit`) parks the whole pool: `recv_next` hands
//! none of its agents anything until then and answers the pause (once per
//! connection, then parks; once it ended, that connection's next call is
//! answered at once, with a message or without). The hub's timer ends it — no
//! process polls — and the pool's agents resume one [`STAGGER_SECS`] apart,
//! the one with the oldest queued message first. The operator hears once per
//! pool and window, and again when a later report moves the park's end more
//! than [`EXTEND_NOTICE_SECS`] past the end it was told (a real second limit
//! does that; so could any process on the agent's socket, and the operator
//! should see it).
//! A pause is never an attempt: nothing is handed out, so nothing counts.
//! The budget pause (`budgets.rs`) is answered the same way, after these.
//! A run whose CLI warned that the account is near its limit
//! (`rate_limit_event` `allowed_warning`, carried by `report_pool`) marks its
//! pool [`NearLimit`] until the window resets, a later run says `allowed`,
//! or the limit itself parks the pool; kept in memory only (the next run of
//! the pool says it again).
//!
//! Both reports are open to any process holding the agent's socket — claude's
//! own tools included: nothing separates the harness from its claude (same
//! user, same sandbox). So what one report can do is bounded: a pause is
//! capped at [`MAX_PAUSE_SECS`] ahead, a usage limit must name the credential
//! of the agent's current pool (else it is refused), a change of an agent's
//! pool is logged, and the operator's notice names the reporting agent
//! (`docs/security.md`). A report moves a pool's park later — a longer
//! park, or a new one after the operator lifted it — at most once per
//! [`RENEW_GAP_SECS`] (issue 40): one sooner is refused and logged (once a
//! minute per agent), and the park stands as it was. The operator lifts a
//! park at once (`hive resume`, [`Hub::lift_park`]); its agents then resume
//! one [`STAGGER_SECS`] apart, as after a reset.

use super::throttle::Kind;
use super::{db_err, ConnId, Hub};
use crate::proto::cmd::{PoolReply, ReportPool, ReportUsageLimit, UsageSeen, UsageStatus};
use crate::proto::text::clock;
use crate::proto::{now, Empty, MsgKind, NearLimit, PauseReason, Paused};
use crate::sys::hash::{hex, hmac_sha256};

/// Seconds between the resumes of a pool's agents after its reset.
pub const STAGGER_SECS: i64 = 1;

/// The furthest ahead one usage-limit report can park a pool: the harness's
/// default `HIVE_RATE_LIMIT_MAX_SLEEP_SECS` (6 h). A later reset is reported
/// again when the harness's next run meets it.
pub const MAX_PAUSE_SECS: i64 = 6 * 3600;

/// How far past the end the operator was told a report may move a standing
/// park's end before the operator hears of it again (naming the reporter and
/// the new end).
pub const EXTEND_NOTICE_SECS: i64 = 600;

/// How long after a pool's park was last moved later (by a report) or
/// lifted (by the operator) no report moves it later again: a longer park,
/// or a new one after a lift. A real limit moves a park once or twice a
/// window; a process on an agent's socket repeating its report is held to
/// one move per gap, and every move past [`EXTEND_NOTICE_SECS`] is told to
/// the operator. Memory only: after a broker restart a standing park counts
/// as moved at the restart.
pub const RENEW_GAP_SECS: i64 = 600;

/// The pool state the hub keeps in memory (mirrored in `broker.db` where it
/// must outlive a restart).
#[derive(Default)]
pub struct Pools {
    /// Each agent's pool as its harness last reported it.
    reported: std::collections::BTreeMap<String, String>,
    /// A pool's pause: until (unix s) and what the CLI said.
    paused: std::collections::BTreeMap<String, (i64, String)>,
    /// After a pool's reset: when each of its agents may be handed mail again.
    resume_at: std::collections::BTreeMap<String, i64>,
    /// A pool's early warning: near its usage limit until `until`.
    warned: std::collections::BTreeMap<String, NearLimit>,
    /// The end of each pool's park as the operator was last told it (memory
    /// only: after a restart, the end kept in the store).
    noticed: std::collections::BTreeMap<String, i64>,
    /// The pause (its `until`) each `recv_next` connection was answered.
    told: std::collections::BTreeMap<ConnId, i64>,
    /// When each pool's park was last moved later by a report, or lifted by
    /// the operator ([`RENEW_GAP_SECS`]); forgotten when a park ends by
    /// itself.
    moved: std::collections::BTreeMap<String, i64>,
    loaded: bool,
    /// The earliest end of a budget window some agent is paused until
    /// (`budgets.rs`): every agent looks again then.
    pub(super) budget_wake: Option<i64>,
    /// Each scope's spend in its window (`budgets.rs`).
    pub(super) spent: super::budgets::Spent,
}

impl Hub<'_> {
    /// Loads the pools and pauses kept in the store, once.
    fn pools_loaded(&mut self) {
        if self.pools.loaded {
            return;
        }
        self.pools.loaded = true;
        match self.db.pools() {
            Ok(rows) => self.pools.reported = rows.into_iter().collect(),
            Err(e) => log::error!("cannot read the agents' pools: {e}"),
        }
        match self.db.pool_pauses() {
            Ok(rows) => {
                let t = now();
                for (pool, until, detail) in rows {
                    // When it last moved is not kept: it counts as now.
                    self.pools.moved.insert(pool.clone(), t);
                    self.pools.paused.insert(pool, (until, detail));
                }
            }
            Err(e) => log::error!("cannot read the pools' pauses: {e}"),
        }
    }

    /// `agent`'s pool: `account:NAME` from its fleet entry, else what its
    /// harness reported, else a pool of its own.
    pub(super) fn pool_of(&mut self, agent: &str) -> String {
        self.pools_loaded();
        if let Some(a) = self.cfg.agent(agent).and_then(|e| e.account.clone()) {
            return format!("account:{a}");
        }
        self.pools
            .reported
            .get(agent)
            .cloned()
            .unwrap_or_else(|| format!("agent:{agent}"))
    }

    /// The pool name of what a harness reports of its credential.
    fn reported_name(&mut self, agent: &str, c: &ReportPool) -> Result<String, String> {
        Ok(if let Some(u) = &c.account_uuid {
            format!("uuid:{}", u.to_ascii_lowercase())
        } else if let Some(d) = &c.credential_sha256 {
            let salt = self.db.salt().map_err(db_err)?;
            let mac = hmac_sha256(&salt, d.to_ascii_lowercase().as_bytes());
            format!("key:{}", &hex(&mac)[..8])
        } else {
            format!("agent:{agent}")
        })
    }

    /// `report_pool`.
    pub(super) fn report_pool(&mut self, agent: &str, c: ReportPool) -> Result<PoolReply, String> {
        self.pools_loaded();
        let reported = self.reported_name(agent, &c)?;
        let usage = c.usage;
        match self.pools.reported.get(agent) {
            Some(old) if *old == reported => {}
            Some(old) => {
                // A new login may move an agent; so may any process holding
                // its socket. Either way the operator can read it here.
                let text =
                    format!("{agent} moves from pool {old} to pool {reported} (report_pool)");
                self.throttled(log::Level::Warn, agent, Kind::PoolMove, text);
            }
            None => log::info!("{agent} draws on pool {reported}"),
        }
        if self.pools.reported.get(agent) != Some(&reported) {
            self.db.set_pool(agent, &reported, now()).map_err(db_err)?;
            self.pools.reported.insert(agent.to_string(), reported);
        }
        let pool = self.pool_of(agent);
        if let Some(u) = usage {
            self.usage_seen(agent, &pool, u);
        }
        Ok(PoolReply { pool })
    }

    /// What a run of `agent` saw of `pool`'s usage limit: an early warning
    /// marks the pool until its reset, `allowed` clears the mark.
    fn usage_seen(&mut self, agent: &str, pool: &str, u: UsageSeen) {
        let t = now();
        match (u.status, u.resets_at) {
            (UsageStatus::AllowedWarning, Some(until)) if until > t => {
                let near = NearLimit {
                    until,
                    window: u.window,
                    utilization: u.utilization,
                    reported_by: agent.to_string(),
                };
                let known =
                    self.pools.warned.get(pool).is_some_and(|w| {
                        w.until == near.until && w.utilization == near.utilization
                    });
                if !known {
                    let text = format!(
                        "pool {pool} is near its usage limit ({}{}), reported by {agent}; the window resets {}",
                        near.window.as_deref().unwrap_or("a window"),
                        near.utilization
                            .map_or(String::new(), |u| format!(" at {:.0} %", u * 100.0)),
                        clock(until, t)
                    );
                    self.throttled(log::Level::Warn, agent, Kind::NearLimit, text);
                }
                self.pools.warned.insert(pool.to_string(), near);
            }
            // A warning without a reset ahead cannot be shown "until" anything.
            (UsageStatus::AllowedWarning, _) => {}
            (UsageStatus::Allowed, _) => {
                if self.pools.warned.remove(pool).is_some() {
                    let text =
                        format!("pool {pool} is no longer near its usage limit ({agent}'s run)");
                    self.throttled(log::Level::Info, agent, Kind::NearLimit, text);
                }
            }
        }
    }

    /// `agent`'s pool's early warning, while its window has not reset and
    /// the limit itself does not park the pool.
    pub(super) fn near_limit(&mut self, agent: &str) -> Option<NearLimit> {
        let t = now();
        let pool = self.pool_of(agent);
        if self.pools.paused.get(&pool).is_some_and(|(u, _)| *u > t) {
            return None;
        }
        match self.pools.warned.get(&pool) {
            Some(w) if w.until > t => Some(w.clone()),
            Some(_) => {
                self.pools.warned.remove(&pool);
                None
            }
            None => None,
        }
    }

    /// The agents of `pool` among the configured ones.
    pub(super) fn pool_members(&mut self, pool: &str) -> Vec<String> {
        let names: Vec<String> = self.cfg.agents.iter().map(|a| a.name.clone()).collect();
        names
            .into_iter()
            .filter(|n| self.pool_of(n) == pool)
            .collect()
    }

    /// `report_usage_limit`: parks the caller's pool until `until`.
    pub(super) fn report_usage_limit(
        &mut self,
        agent: &str,
        c: ReportUsageLimit,
    ) -> Result<Empty, String> {
        let t = now();
        if c.until <= t {
            return Ok(Empty {});
        }
        let pool = self.pool_of(agent);
        // The credential of the run must be the agent's pool: a stale report
        // (after a new login) or one that does not know it parks nothing.
        let named = match self.cfg.agent(agent).and_then(|e| e.account.clone()) {
            Some(a) => format!("account:{a}"),
            None => self.reported_name(agent, &c.credential)?,
        };
        if named != pool {
            let text = format!(
                "{agent} reported a usage limit for pool {named}, but it draws on pool {pool}: refused"
            );
            self.throttled(log::Level::Warn, agent, Kind::UsageLimitRefused, text);
            return Err(format!(
                "report_usage_limit: the credential named is pool {named}, but {agent} draws on \
                 pool {pool} (report_pool); nothing was parked"
            ));
        }
        let c = if c.until > t + MAX_PAUSE_SECS {
            let text = format!(
                "{agent} reported a usage limit until {}, over {MAX_PAUSE_SECS}s ahead: pool {pool} \
                 is parked until {} at most",
                c.until,
                t + MAX_PAUSE_SECS
            );
            self.throttled(log::Level::Warn, agent, Kind::UsageLimitCapped, text);
            ReportUsageLimit {
                until: t + MAX_PAUSE_SECS,
                ..c
            }
        } else {
            c
        };
        let current = self.pools.paused.get(&pool).cloned();
        let fresh = current.as_ref().is_none_or(|(u, _)| *u <= t);
        let until = match &current {
            Some((u, _)) if !fresh => (*u).max(c.until),
            _ => c.until,
        };
        // A longer park, or a new one after the operator's lift: one per gap.
        let later = fresh || current.as_ref().is_some_and(|(u, _)| c.until > *u);
        if let Some(moved) = self.pools.moved.get(&pool).copied().filter(|_| later) {
            if t < moved + RENEW_GAP_SECS {
                let stands = match &current {
                    Some((u, _)) if !fresh => format!("stays parked until {}", clock(*u, t)),
                    _ => "stays lifted (the operator's resume)".to_string(),
                };
                let text = format!(
                    "{agent} reported a usage limit until {}: pool {pool} {stands}; its park was                      moved or lifted {}s ago and moves later at most once every {RENEW_GAP_SECS}s",
                    c.until,
                    t - moved
                );
                self.throttled(log::Level::Warn, agent, Kind::UsageLimitRenewal, text);
                return Err(format!(
                    "report_usage_limit: pool {pool} {stands}: its park was moved or lifted {}s                      ago, and a report moves it later at most once every {RENEW_GAP_SECS}s                      (issue 40); try again after {}",
                    t - moved,
                    clock(moved + RENEW_GAP_SECS, t)
                ));
            }
        }
        if later {
            self.pools.moved.insert(pool.clone(), t);
        }
        // The end the operator was told, when this report moves it far
        // enough later to tell again: measured from the told end, so a chain
        // of small moves is told too once it adds up.
        let extended_from = current
            .as_ref()
            .filter(|_| !fresh)
            .map(|(u, _)| self.pools.noticed.get(&pool).copied().unwrap_or(*u))
            .filter(|told| until > told + EXTEND_NOTICE_SECS);
        let detail = if c.detail.is_empty() {
            "usage limit".to_string()
        } else {
            c.detail.clone()
        };
        self.db
            .set_pool_pause(&pool, until, &detail, t)
            .map_err(db_err)?;
        self.pools
            .paused
            .insert(pool.clone(), (until, detail.clone()));
        let members = self.pool_members(&pool);
        for m in &members {
            self.pools.resume_at.remove(m);
            // An idle member parked in `recv_next` hears the pause now (its
            // page shows it), not only when mail comes.
            self.notify(m);
        }
        // The limit itself is shown now; the warning was about this window.
        self.pools.warned.remove(&pool);
        if fresh {
            let body = format!(
                "[usage limit] pool {pool} ({}) hit its usage limit, reported by {agent}: {detail}. \
                 No agent of it starts claude until {}; queued mail waits and runs after it.",
                members.join(", "),
                clock(until, t)
            );
            log::warn!("{body}");
            self.tell("operator", MsgKind::UsageLimit, &body)?;
            self.pools.noticed.insert(pool, until);
        } else if let Some(old) = extended_from {
            let body = format!(
                "[usage limit] pool {pool} ({}) stays parked longer, reported by {agent}: {detail}. \
                 No agent of it starts claude until {} (it was {}); queued mail waits and runs \
                 after it.",
                members.join(", "),
                clock(until, t),
                clock(old, t)
            );
            log::warn!("{body}");
            self.tell("operator", MsgKind::UsageLimit, &body)?;
            self.pools.noticed.insert(pool, until);
        } else {
            let text = format!(
                "pool {pool}: {agent} reported its usage limit again; the park ends {}",
                clock(until, t)
            );
            self.throttled(log::Level::Info, agent, Kind::UsageLimitAgain, text);
        }
        Ok(Empty {})
    }

    /// The park of `agent`'s credential pool (or its wait for its turn
    /// after one), if any (`pauses.rs` adds the other reasons).
    pub(super) fn pool_pause(&mut self, agent: &str) -> Option<Paused> {
        let t = now();
        self.pools_loaded();
        // The pool's name is made only when some pool is paused (every
        // `recv_next` asks).
        if !self.pools.paused.is_empty() {
            let pool = self.pool_of(agent);
            if let Some((until, detail)) = self.pools.paused.get(&pool) {
                if *until > t {
                    return Some(Paused {
                        reason: PauseReason::UsageLimit,
                        until: Some(*until),
                        detail: format!("pool {pool}: {detail}"),
                    });
                }
            }
        }
        match self.pools.resume_at.get(agent) {
            Some(at) if *at > t => Some(Paused {
                reason: PauseReason::UsageLimit,
                until: Some(*at),
                detail: format!(
                    "pool {}: its park ended; its agents resume one a second",
                    self.pool_of(agent)
                ),
            }),
            _ => None,
        }
    }

    /// Whether `conn` was answered this pause already; marks it answered.
    pub(super) fn pause_told(&mut self, conn: ConnId, p: &Paused) -> bool {
        let until = p.until.unwrap_or(0);
        self.pools.told.insert(conn, until) == Some(until)
    }

    /// Whether `conn` was answered a pause that has ended since: it is
    /// answered the end once, at once (so a harness waiting to run a
    /// continue hears it without mail); forgets it.
    pub(super) fn pause_end_untold(&mut self, conn: ConnId) -> bool {
        self.pools.told.remove(&conn).is_some()
    }

    pub(super) fn pause_conn_closed(&mut self, conn: ConnId) {
        self.pools.told.remove(&conn);
    }

    /// The next pause deadline: a pool's reset or an agent's staggered resume.
    pub(super) fn next_pause_deadline(&mut self) -> Option<i64> {
        self.pools_loaded();
        let a = self.pools.paused.values().map(|(u, _)| *u).min();
        let b = self.pools.resume_at.values().copied().min();
        [a, b, self.pools.budget_wake].into_iter().flatten().min()
    }

    /// Ends the pauses that are due: a pool past its reset has its agents
    /// resume one by one, oldest queued message first; an agent whose turn
    /// has come is woken.
    pub(super) fn fire_pauses(&mut self) {
        let t = now();
        let due: Vec<(String, i64)> = self
            .pools
            .paused
            .iter()
            .filter(|(_, (u, _))| *u <= t)
            .map(|(p, (u, _))| (p.clone(), *u))
            .collect();
        for (pool, until) in due {
            log::info!("pool {pool}: the usage limit reset; resuming its agents");
            self.end_park(&pool, until.max(t));
            self.pools.moved.remove(&pool);
        }
        self.wake_resumed(t);
        if self.pools.budget_wake.is_some_and(|w| w <= t) {
            // A budget window rolled over: every agent looks again.
            self.pools.budget_wake = None;
            self.wake_all();
        }
    }

    /// `pool`'s park ends: it is forgotten (in the store too), and its
    /// agents may be handed mail again one [`STAGGER_SECS`] apart from
    /// `from`, the one with the oldest queued message first, those with
    /// nothing queued last. Returns them in that order.
    fn end_park(&mut self, pool: &str, from: i64) -> Vec<String> {
        self.pools.paused.remove(pool);
        self.pools.noticed.remove(pool);
        if let Err(e) = self.db.clear_pool_pause(pool) {
            log::error!("cannot clear the pause of pool {pool}: {e}");
        }
        let mut members: Vec<(Option<i64>, String)> = self
            .pool_members(pool)
            .into_iter()
            .map(|m| (self.db.oldest_queued_seq(&m).ok().flatten(), m))
            .collect();
        members.sort_by_key(|(seq, name)| (seq.is_none(), *seq, name.clone()));
        let mut order = Vec::with_capacity(members.len());
        for (i, (_, m)) in members.into_iter().enumerate() {
            self.pools
                .resume_at
                .insert(m.clone(), from + i as i64 * STAGGER_SECS);
            order.push(m);
        }
        order
    }

    /// Wakes the agents whose turn to resume has come.
    fn wake_resumed(&mut self, t: i64) {
        let woken: Vec<String> = self
            .pools
            .resume_at
            .iter()
            .filter(|(_, at)| **at <= t)
            .map(|(a, _)| a.clone())
            .collect();
        for a in woken {
            self.pools.resume_at.remove(&a);
            self.notify(&a);
        }
    }

    /// The operator lifts `pool`'s usage-limit park (`resume`): it ends now,
    /// as at a reset — its agents resume one [`STAGGER_SECS`] apart, the
    /// first at once — and no report parks it again for [`RENEW_GAP_SECS`].
    /// Returns the pool's agents in the order they resume, or None when
    /// the pool is not parked.
    pub(super) fn lift_park(&mut self, pool: &str) -> Option<Vec<String>> {
        self.pools_loaded();
        let t = now();
        if self.pools.paused.get(pool).is_none_or(|(u, _)| *u <= t) {
            return None;
        }
        let order = self.end_park(pool, t);
        self.pools.moved.insert(pool.to_string(), t);
        self.wake_resumed(t);
        Some(order)
    }

    /// The operator ends `agent`'s wait for its turn after its pool's park
    /// ended.
    pub(super) fn lift_stagger(&mut self, agent: &str) {
        self.pools.resume_at.remove(agent);
        self.notify(agent);
    }

    /// Whether `pool` is parked now.
    pub(super) fn pool_parked(&mut self, pool: &str) -> bool {
        self.pools_loaded();
        self.pools.paused.get(pool).is_some_and(|(u, _)| *u > now())
    }

    /// Every pool the hive knows: its agents' and the parked ones.
    pub(super) fn known_pools(&mut self) -> Vec<String> {
        self.pools_loaded();
        let names: Vec<String> = self.cfg.agents.iter().map(|a| a.name.clone()).collect();
        let mut pools: Vec<String> = names.iter().map(|n| self.pool_of(n)).collect();
        pools.extend(self.pools.paused.keys().cloned());
        pools.sort();
        pools.dedup();
        pools
    }
}

#[cfg(test)]
mod tests {
    use super::{Hub, RENEW_GAP_SECS, STAGGER_SECS};
    use crate::broker::db::{Db, Durability, Store};
    use crate::broker::hub::HubSettings;
    use crate::config::HiveConfig;
    use crate::proto::cmd::{ReportPool, ReportUsageLimit};
    use crate::proto::text::clock;
    use crate::proto::{now, MsgKind};

    fn uuid() -> ReportPool {
        ReportPool {
            account_uuid: Some("u1".into()),
            ..ReportPool::default()
        }
    }

    /// The order of the resumes, read from the hub's own state: the timer's
    /// ticks a second apart would make it a matter of timing.
    #[test]
    fn after_the_reset_the_agent_with_the_oldest_queued_message_resumes_first() {
        let dir = std::env::temp_dir().join(format!("hive-pools-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(&dir.join("broker.db"), Durability::Normal).unwrap();
        let cfg = HiveConfig::parse(
            r#"{"agents":[{"name":"ana"},{"name":"bob"},{"name":"cat"},{"name":"dan","account":"x"}]}"#,
        )
        .unwrap();
        let store = Store::new(&db).unwrap();
        let mut hub = Hub::new(store, cfg, HubSettings::for_tests(&dir));
        for a in ["ana", "bob", "cat"] {
            hub.report_pool(a, uuid()).unwrap();
        }
        // cat's mail is the oldest, then ana's; bob has none.
        hub.tell("cat", MsgKind::Message, "first").unwrap();
        hub.tell("ana", MsgKind::Message, "second").unwrap();
        let t = now();
        let limit = ReportUsageLimit {
            until: t + 600,
            detail: "session limit".into(),
            credential: uuid(),
        };
        hub.report_usage_limit("bob", limit).unwrap();
        // Each agent's connection parks (connection ids 1, 2, 3).
        let (cat, ana, bob) = (1, 2, 3);
        hub.wait_for("cat", cat);
        hub.wait_for("ana", ana);
        hub.wait_for("bob", bob);
        // The reset passes; the hub's timer fires.
        let pool = hub.pool_of("ana");
        hub.pools.paused.get_mut(&pool).unwrap().0 = t - 10;
        hub.fire_pauses();
        assert_eq!(
            hub.take_woken(),
            [cat],
            "cat, the oldest mail, is woken first (and alone)"
        );
        let at = |a: &str| hub.pools.resume_at.get(a).copied();
        assert_eq!(at("cat"), None, "resumed");
        let (ana_at, bob_at) = (at("ana").unwrap(), at("bob").unwrap());
        assert_eq!(bob_at - ana_at, STAGGER_SECS, "nothing queued: last");
        assert_eq!(at("dan"), None, "another pool");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A report moves a standing park later at most once per gap, and
    /// parks a pool the operator lifted no sooner than a gap after the
    /// lift; a report that moves nothing is taken as before. The gap's
    /// passing is the hub's own state set back, not a wait.
    #[test]
    fn a_park_moves_later_at_most_once_per_gap_and_a_lift_holds_for_one() {
        let dir = std::env::temp_dir().join(format!("hive-renew-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let db = Db::open(&dir.join("broker.db"), Durability::Normal).unwrap();
        let cfg = HiveConfig::parse(r#"{"agents":[{"name":"ana"},{"name":"bob"}]}"#).unwrap();
        let store = Store::new(&db).unwrap();
        let mut hub = Hub::new(store, cfg, HubSettings::for_tests(&dir));
        for a in ["ana", "bob"] {
            hub.report_pool(a, uuid()).unwrap();
        }
        let pool = hub.pool_of("ana");
        let t = now();
        let limit = |until| ReportUsageLimit {
            until,
            detail: "session limit".into(),
            credential: uuid(),
        };
        let end = |hub: &mut Hub| hub.pools.paused.get(&pool).map(|p| p.0);
        hub.report_usage_limit("ana", limit(t + 600)).unwrap();
        assert_eq!(end(&mut hub), Some(t + 600), "a new park is taken");
        let e = hub.report_usage_limit("bob", limit(t + 1200)).unwrap_err();
        assert!(e.contains("at most once every 600s"), "{e}");
        assert_eq!(end(&mut hub), Some(t + 600), "the park stands as it was");
        hub.report_usage_limit("ana", limit(t + 300)).unwrap();
        assert_eq!(end(&mut hub), Some(t + 600), "an earlier end moves nothing");
        // A gap later, one move is taken — over ten minutes past the end
        // the operator was told, so told again, naming the reporter — and
        // the next waits again.
        let notices = |hub: &mut Hub| -> Vec<String> {
            let rows = hub.db.queued_after("operator", 0, 100).unwrap();
            rows.into_iter()
                .map(|m| m.body)
                .filter(|b| b.starts_with("[usage limit]"))
                .collect()
        };
        assert_eq!(notices(&mut hub).len(), 1);
        hub.pools.moved.insert(pool.clone(), t - RENEW_GAP_SECS);
        hub.report_usage_limit("bob", limit(t + 1201)).unwrap();
        assert_eq!(end(&mut hub), Some(t + 1201));
        let told = notices(&mut hub);
        assert_eq!(told.len(), 2, "{told:?}");
        assert!(
            told[1].contains("stays parked longer, reported by bob")
                && told[1].contains(&format!(
                    "(it was {}",
                    clock(t + 600, t).split(" (").next().unwrap()
                )),
            "{}",
            told[1]
        );
        assert!(hub.report_usage_limit("ana", limit(t + 1800)).is_err());
        // The operator's lift ends the park, and no report parks it again
        // until a gap has passed since the lift.
        let order = hub.lift_park(&pool).expect("parked");
        assert_eq!(order.len(), 2, "{order:?}");
        assert_eq!(end(&mut hub), None);
        assert!(
            hub.broker_pause("ana").is_none(),
            "the first resumes at once"
        );
        let e = hub.report_usage_limit("ana", limit(t + 600)).unwrap_err();
        assert!(e.contains("stays lifted"), "{e}");
        assert_eq!(end(&mut hub), None);
        assert!(hub.lift_park(&pool).is_none(), "nothing left to lift");
        hub.pools.moved.insert(pool.clone(), t - RENEW_GAP_SECS);
        hub.report_usage_limit("ana", limit(t + 600)).unwrap();
        assert_eq!(end(&mut hub), Some(t + 600));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
