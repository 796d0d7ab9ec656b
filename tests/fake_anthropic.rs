//! The fake Anthropic API on its own, driven over HTTP with ureq: the shape of
//! its streams and errors, how a scenario is consumed and what is recorded.
//! These need no Claude Code CLI.

mod common;

use common::fake_anthropic::{ErrorType, FakeAnthropic, RequestKind, Scenario, Step, Usage};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .max_idle_connections(0)
        .build()
}

fn user_turn(text: &str) -> Value {
    json!({
        "model": "claude-sonnet-4-5",
        "stream": true,
        "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]
    })
}

/// Posts `body` to the messages endpoint. Any HTTP answer, error statuses
/// included, is `Ok`; `Err` says the connection failed without one.
fn post(fake: &FakeAnthropic, body: &Value) -> Result<ureq::Response, String> {
    answer(
        agent()
            .post(&format!("{}/v1/messages?beta=true", fake.base_url()))
            .set("x-api-key", "sk-test")
            .send_json(body.clone()),
    )
}

fn answer(outcome: Result<ureq::Response, ureq::Error>) -> Result<ureq::Response, String> {
    match outcome {
        Ok(response) | Err(ureq::Error::Status(_, response)) => Ok(response),
        Err(ureq::Error::Transport(transport)) => Err(transport.to_string()),
    }
}

/// The `data:` payloads of an SSE body, checked against their `event:` names.
fn events(response: ureq::Response) -> Vec<Value> {
    assert_eq!(response.content_type(), "text/event-stream");
    let body = response.into_string().expect("reading the stream");
    body.split("\n\n")
        .filter(|chunk| !chunk.is_empty())
        .map(|chunk| {
            let (event, data) = chunk
                .split_once('\n')
                .unwrap_or_else(|| panic!("an event without data: {chunk:?}"));
            let data: Value = serde_json::from_str(data.trim_start_matches("data: ")).unwrap();
            assert_eq!(event, format!("event: {}", data["type"].as_str().unwrap()));
            data
        })
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .map(|event| event["type"].as_str().unwrap())
        .collect()
}

#[test]
fn warmup_head_is_answered_and_recorded() {
    let fake = FakeAnthropic::start(Scenario::new());
    let response = agent()
        .head(&format!("{}/", fake.base_url()))
        .call()
        .unwrap();
    assert_eq!(response.status(), 200);
    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].kind, RequestKind::Warmup);
    assert_eq!(requests[0].method, "HEAD");
    assert!(requests[0].body.is_null());
}

