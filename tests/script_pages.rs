//! Issue 38, one origin: a page that needs scripts of its own (a
//! `frontend.dist`) gets a loopback listener of its own (`web.script_pages`),
//! never the dashboard's origin. There its scripts run, with the hive's one
//! login or the agent's own token; the hive's cookie is never passed on; its
//! scripts cannot read the dashboard's API nor change the hive.

mod common;

use common::hive::{wait_for, TempDir};
use common::up::Up;
use common::web::{call, Resp};
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// A dist whose page runs a script: it reads its own page's state, then
/// tries the dashboard's API and a change of the fleet (at the dashboard
/// port given as `?dash=PORT`), and writes what happened into the title.
const INDEX: &str = r#"<!doctype html><title>loading</title>
<p id="p">a page with scripts of its own</p>
<script>
const dash = "http://" + location.hostname + ":" + new URLSearchParams(location.search).get("dash");
window.results = {};
fetch("api/state").then((r) => r.json()).then((s) => { window.results.state = s.label; })
  .catch((e) => { window.results.state = "failed " + e; });
fetch(dash + "/api/hive", {credentials: "include"}).then((r) => r.text())
  .then((t) => { window.results.hive = "read " + t.length; })
  .catch(() => { window.results.hive = "blocked"; });
fetch(dash + "/api/permissions", {method: "POST", credentials: "include",
  headers: {"Content-Type": "application/json"},
  body: JSON.stringify({agent: "bob", tool_groups: ["messaging", "execution", "lifecycle"], capabilities: []})})
  .then((r) => { window.results.change = "answered " + r.status; })
  .catch(() => { window.results.change = "blocked"; });
document.title = "ran";
</script>"#;

fn dist() -> TempDir {
    let d = TempDir::new("dist");
    std::fs::write(d.path().join("index.html"), INDEX).unwrap();
    d
}

fn fleet(dist: &TempDir) -> String {
    format!(
        r#"{{ "web": {{"listen": "127.0.0.1:0", "script_pages": {{"ana": "127.0.0.1:0"}}}},
  "agents": [
  {{ "name": "ana", "env": {{ "FAKE_CLAUDE_DIR": "@FAKE(ana)", "HIVE_WEB_DIST": "{}" }} }},
  {{ "name": "bob", "env": {{ "FAKE_CLAUDE_DIR": "@FAKE(bob)" }} }} ] }}"#,
        dist.path().display()
    )
}

/// Where `hive up` said ana's page with scripts of its own answers.
fn own_base(up: &Up) -> String {
    wait_for(T, "the script page's printed link", || {
        up.stdout().lines().find_map(|l| {
            let rest = l.strip_prefix("ana's page with scripts of its own: ")?;
            Some(
                rest.split_whitespace()
                    .next()?
                    .trim_end_matches('/')
                    .to_string(),
            )
        })
    })
}

fn get(url: &str, headers: &[(&str, &str)]) -> Resp {
    call("GET", url, headers, None)
}

