//! The Matrix client (`hyperhive::matrix`) against a real homeserver (Synapse
//! from the test kit, `tests/common/synapse.rs`): login with a fixed device and
//! a kept token, the auth error kind, idempotent sends per transaction id, the
//! sync long-poll, back-pagination of a `limited` gap, content refused before
//! sending, and 429 handling. Each test runs its own homeserver; without
//! Synapse the tests skip loudly (fail under `HIVE_REQUIRE_REAL_CLAUDE=1`).

mod common;

use common::hive::TempDir;
use common::synapse::{Synapse, User};
use hyperhive::matrix::content::CONTENT_CAP;
use hyperhive::matrix::{
    Backoff, Client, ErrorKind, RoomEvent, RoomFilter, Secret, TokenFile, TokenSource,
};
use serde_json::{json, Value};
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

const DEVICE_A: &str = "HIVE_A_BRIDGE";
const DEVICE_B: &str = "HIVE_B_BRIDGE";
const LONG_POLL: Duration = Duration::from_secs(30);

/// A homeserver with the two bridge users, or None when Synapse is missing.
fn homeserver() -> Option<(Synapse, User, User)> {
    let hs = Synapse::start()?;
    let a = hs.register("hive-a-bridge", "pw-a");
    let b = hs.register("hive-b-bridge", "pw-b");
    Some((hs, a, b))
}

/// A client logged in as `user` on `device` with its password, no token file.
fn login(hs: &Synapse, user: &User, device: &str) -> Client {
    let mut c = Client::new(&hs.url()).unwrap();
    let source = c
        .login_password(&user.user_id, &Secret::new(&user.password), device, None)
        .unwrap_or_else(|e| panic!("login of {}: {e}", user.user_id));
    assert_eq!(source, TokenSource::PasswordLogin);
    c
}

/// An invite-only room of `a` that `b` joined (through the kit).
fn shared_room(hs: &Synapse, a: &User, b: &User) -> String {
    let room = hs.create_room(a, None, &[b]);
    hs.join(b, &room);
    room
}

fn text(body: &str) -> Value {
    json!({ "msgtype": "m.text", "body": body })
}

fn bodies(events: &[RoomEvent]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.kind == "m.room.message")
        .map(|e| e.content_str("body").unwrap_or("").to_string())
        .collect()
}

/// A `since` token for "now", as a bridge with no stored token starts.
fn now_token(c: &Client, filter: &RoomFilter) -> String {
    c.sync(None, Duration::ZERO, Some(filter))
        .unwrap()
        .next_batch
}

/// Long-polls from `since` until `want` message events of `room` arrived;
/// returns them and the last `next_batch`. Fails on a `limited` timeline.
fn receive(
    c: &Client,
    room: &str,
    filter: &RoomFilter,
    mut since: String,
    want: usize,
) -> (Vec<RoomEvent>, String) {
    let mut got = Vec::new();
    for _ in 0..100 {
        if got.len() >= want {
            break;
        }
        let s = c.sync(Some(&since), LONG_POLL, Some(filter)).unwrap();
        if let Some(t) = s.timeline(room) {
            assert!(!t.limited, "a gap in a sync that kept up");
            got.extend(t.events.iter().cloned());
        }
        since = s.next_batch;
    }
    assert_eq!(got.len(), want, "{:?}", bodies(&got));
    (got, since)
}

