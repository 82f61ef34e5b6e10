//! Checkpoints and the stage interlock (docs/PROTOCOL.md; PBFT thesis 2.2): CP-TOKENs from the
//! execution stage, signed CHECKPOINT votes, stable certificates, watermarks and garbage
//! collection, and order state transfer (FETCH-ORDER-CP / ORDER-CP-STATE).

use crate::message::PbftMessage;
use std::collections::{BTreeMap, BTreeSet};

use super::persist;
use super::OrderStage;
use crate::config::ClusterConfig;
use crate::crypto::Digest;
use crate::crypto::KeyRing;
use crate::ids::{Principal, ReplicaId, SeqNo, StageKind};
use crate::message::{CheckpointVote, Message, OrderCheckpoint, SealFor, Signed, StableCheckpoint};
use crate::quorum::Quorums;
use crate::stage::{Action, Event, Time};

pub use crate::limits::VOTES_PER_MEMBER_MAX;

/// Checks a stable-checkpoint certificate: `checkpoint_stable` valid signed votes from distinct
/// order members for the checkpoint's `(seqno, digest)`, and a well-formed checkpoint.
pub fn verify_stable(config: &ClusterConfig, q: &Quorums, keys: &KeyRing, stable: &StableCheckpoint) -> bool {
    let cp = &stable.checkpoint;
    if cp.seqno.0 == 0
        || !cp.seqno.0.is_multiple_of(config.knobs.checkpoint_interval)
        || !super::reconfig::pending_is_valid(config, cp)
    {
        return false;
    }
    let well_formed = cp.last_ordered.len() <= config.clients.len()
        && cp.last_ordered.windows(2).all(|w| w[0].0 < w[1].0)
        && cp.last_ordered.iter().all(|(c, _)| config.client_keys(*c).is_some());
    if !well_formed {
        return false;
    }
    let expected = CheckpointVote {
        seqno: cp.seqno,
        digest: cp.digest(),
    };
    let mut signers = BTreeSet::new();
    let all_valid = stable.votes.iter().all(|vote| {
        (vote.signer.0 as usize) < q.n_order
            && vote.value == expected
            && signers.insert(vote.signer)
            && vote.verify(keys, config.knobs.sabotage).is_ok()
    });
    all_valid && signers.len() >= q.checkpoint_stable()
}

impl OrderStage {
    /// Sets the committed prefix to a stable checkpoint's state (it is ahead of ours).
    pub(super) fn reset_to_checkpoint(&mut self, stable: StableCheckpoint) {
        let cp = &stable.checkpoint;
        self.h = cp.seqno;
        self.prefix.last_committed = cp.seqno;
        self.prefix.history = cp.history;
        self.prefix.max_time = cp.time_us;
        self.prefix.last_ordered = cp.last_ordered.iter().copied().collect();
        self.prefix.pending = self.pending_for_next(cp.reconfiguration.as_deref());
        self.stable = Some(stable);
    }

    /// Votes for every checkpoint that committed here and has `checkpoint_token` matching tokens.
    pub(super) fn try_votes(&mut self, now: Time, out: &mut Vec<Action>) {
        let candidates: Vec<SeqNo> = self
            .checkpoints
            .tokens
            .seqnos()
            .filter(|n| *n > self.h && *n <= self.prefix.last_committed && !self.checkpoints.own.contains_key(n))
            .collect();
        for seqno in candidates {
            let Some(exec_state) = self.checkpoints.tokens.certified(seqno, self.q.checkpoint_token()) else {
                continue;
            };
            let Some(snapshot) = self.prefix.snapshots.get(&seqno) else {
                continue;
            };
            let checkpoint = OrderCheckpoint {
                seqno,
                history: snapshot.history,
                time_us: snapshot.time_us,
                exec_state,
                last_ordered: snapshot.last_ordered.clone(),
                reconfiguration: snapshot.pending.clone().map(Box::new),
            };
            let vote = Signed::sign(
                &self.keys,
                self.id,
                CheckpointVote {
                    seqno,
                    digest: checkpoint.digest(),
                },
            );
            persist::write(out, persist::checkpoint_key(seqno), &(checkpoint.clone(), vote.clone()));
            self.send(
                out,
                self.other_order_members(),
                Message::Pbft(PbftMessage::Checkpoint(vote.clone())),
                SealFor::Nothing,
            );
            self.checkpoints.own.insert(seqno, (checkpoint, vote.clone()));
            self.checkpoints.votes.entry(seqno).or_default().insert(self.id, vote);
            self.stats.bump("checkpoint_vote_sent");
            self.check_stable(now, seqno, out);
        }
    }

