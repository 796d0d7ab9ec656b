//! The fleet file's `notify` block (issue 43, item 3): where the broker
//! pushes what needs the operator — `{give_up_days, to: [{url | url_file,
//! events, format, secret_file}]}` — its validation (an unknown event or
//! format is an error naming it), and the start-time reading of its files
//! (`url_file`, `secret_file`: a secret file must be mode 0600). A URL is
//! shown and logged as its scheme and host only ([`shown_url`]).
//! Documented in `docs/config.md`.

use serde::{Deserialize, Serialize};
use std::path::Path;

/// The `notify` key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifySection {
    /// Days a notification is tried before it is dropped and counted
    /// ([`NotifySection::DEFAULT_GIVE_UP_DAYS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub give_up_days: Option<u32>,
    /// The destinations.
    #[serde(default)]
    pub to: Vec<NotifyTo>,
}

/// One destination of the `notify.to` list.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyTo {
    /// The URL, written in the fleet file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// A file holding the URL (it carries a token: Slack's, ntfy's), read
    /// when the broker starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_file: Option<String>,
    /// The events sent there ([`EVENTS`]); none given, every one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    /// `json` (the default), `ntfy` or `slack`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// The key the `json` format signs with: a file of mode 0600 holding a
    /// `whsec_`+base64 secret (Standard Webhooks) or any other bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<String>,
}

/// Every event a destination may ask for.
pub const EVENTS: &[&str] = &[
    "question",
    "approval",
    "needs_login",
    "dead_letter",
    "budget",
    "usage_limit",
    "agent_crashed",
    "message_to_operator",
];

/// How a notification is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The documented JSON schema, signed (Standard Webhooks).
    Json,
    /// ntfy: a text body with `Title`, `Priority` and `Tags` headers.
    Ntfy,
    /// A Slack incoming webhook: `{"text": …}`.
    Slack,
}

impl Format {
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "json" => Some(Format::Json),
            "ntfy" => Some(Format::Ntfy),
            "slack" => Some(Format::Slack),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Ntfy => "ntfy",
            Format::Slack => "slack",
        }
    }
}

/// One destination as the broker uses it: files read, names checked.
#[derive(Clone, PartialEq, Eq)]
pub struct Destination {
    /// The stable key of its queue in `broker.db`: a digest of its URL and
    /// format (never the URL itself).
    pub key: String,
    pub url: String,
    /// The URL as shown and logged: scheme and host.
    pub shown: String,
    pub format: Format,
    /// The events it takes.
    pub events: Vec<String>,
    /// The signing key (`json`), never logged.
    pub secret: Option<Vec<u8>>,
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Neither the URL's path (a token) nor the secret.
        write!(f, "Destination({} {})", self.format.name(), self.shown)
    }
}

impl NotifySection {
    pub const DEFAULT_GIVE_UP_DAYS: u32 = 7;
    const MAX_GIVE_UP_DAYS: u32 = 365;

    pub fn give_up_days(&self) -> u32 {
        self.give_up_days.unwrap_or(Self::DEFAULT_GIVE_UP_DAYS)
    }

    /// The rules that need no file: names, one URL source each, the range
    /// of `give_up_days`.
    pub fn check(&self) -> Result<(), String> {
        if let Some(d) = self.give_up_days {
            if d == 0 || d > Self::MAX_GIVE_UP_DAYS {
                return Err(format!(
                    "notify.give_up_days: from 1 to {} (days a notification is tried)",
                    Self::MAX_GIVE_UP_DAYS
                ));
            }
        }
        for (i, t) in self.to.iter().enumerate() {
            let at = format!("notify.to[{i}]");
            match (&t.url, &t.url_file) {
                (Some(_), Some(_)) => {
                    return Err(format!("{at}: give url or url_file, not both"))
                }
                (None, None) => {
                    return Err(format!(
                        "{at}: no url; give url, or url_file naming a file that holds it"
                    ))
                }
                (Some(u), None) => {
                    check_url(u).map_err(|e| format!("{at}.url: {e}"))?;
                }
                (None, Some(_)) => {}
            }
            for e in &t.events {
                if !EVENTS.contains(&e.as_str()) {
                    return Err(format!(
                        "{at}.events: unknown event {}; the events are {}",
                        crate::proto::text::excerpt(e),
                        EVENTS.join(", ")
                    ));
                }
            }
            let format = match &t.format {
                None => Format::Json,
                Some(f) => Format::parse(f).ok_or_else(|| {
                    format!(
                        "{at}.format: unknown format {}; the formats are json, ntfy, slack",
                        crate::proto::text::excerpt(f)
                    )
                })?,
            };
            if format != Format::Json && t.secret_file.is_some() {
                return Err(format!(
                    "{at}.secret_file: only the json format is signed; remove it or use format json"
                ));
            }
        }
        Ok(())
    }

