//! Logins (issue 15, item 9), against real `hive broker` and `hive serve`
//! processes: a token given on the agent page is checked by one run of the
//! agent's own claude before it is stored (refused on 401/403, stored with a
//! warning when the check cannot tell), with the scripted fake claude and with
//! the real CLI against the fake Anthropic API; the login park reaches the
//! broker (`agents`' `needs_login`, `hive agents`) and stays there while no
//! harness runs.

mod common;

use common::agent_page::AgentPage;
use common::claude_cli::{real_cli_tests, RealCli};
use common::fake_anthropic::{ErrorType, FakeAnthropic, Scenario, Step};
use common::hive::*;
use serde_json::{json, Value};
use std::time::Duration;

const T: Duration = Duration::from_secs(20);

const BAD_TOKEN: &str = "sk-ant-api03-BADsecretTOKEN";
const GOOD_TOKEN: &str = "sk-ant-oat01-GOODsecretTOKEN";

fn wait_needs_login(b: &Broker, name: &str, want: bool) {
    wait_for(T, &format!("{name}'s needs_login to be {want}"), || {
        (agent_row(b, name).needs_login == want).then_some(())
    });
}

fn hive_agents(b: &Broker) -> String {
    let host = b.host_socket();
    let (code, out, err) = run_hive(
        &["agents"],
        None,
        &[("HIVE_HOST_SOCKET", host.to_str().unwrap())],
    );
    assert_eq!(code, 0, "{err}");
    out
}

/// The `ana` line of `hive agents`.
fn ana_line(b: &Broker) -> String {
    hive_agents(b)
        .lines()
        .find(|l| l.starts_with("ana"))
        .unwrap_or_default()
        .to_string()
}

fn login(page: &AgentPage, token: &str) -> (u16, Value) {
    let r = page.post("/api/login", &json!({ "token": token }).to_string());
    (r.status, r.json())
}

#[test]
fn a_token_is_checked_with_the_agents_claude_before_it_is_stored() {
    let b = Broker::start(&["ana"]);
    // No credentials at all: the harness parks for a login at boot and says
    // so to the broker.
    let h = Harness::start(&b, "ana", &[("ANTHROPIC_API_KEY", "")]);
    wait_needs_login(&b, "ana", true);
    assert!(ana_line(&b).contains("needs login"), "{}", hive_agents(&b));
    let page = AgentPage::of(&h);
    let stored = h.state_dir().join("hyperhive-credentials");
    // The form says in plain words how to get a long-lived token.
    let html = page.get("/").body;
    assert!(
        html.contains("<code>claude setup-token</code>") && html.contains("id=\"login-form\""),
        "{html}"
    );

    // 401: refused with Anthropic's words, not stored, the park goes on.
    h.fake.step(
        1,
        r#"api_error 401 authentication_failed "Invalid API key · Fix external API key""#,
    );
    let (status, r) = login(&page, BAD_TOKEN);
    assert_eq!(status, 400, "{r}");
    assert_eq!(
        r["error"],
        "Anthropic refused this token (401): Invalid API key · Fix external API key"
    );
    assert!(!stored.exists());
    let argv = h.fake.argv(1);
    for a in ["--print", "--no-session-persistence"] {
        assert!(argv.iter().any(|x| x == a), "{argv:?}");
    }
    let model = argv.iter().position(|a| a == "--model").unwrap();
    assert_eq!(argv[model + 1], "haiku", "{argv:?}");
    assert!(!argv.iter().any(|a| a.contains("BADsecret")), "{argv:?}");
    let env = std::fs::read(h.fake.dir.join("inv-1.env")).unwrap();
    let env: Vec<String> = env
        .split(|b| *b == 0)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    assert!(env.contains(&"CLAUDE_CODE_MAX_RETRIES=0".to_string()));
    // A scratch claude dir: the agent's, which the park watches, is left alone.
    let dir = h.run_dir().join("login-check");
    assert!(env.contains(&format!("CLAUDE_CONFIG_DIR={}", dir.display())));
    assert!(!dir.exists(), "removed after the check");
    assert!(env.contains(&format!("ANTHROPIC_API_KEY={BAD_TOKEN}")));
    wait_needs_login(&b, "ana", true);

    // 500: stored, with the warning that it could not be verified.
    h.fake.step(
        2,
        r#"api_error 500 api_error "API Error: 500 Internal server error""#,
    );
    let (status, r) = login(&page, GOOD_TOKEN);
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["verified"], false, "{r}");
    let warning = r["warning"].as_str().unwrap();
    assert!(
        warning.starts_with("could not verify the token"),
        "{warning}"
    );
    assert_eq!(std::fs::read_to_string(&stored).unwrap(), GOOD_TOKEN);
    let env = std::fs::read_to_string(h.fake.dir.join("inv-2.env")).unwrap();
    assert!(env.contains(&format!("CLAUDE_CODE_OAUTH_TOKEN={GOOD_TOKEN}")));
    assert!(!env.contains("ANTHROPIC_API_KEY="), "only the token given");

    // The harness resumes: its kick turn runs with the stored token, and the
    // broker hears that the login need is over.
    h.fake.wait_count(3);
    wait_needs_login(&b, "ana", false);
    assert!(!ana_line(&b).contains("needs login"), "{}", hive_agents(&b));

    // An accepted token is stored as verified.
    wait_drained(&b, "ana");
    let (status, r) = login(&page, GOOD_TOKEN);
    assert_eq!((status, r["verified"].clone()), (200, json!(true)), "{r}");

    // Never logged, never echoed.
    for text in [h.log(), b.log()] {
        assert!(!text.contains("secretTOKEN"), "{text}");
    }
    for path in ["/api/state", "/api/login"] {
        assert!(!page.get(path).body.contains("secretTOKEN"), "{path}");
    }
}

