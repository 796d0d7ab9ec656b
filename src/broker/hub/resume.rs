//! The operator's `resume` (issue 40): any pause can be lifted, or the
//! operator is told what ends it. Per reason: a credential pool's
//! `usage_limit` park ends for the whole pool (`pools.rs`: in the store
//! too; its agents resume one a second, the oldest queued mail first, and
//! no report parks it again for a while); a harness waiting out a
//! `rate_limit`, an `api_backoff`, an `mcp_start` failure, a claude that
//! could not be started (`start_failed`) or its own pause after a usage
//! limit tries again at once; a `budget` is refused, naming the limit and
//! how to raise it, since only a raise or the window's end lifts it; a
//! `login` is refused, naming the login form, since only credentials end
//! it. An agent with no pause is refused too, saying what it does.
//!
//! The harness hears a resume on its status watch, the `status` call it
//! keeps parked in every phase (`inbox.rs`): each resume of an agent's own
//! pause sets its mark ([`Resumes`], unix milliseconds, later at every
//! resume), a parked watch whose connection was answered another mark is
//! answered at once, and a harness that sees the mark move ends its pause.

use super::pauses::Pause;
use super::{ConnId, Hub};
use crate::proto::cmd::{Resume, ResumeReply};
use crate::proto::text::excerpt;
use crate::proto::PauseReason;
use std::collections::BTreeMap;

/// Each agent's resume mark, and the mark each status watch was last
/// answered.
#[derive(Default)]
pub struct Resumes {
    marks: BTreeMap<String, i64>,
    told: BTreeMap<ConnId, Option<i64>>,
}

impl Resumes {
    /// A new mark for `agent`: now in unix milliseconds, or one past its
    /// last, so it always moves.
    fn mark(&mut self, agent: &str) -> i64 {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let next = self.marks.get(agent).map_or(ms, |m| ms.max(m + 1));
        self.marks.insert(agent.to_string(), next);
        next
    }

    /// `agent`'s mark now, if it was ever resumed.
    pub(super) fn current(&self, agent: &str) -> Option<i64> {
        self.marks.get(agent).copied()
    }

    /// Whether watch `conn` was answered a mark other than `agent`'s current
    /// one: then it is answered at once.
    pub(super) fn untold(&self, conn: ConnId, agent: &str) -> bool {
        let now = self.current(agent);
        now.is_some() && self.told.get(&conn) != Some(&now)
    }

    /// Watch `conn` is answered `agent`'s current mark.
    pub(super) fn tell(&mut self, conn: ConnId, agent: &str) -> Option<i64> {
        let now = self.current(agent);
        self.told.insert(conn, now);
        now
    }

    pub(super) fn closed(&mut self, conn: ConnId) {
        self.told.remove(&conn);
    }
}

