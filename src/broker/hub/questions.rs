//! Questions: an agent asks the operator, its parent or a peer (`ask`); the one
//! asked answers (`answer`); the asker withdraws it (`cancel_loose_end`), the
//! operator cancels one addressed to the operator (`cancel_question`), or its
//! TTL runs out (`timers.rs` expires it). Closing a question and telling its
//! asker is one transaction. A question to or from another hive of the swarm
//! takes the bridge's way (`bridge.rs`) at the three points marked below.

use super::limits::Budget;
use super::{db_err, Hub, Identity};
use crate::broker::db::{NewMessage, Side};
use crate::proto::cmd::{Answer, Ask, CancelQuestion, QuestionsReply};
use crate::proto::ident::Peer;
use crate::proto::{now, Empty, IdReply, MsgKind, Question};

impl Hub<'_> {
    pub(super) fn ask(&mut self, asker: &str, c: Ask) -> Result<IdReply, String> {
        let to = c.to.as_deref().unwrap_or("operator");
        let to = self.cfg.own_name(to).unwrap_or(to).to_string();
        // The swarm: a question to another hive.
        if let Some(remote) = Peer::address(&to).remote() {
            return self.ask_remote(asker, &remote, c);
        }
        let target = match Peer::address(&to) {
            Peer::Parent => Peer::address(&self.cfg.parent_of(asker)),
            t => t,
        };
        if let Some(t) = target.agent() {
            self.check_agent(t)?;
            if t == asker {
                return Err("an agent cannot ask itself".into());
            }
        }
        let t = now();
        let expires = c.ttl_seconds.filter(|s| *s > 0).map(|s| t + s as i64);
        let id = self
            .db
            .insert_question(asker, &target, &c.question, &c.options, c.multi, t, expires)
            .map_err(db_err)?;
        match target.agent() {
            Some(to) => {
                let q = Question {
                    id,
                    asker: Peer::Agent(asker.into()),
                    target: target.clone(),
                    question: c.question,
                    options: c.options,
                    multi: c.multi,
                    asked_at: t,
                    expires_at: expires,
                };
                self.tell(to, MsgKind::QuestionAsked, &question_notice(&q))?;
            }
            None => self.notify("operator"),
        }
        self.recompute_due();
        Ok(IdReply { id })
    }

    /// Records `answer` as given by `by` and tells the asker.
    pub(super) fn close_question(
        &mut self,
        q: &Question,
        answer: &str,
        by: &Peer,
    ) -> Result<(), String> {
        // The swarm: a question another hive asked here is answered there.
        if q.asker.remote().is_some() {
            return self.answer_remote_asker(q, answer, by);
        }
        let body = answer_notice(q, answer, by);
        let notice = NewMessage {
            from: &Peer::System,
            to: q.asker.as_str(),
            body: &body,
            kind: &MsgKind::QuestionAnswered,
            in_reply_to: None,
            receipt: false,
            traceparent: None,
        };
        // The swarm: a question asked to another hive, closed here (expired),
        // is cancelled there too.
        if q.target.remote().is_some() && by != &q.target {
            return self.close_for_remote_target(q, answer, by, Some(&notice));
        }
        if self
            .db
            .close_question(q.id, answer, by, now(), Some(&notice))
            .map_err(db_err)?
        {
            self.notify(q.asker.as_str());
        }
        Ok(())
    }

    fn open_question(&self, id: i64) -> Result<Question, String> {
        self.db
            .open_question(id)
            .map_err(db_err)?
            .ok_or_else(|| format!("no open question #{id}"))
    }

    pub(super) fn answer_question(&mut self, who: &Identity, c: Answer) -> Result<Empty, String> {
        let q = self.open_question(c.id)?;
        if q.target != who.name() {
            return Err(format!(
                "question #{} is addressed to {}; only they may answer it",
                c.id, q.target
            ));
        }
        self.close_question(&q, &c.answer, &Peer::sender(who.name()))?;
        self.recompute_due();
        Ok(Empty {})
    }

    /// The asker withdraws its question; an agent it was addressed to is told.
    pub(super) fn withdraw_question(&mut self, asker: &str, id: i64) -> Result<Empty, String> {
        let q = self.open_question(id)?;
        if q.asker != asker {
            return Err(format!("question #{id} is not yours to cancel"));
        }
        let text = format!("[cancelled by {asker}]");
        if q.target.remote().is_some() {
            self.close_for_remote_target(&q, &text, &Peer::Agent(asker.into()), None)?;
            self.recompute_due();
            return Ok(Empty {});
        }
        self.db
            .close_question(id, &text, &Peer::Agent(asker.into()), now(), None)
            .map_err(db_err)?;
        if let Some(target) = q.target.agent() {
            let body = format!("[question #{id} from {asker}] withdrawn: {text}");
            self.tell(target, MsgKind::QuestionCancelled, &body)?;
        }
        self.recompute_due();
        Ok(Empty {})
    }

    /// The operator cancels a question addressed to the operator; its asker
    /// gets `[cancelled by operator]` as the answer.
    pub(super) fn cancel_question_as_operator(
        &mut self,
        c: CancelQuestion,
    ) -> Result<Empty, String> {
        let q = self.open_question(c.id)?;
        if q.target != Peer::Operator {
            return Err(format!("question #{} is not yours to cancel", c.id));
        }
        self.close_question(&q, "[cancelled by operator]", &Peer::Operator)?;
        self.recompute_due();
        Ok(Empty {})
    }

    pub(super) fn questions(&self) -> Result<QuestionsReply, String> {
        let questions = self
            .db
            .questions_where(Side::Target, "operator")
            .map_err(db_err)?;
        let mut budget = Budget::new();
        let questions = budget.fit(questions);
        Ok(QuestionsReply {
            questions,
            left_off: budget.left_off,
        })
    }
}

/// What the agent asked hears: the question, its options and how to answer.
pub(super) fn question_notice(q: &Question) -> String {
    let id = q.id;
    let mut body = format!("[question #{id} from {}] {}", q.asker, q.question);
    if let Some(options) = q.options_line() {
        body.push_str(&format!("\n{options}"));
    }
    body.push_str(&format!(
        "\nAnswer with mcp__hyperhive__answer(id={id}, answer=...)."
    ));
    body
}

/// What the asker hears when its question is closed.
pub(super) fn answer_notice(q: &Question, answer: &str, by: &Peer) -> String {
    format!(
        "[answer to question #{}] {:?} — {by} answered: {answer}",
        q.id,
        crate::proto::text::preview(&q.question, 200)
    )
}
