//! The `meta` group: `set_status`, which the dashboard shows and which is kept
//! both by the broker and in `{state}/hyperhive-status`, and `get_agent_meta`.

use super::{write_atomic, Handled, Hyperhive, Spec, STATUS_FILE};
use crate::broker::hub::MAX_STATUS_CHARS;
use crate::mcp::{args, CallCtx, ToolOutcome};
use crate::wire::{self, Request};
use serde_json::{json, Value};

pub(super) const TOOLS: &[Spec] = &[
    Spec {
        name: "set_status",
        description: "Set your status line: one line of at most 200 characters saying what \
you are doing, shown to the operator on the dashboard and to agents that call get_agent_meta. \
It stays until you change it; pass \"\" to clear it. Returns a confirmation.",
        schema: set_status_schema,
        run: set_status,
    },
    Spec {
        name: "get_agent_meta",
        description: "Look up an agent's identity and status: name, whether its harness is \
running, its status line and when it was set, the hive revision it runs, and the hive and swarm \
names. Omit `name` for yourself. Returns a JSON object {name, hyperhive_rev, running, \
status_text, status_set_at, hive_name?, swarm_name?}; an unknown name is an error.",
        schema: meta_schema,
        run: get_agent_meta,
    },
];

fn set_status_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "text": {
                "type": "string", "maxLength": MAX_STATUS_CHARS,
                "description": "One line, at most 200 characters; \"\" clears."
            }
        },
        "required": ["text"],
        "additionalProperties": false
    })
}

fn set_status(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["text"])?;
    let text = args::req_str(a, "text")?;
    if text.contains(['\n', '\r']) || text.chars().count() > MAX_STATUS_CHARS {
        return Err(ToolOutcome::InvalidParams(format!(
            "argument \"text\" must be one line of at most {MAX_STATUS_CHARS} characters, \
             got {} characters",
            text.chars().count()
        )));
    }
    let _: Value = h.request(&Request::SetStatus { text: text.clone() }, ctx)?;
    let Ok(dir) = h.state_dir() else {
        log::warn!("set_status: HIVE_STATE_DIR is not set; the status is only in the broker");
        return Ok(ToolOutcome::Ok(confirmation(&text)));
    };
    let path = dir.join(STATUS_FILE);
    let written = if text.is_empty() {
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    } else {
        write_atomic(&path, &format!("{text}\n"))
    };
    written.map_err(|e| {
        ToolOutcome::Err(format!(
            "the broker has the status, but {} could not be written: {e}",
            path.display()
        ))
    })?;
    Ok(ToolOutcome::Ok(confirmation(&text)))
}

fn confirmation(text: &str) -> String {
    if text.is_empty() {
        "status cleared".into()
    } else {
        format!("status set: {text}")
    }
}

fn meta_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "description": "The agent to look up; omit for yourself."}
        },
        "additionalProperties": false
    })
}

fn get_agent_meta(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["name"])?;
    let name = args::opt_str(a, "name")?;
    let meta: wire::AgentMeta = h.request(&Request::GetAgentMeta { name }, ctx)?;
    let text = serde_json::to_string_pretty(&meta)
        .map_err(|e| ToolOutcome::Err(format!("cannot render the agent's metadata: {e}")))?;
    Ok(ToolOutcome::Ok(text))
}
