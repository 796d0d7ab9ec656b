//! Files only their owner may read. Every process of hive writes its tokens,
//! port files, state files and databases 0600 whatever the umask, the same
//! way: through these functions (the Matrix client keeps its own, synced
//! copy, since it imports nothing of the crate).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Writes `bytes` to `path` with mode 0600, whole: through `<path>.tmp` in the
/// same directory and a rename, so a reader sees the old file or the new one,
/// never a part. The directory must exist.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
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

/// Makes sure `path` exists with mode 0600 (creating it empty, keeping what
/// it holds), for files a library then opens itself, such as a sqlite db.
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
    fn private_files_are_0600_whole_and_keep_what_they_hold() {
        let dir = std::env::temp_dir().join(format!("hive-sys-fs-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let f = dir.join("token");
        // A file left readable, and a leftover temporary file, become 0600.
        fs::write(&f, "old").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(dir.join("token.tmp"), "junk").unwrap();
        fs::set_permissions(dir.join("token.tmp"), fs::Permissions::from_mode(0o666)).unwrap();
        write_private(&f, b"new\n").unwrap();
        assert_eq!(
            (fs::read_to_string(&f).unwrap(), mode(&f)),
            ("new\n".into(), 0o600)
        );
        assert!(!dir.join("token.tmp").exists());
        let db = dir.join("x.db");
        fs::write(&db, "rows").unwrap();
        fs::set_permissions(&db, fs::Permissions::from_mode(0o644)).unwrap();
        ensure_private_file(&db).unwrap();
        assert_eq!(
            (fs::read_to_string(&db).unwrap(), mode(&db)),
            ("rows".into(), 0o600)
        );
        let fresh = dir.join("fresh.db");
        ensure_private_file(&fresh).unwrap();
        assert_eq!(
            (fs::metadata(&fresh).unwrap().len(), mode(&fresh)),
            (0, 0o600)
        );
        assert!(write_private(&dir.join("no/such/dir"), b"x").is_err());
        fs::remove_dir_all(&dir).unwrap();
    }
}
