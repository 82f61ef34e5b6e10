//! Normal-case execution (PROTOCOL.md steps 5-7): accept NEXT-BATCH quorums, fetch bodies ordered
//! by digest, execute whole batches in sequence order, reply to clients, report BATCH-COMPLETE,
//! answer RETRANSMIT from the reply cache.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::fetch::Want;
use super::reply_cache::{reply_body, CachedResult};
use super::ExecStage;
use crate::config::ClusterConfig;
use crate::contract::next_batch::{AgreedBatch, Offered};
use crate::crypto::Digest;
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, View};
use crate::message::{batch_seed, history_digest, Message, RequestBody, RequestEntry, SealFor};
use crate::service::{BatchContext, Effects, ServiceRequest};
use crate::stage::{Action, Event, Time};

impl ExecStage {
    /// Highest sequence number the stage is heading to: the last executed one, or the checkpoint
    /// being loaded. NEXT-BATCHes are buffered up to `log_window` beyond it.
    pub(super) fn window_base(&self) -> SeqNo {
        self.transfer
            .as_ref()
            .map_or(self.last_executed, |t| t.seqno().max(self.last_executed))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_next_batch(
        &mut self,
        from: ReplicaId,
        seqno: SeqNo,
        history: Digest,
        time_us: u64,
        entries: &[RequestEntry],
        out: &mut Vec<Action>,
    ) {
        if seqno <= self.last_executed {
            self.stats.bump("next_batch_old");
            return;
        }
        if seqno.0 > self.window_base().0.saturating_add(self.config.knobs.log_window) {
            self.stats.bump("next_batch_beyond_window");
            return;
        }
        let offered = Offered {
            from,
            seqno,
            history,
            time_us,
            entries,
        };
        match self.batches.offer(offered, (self.last_executed, self.history)) {
            Err(reason) => self.stats.bump(reason),
            Ok(false) => {}
            Ok(true) => {
                self.stats.bump("batch_agreed");
                self.request_bodies(out);
                self.execute_ready(out);
            }
        }
    }

    /// Registers and requests (FETCH to auth member `(client + fetch_from) mod n_auth`) the
    /// missing bodies of agreed batches, in sequence order, within the fetch bound.
    pub(super) fn request_bodies(&mut self, out: &mut Vec<Action>) {
        let next = self.last_executed.next();
        let mut fetches = Vec::new();
        'batches: for batch in self.batches.ready_batches() {
            for entry in &batch.entries {
                let RequestBody::Digest(digest) = entry.body else {
                    continue;
                };
                if entry.request_id <= self.replies.last_id(entry.client) {
                    continue; // A duplicate is not executed, so its body is not needed.
                }
                match self.fetcher.want(
                    batch.seqno,
                    (entry.client, entry.request_id, digest),
                    batch.seqno == next,
                ) {
                    Want::Registered => fetches.push((entry.client, entry.request_id, digest)),
                    Want::Known => {}
                    Want::Full => break 'batches,
                }
            }
        }
        for (client, request_id, operation_digest) in fetches {
            let to = self
                .first_fetch_targets(client)
                .into_iter()
                .map(|a| Principal::Auth(ReplicaId(a)))
                .collect();
            let message = Message::Fetch {
                client,
                request_id,
                operation_digest,
            };
            self.stats.bump("fetch_sent");
            self.send(to, message, SealFor::Stage(crate::ids::StageKind::Auth), out);
        }
    }

    /// The authentication members a body of `client` is first asked of. A client sends a new
    /// request to its preferred quorum first (`n_auth - u` members from `client mod n_auth`,
    /// `Quorums::client_preferred`), so those members hold the body. The co-located member, if it
    /// is one of them and not a suspect, answers alone (same process: no network hop). Otherwise
    /// two of them (from `(client + fetch_from)`, skipping suspects) are asked at once, so one
    /// member that answers late (slow or overloaded) does not hold the body up until the retry
    /// tick; with fewer than two such members, the first member from `(client + fetch_from) mod
    /// n_auth` that is not a suspect.
    fn first_fetch_targets(&self, client: ClientId) -> Vec<u32> {
        let n = self.q.n_auth as u64;
        let preferred = |a: u32| (a as u64 + n - client.0 as u64 % n) % n < self.q.client_preferred() as u64;
        let usable = |a: &u32| !self.fetch_suspects.contains(a);
        let own = self.id.0;
        if !self.q.separate_stages && (own as u64) < n && preferred(own) && usable(&own) {
            return vec![own];
        }
        let base = client.0 as u64 + self.fetch_from as u64;
        let ring = (0..n).map(|k| ((base + k) % n) as u32);
        let two: Vec<u32> = ring.clone().filter(|a| preferred(*a) && usable(a)).take(2).collect();
        if two.len() == 2 {
            return two;
        }
        vec![ring.clone().find(usable).unwrap_or((base % n) as u32)]
    }

