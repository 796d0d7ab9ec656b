//! How `hive up` reaches an agent's own page, one home for the rule the
//! dashboard and the supervisor's searches share: the page's port is in the
//! port file its harness writes (`DATA/agents/NAME/state/hyperhive-port`), and
//! its token is the fleet entry's `HIVE_WEB_TOKEN`, else the one the harness
//! generated (`…/state/web-token`), else `hive up`'s own `HIVE_WEB_TOKEN`.
//! Both files are the agent's, so they are read as [`read_agent_file`] reads:
//! a small regular file, never through a symlink, never waiting on a FIFO.

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

/// `DATA/agents/NAME/state`.
pub fn state_dir(data: &Path, name: &str) -> PathBuf {
    data.join("agents").join(name).join("state")
}

/// The port `name`'s page listens on, from its port file.
pub fn port(data: &Path, name: &str) -> Option<u16> {
    read_agent_file(&state_dir(data, name).join("hyperhive-port"))
        .and_then(|p| p.trim().parse().ok())
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
                .then(|| read_agent_file(&state_dir(data, name).join(PAGE_TOKEN_FILE)))
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

/// Reads a small file an agent writes (it can replace it with anything): a
/// regular file only, never following a symlink, never blocking on a FIFO, at
/// most 4 KiB.
pub fn read_agent_file(path: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
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
        let state = state_dir(&data, "ana");
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
        std::fs::create_dir_all(&dir).unwrap();
        let (file, fifo, link) = (dir.join("port"), dir.join("fifo"), dir.join("link"));
        std::fs::write(&file, "4242\n").unwrap();
        assert_eq!(read_agent_file(&file).as_deref(), Some("4242\n"));
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success());
        assert_eq!(
            read_agent_file(&fifo),
            None,
            "a FIFO is not read (nor waited on)"
        );
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(read_agent_file(&link), None, "a symlink is not followed");
        assert_eq!(read_agent_file(&dir), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
