//! `GET /metrics` in the Prometheus text format (`docs/observability.md`,
//! *Metrics*, lists every family): turn counts, durations, tokens by type
//! and cost per kind and outcome from the turn-stats db (the outcome label is
//! always one of the closed [`TurnOutcomeKind`]s, whatever the db holds), the
//! turn ends by outcome and decision and the pauses by reason with the
//! seconds paused (the harness's bus counts both since it started), the live
//! gauges of the harness, the number of SSE clients, the turns stopped
//! because one of hive's MCP servers did not start, the seconds spent
//! rate-limited since the harness started, and the agent's and the hive's
//! spend against their budgets in the current window (issue 16), from the
//! broker's `own_budget` through a [`BudgetCache`]: asked at most once per
//! [`BUDGET_TTL`] and waited for at most [`BUDGET_TIMEOUT`], so the page
//! never hangs on the broker; `hive_budget_up` says whether the figures are
//! there. Every family is a row of [`FAMILIES`] (its type and help, in
//! `http::prometheus`, which the dashboard's hive-wide `/metrics` also reads
//! to take a page's families in, and nothing else); [`Expo`] writes a
//! family's samples together, with its HELP and TYPE, as `promtool check
//! metrics` wants.

use super::harness::{Gauges, TurnPhase, TurnTotals};
pub use crate::http::prometheus::*;
use crate::proto::cmd::{BudgetReply, OwnBudget};
use crate::proto::{PauseReason, TurnOutcomeKind};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long the broker's `own_budget` answer (or its absence) is reused.
pub const BUDGET_TTL: Duration = Duration::from_secs(10);

/// How long `/metrics` waits for the broker's answer.
pub const BUDGET_TIMEOUT: Duration = Duration::from_secs(2);

/// The broker's last `own_budget` answer, `None` when it did not answer.
#[derive(Default)]
pub struct BudgetCache {
    last: Mutex<Option<(Instant, Option<BudgetReply>)>>,
}

impl BudgetCache {
    /// The budget rows, asked from the broker on `socket` when the cached
    /// ones are older than [`BUDGET_TTL`].
    pub fn get(&self, broker: &crate::proto::Dial) -> Option<BudgetReply> {
        if let Some((at, r)) = &*self.last.lock().unwrap_or_else(|p| p.into_inner()) {
            if at.elapsed() < BUDGET_TTL {
                return r.clone();
            }
        }
        let r = ask_budget(broker);
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), r.clone()));
        r
    }
}

fn ask_budget(broker: &crate::proto::Dial) -> Option<BudgetReply> {
    let ask = || -> Result<BudgetReply, String> {
        let mut c = broker.connect().map_err(|e| e.to_string())?;
        c.set_read_timeout(Some(BUDGET_TIMEOUT))
            .map_err(|e| e.to_string())?;
        c.call(&OwnBudget {}).map_err(|e| e.to_string())
    };
    ask()
        .map_err(|e| log::debug!("/metrics: no budget figures from the broker: {e}"))
        .ok()
}

/// The totals with each outcome read as its closed kind, rows that come to the
/// same (kind, outcome kind) added up: a db an older harness wrote holds free
/// text there, and no such text may become a label.
fn by_outcome_kind(totals: &[TurnTotals]) -> Vec<TurnTotals> {
    let mut out: Vec<TurnTotals> = Vec::new();
    for t in totals {
        let outcome = TurnOutcomeKind::from_stored(&t.outcome).0.as_str();
        match out
            .iter_mut()
            .find(|o| o.kind == t.kind && o.outcome == outcome)
        {
            Some(o) => {
                o.count += t.count;
                o.duration_ms += t.duration_ms;
                o.tokens_in += t.tokens_in;
                o.tokens_out += t.tokens_out;
                o.cache_read += t.cache_read;
                o.cache_creation += t.cache_creation;
                o.cost_usd += t.cost_usd;
            }
            None => out.push(TurnTotals {
                outcome: outcome.to_string(),
                ..t.clone()
            }),
        }
    }
    out
}

