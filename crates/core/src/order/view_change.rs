//! View change with signed VIEW-CHANGE / NEW-VIEW (docs/PROTOCOL.md "View change"; PBFT thesis
//! 2.4 and 3.2.4 with medium = `n - u` and small = `r + 1` in place of `2f + 1` / `f + 1`).

use crate::message::PbftMessage;
use crate::stage::PbftTimer;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::checkpoint::verify_stable;
use super::{persist, persist_view, OrderStage};
use crate::crypto::Digest;
use crate::ids::{Principal, ReplicaId, SeqNo, View};
use crate::message::{
    Batch, FastPhase, Message, NewView, NewViewMessage, SealFor, Signed, StableCheckpoint, ViewChange, ViewChangeRef,
};
use crate::quorum::Quorums;
use crate::stage::{Action, Event, Time, Timer};

/// The new view's starting checkpoint and re-proposed batches.
pub type Selection = (Option<StableCheckpoint>, Vec<(SeqNo, Batch)>);

fn stable_seqno(stable: &Option<StableCheckpoint>) -> SeqNo {
    stable.as_ref().map_or(SeqNo(0), |s| s.checkpoint.seqno)
}

/// PBFT's decision procedure over (already verified) VIEW-CHANGEs, in the given order:
/// - the starting checkpoint is the highest stable certificate reported (first in list order);
/// - for each seqno `n` above it up to the highest prepared (or speculative) one: batch `d` if
///   some message has `(n, d, v)` in P with (A1) `order_medium` messages having no P entry for
///   `n` with a higher view or the same view and another digest, and (A2) `small` messages
///   having `(n, d, v' >= v)` in Q; else a null batch if `order_medium` messages have no P entry
///   for `n`.
/// - Under `protocol = "quorum"` a speculative claim `(n, history, v)` is a candidate of view `v`
///   too (tried after P candidates of the same view): chosen if (S1) `small` messages claim the
///   same `(n, history, v)` and (S2) `order_medium` messages have no P entry for `n` with a view
///   `>= v`. This is Aliph's abort history (a position held by `f + 1` of `2f + 1` histories)
///   inside PBFT's rule: a batch a client committed speculatively is claimed by every correct
///   member of any quorum and nothing of its view or later was prepared there
///   (docs/PROTOCOL.md "Quorum").
///
/// Returns `None` when some seqno cannot be decided yet (more VIEW-CHANGEs are needed). The result
/// depends only on the list, so backups re-derive exactly what the primary chose.
pub fn select(q: &Quorums, view_changes: &[&ViewChange]) -> Option<Selection> {
    let mut stable: Option<&StableCheckpoint> = None;
    for vc in view_changes {
        if stable_seqno(&vc.stable) > stable.map_or(SeqNo(0), |s| s.checkpoint.seqno) {
            stable = vc.stable.as_ref();
        }
    }
    let h = stable.map_or(SeqNo(0), |s| s.checkpoint.seqno);
    let top = view_changes
        .iter()
        .flat_map(|vc| {
            let prepared = vc.prepared.iter().map(|p| p.seqno);
            prepared.chain(vc.speculative.iter().map(|c| c.seqno))
        })
        .filter(|n| *n > h)
        .max();
    let mut batches = Vec::new();
    let mut n = h.next();
    while top.is_some_and(|top| n <= top) {
        batches.push((n, decide(q, view_changes, n)?));
        n = n.next();
    }
    Some((stable.cloned(), batches))
}

