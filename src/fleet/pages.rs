//! How `hive up` reaches an agent's own page, one home for the rule the
//! dashboard and the supervisor's searches share: the page listens on a unix
//! socket `hive up` made and keeps (`DATA/run/pages/NAME.sock`,
//! [`socket_path`]; the harness inherits it, and no sandbox shows it), so
//! nothing the agent writes says where `hive up` or the operator's browser
//! goes. Its token is the fleet entry's `HIVE_WEB_TOKEN`, else the one the
//! harness generated (`…/state/web-token`), else none: `hive up` never sends a
//! token of its own (its `HIVE_WEB_TOKEN` is the operator's) to a page whose
//! agent removed its file, and shows such a page as unavailable ([`no_token`]).
//! The token file is the agent's, so it is read as [`read_agent_file`] reads:
//! a small regular file, reached from the agent's dir without following a
//! symlink on the way, never waiting on a FIFO. Every answer read from a page
//! is bounded too ([`fetch`]): past its bound it is dropped, with a log line,
//! so a page cannot raise `hive up`'s memory.

use crate::http::auth::PAGE_TOKEN_FILE;
use crate::proto::AgentConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The most bytes `hive up` reads of one small answer of a page: its
/// `/api/state`, `/api/dashboard-links` or `/icon`.
pub const MAX_ANSWER: u64 = 256 * 1024;

/// An agent's page as `hive up` reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub agent: String,
    /// Its socket; None while its harness does not run.
    pub socket: Option<PathBuf>,
    pub token: Option<String>,
}

/// `DATA/agents/NAME`, the agent's own dir.
pub fn agent_dir(data: &Path, name: &str) -> PathBuf {
    data.join("agents").join(name)
}

/// `RUN/pages/NAME.sock`: the socket of `name`'s page, under `hive up`'s run
/// dir (`DATA/run`), in a directory of its own that no sandbox shows.
pub fn socket_path(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join("pages").join(format!("{name}.sock"))
}

/// `file` of `name`'s state dir, as the agent wrote it ([`read_agent_file`]).
pub fn state_file(data: &Path, name: &str, file: &str) -> Option<String> {
    read_agent_file(&agent_dir(data, name), &Path::new("state").join(file))
}

/// The token of `name`'s page (see the module's rule); None when neither its
/// fleet entry nor its token file names one.
pub fn token(data: &Path, entry: Option<&AgentConfig>, name: &str) -> Option<String> {
    let nonblank = |t: &str| {
        let t = t.trim();
        (!t.is_empty()).then(|| t.to_string())
    };
    entry
        .and_then(|e| e.env.get("HIVE_WEB_TOKEN"))
        .and_then(|t| nonblank(t))
        .or_else(|| {
            plain_name(name)
                .then(|| state_file(data, name, PAGE_TOKEN_FILE))
                .flatten()
                .and_then(|t| nonblank(&t))
        })
}

/// Why `name`'s page, which wants a token, cannot be read: `hive up` has
/// none for it.
pub fn no_token(name: &str) -> String {
    format!(
        "its page is unavailable: it wants a token and hive up has none for it \
         (DATA/agents/{name}/state/web-token is missing or unreadable; `hive restart {name}` \
         makes a new one)"
    )
}

/// `GET path` on `name`'s page at `socket` with `token`, each read waiting
/// at most `wait`: the status and the body. A body over `max` bytes is
/// dropped (not read past `max`) with a log line naming the page, and is an
/// error.
pub fn fetch(
    socket: &Path,
    name: &str,
    path: &str,
    token: Option<&str>,
    max: u64,
    wait: Duration,
) -> Result<(u16, Vec<u8>), String> {
    let headers: Vec<(&str, &str)> = token.map(|t| ("X-Hive-Token", t)).into_iter().collect();
    let answer = super::proxy::request(socket, "GET", path, &headers, &[], wait)
        .map_err(|e| format!("its page did not answer: {e}"))?;
    let status = answer.status;
    answer.read_body(max).map(|b| (status, b)).inspect_err(|_| {
        log::warn!(
            "{name}'s page answered {} with more than {max} bytes; dropped",
            path.split('?').next().unwrap_or(path)
        );
    })
}

/// `name`'s page: its socket (when `running`) and token.
pub fn page(
    data: &Path,
    run_dir: &Path,
    entry: Option<&AgentConfig>,
    name: &str,
    running: bool,
) -> Page {
    Page {
        agent: name.to_string(),
        socket: (running && plain_name(name)).then(|| socket_path(run_dir, name)),
        token: token(data, entry, name),
    }
}

/// True for a name that can be a directory under `DATA/agents`.
pub fn plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

