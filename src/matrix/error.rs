//! What can go wrong between hive and a homeserver, sorted by what the caller
//! should do about it: an [`ErrorKind`] says whether to stop (a refused login or
//! token), wait as told (429 with `retry_after_ms`), retry with backoff (5xx, a
//! homeserver that is down or slow), or give up on this one request (another
//! 4xx, content refused before sending). [`classify`] turns an HTTP answer into
//! an [`Error`]; [`Backoff`] turns a stream of errors into pauses. No message
//! built here holds a secret: URLs carry none, and error bodies are the
//! homeserver's own `errcode` and `error`.

use serde::Deserialize;
use std::fmt;
use std::time::Duration;

/// The longest pause a `retry_after_ms` is honoured for; a homeserver asking
/// for more gets this, so a bad hint cannot park the bridge for days.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);

/// What the caller should do about an [`Error`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    /// The login was refused (wrong user or password) or the access token is
    /// unknown, revoked or missing: trying again cannot help until the Matrix
    /// login is fixed. Fatal at start.
    Auth,
    /// `429 M_LIMIT_EXCEEDED`: try again after `retry_after` (the homeserver's
    /// hint, when it gave one).
    RateLimited { retry_after: Option<Duration> },
    /// The homeserver could not be reached, timed out, answered 5xx or
    /// something unreadable: try again with a capped backoff.
    Unavailable,
    /// The homeserver refused this request (another 4xx, or a redirect):
    /// sending it again cannot help.
    Refused {
        status: u16,
        errcode: Option<String>,
    },
    /// Refused here, before anything was sent: bad input (content over the
    /// event cap or outside canonical JSON, a malformed room or user id).
    Invalid,
    /// A local file (password, access token) could not be read or written.
    File,
}

/// One failed request: what to do about it and a message naming the request
/// and the homeserver's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
        }
    }

    /// A refused login or token: the caller turns it into "exit 2 naming the
    /// Matrix login".
    pub fn is_auth(&self) -> bool {
        self.kind == ErrorKind::Auth
    }

    /// Whether sending the same request again later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::RateLimited { .. } | ErrorKind::Unavailable
        )
    }

    /// The same error with `context` in front of its message.
    pub fn context(mut self, context: impl fmt::Display) -> Error {
        self.message = format!("{context}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// The body of a Matrix error answer; every field may be missing (a proxy in
/// front of the homeserver answers HTML).
#[derive(Debug, Default, Deserialize)]
struct ErrorBody {
    #[serde(default)]
    errcode: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    retry_after_ms: Option<u64>,
}

/// Whether the request was a login, where `M_FORBIDDEN` means a wrong user or
/// password; elsewhere it means "not allowed in this room", which another
/// login cannot fix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Login,
    Other,
}

/// The error for a non-2xx answer to `op` (e.g. `PUT /_matrix/…`): `status`,
/// its body and its `Retry-After` header.
pub fn classify(
    op: &str,
    endpoint: Endpoint,
    status: u16,
    body: &[u8],
    retry_after_header: Option<&str>,
) -> Error {
    let parsed: ErrorBody = serde_json::from_slice(body).unwrap_or_default();
    let errcode = parsed.errcode.filter(|c| !c.is_empty());
    let said = match (&errcode, &parsed.error) {
        (Some(code), Some(text)) => format!("{status} {code}: {}", clip(text)),
        (Some(code), None) => format!("{status} {code}"),
        (None, Some(text)) => format!("{status}: {}", clip(text)),
        (None, None) => status.to_string(),
    };
    let message = format!("{op} answered {said}");
    let code = errcode.as_deref().unwrap_or("");
    let kind = if status == 429 || code == "M_LIMIT_EXCEEDED" {
        let retry_after = parsed
            .retry_after_ms
            .map(Duration::from_millis)
            .or_else(|| {
                retry_after_header
                    .and_then(|h| h.trim().parse::<u64>().ok())
                    .map(Duration::from_secs)
            });
        ErrorKind::RateLimited { retry_after }
    } else if status == 401
        || matches!(
            code,
            "M_UNKNOWN_TOKEN" | "M_MISSING_TOKEN" | "M_USER_DEACTIVATED"
        )
        || (endpoint == Endpoint::Login && (status == 403 || code == "M_FORBIDDEN"))
    {
        ErrorKind::Auth
    } else if status >= 500 || status == 408 {
        ErrorKind::Unavailable
    } else {
        ErrorKind::Refused { status, errcode }
    };
    Error::new(kind, message)
}

/// At most 300 characters of a homeserver's error text, on one line.
fn clip(text: &str) -> String {
    let one_line: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(300)
        .collect();
    one_line.trim().to_string()
}

/// Pauses between tries of a request that keeps failing: the homeserver's
/// `retry_after_ms` as given (up to [`MAX_RETRY_AFTER`]) for a 429, and for an
/// unavailable homeserver `first` doubled per failure in a row, at most `max`.
/// Errors that another try cannot fix get no pause: the caller stops or drops
/// the request. Call [`Backoff::succeeded`] after a success.
#[derive(Debug, Clone)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    failures: u32,
}

impl Backoff {
    pub fn new(first: Duration, max: Duration) -> Backoff {
        Backoff {
            first,
            max: max.max(first),
            failures: 0,
        }
    }

