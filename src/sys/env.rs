//! Settings from environment variables, read one way everywhere: a value is
//! trimmed and an empty one counts as unset; a value that does not parse is an
//! error naming the variable, quoting a short prefix of what it held and saying
//! what was expected. [`Env`] reads the process environment, or a test's map,
//! so each module's `from_env` is a pure function of an `Env` that runs once at
//! start.

use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// Where variables come from.
pub struct Env<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
}

fn process_var(key: &str) -> Option<String> {
    std::env::var(key).ok()
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
