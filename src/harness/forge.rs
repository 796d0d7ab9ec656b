//! Forge notifications (`forge_notify`): a thread of `hive serve` that polls a
//! Forgejo instance's notifications API with the agent's token
//! (`<state>/forge-token`), wakes the agent with one line per new notification
//! (`from: "forge"`, stored, so it survives a broker restart) and marks each one
//! read. It owns one `ureq::Agent` with explicit timeouts; a failed poll backs off
//! (doubling up to a cap), a rejected token (401/403) stops the thread with an
//! error in the log. The thread waits on a stop channel, never in `sleep`, so
//! shutdown is prompt. At start it also writes the `tea` login file from the same
//! token and URL (the specification's `tea-login` unit). Nothing runs without a
//! token file.

use crate::proto::cmd::Wake;
use crate::proto::ClientError;
use crossbeam_channel::{after, bounded, select, Receiver, Sender};
use serde::Deserialize;
use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::Duration;

/// Largest notifications answer read; more is an error, not a partial list.
const MAX_BODY: u64 = 4 << 20;
/// How long one wake may wait for the broker's answer.
const WAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where to poll, with what, and how often. `from_env` reads the variables of
/// `docs/env.md`; tests build it directly with short durations.
#[derive(Debug, Clone)]
pub struct ForgeSettings {
    /// Base URL of the Forgejo instance, without a trailing slash.
    pub url: String,
    /// The token file; the thread starts only when it exists and is not empty.
    pub token_file: PathBuf,
    /// The harness's way to the broker, where wakes go.
    pub broker: crate::proto::Dial,
    /// Pause between two polls.
    pub poll: Duration,
    /// Timeout of one HTTP request, connecting and reading included.
    pub timeout: Duration,
    /// Cap on the pause after failed polls.
    pub backoff_max: Duration,
    /// Where to write the `tea` login file (`~/.config/tea/config.yml`); None skips it.
    pub tea_config: Option<PathBuf>,
    /// The login's user name in the `tea` file (the agent's label).
    pub user: String,
}

impl ForgeSettings {
    /// `HIVE_FORGE_URL`, `HIVE_FORGE_POLL_SECS`, `HIVE_FORGE_TIMEOUT_SECS`,
    /// `HIVE_FORGE_BACKOFF_MAX_SECS`, `HOME`; the token is `STATE/forge-token`.
    /// `None` when `HIVE_FORGE_URL` is set empty: forge notifications (and the
    /// tea login) are off, token or not.
    pub fn from_env(
        state_dir: &Path,
        broker: &crate::proto::Dial,
        label: &str,
    ) -> Result<Option<Self>, String> {
        let env = crate::sys::env::Env::process();
        if env.is_blank("HIVE_FORGE_URL") {
            log::info!("HIVE_FORGE_URL is empty: forge notifications are off");
            return Ok(None);
        }
        let url = env
            .get("HIVE_FORGE_URL")
            .unwrap_or_else(|| "http://localhost:3000".into());
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "HIVE_FORGE_URL={url:?} must be an http:// or https:// URL"
            ));
        }
        Ok(Some(ForgeSettings {
            url: url.trim_end_matches('/').to_string(),
            token_file: state_dir.join("forge-token"),
            broker: broker.clone(),
            poll: env
                .secs("HIVE_FORGE_POLL_SECS", 60)?
                .max(Duration::from_secs(1)),
            timeout: env.secs("HIVE_FORGE_TIMEOUT_SECS", 10)?,
            backoff_max: env.secs("HIVE_FORGE_BACKOFF_MAX_SECS", 900)?,
            tea_config: env.path("HOME").map(|h| h.join(".config/tea/config.yml")),
            user: label.to_string(),
        }))
    }
}

