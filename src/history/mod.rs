//! The durable turn log of one agent (`STATE/history.db`, mode 0600): every
//! event of the live stream that belongs to a turn — the message that woke
//! it, claude's stream lines, the harness's notes, the turn's end with its
//! outcome and the policy's decision — grouped into [`Turn`]s and indexed for
//! full-text search (sqlite's FTS5). The harness is its one writer: the event
//! bus hands each event to a [`Tap`] that never blocks, and the
//! `history-writer` thread ([`writer`]) owns the read-write connection,
//! groups the events into turns, cuts long strings, prunes by size and age
//! ([`Bounds`]) and turns a full disk or a read-only dir into a warning. The
//! agent page is a reader: [`Reader`] owns a read-only connection on the
//! `history-read` thread and answers pages of turns, one turn, and searches
//! ([`reader`]). The schema migrates through its own list of steps
//! ([`schema`]). `docs/web.md` shows the JSON of a turn and of a hit.

pub mod reader;
pub mod schema;
mod text;
pub mod writer;

pub use crate::proto::cmd::{Hit, HitPage, Turn, TurnKind, TurnPage};
pub use reader::{ReadError, Reader};
pub use writer::{open, Loggable, Opened, Tap, View, Writer};

use crate::sys::env::Env;
use std::time::Duration;

/// The log's file in the agent's state dir.
pub const FILE: &str = "history.db";

/// A string in an event longer than this (a tool's result, a file's body) is
/// kept cut, with `…[cut, N bytes]` saying how much was left off.
pub const CUT_BYTES: usize = 16 * 1024;

/// How much history an agent keeps: the oldest turns go first once the file
/// holds more than `max_bytes`, and every turn older than `max_age` goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub max_bytes: u64,
    pub max_age: Duration,
}

impl Bounds {
    /// `HIVE_HISTORY_MAX_MB` without the variable.
    pub const DEFAULT_MB: u64 = 256;
    /// `HIVE_HISTORY_DAYS` without the variable.
    pub const DEFAULT_DAYS: u64 = 90;

    /// `HIVE_HISTORY_MAX_MB` and `HIVE_HISTORY_DAYS`; a bad value is an error
    /// naming its variable.
    pub fn read(env: &Env) -> Result<Bounds, String> {
        let mb = env.num("HIVE_HISTORY_MAX_MB", Self::DEFAULT_MB)?;
        let days = env.num("HIVE_HISTORY_DAYS", Self::DEFAULT_DAYS)?;
        if mb == 0 || mb > 1 << 20 {
            return Err(Env::bad(
                "HIVE_HISTORY_MAX_MB",
                &mb.to_string(),
                "a size in MiB from 1 to 1048576",
            ));
        }
        if days == 0 || days > 100 * 365 {
            return Err(Env::bad(
                "HIVE_HISTORY_DAYS",
                &days.to_string(),
                "a number of days from 1 to 36500",
            ));
        }
        Ok(Bounds {
            max_bytes: mb * 1024 * 1024,
            max_age: Duration::from_secs(days * 86400),
        })
    }
}

impl Default for Bounds {
    fn default() -> Bounds {
        Bounds {
            max_bytes: Self::DEFAULT_MB * 1024 * 1024,
            max_age: Duration::from_secs(Self::DEFAULT_DAYS * 86400),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn bounds(vars: &[(&str, &str)]) -> Result<Bounds, String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Bounds::read(&Env::new(&|k| m.get(k).cloned()))
    }

    #[test]
    fn bounds_default_and_refuse_nonsense() {
        assert_eq!(bounds(&[]).unwrap(), Bounds::default());
        let b = bounds(&[("HIVE_HISTORY_MAX_MB", "3"), ("HIVE_HISTORY_DAYS", "2")]).unwrap();
        assert_eq!(b.max_bytes, 3 * 1024 * 1024);
        assert_eq!(b.max_age, Duration::from_secs(2 * 86400));
        for (k, v) in [
            ("HIVE_HISTORY_MAX_MB", "0"),
            ("HIVE_HISTORY_MAX_MB", "lots"),
            ("HIVE_HISTORY_DAYS", "0"),
            ("HIVE_HISTORY_DAYS", "-1"),
        ] {
            let e = bounds(&[(k, v)]).unwrap_err();
            assert!(e.contains(k), "{e}");
        }
    }
}
