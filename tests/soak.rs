//! The crash-loop suite: messages flow continuously from four kinds of senders
//! (`hive wake` processes, the operator's `send` on the host socket, an agent's
//! `send` to a peer on its agent socket, and bash tasks whose completion wakes
//! the agent) while a driver SIGKILLs `hive broker` and the two `hive serve`
//! processes at random moments and restarts them. The fake claude is sometimes
//! slow, sometimes reports a big context (so the harness compacts), and appends
//! every prompt it is given to `delivered`, so kills land mid-turn,
//! mid-compaction, mid-ack and mid-bash-task.
//!
//! Every message whose sender got `ok:true` carries a unique token; afterwards
//! each accepted token must appear in some turn's prompt at least once. The test
//! asserts only lost = 0 and prints the summary (cycles, accepted, delivered,
//! duplicated, lost). `HIVE_SOAK_CYCLES` sets the number of kill cycles (default
//! 50, `make soak` runs 1000); `HIVE_SOAK_SEED` replays a run's kill schedule.
//! The broker prunes every acked message a second after it was handled
//! (`retention.messages_days` 0, `HIVE_PRUNE_SECS=1`), so pruning runs through
//! every kill.

mod common;

use common::hive::*;
use hyperhive::proto::cmd::Send as SendMsg;
use hyperhive::proto::Client;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// xorshift64*: small, seeded, replayable.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Every invocation appends its prompt to `delivered` first, then is slow one
/// time in four, and one time in five reports a context past the watermark so
/// the harness runs a checkpoint turn and `/compact` next.
const FAKE_STEP: &str = r#"
{ cat "$dir/inv-$FAKE_N.stdin"; printf '\n=== end of prompt ===\n'; } >> "$dir/delivered"
case "$(head -c 8 "$dir/inv-$FAKE_N.stdin")" in
  /compact*) sleep 0.$((RANDOM % 3)); compact_ok 30000 1000 ;;
esac
[ $((RANDOM % 4)) = 0 ] && sleep 0.$((RANDOM % 6 + 1))
ctx=1500
[ $((RANDOM % 5)) = 0 ] && ctx=30000
ok_turn done "$ctx"
"#;

/// Accepted tokens, shared by the sender threads.
#[derive(Default)]
struct Ledger {
    accepted: Mutex<Vec<String>>,
    refused: AtomicU64,
}

impl Ledger {
    fn accept(&self, token: String) {
        self.accepted.lock().unwrap().push(token);
    }
}

fn sender(
    name: &'static str,
    stop: Arc<AtomicBool>,
    ledger: Arc<Ledger>,
    mut send: impl FnMut(&str, u64) -> bool + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(format!("soak-{name}"))
        .spawn(move || {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let token = format!("tok-{name}-{n}-end");
                if send(&token, n) {
                    ledger.accept(token);
                } else {
                    ledger.refused.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(60 + n % 80));
            }
        })
        .unwrap()
}

/// A wire call on a cached connection; any failure drops the connection and
/// counts as not accepted (the sender did not get `ok:true`).
fn call_on(slot: &mut Option<Client>, path: &Path, req: &SendMsg) -> bool {
    if slot.is_none() {
        *slot = Client::connect(path).ok();
        if let Some(c) = slot.as_ref() {
            let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
        }
    }
    let Some(c) = slot.as_mut() else {
        return false;
    };
    match c.call(req) {
        Ok(_) => true,
        Err(hyperhive::proto::ClientError::Refused(_)) => false,
        Err(_) => {
            *slot = None;
            false
        }
    }
}

/// In how many prompts the fake claudes were given each token appears (a bash
/// wake repeats the command and its output, so a token counts once per prompt).
fn delivered_counts(files: &[PathBuf]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for f in files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for prompt in text.split("\n=== end of prompt ===\n") {
            let mut seen = std::collections::HashSet::new();
            for (i, _) in prompt.match_indices("tok-") {
                let rest = &prompt[i..];
                if let Some(end) = rest.find("-end") {
                    let tok = &rest[..end + 4];
                    if !tok.contains(char::is_whitespace) && seen.insert(tok) {
                        *counts.entry(tok.to_string()).or_insert(0) += 1;
                    }
                }
            }
        }
    }
    counts
}

