//! The bridge's Matrix session: the `matrix` section's user on its fixed
//! device, with the password from `password_file` (the access token of a
//! password login is kept in `STATE/matrix-token.json`, 0600, and reused; a
//! new one is minted only when the homeserver refuses it) or the token from
//! `access_token_file`. A refused login or an unreadable secret file is
//! fatal: the bridge exits 2 and `hive up` refuses to start, naming the Matrix
//! login ([`check_at_start`]).

use crate::matrix::{read_secret_file, Client, Error, ErrorKind, TokenFile};
use crate::proto::swarm::MatrixConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The file in the bridge's state dir that keeps the access token.
pub const TOKEN_FILE: &str = "matrix-token.json";

/// How the bridge logs in.
#[derive(Debug, Clone)]
pub struct Login {
    homeserver: String,
    user_id: String,
    device_id: String,
    secret: Secret,
    token_file: TokenFile,
    timeout: Duration,
}

#[derive(Debug, Clone)]
enum Secret {
    Password(PathBuf),
    Token(PathBuf),
}

impl Login {
    /// The login of hive `hive`'s bridge, keeping its token in `state_dir`.
    /// `timeout` is one request's (a sync gets its long-poll on top).
    pub fn new(m: &MatrixConfig, hive: &str, state_dir: &Path, timeout: Duration) -> Login {
        let secret = match (&m.password_file, &m.access_token_file) {
            (_, Some(t)) => Secret::Token(PathBuf::from(t)),
            (Some(p), None) => Secret::Password(PathBuf::from(p)),
            // The config's validation requires one of the two.
            (None, None) => Secret::Password(PathBuf::new()),
        };
        Login {
            homeserver: m.homeserver.clone(),
            user_id: m.user_id.clone(),
            device_id: m.device_id_of(hive),
            secret,
            token_file: TokenFile::new(state_dir.join(TOKEN_FILE)),
            timeout,
        }
    }

    /// A client with a session: the kept token when the homeserver still
    /// accepts it, else a new login.
    pub fn client(&self) -> Result<Client, Error> {
        let mut c = Client::new(&self.homeserver)?.with_timeout(self.timeout);
        match &self.secret {
            Secret::Password(path) => {
                let pw = read_secret_file(path, "the Matrix password file")?;
                c.login_password(&self.user_id, &pw, &self.device_id, Some(&self.token_file))?;
            }
            Secret::Token(path) => {
                let token = read_secret_file(path, "the Matrix access token file")?;
                c.use_access_token(&self.user_id, token)?;
            }
        }
        Ok(c)
    }

    pub fn user_id(&self) -> &str {
        &self.user_id
    }
}

/// Whether `e` stops the bridge: the login or token was refused, a secret
/// file cannot be read, or the configuration is unusable. Trying again
/// cannot help until the operator fixes the Matrix login.
pub fn is_fatal(e: &Error) -> bool {
    matches!(
        e.kind,
        ErrorKind::Auth | ErrorKind::File | ErrorKind::Invalid
    )
}

/// `hive up`'s check before it starts anything: logs the bridge in once (its
/// token is then kept for the bridge to reuse). A fatal error is returned
/// with what to fix; a homeserver that cannot be reached now is only
/// logged, since the bridge keeps trying and the agents run meanwhile.
pub fn check_at_start(m: &MatrixConfig, hive: &str, state_dir: &Path) -> Result<(), String> {
    super::private_dir(state_dir)?;
    match Login::new(m, hive, state_dir, Duration::from_secs(15)).client() {
        Ok(_) => Ok(()),
        Err(e) if is_fatal(&e) => Err(format!(
            "the Matrix login of the bridge failed: {e} (fix matrix.user_id and the password or \
             token file in the fleet file)"
        )),
        Err(e) => {
            log::warn!(
                "the Matrix homeserver cannot be reached now ({e}); the bridge keeps trying, and \
                 mail to other hives waits in the outbox"
            );
            Ok(())
        }
    }
}
