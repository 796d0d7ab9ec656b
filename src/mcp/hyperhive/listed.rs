//! Every tool of `hive mcp` as `tools/list` shows it (`{"description",
//! "inputSchema", "name"}` as JSON text), written out from its definitions by
//! `mcp::hyperhive::tests::the_written_out_listing_is_the_tables`,
//! which fails when this file and the definitions disagree and, run with
//! `HIVE_BLESS=1`, writes it again: not to be edited by hand. `hive mcp`
//! answers `tools/list` from it instead of building the text at every start
//! (issue 19).

/// Each tool's name and its `tools/list` entry, in the definitions' order.
pub const LISTED: &[(&str, &str)] = &[
    (
        "send",
        r#"{"description":"Send a message to another agent, to your parent or to the human operator. `to` is an agent name, \"<parent>\" for your parent in the hive (always allowed), or \"operator\"; an agent on another hive of the swarm is NAME@HIVE (its replies come from NAME@HIVE too, and the body is at most 48 KiB). Your hive config may restrict which names you can reach; a refused recipient comes back as an error naming the ones you may use. `in_reply_to` links the message to the id of one you received. Returns the id of the stored message and who got it. The recipient reads it in its own inbox; this does not wait for a reply.","inputSchema":{"additionalProperties":false,"properties":{"body":{"description":"The message text.","type":"string"},"in_reply_to":{"description":"Id of the message this answers.","type":"integer"},"to":{"description":"An agent name, \"<parent>\", \"operator\", or NAME@HIVE on another hive.","type":"string"}},"required":["to","body"],"type":"object"},"name":"send"}"#,
    ),
    (
        "recv",
        r#"{"description":"Read messages from your inbox: messages from agents and the operator, answers to your questions, questions for you, fired reminders. Without `wait_seconds` (or with 0) it returns at once; with a positive value it waits up to that many seconds for the first message and returns as soon as one arrives. One call waits at most 100 seconds (less when Claude Code limits tool calls more): a longer wait is cut there, and the answer says so; call again to keep waiting. `max` (default 1, at most 32) is how many messages to take. Each message comes back as `#ID from SENDER (KIND): BODY`; KIND is `message` for ordinary mail or an event such as `question_asked`, `question_answered` or `reminder`. Returns \"no messages\" when the inbox is empty. Messages you read are removed from the inbox.","inputSchema":{"additionalProperties":false,"properties":{"max":{"description":"How many messages to take at most (default 1, capped at 32).","maximum":32,"minimum":1,"type":"integer"},"wait_seconds":{"description":"How long to wait for the first message; 0 or absent returns at once. One call waits at most 100 (a longer value waits 100; call again to wait longer).","maximum":180,"minimum":0,"type":"integer"}},"type":"object"},"name":"recv"}"#,
    ),
    (
        "ask",
        r#"{"description":"Ask the operator (default) or another agent (`to`) a question. It does not block: it returns the question id at once, and the answer arrives later in your inbox as a `question_answered` message (read it with recv). `options` are suggested answers (the operator may still answer freely); `multi: true` allows choosing several. With `ttl_seconds` the question expires after that long and you get the answer `[expired]`. Withdraw a question with cancel_loose_end(kind=\"question\", id).","inputSchema":{"additionalProperties":false,"properties":{"multi":{"description":"Allow choosing several options (default false).","type":"boolean"},"options":{"description":"Suggested answers to choose from.","items":{"type":"string"},"type":"array"},"question":{"description":"The question.","type":"string"},"to":{"description":"\"operator\" (default), \"<parent>\", an agent name, or NAME@HIVE on another hive.","type":"string"},"ttl_seconds":{"description":"Expire the question after this many seconds; the answer is then [expired].","minimum":1,"type":"integer"}},"required":["question"],"type":"object"},"name":"ask"}"#,
    ),
    (
        "answer",
        r#"{"description":"Answer a question another agent asked you: the `question_asked` message in your inbox gives its id. Only the agent the question was addressed to may answer it, and only once. The asker gets your answer as a `question_answered` message. Returns a confirmation.","inputSchema":{"additionalProperties":false,"properties":{"answer":{"description":"Your answer.","type":"string"},"id":{"description":"The question id from the question_asked message.","type":"integer"}},"required":["id","answer"],"type":"object"},"name":"answer"}"#,
    ),
    (
        "set_status",
        r#"{"description":"Set your status line: one line of at most 200 characters saying what you are doing, shown to the operator on the dashboard and to agents that call get_agent_meta. It stays until you change it; pass \"\" to clear it. Returns a confirmation.","inputSchema":{"additionalProperties":false,"properties":{"text":{"description":"One line, at most 200 characters; \"\" clears.","maxLength":200,"type":"string"}},"required":["text"],"type":"object"},"name":"set_status"}"#,
    ),
    (
        "get_agent_meta",
        r#"{"description":"Look up an agent's identity and status: name, whether its harness is running, its status line and when it was set, the hive revision it runs, and the hive and swarm names. Omit `name` for yourself. Returns a JSON object {name, hyperhive_rev, running, status_text, status_set_at, hive_name?, swarm_name?}; an unknown name is an error.","inputSchema":{"additionalProperties":false,"properties":{"name":{"description":"The agent to look up; omit for yourself.","type":"string"}},"type":"object"},"name":"get_agent_meta"}"#,
    ),
    (
        "get_loose_ends",
        r#"{"description":"List your open threads, one line each, starting with its kind and id as cancel_loose_end takes them: `question #ID` (questions you asked that are still unanswered, and questions addressed to you that you still owe an answer), `reminder #ID` (your pending reminders), `scheduled #ID` (your scheduled prompts), `approval #ID` (pending approvals: the ones you requested, and for a root agent every one of its tree; a line says when only your root agent or the operator can withdraw it), then your background bash tasks still running. Pass `agent` to look at a direct child agent's loose ends; other agents need the query_agent_state capability. Returns the lines, or says there are none.","inputSchema":{"additionalProperties":false,"properties":{"agent":{"description":"A direct child agent to inspect; omit for your own loose ends.","type":"string"}},"type":"object"},"name":"get_loose_ends"}"#,
    ),
    (
        "cancel_loose_end",
        r#"{"description":"Close one of your loose ends; ids and kinds come from get_loose_ends. kind \"question\": withdraw a question you asked (you get the answer [cancelled by <you>], and an agent it was addressed to is told). kind \"reminder\": delete one of your pending reminders. kind \"scheduled\": delete one of your scheduled prompts (needs the scheduling tool group, as cancel_scheduled does). kind \"approval\": withdraw a pending approval (request_spawn, request_apply_commit) of your tree; only a root agent may, for every approval of its tree, and whoever asked for it is told. An agent that is not a root agent cannot withdraw even its own requests: its root agent or the operator can.","inputSchema":{"additionalProperties":false,"properties":{"id":{"description":"Its id, from get_loose_ends.","type":"integer"},"kind":{"description":"What to cancel.","enum":["question","reminder","approval","scheduled"],"type":"string"}},"required":["kind","id"],"type":"object"},"name":"cancel_loose_end"}"#,
    ),
    (
        "remind",
        r#"{"description":"Schedule a reminder: `message` lands in your own inbox as a `reminder` message after `delay_seconds`, or at `at_unix_timestamp` (give exactly one). The broker fires it even if it restarts in between. A message over 4096 bytes arrives as a preview and the path of a file in your state dir that holds the whole text. At most 50 reminders may be pending; cancel one with cancel_loose_end(kind=\"reminder\", id). Returns the reminder id and when it fires.","inputSchema":{"additionalProperties":false,"properties":{"at_unix_timestamp":{"description":"Fire at this unix time (seconds, UTC).","type":"integer"},"delay_seconds":{"description":"Fire after this many seconds.","minimum":0,"type":"integer"},"message":{"description":"What the reminder should say.","type":"string"}},"required":["message"],"type":"object"},"name":"remind"}"#,
    ),
    (
        "request_next_turn",
        r#"{"description":"Ask for another turn right after this one ends, even if your inbox is empty: the next turn starts with a message from `self` saying `continue`. Use it to keep working on a long task across turns. Takes no arguments; returns a confirmation.","inputSchema":{"additionalProperties":false,"properties":{},"type":"object"},"name":"request_next_turn"}"#,
    ),
    (
        "request_spawn",
        r#"{"description":"Ask the operator to create a new child agent of yours named `name` (1-9 characters of a-z, 0-9 and '-'). This only queues an approval: the operator approves or denies it and you get a system message either way; once approved the agent runs with the default settings and you are its parent. Returns the approval id.","inputSchema":{"additionalProperties":false,"properties":{"name":{"description":"The agent's name.","maxLength":9,"type":"string"}},"required":["name"],"type":"object"},"name":"request_spawn"}"#,
    ),
    (
        "kill",
        r#"{"description":"Stop one of your child agents. Its harness gets SIGTERM (an inflight message goes back to its inbox, and its mail keeps queueing) and it stays stopped, across restarts of the hive too, until you call start (the operator's `hive stop` is the same). Only your own children; no approval needed. Returns a confirmation.","inputSchema":{"additionalProperties":false,"properties":{"name":{"description":"The agent's name.","maxLength":9,"type":"string"}},"required":["name"],"type":"object"},"name":"kill"}"#,
    ),
    (
        "start",
        r#"{"description":"Start one of your child agents that is stopped (or waiting to be restarted after a crash). Only your own children; no approval needed. Returns a confirmation.","inputSchema":{"additionalProperties":false,"properties":{"name":{"description":"The agent's name.","maxLength":9,"type":"string"}},"required":["name"],"type":"object"},"name":"start"}"#,
    ),
    (
        "restart",
        r#"{"description":"Stop and start one of your child agents with the config it runs now, e.g. when it is stuck. Its inflight message is requeued, and it gets the usual \"you were just (re)started\" message. Only your own children. Returns a confirmation.","inputSchema":{"additionalProperties":false,"properties":{"name":{"description":"The agent's name.","maxLength":9,"type":"string"}},"required":["name"],"type":"object"},"name":"restart"}"#,
    ),
    (
        "update",
        r#"{"description":"Restart one of your child agents onto the current hive binary and its current entry in the fleet file — what a needs_update message asks for. Idempotent: while it is in flight the agent shows as rebuilding and a second call changes nothing; you get a rebuilt message when it runs the current versions. Only your own children. Returns a confirmation.","inputSchema":{"additionalProperties":false,"properties":{"name":{"description":"The agent's name.","maxLength":9,"type":"string"}},"required":["name"],"type":"object"},"name":"update"}"#,
    ),
    (
        "request_apply_commit",
        r#"{"description":"Propose a change to the fleet-file entry of yourself or one of your children, applied only after the operator approves. `commit_ref` is a JSON merge patch of the entry (RFC 7396: members replace, null removes), inline as a JSON object string such as {\"model\":\"sonnet\",\"tool_groups\":[\"messaging\",\"meta\"]}, or the path of a file holding one. The patch is validated now; once approved its keys are written to the fleet file (the operator's hand edits of other keys stay; a hand edit of the same key makes the approval fail) and the agent restarts with it. Returns the approval id.","inputSchema":{"additionalProperties":false,"properties":{"agent":{"description":"Yourself or one of your children.","type":"string"},"commit_ref":{"description":"A JSON merge patch of the agent's fleet entry, inline (a JSON object as a string) or the path of a JSON file.","type":"string"}},"required":["agent","commit_ref"],"type":"object"},"name":"request_apply_commit"}"#,
    ),
    (
        "schedule_prompt",
        r#"{"description":"Schedule a prompt into your own inbox: once at `at_unix_timestamp` or after `delay_seconds`, and/or repeatedly every `every_seconds` (at least 60; with no start it first fires one period from now). Stored by the broker, so it survives restarts; it shows in get_loose_ends and list_scheduled. Returns the id and the first delivery time.","inputSchema":{"additionalProperties":false,"properties":{"at_unix_timestamp":{"description":"First delivery at this unix time (seconds, UTC).","type":"integer"},"body":{"description":"The prompt you will receive.","type":"string"},"delay_seconds":{"description":"First delivery after this many seconds.","minimum":0,"type":"integer"},"every_seconds":{"description":"Repeat with this period (at least 60).","minimum":60,"type":"integer"}},"required":["body"],"type":"object"},"name":"schedule_prompt"}"#,
    ),
    (
        "list_scheduled",
        r#"{"description":"List your scheduled prompts: id, body, next delivery (unix seconds) and the repeat period. Returns a JSON object {scheduled:[...]}.","inputSchema":{"additionalProperties":false,"properties":{},"type":"object"},"name":"list_scheduled"}"#,
    ),
    (
        "cancel_scheduled",
        r#"{"description":"Delete one of your scheduled prompts by id (from schedule_prompt or list_scheduled). Returns a confirmation; an unknown id is an error.","inputSchema":{"additionalProperties":false,"properties":{"id":{"description":"The scheduled prompt's id.","type":"integer"}},"required":["id"],"type":"object"},"name":"cancel_scheduled"}"#,
    ),
    (
        "get_logs",
        r#"{"description":"Read the tail of an agent's harness log as the supervisor keeps it (stdout and stderr of its hive serve, rotated). Omit `agent` for yourself; your own children are allowed, any agent with the query_agent_state capability. `lines` defaults to 100 (max 2000). Returns the log text.","inputSchema":{"additionalProperties":false,"properties":{"agent":{"description":"Whose log; omit for yourself.","type":"string"},"lines":{"description":"How many lines from the end (default 100).","maximum":2000,"minimum":1,"type":"integer"}},"type":"object"},"name":"get_logs"}"#,
    ),
    (
        "get_host_journal",
        r#"{"description":"Read the tail of the host's systemd journal (journalctl), optionally of one `unit`. Granted by the read_host_journal capability alone (no tool group); on a host without journalctl it is an error saying so. `lines` defaults to 100 (max 2000). Returns the journal text.","inputSchema":{"additionalProperties":false,"properties":{"lines":{"description":"How many lines from the end (default 100).","maximum":2000,"minimum":1,"type":"integer"},"unit":{"description":"A systemd unit, e.g. nginx.service; omit for the whole journal.","type":"string"}},"type":"object"},"name":"get_host_journal"}"#,
    ),
];
