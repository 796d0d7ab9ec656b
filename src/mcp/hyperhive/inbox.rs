//! The `inbox` group: `get_loose_ends`, `cancel_loose_end`, `remind` and
//! `request_next_turn`. The first three are broker commands; the running bash
//! tasks `get_loose_ends` lists are the ones the agent's task daemon reported
//! to the broker, so `hive mcp` talks to no socket but the broker's.
//! `request_next_turn` is local: it drops the `hyperhive-continue` sentinel in
//! the state dir, which the turn loop consumes after the turn.

use super::{tool, write_atomic, Handled, HyperhiveTools, Tool};
use crate::mcp::schema::{self, Arg, Ty};
use crate::mcp::{CallCtx, ToolOutcome};
use crate::proto::access::{Access, Gate, ToolGroup};
use crate::proto::cmd::{CancelLooseEnd, GetLooseEnds, LooseEndsReply, Remind};
use crate::proto::limits::REMINDER_FILE_BYTES;
use crate::proto::paths::state;
use crate::proto::text::fmt_time;
use crate::proto::{now, LooseEndKind, Question};

/// What `cancel_loose_end` takes as `kind` (the names of [`LooseEndKind`]).
const KINDS: &[&str] = &["question", "reminder", "approval", "scheduled"];

pub(super) const TOOLS: &[Tool] = &[
    tool::<GetLooseEnds>(
        "List your open threads, one line each, starting with its kind and id as \
cancel_loose_end takes them: `question #ID` (questions you asked that are still unanswered, and \
questions addressed to you that you still owe an answer), `reminder #ID` (your pending \
reminders), `scheduled #ID` (your scheduled prompts), `approval #ID` (pending approvals: the ones \
you requested, and for a root agent every one of its tree; a line says when only your root \
agent or the operator can withdraw it), then your background bash tasks still running. Pass \
`agent` to look at a direct child agent's loose ends; other agents need the query_agent_state \
capability. Returns the lines, or says there are none.",
        &[Arg::opt(
            "agent",
            Ty::Str,
            "A direct child agent to inspect; omit for your own loose ends.",
        )],
        |h, a, ctx| h.run(a, ctx, get_loose_ends),
    ),
    tool::<CancelLooseEnd>(
        "Close one of your loose ends; ids and kinds come from get_loose_ends. kind \
\"question\": withdraw a question you asked (you get the answer [cancelled by <you>], and an \
agent it was addressed to is told). kind \"reminder\": delete one of your pending reminders. \
kind \"scheduled\": delete one of your scheduled prompts (needs the scheduling tool group, as \
cancel_scheduled does). kind \"approval\": withdraw a pending approval (request_spawn, \
request_apply_commit) of your tree; only a root agent may, for every approval of its tree, and \
whoever asked for it is told. An agent that is not a root agent cannot withdraw even its own \
requests: its root agent or the operator can.",
        &[
            Arg::req("kind", Ty::Enum(KINDS), "What to cancel."),
            Arg::req("id", Ty::Int, "Its id, from get_loose_ends."),
        ],
        |h, a, ctx| h.run(a, ctx, cancel_loose_end),
    ),
    tool::<Remind>(
        "Schedule a reminder: `message` lands in your own inbox as a `reminder` \
message after `delay_seconds`, or at `at_unix_timestamp` (give exactly one). The broker fires \
it even if it restarts in between. A message over 4096 bytes arrives as a preview and the path \
of a file in your state dir that holds the whole text. At most 50 reminders may be pending; cancel one with \
cancel_loose_end(kind=\"reminder\", id). Returns the reminder id and when it fires.",
        &[
            Arg::req("message", Ty::Str, "What the reminder should say."),
            Arg::opt(
                "delay_seconds",
                Ty::Uint { min: 0, max: None },
                "Fire after this many seconds.",
            ),
            Arg::opt(
                "at_unix_timestamp",
                Ty::Int,
                "Fire at this unix time (seconds, UTC).",
            ),
        ],
        |h, a, ctx| h.run(a, ctx, remind),
    ),
    // A local tool: no broker command, so its group is declared here.
    Tool {
        name: "request_next_turn",
        access: Access::Agent(Gate::Group(ToolGroup::Inbox)),
        description: "Ask for another turn right after this one ends, even if your inbox is \
empty: the next turn starts with a message from `self` saying `continue`. Use it to keep \
working on a long task across turns. Takes no arguments; returns a confirmation.",
        args: &[],
        run: |h, a, _| request_next_turn(h, a).unwrap_or_else(|e| e),
    },
];

fn get_loose_ends(h: &HyperhiveTools, c: GetLooseEnds, ctx: &CallCtx) -> Handled {
    let r = h.request(&c, ctx)?;
    Ok(ToolOutcome::Ok(render_loose_ends(&r)))
}

fn render_question(q: &Question, who: String) -> String {
    let mut line = format!("question #{} {who}: {}", q.id, q.question);
    if let Some(options) = q.options_line() {
        line.push_str(&format!(" [{options}]"));
    }
    if let Some(t) = q.expires_at {
        line.push_str(&format!(" (expires {})", fmt_time(t)));
    }
    line
}

