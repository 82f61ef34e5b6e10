//! Normal case (docs/PROTOCOL.md "Normal case" steps 3-4; PBFT thesis 2.3): the primary batches
//! requests whose matrix signatures it collected, backups validate PRE-PREPAREs in sequence order,
//! PREPARE / COMMIT quorums, NEXT-BATCH to the execution stage once a batch and all before it
//! committed; execution catch-up (LAST-EXEC, RETRANSMIT) and retransmission after losses.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::mem;

use super::log::{Prepared, Slot};
use super::persist;
use super::request_pool::{Candidate, Inserted};
use super::{
    OrderStage, Snapshot, BATCH_INLINE_BYTES_MAX, LAST_EXEC_RESEND_MAX, NEXT_BATCH_HOLD_FRACTION,
    PRIMARY_HELP_HOLD_FRACTION, QUIET_AGAIN_AFTER, QUIET_AGAIN_AFTER_MAX,
};
use crate::config::{ClusterConfig, Sabotage};
use crate::crypto::{Digest, MatrixRow, MatrixSignature};
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, StageKind, View};
use crate::message::{batch_digest, history_digest, AuthItem, Batch, Message, RequestEntry, SealFor};
use crate::stage::{Action, Event, Time, Timer};

/// The state after the committed prefix and the accepted batches of the current view before a
/// sequence number: what the next batch is validated against.
pub(super) struct Projection {
    /// Last ordered request per client, where it differs from the committed prefix.
    overlay: BTreeMap<ClientId, RequestId>,
    /// Largest batch time so far.
    pub max_time: u64,
    /// History digest so far.
    pub history: Digest,
}

impl OrderStage {
    /// First sequence number without an accepted PRE-PREPARE of the current view.
    pub(super) fn next_accept(&self) -> SeqNo {
        let mut n = self.last_committed.next();
        while self.log.get(&n).and_then(|s| s.accepted_in(self.view)).is_some() {
            n = n.next();
        }
        n
    }

    /// The projection through the accepted batches of the current view in `(last_committed, upto)`.
    pub(super) fn projection(&self, upto: SeqNo) -> Projection {
        let mut p = Projection {
            overlay: BTreeMap::new(),
            max_time: self.max_time,
            history: self.history,
        };
        for (_, slot) in self.log.range(self.last_committed.next()..upto) {
            let Some(accepted) = slot.accepted_in(self.view) else {
                break;
            };
            for e in &accepted.batch.entries {
                let current = self.projected_last(&p, e.entry.client);
                p.overlay.insert(e.entry.client, current.max(e.entry.request_id));
            }
            // A null batch (view change) has time 0; a heartbeat's time counts.
            p.max_time = p.max_time.max(accepted.batch.time_us);
            p.history = history_digest(&p.history, &accepted.digest);
        }
        p
    }

    fn projected_last(&self, p: &Projection, client: ClientId) -> RequestId {
        p.overlay
            .get(&client)
            .copied()
            .unwrap_or_else(|| self.last_ordered_of(client))
    }

    /// Matrix rows valid for this member (all rows from distinct authentication members under
    /// `Sabotage::SkipMac`).
    pub(super) fn count_rows(&self, digest: &Digest, matrix: &MatrixSignature) -> usize {
        if self.sabotage() == Some(Sabotage::SkipMac) {
            let signers: BTreeSet<ReplicaId> = matrix
                .rows
                .iter()
                .map(|r| r.signer)
                .filter(|s| (s.0 as usize) < self.q.n_auth)
                .collect();
            return signers.len();
        }
        self.keys
            .count_valid_matrix_rows(self.id.0 as usize, self.q.n_auth, digest, matrix)
    }

    // ---- requests from the authentication stage ----

    /// An AUTH-REQ (its seal already checked, once for the whole message): each item is handled
    /// on its own; a bad item is dropped and counted, the others are kept.
    pub(super) fn on_auth_requests(&mut self, now: Time, from: ReplicaId, items: &[AuthItem], out: &mut Vec<Action>) {
        if items.is_empty() {
            return self.stats.bump("drop_empty_auth_request");
        }
        for item in items {
            self.on_auth_request(now, from, &item.entry, &item.row, out);
        }
    }

