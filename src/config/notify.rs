//! The fleet file's `notify` block (issue 43, item 3): where the broker
//! pushes what needs the operator — `{give_up_days, to: [{url | url_file,
//! events, format, secret_file}]}` — its validation (an unknown event or
//! format is an error naming it) — the
//! rules that need no file; the files (`url_file`, `secret_file`) are read
//! by the broker when it starts (`broker/notify/dest.rs`). A URL is shown
//! and logged as its scheme and host only ([`shown_url`]).
//! Documented in `docs/config.md`.

use serde::{Deserialize, Serialize};

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
                (Some(_), Some(_)) => return Err(format!("{at}: give url or url_file, not both")),
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
}

/// An `http://` or `https://` URL with a host.
pub fn check_url(u: &str) -> Result<(), String> {
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

    fn parse(notify: &str) -> Result<HiveConfig, String> {
        HiveConfig::parse(&format!(
            r#"{{"agents":[{{"name":"ana"}}],"notify":{notify}}}"#
        ))
    }

    #[test]
    fn unknown_events_and_formats_are_errors_naming_them() {
        let e =
            parse(r#"{"to":[{"url":"http://h/x","events":["question","questoin"]}]}"#).unwrap_err();
        assert!(
            e.contains("notify.to[0].events: unknown event \"questoin\""),
            "{e}"
        );
        let e = parse(r#"{"to":[{"url":"http://h/x","format":"teams"}]}"#).unwrap_err();
        assert!(
            e.contains("notify.to[0].format: unknown format \"teams\""),
            "{e}"
        );
        let e = parse(r#"{"to":[{"url":"ftp://h/x"}]}"#).unwrap_err();
        assert!(
            e.contains("notify.to[0].url: ftp://h is not an http"),
            "{e}"
        );
        let e = parse(r#"{"to":[{}]}"#).unwrap_err();
        assert!(e.contains("notify.to[0]: no url"), "{e}");
        let e = parse(r#"{"give_up_days":0,"to":[]}"#).unwrap_err();
        assert!(e.contains("notify.give_up_days: from 1"), "{e}");
        let e = parse(r#"{"to":[{"url":"http://h/","format":"slack","secret_file":"s"}]}"#)
            .unwrap_err();
        assert!(e.contains("only the json format is signed"), "{e}");
        let cfg = parse(r#"{"to":[{"url":"https://h.example:8443/hook"}]}"#).unwrap();
        assert_eq!(cfg.notify.unwrap().give_up_days(), 7);
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
