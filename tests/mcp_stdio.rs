//! `hive mcp` over its real stdio against a real broker: every tool, the errors a
//! model or a client can cause, at-least-once `recv` (a result that never
//! reached stdout leaves its rows in the inbox), and the ways a parked call ends:
//! SIGINT, `notifications/cancelled`, stdin EOF. Every wait has a timeout.

mod common;

use common::hive::{ok, run_hive, wait_for, Broker, TempDir};
use common::mcp::{McpProc, ANSWER_WAIT};
use hyperhive::mcp::hyperhive::allowed_hyperhive_tools;
use hyperhive::proto::access::ToolGroup;
use hyperhive::proto::cmd::{Inbox, InboxAck, Send};
use hyperhive::proto::MessagesReply;
use serde_json::{json, Value};
use std::time::Duration;

/// `kid` is a child of `ruth` that may only message the operator (and its parent).
const CONFIG: &str = r#"{"hive_name":"testhive","agents":[
    {"name":"ruth"},
    {"name":"kid","parent":"ruth","allowed_recipients":["operator"]},
    {"name":"bob"}
]}"#;

struct Hive {
    broker: Broker,
    tmp: TempDir,
}

impl Hive {
    fn start() -> Hive {
        Hive {
            broker: Broker::start_config(CONFIG),
            tmp: TempDir::new("mcp"),
        }
    }

