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
use hyperhive::mcp::hyperhive::allowed_hyperhive_tools;
use hyperhive::proto::access::ToolGroup;
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
        self.turn_with(cli, steps, &[], |_| (), |_| ())
    }

    /// [`Agent::turn`] with variables added to claude's environment, the MCP
    /// config as the harness wrote it passed to `config` to change, and
    /// `during` run on a thread of its own while the CLI runs.
    fn turn_with(
        &self,
        cli: &RealCli,
        steps: Vec<Step>,
        extra_env: &[(&str, &str)],
        config: impl FnOnce(&std::path::Path),
        during: impl FnOnce(&FakeAnthropic) + std::marker::Send,
    ) -> (CliRun, FakeAnthropic) {
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
        config(&harness.settings.mcp_config_path());
        let allowed = allowed_hyperhive_tools(&ToolGroup::AGENT_DEFAULT, &[]);
        let args = harness.argv();
        let mut env = claude_env(&self.sandbox.home, &fake.base_url());
        env.extend(
            extra_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        // The prompt goes on stdin: the flags above are variadic.
        let run = std::thread::scope(|scope| {
            scope.spawn(|| during(&fake));
            run_claude(cli, &self.sandbox.cwd, &env, &args, "do it\n", RUN_TIMEOUT)
        });
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

    /// A turn during which the operator sends ruth "sent meanwhile" once the
    /// API had `posts` requests and `pause` more passed; returns the run and
    /// the message's id, after the broker marked it delivered (which it does
    /// only once `hive mcp` wrote the result that holds it).
    fn send_during(
        &self,
        cli: &RealCli,
        steps: Vec<Step>,
        env: &[(&str, &str)],
        posts: usize,
        pause: Duration,
    ) -> (CliRun, i64) {
        let sent = std::sync::Mutex::new(None);
        let (run, _fake) = self.turn_with(
            cli,
            steps,
            env,
            |_| (),
            |fake| {
                wait_posts(fake, posts);
                std::thread::sleep(pause);
                *sent.lock().unwrap() = Some(send_to_ruth(self, "sent meanwhile"));
            },
        );
        let id = sent.lock().unwrap().expect("sent");
        wait_for(Duration::from_secs(10), "the row to be acked", || {
            (state_of(self, id).as_deref() == Some("acked")).then_some(())
        });
        (run, id)
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

/// Every `tool_result` block the CLI printed, in order.
fn tool_results(run: &CliRun) -> Vec<Value> {
    run.find("user", None)
        .into_iter()
        .flat_map(|line| {
            line["message"]["content"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|block| block["type"] == "tool_result")
        .collect()
}

/// The state of message `id` in the broker's store.
fn state_of(agent: &Agent, id: i64) -> Option<String> {
    let db = agent.broker.state_dir().join("broker.db");
    let c = rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .ok()?;
    c.query_row("SELECT state FROM messages WHERE id = ?1", [id], |r| {
        r.get(0)
    })
    .ok()
}

/// Sends `body` to ruth as the operator; its id.
fn send_to_ruth(agent: &Agent, body: &str) -> i64 {
    ok(
        &mut agent.broker.host(),
        Send {
            to: "ruth".into(),
            body: body.into(),
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        },
    )["id"]
        .as_i64()
        .unwrap()
}

/// Waits until the fake API has had `n` message requests.
fn wait_posts(fake: &FakeAnthropic, n: usize) {
    wait_for(RUN_TIMEOUT, &format!("{n} requests to the API"), || {
        (fake.posts().len() >= n).then_some(())
    });
}

/// The `tool_result` the CLI printed for the tool call, as JSON text.
fn tool_result(run: &CliRun) -> Value {
    tool_results(run)
        .into_iter()
        .next()
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
            receipt: false,
            traceparent: None,
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
    wait_for(Duration::from_secs(10), "the row to be acked", || {
        (state_of(&agent, id).as_deref() == Some("acked")).then_some(())
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

/// A message that arrives while `recv` waits reaches the model in that
/// call's `tool_result` and is confirmed after it.
fn a_message_arriving_while_recv_waits_reaches_the_tool_result(cli: &RealCli) {
    let agent = Agent::new("cli-recv-wait");
    let steps = vec![
        Step::tool_use(
            "mcp__hyperhive__recv",
            json!({"wait_seconds": 60, "max": 1}),
        ),
        Step::text("got it"),
    ];
    // The model has asked for the call; give hive mcp a moment to be inside
    // its wait.
    let (run, id) = agent.send_during(cli, steps, &[], 1, Duration::from_millis(1500));
    let text = result_text(&tool_result(&run));
    assert_eq!(
        text,
        format!("#{id} from operator (message): sent meanwhile"),
        "{run}"
    );
}

/// With the CLI's background threshold forced low (background tasks on, 20 s;
/// the harness itself turns backgrounding off), `recv` waits below it: a wait
/// of 150 s is cut at 15 s and says so, the next call gets the message sent
/// meanwhile, nothing is moved to the background, and every message the
/// broker marks delivered is in a `tool_result` the model got.
fn recv_waits_below_a_background_threshold_and_confirms_only_what_the_model_saw(cli: &RealCli) {
    let agent = Agent::new("cli-recv-cap");
    let wait = || {
        Step::tool_use(
            "mcp__hyperhive__recv",
            json!({"wait_seconds": 150, "max": 1}),
        )
    };
    let env = [
        ("CLAUDE_AUTO_BACKGROUND_TASKS", "1"),
        ("CLAUDE_CODE_MCP_AUTO_BACKGROUND_MS", "20000"),
    ];
    // Sent once the first call came back and the model asks again.
    let steps = vec![wait(), wait(), Step::text("done waiting")];
    let (run, id) = agent.send_during(cli, steps, &env, 2, Duration::ZERO);
    let results = tool_results(&run);
    assert_eq!(results.len(), 2, "{run}");
    assert_eq!(
        result_text(&results[0]),
        "no messages (waited 15 s, the longest wait)",
        "{run}"
    );
    assert_eq!(
        result_text(&results[1]),
        format!("#{id} from operator (message): sent meanwhile"),
        "{run}"
    );
    assert!(
        run.find("system", Some("task_started")).is_empty(),
        "a call went to the background\n{run}"
    );
}

/// CLI 2.1.332 probes a stdio server with `server/discover` before
/// `initialize` (`MCP_PROTOCOL_NEGOTIATION=auto`, also its default): hive's
/// servers refuse it at once with -32601, the CLI goes on to `initialize`,
/// and the tools are there for the first request. The lines between the CLI
/// and `hive mcp` are copied on their way (`tee`).
fn server_discover_is_refused_at_once_and_initialize_follows(cli: &RealCli) {
    let agent = Agent::new("cli-discover");
    let wire = agent.state.path().join("wire");
    std::fs::create_dir_all(&wire).unwrap();
    let (run, _fake) = agent.turn_with(
        cli,
        vec![Step::text("tools were there")],
        &[("MCP_PROTOCOL_NEGOTIATION", "auto")],
        |config| {
            let mut v: Value =
                serde_json::from_str(&std::fs::read_to_string(config).unwrap()).unwrap();
            let server = &mut v["mcpServers"]["hyperhive"];
            let hive = server["command"].as_str().unwrap().to_string();
            server["command"] = json!("/bin/sh");
            server["args"] = json!([
                "-c",
                format!(
                    "tee -a {w}/in | '{hive}' mcp | tee -a {w}/out",
                    w = wire.display()
                )
            ]);
            std::fs::write(config, v.to_string()).unwrap();
        },
        |_| (),
    );
    assert_eq!(run.result()["result"], "tools were there", "{run}");
    let lines = |name: &str| -> Vec<Value> {
        std::fs::read_to_string(wire.join(name))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    };
    let asked = lines("in");
    let answered = lines("out");
    let methods: Vec<&str> = asked.iter().filter_map(|m| m["method"].as_str()).collect();
    let init_at = methods
        .iter()
        .position(|m| *m == "initialize")
        .unwrap_or_else(|| panic!("no initialize: {methods:?}"));
    match methods.iter().position(|m| *m == "server/discover") {
        Some(at) => {
            assert!(at < init_at, "{methods:?}");
            let id = &asked
                .iter()
                .find(|m| m["method"] == "server/discover")
                .unwrap()["id"];
            let answer = answered
                .iter()
                .find(|m| &m["id"] == id)
                .unwrap_or_else(|| panic!("server/discover was not answered: {answered:?}"));
            assert_eq!(answer["error"]["code"], -32601, "{answer}");
        }
        // 2.1.197 speaks `initialize` first and knows no discovery.
        None => assert!(!cli.at_least("2.1.332"), "{methods:?}"),
    }
}

/// A call with a bad argument comes back as a result the model reads
/// (`isError`), naming the argument, quoting the value and what is allowed;
/// the turn goes on.
fn a_bad_argument_is_a_result_the_model_reads(cli: &RealCli) {
    let agent = Agent::new("cli-bad-arg");
    let (run, fake) = agent.turn(
        cli,
        vec![
            Step::tool_use(
                "mcp__hyperhive__remind",
                json!({"message": "x", "delay_seconds": -5}),
            ),
            Step::text("noted the error"),
        ],
    );
    let block = tool_result(&run);
    assert_eq!(block["is_error"], true, "{run}");
    let text = result_text(&block);
    assert!(
        text.contains("\"delay_seconds\"")
            && text.contains("got -5")
            && text.contains("non-negative integer"),
        "{text}"
    );
    // 2.1.197 prefixes a JSON-RPC error with "MCP error -32602"; a result has no code.
    assert!(!text.contains("-32602"), "{text}");
    let next = fake.posts()[1].body.to_string();
    assert!(next.contains("got -5"), "the model read it: {next}");
    assert_eq!(run.result()["result"], "noted the error");
}

real_cli_tests!(
    a_message_arriving_while_recv_waits_reaches_the_tool_result,
    recv_waits_below_a_background_threshold_and_confirms_only_what_the_model_saw,
    server_discover_is_refused_at_once_and_initialize_follows,
    a_bad_argument_is_a_result_the_model_reads,
    the_model_sends_to_the_operator,
    the_model_receives_a_queued_message_which_is_then_confirmed,
    the_model_asks_and_the_operator_answers,
    the_model_sets_a_reminder_that_reaches_the_inbox,
);
