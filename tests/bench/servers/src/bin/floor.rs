//! The floor of `make bench`'s MCP comparison: the least a static MCP server over
//! stdio can do and still answer what claude sends at start-up. It reads one line
//! at a time on the main thread (no other thread, no JSON library, no allocation
//! per line beyond the line buffer), answers `initialize` and `tools/list` with
//! fixed text the size of `hive bash-mcp`'s, ignores notifications, answers any
//! other request "method not found", and exits at the end of its input. It does
//! not parse JSON: it finds `"method":"…"` and copies the `"id"` value as it is,
//! which is enough for the bench's well-formed input and nothing else.

use std::io::{BufRead, Write};

const INITIALIZE: &str = r#""result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{"listChanged":false}},"serverInfo":{"name":"floor","version":"0.1.0"}}}"#;

/// Two tools described like `hive bash-mcp`'s, so the answer is as long.
const TOOLS: &str = concat!(
    r#""result":{"tools":[{"name":"run","description":"Run a shell command in the background "#,
    r#"(sh -c CMD; the working directory is the agent's state dir, stdin is /dev/null so "#,
    r#"interactive commands fail). Stdout and stderr are written to files as they come. The call "#,
    r#"first waits up to wait_seconds (default 3, at most 30; 0 returns at once) for the command "#,
    r#"to finish: if it does, you get its full status right away (exit code, run time, last 4 KiB "#,
    r#"of stdout and stderr) and nothing else happens. Otherwise the answer is task started: "#,
    r#"id=<id> and the command keeps running, even after this turn ends; when it finishes you are "#,
    r#"woken by a message from bash-task-<id> with its exit code and last output lines, so end "#,
    r#"your turn instead of polling. timeout_secs kills the command and every process it started "#,
    r#"after that many seconds (status timed_out); without it the command runs until it exits.","#,
    r#""inputSchema":{"type":"object","properties":{"cmd":{"type":"string","description":"The "#,
    r#"shell command line, run with sh -c."},"timeout_secs":{"type":"integer","minimum":1,"#,
    r#""description":"Kill the command and its children after this many seconds. Omit for no "#,
    r#"limit."},"wait_seconds":{"type":"integer","minimum":0,"maximum":30,"description":"How "#,
    r#"long to wait for the result inline (default 3, max 30, 0 = return at once)."}},"#,
    r#""required":["cmd"],"additionalProperties":false}},{"name":"status","description":"Show "#,
    r#"a task started with run: its status (pending, running, done, timed_out, or interrupted "#,
    r#"when the task daemon was stopped or restarted while it ran, as when the agent is stopped), "#,
    r#"the exit code once done, the run time, the last 4 KiB of stdout and of stderr, and the "#,
    r#"paths of the files holding the whole output (read them for more). wait_seconds (default "#,
    r#"0, at most 30) first waits that long for a running task to finish, which saves a call "#,
    r#"when it is about to.","inputSchema":{"type":"object","properties":{"id":{"type":"string","#,
    r#""description":"The task id from run, e.g. \"7\"."},"wait_seconds":{"type":"integer","#,
    r#""minimum":0,"maximum":30,"description":"Wait up to this long for a running task to finish "#,
    r#"(default 0, max 30)."}},"required":["id"],"additionalProperties":false}}]}}"#
);

const NOT_FOUND: &str = r#""error":{"code":-32601,"message":"Method not found"}}"#;

/// The text of the string value of `"key":"…"` in `line` (no escapes expected).
fn string_field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = line.find(key)? + key.len();
    let rest = line[start..].trim_start().strip_prefix(':')?.trim_start();
    let rest = rest.strip_prefix('"')?;
    Some(&rest[..rest.find('"')?])
}

/// The raw JSON of the `"id"` value: a number or a string, copied as it is.
fn id_field(line: &str) -> Option<&str> {
    let start = line.find("\"id\"")? + 4;
    let rest = line[start..].trim_start().strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('"') {
        rest[1..].find('"')? + 2
    } else {
        rest.find([',', '}'])?
    };
    Some(rest[..end].trim_end())
}

fn main() {
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut line = String::with_capacity(4096);
    let mut answer = Vec::with_capacity(4096);
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let (Some(method), Some(id)) = (string_field(&line, "\"method\""), id_field(&line)) else {
            continue; // a notification, or a line the floor does not read
        };
        let body = match method {
            "initialize" => INITIALIZE,
            "tools/list" => TOOLS,
            _ => NOT_FOUND,
        };
        answer.clear();
        answer.extend_from_slice(br#"{"jsonrpc":"2.0","id":"#);
        answer.extend_from_slice(id.as_bytes());
        answer.push(b',');
        answer.extend_from_slice(body.as_bytes());
        answer.push(b'\n');
        if out.write_all(&answer).and_then(|_| out.flush()).is_err() {
            return;
        }
    }
}
