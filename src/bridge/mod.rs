//! `hive matrix-bridge`: the process that joins a hive to its swarm through a
//! Matrix homeserver (`docs/swarm.md`). It talks to its broker only over the
//! broker's bridge socket (`RUN/bridge.sock`, where only the `bridge_*`
//! commands are accepted) and to the homeserver only over the client-server
//! API (`crate::matrix`). This module is its composition root: it asks the
//! broker who the hive is (`bridge_hello`: its name, the `matrix` section, the
//! broker's instance id and the stored sync token), logs in on the fixed
//! device and joins the rooms (retrying with a capped backoff while the
//! homeserver is away), then runs three threads, each with its own broker
//! connection: `bridge-send` (the outbox, `outbound.rs`), `bridge-sync` (the
//! one `/sync` long-poll, `inbound.rs`) and `bridge-status` (the link's state
//! for the operator, `status.rs`). Main waits for a signal or a fatal login
//! error (exit 2). Every step is idempotent, so a stop at any moment loses
//! nothing: main does not wait for a long-poll in flight.

pub mod broker;
pub mod event;
pub mod inbound;
pub mod login;
pub mod outbound;
pub mod status;

use crate::matrix::{Backoff, Client, Error, RoomFilter};
use crate::proto::cmd::{BridgeHello, BridgeHelloReply};
use crate::proto::ClientError;
use crate::sys::env::Env;
use crossbeam_channel::{select, Receiver};
use event::Room;
use login::{is_fatal, Login};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the bridge waits at start for its broker's socket.
const BROKER_START_WAIT: Duration = Duration::from_secs(30);

/// The bridge's settings: its flags and the `HIVE_BRIDGE_*` variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeSettings {
    /// The broker's bridge socket.
    pub socket: PathBuf,
    /// Where the access token is kept (0700).
    pub state_dir: PathBuf,
    /// How long one `/sync` long-poll waits (`HIVE_BRIDGE_SYNC_TIMEOUT_MS`).
    pub sync_timeout: Duration,
    /// The sync filter's timeline limit (`HIVE_BRIDGE_TIMELINE_LIMIT`);
    /// homeservers cap it (Synapse at 100), a longer gap is paged back.
    pub timeline_limit: u32,
    /// The first pause after a failure and the cap of the doubling
    /// (`HIVE_BRIDGE_BACKOFF_MS`, `HIVE_BRIDGE_BACKOFF_MAX_MS`).
    pub backoff_first: Duration,
    pub backoff_max: Duration,
    /// One request's timeout, connecting included (a sync gets its
    /// long-poll on top): `HIVE_BRIDGE_REQUEST_TIMEOUT_MS`.
    pub request_timeout: Duration,
}

impl BridgeSettings {
    /// The settings for `socket` and `state_dir`, from `env`.
    pub fn read(socket: PathBuf, state_dir: PathBuf, env: &Env) -> Result<BridgeSettings, String> {
        let limit = env.num("HIVE_BRIDGE_TIMELINE_LIMIT", 100)?;
        if !(1..=1000).contains(&limit) {
            return Err(Env::bad(
                "HIVE_BRIDGE_TIMELINE_LIMIT",
                &limit.to_string(),
                "a number of events from 1 to 1000",
            ));
        }
        Ok(BridgeSettings {
            socket,
            state_dir,
            sync_timeout: env.millis("HIVE_BRIDGE_SYNC_TIMEOUT_MS", 30_000)?,
            timeline_limit: limit as u32,
            backoff_first: env.millis("HIVE_BRIDGE_BACKOFF_MS", 500)?,
            backoff_max: env.millis("HIVE_BRIDGE_BACKOFF_MAX_MS", 60_000)?,
            request_timeout: env.millis("HIVE_BRIDGE_REQUEST_TIMEOUT_MS", 30_000)?,
        })
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(self.backoff_first, self.backoff_max)
    }
}

/// Why the bridge stopped with an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BridgeError {
    /// The Matrix login, a secret file or the configuration is wrong: the
    /// operator must fix it (exit status 2).
    Fatal(String),
    /// Anything else: no broker, no threads (exit status 1).
    Run(String),
}

/// Creates `dir` (and its parents) private to this user.
pub(crate) fn private_dir(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir)
        .and_then(|_| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)))
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))
}

