//! Requests waiting to be ordered: matrix-signature rows collected per entry (UpRight thesis 5.2),
//! bounded per client.

use std::collections::BTreeMap;

use crate::crypto::{Digest, MatrixRow, MatrixSignature};
use crate::ids::{ClientId, ReplicaId, RequestId};
use crate::message::{RequestEntry, SignedEntry};

/// How far beyond its last ordered request a client's requests are kept (clients have one
/// outstanding request; a little slack covers a member that lags behind the commit point).
pub(crate) const POOL_AHEAD_MAX: u64 = 4;

/// One candidate entry with the rows (valid for this member) collected for it.
#[derive(Clone, Debug)]
struct Candidate {
    entry: RequestEntry,
    rows: BTreeMap<ReplicaId, MatrixRow>,
}

/// Rows per `(client, request id, entry digest)`. Each authentication member contributes at most
/// one digest per `(client, request id)`, so a client's table holds at most
/// `POOL_AHEAD_MAX * n_auth` candidates.
#[derive(Clone, Debug, Default)]
pub(crate) struct RequestPool {
    by_client: BTreeMap<ClientId, BTreeMap<(RequestId, Digest), Candidate>>,
}

/// What [`RequestPool::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Inserted {
    /// A new row was stored.
    New,
    /// The signer already sent a row for this request.
    Duplicate,
    /// Too far ahead of the client's last ordered request.
    TooFarAhead,
}

impl RequestPool {
    /// Adds `row` (already checked to be valid for this member) for `entry` with digest `digest`
    /// (`entry.digest()`), whose client's last ordered request is `last_ordered`. Clones the entry
    /// and row only when they are stored.
    pub fn insert(
        &mut self,
        entry: &RequestEntry,
        digest: Digest,
        row: &MatrixRow,
        last_ordered: RequestId,
    ) -> Inserted {
        if entry.request_id.0 > last_ordered.0 + POOL_AHEAD_MAX {
            return Inserted::TooFarAhead;
        }
        let table = self.by_client.entry(entry.client).or_default();
        let signed_before = table
            .iter()
            .any(|((rid, _), c)| *rid == entry.request_id && c.rows.contains_key(&row.signer));
        if signed_before {
            return Inserted::Duplicate;
        }
        let candidate = table.entry((entry.request_id, digest)).or_insert_with(|| Candidate {
            entry: entry.clone(),
            rows: BTreeMap::new(),
        });
        candidate.rows.insert(row.signer, row.clone());
        Inserted::New
    }

    /// The best-supported entry for `(client, request_id)` with at least `rows` rows, as a signed
    /// entry carrying all collected rows.
    pub fn ready(&self, client: ClientId, request_id: RequestId, rows: usize) -> Option<SignedEntry> {
        let table = self.by_client.get(&client)?;
        table
            .range((request_id, Digest([0; 32]))..=(request_id, Digest([0xff; 32])))
            .map(|(_, c)| c)
            .filter(|c| c.rows.len() >= rows)
            .max_by_key(|c| c.rows.len())
            .map(|c| SignedEntry {
                entry: c.entry.clone(),
                matrix: MatrixSignature {
                    rows: c.rows.values().cloned().collect(),
                },
            })
    }

    /// Clients with pending entries, in id order.
    pub fn clients(&self) -> impl Iterator<Item = ClientId> + '_ {
        self.by_client.keys().copied()
    }

    /// The clients with pending entries, starting after `after` and wrapping around (so a primary
    /// that resumes after the last client it ordered serves every client in turn).
    pub fn clients_after(&self, after: ClientId) -> impl Iterator<Item = ClientId> + '_ {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let tail = self.by_client.range((Excluded(after), Unbounded));
        let head = self.by_client.range((Unbounded, Included(after)));
        tail.chain(head).map(|(c, _)| *c)
    }

    /// Drops a client's entries at or below `last_ordered`.
    pub fn gc(&mut self, client: ClientId, last_ordered: RequestId) {
        if let Some(table) = self.by_client.get_mut(&client) {
            table.retain(|(rid, _), _| *rid > last_ordered);
            if table.is_empty() {
                self.by_client.remove(&client);
            }
        }
    }

    /// Number of candidate entries (for tests and stats).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.by_client.values().map(|t| t.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Authenticator;
    use crate::message::RequestBody;

    fn entry(rid: u64, op: &[u8]) -> RequestEntry {
        RequestEntry {
            client: ClientId(1),
            request_id: RequestId(rid),
            body: RequestBody::Inline(op.to_vec().into()),
        }
    }

    fn row(signer: u32) -> MatrixRow {
        MatrixRow {
            signer: ReplicaId(signer),
            authenticator: Authenticator { macs: vec![] },
        }
    }

    fn insert(pool: &mut RequestPool, entry: RequestEntry, row: MatrixRow) -> Inserted {
        let digest = entry.digest();
        pool.insert(&entry, digest, &row, RequestId(0))
    }

    #[test]
    fn rows_collect_per_entry_and_signers_count_once_per_request() {
        let mut pool = RequestPool::default();
        assert_eq!(insert(&mut pool, entry(1, b"a"), row(0)), Inserted::New);
        assert_eq!(insert(&mut pool, entry(1, b"a"), row(1)), Inserted::New);
        // Signer 1 cannot also vouch for another body of the same request.
        assert_eq!(insert(&mut pool, entry(1, b"b"), row(1)), Inserted::Duplicate);
        assert_eq!(insert(&mut pool, entry(1, b"b"), row(2)), Inserted::New);
        assert_eq!(insert(&mut pool, entry(9, b"a"), row(0)), Inserted::TooFarAhead);
        let ready = pool.ready(ClientId(1), RequestId(1), 2).unwrap();
        assert_eq!(ready.entry, entry(1, b"a"));
        assert_eq!(ready.matrix.rows.len(), 2);
        assert!(pool.ready(ClientId(1), RequestId(1), 3).is_none());
        pool.gc(ClientId(1), RequestId(1));
        assert_eq!(pool.len(), 0);
    }
}
