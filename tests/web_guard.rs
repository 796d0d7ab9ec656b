//! The web guard of both servers against real processes (`hive serve`'s page
//! and `hive up`'s dashboard), from the reproducers of the robustness probe
//! (issue 12; probe §1–§5, §11, §18, §21, §22): cross-site and foreign-`Host`
//! requests are refused with nothing changed, another local user gets 401, a
//! 1 GiB header is refused without the memory, stalled bodies (stalled login
//! forms too, issue 38) do not freeze the page or the dashboard, a page out
//! of descriptors serves again, clients that never read
//! do not lock out one that does, `HEAD` works, `/login` is throttled and the
//! dashboard's one-time link works once. Every wait has a timeout.

mod common;

use common::hive::*;
use common::up::Up;
use common::web::Page;
use hyperhive::proto::cmd::{Approvals, Ask, Inbox, Questions, RequestSpawn, Send};
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(20);
const EVIL: &str = "https://evil.example";

/// One request written exactly as given, on a fresh connection: (status, the
/// whole answer).
fn raw(port: u16, request: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    (status_of(&text), text)
}

fn status_of(text: &str) -> u16 {
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"))
}

/// A POST of `body` to `path` with extra header lines `headers` (each ending
/// in CRLF).
fn post(port: u16, path: &str, headers: &str, body: &str) -> (u16, String) {
    raw(
        port,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{headers}Content-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// The header line that carries `token`, if any.
fn token_line(token: Option<&str>) -> String {
    token
        .map(|t| format!("X-Hive-Token: {t}\r\n"))
        .unwrap_or_default()
}

/// What a hostile page can make a browser send (a simple cross-site request:
/// no custom header, and no cookie, which is SameSite=Strict), and the same
/// with the token, which the guard refuses too.
fn attacks(token: Option<&str>) -> Vec<String> {
    let t = token_line(token);
    vec![
        format!("Origin: {EVIL}\r\nContent-Type: text/plain;charset=UTF-8\r\n"),
        format!("Origin: {EVIL}\r\nSec-Fetch-Site: cross-site\r\nContent-Type: text/plain\r\n"),
        format!("Origin: {EVIL}\r\nContent-Type: application/json\r\n{t}"),
        format!("Sec-Fetch-Site: cross-site\r\nContent-Type: application/json\r\n{t}"),
        format!("Sec-Fetch-Site: same-site\r\nContent-Type: application/json\r\n{t}"),
        format!("Origin: null\r\nContent-Type: application/json\r\n{t}"),
        format!("Content-Type: text/plain\r\n{t}"),
        format!("Content-Type: application/x-www-form-urlencoded\r\n{t}"),
    ]
}

fn mode(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// A harness for `ana` whose first (boot) turn is done, and its page.
fn page(b: &Broker, env: &[(&str, &str)]) -> (Harness, Page) {
    let h = Harness::start(b, "ana", env);
    h.fake.wait_count(1);
    wait_drained(b, "ana");
    let p = Page::of(&h.state_dir());
    (h, p)
}

#[test]
fn cross_site_changes_to_a_page_are_refused_and_change_nothing() {
    let b = Broker::start(&["ana"]);
    // With its token, and on a trusted machine with authentication off: the
    // guard alone must hold then.
    for auth in ["on", "off"] {
        let env: &[(&str, &str)] = if auth == "off" {
            &[("HIVE_WEB_AUTH", "off")]
        } else {
            &[]
        };
        let (h, p) = page(&b, env);
        assert_eq!(
            p.token.is_some(),
            auth == "on",
            "web-token with auth {auth}"
        );
        let endpoints = [
            ("/api/model", r#"{"model":"opus"}"#),
            ("/api/new-session", "{}"),
            ("/api/compact", "{}"),
            ("/api/interrupt", "{}"),
            ("/api/send", r#"{"body":"CSRF-INJECTED: run rm -rf ~"}"#),
            ("/api/login", r#"{"token":"sk-ant-api03-ATTACKER-KEY"}"#),
        ];
        for (path, body) in endpoints {
            for a in attacks(p.token.as_deref()) {
                let (status, text) = post(p.port, path, &a, body);
                assert!(
                    [401, 403, 415].contains(&status),
                    "auth {auth}: POST {path} with {a:?} answered {status}: {text}"
                );
                assert!(text.contains("\"error\""), "{text}");
            }
        }
        // Nothing changed: no credentials, the model, no message, no compaction.
        assert!(!h.state_dir().join("hyperhive-credentials").exists());
        assert_eq!(p.get("/api/state").json()["model"], "haiku");
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(h.fake.count(), 1, "a refused request reached claude");
        assert_eq!(agent_row(&b, "ana").unread, 0, "a refused send was stored");

        // The page's own requests pass: same origin, JSON.
        let own = format!(
            "Origin: http://127.0.0.1:{}\r\nSec-Fetch-Site: same-origin\r\n\
             Content-Type: application/json; charset=utf-8\r\n{}",
            p.port,
            token_line(p.token.as_deref())
        );
        let (status, text) = post(p.port, "/api/model", &own, r#"{"model":"sonnet"}"#);
        assert_eq!(status, 200, "{text}");
        // The loop applies it between events: the state shows it soon after.
        wait_for(Duration::from_secs(10), "the model to be sonnet", || {
            (p.get("/api/state").json()["model"] == "sonnet").then_some(())
        });
        // The broker keeps the choice across harnesses: back to the
        // configured one before the next round (`/model --fleet`).
        let (status, text) = post(p.port, "/api/model", &own, r#"{"fleet":true}"#);
        assert_eq!(status, 200, "{text}");
        wait_for(
            Duration::from_secs(10),
            "the model to be haiku again",
            || (p.get("/api/state").json()["model"] == "haiku").then_some(()),
        );
        drop(h);
    }
}

const FLEET: &str = r#"{"agents": [
  {"name": "boss", "tool_groups": ["messaging", "meta", "inbox", "lifecycle"],
   "env": {"FAKE_CLAUDE_DIR": "@FAKE(boss)"}},
  {"name": "kid", "parent": "boss", "env": {"FAKE_CLAUDE_DIR": "@FAKE(kid)"}}
]}"#;

#[test]
fn cross_site_changes_to_the_dashboard_are_refused_and_change_nothing() {
    // Authentication off, as the probe found it: the guard alone must hold.
    let up = Up::start_env(FLEET, &["boss", "kid"], &[("HIVE_DASHBOARD_AUTH", "off")]);
    assert!(!up.data().join("dashboard-token").exists());
    let port: u16 = wait_for(T, "the dashboard port", || {
        std::fs::read_to_string(up.data().join("dashboard-port"))
            .ok()?
            .trim()
            .parse()
            .ok()
    });
    let mut boss = up.agent("boss");
    let spawn = ok(
        &mut boss,
        RequestSpawn {
            name: "evil".into(),
        },
    );
    let approval = spawn["id"].as_i64().unwrap();
    let asked = ok(
        &mut boss,
        Ask {
            question: "deploy?".into(),
            options: vec!["yes".into(), "no".into()],
            multi: false,
            ttl_seconds: None,
            to: None,
        },
    );
    let question = asked["id"].as_i64().unwrap();
    let sent = ok(
        &mut up.agent("kid"),
        Send {
            to: "operator".into(),
            body: "a report".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    let report = sent["id"].as_i64().unwrap();
    let fleet = std::fs::read(up.fleet_file()).unwrap();
    let all_groups = hyperhive::proto::access::ToolGroup::ALL.map(|g| g.name());
    let endpoints = [
        (
            "/api/permissions",
            json!({"agent":"kid","tool_groups":all_groups,"capabilities":["query_agent_state","read_host_journal"]}),
        ),
        ("/api/approve", json!({ "id": approval })),
        ("/api/deny", json!({ "id": approval })),
        ("/api/read", json!({ "ids": [report] })),
        ("/api/send", json!({"to":"kid","body":"CSRF-INJECTED"})),
        ("/api/answer", json!({"id": question, "answer": "yes"})),
    ];
    for (path, body) in &endpoints {
        for a in attacks(None) {
            let (status, text) = post(port, path, &a, &body.to_string());
            assert!(
                [403, 415].contains(&status),
                "POST {path} with {a:?} answered {status}: {text}"
            );
        }
    }
    // Nothing changed: the fleet file, the approval, the question, the inbox,
    // and kid got no message.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(std::fs::read(up.fleet_file()).unwrap(), fleet, "fleet file");
    let mut host = up.host();
    let a = ok(&mut host, Approvals {});
    assert_eq!(a["approvals"][0]["id"], approval, "{a:?}");
    let q = ok(&mut host, Questions {});
    assert_eq!(q["questions"][0]["id"], question, "{q:?}");
    let inbox = ok(
        &mut host,
        Inbox {
            wait_seconds: None,
            peek: true,
            after: None,
        },
    );
    let unread: Vec<&Value> = inbox["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["id"])
        .collect();
    assert!(
        unread.contains(&&json!(report)),
        "the report was marked read: {inbox:?}"
    );
    assert_eq!(up.prompts_with("kid", "CSRF-INJECTED"), 0);
    assert!(up.state("evil").is_none(), "the spawn was approved");

    // The dashboard's own page still acts: same origin, JSON.
    let own = format!(
        "Origin: http://127.0.0.1:{port}\r\nSec-Fetch-Site: same-origin\r\nContent-Type: application/json\r\n"
    );
    let (status, text) = post(
        port,
        "/api/deny",
        &own,
        &json!({ "id": approval }).to_string(),
    );
    assert_eq!(status, 200, "{text}");
}

#[test]
fn a_foreign_host_is_refused_even_on_reads_with_the_token() {
    let b = Broker::start(&["ana"]);
    let (_h, p) = page(&b, &[]);
    let t = p.token.clone().unwrap();
    for path in [
        "/api/state",
        "/events",
        "/",
        "/metrics",
        "/api/turns",
        "/login",
    ] {
        for host in [
            format!("attacker.example:{}", p.port),
            "attacker.example".to_string(),
            format!("127.0.0.1.attacker.example:{}", p.port),
        ] {
            let (status, text) = raw(
                p.port,
                &format!(
                    "GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Hive-Token: {t}\r\nConnection: close\r\n\r\n"
                ),
            );
            assert_eq!(status, 421, "{path} for {host}: {text}");
            assert!(!text.contains("\"label\""), "{path} leaked: {text}");
            assert!(text.contains("HIVE_WEB_HOSTS"), "{text}");
        }
    }
    for host in [format!("localhost:{}", p.port), format!("[::1]:{}", p.port)] {
        let (status, text) = raw(
            p.port,
            &format!("GET /api/state HTTP/1.1\r\nHost: {host}\r\nX-Hive-Token: {t}\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(status, 200, "{host}: {text}");
    }
    // A name the operator configured is answered.
    drop(_h);
    let (_h, p) = page(&b, &[("HIVE_WEB_HOSTS", "ana.hive.lan")]);
    let (status, _) = raw(
        p.port,
        &format!(
            "GET /api/state HTTP/1.1\r\nHost: ana.hive.lan\r\nX-Hive-Token: {}\r\nConnection: close\r\n\r\n",
            p.token.as_deref().unwrap()
        ),
    );
    assert_eq!(status, 200);

    let up = Up::start(FLEET, &["boss", "kid"]);
    let dash = up.dashboard();
    for path in ["/api/hive", "/events", "/", "/agent/kid/open"] {
        let (status, text) = raw(
            dash.port,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: attacker.example:{}\r\nX-Hive-Token: {}\r\nConnection: close\r\n\r\n",
                dash.port, dash.token
            ),
        );
        assert_eq!(status, 421, "dashboard {path}: {text}");
        assert!(!text.contains("boss"), "{path} leaked: {text}");
    }
}

/// Runs `args` as uid/gid 65534; None when this test cannot (not root).
fn as_nobody(args: &[&str]) -> Option<std::process::Output> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: running as another uid needs root");
        return None;
    }
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(args)
        .output()
        .expect("setpriv");
    Some(out)
}

#[test]
fn another_local_user_gets_401_and_cannot_read_the_tokens() {
    let b = Broker::start(&["ana"]);
    let (h, p) = page(&b, &[]);
    let up = Up::start(FLEET, &["boss", "kid"]);
    let dash = up.dashboard();
    let token_file = h.state_dir().join("web-token");
    assert_eq!(mode(&token_file), 0o600);
    assert_eq!(mode(&h.state_dir().join("hyperhive-port")), 0o600);
    assert_eq!(mode(&up.data().join("dashboard-token")), 0o600);
    assert_eq!(mode(&up.data().join("dashboard-port")), 0o600);
    let curl = |url: &str, extra: &[&str]| -> Option<String> {
        let mut args = vec!["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}"];
        args.extend_from_slice(extra);
        args.push(url);
        as_nobody(&args).map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let Some(code) = curl(&p.url("/api/state"), &[]) else {
        return;
    };
    assert_eq!(code, "401", "GET /api/state as uid 65534");
    let send = curl(
        &p.url("/api/send"),
        &[
            "-H",
            "Content-Type: application/json",
            "--data",
            r#"{"body":"as nobody"}"#,
        ],
    );
    assert_eq!(send.as_deref(), Some("401"));
    let hive = curl(&format!("{}/api/hive", dash.base), &[]);
    assert_eq!(hive.as_deref(), Some("401"), "the dashboard as uid 65534");
    let perms = curl(
        &format!("{}/api/permissions", dash.base),
        &[
            "-H",
            "Content-Type: application/json",
            "--data",
            r#"{"agent":"kid","tool_groups":["execution"],"capabilities":[]}"#,
        ],
    );
    assert_eq!(perms.as_deref(), Some("401"));
    for file in [token_file, up.data().join("dashboard-token")] {
        let out = as_nobody(&["cat", file.to_str().unwrap()]).unwrap();
        assert!(!out.status.success(), "uid 65534 read {}", file.display());
        assert!(out.stdout.is_empty());
    }
    assert_eq!(agent_row(&b, "ana").unread, 0);
}

/// Streams a request head of `total` bytes (`first` then `filler` repeated,
/// through one reused buffer) while another thread reads the answer; returns
/// the status the server answered.
fn stream_head(port: u16, first: &[u8], filler: &[u8], total: usize) -> u16 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = s.try_clone().unwrap();
    r.set_read_timeout(Some(T)).unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
            match r.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        String::from_utf8_lossy(&buf).into_owned()
    });
    let _ = s.write_all(first);
    let chunk: Vec<u8> = filler.iter().copied().cycle().take(1 << 20).collect();
    let mut sent = first.len();
    while sent < total {
        if s.write_all(&chunk).is_err() {
            break;
        }
        sent += chunk.len();
    }
    let answer = reader.join().unwrap();
    status_of(&answer)
}

#[test]
fn a_1_gib_header_is_refused_without_the_memory() {
    let b = Broker::start(&["ana"]);
    let (h, p) = page(&b, &[]);
    let pid = h.pid();
    let before = proc_kb(pid, "VmHWM");
    let head = format!(
        "GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nX-Big: ",
        p.port
    );
    // One 1 GiB header line (probe §3: +2 GB before), then 128 MiB of small
    // headers (probe: 1.86 GB), then 64 KiB in big lines.
    let status = stream_head(p.port, head.as_bytes(), b"a", 1 << 30);
    assert_eq!(status, 431, "one huge line");
    let head = format!("GET /api/state HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n", p.port);
    let status = stream_head(p.port, head.as_bytes(), b"X-H: v\r\n", 128 << 20);
    assert_eq!(status, 431, "many small headers");
    let lines: String = (0..20)
        .map(|i| format!("X-{i}: {}\r\n", "b".repeat(4000)))
        .collect();
    let (status, _) = raw(p.port, &format!("{head}{lines}\r\n"));
    assert_eq!(status, 431, "64 KiB in all");
    let (status, _) = raw(
        p.port,
        &format!(
            "GET /{} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n\r\n",
            "p".repeat(9000),
            p.port
        ),
    );
    assert_eq!(status, 414, "a long request line");
    let after = proc_kb(pid, "VmHWM");
    assert!(
        after < before + 32 * 1024,
        "peak RSS grew from {before} kB to {after} kB"
    );
    assert_eq!(p.get("/api/state").status, 200, "the page still answers");
    eprintln!("VmHWM {before} kB before, {after} kB after 1 GiB + 128 MiB of headers");
}

#[test]
fn stalled_bodies_do_not_freeze_the_page() {
    let b = Broker::start(&["ana"]);
    let (_h, p) = page(&b, &[("HIVE_WEB_READ_TIMEOUT_SECS", "2")]);
    let t = p.token.clone().unwrap();
    let stall = |token: bool| -> Vec<TcpStream> {
        (0..4)
            .map(|_| {
                let mut s = TcpStream::connect(("127.0.0.1", p.port)).unwrap();
                s.set_read_timeout(Some(T)).unwrap();
                let auth = if token { format!("X-Hive-Token: {t}\r\n") } else { String::new() };
                write!(
                    s,
                    "POST /api/send HTTP/1.1\r\nHost: 127.0.0.1:{}\r\n{auth}Content-Type: application/json\r\n\
                     Content-Length: 100000\r\n\r\n{{",
                    p.port
                )
                .unwrap();
                s
            })
            .collect()
    };
    let answer = |mut s: TcpStream| -> String {
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    };
    // Without the token (the probe's attacker): refused at once, body unread.
    let held = stall(false);
    assert_eq!(
        p.get("/api/state").status,
        200,
        "while 4 stalled POSTs are held"
    );
    for s in held {
        let a = answer(s);
        assert_eq!(status_of(&a), 401, "{a}");
        assert!(a.contains("Connection: close"), "{a}");
    }
    // With the token: each worker gives up on its body after the read timeout.
    let held = stall(true);
    // Let the four reach the four workers first.
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let r = wait_for(T, "the page to answer beside 4 stalled POSTs", || {
        p.try_get("/api/state").filter(|r| r.status == 200)
    });
    assert_eq!(r.json()["label"], "ana");
    eprintln!(
        "answered after {:?} beside 4 stalled bodies",
        started.elapsed()
    );
    for s in held {
        let a = answer(s);
        assert_eq!(status_of(&a), 408, "{a}");
    }
    assert_eq!(agent_row(&b, "ana").unread, 0, "a stalled body was sent");
}

/// `n` `POST /login`s to `port`, each from an address of its own (so the
/// throttle's count per address lets them all through): the head with a
/// `Content-Length`, and never the body.
fn stalled_logins(port: u16, n: u8) -> Vec<TcpStream> {
    (0..n)
        .map(|i| {
            let mut s = connect_from([127, 0, 7, i + 1], port);
            s.set_read_timeout(Some(T)).unwrap();
            write!(
                s,
                "POST /login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
                 Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 4000\r\n\r\n"
            )
            .unwrap();
            s
        })
        .collect()
}

#[test]
fn stalled_login_bodies_hold_no_worker() {
    let up = Up::start(
        r#"{"agents": [{"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}]}"#,
        &["ana"],
    );
    let dash = up.dashboard();
    // Under hive up the page is at /agent/ana/ on the one listener.
    let p = up.page("ana");
    // Sixteen, four times the workers, on the one listener that serves the
    // dashboard and the page (more would meet the login throttle's 20 a
    // second in all).
    let held = stalled_logins(dash.port, 16);
    assert_eq!(p.port, dash.port);
    // Let them reach the servers first.
    std::thread::sleep(Duration::from_millis(300));
    let hive = wait_for(
        T,
        "the dashboard to answer beside 16 stalled logins",
        || dash.get("/api/hive").ok(),
    );
    assert!(hive["agents"].is_array(), "{hive}");
    let r = wait_for(T, "the page to answer beside 16 stalled logins", || {
        p.try_get("/api/state").filter(|r| r.status == 200)
    });
    assert_eq!(r.json()["label"], "ana");
    // Each stalled login gets its answer once its body is late: one
    // connection each, never a worker. (The head is enough: the connection
    // closes later.)
    for mut s in held {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let a = String::from_utf8_lossy(&head);
        assert_eq!(status_of(&a), 408, "{a}");
    }
}

#[test]
fn a_page_out_of_descriptors_serves_again_when_they_close() {
    let b = Broker::start(&["ana"]);
    let (h, p) = page(&b, &[]);
    // ulimit -n 256 on the running hive serve (soft and hard).
    let out = std::process::Command::new("prlimit")
        .arg(format!("--pid={}", h.pid()))
        .arg("--nofile=256:256")
        .output()
        .expect("prlimit");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let addr = SocketAddr::from(([127, 0, 0, 1], p.port));
    let workers: Vec<_> = (0..10)
        .map(|_| {
            std::thread::spawn(move || {
                (0..30)
                    .filter_map(|_| {
                        TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let held: Vec<TcpStream> = workers
        .into_iter()
        .flat_map(|w| w.join().unwrap())
        .collect();
    assert!(held.len() > 200, "only {} connections", held.len());
    wait_for(T, "the accept loop to run out of descriptors", || {
        h.log().contains("cannot accept a client").then_some(())
    });
    drop(held);
    let r = wait_for(T, "the page to serve again", || {
        p.try_get("/api/state").filter(|r| r.status == 200)
    });
    assert_eq!(r.json()["label"], "ana");
    wait_for(T, "the end of the burst in the log", || {
        h.log().contains("accepting clients again").then_some(())
    });
    let bursts = h.log().matches("cannot accept a client").count();
    assert!(bursts <= 3, "logged {bursts} times");
}

/// A TCP connection to 127.0.0.1:port from the address `from` (another
/// loopback address, another peer).
fn connect_from(from: [u8; 4], port: u16) -> TcpStream {
    use std::os::fd::FromRawFd;
    // SAFETY: plain socket calls on a new descriptor we own; the sockaddr
    // structs are fully initialised and their sizes passed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0);
        let mut a: libc::sockaddr_in = std::mem::zeroed();
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_addr.s_addr = u32::from_ne_bytes(from);
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        assert_eq!(
            libc::bind(fd, (&a as *const libc::sockaddr_in).cast(), len),
            0
        );
        a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        a.sin_port = port.to_be();
        assert_eq!(
            libc::connect(fd, (&a as *const libc::sockaddr_in).cast(), len),
            0
        );
        TcpStream::from_raw_fd(fd)
    }
}

fn sse_request(port: u16, token: &str) -> String {
    format!(
        "GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nX-Hive-Token: {token}\r\nAccept: text/event-stream\r\n\r\n"
    )
}

#[test]
fn clients_that_never_read_do_not_lock_out_one_that_does() {
    let b = Broker::start(&["ana"]);
    let (h, p) = page(
        &b,
        &[
            ("HIVE_SSE_PING_SECS", "1"),
            ("HIVE_WEB_SEND_TIMEOUT_SECS", "2"),
        ],
    );
    let t = p.token.clone().unwrap();
    // 100 clients from one other address that never read: the per-peer cap
    // keeps them to a few slots.
    let stalled: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = connect_from([127, 0, 0, 2], p.port);
            s.write_all(sse_request(p.port, &t).as_bytes()).unwrap();
            s
        })
        .collect();
    let mut reader = p.sse("/events", &[]);
    assert_eq!(reader.status, 200, "a reader beside 100 stalled clients");
    wait_for(
        T,
        "8 stalled clients (the per-peer cap) and the reader",
        || {
            let m = p.get("/metrics").body;
            m.contains("\nhive_sse_clients 9\n").then_some(())
        },
    );
    std::thread::sleep(Duration::from_millis(300));
    assert!(p.get("/metrics").body.contains("\nhive_sse_clients 9\n"));
    drop(stalled);
    wait_for(T, "the closed clients' slots to be freed", || {
        p.get("/metrics")
            .body
            .contains("\nhive_sse_clients 1\n")
            .then_some(())
    });
    drop(reader);

    // A turn that streams 4 MB: a client that does not read it stops
    // acknowledging, and its slot is freed for one that does, from the same
    // address.
    h.fake.step(
        2,
        r#"init; x=$(head -c 200000 /dev/zero | tr '\0' x); for i in $(seq 20); do say "$x"; done; result_ok done; exit 0"#,
    );
    operator_send(&b, "ana", "talk a lot");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    let stalled: Vec<TcpStream> = (0..100)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", p.port)).unwrap();
            s.write_all(sse_request(p.port, &t).as_bytes()).unwrap();
            s
        })
        .collect();
    reader = wait_for(T, "a reading client to get a slot", || {
        let s = p.sse("/events", &[]);
        (s.status == 200).then_some(s)
    });
    let ev = reader.take(1, T);
    assert!(ev[0].id.is_some());
    // They were dropped for not acknowledging (SIOCOUTQ), not only by the
    // send timeout.
    assert!(h.log().contains("it stopped reading"), "{}", h.log());
    drop(stalled);
}

#[test]
fn head_is_answered_wherever_get_is() {
    let b = Broker::start(&["ana"]);
    let (_h, p) = page(&b, &[]);
    for (path, ty) in [
        ("/api/state", "application/json"),
        ("/api/turns", "application/json"),
        ("/metrics", "text/plain"),
        ("/events", "text/event-stream"),
        ("/icon", "image/svg+xml"),
        ("/", "text/html"),
    ] {
        let r = p.call("HEAD", path, &[], None);
        assert_eq!(r.status, 200, "HEAD {path}");
        assert!(r.body.is_empty(), "HEAD {path} has a body");
        assert!(
            r.header("content-type").is_some_and(|c| c.starts_with(ty)),
            "{path}: {r:?}"
        );
    }
    let r = p.call("HEAD", "/api/model", &[], None);
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("POST"));
    let r = p.call("PUT", "/api/state", &[], None);
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
}

#[test]
fn login_attempts_are_throttled_per_peer() {
    let b = Broker::start(&["ana"]);
    let (_h, p) = page(&b, &[]);
    let form = |token: &str| {
        post(
            p.port,
            "/login",
            "Content-Type: application/x-www-form-urlencoded\r\n",
            &format!("token={token}"),
        )
    };
    let statuses: Vec<u16> = (0..12).map(|_| form("wrong").0).collect();
    assert!(statuses.contains(&401), "{statuses:?}");
    assert!(statuses.contains(&429), "no throttle: {statuses:?}");
    let (status, text) = form("wrong");
    if status == 429 {
        assert!(text.contains("Retry-After: 1"), "{text}");
    }
    std::thread::sleep(Duration::from_millis(1100));
    let (status, text) = form(p.token.as_deref().unwrap());
    assert_eq!(status, 303, "{text}");
    assert!(
        text.contains(&format!("Set-Cookie: hive_token_{}=", p.port)),
        "{text}"
    );
    assert!(text.contains("HttpOnly; SameSite=Strict"), "{text}");
}

#[test]
fn the_dashboard_login_link_works_once_and_no_token_reaches_a_log() {
    let up = Up::start(FLEET, &["boss", "kid"]);
    let dash = up.dashboard();
    let link = up.login_link();
    assert!(
        !link.contains(&dash.token),
        "the token is in the printed link"
    );
    let path = link
        .split_once(&format!(":{}", dash.port))
        .unwrap()
        .1
        .to_string();
    let get = |path: &str| {
        raw(
            dash.port,
            &format!(
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n",
                dash.port
            ),
        )
    };
    let (status, first) = get(&path);
    assert_eq!(status, 303, "{first}");
    let cookie = first
        .lines()
        .find_map(|l| l.strip_prefix("Set-Cookie: "))
        .expect("a cookie")
        .split(';')
        .next()
        .unwrap()
        .to_string();
    assert!(
        cookie.starts_with(&format!("hive_dashboard_{}=", dash.port)),
        "{cookie}"
    );
    let (status, hive) = raw(
        dash.port,
        &format!(
            "GET /api/hive HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nCookie: {cookie}\r\nConnection: close\r\n\r\n",
            dash.port
        ),
    );
    assert_eq!(status, 200, "{hive}");
    assert!(hive.contains("\"boss\""));
    let (status, again) = get(&path);
    assert_eq!(status, 401, "a used link: {again}");
    assert!(!again.contains("Set-Cookie"), "{again}");
    assert!(again.contains("<form"), "the login page: {again}");

    // The dashboard reads the agents' pages with their tokens; none of them
    // (nor the dashboard's) reaches stdout or the debug log (probe §18).
    let h = dash.get("/api/hive").unwrap();
    assert_eq!(h["agents"][0]["live"]["label"], "boss", "{h}");
    let mut secrets = vec![dash.token.clone()];
    for a in ["boss", "kid"] {
        let t =
            std::fs::read_to_string(up.data().join(format!("agents/{a}/state/web-token"))).unwrap();
        secrets.push(t.trim().to_string());
    }
    let (out, log) = (up.stdout(), up.log());
    assert!(log.contains("DEBUG"), "hive up did not log at debug");
    for s in &secrets {
        assert!(
            !out.contains(s.as_str()) && !log.contains(s.as_str()),
            "a token was logged"
        );
    }
}

#[test]
fn duplicate_keys_and_long_inputs_are_refused_briefly() {
    let b = Broker::start(&["ana"]);
    let (h, p) = page(&b, &[]);
    let r = p.post("/api/send", r#"{"body":"harmless","body":"CSRF-INJECTED"}"#);
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("appears twice"), "{}", r.body);
    let long = "m".repeat(512 * 1024);
    let r = p.post("/api/model", &json!({ "model": long }).to_string());
    assert_eq!(r.status, 400);
    assert!(r.body.len() < 1024, "echoed {} bytes", r.body.len());
    let r = p.post(
        "/api/send",
        &json!({ "body": "x".repeat(hyperhive::proto::limits::MAX_BODY + 1) }).to_string(),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.body
            .contains(&hyperhive::proto::limits::MAX_BODY.to_string()),
        "{}",
        r.body
    );
    let v: Value = r.json();
    assert!(v["error"].is_string());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 1);
    assert_eq!(agent_row(&b, "ana").unread, 0);
}
