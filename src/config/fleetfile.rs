//! The fleet file is the operator's: hive changes only the entry and the keys a
//! change owns (an approved spawn adds an entry, an approved merge patch or a
//! permissions save sets the keys it names), never reverting a hand edit. A
//! change re-reads the file, compares three versions of the entry — what hive
//! last applied (the base), the file as it is now, and the change — and
//! refuses, with nothing written, when a key the change sets was also changed
//! by hand to another value; otherwise it sets those keys on the file's own
//! entry and leaves every other key and entry as the file has them (the keys
//! of the objects may come out in another order). The file is replaced
//! atomically: a temporary file in the same directory, written, synced, given
//! the file's mode and owner, renamed over it. A file hive cannot write (a nix
//! store path, a read-only mount) is a refusal naming the file. hive's own
//! writers (the hub's job threads, the supervisor of `hive up`) take
//! turns through one lock, held only while a change reads and writes.

use crate::config::{AgentConfig, HiveConfig};
use crate::proto::text::excerpt;
use serde_json::{json, Map, Value};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// hive's writers of the fleet file take turns: a change reads, decides and
/// writes under it, and holds it for nothing else.
static WRITING: Mutex<()> = Mutex::new(());

/// How often a change starts over when the file changed while it was written.
const ATTEMPTS: usize = 3;

/// A change to one entry of the fleet file.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    pub agent: &'a str,
    /// What hive last applied to the entry; `None` adds a new entry.
    pub base: Option<&'a AgentConfig>,
    /// The keys this change owns, as a JSON merge patch of the entry (RFC
    /// 7396); for a new entry, the entry.
    pub patch: &'a Value,
}

/// The file after a change.
#[derive(Debug, Clone, PartialEq)]
pub struct Written {
    /// The whole fleet, as the file has it now.
    pub config: HiveConfig,
    /// The changed entry, as the file has it now (hand edits included).
    pub entry: AgentConfig,
}

/// RFC 7396 JSON merge patch: objects merge, `null` removes, anything else
/// replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// `base` with `patch` merged in, as an entry (the name cannot change).
pub fn patched(base: &AgentConfig, patch: &Value) -> Result<AgentConfig, String> {
    let mut v = serde_json::to_value(base).map_err(|e| e.to_string())?;
    merge_patch(&mut v, patch);
    let mut entry: AgentConfig = serde_json::from_value(v)
        .map_err(|e| format!("the patched entry of {} is not valid: {e}", base.name))?;
    entry.name = base.name.clone();
    Ok(entry)
}

/// Carries out `change` on the fleet file at `path`: re-reads it, refuses a
/// conflict with a hand edit, writes the entry's changed keys atomically.
/// Nothing is written when it refuses.
pub fn apply(path: &Path, change: &Change<'_>) -> Result<Written, String> {
    let _turn = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let real = path
        .canonicalize()
        .map_err(|e| format!("cannot read the fleet file {}: {e}", path.display()))?;
    for _ in 0..ATTEMPTS {
        let text = read(&real)?;
        let (new_text, written) = plan(&real, &text, change)?;
        let Some(new_text) = new_text else {
            return Ok(written);
        };
        if replace(
            &real,
            &new_text,
            || read(&real).is_ok_and(|now| now == text),
            change,
        )? {
            return Ok(written);
        }
        log::info!(
            "the fleet file {} changed while hive wrote it; reading it again",
            real.display()
        );
    }
    Err(format!(
        "the fleet file {} kept changing while hive wrote it; nothing was changed, try again",
        real.display()
    ))
}

