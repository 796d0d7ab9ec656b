//! Traces (issue 43, item 1) from real `hive serve` processes with a fake
//! claude, exported to a collector on 127.0.0.1 (a tiny_http server here that
//! keeps every OTLP/JSON body). Each body is checked against the official
//! protobuf definitions (`opentelemetry-proto`'s `ExportTraceServiceRequest`,
//! `json_format.ParseDict` refusing unknown fields) after its hex ids are
//! turned into bytes (16 and 8 of them, asserted). A tool-call turn gives one
//! `invoke_agent` span with an `execute_tool` child, the fake claude's
//! `TRACEPARENT` is that span, no `OTEL_` variable reaches claude, and an
//! unreachable collector neither slows nor fails a turn (its spans are
//! dropped and counted). A protocol other than `http/json` stops the start.
//! A `traceparent` given to `hive wake` links the run to it, and one `hive
//! mcp` takes from the sending run links the recipient's run to the sender's
//! (with the fake claude, and with the real CLI at both ends of the window:
//! the CLI passes `TRACEPARENT` on to its MCP servers). Under `hive up` the
//! harnesses hand their spans to `hive up`'s one exporter.

mod common;

use common::hive::*;
use serde_json::Value;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// A collector: every body POSTed to it, parsed.
struct Collector {
    url: String,
    bodies: Arc<Mutex<Vec<(String, Value)>>>,
    server: Arc<tiny_http::Server>,
}

impl Collector {
    fn start() -> Collector {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let url = format!("http://{}", server.server_addr().to_ip().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let (srv, b) = (server.clone(), bodies.clone());
        std::thread::spawn(move || {
            for mut req in srv.incoming_requests() {
                let mut text = String::new();
                let _ = req.as_reader().read_to_string(&mut text);
                let path = req.url().to_string();
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    b.lock().unwrap().push((path, v));
                }
                let _ = req.respond(tiny_http::Response::from_string("{}"));
            }
        });
        Collector {
            url,
            bodies,
            server,
        }
    }

    fn bodies(&self) -> Vec<(String, Value)> {
        self.bodies.lock().unwrap().clone()
    }

    /// Every span received so far.
    fn spans(&self) -> Vec<Value> {
        let mut out = Vec::new();
        for (_, b) in self.bodies() {
            for rs in b["resourceSpans"].as_array().into_iter().flatten() {
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    out.extend(ss["spans"].as_array().into_iter().flatten().cloned());
                }
            }
        }
        out
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.server.unblock();
    }
}

/// A span's attribute, as its JSON value object.
fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn str_attr(span: &Value, key: &str) -> Option<String> {
    attr(span, key)?["stringValue"].as_str().map(String::from)
}

/// The python check of the bodies against the official definitions.
const CHECK: &str = r#"
import base64, json, sys
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

def b64(h, n, what):
    raw = bytes.fromhex(h)
    assert len(raw) == n, f"{what} {h!r} is {len(raw)} bytes, not {n}"
    return base64.b64encode(raw).decode()

bodies = json.load(sys.stdin)
for body in bodies:
    for rs in body["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for s in ss["spans"]:
                s["traceId"] = b64(s["traceId"], 16, "traceId")
                s["spanId"] = b64(s["spanId"], 8, "spanId")
                if "parentSpanId" in s:
                    s["parentSpanId"] = b64(s["parentSpanId"], 8, "parentSpanId")
                for l in s.get("links", []):
                    l["traceId"] = b64(l["traceId"], 16, "link traceId")
                    l["spanId"] = b64(l["spanId"], 8, "link spanId")
    json_format.ParseDict(body, ExportTraceServiceRequest(), ignore_unknown_fields=False)
print(f"ok {len(bodies)}")
"#;

/// Whether the python check can run here; else why (a skip outside CI).
fn python_ready() -> Result<(), String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import google.protobuf, opentelemetry.proto.collector.trace.v1.trace_service_pb2",
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "python3 cannot import opentelemetry-proto ({}); .ci/run installs it",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )),
        Err(e) => Err(format!("no python3: {e}")),
    }
}

