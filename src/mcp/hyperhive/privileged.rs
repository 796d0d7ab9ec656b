//! The privileged groups' tools — lifecycle, approvals, scheduling and
//! diagnostics. Each checks its arguments and forwards one request to the
//! agent's socket; whether the agent may use it is decided by the broker from
//! the agent's configured groups and capabilities (`docs/tools/lifecycle.md`,
//! `docs/tools/scheduling.md`).

use super::{Handled, Hyperhive, Spec};
use crate::mcp::{args, CallCtx, ToolOutcome};
use crate::wire::Request;
use serde_json::{json, Map, Value};

pub(super) const TOOLS: &[Spec] = &[
    Spec {
        name: "request_spawn",
        description: "Ask the operator to create a new child agent of yours named `name` (1-9 \
characters of a-z, 0-9 and '-'). This only queues an approval: the operator approves or denies it \
and you get a system message either way; once approved the agent runs with the default settings \
and you are its parent. Returns the approval id.",
        schema: name_schema,
        run: request_spawn,
    },
    Spec {
        name: "kill",
        description: "Stop one of your child agents. Its harness gets SIGTERM (an inflight message \
goes back to its inbox) and it stays stopped until you call start. Only your own children; no \
approval needed. Returns a confirmation.",
        schema: name_schema,
        run: kill,
    },
    Spec {
        name: "start",
        description: "Start one of your child agents that is stopped (or waiting to be restarted \
after a crash). Only your own children; no approval needed. Returns a confirmation.",
        schema: name_schema,
        run: start,
    },
    Spec {
        name: "restart",
        description: "Stop and start one of your child agents with the config it runs now, e.g. \
when it is stuck. Its inflight message is requeued, and it gets the usual \"you were just \
(re)started\" message. Only your own children. Returns a confirmation.",
        schema: name_schema,
        run: restart,
    },
    Spec {
        name: "update",
        description: "Restart one of your child agents onto the current hive binary and its current \
entry in the fleet file — what a needs_update message asks for. Idempotent: while it is in flight \
the agent shows as rebuilding and a second call changes nothing; you get a rebuilt message when it \
runs the current versions. Only your own children. Returns a confirmation.",
        schema: name_schema,
        run: update,
    },
    Spec {
        name: "request_apply_commit",
        description: "Propose a change to the fleet-file entry of yourself or one of your children, \
applied only after the operator approves. `commit_ref` is a JSON merge patch of the entry (RFC \
7396: members replace, null removes), inline as a JSON object string such as \
{\"model\":\"sonnet\",\"tool_groups\":[\"messaging\",\"meta\"]}, or the path of a file holding \
one. The patch is validated now; once approved the file is rewritten and the agent restarts with \
it. Returns the approval id.",
        schema: apply_commit_schema,
        run: request_apply_commit,
    },
    Spec {
        name: "schedule_prompt",
        description: "Schedule a prompt into your own inbox: once at `at_unix_timestamp` or after \
`delay_seconds`, and/or repeatedly every `every_seconds` (at least 60; with no start it first fires \
one period from now). Stored by the broker, so it survives restarts; it shows in get_loose_ends \
and list_scheduled. Returns the id and the first delivery time.",
        schema: schedule_schema,
        run: schedule_prompt,
    },
    Spec {
        name: "list_scheduled",
        description: "List your scheduled prompts: id, body, next delivery (unix seconds) and the \
repeat period. Returns a JSON object {scheduled:[...]}.",
        schema: empty_schema,
        run: list_scheduled,
    },
    Spec {
        name: "cancel_scheduled",
        description: "Delete one of your scheduled prompts by id (from schedule_prompt or \
list_scheduled). Returns a confirmation; an unknown id is an error.",
        schema: id_schema,
        run: cancel_scheduled,
    },
    Spec {
        name: "get_logs",
        description: "Read the tail of an agent's harness log as the supervisor keeps it \
(stdout and stderr of its hive serve, rotated). Omit `agent` for yourself; your own children are \
allowed, any agent with the query_agent_state capability. `lines` defaults to 100 (max 2000). \
Returns the log text.",
        schema: logs_schema,
        run: get_logs,
    },
    Spec {
        name: "get_host_journal",
        description: "Read the tail of the host's systemd journal (journalctl), optionally of one \
`unit`. Needs the read_host_journal capability; on a host without journalctl it is an error \
saying so. `lines` defaults to 100 (max 2000). Returns the journal text.",
        schema: journal_schema,
        run: get_host_journal,
    },
];

fn name_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 9, "description": "The agent's name."}
        },
        "required": ["name"],
        "additionalProperties": false
    })
}

