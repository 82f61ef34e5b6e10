//! The message log: one slot per sequence number in the window `(h, h + L]` (PBFT section 2.2).
//!
//! A slot holds what must survive a crash ([`SlotRecord`]: the accepted PRE-PREPARE, the latest
//! prepared certificate `P`, the pre-prepared claims `Q`, the commit decision) and the votes of the
//! current view, which are volatile (peers retransmit them).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::crypto::Digest;
use crate::ids::{ReplicaId, SeqNo, View};
use crate::message::{Batch, PrePreparedClaim, PreparedClaim};

/// Most pre-prepared claims (`Q` entries, one per distinct digest) kept per sequence number; the
/// claims with the lowest views are dropped first (PBFT's bound `M`, thesis 3.2.5). Safe: after a
/// batch commits at `(v, n)`, correct members only ever pre-prepare that batch at `n` in views
/// above `v`, so its claim is always among the newest.
pub(crate) const Q_CLAIMS_PER_SLOT_MAX: usize = 2;

/// A PRE-PREPARE this member accepted (or, as primary, sent).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Accepted {
    /// View of the PRE-PREPARE (or NEW-VIEW) that assigned the batch.
    pub view: View,
    /// `batch.digest()`.
    pub digest: Digest,
    /// The batch, with matrix signatures.
    pub batch: Batch,
}

/// The durable part of a slot, persisted before any message that depends on it is sent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SlotRecord {
    /// The latest accepted PRE-PREPARE.
    pub accepted: Option<Accepted>,
    /// The latest prepared certificate (the `P` entry of a VIEW-CHANGE).
    pub prepared: Option<PreparedClaim>,
    /// Pre-prepared claims, latest view per digest (the `Q` entries), at most
    /// [`Q_CLAIMS_PER_SLOT_MAX`].
    pub pre_prepared: Vec<PrePreparedClaim>,
    /// The view in which the accepted batch committed here.
    pub committed: Option<View>,
}

/// One sequence number's state.
#[derive(Clone, Debug, Default)]
pub(crate) struct Slot {
    /// Durable part.
    pub record: SlotRecord,
    /// Latest PREPARE per member (view, digest); only current-view votes are stored.
    pub prepares: BTreeMap<ReplicaId, (View, Digest)>,
    /// Latest COMMIT per member (view, digest); only current-view votes are stored.
    pub commits: BTreeMap<ReplicaId, (View, Digest)>,
    /// `H_n`, once the slot and all before it committed.
    pub history: Option<Digest>,
}

impl Slot {
    /// A slot restored from its record.
    pub fn from_record(record: SlotRecord) -> Slot {
        Slot {
            record,
            ..Slot::default()
        }
    }

    /// The accepted batch if it was accepted in `view`.
    pub fn accepted_in(&self, view: View) -> Option<&Accepted> {
        self.record.accepted.as_ref().filter(|a| a.view == view)
    }

    /// Records the acceptance of `batch` in `view` (PRE-PREPARE or NEW-VIEW) and its `Q` claim.
    pub fn accept(&mut self, seqno: SeqNo, view: View, batch: Batch) -> Digest {
        let digest = batch.digest();
        self.record.accepted = Some(Accepted { view, digest, batch });
        let claims = &mut self.record.pre_prepared;
        match claims.iter_mut().find(|c| c.digest == digest) {
            Some(claim) => claim.view = claim.view.max(view),
            None => claims.push(PrePreparedClaim { seqno, view, digest }),
        }
        claims.sort_by(|a, b| b.view.cmp(&a.view).then(a.digest.cmp(&b.digest)));
        claims.truncate(Q_CLAIMS_PER_SLOT_MAX);
        digest
    }

    /// Whether this member holds a prepared certificate for the accepted batch in `view`.
    pub fn prepared_in(&self, view: View) -> bool {
        match (&self.record.prepared, self.accepted_in(view)) {
            (Some(p), Some(a)) => p.view == view && p.digest == a.digest,
            _ => false,
        }
    }

    /// Distinct members that voted `(view, digest)` in `votes`, plus `extra` if it is not among them.
    pub fn count(
        votes: &BTreeMap<ReplicaId, (View, Digest)>,
        view: View,
        digest: Digest,
        extra: Option<ReplicaId>,
    ) -> usize {
        let matching = votes.iter().filter(|(_, v)| **v == (view, digest));
        let n = matching.clone().count();
        match extra {
            Some(member) if !matching.clone().any(|(who, _)| *who == member) => n + 1,
            _ => n,
        }
    }

    /// Forgets the votes of earlier views (on a view change).
    pub fn clear_votes(&mut self) {
        self.prepares.clear();
        self.commits.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(t: u64) -> Batch {
        Batch {
            time_us: t,
            entries: vec![],
        }
    }

    #[test]
    fn q_claims_keep_newest_view_per_digest_and_are_bounded() {
        let mut slot = Slot::default();
        let d1 = slot.accept(SeqNo(1), View(0), batch(1));
        slot.accept(SeqNo(1), View(1), batch(2));
        slot.accept(SeqNo(1), View(2), batch(1));
        slot.accept(SeqNo(1), View(3), batch(3));
        let claims = &slot.record.pre_prepared;
        assert_eq!(claims.len(), Q_CLAIMS_PER_SLOT_MAX);
        assert_eq!(claims[0].view, View(3));
        assert_eq!((claims[1].view, claims[1].digest), (View(2), d1));
        assert!(slot.accepted_in(View(3)).is_some() && slot.accepted_in(View(2)).is_none());
    }

    #[test]
    fn count_adds_extra_voter_once() {
        let mut votes = BTreeMap::new();
        let d = Digest::of(b"x");
        votes.insert(ReplicaId(1), (View(0), d));
        votes.insert(ReplicaId(2), (View(0), Digest::of(b"y")));
        assert_eq!(Slot::count(&votes, View(0), d, None), 1);
        assert_eq!(Slot::count(&votes, View(0), d, Some(ReplicaId(1))), 1);
        assert_eq!(Slot::count(&votes, View(0), d, Some(ReplicaId(0))), 2);
    }
}