#[test]
fn login_uses_a_fixed_device_and_reuses_the_kept_token() {
    let Some((mut hs, a, _b)) = homeserver() else {
        return;
    };
    let dir = TempDir::new("mx-login");
    let file = TokenFile::new(dir.path().join("matrix-token"));
    let password = Secret::new(&a.password);

    let mut first = Client::new(&hs.url()).unwrap();
    let source = first
        .login_password(&a.user_id, &password, DEVICE_A, Some(&file))
        .unwrap();
    assert_eq!(source, TokenSource::PasswordLogin);
    assert_eq!(
        std::fs::metadata(file.path()).unwrap().mode() & 0o777,
        0o600
    );
    let who = first.whoami().unwrap();
    assert_eq!(who.user_id, a.user_id);
    assert_eq!(who.device_id.as_deref(), Some(DEVICE_A));
    let stored = std::fs::read_to_string(file.path()).unwrap();

    // A restarted client reuses the token: no new login, the file unchanged.
    let mut second = Client::new(&hs.url()).unwrap();
    let source = second
        .login_password(&a.user_id, &password, DEVICE_A, Some(&file))
        .unwrap();
    assert_eq!(source, TokenSource::TokenFile);
    assert_eq!(second.session().unwrap().user_id, a.user_id);
    assert_eq!(second.session().unwrap().device_id, DEVICE_A);
    assert_eq!(std::fs::read_to_string(file.path()).unwrap(), stored);

    // The token survives a crash of the homeserver too.
    hs.kill9();
    hs.restart();
    let mut third = Client::new(&hs.url()).unwrap();
    let source = third
        .login_password(&a.user_id, &password, DEVICE_A, Some(&file))
        .unwrap();
    assert_eq!(source, TokenSource::TokenFile);
    third.whoami().unwrap();

    // Every password login mints a token of its own, the kept one stays good.
    let fresh = login(&hs, &a, DEVICE_A);
    third.whoami().unwrap();
    fresh.whoami().unwrap();

    // A kept token that was revoked is refused: the next start logs in with
    // the password again and replaces the file.
    hs.logout(&kept_token(&file));
    let e = third.whoami().unwrap_err();
    assert!(e.is_auth(), "{e}");
    let mut fourth = Client::new(&hs.url()).unwrap();
    let source = fourth
        .login_password(&a.user_id, &password, DEVICE_A, Some(&file))
        .unwrap();
    assert_eq!(source, TokenSource::PasswordLogin);
    assert_ne!(std::fs::read_to_string(file.path()).unwrap(), stored);
    fourth.whoami().unwrap();

    // A token kept for another device is not reused for this one.
    let mut other = Client::new(&hs.url()).unwrap();
    let source = other
        .login_password(&a.user_id, &password, "HIVE_A_OTHER", Some(&file))
        .unwrap();
    assert_eq!(source, TokenSource::PasswordLogin);
    assert_eq!(
        other.whoami().unwrap().device_id.as_deref(),
        Some("HIVE_A_OTHER")
    );
}

#[test]
fn a_wrong_password_or_token_is_the_auth_error() {
    let Some((hs, a, b)) = homeserver() else {
        return;
    };
    let dir = TempDir::new("mx-auth");
    let file = TokenFile::new(dir.path().join("matrix-token"));

    let mut c = Client::new(&hs.url()).unwrap();
    let e = c
        .login_password(&a.user_id, &Secret::new("wrong"), DEVICE_A, Some(&file))
        .unwrap_err();
    assert!(e.is_auth(), "{e}");
    assert!(
        e.message.contains(&format!(
            "the homeserver refused the Matrix login of {}",
            a.user_id
        )),
        "{e}"
    );
    assert!(e.message.contains("403 M_FORBIDDEN"), "{e}");
    assert!(!e.message.contains("wrong"), "the password shows: {e}");
    assert!(!file.path().exists(), "a refused login stores nothing");
    let e = c
        .login_password("@nobody:hive.test", &Secret::new("pw"), DEVICE_A, None)
        .unwrap_err();
    assert!(e.is_auth(), "{e}");

    // A stored token that is refused, and a wrong password: still auth.
    login_with_file(&hs, &a, &file);
    hs.logout(&kept_token(&file));
    let e = Client::new(&hs.url())
        .unwrap()
        .login_password(&a.user_id, &Secret::new("wrong"), DEVICE_A, Some(&file))
        .unwrap_err();
    assert!(e.is_auth(), "{e}");

    // Tokens given by the operator.
    let mut c = Client::new(&hs.url()).unwrap();
    let e = c
        .use_access_token(&a.user_id, Secret::new("syt_not_a_token"))
        .unwrap_err();
    assert!(e.is_auth(), "{e}");
    assert!(e.message.contains("M_UNKNOWN_TOKEN"), "{e}");
    assert!(!e.message.contains("syt_not_a_token"), "{e}");
    assert!(c.session().is_none());
    let e = c
        .use_access_token(&b.user_id, Secret::new(&a.access_token))
        .unwrap_err();
    assert!(e.is_auth(), "{e}");
    assert!(e.message.contains(&format!("is {}'s", a.user_id)), "{e}");
    let source = c
        .use_access_token(&a.user_id, Secret::new(&a.access_token))
        .unwrap();
    assert_eq!(source, TokenSource::Given);
    assert_eq!(c.session().unwrap().user_id, a.user_id);

    // Forbidden in a room is not a login problem: another 4xx, not retried.
    let room = hs.create_room(&b, None, &[]);
    let e = c.join(&room).unwrap_err();
    assert_eq!(
        e.kind,
        ErrorKind::Refused {
            status: 403,
            errcode: Some("M_FORBIDDEN".into())
        },
        "{e}"
    );
    assert!(!e.is_retryable());
}

