//! Context-window arithmetic and the fixed prompts of the turn loop. This module
//! owns how big a model's window is (env overrides, the CLI's own report, a
//! fallback), the CLI's blocking limit, the proactive-compaction and auto-reset
//! watermarks with their env switches, and the texts the harness itself sends to
//! claude: the wake prompt, the retry note and the two checkpoint prompts. Apart
//! from reading environment variables it does no I/O; every function that reads
//! the environment takes it as an argument so tests can pass their own.

use std::time::Duration;

/// The window when nothing else says: conservative, right for every current model.
pub const DEFAULT_CONTEXT_WINDOW_TOKENS: u64 = 200_000;

/// The CLI's `max_tokens` for a turn when the CLI has not reported one.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u64 = 32_000;

/// Room kept between a watermark and the blocking limit, so the checkpoint turn
/// that runs at the watermark still fits.
pub const CHECKPOINT_HEADROOM_TOKENS: u64 = 10_000;

/// How long the prompt cache is assumed to stay warm when `HIVE_CACHE_TTL_SECS` is
/// unset.
pub const DEFAULT_CACHE_TTL_SECS: u64 = 3600;

/// Test-only: a file holding unix seconds (decimal text) that the cold-cache
/// decision reads as "now" instead of the system clock, so a trace replayed
/// on virtual time (the cost bench, `tests/bench/cost_bench.rs`) decides as
/// it would have at that time. Its only reader is the turn loop's clock for
/// the auto session-reset check; nothing else in hive reads it.
pub const TEST_CLOCK_FILE_ENV: &str = "HIVE_TEST_CLOCK_FILE";

/// The per-model window override prefix; the rest of the name is a model key.
pub const WINDOW_ENV_PREFIX: &str = "HIVE_CONTEXT_WINDOW_TOKENS_";

/// The global window override.
pub const WINDOW_ENV: &str = "HIVE_CONTEXT_WINDOW_TOKENS";

/// The synthetic notes turn run before a proactive `/compact`.
pub const CHECKPOINT_PROMPT: &str = "[system] Checkpoint: context is filling up, flush durable \
state into your state dir now. Right after this turn the session is compacted into a summary \
and conversation detail is lost. Write open tasks, decisions, file paths and who is waiting on \
what into your notes, then end the turn. Do not start new work, and message no one unless it \
is urgent.";

/// The synthetic notes turn run before an automatic session reset.
pub const AUTO_RESET_CHECKPOINT_PROMPT: &str = "[system] Checkpoint: the prompt cache is cold \
and the session will be reset; flush state to files now. Your next turn starts a fresh \
conversation that knows only what is in your state dir. Write open tasks, decisions, file \
paths and who is waiting on what into your notes, then end the turn. Do not start new work, \
and message no one unless it is urgent.";

/// The variables this module reads (every one starts with `HIVE_`), taken once
/// from this process's environment, which does not change while the harness
/// runs: a turn looks them up here instead of scanning the environment again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContextEnv {
    vars: Vec<(String, String)>,
}

impl ContextEnv {
    /// This process's `HIVE_` variables, skipping any that are not UTF-8
    /// (`std::env::vars` would panic on them).
    pub fn process() -> ContextEnv {
        ContextEnv::from_pairs(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// The `HIVE_` variables of `pairs`.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (String, String)>) -> ContextEnv {
        ContextEnv {
            vars: pairs
                .into_iter()
                .filter(|(k, _)| k.starts_with("HIVE_"))
                .collect(),
        }
    }

    /// One variable, the `env` argument of the functions below.
    pub fn get(&self, key: &str) -> Option<String> {
        self.vars
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    /// Every variable, the `env` argument of [`context_window_tokens`].
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }
}

/// The context window of `model`, first match wins:
/// 1. `HIVE_CONTEXT_WINDOW_TOKENS_<KEY>` where `KEY`, lowercased, is a substring of
///    the lowercased model name (or of it with `-` and `.` written as `_`, so
///    `..._SONNET_4_5` matches `claude-sonnet-4-5`); the longest key wins;
/// 2. `HIVE_CONTEXT_WINDOW_TOKENS`;
/// 3. the CLI-reported `contextWindow`;
/// 4. [`DEFAULT_CONTEXT_WINDOW_TOKENS`].
///
/// A value that is not a positive integer is skipped with a warning.
pub fn context_window_tokens<I, K, V>(model: &str, cli_reported: Option<u64>, env: I) -> u64
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let model_lower = model.to_lowercase();
    let model_norm = model_lower.replace(['-', '.'], "_");
    let mut best: Option<(String, u64)> = None;
    let mut global = None;
    for (key, value) in env {
        let (key, value) = (key.as_ref(), value.as_ref());
        if key == WINDOW_ENV {
            global = parse_tokens(key, value);
            continue;
        }
        let Some(model_key) = key.strip_prefix(WINDOW_ENV_PREFIX) else {
            continue;
        };
        let model_key = model_key.to_lowercase();
        if model_key.is_empty()
            || !(model_lower.contains(&model_key) || model_norm.contains(&model_key))
        {
            continue;
        }
        let Some(tokens) = parse_tokens(key, value) else {
            continue;
        };
        // Longest key wins; equal lengths go to the alphabetically first key so the
        // answer does not depend on the environment's order.
        let better = match &best {
            None => true,
            Some((k, _)) => {
                model_key.len() > k.len() || (model_key.len() == k.len() && model_key < *k)
            }
        };
        if better {
            best = Some((model_key, tokens));
        }
    }
    best.map(|(_, t)| t)
        .or(global)
        .or(cli_reported.filter(|&t| t > 0))
        .unwrap_or(DEFAULT_CONTEXT_WINDOW_TOKENS)
}

