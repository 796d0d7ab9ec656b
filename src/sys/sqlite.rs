//! sqlite's C interface where rusqlite 0.32 does not reach: the WAL hook
//! (`sqlite3_wal_hook`), called after every commit of a connection with the
//! number of frames its write-ahead log holds. sqlite's own auto-checkpoint is
//! this hook (`sqlite3_wal_autocheckpoint` sets it), so setting one takes the
//! checkpoint out of the committing thread, unless the hook checkpoints
//! there: the broker hands its checkpoints to a thread of their own this way
//! (`broker/checkpoint.rs`).

use rusqlite::{ffi, Connection};
use std::ffi::{c_char, c_int, c_void};

/// sqlite's default auto-checkpoint, in frames of the log.
pub const AUTOCHECKPOINT_FRAMES: u32 = 1000;

type Hook = Box<dyn FnMut(u32, &Wal) + Send>;

/// The log a hook is called for, inside the commit.
pub struct Wal {
    db: *mut ffi::sqlite3,
    name: *const c_char,
}

impl Wal {
    /// Checkpoints the log there and then, as the auto-checkpoint would
    /// (`PASSIVE`: what no other connection is checkpointing or still
    /// reading; nothing when another connection holds the checkpoint lock).
    pub fn checkpoint(&self) {
        // SAFETY: the connection and schema name sqlite passed to the hook
        // that was given this `Wal`, used during that call.
        unsafe { ffi::sqlite3_wal_checkpoint(self.db, self.name) };
    }
}

/// A hook set by [`on_wal_commit`]. Dropping it gives the connection its
/// auto-checkpoint back; it must be dropped before the connection is closed.
pub struct WalHook {
    db: *mut ffi::sqlite3,
    hook: *mut Hook,
}

// SAFETY: the pointers are only used by sqlite, on the thread that uses the
// connection (rusqlite's `Connection` is `Send` the same way), and by `drop`,
// which runs where the owner of both is; the hook itself is `Send`.
unsafe impl Send for WalHook {}

/// Calls `hook` after every commit of `conn`, with the frames in its log, in
/// place of sqlite's auto-checkpoint (which is off while the hook is set).
/// `hook` runs on the committing thread, inside the commit: it must be quick
/// and must not use the connection, except to checkpoint there and then
/// ([`Wal::checkpoint`]), as its auto-checkpoint would.
pub fn on_wal_commit(conn: &Connection, hook: impl FnMut(u32, &Wal) + Send + 'static) -> WalHook {
    let hook: *mut Hook = Box::into_raw(Box::new(Box::new(hook)));
    // SAFETY: `handle` is the open connection's; `call` casts the data pointer
    // back to the `Hook` leaked here, which lives until `WalHook::drop` takes
    // the hook off first and frees it after.
    let db = unsafe {
        let db = conn.handle();
        ffi::sqlite3_wal_hook(db, Some(call), hook.cast());
        db
    };
    WalHook { db, hook }
}

unsafe extern "C" fn call(
    data: *mut c_void,
    db: *mut ffi::sqlite3,
    name: *const c_char,
    frames: c_int,
) -> c_int {
    // SAFETY: `data` is the `Hook` `on_wal_commit` leaked, alive while set.
    let hook = unsafe { &mut *data.cast::<Hook>() };
    // What sqlite's own auto-checkpoint hook checkpoints with (a busy or
    // failed checkpoint is tried at the next commit).
    let wal = Wal { db, name };
    // A panic must not unwind into sqlite's C frames.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        hook(u32::try_from(frames).unwrap_or(0), &wal)
    }));
    ffi::SQLITE_OK
}

impl Drop for WalHook {
    fn drop(&mut self) {
        // SAFETY: the connection is still open (the owner drops this first);
        // setting the auto-checkpoint replaces the hook, after which sqlite
        // holds no pointer to it and it can be freed.
        unsafe {
            ffi::sqlite3_wal_autocheckpoint(self.db, AUTOCHECKPOINT_FRAMES as c_int);
            drop(Box::from_raw(self.hook));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A fresh WAL database in a directory of its own (`tag`), whose hook
    /// records the log's length after each commit and asks for a checkpoint
    /// when `ask` says: the directory, the connection, the hook, the lengths.
    fn hooked(
        tag: &str,
        ask: fn(u32) -> bool,
    ) -> (
        std::path::PathBuf,
        Connection,
        WalHook,
        Arc<Mutex<Vec<u32>>>,
    ) {
        let dir = std::env::temp_dir().join(format!("hive-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let conn = wal_db(&dir);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let hook = on_wal_commit(&conn, move |frames, wal| {
            s.lock().unwrap().push(frames);
            if ask(frames) {
                wal.checkpoint();
            }
        });
        (dir, conn, hook, seen)
    }

    fn wal_db(dir: &std::path::Path) -> Connection {
        let conn = Connection::open(dir.join("t.db")).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;
             CREATE TABLE t (x INTEGER PRIMARY KEY, pad TEXT);",
        )
        .unwrap();
        conn
    }

    fn commits(conn: &Connection, n: usize) {
        for i in 0..n {
            conn.execute("INSERT INTO t (pad) VALUES (?1)", [format!("{i:0>100}")])
                .unwrap();
        }
    }

    fn db_bytes(dir: &std::path::Path) -> u64 {
        std::fs::metadata(dir.join("t.db")).unwrap().len()
    }

    #[test]
    fn the_hook_sees_every_commit_and_no_commit_checkpoints_while_it_is_set() {
        let (dir, conn, hook, seen) = hooked("wal-hook", |_| false);
        let before = db_bytes(&dir);
        // Well past sqlite's auto-checkpoint: without the hook, one of these
        // commits would have copied the log into the database file.
        commits(&conn, 1500);
        let frames = seen.lock().unwrap().clone();
        assert_eq!(frames.len(), 1500);
        assert!(frames.windows(2).all(|w| w[1] > w[0]), "the log only grows");
        assert!(*frames.last().unwrap() > AUTOCHECKPOINT_FRAMES);
        assert_eq!(db_bytes(&dir), before, "no commit checkpointed");
        // Taken off, the connection checkpoints by itself again.
        drop(hook);
        commits(&conn, 1);
        assert!(db_bytes(&dir) > before, "the auto-checkpoint is back");
        assert_eq!(seen.lock().unwrap().len(), 1500, "the hook is off");
        drop(conn);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_hook_that_asks_for_a_checkpoint_gets_it_in_the_commit() {
        let (dir, conn, hook, seen) = hooked("wal-ask", |frames| frames >= 50);
        let before = db_bytes(&dir);
        commits(&conn, 200);
        assert!(db_bytes(&dir) > before, "checkpointed");
        // Checkpointed in full, the log starts over at the next commit.
        let frames = seen.lock().unwrap().clone();
        assert!(frames.iter().all(|&f| f < 60), "{frames:?}");
        drop(hook);
        drop(conn);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