/// The running poller; dropping it (or `shutdown`) stops and joins the thread.
pub struct ForgeHandle {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ForgeHandle {
    /// False once the thread has ended by itself (the token was rejected).
    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Stops and joins the thread, the same as dropping the handle.
    pub fn shutdown(self) {}
}

impl Drop for ForgeHandle {
    fn drop(&mut self) {
        // Dropping the sender wakes the thread's select; an HTTP request in
        // flight ends within its timeout.
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts polling when the token file exists; None when it does not (or the
/// thread cannot start, which is logged).
pub fn start(settings: ForgeSettings) -> Option<ForgeHandle> {
    let token = match std::fs::read_to_string(&settings.token_file) {
        Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
        Ok(_) => {
            log::warn!(
                "{} is empty: forge notifications are off",
                settings.token_file.display()
            );
            return None;
        }
        Err(_) => {
            log::debug!(
                "no {}: forge notifications are off",
                settings.token_file.display()
            );
            return None;
        }
    };
    if let Some(path) = &settings.tea_config {
        match write_tea_config(path, &settings.url, &token, &settings.user) {
            Ok(()) => log::info!("tea login written to {}", path.display()),
            Err(e) => log::warn!("{e}"),
        }
    }
    let (stop_tx, stop_rx) = bounded::<()>(0);
    let poller = Poller::new(settings, token);
    let thread = std::thread::Builder::new()
        .name("forge-notify".into())
        .spawn(move || poller.run(stop_rx));
    match thread {
        Ok(t) => Some(ForgeHandle {
            stop: Some(stop_tx),
            thread: Some(t),
        }),
        Err(e) => {
            log::error!("cannot start the forge-notify thread: {e}");
            None
        }
    }
}

/// YAML double-quoted scalar.
fn yaml_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// Writes `tea`'s config with one default login (mode 0600, parents
/// created), whole: `tea`, or anyone, reads the old file or the new one,
/// never a part (`sys::fs::write_private`).
pub fn write_tea_config(path: &Path, url: &str, token: &str, user: &str) -> Result<(), String> {
    let host = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split(['/', ':']).next())
        .unwrap_or("localhost");
    let text = format!(
        "# Written by hive serve from the agent's forge-token and HIVE_FORGE_URL.\n\
         logins:\n\
         - name: forge\n\
         \x20 url: {}\n\
         \x20 token: {}\n\
         \x20 default: true\n\
         \x20 ssh_host: {}\n\
         \x20 insecure: false\n\
         \x20 user: {}\n\
         preferences:\n\
         \x20 editor: false\n",
        yaml_str(url),
        yaml_str(token),
        yaml_str(host),
        yaml_str(user)
    );
    let fail = |e: std::io::Error| format!("cannot write the tea login {}: {e}", path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(fail)?;
    }
    crate::sys::fs::write_private(path, text.as_bytes()).map_err(fail)
}

/// One notification thread as Forgejo sends it (only what the summary needs).
#[derive(Debug, Deserialize)]
pub struct Thread {
    pub id: i64,
    #[serde(default)]
    pub updated_at: String,
    #[serde(default)]
    pub repository: Option<Repository>,
    #[serde(default)]
    pub subject: Option<Subject>,
}

#[derive(Debug, Deserialize)]
pub struct Repository {
    #[serde(default)]
    pub full_name: String,
}

#[derive(Debug, Deserialize)]
pub struct Subject {
    #[serde(default)]
    pub title: String,
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub html_url: String,
    #[serde(default)]
    pub url: String,
}

/// One line for the agent: `Issue in owner/repo (open): title <url>`.
pub fn summary(t: &Thread) -> String {
    let repo = t
        .repository
        .as_ref()
        .map(|r| r.full_name.as_str())
        .filter(|s| !s.is_empty())
        .unwrap_or("?");
    let line = match &t.subject {
        Some(s) => {
            let kind = if s.kind.is_empty() {
                "Notification"
            } else {
                &s.kind
            };
            let state = if s.state.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.state)
            };
            let link = if s.html_url.is_empty() {
                &s.url
            } else {
                &s.html_url
            };
            format!("{kind} in {repo}{state}: {} {link}", s.title)
        }
        None => format!("Notification {} in {repo}", t.id),
    };
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// What one poll came to.
#[derive(Debug, PartialEq)]
enum Poll {
    Done,
    /// Worth trying again later (5xx, timeout, broker unreachable).
    Retry(String),
    /// The token was refused: polling again cannot help.
    Fatal(String),
}

struct Poller {
    s: ForgeSettings,
    token: String,
    http: ureq::Agent,
    /// `updated_at` of each thread the agent was woken for, so a thread that
    /// could not be marked read is not announced twice.
    woken: HashMap<i64, String>,
}

impl Poller {
    fn new(s: ForgeSettings, token: String) -> Poller {
        let http = ureq::AgentBuilder::new()
            .timeout_connect(s.timeout)
            .timeout_read(s.timeout)
            .timeout_write(s.timeout)
            // A server that trickles bytes still ends within this.
            .timeout(s.timeout)
            .user_agent(concat!("hive/", env!("CARGO_PKG_VERSION")))
            .build();
        Poller {
            s,
            token,
            http,
            woken: HashMap::new(),
        }
    }

    fn run(mut self, stop: Receiver<()>) {
        log::info!(
            "forge notifications: polling {} every {:?}",
            self.s.url,
            self.s.poll
        );
        let mut failures = 0u32;
        loop {
            let wait = match self.poll_once() {
                Poll::Done => {
                    failures = 0;
                    self.s.poll
                }
                Poll::Retry(e) => {
                    failures += 1;
                    let wait = backoff(self.s.poll, self.s.backoff_max, failures);
                    log::warn!("forge notifications: {e}; next try in {wait:?}");
                    wait
                }
                Poll::Fatal(e) => {
                    log::error!("forge notifications stopped: {e}");
                    return;
                }
            };
            select! {
                recv(stop) -> _ => return,
                recv(after(wait)) -> _ => {}
            }
        }
    }

    fn auth(&self) -> String {
        format!("token {}", self.token)
    }

