//! The NEXT-BATCH hand-off to execution (docs/PROTOCOL.md "Normal case" step 4, "Catch-up of
//! execution members"): committed batches go to the execution members (held back briefly for a
//! member whose order member is slow), and LAST-EXEC from a lagging execution member is answered.

use super::{OrderStage, LAST_EXEC_RESEND_MAX, NEXT_BATCH_HOLD_FRACTION};
use crate::config::{ClusterConfig, Sabotage};
use crate::contract;
use crate::crypto::Digest;
use crate::ids::{Principal, ReplicaId, SeqNo, StageKind};
use crate::message::{Batch, Message, SealFor};
use crate::stage::PbftTimer;
use crate::stage::{Action, Event, Time, Timer};

impl OrderStage {
    /// Moves the committed prefix forward: NEXT-BATCH and a Committed note per batch.
    pub(super) fn advance_commits(&mut self, now: Time, out: &mut Vec<Action>) {
        let mut progressed = false;
        while let Some(n) = self.apply_next_committed() {
            progressed = true;
            let slot = &self.log[&n];
            // Only the clients of this batch have a new last ordered request: their entries at or
            // below it leave the pool (nothing else in it can be at or below its client's).
            if let Some(accepted) = &slot.record.accepted {
                for e in &accepted.batch.entries {
                    let last = self
                        .prefix
                        .last_ordered
                        .get(&e.entry.client)
                        .copied()
                        .unwrap_or_default();
                    self.pool.gc(e.entry.client, last);
                }
            }
            let (view, history) = (slot.record.committed.unwrap_or_default(), self.prefix.history);
            out.push(Action::Note(Event::Committed {
                seqno: n,
                view,
                history,
            }));
            self.stats.bump("batch_committed");
            if let Some(accepted) = &slot.record.accepted {
                self.monitor.committed(accepted.batch.entries.len());
                let requests = accepted
                    .batch
                    .entries
                    .iter()
                    .map(|e| (e.entry.client, e.entry.request_id));
                self.tell_auth_ordered(n, requests.collect(), out);
            }
            if let Some(message) = self.next_batch_message(n) {
                if self.q.separate_stages {
                    // No execution member shares this process: each needs `q.next_batch()`
                    // NEXT-BATCHes from order members, so every order member sends to every one
                    // at once (the thesis's cross-process path; docs/ODRC.md "Separated stages").
                    self.stats.bump("next_batch_separate");
                    self.send_to_exec(out, ClusterConfig::exec_members(&self.q).collect(), message);
                    continue;
                }
                if self.hosts_exec() {
                    self.send_to_exec(out, vec![Principal::Exec(self.id)], message);
                }
                let execs = ClusterConfig::exec_members(&self.q).filter_map(|p| p.replica());
                let owed = self.next_batch_missing(n, execs);
                if !owed.is_empty() {
                    self.next_batch_owed.insert(n, (now, owed));
                }
            }
        }
        if !progressed {
            return;
        }
        // The next slot may have prepared before this one committed.
        self.offer_tentative(self.prefix.last_committed.next(), out);
        self.note_backups_complete(now);
        self.send_owed_next_batches(now, SeqNo(0), out);
        self.view_change.consecutive = 0;
        if self.view_change.deadline.is_some() && !self.changing {
            let at = now + self.view_change_timeout();
            self.view_change.deadline = Some(at);
            out.push(Action::SetTimer {
                timer: Timer::Pbft(PbftTimer::ViewChange),
                at,
            });
        }
        self.try_votes(now, out);
    }

    /// The execution members (of `execs`, other than the co-located one) whose order member's
    /// COMMIT for committed slot `n` has not arrived here. Its co-located execution member needs
    /// no other NEXT-BATCH than ours (PROTOCOL.md step 5); another needs `q.next_batch()` of them
    /// when its own order member does not commit the batch (cut off, in another view, behind).
    /// The execution member co-located with the primary of the slot's commit view is never
    /// missing: in the normal case that primary sends no COMMIT (`send_prepare`), yet it
    /// pre-prepared the batch and commits it when the backups' COMMITs arrive, and if it falls
    /// behind its execution member asks with LAST-EXEC.
    fn next_batch_missing(&self, n: SeqNo, execs: impl Iterator<Item = ReplicaId>) -> Vec<ReplicaId> {
        let Some(slot) = self.log.get(&n) else {
            return Vec::new();
        };
        let vote = slot.record.commit_vote();
        execs
            .filter(|r| *r != self.id && (vote.is_none() || slot.commits.get(r).copied() != vote))
            .filter(|r| vote.is_none_or(|(view, _)| *r != self.primary_of(view)))
            .collect()
    }

