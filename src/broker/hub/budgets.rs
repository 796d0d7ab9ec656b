//! Spend and budgets (issue 16). Every claude run's spend arrives as one row
//! (`report_spend`) keyed by the harness's idempotency key, so a re-send is
//! kept once; rows live in `broker.db` and outlast restarts of anything. A
//! budget (`budget` of a fleet entry, or the hive's top-level one) covers a
//! calendar window in UTC — a day, a week from Monday, a month. Budgets are
//! checked before a run starts: `recv_next` hands nothing to an agent whose
//! own or whose hive's budget is reached, answering the pause
//! `{reason:"budget", until: the window's end, detail:"budget reached · $5.00
//! of $5.00 today"}` (a running turn, and concurrent agents, may overshoot by
//! one run each). The parent (the operator for a root agent; the operator for
//! the hive) hears once at 80 % and once at 100 % per scope and window. The
//! pause ends by itself at the rollover (the hub's timer) or when the budget
//! is raised (`set_budget`, written with the fleet file's merge rule). A row
//! counts in the window holding its run's end (`at`), so one re-sent after a
//! restart past midnight is yesterday's, never today's.

use super::approvals::follow;
use super::{db_err, Done, Followup, Handled, Hub, Identity};
use crate::broker::fleetfile;
use crate::proto::cmd::{BudgetReply, BudgetRow, ReportSpend, SetBudget};
use crate::proto::{now, Budget, Empty, MsgKind, PauseReason, Paused, Per, TextReply};
use serde_json::{json, Value};

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil year and month of a day since 1970-01-01.
fn year_month(z: i64) -> (i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m)
}

/// The UTC window of `per` that holds `t`: (start, end), unix seconds.
pub fn window(per: &Per, t: i64) -> (i64, i64) {
    let day = t.div_euclid(86_400);
    match per {
        Per::Week => {
            // 1970-01-01 was a Thursday: Monday is 3 days before.
            let start = day - (day + 3).rem_euclid(7);
            (start * 86_400, (start + 7) * 86_400)
        }
        Per::Month => {
            let (y, m) = year_month(day);
            let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            (
                days_from_civil(y, m, 1) * 86_400,
                days_from_civil(ny, nm, 1) * 86_400,
            )
        }
        _ => (day * 86_400, (day + 1) * 86_400),
    }
}

/// "today", "this week", "this month".
fn window_word(per: &Per) -> &'static str {
    match per {
        Per::Week => "this week",
        Per::Month => "this month",
        _ => "today",
    }
}

/// What one scope spent since a window's start: dollars, runs of unknown
/// cost, tokens, cache reads.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sums {
    usd: f64,
    unknown: u64,
    tokens: u64,
    cache_read: u64,
}

impl Sums {
    fn add(&mut self, usd: Option<f64>, tokens: u64, cache_read: u64) {
        self.usd += usd.unwrap_or(0.0);
        self.unknown += u64::from(usd.is_none());
        self.tokens += tokens;
        self.cache_read += cache_read;
    }
}

/// Each scope's spend since the start of its window, kept by the hub so
/// that checking a budget scans no rows: every `recv_next` of an agent with
/// a budget asks, and every `report_spend` asks again, and a month's window
/// of a busy hive holds hundreds of thousands of rows (a scan of 300 000
/// took 40–60 ms of the hub's thread: docs/performance.md). A scope's sums
/// are read from the store once (at its first ask, and again at each new
/// window), then moved by each new spend row; the `spend` table changes in
/// no other way while the broker runs.
#[derive(Default)]
pub struct Spent {
    /// The hive's: the window start the sums count from, and the sums.
    hive: Option<(i64, Sums)>,
    /// Each agent's, the same way.
    agents: std::collections::HashMap<String, (i64, Sums)>,
}

impl Spent {
    fn get(&self, scope: Option<&str>) -> Option<&(i64, Sums)> {
        match scope {
            None => self.hive.as_ref(),
            Some(a) => self.agents.get(a),
        }
    }

    fn set(&mut self, scope: Option<&str>, start: i64, sums: Sums) {
        match scope {
            None => self.hive = Some((start, sums)),
            Some(a) => {
                self.agents.insert(a.to_string(), (start, sums));
            }
        }
    }

    /// A new row of `agent`'s, at `at`: counted in the sums of each scope it
    /// belongs to whose window it falls in.
    fn add(&mut self, agent: &str, at: i64, usd: Option<f64>, tokens: u64, cache_read: u64) {
        for kept in [self.hive.as_mut(), self.agents.get_mut(agent)]
            .into_iter()
            .flatten()
        {
            if at >= kept.0 {
                kept.1.add(usd, tokens, cache_read);
            }
        }
    }
}

