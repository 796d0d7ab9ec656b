//! The operator's `resume` (issue 40): lifts the pause of one agent, or the
//! usage-limit park of one credential pool, at once. What a pause's reason
//! allows is the broker's to decide (`broker/hub/resume.rs`): a pool's
//! usage-limit park ends; a harness waiting out a rate limit, an API
//! backoff, MCP servers that did not start or a claude that could not be
//! started tries again at once; a budget and a login are refused, saying
//! what ends them. Here are the command's fields, its rule (exactly one of
//! the two) and its answer.

use crate::proto::command::{Command, Invalid};
use crate::proto::ident::check_name;
use crate::proto::kinds::PauseReason;
use crate::proto::text::{excerpt, is_control_or_bidi};
use serde::{Deserialize, Serialize};

/// Longest pool name `resume` takes (`account:NAME`, `uuid:…`, `key:…`,
/// `agent:NAME`).
pub const MAX_POOL_NAME: usize = 200;

/// Operator: lift the pause of `agent`, or the usage-limit park of `pool`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resume {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// A credential pool as `agents` names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

/// What `resume` lifted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResumeReply {
    /// Why the agent (or the pool) was paused.
    pub reason: PauseReason,
    /// The pool whose park ended, for a usage limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// The agents that go on now: handed their mail again, or told to try
    /// at once.
    pub agents: Vec<String>,
    /// The same in words, for the operator.
    pub text: String,
}

impl Command for Resume {
    type Reply = ResumeReply;
    fn validate(&self) -> Result<(), Invalid> {
        match (&self.agent, &self.pool) {
            (Some(a), None) => check_name(a).map_err(|e| Invalid::arg("agent", e)),
            (None, Some(p)) => check_pool(p),
            _ => Err(Invalid::OneOf("agent", "pool")),
        }
    }
}

/// A pool name: one word of at most [`MAX_POOL_NAME`] characters, no white
/// space, control or bidi characters.
fn check_pool(p: &str) -> Result<(), Invalid> {
    let n = p.chars().count();
    if n == 0
        || n > MAX_POOL_NAME
        || p.chars()
            .any(|c| c.is_whitespace() || is_control_or_bidi(c))
    {
        return Err(Invalid::arg(
            "pool",
            format!(
                "{} must be a pool as `hive agents` shows it (account:NAME, uuid:…, key:…, \
                 agent:NAME): one word of at most {MAX_POOL_NAME} characters",
                excerpt(p)
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for Resume {
        fn sample() -> Self {
            Resume {
                agent: Some("ana".into()),
                pool: None,
            }
        }
    }

    #[test]
    fn resume_names_one_agent_or_one_pool() {
        let r = |agent: Option<&str>, pool: Option<&str>| Resume {
            agent: agent.map(Into::into),
            pool: pool.map(Into::into),
        };
        assert!(r(Some("ana"), None).validate().is_ok());
        assert!(r(None, Some("key:0a1b2c3d")).validate().is_ok());
        assert!(r(None, Some("account:team-a")).validate().is_ok());
        for bad in [r(None, None), r(Some("ana"), Some("key:0a1b2c3d"))] {
            assert_eq!(
                bad.validate(),
                Err(Invalid::OneOf("agent", "pool")),
                "{bad:?}"
            );
        }
        for pool in [
            "",
            "key: 1",
            "key:\u{202e}x",
            &"p".repeat(MAX_POOL_NAME + 1),
        ] {
            let e = r(None, Some(pool)).validate().unwrap_err();
            assert!(e.to_string().starts_with("pool "), "{pool:?}: {e}");
        }
        let e = r(Some("no such/name"), None).validate().unwrap_err();
        assert!(e.to_string().starts_with("agent "), "{e}");
        let wire = r#"{"pool":"key:0a1b2c3d"}"#;
        let parsed: Resume = serde_json::from_str(wire).unwrap();
        assert_eq!(serde_json::to_string(&parsed).unwrap(), wire);
    }
}
