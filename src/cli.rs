//! The command line, in the lexopt idiom: [`parse`] turns `argv` into one
//! [`Cmd`] holding a plain argument struct per subcommand, with no side effects
//! (nothing is opened or read here; flags are resolved against the environment
//! and the defaults afterwards, in `main` or next to each module's settings).
//! Each subcommand has one parser returning `lexopt::Error`; the command's name
//! and usage are attached once, in [`parse`]. The usage texts are built from
//! the same constants as the defaults. `cli` imports no module it configures.
//! Tested from literal vectors.

use crate::proto::paths;
use crate::proto::text::{excerpt, parse_time};
use lexopt::prelude::*;
use lexopt::Parser;
use std::ffi::OsString;
use std::path::PathBuf;

/// `hive up`'s data dir without `--data`, relative to where it starts.
pub const DEFAULT_DATA_DIR: &str = "hive-data";
/// `hive broker`'s state dir without `--state-dir`.
pub const BROKER_STATE_DIR: &str = "hive-state";
/// `hive broker`'s run dir without `--run-dir`.
pub const BROKER_RUN_DIR: &str = "hive-run";
/// `hive matrix-bridge`'s socket without `--socket`, under the broker's run
/// dir.
pub const BRIDGE_SOCKET: &str = "bridge.sock";
/// `hive matrix-bridge`'s state dir without `--state-dir`, under the
/// broker's state dir.
pub const BRIDGE_STATE: &str = "matrix";
/// `hive serve`'s run dir without `--run-dir` (its state dir is
/// [`paths::DEFAULT_STATE_DIR`]).
pub const SERVE_RUN_DIR: &str = "/run/hive";

/// One entry of the command table: name, one-line summary, usage text. In the
/// usage, `{NAME}` stands for a default (`defaults()`).
pub struct CommandHelp {
    pub name: &'static str,
    pub summary: &'static str,
    usage: &'static str,
}

/// The defaults the usage texts show, each from the constant the code uses.
fn defaults() -> [(&'static str, String); 12] {
    [
        (
            "{HOST_SOCKET}",
            format!(
                "$HIVE_HOST_SOCKET, else\n{:22}./{} if it exists, else {}",
                "",
                paths::UP_HOST_SOCKET,
                paths::DEFAULT_HOST_SOCKET
            ),
        ),
        (
            "{AGENT_SOCKET}",
            format!("$HIVE_SOCKET or {}", paths::DEFAULT_AGENT_SOCKET),
        ),
        (
            "{BASH_SOCKET}",
            format!("$HIVE_BASH_SOCKET or {}", paths::DEFAULT_BASH_SOCKET),
        ),
        (
            "{BASH_ENV}",
            format!("$HIVE_BASH_ENV or {}", paths::DEFAULT_BASH_ENV),
        ),
        (
            "{BASH_STATE}",
            format!("$HIVE_STATE_DIR or {}", paths::DEFAULT_STATE_DIR),
        ),
        ("{STATE_DIR}", paths::DEFAULT_STATE_DIR.to_string()),
        ("{RUN_DIR}", SERVE_RUN_DIR.to_string()),
        ("{DATA_DIR}", format!("./{DEFAULT_DATA_DIR}")),
        ("{BROKER_STATE}", format!("./{BROKER_STATE_DIR}")),
        ("{BROKER_RUN}", format!("./{BROKER_RUN_DIR}")),
        (
            "{BRIDGE_SOCKET}",
            format!("./{BROKER_RUN_DIR}/{BRIDGE_SOCKET}"),
        ),
        (
            "{BRIDGE_STATE}",
            format!("./{BROKER_STATE_DIR}/{BRIDGE_STATE}"),
        ),
    ]
}

pub const COMMANDS: &[CommandHelp] = &[
    CommandHelp {
        name: "up",
        summary: "run a whole hive: the broker and one supervised `hive serve` per agent",
        usage: "hive up [--config FILE] [--data DIR]

  --config FILE       the fleet file (JSON, see docs/fleet.md); without it a one-agent
                      hive (`ruth`) whose fleet file is DIR/hive.json
  --data DIR          where everything lives: broker.db, run/ (sockets), agents/NAME/,
                      logs/NAME.log (default {DATA_DIR})

Prints each agent's page. Ctrl-C or SIGTERM stops every agent (inflight messages
are requeued), then the broker. Operator commands find DIR/run/host.sock through
--socket or HIVE_HOST_SOCKET ({DATA_DIR}/run/host.sock is found by itself).",
    },
    CommandHelp {
        name: "broker",
        summary: "run the host-side message broker (sqlite store, one socket per agent)",
        usage: "hive broker [--state-dir DIR] [--run-dir DIR] [--agents a,b,...] [--config FILE] [--durability normal|full]

  --state-dir DIR     where broker.db lives (default {BROKER_STATE})
  --run-dir DIR       where sockets are made: RUN/host.sock, RUN/agents/NAME/mcp.sock (default {BROKER_RUN})
  --agents a,b,...    agents to serve (root agents with default settings)
  --config FILE       the hive config (JSON, see docs/config.md)
  --durability MODE   normal (survives a crash of any process, default) or full (also power loss)",
    },
    CommandHelp {
        name: "matrix-bridge",
        summary: "join the hive to its swarm through a Matrix homeserver (the fleet file's matrix section)",
        usage: "hive matrix-bridge [--socket PATH] [--state-dir DIR]

  --socket PATH       the broker's bridge socket (default {BRIDGE_SOCKET}; hive up
                      passes DATA/run/bridge.sock)
  --state-dir DIR     where the Matrix access token is kept, 0600 (default {BRIDGE_STATE})

The broker hands the bridge the hive's name and the fleet file's matrix section.
`hive up` runs the bridge itself when the fleet file has a matrix section; see
docs/swarm.md. Exits 2 when the homeserver refuses the Matrix login.",
    },
    CommandHelp {
        name: "serve",
        summary: "run the agent harness: the turn loop that drives claude for each inbox message",
        usage: "hive serve [--state-dir DIR] [--run-dir DIR]

  --state-dir DIR     the agent's durable state dir, claude's cwd (default {STATE_DIR})
  --run-dir DIR       where the on-boot files are written (default {RUN_DIR})

The agent socket is {AGENT_SOCKET}; every other setting is an environment
variable listed in docs/env.md.",
    },
    CommandHelp {
        name: "mcp",
        summary: "the agent's hyperhive MCP server on stdin/stdout (claude starts it)",
        usage: "hive mcp

Speaks MCP (newline-delimited JSON-RPC) on stdin and stdout; logs go to stderr.
The tools are described in docs/tools/mcp.md. Settings come from the environment:

  HIVE_SOCKET         the agent socket (default {AGENT_SOCKET})
  HIVE_STATE_DIR      the agent's state dir, for request_next_turn and set_status
  HIVE_TOOL_GROUPS    comma list of tool groups (default messaging,meta,inbox,execution)
  HIVE_CAPABILITIES   comma list of capabilities (read_host_journal lists get_host_journal)",
    },
    CommandHelp {
        name: "wake",
        summary: "push one message into the agent's own inbox (for scripts and daemons)",
        usage: "hive wake [--to AGENT] --from NAME --body TEXT [--transient] [--traceparent TP]
          [--socket PATH]

  --to AGENT          wake AGENT through the operator's host socket (default
                      {HOST_SOCKET}); without it, the agent
                      whose socket this is
  --from NAME         who the message is from (shown to the agent); not one of the
                      names the broker speaks as (operator, system, self, parent,
                      broker, reminder, scheduler), no control characters
  --body TEXT         the message, at most 64 KiB; `-` reads it from stdin
  --transient         deliver without storing it (lost if the broker restarts)
  --traceparent TP    the W3C traceparent of what sent it (00-TRACEID-SPANID-FLAGS):
                      the agent's run links to that span (docs/observability.md)
  --socket PATH       the agent socket (default {AGENT_SOCKET}),
                      or with --to the host socket",
    },
    CommandHelp {
        name: "send",
        summary: "operator: send a message to an agent",
        usage: "hive send --to AGENT [--reply-to ID] [--traceparent TP] [--socket PATH] [--json] TEXT

  --to AGENT          the agent to message
  --reply-to ID       the message id this answers
  --traceparent TP    the W3C traceparent the agent's run links to
  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print the broker's answer as JSON
  TEXT                the message, at most 64 KiB; `-` reads it from stdin",
    },
    CommandHelp {
        name: "inbox",
        summary: "operator: print unread messages to the operator and mark them read",
        usage: "hive inbox [--wait SECONDS] [--peek] [--socket PATH] [--json]

  --wait SECONDS      wait up to this long for a message when none is unread
  --peek              leave the messages unread
  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print JSON for scripts

Messages come in pages; each page is marked read only after it was printed, so
`hive inbox | head` or a broken connection loses nothing. Control characters
in a message are printed as visible escapes (\\x1b, \\u{202e}).",
    },
    CommandHelp {
        name: "agents",
        summary: "operator: list agents with parent, unread, inflight, dead letters, state and status",
        usage: "hive agents [--socket PATH] [--json]

  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print JSON for scripts

STATE is why the agent's harness (or the broker) makes it wait (rate_limit,
usage_limit — its credential pool's —, budget, api_backoff, login, mcp_start,
start_failed; with the time it goes on by itself), else what the
supervisor of `hive up` says (running, stopped, restarting, …; * when it runs
an old binary or fleet entry), else whether a harness is connected. FAILED
counts its dead letters (`hive failed`).",
    },
    CommandHelp {
        name: "failed",
        summary: "operator: list dead letters (messages a harness gave up on after its attempt limit)",
        usage: "hive failed [--agent NAME] [--socket PATH] [--json]

  --agent NAME        only the dead letters of this agent
  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print the broker's answer as JSON (whole bodies)

A dead letter is a message that failed HIVE_TURN_MAX_ATTEMPTS times for
reasons of its own (claude crashing, a hung turn, too long for any session…).
It is kept until `hive retry ID` puts it back; bodies are shown cut.",
    },
    CommandHelp {
        name: "retry",
        summary: "operator: put a dead letter back at the tail of its agent's queue",
        usage: "hive retry [--socket PATH] [--json] ID

  ID                  the message id from `hive failed`
  --socket PATH       the host socket (default {HOST_SOCKET})

Its attempts start over. Any message that is not a dead letter is refused
(`message #ID is queued, not failed`).",
    },
    // issue 43: receipts
    CommandHelp {
        name: "message",
        summary: "operator: what became of one message (queued, handed out, acked, dead-lettered, …)",
        usage: "hive message [--socket PATH] [--json] ID

  ID                  the message id (`send` answers it; `hive failed`, the
                      inbox and the agent pages show them)
  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print the broker's answer as JSON

One line from the broker's rows: queued (its position in the recipient's
queue), handed out (when; to a turn or to recv), acked (when; the turn the
harness reported), dead-lettered (the reason); for NAME@HIVE, handed to the
bridge, posted to the swarm room or bounced; pruned once retention deleted
the row. An agent reads its own sends with the MCP tool message_state.",
    },
    // issue 40: the operator lifts a pause
    CommandHelp {
        name: "resume",
        summary: "operator: lift an agent's pause, or a credential pool's usage-limit park, now",
        usage: "hive resume [--socket PATH] [--json] AGENT
hive resume [--socket PATH] [--json] --pool POOL

  AGENT               the agent whose pause ends (`hive agents` shows its STATE)
  --pool POOL         the credential pool whose usage-limit park ends (the POOL
                      column of `hive agents`: key:…, uuid:…, account:NAME, agent:NAME)
  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print the broker's answer as JSON

Per reason: usage_limit ends the park of the agent's whole pool (its agents
resume one a second, the oldest queued mail first; no report parks it again
for 10 minutes); rate_limit, api_backoff, mcp_start and start_failed make the
harness try again at once. budget is refused with the limit reached: raise it
(`hive budget set`) or wait for the window to roll over. login is refused:
log the agent in on its page's login form, or give it ANTHROPIC_API_KEY. An
agent that is not paused is refused, saying what it does (exit 1).",
    },
    // issue 16: budgets
    CommandHelp {
        name: "budget",
        summary: "operator: spend against budgets this window (UTC); `hive budget set` changes one",
        usage: "hive budget [--socket PATH] [--json]
hive budget set AGENT|--hive [--usd N|none] [--tokens N|none] [--per day|week|month] [--socket PATH]
hive budget void AGENT|--hive [--socket PATH] [--json]

  AGENT               the agent whose budget changes (its fleet entry's `budget`)
  --hive              the whole hive's budget (the fleet file's top-level `budget`)
  --usd N|none        dollars per window (`total_cost_usd`: the API-equivalent
                      price for subscription users); none removes the limit
  --tokens N|none     tokens per window (input + cache writes + output); none
                      removes the limit
  --per WINDOW        day (default), week (from Monday) or month, in UTC
  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print the broker's answer as JSON

At 80 % of a limit the agent's parent (the operator for a root agent, or for
the hive) is told once; at 100 % the agent (every agent, for the hive) starts
no new run until the window rolls over or the budget is raised. The change is
written to the fleet file with the rule of the operator's other writes (a
conflicting hand edit is refused, nothing written).

