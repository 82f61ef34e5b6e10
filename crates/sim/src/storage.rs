//! A replica's crash domain: one durable map per stage, plus the writes not yet synced. The host
//! syncs (group commit) before a stage's next send everything up to the last eager write; lazy
//! writes after it stay pending until a later sync or a background flush; a crash loses what is
//! unsynced.

use std::collections::BTreeMap;

use bytes::Bytes;
use upright_core::ids::Principal;
use upright_core::stage::Storage;

/// Durable and pending writes of every stage of one replica.
#[derive(Clone, Debug, Default)]
pub struct ReplicaStorage {
    synced: BTreeMap<Principal, Storage>,
    unsynced: Vec<(Principal, String, Option<Bytes>)>,
    /// How many of the first `unsynced` writes a send must wait for (the rest are lazy writes
    /// after the last eager one).
    eager_prefix: usize,
}

impl ReplicaStorage {
    /// Records a write (not yet durable) that the next send must wait for.
    pub fn persist(&mut self, stage: Principal, key: String, value: Option<Bytes>) {
        self.unsynced.push((stage, key, value));
        self.eager_prefix = self.unsynced.len();
    }

    /// Records a lazy write: in order with the others, but sends do not wait for it.
    pub fn persist_lazily(&mut self, stage: Principal, key: String, value: Option<Bytes>) {
        self.unsynced.push((stage, key, value));
    }

    /// What a send waits for: the writes up to the last eager one become durable (a log is
    /// written in order, so the lazy writes before it go with it); later lazy ones stay pending.
    pub fn sync_for_send(&mut self) {
        let rest = self.unsynced.split_off(self.eager_prefix);
        self.sync();
        self.unsynced = rest;
    }

    /// Whether writes are waiting for a sync.
    pub fn dirty(&self) -> bool {
        !self.unsynced.is_empty()
    }

    /// Makes every pending write durable, in order.
    pub fn sync(&mut self) {
        self.eager_prefix = 0;
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
        self.eager_prefix = 0;
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

    #[test]
    fn a_send_waits_for_eager_writes_and_the_lazy_ones_before_them_only() {
        let o = Principal::Order(ReplicaId(0));
        let v = |b: &'static [u8]| Some(Bytes::from_static(b));
        let mut s = ReplicaStorage::default();
        s.persist_lazily(o, "a".into(), v(b"1"));
        s.persist(o, "b".into(), v(b"2"));
        s.persist_lazily(o, "c".into(), v(b"3"));
        s.sync_for_send();
        assert!(s.dirty(), "the trailing lazy write is still pending");
        assert_eq!(s.crash(), 1);
        let durable = s.durable(o);
        assert!(durable.contains_key("a") && durable.contains_key("b") && !durable.contains_key("c"));
        s.persist_lazily(o, "d".into(), v(b"4"));
        s.sync_for_send();
        assert_eq!(s.crash(), 1, "only lazy writes: a send waits for nothing");
    }
}
