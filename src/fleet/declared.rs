//! A fleet file that is declared somewhere else (a NixOS configuration) and
//! written by the operator too: `hive fleet check FILE` loads it as `hive up`
//! does (every key validated, the path keys checked) and says what it holds;
//! `hive fleet merge DECLARED --into FILE` installs a new declaration into the
//! fleet file the hive runs with, by the fleet file's own three-way rule
//! (`config::fleetfile::apply_declared`): the declaration installed last is
//! kept next to it (`--base`, by default `NAME.declared.json`) as the base, so
//! the operator's writes since (approvals, permission saves, `hive budget
//! set`) stay and a key both changed is refused by name with nothing written.
//! Also the bash environment file `hive up` gives an agent's tasks.

use crate::config::fleetfile;
use crate::config::{AgentConfig, HiveConfig};
use std::ffi::OsString;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The bash environment file of an agent's tasks (`HIVE_BASH_ENV`): with
/// `cargo_short_messages` (the default) the script of `hive env-script`,
/// written into its run dir (which its sandbox shows); without it none.
pub fn bash_env(cfg: &AgentConfig, run: &Path) -> Result<OsString, String> {
    if !cfg.cargo_short_messages() {
        return Ok("/dev/null".into());
    }
    let file = run.join("bash-env.sh");
    std::fs::write(&file, crate::agent_proc::BASH_ENV_SCRIPT)
        .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
    Ok(file.into())
}

/// `hive fleet check FILE`: the file as `hive up` would load it, or why not.
pub fn check(file: &Path) -> Result<String, String> {
    let cfg = HiveConfig::load(file)?;
    if cfg.agents.is_empty() {
        return Err(format!(
            "the fleet file {} lists no agents; hive up needs one in \"agents\"",
            file.display()
        ));
    }
    let names: Vec<&str> = cfg.agents.iter().map(|a| a.name.as_str()).collect();
    Ok(format!(
        "{}: valid, {} agent{} ({})",
        file.display(),
        names.len(),
        if names.len() == 1 { "" } else { "s" },
        names.join(", ")
    ))
}

/// Where the declaration installed last is kept without `--base`:
/// `DIR/NAME.declared.json` next to `DIR/NAME.json`.
pub fn default_base(into: &Path) -> PathBuf {
    let stem = into
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "hive".into());
    into.with_file_name(format!("{stem}.declared.json"))
}

/// `hive fleet merge DECLARED --into FILE [--base BASE]`: installs the
/// declaration (a first install copies it), then keeps it as the next base.
/// Returns the line to print.
pub fn merge(declared: &Path, into: &Path, base: Option<&Path>) -> Result<String, String> {
    let base = base.map_or_else(|| default_base(into), Path::to_path_buf);
    let text = std::fs::read_to_string(declared).map_err(|e| {
        format!(
            "cannot read the declared fleet file {}: {e}",
            declared.display()
        )
    })?;
    let cfg = HiveConfig::parse(&text)
        .and_then(|c| c.check_paths().map(|()| c))
        .map_err(|e| format!("the declared fleet file {}: {e}", declared.display()))?;
    let line = if into.exists() {
        let old = match std::fs::read_to_string(&base) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(format!("cannot read {}: {e}", base.display())),
        };
        let merged = fleetfile::apply_declared(into, old.as_deref(), &text)?;
        format!(
            "merged {} into {}: {} agents",
            declared.display(),
            into.display(),
            merged.agents.len()
        )
    } else {
        let pretty = serde_json::to_string_pretty(&cfg).map_err(|e| e.to_string())?;
        write_new(into, &format!("{pretty}\n"))?;
        format!(
            "installed {} as {}: {} agents",
            declared.display(),
            into.display(),
            cfg.agents.len()
        )
    };
    write_new(&base, &text)?;
    Ok(line)
}

/// Writes `text` to `path` through a temporary file renamed over it (mode
/// 0640, or the mode of the file it replaces).
fn write_new(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let mode = std::fs::metadata(path).map_or(0o640, |m| m.permissions().mode() & 0o7777);
    let tmp = path.with_file_name(format!(
        ".{}.hive-{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(fail)?;
    let done = f
        .write_all(text.as_bytes())
        .and_then(|()| f.set_permissions(std::fs::Permissions::from_mode(mode)))
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(e));
    }
    Ok(())
}
