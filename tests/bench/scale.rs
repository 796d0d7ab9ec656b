//! The scale rows of `make bench` (issue 42): one `hive up` of `--agents N`
//! agents (1000 by default), every agent's claude the static `claude-stamp`
//! stand-in, measured in the user's terms — how long until every agent runs,
//! what an idle agent costs in memory, processes, threads and CPU, how fast a
//! burst of one message per agent turns into acked turns, and whether a wake
//! still reaches claude quickly while 200 other agents sit inside a turn.
//!
//! Baselines run in the same run: the burst against the same number of
//! `claude-stamp` runs spawned 8 at a time by a plain loop, the held-turns p99
//! against the p99 of the same wakes on the idle hive. The absolute rows
//! (time, memory, processes, threads, CPU) are against the goals.
//! Everything is read from `/proc`: the hive is `hive up` and every process
//! under it.

use hyperhive::proto::cmd::{Agents, Send};
use hyperhive::proto::Client;
use std::collections::HashSet;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Agents whose turns are held during the held-turns latency row.
const HELD: usize = 200;
/// Wake → spawn samples per latency row.
const SAMPLES: usize = 200;

pub struct ScaleArgs<'a> {
    pub hive: &'a Path,
    pub claude_stamp: &'a Path,
    pub agents: usize,
    pub idle_secs: u64,
}

/// What the scale rows measured, for the goals at the end of the run.
pub struct ScaleFigures {
    pub agents: usize,
    pub isolated: bool,
    pub start_secs: f64,
    pub pss_mib_per_agent: f64,
    pub avail_mib_per_agent: f64,
    pub procs_per_agent: f64,
    pub threads_per_agent: f64,
    pub idle_cpu_percent: f64,
    pub burst_ratio: f64,
    /// The burst's floor prototype against the same baseline (`floor.rs`).
    pub floor_ratio: f64,
    pub held_p99_ratio: f64,
}

struct Hive {
    child: Child,
    dir: PathBuf,
}

impl Hive {
    fn host(&self) -> PathBuf {
        self.dir.join("d/run/host.sock")
    }

    fn stamps(&self) -> PathBuf {
        self.dir.join("claude/stamps")
    }
}

impl Drop for Hive {
    fn drop(&mut self) {
        // SIGTERM: hive up stops every agent and waits; a minute, then SIGKILL.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn agent_name(i: usize) -> String {
    format!("a{i:04}")
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// `pid` and every process below it (children read from `/proc/*/stat`).
fn tree(root: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(ppid) = stat_fields(pid).and_then(|f| f.get(1).and_then(|p| p.parse().ok()))
            {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut out = vec![root];
    let mut seen: HashSet<u32> = HashSet::from([root]);
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        for &(c, pp) in &parent_of {
            if pp == p && seen.insert(c) {
                out.push(c);
            }
        }
        i += 1;
    }
    out
}

/// The fields of `/proc/PID/stat` after the command: state first (field 3).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &s[s.rfind(')')? + 2..];
    Some(after.split_whitespace().map(str::to_string).collect())
}

/// utime + stime of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    stat_fields(pid)
        .map(|f| {
            let get = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            // Fields 14 and 15 of stat; `f` starts at field 3.
            get(11) + get(12)
        })
        .unwrap_or(0)
}

fn pss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

fn comm(pid: u32) -> String {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut words = cmd
        .split(|&b| b == 0)
        .map(|w| String::from_utf8_lossy(w).to_string());
    let prog = words.next().unwrap_or_default();
    let sub = words.next().unwrap_or_default();
    if prog.ends_with("hive") {
        format!("hive {sub}")
    } else {
        prog.rsplit('/').next().unwrap_or("").to_string()
    }
}

fn line_count(p: &Path) -> usize {
    std::fs::read(p).map_or(0, |b| b.iter().filter(|&&c| c == b'\n').count())
}

