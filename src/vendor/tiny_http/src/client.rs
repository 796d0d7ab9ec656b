use ascii::AsciiString;

use std::io::Error as IoError;
use std::io::Result as IoResult;
use std::io::{BufReader, BufWriter, ErrorKind, Read, Write};

use std::net::SocketAddr;
use std::os::unix::io::{AsRawFd, RawFd};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{HTTPVersion, Method};
use crate::util::RefinedTcpStream;
use crate::util::{SequentialReader, SequentialReaderBuilder, SequentialWriterBuilder};
use crate::Request;

/// Bounds on what a client may send before its request is handed to the
/// application (patched in for hive). Header lines are read into a buffer that
/// never grows past `max_line`; past a bound the client gets `414` (request
/// line) or `431` (headers) and the connection is closed.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The longest request line or header line, CRLF excluded.
    pub max_line: usize,
    /// The most bytes of one request's head: request line and headers.
    pub max_header_bytes: usize,
    /// The most header lines in one request.
    pub max_headers: usize,
    /// The longest time from a request's first byte to the end of its headers
    /// (the socket's own read timeout bounds each wait for a byte).
    pub header_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_line: 8 * 1024,
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            header_timeout: Duration::from_secs(30),
        }
    }
}

/// How long a connection refused for its headers is still read (and the input
/// thrown away) before it is closed, so the client can read the refusal before
/// the close resets the connection.
const LINGER: Duration = Duration::from_secs(2);

/// A ClientConnection is an object that will store a socket to a client
/// and return Request objects.
pub struct ClientConnection {
    // address of the client
    remote_addr: IoResult<Option<SocketAddr>>,

    // sequence of Readers to the stream, so that the data is not read in
    //  the wrong order
    source: SequentialReaderBuilder<BufReader<RefinedTcpStream>>,

    // sequence of Writers to the stream, to avoid writing response #2 before
    //  response #1
    sink: SequentialWriterBuilder<BufWriter<RefinedTcpStream>>,

    // Reader to read the next header from
    next_header_source: SequentialReader<BufReader<RefinedTcpStream>>,

    // set to true if we know that the previous request is the last one
    no_more_requests: bool,

    // true if the connection goes through SSL
    secure: bool,

    limits: Limits,

    // set when a request's body was dropped before it was read to its end: what
    // follows on the socket is not a request, so the connection is closed
    poisoned: Arc<AtomicBool>,

    // the descriptor of the writing half, which each response writer keeps open
    write_fd: RawFd,
}

/// Error that can happen when reading a request.
#[derive(Debug)]
enum ReadError {
    WrongRequestLine,
    WrongHeader(HTTPVersion),
    /// the client sent an unrecognized `Expect` header
    ExpectationFailed(HTTPVersion),
    ReadIoError(IoError),
    /// nothing of a next request came before the read timeout or the end
    Idle,
    /// a request started but its head did not end in time
    Timeout,
    /// the request line is longer than `Limits::max_line`
    RequestLineTooLong,
    /// a header line, the header count or the header bytes passed a limit
    HeadersTooLarge(HTTPVersion),
    /// the previous request's body was not read to its end
    Poisoned,
}

/// A read that ended for lack of data within the socket's read timeout
/// (`SO_RCVTIMEO` shows up as `WouldBlock`).
fn timed_out(e: &IoError) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// The bytes left for one request's head and when it must be complete.
struct HeadBudget {
    bytes: usize,
    deadline: Option<Instant>,
}

impl ClientConnection {
    /// Creates a new `ClientConnection` that takes ownership of the `TcpStream`.
    pub fn new(
        write_socket: RefinedTcpStream,
        mut read_socket: RefinedTcpStream,
        limits: Limits,
    ) -> IoResult<ClientConnection> {
        let remote_addr = read_socket.peer_addr();
        let secure = read_socket.secure();
        let write_fd = write_socket.as_raw_fd();

        let mut source = SequentialReaderBuilder::new(BufReader::with_capacity(1024, read_socket));
        let first_header = source
            .next()
            .ok_or_else(|| IoError::other("no reader for the connection"))?;

        Ok(ClientConnection {
            source,
            sink: SequentialWriterBuilder::new(BufWriter::with_capacity(1024, write_socket)),
            remote_addr,
            next_header_source: first_header,
            no_more_requests: false,
            secure,
            limits,
            poisoned: Arc::new(AtomicBool::new(false)),
            write_fd,
        })
    }

