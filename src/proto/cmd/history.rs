//! An agent's turn history, across the hive: the operator's `search` and
//! `history`, which `hive up`'s supervisor answers by asking each agent
//! page's `/api/history`, and the shapes both sides read — a [`Turn`] as the
//! page keeps it and a search [`Hit`]. The page (`hive serve`) writes these
//! shapes and the supervisor (`hive up`) reads them back, so they live here,
//! in the contract, once.

use crate::proto::command::{Command, Invalid};
use crate::proto::ident::check_name;
use crate::proto::limits::{HISTORY_LIMIT_MAX, MAX_SEARCH_CHARS};
use crate::proto::reply::is_zero;
use crate::proto::text::excerpt;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What woke a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnKind {
    /// A message from the inbox: the turn starts with it.
    Message,
    /// What the harness did between messages (its boot notes, a checkpoint
    /// turn, a compaction): no message started it.
    Harness,
}

/// One turn of an agent's history: the message that woke it, every event of
/// the live stream it had (in order), and how it ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// Increasing; never given twice, so a pruned turn's id stays unused.
    pub id: i64,
    pub kind: TurnKind,
    /// Unix seconds of its first event.
    pub started_at: i64,
    /// Unix seconds of its `turn_end`; null while it runs, and for a turn the
    /// harness never finished (it was stopped or killed meanwhile).
    pub ended_at: Option<i64>,
    /// The message's sender and body (`message` turns).
    pub from: Option<String>,
    pub body: Option<String>,
    pub message_id: Option<i64>,
    /// The `turn_end`'s fields.
    pub ok: Option<bool>,
    pub outcome: Option<String>,
    pub note: Option<String>,
    /// What the turn loop decided when it ended (`docs/turn-loop.md`).
    pub decision: Option<String>,
    pub duration_ms: Option<u64>,
    /// Summed over the `result` lines of every claude run in the turn.
    pub cost_usd: f64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// Its events as the live stream sent them (`docs/web.md`), each with its
    /// `id` and `at` (unix seconds); strings over 16 KiB are cut.
    pub events: Vec<Value>,
    /// Events left out to keep an answer within its size limit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub events_left_off: u64,
}

/// One search hit: the newest matching event of a turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hit {
    /// The agent (set by the supervisor; a page leaves it out).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub agent: String,
    pub turn: i64,
    pub event: i64,
    /// Unix seconds of the event.
    pub at: i64,
    /// The turn's sender (`message` turns).
    pub from: Option<String>,
    /// A few words around the match, the matched words between `«` and `»`.
    pub snippet: String,
    /// Where the turn opens alone: `/turn/ID` on the agent's page, an
    /// absolute URL across the hive.
    pub link: String,
}

/// `GET /api/history?before=…` and `?after=…`: a page of turns, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnPage {
    pub turns: Vec<Turn>,
    /// More turns lie beyond this page (older for `before`, newer for `after`).
    pub more: bool,
    /// The newest event id the history held when it answered: a page resumes
    /// the live stream after it (`/events?last_event_id=`).
    pub last_event_id: u64,
}

/// `GET /api/history?q=…`: hits, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HitPage {
    pub hits: Vec<Hit>,
    /// More turns matched than the limit.
    pub more: bool,
}

/// An agent whose history could not be read, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentError {
    pub agent: String,
    pub error: String,
}

/// Operator: searches the history of every agent (or one), through `hive
/// up`'s supervisor. Each word is searched as a word: FTS syntax in `words`
/// means nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Search {
    pub words: String,
    /// Only this agent.
    #[serde(default)]
    pub agent: Option<String>,
    /// Only events at or after this unix time.
    #[serde(default)]
    pub since: Option<i64>,
    /// Most hits (default 20, at most 200).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// Answer to `search`: the hits of every agent, newest first, and the agents
/// that did not answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchReply {
    pub hits: Vec<Hit>,
    /// More hits than the limit (or than fit the answer).
    pub more: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<AgentError>,
}

