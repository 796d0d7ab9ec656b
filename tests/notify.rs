//! Notifications (issue 43, item 3), end to end: a real `hive broker` with a
//! fleet file's `notify` block pushes to webhook receivers run here on
//! 127.0.0.1. The `json` receiver checks every signature (in Rust, and with
//! the Python snippet of `docs/observability.md`, run as written) and
//! processes each event id once; the `ntfy` and `slack` receivers check
//! their formats. Outages, a clean restart and a kill -9 of the broker each
//! lose nothing; a receiver that never answers slows no send.

mod common;

use common::hive::{ok, run_hive, wait_for, Broker, Process, TempDir};
use hyperhive::proto::cmd::{Ask, DeadLetter, RecvNext};
use serde_json::Value;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The Standard Webhooks secret the `json` destinations sign with.
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// One request a receiver took.
#[derive(Debug, Clone)]
struct Got {
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The status it was answered with.
    status: u16,
}

impl Got {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
}

/// How the receiver answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Ok,
    /// 503 Service Unavailable.
    Down,
    /// Reads the request and never answers.
    Hang,
}

/// A webhook receiver on 127.0.0.1: every request, and how it answered.
#[derive(Clone)]
struct Receiver {
    port: u16,
    got: Arc<Mutex<Vec<Got>>>,
    mode: Arc<Mutex<Mode>>,
}

impl Receiver {
    fn start() -> Receiver {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let r = Receiver {
            port: l.local_addr().unwrap().port(),
            got: Arc::default(),
            mode: Arc::new(Mutex::new(Mode::Ok)),
        };
        let me = r.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let me = me.clone();
                std::thread::spawn(move || me.serve(s));
            }
        });
        r
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn set(&self, m: Mode) {
        *self.mode.lock().unwrap() = m;
    }

    /// Requests on one connection, until it closes.
    fn serve(&self, s: TcpStream) {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut w = s.try_clone().unwrap();
        let mut r = BufReader::new(s);
        loop {
            let mut first = String::new();
            if r.read_line(&mut first).unwrap_or(0) == 0 {
                return;
            }
            let path = first.split(' ').nth(1).unwrap_or("").to_string();
            let mut headers = Vec::new();
            loop {
                let mut l = String::new();
                if r.read_line(&mut l).unwrap_or(0) == 0 {
                    return;
                }
                let l = l.trim_end();
                if l.is_empty() {
                    break;
                }
                let (k, v) = l.split_once(':').unwrap();
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
            let len: usize = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .map_or(0, |(_, v)| v.parse().unwrap());
            let mut body = vec![0; len];
            if r.read_exact(&mut body).is_err() {
                return;
            }
            let mode = *self.mode.lock().unwrap();
            let status = match mode {
                Mode::Ok => 200,
                Mode::Down => 503,
                Mode::Hang => {
                    self.got.lock().unwrap().push(Got {
                        path,
                        headers,
                        body,
                        status: 0,
                    });
                    // Held until the client gives up.
                    let mut rest = Vec::new();
                    let _ = r.read_to_end(&mut rest);
                    return;
                }
            };
            self.got.lock().unwrap().push(Got {
                path,
                headers,
                body,
                status,
            });
            let reason = if status == 200 { "OK" } else { "Unavailable" };
            if w.write_all(
                format!("HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\n\r\n").as_bytes(),
            )
            .is_err()
            {
                return;
            }
        }
    }

    /// Every request answered 200 to `path`.
    fn taken(&self, path: &str) -> Vec<Got> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.path == path && g.status == 200)
            .cloned()
            .collect()
    }

    /// Every request to `path`, whatever it was answered.
    fn tries(&self, path: &str) -> Vec<Got> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.path == path)
            .cloned()
            .collect()
    }

    /// Waits until `path` took `n` distinct events; the first copy of each
    /// (a `json` receiver dedupes by `webhook-id`), in arrival order.
    fn wait_events(&self, path: &str, n: usize) -> Vec<Got> {
        wait_for(
            Duration::from_secs(60),
            &format!("{n} events at {path}"),
            || {
                let once = dedupe(self.taken(path));
                (once.len() >= n).then_some(once)
            },
        )
    }
}

