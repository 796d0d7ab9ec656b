//! Agents under `hive up` cannot act as the operator or as each other. A real
//! `hive up` with two agents (`ana`, `bob`) under the fake claude; the test drives
//! ana's bash-task daemon (`DATA/agents/ana/run/bash.sock`) to run, as an agent
//! task, what a prompt-injected agent would try: operator commands on the host
//! socket, the dashboard token, the fleet file, bob's dirs, the supervisor's
//! environment. As root (the mount and PID namespaces), as an unprivileged uid
//! (user namespaces too), with `HIVE_ISOLATION=off`, and where the kernel
//! refuses namespaces. On a machine that cannot isolate at all, the isolated
//! cases skip loudly (they fail under `HIVE_REQUIRE_REAL_CLAUDE=1`, as in CI).

mod common;

use common::hive::wait_for;
use common::up::{Launch, Up};
use hyperhive::bash::proto::TaskView;
use std::time::Duration;

const FLEET: &str = r#"{"agents": [
  {"name": "ana", "env": {"FAKE_CLAUDE_DIR": "@FAKE(ana)"}},
  {"name": "bob", "env": {"FAKE_CLAUDE_DIR": "@FAKE(bob)", "BOB_KEY": "bob-SECRETMARKER"}}
]}"#;

const AGENTS: [&str; 2] = ["ana", "bob"];

/// The operator's secrets in `hive up`'s environment.
fn secrets() -> Vec<(String, String)> {
    vec![
        ("HIVE_DASHBOARD_TOKEN".into(), "dash-SECRETMARKER".into()),
        ("HIVE_WEB_TOKEN".into(), "web-SECRETMARKER".into()),
    ]
}

/// A task that must fail, with nothing of `leak` in what it printed.
fn refused(up: &Up, agent: &str, cmd: &str, leak: &str) -> TaskView {
    let t = up.bash_task(agent, cmd);
    assert_ne!(t.exit_code, Some(0), "{cmd} worked: {t:?}");
    let out = format!("{}{}", t.stdout_tail, t.stderr_tail);
    assert!(!out.contains(leak), "{cmd} printed {leak:?}: {out}");
    t
}

fn succeeded(up: &Up, agent: &str, cmd: &str) -> String {
    let t = up.bash_task(agent, cmd);
    assert_eq!(t.exit_code, Some(0), "{cmd} failed: {t:?}");
    t.stdout_tail
}

