//! `GET /metrics` in the Prometheus text format: turn counts, durations, tokens
//! and cost per kind and outcome from the turn-stats db (the outcome label is
//! always one of the closed [`TurnOutcomeKind`]s, whatever the db holds), the
//! live gauges of the harness, the number of SSE clients, the turns stopped
//! because one of hive's MCP servers did not start, and the seconds spent
//! rate-limited since the harness started (its bus keeps the clock as its state
//! changes), and the agent's
//! and the hive's spend against their budgets in the current window (issue
//! 16), from the broker's `own_budget` through a [`BudgetCache`]: asked at most
//! once per [`BUDGET_TTL`] and waited for at most [`BUDGET_TIMEOUT`], so the
//! page never hangs on the broker; `hive_budget_up` says whether the figures
//! are there.

use super::harness::{Gauges, TurnPhase, TurnTotals};
use crate::proto::cmd::{BudgetReply, BudgetRow, OwnBudget};
use crate::proto::TurnOutcomeKind;
use std::fmt::Write;
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

/// Escapes a label value.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
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
fn render_budget(o: &mut String, budget: Option<&BudgetReply>) {
    family(
        o,
        "hive_budget_up",
        "gauge",
        "1 when the broker answered for the spend and budget figures below.",
    );
    let _ = writeln!(o, "hive_budget_up {}", u8::from(budget.is_some()));
    let Some(b) = budget else {
        return;
    };
    let scoped: Vec<(&str, &BudgetRow)> = b
        .rows
        .iter()
        .map(|r| (if r.scope == "hive" { "hive" } else { "agent" }, r))
        .collect();
    type Figure = (&'static str, &'static str, fn(&BudgetRow) -> Option<f64>);
    let figures: [Figure; 8] = [
        (
            "hive_spend_usd",
            "Dollars spent in the budget's current window (total_cost_usd; the API-equivalent price for subscriptions).",
            |r| Some(r.spent_usd),
        ),
        (
            "hive_spend_tokens",
            "Tokens counted against the budget in the current window (input + cache writes + output).",
            |r| Some(r.tokens as f64),
        ),
        (
            "hive_spend_cache_read_tokens",
            "Cache reads in the current window (shown apart, not counted).",
            |r| Some(r.cache_read as f64),
        ),
        (
            "hive_spend_unknown_cost_runs",
            "Runs in the current window that printed no result line (cost unknown).",
            |r| Some(r.unknown_runs as f64),
        ),
        (
            "hive_budget_usd",
            "The dollar limit per window, when one is set.",
            |r| r.usd,
        ),
        (
            "hive_budget_tokens",
            "The token limit per window, when one is set.",
            |r| r.budget_tokens.map(|t| t as f64),
        ),
        (
            "hive_budget_window_end_seconds",
            "Unix seconds when the current window ends (UTC).",
            |r| Some(r.window_end as f64),
        ),
        (
            "hive_budget_reached",
            "1 when the limit is reached: the scope's agents start no new run.",
            |r| Some(f64::from(u8::from(r.reached))),
        ),
    ];
    for (name, help, get) in figures {
        family(o, name, "gauge", help);
        for (scope, r) in &scoped {
            if let Some(v) = get(r) {
                let _ = writeln!(o, "{name}{{scope=\"{scope}\",per=\"{}\"}} {v}", r.per);
            }
        }
    }
    family(
        o,
        "hive_paused_by_budget",
        "gauge",
        "1 while the agent's or the hive's budget is reached.",
    );
    let paused = b.rows.iter().any(|r| r.reached);
    let _ = writeln!(o, "hive_paused_by_budget {}", u8::from(paused));
}

