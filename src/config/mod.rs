//! The hive config file: the one JSON schema for a whole hive, read by `hive
//! broker --config` and (extended, never forked) by `hive up`. This module owns
//! parsing, validation with errors that name the field, and the topology questions
//! answered from it (an agent's parent, its root, whom it may message). One
//! agent's entry is the contract's (`proto::fleet`). Documented in
//! `docs/config.md`.

pub mod fleetfile;
pub mod notify;

use crate::proto::access::{Capability, ToolGroup};
use crate::proto::address::{check_hive_name, check_remote, Remote};
use crate::proto::ident::check_name;
use crate::proto::text::excerpt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

pub use crate::proto::fleet::AgentConfig;
pub use crate::proto::swarm::MatrixConfig;

/// The whole hive.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HiveConfig {
    /// Shown as `on hive `NAME`` in prompts and returned by `get_agent_meta`;
    /// other hives of the swarm reach this one's agents as `NAME@HIVE`. The
    /// agent-name grammar (1 to 9 of `a-z`, `0-9`, `-`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hive_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swarm_name: Option<String>,
    /// Group id given to the host (operator) socket, which is then mode 0660.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator_gid: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub agents: Vec<AgentConfig>,
    /// Where [`HiveConfig::agent`] last found each agent in `agents`.
    #[serde(skip)]
    pub(crate) agent_at: AgentIndex,
    /// The swarm: the Matrix homeserver and room this hive's bridge joins
    /// (`docs/swarm.md`). Without it, mail to `NAME@HIVE` is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matrix: Option<MatrixConfig>,
    /// How long the broker keeps handled mail and spend rows, and how much
    /// each agent may store (issue 40; [`Retention`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Retention>,
    /// What the whole hive may spend per calendar window (issue 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::proto::Budget>,
    /// Where `hive up` serves the dashboard and every agent's page (issue 38).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web: Option<WebSection>,
    /// The most `claude` processes the whole hive runs at once (issue 42):
    /// a turn waits for a slot; none set, [`max_claude_default`] of the
    /// host's memory. Applies live on `hive reload`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_claude: Option<u32>,
    /// Where the broker pushes what needs the operator (issue 43; boxed: a
    /// fleet file without one stays small;
    /// [`notify::NotifySection`], `docs/config.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<Box<notify::NotifySection>>,
    /// Traces of every claude run (issue 43; [`TelemetrySection`]), boxed:
    /// most hives have none, and the config travels in channel messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<Box<TelemetrySection>>,
}

/// Where each agent was last found in [`HiveConfig::agents`]: a hint that
/// [`HiveConfig::agent`] checks, so it takes no part in a comparison, a copy
/// or the fleet file.
#[derive(Default)]
pub(crate) struct AgentIndex(std::sync::Mutex<std::collections::HashMap<String, usize>>);

impl Clone for AgentIndex {
    fn clone(&self) -> AgentIndex {
        AgentIndex::default()
    }
}

impl PartialEq for AgentIndex {
    fn eq(&self, _: &AgentIndex) -> bool {
        true
    }
}

impl std::fmt::Debug for AgentIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentIndex")
    }
}

// ---- telemetry (issue 43, item 1) -------------------------------------------

/// The fleet file's `telemetry` section: where `hive up` exports the spans
/// of every claude run (OTLP/HTTP JSON). Each key has its standard `OTEL_*`
/// variable, which wins when set in `hive up`'s environment
/// (`telemetry::Config::resolve`; `docs/config.md`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    /// `OTEL_EXPORTER_OTLP_ENDPOINT`: the collector's base URL (`/v1/traces`
    /// is appended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`: the traces URL, used as is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces_endpoint: Option<String>,
    /// `OTEL_EXPORTER_OTLP_HEADERS`: request headers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// `OTEL_SERVICE_NAME` (default `hive`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// `OTEL_RESOURCE_ATTRIBUTES`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resource_attributes: BTreeMap<String, String>,
    /// `OTEL_SDK_DISABLED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`: only `http/json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`: only `http/json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traces_protocol: Option<String>,
    /// Claude gets the endpoint and headers too (its own spans nest under
    /// the run's); agents then hold the headers (`docs/security.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cli: Option<bool>,
}

// ---- end of telemetry --------------------------------------------------------

/// The memory one real `claude` process takes, give or take: what
/// [`max_claude_default`] divides the host's available memory by.
pub const CLAUDE_MIB: u64 = 300;

/// `max_claude` where the fleet file sets none: `MemAvailable` of
/// `/proc/meminfo` at `hive up`'s start divided by [`CLAUDE_MIB`], at
/// least 1 (a host that does not say: 1 per [`CLAUDE_MIB`] of 4 GiB).
pub fn max_claude_default() -> u32 {
    static DEFAULT: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *DEFAULT.get_or_init(|| {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        max_claude_of(mem_available_kib(&meminfo).unwrap_or(4 << 20))
    })
}

/// `MemAvailable` of a `/proc/meminfo` text, in KiB.
pub fn mem_available_kib(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The default `max_claude` for `available_kib` of available memory.
pub fn max_claude_of(available_kib: u64) -> u32 {
    (available_kib / (CLAUDE_MIB * 1024)).clamp(1, u32::MAX as u64) as u32
}

/// `hive up`'s one listener, when the default does not do: the `web` key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSection {
    /// `IP:PORT` the dashboard and the agents' pages answer on
    /// ([`DEFAULT_LISTEN`]; port 0 takes a free one, for tests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `https://NAME[:PORT]`: where a reverse proxy serves the hive. The
    /// Host and Origin checks accept it, printed links use it, and it is what
    /// lets `listen` be an address other than loopback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_origin: Option<String>,
    /// `{"NAME": "IP:PORT"}`: agents whose page runs scripts of its own (a
    /// `frontend.dist`, an overlay's games), each served by `hive up` on a
    /// loopback listener of its own, an origin apart from the hive's
    /// (`docs/fleet.md`, *A page with scripts of its own*).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub script_pages: BTreeMap<String, String>,
}

