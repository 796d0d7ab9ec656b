//! How `hive up` reaches an agent's own page, one home for the rule the
//! dashboard and the supervisor's searches share: the page's port is in the
//! port file its harness writes (`DATA/agents/NAME/state/hyperhive-port`), and
//! its token is the fleet entry's `HIVE_WEB_TOKEN`, else the one the harness
//! generated (`…/state/web-token`), else `hive up`'s own `HIVE_WEB_TOKEN`.
//! Both files are the agent's, so they are read as [`read_agent_file`] reads:
//! a small regular file, reached from the agent's dir without following a
//! symlink on the way, never waiting on a FIFO.

use crate::http::auth::PAGE_TOKEN_FILE;
use crate::proto::AgentConfig;
use std::path::{Path, PathBuf};

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

/// The token of `name`'s page (see the module's rule); `fallback` is `hive
/// up`'s own `HIVE_WEB_TOKEN`.
pub fn token(
    data: &Path,
    entry: Option<&AgentConfig>,
    name: &str,
    fallback: Option<&str>,
) -> Option<String> {
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
        .or_else(|| fallback.and_then(nonblank))
}

/// `name`'s page: its port and token.
pub fn page(data: &Path, entry: Option<&AgentConfig>, name: &str, fallback: Option<&str>) -> Page {
    Page {
        agent: name.to_string(),
        port: if plain_name(name) {
            port(data, name)
        } else {
            None
        },
        token: token(data, entry, name, fallback),
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
    fn the_entrys_token_comes_first_then_the_file_then_hive_ups() {
        let data = std::env::temp_dir().join(format!("hive-pages-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&data);
        let state = agent_dir(&data, "ana").join("state");
        std::fs::create_dir_all(&state).unwrap();
        assert_eq!(token(&data, None, "ana", Some("up")), Some("up".into()));
        std::fs::write(state.join(PAGE_TOKEN_FILE), "made\n").unwrap();
        assert_eq!(token(&data, None, "ana", Some("up")), Some("made".into()));
        let mut entry = AgentConfig::named("ana");
        entry.env.insert("HIVE_WEB_TOKEN".into(), " set ".into());
        assert_eq!(token(&data, Some(&entry), "ana", None), Some("set".into()));
        std::fs::write(state.join("hyperhive-port"), "4242\n").unwrap();
        assert_eq!(page(&data, None, "ana", None).port, Some(4242));
        assert_eq!(page(&data, None, "../x", None).port, None);
        let _ = std::fs::remove_dir_all(&data);
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
        assert_eq!(token(&data, None, "ana", None), None);
        assert_eq!(page(&data, None, "ana", None).port, None);
        assert_eq!(page(&data, None, "bob", None).port, Some(4343));
        let _ = std::fs::remove_dir_all(&data);
    }
}
