//! `message_counts` (issue 43, item 2): the message rows per recipient and
//! state, for the dashboard's `/metrics`, in `message_state`'s words —
//! `inflight` (a turn's) and `held` (`recv`'s, not yet confirmed) are both
//! `handed_out`, `failed` is `dead_lettered`. One grouped read of the
//! store's index on the hub thread, like every other read of `broker.db`.

use super::{db_err, Hub};
use crate::proto::cmd::{MessageCount, MessageCountsReply};
use crate::proto::MsgState;

/// `message_state`'s word for a row's state; None for a state this release
/// does not know (a newer broker's row), which is not counted.
fn counted(state: &MsgState) -> Option<&'static str> {
    match state {
        MsgState::Queued => Some("queued"),
        MsgState::Inflight | MsgState::Held => Some("handed_out"),
        MsgState::Acked => Some("acked"),
        MsgState::Failed => Some("dead_lettered"),
        MsgState::Other(_) => None,
    }
}

impl Hub<'_> {
    /// `message_counts`.
    pub(super) fn message_counts(&mut self) -> Result<MessageCountsReply, String> {
        let mut counts: Vec<MessageCount> = Vec::new();
        for (agent, state, n) in self.db.message_counts().map_err(db_err)? {
            let Some(state) = counted(&state) else {
                continue;
            };
            // Rows come by recipient, then state: `inflight` and `held` of
            // one recipient meet here.
            match counts
                .iter_mut()
                .rev()
                .take(4)
                .find(|c| c.agent == agent && c.state == state)
            {
                Some(c) => c.count += n,
                None => counts.push(MessageCount {
                    agent,
                    state: state.to_string(),
                    count: n,
                }),
            }
        }
        Ok(MessageCountsReply { counts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_are_message_states_words() {
        assert_eq!(counted(&MsgState::Queued), Some("queued"));
        assert_eq!(counted(&MsgState::Inflight), Some("handed_out"));
        assert_eq!(counted(&MsgState::Held), Some("handed_out"));
        assert_eq!(counted(&MsgState::Acked), Some("acked"));
        assert_eq!(counted(&MsgState::Failed), Some("dead_lettered"));
        assert_eq!(counted(&MsgState::Other("new".into())), None);
    }
}
