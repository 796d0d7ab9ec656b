//! The baseline for process-start benchmarks: a Rust binary that only exits.
fn main() {}
