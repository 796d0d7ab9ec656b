//! The turn loop's traces (issue 43, item 1): one span `invoke_agent
//! {agent}` per claude run, with a child `execute_tool {tool}` from each
//! `tool_use` line to its `tool_result`, handed when the run ends to the
//! sink — this harness's own exporter thread (plain `hive serve` with an
//! endpoint), the broker (`export_spans`, under `hive up`, which exports for
//! the hive), or nowhere. Every run's spans of one message share its trace,
//! and each run links to the previous one (the first to the message's
//! `traceparent`, the sender's run, when it carries one). Every run gets
//! `TRACEPARENT` (sampled only when spans are exported). Nothing here
//! waits: the exporter's queue drops when full, and the broker's request
//! goes out with the loop's other reports.

use crate::harness::poller::Teller;
use crate::harness::work::WorkKey;
use crate::proto::cmd::{
    AttrValue, ExportSpans, Span, SpanId, SpanKind, SpanLink, TraceId, TraceParent,
    MAX_SPANS_PER_BATCH,
};
use crate::proto::Request;
use crate::sys::env::Env;
use crate::telemetry::{self, span, Exporter};
use serde_json::Value;
use std::collections::HashMap;

/// Where finished spans go.
pub enum Sink {
    /// Nothing is exported: no span is made.
    Off,
    /// This harness's own exporter thread.
    Own(Exporter),
    /// The broker, for `hive up`'s exporter.
    Broker(Teller),
}

/// The trace of the message (or continue) in hand.
struct Thread {
    key: WorkKey,
    trace_id: TraceId,
    /// The previous run's span, which the next run links to.
    last: Option<SpanId>,
    /// The sender's run, which the first run links to.
    from: Option<TraceParent>,
}

/// One run's span while claude runs.
pub struct RunSpan {
    trace_id: TraceId,
    span_id: SpanId,
    links: Vec<SpanLink>,
    start_ns: u64,
    /// `tool_use` ids open now: (tool name, start).
    open_tools: HashMap<String, (String, u64)>,
    tools: Vec<Span>,
    response_model: Option<String>,
    sampled: bool,
    tool_spans: bool,
}

impl RunSpan {
    /// The `TRACEPARENT` claude gets: this run's span.
    pub fn traceparent(&self) -> String {
        TraceParent {
            trace_id: self.trace_id,
            span_id: self.span_id,
            flags: u8::from(self.sampled),
        }
        .format()
    }

    /// One stdout line of claude: opens and closes tool spans, and notes
    /// the model that answered.
    pub fn on_stdout(&mut self, v: &Value) {
        let ty = v.get("type").and_then(Value::as_str);
        let Some(content) = v.pointer("/message/content").and_then(Value::as_array) else {
            return;
        };
        // Sub-agents' lines (a parent tool use) belong to the CLI's tool.
        if v.get("parent_tool_use_id").is_some_and(|p| !p.is_null()) {
            return;
        }
        match ty {
            Some("assistant") => {
                if let Some(m) = v.pointer("/message/model").and_then(Value::as_str) {
                    if m != "<synthetic>" {
                        self.response_model = Some(m.to_string());
                    }
                }
                if !self.tool_spans {
                    return;
                }
                for c in content {
                    if c.get("type").and_then(Value::as_str) != Some("tool_use") {
                        continue;
                    }
                    let (Some(id), Some(name)) = (
                        c.get("id").and_then(Value::as_str),
                        c.get("name").and_then(Value::as_str),
                    ) else {
                        continue;
                    };
                    if self.open_tools.len() < 256 {
                        self.open_tools
                            .insert(id.to_string(), (name.to_string(), span::now_ns()));
                    }
                }
            }
            Some("user") => {
                for c in content {
                    if c.get("type").and_then(Value::as_str) != Some("tool_result") {
                        continue;
                    }
                    let Some(id) = c.get("tool_use_id").and_then(Value::as_str) else {
                        continue;
                    };
                    let failed = c.get("is_error").and_then(Value::as_bool) == Some(true);
                    self.close_tool(id, failed.then(|| "the tool answered an error".into()));
                }
            }
            _ => {}
        }
    }

    fn close_tool(&mut self, id: &str, error: Option<String>) {
        let Some((name, start)) = self.open_tools.remove(id) else {
            return;
        };
        if self.tools.len() >= MAX_SPANS_PER_BATCH - 1 {
            return;
        }
        let mut attributes = vec![
            attr("gen_ai.operation.name", "execute_tool"),
            attr("gen_ai.tool.name", &name),
            attr("gen_ai.tool.call.id", id),
        ];
        if error.is_some() {
            attributes.push(attr("error.type", "tool_error"));
        }
        self.tools.push(Span {
            trace_id: self.trace_id,
            span_id: span::span_id(),
            parent_span_id: Some(self.span_id),
            name: format!("execute_tool {name}"),
            kind: SpanKind::Internal,
            start_ns: start,
            end_ns: span::now_ns(),
            attributes,
            links: Vec::new(),
            error,
        });
    }
}

