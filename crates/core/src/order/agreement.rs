//! Three-phase agreement (docs/PROTOCOL.md "Normal case" step 3; PBFT thesis 2.3): the primary
//! batches ready requests (and heartbeats when idle) into PRE-PREPAREs; backups validate them in
//! sequence order within the watermarks; PREPARE / COMMIT quorums, with the primary's vote left
//! out while every backup keeps up; committed batches applied in sequence.

use crate::message::PbftMessage;
use crate::stage::PbftTimer;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use super::log::{Prepared, Slot};
use super::persist;
use super::{
    OrderStage, Snapshot, PRIMARY_HELP_HOLD_FRACTION, QUIET_AGAIN_AFTER, QUIET_AGAIN_AFTER_MAX,
    STUCK_SIGNAL_HOLD_FRACTION, WAKE_RETRY_US,
};
use crate::config::{ClusterConfig, Sabotage};
use crate::crypto::Digest;
use crate::ids::{Principal, ReplicaId, SeqNo, StageKind, View};
use crate::message::{batch_digest, history_digest, Batch, Message, SealFor};
use crate::stage::{Action, Time, Timer};

/// The primary's vote (docs/PROTOCOL.md, "The primary's vote"): while every backup keeps up, a
/// backup sends its PREPARE to the other backups only and the primary stays out of the prepare
/// phase; a slot that does not commit within the hold brings the primary in for a while.
#[derive(Debug)]
pub(super) struct PrimaryVote {
    /// Slots this backup sent its PREPARE for, with when (`send_prepare`), and whether it went to
    /// the other backups only (quiet). A quiet one not committed here `PRIMARY_HELP_HOLD_FRACTION`
    /// of the view-change timeout later sends the quiet PREPAREs to the primary, and the oldest
    /// slot due to the other backups again (`PbftTimer::PrimaryHelp`, `check_quiet_prepares`). Committed slots leave it when that timer fires or at a tick
    /// (not on the commit path), so it holds at most the slots accepted within one hold, all in
    /// the window.
    pub(super) waiting_prepares: BTreeMap<SeqNo, (Time, bool)>,
    /// Until this time every PREPARE goes to the primary too: a slot needed the primary's
    /// COMMIT recently (a backup is down, slow or lying).
    pub(super) include_primary_until: Time,
    /// When `PbftTimer::PrimaryHelp` is set to fire, if it is.
    pub(super) primary_help_armed: Option<Time>,
    /// While the primary is included: consecutive committed slots whose previous slot has every
    /// backup's COMMIT here (`note_backups_complete`).
    pub(super) backups_complete_streak: u64,
    /// The streak that leaves the primary out again (`QUIET_AGAIN_AFTER`, doubled after a stall
    /// that follows soon) and when it last did.
    pub(super) quiet_again_after: u64,
    pub(super) last_quiet_again: Option<Time>,
}

impl PrimaryVote {
    pub(super) fn new() -> PrimaryVote {
        PrimaryVote {
            waiting_prepares: BTreeMap::new(),
            include_primary_until: 0,
            primary_help_armed: None,
            backups_complete_streak: 0,
            quiet_again_after: QUIET_AGAIN_AFTER,
            last_quiet_again: None,
        }
    }
}

impl OrderStage {
    // ---- primary ----

    /// The primary orders ready requests while the pipeline and the window allow. Without
    /// `close`, a batch that is not full waits up to `batch_delay_us` (the BatchClose timer).
    pub(super) fn propose(&mut self, now: Time, mut close: bool, out: &mut Vec<Action>) {
        let knobs = &self.config.knobs;
        let (size_max, delay_us) = (knobs.batch_size_max, knobs.batch_delay_us);
        while self.is_primary() && !self.is_abstaining() {
            if self.pool.is_empty() {
                return;
            }
            let Some(n) = self.next_with_room() else {
                return;
            };
            let p = self.projection(n);
            let (ready, full) = self.ready_entries(&p, size_max);
            if ready.is_empty() {
                return;
            }
            if !full && delay_us > 0 && !close {
                if !self.batch_timer_armed {
                    self.batch_timer_armed = true;
                    out.push(Action::SetTimer {
                        timer: Timer::Pbft(PbftTimer::BatchClose),
                        at: now + delay_us,
                    });
                }
                return;
            }
            let time_us = now.max(p.max_time + 1);
            // Entry digests were computed once, when the entries arrived.
            let digest = batch_digest(time_us, ready.iter().map(|c| c.digest()));
            let batch = Batch {
                time_us,
                entries: ready.iter().map(|c| c.signed()).collect(),
            };
            close = false;
            if self.batch_timer_armed {
                self.batch_timer_armed = false;
                out.push(Action::CancelTimer {
                    timer: Timer::Pbft(PbftTimer::BatchClose),
                });
            }
            if let Some(last) = batch.entries.last() {
                self.batch_cursor = last.entry.client;
            }
            self.pre_prepare(now, n, batch, digest, out);
        }
    }

