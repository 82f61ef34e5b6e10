//! Catch-up of execution members (PROTOCOL.md): on `q.load_checkpoint()` matching LOAD-CPs the
//! member fetches the checkpoint from its execution peers, manifest first (verified against the
//! agreed digest), then every chunk (verified against the manifest), restores it and continues at
//! `seqno + 1`. It serves its own kept checkpoints to peers.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use super::checkpoint::{chunk_count, ExecCheckpoint, StoredCheckpoint};
use super::paged::PageSync;
use super::ExecStage;
use crate::codec;
use crate::crypto::Digest;
use crate::ids::{Principal, ReplicaId, SeqNo};
use crate::limits::STATE_CHUNKS_MAX;
use crate::message::{state_digest, Message};
use crate::stage::{Action, Event};

pub use crate::limits::CHUNKS_IN_FLIGHT_MAX;

/// A state transfer in progress.
pub(crate) struct Transfer {
    seqno: SeqNo,
    pub(super) digest: Digest,
    /// Total bytes and chunk digests, once a verified manifest arrived.
    manifest: Option<(u64, Vec<Digest>)>,
    chunks: Vec<Option<Bytes>>,
    received: usize,
    /// Chunk index -> peer (index into `peers`) it was last asked of.
    in_flight: BTreeMap<u32, usize>,
    /// Next chunk index never requested.
    next_index: u32,
    /// Execution peers, starting after ourselves.
    pub(super) peers: Vec<ReplicaId>,
    /// First choice for chunks; advances on every retry.
    cursor: usize,
    /// Peers (indices into `peers`) that sent this checkpoint's manifest: they keep it, so
    /// chunks and pages are asked of them. A lagging peer (itself in transfer) or one that
    /// dropped the checkpoint answers nothing; asking it cost a retry interval per item, which a
    /// member catching up while the cluster checkpoints fast could not afford (soak seed
    /// 400047).
    pub(super) holders: BTreeSet<usize>,
    /// The verified small part, kept until the pages are in place.
    pub(super) stored: Option<StoredCheckpoint>,
    /// The paged phase, once the small part is in (`paged.rs`).
    pub(super) pages: Option<PageSync>,
    /// Whether the manifest, a chunk, a tree node or a page was accepted since the last retry
    /// tick.
    pub(super) progressed: bool,
    /// A newer checkpoint agreed by LOAD-CPs while this transfer made progress: loaded when
    /// this one stalls (its peers may have dropped it), else asked for again after it completes.
    newer: Option<(SeqNo, Digest)>,
    /// Per peer, the newer checkpoint it offered instead of this one (the manifest of its newest:
    /// it no longer keeps this one).
    offers: BTreeMap<ReplicaId, (SeqNo, Digest)>,
}

impl Transfer {
    /// The checkpoint being loaded.
    pub fn seqno(&self) -> SeqNo {
        self.seqno
    }

    /// The peer (index into `peers`) `offset` places after the cursor, among the holders if
    /// any peer is known to hold the checkpoint.
    fn pick(&self, offset: usize) -> usize {
        if self.holders.is_empty() {
            return (self.cursor + offset) % self.peers.len();
        }
        let k = (self.cursor + offset) % self.holders.len();
        *self.holders.iter().nth(k).expect("k < holders")
    }

    /// The holder after peer `last` (any peer after it if none is known).
    fn next_after(&self, last: usize) -> usize {
        let peers = self.peers.len();
        (1..=peers)
            .map(|k| (last + k) % peers)
            .find(|p| self.holders.is_empty() || self.holders.contains(p))
            .expect("a holder or any peer")
    }
}

/// The digest of the checkpoint a manifest describes, if its chunk count fits its size.
fn manifest_digest(seqno: SeqNo, total_bytes: u64, chunk_digests: &[Digest], chunk_bytes: usize) -> Option<Digest> {
    let count = chunk_count(total_bytes, chunk_bytes);
    (count == chunk_digests.len() as u64 && count <= STATE_CHUNKS_MAX as u64)
        .then(|| state_digest(seqno, total_bytes, chunk_digests))
}

