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

use super::throttle::Kind;
use super::{db_err, Done, Followup, Handled, Hub, Identity};
use crate::broker::db::SpendTotals;
use crate::config::fleetfile;
use crate::proto::cmd::{
    Bounded, BudgetReply, BudgetReport, BudgetRow, ReportSpend, ScopeReport, SetBudget, VoidReply,
    VoidSpend,
};
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
/// cost, tokens, cache reads, runs kept clamped.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Sums {
    usd: f64,
    unknown: u64,
    tokens: u64,
    cache_read: u64,
    clamped: u64,
}

impl Sums {
    fn from_store(t: SpendTotals) -> Sums {
        Sums {
            usd: t.usd,
            unknown: t.unknown,
            tokens: t.tokens,
            cache_read: t.cache_read,
            clamped: t.clamped,
        }
    }

    /// Adds one row, in checked arithmetic: a count that would pass 2^64 is
    /// an `Err` naming it (release builds do not check overflow, and a
    /// wrapped sum would read as a small spend), and the sums stay as they
    /// were.
    fn add(&mut self, row: &Bounded) -> Result<(), String> {
        let sum = |a: u64, b: u64, what: &str| {
            a.checked_add(b)
                .ok_or_else(|| format!("the {what} of the spend rows add up past 2^64"))
        };
        *self = Sums {
            usd: self.usd + row.usd.unwrap_or(0.0),
            unknown: sum(
                self.unknown,
                u64::from(row.usd.is_none()),
                "runs of unknown cost",
            )?,
            tokens: sum(self.tokens, row.tokens, "tokens")?,
            cache_read: sum(self.cache_read, row.cache_read, "cache reads")?,
            clamped: sum(self.clamped, u64::from(row.clamped), "clamped runs")?,
        };
        Ok(())
    }
}

/// A scope's sums, or why they cannot be had (kept as well: a check that
/// failed is not tried again until the window changes or the operator voids
/// the scope's rows, so a scope whose rows cannot be added up costs one
/// scan, not one per check).
type Kept = Result<Sums, String>;

/// Each scope's spend since the start of its window, kept by the hub so
/// that checking a budget scans no rows: every `recv_next` of an agent with
/// a budget asks, and every `report_spend` asks again, and a month's window
/// of a busy hive holds hundreds of thousands of rows (a scan of 300 000
/// took 40–60 ms of the hub's thread: docs/performance.md). A scope's sums
/// are read from the store once (at its first ask, and again at each new
/// window or after `void_spend`), then moved by each new spend row; the
/// `spend` table changes in no other way while the broker runs.
#[derive(Default)]
pub struct Spent {
    /// The hive's: the window start the sums count from, and the sums.
    hive: Option<(i64, Kept)>,
    /// Each agent's, the same way.
    agents: std::collections::HashMap<String, (i64, Kept)>,
    /// The scopes and windows whose unsummable spend the operator was told
    /// of (`budget_notices` has them too; this spares a write per check).
    told: std::collections::HashSet<(String, i64)>,
}

impl Spent {
    fn get(&self, scope: Option<&str>) -> Option<&(i64, Kept)> {
        match scope {
            None => self.hive.as_ref(),
            Some(a) => self.agents.get(a),
        }
    }

    fn set(&mut self, scope: Option<&str>, start: i64, sums: Kept) {
        match scope {
            None => self.hive = Some((start, sums)),
            Some(a) => {
                self.agents.insert(a.to_string(), (start, sums));
            }
        }
    }

    /// A new row of `agent`'s, at `at`: counted in the sums of each scope it
    /// belongs to whose window it falls in. A sum that would pass 2^64
    /// becomes that scope's error.
    fn add(&mut self, agent: &str, at: i64, row: &Bounded) {
        let scopes = [
            ("the hive", self.hive.as_mut()),
            (agent, self.agents.get_mut(agent)),
        ];
        for (whose, kept) in scopes {
            let Some(kept) = kept else {
                continue;
            };
            if at < kept.0 {
                continue;
            }
            let Ok(sums) = &mut kept.1 else {
                continue;
            };
            if let Err(e) = sums.add(row) {
                log::error!("the spend of {whose} cannot be added up: {e}");
                kept.1 = Err(e);
            }
        }
    }

    /// Forgets the sums `void_spend` changed: an agent's and the hive's, or
    /// (`None`, the hive's rows) every scope's. They are read again at the
    /// next ask.
    fn forget(&mut self, agent: Option<&str>) {
        self.told.clear();
        self.hive = None;
        match agent {
            Some(a) => {
                self.agents.remove(a);
            }
            None => self.agents.clear(),
        }
    }
}

