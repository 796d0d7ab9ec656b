//! hive — one binary that keeps Claude Code agents alive as message-driven daemons.
//! The library holds every subsystem; `src/main.rs` only parses the command line
//! (`cli`), resolves it and dispatches here, so integration tests and fuzz targets
//! reach the same code. The modules form layers (`docs/architecture.md`, checked
//! by `tests/layering.rs`): the command line; the harness; the agent page, the
//! bash tasks and the MCP servers; the broker, the fleet and the Matrix bridge;
//! the config and the agents' turn history; and at
//! the bottom the contract and the mechanisms every process shares (`proto`,
//! `agent_proc`, `demand`, `http`, `sys`).

pub mod agent_proc;
pub mod bash;
pub mod bridge;
pub mod broker;
pub mod cli;
pub mod config;
pub mod demand;
pub mod fleet;
pub mod harness;
pub mod history;
pub mod http;
pub mod matrix;
pub mod mcp;
pub mod ops;
pub mod proto;
pub mod sys;
pub mod telemetry;
pub mod web;