/// Checks every body with the official protobuf definitions, or says why it
/// cannot (skipped, unless the run requires everything).
fn check_with_protobuf(bodies: &[Value]) {
    if let Err(why) = python_ready() {
        if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() == Ok("1") {
            panic!("HIVE_REQUIRE_REAL_CLAUDE=1 but {why}");
        }
        eprintln!("SKIPPED the protobuf check of the OTLP bodies: {why}");
        return;
    }
    let mut child = Command::new("python3")
        .args(["-c", CHECK])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(bodies).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the official schema refused a body: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        serde_json::to_string_pretty(bodies).unwrap()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("ok {}", bodies.len())
    );
}

/// The environment of fake claude invocation `n`.
fn inv_env(h: &Harness, n: usize) -> Vec<(String, String)> {
    let raw = std::fs::read(h.fake.dir.join(format!("inv-{n}.env"))).unwrap_or_default();
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

const TOOL_TURN: &str = r#"init
tool_use Read '{"file_path":"/etc/hostname"}'
say "read it"
result_ok "done"
exit 0
"#;

#[test]
fn a_tool_call_turn_exports_its_span_tree_and_claude_runs_under_its_span() {
    let col = Collector::start();
    let b = Broker::start(&["ana"]);
    let h = Harness::start(
        &b,
        "ana",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", col.url.as_str()),
            ("OTEL_SERVICE_NAME", "hive-test"),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-team=ops%20one"),
        ],
    );
    h.fake.default_step(TOOL_TURN);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let id = operator_send(&b, "ana", "read the host name");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");

    let run = wait_for(T, "the run span of the message", || {
        col.spans().into_iter().find(|s| {
            s["name"] == "invoke_agent ana"
                && attr(s, "hive.message.id").and_then(|v| v["intValue"].as_str())
                    == Some(id.to_string().as_str())
        })
    });
    assert_eq!(run["kind"], 3, "CLIENT: {run}");
    assert!(run.get("parentSpanId").is_none(), "{run}");
    for (k, want) in [
        ("gen_ai.operation.name", "invoke_agent"),
        ("gen_ai.provider.name", "anthropic"),
        ("gen_ai.agent.name", "ana"),
        ("gen_ai.response.model", "claude-sonnet-4-5"),
        (
            "gen_ai.conversation.id",
            "9954aa9f-0000-4000-8000-000000000001",
        ),
        ("hive.turn.outcome", "ok"),
        ("hive.message.sender", "operator"),
        ("hive.run.kind", "turn"),
    ] {
        assert_eq!(str_attr(&run, k).as_deref(), Some(want), "{k} in {run}");
    }
    assert!(str_attr(&run, "gen_ai.request.model").is_some(), "{run}");
    assert!(str_attr(&run, "hive.turn.decision").is_some(), "{run}");
    assert_eq!(
        attr(&run, "gen_ai.usage.input_tokens").unwrap()["intValue"],
        "2400"
    );
    assert_eq!(
        attr(&run, "gen_ai.usage.output_tokens").unwrap()["intValue"],
        "84"
    );
    assert_eq!(attr(&run, "hive.cost.usd").unwrap()["doubleValue"], 0.014);
    assert!(attr(&run, "error.type").is_none(), "{run}");

    // The tool call is the run's child, from tool_use to tool_result.
    let spans = col.spans();
    let tool = spans
        .iter()
        .find(|s| s["parentSpanId"] == run["spanId"])
        .unwrap_or_else(|| panic!("no child of the run span in {spans:?}"));
    assert_eq!(tool["name"], "execute_tool Read");
    assert_eq!(tool["traceId"], run["traceId"]);
    assert_eq!(str_attr(tool, "gen_ai.tool.name").as_deref(), Some("Read"));
    assert_eq!(
        str_attr(tool, "gen_ai.tool.call.id").as_deref(),
        Some("toolu_fake_1")
    );

    // claude ran under that span, and saw no OTEL_ variable.
    let env = inv_env(&h, 2);
    let tp = env
        .iter()
        .find(|(k, _)| k == "TRACEPARENT")
        .map(|(_, v)| v.clone());
    assert_eq!(
        tp,
        Some(format!(
            "00-{}-{}-01",
            run["traceId"].as_str().unwrap(),
            run["spanId"].as_str().unwrap()
        ))
    );
    assert!(
        !env.iter().any(|(k, _)| k.starts_with("OTEL_")),
        "an OTEL_ variable reached claude: {env:?}"
    );

    // The resource and the schema URL, and the body the official schema takes.
    let (path, body) = col.bodies().into_iter().next().unwrap();
    assert_eq!(path, "/v1/traces");
    let rs = &body["resourceSpans"][0];
    assert!(rs["schemaUrl"]
        .as_str()
        .unwrap()
        .starts_with("https://opentelemetry.io/schemas/"));
    let res = &rs["resource"];
    assert_eq!(str_attr(res, "service.name").as_deref(), Some("hive-test"));
    assert_eq!(
        str_attr(res, "deployment.environment").as_deref(),
        Some("ci")
    );
    assert!(str_attr(res, "service.instance.id").is_some());
    let bodies: Vec<Value> = col.bodies().into_iter().map(|(_, b)| b).collect();
    check_with_protobuf(&bodies);
}

