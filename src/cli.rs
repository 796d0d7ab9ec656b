//! Command-line parsing: turns `argv` into a plain [`Command`] with no side
//! effects (nothing is opened or read here, environment defaults are resolved
//! later), and owns the usage text of every command. Tested from literal vectors.

use crate::wire::excerpt;
use lexopt::prelude::*;
use std::ffi::OsString;
use std::path::PathBuf;

/// One entry of the command table: name, one-line summary, usage text.
pub struct CommandHelp {
    pub name: &'static str,
    pub summary: &'static str,
    pub usage: &'static str,
}

pub const COMMANDS: &[CommandHelp] = &[
    CommandHelp {
        name: "up",
        summary: "run a whole hive: the broker and one supervised `hive serve` per agent",
        usage: "hive up [--config FILE] [--data DIR]

  --config FILE       the fleet file (JSON, see docs/fleet.md); without it a one-agent
                      hive (`ruth`) whose fleet file is DIR/hive.json
  --data DIR          where everything lives: broker.db, run/ (sockets), agents/NAME/,
                      logs/NAME.log (default ./hive-data)

Prints each agent's page. Ctrl-C or SIGTERM stops every agent (inflight messages
are requeued), then the broker. Operator commands find DIR/run/host.sock through
--socket or HIVE_HOST_SOCKET (./hive-data/run/host.sock is found by itself).",
    },
    CommandHelp {
        name: "broker",
        summary: "run the host-side message broker (sqlite store, one socket per agent)",
        usage: "hive broker [--state-dir DIR] [--run-dir DIR] [--agents a,b,...] [--config FILE] [--durability normal|full]

  --state-dir DIR     where broker.db lives (default ./hive-state)
  --run-dir DIR       where sockets are made: RUN/host.sock, RUN/agents/NAME/mcp.sock (default ./hive-run)
  --agents a,b,...    agents to serve (root agents with default settings)
  --config FILE       the hive config (JSON, see docs/config.md)
  --durability MODE   normal (survives a crash of any process, default) or full (also power loss)",
    },
    CommandHelp {
        name: "serve",
        summary: "run the agent harness: the turn loop that drives claude for each inbox message",
        usage: "hive serve [--state-dir DIR] [--run-dir DIR]

  --state-dir DIR     the agent's durable state dir, claude's cwd (default /state)
  --run-dir DIR       where the on-boot files are written (default /run/hive)

The agent socket comes from $HIVE_SOCKET (default /run/hive/mcp.sock); every other
setting is an environment variable listed in docs/env.md.",
    },
    CommandHelp {
        name: "mcp",
        summary: "the agent's hyperhive MCP server on stdin/stdout (claude starts it)",
        usage: "hive mcp

Speaks MCP (newline-delimited JSON-RPC) on stdin and stdout; logs go to stderr.
The tools are described in docs/tools/mcp.md. Settings come from the environment:

  HIVE_SOCKET         the agent socket (default /run/hive/mcp.sock)
  HIVE_STATE_DIR      the agent's state dir, for request_next_turn and set_status
  HIVE_TOOL_GROUPS    comma list of tool groups (default messaging,meta,inbox,execution)",
    },
    CommandHelp {
        name: "wake",
        summary: "push one message into the agent's own inbox (for scripts and daemons)",
        usage: "hive wake --from NAME --body TEXT [--transient] [--socket PATH]

  --from NAME         who the message is from (shown to the agent); not one of the
                      names the broker speaks as (operator, system, self, parent,
                      broker, reminder, scheduler), no control characters
  --body TEXT         the message, at most 64 KiB; `-` reads it from stdin
  --transient         deliver without storing it (lost if the broker restarts)
  --socket PATH       the agent socket (default $HIVE_SOCKET or /run/hive/mcp.sock)",
    },
    CommandHelp {
        name: "send",
        summary: "operator: send a message to an agent",
        usage: "hive send --to AGENT [--reply-to ID] [--socket PATH] [--json] TEXT

  --to AGENT          the agent to message
  --reply-to ID       the message id this answers
  --socket PATH       the host socket (default $HIVE_HOST_SOCKET or /run/hive/host.sock)
  --json              print the broker's answer as JSON
  TEXT                the message, at most 64 KiB; `-` reads it from stdin",
    },
    CommandHelp {
        name: "inbox",
        summary: "operator: print unread messages to the operator and mark them read",
        usage: "hive inbox [--wait SECONDS] [--peek] [--socket PATH] [--json]

  --wait SECONDS      wait up to this long for a message when none is unread
  --peek              leave the messages unread
  --socket PATH       the host socket (default $HIVE_HOST_SOCKET or /run/hive/host.sock)
  --json              print JSON for scripts

Messages come in pages; each page is marked read only after it was printed, so
`hive inbox | head` or a broken connection loses nothing. Control characters
in a message are printed as visible escapes (\\x1b, \\u{202e}).",
    },
    CommandHelp {
        name: "agents",
        summary: "operator: list agents with parent, unread, inflight and status",
        usage: "hive agents [--socket PATH] [--json]

  --socket PATH       the host socket (default $HIVE_HOST_SOCKET or /run/hive/host.sock)
  --json              print JSON for scripts",
    },
    CommandHelp {
        name: "questions",
        summary: "operator: list pending questions addressed to the operator",
        usage: "hive questions [--socket PATH] [--json]

  --socket PATH       the host socket (default $HIVE_HOST_SOCKET or /run/hive/host.sock)
  --json              print JSON for scripts",
    },
    CommandHelp {
        name: "answer",
        summary: "operator: answer a question (several values for a multi-choice one)",
        usage: "hive answer [--socket PATH] [--json] ID TEXT [TEXT...]

  ID                  the question id from `hive questions`
  TEXT                the answer: an option's value or free text; several are joined with \", \"
  --socket PATH       the host socket (default $HIVE_HOST_SOCKET or /run/hive/host.sock)",
    },
    CommandHelp {
        name: "bash-daemon",
        summary: "run the background bash task daemon alone (hive serve embeds it)",
        usage: "hive bash-daemon [--state-dir DIR] [--socket PATH] [--agent-socket PATH] [--bash-env FILE]

  --state-dir DIR     tasks run here; records and output in DIR/harness/bash-tasks
                      (default $HIVE_STATE_DIR or /state)
  --socket PATH       where to listen (default $HIVE_BASH_SOCKET or /run/hive-bash/socket)
  --agent-socket PATH the agent's broker socket for completion wakes
                      (default $HIVE_SOCKET or /run/hive/mcp.sock)
  --bash-env FILE     run tasks with bash and BASH_ENV=FILE when FILE exists
                      (default $HIVE_BASH_ENV or /etc/hyperhive/bash-env.sh)
  SIGTERM kills the running tasks, records them interrupted and exits.",
    },
    CommandHelp {
        name: "bash-mcp",
        summary: "stdio MCP server `bash` (tools run, status) for claude; forwards to the task daemon",
        usage: "hive bash-mcp [--socket PATH]

  --socket PATH       the task daemon's socket (default $HIVE_BASH_SOCKET or /run/hive-bash/socket)",
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
        usage: "hive approvals [--socket PATH] [--json]",
    },
    CommandHelp {
        name: "approve",
        summary: "operator: approve and carry out a pending approval",
        usage: "hive approve [--socket PATH] [--json] ID",
    },
    CommandHelp {
        name: "deny",
        summary: "operator: deny a pending approval; the requester is told why",
        usage: "hive deny [--socket PATH] [--json] [--why TEXT] ID",
    },
    CommandHelp {
        name: "cancel-question",
        summary: "operator: withdraw a pending question (the asker gets [cancelled by operator])",
        usage: "hive cancel-question [--socket PATH] [--json] ID",
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

pub fn usage_of(cmd: &str) -> String {
    COMMANDS
        .iter()
        .find(|c| c.name == cmd)
        .map(|c| format!("Usage: {}\n", c.usage))
        .unwrap_or_else(main_usage)
}

#[derive(Debug, Clone, PartialEq)]
pub struct WakeArgs {
    pub from: String,
    /// `-` means stdin.
    pub body: String,
    pub transient: bool,
    pub socket: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct HostArgs {
    pub socket: Option<PathBuf>,
    pub json: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SendArgs {
    pub host: HostArgs,
    pub to: String,
    pub reply_to: Option<i64>,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct InboxArgs {
    pub host: HostArgs,
    pub wait: u64,
    pub peek: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DenyArgs {
    pub host: HostArgs,
    pub id: i64,
    pub why: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct AnswerArgs {
    pub host: HostArgs,
    pub id: i64,
    pub answer: Vec<String>,
}

/// How hard the broker's store works to keep a commit (`--durability`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Survives a crash of any process.
    Normal,
    /// Also survives power loss.
    Full,
}

impl Durability {
    fn parse(s: &str) -> Result<Durability, String> {
        match s {
            "normal" => Ok(Durability::Normal),
            "full" => Ok(Durability::Full),
            _ => Err(format!("--durability must be normal or full, not {s:?}")),
        }
    }
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

impl Default for ServeArgs {
    fn default() -> ServeArgs {
        ServeArgs {
            state_dir: PathBuf::from("/state"),
            run_dir: PathBuf::from("/run/hive"),
        }
    }
}

/// `hive up`; without `--data` the data dir is `./hive-data`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UpArgs {
    pub config: Option<PathBuf>,
    pub data: Option<PathBuf>,
}

/// `hive bash-daemon`; unset values come from the environment or defaults.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BashDaemonArgs {
    pub state_dir: Option<PathBuf>,
    pub socket: Option<PathBuf>,
    pub agent_socket: Option<PathBuf>,
    pub bash_env: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `--help`, for the named command or the whole binary.
    Help(Option<&'static str>),
    Version,
    Broker(BrokerArgs),
    Up(UpArgs),
    Approvals(HostArgs),
    Approve(HostArgs, i64),
    Deny(DenyArgs),
    Serve(ServeArgs),
    /// `hive mcp`: its settings come from the environment.
    Mcp,
    Wake(WakeArgs),
    Send(SendArgs),
    Inbox(InboxArgs),
    Agents(HostArgs),
    Questions(HostArgs),
    Answer(AnswerArgs),
    CancelQuestion(HostArgs, i64),
    BashDaemon(BashDaemonArgs),
    /// `hive bash-mcp [--socket PATH]`.
    BashMcp(Option<PathBuf>),
    /// `hive env-script`: print the bash environment script.
    EnvScript,
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

fn err(cmd: &str, message: impl Into<String>) -> UsageError {
    let mut message = message.into();
    if let Some((i, _)) = message.char_indices().nth(MAX_MESSAGE_CHARS) {
        message.truncate(i);
        message.push('…');
    }
    UsageError {
        message,
        usage: usage_of(cmd),
    }
}

fn lex(cmd: &str, e: lexopt::Error) -> UsageError {
    err(cmd, e.to_string())
}

fn string(cmd: &str, v: OsString) -> Result<String, UsageError> {
    v.into_string().map_err(|v| {
        let shown = excerpt(&v.to_string_lossy());
        err(cmd, format!("argument {shown} is not valid UTF-8"))
    })
}

fn number<T: std::str::FromStr>(cmd: &str, flag: &str, v: OsString) -> Result<T, UsageError> {
    let s = string(cmd, v)?;
    s.parse()
        .map_err(|_| err(cmd, format!("{flag} needs a number, got {}", excerpt(&s))))
}

/// Parses the arguments after the program name.
pub fn parse(args: Vec<OsString>) -> Result<Command, UsageError> {
    let mut p = lexopt::Parser::from_args(args);
    let first = match p.next().map_err(|e| lex("", e))? {
        None => return Err(err("", "no command given")),
        Some(Long("help")) | Some(Short('h')) => return Ok(Command::Help(None)),
        Some(Long("version")) | Some(Short('V')) => return Ok(Command::Version),
        Some(Value(v)) => string("", v)?,
        Some(other) => return Err(err("", other.unexpected().to_string())),
    };
    if first == "help" {
        let topic = p.next().ok().flatten().and_then(|a| match a {
            Value(v) => v.into_string().ok(),
            _ => None,
        });
        let found = topic.and_then(|t| COMMANDS.iter().find(|c| c.name == t).map(|c| c.name));
        return Ok(Command::Help(found));
    }
    let Some(entry) = COMMANDS.iter().find(|c| c.name == first) else {
        return Err(err("", format!("unknown command {}", excerpt(&first))));
    };
    let cmd = entry.name;
    match cmd {
        "broker" => parse_broker(&mut p),
        "up" => {
            let mut a = UpArgs::default();
            while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
                match arg {
                    Long("help") | Short('h') => return Ok(Command::Help(Some(cmd))),
                    Long("config") => a.config = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
                    Long("data") => a.data = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
                    other => return Err(err(cmd, other.unexpected().to_string())),
                }
            }
            Ok(Command::Up(a))
        }
        "approvals" | "approve" | "deny" => parse_approval(cmd, &mut p),
        "serve" => parse_serve(&mut p),
        "mcp" => match p.next().map_err(|e| lex(cmd, e))? {
            None => Ok(Command::Mcp),
            Some(Long("help") | Short('h')) => Ok(Command::Help(Some(cmd))),
            Some(other) => Err(err(cmd, other.unexpected().to_string())),
        },
        "wake" => parse_wake(&mut p),
        "env-script" => match p.next().map_err(|e| lex(cmd, e))? {
            None => Ok(Command::EnvScript),
            Some(Long("help") | Short('h')) => Ok(Command::Help(Some(cmd))),
            Some(other) => Err(err(cmd, other.unexpected().to_string())),
        },
        "send" => parse_send(&mut p),
        "inbox" => parse_inbox(&mut p),
        "agents" | "questions" => {
            let mut host = HostArgs::default();
            while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
                if matches!(arg, Long("help") | Short('h')) {
                    return Ok(Command::Help(Some(cmd)));
                }
                match arg {
                    Long("socket") => {
                        host.socket = Some(p.value().map_err(|e| lex(cmd, e))?.into())
                    }
                    Long("json") => host.json = true,
                    other => return Err(err(cmd, other.unexpected().to_string())),
                }
            }
            Ok(if cmd == "agents" {
                Command::Agents(host)
            } else {
                Command::Questions(host)
            })
        }
        "answer" | "cancel-question" => parse_answer(cmd, &mut p),
        "bash-daemon" => parse_bash_daemon(&mut p),
        "bash-mcp" => {
            let mut socket = None;
            while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
                match arg {
                    Long("help") | Short('h') => return Ok(Command::Help(Some(cmd))),
                    Long("socket") => socket = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
                    other => return Err(err(cmd, other.unexpected().to_string())),
                }
            }
            Ok(Command::BashMcp(socket))
        }
        _ => Err(err("", format!("unknown command {}", excerpt(&first)))),
    }
}

fn parse_broker(p: &mut lexopt::Parser) -> Result<Command, UsageError> {
    let cmd = "broker";
    let mut a = BrokerArgs {
        state_dir: PathBuf::from("hive-state"),
        run_dir: PathBuf::from("hive-run"),
        agents: Vec::new(),
        config: None,
        durability: Durability::Normal,
    };
    while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
        match arg {
            Long("help") | Short('h') => return Ok(Command::Help(Some(cmd))),
            Long("state-dir") => a.state_dir = p.value().map_err(|e| lex(cmd, e))?.into(),
            Long("run-dir") => a.run_dir = p.value().map_err(|e| lex(cmd, e))?.into(),
            Long("config") => a.config = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
            Long("agents") => {
                let v = string(cmd, p.value().map_err(|e| lex(cmd, e))?)?;
                a.agents.extend(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(String::from),
                );
            }
            Long("durability") => {
                let v = string(cmd, p.value().map_err(|e| lex(cmd, e))?)?;
                a.durability = Durability::parse(&v).map_err(|e| err(cmd, e))?;
            }
            other => return Err(err(cmd, other.unexpected().to_string())),
        }
    }
    Ok(Command::Broker(a))
}

fn parse_bash_daemon(p: &mut lexopt::Parser) -> Result<Command, UsageError> {
    let cmd = "bash-daemon";
    let mut a = BashDaemonArgs::default();
    while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
        match arg {
            Long("help") | Short('h') => return Ok(Command::Help(Some(cmd))),
            Long("state-dir") => a.state_dir = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
            Long("socket") => a.socket = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
            Long("agent-socket") => {
                a.agent_socket = Some(p.value().map_err(|e| lex(cmd, e))?.into())
            }
            Long("bash-env") => a.bash_env = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
            other => return Err(err(cmd, other.unexpected().to_string())),
        }
    }
    Ok(Command::BashDaemon(a))
}

fn parse_serve(p: &mut lexopt::Parser) -> Result<Command, UsageError> {
    let cmd = "serve";
    let mut a = ServeArgs::default();
    while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
        match arg {
            Long("help") | Short('h') => return Ok(Command::Help(Some(cmd))),
            Long("state-dir") => a.state_dir = p.value().map_err(|e| lex(cmd, e))?.into(),
            Long("run-dir") => a.run_dir = p.value().map_err(|e| lex(cmd, e))?.into(),
            other => return Err(err(cmd, other.unexpected().to_string())),
        }
    }
    Ok(Command::Serve(a))
}

