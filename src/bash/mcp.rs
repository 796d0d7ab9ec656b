//! `hive bash-mcp`: the stdio MCP server named `bash`, whose tools `run` and
//! `status` reach claude as `mcp__bash__run` and `mcp__bash__status`. It is a
//! thin bridge on the shared core in `crate::mcp` (same concurrency, EOF and
//! signal behaviour): every call is forwarded to the task daemon's socket and the
//! answer rendered as text. It starts no process itself, so tasks outlive it.

use super::client::{self, CallError};
use super::proto::{TaskReply, TaskStatus, TaskView, DEFAULT_RUN_WAIT_SECS};
use super::report::outcome_line;
use crate::mcp::schema::{self, Arg, Ty};
use crate::mcp::{self, CallCtx, InputSchema, ServerInfo, ToolDef, ToolOutcome, Tools};
use crate::proto::bashwire::Request;
use serde::Deserialize;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

const RUN_DESCRIPTION: &str = "Run a shell command in the background (`sh -c CMD`; the working \
directory is the agent's state dir, stdin is /dev/null so interactive commands fail). Stdout \
and stderr are written to files as they come. The call first waits up to `wait_seconds` \
(default 3, at most 30; 0 returns at once) for the command to finish: if it does, you get its \
full status right away (exit code, run time, last 4 KiB of stdout and stderr) and nothing else \
happens. Otherwise the answer is `task started: id=<id>` and the command keeps running, even \
after this turn ends; when it finishes you are woken by a message from `bash-task-<id>` with \
its exit code and last output lines, so end your turn instead of polling. `timeout_secs` kills \
the command and every process it started after that many seconds (status `timed_out`); \
without it the command runs until it exits.";

const STATUS_DESCRIPTION: &str = "Show a task started with `run`: its status (`pending`, \
`running`, `done`, `timed_out`, or `interrupted` when the task daemon was stopped or restarted \
while it ran, as when the agent is stopped), the exit \
code once done, the run time, the last 4 KiB of stdout and of stderr, and the paths of the \
files holding the whole output (read them for more). `wait_seconds` (default 0, at most 30) \
first waits that long for a running task to finish, which saves a call when it is about to.";

/// The `bash` tool provider: forwards to the daemon at `socket`.
pub struct BashTools {
    pub socket: PathBuf,
}

const RUN_ARGS: &[Arg] = &[
    Arg::req("cmd", Ty::Str, "The shell command line, run with sh -c."),
    Arg::opt(
        "timeout_secs",
        Ty::Uint { min: 1, max: None },
        "Kill the command and its children after this many seconds. Omit for no limit.",
    ),
    Arg::opt(
        "wait_seconds",
        Ty::Uint {
            min: 0,
            max: Some(30),
        },
        "How long to wait for the result inline (default 3, max 30, 0 = return at once).",
    ),
];

const STATUS_ARGS: &[Arg] = &[
    Arg::req("id", Ty::Id, "The task id from run, e.g. \"7\"."),
    Arg::opt(
        "wait_seconds",
        Ty::Uint {
            min: 0,
            max: Some(30),
        },
        "Wait up to this long for a running task to finish (default 0, max 30).",
    ),
];

/// The arguments of `run`.
#[derive(Deserialize)]
struct RunArgs {
    cmd: String,
    timeout_secs: Option<u64>,
    wait_seconds: Option<u64>,
}

/// The arguments of `status`.
#[derive(Deserialize)]
struct StatusArgs {
    id: String,
    wait_seconds: Option<u64>,
}

impl Tools for BashTools {
    /// The two tools.
    fn list(&self) -> Vec<ToolDef> {
        vec![
            ToolDef {
                name: "run",
                description: RUN_DESCRIPTION.into(),
                input_schema: InputSchema::Args(RUN_ARGS),
            },
            ToolDef {
                name: "status",
                description: STATUS_DESCRIPTION.into(),
                input_schema: InputSchema::Args(STATUS_ARGS),
            },
        ]
    }

