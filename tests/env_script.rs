//! `hive env-script`: the `cargo` function of the bash environment script, run by
//! real bash with a fake `cargo` first on PATH that prints its argv, one argument
//! per line. Each case is the command typed and the argv cargo must receive.

mod common;

use common::hive::{run_hive, TempDir};
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const CASES: &[(&str, &str)] = &[
    // Compile subcommands get `--message-format short`.
    ("cargo build", "build --message-format short"),
    (
        "cargo build --release",
        "build --release --message-format short",
    ),
    (
        "cargo check --all-targets",
        "check --all-targets --message-format short",
    ),
    (
        "cargo clippy -- -D warnings",
        "clippy --message-format short -- -D warnings",
    ),
    ("cargo test", "test --message-format short"),
    (
        "cargo test foo -- --nocapture",
        "test foo --message-format short -- --nocapture",
    ),
    (
        "cargo run --bin x -- a b",
        "run --bin x --message-format short -- a b",
    ),
    (
        "cargo doc --no-deps",
        "doc --no-deps --message-format short",
    ),
    ("cargo bench", "bench --message-format short"),
    (
        "cargo install ripgrep",
        "install ripgrep --message-format short",
    ),
    (
        "cargo rustc -- -C opt-level=3",
        "rustc --message-format short -- -C opt-level=3",
    ),
    (
        "cargo fix --allow-dirty",
        "fix --allow-dirty --message-format short",
    ),
    ("cargo b", "b --message-format short"),
    // `+toolchain` and global options before the subcommand.
    (
        "cargo +nightly build",
        "+nightly build --message-format short",
    ),
    (
        "cargo +1.80.0 -q test",
        "+1.80.0 -q test --message-format short",
    ),
    (
        "cargo --config k=v -Z x check",
        "--config k=v -Z x check --message-format short",
    ),
    ("cargo -C sub build", "-C sub build --message-format short"),
    // Already a format: untouched.
    (
        "cargo build --message-format json",
        "build --message-format json",
    ),
    (
        "cargo build --message-format=json",
        "build --message-format=json",
    ),
    (
        "cargo +nightly test --message-format=short",
        "+nightly test --message-format=short",
    ),
    // After `--` it belongs to the program, so cargo still gets short.
    (
        "cargo run -- --message-format json",
        "run --message-format short -- --message-format json",
    ),
    // Other subcommands and third-party ones: untouched.
    ("cargo new foo", "new foo"),
    (
        "cargo add serde --features derive",
        "add serde --features derive",
    ),
    ("cargo fmt --all", "fmt --all"),
    ("cargo nextest run", "nextest run"),
    ("cargo-clippy clippy", "cargo-clippy clippy"),
    ("cargo --version", "--version"),
    ("cargo", ""),
    ("cargo help build", "help build"),
    // Arguments with spaces survive.
    ("cargo test 'a b'", "test\na b\n--message-format\nshort"),
];

fn setup(dir: &TempDir) -> std::path::PathBuf {
    let (code, script, err) = run_hive(&["env-script"], None, &[]);
    assert_eq!(code, 0, "hive env-script failed: {err}");
    assert!(script.contains("cargo()"), "{script}");
    let env = dir.path().join("bash-env.sh");
    std::fs::write(&env, &script).unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["cargo", "cargo-clippy"] {
        let fake = bin.join(name);
        std::fs::write(
            &fake,
            format!("#!/bin/sh\n[ {name} = cargo ] || echo {name}\nfor a in \"$@\"; do echo \"$a\"; done\n"),
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    env
}

fn argv_lines(expected: &str) -> String {
    if expected.contains('\n') {
        return format!("{expected}\n");
    }
    expected
        .split_whitespace()
        .map(|a| format!("{a}\n"))
        .collect()
}

/// Runs `line` in bash with BASH_ENV set, as a bash task runs.
fn run(env: &std::path::Path, bin: &std::path::Path, line: &str) -> String {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-c", line])
        .env("BASH_ENV", env)
        .env("PATH", path)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "{line}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn cargo_gets_short_messages_exactly_where_it_should() {
    let dir = TempDir::new("envs");
    let env = setup(&dir);
    let bin = dir.path().join("bin");
    let mut failures = Vec::new();
    for (line, want) in CASES {
        let got = run(&env, &bin, line);
        if got != argv_lines(want) {
            failures.push(format!(
                "{line}\n  want {:?}\n  got  {got:?}",
                argv_lines(want)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_script_is_quiet_and_works_under_set_u_and_when_sourced() {
    let dir = TempDir::new("envu");
    let env = setup(&dir);
    let bin = dir.path().join("bin");
    let line = format!("set -eu; . {}; cargo build; cargo new x", env.display());
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-c", &line])
        .env("PATH", path)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "build\n--message-format\nshort\nnew\nx\n"
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