/// The batch for one seqno, if decidable.
fn decide(q: &Quorums, view_changes: &[&ViewChange], n: SeqNo) -> Option<Batch> {
    let entry_at = |vc: &ViewChange| vc.prepared.iter().find(|p| p.seqno == n).map(|p| (p.view, p.digest));
    // Candidates by view descending, P before speculative, then digest; the first message
    // carrying one supplies its batch.
    let mut candidates: BTreeMap<(Reverse<View>, bool, Digest), &Batch> = BTreeMap::new();
    for vc in view_changes {
        for p in vc.prepared.iter().filter(|p| p.seqno == n) {
            candidates.entry((Reverse(p.view), false, p.digest)).or_insert(&p.batch);
        }
        for c in vc.speculative.iter().filter(|c| c.seqno == n) {
            candidates.entry((Reverse(c.view), true, c.history)).or_insert(&c.batch);
        }
    }
    for ((Reverse(view), speculative, digest), batch) in candidates {
        if speculative {
            let s1 = view_changes
                .iter()
                .filter(|vc| {
                    vc.speculative
                        .iter()
                        .any(|c| c.seqno == n && c.view == view && c.history == digest)
                })
                .count();
            let s2 = view_changes
                .iter()
                .filter(|vc| entry_at(vc).is_none_or(|(v, _)| v < view))
                .count();
            if s1 >= q.small() && s2 >= q.order_medium() {
                return Some(batch.clone());
            }
            continue;
        }
        let a1 = view_changes
            .iter()
            .filter(|vc| match entry_at(vc) {
                None => true,
                Some((v, d)) => v < view || (v == view && d == digest),
            })
            .count();
        let a2 = view_changes
            .iter()
            .filter(|vc| {
                vc.pre_prepared
                    .iter()
                    .any(|c| c.seqno == n && c.digest == digest && c.view >= view)
            })
            .count();
        if a1 >= q.order_medium() && a2 >= q.small() {
            return Some(batch.clone());
        }
    }
    let no_entry = view_changes.iter().filter(|vc| entry_at(vc).is_none()).count();
    (no_entry >= q.order_medium()).then(|| Batch {
        time_us: 0,
        entries: Vec::new(),
    })
}

/// A member's view-change state (docs/PROTOCOL.md "View change").
#[derive(Debug, Default)]
pub(crate) struct ViewChangeState {
    /// View changes since the last commit (the timeout doubles with each).
    pub(super) consecutive: u32,
    /// When the view-change timer fires, if armed.
    pub(super) deadline: Option<Time>,
    /// Latest valid VIEW-CHANGE per member (highest view).
    pub(super) received: BTreeMap<ReplicaId, Signed<ViewChange>>,
    /// The NEW-VIEW of the current view, with the VIEW-CHANGEs it names (relayed to members
    /// still changing; shared, so installing it does not copy its batches).
    pub(super) new_view: Option<std::sync::Arc<NewViewMessage>>,
    /// A NEW-VIEW that names a VIEW-CHANGE this member does not hold yet (it waits for the
    /// primary's relay, which carries them all, or for the VIEW-CHANGE itself).
    pub(super) pending_new_view: Option<NewViewMessage>,
    /// The timeout the current view change's timer was armed with.
    pub(super) timeout: Time,
    /// When this member, changing views, first held a quorum of VIEW-CHANGEs for its view or
    /// later ones: the NEW-VIEW wait counts from there (PBFT 2.4).
    pub(super) quorum_at: Option<Time>,
    /// When our VIEW-CHANGE is resent next, and the gap after that (doubling from one tick to
    /// the base view-change timeout: a VIEW-CHANGE can carry megabytes of batches, and resending it to
    /// every member on every tick once took most of a loaded replica's CPU).
    pub(super) resend_at: Time,
    pub(super) resend_gap: Time,
}