    fn state_dir(&self, agent: &str) -> std::path::PathBuf {
        let dir = self.tmp.path().join(agent);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// `hive mcp` for `agent`, initialized.
    fn mcp(&self, agent: &str) -> McpProc {
        self.mcp_with(agent, &[])
    }

    fn mcp_with(&self, agent: &str, extra: &[(&str, &str)]) -> McpProc {
        let socket = self.broker.agent_socket(agent);
        let state = self.state_dir(agent);
        let mut env = vec![
            ("HIVE_SOCKET", socket.to_str().unwrap()),
            ("HIVE_STATE_DIR", state.to_str().unwrap()),
        ];
        env.extend_from_slice(extra);
        let log = self.tmp.path().join(format!("mcp-{agent}.log"));
        let mut p = McpProc::start(&env, &log);
        p.initialize();
        p
    }

    /// The operator sends `body` to `agent`; returns the message id.
    fn operator_sends(&self, agent: &str, body: &str) -> i64 {
        let r = ok(
            &mut self.broker.host(),
            Send {
                to: agent.into(),
                body: body.into(),
                in_reply_to: None,
                receipt: false,
                traceparent: None,
            },
        );
        r["id"].as_i64().unwrap()
    }

    /// The operator's unread messages (marked read).
    fn operator_inbox(&self) -> Vec<hyperhive::proto::Message> {
        let r = ok(
            &mut self.broker.host(),
            Inbox {
                wait_seconds: Some(0),
                peek: false,
                after: None,
            },
        );
        let messages = serde_json::from_value::<MessagesReply>(Value::Object(r))
            .unwrap()
            .messages;
        let ids = messages.iter().map(|m| m.id).collect();
        ok(&mut self.broker.host(), InboxAck { ids });
        messages
    }

    /// The stored state of message `id`: queued, inflight, held or acked.
    fn row_state(&self, id: i64) -> String {
        let db = self.broker.state_dir().join("broker.db");
        let c =
            rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap();
        c.query_row("SELECT state FROM messages WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .unwrap()
    }

    fn wait_row_state(&self, id: i64, want: &str) {
        wait_for(
            Duration::from_secs(10),
            &format!("message {id} {want}"),
            || (self.row_state(id) == want).then_some(()),
        );
    }
}

fn names(list: &Value) -> Vec<String> {
    list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn tools_list_shows_exactly_the_tools_of_the_groups() {
    let hive = Hive::start();
    let cases: &[(&str, &[ToolGroup])] = &[
        ("", &ToolGroup::AGENT_DEFAULT),
        ("meta", &[ToolGroup::Meta]),
        (
            "messaging,web_tools",
            &[ToolGroup::Messaging, ToolGroup::WebTools],
        ),
        (
            "inbox,lifecycle,approvals,scheduling,diagnostics",
            &[
                ToolGroup::Inbox,
                ToolGroup::Lifecycle,
                ToolGroup::Approvals,
                ToolGroup::Scheduling,
                ToolGroup::Diagnostics,
            ],
        ),
        ("execution", &[ToolGroup::Execution]),
    ];
    for (list, groups) in cases {
        let mut p = hive.mcp_with("ruth", &[("HIVE_TOOL_GROUPS", list)]);
        let listed = p.request(1, "tools/list", json!({}));
        let got: Vec<String> = names(&listed)
            .iter()
            .map(|n| format!("mcp__hyperhive__{n}"))
            .collect();
        assert_eq!(
            got,
            allowed_hyperhive_tools(groups, &[]),
            "HIVE_TOOL_GROUPS={list:?}"
        );
        for tool in listed["result"]["tools"].as_array().unwrap() {
            assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
            assert!(tool["description"].as_str().unwrap().len() > 60, "{tool}");
        }
    }
    let mut p = hive.mcp_with("ruth", &[("HIVE_TOOL_GROUPS", "meta")]);
    let r = p.call(2, "send", json!({"to":"operator","body":"x"}));
    assert_eq!(
        r["error"],
        json!({"code":-32602,"message":"unknown tool: send"}),
        "a tool outside the groups is not callable: {r}"
    );
}

/// The threads of process `pid`, from /proc.
fn threads(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Claude's start-up messages are answered by `hive mcp`'s main thread alone:
/// no thread (not even the signal thread) exists until the first `tools/call`,
/// which starts the signal, reader and writer threads; a signal then ends it
/// the usual way (128 + the signal).
#[test]
fn hive_mcp_answers_its_start_up_on_one_thread() {
    let tmp = TempDir::new("mcp-start");
    let log = tmp.path().join("mcp.log");
    let mut p = McpProc::start(&[("HIVE_SOCKET", "/nonexistent/mcp.sock")], &log);
    let init = p.initialize();
    assert_eq!(init["result"]["serverInfo"]["name"], "hyperhive");
    let list = p.request(1, "tools/list", json!({}));
    assert!(!names(&list).is_empty(), "{list}");
    let again = p.request(2, "tools/list", json!({}));
    assert_eq!(names(&again), names(&list));
    assert_eq!(threads(p.pid()), 1, "only the main thread before any call");
    let text = p.tool_error(3, "get_agent_meta", json!({}));
    assert!(
        text.contains("no broker at /nonexistent/mcp.sock"),
        "{text}"
    );
    assert!(
        threads(p.pid()) >= 4,
        "main, signals, reader and writer after the first call"
    );
    p.signal(libc::SIGTERM);
    assert_eq!(p.wait_exit(ANSWER_WAIT), Some(143), "{}", p.log());
}

#[test]
fn an_unknown_tool_group_stops_hive_mcp_with_its_name() {
    let (code, out, err) = run_hive(
        &["mcp"],
        Some(""),
        &[("HIVE_TOOL_GROUPS", "messaging,nope")],
    );
    assert_eq!(code, 1, "{err}");
    assert_eq!(out, "");
    assert!(
        err.contains("HIVE_TOOL_GROUPS: unknown tool group \"nope\""),
        "{err}"
    );
}

#[test]
fn send_reaches_the_operator_and_the_parent_and_refusals_are_tool_errors() {
    let hive = Hive::start();
    let mut ruth = hive.mcp("ruth");
    let text = ruth.ok(1, "send", json!({"to":"operator","body":"hello operator"}));
    assert!(
        text.starts_with("sent message #") && text.ends_with(" to operator"),
        "{text}"
    );
    let inbox = hive.operator_inbox();
    assert_eq!(inbox.len(), 1);
    assert_eq!(
        (inbox[0].from.as_str(), inbox[0].body.as_str()),
        ("ruth", "hello operator")
    );

    let mut kid = hive.mcp("kid");
    let text = kid.ok(
        2,
        "send",
        json!({"to":"<parent>","body":"hi mum","in_reply_to":7}),
    );
    assert!(text.ends_with(" to ruth"), "{text}");
    let got = ruth.ok(3, "recv", json!({}));
    assert!(
        got.contains(" from kid (message, in reply to #7): hi mum"),
        "{got}"
    );

    let refused = kid.tool_error(4, "send", json!({"to":"bob","body":"psst"}));
    assert!(refused.starts_with("refused by the broker: "), "{refused}");
    assert!(
        refused.contains("operator"),
        "names the allowed recipients: {refused}"
    );
    let unknown = ruth.tool_error(5, "send", json!({"to":"zed","body":"x"}));
    assert!(unknown.contains("zed"), "{unknown}");
}

#[test]
fn recv_returns_queued_messages_and_confirms_them_after_writing() {
    let hive = Hive::start();
    let mut ruth = hive.mcp("ruth");
    assert_eq!(ruth.ok(1, "recv", json!({})), "no messages");
    assert_eq!(
        ruth.ok(2, "recv", json!({"wait_seconds":1})),
        "no messages (waited 1 s)"
    );

    let a = hive.operator_sends("ruth", "first");
    let b = hive.operator_sends("ruth", "second");
    let c = hive.operator_sends("ruth", "third");
    let text = ruth.ok(3, "recv", json!({"max":2}));
    assert_eq!(
        text,
        format!("#{a} from operator (message): first\n#{b} from operator (message): second")
    );
    // The confirmation runs after the line is written and before the next one.
    ruth.request(4, "ping", json!({}));
    assert_eq!(hive.row_state(a), "acked");
    assert_eq!(hive.row_state(b), "acked");
    assert_eq!(hive.row_state(c), "queued");
    let text = ruth.ok(5, "recv", json!({"max":32,"wait_seconds":500}));
    assert_eq!(text, format!("#{c} from operator (message): third"));
}

#[test]
fn recv_waits_for_the_first_message() {
    let hive = Hive::start();
    let mut ruth = hive.mcp("ruth");
    ruth.start_call(1, "recv", json!({"wait_seconds":30}));
    std::thread::sleep(Duration::from_millis(200));
    let id = hive.operator_sends("ruth", "wake up");
    let r = ruth.response(&json!(1));
    assert_eq!(
        common::mcp::text_of(&r["result"]),
        format!("#{id} from operator (message): wake up")
    );
}

/// The result line of a `recv` cannot be written (stdout is full), so its hook
/// never runs; SIGINT then ends `hive mcp` and the broker puts the row back.
#[test]
fn rows_return_to_the_inbox_when_hive_mcp_dies_before_writing_the_result() {
    let hive = Hive::start();
    let mut ruth = hive.mcp("ruth");
    // A first call starts the reader and writer threads (before it, `hive mcp`
    // answers on its main thread, and a full stdout would block that).
    ruth.ok(2, "get_agent_meta", json!({}));
    // About 300 KB of answers nobody reads: the stdout pipe fills and the writer
    // thread blocks.
    let gate = ruth.stdout_gate();
    let paused = gate.lock().unwrap();
    let long_id = "x".repeat(1000);
    for i in 0..300 {
        ruth.send(&json!({"jsonrpc":"2.0","id":format!("{long_id}{i}"),"method":"ping"}));
    }
    let id = hive.operator_sends("ruth", "must not be lost");
    ruth.start_call(1, "recv", json!({}));
    hive.wait_row_state(id, "held");
    ruth.signal(libc::SIGINT);
    assert_eq!(
        ruth.wait_exit(Duration::from_secs(2)),
        Some(130),
        "{}",
        ruth.log()
    );
    hive.wait_row_state(id, "queued");
    drop(paused);

    let mut again = hive.mcp("ruth");
    let text = again.ok(1, "recv", json!({}));
    assert_eq!(
        text,
        format!("#{id} from operator (message): must not be lost")
    );
}

#[test]
fn sigint_ends_a_parked_recv_promptly_and_leaves_the_inbox_alone() {
    let hive = Hive::start();
    let mut ruth = hive.mcp("ruth");
    ruth.start_call(1, "recv", json!({"wait_seconds":120}));
    std::thread::sleep(Duration::from_millis(300));
    ruth.signal(libc::SIGINT);
    // The call was parked for 120 s: ending well inside that is the
    // behaviour; the bound is only how long the test waits for it.
    assert_eq!(
        ruth.wait_exit(Duration::from_secs(30)),
        Some(130),
        "{}",
        ruth.log()
    );
    let id = hive.operator_sends("ruth", "after the signal");
    let mut again = hive.mcp("ruth");
    let text = again.ok(1, "recv", json!({"wait_seconds":10}));
    assert_eq!(
        text,
        format!("#{id} from operator (message): after the signal")
    );
}

#[test]
fn notifications_cancelled_ends_a_parked_recv() {
    let hive = Hive::start();
    let mut ruth = hive.mcp("ruth");
    ruth.start_call(7, "recv", json!({"wait_seconds":120}));
    std::thread::sleep(Duration::from_millis(300));
    ruth.send(&json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"reason":"test"}}));
    wait_for(Duration::from_secs(5), "the parked call to end", || {
        ruth.log()
            .contains("call 7 recv -> Err(\"the call was cancelled\")")
            .then_some(())
    });
    let id = hive.operator_sends("ruth", "for the next call");
    let text = ruth.ok(8, "recv", json!({"wait_seconds":10}));
    assert_eq!(
        text,
        format!("#{id} from operator (message): for the next call")
    );
    // The cancelled call is never answered.
    ruth.request(9, "ping", json!({}));
    assert!(ruth.next_line(Duration::from_millis(200)).is_none());
    hive.wait_row_state(id, "acked");
}

#[test]
fn stdin_eof_mid_call_exits_at_once() {
    let hive = Hive::start();
    let mut ruth = hive.mcp("ruth");
    ruth.start_call(1, "recv", json!({"wait_seconds":120}));
    std::thread::sleep(Duration::from_millis(300));
    ruth.close_stdin();
    assert_eq!(
        ruth.wait_exit(Duration::from_secs(2)),
        Some(0),
        "{}",
        ruth.log()
    );
}

#[test]
fn ask_answer_and_loose_ends() {
    let hive = Hive::start();
    let host = hive.broker.host_socket();
    let host = host.to_str().unwrap();
    let mut ruth = hive.mcp("ruth");
    let mut kid = hive.mcp("kid");

    // A question for the operator, answered with `hive answer`.
    let text = ruth.ok(
        1,
        "ask",
        json!({"question":"deploy now?","options":["yes","no"],"ttl_seconds":600}),
    );
    let qid: i64 = text
        .strip_prefix("asked question #")
        .and_then(|t| t.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        text.contains("to operator") && text.contains("[expired]"),
        "{text}"
    );
    let (code, out, err) = run_hive(&["questions", "--socket", host], None, &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!("#{qid} from ruth")) && out.contains("deploy now?"),
        "{out}"
    );
    assert!(out.contains("yes | no"), "{out}");
    let ends = ruth.ok(2, "get_loose_ends", json!({}));
    assert!(
        ends.contains(&format!(
            "question #{qid} asked to operator: deploy now? [options (choose one): yes | no]"
        )),
        "{ends}"
    );
    let (code, _, err) = run_hive(
        &["answer", "--socket", host, &qid.to_string(), "yes"],
        None,
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let got = ruth.ok(3, "recv", json!({"wait_seconds":10}));
    assert!(
        got.contains("from system (question_answered)") && got.contains("operator answered: yes"),
        "{got}"
    );

    // A question between agents: only the target may answer.
    let text = ruth.ok(4, "ask", json!({"question":"status?","to":"kid"}));
    let kid_q = text
        .strip_prefix("asked question #")
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let asked = kid.ok(1, "recv", json!({"wait_seconds":10}));
    assert!(
        asked.contains("(question_asked)") && asked.contains("status?"),
        "{asked}"
    );
    let owed = kid.ok(2, "get_loose_ends", json!({}));
    assert!(
        owed.contains(&format!("question #{kid_q} owed to ruth: status?")),
        "{owed}"
    );
    let parent_view = ruth.ok(5, "get_loose_ends", json!({"agent":"kid"}));
    assert!(
        parent_view.starts_with("loose ends of kid:"),
        "{parent_view}"
    );
    let not_child = kid.tool_error(3, "get_loose_ends", json!({"agent":"bob"}));
    assert!(not_child.contains("query_agent_state"), "{not_child}");
    let wrong = ruth.tool_error(
        6,
        "answer",
        json!({"id":kid_q.parse::<i64>().unwrap(),"answer":"me"}),
    );
    assert!(wrong.contains("only they may answer"), "{wrong}");
    let done = kid.ok(
        4,
        "answer",
        json!({"id":kid_q.parse::<i64>().unwrap(),"answer":"fine"}),
    );
    assert_eq!(
        done,
        format!("answered question #{kid_q}; the asker gets your answer in its inbox")
    );
    let got = ruth.ok(7, "recv", json!({"wait_seconds":10}));
    assert!(got.contains("kid answered: fine"), "{got}");

    // Withdrawing a question, and the kinds cancel_loose_end refuses.
    let text = ruth.ok(8, "ask", json!({"question":"never mind?"}));
    let q3: i64 = text
        .strip_prefix("asked question #")
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        ruth.ok(9, "cancel_loose_end", json!({"kind":"question","id":q3})),
        format!("withdrew question #{q3}")
    );
    let (_, out, _) = run_hive(&["questions", "--socket", host], None, &[]);
    assert!(!out.contains("never mind?"), "{out}");
    let approval = ruth.tool_error(10, "cancel_loose_end", json!({"kind":"approval","id":1}));
    assert!(approval.contains("approval"), "{approval}");
    let gone = ruth.tool_error(11, "cancel_loose_end", json!({"kind":"question","id":q3}));
    assert!(gone.contains(&format!("no open question #{q3}")), "{gone}");
    assert_eq!(
        ruth.ok(12, "get_loose_ends", json!({})),
        "no loose ends for ruth"
    );
}

