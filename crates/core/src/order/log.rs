//! The message log: one slot per sequence number in the window `(h, h + L]` (PBFT section 2.2).
//!
//! A slot holds what must survive a crash ([`SlotRecord`]: the accepted PRE-PREPARE, the latest
//! prepared certificate `P`, the pre-prepared claims `Q`, the commit decision) and the votes of the
//! current view, which are volatile (peers retransmit them).
//!
//! The record is written whole only when a batch is accepted; the later changes of the normal case
//! (prepared, committed) are written as a small [`SlotMark`] that recovery merges into the record
//! ([`SlotRecord::merge`]), so a batch with its matrix signatures is serialised once per slot.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::crypto::Digest;
use crate::ids::{ReplicaId, SeqNo, View};
use crate::message::{Batch, PrePreparedClaim, PreparedClaim, SpeculativeClaim};
use crate::stage::Time;

/// A mark that does not fit the record it is merged into (recovery treats it as corrupt storage).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MarkMismatch;

pub(crate) use crate::limits::Q_CLAIMS_PER_SLOT_MAX;

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

/// A fast phase's claim on a slot (Quorum's speculative execution, Chain's acceptance): the
/// [`SpeculativeClaim`] a VIEW-CHANGE reports, with the batch kept only while it is not the
/// accepted one (so a Chain phase writes each batch once per slot).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SpeculativeRecord {
    /// View of the fast phase.
    pub view: View,
    /// The member's history digest after the batch.
    pub history: Digest,
    /// `batch.digest()`.
    pub digest: Digest,
    /// The batch, only while a later view accepted another one here; `None` means the accepted
    /// batch, which then has `digest`.
    pub batch: Option<Batch>,
}

/// The latest prepared certificate of a slot (the `P` entry of a VIEW-CHANGE).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Prepared {
    /// View in which the batch prepared.
    pub view: View,
    /// Its digest.
    pub digest: Digest,
    /// The batch, only while it is not the accepted one (a later view accepted another batch at
    /// this seqno); `None` means the accepted batch, which then has `digest`.
    pub batch: Option<Batch>,
}

/// The durable part of a slot, persisted before any message that depends on it is sent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SlotRecord {
    /// The latest accepted PRE-PREPARE.
    pub accepted: Option<Accepted>,
    /// The latest prepared certificate (the `P` entry of a VIEW-CHANGE).
    pub prepared: Option<Prepared>,
    /// Pre-prepared claims, latest view per digest (the `Q` entries), at most
    /// [`Q_CLAIMS_PER_SLOT_MAX`].
    pub pre_prepared: Vec<PrePreparedClaim>,
    /// The view in which the accepted batch committed here.
    pub committed: Option<View>,
    /// The batch this member executed speculatively here in a Quorum phase, or accepted in a
    /// Chain phase, the latest such view: reported in VIEW-CHANGEs until the slot leaves the log.
    #[serde(default)]
    pub speculative: Option<SpeculativeRecord>,
}

/// The normal case's changes to a slot after its batch was accepted, persisted under their own key
/// so the batch is not written again: the prepared certificate and the commit decision, each with
/// the digest of the accepted batch it is about.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SlotMark {
    /// `(view, digest)` of the latest prepared certificate.
    pub prepared: Option<(View, Digest)>,
    /// `(view, digest)` of the commit decision.
    pub committed: Option<(View, Digest)>,
}

impl SlotRecord {
    /// The mark describing this record's prepared certificate and commit decision.
    pub fn mark(&self) -> SlotMark {
        SlotMark {
            prepared: self.prepared.as_ref().map(|p| (p.view, p.digest)),
            committed: self.commit_vote(),
        }
    }

    /// `(view, digest)` of the commit decision: the view it committed in and the accepted batch's
    /// digest, as a matching COMMIT carries them.
    pub fn commit_vote(&self) -> Option<(View, Digest)> {
        self.committed.zip(self.accepted.as_ref().map(|a| a.digest))
    }

