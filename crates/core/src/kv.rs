//! An in-memory key-value [`Service`] used by the simulator and tests.
//!
//! Operations and replies are postcard-encoded [`KvOperation`] / [`KvReply`]. The checkpoint is
//! the sorted map, so equal states give byte-identical checkpoints.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::codec;
use crate::service::{BatchContext, RestoreError, Service, ServiceRequest};

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
        }
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
    fn execute(&mut self, _context: &BatchContext, requests: &[ServiceRequest]) -> Vec<Bytes> {
        requests
            .iter()
            .map(|request| match KvOperation::decode(&request.operation) {
                Some(operation) => self.apply(&operation).encode(),
                None => KvReply::Invalid.encode(),
            })
            .collect()
    }

    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        match KvOperation::decode(operation)? {
            KvOperation::Get { key } => Some(KvReply::Value(self.map.get(&key).cloned()).encode()),
            _ => None,
        }
    }

    fn checkpoint(&self) -> Bytes {
        let pairs: Vec<(&Bytes, &Bytes)> = self.map.iter().collect();
        Bytes::from(codec::to_bytes(&pairs))
    }

    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        let pairs: Vec<(Bytes, Bytes)> =
            codec::from_bytes(checkpoint).map_err(|e| RestoreError(format!("kv checkpoint: {e}")))?;
        self.map = pairs.into_iter().collect();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let cp = kv.checkpoint();
        let mut other = KvService::new();
        other.restore(&cp).unwrap();
        assert_eq!(other, kv);
        assert_eq!(other.checkpoint(), cp);
        assert!(other.restore(b"\xff\xff").is_err());
    }
}
