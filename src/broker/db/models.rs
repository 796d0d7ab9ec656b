//! The page's model override in `broker.db` (issue 39, item 3; schema step
//! 15): per agent, the model its page chose and the configured default it
//! was chosen against, on the agent's row. Kept here, outside the agent's
//! sandbox, where claude cannot write it.

use super::{Db, Res};
use rusqlite::{params, OptionalExtension};

/// Schema step 15.
pub(super) const SCHEMA_V15: &str = "
ALTER TABLE agents ADD COLUMN model_override TEXT;
ALTER TABLE agents ADD COLUMN model_override_default TEXT;
";

impl Db {
    /// `agent`'s override and the default it was chosen against.
    pub fn model_override(&self, agent: &str) -> Res<Option<(String, String)>> {
        let row: Option<(Option<String>, Option<String>)> = self
            .conn
            .prepare_cached(
                "SELECT model_override, model_override_default FROM agents WHERE name = ?1",
            )?
            .query_row(params![agent], |r| Ok((r.get(0)?, r.get(1)?)))
            .optional()?;
        Ok(match row {
            Some((Some(m), d)) => Some((m, d.unwrap_or_default())),
            _ => None,
        })
    }

    /// Sets (`Some`) or clears (`None`) `agent`'s override.
    pub fn set_model_override(&self, agent: &str, model: Option<(&str, &str)>) -> Res<()> {
        let (m, d) = match model {
            Some((m, d)) => (Some(m), Some(d)),
            None => (None, None),
        };
        self.update_agent(
            agent,
            "UPDATE agents SET model_override = ?1, model_override_default = ?2 WHERE name = ?3",
            params![m, d, agent],
        )
    }
}
