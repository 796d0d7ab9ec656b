//! The host limits a fleet would hit, named before `hive up` starts anything
//! (issue 42): what the fleet needs — threads (each takes a pid), processes,
//! and descriptors in `hive up` itself — from the agent count and
//! `max_claude`, against `kernel.pid_max`, `kernel.threads-max`,
//! `RLIMIT_NPROC` (which counts the threads of the user) and `RLIMIT_NOFILE`
//! (whose soft limit is first raised to the hard one: [`raise_nofile`]).
//!
//! A limit the idle fleet alone would pass is a **refusal**: some agents
//! could never start, and would be restarted in a loop while the rest run
//! short of pids or descriptors (`HIVE_UP_HOST_LIMITS=warn` makes it a
//! warning, for an operator who knows better). A limit only the claude
//! processes of busy turns would pass (`max_claude` of them at once) is a
//! **warning** that names the `max_claude` that fits: turns would fail to
//! start at the peak, and the hive keeps running. Each finding names the
//! number needed, the limit, and how to raise it.
//!
//! The figures per agent are measured (`docs/performance.md`), rounded up:
//! they are constants here, to be lowered as the processes get leaner.

use std::fmt::Write as _;

/// Threads of one idle agent, every process counted: the harness (16) and
/// its bash daemon (5), two processes, each PID 1 of its own sandbox with no
/// helper process (`sandbox::spawn` execs it in place). Measured 21.0 per
/// agent (2.00 processes per agent), `hive up`'s own 18 threads apart: `hive
/// up` as root with 50 isolated agents on a trivial fake claude (a shell
/// script answering each turn at once), idle after their boot turns,
/// counting every process below `hive up` and its threads in `/proc`.
/// Before, with the three-process sandbox, it was 25 (six processes).
pub const AGENT_THREADS: u64 = 22;
/// Threads of `hive up` itself besides its agents (18 measured, its HTTP
/// workers grow with the browsers).
pub const HIVE_THREADS: u64 = 48;
/// Threads of one running `claude` turn: the CLI (node) and the two MCP
/// servers it starts (`hive mcp`, the bash one), an estimate of the real
/// CLI's.
pub const CLAUDE_THREADS: u64 = 24;
/// Descriptors `hive up` holds per agent: its agent socket, the harness's
/// and the bash daemon's connections and credentials, two pidfds, four
/// output pipes, its page socket (15 measured, idle).
pub const FDS_PER_AGENT: u64 = 16;
/// Descriptors `hive up` holds besides its agents (the store, the
/// listeners, the dashboard's connections).
pub const FDS_BASE: u64 = 128;
/// Descriptors a running turn adds to `hive up`: its MCP servers'
/// connections to the broker.
pub const FDS_PER_CLAUDE: u64 = 4;

/// What the fleet asks of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub agents: u64,
    /// Claude processes at once at the peak (`max_claude`, at most one per
    /// agent).
    pub claude: u64,
}

impl Need {
    pub fn new(agents: usize, max_claude: u32) -> Need {
        Need {
            agents: agents as u64,
            claude: (max_claude as u64).min(agents as u64),
        }
    }

    /// Threads of the idle hive.
    pub fn threads_idle(&self) -> u64 {
        HIVE_THREADS + self.agents * AGENT_THREADS
    }

    /// Threads with `claude` turns running.
    pub fn threads_with(&self, claude: u64) -> u64 {
        self.threads_idle() + claude * CLAUDE_THREADS
    }

    /// Descriptors of `hive up` with `claude` turns running.
    pub fn fds_with(&self, claude: u64) -> u64 {
        FDS_BASE + self.agents * FDS_PER_AGENT + claude * FDS_PER_CLAUDE
    }
}

/// The host's limits and what is in use, as read at start.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Host {
    /// `/proc/sys/kernel/pid_max`.
    pub pid_max: Option<u64>,
    /// `/proc/sys/kernel/threads-max`.
    pub threads_max: Option<u64>,
    /// Threads on the host now (each holds a pid).
    pub threads_now: u64,
    /// The soft `RLIMIT_NPROC`; `None` when unlimited or not enforced (root).
    pub nproc: Option<u64>,
    /// Threads of this user now (what `RLIMIT_NPROC` counts).
    pub user_threads: u64,
    /// `RLIMIT_NOFILE` (soft, hard), after [`raise_nofile`].
    pub nofile: Option<(u64, u64)>,
}

/// One limit the fleet would hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// `kernel.pid_max`, `RLIMIT_NOFILE`, …
    pub limit: &'static str,
    pub needed: u64,
    /// The limit's room: the limit less what is in use already.
    pub room: u64,
    pub limit_value: u64,
    /// A refusal (the idle fleet does not fit), else a warning.
    pub refuse: bool,
    /// The `max_claude` that fits, for a warning.
    pub claude_fits: Option<u64>,
    /// How to raise it.
    pub how: String,
}

/// A number comfortably above `n` to raise a limit to: twice it, rounded up
/// to a multiple of 1024.
fn raise_to(n: u64) -> u64 {
    (n * 2).div_ceil(1024) * 1024
}

