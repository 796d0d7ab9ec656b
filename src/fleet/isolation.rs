//! Whether `hive up` isolates its agents, and what each one sees. Owns
//! `HIVE_ISOLATION` (`auto`, the default; `off`; `required`), the one probe at
//! start that finds out whether the kernel lets this user build a sandbox
//! (`sandbox.rs`), the line `hive up` prints about it, and the per-agent [`Spec`]:
//! the data dir and the fleet file's directory are hidden, and the agent's own
//! dirs (and the `hive` binary, if it lives there) are bound back. The trust model
//! this gives is written down in `docs/fleet.md`.

use super::sandbox::Spec;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// `HIVE_ISOLATION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting {
    /// Agents run unisolated, and `hive up` says so.
    Off,
    /// Isolate when the kernel allows it; otherwise say so and run unisolated.
    Auto,
    /// Refuse to start without isolation.
    Required,
}

impl Setting {
    pub fn parse(value: Option<&str>) -> Result<Setting, String> {
        match value.map(str::trim) {
            None | Some("") | Some("auto") => Ok(Setting::Auto),
            Some("off") => Ok(Setting::Off),
            Some("required") => Ok(Setting::Required),
            Some(v) => Err(format!(
                "HIVE_ISOLATION={:?} is not one of off, auto, required",
                v.chars().take(40).collect::<String>()
            )),
        }
    }
}

/// How every agent of this `hive up` is sandboxed (the same for all of them).
#[derive(Debug, Clone, PartialEq)]
pub struct Isolation {
    /// A user namespace is needed (`hive up` is not root).
    userns: bool,
    /// The data dir, and the fleet file's directory when it is outside it.
    covers: Vec<PathBuf>,
    /// Paths one agent is shown read-only ([`Self::reading`]); behind one
    /// thin pointer, as every launch message carries an isolation.
    read_only: Option<std::sync::Arc<Vec<PathBuf>>>,
}

impl Isolation {
    /// This isolation for an agent whose entry names files it is shown
    /// read-only (its `icon`, `static_dir`, `web_dist`), wherever they are.
    pub fn reading(&self, paths: Vec<PathBuf>) -> Isolation {
        Isolation {
            read_only: (!paths.is_empty()).then(|| std::sync::Arc::new(paths)),
            ..self.clone()
        }
    }

    /// An agent's sandbox, running `command`: the covered dirs hidden but the
    /// paths of `own` under them (its `DATA/agents/NAME` with state, run, claude
    /// config and reminders; its socket's dir; the `hive` binary).
    pub fn spec(&self, own: &[PathBuf], command: Vec<OsString>) -> Spec {
        let keeps = own
            .iter()
            .filter(|p| self.covers.iter().any(|c| p.starts_with(c)))
            .cloned()
            .collect();
        Spec {
            userns: self.userns,
            covers: self.covers.clone(),
            keeps,
            read_only: self.read_only.as_deref().cloned().unwrap_or_default(),
            check: false,
            in_place: false,
            ids: None,
            command,
        }
    }
}

/// What `hive up` does about isolation: the plan, or none, and the line it prints.
#[derive(Debug)]
pub struct Decision {
    pub isolation: Option<Isolation>,
    pub line: String,
}

const FIX: &str = "to isolate them, enable unprivileged user namespaces \
     (sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces; on Ubuntu \
     kernel.apparmor_restrict_unprivileged_userns=0) or run each agent as its own uid \
     (docs/deploy.md); HIVE_ISOLATION=required refuses to start without isolation";

fn unisolated(why: &str) -> String {
    format!(
        "hive up: agents are NOT isolated ({why}): every agent can reach the operator socket, \
         the dashboard token, the fleet file and the other agents' files, and the web's \
         guarantees do not hold (an agent can reach the sockets of the other agents' pages and \
         take the place of its own); {FIX}"
    )
}

