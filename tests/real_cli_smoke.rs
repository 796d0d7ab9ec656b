//! Proves the test kit against the real Claude Code CLI: a plain turn, a
//! `--continue` turn that carries history, a rate-limit failure and a manual
//! `/compact` after the context overflowed, a built-in tool call, a dropped
//! connection and a hung request, each against the fake API. Every test
//! skips loudly when the CLI is not installed (and fails under
//! `HIVE_REQUIRE_REAL_CLAUDE=1`).

mod common;

use common::claude_cli::{
    claude_env, harness_invocation, real_cli_tests, run_claude, CliRun, RealCli, Sandbox,
};
use common::fake_anthropic::{FakeAnthropic, RequestKind, Scenario, Step};
use hyperhive::proto::TurnOutcomeKind;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// Longest any one CLI run may take before it is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// One CLI process in a sandbox, talking to one fake API, run with the
/// argv, boot files and variables the harness itself uses.
struct Session<'a> {
    cli: &'a RealCli,
    sandbox: Sandbox,
    fake: &'a FakeAnthropic,
}

impl<'a> Session<'a> {
    fn new(cli: &'a RealCli, fake: &'a FakeAnthropic, label: &str) -> Session<'a> {
        Session {
            cli,
            sandbox: Sandbox::new(label),
            fake,
        }
    }

    /// Runs one turn the way the harness does, the prompt on stdin.
    fn turn(&self, prompt: &str, resume: bool) -> CliRun {
        self.turn_with_env(prompt, resume, &[])
    }

    /// A turn with variables added to the hermetic environment.
    fn turn_with_env(&self, prompt: &str, resume: bool, extra_env: &[(&str, &str)]) -> CliRun {
        let state = self.sandbox.write_dir("state");
        let harness = harness_invocation(
            &state,
            &self.sandbox.write_dir("run"),
            &[],
            "claude-sonnet-4-5",
            resume,
        );
        let mut env = claude_env(&self.sandbox.home, &self.fake.base_url());
        env.extend(
            extra_env
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string())),
        );
        let run = run_claude(
            self.cli,
            &self.sandbox.cwd,
            &env,
            &harness.argv(),
            prompt,
            RUN_TIMEOUT,
        );
        assert!(!run.timed_out, "the CLI hung\n{run}");
        run
    }
}

fn text_turn_prints_init_assistant_and_success(cli: &RealCli) {
    let fake = FakeAnthropic::start(Scenario::of([Step::text("hello from the fake")]));
    let session = Session::new(cli, &fake, "text-turn");

    let run = session.turn("say hello\n", false);

    assert_eq!(run.code, Some(0), "{run}");
    let init = run.find("system", Some("init"));
    assert_eq!(init.len(), 1, "{run}");
    assert_eq!(init[0]["claude_code_version"], cli.version);
    let assistant = run.find("assistant", None);
    assert_eq!(
        assistant[0]["message"]["content"][0]["text"], "hello from the fake",
        "{run}"
    );
    let result = run.result();
    assert_eq!(result["subtype"], "success");
    assert_eq!(result["is_error"], false);
    assert_eq!(result["result"], "hello from the fake");

    let requests = fake.requests();
    let kinds: Vec<RequestKind> = requests.iter().map(|request| request.kind).collect();
    // 2.1.197 warms the connection up with a `HEAD /` first; 2.1.332 does not.
    let want: &[RequestKind] = if cli.at_least("2.1.332") {
        &[RequestKind::Messages]
    } else {
        &[RequestKind::Warmup, RequestKind::Messages]
    };
    assert_eq!(kinds, want, "{requests:#?}");
    let post = requests.last().expect("the message request");
    assert_eq!(post.path, "/v1/messages?beta=true");
    assert_eq!(post.header("x-api-key"), Some("sk-test"));
    assert_eq!(post.body["stream"], true);
    assert!(post.mentions("say hello"), "{:#?}", post.body);
}

