//! Issue 38, one origin: `hive up` serves the dashboard and every agent's
//! page on the one address of the fleet file's `web.listen`, the same across
//! restarts; an address in use or beyond loopback without a public origin is
//! a start error that says what to do. And the security tests of the one
//! origin: nothing an agent writes sends the operator's browser (over HTTP,
//! and in Chromium) or its cookie anywhere else, and an agent's page or overlay
//! runs nothing on the hive's origin.

mod common;

use common::hive::wait_for;
use common::up::{Launch, Up};
use std::time::Duration;

/// A port free right now on 127.0.0.1.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn fleet(web: &str) -> String {
    format!(
        r#"{{ {web} "agents": [ {{ "name": "ana", "env": {{ "FAKE_CLAUDE_DIR": "@FAKE(ana)" }} }} ] }}"#
    )
}

#[test]
fn the_dashboard_answers_at_web_listen_across_restarts_of_hive_up() {
    let port = free_port();
    let mut up = Up::start(
        &fleet(&format!(r#""web": {{"listen": "127.0.0.1:{port}"}},"#)),
        &["ana"],
    );
    let d = up.dashboard();
    assert_eq!(d.port, port);
    assert!(d.get("/api/hive").is_ok());
    let page = up.page("ana");
    let url = page.url("/api/state");
    assert_eq!(page.get("/api/state").status, 200);
    assert!(
        up.stdout()
            .contains(&format!("dashboard: http://127.0.0.1:{port}/login?code=")),
        "{}",
        up.stdout()
    );
    assert!(up.terminate().success());
    up.restart(&["ana"]);
    let again = up.dashboard();
    assert_eq!(again.port, port);
    assert!(again.get("/api/hive").is_ok());
    // ana's page too: the same URL, answering again.
    let page = up.page("ana");
    assert_eq!(page.url("/api/state"), url);
    let r = wait_for(
        Duration::from_secs(30),
        "ana's page after the restart",
        || Some(page.get("/api/state")).filter(|r| r.status == 200),
    );
    assert_eq!(r.json()["label"], "ana");
}

/// Starts `hive up` on `fleet` expecting it to refuse; what it said.
fn refused(fleet: &str) -> String {
    let mut up = Up::launch(
        fleet,
        &["ana"],
        Launch {
            no_wait: true,
            ..Launch::default()
        },
    );
    let status = up.wait_exit();
    assert!(!status.success(), "hive up started: {}", up.log());
    up.log()
}

#[test]
fn an_address_in_use_is_a_start_error_naming_the_key_and_the_other_process() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let log = refused(&fleet(&format!(
        r#""web": {{"listen": "127.0.0.1:{port}"}},"#
    )));
    assert!(log.contains("web.listen"), "{log}");
    assert!(log.contains("another hive up?"), "{log}");
    assert!(
        log.contains(&format!("pid {}", std::process::id())),
        "names this test's process: {log}"
    );
    drop(holder);
}

#[test]
fn a_non_loopback_address_needs_a_public_origin() {
    let log = refused(&fleet(r#""web": {"listen": "0.0.0.0:0"},"#));
    assert!(log.contains("web.public_origin"), "{log}");
    let log = refused(&fleet(
        r#""web": {"listen": "127.0.0.1:0", "public_origin": "http://hive.example"},"#,
    ));
    assert!(log.contains("web.public_origin"), "{log}");
    // With one, it starts and answers to that host and its origin.
    let up = Up::start(
        &fleet(r#""web": {"listen": "0.0.0.0:0", "public_origin": "https://hive.example"},"#),
        &["ana"],
    );
    let d = up.dashboard();
    let r = common::web::call(
        "GET",
        &format!("{}/api/hive", d.base),
        &[("X-Hive-Token", &d.token), ("Host", "hive.example")],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        up.stdout()
            .contains("dashboard: https://hive.example/login?code="),
        "{}",
        up.stdout()
    );
}

const TWO: &str = r#"{ "agents": [
  { "name": "ana", "env": { "FAKE_CLAUDE_DIR": "@FAKE(ana)" } },
  { "name": "bob", "env": { "FAKE_CLAUDE_DIR": "@FAKE(bob)" } } ] }"#;

#[test]
fn an_agents_page_answers_under_its_prefix_and_its_token_opens_nothing_else() {
    let up = Up::start(TWO, &["ana", "bob"]);
    let ana = up.page("ana");
    let s = ana.get("/api/state");
    assert_eq!(s.status, 200, "{}", s.body);
    assert_eq!(s.json()["label"], "ana");
    // Every answer of a page carries nosniff and the sandbox policy.
    assert_eq!(s.header("X-Content-Type-Options"), Some("nosniff"));
    assert_eq!(s.header("Content-Security-Policy"), Some("sandbox"));
    // The page itself is the one built into hive, served by hive up.
    let p = ana.get("/");
    assert_eq!(p.status, 200);
    assert!(p.body.contains("const BASE"), "{}", &p.body[..200]);
    let t = ana.get("/turn/1");
    assert_eq!(t.status, 200);
    assert_eq!(t.body, p.body);
    // ana's token opens ana's prefix and nothing else.
    let d = up.dashboard();
    let token = ana.token.clone().unwrap();
    for path in [
        "/api/hive",
        "/agent/bob/api/state",
        "/agent/bob/",
        "/events",
    ] {
        let r = common::web::call(
            "GET",
            &format!("{}{path}", d.base),
            &[("X-Hive-Token", &token)],
            None,
        );
        assert_eq!(r.status, 401, "{path}: {}", r.body);
    }
    // A service worker is never installed from an agent's prefix.
    let sw = ana.call("GET", "/sw.js", &[("Service-Worker", "script")], None);
    assert_eq!(sw.status, 403, "{}", sw.body);
    // The old links go to the new place, within the origin.
    let old = ana.raw("/open");
    assert_eq!(old.0, 303, "{}", old.1);
    // The operator's search links to turns on the one origin.
    assert!(!up.data().join("agents/ana/state/hyperhive-port").exists());
}

#[test]
fn the_live_stream_flows_through_the_hive_and_comes_back_after_a_restart() {
    use hyperhive::proto::cmd::{RestartAgent, Send};
    let up = Up::start(TWO, &["ana", "bob"]);
    up.wait_prompt("ana", "You were just (re)started", 1);
    let ana = up.page("ana");
    let mut sse = ana.sse("/events", &[]);
    let mut host = up.host();
    host.call(&Send {
        to: "ana".into(),
        body: "first through the hive".into(),
        in_reply_to: None,
        receipt: false,
        traceparent: None,
    })
    .unwrap();
    let end = Duration::from_secs(30);
    let got = wait_for(end, "a live turn_end through the hive", || {
        let e = sse.next(Duration::from_secs(1))?;
        (e.data.contains("\"turn_end\"")).then_some(e)
    });
    assert!(got.data.contains("turn_end"));
    let before = ana.url("/api/state");
    let pid = up.state("ana").unwrap().pid;
    host.call(&RestartAgent { name: "ana".into() }).unwrap();
    // Its stream ends with the harness; the same URL answers again.
    wait_for(end, "ana's page back at the same URL", || {
        let s = up.state("ana")?;
        let back = s.pid.is_some() && s.pid != pid && s.state == "running";
        (back && ana.get("/api/state").status == 200).then_some(())
    });
    assert_eq!(ana.url("/api/state"), before);
    let mut again = ana.sse("/events", &[]);
    host.call(&Send {
        to: "ana".into(),
        body: "second through the hive".into(),
        in_reply_to: None,
        receipt: false,
        traceparent: None,
    })
    .unwrap();
    wait_for(end, "a live turn_end after the restart", || {
        let e = again.next(Duration::from_secs(1))?;
        (e.data.contains("\"turn_end\"") && e.data.contains("ok")).then_some(())
    });
}

#[test]
fn one_login_covers_the_dashboard_and_every_page_and_changes_stay_same_origin() {
    let up = Up::start(TWO, &["ana", "bob"]);
    let d = up.dashboard();
    let cookie = up.operator_cookie();
    let get = |path: &str, extra: &[(&str, &str)]| {
        let mut h = vec![("Cookie", cookie.as_str())];
        h.extend_from_slice(extra);
        common::web::call("GET", &format!("{}{path}", d.base), &h, None)
    };
    for path in ["/api/hive", "/agent/ana/api/state", "/agent/bob/api/state"] {
        let r = get(path, &[]);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    // A foreign Host is refused on the one origin too (DNS rebinding).
    let r = get("/agent/ana/api/state", &[("Host", "evil.example")]);
    assert_eq!(r.status, 421, "{}", r.body);
    let post = |path: &str, headers: &[(&str, &str)]| {
        let mut h = vec![("Cookie", cookie.as_str())];
        h.extend_from_slice(headers);
        common::web::call(
            "POST",
            &format!("{}{path}", d.base),
            &h,
            Some(r#"{"body":"hello from the page"}"#),
        )
    };
    let json = ("Content-Type", "application/json");
    let evil = ("Origin", "http://evil.example");
    let other_port = format!("http://127.0.0.1:{}", d.port + 1);
    for (headers, want) in [
        (vec![json, evil], 403),
        (vec![json, ("Origin", other_port.as_str())], 403),
        (vec![json, ("Sec-Fetch-Site", "cross-site")], 403),
        (vec![("Content-Type", "text/plain")], 415),
    ] {
        let r = post("/agent/ana/api/send", &headers);
        assert_eq!(r.status, want, "{headers:?}: {}", r.body);
    }
    let own = format!("http://127.0.0.1:{}", d.port);
    let r = post("/agent/ana/api/send", &[json, ("Origin", own.as_str())]);
    assert_eq!(r.status, 200, "{}", r.body);
}

/// A request's head, up to its blank line (what came of it when the
/// connection ends first).
fn read_head(r: &mut impl std::io::BufRead) -> String {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            return head;
        }
        head.push_str(&line);
    }
}

/// A page in the place of ana's (what an agent that is not isolated could
/// do): answers everything with the headers an agent would like a browser
/// to keep, and records what it was sent.
fn hostile_page(up: &Up, cookie_name: &str) -> std::sync::Arc<std::sync::Mutex<Vec<String>>> {
    use std::io::{BufReader, Write};
    let path = up.data().join("run/pages/ana.sock");
    std::fs::remove_file(&path).unwrap();
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = heads.clone();
    let answer = format!(
        "HTTP/1.0 302 Found\r\nContent-Type: text/html\r\n\
         Set-Cookie: {cookie_name}=x; Path=/\r\nSet-Cookie: other=y; Path=/\r\n\
         Location: http://evil.example/\r\nRefresh: 0; url=http://evil.example/\r\n\
         Link: <http://evil.example/x.css>; rel=stylesheet\r\nClear-Site-Data: \"*\"\r\n\
         Service-Worker-Allowed: /\r\nContent-Security-Policy: script-src *\r\n\r\n\
         <script>fetch('/api/hive')</script>"
    );
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let mut w = conn.try_clone().unwrap();
            let mut r = BufReader::new(conn);
            kept.lock().unwrap().push(read_head(&mut r));
            let _ = w.write_all(answer.as_bytes());
        }
    });
    heads
}