fn attr(k: &str, v: &str) -> (String, AttrValue) {
    (k.to_string(), AttrValue::Str(v.to_string()))
}

/// What the loop knows of a run when it ends.
pub struct RunEnd<'a> {
    pub agent: &'a str,
    pub run_kind: &'a str,
    pub request_model: &'a str,
    pub report: &'a crate::harness::classify::TurnReport,
    pub outcome: &'a str,
    pub ok: bool,
    pub decision: Option<String>,
    pub message_id: Option<i64>,
    pub sender: Option<&'a str>,
}

/// The loop's tracer: the sink and the trace of the work in hand.
pub struct Tracer {
    sink: Sink,
    /// The CLI traces its own runs (`telemetry.cli`): no tool spans.
    cli_vars: Vec<(String, String)>,
    thread: Option<Thread>,
    /// The sender's run of the messages handed out, by message (a few at
    /// most: the one in hand and one arrived).
    from: HashMap<WorkKey, TraceParent>,
}

impl Tracer {
    /// From the harness's environment: `hive up`'s variables hand the spans
    /// to the broker; an endpoint of its own starts this harness's exporter;
    /// else nothing is exported. A bad setting is an error naming it.
    pub fn from_env(env: &Env, teller: Teller) -> Result<Tracer, String> {
        let cfg = telemetry::Config::resolve(env, None)?;
        let via_broker = env.get(telemetry::VIA_BROKER_VAR).is_some_and(|v| v == "1");
        let cli = env.get(telemetry::CLI_VAR).is_some_and(|v| v == "1");
        let cfg = telemetry::Config { cli, ..cfg };
        let sink = if via_broker {
            Sink::Broker(teller)
        } else {
            let resource = telemetry::otlp::Resource::new(
                &cfg,
                &span::uuid4(),
                env.get("HIVE_HIVE_NAME").as_deref(),
            );
            match Exporter::start(&cfg, resource)? {
                Some(x) => Sink::Own(x),
                None => Sink::Off,
            }
        };
        Ok(Tracer {
            cli_vars: if matches!(sink, Sink::Off) {
                Vec::new()
            } else {
                cfg.cli_vars()
            },
            sink,
            thread: None,
            from: HashMap::new(),
        })
    }

    /// A tracer that exports nothing.
    pub fn off() -> Tracer {
        Tracer {
            sink: Sink::Off,
            cli_vars: Vec::new(),
            thread: None,
            from: HashMap::new(),
        }
    }

    /// The OpenTelemetry variables claude gets (`telemetry.cli`), besides
    /// `TRACEPARENT`.
    pub fn cli_vars(&self) -> &[(String, String)] {
        &self.cli_vars
    }

    /// Message `key`, handed out, carries `tp` (the sender's run).
    pub fn message_from(&mut self, key: WorkKey, tp: TraceParent) {
        if self.from.len() >= 16 {
            self.from.clear();
        }
        self.from.insert(key, tp);
    }

    /// A run starts for `key` (None: a run with no work in hand).
    pub fn start(&mut self, key: Option<WorkKey>) -> RunSpan {
        let from = key.and_then(|k| self.from.get(&k).copied());
        let thread = match (key, self.thread.take()) {
            (Some(k), Some(t)) if t.key == k => Some(t),
            (Some(k), _) => Some(Thread {
                key: k,
                trace_id: span::trace_id(),
                last: None,
                from,
            }),
            (None, t) => {
                self.thread = t;
                None
            }
        };
        let (trace_id, links) = match &thread {
            Some(t) => {
                let link = match (t.last, t.from) {
                    (Some(s), _) => Some(SpanLink {
                        trace_id: t.trace_id,
                        span_id: s,
                    }),
                    (None, Some(tp)) => Some(SpanLink {
                        trace_id: tp.trace_id,
                        span_id: tp.span_id,
                    }),
                    _ => None,
                };
                (t.trace_id, link.into_iter().collect())
            }
            None => (span::trace_id(), Vec::new()),
        };
        let run = RunSpan {
            trace_id,
            span_id: span::span_id(),
            links,
            start_ns: span::now_ns(),
            open_tools: HashMap::new(),
            tools: Vec::new(),
            response_model: None,
            sampled: !matches!(self.sink, Sink::Off),
            tool_spans: self.cli_vars.is_empty(),
        };
        if let Some(mut t) = thread {
            t.last = Some(run.span_id);
            self.thread = Some(t);
        }
        run
    }

    /// The work `key` is settled (acked, dead-lettered): its trace ends.
    pub fn forget(&mut self, key: WorkKey) {
        self.from.remove(&key);
        if self.thread.as_ref().is_some_and(|t| t.key == key) {
            self.thread = None;
        }
    }

