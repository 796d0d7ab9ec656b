//! OpenTelemetry traces of every claude run (issue 43, item 1). This module
//! owns the telemetry settings ([`Config`]: the standard `OTEL_*` variables
//! over the fleet file's `telemetry` section, resolved once at start), the
//! random ids ([`span`]), the OTLP/HTTP JSON encoding of spans and their
//! resource ([`otlp`]), and the one exporter thread ([`exporter`]) with its
//! bounded queue: a full queue drops and counts, and nothing a turn does ever
//! waits on it. The W3C `traceparent` and the span as the wire carries it are
//! the contract's (`proto::cmd::trace`). A plain `hive serve` exports itself;
//! under `hive up` the harnesses hand their spans to `hive up` through the
//! broker (`export_spans`) and only `hive up` runs an exporter. Without an
//! endpoint no exporter thread starts. `docs/observability.md` says what
//! the spans hold.

pub mod exporter;
pub mod otlp;
pub mod span;

pub use exporter::Exporter;

use crate::config::TelemetrySection;
use crate::sys::env::Env;

/// The semantic-conventions version the spans follow, pinned in their
/// schema URL (and `docs/observability.md`).
pub const SEMCONV_VERSION: &str = "1.37.0";

/// The schema URL of every batch.
pub fn schema_url() -> String {
    format!("https://opentelemetry.io/schemas/{SEMCONV_VERSION}")
}

/// Set by `hive up` in each harness's environment when `hive up` exports:
/// the harness makes spans and hands them to the broker (`export_spans`)
/// instead of running an exporter of its own.
pub const VIA_BROKER_VAR: &str = "HIVE_TELEMETRY_VIA_BROKER";

/// Set by `hive up` with `telemetry.cli: true`: the harness passes the
/// endpoint and headers (which `hive up` then also sets) on to claude.
pub const CLI_VAR: &str = "HIVE_TELEMETRY_CLI";

