//! The authentication stage (UpRight thesis 5.2; the papers' "filter" / "RQ").
//!
//! Each member checks a client's MAC authenticator, persists the request body if it travels by
//! digest (an inline body rides in the AUTH-REQ and is logged by the order stage), and forwards it to the
//! order stage: the entry (body inline if small, else its digest) and this member's row of the
//! matrix signature; to the primary (as the co-located order member reports it) at once, to the
//! other order members only if it is still pending the backup delay later (PROTOCOL.md step 2, [`BACKUP_DELAY_FRACTION`]). Forwarding is batched per host round: accepted requests are buffered and
//! [`Stage::flush`] sends one AUTH-REQ carrying all of them to each order member (a buffer that
//! reaches [`AUTH_ITEMS_MAX`] is sent at once). It keeps request bodies to answer the execution
//! stage's FETCH. Members never talk to each other; their states may differ.
//!
//! With `knobs.client_signatures`, the signatures of a round's new requests are checked together
//! at the flush (`KeyRing::verify_signatures`), after every cheaper check; the requests are then
//! handled again in arrival order (PROTOCOL.md step 1).
//!
//! Rate limit (AS3/AS4): a client has at most one forwarded-but-not-known-ordered request here.
//! A newer request is accepted once the co-located order member (which committed it) or the
//! co-located execution member (which executed it) reported the pending one ordered with
//! BATCH-COMPLETE, or after `knobs.auth_retransmit_interval_us` (a member that falls behind must not
//! block a correct client forever; the order stage still orders a client's requests strictly in
//! sequence, so this cannot let a client get ahead); after only the backup delay while the
//! co-located order member is out of a view (it reports no commits then). A deferred request is
//! handled again on the member's own timer when that wait ends. Both reporters share this member's process,
//! so they are correct exactly when it is: one report is enough, and no BATCH-COMPLETE crosses
//! the network (PROTOCOL.md step 7).

mod clients;
mod keys;

use std::sync::Arc;

use bytes::Bytes;

use crate::config::{ClusterConfig, ConfigError};
use crate::crypto::{Digest, KeyRing, MatrixRow};
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, StageKind};
use crate::limits::{AUTH_ITEMS_MAX, SIGNATURE_BATCH_MAX};
use crate::message::{AuthItem, Envelope, Message, RequestBody, RequestEntry, SealFor};
use crate::quorum::Quorums;
use crate::stage::{Action, Input, Stage, Stats, Storage, Time, Timer};

use clients::{ClientTable, Forwarded};

/// Request bodies kept per client to answer FETCH: the newest `3 * checkpoint_interval + 1`.
///
/// The order stage puts at most one request of a client in a batch, so these cover at least the
/// client's requests in the last three checkpoint intervals (thesis 5.2 keeps three intervals of
/// bodies). An execution member that needs an older body is behind the order stage's stable
/// checkpoint (at most `2 * checkpoint_interval` behind its last ordered batch) and catches up by
/// state transfer instead of replay.
pub fn bodies_per_client(knobs: &crate::config::Knobs) -> usize {
    3 * knobs.checkpoint_interval as usize + 1
}

/// The authentication stage member.
pub struct AuthStage {
    config: Arc<ClusterConfig>,
    quorums: Quorums,
    id: ReplicaId,
    keys: Arc<KeyRing>,
    clients: ClientTable,
    /// Per client, the newest request that arrived while an older one was pending (at most one
    /// per configured client): handled again once the pending one is reported ordered, so a
    /// closed-loop client that outruns the BATCH-COMPLETE messages is not stalled until it retransmits.
    deferred: std::collections::BTreeMap<ClientId, Envelope>,
    /// AUTH-REQ items not yet sent (at most [`AUTH_ITEMS_MAX`]): sent by [`Stage::flush`].
    outgoing: Vec<AuthItem>,
    /// Whether the next flush goes to every order member at once (a retransmission is in it).
    outgoing_to_all: bool,
    /// The current primary, as the co-located order member last reported it (`None`: unknown or a
    /// view change is running; AUTH-REQs then go to every order member at once).
    primary: Option<ReplicaId>,
    /// Items sent to the primary only, with when: sent to the other order members once
    /// the backup delay old if still not known ordered (at most [`LATER_MAX`]).
    later: std::collections::VecDeque<(Time, AuthItem)>,
    /// New signed requests that passed every cheaper check, with their request digests, waiting
    /// for their signatures to be checked together at the flush (at most
    /// [`SIGNATURE_BATCH_MAX`]; a full batch is checked at once): then handled again, in arrival
    /// order.
    unverified: Vec<(Envelope, Digest)>,
    /// While one of them is handled again: its request digest (its seal was checked on arrival,
    /// its signature is checked here, not deferred).
    verifying: Option<Digest>,
    /// When the AuthTick timer is armed for (the earliest of the backup delay of `later`'s
    /// oldest item and the end of a deferred request's wait), if it is.
    tick_at: Option<Time>,
    /// Key refresh (`keys.rs`).
    key_schedule: crate::session::ReplicaKeys,
    key_repair: crate::session::KeyRepair,
    /// When each client behind our configuration was last sent CONFIGURATION (at most one per
    /// configured client).
    told_configuration: std::collections::BTreeMap<ClientId, Time>,
    stats: Stats,
}

