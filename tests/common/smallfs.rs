//! The small-filesystem fault kit: a tmpfs of a given size mounted at a fresh
//! directory (root only: `mount` fails otherwise and the test says SKIPPED),
//! filled to the last byte by [`fill`], remounted read-only by
//! [`SmallFs::read_only`], and unmounted on drop.

use std::path::{Path, PathBuf};

/// A tmpfs of `size` mounted at a fresh dir, unmounted on drop.
pub struct SmallFs(pub PathBuf);

impl SmallFs {
    pub fn mount(size: &str) -> Option<SmallFs> {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = PathBuf::from(format!("/tmp/hv-full-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&p).ok()?;
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&p)
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?;
        st.success().then_some(SmallFs(p))
    }

    /// Remounts it read-only (or back read-write); true when that worked.
    pub fn read_only(&self, ro: bool) -> bool {
        std::process::Command::new("mount")
            .args(["-o", if ro { "remount,ro" } else { "remount,rw" }])
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Writes a filler file until the filesystem is full.
pub fn fill(path: &Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}
