//! The `messaging` group: `send`, `recv`, `ask` and `answer`. `recv` is the one
//! tool with at-least-once delivery: the rows it hands out are confirmed to the
//! broker, on the connection that received them, only after the result reached
//! stdout; if `hive mcp` dies first the connection closes and the broker puts the
//! rows back in the inbox, in order.

use super::{call_cancellable, decode, Handled, Hyperhive, Spec, BROKER_TIMEOUT};
use crate::mcp::{args, CallCtx, ToolOutcome};
use crate::wire::{self, Request};
use serde_json::{json, Value};
use std::time::Duration;

/// Most rows one `recv` hands out.
pub const RECV_MAX: u64 = 32;

pub(super) const TOOLS: &[Spec] = &[
    Spec {
        name: "send",
        description: "Send a message to another agent, to your parent or to the human operator. \
`to` is an agent name, \"<parent>\" for your parent in the hive (always allowed), or \
\"operator\". Your hive config may restrict which names you can reach; a refused recipient \
comes back as an error naming the ones you may use. `in_reply_to` links the message to the id \
of one you received. Returns the id of the stored message and who got it. The recipient reads \
it in its own inbox; this does not wait for a reply.",
        schema: send_schema,
        run: send,
    },
    Spec {
        name: "recv",
        description: "Read messages from your inbox: messages from agents and the operator, \
answers to your questions, questions for you, fired reminders. Without `wait_seconds` (or with \
0) it returns at once; with a positive value it waits up to that many seconds (at most 180) for \
the first message and returns as soon as one arrives. `max` (default 1, at most 32) is how many \
messages to take. Each message comes back as `#ID from SENDER (KIND): BODY`; KIND is `message` \
for ordinary mail or an event such as `question_asked`, `question_answered` or `reminder`. \
Returns \"no messages\" when the inbox is empty. Messages you read are removed from the inbox.",
        schema: recv_schema,
        run: recv,
    },
    Spec {
        name: "ask",
        description: "Ask the operator (default) or another agent (`to`) a question. It does not \
block: it returns the question id at once, and the answer arrives later in your inbox as a \
`question_answered` message (read it with recv). `options` are suggested answers (the operator \
may still answer freely); `multi: true` allows choosing several. With `ttl_seconds` the \
question expires after that long and you get the answer `[expired]`. Withdraw a question with \
cancel_loose_end(kind=\"question\", id).",
        schema: ask_schema,
        run: ask,
    },
    Spec {
        name: "answer",
        description: "Answer a question another agent asked you: the `question_asked` message in \
your inbox gives its id. Only the agent the question was addressed to may answer it, and only \
once. The asker gets your answer as a `question_answered` message. Returns a confirmation.",
        schema: answer_schema,
        run: answer,
    },
];

fn send_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "to": {"type": "string", "description": "An agent name, \"<parent>\" or \"operator\"."},
            "body": {"type": "string", "description": "The message text."},
            "in_reply_to": {"type": "integer", "description": "Id of the message this answers."}
        },
        "required": ["to", "body"],
        "additionalProperties": false
    })
}

fn send(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["to", "body", "in_reply_to"])?;
    let to = args::req_str(a, "to")?;
    let body = args::req_str(a, "body")?;
    let in_reply_to = args::opt_i64(a, "in_reply_to")?;
    if to.trim().is_empty() {
        return Err(ToolOutcome::InvalidParams(
            "argument \"to\" must not be empty".into(),
        ));
    }
    if body.trim().is_empty() {
        return Err(ToolOutcome::InvalidParams(
            "argument \"body\" must not be empty".into(),
        ));
    }
    let req = Request::Send {
        to,
        body,
        in_reply_to,
    };
    let sent: wire::SentReply = h.request(&req, ctx)?;
    let id = sent.id.map(|i| format!(" #{i}")).unwrap_or_default();
    Ok(ToolOutcome::Ok(format!("sent message{id} to {}", sent.to)))
}

fn recv_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "wait_seconds": {
                "type": "integer", "minimum": 0, "maximum": wire::MAX_WAIT_SECS,
                "description": "How long to wait for the first message; 0 or absent returns at once. Capped at 180."
            },
            "max": {
                "type": "integer", "minimum": 1, "maximum": RECV_MAX,
                "description": "How many messages to take at most (default 1, capped at 32)."
            }
        },
        "additionalProperties": false
    })
}

