//! Forge notifications: `forge::start` in-process against a fake Forgejo on
//! tiny_http and a real broker. The fake keeps a list of unread threads, drops a
//! thread when it is marked read (as Forgejo does), and can be told to answer a
//! status or to stall. Wakes are read from the agent's inbox on the real socket.

mod common;

use common::hive::{wait_for, Broker, TempDir};
use hyperhive::harness::forge::{self, ForgeSettings};
use hyperhive::proto::cmd::Recv;
use hyperhive::proto::{Client, Message, MessagesReply};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the fake answers to the next GETs, in order; then `Ok`.
#[derive(Clone, Copy, Debug)]
enum Answer {
    Status(u16),
    /// Stall this long, then answer normally.
    Slow(Duration),
}

#[derive(Default)]
struct State {
    unread: Vec<Value>,
    script: Vec<Answer>,
    /// PATCH requests to refuse with a 500 before accepting them.
    patch_failures: u32,
    /// (method, url, authorization) of every request.
    seen: Vec<(String, String, String)>,
}

struct FakeForge {
    url: String,
    state: Arc<Mutex<State>>,
    server: Arc<tiny_http::Server>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeForge {
    fn start(unread: Vec<Value>, script: Vec<Answer>) -> FakeForge {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").unwrap());
        let url = format!("http://{}", server.server_addr().to_ip().unwrap());
        let state = Arc::new(Mutex::new(State {
            unread,
            script,
            patch_failures: 0,
            seen: Vec::new(),
        }));
        let (srv, st) = (server.clone(), state.clone());
        let thread = std::thread::spawn(move || {
            for req in srv.incoming_requests() {
                let st = st.clone();
                // One thread per request, so a stalled answer holds up nothing else.
                std::thread::spawn(move || answer(req, &st));
            }
        });
        FakeForge {
            url,
            state,
            server,
            thread: Some(thread),
        }
    }

    fn gets(&self) -> usize {
        let st = self.state.lock().unwrap();
        st.seen.iter().filter(|r| r.0 == "GET").count()
    }

    fn seen(&self) -> Vec<(String, String, String)> {
        self.state.lock().unwrap().seen.clone()
    }

    fn fail_patches(&self, n: u32) {
        self.state.lock().unwrap().patch_failures = n;
    }

    fn patches(&self) -> usize {
        let st = self.state.lock().unwrap();
        st.seen.iter().filter(|r| r.0 == "PATCH").count()
    }

    fn push(&self, thread: Value) {
        self.state.lock().unwrap().unread.push(thread);
    }
}

impl Drop for FakeForge {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn answer(req: tiny_http::Request, st: &Mutex<State>) {
    let method = req.method().as_str().to_string();
    let url = req.url().to_string();
    let auth = req
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .map(|h| h.value.as_str().to_string())
        .unwrap_or_default();
    let next = {
        let mut s = st.lock().unwrap();
        s.seen.push((method.clone(), url.clone(), auth));
        if method == "GET" && !s.script.is_empty() {
            Some(s.script.remove(0))
        } else if method == "PATCH" && s.patch_failures > 0 {
            s.patch_failures -= 1;
            Some(Answer::Status(500))
        } else {
            None
        }
    };
    match next {
        Some(Answer::Status(code)) => {
            let _ = req.respond(
                tiny_http::Response::from_string(r#"{"message":"no"}"#).with_status_code(code),
            );
            return;
        }
        Some(Answer::Slow(d)) => std::thread::sleep(d),
        None => {}
    }
    let json_header: tiny_http::Header = "Content-Type: application/json".parse().unwrap();
    match (method.as_str(), url.as_str()) {
        ("GET", "/api/v1/notifications") => {
            let body = Value::Array(st.lock().unwrap().unread.clone()).to_string();
            let _ = req.respond(tiny_http::Response::from_string(body).with_header(json_header));
        }
        ("PATCH", u) if u.starts_with("/api/v1/notifications/threads/") => {
            let id: i64 = u.rsplit('/').next().unwrap().parse().unwrap();
            st.lock().unwrap().unread.retain(|t| t["id"] != id);
            let _ = req.respond(tiny_http::Response::empty(205));
        }
        _ => {
            let _ = req.respond(tiny_http::Response::empty(404));
        }
    }
}

fn thread(id: i64, title: &str) -> Value {
    json!({
        "id": id,
        "unread": true,
        "updated_at": "2026-11-22T06:00:00Z",
        "repository": {"full_name": "ana/hive"},
        "subject": {"title": title, "type": "Issue", "state": "open",
                    "url": format!("http://forge/api/v1/repos/ana/hive/issues/{id}"),
                    "html_url": format!("http://forge/ana/hive/issues/{id}")}
    })
}

struct Setup {
    broker: Broker,
    dir: TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = TempDir::new("forge");
        std::fs::write(dir.path().join("forge-token"), "s3cret\n").unwrap();
        Setup {
            broker: Broker::start(&["ana"]),
            dir,
        }
    }

