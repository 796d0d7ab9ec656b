//! What a client is told when a command's own fields break one of its rules
//! ([`Invalid`]): one argument, one of two, or the whole. It sits below every
//! command (`cmd/`) and the table that lists them (`command.rs`), which both
//! use it.

use std::fmt;

/// A command's own fields break one of its rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// One argument is wrong; `problem` reads after its name
    /// (`body` + `must not be empty`).
    Arg { arg: &'static str, problem: String },
    /// Exactly one of two arguments must be given.
    OneOf(&'static str, &'static str),
    /// The arguments do not fit together, or the message names them itself.
    Whole(String),
}

impl Invalid {
    pub fn arg(arg: &'static str, problem: impl Into<String>) -> Invalid {
        Invalid::Arg {
            arg,
            problem: problem.into(),
        }
    }

    /// The text for an MCP tool's caller, who knows the fields as arguments:
    /// `argument "body" must not be empty`.
    pub fn for_tool(&self) -> String {
        match self {
            Invalid::Arg { arg, problem } => format!("argument \"{arg}\" {problem}"),
            Invalid::OneOf(a, b) => {
                format!("give exactly one of the arguments \"{a}\" and \"{b}\"")
            }
            Invalid::Whole(text) => text.clone(),
        }
    }
}

/// The text for the wire, the operator commands and the dashboard, which know
/// the fields by name: `body must not be empty`.
impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::Arg { arg, problem } => write!(f, "{arg} {problem}"),
            Invalid::OneOf(a, b) => write!(f, "give exactly one of {a} or {b}"),
            Invalid::Whole(text) => f.write_str(text),
        }
    }
}
