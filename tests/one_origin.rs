//! Issue 38, one origin: `hive up` serves the dashboard and every agent's
//! page on the one address of the fleet file's `web.listen`, the same across
//! restarts; an address in use or beyond loopback without a public origin is
//! a start error that says what to do.

mod common;

use common::up::{Launch, Up};

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
