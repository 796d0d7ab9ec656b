//! The log's readers' side: [`Reader`] runs the `history-read` thread while
//! it has asks (a [`crate::demand::Slot`]: started by an ask, ended when none
//! is left), which owns a read-only connection to `STATE/history.db` (opened
//! when first needed, again after an error, kept between threads) and
//! answers `Ask`s one at a time: the
//! newest turns or those before a turn (the page's scrollback), the turns
//! after one (exports), one turn (`/turn/ID`) and searches. Every answer is
//! read in one snapshot and bounded in size ([`PAGE_BUDGET`]). A search
//! quotes every word as an FTS5 phrase ([`fts_query`]), so operators in what
//! a person typed (`"`, `-`, `NEAR`, `*`, `OR`) are searched as words.

use super::schema;
use super::{Hit, HitPage, Turn, TurnKind, TurnPage, FILE};
use crate::demand::Slot;
use crate::proto::text::{excerpt, preview};
use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use rusqlite::{params, Connection, OpenFlags, OptionalExtension, Row};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bytes of stored events one page of turns carries at most (at least one
/// turn always goes out).
pub const PAGE_BUDGET: u64 = 4 * 1024 * 1024;

/// Matching events a search looks through at most.
const SCAN_MAX: usize = 20_000;

/// The longest snippet, in characters (a "word" may be a 16 KiB token).
const MAX_SNIPPET: usize = 400;

/// Words of a search that count; more are left out.
const MAX_WORDS: usize = 32;

/// How long a caller waits for the reader.
const WAIT: Duration = Duration::from_secs(10);

/// The `history-read` thread's stack: sqlite's queries and the JSON of
/// stored events (which the writer stored, parsed with serde_json's
/// recursion limit). A test reads a turn with an event nested to that limit
/// on a thread of this size.
pub const STACK: usize = 512 * 1024;

/// Why a read has no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// There is no log to read, or it cannot be read now (a 503).
    Unavailable(String),
    /// The request cannot be answered as asked (a 400).
    Invalid(String),
    /// No such turn: `pruned` when it existed once (a 404).
    Missing { id: i64, pruned: bool },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Unavailable(e) | ReadError::Invalid(e) => f.write_str(e),
            ReadError::Missing { id, pruned: true } => write!(
                f,
                "turn {id} was pruned: the history keeps HIVE_HISTORY_MAX_MB and HIVE_HISTORY_DAYS"
            ),
            ReadError::Missing { id, pruned: false } => write!(f, "there is no turn {id}"),
        }
    }
}

type Reply<T> = Sender<Result<T, ReadError>>;

/// What a reader asks the `history-read` thread.
enum Ask {
    /// The newest `limit` turns, or those before turn `before`.
    Before {
        before: Option<i64>,
        limit: u32,
        reply: Reply<TurnPage>,
    },
    /// The oldest `limit` turns after turn `after` started at `since` or later.
    After {
        after: i64,
        since: Option<i64>,
        limit: u32,
        reply: Reply<TurnPage>,
    },
    /// One turn.
    One { id: i64, reply: Reply<Turn> },
    /// Turns whose events hold every word, newest first.
    Search {
        words: String,
        since: Option<i64>,
        limit: u32,
        reply: Reply<HitPage>,
    },
}

/// The handle on the `history-read` thread, which runs while it has asks.
pub struct Reader {
    tx: Sender<Ask>,
    rx: Receiver<Ask>,
    /// The connection, kept while no thread runs.
    slot: Slot<Conn>,
}

/// What the reader keeps between its threads.
struct Conn {
    path: PathBuf,
    db: Option<Connection>,
}

impl Reader {
    /// The reader of the log in `state_dir` (the file may not exist yet:
    /// each read tries again). No thread runs until the first read.
    pub fn start(state_dir: &Path) -> Result<Reader, String> {
        let (tx, rx) = unbounded();
        Ok(Reader {
            tx,
            rx,
            slot: Slot::new(Conn {
                path: state_dir.join(FILE),
                db: None,
            }),
        })
    }

    fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Ask) -> Result<T, ReadError> {
        let (reply, answer) = bounded(1);
        if self.tx.send(make(reply)).is_err() {
            return Err(ReadError::Unavailable(
                "the history reader has stopped".into(),
            ));
        }
        let rx = self.rx.clone();
        match self
            .slot
            .wake("history-read", STACK, move |c, slot| serve(c, rx, slot))
        {
            Ok(true) => {}
            Ok(false) => {
                return Err(ReadError::Unavailable(
                    "the history reader has stopped".into(),
                ))
            }
            Err(e) => {
                // The ask stays queued for the next thread; this caller is
                // answered now.
                return Err(ReadError::Unavailable(format!(
                    "cannot start the history reader: {e}"
                )));
            }
        }
        answer.recv_timeout(WAIT).unwrap_or_else(|_| {
            Err(ReadError::Unavailable(format!(
                "the history did not answer in {} s",
                WAIT.as_secs()
            )))
        })
    }

    /// The newest `limit` turns (`before` None) or the `limit` turns before
    /// turn `before`, oldest first.
    pub fn before(&self, before: Option<i64>, limit: u32) -> Result<TurnPage, ReadError> {
        self.ask(|reply| Ask::Before {
            before,
            limit,
            reply,
        })
    }

    /// The `limit` turns after turn `after`, started at `since` or later,
    /// oldest first.
    pub fn after(&self, after: i64, since: Option<i64>, limit: u32) -> Result<TurnPage, ReadError> {
        self.ask(|reply| Ask::After {
            after,
            since,
            limit,
            reply,
        })
    }

    pub fn turn(&self, id: i64) -> Result<Turn, ReadError> {
        self.ask(|reply| Ask::One { id, reply })
    }

    /// Turns whose events hold every word of `words`, newest first (the
    /// newest matching event of each).
    pub fn search(
        &self,
        words: &str,
        since: Option<i64>,
        limit: u32,
    ) -> Result<HitPage, ReadError> {
        let words = words.to_string();
        self.ask(|reply| Ask::Search {
            words,
            since,
            limit,
            reply,
        })
    }
}

/// The `history-read` thread: one ask at a time, on one connection, until
/// none is left.
fn serve(mut conn: Conn, rx: Receiver<Ask>, slot: Slot<Conn>) {
    loop {
        while let Ok(ask) = rx.try_recv() {
            answer(&mut conn, ask);
        }
        match slot.park(conn, || rx.is_empty()) {
            None => return,
            Some(c) => conn = c,
        }
    }
}

/// Answers one ask.
fn answer(conn: &mut Conn, ask: Ask) {
    let Conn { path, db } = conn;
    match ask {
        Ask::Before {
            before,
            limit,
            reply,
        } => {
            let _ = reply.send(with(path, db, |c| newest(c, before, limit)));
        }
        Ask::After {
            after,
            since,
            limit,
            reply,
        } => {
            let _ = reply.send(with(path, db, |c| later(c, after, since, limit)));
        }
        Ask::One { id, reply } => {
            let _ = reply.send(with(path, db, |c| one(c, id)));
        }
        Ask::Search {
            words,
            since,
            limit,
            reply,
        } => {
            let _ = reply.send(with(path, db, |c| search(c, &words, since, limit)));
        }
    }
}

/// What a query fails with.
enum Fail {
    Db(rusqlite::Error),
    Read(ReadError),
}

impl From<rusqlite::Error> for Fail {
    fn from(e: rusqlite::Error) -> Fail {
        Fail::Db(e)
    }
}

/// Runs `f` on the connection, opening it first; a database error drops it
/// (the next read opens it again).
fn with<T>(
    path: &Path,
    db: &mut Option<Connection>,
    f: impl FnOnce(&Connection) -> Result<T, Fail>,
) -> Result<T, ReadError> {
    if db.is_none() {
        *db = Some(connect(path)?);
    }
    let Some(c) = db.as_ref() else {
        return Err(ReadError::Unavailable("the history is not open".into()));
    };
    match f(c) {
        Ok(v) => Ok(v),
        Err(Fail::Read(e)) => Err(e),
        Err(Fail::Db(e)) => {
            *db = None;
            Err(ReadError::Unavailable(format!(
                "cannot read the history: {e}"
            )))
        }
    }
}

fn connect(path: &Path) -> Result<Connection, ReadError> {
    if !path.exists() {
        return Err(ReadError::Unavailable(format!(
            "there is no history: {} does not exist (the harness's log says why)",
            path.display()
        )));
    }
    let c = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .and_then(|c| {
        c.busy_timeout(Duration::from_secs(2))?;
        Ok(c)
    })
    .map_err(|e| ReadError::Unavailable(format!("cannot open the history: {e}")))?;
    schema::check_readable(&c).map_err(ReadError::Unavailable)?;
    Ok(c)
}

