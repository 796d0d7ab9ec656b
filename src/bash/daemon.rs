//! The task daemon's outside: [`start`] binds the socket (mode 0600), loads the
//! task records and starts the coordinator, wake and accept threads; a
//! connection thread per client reads request lines, hands each to the
//! coordinator and writes its answer. The accept loop and the connection loop
//! are the transport's (`proto::lines`: the accept loop outlives descriptor
//! exhaustion, backing off and keeping the listener). A task that starts in the
//! background makes the wake thread report the running tasks to the broker
//! (`report_tasks`), where `get_loose_ends` lists them.
//! [`DaemonHandle::shutdown`] stops it all.
//! `hive serve` embeds the daemon through these two calls; `hive bash-daemon`
//! ([`run_command`]) runs it alone until SIGTERM, its broker calls going
//! through the credential `hive up` handed it when isolated (its
//! `report_tasks` is taken only there: `proto::client::Dial`).

use super::accept::Acceptor;
use super::coordinator::{Coordinator, Event, Reply, Tasks};
use super::proto::{ListReply, TaskReply};
use super::report::view;
use super::store::Store;
use super::waker::{Waker, Wakes};
use crate::proto::bashwire::{Request, RetireReply};
use crate::proto::lines::{err_line, ok_line, serve_conn};
use crate::proto::{paths, Dial};
use crate::sys::env::Env;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Where the daemon listens, keeps its files and sends wakes.
#[derive(Debug, Clone, PartialEq)]
pub struct DaemonSettings {
    /// The socket `hive bash-mcp` connects to.
    pub socket: PathBuf,
    /// Tasks run here; records and output go to `harness/bash-tasks/` under it.
    pub state_dir: PathBuf,
    /// The agent's broker socket, for completion wakes.
    pub agent_socket: PathBuf,
    /// Run tasks with `bash` and this `BASH_ENV` when the file exists; `None`
    /// always uses `sh`.
    pub bash_env: Option<PathBuf>,
    /// Answer `retire` (exit when idle, for `hive up` to start it anew): true
    /// for `hive bash-daemon`, false inside `hive serve`.
    pub retirable: bool,
}

impl DaemonSettings {
    /// Settings for `state_dir` with the rest from the process environment.
    pub fn from_env(state_dir: PathBuf) -> DaemonSettings {
        DaemonSettings::read(state_dir, &Env::process())
    }

    /// Settings for `state_dir` with the rest from `env`: `HIVE_BASH_SOCKET`,
    /// `HIVE_SOCKET` and `HIVE_BASH_ENV`, else the defaults.
    pub fn read(state_dir: PathBuf, env: &Env) -> DaemonSettings {
        DaemonSettings {
            socket: env.path_or("HIVE_BASH_SOCKET", paths::DEFAULT_BASH_SOCKET),
            state_dir,
            agent_socket: env.path_or("HIVE_SOCKET", paths::DEFAULT_AGENT_SOCKET),
            bash_env: Some(env.path_or("HIVE_BASH_ENV", paths::DEFAULT_BASH_ENV)),
            retirable: false,
        }
    }
}

/// Where an agent's task daemon runs, as `HIVE_BASH_DAEMON` says to `hive serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Inside `hive serve` (the default): its tasks end with the harness.
    Embedded,
    /// On its own (`hive bash-daemon`, started by `hive up` or a unit of its
    /// own): `hive serve` starts none, and tasks outlive the harness.
    External,
}

impl Placement {
    /// `HIVE_BASH_DAEMON`: unset or `embedded`, or `external`.
    pub fn read(env: &Env) -> Result<Placement, String> {
        match env.get("HIVE_BASH_DAEMON").as_deref().map(str::trim) {
            None | Some("") | Some("embedded") => Ok(Placement::Embedded),
            Some("external") => Ok(Placement::External),
            Some(v) => Err(format!(
                "HIVE_BASH_DAEMON={:?} is not one of embedded, external (external: the \
                 bash-task daemon runs as `hive bash-daemon` on its own)",
                v.chars().take(40).collect::<String>()
            )),
        }
    }
}

