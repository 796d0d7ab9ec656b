//! The one JSON-lines transport of hive's unix sockets (the broker's and the
//! bash task daemon's): one request line answered by one line, many per
//! connection. This file owns the bounded line reader ([`read_line`], over
//! a [`Splitter`] that also cuts lines fed in pieces), the
//! answer framing ([`ok_line`], [`err_line`], [`decode`]; [`push_json_str`]
//! for the MCP server's JSON text), the server side (an
//! accept loop that survives descriptor exhaustion with a capped backoff and
//! can refuse clients over a cap, one thread per connection, and a plain
//! request/answer loop for a connection) and the client side ([`Conn`]: one
//! request, one answer, optionally abandoned through a cancel channel).

use super::limits::{MAX_ERROR_BYTES, MAX_LINE};
use crossbeam_channel::{bounded, select, Receiver};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What reading one line produced.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// A complete line (without its newline). May be empty.
    Text(String),
    /// A line longer than the limit; it was consumed up to its newline.
    TooLong,
    /// A line that is not UTF-8; it was consumed.
    NotUtf8,
    /// Clean end of input.
    Eof,
}

/// Reads one newline-terminated line of at most `max` bytes without ever holding
/// more than `max` bytes of it in memory. A final line without a newline counts.
pub fn read_line(reader: &mut dyn BufRead, max: usize) -> io::Result<Line> {
    let mut split = Splitter::new(max);
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(split.end());
        }
        let (used, line) = split.feed(available);
        reader.consume(used);
        if let Some(line) = line {
            return Ok(line);
        }
    }
}

/// Cuts bytes into lines as they arrive, in pieces of any size, holding at
/// most `max` bytes of the line it is in: [`read_line`] over a reader, and a
/// thread that reads several pipes as they become readable (claude's output).
#[derive(Debug)]
pub struct Splitter {
    buf: Vec<u8>,
    too_long: bool,
    max: usize,
}

impl Splitter {
    pub fn new(max: usize) -> Splitter {
        Splitter {
            buf: Vec::new(),
            too_long: false,
            max,
        }
    }

    /// Takes `data` up to and including its first newline: how many bytes it
    /// took, and the line that newline ended (all of `data` and no line when
    /// it holds no newline).
    pub fn feed(&mut self, data: &[u8]) -> (usize, Option<Line>) {
        let (chunk, found) = match data.iter().position(|&b| b == b'\n') {
            Some(i) => (&data[..i], Some(i)),
            None => (data, None),
        };
        if !self.too_long {
            if self.buf.len() + chunk.len() > self.max {
                self.too_long = true;
                self.buf = Vec::new();
            } else {
                self.buf.extend_from_slice(chunk);
            }
        }
        match found {
            Some(i) => (i + 1, Some(self.finish())),
            None => (data.len(), None),
        }
    }

    /// The end of input: the last line, if it had no newline, or
    /// [`Line::Eof`].
    pub fn end(&mut self) -> Line {
        if self.buf.is_empty() && !self.too_long {
            return Line::Eof;
        }
        self.finish()
    }

    fn finish(&mut self) -> Line {
        if std::mem::take(&mut self.too_long) {
            return Line::TooLong;
        }
        let mut buf = std::mem::take(&mut self.buf);
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
        match String::from_utf8(buf) {
            Ok(s) => Line::Text(s),
            Err(_) => Line::NotUtf8,
        }
    }
}

/// Builds the `{"ok":true,...}` line for a typed answer: `ok` first (which
/// reads better in logs and for people using socat), then the answer's fields
/// in their declared order, written straight from the typed value. No answer
/// type has a top-level field named `ok`; a payload that is not an object
/// adds nothing.
pub fn ok_line<T: Serialize>(payload: &T) -> String {
    const OK: &[u8] = br#"{"ok":true,"#;
    // Written once, after the `ok`, in one buffer; the answer's own opening
    // brace is then taken out.
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(OK);
    let written = serde_json::to_writer(&mut out, payload).is_ok();
    if written && out.len() > OK.len() + 2 && out[OK.len()] == b'{' {
        out.remove(OK.len());
        if let Ok(line) = String::from_utf8(out) {
            return line;
        }
    }
    r#"{"ok":true}"#.into()
}