fn render_loose_ends(r: &LooseEndsReply) -> String {
    let mut lines = Vec::new();
    for q in &r.asked {
        lines.push(render_question(q, format!("asked to {}", q.target)));
    }
    for q in &r.owed {
        lines.push(render_question(q, format!("owed to {}", q.asker)));
    }
    for rem in &r.reminders {
        let more = match rem.bytes as usize {
            n if n > REMINDER_FILE_BYTES => {
                format!("… ({n} bytes; it arrives as a file in your state dir)")
            }
            n if n > rem.preview.len() => format!("… ({n} bytes)"),
            _ => String::new(),
        };
        lines.push(format!(
            "reminder #{} fires {}: {}{more}",
            rem.id,
            fmt_time(rem.fire_at),
            rem.preview
        ));
    }
    for s in &r.scheduled {
        let every = s
            .every_seconds
            .map(|e| format!(", then every {e}s"))
            .unwrap_or_default();
        lines.push(format!(
            "scheduled #{} (a scheduled prompt) fires {}{every}: {}",
            s.id,
            fmt_time(s.fire_at),
            s.body
        ));
    }
    for a in &r.approvals {
        let who = if r.withdrawable.contains(&a.id) {
            format!(
                "; cancel_loose_end(kind=\"approval\", id={}) withdraws it",
                a.id
            )
        } else {
            "; only your root agent or the operator can withdraw it".into()
        };
        lines.push(format!(
            "approval #{} ({} of {}, requested by {}): pending{who}",
            a.id, a.kind, a.agent, a.requester
        ));
    }
    if !r.tasks.is_empty() {
        lines.push("running bash tasks:".into());
        let t = now();
        for task in &r.tasks {
            lines.push(format!(
                "bash_task {} running {}s: {}",
                task.id,
                (t - task.started_at).max(0),
                task.cmd
            ));
        }
    }
    if r.left_off > 0 {
        lines.push(format!(
            "… and {} more not shown (the answer's size limit)",
            r.left_off
        ));
    }
    if lines.is_empty() {
        return format!("no loose ends for {}", r.agent);
    }
    format!("loose ends of {}:\n{}", r.agent, lines.join("\n"))
}

fn cancel_loose_end(h: &HyperhiveTools, c: CancelLooseEnd, ctx: &CallCtx) -> Handled {
    let (kind, id) = (c.kind, c.id);
    h.request(&c, ctx)?;
    Ok(ToolOutcome::Ok(match kind {
        LooseEndKind::Question => format!("withdrew question #{id}"),
        LooseEndKind::Reminder => format!("deleted reminder #{id}"),
        LooseEndKind::Approval => format!("withdrew approval #{id}; its requester is told"),
        LooseEndKind::Scheduled => format!("deleted scheduled prompt #{id}"),
    }))
}

fn remind(h: &HyperhiveTools, c: Remind, ctx: &CallCtx) -> Handled {
    let r = h.request(&c, ctx)?;
    // A delay is reported as asked: the clock may tick a second between
    // the broker's reply and this line, and "in about 0 s" for a 1 s delay
    // would read as a mistake.
    let in_secs = match c.delay_seconds {
        Some(d) => d as i64,
        None => (r.fire_at - now()).max(0),
    };
    Ok(ToolOutcome::Ok(format!(
        "reminder #{} set; it arrives in your inbox at {} (in about {} s)",
        r.id,
        fmt_time(r.fire_at),
        in_secs
    )))
}

fn request_next_turn(h: &HyperhiveTools, a: serde_json::Value) -> Handled {
    schema::check(&[], a).map_err(ToolOutcome::InvalidParams)?;
    let path = h.state_dir()?.join(state::CONTINUE);
    write_atomic(&path, &format!("{}\n", now())).map_err(|e| {
        ToolOutcome::Err(format!(
            "could not write {}: {e}; no extra turn was requested",
            path.display()
        ))
    })?;
    Ok(ToolOutcome::Ok(
        "another turn will start right after this one ends, even if your inbox is empty".into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kinds_offered_are_the_contracts() {
        assert_eq!(KINDS, LooseEndKind::ALL.map(|k| k.name()));
    }

    /// Every line starts with the kind and id cancel_loose_end takes, and an
    /// approval says who may withdraw it.
    #[test]
    fn loose_ends_read_as_kinds_and_ids() {
        use crate::proto::{Approval, ApprovalKind, ApprovalState, Reminder, Scheduled};
        let approval = |id: i64, requester: &str| Approval {
            id,
            kind: ApprovalKind::Spawn,
            requester: requester.into(),
            agent: "kid9".into(),
            payload: serde_json::json!({}),
            state: ApprovalState::Pending,
            created_at: 0,
        };
        let r = LooseEndsReply {
            agent: "boss".into(),
            asked: vec![],
            owed: vec![],
            reminders: vec![Reminder {
                id: 2,
                agent: "boss".into(),
                preview: "tea".into(),
                bytes: 3,
                fire_at: 0,
            }],
            scheduled: vec![Scheduled {
                id: 4,
                agent: "boss".into(),
                body: "digest".into(),
                fire_at: 0,
                every_seconds: Some(86400),
            }],
            approvals: vec![approval(6, "boss"), approval(7, "kid")],
            withdrawable: vec![6],
            tasks: vec![],
            left_off: 0,
        };
        let text = render_loose_ends(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "loose ends of boss:");
        assert!(lines[1].starts_with("reminder #2 fires"), "{text}");
        assert!(
            lines[2].starts_with("scheduled #4 (a scheduled prompt) fires"),
            "{text}"
        );
        assert!(lines[2].ends_with(", then every 86400s: digest"), "{text}");
        assert_eq!(
            lines[3],
            "approval #6 (spawn of kid9, requested by boss): pending; \
             cancel_loose_end(kind=\"approval\", id=6) withdraws it"
        );
        assert_eq!(
            lines[4],
            "approval #7 (spawn of kid9, requested by kid): pending; only your root agent or \
             the operator can withdraw it"
        );
    }
}
