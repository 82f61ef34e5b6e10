//! NEXT-BATCH collection: an execution member accepts batch `n` once `q.next_batch()` distinct order
//! members sent NEXT-BATCH messages with equal `(seqno, history, batch digest)`, or once its
//! co-located order member did (PROTOCOL.md, normal case step 5: the two are one process, correct
//! or faulty together, so a correct execution member's own order member is a correct one). Votes
//! for future sequence numbers are buffered, bounded by the caller's window and by a count of
//! buffered sequence numbers.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::crypto::Digest;
use crate::ids::{ReplicaId, SeqNo};
use crate::message::{batch_digest, history_digest, RequestEntry};

/// A committed batch vouched for by a NEXT-BATCH quorum, waiting to be executed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgreedBatch {
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

/// One order member's NEXT-BATCH for one sequence number. Votes with equal time and entries share
/// one copy of the entries.
#[derive(Clone, Debug)]
struct Vote {
    history: Digest,
    batch_digest: Digest,
    time_us: u64,
    entries: Arc<Vec<RequestEntry>>,
}

/// A NEXT-BATCH as received (already authenticated and checked to come from an order member).
pub struct Offered<'a> {
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
pub struct BatchCollector {
    votes: BTreeMap<SeqNo, BTreeMap<ReplicaId, Vote>>,
    ready: BTreeMap<SeqNo, AgreedBatch>,
    quorum: usize,
    /// The co-located order member, whose vote alone is a quorum.
    trusted: Option<ReplicaId>,
    buffered_max: usize,
}

impl BatchCollector {
    /// A collector that needs `quorum` matching votes, or the vote of `trusted` (the co-located
    /// order member), and buffers at most `buffered_max` sequence numbers (voted or agreed, not
    /// yet executed).
    pub fn new(quorum: usize, trusted: Option<ReplicaId>, buffered_max: usize) -> BatchCollector {
        assert!(quorum >= 1 && buffered_max >= 1);
        BatchCollector {
            votes: BTreeMap::new(),
            ready: BTreeMap::new(),
            quorum,
            trusted,
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
        let (digest, entries) = self.digest_and_entries(&offered);
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
            entries,
        };
        votes.insert(offered.from, vote);
        let matching = votes
            .values()
            .filter(|v| v.history == offered.history && v.batch_digest == digest)
            .count();
        if matching < self.quorum && self.trusted != Some(offered.from) {
            return Ok(false);
        }
        let mut votes = self.votes.remove(&seqno).expect("just inserted");
        let vote = votes.remove(&offered.from).expect("just inserted");
        drop(votes); // the other votes' references to shared entries, so the last one moves out
        let agreed = AgreedBatch {
            seqno,
            history: vote.history,
            batch_digest: vote.batch_digest,
            time_us: vote.time_us,
            entries: Arc::try_unwrap(vote.entries).unwrap_or_else(|shared| (*shared).clone()),
        };
        self.ready.insert(seqno, agreed);
        Ok(true)
    }

    /// The batch digest of `offered` and its entries. If an earlier vote for the same sequence
    /// number has the same time and equal entries, its digest and its copy of the entries are
    /// reused (equal contents have equal digests), so a quorum costs one hashing and one copy of
    /// the entries, not one per vote. Other entries are hashed and kept on their own (the form
    /// of each body is part of the digest, so a copy that swaps it is another batch).
    fn digest_and_entries(&self, offered: &Offered<'_>) -> (Digest, Arc<Vec<RequestEntry>>) {
        let same = self.votes.get(&offered.seqno).and_then(|votes| {
            votes
                .values()
                .find(|v| v.time_us == offered.time_us && v.entries.as_slice() == offered.entries)
        });
        match same {
            Some(vote) => (vote.batch_digest, vote.entries.clone()),
            None => (
                batch_digest(offered.time_us, offered.entries.iter().map(RequestEntry::digest)),
                Arc::new(offered.entries.to_vec()),
            ),
        }
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::ids::{ClientId, RequestId};
    use crate::message::RequestBody;

    fn entry(client: u32, op: &'static [u8], inline: bool) -> RequestEntry {
        let op = Bytes::from_static(op);
        RequestEntry {
            client: ClientId(client),
            request_id: RequestId(1),
            body: if inline {
                RequestBody::Inline(op)
            } else {
                RequestBody::Digest(Digest::of(&op))
            },
        }
    }

    fn offer(c: &mut BatchCollector, from: u32, time_us: u64, entries: &[RequestEntry]) -> Result<bool, &'static str> {
        let digest = batch_digest(time_us, entries.iter().map(RequestEntry::digest));
        let offered = Offered {
            from: ReplicaId(from),
            seqno: SeqNo(1),
            history: history_digest(&Digest::default(), &digest),
            time_us,
            entries,
        };
        c.offer(offered, (SeqNo(0), Digest::default()))
    }