/// The access token a token file holds.
fn kept_token(file: &TokenFile) -> String {
    let stored: Value =
        serde_json::from_str(&std::fs::read_to_string(file.path()).unwrap()).unwrap();
    stored["access_token"].as_str().unwrap().to_string()
}

fn login_with_file(hs: &Synapse, user: &User, file: &TokenFile) {
    let source = Client::new(&hs.url())
        .unwrap()
        .login_password(
            &user.user_id,
            &Secret::new(&user.password),
            DEVICE_A,
            Some(file),
        )
        .unwrap();
    assert_eq!(source, TokenSource::PasswordLogin);
}

#[test]
fn send_is_idempotent_per_transaction_id_across_a_relogin() {
    let Some((hs, a, b)) = homeserver() else {
        return;
    };
    let room = hs.create_room(&a, Some("swarm"), &[&b]);
    let alias = "#swarm:hive.test";
    let ca = login(&hs, &a, DEVICE_A);
    assert_eq!(ca.resolve_alias(alias).unwrap(), room);
    assert_eq!(ca.join(alias).unwrap(), room);
    let cb = login(&hs, &b, DEVICE_B);
    assert_eq!(cb.join(alias).unwrap(), room, "invited, b joins by alias");
    assert_eq!(cb.join(&room).unwrap(), room, "joining again is harmless");
    let filter = RoomFilter::messages(&room, 100);
    let since = now_token(&cb, &filter);

    let txn = "0f4c2a8e-5b7d-4e1a-9c3b-2d6f8a1e7b90-1";
    let first = ca.send(&room, txn, &text("one")).unwrap();
    assert!(first.starts_with('$'), "{first}");
    assert_eq!(ca.send(&room, txn, &text("one")).unwrap(), first);
    // After a re-login on the same device the homeserver still knows the
    // transaction: a crash between send and "marked sent" posts nothing twice.
    let again = login(&hs, &a, DEVICE_A);
    assert_eq!(again.send(&room, txn, &text("one")).unwrap(), first);
    assert_eq!(
        again.send(&room, txn, &text("one, changed")).unwrap(),
        first,
        "the first content stays"
    );
    // A different device is a different transaction space: a duplicate.
    let elsewhere = login(&hs, &a, "HIVE_A_OTHER");
    let dup = elsewhere.send(&room, txn, &text("one")).unwrap();
    assert_ne!(dup, first);
    again.send(&room, "txn-2", &text("two")).unwrap();

    let (events, _) = receive(&cb, &room, &filter, since, 3);
    assert_eq!(bodies(&events), ["one", "one", "two"]);
    assert_eq!(events[0].event_id, first);
    assert_eq!(events[1].event_id, dup);
    // Others never see the transaction id.
    assert!(events.iter().all(|e| e.transaction_id.is_none()));
}