fn parse_tokens(key: &str, value: &str) -> Option<u64> {
    match value.trim().parse::<u64>() {
        Ok(t) if t > 0 => Some(t),
        _ => {
            log::warn!("ignoring {key}={value:?}: expected a positive number of tokens");
            None
        }
    }
}

/// The context size at or above which the CLI, with auto-compact off, refuses to
/// send a request and answers "Prompt is too long" (`terminal_reason:
/// blocking_limit`): window − min(max output, 20000) − 3000.
pub fn blocking_limit(window: u64, max_output: u64) -> u64 {
    window
        .saturating_sub(max_output.min(20_000))
        .saturating_sub(3_000)
}

/// The context size after a clean turn that triggers a checkpoint turn and
/// `/compact`, or `None` when proactive compaction is off
/// (`HIVE_AUTO_COMPACT=0|false|no|off`, or `HIVE_COMPACT_WATERMARK_TOKENS=0`).
/// Defaults to 75% of the window; clamped below the blocking limit, where a turn
/// could no longer run at all.
pub fn compact_watermark(window: u64, env: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    if let Some(v) = env("HIVE_AUTO_COMPACT") {
        if matches!(
            v.trim().to_lowercase().as_str(),
            "0" | "false" | "no" | "off"
        ) {
            return None;
        }
    }
    watermark(window, 75, "HIVE_COMPACT_WATERMARK_TOKENS", env)
}

/// The context size at or above which a turn after a cold cache first checkpoints
/// and then starts a fresh session, or `None` when
/// `HIVE_AUTO_RESET_WATERMARK_TOKENS=0`. Defaults to 50% of the window; clamped
/// like [`compact_watermark`].
pub fn auto_reset_watermark(window: u64, env: &dyn Fn(&str) -> Option<String>) -> Option<u64> {
    watermark(window, 50, "HIVE_AUTO_RESET_WATERMARK_TOKENS", env)
}

