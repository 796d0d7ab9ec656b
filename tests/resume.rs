//! The operator lifts any pause (issue 40, item 2), against real `hive
//! broker` and `hive serve` processes with the scripted fake claude, through
//! `hive resume` on the real host socket. Per reason: a credential pool's
//! usage-limit park ends (an idle agent of the pool takes its queued mail,
//! and the harness that met the limit tries again, an hour before the
//! reset); a harness waiting out a rate limit, an API backoff, MCP servers
//! that did not start or a claude that could not be started tries again
//! (each pause an hour long, every wait here at most a minute); a budget
//! and a login are refused, saying what ends them; an agent that is not
//! paused, an unknown agent and an unknown pool are refused (exit 1). A
//! report moves a park later at most once per gap, the operator's lift holds
//! for one, a refusal is logged once, and a lifted park stays lifted across
//! a restart of the broker.

mod common;

use common::hive::*;
use hyperhive::proto::cmd::{ReportPool, ReportSpend, ReportUsageLimit, Resume};
use hyperhive::proto::now;
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// `hive resume ARGS` on `b`'s host socket: (exit code, stdout, stderr).
fn resume(b: &Broker, args: &[&str]) -> (i32, String, String) {
    let sock = b.host_socket().display().to_string();
    let mut argv = vec!["resume"];
    argv.extend_from_slice(args);
    argv.extend(["--socket", sock.as_str()]);
    run_hive(&argv, None, &[])
}

/// `hive resume ARGS`, which must succeed; its output.
fn resumed(b: &Broker, args: &[&str]) -> String {
    let (code, out, err) = resume(b, args);
    assert_eq!(code, 0, "hive resume {args:?}: {out}{err}");
    out
}

/// `hive resume ARGS`, which must be refused; its error.
fn refusal(b: &Broker, args: &[&str]) -> String {
    let (code, out, err) = resume(b, args);
    assert_eq!(code, 1, "hive resume {args:?}: {out}{err}");
    err
}

/// Whether run `n` of `fake` handled message `id` with body `body`: it was
/// handed it, or told to finish it (a retry note naming it, in the session
/// that saw it).
fn handled(fake: &FakeClaude, n: usize, id: i64, body: &str) -> bool {
    let stdin = fake.stdin(n);
    stdin.contains(body) || stdin.contains(&format!("message #{id} from operator"))
}

/// Waits until `agent`'s row in `agents` shows a pause of `reason`.
fn wait_paused(b: &Broker, agent: &str, reason: &str) -> hyperhive::proto::Paused {
    wait_for(T, &format!("{agent}'s {reason} pause"), || {
        agent_row(b, agent)
            .paused
            .filter(|p| p.reason.as_str() == reason)
    })
}

fn uuid(u: &str) -> ReportPool {
    ReportPool {
        account_uuid: Some(u.into()),
        ..ReportPool::default()
    }
}

#[test]
fn a_usage_limit_park_is_lifted_and_its_agents_take_their_mail_at_once() {
    // ana and bob run on one API key: one pool.
    let b = Broker::start(&["ana", "bob"]);
    let ana = Harness::start(&b, "ana", &[]);
    let bob = Harness::start(&b, "bob", &[]);
    for h in [&ana, &bob] {
        h.fake.wait_count(1);
        wait_drained(&b, h.agent());
    }
    let pool = agent_row(&b, "bob").pool.unwrap();
    assert!(pool.starts_with("key:"), "{pool}");
    assert_eq!(agent_row(&b, "ana").pool.as_deref(), Some(pool.as_str()));
    // ana's next run meets the usage limit, which resets in an hour.
    ana.fake.step(
        2,
        r#"rate_limit_event $(( $(date +%s) + 3600 )); api_error 429 rate_limit "You've hit your session limit · resets 5:03am (UTC)""#,
    );
    let first = operator_send(&b, "ana", "first for ana");
    ana.fake.wait_count(2);
    let parked = wait_paused(&b, "bob", "usage_limit");
    assert!(parked.until.unwrap() > now() + 3000, "{parked:?}");
    operator_send(&b, "bob", "for bob while parked");
    wait_for(T, "bob's mail to wait", || {
        (agent_row(&b, "bob").unread == 1).then_some(())
    });
    assert_eq!(bob.fake.count(), 1, "bob started no claude while parked");

    // The operator resumes bob: its pool's park ends, for both.
    let out = resumed(&b, &["bob"]);
    assert!(
        out.contains(&format!(
            "pool {pool}'s usage-limit park is lifted: ana, bob resume now"
        )),
        "{out}"
    );
    bob.fake.wait_count(2);
    assert!(bob.fake.stdin(2).contains("for bob while parked"));
    // ana's harness ends the hour it was waiting out and runs its message.
    ana.fake.wait_count(3);
    assert!(handled(&ana.fake, 3, first, "first for ana"));
    for a in ["ana", "bob"] {
        wait_drained(&b, a);
        wait_for(T, &format!("{a}'s pause to end"), || {
            agent_row(&b, a).paused.is_none().then_some(())
        });
    }
    // Nothing is left to lift.
    let e = refusal(&b, &["--pool", &pool]);
    assert!(e.contains(&format!("pool {pool} is not parked")), "{e}");
    assert!(b.log().contains("operator resume: pool"), "{}", b.log());
}

