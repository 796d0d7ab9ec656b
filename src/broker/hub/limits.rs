//! The answer budget: every list answer is filled through a [`Budget`], every
//! message handed out goes through [`fit_message`], and log tails through
//! [`fit_text_tail`], so that no answer line can pass what its reader accepts
//! (`MAX_LINE`). What a request may carry is each command's own `validate`
//! (`proto::cmd`).

use crate::proto::limits::{MAX_BODY, PAGE_BYTES};
use crate::proto::{Message, MessagesReply};
use serde::Serialize;

/// Longest body handed out. Bodies stored before [`MAX_BODY`] was enforced may
/// be longer; they are cut here so their answer still fits a line (the system
/// events that wrap a question or an answer stay under it).
const DELIVER_MAX: usize = 2 * MAX_BODY;

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
pub fn fit_message(mut m: Message) -> Message {
    if m.body.len() > DELIVER_MAX {
        let n = m.body.len();
        cut_bytes(&mut m.body, MAX_BODY);
        m.body.push_str(&format!(
            "\n[… cut by the broker: this message was {n} bytes, over the {}-byte limit]",
            MAX_BODY
        ));
    }
    m
}

/// Bytes `v` takes as one JSON value, plus a separator.
fn json_size<T: Serialize>(v: &T) -> usize {
    serde_json::to_string(v).map_or(usize::MAX, |s| s.len() + 1)
}

/// The byte budget of one answer ([`PAGE_BYTES`]). Lists are filled in
/// order while their items fit; once one does not, it and every later item
/// are left off and counted, so an answer never has gaps.
pub struct Budget {
    left: usize,
    pub left_off: u64,
}

impl Budget {
    pub fn new() -> Budget {
        Budget {
            left: PAGE_BYTES,
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
pub fn page(rows: Vec<Message>, had_more: bool) -> MessagesReply {
    let mut used = 0;
    let mut messages = Vec::with_capacity(rows.len());
    let mut more = had_more;
    for m in rows {
        let m = fit_message(m);
        let size = json_size(&m);
        if !messages.is_empty() && used + size > PAGE_BYTES {
            more = true;
            break;
        }
        used += size;
        messages.push(m);
    }
    MessagesReply { messages, more }
}

/// Whether one more message fits a page that already holds `used` bytes in
/// `count` messages; adds its size when it does.
pub fn take_into_page(m: &Message, used: &mut usize, count: usize) -> bool {
    let size = json_size(m);
    if count > 0 && *used + size > PAGE_BYTES {
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
    if total <= PAGE_BYTES {
        return text;
    }
    let keep = PAGE_BYTES - 256;
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
    use crate::proto::limits::MAX_LINE;
    use crate::proto::lines::ok_line;
    use crate::proto::{MsgKind, Peer};

    fn msg(body: &str) -> Message {
        Message {
            id: 1,
            from: Peer::sender("x"),
            to: Peer::sender("y"),
            body: body.into(),
            kind: MsgKind::Message,
            in_reply_to: None,
            sent_at: 0,
            transient: false,
        }
    }

    #[test]
    fn answers_stay_within_their_budget() {
        let mut b = Budget::new();
        let rows: Vec<String> = (0..20).map(|_| "r".repeat(60_000)).collect();
        let kept = b.fit(rows);
        assert_eq!((kept.len(), b.left_off), (8, 12));
        let later = b.fit(vec!["small".to_string()]);
        assert!(later.is_empty(), "no gaps: once cut, the rest is left off");

        let rows: Vec<Message> = (0..20).map(|_| msg(&"m".repeat(60_000))).collect();
        let p = page(rows, false);
        assert!(p.more && p.messages.len() == 8, "{}", p.messages.len());
        let huge = page(vec![msg(&"\u{1}".repeat(1_048_500))], false);
        let line = ok_line(&huge);
        assert!(line.len() < MAX_LINE, "{}", line.len());
        assert!(huge.messages[0].body.contains("cut by the broker"));

        let log: String = (0..100_000)
            .map(|i| format!("line {i} \u{1b}[0m\n"))
            .collect();
        let tail = fit_text_tail(log);
        assert!(serde_json::to_string(&tail).unwrap().len() <= PAGE_BYTES);
        assert!(tail.starts_with("[… ") && tail.ends_with("line 99999 \u{1b}[0m\n"));
    }
}