fn parse_wake(p: &mut lexopt::Parser) -> Result<Command, UsageError> {
    let cmd = "wake";
    let (mut from, mut body, mut transient, mut socket) = (None, None, false, None);
    while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
        match arg {
            Long("help") | Short('h') => return Ok(Command::Help(Some(cmd))),
            Long("from") => from = Some(string(cmd, p.value().map_err(|e| lex(cmd, e))?)?),
            Long("body") => body = Some(string(cmd, p.value().map_err(|e| lex(cmd, e))?)?),
            Long("transient") => transient = true,
            Long("socket") => socket = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
            other => return Err(err(cmd, other.unexpected().to_string())),
        }
    }
    Ok(Command::Wake(WakeArgs {
        from: from.ok_or_else(|| err(cmd, "missing --from NAME"))?,
        body: body.ok_or_else(|| err(cmd, "missing --body TEXT (or --body - for stdin)"))?,
        transient,
        socket,
    }))
}

fn parse_send(p: &mut lexopt::Parser) -> Result<Command, UsageError> {
    let cmd = "send";
    let mut host = HostArgs::default();
    let (mut to, mut reply_to, mut text) = (None, None, Vec::new());
    while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
        match arg {
            Long("socket") => host.socket = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Ok(Command::Help(Some(cmd))),
            Long("to") => to = Some(string(cmd, p.value().map_err(|e| lex(cmd, e))?)?),
            Long("reply-to") => {
                reply_to = Some(number(
                    cmd,
                    "--reply-to",
                    p.value().map_err(|e| lex(cmd, e))?,
                )?)
            }
            Value(v) => text.push(string(cmd, v)?),
            other => return Err(err(cmd, other.unexpected().to_string())),
        }
    }
    if text.is_empty() {
        return Err(err(cmd, "missing TEXT (or - for stdin)"));
    }
    Ok(Command::Send(SendArgs {
        host,
        to: to.ok_or_else(|| err(cmd, "missing --to AGENT"))?,
        reply_to,
        text: text.join(" "),
    }))
}