/// Appends `s` as a JSON string, escaped as serde_json escapes it (`\"`,
/// `\\`, the short escapes of `\b \f \n \r \t`, `\u00xx` for the other
/// control characters; nothing else). Runs of bytes that need no escape (all
/// of a tool's description, as a rule) are found eight bytes at a time and
/// copied whole.
pub fn push_json_str(out: &mut String, s: &str) {
    use std::fmt::Write as _;
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if let Some(word) = bytes.get(i..i + 8) {
            let word = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
            if !needs_escape(word) {
                i += 8;
                continue;
            }
        }
        let b = bytes[i];
        let short = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => {
                i += 1;
                continue;
            }
        };
        // Every escaped byte is ASCII, so `i` is a character boundary.
        out.push_str(&s[start..i]);
        if short.is_empty() {
            let _ = write!(out, "\\u{b:04x}");
        } else {
            out.push_str(short);
        }
        i += 1;
        start = i;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Whether one of the eight bytes of `w` is a control character, `"` or `\\`
/// (the word-at-a-time tests for a byte below a bound and for a zero byte:
/// exact about whether there is one, not about where).
fn needs_escape(w: u64) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
    let quote = zero_byte(w ^ (ONES * u64::from(b'"')));
    let backslash = zero_byte(w ^ (ONES * u64::from(b'\\')));
    control | quote | backslash != 0
}

/// Builds the `{"ok":false,"error":...}` line; an error longer than
/// [`MAX_ERROR_BYTES`] is cut.
pub fn err_line(error: &str) -> String {
    let error = if error.len() > MAX_ERROR_BYTES {
        let mut end = MAX_ERROR_BYTES;
        while !error.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}…", &error[..end])
    } else {
        error.to_string()
    };
    format!(r#"{{"ok":false,"error":{}}}"#, Value::String(error))
}

/// Why an exchange on a [`Conn`] failed.
#[derive(Debug, Clone, PartialEq)]
pub enum CallError {
    /// The peer answered `ok:false` with this error.
    Refused(String),
    /// The connection broke or the answer was unreadable.
    Io(String),
    /// The caller's cancel channel fired (or was dropped).
    Cancelled,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Refused(e) | CallError::Io(e) => f.write_str(e),
            CallError::Cancelled => f.write_str("the call was cancelled"),
        }
    }
}

/// Decodes one answer line: the fields of an `ok:true` answer as `T`, or the
/// peer's error. `peer` and `what` name the two sides in messages.
pub fn decode<T: DeserializeOwned>(line: &str, peer: &str, what: &str) -> Result<T, CallError> {
    let value: Value = serde_json::from_str(line)
        .map_err(|e| CallError::Io(format!("malformed answer from {peer}: {e}")))?;
    let Value::Object(mut map) = value else {
        return Err(CallError::Io(format!(
            "the answer from {peer} is not an object"
        )));
    };
    match map.remove("ok") {
        Some(Value::Bool(true)) => serde_json::from_value(Value::Object(map))
            .map_err(|e| CallError::Io(format!("unexpected answer from {peer} to {what}: {e}"))),
        _ => Err(CallError::Refused(
            map.get("error")
                .and_then(Value::as_str)
                .unwrap_or("unknown error")
                .to_string(),
        )),
    }
}

/// A blocking client connection: one request line out, one answer line in.
/// Not shared between threads.
pub struct Conn {
    /// Who answers, for messages ("the broker", "the bash task daemon").
    peer: &'static str,
    /// The stream, read through the buffer and written directly (`&UnixStream`
    /// writes), so a connection is one descriptor.
    reader: BufReader<UnixStream>,
}

impl Conn {
    /// Connects to the socket at `path`; the error is the system's.
    pub fn connect(path: &Path, peer: &'static str) -> io::Result<Conn> {
        Ok(Conn::over(UnixStream::connect(path)?, peer))
    }

    /// A connection over a stream made another way (a credential's).
    pub fn over(stream: UnixStream, peer: &'static str) -> Conn {
        Conn {
            peer,
            reader: BufReader::new(stream),
        }
    }

    /// Sets how long an answer may take (None waits forever).
    pub fn set_read_timeout(&self, dur: Option<Duration>) -> io::Result<()> {
        self.reader.get_ref().set_read_timeout(dur)
    }