fn env_u64(key: &str) -> Option<u64> {
    std::env::var(key).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn crash_loop_loses_no_accepted_message() {
    let cycles = env_u64("HIVE_SOAK_CYCLES").unwrap_or(50);
    let seed = env_u64("HIVE_SOAK_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1
    });
    eprintln!("soak: {cycles} kill cycles, replay with HIVE_SOAK_SEED={seed}");
    let mut rng = Rng(seed.max(1));

    // Pruning runs all the time: every acked message goes at the pass after
    // it was handled, a pass a second, while the kills land.
    let mut broker = Broker::start_process(
        &[],
        Some(r#"{"agents":[{"name":"ana"},{"name":"bob"}],"retention":{"messages_days":0}}"#),
        Process {
            env: vec![("HIVE_PRUNE_SECS".into(), "1".into())],
            ..Process::default()
        },
    );
    let env = [
        ("HIVE_COMPACT_WATERMARK_TOKENS", "20000"),
        ("HIVE_RECONNECT_MAX_MS", "200"),
    ];
    let mut harnesses = vec![
        Harness::start(&broker, "ana", &env),
        Harness::start(&broker, "bob", &env),
    ];
    for h in &harnesses {
        h.fake.default_step(FAKE_STEP);
    }
    let delivered: Vec<PathBuf> = harnesses
        .iter()
        .map(|h| h.fake.dir.join("delivered"))
        .collect();
    for h in &harnesses {
        h.fake.wait_count(1);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Ledger::default());
    let sockets = [broker.agent_socket("ana"), broker.agent_socket("bob")];
    let host = broker.host_socket();
    let bash_socket = harnesses[0].dir.path().join("bash.sock");
    let mut threads = Vec::new();

    // `hive wake` processes into ana's or bob's inbox; exit 0 means ok:true.
    let socks = sockets.clone();
    threads.push(sender(
        "wake",
        stop.clone(),
        ledger.clone(),
        move |tok, n| {
            let sock = socks[(n % 2) as usize].display().to_string();
            let (code, _, _) = run_hive(
                &["wake", "--from", "cron", "--body", tok, "--socket", &sock],
                None,
                &[],
            );
            code == 0
        },
    ));
    // The operator's `send` on the host socket.
    let mut slot = None;
    threads.push(sender("op", stop.clone(), ledger.clone(), move |tok, n| {
        let to = if n % 2 == 0 { "ana" } else { "bob" };
        let req = SendMsg {
            to: to.into(),
            body: tok.into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        };
        call_on(&mut slot, &host, &req)
    }));
    // ana's `send` to bob, on ana's agent socket (what `hive mcp` forwards).
    let mut slot = None;
    let ana = sockets[0].clone();
    threads.push(sender(
        "peer",
        stop.clone(),
        ledger.clone(),
        move |tok, _| {
            let req = SendMsg {
                to: "bob".into(),
                body: tok.into(),
                in_reply_to: None,
                receipt: false,
                traceparent: None,
            };
            call_on(&mut slot, &ana, &req)
        },
    ));
    // Bash tasks in ana's harness: the token is in the command, which the
    // completion wake repeats, so it is there even for an interrupted task.
    threads.push(sender(
        "bash",
        stop.clone(),
        ledger.clone(),
        move |tok, _| {
            let req = hyperhive::bash::proto::Request::Run {
                cmd: format!("echo {tok}; sleep 0.3"),
                timeout_secs: Some(20),
                wait_seconds: Some(0),
            };
            hyperhive::bash::client::call::<serde_json::Value>(
                &bash_socket,
                &req,
                &crossbeam_channel::never(),
            )
            .is_ok()
        },
    ));

    let started = Instant::now();
    let mut kills = [0u32; 3];
    for _ in 0..cycles {
        let victim = rng.below(3) as usize;
        // One time in three, wait for a turn to start on the victim's side, so
        // the kill lands mid-turn; otherwise at a random moment.
        if victim > 0 && rng.below(3) == 0 {
            let f = &delivered[victim - 1];
            let before = std::fs::metadata(f).map(|m| m.len()).unwrap_or(0);
            let end = Instant::now() + Duration::from_secs(1);
            while Instant::now() < end
                && std::fs::metadata(f).map(|m| m.len()).unwrap_or(0) == before
            {
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(rng.below(120)));
        } else {
            std::thread::sleep(Duration::from_millis(20 + rng.below(250)));
        }
        kills[victim] += 1;
        if victim == 0 {
            broker.kill9();
            std::thread::sleep(Duration::from_millis(rng.below(150)));
            broker.restart();
        } else {
            let h = &mut harnesses[victim - 1];
            h.kill9();
            std::thread::sleep(Duration::from_millis(rng.below(150)));
            h.spawn();
        }
    }
    let kill_phase = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let accepted = ledger.accepted.lock().unwrap().clone();

    // Let the hive drain: every accepted token should reach a prompt. Give up
    // only when nothing new has arrived for 60 s.
    let mut counts;
    let mut last_missing = usize::MAX;
    let mut progress_at = Instant::now();
    loop {
        counts = delivered_counts(&delivered);
        let missing = accepted.iter().filter(|t| !counts.contains_key(*t)).count();
        if missing < last_missing {
            last_missing = missing;
            progress_at = Instant::now();
        }
        if missing == 0 || progress_at.elapsed() > Duration::from_secs(60) {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let lost: Vec<&String> = accepted
        .iter()
        .filter(|t| !counts.contains_key(*t))
        .collect();
    let duplicated = accepted
        .iter()
        .filter(|t| counts.get(*t).copied().unwrap_or(0) > 1)
        .count();
    let compactions: usize = delivered
        .iter()
        .map(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .split("\n=== end of prompt ===\n")
                .filter(|p| p.starts_with("/compact"))
                .count()
        })
        .sum();
    let kinds = ["wake", "op", "peer", "bash"];
    let per_kind = |pred: &dyn Fn(&String) -> bool| -> String {
        kinds
            .iter()
            .map(|k| {
                let p = format!("tok-{k}-");
                let n = accepted
                    .iter()
                    .filter(|t| t.starts_with(&p) && pred(t))
                    .count();
                format!("{k} {n}")
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    // What the prune passes deleted, by the broker's log (all its starts).
    let pruned: u64 = broker
        .log()
        .lines()
        .filter(|l| l.contains(" acked messages ("))
        .filter_map(|l| {
            l.split("pruned ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    eprintln!(
        "soak summary (seed {seed}, kill phase {:.1}s, total {:.1}s)\n\
         | cycles | broker kills | harness kills | accepted | delivered | duplicated | lost | not accepted |\n\
         |---|---|---|---|---|---|---|---|\n\
         | {cycles} | {} | {} | {} | {} | {duplicated} | {} | {} |\n\
         accepted by sender: {}\n\
         duplicated by sender: {}\n\
         lost by sender: {}\n\
         /compact runs started: {compactions}\n\
         acked messages pruned meanwhile: {pruned}",
        kill_phase.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        kills[0],
        kills[1] + kills[2],
        accepted.len(),
        accepted.len() - lost.len(),
        lost.len(),
        ledger.refused.load(Ordering::Relaxed),
        per_kind(&|_| true),
        per_kind(&|t| counts.get(t).copied().unwrap_or(0) > 1),
        per_kind(&|t| !counts.contains_key(t)),
    );
    assert!(
        lost.is_empty(),
        "lost {} accepted messages (replay with HIVE_SOAK_SEED={seed}): {:?}\nbroker log tail: {}",
        lost.len(),
        &lost[..lost.len().min(20)],
        tail(&broker.log(), 3000)
    );
    assert!(pruned > 0, "pruning ran while the kills landed");
}

fn tail(s: &str, n: usize) -> &str {
    let mut start = s.len().saturating_sub(n);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}
