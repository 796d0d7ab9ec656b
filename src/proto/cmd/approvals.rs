//! Approvals: an agent proposes a change to a fleet-file entry
//! (`request_apply_commit`; `request_spawn` is lifecycle's), the operator
//! lists, approves and denies them, and sets an agent's permissions.

use super::check_text;
use crate::proto::access::{Capability, ToolGroup};
use crate::proto::command::{Command, Invalid};
use crate::proto::limits::MAX_PATCH_BYTES;
use crate::proto::reply::{is_zero, Approval, QueuedReply, TextReply};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Proposes a change to an agent's fleet-file entry: a JSON merge patch,
/// inline (a JSON object) or the path of a file in the caller's state dir,
/// applied once the operator approves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestApplyCommit {
    pub agent: String,
    pub commit_ref: String,
}

impl RequestApplyCommit {
    /// True when `commit_ref` is the patch itself rather than a file's path.
    pub fn inline(&self) -> bool {
        self.commit_ref.trim_start().starts_with('{')
    }
}

impl Command for RequestApplyCommit {
    type Reply = QueuedReply;
    fn validate(&self) -> Result<(), Invalid> {
        if !self.inline() {
            return Ok(());
        }
        if self.commit_ref.len() > MAX_PATCH_BYTES {
            return Err(Invalid::arg(
                "commit_ref",
                format!(
                    "is {} bytes; a patch may be at most {MAX_PATCH_BYTES} bytes",
                    self.commit_ref.len()
                ),
            ));
        }
        parse_patch(&self.commit_ref)
            .map(|_| ())
            .map_err(Invalid::Whole)
    }
}

/// Parses a merge patch: a JSON object that does not rename the agent.
pub fn parse_patch(text: &str) -> Result<Value, String> {
    let v: Value =
        serde_json::from_str(text).map_err(|e| format!("commit_ref is not valid JSON: {e}"))?;
    if !v.is_object() {
        return Err("commit_ref must be a JSON object (a merge patch of the agent's entry)".into());
    }
    if v.get("name").is_some_and(|n| n != &Value::Null) {
        return Err("commit_ref cannot rename an agent (drop \"name\" from the patch)".into());
    }
    Ok(v)
}

/// Operator: pending approvals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approvals {}

/// Answer to `approvals`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalsReply {
    pub approvals: Vec<Approval>,
    /// Approvals that did not fit in the answer's byte budget.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
}

impl Command for Approvals {
    type Reply = ApprovalsReply;
}

/// Operator: approves and carries out a pending approval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Approve {
    pub id: i64,
}

impl Command for Approve {
    type Reply = TextReply;
}

/// Operator: denies a pending approval; the requester is told why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deny {
    pub id: i64,
    #[serde(default)]
    pub why: Option<String>,
}

impl Command for Deny {
    type Reply = TextReply;
    fn validate(&self) -> Result<(), Invalid> {
        match &self.why {
            Some(why) => check_text("why", why),
            None => Ok(()),
        }
    }
}

/// Operator: sets an agent's tool groups and capabilities; the fleet file is
/// rewritten and the agent restarts with them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetPermissions {
    pub agent: String,
    pub tool_groups: Vec<ToolGroup>,
    pub capabilities: Vec<Capability>,
}

impl Command for SetPermissions {
    type Reply = TextReply;
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for RequestApplyCommit {
        fn sample() -> Self {
            RequestApplyCommit {
                agent: "kid".into(),
                commit_ref: r#"{"model":"sonnet"}"#.into(),
            }
        }
    }
    impl Sample for Approvals {
        fn sample() -> Self {
            Approvals {}
        }
    }
    impl Sample for Approve {
        fn sample() -> Self {
            Approve { id: 1 }
        }
    }
    impl Sample for Deny {
        fn sample() -> Self {
            Deny {
                id: 1,
                why: Some("not now".into()),
            }
        }
    }
    impl Sample for SetPermissions {
        fn sample() -> Self {
            SetPermissions {
                agent: "kid".into(),
                tool_groups: vec![ToolGroup::Messaging, ToolGroup::Diagnostics],
                capabilities: vec![Capability::ReadHostJournal],
            }
        }
    }

    #[test]
    fn inline_patches_are_checked_and_paths_are_left_to_the_reader() {
        let r = |c: &str| RequestApplyCommit {
            agent: "kid".into(),
            commit_ref: c.into(),
        };
        assert!(r(r#"{"model":"x"}"#).validate().is_ok());
        assert!(r("patch.json").validate().is_ok());
        assert!(r(r#"{"name":"zed"}"#)
            .validate()
            .unwrap_err()
            .to_string()
            .contains("cannot rename"));
        assert!(r("{nope")
            .validate()
            .unwrap_err()
            .to_string()
            .contains("not valid JSON"));
        assert!(
            r("[1]").validate().is_ok(),
            "a path, as far as the contract can tell"
        );
    }
}