#[test]
fn an_unreachable_collector_never_fails_a_turn_and_its_spans_are_counted_dropped() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let b = Broker::start(&["ana"]);
    let h = Harness::start(
        &b,
        "ana",
        &[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", url.as_str())],
    );
    h.fake.default_step(TOOL_TURN);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    for n in 0..3 {
        operator_send(&b, "ana", &format!("message {n}"));
    }
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    // Every turn completed (acked, nothing dead-lettered) and the spans
    // were dropped and counted.
    let row = agent_row(&b, "ana");
    assert_eq!((row.unread, row.inflight), (0, None));
    let log = wait_for(T, "the drop to be counted", || {
        let log = h.log();
        log.contains("span(s) dropped").then_some(log)
    });
    assert!(
        log.contains(&format!("http://127.0.0.1:{port} unreachable")),
        "{log}"
    );
    assert!(!log.contains("dead-letter"), "{log}");
    // TRACEPARENT is still given (sampled: spans are exported, or tried).
    let env = inv_env(&h, 2);
    let tp = env.iter().find(|(k, _)| k == "TRACEPARENT").unwrap();
    assert!(tp.1.starts_with("00-") && tp.1.ends_with("-01"), "{tp:?}");
}

#[test]
fn without_an_endpoint_claude_still_gets_an_unsampled_traceparent() {
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[("OTEL_SERVICE_NAME", "x")]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let env = inv_env(&h, 1);
    let tp = env.iter().find(|(k, _)| k == "TRACEPARENT").unwrap();
    assert!(tp.1.starts_with("00-") && tp.1.ends_with("-00"), "{tp:?}");
    assert!(!env.iter().any(|(k, _)| k.starts_with("OTEL_")), "{env:?}");
    assert!(!h.log().contains("exporting traces"), "no exporter thread");
}

#[test]
fn a_protocol_other_than_http_json_stops_the_start_naming_the_variable() {
    let b = Broker::start(&["ana"]);
    let mut h = Harness::start(
        &b,
        "ana",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ],
    );
    let status = wait_for(T, "hive serve to refuse to start", || h.exited());
    assert!(!status.success());
    let log = h.log();
    assert!(
        log.contains("OTEL_EXPORTER_OTLP_PROTOCOL is \"grpc\""),
        "{log}"
    );
    assert_eq!(h.fake.count(), 0, "no claude ran");
}

