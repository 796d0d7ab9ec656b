//! Settings from environment variables, read one way everywhere: a value is
//! trimmed and an empty one counts as unset; a value that does not parse is an
//! error naming the variable, quoting a short prefix of what it held and saying
//! what was expected. [`Env`] reads the process environment, or a test's map,
//! so each module's `from_env` is a pure function of an `Env` that runs once at
//! start. The process's own variables and the logger's ([`KEPT`]) are taken
//! from the environment in one pass the first time one is read ([`var`]),
//! since musl's `getenv` compares every variable for every lookup.

use std::borrow::Cow;
use std::ffi::{c_char, CStr};
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

/// The prefixes of the variables [`var`] takes from its one pass over the
/// environment: hive's own settings, the logger's, and the colour switches
/// the logger's terminal check reads. Every other variable is looked up when
/// asked for.
pub const KEPT: [&[u8]; 4] = [b"HIVE_", b"RUST_LOG", b"NO_COLOR", b"CLICOLOR"];

type Vars = Vec<(Box<[u8]>, Box<[u8]>)>;

/// The variable `key` of the process's environment, as `std::env::var`
/// reads it: `None` when unset or not UTF-8. Variables named by [`KEPT`]
/// come from one pass over the environment at the first such read (hive
/// never changes its own environment).
pub fn var(key: &str) -> Option<String> {
    String::from_utf8(var_bytes(key)?.into_owned()).ok()
}

/// Whether `key` is set at all, to any value (as `std::env::var_os` sees it).
pub fn is_set(key: &str) -> bool {
    var_bytes(key).is_some()
}

fn var_bytes(name: &str) -> Option<Cow<'static, [u8]>> {
    let key = name.as_bytes();
    if KEPT.iter().any(|k| key.starts_with(k)) {
        static KEPT_VARS: OnceLock<Vars> = OnceLock::new();
        let vars = KEPT_VARS.get_or_init(|| scan(&KEPT));
        // The first of a repeated name, as getenv(3) finds it.
        let (_, value) = vars.iter().find(|(k, _)| **k == *key)?;
        return Some(Cow::Borrowed(value));
    }
    use std::os::unix::ffi::OsStringExt;
    std::env::var_os(name).map(|v| Cow::Owned(v.into_vec()))
}

/// Every variable whose name starts with one of `prefixes`, in the
/// environment's order, read straight from `environ`: an entry that does not
/// start with a prefix costs the comparison of its first bytes and is not
/// copied.
fn scan(prefixes: &[&[u8]]) -> Vars {
    extern "C" {
        static environ: *const *const c_char;
    }
    let mut vars = Vars::new();
    // SAFETY: hive never changes its own environment (no `set_var`,
    // `setenv` or `putenv` anywhere; .clippy.toml refuses the first two),
    // so `environ` and the strings it points to stay as `execve` left them:
    // a null-terminated array of pointers to NUL-terminated strings. `starts_with` reads an entry only up to the
    // first byte that differs from the prefix, which the entry's NUL is at
    // the latest (no prefix holds a NUL).
    unsafe {
        let mut entry = environ;
        if entry.is_null() {
            return vars;
        }
        while !(*entry).is_null() {
            let start = (*entry).cast::<u8>();
            let first = *start;
            let starts_with = |p: &[u8]| p.iter().enumerate().all(|(i, b)| *start.add(i) == *b);
            if prefixes
                .iter()
                .any(|p| p.first() == Some(&first) && starts_with(p))
            {
                let text = CStr::from_ptr(*entry).to_bytes();
                if let Some(eq) = text.iter().position(|&b| b == b'=') {
                    vars.push((text[..eq].into(), text[eq + 1..].into()));
                }
            }
            entry = entry.add(1);
        }
    }
    vars
}

/// Where variables come from.
pub struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

fn process_var(key: &str) -> Option<String> {
    var(key)
}

/// How much of a bad value an error quotes.
const SHOWN: usize = 40;

impl Env<'static> {
    /// The process's environment.
    pub fn process() -> Env<'static> {
        Env {
            lookup: &process_var,
        }
    }
}

impl<'a> Env<'a> {
    /// Variables from `lookup` (a test's map).
    pub fn new(lookup: &'a dyn Fn(&str) -> Option<String>) -> Env<'a> {
        Env { lookup }
    }

    /// True when `key` is set to a blank value, which [`Env::get`] takes for
    /// unset: for the few variables whose explicit empty value means "off".
    pub fn is_blank(&self, key: &str) -> bool {
        (self.lookup)(key).is_some_and(|v| v.trim().is_empty())
    }

    /// The trimmed value of `key`; `None` when unset or blank.
    pub fn get(&self, key: &str) -> Option<String> {
        (self.lookup)(key)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// The error for `key` holding `value` where `expected` was wanted.
    pub fn bad(key: &str, value: &str, expected: &str) -> String {
        let shown: String = value.chars().take(SHOWN).collect();
        let cut = if shown.len() < value.len() { "…" } else { "" };
        format!("{key}={shown:?}{cut} is not {expected}")
    }

    /// `key` parsed as a `T`; `expected` says what it should be ("a port").
    pub fn parse<T: FromStr>(&self, key: &str, expected: &str) -> Result<Option<T>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.parse().map(Some).map_err(|_| Env::bad(key, &v, expected)),
        }
    }