/// Sets the fleet file's top-level `budget` (issue 16) with the same rule as
/// an entry's keys: refused, with nothing written, when the file's budget was
/// changed by hand from `base` (what hive last applied) to something other
/// than `new`; written atomically otherwise. Returns the fleet as the file
/// has it now.
pub fn apply_hive_budget(
    path: &Path,
    base: Option<&crate::proto::Budget>,
    new: Option<&crate::proto::Budget>,
) -> Result<HiveConfig, String> {
    let _turn = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let real = path
        .canonicalize()
        .map_err(|e| format!("cannot read the fleet file {}: {e}", path.display()))?;
    let shown = real.display();
    let null = Value::Null;
    let change = Change {
        agent: "the hive",
        base: None,
        patch: &null,
    };
    for _ in 0..ATTEMPTS {
        let text = read(&real)?;
        let mut cfg = HiveConfig::parse(&text).map_err(|e| {
            format!("the fleet file {shown} does not load ({e}); fix it by hand first: nothing was changed")
        })?;
        if cfg.budget.as_ref() != base && cfg.budget.as_ref() != new {
            return Err(format!(
                "the hive's budget was changed by hand in the fleet file {shown} ({} when hive \
                 last applied it, {} in the file now): nothing was changed. Edit the file to the \
                 value you want, or undo the hand edit and try again",
                serde_json::to_string(&base).unwrap_or_default(),
                serde_json::to_string(&cfg.budget).unwrap_or_default()
            ));
        }
        if cfg.budget.as_ref() == new {
            return Ok(cfg);
        }
        let mut raw: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let obj = raw
            .as_object_mut()
            .ok_or("the fleet file is not a JSON object")?;
        match new {
            Some(b) => {
                obj.insert(
                    "budget".into(),
                    serde_json::to_value(b).map_err(|e| e.to_string())?,
                );
            }
            None => {
                obj.remove("budget");
            }
        }
        cfg.budget = new.cloned();
        cfg.validate().map_err(|e| {
            format!("with this change the fleet file {shown} would not be valid ({e}): nothing was changed")
        })?;
        if replace_pretty(&real, &raw, &text, &change)? {
            return Ok(cfg);
        }
    }
    Err(kept_changing(&shown))
}

/// Installs a new declaration of the whole fleet (a NixOS rebuild's
/// generated file, `hive fleet merge`) into the fleet file at `path` by the
/// same three-way rule, the whole file at once: `old` is the declaration
/// installed last (the base; `None` the first time), the file holds the
/// operator's writes since (approved spawns and patches, permission saves,
/// `hive budget set`), `new` is the declaration. What the declaration
/// changed since `old` is set, unless the file changed the same key to
/// another value (refused naming the key, e.g. `agents.ana.model`, with
/// nothing written); everything else stays as the file has it. An entry the
/// declaration drops is removed unless the operator changed it. Entries
/// are matched by name; the file's order is kept, new ones come last.
pub fn apply_declared(path: &Path, old: Option<&str>, new: &str) -> Result<HiveConfig, String> {
    let _turn = WRITING.lock().unwrap_or_else(|p| p.into_inner());
    let real = path
        .canonicalize()
        .map_err(|e| format!("cannot read the fleet file {}: {e}", path.display()))?;
    let shown = real.display();
    let keyed = |text: &str, what: &str| -> Result<Value, String> {
        let cfg = HiveConfig::parse(text).map_err(|e| format!("{what} does not load: {e}"))?;
        let mut v = serde_json::to_value(&cfg).map_err(|e| e.to_string())?;
        if let Some(o) = v.as_object_mut() {
            let list = o.remove("agents").unwrap_or(Value::Null);
            let by_name: Map<String, Value> = list
                .as_array()
                .map_or(&[][..], Vec::as_slice)
                .iter()
                .map(|a| (a["name"].as_str().unwrap_or("").to_string(), a.clone()))
                .collect();
            o.insert("agents".into(), Value::Object(by_name));
        }
        Ok(v)
    };
    let old_v = match old {
        Some(t) => keyed(t, "the declaration installed last")?,
        None => json!({"agents": {}}),
    };
    let new_v = keyed(new, "the new declaration")?;
    let own = owned(&diff(&old_v, &new_v), &old_v);
    let order = |text: &str| -> Vec<String> {
        serde_json::from_str::<HiveConfig>(text)
            .map(|c| c.agents.into_iter().map(|a| a.name).collect())
            .unwrap_or_default()
    };
    let change = Change {
        agent: "the declared fleet",
        base: None,
        patch: &Value::Null,
    };
    for _ in 0..ATTEMPTS {
        let text = read(&real)?;
        let file_v = keyed(&text, &format!("the fleet file {shown}"))
            .map_err(|e| format!("{e}; fix it by hand first: nothing was changed"))?;
        let mut conflicts = Vec::new();
        find_conflicts(&own, &old_v, &file_v, "", &mut conflicts);
        if let Some(c) = conflicts.first() {
            return Err(format!(
                "{} was changed both in the fleet file {shown} ({} there now, {} when it was \
                 last declared) and in the declaration (now {}): nothing was changed. Make the \
                 declaration say what the file says, or edit the file to the declared value, \
                 and activate again",
                c.key,
                show(&c.file),
                show(&c.base),
                show(&c.new)
            ));
        }
        let mut merged = file_v.clone();
        merge_patch(&mut merged, &own);
        let mut names = order(&text);
        names.extend(order(new));
        let agents = merged
            .as_object_mut()
            .and_then(|o| o.remove("agents"))
            .unwrap_or(Value::Null);
        let mut list = Vec::new();
        for n in names {
            if let Some(a) = agents.get(&n) {
                if !list.iter().any(|x: &Value| x["name"] == a["name"]) {
                    list.push(a.clone());
                }
            }
        }
        if let Some(o) = merged.as_object_mut() {
            if !list.is_empty() {
                o.insert("agents".into(), Value::Array(list));
            }
        }
        let cfg: HiveConfig = serde_json::from_value(merged.clone()).map_err(|e| {
            format!("the merged fleet file would not load ({e}): nothing was changed")
        })?;
        cfg.validate().map_err(|e| {
            format!("with the new declaration the fleet file {shown} would not be valid ({e}): nothing was changed")
        })?;
        if serde_json::to_value(&cfg).ok() == serde_json::from_str::<Value>(&text).ok() {
            return Ok(cfg);
        }
        if replace_pretty(&real, &cfg, &text, &change)? {
            return Ok(cfg);
        }
    }
    Err(kept_changing(&shown))
}

