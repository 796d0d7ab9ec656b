//! The contract in the middle: what every hive process shares and agrees on,
//! importing nothing else from the crate. Today it holds the schema versions of
//! the sqlite files hive keeps (`schema.rs`, `turnstats.rs`) and the closed set
//! of turn outcomes (`outcome.rs`).

pub mod outcome;
pub mod schema;
pub mod turnstats;

pub use outcome::TurnOutcomeKind;
