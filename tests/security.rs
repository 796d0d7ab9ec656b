//! The consolidated security suite, against real `hive broker` and `hive serve`
//! processes: who may connect (socket modes), what one agent's socket may do to
//! another agent's messages, questions and loose ends, `allowed_recipients`,
//! oversized input, and the web UI of a running harness
//! (loopback by default, the token on every request, static traversal) with the
//! secrets it is given kept out of its log, its SSE stream, `/api/state` and
//! claude's argv. Sender names that pass for a reserved one (an invisible
//! format character, look-alike letters) are refused, and the page's own
//! name (`web-ui`) is taken only from the agent's harness (issue 40).

mod common;

use common::hive::*;
use hyperhive::proto::cmd::RecvNext;
use hyperhive::proto::{Client, ClientError};
use serde_json::{json, Map, Value};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

fn raw(c: &mut Client, v: Value) -> Result<Map<String, Value>, String> {
    match call_raw(c, &v.to_string()) {
        Ok(m) => Ok(m),
        Err(ClientError::Refused(e)) => Err(e),
        Err(e) => panic!("{v}: no answer: {e}"),
    }
}

fn must(c: &mut Client, v: Value) -> Map<String, Value> {
    raw(c, v.clone()).unwrap_or_else(|e| panic!("{v} refused: {e}"))
}