#[test]
fn a_pages_answer_cannot_set_the_operators_cookie_or_send_the_browser_away() {
    let up = Up::start(TWO, &["ana", "bob"]);
    let d = up.dashboard();
    let cookie = up.operator_cookie();
    let name = cookie.split('=').next().unwrap().to_string();
    let heads = hostile_page(&up, &name);
    let bearer = format!("Bearer {}", d.token);
    let by_token = common::web::call(
        "GET",
        &format!("{}/agent/ana/anything", d.base),
        &[("Authorization", &bearer)],
        None,
    );
    assert_eq!(by_token.status, 302, "{}", by_token.body);
    let r = common::web::call(
        "GET",
        &format!("{}/agent/ana/anything", d.base),
        &[("Cookie", &cookie)],
        None,
    );
    assert_eq!(r.status, 302, "{}", r.body);
    for dropped in [
        "Set-Cookie",
        "Location",
        "Refresh",
        "Link",
        "Clear-Site-Data",
        "Service-Worker-Allowed",
    ] {
        assert_eq!(r.header(dropped), None, "{dropped} passed on");
    }
    assert_eq!(r.header("Content-Security-Policy"), Some("sandbox"));
    assert_eq!(r.header("X-Content-Type-Options"), Some("nosniff"));
    // The page never saw the operator's cookie or credentials.
    let seen = heads.lock().unwrap().clone();
    assert!(!seen.is_empty());
    for h in &seen {
        let lower = h.to_ascii_lowercase();
        assert!(!lower.contains("cookie") && !h.contains(&d.token), "{h}");
    }
    // The operator is still logged in.
    let r = common::web::call(
        "GET",
        &format!("{}/api/hive", d.base),
        &[("Cookie", &cookie)],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

/// N1 (robustness review 2026-12-06): an agent writes its port file and
/// listens on a port of its own; every link of the dashboard leads the
/// operator's browser within the hive's origin, and that listener gets
/// nothing.
#[test]
fn n1_a_listener_of_the_agents_choosing_gets_nothing_from_the_dashboards_links() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let up = Up::start(TWO, &["ana", "bob"]);
    let d = up.dashboard();
    let evil = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = evil.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let n = hits.clone();
    std::thread::spawn(move || {
        for _ in evil.incoming() {
            n.fetch_add(1, Ordering::SeqCst);
        }
    });
    for a in ["ana", "bob"] {
        let f = up.data().join(format!("agents/{a}/state/hyperhive-port"));
        std::fs::write(f, format!("{port}\n")).unwrap();
    }
    let cookie = up.operator_cookie();
    let hive = wait_for(Duration::from_secs(30), "both cards live", || {
        let h = d.get("/api/hive").ok()?;
        let cards = h["agents"].as_array()?;
        cards
            .iter()
            .all(|c| c["open"].is_string() && c["live"].is_object())
            .then_some(h)
    });
    let mut links = Vec::new();
    for c in hive["agents"].as_array().unwrap() {
        for k in ["url", "open", "icon", "config"] {
            if let Some(l) = c[k].as_str() {
                links.push(l.to_string());
            }
        }
        for l in c["links"].as_array().into_iter().flatten() {
            links.push(l["url"].as_str().unwrap_or_default().to_string());
        }
    }
    assert!(links.len() >= 8, "{links:?}");
    for l in &links {
        assert!(l.starts_with("/agent/"), "a link outside the origin: {l}");
        // Followed as a browser would, redirects included.
        let r = common::web::call(
            "GET",
            &format!("{}{l}", d.base),
            &[("Cookie", &cookie), ("Accept", "text/html")],
            None,
        );
        assert!(r.status < 500, "{l}: {} {}", r.status, r.body);
        if let Some(to) = r.header("Location") {
            assert!(to.starts_with('/'), "{l} → {to}");
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the agent's listener was reached"
    );
}

/// What a process claude starts (an MCP server, a plugin) tries on its
/// harness: list its descriptors, take one with `pidfd_getfd`, attach to it.
const PROBE: &str = r#"
import ctypes, os, sys
pid = int(sys.argv[1])
out = []
try:
    names = os.listdir("/proc/%d/fd" % pid)
except OSError as e:
    names = None
    out.append("fd-refused:%d" % e.errno)
if names is not None:
    read, err = [], 0
    for n in names:
        try:
            read.append(os.readlink("/proc/%d/fd/%s" % (pid, n)))
        except OSError as e:
            err = e.errno
    out.append("fd-read:%s" % read if read else "fd-refused:%d" % err)
libc = ctypes.CDLL(None, use_errno=True)
pfd = libc.syscall(434, pid, 0)
if pfd < 0:
    out.append("pidfd_open-refused:%d" % ctypes.get_errno())
else:
    took = [fd for fd in range(3, 256) if libc.syscall(438, pfd, fd, 0) >= 0]
    out.append("getfd-took:%s" % took if took else "getfd-refused:%d" % ctypes.get_errno())
if libc.ptrace(16, pid, 0, 0) == 0:
    out.append("ptrace-attached")
else:
    out.append("ptrace-refused:%d" % ctypes.get_errno())
print(" ".join(out))
"#;

#[test]
fn a_process_claude_starts_cannot_take_the_harnesss_descriptors() {
    let up = Up::start(TWO, &["ana", "bob"]);
    up.wait_prompt("ana", "You were just (re)started", 1);
    let isolated = up.log().contains("agents are isolated");
    if !isolated && unsafe { libc::geteuid() } == 0 {
        eprintln!("SKIPPED: unisolated agents of a root hive up have CAP_SYS_PTRACE");
        return;
    }
    let fake = up.fake("ana");
    let probe = fake.dir.join("probe.py");
    std::fs::write(&probe, PROBE).unwrap();
    let out = fake.dir.join("probe.out");
    let n = fake.count() + 1;
    fake.step(
        n,
        &format!(
            "python3 {} $PPID > {} 2>&1; ok_turn probed",
            probe.display(),
            out.display()
        ),
    );
    use hyperhive::proto::cmd::Send;
    up.host()
        .call(&Send {
            to: "ana".into(),
            body: "probe your harness".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .unwrap();
    let said = wait_for(Duration::from_secs(30), "the probe's answer", || {
        std::fs::read_to_string(&out)
            .ok()
            .filter(|t| t.ends_with('\n'))
    });
    eprintln!("probe: {said}");
    assert!(said.contains("fd-refused:13"), "{said}");
    assert!(
        said.contains("getfd-refused:1") || said.contains("pidfd_open-refused"),
        "{said}"
    );
    assert!(said.contains("ptrace-refused:1"), "{said}");
}

/// An overlay file of the agent's (`HIVE_STATIC_DIR`) whose script reads
/// the dashboard's API and rewrites the fleet file, opened in Chromium by
/// the logged-in operator: it runs nothing (`Content-Security-Policy:
/// sandbox`), so neither request is made.
#[test]
fn an_overlay_page_of_the_agents_runs_no_script_on_the_hives_origin() {
    use common::browser::{browser, Driver};
    let Some((chromium, chromedriver)) = browser() else {
        eprintln!("SKIPPED: no Chromium");
        return;
    };
    let overlay = common::hive::TempDir::new("overlay");
    std::fs::write(
        overlay.path().join("evil.html"),
        r#"<!doctype html><title>evil</title><script>
document.title = "ran";
fetch("/api/hive").then((r) => r.text()).then((t) => { document.title = "read " + t.length; });
fetch("/api/permissions", {method: "POST", headers: {"Content-Type": "application/json"},
  body: JSON.stringify({agent: "bob", tool_groups: ["messaging", "execution", "lifecycle"], capabilities: []})});
</script><p id="p">an overlay</p>"#,
    )
    .unwrap();
    let fleet = format!(
        r#"{{ "agents": [
  {{ "name": "ana", "env": {{ "FAKE_CLAUDE_DIR": "@FAKE(ana)", "HIVE_STATIC_DIR": "{}" }} }},
  {{ "name": "bob", "env": {{ "FAKE_CLAUDE_DIR": "@FAKE(bob)" }} }} ] }}"#,
        overlay.path().display()
    );
    let up = Up::start(&fleet, &["ana", "bob"]);
    let before = std::fs::read(up.fleet_file()).unwrap();
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    wait_for(Duration::from_secs(30), "the dashboard to go live", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    let dash = up.dashboard();
    d.goto(&format!("{}/agent/ana/evil.html", dash.base));
    wait_for(Duration::from_secs(30), "the overlay to load", || {
        (d.js("return document.readyState") == "complete"
            && d.js("return document.getElementById('p') !== null") == true)
            .then_some(())
    });
    assert_eq!(d.js("return document.title"), "evil", "its script ran");
    // Its origin is not the hive's: it can read no cookie and no storage.
    assert_eq!(d.js("return String(window.origin)"), "null");
    // Same-origin pages of the hive still work, and nothing changed.
    d.goto(&format!("{}/", dash.base));
    wait_for(Duration::from_secs(30), "the dashboard again", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    assert_eq!(
        std::fs::read(up.fleet_file()).unwrap(),
        before,
        "fleet file"
    );
    assert!(!up.log().contains("POST /api/permissions"), "{}", up.log());
}

/// A listener of the agent's choosing: answers every request with a small
/// page and records its head (an empty one for a connection that sent none),
/// in order.
fn agents_listener() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufReader, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = heads.clone();
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
            let mut w = conn.try_clone().unwrap();
            let mut r = BufReader::new(conn);
            kept.lock().unwrap().push(read_head(&mut r));
            let _ = w.write_all(
                b"HTTP/1.0 200 OK\r\nContent-Type: text/html\r\n\r\n<title>agent's</title>",
            );
        }
    });
    (port, heads)
}