/// The notices of `budget_notices` besides the 80 % and 100 % ones: a scope
/// whose spend cannot be added up (once per window), a run kept clamped
/// (once per agent and UTC day).
const NOTICE_UNSUMMABLE: u32 = 0;
const NOTICE_CLAMPED: u32 = 1;

/// One scope's budget and spend in its current window.
struct Standing {
    budget: Budget,
    start: i64,
    end: i64,
    sums: Kept,
}

impl Standing {
    fn new(budget: Budget, (start, end): (i64, i64), sums: Kept) -> Standing {
        Standing {
            budget,
            start,
            end,
            sums,
        }
    }

    /// The sums, or nothing spent when they cannot be had (`reached` holds
    /// the scope then).
    fn spent(&self) -> Sums {
        self.sums.clone().unwrap_or_default()
    }

    /// The larger of the two shares of the budget spent (0 without limits).
    fn share(&self) -> f64 {
        let s = self.spent();
        let u = self
            .budget
            .usd
            .map_or(0.0, |l| if l <= 0.0 { f64::INFINITY } else { s.usd / l });
        let t = self.budget.tokens.map_or(0.0, |l| {
            if l == 0 {
                f64::INFINITY
            } else {
                s.tokens as f64 / l as f64
            }
        });
        u.max(t)
    }

    /// Sums of cents in binary floating point fall a hair short (0.04 of
    /// 0.05 is 0.7999…): shares are compared with this slack.
    const SLACK: f64 = 1e-9;

    /// The budget is reached, or the spend cannot be added up: a check that
    /// fails holds the scope's agents (it fails closed).
    fn reached(&self) -> bool {
        self.sums.is_err() || self.share() >= 1.0 - Self::SLACK
    }

    fn near(&self) -> bool {
        self.share() >= 0.8 - Self::SLACK
    }

    /// "$5.00 of $5.00 today" (or the tokens, when that limit is the nearer).
    fn figures(&self) -> String {
        let word = window_word(&self.budget.per);
        let s = match &self.sums {
            Ok(s) => s,
            Err(e) => return format!("its spend {word} cannot be added up ({e})"),
        };
        let usd_share = self.budget.usd.map(|l| s.usd / l.max(f64::MIN_POSITIVE));
        let tok_share = self
            .budget
            .tokens
            .map(|l| s.tokens as f64 / (l.max(1)) as f64);
        let unknown = if s.unknown > 0 {
            format!(" ({} runs of unknown cost)", s.unknown)
        } else {
            String::new()
        };
        match (usd_share, tok_share, self.budget.usd, self.budget.tokens) {
            (_, Some(t), _, Some(l)) if usd_share.is_none_or(|u| t > u) => {
                format!("{} of {l} tokens {word}", s.tokens)
            }
            (_, _, Some(l), _) => format!("${:.2} of ${l:.2} {word}{unknown}", s.usd),
            _ => format!("${:.2} {word}", s.usd),
        }
    }
}

