//! One struct per wire command, grouped by the concern the broker's hub
//! splits along: delivery and consumption (`inbox.rs`), questions, timers
//! (reminders and scheduled prompts), what the broker keeps per agent
//! (`agents.rs`), lifecycle, approvals and diagnostics, dead letters
//! (`failed.rs`), what a harness reports about its pause (`state.rs`), the
//! operator's lifting of a pause (`resume.rs`), what became of a message
//! (`receipt.rs`), the message rows per recipient and state for the
//! dashboard's metrics (`counts.rs`), the agents' turn history
//! (`history.rs`), the hive's recent activity (`activity.rs`), the page's model override
//! (`model.rs`), notifications (`notify.rs`), traces (`trace.rs`: the
//! `traceparent` and the spans a harness hands `hive up`) and the Matrix
//! bridge's (`bridge.rs`). Each carries its
//! [`Command`](super::command::Command) impl: its answer type and the rules on
//! its own fields. Who may send it is its row in `command.rs`.

mod activity;
mod agents;
mod approvals;
mod bridge;
mod budget;
mod counts;
mod diagnostics;
mod failed;
mod history;
mod inbox;
mod lifecycle;
mod model;
mod notify;
mod questions;
mod receipt;
mod resume;
mod state;
mod timers;
mod trace;

pub use activity::*;
pub use agents::*;
pub use approvals::*;
pub use bridge::*;
pub use budget::*;
pub use counts::*;
pub use diagnostics::*;
pub use failed::*;
pub use history::*;
pub use inbox::*;
pub use lifecycle::*;
pub use model::*;
pub use notify::*;
pub use questions::*;
pub use receipt::*;
pub use resume::*;
pub use state::*;
pub use timers::*;
pub use trace::*;

use super::address::Remote;
use super::invalid::Invalid;
use super::limits::{MAX_BODY, MAX_REMOTE_BODY};

/// A message body, question, answer, reminder or scheduled prompt: not blank
/// and at most [`MAX_BODY`] bytes.
pub fn check_text(arg: &'static str, text: &str) -> Result<(), Invalid> {
    if text.trim().is_empty() {
        return Err(Invalid::arg(arg, "must not be empty"));
    }
    if text.len() > MAX_BODY {
        return Err(Invalid::arg(
            arg,
            format!(
                "is {} bytes; the limit is {MAX_BODY} bytes (64 KiB). Send a shorter text, or \
                 write the rest to a file and send its path",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// A text for someone on another hive (`to` reads as `NAME@HIVE`): at most
/// [`MAX_REMOTE_BODY`] bytes, since it travels as one Matrix event.
pub fn check_remote_text(arg: &'static str, text: &str, to: &str) -> Result<(), Invalid> {
    if Remote::parse(to).is_some() && text.len() > MAX_REMOTE_BODY {
        return Err(Invalid::arg(
            arg,
            format!(
                "is {} bytes; to another hive ({to}) the limit is {MAX_REMOTE_BODY} bytes \
                 (48 KiB, one Matrix event). Send a shorter text, or split it",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// One valid example of a command, for the tests of the table.
#[cfg(test)]
pub(crate) trait Sample {
    fn sample() -> Self;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_not_blank_and_fit_the_body_limit() {
        let e = check_text("body", "  \n").unwrap_err();
        assert_eq!(e.to_string(), "body must not be empty");
        let e = check_text("body", &"x".repeat(MAX_BODY + 1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("65537 bytes") && e.contains("65536"), "{e}");
        assert!(check_text("body", &"x".repeat(MAX_BODY)).is_ok());
    }

    #[test]
    fn texts_to_another_hive_fit_one_matrix_event() {
        let long = "x".repeat(MAX_REMOTE_BODY + 1);
        let e = check_remote_text("body", &long, "b@two").unwrap_err();
        assert!(e.to_string().contains("to another hive (b@two)"), "{e}");
        assert!(check_remote_text("body", &long, "b").is_ok());
        assert!(check_remote_text("body", &long[1..], "b@two").is_ok());
    }
}