/// How long an AUTH-REQ item sent to the primary waits before it goes to the other order members
/// too (only if it is not known ordered by then), as a fraction of the view-change timeout
/// (`view_change_timeout_us / BACKUP_DELAY_FRACTION`: 50 ms by default). The backups need the rows
/// only to watch the primary (view-change timers) and for a new primary; they accept a
/// PRE-PREPARE on the matrix it carries. Well below the view-change timeout, and above an ordered
/// request's latency even under load (~11 ms at 256 clients on 2 cores), so that under load items
/// are not sent twice.
pub const BACKUP_DELAY_FRACTION: u64 = 20;
pub use crate::limits::LATER_MAX;

/// Storage key of a request body; zero-padded so keys sort by request id.
fn storage_key(client: ClientId, request_id: RequestId) -> String {
    format!("auth/body/{:010}/{:020}", client.0, request_id.0)
}

impl AuthStage {
    /// Member `id`, restored from `storage` (empty on first start).
    pub fn new(
        config: Arc<ClusterConfig>,
        id: ReplicaId,
        keys: Arc<KeyRing>,
        storage: &Storage,
    ) -> Result<AuthStage, ConfigError> {
        let quorums = config.validate()?;
        let mut stage = AuthStage {
            clients: ClientTable::new(&config, bodies_per_client(&config.knobs)),
            config,
            quorums,
            id,
            keys,
            deferred: std::collections::BTreeMap::new(),
            outgoing: Vec::new(),
            outgoing_to_all: false,
            primary: None,
            later: std::collections::VecDeque::new(),
            unverified: Vec::new(),
            verifying: None,
            tick_at: None,
            key_schedule: keys::restore(storage),
            key_repair: Default::default(),
            told_configuration: Default::default(),
            stats: Stats::default(),
        };
        // Keys sort by (client, request id), so each client's bodies come oldest first. Only the
        // newest becomes `last_sent` again (pending: we cannot know whether it was ordered) and
        // needs its AUTH-REQ rebuilt; older ones only go back into the body cache for FETCH.
        let mut records = Vec::new();
        for value in storage
            .range("auth/body/".to_string().."auth/body0".to_string())
            .map(|(_, v)| v)
        {
            match crate::codec::from_bytes::<(ClientId, RequestId, Bytes)>(value) {
                Ok(record) if stage.clients.contains(record.0) => records.push(record),
                _ => {
                    // Our own storage is corrupt: skip the record; the client retransmits.
                    stage.stats.bump("recovery_bad_record");
                }
            }
        }
        for (i, (client, request_id, operation)) in records.iter().enumerate() {
            let newest = records.get(i + 1).is_none_or(|next| next.0 != *client);
            if newest {
                let forwarded = stage.build(*client, *request_id, operation.clone(), 0);
                stage.clients.restore(forwarded);
            } else {
                stage
                    .clients
                    .get_mut(*client)
                    .cache_body(*request_id, operation.clone());
            }
        }
        Ok(stage)
    }

