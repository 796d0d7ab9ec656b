//! The `meta` group: `set_status`, which the broker keeps (and pushes to the
//! agent's page) and which is also written to `{state}/hyperhive-status`, and
//! `get_agent_meta`.

use super::{tool, write_atomic, Handled, HyperhiveTools, Tool};
use crate::mcp::schema::{Arg, Ty};
use crate::mcp::{CallCtx, ToolOutcome};
use crate::proto::cmd::{GetAgentMeta, SetStatus};
use crate::proto::limits::MAX_STATUS_CHARS;
use crate::proto::paths::state;

pub(super) const TOOLS: &[Tool] = &[
    tool::<SetStatus>(
        "Set your status line: one line of at most 200 characters saying what \
you are doing, shown to the operator on the dashboard and to agents that call get_agent_meta. \
It stays until you change it; pass \"\" to clear it. Returns a confirmation.",
        &[Arg::req(
            "text",
            Ty::StrMax(MAX_STATUS_CHARS as u64),
            "One line, at most 200 characters; \"\" clears.",
        )],
        |h, a, ctx| h.run(a, ctx, set_status),
    ),
    tool::<GetAgentMeta>(
        "Look up an agent's identity and status: name, whether its harness is \
running, its status line and when it was set, the hive revision it runs, and the hive and swarm \
names. Omit `name` for yourself. Returns a JSON object {name, hyperhive_rev, running, \
status_text, status_set_at, hive_name?, swarm_name?}; an unknown name is an error.",
        &[Arg::opt(
            "name",
            Ty::Str,
            "The agent to look up; omit for yourself.",
        )],
        |h, a, ctx| h.run(a, ctx, get_agent_meta),
    ),
];

fn set_status(h: &HyperhiveTools, c: SetStatus, ctx: &CallCtx) -> Handled {
    h.request(&c, ctx)?;
    let text = c.text;
    let Ok(dir) = h.state_dir() else {
        log::warn!("set_status: HIVE_STATE_DIR is not set; the status is only in the broker");
        return Ok(ToolOutcome::Ok(confirmation(&text)));
    };
    let path = dir.join(state::STATUS);
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

fn get_agent_meta(h: &HyperhiveTools, c: GetAgentMeta, ctx: &CallCtx) -> Handled {
    let meta = h.request(&c, ctx)?;
    let text = serde_json::to_string_pretty(&meta)
        .map_err(|e| ToolOutcome::Err(format!("cannot render the agent's metadata: {e}")))?;
    Ok(ToolOutcome::Ok(text))
}
