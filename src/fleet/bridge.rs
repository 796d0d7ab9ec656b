//! `hive up`'s Matrix bridge: when the fleet file has a `matrix` section, the
//! `bridge-sup` thread keeps one `hive matrix-bridge` child alive (a
//! [`child::Proc`], its output in `DATA/logs/matrix.bridge.log`), restarting it
//! after a crash with the agents' capped backoff, and stops it at shutdown
//! (SIGTERM, then SIGKILL after the grace). Its one `select!` waits on the stop
//! channel, the child's exit (`sup-children` reports it, the thread reaps) and
//! the restart deadline, and on `hive reload`'s restart (a changed `matrix`
//! section: the bridge stops and starts again, and its `bridge_hello` reads
//! the new section from the broker); the child's phase, backoff and stop ladder are a
//! [`child::Supervised`], as for the agents. The bridge is not sandboxed like
//! an agent: it is the operator's, and needs the network. Before anything starts, [`check_login`]
//! logs the bridge in once, so a wrong password stops `hive up` with exit 2.

use super::child::{self, Ended, Exited, Owner, Supervised, Timing};
use super::logfile::LogFile;
use super::UpSettings;
use crossbeam_channel::{at, bounded, never, select, unbounded, Receiver, Sender};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// The bridge's state dir under the data dir (its access token).
pub const STATE_DIR: &str = "matrix";

/// The log file's name under `DATA/logs`: a dot in its stem, which no agent
/// name has, so it is never an agent's log (`bridge.log` was agent
/// `bridge`'s).
pub const LOG_NAME: &str = "matrix.bridge.log";

/// Logs the bridge in once before `hive up` starts anything: a refused login
/// or an unreadable secret file is the error to exit 2 with.
pub fn check_login(cfg: &crate::config::HiveConfig, data: &Path) -> Result<(), String> {
    let (Some(hive), Some(m)) = (&cfg.hive_name, &cfg.matrix) else {
        return Ok(());
    };
    crate::bridge::login::check_at_start(m, hive, &data.join(STATE_DIR))
}

/// The running `bridge-sup` thread; dropping it stops the bridge.
pub struct BridgeSup {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl BridgeSup {
    /// Starts supervising `hive matrix-bridge` on the broker's bridge
    /// socket; a message on `restart` stops the bridge and starts it again.
    pub fn start(s: &UpSettings, restart: Receiver<()>) -> Result<BridgeSup, String> {
        let (stop_tx, stop_rx) = bounded::<()>(1);
        let s = s.clone();
        let thread = std::thread::Builder::new()
            .name("bridge-sup".into())
            .spawn(move || Sup::new(s).run(stop_rx, restart))
            .map_err(|e| format!("cannot start the bridge-sup thread: {e}"))?;
        Ok(BridgeSup {
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Stops the bridge and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for BridgeSup {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The key of the bridge's exits.
const NAME: &str = "bridge";

struct Sup {
    s: UpSettings,
    log: Arc<Mutex<LogFile>>,
    /// The `hive matrix-bridge` child: phase, backoff, stop ladder.
    child: Supervised,
    exited_tx: Sender<Exited>,
    exited: Receiver<Exited>,
    /// A restart was asked for: once the child has stopped, it starts again.
    again: bool,
}

impl Sup {
    fn new(s: UpSettings) -> Sup {
        let log = LogFile::open(
            s.data.join("logs").join(LOG_NAME),
            s.log_max_bytes,
            s.log_keep,
        );
        let (exited_tx, exited) = unbounded();
        let mut child = Supervised::new("the Matrix bridge", Timing::of(&s));
        child.start_at(Instant::now());
        Sup {
            s,
            log: Arc::new(Mutex::new(log)),
            child,
            exited_tx,
            exited,
            again: false,
        }
    }

    fn run(mut self, stop: Receiver<()>, restart: Receiver<()>) {
        let mut restart = Some(restart);
        loop {
            let timer = self.child.deadline().map_or_else(never, at);
            let asked = restart.clone().unwrap_or_else(never);
            select! {
                recv(stop) -> _ => return self.stop(),
                recv(asked) -> r => match r {
                    Ok(()) => {
                        log::info!("restarting the Matrix bridge onto the fleet file's matrix section");
                        self.again = true;
                        if !self.child.stop() {
                            // Not running (in backoff): start now.
                            self.again = false;
                            self.child.start_at(Instant::now());
                        }
                    }
                    Err(_) => restart = None,
                },
                recv(self.exited) -> e => {
                    if let Ok(e) = e {
                        self.on_exited(&e);
                    }
                }
                recv(timer) -> _ => self.on_deadlines(),
            }
        }
    }

    fn spawn(&mut self) {
        match self.spawn_child() {
            Ok(child) => {
                match self
                    .child
                    .run(child, "wait-bridge".into(), NAME, &self.exited_tx)
                {
                    Ok(pid) => log::info!("started the Matrix bridge (pid {pid})"),
                    Err(e) => log::error!("cannot watch the bridge: {e}; restarting it"),
                }
            }
            Err(e) => {
                log::error!("cannot start the Matrix bridge: {e}");
                self.child.back_off();
            }
        }
    }

    fn spawn_child(&self) -> Result<child::Proc, String> {
        let logs = self.s.data.join("logs");
        std::fs::create_dir_all(&logs)
            .map_err(|e| format!("cannot create {}: {e}", logs.display()))?;
        let mut cmd = Command::new(&self.s.exe);
        cmd.arg("matrix-bridge")
            .arg("--socket")
            .arg(crate::proto::paths::bridge_socket(&self.s.run_dir))
            .arg("--state-dir")
            .arg(self.s.data.join(STATE_DIR))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SIGTERM comes if this thread dies without stopping it; the token
        // file is private whatever the umask.
        crate::sys::process::child_setup(&mut cmd, libc::SIGTERM, self.s.child_umask);
        let spawned = child::spawn(&mut cmd)
            .map_err(|e| format!("cannot run {} matrix-bridge: {e}", self.s.exe.display()))?;
        Ok(child::log_output(spawned, &self.log))
    }

    fn log_path(&self) -> PathBuf {
        self.s.data.join("logs").join(LOG_NAME)
    }

    /// SIGTERM, and SIGKILL after the grace; the child is reaped either way.
    fn stop(mut self) {
        self.child.stop();
        let (exited, grace) = (self.exited.clone(), self.s.stop_grace);
        // Dropping what is left reaps it.
        drop(child::stop_all(&mut self, &exited, grace));
    }
}

impl Owner for Sup {
    fn children(&mut self) -> Box<dyn Iterator<Item = &mut Supervised> + '_> {
        Box::new(std::iter::once(&mut self.child))
    }

    /// Reaps the bridge and schedules its restart.
    fn on_exited(&mut self, e: &Exited) {
        match self.child.on_exit(e.pid) {
            Some(Ended::Crashed { status, up, .. }) => {
                let wait = self.child.after_crash(up);
                log::warn!(
                    "the Matrix bridge exited ({status}) after {up:?}; restarting in {wait:?} (see {})",
                    self.log_path().display()
                );
            }
            Some(Ended::Stopped { .. }) if std::mem::take(&mut self.again) => self.spawn(),
            _ => {}
        }
    }

    /// Starts the bridge once its backoff ran out; SIGKILLs it when a stop's
    /// grace ran out.
    fn on_deadlines(&mut self) {
        if self.child.on_deadline(Instant::now()) {
            self.spawn();
        }
    }
}