impl ExecStage {
    pub(super) fn on_load_checkpoint(&mut self, from: ReplicaId, seqno: SeqNo, digest: Digest, out: &mut Vec<Action>) {
        // A recovering member takes the certified checkpoint of its own stored one too.
        if seqno < self.last_executed || (seqno == self.last_executed && !self.distrusted) {
            self.stats.bump("load_checkpoint_old");
            return;
        }
        if !self.load_votes.offer(from, seqno, digest, self.q.load_checkpoint()) {
            return;
        }
        if let Some(t) = self.transfer.as_mut() {
            if t.seqno >= seqno {
                return;
            }
            // A transfer that is getting its chunks or pages goes on: restarting it for every
            // newer checkpoint never finishes one while the cluster checkpoints faster than the
            // state moves (found by --twins).
            if t.progressed || t.manifest.is_some() {
                self.stats.bump("state_transfer_newer_deferred");
                t.newer = Some((seqno, digest));
                return;
            }
        }
        self.start_transfer(seqno, digest, out);
    }

    /// Starts loading checkpoint `seqno` (agreed by LOAD-CPs) from the execution peers.
    fn start_transfer(&mut self, seqno: SeqNo, digest: Digest, out: &mut Vec<Action>) {
        // The transfer compares against and may give up on the current state: make it a
        // committed one first.
        self.roll_back(out);
        let n_exec = self.q.n_exec as u32;
        let peers: Vec<ReplicaId> = (1..n_exec).map(|k| ReplicaId((self.id.0 + k) % n_exec)).collect();
        if peers.is_empty() {
            self.stats.bump("state_transfer_no_peers");
            return;
        }
        self.stats.bump("state_transfer_started");
        let transfer = Transfer {
            seqno,
            digest,
            manifest: None,
            chunks: Vec::new(),
            received: 0,
            in_flight: BTreeMap::new(),
            next_index: 0,
            peers,
            cursor: 0,
            holders: BTreeSet::new(),
            stored: None,
            pages: None,
            progressed: false,
            newer: None,
            offers: BTreeMap::new(),
        };
        self.transfer = Some(transfer);
        self.request_manifest(out);
    }

    /// Asks every peer not yet known to hold the checkpoint for the manifest: those that keep
    /// it answer (and become its holders), those that dropped it for a newer one offer that one.
    fn request_manifest(&self, out: &mut Vec<Action>) {
        let Some(t) = &self.transfer else { return };
        let message = Message::FetchState {
            seqno: t.seqno,
            state_digest: t.digest,
            chunk: None,
        };
        let others = (0..t.peers.len())
            .filter(|p| !t.holders.contains(p))
            .map(|p| Principal::Exec(t.peers[p]));
        self.send_each(others, &message, out);
    }

    fn request_chunk(&self, index: u32, peer: Principal, out: &mut Vec<Action>) {
        let Some(t) = &self.transfer else { return };
        let message = Message::FetchState {
            seqno: t.seqno,
            state_digest: t.digest,
            chunk: Some(index),
        };
        self.send_each(std::iter::once(peer), &message, out);
    }

    /// Requests further chunks while fewer than [`CHUNKS_IN_FLIGHT_MAX`] are outstanding.
    fn request_chunks(&mut self, out: &mut Vec<Action>) {
        let mut requests = Vec::new();
        if let Some(t) = &mut self.transfer {
            while t.in_flight.len() < CHUNKS_IN_FLIGHT_MAX && (t.next_index as usize) < t.chunks.len() {
                let index = t.next_index;
                t.next_index += 1;
                let peer = t.pick(index as usize);
                t.in_flight.insert(index, peer);
                requests.push((index, Principal::Exec(t.peers[peer])));
            }
        }
        for (index, peer) in requests {
            self.request_chunk(index, peer, out);
        }
    }

    /// Retry tick: ask the next peer for the manifest or for every outstanding chunk.
    pub(super) fn retry_transfer(&mut self, out: &mut Vec<Action>) {
        let Some(t) = &mut self.transfer else { return };
        if let Some((seqno, digest)) = t.newer.filter(|_| !t.progressed) {
            // Nothing arrived since the last tick: the peers may no longer keep this checkpoint.
            self.stats.bump("state_transfer_moved_to_newer");
            self.start_transfer(seqno, digest, out);
            return;
        }
        t.progressed = false;
        if t.manifest.is_some() {
            // Peers that did not answer the manifest may have lost the request or be a faulty
            // holder's alternatives: ask them again, so that chunks and pages are not left to
            // holders that stopped answering.
            self.request_manifest(out);
        }
        if self.installing_pages() {
            self.retry_pages(out);
            return;
        }
        let Some(t) = &mut self.transfer else { return };
        t.cursor = (t.cursor + 1) % t.peers.len();
        if t.manifest.is_none() {
            self.request_manifest(out);
            return;
        }
        let moved: Vec<(u32, usize)> = t.in_flight.iter().map(|(i, p)| (*i, t.next_after(*p))).collect();
        let mut requests = Vec::new();
        for (index, peer) in moved {
            t.in_flight.insert(index, peer);
            requests.push((index, Principal::Exec(t.peers[peer])));
        }
        self.stats.bump("state_transfer_retried");
        for (index, peer) in requests {
            self.request_chunk(index, peer, out);
        }
    }