    /// A whole number, or `default` when unset.
    pub fn num(&self, key: &str, default: u64) -> Result<u64, String> {
        Ok(self.parse(key, "a whole number")?.unwrap_or(default))
    }

    /// A whole number of seconds.
    pub fn secs(&self, key: &str, default: u64) -> Result<Duration, String> {
        Ok(Duration::from_secs(
            self.parse(key, "a whole number of seconds")?
                .unwrap_or(default),
        ))
    }

    /// A whole number of milliseconds.
    pub fn millis(&self, key: &str, default: u64) -> Result<Duration, String> {
        Ok(Duration::from_millis(
            self.parse(key, "a whole number of milliseconds")?
                .unwrap_or(default),
        ))
    }

    /// An IP address.
    pub fn ip(&self, key: &str, default: IpAddr) -> Result<IpAddr, String> {
        Ok(self
            .parse(key, "an IP address (e.g. 127.0.0.1 or 0.0.0.0)")?
            .unwrap_or(default))
    }

    /// `on` or `off` (also `true`/`false`, `yes`/`no`, `1`/`0`), any case.
    pub fn switch(&self, key: &str, default: bool) -> Result<bool, String> {
        match self.get(key).map(|v| (v.to_ascii_lowercase(), v)) {
            None => Ok(default),
            Some((l, _)) if matches!(l.as_str(), "on" | "true" | "yes" | "1") => Ok(true),
            Some((l, _)) if matches!(l.as_str(), "off" | "false" | "no" | "0") => Ok(false),
            Some((_, v)) => Err(Env::bad(key, &v, "on or off")),
        }
    }

    /// A path.
    pub fn path(&self, key: &str) -> Option<PathBuf> {
        self.get(key).map(PathBuf::from)
    }

    /// A path, or `default`.
    pub fn path_or(&self, key: &str, default: &str) -> PathBuf {
        self.path(key).unwrap_or_else(|| PathBuf::from(default))
    }

    /// A list separated by commas (or newlines); blank entries are dropped.
    pub fn list(&self, key: &str) -> Vec<String> {
        self.get(key)
            .unwrap_or_default()
            .split([',', '\n'])
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn with<T>(vars: &[(&str, &str)], f: impl FnOnce(&Env) -> T) -> T {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = move |k: &str| m.get(k).cloned();
        f(&Env::new(&lookup))
    }

    /// The one pass over `environ` finds what std's reading of the
    /// environment finds, in its order, repeated names included; `var`
    /// answers as `std::env::var` does for a kept name and any other.
    #[test]
    fn the_one_pass_reads_what_std_reads() {
        use std::os::unix::ffi::{OsStrExt, OsStringExt};
        // cargo sets CARGO_* for every test process, and PATH is everywhere.
        let prefixes: [&[u8]; 2] = [b"CARGO_", b"PATH"];
        let std_reads: Vars = std::env::vars_os()
            .filter(|(k, _)| prefixes.iter().any(|p| k.as_bytes().starts_with(p)))
            .map(|(k, v)| (k.into_vec().into(), v.into_vec().into()))
            .collect();
        assert!(std_reads.len() > 2, "{std_reads:?}");
        assert_eq!(scan(&prefixes), std_reads);
        assert_eq!(scan(&[b"NO SUCH PREFIX"]), Vars::new());
        for key in [
            "PATH",
            "CARGO_PKG_NAME",
            "HOME",
            "HIVE_NOT_SET_HERE",
            "RUST_LOG",
        ] {
            assert_eq!(var(key), std::env::var(key).ok(), "{key}");
            assert_eq!(is_set(key), std::env::var_os(key).is_some(), "{key}");
        }
    }

    #[test]
    fn values_are_trimmed_and_blank_is_unset() {
        with(&[("A", "  7 "), ("B", "   "), ("L", " x, ,y\nz ")], |e| {
            assert_eq!(e.num("A", 1), Ok(7));
            assert_eq!(e.num("B", 1), Ok(1));
            assert_eq!(e.num("C", 1), Ok(1));
            assert_eq!(e.list("L"), ["x", "y", "z"]);
            assert_eq!(e.path_or("B", "/d"), PathBuf::from("/d"));
        });
    }

    #[test]
    fn a_bad_value_names_the_variable_and_what_it_should_be() {
        with(
            &[
                ("N", "soon"),
                ("S", "maybe"),
                ("I", "localhost"),
                ("LONG", &"9".repeat(5000)),
            ],
            |e| {
                assert_eq!(
                    e.num("N", 0).unwrap_err(),
                    "N=\"soon\" is not a whole number"
                );
                assert!(e.switch("S", true).unwrap_err().contains("S=\"maybe\""));
                assert!(e
                    .ip("I", IpAddr::from([127, 0, 0, 1]))
                    .unwrap_err()
                    .contains("IP address"));
                let long = e.parse::<u8>("LONG", "a small number").unwrap_err();
                assert!(long.len() < 100 && long.contains('…'), "{long}");
            },
        );
    }

    #[test]
    fn switches_take_the_usual_spellings() {
        with(
            &[("A", "OFF"), ("B", "on"), ("C", "0"), ("D", "yes")],
            |e| {
                assert_eq!(e.switch("A", true), Ok(false));
                assert_eq!(e.switch("B", false), Ok(true));
                assert_eq!(e.switch("C", true), Ok(false));
                assert_eq!(e.switch("D", false), Ok(true));
                assert_eq!(e.switch("E", true), Ok(true));
            },
        );
    }
}
