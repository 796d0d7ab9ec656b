//! The nix files: every `.nix` under `nix/` parses (`nix-instantiate --parse`),
//! `nix/tests.nix` evaluates the pure option → environment mapping of
//! `nix/env.nix` against expected values and its assertions to an empty list of
//! failures, `nix/tests-modules.nix` does the same for what module.nix and
//! host.nix make of option values (with a stub lib and pkgs, as CI has no
//! nixpkgs), and every variable the mapping can set is documented. `hive up`
//! on NixOS (`services.hyperhive.up`): `nix/tests-up.nix` checks its unit, and
//! the fleet file it generates is run through `hive fleet check` (what `hive
//! up` loads) and its activation step through bash on real files with the
//! binary under test: the operator's writes kept, a declared change applied, a
//! conflict refused naming the key; then a real `hive up` on the activated
//! file: an approved spawn and `hive budget set` write it and survive the next
//! rebuild, and a rebuild carried out as the unit does (activation, then its
//! `ExecReload`) restarts the changed agent and keeps the other's pid; and a
//! path key is shown read-only in `hive __sandbox`. Skips loudly
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
        "tests-up.nix",
        "up-example.nix",
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

/// host.nix with `up.enable`: `hive up` as one unit under a dedicated
/// non-root user, HIVE_ISOLATION=required, `hive reload` on a fleet-file
/// change, the activation step, every per-agent option under its fleet key.
#[test]
fn the_up_module_runs_hive_up_as_one_unit() {
    no_failures("tests-up.nix");
}

/// A fresh directory under /tmp, removed on drop.
struct Tmp(PathBuf);