    /// Sends the NEXT-BATCHes held back at least [`NEXT_BATCH_HOLD_FRACTION`] of the view-change
    /// timeout, and those of slots below `below` however long held (every slot at a tick; the
    /// slots a stable checkpoint is about to discard), to the execution members whose order
    /// member's COMMIT still has not arrived. Held back because that COMMIT usually arrives just
    /// after this member committed (a commit needs `n_order - u` of the `n_order` COMMITs): sent
    /// at once, ~2.8 of every batch's NEXT-BATCHes crossed the network for nothing (u = r = 1).
    /// Checked at this member's later commits and ticks; an execution member whose order member
    /// falls behind for longer also catches up by asking with LAST-EXEC.
    pub(super) fn send_owed_next_batches(&mut self, now: Time, below: SeqNo, out: &mut Vec<Action>) {
        let hold = self.config.knobs.view_change_timeout_us / NEXT_BATCH_HOLD_FRACTION;
        while let Some(entry) = self.next_batch_owed.first_entry() {
            if *entry.key() >= below && entry.get().0.saturating_add(hold) > now {
                break;
            }
            let (n, (_, owed)) = entry.remove_entry();
            let missing = self.next_batch_missing(n, owed.into_iter());
            if missing.is_empty() {
                self.stats.bump("next_batch_not_needed");
                continue;
            }
            let Some(message) = self.next_batch_message(n) else {
                continue;
            };
            self.stats.add("next_batch_remote", missing.len() as u64);
            self.send_to_exec(out, missing.into_iter().map(Principal::Exec).collect(), message);
        }
    }

    fn send_to_exec(&self, out: &mut Vec<Action>, to: Vec<Principal>, message: Message) {
        self.send(out, to, message, SealFor::Stage(StageKind::Exec));
    }

    /// NEXT-BATCH for a committed slot of the committed prefix.
    fn next_batch_message(&self, seqno: SeqNo) -> Option<Message> {
        let slot = self.log.get(&seqno)?;
        let (view, history, accepted) = (slot.record.committed?, slot.history?, slot.record.accepted.as_ref()?);
        Some(contract::next_batch(
            view,
            seqno,
            history,
            accepted.batch.time_us,
            accepted.batch.entries.iter().map(|e| e.entry.clone()).collect(),
        ))
    }

    /// Whether slot `seqno`'s batch in the current view may be executed tentatively: tentative
    /// execution is on, the batch has requests (at most `tentative_entries_max`, so only light
    /// load pays for it), none of them the administrator's (a reconfiguration takes effect only
    /// when committed), and `seqno` is not a checkpoint's (execution checkpoints only committed
    /// state, and a rollback restores the newest checkpoint).
    pub(super) fn tentative_eligible(&self, seqno: SeqNo) -> bool {
        let max = self.config.knobs.tentative_entries_max;
        if max == 0 || seqno.0.is_multiple_of(self.config.knobs.checkpoint_interval) {
            return false;
        }
        let Some(accepted) = self.log.get(&seqno).and_then(|s| s.accepted_in(self.view)) else {
            return false;
        };
        let entries = &accepted.batch.entries;
        !entries.is_empty()
            && entries.len() <= max
            && accepted.batch.time_us > 0
            && entries.iter().all(|e| Some(e.entry.client) != self.config.admin)
    }

    /// Whether the primary's PREPARE vote is needed for the tentative reply quorum: the backups
    /// with an execution member are fewer than `q.tentative_reply()` (at `u = r` when the primary
    /// hosts an execution member), so backups send it their PREPAREs for tentative batches.
    pub(super) fn tentative_needs_primary(&self, seqno: SeqNo) -> bool {
        let primary = self.primary_of(self.view);
        let backups_with_exec = self.q.n_exec - usize::from((primary.0 as usize) < self.q.n_exec);
        backups_with_exec < self.q.tentative_reply() && self.tentative_eligible(seqno)
    }