/// The spend and budget families: one series per scope (`agent`, the
/// page's own; `hive`) of the broker's `own_budget` rows.
fn render_budget(o: &mut Expo, budget: Option<&BudgetReply>) {
    o.sample(&BUDGET_UP, &[], f64::from(u8::from(budget.is_some())));
    let Some(b) = budget else {
        return;
    };
    let rows = b.rows.iter().map(|r| {
        let scope = if r.scope == "hive" { "hive" } else { "agent" };
        (vec![("scope", scope.to_string())], r)
    });
    render_budget_rows(o, rows);
    let paused = b.rows.iter().any(|r| r.reached);
    o.sample(&PAUSED_BY_BUDGET, &[], f64::from(u8::from(paused)));
}

/// The whole exposition.
pub fn render(
    totals: &[TurnTotals],
    state: &Gauges,
    sse_clients: usize,
    budget: Option<&BudgetReply>,
) -> String {
    let mut o = Expo::default();
    type PerTurn = (&'static Family, fn(&TurnTotals) -> f64);
    let per_turn: [PerTurn; 3] = [
        (&TURNS, |t| t.count as f64),
        (&TURN_SECONDS, |t| t.duration_ms as f64 / 1000.0),
        (&COST, |t| t.cost_usd),
    ];
    let totals = by_outcome_kind(totals);
    for (f, get) in per_turn {
        o.family(f);
        for t in &totals {
            o.sample(f, &[("kind", &t.kind), ("outcome", &t.outcome)], get(t));
        }
    }
    o.family(&TOKENS);
    for t in &totals {
        for (ty, n) in [
            ("input", t.tokens_in),
            ("output", t.tokens_out),
            ("cache_read", t.cache_read),
            ("cache_creation", t.cache_creation),
        ] {
            o.sample(
                &TOKENS,
                &[("kind", &t.kind), ("outcome", &t.outcome), ("type", ty)],
                n as f64,
            );
        }
    }
    o.family(&DECISIONS);
    for (outcome, decision, n) in &state.counted.turn_ends {
        o.sample(
            &DECISIONS,
            &[("outcome", outcome), ("decision", decision)],
            *n as f64,
        );
    }
    o.family(&PAUSES);
    o.family(&PAUSED_SECONDS);
    for (reason, n, secs) in &state.counted.pauses {
        o.sample(&PAUSES, &[("reason", reason)], *n as f64);
        o.sample(&PAUSED_SECONDS, &[("reason", reason)], *secs);
    }
    for reason in PauseReason::KNOWN.iter().copied().chain(["other"]) {
        let on = state.counted.paused.as_deref() == Some(reason);
        o.sample(&PAUSED, &[("reason", reason)], f64::from(u8::from(on)));
    }
    o.sample(&RATE_LIMITED_SECONDS, &[], state.rate_limited_seconds);
    o.family(&MCP_START_FAILURES);
    for (server, n) in &state.mcp_start_failures {
        o.sample(&MCP_START_FAILURES, &[("server", server)], *n as f64);
    }
    let gauges: [(&'static Family, f64); 7] = [
        (&UNREAD, state.unread as f64),
        (&INFLIGHT, f64::from(u8::from(state.inflight))),
        (&SSE_CLIENTS, sse_clients as f64),
        (&RATE_LIMITED, f64::from(u8::from(state.rate_limited))),
        (&NEEDS_LOGIN, f64::from(u8::from(state.needs_login))),
        (&ONLINE, f64::from(u8::from(state.online))),
        (&CONTEXT_WINDOW, state.context_window_tokens as f64),
    ];
    for (f, v) in gauges {
        o.sample(f, &[], v);
    }
    if let Some(t) = state.context_tokens {
        o.sample(&CONTEXT, &[], t as f64);
    }
    for phase in TurnPhase::ALL {
        o.sample(
            &TURN_STATE,
            &[("state", phase.name())],
            f64::from(u8::from(state.phase == phase)),
        );
    }
    render_budget(&mut o, budget);
    o.text()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::cmd::BudgetRow;

    #[test]
    fn renders_families_with_escaped_labels() {
        let mut gauges = Gauges {
            phase: TurnPhase::Idle,
            unread: 0,
            inflight: false,
            rate_limited: false,
            rate_limited_seconds: 0.0,
            needs_login: false,
            online: true,
            context_window_tokens: 200_000,
            context_tokens: None,
            mcp_start_failures: vec![("hyperhive".into(), 0), ("bash".into(), 0)],
            counted: Default::default(),
        };
        let totals = [TurnTotals {
            kind: "we\"ird\n".into(),
            outcome: "we\"ird\n".into(),
            count: 2,
            duration_ms: 1500,
            tokens_in: 10,
            tokens_out: 5,
            cache_read: 7,
            cache_creation: 3,
            cost_usd: 0.25,
        }];
        let text = render(&totals, &gauges, 3, None);
        assert!(text.contains("hive_budget_up 0\n"), "{text}");
        assert!(
            !text.contains("hive_spend_usd{"),
            "no figures without the broker"
        );
        assert!(
            text.contains("hive_turns_total{kind=\"we\\\"ird\\n\",outcome=\"other\"} 2\n"),
            "{text}"
        );
        assert!(text.contains(
            "hive_turn_duration_seconds_total{kind=\"we\\\"ird\\n\",outcome=\"other\"} 1.5\n"
        ));
        assert!(text.contains("hive_sse_clients 3\n"));
        assert!(text.contains("hive_mcp_start_failures_total{server=\"bash\"} 0\n"));
        gauges.mcp_start_failures[0].1 = 2;
        let text = render(&totals, &gauges, 3, None);
        assert!(
            text.contains("hive_mcp_start_failures_total{server=\"hyperhive\"} 2\n"),
            "{text}"
        );
        assert!(text.contains("hive_turn_state{state=\"idle\"} 1\n"));
    }

    #[test]
    fn decisions_pauses_and_token_types_have_their_series() {
        let gauges = Gauges {
            phase: TurnPhase::Thinking,
            unread: 0,
            inflight: true,
            rate_limited: false,
            rate_limited_seconds: 0.0,
            needs_login: false,
            online: true,
            context_window_tokens: 200_000,
            context_tokens: Some(10),
            mcp_start_failures: Vec::new(),
            counted: crate::web::harness::Counted {
                turn_ends: vec![("ok".into(), "ack".into(), 3)],
                pauses: vec![("budget".into(), 2, 1.5)],
                paused: Some("budget".into()),
            },
        };
        let totals = [TurnTotals {
            kind: "turn".into(),
            outcome: "ok".into(),
            count: 1,
            duration_ms: 10,
            tokens_in: 1,
            tokens_out: 2,
            cache_read: 3,
            cache_creation: 4,
            cost_usd: 0.5,
        }];
        let text = render(&totals, &gauges, 0, None);
        for want in [
            "hive_turn_decisions_total{outcome=\"ok\",decision=\"ack\"} 3\n",
            "hive_pauses_total{reason=\"budget\"} 2\n",
            "hive_paused_seconds_total{reason=\"budget\"} 1.5\n",
            "hive_paused{reason=\"budget\"} 1\n",
            "hive_paused{reason=\"login\"} 0\n",
            "hive_tokens_total{kind=\"turn\",outcome=\"ok\",type=\"cache_creation\"} 4\n",
            "hive_tokens_total{kind=\"turn\",outcome=\"ok\",type=\"cache_read\"} 3\n",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        // Every family once, with HELP and TYPE before its samples.
        for f in FAMILIES
            .iter()
            .filter(|f| text.contains(&format!("\n{} ", f.name)))
        {
            assert_eq!(
                text.matches(&format!("# TYPE {} ", f.name)).count(),
                1,
                "{}",
                f.name
            );
        }
        assert_eq!(
            [
                None,
                Some("ack with a note"),
                Some("go on: `/compact`"),
                Some("keep; 5 s"),
                Some("??")
            ]
            .map(decision_kind),
            ["none", "ack_interrupted", "proceed", "keep", "other"]
        );
    }

    #[test]
    fn outcome_labels_are_closed_kinds_whatever_the_db_holds() {
        let gauges = Gauges {
            phase: TurnPhase::Idle,
            unread: 0,
            inflight: false,
            rate_limited: false,
            rate_limited_seconds: 0.0,
            needs_login: false,
            online: true,
            context_window_tokens: 200_000,
            context_tokens: None,
            mcp_start_failures: Vec::new(),
            counted: Default::default(),
        };
        let row = |outcome: &str, count| TurnTotals {
            kind: "turn".into(),
            outcome: outcome.into(),
            count,
            duration_ms: 1000,
            tokens_in: 1,
            tokens_out: 1,
            cache_read: 0,
            cache_creation: 0,
            cost_usd: 0.0,
        };
        let totals = [
            row("failed", 1),
            row("failed: claude exited with code 1 without a result line", 2),
            row(
                "failed: claude was killed by signal 9 without a result line",
                3,
            ),
            row("rate limited (resets at 1795323782)", 4),
            row("rate_limited", 5),
        ];
        let text = render(&totals, &gauges, 0, None);
        let series: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("hive_turns_total{"))
            .collect();
        assert_eq!(
            series,
            [
                "hive_turns_total{kind=\"turn\",outcome=\"failed\"} 6",
                "hive_turns_total{kind=\"turn\",outcome=\"rate_limited\"} 9",
            ]
        );
    }

    #[test]
    fn spend_and_budget_gauges_per_scope_and_limits_only_when_set() {
        let gauges = Gauges {
            phase: TurnPhase::Idle,
            unread: 0,
            inflight: false,
            rate_limited: false,
            rate_limited_seconds: 0.0,
            needs_login: false,
            online: true,
            context_window_tokens: 200_000,
            context_tokens: None,
            mcp_start_failures: Vec::new(),
            counted: Default::default(),
        };
        let row = |scope: &str, usd: Option<f64>, reached| BudgetRow {
            scope: scope.into(),
            per: crate::proto::Per::Week,
            window_start: 100,
            window_end: 700,
            spent_usd: 0.05,
            unknown_runs: 1,
            tokens: 550,
            cache_read: 250,
            usd,
            budget_tokens: None,
            reached,
        };
        let b = BudgetReply {
            rows: vec![row("hive", None, false), row("ana", Some(0.05), true)],
        };
        let text = render(&[], &gauges, 0, Some(&b));
        for want in [
            "hive_budget_up 1\n",
            "hive_spend_usd{scope=\"hive\",per=\"week\"} 0.05\n",
            "hive_spend_usd{scope=\"agent\",per=\"week\"} 0.05\n",
            "hive_spend_tokens{scope=\"agent\",per=\"week\"} 550\n",
            "hive_spend_cache_read_tokens{scope=\"agent\",per=\"week\"} 250\n",
            "hive_spend_unknown_cost_runs{scope=\"agent\",per=\"week\"} 1\n",
            "hive_budget_usd{scope=\"agent\",per=\"week\"} 0.05\n",
            "hive_budget_window_end_timestamp_seconds{scope=\"hive\",per=\"week\"} 700\n",
            "hive_budget_reached{scope=\"agent\",per=\"week\"} 1\n",
            "hive_budget_reached{scope=\"hive\",per=\"week\"} 0\n",
            "hive_paused_by_budget 1\n",
            "hive_budget_used_ratio{scope=\"agent\",per=\"week\",limit=\"usd\"} 1\n",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        assert!(
            !text.contains("hive_budget_usd{scope=\"hive\""),
            "no limit, no series"
        );
        assert!(!text.contains("hive_budget_tokens{"), "{text}");
    }
}
