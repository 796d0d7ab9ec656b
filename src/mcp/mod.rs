//! The stdio MCP server core that `hive mcp` (server `hyperhive`) and
//! `hive bash-mcp` (server `bash`) are built on. This module owns the contract
//! between the core and a tool provider: [`Tools`] lists and runs tools, a call gets
//! a [`CallCtx`] whose cancel channel fires when the client cancels or the server
//! exits, and it answers with a [`ToolOutcome`], which may carry a hook that runs
//! only once the result has been written to stdout. The framing lives in
//! `jsonrpc.rs`, the threads and the MCP methods in `server.rs`, a tool's
//! declared arguments (its schema and the check that names a bad one) in
//! `schema.rs`. The behaviour is documented in `docs/mcp-protocol.md`.

pub mod hyperhive;
pub mod jsonrpc;
pub mod schema;
mod server;

pub use jsonrpc::RequestId;
pub use server::{serve, ExitReason, SUPPORTED_PROTOCOL_VERSIONS};

use crossbeam_channel::{Receiver, Sender, TryRecvError};
use serde_json::Value;
use std::fmt;

/// Who the server says it is in its `initialize` answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerInfo {
    /// `hyperhive` or `bash`; the client prefixes tool names with it.
    pub name: String,
    pub version: String,
    /// Optional text the client may add to the model's system prompt.
    pub instructions: Option<String>,
}

/// One tool as `tools/list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: &'static str,
    pub description: String,
    /// A JSON Schema object describing `arguments`.
    pub input_schema: InputSchema,
}

impl ToolDef {
    /// Appends the tool as `tools/list` shows it: the same text as
    /// serializing `{"description", "inputSchema", "name"}` (keys in order),
    /// without building that value.
    pub fn write_listed(&self, out: &mut String) {
        out.push_str(r#"{"description":"#);
        crate::proto::lines::push_json_str(out, &self.description);
        out.push_str(r#","inputSchema":"#);
        self.input_schema.write_json(out);
        out.push_str(r#","name":"#);
        crate::proto::lines::push_json_str(out, self.name);
        out.push('}');
    }
}

/// A tool's JSON Schema.
#[derive(Debug, Clone, PartialEq)]
pub enum InputSchema {
    /// Declared as arguments (`schema.rs`): `tools/list` writes it straight
    /// to JSON text, without building it as a `Value` first.
    Args(&'static [schema::Arg]),
    /// Any other schema object.
    Json(Value),
}

impl InputSchema {
    /// The schema as a JSON value.
    pub fn to_value(&self) -> Value {
        match self {
            InputSchema::Args(args) => schema::schema(args),
            InputSchema::Json(v) => v.clone(),
        }
    }

    /// Appends the schema as JSON text: what serializing [`InputSchema::to_value`]
    /// gives.
    pub fn write_json(&self, out: &mut String) {
        match self {
            InputSchema::Args(args) => schema::write_schema(args, out),
            InputSchema::Json(v) => out.push_str(&v.to_string()),
        }
    }
}

impl From<Value> for InputSchema {
    fn from(v: Value) -> InputSchema {
        InputSchema::Json(v)
    }
}

/// Runs after the result line was written and flushed, on the writer thread, so it
/// must be quick. It is dropped unrun when the write fails, the call was cancelled,
/// or the server is exiting.
pub type AfterWrite = Box<dyn FnOnce() + Send + 'static>;

/// What a tool call produced.
pub enum ToolOutcome {
    /// Success: the text becomes one `text` content block.
    Ok(String),
    /// Success with a hook that runs only once the result reached stdout. `recv`
    /// uses it to acknowledge rows to the broker.
    OkThen(String, AfterWrite),
    /// A failure the model can act on: `isError: true` with this text.
    Err(String),
    /// The arguments are wrong: an `isError: true` result (MCP 2025-11-25: an
    /// input validation error is a tool execution error, which the model can
    /// read and act on, where the CLI shows a JSON-RPC error as a failed call
    /// it cannot). The text names the argument, quotes the value and says what
    /// is allowed. An unknown tool and a malformed `tools/call` stay JSON-RPC
    /// -32602 errors, answered by the server before any tool runs.
    InvalidParams(String),
}

impl fmt::Debug for ToolOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ToolOutcome::Ok(text) => f.debug_tuple("Ok").field(text).finish(),
            ToolOutcome::OkThen(text, _) => f.debug_tuple("OkThen").field(text).finish(),
            ToolOutcome::Err(text) => f.debug_tuple("Err").field(text).finish(),
            ToolOutcome::InvalidParams(text) => f.debug_tuple("InvalidParams").field(text).finish(),
        }
    }
}

/// Lets a handler written as `fn(..) -> Result<ToolOutcome, ToolOutcome>` use `?`
/// on its argument checks and still answer with `.into()`.
impl From<Result<ToolOutcome, ToolOutcome>> for ToolOutcome {
    fn from(result: Result<ToolOutcome, ToolOutcome>) -> ToolOutcome {
        result.unwrap_or_else(|e| e)
    }
}

/// A tool provider. One instance serves every call, each on its own thread.
pub trait Tools: Send + Sync + 'static {
    /// The tools to advertise. Called once, inline on the server's loop, for
    /// the first `tools/list` or `tools/call`; the server keeps the answer (to
    /// list them and to check the name of every call), so it must not change.
    fn list(&self) -> Vec<ToolDef>;

    /// Runs one call on its own thread. `name` is one of [`Tools::list`]'s names and
    /// `args` is a JSON object. A call that waits must also wait on `ctx.cancel` and
    /// return promptly when it fires; its result is then discarded.
    fn call(&self, name: &str, args: Value, ctx: &CallCtx) -> ToolOutcome;
}

/// What a running call knows about itself.
#[derive(Debug)]
pub struct CallCtx {
    /// The JSON-RPC id of the `tools/call`, for logs.
    pub id: RequestId,
    /// Becomes disconnected when the call is cancelled, by the client or because
    /// the server is exiting; nothing is ever sent on it. Put it in a `select!`
    /// next to the tool's own channels.
    pub cancel: Receiver<()>,
}

impl CallCtx {
    /// A context for call `id`; dropping the returned sender cancels it. The server
    /// uses this, and so can a provider's own tests.
    pub fn new(id: RequestId) -> (CallCtx, Sender<()>) {
        let (tx, cancel) = crossbeam_channel::bounded(0);
        (CallCtx { id, cancel }, tx)
    }

    /// True once the call has been cancelled.
    pub fn is_cancelled(&self) -> bool {
        matches!(self.cancel.try_recv(), Err(TryRecvError::Disconnected))
    }
}