One run counts at most $1000 and 10^9 tokens: a report above is kept clamped
and counted in CLAMPED (the operator is told once a day, naming the agent).
A scope whose spend cannot be added up shows its error, and its budget holds
its agents until the window ends. `void` removes the spend rows of an agent
(or, with --hive, of every agent) in the scope's current window, with a
notice: the budget counts from zero again.",
    },
    CommandHelp {
        name: "version",
        summary: "operator: this binary's version and revision, and the broker's",
        usage: "hive version [--socket PATH] [--json]

  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print the broker's answer as JSON",
    },
    CommandHelp {
        name: "questions",
        summary: "operator: list pending questions addressed to the operator",
        usage: "hive questions [--socket PATH] [--json]

  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print JSON for scripts",
    },
    CommandHelp {
        name: "answer",
        summary: "operator: answer a question (several values for a multi-choice one)",
        usage: "hive answer [--socket PATH] [--json] ID TEXT [TEXT...]

  ID                  the question id from `hive questions`
  TEXT                the answer: an option's value or free text; several are joined with \", \"
  --socket PATH       the host socket (default {HOST_SOCKET})",
    },
    CommandHelp {
        name: "search",
        summary: "operator: search every agent's turn history (hive up)",
        usage: "hive search [--agent A] [--since WHEN] [--limit N] [--socket PATH] [--json] WORDS…

  WORDS               every word must be in the turn; each is searched as a word
                      (quotes, -, *, NEAR, OR mean nothing special)
  --agent A           only agent A's history
  --since WHEN        only what happened since: 30m, 2h, 2d, 1w, or an RFC 3339 time
                      (2026-11-22T05:03:02Z)
  --limit N           at most N turns (1 to 200, default 20)
  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print the broker's answer as JSON

Prints the newest matching turns first: agent, time, turn, a link that opens the
turn on its agent's page, and the words around the match. `hive up` answers it
by asking each agent's page; under plain `hive broker` use the page's
/api/history (docs/web.md).",
    },
    CommandHelp {
        name: "history",
        summary: "operator: print an agent's turns, oldest first (hive up)",
        usage: "hive history [--since WHEN] [--socket PATH] [--json] AGENT

  AGENT               the agent whose turns to print
  --since WHEN        only turns started since: 30m, 2h, 2d, 1w, or an RFC 3339 time
  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              one turn per line as JSON (its events as the page's live
                      stream sends them)

Without --json each turn is a header (time, sender, outcome, duration, cost)
followed by its message, claude's text, tool calls and notes. The history holds
tool inputs and outputs, which may contain secrets.",
    },
    CommandHelp {
        name: "bash-daemon",
        summary: "run an agent's background bash task daemon on its own (hive up and the units do; a plain hive serve embeds it)",
        usage: "hive bash-daemon [--state-dir DIR] [--socket PATH] [--agent-socket PATH] [--bash-env FILE]

  --state-dir DIR     tasks run here; records and output in DIR/harness/bash-tasks
                      (default {BASH_STATE})
  --socket PATH       where to listen (default {BASH_SOCKET})
  --agent-socket PATH the agent's broker socket for completion wakes
                      (default {AGENT_SOCKET})
  --bash-env FILE     run tasks with bash and BASH_ENV=FILE when FILE exists
                      (default {BASH_ENV})
  SIGTERM kills the running tasks, records them interrupted and exits.",
    },
    CommandHelp {
        name: "bash-mcp",
        summary: "stdio MCP server `bash` (tools run, status) for claude; forwards to the task daemon",
        usage: "hive bash-mcp [--socket PATH]

  --socket PATH       the task daemon's socket (default {BASH_SOCKET})",
    },
    CommandHelp {
        name: "env-script",
        summary: "print the bash environment script for /etc/hyperhive/bash-env.sh (cargo short messages)",
        usage: "hive env-script

Prints the script that bash tasks source through BASH_ENV (install it as
/etc/hyperhive/bash-env.sh, or wherever $HIVE_BASH_ENV points). It defines a
`cargo` function that adds `--message-format short` to build, check, clippy, test,
run, doc, bench, install, rustc and fix; see docs/deploy.md.",
    },
    CommandHelp {
        name: "approvals",
        summary: "operator: list pending approvals (spawns and fleet-entry changes)",
        usage: "hive approvals [--socket PATH] [--json]

  --socket PATH       the host socket (default {HOST_SOCKET})",
    },
    CommandHelp {
        name: "approve",
        summary: "operator: approve and carry out a pending approval",
        usage: "hive approve [--socket PATH] [--json] ID

  --socket PATH       the host socket (default {HOST_SOCKET})",
    },
    CommandHelp {
        name: "deny",
        summary: "operator: deny a pending approval; the requester is told why",
        usage: "hive deny [--socket PATH] [--json] [--why TEXT] ID

  --socket PATH       the host socket (default {HOST_SOCKET})",
    },
    CommandHelp {
        name: "start",
        summary: "operator: start a stopped agent (any agent; it is no longer kept stopped)",
        usage: "hive start [--socket PATH] [--json] AGENT

  AGENT               the agent to start
  --socket PATH       the host socket (default {HOST_SOCKET})

Needs `hive up` (its supervisor); the dashboard's Start button is the same.",
    },
    CommandHelp {
        name: "stop",
        summary: "operator: stop an agent and keep it stopped, across restarts too",
        usage: "hive stop [--socket PATH] [--json] AGENT

  AGENT               the agent to stop (any agent, root agents too)
  --socket PATH       the host socket (default {HOST_SOCKET})

The agent's harness gets SIGTERM (its inflight message goes back to its inbox)
and it stays stopped, across restarts of `hive up` too, until `hive start AGENT`;
its mail keeps queueing. This is the `kill` tool of managers, for the operator.
Needs `hive up` (its supervisor).",
    },
    CommandHelp {
        name: "restart",
        summary: "operator: stop and start an agent with the config it runs",
        usage: "hive restart [--socket PATH] [--json] AGENT

  AGENT               the agent to restart (a stopped one starts)
  --socket PATH       the host socket (default {HOST_SOCKET})

Needs `hive up` (its supervisor).",
    },
    CommandHelp {
        name: "update",
        summary: "operator: restart an agent onto the current binary and its fleet-file entry",
        usage: "hive update [--socket PATH] [--json] AGENT
       hive update [--socket PATH] [--json] --all [--parallel N]

  AGENT               the agent to update (what a needs_update message asks for)
  --all               every agent whose binary or fleet-file entry changed
  --parallel N        with --all: at most N restarting at a time (default 2,
                      at most 64); the next starts once one has run its boot turn
  --socket PATH       the host socket (default {HOST_SOCKET})

The fleet file is read again and the agent restarts onto its entry there and
the hive binary on disk; `hive agents` shows it as rebuilding meanwhile. A turn
that runs ends first (at most HIVE_UP_STOP_GRACE_MS later). With --all, stopped
agents take their new entry and stay stopped. Needs `hive up` (its supervisor).",
    },
    CommandHelp {
        name: "reload",
        summary: "operator: apply the fleet file while the hive runs (add, change, remove agents)",
        usage: "hive reload [--socket PATH] [--json]

  --socket PATH       the host socket (default {HOST_SOCKET})

The fleet file is read again and must load whole (a bad file changes nothing;
the error names the entry and key). Added agents start; removed ones stop and
show as `removed` in `hive agents`, their queued mail kept (mail to them is
refused) until `hive forget AGENT`; changed ones restart onto their entry once
their turn ends (`budget`, `turn_usd` and `account` apply at once); every other
agent keeps running, its harness untouched. `hive_name`/`swarm_name` restart
every agent after its turn; `web`, `operator_gid`, `matrix` and `retention`
apply at the next start of `hive up`, which the answer says. This is the
systemd unit's ExecReload (SIGHUP still stops `hive up`). Needs `hive up`.",
    },
    CommandHelp {
        name: "forget",
        summary: "operator: drop an agent removed from the fleet; its kept mail becomes dead letters",
        usage: "hive forget [--socket PATH] [--json] AGENT

  AGENT               an agent `hive reload` removed (shown as `removed`)
  --socket PATH       the host socket (default {HOST_SOCKET})

Its queued mail becomes dead letters (`hive failed` lists them, `hive retry`
sends one again) and the broker's row of it goes; its data dir stays. An agent
still in the fleet file is refused: remove its entry and `hive reload` first.",
    },
    CommandHelp {
        name: "cancel-question",
        summary: "operator: withdraw a pending question (the asker gets [cancelled by operator])",
        usage: "hive cancel-question [--socket PATH] [--json] ID

  --socket PATH       the host socket (default {HOST_SOCKET})",
    },
    // issue 39: the operator's view of the agents' timers
    CommandHelp {
        name: "fleet",
        summary: "check a fleet file as hive up loads it, or merge a declared one (NixOS) into the one the hive runs with",
        usage: "hive fleet check FILE
hive fleet merge DECLARED --into FILE [--base BASE]

  check FILE          loads FILE as hive up does (every key, and the path keys
                      icon, static_dir, web_dist exist and are readable); exit 1
                      naming the entry and key otherwise
  merge DECLARED      installs a declared fleet file (e.g. the one a NixOS
                      rebuild generates) into FILE by the fleet file's three-way
                      rule: what the declaration changed since BASE is set, the
                      operator's own writes to FILE (approvals, permission
                      saves, `hive budget set`) stay; a key both changed is
                      refused by name and nothing is written
  --into FILE         the fleet file the hive runs with (created the first time)
  --base BASE         the declaration installed last, rewritten after each merge
                      (default FILE's DIR/NAME.declared.json)",
    },
    CommandHelp {
        name: "notify",
        summary: "operator: `test` sends a test event to each notify destination; `status` shows each one's last error",
        usage: "hive notify test [--socket PATH] [--json]
hive notify status [--socket PATH] [--json]

  test                queue a `test` event for every destination of the fleet
                      file's `notify` block (each takes it whatever its events)
  status              each destination (scheme and host only), its format, the
                      events waiting, its last success and its last error, and
                      its counts of deliveries, failed tries and dropped events
  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print the broker's answer as JSON

Destinations are set in the fleet file (`notify`, docs/config.md); what is
sent and how to verify it is in docs/observability.md.",
    },
    CommandHelp {
        name: "timers",
        summary: "operator: every agent's pending reminders and scheduled prompts; `cancel` cancels one",
        usage: "hive timers [--agent NAME] [--socket PATH] [--json]
hive timers cancel reminder|scheduled ID [--socket PATH] [--json]

  --agent NAME        only the timers of this agent
  reminder|scheduled  the kind of the timer: ids are per kind (reminder #3 and
                      scheduled #3 are two timers)
  ID                  the timer's id, as `hive timers` lists it
  --socket PATH       the host socket (default {HOST_SOCKET})
  --json              print the broker's answer as JSON

Each line shows the agent, the kind and id, the next delivery (UTC), the
period of a repeating prompt and the first line of its text. A repeating
prompt whose last copy is still unread (its agent stopped, paused or busy)
queues no new copy: the deliveries it skipped are counted (`skipped N`).
A cancelled timer's agent gets `[reminder #ID cancelled by operator]` (or
`[scheduled #ID …]`) in its inbox.",
    },
];