    fn poll_once(&mut self) -> Poll {
        let url = format!("{}/api/v1/notifications", self.s.url);
        let resp = match self
            .http
            .get(&url)
            .set("Authorization", &self.auth())
            .set("Accept", "application/json")
            .call()
        {
            Ok(r) => r,
            Err(e) => return classify(&url, e),
        };
        let mut body = Vec::new();
        if let Err(e) = resp.into_reader().take(MAX_BODY + 1).read_to_end(&mut body) {
            return Poll::Retry(format!("GET {url}: reading the answer: {e}"));
        }
        if body.len() as u64 > MAX_BODY {
            return Poll::Retry(format!("GET {url}: answer larger than {MAX_BODY} bytes"));
        }
        let threads: Vec<Thread> = match serde_json::from_slice(&body) {
            Ok(t) => t,
            Err(e) => return Poll::Retry(format!("GET {url}: not a notification list: {e}")),
        };
        // Threads no longer listed were read; forget them.
        self.woken
            .retain(|id, _| threads.iter().any(|t| t.id == *id));
        for t in &threads {
            if self.woken.get(&t.id) != Some(&t.updated_at) {
                if let Err(e) = self.wake(t) {
                    return Poll::Retry(e);
                }
                self.woken.insert(t.id, t.updated_at.clone());
            }
            if let Some(p) = self.mark_read(t.id) {
                return p;
            }
        }
        Poll::Done
    }

    fn wake(&self, t: &Thread) -> Result<(), String> {
        let mut c = self
            .s
            .broker
            .connect()
            .map_err(|e| format!("cannot reach the broker to wake the agent: {e}"))?;
        c.set_read_timeout(Some(WAKE_TIMEOUT))
            .map_err(|e| format!("broker socket: {e}"))?;
        let body = summary(t);
        match c.call(&Wake {
            from: "forge".into(),
            body: body.clone(),
            transient: false,
            to: None,
            traceparent: None,
        }) {
            Ok(_) => {
                log::info!("forge: woke the agent: {body}");
                Ok(())
            }
            Err(ClientError::Refused(e)) => {
                // Retrying a refused wake would refuse again; drop it.
                log::error!("the broker refused the forge wake {body:?}: {e}");
                Ok(())
            }
            Err(e) => Err(format!("waking the agent: {e}")),
        }
    }

    /// Marks one thread read; Some when the poll should end with that result.
    fn mark_read(&self, id: i64) -> Option<Poll> {
        let url = format!("{}/api/v1/notifications/threads/{id}", self.s.url);
        match self
            .http
            .request("PATCH", &url)
            .set("Authorization", &self.auth())
            .call()
        {
            Ok(_) => None,
            // The wake was sent and remembered, so the next poll only retries this.
            Err(e) => Some(classify(&url, e)),
        }
    }
}

fn classify(url: &str, e: ureq::Error) -> Poll {
    match e {
        ureq::Error::Status(code @ (401 | 403), _) => Poll::Fatal(format!(
            "{url} answered {code}: the forge token was refused; \
             put a valid token in the forge-token file and restart hive serve"
        )),
        ureq::Error::Status(code, _) => Poll::Retry(format!("{url} answered {code}")),
        ureq::Error::Transport(t) => Poll::Retry(format!("{url}: {t}")),
    }
}

/// The pause after `failures` failed polls in a row: the poll interval doubled
/// per failure, at most `max` (but never less than the interval).
fn backoff(poll: Duration, max: Duration, failures: u32) -> Duration {
    let factor = 1u32 << failures.min(16);
    poll.saturating_mul(factor).min(max.max(poll))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_one_line() {
        let t: Thread = serde_json::from_str(
            r#"{"id":3,"updated_at":"x","repository":{"full_name":"ana/hive"},
                "subject":{"title":"Fix\nthe  build","type":"Pull","state":"open",
                "html_url":"http://f/ana/hive/pulls/4"}}"#,
        )
        .unwrap();
        assert_eq!(
            summary(&t),
            "Pull in ana/hive (open): Fix the build http://f/ana/hive/pulls/4"
        );
        let bare: Thread = serde_json::from_str(r#"{"id":9}"#).unwrap();
        assert_eq!(summary(&bare), "Notification 9 in ?");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let s = Duration::from_secs;
        assert_eq!(backoff(s(60), s(900), 1), s(120));
        assert_eq!(backoff(s(60), s(900), 3), s(480));
        assert_eq!(backoff(s(60), s(900), 40), s(900));
        assert_eq!(backoff(s(60), s(10), 2), s(60));
    }

    #[test]
    fn tea_config_holds_url_token_and_user() {
        let dir = std::env::temp_dir().join(format!("hv-tea-{}", std::process::id()));
        let path = dir.join("tea/config.yml");
        write_tea_config(&path, "https://forge.example:3000", "t\"k", "ana").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("url: \"https://forge.example:3000\""),
            "{text}"
        );
        assert!(text.contains("token: \"t\\\"k\""), "{text}");
        assert!(text.contains("ssh_host: \"forge.example\""), "{text}");
        assert!(text.contains("user: \"ana\""), "{text}");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let _ = std::fs::remove_dir_all(dir);
    }
}