    /// Retry tick: every missing body is asked of all authentication members, the members first
    /// asked for them become suspects, and later fetches go first to the next member (the one
    /// asked first may be down).
    pub(super) fn retry_fetches(&mut self, out: &mut Vec<Action>) {
        let missing: Vec<_> = self.fetcher.missing().copied().collect();
        for (client, _, _) in &missing {
            for first in self.first_fetch_targets(*client) {
                // Never all of them: with every member suspected, asking any first is as good.
                if self.fetch_suspects.len() + 1 < self.q.n_auth {
                    self.fetch_suspects.insert(first);
                }
            }
        }
        if !missing.is_empty() {
            self.fetch_from = (self.fetch_from + 1) % self.q.n_auth as u32;
            self.stats.bump("fetch_first_moved");
        }
        for (client, request_id, operation_digest) in missing {
            let message = Message::Fetch {
                client,
                request_id,
                operation_digest,
            };
            let to = ClusterConfig::auth_members(&self.q).collect();
            self.stats.bump("fetch_retried");
            self.send(to, message, SealFor::Stage(crate::ids::StageKind::Auth), out);
        }
    }

    pub(super) fn on_command(
        &mut self,
        client: ClientId,
        request_id: RequestId,
        operation: &Bytes,
        out: &mut Vec<Action>,
    ) {
        match self.fetcher.deliver(client, request_id, operation) {
            Err(reason) => self.stats.bump(reason),
            Ok(()) => {
                self.stats.bump("command_accepted");
                self.execute_ready(out);
            }
        }
    }

    /// The operation of `entry`, if it is inline or fetched (borrowed: checking for it clones
    /// nothing).
    fn operation<'a>(&'a self, entry: &'a RequestEntry) -> Option<&'a Bytes> {
        match &entry.body {
            RequestBody::Inline(op) => Some(op),
            RequestBody::Digest(d) => self.fetcher.body(&(entry.client, entry.request_id, *d)),
        }
    }

    /// Whether every request of `batch` that will be executed has its body.
    pub(super) fn bodies_complete(&self, batch: &AgreedBatch) -> bool {
        batch
            .entries
            .iter()
            .all(|e| self.operation(e).is_some() || e.request_id <= self.replies.last_id(e.client))
    }

    /// Executes agreed batches while the next one is complete.
    pub(super) fn execute_ready(&mut self, out: &mut Vec<Action>) {
        let start = self.last_executed;
        if self.state_is_partial() {
            return;
        }
        loop {
            if self.selective_waiting() {
                // At a checkpoint, for certified objects (`selective.rs`).
                break;
            }
            let next = self.last_executed.next();
            let Some(batch) = self.batches.ready(next) else { break };
            if self.tentative_at(next) {
                // The batch executed tentatively at this sequence number has committed, or
                // another one has (a view change replaced it): confirm, or roll back and go on
                // from the restored state with the batches held.
                if self.tentative_matches(batch.history) {
                    let batch = self.batches.take(next).expect("checked above");
                    self.confirm_tentative(batch, out);
                } else {
                    self.roll_back(out);
                }
                continue;
            }
            if !self.bodies_complete(batch) {
                break;
            }
            let batch = self.batches.take(next).expect("checked above");
            if history_digest(&self.history, &batch.batch_digest) != batch.history {
                // A correct order member vouched for it, so our own history is off: refetch.
                self.stats.bump("batch_history_mismatch");
                break;
            }
            self.execute_batch(batch, None, out);
        }
        if self.last_executed > start {
            self.batches.prune_through(self.last_executed);
            self.fetcher.prune_through(self.last_executed);
            if self.transfer.as_ref().is_some_and(|t| t.seqno() <= self.last_executed) {
                self.stats.bump("state_transfer_overtaken");
                self.transfer = None;
            }
            self.request_bodies(out);
        }
    }

    /// The requests of `batch` to execute: configured clients, not yet executed (a duplicate
    /// gets its cached reply again), at most once per batch.
    fn requests_to_execute(&mut self, batch: &AgreedBatch, out: &mut Vec<Action>) -> Vec<ServiceRequest> {
        let mut requests = Vec::new();
        let mut in_batch: BTreeMap<ClientId, RequestId> = BTreeMap::new();
        for entry in &batch.entries {
            if !self.clients.contains(&entry.client) {
                self.stats.bump("entry_unknown_client");
                continue;
            }
            let cached = self.replies.last_id(entry.client);
            let last = in_batch.get(&entry.client).copied().unwrap_or(cached);
            if entry.request_id <= last {
                self.stats.bump("request_duplicate");
                if entry.request_id == cached && !in_batch.contains_key(&entry.client) {
                    self.send_cached_reply(entry.client, false, out);
                }
                continue;
            }
            let operation = self.operation(entry).expect("bodies_complete checked").clone();
            in_batch.insert(entry.client, entry.request_id);
            requests.push(ServiceRequest {
                client: entry.client,
                request_id: entry.request_id,
                operation,
            });
        }
        requests
    }

