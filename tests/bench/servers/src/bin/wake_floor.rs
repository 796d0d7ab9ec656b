//! The floor of `hive wake`: a static std-only client that does on the wire
//! exactly what `hive wake --socket S --from F --body B` does — connect to the
//! agent socket, write one `wake` line, read the answer — and nothing else (no
//! command line parser, logger, settings or typed client). `make bench` runs
//! it against the same broker as `hive wake`, so the difference between the
//! two is what `hive`'s own start costs. Usage: `wake-floor SOCKET FROM BODY`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

/// `s` as a JSON string.
fn quoted(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if (c as u32) < 0x20 => q.push_str(&format!("\\u{:04x}", c as u32)),
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [socket, from, body] = args.as_slice() else {
        eprintln!("usage: wake-floor SOCKET FROM BODY");
        return ExitCode::from(2);
    };
    let line = format!(
        "{{\"cmd\":\"wake\",\"from\":{},\"body\":{}}}\n",
        quoted(from),
        quoted(body)
    );
    let answer = UnixStream::connect(socket).and_then(|mut s| {
        s.write_all(line.as_bytes())?;
        let mut answer = String::new();
        BufReader::new(s).read_line(&mut answer)?;
        Ok(answer)
    });
    match answer {
        Ok(a) if a.starts_with("{\"ok\":true") => ExitCode::SUCCESS,
        Ok(a) => {
            eprintln!("wake-floor: refused: {}", a.trim_end());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("wake-floor: {e}");
            ExitCode::FAILURE
        }
    }
}