    fn settings(&self, fake: &FakeForge) -> ForgeSettings {
        ForgeSettings {
            url: fake.url.clone(),
            token_file: self.dir.path().join("forge-token"),
            broker: hyperhive::proto::Dial::Socket(self.broker.agent_socket("ana")),
            poll: Duration::from_millis(100),
            timeout: Duration::from_millis(500),
            backoff_max: Duration::from_millis(400),
            tea_config: Some(self.dir.path().join("home/.config/tea/config.yml")),
            user: "ana".into(),
        }
    }

    fn client(&self) -> Client {
        self.broker.agent("ana")
    }
}

/// Every message in the inbox now (waits up to `wait` for the first).
fn drain(c: &mut Client, wait: u64) -> Vec<Message> {
    let r: MessagesReply = c
        .call(&Recv {
            wait_seconds: Some(wait),
            max: Some(32),
        })
        .expect("recv");
    r.messages
}

#[test]
fn new_notifications_wake_the_agent_once_each_and_are_marked_read() {
    let su = Setup::new();
    let fake = FakeForge::start(
        vec![thread(1, "broken build"), thread(2, "review me")],
        vec![],
    );
    let h = forge::start(su.settings(&fake)).expect("a token exists");
    let mut c = su.client();
    let mut got = Vec::new();
    let end = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 && Instant::now() < end {
        got.extend(drain(&mut c, 2));
    }
    let bodies: Vec<(&str, &str)> = got
        .iter()
        .map(|m| (m.from.as_str(), m.body.as_str()))
        .collect();
    assert_eq!(
        bodies,
        vec![
            (
                "forge",
                "Issue in ana/hive (open): broken build http://forge/ana/hive/issues/1"
            ),
            (
                "forge",
                "Issue in ana/hive (open): review me http://forge/ana/hive/issues/2"
            ),
        ]
    );
    // Both were marked read with the token, and later polls bring nothing new.
    wait_for(Duration::from_secs(5), "more polls", || {
        (fake.gets() >= 4).then_some(())
    });
    let seen = fake.seen();
    for id in [1, 2] {
        let url = format!("/api/v1/notifications/threads/{id}");
        assert!(
            seen.iter().any(|r| r.0 == "PATCH" && r.1 == url),
            "{seen:?}"
        );
    }
    assert!(seen.iter().all(|r| r.2 == "token s3cret"), "{seen:?}");
    assert!(drain(&mut c, 0).is_empty());
    // A notification arriving later wakes the agent too.
    fake.push(thread(3, "later"));
    let later = drain(&mut c, 5);
    assert_eq!(later.len(), 1, "{later:?}");
    assert!(later[0].body.contains("later"));
    // The tea login was written from the same token and URL.
    let tea = std::fs::read_to_string(su.dir.path().join("home/.config/tea/config.yml")).unwrap();
    assert!(tea.contains("token: \"s3cret\""), "{tea}");
    assert!(tea.contains(&format!("url: \"{}\"", fake.url)), "{tea}");
    assert!(h.is_running());
    // Shutdown does not wait out a poll interval (generous bound: a loaded
    // machine, not the behaviour, decides the rest).
    let t = Instant::now();
    drop(h);
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "shutdown took {:?}",
        t.elapsed()
    );
}

#[test]
fn no_notifications_no_wakes_and_no_token_no_thread() {
    let su = Setup::new();
    let fake = FakeForge::start(vec![], vec![]);
    let h = forge::start(su.settings(&fake)).unwrap();
    wait_for(Duration::from_secs(5), "three polls", || {
        (fake.gets() >= 3).then_some(())
    });
    let mut c = su.client();
    assert!(drain(&mut c, 0).is_empty());
    drop(h);
    // Without the token file nothing starts and nothing is polled.
    std::fs::remove_file(su.dir.path().join("forge-token")).unwrap();
    let quiet = FakeForge::start(vec![thread(1, "x")], vec![]);
    assert!(forge::start(su.settings(&quiet)).is_none());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(quiet.gets(), 0);
}

#[test]
fn a_refused_token_stops_polling() {
    let su = Setup::new();
    let fake = FakeForge::start(vec![thread(1, "x")], vec![Answer::Status(401)]);
    let h = forge::start(su.settings(&fake)).unwrap();
    wait_for(Duration::from_secs(5), "the thread to stop", || {
        (!h.is_running()).then_some(())
    });
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(fake.gets(), 1, "polled again after a 401");
    let mut c = su.client();
    assert!(drain(&mut c, 0).is_empty());
}

#[test]
fn server_errors_back_off_and_then_recover() {
    let su = Setup::new();
    let fake = FakeForge::start(
        vec![thread(7, "after the outage")],
        vec![
            Answer::Status(500),
            Answer::Status(502),
            Answer::Status(503),
        ],
    );
    let started = Instant::now();
    let h = forge::start(su.settings(&fake)).unwrap();
    let mut c = su.client();
    let got = drain(&mut c, 10);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].body.contains("after the outage"));
    assert!(fake.gets() >= 4);
    // The pauses grew: the 100 ms interval doubled to 200, then 400 (the cap),
    // so the three failures took at least 200 + 400 + 400 ms.
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "no backoff: {:?}",
        started.elapsed()
    );
    assert!(h.is_running());
    drop(h);
    assert!(drain(&mut c, 0).is_empty());
}