    /// Executes one batch (the next in sequence, bodies present, history checked). A batch with
    /// an agreed time (every batch but a view change's null batch, whose time is 0; a heartbeat
    /// is an empty batch with a time) first wakes the service if its time reached the service's
    /// `wake_at`; then the requests run; their pushes are numbered and sent before the replies,
    /// which say how many pushes each client has been sent.
    ///
    /// With `tentative` (the view in which the co-located order member prepared it) the batch runs
    /// ahead of its commit (`tentative.rs`): replies are TENTATIVE-REPLYs, pushes are held, and
    /// nothing that reports the batch executed happens until it commits.
    pub(super) fn execute_batch(&mut self, batch: AgreedBatch, tentative: Option<View>, out: &mut Vec<Action>) {
        let requests = self.requests_to_execute(&batch, out);
        let mut held = Vec::new();
        let mut tentative_results = Vec::new();
        // The administrator's requests are reconfigurations for the order stage, not operations
        // of the service: they are answered with what the order stage makes of them.
        let admin = self.config.admin;
        let (admin_requests, requests): (Vec<_>, Vec<_>) = requests.into_iter().partition(|r| Some(r.client) == admin);
        assert!(
            tentative.is_none() || admin_requests.is_empty(),
            "the order stage hands no reconfiguration over tentatively"
        );
        let mut effects = Effects::default();
        if batch.time_us > 0 {
            let context = BatchContext {
                index: 0,
                seqno: batch.seqno,
                time_us: batch.time_us,
                seed: batch_seed(&batch.history),
            };
            if self.service.wake_at().is_some_and(|at| batch.time_us >= at) {
                self.selective_before_wake(batch.seqno, &mut effects, out);
                self.service.wake(&context, &mut effects);
                if self.selective.is_some() {
                    self.wake_pushes(&mut effects, out);
                }
                self.stats.bump("service_woken");
            }
            if self.selective.is_some() {
                if !requests.is_empty() {
                    self.execute_selectively(batch.seqno, &context, requests, &mut effects, out);
                }
            } else if !requests.is_empty() {
                let results = self.service.execute(&context, &requests, &mut effects);
                assert_eq!(
                    results.len(),
                    requests.len(),
                    "the service must return one reply per request"
                );
                let pushes_out = if tentative.is_some() { &mut held } else { &mut *out };
                self.send_pushes(effects.take_pushes(), pushes_out);
                for (request, result) in requests.iter().zip(results) {
                    let tag = tentative.map(|view| (view, batch.history));
                    self.send_ordered_reply(request.client, request.request_id, &result, false, tag, out);
                    if tentative.is_some() {
                        tentative_results.push((request.client, request.request_id, result.clone()));
                    }
                    self.replies.record(request.client, request.request_id, result);
                }
                self.stats.bump("requests_executed");
            }
            for request in admin_requests {
                let text = crate::reconfig::reply_text(&self.config, batch.seqno, &request.operation);
                let mut result = Bytes::from(text.into_bytes());
                if self.selective.is_some() {
                    // Every ordered reply is wrapped under selective execution.
                    result = crate::message::wrap_announced(&result, &[]);
                }
                self.send_reply(request.client, request.request_id, &result, false, out);
                self.replies.record(request.client, request.request_id, result);
                self.stats.bump("reconfigurations_answered");
            }
            self.last_time_us = batch.time_us;
        } else {
            assert!(requests.is_empty(), "a batch without a time is a null batch");
        }
        if tentative.is_some() {
            self.send_pushes(effects.take_pushes(), &mut held);
            self.hold_tentative(&batch, tentative_results, held);
            return;
        }
        self.send_pushes(effects.take_pushes(), out);
        self.finish_batch(&batch, out);
    }

