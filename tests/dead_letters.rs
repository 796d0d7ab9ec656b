//! Attempts and dead letters end to end (issue 14, stage 2): a real broker, a
//! real `hive serve` and the scripted fake claude. A message that always
//! crashes claude is dead-lettered after five hand-outs while the inbox flows
//! behind it; a message whose harness is SIGKILLed during every run reaches
//! the limit too; an outage where everything fails dead-letters nothing; the
//! operator's `hive failed`, `hive retry` and `hive agents` (its STATE and
//! FAILED columns) over the real host socket, with their errors; and the
//! dashboard of `hive up` shows the count and retries over HTTP, behind its
//! guard.

mod common;

use common::agent_page::AgentPage;
use common::hive::*;
use hyperhive::proto::cmd::{self, DeadLetter, RecvNext, RecvNextReply};
use hyperhive::proto::Client;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// kid is boss's child; bob is a root agent that writes to kid.
const HIVE: &str = r#"{"agents":[
    {"name":"boss"},
    {"name":"kid","parent":"boss"},
    {"name":"bob"}]}"#;

/// claude crashes (exits without a result, having printed only its init line)
/// on every prompt that mentions "poison", and answers every other one.
const CRASH_ON_POISON: &str = r#"if grep -q poison "$dir/inv-$FAKE_N.stdin"; then init; echo "claude: segmentation fault" >&2; exit 139; fi
ok_turn done"#;

/// A harness for kid, after its boot kick turn.
fn kid(b: &Broker, env: &[(&str, &str)]) -> Harness {
    let h = Harness::start(b, "kid", env);
    h.fake.wait_count(1);
    wait_drained(b, "kid");
    h
}

/// The invocations whose prompt contains `needle`.
fn runs_with(h: &Harness, needle: &str) -> Vec<usize> {
    (1..=h.fake.count())
        .filter(|&n| h.fake.stdin(n).contains(needle))
        .collect()
}

fn failed(b: &Broker) -> Vec<hyperhive::proto::FailedMessage> {
    let r: cmd::FailedReply = b.host().call(&cmd::Failed { agent: None }).unwrap();
    r.failed
}

