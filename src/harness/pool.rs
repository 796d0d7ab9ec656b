//! What identifies the credential the agent's claude runs on, reported to the
//! broker at every spawn (`report_pool`, issue 16) so agents drawing on one
//! account share its usage limit: the account id CLI 2.1.197 writes to
//! `$CLAUDE_CONFIG_DIR/.claude.json` (`oauthAccount.accountUuid`, from the
//! OAuth profile's `account.uuid`), else the SHA-256 of the credential (the
//! operator's stored token, `ANTHROPIC_API_KEY`, `CLAUDE_CODE_OAUTH_TOKEN`,
//! `ANTHROPIC_AUTH_TOKEN`, or the refresh token of `.credentials.json`). The
//! broker keys that digest with the hive's salt and keeps 8 hex digits; the
//! credential itself never leaves this process and is never logged.
//!
//! The turn loop asks for the report before every spawn; a [`PoolCache`]
//! answers from what it computed last while none of the files it read changed
//! (device, inode, size and mtime of each, checked with one `stat` apiece), so
//! a turn on an unchanged credential reads, parses and hashes nothing. The
//! credential variables are this process's environment, which does not change
//! while it runs.

use super::login;
use super::settings::Settings;
use crate::proto::cmd::ReportPool;
use crate::sys::hash::{hex, sha256};
use serde_json::Value;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// The account id of the claude config, if it has one.
fn account_uuid(s: &Settings) -> Option<String> {
    let text = std::fs::read_to_string(s.claude_config_dir.join(".claude.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let id = v.pointer("/oauthAccount/accountUuid")?.as_str()?;
    let ok = !id.is_empty()
        && id.len() <= crate::proto::cmd::MAX_POOL_ID
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    ok.then(|| id.to_string())
}

/// The credential claude would use, in the order it is handed to claude.
fn credential(s: &Settings) -> Option<String> {
    if let Some(t) = login::stored_token(s) {
        return Some(t);
    }
    for k in [
        "ANTHROPIC_API_KEY",
        "CLAUDE_CODE_OAUTH_TOKEN",
        "ANTHROPIC_AUTH_TOKEN",
    ] {
        if let Ok(v) = std::env::var(k) {
            if !v.trim().is_empty() {
                return Some(v.trim().to_string());
            }
        }
    }
    let text = std::fs::read_to_string(s.claude_config_dir.join(".credentials.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    v.pointer("/claudeAiOauth/refreshToken")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
}

/// The pool report for the claude about to start.
pub fn report(s: &Settings) -> ReportPool {
    if let Some(u) = account_uuid(s) {
        return ReportPool {
            account_uuid: Some(u),
            ..ReportPool::default()
        };
    }
    ReportPool {
        credential_sha256: credential(s).map(|c| hex(&sha256(c.as_bytes()))),
        ..ReportPool::default()
    }
}

/// What identifies one file's version: device, inode, size and mtime (ns);
/// `None` when it does not exist or cannot be read.
type Stamp = Option<(u64, u64, u64, i64, i64)>;

fn stamp(path: &std::path::Path) -> Stamp {
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// The files [`report`] reads, in a fixed order.
fn sources(s: &Settings) -> [PathBuf; 3] {
    [
        s.claude_config_dir.join(".claude.json"),
        s.credentials_file(),
        s.claude_config_dir.join(".credentials.json"),
    ]
}

/// [`report`], computed again only when one of the files it reads changed.
#[derive(Default)]
pub struct PoolCache {
    last: Option<([Stamp; 3], ReportPool)>,
    /// Reports computed (not answered from the cache), for the tests.
    computed: u64,
}

impl PoolCache {
    /// The pool report for the claude about to start.
    pub fn report(&mut self, s: &Settings) -> ReportPool {
        let stamps = sources(s).map(|p| stamp(&p));
        if let Some((seen, r)) = &self.last {
            if *seen == stamps {
                return r.clone();
            }
        }
        let r = report(s);
        self.computed += 1;
        self.last = Some((stamps, r.clone()));
        r
    }

    /// How many reports were computed rather than answered from the cache.
    pub fn computed(&self) -> u64 {
        self.computed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::env::Env;

    #[test]
    fn the_report_is_computed_again_only_when_a_credential_file_changes() {
        let dir = std::env::temp_dir().join(format!("hive-pool-cache-{}", std::process::id()));
        let claude = dir.join("claude");
        let lookup = |k: &str| (k == "CLAUDE_CONFIG_DIR").then(|| claude.display().to_string());
        let s = Settings::read(&dir.join("state"), &dir.join("run"), &Env::new(&lookup)).unwrap();
        assert_eq!(s.claude_config_dir, claude);
        std::fs::create_dir_all(&claude).unwrap();
        std::fs::create_dir_all(&s.state_dir).unwrap();
        let stored = |t: &str| std::fs::write(s.credentials_file(), t).unwrap();
        stored("sk-ant-api-one");
        let mut c = PoolCache::default();
        let first = c.report(&s);
        assert_eq!(first, report(&s));
        assert!(first.credential_sha256.is_some(), "{first:?}");
        assert_eq!(c.report(&s), first);
        assert_eq!(c.report(&s), first);
        assert_eq!(c.computed(), 1, "unchanged files are not read again");

        // Another token of the same length written in place (same inode,
        // same size): its mtime moves, and the report follows.
        std::thread::sleep(std::time::Duration::from_millis(20));
        stored("sk-ant-api-two");
        let second = c.report(&s);
        assert_eq!(second, report(&s));
        assert_ne!(second, first, "a new token is a new digest");
        assert_eq!(c.computed(), 2);
        assert_eq!(c.report(&s), second);
        assert_eq!(c.computed(), 2);

        // The account id appears: it wins over every credential.
        std::fs::write(
            claude.join(".claude.json"),
            r#"{"oauthAccount":{"accountUuid":"0b6c-acc"}}"#,
        )
        .unwrap();
        let third = c.report(&s);
        assert_eq!(third.account_uuid.as_deref(), Some("0b6c-acc"));
        assert_eq!(c.computed(), 3);

        // The stored token goes: the report is computed again (and still
        // names the account).
        std::fs::remove_file(s.credentials_file()).unwrap();
        assert_eq!(c.report(&s), third);
        assert_eq!(c.computed(), 4);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
