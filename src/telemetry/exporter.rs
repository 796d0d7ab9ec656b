//! The one exporter thread (`otlp-export`): it owns the HTTP client, the
//! resource and the receiving end of a bounded queue of finished spans, and
//! POSTs what it finds queued as one OTLP/HTTP JSON request, then waits for
//! more. [`Exporter::offer`] never waits: when the queue is full the spans
//! are dropped and counted, and so are the spans of a request the collector
//! did not take (unreachable, slow past the timeout, or refusing). Nothing
//! is retried: a turn's span is worth less than the turn. The count is
//! process-wide ([`dropped_total`]) for the metrics and the logs.

use super::otlp::{self, Resource};
use super::span::Span;
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How many batches (one run's spans each) may wait for the thread.
pub const QUEUE_BATCHES: usize = 256;

/// The most spans one request carries.
pub const MAX_SPANS_PER_REQUEST: usize = 512;

/// How long one request may take, connecting included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

static DROPPED: AtomicU64 = AtomicU64::new(0);
static EXPORTED: AtomicU64 = AtomicU64::new(0);

/// Spans this process dropped (queue full, or the collector did not take
/// them), since it started.
pub fn dropped_total() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// Spans this process's collector accepted, since it started.
pub fn exported_total() -> u64 {
    EXPORTED.load(Ordering::Relaxed)
}

fn drop_spans(n: usize, why: &str) {
    let total = DROPPED.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
    log::warn!("telemetry: {n} span(s) dropped ({why}); {total} dropped since start");
}

/// The sending side: cheap to clone, never blocks.
#[derive(Clone)]
pub struct Exporter {
    tx: Sender<Vec<Span>>,
    done: Arc<Receiver<()>>,
}

impl Exporter {
    /// Starts the thread for `cfg`'s endpoint; None without one (no thread
    /// runs then).
    pub fn start(cfg: &super::Config, resource: Resource) -> Result<Option<Exporter>, String> {
        let Some(url) = cfg.endpoint.clone() else {
            return Ok(None);
        };
        let (tx, rx) = bounded::<Vec<Span>>(QUEUE_BATCHES);
        let (done_tx, done) = bounded::<()>(1);
        let headers = cfg.headers.clone();
        std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                run(&url, &headers, &resource, rx);
                let _ = done_tx.send(());
            })
            .map_err(|e| format!("cannot start the OTLP exporter thread: {e}"))?;
        log::info!("telemetry: exporting traces to {}", shown(&cfg.endpoint));
        Ok(Some(Exporter {
            tx,
            done: Arc::new(done),
        }))
    }

    /// Queues `spans` for export, or drops and counts them when the queue
    /// is full. Never waits.
    pub fn offer(&self, spans: Vec<Span>) {
        if spans.is_empty() {
            return;
        }
        match self.tx.try_send(spans) {
            Ok(()) => {}
            Err(TrySendError::Full(s)) => drop_spans(s.len(), "the export queue is full"),
            Err(TrySendError::Disconnected(s)) => drop_spans(s.len(), "the exporter has stopped"),
        }
    }

    /// Lets the thread send what is queued, waiting at most `wait`, when
    /// this is the last handle (at the end of the process).
    pub fn finish(self, wait: Duration) {
        let done = self.done.clone();
        drop(self);
        let _ = done.recv_timeout(wait);
    }
}

/// A URL as logs show it: scheme and host only (a path or query may hold
/// a token).
pub fn shown(url: &Option<String>) -> String {
    let Some(u) = url else {
        return "nowhere".into();
    };
    let (scheme, rest) = u.split_once("://").unwrap_or(("", u));
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = host.rsplit('@').next().unwrap_or_default();
    format!("{scheme}://{host}")
}

fn run(url: &str, headers: &[(String, String)], resource: &Resource, rx: Receiver<Vec<Span>>) {
    let http = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(3))
        .timeout(REQUEST_TIMEOUT)
        .build();
    let where_ = shown(&Some(url.to_string()));
    let mut failing = false;
    while let Ok(first) = rx.recv() {
        let mut batch = first;
        while batch.len() < MAX_SPANS_PER_REQUEST {
            match rx.try_recv() {
                Ok(more) => batch.extend(more),
                Err(_) => break,
            }
        }
        let body = otlp::encode(resource, &batch).to_string();
        let mut req = http.post(url).set("Content-Type", "application/json");
        for (k, v) in headers {
            req = req.set(k, v);
        }
        match req.send_string(&body) {
            Ok(_) => {
                EXPORTED.fetch_add(batch.len() as u64, Ordering::Relaxed);
                if failing {
                    log::info!("telemetry: {where_} takes spans again");
                    failing = false;
                }
            }
            Err(e) => {
                let why = match e {
                    ureq::Error::Status(code, _) => format!("{where_} answered {code}"),
                    ureq::Error::Transport(t) => format!("{where_} unreachable: {}", t.kind()),
                };
                failing = true;
                drop_spans(batch.len(), &why);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_show_scheme_and_host_only() {
        assert_eq!(
            shown(&Some("https://u:p@c.example:4318/v1/traces?t=x".into())),
            "https://c.example:4318"
        );
        assert_eq!(shown(&None), "nowhere");
    }

    #[test]
    fn no_endpoint_no_thread_and_an_unreachable_collector_counts_drops() {
        let off = crate::telemetry::Config::default();
        let res = Resource { attributes: vec![] };
        assert!(Exporter::start(&off, res.clone()).unwrap().is_none());
        // A port nothing listens on: bind, learn it, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = crate::telemetry::Config {
            endpoint: Some(format!("http://127.0.0.1:{port}/v1/traces")),
            ..Default::default()
        };
        let before = dropped_total();
        let ex = Exporter::start(&cfg, res).unwrap().unwrap();
        let span = crate::proto::cmd::Span {
            trace_id: super::super::span::trace_id(),
            span_id: super::super::span::span_id(),
            parent_span_id: None,
            name: "x".into(),
            kind: crate::proto::cmd::SpanKind::Client,
            start_ns: 1,
            end_ns: 2,
            attributes: vec![],
            links: vec![],
            error: None,
        };
        ex.offer(vec![span]);
        ex.finish(Duration::from_secs(30));
        assert!(dropped_total() > before);
    }
}