/// How a case's harness comes to pause.
enum Cause {
    /// Its second run prints this (a fake claude step).
    Run(&'static str),
    /// claude cannot be started at boot (its binary is not there yet).
    NoBinary,
}

#[test]
fn a_harness_pause_ends_at_once_for_each_reason() {
    let hour = [
        ("HIVE_RATE_LIMIT_SLEEP_SECS", "3600"),
        ("HIVE_API_BACKOFF_SECS", "3600"),
        ("HIVE_API_BACKOFF_MAX_SECS", "3600"),
        // The first pause after a failed start or MCP servers that did not
        // start, and the cap of its backoff.
        ("HIVE_POLL_MS", "3600000"),
        ("HIVE_START_BACKOFF_MAX_MS", "3600000"),
    ];
    let cases = [
        (
            "rate_limit",
            Cause::Run(
                r#"api_error 429 rate_limit "API Error: Request rejected (429) · rate limited""#,
            ),
        ),
        (
            "api_backoff",
            Cause::Run(
                r#"api_error 529 server_error "API Error: 529 Overloaded. This is a server-side issue""#,
            ),
        ),
        (
            "mcp_start",
            Cause::Run("init_mcp failed failed; sleep 600; ok_turn never"),
        ),
        ("start_failed", Cause::NoBinary),
    ];
    for (reason, cause) in cases {
        let b = Broker::start(&["ana"]);
        let bin_dir = TempDir::new("bin");
        let bin = bin_dir.path().join("claude");
        let mut env = hour.to_vec();
        let bin_text = bin.display().to_string();
        if matches!(cause, Cause::NoBinary) {
            env.push(("HIVE_CLAUDE_BIN", bin_text.as_str()));
        }
        let h = Harness::start(&b, "ana", &env);
        // The message the pause holds back, and the run that takes it.
        let (job, run) = match cause {
            Cause::Run(step) => {
                h.fake.wait_count(1);
                wait_drained(&b, "ana");
                h.fake.step(2, step);
                let id = operator_send(&b, "ana", "the job");
                (Some(id), 3)
            }
            // The boot's kick is held back.
            Cause::NoBinary => (None, 1),
        };
        let p = wait_paused(&b, "ana", reason);
        assert!(
            p.until.unwrap() > now() + 3000,
            "{reason}: an hour's pause: {p:?}"
        );
        if matches!(cause, Cause::NoBinary) {
            // claude is there now; without a resume it would wait an hour.
            let tmp = bin_dir.path().join("claude.tmp");
            std::fs::write(
                &tmp,
                format!("#!/bin/sh\nexec '{}' \"$@\"\n", FakeClaude::bin().display()),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::rename(&tmp, &bin).unwrap();
        }
        let out = resumed(&b, &["--json", "ana"]);
        let r: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(r["reason"], reason, "{out}");
        assert_eq!(r["agents"], serde_json::json!(["ana"]), "{out}");
        assert!(
            r["text"]
                .as_str()
                .unwrap()
                .contains("its harness tries again now"),
            "{out}"
        );
        h.fake.wait_count(run);
        if let Some(id) = job {
            assert!(
                handled(&h.fake, run, id, "the job"),
                "{reason}: {}",
                h.fake.stdin(run)
            );
        }
        wait_drained(&b, "ana");
        wait_for(T, &format!("{reason}: the pause to end"), || {
            agent_row(&b, "ana").paused.is_none().then_some(())
        });
        assert!(
            h.log().contains("the operator resumed ana"),
            "{reason}: {}",
            h.log()
        );
        // Nothing is paused now: said plainly, exit 1.
        let e = refusal(&b, &["ana"]);
        assert!(
            e.contains("ana is not paused: it waits for mail"),
            "{reason}: {e}"
        );
    }
}

#[test]
fn a_budget_and_a_login_are_refused_saying_what_ends_them() {
    let b = Broker::start_config(
        r#"{"agents":[{"name":"ana","budget":{"usd":0.01,"per":"day"}},{"name":"bob"},{"name":"cat"}]}"#,
    );
    // ana's spend passes its budget: the broker pauses it.
    ok(
        &mut b.agent("ana"),
        ReportSpend {
            key: "run:1".into(),
            usd: Some(0.05),
            tokens: 10,
            cache_read: 0,
            at: None,
        },
    );
    let p = wait_paused(&b, "ana", "budget");
    let e = refusal(&b, &["ana"]);
    assert!(
        e.contains(&format!("ana is paused by a budget: {}", p.detail))
            && e.contains("budget reached · $0.05 of $0.01 today")
            && e.contains("when the window rolls over")
            && e.contains("`hive budget set ana --usd N`"),
        "{e}"
    );

    // bob has no credentials: its harness parks for a login.
    let _bob = Harness::start(&b, "bob", &[("ANTHROPIC_API_KEY", "")]);
    wait_for(T, "bob's login park", || {
        agent_row(&b, "bob").needs_login.then_some(())
    });
    let e = refusal(&b, &["bob"]);
    assert!(
        e.contains("bob waits for a claude login, which a resume cannot give")
            && e.contains("login form on its page")
            && e.contains("claude setup-token")
            && e.contains("ANTHROPIC_API_KEY"),
        "{e}"
    );

    // cat is not paused, and nothing runs it.
    let e = refusal(&b, &["cat"]);
    assert!(
        e.contains("cat is not paused: its harness is not running"),
        "{e}"
    );
    let e = refusal(&b, &["--pool", "agent:cat"]);
    assert!(e.contains("pool agent:cat is not parked"), "{e}");

    // Unknown names list the known ones.
    let e = refusal(&b, &["zed"]);
    assert!(
        e.contains("unknown agent \"zed\"; the agents are ana, bob, cat"),
        "{e}"
    );
    let e = refusal(&b, &["--pool", "key:ffffffff"]);
    assert!(
        e.contains("unknown pool \"key:ffffffff\"; the pools are")
            && e.contains("agent:ana")
            && e.contains("agent:cat"),
        "{e}"
    );
    // Neither: a usage error, before anything is sent (exit 2).
    let (code, _, e) = resume(&b, &[]);
    assert_eq!(code, 2, "{e}");
    assert!(e.contains("missing AGENT (or --pool POOL)"), "{e}");

    // `resume` is the operator's: an agent's socket refuses it.
    let e = refused(
        &mut b.agent("cat"),
        Resume {
            agent: Some("ana".into()),
            pool: None,
        },
    );
    assert!(e.contains("resume is an operator command"), "{e}");
}

#[test]
fn a_park_moves_later_once_per_gap_and_the_operators_lift_holds() {
    let mut b = Broker::start(&["ana", "bob"]);
    let (mut ana, mut bob) = (b.agent("ana"), b.agent("bob"));
    ok(&mut ana, uuid("u1"));
    ok(&mut bob, uuid("u1"));
    let limit = |until| ReportUsageLimit {
        until,
        detail: "You've hit your session limit".into(),
        credential: uuid("u1"),
    };
    let t = now();
    ok(&mut ana, limit(t + 600));
    let until = wait_paused(&b, "bob", "usage_limit").until;
    // A later end within the gap: refused, the park stands.
    let e = refused(&mut bob, limit(t + 3600));
    assert!(
        e.contains("pool uuid:u1 stays parked until")
            && e.contains("moves it later at most once every 600s"),
        "{e}"
    );
    assert_eq!(agent_row(&b, "ana").paused.unwrap().until, until);
    // The same end again is taken: it moves nothing.
    ok(&mut ana, limit(t + 600));

    let out = resumed(&b, &["--json", "--pool", "uuid:u1"]);
    let r: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["reason"], "usage_limit", "{out}");
    assert_eq!(r["pool"], "uuid:u1", "{out}");
    for a in ["ana", "bob"] {
        wait_for(T, &format!("{a}'s pause to end"), || {
            agent_row(&b, a).paused.is_none().then_some(())
        });
    }
    // No report parks it again within the gap after the lift; the refusal
    // is logged once, however often it comes.
    for _ in 0..3 {
        let e = refused(&mut ana, limit(now() + 600));
        assert!(e.contains("stays lifted"), "{e}");
    }
    let line = "ana reported a usage limit until";
    wait_for(T, "the refusal in the broker's log", || {
        b.log().contains(line).then_some(())
    });
    let log = b.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(line)).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("stays lifted"), "{}", lines[0]);
    assert!(agent_row(&b, "bob").paused.is_none());

    // The lifted park is gone from the store too: a restarted broker does
    // not park the pool again.
    b.restart();
    for a in ["ana", "bob"] {
        assert!(agent_row(&b, a).paused.is_none(), "{a}");
    }
}
