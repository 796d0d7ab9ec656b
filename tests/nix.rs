//! The nix files: every `.nix` under `nix/` parses (`nix-instantiate --parse`),
//! `nix/tests.nix` evaluates the pure option → environment mapping of
//! `nix/env.nix` against expected values and its assertions to an empty list of
//! failures, `nix/tests-modules.nix` does the same for what module.nix and
//! host.nix make of option values (with a stub lib and pkgs, as CI has no
//! nixpkgs), and every variable the mapping can set is documented. Skips loudly
//! without `nix-instantiate` (Debian's `nix-bin`); fails instead under
//! `HIVE_REQUIRE_REAL_CLAUDE=1` (CI).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

fn nix_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("nix")
}

/// Held around every nix-instantiate run of this test binary. On a machine
/// where nix never ran, each run first creates the state dir
/// (`/nix/var/nix/profiles`, its gcroots symlink, the db); two first runs at
/// once race there and one fails with "creating symlink … File exists"
/// (reproduced with `NIX_STATE_DIR` pointed at an empty dir). The tests run
/// in parallel threads, so they take turns.
static NIX: Mutex<()> = Mutex::new(());

/// Runs nix-instantiate in `nix/`, one run at a time; None when it is not
/// installed.
fn nix_instantiate(args: &[&str]) -> Option<Output> {
    // A test that panicked after its run left nothing half-done behind the lock.
    let _turn = NIX.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let out = Command::new("nix-instantiate")
        .current_dir(nix_dir())
        .args(args)
        // No daemon, no store writes, no build users: evaluation only.
        .env("NIX_CONFIG", "build-users-group =")
        .output();
    match out {
        Ok(o) => Some(o),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() == Ok("1") {
                panic!("nix-instantiate is missing (apt-get install nix-bin) and HIVE_REQUIRE_REAL_CLAUDE=1");
            }
            eprintln!("SKIPPED tests/nix.rs: nix-instantiate is missing (apt-get install nix-bin)");
            None
        }
        Err(e) => panic!("cannot run nix-instantiate: {e}"),
    }
}

#[test]
fn every_nix_file_parses() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(nix_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "nix"))
        .collect();
    files.sort();
    for want in [
        "env.nix",
        "module.nix",
        "host.nix",
        "package.nix",
        "tests.nix",
        "bash-unit.nix",
        "tests-bash.nix",
        "tests-small.nix",
    ] {
        assert!(
            files.iter().any(|f| f.ends_with(want)),
            "nix/{want} is missing"
        );
    }
    for f in &files {
        let Some(out) = nix_instantiate(&["--parse", &f.display().to_string()]) else {
            return;
        };
        assert!(
            out.status.success(),
            "{} does not parse: {}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// Evaluates a nix/ test file that gives a list of failures; asserts it is empty.
fn no_failures(file: &str) {
    let Some(out) = nix_instantiate(&["--eval", "--strict", "--json", file]) else {
        return;
    };
    assert!(
        out.status.success(),
        "nix/{file} does not evaluate: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failures: Vec<String> = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "nix/{file} did not give a JSON list ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert!(failures.is_empty(), "nix/{file}:\n{}", failures.join("\n"));
}

#[test]
fn the_mapping_and_the_assertions_hold() {
    no_failures("tests.nix");
}

/// module.nix and host.nix evaluated against a stub lib and pkgs.
#[test]
fn the_modules_wire_options_into_units_and_files() {
    no_failures("tests-modules.nix");
}

/// bash-unit.nix: the agent's bash-task daemon as a unit of its own, with the
/// agent's user, environment and socket, wanted by the agent's unit.
#[test]
fn the_bash_daemon_has_a_unit_of_its_own() {
    no_failures("tests-bash.nix");
}

/// The audit's untested nix rows: the package (and `hive wake`) on the PATH,
/// claudePluginsAutoUpdate, and `forge.url = ""` reaching hive as an empty
/// HIVE_FORGE_URL.
#[test]
fn the_small_wiring_the_audit_found_untested_holds() {
    no_failures("tests-small.nix");
}

/// Every variable `agentEnv` sets for a fully populated agent is read by hive
/// and listed in docs/env.md or docs/web.md.
#[test]
fn every_mapped_variable_is_documented() {
    let expr = r#"let e = import ./env.nix; in builtins.attrNames (e.agentEnv (e.defaults // {
        model = "m"; icon = "/i"; staticDir = "/s"; frontend = { dist = "/d"; extraFiles = {}; };
        hiveName = "h"; swarmName = "s"; operatorPronouns = "they/them";
        contextWindowTokens = { sonnet = 1000000; };
        extraMcpServers = { x = { command = "/bin/x"; }; };
    }))"#;
    let Some(out) = nix_instantiate(&["--eval", "--strict", "--json", "-E", expr]) else {
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = ["docs/env.md", "docs/web.md"]
        .iter()
        .map(|d| std::fs::read_to_string(root.join(d)).unwrap())
        .collect::<String>();
    for name in &names {
        // A per-model window is documented by its pattern.
        let shown = if name.starts_with("HIVE_CONTEXT_WINDOW_TOKENS_") {
            "HIVE_CONTEXT_WINDOW_TOKENS_<KEY>"
        } else {
            name
        };
        assert!(
            docs.contains(&format!("`{shown}`")),
            "{name} is set by nix/env.nix but not documented in docs/env.md or docs/web.md"
        );
    }
    assert!(names.len() >= 20, "{names:?}");
    for want in [
        "HIVE_HIVE_NAME",
        "HIVE_SWARM_NAME",
        "HIVE_OPERATOR_PRONOUNS",
        "HIVE_CONTEXT_WINDOW_TOKENS_SONNET",
        "HIVE_EXTRA_MCP_SERVERS",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
}
