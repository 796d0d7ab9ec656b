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
