//! What the next batch is validated against (PBFT thesis 2.3): the committed prefix projected
//! through the batches of the current view accepted after it (each client's last ordered request,
//! the largest batch time, the history digest), the next sequence number to accept, and the
//! matrix rows that count.

use std::collections::{BTreeMap, BTreeSet};

use super::OrderStage;
use crate::config::Sabotage;
use crate::crypto::{Digest, MatrixSignature};
use crate::ids::{ClientId, ReplicaId, RequestId, SeqNo};
use crate::message::history_digest;

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
        let mut n = self.prefix.last_committed.next();
        while self.log.get(&n).and_then(|s| s.accepted_in(self.view)).is_some() {
            n = n.next();
        }
        n
    }

    /// The projection through the accepted batches of the current view in `(last_committed, upto)`.
    pub(super) fn projection(&self, upto: SeqNo) -> Projection {
        let mut p = Projection {
            overlay: BTreeMap::new(),
            max_time: self.prefix.max_time,
            history: self.prefix.history,
        };
        for (_, slot) in self.log.range(self.prefix.last_committed.next()..upto) {
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

    pub(super) fn projected_last(&self, p: &Projection, client: ClientId) -> RequestId {
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
}
