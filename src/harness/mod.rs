//! The agent harness behind `hive serve`: everything between popping one inbox
//! message and acking it. So far only pure parts are here: [`classify`] turns one
//! claude process's stream-json into a turn outcome, and [`prompt`] renders the
//! system prompt template.

pub mod classify;
pub mod prompt;
