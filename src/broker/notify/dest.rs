//! The `notify` destinations as the sender uses them: the fleet file's
//! `notify.to` entries (`config::notify`) with their files read when the
//! broker starts — a `url_file`, and a `secret_file` that must be mode 0600
//! or stricter; each error names the entry and the file — and a stable key
//! per destination for its queue in `broker.db`. Neither the URL's path nor
//! the key is ever in a log line or a `Debug` form.

use crate::config::notify::{check_url, shown_url, Format, NotifySection, EVENTS};
use std::path::Path;

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

/// The destinations of `section`, their files read; relative paths are
/// taken from `base` (the fleet file's directory).
pub fn destinations(
    section: &NotifySection,
    base: Option<&Path>,
) -> Result<Vec<Destination>, String> {
    section.check()?;
    let mut out = Vec::new();
    for (i, t) in section.to.iter().enumerate() {
        let at = format!("notify.to[{i}]");
        let url = match (&t.url, &t.url_file) {
            (Some(u), _) => u.clone(),
            (None, Some(f)) => {
                let path = resolve(base, f);
                let text = read_private(&path, false).map_err(|e| format!("{at}.url_file: {e}"))?;
                let url = String::from_utf8(text)
                    .map_err(|_| format!("{at}.url_file: {} is not UTF-8 text", path.display()))?
                    .trim()
                    .to_string();
                check_url(&url)
                    .map_err(|e| format!("{at}.url_file: the URL in {}: {e}", path.display()))?;
                url
            }
            (None, None) => {
                return Err(format!(
                    "{at}: no url; give url, or url_file naming a file that holds it"
                ))
            }
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
                let raw =
                    read_private(&path, true).map_err(|e| format!("{at}.secret_file: {e}"))?;
                Some(
                    secret_key(&raw)
                        .map_err(|e| format!("{at}.secret_file: {}: {e}", path.display()))?,
                )
            }
        };
        let events = if t.events.is_empty() {
            EVENTS.iter().map(|e| e.to_string()).collect()
        } else {
            t.events.clone()
        };
        let key = {
            let digest = crate::sys::hash::sha256(format!("{}\n{url}", format.name()).as_bytes());
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
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {} ({e})", path.display()))?;
    if secret && meta.permissions().mode() & 0o077 != 0 {
        return Err(format!(
            "{} is mode {:04o}; a secret file must be readable by its owner only: chmod 600 {}",
            path.display(),
            meta.permissions().mode() & 0o777,
            path.display()
        ));
    }
    let data = std::fs::read(path).map_err(|e| format!("cannot read {} ({e})", path.display()))?;
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
        return super::sign::base64_decode(b64)
            .filter(|k| !k.is_empty())
            .ok_or_else(|| "the text after whsec_ is not base64".to_string());
    }
    let mut raw = raw.to_vec();
    while raw.last().is_some_and(u8::is_ascii_whitespace) {
        raw.pop();
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn no_events_is_every_event_and_the_url_shows_as_scheme_and_host() {
        let n: NotifySection =
            serde_json::from_str(r#"{"to":[{"url":"https://h.example:8443/hook"}]}"#).unwrap();
        let d = destinations(&n, None).unwrap();
        assert_eq!(d[0].events.len(), EVENTS.len(), "no events: all of them");
        assert_eq!(d[0].format, Format::Json);
        assert_eq!(d[0].shown, "https://h.example:8443");
        assert_eq!(d[0].key.len(), 16);
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
        let e = destinations(&n, Some(&dir)).unwrap_err();
        assert!(e.contains("notify.to[0].secret_file"), "{e}");
        assert!(
            e.contains(&secret.display().to_string()),
            "names the file: {e}"
        );
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let d = destinations(&n, Some(&dir)).unwrap();
        assert_eq!(d[0].secret.as_ref().unwrap().len(), 24, "whsec_ is base64");
        assert_eq!(
            d[1].url,
            "https://hooks.slack.example/services/T0/B0/sekrit"
        );
        assert_eq!(d[1].shown, "https://hooks.slack.example");
        let dbg = format!("{:?}", d);
        assert!(!dbg.contains("sekrit") && !dbg.contains("MfKQ"), "{dbg}");
        std::fs::remove_file(&urlf).unwrap();
        let e = destinations(&n, Some(&dir)).unwrap_err();
        assert!(e.contains("notify.to[1].url_file: cannot read"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
