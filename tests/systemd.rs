//! The example units in `docs/systemd/`: `systemd-analyze verify` accepts them
//! with the `hive` binary under test in place of `/usr/local/bin/hive`, without a
//! warning about any of their lines, and each carries the hardening the deploy
//! doc promises. Skips loudly without `systemd-analyze`; fails instead under
//! `HIVE_REQUIRE_REAL_CLAUDE=1` (CI).

mod common;

use common::hive::{hive_bin, TempDir};
use std::path::Path;
use std::process::Command;

const UNITS: &[&str] = &[
    "hive-broker.service",
    "hive-up.service",
    "hive-agent@.service",
    "hive-matrix-bridge.service",
    "hive-bash@.service",
];

fn unit_text(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("docs/systemd")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn every_unit_is_hardened() {
    for name in UNITS {
        let text = unit_text(name);
        for line in [
            "NoNewPrivileges=yes",
            "ProtectSystem=",
            "ProtectHome=yes",
            "PrivateTmp=yes",
            "RestrictAddressFamilies=AF_UNIX",
            "ExecStart=/usr/local/bin/hive ",
            "Restart=always",
            // The default soft limit (1024) is what the descriptor probe exhausted.
            "LimitNOFILE=",
        ] {
            assert!(text.contains(line), "{name} lacks {line}");
        }
    }
    assert!(unit_text("hive-agent@.service").contains("AF_UNIX AF_INET AF_INET6"));
    // The swarm: only the bridge reaches the network; the broker stays
    // AF_UNIX-only, and a refused Matrix login is not retried.
    let bridge = unit_text("hive-matrix-bridge.service");
    for line in [
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
        "RestartPreventExitStatus=2",
        "CapabilityBoundingSet=\n",
        "--socket /run/hyperhive/bridge.sock",
    ] {
        assert!(
            bridge.contains(line),
            "hive-matrix-bridge.service lacks {line}"
        );
    }
    assert!(unit_text("hive-broker.service").contains("RestrictAddressFamilies=AF_UNIX\n"));
}

/// The bash-task daemon is a unit of its own that the agent's unit wants but
/// does not take down: the harness starts no daemon of its own, both name
/// the same socket, which lives in the daemon unit's runtime dir (an agent's
/// restart removes its own runtime dir, not the socket).
#[test]
fn the_bash_daemon_is_a_unit_of_its_own_on_the_agents_socket() {
    let agent = unit_text("hive-agent@.service");
    let bash = unit_text("hive-bash@.service");
    let value = |text: &str, key: &str| -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix(key))
            .map(str::to_string)
            .collect()
    };
    assert!(
        value(&agent, "Wants=")
            .iter()
            .any(|w| w.contains("hive-bash@%i.service")),
        "{agent}"
    );
    assert!(value(&agent, "After=")[0].contains("hive-bash@%i.service"));
    // One private /tmp for claude and the tasks.
    assert_eq!(value(&agent, "JoinsNamespaceOf="), ["hive-bash@%i.service"]);
    assert_eq!(value(&bash, "PrivateTmp="), value(&agent, "PrivateTmp="));
    for forbidden in ["BindsTo=", "PartOf=", "Requires="] {
        assert!(
            !agent.contains(forbidden),
            "a restart would take tasks down"
        );
    }
    assert_eq!(
        value(&agent, "Environment=HIVE_BASH_DAEMON="),
        ["external"],
        "hive serve must not start a daemon of its own"
    );
    let socket = value(&agent, "Environment=HIVE_BASH_SOCKET=");
    assert_eq!(socket, value(&bash, "Environment=HIVE_BASH_SOCKET="));
    assert_eq!(socket, ["/run/hive-bash-%i/socket"]);
    assert_eq!(value(&bash, "RuntimeDirectory="), ["hive-bash-%i"]);
    assert_eq!(
        value(&bash, "ExecStart="),
        ["/usr/local/bin/hive bash-daemon --state-dir /var/lib/hyperhive-agents/%i"]
    );
    // The agent's user, environment and working directory.
    for key in [
        "User=",
        "Group=",
        "EnvironmentFile=",
        "WorkingDirectory=",
        "Environment=HIVE_SOCKET=",
        "Environment=HIVE_LABEL=",
        "Environment=HOME=",
    ] {
        assert_eq!(value(&agent, key), value(&bash, key), "{key}");
    }
}

#[test]
fn systemd_analyze_verify_accepts_the_units() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() == Ok("1") {
            panic!("systemd-analyze is missing (apt-get install systemd) and HIVE_REQUIRE_REAL_CLAUDE=1");
        }
        eprintln!("SKIPPED tests/systemd.rs: systemd-analyze is missing (apt-get install systemd)");
        return;
    }
    let dir = TempDir::new("units");
    let bin = hive_bin().display().to_string();
    let mut paths = Vec::new();
    for name in UNITS {
        let text = unit_text(name).replace("/usr/local/bin/hive", &bin);
        // A template is verified through one instance.
        let file = name.replace("@.", "@ana.");
        std::fs::write(dir.path().join(&file), text).unwrap();
        paths.push(format!("./{file}"));
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .args(&paths)
        .current_dir(dir.path())
        .output()
        .expect("run systemd-analyze");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|l| UNITS.iter().any(|u| l.contains(&u.replace("@.", "@ana."))))
        .collect();
    assert!(
        out.status.success() && ours.is_empty(),
        "systemd-analyze verify ({}):\n{stderr}",
        out.status
    );
}
