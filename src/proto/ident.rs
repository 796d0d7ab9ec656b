//! Who is who: agent names (and the names reserved for everything else), and
//! [`Peer`], the sender or recipient of a message. On the wire and in sqlite a
//! peer is its plain name (`operator`, `system`, `<parent>`, an agent's name,
//! `NAME@HIVE` on another hive, a script's `--from`); [`Peer::sender`] reads
//! one back without the hive's config: reserved names are themselves, a name
//! an agent could have is an agent, `NAME@HIVE` is remote, any other valid
//! `wake` sender is external, and whatever else an old row holds is `Other` —
//! never an error.

use super::address::Remote;
pub use super::address::{check_name, MAX_NAME_LEN, RESERVED_NAMES};
use super::limits::MAX_SENDER_CHARS;
use super::text::{excerpt, is_control_or_bidi, is_format};
use std::fmt;

/// Senders the broker itself uses for fired timers.
pub const TIMER_SENDERS: [&str; 2] = ["reminder", "scheduler"];

/// The sender of what the operator types on an agent's own page (its
/// `/api/send`): a `wake` from it is taken only from the agent's harness
/// (the process that runs the page), never from a script (issue 40).
pub const PAGE_SENDER: &str = "web-ui";

/// Letters of Latin, Greek and Cyrillic that pass for an ASCII letter (or
/// a dash for `-`), each as the ASCII it passes for: a non-ASCII sender
/// name is read through this table (after the case is folded) before it is
/// compared with the reserved names, so `оperator` with a Cyrillic `о`, or
/// `ЅYSTEM` with a Cyrillic `Ѕ`, is refused like `operator`. Small on
/// purpose — the letters that look the same in the fonts terminals and
/// browsers use, not Unicode's whole confusables list — and both cases
/// where they differ (Greek `Ν` is `n`, `ν` is `v`). Fullwidth Latin
/// letters are folded apart ([`fold_lookalikes`]).
const LOOKALIKES: &[(char, char)] = &[
    // Latin
    ('\u{131}', 'i'),  // ı dotless i
    ('\u{237}', 'j'),  // ȷ dotless j
    ('\u{251}', 'a'),  // ɑ alpha
    ('\u{261}', 'g'),  // ɡ script g
    ('\u{269}', 'i'),  // ɩ iota
    ('\u{1d00}', 'a'), // ᴀ small capital a
    ('\u{1d04}', 'c'), // ᴄ
    ('\u{1d07}', 'e'), // ᴇ
    ('\u{1d0f}', 'o'), // ᴏ
    ('\u{1d18}', 'p'), // ᴘ
    ('\u{1d1b}', 't'), // ᴛ
    ('\u{a731}', 's'), // ꜱ
    ('\u{280}', 'r'),  // ʀ
    ('\u{28f}', 'y'),  // ʏ
    // Greek, capitals
    ('\u{391}', 'a'), // Α
    ('\u{392}', 'b'), // Β
    ('\u{395}', 'e'), // Ε
    ('\u{396}', 'z'), // Ζ
    ('\u{397}', 'h'), // Η
    ('\u{399}', 'i'), // Ι
    ('\u{39a}', 'k'), // Κ
    ('\u{39c}', 'm'), // Μ
    ('\u{39d}', 'n'), // Ν
    ('\u{39f}', 'o'), // Ο
    ('\u{3a1}', 'p'), // Ρ
    ('\u{3a4}', 't'), // Τ
    ('\u{3a5}', 'y'), // Υ
    ('\u{3a7}', 'x'), // Χ
    // Greek, small
    ('\u{3b1}', 'a'), // α
    ('\u{3b5}', 'e'), // ε
    ('\u{3b9}', 'i'), // ι
    ('\u{3ba}', 'k'), // κ
    ('\u{3bd}', 'v'), // ν
    ('\u{3bf}', 'o'), // ο
    ('\u{3c1}', 'p'), // ρ
    ('\u{3c4}', 't'), // τ
    ('\u{3c5}', 'u'), // υ
    ('\u{3c7}', 'x'), // χ
    // Cyrillic, capitals
    ('\u{405}', 's'), // Ѕ
    ('\u{406}', 'i'), // І
    ('\u{408}', 'j'), // Ј
    ('\u{410}', 'a'), // А
    ('\u{412}', 'b'), // В
    ('\u{415}', 'e'), // Е
    ('\u{41a}', 'k'), // К
    ('\u{41c}', 'm'), // М
    ('\u{41d}', 'h'), // Н
    ('\u{41e}', 'o'), // О
    ('\u{420}', 'p'), // Р
    ('\u{421}', 'c'), // С
    ('\u{422}', 't'), // Т
    ('\u{423}', 'y'), // У
    ('\u{425}', 'x'), // Х
    ('\u{4ae}', 'y'), // Ү
    ('\u{4c0}', 'i'), // Ӏ palochka
    // Cyrillic, small
    ('\u{430}', 'a'), // а
    ('\u{435}', 'e'), // е
    ('\u{43e}', 'o'), // о
    ('\u{440}', 'p'), // р
    ('\u{441}', 'c'), // с
    ('\u{443}', 'y'), // у
    ('\u{445}', 'x'), // х
    ('\u{455}', 's'), // ѕ
    ('\u{456}', 'i'), // і
    ('\u{458}', 'j'), // ј
    ('\u{4bb}', 'h'), // һ
    ('\u{4cf}', 'l'), // ӏ
    ('\u{501}', 'd'), // ԁ
    ('\u{51b}', 'q'), // ԛ
    ('\u{51d}', 'w'), // ԝ
    // Dashes that pass for `-`
    ('\u{2010}', '-'), // hyphen
    ('\u{2011}', '-'), // non-breaking hyphen
    ('\u{2012}', '-'), // figure dash
    ('\u{2013}', '-'), // en dash
    ('\u{2212}', '-'), // minus sign
    ('\u{fe63}', '-'), // small hyphen-minus
    ('\u{ff0d}', '-'), // fullwidth hyphen-minus
];