    pub(super) fn on_checkpoint_vote(
        &mut self,
        now: Time,
        from: ReplicaId,
        vote: &Signed<CheckpointVote>,
        out: &mut Vec<Action>,
    ) {
        let seqno = vote.value.seqno;
        if (vote.signer.0 as usize) >= self.q.n_order
            || seqno.0 == 0
            || !seqno.0.is_multiple_of(self.config.knobs.checkpoint_interval)
        {
            return self.stats.bump("drop_bad_checkpoint_vote");
        }
        if self.handover.is_some() && self.on_handover_vote(now, vote, out) {
            return self.stats.bump("handover_vote");
        }
        if seqno <= self.h {
            self.stats.bump("drop_old_checkpoint_vote");
            // The signer, not the envelope's sender: a member handing over to this configuration
            // signs as its member there.
            let _ = from;
            return self.help_lagging(now, vote.signer, out);
        }
        if self.checkpoints.votes.get(&seqno).and_then(|v| v.get(&vote.signer)) == Some(vote) {
            return self.stats.bump("dup_checkpoint_vote");
        }
        if vote.verify(&self.keys, self.sabotage()).is_err() {
            self.help_previous_epoch(now, Principal::Order(from), out);
            return self.stats.bump("drop_bad_signature");
        }
        let held: Vec<SeqNo> = self
            .checkpoints
            .votes
            .iter()
            .filter(|(_, v)| v.contains_key(&vote.signer))
            .map(|(n, _)| *n)
            .collect();
        if held.len() >= VOTES_PER_MEMBER_MAX && !held.contains(&seqno) {
            let lowest = held[0];
            if lowest > seqno {
                return self.stats.bump("drop_checkpoint_vote_over_bound");
            }
            self.checkpoints.votes.get_mut(&lowest).map(|v| v.remove(&vote.signer));
        }
        self.checkpoints
            .votes
            .entry(seqno)
            .or_default()
            .insert(vote.signer, vote.clone());
        self.check_stable(now, seqno, out);
    }

    /// A checkpoint with `checkpoint_stable` matching votes becomes stable; if this member does not
    /// hold it (it has not committed that far), it fetches it.
    fn check_stable(&mut self, now: Time, seqno: SeqNo, out: &mut Vec<Action>) {
        let Some(votes) = self.checkpoints.votes.get(&seqno) else {
            return;
        };
        let mut by_digest: BTreeMap<Digest, Vec<&Signed<CheckpointVote>>> = BTreeMap::new();
        for vote in votes.values() {
            by_digest.entry(vote.value.digest).or_default().push(vote);
        }
        let Some((digest, votes)) = by_digest
            .into_iter()
            .find(|(_, v)| v.len() >= self.q.checkpoint_stable())
        else {
            return;
        };
        match self.checkpoints.own.get(&seqno) {
            Some((checkpoint, _)) if checkpoint.digest() == digest => {
                let stable = StableCheckpoint {
                    checkpoint: checkpoint.clone(),
                    votes: votes.into_iter().cloned().collect(),
                };
                self.adopt_stable(now, stable, out);
            }
            own => {
                if own.is_some() {
                    self.stats.bump("own_checkpoint_differs_from_stable");
                }
                if self.checkpoints.fetching.is_some_and(|(n, _)| n >= seqno) {
                    return;
                }
                self.checkpoints.fetching = Some((seqno, digest));
                let voters: Vec<Principal> = votes
                    .iter()
                    .filter(|v| v.signer != self.id)
                    .map(|v| Principal::Order(v.signer))
                    .collect();
                self.stats.bump("order_checkpoint_fetch");
                let message = Message::Pbft(PbftMessage::FetchOrderCheckpoint { seqno, digest });
                self.send(out, voters, message, SealFor::Stage(StageKind::Order));
            }
        }
    }

