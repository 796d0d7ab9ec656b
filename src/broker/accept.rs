//! How many connections the broker takes: the caps ([`ConnLimits`]) keep the
//! connections of every agent together well below the process's descriptor
//! limit, keep one agent from taking all of them, and keep a share for the
//! operator's host socket, so no agent can lock out the operator or the other
//! agents; [`Caps`] counts one socket's connections against them. The
//! connections a harness's (or bash-task daemon's) credential makes count
//! against that credential's own cap only ([`Caps::credential`]), so no
//! number of connections on the agent's socket locks its harness out. The
//! loop that accepts (`sockets.rs`) gives a client over a cap one `ok:false`
//! line saying why and closes it.

use super::hub::Identity;
use crate::sys::env::Env;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Descriptors one connection may hold: its stream, and a file or pipe an
/// offloaded job of it opens (a patch file, a log, `journalctl`'s output).
const FDS_PER_CONN: u64 = 2;

/// Descriptors kept for everything else in the process (stdio, logs, the
/// store, a journalctl's pipes, files being read); per agent two more (its
/// listener, and under `hive up` its log pipes).
const RESERVED_FDS: u64 = 64;

/// Connections an agent's socket takes by default (`HIVE_BROKER_CONNS_PER_AGENT`).
pub const DEFAULT_CONNS_PER_AGENT: usize = 64;

/// Connections the bridge's socket takes.
pub const BRIDGE_CONNS: usize = 8;

/// Connections one credential may have open at once: the harness keeps
/// three (the long-poll, its calls, the status watch) and opens a few more
/// for a moment (its page's send, the forge's wakes, `/metrics`).
pub const CREDENTIAL_CONNS: usize = 16;

/// A connection that sends no request for this long is closed, unless it is
/// parked in a long-poll (`HIVE_BROKER_IDLE_SECS`).
pub const DEFAULT_IDLE: Duration = Duration::from_secs(600);

/// How many connections the broker keeps open, derived from the descriptor
/// limit: at most half of what is left after `RESERVED_FDS` goes to
/// connections, a quarter of that to the host socket alone, the rest to every
/// agent socket together, and one agent's socket takes at most its configured
/// cap and never more than half of the agents' share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    pub per_agent: usize,
    pub agents: usize,
    pub host: usize,
    pub idle: Duration,
}

impl ConnLimits {
    pub fn new(nofile: u64, n_agents: usize, per_agent: usize, idle: Duration) -> ConnLimits {
        let reserved = RESERVED_FDS + 2 * n_agents as u64;
        let total = (nofile.saturating_sub(reserved) / 2 / FDS_PER_CONN).max(8) as usize;
        let host = (total / 4).max(2);
        let agents = total - host;
        ConnLimits {
            per_agent: per_agent.clamp(1, (agents / 2).max(1)),
            agents,
            host,
            idle,
        }
    }

    /// The limits for this process: its descriptor limit, and the caps set in
    /// `HIVE_BROKER_CONNS_PER_AGENT` and `HIVE_BROKER_IDLE_SECS`.
    pub fn read(nofile: u64, n_agents: usize, env: &Env) -> Result<ConnLimits, String> {
        let number = |name: &str, default: u64| -> Result<u64, String> {
            match env.get(name) {
                None => Ok(default),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if n >= 1 => Ok(n),
                    _ => Err(format!(
                        "{name} must be a whole number of at least 1, got {}",
                        crate::proto::text::excerpt(&v)
                    )),
                },
            }
        };
        let per_agent = number(
            "HIVE_BROKER_CONNS_PER_AGENT",
            DEFAULT_CONNS_PER_AGENT as u64,
        )?;
        let idle = number("HIVE_BROKER_IDLE_SECS", DEFAULT_IDLE.as_secs())?;
        Ok(ConnLimits::new(
            nofile,
            n_agents,
            per_agent.min(usize::MAX as u64) as usize,
            Duration::from_secs(idle),
        ))
    }
}

/// One open-connection counter and its cap.
#[derive(Clone)]
struct Count {
    open: Arc<AtomicUsize>,
    cap: usize,
}

impl Count {
    fn take(&self) -> bool {
        self.open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .is_ok()
    }
}

/// What the connections of one socket count against: its own cap, and for an
/// agent socket the cap of all agent sockets together.
#[derive(Clone)]
pub struct Caps {
    socket: Count,
    shared: Option<Count>,
}