/// The checks every isolated hive passes: ana cannot reach the operator, bob or
/// the supervisor, and still has its own dirs, socket and page.
fn ana_is_confined(up: &Up) {
    let data = up.data();
    let d = data.display();
    let hive = up.binary();
    let hive = hive.display();
    let host = data.join("run/host.sock");
    assert!(host.exists(), "the host socket is there, outside");
    // The dashboard token file (written by hive up) is there outside; if this
    // build does not write one, the test puts one there to look for.
    let token = data.join("dashboard-token");
    if !token.exists() {
        std::fs::write(&token, "dash-SECRETMARKER\n").unwrap();
    }

    // Operator commands on the host socket.
    let t = refused(
        up,
        "ana",
        &format!("{hive} agents --socket {}", host.display()),
        "bob",
    );
    assert!(t.stderr_tail.contains("host.sock"), "{t:?}");
    let fleet = up.fleet_file();
    let before = std::fs::read(&fleet).unwrap();
    refused(
        up,
        "ana",
        &format!(
            r#"python3 -c 'import socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.sendall(b"{{\"cmd\":\"set_permissions\",\"agent\":\"ana\",\"tool_groups\":[\"messaging\",\"lifecycle\",\"approvals\",\"diagnostics\",\"web_tools\"],\"capabilities\":[\"query_agent_state\",\"read_host_journal\"]}}\n")
print(s.recv(4096))' {}"#,
            host.display()
        ),
        "ok",
    );
    assert_eq!(
        std::fs::read(&fleet).unwrap(),
        before,
        "the fleet file is unchanged"
    );
    assert_eq!(
        up.state("ana").unwrap().restarts,
        0,
        "ana was not restarted"
    );

    // The operator's and the other agent's files.
    for cmd in [
        format!("cat {d}/dashboard-token"),
        format!("cat {}", fleet.display()),
        format!("cat {d}/hive.json"),
        format!("ls {d}/agents/bob"),
        format!("ls {d}/run/agents/bob"),
        format!("cat {d}/agents/bob/state/web-token"),
        format!("ls {d}/run/pages"),
        format!("ls {d}/logs"),
        format!("cat {d}/broker.db"),
    ] {
        refused(up, "ana", &cmd, "SECRETMARKER");
    }
    // The fleet file's directory is there, but empty.
    let fleet_dir = fleet.parent().unwrap();
    assert!(fleet_dir.read_dir().unwrap().count() > 0);
    let ls = format!("ls -A {}", fleet_dir.display());
    assert_eq!(succeeded(up, "ana", &ls), "");
    // Only ana's own paths are left of DATA.
    assert_eq!(succeeded(up, "ana", &format!("ls {d}")), "agents\nrun\n");
    assert_eq!(succeeded(up, "ana", &format!("ls {d}/agents")), "ana\n");
    assert_eq!(succeeded(up, "ana", &format!("ls {d}/run/agents")), "ana\n");

    // The supervisor's environment and every other process are out of sight:
    // ana's tasks live in a PID namespace whose PID 1 is its bash daemon,
    // exec'd in place by its sandbox (one process).
    refused(
        up,
        "ana",
        &format!("cat /proc/{}/environ", up.pid()),
        "SECRETMARKER",
    );
    let pid1 = succeeded(up, "ana", "tr '\\0' ' ' < /proc/1/cmdline");
    assert!(pid1.contains(" bash-daemon "), "{pid1}");
    let all = succeeded(up, "ana", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '");
    assert!(
        !all.contains(" up ") && !all.contains("agents/bob"),
        "ana sees other processes: {all}"
    );
    let t = up.bash_task(
        "ana",
        "env; grep -l SECRETMARKER /proc/[0-9]*/environ 2>/dev/null",
    );
    assert!(!t.stdout_tail.contains("SECRETMARKER"), "{t:?}");

    // Kernel settings are read-only, even to a root hive's uid 0 (the test
    // writes back the value it read, so a failure changes nothing).
    refused(
        up,
        "ana",
        "v=$(cat /proc/sys/kernel/core_pattern) && printf '%s\\n' \"$v\" > /proc/sys/kernel/core_pattern",
        "SECRETMARKER",
    );

    // What is ana's still works: its state dir, its socket, its page (at
    // /agent/ana/ on hive up's listener, which ana's sandbox does not show).
    let own = succeeded(up, "ana", &format!("cat {d}/agents/ana/state/web-token"));
    assert!(!own.trim().is_empty());
    let sock = data.join("run/agents/ana/mcp.sock");
    succeeded(
        up,
        "ana",
        &format!(
            "{hive} wake --from cron --body isolation-wake-ok --socket {}",
            sock.display()
        ),
    );
    up.wait_prompt("ana", "isolation-wake-ok", 1);
    let page = up.page("ana").get("/api/state");
    assert_eq!(page.status, 200, "ana's page answers: {}", page.body);
    // bob was never touched.
    let bob = up.state("bob").unwrap();
    assert_eq!((bob.state.as_str(), bob.restarts), ("running", 0));
    // What ana can still write, its own dir, cannot stall the supervisor (a
    // FIFO where a port file was).
    let port_file = format!("{d}/agents/ana/state/hyperhive-port");
    succeeded(
        up,
        "ana",
        &format!("rm -f {port_file} && mkfifo {port_file}"),
    );
    let ana = up.state("ana").unwrap();
    assert_eq!((ana.state.as_str(), ana.port), ("running", None));
}

#[test]
fn an_agents_bash_task_cannot_reach_the_operator_or_the_other_agents() {
    let up = Up::launch(
        FLEET,
        &AGENTS,
        Launch {
            env: secrets(),
            ..Launch::default()
        },
    );
    if !isolated(&up, "hive up: agents are isolated (") {
        return;
    }
    ana_is_confined(&up);
}

/// Whether `hive up` says `line`; where this kernel refuses every sandbox the
/// test skips loudly (and fails under `HIVE_REQUIRE_REAL_CLAUDE=1`, as in CI).
fn isolated(up: &Up, line: &str) -> bool {
    let log = up.log();
    if log.contains(line) {
        return true;
    }
    let refused = "hive up: agents are NOT isolated (the kernel refused a sandbox";
    let why = log.lines().find(|l| l.starts_with(refused));
    match why {
        Some(why) if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() != Ok("1") => {
            eprintln!("SKIPPED: this machine cannot isolate agents: {why}");
            false
        }
        _ => panic!("no {line:?} in the log: {log}"),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no arguments.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn an_unprivileged_hive_up_confines_its_agents_with_user_namespaces() {
    if !is_root() {
        eprintln!("SKIPPED: changing to uid 65534 needs root");
        return;
    }
    let up = Up::launch(
        FLEET,
        &AGENTS,
        Launch {
            env: secrets(),
            wrapper: [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
            ]
            .map(String::from)
            .to_vec(),
            owner: Some(65534),
            ..Launch::default()
        },
    );
    if !isolated(
        &up,
        "hive up: agents are isolated (user, mount and PID namespaces)",
    ) {
        return;
    }
    assert_eq!(succeeded(&up, "ana", "id -u").trim(), "65534");
    ana_is_confined(&up);
    // Supervision works through the sandbox: SIGKILL to it takes the whole
    // namespace down and the agent comes back; SIGTERM to hive up stops all.
    let mut up = up;
    let pid = up.wait_running("ana");
    wait_for(
        Duration::from_secs(10),
        "hive serve alone (no sandbox helper) with ana's state dir",
        || (sandbox_processes(&up, "ana", "serve") == 1).then_some(()),
    );
    // That one process is the harness hive up supervises, its direct child.
    assert_eq!(sandbox_pids(&up, "ana", "serve"), [pid]);
    assert_eq!(parent_of(pid), Some(up.pid()));
    // The bash-task daemon has a sandbox of its own, the same view.
    wait_for(
        Duration::from_secs(10),
        "hive bash-daemon alone in its sandbox",
        || (sandbox_processes(&up, "ana", "bash-daemon") == 1).then_some(()),
    );
    let daemon = sandbox_pids(&up, "ana", "bash-daemon");
    assert_eq!(parent_of(daemon[0]), Some(up.pid()));
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    wait_for(Duration::from_secs(30), "ana to come back", || {
        let s = up.state("ana")?;
        (s.state == "running" && s.pid != Some(pid) && s.restarts == 1).then_some(())
    });
    up.wait_running("ana");
    wait_for(
        Duration::from_secs(10),
        "the old sandbox to be gone",
        || (sandbox_processes(&up, "ana", "serve") == 1).then_some(()),
    );
    let back = up.wait_running("ana");
    assert_eq!(sandbox_pids(&up, "ana", "serve"), [back]);
    // The harness's crash did not touch its bash-task daemon.
    assert_eq!(sandbox_pids(&up, "ana", "bash-daemon"), daemon);
    let pids: Vec<u32> = up.states().iter().filter_map(|s| s.pid).collect();
    let status = up.terminate();
    assert!(status.success(), "{status}: {}", up.log());
    for pid in pids {
        assert!(
            unsafe { libc::kill(pid as i32, 0) } != 0,
            "{pid} still runs"
        );
    }
    wait_for(
        Duration::from_secs(10),
        "ana's processes to be gone",
        || (sandbox_processes(&up, "ana", "") == 0).then_some(()),
    );
}

/// How many processes run `hive SUBCOMMAND` on `agent`'s state dir (any
/// subcommand for ""): the `hive serve` or `hive bash-daemon` itself, PID 1
/// of its sandbox (exec'd in place by `hive __sandbox --in-place`), and
/// nothing else.
fn sandbox_processes(up: &Up, agent: &str, subcommand: &str) -> usize {
    sandbox_pids(up, agent, subcommand).len()
}

/// The parent pid of host process `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn sandbox_pids(up: &Up, agent: &str, subcommand: &str) -> Vec<u32> {
    let needle = up.data().join("agents").join(agent).join("state");
    let needle = needle.to_string_lossy().into_owned();
    let sub = format!("\0{subcommand}\0");
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let c = std::fs::read(e.path().join("cmdline")).ok()?;
            let c = String::from_utf8_lossy(&c).into_owned();
            (c.contains(&needle) && (subcommand.is_empty() || c.contains(&sub))).then_some(pid)
        })
        .collect();
    pids.sort();
    pids
}

