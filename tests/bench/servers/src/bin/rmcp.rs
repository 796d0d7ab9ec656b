//! The rmcp comparison of `make bench`: an MCP server written the way the MCP
//! Rust SDK (rmcp 1.7) shows, with `hive bash-mcp`'s two tools (`run`,
//! `status`) declared through its macros and their schemas derived, on its stdio
//! transport and tokio's default runtime. The tools answer without doing
//! anything: only start-up, `initialize` and `tools/list` are measured.

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, Content, ServerCapabilities, ServerInfo};
use rmcp::{schemars, tool, tool_handler, tool_router, ErrorData, ServerHandler, ServiceExt};

/// The arguments of `run`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct RunArgs {
    /// The shell command line, run with sh -c.
    cmd: String,
    /// Kill the command and its children after this many seconds. Omit for no limit.
    timeout_secs: Option<u64>,
    /// How long to wait for the result inline (default 3, max 30, 0 = return at once).
    wait_seconds: Option<u64>,
}

/// The arguments of `status`.
#[derive(Debug, serde::Deserialize, schemars::JsonSchema)]
struct StatusArgs {
    /// The task id from run, e.g. "7".
    id: String,
    /// Wait up to this long for a running task to finish (default 0, max 30).
    wait_seconds: Option<u64>,
}

#[derive(Clone)]
struct Bash {
    tool_router: ToolRouter<Bash>,
}

impl Bash {
    fn new() -> Bash {
        Bash {
            tool_router: Self::tool_router(),
        }
    }
}

#[tool_router]
impl Bash {
    #[tool(
        description = "Run a shell command in the background (sh -c CMD; the working directory is the agent's state dir, stdin is /dev/null so interactive commands fail). Stdout and stderr are written to files as they come. The call first waits up to wait_seconds (default 3, at most 30; 0 returns at once) for the command to finish: if it does, you get its full status right away (exit code, run time, last 4 KiB of stdout and stderr) and nothing else happens. Otherwise the answer is task started: id=<id> and the command keeps running, even after this turn ends; when it finishes you are woken by a message from bash-task-<id> with its exit code and last output lines, so end your turn instead of polling. timeout_secs kills the command and every process it started after that many seconds (status timed_out); without it the command runs until it exits."
    )]
    async fn run(&self, Parameters(a): Parameters<RunArgs>) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![Content::text(format!(
            "not run: {} (timeout {:?}, wait {:?})",
            a.cmd, a.timeout_secs, a.wait_seconds
        ))]))
    }

    #[tool(
        description = "Show a task started with run: its status (pending, running, done, timed_out, or interrupted when the task daemon was stopped or restarted while it ran, as when the agent is stopped), the exit code once done, the run time, the last 4 KiB of stdout and of stderr, and the paths of the files holding the whole output (read them for more). wait_seconds (default 0, at most 30) first waits that long for a running task to finish, which saves a call when it is about to."
    )]
    async fn status(
        &self,
        Parameters(a): Parameters<StatusArgs>,
    ) -> Result<CallToolResult, ErrorData> {
        Ok(CallToolResult::success(vec![Content::text(format!(
            "no task {} (wait {:?})",
            a.id, a.wait_seconds
        ))]))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Bash {
    fn get_info(&self) -> ServerInfo {
        ServerInfo::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let service = Bash::new().serve(rmcp::transport::stdio()).await?;
    service.waiting().await?;
    Ok(())
}