    /// Makes `stable` (verified, above `h`) this member's stable checkpoint: persists it, jumps
    /// the committed prefix if it is ahead, discards the log below it and advances the watermarks.
    pub(super) fn adopt_stable(&mut self, now: Time, stable: StableCheckpoint, out: &mut Vec<Action>) {
        let seqno = stable.checkpoint.seqno;
        if seqno <= self.h {
            return;
        }
        // The held-back NEXT-BATCHes of the slots about to be discarded go now (afterwards an
        // execution member would need the whole checkpoint instead).
        self.send_owed_next_batches(now, seqno.next(), out);
        persist::write(out, persist::STABLE_KEY.to_string(), &stable);
        if seqno > self.prefix.last_committed {
            self.stats.bump("order_state_transferred");
            self.reset_to_checkpoint(stable);
            self.tell_auth_last_ordered(out);
        } else {
            let own = self.log.get(&seqno).and_then(|s| s.history);
            if own.is_some_and(|h| h != stable.checkpoint.history) {
                self.stats.bump("own_history_differs_from_stable");
            }
            self.h = seqno;
            self.stable = Some(stable);
        }
        let keep_from = seqno.next();
        let dropped = std::mem::take(&mut self.log);
        let (old, kept): (BTreeMap<_, _>, BTreeMap<_, _>) = dropped.into_iter().partition(|(n, _)| *n < keep_from);
        self.log = kept;
        for (n, slot) in &old {
            persist::delete(out, persist::slot_key(*n));
            if slot.record.prepared.is_some() || slot.record.committed.is_some() {
                persist::delete(out, persist::mark_key(*n));
            }
        }
        self.buffered = self.buffered.split_off(&keep_from);
        self.checkpoints.tokens.prune_below(keep_from);
        self.checkpoints.votes = self.checkpoints.votes.split_off(&keep_from);
        self.prefix.snapshots = self.prefix.snapshots.split_off(&keep_from);
        self.next_batch_owed = self.next_batch_owed.split_off(&keep_from);
        let own = self.checkpoints.own.split_off(&keep_from);
        for n in std::mem::replace(&mut self.checkpoints.own, own).keys() {
            persist::delete(out, persist::checkpoint_key(*n));
        }
        if self.checkpoints.fetching.is_some_and(|(n, _)| n <= seqno) {
            self.checkpoints.fetching = None;
        }
        let clients: Vec<_> = self.pool.clients().collect();
        for client in clients {
            self.pool.gc(client, self.last_ordered_of(client));
        }
        out.push(Action::Note(Event::CheckpointStable { seqno }));
        self.advance_commits(now, out);
        if !self.changing {
            self.drain_buffer(now, out);
        }
        self.check_boundary(now, out);
    }

    pub(super) fn on_fetch_checkpoint(
        &mut self,
        from: ReplicaId,
        seqno: SeqNo,
        _digest: Digest,
        out: &mut Vec<Action>,
    ) {
        match &self.stable {
            Some(stable) if stable.checkpoint.seqno >= seqno => {
                self.stats.bump("order_checkpoint_served");
                let message = Message::Pbft(PbftMessage::OrderCheckpointState(stable.clone()));
                self.send(out, vec![Principal::Order(from)], message, SealFor::Nothing);
            }
            _ => self.stats.bump("order_checkpoint_unavailable"),
        }
    }

    pub(super) fn on_checkpoint_state(&mut self, now: Time, stable: &StableCheckpoint, out: &mut Vec<Action>) {
        if self.handover.is_some() && self.on_handover_certificate(now, stable, out) {
            return self.stats.bump("handover_certificate");
        }
        if self.leaving.is_some() && self.on_leaving_certificate(stable, out) {
            return;
        }
        if stable.checkpoint.seqno <= self.h {
            return self.stats.bump("drop_old_checkpoint_state");
        }
        if !verify_stable(&self.config, &self.q, &self.keys, stable) {
            if self.on_joining_certificate(now, stable, out) {
                return;
            }
            return self.stats.bump("drop_bad_stable_certificate");
        }
        self.adopt_stable(now, stable.clone(), out);
    }

    /// OrderTick: resend own votes above `h` and any pending order-checkpoint fetch.
    pub(super) fn retransmit_checkpoint(&self, out: &mut Vec<Action>) {
        for (_, vote) in self.checkpoints.own.values() {
            self.send(
                out,
                self.other_order_members(),
                Message::Pbft(PbftMessage::Checkpoint(vote.clone())),
                SealFor::Nothing,
            );
        }
        if let Some((seqno, digest)) = self.checkpoints.fetching {
            let message = Message::Pbft(PbftMessage::FetchOrderCheckpoint { seqno, digest });
            self.send(
                out,
                self.other_order_members(),
                message,
                SealFor::Stage(StageKind::Order),
            );
        }
    }
}