    /// Whether `row` is a row of authentication member `row.signer` valid for this member (any
    /// row of a configured authentication member under `Sabotage::SkipMac`).
    fn row_valid(&self, digest: &Digest, row: &MatrixRow) -> bool {
        if (row.signer.0 as usize) >= self.q.n_auth {
            return false;
        }
        self.sabotage() == Some(Sabotage::SkipMac)
            || self
                .keys
                .verify_authenticator(
                    Principal::Auth(row.signer),
                    self.id.0 as usize,
                    digest,
                    &row.authenticator,
                )
                .is_ok()
    }

    fn on_auth_request(
        &mut self,
        now: Time,
        from: ReplicaId,
        entry: &RequestEntry,
        row: &MatrixRow,
        out: &mut Vec<Action>,
    ) {
        if row.signer != from {
            return self.stats.bump("drop_row_signer_mismatch");
        }
        if !self.pool.knows(entry.client) {
            return self.stats.bump("drop_unknown_client");
        }
        let digest = self.pool.digest_of(entry);
        if !self.row_valid(&digest, row) {
            return self.stats.bump("drop_bad_matrix_row");
        }
        let last = self.last_ordered_of(entry.client);
        if entry.request_id <= last {
            return self.retransmit_reply(now, entry.client, entry.request_id, out);
        }
        match self.pool.insert(entry, digest, row, last) {
            Inserted::New => self.stats.bump("request_rows"),
            Inserted::Duplicate => self.stats.bump("drop_duplicate_row"),
            Inserted::TooFarAhead => self.stats.bump("drop_request_too_far_ahead"),
            Inserted::UnknownClient => unreachable!("checked with knows()"),
        }
    }

    /// RETRANSMIT to every execution member, at most once per request per
    /// `auth_retransmit_interval_us`.
    fn retransmit_reply(&mut self, now: Time, client: ClientId, request_id: RequestId, out: &mut Vec<Action>) {
        let interval = self.config.knobs.auth_retransmit_interval_us;
        if let Some(&(rid, at)) = self.retransmitted.get(&client) {
            if rid == request_id && now < at.saturating_add(interval) {
                return self.stats.bump("retransmit_suppressed");
            }
        }
        self.retransmitted.insert(client, (request_id, now));
        self.stats.bump("retransmit_sent");
        for exec in ClusterConfig::exec_members(&self.q) {
            self.send(
                out,
                vec![exec],
                Message::Retransmit { client, request_id },
                SealFor::One(exec),
            );
        }
    }

    /// Requests ready to be ordered after the projection `p`: the next request of each client
    /// with `matrix_collect` rows valid for this member.
    /// Up to `max` of them, one per client, taking clients in turn from just after the last
    /// client of the previous batch: with more ready clients than fit in a batch, none waits for
    /// more than `clients / max` batches (in id order, low ids could starve the others).
    /// After the first, they also stop at [`BATCH_INLINE_BYTES_MAX`] bytes of inline bodies. The
    /// flag says the batch is full (either bound was reached), so it need not wait to fill.
    /// Borrowed from the pool: nothing is cloned until a batch is built from them.
    pub(super) fn ready_entries(&self, p: &Projection, max: usize) -> (Vec<&Candidate>, bool) {
        let mut ready = Vec::with_capacity(max.min(64));
        let mut inline_bytes = 0;
        for client in self.pool.clients_after(self.batch_cursor) {
            if ready.len() >= max {
                break;
            }
            let next = self.projected_last(p, client).next();
            if let Some(entry) = self.pool.ready(client, next, self.q.matrix_collect()) {
                inline_bytes += entry.inline_bytes();
                if !ready.is_empty() && inline_bytes > BATCH_INLINE_BYTES_MAX {
                    return (ready, true);
                }
                ready.push(entry);
            }
        }
        let full = ready.len() >= max;
        (ready, full)
    }

    // ---- primary ----

