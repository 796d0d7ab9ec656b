//! What the log keeps of an event's JSON: strings over [`CUT_BYTES`] cut with
//! a marker ([`cut_strings`]), the words worth searching ([`searchable`]),
//! and the cost and tokens a claude `result` line reports ([`usage`]), each
//! of an event as the log sees it ([`View`]).

use super::CUT_BYTES;
use crate::proto::limits::{MAX_COST_PER_POST, MAX_TOKENS_PER_POST};
use serde_json::Value;

/// An event as the log sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum View<'a> {
    /// A message woke the agent: a new turn.
    TurnStart {
        from: &'a str,
        body: &'a str,
        message_id: Option<i64>,
    },
    /// One stdout JSON line of claude.
    Stream(&'a Value),
    /// A note of the harness or a stderr line of claude.
    Note(&'a str),
    /// The turn's end.
    TurnEnd {
        ok: bool,
        outcome: &'a str,
        note: &'a str,
        duration_ms: u64,
        decision: Option<&'a str>,
    },
}

/// Cuts every string in `v` longer than [`CUT_BYTES`] (at a character
/// boundary) and marks it `…[cut, N bytes]`, N the bytes left off.
pub fn cut_strings(v: &mut Value) {
    match v {
        Value::String(s) if s.len() > CUT_BYTES => {
            let mut end = CUT_BYTES;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            let left = s.len() - end;
            s.truncate(end);
            s.push_str(&format!("…[cut, {left} bytes]"));
        }
        Value::Array(items) => items.iter_mut().for_each(cut_strings),
        Value::Object(m) => m.values_mut().for_each(cut_strings),
        _ => {}
    }
}

/// The words of an event the search index holds: a message's body, the
/// assistant's text, a tool's name and input, a note, a turn's
/// outcome and note. Tool results and thinking are not indexed.
pub fn searchable(view: &View<'_>) -> String {
    let mut out = String::new();
    let mut push = |s: &str| {
        if !s.trim().is_empty() {
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(s);
        }
    };
    match view {
        View::TurnStart { body, .. } => push(body),
        View::Note(text) => push(text),
        View::TurnEnd { outcome, note, .. } => {
            push(outcome);
            push(note);
        }
        View::Stream(v) if v.get("type").and_then(Value::as_str) == Some("assistant") => {
            let blocks = v
                .pointer("/message/content")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => push(b.get("text").and_then(Value::as_str).unwrap_or("")),
                    Some("tool_use") => {
                        push(b.get("name").and_then(Value::as_str).unwrap_or(""));
                        if let Some(input) = b.get("input") {
                            let mut input = input.clone();
                            cut_strings(&mut input);
                            push(&input.to_string());
                        }
                    }
                    _ => {}
                }
            }
        }
        View::Stream(_) => {}
    }
    out
}

/// The cost (USD) and tokens in and out a claude `result` line reports, each
/// only when it is a sane figure (the classifier's bounds).
pub fn usage(v: &Value) -> Option<(f64, u64, u64)> {
    if v.get("type").and_then(Value::as_str) != Some("result") {
        return None;
    }
    let cost = v
        .get("total_cost_usd")
        .and_then(Value::as_f64)
        .filter(|c| c.is_finite() && (0.0..=MAX_COST_PER_POST).contains(c))
        .unwrap_or(0.0);
    let tokens = |key: &str| {
        v.get("usage")
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
            .filter(|t| *t <= MAX_TOKENS_PER_POST)
            .unwrap_or(0)
    };
    Some((cost, tokens("input_tokens"), tokens("output_tokens")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn long_strings_are_cut_with_what_was_left_off() {
        let mut v = json!({"a": ["é".repeat(CUT_BYTES), "short"], "n": 3});
        cut_strings(&mut v);
        let s = v["a"][0].as_str().unwrap();
        assert!(
            s.ends_with(&format!("…[cut, {} bytes]", CUT_BYTES)),
            "{}",
            &s[s.len() - 30..]
        );
        assert!(s.len() < CUT_BYTES + 40);
        assert_eq!(v["a"][1], "short");
        assert_eq!(v["n"], 3);
    }

    #[test]
    fn assistant_text_tools_notes_and_bodies_are_searchable() {
        let line = json!({"type": "assistant", "message": {"content": [
            {"type": "text", "text": "I will deploy"},
            {"type": "tool_use", "name": "Bash", "input": {"command": "make deploy"}},
            {"type": "thinking", "thinking": "secret plan"}
        ]}});
        let text = searchable(&View::Stream(&line));
        assert!(
            text.contains("I will deploy") && text.contains("Bash"),
            "{text}"
        );
        assert!(
            text.contains("make deploy") && !text.contains("secret"),
            "{text}"
        );
        let result = json!({"type": "user", "message": {"content": [{"type": "tool_result", "content": "out"}]}});
        assert_eq!(searchable(&View::Stream(&result)), "");
        let start = View::TurnStart {
            from: "operator",
            body: "ship it",
            message_id: Some(3),
        };
        assert_eq!(searchable(&start), "ship it");
    }

    #[test]
    fn only_sane_usage_counts() {
        let ok = json!({"type": "result", "total_cost_usd": 0.5, "usage": {"input_tokens": 10, "output_tokens": 2}});
        assert_eq!(usage(&ok), Some((0.5, 10, 2)));
        let bad = json!({"type": "result", "total_cost_usd": -1.0, "usage": {"input_tokens": -5, "output_tokens": 1e300}});
        assert_eq!(usage(&bad), Some((0.0, 0, 0)));
        assert_eq!(usage(&json!({"type": "assistant"})), None);
    }
}
