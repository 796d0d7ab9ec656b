//! The module layering of `src/`, checked against the tree as it is: every
//! `crate::X` path (and `hyperhive::X` in `main.rs`) in every source file is an
//! edge from the file's module (its folder under `src/`, or the file for a
//! single-file module) to `X`. The layers are the table in
//! `docs/architecture.md` (between the `layers` markers), so the doc and the
//! check cannot drift. The test fails when
//!
//! - a module is in no layer (a new folder must be placed);
//! - the modules import each other in a cycle;
//! - a module imports one of a higher layer, unless the edge is one of the at
//!   most two in [`ALLOWED_UPWARD`], each with its reason;
//! - an edge the design forbids whatever the layers say ([`NEVER`]) appears;
//! - an allow-list entry names an edge that no longer exists.
//!
//! Comments are skipped (a doc comment may name a path it does not use).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Imports that go up a layer on purpose: (from, to, why). At most two.
const ALLOWED_UPWARD: &[(&str, &str, &str)] = &[];

/// Edges that are wrong whatever the layers say: (from, to, why).
const NEVER: &[(&str, &str, &str)] = &[
    (
        "harness",
        "broker",
        "the harness speaks to the broker only over its socket",
    ),
    (
        "mcp",
        "broker",
        "hive mcp speaks to the broker only over the agent socket",
    ),
    (
        "bash",
        "broker",
        "the bash daemon wakes its agent only over the agent socket",
    ),
    (
        "web",
        "broker",
        "the page reaches the broker only over the agent socket",
    ),
    (
        "broker",
        "fleet",
        "the fleet implements the broker's lifecycle port, not the reverse",
    ),
    ("mcp", "bash", "hive mcp does not talk to the bash daemon"),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `src/`, without the vendored crates.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "vendor") {
                continue;
            }
            sources(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module a file belongs to: its first component under `src/`, without
/// `.rs`. `lib.rs` (which only declares the modules) and `build.rs` (the build
/// script) belong to none.
fn module_of(file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src()).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "build").then(|| name.to_string())
}

/// `text` without its comments and with the insides of its string literals
/// blanked (newlines kept, so line numbers stay right).
fn code_only(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let next = [rest.find("//"), rest.find("/*"), rest.find('"')]
            .into_iter()
            .flatten()
            .min();
        let Some(i) = next else {
            out.push_str(rest);
            break;
        };
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let end = if rest.starts_with("//") {
            rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            rest.find("*/").map_or(rest.len(), |e| e + 2)
        } else if out.ends_with('\'') && rest[1..].starts_with('\'') {
            1 // the char literal '"'
        } else {
            // A string: `"…"` with escapes, or a raw `r#"…"#`.
            let hashes = out.len() - out.trim_end_matches('#').len();
            let raw = out.trim_end_matches('#').ends_with('r');
            let body = &rest[1..];
            let close = if raw {
                let delim = format!("\"{}", "#".repeat(hashes));
                body.find(&delim).map(|e| e + delim.len())
            } else {
                let mut escaped = false;
                body.char_indices()
                    .find(|&(_, c)| {
                        let done = c == '"' && !escaped;
                        escaped = c == '\\' && !escaped;
                        done
                    })
                    .map(|(e, _)| e + 1)
            };
            1 + close.unwrap_or(body.len())
        };
        let skipped = &rest[..end];
        if skipped.starts_with('"') {
            out.push('"');
        }
        out.extend(skipped.chars().filter(|c| *c == '\n'));
        rest = &rest[end..];
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The modules named right after each `prefix` (`crate::` or `hyperhive::`)
/// in `line`, including each entry of a `prefix{a, b::c}` group.
fn targets(line: &str, prefix: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(i) = line[from..].find(prefix) {
        let at = from + i;
        from = at + prefix.len();
        let before = line[..at].chars().next_back();
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::`, or the end of a longer name
        }
        let rest = &line[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        found.push(ident_at(&group[j..]).to_string());
                        start = false;
                    }
                    _ => {}
                }
            }
        } else {
            found.push(ident_at(rest).to_string());
        }
    }
    found.retain(|t| !t.is_empty() && t != "self");
    found
}

/// Edges between modules, each with the first place it was seen.
fn edges() -> BTreeMap<(String, String), String> {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    assert!(files.len() > 20, "found only {} source files", files.len());
    let mut edges = BTreeMap::new();
    for file in files {
        let Some(from) = module_of(&file) else {
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let prefixes: &[&str] = if from == "main" {
            &["crate::", "hyperhive::"]
        } else {
            &["crate::"]
        };
        for (n, line) in code_only(&text).lines().enumerate() {
            for prefix in prefixes {
                for to in targets(line, prefix) {
                    if to != from {
                        let at = format!(
                            "{}:{}",
                            file.strip_prefix(src().parent().unwrap())
                                .unwrap()
                                .display(),
                            n + 1
                        );
                        edges.entry((from.clone(), to)).or_insert(at);
                    }
                }
            }
        }
    }
    edges
}

/// The layer table of `docs/architecture.md`: module → layer (1 is the top).
fn layers() -> BTreeMap<String, usize> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md");
    let text = std::fs::read_to_string(&doc).unwrap();
    let start = text
        .find("<!-- layers -->")
        .expect("docs/architecture.md has no <!-- layers --> table");
    let end = text[start..]
        .find("<!-- /layers -->")
        .expect("the layer table has no <!-- /layers --> end")
        + start;
    let mut layers = BTreeMap::new();
    for row in text[start..end].lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Ok(layer) = cells.get(1).unwrap_or(&"").parse::<usize>() else {
            continue; // the header and its rule
        };
        for m in cells[2].split(',') {
            let m = m.trim().trim_matches('`');
            assert!(
                layers.insert(m.to_string(), layer).is_none(),
                "{m} is in two layers of the table"
            );
        }
    }
    assert!(layers.len() > 5, "the layer table lists {layers:?}");
    layers
}

