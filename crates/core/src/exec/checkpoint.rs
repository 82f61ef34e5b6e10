//! Execution checkpoints (PROTOCOL.md "Checkpoints and the stage interlock", exec side): every
//! `checkpoint_interval` batches the member serializes an [`ExecCheckpoint`], splits it into
//! chunks of `state_chunk_bytes`, computes `state_digest(seqno, total, chunk_digests)`, persists
//! it under `exec/cp/<seqno>` (keeping the [`CHECKPOINTS_KEPT`] newest) and then sends CP-TOKEN to the order stage.
//! On restart the newest stored checkpoint that verifies against its own digest is loaded.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::paged::PagedState;
use super::ExecStage;
use crate::codec;
use crate::config::ClusterConfig;
use crate::crypto::Digest;
use crate::ids::{ClientId, ReplicaId, RequestId, SeqNo, StageKind};
use crate::limits::STATE_CHUNKS_MAX;
use crate::message::{state_digest, SealFor};
use crate::service::RestoreError;
use crate::stage::{Action, Event, Storage};

pub use crate::limits::CHECKPOINTS_KEPT;

/// Prefix of the storage keys of execution checkpoints.
pub const CHECKPOINT_KEY_PREFIX: &str = "exec/cp/";

/// Everything an execution member needs to continue from batch `seqno + 1`. Deterministic: equal
/// states encode to equal bytes (the reply cache is sorted by client).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecCheckpoint {
    /// Last batch covered.
    pub seqno: SeqNo,
    /// History digest `H_seqno`.
    pub history: Digest,
    /// Time of the last non-empty batch up to `seqno`.
    pub time_us: u64,
    /// The service's checkpoint.
    pub service: Bytes,
    /// Reply cache: last request id and reply per client, sorted by client.
    pub replies: Vec<(ClientId, RequestId, Bytes)>,
    /// Pushed messages: per client, the next number and the kept pushes, sorted by client.
    pub pushes: Vec<(ClientId, super::pushes::ClientPushes)>,
    /// Under selective execution, the object streams of pushes (docs/ODRC.md, "Per-object push
    /// streams"), sorted by object and client; empty otherwise.
    pub streams: super::pushes::ObjectStreams,
    /// The service's paged state (`exec/paged.rs`): page count (0 without pages).
    pub pages: u64,
    /// Root of the page tree ([`crate::page_tree::PageTree::root`]).
    pub page_root: Digest,
    /// Sum of the pages' lengths.
    pub page_bytes: u64,
}

/// An encoded checkpoint with its manifest and digest, as stored and served to peers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StoredCheckpoint {
    /// Sequence number.
    pub seqno: SeqNo,
    /// `state_digest(seqno, blob.len(), chunk_digests)`.
    pub digest: Digest,
    /// The encoded [`ExecCheckpoint`].
    pub blob: Bytes,
    /// Digest of each chunk of `blob`.
    pub chunk_digests: Vec<Digest>,
    chunk_bytes: usize,
}

impl StoredCheckpoint {
    /// Chunks and digests an encoded checkpoint.
    pub fn new(seqno: SeqNo, blob: Bytes, chunk_bytes: usize) -> StoredCheckpoint {
        assert!(chunk_bytes > 0);
        let chunk_digests: Vec<Digest> = blob.chunks(chunk_bytes).map(Digest::of).collect();
        assert!(
            chunk_digests.len() <= STATE_CHUNKS_MAX,
            "checkpoint of {} bytes has too many chunks",
            blob.len()
        );
        let digest = state_digest(seqno, blob.len() as u64, &chunk_digests);
        StoredCheckpoint {
            seqno,
            digest,
            blob,
            chunk_digests,
            chunk_bytes,
        }
    }

    /// Chunk `index`, if it exists.
    pub fn chunk(&self, index: u32) -> Option<Bytes> {
        let start = (index as usize).checked_mul(self.chunk_bytes)?;
        if index as usize >= self.chunk_digests.len() {
            return None;
        }
        let end = (start + self.chunk_bytes).min(self.blob.len());
        Some(self.blob.slice(start..end))
    }

    /// The storage record: `(digest, blob)`.
    pub(super) fn record(&self) -> Bytes {
        Bytes::from(codec::to_bytes(&(self.digest, &self.blob)))
    }
}

/// The digest a checkpoint serialized whole into `blob` would have, chunked as the small part of
/// a checkpoint is: what checkpointing cost before paged state (the benchmark's baseline).
pub fn whole_blob_digest(seqno: SeqNo, blob: Bytes, chunk_bytes: usize) -> Digest {
    StoredCheckpoint::new(seqno, blob, chunk_bytes).digest
}

/// Number of chunks a checkpoint of `total` bytes has.
pub(crate) fn chunk_count(total: u64, chunk_bytes: usize) -> u64 {
    total.div_ceil(chunk_bytes as u64)
}

