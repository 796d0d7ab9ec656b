//! The operator's `search` and `history` across the hive, answered for the
//! supervisor on a thread of their own per query (`sup-search`,
//! `sup-history`), so the supervisor's loop never waits on HTTP: the thread
//! asks each agent page's `/api/history` with that page's token, like the
//! dashboard reads `/api/state`, within the time the caller waits, and sends
//! the answer on the query's reply channel. Hits of every agent are merged
//! newest first, with absolute links to the turns on the hive's one origin
//! (`ORIGIN/agent/NAME/turn/ID`); an agent whose page
//! did not answer is listed with why.

use super::pages::Page;
use crate::proto::cmd::{
    AgentError, History, HistoryReply, HitPage, Search, SearchReply, TurnPage,
};
use crate::proto::limits::HISTORY_LIMIT_DEFAULT;
use std::time::{Duration, Instant};

/// The longest one page may take to answer.
const PER_PAGE: Duration = Duration::from_secs(5);

/// The most bytes read of one page's answer: a page of history holds at most
/// 4 MiB of events, and at least one turn whatever its size.
const MAX_ANSWER: u64 = 16 * 1024 * 1024;

/// Runs `f` on a thread named `name` that sends its result on `reply`; a
/// thread that cannot start is answered at once.
pub fn spawn<T: Send + 'static>(
    name: &str,
    reply: crossbeam_channel::Sender<Result<T, String>>,
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) {
    let r = reply.clone();
    let started = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _ = r.send(f());
        });
    if let Err(e) = started {
        let _ = reply.send(Err(format!("cannot start a thread for the query: {e}")));
    }
}

/// `GET path` on `page` with its token, as JSON of type `T`.
fn get<T: serde::de::DeserializeOwned>(
    page: &Page,
    path_and_query: &str,
    deadline: Instant,
) -> Result<T, String> {
    let Some(socket) = &page.socket else {
        return Err("its page is not up (the agent is not running, or starting)".into());
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("not asked: the query ran out of time".into());
    }
    let token = page.token.as_deref();
    let (status, body) = super::pages::fetch(
        socket,
        &page.agent,
        path_and_query,
        token,
        MAX_ANSWER,
        left.min(PER_PAGE),
    )?;
    match status {
        200 => serde_json::from_slice(&body)
            .map_err(|e| format!("its page's answer is not what hive reads: {e}")),
        401 if token.is_none() => Err(super::pages::no_token(&page.agent)),
        code => {
            let body = String::from_utf8_lossy(&body);
            let why = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or_else(|| body.into_owned());
            Err(format!(
                "its page answered {code}: {}",
                crate::proto::text::preview(&why, 300)
            ))
        }
    }
}

/// A query string of `(key, value)`s, percent-encoded.
fn query(pairs: &[(&str, String)]) -> String {
    let enc = |s: &str| {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                b => format!("%{b:02X}"),
            })
            .collect::<String>()
    };
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// Searches the pages of `pages` in turn until `within` runs out; merges the
/// hits newest first, each linked to its turn on the hive's `origin`
/// (`http://127.0.0.1:7890/`).
pub fn search(pages: Vec<Page>, q: &Search, within: Duration, origin: &str) -> SearchReply {
    let deadline = Instant::now() + within;
    let limit = q.limit.unwrap_or(HISTORY_LIMIT_DEFAULT);
    let mut params = vec![("q", q.words.clone()), ("limit", limit.to_string())];
    if let Some(s) = q.since {
        params.push(("since", s.to_string()));
    }
    let path = format!("/api/history?{}", query(&params));
    let (mut hits, mut more, mut errors) = (Vec::new(), false, Vec::new());
    for page in pages {
        match get::<HitPage>(&page, &path, deadline) {
            Ok(p) => {
                more |= p.more;
                // The link is made here from the turn's number: a page's own
                // text never becomes a link the operator follows.
                hits.extend(p.hits.into_iter().map(|mut h| {
                    h.agent = page.agent.clone();
                    h.link = format!("{origin}agent/{}/turn/{}", page.agent, h.turn);
                    h
                }));
            }
            Err(error) => errors.push(AgentError {
                agent: page.agent.clone(),
                error,
            }),
        }
    }
    hits.sort_by(|a, b| (b.at, &a.agent, b.event).cmp(&(a.at, &b.agent, a.event)));
    if hits.len() > limit as usize {
        hits.truncate(limit as usize);
        more = true;
    }
    SearchReply { hits, more, errors }
}

/// One page of the agent's turns after `q.after`.
pub fn history(page: Page, q: &History, within: Duration) -> Result<HistoryReply, String> {
    let deadline = Instant::now() + within;
    let mut params = vec![
        ("after", q.after.unwrap_or(0).to_string()),
        (
            "limit",
            q.limit.unwrap_or(HISTORY_LIMIT_DEFAULT).to_string(),
        ),
    ];
    if let Some(s) = q.since {
        params.push(("since", s.to_string()));
    }
    let path = format!("/api/history?{}", query(&params));
    let p: TurnPage = get(&page, &path, deadline).map_err(|e| format!("{}: {e}", page.agent))?;
    Ok(HistoryReply {
        turns: p.turns,
        more: p.more,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_encoded_and_a_page_that_is_down_is_an_error() {
        assert_eq!(
            query(&[("q", "a \"b\" -c&d".into()), ("limit", "5".into())]),
            "q=a%20%22b%22%20-c%26d&limit=5"
        );
        let down = Page {
            agent: "ana".into(),
            socket: None,
            token: None,
        };
        let r = search(
            vec![down],
            &Search {
                words: "x".into(),
                agent: None,
                since: None,
                limit: None,
            },
            Duration::from_secs(1),
            "http://127.0.0.1:7890/",
        );
        assert!(r.hits.is_empty());
        assert_eq!(r.errors[0].agent, "ana");
        assert!(r.errors[0].error.contains("not up"), "{:?}", r.errors);
    }
}