#[test]
fn a_sync_long_poll_wakes_on_a_message_and_skips_nothing() {
    let Some((hs, a, b)) = homeserver() else {
        return;
    };
    let room = shared_room(&hs, &a, &b);
    let ca = login(&hs, &a, DEVICE_A);
    let cb = login(&hs, &b, DEVICE_B);
    let filter = RoomFilter::messages(&room, 100);
    let since_a = now_token(&ca, &filter);
    let since_b = now_token(&cb, &filter);

    // b is already waiting when the first message is sent.
    let waiting = {
        let (cb, filter, since) = (cb.clone(), filter.clone(), since_b.clone());
        std::thread::spawn(move || cb.sync(Some(&since), LONG_POLL, Some(&filter)))
    };
    std::thread::sleep(Duration::from_millis(300));
    ca.send(&room, "t-0", &text("m0")).unwrap();
    let woke = waiting.join().unwrap().unwrap();
    assert_ne!(woke.next_batch, since_b);
    let first = &woke.timeline(&room).expect("the room's timeline").events;
    assert_eq!(bodies(first), ["m0"]);
    assert_eq!(first[0].sender, a.user_id);

    // Messages sent while b is between polls, in bursts, all arrive in order.
    let sender = {
        let (ca, room) = (ca.clone(), room.clone());
        std::thread::spawn(move || {
            for i in 1..40 {
                ca.send(&room, &format!("t-{i}"), &text(&format!("m{i}")))
                    .unwrap();
                if i % 7 == 0 {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        })
    };
    let (rest, _) = receive(&cb, &room, &filter, woke.next_batch.clone(), 39);
    sender.join().unwrap();
    let want: Vec<String> = (1..40).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies(&rest), want);
    let mut ids: Vec<&str> = rest.iter().map(|e| e.event_id.as_str()).collect();
    ids.dedup();
    assert_eq!(ids.len(), 39, "no event twice");

    // The sender sees its own events, with their transaction ids: the bridge
    // skips them by sender.
    let (own, _) = receive(&ca, &room, &filter, since_a, 40);
    assert!(own.iter().all(|e| e.sender == a.user_id));
    assert_eq!(own[5].transaction_id.as_deref(), Some("t-5"));
}

#[test]
fn a_limited_gap_is_recovered_completely_by_back_pagination() {
    let Some((hs, a, b)) = homeserver() else {
        return;
    };
    let room = shared_room(&hs, &a, &b);
    let ca = login(&hs, &a, DEVICE_A);
    let cb = login(&hs, &b, DEVICE_B);
    for i in 0..5 {
        ca.send(&room, &format!("before-{i}"), &text(&format!("before {i}")))
            .unwrap();
    }
    let filter = RoomFilter::messages(&room, 10);
    let since = now_token(&cb, &filter);

    // b does not sync while 45 messages (and a state event the filter drops)
    // go by: more than the timeline limit.
    for i in 0..45 {
        ca.send(&room, &format!("gap-{i}"), &text(&format!("gap {i}")))
            .unwrap();
        if i == 20 {
            hs.set_room_topic(&a, &room, "a state event in the gap");
        }
    }
    let s = cb.sync(Some(&since), LONG_POLL, Some(&filter)).unwrap();
    let t = s.timeline(&room).expect("the room's timeline");
    assert!(t.limited, "45 events over a limit of 10 come back limited");
    assert_eq!(bodies(&t.events).len(), 10);
    let prev_batch = t
        .prev_batch
        .clone()
        .expect("a limited timeline has prev_batch");

    let missing = cb
        .fill_gap(&room, &prev_batch, &since, Some(&filter), 7)
        .unwrap();
    let mut all = missing.clone();
    all.extend(t.events.iter().cloned());
    let want: Vec<String> = (0..45).map(|i| format!("gap {i}")).collect();
    assert_eq!(
        bodies(&all),
        want,
        "every event once, in order, none from before"
    );

    // The next sync goes on from next_batch with nothing left over.
    let later = ca.send(&room, "after", &text("after")).unwrap();
    let (after, _) = receive(&cb, &room, &filter, s.next_batch, 1);
    assert_eq!(after[0].event_id, later);
}

#[test]
fn content_over_the_cap_or_with_a_float_is_refused_before_sending() {
    let Some((hs, a, b)) = homeserver() else {
        return;
    };
    let room = shared_room(&hs, &a, &b);
    let ca = login(&hs, &a, DEVICE_A);
    let cb = login(&hs, &b, DEVICE_B);
    let filter = RoomFilter::messages(&room, 100);
    let since = now_token(&cb, &filter);

    // Content exactly at the cap: the envelope fits in the margin, the
    // homeserver takes it.
    let size = |v: &Value| serde_json::to_vec(v).unwrap().len();
    let mut at_cap = json!({"msgtype": "m.text", "body": "", "pad": ""});
    let room_left = CONTENT_CAP - size(&at_cap);
    // Half the room in two-byte characters, the rest in one-byte ones.
    at_cap["body"] = json!("é".repeat(room_left / 4));
    at_cap["pad"] = json!("x".repeat(room_left - 2 * (room_left / 4)));
    assert_eq!(serde_json::to_vec(&at_cap).unwrap().len(), CONTENT_CAP);
    ca.send(&room, "at-cap", &at_cap).unwrap();

    let refused = [
        (
            "over-cap",
            json!({"msgtype": "m.text", "body": "x".repeat(CONTENT_CAP)}),
            "cap",
        ),
        (
            "float",
            json!({"msgtype": "m.text", "body": "f", "hive.payload": {"x": 1.5}}),
            r#"content["hive.payload"]["x"] is the float 1.5"#,
        ),
        (
            "big-int",
            json!({"msgtype": "m.text", "body": "i", "n": 9_007_199_254_740_992u64}),
            "is the integer 9007199254740992",
        ),
    ];
    for (txn, content, why) in &refused {
        let e = ca.send(&room, txn, content).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Invalid, "{e}");
        assert!(e.message.contains(why), "{e}");
        assert!(e.message.contains(&format!("transaction {txn}")), "{e}");
    }
    // The refused transaction ids were never used: they send normally now.
    ca.send(&room, "float", &text("float as a string: 1.5"))
        .unwrap();
    ca.send(
        &room,
        "big-int",
        &json!({"msgtype": "m.text", "body": "i", "n": 9_007_199_254_740_991u64}),
    )
    .unwrap();

    let (events, _) = receive(&cb, &room, &filter, since, 3);
    assert_eq!(events[0].content, *at_cap.as_object().unwrap());
    assert_eq!(
        events[1].content_str("body"),
        Some("float as a string: 1.5")
    );
    assert_eq!(events[2].content["n"], json!(9_007_199_254_740_991u64));
}

