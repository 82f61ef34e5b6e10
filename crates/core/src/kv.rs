//! An in-memory key-value [`Service`] used by the simulator and tests.
//!
//! Operations and replies are postcard-encoded [`KvOperation`] / [`KvReply`]. The checkpoint is
//! the sorted map and the watches, so equal states give byte-identical checkpoints.
//!
//! Watches (one-shot, as ZooKeeper's): an ordered `Get` of a key makes its client a watcher of
//! that key; the next write to the key (by anyone) pushes a [`KvEvent`] with the key's new value
//! to every watcher but the writer, and ends those watches. A `Get` on the read-only path changes
//! nothing, so it sets no watch. The events are pushed on the key ([`Effects::push_on`]), and a
//! watch announces the key's stream to its client: under selective execution each key's events
//! are numbered in their own stream (docs/ODRC.md, "Per-object push streams").

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::codec;
use crate::ids::ClientId;
use crate::service::{Access, BatchContext, Effects, RestoreError, Service, ServiceRequest};

pub use crate::limits::WATCHED_KEYS_MAX;

/// What a watch pushes: the key and its value after the write (`None`: deleted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEvent {
    /// The key written.
    pub key: Bytes,
    /// Its new value.
    pub value: Option<Bytes>,
}

impl KvEvent {
    /// Encodes the event as a push payload.
    pub fn encode(&self) -> Bytes {
        Bytes::from(codec::to_bytes(self))
    }

    /// Decodes a push payload.
    pub fn decode(bytes: &[u8]) -> Option<KvEvent> {
        codec::from_bytes(bytes).ok()
    }
}

/// A key-value operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvOperation {
    /// Read a key.
    Get {
        /// Key.
        key: Bytes,
    },
    /// Write a key.
    Put {
        /// Key.
        key: Bytes,
        /// Value.
        value: Bytes,
    },
    /// Append to a key's value (creating it if absent); replies with the new value.
    Append {
        /// Key.
        key: Bytes,
        /// Suffix.
        value: Bytes,
    },
    /// Delete a key.
    Delete {
        /// Key.
        key: Bytes,
    },
    /// A CPU-heavy test operation (the selective-execution benchmark): a chain of
    /// `micros * BURN_HASHES_PER_US` BLAKE3 hashes from the key's value, stored as its new value
    /// and returned (about `micros` microseconds of one core of the 2-core development machine).
    Burn {
        /// Key.
        key: Bytes,
        /// Microseconds of CPU to burn (at most [`BURN_MICROS_MAX`]).
        micros: u32,
    },
}

/// BLAKE3 hashes of 32 bytes per microsecond of [`KvOperation::Burn`] (measured on the 2-core
/// development machine: 11.2 per microsecond).
pub const BURN_HASHES_PER_US: u64 = 11;

/// The longest [`KvOperation::Burn`]: one second.
pub const BURN_MICROS_MAX: u32 = 1_000_000;

/// The value [`KvOperation::Burn`] leaves on a key that held `value`.
pub fn burn(value: Option<&[u8]>, micros: u32) -> Bytes {
    let mut digest = *blake3::hash(value.unwrap_or_default()).as_bytes();
    for _ in 0..u64::from(micros.min(BURN_MICROS_MAX)) * BURN_HASHES_PER_US {
        digest = *blake3::hash(&digest).as_bytes();
    }
    Bytes::copy_from_slice(&digest)
}

/// A key-value reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvReply {
    /// The value read (or the new value after `Append`), `None` if absent.
    Value(Option<Bytes>),
    /// The write was applied.
    Done,
    /// The operation could not be decoded.
    Invalid,
}

impl KvOperation {
    /// Encodes the operation for [`crate::stage::Input::Invoke`].
    pub fn encode(&self) -> Bytes {
        Bytes::from(codec::to_bytes(self))
    }

    /// Decodes an operation.
    pub fn decode(bytes: &[u8]) -> Option<KvOperation> {
        codec::from_bytes(bytes).ok()
    }