    /// The next sequence number to pre-prepare in this view, if the primary has room for it: in
    /// the log window, with fewer than `pipeline_window` batches in flight.
    pub(super) fn next_with_room(&self) -> Option<SeqNo> {
        let n = self.next_accept();
        let in_flight = n.0 - 1 - self.prefix.last_committed.0;
        let phase_open = !self.speculative_seqno(n) || self.chaining();
        (self.in_window(n) && in_flight < self.config.knobs.pipeline_window && phase_open).then_some(n)
    }

    /// (Primary, `protocol = "quorum"`) ends the view's Backup phase with an empty batch once no
    /// request was ready and nothing was in flight for `quorum_commit_timeout_us`
    /// (`note_empty_backup_batch`), so an idle cluster returns to the Quorum phase without
    /// waiting for heartbeats.
    pub(super) fn fill_backup(&mut self, now: Time, out: &mut Vec<Action>) {
        if !self.fast_protocol() || !self.is_primary() || self.is_abstaining() || self.changing {
            return;
        }
        if let Some(n) = self.next_with_room().filter(|&n| !self.speculative_seqno(n)) {
            let p = self.projection(n);
            if !self.ready_entries(&p, 1).0.is_empty()
                || self.batch_timer_armed
                || n != self.prefix.last_committed.next()
            {
                self.speculation.idle_since = None;
                return;
            }
            // Idle for a while, not merely between two of the clients' rounds.
            let since = *self.speculation.idle_since.get_or_insert(now);
            let at = since.saturating_add(self.backup_idle_us());
            if now < at {
                return self.arm_quorum_timer(now, at, out);
            }
            self.speculation.idle_since = None;
            self.stats.bump("backup_filled");
            self.pre_prepare_empty(now, n, now.max(p.max_time + 1), out);
        }
    }

    /// Orders an empty batch (a heartbeat, or Backup's filler) at `n` with time `time_us`.
    fn pre_prepare_empty(&mut self, now: Time, n: SeqNo, time_us: u64, out: &mut Vec<Action>) {
        let batch = Batch {
            time_us,
            entries: Vec::new(),
        };
        let digest = batch_digest(time_us, std::iter::empty());
        self.pre_prepare(now, n, batch, digest, out);
    }

    /// Orders `batch` as `n` in the current view: accept it, log it, send PRE-PREPARE.
    fn pre_prepare(&mut self, now: Time, n: SeqNo, batch: Batch, digest: Digest, out: &mut Vec<Action>) {
        if self.speculative_seqno(n) {
            // The head of the view's Chain phase (`next_with_room` offers no other fast-phase
            // sequence number).
            return self.chain_accept(now, n, batch, digest, None, out);
        }
        let view = self.view;
        if super::quorum::ends_backup(&batch) {
            self.note_empty_backup_batch(n);
        }
        let slot = self.log.entry(n).or_default();
        slot.accept_digested(n, view, batch.clone(), digest);
        slot.accepted_at = now;
        // Lazily, like a backup's accept (see `try_accept`).
        persist::write_lazily(out, persist::slot_key(n), &slot.record);
        self.stats.bump("pre_prepare_sent");
        self.send_to_order(out, Message::Pbft(PbftMessage::PrePrepare { view, seqno: n, batch }));
        self.early_execute(n, out);
        self.check_prepared(now, n, out);
    }

    /// Heartbeat (on OrderTick): an idle primary (no request waiting, no batch in flight) orders
    /// an empty batch once `heartbeat_interval_us` has passed since the last batch's time, so
    /// agreed time keeps moving for services that wait for it (session expiry, timers).
    pub(super) fn propose_heartbeat(&mut self, now: Time, out: &mut Vec<Action>) {
        let interval = self.config.knobs.heartbeat_interval_us;
        if interval == 0 || !self.is_primary() || self.is_abstaining() || self.changing || !self.pool.is_empty() {
            return;
        }
        let n = self.next_accept();
        if n.0 - 1 != self.prefix.last_committed.0
            || !self.in_window(n)
            || self.speculative_seqno(n) && !self.chaining()
        {
            return;
        }
        let p = self.projection(n);
        let wake = self.wakes.due(p.max_time, self.q.small());
        let spacing = self.heartbeat_spacing(n);
        let due = p.max_time.saturating_add(spacing).min(wake.unwrap_or(u64::MAX));
        if now < due {
            if spacing < interval {
                // Helping a recovery along: the next heartbeat at its time, not at the tick.
                out.push(Action::SetTimer {
                    timer: Timer::Pbft(PbftTimer::Wake),
                    at: due,
                });
            }
            return;
        }
        if wake.is_some_and(|at| now >= at) {
            self.stats.bump("heartbeat_woken");
        }
        self.stats.bump("heartbeat_sent");
        self.pre_prepare_empty(now, n, now.max(p.max_time + 1), out);
    }