/// The directory of task records and output under a state dir.
pub fn tasks_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("harness").join("bash-tasks")
}

/// A running daemon. Dropping it shuts it down too.
pub struct DaemonHandle {
    socket: PathBuf,
    tasks: Tasks,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
    /// Disconnects once the coordinator has stopped (None once asked).
    stopped: Option<crossbeam_channel::Receiver<()>>,
    retired: crossbeam_channel::Receiver<()>,
}

impl DaemonHandle {
    /// Fires once the daemon retired (it answered `retire` yes): then call
    /// [`DaemonHandle::shutdown`].
    pub fn retired(&self) -> &crossbeam_channel::Receiver<()> {
        &self.retired
    }

    /// The socket the daemon listens on.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops accepting, removes the socket, kills every running task's process
    /// group and records those tasks `interrupted` (their wakes go out now when
    /// the broker is reachable, else from the next daemon). Returns once done.
    pub fn shutdown(mut self) {
        self.stop_all();
    }

    fn stop_all(&mut self) {
        let Some(stopped) = self.stopped.take() else {
            return;
        };
        self.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            // A connection wakes the accept thread, which then sees `stop`.
            if UnixStream::connect(&self.socket).is_ok() {
                let _ = acceptor.join();
            }
        }
        let _ = std::fs::remove_file(&self.socket);
        let _ = self.tasks.send(Event::Shutdown);
        let _ = stopped.recv();
        log::info!("bash task daemon stopped");
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        self.stop_all();
    }
}

/// Starts the daemon: binds `settings.socket` (refusing one a live daemon
/// serves), takes over the records of earlier runs (tasks left running become
/// `interrupted` and get a wake) and starts serving.
pub fn start(settings: DaemonSettings) -> Result<DaemonHandle, String> {
    let broker = Dial::Socket(settings.agent_socket.clone());
    start_with(settings, broker, None)
}

/// [`start`], its broker calls made through `broker`; `also_retired` is
/// called too once it retired.
fn start_with(
    settings: DaemonSettings,
    broker: Dial,
    also_retired: Option<super::coordinator::Retired>,
) -> Result<DaemonHandle, String> {
    let dir = tasks_dir(&settings.state_dir);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("cannot create the task directory {}: {e}", dir.display()))?;
    let cwd = std::fs::canonicalize(&settings.state_dir).map_err(|e| {
        format!(
            "cannot resolve the state dir {}: {e}",
            settings.state_dir.display()
        )
    })?;
    let dir = tasks_dir(&cwd);
    let (store, records) = Store::open(&dir)?;
    let listener = bind(&settings.socket)?;

    let tasks = Tasks::new();
    let wakes = Wakes::new(Waker {
        broker,
        tasks_dir: dir.clone(),
        tasks: tasks.clone(),
    });
    let (retired_tx, retired) = crossbeam_channel::bounded(1);
    let (stopped_tx, stopped) = crossbeam_channel::bounded::<()>(0);
    let mut coordinator = Coordinator::new(
        store,
        records,
        cwd,
        settings.bash_env.clone(),
        &tasks,
        Box::new(wakes.clone()),
        stopped_tx,
    );
    if settings.retirable {
        coordinator = coordinator.retirable(Box::new(move || {
            let _ = retired_tx.send(());
            if let Some(also) = also_retired {
                also();
            }
        }));
    }
    tasks.serve(coordinator);
    // The running tasks are reported and the wakes still pending sent.
    wakes.kick();

    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = Acceptor {
        what: "the bash task socket".into(),
        thread: "bash-conn",
        ids: Arc::new(AtomicU64::new(1)),
        stop: Some(stop.clone()),
    };
    let (conn_tasks, conn_wakes) = (tasks.clone(), wakes);
    let acceptor = std::thread::Builder::new()
        .name("bash-accept".into())
        .stack_size(ACCEPT_STACK)
        .spawn(move || {
            acceptor.run(
                listener,
                || Ok(()),
                move |stream, _, ()| {
                    let (tasks, wakes) = (conn_tasks.clone(), conn_wakes.clone());
                    serve_conn(
                        stream,
                        BUSY,
                        |line| answer(line, &tasks, &wakes, &dir),
                        |id| {
                            let _ = tasks.send(Event::InlineLost(id));
                        },
                    )
                },
            )
        })
        .map_err(|e| format!("cannot start the accept thread: {e}"))?;
    log::info!(
        "bash task daemon listening on {}",
        settings.socket.display()
    );
    Ok(DaemonHandle {
        socket: settings.socket,
        tasks,
        stop,
        acceptor: Some(acceptor),
        stopped: Some(stopped),
        retired,
    })
}

