//! Retransmission and help after losses: the primary resends PRE-PREPAREs to members that have
//! not committed, members help a lagging peer with the slots it misses or the stable checkpoint.

use super::OrderStage;
use crate::crypto::Digest;
use crate::ids::{Principal, ReplicaId, SeqNo, StageKind, View};
use crate::message::PbftMessage;
use crate::message::{Message, SealFor};
use crate::stage::{Action, Time};

impl OrderStage {
    // ---- retransmission and help ----

    /// OrderTick in an installed view: the primary resends PRE-PREPAREs to members whose COMMIT it
    /// has not seen; everyone resends PREPARE / COMMIT for slots not committed here.
    pub(super) fn retransmit_agreement(&self, out: &mut Vec<Action>) {
        let view = self.view;
        let primary = self.is_primary();
        for (&seqno, slot) in self.log.range(self.h.next()..) {
            let Some(accepted) = slot.accepted_in(view) else {
                continue;
            };
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
            let message = Message::Pbft(PbftMessage::NewView(
                self.view_change.new_view.clone().expect("checked"),
            ));
            self.send(out, vec![Principal::Order(from)], message, SealFor::Nothing);
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