impl Tmp {
    fn new(tag: &str) -> Tmp {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = PathBuf::from(format!(
            "/tmp/hv-nix-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Tmp(p)
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Evaluates `nix/up-example.nix` with `args` (a nix attrset's inside) and
/// returns the attribute `attr` (a string). None without nix-instantiate.
fn up_example(args: &str, attr: &str) -> Option<String> {
    let expr = format!("(import ./up-example.nix {{ {args} }}).{attr}");
    let out = nix_instantiate(&["--eval", "--strict", "--json", "-E", &expr])?;
    assert!(
        out.status.success(),
        "{expr}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

fn hive(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hive"))
        .args(args)
        .output()
        .unwrap()
}

/// The fleet file the module generates from the per-agent options, path
/// keys included, passes `hive fleet check` (the load `hive up` does at
/// start and at a reload); a path key that names nothing is refused, naming
/// the entry, the key and the path.
#[test]
fn the_generated_fleet_file_passes_hive_ups_validation() {
    let t = Tmp::new("check");
    let d = t.0.display();
    std::fs::create_dir_all(t.0.join("static/games")).unwrap();
    std::fs::write(t.0.join("icon.svg"), "<svg/>").unwrap();
    let agents = format!(
        r#"agents = {{
            ruth = {{ model = "sonnet"; toolGroups = [ "messaging" "meta" "inbox" "execution" "lifecycle" "approvals" ]; }};
            ana = {{ parent = "ruth"; icon = "{d}/icon.svg"; staticDir = "{d}/static";
                    dashboardLinks = [ {{ label = "Stats"; url = "https://stats.example/"; icon = "📊"; }} ];
                    cargo.shortMessages = false; forge.url = ""; claudePlugins = [ "fmt@me" ];
                    extraMcpServers.search = {{ command = "/bin/search-mcp"; }};
                    budget = {{ usd = 5.0; per = "week"; }}; turnUsd = 0.5; }};
        }}; operatorPronouns = "they/them"; contextWindowTokens = {{ sonnet = 1000000; }};"#
    );
    let Some(fleet) = up_example(&agents, "fleet") else {
        return;
    };
    let file = t.0.join("hive.json");
    std::fs::write(&file, &fleet).unwrap();
    let out = hive(&["fleet", "check", &file.display().to_string()]);
    assert!(
        out.status.success(),
        "{fleet}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("valid, 2 agents"), "{said}");
    // The keys reached the file as hive reads them.
    let v: serde_json::Value = serde_json::from_str(&fleet).unwrap();
    let ana = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "ana")
        .unwrap();
    assert_eq!(ana["static_dir"], format!("{d}/static"));
    assert_eq!(ana["cargo_short_messages"], false);
    assert_eq!(ana["dashboard_links"][0]["url"], "https://stats.example/");
    // The static dir gone: refused, naming it.
    std::fs::remove_dir_all(t.0.join("static")).unwrap();
    let out = hive(&["fleet", "check", &file.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "agents[0].static_dir: \"{d}/static\" cannot be read"
        )),
        "{err}"
    );
}

/// Runs the activation step `script` with bash -e, as NixOS's ERR trap
/// would stop at its `false`.
fn activate(script: &str) -> Output {
    Command::new("bash")
        .args(["-e", "-c", script])
        .output()
        .unwrap()
}

fn agent<'a>(v: &'a serde_json::Value, name: &str) -> Option<&'a serde_json::Value> {
    v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == name)
}

/// The activation step on real files: the first rebuild installs the
/// declared file; the operator's writes (a budget set, a spawned agent, as
/// `hive budget set` and an approved spawn write them) survive the next
/// rebuild, whose declared change is applied; a key both sides changed
/// fails the step naming it, with both files left as they were.
#[test]
fn the_activation_step_merges_operator_writes_and_refuses_a_conflict() {
    let t = Tmp::new("act");
    let bin = t.0.join("pkg/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_hive"), bin.join("hive")).unwrap();
    let id = |flag: &str| {
        let o = Command::new("id").arg(flag).output().unwrap();
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let (user, group) = (id("-un"), id("-gn"));
    let data = t.0.join("data");
    let declared = t.0.join("declared.json");
    let common = format!(
        r#"hive = "{}"; dataDir = "{}"; declaredPath = "{}"; user = "{user}"; group = "{group}";"#,
        t.0.join("pkg").display(),
        data.display(),
        declared.display()
    );
    let rebuild = |agents: &str| -> Option<Output> {
        let args = format!("{common} agents = {{ {agents} }};");
        let fleet = up_example(&args, "fleet")?;
        let script = up_example(&args, "activation")?;
        std::fs::write(&declared, fleet).unwrap();
        Some(activate(&script))
    };
    let Some(first) =
        rebuild(r#"ruth = { model = "sonnet"; }; ana = { parent = "ruth"; model = "haiku"; };"#)
    else {
        return;
    };
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let file = data.join("hive.json");
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap()
    };
    assert_eq!(agent(&read(), "ana").unwrap()["model"], "haiku");
    assert!(data.join("hive.declared.json").exists());
    // The operator's writes, as hive writes them: a budget on ana, the
    // hive's budget, a spawned agent.
    let mut v = read();
    v["budget"] = serde_json::json!({"usd": 20.0, "per": "day"});
    v["agents"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|a| a["name"] == "ana")
        .unwrap()["budget"] = serde_json::json!({"usd": 3.0, "per": "day"});
    v["agents"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"name": "kid", "parent": "ana"}));
    std::fs::write(&file, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    // A rebuild that changes ruth's model and adds cat.
    let second = rebuild(
        r#"ruth = { model = "opus"; }; ana = { parent = "ruth"; model = "haiku"; }; cat = { cargo.shortMessages = false; };"#,
    )
    .unwrap();
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    let v = read();
    assert_eq!(agent(&v, "ruth").unwrap()["model"], "opus", "{v}");
    assert_eq!(agent(&v, "ana").unwrap()["budget"]["usd"], 3.0, "{v}");
    assert_eq!(v["budget"]["usd"], 20.0, "{v}");
    assert!(agent(&v, "kid").is_some(), "the spawned agent stays: {v}");
    assert_eq!(agent(&v, "cat").unwrap()["cargo_short_messages"], false);
    // The operator changes ana's model by hand; the next rebuild declares
    // another one: refused, naming the key, nothing written.
    let before = std::fs::read_to_string(&file)
        .unwrap()
        .replace("\"haiku\"", "\"sonnet\"");
    std::fs::write(&file, &before).unwrap();
    let base = std::fs::read_to_string(data.join("hive.declared.json")).unwrap();
    let third = rebuild(
        r#"ruth = { model = "opus"; }; ana = { parent = "ruth"; model = "opus"; }; cat = { cargo.shortMessages = false; };"#,
    )
    .unwrap();
    let err = String::from_utf8_lossy(&third.stderr);
    assert!(!third.status.success(), "{err}");
    assert!(
        err.contains("agents.ana.model was changed both in the fleet file"),
        "{err}"
    );
    assert!(
        err.contains("the hive keeps running with the file as it is"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
    assert_eq!(
        std::fs::read_to_string(data.join("hive.declared.json")).unwrap(),
        base
    );
}

/// A path key is shown to its agent read-only: `hive __sandbox` (what
/// `hive up` runs each agent in) with the `--read-only` paths the
/// supervisor gives for `static_dir` and `icon`, one under the hidden data
/// dir and one outside it: the agent reads both and writes neither, while
/// its own dir stays writable and the rest of the data dir hidden. Skips
/// where the kernel refuses a sandbox (exit 125).
#[test]
fn a_path_key_is_shown_read_only_in_the_sandbox() {
    let t = Tmp::new("ro");
    let data = t.0.join("data");
    for d in ["agents/ana", "static", "secret"] {
        std::fs::create_dir_all(data.join(d)).unwrap();
    }
    std::fs::write(data.join("static/index.html"), "page").unwrap();
    std::fs::write(data.join("secret/s"), "s").unwrap();
    let icon = t.0.join("icon.svg");
    std::fs::write(&icon, "<svg/>").unwrap();
    let p = |x: &Path| x.display().to_string();
    let script = format!(
        "cat {static_}/index.html {icon}; \
         touch {static_}/x 2>/dev/null && echo wrote-static; \
         echo no >> {icon} 2>/dev/null && echo wrote-icon; \
         touch {own}/z && echo own-writable; \
         cat {secret} 2>/dev/null || echo secret-hidden",
        static_ = p(&data.join("static")),
        icon = p(&icon),
        own = p(&data.join("agents/ana")),
        secret = p(&data.join("secret/s")),
    );
    // The sandbox `hive up` gives an agent: one process, PID 1 of the
    // namespaces `sandbox::spawn` makes (`tests/sandbox_spawn.rs`).
    use hyperhive::fleet::sandbox::{self, Spawn, Spec};
    use std::io::Read;
    // SAFETY: geteuid has no arguments.
    let root = unsafe { libc::geteuid() } == 0;
    let spec = Spec {
        userns: !root,
        covers: vec![data.clone()],
        keeps: vec![data.join("agents/ana")],
        read_only: vec![data.join("static"), icon.clone()],
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        ..Spec::default()
    };
    let env = sandbox::environment(&[], &[]);
    let spawned = sandbox::spawn(&Spawn {
        exe: Path::new(env!("CARGO_BIN_EXE_hive")),
        spec: &spec,
        env: &env,
        keep: &[],
        parent_death_signal: libc::SIGKILL,
        umask: 0o022,
    })
    .expect("hive __sandbox starts");
    let (mut child, mut stdout, mut stderr) = (
        spawned.child,
        std::fs::File::from(spawned.stdout),
        std::fs::File::from(spawned.stderr),
    );
    let (mut out, mut err) = (String::new(), String::new());
    stdout.read_to_string(&mut out).unwrap();
    stderr.read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    if status.code() == Some(125) {
        assert!(
            std::env::var("HIVE_REQUIRE_REAL_CLAUDE").as_deref() != Ok("1"),
            "the kernel refused a sandbox: {err}"
        );
        eprintln!("SKIPPED: the kernel refused a sandbox here: {err}");
        return;
    }
    assert_eq!(out, "page<svg/>own-writable\nsecret-hidden\n", "{err}");
    assert!(!data.join("static/x").exists());
    assert_eq!(std::fs::read_to_string(&icon).unwrap(), "<svg/>");
}

/// Calls `request_spawn` for `name` as the agent whose socket is `socket`,
/// through `hive mcp` (what its claude runs); the approval's id.
fn request_spawn(socket: &Path, name: &str) -> i64 {
    use std::io::{BufRead, Write};
    let mut mcp = Command::new(env!("CARGO_BIN_EXE_hive"))
        .arg("mcp")
        .env("HIVE_SOCKET", socket)
        // What hive up gives ruth's claude (the broker enforces its entry's).
        .env("HIVE_TOOL_GROUPS", "messaging,lifecycle")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = mcp.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut stdin = mcp.stdin.take().unwrap();
    for msg in [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params":
            {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}),
        serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params":
            {"name": "request_spawn", "arguments": {"name": name}}}),
    ] {
        writeln!(stdin, "{msg}").unwrap();
    }
    let answer = loop {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("hive mcp's answer to request_spawn");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v["id"] == 2 {
            break v;
        }
    };
    drop(stdin);
    let _ = mcp.kill();
    let _ = mcp.wait();
    let text = answer["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("{answer}"));
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    v["id"].as_i64().unwrap_or_else(|| panic!("{text}"))
}