/// Binds a socket only its owner may use, refusing to steal a live one.
fn bind(path: &Path) -> Result<UnixListener, String> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| format!("cannot create directory {}: {e}", parent.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            return Err(format!(
                "another bash task daemon is already listening on {}; stop it first",
                path.display()
            ));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot set permissions of {}: {e}", path.display()))?;
    Ok(listener)
}

/// The accept thread's stack: it accepts and hands each client to a
/// connection thread; it parses nothing.
const ACCEPT_STACK: usize = 128 * 1024;

/// How long a retiring daemon waits for its `retire` answer to be written.
const RETIRE_FLUSH: std::time::Duration = std::time::Duration::from_millis(500);

/// What a client hears when its connection cannot get a second descriptor.
const BUSY: &str = "the bash task daemon is short of file descriptors for the moment; \
                    nothing was done, try again in a little while";

/// Asks the coordinator and renders its reply; the second value is the id of a
/// task whose result this answer carries (so losing it must bring a wake back).
/// A task left running in the background makes the wake thread report the
/// running tasks to the broker.
fn answer(line: &str, tasks: &Tasks, wakes: &Wakes, dir: &Path) -> (String, Option<String>) {
    let req = match Request::parse(line) {
        Ok(req) => req,
        Err(e) => return (err_line(&e), None),
    };
    let op = req.op();
    let (reply_tx, reply_rx) = crossbeam_channel::bounded(1);
    let gone = || {
        (
            err_line("the bash task daemon is stopping; try again once it is back"),
            None,
        )
    };
    if tasks
        .send(Event::Call {
            req,
            reply: reply_tx,
        })
        .is_err()
    {
        return gone();
    }
    match reply_rx.recv() {
        Ok(Reply::Task { record, inline }) => {
            if op == "run" && !inline {
                wakes.report();
            }
            let id = inline.then(|| record.id.clone());
            let task = view(&record, dir);
            (ok_line(&TaskReply { task, inline }), id)
        }
        Ok(Reply::Tasks(records)) => {
            let tasks = records.iter().map(|r| r.summary()).collect();
            (ok_line(&ListReply { tasks }), None)
        }
        Ok(Reply::Retire { retired, running }) => {
            (ok_line(&RetireReply { retired, running }), None)
        }
        Ok(Reply::Error(e)) => {
            log::debug!("{op} refused: {e}");
            (err_line(&e), None)
        }
        Err(_) => gone(),
    }
}

/// `hive bash-daemon`: runs the daemon until SIGTERM, SIGINT or SIGHUP, then
/// shuts it down (a second signal exits at once); or until it retired (asked
/// while idle, by `hive up`, which starts it anew).
pub fn run_command(settings: DaemonSettings) -> Result<(), String> {
    // Taken before any thread starts, and closed on exec: no task gets it.
    let credential =
        crate::sys::fd::Credential::inherited(crate::proto::client::CREDENTIAL_FD_VAR)?;
    if credential.is_none() {
        log::info!(
            "no broker credential ({}): this daemon reports its tasks on the agent socket {}",
            crate::proto::client::CREDENTIAL_FD_VAR,
            settings.agent_socket.display()
        );
    }
    // The main thread waits for the signals itself (no thread of its own
    // for that: an idle agent's daemon is two threads, this one and its
    // accept loop); a retirement ends the wait too.
    let (signals, closer) = crate::sys::signals::here()?;
    let socket = settings.socket.clone();
    let broker = match credential {
        Some(c) => Dial::through(settings.agent_socket.clone(), move || c.connect()),
        None => Dial::Socket(settings.agent_socket.clone()),
    };
    let handle = start_with(
        DaemonSettings {
            retirable: true,
            ..settings
        },
        broker,
        Some(Box::new(move || closer.close())),
    )?;
    eprintln!("hive bash-daemon: listening on {}", socket.display());
    match signals.wait() {
        Some(_) => log::info!("stopping the bash task daemon"),
        None => {
            log::info!("the bash task daemon retired");
            // The coordinator said yes before the connection thread wrote
            // the answer: give it a moment to reach the asker, who would
            // otherwise see the connection close without one.
            std::thread::sleep(RETIRE_FLUSH);
        }
    }
    handle.shutdown();
    Ok(())
}