impl Caps {
    /// The caps of the host socket.
    pub fn host(limits: &ConnLimits) -> Caps {
        Caps {
            socket: Count {
                open: Arc::new(AtomicUsize::new(0)),
                cap: limits.host,
            },
            shared: None,
        }
    }

    /// The caps of the Matrix bridge's socket: a few connections (the bridge
    /// keeps three open).
    pub fn bridge() -> Caps {
        Caps {
            socket: Count {
                open: Arc::new(AtomicUsize::new(0)),
                cap: BRIDGE_CONNS,
            },
            shared: None,
        }
    }

    /// The caps of one credential's connections: its own count only.
    pub fn credential() -> Caps {
        Caps {
            socket: Count {
                open: Arc::new(AtomicUsize::new(0)),
                cap: CREDENTIAL_CONNS,
            },
            shared: None,
        }
    }

    /// The caps of one agent socket; `agents_open` counts every agent socket's
    /// connections.
    pub fn agent(limits: &ConnLimits, agents_open: &Arc<AtomicUsize>) -> Caps {
        Caps {
            socket: Count {
                open: Arc::new(AtomicUsize::new(0)),
                cap: limits.per_agent,
            },
            shared: Some(Count {
                open: agents_open.clone(),
                cap: limits.agents,
            }),
        }
    }

    /// A slot for one more connection, or why there is none.
    pub fn take(&self, who: &Identity) -> Result<Slot, String> {
        if !self.socket.take() {
            return Err(format!(
                "too many connections on the socket of {} ({} open, its limit); close some and try again",
                who.name(),
                self.socket.cap
            ));
        }
        let mut slot = Slot(vec![self.socket.open.clone()]);
        if let Some(shared) = &self.shared {
            if !shared.take() {
                return Err(format!(
                    "too many connections on the agents' sockets ({} open in all, the limit); close some and try again",
                    shared.cap
                ));
            }
            slot.0.push(shared.open.clone());
        }
        Ok(slot)
    }
}

/// One connection's place in its counters, given back when dropped.
#[derive(Debug)]
pub struct Slot(Vec<Arc<AtomicUsize>>);

impl Drop for Slot {
    fn drop(&mut self) {
        for c in &self.0 {
            c.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_follow_the_descriptor_limit_and_keep_a_share_for_the_operator() {
        let idle = DEFAULT_IDLE;
        let small = ConnLimits::new(256, 2, DEFAULT_CONNS_PER_AGENT, idle);
        assert_eq!((small.per_agent, small.agents, small.host), (18, 36, 11));
        let worst = (small.agents + small.host) as u64 * FDS_PER_CONN;
        assert!(worst + RESERVED_FDS < 256, "{worst}");
        let big = ConnLimits::new(65536, 2, DEFAULT_CONNS_PER_AGENT, idle);
        assert_eq!(big.per_agent, DEFAULT_CONNS_PER_AGENT);
        assert!(big.host > 1000 && big.agents > 8000, "{big:?}");
        let tiny = ConnLimits::new(16, 1, 1000, idle);
        assert!(tiny.per_agent >= 1 && tiny.host >= 2, "{tiny:?}");
    }

    #[test]
    fn caps_count_per_socket_and_for_all_agents() {
        let limits = ConnLimits {
            per_agent: 2,
            agents: 3,
            host: 1,
            idle: DEFAULT_IDLE,
        };
        let all = Arc::new(AtomicUsize::new(0));
        let (ana, bob) = (Caps::agent(&limits, &all), Caps::agent(&limits, &all));
        let (a, b) = (Identity::Agent("ana".into()), Identity::Agent("bob".into()));
        let a1 = ana.take(&a).unwrap();
        let _a2 = ana.take(&a).unwrap();
        assert!(ana.take(&a).unwrap_err().contains("socket of ana"));
        let _b1 = bob.take(&b).unwrap();
        assert!(bob.take(&b).unwrap_err().contains("agents' sockets"));
        drop(a1);
        assert!(bob.take(&b).is_ok(), "a closed connection frees its place");
        let host = Caps::host(&limits);
        let _h = host.take(&Identity::Operator).unwrap();
        assert!(host.take(&Identity::Operator).is_err());
    }
}
