//! The hub's size and shape rules: what a request may carry before the hub
//! stores anything (message bodies, senders, questions, turn counters), and the
//! byte budget every answer is cut to, so that no answer line can pass what its
//! reader accepts ([`wire::MAX_LINE`]). Every path that creates a message checks
//! its text with [`check_body`]; every list answer is filled through a
//! [`Budget`]; every message handed out goes through [`fit_message`].

use crate::config::RESERVED_NAMES;
use crate::wire::{self, excerpt};
use serde::Serialize;

/// Senders the broker itself uses besides the reserved agent names.
const BROKER_SENDERS: [&str; 2] = ["reminder", "scheduler"];

/// Longest `from` of a `wake`, in characters.
pub const MAX_SENDER_CHARS: usize = 64;

/// Bounds of one `post_turn_counts`: a turn's counters, never a total.
pub const MAX_TURNS_PER_POST: u64 = 1_000_000;
pub const MAX_TOKENS_PER_POST: u64 = 1_000_000_000_000;
pub const MAX_COST_PER_POST: f64 = 1_000_000.0;

/// Longest body handed out. Bodies stored before [`wire::MAX_BODY`] was
/// enforced may be longer; they are cut here so their answer still fits a line
/// (the system events that wrap a question or an answer stay under it).
const DELIVER_MAX: usize = 2 * wire::MAX_BODY;

/// A message body, question, answer, reminder or scheduled prompt: not blank
/// and at most [`wire::MAX_BODY`] bytes.
pub fn check_body(field: &str, text: &str) -> Result<(), String> {
    if text.trim().is_empty() {
        return Err(format!("{field} must not be empty"));
    }
    if text.len() > wire::MAX_BODY {
        return Err(format!(
            "{field} is {} bytes; the limit is {} bytes (64 KiB). Send a shorter text, or \
             write the rest to a file and send its path",
            text.len(),
            wire::MAX_BODY
        ));
    }
    Ok(())
}

/// The `from` of a `wake`: plain text, one line, and none of the names the
/// broker and the operator speak as (an agent's scripts must not be able to
/// pass for them; the operator sends with `send`).
pub fn check_sender(from: &str) -> Result<(), String> {
    if from.trim().is_empty() {
        return Err("from must not be empty".into());
    }
    if from.chars().count() > MAX_SENDER_CHARS {
        return Err(format!(
            "from {} is longer than {MAX_SENDER_CHARS} characters",
            excerpt(from)
        ));
    }
    if from.chars().any(wire::is_control_or_bidi) {
        return Err(format!(
            "from {} contains control or bidi characters; use plain text",
            excerpt(from)
        ));
    }
    let name = from.trim().to_lowercase();
    if RESERVED_NAMES.contains(&name.as_str()) || BROKER_SENDERS.contains(&name.as_str()) {
        return Err(format!(
            "from {from:?} is reserved for the broker's own messages; choose another name \
             (the operator sends with `hive send`)"
        ));
    }
    Ok(())
}

/// A question and its options.
pub fn check_question(question: &str, options: &[String]) -> Result<(), String> {
    check_body("question", question)?;
    if options.len() > wire::MAX_OPTIONS {
        return Err(format!(
            "{} options given; a question may offer at most {}",
            options.len(),
            wire::MAX_OPTIONS
        ));
    }
    for o in options {
        if o.trim().is_empty()
            || o.contains(['\n', '\r'])
            || o.chars().count() > wire::MAX_OPTION_CHARS
        {
            return Err(format!(
                "option {} must be one line of 1 to {} characters",
                excerpt(o),
                wire::MAX_OPTION_CHARS
            ));
        }
    }
    Ok(())
}

