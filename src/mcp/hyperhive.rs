//! The `hyperhive` MCP server that `hive mcp` runs for one agent: a table of
//! tools (one file per group under `hyperhive/`), each a broker command of the
//! contract with what the model reads about it, its arguments (`schema.rs`:
//! the JSON Schema and the check that names a bad argument) and how its answer
//! reads. A call's arguments become the command's struct (serde), pass the
//! command's own `validate` (a -32602 error when they do not), go to the
//! agent's socket through the typed client, and the typed answer is rendered.
//! Which tools an agent sees comes from the command's row of the privilege
//! table (its group, or for `get_host_journal` its capability alone), which is
//! also what the broker enforces and what `--allowedTools` says:
//! [`allowed_hyperhive_tools`]. Documented for users in `docs/tools/mcp.md`.

mod inbox;
mod messaging;
mod meta;
mod privileged;
pub mod reminder_file;

use super::schema::{self, Arg};
use super::{CallCtx, InputSchema, ServerInfo, ToolDef, ToolOutcome, Tools};
use crate::proto::access::{self, Capability, ToolGroup};
use crate::proto::command::Row;
use crate::proto::limits::RECV_WAIT_CAP_SECS;
use crate::proto::paths::DEFAULT_AGENT_SOCKET;
use crate::proto::{Access, Client, ClientError, Command};
use serde::Serialize;
use serde_json::Value;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The server name; claude calls the tools `mcp__hyperhive__<tool>`.
pub const SERVER_NAME: &str = "hyperhive";

/// How long a quick broker request may take before the call gives up.
const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// What a tool's code returns: `Err` carries an outcome too, so `?` works on
/// argument checks and broker calls.
type Handled = Result<ToolOutcome, ToolOutcome>;

/// One tool: its name, who may use it, what the model reads, its arguments and
/// its code.
pub(super) struct Tool {
    name: &'static str,
    /// The command's row of the privilege table (a local tool declares its own).
    access: Access,
    description: &'static str,
    args: &'static [Arg],
    run: fn(&HyperhiveTools, Value, &CallCtx) -> ToolOutcome,
}

/// The tool of broker command `C`: its name and access are the command's.
const fn tool<C: Row>(
    description: &'static str,
    args: &'static [Arg],
    run: fn(&HyperhiveTools, Value, &CallCtx) -> ToolOutcome,
) -> Tool {
    Tool {
        name: C::CMD,
        access: C::ACCESS,
        description,
        args,
        run,
    }
}

/// Every tool, by group.
fn tools() -> impl Iterator<Item = &'static Tool> {
    messaging::TOOLS
        .iter()
        .chain(meta::TOOLS)
        .chain(inbox::TOOLS)
        .chain(privileged::TOOLS)
}

fn find(name: &str) -> Option<&'static Tool> {
    tools().find(|t| t.name == name)
}

/// The tools an agent with `groups` and `capabilities` is granted: those of
/// each group in group order, then those a capability alone grants.
fn tools_of(groups: &[ToolGroup], capabilities: &[Capability]) -> Vec<&'static Tool> {
    let mut out = Vec::new();
    for g in groups {
        out.extend(tools().filter(|t| t.access.group() == Some(*g)));
    }
    for c in capabilities {
        out.extend(tools().filter(|t| t.access.capability() == Some(*c)));
    }
    out
}

/// The bare names of the tools granted by `groups` and `capabilities`.
pub fn tool_names(groups: &[ToolGroup], capabilities: &[Capability]) -> Vec<&'static str> {
    tools_of(groups, capabilities)
        .into_iter()
        .map(|t| t.name)
        .collect()
}

/// The `mcp__hyperhive__<tool>` names for claude's `--allowedTools`: exactly the
/// tools `tools/list` shows for the same groups and capabilities.
pub fn allowed_hyperhive_tools(groups: &[ToolGroup], capabilities: &[Capability]) -> Vec<String> {
    tool_names(groups, capabilities)
        .into_iter()
        .map(|name| format!("mcp__{SERVER_NAME}__{name}"))
        .collect()
}

/// The provider: one agent's groups and capabilities, its broker socket and
/// its state dir.
pub struct HyperhiveTools {
    groups: Vec<ToolGroup>,
    capabilities: Vec<Capability>,
    socket: PathBuf,
    state_dir: Option<PathBuf>,
    /// The longest `recv` waits ([`recv_cap`]).
    recv_cap: u64,
}

