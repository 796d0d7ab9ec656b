//! The agent harness behind `hive serve`: everything between popping one inbox
//! message and acking it. So far only the pure part that reads claude's output is
//! here: [`classify`] turns one claude process's stream-json into a turn outcome.

pub mod classify;