/// The spans named `invoke_agent {agent}` of message `id`.
fn run_of(col: &Collector, agent: &str, id: i64) -> Value {
    wait_for(
        T,
        &format!("the run span of {agent}'s message #{id}"),
        || {
            col.spans().into_iter().find(|s| {
                s["name"] == format!("invoke_agent {agent}").as_str()
                    && attr(s, "hive.message.id").and_then(|v| v["intValue"].as_str())
                        == Some(id.to_string().as_str())
            })
        },
    )
}

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[test]
fn a_wake_with_a_traceparent_links_the_run_to_it_and_a_bad_one_is_refused() {
    let col = Collector::start();
    let b = Broker::start(&["ana"]);
    let h = Harness::start(
        &b,
        "ana",
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", col.url.as_str())],
    );
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let sock = b.host_socket();
    let sock = sock.to_str().unwrap();
    // `hive wake --to ana --traceparent TP` (`extra` before it); its stdout.
    let wake = |body: &str, tp: &str, extra: &[&str]| {
        let mut args = vec!["wake", "--to", "ana", "--from", "cron", "--body", body];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--traceparent", tp, "--socket", sock]);
        let (code, out, err) = run_hive(&args, None, &[]);
        assert_eq!(code, 0, "{out}{err}");
        out
    };
    let out = wake("nightly", TP, &[]);
    let id: i64 = out
        .trim()
        .strip_prefix("queued #")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let run = run_of(&col, "ana", id);
    assert_eq!(
        run["links"][0]["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{run}"
    );
    assert_eq!(run["links"][0]["spanId"], "00f067aa0ba902b7");
    assert_ne!(run["traceId"], "4bf92f3577b34da6a3ce929d0e0e4736");

    // A transient wake (kept in memory only) links its run the same way.
    wait_drained(&b, "ana");
    let before = h.fake.count();
    let other = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    wake("fleeting", other, &["--transient"]);
    h.fake.wait_count(before + 1);
    let run = wait_for(T, "the transient wake's run span", || {
        col.spans().into_iter().find(|s| {
            s["name"] == "invoke_agent ana"
                && s["links"][0]["traceId"] == "0af7651916cd43dd8448eb211c80319c"
        })
    });
    assert_eq!(run["links"][0]["spanId"], "b7ad6b7169203331", "{run}");

    // All-zero ids, and no traceparent at all, are refused before sending.
    for bad in [
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "nonsense",
    ] {
        let (code, _, err) = run_hive(
            &[
                "send",
                "--to",
                "ana",
                "--traceparent",
                bad,
                "--socket",
                sock,
                "hi",
            ],
            None,
            &[],
        );
        assert_ne!(code, 0);
        assert!(
            err.contains("traceparent") && err.contains("not a W3C traceparent"),
            "{err}"
        );
    }
    let bodies: Vec<Value> = col.bodies().into_iter().map(|(_, b)| b).collect();
    check_with_protobuf(&bodies);
}

/// A broker from before traces: it refuses `traceparent` as an unknown
/// field, in the words serde's `deny_unknown_fields` gives the real one.
#[test]
fn against_a_broker_too_old_for_traceparent_the_cli_says_so() {
    let dir = TempDir::new("old-broker");
    let path = dir.path().join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        use std::io::{BufRead, BufReader};
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut line = String::new();
            let _ = BufReader::new(conn.try_clone().unwrap()).read_line(&mut line);
            let _ = conn.write_all(
                b"{\"ok\":false,\"error\":\"bad request: unknown field `traceparent`, expected one of `from`, `body`, `transient`, `to`\"}\n",
            );
        }
    });
    let sock = path.to_str().unwrap();
    let (code, _, err) = run_hive(
        &[
            "wake",
            "--to",
            "ana",
            "--from",
            "cron",
            "--body",
            "x",
            "--traceparent",
            TP,
            "--socket",
            sock,
        ],
        None,
        &[],
    );
    assert_ne!(code, 0);
    assert!(
        err.contains("the broker is too old for --traceparent"),
        "{err}"
    );
}

