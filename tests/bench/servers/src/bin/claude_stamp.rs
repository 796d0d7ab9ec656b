//! The claude stand-in of the wake → spawn latency: it takes the time first
//! (wall clock, nanoseconds since the epoch, what the bench's `sent` is), then
//! appends it as a line to `stamps` in its own directory, reads its prompt to
//! the end and prints a `result` line, as the bench's shell stand-in does. The
//! shell script stamped with `date`, a second process started after `sh`
//! itself, so its stamp came 1.5–2.5 ms after the spawn on the project's VM;
//! this one stamps at its own start. `make bench` builds it; the bench copies
//! it into each broker's directory.
//!
//! The scale bench (`tests/bench/scale.rs`) runs it as every agent's claude
//! under `hive up`: it answers `--version` as the CLI does (`hive up` asks each
//! claude binary once), and given `$BENCH_HOLD` (a file named in an agent's
//! `env`) it holds its turn — alive, its pipes open — while the bench holds an
//! exclusive `flock` on that file.

use std::io::{Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("2.1.197 (Claude Code)");
        return;
    }
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    if let Some(dir) = std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.to_path_buf())) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("stamps"))
        {
            let _ = writeln!(f, "{started}");
        }
    }
    let mut prompt = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut prompt);
    if let Some(hold) = std::env::var_os("BENCH_HOLD") {
        // Blocks in the kernel (no polling: 200 held turns must not load the
        // host being measured) while the bench holds the file's lock.
        if let Ok(f) = std::fs::File::open(hold) {
            use std::os::fd::AsRawFd;
            // SAFETY: flock on a descriptor this process owns.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_SH) };
        }
    }
    println!(
        r#"{{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"s","total_cost_usd":0}}"#
    );
}