    /// (Primary) arms the Wake timer for the wake-up the execution members asked for, if one is
    /// due before the next heartbeat; when it is already due (a batch was in flight when the
    /// timer fired), it looks again in `WAKE_RETRY_US`.
    pub(super) fn arm_wake(&mut self, now: Time, out: &mut Vec<Action>) {
        let interval = self.config.knobs.heartbeat_interval_us;
        if interval == 0 || !self.is_primary() || self.is_abstaining() || self.changing {
            return;
        }
        let max_time = self.prefix.max_time;
        let Some(at) = self.wakes.due(max_time, self.q.small()) else {
            return;
        };
        if at >= max_time.saturating_add(interval) {
            return;
        }
        out.push(Action::SetTimer {
            timer: Timer::Pbft(PbftTimer::Wake),
            at: at.max(now + WAKE_RETRY_US),
        });
    }

    // ---- backups ----

    pub(super) fn on_pre_prepare(
        &mut self,
        now: Time,
        from: ReplicaId,
        view: View,
        seqno: SeqNo,
        batch: &Batch,
        out: &mut Vec<Action>,
    ) {
        if self.changing || view != self.view {
            if self.early_wanted(view) {
                let batch = batch.clone();
                return self.keep_early(from, PbftMessage::PrePrepare { view, seqno, batch });
            }
            return self.wrong_view(now, from, view, out);
        }
        if from != self.primary_of(view) || from == self.id {
            return self.stats.bump("drop_pre_prepare_not_primary");
        }
        if !self.check_window(now, from, seqno, out) {
            return;
        }
        let next = self.next_accept();
        if seqno < next {
            self.stats.bump("dup_pre_prepare");
            self.note_proposal(now, seqno, batch, out);
            return self.help_slot(from, seqno, out);
        }
        if seqno > next {
            if self.buffered.len() < self.log_window() as usize && !self.buffered.contains_key(&seqno) {
                self.buffered.insert(seqno, batch.clone());
                self.stats.bump("pre_prepare_buffered");
            }
            return;
        }
        if self.try_accept(now, seqno, Cow::Borrowed(batch), out) {
            self.note_proposal(now, seqno, batch, out);
            self.drain_buffer(now, out);
        }
    }

    /// Sabotage only (`Sabotage::CountProposalsTwice`): remembers each distinct batch the primary
    /// proposed for an accepted slot, each of which then counts as one more vote of the primary.
    fn note_proposal(&mut self, now: Time, seqno: SeqNo, batch: &Batch, out: &mut Vec<Action>) {
        if self.sabotage() != Some(Sabotage::CountProposalsTwice) {
            return;
        }
        let view = self.view;
        let Some(slot) = self.log.get_mut(&seqno).filter(|s| s.accepted_in(view).is_some()) else {
            return;
        };
        if slot.proposals.insert(batch.digest()) && slot.proposals.len() > 1 {
            self.stats.bump("sabotage_primary_counted_again");
            self.check_prepared(now, seqno, out);
            self.check_committed(now, seqno, out);
        }
    }

    /// Sabotage only: the primary's extra votes for `slot` under `Sabotage::CountProposalsTwice`.
    fn counted_again(sabotage: Option<Sabotage>, slot: &Slot) -> usize {
        match sabotage {
            Some(Sabotage::CountProposalsTwice) => slot.proposals.len().saturating_sub(1),
            _ => 0,
        }
    }

    /// Accepts buffered PRE-PREPAREs that are now next in sequence.
    pub(super) fn drain_buffer(&mut self, now: Time, out: &mut Vec<Action>) {
        loop {
            let next = self.next_accept();
            self.buffered = self.buffered.split_off(&next);
            let Some(batch) = self.buffered.remove(&next) else {
                return;
            };
            if !self.try_accept(now, next, Cow::Owned(batch), out) {
                return;
            }
        }
    }

