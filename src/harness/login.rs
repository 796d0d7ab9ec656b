//! Credentials and the login park. Decides whether claude has any way to
//! authenticate (an API key or OAuth token in the environment, a token the
//! operator stored through the web page, or a credentials file in the claude
//! config dir), stores an operator's token privately, and implements
//! `wait_for_login`'s resume test: a [`DirSnapshot`] of the claude config dir
//! (newest mtime and file count) that must advance before the harness resumes,
//! so stale credentials already on disk cannot cause a false resume.

use super::settings::Settings;
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::SystemTime;

/// Newest modification time and file count under a directory (two levels deep).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DirSnapshot {
    pub newest: Option<SystemTime>,
    pub files: usize,
}

impl DirSnapshot {
    pub fn take(dir: &Path) -> DirSnapshot {
        let mut snap = DirSnapshot::default();
        snap.walk(dir, 2);
        snap
    }

    fn walk(&mut self, dir: &Path, depth: u32) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                if depth > 0 {
                    self.walk(&e.path(), depth - 1);
                }
                continue;
            }
            self.files += 1;
            // Either axis advancing resumes; mtime may error on some filesystems.
            if let Ok(m) = meta.modified() {
                if self.newest.is_none_or(|n| m > n) {
                    self.newest = Some(m);
                }
            }
        }
    }

    /// Has `self` (taken later) moved on from `earlier`?
    pub fn advanced_from(&self, earlier: &DirSnapshot) -> bool {
        self.files != earlier.files
            || match (self.newest, earlier.newest) {
                (Some(a), Some(b)) => a > b,
                (Some(_), None) => true,
                _ => false,
            }
    }
}

/// A token the operator stored through the web page, if any.
pub fn stored_token(settings: &Settings) -> Option<String> {
    fs::read_to_string(settings.credentials_file())
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Stores an operator's API key or OAuth token (mode 0600, never logged).
pub fn store_token(settings: &Settings, token: &str) -> Result<(), String> {
    let token = token.trim();
    if token.is_empty() || token.contains(char::is_whitespace) || token.len() > 4096 {
        return Err(
            "token must be one word: an API key (sk-ant-api…) or OAuth token (sk-ant-oat…)".into(),
        );
    }
    let path = settings.credentials_file();
    let tmp = path.with_extension("tmp");
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| format!("cannot store the token in {}: {e}", path.display()))?;
    f.write_all(token.as_bytes())
        .and_then(|_| f.sync_all())
        .and_then(|_| fs::rename(&tmp, &path))
        .map_err(|e| format!("cannot store the token in {}: {e}", path.display()))
}

/// The environment that hands a stored token to claude.
pub fn token_env(settings: &Settings) -> Vec<(String, String)> {
    match stored_token(settings) {
        Some(t) if t.starts_with("sk-ant-oat") => {
            vec![("CLAUDE_CODE_OAUTH_TOKEN".into(), t)]
        }
        Some(t) => vec![("ANTHROPIC_API_KEY".into(), t)],
        None => Vec::new(),
    }
}

/// Is there any credential claude could use?
pub fn credentials_available(settings: &Settings) -> bool {
    let env_set = |k: &str| std::env::var(k).is_ok_and(|v| !v.trim().is_empty());
    env_set("ANTHROPIC_API_KEY")
        || env_set("CLAUDE_CODE_OAUTH_TOKEN")
        || env_set("ANTHROPIC_AUTH_TOKEN")
        || stored_token(settings).is_some()
        || settings
            .claude_config_dir
            .join(".credentials.json")
            .is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_advances_on_new_or_newer_files() {
        let dir = std::env::temp_dir().join(format!("hive-snap-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let empty = DirSnapshot::take(&dir);
        assert!(!DirSnapshot::take(&dir).advanced_from(&empty));
        fs::write(dir.join(".credentials.json"), "{}").unwrap();
        let one = DirSnapshot::take(&dir);
        assert!(one.advanced_from(&empty));
        assert!(
            !DirSnapshot::take(&dir).advanced_from(&one),
            "stale files do not resume"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