/// The first delivery of each event id, in arrival order: what a receiver
/// deduplicating by `webhook-id` processes.
fn dedupe(got: Vec<Got>) -> Vec<Got> {
    let mut seen = BTreeSet::new();
    got.into_iter()
        .filter(|g| seen.insert(g.header("webhook-id").unwrap().to_string()))
        .collect()
}

/// Checks a `json` delivery's Standard Webhooks signature against `SECRET`,
/// in Rust: HMAC-SHA256 over `id.timestamp.body`, base64, after `v1,`.
fn verify(g: &Got) {
    let id = g.header("webhook-id").expect("webhook-id");
    let ts = g.header("webhook-timestamp").expect("webhook-timestamp");
    let sig = g.header("webhook-signature").expect("webhook-signature");
    let key = hyperhive::broker::notify::sign::base64_decode(&SECRET["whsec_".len()..]).unwrap();
    let mut signed = format!("{id}.{ts}.").into_bytes();
    signed.extend_from_slice(&g.body);
    let mac = hyperhive::broker::notify::sign::hmac_sha256(&key, &signed);
    let want = format!("v1,{}", hyperhive::broker::notify::sign::base64(&mac));
    assert!(
        sig.split(' ').any(|s| s == want),
        "signature {sig} of {id} is not {want}"
    );
    let now = hyperhive::proto::now();
    let ts: i64 = ts.parse().unwrap();
    assert!((now - ts).abs() <= 300, "timestamp {ts} within 5 minutes");
}

/// The verification snippet of `docs/observability.md`, as written there,
/// run by python3 on `g`: it must accept it, and refuse it with one byte of
/// the body changed or a timestamp an hour old.
fn verify_with_the_docs_snippet(g: &Got, dir: &Path) {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/observability.md"
    ))
    .unwrap();
    let start = doc
        .find("```python\n# verify-webhook")
        .expect("the snippet in docs/observability.md");
    let code = &doc[start + "```python\n".len()..];
    let code = &code[..code.find("```").unwrap()];
    let script = dir.join("verify.py");
    std::fs::write(
        &script,
        format!(
            "{code}\nimport json, sys\nreq = json.load(open(sys.argv[1]))\n\
             print(verify(req['secret'], req['headers'], req['body'].encode()))\n"
        ),
    )
    .unwrap();
    let run = |headers: serde_json::Map<String, Value>, body: &str| -> (bool, String) {
        let input = dir.join("req.json");
        let req = serde_json::json!({"secret": SECRET, "headers": headers, "body": body});
        std::fs::write(&input, req.to_string()).unwrap();
        let out = std::process::Command::new("python3")
            .arg(&script)
            .arg(&input)
            .output()
            .expect("python3");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    };
    let headers: serde_json::Map<String, Value> =
        ["webhook-id", "webhook-timestamp", "webhook-signature"]
            .iter()
            .map(|k| (k.to_string(), Value::String(g.header(k).unwrap().into())))
            .collect();
    let body = g.text();
    let (good, out) = run(headers.clone(), &body);
    assert!(good, "the docs' snippet accepts the delivery: {out}");
    let (good, _) = run(headers.clone(), &body.replacen('{', "{ ", 1));
    assert!(!good, "a changed body is refused");
    let mut old = headers;
    let ts: i64 = g.header("webhook-timestamp").unwrap().parse().unwrap();
    old.insert("webhook-timestamp".into(), (ts - 3600).to_string().into());
    let (good, _) = run(old, &body);
    assert!(!good, "an hour-old timestamp is refused");
}

/// A private file holding `text` (mode 0600).
fn private_file(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.display().to_string()
}

/// A broker of agents ana and bob whose fleet file's `notify` is `notify`,
/// retrying after 50 ms (doubling) and looking at its queues every 50 ms.
fn broker(notify: &str) -> Broker {
    Broker::start_process(
        &[],
        Some(&format!(
            r#"{{"hive_name":"nt","agents":[{{"name":"ana"}},{{"name":"bob"}}],"notify":{notify}}}"#
        )),
        Process {
            env: vec![
                ("HIVE_NOTIFY_BACKOFF_MS".into(), "50".into()),
                ("HIVE_NOTIFY_POLL_MS".into(), "50".into()),
            ],
            ..Process::default()
        },
    )
}

