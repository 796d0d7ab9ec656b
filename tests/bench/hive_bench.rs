//! `make bench`: hive's timings, each printed as a ratio against a baseline that
//! runs side by side in the same process run (the machine is shared and noisy, so
//! only ratios are comparable between runs). Figures go to docs/performance.md.
//!
//! Arguments: `--hive PATH` (the binary to measure, the musl build under `make
//! bench`), `--empty PATH` (a binary that only exits), `--quick` (fewer rounds).

use hyperhive::wire::{Client, Request};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Args {
    hive: PathBuf,
    empty: PathBuf,
    quick: bool,
}

fn parse_args() -> Args {
    let mut a = Args {
        hive: PathBuf::from("target/release/hive"),
        empty: PathBuf::from("target/release/examples/empty"),
        quick: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--hive" => a.hive = it.next().expect("--hive PATH").into(),
            "--empty" => a.empty = it.next().expect("--empty PATH").into(),
            "--quick" => a.quick = true,
            // cargo bench passes --bench; ignore what is not ours.
            _ => {}
        }
    }
    for p in [&a.hive, &a.empty] {
        assert!(p.exists(), "{} is missing: run `make bench`", p.display());
    }
    a
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn time_run(cmd: &mut Command) -> f64 {
    let start = Instant::now();
    let st = cmd.status().expect("run benchmark command");
    assert!(st.success(), "{cmd:?} failed: {st}");
    start.elapsed().as_secs_f64() * 1e3
}

struct BrokerProc {
    child: Child,
    dir: PathBuf,
}

impl BrokerProc {
    fn start(hive: &Path, durability: &str) -> BrokerProc {
        let dir = PathBuf::from(format!("/tmp/hv-bench-{}-{durability}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new(hive)
            .args(["broker", "--agents", "bench", "--durability", durability])
            .arg("--state-dir")
            .arg(dir.join("s"))
            .arg("--run-dir")
            .arg(dir.join("r"))
            .env("RUST_LOG", "warn")
            .stderr(Stdio::null())
            .spawn()
            .expect("start broker");
        let b = BrokerProc { child, dir };
        let end = Instant::now() + Duration::from_secs(10);
        while Client::connect(&b.socket()).is_err() {
            assert!(Instant::now() < end, "broker did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        b
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("r/agents/bench/mcp.sock")
    }
}

impl Drop for BrokerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// (a) `hive wake` whole-process time vs a binary that only exits.
fn bench_wake(a: &Args) {
    let b = BrokerProc::start(&a.hive, "normal");
    let rounds = if a.quick { 40 } else { 300 };
    let (mut wake, mut empty) = (Vec::new(), Vec::new());
    let mut drain = Client::connect(&b.socket()).unwrap();
    for i in 0..rounds {
        empty.push(time_run(&mut Command::new(&a.empty)));
        wake.push(time_run(
            Command::new(&a.hive)
                .args(["wake", "--from", "bench", "--body", &format!("m{i}")])
                .arg("--socket")
                .arg(b.socket())
                .env("RUST_LOG", "warn"),
        ));
        // Keep the inbox short so every wake does the same work.
        let _ = drain.call(&Request::Recv {
            wait_seconds: None,
            max: Some(32),
        });
    }
    let (w, e) = (median(&mut wake), median(&mut empty));
    println!(
        "wake    hive wake median {w:.3} ms | empty binary median {e:.3} ms | ratio {:.2}x (goal <= 2.5x)",
        w / e
    );
}

/// (b) send → recv_next → ack_turn cycles per second over one connection vs a
/// bare rusqlite insert + two updates with the same pragmas.
fn bench_cycles(a: &Args, durability: &str) {
    let n = if a.quick { 300 } else { 3000 };
    let b = BrokerProc::start(&a.hive, durability);
    let mut c = Client::connect(&b.socket()).unwrap();
    let start = Instant::now();
    for i in 0..n {
        c.call(&Request::Wake {
            from: "bench".into(),
            body: format!("cycle {i}"),
            transient: false,
            to: None,
        })
        .unwrap();
        let m = c
            .call(&Request::RecvNext {
                wait_seconds: Some(0),
            })
            .unwrap();
        let id = m["message"]["id"].as_i64().unwrap();
        c.call(&Request::AckTurn { id }).unwrap();
    }
    let hive_rate = n as f64 / start.elapsed().as_secs_f64();
    drop(b);

    let path = PathBuf::from(format!("/tmp/hv-bench-bare-{}.db", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let db = rusqlite::Connection::open(&path).unwrap();
    let sync = if durability == "full" {
        "FULL"
    } else {
        "NORMAL"
    };
    db.execute_batch(&format!(
        "PRAGMA journal_mode=WAL; PRAGMA synchronous={sync};
         CREATE TABLE m (id INTEGER PRIMARY KEY AUTOINCREMENT, sender TEXT, recipient TEXT,
           body TEXT, state TEXT, sent_at INTEGER, done_at INTEGER);
         CREATE INDEX mi ON m (recipient, state, id);"
    ))
    .unwrap();
    let start = Instant::now();
    for i in 0..n {
        db.execute(
            "INSERT INTO m (sender, recipient, body, state, sent_at) VALUES ('bench','bench',?1,'queued',1)",
            [format!("cycle {i}")],
        )
        .unwrap();
        let id = db.last_insert_rowid();
        db.execute("UPDATE m SET state='inflight' WHERE id=?1", [id])
            .unwrap();
        db.execute("UPDATE m SET state='acked', done_at=2 WHERE id=?1", [id])
            .unwrap();
    }
    let bare_rate = n as f64 / start.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    println!(
        "cycles  [{durability}] hive {hive_rate:.0}/s | bare sqlite {bare_rate:.0}/s | ratio {:.0}% of bare (goal >= 50%)",
        100.0 * hive_rate / bare_rate
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` (make test) runs
    // this binary without it, and the benchmark is not a test.
    if !std::env::args().any(|a| a == "--bench") {
        println!("hive bench: not run under cargo test; use `make bench`");
        return;
    }
    let a = parse_args();
    println!(
        "hive bench — {} vs baselines, ratios are what to compare",
        a.hive.display()
    );
    bench_wake(&a);
    bench_cycles(&a, "normal");
    bench_cycles(&a, "full");
}