/// The telemetry settings, resolved.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// The traces URL spans are POSTed to; None: nothing is exported.
    pub endpoint: Option<String>,
    /// Extra request headers (`OTEL_EXPORTER_OTLP_HEADERS`).
    pub headers: Vec<(String, String)>,
    /// `service.name` (`OTEL_SERVICE_NAME`, else `hive`).
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`, in order.
    pub resource: Vec<(String, String)>,
    /// `telemetry.cli`: claude gets the endpoint and headers too.
    pub cli: bool,
}

impl Config {
    /// Spans are exported (an endpoint is set and the SDK is not disabled).
    pub fn exporting(&self) -> bool {
        self.endpoint.is_some()
    }

    /// The settings from the environment over `section` (the fleet file's
    /// `telemetry`): each variable set wins over its key. A protocol other
    /// than `http/json`, a bad URL or a bad header list is an error naming
    /// the variable (or the key).
    pub fn resolve(env: &Env, section: Option<&TelemetrySection>) -> Result<Config, String> {
        let def = TelemetrySection::default();
        let sec = section.unwrap_or(&def);
        let disabled = match env.get("OTEL_SDK_DISABLED") {
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "true" => true,
                "false" | "" => false,
                _ => return Err(Env::bad("OTEL_SDK_DISABLED", &v, "true or false")),
            },
            None => sec.disabled.unwrap_or(false),
        };
        for (var, key) in [
            (
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                "telemetry.traces_protocol",
            ),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "telemetry.protocol"),
        ] {
            let (name, value) = match env.get(var) {
                Some(v) => (var, v),
                None => match key {
                    "telemetry.traces_protocol" => match &sec.traces_protocol {
                        Some(v) => (key, v.clone()),
                        None => continue,
                    },
                    _ => match &sec.protocol {
                        Some(v) => (key, v.clone()),
                        None => continue,
                    },
                },
            };
            if value.trim() != "http/json" {
                return Err(format!(
                    "{name} is {:?}: hive exports traces only as OTLP/HTTP JSON; set it to \
                     http/json or unset it",
                    value.trim()
                ));
            }
        }
        let endpoint = match (
            env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            env.get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(t), _) if !t.trim().is_empty() => {
                Some(("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", t.trim().to_string()))
            }
            (_, Some(b)) if !b.trim().is_empty() => {
                Some(("OTEL_EXPORTER_OTLP_ENDPOINT", with_signal_path(b.trim())))
            }
            _ => match (&sec.traces_endpoint, &sec.endpoint) {
                (Some(t), _) => Some(("telemetry.traces_endpoint", t.clone())),
                (_, Some(b)) => Some(("telemetry.endpoint", with_signal_path(b))),
                _ => None,
            },
        };
        if let Some((name, url)) = &endpoint {
            if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
                return Err(format!(
                    "{name} is {url:?}: it must be an http:// or https:// URL of the OTLP collector"
                ));
            }
        }
        let headers = match env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") {
            Some(h) => {
                parse_pairs(&h).map_err(|e| format!("OTEL_EXPORTER_OTLP_TRACES_HEADERS: {e}"))?
            }
            None => match env.get("OTEL_EXPORTER_OTLP_HEADERS") {
                Some(h) => {
                    parse_pairs(&h).map_err(|e| format!("OTEL_EXPORTER_OTLP_HEADERS: {e}"))?
                }
                None => sec
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            },
        };
        for (k, v) in &headers {
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if k.is_empty() || !k.chars().all(token) || v.chars().any(|c| c.is_control()) {
                return Err(format!(
                    "the OTLP header {k:?} is not a valid HTTP header (name: a token; value: no control characters)"
                ));
            }
        }
        let resource = match env.get("OTEL_RESOURCE_ATTRIBUTES") {
            Some(r) => parse_pairs(&r).map_err(|e| format!("OTEL_RESOURCE_ATTRIBUTES: {e}"))?,
            None => sec
                .resource_attributes
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        let service_name = env
            .get("OTEL_SERVICE_NAME")
            .filter(|s| !s.trim().is_empty())
            .or_else(|| sec.service_name.clone())
            .unwrap_or_else(|| "hive".into());
        Ok(Config {
            endpoint: endpoint.filter(|_| !disabled).map(|(_, u)| u),
            headers,
            service_name,
            resource,
            cli: sec.cli.unwrap_or(false),
        })
    }

    /// What claude gets with `telemetry.cli`: its own telemetry on
    /// (`CLAUDE_CODE_ENABLE_TELEMETRY`, traces to OTLP), and the endpoint and
    /// headers in the standard variables (the traces endpoint as is).
    pub fn cli_vars(&self) -> Vec<(String, String)> {
        let Some(url) = self.endpoint.as_ref().filter(|_| self.cli) else {
            return Vec::new();
        };
        let mut v = vec![
            ("CLAUDE_CODE_ENABLE_TELEMETRY".to_string(), "1".to_string()),
            ("OTEL_TRACES_EXPORTER".to_string(), "otlp".to_string()),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT".to_string(),
                url.clone(),
            ),
            (
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL".to_string(),
                "http/json".to_string(),
            ),
        ];
        if !self.headers.is_empty() {
            let h: Vec<String> = self
                .headers
                .iter()
                .map(|(k, v)| format!("{k}={}", percent_encode(v)))
                .collect();
            v.push(("OTEL_EXPORTER_OTLP_TRACES_HEADERS".to_string(), h.join(",")));
        }
        v
    }

    /// The variables `hive up` sets in a harness's environment so the
    /// harness hands its spans to the broker (and, with `cli`, what claude
    /// gets); empty when nothing is exported.
    pub fn harness_vars(&self) -> Vec<(String, String)> {
        if !self.exporting() {
            return Vec::new();
        }
        let mut v = vec![(VIA_BROKER_VAR.to_string(), "1".to_string())];
        if self.cli {
            v.push((CLI_VAR.to_string(), "1".to_string()));
            v.extend(self.cli_vars());
        }
        v
    }
}

/// A base endpoint with the traces signal path appended, per the OTLP spec.
fn with_signal_path(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// `k=v,k2=v2` with percent-encoded values (the W3C Baggage-like format of
/// `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_RESOURCE_ATTRIBUTES`).
pub fn parse_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for item in s.split(',') {
        if item.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!("{item:?} is not key=value"));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(format!("{item:?} has no key"));
        }
        let v = percent_decode(v.trim()).ok_or_else(|| format!("{item:?} has a bad %-escape"))?;
        out.push((k.to_string(), v));
    }
    Ok(out)
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|c| {
            if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
                (c as char).to_string()
            } else {
                format!("%{c:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn resolve(vars: &[(&str, &str)], sec: Option<&TelemetrySection>) -> Result<Config, String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let f = move |k: &str| m.get(k).cloned();
        Config::resolve(&Env::new(&f), sec)
    }

    #[test]
    fn the_endpoint_comes_as_is_or_with_the_signal_path() {
        assert_eq!(resolve(&[], None).unwrap().endpoint, None);
        let c = resolve(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318/")], None).unwrap();
        assert_eq!(c.endpoint.as_deref(), Some("http://c:4318/v1/traces"));
        assert_eq!(c.service_name, "hive");
        let c = resolve(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:1/x"),
            ],
            None,
        )
        .unwrap();
        assert_eq!(c.endpoint.as_deref(), Some("http://t:1/x"));
        let off = resolve(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_SDK_DISABLED", "true"),
            ],
            None,
        )
        .unwrap();
        assert!(!off.exporting());
        assert!(resolve(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "c:4318")], None).is_err());
    }

    #[test]
    fn a_protocol_other_than_http_json_names_its_variable() {
        let e = resolve(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")], None).unwrap_err();
        assert!(e.starts_with("OTEL_EXPORTER_OTLP_PROTOCOL"), "{e}");
        let e = resolve(
            &[("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")],
            None,
        )
        .unwrap_err();
        assert!(e.starts_with("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), "{e}");
        let sec = TelemetrySection {
            protocol: Some("grpc".into()),
            ..TelemetrySection::default()
        };
        let e = resolve(&[], Some(&sec)).unwrap_err();
        assert!(e.starts_with("telemetry.protocol"), "{e}");
        assert!(resolve(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")], None).is_ok());
    }

    #[test]
    fn headers_and_resource_attributes_are_decoded_and_the_file_fills_in() {
        let c = resolve(
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "authorization=Bearer%20abc, x-team=ops",
                ),
                ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=prod"),
                ("OTEL_SERVICE_NAME", "my-hive"),
            ],
            None,
        )
        .unwrap();
        assert_eq!(
            c.headers,
            [
                ("authorization".to_string(), "Bearer abc".to_string()),
                ("x-team".to_string(), "ops".to_string())
            ]
        );
        assert_eq!(c.resource[0].1, "prod");
        assert_eq!(c.service_name, "my-hive");
        assert!(resolve(&[("OTEL_EXPORTER_OTLP_HEADERS", "novalue")], None)
            .unwrap_err()
            .starts_with("OTEL_EXPORTER_OTLP_HEADERS"));
        let sec: TelemetrySection = serde_json::from_str(
            r#"{"endpoint":"http://f:4318","headers":{"k":"v"},"service_name":"s","cli":true}"#,
        )
        .unwrap();
        let c = resolve(&[], Some(&sec)).unwrap();
        assert_eq!(c.endpoint.as_deref(), Some("http://f:4318/v1/traces"));
        assert!(c.cli);
        let vars = c.harness_vars();
        assert!(vars.contains(&(VIA_BROKER_VAR.into(), "1".into())));
        assert!(vars.contains(&("OTEL_EXPORTER_OTLP_TRACES_HEADERS".into(), "k=v".into())));
        assert!(vars.contains(&("CLAUDE_CODE_ENABLE_TELEMETRY".into(), "1".into())));
        // Without `cli` claude gets nothing but its TRACEPARENT.
        let c = resolve(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")], None).unwrap();
        assert!(c.cli_vars().is_empty());
        assert_eq!(
            c.harness_vars(),
            [(VIA_BROKER_VAR.to_string(), "1".to_string())]
        );
        // The environment wins over the file.
        let c = resolve(&[("OTEL_SERVICE_NAME", "env")], Some(&sec)).unwrap();
        assert_eq!(c.service_name, "env");
    }
}