#[test]
fn a_429_with_retry_after_is_honoured() {
    let Some((hs, a, b)) = homeserver() else {
        return;
    };
    let room = shared_room(&hs, &a, &b);
    let ca = login(&hs, &a, DEVICE_A);
    let cb = login(&hs, &b, DEVICE_B);
    let filter = RoomFilter::messages(&room, 100);
    let since = now_token(&cb, &filter);
    hs.set_message_rate_limit(&a.user_id, 1, 1);

    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut limited = Vec::new();
    for i in 0..4 {
        let txn = format!("rl-{i}");
        let mut tries = 0;
        loop {
            tries += 1;
            assert!(tries < 20, "message {i} never went through");
            match ca.send(&room, &txn, &text(&format!("r{i}"))) {
                Ok(_) => {
                    backoff.succeeded();
                    break;
                }
                Err(e) => {
                    let ErrorKind::RateLimited { retry_after } = e.kind else {
                        panic!("{e}");
                    };
                    let hint = retry_after.expect("Synapse sends retry_after_ms");
                    assert!(hint > Duration::ZERO);
                    let pause = backoff.delay(&e).unwrap();
                    assert_eq!(pause, hint, "the homeserver's hint is the pause");
                    assert!(e.message.contains("429 M_LIMIT_EXCEEDED"), "{e}");
                    limited.push(hint);
                    std::thread::sleep(pause);
                }
            }
        }
    }
    assert!(!limited.is_empty(), "1 message a second must answer 429");
    let (events, _) = receive(&cb, &room, &filter, since, 4);
    assert_eq!(bodies(&events), ["r0", "r1", "r2", "r3"]);
}