    /// Builds the AUTH-REQ item for a request: entry and matrix row.
    fn build(&self, client: ClientId, request_id: RequestId, operation: Bytes, now: Time) -> Forwarded {
        let operation_digest = Digest::of(&operation);
        let body = if !self.stores_body(client, &operation) {
            RequestBody::Inline(operation.clone())
        } else {
            RequestBody::Digest(operation_digest)
        };
        let entry = RequestEntry {
            client,
            request_id,
            body,
        };
        let row = MatrixRow {
            signer: self.id,
            authenticator: self
                .keys
                .authenticator(ClusterConfig::order_members(&self.quorums), &entry.digest()),
        };
        Forwarded {
            request_id,
            operation,
            operation_digest,
            item: AuthItem { entry, row },
            forwarded_at: now,
            forwards: 1,
        }
    }

    /// Buffers an item for the next flush (`to_all`: a retransmission, which goes to every order
    /// member at once); a full buffer is sent at once (its persists are earlier in `out`, so the
    /// host still makes them durable first).
    fn queue_for_order(&mut self, now: Time, item: AuthItem, to_all: bool, out: &mut Vec<Action>) {
        self.outgoing.push(item);
        self.outgoing_to_all |= to_all;
        if self.outgoing.len() >= AUTH_ITEMS_MAX {
            self.stats.bump("auth_request_flushed_full");
            self.send_outgoing(now, out);
        }
    }

    /// Sends the buffered items as one AUTH-REQ: to the primary (and the co-located order member)
    /// at once, to the others later if still pending ([`BACKUP_DELAY_FRACTION`]); to every order member
    /// at once when the primary is not known or a retransmission is among them.
    fn send_outgoing(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.outgoing.is_empty() {
            return;
        }
        let items = std::mem::take(&mut self.outgoing);
        assert!(items.len() <= AUTH_ITEMS_MAX, "the buffer is flushed when full");
        let to_all = std::mem::take(&mut self.outgoing_to_all);
        let first = match self.primary {
            Some(primary) if !to_all => {
                // Only a co-located order member sends hints, so `Order(self.id)` exists here.
                let mut to = vec![Principal::Order(primary)];
                if primary != self.id {
                    to.push(Principal::Order(self.id));
                }
                self.later.extend(items.iter().map(|item| (now, item.clone())));
                self.arm_at(now.saturating_add(self.backup_delay_us()), out);
                to
            }
            _ => ClusterConfig::order_members(&self.quorums).collect(),
        };
        self.send_items(items, first, out);
        while self.later.len() > LATER_MAX {
            self.stats.bump("auth_later_overflow");
            self.send_later(Time::MAX, out);
        }
    }

    /// Sends the items waiting since at most `until` - the backup delay (up to
    /// [`AUTH_ITEMS_MAX`]) that are still not known ordered to the order members that did not get
    /// them at once.
    fn send_later(&mut self, until: Time, out: &mut Vec<Action>) {
        let mut items = Vec::new();
        while let Some((at, _)) = self.later.front() {
            if at.saturating_add(self.backup_delay_us()) > until || items.len() == AUTH_ITEMS_MAX {
                break;
            }
            let (_, item) = self.later.pop_front().expect("front exists");
            // Items are built only for configured clients.
            if self.clients.get(item.entry.client).ordered() >= item.entry.request_id {
                self.stats.bump("auth_later_known_ordered");
            } else {
                items.push(item);
            }
        }
        if items.is_empty() {
            return;
        }
        let skip = [self.primary, Some(self.id)];
        let to: Vec<Principal> = ClusterConfig::order_members(&self.quorums)
            .filter(|p| !skip.contains(&p.replica()))
            .collect();
        self.stats.bump("auth_later_sent");
        self.send_items(items, to, out);
    }

    /// See [`BACKUP_DELAY_FRACTION`].
    fn backup_delay_us(&self) -> u64 {
        (self.config.knobs.view_change_timeout_us / BACKUP_DELAY_FRACTION).max(1)
    }

    fn on_tick(&mut self, now: Time, out: &mut Vec<Action>) {
        self.tick_at = None;
        self.key_tick(now, out);
        while self
            .later
            .front()
            .is_some_and(|(at, _)| at.saturating_add(self.backup_delay_us()) <= now)
        {
            self.send_later(now, out);
        }
        self.resume_deferred(now, out);
        self.arm_tick(out);
    }