    /// Tentative execution (PBFT thesis 5.1.3; docs/PROTOCOL.md "Tentative execution"): hands
    /// slot `seqno` to the co-located execution member as TENTATIVE-BATCH once it is prepared
    /// in the current view (its certificate written before, and local deliveries wait for the
    /// sync) and every slot before it is committed. Not across the network: another execution
    /// member trusts only its own order member's word that the batch prepared.
    pub(super) fn offer_tentative(&mut self, seqno: SeqNo, out: &mut Vec<Action>) {
        if self.changing
            || seqno != self.prefix.last_committed.next()
            || self.tentative_sent == Some((self.view, seqno))
            || !self.hosts_exec()
            || !self.tentative_eligible(seqno)
        {
            return;
        }
        let Some(slot) = self.log.get(&seqno) else { return };
        if !slot.prepared_in(self.view) || slot.record.committed.is_some() {
            return;
        }
        let accepted = slot.accepted_in(self.view).expect("prepared in this view");
        let history = crate::message::history_digest(&self.prefix.history, &accepted.digest);
        self.send_tentative_batch(seqno, history, &accepted.batch, out);
        self.tentative_sent = Some((self.view, seqno));
        self.stats.bump("tentative_batch_sent");
    }

    /// Whether this replica hosts an execution member beside this order member.
    pub(super) fn hosts_exec(&self) -> bool {
        if self.q.separate_stages {
            return false;
        }
        let own = Principal::Exec(self.id);
        ClusterConfig::exec_members(&self.q).any(|p| p == own)
    }

    /// TENTATIVE-BATCH of `batch` at `seqno` in the current view, with history `history` after
    /// it, to the co-located execution member (tentative execution, and Quorum's speculation).
    pub(super) fn send_tentative_batch(&self, seqno: SeqNo, history: Digest, batch: &Batch, out: &mut Vec<Action>) {
        let message = Message::TentativeBatch {
            view: self.view,
            seqno,
            history,
            time_us: batch.time_us,
            entries: batch.entries.iter().map(|e| e.entry.clone()).collect(),
        };
        self.send_to_exec(out, vec![Principal::Exec(self.id)], message);
    }

    /// `Sabotage::EarlyExecute`: release a batch to execution as soon as it is pre-prepared.
    pub(super) fn early_execute(&self, seqno: SeqNo, out: &mut Vec<Action>) {
        if self.sabotage() != Some(Sabotage::EarlyExecute) {
            return;
        }
        let Some(accepted) = self.log.get(&seqno).and_then(|s| s.accepted_in(self.view)) else {
            return;
        };
        let history = self.projection(seqno.next()).history;
        let message = contract::next_batch(
            self.view,
            seqno,
            history,
            accepted.batch.time_us,
            accepted.batch.entries.iter().map(|e| e.entry.clone()).collect(),
        );
        self.send_to_exec(out, ClusterConfig::exec_members(&self.q).collect(), message);
    }

    // ---- execution catch-up ----

    pub(super) fn on_last_executed(&mut self, from: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) {
        let exec = Principal::Exec(from);
        self.stats.bump("last_executed_received");
        if seqno < self.h {
            if let Some(stable) = &self.stable {
                let message = contract::load_checkpoint(self.h, stable.checkpoint.exec_state);
                self.stats.bump("load_checkpoint_sent");
                self.send(out, vec![exec], message, SealFor::One(exec));
            }
            return;
        }
        let last = self
            .prefix
            .last_committed
            .0
            .min(seqno.0.saturating_add(LAST_EXEC_RESEND_MAX));
        // A LAST-EXECUTED from a faulty member may name any number (saturating: no overflow).
        for n in seqno.0.saturating_add(1)..=last {
            if let Some(message) = self.next_batch_message(SeqNo(n)) {
                self.stats.bump("next_batch_resent");
                self.send_to_exec(out, vec![exec], message);
            }
        }
    }
}
