//! A real Matrix homeserver for integration tests: Synapse
//! [`SYNAPSE_VERSION`] from a venv cached outside the repository
//! ([`venv_dir`]; `.ci/run` installs it), started on 127.0.0.1 on a free port
//! with SQLite in a temp dir, relaxed rate limits and no sync response cache.
//! Users are registered by shared secret (the HMAC is computed here), rooms are
//! created invite-only and members joined. The homeserver is killed on drop
//! (and by the kernel if the test thread that started it dies first); `kill9`
//! and `restart` keep its data and port, for crash tests. Without the venv a
//! test skips with a loud line, or fails under `HIVE_REQUIRE_REAL_CLAUDE=1`.
//! [`Synapse::swarm`] sets up a swarm's room for the bridges of several hives,
//! as `docs/swarm.md` tells an operator to. `docs/testing.md` describes the
//! kit.

use super::hive::TempDir;
use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The Synapse release the kit installs and the tests were written against.
pub const SYNAPSE_VERSION: &str = "1.163.2";

/// The homeserver's name: user ids are `@name:hive.test`.
pub const SERVER_NAME: &str = "hive.test";

/// Set to a venv directory to use it instead of [`venv_dir`]'s default.
pub const VENV_ENV: &str = "HIVE_SYNAPSE_VENV";

/// Same flag as the real-CLI kit: a missing homeserver fails instead of skipping.
const REQUIRE_ENV: &str = "HIVE_REQUIRE_REAL_CLAUDE";

const SHARED_SECRET: &str = "hive-test-shared-secret";

/// A fixed ed25519 seed: the homeserver never federates, and writing the key
/// saves a second Python start (`--generate-keys`).
const SIGNING_KEY: &str = "ed25519 a_hive BwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSY";

/// How long one kit request to the homeserver may take.
const T: Duration = Duration::from_secs(30);

/// How long Synapse may take to answer after it is started.
const START_TIMEOUT: Duration = Duration::from_secs(90);

/// The venv with Synapse: `$HIVE_SYNAPSE_VENV`, else
/// `$HOME/.cache/hive-synapse/venv`.
pub fn venv_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(VENV_ENV) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home).join(".cache/hive-synapse/venv")
}

/// What `.ci/run` runs to install the pinned Synapse into [`venv_dir`].
pub fn install_command() -> String {
    let venv = venv_dir();
    let venv = venv.display();
    format!(
        "apt-get install -y python3-venv && /usr/bin/python3 -m venv {venv} && \
         {venv}/bin/pip install matrix-synapse=={SYNAPSE_VERSION}"
    )
}

/// The venv's python when it has the pinned Synapse, or why not. Looked up
/// once per test binary, without starting Python.
fn find_synapse() -> &'static Result<PathBuf, String> {
    static FOUND: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    FOUND.get_or_init(|| {
        let venv = venv_dir();
        let python = venv.join("bin/python");
        if !python.is_file() {
            return Err(format!("no venv at {}", venv.display()));
        }
        let dist_info = format!("matrix_synapse-{SYNAPSE_VERSION}.dist-info");
        let installed = std::fs::read_dir(venv.join("lib"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|lib| lib.path().join("site-packages").join(&dist_info).is_dir());
        if !installed {
            return Err(format!(
                "{} has no matrix-synapse {SYNAPSE_VERSION}",
                venv.display()
            ));
        }
        Ok(python)
    })
}

/// The venv's python for a test that needs Synapse. Without it the test
/// should return early: this prints a loud SKIPPED line, or panics when
/// `HIVE_REQUIRE_REAL_CLAUDE=1`.
pub fn require_synapse() -> Option<PathBuf> {
    match find_synapse() {
        Ok(python) => Some(python.clone()),
        Err(reason) if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") => panic!(
            "{REQUIRE_ENV}=1 but Synapse {SYNAPSE_VERSION} is not installed ({reason}); \
             install it with: {}",
            install_command()
        ),
        Err(reason) => {
            // Straight to the stderr handle, past the harness's capture.
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: Synapse {SYNAPSE_VERSION} not installed ({reason}) (run: {})",
                install_command()
            );
            None
        }
    }
}

