//! Helpers shared by the integration tests: a fake Anthropic Messages API and the
//! kit that runs the real Claude Code CLI against it. Each test binary uses only
//! part of them, hence the `dead_code` allowance.

#![allow(dead_code)]

pub mod claude_cli;
pub mod fake_anthropic;