#[test]
fn needs_login_stays_with_the_broker_while_no_harness_runs_and_a_new_one_clears_it() {
    let b = Broker::start(&["ana"]);
    let mut h = Harness::start(&b, "ana", &[("ANTHROPIC_API_KEY", "")]);
    wait_needs_login(&b, "ana", true);
    h.terminate();
    wait_for(T, "the harness to disconnect", || {
        (!agent_row(&b, "ana").running).then_some(())
    });
    assert!(
        agent_row(&b, "ana").needs_login,
        "kept while no harness runs"
    );
    assert!(ana_line(&b).contains("needs login"), "{}", hive_agents(&b));
    // Back with a key it did not have when it parked: the park is over, it
    // says so at connect, and its kick turn runs.
    h.set_env("ANTHROPIC_API_KEY", "sk-test");
    h.spawn();
    wait_needs_login(&b, "ana", false);
    h.fake.wait_count(1);
    assert!(!h.state_dir().join("hyperhive-needs-login").exists());
}

#[test]
fn a_harness_parked_with_a_refused_key_stays_parked_across_a_restart_with_it() {
    let b = Broker::start(&["ana"]);
    let mut h = Harness::start(&b, "ana", &[]);
    let refused = r#"api_error 401 authentication_failed "Invalid API key · Fix external API key""#;
    h.fake.step(1, refused);
    h.fake.step(2, refused);
    wait_needs_login(&b, "ana", true);
    let sentinel = h.state_dir().join("hyperhive-needs-login");
    let text = std::fs::read_to_string(&sentinel).unwrap();
    assert_eq!(text.lines().nth(1), Some("ANTHROPIC_API_KEY"), "{text}");
    assert!(!text.contains("sk-test"), "names only: {text}");
    h.terminate();
    // Its pause goes with it (needs_login stays).
    wait_for(T, "the pause to go with the harness", || {
        agent_row(&b, "ana").paused.is_none().then_some(())
    });
    assert!(agent_row(&b, "ana").needs_login);
    h.spawn();
    // It parks again at boot, reports that, and runs nothing.
    wait_for(T, "the new harness's login park", || {
        let row = agent_row(&b, "ana");
        row.paused
            .filter(|p| p.reason == hyperhive::proto::PauseReason::Login)
            .map(|_| ())
    });
    assert!(agent_row(&b, "ana").needs_login);
    assert_eq!(h.fake.count(), 2);
    // A credentials file written while it was down is new: the next boot
    // goes on.
    h.terminate();
    let creds = h.dir.path().join("home/.claude/.credentials.json");
    std::fs::write(&creds, "{}").unwrap();
    h.spawn();
    wait_needs_login(&b, "ana", false);
    h.fake.wait_count(3);
}

