//! `GET /metrics` in the Prometheus text format: turn counts, durations, tokens
//! and cost per kind and outcome from the turn-stats db (the outcome label is
//! always one of the closed [`TurnOutcomeKind`]s, whatever the db holds), the
//! live gauges of the harness, the number of SSE clients, the turns stopped
//! because one of hive's MCP servers did not start, and the seconds spent
//! rate-limited since this web server started (a [`RateClock`] fed by a thread,
//! `web-rate-clock`, that watches the harness's live stream).

use super::harness::{Gauges, Harness, TurnPhase, TurnTotals};
use crate::proto::TurnOutcomeKind;
use crossbeam_channel::{select, Receiver};
use std::fmt::Write;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Time spent with `rate_limited` set.
#[derive(Default)]
pub struct RateClock {
    inner: Mutex<(Option<Instant>, Duration)>,
}

impl RateClock {
    pub fn observe(&self, rate_limited: bool) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match (g.0, rate_limited) {
            (None, true) => g.0 = Some(Instant::now()),
            (Some(since), false) => {
                g.1 += since.elapsed();
                g.0 = None;
            }
            _ => {}
        }
    }

    pub fn seconds(&self) -> f64 {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (g.1 + g.0.map(|s| s.elapsed()).unwrap_or_default()).as_secs_f64()
    }
}

/// Feeds `clock` from the harness's state at every event of its live stream,
/// until `stop` disconnects (the web server stops).
pub fn watch<H: Harness>(harness: &H, clock: &RateClock, stop: Receiver<()>) {
    clock.observe(harness.gauges().rate_limited);
    let mut last = harness.last_event_id();
    let (_, mut rx) = harness.subscribe(Some(last));
    loop {
        select! {
            recv(rx) -> event => match event {
                Ok(e) => last = H::event_id(&e),
                Err(_) => {
                    // Dropped for falling behind: go on from the newest.
                    last = harness.last_event_id().max(last);
                    rx = harness.subscribe(Some(last)).1;
                }
            },
            recv(stop) -> _ => return,
        }
        clock.observe(harness.gauges().rate_limited);
    }
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

/// The whole exposition.
pub fn render(
    totals: &[TurnTotals],
    state: &Gauges,
    sse_clients: usize,
    rate_limited_secs: f64,
) -> String {
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
        let text = render(&totals, &gauges, 3, 0.0);
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
        let text = render(&totals, &gauges, 3, 0.0);
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
        let text = render(&totals, &gauges, 0, 0.0);
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
    fn the_clock_adds_up_parked_time() {
        let c = RateClock::default();
        c.observe(true);
        std::thread::sleep(Duration::from_millis(30));
        c.observe(false);
        let s = c.seconds();
        assert!(s >= 0.03, "{s}");
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(c.seconds(), s);
    }
}
