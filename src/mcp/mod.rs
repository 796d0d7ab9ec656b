//! The stdio MCP server core that `hive mcp` (server `hyperhive`) and
//! `hive bash-mcp` (server `bash`) are built on. The framing lives in
//! `jsonrpc.rs`.

pub mod jsonrpc;
