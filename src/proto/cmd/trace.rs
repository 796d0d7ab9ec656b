//! Traces (issue 43, item 1) as the wire carries them: the W3C `traceparent`
//! a message, a `wake` and a `send` carry ([`TraceParent`]: parsed, checked
//! and formatted here, all-zero ids refused), and one finished span
//! ([`Span`]) as a harness under `hive up` hands a batch of them to the
//! broker (`export_spans`), which passes them to `hive up`'s one exporter.
//! The OTLP encoding of spans is `telemetry::otlp`'s.

use crate::proto::command::{Command, Invalid};
use crate::proto::text::excerpt;
use serde::{Deserialize, Serialize};

/// A trace id: 16 bytes, never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TraceId(pub [u8; 16]);

/// A span id: 8 bytes, never all zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SpanId(pub [u8; 8]);

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `N` bytes from exactly `2 N` lowercase hex digits.
fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N
        || !s
            .bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    {
        return None;
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

impl TraceId {
    pub fn hex(&self) -> String {
        hex(&self.0)
    }
    pub fn parse(s: &str) -> Option<TraceId> {
        unhex::<16>(s)
            .filter(|b| b.iter().any(|x| *x != 0))
            .map(TraceId)
    }
}

impl SpanId {
    pub fn hex(&self) -> String {
        hex(&self.0)
    }
    pub fn parse(s: &str) -> Option<SpanId> {
        unhex::<8>(s)
            .filter(|b| b.iter().any(|x| *x != 0))
            .map(SpanId)
    }
}

macro_rules! hex_serde {
    ($ty:ident, $what:literal) => {
        impl Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.hex())
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<$ty, D::Error> {
                let s = String::deserialize(d)?;
                $ty::parse(&s).ok_or_else(|| {
                    serde::de::Error::custom(format!(
                        "{} is not a {} (lowercase hex, not all zero)",
                        excerpt(&s),
                        $what
                    ))
                })
            }
        }
    };
}
hex_serde!(TraceId, "trace id of 32 hex digits");
hex_serde!(SpanId, "span id of 16 hex digits");

/// A W3C trace context `traceparent`: `00-TRACEID-SPANID-FLAGS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// Bit 0: sampled.
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` header value (W3C Trace Context level 1):
    /// version `00` with exactly four fields (a later version may add fields
    /// after the fourth), lowercase hex, no all-zero trace or span id, never
    /// version `ff`.
    pub fn parse(s: &str) -> Result<TraceParent, String> {
        let bad = |why: &str| {
            format!(
                "{} is not a W3C traceparent (00-<32 hex trace id>-<16 hex span id>-<2 hex flags>): {why}",
                excerpt(s)
            )
        };
        let parts: Vec<&str> = s.split('-').collect();
        if parts.len() < 4 {
            return Err(bad("it needs four fields separated by '-'"));
        }
        let version = unhex::<1>(parts[0]).ok_or_else(|| bad("the version is not 2 hex digits"))?;
        if version[0] == 0xff {
            return Err(bad("version ff is invalid"));
        }
        if version[0] == 0 && parts.len() != 4 {
            return Err(bad("version 00 has exactly four fields"));
        }
        let trace_id = match unhex::<16>(parts[1]) {
            None => return Err(bad("the trace id is not 32 lowercase hex digits")),
            Some(b) if b.iter().all(|x| *x == 0) => return Err(bad("the trace id is all zero")),
            Some(b) => TraceId(b),
        };
        let span_id = match unhex::<8>(parts[2]) {
            None => return Err(bad("the span id is not 16 lowercase hex digits")),
            Some(b) if b.iter().all(|x| *x == 0) => return Err(bad("the span id is all zero")),
            Some(b) => SpanId(b),
        };
        let flags = unhex::<1>(parts[3]).ok_or_else(|| bad("the flags are not 2 hex digits"))?;
        Ok(TraceParent {
            trace_id,
            span_id,
            flags: flags[0],
        })
    }

    /// The header value, version `00`.
    pub fn format(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id.hex(),
            self.span_id.hex(),
            self.flags
        )
    }

    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }
}

/// A `traceparent` argument of a command: checked, else an error naming it.
pub fn check_traceparent(arg: &'static str, tp: Option<&str>) -> Result<(), Invalid> {
    match tp {
        Some(t) => TraceParent::parse(t)
            .map(|_| ())
            .map_err(|e| Invalid::arg(arg, e)),
        None => Ok(()),
    }
}

/// A span's kind, as OTLP numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    Internal,
    Server,
    Client,
    Producer,
    Consumer,
}

impl SpanKind {
    /// OTLP's `SpanKind` enum value.
    pub fn otlp(self) -> u8 {
        match self {
            SpanKind::Internal => 1,
            SpanKind::Server => 2,
            SpanKind::Client => 3,
            SpanKind::Producer => 4,
            SpanKind::Consumer => 5,
        }
    }
}

/// An attribute's value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttrValue {
    Str(String),
    Int(i64),
    Double(f64),
    Bool(bool),
}

/// A link to another span (the previous run of the same message, the
/// sender's run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpanLink {
    pub trace_id: TraceId,
    pub span_id: SpanId,
}

/// One finished span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_span_id: Option<SpanId>,
    pub name: String,
    pub kind: SpanKind,
    /// Unix nanoseconds.
    pub start_ns: u64,
    pub end_ns: u64,
    #[serde(default)]
    pub attributes: Vec<(String, AttrValue)>,
    #[serde(default)]
    pub links: Vec<SpanLink>,
    /// Set on failure: the status message (status `ERROR`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The most spans one `export_spans` carries.
pub const MAX_SPANS_PER_BATCH: usize = 512;

/// A harness hands the broker (under `hive up`) its finished spans, which
/// go to `hive up`'s exporter. Never waits: a full queue drops them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportSpans {
    pub spans: Vec<Span>,
}

/// Answer to `export_spans`: whether this broker exports (a plain `hive
/// broker` does not), and how many spans its exporter dropped so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportSpansReply {
    pub exporting: bool,
    #[serde(default)]
    pub dropped: u64,
}

