//! The `messaging` group: `send`, `recv`, `ask`, `answer` and
//! `message_state` (what became of a message this agent sent). `recv` is the one
//! tool with at-least-once delivery: the rows it hands out are confirmed to the
//! broker, on the connection that received them, only after the result reached
//! stdout; if `hive mcp` dies first the connection closes and the broker puts the
//! rows back in the inbox, in order.

use super::{broker_error, reminder_file, tool, Handled, HyperhiveTools, Tool, BROKER_TIMEOUT};
use crate::mcp::schema::{Arg, Ty};
use crate::mcp::{CallCtx, ToolOutcome};
use crate::proto::cmd::{self, Answer, Ask, MessageState, Recv, RecvAck};
use crate::proto::limits::{MAX_WAIT_SECS, RECV_MAX};
use crate::proto::{Message, MsgKind};
use std::path::Path;
use std::time::Duration;

pub(super) const TOOLS: &[Tool] = &[
    tool::<cmd::Send>(
        "Send a message to another agent, to your parent or to the human operator. \
`to` is an agent name, \"<parent>\" for your parent in the hive (always allowed), or \
\"operator\"; an agent on another hive of the swarm is NAME@HIVE (its replies come from \
NAME@HIVE too, and the body is at most 48 KiB). Your hive config may restrict which names you \
can reach; a refused recipient \
comes back as an error naming the ones you may use. `in_reply_to` links the message to the id \
of one you received. Returns the id of the stored message and who got it. The recipient reads \
it in its own inbox; this does not wait for a reply.",
        &[
            Arg::req(
                "to",
                Ty::Str,
                "An agent name, \"<parent>\", \"operator\", or NAME@HIVE on another hive.",
            ),
            Arg::req("body", Ty::Str, "The message text."),
            Arg::opt("in_reply_to", Ty::Int, "Id of the message this answers."),
            Arg::opt(
                "receipt",
                Ty::Bool,
                "true: get a receipt once the recipient handled it. Receipts do not start a \
turn: they arrive with your next message (or recv) as one [receipts] line. A message given up \
on (dead-lettered) is told at once.",
            ),
        ],
        |h, a, ctx| h.run(a, ctx, send),
    ),
    tool::<Recv>(
        "Read messages from your inbox: messages from agents and the operator, \
answers to your questions, questions for you, fired reminders. Without `wait_seconds` (or with \
0) it returns at once; with a positive value it waits up to that many seconds for the first \
message and returns as soon as one arrives. One call waits at most 100 seconds (less when \
Claude Code limits tool calls more): a longer wait is cut there, and the answer says so; call \
again to keep waiting. `max` (default 1, at most 32) is how many \
messages to take. Each message comes back as `#ID from SENDER (KIND): BODY`; KIND is `message` \
for ordinary mail or an event such as `question_asked`, `question_answered` or `reminder`. \
Returns \"no messages\" when the inbox is empty. Messages you read are removed from the inbox.",
        &[
            Arg::opt(
                "wait_seconds",
                Ty::Uint {
                    min: 0,
                    max: Some(MAX_WAIT_SECS),
                },
                "How long to wait for the first message; 0 or absent returns at once. One call \
waits at most 100 (a longer value waits 100; call again to wait longer).",
            ),
            Arg::opt(
                "max",
                Ty::Uint {
                    min: 1,
                    max: Some(RECV_MAX as u64),
                },
                "How many messages to take at most (default 1, capped at 32).",
            ),
        ],
        |h, a, ctx| h.run(a, ctx, recv),
    ),
    tool::<Ask>(
        "Ask the operator (default) or another agent (`to`) a question. It does not \
block: it returns the question id at once, and the answer arrives later in your inbox as a \
`question_answered` message (read it with recv). `options` are suggested answers (the operator \
may still answer freely); `multi: true` allows choosing several. With `ttl_seconds` the \
question expires after that long and you get the answer `[expired]`. Withdraw a question with \
cancel_loose_end(kind=\"question\", id).",
        &[
            Arg::req("question", Ty::Str, "The question."),
            Arg::opt("options", Ty::StrList, "Suggested answers to choose from."),
            Arg::opt("multi", Ty::Bool, "Allow choosing several options (default false)."),
            Arg::opt(
                "ttl_seconds",
                Ty::Uint { min: 1, max: None },
                "Expire the question after this many seconds; the answer is then [expired].",
            ),
            Arg::opt(
                "to",
                Ty::Str,
                "\"operator\" (default), \"<parent>\", an agent name, or NAME@HIVE on another hive.",
            ),
        ],
        |h, a, ctx| h.run(a, ctx, ask),
    ),
    tool::<Answer>(
        "Answer a question another agent asked you: the `question_asked` message in \
your inbox gives its id. Only the agent the question was addressed to may answer it, and only \
once. The asker gets your answer as a `question_answered` message. Returns a confirmation.",
        &[
            Arg::req("id", Ty::Int, "The question id from the question_asked message."),
            Arg::req("answer", Ty::Str, "Your answer."),
        ],
        |h, a, ctx| h.run(a, ctx, answer),
    ),
    tool::<MessageState>(
        "Read what became of a message you sent: give the id `send` returned. The answer \
is one line from the broker's records: queued (with its position in the recipient's queue), \
handed out (when, to a turn or to recv), acked (when, and the turn that handled it), \
dead-lettered (the reason), or for NAME@HIVE: handed to the bridge, posted to the swarm room or \
bounced; pruned once retention deleted the record. An id you did not send answers \"not a \
message you sent\".",
        &[Arg::req("id", Ty::Int, "The id `send` returned.")],
        |h, a, ctx| h.run(a, ctx, message_state),
    ),
];

