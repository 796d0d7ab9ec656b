//! The harness's turn path (issue 19): what a spawn no longer repeats must
//! still happen when it matters. The pool report is computed from the
//! credential files only when one of them changed, and sent only when it
//! changed or the broker may have forgotten it; a real broker, a real `hive
//! serve` and the scripted fake claude show both from the broker's side.

mod common;

use common::hive::*;

/// The pool the broker has for `agent` once the harness reported one (an
/// agent nobody reported for is in a pool of its own, `agent:NAME`).
fn pool(b: &Broker, agent: &str) -> String {
    wait_for(
        std::time::Duration::from_secs(30),
        "the pool to be reported",
        || {
            agent_row(b, agent)
                .pool
                .filter(|p| !p.starts_with("agent:"))
        },
    )
}

/// One turn more, run to its ack.
fn turn(b: &Broker, h: &Harness, agent: &str, n: usize) {
    operator_send(b, agent, &format!("turn {n}"));
    h.fake.wait_count(n);
    wait_drained(b, agent);
}

#[test]
fn the_pool_is_reported_again_to_a_broker_that_restarted_without_it() {
    let mut b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let first = pool(&b, "ana");
    assert!(first.starts_with("key:"), "{first}");

    // The broker comes back with a state dir of its own: it knows no pool.
    b.kill9();
    let fresh = b.dir.path().join("s2");
    let at = b.args.iter().position(|a| a == "--state-dir").unwrap() + 1;
    b.args[at] = fresh.display().to_string();
    b.restart();
    assert_eq!(
        agent_row(&b, "ana").pool.as_deref(),
        Some("agent:ana"),
        "a broker that was told no pool puts the agent in one of its own"
    );

    // The credential did not change, yet the next spawn tells this broker.
    let n = h.fake.count();
    turn(&b, &h, "ana", n + 1);
    let again = pool(&b, "ana");
    assert!(again.starts_with("key:"), "{again}");
    assert_eq!(again.len(), first.len(), "{again}");
    assert!(
        h.log().matches("report_pool refused").count() == 0,
        "{}",
        h.log()
    );
}

#[test]
fn a_new_credential_file_is_reported_at_the_next_spawn() {
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let first = pool(&b, "ana");
    turn(&b, &h, "ana", 2);
    assert_eq!(pool(&b, "ana"), first, "the same credential, the same pool");

    // A stored token (what the web login writes) comes before the
    // environment's key: the next spawn runs on it and reports it.
    let stored = h
        .state_dir()
        .join(hyperhive::proto::paths::state::CREDENTIALS);
    std::fs::write(&stored, "sk-ant-api03-another-account").unwrap();
    turn(&b, &h, "ana", 3);
    let second = pool(&b, "ana");
    assert!(second.starts_with("key:"), "{second}");
    assert_ne!(second, first, "another credential, another pool");

    // And the same token rewritten in place with another of its length.
    std::thread::sleep(std::time::Duration::from_millis(20));
    std::fs::write(&stored, "sk-ant-api03-another-accounu").unwrap();
    turn(&b, &h, "ana", 4);
    let third = pool(&b, "ana");
    assert_ne!(third, second, "the rewritten token is seen");
}
