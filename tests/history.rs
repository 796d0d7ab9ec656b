//! The durable turn log (`STATE/history.db`) of a real `hive serve` with the
//! scripted fake claude, read through its page (`/api/history`, `/turn/ID`)
//! as a script would: every event of a turn is kept with its end, decision,
//! cost and tokens; paging returns every turn exactly once; search takes
//! FTS syntax as words; a `kill -9` loses no turn and the live stream's ids
//! go on; without a log the ids restart and an old client is reset; the
//! endpoints want the token; the schema goes through its migration list. The
//! size and age bounds are checked on the writer in-process, on a real file.

mod common;

use common::hive::*;
use common::web::{call, Page};
use hyperhive::history::{self, Bounds, Loggable, ReadError, Reader, View};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

const T: Duration = Duration::from_secs(30);

/// A broker and a harness whose boot turn is done, and its page.
fn started(env: &[(&str, &str)]) -> (Broker, Harness, Page) {
    let b = Broker::start(&["ana"]);
    let h = Harness::start(&b, "ana", env);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    let page = Page::of(&h.state_dir());
    (b, h, page)
}

/// `GET /api/history?QUERY`, which must answer 200.
fn history(page: &Page, query: &str) -> Value {
    let r = page.get(&format!("/api/history?{query}"));
    assert_eq!(r.status, 200, "/api/history?{query}: {}", r.body);
    r.json()
}

/// Waits until the log holds an ended turn whose message holds `needle`.
fn ended_turn(page: &Page, needle: &str) -> Value {
    wait_for(
        T,
        &format!("the ended turn of {needle:?} in the history"),
        || {
            history(page, "limit=200")["turns"]
                .as_array()?
                .iter()
                .find(|t| {
                    t["body"].as_str().is_some_and(|b| b.contains(needle))
                        && !t["ended_at"].is_null()
                })
                .cloned()
        },
    )
}

/// Removes the port file and starts the harness again, so the page found is
/// the new run's.
fn respawn(h: &mut Harness) -> Page {
    let _ = std::fs::remove_file(h.state_dir().join("hyperhive-port"));
    h.spawn();
    Page::of(&h.state_dir())
}