/// `hive up`'s decision at start, from `HIVE_ISOLATION`: prints the line that
/// says whether agents are isolated, and returns the plan.
pub fn at_start(
    exe: &Path,
    data: &Path,
    fleet: &Path,
    env: &crate::sys::env::Env,
) -> Result<Option<Isolation>, String> {
    let setting = Setting::parse(env.get("HIVE_ISOLATION").as_deref())?;
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(PathBuf::from)
        .map(|h| h.canonicalize().unwrap_or(h));
    let d = decide(setting, exe, data, fleet, home.as_deref())?;
    eprintln!("{}", d.line);
    Ok(d.isolation)
}

/// Decides once, at start, how agents run: reads `HIVE_ISOLATION`, checks that
/// the dirs to hide can be hidden, and probes the kernel by building a sandbox
/// with `exe`. `Err` only when isolation is required and impossible.
pub fn decide(
    setting: Setting,
    exe: &Path,
    data: &Path,
    fleet: &Path,
    home: Option<&Path>,
) -> Result<Decision, String> {
    if setting == Setting::Off {
        return Ok(Decision {
            isolation: None,
            line: unisolated("HIVE_ISOLATION=off"),
        });
    }
    let fail = |why: String| -> Result<Decision, String> {
        if setting == Setting::Required {
            return Err(format!(
                "HIVE_ISOLATION=required, but agents cannot be isolated: {why}"
            ));
        }
        Ok(Decision {
            isolation: None,
            line: unisolated(&why),
        })
    };
    let covers = match covers(data, fleet, home) {
        Ok(c) => c,
        Err(why) => return fail(why),
    };
    let root = crate::sys::is_root();
    // Root needs no user namespace (and one would make /proc harder to mount
    // under a hardened service); anyone else does.
    let tries: &[bool] = if root { &[false, true] } else { &[true] };
    let mut why = String::new();
    for &userns in tries {
        let isolation = Isolation {
            userns,
            read_only: None,
            covers: covers.clone(),
        };
        match probe(exe, &isolation) {
            Ok(()) => {
                let fleet_dir = match covers.get(1) {
                    Some(dir) => {
                        format!(" and nothing of {} (the fleet file's dir)", dir.display())
                    }
                    None => String::new(),
                };
                let line = format!(
                    "hive up: agents are isolated ({} and PID namespaces): each sees only its own \
                     dirs in {}{fleet_dir}: not the operator socket, the dashboard token, the \
                     fleet file, the logs or the other agents",
                    if userns { "user, mount" } else { "mount" },
                    data.display(),
                );
                return Ok(Decision {
                    isolation: Some(isolation),
                    line,
                });
            }
            Err(e) => why = e,
        }
    }
    fail(format!("the kernel refused a sandbox: {why}"))
}

/// The directories hidden from every agent: the data dir, and the fleet file's
/// directory when it is outside it — a bind mount over the file itself would not
/// hold, since rewriting the file through a rename detaches it.
fn covers(data: &Path, fleet: &Path, home: Option<&Path>) -> Result<Vec<PathBuf>, String> {
    let holds_home = |dir: &Path| home.is_some_and(|h| h.starts_with(dir));
    if data.parent().is_none() || holds_home(data) {
        return Err(format!(
            "the data dir {} is / or holds HOME; give hive up a data dir of its own",
            data.display()
        ));
    }
    let mut covers = vec![data.to_path_buf()];
    if !fleet.starts_with(data) {
        let dir = fleet.parent().unwrap_or(Path::new("/"));
        let top = dir.parent().is_none_or(|p| p.parent().is_none());
        if top || holds_home(dir) {
            return Err(format!(
                "the fleet file {} is in {}, which agents need (it is a top-level directory \
                 or holds HOME) and which would be hidden from them; move the fleet file into \
                 a directory of its own (e.g. /etc/hyperhive/) or into the data dir",
                fleet.display(),
                dir.display()
            ));
        }
        covers.push(dir.to_path_buf());
    }
    Ok(covers)
}