    /// Reads the next line from self.next_header_source.
    ///
    /// Reads until `CRLF` is reached. The next read will start
    ///  at the first byte of the new line. The line and the head it belongs to
    ///  are bounded by `self.limits`; `first` is the request line.
    fn read_next_line(
        &mut self,
        head: &mut HeadBudget,
        first: bool,
    ) -> Result<AsciiString, ReadError> {
        let mut buf = Vec::with_capacity(128);
        let mut prev_byte_was_cr = false;

        loop {
            let byte = self.next_header_source.by_ref().bytes().next();
            if self.poisoned.load(Ordering::SeqCst) {
                return Err(ReadError::Poisoned);
            }
            let at_start = first && buf.is_empty() && head.deadline.is_none();
            let byte = match byte {
                Some(Ok(b)) => b,
                Some(Err(e)) if timed_out(&e) && at_start => return Err(ReadError::Idle),
                Some(Err(e)) if timed_out(&e) => return Err(ReadError::Timeout),
                Some(Err(e)) => return Err(ReadError::ReadIoError(e)),
                None if at_start => return Err(ReadError::Idle),
                None => {
                    return Err(ReadError::ReadIoError(IoError::new(
                        ErrorKind::ConnectionAborted,
                        "Unexpected EOF",
                    )))
                }
            };
            let now = Instant::now();
            let deadline = *head
                .deadline
                .get_or_insert(now + self.limits.header_timeout);
            if now > deadline {
                return Err(ReadError::Timeout);
            }

            if byte == b'\n' && prev_byte_was_cr {
                buf.pop(); // removing the '\r'
                return AsciiString::from_ascii(buf).map_err(|_| {
                    ReadError::ReadIoError(IoError::new(
                        ErrorKind::InvalidInput,
                        "Header is not in ASCII",
                    ))
                });
            }

            prev_byte_was_cr = byte == b'\r';

            // The CR of a line's CRLF may take the line one past the limit.
            if buf.len() >= self.limits.max_line + usize::from(prev_byte_was_cr) || head.bytes == 0
            {
                return Err(if first {
                    ReadError::RequestLineTooLong
                } else {
                    ReadError::HeadersTooLarge(HTTPVersion(1, 1))
                });
            }
            head.bytes -= 1;
            buf.push(byte);
        }
    }

    /// Reads a request from the stream.
    /// Blocks until the header has been read.
    fn read(&mut self) -> Result<Request, ReadError> {
        let mut head = HeadBudget {
            bytes: self.limits.max_header_bytes,
            deadline: None,
        };
        let (method, path, version, headers) = {
            // reading the request line
            let (method, path, version) = {
                let line = self.read_next_line(&mut head, true)?;

                parse_request_line(
                    line.as_str().trim(), // TODO: remove this conversion
                )?
            };

            // getting all headers
            let headers = {
                let mut headers = Vec::new();
                loop {
                    let line = self.read_next_line(&mut head, false).map_err(|e| match e {
                        ReadError::HeadersTooLarge(_) => {
                            ReadError::HeadersTooLarge(version.clone())
                        }
                        e => e,
                    })?;

                    if line.is_empty() {
                        break;
                    };
                    if headers.len() >= self.limits.max_headers {
                        return Err(ReadError::HeadersTooLarge(version));
                    }
                    headers.push(match FromStr::from_str(line.as_str().trim()) {
                        // TODO: remove this conversion
                        Ok(h) => h,
                        _ => return Err(ReadError::WrongHeader(version)),
                    });
                }

                headers
            };

            (method, path, version, headers)
        };

        let remote_addr = match &self.remote_addr {
            Ok(addr) => *addr,
            Err(e) => {
                return Err(ReadError::ReadIoError(IoError::new(
                    e.kind(),
                    e.to_string(),
                )))
            }
        };

        // building the writer for the request
        let writer = self.sink.next().ok_or(ReadError::Idle)?;

        // follow-up for next potential request
        let mut data_source = self.source.next().ok_or(ReadError::Idle)?;
        std::mem::swap(&mut self.next_header_source, &mut data_source);

        // building the next reader
        let request = crate::request::new_request(
            self.secure,
            method,
            path,
            version.clone(),
            headers,
            remote_addr,
            data_source,
            writer,
        )
        .map_err(|e| {
            use crate::request;
            match e {
                request::RequestCreationError::CreationIoError(e) if timed_out(&e) => {
                    ReadError::Timeout
                }
                request::RequestCreationError::CreationIoError(e) => ReadError::ReadIoError(e),
                request::RequestCreationError::ExpectationFailed => {
                    ReadError::ExpectationFailed(version)
                }
            }
        })?
        .with_connection(self.poisoned.clone(), self.write_fd);

        // return the request
        Ok(request)
    }