/// One scope's budget and spend in its current window.
struct Standing {
    budget: Budget,
    start: i64,
    end: i64,
    usd: f64,
    unknown: u64,
    tokens: u64,
    cache_read: u64,
}

impl Standing {
    fn new(budget: Budget, (start, end): (i64, i64), sums: Sums) -> Standing {
        Standing {
            budget,
            start,
            end,
            usd: sums.usd,
            unknown: sums.unknown,
            tokens: sums.tokens,
            cache_read: sums.cache_read,
        }
    }

    /// The larger of the two shares of the budget spent (0 without limits).
    fn share(&self) -> f64 {
        let u = self.budget.usd.map_or(0.0, |l| {
            if l <= 0.0 {
                f64::INFINITY
            } else {
                self.usd / l
            }
        });
        let t = self.budget.tokens.map_or(0.0, |l| {
            if l == 0 {
                f64::INFINITY
            } else {
                self.tokens as f64 / l as f64
            }
        });
        u.max(t)
    }

    /// Sums of cents in binary floating point fall a hair short (0.04 of
    /// 0.05 is 0.7999…): shares are compared with this slack.
    const SLACK: f64 = 1e-9;

    fn reached(&self) -> bool {
        self.share() >= 1.0 - Self::SLACK
    }

    fn near(&self) -> bool {
        self.share() >= 0.8 - Self::SLACK
    }

    /// "$5.00 of $5.00 today" (or the tokens, when that limit is the nearer).
    fn figures(&self) -> String {
        let word = window_word(&self.budget.per);
        let usd_share = self.budget.usd.map(|l| self.usd / l.max(f64::MIN_POSITIVE));
        let tok_share = self
            .budget
            .tokens
            .map(|l| self.tokens as f64 / (l.max(1)) as f64);
        let unknown = if self.unknown > 0 {
            format!(" ({} runs of unknown cost)", self.unknown)
        } else {
            String::new()
        };
        match (usd_share, tok_share, self.budget.usd, self.budget.tokens) {
            (_, Some(t), _, Some(l)) if usd_share.is_none_or(|u| t > u) => {
                format!("{} of {l} tokens {word}", self.tokens)
            }
            (_, _, Some(l), _) => format!("${:.2} of ${l:.2} {word}{unknown}", self.usd),
            _ => format!("${:.2} {word}", self.usd),
        }
    }
}