fn parse_inbox(p: &mut lexopt::Parser) -> Result<Command, UsageError> {
    let cmd = "inbox";
    let mut a = InboxArgs {
        host: HostArgs::default(),
        wait: 0,
        peek: false,
    };
    while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
        match arg {
            Long("socket") => a.host.socket = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
            Long("json") => a.host.json = true,
            Long("help") | Short('h') => return Ok(Command::Help(Some(cmd))),
            Long("wait") => a.wait = number(cmd, "--wait", p.value().map_err(|e| lex(cmd, e))?)?,
            Long("peek") => a.peek = true,
            other => return Err(err(cmd, other.unexpected().to_string())),
        }
    }
    Ok(Command::Inbox(a))
}

fn parse_approval(cmd: &'static str, p: &mut lexopt::Parser) -> Result<Command, UsageError> {
    let mut host = HostArgs::default();
    let (mut id, mut why) = (None, None);
    while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
        match arg {
            Long("socket") => host.socket = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Ok(Command::Help(Some(cmd))),
            Long("why") if cmd == "deny" => {
                why = Some(string(cmd, p.value().map_err(|e| lex(cmd, e))?)?)
            }
            Value(v) if cmd != "approvals" && id.is_none() => {
                let v = string(cmd, v)?;
                id =
                    Some(v.trim_start_matches('#').parse::<i64>().map_err(|_| {
                        err(cmd, format!("ID must be a number, got {}", excerpt(&v)))
                    })?);
            }
            other => return Err(err(cmd, other.unexpected().to_string())),
        }
    }
    if cmd == "approvals" {
        return Ok(Command::Approvals(host));
    }
    let id = id.ok_or_else(|| err(cmd, "missing ID"))?;
    Ok(if cmd == "approve" {
        Command::Approve(host, id)
    } else {
        Command::Deny(DenyArgs { host, id, why })
    })
}