    pub(super) fn on_state_manifest(
        &mut self,
        from: ReplicaId,
        seqno: SeqNo,
        total_bytes: u64,
        chunk_digests: &[Digest],
        out: &mut Vec<Action>,
    ) {
        let chunk_bytes = self.config.knobs.state_chunk_bytes;
        let Some(t) = &self.transfer else {
            self.stats.bump("state_manifest_unexpected");
            return;
        };
        let Some(digest) = manifest_digest(seqno, total_bytes, chunk_digests, chunk_bytes) else {
            self.stats.bump("state_manifest_bad");
            return;
        };
        if seqno > t.seqno && t.manifest.is_none() && !self.newer_offer_moves(from, seqno, digest, out) {
            return;
        }
        let Some(t) = &mut self.transfer else { return };
        if t.seqno != seqno {
            self.stats.bump("state_manifest_unexpected");
            return;
        }
        if digest != t.digest {
            self.stats.bump("state_manifest_bad");
            return;
        }
        if let Some(peer) = t.peers.iter().position(|p| *p == from) {
            t.holders.insert(peer);
        }
        if t.manifest.is_some() {
            self.stats.bump("state_manifest_more_holders");
            return;
        }
        t.manifest = Some((total_bytes, chunk_digests.to_vec()));
        t.progressed = true;
        t.chunks = vec![None; chunk_digests.len()];
        self.stats.bump("state_manifest_accepted");
        self.request_chunks(out);
    }

    /// A peer answered the manifest request with the manifest of a newer checkpoint `(seqno,
    /// digest)`: it no longer keeps the one asked for (after a restart a paged member can serve
    /// only its newest). When `r + 1` peers offer the same checkpoint, at least one of them is
    /// correct, and a correct member's checkpoint is the state of the agreed batches up to it:
    /// load that one instead (PBFT's state transfer accepts a newer checkpoint on `f + 1`
    /// matching replies likewise); returns whether the transfer moved to it. Without this a
    /// member that fell behind the stable checkpoint waited for it forever once every peer had
    /// restarted past it (soak seed 200189: `upright-sim --seeds 1 --first-seed 200189 --u 2
    /// --r 1 --service fs --mutate`).
    fn newer_offer_moves(&mut self, from: ReplicaId, seqno: SeqNo, digest: Digest, out: &mut Vec<Action>) -> bool {
        let quorum = self.q.load_checkpoint();
        let Some(t) = &mut self.transfer else { return false };
        // One offer per peer (its latest), so a faulty peer holds at most one entry.
        t.offers.insert(from, (seqno, digest));
        self.stats.bump("state_transfer_newer_offered");
        let agreeing = t.offers.values().filter(|o| **o == (seqno, digest)).count();
        if agreeing < quorum {
            return false;
        }
        self.stats.bump("state_transfer_moved_to_offered");
        self.start_transfer(seqno, digest, out);
        true
    }

    pub(super) fn on_state_chunk(
        &mut self,
        seqno: SeqNo,
        digest: Digest,
        index: u32,
        data: &Bytes,
        out: &mut Vec<Action>,
    ) {
        let Some(t) = &mut self.transfer else {
            self.stats.bump("state_chunk_unexpected");
            return;
        };
        let Some((_, digests)) = t.manifest.as_ref().filter(|_| t.stored.is_none()) else {
            self.stats.bump("state_chunk_unexpected");
            return;
        };
        let i = index as usize;
        if t.seqno != seqno || t.digest != digest || i >= digests.len() || t.chunks[i].is_some() {
            self.stats.bump("state_chunk_unexpected");
            return;
        }
        if Digest::of(data) != digests[i] {
            self.stats.bump("state_chunk_bad");
            // Refetch from the next peer at once (if we still want it; every request is answered once).
            if let Some(last) = t.in_flight.get(&index).copied() {
                let peer = t.next_after(last);
                t.in_flight.insert(index, peer);
                let to = Principal::Exec(t.peers[peer]);
                self.request_chunk(index, to, out);
            }
            return;
        }
        t.chunks[i] = Some(data.clone());
        t.progressed = true;
        t.received += 1;
        self.stats.add("state_transfer_bytes", data.len() as u64);
        t.in_flight.remove(&index);
        self.stats.bump("state_chunk_accepted");
        if t.received == t.chunks.len() {
            self.finish_transfer(out);
        } else {
            self.request_chunks(out);
        }
    }

