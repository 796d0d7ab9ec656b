//! Shared helpers for the integration tests: the hive process kit, the fake
//! Anthropic API and the real Claude Code CLI kit. Each test binary uses a part.
#![allow(dead_code)]

pub mod claude_cli;
pub mod fake_anthropic;
pub mod hive;
pub mod mcp;