#[test]
fn a_message_that_always_crashes_claude_is_dead_lettered_after_five_hand_outs_and_the_inbox_flows_behind_it(
) {
    let b = Broker::start_config(HIVE);
    let h = kid(&b, &[]);
    h.fake.default_step(CRASH_ON_POISON);
    // bob's poison, bob's later mail, then the operator's.
    let poison = agent_send(&b, "bob", "kid", "poison pill");
    let later = agent_send(&b, "bob", "kid", "bob's second");
    operator_send(&b, "kid", "the operator's");
    wait_for(T, "the dead letter", || {
        (agent_row(&b, "kid").failed == 1).then_some(())
    });
    wait_drained(&b, "kid");
    // Five runs of the poison, the default limit; the operator's mail went
    // right after its first failure, bob's later mail stayed behind it.
    let poisoned = runs_with(&h, "poison pill");
    assert_eq!(poisoned.len(), 5, "{poisoned:?}");
    assert_eq!(poisoned[0], 2);
    assert_eq!(runs_with(&h, "the operator's"), [3]);
    assert_eq!(runs_with(&h, "bob's second"), [8]);
    for n in &poisoned {
        assert!(
            h.fake.stdin(*n).contains("Message from bob"),
            "every retry carries the body (nothing reached the session)"
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 8, "dead-lettered: not looped");
    // Kept, failed, with its count and last error.
    let f = failed(&b);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(
        (f[0].id, f[0].agent.as_str(), f[0].from.as_str()),
        (poison, "kid", "bob")
    );
    assert_eq!(f[0].attempts, 5);
    assert!(f[0].last_error.contains("139"), "{}", f[0].last_error);
    // kid's parent and the sender are told, once each, with id, sender and
    // error; the operator (neither) is not.
    let to_boss = recv_all(&b, "boss");
    assert_eq!(to_boss.len(), 1, "{to_boss:?}");
    let n = &to_boss[0];
    assert_eq!(
        (n.kind.as_str(), n.from.as_str()),
        ("dead_letter", "system")
    );
    for want in [
        format!("message #{poison} from bob to kid"),
        "after 5 failed attempts".into(),
        "139".into(),
    ] {
        assert!(n.body.contains(&want), "{want}: {}", n.body);
    }
    let to_bob = recv_all(&b, "bob");
    assert_eq!(to_bob.len(), 1, "{to_bob:?}");
    assert!(
        to_bob[0]
            .body
            .contains(&format!("your message #{poison} to kid")),
        "{}",
        to_bob[0].body
    );
    assert!(operator_inbox(&b).is_empty());
    // The later message was handled normally.
    assert!(later > poison);
}

/// Kills the harness and the claude it runs (its own process group, which
/// outlives a SIGKILLed harness).
fn kill_both(h: &mut Harness, n: usize) {
    let pid = wait_for(T, "the fake claude's pid", || {
        std::fs::read_to_string(h.fake.dir.join(format!("pid-{n}")))
            .ok()?
            .trim()
            .parse::<i32>()
            .ok()
    });
    h.kill9();
    // SAFETY: kill(2) on the fake claude's process group.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
}

#[test]
fn a_message_whose_harness_is_sigkilled_during_every_run_reaches_the_limit() {
    let b = Broker::start_config(HIVE);
    let mut h = kid(&b, &[("HIVE_TURN_MAX_ATTEMPTS", "3")]);
    // The poison runs until the test kills everything; the rest are quick.
    h.fake.default_step(
        r#"if grep -q poison "$dir/inv-$FAKE_N.stdin"; then echo $$ > "$dir/pid-$FAKE_N"; init; sleep 60; fi
ok_turn done"#,
    );
    let poison = operator_send(&b, "kid", "poison pill");
    for round in 1..=3 {
        let n = wait_for(T, "the poison's run", || {
            runs_with(&h, "poison pill").get(round - 1).copied()
        });
        kill_both(&mut h, n);
        h.spawn();
    }
    // Handed out a fourth time with its three attempts used up: given up
    // without a fourth run.
    wait_for(T, "the dead letter", || {
        (agent_row(&b, "kid").failed == 1).then_some(())
    });
    wait_drained(&b, "kid");
    assert_eq!(runs_with(&h, "poison pill").len(), 3);
    let f = failed(&b);
    assert_eq!((f[0].id, f[0].attempts), (poison, 3), "{f:?}");
    assert!(
        f[0].last_error.contains("the harness stopped"),
        "{}",
        f[0].last_error
    );
    let notice = recv_all(&b, "boss");
    assert_eq!(notice.len(), 1, "{notice:?}");
    assert!(
        notice[0]
            .body
            .contains(&format!("message #{poison} from operator to kid")),
        "{}",
        notice[0].body
    );
    // Each restart's kick ran after it.
    assert!(h.fake.count() >= 4);
}

#[test]
fn an_outage_where_everything_fails_dead_letters_nothing() {
    let b = Broker::start_config(HIVE);
    let h = kid(
        &b,
        &[
            ("HIVE_TURN_MAX_ATTEMPTS", "1"),
            ("HIVE_API_BACKOFF_SECS", "1"),
            ("HIVE_API_BACKOFF_MAX_SECS", "1"),
            ("HIVE_API_FAILURES_BEFORE_NOTICE", "99"),
        ],
    );
    let overloaded =
        r#"api_error 529 server_error "API Error: 529 Overloaded. This is a server-side issue""#;
    for n in 2..=6 {
        h.fake.step(n, overloaded);
    }
    // Two senders: each failure puts its message behind the other's, so
    // both keep failing in turn, and with nothing succeeding meanwhile none
    // of it counts.
    let first = operator_send(&b, "kid", "from the operator");
    let second = agent_send(&b, "bob", "kid", "from bob");
    h.fake.wait_count(8);
    wait_drained(&b, "kid");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(h.fake.count(), 8, "the kick, five failures, two successes");
    // The two take turns: a retry in the session that saw the prompt is a
    // short note naming the message.
    let names = |n: usize, id: i64, body: &str| {
        let p = h.fake.stdin(n);
        p.contains(body) || p.contains(&format!("message #{id} "))
    };
    let order: Vec<&str> = (2..=8)
        .map(|n| {
            if names(n, first, "from the operator") {
                "operator"
            } else if names(n, second, "from bob") {
                "bob"
            } else {
                "?"
            }
        })
        .collect();
    assert_eq!(
        order,
        ["operator", "bob", "operator", "bob", "operator", "bob", "operator"],
        "after each failure the other sender's mail goes first"
    );
    assert!(
        failed(&b).is_empty(),
        "a limit of one, and nothing dead-lettered"
    );
    assert!(recv_all(&b, "boss").is_empty() && recv_all(&b, "bob").is_empty());
}

/// A dead letter made over the wire, as a harness would: `to` pops the next
/// message and gives up on it.
fn dead_letter_by_hand(b: &Broker, to: &str, error: &str) -> i64 {
    let mut a: Client = b.agent(to);
    let r: RecvNextReply = a
        .call(&RecvNext {
            wait_seconds: None,
            seen: None,
        })
        .unwrap();
    let id = r.message.unwrap().id;
    ok(
        &mut a,
        DeadLetter {
            id,
            error: error.into(),
            ran: true,
        },
    );
    id
}

#[test]
fn hive_failed_and_hive_retry_for_the_operator() {
    let b = Broker::start_config(HIVE);
    let sock = b.host_socket().display().to_string();
    let hive = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--socket", sock.as_str()]);
        run_hive(&all, None, &[])
    };
    let (code, out, _) = hive(&["failed"]);
    assert_eq!((code, out.trim()), (0, "no dead letters"));

    let long = format!("poison {}", "x".repeat(500));
    let id = operator_send(&b, "kid", &long);
    assert_eq!(
        dead_letter_by_hand(&b, "kid", "claude crashed\u{1b}[2J"),
        id
    );
    let other = agent_send(&b, "boss", "bob", "for bob");
    dead_letter_by_hand(&b, "bob", "hung");

    let (code, out, err) = hive(&["failed"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("#{id} to kid from operator, 1 attempts, failed "))
            && out.contains(&format!("#{other} to bob from boss")),
        "{out}"
    );
    assert!(
        out.contains("poison xxx") && out.contains('…'),
        "cut: {out}"
    );
    assert!(!out.contains(&"x".repeat(200)), "the body is cut: {out}");
    assert!(
        out.contains("last error: claude crashed\\x1b[2J"),
        "an agent's text is made printable: {out}"
    );
    let (code, out, _) = hive(&["failed", "--agent", "bob", "--json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(v["failed"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["failed"][0]["id"], other);
    assert_eq!(
        v["failed"][0]["body"], "for bob",
        "--json has the whole body"
    );
    let (code, _, err) = hive(&["failed", "--agent", "zed"]);
    assert_eq!(code, 1);
    assert!(err.contains("unknown agent \"zed\""), "{err}");

    // hive agents: the count.
    let (code, out, _) = hive(&["agents"]);
    assert_eq!(code, 0);
    let kid_line = out.lines().find(|l| l.starts_with("kid ")).unwrap();
    assert!(out.lines().next().unwrap().contains("FAILED"), "{out}");
    assert!(
        kid_line.split_whitespace().nth(4) == Some("1"),
        "{kid_line}"
    );
    let (_, out, _) = hive(&["agents", "--json"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let kid = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "kid")
        .unwrap();
    assert_eq!(
        (kid["failed"].as_u64(), kid["paused"].is_null()),
        (Some(1), true)
    );

    // Retry: back in the queue, attempts reset; then refused.
    let (code, out, err) = hive(&["retry", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out.trim(),
        format!("message #{id} is back in kid's queue, behind what is queued")
    );
    assert_eq!(
        (agent_row(&b, "kid").unread, agent_row(&b, "kid").failed),
        (1, 0)
    );
    let r: RecvNextReply = b
        .agent("kid")
        .call(&RecvNext {
            wait_seconds: None,
            seen: None,
        })
        .unwrap();
    assert_eq!((r.message.unwrap().id, r.attempts), (id, 1));
    let (code, _, err) = hive(&["retry", &id.to_string()]);
    assert_eq!(code, 1);
    assert!(
        err.contains(&format!("message #{id} is inflight, not failed")),
        "{err}"
    );
    let (code, _, err) = hive(&["retry", "#99999"]);
    assert_eq!(code, 1);
    assert!(err.contains("there is no message #99999"), "{err}");
    let (code, _, err) = hive(&["retry", "0"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("id \"0\" is not a message id") && err.contains("nothing was sent"),
        "{err}"
    );
}

#[test]
fn hive_agents_shows_the_pause_of_a_harness_in_one_state_column() {
    let b = Broker::start_config(HIVE);
    let mut h = kid(&b, &[("HIVE_RATE_LIMIT_SLEEP_SECS", "300")]);
    let page = AgentPage::of(&h);
    let sock = b.host_socket().display().to_string();
    let agents = || {
        let (code, out, err) = run_hive(&["agents", "--socket", &sock], None, &[]);
        assert_eq!(code, 0, "{err}");
        out
    };
    let row = |out: &str, name: &str| {
        out.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap()
            .to_string()
    };
    assert!(row(&agents(), "kid").contains(" running "), "{}", agents());
    assert!(row(&agents(), "bob").contains(" offline "), "{}", agents());
    h.fake.step(
        2,
        r#"api_error 429 rate_limit "API Error: Request rejected (429) · rate limited""#,
    );
    operator_send(&b, "kid", "go");
    page.wait_state("the pause", |s| s["paused"]["reason"] == "rate_limit");
    let out = wait_for(T, "the pause in hive agents", || {
        let out = agents();
        row(&out, "kid")
            .contains("rate_limit until ")
            .then_some(out)
    });
    let until = page.state()["paused"]["until"].as_i64().unwrap();
    let clock = &hyperhive::proto::text::fmt_time(until)[11..];
    assert!(
        row(&out, "kid").contains(&format!("rate_limit until {clock}")),
        "{out}"
    );
    let r = agent_row(&b, "kid");
    let p = r.paused.expect("the pause in --json");
    assert_eq!((p.reason.as_str(), p.until), ("rate_limit", Some(until)));
    assert!(p.detail.contains("requeued"), "{p:?}");
    // The harness is gone: so is its pause.
    h.kill9();
    wait_for(T, "the pause to go with the harness", || {
        row(&agents(), "kid").contains(" offline ").then_some(())
    });
}

#[test]
fn the_dashboard_counts_dead_letters_and_retries_one_behind_its_guard() {
    let fleet = r#"{"agents": [{"name": "ana",
        "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)", "HIVE_TURN_MAX_ATTEMPTS": "1"}}]}"#;
    let up = common::up::Up::start(fleet, &["ana"]);
    let fake = up.fake("ana");
    // Crashes on the poison until the test heals it.
    fake.default_step(
        r#"if grep -q poison "$dir/inv-$FAKE_N.stdin" && [ ! -f "$dir/healed" ]; then init; exit 139; fi
ok_turn done"#,
    );
    // The boot kick first, so that it is the message before the poison (the
    // refusal below names it); sent earlier, the poison could take id 1.
    fake.wait_count(1);
    let id = ok(
        &mut up.host(),
        cmd::Send {
            to: "ana".into(),
            body: "poison pill".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    )["id"]
        .as_i64()
        .unwrap();
    let dash = up.dashboard();
    let hive = wait_for(T, "the dead letter on the dashboard", || {
        let h = dash.get("/api/hive").ok()?;
        (h["agents"][0]["failed"] == 1).then_some(h)
    });
    assert_eq!(hive["failed"][0]["id"], id, "{hive}");
    assert_eq!(hive["failed"][0]["agent"], "ana");
    assert!(
        hive["failed"][0]["last_error"]
            .as_str()
            .unwrap()
            .contains("139"),
        "{hive}"
    );
    assert_eq!(hive["failed_more"], 0);

    // The guard: no token, no retry (and nothing changes).
    let anonymous = ureq::post(&format!("{}/api/retry", dash.base))
        .set("Content-Type", "application/json")
        .send_string(&format!(r#"{{"id":{id}}}"#));
    assert!(
        matches!(anonymous, Err(ureq::Error::Status(401, _))),
        "{anonymous:?}"
    );
    assert_eq!(dash.get("/api/hive").unwrap()["agents"][0]["failed"], 1);
    // The broker's refusal for a message that is not a dead letter, as it is.
    let kick = id - 1;
    let (code, body) = dash
        .post("/api/retry", serde_json::json!({ "id": kick }))
        .unwrap_err();
    assert_eq!(code, 400);
    assert!(
        body.contains(&format!("message #{kick} is acked, not failed")),
        "{body}"
    );

    std::fs::write(fake.dir.join("healed"), "").unwrap();
    let r = dash
        .post("/api/retry", serde_json::json!({ "id": id }))
        .unwrap();
    assert_eq!(
        (r["ok"].clone(), r["id"].clone(), r["agent"].clone()),
        (
            serde_json::json!(true),
            serde_json::json!(id),
            serde_json::json!("ana")
        )
    );
    up.wait_prompt("ana", "poison pill", 2);
    wait_for(T, "the retried message to be handled", || {
        let h = dash.get("/api/hive").ok()?;
        let a = &h["agents"][0];
        (a["failed"] == 0 && a["unread"] == 0 && a["inflight"].is_null()).then_some(())
    });
    assert_eq!(
        dash.get("/api/hive").unwrap()["failed"],
        serde_json::json!([])
    );
}