impl Hub<'_> {
    /// The standing of `agent`'s budget, or of the hive's (`None`); `None`
    /// without a budget.
    fn standing(&mut self, agent: Option<&str>, t: i64) -> Result<Option<Standing>, String> {
        let budget = match agent {
            Some(a) => self.cfg.agent(a).and_then(|e| e.budget.clone()),
            None => self.cfg.budget.clone(),
        };
        let Some(budget) = budget else {
            return Ok(None);
        };
        let w = window(&budget.per, t);
        let sums = self.spent_since(agent, w.0)?;
        Ok(Some(Standing::new(budget, w, sums)))
    }

    /// What `scope` spent since `start`: kept ([`Spent`]), or read from the
    /// store and kept.
    fn spent_since(&mut self, scope: Option<&str>, start: i64) -> Result<Sums, String> {
        if let Some((from, sums)) = self.pools.spent.get(scope) {
            if *from == start {
                return Ok(*sums);
            }
        }
        let (usd, unknown, tokens, cache_read) =
            self.db.spend_since(scope, start).map_err(db_err)?;
        let sums = Sums {
            usd,
            unknown,
            tokens,
            cache_read,
        };
        self.pools.spent.set(scope, start, sums);
        Ok(sums)
    }

    /// The budget pause of `agent`, if its own or the hive's budget is
    /// reached; the hub's timer is set to the window's end.
    pub(super) fn budget_pause(&mut self, agent: &str) -> Option<Paused> {
        let t = now();
        for scope in [Some(agent), None] {
            let s = match self.standing(scope, t) {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => {
                    log::error!("cannot read the spend of {agent}: {e}");
                    continue;
                }
            };
            if s.reached() {
                self.pools.budget_wake =
                    Some(self.pools.budget_wake.map_or(s.end, |w| w.min(s.end)));
                let whose = if scope.is_some() { "" } else { "the hive's " };
                return Some(Paused {
                    reason: PauseReason::Budget,
                    until: Some(s.end),
                    detail: format!("{whose}budget reached · {}", s.figures()),
                });
            }
        }
        None
    }

    /// `report_spend`: keeps the row (once per key) at the run's end (`at`;
    /// its arrival for a harness that does not say), then the notices of the
    /// windows it changed: a row of a window already past counts there only,
    /// and tells nobody.
    pub(super) fn report_spend(&mut self, agent: &str, c: ReportSpend) -> Result<Empty, String> {
        let t = now();
        // The minute of slack `validate` allows ahead is this window's.
        let at = c.at.map_or(t, |a| a.min(t));
        let new = self
            .db
            .insert_spend(&c.key, agent, at, c.usd, c.tokens, c.cache_read)
            .map_err(db_err)?;
        if !new {
            return Ok(Empty {});
        }
        self.pools
            .spent
            .add(agent, at, c.usd, c.tokens, c.cache_read);
        for scope in [Some(agent), None] {
            let Some(s) = self.standing(scope, t)? else {
                continue;
            };
            if at < s.start {
                // Its own window is over: the current one did not change.
                continue;
            }
            let level = if s.reached() {
                100
            } else if s.near() {
                80
            } else {
                continue;
            };
            let name = scope.unwrap_or("hive");
            if !self
                .db
                .budget_notice(name, s.start, level)
                .map_err(db_err)?
            {
                continue;
            }
            let (to, whose) = match scope {
                Some(a) => (self.cfg.parent_of(a), a.to_string()),
                None => ("operator".to_string(), "the hive".to_string()),
            };
            let body = if level == 100 {
                format!(
                    "[budget] budget reached · {} for {whose}: {} until the window ends at {} \
                     or the budget is raised (hive budget set)",
                    s.figures(),
                    if scope.is_some() {
                        "it starts no new run"
                    } else {
                        "no agent starts a new run"
                    },
                    super::pools::clock(s.end, t)
                )
            } else {
                format!(
                    "[budget] {whose} has spent 80 % of its budget: {}",
                    s.figures()
                )
            };
            log::warn!("{body}");
            self.tell(&to, MsgKind::Budget, &body)?;
        }
        Ok(Empty {})
    }

    /// `budget`: the hive's row, then every agent's.
    pub(super) fn get_budget(&mut self) -> Result<BudgetReply, String> {
        let t = now();
        let names: Vec<Option<String>> = std::iter::once(None)
            .chain(self.cfg.agents.iter().map(|a| Some(a.name.clone())))
            .collect();
        let rows = names
            .iter()
            .map(|scope| self.budget_row(scope.as_deref(), t))
            .collect::<Result<_, _>>()?;
        Ok(BudgetReply { rows })
    }

    /// `own_budget`: the hive's row, then the calling agent's.
    pub(super) fn own_budget(&mut self, agent: &str) -> Result<BudgetReply, String> {
        let t = now();
        Ok(BudgetReply {
            rows: vec![self.budget_row(None, t)?, self.budget_row(Some(agent), t)?],
        })
    }

    /// One scope's row of `budget`: its window's spend against its budget,
    /// or the day's spend when it has none.
    fn budget_row(&mut self, scope: Option<&str>, t: i64) -> Result<BudgetRow, String> {
        let s = match self.standing(scope, t)? {
            Some(s) => s,
            None => {
                // No budget: the day's spend, for the record.
                let w = window(&Per::Day, t);
                let sums = self.spent_since(scope, w.0)?;
                let budget = Budget {
                    usd: None,
                    tokens: None,
                    per: Per::Day,
                };
                Standing::new(budget, w, sums)
            }
        };
        Ok(BudgetRow {
            scope: scope.unwrap_or("hive").to_string(),
            per: s.budget.per,
            window_start: s.start,
            window_end: s.end,
            spent_usd: s.usd,
            unknown_runs: s.unknown,
            tokens: s.tokens,
            cache_read: s.cache_read,
            usd: s.budget.usd,
            budget_tokens: s.budget.tokens,
            reached: (s.budget.usd.is_some() || s.budget.tokens.is_some()) && s.reached(),
        })
    }

    /// The budget `c` makes of `current`; `None` when no limit is left.
    fn changed_budget(current: Option<&Budget>, c: &SetBudget) -> Option<Budget> {
        let mut b = current.cloned().unwrap_or_default();
        if let Some(u) = c.usd {
            b.usd = Some(u);
        }
        if c.clear_usd {
            b.usd = None;
        }
        if let Some(t) = c.tokens {
            b.tokens = Some(t);
        }
        if c.clear_tokens {
            b.tokens = None;
        }
        if let Some(p) = &c.per {
            b.per = *p;
        }
        (b.usd.is_some() || b.tokens.is_some()).then_some(b)
    }

    /// `set_budget`: the fleet file is written off the hub (an agent's entry
    /// through the operator's merge writes, the hive's top-level key with the
    /// same rule), then [`Hub::budget_applied`].
    pub(super) fn set_budget(&mut self, c: SetBudget) -> Handled<TextReply> {
        if let Some(agent) = c.agent.clone() {
            self.check_agent(&agent)?;
            let new =
                Self::changed_budget(self.cfg.agent(&agent).and_then(|e| e.budget.as_ref()), &c);
            let patch = json!({ "budget": new });
            self.patched(&agent, &patch)?;
            let work = self.entry_work(&agent, patch.clone())?;
            return Ok(Done::Offload(Box::new(move |hub| {
                let result = work(hub);
                let followup = Followup::Budget {
                    agent: Some(agent),
                    patch,
                    hive: None,
                    result,
                };
                follow(hub, Identity::Operator, followup)
            })));
        }
        let base = self.cfg.budget.clone();
        let new = Self::changed_budget(base.as_ref(), &c);
        let Some(path) = self.settings.config_path.clone() else {
            return Err(
                "this broker has no fleet file (started without --config): the hive's budget \
                 lives there; start it with one"
                    .into(),
            );
        };
        Ok(Done::Offload(Box::new(move |hub| {
            let result = fleetfile::apply_hive_budget(&path, base.as_ref(), new.as_ref())
                .map(|_| "the hive's budget is in the fleet file".to_string());
            let followup = Followup::Budget {
                agent: None,
                patch: Value::Null,
                hive: Some(new),
                result,
            };
            follow(hub, Identity::Operator, followup)
        })))
    }

    /// The second half of `set_budget`: the hub's rules follow the file, and
    /// every parked `recv_next` looks again (a raised budget resumes at once).
    pub(super) fn budget_applied(
        &mut self,
        agent: Option<String>,
        patch: &Value,
        hive: Option<Option<Budget>>,
        result: Result<String, String>,
    ) -> Result<TextReply, String> {
        if let Some(a) = &agent {
            self.changing.remove(a);
        }
        result?;
        let who = match (&agent, hive) {
            (Some(a), _) => {
                let (cfg, _) = self.patched(a, patch)?;
                self.cfg = cfg;
                a.clone()
            }
            (None, Some(b)) => {
                self.cfg.budget = b;
                "the hive".to_string()
            }
            (None, None) => return Err("set_budget: nothing was changed".into()),
        };
        self.wake_all();
        let now_b = match &agent {
            Some(a) => self.cfg.agent(a).and_then(|e| e.budget.clone()),
            None => self.cfg.budget.clone(),
        };
        Ok(TextReply {
            text: format!(
                "the budget of {who} is now {} (in the fleet file)",
                now_b.map_or_else(
                    || "none".to_string(),
                    |b| serde_json::to_string(&b).unwrap_or_default()
                )
            ),
        })
    }

    /// Every agent's parked `recv_next` looks at its pauses again.
    pub(super) fn wake_all(&mut self) {
        let names: Vec<String> = self.cfg.agents.iter().map(|a| a.name.clone()).collect();
        for n in names {
            self.notify(&n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_utc_calendar_days_weeks_from_monday_and_months() {
        // 2026-11-23 09:00 UTC, a Monday.
        let t = days_from_civil(2026, 11, 23) * 86_400 + 9 * 3600;
        let d = days_from_civil(2026, 11, 23) * 86_400;
        assert_eq!(window(&Per::Day, t), (d, d + 86_400));
        assert_eq!(window(&Per::Week, t), (d, d + 7 * 86_400));
        // The Sunday after is still that week.
        assert_eq!(window(&Per::Week, d + 6 * 86_400 + 5), (d, d + 7 * 86_400));
        assert_eq!(
            window(&Per::Month, t),
            (
                days_from_civil(2026, 11, 1) * 86_400,
                days_from_civil(2026, 12, 1) * 86_400
            )
        );
        let dec = days_from_civil(2026, 12, 31) * 86_400;
        assert_eq!(
            window(&Per::Month, dec).1,
            days_from_civil(2027, 1, 1) * 86_400
        );
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(year_month(days_from_civil(2024, 2, 29)), (2024, 2));
    }

    #[test]
    fn figures_read_as_the_issue_says() {
        let s = Standing {
            budget: Budget {
                usd: Some(5.0),
                tokens: None,
                per: Per::Day,
            },
            start: 0,
            end: 86_400,
            usd: 5.0,
            unknown: 0,
            tokens: 10,
            cache_read: 0,
        };
        assert!(s.reached());
        assert_eq!(s.figures(), "$5.00 of $5.00 today");
    }
}
