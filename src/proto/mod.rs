//! The contract in the middle: what every hive process shares and agrees on,
//! importing nothing else from the crate. It holds
//!
//! - the wire commands as types (`command.rs`: the [`Command`] trait, the
//!   privilege table and the [`Request`] enum; `cmd/`: one struct per command
//!   with its answer and its validation; `reply.rs`: the shared rows) and who
//!   may send them (`access.rs`: tool groups, capabilities, the gate);
//! - the transport (`lines.rs`: bounded JSON lines, the accept loop, the
//!   client connection) and the typed broker client (`client.rs`);
//! - the small facts: the clock ([`now`]), the revision ([`HYPERHIVE_REV`]),
//!   the limits (`limits.rs`), default sockets and state-file names
//!   (`paths.rs`), text and time formatting (`text.rs`), identities
//!   (`ident.rs`), names on other hives (`address.rs`), the closed
//!   vocabularies of rows (`kinds.rs`), turn outcomes (`outcome.rs`), a fleet
//!   entry (`fleet.rs`) and the fleet file's `matrix` section (`swarm.rs`);
//! - the bash task daemon's requests (`bashwire.rs`), which `hive bash-mcp`
//!   and `hive up` both send it;
//! - the schema versions of the sqlite files (`schema.rs`; the steps of `turn-stats.db` are the harness's, `harness/turnstats.rs`).
//!
//! Documented for script authors in `docs/wire-protocol.md`.

pub mod access;
pub mod address;
pub mod bashwire;
pub mod client;
pub mod cmd;
pub mod command;
mod enums;
pub mod fleet;
pub mod ident;
pub mod invalid;
pub mod kinds;
pub mod limits;
pub mod lines;
pub mod outcome;
pub mod paths;
pub mod reply;
pub mod schema;
pub mod swarm;
pub mod text;

pub use access::{Access, Capability, Gate, ToolGroup};
pub use client::{Client, ClientError, Dial};
pub use command::{Command, Invalid, Request, PRIVILEGES};
pub use fleet::{AgentConfig, Budget, Per};
pub use ident::Peer;
pub use kinds::{
    AgentPhase, ApprovalKind, ApprovalState, Attempt, LooseEndKind, MsgKind, MsgState, PauseReason,
    Place,
};
pub use outcome::TurnOutcomeKind;
pub use reply::*;

use std::time::{SystemTime, UNIX_EPOCH};

/// The protocol version a client can check with `hello`. Bump on any change that
/// an older peer would misread.
pub const PROTOCOL_VERSION: u32 = 1;

/// The revision this binary was built from.
pub const HYPERHIVE_REV: &str = env!("HYPERHIVE_REV");

/// The time in unix seconds, the clock of every row and timer.
pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