    /// How long a client's forwarded request must be pending here before a newer one is accepted
    /// without a report that it was ordered: `knobs.auth_retransmit_interval_us` while the
    /// co-located order member is in an installed view (it reports every commit); the backup delay
    /// while it is not (PrimaryHint): a member changing view learns no commits, and one whose view
    /// change the others did not join (a faulty replica can draw it into one) stays out until they
    /// change view too. Holding every client's next request for the long interval then cost each
    /// request that needed this member's row the whole interval (docs/PROTOCOL.md step 2).
    fn new_request_pace(&self) -> u64 {
        if self.primary.is_some() {
            self.config.knobs.auth_retransmit_interval_us
        } else {
            self.backup_delay_us()
        }
    }

    /// When the earliest deferred request may be accepted (its client's pending request has been
    /// pending for [`AuthStage::new_request_pace`]).
    fn deferred_due(&self) -> Option<Time> {
        let pace = self.new_request_pace();
        self.deferred
            .keys()
            .filter_map(|client| {
                self.clients
                    .get(*client)
                    .last_sent()
                    .map(|l| l.forwarded_at.saturating_add(pace))
            })
            .min()
    }

    /// Handles again the deferred requests whose clients may send a new one now (without waiting
    /// for the client's retransmission).
    fn resume_deferred(&mut self, now: Time, out: &mut Vec<Action>) {
        let pace = self.new_request_pace();
        let due: Vec<ClientId> = self
            .deferred
            .keys()
            .filter(|c| self.clients.get(**c).may_accept_new(now, pace))
            .copied()
            .collect();
        for client in due {
            if let Some(deferred) = self.deferred.remove(&client) {
                self.stats.bump("deferred_request_resumed_paced");
                self.on_client_request(now, &deferred, out);
            }
        }
    }

    /// Arms AuthTick for the earliest thing due: the oldest `later` item's backup delay or a
    /// deferred request's wait (all of them: after a tick, and when the wait changes).
    fn arm_tick(&mut self, out: &mut Vec<Action>) {
        let later = self
            .later
            .front()
            .map(|(at, _)| at.saturating_add(self.backup_delay_us()));
        let keys = self.key_schedule.due();
        if let Some(due) = later.into_iter().chain(self.deferred_due()).chain(keys).min() {
            self.arm_at(due, out);
        }
    }

    /// Arms AuthTick for `due` unless it is armed for then or earlier (the tick re-arms for
    /// whatever is left): called as each item waits for the backups and each request is
    /// deferred, so no host round looks through every deferred request.
    fn arm_at(&mut self, due: Time, out: &mut Vec<Action>) {
        if self.tick_at.is_some_and(|at| at <= due) {
            return;
        }
        self.tick_at = Some(due);
        out.push(Action::SetTimer {
            timer: Timer::AuthTick,
            at: due,
        });
    }

    /// One AUTH-REQ carrying `items` to `to`.
    fn send_items(&mut self, mut items: Vec<AuthItem>, to: Vec<Principal>, out: &mut Vec<Action>) {
        self.stats.bump("auth_request_messages");
        let refreshed = self.config.knobs.key_refresh_us > 0
            || ClusterConfig::order_members(&self.quorums).any(|p| self.keys.peer_epoch(self.keys.process_of(p)) > 0);
        if refreshed {
            // An item built before an order member's last NEW-KEY reached us (a retransmission,
            // an item sent to the backups later) carries MACs it may have retired by now (it
            // refreshes its keys, or recovered proactively): sealed afresh under the keys of
            // now (the order members keep a signer's latest row).
            let members = ClusterConfig::order_members(&self.quorums);
            let fresh = self
                .keys
                .authenticator_many(members, items.iter().map(|i| i.entry.digest()));
            for (item, authenticator) in items.iter_mut().zip(fresh) {
                item.row.authenticator = authenticator;
            }
        }
        if items.len() > 1 {
            self.stats.bump("auth_request_messages_multi");
        }
        let envelope = Envelope::seal(
            &self.keys,
            &self.quorums,
            Principal::Auth(self.id),
            Message::AuthRequest { items },
            SealFor::Nothing,
        );
        out.push(Action::Send {
            to,
            envelope: Arc::new(envelope),
        });
    }

