//! Questions: `ask` (an agent asks the operator or a peer), `answer` (the one
//! asked answers), and the operator's `questions` and `cancel_question`.

use super::{check_remote_text, check_text};
use crate::proto::command::{Command, Invalid};
use crate::proto::limits::{MAX_OPTIONS, MAX_OPTION_CHARS};
use crate::proto::reply::{is_zero, Empty, IdReply, Question};
use crate::proto::text::excerpt;
use serde::{Deserialize, Serialize};

/// A question for the operator (default), `<parent>`, a peer agent, or
/// `NAME@HIVE` on another hive of the swarm.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ask {
    pub question: String,
    #[serde(default)]
    pub options: Vec<String>,
    #[serde(default)]
    pub multi: bool,
    #[serde(default)]
    pub ttl_seconds: Option<u64>,
    #[serde(default)]
    pub to: Option<String>,
}

impl Command for Ask {
    type Reply = IdReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_text("question", &self.question)?;
        if let Some(to) = self.to.as_deref().filter(|t| t.contains('@')) {
            crate::proto::address::check_remote(to).map_err(|e| Invalid::arg("to", e))?;
            check_remote_text("question", &self.question, to)?;
        }
        if self.options.len() > MAX_OPTIONS {
            return Err(Invalid::arg(
                "options",
                format!(
                    "has {} entries; a question may offer at most {MAX_OPTIONS}",
                    self.options.len()
                ),
            ));
        }
        for o in &self.options {
            check_option(o).map_err(Invalid::Whole)?;
        }
        Ok(())
    }
}

/// What an option of a question must be, asked here or on another hive
/// (`bridge_deliver` checks a peer's the same way): one line of 1 to
/// [`MAX_OPTION_CHARS`] characters.
pub fn check_option(o: &str) -> Result<(), String> {
    if o.trim().is_empty() || o.contains(['\n', '\r']) || o.chars().count() > MAX_OPTION_CHARS {
        return Err(format!(
            "option {} must be one line of 1 to {MAX_OPTION_CHARS} characters",
            excerpt(o)
        ));
    }
    Ok(())
}

/// Answers a question addressed to the caller.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    pub id: i64,
    pub answer: String,
}

impl Command for Answer {
    type Reply = Empty;
    fn validate(&self) -> Result<(), Invalid> {
        check_text("answer", &self.answer)
    }
}

/// Operator: pending questions addressed to the operator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Questions {}

/// Answer to `questions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuestionsReply {
    pub questions: Vec<Question>,
    /// Questions that did not fit in the answer's byte budget.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
}

impl Command for Questions {
    type Reply = QuestionsReply;
}

/// Operator: withdraws a pending question with `[cancelled by operator]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelQuestion {
    pub id: i64,
}

impl Command for CancelQuestion {
    type Reply = Empty;
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for Ask {
        fn sample() -> Self {
            Ask {
                question: "ship it?".into(),
                options: vec!["yes".into(), "no".into()],
                multi: false,
                ttl_seconds: Some(60),
                to: Some("bob".into()),
            }
        }
    }
    impl Sample for Answer {
        fn sample() -> Self {
            Answer {
                id: 4,
                answer: "yes".into(),
            }
        }
    }
    impl Sample for Questions {
        fn sample() -> Self {
            Questions {}
        }
    }
    impl Sample for CancelQuestion {
        fn sample() -> Self {
            CancelQuestion { id: 4 }
        }
    }

    #[test]
    fn questions_and_options_are_bounded() {
        let ask = |options: Vec<String>| Ask {
            options,
            ..Ask::sample()
        };
        let many: Vec<String> = (0..40).map(|i| i.to_string()).collect();
        assert!(ask(many)
            .validate()
            .unwrap_err()
            .to_string()
            .contains("at most 32"));
        assert!(ask(vec!["".into()])
            .validate()
            .unwrap_err()
            .to_string()
            .contains("200 characters"));
        assert!(ask(vec!["yes".into(), "no".into()]).validate().is_ok());
    }
}