    /// Merges a mark read back from storage. A mark is written after the record it refers to, and
    /// the record is rewritten whole (with everything the mark says) whenever another batch is
    /// accepted; so a mark newer than the record refers to the record's accepted batch, and an
    /// older one says nothing the record does not. Anything else is a corrupted store.
    pub fn merge(&mut self, mark: SlotMark) -> Result<(), MarkMismatch> {
        let accepted = self.accepted.as_ref().map(|a| a.digest);
        if let Some((view, digest)) = mark.prepared {
            if self.prepared.as_ref().is_none_or(|p| p.view < view) {
                if accepted != Some(digest) {
                    return Err(MarkMismatch);
                }
                self.prepared = Some(Prepared {
                    view,
                    digest,
                    batch: None,
                });
            }
        }
        if let Some((view, digest)) = mark.committed {
            if self.committed.is_none() {
                if accepted != Some(digest) {
                    return Err(MarkMismatch);
                }
                self.committed = Some(view);
            }
        }
        Ok(())
    }

    /// The prepared certificate as a VIEW-CHANGE's `P` entry.
    /// The speculative claim of the slot at `seqno`, as a VIEW-CHANGE reports it.
    pub fn speculative_claim(&self, seqno: SeqNo) -> Option<SpeculativeClaim> {
        let s = self.speculative.as_ref()?;
        let batch = match &s.batch {
            Some(batch) => batch.clone(),
            None => {
                let accepted = self
                    .accepted
                    .as_ref()
                    .expect("a claimed slot without its own batch accepted one");
                assert_eq!(accepted.digest, s.digest, "claimed batch is the accepted one");
                accepted.batch.clone()
            }
        };
        Some(SpeculativeClaim {
            seqno,
            view: s.view,
            history: s.history,
            batch,
        })
    }

