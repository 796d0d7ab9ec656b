//! What identifies the credential the agent's claude runs on, reported to the
//! broker at every spawn (`report_pool`, issue 16) so agents drawing on one
//! account share its usage limit: the account id CLI 2.1.197 writes to
//! `$CLAUDE_CONFIG_DIR/.claude.json` (`oauthAccount.accountUuid`, from the
//! OAuth profile's `account.uuid`), else the SHA-256 of the credential (the
//! operator's stored token, `ANTHROPIC_API_KEY`, `CLAUDE_CODE_OAUTH_TOKEN`,
//! `ANTHROPIC_AUTH_TOKEN`, or the refresh token of `.credentials.json`). The
//! broker keys that digest with the hive's salt and keeps 8 hex digits; the
//! credential itself never leaves this process and is never logged.

use super::login;
use super::settings::Settings;
use crate::proto::cmd::ReportPool;
use crate::sys::hash::{hex, sha256};
use serde_json::Value;

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
