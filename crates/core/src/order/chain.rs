//! Aliph's Chain over PBFT views (`protocol = "chain"`; Quéma ch. 3, notes 1.5, 1.10;
//! docs/PROTOCOL.md "Chain").
//!
//! Each view starts with Aliph's Backup, exactly as under Quorum (`quorum.rs`): the three-phase
//! path orders the NEW-VIEW's batches and `k` more, up to `fast_from`. A member that committed
//! through `fast_from` is in the view's Chain phase. The view's order members form a chain, its
//! primary at position 0 (the head) and the others in member order after it. The head batches
//! ready requests as a PBFT primary does and accepts each batch at the next sequence number at
//! once; every member that accepts a batch hands it to its successor in a CHAIN message (its
//! vote for the successor) and sends a COMMIT (its vote) to the rest of its successor set:
//! the `r + 1` members after it, and every member when it is one of the last `r + 1` (the
//! committers). A member accepts a batch from its predecessor in sequence once every member of
//! its predecessor set (the `r + 1` before it) voted for it: at least one of them is correct,
//! and by induction every correct member before it accepted the same batch after the same
//! history (Aliph's chain authenticators, with the predecessor set's MACs arriving as one
//! point-to-point COMMIT each). A member commits a batch on the votes of all `r + 1`
//! committers: one of them is correct, so every correct member accepted it, and the
//! view change keeps it (the accepted batch is the member's [`SpeculativeClaim`], selected as
//! under Quorum). Execution and client replies are those of a committed batch.
//!
//! The chain stops where a member is down, lies or votes for another batch: nothing commits,
//! and PBFT's view-change timer and the Aardvark watch on the primary (both on in this phase)
//! end the view; the next view's Backup phase orders what was waiting.

use std::collections::BTreeMap;

use super::log::SpeculativeRecord;
use super::persist;
use super::OrderStage;
use crate::config::{OrderProtocol, Sabotage};
use crate::crypto::Digest;
use crate::ids::{Principal, ReplicaId, SeqNo, StageKind, View};
use crate::message::{history_digest, Batch, FastPhase, Message, PbftMessage, SealFor};
use crate::stage::{Action, Time};

/// CHAIN messages received ahead of the next sequence number to accept, by sequence number:
/// the batch and the view it was sent in (at most one log window of them).
pub(super) type ChainPending = BTreeMap<SeqNo, (View, Batch)>;

/// A batch accepted in a Chain phase may wait `view_change_timeout_us / CHAIN_STALL_FRACTION`
/// (500 ms by default) for the committers' votes before the member ends the view
/// (`check_chain_stall`): half of what PBFT's timer would cost every Chain phase while a member
/// is down. Measured with a fifth of it (100 ms, five commit timeouts): under 4 KiB requests from
/// 256 clients the first batches waited longer than that, and the view changes it started
/// stalled the cluster in 1 of 3 runs (docs/PERFORMANCE.md "Session 39").
pub const CHAIN_STALL_FRACTION: u64 = 2;

impl OrderStage {
    /// Whether the current view's fast phase is Chain (`protocol = "chain"`, or `"aliph"` in
    /// such a view).
    pub(super) fn chain_protocol(&self) -> bool {
        self.speculation.mode == FastPhase::Chain
    }

    /// Whether this member is in the current view's Chain phase.
    pub(super) fn chaining(&self) -> bool {
        self.chain_protocol() && self.speculating()
    }

    /// Position of member `id` in the chain of `view` (0: the head, the view's primary).
    pub(super) fn chain_position(&self, view: View, id: ReplicaId) -> usize {
        let n = self.q.n_order;
        (id.0 as usize + n - self.primary_of(view).0 as usize) % n
    }

    /// The member at `position` of the chain of `view`.
    fn chain_member(&self, view: View, position: usize) -> ReplicaId {
        let n = self.q.n_order;
        ReplicaId(((self.primary_of(view).0 as usize + position) % n) as u32)
    }

    /// Whether `position` is one of the last `r + 1` (the committers, whose votes go to every
    /// member).
    fn chain_committer(&self, position: usize) -> bool {
        position + self.q.r + 1 >= self.q.n_order
    }

    /// The members whose COMMIT a member at `position` needs, besides its predecessor's CHAIN,
    /// to accept a batch: the rest of its predecessor set (the `r + 1` positions before it).
    fn chain_vouchers(&self, view: View, position: usize) -> Vec<ReplicaId> {
        let first = position.saturating_sub(self.q.r + 1);
        (first..position.saturating_sub(1))
            .map(|p| self.chain_member(view, p))
            .collect()
    }

    /// Where the COMMIT of a member at `position` goes: every other member from a committer,
    /// else the rest of its successor set (the `r + 1` positions after it; the next gets the
    /// CHAIN).
    fn chain_vote_recipients(&self, view: View, position: usize) -> Vec<Principal> {
        let n = self.q.n_order;
        let positions: Vec<usize> = if self.chain_committer(position) {
            (0..n).filter(|&p| p != position && p != position + 1).collect()
        } else {
            (position + 2..=(position + self.q.r + 1).min(n - 1)).collect()
        };
        positions
            .into_iter()
            .map(|p| Principal::Order(self.chain_member(view, p)))
            .collect()
    }

