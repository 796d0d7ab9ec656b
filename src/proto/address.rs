//! Names: an agent's ([`check_name`]: 1 to 9 of `a-z`, `0-9`, `-`, none of
//! the reserved ones), a hive's own name, which follows the same grammar
//! ([`check_hive_name`]), and someone on another hive of the swarm is
//! `NAME@HIVE` ([`Remote`]), where NAME is an agent's name or one of the
//! names a broker speaks as there (`operator`, `system`). Every process reads
//! a `to`, a `from` or an `allowed_recipients` entry through [`Remote::parse`],
//! so what counts as remote is decided here once. The swarm (`docs/swarm.md`)
//! carries such mail through a Matrix homeserver.

use super::text::excerpt;
use std::fmt;

/// Longest agent name.
pub const MAX_NAME_LEN: usize = 9;

/// Names that address something other than an agent.
pub const RESERVED_NAMES: [&str; 5] = ["operator", "system", "self", "parent", "broker"];

/// Checks an agent name, saying what is wrong with it.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(format!(
            "agent name {} must be 1 to {MAX_NAME_LEN} characters",
            excerpt(name)
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!(
            "agent name {} may only contain lowercase letters, digits and '-'",
            excerpt(name)
        ));
    }
    if RESERVED_NAMES.contains(&name) {
        return Err(format!("agent name {name:?} is reserved"));
    }
    Ok(())
}

/// The local names of another hive that are not agents but may be written to
/// (or come from) there: its operator, and its broker's own notices.
pub const REMOTE_SPEAKERS: [&str; 2] = ["operator", "system"];

/// Checks a hive's name (`hive_name`, a key of `matrix.peers`, the part after
/// `@`): the agent-name grammar, so it never holds an `@`.
pub fn check_hive_name(name: &str) -> Result<(), String> {
    check_name(name).map_err(|e| e.replacen("agent name", "hive name", 1))
}

/// Someone on another hive: `name@hive`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Remote {
    /// An agent of that hive, or `operator` / `system`.
    pub name: String,
    pub hive: String,
}

impl Remote {
    /// `NAME@HIVE` when both parts are well formed; None for anything else
    /// (a local name, an external `--from` such as `alice@example.org`).
    pub fn parse(text: &str) -> Option<Remote> {
        let (name, hive) = text.split_once('@')?;
        let name_ok = check_name(name).is_ok() || REMOTE_SPEAKERS.contains(&name);
        (name_ok && check_hive_name(hive).is_ok()).then(|| Remote {
            name: name.to_string(),
            hive: hive.to_string(),
        })
    }

    /// `NAME@HIVE` for `name` on `hive`.
    pub fn new(name: &str, hive: &str) -> Remote {
        Remote {
            name: name.to_string(),
            hive: hive.to_string(),
        }
    }

    /// Whether the name is an agent's (not `operator` or `system`).
    pub fn is_agent(&self) -> bool {
        !REMOTE_SPEAKERS.contains(&self.name.as_str())
    }
}

impl fmt::Display for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.hive)
    }
}

/// Checks a `to` (or an `allowed_recipients` entry) that contains an `@`:
/// it must read as `NAME@HIVE`. The error reads after the field's name.
pub fn check_remote(text: &str) -> Result<Remote, String> {
    Remote::parse(text).ok_or_else(|| {
        format!(
            "{} is not NAME@HIVE: NAME is an agent's name (or operator), HIVE a hive's name, \
             both 1 to 9 of a-z, 0-9 and '-'",
            excerpt(text)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_names_read_both_parts_with_the_agent_grammar() {
        assert_eq!(Remote::parse("b@two"), Some(Remote::new("b", "two")));
        assert_eq!(
            Remote::parse("operator@two").map(|r| r.is_agent()),
            Some(false)
        );
        assert!(Remote::parse("system@two").is_some());
        for bad in [
            "b",
            "@two",
            "b@",
            "B@two",
            "b@Two",
            "b@two@x",
            "parent@two",
            "b@toolongname",
            "alice@example.org",
            "b@ two",
        ] {
            assert_eq!(Remote::parse(bad), None, "{bad}");
        }
        assert_eq!(Remote::new("a", "one").to_string(), "a@one");
        let e = check_remote("b@Two").unwrap_err();
        assert!(e.contains("is not NAME@HIVE"), "{e}");
        let e = check_hive_name("o@ne").unwrap_err();
        assert!(e.starts_with("hive name"), "{e}");
        assert!(check_hive_name("operator")
            .unwrap_err()
            .contains("reserved"));
    }
}