/// Text printed by `hive --help`.
pub fn main_usage() -> String {
    let mut s = String::from(
        "hive — keeps Claude Code agents alive as message-driven daemons\n\nUsage: hive <command> [options]\n       hive <command> --help\n       hive --version\n\nCommands:\n",
    );
    for c in COMMANDS {
        s.push_str(&format!("  {:<17} {}\n", c.name, c.summary));
    }
    s.push_str("\nLogging: RUST_LOG=debug|info|warn (default info) writes logs to stderr.\n");
    s
}

/// The usage of `cmd`, its defaults filled in; the whole binary's for an
/// unknown one.
pub fn usage_of(cmd: &str) -> String {
    let Some(c) = COMMANDS.iter().find(|c| c.name == cmd) else {
        return main_usage();
    };
    let mut text = format!("Usage: {}\n", c.usage);
    for (name, value) in defaults() {
        text = text.replace(name, &value);
    }
    text
}

/// How hard the broker's store works to keep a commit (`--durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Survives a crash of any process.
    Normal,
    /// Also survives power loss.
    Full,
}

/// `hive broker`.
#[derive(Debug, Clone, PartialEq)]
pub struct BrokerArgs {
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
    pub agents: Vec<String>,
    pub config: Option<PathBuf>,
    pub durability: Durability,
}

/// `hive serve`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeArgs {
    pub state_dir: PathBuf,
    pub run_dir: PathBuf,
}

/// `hive up`; without `--data` the data dir is [`DEFAULT_DATA_DIR`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpArgs {
    pub config: Option<PathBuf>,
    pub data: Option<PathBuf>,
}

/// `hive wake`.
#[derive(Debug, Clone, PartialEq)]
pub struct WakeArgs {
    /// The agent to wake through the host socket; `None`: the agent socket's.
    pub to: Option<String>,
    pub from: String,
    /// `-` means stdin.
    pub body: String,
    pub transient: bool,
    pub socket: Option<PathBuf>,
    /// `--traceparent`: the W3C trace context the agent's run links to.
    pub traceparent: Option<String>,
}

/// What every operator command takes: `--socket PATH` and `--json`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostArgs {
    pub socket: Option<PathBuf>,
    pub json: bool,
}

/// `hive send`.
#[derive(Debug, Clone, PartialEq)]
pub struct SendArgs {
    pub host: HostArgs,
    pub to: String,
    pub reply_to: Option<i64>,
    /// `-` means stdin.
    pub text: String,
    /// `--traceparent`: the W3C trace context the agent's run links to.
    pub traceparent: Option<String>,
}

/// `hive inbox`.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxArgs {
    pub host: HostArgs,
    pub wait: u64,
    pub peek: bool,
}

/// `hive failed`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FailedArgs {
    pub host: HostArgs,
    pub agent: Option<String>,
}

/// `hive timers` (issue 39): the list, or `cancel KIND ID`.
#[derive(Debug, Clone, PartialEq)]
pub enum TimersArgs {
    List {
        host: HostArgs,
        agent: Option<String>,
    },
    Cancel {
        host: HostArgs,
        kind: crate::proto::cmd::TimerKind,
        id: i64,
    },
}

