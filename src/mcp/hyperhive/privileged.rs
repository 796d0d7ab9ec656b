//! The privileged groups' tools — lifecycle, approvals, scheduling and
//! diagnostics — and `get_host_journal`, which its capability alone grants.
//! Each turns its arguments into its command and forwards it to the agent's
//! socket; whether the agent may use it is decided by the broker from the
//! agent's configured groups and capabilities (`docs/tools/lifecycle.md`,
//! `docs/tools/scheduling.md`). Their answers read as the broker's text, or as
//! JSON when they carry more.

use super::{text_or_json, tool, Handled, HyperhiveTools, Tool};
use crate::mcp::schema::{Arg, Ty};
use crate::mcp::{CallCtx, ToolOutcome};
use crate::proto::cmd::{
    CancelScheduled, GetHostJournal, GetLogs, Kill, ListScheduled, RequestApplyCommit,
    RequestSpawn, Restart, SchedulePrompt, Start, Update,
};
use crate::proto::ident::MAX_NAME_LEN;
use crate::proto::limits::{MAX_LOG_LINES, MIN_EVERY_SECS};
use crate::proto::Command;

const NAME: &[Arg] = &[Arg::req(
    "name",
    Ty::StrMax(MAX_NAME_LEN as u64),
    "The agent's name.",
)];

const LINES: Arg = Arg::opt(
    "lines",
    Ty::Uint {
        min: 1,
        max: Some(MAX_LOG_LINES),
    },
    "How many lines from the end (default 100).",
);

pub(super) const TOOLS: &[Tool] = &[
    tool::<RequestSpawn>(
        "Ask the operator to create a new child agent of yours named `name` (1-9 \
characters of a-z, 0-9 and '-'). This only queues an approval: the operator approves or denies it \
and you get a system message either way; once approved the agent runs with the default settings \
and you are its parent. Returns the approval id.",
        NAME,
        |h, a, ctx| h.run(a, ctx, forward::<RequestSpawn>),
    ),
    tool::<Kill>(
        "Stop one of your child agents. Its harness gets SIGTERM (an inflight message \
goes back to its inbox, and its mail keeps queueing) and it stays stopped, across restarts of the \
hive too, until you call start (the operator's `hive stop` is the same). Only your own children; \
no approval needed. Returns a confirmation.",
        NAME,
        |h, a, ctx| h.run(a, ctx, forward::<Kill>),
    ),
    tool::<Start>(
        "Start one of your child agents that is stopped (or waiting to be restarted \
after a crash). Only your own children; no approval needed. Returns a confirmation.",
        NAME,
        |h, a, ctx| h.run(a, ctx, forward::<Start>),
    ),
    tool::<Restart>(
        "Stop and start one of your child agents with the config it runs now, e.g. \
when it is stuck. Its inflight message is requeued, and it gets the usual \"you were just \
(re)started\" message. Only your own children. Returns a confirmation.",
        NAME,
        |h, a, ctx| h.run(a, ctx, forward::<Restart>),
    ),
    tool::<Update>(
        "Restart one of your child agents onto the current hive binary and its current \
entry in the fleet file — what a needs_update message asks for. Idempotent: while it is in flight \
the agent shows as rebuilding and a second call changes nothing; you get a rebuilt message when it \
runs the current versions. Only your own children. Returns a confirmation.",
        NAME,
        |h, a, ctx| h.run(a, ctx, forward::<Update>),
    ),
    tool::<RequestApplyCommit>(
        "Propose a change to the fleet-file entry of yourself or one of your children, \
applied only after the operator approves. `commit_ref` is a JSON merge patch of the entry (RFC \
7396: members replace, null removes), inline as a JSON object string such as \
{\"model\":\"sonnet\",\"tool_groups\":[\"messaging\",\"meta\"]}, or the path of a file holding \
one. The patch is validated now; once approved its keys are written to the fleet file (the \
operator's hand edits of other keys stay; a hand edit of the same key makes the approval fail) and \
the agent restarts with it. Returns the approval id.",
        &[
            Arg::req("agent", Ty::Str, "Yourself or one of your children."),
            Arg::req(
                "commit_ref",
                Ty::Str,
                "A JSON merge patch of the agent's fleet entry, inline (a JSON object as a string) or the path of a JSON file.",
            ),
        ],
        |h, a, ctx| h.run(a, ctx, forward::<RequestApplyCommit>),
    ),
    tool::<SchedulePrompt>(
        "Schedule a prompt into your own inbox: once at `at_unix_timestamp` or after \
`delay_seconds`, and/or repeatedly every `every_seconds` (at least 60; with no start it first fires \
one period from now). Stored by the broker, so it survives restarts; it shows in get_loose_ends \
and list_scheduled. Returns the id and the first delivery time.",
        &[
            Arg::req("body", Ty::Str, "The prompt you will receive."),
            Arg::opt(
                "at_unix_timestamp",
                Ty::Int,
                "First delivery at this unix time (seconds, UTC).",
            ),
            Arg::opt(
                "delay_seconds",
                Ty::Uint { min: 0, max: None },
                "First delivery after this many seconds.",
            ),
            Arg::opt(
                "every_seconds",
                Ty::Uint {
                    min: MIN_EVERY_SECS,
                    max: None,
                },
                "Repeat with this period (at least 60).",
            ),
        ],
        |h, a, ctx| h.run(a, ctx, forward::<SchedulePrompt>),
    ),
    tool::<ListScheduled>(
        "List your scheduled prompts: id, body, next delivery (unix seconds) and the \
repeat period. Returns a JSON object {scheduled:[...]}.",
        &[],
        |h, a, ctx| h.run(a, ctx, forward::<ListScheduled>),
    ),
    tool::<CancelScheduled>(
        "Delete one of your scheduled prompts by id (from schedule_prompt or \
list_scheduled). Returns a confirmation; an unknown id is an error.",
        &[Arg::req("id", Ty::Int, "The scheduled prompt's id.")],
        |h, a, ctx| h.run(a, ctx, forward::<CancelScheduled>),
    ),
    tool::<GetLogs>(
        "Read the tail of an agent's harness log as the supervisor keeps it \
(stdout and stderr of its hive serve, rotated). Omit `agent` for yourself; your own children are \
allowed, any agent with the query_agent_state capability. `lines` defaults to 100 (max 2000). \
Returns the log text.",
        &[Arg::opt("agent", Ty::Str, "Whose log; omit for yourself."), LINES],
        |h, a, ctx| h.run(a, ctx, forward::<GetLogs>),
    ),
    tool::<GetHostJournal>(
        "Read the tail of the host's systemd journal (journalctl), optionally of one \
`unit`. Granted by the read_host_journal capability alone (no tool group); on a host without \
journalctl it is an error saying so. `lines` defaults to 100 (max 2000). Returns the journal text.",
        &[
            Arg::opt(
                "unit",
                Ty::Str,
                "A systemd unit, e.g. nginx.service; omit for the whole journal.",
            ),
            LINES,
        ],
        |h, a, ctx| h.run(a, ctx, forward::<GetHostJournal>),
    ),
];

/// Sends the command; its answer's text, or the answer as JSON.
fn forward<C: Command>(h: &HyperhiveTools, c: C, ctx: &CallCtx) -> Handled {
    let reply = h.request(&c, ctx)?;
    Ok(ToolOutcome::Ok(text_or_json(C::CMD, &reply)))
}
