//! CP-TOKEN collection on the order side: the execution state an order checkpoint certifies is
//! the one `q.checkpoint_token()` distinct execution members name (at least one of them
//! correct); a member's first token for a sequence number counts, later ones do not.

use std::collections::BTreeMap;

use crate::crypto::Digest;
use crate::ids::{ReplicaId, SeqNo};

/// Tokens per checkpoint sequence number. The caller bounds the sequence numbers it offers (the
/// order stage: its watermark window) and prunes below its stable checkpoint.
#[derive(Default)]
pub struct TokenTally {
    tokens: BTreeMap<SeqNo, BTreeMap<ReplicaId, Digest>>,
}

impl TokenTally {
    /// Records execution member `from`'s token for `seqno` (its first one only).
    pub fn offer(&mut self, from: ReplicaId, seqno: SeqNo, exec_state: Digest) {
        self.tokens.entry(seqno).or_default().entry(from).or_insert(exec_state);
    }

    /// The sequence numbers with at least one token, ascending.
    pub fn seqnos(&self) -> impl Iterator<Item = SeqNo> + '_ {
        self.tokens.keys().copied()
    }

    /// The execution state `quorum` tokens for `seqno` agree on, if any.
    pub fn certified(&self, seqno: SeqNo, quorum: usize) -> Option<Digest> {
        let mut counts: BTreeMap<Digest, usize> = BTreeMap::new();
        for digest in self.tokens.get(&seqno)?.values() {
            *counts.entry(*digest).or_default() += 1;
        }
        counts.into_iter().find(|(_, c)| *c >= quorum).map(|(d, _)| d)
    }

    /// Forgets the tokens below `keep_from`.
    pub fn prune_below(&mut self, keep_from: SeqNo) {
        self.tokens = self.tokens.split_off(&keep_from);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_tokens_from_distinct_members_certify_a_state_and_first_tokens_count() {
        let (good, bad) = (Digest::of(b"good"), Digest::of(b"bad"));
        let mut tally = TokenTally::default();
        tally.offer(ReplicaId(0), SeqNo(8), bad);
        tally.offer(ReplicaId(0), SeqNo(8), good);
        tally.offer(ReplicaId(1), SeqNo(8), good);
        assert_eq!(
            tally.certified(SeqNo(8), 2),
            None,
            "member 0's second token does not count"
        );
        tally.offer(ReplicaId(2), SeqNo(8), good);
        assert_eq!(tally.certified(SeqNo(8), 2), Some(good));
        assert_eq!(tally.certified(SeqNo(16), 1), None);
        tally.offer(ReplicaId(1), SeqNo(16), good);
        assert_eq!(tally.seqnos().collect::<Vec<_>>(), [SeqNo(8), SeqNo(16)]);
        tally.prune_below(SeqNo(16));
        assert_eq!(tally.seqnos().collect::<Vec<_>>(), [SeqNo(16)]);
    }
}
