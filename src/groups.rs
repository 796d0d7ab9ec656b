//! Tool groups and capabilities as the rest of the crate names them: the enums
//! are the contract's (`proto::access`, where the privilege table uses them);
//! this module keeps the helpers that read them from the environment and list
//! them for the dashboard.

pub use crate::proto::access::{Capability, ToolGroup};

/// Parses a comma list such as `HIVE_TOOL_GROUPS`; empty means the default preset.
pub fn parse_groups(list: &str) -> Result<Vec<ToolGroup>, String> {
    ToolGroup::parse_list(list)
}

/// Every capability's name, for the dashboard's permissions tab.
pub const CAPABILITIES: [&str; 2] = [
    Capability::QueryAgentState.name(),
    Capability::ReadHostJournal.name(),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_capability_list_is_complete() {
        assert_eq!(CAPABILITIES, Capability::ALL.map(|c| c.name()));
    }
}