    /// Sends one request line and returns the answer line. With `cancel`, the
    /// call returns [`CallError::Cancelled`] as soon as it fires or is dropped:
    /// a watcher thread, alive only during the call, shuts the stream down.
    /// `what` names the request in messages.
    pub fn exchange(
        &mut self,
        line: &str,
        what: &str,
        cancel: Option<&Receiver<()>>,
    ) -> Result<String, CallError> {
        let Some(cancel) = cancel else {
            return self.exchange_now(line, what);
        };
        let io = |e: io::Error| CallError::Io(format!("{} connection failed: {e}", self.peer));
        let handle = self.reader.get_ref().try_clone().map_err(io)?;
        let (done_tx, done_rx) = bounded::<()>(0);
        let cancel = cancel.clone();
        let cancelled = Arc::new(AtomicBool::new(false));
        let flag = cancelled.clone();
        let watcher = std::thread::Builder::new()
            .name("call-watch".into())
            .spawn(move || {
                select! {
                    recv(cancel) -> _ => {
                        flag.store(true, Ordering::SeqCst);
                        let _ = handle.shutdown(std::net::Shutdown::Both);
                    }
                    recv(done_rx) -> _ => {}
                }
            })
            .map_err(|e| CallError::Io(format!("could not start a thread for the call: {e}")))?;
        let result = self.exchange_now(line, what);
        drop(done_tx);
        let _ = watcher.join();
        if cancelled.load(Ordering::SeqCst) {
            return Err(CallError::Cancelled);
        }
        result
    }

    /// Sends several request lines in one write and reads their answers, in
    /// order: a server answers a connection's requests one at a time, so
    /// this is [`Conn::exchange`] for each without a round trip between them.
    /// The answers read before a failure are kept; the failure ends the list
    /// (the requests after it may or may not have been carried out).
    pub fn exchange_all(&mut self, lines: &[(String, &str)]) -> Vec<Result<String, CallError>> {
        let peer = self.peer;
        let mut out = Vec::with_capacity(lines.iter().map(|(l, _)| l.len() + 1).sum());
        for (line, _) in lines {
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
        let mut writer: &UnixStream = self.reader.get_ref();
        if let Err(e) = writer.write_all(&out) {
            return vec![Err(CallError::Io(format!("{peer} connection failed: {e}")))];
        }
        let mut answers = Vec::with_capacity(lines.len());
        for (_, what) in lines {
            let answer = self.read_answer(what);
            let failed = answer.is_err();
            answers.push(answer);
            if failed {
                break;
            }
        }
        answers
    }

    fn exchange_now(&mut self, line: &str, what: &str) -> Result<String, CallError> {
        let peer = self.peer;
        let io = |e: io::Error| CallError::Io(format!("{peer} connection failed: {e}"));
        let mut out = Vec::with_capacity(line.len() + 1);
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
        let mut writer: &UnixStream = self.reader.get_ref();
        let sent = writer.write_all(&out);
        if let Err(e) = sent {
            // A server that refuses a connection (too many on its socket) says
            // why in one line and closes: that line is the better error.
            if !matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ) {
                return Err(io(e));
            }
            return match read_line(&mut self.reader, MAX_LINE) {
                Ok(Line::Text(s)) if s.starts_with('{') => Ok(s),
                _ => Err(io(e)),
            };
        }
        self.read_answer(what)
    }

    /// Reads the answer line to `what`.
    fn read_answer(&mut self, what: &str) -> Result<String, CallError> {
        let peer = self.peer;
        let io = |e: io::Error| CallError::Io(format!("{peer} connection failed: {e}"));
        match read_line(&mut self.reader, MAX_LINE).map_err(io)? {
            Line::Text(s) => Ok(s),
            Line::Eof => Err(CallError::Io(format!(
                "{peer} closed the connection without answering"
            ))),
            Line::TooLong => Err(CallError::Io(format!(
                "the answer of {peer} to {what} is longer than {MAX_LINE} bytes, more than this \
                 client reads, and was skipped (a server older than this client, or a bug: \
                 please report it)"
            ))),
            Line::NotUtf8 => Err(CallError::Io(format!(
                "the answer of {peer} to {what} is not UTF-8 and was skipped"
            ))),
        }
    }

    /// A second handle on the stream (`shutdown(Both)` on it ends a blocked call).
    pub fn shutdown_handle(&self) -> io::Result<UnixStream> {
        self.reader.get_ref().try_clone()
    }
}

/// Tells a refused client why, without ever blocking the accept loop.
pub fn refuse(stream: UnixStream, why: &str) {
    let mut line = err_line(why).into_bytes();
    line.push(b'\n');
    if stream.set_nonblocking(true).is_ok() {
        let _ = (&stream).write_all(&line);
    }
}