/// One turn's counters: finite, not negative, and within what one turn can
/// produce, so the totals on the dashboard cannot be corrupted.
pub fn check_counts(
    turns: u64,
    ok: u64,
    failed: u64,
    tokens_in: u64,
    tokens_out: u64,
    cost_usd: f64,
) -> Result<(), String> {
    for (field, v) in [("turns", turns), ("ok", ok), ("failed", failed)] {
        if v > MAX_TURNS_PER_POST {
            return Err(format!(
                "post_turn_counts: {field} {v} is over {MAX_TURNS_PER_POST}; post one turn's counts"
            ));
        }
    }
    for (field, v) in [("tokens_in", tokens_in), ("tokens_out", tokens_out)] {
        if v > MAX_TOKENS_PER_POST {
            return Err(format!(
                "post_turn_counts: {field} {v} is over {MAX_TOKENS_PER_POST}; post one turn's counts"
            ));
        }
    }
    if !cost_usd.is_finite() || !(0.0..=MAX_COST_PER_POST).contains(&cost_usd) {
        return Err(format!(
            "post_turn_counts: cost_usd {cost_usd} must be between 0 and {MAX_COST_PER_POST}"
        ));
    }
    Ok(())
}

/// The first `max` characters of `s`, with `…` when cut: for system messages
/// that quote a text the recipient can read in full elsewhere.
pub fn preview(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((i, _)) => format!("{}…", &s[..i]),
    }
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
fn cut_bytes(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// A message as it may be handed out: a body over [`DELIVER_MAX`] (stored
/// before the limit) is cut, with a marker saying so.
pub fn fit_message(mut m: wire::Message) -> wire::Message {
    if m.body.len() > DELIVER_MAX {
        let n = m.body.len();
        cut_bytes(&mut m.body, wire::MAX_BODY);
        m.body.push_str(&format!(
            "\n[… cut by the broker: this message was {n} bytes, over the {}-byte limit]",
            wire::MAX_BODY
        ));
    }
    m
}

/// Bytes `v` takes as one JSON value, plus a separator.
fn json_size<T: Serialize>(v: &T) -> usize {
    serde_json::to_string(v).map_or(usize::MAX, |s| s.len() + 1)
}

/// The byte budget of one answer ([`wire::PAGE_BYTES`]). Lists are filled in
/// order while their items fit; once one does not, it and every later item
/// are left off and counted, so an answer never has gaps.
pub struct Budget {
    left: usize,
    pub left_off: u64,
}

impl Budget {
    pub fn new() -> Budget {
        Budget {
            left: wire::PAGE_BYTES,
            left_off: 0,
        }
    }

    /// The items of `items` that fit, in order.
    pub fn fit<T: Serialize>(&mut self, items: Vec<T>) -> Vec<T> {
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let size = json_size(&item);
            if self.left_off == 0 && size <= self.left {
                self.left -= size;
                out.push(item);
            } else {
                self.left_off += 1;
            }
        }
        out
    }
}

/// Cuts a page of messages to the answer's byte budget: at least one row
/// always goes out (so a reader always progresses), and `more` says whether
/// any was left behind.
pub fn page(rows: Vec<wire::Message>, had_more: bool) -> wire::MessagesReply {
    let mut used = 0;
    let mut messages = Vec::with_capacity(rows.len());
    let mut more = had_more;
    for m in rows {
        let m = fit_message(m);
        let size = json_size(&m);
        if !messages.is_empty() && used + size > wire::PAGE_BYTES {
            more = true;
            break;
        }
        used += size;
        messages.push(m);
    }
    wire::MessagesReply { messages, more }
}

/// Whether one more message fits a page that already holds `used` bytes in
/// `count` messages; adds its size when it does.
pub fn take_into_page(m: &wire::Message, used: &mut usize, count: usize) -> bool {
    let size = json_size(m);
    if count > 0 && *used + size > wire::PAGE_BYTES {
        return false;
    }
    *used += size;
    true
}