fn the_real_cli_checks_a_token_against_the_api(cli: &RealCli) {
    let b = Broker::start(&["ana"]);
    let api = FakeAnthropic::start(
        Scenario::new()
            .then(Step::error(
                401,
                ErrorType::Authentication,
                "invalid x-api-key",
            ))
            .then(Step::text("ok"))
            .otherwise(Step::text("noted")),
    );
    let cli = cli.display().to_string();
    let base = api.base_url();
    let h = Harness::start(
        &b,
        "ana",
        &[
            ("ANTHROPIC_API_KEY", ""),
            ("HIVE_CLAUDE_BIN", cli.as_str()),
            ("ANTHROPIC_BASE_URL", base.as_str()),
            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
            ("DISABLE_TELEMETRY", "1"),
        ],
    );
    wait_needs_login(&b, "ana", true);
    let page = AgentPage::of(&h);
    // The agent's claude dir, which the login park watches.
    let claude_dir = h.dir.path().join("home/.claude");
    let listing = || {
        let mut names: Vec<String> = std::fs::read_dir(&claude_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let before = listing();
    let (status, r) = login(&page, BAD_TOKEN);
    assert_eq!(status, 400, "{r}");
    assert_eq!(listing(), before, "the check wrote nothing there");
    let e = r["error"].as_str().unwrap();
    assert!(e.starts_with("Anthropic refused this token (401): "), "{e}");
    assert!(!e.contains("secretTOKEN"), "{e}");
    let posts = api.posts();
    assert_eq!(posts.len(), 1, "one request, no retries");
    assert_eq!(posts[0].header("x-api-key"), Some(BAD_TOKEN));
    assert!(!h.state_dir().join("hyperhive-credentials").exists());

    let (status, r) = login(&page, "sk-ant-api03-GOODsecretTOKEN");
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["verified"], true, "{r}");
    let posts = api.posts();
    let model = posts[1].body["model"].as_str().unwrap_or_default();
    assert!(model.contains("haiku"), "the check asks haiku: {model}");
    wait_needs_login(&b, "ana", false);
    assert!(!h.log().contains("secretTOKEN"));
}

/// The prompt of an agent's first turn after a (re)start.
const KICK: &str = "You were just (re)started";

#[test]
fn hive_up_says_next_to_the_url_and_in_its_log_that_an_agent_needs_a_login() {
    use common::up::Up;
    let fleet = r#"{"agents": [{"name": "ruth", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ruth)"}}]}"#;
    let up = Up::start_opts(fleet, &["ruth"], false, false);
    let out = wait_for(T, "hive up's needs-login line", || {
        let out = up.stdout();
        out.contains("ruth needs a login").then_some(out)
    });
    let port = up.dashboard().port;
    let line = hyperhive::fleet::supervisor::needs_login_line(
        "ruth",
        Some(&format!("http://127.0.0.1:{port}/agent/ruth/")),
    );
    // Both ways, and the dashboard's link first: the page alone asks for a
    // login the user does not have yet.
    for part in [
        "set ANTHROPIC_API_KEY",
        "log in to the dashboard with the link above",
        &format!("its page http://127.0.0.1:{port}/agent/ruth/"),
        "claude setup-token",
    ] {
        assert!(line.contains(part), "{part}: {line}");
    }
    let url_line = out
        .lines()
        .position(|l| l.starts_with(&format!("ruth: http://127.0.0.1:{port}/agent/ruth/")))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(out.lines().nth(url_line + 1), Some(line.as_str()), "{out}");
    // `hive up` prints the line, then logs it: the log may trail stdout.
    wait_for(T, "the needs-login line in hive up's log", || {
        up.log().contains(&line).then_some(())
    });
}

#[test]
fn an_expired_oauth_token_reaches_the_manager() {
    use common::up::Up;
    use hyperhive::proto::cmd::Send;
    // kid's credential is there (an OAuth token in its entry), so only its
    // harness can tell that Anthropic refuses it.
    let fleet = r#"{"agents": [
      {"name": "boss", "env": {"FAKE_CLAUDE_DIR": "@FAKE(boss)", "ANTHROPIC_API_KEY": "sk-test"}},
      {"name": "kid", "parent": "boss",
       "env": {"FAKE_CLAUDE_DIR": "@FAKE(kid)", "CLAUDE_CODE_OAUTH_TOKEN": "sk-ant-oat01-expired"}}
    ]}"#;
    let up = Up::start_opts(fleet, &["boss", "kid"], false, false);
    up.wait_prompt("kid", KICK, 1);
    assert!(up.state("kid").unwrap().logged_in);
    let kid = up.fake("kid");
    kid.wait_count(1);
    let n = kid.count();
    let expired = r#"api_error 401 authentication_failed "Failed to authenticate. API Error: 401 OAuth token has expired""#;
    kid.step(n + 1, expired);
    kid.step(n + 2, expired);
    ok(
        &mut up.host(),
        Send {
            to: "kid".into(),
            body: "build it".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    up.wait_prompt("boss", "[needs_login] kid", 1);
    assert!(!up.state("kid").unwrap().logged_in);
    let row = wait_for(T, "kid's row", || {
        let mut host = up.host();
        let r: hyperhive::proto::cmd::AgentsReply =
            host.call(&hyperhive::proto::cmd::Agents {}).ok()?;
        r.agents.into_iter().find(|a| a.name == "kid")
    });
    assert!(row.needs_login, "{row:?}");
    // The dashboard reads it there too.
    let dash = up.dashboard();
    let h = dash.get("/api/hive").unwrap();
    let card = h["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "kid")
        .cloned()
        .unwrap();
    assert_eq!(card["needs_login"], true, "{card}");
    assert_eq!(card["supervision"]["logged_in"], false, "{card}");
    assert!(
        up.log().contains("kid needs a login, one of two ways"),
        "{}",
        up.log()
    );
}

real_cli_tests!(the_real_cli_checks_a_token_against_the_api,);
