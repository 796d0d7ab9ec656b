//! Build script: records the git revision the binary was built from, so `hive
//! --version` and `get_agent_meta` can report `hyperhive_rev`.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
}

fn main() {
    let rev = std::env::var("HYPERHIVE_REV")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=HYPERHIVE_REV={rev}");
    println!("cargo:rerun-if-env-changed=HYPERHIVE_REV");
    // Watch where HEAD and the branches really are: in a worktree `.git` is a
    // file, and a watched path that does not exist reruns this on every build.
    let git_dir = git(&["rev-parse", "--git-dir"]);
    let common = git(&["rev-parse", "--git-common-dir"]);
    let watched = [
        git_dir.as_ref().map(|d| Path::new(d).join("HEAD")),
        common.as_ref().map(|d| Path::new(d).join("refs/heads")),
        common.as_ref().map(|d| Path::new(d).join("packed-refs")),
    ];
    for path in watched.into_iter().flatten().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    // Without any, cargo would rerun this when any file of the package changes.
    println!("cargo:rerun-if-changed=src/build.rs");
}