/// Bytes one character takes inside a JSON string.
fn json_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// The end of `text` that fits in the answer's byte budget as a JSON string,
/// from a line start, with a marker line in front when anything was cut: for
/// log tails, whose newest lines matter most.
pub fn fit_text_tail(text: String) -> String {
    let total: usize = text.chars().map(json_char_len).sum();
    if total <= wire::PAGE_BYTES {
        return text;
    }
    let keep = wire::PAGE_BYTES - 256;
    let mut used = 0;
    let mut start = text.len();
    for (i, c) in text.char_indices().rev() {
        used += json_char_len(c);
        if used > keep {
            break;
        }
        start = i;
    }
    let tail = &text[start..];
    let tail = match tail.find('\n') {
        Some(j) if j + 1 < tail.len() => &tail[j + 1..],
        _ => tail,
    };
    format!(
        "[… {} earlier bytes cut: the answer's size limit]\n{tail}",
        text.len() - tail.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(body: &str) -> wire::Message {
        wire::Message {
            id: 1,
            from: "x".into(),
            to: "y".into(),
            body: body.into(),
            kind: "message".into(),
            in_reply_to: None,
            sent_at: 0,
            transient: false,
        }
    }

    #[test]
    fn bodies_senders_and_counts() {
        assert!(check_body("body", "  \n").unwrap_err().contains("empty"));
        let e = check_body("body", &"x".repeat(wire::MAX_BODY + 1)).unwrap_err();
        assert!(e.contains("65537 bytes") && e.contains("65536"), "{e}");
        assert!(check_body("body", &"x".repeat(wire::MAX_BODY)).is_ok());
        for bad in [
            "operator", "System", " self ", "parent", "broker", "reminder",
        ] {
            assert!(check_sender(bad).unwrap_err().contains("reserved"), "{bad}");
        }
        for bad in [
            "a\u{0}b",
            "\u{202e}evil",
            "esc\u{1b}]0;x",
            "two\nlines",
            "c1\u{85}",
        ] {
            assert!(
                check_sender(bad).unwrap_err().contains("control"),
                "{bad:?}"
            );
        }
        assert!(check_sender("cron").is_ok() && check_sender("bash-task-7").is_ok());
        assert!(check_counts(1, 1, 0, 2400, 84, 0.014).is_ok());
        assert!(check_counts(u64::MAX, 0, 0, 0, 0, 0.0).is_err());
        assert!(check_counts(1, 1, 0, u64::MAX, 0, 0.0).is_err());
        for cost in [f64::NAN, f64::INFINITY, -0.5, 1.7976931348623157e308] {
            assert!(check_counts(1, 1, 0, 0, 0, cost).is_err(), "{cost}");
        }
        let many: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        assert!(check_question("q?", &many).is_err());
        assert!(check_question("q?", &["".into()]).is_err());
        assert!(check_question("q?", &["yes".into(), "no".into()]).is_ok());
    }

    #[test]
    fn answers_stay_within_their_budget() {
        let mut b = Budget::new();
        let rows: Vec<String> = (0..20).map(|_| "r".repeat(60_000)).collect();
        let kept = b.fit(rows);
        assert_eq!((kept.len(), b.left_off), (8, 12));
        let later = b.fit(vec!["small".to_string()]);
        assert!(later.is_empty(), "no gaps: once cut, the rest is left off");

        let rows: Vec<wire::Message> = (0..20).map(|_| msg(&"m".repeat(60_000))).collect();
        let p = page(rows, false);
        assert!(p.more && p.messages.len() == 8, "{}", p.messages.len());
        let huge = page(vec![msg(&"\u{1}".repeat(1_048_500))], false);
        let line = wire::ok_line(&huge);
        assert!(line.len() < wire::MAX_LINE, "{}", line.len());
        assert!(huge.messages[0].body.contains("cut by the broker"));

        let log: String = (0..100_000)
            .map(|i| format!("line {i} \u{1b}[0m\n"))
            .collect();
        let tail = fit_text_tail(log);
        assert!(serde_json::to_string(&tail).unwrap().len() <= wire::PAGE_BYTES);
        assert!(tail.starts_with("[… ") && tail.ends_with("line 99999 \u{1b}[0m\n"));
    }
}