#[test]
fn remind_fires_into_the_inbox_and_can_be_cancelled() {
    let hive = Hive::start();
    let mut ruth = hive.mcp("ruth");
    let text = ruth.ok(
        1,
        "remind",
        json!({"message":"check the oven","delay_seconds":1}),
    );
    assert!(
        text.starts_with("reminder #") && text.contains("in about 1 s"),
        "{text}"
    );
    // recv parks up to 10 s; the reminder is due in 1 s, so it is what
    // wakes the call (an empty answer would mean it never fired).
    let got = ruth.ok(2, "recv", json!({"wait_seconds":10}));
    assert!(
        got.contains("from reminder (reminder): [reminder #") && got.ends_with("check the oven"),
        "{got}"
    );

    let later = ruth.ok(
        3,
        "remind",
        json!({"message":"much later","delay_seconds":3600}),
    );
    let rid: i64 = later
        .strip_prefix("reminder #")
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let ends = ruth.ok(4, "get_loose_ends", json!({}));
    assert!(
        ends.contains(&format!("reminder #{rid} fires ")) && ends.ends_with(": much later"),
        "{ends}"
    );
    assert_eq!(
        ruth.ok(5, "cancel_loose_end", json!({"kind":"reminder","id":rid})),
        format!("deleted reminder #{rid}")
    );
    assert_eq!(
        ruth.ok(6, "get_loose_ends", json!({})),
        "no loose ends for ruth"
    );
    let at = ruth.ok(
        7,
        "remind",
        json!({"message":"at a time","at_unix_timestamp":4102444800i64}),
    );
    assert!(at.contains("2100-01-01 00:00:00Z"), "{at}");
}

