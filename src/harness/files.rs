//! The harness's own files and directories, private whatever the umask: the
//! state and run dirs are created 0700, and every file the harness writes for
//! itself (the boot files in the run dir, the model choice, the login sentinel,
//! the turn-stats db) is 0600. The modes are given explicitly at creation; the
//! process umask is never changed, so the files claude and the bash tasks
//! create keep the user's.

use crate::sys;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::Path;

/// Creates `dir` and any missing parents with mode 0700; an existing directory
/// is left as it is.
pub fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// Writes `bytes` to `path` with mode 0600, whole ([`sys::fs::write_private`]),
/// creating its directory (0700) first.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        create_private_dir(dir)?;
    }
    sys::fs::write_private(path, bytes)
}

pub use crate::sys::fs::ensure_private_file;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

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
        fs::write(dir.join("model.tmp"), "left over").unwrap();
        fs::set_permissions(dir.join("model.tmp"), fs::Permissions::from_mode(0o666)).unwrap();
        write_private(&f, b"haiku\n").unwrap();
        assert_eq!(mode(&f), 0o600);
        assert_eq!(fs::read_to_string(&f).unwrap(), "haiku\n");
        assert!(!dir.join("model.tmp").exists());
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