/// A registered user, with the access token of its registration (a device of
/// its own, not the bridge's fixed one).
#[derive(Debug, Clone)]
pub struct User {
    pub user_id: String,
    pub localpart: String,
    pub password: String,
    pub access_token: String,
}

/// A running Synapse on its own temp dir.
pub struct Synapse {
    python: PathBuf,
    port: u16,
    child: Option<Child>,
    admin: OnceLock<User>,
    http: ureq::Agent,
    // Last, so the process is gone before its files are removed.
    dir: TempDir,
}

impl Synapse {
    /// Starts a fresh homeserver, or returns None after a SKIPPED line when
    /// Synapse is not installed (see [`require_synapse`]).
    pub fn start() -> Option<Synapse> {
        let python = require_synapse()?;
        // Another process can take the free port between the probe and
        // Synapse's bind: try a new port then.
        for attempt in 1..=3 {
            let mut hs = Synapse {
                python: python.clone(),
                port: free_port(),
                child: None,
                admin: OnceLock::new(),
                http: ureq::AgentBuilder::new().timeout(T).build(),
                dir: TempDir::new("hs"),
            };
            hs.write_config();
            match hs.spawn() {
                Ok(()) => return Some(hs),
                Err(log) if attempt < 3 && log.contains("Address already in use") => continue,
                Err(log) => panic!("Synapse did not start:\n{}", tail(&log, 60)),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// The client-server API base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Synapse's log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("synapse.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("Synapse is running").id()
    }

    /// SIGKILL, as a crash would; the data stays for [`Synapse::restart`].
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and a wait for a clean exit (SIGKILL after 20 s).
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: kill(2) on the pid of a child not yet reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let exited = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            matches!(child.try_wait(), Ok(Some(_)))
        });
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts Synapse again on the same data and port (killing it first if it
    /// runs), and waits until it answers.
    pub fn restart(&mut self) {
        self.kill9();
        if let Err(log) = self.spawn() {
            panic!("Synapse did not restart:\n{}", tail(&log, 60));
        }
    }

    /// Registers `localpart` with `password` by shared secret.
    pub fn register(&self, localpart: &str, password: &str) -> User {
        self.register_as(localpart, password, false)
    }

    /// Creates an invite-only room owned by `owner` that invites `invite`,
    /// with the alias `#alias:hive.test` when given; returns its id.
    pub fn create_room(&self, owner: &User, alias: Option<&str>, invite: &[&User]) -> String {
        let mut body = json!({
            "preset": "private_chat",
            "visibility": "private",
            "name": "hive swarm",
            "invite": invite.iter().map(|u| u.user_id.as_str()).collect::<Vec<_>>(),
        });
        if let Some(alias) = alias {
            body["room_alias_name"] = json!(alias);
        }
        let answer = self.post("/_matrix/client/v3/createRoom", Some(owner), &body);
        answer["room_id"]
            .as_str()
            .unwrap_or_else(|| panic!("createRoom answered no room_id: {answer}"))
            .to_string()
    }

    /// `user` joins `room` (an id or an alias) with its registration token.
    pub fn join(&self, user: &User, room: &str) {
        let path = format!("/_matrix/client/v3/join/{}", encode(room));
        self.post(&path, Some(user), &json!({}));
    }

    /// `user` invites `invitee` to `room_id`.
    pub fn invite(&self, user: &User, room_id: &str, invitee: &User) {
        let path = format!("/_matrix/client/v3/rooms/{}/invite", encode(room_id));
        self.post(&path, Some(user), &json!({ "user_id": invitee.user_id }));
    }

    /// Sets `user_id`'s own message rate limit (Synapse's admin API; whole
    /// messages per second), for a test of 429 handling.
    pub fn set_message_rate_limit(&self, user_id: &str, per_second: u32, burst: u32) {
        let admin = self
            .admin
            .get_or_init(|| self.register_as("hive-test-admin", "admin-password", true));
        let path = format!(
            "/_synapse/admin/v1/users/{}/override_ratelimit",
            encode(user_id)
        );
        self.post(
            &path,
            Some(admin),
            &json!({ "messages_per_second": per_second, "burst_count": burst }),
        );
    }

    fn register_as(&self, localpart: &str, password: &str, admin: bool) -> User {
        let url = format!("{}/_synapse/admin/v1/register", self.url());
        let nonce: Value = match self.http.get(&url).call() {
            Ok(resp) => resp
                .into_json()
                .unwrap_or_else(|e| panic!("GET {url}: unreadable answer: {e}")),
            Err(e) => panic!("GET {url}: {e}"),
        };
        let nonce = nonce["nonce"].as_str().expect("a registration nonce");
        let role = if admin { "admin" } else { "notadmin" };
        let message = [nonce, localpart, password, role].join("\0");
        let mac = hex(&hmac_sha1(SHARED_SECRET.as_bytes(), message.as_bytes()));
        let answer = self.post(
            "/_synapse/admin/v1/register",
            None,
            &json!({
                "nonce": nonce, "username": localpart, "password": password,
                "admin": admin, "mac": mac,
            }),
        );
        User {
            user_id: answer["user_id"].as_str().expect("user_id").to_string(),
            localpart: localpart.to_string(),
            password: password.to_string(),
            access_token: answer["access_token"]
                .as_str()
                .expect("access_token")
                .to_string(),
        }
    }

    /// `user` sets `room_id`'s topic: a state event, which a filter for
    /// `m.room.message` leaves out.
    pub fn set_room_topic(&self, user: &User, room_id: &str, topic: &str) {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/state/m.room.topic/",
            encode(room_id)
        );
        let token = Some(user.access_token.as_str());
        self.request("PUT", &path, token, &json!({ "topic": topic }));
    }

