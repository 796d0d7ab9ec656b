//! The shapes of the client-server API this client reads: the answers of
//! `/login`, `/account/whoami`, `/join`, `/send`, `/sync` and `/messages`, and
//! the filter that narrows a sync to the `m.room.message` timeline of one room.
//! Every field is optional or defaulted (an idle sync has no `rooms` key, and a
//! homeserver may send `null`), and one malformed event never makes a whole
//! answer unreadable: [`RoomEvent`] keeps what it can read and leaves the rest
//! empty, for the caller to skip.

use serde::{Deserialize, Deserializer};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// A missing key or `null` both become the default.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The answer to `POST /login`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct LoginAnswer {
    #[serde(default, deserialize_with = "nullable")]
    pub user_id: String,
    #[serde(default, deserialize_with = "nullable")]
    pub access_token: String,
    #[serde(default, deserialize_with = "nullable")]
    pub device_id: String,
}

/// The answer to `GET /account/whoami`: whose token this is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Whoami {
    #[serde(default, deserialize_with = "nullable")]
    pub user_id: String,
    /// Missing for tokens not tied to a device (appservices).
    #[serde(default)]
    pub device_id: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub is_guest: bool,
}

/// The answer to `POST /join` and `GET /directory/room`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct RoomIdAnswer {
    #[serde(default, deserialize_with = "nullable")]
    pub room_id: String,
}

/// The answer to `PUT /send`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct SendAnswer {
    #[serde(default, deserialize_with = "nullable")]
    pub event_id: String,
}

/// The answer to `GET /sync`. `next_batch` is the `since` of the next sync.
#[derive(Debug, Default, Deserialize)]
pub struct SyncResponse {
    #[serde(default, deserialize_with = "nullable")]
    pub next_batch: String,
    #[serde(default, deserialize_with = "nullable")]
    pub rooms: Rooms,
}

impl SyncResponse {
    /// The timeline of `room_id` if the user is joined to it and something
    /// happened there.
    pub fn timeline(&self, room_id: &str) -> Option<&Timeline> {
        self.rooms.join.get(room_id).map(|r| &r.timeline)
    }
}

/// The rooms part of a sync, by membership.
#[derive(Debug, Default, Deserialize)]
pub struct Rooms {
    #[serde(default, deserialize_with = "nullable")]
    pub join: BTreeMap<String, RoomUpdate>,
    /// Rooms the user left or was removed from since the last sync.
    #[serde(default, deserialize_with = "nullable")]
    pub leave: BTreeMap<String, RoomUpdate>,
    /// Pending invites, as the homeserver sent them.
    #[serde(default, deserialize_with = "nullable")]
    pub invite: BTreeMap<String, Value>,
}

/// What happened in one room.
#[derive(Debug, Default, Deserialize)]
pub struct RoomUpdate {
    #[serde(default, deserialize_with = "nullable")]
    pub timeline: Timeline,
}

/// New events of one room, oldest first. When `limited` is set, events
/// between the previous sync and these were left out: fetch them with
/// `/messages` from `prev_batch` backwards.
#[derive(Debug, Default, Deserialize)]
pub struct Timeline {
    #[serde(default, deserialize_with = "nullable")]
    pub events: Vec<RoomEvent>,
    #[serde(default, deserialize_with = "nullable")]
    pub limited: bool,
    #[serde(default)]
    pub prev_batch: Option<String>,
}

/// The answer to `GET /rooms/{id}/messages`: `chunk` in the order asked for
/// (newest first going backwards); `end` is missing when there is no more.
#[derive(Debug, Default, Deserialize)]
pub struct Messages {
    #[serde(default, deserialize_with = "nullable")]
    pub chunk: Vec<RoomEvent>,
    #[serde(default, deserialize_with = "nullable")]
    pub start: String,
    #[serde(default)]
    pub end: Option<String>,
}

/// One room event as far as it could be read: a field of the wrong type is
/// left empty (a member can put anything in `content`, and a homeserver bug
/// must not make the whole sync unreadable). `kind` is the event's `type`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoomEvent {
    pub event_id: String,
    pub kind: String,
    pub sender: String,
    pub origin_server_ts: u64,
    pub state_key: Option<String>,
    /// Empty unless the content is a JSON object.
    pub content: Map<String, Value>,
    /// `unsigned.transaction_id`: only on the sender's own events, seen by the
    /// device that sent them.
    pub transaction_id: Option<String>,
}