fn must_not(c: &mut Client, v: Value) -> String {
    match raw(c, v.clone()) {
        Ok(m) => panic!("{v} was allowed: {m:?}"),
        Err(e) => e,
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn sockets_are_private_to_their_owner() {
    let b = Broker::start(&["ana"]);
    let _ = b.agent("ana");
    assert_eq!(mode(&b.host_socket()), 0o600);
    assert_eq!(mode(&b.agent_socket("ana")), 0o600);
    let h = Harness::start(&b, "ana", &[]);
    let bash = h.dir.path().join("bash.sock");
    wait_for(Duration::from_secs(10), "the bash socket", || {
        bash.exists().then_some(())
    });
    assert_eq!(mode(&bash), 0o600);
}

#[test]
fn an_agent_socket_acts_only_for_its_own_agent() {
    let b = Broker::start(&["ana", "bob", "cat"]);
    let (mut ana, mut bob, mut cat) = (b.agent("ana"), b.agent("bob"), b.agent("cat"));
    let mut host = b.host();
    must(
        &mut host,
        json!({"cmd":"send","to":"bob","body":"for bob only"}),
    );
    let got = must(&mut bob, json!({"cmd":"recv_next","wait_seconds":5}));
    let id = got["message"]["id"].as_i64().unwrap();

    // ana can neither finish, requeue nor read bob's inflight message.
    must_not(&mut ana, json!({"cmd":"ack_turn","id":id}));
    must_not(&mut ana, json!({"cmd":"requeue_inflight","id":id}));
    let r = raw(&mut ana, json!({"cmd":"recv_ack","ids":[id]}));
    assert!(r.is_err() || r.as_ref().unwrap()["acked"] == 0, "{r:?}");
    let r = must(&mut ana, json!({"cmd":"recv","wait_seconds":0,"max":32}));
    assert_eq!(r["messages"], json!([]), "ana read another inbox: {r:?}");
    let r = must(&mut ana, json!({"cmd":"recv_next","wait_seconds":0}));
    assert!(r["message"].is_null(), "{r:?}");
    // A `to` on an agent socket's wake cannot reach another inbox.
    let r = raw(
        &mut ana,
        json!({"cmd":"wake","to":"bob","from":"x","body":"sneaky"}),
    );
    if let Ok(m) = r {
        assert_eq!(m["to"], "ana");
    }
    let st = must(&mut bob, json!({"cmd":"status"}));
    assert_eq!(
        (st["inflight"].as_i64(), st["unread"].as_i64()),
        (Some(id), Some(0))
    );
    must(&mut bob, json!({"cmd":"ack_turn","id":id}));

    // Questions: only the target answers, only the asker cancels.
    let q = must(&mut ana, json!({"cmd":"ask","question":"ship it?"}))["id"].clone();
    must_not(&mut bob, json!({"cmd":"answer","id":q,"answer":"yes"}));
    must_not(
        &mut bob,
        json!({"cmd":"cancel_loose_end","kind":"question","id":q}),
    );
    let q2 = must(
        &mut ana,
        json!({"cmd":"ask","question":"lunch?","to":"bob"}),
    )["id"]
        .clone();
    must_not(&mut cat, json!({"cmd":"answer","id":q2,"answer":"no"}));
    must_not(&mut ana, json!({"cmd":"answer","id":q2,"answer":"yes"}));
    must(&mut bob, json!({"cmd":"answer","id":q2,"answer":"yes"}));
    // Reminders: only the owner cancels; loose ends of a non-child are private.
    let rem = must(
        &mut ana,
        json!({"cmd":"remind","message":"later","delay_seconds":600}),
    )["id"]
        .clone();
    must_not(
        &mut bob,
        json!({"cmd":"cancel_loose_end","kind":"reminder","id":rem}),
    );
    must_not(&mut bob, json!({"cmd":"get_loose_ends","agent":"ana"}));
    let le = must(&mut ana, json!({"cmd":"get_loose_ends"}));
    assert_eq!(le["reminders"].as_array().unwrap().len(), 1, "{le:?}");
    assert_eq!(le["asked"].as_array().unwrap().len(), 1, "{le:?}");

    // Operator commands on an agent socket, agent commands on the host socket.
    for cmd in [
        json!({"cmd":"agents"}),
        json!({"cmd":"questions"}),
        json!({"cmd":"inbox","wait_seconds":0}),
        json!({"cmd":"cancel_question","id":q}),
    ] {
        must_not(&mut ana, cmd);
    }
    for cmd in [
        json!({"cmd":"recv_next","wait_seconds":0}),
        json!({"cmd":"ack_turn","id":id}),
        json!({"cmd":"remind","message":"x","delay_seconds":5}),
    ] {
        must_not(&mut host, cmd);
    }
}

#[test]
fn allowed_recipients_hold_and_the_parent_is_always_allowed() {
    let b = Broker::start_config(
        r#"{"agents":[{"name":"ruth"},
            {"name":"kid","parent":"ruth","allowed_recipients":["operator"]},
            {"name":"pal"}]}"#,
    );
    let mut kid = b.agent("kid");
    let e = must_not(&mut kid, json!({"cmd":"send","to":"pal","body":"hi"}));
    assert!(e.contains("pal"), "{e}");
    must(&mut kid, json!({"cmd":"send","to":"operator","body":"hi"}));
    must(&mut kid, json!({"cmd":"send","to":"ruth","body":"hi"}));
    must(&mut kid, json!({"cmd":"send","to":"<parent>","body":"hi"}));
    let mut pal = b.agent("pal");
    let r = must(&mut pal, json!({"cmd":"recv_next","wait_seconds":0}));
    assert!(
        r["message"].is_null(),
        "pal got a message kid may not send: {r:?}"
    );
}

#[test]
fn oversized_lines_are_refused_clearly_and_the_connection_goes_on() {
    let b = Broker::start(&["ana"]);
    let mut s = std::os::unix::net::UnixStream::connect(b.agent_socket("ana")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let big = format!(
        "{{\"cmd\":\"wake\",\"from\":\"x\",\"body\":\"{}\"}}\n",
        "a".repeat(hyperhive::proto::limits::MAX_LINE + 10)
    );
    s.write_all(big.as_bytes()).unwrap();
    s.write_all(b"{\"cmd\":\"status\"}\n").unwrap();
    let mut r = std::io::BufReader::new(s);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut r, &mut line).unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["ok"], false, "{line}");
    let err = v["error"].as_str().unwrap();
    assert!(err.contains("longer than 1048576 bytes"), "{err}");
    line.clear();
    std::io::BufRead::read_line(&mut r, &mut line).unwrap();
    assert!(line.contains("\"ok\":true"), "{line}");
    assert_eq!(
        agent_row(&b, "ana").unread,
        0,
        "the oversized wake was stored"
    );
}