/// The RFC 7396 merge patch that turns `old` into `new`: changed keys
/// (objects key by key), removed ones as `null`.
fn diff(old: &Value, new: &Value) -> Value {
    let (Value::Object(o), Value::Object(n)) = (old, new) else {
        return new.clone();
    };
    let mut out = Map::new();
    for (k, nv) in n {
        match o.get(k) {
            Some(ov) if ov == nv => {}
            Some(ov) => {
                out.insert(k.clone(), diff(ov, nv));
            }
            None => {
                out.insert(k.clone(), nv.clone());
            }
        }
    }
    for k in o.keys().filter(|k| !n.contains_key(*k)) {
        out.insert(k.clone(), Value::Null);
    }
    Value::Object(out)
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the fleet file {}: {e}", path.display()))
}

/// The new text of the file (none when the change changes nothing in it) and
/// what it holds, or why the change is refused.
fn plan(path: &Path, text: &str, change: &Change<'_>) -> Result<(Option<String>, Written), String> {
    let shown = path.display();
    let cfg = HiveConfig::parse(text).map_err(|e| {
        format!(
            "the fleet file {shown} does not load ({e}); fix it by hand first: nothing was changed"
        )
    })?;
    let mut raw: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let agent = change.agent;
    let (new_cfg, entry, keys) = match change.base {
        None => {
            if cfg.agent(agent).is_some() {
                return Err(format!(
                    "the fleet file {shown} already has an entry named {agent} (added by \
                     hand?): nothing was changed; remove it, or deny this and ask for another name"
                ));
            }
            let mut v = json!({ "name": agent });
            merge_patch(&mut v, change.patch);
            let entry: AgentConfig = serde_json::from_value(v)
                .map_err(|e| format!("the new entry of {agent} is not valid: {e}"))?;
            let mut new_cfg = cfg.clone();
            new_cfg.agents.push(entry.clone());
            (new_cfg, entry, None)
        }
        Some(base) => {
            let Some(file_entry) = cfg.agent(agent) else {
                return Err(format!(
                    "{agent} is no longer in the fleet file {shown} (removed by hand?): nothing \
                     was changed; put its entry back first"
                ));
            };
            let base_v = normal(base)?;
            let file_v = normal(file_entry)?;
            let own = owned(change.patch, &base_v);
            let mut conflicts = Vec::new();
            find_conflicts(&own, &base_v, &file_v, "", &mut conflicts);
            if let Some(c) = conflicts.first() {
                return Err(format!(
                    "{agent}'s {} was changed by hand in the fleet file {shown} ({} when hive \
                     last applied it, {} in the file now) and this change sets it to {}: nothing \
                     was changed. Edit the file to the value you want and run `hive update \
                     {agent}`, or undo the hand edit and try again",
                    c.key,
                    show(&c.base),
                    show(&c.file),
                    show(&c.new)
                ));
            }
            let mut v = file_v.clone();
            merge_patch(&mut v, &own);
            let entry: AgentConfig = serde_json::from_value(v)
                .map_err(|e| format!("the change makes {agent}'s entry invalid: {e}"))?;
            let mut new_cfg = cfg.clone();
            if let Some(slot) = new_cfg.agents.iter_mut().find(|a| a.name == agent) {
                *slot = entry.clone();
            }
            let keys: Vec<String> = own
                .as_object()
                .map_or_else(Vec::new, |o| o.keys().cloned().collect());
            (new_cfg, entry, Some(keys))
        }
    };
    let written = Written {
        config: new_cfg,
        entry,
    };
    if keys.as_ref().is_some_and(Vec::is_empty) {
        return Ok((None, written));
    }
    written.config.validate().map_err(|e| {
        format!(
            "with this change the fleet file {shown} would not be valid ({e}): nothing was changed"
        )
    })?;
    let entry_v = normal(&written.entry)?;
    let agents = raw
        .as_object_mut()
        .ok_or("the fleet file is not a JSON object")?
        .entry("agents")
        .or_insert_with(|| Value::Array(Vec::new()));
    let list = agents.as_array_mut().ok_or("\"agents\" is not a list")?;
    match keys {
        None => list.push(entry_v),
        Some(keys) => {
            let slot = list
                .iter_mut()
                .find(|a| a.get("name").and_then(Value::as_str) == Some(agent))
                .and_then(Value::as_object_mut)
                .ok_or_else(|| format!("{agent} has no entry object in the fleet file"))?;
            for k in keys {
                match entry_v.get(&k) {
                    Some(v) => {
                        slot.insert(k, v.clone());
                    }
                    None => {
                        slot.remove(&k);
                    }
                }
            }
        }
    }
    let text = serde_json::to_string_pretty(&raw).map_err(|e| e.to_string())?;
    Ok((Some(format!("{text}\n")), written))
}

