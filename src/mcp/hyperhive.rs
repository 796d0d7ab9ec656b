//! The `hyperhive` MCP server that `hive mcp` runs for one agent: the tool table,
//! which tools the enabled groups show, the broker connection each call makes,
//! and the `--allowedTools` names the harness hands claude. The tools themselves
//! live one file per group under `hyperhive/`; what an agent may do is decided by
//! the broker on the agent's socket, and `tools/list` only mirrors it. Documented
//! for users in `docs/tools/mcp.md`.

mod inbox;
mod messaging;
mod meta;
mod privileged;

use super::{CallCtx, ServerInfo, ToolDef, ToolOutcome, Tools};
use crate::groups::{self, ToolGroup};
use crate::wire::{Client, ClientError, Request};
use crossbeam_channel::{bounded, select};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The server name; claude calls the tools `mcp__hyperhive__<tool>`.
pub const SERVER_NAME: &str = "hyperhive";

/// The sentinel `request_next_turn` drops in the state dir for `hive serve`.
pub const CONTINUE_FILE: &str = "hyperhive-continue";

/// Where `set_status` keeps the agent's status line in the state dir.
pub const STATUS_FILE: &str = "hyperhive-status";

/// How long a quick broker request may take before the call gives up.
const BROKER_TIMEOUT: Duration = Duration::from_secs(30);

/// What a handler returns: `Err` carries an outcome too, so `?` works on the
/// argument helpers and on broker calls.
type Handled = Result<ToolOutcome, ToolOutcome>;

/// One implemented tool: its name, what the model reads, its schema and its code.
struct Spec {
    name: &'static str,
    description: &'static str,
    schema: fn() -> Value,
    run: fn(&Hyperhive, &Value, &CallCtx) -> Handled,
}

/// Every implemented tool. Which ones an agent sees comes from its groups
/// ([`ToolGroup::hyperhive_tools`]); a group tool missing here is neither
/// listed nor allowed.
fn specs() -> impl Iterator<Item = &'static Spec> {
    messaging::TOOLS
        .iter()
        .chain(inbox::TOOLS)
        .chain(meta::TOOLS)
        .chain(privileged::TOOLS)
}

fn spec(name: &str) -> Option<&'static Spec> {
    specs().find(|s| s.name == name)
}

/// The bare names of the implemented tools of `groups`, in group order.
pub fn tool_names(groups: &[ToolGroup]) -> Vec<&'static str> {
    let mut names = Vec::new();
    for group in groups {
        for name in group.hyperhive_tools() {
            if spec(name).is_some() && !names.contains(name) {
                names.push(*name);
            }
        }
    }
    names
}

/// The `mcp__hyperhive__<tool>` names for claude's `--allowedTools`: exactly the
/// tools `tools/list` shows for the same groups.
pub fn allowed_hyperhive_tools(groups: &[ToolGroup]) -> Vec<String> {
    tool_names(groups)
        .into_iter()
        .map(|name| format!("mcp__{SERVER_NAME}__{name}"))
        .collect()
}

/// The provider: one agent's groups, its broker socket and its state dir.
pub struct Hyperhive {
    groups: Vec<ToolGroup>,
    socket: PathBuf,
    state_dir: Option<PathBuf>,
    /// The bash-task daemon, whose running tasks are loose ends too.
    bash_socket: Option<PathBuf>,
}

impl Hyperhive {
    pub fn new(groups: Vec<ToolGroup>, socket: PathBuf, state_dir: Option<PathBuf>) -> Hyperhive {
        Hyperhive {
            groups,
            socket,
            state_dir,
            bash_socket: None,
        }
    }

    /// Lists the bash daemon's running tasks in `get_loose_ends`.
    pub fn with_bash_socket(mut self, socket: Option<PathBuf>) -> Hyperhive {
        self.bash_socket = socket;
        self
    }

    pub fn bash_socket(&self) -> Option<&std::path::Path> {
        self.bash_socket.as_deref()
    }

