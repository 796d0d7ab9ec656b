//! Schema versions of the sqlite files hive keeps across releases
//! (`broker.db`, `turn-stats.db`): each file's version is its `PRAGMA
//! user_version`, and each file has one ordered list of numbered [`Step`]s. A
//! file opens through [`migrate`], which runs the steps above its version, each
//! in its own transaction together with the new version number, so a crash
//! mid-upgrade leaves the file at the last finished step. A file written by a
//! newer hive (a version above the last step) is refused, never guessed at.
//! A release that changes a schema appends a step; it never edits one that
//! shipped. `tests/migrations.rs` opens the fixtures of older releases. Also
//! here, for the same files: [`in_transaction`], a transaction whose `BEGIN`
//! and `COMMIT` are prepared once per connection.

use rusqlite::{Connection, Transaction};

/// One numbered change of a schema.
#[derive(Clone, Copy)]
pub struct Step {
    /// 1 for the first step; each next step is one more (see [`well_numbered`]).
    pub version: u32,
    /// What it changes, for the log.
    pub what: &'static str,
    /// The change, inside the step's transaction.
    pub apply: fn(&Transaction) -> rusqlite::Result<()>,
}

/// Runs `f` in one transaction whose `BEGIN` and `COMMIT` are prepared once
/// per connection (rusqlite's own transactions parse them anew each time,
/// which costs a short write as much as the write); a failure rolls back.
/// Not for a caller already inside a transaction. It takes the write lock at
/// its start (`IMMEDIATE`): a transaction that reads and then writes while
/// another connection may write (`broker.db`'s prune thread) would otherwise
/// fail at its first write with SQLITE_BUSY_SNAPSHOT when the other
/// committed in between, an error no busy timeout waits out.
pub fn in_transaction<T>(
    conn: &Connection,
    f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
    let done = f(conn).and_then(|v| {
        conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(v)
    });
    if done.is_err() && !conn.is_autocommit() {
        if let Err(e) = conn.execute_batch("ROLLBACK") {
            log::error!("cannot roll a failed transaction back: {e}");
        }
    }
    done
}

/// The version a file is at.
pub fn version(conn: &Connection) -> rusqlite::Result<u32> {
    conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))
        .map(|v| v.clamp(0, u32::MAX as i64) as u32)
}

/// Brings the file `name` (for messages) up to the last of `steps`; returns the
/// version it was at.
pub fn migrate(conn: &mut Connection, name: &str, steps: &[Step]) -> Result<u32, String> {
    let latest = steps.last().map_or(0, |s| s.version);
    let at = version(conn).map_err(|e| format!("cannot read the schema version of {name}: {e}"))?;
    if at > latest {
        return Err(format!(
            "{name} has schema version {at}, newer than this hive knows (version {latest}): \
             it was written by a newer hive; run that release, or a newer one"
        ));
    }
    // A file with no table yet is new: its steps are logged at debug, so a
    // first start's output is not a page of upgrades (the releases before
    // schema versions left tables at version 0: those are upgrades).
    let fresh = at == 0
        && conn
            .query_row("SELECT count(*) FROM sqlite_master", [], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(|e| format!("cannot read the tables of {name}: {e}"))?
            == 0;
    for step in steps.iter().filter(|s| s.version > at) {
        let fail = |e: rusqlite::Error| {
            format!(
                "cannot upgrade {name} to schema version {} ({}): {e}",
                step.version, step.what
            )
        };
        let tx = conn.transaction().map_err(fail)?;
        (step.apply)(&tx).map_err(fail)?;
        tx.pragma_update(None, "user_version", step.version)
            .map_err(fail)?;
        tx.commit().map_err(fail)?;
        if fresh {
            log::debug!("{name}: schema version {} ({})", step.version, step.what);
        } else if at > 0 || step.version > 1 {
            log::info!("{name}: schema version {} ({})", step.version, step.what);
        }
    }
    Ok(at)
}

/// True when `steps` start at 1 and their numbers rise: what every list must be
/// (checked by each list's tests). Numbers are handed out to the changes of a
/// release before they are merged, so a branch may hold a later step without
/// the ones between; a released list has no gap.
pub fn well_numbered(steps: &[Step]) -> bool {
    steps.first().is_none_or(|s| s.version == 1)
        && steps.windows(2).all(|w| w[0].version < w[1].version)
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEPS: &[Step] = &[
        Step {
            version: 1,
            what: "a table",
            apply: |tx| tx.execute_batch("CREATE TABLE IF NOT EXISTS t (x TEXT);"),
        },
        Step {
            version: 2,
            what: "a column",
            apply: |tx| tx.execute_batch("ALTER TABLE t ADD COLUMN y TEXT NOT NULL DEFAULT '';"),
        },
    ];

    #[test]
    fn steps_run_once_in_order_and_a_newer_file_is_refused() {
        assert!(well_numbered(STEPS));
        let mut c = Connection::open_in_memory().unwrap();
        assert_eq!(migrate(&mut c, "t.db", &STEPS[..1]).unwrap(), 0);
        c.execute("INSERT INTO t (x) VALUES ('kept')", []).unwrap();
        assert_eq!(migrate(&mut c, "t.db", STEPS).unwrap(), 1);
        assert_eq!(
            migrate(&mut c, "t.db", STEPS).unwrap(),
            2,
            "nothing left to run"
        );
        let y: String = c
            .query_row("SELECT y FROM t WHERE x = 'kept'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(y, "");
        let e = migrate(&mut c, "t.db", &STEPS[..1]).unwrap_err();
        assert!(
            e.contains("schema version 2, newer than this hive knows (version 1)"),
            "{e}"
        );
    }

    #[test]
    fn a_list_starts_at_one_and_rises() {
        let at = |v: u32| Step {
            version: v,
            ..STEPS[0]
        };
        assert!(well_numbered(&[]));
        assert!(well_numbered(&[at(1), at(2), at(5)]));
        assert!(!well_numbered(&[at(2)]));
        assert!(!well_numbered(&[at(1), at(3), at(3)]));
        assert!(!well_numbered(&[at(1), at(4), at(2)]));
    }

    #[test]
    fn a_failed_step_leaves_the_file_at_the_last_good_version() {
        const BAD: &[Step] = &[
            STEPS[0],
            Step {
                version: 2,
                what: "a broken step",
                apply: |tx| tx.execute_batch("ALTER TABLE nope ADD COLUMN z TEXT;"),
            },
        ];
        let mut c = Connection::open_in_memory().unwrap();
        let e = migrate(&mut c, "t.db", BAD).unwrap_err();
        assert!(
            e.contains("cannot upgrade t.db to schema version 2 (a broken step)"),
            "{e}"
        );
        assert_eq!(version(&c).unwrap(), 1);
    }
}