    fn on_primary_hint(&mut self, envelope: &Envelope, out: &mut Vec<Action>) {
        let Message::PrimaryHint { view, installed } = envelope.message else {
            unreachable!("dispatched on message kind");
        };
        // Only the co-located order member is believed.
        if !self.own_process_sent(envelope, &[Principal::Order(self.id)], out) {
            return;
        }
        let was_installed = self.primary.is_some();
        self.primary = installed.then(|| self.quorums.primary(view));
        if self.primary.is_some() != was_installed {
            // The deferred requests' wait changed (AuthStage::new_request_pace).
            self.arm_tick(out);
        }
    }

    fn on_client_request(&mut self, now: Time, envelope: &Envelope, out: &mut Vec<Action>) {
        let Message::ClientRequest {
            client,
            request_id,
            operation,
            signature,
            config_epoch,
            ..
        } = &envelope.message
        else {
            unreachable!("dispatched on message kind");
        };
        // Set when a request whose signature was deferred is handled again (`verify_signatures`).
        let rechecked = self.verifying.take();
        // Cheapest checks first (Aardvark): who, the blacklist, the size; then the MAC; then,
        // for a new request only, the signature.
        if envelope.from != Principal::Client(*client) || !self.clients.contains(*client) {
            self.stats.bump("dropped_unknown_client");
            return;
        }
        if self.clients.get(*client).blacklisted(now) {
            self.stats.bump("dropped_blacklisted");
            return;
        }
        if operation.len() > self.config.knobs.request_bytes_max || request_id.0 == 0 {
            self.stats.bump("dropped_bad_request");
            return;
        }
        // Before the MAC: a client of an earlier configuration sealed for the members it knows,
        // and a member a shrink renumbered cannot check that MAC (it was for another id), while
        // the client needs its copy of the change. CONFIGURATION is what every member of this
        // configuration may tell anyone; it goes to the named client only, at most once per
        // period.
        if *config_epoch < self.config.epoch() {
            self.tell_configuration(now, *client, out);
        }
        if rechecked.is_none() && !self.seal_ok(envelope, out) {
            return;
        }
        let interval = self.config.knobs.auth_retransmit_interval_us;
        let pace = self.new_request_pace();
        let state = self.clients.get(*client);
        if let Some(last) = state.last_sent() {
            if *request_id <= last.request_id {
                if *request_id == last.request_id && Digest::of(operation) != last.operation_digest {
                    // Two operations under one request id: a faulty client (with signatures,
                    // only one of them can be signed: the other was dropped before it got here).
                    self.stats.bump("dropped_conflicting_request");
                    if self.config.knobs.client_signatures {
                        self.blacklist(now, *client);
                    }
                    return;
                }
                // Retransmission: resend our AUTH-REQ (the first one at once, then at most once
                // per interval), so the order stage learns it again or asks for a reply resend.
                let unsent = self.outgoing.iter().any(|i| i.entry.client == *client);
                if unsent {
                    // Still in the buffer: the next flush sends it anyway.
                    self.stats.bump("dropped_retransmission_unsent");
                } else if let Some(item) = self.clients.get_mut(*client).retransmission_due(now, interval) {
                    self.stats.bump("forwarded_retransmission");
                    self.queue_for_order(now, item, true, out);
                } else {
                    self.stats.bump("dropped_retransmission_paced");
                }
                return;
            }
            if !state.may_accept_new(now, pace) {
                self.stats.bump("deferred_pending_request");
                let newer = self.deferred.get(client).is_none_or(|d| match &d.message {
                    Message::ClientRequest { request_id: old, .. } => old <= request_id,
                    _ => true,
                });
                let due = last.forwarded_at.saturating_add(pace);
                if newer {
                    self.deferred.insert(*client, envelope.clone());
                }
                self.arm_at(due, out);
                return;
            }
        }
        if self.config.knobs.client_signatures {
            let digest =
                rechecked.unwrap_or_else(|| crate::message::client_request_digest(*client, *request_id, operation));
            if rechecked.is_none() && signature.is_some() {
                // Checked with the others of this round at the flush (Aardvark: batch
                // verification where it pays), then handled again from the top.
                self.stats.bump("signature_deferred");
                self.unverified.push((envelope.clone(), digest));
                if self.unverified.len() >= SIGNATURE_BATCH_MAX {
                    self.verify_signatures(now, out);
                }
                return;
            }
            let good = signature
                .as_ref()
                .is_some_and(|s| self.keys.verify_signature(envelope.from, &digest, s).is_ok());
            self.stats.bump("signature_checked");
            if !good {
                // A good MAC with a bad signature: the client itself is faulty.
                self.stats.bump("dropped_bad_signature");
                self.blacklist(now, *client);
                return;
            }
        }
        let forwarded = self.build(*client, *request_id, operation.clone(), now);
        if self.stores_body(*client, operation) {
            let record = crate::codec::to_bytes(&(*client, *request_id, operation));
            out.push(Action::Persist {
                key: storage_key(*client, *request_id),
                value: Some(Bytes::from(record)),
            });
        }
        let item = forwarded.item.clone();
        if let Some((evicted, body)) = self.clients.get_mut(*client).accept(forwarded) {
            if self.stores_body(*client, &body) {
                out.push(Action::Persist {
                    key: storage_key(*client, evicted),
                    value: None,
                });
            }
        }
        self.stats.bump("forwarded");
        self.queue_for_order(now, item, false, out);
    }