fn listed(list: &[(&str, &str, &str)], from: &str, to: &str) -> bool {
    list.iter().any(|(f, t, _)| *f == from && *t == to)
}

/// A cycle among `edges`, as a path that starts and ends at the same module.
fn find_cycle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (f, t) in edges {
        next.entry(f).or_default().push(t);
    }
    fn visit<'a>(
        m: &'a str,
        next: &BTreeMap<&'a str, Vec<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| *p == m) {
            let mut cycle: Vec<String> = path[i..].iter().map(|s| s.to_string()).collect();
            cycle.push(m.to_string());
            return Some(cycle);
        }
        if !done.insert(m) {
            return None;
        }
        path.push(m);
        for t in next.get(m).into_iter().flatten() {
            if let Some(c) = visit(t, next, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    for m in next.keys() {
        if let Some(c) = visit(m, &next, &mut Vec::new(), &mut done) {
            return Some(c);
        }
    }
    None
}

#[test]
fn the_modules_follow_the_layers_without_cycles() {
    assert!(
        ALLOWED_UPWARD.len() <= 2,
        "at most two upward edges may be allowed"
    );
    let edges = edges();
    let layers = layers();
    let mut problems = Vec::new();
    // The contract is alone on the bottom layer: everything may use it, it
    // uses nothing.
    let bottom = layers.values().max().copied().unwrap_or(0);
    let lowest: Vec<&String> = layers
        .iter()
        .filter(|(_, l)| **l == bottom)
        .map(|(m, _)| m)
        .collect();
    if lowest != ["proto"] {
        problems.push(format!(
            "the bottom layer holds {lowest:?}; it must hold proto alone (the contract imports nothing)"
        ));
    }
    let modules: BTreeSet<&String> = edges.keys().flat_map(|(f, t)| [f, t]).collect();
    for m in modules {
        if !layers.contains_key(m.as_str()) {
            problems.push(format!(
                "src/{m} is in no layer: add it to the table in docs/architecture.md"
            ));
        }
    }
    let mut checked = BTreeSet::new();
    for ((from, to), at) in &edges {
        checked.insert((from.clone(), to.clone()));
        if let Some((_, _, why)) = NEVER.iter().find(|(f, t, _)| f == from && t == to) {
            problems.push(format!("{from} → {to} ({at}) must not exist: {why}"));
        }
        let (Some(lf), Some(lt)) = (layers.get(from), layers.get(to)) else {
            continue;
        };
        if lt < lf && !listed(ALLOWED_UPWARD, from, to) {
            problems.push(format!(
                "{from} (layer {lf}) → {to} (layer {lt}) goes up a layer ({at}); \
                 move what it uses down, or allow it in ALLOWED_UPWARD with a reason"
            ));
        }
    }
    if let Some(cycle) = find_cycle(&checked) {
        let evidence: Vec<String> = cycle
            .windows(2)
            .map(|w| edges[&(w[0].clone(), w[1].clone())].clone())
            .collect();
        problems.push(format!(
            "the modules import each other in a cycle: {} ({})",
            cycle.join(" → "),
            evidence.join(", ")
        ));
    }
    for (f, t, _) in ALLOWED_UPWARD {
        if !edges.contains_key(&(f.to_string(), t.to_string())) {
            problems.push(format!(
                "{f} → {t} no longer exists: delete it from ALLOWED_UPWARD in tests/layering.rs"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn the_reader_finds_paths_in_code_and_not_in_comments() {
    let text = "use crate::sys::env::Env; // crate::web\n\
                use crate::{http::{self, auth}, wire};\n\
                /* crate::fleet */ let x = crate::broker::now();\n\
                let s = \"crate::harness\"; macro_rules! m { () => { $crate::mcp } }\n\
                let q = '\"'; let r = r#\"\"crate::ops\"#; let y = crate::cli::X;";
    let code = code_only(text);
    let found: Vec<String> = code.lines().flat_map(|l| targets(l, "crate::")).collect();
    assert_eq!(found, ["sys", "http", "wire", "broker", "cli"]);
    assert_eq!(code.lines().count(), text.lines().count());
}

#[test]
fn a_cycle_is_found_and_shown_as_a_path() {
    let e = |pairs: &[(&str, &str)]| -> BTreeSet<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(find_cycle(&e(&[("a", "b"), ("b", "c")])), None);
    let c = find_cycle(&e(&[("a", "b"), ("b", "c"), ("c", "a")])).unwrap();
    assert_eq!(c.first(), c.last());
    assert_eq!(c.len(), 4);
}

/// File-level edges the design forbids whatever the layers say: (from, to,
/// why), each a module path (`fleet` is every file under `src/fleet/`).
const FILE_NEVER: &[(&str, &str, &str)] = &[(
    "fleet",
    "broker::hub",
    "the fleet talks to the hub through the lifecycle port (FleetTx and LifecycleCmd), never with its sender",
)];

/// The module path of a file under `src/`: `broker/hub/pools.rs` is
/// `broker::hub::pools`, a `mod.rs` its folder's, `lib.rs` and `main.rs`
/// the crate root (empty).
fn module_path(file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src()).unwrap();
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_str().unwrap().to_string())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.strip_suffix(".rs").unwrap_or(&last).to_string();
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem);
    }
    parts
}

/// `code` up to its first top-level `#[cfg(test)]` module: what a test
/// module imports is not the file's.
fn without_tests(code: &str) -> &str {
    let mut at = 0;
    for line in code.split_inclusive('\n') {
        if line.trim_end() == "#[cfg(test)]" {
            let rest = &code[at + line.len()..];
            if rest.trim_start().starts_with("mod ") {
                return &code[..at];
            }
        }
        at += line.len();
    }
    code
}

/// The paths of the use tree at the start of `s` (`a::b`, `a::{b, c::d}`,
/// `a::{self, b}`), each as its segments, after `base`.
fn use_tree(s: &str, base: &[String], out: &mut Vec<Vec<String>>) {
    let mut path = base.to_vec();
    let mut rest = s;
    loop {
        rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        use_tree(&group[start..j], &path, out);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        use_tree(&group[start..j], &path, out);
                        start = j + 1;
                    }
                    _ => {}
                }
            }
            return;
        }
        let id = ident_at(rest);
        if id.is_empty() {
            break;
        }
        if id != "self" {
            path.push(id.to_string());
        }
        rest = &rest[id.len()..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out.push(path);
}

