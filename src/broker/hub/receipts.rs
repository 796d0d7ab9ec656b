//! Receipts (issue 43, item 0): `message_state`, what became of one message,
//! from the broker's rows alone (`db::SentRow`, schema step 16), never
//! guessed. An agent reads the messages it sent — its own sends, charged to
//! it — and any other id, there or not, is "not a message you sent", so the
//! answer never says whether an id exists. The operator reads any message.
//! A row retention deleted leaves its id and sender (`pruned_messages`):
//! its sender reads "pruned".
//!
//! A `send` with `receipt: true` is stored with its flag (one insert); once
//! it is acked (by a turn, through `recv`, or by the operator's inbox ack
//! for mail to the operator) its sender, when an agent of this hive, gets a
//! [`MsgKind::Receipt`] row: the `message_state` line. A receipt wakes
//! nothing — it is not counted unread or waiting, and `recv_next` never
//! hands it out alone — and waits for the agent's next turn, whose message
//! carries every receipt waiting as one `[receipts]` line
//! ([`Hub::ride_along`]), or for its `recv`. The receipts that ride with a
//! turn are held for it and acked with its message: a turn handed out again
//! (its run failed, its harness died) carries them again. An ack, its turn
//! id, the receipts that rode with it and the receipts it sends are one
//! transaction ([`Hub::ack_rows`]). A dead letter's receipt is the
//! dead-letter notice the sender gets anyway, which wakes it.

use super::{db_err, Hub, Identity};
use crate::broker::db::{Ack, SentRow};
use crate::proto::cmd::{MessageState, MessageStateReply, Where};
use crate::proto::text::fmt_time;
use crate::proto::{now, Message, MsgState};

/// Most receipts one turn's message carries (the rest ride with the next).
const RIDE_MAX: u32 = 200;

/// What an agent hears of an id it did not send.
pub const NOT_YOURS: &str = "not a message you sent";

impl Hub<'_> {
    /// `message_state`.
    pub(super) fn message_state(
        &mut self,
        who: &Identity,
        c: MessageState,
    ) -> Result<MessageStateReply, String> {
        let sender = match who {
            Identity::Agent(a) => Some(a.as_str()),
            Identity::Operator => None,
            Identity::Bridge => return Err("the bridge sends no mail".into()),
        };
        let not_yours = || format!("message #{}: {NOT_YOURS}", c.id);
        match self.db.sent_row(c.id).map_err(db_err)? {
            Some(row) => {
                if let Some(a) = sender {
                    if !sent_by(&row, a) {
                        return Err(not_yours());
                    }
                }
                if let MsgState::Other(state) = &row.state {
                    return Err(format!(
                        "message #{} is in state {state:?}, which this broker does not know",
                        c.id
                    ));
                }
                Ok(reply_of(row))
            }
            None => {
                let pruned = self.db.pruned_sender(c.id).map_err(db_err)?;
                match (pruned, sender) {
                    (Some(s), Some(a)) if s == a => Ok(pruned_reply(c.id)),
                    (Some(_), None) => Ok(pruned_reply(c.id)),
                    (_, Some(_)) => Err(not_yours()),
                    (None, None) => Err(format!("there is no message #{}", c.id)),
                }
            }
        }
    }
}

impl Hub<'_> {
    /// Acks the rows `ids` of `agent` that are in `from` (`db::ack`, one
    /// transaction): with the harness's `turn`; with `turn_acked` (an
    /// `ack_turn`) the receipts that rode with the turn; and the receipt of
    /// each acked row whose sender asked for one, when that sender is an
    /// agent of this hive — a row that wakes nothing. The ids acked.
    pub(super) fn ack_rows(
        &self,
        ids: &[i64],
        agent: &str,
        from: &MsgState,
        turn: Option<i64>,
        turn_acked: bool,
    ) -> Result<Vec<i64>, String> {
        let cfg = &self.cfg;
        let receipt = |row: SentRow| {
            let to = row.message.from.as_str().to_string();
            cfg.agent(&to)?;
            Some((to, reply_of(row).text))
        };
        let a = Ack {
            ids,
            recipient: agent,
            from_state: from,
            turn,
            turn_acked,
            now: now(),
        };
        self.db.ack(a, receipt).map_err(db_err)
    }

    /// The receipts for `agent` ride with the message its turn is handed,
    /// as one line after its body: those waiting, and those that rode with
    /// a hand-out not acked (`db::take_receipts`). They are held until the
    /// turn is acked ([`Hub::ack_rows`]).
    pub(super) fn ride_along(&mut self, agent: &str, m: &mut Message) {
        let taken = match self.db.take_receipts(agent, RIDE_MAX, now()) {
            Ok(t) => t,
            Err(e) => {
                log::error!("cannot read the receipts of {agent}: {e}");
                return;
            }
        };
        if taken.is_empty() {
            return;
        }
        let line: Vec<&str> = taken.iter().map(|(_, body)| body.as_str()).collect();
        m.body = format!("{}\n\n[receipts] {}", m.body, line.join(" · "));
    }

    /// `agent`'s turn for a transient wake (no stored row) was acked: so
    /// are the receipts that rode with it.
    pub(super) fn riding_acked(&self, agent: &str) {
        if let Err(e) = self.db.ack_receipts(agent, now()) {
            log::error!("cannot ack the receipts that rode with {agent}'s turn: {e}");
        }
    }
}

