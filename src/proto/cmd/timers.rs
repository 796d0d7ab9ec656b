//! Timers: `remind` (a message into the caller's own inbox, once) and the
//! scheduling group's `schedule_prompt`, `list_scheduled`, `cancel_scheduled`;
//! and the operator's view of every agent's timers (issue 39): `timers`
//! lists them, `cancel_timer` cancels one by kind and id (ids are per kind).
//! When a timer fires is computed here, once, for the broker and for whatever
//! a client tells its user.

use super::check_text;
use crate::proto::command::{Command, Invalid};
use crate::proto::enums::closed_enum;
use crate::proto::limits::{MIN_EVERY_SECS, TIMER_HORIZON_SECS};
use crate::proto::reply::{is_zero, Empty, Scheduled};
use serde::{Deserialize, Serialize};

/// `now` plus `delay`, the delay cut to the timers' horizon.
fn after(now: i64, delay: u64) -> i64 {
    now.saturating_add(delay.min(TIMER_HORIZON_SECS) as i64)
}

/// Schedules a message into the caller's own inbox, after `delay_seconds` or at
/// `at_unix_timestamp` (exactly one).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Remind {
    pub message: String,
    #[serde(default)]
    pub delay_seconds: Option<u64>,
    #[serde(default)]
    pub at_unix_timestamp: Option<i64>,
}

impl Remind {
    /// When it fires, set at `now`.
    pub fn fire_at(&self, now: i64) -> i64 {
        match (self.delay_seconds, self.at_unix_timestamp) {
            (Some(d), _) => after(now, d),
            (None, Some(at)) => at,
            (None, None) => now,
        }
    }
}

/// Answer to `remind`: the reminder's id and when it fires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemindReply {
    pub id: i64,
    /// Unix seconds.
    #[serde(default)]
    pub fire_at: i64,
}

impl Command for Remind {
    type Reply = RemindReply;
    fn validate(&self) -> Result<(), Invalid> {
        if self.delay_seconds.is_some() == self.at_unix_timestamp.is_some() {
            return Err(Invalid::OneOf("delay_seconds", "at_unix_timestamp"));
        }
        check_text("message", &self.message)
    }
}

/// A prompt into the caller's own inbox, once (at a time or after a delay),
/// repeatedly (`every_seconds`), or both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulePrompt {
    pub body: String,
    #[serde(default)]
    pub at_unix_timestamp: Option<i64>,
    #[serde(default)]
    pub delay_seconds: Option<u64>,
    #[serde(default)]
    pub every_seconds: Option<u64>,
}

impl SchedulePrompt {
    /// The first delivery, scheduled at `now`: at the time or after the delay
    /// given, else one period from now.
    pub fn first_fire(&self, now: i64) -> i64 {
        match (
            self.at_unix_timestamp,
            self.delay_seconds,
            self.every_seconds,
        ) {
            (Some(at), _, _) => at,
            (None, Some(d), _) => after(now, d),
            (None, None, Some(e)) => after(now, e),
            (None, None, None) => now,
        }
    }
}

/// Answer to `schedule_prompt`: the prompt's id and its first delivery.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduledIdReply {
    pub id: i64,
    /// Unix seconds.
    pub fire_at: i64,
}

impl Command for SchedulePrompt {
    type Reply = ScheduledIdReply;
    fn validate(&self) -> Result<(), Invalid> {
        check_text("body", &self.body)?;
        if self.every_seconds.is_some_and(|e| e < MIN_EVERY_SECS) {
            return Err(Invalid::arg(
                "every_seconds",
                format!("must be at least {MIN_EVERY_SECS}"),
            ));
        }
        match (
            self.at_unix_timestamp,
            self.delay_seconds,
            self.every_seconds,
        ) {
            (Some(_), Some(_), _) => Err(Invalid::Whole(
                "give at_unix_timestamp or delay_seconds, not both".into(),
            )),
            (None, None, None) => Err(Invalid::Whole(
                "schedule_prompt needs at_unix_timestamp, delay_seconds or every_seconds".into(),
            )),
            _ => Ok(()),
        }
    }
}

/// The caller's scheduled prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListScheduled {}

/// Answer to `list_scheduled`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduledReply {
    pub scheduled: Vec<Scheduled>,
    /// Prompts that did not fit in the answer's byte budget.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
}

impl Command for ListScheduled {
    type Reply = ScheduledReply;
}

/// Deletes one of the caller's scheduled prompts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelScheduled {
    pub id: i64,
}

impl Command for CancelScheduled {
    type Reply = Empty;
}

closed_enum! {
    /// Which of an agent's timers an id names: reminders and scheduled
    /// prompts are numbered apart.
    pub enum TimerKind ("timer kind", "kinds") {
        /// `remind`: once, into the agent's own inbox.
        Reminder = "reminder",
        /// `schedule_prompt`: once or repeating.
        Scheduled = "scheduled",
    }
}

