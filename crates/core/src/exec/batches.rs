//! NEXT-BATCH collection: an execution member accepts batch `n` once `q.next_batch()` distinct order
//! members sent NEXT-BATCH messages with equal `(seqno, history, batch digest)` (PROTOCOL.md, normal
//! case step 5). Votes for future sequence numbers are buffered, bounded by the caller's window and
//! by a count of buffered sequence numbers.

use std::collections::BTreeMap;

use crate::crypto::Digest;
use crate::ids::{ReplicaId, SeqNo};
use crate::message::{batch_digest, history_digest, RequestEntry};

/// A committed batch vouched for by a NEXT-BATCH quorum, waiting to be executed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AgreedBatch {
    /// Sequence number.
    pub seqno: SeqNo,
    /// History digest `H_seqno`.
    pub history: Digest,
    /// Digest of `(time_us, entries)`.
    pub batch_digest: Digest,
    /// Agreed time.
    pub time_us: u64,
    /// The requests.
    pub entries: Vec<RequestEntry>,
}

/// One order member's NEXT-BATCH for one sequence number.
#[derive(Clone, Debug)]
struct Vote {
    history: Digest,
    batch_digest: Digest,
    time_us: u64,
    entries: Vec<RequestEntry>,
}

/// A NEXT-BATCH as received (already authenticated and checked to come from an order member).
pub(crate) struct Offered<'a> {
    /// Sending order member.
    pub from: ReplicaId,
    /// Sequence number.
    pub seqno: SeqNo,
    /// Claimed history digest.
    pub history: Digest,
    /// Claimed batch time.
    pub time_us: u64,
    /// Claimed entries.
    pub entries: &'a [RequestEntry],
}

/// Votes per sequence number and the batches that reached a quorum.
pub(crate) struct BatchCollector {
    votes: BTreeMap<SeqNo, BTreeMap<ReplicaId, Vote>>,
    ready: BTreeMap<SeqNo, AgreedBatch>,
    quorum: usize,
    buffered_max: usize,
}

impl BatchCollector {
    /// A collector that needs `quorum` matching votes and buffers at most `buffered_max` sequence
    /// numbers (voted or agreed, not yet executed).
    pub fn new(quorum: usize, buffered_max: usize) -> BatchCollector {
        assert!(quorum >= 1 && buffered_max >= 1);
        BatchCollector {
            votes: BTreeMap::new(),
            ready: BTreeMap::new(),
            quorum,
            buffered_max,
        }
    }

    /// Records a vote. `last` is the member's last executed `(seqno, history)`; the caller has
    /// checked that `offered.seqno` is above `last.0` and inside the window. Returns `Ok(true)` when
    /// this vote completed a quorum, `Ok(false)` when it was recorded without one, and `Err(reason)`
    /// (a stats counter name) when it was dropped.
    pub fn offer(&mut self, offered: Offered<'_>, last: (SeqNo, Digest)) -> Result<bool, &'static str> {
        let seqno = offered.seqno;
        assert!(seqno > last.0, "caller filters executed sequence numbers");
        if self.ready.contains_key(&seqno) {
            return Err("next_batch_already_agreed");
        }
        if !self.votes.contains_key(&seqno) && self.votes.len() + self.ready.len() >= self.buffered_max {
            return Err("next_batch_buffer_full");
        }
        let digest = batch_digest(offered.time_us, offered.entries.iter().map(RequestEntry::digest));
        if let Some(previous) = self.previous_history(seqno, last) {
            if history_digest(&previous, &digest) != offered.history {
                return Err("next_batch_history_mismatch");
            }
        }
        let votes = self.votes.entry(seqno).or_default();
        if let Some(existing) = votes.get(&offered.from) {
            return Err(
                if existing.history == offered.history && existing.batch_digest == digest {
                    "next_batch_duplicate"
                } else {
                    "next_batch_conflicting"
                },
            );
        }
        let vote = Vote {
            history: offered.history,
            batch_digest: digest,
            time_us: offered.time_us,
            entries: offered.entries.to_vec(),
        };
        votes.insert(offered.from, vote);
        let matching = votes
            .values()
            .filter(|v| v.history == offered.history && v.batch_digest == digest)
            .count();
        if matching < self.quorum {
            return Ok(false);
        }
        let mut votes = self.votes.remove(&seqno).expect("just inserted");
        let vote = votes.remove(&offered.from).expect("just inserted");
        let agreed = AgreedBatch {
            seqno,
            history: vote.history,
            batch_digest: vote.batch_digest,
            time_us: vote.time_us,
            entries: vote.entries,
        };
        self.ready.insert(seqno, agreed);
        Ok(true)
    }

    /// `H_{seqno-1}` when known: our own history if `seqno` is next, else an agreed predecessor's.
    fn previous_history(&self, seqno: SeqNo, last: (SeqNo, Digest)) -> Option<Digest> {
        if seqno.0 == last.0 .0 + 1 {
            Some(last.1)
        } else {
            self.ready.get(&SeqNo(seqno.0 - 1)).map(|b| b.history)
        }
    }

    /// The agreed batch at `seqno`, if any.
    pub fn ready(&self, seqno: SeqNo) -> Option<&AgreedBatch> {
        self.ready.get(&seqno)
    }

    /// All agreed, unexecuted batches in sequence order.
    pub fn ready_batches(&self) -> impl Iterator<Item = &AgreedBatch> {
        self.ready.values()
    }

    /// Removes and returns the agreed batch at `seqno`.
    pub fn take(&mut self, seqno: SeqNo) -> Option<AgreedBatch> {
        self.ready.remove(&seqno)
    }

    /// Forgets every vote and agreed batch at or below `seqno` (executed or superseded by a
    /// loaded checkpoint).
    pub fn prune_through(&mut self, seqno: SeqNo) {
        self.votes = self.votes.split_off(&seqno.next());
        self.ready = self.ready.split_off(&seqno.next());
    }

    /// Forgets every vote and agreed batch above `seqno` (buffered for a state transfer that
    /// failed, now outside the window).
    pub fn prune_beyond(&mut self, seqno: SeqNo) {
        self.votes.split_off(&seqno.next());
        self.ready.split_off(&seqno.next());
    }

    /// Number of sequence numbers buffered (voted or agreed).
    #[cfg(test)]
    pub fn buffered(&self) -> usize {
        self.votes.len() + self.ready.len()
    }
}
