//! Replays the fuzz corpus seeds (`tests/fuzz/corpus/TARGET/seed-*`) and every
//! crash reproducer (`tests/fuzz/regressions/TARGET/*`) through the same target
//! bodies `cargo fuzz` runs, so `make test` keeps them fixed.

#[path = "fuzz/targets.rs"]
mod targets;

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let mut n = 0;
    for dir in [
        root.join("corpus").join(target),
        root.join("regressions").join(target),
    ] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files {
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            if dir.ends_with(target)
                && dir.parent().unwrap().ends_with("corpus")
                && !name.starts_with("seed-")
            {
                continue;
            }
            eprintln!("{target}: {}", f.display());
            run(&std::fs::read(&f).unwrap());
            n += 1;
        }
    }
    assert!(n > 0, "no corpus seeds for {target}");
}

#[test]
fn wire() {
    replay("wire", targets::wire);
}

#[test]
fn jsonrpc() {
    replay("jsonrpc", targets::jsonrpc);
}

#[test]
fn classify() {
    replay("classify", targets::classify);
}

#[test]
fn prompt() {
    replay("prompt", targets::prompt);
}

#[test]
fn web() {
    replay("web", targets::web);
}