#[test]
fn every_event_of_a_turn_is_kept_with_its_end_decision_cost_and_tokens() {
    let (b, h, page) = started(&[]);
    h.fake.step(
        2,
        r#"init; tool_use Bash '{"command":"echo kumquat-7"}'; say "kumquat done"; result_ok "kumquat done"; exit 0"#,
    );
    operator_send(&b, "ana", "please check the kumquat-7 crate");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    let t = ended_turn(&page, "kumquat-7");
    assert_eq!(t["kind"], "message");
    assert_eq!(t["from"], "operator");
    assert_eq!(
        (t["ok"].clone(), t["outcome"].clone()),
        (json!(true), json!("ok"))
    );
    assert_eq!(t["decision"], "ack", "{t}");
    assert_eq!(t["cost_usd"], 0.014);
    assert_eq!(
        (t["tokens_in"].clone(), t["tokens_out"].clone()),
        (json!(2400), json!(84))
    );
    let events = t["events"].as_array().unwrap();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"turn_start"), "{types:?}");
    assert_eq!(types.last(), Some(&"turn_end"), "{types:?}");
    assert!(
        types.iter().filter(|t| **t == "stream").count() >= 4,
        "{types:?}"
    );
    let ids: Vec<u64> = events.iter().map(|e| e["id"].as_u64().unwrap()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(events.iter().all(|e| e["at"].as_i64().unwrap() > 0));
    assert!(
        events
            .iter()
            .any(|e| e["value"]["message"]["content"][0]["name"] == "Bash"),
        "the tool call is kept: {types:?}"
    );
    let id = t["id"].as_i64().unwrap();
    let one = history(&page, &format!("turn={id}"));
    assert_eq!(one["events"], t["events"]);
    let r = page.get(&format!("/turn/{id}"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("<title>"), "the page");
    let r = page.get("/turn/987654");
    assert_eq!(r.status, 404);
    assert!(r.body.contains("there is no turn 987654"), "{}", r.body);
    let mode = std::fs::metadata(h.state_dir().join(history::FILE))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn paging_returns_every_turn_exactly_once() {
    let (b, h, page) = started(&[]);
    let sent: Vec<String> = (0..23).map(|i| format!("page-msg-{i}")).collect();
    for body in &sent {
        operator_send(&b, "ana", body);
    }
    h.fake.wait_count(24);
    wait_drained(&b, "ana");
    ended_turn(&page, "page-msg-22");
    // Backwards, as the page scrolls up.
    let mut back: Vec<Value> = Vec::new();
    let mut before = None;
    loop {
        let q = match before {
            Some(id) => format!("before={id}&limit=5"),
            None => "limit=5".into(),
        };
        let p = history(&page, &q);
        let turns = p["turns"].as_array().unwrap().clone();
        assert!(turns.len() <= 5);
        let ids: Vec<i64> = turns.iter().map(|t| t["id"].as_i64().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "oldest first: {ids:?}");
        before = ids.first().copied();
        back.splice(0..0, turns);
        if p["more"] != true {
            break;
        }
    }
    // Forwards, as `hive history` exports.
    let mut fwd: Vec<Value> = Vec::new();
    let mut after = 0;
    loop {
        let p = history(&page, &format!("after={after}&limit=7"));
        let turns = p["turns"].as_array().unwrap().clone();
        if let Some(last) = turns.last() {
            after = last["id"].as_i64().unwrap();
        }
        fwd.extend(turns);
        if p["more"] != true {
            break;
        }
    }
    let ids = |v: &[Value]| {
        v.iter()
            .map(|t| t["id"].as_i64().unwrap())
            .collect::<Vec<_>>()
    };
    let (back_ids, fwd_ids) = (ids(&back), ids(&fwd));
    assert_eq!(back_ids, fwd_ids, "both ways give the same turns");
    let mut unique = back_ids.clone();
    unique.dedup();
    assert_eq!(unique, back_ids, "no turn twice");
    let bodies: Vec<&str> = back
        .iter()
        .filter_map(|t| t["body"].as_str())
        .filter(|b| b.starts_with("page-msg-"))
        .collect();
    assert_eq!(bodies, sent, "every message turn once, in order");
}

#[test]
fn search_takes_fts_syntax_as_words() {
    let (b, h, page) = started(&[]);
    let bodies = [
        r#"alpha "quoted" beta"#,
        "gamma -delta epsilon",
        "NEAR(xeno yarrow) star* zeta",
        "plain words only",
    ];
    for body in bodies {
        operator_send(&b, "ana", body);
    }
    h.fake.wait_count(1 + bodies.len());
    wait_drained(&b, "ana");
    ended_turn(&page, "plain words only");
    let hits = |q: &str| -> Vec<String> {
        let enc: String = q
            .bytes()
            .map(|c| match c {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' => (c as char).to_string(),
                c => format!("%{c:02X}"),
            })
            .collect();
        let v = history(&page, &format!("q={enc}"));
        v["hits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["snippet"].as_str().unwrap().to_string())
            .collect()
    };
    for (q, want) in [
        ("alpha", "alpha"),
        (r#""quoted""#, "quoted"),
        ("-delta", "delta"),
        ("gamma -delta", "gamma"),
        ("NEAR(xeno", "xeno"),
        ("star*", "star"),
        ("zeta NEAR", "zeta"),
    ] {
        let found = hits(q);
        assert_eq!(found.len(), 1, "{q:?}: {found:?}");
        let marked = found[0].split('«').skip(1).any(|m| m.contains(want));
        assert!(marked, "{q:?}: the match is marked: {found:?}");
    }
    // OR is a word here, so this asks for turns holding all three.
    assert!(hits("alpha OR gamma").is_empty());
    assert!(hits("plain AND words").is_empty());
    let r = page.get("/api/history?q=%22%20-%20*");
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("has no word to search for"), "{}", r.body);
    let later = hyperhive::proto::now() + 3600;
    let v = history(&page, &format!("q=alpha&since={later}"));
    assert_eq!(v["hits"], json!([]));
    let v = history(&page, "q=alpha");
    let hit = &v["hits"][0];
    assert_eq!(hit["from"], "operator");
    assert_eq!(hit["link"], format!("/turn/{}", hit["turn"]));
    for bad in [
        "limit=0",
        "limit=201",
        "before=x",
        "q=a&before=3",
        "since=5",
    ] {
        let r = page.get(&format!("/api/history?{bad}"));
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
    }
}

#[test]
fn a_kill_9_keeps_the_turns_and_the_live_ids_go_on() {
    let (b, mut h, page) = started(&[]);
    operator_send(&b, "ana", "remember the zanzibar-42 plan");
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    let before = ended_turn(&page, "zanzibar-42");
    let last = history(&page, "limit=1")["last_event_id"].as_u64().unwrap();
    h.kill9();
    let page = respawn(&mut h);
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    let after = ended_turn(&page, "zanzibar-42");
    assert_eq!(
        after["events"], before["events"],
        "the turn is whole after the kill"
    );
    let hits = history(&page, "q=zanzibar");
    assert_eq!(hits["hits"][0]["turn"], before["id"]);
    // The killed run may have handed out ids it never stored: the new ones
    // start past them, and a browser that saw the old ones just goes on.
    // The log writes a batch within 100 ms (LINGER) of its first event.
    let first_new = wait_for(T, "the new run's first turn in the log", || {
        let newest = history(&page, "limit=1");
        let id = newest["turns"][0]["events"][0]["id"].as_u64()?;
        (id > last).then_some(id)
    });
    assert!(
        first_new > last + history::writer::RESTART_SKIP,
        "{first_new} after {last}"
    );
    let mut sse = page.sse("/events", &[("Last-Event-ID", &last.to_string())]);
    assert_eq!(sse.status, 200);
    let e = sse.next(T).expect("the events after the old id");
    assert!(e.name.is_none(), "no reset: {e:?}");
    assert!(e.id.unwrap() > last);
    // A clean stop goes on from the exact id.
    let final_id = history(&page, "limit=1")["last_event_id"].as_u64().unwrap();
    h.terminate();
    let page = respawn(&mut h);
    h.fake.wait_count(4);
    wait_drained(&b, "ana");
    let p = wait_for(T, "the new run's turn", || {
        let p = history(&page, "limit=1");
        (p["last_event_id"].as_u64()? > final_id).then_some(p)
    });
    let first = p["turns"][0]["events"][0]["id"].as_u64().unwrap();
    assert!(
        first > final_id && first < final_id + history::writer::RESTART_SKIP,
        "{first} after {final_id}"
    );
}

#[test]
fn without_a_log_the_ids_restart_and_an_old_client_is_reset() {
    let (b, mut h, page) = started(&[]);
    let last = wait_for(T, "the boot turn in the log", || {
        let id = history(&page, "limit=1")["last_event_id"].as_u64()?;
        (id > 0).then_some(id)
    });
    h.terminate();
    let db = h.state_dir().join(history::FILE);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    std::fs::create_dir(&db).unwrap();
    let page = respawn(&mut h);
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    let r = page.get("/api/history");
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(
        h.log().contains("this run's history is not kept"),
        "{}",
        h.log()
    );
    let mut sse = page.sse("/events", &[("Last-Event-ID", &(last + 1000).to_string())]);
    let e = sse.next(T).expect("an event");
    assert_eq!(e.name.as_deref(), Some("reset"), "{e:?}");
    let mut said = false;
    for _ in 0..200 {
        let Some(e) = sse.next(T) else { break };
        assert!(e.id.unwrap() < last + 1000, "{e:?}");
        if e.data.contains("this run's turns are not kept") {
            said = true;
            break;
        }
    }
    assert!(said, "the page says the history is not kept");
}

#[test]
fn the_history_endpoints_want_the_token() {
    let (_b, _h, page) = started(&[]);
    for path in [
        "/api/history",
        "/api/history?q=x",
        "/api/history?turn=1",
        "/turn/1",
    ] {
        let none = call("GET", &page.url(path), &[], None);
        assert_eq!(none.status, 401, "{path}: {}", none.body);
        let wrong = call("GET", &page.url(path), &[("X-Hive-Token", "nope")], None);
        assert_eq!(wrong.status, 401, "{path}");
        assert!(!none.body.contains("turn_start"), "{path}: {}", none.body);
    }
}

#[test]
fn the_schema_goes_through_its_migration_list() {
    // A file of no version (an empty db) is built up by the steps.
    let dir = TempDir::new("hs");
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    rusqlite::Connection::open(state.join(history::FILE))
        .unwrap()
        .execute_batch("PRAGMA user_version = 0;")
        .unwrap();
    let opened = history::open::<Ev>(&state, Bounds::default()).unwrap();
    let mut tap = opened.tap;
    tap.offer(opened.next_id, Ev::Start("migrated".into()));
    opened.writer.finish(tap, opened.next_id);
    let db = rusqlite::Connection::open(state.join(history::FILE)).unwrap();
    let v: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v as u32, history::schema::STEPS.last().unwrap().version);
    let n: i64 = db
        .query_row("SELECT count(*) FROM turns", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
    drop(db);
    // A newer file is left alone: no history this run, the turns still run.
    let b = Broker::start(&["ana"]);
    let mut h = Harness::start(&b, "ana", &[]);
    h.fake.wait_count(1);
    wait_drained(&b, "ana");
    h.terminate();
    let file = h.state_dir().join(history::FILE);
    rusqlite::Connection::open(&file)
        .unwrap()
        .execute_batch("PRAGMA user_version = 99;")
        .unwrap();
    let page = respawn(&mut h);
    h.fake.wait_count(2);
    wait_drained(&b, "ana");
    operator_send(&b, "ana", "still runs");
    h.fake.wait_count(3);
    wait_drained(&b, "ana");
    assert!(
        h.log().contains("newer than this hive knows"),
        "{}",
        h.log()
    );
    let r = page.get("/api/history");
    assert_eq!(r.status, 503, "{}", r.body);
    let v: i64 = rusqlite::Connection::open(&file)
        .unwrap()
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(v, 99, "the newer file is not touched");
}

/// Events as a test writes them to the log in-process.
enum Ev {
    Start(String),
    Line(Value),
    End,
}

impl Loggable for Ev {
    fn view(&self) -> Option<View<'_>> {
        Some(match self {
            Ev::Start(body) => View::TurnStart {
                from: "operator",
                body,
                message_id: None,
            },
            Ev::Line(v) => View::Stream(v),
            Ev::End => View::TurnEnd {
                ok: true,
                outcome: "ok",
                note: "",
                duration_ms: 5,
                decision: Some("ack"),
            },
        })
    }

    fn to_json(&self) -> Value {
        match self {
            Ev::Start(body) => json!({"type": "turn_start", "from": "operator", "body": body}),
            Ev::Line(v) => json!({"type": "stream", "value": v}),
            Ev::End => json!({"type": "turn_end", "ok": true, "outcome": "ok"}),
        }
    }
}

/// Writes `n` turns of about `kb` KiB each through a tap, from id `next`;
/// returns the next free id.
fn write_turns(tap: &mut history::Tap<Ev>, mut next: u64, n: usize, kb: usize) -> u64 {
    for i in 0..n {
        tap.offer(next, Ev::Start(format!("turn {i}")));
        next += 1;
        let text = format!("word{i} {}", "x".repeat(kb * 1024));
        let line =
            json!({"type": "assistant", "message": {"content": [{"type": "text", "text": text}]}});
        tap.offer(next, Ev::Line(line));
        next += 1;
        tap.offer(next, Ev::End);
        next += 1;
    }
    next
}

#[test]
fn the_size_bound_drops_the_oldest_turns_and_keeps_the_newest() {
    let dir = TempDir::new("hsz");
    let bounds = Bounds {
        max_bytes: 512 * 1024,
        max_age: Duration::from_secs(90 * 86400),
    };
    let opened = history::open::<Ev>(dir.path(), bounds).unwrap();
    let mut tap = opened.tap;
    // About 2 MiB of turns (events and index): the writer prunes at start.
    let last = write_turns(&mut tap, opened.next_id, 150, 4);
    opened.writer.finish(tap, last - 1);
    let opened = history::open::<Ev>(dir.path(), bounds).unwrap();
    opened.writer.finish(opened.tap, opened.next_id - 1);
    let db = rusqlite::Connection::open(dir.path().join(history::FILE)).unwrap();
    let pragma = |p: &str| -> i64 {
        db.query_row(&format!("PRAGMA {p}"), [], |r| r.get(0))
            .unwrap()
    };
    let used = (pragma("page_count") - pragma("freelist_count")) * pragma("page_size");
    assert!(used <= bounds.max_bytes as i64, "{used} bytes in use");
    let reader = Reader::start(dir.path()).unwrap();
    let page = reader.before(None, 200).unwrap();
    let ids: Vec<i64> = page.turns.iter().map(|t| t.id).collect();
    assert!(!page.more, "nothing older is left");
    assert!(
        ids.len() >= 10 && ids.len() < 150,
        "{} turns kept",
        ids.len()
    );
    assert_eq!(*ids.last().unwrap(), 150, "the newest is kept");
    assert!(
        ids.windows(2).all(|w| w[1] == w[0] + 1),
        "the oldest went first: {ids:?}"
    );
    assert_eq!(
        reader.turn(1).unwrap_err(),
        ReadError::Missing {
            id: 1,
            pruned: true
        }
    );
    let kept = reader.search("word149", None, 5).unwrap();
    assert_eq!(kept.hits.len(), 1);
    assert!(reader.search("word0", None, 5).unwrap().hits.is_empty());
    // Every string over 16 KiB is cut with what was left off.
    let opened = history::open::<Ev>(dir.path(), bounds).unwrap();
    let mut tap = opened.tap;
    let next = write_turns(&mut tap, opened.next_id, 1, 40);
    opened.writer.finish(tap, next - 1);
    let t = reader.before(None, 1).unwrap().turns.pop().unwrap();
    let text = t.events[1]["value"]["message"]["content"][0]["text"]
        .as_str()
        .unwrap();
    assert!(text.len() < 17 * 1024, "{}", text.len());
    assert!(
        text.ends_with(" bytes]") && text.contains("…[cut, "),
        "{}",
        &text[text.len() - 40..]
    );
}

#[test]
fn the_age_bound_drops_turns_older_than_it() {
    let dir = TempDir::new("hage");
    let bounds = Bounds {
        max_bytes: 256 * 1024 * 1024,
        max_age: Duration::from_secs(2 * 86400),
    };
    let opened = history::open::<Ev>(dir.path(), bounds).unwrap();
    let mut tap = opened.tap;
    let last = write_turns(&mut tap, opened.next_id, 6, 1);
    opened.writer.finish(tap, last - 1);
    // The first three turns look three days old.
    let db = rusqlite::Connection::open(dir.path().join(history::FILE)).unwrap();
    let old = hyperhive::proto::now() - 3 * 86400;
    db.execute("UPDATE turns SET started_at = ?1 WHERE id <= 3", [old])
        .unwrap();
    drop(db);
    let opened = history::open::<Ev>(dir.path(), bounds).unwrap();
    opened.writer.finish(opened.tap, opened.next_id - 1);
    let reader = Reader::start(dir.path()).unwrap();
    let ids: Vec<i64> = reader
        .before(None, 50)
        .unwrap()
        .turns
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(ids, [4, 5, 6]);
}