#[test]
fn a_page_with_scripts_of_its_own_answers_on_its_own_listener_only_to_the_hives_login() {
    let dist = dist();
    let up = Up::start(&fleet(&dist), &["ana", "bob"]);
    let own = own_base(&up);
    let d = up.dashboard();
    assert_ne!(own, d.base);
    let cookie = up.operator_cookie();
    let with_cookie = [("Cookie", cookie.as_str())];

    // The hive's /agent/ana/own is the stable link to it; bob has none.
    let r = get(
        &format!("{}/agent/ana/own", d.base),
        &[("X-Hive-Token", &d.token)],
    );
    assert_eq!(r.status, 303, "{}", r.body);
    assert_eq!(r.header("Location"), Some(format!("{own}/").as_str()));
    let r = ureq::AgentBuilder::new()
        .redirects(0)
        .build()
        .get(&format!("{}/agent/ana/own", d.base))
        .set("Cookie", &cookie)
        .call()
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.header("Location"), Some(format!("{own}/").as_str()));
    let none = get(&format!("{}/agent/bob/own", d.base), &with_cookie);
    assert_eq!(none.status, 404);
    assert!(none.body.contains("web.script_pages"), "{}", none.body);

    // Without the login: the browser goes to the hive's login, which
    // returns here; a script gets a 401.
    let no_redirects = ureq::AgentBuilder::new().redirects(0).build();
    let r = no_redirects
        .get(&format!("{own}/"))
        .set("Accept", "text/html")
        .call()
        .unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(r.header("Location"), Some("/login"));
    let r = no_redirects.get(&format!("{own}/login")).call().unwrap();
    assert_eq!(r.status(), 303);
    assert_eq!(
        r.header("Location"),
        Some(format!("{}/login?next=/agent/ana/own", d.base).as_str())
    );
    assert_eq!(get(&format!("{own}/api/state"), &[]).status, 401);
    // The dashboard's token is not a session: a header with it is the
    // operator, as on the dashboard; bob's page token is nobody here.
    let bob = up.page("bob").token.unwrap();
    let r = get(&format!("{own}/api/state"), &[("X-Hive-Token", &bob)]);
    assert_eq!(r.status, 401, "{}", r.body);
    // ana's own token opens its own page here.
    let ana = up.page("ana").token.unwrap();
    let r = get(&format!("{own}/api/state"), &[("X-Hive-Token", &ana)]);
    assert_eq!(r.status, 200, "{}", r.body);

    // With the login: the dist's own page, its own policy (its scripts run),
    // nosniff still.
    let p = get(&format!("{own}/"), &with_cookie);
    assert_eq!(p.status, 200, "{}", p.body);
    assert!(p.body.contains("document.title = \"ran\""), "{}", p.body);
    assert_ne!(p.header("Content-Security-Policy"), Some("sandbox"));
    assert_eq!(p.header("X-Content-Type-Options"), Some("nosniff"));
    let s = get(&format!("{own}/api/state"), &with_cookie);
    assert_eq!(s.status, 200, "{}", s.body);
    assert_eq!(s.json()["label"], "ana");
    // The same page on the hive's origin stays sandboxed.
    let sandboxed = up.page("ana").get("/index.html");
    assert_eq!(sandboxed.status, 200);
    // Only ana's page answers here: the dashboard's API is not on it.
    let r = get(&format!("{own}/api/hive"), &with_cookie);
    assert_eq!(r.status, 404, "{}", r.body);
    // Another host name (a rebound DNS name) is refused.
    let r = get(&format!("{own}/api/state"), &[("Host", "evil.example")]);
    assert_eq!(r.status, 421, "{}", r.body);

    // Changes: from its own pages only; the dashboard takes none from it.
    let own_origin = own.clone();
    let send = |url: &str, origin: &str, body: &str| {
        call(
            "POST",
            url,
            &[
                ("Cookie", cookie.as_str()),
                ("Origin", origin),
                ("Content-Type", "application/json"),
            ],
            Some(body),
        )
    };
    let r = send(
        &format!("{own}/api/send"),
        &d.base,
        r#"{"body":"from the hive's origin"}"#,
    );
    assert_eq!(r.status, 403, "{}", r.body);
    let r = send(
        &format!("{own}/api/send"),
        &own_origin,
        r#"{"body":"from its own page"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    up.wait_prompt("ana", "from its own page", 1);
    let r = send(
        &format!("{}/api/send", d.base),
        &own_origin,
        r#"{"to":"bob","body":"from ana's script page"}"#,
    );
    assert_eq!(r.status, 403, "{}", r.body);
}

/// The dist's script, opened in Chromium by the logged-in operator: it runs
/// on its own origin and reads its own page, but the dashboard's API is
/// closed to it and its change of the fleet is never made.
#[test]
fn a_script_pages_scripts_run_but_cannot_read_or_change_the_hive() {
    use common::browser::{browser, Driver};
    let Some((chromium, chromedriver)) = browser() else {
        eprintln!("SKIPPED: no Chromium");
        return;
    };
    let dist = dist();
    let up = Up::start(&fleet(&dist), &["ana", "bob"]);
    let own = own_base(&up);
    let dash = up.dashboard();
    let before = std::fs::read(up.fleet_file()).unwrap();
    let d = Driver::start(&chromium, &chromedriver);
    d.goto(&up.login_link());
    wait_for(T, "the dashboard to go live", || {
        (d.js("return document.body.dataset.live === '1'") == true).then_some(())
    });
    d.goto(&format!("{own}/?dash={}", dash.port));
    let results = wait_for(T, "the script's three results", || {
        let r = d.js("return window.results || null");
        (r["state"].is_string() && r["hive"].is_string() && r["change"].is_string()).then_some(r)
    });
    assert_eq!(d.js("return document.title"), "ran");
    assert_eq!(results["state"], "ana", "{results}");
    assert_eq!(results["hive"], "blocked", "{results}");
    assert_eq!(results["change"], "blocked", "{results}");
    assert_eq!(
        std::fs::read(up.fleet_file()).unwrap(),
        before,
        "fleet file"
    );
    assert!(!up.log().contains("POST /api/permissions"), "{}", up.log());
}

#[test]
fn a_script_pages_address_in_use_stops_hive_up_naming_its_key() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dist = dist();
    let text = fleet(&dist).replace(
        r#""ana": "127.0.0.1:0""#,
        &format!(r#""ana": "127.0.0.1:{port}""#),
    );
    let mut up = Up::launch(
        &text,
        &["ana", "bob"],
        common::up::Launch {
            no_wait: true,
            ..Default::default()
        },
    );
    let status = up.wait_exit();
    assert!(!status.success());
    let log = up.log();
    assert!(
        log.contains("web.script_pages.ana") && log.contains("in use"),
        "{log}"
    );
}