/// An entry as JSON, keys with default values left out.
fn normal(entry: &AgentConfig) -> Result<Value, String> {
    serde_json::to_value(entry).map_err(|e| e.to_string())
}

/// True when two values of an entry mean the same: absent, `null`, `[]` and
/// `{}` are all the default, and a list is a set (groups, capabilities,
/// recipients).
fn same(a: &Value, b: &Value) -> bool {
    let default = |v: &Value| match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    };
    if default(a) && default(b) {
        return true;
    }
    match (a, b) {
        (Value::Array(x), Value::Array(y)) => {
            let set = |l: &[Value]| {
                let mut s: Vec<String> = l.iter().map(Value::to_string).collect();
                s.sort();
                s.dedup();
                s
            };
            set(x) == set(y)
        }
        _ => a == b,
    }
}

/// The part of `patch` that changes `base`: leaves that set a value `base`
/// already has are dropped, so a change never rewrites a key it leaves as it
/// was (and never reverts a hand edit of it).
fn owned(patch: &Value, base: &Value) -> Value {
    let Value::Object(p) = patch else {
        return patch.clone();
    };
    let mut out = Map::new();
    for (k, v) in p {
        let b = base.get(k).unwrap_or(&Value::Null);
        match v {
            Value::Object(_) if b.is_object() || b.is_null() => {
                let inner = owned(v, b);
                if inner.as_object().is_some_and(|o| !o.is_empty()) {
                    out.insert(k.clone(), inner);
                }
            }
            _ if same(v, b) => {}
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// A key both this change and a hand edit set, to different values.
struct Conflict {
    key: String,
    base: Value,
    file: Value,
    new: Value,
}

/// Every key of `own` (a change's owned part) that the file changed by hand
/// since `base` to something else than the change sets.
fn find_conflicts(own: &Value, base: &Value, file: &Value, at: &str, out: &mut Vec<Conflict>) {
    let Value::Object(p) = own else {
        return;
    };
    for (k, v) in p {
        let key = if at.is_empty() {
            k.clone()
        } else {
            format!("{at}.{k}")
        };
        let b = base.get(k).unwrap_or(&Value::Null);
        let f = file.get(k).unwrap_or(&Value::Null);
        if v.is_object() && (b.is_object() || b.is_null()) && (f.is_object() || f.is_null()) {
            find_conflicts(v, b, f, &key, out);
        } else if !same(f, b) && !same(f, v) {
            out.push(Conflict {
                key,
                base: b.clone(),
                file: f.clone(),
                new: v.clone(),
            });
        }
    }
}

/// A value of an entry for a message: a string quoted, anything else as
/// JSON, either cut short; `(none)` when absent.
fn show(v: &Value) -> String {
    match v {
        Value::Null => "(none)".into(),
        Value::String(s) => excerpt(s),
        other => {
            let text = other.to_string();
            match text.char_indices().nth(crate::proto::limits::ECHO_CHARS) {
                None => text,
                Some((i, _)) => format!("{}…", &text[..i]),
            }
        }
    }
}

/// Replaces the file at `path` with `text` through a temporary file in its
/// directory, keeping its mode and owner; `unchanged` is asked right before
/// the rename, and false (the file changed meanwhile) leaves it as it is.
/// [`replace`] with `value` as the fleet file's JSON (sorted as serde writes
/// it, two-space indented), unless the file no longer holds `text`.
fn replace_pretty(
    real: &Path,
    value: &impl serde::Serialize,
    text: &str,
    change: &Change<'_>,
) -> Result<bool, String> {
    let new_text = format!(
        "{}\n",
        serde_json::to_string_pretty(value).map_err(|e| e.to_string())?
    );
    replace(
        real,
        &new_text,
        || read(real).is_ok_and(|now| now == text),
        change,
    )
}

/// The refusal when the file changed under every attempt to write it.
fn kept_changing(shown: &impl std::fmt::Display) -> String {
    format!(
        "the fleet file {shown} kept changing while hive wrote it; nothing was changed, try again"
    )
}

fn replace(
    path: &Path,
    text: &str,
    unchanged: impl Fn() -> bool,
    change: &Change<'_>,
) -> Result<bool, String> {
    let meta = std::fs::metadata(path).map_err(|e| cannot_write(path, &e, change))?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "fleet".into());
    let tmp: PathBuf = dir.join(format!(".{name}.hive-{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let result = (|| -> std::io::Result<bool> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(text.as_bytes())?;
        if (f.metadata()?.uid(), f.metadata()?.gid()) != (meta.uid(), meta.gid()) {
            std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid()))?;
        }
        f.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        f.sync_all()?;
        drop(f);
        if !unchanged() {
            return Ok(false);
        }
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(true)
    })();
    match result {
        Ok(true) => Ok(true),
        Ok(false) => {
            let _ = std::fs::remove_file(&tmp);
            Ok(false)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(cannot_write(path, &e, change))
        }
    }
}

