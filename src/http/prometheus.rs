//! The Prometheus text format both web servers write (issue 43, item 2;
//! `docs/observability.md`, *Metrics*): [`Expo`], which keeps each family's
//! samples together under its HELP and TYPE and escapes every label value,
//! the [`Family`] rows of everything an agent page writes ([`FAMILIES`]: the
//! page renders them, and the dashboard of `hive up` takes in those of a
//! page's answer and nothing else), the closed labels of a turn's decision
//! and a pause's reason, and the spend and budget families of the broker's
//! budget rows, which the page writes for its own scopes and the dashboard
//! for every scope.

use crate::proto::cmd::BudgetRow;
use crate::proto::PauseReason;
use std::fmt::Write;

/// Escapes a label value.
pub fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample's value as the text format writes it (`+Inf`, `-Inf`, `NaN`).
pub fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

/// Counter or gauge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        }
    }
}

/// One metric family: its name, type and help.
#[derive(Debug, PartialEq, Eq)]
pub struct Family {
    pub name: &'static str,
    pub kind: Kind,
    pub help: &'static str,
}

const fn counter(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Counter,
        help,
    }
}

const fn gauge(name: &'static str, help: &'static str) -> Family {
    Family {
        name,
        kind: Kind::Gauge,
        help,
    }
}

pub const TURNS: Family = counter(
    "hive_turns_total",
    "Claude processes run, by kind and outcome.",
);
pub const TURN_SECONDS: Family = counter(
    "hive_turn_duration_seconds_total",
    "Wall-clock seconds of those processes.",
);
pub const TOKENS: Family = counter(
    "hive_tokens_total",
    "Tokens those processes used, by type: input (uncached), output, cache_read, cache_creation.",
);
pub const COST: Family = counter(
    "hive_cost_usd_total",
    "Their cost in US dollars as claude reported it.",
);
pub const DECISIONS: Family = counter(
    "hive_turn_decisions_total",
    "Runs the turn loop ended since the harness started, by outcome and the loop's decision.",
);
pub const PAUSES: Family = counter(
    "hive_pauses_total",
    "Pauses entered since the harness started, by reason.",
);
pub const PAUSED_SECONDS: Family = counter(
    "hive_paused_seconds_total",
    "Seconds paused since the harness started, by reason.",
);
pub const PAUSED: Family = gauge("hive_paused", "1 for the reason of the pause in force.");
pub const RATE_LIMITED_SECONDS: Family = counter(
    "hive_rate_limited_seconds_total",
    "Seconds spent parked on a rate limit since the web server started.",
);
pub const MCP_START_FAILURES: Family = counter(
    "hive_mcp_start_failures_total",
    "Turns stopped because one of hive's MCP servers was not connected at start.",
);
pub const UNREAD: Family = gauge("hive_unread", "Messages waiting in the inbox.");
pub const INFLIGHT: Family = gauge(
    "hive_inflight",
    "1 while a message is handed out and not yet acked.",
);
pub const SSE_CLIENTS: Family = gauge("hive_sse_clients", "Connected live-stream clients.");
pub const RATE_LIMITED: Family = gauge("hive_rate_limited", "1 while parked on a rate limit.");
pub const NEEDS_LOGIN: Family = gauge("hive_needs_login", "1 while waiting for credentials.");
pub const ONLINE: Family = gauge("hive_online", "1 while serving with the broker reachable.");
pub const CONTEXT_WINDOW: Family = gauge(
    "hive_context_window_tokens",
    "The context window of the current model.",
);
pub const CONTEXT: Family = gauge("hive_context_tokens", "Context size after the last turn.");
pub const TURN_STATE: Family = gauge("hive_turn_state", "1 for the current turn state.");
pub const BUDGET_UP: Family = gauge(
    "hive_budget_up",
    "1 when the broker answered for the spend and budget figures.",
);
pub const SPEND_USD: Family = gauge(
    "hive_spend_usd",
    "Dollars spent in the budget's current window (total_cost_usd; the API-equivalent price for subscriptions).",
);
pub const SPEND_TOKENS: Family = gauge(
    "hive_spend_tokens",
    "Tokens counted against the budget in the current window (input + cache writes + output).",
);
pub const SPEND_CACHE_READ: Family = gauge(
    "hive_spend_cache_read_tokens",
    "Cache reads in the current window (shown apart, not counted).",
);
pub const SPEND_UNKNOWN: Family = gauge(
    "hive_spend_unknown_cost_runs",
    "Runs in the current window that printed no result line (cost unknown).",
);
pub const BUDGET_USD: Family = gauge(
    "hive_budget_usd",
    "The dollar limit per window, when one is set.",
);
pub const BUDGET_TOKENS: Family = gauge(
    "hive_budget_tokens",
    "The token limit per window, when one is set.",
);
pub const BUDGET_WINDOW_END: Family = gauge(
    "hive_budget_window_end_timestamp_seconds",
    "Unix seconds when the current window ends (UTC).",
);
pub const BUDGET_REACHED: Family = gauge(
    "hive_budget_reached",
    "1 when the limit is reached: the scope's agents start no new run.",
);
pub const BUDGET_USED: Family = gauge(
    "hive_budget_used_ratio",
    "Spend over the limit in the current window, per limit (usd, tokens) that is set; 1 is reached.",
);
pub const PAUSED_BY_BUDGET: Family = gauge(
    "hive_paused_by_budget",
    "1 while the agent's or the hive's budget is reached.",
);