/// Where `hive up` listens without a `web.listen`: the same address at every
/// start, so bookmarks, printed links and the login cookie keep working.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7890";

impl WebSection {
    /// `web.listen` as an address (the default without one).
    pub fn listen_addr(&self) -> Result<std::net::SocketAddr, String> {
        let text = self.listen.as_deref().unwrap_or(DEFAULT_LISTEN);
        text.trim().parse().map_err(|_| {
            format!(
                "web.listen: {} is not IP:PORT (for example {DEFAULT_LISTEN})",
                excerpt(text)
            )
        })
    }

    /// `web.public_origin` without a trailing slash, when set.
    pub fn origin(&self) -> Option<String> {
        self.public_origin
            .as_deref()
            .map(|o| o.trim().trim_end_matches('/').to_string())
    }

    /// The host (`NAME[:PORT]`) of `web.public_origin`, lowercase.
    pub fn origin_host(&self) -> Option<String> {
        self.origin()
            .and_then(|o| o.strip_prefix("https://").map(str::to_ascii_lowercase))
    }

    /// `web.script_pages` as addresses, each checked: loopback, and neither
    /// `web.listen`'s port nor another page's (port 0 takes a free one).
    pub fn script_page_addrs(&self) -> Result<Vec<(String, std::net::SocketAddr)>, String> {
        let listen = self.listen_addr()?;
        let mut out: Vec<(String, std::net::SocketAddr)> = Vec::new();
        for (name, text) in &self.script_pages {
            check_name(name).map_err(|e| format!("web.script_pages.{}: {e}", excerpt(name)))?;
            let key = format!("web.script_pages.{name}");
            let addr: std::net::SocketAddr = text.trim().parse().map_err(|_| {
                format!(
                    "{key}: {} is not IP:PORT (for example 127.0.0.1:7891)",
                    excerpt(text)
                )
            })?;
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "{key}: {addr} is not a loopback address: a page with scripts of its own \
                     is served on this host only (127.0.0.1:PORT)"
                ));
            }
            let taken = |p: u16| p != 0 && p == addr.port();
            if taken(listen.port()) || out.iter().any(|(_, a)| taken(a.port())) {
                return Err(format!(
                    "{key}: port {} is already web.listen's or another script page's; give \
                     each its own",
                    addr.port()
                ));
            }
            out.push((name.clone(), addr));
        }
        Ok(out)
    }

    fn check(&self) -> Result<(), String> {
        self.listen_addr()?;
        self.script_page_addrs()?;
        if let Some(o) = self.origin() {
            let bad = || {
                format!(
                    "web.public_origin: {} is not an origin: give https://NAME or \
                     https://NAME:PORT (no path, query or user)",
                    excerpt(&o)
                )
            };
            let host = o.strip_prefix("https://").ok_or_else(bad)?;
            let plain = |b: u8| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b);
            if host.is_empty() || !host.bytes().all(plain) || host.starts_with(':') {
                return Err(bad());
            }
        }
        Ok(())
    }
}

