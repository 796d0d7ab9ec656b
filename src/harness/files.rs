//! The harness's own files and directories, private whatever the umask: the
//! state and run dirs are created 0700, and every file the harness writes for
//! itself (the boot files in the run dir, the model choice, the login sentinel,
//! the turn-stats db) is 0600. The modes are given explicitly at creation; the
//! process umask is never changed, so the files claude and the bash tasks
//! create keep the user's.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Creates `dir` and any missing parents with mode 0700; an existing directory
/// is left as it is.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes `bytes` to `path` with mode 0600, whole: through a temporary file in
/// the same directory and a rename, so a reader sees the old or the new file.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_private_dir(dir)?;
    }
    let tmp = temp_name(path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    // A leftover temporary file keeps its old mode through `open`.
    f.set_permissions(fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)?;
    drop(f);
    fs::rename(&tmp, path)
}

/// Makes sure `path` exists with mode 0600 (creating it empty), for files a
/// library then opens itself, such as the sqlite db.
pub fn ensure_private_file(path: &Path) -> io::Result<()> {
    let f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(fs::Permissions::from_mode(0o600))
}

fn temp_name(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn private_whatever_the_umask() {
        let root = std::env::temp_dir().join(format!("hive-files-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = root.join("a/b");
        create_private_dir(&dir).unwrap();
        assert_eq!(
            (mode(&root), mode(&root.join("a")), mode(&dir)),
            (0o700, 0o700, 0o700)
        );
        let f = dir.join("model");
        fs::write(temp_name(&f), "left over").unwrap();
        fs::set_permissions(temp_name(&f), fs::Permissions::from_mode(0o666)).unwrap();
        write_private(&f, b"haiku\n").unwrap();
        assert_eq!(mode(&f), 0o600);
        assert_eq!(fs::read_to_string(&f).unwrap(), "haiku\n");
        assert!(!temp_name(&f).exists());
        let db = dir.join("db");
        fs::write(&db, "keep").unwrap();
        fs::set_permissions(&db, fs::Permissions::from_mode(0o644)).unwrap();
        ensure_private_file(&db).unwrap();
        assert_eq!(
            (mode(&db), fs::read_to_string(&db).unwrap().as_str()),
            (0o600, "keep")
        );
        fs::remove_dir_all(&root).unwrap();
    }
}