    /// The pause before trying again after `err`, or None when trying again
    /// cannot help (auth, refused, invalid, file).
    pub fn delay(&mut self, err: &Error) -> Option<Duration> {
        match err.kind {
            ErrorKind::RateLimited {
                retry_after: Some(after),
            } => Some(after.min(MAX_RETRY_AFTER)),
            ErrorKind::RateLimited { retry_after: None } | ErrorKind::Unavailable => {
                let factor = 1u32 << self.failures.min(16);
                self.failures = self.failures.saturating_add(1);
                Some(self.first.saturating_mul(factor).min(self.max))
            }
            ErrorKind::Auth | ErrorKind::Refused { .. } | ErrorKind::Invalid | ErrorKind::File => {
                None
            }
        }
    }

    /// Failures in a row since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// Starts the doubling again from `first`.
    pub fn succeeded(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(endpoint: Endpoint, status: u16, body: &str) -> ErrorKind {
        classify("GET /x", endpoint, status, body.as_bytes(), None).kind
    }

    #[test]
    fn answers_are_sorted_by_what_to_do() {
        let other = Endpoint::Other;
        let login = Endpoint::Login;
        // Literal bodies Synapse 1.163 sends.
        let cases: &[(Endpoint, u16, &str, ErrorKind)] = &[
            (
                login,
                403,
                r#"{"errcode":"M_FORBIDDEN","error":"Invalid username or password"}"#,
                ErrorKind::Auth,
            ),
            (
                other,
                401,
                r#"{"errcode":"M_UNKNOWN_TOKEN","error":"Invalid access token passed.","soft_logout":false}"#,
                ErrorKind::Auth,
            ),
            (
                other,
                401,
                r#"{"errcode":"M_MISSING_TOKEN","error":"Missing access token"}"#,
                ErrorKind::Auth,
            ),
            (
                other,
                403,
                r#"{"errcode":"M_USER_DEACTIVATED","error":"This account has been deactivated"}"#,
                ErrorKind::Auth,
            ),
            (
                other,
                403,
                r#"{"errcode":"M_FORBIDDEN","error":"User @a:hive.test not in room"}"#,
                ErrorKind::Refused {
                    status: 403,
                    errcode: Some("M_FORBIDDEN".into()),
                },
            ),
            (
                other,
                400,
                r#"{"errcode":"M_BAD_JSON","error":"Bad JSON value: float"}"#,
                ErrorKind::Refused {
                    status: 400,
                    errcode: Some("M_BAD_JSON".into()),
                },
            ),
            (
                other,
                429,
                r#"{"errcode":"M_LIMIT_EXCEEDED","error":"Too Many Requests","retry_after_ms":1999}"#,
                ErrorKind::RateLimited {
                    retry_after: Some(Duration::from_millis(1999)),
                },
            ),
            (
                other,
                502,
                "<html>Bad Gateway</html>",
                ErrorKind::Unavailable,
            ),
            (
                other,
                500,
                r#"{"errcode":"M_UNKNOWN","error":"Internal server error"}"#,
                ErrorKind::Unavailable,
            ),
            (
                other,
                404,
                "",
                ErrorKind::Refused {
                    status: 404,
                    errcode: None,
                },
            ),
        ];
        for (endpoint, status, body, want) in cases {
            assert_eq!(&kind(*endpoint, *status, body), want, "{status} {body}");
        }
    }

    #[test]
    fn a_429_without_body_hint_uses_the_retry_after_header() {
        let e = classify("PUT /s", Endpoint::Other, 429, b"", Some("3"));
        assert_eq!(
            e.kind,
            ErrorKind::RateLimited {
                retry_after: Some(Duration::from_secs(3))
            }
        );
        let e = classify("PUT /s", Endpoint::Other, 429, b"", None);
        assert_eq!(e.kind, ErrorKind::RateLimited { retry_after: None });
    }

    #[test]
    fn the_message_names_the_request_and_the_answer() {
        let e = classify(
            "POST /_matrix/client/v3/login",
            Endpoint::Login,
            403,
            br#"{"errcode":"M_FORBIDDEN","error":"Invalid username or password"}"#,
            None,
        );
        assert_eq!(
            e.to_string(),
            "POST /_matrix/client/v3/login answered 403 M_FORBIDDEN: Invalid username or password"
        );
        let e = classify("GET /y", Endpoint::Other, 503, b"down\n\tfor now", None);
        assert_eq!(e.to_string(), "GET /y answered 503");
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_honours_retry_after() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        let down = Error::new(ErrorKind::Unavailable, "down");
        let delays: Vec<_> = (0..6).map(|_| b.delay(&down).unwrap()).collect();
        let ms: Vec<u128> = delays.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.failures(), 6);
        // The homeserver's hint is honoured as given, even above the cap, and
        // does not count as a failure.
        let limited = Error::new(
            ErrorKind::RateLimited {
                retry_after: Some(Duration::from_millis(2500)),
            },
            "429",
        );
        assert_eq!(b.delay(&limited), Some(Duration::from_millis(2500)));
        assert_eq!(b.failures(), 6);
        let huge = Error::new(
            ErrorKind::RateLimited {
                retry_after: Some(Duration::from_secs(86_400)),
            },
            "429",
        );
        assert_eq!(b.delay(&huge), Some(MAX_RETRY_AFTER));
        b.succeeded();
        assert_eq!(b.delay(&down), Some(Duration::from_millis(100)));
        for fatal in [
            ErrorKind::Auth,
            ErrorKind::Invalid,
            ErrorKind::File,
            ErrorKind::Refused {
                status: 400,
                errcode: None,
            },
        ] {
            assert_eq!(b.delay(&Error::new(fatal.clone(), "x")), None, "{fatal:?}");
        }
    }
}
