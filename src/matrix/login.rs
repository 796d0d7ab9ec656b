//! How a [`Client`] gets its session: a password login on a fixed device id
//! (the homeserver deduplicates transaction ids per device, so every login of
//! one bridge must use the same one), reusing the access token kept in a
//! [`TokenFile`] by an earlier login when `whoami` still accepts it (every
//! password login mints a new token, and the old ones stay valid), or an
//! access token the operator gave. A refused password or token is an
//! [`ErrorKind::Auth`] error whose message names the Matrix login; the
//! password itself is never part of a message.

use super::api::LoginAnswer;
use super::client::{Client, Session, API};
use super::error::{Endpoint, Error, ErrorKind};
use super::secret::{Secret, StoredToken, TokenFile};
use serde_json::json;

/// Where the access token in use came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenSource {
    /// Reused from the token file: no new token was minted.
    TokenFile,
    /// Minted by a password login (and stored in the token file, if any).
    PasswordLogin,
    /// Given by the operator (`access_token_file`).
    Given,
}

impl Client {
    /// Logs in as `user_id` with `password` on the fixed `device_id`
    /// (transaction ids are deduplicated per device, so a re-login must keep
    /// it). With a `token_file`, the token stored there by an earlier login of
    /// the same user and device on this homeserver is reused if `whoami`
    /// accepts it; otherwise a password login mints a new one, which is stored
    /// there. A refused password is an [`ErrorKind::Auth`] error.
    pub fn login_password(
        &mut self,
        user_id: &str,
        password: &Secret,
        device_id: &str,
        token_file: Option<&TokenFile>,
    ) -> Result<TokenSource, Error> {
        check_user_id(user_id)?;
        check_device_id(device_id)?;
        if let Some(file) = token_file {
            if self.reuse_stored_token(file, user_id, device_id)? {
                return Ok(TokenSource::TokenFile);
            }
        }
        let body = json!({
            "type": "m.login.password",
            "identifier": { "type": "m.id.user", "user": user_id },
            "password": password.expose(),
            "device_id": device_id,
            "initial_device_display_name": "hive matrix bridge",
        });
        let answer: LoginAnswer = self
            .call(
                "POST",
                &format!("{API}/login"),
                &[],
                Some(&body),
                self.timeout,
                Endpoint::Login,
            )
            .map_err(|e| login_error(e, user_id, device_id))?;
        if answer.access_token.is_empty() {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("the Matrix login of {user_id} was answered without an access token"),
            ));
        }
        if answer.device_id != device_id {
            return Err(Error::new(
                ErrorKind::Refused {
                    status: 200,
                    errcode: None,
                },
                format!(
                    "the homeserver logged {user_id} in on device {:?} instead of the fixed \
                     device {device_id:?}; transaction ids would not be deduplicated",
                    answer.device_id
                ),
            ));
        }
        let user_id = if answer.user_id.is_empty() {
            user_id.to_string()
        } else {
            answer.user_id
        };
        let token = Secret::new(answer.access_token);
        log::info!("matrix: logged in as {user_id} (device {device_id}) with the password");
        self.session = Some(Session {
            user_id: user_id.clone(),
            device_id: device_id.to_string(),
            token: token.clone(),
        });
        if let Some(file) = token_file {
            file.store(&StoredToken {
                homeserver: self.base.clone(),
                user_id,
                device_id: device_id.to_string(),
                access_token: token,
            })?;
        }
        Ok(TokenSource::PasswordLogin)
    }

    /// Uses the stored token if it is for this homeserver, user and device and
    /// `whoami` accepts it. Any other error than a refused token is returned:
    /// a homeserver that is down is no reason to mint a new token.
    fn reuse_stored_token(
        &mut self,
        file: &TokenFile,
        user_id: &str,
        device_id: &str,
    ) -> Result<bool, Error> {
        let Some(stored) = file.load()? else {
            return Ok(false);
        };
        if stored.homeserver != self.base
            || !stored.user_id.eq_ignore_ascii_case(user_id)
            || stored.device_id != device_id
        {
            log::info!(
                "matrix: {} holds a token for {} (device {}) on {}; logging in with the password",
                file.path().display(),
                stored.user_id,
                stored.device_id,
                stored.homeserver
            );
            return Ok(false);
        }
        self.session = Some(Session {
            user_id: stored.user_id,
            device_id: stored.device_id,
            token: stored.access_token,
        });
        match self.whoami() {
            Ok(who)
                if who.user_id.eq_ignore_ascii_case(user_id)
                    && who.device_id.as_deref() == Some(device_id) =>
            {
                log::info!("matrix: reusing the access token of {user_id} (device {device_id})");
                if let Some(session) = self.session.as_mut() {
                    session.user_id = who.user_id;
                }
                Ok(true)
            }
            Ok(who) => {
                log::info!(
                    "matrix: the stored token is {}'s on device {:?}; logging in with the password",
                    who.user_id,
                    who.device_id
                );
                self.session = None;
                Ok(false)
            }
            Err(e) if e.is_auth() => {
                log::info!(
                    "matrix: the stored token was refused ({e}); logging in with the password"
                );
                self.session = None;
                Ok(false)
            }
            Err(e) => {
                self.session = None;
                Err(e)
            }
        }
    }

    /// Uses an access token given by the operator (`access_token_file`) and
    /// checks with `whoami` that it is `user_id`'s.
    pub fn use_access_token(&mut self, user_id: &str, token: Secret) -> Result<TokenSource, Error> {
        check_user_id(user_id)?;
        self.session = Some(Session {
            user_id: user_id.to_string(),
            device_id: String::new(),
            token,
        });
        let checked = self.whoami().and_then(|who| {
            if !who.user_id.eq_ignore_ascii_case(user_id) {
                return Err(Error::new(
                    ErrorKind::Auth,
                    format!(
                        "the Matrix access token is {}'s, not {user_id}'s",
                        who.user_id
                    ),
                ));
            }
            Ok(who)
        });
        match checked {
            Ok(who) => {
                if let Some(session) = self.session.as_mut() {
                    session.user_id = who.user_id;
                    session.device_id = who.device_id.unwrap_or_default();
                }
                Ok(TokenSource::Given)
            }
            Err(e) => {
                self.session = None;
                Err(e.context(format_args!("the Matrix access token of {user_id}")))
            }
        }
    }
}

fn login_error(e: Error, user_id: &str, device_id: &str) -> Error {
    if e.is_auth() {
        e.context(format_args!(
            "the homeserver refused the Matrix login of {user_id} (device {device_id}); \
             check the user id and the password"
        ))
    } else {
        e.context(format_args!("the Matrix login of {user_id} failed"))
    }
}

fn check_user_id(user_id: &str) -> Result<(), Error> {
    let ok = user_id.len() <= 255
        && user_id
            .strip_prefix('@')
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(local, server)| !local.is_empty() && !server.is_empty());
    if ok {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::Invalid,
            format!("{user_id:?} is not a Matrix user id (@name:server)"),
        ))
    }
}

fn check_device_id(device_id: &str) -> Result<(), Error> {
    if device_id.is_empty()
        || device_id
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(Error::new(
            ErrorKind::Invalid,
            format!("{device_id:?} is not a usable device id (non-empty, no spaces)"),
        ));
    }
    Ok(())
}