    /// Revokes `access_token` (`POST /logout` with it), as an operator
    /// removing a device would.
    pub fn logout(&self, access_token: &str) {
        self.request(
            "POST",
            "/_matrix/client/v3/logout",
            Some(access_token),
            &json!({}),
        );
    }

    fn post(&self, path: &str, user: Option<&User>, body: &Value) -> Value {
        let token = user.map(|u| u.access_token.as_str());
        self.request("POST", path, token, body)
    }

    /// Sends `body` (with `access_token`, if given) and returns the JSON
    /// answer; any failure panics with the homeserver's answer.
    fn request(&self, method: &str, path: &str, access_token: Option<&str>, body: &Value) -> Value {
        let mut req = self.http.request(method, &format!("{}{path}", self.url()));
        if let Some(token) = access_token {
            req = req.set("Authorization", &format!("Bearer {token}"));
        }
        match req.send_json(body) {
            Ok(resp) => resp
                .into_json()
                .unwrap_or_else(|e| panic!("{method} {path}: unreadable answer: {e}")),
            Err(ureq::Error::Status(code, resp)) => panic!(
                "{method} {path} answered {code}: {}",
                resp.into_string().unwrap_or_default()
            ),
            Err(e) => panic!("{method} {path}: {e}"),
        }
    }

