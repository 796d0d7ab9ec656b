//! How `hive up` reaches an agent's own page, one home for the rule the
//! dashboard and the supervisor's searches share: the page's port is in the
//! port file its harness writes (`DATA/agents/NAME/state/hyperhive-port`), and
//! its token is the fleet entry's `HIVE_WEB_TOKEN`, else the one the harness
//! generated (`…/state/web-token`), else none: `hive up` never sends a token
//! of its own (its `HIVE_WEB_TOKEN` is the operator's) to a page whose agent
//! removed its file, and shows such a page as unavailable ([`no_token`]).
//! Both files are the agent's, so they are read as [`read_agent_file`] reads:
//! a small regular file, reached from the agent's dir without following a
//! symlink on the way, never waiting on a FIFO. Every answer read from a page
//! is bounded too ([`fetch`]): past its bound it is dropped, with a log line,
//! so a page cannot raise `hive up`'s memory.

use crate::http::auth::PAGE_TOKEN_FILE;
use crate::proto::AgentConfig;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The most bytes `hive up` reads of one small answer of a page: its
/// `/api/state`, `/api/dashboard-links` or `/icon`.
pub const MAX_ANSWER: u64 = 256 * 1024;

/// An agent's page as `hive up` reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub agent: String,
    /// None while its harness has not written its port.
    pub port: Option<u16>,
    pub token: Option<String>,
}

/// `DATA/agents/NAME`, the agent's own dir.
pub fn agent_dir(data: &Path, name: &str) -> PathBuf {
    data.join("agents").join(name)
}

/// `file` of `name`'s state dir, as the agent wrote it ([`read_agent_file`]).
pub fn state_file(data: &Path, name: &str, file: &str) -> Option<String> {
    read_agent_file(&agent_dir(data, name), &Path::new("state").join(file))
}

/// The port `name`'s page listens on, from its port file.
pub fn port(data: &Path, name: &str) -> Option<u16> {
    state_file(data, name, "hyperhive-port").and_then(|p| p.trim().parse().ok())
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

/// `GET path` on `name`'s page at `port` with `token` through `http`: the
/// status and the body. A body over `max` bytes is dropped (not read past
/// `max`) with a log line naming the page, and is an error.
pub fn fetch(
    http: &ureq::Agent,
    name: &str,
    port: u16,
    path: &str,
    token: Option<&str>,
    max: u64,
) -> Result<(u16, Vec<u8>), String> {
    let mut req = http.get(&format!("http://127.0.0.1:{port}{path}"));
    if let Some(t) = token {
        req = req.set("X-Hive-Token", t);
    }
    let resp = match req.call() {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return Err(format!("its page did not answer: {e}")),
    };
    let status = resp.status();
    let said = resp
        .header("Content-Length")
        .and_then(|l| l.trim().parse::<u64>().ok());
    let mut body = Vec::new();
    if said.is_none_or(|n| n <= max) {
        resp.into_reader()
            .take(max + 1)
            .read_to_end(&mut body)
            .map_err(|e| format!("cannot read its page's answer: {e}"))?;
    }
    if said.is_some_and(|n| n > max) || body.len() as u64 > max {
        log::warn!(
            "{name}'s page answered {} with more than {max} bytes; dropped",
            path.split('?').next().unwrap_or(path)
        );
        return Err(format!("its page's answer is over {max} bytes; dropped"));
    }
    Ok((status, body))
}

/// `name`'s page: its port and token.
pub fn page(data: &Path, entry: Option<&AgentConfig>, name: &str) -> Page {
    Page {
        agent: name.to_string(),
        port: if plain_name(name) {
            port(data, name)
        } else {
            None
        },
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
        std::fs::write(state.join("hyperhive-port"), "4242\n").unwrap();
        assert_eq!(page(&data, None, "ana").port, Some(4242));
        assert_eq!(page(&data, None, "../x").port, None);
        let _ = std::fs::remove_dir_all(&data);
    }

    /// A page stand-in on 127.0.0.1 that answers every request with `head`
    /// and then `body_len` bytes of `x` (as fast as they are read).
    fn page_answering(head: String, body_len: usize) -> u16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
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
        port
    }

    #[test]
    fn an_answer_over_its_bound_is_dropped_unread() {
        let http = ureq::AgentBuilder::new()
            .timeout(std::time::Duration::from_secs(10))
            .build();
        let big = 64 << 20;
        // With a Content-Length that says so, and without one (read to the
        // bound, then dropped).
        for head in [
            format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {big}\r\n\r\n"),
            "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n".to_string(),
        ] {
            let port = page_answering(head, big);
            let e = fetch(&http, "ana", port, "/api/state", None, MAX_ANSWER).unwrap_err();
            assert!(e.contains("over 262144 bytes"), "{e}");
        }
        let small = "HTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\n\r\n".to_string();
        let port = page_answering(small, 2);
        assert_eq!(
            fetch(&http, "ana", port, "/api/state", Some("t"), MAX_ANSWER).unwrap(),
            (401, b"xx".to_vec())
        );
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
        std::fs::write(other.join("hyperhive-port"), "4343\n").unwrap();
        std::fs::create_dir_all(data.join("agents/ana")).unwrap();
        std::os::unix::fs::symlink(&other, agent_dir(&data, "ana").join("state")).unwrap();
        assert_eq!(token(&data, None, "ana"), None);
        assert_eq!(page(&data, None, "ana").port, None);
        assert_eq!(page(&data, None, "bob").port, Some(4343));
        let _ = std::fs::remove_dir_all(&data);
    }
}
