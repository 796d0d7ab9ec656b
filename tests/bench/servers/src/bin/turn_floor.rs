//! The floor of a harness turn: a static std-only loop that does per turn only
//! what the broker's guarantees require of any harness — `recv_next` (the
//! message is inflight, durably, before it is handed out), spawn claude with
//! the message on its stdin, read its stdout to the end, reap it, `ack_turn`
//! (the ack is durable before it is answered) — on one connection, with no
//! session flags, stream parsing, turn log, stats row, spend row or web page.
//! `make bench` runs it against the same broker and the same fake claude as
//! `hive serve`, so what `hive serve` costs over it is the harness's own work.
//! With `--handoff` one thread talks to the broker and hands each answer over
//! a channel to the thread that spawns claude, as hive's poller hands it to
//! its turn loop: the wake → spawn bench prints what that hop costs.
//! Usage: `turn-floor SOCKET CLAUDE [--handoff]`; it runs until it is killed.

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

/// One turn's claude: spawned with `prompt` on its stdin, its stdout read to
/// the end, reaped.
fn turn(claude: &str, prompt: &str, output: &mut Vec<u8>) -> std::io::Result<()> {
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
        .write_all(prompt.as_bytes())?;
    output.clear();
    child.stdout.take().expect("piped").read_to_end(output)?;
    child.wait()?;
    Ok(())
}

/// The broker's side of the loop: `recv_next`, then, once `run_turn` has run the
/// message, `ack_turn`, for ever.
fn serve(
    socket: &str,
    mut run_turn: impl FnMut(&str) -> std::io::Result<()>,
) -> std::io::Result<()> {
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
        run_turn(&answer)?;
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

fn run(socket: &str, claude: &str) -> std::io::Result<()> {
    let mut output = Vec::with_capacity(64 * 1024);
    serve(socket, |prompt| turn(claude, prompt, &mut output))
}

/// The same loop with one hand-over between threads on a wake's path, as a
/// harness whose broker connection has a thread of its own: that thread reads
/// the answer and hands it to the thread that spawns claude, over a channel,
/// and waits for the turn's end to ack it.
fn run_handing_over(socket: &str, claude: &str) -> std::io::Result<()> {
    let (to_spawner, prompts) = std::sync::mpsc::channel::<String>();
    let (to_broker, ends) = std::sync::mpsc::channel::<std::io::Result<()>>();
    let socket = socket.to_string();
    let broker = std::thread::spawn(move || {
        serve(&socket, |prompt| {
            to_spawner
                .send(prompt.to_string())
                .map_err(|_| std::io::Error::other("the spawner is gone"))?;
            ends.recv()
                .map_err(|_| std::io::Error::other("the spawner is gone"))?
        })
    });
    let mut output = Vec::with_capacity(64 * 1024);
    for prompt in prompts {
        if to_broker.send(turn(claude, &prompt, &mut output)).is_err() {
            break;
        }
    }
    broker
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the broker thread panicked")))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (run, socket, claude) = match args.as_slice() {
        [socket, claude] => (run as fn(&str, &str) -> _, socket, claude),
        [socket, claude, flag] if flag == "--handoff" => {
            (run_handing_over as fn(&str, &str) -> _, socket, claude)
        }
        _ => {
            eprintln!("usage: turn-floor SOCKET CLAUDE [--handoff]");
            return ExitCode::from(2);
        }
    };
    match run(socket, claude) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("turn-floor: {e}");
            ExitCode::FAILURE
        }
    }
}