/// Why the file cannot be written, and what to do instead.
fn cannot_write(path: &Path, e: &std::io::Error, change: &Change<'_>) -> String {
    let mut msg = format!(
        "cannot write the fleet file {}: {e}; nothing was changed",
        path.display()
    );
    if path.starts_with("/nix/store") {
        msg.push_str(&format!(
            ". It is in the nix store, which is read-only: make the change in your NixOS \
             configuration (services.hyperhive.agents.{}) and rebuild",
            change.agent
        ));
    } else if e.raw_os_error() == Some(libc::EROFS) {
        msg.push_str(". It is on a read-only file system: edit the fleet file where it is made, or run the hive with a writable --config");
    } else {
        msg.push_str(&format!(
            ". hive writes a temporary file in {} and renames it over the fleet file: give \
             the hive's user write access to that directory",
            path.parent().unwrap_or(Path::new("/")).display()
        ));
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "hive-fleetfile-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const FLEET: &str = r#"{
  "hive_name": "h",
  "agents": [
    {"name": "boss", "tool_groups": ["messaging", "lifecycle"]},
    {"name": "kid", "parent": "boss", "model": "sonnet", "env": {"A": "1"}}
  ]
}
"#;

    fn base(name: &str) -> AgentConfig {
        HiveConfig::parse(FLEET)
            .unwrap()
            .agent(name)
            .unwrap()
            .clone()
    }

    #[test]
    fn merge_patch_follows_rfc_7396() {
        let cases = [
            (
                json!({"a":1,"b":2}),
                json!({"b":null,"c":3}),
                json!({"a":1,"c":3}),
            ),
            (
                json!({"env":{"X":"1"}}),
                json!({"env":{"Y":"2"}}),
                json!({"env":{"X":"1","Y":"2"}}),
            ),
            (
                json!({"tool_groups":["a"]}),
                json!({"tool_groups":["b"]}),
                json!({"tool_groups":["b"]}),
            ),
        ];
        for (mut t, p, want) in cases {
            merge_patch(&mut t, &p);
            assert_eq!(t, want);
        }
    }

    /// A hand edit of another key, of another entry and of another variable
    /// of `env` survives; the change's own keys are set.
    #[test]
    fn a_change_keeps_every_hand_edit_it_does_not_own() {
        let d = dir();
        let path = d.join("hive.json");
        let edited = FLEET
            .replace(r#""model": "sonnet""#, r#""model": "haiku""#)
            .replace(r#""A": "1""#, r#""A": "1", "B": "2""#)
            .replace(
                r#""tool_groups": ["messaging", "lifecycle"]"#,
                r#""tool_groups": ["messaging", "lifecycle", "meta"]"#,
            );
        std::fs::write(&path, &edited).unwrap();
        let kid = base("kid");
        let w = apply(
            &path,
            &Change {
                agent: "kid",
                base: Some(&kid),
                patch: &json!({"capabilities": ["query_agent_state"], "env": {"C": "3"}}),
            },
        )
        .unwrap();
        let cfg = HiveConfig::load(&path).unwrap();
        assert_eq!(cfg, w.config);
        let k = cfg.agent("kid").unwrap();
        assert_eq!(k.model.as_deref(), Some("haiku"), "the hand edit stays");
        assert_eq!(
            k.env
                .iter()
                .map(|(a, b)| format!("{a}={b}"))
                .collect::<Vec<_>>(),
            ["A=1", "B=2", "C=3"]
        );
        assert_eq!(k.capabilities.len(), 1);
        assert_eq!(cfg.agent("boss").unwrap().tool_groups.len(), 3);
        assert_eq!(cfg.hive_name.as_deref(), Some("h"));
        // A key the change sets to what hive last applied is not rewritten,
        // so the hand edit of it stays too.
        apply(
            &path,
            &Change {
                agent: "kid",
                base: Some(&kid),
                patch: &json!({"model": "sonnet", "tool_groups": []}),
            },
        )
        .unwrap();
        let k = HiveConfig::load(&path)
            .unwrap()
            .agent("kid")
            .unwrap()
            .clone();
        assert_eq!(k.model.as_deref(), Some("haiku"));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_same_key_changed_by_hand_and_by_the_change_is_refused() {
        let d = dir();
        let path = d.join("hive.json");
        let edited = FLEET.replace(r#""model": "sonnet""#, r#""model": "haiku""#);
        std::fs::write(&path, &edited).unwrap();
        let kid = base("kid");
        let e = apply(
            &path,
            &Change {
                agent: "kid",
                base: Some(&kid),
                patch: &json!({"model": "opus"}),
            },
        )
        .unwrap_err();
        assert!(
            e.starts_with(&format!(
                "kid's model was changed by hand in the fleet file {} (\"sonnet\" when hive last \
                 applied it, \"haiku\" in the file now) and this change sets it to \"opus\": \
                 nothing was changed",
                path.canonicalize().unwrap().display()
            )),
            "{e}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), edited);
        // The same value by hand and by the change is no conflict.
        apply(
            &path,
            &Change {
                agent: "kid",
                base: Some(&kid),
                patch: &json!({"model": "haiku"}),
            },
        )
        .unwrap();
        // One variable of env set both ways is.
        let e = apply(
            &path,
            &Change {
                agent: "kid",
                base: Some(&kid),
                patch: &json!({"env": {"A": "9"}}),
            },
        );
        assert!(e.is_ok(), "A was not edited by hand: {e:?}");
        let e = apply(
            &path,
            &Change {
                agent: "kid",
                base: Some(&kid),
                patch: &json!({"env": {"A": "7"}}),
            },
        )
        .unwrap_err();
        assert!(e.starts_with("kid's env.A was changed by hand"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_new_entry_is_added_unless_the_name_is_taken_by_hand() {
        let d = dir();
        let path = d.join("hive.json");
        std::fs::write(&path, FLEET).unwrap();
        let w = apply(
            &path,
            &Change {
                agent: "kid2",
                base: None,
                patch: &json!({"parent": "boss"}),
            },
        )
        .unwrap();
        assert_eq!(w.entry.parent.as_deref(), Some("boss"));
        let cfg = HiveConfig::load(&path).unwrap();
        assert_eq!(cfg.agents.len(), 3);
        let e = apply(
            &path,
            &Change {
                agent: "kid2",
                base: None,
                patch: &json!({"parent": "boss"}),
            },
        )
        .unwrap_err();
        assert!(e.contains("already has an entry named kid2"), "{e}");
        let e = apply(
            &path,
            &Change {
                agent: "kid3",
                base: None,
                patch: &json!({"parent": "nobody"}),
            },
        )
        .unwrap_err();
        assert!(e.contains("would not be valid"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_file_keeps_its_mode_and_a_bad_or_unwritable_file_is_refused() {
        let d = dir();
        let path = d.join("hive.json");
        std::fs::write(&path, FLEET).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let kid = base("kid");
        let patch = json!({"model": "opus"});
        let change = Change {
            agent: "kid",
            base: Some(&kid),
            patch: &patch,
        };
        let root = crate::sys::is_root();
        if root {
            std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        }
        apply(&path, &change).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
        if root {
            assert_eq!(
                (meta.uid(), meta.gid()),
                (65534, 65534),
                "the owner is kept"
            );
        }
        let leftovers: Vec<_> = std::fs::read_dir(&d).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temporary file is left");
        // A file that does not load is not touched.
        std::fs::write(&path, "{ nope").unwrap();
        let e = apply(&path, &change).unwrap_err();
        assert!(e.contains("does not load"), "{e}");
        // An entry removed by hand.
        std::fs::write(&path, r#"{"agents":[{"name":"boss"}]}"#).unwrap();
        let e = apply(&path, &change).unwrap_err();
        assert!(e.contains("kid is no longer in the fleet file"), "{e}");
        // A directory hive may not write to (as root every mode is writable).
        if !root {
            std::fs::write(&path, FLEET).unwrap();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o500)).unwrap();
            let e = apply(&path, &change).unwrap_err();
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
            assert!(e.starts_with("cannot write the fleet file"), "{e}");
            assert!(e.contains("nothing was changed"), "{e}");
            assert_eq!(std::fs::read_to_string(&path).unwrap(), FLEET);
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A declaration that drops an entry removes it when the operator left
    /// it as declared, and is refused naming it when the operator changed it.
    #[test]
    fn a_declared_removal_keeps_an_entry_the_operator_changed() {
        let d = dir();
        let path = d.join("hive.json");
        let old = r#"{"agents":[{"name":"boss"},{"name":"kid","parent":"boss"},{"name":"pal"}]}"#;
        let new = r#"{"agents":[{"name":"boss"}]}"#;
        std::fs::write(
            &path,
            r#"{"agents":[{"name":"boss"},{"name":"kid","parent":"boss","turn_usd":1.0},{"name":"pal"}]}"#,
        )
        .unwrap();
        let e = apply_declared(&path, Some(old), new).unwrap_err();
        assert!(
            e.starts_with("agents.kid was changed both in the fleet file"),
            "{e}"
        );
        let cfg = apply_declared(
            &path,
            Some(old),
            r#"{"agents":[{"name":"boss"},{"name":"kid","parent":"boss"}]}"#,
        )
        .unwrap();
        let names: Vec<&str> = cfg.agents.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["boss", "kid"], "pal, unchanged, is gone");
        assert_eq!(cfg.agent("kid").unwrap().turn_usd, Some(1.0));
        assert_eq!(HiveConfig::load(&path).unwrap(), cfg);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_nix_store_path_names_the_nix_option() {
        let patch = json!({});
        let change = Change {
            agent: "kid",
            base: None,
            patch: &patch,
        };
        let e = cannot_write(
            Path::new("/nix/store/abc-hive.json"),
            &std::io::Error::from_raw_os_error(libc::EROFS),
            &change,
        );
        assert!(e.contains("services.hyperhive.agents.kid"), "{e}");
        assert!(e.starts_with("cannot write the fleet file /nix/store/abc-hive.json"));
    }
}