/// One HTTP request to the harness's web UI; (status, body).
fn http(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    common::web::raw_request(port, method, path, headers, body)
}

fn web_port(h: &Harness) -> u16 {
    let p = h.state_dir().join("hyperhive-port");
    wait_for(Duration::from_secs(10), "the web port file", || {
        std::fs::read_to_string(&p).ok()?.trim().parse().ok()
    })
}

/// True when something listens on 127.0.0.1:port (and not on a wider address).
fn listens_on_loopback_only(port: u16) -> bool {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let want = format!(":{port:04X}");
    let local: Vec<&str> = tcp
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|a| a.ends_with(&want))
        .collect();
    !local.is_empty() && local.iter().all(|a| a.starts_with("0100007F:"))
}

#[test]
fn the_web_ui_is_loopback_by_default_and_an_exposed_bind_needs_a_token() {
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[]);
    let port = web_port(&h);
    assert!(
        listens_on_loopback_only(port),
        "port {port} is not loopback-only"
    );
    drop(h);
    let mut h = Harness::start(&b, "ana", &[("HIVE_BIND", "0.0.0.0")]);
    let st = wait_for(Duration::from_secs(10), "hive serve to refuse", || {
        h.exited()
    });
    assert!(!st.success());
    assert!(h.log().contains("HIVE_WEB_TOKEN"), "{}", h.log());
}

const WEB_TOKEN: &str = "webtok-Zq8xSECRET1";
const API_KEY: &str = "sk-ant-api03-SECRET2xyz";
const LOGIN_TOKEN: &str = "sk-ant-oat01-SECRET3abc";

