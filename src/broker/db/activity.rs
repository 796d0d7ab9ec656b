//! The hive's recent activity, read from `broker.db` (the operator's
//! `activity`): turn ends by the index of acked rows (`messages_acked`, step
//! 12), and dead letters and notices among the newest rows by id, so a read
//! costs the same whatever the store's size.

use super::{Db, Res};
use crate::proto::cmd::ActivityEvent;
use rusqlite::params;

/// How many of the newest rows are looked at for dead letters and notices.
const RECENT_ROWS: i64 = 5_000;

/// The notices the timeline shows (a dead letter is shown by its own row).
const NOTICES: &str = "'needs_login', 'logged_in', 'approval_requested', 'approval_decided', \
                       'usage_limit', 'budget', 'quota', 'needs_update', 'rebuilt', 'cli_version'";

/// The first line of `s`, at most 200 characters.
fn one_line(s: &str) -> String {
    let first = s
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    match first.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &first[..i]),
        None => first.to_string(),
    }
}

impl Db {
    /// The newest `limit` events, newest first.
    pub fn activity(&self, limit: u32) -> Res<Vec<ActivityEvent>> {
        let limit = i64::from(limit);
        let mut events = Vec::new();
        let mut turns = self.conn.prepare_cached(
            "SELECT id, recipient, sender, kind, done_at, body FROM messages
             WHERE state = 'acked' AND done_at IS NOT NULL
               AND recipient != 'operator' AND instr(recipient, '@') = 0
             ORDER BY done_at DESC LIMIT ?1",
        )?;
        let rows = turns.query_map(params![limit], |r| {
            let (id, agent, from, kind): (i64, String, String, String) =
                (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
            let body: String = r.get(5)?;
            let text = match kind.as_str() {
                "kick" => format!("{agent} started and took its kick (#{id})"),
                "message" => format!("{agent} handled #{id} from {from}: {}", one_line(&body)),
                k => format!("{agent} handled #{id} ({k} from {from})"),
            };
            Ok(ActivityEvent {
                at: r.get(4)?,
                kind: "turn_end".into(),
                id,
                agent: Some(agent),
                text,
            })
        })?;
        for row in rows {
            events.push(row?);
        }
        let mut recent = self.conn.prepare_cached(&format!(
            "SELECT id, recipient, kind, state, sent_at, done_at, body, last_error FROM messages
             WHERE id > (SELECT coalesce(max(id), 0) FROM messages) - ?1
               AND (state = 'failed' OR kind IN ({NOTICES}))
             ORDER BY id DESC LIMIT ?2"
        ))?;
        let rows = recent.query_map(params![RECENT_ROWS, limit * 2], |r| {
            let (id, to, kind, state): (i64, String, String, String) =
                (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
            let (sent, done): (i64, Option<i64>) = (r.get(4)?, r.get(5)?);
            let body: String = r.get(6)?;
            let error: Option<String> = r.get(7)?;
            Ok(if state == "failed" {
                ActivityEvent {
                    at: done.unwrap_or(sent),
                    kind: "dead_letter".into(),
                    id,
                    text: format!(
                        "{to} gave up #{id}: {}",
                        one_line(error.as_deref().unwrap_or("no error recorded"))
                    ),
                    agent: Some(to),
                }
            } else {
                ActivityEvent {
                    at: sent,
                    kind,
                    id,
                    agent: None,
                    text: one_line(&body),
                }
            })
        })?;
        // A notice told to the operator and to a parent alike is one event.
        let mut seen = std::collections::BTreeSet::new();
        for row in rows {
            let e = row?;
            if e.agent.is_none() && !seen.insert((e.kind.clone(), e.at, e.text.clone())) {
                continue;
            }
            events.push(e);
        }
        events.sort_by(|a, b| b.at.cmp(&a.at).then(b.id.cmp(&a.id)));
        events.truncate(limit as usize);
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_text_is_its_first_line_cut() {
        assert_eq!(one_line("\n  first\nsecond"), "first");
        let long = "é".repeat(300);
        assert_eq!(one_line(&long).chars().count(), 201);
    }
}
