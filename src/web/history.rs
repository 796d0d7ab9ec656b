//! The page's history endpoints, over the turn log's reader
//! ([`crate::history::Reader`], its own read-only connection on its own
//! thread): `GET /api/history` (the newest turns, the turns before or after
//! one, one turn, or a search) and `GET /turn/ID` (the page showing one turn
//! alone; 404 "pruned" once the turn is gone). Both sit behind the guard and
//! the token like every route. `docs/web.md` shows the JSON.

use crate::history::{ReadError, Reader};
use crate::http::{self, Reply};
use crate::proto::limits::{HISTORY_LIMIT_DEFAULT, HISTORY_LIMIT_MAX, MAX_SEARCH_CHARS};

/// A reader's refusal as an HTTP answer.
fn refused(e: ReadError) -> Reply {
    let status = match e {
        ReadError::Unavailable(_) => 503,
        ReadError::Invalid(_) => 400,
        ReadError::Missing { .. } => 404,
    };
    Reply::error(status, e.to_string())
}

/// A whole-number parameter, or a 400 naming it.
fn number(query: &str, key: &str) -> Result<Option<i64>, Reply> {
    match http::form_value(query, key) {
        None => Ok(None),
        Some(v) => v.trim().parse::<i64>().map(Some).map_err(|_| {
            Reply::error(
                400,
                format!("{key} must be a whole number, not {}", http::prefix(&v)),
            )
        }),
    }
}

/// `GET /api/history`: `?q=WORDS[&since=T][&limit=N]` searches;
/// `?turn=ID` is one turn; `?after=ID[&since=T][&limit=N]` the turns after
/// one, oldest first; otherwise `[?before=ID][&limit=N]` the newest turns (or
/// those before one), oldest first.
pub fn api(reader: &Reader, query: &str) -> Reply {
    match answer(reader, query) {
        Ok(r) | Err(r) => r,
    }
}

fn answer(reader: &Reader, query: &str) -> Result<Reply, Reply> {
    let limit = match number(query, "limit")? {
        None => HISTORY_LIMIT_DEFAULT,
        Some(n) if (1..=i64::from(HISTORY_LIMIT_MAX)).contains(&n) => n as u32,
        Some(_) => {
            return Err(Reply::error(
                400,
                format!("limit must be a whole number from 1 to {HISTORY_LIMIT_MAX}"),
            ))
        }
    };
    let since = number(query, "since")?;
    let before = number(query, "before")?;
    let after = number(query, "after")?;
    let turn = number(query, "turn")?;
    let words = http::form_value(query, "q");
    let given = [
        words.is_some(),
        turn.is_some(),
        before.is_some(),
        after.is_some(),
    ];
    if given.iter().filter(|g| **g).count() > 1 {
        return Err(Reply::error(
            400,
            "give one of q, turn, before and after, not several",
        ));
    }
    let r = if let Some(words) = words {
        if words.chars().count() > MAX_SEARCH_CHARS {
            return Err(Reply::error(
                400,
                format!("q must be at most {MAX_SEARCH_CHARS} characters"),
            ));
        }
        reader
            .search(&words, since, limit)
            .map(|hits| Reply::json(200, &hits))
    } else if let Some(id) = turn {
        reader.turn(id).map(|t| Reply::json(200, &t))
    } else if let Some(after) = after {
        reader
            .after(after, since, limit)
            .map(|p| Reply::json(200, &p))
    } else {
        if since.is_some() {
            return Err(Reply::error(
                400,
                "since goes with q or after (the newest turns are always the newest)",
            ));
        }
        reader.before(before, limit).map(|p| Reply::json(200, &p))
    };
    Ok(r.unwrap_or_else(refused))
}

/// `GET /turn/ID`: the page, which then shows that turn alone, or a 404 that
/// says the turn was pruned (or never was).
pub fn turn_page(reader: &Reader, path: &str, page: impl FnOnce() -> Reply) -> Reply {
    let raw = path.trim_start_matches("/turn/").trim_end_matches('/');
    let Ok(id) = raw.parse::<i64>() else {
        return Reply::error(
            404,
            format!(
                "{} is not a turn: /turn/ID takes a turn's number",
                http::prefix(path)
            ),
        );
    };
    match reader.turn(id) {
        Ok(_) => page(),
        Err(e) => refused(e),
    }
}