    fn call(&self, name: &str, args: Value, ctx: &CallCtx) -> ToolOutcome {
        match name {
            "run" => self.run(args, ctx).into(),
            "status" => self.status(args, ctx).into(),
            other => ToolOutcome::InvalidParams(format!("unknown tool: {other}")),
        }
    }
}

impl BashTools {
    fn run(&self, a: Value, ctx: &CallCtx) -> Result<ToolOutcome, ToolOutcome> {
        let a: RunArgs = schema::decode(RUN_ARGS, a)?;
        if a.cmd.trim().is_empty() {
            return Err(ToolOutcome::InvalidParams(
                "argument \"cmd\" is empty; give a shell command to run".into(),
            ));
        }
        if a.timeout_secs == Some(0) {
            return Err(ToolOutcome::InvalidParams(
                "argument \"timeout_secs\" must be at least 1; omit it for no limit".into(),
            ));
        }
        let req = Request::Run {
            cmd: a.cmd,
            timeout_secs: a.timeout_secs,
            wait_seconds: Some(a.wait_seconds.unwrap_or(DEFAULT_RUN_WAIT_SECS)),
        };
        let reply: TaskReply = client::call(&self.socket, &req, &ctx.cancel).map_err(failed)?;
        if reply.inline {
            return Ok(ToolOutcome::Ok(render(&reply.task)));
        }
        let id = &reply.task.id;
        Ok(ToolOutcome::Ok(format!(
            "task started: id={id}\nThe command is still running in the background. When it \
             ends you will be woken by a message from bash-task-{id} with its exit code and \
             last output lines; call status with id \"{id}\" to look earlier."
        )))
    }

    fn status(&self, a: Value, ctx: &CallCtx) -> Result<ToolOutcome, ToolOutcome> {
        let a: StatusArgs = schema::decode(STATUS_ARGS, a)?;
        let req = Request::Status {
            id: a.id.trim().to_string(),
            wait_seconds: a.wait_seconds,
        };
        let reply: TaskReply = client::call(&self.socket, &req, &ctx.cancel).map_err(failed)?;
        Ok(ToolOutcome::Ok(render(&reply.task)))
    }
}

fn failed(e: CallError) -> ToolOutcome {
    ToolOutcome::Err(e.to_string())
}

/// The status text a model reads.
pub fn render(t: &TaskView) -> String {
    let mut s = match t.status {
        TaskStatus::Pending | TaskStatus::Running => {
            let mut line = format!(
                "task {}: {} for {:.1}s",
                t.id,
                t.status.as_str(),
                t.duration_secs
            );
            if let Some(limit) = t.timeout_secs {
                line.push_str(&format!(" (timeout {limit}s)"));
            }
            line
        }
        _ => format!("task {}: {}", t.id, outcome_line(t)),
    };
    s.push_str(&format!("\n$ {}\n", t.cmd));
    for (name, tail, bytes, path) in [
        ("stdout", &t.stdout_tail, t.stdout_bytes, &t.stdout_path),
        ("stderr", &t.stderr_tail, t.stderr_bytes, &t.stderr_path),
    ] {
        if bytes == 0 {
            s.push_str(&format!("{name}: empty ({path})\n"));
        } else if tail.len() as u64 >= bytes {
            s.push_str(&format!("{name} ({bytes} bytes, in {path}):\n{tail}"));
            if !tail.ends_with('\n') {
                s.push('\n');
            }
        } else {
            s.push_str(&format!(
                "{name} (last {} of {bytes} bytes; all of it in {path}):\n{tail}",
                tail.len()
            ));
            if !tail.ends_with('\n') {
                s.push('\n');
            }
        }
    }
    s.pop();
    s
}

