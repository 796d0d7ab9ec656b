//! The per-agent options of a fleet entry under a real `hive up` (issue 39
//! item 4): `static_dir`, `icon` and `dashboard_links` reach the agent's page,
//! which serves them on the hive's one listener under the rules for agent
//! content (`Content-Security-Policy: sandbox`, never the hive's origin), and
//! `cargo_short_messages` decides whether the agent's bash tasks get the
//! `cargo` function.

mod common;

use common::hive::TempDir;
use common::up::Up;

#[test]
fn an_entrys_options_reach_its_page_and_its_tasks() {
    let files = TempDir::new("opts");
    let stat = files.path().join("static");
    std::fs::create_dir_all(stat.join("games")).unwrap();
    std::fs::write(stat.join("games/hello.html"), "<p>hello from ana</p>").unwrap();
    let icon = files.path().join("icon.svg");
    std::fs::write(&icon, "<svg id=\"ana-icon\"/>").unwrap();
    let fleet = format!(
        r#"{{ "agents": [
  {{ "name": "ana", "env": {{ "FAKE_CLAUDE_DIR": "@FAKE(ana)" }},
     "static_dir": "{}", "icon": "{}",
     "dashboard_links": [{{ "label": "Stats", "url": "https://stats.example/", "icon": "📊" }}] }},
  {{ "name": "bob", "env": {{ "FAKE_CLAUDE_DIR": "@FAKE(bob)" }}, "cargo_short_messages": false }} ] }}"#,
        stat.display(),
        icon.display()
    );
    let up = Up::start(&fleet, &["ana", "bob"]);
    let page = up.page("ana");
    let links = page.get("/api/dashboard-links");
    assert_eq!(links.status, 200, "{}", links.body);
    assert_eq!(
        links.json(),
        serde_json::json!([{"label": "Stats", "url": "https://stats.example/", "icon": "📊"}])
    );
    let hello = page.get("/games/hello.html");
    assert_eq!(hello.status, 200, "{}", hello.body);
    assert_eq!(hello.body, "<p>hello from ana</p>");
    assert_eq!(
        hello.header("Content-Security-Policy"),
        Some("sandbox"),
        "{:?}",
        hello.headers
    );
    let svg = page.get("/icon");
    assert_eq!(svg.body, "<svg id=\"ana-icon\"/>");
    assert_eq!(svg.header("Content-Security-Policy"), Some("sandbox"));
    // bob has none of them.
    assert_eq!(
        up.page("bob").get("/api/dashboard-links").json(),
        serde_json::json!([])
    );
    // cargo_short_messages: on by default, off for bob.
    let a = up.bash_task("ana", "type -t cargo || echo none");
    assert_eq!(a.stdout_tail.trim(), "function", "{a:?}");
    // bob's tasks run without BASH_ENV (with sh, as a task without one does).
    let b = up.bash_task("bob", "echo \"${BASH_ENV:-none}\"");
    assert_eq!(b.stdout_tail.trim(), "none", "{b:?}");
}