#[test]
fn a_running_harness_guards_every_request_and_never_leaks_a_secret() {
    let b = Broker::start(&["ana"]);
    let static_root = TempDir::new("st");
    let outside = TempDir::new("out");
    std::fs::write(outside.path().join("secret.txt"), "outside").unwrap();
    std::fs::create_dir_all(static_root.path().join("games")).unwrap();
    std::fs::write(static_root.path().join("games/ok.txt"), "inside").unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        static_root.path().join("leak.txt"),
    )
    .unwrap();
    std::os::unix::fs::symlink(outside.path(), static_root.path().join("up")).unwrap();
    let root = static_root.path().display().to_string();
    let h = Harness::start(
        &b,
        "ana",
        &[
            ("HIVE_WEB_TOKEN", WEB_TOKEN),
            ("ANTHROPIC_API_KEY", API_KEY),
            ("HIVE_STATIC_DIR", &root),
            ("RUST_LOG", "debug"),
        ],
    );
    h.fake.wait_count(1);
    let port = web_port(&h);

    // Without the token (or with a wrong one), every request is refused.
    let requests = [
        ("GET", "/api/state", ""),
        ("GET", "/events", ""),
        ("GET", "/api/turns?limit=5", ""),
        ("GET", "/api/login", ""),
        ("GET", "/api/dashboard-links", ""),
        ("GET", "/metrics", ""),
        ("GET", "/icon", ""),
        ("GET", "/games/ok.txt", ""),
        ("POST", "/api/model", r#"{"model":"opus"}"#),
        ("POST", "/api/new-session", "{}"),
        ("POST", "/api/compact", "{}"),
        ("POST", "/api/interrupt", "{}"),
        ("POST", "/api/send", r#"{"body":"hi"}"#),
        ("POST", "/api/login", r#"{"token":"sk-ant-oat01-nope"}"#),
    ];
    for (method, path, body) in requests {
        for headers in [
            vec![],
            vec![("Authorization", "Bearer wrong")],
            vec![("X-Hive-Token", "webtok-Zq8xSECRET")],
            vec![("Cookie", "hive_token=x")],
        ] {
            let (status, text) = http(port, method, path, &headers, body);
            assert_eq!(status, 401, "{method} {path} {headers:?}: {text}");
            assert!(!text.contains("inside"), "{path}: {text}");
        }
    }
    let (status, _) = http(port, "GET", "/", &[], "");
    assert!(status == 401 || status == 303, "GET / answered {status}");
    assert!(!h.state_dir().join("hyperhive-model").exists());
    assert!(!h.state_dir().join("hyperhive-credentials").exists());

    // With the token: traversal out of the static root is refused.
    let auth = [("Authorization", format!("Bearer {WEB_TOKEN}"))];
    let auth: Vec<(&str, &str)> = auth.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(http(port, "GET", "/games/ok.txt", &auth, "").1, "inside");
    for path in [
        "/../secret.txt",
        "/games/../../secret.txt",
        "/%2e%2e/secret.txt",
        "/games/%2e%2e/%2e%2e/secret.txt",
        "/games/%2E%2E%2F%2E%2E%2Fsecret.txt",
        "/leak.txt",
        "/up/secret.txt",
    ] {
        let (status, text) = http(port, "GET", path, &auth, "");
        assert!(
            !text.contains("outside"),
            "{path} leaked ({status}): {text}"
        );
        assert!(status == 400 || status == 404, "{path}: {status} {text}");
    }

    // A body over 1 MiB is refused with 413 and a reason.
    let huge = json!({ "body": "b".repeat(1024 * 1024 + 1) }).to_string();
    let json_auth = [auth[0], ("Content-Type", "application/json")];
    let (status, text) = http(port, "POST", "/api/send", &json_auth, &huge);
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("error"), "{text}");

    // Secrets: a login token stored through the API, the web token and the API
    // key appear in no log line, no SSE event, no API answer and no argv.
    let mut sse = common::web::Sse::connect(port, "/events", &auth);
    assert_eq!(sse.status, 200);
    let (status, text) = http(
        port,
        "POST",
        "/api/login",
        &[auth[0], ("Content-Type", "application/json")],
        &json!({ "token": LOGIN_TOKEN }).to_string(),
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(mode(&h.state_dir().join("hyperhive-credentials")), 0o600);
    operator_send(&b, "ana", "a turn while the secrets are in place");
    // Invocation 2 was the check of the login token, 3 the turn.
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    let mut events = String::new();
    let end = Instant::now() + Duration::from_secs(3);
    while let Some(e) = sse.next(end.saturating_duration_since(Instant::now())) {
        events.push_str(&e.data);
        events.push('\n');
    }
    assert!(
        events.contains("TurnEnd") || events.contains("turn_end"),
        "{events}"
    );
    let mut seen = vec![
        ("serve.log", h.log()),
        ("SSE", events),
        ("argv", h.fake.argv(2).join(" ")),
        ("argv", h.fake.argv(3).join(" ")),
    ];
    for path in [
        "/api/state",
        "/api/login",
        "/api/turns?limit=50",
        "/metrics",
    ] {
        let (status, text) = http(port, "GET", path, &auth, "");
        assert_eq!(status, 200, "{path}: {text}");
        seen.push((path, text));
    }
    for (what, text) in &seen {
        for secret in [WEB_TOKEN, API_KEY, LOGIN_TOKEN, "SECRET"] {
            assert!(!text.contains(secret), "{secret} appears in {what}");
        }
    }
    assert!(
        h.log().contains("DEBUG"),
        "the harness did not log at debug"
    );
}

/// An agent whose config grants only `meta` cannot use the messaging or inbox
/// commands on its socket directly (bypassing `hive mcp`), while the harness's
/// own plumbing and `wake` still work.
#[test]
fn tool_groups_hold_on_the_socket() {
    let b = Broker::start_config(
        r#"{"agents":[{"name":"ana","tool_groups":["meta"]},{"name":"bob"}]}"#,
    );
    let mut ana = b.agent("ana");
    for req in [
        json!({"cmd":"send","to":"bob","body":"no messaging group"}),
        json!({"cmd":"recv","wait_seconds":0}),
        json!({"cmd":"ask","question":"may I?"}),
        json!({"cmd":"remind","message":"x","delay_seconds":5}),
        json!({"cmd":"get_loose_ends"}),
    ] {
        let e = must_not(&mut ana, req);
        assert!(e.contains("tool group"), "{e}");
    }
    for req in [
        json!({"cmd":"set_status","text":"meta is granted"}),
        json!({"cmd":"wake","from":"cron","body":"scripts still wake it"}),
        json!({"cmd":"status"}),
        json!({"cmd":"kick"}),
    ] {
        let line = req.to_string();
        let r = call_raw(&mut ana, &line);
        assert!(r.is_ok(), "{line}: {r:?}");
    }
}

/// The documented `socket_uid` deployment: `hive wake` run as the agent's own
/// uid reaches its socket through `RUN/agents` (the broker, as root, creates it
/// 0755 whatever its umask), while another agent's socket tells that uid it is
/// not allowed — not that there is no broker.
#[test]
fn hive_wake_works_as_the_agents_uid_with_socket_uid() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: running as another uid needs root");
        return;
    }
    let b =
        Broker::start_config(r#"{"agents":[{"name":"ana","socket_uid":65534},{"name":"bob"}]}"#);
    let _ = b.agent("ana");
    assert_eq!(mode(&b.run_dir().join("agents")), 0o755);
    let as_nobody = |socket: &Path| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(hive_bin())
            .args(["wake", "--from", "cron", "--body", "as the agent's user"])
            .env("HIVE_SOCKET", socket)
            .output()
            .expect("run setpriv")
    };
    let out = as_nobody(&b.agent_socket("ana"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: hyperhive::proto::cmd::RecvNextReply = b
        .agent("ana")
        .call(&RecvNext {
            wait_seconds: Some(5),
            seen: None,
        })
        .unwrap();
    assert_eq!(r.message.unwrap().body, "as the agent's user");
    let out = as_nobody(&b.agent_socket("bob"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("permission denied on") && !err.contains("is hive broker running"),
        "{err}"
    );
}

/// `wake` cannot speak as the operator, the broker or a name with control or
/// bidi characters, on an agent's socket or on the host socket; `hive wake`
/// says so.
#[test]
fn reserved_and_control_character_senders_are_refused_on_every_socket() {
    let b = Broker::start(&["ana"]);
    let (mut ana, mut host) = (b.agent("ana"), b.host());
    for from in [
        "operator",
        "Operator",
        "system",
        "self",
        "parent",
        "broker",
        "reminder",
        "a\u{0}b",
        "\u{202e}evil",
        "x\u{1b}[2J",
        // issue 40: a zero-width space, Cyrillic letters, the page's name.
        "op\u{200b}erator",
        "\u{43e}perator",
        "\u{405}YSTEM",
        "Web-UI",
        "w\u{435}b-ui",
    ] {
        let e = must_not(&mut ana, json!({"cmd":"wake","from":from,"body":"spoof"}));
        assert!(
            e.contains("reserved") || e.contains("control") || e.contains("format character"),
            "{from:?}: {e}"
        );
        let e = must_not(
            &mut host,
            json!({"cmd":"wake","to":"ana","from":from,"body":"spoof"}),
        );
        assert!(
            e.contains("reserved") || e.contains("control") || e.contains("format character"),
            "{from:?}: {e}"
        );
    }
    let sock = b.agent_socket("ana");
    let (code, _, err) = run_hive(
        &["wake", "--from", "operator", "--body", "x"],
        None,
        &[("HIVE_SOCKET", sock.to_str().unwrap())],
    );
    assert_eq!(code, 1);
    assert!(err.contains("reserved"), "{err}");
    assert_eq!(agent_row(&b, "ana").unread, 0, "nothing spoofed was stored");
    must(&mut ana, json!({"cmd":"wake","from":"cron","body":"real"}));
}

/// `web-ui` is what the agent's page sends as (its `/api/send`): the broker
/// takes it only from the process of the agent's harness, which runs the
/// page. The page's send goes through; the same name from a script on the
/// agent's socket, from `hive wake` or on the host socket is refused, and
/// nothing is stored.
#[test]
fn the_pages_name_is_taken_only_from_the_agents_harness() {
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let page = common::web::Page::of(&h.state_dir());
    let r = page.post("/api/send", r#"{"body":"typed on the page"}"#);
    assert_eq!(r.status, 200, "{}", r.body);
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    assert!(h.fake.stdin(2).contains("typed on the page"));
    assert!(h.fake.stdin(2).contains("web-ui"), "{}", h.fake.stdin(2));

    let e = must_not(
        &mut b.agent("ana"),
        json!({"cmd":"wake","from":"web-ui","body":"spoof"}),
    );
    assert!(e.contains("taken only from its harness"), "{e}");
    let e = must_not(
        &mut b.host(),
        json!({"cmd":"wake","to":"ana","from":"web-ui","body":"spoof"}),
    );
    assert!(e.contains("taken only from its harness"), "{e}");
    let sock = b.agent_socket("ana");
    let (code, _, err) = run_hive(
        &["wake", "--from", "web-ui", "--body", "spoof"],
        None,
        &[("HIVE_SOCKET", sock.to_str().unwrap())],
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("taken only from its harness"), "{err}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 2, "nothing spoofed ran");
    assert_eq!(agent_row(&b, "ana").unread, 0, "nothing spoofed was stored");
}

/// Turn counters must be one turn's worth: finite, not negative, bounded; the
/// totals stay intact after refused posts.
#[test]
fn turn_counters_are_validated() {
    let b = Broker::start(&["bob"]);
    let mut bob = b.agent("bob");
    must(
        &mut bob,
        json!({"cmd":"post_turn_counts","turns":1,"ok":1,"tokens_in":2400,"tokens_out":84,"cost_usd":0.014}),
    );
    for bad in [
        json!({"cmd":"post_turn_counts","turns":18446744073709551615u64,"ok":1}),
        json!({"cmd":"post_turn_counts","turns":1,"tokens_in":9223372036854775807u64}),
        json!({"cmd":"post_turn_counts","turns":1,"cost_usd":1.7976931348623157e308}),
        json!({"cmd":"post_turn_counts","turns":1,"cost_usd":-3.0}),
    ] {
        let e = must_not(&mut bob, bad.clone());
        assert!(e.contains("post_turn_counts"), "{bad}: {e}");
    }
    let row = agent_row(&b, "bob");
    assert_eq!(
        (row.turns, row.turns_ok, row.tokens_in, row.tokens_out),
        (1, 1, 2400, 84)
    );
    assert!((row.cost_usd - 0.014).abs() < 1e-9, "{}", row.cost_usd);
}

/// An agent's message with terminal escapes (OSC title, clear screen, OSC 52
/// clipboard, C1, a bidi override) reaches the operator's terminal as visible
/// text, newlines kept.
#[test]
fn hive_inbox_and_questions_show_control_characters_as_text() {
    let b = Broker::start(&["bob"]);
    let mut bob = b.agent("bob");
    let hostile = "report done \u{1b}]0;PWNED\u{7}\u{1b}[2J\u{1b}[31mfake prompt\u{1b}[0m \
                   \u{1b}]52;c;ZWNobyBwd25lZA==\u{7} \u{9b}1m \u{202e}txt.exe\nsecond line";
    must(
        &mut bob,
        json!({"cmd":"send","to":"operator","body":hostile}),
    );
    must(
        &mut bob,
        json!({"cmd":"ask","question":hostile,"options":["\u{1b}[2Jyes","no"]}),
    );
    must(
        &mut bob,
        json!({"cmd":"set_status","text":"busy \u{1b}]0;x\u{7}"}),
    );
    let host = b.host_socket();
    let env = [("HIVE_HOST_SOCKET", host.to_str().unwrap())];
    let (_, out, _) = run_hive(&["inbox", "--peek"], None, &env);
    // Every line of a body is indented (no body forges a header, N11).
    assert!(out.contains("\\u{202e}txt.exe\n  second line"), "{out}");
    assert!(out.contains("\\x9b1m"), "{out}");
    for cmd in ["inbox", "questions", "agents"] {
        let (code, out, err) = run_hive(&[cmd], None, &env);
        assert_eq!(code, 0, "{cmd}: {err}");
        assert!(
            !out.chars()
                .any(|c| c != '\n' && hyperhive::proto::text::is_control_or_bidi(c)),
            "{cmd} printed a raw control character: {out:?}"
        );
        assert!(out.contains("\\x1b]0;"), "{cmd}: {out}");
    }
}

/// A key given twice is refused, and an error quotes at most a short prefix
/// of a huge input, on the socket and in the CLI.
#[test]
fn duplicate_keys_are_refused_and_errors_echo_a_short_prefix() {
    let b = Broker::start(&["ana"]);
    let mut host = b.host();
    let e = match call_raw(&mut host, r#"{"cmd":"hello","cmd":"agents"}"#) {
        Err(ClientError::Refused(e)) => e,
        other => panic!("{other:?}"),
    };
    assert!(e.contains("duplicate key \"cmd\""), "{e}");
    let name = "n".repeat(1 << 19);
    for req in [
        json!({"cmd":"send","to":name,"body":"x"}),
        json!({"cmd":"wake","to":name,"from":"cron","body":"x"}),
        json!({"cmd":"get_agent_meta","name":name}),
        json!({"cmd":name}),
        json!({"cmd":"answer","id":name,"answer":"x"}),
    ] {
        let e = must_not(&mut host, req.clone());
        assert!(
            e.len() < 2048 && e.contains('…'),
            "{}: {:.300}",
            req["cmd"],
            e
        );
    }
    let mut ana = b.agent("ana");
    for req in [
        json!({"cmd":"send","to":name,"body":"x"}),
        json!({"cmd":"wake","to":name,"from":"cron","body":"x"}),
        json!({"cmd":"cancel_loose_end","kind":name,"id":1}),
    ] {
        let e = must_not(&mut ana, req.clone());
        assert!(
            e.len() < 2048 && e.contains('…'),
            "{}: {:.300}",
            req["cmd"],
            e
        );
    }
    use std::os::unix::ffi::OsStrExt;
    let bad = std::ffi::OsStr::from_bytes(&[b'\xff'; 4096]);
    let out = std::process::Command::new(hive_bin())
        .args([
            std::ffi::OsStr::new("send"),
            std::ffi::OsStr::new("--to"),
            bad,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let first = String::from_utf8_lossy(&out.stderr)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        first.contains("not valid UTF-8") && first.len() < 600,
        "{first}"
    );
}

/// The broker's state dir and files are private whatever umask it starts with.
#[test]
fn broker_state_is_private_whatever_the_umask() {
    let b = Broker::start_process(
        &["ana"],
        None,
        Process {
            umask: Some(0),
            ..Process::default()
        },
    );
    let mut ana = b.agent("ana");
    let big = "r".repeat(5000);
    let id = must(
        &mut ana,
        json!({"cmd":"remind","message":big,"delay_seconds":600}),
    )["id"]
        .as_i64()
        .unwrap();
    let s = b.state_dir();
    assert_eq!(mode(&s), 0o700);
    for f in ["broker.db", "broker.db-wal", "broker.db-shm"] {
        assert_eq!(mode(&s.join(f)), 0o600, "{f}");
    }
    // A long reminder stays in broker.db: the broker writes no file for it
    // (the agent's side does, on delivery: tests/operator2_reminders.rs).
    assert!(id > 0 && !s.join("agents").exists());
    assert_eq!(mode(&b.host_socket()), 0o600);
    assert_eq!(mode(&b.run_dir().join("agents")), 0o755);
}