    /// The destinations with their files read (at the broker's start): a
    /// `url_file` or `secret_file` that cannot be read, a secret file not of
    /// mode 0600, or an empty one, is an error naming the file. Relative
    /// paths are taken from `base` (the fleet file's directory).
    pub fn destinations(&self, base: Option<&Path>) -> Result<Vec<Destination>, String> {
        self.check()?;
        let mut out = Vec::new();
        for (i, t) in self.to.iter().enumerate() {
            let at = format!("notify.to[{i}]");
            let url = match (&t.url, &t.url_file) {
                (Some(u), _) => u.clone(),
                (None, Some(f)) => {
                    let path = resolve(base, f);
                    let text = read_private(&path, false)
                        .map_err(|e| format!("{at}.url_file: {e}"))?;
                    let url = String::from_utf8(text)
                        .map_err(|_| {
                            format!("{at}.url_file: {} is not UTF-8 text", path.display())
                        })?
                        .trim()
                        .to_string();
                    check_url(&url).map_err(|e| {
                        format!("{at}.url_file: the URL in {}: {e}", path.display())
                    })?;
                    url
                }
                (None, None) => unreachable!("checked above"),
            };
            let format = t
                .format
                .as_deref()
                .and_then(Format::parse)
                .unwrap_or(Format::Json);
            let secret = match &t.secret_file {
                None => None,
                Some(f) => {
                    let path = resolve(base, f);
                    let raw = read_private(&path, true)
                        .map_err(|e| format!("{at}.secret_file: {e}"))?;
                    Some(secret_key(&raw).map_err(|e| {
                        format!("{at}.secret_file: {}: {e}", path.display())
                    })?)
                }
            };
            let events = if t.events.is_empty() {
                EVENTS.iter().map(|e| e.to_string()).collect()
            } else {
                t.events.clone()
            };
            let key = {
                let digest = crate::broker::notify::sign::sha256(
                    format!("{}\n{url}", format.name()).as_bytes(),
                );
                digest[..8].iter().map(|b| format!("{b:02x}")).collect()
            };
            out.push(Destination {
                key,
                shown: shown_url(&url),
                url,
                format,
                events,
                secret,
            });
        }
        Ok(out)
    }
}

fn resolve(base: Option<&Path>, f: &str) -> std::path::PathBuf {
    let p = Path::new(f);
    match base {
        Some(b) if p.is_relative() => b.join(p),
        _ => p.to_path_buf(),
    }
}

/// Reads `path`; with `secret`, only a regular file of mode 0600 (or
/// stricter: 0400) is taken.
fn read_private(path: &Path, secret: bool) -> Result<Vec<u8>, String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("cannot read {} ({e})", path.display()))?;
    if secret && meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is mode {:04o}; a secret file must be readable by its owner only: chmod 600 {}",
            path.display(),
            meta.permissions().mode() & 0o777,
            path.display()
        ));
    }
    let data =
        std::fs::read(path).map_err(|e| format!("cannot read {} ({e})", path.display()))?;
    if data.iter().all(u8::is_ascii_whitespace) {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(data)
}

/// The signing key in a secret file: `whsec_` and base64 (the Standard
/// Webhooks form) is the decoded bytes; anything else is the file's bytes,
/// trailing whitespace cut.
pub fn secret_key(raw: &[u8]) -> Result<Vec<u8>, String> {
    let text = String::from_utf8_lossy(raw);
    let text = text.trim();
    if let Some(b64) = text.strip_prefix("whsec_") {
        return crate::broker::notify::sign::base64_decode(b64)
            .filter(|k| !k.is_empty())
            .ok_or_else(|| "the text after whsec_ is not base64".to_string());
    }
    let mut raw = raw.to_vec();
    while raw.last().is_some_and(u8::is_ascii_whitespace) {
        raw.pop();
    }
    Ok(raw)
}

/// An `http://` or `https://` URL with a host.
fn check_url(u: &str) -> Result<(), String> {
    let rest = u
        .strip_prefix("https://")
        .or_else(|| u.strip_prefix("http://"))
        .ok_or_else(|| format!("{} is not an http:// or https:// URL", shown_url(u)))?;
    if rest.is_empty() || rest.starts_with('/') || u.chars().any(char::is_whitespace) {
        return Err(format!("{} has no host", shown_url(u)));
    }
    Ok(())
}