impl Command for ExportSpans {
    type Reply = ExportSpansReply;
    fn validate(&self) -> Result<(), Invalid> {
        if self.spans.len() > MAX_SPANS_PER_BATCH {
            return Err(Invalid::arg(
                "spans",
                format!(
                    "holds {} spans; one batch carries at most {MAX_SPANS_PER_BATCH}",
                    self.spans.len()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for ExportSpans {
        fn sample() -> Self {
            ExportSpans {
                spans: vec![Span {
                    trace_id: TraceId([1; 16]),
                    span_id: SpanId([2; 8]),
                    parent_span_id: None,
                    name: "invoke_agent ana".into(),
                    kind: SpanKind::Client,
                    start_ns: 1,
                    end_ns: 2,
                    attributes: vec![("gen_ai.agent.name".into(), AttrValue::Str("ana".into()))],
                    links: vec![],
                    error: None,
                }],
            }
        }
    }

    #[test]
    fn traceparents_round_trip_and_bad_ones_are_refused() {
        let s = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let tp = TraceParent::parse(s).unwrap();
        assert_eq!(tp.format(), s);
        assert!(tp.sampled());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
        ] {
            let e = TraceParent::parse(bad).unwrap_err();
            assert!(e.contains("not a W3C traceparent"), "{bad}: {e}");
        }
        // A later version may carry more fields.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-zz")
                .is_ok()
        );
        assert!(check_traceparent("traceparent", Some("x"))
            .unwrap_err()
            .to_string()
            .starts_with("traceparent"));
    }

    #[test]
    fn ids_travel_as_hex_and_zero_ids_do_not_parse() {
        let span = ExportSpans::sample();
        let json = serde_json::to_value(&span).unwrap();
        assert_eq!(json["spans"][0]["trace_id"], "01".repeat(16));
        let back: ExportSpans = serde_json::from_value(json).unwrap();
        assert_eq!(back, span);
        let zero = serde_json::json!({"spans":[{"trace_id": "0".repeat(32), "span_id": "02".repeat(8),
            "name": "x", "kind": "client", "start_ns": 1, "end_ns": 2}]});
        assert!(serde_json::from_value::<ExportSpans>(zero).is_err());
    }
}
