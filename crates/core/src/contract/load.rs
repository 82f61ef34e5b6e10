//! LOAD-CP collection on the execution side: an execution member loads a checkpoint only when
//! `q.load_checkpoint()` distinct order members name the same `(seqno, exec_state)`, so at least
//! one correct order member vouches for a stable checkpoint there.

use std::collections::BTreeMap;

use crate::crypto::Digest;
use crate::ids::{ReplicaId, SeqNo};

/// The latest LOAD-CP of each order member (bounded by the order stage size).
#[derive(Default)]
pub struct LoadVotes {
    votes: BTreeMap<ReplicaId, (SeqNo, Digest)>,
}

impl LoadVotes {
    /// Records a vote; returns `true` when `quorum` members now name `(seqno, digest)`.
    pub fn offer(&mut self, from: ReplicaId, seqno: SeqNo, digest: Digest, quorum: usize) -> bool {
        self.votes.insert(from, (seqno, digest));
        self.votes.values().filter(|v| **v == (seqno, digest)).count() >= quorum
    }

    /// Forgets votes at or below `seqno`.
    pub fn prune_through(&mut self, seqno: SeqNo) {
        self.votes.retain(|_, (s, _)| *s > seqno);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_of_distinct_members_must_name_the_same_checkpoint() {
        let (a, b) = (Digest::of(b"a"), Digest::of(b"b"));
        let mut votes = LoadVotes::default();
        assert!(!votes.offer(ReplicaId(0), SeqNo(8), a, 2));
        assert!(!votes.offer(ReplicaId(0), SeqNo(8), a, 2), "a member counts once");
        assert!(
            !votes.offer(ReplicaId(1), SeqNo(8), b, 2),
            "a different digest does not match"
        );
        assert!(votes.offer(ReplicaId(2), SeqNo(8), a, 2));
        votes.prune_through(SeqNo(8));
        assert!(!votes.offer(ReplicaId(3), SeqNo(8), a, 2), "pruned votes are gone");
    }
}
