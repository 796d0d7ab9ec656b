//! hive — one binary that keeps Claude Code agents alive as message-driven daemons.
//! The library holds every subsystem; `src/main.rs` only parses the command line and
//! dispatches here, so integration tests and fuzz targets reach the same code.

pub mod agent_proc;
pub mod bash;
pub mod broker;
pub mod cli;
pub mod config;
pub mod fleet;
pub mod groups;
pub mod harness;
pub mod http;
pub mod mcp;
pub mod ops;
pub mod sys;
pub mod web;
pub mod wire;