    /// The primary orders ready requests while the pipeline and the window allow. Without
    /// `close`, a batch that is not full waits up to `batch_delay_us` (the BatchClose timer).
    pub(super) fn propose(&mut self, now: Time, mut close: bool, out: &mut Vec<Action>) {
        let knobs = &self.config.knobs;
        let (size_max, delay_us, window) = (knobs.batch_size_max, knobs.batch_delay_us, knobs.pipeline_window);
        while self.is_primary() && !self.is_abstaining() {
            if self.pool.is_empty() {
                return;
            }
            let n = self.next_accept();
            let in_flight = n.0 - 1 - self.last_committed.0;
            if !self.in_window(n) || in_flight >= window {
                return;
            }
            let p = self.projection(n);
            let (ready, full) = self.ready_entries(&p, size_max);
            if ready.is_empty() {
                return;
            }
            if !full && delay_us > 0 && !close {
                if !self.batch_timer_armed {
                    self.batch_timer_armed = true;
                    out.push(Action::SetTimer {
                        timer: Timer::BatchClose,
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
                    timer: Timer::BatchClose,
                });
            }
            if let Some(last) = batch.entries.last() {
                self.batch_cursor = last.entry.client;
            }
            self.pre_prepare(now, n, batch, digest, out);
        }
    }

    /// Orders `batch` as `n` in the current view: accept it, log it, send PRE-PREPARE.
    fn pre_prepare(&mut self, now: Time, n: SeqNo, batch: Batch, digest: Digest, out: &mut Vec<Action>) {
        let view = self.view;
        let slot = self.log.entry(n).or_default();
        slot.accept_digested(n, view, batch.clone(), digest);
        // Lazily, like a backup's accept (see `try_accept`).
        persist::write_lazily(out, persist::slot_key(n), &slot.record);
        self.stats.bump("pre_prepare_sent");
        self.send_to_order(out, Message::PrePrepare { view, seqno: n, batch });
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
        if n.0 - 1 != self.last_committed.0 || !self.in_window(n) {
            return;
        }
        let p = self.projection(n);
        if now < p.max_time.saturating_add(interval) {
            return;
        }
        let time_us = now.max(p.max_time + 1);
        let batch = Batch {
            time_us,
            entries: Vec::new(),
        };
        let digest = batch_digest(time_us, std::iter::empty());
        self.stats.bump("heartbeat_sent");
        self.pre_prepare(now, n, batch, digest, out);
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
            self.drain_buffer(now, out);
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
    fn validate_batch(&self, now: Time, seqno: SeqNo, batch: &Batch) -> Result<Digest, &'static str> {
        let knobs = &self.config.knobs;
        let p = self.projection(seqno);
        if batch.entries.is_empty() {
            // A heartbeat: only when heartbeats are on, and at most about one per interval, so a
            // faulty primary cannot flood the log with empty batches.
            let interval = knobs.heartbeat_interval_us;
            if interval == 0 {
                return Err("drop_empty_batch");
            }
            if batch.time_us < p.max_time.saturating_add(interval / 2) {
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
            if entry.request_id != self.projected_last(&p, entry.client).next() {
                return Err("drop_batch_request_out_of_sequence");
            }
            let digest = self.pool.digest_of(entry);
            if self.count_rows(&digest, &signed.matrix) < self.q.matrix_accept() {
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
        slot.accept_digested(seqno, view, batch.into_owned(), digest);
        slot.prepares.insert(me, (view, digest));
        // Lazily: the PREPARE does not wait for the disk. The prepared certificate is written
        // eagerly after this record in the same log, so a member that sends COMMIT (and every
        // member of a commit quorum) holds the batch durably; a crash can only lose accepted
        // batches not yet prepared here, and a restarted member abstains in its view
        // (`abstain_through`), so it never votes for another batch where it may have voted.
        persist::write_lazily(out, persist::slot_key(seqno), &slot.record);
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
    /// (`Timer::PrimaryHelp`), the PREPAREs go to the primary too, and so does every PREPARE for
    /// the next view-change timeout: the primary then prepares and its COMMIT completes the quorum
    /// while a backup is down, slow or silent.
    fn send_prepare(&mut self, now: Time, seqno: SeqNo, digest: Digest, out: &mut Vec<Action>) {
        let view = self.view;
        let message = Message::Prepare { view, seqno, digest };
        let quiet = self.q.n_order > self.q.order_medium() && now >= self.include_primary_until;
        if !quiet {
            return self.send_to_order(out, message);
        }
        let primary = Principal::Order(self.primary_of(view));
        let backups = self
            .other_order_members()
            .into_iter()
            .filter(|p| *p != primary)
            .collect();
        self.send(out, backups, message, SealFor::Stage(StageKind::Order));
        self.quiet_prepares.insert(seqno, now);
        self.stats.bump("prepare_quiet");
        self.arm_primary_help(now + self.primary_help_hold(), out);
    }

    /// Sets `Timer::PrimaryHelp` unless it is already set (it then fires no later than `at`:
    /// it was set for an older quiet slot).
    fn arm_primary_help(&mut self, at: Time, out: &mut Vec<Action>) {
        if !self.primary_help_armed {
            self.primary_help_armed = true;
            out.push(Action::SetTimer {
                timer: Timer::PrimaryHelp,
                at,
            });
        }
    }

    /// While the primary is included (after a stall): counts commits at which the slot before
    /// the last committed one (if still in the log) holds every backup's COMMIT (same view and
    /// digest); after `quiet_again_after` ([`QUIET_AGAIN_AFTER`] or more) in a row the primary is
    /// left out again. A backup that is down never completes a slot, so then the primary stays
    /// included until the span ends.
    fn note_backups_complete(&mut self, now: Time) {
        if now >= self.include_primary_until {
            return;
        }
        let primary = self.primary_of(self.view);
        // A slot a stable checkpoint already discarded tells nothing either way.
        let Some(slot) = self.log.get(&SeqNo(self.last_committed.0.saturating_sub(1))) else {
            return;
        };
        let vote = slot.record.commit_vote();
        let complete = vote.is_some()
            && ClusterConfig::order_members(&self.q)
                .filter_map(|p| p.replica())
                .filter(|r| *r != primary && *r != self.id)
                .all(|r| slot.commits.get(&r).copied() == vote);
        self.backups_complete_streak = if complete { self.backups_complete_streak + 1 } else { 0 };
        if self.backups_complete_streak >= self.quiet_again_after {
            self.backups_complete_streak = 0;
            self.include_primary_until = now;
            self.last_quiet_again = Some(now);
            self.stats.bump("prepare_quiet_again");
        }
    }

    fn primary_help_hold(&self) -> Time {
        (self.config.knobs.view_change_timeout_us / PRIMARY_HELP_HOLD_FRACTION).max(1)
    }

    /// `Timer::PrimaryHelp` (and every tick): drops the quiet slots committed here; if one is still
    /// uncommitted after the hold, sends the PREPARE of every quiet slot to the primary and
    /// includes the primary in every PREPARE for the next view-change timeout (counted
    /// `prepare_primary_helped`). Otherwise sets the timer for the oldest one left.
    pub(super) fn check_quiet_prepares(&mut self, now: Time, out: &mut Vec<Action>) {
        self.quiet_prepares = self.quiet_prepares.split_off(&self.last_committed.next());
        let hold = self.primary_help_hold();
        let Some((_, &oldest)) = self.quiet_prepares.first_key_value() else {
            return;
        };
        if oldest.saturating_add(hold) > now {
            return self.arm_primary_help(oldest + hold, out);
        }
        let span = self.config.knobs.view_change_timeout_us;
        self.include_primary_until = now.saturating_add(span);
        self.backups_complete_streak = 0;
        // A stall soon after the last return to quiet PREPAREs: ask for a longer streak next time.
        self.quiet_again_after = match self.last_quiet_again {
            Some(at) if now < at.saturating_add(span) => (self.quiet_again_after * 2).min(QUIET_AGAIN_AFTER_MAX),
            _ => QUIET_AGAIN_AFTER,
        };
        let (view, primary) = (self.view, Principal::Order(self.primary_of(self.view)));
        for seqno in mem::take(&mut self.quiet_prepares).into_keys() {
            let Some(accepted) = self.log.get(&seqno).and_then(|s| s.accepted_in(view)) else {
                continue;
            };
            let message = Message::Prepare {
                view,
                seqno,
                digest: accepted.digest,
            };
            self.stats.bump("prepare_primary_helped");
            self.send(out, vec![primary], message, SealFor::Stage(StageKind::Order));
        }
    }

    /// Checks view and window of an agreement message; helps members that are behind.
    fn check_window(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) -> bool {
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
            return self.wrong_view(now, from, view, out);
        }
        if from == self.primary_of(view) {
            return self.stats.bump("drop_prepare_from_primary");
        }
        if !self.check_window(now, from, seqno, out) {
            return;
        }
        self.log.entry(seqno).or_default().prepares.insert(from, (view, digest));
        if seqno <= self.last_committed {
            self.help_slot(from, seqno, out);
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
            return self.wrong_view(now, from, view, out);
        }
        if !self.check_window(now, from, seqno, out) {
            return;
        }
        self.log.entry(seqno).or_default().commits.insert(from, (view, digest));
        self.check_committed(now, seqno, out);
    }

    /// Prepared: the accepted PRE-PREPARE plus PREPAREs, the primary's PRE-PREPARE counting as its
    /// vote, from `order_medium` distinct members. Persists the certificate (as the slot's mark:
    /// the batch is already in its record), then sends COMMIT.
    pub(super) fn check_prepared(&mut self, now: Time, seqno: SeqNo, out: &mut Vec<Action>) {
        let (view, me, quorum, primary) = (self.view, self.id, self.agreement_quorum(), self.primary_of(self.view));
        let Some(slot) = self.log.get_mut(&seqno) else { return };
        let Some(accepted) = slot.accepted_in(view) else { return };
        if slot.prepared_in(view) || Slot::count(&slot.prepares, view, accepted.digest, Some(primary)) < quorum {
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
        self.send_to_order(out, Message::Commit { view, seqno, digest });
        self.check_committed(now, seqno, out);
    }

    /// Committed: `order_medium` COMMITs for the accepted batch in the current view.
    pub(super) fn check_committed(&mut self, now: Time, seqno: SeqNo, out: &mut Vec<Action>) {
        let (view, quorum) = (self.view, self.agreement_quorum());
        let Some(slot) = self.log.get_mut(&seqno) else { return };
        let Some(accepted) = slot.accepted_in(view) else { return };
        if slot.record.committed.is_some() || Slot::count(&slot.commits, view, accepted.digest, None) < quorum {
            return;
        }
        slot.record.committed = Some(view);
        // Lazily: the NEXT-BATCH this releases does not wait for the disk. A crash that loses the
        // mark leaves the prepared certificate (synced before our COMMIT went out), so recovery
        // knows the slot as prepared and learns the decision again (COMMITs, view change, or a
        // stable checkpoint); the execution stage ignores a batch it already executed.
        persist::write_lazily(out, persist::mark_key(seqno), &slot.record.mark());
        self.advance_commits(now, out);
    }

    /// Applies the next committed batch to the committed prefix, if there is one.
    fn apply_next_committed(&mut self) -> Option<SeqNo> {
        let n = self.last_committed.next();
        let slot = self.log.get_mut(&n)?;
        slot.record.committed?;
        let accepted = slot.record.accepted.as_ref().expect("a committed slot holds its batch");
        let history = history_digest(&self.history, &accepted.digest);
        slot.history = Some(history);
        // A null batch (view change) has time 0; a heartbeat's time counts.
        self.max_time = self.max_time.max(accepted.batch.time_us);
        for e in &accepted.batch.entries {
            let last = self.last_ordered.entry(e.entry.client).or_default();
            *last = (*last).max(e.entry.request_id);
        }
        self.history = history;
        self.last_committed = n;
        if n.0.is_multiple_of(self.config.knobs.checkpoint_interval) {
            let last_ordered = self.last_ordered.iter().map(|(c, r)| (*c, *r)).collect();
            self.snapshots.insert(
                n,
                Snapshot {
                    history,
                    time_us: self.max_time,
                    last_ordered,
                },
            );
        }
        Some(n)
    }

    /// Applies committed batches after a restart (nothing is sent: execution asks with LAST-EXEC).
    pub(super) fn replay_committed(&mut self) {
        while self.apply_next_committed().is_some() {}
    }

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
                    let last = self.last_ordered.get(&e.entry.client).copied().unwrap_or_default();
                    self.pool.gc(e.entry.client, last);
                }
            }
            let (view, history) = (slot.record.committed.unwrap_or_default(), self.history);
            out.push(Action::Note(Event::Committed {
                seqno: n,
                view,
                history,
            }));
            self.stats.bump("batch_committed");
            if let Some(accepted) = &slot.record.accepted {
                let requests = accepted
                    .batch
                    .entries
                    .iter()
                    .map(|e| (e.entry.client, e.entry.request_id));
                self.tell_auth_ordered(n, requests.collect(), out);
            }
            if let Some(message) = self.next_batch_message(n) {
                let own = Principal::Exec(self.id);
                if ClusterConfig::exec_members(&self.q).any(|p| p == own) {
                    self.send_to_exec(out, vec![own], message);
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
        self.note_backups_complete(now);
        self.send_owed_next_batches(now, SeqNo(0), out);
        self.consecutive_view_changes = 0;
        if self.view_change_deadline.is_some() && !self.changing {
            let at = now + self.view_change_timeout();
            self.view_change_deadline = Some(at);
            out.push(Action::SetTimer {
                timer: Timer::ViewChange,
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
        Some(Message::NextBatch {
            view,
            seqno,
            history,
            time_us: accepted.batch.time_us,
            entries: accepted.batch.entries.iter().map(|e| e.entry.clone()).collect(),
        })
    }

    /// `Sabotage::EarlyExecute`: release a batch to execution as soon as it is pre-prepared.
    fn early_execute(&self, seqno: SeqNo, out: &mut Vec<Action>) {
        if self.sabotage() != Some(Sabotage::EarlyExecute) {
            return;
        }
        let Some(accepted) = self.log.get(&seqno).and_then(|s| s.accepted_in(self.view)) else {
            return;
        };
        let history = self.projection(seqno.next()).history;
        let message = Message::NextBatch {
            view: self.view,
            seqno,
            history,
            time_us: accepted.batch.time_us,
            entries: accepted.batch.entries.iter().map(|e| e.entry.clone()).collect(),
        };
        self.send_to_exec(out, ClusterConfig::exec_members(&self.q).collect(), message);
    }

    // ---- execution catch-up ----

    pub(super) fn on_last_executed(&mut self, from: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) {
        let exec = Principal::Exec(from);
        if seqno < self.h {
            if let Some(stable) = &self.stable {
                let message = Message::LoadCheckpoint {
                    seqno: self.h,
                    exec_state: stable.checkpoint.exec_state,
                };
                self.stats.bump("load_checkpoint_sent");
                self.send(out, vec![exec], message, SealFor::One(exec));
            }
            return;
        }
        let last = self.last_committed.0.min(seqno.0.saturating_add(LAST_EXEC_RESEND_MAX));
        for n in seqno.0 + 1..=last {
            if let Some(message) = self.next_batch_message(SeqNo(n)) {
                self.stats.bump("next_batch_resent");
                self.send_to_exec(out, vec![exec], message);
            }
        }
    }

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
                let message = Message::PrePrepare {
                    view,
                    seqno,
                    batch: accepted.batch.clone(),
                };
                self.send(out, missing, message, SealFor::Stage(StageKind::Order));
            } else if seqno > self.last_committed {
                self.send_to_order(out, Message::Prepare { view, seqno, digest });
            }
            if seqno > self.last_committed && slot.prepared_in(view) {
                self.send_to_order(out, Message::Commit { view, seqno, digest });
            }
        }
    }

    /// A member retransmitted agreement messages for a slot committed here: send it our COMMIT.
    fn help_slot(&self, to: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>) {
        let Some(slot) = self.log.get(&seqno) else { return };
        if slot.record.committed.is_none() || !slot.prepared_in(self.view) {
            return;
        }
        if let Some(accepted) = slot.accepted_in(self.view) {
            let message = Message::Commit {
                view: self.view,
                seqno,
                digest: accepted.digest,
            };
            let to = Principal::Order(to);
            self.send(out, vec![to], message, SealFor::Stage(StageKind::Order));
        }
    }

    /// A message of another view: drop it; a member still in an older view gets our NEW-VIEW.
    pub(super) fn wrong_view(&mut self, now: Time, from: ReplicaId, view: View, out: &mut Vec<Action>) {
        self.stats.bump("drop_wrong_view");
        if !self.changing && view < self.view && self.new_view.is_some() && self.may_help(now, from) {
            let message = Message::NewView(self.new_view.clone().expect("checked"));
            self.send(out, vec![Principal::Order(from)], message, SealFor::Nothing);
        }
    }

    /// A member sent something at or below our stable checkpoint: send it the certificate.
    pub(super) fn help_lagging(&mut self, now: Time, to: ReplicaId, out: &mut Vec<Action>) {
        if self.stable.is_some() && to != self.id && self.may_help(now, to) {
            let message = Message::OrderCheckpointState(self.stable.clone().expect("checked"));
            self.send(out, vec![Principal::Order(to)], message, SealFor::Nothing);
        }
    }

    /// A member works beyond our window: we are behind; ask it for its stable checkpoint.
    fn ask_for_stable(&mut self, from: ReplicaId, out: &mut Vec<Action>) {
        if self.fetching.is_some() {
            return;
        }
        let seqno = self.h.next();
        self.fetching = Some((seqno, Digest::default()));
        let message = Message::FetchOrderCheckpoint {
            seqno,
            digest: Digest::default(),
        };
        self.send(
            out,
            vec![Principal::Order(from)],
            message,
            SealFor::Stage(StageKind::Order),
        );
    }
}
