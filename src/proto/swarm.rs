//! The swarm as every process sees it: the `matrix` section of the fleet file
//! ([`MatrixConfig`], which the broker hands the bridge at start), and what the
//! broker tells about its bridge ([`BridgeRow`]: how its link to the homeserver
//! is and how many events wait in the outbox). The hive-wide config around the
//! section and its validation are `config`'s; the bridge is `src/bridge/`.

use super::enums::open_enum;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The `matrix` section of the fleet file: how this hive's bridge reaches the
/// swarm's room (`docs/swarm.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatrixConfig {
    /// The homeserver's base URL (`https://matrix.example.org`).
    pub homeserver: String,
    /// The bridge's Matrix user (`@hive-one-bridge:example.org`).
    pub user_id: String,
    /// A file holding the bridge user's password; the access token of its
    /// login is kept (0600) and reused. Exactly one of this and
    /// `access_token_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
    /// A file holding an access token for the bridge user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_token_file: Option<String>,
    /// The swarm's room: its id (`!…`) or alias (`#swarm:example.org`).
    pub room: String,
    /// The other hives: hive name → the Matrix user of its bridge. Events in
    /// the room count only when sent by the bridge of the hive they say they
    /// come from.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub peers: BTreeMap<String, String>,
    /// The fixed device the bridge logs in on (the homeserver deduplicates
    /// transaction ids per device); `HIVE_<HIVE>_BRIDGE` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<String>,
    /// Matrix users who may message this hive's agents as its operator, in
    /// `operator_room`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub operators: Vec<String>,
    /// This hive's operator room (id or alias): messages to the operator are
    /// posted there too, and the listed operators write to agents from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_room: Option<String>,
}

impl MatrixConfig {
    /// The device the bridge of hive `hive` logs in on.
    pub fn device_id_of(&self, hive: &str) -> String {
        match &self.device_id {
            Some(d) => d.clone(),
            None => format!("HIVE_{}_BRIDGE", hive.to_uppercase().replace('-', "_")),
        }
    }

    /// The hive whose bridge is `user_id`, if it is a listed peer.
    pub fn peer_hive(&self, user_id: &str) -> Option<&str> {
        self.peers
            .iter()
            .find(|(_, u)| u.eq_ignore_ascii_case(user_id))
            .map(|(h, _)| h.as_str())
    }
}

open_enum! {
    /// How the bridge's link to the homeserver is, as the bridge reports it
    /// (`connecting`, `connected`, `backing_off`) and as the broker shows it
    /// (also `not_running` while no bridge is connected to its socket).
    pub enum BridgeState {
        /// Started, logging in and joining the room.
        Connecting = "connecting",
        /// The last request to the homeserver succeeded.
        Connected = "connected",
        /// The homeserver is down, slow or rate-limiting: retrying with a
        /// capped backoff.
        BackingOff = "backing_off",
        /// No bridge is connected to the broker's bridge socket.
        NotRunning = "not_running",
    }
}

/// The bridge as `agents` (and so `hive agents` and the dashboard) shows it;
/// only on a hive with a `matrix` section.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BridgeRow {
    pub state: BridgeState,
    /// Since when (unix s) it is in this state.
    pub since: i64,
    /// What the bridge last said about it (the homeserver's error while
    /// backing off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Events committed here and not yet accepted by the homeserver.
    pub outbox: u64,
    /// Events the homeserver refused for good (their senders were told).
    #[serde(default)]
    pub failed: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_id_is_fixed_per_hive_and_peers_are_found_by_user() {
        let mut m = MatrixConfig {
            peers: [("two".to_string(), "@hive-two-bridge:hive.test".to_string())].into(),
            ..MatrixConfig::default()
        };
        assert_eq!(m.device_id_of("one-b"), "HIVE_ONE_B_BRIDGE");
        m.device_id = Some("MINE".into());
        assert_eq!(m.device_id_of("one"), "MINE");
        assert_eq!(m.peer_hive("@Hive-Two-Bridge:hive.test"), Some("two"));
        assert_eq!(m.peer_hive("@mallory:hive.test"), None);
    }
}
