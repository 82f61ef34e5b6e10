//! Request intake (docs/PROTOCOL.md "Normal case" step 3; UpRight thesis 5.2): AUTH-REQ items from
//! the authentication stage, their matrix-signature rows checked and pooled per entry; a request
//! already ordered gets its reply retransmitted; the entries ready to go into the next batch.

use super::projection::Projection;
use super::request_pool::{Candidate, Inserted};
use super::{OrderStage, BATCH_INLINE_BYTES_MAX};
use crate::config::{ClusterConfig, Sabotage};
use crate::contract;
use crate::crypto::{Digest, MatrixRow};
use crate::ids::{ClientId, Principal, ReplicaId, RequestId};
use crate::message::{AuthItem, RequestEntry, SealFor};
use crate::stage::{Action, Time};

impl OrderStage {
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
        matrix_row_valid(&self.keys, &self.q, self.id, self.sabotage(), digest, row)
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
        let inserted = self.pool.insert(entry, digest, row, last);
        if from == self.id && matches!(inserted, Inserted::New | Inserted::Refreshed | Inserted::Duplicate) {
            self.note_own_request(now, entry.client, entry.request_id);
        }
        match inserted {
            Inserted::New => {
                self.note_arrival(now, entry.client, entry.request_id, out);
                self.stats.bump("request_rows")
            }
            Inserted::Duplicate => self.stats.bump("drop_duplicate_row"),
            Inserted::Refreshed => self.stats.bump("request_row_refreshed"),
            Inserted::TooFarAhead => self.stats.bump("drop_request_too_far_ahead"),
            Inserted::UnknownClient => unreachable!("checked with knows()"),
        }
    }

    /// RETRANSMIT to every execution member, at most once per request per
    /// `auth_retransmit_interval_us`.
    fn retransmit_reply(&mut self, now: Time, client: ClientId, request_id: RequestId, out: &mut Vec<Action>) {
        let interval = self.config.knobs.auth_retransmit_interval_us;
        if !self.retransmitted.due(now, interval, client, request_id) {
            return self.stats.bump("retransmit_suppressed");
        }
        self.stats.bump("retransmit_sent");
        for exec in ClusterConfig::exec_members(&self.q) {
            self.send(
                out,
                vec![exec],
                contract::retransmit(client, request_id),
                SealFor::One(exec),
            );
        }
    }

    /// Requests ready to be ordered after the projection `p`: the next request of each client
    /// with `matrix_collect` rows valid for this member (all of them, as `(client, request)`).
    pub(super) fn all_ready(&self, p: &Projection) -> Vec<(ClientId, RequestId)> {
        self.ready_candidates(p)
            .map(|(client, next, _)| (client, next))
            .collect()
    }

    /// The ready requests after `p`, taking clients in turn from just after the last client of
    /// the previous batch: each client, its next request id and the candidate entry.
    fn ready_candidates<'a, 'p>(
        &'a self,
        p: &'p Projection,
    ) -> impl Iterator<Item = (ClientId, RequestId, &'a Candidate)> + use<'a, 'p> {
        self.pool.clients_after(self.batch_cursor).filter_map(move |client| {
            let next = self.projected_last(p, client).next();
            self.pool
                .ready(client, next, self.q.matrix_collect())
                .map(|entry| (client, next, entry))
        })
    }

    /// Requests ready to be ordered after the projection `p` (see [`OrderStage::all_ready`]),
    /// for a batch: up to `max` of them, one per client, taking clients in turn from just after
    /// the last client of the previous batch: with more ready clients than fit in a batch, none
    /// waits for more than `clients / max` batches (in id order, low ids could starve the
    /// others). After the first, they also stop at [`BATCH_INLINE_BYTES_MAX`] bytes of inline
    /// bodies. The flag says the batch is full (either bound was reached), so it need not wait
    /// to fill. Borrowed from the pool: nothing is cloned until a batch is built from them.
    pub(super) fn ready_entries(&self, p: &Projection, max: usize) -> (Vec<&Candidate>, bool) {
        let mut ready = Vec::with_capacity(max.min(64));
        let mut inline_bytes = 0;
        for (_, _, entry) in self.ready_candidates(p) {
            if ready.len() >= max {
                break;
            }
            inline_bytes += entry.inline_bytes();
            if !ready.is_empty() && inline_bytes > BATCH_INLINE_BYTES_MAX {
                return (ready, true);
            }
            ready.push(entry);
        }
        let full = ready.len() >= max;
        (ready, full)
    }
}

/// Whether `row` is a row of authentication member `row.signer` valid for order member `me`
/// (any row of a configured authentication member under `Sabotage::SkipMac`).
pub(crate) fn matrix_row_valid(
    keys: &crate::crypto::KeyRing,
    q: &crate::quorum::Quorums,
    me: ReplicaId,
    sabotage: Option<Sabotage>,
    digest: &Digest,
    row: &MatrixRow,
) -> bool {
    if (row.signer.0 as usize) >= q.n_auth {
        return false;
    }
    sabotage == Some(Sabotage::SkipMac)
        || keys
            .verify_authenticator(Principal::Auth(row.signer), me.0 as usize, digest, &row.authenticator)
            .is_ok()
}

/// The last RETRANSMIT sent for each client: an order stage sends one for a request at most once
/// per interval (clients and authentication members retransmit more often than that).
#[derive(Default)]
pub(crate) struct RetransmitPacer {
    last: std::collections::BTreeMap<ClientId, (RequestId, Time)>,
}

impl RetransmitPacer {
    /// Whether a RETRANSMIT for `(client, request_id)` may go out at `now` (and if so, it is
    /// counted as sent).
    pub(crate) fn due(&mut self, now: Time, interval: u64, client: ClientId, request_id: RequestId) -> bool {
        if let Some(&(rid, at)) = self.last.get(&client) {
            if rid == request_id && now < at.saturating_add(interval) {
                return false;
            }
        }
        self.last.insert(client, (request_id, now));
        true
    }
}