/// `hive notify test|status` (issue 43).
#[derive(Debug, Clone, PartialEq)]
pub enum NotifyArgs {
    Test(HostArgs),
    Status(HostArgs),
}

/// `hive fleet check FILE` and `hive fleet merge DECLARED --into FILE`.
#[derive(Debug, Clone, PartialEq)]
pub enum FleetArgs {
    Check {
        file: PathBuf,
    },
    Merge {
        declared: PathBuf,
        into: PathBuf,
        base: Option<PathBuf>,
    },
}

/// `hive budget` (issue 16): the report, `set`, or `void` (issue 40).
#[derive(Debug, Clone, PartialEq)]
pub enum BudgetArgs {
    Show(HostArgs),
    Set(SetBudgetArgs),
    Void(VoidArgs),
}

/// `hive budget void AGENT|--hive`: the scope's spend rows of its current
/// window go.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VoidArgs {
    pub host: HostArgs,
    pub agent: Option<String>,
    pub hive: bool,
}

/// `hive budget set AGENT|--hive …`; `Some(None)` is `none` (remove).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SetBudgetArgs {
    pub host: HostArgs,
    pub agent: Option<String>,
    pub hive: bool,
    pub usd: Option<Option<f64>>,
    pub tokens: Option<Option<u64>>,
    pub per: Option<crate::proto::Per>,
}

/// An operator command on one id: `hive approve`, `hive cancel-question`,
/// `hive resume AGENT` or `hive resume --pool POOL`: exactly one of the two.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ResumeArgs {
    pub host: HostArgs,
    pub agent: Option<String>,
    pub pool: Option<String>,
}

/// `hive retry`, `hive message`.
#[derive(Debug, Clone, PartialEq)]
pub struct IdArgs {
    pub host: HostArgs,
    pub id: i64,
}

/// An operator command on one agent: `hive start`, `stop`, `restart`,
/// `update`.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentArgs {
    pub host: HostArgs,
    pub name: String,
}

/// What an operator lifecycle command does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    Start,
    Stop,
    Restart,
    Update,
}

/// `hive deny`.
#[derive(Debug, Clone, PartialEq)]
pub struct DenyArgs {
    pub host: HostArgs,
    pub id: i64,
    pub why: Option<String>,
}

/// `hive answer`.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerArgs {
    pub host: HostArgs,
    pub id: i64,
    pub answer: Vec<String>,
}

/// `--since`: a span back from now, or a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Since {
    /// This many seconds before the command runs.
    Ago(u64),
    /// This unix time.
    At(i64),
}

impl Since {
    /// The unix time it names, `now` being the time the command runs.
    pub fn resolve(self, now: i64) -> i64 {
        match self {
            Since::Ago(secs) => now.saturating_sub(secs.min(i64::MAX as u64) as i64),
            Since::At(t) => t,
        }
    }
}

/// `hive search`.
#[derive(Debug, Clone, PartialEq)]
pub struct SearchArgs {
    pub host: HostArgs,
    pub words: String,
    pub agent: Option<String>,
    pub since: Option<Since>,
    pub limit: Option<u32>,
}

/// `hive history`.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryArgs {
    pub host: HostArgs,
    pub agent: String,
    pub since: Option<Since>,
}

/// `hive bash-daemon`; unset values come from the environment or defaults.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BashDaemonArgs {
    pub state_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    pub agent_socket: Option<PathBuf>,
    pub bash_env: Option<PathBuf>,
}

/// `hive matrix-bridge`; unset values are the defaults.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MatrixBridgeArgs {
    pub socket: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
}

/// `hive bash-mcp`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BashMcpArgs {
    pub socket: Option<PathBuf>,
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq)]
pub enum Cmd {
    /// `--help`, for the named command or the whole binary.
    Help(Option<&'static str>),
    Version,
    Up(UpArgs),
    Broker(BrokerArgs),
    Serve(ServeArgs),
    /// `hive mcp`: its settings come from the environment.
    Mcp,
    Wake(WakeArgs),
    Send(SendArgs),
    Inbox(InboxArgs),
    Agents(HostArgs),
    Failed(FailedArgs),
    Retry(IdArgs),
    Message(IdArgs),
    Resume(ResumeArgs),
    Budget(BudgetArgs),
    Questions(HostArgs),
    /// `hive version`: this binary's version and the broker's.
    Versions(HostArgs),
    Answer(AnswerArgs),
    CancelQuestion(IdArgs),
    /// `hive timers` and `hive timers cancel KIND ID`.
    Timers(TimersArgs),
    Notify(NotifyArgs),
    Approvals(HostArgs),
    Approve(IdArgs),
    Deny(DenyArgs),
    /// `hive start|stop|restart|update AGENT`.
    Lifecycle(Lifecycle, AgentArgs),
    /// `hive update --all [--parallel N]`.
    UpdateAll {
        host: HostArgs,
        parallel: Option<u32>,
    },
    /// `hive reload`: the fleet file applied while the hive runs.
    Reload(HostArgs),
    /// `hive forget AGENT`: a removed agent's kept mail dead-lettered.
    Forget(AgentArgs),
    Search(SearchArgs),
    History(HistoryArgs),
    BashDaemon(BashDaemonArgs),
    BashMcp(BashMcpArgs),
    MatrixBridge(MatrixBridgeArgs),
    /// `hive env-script`: print the bash environment script.
    EnvScript,
    /// `hive fleet check|merge`.
    Fleet(FleetArgs),
}

/// A command line that cannot be run: the message and the usage to print.
#[derive(Debug, PartialEq)]
pub struct UsageError {
    pub message: String,
    pub usage: String,
}

/// Longest usage error, in characters: a message that quotes a huge argument
/// (lexopt's do) is cut.
const MAX_MESSAGE_CHARS: usize = 200;

fn usage_error(cmd: &str, e: impl ToString) -> UsageError {
    let mut message = e.to_string();
    if let Some((i, _)) = message.char_indices().nth(MAX_MESSAGE_CHARS) {
        message.truncate(i);
        message.push('…');
    }
    UsageError {
        message,
        usage: usage_of(cmd),
    }
}

/// Parses the arguments after the program name.
pub fn parse(args: Vec<OsString>) -> Result<Cmd, UsageError> {
    let mut p = Parser::from_args(args);
    let first = match p.next().map_err(|e| usage_error("", e))? {
        None => return Err(usage_error("", "no command given")),
        Some(Long("help") | Short('h')) => return Ok(Cmd::Help(None)),
        Some(Long("version") | Short('V')) => return Ok(Cmd::Version),
        Some(Value(v)) => utf8(v).map_err(|e| usage_error("", e))?,
        Some(other) => return Err(usage_error("", other.unexpected())),
    };
    if first == "help" {
        let topic = p.next().ok().flatten().and_then(|a| match a {
            Value(v) => v.into_string().ok(),
            _ => None,
        });
        let found = topic.and_then(|t| COMMANDS.iter().find(|c| c.name == t).map(|c| c.name));
        return Ok(Cmd::Help(found));
    }
    let Some(name) = COMMANDS.iter().map(|c| c.name).find(|n| *n == first) else {
        return Err(usage_error(
            "",
            format!("unknown command {}", excerpt(&first)),
        ));
    };
    let parsed = match name {
        "up" => parse_up(&mut p),
        "broker" => parse_broker(&mut p),
        "serve" => parse_serve(&mut p),
        "mcp" => no_arguments(&mut p, Cmd::Mcp),
        "wake" => parse_wake(&mut p),
        "send" => parse_send(&mut p),
        "inbox" => parse_inbox(&mut p),
        "agents" => parse_host(&mut p).map(Cmd::Agents),
        "failed" => parse_failed(&mut p),
        "retry" => parse_id(&mut p).map(Cmd::Retry),
        "message" => parse_id(&mut p).map(Cmd::Message),
        "resume" => parse_resume(&mut p),
        "budget" => parse_budget(&mut p),
        "questions" => parse_host(&mut p).map(Cmd::Questions),
        "version" => parse_host(&mut p).map(Cmd::Versions),
        "answer" => parse_answer(&mut p),
        "cancel-question" => parse_id(&mut p).map(Cmd::CancelQuestion),
        "timers" => parse_timers(&mut p),
        "notify" => parse_notify(&mut p),
        "approvals" => parse_host(&mut p).map(Cmd::Approvals),
        "approve" => parse_id(&mut p).map(Cmd::Approve),
        "deny" => parse_deny(&mut p),
        "start" => parse_agent(&mut p).map(|a| Cmd::Lifecycle(Lifecycle::Start, a)),
        "stop" => parse_agent(&mut p).map(|a| Cmd::Lifecycle(Lifecycle::Stop, a)),
        "restart" => parse_agent(&mut p).map(|a| Cmd::Lifecycle(Lifecycle::Restart, a)),
        "update" => parse_update(&mut p),
        "reload" => parse_host(&mut p).map(Cmd::Reload),
        "forget" => parse_agent(&mut p).map(Cmd::Forget),
        "search" => parse_search(&mut p),
        "history" => parse_history(&mut p),
        "bash-daemon" => parse_bash_daemon(&mut p),
        "bash-mcp" => parse_bash_mcp(&mut p),
        "matrix-bridge" => parse_matrix_bridge(&mut p),
        "env-script" => no_arguments(&mut p, Cmd::EnvScript),
        "fleet" => parse_fleet(&mut p),
        _ => Err(format!("unknown command {}", excerpt(&first)).into()),
    };
    match parsed {
        // A subcommand's `--help` names the subcommand.
        Err(lexopt::Error::Custom(e)) if e.is::<WantsHelp>() => Ok(Cmd::Help(Some(name))),
        parsed => parsed.map_err(|e| usage_error(name, e)),
    }
}

/// `--help` after a subcommand, raised as an error so every parser can stop at
/// it with `?`; [`parse`] turns it into [`Cmd::Help`].
#[derive(Debug)]
struct WantsHelp;

impl std::fmt::Display for WantsHelp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("--help")
    }
}

