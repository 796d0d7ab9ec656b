//! The real Claude Code CLI, pointed at the fake Anthropic API, runs `hive mcp`
//! as its `hyperhive` MCP server against a real broker, the way the harness
//! configures it. The fake model calls one hyperhive tool per scenario: `send` to
//! the operator, `recv` of a queued message (confirmed afterwards), `ask` answered
//! with `hive answer`, and `remind`, whose reminder reaches the inbox. Every test
//! skips loudly without the CLI (and fails under `HIVE_REQUIRE_REAL_CLAUDE=1`).

mod common;

use common::claude_cli::{
    claude_env, harness_invocation, real_cli_tests, run_claude, CliRun, RealCli, Sandbox,
};
use common::fake_anthropic::{FakeAnthropic, Scenario, Step};
use common::hive::{ok, run_hive, wait_for, Broker, TempDir};
use hyperhive::groups::ToolGroup;
use hyperhive::mcp::hyperhive::allowed_hyperhive_tools;
use hyperhive::proto::cmd::{Inbox, QuestionsReply, Recv, Send};
use hyperhive::proto::{MessagesReply, Request};
use serde_json::{json, Value};
use std::time::Duration;

const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// One agent `ruth` with a broker, a state dir and a CLI sandbox.
struct Agent {
    broker: Broker,
    state: TempDir,
    sandbox: Sandbox,
}

impl Agent {
    fn new(label: &str) -> Agent {
        Agent {
            broker: Broker::start(&["ruth"]),
            state: TempDir::new(label),
            sandbox: Sandbox::new(label),
        }
    }

    /// One `claude --print` turn whose model follows `steps`, run with the
    /// argv, MCP config and settings the harness itself writes.
    fn turn(&self, cli: &RealCli, steps: Vec<Step>) -> (CliRun, FakeAnthropic) {
        let fake = FakeAnthropic::start(Scenario::of(steps));
        let socket = self.broker.agent_socket("ruth");
        let state = self.state.path().to_str().unwrap();
        let bash_socket = self.state.path().join("bash.sock");
        let harness = harness_invocation(
            self.state.path(),
            &self.state.path().join("run"),
            &[
                ("HIVE_SOCKET", socket.to_str().unwrap()),
                ("HIVE_STATE_DIR", state),
                ("HIVE_BASH_SOCKET", bash_socket.to_str().unwrap()),
            ],
            "claude-sonnet-4-5",
            false,
        );
        let allowed = allowed_hyperhive_tools(&ToolGroup::AGENT_DEFAULT, &[]);
        let args = harness.argv();
        let env = claude_env(&self.sandbox.home, &fake.base_url());
        // The prompt goes on stdin: the flags above are variadic.
        let run = run_claude(cli, &self.sandbox.cwd, &env, &args, "do it\n", RUN_TIMEOUT);
        assert!(!run.timed_out, "the CLI hung\n{run}");
        assert_eq!(run.code, Some(0), "{run}");
        let init = &run.find("system", Some("init"))[0];
        let servers = init["mcp_servers"].as_array().expect("mcp_servers");
        // 2.1.332 adds `"source":"dynamic"` to each entry.
        for name in ["hyperhive", "bash"] {
            assert!(
                servers
                    .iter()
                    .any(|s| s["name"] == name && s["status"] == "connected"),
                "{name} is not connected\n{run}"
            );
        }
        let tools: Vec<&str> = init["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for name in &allowed {
            assert!(
                tools.contains(&name.as_str()),
                "{name} missing from {tools:?}"
            );
        }
        // Every tool is offered to the model in the first request, none of
        // them deferred behind ToolSearch (`"alwaysLoad": true`).
        let offered: Vec<String> = fake.posts()[0].body["tools"]
            .as_array()
            .expect("the first request offers tools")
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_string))
            .collect();
        for name in &allowed {
            assert!(offered.contains(name), "{name} not offered: {offered:?}");
        }
        assert!(!offered.iter().any(|t| t == "ToolSearch"), "{offered:?}");
        (run, fake)
    }

    fn inbox(&self, req: impl Into<Request>, host: bool) -> Vec<hyperhive::proto::Message> {
        let mut c = if host {
            self.broker.host()
        } else {
            self.broker.agent("ruth")
        };
        let r: MessagesReply = serde_json::from_value(Value::Object(ok(&mut c, req))).unwrap();
        r.messages
    }
}