/// Every family an agent's page writes, in its order. The dashboard takes
/// in these families of a page's answer and no others.
pub const FAMILIES: &[&Family] = &[
    &TURNS,
    &TURN_SECONDS,
    &TOKENS,
    &COST,
    &DECISIONS,
    &PAUSES,
    &PAUSED_SECONDS,
    &PAUSED,
    &RATE_LIMITED_SECONDS,
    &MCP_START_FAILURES,
    &UNREAD,
    &INFLIGHT,
    &SSE_CLIENTS,
    &RATE_LIMITED,
    &NEEDS_LOGIN,
    &ONLINE,
    &CONTEXT_WINDOW,
    &CONTEXT,
    &TURN_STATE,
    &BUDGET_UP,
    &SPEND_USD,
    &SPEND_TOKENS,
    &SPEND_CACHE_READ,
    &SPEND_UNKNOWN,
    &BUDGET_USD,
    &BUDGET_TOKENS,
    &BUDGET_WINDOW_END,
    &BUDGET_REACHED,
    &BUDGET_USED,
    &PAUSED_BY_BUDGET,
];

/// The budget families: a page writes its agent's and its hive's; the
/// dashboard writes every scope's from the broker instead.
pub const BUDGET_FAMILIES: &[&Family] = &[
    &BUDGET_UP,
    &SPEND_USD,
    &SPEND_TOKENS,
    &SPEND_CACHE_READ,
    &SPEND_UNKNOWN,
    &BUDGET_USD,
    &BUDGET_TOKENS,
    &BUDGET_WINDOW_END,
    &BUDGET_REACHED,
    &BUDGET_USED,
    &PAUSED_BY_BUDGET,
];

/// An exposition being written: each family's samples kept together, in
/// the order the families were first used, each with its HELP and TYPE.
#[derive(Default)]
pub struct Expo {
    families: Vec<(&'static Family, String)>,
}

impl Expo {
    /// Declares `f` (HELP and TYPE are written even with no sample).
    pub fn family(&mut self, f: &'static Family) -> &mut String {
        let i = match self.families.iter().position(|(g, _)| g.name == f.name) {
            Some(i) => i,
            None => {
                self.families.push((f, String::new()));
                self.families.len() - 1
            }
        };
        &mut self.families[i].1
    }