/// A URL as it may be shown or logged: its scheme and host (and port),
/// never its path, query or credentials.
pub fn shown_url(u: &str) -> String {
    let Some((scheme, rest)) = u.split_once("://") else {
        return "(not a URL)".into();
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or("");
    let clean = |s: &str| {
        s.chars()
            .filter(|c| c.is_ascii_alphanumeric() || "-.:[]".contains(*c))
            .take(100)
            .collect::<String>()
    };
    format!("{}://{}", clean(scheme), clean(host))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::HiveConfig;
    use std::os::unix::fs::PermissionsExt;

    fn parse(notify: &str) -> Result<HiveConfig, String> {
        HiveConfig::parse(&format!(r#"{{"agents":[{{"name":"ana"}}],"notify":{notify}}}"#))
    }

    #[test]
    fn unknown_events_and_formats_are_errors_naming_them() {
        let e = parse(r#"{"to":[{"url":"http://h/x","events":["question","questoin"]}]}"#)
            .unwrap_err();
        assert!(e.contains("notify.to[0].events: unknown event \"questoin\""), "{e}");
        let e = parse(r#"{"to":[{"url":"http://h/x","format":"teams"}]}"#).unwrap_err();
        assert!(e.contains("notify.to[0].format: unknown format \"teams\""), "{e}");
        let e = parse(r#"{"to":[{"url":"ftp://h/x"}]}"#).unwrap_err();
        assert!(e.contains("notify.to[0].url: ftp://h is not an http"), "{e}");
        let e = parse(r#"{"to":[{}]}"#).unwrap_err();
        assert!(e.contains("notify.to[0]: no url"), "{e}");
        let e = parse(r#"{"give_up_days":0,"to":[]}"#).unwrap_err();
        assert!(e.contains("notify.give_up_days: from 1"), "{e}");
        let e = parse(r#"{"to":[{"url":"http://h/","format":"slack","secret_file":"s"}]}"#)
            .unwrap_err();
        assert!(e.contains("only the json format is signed"), "{e}");
        let cfg = parse(r#"{"to":[{"url":"https://h.example:8443/hook"}]}"#).unwrap();
        let n = cfg.notify.unwrap();
        assert_eq!(n.give_up_days(), 7);
        let d = n.destinations(None).unwrap();
        assert_eq!(d[0].events.len(), EVENTS.len(), "no events: all of them");
        assert_eq!(d[0].format, Format::Json);
        assert_eq!(d[0].shown, "https://h.example:8443");
    }

    #[test]
    fn secret_files_must_be_private_and_url_files_are_read_at_start() {
        let dir = std::env::temp_dir().join(format!("hive-notify-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret");
        std::fs::write(&secret, "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw\n").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o644)).unwrap();
        let urlf = dir.join("url");
        std::fs::write(&urlf, "https://hooks.slack.example/services/T0/B0/sekrit\n").unwrap();
        let n: NotifySection = serde_json::from_str(
            r#"{"to":[{"url":"http://127.0.0.1:9/h","secret_file":"secret"},
                      {"url_file":"url","format":"slack"}]}"#,
        )
        .unwrap();
        let e = n.destinations(Some(&dir)).unwrap_err();
        assert!(e.contains("notify.to[0].secret_file"), "{e}");
        assert!(e.contains(&secret.display().to_string()), "names the file: {e}");
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let d = n.destinations(Some(&dir)).unwrap();
        assert_eq!(d[0].secret.as_ref().unwrap().len(), 24, "whsec_ is base64");
        assert_eq!(d[1].url, "https://hooks.slack.example/services/T0/B0/sekrit");
        assert_eq!(d[1].shown, "https://hooks.slack.example");
        let dbg = format!("{:?}", d);
        assert!(!dbg.contains("sekrit") && !dbg.contains("MfKQ"), "{dbg}");
        std::fs::remove_file(&urlf).unwrap();
        let e = n.destinations(Some(&dir)).unwrap_err();
        assert!(e.contains("notify.to[1].url_file: cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn shown_urls_keep_scheme_and_host_only() {
        assert_eq!(
            shown_url("https://user:pw@ntfy.sh/topic?auth=x"),
            "https://ntfy.sh"
        );
        assert_eq!(shown_url("http://127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(shown_url("garbage"), "(not a URL)");
    }
}