fn continue_turn_carries_the_first_prompt(cli: &RealCli) {
    let fake = FakeAnthropic::start(Scenario::of([
        Step::text("answer-1"),
        Step::text("answer-2"),
    ]));
    let session = Session::new(cli, &fake, "continue");

    let first = session.turn("remember the word PINEAPPLE\n", false);
    assert_eq!(first.code, Some(0), "{first}");
    let second = session.turn("which word?\n", true);
    assert_eq!(second.code, Some(0), "{second}");

    assert_eq!(second.result()["result"], "answer-2");
    assert_eq!(
        first.result()["session_id"],
        second.result()["session_id"],
        "--continue resumes the same session"
    );
    let posts = fake.posts();
    assert_eq!(posts.len(), 2, "{posts:#?}");
    assert!(posts[1].mentions("PINEAPPLE"), "{:#?}", posts[1].body);
    assert!(posts[1]
        .texts("assistant")
        .contains(&"answer-1".to_string()));
    assert!(posts[1].mentions("which word?"));
}

fn rate_limit_without_retries_fails_the_turn(cli: &RealCli) {
    let fake = FakeAnthropic::start(Scenario::of([Step::rate_limited()]));
    let session = Session::new(cli, &fake, "rate-limit");

    let run = session.turn("hello\n", false);

    assert_eq!(run.code, Some(1), "{run}");
    let result = run.result();
    assert_eq!(result["is_error"], true, "{run}");
    assert_eq!(result["api_error_status"], 429, "{run}");
    let assistant = run.find("assistant", None);
    assert_eq!(
        assistant.last().map(|line| &line["error"]),
        Some(&"rate_limit".into())
    );
    assert_eq!(
        fake.posts().len(),
        1,
        "CLAUDE_CODE_MAX_RETRIES=0 sends one request"
    );
}

fn compact_after_prompt_too_long_writes_a_boundary(cli: &RealCli) {
    let fake = FakeAnthropic::start(
        Scenario::of([
            Step::text("answer-1"),
            Step::text("answer-2"),
            Step::prompt_too_long(),
        ])
        .auto_compact("the user asked to remember PINEAPPLE"),
    );
    let session = Session::new(cli, &fake, "compact");

    for (prompt, resume) in [("remember PINEAPPLE\n", false), ("and MANGO\n", true)] {
        let run = session.turn(prompt, resume);
        assert_eq!(run.code, Some(0), "{run}");
    }
    let overflow = session.turn("one more\n", true);
    assert_eq!(overflow.code, Some(1), "{overflow}");
    let result = overflow.result();
    assert_eq!(result["api_error_status"], 400, "{overflow}");
    assert_eq!(result["terminal_reason"], "prompt_too_long", "{overflow}");

    let compact = session.turn("/compact\n", true);

    assert_eq!(compact.code, Some(0), "{compact}");
    let boundary = compact.find("system", Some("compact_boundary"));
    assert_eq!(boundary.len(), 1, "{compact}");
    assert_eq!(boundary[0]["compact_metadata"]["trigger"], "manual");
    let kinds: Vec<RequestKind> = fake.posts().iter().map(|request| request.kind).collect();
    assert_eq!(kinds.last(), Some(&RequestKind::Compact), "{kinds:?}");

    let after = session.turn("what do you remember?\n", true);
    assert_eq!(after.code, Some(0), "{after}");
    let last = fake
        .posts()
        .pop()
        .expect("the turn after compaction sent a request");
    assert!(
        last.mentions("the user asked to remember PINEAPPLE"),
        "{:#?}",
        last.body
    );
    assert!(
        !last.mentions("and MANGO"),
        "compaction dropped the old turns"
    );
}