    /// Whether it only reads.
    pub fn is_read_only(&self) -> bool {
        matches!(self, KvOperation::Get { .. })
    }

    /// The key it touches.
    pub fn key(&self) -> &Bytes {
        match self {
            KvOperation::Get { key }
            | KvOperation::Put { key, .. }
            | KvOperation::Append { key, .. }
            | KvOperation::Delete { key }
            | KvOperation::Burn { key, .. } => key,
        }
    }
}

impl KvReply {
    /// Encodes the reply.
    pub fn encode(&self) -> Bytes {
        Bytes::from(codec::to_bytes(self))
    }

    /// Decodes a reply.
    pub fn decode(bytes: &[u8]) -> Option<KvReply> {
        codec::from_bytes(bytes).ok()
    }
}

/// The in-memory key-value store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvService {
    map: BTreeMap<Bytes, Bytes>,
    /// Key -> the clients watching it (see the module documentation).
    watches: BTreeMap<Bytes, BTreeSet<ClientId>>,
    /// Run under selective execution.
    selective: bool,
    /// Under selective execution: the watched keys as of the last checkpoint, against which
    /// new watches are bounded (so the bound allows [`WATCHED_KEYS_MAX`] plus what one
    /// checkpoint interval's requests add).
    watched_agreed: std::cell::Cell<usize>,
}

impl KvService {
    /// An empty store.
    pub fn new() -> KvService {
        KvService::default()
    }

    /// Applies one operation.
    pub fn apply(&mut self, operation: &KvOperation) -> KvReply {
        match operation {
            KvOperation::Get { key } => KvReply::Value(self.map.get(key).cloned()),
            KvOperation::Put { key, value } => {
                self.map.insert(key.clone(), value.clone());
                KvReply::Done
            }
            KvOperation::Append { key, value } => {
                let entry = self.map.entry(key.clone()).or_default();
                let mut joined = Vec::with_capacity(entry.len() + value.len());
                joined.extend_from_slice(entry);
                joined.extend_from_slice(value);
                *entry = Bytes::from(joined);
                KvReply::Value(Some(entry.clone()))
            }
            KvOperation::Delete { key } => {
                self.map.remove(key);
                KvReply::Done
            }
            KvOperation::Burn { key, micros } => {
                let value = burn(self.map.get(key).map(|v| &v[..]), *micros);
                self.map.insert(key.clone(), value.clone());
                KvReply::Value(Some(value))
            }
        }
    }