fn send(b: &Broker, from: &str, to: &str, body: &str) -> i64 {
    common::hive::agent_send(b, from, to, body)
}

fn status(b: &Broker) -> Value {
    let sock = b.host_socket().display().to_string();
    let (code, out, err) = run_hive(
        &["notify", "status", "--json", "--socket", &sock],
        None,
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn all_three_formats_arrive_signed_and_in_order_per_destination_and_agent() {
    let rx = Receiver::start();
    let files = TempDir::new("nt-files");
    let secret = private_file(files.path(), "secret", &format!("{SECRET}\n"));
    let slack_url = private_file(
        files.path(),
        "slack-url",
        &rx.url("/slack/T000/B000/sekrit-token"),
    );
    let b = broker(&format!(
        r#"{{"to":[
            {{"url":"{}","secret_file":"{secret}"}},
            {{"url":"{}","format":"ntfy","events":["message_to_operator","question"]}},
            {{"url_file":"{slack_url}","format":"slack","events":["message_to_operator"]}}]}}"#,
        rx.url("/json"),
        rx.url("/ntfy/hive-alerts"),
    ));

    // Mail to the operator from two agents, interleaved; a question; a
    // dead letter; mail between agents raises nothing.
    for i in 1..=3 {
        send(
            &b,
            "ana",
            "operator",
            &format!("ana {i}: a <b> & c\r\nline two"),
        );
        send(&b, "bob", "operator", &format!("bob {i}"));
    }
    send(&b, "ana", "bob", "not for the operator");
    ok(
        &mut b.agent("ana"),
        Ask {
            question: "ship\nit?".into(),
            options: vec!["yes".into(), "no".into()],
            multi: false,
            ttl_seconds: None,
            to: None,
        },
    );
    let mut bob = b.agent("bob");
    let r: hyperhive::proto::cmd::RecvNextReply = bob
        .call(&RecvNext {
            wait_seconds: Some(0),
            seen: None,
        })
        .unwrap();
    let dead = r.message.expect("ana's mail to bob").id;
    ok(
        &mut bob,
        DeadLetter {
            id: dead,
            error: "claude failed 5 times".into(),
            ran: true,
        },
    );

    // A credential pool's usage limit (ana's), and bob's harness saying
    // claude needs a login.
    let until = hyperhive::proto::now() + 3600;
    let mut ana = b.agent("ana");
    common::hive::call_raw(
        &mut ana,
        r#"{"cmd":"report_pool","account_uuid":"3F1C-AA"}"#,
    )
    .unwrap();
    common::hive::call_raw(
        &mut ana,
        &format!(
            r#"{{"cmd":"report_usage_limit","until":{until},"detail":"session limit","credential":{{"account_uuid":"3F1C-AA"}}}}"#
        ),
    )
    .unwrap();
    common::hive::call_raw(
        &mut b.agent("bob"),
        r#"{"cmd":"report_state","paused":{"reason":"login","detail":"not logged in"}}"#,
    )
    .unwrap();

    let json = rx.wait_events("/json", 10);
    for g in &json {
        verify(g);
    }
    verify_with_the_docs_snippet(&json[0], files.path());
    let events: Vec<(String, String)> = json
        .iter()
        .map(|g| {
            let v = g.json();
            (
                v["type"].as_str().unwrap().to_string(),
                v["data"]["agent"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("message_to_operator", "ana"),
        ("message_to_operator", "bob"),
        ("message_to_operator", "ana"),
        ("message_to_operator", "bob"),
        ("message_to_operator", "ana"),
        ("message_to_operator", "bob"),
        ("question", "ana"),
        ("dead_letter", "bob"),
        ("usage_limit", "system"),
        ("needs_login", "bob"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    assert_eq!(events, want, "the order they happened in");
    let first = json[0].json();
    assert_eq!(first["data"]["hive"], "nt");
    assert_eq!(first["data"]["body"], "ana 1: a <b> & c\r\nline two");
    assert_eq!(first["data"]["preview"], "ana 1: a <b> & c  line two");
    assert_eq!(first["data"]["id"], json[0].header("webhook-id").unwrap());
    let q = json[6].json();
    assert_eq!(q["data"]["preview"], "question #1: ship it?");
    assert!(
        q["data"].get("body").is_none(),
        "only a message's body leaves"
    );
    let d = json[7].json();
    assert!(
        d["data"]["preview"]
            .as_str()
            .unwrap()
            .ends_with("dead-lettered: claude failed 5 times"),
        "{d}"
    );

    let ntfy = rx.wait_events_plain("/ntfy/hive-alerts", 7);
    assert_eq!(ntfy[0].header("Title"), Some("hive nt: message from ana"));
    assert_eq!(ntfy[0].header("Priority"), Some("default"));
    assert_eq!(ntfy[0].header("Tags"), Some("hive,message_to_operator"));
    assert_eq!(ntfy[0].text(), "ana 1: a <b> & c\r\nline two");
    assert_eq!(
        ntfy[6].header("Title"),
        Some("hive nt: ana asks you a question")
    );
    assert_eq!(ntfy[6].header("Priority"), Some("high"));
    assert_eq!(ntfy[6].text(), "question #1: ship it?");

    let slack = rx.wait_events_plain("/slack/T000/B000/sekrit-token", 6);
    assert_eq!(
        slack[0].json(),
        serde_json::json!({"text": "*hive nt: message from ana*\nana 1: a &lt;b&gt; &amp; c\r\nline two"})
    );
    assert!(slack
        .iter()
        .all(|g| g.header("webhook-signature").is_none()));

    // Status: every destination by scheme and host; nothing pending.
    let st = wait_for(Duration::from_secs(30), "nothing pending", || {
        let st = status(&b);
        st["destinations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["pending"] == 0)
            .then_some(st)
    });
    let dests = st["destinations"].as_array().unwrap();
    assert_eq!(dests.len(), 3);
    for d in dests {
        assert_eq!(d["url"], format!("http://127.0.0.1:{}", rx.port));
        assert!(d["last_ok_at"].is_i64(), "{d}");
    }
    let delivered: Vec<u64> = {
        let mut v: Vec<u64> = dests
            .iter()
            .map(|d| d["delivered"].as_u64().unwrap())
            .collect();
        v.sort();
        v
    };
    assert_eq!(delivered, [6, 7, 10]);
    // Neither the secret nor a URL's path is logged.
    let log = b.log();
    assert!(!log.contains("sekrit") && !log.contains("MfKQ9r8"), "{log}");
    assert!(
        !log.contains("/json") && !log.contains("hive-alerts"),
        "{log}"
    );
}

impl Receiver {
    /// [`Receiver::wait_events`] for formats without an event id: every
    /// request taken, in order.
    fn wait_events_plain(&self, path: &str, n: usize) -> Vec<Got> {
        wait_for(
            Duration::from_secs(60),
            &format!("{n} requests at {path}"),
            || {
                let got = self.taken(path);
                (got.len() >= n).then_some(got)
            },
        )
    }
}

/// The `message_to_operator` bodies a `json` receiver processed, once each.
fn bodies(got: &[Got]) -> Vec<String> {
    got.iter()
        .map(|g| g.json()["data"]["body"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_receiver_outage_and_a_clean_broker_restart_each_lose_nothing() {
    let rx = Receiver::start();
    let files = TempDir::new("nt-out");
    let secret = private_file(files.path(), "secret", SECRET);
    let mut b = broker(&format!(
        r#"{{"give_up_days":2,"to":[{{"url":"{}","secret_file":"{secret}"}}]}}"#,
        rx.url("/json")
    ));

    // The receiver answers 503 for a while, then comes back.
    rx.set(Mode::Down);
    for i in 1..=3 {
        send(&b, "ana", "operator", &format!("outage {i}"));
    }
    // The receiver sees a try before the broker records its refusal: wait
    // for the record.
    let d = wait_for(Duration::from_secs(60), "three refused tries", || {
        let st = status(&b);
        let d = st["destinations"][0].clone();
        (rx.tries("/json").len() >= 3 && d["failed"].as_u64()? >= 3).then_some(d)
    });
    assert_eq!(d["last_error"], "HTTP 503", "{d}");
    assert_eq!(d["pending"], 3, "{d}");
    let sock = b.host_socket().display().to_string();
    let (_, out, _) = run_hive(&["notify", "status", "--socket", &sock], None, &[]);
    assert!(
        out.contains(&format!("http://127.0.0.1:{} (json): 3 pending", rx.port))
            && out.contains("last error HTTP 503"),
        "{out}"
    );
    rx.set(Mode::Ok);
    let got = rx.wait_events("/json", 3);
    assert_eq!(bodies(&got), ["outage 1", "outage 2", "outage 3"]);
    got.iter().for_each(verify);

    // A clean restart while events wait: they go once it is back.
    rx.set(Mode::Down);
    for i in 4..=5 {
        send(&b, "bob", "operator", &format!("restart {i}"));
    }
    wait_for(Duration::from_secs(60), "a refused try of the next", || {
        (rx.tries("/json").iter().filter(|g| g.status == 503).count() > 3).then_some(())
    });
    let status_code = b.terminate();
    assert!(status_code.success(), "{status_code}");
    rx.set(Mode::Ok);
    b.restart();
    let got = rx.wait_events("/json", 5);
    assert_eq!(
        bodies(&got),
        ["outage 1", "outage 2", "outage 3", "restart 4", "restart 5"]
    );
    got.iter().for_each(verify);
    // The broker records a delivery after the receiver answered it.
    let d = wait_for(Duration::from_secs(60), "the deliveries recorded", || {
        let st = status(&b);
        let d = st["destinations"][0].clone();
        (d["pending"].as_u64()? == 0).then_some(d)
    });
    assert_eq!(d["dropped"].as_u64(), Some(0), "{d}");
    assert!(d["delivered"].as_u64().unwrap() >= 5, "{d}");
}

#[test]
fn a_kill_9_of_the_broker_while_events_are_pending_sends_each_at_least_once() {
    let rx = Receiver::start();
    let files = TempDir::new("nt-k9");
    let secret = private_file(files.path(), "secret", SECRET);
    let mut b = broker(&format!(
        r#"{{"to":[{{"url":"{}","secret_file":"{secret}"}}]}}"#,
        rx.url("/json")
    ));
    let mut sent = Vec::new();
    for round in 0..3 {
        // Some taken, some refused and waiting, when the broker dies.
        rx.set(Mode::Ok);
        for i in 0..6 {
            let body = format!("round {round} mail {i}");
            send(
                &b,
                if i % 2 == 0 { "ana" } else { "bob" },
                "operator",
                &body,
            );
            sent.push(body);
            if i == 3 {
                rx.set(Mode::Down);
            }
        }
        wait_for(Duration::from_secs(60), "a refused try", || {
            rx.tries("/json")
                .iter()
                .any(|g| g.status == 503)
                .then_some(())
        });
        b.kill9();
        rx.set(Mode::Ok);
        b.restart();
    }
    let got = rx.wait_events("/json", sent.len());
    got.iter().for_each(verify);
    assert_eq!(bodies(&got), sent, "each once, in order, after three kills");
    assert!(rx.taken("/json").len() >= sent.len());
}

#[test]
fn a_receiver_that_never_answers_slows_and_fails_no_send_or_turn() {
    let rx = Receiver::start();
    rx.set(Mode::Hang);
    // A port nothing listens on, too.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!(
        "http://127.0.0.1:{}/gone",
        closed.local_addr().unwrap().port()
    );
    drop(closed);
    let b = broker(&format!(
        r#"{{"to":[{{"url":"{}"}},{{"url":"{dead}","format":"ntfy"}}]}}"#,
        rx.url("/hang")
    ));
    send(&b, "ana", "operator", "first, held by the receiver");
    wait_for(
        Duration::from_secs(30),
        "the receiver to hold a request",
        || (!rx.tries("/hang").is_empty()).then_some(()),
    );
    // While the sender waits on it, every send, question and read answers.
    let mut ids = Vec::new();
    for i in 0..20 {
        ids.push(send(&b, "bob", "operator", &format!("during {i}")));
        send(&b, "ana", "bob", &format!("between agents {i}"));
    }
    ok(
        &mut b.agent("ana"),
        Ask {
            question: "still there?".into(),
            options: vec![],
            multi: false,
            ttl_seconds: None,
            to: None,
        },
    );
    // And a turn runs and is acked: ana's harness, its kick, then mail.
    let h = common::hive::Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    common::hive::operator_send(&b, "ana", "a turn while the receiver hangs");
    h.fake.wait_count(2);
    common::hive::wait_drained(&b, "ana");
    assert!(common::hive::agent_row(&b, "ana").turns >= 2);
    let inbox = common::hive::operator_inbox(&b);
    assert_eq!(inbox.len(), 21, "every message reached the operator");
    assert_eq!(ids.len(), 20);
    // The dead port's tries failed by their kind, never naming the URL.
    let err = wait_for(Duration::from_secs(30), "the dead port's error", || {
        let st = status(&b);
        let d = st["destinations"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["format"] == "ntfy")
            .unwrap()
            .clone();
        d["last_error"].as_str().map(str::to_string)
    });
    assert!(err.contains("Connection Failed"), "{err}");
    assert!(
        !err.contains("/gone") && !err.contains("127.0.0.1"),
        "{err}"
    );
}

#[test]
fn notify_test_reaches_every_destination_and_status_shows_each_ones_last_error() {
    let rx = Receiver::start();
    let b = broker(&format!(
        r#"{{"to":[{{"url":"{}","events":["budget"]}},{{"url":"{}","format":"slack"}}]}}"#,
        rx.url("/ok"),
        rx.url("/down"),
    ));
    // Both refuse it first (503), then take it.
    let sock = b.host_socket().display().to_string();
    rx.set(Mode::Down);
    let (code, out, err) = run_hive(&["notify", "test", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("queued for 2 destination(s)"), "{out}");
    wait_for(Duration::from_secs(30), "both refused", || {
        let st = status(&b);
        st["destinations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["last_error"] == "HTTP 503")
            .then_some(())
    });
    rx.set(Mode::Ok);
    let got = rx.wait_events("/ok", 1);
    assert_eq!(got[0].json()["type"], "test", "taken whatever its events");
    let slack = rx.wait_events_plain("/down", 1);
    assert_eq!(
        slack[0].json()["text"],
        "*hive nt: test notification*\na test notification from `hive notify test`"
    );
    // The broker records a delivery after the receiver answered it.
    wait_for(Duration::from_secs(30), "a success in the status", || {
        let (_, out, _) = run_hive(&["notify", "status", "--socket", &sock], None, &[]);
        out.contains("last success").then_some(())
    });

    // Without destinations, `hive notify test` says what to do.
    let plain = Broker::start(&["ana"]);
    let sock = plain.host_socket().display().to_string();
    let (code, _, err) = run_hive(&["notify", "test", "--socket", &sock], None, &[]);
    assert_ne!(code, 0);
    assert!(err.contains("no notify destinations"), "{err}");
}

#[test]
fn a_bad_notify_block_is_a_start_error_naming_what_to_fix() {
    let files = TempDir::new("nt-bad");
    let secret = files.path().join("secret");
    std::fs::write(&secret, SECRET).unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
    let start = |notify: &str| {
        let cfg = files.path().join("hive.json");
        std::fs::write(
            &cfg,
            format!(r#"{{"agents":[{{"name":"ana"}}],"notify":{notify}}}"#),
        )
        .unwrap();
        let (s, r) = (files.path().join("s"), files.path().join("r"));
        let (code, out, err) = run_hive(
            &[
                "broker",
                "--config",
                cfg.to_str().unwrap(),
                "--state-dir",
                s.to_str().unwrap(),
                "--run-dir",
                r.to_str().unwrap(),
            ],
            None,
            &[],
        );
        assert_ne!(code, 0, "{out}{err}");
        err
    };
    let e = start(&format!(
        r#"{{"to":[{{"url":"http://127.0.0.1:9/h","secret_file":"{}"}}]}}"#,
        secret.display()
    ));
    assert!(
        e.contains(&secret.display().to_string()) && e.contains("chmod 600"),
        "{e}"
    );
    assert!(!e.contains("MfKQ"), "the secret is not shown: {e}");
    let e = start(r#"{"to":[{"url":"http://127.0.0.1:9/h","events":["questions"]}]}"#);
    assert!(e.contains("unknown event \"questions\""), "{e}");
    let e = start(r#"{"to":[{"url":"http://127.0.0.1:9/h","format":"teams"}]}"#);
    assert!(e.contains("unknown format \"teams\""), "{e}");
    let e = start(r#"{"to":[{"url_file":"/nonexistent/hook-url","format":"slack"}]}"#);
    assert!(
        e.contains("notify.to[0].url_file") && e.contains("/nonexistent/hook-url"),
        "{e}"
    );
}

#[test]
fn a_harness_crash_under_hive_up_notifies_and_the_dashboard_shows_a_failing_destination() {
    use common::up::Up;
    let rx = Receiver::start();
    rx.set(Mode::Down);
    let fleet = format!(
        r#"{{"hive_name":"upn","agents":[{{"name":"ana","env":{{"FAKE_CLAUDE_DIR":"@FAKE(ana)"}}}}],
            "notify":{{"to":[{{"url":"{}","events":["agent_crashed"]}}]}}}}"#,
        rx.url("/crash")
    );
    let up = Up::start_env(
        &fleet,
        &["ana"],
        &[
            ("HIVE_NOTIFY_BACKOFF_MS", "50"),
            ("HIVE_NOTIFY_POLL_MS", "50"),
        ],
    );
    let pid = up.wait_running("ana");
    // SAFETY: kill(2) of the harness the supervisor runs.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_for(Duration::from_secs(60), "a refused try", || {
        (!rx.tries("/crash").is_empty()).then_some(())
    });
    // The dashboard's notify line: the destination by scheme and host, its
    // error.
    let dash = up.dashboard();
    let line = wait_for(Duration::from_secs(30), "the notify line", || {
        let h = dash.get("/api/hive").ok()?;
        h["notify"].as_array()?.first().cloned()
    });
    assert_eq!(line["url"], format!("http://127.0.0.1:{}", rx.port));
    assert_eq!(line["last_error"], "HTTP 503");
    // The hive-wide /metrics counts the refused tries by destination.
    let failed = format!(
        "hive_notify_deliveries_total{{destination=\"http://127.0.0.1:{}\",result=\"failed\"}} ",
        rx.port
    );
    let metrics = ureq::get(&format!("{}/metrics", dash.base))
        .set("Authorization", &format!("Bearer {}", dash.token))
        .call()
        .expect("the dashboard's /metrics")
        .into_string()
        .unwrap();
    let tries: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix(&failed))
        .unwrap_or_else(|| panic!("no {failed:?} in\n{metrics}"))
        .parse()
        .unwrap();
    assert!(tries >= 1.0, "{metrics}");
    rx.set(Mode::Ok);
    let got = rx.wait_events("/crash", 1);
    let v = got[0].json();
    assert_eq!(
        (v["type"].as_str(), v["data"]["agent"].as_str()),
        (Some("agent_crashed"), Some("ana"))
    );
    assert!(
        v["data"]["preview"]
            .as_str()
            .unwrap()
            .starts_with("ana's harness exited"),
        "{v}"
    );
    wait_for(Duration::from_secs(30), "the line to go", || {
        let h = dash.get("/api/hive").ok()?;
        h["notify"].as_array()?.is_empty().then_some(())
    });
}

#[test]
fn a_notify_block_applies_at_hive_reload_and_one_that_cannot_be_read_changes_nothing() {
    use common::hive::refused;
    use common::up::Up;
    use hyperhive::proto::cmd::{NotifyTest, Reload};
    let rx = Receiver::start();
    let up = Up::start_env(
        r#"{"hive_name":"rl","agents":[{"name":"ana","env":{"FAKE_CLAUDE_DIR":"@FAKE(ana)"}}]}"#,
        &["ana"],
        &[
            ("HIVE_NOTIFY_BACKOFF_MS", "50"),
            ("HIVE_NOTIFY_POLL_MS", "50"),
        ],
    );
    let pid = up.wait_running("ana");
    let err = refused(&mut up.host(), NotifyTest {});
    assert!(
        err.contains("no notify destinations") && err.contains("hive reload"),
        "{err}"
    );
    // The fleet file with `notify` set (or taken out).
    let write = |notify: Option<Value>| {
        let path = up.fleet_file();
        let mut cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        match notify {
            Some(n) => cfg["notify"] = n,
            None => {
                cfg.as_object_mut().unwrap().remove("notify");
            }
        }
        std::fs::write(&path, cfg.to_string()).unwrap();
    };
    let reload = || {
        ok(&mut up.host(), Reload {})["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let test_text = "*hive rl: test notification*\na test notification from `hive notify test`";

    // Added: it applies with the reload's answer, nothing restarts.
    write(Some(
        serde_json::json!({"to": [{"url": rx.url("/one"), "format": "slack"}]}),
    ));
    let text = reload();
    assert!(
        text.contains("notify: applies now (1 destination;"),
        "{text}"
    );
    ok(&mut up.host(), NotifyTest {});
    assert_eq!(rx.wait_events_plain("/one", 1)[0].json()["text"], test_text);

    // A secret file that cannot be read refuses the reload: the destination
    // before stays.
    write(Some(serde_json::json!({"to": [{
        "url": rx.url("/two"), "secret_file": "/nonexistent/hive-secret"}]})));
    let err = refused(&mut up.host(), Reload {});
    assert!(
        err.contains("nothing changed")
            && err.contains("notify.to[0].secret_file")
            && err.contains("/nonexistent/hive-secret"),
        "{err}"
    );
    ok(&mut up.host(), NotifyTest {});
    assert_eq!(rx.wait_events_plain("/one", 2)[1].json()["text"], test_text);

    // Moved: the new destination takes what comes after, the old one nothing
    // more.
    write(Some(
        serde_json::json!({"to": [{"url": rx.url("/two"), "format": "slack"}]}),
    ));
    let text = reload();
    assert!(text.contains("notify: applies now"), "{text}");
    ok(&mut up.host(), NotifyTest {});
    assert_eq!(rx.wait_events_plain("/two", 1)[0].json()["text"], test_text);
    let status = ok(&mut up.host(), hyperhive::proto::cmd::NotifyStatus {});
    assert_eq!(
        status["destinations"].as_array().unwrap().len(),
        1,
        "{status:?}"
    );
    assert_eq!(
        rx.tries("/one").len(),
        2,
        "the old destination takes nothing more"
    );

    // Its files are read at every reload: a `url_file` naming a new URL
    // moves the queue with the fleet file unchanged.
    let files = TempDir::new("nt-reload");
    let url_file = files.path().join("hook-url");
    std::fs::write(&url_file, rx.url("/three")).unwrap();
    write(Some(serde_json::json!({"to": [{
        "url_file": url_file.display().to_string(), "format": "slack"}]})));
    assert!(reload().contains("notify: applies now"));
    ok(&mut up.host(), NotifyTest {});
    assert_eq!(
        rx.wait_events_plain("/three", 1)[0].json()["text"],
        test_text
    );
    std::fs::write(&url_file, rx.url("/four")).unwrap();
    let text = reload();
    assert!(!text.contains("notify"), "the block is unchanged: {text}");
    ok(&mut up.host(), NotifyTest {});
    assert_eq!(
        rx.wait_events_plain("/four", 1)[0].json()["text"],
        test_text
    );
    assert_eq!(rx.tries("/three").len(), 1);

    // Taken out: nothing is sent, and `hive notify test` says so again.
    write(None);
    let text = reload();
    assert!(text.contains("notify: removed"), "{text}");
    let err = refused(&mut up.host(), NotifyTest {});
    assert!(err.contains("no notify destinations"), "{err}");
    assert_eq!(up.wait_running("ana"), pid, "no reload restarted the agent");
}