#[test]
fn with_isolation_off_hive_up_says_so_and_agents_still_lack_the_operators_secrets() {
    let up = Up::launch(
        FLEET,
        &AGENTS,
        Launch {
            env: [secrets(), vec![("HIVE_ISOLATION".into(), "off".into())]].concat(),
            ..Launch::default()
        },
    );
    let log = up.log();
    let notice = log
        .lines()
        .find(|l| l.starts_with("hive up: agents are NOT isolated (HIVE_ISOLATION=off)"))
        .unwrap_or_else(|| panic!("no notice: {log}"));
    assert!(
        notice.contains("operator socket") && notice.contains("HIVE_ISOLATION=required"),
        "{notice}"
    );
    // Unisolated, the host socket is in reach (what the notice warns about) …
    let host = up.data().join("run/host.sock");
    succeeded(&up, "ana", &format!("test -S {}", host.display()));
    // … but the operator's variables never reach an agent.
    let env = succeeded(&up, "ana", "env");
    assert!(!env.contains("SECRETMARKER"), "{env}");
    assert!(env.contains("HIVE_LABEL=ana"), "{env}");
}

/// `hive up` as uid 0 without capabilities in a user namespace where no further
/// user namespace may be created: the kernel refuses every sandbox.
fn no_namespaces() -> Vec<String> {
    [
        "unshare",
        "--user",
        "--map-root-user",
        "sh",
        "-c",
        "echo 0 > /proc/sys/user/max_user_namespaces && \
         exec setpriv --bounding-set=-all --inh-caps=-all \"$@\"",
        "sh",
    ]
    .map(String::from)
    .to_vec()
}