impl Command for Search {
    type Reply = SearchReply;
    fn validate(&self) -> Result<(), Invalid> {
        if !self.words.chars().any(char::is_alphanumeric) {
            return Err(Invalid::arg(
                "words",
                format!("{} has no word to search for", excerpt(&self.words)),
            ));
        }
        if self.words.chars().count() > MAX_SEARCH_CHARS {
            return Err(Invalid::arg(
                "words",
                format!("must be at most {MAX_SEARCH_CHARS} characters"),
            ));
        }
        if let Some(a) = &self.agent {
            check_name(a).map_err(Invalid::Whole)?;
        }
        check_limit(self.limit)
    }
}

/// Operator: one agent's turns, oldest first, a page at a time, through `hive
/// up`'s supervisor (`hive history`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct History {
    pub agent: String,
    /// Only turns started at or after this unix time.
    #[serde(default)]
    pub since: Option<i64>,
    /// Only turns after this turn id (the last one of the previous page).
    #[serde(default)]
    pub after: Option<i64>,
    /// Most turns (default 20, at most 200).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// Answer to `history`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryReply {
    pub turns: Vec<Turn>,
    /// Newer turns follow: ask again with `after` = the last turn's id.
    pub more: bool,
}

impl Command for History {
    type Reply = HistoryReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_name(&self.agent).map_err(Invalid::Whole)?;
        check_limit(self.limit)
    }
}

fn check_limit(limit: Option<u32>) -> Result<(), Invalid> {
    match limit {
        Some(n) if n == 0 || n > HISTORY_LIMIT_MAX => Err(Invalid::arg(
            "limit",
            format!("must be 1 to {HISTORY_LIMIT_MAX}, not {n}"),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for Search {
        fn sample() -> Self {
            Search {
                words: "deploy \"prod\" -x".into(),
                agent: Some("ana".into()),
                since: Some(1_767_000_000),
                limit: Some(20),
            }
        }
    }
    impl Sample for History {
        fn sample() -> Self {
            History {
                agent: "ana".into(),
                since: None,
                after: Some(12),
                limit: None,
            }
        }
    }

    #[test]
    fn words_limits_and_names_are_checked() {
        let s = |w: &str| Search {
            words: w.into(),
            agent: None,
            since: None,
            limit: None,
        };
        for bad in ["", "  ", "\" - * ()"] {
            let e = s(bad).validate().unwrap_err().to_string();
            assert!(e.contains("has no word to search for"), "{bad:?}: {e}");
        }
        assert!(s("NEAR(a b) \"x").validate().is_ok());
        let long = s(&"w".repeat(MAX_SEARCH_CHARS + 1));
        assert!(long.validate().unwrap_err().to_string().contains("at most"));
        let e = Search {
            limit: Some(0),
            ..s("x")
        }
        .validate()
        .unwrap_err();
        assert_eq!(e.to_string(), "limit must be 1 to 200, not 0");
        let e = History {
            agent: "Ana!".into(),
            since: None,
            after: None,
            limit: Some(201),
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().starts_with("agent name \"Ana!\""), "{e}");
    }

    #[test]
    fn turns_and_hits_read_back() {
        let t = Turn {
            id: 3,
            kind: TurnKind::Message,
            started_at: 10,
            ended_at: None,
            from: Some("operator".into()),
            body: Some("hi".into()),
            message_id: Some(7),
            ok: None,
            outcome: None,
            note: None,
            decision: None,
            duration_ms: None,
            cost_usd: 0.0,
            tokens_in: 0,
            tokens_out: 0,
            events: vec![serde_json::json!({"id": 40, "type": "note", "text": "x", "at": 10})],
            events_left_off: 0,
        };
        let text = serde_json::to_string(&t).unwrap();
        assert!(!text.contains("events_left_off"), "{text}");
        assert_eq!(serde_json::from_str::<Turn>(&text).unwrap(), t);
        let h: Hit = serde_json::from_str(
            r#"{"turn":3,"event":40,"at":10,"from":null,"snippet":"«x»","link":"/turn/3"}"#,
        )
        .unwrap();
        assert_eq!(h.agent, "");
    }
}
