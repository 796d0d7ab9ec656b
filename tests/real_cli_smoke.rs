//! Proves the test kit against the real Claude Code CLI: a plain turn, a
//! `--continue` turn that carries history, a rate-limit failure and a manual
//! `/compact` after the context overflowed, a built-in tool call, a dropped
//! connection and a hung request, each against the fake API. Every test
//! skips loudly when the CLI is not installed (and fails under
//! `HIVE_REQUIRE_REAL_CLAUDE=1`).

mod common;

use common::claude_cli::{claude_env, require_real_claude, run_claude, CliRun, Sandbox};
use common::fake_anthropic::{FakeAnthropic, RequestKind, Scenario, Step};
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// Longest any one CLI run may take before it is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

/// Settings the harness passes: no automatic compaction, no memory files.
const SETTINGS: &str = r#"{"autoCompactEnabled":false,"autoMemoryEnabled":false}"#;

/// One CLI process in a sandbox, talking to one fake API.
struct Session<'a> {
    cli: &'a Path,
    sandbox: Sandbox,
    fake: &'a FakeAnthropic,
}

impl<'a> Session<'a> {
    fn new(cli: &'a Path, fake: &'a FakeAnthropic, label: &str) -> Session<'a> {
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
        let settings = self.sandbox.write("settings.json", SETTINGS);
        let settings = settings.to_str().expect("temp paths are UTF-8");
        let mut args = vec![
            "--print",
            "--verbose",
            "--output-format",
            "stream-json",
            "--model",
            "claude-sonnet-4-5",
            "--settings",
            settings,
            "--tools",
            "Read,Edit",
        ];
        if resume {
            args.push("--continue");
        }
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
            &args,
            prompt,
            RUN_TIMEOUT,
        );
        assert!(!run.timed_out, "the CLI hung\n{run}");
        run
    }
}

#[test]
fn text_turn_prints_init_assistant_and_success() {
    let Some(cli) = require_real_claude() else {
        return;
    };
    let fake = FakeAnthropic::start(Scenario::of([Step::text("hello from the fake")]));
    let session = Session::new(&cli, &fake, "text-turn");

    let run = session.turn("say hello\n", false);

    assert_eq!(run.code, Some(0), "{run}");
    let init = run.find("system", Some("init"));
    assert_eq!(init.len(), 1, "{run}");
    assert_eq!(init[0]["claude_code_version"], "2.1.197");
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
    assert_eq!(
        kinds,
        [RequestKind::Warmup, RequestKind::Messages],
        "{requests:#?}"
    );
    let post = &requests[1];
    assert_eq!(post.path, "/v1/messages?beta=true");
    assert_eq!(post.header("x-api-key"), Some("sk-test"));
    assert_eq!(post.body["stream"], true);
    assert!(post.mentions("say hello"), "{:#?}", post.body);
}

#[test]
fn continue_turn_carries_the_first_prompt() {
    let Some(cli) = require_real_claude() else {
        return;
    };
    let fake = FakeAnthropic::start(Scenario::of([
        Step::text("answer-1"),
        Step::text("answer-2"),
    ]));
    let session = Session::new(&cli, &fake, "continue");

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

#[test]
fn rate_limit_without_retries_fails_the_turn() {
    let Some(cli) = require_real_claude() else {
        return;
    };
    let fake = FakeAnthropic::start(Scenario::of([Step::rate_limited()]));
    let session = Session::new(&cli, &fake, "rate-limit");

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

#[test]
fn compact_after_prompt_too_long_writes_a_boundary() {
    let Some(cli) = require_real_claude() else {
        return;
    };
    let fake = FakeAnthropic::start(
        Scenario::of([
            Step::text("answer-1"),
            Step::text("answer-2"),
            Step::prompt_too_long(),
        ])
        .auto_compact("the user asked to remember PINEAPPLE"),
    );
    let session = Session::new(&cli, &fake, "compact");

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

#[test]
fn tool_use_runs_the_tool_and_sends_its_result() {
    let Some(cli) = require_real_claude() else {
        return;
    };
    let fake = FakeAnthropic::start(Scenario::new());
    let session = Session::new(&cli, &fake, "tool-use");
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

#[test]
fn dropped_connection_fails_the_turn() {
    let Some(cli) = require_real_claude() else {
        return;
    };
    let fake = FakeAnthropic::start(Scenario::of([Step::close()]));
    let session = Session::new(&cli, &fake, "close");

    let run = session.turn("hello\n", false);

    assert_eq!(run.code, Some(1), "{run}");
    let result = run.result();
    assert_eq!(result["is_error"], true, "{run}");
    assert_eq!(result["api_error_status"], Value::Null, "{run}");
    let message = result["result"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("API Error: Unable to connect to API"),
        "{run}"
    );
    assert_eq!(fake.posts().len(), 1);
}

#[test]
fn hung_request_times_out_with_api_timeout_ms() {
    let Some(cli) = require_real_claude() else {
        return;
    };
    let fake = FakeAnthropic::start(Scenario::of([Step::hang()]));
    let session = Session::new(&cli, &fake, "hang");

    let run = session.turn_with_env("hello\n", false, &[("API_TIMEOUT_MS", "2000")]);

    assert_eq!(run.code, Some(1), "{run}");
    assert_eq!(run.result()["result"], "Request timed out", "{run}");
    assert_eq!(fake.posts().len(), 1);
}
