//! The `traceparent` a message carries (issue 43, item 1): step 17's column,
//! stored by the row's own insert (`NewMessage::traceparent`: `wake
//! --traceparent`, `send` from `hive mcp` with the sender's run, `hive
//! send`) and read when the row is handed out, so the run
//! that handles it links to the sender's span. The value was checked
//! (`proto::cmd::TraceParent`) before it got here.

use super::*;

/// Step 17: the column (none for every older row).
pub(super) const SCHEMA_V17: &str = "
ALTER TABLE messages ADD COLUMN traceparent TEXT;
";

impl Db {
    /// The `traceparent` message `id` carries, if any.
    pub fn traceparent(&self, id: i64) -> Res<Option<String>> {
        self.conn
            .prepare_cached("SELECT traceparent FROM messages WHERE id = ?1")?
            .query_row(params![id], |r| r.get(0))
            .optional()
            .map(Option::flatten)
    }
}