    pub fn prepared_claim(&self, seqno: SeqNo) -> Option<PreparedClaim> {
        let p = self.prepared.as_ref()?;
        let batch = match &p.batch {
            Some(batch) => batch.clone(),
            None => {
                let accepted = self
                    .accepted
                    .as_ref()
                    .expect("a prepared slot without its own batch accepted one");
                assert_eq!(accepted.digest, p.digest, "prepared batch is the accepted one");
                accepted.batch.clone()
            }
        };
        Some(PreparedClaim {
            seqno,
            view: p.view,
            digest: p.digest,
            batch,
        })
    }
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
    /// Distinct batches the current view's primary proposed for this slot, as this member
    /// received them (volatile; kept under `Sabotage::CountProposalsTwice` only).
    pub proposals: BTreeSet<Digest>,
    /// When this member accepted the batch in the normal case (volatile; 0 for a batch from a
    /// NEW-VIEW or the log): the tick retransmits only slots older than the primary-help hold.
    pub accepted_at: Time,
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
        self.accept_digested(seqno, view, batch, digest);
        digest
    }

    /// [`Slot::accept`] with `digest == batch.digest()` already computed by the caller.
    pub fn accept_digested(&mut self, seqno: SeqNo, view: View, batch: Batch, digest: Digest) {
        debug_assert_eq!(batch.digest(), digest);
        let replaced = self.record.accepted.replace(Accepted { view, digest, batch });
        // The speculative claim keeps the batch it is about (a copy, if the prepared
        // certificate keeps it too).
        if let Some(s) = &mut self.record.speculative {
            if s.digest == digest {
                s.batch = None;
            } else if s.batch.is_none() {
                let old = replaced
                    .as_ref()
                    .expect("a claimed slot without its own batch accepted one");
                assert_eq!(old.digest, s.digest, "claimed batch is the accepted one");
                s.batch = Some(old.batch.clone());
            }
        }
        if let Some(p) = &mut self.record.prepared {
            if p.digest == digest {
                p.batch = None;
            } else if p.batch.is_none() {
                // The prepared certificate keeps the batch it is about.
                let old = replaced.expect("a prepared slot without its own batch accepted one");
                assert_eq!(old.digest, p.digest, "prepared batch is the accepted one");
                p.batch = Some(old.batch);
            }
        }
        let claims = &mut self.record.pre_prepared;
        match claims.iter_mut().find(|c| c.digest == digest) {
            Some(claim) => claim.view = claim.view.max(view),
            None => claims.push(PrePreparedClaim { seqno, view, digest }),
        }
        claims.sort_by(|a, b| b.view.cmp(&a.view).then(a.digest.cmp(&b.digest)));
        claims.truncate(Q_CLAIMS_PER_SLOT_MAX);
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
        self.proposals.clear();
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

    /// A fast phase's claim names the accepted batch (written once); a later view that accepts
    /// another batch at the slot moves a copy into the claim, which a VIEW-CHANGE then reports
    /// unchanged, and accepting the claimed batch again drops the copy.
    #[test]
    fn a_speculative_claim_keeps_its_batch_when_another_is_accepted() {
        let mut slot = Slot::default();
        let d1 = slot.accept(SeqNo(4), View(1), batch(1));
        slot.record.speculative = Some(SpeculativeRecord {
            view: View(1),
            history: Digest::of(b"h"),
            digest: d1,
            batch: None,
        });
        let claim = slot.record.speculative_claim(SeqNo(4)).unwrap();
        assert_eq!((claim.seqno, claim.view, claim.batch.digest()), (SeqNo(4), View(1), d1));
        prepare(&mut slot, View(1));
        slot.accept(SeqNo(4), View(2), batch(2));
        assert_eq!(slot.record.speculative.as_ref().unwrap().batch, Some(batch(1)));
        assert_eq!(slot.record.speculative_claim(SeqNo(4)).unwrap(), claim);
        assert_eq!(slot.record.prepared_claim(SeqNo(4)).unwrap().digest, d1);
        slot.accept(SeqNo(4), View(3), batch(1));
        assert_eq!(slot.record.speculative.as_ref().unwrap().batch, None);
        assert_eq!(slot.record.speculative_claim(SeqNo(4)).unwrap(), claim);
    }

    fn prepare(slot: &mut Slot, view: View) {
        let digest = slot.record.accepted.as_ref().unwrap().digest;
        slot.record.prepared = Some(Prepared {
            view,
            digest,
            batch: None,
        });
    }

    #[test]
    fn prepared_certificate_keeps_its_batch_when_another_is_accepted() {
        let mut slot = Slot::default();
        let d1 = slot.accept(SeqNo(4), View(1), batch(1));
        prepare(&mut slot, View(1));
        assert_eq!(slot.record.prepared_claim(SeqNo(4)).unwrap().batch, batch(1));
        // A later view accepts another batch: the certificate keeps batch 1.
        slot.accept(SeqNo(4), View(2), batch(2));
        let claim = slot.record.prepared_claim(SeqNo(4)).unwrap();
        assert_eq!((claim.view, claim.digest, claim.batch), (View(1), d1, batch(1)));
        // Batch 1 accepted again: the certificate refers to the accepted batch once more.
        slot.accept(SeqNo(4), View(3), batch(1));
        assert_eq!(slot.record.prepared.as_ref().unwrap().batch, None);
        assert_eq!(slot.record.prepared_claim(SeqNo(4)).unwrap().batch, batch(1));
    }

    #[test]
    fn marks_merge_into_the_record_they_follow() {
        let mut slot = Slot::default();
        slot.accept(SeqNo(1), View(0), batch(1));
        let written = slot.record.clone();
        // Crash after the record, before any mark: nothing prepared or committed.
        assert_eq!(written.mark(), SlotMark::default());
        prepare(&mut slot, View(0));
        let prepared_mark = slot.record.mark();
        slot.record.committed = Some(View(0));
        let committed_mark = slot.record.mark();
        for (mark, prepared, committed) in [(prepared_mark, true, false), (committed_mark, true, true)] {
            let mut recovered = written.clone();
            recovered.merge(mark).unwrap();
            assert_eq!(recovered.prepared.is_some(), prepared);
            assert_eq!(recovered.committed, committed.then_some(View(0)));
        }
        let mut recovered = written.clone();
        recovered.merge(committed_mark).unwrap();
        assert_eq!(recovered, slot.record);
        // A stale mark (older than a rewritten record) changes nothing.
        slot.accept(SeqNo(1), View(1), batch(2));
        let rewritten = slot.record.clone();
        let mut recovered = rewritten.clone();
        recovered.merge(prepared_mark).unwrap();
        assert_eq!(recovered, rewritten);
        // A mark about a batch the record never accepted is corruption.
        let mut other = Slot::default();
        other.accept(SeqNo(1), View(0), batch(3));
        assert_eq!(other.record.clone().merge(prepared_mark), Err(MarkMismatch));
        assert_eq!(SlotRecord::default().merge(committed_mark), Err(MarkMismatch));
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