#[test]
fn status_next_turn_and_agent_meta() {
    let hive = Hive::start();
    let state = hive.state_dir("ruth");
    let mut ruth = hive.mcp("ruth");
    assert_eq!(
        ruth.ok(1, "set_status", json!({"text":"baking bread"})),
        "status set: baking bread"
    );
    assert_eq!(
        std::fs::read_to_string(state.join("hyperhive-status")).unwrap(),
        "baking bread\n"
    );
    let meta: Value = serde_json::from_str(&ruth.ok(2, "get_agent_meta", json!({}))).unwrap();
    assert_eq!(meta["name"], "ruth");
    assert_eq!(meta["status_text"], "baking bread");
    assert_eq!(meta["hive_name"], "testhive");
    assert!(meta["status_set_at"].is_i64(), "{meta}");

    let mut bob = hive.mcp("bob");
    let seen: Value =
        serde_json::from_str(&bob.ok(1, "get_agent_meta", json!({"name":"ruth"}))).unwrap();
    assert_eq!(seen["status_text"], "baking bread");
    let unknown = bob.tool_error(2, "get_agent_meta", json!({"name":"zed"}));
    assert!(unknown.contains("unknown agent \"zed\""), "{unknown}");

    assert_eq!(
        ruth.ok(3, "set_status", json!({"text":""})),
        "status cleared"
    );
    assert!(!state.join("hyperhive-status").exists());
    let meta: Value = serde_json::from_str(&ruth.ok(4, "get_agent_meta", json!({}))).unwrap();
    assert_eq!(meta["status_text"], "");

    assert!(!state.join("hyperhive-continue").exists());
    let text = ruth.ok(5, "request_next_turn", json!({}));
    assert!(text.contains("another turn will start"), "{text}");
    assert!(state.join("hyperhive-continue").exists());
}