#[test]
fn a_send_through_hive_mcp_links_the_recipients_run_to_the_senders() {
    let col = Collector::start();
    let b = Broker::start(&["ana", "bob"]);
    let endpoint = [("OTEL_EXPORTER_OTLP_ENDPOINT", col.url.as_str())];
    let ana = Harness::start(&b, "ana", &endpoint);
    let bob = Harness::start(&b, "bob", &endpoint);
    ana.fake.wait_count(1);
    bob.fake.wait_count(1);
    wait_drained(&b, "ana");
    wait_drained(&b, "bob");
    // ana's next run calls hive's `send` tool through `hive mcp`, which
    // inherits the run's TRACEPARENT as it would from claude.
    let calls = [
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"fake","version":"1"}}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        r#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"send","arguments":{"to":"bob","body":"hello bob"}}}"#,
    ];
    let script = format!(
        "init\n(printf '%s\\n' {}; sleep 3) | HIVE_SOCKET={} HIVE_TOOL_GROUPS=messaging HIVE_LABEL=ana timeout 30 {} mcp > \"$FAKE_CLAUDE_DIR/mcp-$FAKE_N.out\" 2>&1\nsay sent\nresult_ok done\nexit 0\n",
        calls.map(|c| format!("'{c}'")).join(" "),
        b.agent_socket("ana").display(),
        hive_bin().display(),
    );
    ana.fake.step(2, &script);
    let id = operator_send(&b, "ana", "tell bob hello");
    ana.fake.wait_count(2);
    bob.fake.wait_count(2);
    wait_drained(&b, "bob");
    let out = std::fs::read_to_string(ana.fake.dir.join("mcp-2.out")).unwrap_or_default();
    assert!(out.contains("sent message #"), "{out}");
    let from_ana = run_of(&col, "ana", id);
    let bob_msg: i64 = out
        .split("sent message #")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    let at_bob = run_of(&col, "bob", bob_msg);
    assert_eq!(
        at_bob["links"][0]["traceId"], from_ana["traceId"],
        "{at_bob}"
    );
    assert_eq!(at_bob["links"][0]["spanId"], from_ana["spanId"], "{at_bob}");
    assert_eq!(
        str_attr(&at_bob, "hive.message.sender").as_deref(),
        Some("ana")
    );
    let bodies: Vec<Value> = col.bodies().into_iter().map(|(_, b)| b).collect();
    check_with_protobuf(&bodies);
}