    /// Checks the deferred signatures together and handles their requests again (each one's
    /// signature is then remembered as verified, or, if the batch failed, checked alone).
    fn verify_signatures(&mut self, now: Time, out: &mut Vec<Action>) {
        let pending = std::mem::take(&mut self.unverified);
        if pending.len() > 1 {
            let items: Vec<_> = pending
                .iter()
                .filter_map(|(envelope, digest)| match &envelope.message {
                    Message::ClientRequest {
                        signature: Some(signature),
                        ..
                    } => Some((envelope.from, *digest, *signature)),
                    _ => None,
                })
                .collect();
            if self.keys.verify_signatures(&items) {
                self.stats.add("signature_batch_verified", items.len() as u64);
            } else {
                self.stats.bump("signature_batch_failed");
            }
        }
        for (envelope, digest) in &pending {
            self.verifying = Some(*digest);
            self.on_client_request(now, envelope, out);
        }
    }

    /// Ignores `client` for a growing period (counted).
    fn blacklist(&mut self, now: Time, client: ClientId) {
        self.stats.bump("client_blacklisted");
        self.deferred.remove(&client);
        self.clients.get_mut(client).blacklist(now);
    }

    /// Whether a request body must be made durable here before its AUTH-REQ goes out: only bodies
    /// that travel by digest. An inline body rides in the AUTH-REQ itself and the order stage logs
    /// it with the batch; if this member forgets it in a crash, nothing depends on it (the client,
    /// unanswered, retransmits), so it costs no write on the critical path.
    /// The administrator's reconfigurations always travel inline (the order stage reads them).
    fn stores_body(&self, client: ClientId, operation: &[u8]) -> bool {
        operation.len() > self.config.knobs.inline_request_bytes_max && Some(client) != self.config.admin
    }

    /// CONFIGURATION to a client that named an earlier configuration epoch (at most once per
    /// half initial retransmission timeout: it needs `r + 1` copies, from different members).
    fn tell_configuration(&mut self, now: Time, client: ClientId, out: &mut Vec<Action>) {
        let Some(change) = crate::reconfig::origin(&self.config) else {
            return;
        };
        let period = self.config.knobs.client_retransmit_initial_us / 2;
        if self
            .told_configuration
            .get(&client)
            .is_some_and(|at| now < at.saturating_add(period))
        {
            return;
        }
        self.told_configuration.insert(client, now);
        self.stats.bump("configuration_told");
        let to = Principal::Client(client);
        let envelope = Envelope::seal_static(
            &self.keys,
            Principal::Auth(self.id),
            Message::Configuration {
                change: Box::new(change),
            },
            to,
        );
        out.push(Action::Send {
            to: vec![to],
            envelope: Arc::new(envelope),
        });
    }

    /// Checks the seal as received by this member; a bad one is counted.
    fn seal_ok(&mut self, envelope: &Envelope, out: &mut Vec<Action>) -> bool {
        let ok = envelope
            .open(&self.keys, Principal::Auth(self.id), self.config.knobs.sabotage)
            .is_ok();
        if !ok {
            self.stats.reject("dropped_bad_seal");
            let me = Principal::Auth(self.id);
            self.key_repair
                .after_bad_seal(&self.keys, &self.quorums, me, envelope, out);
        }
        ok
    }

