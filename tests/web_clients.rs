//! The live stream for every kind of HTTP client (issue 38, item 4): a client
//! that sends `Connection: close` (Python's urllib) or speaks HTTP/1.0 gets a
//! close-delimited stream and every later event, not only the replay; so does
//! a client behind a real nginx with its default proxy settings, in front of
//! `hive serve`'s page and of `hive up`'s dashboard. Live-stream places are
//! kept per login session, not per address, so clients behind one proxy do not
//! lock the operator out. Every wait has a timeout.

mod common;

use common::hive::*;
use common::nginx::{free_port, nginx, Nginx};
use common::up::Up;
use common::web::{Lines, Page};
use std::io::Write;
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// A harness for `ana` (its boot turn done) with `env`, and its page.
fn page(env: &[(&str, &str)]) -> (Broker, Harness, Page) {
    let mut all = vec![("HIVE_SSE_PING_SECS", "1")];
    all.extend_from_slice(env);
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &all);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let p = Page::of(&h.state_dir());
    (b, h, p)
}

/// A child process that is killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Python's urllib reading `url` line by line (it sends `Connection: close`),
/// with `headers`; its lines.
fn urllib(url: &str, headers: &[(&str, &str)]) -> (Killed, Lines) {
    let script = r#"
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1], headers=json.loads(sys.argv[2]))
with urllib.request.urlopen(req, timeout=60) as r:
    print("status", r.status, flush=True)
    for line in r:
        sys.stdout.write(line.decode())
        sys.stdout.flush()
"#;
    let headers: serde_json::Map<String, serde_json::Value> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!(v)))
        .collect();
    let mut child = Command::new("python3")
        .arg("-u")
        .arg("-c")
        .arg(script)
        .arg(url)
        .arg(serde_json::Value::Object(headers).to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("python3");
    let lines = Lines::spawn(child.stdout.take().unwrap());
    (Killed(child), lines)
}

/// A raw request written as given on a fresh connection; the answer's lines.
fn raw(port: u16, request: &str) -> Lines {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    Lines::spawn(s)
}

/// Sends `body` to ana as the operator once the stream's head has arrived
/// (so the turn starts after the client connected), and waits for its live
/// `turn_end` on `lines`.
fn live_turn(b: &Broker, lines: &Lines, body: &str) {
    lines.wait(T, "the stream's retry line", |l| l == "retry: 2000");
    operator_send(b, "ana", body);
    let end = lines.turn_end_of(body, T);
    assert_eq!(end["ok"], true, "{end}");
}

#[test]
fn urllib_and_http_1_0_clients_get_the_live_stream() {
    let (b, _h, p) = page(&[]);
    let t = p.token.clone().unwrap();

    let (_py, lines) = urllib(
        &p.url("/events"),
        &[("X-Hive-Token", &t), ("Accept", "text/event-stream")],
    );
    assert_eq!(lines.next(T).as_deref(), Some("status 200"));
    live_turn(&b, &lines, "for urllib");
    // And the next turn too: the stream goes on.
    operator_send(&b, "ana", "for urllib again");
    lines.turn_end_of("for urllib again", T);

    let http10 = raw(
        p.port,
        &format!(
            "GET /events HTTP/1.0\r\nHost: 127.0.0.1:{}\r\nX-Hive-Token: {t}\r\n\r\n",
            p.port
        ),
    );
    let status = http10.next(T).unwrap();
    assert!(status.ends_with(" 200 OK"), "{status}");
    live_turn(&b, &http10, "for HTTP/1.0");

    let close = raw(
        p.port,
        &format!(
            "GET /events HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\
             X-Hive-Token: {t}\r\n\r\n",
            p.port
        ),
    );
    live_turn(&b, &close, "for Connection: close");
}
