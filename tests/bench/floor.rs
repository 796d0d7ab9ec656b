//! The floor of the burst row (issue 42): what one message to each of `n`
//! agents costs when nothing but the work a durable hive cannot skip is done,
//! measured beside hive's own burst and the plain loop in the same run. A
//! `store` thread owns the broker's own store (`hyperhive::broker::db`, the
//! durability `hive up` uses) and answers over channels, as the hub does but
//! without sockets, JSON or a harness process: the sender's `send` is a
//! committed row before its answer, each turn is handed out by a commit and
//! acked by a commit, and 8 turn workers (the plain loop's width) each run
//! the same `claude-stamp` with its prompt on stdin and read its output to
//! the end, as a harness does. What hive spends above this line is its
//! sockets, its JSON, its harness and bash-daemon processes and their
//! threads, its history and turn-stats stores; what this line spends above
//! the plain loop is the three commits per message.

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use hyperhive::broker::db::{Db, Durability, NewMessage};
use hyperhive::proto::{MsgKind, MsgState, Peer};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

enum Ask {
    /// Queue a message for `to`; answered with its id once committed.
    Send {
        to: String,
        body: String,
        done: Sender<i64>,
    },
    /// The next agent with mail, its row made inflight (or none: stop).
    Next { done: Sender<Option<(String, i64)>> },
    /// The turn of row `id` of `agent` is over.
    Ack { agent: String, id: i64 },
}

fn store(db: Db, asks: Receiver<Ask>, expected: usize) {
    let mut mail: VecDeque<String> = VecDeque::new();
    let mut waiting: VecDeque<Sender<Option<(String, i64)>>> = VecDeque::new();
    let (mut queued, mut acked) = (0usize, 0usize);
    let now = 1_800_000_000;
    for ask in asks {
        match ask {
            Ask::Send { to, body, done } => {
                let m = NewMessage {
                    from: &Peer::Operator,
                    to: &to,
                    body: &body,
                    kind: &MsgKind::Message,
                    in_reply_to: None,
                    receipt: false,
                    traceparent: None,
                };
                let id = db.insert_message(&m, now).expect("floor: insert");
                let _ = done.send(id);
                mail.push_back(to);
                queued += 1;
            }
            Ask::Next { done } => waiting.push_back(done),
            Ask::Ack { agent, id } => {
                db.transition(id, &agent, &MsgState::Inflight, &MsgState::Acked, now)
                    .expect("floor: ack");
                acked += 1;
            }
        }
        while !waiting.is_empty() && !mail.is_empty() {
            let agent = mail.pop_front().unwrap();
            let (taken, _) = db.take_next(&agent, true).expect("floor: take");
            let id = taken.expect("floor: a queued row").message.id;
            let _ = waiting.pop_front().unwrap().send(Some((agent, id)));
        }
        if queued == expected && acked == expected {
            for w in waiting.drain(..) {
                let _ = w.send(None);
            }
        }
    }
}

/// Seconds for `n` messages, one to each agent, each turned and acked.
pub fn burst_floor(claude_stamp: &Path, n: usize, dir: &Path) -> f64 {
    let bin = dir.join("floor/claude");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(claude_stamp, &bin).unwrap();
    let db = Db::open(&dir.join("floor/broker.db"), Durability::Normal).expect("floor: open");
    let (tx, rx) = unbounded();
    let start = Instant::now();
    let store_thread = std::thread::spawn(move || store(db, rx, n));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let tx = tx.clone();
            let bin = bin.clone();
            std::thread::spawn(move || loop {
                let (done, next) = bounded(1);
                if tx.send(Ask::Next { done }).is_err() {
                    return;
                }
                let Ok(Some((agent, id))) = next.recv() else {
                    return;
                };
                let mut c = Command::new(&bin)
                    .args(["--print", "--output-format", "stream-json"])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .expect("floor: spawn claude-stamp");
                let prompt = format!("You have 1 unread message from operator ({agent}).\n");
                let _ = c.stdin.take().unwrap().write_all(prompt.as_bytes());
                let mut out = Vec::new();
                let _ = c.stdout.take().unwrap().read_to_end(&mut out);
                let _ = c.wait();
                let _ = tx.send(Ask::Ack { agent, id });
            })
        })
        .collect();
    for i in 0..n {
        let (done, id) = bounded(1);
        tx.send(Ask::Send {
            to: super::scale::agent_name(i),
            body: format!("burst {i}"),
            done,
        })
        .expect("floor: the store thread");
        id.recv().expect("floor: the send's answer");
    }
    drop(tx);
    for w in workers {
        w.join().expect("floor: a turn worker");
    }
    let secs = start.elapsed().as_secs_f64();
    store_thread.join().expect("floor: the store thread");
    secs
}
