//! Usage limits across the hive (issue 16), end to end under `hive up` with
//! the fake claude printing CLI 2.1.197's output: agents on one credential
//! form one pool; a usage limit with a `resetsAt` reported by one harness
//! parks the whole pool in the broker (nothing handed out, no claude spawned,
//! the pause answered), the hub's timer ends it, both resume, nothing is
//! lost and the operator hears once. An agent on another account runs on.
//! `hive agents` shows each agent's pool. A request_apply_commit patch of a
//! live key is flagged on the approval card and applies without a restart.
//! Removing one limit of a budget removes exactly it, through the CLI and the
//! dashboard (issue 40).

mod common;

use common::hive::wait_for;
use common::up::Up;
use hyperhive::proto::cmd::{Agents, AgentsReply, Approve, RequestApplyCommit, Send};
use hyperhive::proto::{AgentRow, MsgKind};
use std::time::{Duration, UNIX_EPOCH};

const T: Duration = Duration::from_secs(60);
const KICK: &str = "You were just (re)started";

// ana and bob share `hive up`'s API key: one pool by the credential's keyed
// fingerprint. cat names its own account.
const FLEET: &str = r#"{
  "agents": [
    {"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}},
    {"name": "bob", "env": {"FAKE_CLAUDE_DIR": "@FAKE(bob)"}},
    {"name": "cat", "account": "other", "env": {"FAKE_CLAUDE_DIR": "@FAKE(cat)"}}
  ]
}"#;

fn rows(up: &Up) -> Vec<AgentRow> {
    let r: AgentsReply = up.host().call(&Agents {}).unwrap();
    r.agents
}

fn row(up: &Up, name: &str) -> AgentRow {
    rows(up).into_iter().find(|r| r.name == name).unwrap()
}