fn recv(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["wait_seconds", "max"])?;
    let wait = args::opt_u64(a, "wait_seconds")?
        .unwrap_or(0)
        .min(wire::MAX_WAIT_SECS);
    let max = args::opt_u64(a, "max")?.unwrap_or(1).clamp(1, RECV_MAX) as u32;
    let mut client = h.connect()?;
    let limit = Duration::from_secs(wait) + BROKER_TIMEOUT;
    client
        .set_read_timeout(Some(limit))
        .map_err(|e| ToolOutcome::Err(format!("broker connection failed: {e}")))?;
    let req = Request::Recv {
        wait_seconds: Some(wait),
        max: Some(max),
    };
    let reply: wire::MessagesReply = decode(&req, call_cancellable(&mut client, &req, ctx)?)?;
    if reply.messages.is_empty() {
        let text = match wait {
            0 => "no messages".to_string(),
            w => format!("no messages (waited {w} s)"),
        };
        return Ok(ToolOutcome::Ok(text));
    }
    let mut text = render(&reply.messages);
    if reply.more {
        // The broker cut the answer to its size budget.
        text.push_str("\n\n(more messages are waiting: call recv again)");
    }
    let ids: Vec<i64> = reply.messages.iter().map(|m| m.id).collect();
    // The rows stay held for this connection until this hook confirms them, which
    // happens only once the result is on stdout.
    let confirm = move || {
        let _ = client.set_read_timeout(Some(Duration::from_secs(5)));
        match client.call(&Request::RecvAck { ids: ids.clone() }) {
            Ok(_) => log::debug!("recv: confirmed {ids:?}"),
            Err(e) => {
                log::warn!("recv: confirming {ids:?} failed ({e}); they will be delivered again")
            }
        }
    };
    Ok(ToolOutcome::OkThen(text, Box::new(confirm)))
}

/// Messages as the model reads them, one `#ID from SENDER (KIND): BODY` each.
pub fn render(messages: &[wire::Message]) -> String {
    messages
        .iter()
        .map(|m| {
            let reply = m
                .in_reply_to
                .map(|i| format!(", in reply to #{i}"))
                .unwrap_or_default();
            format!("#{} from {} ({}{reply}): {}", m.id, m.from, m.kind, m.body)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn ask_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "question": {"type": "string", "description": "The question."},
            "options": {
                "type": "array", "items": {"type": "string"},
                "description": "Suggested answers to choose from."
            },
            "multi": {"type": "boolean", "description": "Allow choosing several options (default false)."},
            "ttl_seconds": {
                "type": "integer", "minimum": 1,
                "description": "Expire the question after this many seconds; the answer is then [expired]."
            },
            "to": {
                "type": "string",
                "description": "\"operator\" (default), \"<parent>\" or an agent name."
            }
        },
        "required": ["question"],
        "additionalProperties": false
    })
}

fn ask(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["question", "options", "multi", "ttl_seconds", "to"])?;
    let question = args::req_str(a, "question")?;
    let options = args::opt_str_list(a, "options")?.unwrap_or_default();
    let multi = args::opt_bool(a, "multi")?.unwrap_or(false);
    let ttl_seconds = args::opt_u64(a, "ttl_seconds")?;
    let to = args::opt_str(a, "to")?;
    if question.trim().is_empty() {
        return Err(ToolOutcome::InvalidParams(
            "argument \"question\" must not be empty".into(),
        ));
    }
    let target = to.clone().unwrap_or_else(|| "operator".into());
    let req = Request::Ask {
        question,
        options,
        multi,
        ttl_seconds,
        to,
    };
    let asked: wire::IdReply = h.request(&req, ctx)?;
    let expiry = ttl_seconds
        .filter(|s| *s > 0)
        .map(|s| format!(" If nobody answers within {s} s the answer is [expired]."))
        .unwrap_or_default();
    Ok(ToolOutcome::Ok(format!(
        "asked question #{} to {target}. This does not wait: the answer will arrive in your \
         inbox as a question_answered message.{expiry}",
        asked.id
    )))
}

fn answer_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": {"type": "integer", "description": "The question id from the question_asked message."},
            "answer": {"type": "string", "description": "Your answer."}
        },
        "required": ["id", "answer"],
        "additionalProperties": false
    })
}

fn answer(h: &Hyperhive, a: &Value, ctx: &CallCtx) -> Handled {
    args::only(a, &["id", "answer"])?;
    let id = args::req_i64(a, "id")?;
    let answer = args::req_str(a, "answer")?;
    let _: Value = h.request(&Request::Answer { id, answer }, ctx)?;
    Ok(ToolOutcome::Ok(format!(
        "answered question #{id}; the asker gets your answer in its inbox"
    )))
}