#[test]
fn where_the_kernel_refuses_namespaces_hive_up_says_so_or_refuses_to_start() {
    if !is_root() {
        eprintln!("SKIPPED: the restricted user namespace is made as root");
        return;
    }
    let up = Up::launch(
        FLEET,
        &AGENTS,
        Launch {
            wrapper: no_namespaces(),
            ..Launch::default()
        },
    );
    let log = up.log();
    assert!(
        log.lines()
            .any(|l| l
                .starts_with("hive up: agents are NOT isolated (the kernel refused a sandbox: ")),
        "{log}"
    );
    let host = up.data().join("run/host.sock");
    succeeded(&up, "ana", &format!("test -S {}", host.display()));
    drop(up);

    let mut up = Up::launch(
        FLEET,
        &AGENTS,
        Launch {
            wrapper: no_namespaces(),
            env: vec![("HIVE_ISOLATION".into(), "required".into())],
            no_wait: true,
            ..Launch::default()
        },
    );
    let status = up.wait_exit();
    assert!(!status.success(), "{status}");
    let log = up.log();
    assert!(
        log.contains("hive: HIVE_ISOLATION=required, but agents cannot be isolated: the kernel refused a sandbox"),
        "{log}"
    );
    assert!(!up.data().join("run/host.sock").exists(), "nothing started");
    assert!(!up.data().join("agents").exists(), "no agent ran");
}