#[test]
fn under_hive_up_the_harnesses_hand_their_spans_to_hive_up() {
    use common::up::Up;
    let col = Collector::start();
    let fleet = format!(
        r#"{{
  "hive_name": "tracehive",
  "telemetry": {{"endpoint": "{}", "service_name": "hive-up-test"}},
  "agents": [{{"name": "ana", "env": {{"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}}}]
}}"#,
        col.url
    );
    let up = Up::start(&fleet, &["ana"]);
    let fake = up.fake("ana");
    fake.wait_count(1);
    let run = wait_for(T, "the kick turn's span", || {
        col.spans()
            .into_iter()
            .find(|s| s["name"] == "invoke_agent ana")
    });
    // One exporter, hive up's: the resource names the hive and the service.
    let (_, body) = col
        .bodies()
        .into_iter()
        .find(|(_, b)| b.to_string().contains(run["spanId"].as_str().unwrap()))
        .unwrap();
    let res = &body["resourceSpans"][0]["resource"];
    assert_eq!(str_attr(res, "hive.name").as_deref(), Some("tracehive"));
    assert_eq!(
        str_attr(res, "service.name").as_deref(),
        Some("hive-up-test")
    );
    assert!(up.log().contains("exporting traces to"), "{}", up.log());
    // The harness ran no exporter of its own, and claude saw no OTEL_ variable.
    let log = std::fs::read_to_string(up.data().join("logs").join("ana.log")).unwrap_or_default();
    assert!(!log.contains("exporting traces to"), "{log}");
    let raw = std::fs::read(fake.dir.join("inv-1.env")).unwrap();
    let env = String::from_utf8_lossy(&raw);
    assert!(!env.split('\0').any(|kv| kv.starts_with("OTEL_")), "{env}");
    assert!(env.split('\0').any(|kv| kv.starts_with(&format!(
        "TRACEPARENT=00-{}-{}-01",
        run["traceId"].as_str().unwrap(),
        run["spanId"].as_str().unwrap()
    ))));
    let bodies: Vec<Value> = col.bodies().into_iter().map(|(_, b)| b).collect();
    check_with_protobuf(&bodies);
}

/// The real CLI passes the run's `TRACEPARENT` on to `hive mcp`, whose
/// `send` stores it with the message (so the recipient's run links to it).
fn the_real_cli_hands_hive_mcp_the_runs_traceparent(cli: &common::claude_cli::RealCli) {
    use common::claude_cli::{claude_env, harness_invocation, run_claude, Sandbox};
    use common::fake_anthropic::{FakeAnthropic, Scenario, Step};
    let broker = Broker::start(&["ruth"]);
    let state = TempDir::new("cli-trace");
    let sandbox = Sandbox::new("cli-trace");
    let fake = FakeAnthropic::start(Scenario::of(vec![
        Step::tool_use(
            "mcp__hyperhive__send",
            serde_json::json!({"to": "operator", "body": "traced"}),
        ),
        Step::text("sent it"),
    ]));
    let socket = broker.agent_socket("ruth");
    let bash_socket = state.path().join("bash.sock");
    let harness = harness_invocation(
        state.path(),
        &state.path().join("run"),
        &[
            ("HIVE_SOCKET", socket.to_str().unwrap()),
            ("HIVE_STATE_DIR", state.path().to_str().unwrap()),
            ("HIVE_BASH_SOCKET", bash_socket.to_str().unwrap()),
        ],
        "claude-sonnet-4-5",
        false,
    );
    let mut env = claude_env(&sandbox.home, &fake.base_url());
    env.push(("TRACEPARENT".into(), TP.into()));
    let run = run_claude(
        cli,
        &sandbox.cwd,
        &env,
        &harness.argv(),
        "do it\n",
        Duration::from_secs(90),
    );
    assert!(!run.timed_out, "the CLI hung\n{run}");
    assert_eq!(run.code, Some(0), "{run}");
    let inbox = operator_inbox(&broker);
    assert_eq!(inbox.len(), 1, "{inbox:?}\n{run}");
    let db = rusqlite::Connection::open_with_flags(
        broker.state_dir().join("broker.db"),
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
    )
    .unwrap();
    let stored: Option<String> = db
        .query_row(
            "SELECT traceparent FROM messages WHERE id = ?1",
            [inbox[0].id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(stored.as_deref(), Some(TP), "{run}");
}

common::claude_cli::real_cli_tests!(the_real_cli_hands_hive_mcp_the_runs_traceparent);

/// With `telemetry.cli` (`HIVE_TELEMETRY_CLI=1`, which `hive up` sets for
/// `telemetry.cli: true`) claude gets the collector and its headers, and the
/// harness leaves the tool spans to the CLI.
#[test]
fn with_telemetry_cli_claude_gets_the_collector_and_the_tool_spans_are_its_own() {
    let col = Collector::start();
    let b = Broker::start(&["ana"]);
    let h = Harness::start(
        &b,
        "ana",
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", col.url.as_str()),
            ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20t0k"),
            ("HIVE_TELEMETRY_CLI", "1"),
        ],
    );
    h.fake.default_step(TOOL_TURN);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let id = operator_send(&b, "ana", "read it");
    h.fake.wait_count(2);
    let run = run_of(&col, "ana", id);
    let env = inv_env(&h, 2);
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(
        get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
        Some(format!("{}/v1/traces", col.url))
    );
    assert_eq!(
        get("OTEL_EXPORTER_OTLP_TRACES_HEADERS").as_deref(),
        Some("authorization=Bearer%20t0k")
    );
    assert_eq!(get("CLAUDE_CODE_ENABLE_TELEMETRY").as_deref(), Some("1"));
    // Only the variables the harness passes on: not OTEL_SERVICE_NAME & co.
    assert_eq!(get("OTEL_EXPORTER_OTLP_ENDPOINT"), None);
    assert_eq!(get("OTEL_EXPORTER_OTLP_HEADERS"), None);
    assert!(
        col.spans()
            .iter()
            .all(|s| s["parentSpanId"] != run["spanId"]),
        "no tool span of hive's"
    );
}
