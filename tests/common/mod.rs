//! Shared helpers for the integration tests: the hive process kit, the fake
//! Anthropic API, the real Claude Code CLI kit, the in-process web UI kit, the
//! agent page of a running harness, a real Matrix homeserver (Synapse), a real
//! nginx in front of a web server and small filesystems to fill or make
//! read-only.
//! Each test binary uses a part.
#![allow(dead_code)]

pub mod agent_page;
pub mod browser;
pub mod claude_cli;
pub mod fake_anthropic;
pub mod hive;
pub mod mcp;
pub mod nginx;
pub mod smallfs;
pub mod synapse;
pub mod up;
pub mod web;