/// The operator's writes under the module's layout: `hive up` runs on the
/// file the activation step installed (DATA/hive.json, in its own data
/// dir); an agent's spawn, approved with `hive approve`, and `hive budget
/// set` write it; the next rebuild's activation keeps both while it applies
/// the declared change.
#[test]
fn a_spawn_and_hive_budget_set_under_the_module_survive_a_rebuild() {
    let t = Tmp::new("budget");
    let bin = t.0.join("pkg/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_hive"), bin.join("hive")).unwrap();
    let id = |flag: &str| {
        let o = Command::new("id").arg(flag).output().unwrap();
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let data = t.0.join("data");
    let declared = t.0.join("declared.json");
    let common = format!(
        r#"hive = "{}"; dataDir = "{}"; declaredPath = "{}"; user = "{}"; group = "{}";
           upOver = {{ listen = "127.0.0.1:0"; }};"#,
        t.0.join("pkg").display(),
        data.display(),
        declared.display(),
        id("-un"),
        id("-gn")
    );
    let rebuild = |agents: &str| -> Option<Output> {
        let args = format!("{common} agents = {{ {agents} }};");
        let fleet = up_example(&args, "fleet")?;
        let script = up_example(&args, "activation")?;
        std::fs::write(&declared, fleet).unwrap();
        Some(activate(&script))
    };
    let ruth = r#"ruth = { model = "sonnet"; toolGroups = [ "messaging" "meta" "inbox" "execution" "lifecycle" ]; };"#;
    let Some(first) = rebuild(&format!(r#"{ruth} ana = {{ parent = "ruth"; }};"#)) else {
        return;
    };
    assert!(first.status.success(), "{first:?}");
    let file = data.join("hive.json");
    let log = std::fs::File::create(t.0.join("up.log")).unwrap();
    let mut up = Command::new(env!("CARGO_BIN_EXE_hive"))
        .args(["up", "--config", &file.display().to_string()])
        .args(["--data", &data.display().to_string()])
        .env("HIVE_CLAUDE_BIN", "/bin/false")
        .env_remove("HIVE_HOST_SOCKET")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let socket = data.join("run/host.sock");
    let start = std::time::Instant::now();
    let set = loop {
        let out = hive(&[
            "budget",
            "set",
            "ana",
            "--usd",
            "5",
            "--socket",
            &socket.display().to_string(),
        ]);
        if out.status.success() || start.elapsed() > std::time::Duration::from_secs(30) {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let shown = socket.display().to_string();
    let spawn = request_spawn(&data.join("run/agents/ruth/mcp.sock"), "kid");
    let approved = hive(&["approve", &spawn.to_string(), "--socket", &shown]);
    let _ = Command::new("kill")
        .args(["-TERM", &up.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while up.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = up.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = up.wait();
    assert!(approved.status.success(), "{approved:?}");
    assert!(
        set.status.success(),
        "{set:?}\n{}",
        std::fs::read_to_string(t.0.join("up.log")).unwrap_or_default()
    );
    let read = || -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap()
    };
    assert_eq!(agent(&read(), "ana").unwrap()["budget"]["usd"], 5.0);
    assert_eq!(agent(&read(), "kid").unwrap()["parent"], "ruth");
    let ruth = ruth.replace("sonnet", "opus");
    let second = rebuild(&format!(r#"{ruth} ana = {{ parent = "ruth"; }};"#)).unwrap();
    assert!(second.status.success(), "{second:?}");
    let v = read();
    assert_eq!(agent(&v, "ana").unwrap()["budget"]["usd"], 5.0, "{v}");
    assert_eq!(agent(&v, "kid").unwrap()["parent"], "ruth", "{v}");
    assert_eq!(agent(&v, "ruth").unwrap()["model"], "opus", "{v}");
}

/// One agent as the supervisor shows it: name, state, pid, the model it runs.
type Seen = (String, String, Option<u32>, Option<String>);

/// The agents' supervision states over the host socket.
fn states(socket: &Path) -> Option<Vec<Seen>> {
    use hyperhive::proto::cmd::{Supervision, SupervisionReply};
    let mut c = hyperhive::proto::Client::connect(socket).ok()?;
    c.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    let r: SupervisionReply = c.call(&Supervision {}).ok()?;
    Some(
        r.agents
            .into_iter()
            .map(|a| {
                let state = serde_json::to_value(&a.state).unwrap();
                (
                    a.name,
                    state.as_str().unwrap_or("").to_string(),
                    a.pid,
                    a.applied.model,
                )
            })
            .collect(),
    )
}

/// Waits (at most 30 s) until `ok` holds of the agents' states.
fn wait_states(socket: &Path, what: &str, ok: impl Fn(&[Seen]) -> bool) -> Vec<Seen> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let now = states(socket);
        if let Some(s) = &now {
            if ok(s) {
                return s.clone();
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: {now:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A rebuild that changes one entry and adds one, as the module carries it
/// out: the activation step merges the file, then the unit's `ExecReload`
/// (run here as the unit has it) applies it — the changed agent restarts
/// onto its new model, the added one starts, and the other keeps its
/// harness (the same pid).
#[test]
fn a_rebuild_that_changes_one_entry_reloads_and_keeps_the_others_running() {
    let t = Tmp::new("reload");
    let bin = t.0.join("pkg/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_hive"), bin.join("hive")).unwrap();
    let id = |flag: &str| {
        let o = Command::new("id").arg(flag).output().unwrap();
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    };
    let data = t.0.join("data");
    let declared = t.0.join("declared.json");
    let common = format!(
        r#"hive = "{}"; dataDir = "{}"; declaredPath = "{}"; user = "{}"; group = "{}";
           upOver = {{ listen = "127.0.0.1:0"; }};"#,
        t.0.join("pkg").display(),
        data.display(),
        declared.display(),
        id("-un"),
        id("-gn")
    );
    let rebuild = |agents: &str| -> Option<(Output, String)> {
        let args = format!("{common} agents = {{ {agents} }};");
        let fleet = up_example(&args, "fleet")?;
        let script = up_example(&args, "activation")?;
        let reload = up_example(&args, "unit.serviceConfig.ExecReload")?;
        std::fs::write(&declared, fleet).unwrap();
        Some((activate(&script), reload))
    };
    let Some((first, _)) =
        rebuild(r#"ruth = { model = "sonnet"; }; ana = { parent = "ruth"; model = "haiku"; };"#)
    else {
        return;
    };
    assert!(first.status.success(), "{first:?}");
    let file = data.join("hive.json");
    let log_path = t.0.join("up.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut up = Command::new(env!("CARGO_BIN_EXE_hive"))
        .args(["up", "--config", &file.display().to_string()])
        .args(["--data", &data.display().to_string()])
        .env("HIVE_CLAUDE_BIN", "/bin/false")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("HIVE_HOST_SOCKET")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let socket = data.join("run/host.sock");
    let running = |s: &[Seen], name: &str| {
        s.iter()
            .find(|a| a.0 == name && a.1 == "running")
            .and_then(|a| a.2)
    };
    let before = wait_states(&socket, "ruth and ana to run", |s| {
        running(s, "ruth").is_some() && running(s, "ana").is_some()
    });
    let (ruth, ana) = (running(&before, "ruth"), running(&before, "ana"));
    let (second, reload) = rebuild(
        r#"ruth = { model = "sonnet"; }; ana = { parent = "ruth"; model = "opus"; }; cat = { };"#,
    )
    .unwrap();
    assert!(second.status.success(), "{second:?}");
    let argv: Vec<&str> = reload.split_whitespace().collect();
    let out = Command::new(argv[0]).args(&argv[1..]).output().unwrap();
    let after = wait_states(&socket, "ana restarted on opus and cat running", |s| {
        running(s, "cat").is_some()
            && running(s, "ana").is_some_and(|p| Some(p) != ana)
            && s.iter()
                .any(|a| a.0 == "ana" && a.3.as_deref() == Some("opus"))
    });
    let _ = Command::new("kill")
        .args(["-TERM", &up.id().to_string()])
        .status();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while up.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = up.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = up.wait();
    assert!(
        out.status.success(),
        "{reload}: {out:?}\n{}",
        std::fs::read_to_string(&log_path).unwrap_or_default()
    );
    assert_eq!(running(&after, "ruth"), ruth, "ruth keeps its harness");
}