/// Builds a sandbox like an agent's (same covers), the way an agent's is
/// built (`sandbox::spawn`), that exits at once; `Err` is its error line.
fn probe(exe: &Path, isolation: &Isolation) -> Result<(), String> {
    let spec = Spec {
        check: true,
        command: Vec::new(),
        ..isolation.spec(&[], Vec::new())
    };
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    let spawned = super::sandbox::spawn(&super::sandbox::Spawn {
        exe,
        spec: &spec,
        env: &env,
        keep: &[],
        parent_death_signal: libc::SIGKILL,
        umask: 0o077,
    })
    .map_err(|e| e.to_string())?;
    let super::child::Spawned {
        mut child, stderr, ..
    } = spawned;
    let end = Instant::now() + Duration::from_secs(10);
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
            // Dropping the child kills its group and reaps it.
            _ => return Err("the probe did not finish within 10 s".into()),
        }
    };
    let stderr = std::fs::File::from(stderr);
    if status.success() {
        return Ok(());
    }
    let mut err = String::new();
    let _ = stderr.take(4096).read_to_string(&mut err);
    let last = err.lines().last().unwrap_or_default();
    let last = last
        .strip_prefix(&format!("hive {}: ", super::sandbox::SUBCOMMAND))
        .unwrap_or(last);
    Err(if last.is_empty() {
        format!("the probe exited with {status}")
    } else {
        last.to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_parses_and_a_bad_one_says_why() {
        assert_eq!(Setting::parse(None).unwrap(), Setting::Auto);
        assert_eq!(Setting::parse(Some(" off ")).unwrap(), Setting::Off);
        assert_eq!(Setting::parse(Some("required")).unwrap(), Setting::Required);
        let e = Setting::parse(Some("yes")).unwrap_err();
        assert!(
            e.contains("HIVE_ISOLATION") && e.contains("off, auto, required"),
            "{e}"
        );
    }

    #[test]
    fn the_data_dir_and_the_fleet_files_dir_are_hidden_unless_agents_need_them() {
        let home = Some(Path::new("/home/op"));
        let p = |s: &str| PathBuf::from(s);
        type Want = Result<&'static [&'static str], &'static str>;
        let cases: &[(&str, &str, Want)] = &[
            ("/var/lib/h", "/var/lib/h/hive.json", Ok(&["/var/lib/h"])),
            (
                "/var/lib/h",
                "/etc/hyperhive/hive.json",
                Ok(&["/var/lib/h", "/etc/hyperhive"]),
            ),
            (
                "/home/op/p/data",
                "/home/op/p/hive.json",
                Ok(&["/home/op/p/data", "/home/op/p"]),
            ),
            ("/var/lib/h", "/etc/hive.json", Err("top-level")),
            ("/var/lib/h", "/home/op/hive.json", Err("holds HOME")),
            ("/var/lib/h", "/hive.json", Err("top-level")),
            ("/", "/x/hive.json", Err("data dir / ")),
            ("/home", "/home/hive.json", Err("holds HOME")),
        ];
        for (data, fleet, want) in cases {
            let got = covers(&p(data), &p(fleet), home);
            match want {
                Ok(dirs) => assert_eq!(
                    got.unwrap(),
                    dirs.iter().map(|d| p(d)).collect::<Vec<_>>(),
                    "{data} {fleet}"
                ),
                Err(w) => {
                    let e = got.unwrap_err();
                    assert!(e.contains(w), "{data} {fleet}: {e}");
                }
            }
        }
    }

    #[test]
    fn an_agent_keeps_only_its_own_paths_under_the_hidden_dirs() {
        let iso = Isolation {
            userns: true,
            covers: vec!["/d".into(), "/etc/h".into()],
            read_only: None,
        };
        let own: Vec<PathBuf> = ["/d/agents/a", "/d/run/agents/a", "/usr/bin/hive"]
            .iter()
            .map(PathBuf::from)
            .collect();
        let spec = iso.spec(&own, vec!["/usr/bin/hive".into(), "serve".into()]);
        assert_eq!(spec.keeps, own[..2].to_vec());
        assert_eq!(spec.covers, iso.covers);
        assert!(spec.read_only.is_empty());
        // An agent's path keys are shown read-only, covered or not.
        let ro: Vec<PathBuf> = vec!["/nix/store/x-static".into(), "/d/icon.svg".into()];
        assert_eq!(iso.reading(ro.clone()).spec(&own, Vec::new()).read_only, ro);
        assert!(spec.userns && !spec.check);
    }
}