/// `hive bash-mcp`: serves MCP on stdin/stdout until EOF or a signal, then exits
/// the process with the matching status.
pub fn run_server(socket: PathBuf) -> Result<(), String> {
    let info = ServerInfo {
        name: "bash".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        instructions: None,
    };
    let tools = Arc::new(BashTools { socket });
    // `StdinLock` is not `Send`, so stdin goes in behind a `BufReader`.
    let input = std::io::BufReader::new(std::io::stdin());
    // The signal thread starts with the first call (see `mcp::serve`).
    let reason = mcp::serve(info, tools, input, std::io::stdout(), crate::sys::signals)
        .map_err(|e| e.to_string())?;
    std::process::exit(reason.exit_code());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Both tools as `tools/list` shows them: name, description and the
    /// schema of their declared arguments.
    #[test]
    fn the_listing_is_the_definitions() {
        let listed = BashTools {
            socket: PathBuf::from("/nonexistent/b.sock"),
        }
        .list();
        let defs = [
            ("run", RUN_DESCRIPTION, RUN_ARGS),
            ("status", STATUS_DESCRIPTION, STATUS_ARGS),
        ];
        assert_eq!(listed.len(), defs.len(), "every tool listed");
        for (t, (name, description, args)) in listed.iter().zip(defs) {
            let mut text = String::new();
            t.write_listed(&mut text);
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                v,
                json!({"description": description, "inputSchema": schema::schema(args), "name": name})
            );
        }
    }

    fn view(status: TaskStatus, out: &str, out_bytes: u64) -> TaskView {
        TaskView {
            id: "7".into(),
            cmd: "make".into(),
            status,
            exit_code: (status == TaskStatus::Done).then_some(2),
            signal: None,
            error: None,
            timeout_secs: Some(60),
            started_at: 0,
            duration_secs: 1.25,
            stdout_path: "/s/7.out".into(),
            stderr_path: "/s/7.err".into(),
            stdout_bytes: out_bytes,
            stderr_bytes: 0,
            stdout_tail: out.into(),
            stderr_tail: String::new(),
        }
    }

    #[test]
    fn renders_what_a_model_needs() {
        let cases = [
            (
                view(TaskStatus::Done, "ok\n", 3),
                "task 7: done, exit code 2, after 1.2s\n$ make\nstdout (3 bytes, in /s/7.out):\nok\nstderr: empty (/s/7.err)",
            ),
            (
                view(TaskStatus::Running, "tail", 9000),
                "task 7: running for 1.2s (timeout 60s)\n$ make\nstdout (last 4 of 9000 bytes; all of it in /s/7.out):\ntail\nstderr: empty (/s/7.err)",
            ),
            (
                view(TaskStatus::TimedOut, "", 0),
                "task 7: timed_out (limit 60s; its process group was killed), after 1.2s\n$ make\nstdout: empty (/s/7.out)\nstderr: empty (/s/7.err)",
            ),
        ];
        for (v, want) in cases {
            assert_eq!(render(&v), want);
        }
    }

    /// `tools/list` writes these schemas as text: the text is the serialized
    /// schema, byte for byte.
    #[test]
    fn the_written_schemas_are_the_serialized_schemas() {
        for t in (BashTools {
            socket: "/nonexistent/bash.sock".into(),
        })
        .list()
        {
            let mut text = String::new();
            t.input_schema.write_json(&mut text);
            assert_eq!(text, t.input_schema.to_value().to_string(), "{}", t.name);
            assert!(matches!(t.input_schema, InputSchema::Args(_)), "{}", t.name);
        }
    }

    #[test]
    fn ids_may_be_strings_or_integers() {
        let id = |v: serde_json::Value| {
            schema::decode::<StatusArgs>(STATUS_ARGS, v).map(|a| a.id.trim().to_string())
        };
        assert_eq!(id(json!({"id": " 7 "})).unwrap(), "7");
        assert_eq!(id(json!({"id": 7})).unwrap(), "7");
        for bad in [
            json!({}),
            json!({"id": null}),
            json!({"id": -1}),
            json!({"id": []}),
        ] {
            assert!(matches!(id(bad), Err(ToolOutcome::InvalidParams(_))));
        }
    }
}