impl HiveConfig {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<HiveConfig, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        let cfg =
            HiveConfig::parse(&text).map_err(|e| format!("config {}: {e}", path.display()))?;
        cfg.check_paths()
            .map_err(|e| format!("config {}: {e}", path.display()))?;
        Ok(cfg)
    }

    /// The path keys of every entry (`icon`, `static_dir`, `web_dist`) name
    /// something that exists and this process can read: a file for `icon`,
    /// a directory for the others. Checked when a fleet file loads (at
    /// start, at a reload, by `hive fleet check`), not at each write of it.
    pub fn check_paths(&self) -> Result<(), String> {
        for (i, a) in self.agents.iter().enumerate() {
            for (key, path) in a.path_keys() {
                let at = format!("agents[{i}].{key}");
                let shown = excerpt(path);
                let want_dir = key != "icon";
                let meta = std::fs::metadata(path).map_err(|e| {
                    format!("{at}: {shown} cannot be read ({e}); give an existing, readable path or remove the key")
                })?;
                if meta.is_dir() != want_dir {
                    let what = if want_dir { "a directory" } else { "a file" };
                    return Err(format!("{at}: {shown} is not {what}"));
                }
                let readable = if want_dir {
                    std::fs::read_dir(path).map(drop)
                } else {
                    std::fs::File::open(path).map(drop)
                };
                readable.map_err(|e| {
                    format!("{at}: {shown} cannot be read ({e}); give the hive's user read access to it")
                })?;
            }
        }
        Ok(())
    }

    /// Parses and validates config text. Tool groups and capabilities are
    /// checked before the text becomes a config, so their errors name the field.
    pub fn parse(text: &str) -> Result<HiveConfig, String> {
        let v: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        check_grants(&v)?;
        let cfg: HiveConfig = serde_json::from_value(v).map_err(|e| e.to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Every rule a config must satisfy, each error naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(v) = &self.swarm_name {
            if v.contains('\n') || v.len() > 64 {
                return Err("swarm_name: must be one line of at most 64 characters".into());
            }
        }
        if let Some(h) = &self.hive_name {
            check_hive_name(h).map_err(|e| format!("hive_name: {e}"))?;
        }
        if let Some(m) = &self.matrix {
            self.check_matrix(m)?;
        }
        if let Some(r) = &self.retention {
            r.check()?;
        }
        if let Some(b) = &self.budget {
            b.check("budget")?;
        }
        if let Some(n) = &self.notify {
            n.check()?;
        }
        if self.max_claude == Some(0) {
            return Err(
                "max_claude: at least 1 (the most claude processes the hive runs at once)".into(),
            );
        }
        if let Some(w) = &self.web {
            w.check()?;
            if let Some(name) = w.script_pages.keys().find(|n| self.agent(n).is_none()) {
                return Err(format!(
                    "web.script_pages.{name}: no agent of that name in agents"
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, a) in self.agents.iter().enumerate() {
            let at = format!("agents[{i}]");
            if let Some(b) = &a.budget {
                b.check(&format!("{at}.budget"))?;
            }
            crate::proto::fleet::check_turn_usd(a.turn_usd, &at)?;
            check_name(&a.name).map_err(|e| format!("{at}.name: {e}"))?;
            if !seen.insert(a.name.as_str()) {
                return Err(format!("{at}.name: duplicate agent name {:?}", a.name));
            }
            if let Some(acc) = &a.account {
                if acc.is_empty()
                    || acc.len() > 64
                    || !acc
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b))
                {
                    return Err(format!(
                        "{at}.account: {} must be 1 to 64 letters, digits and -_.@ (a name for the account its agents share)",
                        excerpt(acc)
                    ));
                }
            }
            if let Some(m) = &a.model {
                if m.trim().is_empty() || m.contains(char::is_whitespace) {
                    return Err(format!("{at}.model: {} is not a model name", excerpt(m)));
                }
            }
            check_options(a, &at)?;
        }
        for (i, a) in self.agents.iter().enumerate() {
            let at = format!("agents[{i}]");
            if let Some(p) = &a.parent {
                if p != "operator" && !seen.contains(p.as_str()) {
                    return Err(format!(
                        "{at}.parent: no agent named {} in this config",
                        excerpt(p)
                    ));
                }
                if p == &a.name {
                    return Err(format!("{at}.parent: an agent cannot be its own parent"));
                }
            }
            for r in &a.allowed_recipients {
                if r.contains('@') {
                    self.check_remote_recipient(r)
                        .map_err(|e| format!("{at}.allowed_recipients: {e}"))?;
                    continue;
                }
                if r != "operator" && !seen.contains(r.as_str()) {
                    return Err(format!(
                        "{at}.allowed_recipients: no agent named {} in this config",
                        excerpt(r)
                    ));
                }
            }
            // Walk up to make sure the parent chain ends at the operator.
            let mut cur = a;
            for _ in 0..=self.agents.len() {
                match self.parent_agent(&cur.name) {
                    Some(p) => cur = p,
                    None => break,
                }
                if cur.name == a.name {
                    return Err(format!(
                        "{at}.parent: the parent chain of {:?} is a cycle",
                        a.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// The agent called `name`. The broker asks this on every request of a
    /// harness (issue 42: a thousand agents); where each agent was last found
    /// is remembered and checked before it is used, so `agents` may change
    /// in any way between calls (names are unique: [`HiveConfig::validate`]).
    pub fn agent(&self, name: &str) -> Option<&AgentConfig> {
        let mut at = self.agent_at.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(a) = at.get(name).and_then(|&i| self.agents.get(i)) {
            if a.name == name {
                return Some(a);
            }
        }
        let i = self.agents.iter().position(|a| a.name == name)?;
        if at.len() > 4 * self.agents.len() + 64 {
            // Names come and go over `hive reload`s: start again.
            at.clear();
        }
        at.insert(name.to_string(), i);
        Some(&self.agents[i])
    }

    fn parent_agent(&self, name: &str) -> Option<&AgentConfig> {
        let p = self.agent(name)?.parent.as_deref()?;
        self.agent(p)
    }

    /// The topology parent of an agent: another agent's name or `operator`.
    pub fn parent_of(&self, name: &str) -> String {
        match self.agent(name).and_then(|a| a.parent.clone()) {
            Some(p) => p,
            None => "operator".into(),
        }
    }

    /// The root of `agent`'s tree: the ancestor whose parent is the operator
    /// (the agent itself for a root agent).
    pub fn root_of(&self, agent: &str) -> String {
        let mut cur = agent.to_string();
        for _ in 0..=self.agents.len() {
            let p = self.parent_of(&cur);
            if p == "operator" {
                break;
            }
            cur = p;
        }
        cur
    }

    /// May `from` send to `to` (`to` already resolved from `<parent>`)? A
    /// `NAME@HIVE` on another hive is checked against `allowed_recipients`
    /// only; whether the swarm reaches it is the broker's question.
    pub fn may_send(&self, from: &str, to: &str) -> Result<(), String> {
        if to != "operator" && self.agent(to).is_none() && Remote::parse(to).is_none() {
            return Err(format!(
                "unknown recipient {}; known: operator, <parent>, {}",
                excerpt(to),
                self.agents
                    .iter()
                    .map(|a| a.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let Some(a) = self.agent(from) else {
            return Ok(());
        };
        if a.allowed_recipients.is_empty() || self.parent_of(from) == to {
            return Ok(());
        }
        if a.allowed_recipients.iter().any(|r| r == to) {
            return Ok(());
        }
        Err(format!(
            "{from} may not send to {}: allowed recipients are {} and the parent ({})",
            excerpt(to),
            a.allowed_recipients.join(", "),
            self.parent_of(from)
        ))
    }
}

impl HiveConfig {
    /// The `matrix` section's rules, each error naming its field.
    fn check_matrix(&self, m: &MatrixConfig) -> Result<(), String> {
        let own = self.hive_name.as_deref().ok_or(
            "matrix: a hive in a swarm needs a hive_name (other hives write to its agents as \
             NAME@HIVE_NAME)",
        )?;
        check_homeserver(&m.homeserver).map_err(|e| format!("matrix.homeserver: {e}"))?;
        check_user_id(&m.user_id).map_err(|e| format!("matrix.user_id: {e}"))?;
        match (&m.password_file, &m.access_token_file) {
            (Some(_), Some(_)) | (None, None) => {
                return Err(
                    "matrix: give exactly one of password_file and access_token_file".into(),
                )
            }
            (Some(p), None) => {
                check_secret_path(p).map_err(|e| format!("matrix.password_file: {e}"))?
            }
            (None, Some(p)) => {
                check_secret_path(p).map_err(|e| format!("matrix.access_token_file: {e}"))?
            }
        }
        check_room(&m.room).map_err(|e| format!("matrix.room: {e}"))?;
        for (hive, user) in &m.peers {
            check_hive_name(hive).map_err(|e| format!("matrix.peers: {e}"))?;
            if hive == own {
                return Err(format!(
                    "matrix.peers: {hive:?} is this hive's own name; list the other hives"
                ));
            }
            check_user_id(user).map_err(|e| format!("matrix.peers.{hive}: {e}"))?;
            if user.eq_ignore_ascii_case(&m.user_id) {
                return Err(format!(
                    "matrix.peers.{hive}: {user} is this hive's own bridge (matrix.user_id)"
                ));
            }
            if m.peers
                .iter()
                .any(|(h, u)| h != hive && u.eq_ignore_ascii_case(user))
            {
                return Err(format!(
                    "matrix.peers.{hive}: {user} is listed for two hives; each hive has its \
                     own bridge user"
                ));
            }
        }
        if let Some(d) = &m.device_id {
            if d.is_empty()
                || d.len() > 64
                || d.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err("matrix.device_id: must be 1 to 64 characters without spaces".into());
            }
        }
        for (i, op) in m.operators.iter().enumerate() {
            check_user_id(op).map_err(|e| format!("matrix.operators[{i}]: {e}"))?;
        }
        match &m.operator_room {
            Some(r) => check_room(r).map_err(|e| format!("matrix.operator_room: {e}"))?,
            None if !m.operators.is_empty() => {
                return Err(
                    "matrix.operators: operators write from the operator_room; set \
                     matrix.operator_room"
                        .into(),
                )
            }
            None => {}
        }
        if m.operator_room.as_deref() == Some(m.room.as_str()) {
            return Err(
                "matrix.operator_room: must be a room of its own, not the swarm's room".into(),
            );
        }
        Ok(())
    }

    /// An `allowed_recipients` entry with an `@`: `NAME@HIVE` with HIVE a
    /// listed peer (when the swarm is configured) or this hive itself.
    fn check_remote_recipient(&self, r: &str) -> Result<(), String> {
        let remote = check_remote(r)?;
        if self.hive_name.as_deref() == Some(remote.hive.as_str()) {
            if remote.name != "operator" && self.agent(&remote.name).is_none() {
                return Err(format!(
                    "no agent named {} in this config",
                    excerpt(&remote.name)
                ));
            }
            return Ok(());
        }
        match &self.matrix {
            Some(m) if !m.peers.contains_key(&remote.hive) => Err(format!(
                "{r}: no hive {} in matrix.peers",
                excerpt(&remote.hive)
            )),
            _ => Ok(()),
        }
    }

    /// The name `to` has on this hive when it is `NAME@` this hive's own name.
    pub fn own_name<'a>(&self, to: &'a str) -> Option<&'a str> {
        let own = self.hive_name.as_deref()?;
        let (name, hive) = to.split_once('@')?;
        (hive == own).then_some(name)
    }
}

/// The `retention` key (issue 40): how long the broker keeps what is done
/// with, and how much each agent may have stored. Every field may be left
/// out for its default, so `{}` (or no key) is the defaults. The broker
/// reads it when it starts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retention {
    /// Days an acked message is kept after it was handled
    /// ([`Retention::DEFAULT_MESSAGES_DAYS`]; 0: until the next prune pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_days: Option<u32>,
    /// Days a spend row is kept at least
    /// ([`Retention::DEFAULT_SPEND_DAYS`]); it also outlives the start of
    /// every current budget window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spend_days: Option<u32>,
    /// The bytes of message bodies one agent may have stored and not yet
    /// pruned, in MiB ([`Retention::DEFAULT_AGENT_QUOTA_MIB`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_quota_mib: Option<u64>,
    /// The bytes of message bodies one agent may store in any minute, in
    /// MiB ([`Retention::DEFAULT_AGENT_MIB_PER_MINUTE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_mib_per_minute: Option<u64>,
}

impl Retention {
    pub const DEFAULT_MESSAGES_DAYS: u32 = 30;
    /// Three months: a monthly budget's window and the two before it.
    pub const DEFAULT_SPEND_DAYS: u32 = 90;
    pub const DEFAULT_AGENT_QUOTA_MIB: u64 = 256;
    /// 256 bodies of the largest size (64 KiB) a minute: far above what an
    /// agent's turns send, and a self-waking loop takes 16 minutes to reach
    /// the default quota.
    pub const DEFAULT_AGENT_MIB_PER_MINUTE: u64 = 16;
    /// The largest number of days either period takes (a hundred years).
    const MAX_DAYS: u32 = 36_500;
    /// The largest MiB either limit takes (1 TiB).
    const MAX_MIB: u64 = 1 << 20;

    pub fn messages_days(&self) -> u32 {
        self.messages_days.unwrap_or(Self::DEFAULT_MESSAGES_DAYS)
    }

    pub fn spend_days(&self) -> u32 {
        self.spend_days.unwrap_or(Self::DEFAULT_SPEND_DAYS)
    }

    /// The per-agent quota, in bytes.
    pub fn agent_quota_bytes(&self) -> u64 {
        self.agent_quota_mib
            .unwrap_or(Self::DEFAULT_AGENT_QUOTA_MIB)
            << 20
    }

    /// The per-agent limit of one minute, in bytes.
    pub fn agent_bytes_per_minute(&self) -> u64 {
        self.agent_mib_per_minute
            .unwrap_or(Self::DEFAULT_AGENT_MIB_PER_MINUTE)
            << 20
    }

    fn check(&self) -> Result<(), String> {
        let days = [
            ("messages_days", self.messages_days),
            ("spend_days", self.spend_days),
        ];
        for (key, v) in days {
            if v.is_some_and(|d| d > Self::MAX_DAYS) {
                return Err(format!("retention.{key}: at most {} days", Self::MAX_DAYS));
            }
        }
        let mib = [
            ("agent_quota_mib", self.agent_quota_mib),
            ("agent_mib_per_minute", self.agent_mib_per_minute),
        ];
        for (key, v) in mib {
            if v.is_some_and(|m| m == 0 || m > Self::MAX_MIB) {
                return Err(format!(
                    "retention.{key}: from 1 to {} (MiB)",
                    Self::MAX_MIB
                ));
            }
        }
        Ok(())
    }
}

impl HiveConfig {
    /// The `retention` key, its defaults where it is absent.
    pub fn retention(&self) -> Retention {
        self.retention.clone().unwrap_or_default()
    }

    /// The `max_claude` key, or its default from the host's memory.
    pub fn max_claude(&self) -> u32 {
        self.max_claude.unwrap_or_else(max_claude_default)
    }
}

#[cfg(test)]
mod max_claude_tests {
    use super::*;

    #[test]
    fn max_claude_is_at_least_one_and_defaults_to_available_memory_over_300_mib() {
        let meminfo =
            "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20480000 kB\n";
        assert_eq!(mem_available_kib(meminfo), Some(20_480_000));
        assert_eq!(max_claude_of(20_480_000), 66);
        assert_eq!(max_claude_of(300 * 1024), 1);
        assert_eq!(
            max_claude_of(1000),
            1,
            "a host short of memory still runs one"
        );
        assert_eq!(mem_available_kib("MemTotal: 5 kB\n"), None);
        let cfg = HiveConfig::parse(r#"{"agents":[{"name":"ana"}],"max_claude":3}"#).unwrap();
        assert_eq!(cfg.max_claude(), 3);
        let e = HiveConfig::parse(r#"{"agents":[{"name":"ana"}],"max_claude":0}"#).unwrap_err();
        assert!(e.contains("max_claude: at least 1"), "{e}");
        let cfg = HiveConfig::parse(r#"{"agents":[{"name":"ana"}]}"#).unwrap();
        assert!(cfg.max_claude() >= 1);
    }
}

#[cfg(test)]
mod retention_tests {
    use super::*;

    #[test]
    fn the_retention_key_has_defaults_and_its_errors_name_the_field() {
        let cfg = HiveConfig::parse(r#"{"agents":[{"name":"ana"}]}"#).unwrap();
        let r = cfg.retention();
        assert_eq!(
            (r.messages_days(), r.spend_days()),
            (30, 90),
            "the defaults"
        );
        assert_eq!(r.agent_quota_bytes(), 256 << 20);
        assert_eq!(r.agent_bytes_per_minute(), 16 << 20);
        let cfg = HiveConfig::parse(
            r#"{"agents":[{"name":"ana"}],"retention":{"messages_days":0,"spend_days":7,
                "agent_quota_mib":1,"agent_mib_per_minute":2}}"#,
        )
        .unwrap();
        let r = cfg.retention();
        assert_eq!((r.messages_days(), r.spend_days()), (0, 7));
        assert_eq!(
            (r.agent_quota_bytes(), r.agent_bytes_per_minute()),
            (1 << 20, 2 << 20)
        );
        for (text, want) in [
            (
                r#"{"agent_quota_mib":0}"#,
                "retention.agent_quota_mib: from 1",
            ),
            (
                r#"{"agent_mib_per_minute":2000000}"#,
                "retention.agent_mib_per_minute: from 1",
            ),
            (
                r#"{"messages_days":40000}"#,
                "retention.messages_days: at most",
            ),
            (r#"{"spend_days":-1}"#, "invalid value"),
            (r#"{"keep":1}"#, "unknown field `keep`"),
        ] {
            let e = HiveConfig::parse(&format!(
                r#"{{"agents":[{{"name":"ana"}}],"retention":{text}}}"#
            ))
            .unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}

/// A homeserver base URL: `http://` or `https://` and a host.
/// The per-agent options of an entry (`proto::fleet`), each error naming
/// its key under `at`. The path keys' existence is [`HiveConfig::check_paths`].
fn check_options(a: &AgentConfig, at: &str) -> Result<(), String> {
    for (key, path) in a.path_keys() {
        if !Path::new(path).is_absolute() || path.contains('\n') {
            return Err(format!(
                "{at}.{key}: {} must be an absolute path",
                excerpt(path)
            ));
        }
    }
    if a.options.dashboard_links.len() > 32 {
        return Err(format!(
            "{at}.dashboard_links: {} links, at most 32 are shown",
            a.options.dashboard_links.len()
        ));
    }
    for (j, l) in a.options.dashboard_links.iter().enumerate() {
        let at = format!("{at}.dashboard_links[{j}]");
        if l.label.trim().is_empty() || l.label.chars().count() > 64 {
            return Err(format!("{at}.label: needs 1 to 64 characters"));
        }
        if !crate::http::web_url(&l.url) || l.url.len() > 2048 {
            return Err(format!(
                "{at}.url: {} is not an http:// or https:// URL",
                excerpt(&l.url)
            ));
        }
        if l.icon.chars().count() > 16 {
            return Err(format!("{at}.icon: at most 16 characters (an emoji)"));
        }
    }
    for (key, url) in [
        ("forge_url", &a.options.forge_url),
        ("matrix_url", &a.options.matrix_url),
    ] {
        if let Some(u) = url {
            if !u.is_empty() && !crate::http::web_url(u) {
                return Err(format!(
                    "{at}.{key}: {} must be an http:// or https:// URL, or \"\" (off)",
                    excerpt(u)
                ));
            }
        }
    }
    let lists = [
        (
            "claude_marketplaces",
            a.options.claude_marketplaces.as_deref().unwrap_or(&[]),
        ),
        ("claude_plugins", a.options.claude_plugins.as_slice()),
    ];
    for (key, list) in lists {
        if let Some(bad) = list
            .iter()
            .find(|v| v.trim().is_empty() || v.contains([',', '\n']))
        {
            return Err(format!(
                "{at}.{key}: {} is not a source or plugin spec (no commas, not empty)",
                excerpt(bad)
            ));
        }
    }
    if let Some(p) = &a.options.operator_pronouns {
        if p.trim().is_empty() || p.contains('\n') || p.chars().count() > 32 {
            return Err(format!(
                "{at}.operator_pronouns: {} must be one line of 1 to 32 characters",
                excerpt(p)
            ));
        }
    }
    for (k, v) in &a.options.context_window_tokens {
        let key_ok = k.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && k.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
        if !key_ok || *v == 0 {
            return Err(format!(
                "{at}.context_window_tokens.{}: the key is a part of a model name (letters, \
                 digits, . _ -) and the value a positive number of tokens",
                excerpt(k)
            ));
        }
    }
    for (name, server) in &a.options.extra_mcp_servers {
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
            && name != "hyperhive"
            && name != "bash";
        let has = |k: &str| {
            server
                .get(k)
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
        };
        if !name_ok || !(has("command") || has("url")) {
            return Err(format!(
                "{at}.extra_mcp_servers.{}: needs a command (or url), under a name of letters, \
                 digits, _ and - other than hyperhive and bash",
                excerpt(name)
            ));
        }
    }
    Ok(())
}

fn check_homeserver(url: &str) -> Result<(), String> {
    crate::matrix::Client::new(url)
        .map(|_| ())
        .map_err(|e| e.message)
}

/// A Matrix user id: `@name:server`.
fn check_user_id(id: &str) -> Result<(), String> {
    let ok = id.len() <= 255
        && id
            .strip_prefix('@')
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(local, server)| {
                !local.is_empty() && !server.is_empty() && !id.contains(char::is_whitespace)
            });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} is not a Matrix user id (@name:server)",
            excerpt(id)
        ))
    }
}

/// A room id (`!…`) or alias (`#name:server`).
fn check_room(room: &str) -> Result<(), String> {
    let ok = room.len() <= 255
        && !room.contains(char::is_whitespace)
        && match room.chars().next() {
            Some('!') => room.len() > 1,
            Some('#') => room[1..]
                .split_once(':')
                .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty()),
            _ => false,
        };
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} is neither a room id (!…) nor a room alias (#name:server)",
            excerpt(room)
        ))
    }
}

/// A password or token file: an absolute path (the bridge is its own process,
/// with its own working directory).
fn check_secret_path(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!(
            "{} must be an absolute path (the bridge runs as its own process)",
            excerpt(p)
        ));
    }
    Ok(())
}

/// The `tool_groups` and `capabilities` of every agent in a config not yet
/// read, each error naming its field (`agents[2].tool_groups: unknown tool
/// group "x"; known groups: …`).
fn check_grants(v: &Value) -> Result<(), String> {
    let agents = v.get("agents").and_then(Value::as_array);
    for (i, a) in agents.into_iter().flatten().enumerate() {
        let names = |field: &str| -> Vec<String> {
            a.get(field)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str().map(str::to_string))
                .collect()
        };
        for g in names("tool_groups") {
            ToolGroup::parse(&g).map_err(|e| format!("agents[{i}].tool_groups: {e}"))?;
        }
        for c in names("capabilities") {
            Capability::parse(&c).map_err(|e| format!("agents[{i}].capabilities: {e}"))?;
        }
        // The per-agent options are a flattened part of the entry, which
        // leaves serde's own error without the list of keys: this one names
        // the entry and lists them.
        if let Some(bad) = a
            .as_object()
            .and_then(|o| o.keys().find(|k| !AgentConfig::KEYS.contains(&k.as_str())))
        {
            return Err(format!(
                "agents[{i}]: unknown field `{}`, expected one of {}",
                bad.chars().take(40).collect::<String>().escape_debug(),
                AgentConfig::KEYS.map(|k| format!("`{k}`")).join(", ")
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_web_key_is_checked_and_has_a_default() {
        let w = WebSection::default();
        assert_eq!(w.listen_addr().unwrap().to_string(), DEFAULT_LISTEN);
        for (text, want) in [
            (r#"{"web": {"listen": "localhost:80"}}"#, "web.listen"),
            (
                r#"{"web": {"listen": "127.0.0.1:7890", "public_origin": "http://a"}}"#,
                "web.public_origin",
            ),
            (
                r#"{"web": {"public_origin": "https://a/path"}}"#,
                "web.public_origin",
            ),
            (
                r#"{"web": {"public_origin": "https://u@a"}}"#,
                "web.public_origin",
            ),
            (r#"{"web": {"port": 1}}"#, "unknown field"),
        ] {
            let e = HiveConfig::parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
        let c = HiveConfig::parse(
            r#"{"web": {"listen": "0.0.0.0:8080", "public_origin": "https://Hive.example:8443/"}}"#,
        )
        .unwrap();
        let w = c.web.unwrap();
        assert_eq!(w.origin().as_deref(), Some("https://Hive.example:8443"));
        assert_eq!(w.origin_host().as_deref(), Some("hive.example:8443"));
    }

    #[test]
    fn script_pages_are_loopback_agents_on_ports_of_their_own() {
        let fleet = |web: &str| {
            format!(r#"{{"web": {web}, "agents": [{{"name": "ana"}}, {{"name": "bob"}}]}}"#)
        };
        for (web, want) in [
            (
                r#"{"script_pages": {"cy": "127.0.0.1:7891"}}"#,
                "web.script_pages.cy: no agent",
            ),
            (
                r#"{"script_pages": {"ana": "7891"}}"#,
                "web.script_pages.ana: \"7891\" is not IP:PORT",
            ),
            (
                r#"{"script_pages": {"ana": "0.0.0.0:7891"}}"#,
                "not a loopback address",
            ),
            (
                r#"{"script_pages": {"ana": "127.0.0.1:7890"}}"#,
                "already web.listen's",
            ),
            (
                r#"{"script_pages": {"ana": "127.0.0.1:7891", "bob": "[::1]:7891"}}"#,
                "web.script_pages.bob: port 7891",
            ),
            (
                r#"{"script_pages": {"a b": "127.0.0.1:7891"}}"#,
                "web.script_pages.\"a b\"",
            ),
        ] {
            let e = HiveConfig::parse(&fleet(web)).unwrap_err();
            assert!(e.contains(want), "{web}: {e}");
        }
        let c = HiveConfig::parse(&fleet(
            r#"{"script_pages": {"ana": "127.0.0.1:7891", "bob": "127.0.0.1:0"}}"#,
        ))
        .unwrap();
        let pages = c.web.unwrap().script_page_addrs().unwrap();
        assert_eq!(pages.len(), 2);
        assert_eq!(pages[0].0, "ana");
        assert_eq!(pages[0].1.to_string(), "127.0.0.1:7891");
    }

    fn parse_err(text: &str) -> String {
        HiveConfig::parse(text).unwrap_err()
    }

    #[test]
    fn bad_configs_name_the_field() {
        let cases = [
            (r#"{"agents":[{"name":"Ruth"}]}"#, "agents[0].name"),
            (r#"{"agents":[{"name":"toolongname"}]}"#, "1 to 9"),
            (r#"{"agents":[{"name":"operator"}]}"#, "reserved"),
            (r#"{"agents":[{"name":"a"},{"name":"a"}]}"#, "duplicate"),
            (
                r#"{"agents":[{"name":"a","parent":"b"}]}"#,
                "agents[0].parent",
            ),
            (
                r#"{"agents":[{"name":"a","tool_groups":["x"]}]}"#,
                "agents[0].tool_groups",
            ),
            (
                r#"{"agents":[{"name":"a","capabilities":["root"]}]}"#,
                "capabilities",
            ),
            (
                r#"{"agents":[{"name":"a","colour":"red"}]}"#,
                "unknown field `colour`",
            ),
            (r#"{"agentz":[]}"#, "unknown field `agentz`"),
            (
                r#"{"agents":[{"name":"a","allowed_recipients":["zed"]}]}"#,
                "allowed_recipients",
            ),
            (
                r#"{"agents":[{"name":"a","parent":"b"},{"name":"b","parent":"a"}]}"#,
                "cycle",
            ),
            (r#"{"hive_name":"o@ne"}"#, "hive_name: hive name"),
            (r#"{"hive_name":"Production"}"#, "hive_name: hive name"),
            (
                r#"{"agents":[{"name":"a","allowed_recipients":["b@Two"]}]}"#,
                "agents[0].allowed_recipients: \"b@Two\" is not NAME@HIVE",
            ),
        ];
        for (text, want) in cases {
            let err = parse_err(text);
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    fn matrix(extra: &str) -> String {
        format!(
            r##"{{"hive_name":"one","agents":[{{"name":"a","allowed_recipients":["b@two"]}}],
               "matrix":{{"homeserver":"http://127.0.0.1:8008","user_id":"@hive-one-bridge:hive.test",
                 "password_file":"/etc/hive/pw","room":"#swarm:hive.test",
                 "peers":{{"two":"@hive-two-bridge:hive.test"}}{extra}}}}}"##
        )
    }

    #[test]
    fn the_matrix_section_and_remote_recipients() {
        let cfg = HiveConfig::parse(&matrix("")).unwrap();
        let m = cfg.matrix.as_ref().unwrap();
        assert_eq!(m.peer_hive("@hive-two-bridge:hive.test"), Some("two"));
        assert!(cfg.may_send("a", "b@two").is_ok());
        assert!(cfg
            .may_send("a", "c@two")
            .unwrap_err()
            .contains("a may not send to \"c@two\""));
        assert_eq!(cfg.own_name("a@one"), Some("a"));
        assert_eq!(cfg.own_name("a@two"), None);
        let cases = [
            (
                r#","access_token_file":"/t""#,
                "exactly one of password_file",
            ),
            (r#","device_id":"A B""#, "matrix.device_id"),
            (
                r#","operators":["@alice:hive.test"]"#,
                "set matrix.operator_room",
            ),
            (
                r#","operators":["alice"],"operator_room":"!r""#,
                "matrix.operators[0]",
            ),
            (
                r##","operator_room":"#swarm:hive.test""##,
                "a room of its own",
            ),
        ];
        for (extra, want) in cases {
            let e = parse_err(&matrix(extra));
            assert!(e.contains(want), "{extra}: {e}");
        }
        let swaps = [
            (
                "http://127.0.0.1:8008",
                "127.0.0.1:8008",
                "matrix.homeserver",
            ),
            (
                "@hive-one-bridge:hive.test",
                "hive-one-bridge",
                "matrix.user_id",
            ),
            ("/etc/hive/pw", "pw", "must be an absolute path"),
            ("#swarm:hive.test", "swarm", "matrix.room"),
            ("\"two\":", "\"one\":", "this hive's own name"),
            ("\"two\":", "\"Two\":", "matrix.peers: hive name"),
            (
                "@hive-two-bridge",
                "@hive-one-bridge",
                "this hive's own bridge",
            ),
            (
                "[\"b@two\"]",
                "[\"b@three\"]",
                "no hive \"three\" in matrix.peers",
            ),
            ("\"hive_name\":\"one\",", "", "needs a hive_name"),
        ];
        for (from, to, want) in swaps {
            let text = matrix("").replacen(from, to, 1);
            let e = parse_err(&text);
            assert!(e.contains(want), "{from} -> {to}: {e}");
        }
        // Without a swarm, remote names are accepted as written (sending to
        // them is refused by the broker, which says why).
        let cfg = HiveConfig::parse(r#"{"agents":[{"name":"a","allowed_recipients":["b@two"]}]}"#)
            .unwrap();
        assert!(cfg.may_send("a", "b@two").is_ok());
    }

    #[test]
    fn topology_and_recipients() {
        let cfg = HiveConfig::parse(
            r#"{"hive_name":"pr1ma","agents":[
                {"name":"ruth"},
                {"name":"kid","parent":"ruth","allowed_recipients":["operator"]},
                {"name":"pal"}]}"#,
        )
        .unwrap();
        assert_eq!(cfg.parent_of("ruth"), "operator");
        assert_eq!(cfg.parent_of("kid"), "ruth");
        assert_eq!(
            (cfg.root_of("kid"), cfg.root_of("ruth")),
            ("ruth".into(), "ruth".into())
        );
        assert!(cfg.may_send("kid", "operator").is_ok());
        assert!(cfg.may_send("kid", "ruth").is_ok(), "parent always allowed");
        assert!(cfg
            .may_send("kid", "pal")
            .unwrap_err()
            .contains("may not send"));
        assert!(cfg.may_send("pal", "kid").is_ok());
        assert!(cfg
            .may_send("pal", "ghost")
            .unwrap_err()
            .contains("unknown recipient"));
    }

    /// The per-agent options of the specification: each bad value is
    /// refused naming its key, and a path key that names nothing is refused
    /// when the file loads (not when it is only parsed, as a write does).
    #[test]
    fn the_per_agent_options_are_checked_and_a_missing_path_is_named() {
        let one = |entry: &str| format!(r#"{{"agents":[{{"name":"ana",{entry}}}]}}"#);
        for (entry, want) in [
            (
                r#""static_dir":"rel/dir""#,
                "agents[0].static_dir: \"rel/dir\" must be an absolute path",
            ),
            (
                r#""dashboard_links":[{"label":"x","url":"javascript:alert(1)"}]"#,
                "agents[0].dashboard_links[0].url:",
            ),
            (
                r#""dashboard_links":[{"label":"","url":"https://x"}]"#,
                "agents[0].dashboard_links[0].label:",
            ),
            (r#""forge_url":"ftp://x""#, "agents[0].forge_url:"),
            (r#""claude_plugins":["a,b"]"#, "agents[0].claude_plugins:"),
            (
                r#""context_window_tokens":{"sonnet":0}"#,
                "agents[0].context_window_tokens.\"sonnet\":",
            ),
            (
                r#""extra_mcp_servers":{"bash":{"command":"/bin/x"}}"#,
                "agents[0].extra_mcp_servers.\"bash\":",
            ),
            (
                r#""extra_mcp_servers":{"s":{"args":[]}}"#,
                "agents[0].extra_mcp_servers.\"s\":",
            ),
            (r#""cargo_short_messages":"yes""#, "invalid type"),
            (
                r#""colour":"red""#,
                "agents[0]: unknown field `colour`, expected one of `name`, `parent`",
            ),
        ] {
            let e = parse_err(&one(entry));
            assert!(e.contains(want), "{entry}: {e}");
        }
        let d = std::env::temp_dir().join(format!("hive-config-paths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("static")).unwrap();
        std::fs::write(d.join("icon.svg"), "<svg/>").unwrap();
        let fleet = d.join("hive.json");
        let good = one(&format!(
            r#""static_dir":"{0}/static","icon":"{0}/icon.svg","cargo_short_messages":false,
               "dashboard_links":[{{"label":"Stats","url":"https://stats.example/","icon":"📊"}}]"#,
            d.display()
        ));
        std::fs::write(&fleet, &good).unwrap();
        let cfg = HiveConfig::load(&fleet).unwrap();
        let a = cfg.agent("ana").unwrap();
        assert!(!a.cargo_short_messages());
        let env = a.option_env();
        assert!(
            env.contains(&("HIVE_STATIC_DIR".into(), format!("{}/static", d.display()))),
            "{env:?}"
        );
        assert!(
            env.iter()
                .any(|(k, v)| k == "HIVE_DASHBOARD_LINKS" && v.contains("stats.example")),
            "{env:?}"
        );
        // Gone: parsing still takes it, loading names the entry, the key and the path.
        std::fs::remove_dir(d.join("static")).unwrap();
        assert!(HiveConfig::parse(&good).is_ok());
        let e = HiveConfig::load(&fleet).unwrap_err();
        assert!(
            e.contains(&format!(
                "agents[0].static_dir: \"{}/static\" cannot be read",
                d.display()
            )),
            "{e}"
        );
        // A file where a directory is wanted, and the other way round.
        std::fs::write(
            &fleet,
            one(&format!(r#""static_dir":"{0}/icon.svg""#, d.display())),
        )
        .unwrap();
        let e = HiveConfig::load(&fleet).unwrap_err();
        assert!(
            e.contains("agents[0].static_dir:") && e.ends_with("is not a directory"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
