//! Retransmission and help after losses: the primary resends PRE-PREPAREs to members that have
//! not committed, members help a lagging peer with the slots it misses or the stable checkpoint.

use super::OrderStage;
use crate::crypto::Digest;
use crate::ids::{Principal, ReplicaId, SeqNo, StageKind, View};
use crate::message::PbftMessage;
use crate::message::{Message, SealFor};
use crate::stage::{Action, Time};

/// Agreement messages kept per sender for a view not yet installed here: PRE-PREPAREs,
/// PREPAREs and COMMITs for a few log windows of batches.
pub(super) const EARLY_PER_SENDER_MAX: usize = 256;

impl OrderStage {
    // ---- retransmission and help ----

    /// OrderTick in an installed view: the primary resends PRE-PREPAREs to members whose COMMIT it
    /// has not seen; everyone resends PREPARE / COMMIT for slots not committed here. Slots accepted
    /// here less than the primary-help hold ago are still in flight and are left alone: a resent
    /// PREPARE tells a member that committed the slot that this one is stuck on it
    /// (`help_primary_prepare`).
    pub(super) fn retransmit_agreement(&self, now: Time, out: &mut Vec<Action>) {
        let view = self.view;
        let primary = self.is_primary();
        let settled = now.saturating_sub(self.primary_help_hold());
        for (&seqno, slot) in self.log.range(self.h.next()..) {
            let Some(accepted) = slot.accepted_in(view) else {
                continue;
            };
            if slot.accepted_at > settled || self.speculative_seqno(seqno) {
                // A fast phase's slots have their own retransmission (`retransmit_chain`), or
                // none (Quorum: the phase aborts).
                continue;
            }
            let digest = accepted.digest;
            if primary {
                let missing: Vec<Principal> = self
                    .other_order_members()
                    .into_iter()
                    .filter(|p| {
                        p.replica()
                            .is_some_and(|r| slot.commits.get(&r) != Some(&(view, digest)))
                    })
                    .collect();
                let message = Message::Pbft(PbftMessage::PrePrepare {
                    view,
                    seqno,
                    batch: accepted.batch.clone(),
                });
                self.send(out, missing, message, SealFor::Stage(StageKind::Order));
            } else if seqno > self.prefix.last_committed {
                self.send_to_order(out, Message::Pbft(PbftMessage::Prepare { view, seqno, digest }));
            }
            if seqno > self.prefix.last_committed && slot.prepared_in(view) {
                self.send_to_order(out, Message::Pbft(PbftMessage::Commit { view, seqno, digest }));
            }
        }
    }

    /// A member retransmitted agreement messages for a slot committed here: send it our COMMIT.
    pub(super) fn help_slot(&self, to: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) {
        let Some(slot) = self.log.get(&seqno) else { return };
        if slot.record.committed.is_none() || !slot.prepared_in(self.view) {
            return;
        }
        if let Some(accepted) = slot.accepted_in(self.view) {
            let message = Message::Pbft(PbftMessage::Commit {
                view: self.view,
                seqno,
                digest: accepted.digest,
            });
            let to = Principal::Order(to);
            self.send(out, vec![to], message, SealFor::Stage(StageKind::Order));
        }
    }

    /// A message of another view: drop it; a member still in an older view gets our NEW-VIEW.
    pub(super) fn wrong_view(&mut self, now: Time, from: ReplicaId, view: View, out: &mut Vec<Action>) {
        self.stats.bump("drop_wrong_view");
        if !self.changing && view < self.view && self.view_change.new_view.is_some() && self.may_help(now, from) {
            self.relay_new_view(from, out);
        }
    }

    /// Whether an agreement message of `view`, which this member cannot handle yet, is worth
    /// keeping: `view` is the one it is changing to, or the next one (the sender installed it
    /// first). Otherwise it is refused as from the wrong view.
    pub(super) fn early_wanted(&self, view: View) -> bool {
        if self.changing {
            view == self.view
        } else {
            view == self.view.next()
        }
    }

    /// Keeps an agreement message that [`OrderStage::early_wanted`] for when its view is
    /// installed.
    pub(super) fn keep_early(&mut self, from: ReplicaId, message: PbftMessage) {
        let queue = self.early.entry(from).or_default();
        if queue.len() >= EARLY_PER_SENDER_MAX {
            queue.pop_front();
            self.stats.bump("early_dropped_oldest");
        }
        queue.push_back(message);
        self.stats.bump("early_kept");
    }

    /// A view was just installed: handles the kept messages of it, keeps those of a later view
    /// that is still wanted, forgets the others.
    pub(super) fn replay_early(&mut self, now: Time, out: &mut Vec<Action>) {
        let view = self.view;
        for (from, queue) in std::mem::take(&mut self.early) {
            for message in queue {
                let v = match &message {
                    PbftMessage::PrePrepare { view, .. }
                    | PbftMessage::Prepare { view, .. }
                    | PbftMessage::Commit { view, .. } => *view,
                    _ => continue,
                };
                if v != view {
                    if v > view && self.early_wanted(v) {
                        self.keep_early(from, message);
                    }
                    continue;
                }
                self.stats.bump("early_handled");
                match message {
                    PbftMessage::PrePrepare { seqno, batch, .. } => {
                        self.on_pre_prepare(now, from, v, seqno, &batch, out)
                    }
                    PbftMessage::Prepare { seqno, digest, .. } => self.on_prepare(now, from, v, seqno, digest, out),
                    PbftMessage::Commit { seqno, digest, .. } => self.on_commit(now, from, v, seqno, digest, out),
                    _ => {}
                }
            }
        }
    }

    /// A member sent something at or below our stable checkpoint: send it the certificate.
    pub(super) fn help_lagging(&mut self, now: Time, to: ReplicaId, out: &mut Vec<Action>) {
        if self.stable.is_some() && to != self.id && self.may_help(now, to) {
            let message = Message::Pbft(PbftMessage::OrderCheckpointState(self.stable.clone().expect("checked")));
            self.send(out, vec![Principal::Order(to)], message, SealFor::Nothing);
        }
    }

    /// A member works beyond our window: we are behind; ask it for its stable checkpoint.
    pub(super) fn ask_for_stable(&mut self, from: ReplicaId, out: &mut Vec<Action>) {
        if self.checkpoints.fetching.is_some() {
            return;
        }
        let seqno = self.h.next();
        self.checkpoints.fetching = Some((seqno, Digest::default()));
        let message = Message::Pbft(PbftMessage::FetchOrderCheckpoint {
            seqno,
            digest: Digest::default(),
        });
        self.send(
            out,
            vec![Principal::Order(from)],
            message,
            SealFor::Stage(StageKind::Order),
        );
    }
}