/// The limits `need` would hit on `host`.
pub fn check(need: &Need, host: &Host) -> Vec<Finding> {
    let mut out = Vec::new();
    // Thread limits: (name, limit, in use, how).
    let pid_how = |n: u64| {
        format!(
            "raise it: `sysctl -w kernel.pid_max={}` (at most 4194304; keep it in \
             /etc/sysctl.d/)",
            raise_to(n).min(4_194_304)
        )
    };
    let threads_how = |n: u64| {
        format!(
            "raise it: `sysctl -w kernel.threads-max={}` (keep it in /etc/sysctl.d/)",
            raise_to(n)
        )
    };
    let nproc_how = |n: u64| {
        format!(
            "raise it for hive up's user: `ulimit -u {}` in the shell that starts it, \
             `LimitNPROC={}` in its systemd unit, or `nproc` in /etc/security/limits.conf",
            raise_to(n),
            raise_to(n)
        )
    };
    type How<'a> = &'a dyn Fn(u64) -> String;
    let threads: [(&'static str, Option<u64>, u64, How); 3] = [
        ("kernel.pid_max", host.pid_max, host.threads_now, &pid_how),
        (
            "kernel.threads-max",
            host.threads_max,
            host.threads_now,
            &threads_how,
        ),
        ("RLIMIT_NPROC", host.nproc, host.user_threads, &nproc_how),
    ];
    for (limit, value, used, how) in threads {
        let Some(value) = value else {
            continue;
        };
        let room = value.saturating_sub(used);
        let idle = need.threads_idle();
        let peak = need.threads_with(need.claude);
        if idle > room {
            out.push(Finding {
                limit,
                needed: idle,
                room,
                limit_value: value,
                refuse: true,
                claude_fits: None,
                how: how(used + peak),
            });
        } else if peak > room {
            out.push(Finding {
                limit,
                needed: peak,
                room,
                limit_value: value,
                refuse: false,
                claude_fits: Some((room - idle) / CLAUDE_THREADS),
                how: how(used + peak),
            });
        }
    }
    if let Some((_, hard)) = host.nofile {
        // The soft limit was raised to the hard one: the hard one is the
        // room (what hive up holds at start is in FDS_BASE).
        let room = hard;
        let idle = need.fds_with(0);
        let peak = need.fds_with(need.claude);
        let how = |n: u64| {
            format!(
                "raise the hard limit (root): `LimitNOFILE={}` in hive up's systemd unit, \
                 `nofile` in /etc/security/limits.conf, or `ulimit -Hn {}` before starting it",
                raise_to(n),
                raise_to(n)
            )
        };
        if idle > room {
            out.push(Finding {
                limit: "RLIMIT_NOFILE",
                needed: idle,
                room,
                limit_value: hard,
                refuse: true,
                claude_fits: None,
                how: how(peak),
            });
        } else if peak > room {
            out.push(Finding {
                limit: "RLIMIT_NOFILE",
                needed: peak,
                room,
                limit_value: hard,
                refuse: false,
                claude_fits: Some((room - idle) / FDS_PER_CLAUDE),
                how: how(peak),
            });
        }
    }
    out
}

/// What `hive up` says of `findings` for `need`: one paragraph each.
pub fn message(need: &Need, findings: &[Finding]) -> String {
    let mut text = String::new();
    for f in findings {
        if !text.is_empty() {
            text.push('\n');
        }
        let what = if f.refuse {
            format!(
                "{} agents need {} (idle, before any claude runs)",
                need.agents, f.needed
            )
        } else {
            format!(
                "{} agents with {} claude at once (max_claude) need {}",
                need.agents, need.claude, f.needed
            )
        };
        let unit = if f.limit == "RLIMIT_NOFILE" {
            "descriptors in hive up"
        } else {
            "threads"
        };
        let _ = write!(
            text,
            "{}: {what} {unit}, but the limit is {} ({} free now)",
            f.limit, f.limit_value, f.room
        );
        match f.claude_fits {
            Some(n) => {
                let _ = write!(
                    text,
                    "; turns would fail to start at the peak: set max_claude to {} or less, or {}",
                    n.max(1),
                    f.how
                );
            }
            None => {
                let _ = write!(text, "; {}", f.how);
            }
        }
    }
    text
}

/// Raises the soft `RLIMIT_NOFILE` to the hard one; the two after it.
pub fn raise_nofile() -> Option<(u64, u64)> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return None;
        }
        if l.rlim_cur < l.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: l.rlim_max,
                rlim_max: l.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                l.rlim_cur = l.rlim_max;
            } else {
                log::warn!(
                    "cannot raise the soft RLIMIT_NOFILE to {}: {}",
                    l.rlim_max,
                    std::io::Error::last_os_error()
                );
            }
        }
    }
    Some((l.rlim_cur, l.rlim_max))
}