#[test]
fn request_next_turn_without_a_state_dir_is_a_tool_error() {
    let hive = Hive::start();
    let socket = hive.broker.agent_socket("ruth");
    let log = hive.tmp.path().join("nostate.log");
    let mut p = McpProc::start(&[("HIVE_SOCKET", socket.to_str().unwrap())], &log);
    p.initialize();
    let text = p.tool_error(1, "request_next_turn", json!({}));
    assert!(text.starts_with("HIVE_STATE_DIR is not set"), "{text}");
}

/// Wrong arguments come back as a result the model reads (`isError`: MCP
/// 2025-11-25's input validation error), naming the argument, quoting the
/// value and saying what is allowed; an unknown tool stays a JSON-RPC -32602
/// error.
#[test]
fn bad_arguments_are_error_results_naming_the_argument() {
    let hive = Hive::start();
    let mut ruth = hive.mcp("ruth");
    let long = "x".repeat(201);
    let cases: &[(&str, Value, &str)] = &[
        (
            "send",
            json!({"body":"x"}),
            "missing required argument \"to\" (a string)",
        ),
        (
            "send",
            json!({"to":"bob"}),
            "missing required argument \"body\" (a string)",
        ),
        (
            "send",
            json!({"to":"bob","body":"  "}),
            "argument \"body\" must not be empty",
        ),
        (
            "send",
            json!({"to":5,"body":"x"}),
            "argument \"to\" must be a string, got 5",
        ),
        (
            "send",
            json!({"to":"bob","body":"x","cc":"al"}),
            "unknown argument \"cc\"; expected one of: to, body, in_reply_to, receipt",
        ),
        (
            "recv",
            json!({"wait_seconds":"5"}),
            "argument \"wait_seconds\" must be a non-negative integer, got \"5\"",
        ),
        (
            "recv",
            json!({"max":-1}),
            "argument \"max\" must be a non-negative integer, got -1",
        ),
        (
            "ask",
            json!({"question":"q","options":"yes"}),
            "argument \"options\" must be an array of strings, got \"yes\"",
        ),
        (
            "ask",
            json!({"question":"q","multi":"yes"}),
            "argument \"multi\" must be a boolean, got \"yes\"",
        ),
        (
            "answer",
            json!({"id":"3","answer":"x"}),
            "argument \"id\" must be an integer, got \"3\"",
        ),
        (
            "answer",
            json!({"id":3}),
            "missing required argument \"answer\" (a string)",
        ),
        (
            "cancel_loose_end",
            json!({"id":3}),
            "missing required argument \"kind\" (a string)",
        ),
        (
            "remind",
            json!({"message":"m"}),
            "give exactly one of the arguments \"delay_seconds\" and \"at_unix_timestamp\"",
        ),
        (
            "remind",
            json!({"message":"m","delay_seconds":1,"at_unix_timestamp":5}),
            "give exactly one of the arguments \"delay_seconds\" and \"at_unix_timestamp\"",
        ),
        (
            "set_status",
            json!({"text":"a\nb"}),
            "argument \"text\" must be one line of at most 200 characters, got 3 characters",
        ),
        (
            "set_status",
            json!({"text":long}),
            "argument \"text\" must be one line of at most 200 characters, got 201 characters",
        ),
        (
            "set_status",
            json!({}),
            "missing required argument \"text\" (a string)",
        ),
        (
            "request_next_turn",
            json!({"now":true}),
            "unknown argument \"now\"; expected one of: ",
        ),
        ("kill", json!({}), "unknown tool: kill"),
    ];
    for (i, (tool, args, want)) in cases.iter().enumerate() {
        let r = ruth.call(i as i64 + 1, tool, args.clone());
        let expected = if *tool == "kill" {
            json!({"jsonrpc":"2.0","id":i + 1,"error":{"code":-32602,"message":want}})
        } else {
            json!({"jsonrpc":"2.0","id":i + 1,"result":{
                "content":[{"type":"text","text":want}],"isError":true}})
        };
        assert_eq!(r, expected, "{tool}({args})");
    }
}

