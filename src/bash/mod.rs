//! Background bash tasks. The task daemon (`daemon.rs`, run alone as `hive
//! bash-daemon` — one per agent under `hive up` and the units, so tasks outlive
//! the harness — or embedded in `hive serve`) owns every task process, its output files
//! and its persisted record, and sends the agent a durable wake from
//! `bash-task-<id>` when a task ends unless its result was returned inline.
//! `hive bash-mcp` (`mcp.rs`) is the stdio MCP server `bash` that forwards the
//! `run` and `status` tools to the daemon's socket. The socket protocol is in
//! `proto.rs` (on the crate's JSON-lines transport, `proto::lines`), the client
//! in `client.rs`, the coordinator thread that owns the task state in
//! `coordinator.rs`, process start and kill in `spawn.rs`, the records on disk
//! in `store.rs`, views and wake text in `report.rs`, and wake delivery with
//! retry and the running tasks reported to the broker in `waker.rs`. `env_script.rs` holds the `BASH_ENV`
//! script (`hive env-script`). Documented in `docs/tools/bash.md`.

mod accept;
pub mod client;
mod coordinator;
pub mod daemon;
pub mod env_script;
pub mod mcp;
pub mod proto;
mod report;
mod spawn;
pub mod store;
mod waker;

pub use daemon::{start, DaemonHandle, DaemonSettings};
pub use proto::{TaskStatus, TaskSummary};