fn tool_use_runs_the_tool_and_sends_its_result(cli: &RealCli) {
    let fake = FakeAnthropic::start(Scenario::new());
    let session = Session::new(cli, &fake, "tool-use");
    let note = session.sandbox.cwd.join("note.txt");
    std::fs::write(&note, "the note says KIWI\n").unwrap();
    fake.set_scenario(Scenario::of([
        Step::tool_use("Read", json!({"file_path": note})),
        Step::text("read it"),
    ]));

    let run = session.turn("read note.txt\n", false);

    assert_eq!(run.code, Some(0), "{run}");
    assert_eq!(run.result()["result"], "read it");
    assert_eq!(run.result()["num_turns"], 2);
    let posts = fake.posts();
    assert_eq!(posts.len(), 2, "{posts:#?}");
    let tool_result = posts[1]
        .messages()
        .iter()
        .rev()
        .flat_map(|message| message["content"].as_array().cloned().unwrap_or_default())
        .find(|block| block["type"] == "tool_result")
        .unwrap_or_else(|| panic!("no tool_result in {:#?}", posts[1].body));
    assert_eq!(tool_result["tool_use_id"], "toolu_fake_1");
    assert!(tool_result.to_string().contains("KIWI"), "{tool_result}");
}

fn dropped_connection_fails_the_turn(cli: &RealCli) {
    let fake = FakeAnthropic::start(Scenario::of([Step::close()]));
    let session = Session::new(cli, &fake, "close");

    let run = session.turn("hello\n", false);

    assert_eq!(run.code, Some(1), "{run}");
    let result = run.result();
    assert_eq!(result["is_error"], true, "{run}");
    assert_eq!(result["api_error_status"], Value::Null, "{run}");
    let message = result["result"].as_str().unwrap_or_default();
    // 2.1.197: "API Error: Unable to connect to API (ECONNRESET)"; 2.1.332:
    // "API Error: Connection dropped (ECONNRESET). Check the gateway …", with
    // `terminal_reason: api_error`.
    assert!(
        message.starts_with("API Error: ") && message.contains("(ECONNRESET)"),
        "{run}"
    );
    if cli.at_least("2.1.332") {
        assert_eq!(result["terminal_reason"], "api_error", "{run}");
    }
    assert_eq!(fake.posts().len(), 1);
    assert!(
        run.classified().outcome.kind == TurnOutcomeKind::ApiUnavailable,
        "{run}"
    );
}

fn hung_request_times_out_with_api_timeout_ms(cli: &RealCli) {
    let fake = FakeAnthropic::start(Scenario::of([Step::hang()]));
    let session = Session::new(cli, &fake, "hang");

    let run = session.turn_with_env("hello\n", false, &[("API_TIMEOUT_MS", "2000")]);

    assert_eq!(run.code, Some(1), "{run}");
    // 2.1.332 goes on: "Request timed out. If the API is slow to answer, …".
    let result = run.result();
    let message = result["result"].as_str().unwrap_or_default();
    assert!(message.starts_with("Request timed out"), "{run}");
    assert_eq!(fake.posts().len(), 1);
    assert!(
        run.classified().outcome.kind == TurnOutcomeKind::ApiUnavailable,
        "{run}"
    );
}

real_cli_tests!(
    text_turn_prints_init_assistant_and_success,
    continue_turn_carries_the_first_prompt,
    rate_limit_without_retries_fails_the_turn,
    compact_after_prompt_too_long_writes_a_boundary,
    tool_use_runs_the_tool_and_sends_its_result,
    dropped_connection_fails_the_turn,
    hung_request_times_out_with_api_timeout_ms,
);

/// `.ci/run` installs exactly the two ends of the window the harness names,
/// so moving the window in `src/agent_proc.rs` without CI (or the reverse)
/// fails here, not silently.
#[test]
fn ci_installs_both_ends_of_the_window() {
    let ci = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/run"))
        .expect(".ci/run");
    let line = ci
        .lines()
        .find(|l| l.starts_with("CLAUDE_CLI_VERSIONS=("))
        .expect("CLAUDE_CLI_VERSIONS in .ci/run");
    let listed: Vec<&str> = line
        .trim_start_matches("CLAUDE_CLI_VERSIONS=(")
        .trim_end_matches(')')
        .split_whitespace()
        .collect();
    assert_eq!(listed, common::claude_cli::CLI_VERSIONS, "{line}");
}