    /// Applies one operation of `client` with watches: an ordered `Get` sets a watch, a write
    /// pushes the key's new value to its watchers (but the writer) and ends their watches.
    pub fn apply_watched(&mut self, client: ClientId, operation: &KvOperation, effects: &mut Effects) -> KvReply {
        let reply = self.apply(operation);
        match operation {
            KvOperation::Get { key } => {
                // Under selective execution the bound is checked against the watched keys of
                // the last checkpoint (the same on every member), not this member's count,
                // which depends on the keys it maintains.
                let watched = if self.selective {
                    self.watched_agreed.get()
                } else {
                    self.watches.len()
                };
                if self.watches.contains_key(key) || watched < WATCHED_KEYS_MAX {
                    self.watches.entry(key.clone()).or_default().insert(client);
                    effects.announce_stream(client, key.clone());
                }
            }
            KvOperation::Put { key, .. }
            | KvOperation::Append { key, .. }
            | KvOperation::Delete { key }
            | KvOperation::Burn { key, .. } => {
                if let Some(watchers) = self.watches.remove(key) {
                    let event = KvEvent {
                        key: key.clone(),
                        value: self.map.get(key).cloned(),
                    }
                    .encode();
                    for watcher in watchers.into_iter().filter(|&w| w != client) {
                        effects.push_on(key.clone(), watcher, event.clone());
                    }
                }
            }
        }
        reply
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

impl Service for KvService {
    fn execute(&mut self, _context: &BatchContext, requests: &[ServiceRequest], effects: &mut Effects) -> Vec<Bytes> {
        requests
            .iter()
            .map(|request| match KvOperation::decode(&request.operation) {
                Some(operation) => self.apply_watched(request.client, &operation, effects).encode(),
                None => KvReply::Invalid.encode(),
            })
            .collect()
    }

    /// One key: read by `Get`, written by the others (`Append` reads it too).
    fn access(&self, operation: &[u8]) -> Option<Access> {
        Some(match KvOperation::decode(operation)? {
            KvOperation::Get { key } => Access::reading([key]),
            KvOperation::Put { key, .. }
            | KvOperation::Append { key, .. }
            | KvOperation::Delete { key }
            | KvOperation::Burn { key, .. } => Access::writing([key]),
        })
    }

    /// Its requests already touch only the key they name; a write's watch events go in the
    /// key's push streams, and the bound on watched keys is checked against the last
    /// checkpoint's count.
    fn enable_selective_execution(&mut self) -> bool {
        self.selective = true;
        self.watched_agreed.set(self.watches.len());
        true
    }

    /// A key's value and its watchers.
    fn object_state(&self, object: &[u8]) -> Option<Option<Bytes>> {
        let value = self.map.get(object);
        let watchers: Vec<ClientId> = self
            .watches
            .get(object)
            .map(|w| w.iter().copied().collect())
            .unwrap_or_default();
        if value.is_none() && watchers.is_empty() {
            return Some(None);
        }
        Some(Some(Bytes::from(codec::to_bytes(&(value, watchers)))))
    }

    fn restore_object(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), RestoreError> {
        let key = Bytes::copy_from_slice(object);
        let (value, watchers): (Option<Bytes>, Vec<ClientId>) = match state {
            None => (None, Vec::new()),
            Some(bytes) => codec::from_bytes(bytes).map_err(|e| RestoreError(format!("kv object: {e}")))?,
        };
        match value {
            Some(value) => self.map.insert(key.clone(), value),
            None => self.map.remove(&key),
        };
        if watchers.is_empty() {
            self.watches.remove(&key);
        } else {
            self.watches.insert(key, watchers.into_iter().collect());
        }
        Ok(())
    }

    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        match KvOperation::decode(operation)? {
            KvOperation::Get { key } => Some(KvReply::Value(self.map.get(&key).cloned()).encode()),
            _ => None,
        }
    }

    fn checkpoint(&self) -> Bytes {
        self.watched_agreed.set(self.watches.len());
        let pairs: Vec<(&Bytes, &Bytes)> = self.map.iter().collect();
        let watches: Vec<(&Bytes, Vec<ClientId>)> = self
            .watches
            .iter()
            .map(|(k, w)| (k, w.iter().copied().collect()))
            .collect();
        Bytes::from(codec::to_bytes(&(pairs, watches)))
    }

    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        type Checkpoint = (Vec<(Bytes, Bytes)>, Vec<(Bytes, Vec<ClientId>)>);
        let (pairs, watches): Checkpoint =
            codec::from_bytes(checkpoint).map_err(|e| RestoreError(format!("kv checkpoint: {e}")))?;
        if watches.len() > WATCHED_KEYS_MAX {
            return Err(RestoreError(format!("kv checkpoint: {} watched keys", watches.len())));
        }
        self.map = pairs.into_iter().collect();
        self.watches = watches.into_iter().map(|(k, w)| (k, w.into_iter().collect())).collect();
        self.watched_agreed.set(self.watches.len());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store rebuilt object by object from another's object states (ODRC's object checkpoint
    /// and update functions) is the same store: byte-identical checkpoints.
    #[test]
    fn a_store_rebuilt_from_object_states_checkpoints_identically() {
        use proptest::prelude::*;
        let op = (0u8..3, 0u8..6, any::<u8>()).prop_map(|(kind, key, v)| {
            let key = Bytes::from(format!("k{key}"));
            let value = Bytes::from(vec![v]);
            match kind {
                0 => KvOperation::Get { key },
                1 => KvOperation::Put { key, value },
                _ => KvOperation::Delete { key },
            }
        });
        proptest!(|(ops in proptest::collection::vec((0u32..3, op), 0..40))| {
            let mut a = KvService::new();
            let mut effects = Effects::default();
            for (client, op) in &ops {
                a.apply_watched(ClientId(*client), op, &mut effects);
            }
            let mut b = KvService::new();
            // b starts with something of its own on a key a touched, to be replaced.
            b.apply(&KvOperation::Put { key: "k0".into(), value: "stale".into() });
            for key in (0..6).map(|k| format!("k{k}")) {
                let state = a.object_state(key.as_bytes()).expect("the kv store supports objects");
                b.restore_object(key.as_bytes(), state.as_deref()).unwrap();
            }
            prop_assert_eq!(a.checkpoint(), b.checkpoint());
        });
        assert!(
            KvService::new().restore_object(b"k", Some(b"\xff")).is_err(),
            "garbage is refused"
        );
    }

    #[test]
    fn checkpoint_round_trip_is_byte_identical() {
        let mut kv = KvService::new();
        kv.apply(&KvOperation::Put {
            key: "b".into(),
            value: "2".into(),
        });
        kv.apply(&KvOperation::Put {
            key: "a".into(),
            value: "1".into(),
        });
        assert_eq!(
            kv.apply(&KvOperation::Append {
                key: "a".into(),
                value: "x".into()
            }),
            KvReply::Value(Some("1x".into()))
        );
        let mut effects = Effects::default();
        kv.apply_watched(ClientId(7), &KvOperation::Get { key: "z".into() }, &mut effects);
        let cp = kv.checkpoint();
        let mut other = KvService::new();
        other.restore(&cp).unwrap();
        assert_eq!(other, kv);
        assert_eq!(other.checkpoint(), cp);
        assert!(other.restore(b"\xff\xff").is_err());
    }

    #[test]
    fn access_names_the_key() {
        let kv = KvService::new();
        let get = KvOperation::Get { key: "a".into() }.encode();
        assert_eq!(kv.access(&get), Some(Access::reading([Bytes::from("a")])));
        let put = KvOperation::Put {
            key: "b".into(),
            value: "1".into(),
        }
        .encode();
        let access = kv.access(&put).unwrap();
        assert!(!access.is_read_only() && access.writes.contains(&Bytes::from("b")));
        assert_eq!(kv.access(b"\xff\xff"), None, "malformed: unknown");
    }

    #[test]
    fn a_write_pushes_to_the_watchers_of_its_key_once() {
        let mut kv = KvService::new();
        let mut fx = Effects::default();
        let get = |k: &str| KvOperation::Get {
            key: Bytes::copy_from_slice(k.as_bytes()),
        };
        let put = |k: &str, v: &str| KvOperation::Put {
            key: Bytes::copy_from_slice(k.as_bytes()),
            value: Bytes::copy_from_slice(v.as_bytes()),
        };
        kv.apply_watched(ClientId(1), &get("a"), &mut fx);
        kv.apply_watched(ClientId(2), &get("a"), &mut fx);
        kv.apply_watched(ClientId(3), &get("b"), &mut fx);
        assert!(fx.pushes().is_empty(), "reads push nothing");
        kv.apply_watched(ClientId(2), &put("a", "x"), &mut fx);
        let pushes = fx.take_pushes();
        assert_eq!(pushes.len(), 1, "the writer is not told of its own write");
        assert_eq!(pushes[0].client, ClientId(1));
        assert_eq!(
            KvEvent::decode(&pushes[0].payload),
            Some(KvEvent {
                key: "a".into(),
                value: Some("x".into())
            })
        );
        kv.apply_watched(ClientId(3), &put("a", "y"), &mut fx);
        assert!(fx.pushes().is_empty(), "a watch fires once");
        kv.apply_watched(ClientId(1), &KvOperation::Delete { key: "b".into() }, &mut fx);
        let pushes = fx.take_pushes();
        assert_eq!((pushes.len(), pushes[0].client), (1, ClientId(3)));
        assert_eq!(KvEvent::decode(&pushes[0].payload).unwrap().value, None);
    }
}