impl Hub<'_> {
    /// The standing of `agent`'s budget, or of the hive's (`None`); `None`
    /// without a budget.
    fn standing(&mut self, agent: Option<&str>, t: i64) -> Option<Standing> {
        let budget = match agent {
            Some(a) => self.cfg.agent(a).and_then(|e| e.budget.clone()),
            None => self.cfg.budget.clone(),
        }?;
        let w = window(&budget.per, t);
        let sums = self.spent_since(agent, w.0);
        Some(Standing::new(budget, w, sums))
    }

    /// What `scope` spent since `start`: kept ([`Spent`]), or read from the
    /// store and kept — an error too, so a failed check is not a scan per
    /// ask.
    fn spent_since(&mut self, scope: Option<&str>, start: i64) -> Kept {
        if let Some((from, sums)) = self.pools.spent.get(scope) {
            if *from == start {
                return sums.clone();
            }
        }
        let sums = match self.db.spend_since(scope, start) {
            Ok(Ok(t)) => Ok(Sums::from_store(t)),
            Ok(Err(e)) => Err(e),
            Err(e) => Err(db_err(e)),
        };
        if let Err(e) = &sums {
            log::error!(
                "the spend of {} cannot be added up: {e}",
                scope.unwrap_or("the hive")
            );
        }
        self.pools.spent.set(scope, start, sums.clone());
        sums
    }

    /// The budget pause of `agent`, if its own or the hive's budget is
    /// reached, or its spend cannot be added up (the check fails closed);
    /// the hub's timer is set to the window's end.
    pub(super) fn budget_pause(&mut self, agent: &str) -> Option<Paused> {
        let t = now();
        for scope in [Some(agent), None] {
            let Some(s) = self.standing(scope, t) else {
                continue;
            };
            if !s.reached() {
                continue;
            }
            self.pools.budget_wake = Some(self.pools.budget_wake.map_or(s.end, |w| w.min(s.end)));
            let whose = if scope.is_some() { "" } else { "the hive's " };
            let detail = match &s.sums {
                Ok(_) => format!("{whose}budget reached · {}", s.figures()),
                Err(e) => {
                    self.unsummable(scope, &s, e, t);
                    format!(
                        "{whose}budget held: {} (hive budget void {})",
                        s.figures(),
                        scope.unwrap_or("--hive")
                    )
                }
            };
            return Some(Paused {
                reason: PauseReason::Budget,
                until: Some(s.end),
                detail,
            });
        }
        None
    }

    /// Tells the operator, once per scope and window, that `scope`'s spend
    /// cannot be added up and its budget holds its agents.
    fn unsummable(&mut self, scope: Option<&str>, s: &Standing, e: &str, t: i64) {
        let name = scope.unwrap_or("hive");
        if !self.pools.spent.told.insert((name.to_string(), s.start)) {
            return;
        }
        match self.db.budget_notice(name, s.start, NOTICE_UNSUMMABLE) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                log::error!("cannot record a budget notice of {name}: {e}");
                return;
            }
        }
        let (whose, who) = match scope {
            Some(a) => (a.to_string(), "it starts no new run"),
            None => ("the hive".to_string(), "no agent starts a new run"),
        };
        let body = format!(
            "[budget] the spend of {whose} {} cannot be added up ({e}), so its budget cannot \
             be checked: {who} until the window ends at {} or `hive budget void {}` removes \
             the window's spend rows (a check that fails holds the agents; `hive budget` shows \
             the scope)",
            window_word(&s.budget.per),
            crate::proto::text::clock(s.end, t),
            scope.unwrap_or("--hive")
        );
        log::error!("{body}");
        if let Err(e) = self.tell("operator", MsgKind::Budget, &body) {
            log::error!("cannot tell the operator that a budget cannot be checked: {e}");
        }
    }

    /// `report_spend`: keeps the row (once per key, clamped to the per-run
    /// bounds) at the run's end (`at`; its arrival for a harness that does
    /// not say), then the notices of the windows it changed: a row of a
    /// window already past counts there only, and tells nobody.
    pub(super) fn report_spend(&mut self, agent: &str, c: ReportSpend) -> Result<Empty, String> {
        let t = now();
        // The minute of slack `validate` allows ahead is this window's.
        let at = c.at.map_or(t, |a| a.min(t));
        let row = c.bounded();
        let new = self
            .db
            .insert_spend(&c.key, agent, at, &row)
            .map_err(db_err)?;
        if !new {
            return Ok(Empty {});
        }
        if row.clamped {
            self.clamped(agent, &c, &row, t)?;
        }
        self.pools.spent.add(agent, at, &row);
        for scope in [Some(agent), None] {
            let Some(s) = self.standing(scope, t) else {
                continue;
            };
            if at < s.start {
                // Its own window is over: the current one did not change.
                continue;
            }
            if let Err(e) = &s.sums {
                self.unsummable(scope, &s, e, t);
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
                     or the budget is raised (hive budget set){}",
                    s.figures(),
                    if scope.is_some() {
                        "it starts no new run"
                    } else {
                        "no agent starts a new run"
                    },
                    crate::proto::text::clock(s.end, t),
                    if scope.is_none() {
                        format!(" · the run that reached it was {agent}'s")
                    } else {
                        String::new()
                    }
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

    /// A run of `agent`'s was reported over a per-run bound and kept
    /// clamped: logged (throttled), and the operator told once per agent
    /// and UTC day, naming the reporter.
    fn clamped(
        &mut self,
        agent: &str,
        c: &ReportSpend,
        row: &Bounded,
        t: i64,
    ) -> Result<(), String> {
        let reported = format!(
            "{}, {} tokens, {} cache reads",
            c.usd
                .map_or_else(|| "cost unknown".into(), |u| format!("${u:.2}")),
            c.tokens,
            c.cache_read
        );
        self.throttled(
            log::Level::Warn,
            agent,
            Kind::SpendClamped,
            format!(
                "{agent} reported a run over the per-run bounds ({reported}; key {}); kept clamped",
                c.key
            ),
        );
        let day = window(&Per::Day, t).0;
        if !self
            .db
            .budget_notice(agent, day, NOTICE_CLAMPED)
            .map_err(db_err)?
        {
            return Ok(());
        }
        let body = format!(
            "[budget] {agent} reported a run over the per-run bounds ({reported}); it is kept \
             as {}, {} tokens, {} cache reads, and flagged (`hive budget` counts such runs). \
             The harness reports no such run: another process on {agent}'s socket may be \
             reporting spend. `hive budget void {agent}` removes its rows of this window. \
             (Told once a day.)",
            row.usd
                .map_or_else(|| "cost unknown".into(), |u| format!("${u:.2}")),
            row.tokens,
            row.cache_read
        );
        self.tell("operator", MsgKind::Budget, &body)?;
        Ok(())
    }

    /// `budget`: the hive's row, then every agent's.
    pub(super) fn get_budget(&mut self) -> Result<BudgetReport, String> {
        let t = now();
        let names: Vec<Option<String>> = std::iter::once(None)
            .chain(self.cfg.agents.iter().map(|a| Some(a.name.clone())))
            .collect();
        let rows = names
            .iter()
            .map(|scope| self.budget_row(scope.as_deref(), t))
            .collect();
        Ok(BudgetReport { rows })
    }

    /// `own_budget`: the hive's row, then the calling agent's.
    pub(super) fn own_budget(&mut self, agent: &str) -> Result<BudgetReply, String> {
        let t = now();
        Ok(BudgetReply {
            rows: vec![
                self.budget_row(None, t).row,
                self.budget_row(Some(agent), t).row,
            ],
        })
    }

    /// One scope's row of `budget`: its window's spend against its budget,
    /// or the day's spend when it has none.
    fn budget_row(&mut self, scope: Option<&str>, t: i64) -> ScopeReport {
        let s = match self.standing(scope, t) {
            Some(s) => s,
            None => {
                // No budget: the day's spend, for the record.
                let w = window(&Per::Day, t);
                let sums = self.spent_since(scope, w.0);
                let budget = Budget {
                    usd: None,
                    tokens: None,
                    per: Per::Day,
                };
                Standing::new(budget, w, sums)
            }
        };
        let spent = s.spent();
        let limited = s.budget.usd.is_some() || s.budget.tokens.is_some();
        ScopeReport {
            row: BudgetRow {
                scope: scope.unwrap_or("hive").to_string(),
                per: s.budget.per,
                window_start: s.start,
                window_end: s.end,
                spent_usd: spent.usd,
                unknown_runs: spent.unknown,
                tokens: spent.tokens,
                cache_read: spent.cache_read,
                usd: s.budget.usd,
                budget_tokens: s.budget.tokens,
                reached: limited && s.reached(),
            },
            clamped_runs: spent.clamped,
            error: s.sums.err(),
        }
    }

    /// `void_spend`: the scope's spend rows of its current window go (its
    /// budget's window, the day's without one), logged and told; its sums
    /// are read again at the next check, and every parked agent looks again.
    pub(super) fn void_spend(&mut self, c: VoidSpend) -> Result<VoidReply, String> {
        let scope = c.agent.as_deref();
        if let Some(a) = scope {
            self.check_agent(a)?;
        }
        let t = now();
        let per = match scope {
            Some(a) => self.cfg.agent(a).and_then(|e| e.budget.as_ref()),
            None => self.cfg.budget.as_ref(),
        }
        .map_or(Per::Day, |b| b.per);
        let (start, end) = window(&per, t);
        let voided = self.db.void_spend(scope, start).map_err(db_err)?;
        self.pools.spent.forget(scope);
        let whose = scope.map_or_else(|| "the hive (every agent)".to_string(), str::to_string);
        let text = format!(
            "the spend of {whose} {} is voided: {voided} run rows since {} removed; its \
             budget counts from zero",
            window_word(&per),
            crate::proto::text::fmt_time(start)
        );
        log::warn!("the operator voided spend: {text}");
        self.tell("operator", MsgKind::Budget, &format!("[budget] {text}"))?;
        self.wake_all();
        Ok(VoidReply {
            scope: scope.unwrap_or("hive").to_string(),
            window_start: start,
            window_end: end,
            voided,
            text,
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
            let patch = budget_patch(new.as_ref());
            let (_, entry) = self.patched(&agent, &patch)?;
            if entry.budget != new {
                // The merge rule must give what was asked: say so rather
                // than report a budget that did not change (issue 40).
                return Err(format!(
                    "set_budget: the fleet entry of {agent} would have the budget {}, not the one \
                     asked for ({}); nothing was changed (a broker bug: please report it)",
                    serde_json::to_string(&entry.budget).unwrap_or_default(),
                    serde_json::to_string(&new).unwrap_or_default()
                ));
            }
            let work = self.entry_work(&agent, patch.clone())?;
            return Ok(Done::Then(
                Identity::Operator,
                Box::new(move || {
                    Ok(Followup::Budget {
                        agent: Some(agent),
                        patch,
                        hive: None,
                        result: work(),
                    })
                }),
            ));
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
        Ok(Done::Then(
            Identity::Operator,
            Box::new(move || {
                let result = fleetfile::apply_hive_budget(&path, base.as_ref(), new.as_ref())
                    .map(|_| "the hive's budget is in the fleet file".to_string());
                Ok(Followup::Budget {
                    agent: None,
                    patch: Value::Null,
                    hive: Some(new),
                    result,
                })
            }),
        ))
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

/// The merge patch of an agent's entry that makes its budget `new`: every
/// limit named, a removed one as `null` (a merge patch keeps a key it
/// omits, so leaving a removed limit out kept it: robustness review N7), and
/// the whole key `null` when no limit is left.
fn budget_patch(new: Option<&Budget>) -> Value {
    match new {
        None => json!({ "budget": null }),
        Some(b) => json!({ "budget": { "usd": b.usd, "tokens": b.tokens, "per": b.per } }),
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
        let budget = Budget {
            usd: Some(5.0),
            tokens: None,
            per: Per::Day,
        };
        let sums = Sums {
            usd: 5.0,
            tokens: 10,
            ..Sums::default()
        };
        let s = Standing::new(budget.clone(), (0, 86_400), Ok(sums));
        assert!(s.reached());
        assert_eq!(s.figures(), "$5.00 of $5.00 today");
        // Spend that cannot be added up holds the scope, and says why.
        let s = Standing::new(budget, (0, 86_400), Err("past 2^64".into()));
        assert!(s.reached());
        assert_eq!(
            s.figures(),
            "its spend today cannot be added up (past 2^64)"
        );
    }

    /// The in-memory sums are checked: a row that would carry a count past
    /// 2^64 is an error, and the sums stay as they were (a wrapped sum
    /// would read as a small spend and let every agent run).
    #[test]
    fn a_sum_past_two_to_the_64_is_an_error_not_a_wrap() {
        let row = |tokens: u64, cache_read: u64| Bounded {
            usd: Some(1.0),
            tokens,
            cache_read,
            clamped: false,
        };
        let mut s = Sums {
            tokens: u64::MAX - 5,
            ..Sums::default()
        };
        s.add(&row(5, 0)).unwrap();
        assert_eq!(s.tokens, u64::MAX);
        let before = s;
        let e = s.add(&row(1, 0)).unwrap_err();
        assert!(e.contains("tokens") && e.contains("2^64"), "{e}");
        assert_eq!(s, before, "nothing half-added");
        let mut s = Sums {
            cache_read: u64::MAX,
            ..Sums::default()
        };
        assert!(s.add(&row(0, 1)).unwrap_err().contains("cache reads"));
        // The kept sums of each scope the row is in become that scope's
        // error; another agent's stay.
        let mut spent = Spent::default();
        let near = Sums {
            tokens: u64::MAX - 1,
            ..Sums::default()
        };
        spent.set(None, 0, Ok(Sums::default()));
        spent.set(Some("ana"), 0, Ok(near));
        spent.set(Some("bob"), 0, Ok(near));
        spent.add("ana", 10, &row(2, 0));
        assert!(spent.get(Some("ana")).unwrap().1.is_err());
        assert_eq!(spent.get(Some("bob")).unwrap().1, Ok(near));
        assert_eq!(spent.get(None).unwrap().1.clone().unwrap().tokens, 2);
    }

    /// Each limit removed is `null` in the patch, so the merge removes it;
    /// no limit left removes the key.
    #[test]
    fn a_removed_limit_is_null_in_the_merge_patch() {
        let cases = [
            (
                Budget {
                    usd: None,
                    tokens: Some(100),
                    per: Per::Week,
                },
                json!({"budget": {"usd": null, "tokens": 100, "per": "week"}}),
            ),
            (
                Budget {
                    usd: Some(5.0),
                    tokens: None,
                    per: Per::Day,
                },
                json!({"budget": {"usd": 5.0, "tokens": null, "per": "day"}}),
            ),
        ];
        for (b, patch) in cases {
            assert_eq!(budget_patch(Some(&b)), patch);
        }
        assert_eq!(budget_patch(None), json!({"budget": null}));
    }
}