impl RoomEvent {
    pub fn from_value(v: &Value) -> RoomEvent {
        let text = |key: &str| v.get(key).and_then(Value::as_str).map(str::to_string);
        RoomEvent {
            event_id: text("event_id").unwrap_or_default(),
            kind: text("type").unwrap_or_default(),
            sender: text("sender").unwrap_or_default(),
            origin_server_ts: v
                .get("origin_server_ts")
                .and_then(Value::as_u64)
                .unwrap_or(0),
            state_key: text("state_key"),
            content: v
                .get("content")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
            transaction_id: v
                .pointer("/unsigned/transaction_id")
                .and_then(Value::as_str)
                .map(str::to_string),
        }
    }

    /// A string field of the content (`body`, `hive.from`, …).
    pub fn content_str(&self, key: &str) -> Option<&str> {
        self.content.get(key).and_then(Value::as_str)
    }
}

impl<'de> Deserialize<'de> for RoomEvent {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<RoomEvent, D::Error> {
        Ok(RoomEvent::from_value(&Value::deserialize(d)?))
    }
}

/// Which way `/messages` pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Older events first: from a `prev_batch` back in time.
    Backward,
    Forward,
}

impl Direction {
    pub fn as_param(self) -> &'static str {
        match self {
            Direction::Backward => "b",
            Direction::Forward => "f",
        }
    }
}

/// The events of given types in one room, for `/sync` (only that room's
/// timeline, nothing else: no presence, account data, receipts or state) and
/// for `/messages`. A homeserver may cap the timeline limit (Synapse's
/// `filter_timeline_limit`, 100 by default); a longer gap comes back
/// `limited` all the same.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomFilter {
    sync: String,
    events: String,
}

impl RoomFilter {
    /// `m.room.message` events of `room_id`, up to `timeline_limit` per sync.
    pub fn messages(room_id: &str, timeline_limit: u32) -> RoomFilter {
        RoomFilter::new(room_id, &["m.room.message"], timeline_limit)
    }

    pub fn new(room_id: &str, types: &[&str], timeline_limit: u32) -> RoomFilter {
        RoomFilter::in_rooms(&[room_id], types, timeline_limit)
    }

    /// Events of given types in several rooms (the bridge's swarm room and
    /// its operator room), up to `timeline_limit` per room and sync.
    pub fn in_rooms(room_ids: &[&str], types: &[&str], timeline_limit: u32) -> RoomFilter {
        let none = json!({ "types": [] });
        let sync = json!({
            "presence": none,
            "account_data": none,
            "room": {
                "rooms": room_ids,
                "timeline": { "types": types, "limit": timeline_limit },
                "state": none,
                "ephemeral": none,
                "account_data": none,
            },
        });
        RoomFilter {
            sync: sync.to_string(),
            events: json!({ "types": types }).to_string(),
        }
    }

    /// The filter JSON for `/sync`'s `filter` parameter.
    pub fn sync_json(&self) -> &str {
        &self.sync
    }