/// The `tool_result` the CLI printed for the tool call, as JSON text.
fn tool_result(run: &CliRun) -> Value {
    run.find("user", None)
        .into_iter()
        .flat_map(|line| {
            line["message"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .find(|block| block["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool_result in the CLI's output\n{run}"))
}

fn result_text(block: &Value) -> String {
    match &block["content"] {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

fn the_model_sends_to_the_operator(cli: &RealCli) {
    let agent = Agent::new("cli-send");
    let (run, fake) = agent.turn(
        cli,
        vec![
            Step::tool_use(
                "mcp__hyperhive__send",
                json!({"to":"operator","body":"hello from claude"}),
            ),
            Step::text("sent it"),
        ],
    );
    let block = tool_result(&run);
    assert_ne!(block["is_error"], true, "{run}");
    let text = result_text(&block);
    assert!(
        text.starts_with("sent message #") && text.ends_with(" to operator"),
        "{text}"
    );
    assert_eq!(run.result()["result"], "sent it");
    let second = fake.posts()[1].body.to_string();
    assert!(
        second.contains("sent message #"),
        "the model got the result: {second}"
    );
    let inbox = agent.inbox(
        Inbox {
            wait_seconds: Some(0),
            peek: false,
            after: None,
        },
        true,
    );
    assert_eq!(inbox.len(), 1, "{inbox:?}");
    assert_eq!(
        (inbox[0].from.as_str(), inbox[0].body.as_str()),
        ("ruth", "hello from claude")
    );
}

fn the_model_receives_a_queued_message_which_is_then_confirmed(cli: &RealCli) {
    let agent = Agent::new("cli-recv");
    let id = ok(
        &mut agent.broker.host(),
        Send {
            to: "ruth".into(),
            body: "queued for claude".into(),
            in_reply_to: None,
        },
    )["id"]
        .as_i64()
        .unwrap();
    let (run, _fake) = agent.turn(
        cli,
        vec![
            Step::tool_use("mcp__hyperhive__recv", json!({"max": 5})),
            Step::text("read it"),
        ],
    );
    let text = result_text(&tool_result(&run));
    assert_eq!(
        text,
        format!("#{id} from operator (message): queued for claude"),
        "{run}"
    );
    let db = agent.broker.state_dir().join("broker.db");
    wait_for(Duration::from_secs(10), "the row to be acked", || {
        let c =
            rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .ok()?;
        let state: String = c
            .query_row("SELECT state FROM messages WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .ok()?;
        (state == "acked").then_some(())
    });
}

fn the_model_asks_and_the_operator_answers(cli: &RealCli) {
    let agent = Agent::new("cli-ask");
    let (run, _fake) = agent.turn(
        cli,
        vec![
            Step::tool_use(
                "mcp__hyperhive__ask",
                json!({"question":"ship it?","options":["yes","no"]}),
            ),
            Step::text("asked"),
        ],
    );
    let text = result_text(&tool_result(&run));
    assert!(text.starts_with("asked question #"), "{text}");
    let host = agent.broker.host_socket();
    let host = host.to_str().unwrap();
    let (code, out, err) = run_hive(&["questions", "--socket", host, "--json"], None, &[]);
    assert_eq!(code, 0, "{err}");
    let questions: QuestionsReply = serde_json::from_str(&out).unwrap();
    assert_eq!(questions.questions.len(), 1, "{out}");
    let q = &questions.questions[0];
    assert_eq!(
        (q.asker.as_str(), q.question.as_str()),
        ("ruth", "ship it?")
    );
    assert_eq!(q.options, ["yes", "no"]);

    let (code, _, err) = run_hive(
        &["answer", "--socket", host, &q.id.to_string(), "yes"],
        None,
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let got = agent.inbox(
        Recv {
            wait_seconds: Some(10),
            max: Some(1),
        },
        false,
    );
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].kind, "question_answered");
    assert!(got[0].body.contains("operator answered: yes"), "{got:?}");
}

fn the_model_sets_a_reminder_that_reaches_the_inbox(cli: &RealCli) {
    let agent = Agent::new("cli-remind");
    let (run, _fake) = agent.turn(
        cli,
        vec![
            Step::tool_use(
                "mcp__hyperhive__remind",
                json!({"message":"look at the oven","delay_seconds":1}),
            ),
            Step::text("reminder set"),
        ],
    );
    let text = result_text(&tool_result(&run));
    assert!(text.starts_with("reminder #"), "{text}");
    let got = agent.inbox(
        Recv {
            wait_seconds: Some(10),
            max: Some(1),
        },
        false,
    );
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].from.as_str(), got[0].kind.as_str()),
        ("reminder", "reminder")
    );
    // It came inside the 10 s wait, so the 1 s reminder fired.
    assert!(got[0].body.ends_with("look at the oven"), "{got:?}");
}

real_cli_tests!(
    the_model_sends_to_the_operator,
    the_model_receives_a_queued_message_which_is_then_confirmed,
    the_model_asks_and_the_operator_answers,
    the_model_sets_a_reminder_that_reaches_the_inbox,
);