/// `--socket`, else `HIVE_BASH_SOCKET`, else [`paths::DEFAULT_BASH_SOCKET`].
pub fn socket_or_env(flag: Option<PathBuf>) -> PathBuf {
    flag.unwrap_or_else(|| Env::process().path_or("HIVE_BASH_SOCKET", paths::DEFAULT_BASH_SOCKET))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_inside_hive_serve_refuses_to_retire() {
        let dir = std::env::temp_dir().join(format!("hive-retire-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let handle = start(DaemonSettings {
            socket: dir.join("bash.sock"),
            state_dir: dir.clone(),
            agent_socket: dir.join("no-broker.sock"),
            bash_env: None,
            retirable: false,
        })
        .unwrap();
        let e = super::super::client::call::<RetireReply>(
            handle.socket(),
            &Request::Retire {},
            &crossbeam_channel::never(),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .contains("runs inside hive serve and does not retire"),
            "{e}"
        );
        assert!(handle.retired().try_recv().is_err());
        handle.shutdown();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_placement_is_embedded_unless_told_external_and_a_bad_value_says_why() {
        let read = |v: Option<&str>| {
            let value = v.map(str::to_string);
            let lookup = move |k: &str| (k == "HIVE_BASH_DAEMON").then(|| value.clone()).flatten();
            Placement::read(&Env::new(&lookup))
        };
        assert_eq!(read(None), Ok(Placement::Embedded));
        assert_eq!(read(Some("")), Ok(Placement::Embedded));
        assert_eq!(read(Some("embedded")), Ok(Placement::Embedded));
        assert_eq!(read(Some(" external ")), Ok(Placement::External));
        let e = read(Some("apart")).unwrap_err();
        assert!(
            e.contains("HIVE_BASH_DAEMON=\"apart\"") && e.contains("embedded, external"),
            "{e}"
        );
    }

    /// Each client is served on a connection thread of `accept::CONN_STACK`:
    /// a request nested to serde_json's recursion limit, and one far past
    /// it, is refused on that thread with an `ok:false` line, the
    /// connection goes on, and a good request is then answered (which also
    /// starts the coordinator's thread, idle until then).
    #[test]
    fn a_request_nested_to_the_parsers_limit_is_refused_on_the_connection_thread() {
        use std::io::{BufRead, BufReader, Write};
        let dir = std::env::temp_dir().join(format!("hive-bash-deep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let handle = start(DaemonSettings {
            socket: dir.join("bash.sock"),
            state_dir: dir.clone(),
            agent_socket: dir.join("no-broker.sock"),
            bash_env: None,
            retirable: false,
        })
        .unwrap();
        let conn = UnixStream::connect(handle.socket()).unwrap();
        conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut out = conn.try_clone().unwrap();
        let mut lines = BufReader::new(conn).lines();
        for depth in [126, 127, 5000] {
            let deep = format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
            writeln!(out, r#"{{"op":"status","id":{deep}}}"#).unwrap();
            let answer = lines.next().unwrap().unwrap();
            assert!(answer.starts_with(r#"{"ok":false"#), "{depth}: {answer}");
        }
        writeln!(out, r#"{{"op":"list"}}"#).unwrap();
        let answer = lines.next().unwrap().unwrap();
        assert!(answer.starts_with(r#"{"ok":true"#), "{answer}");
        handle.shutdown();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