    #[test]
    fn equal_votes_share_one_copy_and_one_digest() {
        let mut c = BatchCollector::new(3, None, 4);
        let entries = vec![entry(1, b"a", true), entry(2, b"b", true)];
        assert_eq!(offer(&mut c, 0, 10, &entries), Ok(false));
        assert_eq!(offer(&mut c, 1, 10, &entries), Ok(false));
        let votes = &c.votes[&SeqNo(1)];
        assert!(Arc::ptr_eq(
            &votes[&ReplicaId(0)].entries,
            &votes[&ReplicaId(1)].entries
        ));
        // Another time is another batch: its own digest, its own copy, no match.
        assert_eq!(offer(&mut c, 2, 11, &entries), Ok(false));
        let votes = &c.votes[&SeqNo(1)];
        assert!(!Arc::ptr_eq(
            &votes[&ReplicaId(0)].entries,
            &votes[&ReplicaId(2)].entries
        ));
        assert_ne!(votes[&ReplicaId(0)].batch_digest, votes[&ReplicaId(2)].batch_digest);
        assert_eq!(offer(&mut c, 3, 10, &entries), Ok(true));
        let agreed = c.ready(SeqNo(1)).expect("agreed");
        assert_eq!(agreed.entries, entries);
        assert_eq!(agreed.time_us, 10);
        assert_eq!(
            agreed.batch_digest,
            batch_digest(10, entries.iter().map(RequestEntry::digest))
        );
        assert!(c.votes.is_empty());
    }

    #[test]
    fn inline_and_digest_forms_are_different_batches() {
        // The form of a body is part of what is agreed (`RequestEntry::digest`): a copy that
        // swaps it does not match.
        let mut c = BatchCollector::new(2, None, 4);
        let inline = vec![entry(1, b"a", true)];
        let by_digest = vec![entry(1, b"a", false)];
        assert_eq!(offer(&mut c, 0, 10, &inline), Ok(false));
        assert_eq!(offer(&mut c, 1, 10, &by_digest), Ok(false));
        assert_eq!(offer(&mut c, 2, 10, &by_digest), Ok(true));
        assert_eq!(c.ready(SeqNo(1)).expect("agreed").entries, by_digest);
    }

    #[test]
    fn the_co_located_order_member_alone_is_a_quorum() {
        let mut c = BatchCollector::new(2, Some(ReplicaId(2)), 4);
        let entries = vec![entry(1, b"a", true)];
        let other = vec![entry(1, b"b", true)];
        // A remote vote alone is not enough, nor two that disagree.
        assert_eq!(offer(&mut c, 0, 10, &other), Ok(false));
        assert_eq!(offer(&mut c, 1, 10, &entries), Ok(false));
        assert!(c.ready(SeqNo(1)).is_none());
        // The co-located member's vote agrees the batch it names.
        assert_eq!(offer(&mut c, 2, 10, &entries), Ok(true));
        assert_eq!(c.ready(SeqNo(1)).expect("agreed").entries, entries);
        // Alone, first: agreed at once.
        let mut c = BatchCollector::new(2, Some(ReplicaId(0)), 4);
        assert_eq!(offer(&mut c, 0, 10, &entries), Ok(true));
    }

    /// Offers `entries` at seqno 1 from `from` with a history that does not follow from `H_0`.
    fn offer_forged_history(c: &mut BatchCollector, from: u32, entries: &[RequestEntry]) -> Result<bool, &'static str> {
        let offered = Offered {
            from: ReplicaId(from),
            seqno: SeqNo(1),
            history: Digest::of(b"forged"),
            time_us: 10,
            entries,
        };
        c.offer(offered, (SeqNo(0), Digest::default()))
    }

    #[test]
    fn a_vote_with_a_wrong_history_is_refused_even_if_its_entries_match() {
        let mut c = BatchCollector::new(2, None, 4);
        let entries = vec![entry(1, b"a", true)];
        assert_eq!(offer(&mut c, 0, 10, &entries), Ok(false));
        assert_eq!(
            offer_forged_history(&mut c, 1, &entries),
            Err("next_batch_history_mismatch")
        );
        assert!(c.ready(SeqNo(1)).is_none());
        // The co-located member's vote is checked the same way.
        let mut c = BatchCollector::new(2, Some(ReplicaId(1)), 4);
        assert_eq!(
            offer_forged_history(&mut c, 1, &entries),
            Err("next_batch_history_mismatch")
        );
        assert!(c.ready(SeqNo(1)).is_none());
    }
}