    /// Whether `envelope` comes from one of `members` (stages of this member's own process, which
    /// are correct exactly when it is) with a good seal; a wrong sender or bad seal is counted.
    fn own_process_sent(&mut self, envelope: &Envelope, members: &[Principal], out: &mut Vec<Action>) -> bool {
        if !members.contains(&envelope.from) {
            self.stats.bump("dropped_wrong_sender");
            return false;
        }
        self.seal_ok(envelope, out)
    }

    fn exec_sender(&self, envelope: &Envelope) -> Option<ReplicaId> {
        match envelope.from {
            Principal::Exec(r) if (r.0 as usize) < self.quorums.n_exec => Some(r),
            _ => None,
        }
    }

    /// BATCH-COMPLETE from the co-located order or execution member: these requests are ordered.
    fn on_batch_complete(&mut self, now: Time, envelope: &Envelope, out: &mut Vec<Action>) {
        let Message::BatchComplete { requests, .. } = &envelope.message else {
            unreachable!("dispatched on message kind");
        };
        // Only this process's own members are believed (and needed: see the module doc).
        let me = Principal::Auth(self.id);
        let own: Vec<Principal> = [Principal::Order(self.id), Principal::Exec(self.id)]
            .into_iter()
            .filter(|p| self.quorums.co_located(*p, me))
            .collect();
        if !self.own_process_sent(envelope, &own, out) {
            return;
        }
        let pace = self.new_request_pace();
        for (client, request_id) in requests {
            let Some(state) = self.clients.find_mut(*client) else {
                continue;
            };
            state.mark_ordered(*request_id);
            if state.may_accept_new(now, pace) {
                if let Some(deferred) = self.deferred.remove(client) {
                    self.stats.bump("deferred_request_resumed");
                    self.on_client_request(now, &deferred, out);
                }
            }
        }
    }

    fn on_fetch(&mut self, envelope: &Envelope, out: &mut Vec<Action>) {
        let Message::Fetch {
            client,
            request_id,
            operation_digest,
        } = &envelope.message
        else {
            unreachable!("dispatched on message kind");
        };
        if self.exec_sender(envelope).is_none() {
            self.stats.bump("dropped_wrong_sender");
            return;
        }
        if !self.seal_ok(envelope, out) {
            return;
        }
        if !self.clients.contains(*client) {
            self.stats.bump("dropped_unknown_client");
            return;
        }
        let Some(operation) = self.clients.get(*client).body(*request_id, operation_digest) else {
            self.stats.bump("fetch_miss");
            return;
        };
        let reply = Message::Command {
            client: *client,
            request_id: *request_id,
            operation,
        };
        let sealed = Envelope::seal(
            &self.keys,
            &self.quorums,
            Principal::Auth(self.id),
            reply,
            SealFor::One(envelope.from),
        );
        self.stats.bump("fetch_served");
        out.push(Action::Send {
            to: vec![envelope.from],
            envelope: Arc::new(sealed),
        });
    }
}

impl Stage for AuthStage {
    fn principal(&self) -> Principal {
        Principal::Auth(self.id)
    }

    fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>) {
        let envelope = match input {
            Input::Message(envelope) => envelope,
            Input::Timer(Timer::AuthTick) => return self.on_tick(now, out),
            Input::Start => return self.start_keys(now, out),
            Input::Recover => {
                self.start_keys(now, out);
                return self.recover_keys(now, out);
            }
            _ => return,
        };
        match &envelope.message {
            Message::ClientRequest { .. } => self.on_client_request(now, &envelope, out),
            Message::BatchComplete { .. } => self.on_batch_complete(now, &envelope, out),
            Message::Fetch { .. } => self.on_fetch(&envelope, out),
            Message::PrimaryHint { .. } => self.on_primary_hint(&envelope, out),
            Message::NewKey { .. } => self.on_new_key(&envelope, out),
            _ => self.stats.bump("dropped_unexpected_message"),
        }
    }

    fn flush(&mut self, now: Time, out: &mut Vec<Action>) {
        self.verify_signatures(now, out);
        self.send_outgoing(now, out);
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }
}

/// The stage this module implements (for hosts that route by stage).
pub const STAGE: StageKind = StageKind::Auth;

#[cfg(test)]
mod tests;
