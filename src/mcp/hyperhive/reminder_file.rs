//! Long reminders on delivery: the broker keeps a reminder's whole text in
//! `broker.db` and fires it as one message; the agent's side (`hive mcp`'s
//! `recv`, and the harness when the reminder starts a turn), running as the
//! agent's user, writes a text longer than [`REMINDER_FILE_BYTES`] to
//! `<state>/reminders/<id>.md` (dir 0700, file 0600) and shows the model a
//! preview and that path. When there is no state dir or the file cannot be
//! written, the whole text stays in the message: nothing is lost.

use crate::proto::limits::{REMINDER_FILE_BYTES, REMINDER_PREVIEW_CHARS};
use crate::proto::{Message, MsgKind, Peer};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The dir under the agent's state dir that holds delivered long reminders.
pub const DIR: &str = "reminders";

/// `[reminder #ID] TEXT`, as the broker fires it: the id and the text.
fn split(body: &str) -> Option<(i64, &str)> {
    let rest = body.strip_prefix("[reminder #")?;
    let (id, text) = rest.split_once("] ")?;
    Some((id.parse().ok()?, text))
}

/// The body the model reads for `m`: unchanged unless it is a fired reminder
/// whose text is longer than [`REMINDER_FILE_BYTES`] and `state_dir` is known,
/// in which case the text goes to `<state_dir>/reminders/<id>.md` and the
/// body becomes `[reminder #ID] PREVIEW… (the whole text, N bytes, is in PATH)`.
pub fn for_model(state_dir: Option<&Path>, m: &Message) -> String {
    if m.kind != MsgKind::Reminder || m.from != Peer::Reminder {
        return m.body.clone();
    }
    let Some((id, text)) = split(&m.body) else {
        return m.body.clone();
    };
    if text.len() <= REMINDER_FILE_BYTES {
        return m.body.clone();
    }
    let Some(state) = state_dir else {
        return m.body.clone();
    };
    match write(state, id, text) {
        Ok(path) => {
            let preview: String = text.chars().take(REMINDER_PREVIEW_CHARS).collect();
            format!(
                "[reminder #{id}] {preview}… (the whole text, {} bytes, is in {})",
                text.len(),
                path.display()
            )
        }
        Err(e) => {
            log::warn!(
                "reminder #{id}: cannot write its text to {state:?}/{DIR} ({e}); it is shown whole"
            );
            m.body.clone()
        }
    }
}

/// Writes `text` to `<state>/reminders/<id>.md` (atomically, private).
fn write(state: &Path, id: i64, text: &str) -> io::Result<PathBuf> {
    let dir = state.join(DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    // The name is the broker's numeric id, never text from the message.
    let path = dir.join(format!("{id}.md"));
    let tmp = dir.join(format!(".{id}.md.tmp"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(from: Peer, kind: MsgKind, body: &str) -> Message {
        Message {
            id: 9,
            from,
            to: Peer::Agent("ana".into()),
            body: body.into(),
            kind,
            in_reply_to: None,
            sent_at: 1,
            transient: false,
        }
    }

    /// A fresh directory of this test's own (the tests run in parallel).
    fn temp(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("hv-remfile-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_long_reminder_goes_to_a_private_file_and_a_preview() {
        let d = temp("long");
        let text = "é".repeat(3000);
        let m = msg(
            Peer::Reminder,
            MsgKind::Reminder,
            &format!("[reminder #42] {text}"),
        );
        let shown = for_model(Some(&d), &m);
        let path = d.join("reminders/42.md");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        let preview: String = text.chars().take(200).collect();
        assert_eq!(
            shown,
            format!(
                "[reminder #42] {preview}… (the whole text, 6000 bytes, is in {})",
                path.display()
            )
        );
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(&d.join("reminders")), mode(&path)), (0o700, 0o600));
        // Delivered again (a retry): the same file, the same text.
        assert_eq!(for_model(Some(&d), &m), shown);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn short_reminders_other_kinds_and_no_state_dir_stay_whole() {
        let d = temp("short");
        let long = format!("[reminder #1] {}", "x".repeat(5000));
        for m in [
            msg(Peer::Reminder, MsgKind::Reminder, "[reminder #1] short"),
            msg(Peer::Operator, MsgKind::Message, &long),
            msg(Peer::Reminder, MsgKind::Reminder, &"y".repeat(5000)),
        ] {
            assert_eq!(for_model(Some(&d), &m), m.body);
        }
        let m = msg(Peer::Reminder, MsgKind::Reminder, &long);
        assert_eq!(for_model(None, &m), long);
        // A state dir that cannot hold the file: the text stays whole.
        let file = d.join("not-a-dir");
        std::fs::write(&file, "").unwrap();
        assert_eq!(for_model(Some(&file), &m), long);
        assert!(!d.join("reminders").exists());
        let _ = std::fs::remove_dir_all(&d);
    }
}