impl HyperhiveTools {
    pub fn new(
        groups: Vec<ToolGroup>,
        capabilities: Vec<Capability>,
        socket: PathBuf,
        state_dir: Option<PathBuf>,
    ) -> HyperhiveTools {
        HyperhiveTools {
            groups,
            capabilities,
            socket,
            state_dir,
            recv_cap: RECV_WAIT_CAP_SECS,
        }
    }

    /// Reads `HIVE_TOOL_GROUPS`, `HIVE_CAPABILITIES`, `HIVE_SOCKET` and
    /// `HIVE_STATE_DIR`, and claude's own limits on a tool call ([`recv_cap`]).
    pub fn from_env() -> Result<HyperhiveTools, String> {
        let env = crate::sys::env::Env::process();
        let list = env.get("HIVE_TOOL_GROUPS").unwrap_or_default();
        let groups = access::parse_groups(&list).map_err(|e| format!("HIVE_TOOL_GROUPS: {e}"))?;
        let list = env.get("HIVE_CAPABILITIES").unwrap_or_default();
        let capabilities =
            access::parse_capabilities(&list).map_err(|e| format!("HIVE_CAPABILITIES: {e}"))?;
        let socket = env.path_or("HIVE_SOCKET", DEFAULT_AGENT_SOCKET);
        let mut tools =
            HyperhiveTools::new(groups, capabilities, socket, env.path("HIVE_STATE_DIR"));
        tools.recv_cap = recv_cap(&env);
        if tools.recv_cap < RECV_WAIT_CAP_SECS {
            log::info!(
                "recv waits at most {} s: claude's environment limits a tool call",
                tools.recv_cap
            );
        }
        Ok(tools)
    }

    pub fn info() -> ServerInfo {
        ServerInfo {
            name: SERVER_NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            instructions: Some(
                "hyperhive connects you to your hive: other agents, your parent and the \
                 operator. Messages to you arrive in your inbox; read them with recv."
                    .into(),
            ),
        }
    }

    /// A fresh connection to the agent's broker socket.
    fn connect(&self, timeout: Duration) -> Result<Client, ToolOutcome> {
        let client = Client::connect(&self.socket).map_err(broker_error)?;
        client
            .set_read_timeout(Some(timeout))
            .map_err(|e| ToolOutcome::Err(format!("broker connection failed: {e}")))?;
        Ok(client)
    }

    /// One command on a fresh connection, abandoned when the call is cancelled.
    fn request<C: Command>(&self, cmd: &C, ctx: &CallCtx) -> Result<C::Reply, ToolOutcome> {
        self.connect(BROKER_TIMEOUT)?
            .call_cancellable(cmd, &ctx.cancel)
            .map_err(broker_error)
    }

    /// Runs the tool of command `C`: the arguments become the command (checked
    /// against the tool's list first, so an error names the argument), the
    /// command's own rules apply, then `f` sends it and renders the answer.
    fn run<C: Command>(
        &self,
        args: Value,
        ctx: &CallCtx,
        f: fn(&HyperhiveTools, C, &CallCtx) -> Handled,
    ) -> ToolOutcome {
        let spec = find(C::CMD).map_or(&[][..], |t| t.args);
        let cmd: C = match schema::decode(spec, args) {
            Ok(c) => c,
            Err(e) => return e,
        };
        if let Err(e) = cmd.validate() {
            return ToolOutcome::InvalidParams(e.for_tool());
        }
        f(self, cmd, ctx).unwrap_or_else(|e| e)
    }

    /// The state dir, or an error saying the harness should have set it.
    fn state_dir(&self) -> Result<&Path, ToolOutcome> {
        self.state_dir.as_deref().ok_or_else(|| {
            ToolOutcome::Err(
                "HIVE_STATE_DIR is not set for hive mcp, so there is no state dir to write \
                 to. The harness sets it in the MCP config; tell the operator."
                    .into(),
            )
        })
    }
}