/// Every path in `code` that starts at `crate::`, `super::` or `self::`,
/// made absolute from the file's module `here`.
fn file_paths(code: &str, here: &[String]) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let mut from = 0;
        while from < line.len() {
            let next = ["crate::", "super::", "self::"]
                .iter()
                .filter_map(|p| line[from..].find(p).map(|i| (from + i, *p)))
                .min();
            let Some((at, prefix)) = next else {
                break;
            };
            from = at + prefix.len();
            let before = line[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == ':')
            {
                continue;
            }
            let mut base: Vec<String> = match prefix {
                "crate::" => Vec::new(),
                "self::" => here.to_vec(),
                _ => here[..here.len().saturating_sub(1)].to_vec(),
            };
            let mut rest = &line[from..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
                from += "super::".len();
            }
            let mut paths = Vec::new();
            use_tree(rest, &base, &mut paths);
            found.extend(paths.into_iter().map(|p| (n + 1, p)));
        }
    }
    found
}

/// Edges between files (by module path), each with the first place it was
/// seen: a file's import of another file's module. A module's import of its
/// own descendants (`pub use child::X` in a `mod.rs`) is its own business, not
/// an edge; a child's import of its parent is.
fn file_edges() -> BTreeMap<(String, String), String> {
    let mut files = Vec::new();
    sources(&src(), &mut files);
    let modules: BTreeSet<Vec<String>> = files
        .iter()
        .filter(|f| !f.ends_with("build.rs"))
        .map(|f| module_path(f))
        .collect();
    let mut edges = BTreeMap::new();
    for file in &files {
        if file.ends_with("build.rs") {
            continue;
        }
        let here = module_path(file);
        let text = std::fs::read_to_string(file).unwrap();
        let code = code_only(&text);
        for (line, path) in file_paths(without_tests(&code), &here) {
            let Some(to) = (1..=path.len())
                .rev()
                .map(|k| path[..k].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            if to == here || to.starts_with(&here) {
                continue;
            }
            let at = format!(
                "{}:{line}",
                file.strip_prefix(src().parent().unwrap())
                    .unwrap()
                    .display()
            );
            edges.entry((here.join("::"), to.join("::"))).or_insert(at);
        }
    }
    edges
}

#[test]
fn the_files_import_each_other_in_no_circle() {
    let edges = file_edges();
    assert!(edges.len() > 100, "found only {} file edges", edges.len());
    // The reader sees a file's imports of its neighbours and of other rooms.
    for known in [
        ("fleet::supervisor", "broker::lifecycle"),
        ("broker::hub::lifecycle", "broker::hub::offload"),
    ] {
        let known = (known.0.to_string(), known.1.to_string());
        assert!(edges.contains_key(&known), "no edge {known:?}");
    }
    let mut problems = Vec::new();
    let keys: BTreeSet<(String, String)> = edges.keys().cloned().collect();
    if let Some(cycle) = find_cycle(&keys) {
        let evidence: Vec<String> = cycle
            .windows(2)
            .map(|w| edges[&(w[0].clone(), w[1].clone())].clone())
            .collect();
        problems.push(format!(
            "these files import each other in a circle: {} ({}); move what one takes from \
             the other into a file below both",
            cycle.join(" → "),
            evidence.join(", ")
        ));
    }
    for ((from, to), at) in &edges {
        for (f, t, why) in FILE_NEVER {
            let under = |m: &str, p: &str| m == p || m.starts_with(&format!("{p}::"));
            if under(from, f) && under(to, t) {
                problems.push(format!("{from} → {to} ({at}) must not exist: {why}"));
            }
        }
    }
    assert!(problems.is_empty(), "\n{}\n", problems.join("\n"));
}

#[test]
fn the_file_reader_resolves_use_trees_and_supers() {
    let here: Vec<String> = ["broker", "hub", "pools"].map(String::from).to_vec();
    let code = "use super::{db_err, budgets::Spent};\n\
                use crate::proto::{self, text::{clock, fmt_time}};\n\
                let x = super::super::db::Db::open(); let y = self::inner::f();";
    let paths: Vec<String> = file_paths(code, &here)
        .into_iter()
        .map(|(_, p)| p.join("::"))
        .collect();
    assert_eq!(
        paths,
        [
            "broker::hub::db_err",
            "broker::hub::budgets::Spent",
            "proto",
            "proto::text::clock",
            "proto::text::fmt_time",
            "broker::db::Db::open",
            "broker::hub::pools::inner::f",
        ]
    );
    let code = "fn a() {}\n#[cfg(test)]\nmod tests {\n    use crate::web::x;\n}\n";
    assert_eq!(without_tests(code), "fn a() {}\n");
}