    /// Whether the committers of `view` all voted `digest` for `slot`'s sequence number.
    pub(super) fn chain_committed(
        &self,
        view: View,
        digest: Digest,
        commits: &BTreeMap<ReplicaId, (View, Digest)>,
    ) -> bool {
        let n = self.q.n_order;
        (n - self.q.r - 1..n).all(|p| commits.get(&self.chain_member(view, p)) == Some(&(view, digest)))
    }

    /// Accepts `batch` (digest `digest`, validated) at `seqno`, the next sequence number, in the
    /// current view's Chain phase: claims it, writes the slot synchronously (a committer's vote
    /// may make a client's reply, and the claim must survive a restart of every member), and
    /// votes. `predecessor`: the member whose CHAIN it came in (its vote); `None` at the head.
    pub(super) fn chain_accept(
        &mut self,
        now: Time,
        seqno: SeqNo,
        batch: Batch,
        digest: Digest,
        predecessor: Option<ReplicaId>,
        out: &mut Vec<Action>,
    ) {
        let (view, me) = (self.view, self.id);
        let history = history_digest(&self.projection(seqno).history, &digest);
        let slot = self.log.entry(seqno).or_default();
        slot.accept_digested(seqno, view, batch.clone(), digest);
        slot.accepted_at = now;
        slot.record.speculative = Some(SpeculativeRecord {
            view,
            history,
            digest,
            batch: None,
        });
        slot.commits.insert(me, (view, digest));
        if self.config.protocol == OrderProtocol::Aliph {
            for e in &batch.entries {
                self.speculation.chain_clients.insert(e.entry.client, now);
            }
        }
        let slot = self.log.entry(seqno).or_default();
        if let Some(p) = predecessor {
            slot.commits.insert(p, (view, digest));
        }
        persist::write(out, persist::slot_key(seqno), &slot.record);
        self.stats.bump("chain_accepted");
        let at = now.saturating_add(self.chain_stall_us());
        self.arm_quorum_timer(now, at, out);
        self.send_chain_votes(seqno, digest, batch, out);
        self.check_committed(now, seqno, out);
    }

    /// Sends this member's CHAIN (to its successor) and COMMIT (to the rest of its successor
    /// set, or to everyone from a committer) for the batch it accepted at `seqno`.
    fn send_chain_votes(&self, seqno: SeqNo, digest: Digest, batch: Batch, out: &mut Vec<Action>) {
        let view = self.view;
        let position = self.chain_position(view, self.id);
        if position + 1 < self.q.n_order {
            let next = Principal::Order(self.chain_member(view, position + 1));
            let message = Message::Pbft(PbftMessage::Chain { view, seqno, batch });
            self.send(out, vec![next], message, SealFor::One(next));
        }
        let to = self.chain_vote_recipients(view, position);
        let message = Message::Pbft(PbftMessage::Commit { view, seqno, digest });
        // One recipient (the rest of a successor set at r = 1): a MAC, not an authenticator.
        let seal = match to[..] {
            [one] => SealFor::One(one),
            _ => SealFor::Stage(StageKind::Order),
        };
        self.send(out, to, message, seal);
    }

    /// CHAIN from order member `from`.
    pub(super) fn on_chain(
        &mut self,
        now: Time,
        from: ReplicaId,
        view: View,
        seqno: SeqNo,
        batch: &Batch,
        out: &mut Vec<Action>,
    ) {
        if !self.chain_protocol() {
            return self.stats.bump("drop_chain_not_chain");
        }
        if self.changing || view != self.view {
            return self.wrong_view(now, from, view, out);
        }
        let position = self.chain_position(view, self.id);
        if position == 0 || self.chain_member(view, position - 1) != from {
            return self.stats.bump("drop_chain_not_predecessor");
        }
        if !self.check_window(now, from, seqno, out) {
            return;
        }
        if !self.speculative_seqno(seqno) {
            return self.stats.bump("drop_chain_in_backup_phase");
        }
        if seqno < self.next_accept() {
            self.stats.bump("dup_chain");
            return self.help_chain_slot(now, from, seqno, out);
        }
        let window = self.log_window() as usize;
        let pending = &mut self.speculation.chain_pending;
        if pending.len() >= window && !pending.contains_key(&seqno) {
            return self.stats.bump("drop_chain_pending_full");
        }
        pending.insert(seqno, (view, batch.clone()));
        self.drain_chain(now, out);
    }