/// Reads the host's limits and use now; `nofile` is what [`raise_nofile`]
/// left.
pub fn read_host(nofile: Option<(u64, u64)>) -> Host {
    let num = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    // The fourth field of /proc/loadavg: running/total scheduling entities.
    let threads_now = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| {
            let f = t.split_whitespace().nth(3)?;
            f.split_once('/')?.1.parse().ok()
        })
        .unwrap_or(0);
    // SAFETY: geteuid has no memory effects.
    let root = unsafe { libc::geteuid() } == 0;
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one struct we own.
    let unlimited = root
        || unsafe { libc::getrlimit(libc::RLIMIT_NPROC, &mut l) } != 0
        || l.rlim_cur == libc::RLIM_INFINITY;
    let nproc = (!unlimited).then_some(l.rlim_cur);
    let user_threads = if nproc.is_some() { user_threads() } else { 0 };
    Host {
        pid_max: num("/proc/sys/kernel/pid_max"),
        threads_max: num("/proc/sys/kernel/threads-max"),
        threads_now,
        nproc,
        user_threads,
        nofile,
    }
}

/// Threads of processes whose real uid is this process's.
fn user_threads() -> u64 {
    // SAFETY: getuid has no memory effects.
    let uid = unsafe { libc::getuid() }.to_string();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut n = 0;
    for e in dir.flatten() {
        if !e
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        };
        if field("Uid:").and_then(|v| v.first().cloned()).as_deref() != Some(uid.as_str()) {
            continue;
        }
        n += field("Threads:")
            .and_then(|v| v.first().and_then(|t| t.parse::<u64>().ok()))
            .unwrap_or(1);
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roomy() -> Host {
        Host {
            pid_max: Some(4_194_304),
            threads_max: Some(1_000_000),
            threads_now: 500,
            nproc: None,
            user_threads: 0,
            nofile: Some((1_048_576, 1_048_576)),
        }
    }

    #[test]
    fn the_need_grows_with_the_agents_and_the_claude_at_once() {
        let n = Need::new(1000, 40);
        assert_eq!(n.threads_idle(), HIVE_THREADS + 1000 * AGENT_THREADS);
        assert_eq!(n.threads_with(40), n.threads_idle() + 40 * CLAUDE_THREADS);
        assert_eq!(n.fds_with(0), FDS_BASE + 1000 * FDS_PER_AGENT);
        // No more claude than agents.
        assert_eq!(Need::new(3, 66).claude, 3);
        assert!(check(&n, &roomy()).is_empty());
    }

    #[test]
    fn a_limit_the_idle_fleet_passes_refuses_and_one_only_the_peak_passes_warns() {
        let need = Need::new(2000, 100);
        // The default pid_max: 2000 idle agents do not fit.
        let host = Host {
            pid_max: Some(32_768),
            ..roomy()
        };
        let f = check(&need, &host);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].limit, "kernel.pid_max");
        assert!(f[0].refuse);
        assert_eq!(f[0].needed, need.threads_idle());
        assert_eq!(f[0].room, 32_768 - 500);
        // Room for the idle fleet and 10 claude, not 100: a warning that
        // names the max_claude that fits.
        let room = need.threads_idle() + 10 * CLAUDE_THREADS + 5;
        let host = Host {
            threads_max: Some(room + 500),
            ..roomy()
        };
        let f = check(&need, &host);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].limit, "kernel.threads-max");
        assert!(!f[0].refuse);
        assert_eq!(f[0].claude_fits, Some(10));
        assert_eq!(f[0].needed, need.threads_with(100));
        // RLIMIT_NPROC counts the user's threads already running.
        let host = Host {
            nproc: Some(need.threads_idle() + 100),
            user_threads: 200,
            ..roomy()
        };
        let f = check(&need, &host);
        assert_eq!((f[0].limit, f[0].refuse), ("RLIMIT_NPROC", true));
        // Descriptors: the hard limit is the room.
        let host = Host {
            nofile: Some((1024, 4096)),
            ..roomy()
        };
        let f = check(&need, &host);
        assert_eq!((f[0].limit, f[0].refuse), ("RLIMIT_NOFILE", true));
        assert_eq!(f[0].needed, need.fds_with(0));
    }

    #[test]
    fn the_message_names_the_need_the_limit_and_how_to_raise_it() {
        let need = Need::new(2000, 100);
        let host = Host {
            pid_max: Some(32_768),
            nofile: Some((1024, 1024)),
            ..roomy()
        };
        let text = message(&need, &check(&need, &host));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            lines[0],
            format!(
                "kernel.pid_max: 2000 agents need {} (idle, before any claude runs) threads, but \
                 the limit is 32768 (32268 free now); raise it: `sysctl -w kernel.pid_max={}` \
                 (at most 4194304; keep it in /etc/sysctl.d/)",
                need.threads_idle(),
                raise_to(500 + need.threads_with(100))
            )
        );
        assert!(
            lines[1].starts_with(&format!(
                "RLIMIT_NOFILE: 2000 agents need {} (idle, before any claude runs) descriptors \
                 in hive up, but the limit is 1024",
                need.fds_with(0)
            )),
            "{}",
            lines[1]
        );
        assert!(lines[1].contains("LimitNOFILE="), "{}", lines[1]);
    }
}