/// N1 in a real browser: both agents write their old port file and a custom
/// link to a listener of their own on a loopback port; the operator, logged
/// in in Chromium, opens the dashboard and follows every `href` and `src` on
/// it, and on every page of the hive they lead to. The listener receives
/// nothing until the test itself sends the browser there last (the control,
/// which also shows what it would have taken: the hive's cookie, which on
/// plain-HTTP loopback goes to any port of the host); every link was on the
/// hive's origin, and the agents' links were drawn as text.
#[test]
fn n1_in_chromium_following_every_link_of_the_dashboard_reaches_no_listener_of_the_agents() {
    use common::browser::{browser, Driver};
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let up = Up::start(TWO, &["ana", "bob"]);
    let (port, heads) = agents_listener();
    let links = format!(
        r#"[{{"label": "status", "url": "http://127.0.0.1:{port}/"}},
            {{"label": "docs", "url": "http://localhost:{port}/docs"}}]"#
    );
    for a in ["ana", "bob"] {
        let state = up.data().join(format!("agents/{a}/state"));
        std::fs::write(state.join("hyperhive-port"), format!("{port}\n")).unwrap();
        std::fs::write(state.join("hyperhive-dashboard-links.json"), &links).unwrap();
    }
    let dash = up.dashboard();
    let origin = format!("{}/", dash.base);
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    // The dashboard is live, with both cards' page links and both agents'
    // two links, in whatever form it draws them.
    let agents_links = "[data-link=\"risky\"], a[data-link=\"custom\"]";
    wait_for(
        Duration::from_secs(30),
        "the cards with their links",
        || {
            let v = d.js(&format!(
                "return document.body.dataset.live === '1' \
             && document.querySelectorAll('a[data-link=\"page\"]').length === 2 \
             && document.querySelectorAll('{agents_links}').length === 4"
            ));
            (v == true).then_some(())
        },
    );
    let as_text = d.js("return document.querySelectorAll('[data-link=\"risky\"]').length");
    let collect = || -> Vec<String> {
        let v = d.js(
            "return Array.from(document.querySelectorAll('[href], [src]'), \
             (e) => e.href !== undefined ? String(e.href) : String(e.src))",
        );
        v.as_array()
            .unwrap()
            .iter()
            .filter_map(|u| u.as_str().map(str::to_string))
            .collect()
    };
    let mut queue = collect();
    let mut seen: Vec<String> = Vec::new();
    // The pages that drew an agent's link as a link.
    let mut linked = Vec::new();
    while let Some(url) = queue.pop() {
        let url = url.split('#').next().unwrap().to_string();
        if seen.contains(&url) || !url.starts_with("http") {
            continue;
        }
        seen.push(url.clone());
        assert!(
            seen.len() <= 60,
            "more pages than a hive of two has: {seen:?}"
        );
        d.goto(&url);
        wait_for(Duration::from_secs(30), &format!("{url} to load"), || {
            (d.js("return document.readyState") == "complete").then_some(())
        });
        if !url.starts_with(&origin) {
            continue;
        }
        // An agent's page draws its links once it has read them.
        if d.js("return document.getElementById('links') !== null") == true {
            wait_for(Duration::from_secs(30), &format!("{url}'s links"), || {
                (d.js("return document.getElementById('links').children.length") == 2).then_some(())
            });
            if d.js("return document.querySelectorAll('#links a').length") != 0 {
                linked.push(url.clone());
            }
        }
        queue.extend(collect());
    }
    eprintln!("followed: {seen:#?}");

    // The control: the browser sent to the listener by the test itself.
    d.goto(&format!("http://127.0.0.1:{port}/control"));
    let heads = wait_for(Duration::from_secs(30), "the control request", || {
        let h = heads.lock().unwrap().clone();
        h.iter()
            .any(|h| h.starts_with("GET /control "))
            .then_some(h)
    });
    assert!(
        heads[0].starts_with("GET /control "),
        "the agent's listener was reached before the control: {heads:?}"
    );
    let cookie = format!("hive_dashboard_{}=", dash.port);
    assert!(
        heads[0].contains(&cookie),
        "the control carries the hive's cookie (plain HTTP): {}",
        heads[0]
    );
    let outside: Vec<&String> = seen.iter().filter(|u| !u.starts_with(&origin)).collect();
    assert!(
        outside.is_empty(),
        "links outside the hive's origin: {outside:?}"
    );
    for want in [
        "agent/ana/",
        "agent/bob/",
        "agent/ana/config",
        "agent/bob/icon",
    ] {
        assert!(
            seen.contains(&format!("{origin}{want}")),
            "{want} not followed: {seen:?}"
        );
    }
    assert_eq!(as_text, 4, "the dashboard draws the agents' links as text");
    assert!(
        linked.is_empty(),
        "pages linking to the listener: {linked:?}"
    );
}
