//! The broker's places on disk before it serves: its directories, made with
//! their modes whatever the umask, and its sockets, bound with their owners
//! and modes — refusing to steal one a live broker serves. Used at start
//! (`mod.rs`) and when an approved spawn gives a new agent its socket
//! (`hub/approvals.rs`).

use crate::config::AgentConfig;
use crate::proto::paths::agent_socket;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

/// Creates `path` and its missing parents with `mode`, whatever the umask;
/// directories that exist already keep theirs.
pub(crate) fn create_dirs(path: &Path, mode: u32) -> std::io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        create_dirs(parent, mode)?;
    }
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && path.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates a directory the broker owns (with missing parents) and gives it
/// `mode`, whether it was there or not.
pub(crate) fn create_dir(path: &Path, mode: u32) -> Result<(), String> {
    create_dirs(path, mode)
        .and_then(|_| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
        .map_err(|e| format!("cannot create directory {}: {e}", path.display()))
}

/// Binds a socket, refusing to steal one a live broker is serving.
pub(crate) fn bind(
    path: &Path,
    uid: Option<u32>,
    gid: Option<u32>,
) -> Result<UnixListener, String> {
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(format!(
                "another broker is already listening on {}; stop it first",
                path.display()
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    if uid.is_some() || gid.is_some() {
        std::os::unix::fs::chown(path, uid, gid).map_err(|e| {
            format!(
                "cannot give socket {} to uid {uid:?} gid {gid:?}: {e} (the broker must run as root to do that)",
                path.display()
            )
        })?;
    }
    let mode = if gid.is_some() { 0o660 } else { 0o600 };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set permissions of {}: {e}", path.display()))?;
    Ok(listener)
}

/// Binds the socket of agent `a` under `run_dir`. `RUN/agents` and
/// `RUN/agents/NAME` let everyone through (0755), so a harness running as the
/// socket's `socket_uid` reaches it; the socket's own mode decides who may
/// connect.
pub(crate) fn agent_listener(
    run_dir: &Path,
    a: &AgentConfig,
) -> Result<(UnixListener, PathBuf), String> {
    let path = agent_socket(run_dir, &a.name);
    let dir = path.parent().unwrap_or(run_dir).to_path_buf();
    create_dir(&run_dir.join("agents"), 0o755)?;
    create_dir(&dir, 0o755)?;
    let l = bind(&path, a.socket_uid, a.socket_gid)?;
    Ok((l, path))
}
