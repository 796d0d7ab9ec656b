//! The store's checkpoints, on a thread of their own. In WAL mode every commit
//! appends to the log, and sqlite copies the log back into the database file
//! (a checkpoint: the copy and two `fsync`s) inside the commit that finds the
//! log past 1000 frames. On the hub's thread that stalled every socket for the
//! length of the copy — 6–7 ms on the project's VM, every 80–140 turns
//! (docs/performance.md, "Checkpoints off the hub's thread"). So the hub's
//! connection only says, after each commit, how long the log is
//! (`sys::sqlite::on_wal_commit`), and for each 1000 frames it grew this thread
//! checkpoints from a connection of its own (`PASSIVE`: it never waits for the
//! hub and the hub never waits for it; WAL lets the hub commit while it
//! copies). The log starts over at the first commit after a checkpoint that
//! caught up with it, which a pause of the traffic gives; under a stream of
//! commits with no pause it would grow without end, so at [`LOG_CAP`] frames
//! the hub checkpoints in the commit, as sqlite would have, copying only what
//! this thread has not copied yet (waiting out a checkpoint of the thread's
//! first, which sqlite would otherwise refuse it). A commit is as durable as before: a
//! checkpoint copies what is already in the log, and a crash in the middle
//! of one loses nothing. The thread sleeps until the log has grown, and ends
//! when the store is closed.

use super::db::Db;
use crate::sys::sqlite::AUTOCHECKPOINT_FRAMES;
use crossbeam_channel::{bounded, Receiver};
use rusqlite::Connection;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The log's length, in frames, at which the hub checkpoints in the commit
/// (about 16 MB with 4 KiB pages).
pub const LOG_CAP: u32 = 4 * AUTOCHECKPOINT_FRAMES;

/// Hands the checkpoints of `db` (the store at `path`) to a new thread. When
/// that thread or its connection cannot be had, `db` keeps sqlite's own
/// auto-checkpoint and the error says why.
pub fn start(db: &mut Db, path: &Path) -> Result<(), String> {
    let conn = Connection::open(path)
        .map_err(|e| format!("cannot open {} for its checkpoints: {e}", path.display()))?;
    // One pending ask is enough: the checkpoint copies whatever the log holds
    // when it runs.
    let (due_tx, due) = bounded::<()>(1);
    // Held by whichever of the two checkpoints: sqlite refuses a checkpoint
    // while another connection runs one, and the hub's at the cap must not
    // be refused (the log could not start over).
    let copying = Arc::new(Mutex::new(()));
    let path = path.to_path_buf();
    let theirs = Arc::clone(&copying);
    std::thread::Builder::new()
        .name("checkpoint".into())
        .spawn(move || run(&conn, &path, &due, &theirs))
        .map_err(|e| format!("cannot start the checkpoint thread: {e}"))?;
    // The log's length at which this thread is asked next; the log started
    // over when a commit finds it shorter than the one before.
    let (mut next, mut last) = (AUTOCHECKPOINT_FRAMES, 0);
    db.on_commit(move |frames, wal| {
        if frames < last {
            next = AUTOCHECKPOINT_FRAMES;
        }
        last = frames;
        if frames >= LOG_CAP {
            // Waits out a checkpoint of the thread's (only a stream of
            // commits with no pause gets here).
            let _copying = hold(&copying);
            wal.checkpoint();
            return;
        }
        if frames >= next {
            next = frames + AUTOCHECKPOINT_FRAMES;
            let _ = due_tx.try_send(());
        }
    });
    Ok(())
}

fn hold(m: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Checkpoints each time it is asked, until the store is closed (the asking
/// side is dropped with it).
fn run(conn: &Connection, path: &Path, due: &Receiver<()>, copying: &Mutex<()>) {
    let mut failing = false;
    for () in due.iter() {
        let done = {
            let _copying = hold(copying);
            checkpoint(conn)
        };
        match done {
            Ok(()) if failing => {
                failing = false;
                log::info!("checkpoints of {} work again", path.display());
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                log::warn!(
                    "cannot checkpoint {}: {e}; its log grows until a checkpoint works \
                     (nothing is lost meanwhile)",
                    path.display()
                );
            }
            Err(_) => {}
        }
    }
}

/// One `PASSIVE` checkpoint: as much of the log as no reader still needs.
fn checkpoint(conn: &Connection) -> rusqlite::Result<()> {
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::broker::db::{Durability, NewMessage};
    use crate::proto::{MsgKind, Peer};
    use std::path::PathBuf;
    use std::time::{Duration, Instant};

    /// A fresh store in a directory of its own, its checkpoints handed to the
    /// thread: the directory, the store's path, the store.
    fn checkpointed(tag: &str) -> (PathBuf, PathBuf, Db) {
        let dir = std::env::temp_dir().join(format!("hive-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("broker.db");
        let mut db = Db::open(&path, Durability::Normal).unwrap();
        start(&mut db, &path).unwrap();
        (dir, path, db)
    }

    /// One commit: message `n` queued for `a`.
    fn queue(db: &Db, n: usize) {
        let body = format!("message {n}");
        let m = NewMessage {
            from: &Peer::System,
            to: "a",
            body: &body,
            kind: &MsgKind::Message,
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        };
        db.insert_message(&m, 1).unwrap();
    }

    #[test]
    fn the_store_is_checkpointed_by_the_thread_once_its_log_is_long() {
        let (dir, path, db) = checkpointed("checkpoint");
        let size = || std::fs::metadata(&path).unwrap().len();
        let before = size();
        let mut sent = 0;
        // Commits until the log passes the mark; then the thread copies it
        // into the database file.
        let until = Instant::now() + Duration::from_secs(20);
        while size() == before {
            assert!(Instant::now() < until, "no checkpoint after {sent} commits");
            for _ in 0..100 {
                queue(&db, sent);
                sent += 1;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            sent >= 100,
            "the log was checkpointed early, after {sent} commits"
        );
        // Everything committed is there.
        drop(db);
        let db = Db::open(&path, Durability::Normal).unwrap();
        assert_eq!(db.count_queued("a").unwrap(), sent as u64);
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stream_of_commits_without_a_pause_keeps_the_log_bounded() {
        let (dir, _, db) = checkpointed("checkpoint-cap");
        let wal = dir.join("broker.db-wal");
        let mut largest = 0;
        // Several times the cap's worth of frames, with no pause for the
        // thread to catch up in.
        for i in 0..15_000 {
            queue(&db, i);
            if i % 500 == 0 {
                largest = largest.max(std::fs::metadata(&wal).unwrap().len());
            }
        }
        let frames = |bytes: u64| bytes / (4096 + 24);
        assert!(
            frames(largest) <= u64::from(LOG_CAP) + u64::from(AUTOCHECKPOINT_FRAMES),
            "the log reached {} frames",
            frames(largest)
        );
        assert_eq!(db.count_queued("a").unwrap(), 15_000);
        drop(db);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
