//! Tool groups and capabilities as the rest of the crate names them: the enums
//! are the contract's (`proto::access`, where the privilege table uses them);
//! this module keeps the helpers that read them from the environment and list
//! them for the dashboard.

pub use crate::proto::access::{Capability, ToolGroup};

/// Parses a comma list such as `HIVE_TOOL_GROUPS`; empty means the default preset.
pub fn parse_groups(list: &str) -> Result<Vec<ToolGroup>, String> {
    ToolGroup::parse_list(list)
}

/// Parses a comma list such as `HIVE_CAPABILITIES`, sorted and without
/// repeats; empty means none.
pub fn parse_capabilities(list: &str) -> Result<Vec<Capability>, String> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        out.push(Capability::parse(part)?);
    }
    out.sort();
    out.dedup();
    Ok(out)
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

    #[test]
    fn capability_lists_parse_and_name_an_unknown_one() {
        assert!(parse_capabilities(" ").unwrap().is_empty());
        assert_eq!(
            parse_capabilities("read_host_journal, query_agent_state,read_host_journal").unwrap(),
            [Capability::QueryAgentState, Capability::ReadHostJournal]
        );
        let e = parse_capabilities("root").unwrap_err();
        assert!(e.starts_with("unknown capability \"root\""), "{e}");
    }
}
