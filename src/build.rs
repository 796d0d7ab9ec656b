//! Build script: records the git revision the binary was built from, so `hive
//! --version` and `get_agent_meta` can report `hyperhive_rev`.

use std::process::Command;

fn main() {
    let rev = std::env::var("HYPERHIVE_REV").ok().unwrap_or_else(|| {
        Command::new("git")
            .args(["rev-parse", "--short=12", "HEAD"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|| "unknown".into())
    });
    println!("cargo:rustc-env=HYPERHIVE_REV={rev}");
    println!("cargo:rerun-if-env-changed=HYPERHIVE_REV");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs/heads");
}
