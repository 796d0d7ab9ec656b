//! The Matrix secrets on disk and in memory: [`Secret`] holds a password or an
//! access token and never shows it (its `Debug` prints a placeholder, and it has
//! no `Display`); [`read_secret_file`] reads a password or token file; and
//! [`TokenFile`] keeps the access token of a password login in a 0600 file, with
//! the homeserver, user and device it belongs to, so that the next start reuses
//! it instead of minting a new one (and never sends it to another homeserver).

use super::error::{Error, ErrorKind};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A password or an access token. Only [`Secret::expose`] gives the text, for
/// the one place it is sent.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<hidden>)")
    }
}

/// The secret in `path` (`what` names it in errors, e.g. "the Matrix password
/// file"), without its trailing newline. An empty file is an error.
pub fn read_secret_file(path: &Path, what: &str) -> Result<Secret, Error> {
    let shown = path.display();
    let text = fs::read_to_string(path)
        .map_err(|e| Error::new(ErrorKind::File, format!("cannot read {what} {shown}: {e}")))?;
    let text = text.trim_end_matches(['\n', '\r']);
    if text.trim().is_empty() {
        return Err(Error::new(
            ErrorKind::File,
            format!("{what} {shown} is empty: put the secret on its first line"),
        ));
    }
    Ok(Secret::new(text))
}

/// What a token file holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredToken {
    /// The homeserver base URL the token was minted by; it is only ever sent
    /// there.
    pub homeserver: String,
    pub user_id: String,
    pub device_id: String,
    pub access_token: Secret,
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// The file where the access token of a password login is kept (JSON, mode
/// 0600 whatever the umask, replaced whole through a temporary file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenFile(PathBuf);

impl TokenFile {
    pub fn new(path: impl Into<PathBuf>) -> TokenFile {
        TokenFile(path.into())
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The stored token, or None when there is none or the file is not one
    /// this client wrote (it is then replaced at the next login). An existing
    /// file is made 0600 again.
    pub fn load(&self) -> Result<Option<StoredToken>, Error> {
        let shown = self.0.display();
        let text = match fs::read_to_string(&self.0) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(Error::new(
                    ErrorKind::File,
                    format!("cannot read the Matrix access token file {shown}: {e}"),
                ))
            }
        };
        fs::set_permissions(&self.0, fs::Permissions::from_mode(0o600)).map_err(|e| {
            Error::new(
                ErrorKind::File,
                format!("cannot make the Matrix access token file {shown} private (0600): {e}"),
            )
        })?;
        match serde_json::from_str::<StoredToken>(&text) {
            Ok(stored) if !stored.access_token.expose().is_empty() => Ok(Some(stored)),
            Ok(_) | Err(_) => {
                log::warn!(
                    "matrix: {shown} holds no access token this client wrote; \
                     logging in with the password replaces it"
                );
                Ok(None)
            }
        }
    }

    /// Writes `token` whole: a reader sees the old file or the new one.
    pub fn store(&self, token: &StoredToken) -> Result<(), Error> {
        let shown = self.0.display();
        let text = serde_json::to_string_pretty(token).map_err(|e| {
            Error::new(
                ErrorKind::File,
                format!("cannot encode the Matrix access token for {shown}: {e}"),
            )
        })?;
        write_private(&self.0, text.as_bytes()).map_err(|e| {
            Error::new(
                ErrorKind::File,
                format!("cannot write the Matrix access token file {shown}: {e}"),
            )
        })
    }
}

/// Writes `bytes` to `path` with mode 0600 through `<path>.tmp`, synced, then
/// renamed over `path`.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    // A leftover temporary file keeps its old mode through `open`.
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("hive-matrix-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_secret_never_shows_in_debug() {
        let s = Secret::new("syt_very_secret");
        assert_eq!(format!("{s:?}"), "Secret(<hidden>)");
        let stored = StoredToken {
            homeserver: "http://127.0.0.1:8008".into(),
            user_id: "@a:hive.test".into(),
            device_id: "D".into(),
            access_token: s,
        };
        assert!(!format!("{stored:?}").contains("syt_very_secret"));
    }

    #[test]
    fn secret_files_lose_their_newline_and_must_not_be_empty() {
        let dir = scratch("secret");
        let p = dir.join("pw");
        fs::write(&p, "pass word\n").unwrap();
        assert_eq!(
            read_secret_file(&p, "the password file").unwrap().expose(),
            "pass word"
        );
        fs::write(&p, "\n").unwrap();
        let e = read_secret_file(&p, "the Matrix password file").unwrap_err();
        assert_eq!(e.kind, ErrorKind::File);
        assert!(e.message.contains("the Matrix password file") && e.message.contains("empty"));
        let e = read_secret_file(&dir.join("missing"), "the Matrix password file").unwrap_err();
        assert!(
            e.message.contains("cannot read the Matrix password file"),
            "{e}"
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_token_file_is_private_and_round_trips() {
        let dir = scratch("token");
        let file = TokenFile::new(dir.join("matrix-token"));
        assert_eq!(file.load().unwrap(), None);
        let token = StoredToken {
            homeserver: "https://matrix.example".into(),
            user_id: "@hive-one-bridge:example".into(),
            device_id: "HIVE_ONE_BRIDGE".into(),
            access_token: Secret::new("syt_x"),
        };
        file.store(&token).unwrap();
        assert_eq!(fs::metadata(file.path()).unwrap().mode() & 0o777, 0o600);
        assert_eq!(file.load().unwrap(), Some(token));
        // Loosened by hand: made private again on load.
        fs::set_permissions(file.path(), fs::Permissions::from_mode(0o644)).unwrap();
        file.load().unwrap();
        assert_eq!(fs::metadata(file.path()).unwrap().mode() & 0o777, 0o600);
        // Something else in the file: treated as no token.
        fs::write(file.path(), "syt_bare_token\n").unwrap();
        assert_eq!(file.load().unwrap(), None);
        fs::remove_dir_all(&dir).unwrap();
    }
}