    /// Reports batch `batch` executed (at once, or when a tentatively executed one commits):
    /// BATCH-COMPLETE to the co-located authentication member, the Executed note, the
    /// checkpoint, WAKE-AT.
    pub(super) fn finish_batch(&mut self, batch: &AgreedBatch, out: &mut Vec<Action>) {
        self.last_executed = batch.seqno;
        self.history = batch.history;
        let completed = batch.entries.iter().map(|e| (e.client, e.request_id)).collect();
        let message = Message::BatchComplete {
            seqno: batch.seqno,
            requests: completed,
        };
        // Only the co-located authentication member (one process with us) listens to us; the
        // others learn it from their own order and execution members (PROTOCOL.md step 7).
        // With separate stages none shares our process: each learns it from its order member.
        if !self.q.separate_stages {
            let auth = Principal::Auth(self.id);
            self.send(vec![auth], message, SealFor::One(auth), out);
        }
        self.stats.bump("batches_executed");
        self.answer_wanted(out);
        out.push(Action::Note(Event::Executed {
            seqno: batch.seqno,
            history: batch.history,
        }));
        if batch.seqno.0.is_multiple_of(self.config.knobs.checkpoint_interval) {
            if self.selective.is_some() {
                self.checkpoint_selectively(out);
            } else {
                self.take_checkpoint(out);
            }
        }
        self.report_wake(false, out);
    }

    /// Sends the client's cached reply (full if `retransmit`, else by the full/digest rule).
    fn send_cached_reply(&self, client: ClientId, retransmit: bool, out: &mut Vec<Action>) {
        let Some(cached) = self.replies.get(client) else { return };
        match &cached.result {
            CachedResult::Full(result) => self.send_reply(client, cached.request_id, result, retransmit, out),
            CachedResult::Skipped => {}
        }
    }

    /// Sends the reply `result` to `request_id` of `client` (full if `retransmit`, else by the
    /// full/digest rule).
    pub(super) fn send_reply(
        &self,
        client: ClientId,
        request_id: RequestId,
        result: &Bytes,
        retransmit: bool,
        out: &mut Vec<Action>,
    ) {
        self.send_ordered_reply(client, request_id, result, retransmit, None, out);
    }

    /// Sends REPLY, or with `tentative` (view and history of the tentatively executed batch)
    /// TENTATIVE-REPLY, to `request_id` of `client`, by the full/digest rule (full if
    /// `retransmit`).
    pub(super) fn send_ordered_reply(
        &self,
        client: ClientId,
        request_id: RequestId,
        result: &Bytes,
        retransmit: bool,
        tentative: Option<(View, Digest)>,
        out: &mut Vec<Action>,
    ) {
        let result = reply_body(&self.q, self.id, client, request_id, result, retransmit);
        let pushes_sent = self.pushes.sent(client);
        let message = match tentative {
            None => Message::Reply {
                request_id,
                result,
                read_only: false,
                pushes_sent,
            },
            Some((view, history)) => Message::TentativeReply {
                request_id,
                result,
                view,
                history,
                pushes_sent,
            },
        };
        let to = Principal::Client(client);
        self.send(vec![to], message, SealFor::One(to), out);
    }

    /// RETRANSMIT from an order member: resend the cached reply in full (once per client per
    /// `exec_retry_us`, as every order member forwards the same retransmission).
    pub(super) fn on_retransmit(&mut self, now: Time, client: ClientId, request_id: RequestId, out: &mut Vec<Action>) {
        if self.distrusted {
            // The cached replies are the distrusted state's.
            self.stats.bump("retransmit_state_distrusted");
            return;
        }
        if self.tentative_client(client) {
            // Its cached reply is tentative: the committed one goes out when the batch commits.
            self.stats.bump("retransmit_tentative");
            return;
        }
        let cached = self.replies.get(client).map(|c| c.request_id);
        if cached != Some(request_id) {
            self.stats.bump("retransmit_not_cached");
            // Under selective execution: not agreed here yet. Run it when it comes instead of
            // storing it, so the client's vote completes without another RETRANSMIT.
            if cached.is_none_or(|c| c < request_id) && self.clients.contains(&client) {
                if let Some(sel) = self.selective.as_mut() {
                    sel.want(client, request_id);
                }
            }
            return;
        }
        if !self
            .replies
            .may_resend(client, request_id, now, self.config.knobs.exec_retry_us)
        {
            self.stats.bump("retransmit_rate_limited");
            return;
        }
        if !self.resend_cached_reply(client, request_id, out) {
            self.stats.bump("retransmit_skipped_not_stored");
            return;
        }
        self.stats.bump("retransmit_answered");
    }

    /// Sends `client`'s cached reply (to `request_id`) in full, after running the request if this
    /// member skipped it (selective execution). False, sending nothing, if it was skipped and is
    /// not stored here.
    pub(super) fn resend_cached_reply(
        &mut self,
        client: ClientId,
        request_id: RequestId,
        out: &mut Vec<Action>,
    ) -> bool {
        let skipped = self
            .replies
            .get(client)
            .is_some_and(|c| c.result == CachedResult::Skipped);
        if skipped && !self.force_skipped(client, request_id, out) {
            return false;
        }
        self.send_cached_reply(client, true, out);
        true
    }
}