/// The row is agent `a`'s own send: its sender, charged to it (or older
/// than charging, or the harness's own notice). A wake a script of another
/// agent sent with `from` set to `a` is charged to that agent, not `a`.
fn sent_by(row: &SentRow, a: &str) -> bool {
    row.message.from.as_str() == a && row.charged.as_deref().is_none_or(|c| c == a)
}

fn pruned_reply(id: i64) -> MessageStateReply {
    MessageStateReply {
        id,
        state: Where::Pruned,
        to: None,
        sent_at: None,
        position: None,
        at: None,
        via: None,
        turn: None,
        attempts: None,
        error: None,
        event_id: None,
        text: format!(
            "message #{id}: pruned (it was handled, and retention.messages_days deleted its row)"
        ),
    }
}

/// The answer for a row that is there.
fn reply_of(row: SentRow) -> MessageStateReply {
    let id = row.message.id;
    let to = row.message.to.as_str().to_string();
    let mut r = MessageStateReply {
        id,
        state: Where::Queued,
        to: Some(to.clone()),
        sent_at: Some(row.message.sent_at),
        position: None,
        at: None,
        via: None,
        turn: None,
        attempts: Some(row.attempts),
        error: None,
        event_id: None,
        text: String::new(),
    };
    let when = |t: Option<i64>| t.map(fmt_time).unwrap_or_else(|| "an unknown time".into());
    let how = |via: &Option<String>| match via.as_deref() {
        Some("turn") => " to a turn",
        Some("recv") => " to recv",
        _ => "",
    };
    if let Some(o) = row.outbox {
        // Mail to another hive: only the local states.
        let (state, what) = match o.state.as_str() {
            "sent" => (
                Where::Posted,
                format!(
                    "posted to the swarm room at {} (event {})",
                    when(o.done_at),
                    o.event_id.as_deref().unwrap_or("?")
                ),
            ),
            "failed" => (
                Where::Bounced,
                format!(
                    "bounced at {}: {}",
                    when(o.done_at),
                    o.error.as_deref().unwrap_or("refused")
                ),
            ),
            _ => (
                Where::HandedToBridge,
                "handed to the bridge, not posted yet".into(),
            ),
        };
        r.state = state;
        r.at = o.done_at;
        r.event_id = o.event_id;
        r.error = o.error;
        r.text = format!("message #{id} to {to}: {what}");
        return r;
    }
    match row.state {
        MsgState::Queued => {
            r.position = row.position;
            let again = if row.handed_at.is_some() {
                format!(
                    " (handed out before, last at {}{}; back in the queue)",
                    when(row.handed_at),
                    how(&row.handed_via)
                )
            } else {
                String::new()
            };
            r.text = format!(
                "message #{id} to {to}: queued, position {} in {to}'s queue{again}",
                row.position.unwrap_or(1)
            );
        }
        MsgState::Inflight | MsgState::Held => {
            r.state = Where::HandedOut;
            r.at = row.handed_at;
            r.via = Some(if row.state == MsgState::Inflight {
                "turn".into()
            } else {
                "recv".into()
            });
            let attempt = if row.state == MsgState::Inflight {
                format!(", attempt {}", row.attempts)
            } else {
                String::new()
            };
            r.text = format!(
                "message #{id} to {to}: handed out at {}{}{attempt}, not acked yet",
                when(row.handed_at),
                how(&r.via)
            );
        }
        MsgState::Acked => {
            r.state = Where::Acked;
            r.at = row.done_at;
            r.via = row.handed_via.clone();
            r.turn = row.turn;
            let by = match (row.handed_via.as_deref(), row.turn) {
                (Some("turn"), Some(t)) => format!(" by {to}'s turn {t}"),
                (Some("turn"), None) => format!(" by a turn of {to}"),
                (Some("recv"), _) => format!(" by {to} through recv"),
                _ => String::new(),
            };
            r.text = format!("message #{id} to {to}: acked at {}{by}", when(row.done_at));
        }
        MsgState::Failed => {
            r.state = Where::DeadLettered;
            r.at = row.done_at;
            r.error = row.last_error.clone();
            r.text = format!(
                "message #{id} to {to}: dead-lettered at {} after {} attempts: {}",
                when(row.done_at),
                row.attempts,
                row.last_error.as_deref().unwrap_or("no error kept")
            );
        }
        // Refused by `message_state` before it gets here.
        MsgState::Other(_) => {}
    }
    r
}
