//! The claude stand-in of the wake → spawn latency: it takes the time first
//! (wall clock, nanoseconds since the epoch, what the bench's `sent` is), then
//! appends it as a line to `stamps` in its own directory, reads its prompt to
//! the end and prints a `result` line, as the bench's shell stand-in does. The
//! shell script stamped with `date`, a second process started after `sh`
//! itself, so its stamp came 1.5–2.5 ms after the spawn on the project's VM;
//! this one stamps at its own start. `make bench` builds it; the bench copies
//! it into each broker's directory.

use std::io::{Read, Write};
use std::time::{SystemTime, UNIX_EPOCH};

fn main() {
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
    println!(
        r#"{{"type":"result","subtype":"success","is_error":false,"result":"ok","session_id":"s","total_cost_usd":0}}"#
    );
}