fn parse_answer(cmd: &'static str, p: &mut lexopt::Parser) -> Result<Command, UsageError> {
    let mut host = HostArgs::default();
    let mut values = Vec::new();
    while let Some(arg) = p.next().map_err(|e| lex(cmd, e))? {
        match arg {
            Long("socket") => host.socket = Some(p.value().map_err(|e| lex(cmd, e))?.into()),
            Long("json") => host.json = true,
            Long("help") | Short('h') => return Ok(Command::Help(Some(cmd))),
            Value(v) => values.push(string(cmd, v)?),
            other => return Err(err(cmd, other.unexpected().to_string())),
        }
    }
    let mut values = values.into_iter();
    let id = values.next().ok_or_else(|| err(cmd, "missing ID"))?;
    let id: i64 = id
        .trim_start_matches('#')
        .parse()
        .map_err(|_| err(cmd, format!("ID must be a number, got {}", excerpt(&id))))?;
    if cmd == "cancel-question" {
        if let Some(extra) = values.next() {
            return Err(err(cmd, format!("unexpected argument {}", excerpt(&extra))));
        }
        return Ok(Command::CancelQuestion(host, id));
    }
    let answer: Vec<String> = values.collect();
    if answer.is_empty() {
        return Err(err(cmd, "missing TEXT"));
    }
    Ok(Command::Answer(AnswerArgs { host, id, answer }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from).collect())
    }

    #[test]
    fn parses_every_command() {
        assert_eq!(run(&["--version"]).unwrap(), Command::Version);
        assert_eq!(
            run(&["wake", "--help"]).unwrap(),
            Command::Help(Some("wake"))
        );
        let Command::Broker(b) = run(&[
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
            Command::Wake(WakeArgs {
                from: "cron".into(),
                body: "-".into(),
                transient: false,
                socket: None
            })
        );
        let Command::Send(s) = run(&["send", "--to", "ruth", "hello", "there"]).unwrap() else {
            panic!("not send")
        };
        assert_eq!((s.to.as_str(), s.text.as_str()), ("ruth", "hello there"));
        let Command::Answer(a) = run(&["answer", "#4", "yes", "no", "--json"]).unwrap() else {
            panic!("not answer")
        };
        assert_eq!((a.id, a.answer.len(), a.host.json), (4, 2, true));
        assert_eq!(run(&["mcp"]).unwrap(), Command::Mcp);
        assert_eq!(run(&["mcp", "-h"]).unwrap(), Command::Help(Some("mcp")));
        assert_eq!(
            run(&["cancel-question", "7"]).unwrap(),
            Command::CancelQuestion(HostArgs::default(), 7)
        );
        assert_eq!(
            run(&["bash-daemon", "--state-dir", "s", "--socket", "b.sock"]).unwrap(),
            Command::BashDaemon(BashDaemonArgs {
                state_dir: Some("s".into()),
                socket: Some("b.sock".into()),
                ..BashDaemonArgs::default()
            })
        );
        assert_eq!(
            run(&["bash-mcp", "--socket", "b.sock"]).unwrap(),
            Command::BashMcp(Some("b.sock".into()))
        );
        assert_eq!(run(&["bash-mcp"]).unwrap(), Command::BashMcp(None));
        assert_eq!(run(&["env-script"]).unwrap(), Command::EnvScript);
        assert_eq!(
            run(&["up", "--config", "h.json", "--data", "d"]).unwrap(),
            Command::Up(UpArgs {
                config: Some("h.json".into()),
                data: Some("d".into())
            })
        );
        assert_eq!(
            run(&["approve", "#3"]).unwrap(),
            Command::Approve(HostArgs::default(), 3)
        );
        assert_eq!(
            run(&["deny", "4", "--why", "not now"]).unwrap(),
            Command::Deny(DenyArgs {
                host: HostArgs::default(),
                id: 4,
                why: Some("not now".into())
            })
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
            (&["answer", "x", "y"], "must be a number"),
            (&["mcp", "--socket", "x"], "--socket"),
            (&["bash-mcp", "--state-dir", "x"], "--state-dir"),
            (&["bash-daemon", "--socket"], "--socket"),
            (&["env-script", "x"], "x"),
            (&["approve"], "missing ID"),
            (&["deny", "x"], "must be a number"),
            (&["up", "--agents", "a"], "--agents"),
        ];
        for (args, want) in cases {
            let e = run(args).unwrap_err();
            assert!(e.message.contains(want), "{args:?}: {}", e.message);
            assert!(e.usage.contains("Usage"), "{args:?}");
        }
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
}