#[test]
fn text_step_streams_one_text_block() {
    let usage = Usage {
        input_tokens: 1200,
        cache_read_input_tokens: 3000,
        cache_creation_input_tokens: 500,
        output_tokens: 42,
    };
    let fake = FakeAnthropic::start(Scenario::of([Step::text("hi there").with_usage(usage)]));
    let response = post(&fake, &user_turn("hello")).unwrap();
    assert_eq!(response.header("request-id"), Some("req_fake_1"));

    let events = events(response);
    assert_eq!(
        types(&events),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    let message = &events[0]["message"];
    assert_eq!(message["id"], "msg_fake_1");
    assert_eq!(message["model"], "claude-sonnet-4-5");
    assert_eq!(message["usage"]["input_tokens"], 1200);
    assert_eq!(message["usage"]["cache_read_input_tokens"], 3000);
    assert_eq!(message["usage"]["cache_creation_input_tokens"], 500);
    assert_eq!(
        events[3]["delta"],
        json!({"type": "text_delta", "text": "hi there"})
    );
    assert_eq!(events[5]["delta"]["stop_reason"], "end_turn");
    assert_eq!(events[5]["usage"]["output_tokens"], 42);

    let recorded = fake.requests().pop().unwrap();
    assert_eq!(recorded.kind, RequestKind::Messages);
    assert_eq!(recorded.path, "/v1/messages?beta=true");
    assert_eq!(recorded.header("X-Api-Key"), Some("sk-test"));
    assert_eq!(recorded.texts("user"), ["hello"]);
}

#[test]
fn tool_use_step_streams_input_json() {
    let input = json!({"file_path": "/tmp/x", "limit": 3});
    let fake = FakeAnthropic::start(Scenario::of([Step::tool_use("Read", input.clone())]));
    let events = events(post(&fake, &user_turn("read it")).unwrap());

    let block = &events[1]["content_block"];
    assert_eq!(block["type"], "tool_use");
    assert_eq!(block["id"], "toolu_fake_1");
    assert_eq!(block["name"], "Read");
    let delta = &events[2]["delta"];
    assert_eq!(delta["type"], "input_json_delta");
    let partial: Value = serde_json::from_str(delta["partial_json"].as_str().unwrap()).unwrap();
    assert_eq!(partial, input);
    assert_eq!(events[4]["delta"]["stop_reason"], "tool_use");
}

#[test]
fn error_step_uses_the_api_error_shape_and_headers() {
    let step = Step::error(429, ErrorType::RateLimit, "slow down").with_header("retry-after", "3");
    let fake = FakeAnthropic::start(Scenario::of([step]));
    let response = post(&fake, &user_turn("x")).unwrap();
    assert_eq!(response.status(), 429);
    assert_eq!(response.header("retry-after"), Some("3"));
    let body: Value = response.into_json().unwrap();
    assert_eq!(
        body["error"],
        json!({"type": "rate_limit_error", "message": "slow down"})
    );
    assert_eq!(body["type"], "error");
}

#[test]
fn steps_are_consumed_in_order_then_the_default_repeats() {
    let fake = FakeAnthropic::start(
        Scenario::of([Step::text("one"), Step::prompt_too_long()]).otherwise(Step::text("again")),
    );
    let text_of = |response: ureq::Response| events(response)[3]["delta"]["text"].clone();

    assert_eq!(text_of(post(&fake, &user_turn("a")).unwrap()), "one");
    assert_eq!(post(&fake, &user_turn("b")).unwrap().status(), 400);
    assert_eq!(text_of(post(&fake, &user_turn("c")).unwrap()), "again");
    assert_eq!(text_of(post(&fake, &user_turn("d")).unwrap()), "again");

    fake.set_scenario(Scenario::of([Step::text("replaced")]));
    assert_eq!(text_of(post(&fake, &user_turn("e")).unwrap()), "replaced");
}

#[test]
fn auto_compact_answers_summaries_without_consuming_steps() {
    let fake = FakeAnthropic::start(Scenario::of([Step::text("next")]).auto_compact("SUMMARY"));
    let compaction = json!({
        "model": "claude-sonnet-4-5",
        "stream": true,
        "messages": [
            {"role": "user", "content": "remember PINEAPPLE"},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {"role": "user", "content": [
                {"type": "text", "text": "Your task is to create a detailed summary of the conversation so far."}
            ]}
        ]
    });

    let summary = events(post(&fake, &compaction).unwrap());
    let text = summary[3]["delta"]["text"].as_str().unwrap();
    assert!(text.starts_with("<analysis>"), "{text}");
    assert!(text.ends_with("\n<summary>SUMMARY</summary>"), "{text}");
    let next = events(post(&fake, &user_turn("go on")).unwrap());
    assert_eq!(next[3]["delta"]["text"], "next");

    let kinds: Vec<RequestKind> = fake.posts().iter().map(|request| request.kind).collect();
    assert_eq!(kinds, [RequestKind::Compact, RequestKind::Messages]);
    assert!(fake.posts()[0].mentions("PINEAPPLE"));
}

#[test]
fn close_step_drops_the_connection() {
    let fake = FakeAnthropic::start(Scenario::of([Step::close()]));
    let outcome = post(&fake, &user_turn("x"));
    assert!(
        outcome.is_err(),
        "expected a dropped connection, got {outcome:?}"
    );
    assert_eq!(fake.posts().len(), 1);
}

#[test]
fn hang_step_answers_nothing_and_drop_still_returns() {
    let fake = FakeAnthropic::start(Scenario::of([Step::hang()]));
    let client = ureq::AgentBuilder::new()
        .timeout(Duration::from_millis(300))
        .build();
    let outcome = client
        .post(&format!("{}/v1/messages", fake.base_url()))
        .send_json(user_turn("x"));
    assert!(
        matches!(outcome, Err(ureq::Error::Transport(_))),
        "{outcome:?}"
    );

    let started = Instant::now();
    drop(fake);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "dropping the fake hung"
    );
}

#[test]
fn unknown_paths_get_404() {
    let fake = FakeAnthropic::start(Scenario::new());
    let outcome = answer(
        agent()
            .post(&format!("{}/v1/messages/count_tokens", fake.base_url()))
            .send_json(user_turn("x")),
    );
    assert_eq!(outcome.unwrap().status(), 404);
    assert_eq!(fake.requests()[0].kind, RequestKind::Other);
}

#[test]
fn a_request_without_streaming_gets_one_json_message() {
    let fake = FakeAnthropic::start(Scenario::of([
        Step::text("whole"),
        Step::tool_use("Read", json!({"file_path": "/x"})),
    ]));
    let mut body = user_turn("x");
    body["stream"] = json!(false);
    let r = post(&fake, &body).unwrap();
    assert_eq!(r.content_type(), "application/json");
    let v: Value = r.into_json().unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "whole");
    assert_eq!(v["stop_reason"], "end_turn");
    let v: Value = post(&fake, &body).unwrap().into_json().unwrap();
    assert_eq!(v["content"][0]["type"], "tool_use");
    assert_eq!(v["content"][0]["input"], json!({"file_path": "/x"}));
}

#[test]
fn a_stall_sends_the_start_of_a_stream_then_nothing_until_dropped() {
    use std::io::Read;
    let fake = FakeAnthropic::start(Scenario::of([Step::stall("half a")]));
    let url = format!("{}/v1/messages?beta=true", fake.base_url());
    let reader = std::thread::spawn(move || {
        let r = ureq::AgentBuilder::new()
            .timeout_read(Duration::from_millis(1500))
            .build()
            .post(&url)
            .send_json(user_turn("x"))
            .unwrap();
        assert_eq!(r.content_type(), "text/event-stream");
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let mut body = r.into_reader();
        // Read until the read times out: what arrived is all there is.
        while let Ok(n) = body.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        String::from_utf8(got).unwrap()
    });
    let got = reader.join().unwrap();
    assert!(got.contains("event: message_start"), "{got}");
    assert!(got.contains(r#""text":"half a""#), "{got}");
    assert!(!got.contains("message_stop"), "{got}");
    // Dropping the fake releases the held connection and joins its thread.
    drop(fake);
}