    /// The room event filter JSON for `/messages`' `filter` parameter.
    pub fn events_json(&self) -> &str {
        &self.events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOM: &str = "!SccUzeuOaO_yJZvftDDZI5g-1G1HtlH-dAYo8LZKf7g";

    #[test]
    fn an_idle_sync_has_only_next_batch() {
        // What an idle long-poll returns after its timeout (the reference, §11).
        let s: SyncResponse = serde_json::from_str(
            r#"{"next_batch":"s72595_4483_1934","device_one_time_keys_count":{"signed_curve25519":0},
                "device_unused_fallback_key_types":[]}"#,
        )
        .unwrap();
        assert_eq!(s.next_batch, "s72595_4483_1934");
        assert!(s.rooms.join.is_empty());
        assert!(s.timeline(ROOM).is_none());
        let s: SyncResponse = serde_json::from_str(r#"{"next_batch":"s1","rooms":null}"#).unwrap();
        assert!(s.rooms.join.is_empty());
    }

    #[test]
    fn a_timeline_with_events_limited_and_prev_batch() {
        let text = format!(
            r#"{{"next_batch":"s9_1","rooms":{{"join":{{"{ROOM}":{{
                "timeline":{{"events":[
                  {{"type":"m.room.message","sender":"@hive-a-bridge:hive.test",
                    "content":{{"body":"hello from hive A","hive.from":"hive-a","hive.msg_id":"m-0001",
                               "hive.to":"hive-b","msgtype":"m.text"}},
                    "origin_server_ts":1763880000000,"unsigned":{{"age":31,"transaction_id":"m-0001"}},
                    "event_id":"$yGOB9MSg"}},
                  {{"type":"m.room.message","sender":"@x:hive.test","content":"not an object",
                    "origin_server_ts":"yesterday","event_id":7}}
                ],"limited":true,"prev_batch":"t3-10_4_0"}},
                "state":{{"events":[]}},"ephemeral":{{"events":[]}},"account_data":{{"events":[]}},
                "unread_notifications":{{"notification_count":0,"highlight_count":0}}}}}},
              "invite":{{"!other:hive.test":{{"invite_state":{{"events":[]}}}}}}}}}}"#
        );
        let s: SyncResponse = serde_json::from_str(&text).unwrap();
        let t = s.timeline(ROOM).unwrap();
        assert!(t.limited);
        assert_eq!(t.prev_batch.as_deref(), Some("t3-10_4_0"));
        assert_eq!(t.events.len(), 2);
        let e = &t.events[0];
        assert_eq!(e.event_id, "$yGOB9MSg");
        assert_eq!(e.kind, "m.room.message");
        assert_eq!(e.sender, "@hive-a-bridge:hive.test");
        assert_eq!(e.origin_server_ts, 1_763_880_000_000);
        assert_eq!(e.content_str("hive.msg_id"), Some("m-0001"));
        assert_eq!(e.transaction_id.as_deref(), Some("m-0001"));
        // The malformed event is kept, empty where it could not be read.
        let bad = &t.events[1];
        assert_eq!(bad.event_id, "");
        assert_eq!(bad.origin_server_ts, 0);
        assert!(bad.content.is_empty());
        assert_eq!(bad.sender, "@x:hive.test");
        assert!(s.rooms.invite.contains_key("!other:hive.test"));
    }

    #[test]
    fn messages_with_and_without_an_end() {
        let m: Messages = serde_json::from_str(
            r#"{"chunk":[{"type":"m.room.message","event_id":"$b","sender":"@a:t","content":{"body":"2"}},
                         {"type":"m.room.message","event_id":"$a","sender":"@a:t","content":{"body":"1"}}],
                "start":"t3-10_4_0","end":"t1-5_4_0"}"#,
        )
        .unwrap();
        let ids: Vec<&str> = m.chunk.iter().map(|e| e.event_id.as_str()).collect();
        assert_eq!(ids, ["$b", "$a"]);
        assert_eq!(m.end.as_deref(), Some("t1-5_4_0"));
        let m: Messages = serde_json::from_str(r#"{"chunk":[],"start":"t1-5_4_0"}"#).unwrap();
        assert!(m.chunk.is_empty() && m.end.is_none());
    }

    #[test]
    fn whoami_and_login_answers() {
        let w: Whoami = serde_json::from_str(
            r#"{"user_id":"@hive-a-bridge:hive.test","is_guest":false,"device_id":"HIVE_A_BRIDGE"}"#,
        )
        .unwrap();
        assert_eq!(w.device_id.as_deref(), Some("HIVE_A_BRIDGE"));
        let l: LoginAnswer = serde_json::from_str(
            r#"{"user_id":"@hive-a-bridge:hive.test","access_token":"syt_aGl2ZS1h_x","home_server":"hive.test",
                "device_id":"HIVE_A_BRIDGE"}"#,
        )
        .unwrap();
        assert_eq!(l.device_id, "HIVE_A_BRIDGE");
        assert_eq!(l.access_token, "syt_aGl2ZS1h_x");
    }

    #[test]
    fn the_filter_keeps_one_room_timeline_and_nothing_else() {
        let f = RoomFilter::messages(ROOM, 100);
        let sync: Value = serde_json::from_str(f.sync_json()).unwrap();
        assert_eq!(sync["room"]["rooms"], json!([ROOM]));
        assert_eq!(
            sync["room"]["timeline"],
            json!({"types": ["m.room.message"], "limit": 100})
        );
        assert_eq!(sync["room"]["state"], json!({"types": []}));
        assert_eq!(sync["presence"], json!({"types": []}));
        assert_eq!(f.events_json(), r#"{"types":["m.room.message"]}"#);
        let two = RoomFilter::in_rooms(&[ROOM, "!ops"], &["m.room.message"], 10);
        let sync: Value = serde_json::from_str(two.sync_json()).unwrap();
        assert_eq!(sync["room"]["rooms"], json!([ROOM, "!ops"]));
        assert_eq!(sync["room"]["timeline"]["limit"], json!(10));
    }
}