    /// Checks a batch proposed at `seqno` (the next in sequence) against PROTOCOL.md's rules;
    /// returns its digest (each entry digest is computed at most once, for its matrix and the batch, and
    /// not at all for an entry already in the pool).
    pub(super) fn validate_batch(&self, now: Time, seqno: SeqNo, batch: &Batch) -> Result<Digest, &'static str> {
        let knobs = &self.config.knobs;
        let p = self.projection(seqno);
        let chain_phase = self.speculative_seqno(seqno) && self.chain_protocol();
        if self.speculative_seqno(seqno) && !chain_phase {
            return Err("drop_beyond_backup_phase");
        }
        // An empty batch in a fast protocol's Backup phase ends it (`quorum::ends_backup`).
        let ends_backup = self.fast_protocol() && !chain_phase;
        if batch.entries.is_empty() && !ends_backup {
            // A heartbeat: only when heartbeats are on, and at most about one per interval, so a
            // faulty primary cannot flood the log with empty batches.
            let interval = knobs.heartbeat_interval_us;
            if interval == 0 {
                return Err("drop_empty_batch");
            }
            let woken = self
                .wakes
                .due(p.max_time, self.q.small())
                .is_some_and(|at| batch.time_us >= at);
            let spacing = self.heartbeat_spacing(seqno);
            if !woken && batch.time_us < p.max_time.saturating_add(spacing / 2) {
                return Err("drop_heartbeat_too_soon");
            }
        }
        if batch.entries.len() > knobs.batch_size_max {
            return Err("drop_batch_too_large");
        }
        if batch.time_us <= p.max_time {
            return Err("drop_batch_time_not_increasing");
        }
        if batch.time_us > now.saturating_add(knobs.batch_time_skew_us_max) {
            return Err("drop_batch_time_in_future");
        }
        let mut clients = BTreeSet::new();
        let mut digests = Vec::with_capacity(batch.entries.len());
        for signed in &batch.entries {
            let entry = &signed.entry;
            if !self.pool.knows(entry.client) {
                return Err("drop_batch_unknown_client");
            }
            if !clients.insert(entry.client) {
                return Err("drop_batch_client_twice");
            }
            if Some(entry.client) == self.config.admin && !matches!(entry.body, crate::message::RequestBody::Inline(_))
            {
                // The administrator's changes travel inline (the order stage reads them).
                return Err("drop_batch_admin_by_digest");
            }
            if entry.request_id != self.projected_last(&p, entry.client).next() {
                return Err("drop_batch_request_out_of_sequence");
            }
            let digest = self.pool.digest_of(entry);
            // The batch's matrix, or the rows this member got from the authentication members
            // itself (each checked when it arrived): with key refresh a matrix made before the
            // backups' last refresh may carry MACs they have retired since, while the entry is
            // as well vouched for as ever.
            let accept = self.q.matrix_accept();
            if self.count_rows(&digest, &signed.matrix) < accept
                && !self.pool.vouched(entry.client, entry.request_id, digest, accept)
            {
                return Err("drop_batch_invalid_matrix");
            }
            digests.push(digest);
        }
        Ok(batch_digest(batch.time_us, digests.into_iter()))
    }

    /// Validates and accepts the next PRE-PREPARE, persists it and sends PREPARE.
    fn try_accept(&mut self, now: Time, seqno: SeqNo, batch: Cow<'_, Batch>, out: &mut Vec<Action>) -> bool {
        if self.is_abstaining() {
            self.stats.bump("abstain_pre_prepare");
            return false;
        }
        if self.speculative_seqno(seqno) {
            // Nothing is proposed through the three-phase path past the view's Backup phase.
            self.stats.bump("drop_beyond_backup_phase");
            return false;
        }
        let digest = match self.validate_batch(now, seqno, &batch) {
            Ok(digest) => digest,
            Err(reason) => {
                self.stats.bump(reason);
                return false;
            }
        };
        let (view, me) = (self.view, self.id);
        let slot = self.log.entry(seqno).or_default();
        if let (Some(_), Some(a)) = (slot.record.committed, &slot.record.accepted) {
            if a.digest != digest {
                self.stats.bump("drop_conflicts_committed");
                return false;
            }
        }
        let filler = super::quorum::ends_backup(&batch);
        slot.accept_digested(seqno, view, batch.into_owned(), digest);
        slot.accepted_at = now;
        slot.prepares.insert(me, (view, digest));
        // Lazily: the PREPARE does not wait for the disk. The prepared certificate is written
        // eagerly after this record in the same log, so a member that sends COMMIT (and every
        // member of a commit quorum) holds the batch durably; a crash can only lose accepted
        // batches not yet prepared here, and a restarted member abstains in its view
        // (`abstain_through`), so it never votes for another batch where it may have voted.
        persist::write_lazily(out, persist::slot_key(seqno), &slot.record);
        if filler {
            self.note_empty_backup_batch(seqno);
        }
        self.stats.bump("pre_prepare_accepted");
        self.send_prepare(now, seqno, digest, out);
        self.early_execute(seqno, out);
        self.check_prepared(now, seqno, out);
        true
    }

    /// Sends this backup's PREPARE for an accepted batch. While every backup keeps up, it goes to
    /// the other backups only: the primary needs PREPAREs only to become prepared and send its own
    /// COMMIT, and the `n_order - 1` backups' COMMITs already make the commit quorum
    /// `n_order - u` (u >= 1). So in the normal case the primary receives no PREPARE, syncs no
    /// prepared certificate and sends no COMMIT, and every other member commits on the backups'
    /// COMMITs (the primary too). Safety does not depend on who receives a PREPARE: the prepared
    /// and committed predicates are unchanged. If the slot has not committed here after the hold
    /// (`PbftTimer::PrimaryHelp`), the PREPAREs go to the primary too, and so does every PREPARE for
    /// the next view-change timeout: the primary then prepares and its COMMIT completes the quorum
    /// while a backup is down, slow or silent. A slot sent while the primary is included that
    /// still lacks the primary's COMMIT after the longer stuck-signal hold has its PREPARE sent to
    /// the other backups again: one that committed it without the primary (it hears a member
    /// this one no longer hears) then brings the primary in too (`help_primary_prepare`).
    fn send_prepare(&mut self, now: Time, seqno: SeqNo, digest: Digest, out: &mut Vec<Action>) {
        let view = self.view;
        let message = Message::Pbft(PbftMessage::Prepare { view, seqno, digest });
        if self.q.n_order == self.q.order_medium() {
            return self.send_to_order(out, message);
        }
        let quiet = now >= self.primary_vote.include_primary_until && !self.tentative_needs_primary(seqno);
        if quiet {
            let primary = Principal::Order(self.primary_of(view));
            let backups = self
                .other_order_members()
                .into_iter()
                .filter(|p| *p != primary)
                .collect();
            self.send(out, backups, message, SealFor::Stage(StageKind::Order));
            self.stats.bump("prepare_quiet");
        } else {
            self.send_to_order(out, message);
        }
        self.primary_vote.waiting_prepares.insert(seqno, (now, quiet));
        self.arm_primary_help(now + self.waiting_hold(quiet), out);
    }

    /// Sets `PbftTimer::PrimaryHelp` to fire at `at`, unless it is already set to fire no later.
    fn arm_primary_help(&mut self, at: Time, out: &mut Vec<Action>) {
        if self.primary_vote.primary_help_armed.is_none_or(|armed| at < armed) {
            self.primary_vote.primary_help_armed = Some(at);
            out.push(Action::SetTimer {
                timer: Timer::Pbft(PbftTimer::PrimaryHelp),
                at,
            });
        }
    }

    /// While the primary is included (after a stall): counts commits at which the slot before
    /// the last committed one (if still in the log) holds every backup's COMMIT (same view and
    /// digest); after `quiet_again_after` ([`QUIET_AGAIN_AFTER`] or more) in a row the primary is
    /// left out again. A backup that is down never completes a slot, so then the primary stays
    /// included until the span ends.
    pub(super) fn note_backups_complete(&mut self, now: Time) {
        if now >= self.primary_vote.include_primary_until {
            return;
        }
        let primary = self.primary_of(self.view);
        // A slot a stable checkpoint already discarded tells nothing either way.
        let Some(slot) = self.log.get(&SeqNo(self.prefix.last_committed.0.saturating_sub(1))) else {
            return;
        };
        let vote = slot.record.commit_vote();
        let complete = vote.is_some()
            && ClusterConfig::order_members(&self.q)
                .filter_map(|p| p.replica())
                .filter(|r| *r != primary && *r != self.id)
                .all(|r| slot.commits.get(&r).copied() == vote);
        self.primary_vote.backups_complete_streak = if complete {
            self.primary_vote.backups_complete_streak + 1
        } else {
            0
        };
        if self.primary_vote.backups_complete_streak >= self.primary_vote.quiet_again_after {
            self.primary_vote.backups_complete_streak = 0;
            self.primary_vote.include_primary_until = now;
            self.primary_vote.last_quiet_again = Some(now);
            self.stats.bump("prepare_quiet_again");
        }
    }

    pub(super) fn primary_help_hold(&self) -> Time {
        (self.config.knobs.view_change_timeout_us / PRIMARY_HELP_HOLD_FRACTION).max(1)
    }

    /// How long a slot waits for its commit before `check_quiet_prepares` acts on it: the
    /// primary-help hold if its PREPARE went quiet, the longer stuck-signal hold otherwise.
    fn waiting_hold(&self, quiet: bool) -> Time {
        let fraction = if quiet {
            PRIMARY_HELP_HOLD_FRACTION
        } else {
            STUCK_SIGNAL_HOLD_FRACTION
        };
        (self.config.knobs.view_change_timeout_us / fraction).max(1)
    }

    /// `PbftTimer::PrimaryHelp` (and every tick): drops the waiting slots committed here. If a
    /// quiet one is still uncommitted after the primary-help hold, sends the PREPARE of every
    /// quiet slot to the primary (counted `prepare_primary_helped`) and includes the primary in
    /// every PREPARE for the next view-change timeout. The oldest slot due (a quiet one, or one
    /// without the primary's COMMIT here after the longer stuck-signal hold) also has its PREPARE
    /// sent to the other backups again (counted `prepare_stuck_signalled`): a backup that committed
    /// it without the primary (it hears a member this one no longer hears) then brings the primary
    /// in too (`help_primary_prepare`). Slots due are then forgotten (the tick retransmits them);
    /// the timer is set for the next one due.
    pub(super) fn check_quiet_prepares(&mut self, now: Time, out: &mut Vec<Action>) {
        self.primary_vote.waiting_prepares = self
            .primary_vote
            .waiting_prepares
            .split_off(&self.prefix.last_committed.next());
        let (quiet_hold, stuck_hold) = (self.waiting_hold(true), self.waiting_hold(false));
        let deadline = |&(at, quiet): &(Time, bool)| at.saturating_add(if quiet { quiet_hold } else { stuck_hold });
        let due = |w: &(Time, bool)| deadline(w) <= now;
        let waiting = &self.primary_vote.waiting_prepares;
        let help = waiting.values().any(|w| w.1 && due(w));
        let (view, primary) = (self.view, self.primary_of(self.view));
        let mut signalled = false;
        let mut sends = Vec::new();
        for (&seqno, w) in waiting {
            let (helping, signalling) = (help && w.1, !signalled && due(w));
            if !helping && !signalling {
                continue;
            }
            let Some(accepted) = self.log.get(&seqno).and_then(|slot| {
                let accepted = slot.accepted_in(view)?;
                (w.1 || slot.commits.get(&primary) != Some(&(view, accepted.digest))).then_some(accepted)
            }) else {
                continue;
            };
            signalled |= signalling;
            sends.push((seqno, accepted.digest, helping, signalling));
        }
        let backups: Vec<Principal> = self
            .other_order_members()
            .into_iter()
            .filter(|p| *p != Principal::Order(primary))
            .collect();
        for (seqno, digest, helping, signalling) in sends {
            let message = Message::Pbft(PbftMessage::Prepare { view, seqno, digest });
            if signalling {
                self.stats.bump("prepare_stuck_signalled");
                self.send(out, backups.clone(), message.clone(), SealFor::Stage(StageKind::Order));
            }
            if helping {
                self.stats.bump("prepare_primary_helped");
                self.send(
                    out,
                    vec![Principal::Order(primary)],
                    message,
                    SealFor::Stage(StageKind::Order),
                );
            }
        }
        self.primary_vote
            .waiting_prepares
            .retain(|_, w| !(due(w) || help && w.1));
        if help {
            self.include_primary(now);
        }
        let next = self.primary_vote.waiting_prepares.values().map(deadline).min();
        if let Some(at) = next {
            self.arm_primary_help(at, out);
        }
    }

    /// Includes the primary in every PREPARE for the next view-change timeout, and asks for a
    /// longer streak before leaving it out again if the last return to quiet PREPAREs was recent.
    fn include_primary(&mut self, now: Time) {
        let span = self.config.knobs.view_change_timeout_us;
        self.primary_vote.include_primary_until = now.saturating_add(span);
        self.primary_vote.backups_complete_streak = 0;
        self.primary_vote.quiet_again_after = match self.primary_vote.last_quiet_again {
            Some(at) if now < at.saturating_add(span) => {
                (self.primary_vote.quiet_again_after * 2).min(QUIET_AGAIN_AFTER_MAX)
            }
            _ => QUIET_AGAIN_AFTER,
        };
    }

    /// Another backup resent its PREPARE for a slot committed here: it is stuck on it. If this
    /// backup leaves the primary out and committed the slot without the primary's COMMIT, the
    /// primary may lack the PREPAREs it needs to prepare (ours went to the backups only), and its
    /// COMMIT is what the stuck backup waits for (it no longer hears a member this one still
    /// hears): include the primary for a while and send it our PREPARE for that slot and every
    /// later one whose COMMIT from the primary is not here (counted `prepare_primary_asked_in`).
    /// While the primary is included our PREPAREs already reach it, and nothing is sent.
    fn help_primary_prepare(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) {
        let (view, primary) = (self.view, self.primary_of(self.view));
        if self.q.n_order == self.q.order_medium()
            || self.id == primary
            || from == primary
            || now < self.primary_vote.include_primary_until
        {
            return;
        }
        let Some(slot) = self.log.get(&seqno) else { return };
        let Some(accepted) = slot.accepted_in(view) else { return };
        if slot.record.committed.is_none() || slot.commits.get(&primary) == Some(&(view, accepted.digest)) {
            return;
        }
        self.include_primary(now);
        self.stats.bump("prepare_primary_asked_in");
        let to = Principal::Order(primary);
        let mut prepares = Vec::new();
        for (&n, slot) in self.log.range(seqno..) {
            let Some(accepted) = slot.accepted_in(view) else {
                continue;
            };
            if slot.prepares.contains_key(&self.id) && slot.commits.get(&primary) != Some(&(view, accepted.digest)) {
                prepares.push((n, accepted.digest));
            }
        }
        for (n, digest) in prepares {
            if let Some(waiting) = self.primary_vote.waiting_prepares.get_mut(&n) {
                waiting.1 = false;
            }
            let message = Message::Pbft(PbftMessage::Prepare { view, seqno: n, digest });
            self.send(out, vec![to], message, SealFor::Stage(StageKind::Order));
        }
    }

    /// Checks view and window of an agreement message; helps members that are behind.
    pub(super) fn check_window(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) -> bool {
        self.monitor.voted(from, seqno);
        if seqno <= self.h {
            self.stats.bump("drop_below_window");
            self.help_lagging(now, from, out);
            return false;
        }
        if !self.in_window(seqno) {
            self.stats.bump("drop_out_of_window");
            self.ask_for_stable(from, out);
            return false;
        }
        true
    }

    pub(super) fn on_prepare(
        &mut self,
        now: Time,
        from: ReplicaId,
        view: View,
        seqno: SeqNo,
        digest: Digest,
        out: &mut Vec<Action>,
    ) {
        if self.changing || view != self.view {
            if self.early_wanted(view) {
                return self.keep_early(from, PbftMessage::Prepare { view, seqno, digest });
            }
            return self.wrong_view(now, from, view, out);
        }
        if from == self.primary_of(view) {
            return self.stats.bump("drop_prepare_from_primary");
        }
        if !self.check_window(now, from, seqno, out) {
            return;
        }
        if self.speculative_seqno(seqno) {
            return self.stats.bump("drop_prepare_speculative");
        }
        let earlier = self.log.entry(seqno).or_default().prepares.insert(from, (view, digest));
        self.note_conflict(earlier, view, digest, "conflicting_prepare");
        if seqno <= self.prefix.last_committed {
            self.help_slot(from, seqno, out);
            self.help_primary_prepare(now, from, seqno, out);
        }
        self.check_prepared(now, seqno, out);
    }

    pub(super) fn on_commit(
        &mut self,
        now: Time,
        from: ReplicaId,
        view: View,
        seqno: SeqNo,
        digest: Digest,
        out: &mut Vec<Action>,
    ) {
        if self.changing || view != self.view {
            if self.early_wanted(view) {
                return self.keep_early(from, PbftMessage::Commit { view, seqno, digest });
            }
            return self.wrong_view(now, from, view, out);
        }
        if !self.check_window(now, from, seqno, out) {
            return;
        }
        let earlier = self.log.entry(seqno).or_default().commits.insert(from, (view, digest));
        self.note_conflict(earlier, view, digest, "conflicting_commit");
        if self.chain_protocol() && self.speculative_seqno(seqno) {
            if seqno <= self.prefix.last_committed {
                self.help_chain_slot(now, from, seqno, out);
            } else if seqno == self.next_accept() {
                self.drain_chain(now, out);
            }
        }
        self.check_committed(now, seqno, out);
    }

    /// A sender's second vote for one slot and view with another digest proves it faulty
    /// (a correct member votes once per slot and view): counted as rejected, for the host. The
    /// later vote still replaces the earlier, as any later vote does.
    fn note_conflict(&mut self, earlier: Option<(View, Digest)>, view: View, digest: Digest, name: &'static str) {
        if earlier.is_some_and(|(v, d)| v == view && d != digest) {
            self.stats.reject(name);
        }
    }

    /// Prepared: the accepted PRE-PREPARE plus PREPAREs, the primary's PRE-PREPARE counting as its
    /// vote, from `order_medium` distinct members. Persists the certificate (as the slot's mark:
    /// the batch is already in its record), then sends COMMIT.
    pub(super) fn check_prepared(&mut self, now: Time, seqno: SeqNo, out: &mut Vec<Action>) {
        let (view, me, quorum, primary) = (self.view, self.id, self.agreement_quorum(), self.primary_of(self.view));
        let sabotage = self.sabotage();
        if self.speculative_seqno(seqno) {
            return;
        }
        let Some(slot) = self.log.get_mut(&seqno) else { return };
        let again = Self::counted_again(sabotage, slot);
        let Some(accepted) = slot.accepted_in(view) else { return };
        if slot.prepared_in(view) || Slot::count(&slot.prepares, view, accepted.digest, Some(primary)) + again < quorum
        {
            return;
        }
        let digest = accepted.digest;
        slot.record.prepared = Some(Prepared {
            view,
            digest,
            batch: None,
        });
        slot.commits.insert(me, (view, digest));
        self.stats.bump("prepared");
        persist::write(out, persist::mark_key(seqno), &slot.record.mark());
        self.send_to_order(out, Message::Pbft(PbftMessage::Commit { view, seqno, digest }));
        self.offer_tentative(seqno, out);
        self.check_committed(now, seqno, out);
    }

    /// Committed: `order_medium` COMMITs for the accepted batch in the current view.
    /// In a Quorum phase (`quorum.rs`) the batch this member executed speculatively commits on
    /// a COMMIT from every order member.
    pub(super) fn check_committed(&mut self, now: Time, seqno: SeqNo, out: &mut Vec<Action>) {
        let quorum = if self.speculative_seqno(seqno) {
            self.q.n_order
        } else {
            self.agreement_quorum()
        };
        let view = self.view;
        let sabotage = self.sabotage();
        let chain_phase = self.chain_protocol() && self.speculative_seqno(seqno);
        let Some(slot) = self.log.get(&seqno) else { return };
        let Some(accepted) = slot.accepted_in(view) else { return };
        if slot.record.committed.is_some() {
            return;
        }
        let committed = if chain_phase {
            self.chain_committed(view, accepted.digest, &slot.commits)
        } else {
            Slot::count(&slot.commits, view, accepted.digest, None) + Self::counted_again(sabotage, slot) >= quorum
        };
        if !committed {
            return;
        }
        let slot = self.log.get_mut(&seqno).expect("looked up above");
        slot.record.committed = Some(view);
        // Lazily: the NEXT-BATCH this releases does not wait for the disk. A crash that loses the
        // mark leaves the prepared certificate (synced before our COMMIT went out), so recovery
        // knows the slot as prepared and learns the decision again (COMMITs, view change, or a
        // stable checkpoint); the execution stage ignores a batch it already executed.
        persist::write_lazily(out, persist::mark_key(seqno), &slot.record.mark());
        self.advance_commits(now, out);
    }

    /// Applies the next committed batch to the committed prefix, if there is one.
    pub(super) fn apply_next_committed(&mut self) -> Option<SeqNo> {
        let n = self.prefix.last_committed.next();
        let slot = self.log.get_mut(&n)?;
        slot.record.committed?;
        let accepted = slot.record.accepted.as_ref().expect("a committed slot holds its batch");
        let history = history_digest(&self.prefix.history, &accepted.digest);
        slot.history = Some(history);
        let admin_batch = self
            .config
            .admin
            .is_some_and(|a| accepted.batch.entries.iter().any(|e| e.entry.client == a))
            .then(|| accepted.batch.clone());
        // A null batch (view change) has time 0; a heartbeat's time counts.
        self.prefix.max_time = self.prefix.max_time.max(accepted.batch.time_us);
        for e in &accepted.batch.entries {
            let last = self.prefix.last_ordered.entry(e.entry.client).or_default();
            *last = (*last).max(e.entry.request_id);
        }
        self.prefix.history = history;
        self.prefix.last_committed = n;
        if let Some(batch) = admin_batch {
            self.note_reconfiguration(n, &batch);
        }
        if n.0.is_multiple_of(self.config.knobs.checkpoint_interval) {
            let last_ordered = self.prefix.last_ordered.iter().map(|(c, r)| (*c, *r)).collect();
            self.prefix.snapshots.insert(
                n,
                Snapshot {
                    history,
                    time_us: self.prefix.max_time,
                    last_ordered,
                    pending: self.prefix.pending.clone(),
                },
            );
        }
        Some(n)
    }

    /// Applies committed batches after a restart (nothing is sent: execution asks with LAST-EXEC).
    pub(super) fn replay_committed(&mut self) {
        while self.apply_next_committed().is_some() {}
    }
}