fn send(up: &Up, to: &str, body: &str) {
    let _: hyperhive::proto::SentReply = up
        .host()
        .call(&Send {
            to: to.into(),
            body: body.into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .unwrap();
}

/// The operator's messages so far (peeked: nothing is marked read).
fn operator_messages(up: &Up) -> Vec<hyperhive::proto::Message> {
    common::hive::peek_inbox(&mut up.host())
}

fn drained(up: &Up, name: &str) -> bool {
    let r = row(up, name);
    r.unread == 0 && r.inflight.is_none()
}

/// Unix seconds when the fake claude of `dir` was started the `n`th time.
fn spawned_at(up: &Up, agent: &str, n: usize) -> i64 {
    let path = up
        .dir
        .path()
        .join(format!("fake-{agent}"))
        .join(format!("inv-{n}.argv"));
    std::fs::metadata(path)
        .unwrap()
        .modified()
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

#[test]
fn a_usage_limit_parks_the_whole_pool_until_its_reset() {
    let up = Up::start(FLEET, &["ana", "bob", "cat"]);
    for a in ["ana", "bob", "cat"] {
        up.wait_prompt(a, KICK, 1);
    }
    wait_for(T, "the kicks to be handled", || {
        ["ana", "bob", "cat"]
            .iter()
            .all(|a| drained(&up, a))
            .then_some(())
    });
    let pools: Vec<(String, Option<String>)> =
        rows(&up).into_iter().map(|r| (r.name, r.pool)).collect();
    let pool = |n: &str| pools.iter().find(|p| p.0 == n).unwrap().1.clone().unwrap();
    assert!(pool("ana").starts_with("key:"), "{pools:?}");
    assert_eq!(pool("ana").len(), "key:".len() + 8, "{pools:?}");
    assert_eq!(pool("ana"), pool("bob"), "one credential, one pool");
    assert_eq!(pool("cat"), "account:other");
    // `hive agents` shows each agent's pool as the JSON names it.
    let sock = up.data().join("run/host.sock").display().to_string();
    let (code, out, err) = common::hive::run_hive(&["agents", "--socket", &sock], None, &[]);
    assert_eq!(code, 0, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header.get(5), Some(&"POOL"), "{out}");
    for a in ["ana", "bob", "cat"] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{a} ")))
            .unwrap();
        assert_eq!(
            line.split_whitespace().nth(5),
            Some(pool(a).as_str()),
            "{out}"
        );
    }

    // ana's next run hits the usage limit, resetting a few seconds ahead.
    let ana = up.fake("ana");
    let bob = up.fake("bob");
    let cat = up.fake("cat");
    ana.step(
        2,
        r#"rate_limit_event $(( $(date +%s) + 4 )); api_error 429 rate_limit "You've hit your session limit · resets 5:03am (UTC)""#,
    );
    send(&up, "ana", "first for ana");
    ana.wait_count(2);
    let notice = wait_for(T, "the usage-limit notice", || {
        operator_messages(&up)
            .into_iter()
            .find(|m| m.kind == MsgKind::UsageLimit)
    });
    assert!(notice.body.contains("ana, bob"), "{}", notice.body);
    // Mail for bob waits; mail for cat (another account) runs.
    send(&up, "bob", "for bob while parked");
    send(&up, "cat", "for cat");
    let paused = row(&up, "bob").paused.expect("bob is paused by the broker");
    assert_eq!(paused.reason.as_str(), "usage_limit", "{paused:?}");
    let until = paused.until.unwrap();
    cat.wait_count(2);
    wait_for(T, "cat to run its mail", || {
        drained(&up, "cat").then_some(())
    });

    // Both resume after the reset: nothing lost, in order.
    wait_for(T, "ana and bob to run their mail", || {
        (drained(&up, "ana") && drained(&up, "bob") && bob.count() >= 2 && ana.count() >= 3)
            .then_some(())
    });
    assert_eq!(bob.count(), 2, "bob ran once more");
    assert!(bob.stdin(2).contains("for bob while parked"));
    // ana's retry resumes the session that saw the message (a retry note).
    assert!(ana.stdin(2).contains("first for ana"));
    assert_eq!(ana.count(), 3, "ana ran its message once more");
    assert!(
        spawned_at(&up, "bob", 2) >= until,
        "bob did not spawn claude before the pool's reset at {until}"
    );
    assert!(spawned_at(&up, "ana", 3) >= until);
    for a in ["ana", "bob"] {
        let r = row(&up, a);
        assert_eq!(r.failed, 0, "{a}: nothing dead-lettered");
        assert!(r.paused.is_none(), "{a}: {:?}", r.paused);
    }
    let notices = operator_messages(&up)
        .into_iter()
        .filter(|m| m.kind == MsgKind::UsageLimit)
        .count();
    assert_eq!(notices, 1, "one notice per pool and window");
}

// ---- budgets ----

/// A fake claude whose every run costs one cent (and 110 tokens, 50 cache
/// reads), in a scenario dir made before `hive up` starts it.
fn cent_per_run() -> (common::hive::TempDir, String) {
    let dir = common::hive::TempDir::new("cents");
    std::fs::write(
        dir.path().join("default.sh"),
        r#"init
say "done"
printf '{"type":"result","subtype":"success","is_error":false,"api_error_status":null,"duration_ms":5,"num_turns":1,"result":"done","stop_reason":"end_turn","session_id":"%s","total_cost_usd":0.01,"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":50,"output_tokens":10},"modelUsage":{},"permission_denials":[],"terminal_reason":"completed","uuid":"u-res"}\n' "$SESSION"
exit 0
"#,
    )
    .unwrap();
    let path = dir.path().display().to_string();
    (dir, path)
}

fn budget_rows(up: &Up) -> serde_json::Value {
    let sock = up.data().join("run/host.sock");
    let (code, out, err) = common::hive::run_hive(
        &["budget", "--json", "--socket", &sock.display().to_string()],
        None,
        &[],
    );
    assert_eq!(code, 0, "{err}");
    serde_json::from_str::<serde_json::Value>(&out).unwrap()["rows"].clone()
}

fn scope(rows: &serde_json::Value, name: &str) -> serde_json::Value {
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["scope"] == name)
        .unwrap()
        .clone()
}

fn fake_at(path: &str) -> common::hive::FakeClaude {
    common::hive::FakeClaude {
        dir: std::path::PathBuf::from(path),
    }
}

#[test]
fn a_budget_pauses_the_agent_until_it_is_raised_and_spend_survives_a_restart() {
    let (_cents, path) = cent_per_run();
    let fleet = format!(
        r#"{{"agents": [{{"name": "ana", "budget": {{"usd": 0.05, "per": "day"}}, "env": {{"FAKE_CLAUDE_DIR": "{path}"}}}}]}}"#
    );
    let mut up = Up::start(&fleet, &["ana"]);
    let fake = fake_at(&path);
    fake.wait_count(1);
    wait_for(T, "the kick to be handled", || {
        drained(&up, "ana").then_some(())
    });
    // kick + 4 messages = 5 cents: the budget.
    for i in 1..=4 {
        send(&up, "ana", &format!("job {i}"));
    }
    fake.wait_count(5);
    wait_for(T, "the jobs to be handled", || {
        drained(&up, "ana").then_some(())
    });
    let notices = wait_for(T, "the 80 % and 100 % notices", || {
        let n: Vec<String> = operator_messages(&up)
            .into_iter()
            .filter(|m| m.kind == MsgKind::Budget)
            .map(|m| m.body)
            .collect();
        (n.len() >= 2).then_some(n)
    });
    assert_eq!(notices.len(), 2, "{notices:?}");
    assert!(notices[0].contains("80 %"), "{notices:?}");
    assert!(
        notices[1].contains("budget reached · $0.05 of $0.05 today"),
        "{notices:?}"
    );
    // The run after the limit does not start: the message waits, paused.
    send(&up, "ana", "over budget");
    let paused = wait_for(T, "the budget pause", || {
        let r = row(&up, "ana");
        r.paused.filter(|p| p.reason.as_str() == "budget")
    });
    assert!(
        paused
            .detail
            .contains("budget reached · $0.05 of $0.05 today"),
        "{paused:?}"
    );
    assert_eq!(row(&up, "ana").unread, 1);
    assert_eq!(fake.count(), 5, "no run started over the budget");
    let ana = scope(&budget_rows(&up), "ana");
    assert_eq!(ana["reached"], true, "{ana}");
    assert_eq!(ana["tokens"], 5 * 110, "{ana}");
    assert_eq!(ana["cache_read"], 5 * 50, "{ana}");

    // The operator raises it: the queued message runs, without a restart.
    let pid = up.state("ana").unwrap().pid;
    let sock = up.data().join("run/host.sock").display().to_string();
    let (code, out, err) = common::hive::run_hive(
        &["budget", "set", "ana", "--usd", "0.10", "--socket", &sock],
        None,
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let file = std::fs::read_to_string(up.fleet_file()).unwrap();
    assert!(file.contains("0.1"), "{file}");
    fake.wait_count(6);
    assert!(fake.stdin(6).contains("over budget"), "{}", fake.stdin(6));
    wait_for(T, "ana to drain", || drained(&up, "ana").then_some(()));
    assert!(row(&up, "ana").paused.is_none());
    assert_eq!(
        up.state("ana").unwrap().pid,
        pid,
        "applied live, no restart"
    );

    // A hand edit of `budget` applies live too, and is no reason to update.
    let fleet_path = up.fleet_file();
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fleet_path).unwrap()).unwrap();
    v["agents"][0]["budget"]["usd"] = serde_json::json!(0.06);
    std::fs::write(&fleet_path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    let paused = wait_for(T, "the hand-edited budget to pause ana", || {
        row(&up, "ana")
            .paused
            .filter(|p| p.reason.as_str() == "budget")
    });
    assert!(paused.detail.contains("$0.06 of $0.06 today"), "{paused:?}");
    send(&up, "ana", "after the hand edit");
    wait_for(T, "the message to be queued", || {
        (row(&up, "ana").unread == 1).then_some(())
    });
    assert_eq!(fake.count(), 6, "no run over the hand-edited budget");
    let st = up.state("ana").unwrap();
    assert!(st.up_to_date, "a live key makes no needs_update: {st:?}");
    assert_eq!(st.pid, pid);
    let (code, out, err) = common::hive::run_hive(
        &["budget", "set", "ana", "--usd", "0.10", "--socket", &sock],
        None,
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    fake.wait_count(7);
    wait_for(T, "ana to drain", || drained(&up, "ana").then_some(()));

    // The hive's own budget, through the same command.
    let (code, out, err) = common::hive::run_hive(
        &[
            "budget", "set", "--hive", "--usd", "7", "--per", "week", "--socket", &sock,
        ],
        None,
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let hive = scope(&budget_rows(&up), "hive");
    assert_eq!(
        (hive["usd"].clone(), hive["per"].clone()),
        (serde_json::json!(7.0), serde_json::json!("week"))
    );

    // Spend survives a restart of hive up.
    let before = scope(&budget_rows(&up), "ana")["spent_usd"]
        .as_f64()
        .unwrap();
    assert!(before >= 0.059, "{before}");
    up.terminate();
    up.restart(&["ana"]);
    let after = scope(&budget_rows(&up), "ana")["spent_usd"]
        .as_f64()
        .unwrap();
    assert!(after >= before - 1e-9, "{before} → {after}");
}

#[test]
fn budgets_are_the_operators_alone() {
    let up = Up::start(
        r#"{"agents": [{"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}]}"#,
        &["ana"],
    );
    let mut agent = up.agent("ana");
    let e = common::hive::refused(&mut agent, hyperhive::proto::cmd::GetBudget {});
    assert!(e.contains("budget"), "{e}");
    let e = common::hive::refused(
        &mut agent,
        hyperhive::proto::cmd::SetBudget {
            agent: Some("ana".into()),
            usd: Some(100.0),
            ..Default::default()
        },
    );
    assert!(e.contains("set_budget"), "{e}");
    let file = std::fs::read_to_string(up.fleet_file()).unwrap();
    assert!(!file.contains("budget"), "nothing written: {file}");
}

/// How a budget change reaches the broker: `hive budget set`, or the
/// dashboard's `POST /api/budget`, which sends the same command.
#[derive(Debug, Clone, Copy)]
enum Channel {
    Cli,
    Dashboard,
}

/// `--usd none` and `--tokens none` each remove exactly their own limit (a
/// merge patch that left a removed key out kept it: robustness review N7),
/// and the last one removes the budget, for an agent and for the hive,
/// through both channels: every start (both limits, one, none) and every
/// removal. The fleet file and `hive budget` agree with what was asked.
#[test]
fn removing_one_limit_removes_exactly_it_through_the_cli_and_the_dashboard() {
    let up = Up::start(
        r#"{"agents": [{"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}]}"#,
        &["ana"],
    );
    let dash = up.dashboard();
    let sock = up.data().join("run/host.sock").display().to_string();
    let cli = |args: &[&str]| {
        let mut argv = vec!["budget", "set"];
        argv.extend_from_slice(args);
        argv.extend(["--socket", sock.as_str()]);
        let (code, out, err) = common::hive::run_hive(&argv, None, &[]);
        assert_eq!(code, 0, "hive {argv:?}: {out}{err}");
        out
    };
    // The budget as the fleet file holds it: (usd, tokens), or none.
    let in_file = |hive: bool| -> Option<(Option<f64>, Option<u64>)> {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(up.fleet_file()).unwrap()).unwrap();
        let b = if hive {
            &v["budget"]
        } else {
            &v["agents"][0]["budget"]
        };
        (!b.is_null()).then(|| (b["usd"].as_f64(), b["tokens"].as_u64()))
    };
    type Limits = (Option<f64>, Option<u64>);
    // (start, remove usd, remove tokens, what is left)
    let cases: [(Limits, bool, bool, Option<Limits>); 9] = [
        (
            (Some(5.0), Some(1000)),
            true,
            false,
            Some((None, Some(1000))),
        ),
        (
            (Some(5.0), Some(1000)),
            false,
            true,
            Some((Some(5.0), None)),
        ),
        ((Some(5.0), Some(1000)), true, true, None),
        ((Some(5.0), None), true, false, None),
        ((Some(5.0), None), false, true, Some((Some(5.0), None))),
        ((None, Some(1000)), true, false, Some((None, Some(1000)))),
        ((None, Some(1000)), false, true, None),
        ((None, None), true, false, None),
        ((None, None), true, true, None),
    ];
    for channel in [Channel::Cli, Channel::Dashboard] {
        for hive in [false, true] {
            let who: &[&str] = if hive { &["--hive"] } else { &["ana"] };
            for (start, no_usd, no_tokens, left) in cases {
                let case =
                    format!("{channel:?} hive={hive} {start:?} -usd={no_usd} -tokens={no_tokens}");
                // The start, set through the CLI.
                cli(&[who, &["--usd", "none", "--tokens", "none"]].concat());
                let (usd, tokens) = (
                    start.0.map(|u| u.to_string()),
                    start.1.map(|t| t.to_string()),
                );
                let mut set: Vec<&str> = who.to_vec();
                if let Some(u) = &usd {
                    set.extend(["--usd", u.as_str()]);
                }
                if let Some(t) = &tokens {
                    set.extend(["--tokens", t.as_str()]);
                }
                if set.len() > 1 {
                    cli(&set);
                }
                assert_eq!(
                    in_file(hive),
                    (start != (None, None)).then_some(start),
                    "{case}"
                );
                // The removal, through the channel.
                match channel {
                    Channel::Cli => {
                        let mut args: Vec<&str> = who.to_vec();
                        if no_usd {
                            args.extend(["--usd", "none"]);
                        }
                        if no_tokens {
                            args.extend(["--tokens", "none"]);
                        }
                        let out = cli(&args);
                        let shown = match left {
                            None => "none".to_string(),
                            Some(_) => "{".to_string(),
                        };
                        assert!(out.contains(&format!("is now {shown}")), "{case}: {out}");
                    }
                    Channel::Dashboard => {
                        let mut body = serde_json::json!({});
                        if hive {
                            body["hive"] = true.into();
                        } else {
                            body["agent"] = "ana".into();
                        }
                        if no_usd {
                            body["clear_usd"] = true.into();
                        }
                        if no_tokens {
                            body["clear_tokens"] = true.into();
                        }
                        let r = dash.post("/api/budget", body);
                        assert!(r.is_ok(), "{case}: {r:?}");
                    }
                }
                assert_eq!(in_file(hive), left, "{case}: the fleet file");
                let row = scope(&budget_rows(&up), if hive { "hive" } else { "ana" });
                let shown = (row["usd"].as_f64(), row["budget_tokens"].as_u64());
                assert_eq!(shown, left.unwrap_or((None, None)), "{case}: hive budget");
            }
        }
    }
}

// ---- approvals of live keys ----

/// A `request_apply_commit` patch that touches `turn_usd` is flagged on the
/// dashboard's approval card (the snapshot's `live_keys`, which the card
/// shows) and in the operator's notice; approved, it applies without
/// restarting the agent. A patch of other keys is not flagged. A patch of
/// the values the entry has says so and restarts nothing.
#[test]
fn an_apply_commit_of_turn_usd_is_flagged_and_applies_without_a_restart() {
    let up = Up::start(
        r#"{"agents": [
  {"name": "boss", "tool_groups": ["messaging", "approvals"], "env": {"FAKE_CLAUDE_DIR": "@FAKE(boss)"}},
  {"name": "kid", "parent": "boss", "env": {"FAKE_CLAUDE_DIR": "@FAKE(kid)"}}
]}"#,
        &["boss", "kid"],
    );
    let pid = up.wait_running("kid");
    let mut boss = up.agent("boss");
    let mut propose = |patch: &str| {
        common::hive::ok(
            &mut boss,
            RequestApplyCommit {
                agent: "kid".into(),
                commit_ref: patch.into(),
            },
        )["id"]
            .as_i64()
            .unwrap()
    };
    let live = propose(r#"{"turn_usd":0.5}"#);
    let other = propose(r#"{"model":"opus"}"#);
    let dash = up.dashboard();
    let hive = wait_for(T, "both approvals on the dashboard", || {
        let h = dash.get("/api/hive").ok()?;
        (h["approvals"].as_array()?.len() == 2).then_some(h)
    });
    let card = |id: i64| {
        hive["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["id"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        card(live)["live_keys"],
        serde_json::json!(["turn_usd"]),
        "{hive}"
    );
    assert_eq!(
        card(live)["live_flag"],
        "sets turn_usd: applies at once, no restart",
        "{hive}"
    );
    assert_eq!(card(other)["live_keys"], serde_json::json!([]), "{hive}");
    assert_eq!(card(other)["live_flag"], serde_json::Value::Null, "{hive}");
    let notice = operator_messages(&up)
        .into_iter()
        .find(|m| m.body.starts_with(&format!("[approval #{live}]")))
        .expect("the approval's notice");
    assert!(
        notice
            .body
            .contains("[sets turn_usd: applies at once, no restart]"),
        "{}",
        notice.body
    );

    common::hive::ok(&mut up.host(), Approve { id: live });
    let st = wait_for(T, "kid to run with the new turn_usd", || {
        up.state("kid").filter(|s| s.applied.turn_usd == Some(0.5))
    });
    assert_eq!(st.pid, Some(pid), "no restart");
    assert!(st.up_to_date, "{st:?}");

    // The same values again (`model` is unset already): the card and the
    // notice say it changes nothing, and approving it restarts nothing.
    let same = propose(r#"{"turn_usd":0.5,"model":null}"#);
    let said = "sets turn_usd to its current value: changes nothing, no restart";
    wait_for(T, "the no-op patch's card", || {
        let h = dash.get("/api/hive").ok()?;
        let card = h["approvals"]
            .as_array()?
            .iter()
            .find(|a| a["id"] == same)?
            .clone();
        (card["live_flag"] == said).then_some(())
    });
    let notice = operator_messages(&up)
        .into_iter()
        .find(|m| m.body.starts_with(&format!("[approval #{same}]")))
        .expect("the no-op approval's notice");
    assert!(notice.body.contains(said), "{}", notice.body);
    let done = common::hive::ok(&mut up.host(), Approve { id: same });
    assert!(
        done["text"]
            .as_str()
            .is_some_and(|t| t.contains("nothing changes, no restart")),
        "{done:?}"
    );
    std::thread::sleep(std::time::Duration::from_millis(500));
    let st = up.state("kid").unwrap();
    assert_eq!(st.pid, Some(pid), "still no restart: {st:?}");
    assert!(st.up_to_date, "{st:?}");
}

// ---- the dashboard's resume and void (issue 40) ----

/// The dashboard's Resume button (`POST /api/resume`) ends a usage-limit
/// park at once, long before its reset, and the pool's mail runs; its Void
/// button (`POST /api/void-spend`) removes an agent's spend rows of the
/// current window, so `hive budget` counts from zero. A budget pause is
/// refused saying what ends it.
#[test]
fn the_dashboard_lifts_a_usage_limit_park_and_voids_a_windows_spend() {
    let (_cents, path) = cent_per_run();
    let fleet = format!(
        r#"{{"agents": [
  {{"name": "ana", "env": {{"FAKE_CLAUDE_DIR": "@FAKE(ana)"}}}},
  {{"name": "bob", "budget": {{"usd": 0.01, "per": "day"}}, "env": {{"FAKE_CLAUDE_DIR": "{path}"}}}}
]}}"#
    );
    let up = Up::start(&fleet, &["ana", "bob"]);
    let dash = up.dashboard();
    let ana = up.fake("ana");
    let bob = fake_at(&path);
    ana.wait_count(1);
    bob.wait_count(1);
    wait_for(T, "the kicks to be handled", || {
        (drained(&up, "ana") && drained(&up, "bob")).then_some(())
    });

    // ana's next run hits a usage limit that resets in an hour.
    ana.step(
        2,
        r#"rate_limit_event $(( $(date +%s) + 3600 )); api_error 429 rate_limit "You've hit your session limit · resets 5:03am (UTC)""#,
    );
    send(&up, "ana", "before the limit");
    ana.wait_count(2);
    wait_for(T, "ana's park", || {
        row(&up, "ana")
            .paused
            .filter(|p| p.reason.as_str() == "usage_limit")
    });
    send(&up, "ana", "while parked");
    let lifted = dash
        .post("/api/resume", serde_json::json!({"agent": "ana"}))
        .expect("the resume is taken");
    assert_eq!(lifted["reason"], "usage_limit", "{lifted}");
    assert!(lifted["agents"].to_string().contains("ana"), "{lifted}");
    wait_for(T, "ana to run its mail after the lift", || {
        (drained(&up, "ana") && ana.count() >= 3).then_some(())
    });
    assert!(row(&up, "ana").paused.is_none());
    let all: String = (2..=ana.count()).map(|n| ana.stdin(n)).collect();
    assert!(all.contains("while parked"), "{all}");

    // bob's kick cost the day's budget: paused, and a resume is refused.
    wait_for(T, "bob's budget pause", || {
        row(&up, "bob")
            .paused
            .filter(|p| p.reason.as_str() == "budget")
    });
    let (code, why) = dash
        .post("/api/resume", serde_json::json!({"agent": "bob"}))
        .expect_err("a budget is not lifted by resume");
    assert_eq!(code, 400);
    assert!(why.contains("budget"), "{why}");
    assert!(
        scope(&budget_rows(&up), "bob")["spent_usd"]
            .as_f64()
            .unwrap()
            > 0.0
    );

    // Voided from the dashboard: bob's window counts from zero and it runs.
    let voided = dash
        .post("/api/void-spend", serde_json::json!({"agent": "bob"}))
        .expect("the void is taken");
    assert!(voided["voided"].as_u64().unwrap() >= 1, "{voided}");
    let row_now = scope(&budget_rows(&up), "bob");
    assert_eq!(row_now["spent_usd"].as_f64(), Some(0.0), "{row_now}");
    send(&up, "bob", "after the void");
    wait_for(T, "bob to run after the void", || {
        (bob.count() >= 2 && drained(&up, "bob")).then_some(())
    });
    assert!(bob.stdin(2).contains("after the void"));
    // A body that names nobody, or both, is refused by the command's rules.
    let (code, _) = dash
        .post("/api/void-spend", serde_json::json!({}))
        .expect_err("nobody named");
    assert_eq!(code, 400);
}
