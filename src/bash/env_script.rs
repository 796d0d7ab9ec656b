//! The bash environment script for `/etc/hyperhive/bash-env.sh` (`hive
//! env-script` prints it; the nix module installs it when `cargo.shortMessages` is
//! on). It lives in `bash-env.sh` next to this file so it can be read and linted
//! as shell; `tests/env_script.rs` runs it under bash with a fake `cargo`.

/// The script, as installed.
pub const SCRIPT: &str = crate::agent_proc::BASH_ENV_SCRIPT;