impl std::error::Error for WantsHelp {}

fn help() -> lexopt::Error {
    lexopt::Error::Custom(Box::new(WantsHelp))
}

/// A value as UTF-8, or an error quoting a short prefix of it.
fn utf8(v: OsString) -> Result<String, lexopt::Error> {
    v.into_string().map_err(|v| {
        let shown = excerpt(&v.to_string_lossy());
        format!("argument {shown} is not valid UTF-8").into()
    })
}

/// A number for `flag`, or an error naming the flag.
fn number<T: std::str::FromStr>(flag: &str, v: OsString) -> Result<T, lexopt::Error> {
    let s = utf8(v)?;
    s.parse().map_err(|_| {
        // Say which rule the value broke: `-1` is a number, just not one
        // this flag takes.
        let why = match s.trim().parse::<f64>() {
            Ok(n) if n < 0.0 => "cannot be negative",
            Ok(n) if n.fract() != 0.0 => "needs a whole number",
            Ok(_) => "is larger than it can be",
            Err(_) => "needs a number",
        };
        format!("{flag} {why}, got {}", excerpt(&s)).into()
    })
}

/// An `ID` argument (`#4` is `4`).
fn id(v: OsString) -> Result<i64, lexopt::Error> {
    let s = utf8(v)?;
    s.trim_start_matches('#')
        .parse()
        .map_err(|_| format!("ID must be a number, got {}", excerpt(&s)).into())
}

fn no_arguments(p: &mut Parser, cmd: Cmd) -> Result<Cmd, lexopt::Error> {
    match p.next()? {
        None => Ok(cmd),
        Some(Long("help") | Short('h')) => Err(help()),
        Some(other) => Err(other.unexpected()),
    }
}

fn parse_up(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut a = UpArgs::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("help") | Short('h') => return Err(help()),
            Long("config") => a.config = Some(p.value()?.into()),
            Long("data") => a.data = Some(p.value()?.into()),
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::Up(a))
}

fn parse_broker(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut a = BrokerArgs {
        state_dir: PathBuf::from(BROKER_STATE_DIR),
        run_dir: PathBuf::from(BROKER_RUN_DIR),
        agents: Vec::new(),
        config: None,
        durability: Durability::Normal,
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("help") | Short('h') => return Err(help()),
            Long("state-dir") => a.state_dir = p.value()?.into(),
            Long("run-dir") => a.run_dir = p.value()?.into(),
            Long("config") => a.config = Some(p.value()?.into()),
            Long("agents") => {
                let v = utf8(p.value()?)?;
                a.agents.extend(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                );
            }
            Long("durability") => {
                a.durability = match utf8(p.value()?)?.as_str() {
                    "normal" => Durability::Normal,
                    "full" => Durability::Full,
                    v => {
                        return Err(format!("--durability must be normal or full, not {v:?}").into())
                    }
                }
            }
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::Broker(a))
}

fn parse_serve(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut a = ServeArgs {
        state_dir: PathBuf::from(paths::DEFAULT_STATE_DIR),
        run_dir: PathBuf::from(SERVE_RUN_DIR),
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("help") | Short('h') => return Err(help()),
            Long("state-dir") => a.state_dir = p.value()?.into(),
            Long("run-dir") => a.run_dir = p.value()?.into(),
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::Serve(a))
}

fn parse_wake(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let (mut from, mut body, mut transient, mut socket) = (None, None, false, None);
    let (mut to, mut traceparent) = (None, None);
    while let Some(arg) = p.next()? {
        match arg {
            Long("help") | Short('h') => return Err(help()),
            Long("to") => to = Some(utf8(p.value()?)?),
            Long("traceparent") => traceparent = Some(utf8(p.value()?)?),
            Long("from") => from = Some(utf8(p.value()?)?),
            Long("body") => body = Some(utf8(p.value()?)?),
            Long("transient") => transient = true,
            Long("socket") => socket = Some(p.value()?.into()),
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::Wake(WakeArgs {
        to,
        from: from.ok_or("missing --from NAME")?,
        body: body.ok_or("missing --body TEXT (or --body - for stdin)")?,
        transient,
        socket,
        traceparent,
    }))
}

fn parse_send(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut host = HostArgs::default();
    let (mut to, mut reply_to, mut text) = (None, None, Vec::new());
    let mut traceparent = None;
    while let Some(arg) = p.next()? {
        match arg {
            Long("traceparent") => traceparent = Some(utf8(p.value()?)?),
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Long("to") => to = Some(utf8(p.value()?)?),
            Long("reply-to") => reply_to = Some(number("--reply-to", p.value()?)?),
            Value(v) => text.push(utf8(v)?),
            other => return Err(other.unexpected()),
        }
    }
    if text.is_empty() {
        return Err("missing TEXT (or - for stdin)".into());
    }
    Ok(Cmd::Send(SendArgs {
        host,
        to: to.ok_or("missing --to AGENT")?,
        reply_to,
        text: text.join(" "),
        traceparent,
    }))
}

fn parse_inbox(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut a = InboxArgs {
        host: HostArgs::default(),
        wait: 0,
        peek: false,
    };
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => a.host.socket = Some(p.value()?.into()),
            Long("json") => a.host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Long("wait") => a.wait = number("--wait", p.value()?)?,
            Long("peek") => a.peek = true,
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::Inbox(a))
}

/// `hive agents`, `hive questions`, `hive approvals`: only the host flags.
fn parse_host(p: &mut Parser) -> Result<HostArgs, lexopt::Error> {
    let mut host = HostArgs::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            other => return Err(other.unexpected()),
        }
    }
    Ok(host)
}

fn parse_failed(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut a = FailedArgs::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => a.host.socket = Some(p.value()?.into()),
            Long("json") => a.host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Long("agent") => a.agent = Some(utf8(p.value()?)?),
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::Failed(a))
}

/// `hive notify test|status` (issue 43).
fn parse_notify(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut host = HostArgs::default();
    let mut sub: Option<bool> = None;
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Value(v) if sub.is_none() && v == "test" => sub = Some(true),
            Value(v) if sub.is_none() && v == "status" => sub = Some(false),
            other => return Err(other.unexpected()),
        }
    }
    match sub {
        Some(true) => Ok(Cmd::Notify(NotifyArgs::Test(host))),
        Some(false) => Ok(Cmd::Notify(NotifyArgs::Status(host))),
        None => Err("hive notify: give `test` or `status`".into()),
    }
}

/// `hive timers [--agent NAME]`, `hive timers cancel KIND ID` (issue 39).
fn parse_timers(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    use crate::proto::cmd::TimerKind;
    let mut host = HostArgs::default();
    let mut agent = None;
    let mut cancel = false;
    let mut kind = None;
    let mut the_id = None;
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Long("agent") if !cancel && agent.is_none() => agent = Some(utf8(p.value()?)?),
            Value(v) if !cancel && agent.is_none() && v == "cancel" => cancel = true,
            Value(v) if cancel && kind.is_none() => {
                let v = utf8(v)?;
                kind = Some(
                    TimerKind::parse(&v)
                        .map_err(|e| lexopt::Error::from(format!("hive timers cancel: {e}")))?,
                );
            }
            Value(v) if cancel && the_id.is_none() => the_id = Some(id(v)?),
            other => return Err(other.unexpected()),
        }
    }
    if !cancel {
        return Ok(Cmd::Timers(TimersArgs::List { host, agent }));
    }
    match (kind, the_id) {
        (Some(kind), Some(id)) => Ok(Cmd::Timers(TimersArgs::Cancel { host, kind, id })),
        _ => Err("hive timers cancel: give the kind (reminder or scheduled) and the ID, as `hive timers` lists them".into()),
    }
}

/// `hive fleet check FILE` or `hive fleet merge DECLARED --into FILE [--base B]`.
fn parse_fleet(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut sub: Option<String> = None;
    let mut file: Option<PathBuf> = None;
    let mut into = None;
    let mut base = None;
    while let Some(arg) = p.next()? {
        match arg {
            Long("help") | Short('h') => return Err(help()),
            Value(v) if sub.is_none() => sub = Some(utf8(v)?),
            Value(v) if file.is_none() => file = Some(v.into()),
            Long("into") if sub.as_deref() == Some("merge") => into = Some(p.value()?.into()),
            Long("base") if sub.as_deref() == Some("merge") => base = Some(p.value()?.into()),
            other => return Err(other.unexpected()),
        }
    }
    match (sub.as_deref(), file, into) {
        (Some("check"), Some(file), None) => Ok(Cmd::Fleet(FleetArgs::Check { file })),
        (Some("merge"), Some(declared), Some(into)) => Ok(Cmd::Fleet(FleetArgs::Merge {
            declared,
            into,
            base,
        })),
        (Some("merge"), _, _) => {
            Err("hive fleet merge: give the declared file and --into FILE".into())
        }
        (Some("check"), _, _) => Err("hive fleet check: give the fleet file".into()),
        _ => Err("hive fleet: give check FILE or merge DECLARED --into FILE".into()),
    }
}