impl OrderStage {
    /// Checks a VIEW-CHANGE: signature, stable certificate, and claims inside the sender's window
    /// with views below the new view (one P entry per seqno, P digests matching their batches).
    fn validate_view_change(&self, vc: &Signed<ViewChange>) -> Result<(), &'static str> {
        if (vc.signer.0 as usize) >= self.q.n_order {
            return Err("drop_bad_view_change_signer");
        }
        if vc.verify(&self.keys, self.sabotage()).is_err() {
            return Err("drop_bad_signature");
        }
        let body = &vc.value;
        if let Some(stable) = &body.stable {
            if !verify_stable(&self.config, &self.q, &self.keys, stable) {
                return Err("drop_bad_stable_certificate");
            }
        }
        let h = stable_seqno(&body.stable);
        // Nothing past the epoch's boundary, if the stable checkpoint carries a pending change.
        let end = body
            .stable
            .as_ref()
            .and_then(|s| self.pending_for_next(s.checkpoint.reconfiguration.as_deref()))
            .map_or(SeqNo(u64::MAX), |p| p.boundary);
        let in_window = |n: SeqNo| n > h && n.0 <= h.0 + self.log_window() && n <= end;
        let mut last = h;
        for p in &body.prepared {
            if p.seqno <= last || !in_window(p.seqno) || p.view >= body.new_view || p.batch.digest() != p.digest {
                return Err("drop_bad_view_change_prepared");
            }
            last = p.seqno;
        }
        if body
            .pre_prepared
            .iter()
            .any(|c| !in_window(c.seqno) || c.view >= body.new_view)
        {
            return Err("drop_bad_view_change_pre_prepared");
        }
        if !body.speculative.is_empty() && !self.config.protocol.has_fast_phase() {
            return Err("drop_bad_view_change_speculative");
        }
        let mut last = h;
        for c in &body.speculative {
            if c.seqno <= last || !in_window(c.seqno) || c.view >= body.new_view {
                return Err("drop_bad_view_change_speculative");
            }
            last = c.seqno;
        }
        Ok(())
    }

    /// This member's VIEW-CHANGE for `target`: its stable checkpoint, P and Q above it.
    fn build_view_change(&self, target: View) -> Signed<ViewChange> {
        let slots = self.log.range(self.h.next()..);
        let prepared = slots.clone().filter_map(|(n, s)| s.record.prepared_claim(*n)).collect();
        let pre_prepared = slots
            .clone()
            .flat_map(|(_, s)| s.record.pre_prepared.iter().cloned())
            .collect();
        let speculative = slots.filter_map(|(n, s)| s.record.speculative_claim(*n)).collect();
        let body = ViewChange {
            new_view: target,
            stable: self.stable.clone(),
            prepared,
            pre_prepared,
            speculative,
        };
        Signed::sign(&self.keys, self.id, body)
    }

    /// Stops normal processing and moves to view `target` (persisting it before sending).
    pub(super) fn start_view_change(&mut self, now: Time, target: View, out: &mut Vec<Action>) {
        assert!(target > self.view, "views only grow");
        if !self.changing {
            self.note_phase_end();
        }
        self.view = target;
        self.changing = true;
        self.monitor.view_changing();
        self.hint_primary(out);
        self.view_change.new_view = None;
        self.buffered.clear();
        self.primary_vote.waiting_prepares.clear();
        if self.batch_timer_armed {
            self.batch_timer_armed = false;
            out.push(Action::CancelTimer {
                timer: Timer::Pbft(PbftTimer::BatchClose),
            });
        }
        persist_view(out, target, true);
        self.stats.bump("view_change_started");
        let vc = self.build_view_change(target);
        self.view_change.received.insert(self.id, vc.clone());
        self.view_change.quorum_at = None;
        self.note_view_change_quorum(now);
        self.view_change.resend_gap = self.tick_period();
        self.view_change.resend_at = now.saturating_add(self.view_change.resend_gap);
        self.send(
            out,
            self.other_order_members(),
            Message::Pbft(PbftMessage::ViewChange(vc)),
            SealFor::Nothing,
        );
        self.view_change.timeout = self.view_change_timeout();
        let at = now + self.view_change.timeout;
        self.view_change.consecutive = self.view_change.consecutive.saturating_add(1);
        self.view_change.deadline = Some(at);
        out.push(Action::SetTimer {
            timer: Timer::Pbft(PbftTimer::ViewChange),
            at,
        });
        self.try_new_view(now, out);
    }

    /// After a restart in the middle of a view change: rebuild and resend our VIEW-CHANGE.
    pub(super) fn resume_view_change(&mut self, now: Time, out: &mut Vec<Action>) {
        let vc = self.build_view_change(self.view);
        self.view_change.received.insert(self.id, vc);
        self.view_change.resend_at = now;
        self.view_change.resend_gap = self.tick_period();
        self.resend_view_change(now, out);
        self.view_change.timeout = self.view_change_timeout();
        let at = now + self.view_change.timeout;
        self.view_change.deadline = Some(at);
        out.push(Action::SetTimer {
            timer: Timer::Pbft(PbftTimer::ViewChange),
            at,
        });
    }

    /// OrderTick while changing: resend our VIEW-CHANGE when its resend is due (the gap doubles
    /// from one tick up to `view_change_timeout_us`).
    pub(super) fn resend_view_change(&mut self, now: Time, out: &mut Vec<Action>) {
        if now < self.view_change.resend_at {
            return;
        }
        let gap = self.view_change.resend_gap.max(1);
        let cap = self.config.knobs.view_change_timeout_us.max(gap);
        self.view_change.resend_gap = gap.saturating_mul(2).min(cap);
        self.view_change.resend_at = now.saturating_add(gap);
        self.stats.bump("view_change_resent");
        if let Some(vc) = self
            .view_change
            .received
            .get(&self.id)
            .filter(|vc| vc.value.new_view == self.view)
        {
            self.send(
                out,
                self.other_order_members(),
                Message::Pbft(PbftMessage::ViewChange(vc.clone())),
                SealFor::Nothing,
            );
        }
    }

    /// The view-change timer fired. A member in an installed view suspects the primary (the
    /// primary itself gives up on a view in which its batches do not commit). A member
    /// changing views moves on to the next view only if a quorum is changing with it (PBFT 2.4:
    /// the timer counts only once `view_change` VIEW-CHANGEs arrived), so a member cut off from the
    /// others does not race ahead alone; otherwise it keeps waiting (and resending). Members already
    /// changing to a later view count as changing with us.
    pub(super) fn on_view_change_timer(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.changing {
            let counter = match self.is_primary() {
                true => "view_change_timeout_primary",
                false => "view_change_timeout",
            };
            self.stats.bump(counter);
            self.start_view_change(now, self.view.next(), out);
            return;
        }
        // Members whose latest VIEW-CHANGE is for this view or a later one have all given up on
        // the views below; counting only exact matches deadlocks when one of them already moved
        // further (simulator seed 339 at u = r = 1: two members waiting for view 2, one in view 3).
        //
        // The NEW-VIEW wait counts from when the quorum formed, not from our own VIEW-CHANGE
        // (PBFT 2.4): under load, building and checking a NEW-VIEW of megabytes took a loaded
        // replica most of a second, and members whose timers ran from their own VIEW-CHANGE
        // left each view just before its NEW-VIEW arrived, view after view (docs/PERFORMANCE.md
        // "Session 40").
        self.note_view_change_quorum(now);
        if let Some(since) = self.view_change.quorum_at {
            let due = since.saturating_add(self.view_change.timeout);
            if now >= due {
                self.stats.bump("view_change_timeout");
                self.start_view_change(now, self.view.next(), out);
            } else {
                self.view_change.deadline = Some(due);
                out.push(Action::SetTimer {
                    timer: Timer::Pbft(PbftTimer::ViewChange),
                    at: due,
                });
            }
        } else {
            let at = now + self.view_change_timeout();
            self.view_change.deadline = Some(at);
            out.push(Action::SetTimer {
                timer: Timer::Pbft(PbftTimer::ViewChange),
                at,
            });
        }
    }

    /// Whether this member has work the primary should be making progress on: an accepted,
    /// uncommitted PRE-PREPARE, a buffered one, or a request ready to order.
    fn has_pending_work(&self) -> bool {
        if !self.buffered.is_empty()
            || self
                .log
                .range(self.prefix.last_committed.next()..)
                .any(|(_, s)| s.accepted_in(self.view).is_some())
        {
            return true;
        }
        let p = self.projection(self.next_accept());
        !self.ready_entries(&p, 1).0.is_empty()
    }

    /// Arms the view-change timer of a member with pending work, cancels it when none is left.
    /// The primary runs it too: PBFT's backups alone cannot always get a view change going. With
    /// `u = r = 1`, one Byzantine member silent and one backup that timed out alone (it moves on
    /// only with a quorum, and `q.view_change_join()` members are needed to pull the others),
    /// the remaining backup may have committed everything (nothing pending) while the primary
    /// waits forever for COMMITs that the member changing views no longer sends (simulator seed
    /// 173 with a different NEXT-BATCH timing). The primary's own timeout is the second
    /// VIEW-CHANGE that lets the third member join.
    pub(super) fn update_view_change_timer(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.changing {
            return;
        }
        let pending = self.has_pending_work();
        match (pending, self.view_change.deadline) {
            (true, None) => {
                let at = now + self.view_change_timeout();
                self.view_change.deadline = Some(at);
                out.push(Action::SetTimer {
                    timer: Timer::Pbft(PbftTimer::ViewChange),
                    at,
                });
            }
            (false, Some(_)) => {
                self.view_change.deadline = None;
                out.push(Action::CancelTimer {
                    timer: Timer::Pbft(PbftTimer::ViewChange),
                });
            }
            _ => {}
        }
    }

    pub(super) fn on_view_change(
        &mut self,
        now: Time,
        from: ReplicaId,
        vc: &Signed<ViewChange>,
        out: &mut Vec<Action>,
    ) {
        let target = vc.value.new_view;
        if target <= self.view && !(target == self.view && self.changing) {
            // The sender is behind: it gets our NEW-VIEW if we have one.
            self.stats.bump("drop_old_view_change");
            if !self.changing && self.may_help(now, from) {
                self.relay_new_view(from, out);
            }
            return;
        }
        if self
            .view_change
            .received
            .get(&vc.signer)
            .is_some_and(|held| held.value.new_view >= target)
        {
            return self.stats.bump("dup_view_change");
        }
        if let Err(reason) = self.validate_view_change(vc) {
            if reason == "drop_bad_signature" {
                self.help_previous_epoch(now, Principal::Order(from), out);
            }
            return self.stats.bump(reason);
        }
        self.view_change.received.insert(vc.signer, vc.clone());
        self.note_view_change_quorum(now);
        // A NEW-VIEW that waited for this VIEW-CHANGE may be complete now.
        if let Some(pending) = self.view_change.pending_new_view.take_if(|p| {
            p.new_view.value.view >= self.view && p.new_view.value.view_changes.iter().any(|r| r.names(vc))
        }) {
            self.on_new_view(now, &pending, out);
            if !self.changing || self.view > target {
                return;
            }
        }
        if let Some(stable) = vc.value.stable.clone().filter(|s| s.checkpoint.seqno > self.h) {
            self.adopt_stable(now, stable, out);
        }
        // Join rule: `view_change_join` members want a view above ours; join the smallest.
        let higher: Vec<View> = self
            .view_change
            .received
            .values()
            .map(|vc| vc.value.new_view)
            .filter(|v| *v > self.view)
            .collect();
        if higher.len() >= self.q.view_change_join() {
            let smallest = *higher.iter().min().expect("not empty");
            self.stats.bump("view_change_joined");
            self.start_view_change(now, smallest, out);
            return;
        }
        // In a Quorum phase (`quorum.rs`) one member's abort is enough: it no longer votes, so
        // nothing this member executes there can commit, and any member can stall the phase
        // that way anyway. Only the next view, so no member can push the views far ahead.
        if self.speculating() && higher.contains(&self.view.next()) {
            self.stats.bump("quorum_abort_joined");
            return self.start_view_change(now, self.view.next(), out);
        }
        self.try_new_view(now, out);
    }

    /// (Changing views) notes when a quorum of members first wanted this member's view or a
    /// later one.
    fn note_view_change_quorum(&mut self, now: Time) {
        if !self.changing || self.view_change.quorum_at.is_some() {
            return;
        }
        let view = self.view;
        let with_us = self
            .view_change
            .received
            .values()
            .filter(|vc| vc.value.new_view >= view)
            .count();
        if with_us >= self.q.view_change() {
            self.view_change.quorum_at = Some(now);
        }
    }

    /// The new primary builds NEW-VIEW once its VIEW-CHANGEs decide every seqno.
    fn try_new_view(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.changing || self.primary_of(self.view) != self.id {
            return;
        }
        let view = self.view;
        let view_changes: Vec<Signed<ViewChange>> = self
            .view_change
            .received
            .values()
            .filter(|vc| vc.value.new_view == view)
            .cloned()
            .collect();
        if view_changes.len() < self.q.view_change() {
            return;
        }
        let bodies: Vec<&ViewChange> = view_changes.iter().map(|vc| &vc.value).collect();
        let Some((stable, batches)) = self.selection(&bodies) else {
            return self.stats.bump("new_view_undecided");
        };
        let backup_batches = self.next_backup_batches();
        self.stats.add("new_view_backup_batches", backup_batches);
        let fast_phase = self.next_fast_phase();
        if self.config.protocol == crate::config::OrderProtocol::Aliph {
            self.stats.bump(match fast_phase {
                FastPhase::Chain => "aliph_new_view_chain",
                _ => "aliph_new_view_quorum",
            });
        }
        let new_view = Signed::sign(
            &self.keys,
            self.id,
            NewView {
                view,
                view_changes: view_changes.iter().map(ViewChangeRef::of).collect(),
                stable,
                batches,
                backup_batches,
                fast_phase,
            },
        );
        // Sent without the VIEW-CHANGEs: their senders sent every member theirs.
        let compact = NewViewMessage {
            new_view: new_view.clone(),
            view_changes: Vec::new(),
        };
        self.install_new_view(now, NewViewMessage { new_view, view_changes }, out);
        self.stats.bump("new_view_sent");
        self.send(
            out,
            self.other_order_members(),
            Message::Pbft(PbftMessage::NewView(compact)),
            SealFor::Nothing,
        );
    }

    pub(super) fn on_new_view(&mut self, now: Time, msg: &NewViewMessage, out: &mut Vec<Action>) {
        let nv = &msg.new_view;
        let body = &nv.value;
        if body.view < self.view || (body.view == self.view && !self.changing) {
            return self.stats.bump("drop_old_new_view");
        }
        if nv.signer != self.primary_of(body.view) || nv.verify(&self.keys, self.sabotage()).is_err() {
            return self.stats.bump("drop_bad_new_view_signature");
        }
        // The VIEW-CHANGEs it names: attached (checked here), or held here (checked on arrival).
        let mut signers = BTreeSet::new();
        let mut view_changes = Vec::with_capacity(body.view_changes.len());
        for named in &body.view_changes {
            if !signers.insert(named.signer) {
                return self.stats.bump("drop_bad_new_view_view_change");
            }
            let vc = if let Some(vc) = msg.view_changes.iter().find(|vc| named.names(vc)) {
                if self.validate_view_change(vc).is_err() {
                    return self.stats.bump("drop_bad_new_view_view_change");
                }
                vc
            } else if let Some(vc) = self
                .view_change
                .received
                .get(&named.signer)
                .filter(|vc| named.names(vc))
            {
                vc
            } else {
                return self.await_view_changes(msg, out);
            };
            if vc.value.new_view != body.view {
                return self.stats.bump("drop_bad_new_view_view_change");
            }
            view_changes.push(vc.clone());
        }
        self.view_change.pending_new_view = None;
        if !self.backup_batches_valid(body.backup_batches) || !self.config.protocol.allows_fast_phase(body.fast_phase) {
            self.stats.bump("drop_bad_new_view_backup_batches");
            return self.start_view_change(now, body.view.next(), out);
        }
        let bodies: Vec<&ViewChange> = view_changes.iter().map(|vc| &vc.value).collect();
        let expected = self.selection(&bodies);
        if signers.len() < self.q.view_change()
            || expected.as_ref() != Some(&(body.stable.clone(), body.batches.clone()))
        {
            // A correctly signed but wrong NEW-VIEW: its primary is faulty; move past its view.
            self.stats.bump("drop_bad_new_view_selection");
            return self.start_view_change(now, body.view.next(), out);
        }
        self.install_new_view(
            now,
            NewViewMessage {
                new_view: nv.clone(),
                view_changes,
            },
            out,
        );
    }

    /// A NEW-VIEW names a VIEW-CHANGE this member does not hold: it keeps the NEW-VIEW and sends
    /// its own VIEW-CHANGE to the new primary, whose answer (`relay_new_view`) is the NEW-VIEW
    /// with every VIEW-CHANGE it names. A NEW-VIEW that names one nobody sent is never
    /// installed; the view-change timer moves past its view.
    fn await_view_changes(&mut self, msg: &NewViewMessage, out: &mut Vec<Action>) {
        self.stats.bump("new_view_awaits_view_changes");
        let primary = msg.new_view.signer;
        self.view_change.pending_new_view = Some(msg.clone());
        if let Some(mine) = self.view_change.received.get(&self.id) {
            self.send(
                out,
                vec![Principal::Order(primary)],
                Message::Pbft(PbftMessage::ViewChange(mine.clone())),
                SealFor::Nothing,
            );
        }
    }

    /// Enters the new view: adopts its checkpoint, treats its batches as pre-prepared in it
    /// (persisted before any PREPARE), and resumes normal processing.
    fn install_new_view(&mut self, now: Time, msg: NewViewMessage, out: &mut Vec<Action>) {
        let msg = std::sync::Arc::new(msg);
        let body = &msg.new_view.value;
        if let Some(stable) = body.stable.clone().filter(|s| s.checkpoint.seqno > self.h) {
            self.adopt_stable(now, stable, out);
        }
        let view = body.view;
        self.view = view;
        self.changing = false;
        self.view_change.new_view = Some(msg.clone());
        self.view_change.pending_new_view = None;
        self.buffered.clear();
        self.view_change.received.retain(|_, vc| vc.value.new_view > view);
        persist_view(out, view, false);
        for slot in self.log.values_mut() {
            slot.clear_votes();
        }
        let primary = self.primary_of(view) == self.id;
        let mut prepares = Vec::new();
        for (seqno, batch) in body.batches.iter().filter(|(n, _)| *n > self.h) {
            let slot = self.log.entry(*seqno).or_default();
            let digest = batch.digest();
            if slot.record.committed.is_some() && slot.record.accepted.as_ref().is_some_and(|a| a.digest != digest) {
                self.stats.bump("new_view_conflicts_committed");
                continue;
            }
            slot.accept(*seqno, view, batch.clone());
            if !primary {
                slot.prepares.insert(self.id, (view, digest));
                prepares.push((*seqno, digest));
            }
            persist::write(out, persist::slot_key(*seqno), &slot.record);
        }
        let top = body
            .batches
            .last()
            .map_or(SeqNo(0), |(n, _)| *n)
            .max(stable_seqno(&body.stable));
        self.start_speculation_after(now, top, body.backup_batches, body.fast_phase);
        out.push(Action::Note(Event::ViewInstalled { view }));
        self.monitor.view_installed(view, now);
        self.stats.bump("view_installed");
        self.hint_primary(out);
        for (seqno, digest) in prepares {
            self.send_to_order(out, Message::Pbft(PbftMessage::Prepare { view, seqno, digest }));
        }
        let seqnos: Vec<SeqNo> = body.batches.iter().map(|(n, _)| *n).collect();
        for seqno in seqnos {
            self.check_prepared(now, seqno, out);
        }
        if self.view_change.deadline.take().is_some() {
            out.push(Action::CancelTimer {
                timer: Timer::Pbft(PbftTimer::ViewChange),
            });
        }
        self.update_view_change_timer(now, out);
        self.replay_early(now, out);
        self.change_if_suspected(now, out);
    }

    /// A member in an older view or still changing to ours gets our NEW-VIEW (self-authenticating).
    pub(super) fn relay_new_view(&self, to: ReplicaId, out: &mut Vec<Action>) {
        if let Some(nv) = &self.view_change.new_view {
            self.send(
                out,
                vec![Principal::Order(to)],
                Message::Pbft(PbftMessage::NewView(NewViewMessage::clone(nv))),
                SealFor::Nothing,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{PrePreparedClaim, PreparedClaim};

    fn batch(t: u64) -> Batch {
        Batch {
            time_us: t,
            entries: Vec::new(),
        }
    }

    fn vc(prepared: &[(u64, u64, &Batch)], pre_prepared: &[(u64, u64, &Batch)]) -> ViewChange {
        spec_vc(prepared, pre_prepared, &[])
    }

    /// A VIEW-CHANGE with speculative claims `(seqno, view, history tag, batch)`.
    fn spec_vc(
        prepared: &[(u64, u64, &Batch)],
        pre_prepared: &[(u64, u64, &Batch)],
        speculative: &[(u64, u64, u8, &Batch)],
    ) -> ViewChange {
        ViewChange {
            speculative: speculative
                .iter()
                .map(|(n, v, h, b)| crate::message::SpeculativeClaim {
                    seqno: SeqNo(*n),
                    view: View(*v),
                    history: Digest::of(&[*h]),
                    batch: (*b).clone(),
                })
                .collect(),
            new_view: View(5),
            stable: None,
            prepared: prepared
                .iter()
                .map(|(n, v, b)| PreparedClaim {
                    seqno: SeqNo(*n),
                    view: View(*v),
                    digest: b.digest(),
                    batch: (*b).clone(),
                })
                .collect(),
            pre_prepared: pre_prepared
                .iter()
                .map(|(n, v, b)| PrePreparedClaim {
                    seqno: SeqNo(*n),
                    view: View(*v),
                    digest: b.digest(),
                })
                .collect(),
        }
    }

    #[test]
    fn selection_follows_a1_a2_and_null_rules() {
        let q = Quorums::new(1, 1).unwrap(); // n = 4, medium 3, small 2
        let (a, b) = (batch(1), batch(2));
        // Seqno 1: a prepared in view 1 by two members (Q support 2) -> a.
        // Seqno 2: b claimed prepared by one (possibly lying) member, no Q support -> undecided
        //          unless medium members have no P entry: here 2 of 3 have none -> undecidable.
        let vcs = [
            vc(&[(1, 1, &a)], &[(1, 1, &a)]),
            vc(&[(1, 1, &a)], &[(1, 1, &a)]),
            vc(&[], &[]),
        ];
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        assert_eq!(select(&q, &refs), Some((None, vec![(SeqNo(1), a.clone())])));
        let vcs = [vc(&[(2, 1, &b)], &[]), vc(&[], &[]), vc(&[], &[])];
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        let null = Batch {
            time_us: 0,
            entries: Vec::new(),
        };
        assert_eq!(
            select(&q, &refs),
            None,
            "a lone unsupported P claim blocks a null decision with 3 messages"
        );
        let vcs = [vc(&[(2, 1, &b)], &[]), vc(&[], &[]), vc(&[], &[]), vc(&[], &[])];
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        assert_eq!(
            select(&q, &refs),
            Some((None, vec![(SeqNo(1), null.clone()), (SeqNo(2), null)]))
        );
        // A higher-view prepared claim wins over a lower one for the same seqno.
        let vcs = [
            vc(&[(1, 2, &b)], &[(1, 2, &b)]),
            vc(&[(1, 1, &a)], &[(1, 1, &a), (1, 2, &b)]),
            vc(&[], &[]),
        ];
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        assert_eq!(select(&q, &refs), Some((None, vec![(SeqNo(1), b)])));
    }

    #[test]
    fn speculative_claims_of_small_members_are_kept_unless_a_later_view_prepared() {
        let q = Quorums::new(1, 1).unwrap(); // medium 3, small 2
        let (a, b, c) = (batch(1), batch(2), batch(3));
        let null = Batch {
            time_us: 0,
            entries: Vec::new(),
        };
        // A batch every member executed speculatively in view 2 (a client may have committed
        // it): kept, whatever the third member (here one with another history) claims.
        let vcs = [
            spec_vc(&[], &[], &[(1, 2, 1, &a), (2, 2, 2, &b)]),
            spec_vc(&[], &[], &[(1, 2, 1, &a), (2, 2, 2, &b)]),
            spec_vc(&[], &[], &[(1, 2, 1, &a), (2, 2, 9, &c)]),
        ];
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        assert_eq!(
            select(&q, &refs),
            Some((None, vec![(SeqNo(1), a.clone()), (SeqNo(2), b.clone())]))
        );
        // Positions held by one member only: null (no client committed them).
        let vcs = [
            spec_vc(&[], &[], &[(1, 2, 1, &a)]),
            spec_vc(&[], &[], &[(1, 2, 5, &b)]),
            spec_vc(&[], &[], &[]),
        ];
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        assert_eq!(select(&q, &refs), Some((None, vec![(SeqNo(1), null.clone())])));
        // Same seqno and view, other histories (they differ earlier): no support, null.
        let vcs = [
            spec_vc(&[], &[], &[(1, 2, 1, &a)]),
            spec_vc(&[], &[], &[(1, 2, 2, &a)]),
            spec_vc(&[], &[], &[]),
        ];
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        assert_eq!(select(&q, &refs), Some((None, vec![(SeqNo(1), null)])));
        // A later view re-proposed and prepared another batch there: the prepared one wins.
        let vcs = [
            spec_vc(&[(1, 3, &c)], &[(1, 3, &c)], &[(1, 2, 1, &a)]),
            spec_vc(&[(1, 3, &c)], &[(1, 3, &c)], &[(1, 2, 1, &a)]),
            spec_vc(&[], &[], &[]),
        ];
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        assert_eq!(select(&q, &refs), Some((None, vec![(SeqNo(1), c.clone())])));
        // One member claims a prepared batch of the speculative view or later (a lie, or a view
        // not yet seen): with three messages the speculative claim cannot be decided (S2), with
        // four it is.
        let vcs = [
            spec_vc(&[(1, 2, &c)], &[], &[]),
            spec_vc(&[], &[], &[(1, 2, 1, &a)]),
            spec_vc(&[], &[], &[(1, 2, 1, &a)]),
        ];
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        assert_eq!(select(&q, &refs), None);
        let vcs = [
            spec_vc(&[(1, 2, &c)], &[], &[]),
            spec_vc(&[], &[], &[(1, 2, 1, &a)]),
            spec_vc(&[], &[], &[(1, 2, 1, &a)]),
            spec_vc(&[], &[], &[(1, 2, 1, &a)]),
        ];
        let refs: Vec<&ViewChange> = vcs.iter().collect();
        assert_eq!(select(&q, &refs), Some((None, vec![(SeqNo(1), a)])));
    }
}
