//! Matrix, the transport between hives of a swarm: a blocking client for the
//! client-server API of a homeserver (Synapse, conduwuit, tuwunel…), which the
//! bridge process stands on. [`client`] makes the requests and [`login`] gets
//! it a session; [`api`] holds the shapes of their answers and the sync
//! filter; [`content`] checks an event's content against the event cap and
//! canonical JSON before it is sent; [`error`] sorts failures by what to do
//! (stop, wait, retry, drop) and paces retries; [`secret`] keeps passwords and
//! access tokens out of sight, and the access token of a password login in a
//! 0600 file.

pub mod api;
pub mod client;
pub mod content;
pub mod error;
pub mod login;
pub mod secret;

pub use api::{Direction, Messages, RoomEvent, RoomFilter, SyncResponse, Timeline, Whoami};
pub use client::{Client, MessagesRequest, Session};
pub use error::{Backoff, Error, ErrorKind};
pub use login::TokenSource;
pub use secret::{read_secret_file, Secret, TokenFile};
