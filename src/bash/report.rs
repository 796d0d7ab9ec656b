//! What a task looks like from outside: the [`TaskView`] built from a record and
//! the ends of its output files, and the body of its completion wake. Reading the
//! files happens here, on the connection and wake threads, never on the
//! coordinator.

use super::proto::{TaskStatus, TaskView, TAIL_BYTES};
use super::store::{err_path, out_path, TaskRecord};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Lines of stdout a completion wake carries at most.
const WAKE_LINES: usize = 20;
/// Bytes of output a completion wake carries at most, per stream.
const WAKE_BYTES: u64 = 2000;

/// The last `max` bytes of the file at `path` as text, and the file's size. A
/// missing file reads as empty; a cut through a UTF-8 character is dropped.
pub fn tail(path: &Path, max: u64) -> (String, u64) {
    let Ok(mut f) = File::open(path) else {
        return (String::new(), 0);
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(max);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return (String::new(), len);
    }
    let mut buf = Vec::with_capacity(max.min(len) as usize);
    if f.take(max).read_to_end(&mut buf).is_err() {
        return (String::new(), len);
    }
    let skip = if start > 0 {
        buf.iter().take_while(|&&b| b & 0xC0 == 0x80).count()
    } else {
        0
    };
    (String::from_utf8_lossy(&buf[skip..]).into_owned(), len)
}

/// The view of `rec`, whose files live in `dir`.
pub fn view(rec: &TaskRecord, dir: &Path) -> TaskView {
    let (out, err) = (out_path(dir, &rec.id), err_path(dir, &rec.id));
    let (stdout_tail, stdout_bytes) = tail(&out, TAIL_BYTES);
    let (stderr_tail, stderr_bytes) = tail(&err, TAIL_BYTES);
    TaskView {
        id: rec.id.clone(),
        cmd: rec.cmd.clone(),
        status: rec.status,
        exit_code: rec.exit_code,
        signal: rec.signal,
        error: rec.error.clone(),
        timeout_secs: rec.timeout_secs,
        started_at: rec.started_at_ms / 1000,
        duration_secs: rec.duration_secs(),
        stdout_path: out.display().to_string(),
        stderr_path: err.display().to_string(),
        stdout_bytes,
        stderr_bytes,
        stdout_tail,
        stderr_tail,
    }
}

/// One line saying how the task ended, e.g. `done, exit code 0, after 1.2s`.
pub fn outcome_line(t: &TaskView) -> String {
    let mut s = t.status.as_str().to_string();
    if let Some(code) = t.exit_code {
        s.push_str(&format!(", exit code {code}"));
    }
    if let Some(sig) = t.signal {
        s.push_str(&format!(", killed by signal {sig}"));
    }
    match t.status {
        TaskStatus::TimedOut => {
            if let Some(limit) = t.timeout_secs {
                s.push_str(&format!(" (limit {limit}s; its process group was killed)"));
            }
        }
        TaskStatus::Interrupted => {
            s.push_str(" (the bash task daemon stopped or restarted and killed it)")
        }
        _ => {}
    }
    if let Some(e) = &t.error {
        s.push_str(&format!(": {e}"));
    }
    s.push_str(&format!(", after {:.1}s", t.duration_secs));
    s
}

fn last_lines(text: &str, n: usize) -> &str {
    let trimmed = text.trim_end_matches('\n');
    match trimmed.rmatch_indices('\n').nth(n.saturating_sub(1)) {
        Some((i, _)) => &trimmed[i + 1..],
        None => trimmed,
    }
}

/// The body of the completion wake of a finished task.
pub fn wake_body(rec: &TaskRecord, dir: &Path) -> String {
    let t = view(rec, dir);
    let mut body = format!(
        "bash task {} finished: {}\n$ {}\n",
        t.id,
        outcome_line(&t),
        t.cmd
    );
    let (out, _) = tail(Path::new(&t.stdout_path), WAKE_BYTES);
    let out = last_lines(&out, WAKE_LINES);
    if out.is_empty() {
        body.push_str("(no stdout)\n");
    } else {
        body.push_str(&format!(
            "--- last stdout lines (all {} bytes in {}) ---\n{out}\n",
            t.stdout_bytes, t.stdout_path
        ));
    }
    let failed = t.status != TaskStatus::Done || t.exit_code != Some(0);
    if failed && t.stderr_bytes > 0 {
        let (err, _) = tail(Path::new(&t.stderr_path), WAKE_BYTES);
        body.push_str(&format!(
            "--- last stderr lines (all {} bytes in {}) ---\n{}\n",
            t.stderr_bytes,
            t.stderr_path,
            last_lines(&err, WAKE_LINES / 2)
        ));
    }
    body.push_str(&format!(
        "Call mcp__bash__status with id \"{}\" for the last 4 KiB of both streams.",
        t.id
    ));
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_end_and_drops_a_cut_character() {
        let dir = std::env::temp_dir().join(format!("hive-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.out");
        std::fs::write(&p, "aé0123456789").unwrap();
        // 11 bytes from the end starts inside `é`, whose tail byte is dropped.
        assert_eq!(tail(&p, 11), ("0123456789".to_string(), 13));
        assert_eq!(tail(&p, 100).0, "aé0123456789");
        assert_eq!(tail(&dir.join("missing"), 10), (String::new(), 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn last_lines_counts_from_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines("a\nb", 5), "a\nb");
        assert_eq!(last_lines("", 3), "");
    }
}