/// Runs the bridge until a signal (Ok) or a fatal error.
pub fn run(s: BridgeSettings) -> Result<(), BridgeError> {
    let signals = crate::sys::signals().map_err(BridgeError::Run)?;
    private_dir(&s.state_dir).map_err(BridgeError::Run)?;
    let mut hello_conn = broker::Broker::new(s.socket.clone());
    let Some(hello) = hello_at_start(&mut hello_conn, &s.socket, &signals)? else {
        return Ok(());
    };
    drop(hello_conn);
    let (sync_status, send_status) = status::start(s.socket.clone()).map_err(BridgeError::Run)?;
    let login = Login::new(
        &hello.matrix,
        &hello.hive_name,
        &s.state_dir,
        s.request_timeout,
    );
    // Log in and join, retrying while the homeserver is away.
    let mut backoff = s.backoff();
    let (client, rooms) = loop {
        match connect(&login, &hello) {
            Ok(c) => break c,
            Err(e) if is_fatal(&e) => return Err(BridgeError::Fatal(e.message)),
            Err(e) => {
                let wait = backoff.delay(&e).unwrap_or(s.backoff_max);
                log::warn!("{e}; trying again in {wait:?}");
                sync_status.backing_off(e.message.clone());
                if stopped(&signals, wait) {
                    return Ok(());
                }
            }
        }
    };
    let room = rooms[0].0.clone();
    let operator_room = rooms
        .iter()
        .find(|(_, r)| *r == Room::Operators)
        .map(|(id, _)| id.clone());
    let ids: Vec<&str> = rooms.iter().map(|(id, _)| id.as_str()).collect();
    let filter = RoomFilter::in_rooms(&ids, &["m.room.message"], s.timeline_limit);
    eprintln!(
        "hive matrix-bridge: hive {} in room {room} as {} on {}",
        hello.hive_name,
        client.session().map_or("?", |x| x.user_id.as_str()),
        client.homeserver()
    );
    let (fatal_tx, fatal_rx) = crossbeam_channel::unbounded::<Error>();
    let send = outbound::Outbox {
        broker: broker::Broker::new(s.socket.clone()),
        client: client.clone(),
        login: login.clone(),
        instance: hello.instance.clone(),
        room,
        operator_room,
        status: send_status,
        backoff: s.backoff(),
        max_pause: s.backoff_max,
    };
    let sync = inbound::Sync {
        broker: broker::Broker::new(s.socket.clone()),
        client,
        login,
        hive: hello.hive_name.clone(),
        matrix: hello.matrix.clone(),
        rooms,
        filter,
        since: hello.next_batch.clone(),
        timeout: s.sync_timeout,
        status: sync_status,
        backoff: s.backoff(),
        max_pause: s.backoff_max,
    };
    for (name, job) in [
        (
            "bridge-send",
            Box::new(move || send.run()) as Box<dyn FnOnce() -> Error + Send>,
        ),
        ("bridge-sync", Box::new(move || sync.run())),
    ] {
        let tx = fatal_tx.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _ = tx.send(job());
            })
            .map_err(|e| BridgeError::Run(format!("cannot start the {name} thread: {e}")))?;
    }
    select! {
        recv(signals) -> _ => {
            log::info!("stopping the bridge");
            Ok(())
        }
        recv(fatal_rx) -> e => match e {
            Ok(e) => Err(BridgeError::Fatal(e.message)),
            Err(_) => Err(BridgeError::Run("the bridge's threads ended".into())),
        },
    }
}

/// `bridge_hello`, waiting a while for the broker to come up; None when a
/// signal came first.
fn hello_at_start(
    conn: &mut broker::Broker,
    socket: &Path,
    signals: &Receiver<i32>,
) -> Result<Option<BridgeHelloReply>, BridgeError> {
    let end = Instant::now() + BROKER_START_WAIT;
    loop {
        match conn.call_once(&BridgeHello {}) {
            Ok(h) => return Ok(Some(h)),
            Err(ClientError::Refused(e)) => {
                return Err(BridgeError::Fatal(format!(
                    "the broker on {} refused the bridge: {e}",
                    socket.display()
                )))
            }
            Err(e) if Instant::now() > end => {
                return Err(BridgeError::Run(format!(
                    "{e} (a broker serves the bridge's socket only for a hive whose fleet \
                     file has a matrix section)"
                )))
            }
            Err(_) => {
                if stopped(signals, Duration::from_millis(200)) {
                    return Ok(None);
                }
            }
        }
    }
}

/// Sleeps `wait`, or less when a signal comes: then true.
fn stopped(signals: &Receiver<i32>, wait: Duration) -> bool {
    !matches!(
        signals.recv_timeout(wait),
        Err(crossbeam_channel::RecvTimeoutError::Timeout)
    )
}

/// Logs in and joins the swarm's room (first) and the operator room.
fn connect(
    login: &Login,
    hello: &BridgeHelloReply,
) -> Result<(Client, Vec<(String, Room)>), Error> {
    let client = login.client()?;
    let mut rooms = vec![(
        client
            .join(&hello.matrix.room)
            .map_err(|e| e.context(format_args!("joining {}", hello.matrix.room)))?,
        Room::Swarm,
    )];
    if let Some(ops) = &hello.matrix.operator_room {
        let id = client
            .join(ops)
            .map_err(|e| e.context(format_args!("joining the operator room {ops}")))?;
        rooms.push((id, Room::Operators));
    }
    Ok((client, rooms))
}