    /// Reads `HIVE_TOOL_GROUPS`, `HIVE_SOCKET`, `HIVE_STATE_DIR` and `HIVE_BASH_SOCKET`.
    pub fn from_env() -> Result<Hyperhive, String> {
        let env = crate::sys::env::Env::process();
        let list = env.get("HIVE_TOOL_GROUPS").unwrap_or_default();
        let groups = groups::parse_groups(&list).map_err(|e| format!("HIVE_TOOL_GROUPS: {e}"))?;
        let socket = env.path_or("HIVE_SOCKET", crate::wire::DEFAULT_AGENT_SOCKET);
        Ok(Hyperhive::new(groups, socket, env.path("HIVE_STATE_DIR"))
            .with_bash_socket(env.path("HIVE_BASH_SOCKET")))
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
    fn connect(&self) -> Result<Client, ToolOutcome> {
        let client = Client::connect(&self.socket).map_err(broker_error)?;
        client
            .set_read_timeout(Some(BROKER_TIMEOUT))
            .map_err(|e| ToolOutcome::Err(format!("broker connection failed: {e}")))?;
        Ok(client)
    }

    /// One request on a fresh connection, decoded as `T`.
    fn request<T: DeserializeOwned>(&self, req: &Request, ctx: &CallCtx) -> Result<T, ToolOutcome> {
        let mut client = self.connect()?;
        let map = call_cancellable(&mut client, req, ctx)?;
        decode(req, map)
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

impl Tools for Hyperhive {
    fn list(&self) -> Vec<ToolDef> {
        tool_names(&self.groups)
            .into_iter()
            .filter_map(spec)
            .map(|s| ToolDef {
                name: s.name,
                description: s.description.to_string(),
                input_schema: (s.schema)(),
            })
            .collect()
    }

    fn call(&self, name: &str, args: Value, ctx: &CallCtx) -> ToolOutcome {
        match spec(name) {
            Some(s) => (s.run)(self, &args, ctx).into(),
            None => ToolOutcome::InvalidParams(format!("unknown tool: {name}")),
        }
    }
}

/// Sends `req` on `client`; the call ends at once when `ctx` is cancelled,
/// because a watcher shuts the stream down.
fn call_cancellable(
    client: &mut Client,
    req: &Request,
    ctx: &CallCtx,
) -> Result<Map<String, Value>, ToolOutcome> {
    let handle = client
        .shutdown_handle()
        .map_err(|e| ToolOutcome::Err(format!("broker connection failed: {e}")))?;
    let (done_tx, done_rx) = bounded::<()>(0);
    let cancel = ctx.cancel.clone();
    let watcher = std::thread::Builder::new()
        .name("mcp-call-watch".into())
        .spawn(move || {
            select! {
                recv(cancel) -> _ => {
                    let _ = handle.shutdown(std::net::Shutdown::Both);
                }
                recv(done_rx) -> _ => {}
            }
        })
        .map_err(|e| ToolOutcome::Err(format!("could not start a thread for the call: {e}")))?;
    let result = client.call(req);
    drop(done_tx);
    let _ = watcher.join();
    if ctx.is_cancelled() {
        return Err(ToolOutcome::Err("the call was cancelled".into()));
    }
    result.map_err(broker_error)
}

fn decode<T: DeserializeOwned>(req: &Request, map: Map<String, Value>) -> Result<T, ToolOutcome> {
    serde_json::from_value(Value::Object(map)).map_err(|e| {
        ToolOutcome::Err(format!(
            "unexpected answer from the broker to {}: {e}",
            req.cmd()
        ))
    })
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
    let signals = crate::sys::signals()?;
    let tools = Hyperhive::from_env()?;
    log::info!(
        "hive mcp: socket {}, groups {}, tools {}",
        tools.socket.display(),
        tools
            .groups
            .iter()
            .map(|g| g.name())
            .collect::<Vec<_>>()
            .join(","),
        tool_names(&tools.groups).join(",")
    );
    let input = io::BufReader::new(io::stdin());
    let reason = super::serve(
        Hyperhive::info(),
        Arc::new(tools),
        input,
        io::stdout(),
        signals,
    )
    .map_err(|e| e.to_string())?;
    Ok(reason.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(groups: &[ToolGroup]) -> Hyperhive {
        Hyperhive::new(
            groups.to_vec(),
            PathBuf::from("/nonexistent/mcp.sock"),
            None,
        )
    }

    /// Every subset of the groups, so the agreement holds for any config.
    fn all_group_sets() -> Vec<Vec<ToolGroup>> {
        let all = ToolGroup::ALL;
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

    #[test]
    fn allowed_tools_equal_the_listed_tools_for_every_group_set() {
        for groups in all_group_sets() {
            let listed: Vec<String> = provider(&groups)
                .list()
                .iter()
                .map(|t| format!("mcp__hyperhive__{}", t.name))
                .collect();
            assert_eq!(listed, allowed_hyperhive_tools(&groups), "{groups:?}");
        }
    }

    #[test]
    fn the_default_preset_lists_the_core_tools() {
        let groups = groups::parse_groups("").unwrap();
        assert_eq!(
            tool_names(&groups),
            [
                "send",
                "recv",
                "ask",
                "answer",
                "set_status",
                "get_agent_meta",
                "get_loose_ends",
                "cancel_loose_end",
                "remind",
                "request_next_turn"
            ]
        );
    }

    #[test]
    fn every_group_tool_is_implemented() {
        for group in ToolGroup::ALL {
            for name in group.hyperhive_tools() {
                assert!(spec(name).is_some(), "{name}");
            }
        }
        for s in specs() {
            let owners = ToolGroup::ALL
                .iter()
                .filter(|g| g.hyperhive_tools().contains(&s.name))
                .count();
            assert_eq!(owners, 1, "{} belongs to exactly one group", s.name);
        }
    }

    #[test]
    fn schemas_are_closed_objects_whose_required_members_exist() {
        for s in specs() {
            let schema = (s.schema)();
            assert_eq!(schema["type"], "object", "{}", s.name);
            assert_eq!(schema["additionalProperties"], false, "{}", s.name);
            let props = schema["properties"].as_object().expect("properties");
            for req in schema["required"].as_array().into_iter().flatten() {
                assert!(props.contains_key(req.as_str().unwrap()), "{}", s.name);
            }
            for (key, prop) in props {
                assert!(prop["description"].is_string(), "{}.{key}", s.name);
            }
            assert!(
                s.description.len() > 60,
                "{} needs a real description",
                s.name
            );
        }
    }

    #[test]
    fn an_unreachable_broker_is_a_tool_error_naming_the_socket() {
        let p = provider(&ToolGroup::AGENT_DEFAULT);
        let (ctx, _cancel) = CallCtx::new(crate::mcp::RequestId::from(1));
        let out = p.call("get_agent_meta", serde_json::json!({}), &ctx);
        let ToolOutcome::Err(text) = out else {
            panic!("expected a tool error, got {out:?}");
        };
        assert!(
            text.starts_with("no broker at /nonexistent/mcp.sock — is hive broker running?"),
            "{text}"
        );
    }
}