/// The last stamp in `p` (nanoseconds since the epoch).
fn last_stamp(p: &Path) -> Option<u128> {
    let s = std::fs::read_to_string(p).ok()?;
    s.lines().last()?.trim().parse().ok()
}

fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < end, "scale: {what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every agent idle: running, nothing inflight or unread, and at least
/// `turns` turns over the hive.
fn all_idle(host: &mut Client, agents: usize, turns: u64) -> bool {
    let Ok(r) = host.call(&Agents {}) else {
        return false;
    };
    let rows = &r.agents;
    rows.len() + r.left_off as usize >= agents
        && r.left_off == 0
        && rows
            .iter()
            .all(|a| a.running && a.inflight.is_none() && a.unread == 0)
        && rows.iter().map(|a| a.turns).sum::<u64>() >= turns
}

fn start(a: &ScaleArgs) -> Hive {
    let dir = PathBuf::from(format!("/tmp/hv-scale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("claude")).unwrap();
    std::fs::create_dir_all(dir.join("fleet")).unwrap();
    let claude = dir.join("claude/claude");
    std::fs::copy(a.claude_stamp, &claude).expect("copy claude-stamp");
    std::fs::write(dir.join("hold"), b"").unwrap();
    let agents: Vec<serde_json::Value> = (0..a.agents)
        .map(|i| {
            if i < HELD.min(a.agents / 2) {
                serde_json::json!({"name": agent_name(i),
                    "env": {"BENCH_HOLD": dir.join("hold").display().to_string()}})
            } else {
                serde_json::json!({"name": agent_name(i)})
            }
        })
        .collect();
    // Every agent may be inside a turn at once (the held row holds 200): the
    // stand-in is a small static binary, not the CLI's ~300 MB that
    // `max_claude`'s default is sized for.
    let fleet = serde_json::json!({
        "hive_name": "scale",
        "web": {"listen": "127.0.0.1:0"},
        "max_claude": a.agents,
        "agents": agents,
    });
    std::fs::write(dir.join("fleet/hive.json"), fleet.to_string()).unwrap();
    let child = Command::new(a.hive)
        .arg("up")
        .arg("--config")
        .arg(dir.join("fleet/hive.json"))
        .arg("--data")
        .arg(dir.join("d"))
        .env("ANTHROPIC_API_KEY", "sk-bench")
        .env("HIVE_CLAUDE_BIN", &claude)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("up.out")).unwrap())
        .stderr(std::fs::File::create(dir.join("up.log")).unwrap())
        .spawn()
        .expect("start hive up");
    Hive { child, dir }
}