/// `hive budget [set|void AGENT|--hive …]` (issue 16, `void` issue 40).
fn parse_budget(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    #[derive(PartialEq)]
    enum Sub {
        Set,
        Void,
    }
    let mut host = HostArgs::default();
    let mut sub: Option<Sub> = None;
    let mut s = SetBudgetArgs::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Value(v) if sub.is_none() && v == "set" => sub = Some(Sub::Set),
            Value(v) if sub.is_none() && v == "void" => sub = Some(Sub::Void),
            Long("hive") if sub.is_some() => s.hive = true,
            Long(k @ ("usd" | "tokens" | "per")) if sub == Some(Sub::Set) => {
                let k = k.to_string();
                let v = utf8(p.value()?)?;
                match k.as_str() {
                    "usd" if v == "none" => s.usd = Some(None),
                    "usd" => match v.parse::<f64>() {
                        Ok(n) if n.is_finite() && n >= 0.0 => s.usd = Some(Some(n)),
                        _ => {
                            return Err(format!(
                                "--usd: {} is not a number of dollars (or none)",
                                excerpt(&v)
                            )
                            .into())
                        }
                    },
                    "tokens" if v == "none" => s.tokens = Some(None),
                    "tokens" => match v.parse::<u64>() {
                        Ok(n) => s.tokens = Some(Some(n)),
                        _ => {
                            return Err(format!(
                                "--tokens: {} is not a whole number (or none)",
                                excerpt(&v)
                            )
                            .into())
                        }
                    },
                    _ => {
                        s.per = Some(
                            crate::proto::Per::parse(&v)
                                .map_err(|e| lexopt::Error::from(format!("--per: {e}")))?,
                        )
                    }
                }
            }
            Value(v) if sub.is_some() && s.agent.is_none() && !s.hive => {
                s.agent = Some(utf8(v)?);
            }
            other => return Err(other.unexpected()),
        }
    }
    let Some(sub) = sub else {
        return Ok(Cmd::Budget(BudgetArgs::Show(host)));
    };
    let word = if sub == Sub::Set { "set" } else { "void" };
    if s.agent.is_none() && !s.hive {
        return Err(format!("hive budget {word}: name an AGENT, or --hive").into());
    }
    if s.agent.is_some() && s.hive {
        return Err(format!("hive budget {word}: name an AGENT or --hive, not both").into());
    }
    if sub == Sub::Void {
        return Ok(Cmd::Budget(BudgetArgs::Void(VoidArgs {
            host,
            agent: s.agent,
            hive: s.hive,
        })));
    }
    if s.usd.is_none() && s.tokens.is_none() && s.per.is_none() {
        return Err("hive budget set: give --usd, --tokens or --per".into());
    }
    s.host = host;
    Ok(Cmd::Budget(BudgetArgs::Set(s)))
}

/// `hive resume AGENT|--pool POOL`.
fn parse_resume(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut a = ResumeArgs::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => a.host.socket = Some(p.value()?.into()),
            Long("json") => a.host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Long("pool") if a.pool.is_none() => a.pool = Some(utf8(p.value()?)?),
            Value(v) if a.agent.is_none() => a.agent = Some(utf8(v)?),
            other => return Err(other.unexpected()),
        }
    }
    match (&a.agent, &a.pool) {
        (None, None) => Err("missing AGENT (or --pool POOL)".into()),
        (Some(_), Some(_)) => Err("name an AGENT or --pool POOL, not both".into()),
        _ => Ok(Cmd::Resume(a)),
    }
}

/// `hive approve ID`, `hive cancel-question ID`, `hive retry ID`,
/// `hive message ID`.
fn parse_id(p: &mut Parser) -> Result<IdArgs, lexopt::Error> {
    let mut host = HostArgs::default();
    let mut the_id = None;
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Value(v) if the_id.is_none() => the_id = Some(id(v)?),
            other => return Err(other.unexpected()),
        }
    }
    Ok(IdArgs {
        host,
        id: the_id.ok_or("missing ID")?,
    })
}

/// `hive start AGENT` and its kin.
fn parse_agent(p: &mut Parser) -> Result<AgentArgs, lexopt::Error> {
    let mut host = HostArgs::default();
    let mut name = None;
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Value(v) if name.is_none() => name = Some(utf8(v)?),
            other => return Err(other.unexpected()),
        }
    }
    Ok(AgentArgs {
        host,
        name: name.ok_or("missing AGENT")?,
    })
}

/// `hive update AGENT` or `hive update --all [--parallel N]`.
fn parse_update(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut host = HostArgs::default();
    let (mut name, mut all, mut parallel) = (None, false, None);
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Long("all") if name.is_none() => all = true,
            Long("parallel") => parallel = Some(number("--parallel", p.value()?)?),
            Value(v) if name.is_none() && !all => name = Some(utf8(v)?),
            other => return Err(other.unexpected()),
        }
    }
    match (name, all) {
        (Some(name), false) if parallel.is_none() => {
            Ok(Cmd::Lifecycle(Lifecycle::Update, AgentArgs { host, name }))
        }
        (Some(_), false) => Err("--parallel goes with --all, not with one AGENT".into()),
        (None, true) => Ok(Cmd::UpdateAll { host, parallel }),
        _ => Err("missing AGENT (or --all for every agent that needs it)".into()),
    }
}

fn parse_deny(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut host = HostArgs::default();
    let (mut the_id, mut why) = (None, None);
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Long("why") => why = Some(utf8(p.value()?)?),
            Value(v) if the_id.is_none() => the_id = Some(id(v)?),
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::Deny(DenyArgs {
        host,
        id: the_id.ok_or("missing ID")?,
        why,
    }))
}

fn parse_answer(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut host = HostArgs::default();
    let (mut the_id, mut answer) = (None, Vec::new());
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Value(v) if the_id.is_none() => the_id = Some(id(v)?),
            Value(v) => answer.push(utf8(v)?),
            other => return Err(other.unexpected()),
        }
    }
    let id = the_id.ok_or("missing ID")?;
    if answer.is_empty() {
        return Err("missing TEXT".into());
    }
    Ok(Cmd::Answer(AnswerArgs { host, id, answer }))
}

/// A `--since` value: `30m`, `2h`, `2d`, `1w` back from now, or an RFC 3339
/// time.
fn since(v: OsString) -> Result<Since, lexopt::Error> {
    let s = utf8(v)?;
    let t = s.trim();
    let unit = |c: char| match c {
        'm' => Some(60),
        'h' => Some(3600),
        'd' => Some(86400),
        'w' => Some(7 * 86400),
        _ => None,
    };
    if let Some(last) = t.chars().last() {
        let digits = &t[..t.len() - last.len_utf8()];
        if let (Some(u), Ok(n)) = (unit(last), digits.parse::<u64>()) {
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                return Ok(Since::Ago(n.saturating_mul(u)));
            }
        }
    }
    match parse_time(t) {
        Some(at) => Ok(Since::At(at)),
        None => Err(format!(
            "--since takes 30m, 2h, 2d, 1w or an RFC 3339 time like 2026-11-22T05:03:02Z, not {}",
            excerpt(&s)
        )
        .into()),
    }
}

fn parse_search(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut host = HostArgs::default();
    let (mut words, mut agent, mut when, mut limit) = (Vec::new(), None, None, None);
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Long("agent") => agent = Some(utf8(p.value()?)?),
            Long("since") => when = Some(since(p.value()?)?),
            Long("limit") => limit = Some(number("--limit", p.value()?)?),
            Value(v) => words.push(utf8(v)?),
            other => return Err(other.unexpected()),
        }
    }
    if words.is_empty() {
        return Err("missing WORDS to search for".into());
    }
    Ok(Cmd::Search(SearchArgs {
        host,
        words: words.join(" "),
        agent,
        since: when,
        limit,
    }))
}

fn parse_history(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut host = HostArgs::default();
    let (mut agent, mut when) = (None, None);
    while let Some(arg) = p.next()? {
        match arg {
            Long("socket") => host.socket = Some(p.value()?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Err(help()),
            Long("since") => when = Some(since(p.value()?)?),
            Value(v) if agent.is_none() => agent = Some(utf8(v)?),
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::History(HistoryArgs {
        host,
        agent: agent.ok_or("missing AGENT")?,
        since: when,
    }))
}

fn parse_bash_daemon(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut a = BashDaemonArgs::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("help") | Short('h') => return Err(help()),
            Long("state-dir") => a.state_dir = Some(p.value()?.into()),
            Long("socket") => a.socket = Some(p.value()?.into()),
            Long("agent-socket") => a.agent_socket = Some(p.value()?.into()),
            Long("bash-env") => a.bash_env = Some(p.value()?.into()),
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::BashDaemon(a))
}

fn parse_matrix_bridge(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut a = MatrixBridgeArgs::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("help") | Short('h') => return Err(help()),
            Long("socket") => a.socket = Some(p.value()?.into()),
            Long("state-dir") => a.state_dir = Some(p.value()?.into()),
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::MatrixBridge(a))
}

