//! Every tool of `hive bash-mcp` as `tools/list` shows it (`{"description",
//! "inputSchema", "name"}` as JSON text), written out from its definitions by
//! `bash::mcp::tests::the_written_out_listing_is_the_definitions`,
//! which fails when this file and the definitions disagree and, run with
//! `HIVE_BLESS=1`, writes it again: not to be edited by hand. `hive bash-mcp`
//! answers `tools/list` from it instead of building the text at every start
//! (issue 19).

/// Each tool's name and its `tools/list` entry, in the definitions' order.
pub const LISTED: &[(&str, &str)] = &[
    (
        "run",
        r#"{"description":"Run a shell command in the background (`sh -c CMD`; the working directory is the agent's state dir, stdin is /dev/null so interactive commands fail). Stdout and stderr are written to files as they come. The call first waits up to `wait_seconds` (default 3, at most 30; 0 returns at once) for the command to finish: if it does, you get its full status right away (exit code, run time, last 4 KiB of stdout and stderr) and nothing else happens. Otherwise the answer is `task started: id=<id>` and the command keeps running, even after this turn ends; when it finishes you are woken by a message from `bash-task-<id>` with its exit code and last output lines, so end your turn instead of polling. `timeout_secs` kills the command and every process it started after that many seconds (status `timed_out`); without it the command runs until it exits.","inputSchema":{"additionalProperties":false,"properties":{"cmd":{"description":"The shell command line, run with sh -c.","type":"string"},"timeout_secs":{"description":"Kill the command and its children after this many seconds. Omit for no limit.","minimum":1,"type":"integer"},"wait_seconds":{"description":"How long to wait for the result inline (default 3, max 30, 0 = return at once).","maximum":30,"minimum":0,"type":"integer"}},"required":["cmd"],"type":"object"},"name":"run"}"#,
    ),
    (
        "status",
        r#"{"description":"Show a task started with `run`: its status (`pending`, `running`, `done`, `timed_out`, or `interrupted` when the task daemon was stopped or restarted while it ran, as when the agent is stopped), the exit code once done, the run time, the last 4 KiB of stdout and of stderr, and the paths of the files holding the whole output (read them for more). `wait_seconds` (default 0, at most 30) first waits that long for a running task to finish, which saves a call when it is about to.","inputSchema":{"additionalProperties":false,"properties":{"id":{"description":"The task id from run, e.g. \"7\".","type":"string"},"wait_seconds":{"description":"Wait up to this long for a running task to finish (default 0, max 30).","maximum":30,"minimum":0,"type":"integer"}},"required":["id"],"type":"object"},"name":"status"}"#,
    ),
];