    /// One sample of `f` with `labels` (escaped here).
    pub fn sample(&mut self, f: &'static Family, labels: &[(&str, &str)], v: f64) {
        let out = self.family(f);
        out.push_str(f.name);
        if !labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{k}=\"{}\"", label(v));
            }
            out.push('}');
        }
        let _ = writeln!(out, " {}", value(v));
    }

    /// The text.
    pub fn text(&self) -> String {
        let mut o = String::new();
        for (f, samples) in &self.families {
            let _ = writeln!(o, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(o, "# TYPE {} {}", f.name, f.kind.name());
            o.push_str(samples);
        }
        o
    }
}

/// The decision of a turn end as a closed label, from the turn loop's words
/// for it (`policy::describe`): `ack`, `ack_interrupted`, `dead_letter`,
/// `ack_turn_budget`, `proceed`, `note`, `retry_now`,
/// `compact_then_retry`, `fresh_session`, `keep`; `none` when the loop did
/// not decide (the harness stopped), `other` for words this release does
/// not know.
pub fn decision_kind(text: Option<&str>) -> &'static str {
    let Some(t) = text else {
        return "none";
    };
    match t {
        "ack" => "ack",
        "ack with a note" => "ack_interrupted",
        "dead-letter" => "dead_letter",
        "ack; tell parent" => "ack_turn_budget",
        "note" => "note",
        "retry at once" => "retry_now",
        "`/compact`, retry" => "compact_then_retry",
        _ if t.starts_with("go on") => "proceed",
        _ if t.starts_with("fresh session") => "fresh_session",
        _ if t.starts_with("keep") => "keep",
        _ => "other",
    }
}

/// A pause's reason as a label: a known [`PauseReason`], else `other`.
pub fn pause_kind(reason: &str) -> &'static str {
    PauseReason::KNOWN
        .iter()
        .find(|k| **k == reason)
        .copied()
        .unwrap_or("other")
}

/// The spend and budget families of `rows`, each series labelled with
/// `scope_labels(row)` and `per`.
pub fn render_budget_rows<'r>(
    o: &mut Expo,
    rows: impl Iterator<Item = (Vec<(&'static str, String)>, &'r BudgetRow)> + Clone,
) {
    type Figure = (&'static Family, fn(&BudgetRow) -> Option<f64>);
    let figures: [Figure; 8] = [
        (&SPEND_USD, |r| Some(r.spent_usd)),
        (&SPEND_TOKENS, |r| Some(r.tokens as f64)),
        (&SPEND_CACHE_READ, |r| Some(r.cache_read as f64)),
        (&SPEND_UNKNOWN, |r| Some(r.unknown_runs as f64)),
        (&BUDGET_USD, |r| r.usd),
        (&BUDGET_TOKENS, |r| r.budget_tokens.map(|t| t as f64)),
        (&BUDGET_WINDOW_END, |r| Some(r.window_end as f64)),
        (&BUDGET_REACHED, |r| Some(f64::from(u8::from(r.reached)))),
    ];
    for (f, get) in figures {
        o.family(f);
        for (labels, r) in rows.clone() {
            if let Some(v) = get(r) {
                let mut l: Vec<(&str, &str)> =
                    labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                let per = r.per.to_string();
                l.push(("per", per.as_str()));
                o.sample(f, &l, v);
            }
        }
    }
    o.family(&BUDGET_USED);
    for (labels, r) in rows {
        let per = r.per.to_string();
        let per = per.as_str();
        let ratios = [
            ("usd", r.usd.map(|u| (r.spent_usd, u))),
            (
                "tokens",
                r.budget_tokens.map(|t| (r.tokens as f64, t as f64)),
            ),
        ];
        for (limit, figures) in ratios {
            if let Some((spent, max)) = figures.filter(|(_, max)| *max > 0.0) {
                let mut l: Vec<(&str, &str)> =
                    labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                l.push(("per", per));
                l.push(("limit", limit));
                o.sample(&BUDGET_USED, &l, spent / max);
            }
        }
    }
}