/// Storage key of checkpoint `seqno`.
pub fn storage_key(seqno: SeqNo) -> String {
    format!("{CHECKPOINT_KEY_PREFIX}{}", seqno.0)
}

fn parse_key(key: &str) -> Option<SeqNo> {
    let digits = key.strip_prefix(CHECKPOINT_KEY_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(SeqNo)
}

/// Decodes and verifies a storage record; `None` if corrupted.
fn verify_record(seqno: SeqNo, record: &[u8], chunk_bytes: usize) -> Option<(StoredCheckpoint, ExecCheckpoint)> {
    let (digest, blob): (Digest, Bytes) = codec::from_bytes(record).ok()?;
    if chunk_count(blob.len() as u64, chunk_bytes) > STATE_CHUNKS_MAX as u64 {
        return None;
    }
    let stored = StoredCheckpoint::new(seqno, blob, chunk_bytes);
    if stored.digest != digest {
        return None;
    }
    let checkpoint: ExecCheckpoint = codec::from_bytes(&stored.blob).ok()?;
    (checkpoint.seqno == seqno).then_some((stored, checkpoint))
}

/// What an attacker who controlled a replica can leave in its storage (the simulator's
/// proactive-recovery faults): the stored checkpoint `record` of `seqno` with its state changed
/// by `tamper` and its digests made to match, so that it verifies on its own. `None` if the
/// record does not verify or `tamper` declines (returns `false`).
pub fn tampered_record(
    seqno: SeqNo,
    record: &[u8],
    chunk_bytes: usize,
    tamper: impl FnOnce(&mut ExecCheckpoint) -> bool,
) -> Option<Bytes> {
    let (_, mut checkpoint) = verify_record(seqno, record, chunk_bytes)?;
    if !tamper(&mut checkpoint) {
        return None;
    }
    let blob = Bytes::from(codec::to_bytes(&checkpoint));
    Some(StoredCheckpoint::new(seqno, blob, chunk_bytes).record())
}

/// The newest checkpoints (at most [`CHECKPOINTS_KEPT`]) and every checkpoint key in storage.
#[derive(Default)]
pub(crate) struct CheckpointStore {
    kept: BTreeMap<SeqNo, StoredCheckpoint>,
    on_disk: BTreeSet<SeqNo>,
    /// Per peer, the checkpoint last served to it and how many were taken since
    /// ([`crate::limits::CHECKPOINT_SERVED_PIN`]): two lagging peers fetching different
    /// checkpoints each keep theirs (one pin for all let each peer's fetch unpin the other's).
    served: BTreeMap<ReplicaId, (SeqNo, u32)>,
}

impl CheckpointStore {
    /// Adds a checkpoint; returns the storage keys to delete (all but the newest kept, and the
    /// one a peer is fetching).
    fn insert(&mut self, stored: StoredCheckpoint) -> Vec<SeqNo> {
        self.on_disk.insert(stored.seqno);
        self.kept.insert(stored.seqno, stored);
        for (_, since) in self.served.values_mut() {
            *since += 1;
        }
        let kept = &self.kept;
        self.served.retain(|_, &mut (seqno, since)| {
            since <= crate::limits::CHECKPOINT_SERVED_PIN && kept.contains_key(&seqno)
        });
        let pinned: BTreeSet<SeqNo> = self.served.values().map(|(seqno, _)| *seqno).collect();
        let newest: BTreeSet<SeqNo> = self.kept.keys().rev().take(CHECKPOINTS_KEPT).copied().collect();
        self.kept
            .retain(|seqno, _| newest.contains(seqno) || pinned.contains(seqno));

        let stale: Vec<SeqNo> = self
            .on_disk
            .iter()
            .filter(|s| !self.kept.contains_key(s))
            .copied()
            .collect();
        for seqno in &stale {
            self.on_disk.remove(seqno);
        }
        stale
    }

    /// Keeps no checkpoint to serve (a recovery distrusts them; their storage records are
    /// deleted when the next checkpoint is kept).
    pub(super) fn forget_kept(&mut self) {
        self.kept.clear();
    }

    /// The newest kept checkpoint.
    pub fn newest(&self) -> Option<&StoredCheckpoint> {
        self.kept.last_key_value().map(|(_, cp)| cp)
    }

    /// The kept checkpoint at `seqno` with this digest.
    pub fn get(&self, seqno: SeqNo, digest: Digest) -> Option<&StoredCheckpoint> {
        self.kept.get(&seqno).filter(|cp| cp.digest == digest)
    }

    /// Peer `to` fetched from the kept checkpoint at `seqno`: keep it a while longer. A peer
    /// holds one pin (its latest fetch), so at most one extra checkpoint per peer is kept.
    pub fn served(&mut self, to: ReplicaId, seqno: SeqNo) {
        self.served.insert(to, (seqno, 0));
    }
}

impl ExecStage {
    /// Takes the checkpoint at `last_executed`: persist, then CP-TOKEN to every order member.
    pub(super) fn take_checkpoint(&mut self, out: &mut Vec<Action>) {
        let page_cp = match (self.paged.as_mut(), self.service.pages_mut()) {
            (Some(paged), Some(pages)) => {
                let cp = paged.checkpoint(pages, self.last_executed, out);
                self.stats.add("checkpoint_pages_changed", cp.changed.len() as u64);
                Some(cp)
            }
            _ => None,
        };
        let (pages, page_root, page_bytes) = page_cp
            .as_ref()
            .map_or((0, Digest::default(), 0), |cp| (cp.pages, cp.root, cp.bytes));
        let checkpoint = ExecCheckpoint {
            pages,
            page_root,
            page_bytes,
            seqno: self.last_executed,
            history: self.history,
            time_us: self.last_time_us,
            service: self.service.checkpoint(),
            replies: self.replies.to_sorted(),
            pushes: self.pushes.to_sorted(),
            streams: self.pushes.objects_sorted(),
        };
        let blob = Bytes::from(codec::to_bytes(&checkpoint));
        let stored = StoredCheckpoint::new(checkpoint.seqno, blob, self.config.knobs.state_chunk_bytes);
        let (seqno, digest) = (stored.seqno, stored.digest);
        if let (Some(cp), Some(paged), Some(pages)) = (page_cp, self.paged.as_mut(), self.service.pages_mut()) {
            paged.store_checkpoint(pages, seqno, &cp, &stored.record(), out);
        }
        self.install_checkpoint(stored, out);
        self.stats.bump("checkpoints_taken");
        out.push(Action::Note(Event::Checkpointed {
            seqno,
            state_digest: digest,
        }));
        self.send_checkpoint_token(seqno, digest, out);
    }

    fn send_checkpoint_token(&self, seqno: SeqNo, digest: Digest, out: &mut Vec<Action>) {
        let token = crate::contract::checkpoint_token(seqno, digest);
        let order = ClusterConfig::order_members(&self.q).collect();
        self.send(order, token, SealFor::Stage(StageKind::Order), out);
    }

    /// Sends the newest checkpoint's CP-TOKEN again: tokens can be lost, and without
    /// `checkpoint_token` of them the order stage cannot certify the checkpoint and stops at the
    /// interlock (`h + log_window`). Called with every LAST-EXEC retry.
    pub(super) fn resend_newest_checkpoint_token(&self, out: &mut Vec<Action>) {
        if let Some(newest) = self.checkpoints.newest() {
            self.send_checkpoint_token(newest.seqno, newest.digest, out);
        }
    }

    /// Persists a checkpoint and deletes the stale ones.
    pub(super) fn install_checkpoint(&mut self, stored: StoredCheckpoint, out: &mut Vec<Action>) {
        out.push(Action::Persist {
            key: storage_key(stored.seqno),
            value: Some(stored.record()),
        });
        for stale in self.checkpoints.insert(stored) {
            out.push(Action::Persist {
                key: storage_key(stale),
                value: None,
            });
        }
    }

    /// Replaces the whole execution state with a checkpoint's.
    pub(super) fn restore_checkpoint(&mut self, checkpoint: &ExecCheckpoint) -> Result<(), RestoreError> {
        self.service.restore(&checkpoint.service)?;
        self.replies.restore(&checkpoint.replies);
        if let Some(selective) = self.selective.as_mut() {
            selective.reset(checkpoint.seqno);
        }
        self.pushes.restore(&checkpoint.pushes, &checkpoint.streams);
        self.last_executed = checkpoint.seqno;
        self.history = checkpoint.history;
        self.last_time_us = checkpoint.time_us;
        Ok(())
    }

    /// Loads the newest stored checkpoint that verifies and restores; corrupted ones are ignored.
    pub(super) fn recover(&mut self, storage: &Storage, page_store: Option<Box<dyn crate::pages::PageStore>>) {
        let chunk_bytes = self.config.knobs.state_chunk_bytes;
        let mut store_checkpoint = None;
        if let (Some(pages), Some(store)) = (self.service.pages_mut(), page_store) {
            match pages.attach_store(store, crate::limits::PAGE_CACHE_BYTES) {
                Ok(committed) => store_checkpoint = committed.filter(|&seqno| seqno > 0).map(SeqNo),
                Err(e) => panic!("page store: cannot take the service's pages: {e}"),
            }
        }
        if let Some(pages) = self.service.pages_mut() {
            let mut bad_keys = 0;
            self.paged = Some(PagedState::recover(pages, storage, &mut bad_keys));
            self.stats.add("stored_page_bad_key", bad_keys);
        }
        let page_state = match (self.paged.as_mut(), self.service.pages()) {
            (Some(paged), Some(pages)) => (pages.len(), paged.tree.root()),
            _ => (0, Digest::default()),
        };
        let mut valid = Vec::new();
        // The page store's own copy of its checkpoint's record (committed with the pages, so
        // present even when a power loss took the storage write).
        if let (Some(seqno), Some(pages)) = (store_checkpoint, self.service.pages()) {
            let record = pages.store_record().unwrap_or_default();
            match verify_record(seqno, &record, chunk_bytes) {
                Some(pair) => valid.push(pair),
                None => self.stats.bump("store_checkpoint_record_missing"),
            }
        }
        for (key, record) in storage.range(CHECKPOINT_KEY_PREFIX.to_string()..) {
            if !key.starts_with(CHECKPOINT_KEY_PREFIX) {
                break;
            }
            let Some(seqno) = parse_key(key) else {
                self.stats.bump("stored_checkpoint_bad_key");
                continue;
            };
            self.checkpoints.on_disk.insert(seqno);
            match verify_record(seqno, record, chunk_bytes) {
                // The same checkpoint as the store's record.
                Some(_) if store_checkpoint == Some(seqno) && !valid.is_empty() => {}
                Some(pair) => valid.push(pair),
                None => self.stats.bump("stored_checkpoint_corrupt"),
            }
        }
        valid.sort_by_key(|(stored, _)| std::cmp::Reverse(stored.seqno));
        let mut restored = false;
        for (stored, checkpoint) in valid {
            if (checkpoint.pages, checkpoint.page_root) != page_state {
                // The stored pages are another checkpoint's (a crash between the two writes):
                // the order stage's LOAD-CP brings a certified state.
                self.stats.bump("stored_checkpoint_pages_mismatch");
                continue;
            }
            if !restored {
                if self.restore_checkpoint(&checkpoint).is_err() {
                    self.stats.bump("stored_checkpoint_unrestorable");
                    continue;
                }
                restored = true;
                if let Some(paged) = self.paged.as_mut() {
                    paged.restored(stored.seqno);
                }
                self.stats.bump("recovered_from_checkpoint");
            }
            if self.checkpoints.kept.len() < CHECKPOINTS_KEPT {
                self.checkpoints.kept.insert(stored.seqno, stored);
            }
        }
        let checkpoint_pages = |p: &PagedState| p.has_stored_pages() || store_checkpoint.is_some();
        if let Some(paged) = self.paged.as_mut().filter(|p| !restored && checkpoint_pages(p)) {
            // The stored pages are some checkpoint's, not the service's initial ones, and no
            // stored checkpoint describes them (a torn write, or a store whose record was lost):
            // executing from batch 1 on them would make a state no correct member has. Nothing is
            // executed or read until a transfer installs a certified checkpoint (the order
            // stage's LOAD-CP).
            paged.mark_partial();
            self.stats.bump("stored_pages_without_checkpoint");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(n: u64) -> StoredCheckpoint {
        StoredCheckpoint::new(SeqNo(n), Bytes::from(n.to_le_bytes().to_vec()), 4)
    }

    /// The newest `CHECKPOINTS_KEPT` are kept; the one each peer is fetching stays too (a
    /// peer's later fetch moves its pin), until `CHECKPOINT_SERVED_PIN` newer ones were taken
    /// without it being served to that peer again.
    #[test]
    fn a_checkpoint_being_fetched_outlives_the_newest_three_for_a_while() {
        let mut store = CheckpointStore::default();
        for n in 1..=3 {
            assert!(store.insert(cp(n)).is_empty());
        }
        assert_eq!(store.insert(cp(4)), vec![SeqNo(1)], "the oldest goes");
        store.served(ReplicaId(1), SeqNo(2));
        store.served(ReplicaId(2), SeqNo(3));
        store.served(ReplicaId(3), SeqNo(2));
        store.served(ReplicaId(3), SeqNo(4));
        for n in 5..5 + u64::from(crate::limits::CHECKPOINT_SERVED_PIN) {
            store.insert(cp(n));
            assert!(store.get(SeqNo(2), cp(2).digest).is_some(), "pinned by peer 1 at {n}");
            assert!(store.get(SeqNo(3), cp(3).digest).is_some(), "pinned by peer 2 at {n}");
            assert!(store.kept.len() <= CHECKPOINTS_KEPT + 3, "one extra per peer at most");
        }
        store.insert(cp(100));
        for n in 2..=4 {
            assert!(
                store.get(SeqNo(n), cp(n).digest).is_none(),
                "{n} released once not served for long"
            );
        }
        assert_eq!(store.kept.len(), CHECKPOINTS_KEPT);
        assert_eq!(store.on_disk.len(), CHECKPOINTS_KEPT, "its storage record goes with it");
    }
}
