//! The agent harness behind `hive serve`: everything between popping one inbox
//! message and acking it. The pure parts live here so far: [`classify`] turns one
//! claude process's stream-json into a turn outcome, [`prompt`] renders the system
//! prompt template, and [`context`] resolves the context window, the compaction
//! watermarks and the fixed prompts the turn loop sends.

pub mod classify;
pub mod context;
pub mod prompt;
