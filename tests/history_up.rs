//! The agents' histories across a hive: `hive search` and `hive history` on
//! the host socket, answered by `hive up`'s supervisor from each agent's page
//! (real processes, the scripted fake claude), the dashboard's `/api/search`
//! and its turn links, and what plain `hive broker` and an agent's socket say
//! to these operator commands.

mod common;

use common::hive::*;
use common::up::Up;
use common::web::call;
use hyperhive::proto::cmd::{History, Search, Turn};
use serde_json::Value;
use std::time::Duration;

const FLEET: &str = r#"{"agents": [
  {"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}},
  {"name": "bob", "env": {"FAKE_CLAUDE_DIR": "@FAKE(bob)"}}
]}"#;

const T: Duration = Duration::from_secs(30);

fn host_socket(up: &Up) -> String {
    up.data().join("run/host.sock").display().to_string()
}

/// `hive ARGS --socket HOST`: (exit code, stdout, stderr).
fn hive(up: &Up, args: &[&str]) -> (i32, String, String) {
    let sock = host_socket(up);
    let mut all = args.to_vec();
    all.extend(["--socket", &sock]);
    run_hive(&all, None, &[])
}

/// `hive search ARGS --json` once every agent answered with `n` hits.
fn search_json(up: &Up, args: &[&str], n: usize) -> Value {
    let mut all = vec!["search", "--json"];
    all.extend(args);
    wait_for(T, &format!("{n} hits for {args:?}"), || {
        let (code, out, err) = hive(up, &all);
        assert_eq!(code, 0, "{out}{err}");
        let v: Value = serde_json::from_str(out.trim()).unwrap();
        (v["hits"].as_array()?.len() == n).then_some(v)
    })
}

#[test]
fn hive_search_and_hive_history_read_every_agents_page() {
    let up = Up::start(FLEET, &["ana", "bob"]);
    let mut host = up.host();
    ok(
        &mut host,
        hyperhive::proto::cmd::Send {
            to: "ana".into(),
            body: "the quokka-91 report".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    ok(
        &mut host,
        hyperhive::proto::cmd::Send {
            to: "bob".into(),
            body: "quokka-91 audit, with a ferret".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    );
    up.wait_prompt("ana", "quokka-91", 1);
    up.wait_prompt("bob", "quokka-91", 1);
    let v = search_json(&up, &["quokka-91"], 2);
    let agents: Vec<&str> = v["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["agent"].as_str().unwrap())
        .collect();
    assert!(agents.contains(&"ana") && agents.contains(&"bob"), "{v}");
    let ats: Vec<i64> = v["hits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["at"].as_i64().unwrap())
        .collect();
    assert!(ats[0] >= ats[1], "newest first: {v}");
    // A hit's link opens its turn on the agent's page.
    let bob_hit = v["hits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["agent"] == "bob")
        .unwrap();
    let bob_page = up.page("bob");
    let link = bob_hit["link"].as_str().unwrap();
    assert!(
        link.starts_with(&format!(
            "http://127.0.0.1:{}/agent/bob/turn/",
            bob_page.port
        )),
        "{link}"
    );
    let token = bob_page.token.clone().unwrap();
    let r = call("GET", link, &[("X-Hive-Token", &token)], None);
    assert_eq!(r.status, 200, "{link}: {}", r.body);
    // Narrowing: one agent, every word, a time.
    let v = search_json(&up, &["--agent", "bob", "quokka-91"], 1);
    assert_eq!(v["hits"][0]["agent"], "bob");
    let v = search_json(&up, &["quokka-91", "ferret"], 1);
    assert_eq!(v["hits"][0]["agent"], "bob");
    search_json(&up, &["--since", "1w", "quokka-91"], 2);
    let (code, out, _) = hive(
        &up,
        &["search", "--since", "2099-01-01T00:00:00Z", "quokka-91"],
    );
    assert_eq!(code, 0);
    assert!(out.contains("no turn matches"), "{out}");
    let (code, out, err) = hive(&up, &["search", "quokka-91"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("ana ") && out.contains("bob ") && out.contains("turn #"),
        "{out}"
    );
    assert!(out.contains("«quokka") || out.contains("quokka"), "{out}");
    let (code, _, err) = hive(&up, &["search", "\"", "*"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("has no word to search for; nothing was sent"),
        "{err}"
    );

    // The export: JSON lines of whole turns, oldest first, then as text.
    let (code, out, err) = hive(&up, &["history", "ana", "--json"]);
    assert_eq!(code, 0, "{err}");
    let turns: Vec<Turn> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(turns.windows(2).all(|w| w[0].id < w[1].id));
    let t = turns
        .iter()
        .find(|t| t.body.as_deref() == Some("the quokka-91 report"))
        .expect("the turn");
    assert_eq!(t.from.as_deref(), Some("operator"));
    assert!(t.events.iter().any(|e| e["type"] == "turn_end"));
    let (code, out, _) = hive(&up, &["history", "ana"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("── turn #") && out.contains("> the quokka-91 report"),
        "{out}"
    );
    let (code, out, _) = hive(&up, &["history", "ana", "--since", "2099-01-01T00:00:00Z"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("ana has no turns in its history since then"),
        "{out}"
    );
    let (code, _, err) = hive(&up, &["history", "nobody"]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown agent"), "{err}");

    // The dashboard's search: links through the dashboard, which logs the
    // browser in to the agent's page.
    let dash = up.dashboard();
    let v = dash.get("/api/search?q=quokka-91").unwrap();
    assert_eq!(v["hits"].as_array().unwrap().len(), 2, "{v}");
    let link = v["hits"][0]["link"].as_str().unwrap().to_string();
    assert!(
        link.starts_with("/agent/") && link.contains("/turn/"),
        "{link}"
    );
    let r = call(
        "GET",
        &format!("{}{link}", dash.base),
        &[("X-Hive-Token", &dash.token)],
        None,
    );
    // The link is the turn's page itself, on the hive's one origin: no
    // redirect to a port of the agent's, no cookie for one.
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("<!doctype html>"), "{}", r.body);
    assert!(r.header("Set-Cookie").is_none());
    let r = call(
        "GET",
        &format!("{}/api/search?q=quokka-91", dash.base),
        &[],
        None,
    );
    assert_eq!(r.status, 401, "the dashboard's search wants its token");
    assert_eq!(dash.get("/api/search").unwrap_err().0, 400);
}

#[test]
fn plain_broker_and_agents_cannot_search() {
    let b = Broker::start(&["ana"]);
    let sock = b.host_socket().display().to_string();
    let (code, _, err) = run_hive(&["search", "anything", "--socket", &sock], None, &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("search needs hive up; use the agent page's /api/history"),
        "{err}"
    );
    let (code, _, err) = run_hive(&["history", "ana", "--socket", &sock], None, &[]);
    assert_eq!(code, 1);
    assert!(err.contains("history needs hive up"), "{err}");
    let search = Search {
        words: "anything".into(),
        agent: None,
        since: None,
        limit: None,
    };
    let e = refused(&mut b.agent("ana"), search);
    assert!(e.contains("search is an operator command"), "{e}");
    let e = refused(
        &mut b.agent("ana"),
        History {
            agent: "ana".into(),
            since: None,
            after: None,
            limit: None,
        },
    );
    assert!(e.contains("history is an operator command"), "{e}");
}