fn empty_schema() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

fn id_schema() -> Value {
    json!({
        "type": "object",
        "properties": {"id": {"type": "integer", "description": "The scheduled prompt's id."}},
        "required": ["id"],
        "additionalProperties": false
    })
}

fn apply_commit_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "agent": {"type": "string", "description": "Yourself or one of your children."},
            "commit_ref": {
                "type": "string",
                "description": "A JSON merge patch of the agent's fleet entry, inline (a JSON object as a string) or the path of a JSON file."
            }
        },
        "required": ["agent", "commit_ref"],
        "additionalProperties": false
    })
}

fn schedule_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "body": {"type": "string", "description": "The prompt you will receive."},
            "at_unix_timestamp": {"type": "integer", "description": "First delivery at this unix time (seconds, UTC)."},
            "delay_seconds": {"type": "integer", "minimum": 0, "description": "First delivery after this many seconds."},
            "every_seconds": {"type": "integer", "minimum": 60, "description": "Repeat with this period (at least 60)."}
        },
        "required": ["body"],
        "additionalProperties": false
    })
}

fn logs_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "agent": {"type": "string", "description": "Whose log; omit for yourself."},
            "lines": {"type": "integer", "minimum": 1, "maximum": 2000, "description": "How many lines from the end (default 100)."}
        },
        "additionalProperties": false
    })
}

fn journal_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "unit": {"type": "string", "description": "A systemd unit, e.g. nginx.service; omit for the whole journal."},
            "lines": {"type": "integer", "minimum": 1, "maximum": 2000, "description": "How many lines from the end (default 100)."}
        },
        "additionalProperties": false
    })
}

/// Sends `req`; the answer's `text` when it has one, else the answer as JSON.
fn forward(h: &Hyperhive, req: Request, ctx: &CallCtx) -> Handled {
    let mut map: Map<String, Value> = h.request(&req, ctx)?;
    map.remove("ok");
    if let Some(Value::String(text)) = map.get("text") {
        if map.len() == 1 {
            return Ok(ToolOutcome::Ok(text.clone()));
        }
    }
    if map.is_empty() {
        return Ok(ToolOutcome::Ok(format!("{} done", req.cmd())));
    }
    Ok(ToolOutcome::Ok(
        serde_json::to_string_pretty(&Value::Object(map)).unwrap_or_default(),
    ))
}

fn name_arg(a: &Value) -> Result<String, ToolOutcome> {
    args::only(a, &["name"])?;
    args::req_str(a, "name")
}

fn request_spawn(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    let name = name_arg(a)?;
    forward(h, Request::RequestSpawn { name }, ctx)
}

fn kill(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    let name = name_arg(a)?;
    forward(h, Request::Kill { name }, ctx)
}

fn start(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    let name = name_arg(a)?;
    forward(h, Request::Start { name }, ctx)
}

fn restart(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    let name = name_arg(a)?;
    forward(h, Request::Restart { name }, ctx)
}

fn update(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    let name = name_arg(a)?;
    forward(h, Request::Update { name }, ctx)
}

fn request_apply_commit(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["agent", "commit_ref"])?;
    let agent = args::req_str(a, "agent")?;
    let commit_ref = args::req_str(a, "commit_ref")?;
    forward(h, Request::RequestApplyCommit { agent, commit_ref }, ctx)
}

fn schedule_prompt(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(
        a,
        &[
            "body",
            "at_unix_timestamp",
            "delay_seconds",
            "every_seconds",
        ],
    )?;
    let req = Request::SchedulePrompt {
        body: args::req_str(a, "body")?,
        at_unix_timestamp: args::opt_i64(a, "at_unix_timestamp")?,
        delay_seconds: args::opt_u64(a, "delay_seconds")?,
        every_seconds: args::opt_u64(a, "every_seconds")?,
    };
    forward(h, req, ctx)
}

fn list_scheduled(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &[])?;
    forward(h, Request::ListScheduled {}, ctx)
}

fn cancel_scheduled(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["id"])?;
    let id = args::req_i64(a, "id")?;
    forward(h, Request::CancelScheduled { id }, ctx)
}

fn get_logs(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["agent", "lines"])?;
    let req = Request::GetLogs {
        agent: args::opt_str(a, "agent")?,
        lines: args::opt_u64(a, "lines")?,
    };
    forward(h, req, ctx)
}

fn get_host_journal(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["unit", "lines"])?;
    let req = Request::GetHostJournal {
        unit: args::opt_str(a, "unit")?,
        lines: args::opt_u64(a, "lines")?,
    };
    forward(h, req, ctx)
}
