//! The work the hub hands to a job thread (`conn-job`) because it would
//! block the hub: asking the supervisor through the lifecycle port (at most
//! [`HubSettings::supervisor_timeout`](super::HubSettings)), reading an
//! agent's patch file, running `journalctl`. A job reports once
//! ([`HubMsg::Finished`](super::HubMsg)): nothing here touches the hub's
//! state; what a job did comes back as its answer or as a
//! [`Followup`](super::Followup) the hub applies.

use super::fmt_wait;
use crate::broker::lifecycle::{LifecycleCmd, Reply};
use crate::proto::cmd::parse_patch;
use crate::proto::limits::MAX_PATCH_BYTES;
use crate::proto::text::excerpt;
use crossbeam_channel::Sender;
use serde_json::Value;
use std::io::Read;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(super) const NO_SUPERVISOR: &str = "this broker runs without a supervisor (plain `hive \
broker`), so agents cannot be started or stopped from here; run the hive with `hive up`";

/// How long `journalctl` may run.
const JOURNAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends one command to the supervisor and waits for its answer; run on a
/// job thread (`conn-job`).
pub(super) fn ask_supervisor(
    sup: &Option<Sender<LifecycleCmd>>,
    timeout: Duration,
    make: impl FnOnce(Reply) -> LifecycleCmd,
) -> Result<String, String> {
    let Some(sup) = sup else {
        return Err(NO_SUPERVISOR.into());
    };
    let (tx, rx) = crossbeam_channel::bounded(1);
    sup.send(make(tx))
        .map_err(|_| "the supervisor has stopped (the hive is shutting down)".to_string())?;
    match rx.recv_timeout(timeout) {
        Ok(answer) => answer,
        Err(_) => Err(format!(
            "the supervisor did not answer in {}",
            fmt_wait(timeout)
        )),
    }
}

/// `journalctl --no-pager -q -n N [-u UNIT]`, with a wall-clock limit.
pub(super) fn read_journal(unit: Option<&str>, n: u64) -> Result<String, String> {
    let mut cmd = std::process::Command::new("journalctl");
    cmd.args(["--no-pager", "-q", "-n", &n.to_string()]);
    if let Some(u) = unit {
        cmd.args(["-u", u]);
    }
    match crate::sys::run_with_timeout(&mut cmd, JOURNAL_TIMEOUT) {
        Ok(out) if out.status.success() => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Ok(out) => Err(format!(
            "journalctl failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(crate::sys::RunError::Start(e)) => Err(format!(
            "journalctl is not available on this host ({e}); there is no host journal to read"
        )),
        Err(e) => Err(format!("journalctl {e}")),
    }
}

/// Reads the patch file `commit_ref`, on a job thread (`conn-job`). The file must lie
/// inside the caller's own dir `own` = `STATE/agents/CALLER/` (under `hive up`
/// that holds its state dir, claude's cwd, against which a relative path is
/// resolved), so the broker never reads a file for an agent that the agent
/// could not have written; it must be a regular file (opened without blocking,
/// so a FIFO is refused rather than waited on) of at most [`MAX_PATCH_BYTES`].
///
/// Containment is checked on the path's words first, and the file is then
/// opened beneath `own` one name at a time without following a symlink: the
/// broker resolves nothing outside the agent's dir, and a path that is not
/// there, is outside, or leads through a symlink gets one and the same
/// answer, so an agent cannot learn whether a path outside its dir exists
/// (robustness review N10: `/etc/shadow` and `/etc/shadowx` were told apart).
pub(super) fn read_patch_file(own: &Path, commit_ref: &str) -> Result<Value, String> {
    let shown = excerpt(commit_ref);
    let not_here = || {
        format!(
            "commit_ref {shown} is not there or outside your own dir {} (its path is read \
             there without following a symlink); write the patch into a regular file in your \
             state dir, or pass it inline",
            own.display()
        )
    };
    let rel = beneath(own, commit_ref).ok_or_else(not_here)?;
    // The dir itself is the broker's: a symlink on its path is followed.
    let own = own.canonicalize().unwrap_or_else(|_| own.to_path_buf());
    let not_readable = |e: std::io::Error| {
        format!(
            "commit_ref {shown} is neither a JSON object nor a readable file in your state dir: {e}"
        )
    };
    if rel.as_os_str().is_empty() {
        return Err(format!(
            "commit_ref {shown} is a directory, not a regular file; write the patch into a regular file in your state dir, or pass it inline"
        ));
    }
    let file = crate::sys::fd::open_beneath(&own, &rel, libc::O_NONBLOCK).map_err(|e| {
        match e.raw_os_error() {
            Some(libc::ENOENT | libc::ENOTDIR | libc::ELOOP) => not_here(),
            _ => not_readable(e),
        }
    })?;
    let meta = file.metadata().map_err(not_readable)?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a FIFO"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "a device"
        };
        return Err(format!(
            "commit_ref {shown} is {kind}, not a regular file; write the patch into a regular file in your state dir, or pass it inline"
        ));
    }
    if meta.len() > MAX_PATCH_BYTES as u64 {
        return Err(format!(
            "commit_ref {shown} is {} bytes; a patch file may be at most {MAX_PATCH_BYTES} bytes",
            meta.len()
        ));
    }
    let mut text = String::new();
    file.take(MAX_PATCH_BYTES as u64 + 1)
        .read_to_string(&mut text)
        .map_err(not_readable)?;
    if text.len() > MAX_PATCH_BYTES {
        return Err(format!(
            "commit_ref {shown} grew past {MAX_PATCH_BYTES} bytes while it was read"
        ));
    }
    parse_patch(&text)
}

