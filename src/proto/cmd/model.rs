//! The model override (issue 39, item 3): the model an agent's page chose
//! with `/model NAME`, kept by the broker — outside the agent's sandbox, set
//! only through the harness's credential under isolated `hive up` — together
//! with the configured default it was chosen against. When the configured
//! default changes (the fleet entry's `model`, `HIVE_DEFAULT_MODEL`), the
//! override is cleared: the model has one owner at a time.

use crate::proto::command::{Command, Invalid};
use serde::{Deserialize, Serialize};

/// The longest model name (the harness's own bound).
pub const MAX_MODEL_NAME: usize = 100;

/// A model name: letters, digits and `-_.:[]/@`, not starting with `-`.
pub fn check_model_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_MODEL_NAME
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.:[]/@".contains(c));
    if ok {
        return Ok(());
    }
    let shown: String = name.chars().take(40).collect();
    let cut = if shown.len() < name.len() { "…" } else { "" };
    Err(format!(
        "{shown:?}{cut} is not a model name (letters, digits and -_.:[]/@ only, not starting \
         with -, at most {MAX_MODEL_NAME} bytes; e.g. haiku, sonnet, claude-sonnet-4-5)"
    ))
}

/// The harness asks for its agent's override (`set` and `clear` absent),
/// sets one (`set`, the page's `/model NAME`) or clears it (`clear`, the
/// page's `/model --fleet`), always saying the configured default it runs
/// with (`default`). An override chosen against another default is cleared
/// by the asking, and the answer says which (`cleared`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelOverride {
    pub default: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clear: bool,
}

/// What the next turn runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelReply {
    /// The override, if one is in force; else the default is the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_override: Option<String>,
    /// An override this answer ended because the configured default moved
    /// on from the one it was chosen against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared: Option<String>,
}

impl Command for ModelOverride {
    type Reply = ModelReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_model_name(&self.default).map_err(|e| Invalid::arg("default", e))?;
        if let Some(m) = &self.set {
            check_model_name(m).map_err(|e| Invalid::arg("set", e))?;
            if self.clear {
                return Err(Invalid::arg("clear", "set a model, or clear it, not both"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for ModelOverride {
        fn sample() -> Self {
            ModelOverride {
                default: "sonnet".into(),
                set: Some("opus".into()),
                clear: false,
            }
        }
    }

    #[test]
    fn names_are_checked_and_set_and_clear_exclude_each_other() {
        assert!(ModelOverride::sample().validate().is_ok());
        let bad = ModelOverride {
            default: "sonnet".into(),
            set: Some("--dangerously".into()),
            clear: false,
        };
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not a model name"));
        let both = ModelOverride {
            clear: true,
            ..ModelOverride::sample()
        };
        assert!(both
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not both"));
        let blank = ModelOverride::default();
        assert!(blank.validate().is_err(), "the default is named");
    }
}