const TURN_COLUMNS: &str = "id, kind, started_at, ended_at, sender, body, message_id, ok, outcome,
    note, decision, duration_ms, cost_usd, tokens_in, tokens_out, bytes";

/// A turn's row (its events are read after), and its stored bytes.
fn turn_row(r: &Row) -> rusqlite::Result<(Turn, u64)> {
    let kind: String = r.get(1)?;
    let turn = Turn {
        id: r.get(0)?,
        kind: if kind == "message" {
            TurnKind::Message
        } else {
            TurnKind::Harness
        },
        started_at: r.get(2)?,
        ended_at: r.get(3)?,
        from: r.get(4)?,
        body: r.get(5)?,
        message_id: r.get(6)?,
        ok: r.get(7)?,
        outcome: r.get(8)?,
        note: r.get(9)?,
        decision: r.get(10)?,
        duration_ms: r.get::<_, Option<i64>>(11)?.map(|d| d.max(0) as u64),
        cost_usd: r.get(12)?,
        tokens_in: r.get::<_, i64>(13)?.max(0) as u64,
        tokens_out: r.get::<_, i64>(14)?.max(0) as u64,
        events: Vec::new(),
        events_left_off: 0,
    };
    Ok((turn, r.get::<_, i64>(15)?.max(0) as u64))
}

fn events_of(db: &Connection, turn: &mut Turn) -> rusqlite::Result<()> {
    let mut stmt = db.prepare_cached("SELECT json FROM events WHERE turn = ?1 ORDER BY id")?;
    let rows = stmt.query_map([turn.id], |r| r.get::<_, String>(0))?;
    for json in rows {
        turn.events
            .push(serde_json::from_str(&json?).unwrap_or(Value::Null));
    }
    Ok(())
}

/// Turns from `rows` (in the order wanted) while they fit the budget; true
/// when some were left.
fn fill(db: &Connection, rows: Vec<(Turn, u64)>) -> rusqlite::Result<(Vec<Turn>, bool)> {
    let (mut out, mut used) = (Vec::new(), 0u64);
    let total = rows.len();
    for (mut t, bytes) in rows {
        if !out.is_empty() && used + bytes > PAGE_BUDGET {
            break;
        }
        used += bytes;
        events_of(db, &mut t)?;
        out.push(t);
    }
    let left = out.len() < total;
    Ok((out, left))
}

fn last_event_id(db: &Connection) -> rusqlite::Result<u64> {
    db.query_row("SELECT coalesce(max(id), 0) FROM events", [], |r| {
        r.get::<_, i64>(0)
    })
    .map(|v| v.max(0) as u64)
}