/// `commit_ref` as a path of plain names inside `own`, resolved against its
/// `state` dir on the path's words alone (`.` and `..` applied, an absolute
/// path taken when it starts with `own`); None when it is outside.
fn beneath(own: &Path, commit_ref: &str) -> Option<PathBuf> {
    use std::path::Component;
    let path = Path::new(commit_ref);
    let (mut names, rest): (Vec<&std::ffi::OsStr>, &Path) = if path.is_absolute() {
        let canonical = own.canonicalize().ok();
        let rest = path
            .strip_prefix(own)
            .ok()
            .or_else(|| path.strip_prefix(canonical.as_deref()?).ok())?;
        (Vec::new(), rest)
    } else {
        (vec![std::ffi::OsStr::new("state")], path)
    };
    for c in rest.components() {
        match c {
            Component::Normal(n) => names.push(n),
            Component::CurDir => {}
            Component::ParentDir => {
                names.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(names.iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// An agent that swaps a directory of its patch's path for a symlink out
    /// of its own dir, over and over, while the broker reads the patch: the
    /// broker reads its own file or refuses, and never the file outside.
    #[test]
    fn a_directory_swapped_for_a_symlink_never_leads_the_read_outside() {
        let root = std::env::temp_dir().join(format!("hive-patch-swap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let own = root.join("agents/ana");
        let state = own.join("state");
        std::fs::create_dir_all(state.join("d")).unwrap();
        std::fs::write(state.join("d/patch.json"), r#"{"model":"opus"}"#).unwrap();
        std::fs::create_dir_all(root.join("outside")).unwrap();
        std::fs::write(root.join("outside/patch.json"), r#"{"model":"stolen"}"#).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, state, outside) = (stop.clone(), state.clone(), root.join("outside"));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::fs::rename(state.join("d"), state.join("d.real")).unwrap();
                    std::os::unix::fs::symlink(&outside, state.join("d")).unwrap();
                    std::fs::remove_file(state.join("d")).unwrap();
                    std::fs::rename(state.join("d.real"), state.join("d")).unwrap();
                }
            })
        };
        let (mut read, mut refused, mut tries) = (0, 0, 0);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while tries < 5000 || read == 0 || refused == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the race was not seen both ways in a minute: read {read}, refused {refused}"
            );
            tries += 1;
            match read_patch_file(&own, "d/patch.json") {
                Ok(v) => {
                    assert_eq!(v, json!({"model":"opus"}), "read outside the agent's dir");
                    read += 1;
                }
                Err(e) => {
                    assert!(!e.contains("stolen"), "{e}");
                    refused += 1;
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
        swapper.join().unwrap();
        let _ = std::fs::remove_dir_all(&root);
    }

    /// A path outside the agent's dir is refused on its words, in the same
    /// words whether it exists or not, and so is a symlink out of the dir.
    #[test]
    fn a_missing_and_a_forbidden_path_get_the_same_answer() {
        let root = std::env::temp_dir().join(format!("hive-patch-oracle-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let own = root.join("agents/ana");
        std::fs::create_dir_all(own.join("state")).unwrap();
        std::fs::create_dir_all(root.join("agents/bob")).unwrap();
        std::fs::write(root.join("agents/bob/secret.json"), "{}").unwrap();
        let outside = root.join("agents/bob/secret.json");
        std::os::unix::fs::symlink(&outside, own.join("state/there.json")).unwrap();
        std::os::unix::fs::symlink(root.join("nope"), own.join("state/gone.json")).unwrap();
        let answer = |r: &str| read_patch_file(&own, r).unwrap_err().replace(r, "REF");
        let alike = answer("../../bob/secret.json");
        assert!(
            alike.contains("not there or outside your own dir"),
            "{alike}"
        );
        for r in [
            "../../bob/nope.json",
            "/etc/hostname",
            "/etc/hostnamex",
            outside.to_str().unwrap(),
            "there.json",
            "gone.json",
            "missing.json",
            "./../state/../../ana/../bob/secret.json",
        ] {
            assert_eq!(answer(r), alike, "{r}");
        }
        std::fs::write(own.join("state/p.json"), r#"{"model":"opus"}"#).unwrap();
        let absolute = own.join("state/p.json");
        for r in ["p.json", "./d/../p.json", absolute.to_str().unwrap()] {
            assert_eq!(
                read_patch_file(&own, r).unwrap(),
                json!({"model":"opus"}),
                "{r}"
            );
        }
        let _ = std::fs::remove_dir_all(&root);
    }
}