    /// Accepts the pending CHAIN batches that are next in sequence and vouched for.
    pub(super) fn drain_chain(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.chain_protocol() || self.speculation.chain_pending.is_empty() || !self.chaining() {
            return;
        }
        let view = self.view;
        let position = self.chain_position(view, self.id);
        if position == 0 {
            self.speculation.chain_pending.clear();
            return;
        }
        let predecessor = self.chain_member(view, position - 1);
        loop {
            let next = self.next_accept();
            let pending = &mut self.speculation.chain_pending;
            *pending = pending.split_off(&next);
            let Some((v, batch)) = pending.remove(&next) else {
                return;
            };
            if v != view {
                continue;
            }
            let digest = match self.validate_batch(now, next, &batch) {
                Ok(digest) => digest,
                // Aliph: a member that receives a bad CHAIN stops; the view ends.
                Err(reason) => {
                    return self.stats.bump(reason);
                }
            };
            let vouched = self.sabotage() == Some(Sabotage::ChainSkipCheck)
                || self.chain_vouchers(view, position).into_iter().all(|m| {
                    self.log
                        .get(&next)
                        .is_some_and(|s| s.commits.get(&m) == Some(&(view, digest)))
                });
            if !vouched {
                self.speculation.chain_pending.insert(next, (v, batch));
                return self.stats.bump("chain_waiting_vouchers");
            }
            self.chain_accept(now, next, batch, digest, Some(predecessor), out);
        }
    }

    /// A member sent a vote for (or its CHAIN of) a Chain-phase slot committed here: it may be
    /// stuck on it (a vote it needs was lost), so it gets this member's vote (at most once per
    /// tick per member).
    pub(super) fn help_chain_slot(&mut self, now: Time, to: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) {
        let view = self.view;
        let Some(digest) = self
            .log
            .get(&seqno)
            .filter(|s| s.record.committed.is_some())
            .and_then(|s| s.accepted_in(view))
            .map(|a| a.digest)
        else {
            return;
        };
        if !self.may_help(now, to) {
            return;
        }
        self.stats.bump("chain_helped");
        let to = Principal::Order(to);
        let message = Message::Pbft(PbftMessage::Commit { view, seqno, digest });
        self.send(out, vec![to], message, SealFor::One(to));
    }

    /// OrderTick in the Chain phase: for each slot accepted here that has not committed after
    /// the primary-help hold, resends the CHAIN to the successor and the vote to every other
    /// member (a committer that committed it answers with its vote: `help_chain_slot`).
    pub(super) fn retransmit_chain(&self, now: Time, out: &mut Vec<Action>) {
        if !self.chain_protocol() {
            return;
        }
        let view = self.view;
        let position = self.chain_position(view, self.id);
        let settled = now.saturating_sub(self.primary_help_hold());
        for (&seqno, slot) in self.log.range(self.prefix.last_committed.next()..) {
            if !self.speculative_seqno(seqno) || slot.record.committed.is_some() {
                continue;
            }
            let Some(accepted) = slot.accepted_in(view) else {
                break;
            };
            if slot.accepted_at > settled {
                continue;
            }
            if position + 1 < self.q.n_order {
                let next = Principal::Order(self.chain_member(view, position + 1));
                let message = Message::Pbft(PbftMessage::Chain {
                    view,
                    seqno,
                    batch: accepted.batch.clone(),
                });
                self.send(out, vec![next], message, SealFor::One(next));
            }
            let digest = accepted.digest;
            self.send_to_order(out, Message::Pbft(PbftMessage::Commit { view, seqno, digest }));
        }
    }

    /// (`protocol = "aliph"`, at each order tick of the Chain phase) Aliph's return to Quorum:
    /// once the member has been in the view `aliph_one_client_us` and at most one client had a
    /// request accepted here in that time, it ends the view (the next runs Quorum:
    /// `next_fast_phase`).
    pub(super) fn check_chain_clients(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.config.protocol != OrderProtocol::Aliph || !self.chaining() {
            return;
        }
        let span = self.config.knobs.aliph_one_client_us;
        if now < self.speculation.view_since.saturating_add(span) {
            return;
        }
        let since = now.saturating_sub(span);
        self.speculation.chain_clients.retain(|_, at| *at >= since);
        if self.speculation.chain_clients.len() <= 1 {
            self.abort_quorum_phase(now, "aliph_chain_one_client", out);
        }
    }

    /// How long a batch accepted in a Chain phase may wait for its commit.
    fn chain_stall_us(&self) -> u64 {
        (self.config.knobs.view_change_timeout_us / CHAIN_STALL_FRACTION).max(1)
    }

    /// (Chain phase, when the abort timer fires) Aliph's Chain aborts when a request does not
    /// commit in time: the oldest batch accepted here and not committed has waited
    /// `chain_stall_us` (a member down, slow or lying stops the chain), so the member ends the
    /// view (counted `chain_abort_stalled`); the next view's Backup phase orders what waited,
    /// and its `k` doubles while Chain phases do poorly. Otherwise the timer is armed again for
    /// that batch.
    pub(super) fn check_chain_stall(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.chaining() {
            return;
        }
        let view = self.view;
        let oldest = self
            .log
            .range(self.prefix.last_committed.next()..)
            .filter(|(n, s)| self.speculative_seqno(**n) && s.record.committed.is_none())
            .find_map(|(_, s)| s.accepted_in(view).map(|_| s.accepted_at));
        let Some(at) = oldest.map(|t| t.saturating_add(self.chain_stall_us())) else {
            return;
        };
        if now >= at {
            return self.abort_quorum_phase(now, "chain_abort_stalled", out);
        }
        self.arm_quorum_timer(now, at, out);
    }
}
