//! Where things are, for every process: the default sockets, where the broker
//! puts each socket under its run dir, and the names of the files an agent's
//! state dir holds (written by one process, read by another, so both take the
//! name from here).

use std::path::{Path, PathBuf};

/// The agent's broker socket inside its container (`HIVE_SOCKET`).
pub const DEFAULT_AGENT_SOCKET: &str = "/run/hive/mcp.sock";
/// The operator's socket (`HIVE_HOST_SOCKET`).
pub const DEFAULT_HOST_SOCKET: &str = "/run/hive/host.sock";
/// Where `hive up` with the default data dir puts the host socket, relative to
/// the directory it was started in; operator commands use it when it exists and
/// neither `--socket` nor `HIVE_HOST_SOCKET` says otherwise.
pub const UP_HOST_SOCKET: &str = "hive-data/run/host.sock";
/// The bash task daemon's socket (`HIVE_BASH_SOCKET`).
pub const DEFAULT_BASH_SOCKET: &str = "/run/hive-bash/socket";
/// An agent's state dir (claude's working directory, the bash tasks' too).
pub const DEFAULT_STATE_DIR: &str = "/state";
/// The bash environment file tasks run with when it exists (`HIVE_BASH_ENV`).
pub const DEFAULT_BASH_ENV: &str = "/etc/hyperhive/bash-env.sh";

/// Where the socket of `agent` lives under the broker's run dir.
pub fn agent_socket(run_dir: &Path, agent: &str) -> PathBuf {
    run_dir.join("agents").join(agent).join("mcp.sock")
}

/// Where the Matrix bridge's socket lives under the broker's run dir (made
/// only for a hive with a `matrix` section).
pub fn bridge_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("bridge.sock")
}

/// Where the operator's socket lives under the broker's run dir.
pub fn host_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("host.sock")
}

/// Files in an agent's state dir.
pub mod state {
    /// The port of the agent's web page (written by the page, read by `hive up`).
    pub const PORT: &str = "hyperhive-port";
    /// The agent's status line (`set_status`; the broker has it too).
    pub const STATUS: &str = "hyperhive-status";
    /// The sentinel `request_next_turn` drops for the turn loop.
    pub const CONTINUE: &str = "hyperhive-continue";
    /// Saved login credentials.
    pub const CREDENTIALS: &str = "hyperhive-credentials";
    /// The sentinel the turn loop keeps while claude needs a login.
    pub const NEEDS_LOGIN: &str = "hyperhive-needs-login";
    /// The model the operator chose on the agent page (`/model`).
    pub const MODEL: &str = "hyperhive-model";
    /// The web page's generated token.
    pub const WEB_TOKEN: &str = "web-token";
    /// Links the agent shows on the dashboard.
    pub const DASHBOARD_LINKS: &str = "hyperhive-dashboard-links.json";
    /// Claude Code CLI versions outside the supported window that the harness
    /// already told its parent about, one a line.
    pub const CLI_VERSIONS_TOLD: &str = "hyperhive-cli-versions-told";
}