fn watermark(
    window: u64,
    default_percent: u64,
    key: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<u64> {
    let default = window / 100 * default_percent + window % 100 * default_percent / 100;
    let (wanted, explicit) = match env(key).map(|v| v.trim().to_string()) {
        None => (default, false),
        Some(v) if v.is_empty() => (default, false),
        Some(v) => match v.parse::<u64>() {
            Ok(0) => return None,
            Ok(t) => (t, true),
            Err(_) => {
                log::warn!("ignoring {key}={v:?}: expected a number of tokens (0 disables)");
                (default, false)
            }
        },
    };
    let ceiling = blocking_limit(window, DEFAULT_MAX_OUTPUT_TOKENS)
        .saturating_sub(CHECKPOINT_HEADROOM_TOKENS)
        .max(1);
    if wanted > ceiling && explicit {
        log::warn!(
            "{key}={wanted} is at or past the CLI's blocking limit for a {window}-token window; \
             using {ceiling}"
        );
    }
    Some(wanted.min(ceiling))
}

/// `HIVE_CACHE_TTL_SECS`, how long the prompt cache is assumed warm.
pub fn cache_ttl(env: &dyn Fn(&str) -> Option<String>) -> Duration {
    let secs = match env("HIVE_CACHE_TTL_SECS") {
        None => DEFAULT_CACHE_TTL_SECS,
        Some(v) => v.trim().parse().unwrap_or_else(|_| {
            log::warn!("ignoring HIVE_CACHE_TTL_SECS={v:?}: expected seconds");
            DEFAULT_CACHE_TTL_SECS
        }),
    };
    Duration::from_secs(secs)
}

/// After a clean turn: is the context at or past the compact watermark?
pub fn needs_proactive_compact(context_tokens: Option<u64>, watermark: Option<u64>) -> bool {
    matches!((context_tokens, watermark), (Some(c), Some(w)) if c >= w)
}

/// Before a turn: is the context at or past the auto-reset watermark while the
/// cache has gone cold since the last turn?
pub fn needs_auto_reset(
    context_tokens: Option<u64>,
    watermark: Option<u64>,
    since_last_turn: Duration,
    cache_ttl: Duration,
) -> bool {
    needs_proactive_compact(context_tokens, watermark) && since_last_turn > cache_ttl
}

/// The prompt piped to claude for one inbox message: who it is from, the body, and
/// how many more are waiting.
pub fn wake_prompt(from: &str, body: &str, unread: u64) -> String {
    let mut prompt = format!("Message from {from}:\n\n{body}");
    if unread > 0 {
        prompt.push_str(&format!(
            "\n\n({unread} more pending — drain via mcp__hyperhive__recv)"
        ));
    }
    prompt
}

/// What is sent instead of the whole body when a turn is retried in the very
/// session whose history already holds its prompt: repeating the body would put
/// it there twice. `what` names the message and its sender (`message #12 from
/// operator`). Any other retry — a fresh session, after a compaction, after an
/// early kill — carries the whole body instead.
pub fn retry_note(what: &str) -> String {
    format!(
        "[system] Retry: the previous attempt at {what} ended before it finished (an API \
         error, a rate limit or a restart). That message is already above in this \
         conversation. Check what you already did, do not repeat sends, and finish handling it."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    type Env = &'static [(&'static str, &'static str)];

    fn lookup(pairs: Env) -> impl Fn(&str) -> Option<String> {
        move |k| {
            pairs
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_window_follows_the_resolution_order() {
        let env: Env = &[
            ("HIVE_CONTEXT_WINDOW_TOKENS_HAIKU", "200000"),
            ("HIVE_CONTEXT_WINDOW_TOKENS_SONNET", "1000000"),
            ("HIVE_CONTEXT_WINDOW_TOKENS_SONNET_4_5", "500000"),
            ("HIVE_CONTEXT_WINDOW_TOKENS_OPUS", "nope"),
            ("HIVE_CONTEXT_WINDOW_TOKENS", "300000"),
            ("PATH", "/bin"),
        ];
        let cases: &[(&str, Option<u64>, Env, u64)] = &[
            ("claude-haiku-4-5", None, env, 200_000),
            ("claude-sonnet-4-0", Some(200_000), env, 1_000_000),
            ("claude-sonnet-4-5", None, env, 500_000),
            ("Claude-SONNET-4.5", None, env, 500_000),
            ("claude-opus-4-1", Some(200_000), env, 300_000),
            ("claude-opus-4-1", Some(400_000), &env[..4], 400_000),
            ("claude-opus-4-1", None, &env[..4], 200_000),
            ("claude-opus-4-1", Some(0), &[], 200_000),
            (
                "anything",
                None,
                &[("HIVE_CONTEXT_WINDOW_TOKENS_", "1")],
                200_000,
            ),
            (
                "opus",
                None,
                &[("HIVE_CONTEXT_WINDOW_TOKENS", "0")],
                200_000,
            ),
            (
                "opus",
                None,
                &[("HIVE_CONTEXT_WINDOW_TOKENS", " 123 ")],
                123,
            ),
        ];
        for (model, cli, env, want) in cases {
            assert_eq!(
                context_window_tokens(model, *cli, env.iter().copied()),
                *want,
                "{model} {cli:?}"
            );
        }
    }

    #[test]
    fn a_bad_longest_key_falls_back_to_a_shorter_one() {
        let env = [
            ("HIVE_CONTEXT_WINDOW_TOKENS_SONNET", "1000000"),
            ("HIVE_CONTEXT_WINDOW_TOKENS_SONNET_4", "lots"),
        ];
        assert_eq!(
            context_window_tokens("claude-sonnet-4-5", None, env),
            1_000_000
        );
    }

    #[test]
    fn blocking_limit_matches_the_cli() {
        assert_eq!(blocking_limit(200_000, 32_000), 177_000);
        assert_eq!(blocking_limit(200_000, 8_000), 189_000);
        assert_eq!(blocking_limit(1_000_000, 32_000), 977_000);
        assert_eq!(blocking_limit(10_000, 32_000), 0);
    }

    #[test]
    fn compact_watermark_defaults_switches_and_clamps() {
        let cases: &[(u64, Env, Option<u64>)] = &[
            (200_000, &[], Some(150_000)),
            (1_000_000, &[], Some(750_000)),
            (
                200_000,
                &[("HIVE_COMPACT_WATERMARK_TOKENS", "120000")],
                Some(120_000),
            ),
            (200_000, &[("HIVE_COMPACT_WATERMARK_TOKENS", "0")], None),
            (
                200_000,
                &[("HIVE_COMPACT_WATERMARK_TOKENS", "190000")],
                Some(167_000),
            ),
            (
                200_000,
                &[("HIVE_COMPACT_WATERMARK_TOKENS", "lots")],
                Some(150_000),
            ),
            (200_000, &[("HIVE_AUTO_COMPACT", "false")], None),
            (
                200_000,
                &[
                    ("HIVE_AUTO_COMPACT", "0"),
                    ("HIVE_COMPACT_WATERMARK_TOKENS", "1000"),
                ],
                None,
            ),
            (200_000, &[("HIVE_AUTO_COMPACT", "true")], Some(150_000)),
            (40_000, &[], Some(7_000)),
            (10_000, &[], Some(1)),
        ];
        for (window, env, want) in cases {
            let env = lookup(env);
            assert_eq!(compact_watermark(*window, &env), *want, "{window}");
        }
    }

    #[test]
    fn auto_reset_watermark_defaults_to_half_and_ignores_auto_compact() {
        let cases: &[(u64, Env, Option<u64>)] = &[
            (200_000, &[], Some(100_000)),
            (200_001, &[], Some(100_000)),
            (200_000, &[("HIVE_AUTO_COMPACT", "0")], Some(100_000)),
            (200_000, &[("HIVE_AUTO_RESET_WATERMARK_TOKENS", "0")], None),
            (
                200_000,
                &[("HIVE_AUTO_RESET_WATERMARK_TOKENS", "90000")],
                Some(90_000),
            ),
            (
                200_000,
                &[("HIVE_AUTO_RESET_WATERMARK_TOKENS", "999999")],
                Some(167_000),
            ),
        ];
        for (window, env, want) in cases {
            let env = lookup(env);
            assert_eq!(auto_reset_watermark(*window, &env), *want, "{window}");
        }
    }

    #[test]
    fn watermark_predicates() {
        assert!(needs_proactive_compact(Some(150_000), Some(150_000)));
        assert!(!needs_proactive_compact(Some(149_999), Some(150_000)));
        assert!(!needs_proactive_compact(None, Some(1)));
        assert!(!needs_proactive_compact(Some(u64::MAX), None));
        let hour = Duration::from_secs(3600);
        assert!(needs_auto_reset(
            Some(100_000),
            Some(100_000),
            hour + Duration::from_secs(1),
            hour
        ));
        assert!(!needs_auto_reset(Some(100_000), Some(100_000), hour, hour));
        assert!(!needs_auto_reset(
            Some(99_999),
            Some(100_000),
            hour * 2,
            hour
        ));
        assert_eq!(cache_ttl(&lookup(&[])), hour);
        assert_eq!(
            cache_ttl(&lookup(&[("HIVE_CACHE_TTL_SECS", "300")])),
            Duration::from_secs(300)
        );
        assert_eq!(cache_ttl(&lookup(&[("HIVE_CACHE_TTL_SECS", "x")])), hour);
    }

    #[test]
    fn the_context_env_keeps_the_hive_variables_and_answers_like_the_environment() {
        let env = ContextEnv::from_pairs(
            [
                ("HIVE_CACHE_TTL_SECS", "60"),
                ("HIVE_CONTEXT_WINDOW_TOKENS_SONNET", "1000000"),
                ("HOME", "/home/ana"),
                ("ANTHROPIC_API_KEY", "sk-secret"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        assert_eq!(env.get("HOME"), None, "only HIVE_ variables are kept");
        assert_eq!(env.get("ANTHROPIC_API_KEY"), None);
        assert_eq!(env.get("HIVE_CACHE_TTL_SECS").as_deref(), Some("60"));
        assert_eq!(cache_ttl(&|k| env.get(k)), Duration::from_secs(60));
        assert_eq!(
            context_window_tokens("claude-sonnet-4-5", None, env.pairs()),
            1_000_000
        );
        assert_eq!(
            context_window_tokens("claude-opus-4", Some(300_000), env.pairs()),
            300_000
        );
    }

    #[test]
    fn wake_prompt_and_retry_note() {
        assert_eq!(
            wake_prompt("operator", "hi", 0),
            "Message from operator:\n\nhi"
        );
        assert_eq!(
            wake_prompt("self", "continue", 3),
            "Message from self:\n\ncontinue\n\n(3 more pending — drain via mcp__hyperhive__recv)"
        );
        let note = retry_note("message #12 from matrix");
        assert!(note.contains("message #12 from matrix"), "{note}");
        assert!(note.len() < 300, "{note}");
        assert!(CHECKPOINT_PROMPT
            .contains("context is filling up, flush durable state into your state dir now"));
        assert!(AUTO_RESET_CHECKPOINT_PROMPT.contains(
            "the prompt cache is cold and the session will be reset; flush state to files"
        ));
    }
}