impl Hub<'_> {
    /// `resume`: lifts the pause of one agent or one pool's park.
    pub(super) fn resume(&mut self, c: Resume) -> Result<ResumeReply, String> {
        match (c.agent, c.pool) {
            (Some(agent), None) => self.resume_agent(&agent),
            (None, Some(pool)) => self.resume_pool(&pool),
            _ => Err("resume: give exactly one of agent or pool".into()),
        }
    }

    fn resume_agent(&mut self, agent: &str) -> Result<ResumeReply, String> {
        self.check_agent(agent)?;
        match self.pause_of(agent) {
            Pause::Login => Err(self.login_refusal(agent)),
            Pause::Broker(p) if p.reason == PauseReason::Budget => Err(format!(
                "{agent} is paused by a budget: {}. A resume cannot lift it: it ends when the \
                 window rolls over at {}, or when the limit is raised — `hive budget set {agent} \
                 --usd N` (or --tokens N) for its own budget, `hive budget set --hive …` for the \
                 hive's; `hive budget` shows both",
                p.detail,
                p.until.map_or_else(
                    || "its end".to_string(),
                    |u| crate::proto::text::clock(u, crate::proto::now())
                )
            )),
            Pause::Broker(_) => {
                let pool = self.pool_of(agent);
                if self.pool_parked(&pool) {
                    return self.lift_pool(&pool);
                }
                // Its pool's park ended; it waits for its turn to resume.
                self.lift_stagger(agent);
                self.resume_harness(agent);
                log::info!("operator resume: {agent} resumes now (after its pool's park)");
                Ok(ResumeReply {
                    reason: PauseReason::UsageLimit,
                    pool: Some(pool.clone()),
                    agents: vec![agent.to_string()],
                    text: format!(
                        "{agent} resumes now: pool {pool}'s park had ended and it was waiting \
                         for its turn"
                    ),
                })
            }
            Pause::Harness(p) => {
                self.resume_harness(agent);
                log::info!(
                    "operator resume: {agent}'s harness is told to try again ({}: {})",
                    p.reason,
                    p.detail
                );
                Ok(ResumeReply {
                    reason: p.reason.clone(),
                    pool: None,
                    agents: vec![agent.to_string()],
                    text: format!(
                        "{agent} was paused ({}: {}); its harness tries again now",
                        p.reason, p.detail
                    ),
                })
            }
            Pause::Other(p) if p.reason == PauseReason::Budget => Err(format!(
                "{agent} is not paused: its budget no longer holds it, and its harness goes on \
                 with its next message"
            )),
            Pause::Other(p) => Err(format!(
                "{agent} is paused for a reason this broker cannot lift ({}: {}); `hive restart \
                 {agent}` starts its harness anew",
                p.reason, p.detail
            )),
            Pause::None => Err(self.not_paused(agent)),
        }
    }

    fn resume_pool(&mut self, pool: &str) -> Result<ResumeReply, String> {
        let known = self.known_pools();
        if !known.iter().any(|p| p == pool) {
            return Err(format!(
                "unknown pool {}; the pools are {} (`hive agents` shows each agent's)",
                excerpt(pool),
                known.join(", ")
            ));
        }
        if self.pool_parked(pool) {
            return self.lift_pool(pool);
        }
        // No park stands, but the pool's harnesses may still wait out their
        // own pause after the usage limit (a park refused as too soon).
        let waiting: Vec<String> = self
            .pool_members(pool)
            .into_iter()
            .filter(|m| {
                self.paused
                    .get(m)
                    .is_some_and(|p| p.reason == PauseReason::UsageLimit)
            })
            .collect();
        if waiting.is_empty() {
            return Err(format!(
                "pool {pool} is not parked: no usage limit holds it; `hive resume AGENT` lifts \
                 the pause of one of its agents"
            ));
        }
        for m in &waiting {
            self.resume_harness(m);
        }
        log::info!(
            "operator resume: pool {pool}'s harnesses waiting out a usage limit try again ({})",
            waiting.join(", ")
        );
        Ok(ResumeReply {
            reason: PauseReason::UsageLimit,
            pool: Some(pool.to_string()),
            text: format!(
                "pool {pool} is not parked; its harnesses waiting out a usage limit ({}) try \
                 again now",
                waiting.join(", ")
            ),
            agents: waiting,
        })
    }

    /// Lifts `pool`'s park; the harnesses of the pool waiting out their own
    /// pause after the usage limit try again too.
    fn lift_pool(&mut self, pool: &str) -> Result<ResumeReply, String> {
        let order = self.lift_park(pool).unwrap_or_default();
        for m in &order {
            if self
                .paused
                .get(m)
                .is_some_and(|p| p.reason == PauseReason::UsageLimit)
            {
                self.resume_harness(m);
            }
        }
        let text = format!(
            "pool {pool}'s usage-limit park is lifted: {} resume now, one a second, the oldest \
             queued mail first; a report parks it again no sooner than in {} min",
            if order.is_empty() {
                "no agent".to_string()
            } else {
                order.join(", ")
            },
            super::pools::RENEW_GAP_SECS / 60
        );
        log::warn!("operator resume: {text}");
        Ok(ResumeReply {
            reason: PauseReason::UsageLimit,
            pool: Some(pool.to_string()),
            agents: order,
            text,
        })
    }

    /// Tells `agent`'s harness, on its status watch, to end its own pause.
    fn resume_harness(&mut self, agent: &str) {
        self.resumes.mark(agent);
        self.notify(agent);
    }

    fn login_refusal(&self, agent: &str) -> String {
        let page = match self.cfg.web.as_ref().and_then(|w| w.origin()) {
            Some(origin) => format!("{origin}/agent/{agent}/"),
            None if self.settings.lifecycle.is_some() => {
                format!("/agent/{agent}/ on hive up's dashboard address; the dashboard links it")
            }
            None => "the page its harness serves".to_string(),
        };
        format!(
            "{agent} waits for a claude login, which a resume cannot give: log it in with the \
             login form on its page ({page}) using a token from `claude setup-token`, or give it \
             ANTHROPIC_API_KEY; it goes on by itself once claude has credentials"
        )
    }

    fn not_paused(&self, agent: &str) -> String {
        let doing = if !self.running(agent) {
            "its harness is not running (`hive agents` shows it)".to_string()
        } else {
            match self.inflight_id(agent) {
                Ok(Some(id)) => format!("it is handling message #{id}"),
                _ => "it waits for mail".to_string(),
            }
        };
        format!("{agent} is not paused: {doing}")
    }
}