    /// Writes a short JSON error (the connection closes after it).
    fn refuse(&mut self, code: u16, version: HTTPVersion, message: &str) {
        use crate::{Header, Response, StatusCode};
        let Some(writer) = self.sink.next() else {
            return;
        };
        let body = format!("{{\"error\":\"{}\"}}", message);
        let mut response = Response::from_string(body).with_status_code(StatusCode(code));
        if let Ok(h) = Header::from_bytes(&b"Content-Type"[..], &b"application/json"[..]) {
            response.add_header(h);
        }
        response.raw_print(writer, version, &[], false, None).ok();
    }

    /// Waits until every response handed out on this connection is finished
    /// (a live stream may hold its writer for hours), so the connection is
    /// not shut under it.
    fn finish_responses(&mut self) {
        if let Some(mut w) = self.sink.next() {
            let _ = w.flush();
        }
    }

    /// Reads and throws away what the client still sends, for at most
    /// [`LINGER`], through a fixed buffer.
    fn linger(&mut self) {
        let end = Instant::now() + LINGER;
        let mut buf = [0u8; 8192];
        while Instant::now() < end {
            match self.next_header_source.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

impl Iterator for ClientConnection {
    type Item = Request;

    /// Blocks until the next Request is available.
    /// Returns None when no new Requests will come from the client.
    fn next(&mut self) -> Option<Request> {
        use crate::{Response, StatusCode};

        // the client sent a "connection: close" header in this previous request
        //  or is using HTTP 1.0, meaning that no new request will come; the
        //  connection is kept until that request's response is finished (a live
        //  stream may hold its writer for hours), since dropping it shuts the
        //  reading half, which a stream's writer takes for a hang-up
        if self.no_more_requests {
            self.finish_responses();
            return None;
        }

        loop {
            let rq = match self.read() {
                Err(ReadError::WrongRequestLine) => {
                    let writer = self.sink.next()?;
                    let response = Response::new_empty(StatusCode(400));
                    response
                        .raw_print(writer, HTTPVersion(1, 1), &[], false, None)
                        .ok();
                    return None; // we don't know where the next request would start,
                                 // se we have to close
                }

                Err(ReadError::WrongHeader(ver)) => {
                    let writer = self.sink.next()?;
                    let response = Response::new_empty(StatusCode(400));
                    response.raw_print(writer, ver, &[], false, None).ok();
                    return None; // we don't know where the next request would start,
                                 // se we have to close
                }

                Err(ReadError::Timeout) => {
                    // request timeout
                    let writer = self.sink.next()?;
                    let response = Response::new_empty(StatusCode(408));
                    response
                        .raw_print(writer, HTTPVersion(1, 1), &[], false, None)
                        .ok();
                    return None; // closing the connection
                }

                Err(ReadError::RequestLineTooLong) => {
                    let message =
                        format!("request line longer than {} bytes", self.limits.max_line);
                    self.refuse(414, HTTPVersion(1, 1), &message);
                    self.linger();
                    return None;
                }

                Err(ReadError::HeadersTooLarge(ver)) => {
                    let message = format!(
                        "request headers too large (at most {} bytes a line, {} bytes and {} lines in all)",
                        self.limits.max_line, self.limits.max_header_bytes, self.limits.max_headers
                    );
                    self.refuse(431, ver, &message);
                    self.linger();
                    return None;
                }

                Err(ReadError::ExpectationFailed(ver)) => {
                    let writer = self.sink.next()?;
                    let response = Response::new_empty(StatusCode(417));
                    response.raw_print(writer, ver, &[], true, None).ok();
                    return None; // TODO: should be recoverable, but needs handling in case of body
                }

                Err(ReadError::ReadIoError(e)) => {
                    log::debug!("closing a connection: {}", e);
                    return None;
                }

                Err(ReadError::Idle) => {
                    self.finish_responses();
                    return None;
                }

                Err(ReadError::Poisoned) => {
                    self.linger();
                    self.finish_responses();
                    return None;
                }

                Ok(rq) => rq,
            };

            // checking HTTP version
            if *rq.http_version() > (1, 1) {
                let writer = self.sink.next()?;
                let response = Response::from_string(
                    "This server only supports HTTP versions 1.0 and 1.1".to_owned(),
                )
                .with_status_code(StatusCode(505));
                response
                    .raw_print(writer, HTTPVersion(1, 1), &[], false, None)
                    .ok();
                continue;
            }

            // updating the status of the connection
            let connection_header = rq
                .headers()
                .iter()
                .find(|h| h.field.equiv("Connection"))
                .map(|h| h.value.as_str());

            let lowercase = connection_header.map(|h| h.to_ascii_lowercase());

            match lowercase {
                Some(ref val) if val.contains("close") => self.no_more_requests = true,
                Some(ref val) if val.contains("upgrade") => self.no_more_requests = true,
                Some(ref val)
                    if !val.contains("keep-alive") && *rq.http_version() == HTTPVersion(1, 0) =>
                {
                    self.no_more_requests = true
                }
                None if *rq.http_version() == HTTPVersion(1, 0) => self.no_more_requests = true,
                _ => (),
            };

            // returning the request
            return Some(rq);
        }
    }
}

/// Parses a "HTTP/1.1" string.
fn parse_http_version(version: &str) -> Result<HTTPVersion, ReadError> {
    let (major, minor) = match version {
        "HTTP/0.9" => (0, 9),
        "HTTP/1.0" => (1, 0),
        "HTTP/1.1" => (1, 1),
        "HTTP/2.0" => (2, 0),
        "HTTP/3.0" => (3, 0),
        _ => return Err(ReadError::WrongRequestLine),
    };

    Ok(HTTPVersion(major, minor))
}

/// Parses the request line of the request.
/// eg. GET / HTTP/1.1
fn parse_request_line(line: &str) -> Result<(Method, String, HTTPVersion), ReadError> {
    let mut parts = line.split(' ');

    let method = parts.next().and_then(|w| w.parse().ok());
    let path = parts.next().map(ToOwned::to_owned);
    let version = parts.next().and_then(|w| parse_http_version(w).ok());

    method
        .and_then(|method| Some((method, path?, version?)))
        .ok_or(ReadError::WrongRequestLine)
}

#[cfg(test)]
mod test {
    #[test]
    fn test_parse_request_line() {
        let (method, path, ver) = super::parse_request_line("GET /hello HTTP/1.1").unwrap();

        assert!(method == crate::Method::Get);
        assert!(path == "/hello");
        assert!(ver == crate::common::HTTPVersion(1, 1));

        assert!(super::parse_request_line("GET /hello").is_err());
        assert!(super::parse_request_line("qsd qsd qsd").is_err());
    }
}
