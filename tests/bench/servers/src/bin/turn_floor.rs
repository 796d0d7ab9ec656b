//! The floor of a harness turn: a static std-only loop that does per turn only
//! what the broker's guarantees require of any harness — `recv_next` (the
//! message is inflight, durably, before it is handed out), spawn claude with
//! the message on its stdin, read its stdout to the end, reap it, `ack_turn`
//! (the ack is durable before it is answered) — on one connection, with no
//! session flags, stream parsing, turn log, stats row, spend row or web page.
//! `make bench` runs it against the same broker and the same fake claude as
//! `hive serve`, so what `hive serve` costs over it is the harness's own work.
//! Usage: `turn-floor SOCKET CLAUDE`; it runs until it is killed.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::{Command, ExitCode, Stdio};

/// The inflight message's id in a `recv_next` answer, or None when the answer
/// handed out nothing (`"message":null`).
fn message_id(answer: &str) -> Option<u64> {
    let at = answer.find("\"message\":{")?;
    let rest = &answer[at..];
    let id = &rest[rest.find("\"id\":")? + 5..];
    let end = id.find(|c: char| !c.is_ascii_digit()).unwrap_or(id.len());
    id[..end].parse().ok()
}

fn run(socket: &str, claude: &str) -> std::io::Result<()> {
    let stream = UnixStream::connect(socket)?;
    let mut out = stream.try_clone()?;
    let mut answers = BufReader::new(stream);
    let mut answer = String::new();
    let mut exchange = |line: &str, answer: &mut String| -> std::io::Result<()> {
        out.write_all(line.as_bytes())?;
        answer.clear();
        if answers.read_line(answer)? == 0 {
            return Err(std::io::Error::other("the broker hung up"));
        }
        Ok(())
    };
    let mut output = Vec::with_capacity(64 * 1024);
    loop {
        exchange("{\"cmd\":\"recv_next\",\"wait_seconds\":30}\n", &mut answer)?;
        if !answer.starts_with("{\"ok\":true") {
            return Err(std::io::Error::other(format!(
                "recv_next refused: {}",
                answer.trim_end()
            )));
        }
        let Some(id) = message_id(&answer) else {
            continue;
        };
        let mut child = Command::new(claude)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        // The prompt: the answer's line as it came (its size is the message's).
        child
            .stdin
            .take()
            .expect("piped")
            .write_all(answer.as_bytes())?;
        output.clear();
        child
            .stdout
            .take()
            .expect("piped")
            .read_to_end(&mut output)?;
        child.wait()?;
        exchange(
            &format!("{{\"cmd\":\"ack_turn\",\"id\":{id}}}\n"),
            &mut answer,
        )?;
        if !answer.starts_with("{\"ok\":true") {
            return Err(std::io::Error::other(format!(
                "ack_turn refused: {}",
                answer.trim_end()
            )));
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, claude] = args.as_slice() else {
        eprintln!("usage: turn-floor SOCKET CLAUDE");
        return ExitCode::from(2);
    };
    match run(socket, claude) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("turn-floor: {e}");
            ExitCode::FAILURE
        }
    }
}
