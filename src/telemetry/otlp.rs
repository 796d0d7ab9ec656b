//! The OTLP/HTTP JSON encoding of a batch of spans (`ExportTraceServiceRequest`
//! as the OTLP spec's JSON mapping writes it): ids as lowercase hex, 64-bit
//! integers and nanosecond times as strings, enums as integers, one resource
//! with its schema URL and one scope.

use super::span::{AttrValue, Span};
use serde_json::{json, Value};

/// What every batch says of its sender.
#[derive(Debug, Clone, PartialEq)]
pub struct Resource {
    pub attributes: Vec<(String, String)>,
}

impl Resource {
    /// `service.name`, `service.instance.id` and `hive.name` (when the hive
    /// has one) after `OTEL_RESOURCE_ATTRIBUTES`' own, which they override.
    pub fn new(cfg: &super::Config, instance: &str, hive_name: Option<&str>) -> Resource {
        let mut attributes: Vec<(String, String)> = cfg
            .resource
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    "service.name" | "service.instance.id" | "hive.name"
                )
            })
            .cloned()
            .collect();
        attributes.push(("service.name".into(), cfg.service_name.clone()));
        attributes.push(("service.instance.id".into(), instance.to_string()));
        if let Some(h) = hive_name {
            attributes.push(("hive.name".into(), h.to_string()));
        }
        Resource { attributes }
    }
}

fn value(v: &AttrValue) -> Value {
    match v {
        AttrValue::Str(s) => json!({ "stringValue": s }),
        AttrValue::Int(i) => json!({ "intValue": i.to_string() }),
        AttrValue::Double(d) if d.is_finite() => json!({ "doubleValue": d }),
        AttrValue::Double(_) => json!({ "doubleValue": 0.0 }),
        AttrValue::Bool(b) => json!({ "boolValue": b }),
    }
}

fn attributes<'a>(it: impl Iterator<Item = (&'a str, Value)>) -> Value {
    Value::Array(it.map(|(k, v)| json!({ "key": k, "value": v })).collect())
}

fn span(s: &Span) -> Value {
    let mut o = json!({
        "traceId": s.trace_id.hex(),
        "spanId": s.span_id.hex(),
        "name": s.name,
        "kind": s.kind.otlp(),
        "startTimeUnixNano": s.start_ns.to_string(),
        "endTimeUnixNano": s.end_ns.max(s.start_ns).to_string(),
        "attributes": attributes(s.attributes.iter().map(|(k, v)| (k.as_str(), value(v)))),
        "links": s.links.iter().map(|l| json!({
            "traceId": l.trace_id.hex(),
            "spanId": l.span_id.hex(),
        })).collect::<Vec<_>>(),
        "status": match &s.error {
            // STATUS_CODE_ERROR
            Some(m) => json!({ "code": 2, "message": m }),
            None => json!({}),
        },
    });
    if let (Some(p), Value::Object(m)) = (s.parent_span_id, &mut o) {
        m.insert("parentSpanId".into(), Value::from(p.hex()));
    }
    o
}

/// One `ExportTraceServiceRequest` body.
pub fn encode(resource: &Resource, spans: &[Span]) -> Value {
    json!({
        "resourceSpans": [{
            "resource": {
                "attributes": attributes(resource.attributes.iter().map(|(k, v)| (k.as_str(), json!({ "stringValue": v })))),
            },
            "scopeSpans": [{
                "scope": { "name": "hive", "version": env!("CARGO_PKG_VERSION") },
                "spans": spans.iter().map(span).collect::<Vec<_>>(),
                "schemaUrl": super::schema_url(),
            }],
            "schemaUrl": super::schema_url(),
        }]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::cmd::{SpanId, SpanKind, SpanLink, TraceId};

    #[test]
    fn a_span_encodes_as_the_otlp_json_mapping_says() {
        let s = Span {
            trace_id: TraceId([0xab; 16]),
            span_id: SpanId([1; 8]),
            parent_span_id: Some(SpanId([2; 8])),
            name: "execute_tool Read".into(),
            kind: SpanKind::Internal,
            start_ns: 5,
            end_ns: 7,
            attributes: vec![
                ("n".into(), AttrValue::Int(3)),
                ("c".into(), AttrValue::Double(0.5)),
            ],
            links: vec![SpanLink {
                trace_id: TraceId([3; 16]),
                span_id: SpanId([4; 8]),
            }],
            error: Some("boom".into()),
        };
        let cfg = crate::telemetry::Config {
            service_name: "hive".into(),
            resource: vec![
                ("service.name".into(), "x".into()),
                ("team".into(), "a".into()),
            ],
            ..Default::default()
        };
        let body = encode(&Resource::new(&cfg, "i", Some("h")), &[s]);
        let rs = &body["resourceSpans"][0];
        let res = rs["resource"]["attributes"].as_array().unwrap();
        assert_eq!(res.len(), 4, "{res:?}");
        assert!(res.contains(&json!({"key":"service.name","value":{"stringValue":"hive"}})));
        let sp = &rs["scopeSpans"][0]["spans"][0];
        assert_eq!(sp["traceId"], "ab".repeat(16));
        assert_eq!(sp["parentSpanId"], "02".repeat(8));
        assert_eq!(sp["kind"], 1);
        assert_eq!(sp["startTimeUnixNano"], "5");
        assert_eq!(sp["attributes"][0]["value"]["intValue"], "3");
        assert_eq!(sp["status"]["code"], 2);
        assert_eq!(sp["links"][0]["spanId"], "04".repeat(8));
        assert!(rs["schemaUrl"]
            .as_str()
            .unwrap()
            .ends_with(crate::telemetry::SEMCONV_VERSION));
    }
}
