//! A replica's crash domain: one durable map per stage, plus the writes not yet synced. The host
//! syncs everything (group commit) before a stage's next send; a crash loses what is unsynced.

use std::collections::BTreeMap;

use bytes::Bytes;
use upright_core::ids::Principal;
use upright_core::stage::Storage;

/// Durable and pending writes of every stage of one replica.
#[derive(Clone, Debug, Default)]
pub struct ReplicaStorage {
    synced: BTreeMap<Principal, Storage>,
    unsynced: Vec<(Principal, String, Option<Bytes>)>,
}

impl ReplicaStorage {
    /// Records a write (not yet durable).
    pub fn persist(&mut self, stage: Principal, key: String, value: Option<Bytes>) {
        self.unsynced.push((stage, key, value));
    }

    /// Whether writes are waiting for a sync.
    pub fn dirty(&self) -> bool {
        !self.unsynced.is_empty()
    }

    /// Makes every pending write durable, in order.
    pub fn sync(&mut self) {
        for (stage, key, value) in self.unsynced.drain(..) {
            let map = self.synced.entry(stage).or_default();
            match value {
                Some(v) => map.insert(key, v),
                None => map.remove(&key),
            };
        }
    }

    /// A crash: pending writes are lost. Returns how many.
    pub fn crash(&mut self) -> usize {
        let lost = self.unsynced.len();
        self.unsynced.clear();
        lost
    }

    /// The durable map of one stage (what it gets back after a restart).
    pub fn durable(&self, stage: Principal) -> Storage {
        self.synced.get(&stage).cloned().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use upright_core::ids::ReplicaId;

    #[test]
    fn crash_loses_only_unsynced_writes_and_stages_are_separate() {
        let a = Principal::Auth(ReplicaId(0));
        let o = Principal::Order(ReplicaId(0));
        let mut s = ReplicaStorage::default();
        s.persist(a, "k".into(), Some(Bytes::from_static(b"1")));
        s.persist(o, "k".into(), Some(Bytes::from_static(b"x")));
        s.sync();
        s.persist(a, "k".into(), Some(Bytes::from_static(b"2")));
        s.persist(a, "j".into(), Some(Bytes::from_static(b"3")));
        s.persist(o, "k".into(), None);
        assert!(s.dirty());
        assert_eq!(s.crash(), 3);
        assert_eq!(s.durable(a).get("k").unwrap(), &Bytes::from_static(b"1"));
        assert!(!s.durable(a).contains_key("j"));
        assert_eq!(s.durable(o).get("k").unwrap(), &Bytes::from_static(b"x"));
        s.persist(o, "k".into(), None);
        s.sync();
        assert!(s.durable(o).is_empty());
    }
}
