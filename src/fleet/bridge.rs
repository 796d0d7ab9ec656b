//! `hive up`'s Matrix bridge: when the fleet file has a `matrix` section, the
//! `bridge-sup` thread keeps one `hive matrix-bridge` child alive (a
//! `sys::ProcessGroup`, its output in `DATA/logs/bridge.log`), restarting it
//! after a crash with the agents' capped backoff, and stops it at shutdown
//! (SIGTERM, then SIGKILL after the grace). Its one `select!` waits on the stop
//! channel, the child's exit (`wait-bridge` reports it, the thread reaps) and
//! the restart deadline. The bridge is not sandboxed like an agent: it is the
//! operator's, and needs the network. Before anything starts, [`check_login`]
//! logs the bridge in once, so a wrong password stops `hive up` with exit 2.

use super::logfile::{self, LogFile};
use super::supervisor::backoff;
use super::UpSettings;
use crate::sys::ProcessGroup;
use crossbeam_channel::{at, bounded, never, select, unbounded, Receiver, Sender};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The bridge's state dir under the data dir (its access token).
pub const STATE_DIR: &str = "matrix";

/// The log file's name under `DATA/logs`.
pub const LOG_NAME: &str = "bridge.log";

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
    /// Starts supervising `hive matrix-bridge` on the broker's bridge socket.
    pub fn start(s: &UpSettings) -> Result<BridgeSup, String> {
        let (stop_tx, stop_rx) = bounded::<()>(1);
        let s = s.clone();
        let thread = std::thread::Builder::new()
            .name("bridge-sup".into())
            .spawn(move || Sup::new(s).run(stop_rx))
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

struct Sup {
    s: UpSettings,
    log: Arc<Mutex<LogFile>>,
    child: Option<ProcessGroup>,
    started: Option<Instant>,
    failures: u32,
    restart_at: Option<Instant>,
    exited_tx: Sender<u32>,
    exited: Receiver<u32>,
}

impl Sup {
    fn new(s: UpSettings) -> Sup {
        let log = LogFile::open(
            s.data.join("logs").join(LOG_NAME),
            s.log_max_bytes,
            s.log_keep,
        );
        let (exited_tx, exited) = unbounded();
        Sup {
            s,
            log: Arc::new(Mutex::new(log)),
            child: None,
            started: None,
            failures: 0,
            restart_at: Some(Instant::now()),
            exited_tx,
            exited,
        }
    }

    fn run(mut self, stop: Receiver<()>) {
        loop {
            let timer = self.restart_at.map_or_else(never, at);
            select! {
                recv(stop) -> _ => return self.stop(),
                recv(self.exited) -> pid => {
                    if let Ok(pid) = pid {
                        self.on_exit(pid);
                    }
                }
                recv(timer) -> _ => {
                    self.restart_at = None;
                    self.spawn();
                }
            }
        }
    }

    fn spawn(&mut self) {
        match self.spawn_child() {
            Ok(child) => {
                let pid = child.id();
                let tx = self.exited_tx.clone();
                if let Err(e) = child.on_exit("wait-bridge".into(), move || {
                    let _ = tx.send(pid);
                }) {
                    log::error!("cannot watch the bridge: {e}; restarting it");
                    drop(child);
                    self.later();
                    return;
                }
                log::info!("started the Matrix bridge (pid {pid})");
                self.child = Some(child);
                self.started = Some(Instant::now());
            }
            Err(e) => {
                log::error!("cannot start the Matrix bridge: {e}");
                self.later();
            }
        }
    }

    fn spawn_child(&self) -> Result<ProcessGroup, String> {
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
        let mut child = ProcessGroup::spawn(&mut cmd)
            .map_err(|e| format!("cannot run {} matrix-bridge: {e}", self.s.exe.display()))?;
        if let Some(out) = child.child_mut().stdout.take() {
            logfile::pump("log-bridge-out".into(), out, self.log.clone());
        }
        if let Some(err) = child.child_mut().stderr.take() {
            logfile::pump("log-bridge-err".into(), err, self.log.clone());
        }
        Ok(child)
    }

    /// Reaps the bridge and schedules its restart.
    fn on_exit(&mut self, pid: u32) {
        let Some(child) = self.child.as_mut().filter(|c| c.id() == pid) else {
            return;
        };
        let status = match child.try_wait() {
            Ok(Some(st)) => st.to_string(),
            Ok(None) => return,
            Err(e) => format!("lost: {e}"),
        };
        self.child = None;
        let up = self.started.map_or(Duration::ZERO, |t| t.elapsed());
        if up >= self.s.stable {
            self.failures = 0;
        }
        let wait = self.later();
        log::warn!(
            "the Matrix bridge exited ({status}) after {up:?}; restarting in {wait:?} (see {})",
            self.log_path().display()
        );
    }

    /// Schedules the next start after the backoff; returns the wait.
    fn later(&mut self) -> Duration {
        let wait = backoff(self.s.restart_base, self.s.restart_max, self.failures);
        self.failures += 1;
        self.restart_at = Some(Instant::now() + wait);
        wait
    }

    fn log_path(&self) -> PathBuf {
        self.s.data.join("logs").join(LOG_NAME)
    }

    /// SIGTERM, and SIGKILL after the grace; the child is reaped either way.
    fn stop(mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        child.signal_leader(libc::SIGTERM);
        let grace = at(Instant::now() + self.s.stop_grace);
        loop {
            select! {
                recv(self.exited) -> pid => {
                    if pid.is_ok_and(|p| p == child.id()) {
                        let _ = child.try_wait();
                        return;
                    }
                }
                recv(grace) -> _ => {
                    log::warn!("the Matrix bridge did not stop within its grace; SIGKILL");
                    // Dropping the group kills and reaps it.
                    return;
                }
            }
        }
    }
}
