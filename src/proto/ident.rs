//! Who is who: agent names (and the names reserved for everything else), and
//! [`Peer`], the sender or recipient of a message. On the wire and in sqlite a
//! peer is its plain name (`operator`, `system`, `<parent>`, an agent's name,
//! `NAME@HIVE` on another hive, a script's `--from`); [`Peer::sender`] reads
//! one back without the hive's config: reserved names are themselves, a name
//! an agent could have is an agent, `NAME@HIVE` is remote, any other valid
//! `wake` sender is external, and whatever else an old row holds is `Other` —
//! never an error.

use super::address::Remote;
use super::limits::MAX_SENDER_CHARS;
use super::text::{excerpt, is_control_or_bidi};
use std::fmt;

/// Longest agent name.
pub const MAX_NAME_LEN: usize = 9;

/// Names that address something other than an agent.
pub const RESERVED_NAMES: [&str; 5] = ["operator", "system", "self", "parent", "broker"];

/// Senders the broker itself uses for fired timers.
pub const TIMER_SENDERS: [&str; 2] = ["reminder", "scheduler"];

/// The address of an agent's topology parent in `send` and `ask`.
pub const PARENT: &str = "<parent>";

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

/// The `from` of a `wake`: plain text, one line, and none of the names the
/// broker and the operator speak as (an agent's scripts must not be able to
/// pass for them; the operator sends with `send`). The error reads after the
/// word `from`.
pub fn check_sender(from: &str) -> Result<(), String> {
    if from.trim().is_empty() {
        return Err("must not be empty".into());
    }
    if from.chars().count() > MAX_SENDER_CHARS {
        return Err(format!(
            "{} is longer than {MAX_SENDER_CHARS} characters",
            excerpt(from)
        ));
    }
    if from.chars().any(is_control_or_bidi) {
        return Err(format!(
            "{} contains control or bidi characters; use plain text",
            excerpt(from)
        ));
    }
    let name = from.trim().to_lowercase();
    if RESERVED_NAMES.contains(&name.as_str()) || TIMER_SENDERS.contains(&name.as_str()) {
        return Err(format!(
            "{from:?} is reserved for the broker's own messages; choose another name \
             (the operator sends with `hive send`)"
        ));
    }
    Ok(())
}

/// The sender or recipient of a message.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer {
    /// The human operator (the host socket).
    Operator,
    /// The broker's own events.
    System,
    /// An agent's topology parent, as an address (`<parent>`); the broker
    /// resolves it before anything is stored.
    Parent,
    /// A fired reminder.
    Reminder,
    /// A fired scheduled prompt.
    Scheduler,
    /// An agent of the hive.
    Agent(String),
    /// Someone on another hive of the swarm: `NAME@HIVE` (see
    /// [`super::address::Remote`]).
    Remote(String),
    /// A script that woke an agent (`hive wake --from matrix`, `bash-task-7`).
    External(String),
    /// A stored name that is none of the above (rows older releases wrote).
    Other(String),
}

impl Peer {
    /// The name on the wire and in sqlite.
    pub fn as_str(&self) -> &str {
        match self {
            Peer::Operator => "operator",
            Peer::System => "system",
            Peer::Parent => PARENT,
            Peer::Reminder => TIMER_SENDERS[0],
            Peer::Scheduler => TIMER_SENDERS[1],
            Peer::Agent(n) | Peer::Remote(n) | Peer::External(n) | Peer::Other(n) => n,
        }
    }

    /// A name read back without the hive's config (see the module doc).
    pub fn sender(name: &str) -> Peer {
        match name {
            "operator" => Peer::Operator,
            "system" => Peer::System,
            PARENT => Peer::Parent,
            "reminder" => Peer::Reminder,
            "scheduler" => Peer::Scheduler,
            n if check_name(n).is_ok() => Peer::Agent(n.to_string()),
            n if Remote::parse(n).is_some() => Peer::Remote(n.to_string()),
            n if check_sender(n).is_ok() => Peer::External(n.to_string()),
            n => Peer::Other(n.to_string()),
        }
    }

    /// A `to` as a client gives it: the operator, `<parent>`, `NAME@HIVE` on
    /// another hive, or an agent's name (the broker checks that the agent
    /// exists).
    pub fn address(to: &str) -> Peer {
        match to {
            "operator" => Peer::Operator,
            PARENT => Peer::Parent,
            n if Remote::parse(n).is_some() => Peer::Remote(n.to_string()),
            n => Peer::Agent(n.to_string()),
        }
    }

    /// Who on which hive, for someone on another hive.
    pub fn remote(&self) -> Option<Remote> {
        match self {
            Peer::Remote(n) => Remote::parse(n),
            _ => None,
        }
    }

    /// The agent's name, for an agent.
    pub fn agent(&self) -> Option<&str> {
        match self {
            Peer::Agent(n) => Some(n),
            _ => None,
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq<str> for Peer {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Peer {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Peer {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl serde::Serialize for Peer {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Peer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Peer, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Ok(Peer::sender(&name))
    }
}

impl rusqlite::types::ToSql for Peer {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        Ok(rusqlite::types::ToSqlOutput::from(self.as_str()))
    }
}

impl rusqlite::types::FromSql for Peer {
    fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Peer> {
        v.as_str().map(Peer::sender)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_back_as_peers_and_nothing_is_an_error() {
        let cases = [
            ("operator", Peer::Operator),
            ("system", Peer::System),
            ("<parent>", Peer::Parent),
            ("reminder", Peer::Reminder),
            ("scheduler", Peer::Scheduler),
            ("ruth", Peer::Agent("ruth".into())),
            ("bash-task-7", Peer::External("bash-task-7".into())),
            ("b@two", Peer::Remote("b@two".into())),
            ("operator@two", Peer::Remote("operator@two".into())),
            (
                "alice@example.org",
                Peer::External("alice@example.org".into()),
            ),
            ("Web UI", Peer::External("Web UI".into())),
            ("", Peer::Other("".into())),
            ("esc\u{1b}[2J", Peer::Other("esc\u{1b}[2J".into())),
        ];
        for (name, peer) in cases {
            assert_eq!(Peer::sender(name), peer, "{name:?}");
            assert_eq!(peer.as_str(), name);
            let json = serde_json::to_string(&peer).unwrap();
            assert_eq!(serde_json::from_str::<Peer>(&json).unwrap(), peer);
        }
        assert_eq!(Peer::address("<parent>"), Peer::Parent);
        assert_eq!(Peer::address("zed"), Peer::Agent("zed".into()));
        assert_eq!(Peer::address("zed@two"), Peer::Remote("zed@two".into()));
        assert_eq!(
            Peer::address("zed@two").remote(),
            Some(Remote::new("zed", "two"))
        );
    }

    #[test]
    fn names_and_senders_say_what_is_wrong() {
        assert!(check_name("Ruth").unwrap_err().contains("lowercase"));
        assert!(check_name("toolongname").unwrap_err().contains("1 to 9"));
        assert!(check_name("operator").unwrap_err().contains("reserved"));
        for bad in [
            "operator", "System", " self ", "parent", "broker", "reminder",
        ] {
            assert!(check_sender(bad).unwrap_err().contains("reserved"), "{bad}");
        }
        for bad in [
            "a\u{0}b",
            "\u{202e}evil",
            "esc\u{1b}]0;x",
            "two\nlines",
            "c1\u{85}",
        ] {
            assert!(
                check_sender(bad).unwrap_err().contains("control"),
                "{bad:?}"
            );
        }
        assert!(check_sender("cron").is_ok() && check_sender("bash-task-7").is_ok());
    }
}