/// `name` as the ASCII it passes for: each letter of [`LOOKALIKES`] and
/// each fullwidth Latin letter (U+FF21–FF3A, U+FF41–FF5A) becomes its ASCII
/// letter, then the ASCII is lowercased; anything else stays.
pub fn fold_lookalikes(name: &str) -> String {
    name.chars()
        .map(|c| {
            let fullwidth = match c {
                '\u{ff21}'..='\u{ff3a}' => char::from_u32(c as u32 - 0xff21 + 'a' as u32),
                '\u{ff41}'..='\u{ff5a}' => char::from_u32(c as u32 - 0xff41 + 'a' as u32),
                _ => None,
            };
            fullwidth
                .or_else(|| LOOKALIKES.iter().find(|(l, _)| *l == c).map(|(_, a)| *a))
                .unwrap_or(c)
                .to_ascii_lowercase()
        })
        .collect()
}

/// A name the broker and the operator speak as, whatever its case.
fn is_reserved_sender(name: &str) -> Option<&'static str> {
    RESERVED_NAMES
        .iter()
        .chain(TIMER_SENDERS.iter())
        .chain(std::iter::once(&PAGE_SENDER))
        .find(|r| name.eq_ignore_ascii_case(r))
        .copied()
}

/// The address of an agent's topology parent in `send` and `ask`.
pub const PARENT: &str = "<parent>";

/// The `from` of a `wake`: plain text, one line, without invisible format
/// characters, and none of the names the broker, the operator and the
/// agent's page speak as — in any case, or spelt with letters that pass for
/// theirs (an agent's scripts must not be able to pass for them; the
/// operator sends with `send`). [`PAGE_SENDER`] exactly, lowercase, is left
/// to the broker, which takes it only from the agent's harness. The error
/// reads after the word `from`.
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
    if let Some(c) = from.chars().find(|c| is_format(*c)) {
        return Err(format!(
            "{} contains the invisible format character U+{:04X}; use plain text",
            excerpt(from),
            c as u32
        ));
    }
    if from == PAGE_SENDER {
        return Ok(());
    }
    let name = from.trim();
    let reserved = is_reserved_sender(name).or_else(|| {
        (!name.is_ascii())
            .then(|| is_reserved_sender(&fold_lookalikes(name)))
            .flatten()
    });
    if let Some(r) = reserved {
        let like = if name.eq_ignore_ascii_case(r) {
            String::new()
        } else {
            format!(" (it reads as {r:?})")
        };
        return Err(format!(
            "{from:?}{like} is reserved for the broker's own messages; choose another name \
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
    /// The agent's own page (`web-ui`, [`PAGE_SENDER`]).
    Page,
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
            Peer::Page => PAGE_SENDER,
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
            PAGE_SENDER => Peer::Page,
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
            ("web-ui", Peer::Page),
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

    /// Names that pass for a reserved one are refused: an invisible format
    /// character inside, letters of Greek or Cyrillic (or small capitals,
    /// fullwidth letters, other dashes) that look like the Latin ones, and
    /// the page's name in another case. Names that only contain such
    /// letters, or are the page's exactly, are left alone here.
    #[test]
    fn look_alike_senders_are_refused_and_say_what_they_read_as() {
        let refused = [
            ("op\u{200b}erator", "U+200B"),
            ("system\u{feff}", "U+FEFF"),
            ("sys\u{ad}tem", "U+00AD"),
            ("web\u{2060}-ui", "U+2060"),
            ("broker\u{e0041}", "U+E0041"),
            ("\u{43e}perator", "reads as \"operator\""),
            ("\u{41e}PERATOR", "reads as \"operator\""),
            (
                "\u{405}\u{423}\u{405}\u{422}\u{415}\u{41c}",
                "reads as \"system\"",
            ),
            (
                "\u{3a1}\u{391}R\u{395}\u{39d}\u{3a4}",
                "reads as \"parent\"",
            ),
            ("s\u{435}lf", "reads as \"self\""),
            ("\u{1d0f}\u{1d18}erator", "reads as \"operator\""),
            ("\u{ff4f}\u{ff50}erator", "reads as \"operator\""),
            ("w\u{435}b-ui", "reads as \"web-ui\""),
            ("web\u{2010}ui", "reads as \"web-ui\""),
            ("RE\u{41c}INDER", "reads as \"reminder\""),
            ("Web-UI", "reserved"),
            ("WEB-UI", "reserved"),
            (" web-ui ", "reserved"),
        ];
        for (name, says) in refused {
            let e = check_sender(name).expect_err(name);
            assert!(e.contains(says), "{name:?}: {e}");
        }
        for ok in [
            "web-ui",
            "\u{43e}\u{43f}\u{435}\u{440}\u{430}\u{442}\u{43e}\u{440}", // оператор
            "Zoë",
            "cron\u{2013}nightly",
            "\u{3b1}\u{3b2}\u{3b3}",
        ] {
            assert!(check_sender(ok).is_ok(), "{ok:?}");
        }
        assert_eq!(
            fold_lookalikes("\u{39d}\u{3bd}"),
            "nv",
            "case matters in Greek"
        );
        assert_eq!(fold_lookalikes("\u{ff21}\u{ff5a}"), "az");
        for (l, a) in LOOKALIKES {
            assert!(
                !l.is_ascii() && (a.is_ascii_lowercase() || *a == '-'),
                "{l:?}"
            );
        }
    }
}