/// The whole exposition.
pub fn render(
    totals: &[TurnTotals],
    state: &Gauges,
    sse_clients: usize,
    budget: Option<&BudgetReply>,
) -> String {
    let rate_limited_secs = state.rate_limited_seconds;
    let mut o = String::new();
    type Family = (&'static str, &'static str, fn(&TurnTotals) -> f64);
    let per_turn: [Family; 5] = [
        (
            "hive_turns_total",
            "Claude processes run, by kind and outcome.",
            |t| t.count as f64,
        ),
        (
            "hive_turn_duration_seconds_total",
            "Wall-clock seconds of those processes.",
            |t| t.duration_ms as f64 / 1000.0,
        ),
        ("hive_input_tokens_total", "Input tokens they used.", |t| {
            t.tokens_in as f64
        }),
        (
            "hive_output_tokens_total",
            "Output tokens they used.",
            |t| t.tokens_out as f64,
        ),
        (
            "hive_cost_usd_total",
            "Their cost in US dollars as claude reported it.",
            |t| t.cost_usd,
        ),
    ];
    let totals = by_outcome_kind(totals);
    for (name, help, get) in per_turn {
        family(&mut o, name, "counter", help);
        for t in &totals {
            let _ = writeln!(
                o,
                "{name}{{kind=\"{}\",outcome=\"{}\"}} {}",
                label(&t.kind),
                label(&t.outcome),
                get(t)
            );
        }
    }
    family(
        &mut o,
        "hive_rate_limited_seconds_total",
        "counter",
        "Seconds spent parked on a rate limit since the web server started.",
    );
    let _ = writeln!(o, "hive_rate_limited_seconds_total {rate_limited_secs:.3}");
    family(
        &mut o,
        "hive_mcp_start_failures_total",
        "counter",
        "Turns stopped because one of hive's MCP servers was not connected at start.",
    );
    for (server, n) in &state.mcp_start_failures {
        let _ = writeln!(
            o,
            "hive_mcp_start_failures_total{{server=\"{}\"}} {n}",
            label(server)
        );
    }
    let gauges: [(&str, &str, f64); 7] = [
        (
            "hive_unread",
            "Messages waiting in the inbox.",
            state.unread as f64,
        ),
        (
            "hive_inflight",
            "1 while a message is handed out and not yet acked.",
            f64::from(u8::from(state.inflight)),
        ),
        (
            "hive_sse_clients",
            "Connected live-stream clients.",
            sse_clients as f64,
        ),
        (
            "hive_rate_limited",
            "1 while parked on a rate limit.",
            f64::from(u8::from(state.rate_limited)),
        ),
        (
            "hive_needs_login",
            "1 while waiting for credentials.",
            f64::from(u8::from(state.needs_login)),
        ),
        (
            "hive_online",
            "1 while serving with the broker reachable.",
            f64::from(u8::from(state.online)),
        ),
        (
            "hive_context_window_tokens",
            "The context window of the current model.",
            state.context_window_tokens as f64,
        ),
    ];
    for (name, help, v) in gauges {
        family(&mut o, name, "gauge", help);
        let _ = writeln!(o, "{name} {v}");
    }
    if let Some(t) = state.context_tokens {
        family(
            &mut o,
            "hive_context_tokens",
            "gauge",
            "Context size after the last turn.",
        );
        let _ = writeln!(o, "hive_context_tokens {t}");
    }
    family(
        &mut o,
        "hive_turn_state",
        "gauge",
        "1 for the current turn state.",
    );
    for phase in TurnPhase::ALL {
        let _ = writeln!(
            o,
            "hive_turn_state{{state=\"{}\"}} {}",
            phase.name(),
            u8::from(state.phase == phase)
        );
    }
    render_budget(&mut o, budget);
    o
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let totals = [TurnTotals {
            kind: "we\"ird\n".into(),
            outcome: "we\"ird\n".into(),
            count: 2,
            duration_ms: 1500,
            tokens_in: 10,
            tokens_out: 5,
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
        };
        let row = |outcome: &str, count| TurnTotals {
            kind: "turn".into(),
            outcome: outcome.into(),
            count,
            duration_ms: 1000,
            tokens_in: 1,
            tokens_out: 1,
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
            "hive_budget_window_end_seconds{scope=\"hive\",per=\"week\"} 700\n",
            "hive_budget_reached{scope=\"agent\",per=\"week\"} 1\n",
            "hive_budget_reached{scope=\"hive\",per=\"week\"} 0\n",
            "hive_paused_by_budget 1\n",
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