#[test]
fn an_unreachable_broker_is_a_tool_error_that_says_so() {
    let tmp = TempDir::new("nobroker");
    let socket = tmp.path().join("mcp.sock");
    let log = tmp.path().join("mcp.log");
    let mut p = McpProc::start(&[("HIVE_SOCKET", socket.to_str().unwrap())], &log);
    p.initialize();
    for (i, tool) in ["recv", "get_agent_meta", "get_loose_ends"]
        .iter()
        .enumerate()
    {
        let text = p.tool_error(i as i64 + 1, tool, json!({}));
        let want = format!(
            "no broker at {} — is hive broker running?",
            socket.display()
        );
        assert!(text.starts_with(&want), "{tool}: {text}");
    }
}

#[test]
fn malformed_json_rpc_gets_the_exact_error() {
    let tmp = TempDir::new("malformed");
    let mut p = McpProc::start(&[], &tmp.path().join("mcp.log"));
    let cases: &[(&str, &str)] = &[
        (
            "{bad",
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error: key must be a string at line 1 column 2"}}"#,
        ),
        (
            "[1,2]",
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: a message must be a JSON object (batches are not supported)"}}"#,
        ),
        (
            r#"{"jsonrpc":"1.0","id":3,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":3,"error":{"code":-32600,"message":"Invalid Request: \"jsonrpc\" must be \"2.0\""}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"Invalid Request: \"id\" must be a string or an integer"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":4}"#,
            r#"{"jsonrpc":"2.0","id":4,"error":{"code":-32600,"message":"Invalid Request: missing \"method\""}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":5,"method":"resources/list"}"#,
            r#"{"jsonrpc":"2.0","id":5,"error":{"code":-32601,"message":"Method not found: resources/list"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":6,"error":{"code":-32602,"message":"tools/call is missing \"name\""}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"recv","arguments":[1]}}"#,
            r#"{"jsonrpc":"2.0","id":7,"error":{"code":-32602,"message":"tools/call \"arguments\" must be an object"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":8,"method":"tools/call","params":{"name":"run","arguments":{}}}"#,
            r#"{"jsonrpc":"2.0","id":8,"error":{"code":-32602,"message":"unknown tool: run"}}"#,
        ),
        (
            r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":9,"result":{}}"#,
        ),
    ];
    for (line, want) in cases {
        p.send_line(line);
        let got = p
            .next_line(ANSWER_WAIT)
            .unwrap_or_else(|| panic!("no answer to {line}"));
        assert_eq!(&got, want, "{line}");
    }
    // A notification, known or not, is never answered.
    p.send_line(r#"{"jsonrpc":"2.0","method":"notifications/whatever"}"#);
    p.send_line(r#"{"jsonrpc":"2.0","id":10,"method":"ping"}"#);
    assert_eq!(
        p.next_line(ANSWER_WAIT).as_deref(),
        Some(r#"{"jsonrpc":"2.0","id":10,"result":{}}"#)
    );
}

#[test]
fn hive_mcp_help_names_its_environment() {
    let (code, out, _) = run_hive(&["mcp", "--help"], None, &[]);
    assert_eq!(code, 0);
    for var in ["HIVE_SOCKET", "HIVE_STATE_DIR", "HIVE_TOOL_GROUPS"] {
        assert!(out.contains(var), "{out}");
    }
}

/// `hive mcp`'s stderr for an empty stdin, with exactly `vars` of the log
/// and colour settings set (the test's own are taken out) among a few
/// hundred others, as claude's environment may hold.
fn start_log(vars: &[(&str, &str)]) -> String {
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(common::hive::hive_bin());
    cmd.arg("mcp")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    for k in [
        "RUST_LOG",
        "RUST_LOG_STYLE",
        "NO_COLOR",
        "CLICOLOR",
        "CLICOLOR_FORCE",
    ] {
        cmd.env_remove(k);
    }
    for i in 0..300 {
        cmd.env(format!("HIVE_UNUSED_{i}"), "x");
        cmd.env(format!("OTHER_{i}"), "y");
    }
    cmd.env("HIVE_SOCKET", "/nonexistent/env-test.sock")
        .env("HIVE_TOOL_GROUPS", "messaging");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run hive mcp");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stderr).unwrap()
}

/// The logger and the settings are read from one pass over the environment
/// (issue 19), with the same meaning as before: `RUST_LOG` filters (default
/// `info`), `RUST_LOG_STYLE` wins, and on a stderr that is no terminal there
/// is no colour unless `CLICOLOR_FORCE` asks for it and `NO_COLOR` does not
/// forbid it.
#[test]
fn hive_mcp_reads_its_log_settings_as_env_logger_does() {
    let start = "hive mcp: socket /nonexistent/env-test.sock, groups messaging";
    let plain = start_log(&[]);
    assert!(
        plain.contains(start) && !plain.contains('\x1b'),
        "{plain:?}"
    );
    assert_eq!(start_log(&[("RUST_LOG", "warn")]), "");
    assert_eq!(
        start_log(&[("RUST_LOG", "")]),
        "",
        "an empty filter: errors only"
    );
    let debug = start_log(&[("RUST_LOG", "debug")]);
    assert!(debug.contains(start), "{debug:?}");
    for (vars, colour) in [
        (&[("RUST_LOG_STYLE", "always")][..], true),
        (
            &[("RUST_LOG_STYLE", "never"), ("CLICOLOR_FORCE", "1")],
            false,
        ),
        (&[("CLICOLOR_FORCE", "1")], true),
        (&[("CLICOLOR_FORCE", "1"), ("NO_COLOR", "1")], false),
        (&[("CLICOLOR", "1")], false),
        (&[("RUST_LOG_STYLE", "auto")], false),
    ] {
        let log = start_log(vars);
        assert!(log.contains("hive mcp: socket"), "{vars:?}: {log:?}");
        assert_eq!(log.contains('\x1b'), colour, "{vars:?}: {log:?}");
    }
}
