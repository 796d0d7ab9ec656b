//! Diagnostics: the tail of an agent's supervised log (`get_logs`, through the
//! lifecycle port's [`LogTail`](crate::broker::lifecycle::LogTail)) and of the
//! host's journal (`get_host_journal`). Both read on the caller's connection
//! thread, so a slow disk or journal never holds up the hub; both answers are
//! cut to the answer budget from the start, keeping the newest lines.

use super::limits::fit_text_tail;
use super::offload::read_journal;
use super::{Done, Handled, Hub};
use crate::proto::cmd::{log_lines, GetHostJournal, GetLogs};
use crate::proto::TextReply;

impl Hub<'_> {
    pub(super) fn get_logs(&mut self, caller: &str, c: GetLogs) -> Handled<TextReply> {
        let target = c.agent.unwrap_or_else(|| caller.to_string());
        self.check_agent(&target)?;
        if !self.may_inspect(caller, &target) {
            return Err(format!(
                "get_logs: {target} is not a child of {caller}; other agents' logs need the query_agent_state capability"
            ));
        }
        let Some(logs) = self.settings.logs.clone() else {
            return Err("this broker runs without a supervisor (plain `hive broker`), so it keeps no agent logs; run the hive with `hive up`".into());
        };
        let n = log_lines(c.lines) as usize;
        Ok(Done::Offload(Box::new(move || {
            let text = logs.tail(&target, n)?;
            Ok(TextReply {
                text: fit_text_tail(text),
            })
        })))
    }

    /// The capability and the unit were checked by the gate and the command;
    /// journalctl runs on the caller's job thread (`conn-job`).
    pub(super) fn host_journal(&mut self, c: GetHostJournal) -> Handled<TextReply> {
        let n = log_lines(c.lines);
        Ok(Done::Offload(Box::new(move || {
            let text = read_journal(c.unit.as_deref(), n)?;
            Ok(TextReply {
                text: fit_text_tail(text),
            })
        })))
    }
}
