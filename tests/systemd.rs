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