/// The longest the `recv` tool waits: [`RECV_WAIT_CAP_SECS`], or less when
/// claude's environment (which `hive mcp` inherits) puts a lower limit on a
/// tool call: `MCP_TOOL_TIMEOUT` (ms; the per-server `timeout` the harness
/// writes is above the cap), `CLAUDE_CODE_MCP_TOOL_IDLE_TIMEOUT` (ms, CLI
/// 2.1.332's idle watchdog) and, when background tasks are on
/// (`CLAUDE_AUTO_BACKGROUND_TASKS`), `CLAUDE_CODE_MCP_AUTO_BACKGROUND_MS`
/// (ms; 0 turns backgrounding off, and the harness sets 0). A call that
/// ends before the client's limit is never backgrounded or abandoned, so
/// no message is confirmed that the model does not see. Each limit is kept
/// clear of by a tenth of it, at least 5 s.
pub fn recv_cap(env: &crate::sys::env::Env) -> u64 {
    let ms = |key: &str| {
        env.get(key)
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|ms| *ms > 0)
    };
    let background_on = env
        .get("CLAUDE_AUTO_BACKGROUND_TASKS")
        .is_some_and(|v| matches!(v.trim(), "1" | "true" | "yes" | "on"));
    let mut limits = vec![
        ms("MCP_TOOL_TIMEOUT"),
        ms("CLAUDE_CODE_MCP_TOOL_IDLE_TIMEOUT"),
    ];
    if background_on {
        // Unset is the CLI's default threshold of 120 s.
        limits.push(match env.get("CLAUDE_CODE_MCP_AUTO_BACKGROUND_MS") {
            None => Some(120_000),
            Some(_) => ms("CLAUDE_CODE_MCP_AUTO_BACKGROUND_MS"),
        });
    }
    limits
        .into_iter()
        .flatten()
        .map(|ms| {
            let secs = ms / 1000;
            secs.saturating_sub((secs / 10).max(5))
        })
        .fold(RECV_WAIT_CAP_SECS, u64::min)
}

impl Tools for HyperhiveTools {
    fn list(&self) -> Vec<ToolDef> {
        tools_of(&self.groups, &self.capabilities)
            .into_iter()
            .map(|t| ToolDef {
                name: t.name,
                description: t.description.to_string(),
                input_schema: InputSchema::Args(t.args),
            })
            .collect()
    }

    fn call(&self, name: &str, args: Value, ctx: &CallCtx) -> ToolOutcome {
        match find(name) {
            Some(t) => (t.run)(self, args, ctx),
            None => ToolOutcome::InvalidParams(format!("unknown tool: {name}")),
        }
    }
}

/// An answer as the model reads it when the tool has no words of its own: its
/// `text` when that is all it says, `CMD done` when it says nothing, else the
/// answer as JSON.
fn text_or_json<R: Serialize>(cmd: &str, reply: &R) -> String {
    match serde_json::to_value(reply) {
        Ok(Value::Object(map)) if map.is_empty() => format!("{cmd} done"),
        Ok(Value::Object(map)) if map.len() == 1 && map["text"].is_string() => {
            map["text"].as_str().unwrap_or_default().to_string()
        }
        Ok(v) => serde_json::to_string_pretty(&v).unwrap_or_default(),
        Err(e) => format!("cannot render the broker's answer: {e}"),
    }
}

/// A broker failure as text the model can act on.
fn broker_error(e: ClientError) -> ToolOutcome {
    ToolOutcome::Err(match e {
        ClientError::NoBroker { .. } => format!(
            "{e}. Nothing was done; hive's broker is down or restarting. Try again in a \
             little while, and tell the operator if it persists."
        ),
        ClientError::PermissionDenied { .. } => format!("{e}. Nothing was done."),
        ClientError::Refused(reason) => format!("refused by the broker: {reason}"),
        ClientError::Io(_) => format!("{e}. The request may not have been carried out."),
        ClientError::Cancelled => e.to_string(),
    })
}

/// Writes `text` to `path` through a temporary file and a rename, mode 0600
/// whatever the umask (it is a harness state file).
fn write_atomic(path: &Path, text: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, path)
}

