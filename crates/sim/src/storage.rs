//! The simulated disk under the replica host ([`upright_core::host::Host`]): one log per stage
//! member, a durable map plus the writes not yet synced. The host syncs (group commit) before
//! a send that follows an eager write; the disk also flushes in the background now and then
//! (the simulator decides when, from the seed); a crash loses what is unsynced.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use upright_core::host::Log;
use upright_core::pages::PageStore;
use upright_core::stage::Storage;

/// One stage member's simulated log.
#[derive(Clone, Debug, Default)]
pub struct SimLog {
    /// Sabotage: syncs are acknowledged but write nothing (`--sabotage lying-disk`).
    pub lies: bool,
    durable: Storage,
    pending: Vec<(String, Option<Bytes>)>,
    must_sync: bool,
    syncs: u64,
}

impl SimLog {
    /// A log whose durable content is `durable` (what survived the last crash).
    pub fn new(durable: Storage) -> SimLog {
        SimLog {
            durable,
            ..SimLog::default()
        }
    }

    /// A crash: pending writes are lost. Returns how many.
    pub fn crash(&mut self) -> usize {
        self.must_sync = false;
        std::mem::take(&mut self.pending).len()
    }

    /// What the member gets back after a restart.
    pub fn durable(&self) -> &Storage {
        &self.durable
    }

    /// The durable content, for an attacker who controls the replica to rewrite (the
    /// proactive-recovery faults).
    pub fn durable_mut(&mut self) -> &mut Storage {
        &mut self.durable
    }
}

impl Log for SimLog {
    fn append(&mut self, key: &str, value: Option<&Bytes>) {
        self.append_lazily(key, value);
        self.must_sync = true;
    }

    fn append_lazily(&mut self, key: &str, value: Option<&Bytes>) {
        self.pending.push((key.to_string(), value.cloned()));
    }

    fn needs_sync(&self) -> bool {
        self.must_sync
    }

    fn is_dirty(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Makes every pending write durable, in order (instantaneous in virtual time).
    fn sync(&mut self) -> std::io::Result<Option<Duration>> {
        if self.pending.is_empty() {
            return Ok(None);
        }
        if self.lies {
            self.must_sync = false;
            self.syncs += 1;
            return Ok(None);
        }
        for (key, value) in self.pending.drain(..) {
            match value {
                Some(v) => self.durable.insert(key, v),
                None => self.durable.remove(&key),
            };
        }
        self.must_sync = false;
        self.syncs += 1;
        Ok(None)
    }

    fn syncs(&self) -> u64 {
        self.syncs
    }
}

/// A replica's simulated page store (it survives the replica's crashes): the committed pages,
/// and the writes of a checkpoint not yet committed (lost on a crash). A commit is durable at
/// once, as the runtime's store's is when it returns.
#[derive(Debug, Default)]
pub struct SimPages {
    committed: BTreeMap<u64, Bytes>,
    len: u64,
    seqno: u64,
    record: Bytes,
    pending: Vec<(u64, Bytes)>,
}

impl SimPages {
    /// A crash: uncommitted writes are lost.
    pub fn crash(&mut self) {
        self.pending.clear();
    }
}

/// The execution member's handle on its replica's [`SimPages`].
pub struct SimPageStore(pub Arc<Mutex<SimPages>>);

impl PageStore for SimPageStore {
    fn committed(&self) -> (u64, Vec<u32>) {
        let p = self.0.lock().expect("not poisoned");
        let lens = (0..p.len)
            .map(|i| p.committed.get(&i).map_or(0, |b| b.len() as u32))
            .collect();
        (p.seqno, lens)
    }

    fn read(&self, index: u64) -> std::io::Result<Bytes> {
        let p = self.0.lock().expect("not poisoned");
        Ok(p.committed.get(&index).cloned().unwrap_or_default())
    }

    fn committed_record(&self) -> Bytes {
        self.0.lock().expect("not poisoned").record.clone()
    }

    fn write(&mut self, index: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.0
            .lock()
            .expect("not poisoned")
            .pending
            .push((index, Bytes::copy_from_slice(bytes)));
        Ok(())
    }

    fn commit(&mut self, seqno: u64, len: u64, record: &[u8]) -> std::io::Result<()> {
        let mut p = self.0.lock().expect("not poisoned");
        p.record = Bytes::copy_from_slice(record);
        for (index, bytes) in std::mem::take(&mut p.pending) {
            p.committed.insert(index, bytes);
        }
        p.committed.retain(|i, _| *i < len);
        p.len = len;
        p.seqno = seqno;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_loses_only_unsynced_writes() {
        let v = |b: &'static [u8]| Some(Bytes::from_static(b));
        let mut log = SimLog::default();
        log.append("k", v(b"1").as_ref());
        assert!(log.needs_sync() && log.is_dirty());
        log.sync().unwrap();
        assert!(!log.needs_sync() && !log.is_dirty());
        log.append("k", v(b"2").as_ref());
        log.append_lazily("j", v(b"3").as_ref());
        assert_eq!(log.crash(), 2);
        assert!(!log.needs_sync(), "nothing is left to wait for after a crash");
        assert_eq!(log.durable().get("k").unwrap(), &Bytes::from_static(b"1"));
        assert!(!log.durable().contains_key("j"));
        log.append("k", None);
        log.sync().unwrap();
        assert!(log.durable().is_empty());
        assert_eq!(log.syncs(), 2);
    }

    #[test]
    fn lazy_writes_alone_ask_for_no_sync_but_go_durable_with_the_next_one() {
        let v = |b: &'static [u8]| Some(Bytes::from_static(b));
        let mut log = SimLog::default();
        log.append_lazily("a", v(b"1").as_ref());
        assert!(log.is_dirty() && !log.needs_sync(), "a lazy write holds no send back");
        log.append("b", v(b"2").as_ref());
        log.sync().unwrap();
        assert!(log.durable().contains_key("a") && log.durable().contains_key("b"));
    }
}