#[test]
fn a_stalled_forge_times_out_retries_and_does_not_hold_up_shutdown() {
    let su = Setup::new();
    let fake = FakeForge::start(
        vec![thread(5, "slow news")],
        vec![Answer::Slow(Duration::from_secs(30))],
    );
    let h = forge::start(su.settings(&fake)).unwrap();
    let mut c = su.client();
    let got = drain(&mut c, 10);
    assert_eq!(got.len(), 1, "{got:?}");
    // The 500 ms read timeout ended the stalled request and a second request
    // got it: drain waits 10 s, the stalled answer would have taken 30.
    assert!(fake.gets() >= 2, "no retry: {}", fake.gets());
    drop(h);

    // Shutdown during a stalled request ends within the request timeout.
    let stall = FakeForge::start(vec![], vec![Answer::Slow(Duration::from_secs(60))]);
    let h = forge::start(su.settings(&stall)).unwrap();
    wait_for(Duration::from_secs(5), "the stalled request", || {
        (stall.gets() >= 1).then_some(())
    });
    let t = Instant::now();
    drop(h);
    // Well before the 60 s stall ends.
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "shutdown took {:?}",
        t.elapsed()
    );
}

#[test]
fn a_notification_that_cannot_be_marked_read_is_announced_once() {
    let su = Setup::new();
    let fake = FakeForge::start(vec![thread(4, "sticky")], vec![]);
    fake.fail_patches(2);
    let h = forge::start(su.settings(&fake)).unwrap();
    wait_for(Duration::from_secs(10), "the third mark-read", || {
        (fake.patches() >= 3).then_some(())
    });
    // Still listed while the PATCHes failed, but only one wake.
    let mut c = su.client();
    let got = drain(&mut c, 1);
    assert_eq!(got.len(), 1, "{got:?}");
    assert!(got[0].body.contains("sticky"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(drain(&mut c, 0).is_empty());
    drop(h);
}

/// The wiring in `hive serve`: with a token in the state dir, a notification
/// becomes a turn of the agent, and the tea login is in the harness's HOME.
#[test]
fn hive_serve_starts_forge_notifications_when_a_token_exists() {
    use common::hive::Harness;
    let b = Broker::start(&["ana"]);
    let fake = FakeForge::start(vec![thread(11, "deploy failed")], vec![]);
    let url = fake.url.clone();
    let mut h = Harness::start(
        &b,
        "ana",
        &[("HIVE_FORGE_URL", &url), ("HIVE_FORGE_POLL_SECS", "1")],
    );
    // The boot kick; no token yet, so nothing polled.
    h.fake.wait_count(1);
    assert_eq!(fake.gets(), 0);
    h.terminate();
    std::fs::write(h.state_dir().join("forge-token"), "t0ken").unwrap();
    h.spawn();
    wait_for(
        Duration::from_secs(20),
        "a turn for the notification",
        || {
            (1..=h.fake.count())
                .any(|n| h.fake.stdin(n).contains("deploy failed"))
                .then_some(())
        },
    );
    let n = (1..=h.fake.count())
        .find(|n| h.fake.stdin(*n).contains("deploy failed"))
        .unwrap();
    assert!(
        h.fake
            .stdin(n)
            .contains("Issue in ana/hive (open): deploy failed http://forge/ana/hive/issues/11"),
        "{}",
        h.fake.stdin(n)
    );
    let tea = std::fs::read_to_string(h.dir.path().join("home/.config/tea/config.yml")).unwrap();
    assert!(tea.contains("token: \"t0ken\""), "{tea}");
    assert!(
        h.log().contains("forge notifications: polling"),
        "{}",
        h.log()
    );
    h.terminate();
}