fn newest(db: &Connection, before: Option<i64>, limit: u32) -> Result<TurnPage, Fail> {
    let tx = db.unchecked_transaction()?;
    let rows = {
        let mut stmt = tx.prepare(&format!(
            "SELECT {TURN_COLUMNS} FROM turns WHERE id < ?1 ORDER BY id DESC LIMIT ?2"
        ))?;
        let rows = stmt.query_map(params![before.unwrap_or(i64::MAX), limit], turn_row)?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    let (mut turns, left) = fill(&tx, rows)?;
    let more = left
        || match turns.last() {
            Some(oldest) => tx
                .query_row("SELECT 1 FROM turns WHERE id < ?1", [oldest.id], |_| Ok(()))
                .optional()?
                .is_some(),
            None => false,
        };
    turns.reverse();
    Ok(TurnPage {
        turns,
        more,
        last_event_id: last_event_id(&tx)?,
    })
}

fn later(db: &Connection, after: i64, since: Option<i64>, limit: u32) -> Result<TurnPage, Fail> {
    let tx = db.unchecked_transaction()?;
    let since = since.unwrap_or(i64::MIN);
    let rows = {
        let mut stmt = tx.prepare(&format!(
            "SELECT {TURN_COLUMNS} FROM turns WHERE id > ?1 AND started_at >= ?2
             ORDER BY id LIMIT ?3"
        ))?;
        let rows = stmt.query_map(params![after, since, limit], turn_row)?;
        rows.collect::<rusqlite::Result<Vec<_>>>()?
    };
    let (turns, left) = fill(&tx, rows)?;
    let more = left
        || match turns.last() {
            Some(newest) => tx
                .query_row(
                    "SELECT 1 FROM turns WHERE id > ?1 AND started_at >= ?2",
                    params![newest.id, since],
                    |_| Ok(()),
                )
                .optional()?
                .is_some(),
            None => false,
        };
    Ok(TurnPage {
        turns,
        more,
        last_event_id: last_event_id(&tx)?,
    })
}

fn one(db: &Connection, id: i64) -> Result<Turn, Fail> {
    let tx = db.unchecked_transaction()?;
    let row = tx
        .query_row(
            &format!("SELECT {TURN_COLUMNS} FROM turns WHERE id = ?1"),
            [id],
            turn_row,
        )
        .optional()?;
    let Some((mut turn, _)) = row else {
        let highest: i64 = tx
            .query_row(
                "SELECT coalesce(max(seq), 0) FROM sqlite_sequence WHERE name = 'turns'",
                [],
                |r| r.get(0),
            )
            .optional()?
            .unwrap_or(0);
        return Err(Fail::Read(ReadError::Missing {
            id,
            pruned: id >= 1 && id <= highest,
        }));
    };
    events_of(&tx, &mut turn)?;
    Ok(turn)
}

/// `words` as an FTS5 query in which every word is a quoted phrase (and so
/// means only itself); words without a letter or digit are left out.
pub fn fts_query(words: &str) -> Result<String, ReadError> {
    let terms: Vec<String> = words
        .split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .take(MAX_WORDS)
        .map(|w| format!("\"{}\"", w.replace('"', "\"\"")))
        .collect();
    if terms.is_empty() {
        return Err(ReadError::Invalid(format!(
            "{} has no word to search for",
            excerpt(words)
        )));
    }
    Ok(terms.join(" "))
}

fn search(db: &Connection, words: &str, since: Option<i64>, limit: u32) -> Result<HitPage, Fail> {
    let query = fts_query(words).map_err(Fail::Read)?;
    let refused = |e: rusqlite::Error| {
        Fail::Read(ReadError::Invalid(format!(
            "cannot search for {}: {e}",
            excerpt(words)
        )))
    };
    let tx = db.unchecked_transaction()?;
    // The newest matching event of each turn, without snippets (cheap), then
    // a snippet for each of those only.
    let mut hits = Vec::new();
    let mut more = false;
    {
        let mut stmt = tx.prepare(
            "SELECT rowid, turn, at FROM search WHERE search MATCH ?1 AND at >= ?2
             ORDER BY rowid DESC",
        )?;
        let mut rows = stmt
            .query(params![query, since.unwrap_or(i64::MIN)])
            .map_err(refused)?;
        let mut seen = HashSet::new();
        let mut scanned = 0usize;
        while let Some(r) = rows.next().map_err(refused)? {
            scanned += 1;
            let turn: i64 = r.get(1)?;
            if seen.insert(turn) {
                if hits.len() as u32 >= limit {
                    more = true;
                    break;
                }
                hits.push(Hit {
                    agent: String::new(),
                    turn,
                    event: r.get(0)?,
                    at: r.get(2)?,
                    from: None,
                    snippet: String::new(),
                    link: format!("/turn/{turn}"),
                });
            }
            if scanned >= SCAN_MAX {
                more = true;
                break;
            }
        }
    }
    let mut snippet = tx.prepare_cached(
        "SELECT snippet(search, 0, '«', '»', '…', 16) FROM search
         WHERE search MATCH ?1 AND rowid = ?2",
    )?;
    for h in &mut hits {
        let text: Option<String> = snippet
            .query_row(params![query, h.event], |r| r.get(0))
            .optional()
            .map_err(refused)?;
        h.snippet = preview(&text.unwrap_or_default(), MAX_SNIPPET);
    }
    let mut from = tx.prepare_cached("SELECT sender FROM turns WHERE id = ?1")?;
    for h in &mut hits {
        h.from = from
            .query_row([h.turn], |r| r.get::<_, Option<String>>(0))
            .optional()?
            .flatten();
    }
    Ok(HitPage { hits, more })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_is_a_phrase_and_operators_mean_themselves() {
        assert_eq!(fts_query("deploy prod").unwrap(), r#""deploy" "prod""#);
        assert_eq!(
            fts_query(r#"say "hi" NEAR(a b) -x y* OR"#).unwrap(),
            r#""say" """hi""" "NEAR(a" "b)" "-x" "y*" "OR""#
        );
        assert_eq!(fts_query("a - * \"").unwrap(), r#""a""#);
        assert!(matches!(fts_query(" - * "), Err(ReadError::Invalid(_))));
    }
}