/// Operator: every pending reminder and scheduled prompt, of one agent or of
/// all, soonest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timers {
    #[serde(default)]
    pub agent: Option<String>,
}

/// One pending timer as the operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timer {
    pub agent: String,
    pub kind: TimerKind,
    /// Its id among the timers of its kind.
    pub id: i64,
    /// Unix seconds of the next delivery.
    pub fire_at: i64,
    /// A scheduled prompt's period; absent for a one-shot and a reminder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_seconds: Option<u64>,
    /// The body's first line, at most 200 characters.
    pub first_line: String,
    /// The whole body's length in bytes.
    pub bytes: u64,
    /// A repeating prompt's deliveries left out because its last copy was
    /// still unread (its agent stopped, paused or busy): each was coalesced
    /// into that copy.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped: u64,
    /// The message id of the prompt's copy still unread in the agent's
    /// inbox, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unread_copy: Option<i64>,
}

/// Answer to `timers`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimersReply {
    pub timers: Vec<Timer>,
    /// Timers that did not fit in the answer's byte budget.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub left_off: u64,
}

impl Command for Timers {
    type Reply = TimersReply;
}

/// Operator: cancels one agent's reminder or scheduled prompt; the agent is
/// told (`[reminder #ID cancelled by operator]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelTimer {
    pub kind: TimerKind,
    pub id: i64,
}

/// Answer to `cancel_timer`: whose timer it was.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CancelTimerReply {
    pub agent: String,
}

impl Command for CancelTimer {
    type Reply = CancelTimerReply;
}

/// What the owner of a timer the operator cancelled finds in its inbox.
pub fn cancelled_notice(kind: TimerKind, id: i64) -> String {
    format!("[{kind} #{id} cancelled by operator]")
}

#[cfg(test)]
mod samples {
    use super::*;
    use crate::proto::cmd::Sample;

    impl Sample for Remind {
        fn sample() -> Self {
            Remind {
                message: "check the build".into(),
                delay_seconds: Some(60),
                at_unix_timestamp: None,
            }
        }
    }
    impl Sample for SchedulePrompt {
        fn sample() -> Self {
            SchedulePrompt {
                body: "report".into(),
                at_unix_timestamp: None,
                delay_seconds: Some(60),
                every_seconds: Some(3600),
            }
        }
    }
    impl Sample for ListScheduled {
        fn sample() -> Self {
            ListScheduled {}
        }
    }
    impl Sample for CancelScheduled {
        fn sample() -> Self {
            CancelScheduled { id: 2 }
        }
    }
    impl Sample for Timers {
        fn sample() -> Self {
            Timers {
                agent: Some("ana".into()),
            }
        }
    }
    impl Sample for CancelTimer {
        fn sample() -> Self {
            CancelTimer {
                kind: TimerKind::Scheduled,
                id: 2,
            }
        }
    }

    #[test]
    fn a_timer_kind_is_named_and_an_unknown_one_lists_the_kinds() {
        let c: CancelTimer = serde_json::from_str(r#"{"kind":"reminder","id":3}"#).unwrap();
        assert_eq!(c.kind, TimerKind::Reminder);
        let e = serde_json::from_str::<CancelTimer>(r#"{"kind":"question","id":3}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unknown timer kind \"question\"; known kinds: reminder, scheduled"),
            "{e}"
        );
        assert_eq!(
            cancelled_notice(TimerKind::Scheduled, 4),
            "[scheduled #4 cancelled by operator]"
        );
    }

    #[test]
    fn timers_fire_within_the_horizon_and_need_one_start() {
        let r = Remind {
            delay_seconds: Some(u64::MAX),
            ..Remind::sample()
        };
        assert_eq!(r.fire_at(100), 100 + TIMER_HORIZON_SECS as i64);
        let r = Remind {
            delay_seconds: None,
            at_unix_timestamp: Some(5),
            ..Remind::sample()
        };
        assert_eq!(r.fire_at(100), 5);
        let both = Remind {
            at_unix_timestamp: Some(5),
            ..Remind::sample()
        };
        assert!(both
            .validate()
            .unwrap_err()
            .to_string()
            .starts_with("give exactly one"));
        let s = SchedulePrompt {
            delay_seconds: None,
            every_seconds: Some(3600),
            ..SchedulePrompt::sample()
        };
        assert_eq!(s.first_fire(100), 3700);
        let s = SchedulePrompt {
            every_seconds: Some(30),
            ..SchedulePrompt::sample()
        };
        assert_eq!(
            s.validate().unwrap_err().to_string(),
            "every_seconds must be at least 60"
        );
        let s = SchedulePrompt {
            delay_seconds: None,
            every_seconds: None,
            ..SchedulePrompt::sample()
        };
        assert!(s.validate().is_err());
    }
}
