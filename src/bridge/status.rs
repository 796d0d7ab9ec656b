//! The `bridge-status` thread: tells the broker how the bridge's link to the
//! homeserver is, for `hive agents` and the dashboard. The sync and send
//! threads each report their own side ([`Side`]); the link is backing off when
//! either side is, connected when either got through, connecting before that.
//! A change is reported at once, and the state again every
//! [`HEARTBEAT`] (so a broker that restarted hears it soon, and the
//! connection never idles out while both sides wait on the homeserver).

use super::broker::Broker;
use crate::proto::cmd::BridgeStatus;
use crate::proto::swarm::BridgeState;
use crossbeam_channel::{select, tick, Receiver, Sender};
use std::path::PathBuf;
use std::time::Duration;

/// How often the state is reported again without a change.
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// Which thread reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Sync,
    Send,
}

/// One side's news.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Link {
    /// The last request to the homeserver succeeded.
    Up,
    /// Retrying after this error.
    BackingOff(String),
}

/// A report to the status thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub side: Side,
    pub link: Link,
}

/// The sending end, one per reporting thread.
#[derive(Debug, Clone)]
pub struct Reporter {
    side: Side,
    tx: Sender<Report>,
}

impl Reporter {
    pub fn up(&self) {
        let _ = self.tx.send(Report {
            side: self.side,
            link: Link::Up,
        });
    }

    pub fn backing_off(&self, why: impl Into<String>) {
        let _ = self.tx.send(Report {
            side: self.side,
            link: Link::BackingOff(why.into()),
        });
    }
}

/// What both sides last said.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Sides {
    sync: Option<Link>,
    send: Option<Link>,
}

impl Sides {
    fn set(&mut self, r: Report) {
        match r.side {
            Side::Sync => self.sync = Some(r.link),
            Side::Send => self.send = Some(r.link),
        }
    }

    /// The link as the broker shows it.
    fn state(&self) -> (BridgeState, Option<String>) {
        for side in [&self.sync, &self.send] {
            if let Some(Link::BackingOff(why)) = side {
                return (BridgeState::BackingOff, Some(why.clone()));
            }
        }
        if self.sync == Some(Link::Up) || self.send == Some(Link::Up) {
            (BridgeState::Connected, None)
        } else {
            (BridgeState::Connecting, None)
        }
    }
}

/// Starts the thread; returns one reporter per side. It ends when both are
/// dropped.
pub fn start(socket: PathBuf) -> Result<(Reporter, Reporter), String> {
    let (tx, rx) = crossbeam_channel::unbounded();
    std::thread::Builder::new()
        .name("bridge-status".into())
        .spawn(move || run(Broker::new(socket), rx))
        .map_err(|e| format!("cannot start the bridge-status thread: {e}"))?;
    Ok((
        Reporter {
            side: Side::Sync,
            tx: tx.clone(),
        },
        Reporter {
            side: Side::Send,
            tx,
        },
    ))
}

fn run(mut broker: Broker, rx: Receiver<Report>) {
    let mut sides = Sides::default();
    let mut reported: Option<(BridgeState, Option<String>)> = None;
    let heartbeat = tick(HEARTBEAT);
    loop {
        let mut force = false;
        select! {
            recv(rx) -> r => match r {
                Ok(r) => sides.set(r),
                Err(_) => return,
            },
            recv(heartbeat) -> _ => force = true,
        }
        let now = sides.state();
        if !force && reported.as_ref() == Some(&now) {
            continue;
        }
        let cmd = BridgeStatus {
            state: now.0.clone(),
            detail: now.1.as_ref().map(|d| crate::proto::text::preview(d, 900)),
        };
        // Once: a broker that is away hears the state with the next change or
        // heartbeat.
        match broker.call_once(&cmd) {
            Ok(_) => reported = Some(now),
            Err(e) => log::debug!("cannot report the bridge's state: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backing_off_on_either_side_wins_then_connected_then_connecting() {
        let mut s = Sides::default();
        assert_eq!(s.state(), (BridgeState::Connecting, None));
        s.set(Report {
            side: Side::Sync,
            link: Link::Up,
        });
        assert_eq!(s.state(), (BridgeState::Connected, None));
        s.set(Report {
            side: Side::Send,
            link: Link::BackingOff("429".into()),
        });
        assert_eq!(
            s.state(),
            (BridgeState::BackingOff, Some("429".to_string()))
        );
        s.set(Report {
            side: Side::Send,
            link: Link::Up,
        });
        assert_eq!(s.state(), (BridgeState::Connected, None));
    }
}