fn host_client(h: &Hive) -> Client {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(c) = Client::connect(&h.host()) {
            return c;
        }
        assert!(
            Instant::now() < end,
            "scale: hive up's operator socket did not open"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The hive's processes, threads and PSS, with a breakdown by program.
fn census(root: u32, agents: usize) -> (f64, f64, f64) {
    let pids = tree(root);
    let (mut nt, mut pss) = (0usize, 0u64);
    let mut by: std::collections::BTreeMap<String, (usize, usize, u64)> = Default::default();
    for &p in &pids {
        let (t, k) = (threads(p), pss_kib(p));
        nt += t;
        pss += k;
        let e = by.entry(comm(p)).or_default();
        e.0 += 1;
        e.1 += t;
        e.2 += k;
    }
    let n = agents as f64;
    // Processes per agent: the agents' own, `hive up` itself aside (one per
    // hive); threads and memory: every process, `hive up` included.
    let per_agent = pids.len().saturating_sub(1) as f64 / n;
    println!(
        "scale   census: {} processes (hive up + {per_agent:.2}/agent), {nt} threads ({:.2}/agent), PSS {:.1} MiB ({:.2} MiB/agent)",
        pids.len(),
        nt as f64 / n,
        pss as f64 / 1024.0,
        pss as f64 / 1024.0 / n
    );
    for (prog, (np, t, k)) in &by {
        println!(
            "scale     {prog:<22} {np:>5} processes, {:>6.1} threads each, {:>7.2} MiB PSS each",
            *t as f64 / *np as f64,
            *k as f64 / 1024.0 / *np as f64
        );
    }
    (per_agent, nt as f64 / n, pss as f64 / 1024.0 / n)
}

/// Wake → claude spawned, `SAMPLES` times, one at a time, round robin over
/// `targets`; milliseconds, sorted.
fn wake_latencies(h: &Hive, host: &mut Client, targets: &[String]) -> Vec<f64> {
    let stamps = h.stamps();
    let mut lat = Vec::with_capacity(SAMPLES);
    for k in 0..SAMPLES {
        let to = &targets[k % targets.len()];
        let before = line_count(&stamps);
        let sent = now_ns();
        host.call(&Send {
            to: to.clone(),
            body: format!("wake {k}"),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .expect("send");
        wait_until("a wake's claude to start", Duration::from_secs(60), || {
            line_count(&stamps) > before
        });
        let at = last_stamp(&stamps).unwrap_or(sent);
        lat.push(at.saturating_sub(sent) as f64 / 1e6);
        // Let the turn end before the next wake of the same set.
        std::thread::sleep(Duration::from_millis(5));
    }
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    lat
}

fn p99(sorted: &[f64]) -> f64 {
    sorted
        .get((sorted.len() * 99 / 100).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0.0)
}

/// The same `n` claude-stamp runs, 8 at a time, from a plain loop: seconds.
fn spawn_baseline(claude_stamp: &Path, n: usize, dir: &Path) -> f64 {
    let bin = dir.join("baseline/claude");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(claude_stamp, &bin).unwrap();
    let prompt = b"You have 1 unread message; read it with recv and act on it.\n".repeat(4);
    let start = Instant::now();
    let mut running: Vec<Child> = Vec::new();
    for _ in 0..n {
        if running.len() == 8 {
            let mut c = running.remove(0);
            let _ = c.wait();
        }
        let mut c = Command::new(&bin)
            .args(["--print", "--output-format", "stream-json"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn claude-stamp");
        let _ = c.stdin.take().unwrap().write_all(&prompt);
        running.push(c);
    }
    for mut c in running {
        let _ = c.wait();
    }
    start.elapsed().as_secs_f64()
}

pub fn bench_scale(a: &ScaleArgs) -> ScaleFigures {
    let n = a.agents;
    let pid_max = read_u64("/proc/sys/kernel/pid_max").unwrap_or(0);
    println!(
        "scale   hive up with {n} agents (claude: claude-stamp); pid_max {pid_max}, MemAvailable {:.1} GiB, {} CPUs",
        mem_available_kib() as f64 / 1048576.0,
        std::thread::available_parallelism().map_or(0, |c| c.get())
    );
    let avail_before = mem_available_kib();
    let started = Instant::now();
    let h = start(a);
    let mut host = host_client(&h);
    wait_until(
        "every agent running and idle after its boot turn",
        Duration::from_secs(900),
        || line_count(&h.stamps()) >= n && all_idle(&mut host, n, n as u64),
    );
    let start_secs = started.elapsed().as_secs_f64();
    let log = std::fs::read_to_string(h.dir.join("up.log")).unwrap_or_default()
        + &std::fs::read_to_string(h.dir.join("up.out")).unwrap_or_default();
    let isolated = log.contains("agents are isolated");
    println!(
        "scale   every agent running, boot turn done: {start_secs:.1} s ({})",
        if isolated {
            "isolated: mount and PID namespaces"
        } else {
            "not isolated"
        }
    );
    // Settle: late allocations, the first idle ticks.
    std::thread::sleep(Duration::from_secs(10));
    let root = h.child.id();
    let (procs, thr, pss) = census(root, n);
    let avail_mib = avail_before.saturating_sub(mem_available_kib()) as f64 / 1024.0 / n as f64;
    println!(
        "scale   MemAvailable dropped {:.1} MiB per 100 agents ({avail_mib:.2} MiB/agent, kernel included)",
        avail_mib * 100.0
    );

    // Idle CPU of the whole tree.
    let pids = tree(root);
    let t0: u64 = pids.iter().map(|&p| cpu_ticks(p)).sum();
    let w0 = Instant::now();
    std::thread::sleep(Duration::from_secs(a.idle_secs));
    let t1: u64 = tree(root).iter().map(|&p| cpu_ticks(p)).sum();
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let idle_cpu = (t1.saturating_sub(t0)) as f64 / hz / w0.elapsed().as_secs_f64() * 100.0;
    println!(
        "scale   idle CPU of the whole hive over {} s: {idle_cpu:.2} % of one core",
        a.idle_secs
    );

    // Wake → spawn on the idle hive, then with HELD turns held.
    let held = HELD.min(n / 2);
    let free: Vec<String> = (held..n).map(agent_name).collect();
    let idle_lat = wake_latencies(&h, &mut host, &free);
    wait_until("the sample turns to end", Duration::from_secs(120), || {
        all_idle(&mut host, n, n as u64 + SAMPLES as u64)
    });
    let hold = std::fs::File::open(h.dir.join("hold")).unwrap();
    // SAFETY: flock on a descriptor this process owns.
    unsafe { libc::flock(hold.as_raw_fd(), libc::LOCK_EX) };
    let before = line_count(&h.stamps());
    for i in 0..held {
        host.call(&Send {
            to: agent_name(i),
            body: "held".into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .expect("send");
    }
    wait_until(
        "the held turns' claude to start",
        Duration::from_secs(300),
        || line_count(&h.stamps()) >= before + held,
    );
    let held_lat = wake_latencies(&h, &mut host, &free);
    unsafe { libc::flock(hold.as_raw_fd(), libc::LOCK_UN) };
    drop(hold);
    let turns_so_far = n as u64 + 2 * SAMPLES as u64 + held as u64;
    wait_until("the held turns to end", Duration::from_secs(300), || {
        all_idle(&mut host, n, turns_so_far)
    });
    let (ip99, hp99) = (p99(&idle_lat), p99(&held_lat));
    println!(
        "scale   wake → claude spawned: idle hive median {:.2} ms p99 {ip99:.2} ms; with {held} turns held median {:.2} ms p99 {hp99:.2} ms = {:.2}x",
        idle_lat[idle_lat.len() / 2],
        held_lat[held_lat.len() / 2],
        hp99 / ip99
    );

    // A burst: one message to every agent, until every turn is acked.
    let t = Instant::now();
    for i in 0..n {
        host.call(&Send {
            to: agent_name(i),
            body: format!("burst {i}"),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        })
        .expect("send");
    }
    let sent = t.elapsed().as_secs_f64();
    wait_until(
        "the burst's turns to be acked",
        Duration::from_secs(900),
        || all_idle(&mut host, n, turns_so_far + n as u64),
    );
    let burst = t.elapsed().as_secs_f64();
    let base = spawn_baseline(a.claude_stamp, n, &h.dir);
    println!(
        "scale   one message to each of {n} agents, all acked: {burst:.2} s (sending {sent:.2} s) vs the same {n} claude runs 8 at a time {base:.2} s = {:.2}x",
        burst / base
    );
    let floor = super::floor::burst_floor(a.claude_stamp, n, &h.dir);
    println!(
        "scale   the burst's floor (the broker's store and the claude runs alone, tests/bench/floor.rs): {floor:.2} s = {:.2}x the runs 8 at a time; hive {:.2}x the floor",
        floor / base,
        burst / floor
    );
    drop(host);
    drop(h);
    ScaleFigures {
        agents: n,
        isolated,
        start_secs,
        pss_mib_per_agent: pss,
        avail_mib_per_agent: avail_mib,
        procs_per_agent: procs,
        threads_per_agent: thr,
        idle_cpu_percent: idle_cpu,
        burst_ratio: burst / base,
        floor_ratio: floor / base,
        held_p99_ratio: hp99 / ip99,
    }
}