fn parse_bash_mcp(p: &mut Parser) -> Result<Cmd, lexopt::Error> {
    let mut a = BashMcpArgs::default();
    while let Some(arg) = p.next()? {
        match arg {
            Long("help") | Short('h') => return Err(help()),
            Long("socket") => a.socket = Some(p.value()?.into()),
            other => return Err(other.unexpected()),
        }
    }
    Ok(Cmd::BashMcp(a))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Cmd, UsageError> {
        parse(args.iter().map(OsString::from).collect())
    }

    #[test]
    fn parses_every_command() {
        assert_eq!(run(&["--version"]).unwrap(), Cmd::Version);
        assert_eq!(
            run(&["version", "--json"]).unwrap(),
            Cmd::Versions(HostArgs {
                socket: None,
                json: true
            })
        );
        assert_eq!(run(&["wake", "--help"]).unwrap(), Cmd::Help(Some("wake")));
        let Cmd::Broker(b) = run(&[
            "broker",
            "--state-dir",
            "s",
            "--run-dir",
            "r",
            "--agents",
            "a, b",
            "--durability",
            "full",
        ])
        .unwrap() else {
            panic!("not broker")
        };
        assert_eq!(b.agents, vec!["a", "b"]);
        assert_eq!(b.durability, Durability::Full);
        assert_eq!(
            run(&["wake", "--from", "cron", "--body", "-"]).unwrap(),
            Cmd::Wake(WakeArgs {
                to: None,
                from: "cron".into(),
                body: "-".into(),
                transient: false,
                socket: None,
                traceparent: None,
            })
        );
        let Cmd::Send(s) = run(&["send", "--to", "ruth", "hello", "there"]).unwrap() else {
            panic!("not send")
        };
        assert_eq!((s.to.as_str(), s.text.as_str()), ("ruth", "hello there"));
        let Cmd::Answer(a) = run(&["answer", "#4", "yes", "no", "--json"]).unwrap() else {
            panic!("not answer")
        };
        assert_eq!((a.id, a.answer.len(), a.host.json), (4, 2, true));
        assert_eq!(run(&["mcp"]).unwrap(), Cmd::Mcp);
        assert_eq!(run(&["mcp", "-h"]).unwrap(), Cmd::Help(Some("mcp")));
        assert_eq!(
            run(&["cancel-question", "7"]).unwrap(),
            Cmd::CancelQuestion(IdArgs {
                host: HostArgs::default(),
                id: 7
            })
        );
        assert_eq!(
            run(&["bash-daemon", "--state-dir", "s", "--socket", "b.sock"]).unwrap(),
            Cmd::BashDaemon(BashDaemonArgs {
                state_dir: Some("s".into()),
                socket: Some("b.sock".into()),
                ..BashDaemonArgs::default()
            })
        );
        assert_eq!(
            run(&["bash-mcp", "--socket", "b.sock"]).unwrap(),
            Cmd::BashMcp(BashMcpArgs {
                socket: Some("b.sock".into())
            })
        );
        assert_eq!(
            run(&["bash-mcp"]).unwrap(),
            Cmd::BashMcp(BashMcpArgs::default())
        );
        assert_eq!(run(&["env-script"]).unwrap(), Cmd::EnvScript);
        assert_eq!(
            run(&["fleet", "check", "h.json"]).unwrap(),
            Cmd::Fleet(FleetArgs::Check {
                file: "h.json".into()
            })
        );
        assert_eq!(
            run(&["fleet", "merge", "d.json", "--into", "h.json"]).unwrap(),
            Cmd::Fleet(FleetArgs::Merge {
                declared: "d.json".into(),
                into: "h.json".into(),
                base: None
            })
        );
        for bad in [
            &["fleet"][..],
            &["fleet", "merge", "d.json"],
            &["fleet", "check", "h.json", "--into", "x"],
        ] {
            assert!(run(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            run(&[
                "matrix-bridge",
                "--socket",
                "/r/bridge.sock",
                "--state-dir",
                "/s"
            ])
            .unwrap(),
            Cmd::MatrixBridge(MatrixBridgeArgs {
                socket: Some("/r/bridge.sock".into()),
                state_dir: Some("/s".into()),
            })
        );
        assert_eq!(
            run(&["up", "--config", "h.json", "--data", "d"]).unwrap(),
            Cmd::Up(UpArgs {
                config: Some("h.json".into()),
                data: Some("d".into())
            })
        );
        assert_eq!(
            run(&["approve", "#3"]).unwrap(),
            Cmd::Approve(IdArgs {
                host: HostArgs::default(),
                id: 3
            })
        );
        assert_eq!(
            run(&["deny", "4", "--why", "not now"]).unwrap(),
            Cmd::Deny(DenyArgs {
                host: HostArgs::default(),
                id: 4,
                why: Some("not now".into())
            })
        );
        for (word, what) in [
            ("start", Lifecycle::Start),
            ("stop", Lifecycle::Stop),
            ("restart", Lifecycle::Restart),
            ("update", Lifecycle::Update),
        ] {
            assert_eq!(
                run(&[word, "pal", "--json"]).unwrap(),
                Cmd::Lifecycle(
                    what,
                    AgentArgs {
                        host: HostArgs {
                            socket: None,
                            json: true
                        },
                        name: "pal".into()
                    }
                )
            );
        }
        let host = HostArgs {
            socket: None,
            json: false,
        };
        assert_eq!(
            run(&["update", "--all", "--parallel", "3"]).unwrap(),
            Cmd::UpdateAll {
                host: host.clone(),
                parallel: Some(3)
            }
        );
        assert_eq!(
            run(&["update", "--all"]).unwrap(),
            Cmd::UpdateAll {
                host: host.clone(),
                parallel: None
            }
        );
        assert_eq!(run(&["reload"]).unwrap(), Cmd::Reload(host.clone()));
        assert_eq!(
            run(&["forget", "cal"]).unwrap(),
            Cmd::Forget(AgentArgs {
                host,
                name: "cal".into()
            })
        );
        assert_eq!(
            run(&["approvals", "--json"]).unwrap(),
            Cmd::Approvals(HostArgs {
                socket: None,
                json: true
            })
        );
        assert_eq!(
            run(&["failed", "--agent", "ana", "--json"]).unwrap(),
            Cmd::Failed(FailedArgs {
                host: HostArgs {
                    socket: None,
                    json: true
                },
                agent: Some("ana".into())
            })
        );
        assert_eq!(
            run(&["resume", "ana"]).unwrap(),
            Cmd::Resume(ResumeArgs {
                host: HostArgs::default(),
                agent: Some("ana".into()),
                pool: None
            })
        );
        assert_eq!(
            run(&["resume", "--json", "--pool", "key:0a1b2c3d"]).unwrap(),
            Cmd::Resume(ResumeArgs {
                host: HostArgs {
                    socket: None,
                    json: true
                },
                agent: None,
                pool: Some("key:0a1b2c3d".into())
            })
        );
        assert_eq!(
            run(&["retry", "#12"]).unwrap(),
            Cmd::Retry(IdArgs {
                host: HostArgs::default(),
                id: 12
            })
        );
        assert_eq!(
            run(&["message", "--json", "#7"]).unwrap(),
            Cmd::Message(IdArgs {
                host: HostArgs {
                    socket: None,
                    json: true
                },
                id: 7
            })
        );
        assert_eq!(
            run(&["message", "--socket", "/tmp/h.sock", "42"]).unwrap(),
            Cmd::Message(IdArgs {
                host: HostArgs {
                    socket: Some("/tmp/h.sock".into()),
                    json: false
                },
                id: 42
            })
        );
        assert_eq!(
            run(&["serve"]).unwrap(),
            Cmd::Serve(ServeArgs {
                state_dir: paths::DEFAULT_STATE_DIR.into(),
                run_dir: SERVE_RUN_DIR.into()
            })
        );
    }

    #[test]
    fn search_and_history_take_words_agents_and_since() {
        let Cmd::Search(a) = run(&[
            "search", "deploy", "\"prod\"", "--agent", "ana", "--since", "2h", "--json",
        ])
        .unwrap() else {
            panic!("not search")
        };
        assert_eq!(a.words, "deploy \"prod\"");
        assert_eq!(a.agent.as_deref(), Some("ana"));
        assert_eq!(a.since, Some(Since::Ago(7200)));
        assert!(a.host.json);
        for (text, want) in [
            ("30m", Since::Ago(1800)),
            ("2d", Since::Ago(2 * 86400)),
            ("1w", Since::Ago(7 * 86400)),
            ("2026-11-22T05:03:02Z", Since::At(1_795_323_782)),
        ] {
            let Cmd::History(h) = run(&["history", "ana", "--since", text]).unwrap() else {
                panic!("not history")
            };
            assert_eq!((h.agent.as_str(), h.since), ("ana", Some(want)), "{text}");
        }
        assert_eq!(Since::Ago(60).resolve(1000), 940);
        assert_eq!(Since::At(5).resolve(1000), 5);
    }

    #[test]
    fn notify_test_and_status() {
        assert_eq!(
            run(&["notify", "test"]).unwrap(),
            Cmd::Notify(NotifyArgs::Test(HostArgs::default()))
        );
        assert_eq!(
            run(&["notify", "status", "--json"]).unwrap(),
            Cmd::Notify(NotifyArgs::Status(HostArgs {
                json: true,
                ..HostArgs::default()
            }))
        );
        assert_eq!(
            run(&["notify", "--help"]).unwrap(),
            Cmd::Help(Some("notify"))
        );
    }

    #[test]
    fn timers_list_and_cancel_by_kind_and_id() {
        use crate::proto::cmd::TimerKind;
        assert_eq!(
            run(&["timers", "--agent", "ana", "--json"]).unwrap(),
            Cmd::Timers(TimersArgs::List {
                host: HostArgs {
                    json: true,
                    ..HostArgs::default()
                },
                agent: Some("ana".into()),
            })
        );
        assert_eq!(
            run(&["timers", "cancel", "scheduled", "#4"]).unwrap(),
            Cmd::Timers(TimersArgs::Cancel {
                host: HostArgs::default(),
                kind: TimerKind::Scheduled,
                id: 4,
            })
        );
        assert_eq!(
            run(&["timers", "cancel", "--help"]).unwrap(),
            Cmd::Help(Some("timers"))
        );
    }

    #[test]
    fn bad_command_lines_say_why_with_usage() {
        let cases: &[(&[&str], &str)] = &[
            (&[], "no command"),
            (&["frob"], "unknown command"),
            (&["wake", "--from", "x"], "missing --body"),
            (&["wake", "--body", "x"], "missing --from"),
            (&["wake", "--bogus"], "--bogus"),
            (&["inbox", "--wait", "soon"], "needs a number"),
            (&["broker", "--durability", "max"], "normal or full"),
            (&["send", "--to", "a"], "missing TEXT"),
            (&["stop"], "missing AGENT"),
            (&["update", "a", "b"], "unexpected argument"),
            (&["update"], "missing AGENT (or --all"),
            (&["update", "--all", "pal"], "unexpected argument"),
            (
                &["update", "pal", "--parallel", "2"],
                "--parallel goes with --all",
            ),
            (
                &["update", "--all", "--parallel", "-1"],
                "--parallel cannot be negative",
            ),
            (&["forget"], "missing AGENT"),
            (&["reload", "pal"], "unexpected argument"),
            (&["answer", "x", "y"], "must be a number"),
            (&["mcp", "--socket", "x"], "--socket"),
            (&["bash-mcp", "--state-dir", "x"], "--state-dir"),
            (&["bash-daemon", "--socket"], "--socket"),
            (&["env-script", "x"], "x"),
            (&["approve"], "missing ID"),
            (&["deny", "x"], "must be a number"),
            (&["up", "--agents", "a"], "--agents"),
            (&["approvals", "3"], "3"),
            (&["cancel-question", "3", "4"], "4"),
            (&["deny", "--why"], "--why"),
            (&["retry"], "missing ID"),
            (&["resume"], "missing AGENT (or --pool POOL)"),
            (&["resume", "ana", "--pool", "key:0a1b2c3d"], "not both"),
            (&["resume", "ana", "bob"], "bob"),
            (&["resume", "--pool"], "--pool"),
            (&["retry", "twelve"], "must be a number"),
            (&["message"], "missing ID"),
            (&["notify"], "give `test` or `status`"),
            (&["notify", "tset"], "tset"),
            (&["message", "x"], "must be a number"),
            (&["message", "1", "2"], "2"),
            (&["message", "--agent", "a"], "--agent"),
            (&["failed", "--agent"], "--agent"),
            (&["failed", "ana"], "ana"),
            (&["search"], "missing WORDS"),
            (
                &["search", "x", "--since", "yesterday"],
                "--since takes 30m",
            ),
            (&["search", "x", "--since", "m"], "--since takes 30m"),
            (&["history"], "missing AGENT"),
            (&["history", "a", "b"], "b"),
            (&["history", "a", "--since", "5x"], "RFC 3339"),
            (
                &["timers", "cancel"],
                "give the kind (reminder or scheduled) and the ID",
            ),
            (&["timers", "cancel", "reminder"], "give the kind"),
            (
                &["timers", "cancel", "question", "3"],
                "unknown timer kind \"question\"; known kinds: reminder, scheduled",
            ),
            (&["timers", "cancel", "scheduled", "x"], "must be a number"),
            (&["timers", "ana"], "ana"),
        ];
        for (args, want) in cases {
            let e = run(args).unwrap_err();
            assert!(e.message.contains(want), "{args:?}: {}", e.message);
            assert!(e.usage.contains("Usage"), "{args:?}");
        }
        // The usage is the failing command's.
        let e = run(&["inbox", "--wait", "soon"]).unwrap_err();
        assert!(e.usage.starts_with("Usage: hive inbox"), "{}", e.usage);
    }

    #[test]
    fn errors_quote_a_short_prefix_of_a_huge_argument() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec([b"x\xff".repeat(2048), b"tail".to_vec()].concat());
        let cases = [
            vec![OsString::from("send"), OsString::from("--to"), bad.clone()],
            vec![
                OsString::from("wake"),
                OsString::from(format!("--{}", "y".repeat(4096))),
            ],
            vec![OsString::from("z".repeat(4096))],
            vec![
                OsString::from("inbox"),
                OsString::from("--wait"),
                OsString::from("9".repeat(4096) + "x"),
            ],
        ];
        for args in cases {
            let e = parse(args).unwrap_err();
            assert!(e.message.chars().count() <= 201, "{}", e.message);
            assert!(e.message.contains('…'), "{}", e.message);
        }
    }

    #[test]
    fn usage_texts_show_the_defaults_the_code_uses() {
        for c in COMMANDS {
            let u = usage_of(c.name);
            assert!(
                !u.contains('{') || u.contains("\\u{202e}"),
                "{}: {u}",
                c.name
            );
        }
        let send = usage_of("send");
        assert!(send.contains(paths::DEFAULT_HOST_SOCKET), "{send}");
        assert!(send.contains(paths::UP_HOST_SOCKET), "{send}");
        // `hive up`'s host socket under the default data dir is the one
        // operator commands look for.
        assert_eq!(
            paths::UP_HOST_SOCKET,
            format!("{DEFAULT_DATA_DIR}/run/host.sock")
        );
        assert!(usage_of("wake").contains(paths::DEFAULT_AGENT_SOCKET));
        assert!(usage_of("bash-mcp").contains(paths::DEFAULT_BASH_SOCKET));
        assert!(usage_of("bash-daemon").contains(paths::DEFAULT_BASH_ENV));
        assert!(usage_of("broker").contains(BROKER_STATE_DIR));
        assert!(usage_of("serve").contains(SERVE_RUN_DIR));
        assert!(usage_of("up").contains(DEFAULT_DATA_DIR));
        assert!(usage_of("matrix-bridge").contains("./hive-run/bridge.sock"));
        assert_eq!(
            PathBuf::from(BROKER_RUN_DIR).join(BRIDGE_SOCKET),
            paths::bridge_socket(std::path::Path::new(BROKER_RUN_DIR))
        );
    }

    /// `hive budget`: the report, `set` with each limit or `none`, and
    /// `void`, each naming one scope.
    #[test]
    fn budget_parses_show_set_and_void() {
        assert_eq!(
            run(&["budget", "--json"]).unwrap(),
            Cmd::Budget(BudgetArgs::Show(HostArgs {
                socket: None,
                json: true
            }))
        );
        let Cmd::Budget(BudgetArgs::Set(s)) =
            run(&["budget", "set", "ana", "--usd", "none", "--tokens", "500"]).unwrap()
        else {
            panic!("not set")
        };
        assert_eq!(
            (s.agent.as_deref(), s.hive, s.usd, s.tokens),
            (Some("ana"), false, Some(None), Some(Some(500)))
        );
        let Cmd::Budget(BudgetArgs::Set(s)) =
            run(&["budget", "set", "--hive", "--tokens", "none"]).unwrap()
        else {
            panic!("not set")
        };
        assert_eq!((s.hive, s.usd, s.tokens), (true, None, Some(None)));
        assert_eq!(
            run(&["budget", "void", "ana"]).unwrap(),
            Cmd::Budget(BudgetArgs::Void(VoidArgs {
                host: HostArgs::default(),
                agent: Some("ana".into()),
                hive: false
            }))
        );
        let Cmd::Budget(BudgetArgs::Void(v)) = run(&["budget", "void", "--hive"]).unwrap() else {
            panic!("not void")
        };
        assert!(v.hive && v.agent.is_none());
        for (bad, says) in [
            (&["budget", "void"][..], "name an AGENT, or --hive"),
            (&["budget", "void", "ana", "--hive"][..], "not both"),
            (&["budget", "set", "ana"][..], "give --usd"),
            (&["budget", "void", "ana", "--usd", "5"][..], "--usd"),
            (
                &["budget", "set", "ana", "--usd", "lots"][..],
                "not a number",
            ),
        ] {
            let e = run(bad).unwrap_err().message;
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