/// Runs `hive mcp`: the hyperhive server on stdin and stdout until EOF or a
/// signal; returns the process exit code.
pub fn main() -> Result<i32, String> {
    let tools = HyperhiveTools::from_env()?;
    log::info!(
        "hive mcp: socket {}, groups {}, capabilities {}, tools {}",
        tools.socket.display(),
        tools
            .groups
            .iter()
            .map(|g| g.name())
            .collect::<Vec<_>>()
            .join(","),
        tools
            .capabilities
            .iter()
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(","),
        tool_names(&tools.groups, &tools.capabilities).join(",")
    );
    let input = io::BufReader::new(io::stdin());
    let reason = super::serve(
        HyperhiveTools::info(),
        Arc::new(tools),
        input,
        io::stdout(),
        // The signal thread starts with the first call (see `serve`).
        crate::sys::signals,
    )
    .map_err(|e| e.to_string())?;
    Ok(reason.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::access::{Caller, Capability, Gate};
    use crate::proto::PRIVILEGES;

    /// `recv` waits below every limit claude's environment puts on a call.
    #[test]
    fn recv_waits_below_the_clients_limits() {
        let cap = |vars: &[(&str, &str)]| {
            let vars: Vec<(String, String)> = vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            let lookup = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
            recv_cap(&crate::sys::env::Env::new(&lookup))
        };
        assert_eq!(cap(&[]), RECV_WAIT_CAP_SECS);
        // The harness's own setting: backgrounding off.
        let off = [
            ("CLAUDE_AUTO_BACKGROUND_TASKS", "1"),
            ("CLAUDE_CODE_MCP_AUTO_BACKGROUND_MS", "0"),
        ];
        assert_eq!(cap(&off), RECV_WAIT_CAP_SECS);
        // Background tasks on: the CLI's default threshold is 120 s, or the
        // one set; a threshold alone (tasks off) changes nothing.
        assert_eq!(
            cap(&[("CLAUDE_AUTO_BACKGROUND_TASKS", "1")]),
            RECV_WAIT_CAP_SECS
        );
        let low = [
            ("CLAUDE_AUTO_BACKGROUND_TASKS", "1"),
            ("CLAUDE_CODE_MCP_AUTO_BACKGROUND_MS", "20000"),
        ];
        assert_eq!(cap(&low), 15);
        assert_eq!(cap(&[("CLAUDE_CODE_MCP_AUTO_BACKGROUND_MS", "20000")]), 100);
        assert_eq!(cap(&[("MCP_TOOL_TIMEOUT", "60000")]), 54);
        assert_eq!(cap(&[("CLAUDE_CODE_MCP_TOOL_IDLE_TIMEOUT", "30000")]), 25);
        assert_eq!(
            cap(&[("MCP_TOOL_TIMEOUT", "3000")]),
            0,
            "a tiny limit: no wait"
        );
        assert_eq!(cap(&[("MCP_TOOL_TIMEOUT", "soon")]), RECV_WAIT_CAP_SECS);
    }

    /// Every tool of the table as `tools/list` shows it: its name, its
    /// description and the schema of its declared arguments, and nothing else.
    #[test]
    fn the_listing_is_the_tables() {
        let all = provider(&ToolGroup::ALL, &Capability::ALL).list();
        let table: Vec<_> = tools().collect();
        assert_eq!(all.len(), table.len(), "every tool listed");
        for (def, t) in all.iter().zip(&table) {
            let mut text = String::new();
            def.write_listed(&mut text);
            let v: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(
                v,
                serde_json::json!({
                    "description": t.description,
                    "inputSchema": schema::schema(t.args),
                    "name": t.name,
                }),
                "{}",
                t.name
            );
        }
    }

    fn provider(groups: &[ToolGroup], capabilities: &[Capability]) -> HyperhiveTools {
        HyperhiveTools::new(
            groups.to_vec(),
            capabilities.to_vec(),
            PathBuf::from("/nonexistent/mcp.sock"),
            None,
        )
    }

    /// Every subset of `all`, so the agreement holds for any config.
    fn subsets<T: Copy>(all: &[T]) -> Vec<Vec<T>> {
        (0u32..1 << all.len())
            .map(|mask| {
                all.iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .map(|(_, g)| *g)
                    .collect()
            })
            .collect()
    }

    /// The privilege table, `tools/list`, `--allowedTools` and enforcement
    /// agree for every command, every set of groups and every set of
    /// capabilities: a tool is listed and allowed exactly when the broker
    /// admits its command from an agent with those grants.
    #[test]
    fn listing_allowed_tools_and_enforcement_agree_for_every_command() {
        for groups in subsets(&ToolGroup::ALL) {
            for capabilities in subsets(&Capability::ALL) {
                let listed: Vec<String> = provider(&groups, &capabilities)
                    .list()
                    .iter()
                    .map(|t| format!("mcp__hyperhive__{}", t.name))
                    .collect();
                assert_eq!(
                    listed,
                    allowed_hyperhive_tools(&groups, &capabilities),
                    "{groups:?} {capabilities:?}"
                );
                for (cmd, access) in PRIVILEGES {
                    let admitted = access
                        .admits(
                            cmd,
                            Caller::Agent {
                                name: "ana",
                                groups: &groups,
                                capabilities: &capabilities,
                                via: crate::proto::access::Via::Socket,
                            },
                        )
                        .is_ok();
                    let name = format!("mcp__hyperhive__{cmd}");
                    if let Some(gate) = access.gate() {
                        assert_eq!(
                            admitted,
                            gate.granted(&groups, &capabilities),
                            "{cmd} for {groups:?} {capabilities:?}"
                        );
                    }
                    if find(cmd).is_some() {
                        assert_eq!(
                            listed.contains(&name),
                            admitted,
                            "{cmd} for {groups:?} {capabilities:?}"
                        );
                    }
                }
            }
        }
        // get_host_journal: its capability alone, no group.
        let only_cap = allowed_hyperhive_tools(&[], &[Capability::ReadHostJournal]);
        assert_eq!(only_cap, ["mcp__hyperhive__get_host_journal"]);
        let only_group = allowed_hyperhive_tools(&[ToolGroup::Diagnostics], &[]);
        assert_eq!(only_group, ["mcp__hyperhive__get_logs"]);
    }

    #[test]
    fn every_tool_is_a_command_of_its_gate_or_a_declared_local_tool() {
        for t in tools() {
            match PRIVILEGES.iter().find(|(cmd, _)| *cmd == t.name) {
                Some((_, access)) => assert_eq!(*access, t.access, "{}", t.name),
                None => assert_eq!(t.name, "request_next_turn", "an unknown local tool"),
            }
            assert!(
                t.access.group().is_some() || t.access.capability().is_some(),
                "{} is behind a group or a capability",
                t.name
            );
            let owners = ToolGroup::ALL
                .iter()
                .filter(|g| tool_names(&[**g], &[]).contains(&t.name))
                .count()
                + Capability::ALL
                    .iter()
                    .filter(|c| tool_names(&[], &[**c]).contains(&t.name))
                    .count();
            assert_eq!(owners, 1, "{} is granted by exactly one grant", t.name);
        }
        // Every gated command an agent can send has its tool, but recv_ack,
        // which the recv tool sends itself.
        for (cmd, access) in PRIVILEGES {
            if matches!(access.gate(), Some(Gate::Group(_) | Gate::Capability(_)))
                && *cmd != "recv_ack"
            {
                assert!(find(cmd).is_some(), "{cmd} has no tool");
            }
        }
    }

    #[test]
    fn the_default_preset_lists_the_core_tools() {
        let groups = access::parse_groups("").unwrap();
        assert_eq!(
            tool_names(&groups, &[]),
            [
                "send",
                "recv",
                "ask",
                "answer",
                "message_state",
                "set_status",
                "get_agent_meta",
                "get_loose_ends",
                "cancel_loose_end",
                "remind",
                "request_next_turn"
            ]
        );
    }

    /// Each tool's arguments are exactly its command's fields: a sample with
    /// every argument becomes the command, and the command refuses any other.
    #[test]
    fn tool_arguments_are_the_commands_fields() {
        for t in tools() {
            let schema = schema::schema(t.args);
            assert_eq!(schema["type"], "object", "{}", t.name);
            assert_eq!(schema["additionalProperties"], false, "{}", t.name);
            for (key, prop) in schema["properties"].as_object().unwrap() {
                assert!(prop["description"].is_string(), "{}.{key}", t.name);
            }
            assert!(
                t.description.len() > 60,
                "{} needs a real description",
                t.name
            );
            let sample: serde_json::Map<String, Value> = t
                .args
                .iter()
                .map(|a| {
                    let v = match a.ty {
                        schema::Ty::Str | schema::Ty::StrMax(_) | schema::Ty::Id => json!("x"),
                        schema::Ty::Enum(values) => json!(values[0]),
                        schema::Ty::Int => json!(1),
                        schema::Ty::Uint { min, .. } => json!(min.max(1)),
                        schema::Ty::Bool => json!(true),
                        schema::Ty::StrList => json!(["x"]),
                    };
                    (a.name.to_string(), v)
                })
                .collect();
            if let Some((cmd, _)) = PRIVILEGES.iter().find(|(cmd, _)| *cmd == t.name) {
                let mut line = sample.clone();
                line.insert("cmd".into(), json!(cmd));
                let line = Value::Object(line).to_string();
                assert!(
                    crate::proto::Request::parse(&line).is_ok(),
                    "{}: {line}",
                    t.name
                );
                let mut extra = serde_json::from_str::<Value>(&line).unwrap();
                extra["not_an_argument"] = json!(1);
                assert!(crate::proto::Request::parse(&extra.to_string()).is_err());
            }
        }
    }

    #[test]
    fn an_unreachable_broker_is_a_tool_error_naming_the_socket() {
        let p = provider(&ToolGroup::AGENT_DEFAULT, &[]);
        let (ctx, _cancel) = CallCtx::new(crate::mcp::RequestId::from(1));
        let out = p.call("get_agent_meta", json!({}), &ctx);
        let ToolOutcome::Err(text) = out else {
            panic!("expected a tool error, got {out:?}");
        };
        assert!(
            text.starts_with("no broker at /nonexistent/mcp.sock — is hive broker running?"),
            "{text}"
        );
    }

    use serde_json::json;
}
