//! The agent harness behind `hive serve`: everything between popping one inbox
//! message and acking it. [`serve`] wires the parts together at boot;
//! [`turn_loop`] is the one loop (one `select!`, the phase as data) that runs
//! claude for each message through the [`claude`] actor and carries out what
//! the pure [`policy`] decides; [`work`] holds the message in flight (its
//! requeue-on-drop guard) and what retries need; [`poller`] owns the
//! broker connections (through the credential under isolated `hive up`).
//! [`classify`] turns one claude process's stream-json into an outcome,
//! [`prompt`] renders the system prompt, [`context`] resolves the context
//! window, watermarks and fixed prompts, [`bus`] holds the live state and
//! events, [`control`] is how the web UI asks things of the loop,
//! [`login`] owns credentials and the login park, [`stats`] the turn-stats db,
//! [`accounting`] the loop's spend rows, pool reports and `turn_usd`,
//! [`pool`] what identifies the credential (its usage-limit pool),
//! [`files`] the private modes of the harness's own files, [`forge`] the
//! Forgejo notification poller and [`settings`] every flag and environment
//! variable.

pub mod accounting;
pub mod bus;
pub mod classify;
pub mod claude;
pub mod context;
pub mod control;
pub mod files;
pub mod forge;
pub mod invocation;
pub mod login;
pub mod plugins;
pub mod policy;
pub mod poller;
pub mod pool;
pub mod prompt;
pub mod serve;
pub mod settings;
pub mod stats;
pub mod turn_loop;
pub mod turnstats;
pub mod work;