    /// The run ended: its span (and its tools') go to the sink.
    pub fn finish(&mut self, mut run: RunSpan, e: RunEnd) {
        if matches!(self.sink, Sink::Off) {
            return;
        }
        let end_ns = span::now_ns();
        let open: Vec<String> = run.open_tools.keys().cloned().collect();
        for id in open {
            run.close_tool(&id, Some("the run ended before the tool's result".into()));
        }
        let r = e.report;
        let s = |v: &str| AttrValue::Str(v.to_string());
        let int = |v: u64| AttrValue::Int(v.min(i64::MAX as u64) as i64);
        let mut a: Vec<(String, AttrValue)> = vec![
            ("gen_ai.operation.name".into(), s("invoke_agent")),
            ("gen_ai.provider.name".into(), s("anthropic")),
            ("gen_ai.agent.name".into(), s(e.agent)),
            ("gen_ai.request.model".into(), s(e.request_model)),
        ];
        if let Some(m) = run.response_model.as_ref().or(r.model.as_ref()) {
            a.push(("gen_ai.response.model".into(), s(m)));
        }
        if let Some(sid) = &r.session_id {
            a.push(("gen_ai.conversation.id".into(), s(sid)));
        }
        a.push((
            "gen_ai.usage.input_tokens".into(),
            int(r.input_tokens + r.cache_read_tokens + r.cache_creation_tokens),
        ));
        a.push((
            "gen_ai.usage.cache_read.input_tokens".into(),
            int(r.cache_read_tokens),
        ));
        a.push((
            "gen_ai.usage.cache_creation.input_tokens".into(),
            int(r.cache_creation_tokens),
        ));
        a.push(("gen_ai.usage.output_tokens".into(), int(r.output_tokens)));
        if !e.ok {
            a.push(("error.type".into(), s(e.outcome)));
        }
        a.push((
            "hive.cost.usd".into(),
            AttrValue::Double(r.cost_usd.unwrap_or(0.0)),
        ));
        a.push(("hive.turn.outcome".into(), s(e.outcome)));
        if let Some(d) = &e.decision {
            a.push(("hive.turn.decision".into(), s(d)));
        }
        if let Some(id) = e.message_id {
            a.push(("hive.message.id".into(), AttrValue::Int(id)));
        }
        if let Some(from) = e.sender {
            a.push(("hive.message.sender".into(), s(from)));
        }
        a.push(("hive.run.kind".into(), s(e.run_kind)));
        let mut spans = std::mem::take(&mut run.tools);
        spans.push(Span {
            trace_id: run.trace_id,
            span_id: run.span_id,
            parent_span_id: None,
            name: format!("invoke_agent {}", e.agent),
            kind: SpanKind::Client,
            start_ns: run.start_ns,
            end_ns,
            attributes: a,
            links: run.links,
            error: (!e.ok).then(|| e.outcome.to_string()),
        });
        match &self.sink {
            Sink::Off => {}
            Sink::Own(x) => x.offer(spans),
            Sink::Broker(t) => t.tell(Request::from(ExportSpans { spans })),
        }
    }

    /// The end of the harness: the exporter sends what is queued (a few
    /// seconds at most).
    pub fn finish_all(self) {
        if let Sink::Own(x) = self.sink {
            x.finish(std::time::Duration::from_secs(5));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_use_and_its_result_make_a_child_span() {
        let mut t = Tracer::off();
        let mut run = t.start(Some(WorkKey::Message(3)));
        run.tool_spans = true;
        let tp = TraceParent::parse(&run.traceparent()).unwrap();
        assert_eq!(tp.span_id, run.span_id);
        assert!(!tp.sampled());
        run.on_stdout(&serde_json::json!({"type":"assistant","parent_tool_use_id":null,
            "message":{"model":"claude-x","content":[{"type":"tool_use","id":"t1","name":"Read","input":{}}]}}));
        run.on_stdout(&serde_json::json!({"type":"user","parent_tool_use_id":null,
            "message":{"content":[{"type":"tool_result","tool_use_id":"t1","content":"x"}]}}));
        assert_eq!(run.tools.len(), 1);
        assert_eq!(run.tools[0].name, "execute_tool Read");
        assert_eq!(run.tools[0].parent_span_id, Some(run.span_id));
        assert_eq!(run.response_model.as_deref(), Some("claude-x"));
        // The next run of the message shares its trace and links back.
        let first = run.span_id;
        let again = t.start(Some(WorkKey::Message(3)));
        assert_eq!(again.trace_id, run.trace_id);
        assert_eq!(again.links[0].span_id, first);
        t.forget(WorkKey::Message(3));
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        t.message_from(WorkKey::Message(4), TraceParent::parse(tp).unwrap());
        let other = t.start(Some(WorkKey::Message(4)));
        assert_ne!(other.trace_id, run.trace_id);
        assert_eq!(other.links[0].span_id.hex(), "00f067aa0ba902b7");
    }
}