fn message_state(h: &HyperhiveTools, c: MessageState, ctx: &CallCtx) -> Handled {
    let state = h.request(&c, ctx)?;
    Ok(ToolOutcome::Ok(state.text))
}

fn send(h: &HyperhiveTools, mut c: cmd::Send, ctx: &CallCtx) -> Handled {
    let receipt = c.receipt;
    // Issue 43: the message carries the sending claude run's span (its
    // `TRACEPARENT`, which the harness gave claude and claude this server),
    // so the recipient's run links to it; a malformed one is left out.
    c.traceparent = run_traceparent(std::env::var("TRACEPARENT").ok());
    let sent = match h.request(&c, ctx) {
        // A broker older than traces refuses the field: send without it.
        Err(ToolOutcome::Err(e)) if c.traceparent.is_some() && e.contains("traceparent") => {
            c.traceparent = None;
            h.request(&c, ctx)?
        }
        r => r?,
    };
    let id = sent.id.map(|i| format!(" #{i}")).unwrap_or_default();
    let then = if receipt {
        "; a receipt follows once it is handled"
    } else {
        ""
    };
    Ok(ToolOutcome::Ok(format!(
        "sent message{id} to {}{then}",
        sent.to
    )))
}

/// The run's `TRACEPARENT`, when it is a valid W3C traceparent.
fn run_traceparent(env: Option<String>) -> Option<String> {
    env.filter(|t| cmd::TraceParent::parse(t).is_ok())
}

fn recv(h: &HyperhiveTools, c: Recv, ctx: &CallCtx) -> Handled {
    let asked = c.wait_seconds.unwrap_or(0);
    // Below the client's own limits on a call (`recv_cap`): a call it moves
    // to the background or abandons could confirm rows the model never sees.
    let wait = asked.min(h.recv_cap);
    let c = Recv {
        wait_seconds: Some(wait),
        max: Some(c.max.unwrap_or(1).clamp(1, RECV_MAX as u64)),
    };
    let mut client = h.connect(Duration::from_secs(wait) + BROKER_TIMEOUT)?;
    let reply = client
        .call_cancellable(&c, &ctx.cancel)
        .map_err(broker_error)?;
    if reply.messages.is_empty() {
        let text = match wait {
            0 => "no messages".to_string(),
            w if asked > w => format!("no messages (waited {w} s, the longest wait)"),
            w => format!("no messages (waited {w} s)"),
        };
        return Ok(ToolOutcome::Ok(text));
    }
    let mut text = render(&reply.messages, h.state_dir.as_deref());
    if reply.more {
        // The broker cut the answer to its size budget.
        text.push_str("\n\n(more messages are waiting: call recv again)");
    }
    let ids: Vec<i64> = reply.messages.iter().map(|m| m.id).collect();
    // The rows stay held for this connection until this hook confirms them, which
    // happens only once the result is on stdout.
    let confirm = move || {
        let _ = client.set_read_timeout(Some(Duration::from_secs(5)));
        match client.call(&RecvAck { ids: ids.clone() }) {
            Ok(_) => log::debug!("recv: confirmed {ids:?}"),
            Err(e) => {
                log::warn!("recv: confirming {ids:?} failed ({e}); they will be delivered again")
            }
        }
    };
    Ok(ToolOutcome::OkThen(text, Box::new(confirm)))
}

/// Messages as the model reads them, one `#ID from SENDER (KIND): BODY` each;
/// a long reminder's text goes to a file in `state_dir` (`reminder_file`).
///
/// Receipts (issue 43) come as one line, `[receipts] …`, whatever their
/// place among the messages.
pub fn render(messages: &[Message], state_dir: Option<&Path>) -> String {
    let is_receipt = |m: &&Message| m.kind == MsgKind::Receipt;
    let receipts: Vec<&str> = messages
        .iter()
        .filter(is_receipt)
        .map(|m| m.body.as_str())
        .collect();
    let mut lines: Vec<String> = messages
        .iter()
        .filter(|m| !is_receipt(m))
        .map(|m| {
            let reply = m
                .in_reply_to
                .map(|i| format!(", in reply to #{i}"))
                .unwrap_or_default();
            let body = reminder_file::for_model(state_dir, m);
            format!("#{} from {} ({}{reply}): {body}", m.id, m.from, m.kind)
        })
        .collect();
    if !receipts.is_empty() {
        lines.push(format!("[receipts] {}", receipts.join(" · ")));
    }
    lines.join("\n")
}

fn ask(h: &HyperhiveTools, c: Ask, ctx: &CallCtx) -> Handled {
    let target = c.to.clone().unwrap_or_else(|| "operator".into());
    let ttl = c.ttl_seconds;
    let asked = h.request(&c, ctx)?;
    let expiry = ttl
        .filter(|s| *s > 0)
        .map(|s| format!(" If nobody answers within {s} s the answer is [expired]."))
        .unwrap_or_default();
    Ok(ToolOutcome::Ok(format!(
        "asked question #{} to {target}. This does not wait: the answer will arrive in your \
         inbox as a question_answered message.{expiry}",
        asked.id
    )))
}

fn answer(h: &HyperhiveTools, c: Answer, ctx: &CallCtx) -> Handled {
    let id = c.id;
    h.request(&c, ctx)?;
    Ok(ToolOutcome::Ok(format!(
        "answered question #{id}; the asker gets your answer in its inbox"
    )))
}