/// Serves one client connection of a plain request/answer server: reads
/// request lines (bounded by [`MAX_LINE`]), hands each to `answer`, writes the
/// line it returns, until the client hangs up. `answer` also returns a token;
/// when the answer cannot be written, `lost` gets it (so an answer that carried
/// a result can be owed again). `busy` is what a client hears when its
/// connection cannot get a second descriptor.
pub fn serve_conn<T>(
    stream: UnixStream,
    busy: &str,
    mut answer: impl FnMut(&str) -> (String, Option<T>),
    mut lost: impl FnMut(T),
) {
    let Ok(mut writer) = stream.try_clone() else {
        let _ = writeln!(&stream, "{}", err_line(busy));
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let (line, token) = match read_line(&mut reader, MAX_LINE) {
            Ok(Line::Text(s)) if s.trim().is_empty() => continue,
            Ok(Line::Text(s)) => answer(&s),
            Ok(Line::TooLong) => (
                err_line(&format!(
                    "request line longer than {MAX_LINE} bytes refused"
                )),
                None,
            ),
            Ok(Line::NotUtf8) => (err_line("request line is not valid UTF-8"), None),
            Ok(Line::Eof) | Err(_) => return,
        };
        let written = writer
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|_| writer.flush());
        if let Err(e) = written {
            if let Some(t) = token {
                lost(t);
            }
            log::debug!("a client went away before its answer: {e}");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A string is escaped as serde_json escapes it.
    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        let long = "eight by eight: \"quoted\" and\\back, a\ttab\u{0}, é→ and a long plain run";
        for s in [
            "",
            "plain",
            "\"\\\u{8}\u{c}\n\r\t\u{0}\u{1f}\u{7f}/é→",
            long,
            &long[1..],
            &long[3..],
            "ends with a quote\"",
            "\u{1f}\u{20}\u{21}\u{22}\u{5b}\u{5c}\u{5d}\u{7e}\u{7f}\u{80}ÿ",
        ] {
            let mut out = String::new();
            push_json_str(&mut out, s);
            assert_eq!(out, serde_json::to_string(s).unwrap());
        }
    }

    #[test]
    fn read_line_bounds_memory_and_recovers() {
        let mut input: &[u8] = b"short\r\n0123456789abc\nnext\nlast";
        let r: &mut dyn BufRead = &mut input;
        assert_eq!(read_line(r, 10).unwrap(), Line::Text("short".into()));
        assert_eq!(read_line(r, 10).unwrap(), Line::TooLong);
        assert_eq!(read_line(r, 10).unwrap(), Line::Text("next".into()));
        assert_eq!(read_line(r, 10).unwrap(), Line::Text("last".into()));
        assert_eq!(read_line(r, 10).unwrap(), Line::Eof);
        let mut bad: &[u8] = b"\xff\xfe\nok\n";
        let r: &mut dyn BufRead = &mut bad;
        assert_eq!(read_line(r, 10).unwrap(), Line::NotUtf8);
        assert_eq!(read_line(r, 10).unwrap(), Line::Text("ok".into()));
    }

    #[test]
    fn a_splitter_fed_in_pieces_cuts_the_lines_read_line_cuts() {
        let input: &[u8] = b"short\r\n0123456789abc\n\xff\xfe\n\nnext\nlast";
        let whole = {
            let mut r = input;
            let mut v = Vec::new();
            loop {
                match read_line(&mut r, 10).unwrap() {
                    Line::Eof => break v,
                    l => v.push(l),
                }
            }
        };
        assert_eq!(whole.len(), 6, "{whole:?}");
        for piece in 1..input.len() {
            let mut split = Splitter::new(10);
            let mut got = Vec::new();
            for mut data in input.chunks(piece) {
                while !data.is_empty() {
                    let (used, line) = split.feed(data);
                    data = &data[used..];
                    got.extend(line);
                }
            }
            // The last line has no newline: the end gives it, then nothing.
            got.push(split.end());
            assert_eq!(split.end(), Line::Eof, "pieces of {piece}");
            assert_eq!(got, whole, "pieces of {piece}");
        }
    }

    #[test]
    fn answers_are_framed_and_decoded() {
        #[derive(Debug, Serialize, serde::Deserialize, PartialEq)]
        struct Id {
            id: i64,
        }
        assert_eq!(ok_line(&Id { id: 4 }), r#"{"ok":true,"id":4}"#);
        assert_eq!(ok_line(&serde_json::json!({})), r#"{"ok":true}"#);
        assert_eq!(err_line("x"), r#"{"ok":false,"error":"x"}"#);
        let huge = err_line(&"e".repeat(100_000));
        assert!(huge.len() < MAX_ERROR_BYTES + 100);
        assert_eq!(
            decode::<Id>(r#"{"ok":true,"id":4}"#, "p", "w"),
            Ok(Id { id: 4 })
        );
        assert_eq!(
            decode::<Id>(r#"{"ok":false,"error":"no"}"#, "p", "w"),
            Err(CallError::Refused("no".into()))
        );
        let e = decode::<Id>(r#"{"ok":true}"#, "the broker", "hello").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unexpected answer from the broker to hello"),
            "{e}"
        );
    }
}