/// Reads a small file an agent writes (it can replace it with anything),
/// `rel` inside the agent's dir `agent_dir` (`DATA/agents/NAME`, which the
/// agent cannot replace: its view of `DATA/agents` is read-only): a regular
/// file only, reached without following a symlink on the way — the agent can
/// swap its `state` dir for a symlink to another agent's at any moment
/// ([`crate::sys::fd::open_beneath`]) —, never blocking on a FIFO, at most
/// 4 KiB.
pub fn read_agent_file(agent_dir: &Path, rel: &Path) -> Option<String> {
    use std::io::Read;
    let f = crate::sys::fd::open_beneath(agent_dir, rel, libc::O_NONBLOCK).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    f.take(4096).read_to_string(&mut text).ok()?;
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entrys_token_comes_first_then_the_file_and_nothing_else() {
        let data = std::env::temp_dir().join(format!("hive-pages-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        let state = agent_dir(&data, "ana").join("state");
        std::fs::create_dir_all(&state).unwrap();
        assert_eq!(token(&data, None, "ana"), None, "no token of hive up's own");
        std::fs::write(state.join(PAGE_TOKEN_FILE), "made\n").unwrap();
        assert_eq!(token(&data, None, "ana"), Some("made".into()));
        let mut entry = AgentConfig::named("ana");
        entry.env.insert("HIVE_WEB_TOKEN".into(), " set ".into());
        assert_eq!(token(&data, Some(&entry), "ana"), Some("set".into()));
        let run = data.join("run");
        assert_eq!(
            page(&data, &run, None, "ana", true).socket,
            Some(run.join("pages/ana.sock"))
        );
        assert_eq!(page(&data, &run, None, "ana", false).socket, None);
        assert_eq!(page(&data, &run, None, "../x", true).socket, None);
        let _ = std::fs::remove_dir_all(&data);
    }

    /// A page stand-in on a unix socket at `path` that answers every
    /// request with `head` and then `body_len` bytes of `x` (as fast as they
    /// are read).
    fn page_answering(path: &Path, head: String, body_len: usize) {
        let _ = std::fs::remove_file(path);
        let l = std::os::unix::net::UnixListener::bind(path).unwrap();
        std::thread::spawn(move || {
            for mut conn in l.incoming().flatten() {
                use std::io::{BufRead, Write};
                let mut r = std::io::BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let _ = conn.write_all(head.as_bytes());
                let chunk = [b'x'; 64 * 1024];
                let mut left = body_len;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if conn.write_all(&chunk[..n]).is_err() {
                        break;
                    }
                    left -= n;
                }
            }
        });
    }

    #[test]
    fn an_answer_over_its_bound_is_dropped_unread() {
        let dir = std::env::temp_dir().join(format!("hive-pages-big-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let wait = Duration::from_secs(10);
        let big = 64 << 20;
        // With a Content-Length that says so, and without one (read to the
        // bound, then dropped).
        for (i, head) in [
            format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {big}\r\n\r\n"),
            "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n".to_string(),
        ]
        .into_iter()
        .enumerate()
        {
            let sock = dir.join(format!("big{i}.sock"));
            page_answering(&sock, head, big);
            let e = fetch(&sock, "ana", "/api/state", None, MAX_ANSWER, wait).unwrap_err();
            assert!(e.contains("over 262144 bytes"), "{e}");
        }
        let small = "HTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\n\r\n".to_string();
        let sock = dir.join("small.sock");
        page_answering(&sock, small, 2);
        assert_eq!(
            fetch(&sock, "ana", "/api/state", Some("t"), MAX_ANSWER, wait).unwrap(),
            (401, b"xx".to_vec())
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_agents_file_is_read_only_when_it_is_a_small_regular_file() {
        let dir = std::env::temp_dir().join(format!("hive-agentfile-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let read = |rel: &str| read_agent_file(&dir, Path::new(rel));
        std::fs::write(dir.join("port"), "4242\n").unwrap();
        assert_eq!(read("port").as_deref(), Some("4242\n"));
        assert!(std::process::Command::new("mkfifo")
            .arg(dir.join("fifo"))
            .status()
            .unwrap()
            .success());
        assert_eq!(read("fifo"), None, "a FIFO is not read (nor waited on)");
        std::os::unix::fs::symlink(dir.join("port"), dir.join("link")).unwrap();
        assert_eq!(read("link"), None, "a symlink is not followed");
        assert_eq!(read("sub"), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// An agent that points its `state` dir at another agent's: `hive up`
    /// reads neither that agent's port nor its token for it.
    #[test]
    fn a_state_dir_swapped_for_a_symlink_is_not_followed() {
        let data = std::env::temp_dir().join(format!("hive-pages-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        let other = agent_dir(&data, "bob").join("state");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join(PAGE_TOKEN_FILE), "bobs-token\n").unwrap();
        std::fs::create_dir_all(data.join("agents/ana")).unwrap();
        std::os::unix::fs::symlink(&other, agent_dir(&data, "ana").join("state")).unwrap();
        assert_eq!(token(&data, None, "ana"), None);
        assert_eq!(token(&data, None, "bob"), Some("bobs-token".into()));
        let _ = std::fs::remove_dir_all(&data);
    }
}