    fn write_config(&self) {
        let d = self.dir.path().display();
        let port = self.port;
        // Every rc_* key below exists in Synapse 1.163 (unknown keys are
        // ignored silently); the defaults would answer 429 within a test.
        let relaxed = "{per_second: 10000, burst_count: 100000}";
        let yaml = format!(
            r#"server_name: "{SERVER_NAME}"
public_baseurl: "http://127.0.0.1:{port}/"
listeners:
  - port: {port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: {d}/homeserver.db
media_store_path: {d}/media_store
signing_key_path: {d}/signing.key
report_stats: false
trusted_key_servers: []
suppress_key_server_warning: true
registration_shared_secret: "{SHARED_SECRET}"
macaroon_secret_key: "hive-test-macaroon-secret"
form_secret: "hive-test-form-secret"
enable_registration: false
bcrypt_rounds: 4
presence:
  enabled: false
enable_metrics: false
caches:
  sync_response_cache_duration: 0
rc_message: {relaxed}
rc_registration: {relaxed}
rc_login:
  address: {relaxed}
  account: {relaxed}
  failed_attempts: {relaxed}
rc_joins:
  local: {relaxed}
  remote: {relaxed}
rc_joins_per_room: {relaxed}
rc_invites:
  per_room: {relaxed}
  per_user: {relaxed}
  per_issuer: {relaxed}
rc_room_creation: {relaxed}
"#
        );
        std::fs::write(self.dir.path().join("homeserver.yaml"), yaml)
            .expect("write homeserver.yaml");
        std::fs::write(
            self.dir.path().join("signing.key"),
            format!("{SIGNING_KEY}\n"),
        )
        .expect("write the signing key");
    }

    /// Starts the process and waits until it answers; Err holds the log when
    /// it exits or does not answer in time.
    fn spawn(&mut self) -> Result<(), String> {
        let log_path = self.dir.path().join("synapse.log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open synapse.log");
        let mut cmd = Command::new(&self.python);
        cmd.args(["-m", "synapse.app.homeserver", "-c"])
            .arg(self.dir.path().join("homeserver.yaml"))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone the log handle"))
            .stderr(log);
        let parent = std::process::id();
        // SAFETY: prctl and getppid are async-signal-safe. The homeserver dies
        // with the thread that started it, so a killed test binary leaves no
        // Synapse behind: start and restart it from the test's own thread.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::other("the test process is gone"));
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.python.display()));
        self.child = Some(child);
        let versions = format!("{}/_matrix/client/versions", self.url());
        let probe = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(2))
            .build();
        let ready = std::time::Instant::now() + START_TIMEOUT;
        loop {
            if probe.get(&versions).call().is_ok() {
                return Ok(());
            }
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                return Err(format!("Synapse exited with {status}:\n{}", self.log()));
            }
            if std::time::Instant::now() > ready {
                self.kill9();
                return Err(format!(
                    "Synapse did not answer within {START_TIMEOUT:?}:\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A swarm's room on a test homeserver: one bridge user per hive, with its
/// password in a file, all invited to the invite-only `#swarm:hive.test`.
#[derive(Debug, Clone)]
pub struct SwarmRoom {
    pub url: String,
    pub room_id: String,
    pub owner: User,
    /// (hive, its bridge user, its password file)
    pub bridges: Vec<(String, User, PathBuf)>,
}

impl SwarmRoom {
    /// The bridge user of `hive`.
    pub fn bridge(&self, hive: &str) -> &User {
        &self
            .bridges
            .iter()
            .find(|(h, ..)| h == hive)
            .expect("a hive of the swarm")
            .1
    }

    /// The fleet file's `matrix` section for `hive`: the room by alias, the
    /// other hives as peers.
    pub fn matrix_section(&self, hive: &str) -> Value {
        let (_, user, pw) = self
            .bridges
            .iter()
            .find(|(h, ..)| h == hive)
            .expect("a hive");
        let peers: serde_json::Map<String, Value> = self
            .bridges
            .iter()
            .filter(|(h, ..)| h != hive)
            .map(|(h, u, _)| (h.clone(), json!(u.user_id)))
            .collect();
        json!({
            "homeserver": self.url,
            "user_id": user.user_id,
            "password_file": pw,
            "room": format!("#swarm:{SERVER_NAME}"),
            "peers": peers,
        })
    }
}

impl Synapse {
    /// Registers `hive-NAME-bridge` for each hive (password files in `dir`)
    /// and creates `#swarm:hive.test`, owned by `swarm-owner`, inviting them.
    pub fn swarm(&self, hives: &[&str], dir: &Path) -> SwarmRoom {
        let owner = self.register("swarm-owner", "owner-password");
        let mut bridges = Vec::new();
        for h in hives {
            let password = format!("pw-{h}");
            let user = self.register(&format!("hive-{h}-bridge"), &password);
            let file = dir.join(format!("{h}-matrix-password"));
            std::fs::write(&file, format!("{password}\n")).expect("write a password file");
            bridges.push((h.to_string(), user, file));
        }
        let invited: Vec<&User> = bridges.iter().map(|(_, u, _)| u).collect();
        let room_id = self.create_room(&owner, Some("swarm"), &invited);
        SwarmRoom {
            url: self.url(),
            room_id,
            owner,
            bridges,
        }
    }

    /// `user` sends an `m.room.message` with `content` to `room_id` (a room
    /// member writing whatever it likes, e.g. a forged swarm event).
    pub fn send_as(&self, user: &User, room_id: &str, txn: &str, content: &Value) -> String {
        let path = format!(
            "/_matrix/client/v3/rooms/{}/send/m.room.message/{}",
            encode(room_id),
            encode(txn)
        );
        let answer = self.request("PUT", &path, Some(&user.access_token), content);
        answer["event_id"].as_str().unwrap_or_default().to_string()
    }
}

impl Synapse {
    /// The last `limit` `m.room.message` events of `room_id` as `user` sees
    /// them, oldest first (whole events, content included).
    pub fn room_messages(&self, user: &User, room_id: &str, limit: u32) -> Vec<Value> {
        let url = format!(
            "{}/_matrix/client/v3/rooms/{}/messages?dir=b&limit={limit}",
            self.url(),
            encode(room_id)
        );
        let answer: Value = match self
            .http
            .get(&url)
            .set("Authorization", &format!("Bearer {}", user.access_token))
            .call()
        {
            Ok(r) => r.into_json().expect("a JSON answer"),
            Err(e) => panic!("GET {url}: {e}"),
        };
        let mut events: Vec<Value> = answer["chunk"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|e| e["type"] == "m.room.message")
            .collect();
        events.reverse();
        events
    }
}

impl Drop for Synapse {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Percent-encodes a path segment.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// HMAC-SHA1 (RFC 2104), which Synapse's shared-secret registration asks for.
fn hmac_sha1(key: &[u8], message: &[u8]) -> [u8; 20] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..20].copy_from_slice(&sha1(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner: Vec<u8> = block.iter().map(|b| b ^ 0x36).collect();
    inner.extend_from_slice(message);
    let mut outer: Vec<u8> = block.iter().map(|b| b ^ 0x5c).collect();
    outer.extend_from_slice(&sha1(&inner));
    sha1(&outer)
}

/// SHA-1 (FIPS 180-4), for the registration HMAC only.
fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0];
    let mut padded = data.to_vec();
    padded.push(0x80);
    while padded.len() % 64 != 56 {
        padded.push(0);
    }
    padded.extend_from_slice(&((data.len() as u64) * 8).to_be_bytes());
    for chunk in padded.chunks(64) {
        let mut w = [0u32; 80];
        for (i, word) in chunk.chunks(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A827999),
                20..=39 => (b ^ c ^ d, 0x6ED9EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1BBCDC),
                _ => (b ^ c ^ d, 0xCA62C1D6),
            };
            let t = a
                .rotate_left(5)
                .wrapping_add(f)
                .wrapping_add(e)
                .wrapping_add(k)
                .wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

/// The `sh` block of `docs/swarm.md` that holds `needle`, its `\`-continued
/// lines joined: the deploy steps the kit runs as shown.
pub fn documented_command(needle: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/swarm.md");
    let doc = std::fs::read_to_string(&path).expect("docs/swarm.md");
    let mut blocks = doc.split("```sh\n").skip(1).map(|b| {
        b.split("```")
            .next()
            .unwrap_or_default()
            .replace("\\\n", " ")
    });
    blocks
        .find(|b| b.contains(needle))
        .unwrap_or_else(|| panic!("docs/swarm.md shows no command with {needle:?}"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The JSON a documented `curl … -d '{…}'` sends, its example server renamed
/// to the kit's.
fn documented_body(command: &str) -> Value {
    let body = command
        .split(" -d '")
        .nth(1)
        .and_then(|b| b.split('\'').next())
        .unwrap_or_else(|| panic!("no -d '…' in {command}"));
    serde_json::from_str(&body.replace("example.org", SERVER_NAME))
        .unwrap_or_else(|e| panic!("the body of {command}: {e}"))
}

impl Synapse {
    /// The swarm of [`Synapse::swarm`], made by the deploy steps of
    /// `docs/swarm.md` as they are shown there: each bridge user registered
    /// by `register_new_matrix_user` (run from the venv, its password read
    /// from its file), the room created with the documented `createRoom`
    /// body, and each bridge's message rate limit lifted with the documented
    /// `override_ratelimit` body.
    pub fn swarm_as_documented(&self, hives: &[&str], dir: &Path) -> SwarmRoom {
        let register = documented_command("register_new_matrix_user");
        let bin = self
            .python
            .parent()
            .expect("the venv's bin dir")
            .to_path_buf();
        let mut bridges = Vec::new();
        for h in hives {
            let password = format!("pw-{h}");
            let file = dir.join(format!("{h}-matrix-password"));
            std::fs::write(&file, format!("{password}\n")).expect("write a password file");
            let cmd = register
                .replace("venv/bin/", &format!("{}/", bin.display()))
                .replace("hive-one-bridge", &format!("hive-{h}-bridge"))
                .replace("/etc/hyperhive/matrix-password", &file.to_string_lossy())
                .replace("https://matrix.example.org", &self.url());
            let out = std::process::Command::new("sh")
                .args(["-c", &cmd])
                .env("SHARED_SECRET", SHARED_SECRET)
                .stdin(std::process::Stdio::null())
                .output()
                .expect("run sh");
            assert!(
                out.status.success(),
                "{cmd}: {}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let answer = self.post(
                "/_matrix/client/v3/login",
                None,
                &json!({"type": "m.login.password", "password": password,
                        "identifier": {"type": "m.id.user", "user": format!("hive-{h}-bridge")}}),
            );
            let user = User {
                user_id: answer["user_id"].as_str().expect("user_id").to_string(),
                localpart: format!("hive-{h}-bridge"),
                password,
                access_token: answer["access_token"]
                    .as_str()
                    .expect("access_token")
                    .to_string(),
            };
            bridges.push((h.to_string(), user, file));
        }
        let owner = self.register("swarm-owner", "owner-password");
        let room = documented_body(&documented_command("/createRoom"));
        let invited: Vec<&str> = bridges.iter().map(|(_, u, _)| u.user_id.as_str()).collect();
        assert_eq!(
            room["invite"],
            json!(invited),
            "the documented room invites these"
        );
        let answer = self.post("/_matrix/client/v3/createRoom", Some(&owner), &room);
        let room_id = answer["room_id"]
            .as_str()
            .unwrap_or_else(|| panic!("createRoom answered no room_id: {answer}"))
            .to_string();
        let limits = documented_body(&documented_command("override_ratelimit"));
        let admin = self
            .admin
            .get_or_init(|| self.register_as("hive-test-admin", "admin-password", true));
        for (_, u, _) in &bridges {
            let path = format!(
                "/_synapse/admin/v1/users/{}/override_ratelimit",
                encode(&u.user_id)
            );
            self.post(&path, Some(admin), &limits);
        }
        SwarmRoom {
            url: self.url(),
            room_id,
            owner,
            bridges,
        }
    }
}
