//! The `inbox` group: `get_loose_ends`, `cancel_loose_end`, `remind` and
//! `request_next_turn`. The first three are broker requests; `request_next_turn`
//! only drops the `hyperhive-continue` sentinel in the state dir, which `hive
//! serve` consumes after the turn.

use super::{write_atomic, Handled, Hyperhive, Spec, CONTINUE_FILE};
use crate::broker::hub::now;
use crate::mcp::{args, CallCtx, ToolOutcome};
use crate::ops::fmt_time;
use crate::wire::{self, Request};
use serde_json::{json, Value};

pub(super) const TOOLS: &[Spec] = &[
    Spec {
        name: "get_loose_ends",
        description: "List your open threads: questions you asked that are still unanswered, \
questions addressed to you that you still owe an answer, and your pending reminders, each with \
its kind and id for cancel_loose_end. Pass `agent` to look at a direct child agent's loose ends; \
other agents need the query_agent_state capability. Returns one line per item, or says there \
are none.",
        schema: loose_ends_schema,
        run: get_loose_ends,
    },
    Spec {
        name: "cancel_loose_end",
        description:
            "Close one of your own loose ends. kind \"question\": withdraw a question you \
asked (you get the answer [cancelled by <you>], and an agent it was addressed to is told). kind \
\"reminder\": delete a pending reminder. kind \"approval\" belongs to the approvals tools, which \
this hive does not offer yet, and is refused. Ids come from get_loose_ends.",
        schema: cancel_schema,
        run: cancel_loose_end,
    },
    Spec {
        name: "remind",
        description: "Schedule a reminder: `message` lands in your own inbox as a `reminder` \
message after `delay_seconds`, or at `at_unix_timestamp` (give exactly one). The broker fires \
it even if it restarts in between. Long messages are stored in a file and the reminder shows a \
preview and the file path. At most 50 reminders may be pending; cancel one with \
cancel_loose_end(kind=\"reminder\", id). Returns the reminder id and when it fires.",
        schema: remind_schema,
        run: remind,
    },
    Spec {
        name: "request_next_turn",
        description: "Ask for another turn right after this one ends, even if your inbox is \
empty: the next turn starts with a message from `self` saying `continue`. Use it to keep \
working on a long task across turns. Takes no arguments; returns a confirmation.",
        schema: next_turn_schema,
        run: request_next_turn,
    },
];

fn loose_ends_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "agent": {
                "type": "string",
                "description": "A direct child agent to inspect; omit for your own loose ends."
            }
        },
        "additionalProperties": false
    })
}

fn get_loose_ends(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["agent"])?;
    let agent = args::opt_str(a, "agent")?;
    let own = agent.is_none();
    let r: wire::LooseEndsReply = h.request(&Request::GetLooseEnds { agent }, ctx)?;
    let mut text = render_loose_ends(&r);
    // Running background tasks are the agent's own loose ends, kept by its bash daemon.
    if let (true, Some(sock)) = (own, h.bash_socket()) {
        match crate::bash::client::running_tasks(sock) {
            Ok(tasks) if tasks.is_empty() => {}
            Ok(tasks) => {
                text.push_str("\nrunning bash tasks:");
                for t in tasks {
                    text.push_str(&format!(
                        "\nbash_task {} running {:.0}s: {}",
                        t.id, t.running_secs, t.cmd
                    ));
                }
            }
            Err(e) => text.push_str(&format!("\n(bash tasks unavailable: {e})")),
        }
    }
    Ok(ToolOutcome::Ok(text))
}

fn render_question(q: &wire::Question, who: String) -> String {
    let mut line = format!("question #{} {who}: {}", q.id, q.question);
    if !q.options.is_empty() {
        let how = if q.multi { "choose any" } else { "choose one" };
        line.push_str(&format!(" [options ({how}): {}]", q.options.join(" | ")));
    }
    if let Some(t) = q.expires_at {
        line.push_str(&format!(" (expires {})", fmt_time(t)));
    }
    line
}

fn render_loose_ends(r: &wire::LooseEndsReply) -> String {
    let mut lines = Vec::new();
    for q in &r.asked {
        lines.push(render_question(q, format!("asked to {}", q.target)));
    }
    for q in &r.owed {
        lines.push(render_question(q, format!("owed to {}", q.asker)));
    }
    for rem in &r.reminders {
        let file = rem
            .spill_file
            .as_ref()
            .map(|f| format!(" (full text in {f})"))
            .unwrap_or_default();
        lines.push(format!(
            "reminder #{} fires {}: {}{file}",
            rem.id,
            fmt_time(rem.fire_at),
            rem.preview
        ));
    }
    if lines.is_empty() {
        return format!("no loose ends for {}", r.agent);
    }
    format!("loose ends of {}:\n{}", r.agent, lines.join("\n"))
}

fn cancel_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "kind": {
                "type": "string", "enum": ["question", "reminder", "approval"],
                "description": "What to cancel."
            },
            "id": {"type": "integer", "description": "Its id, from get_loose_ends."}
        },
        "required": ["kind", "id"],
        "additionalProperties": false
    })
}

fn cancel_loose_end(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["kind", "id"])?;
    let kind = args::req_str(a, "kind")?;
    let id = args::req_i64(a, "id")?;
    let _: Value = h.request(
        &Request::CancelLooseEnd {
            kind: kind.clone(),
            id,
        },
        ctx,
    )?;
    Ok(ToolOutcome::Ok(match kind.as_str() {
        "question" => format!("withdrew question #{id}"),
        "reminder" => format!("deleted reminder #{id}"),
        _ => format!("cancelled {kind} #{id}"),
    }))
}

fn remind_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "message": {"type": "string", "description": "What the reminder should say."},
            "delay_seconds": {
                "type": "integer", "minimum": 0,
                "description": "Fire after this many seconds."
            },
            "at_unix_timestamp": {
                "type": "integer",
                "description": "Fire at this unix time (seconds, UTC)."
            }
        },
        "required": ["message"],
        "additionalProperties": false
    })
}

fn remind(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["message", "delay_seconds", "at_unix_timestamp"])?;
    let message = args::req_str(a, "message")?;
    let delay_seconds = args::opt_u64(a, "delay_seconds")?;
    let at_unix_timestamp = args::opt_i64(a, "at_unix_timestamp")?;
    let fire_at = match (delay_seconds, at_unix_timestamp) {
        (Some(d), None) => now().saturating_add(d as i64),
        (None, Some(at)) => at,
        _ => {
            return Err(ToolOutcome::InvalidParams(
                "give exactly one of the arguments \"delay_seconds\" and \"at_unix_timestamp\""
                    .into(),
            ))
        }
    };
    if message.trim().is_empty() {
        return Err(ToolOutcome::InvalidParams(
            "argument \"message\" must not be empty".into(),
        ));
    }
    let req = Request::Remind {
        message,
        delay_seconds,
        at_unix_timestamp,
    };
    let r: wire::IdReply = h.request(&req, ctx)?;
    Ok(ToolOutcome::Ok(format!(
        "reminder #{} set; it arrives in your inbox at {} (in about {} s)",
        r.id,
        fmt_time(fire_at),
        (fire_at - now()).max(0)
    )))
}

fn next_turn_schema() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

fn request_next_turn(h: &Hyperhive, a: &Value, _ctx: &CallCtx) -> Handled {
    args::only(a, &[])?;
    let path = h.state_dir()?.join(CONTINUE_FILE);
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