    /// All chunks arrived: decode; for a paged service bring the pages to the checkpoint's tree
    /// first (`paged.rs`), then restore.
    fn finish_transfer(&mut self, out: &mut Vec<Action>) {
        let t = self.transfer.as_mut().expect("transfer in progress");
        let mut blob = Vec::with_capacity(t.manifest.as_ref().map_or(0, |m| m.0 as usize));
        for chunk in t.chunks.drain(..).flatten() {
            blob.extend_from_slice(&chunk);
        }
        let stored = StoredCheckpoint::new(t.seqno, Bytes::from(blob), self.config.knobs.state_chunk_bytes);
        assert_eq!(
            stored.digest, t.digest,
            "every chunk was verified against the verified manifest"
        );
        let checkpoint = match codec::from_bytes::<ExecCheckpoint>(&stored.blob) {
            Ok(cp) if cp.seqno == t.seqno => cp,
            _ => {
                self.stats.bump("state_transfer_undecodable");
                self.abandon_transfer();
                return;
            }
        };
        t.stored = Some(stored);
        self.start_page_sync(checkpoint, out);
    }

    /// The pages (if any) are in place: restore the rest, persist, continue at `seqno + 1`.
    pub(super) fn complete_transfer(&mut self, checkpoint: ExecCheckpoint, out: &mut Vec<Action>) {
        let t = self.transfer.take().expect("transfer in progress");
        let stored = t.stored.expect("small part verified");
        if self.restore_checkpoint(&checkpoint).is_err() {
            self.stats.bump("state_transfer_unrestorable");
            if let Some(paged) = self.paged.as_mut() {
                // The pages are already the checkpoint's: execute nothing on them until a
                // transfer completes.
                paged.mark_partial();
            }
            self.abandon_transfer();
            return;
        }
        self.stats.add(
            "state_transfer_state_bytes",
            stored.blob.len() as u64 + checkpoint.page_bytes,
        );
        self.install_checkpoint(stored, out);
        self.state_checked();
        self.batches.prune_through(t.seqno);
        self.fetcher.prune_through(t.seqno);
        self.load_votes.prune_through(t.seqno);
        self.stats.bump("state_transfer_completed");
        out.push(Action::Note(Event::StateLoaded {
            seqno: t.seqno,
            state_digest: t.digest,
        }));
        self.send_last_executed(out);
        self.report_wake(false, out);
        self.request_bodies(out);
        self.execute_ready(out);
    }

    /// After a failed transfer: drop what was buffered beyond the normal window (the order stage
    /// will send LOAD-CP again on LAST-EXEC).
    pub(super) fn abandon_transfer(&mut self) {
        self.transfer = None;
        self.batches
            .prune_beyond(SeqNo(self.last_executed.0.saturating_add(self.config.knobs.log_window)));
    }

    /// Serves our kept checkpoints: the manifest or one chunk.
    pub(super) fn on_fetch_state(
        &mut self,
        from: ReplicaId,
        seqno: SeqNo,
        digest: Digest,
        chunk: Option<u32>,
        out: &mut Vec<Action>,
    ) {
        let Some(stored) = self.checkpoints.get(seqno, digest) else {
            self.stats.bump("fetch_state_unknown");
            // Asked for the manifest of a checkpoint we no longer keep: offer our newest, if it
            // is newer and its state can be served (see `on_newer_offer`).
            let newest = self.checkpoints.newest().filter(|n| n.seqno > seqno && chunk.is_none());
            if let Some(newest) = newest.filter(|_| !self.state_is_partial()) {
                let message = Message::StateManifest {
                    seqno: newest.seqno,
                    total_bytes: newest.blob.len() as u64,
                    chunk_digests: newest.chunk_digests.clone(),
                };
                self.stats.bump("fetch_state_newer_offered");
                self.send_each(std::iter::once(Principal::Exec(from)), &message, out);
            }
            return;
        };
        let message = match chunk {
            None => Message::StateManifest {
                seqno,
                total_bytes: stored.blob.len() as u64,
                chunk_digests: stored.chunk_digests.clone(),
            },
            Some(index) => match stored.chunk(index) {
                Some(data) => Message::StateChunk {
                    seqno,
                    state_digest: digest,
                    index,
                    data,
                },
                None => {
                    self.stats.bump("fetch_state_bad_chunk");
                    return;
                }
            },
        };
        self.stats.bump("fetch_state_served");
        self.checkpoints.served(from, seqno);
        self.send_each(std::iter::once(Principal::Exec(from)), &message, out);
    }
}
