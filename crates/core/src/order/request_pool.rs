//! Requests waiting to be ordered: matrix-signature rows collected per entry (UpRight thesis 5.2),
//! bounded per client.

use std::collections::BTreeMap;

use crate::config::ClusterConfig;
use crate::crypto::{Digest, MatrixRow, MatrixSignature};
use crate::ids::{ClientId, RequestId};
use crate::message::{RequestBody, RequestEntry, SignedEntry};

pub(crate) use crate::limits::POOL_AHEAD_MAX;

/// One candidate entry with the rows (valid for this member) collected for it.
#[derive(Clone, Debug)]
pub(crate) struct Candidate {
    entry: RequestEntry,
    /// `entry.digest()`, computed once when the entry arrived.
    digest: Digest,
    /// At most one row per authentication member, in signer order.
    rows: Vec<MatrixRow>,
}

impl Candidate {
    /// `entry.digest()`.
    pub fn digest(&self) -> Digest {
        self.digest
    }

    /// Bytes of the operation carried in the entry (0 for a body ordered by digest).
    pub fn inline_bytes(&self) -> usize {
        match &self.entry.body {
            RequestBody::Inline(op) => op.len(),
            RequestBody::Digest(_) => 0,
        }
    }

    /// The entry with all collected rows (in signer order) as its matrix signature.
    pub fn signed(&self) -> SignedEntry {
        SignedEntry {
            entry: self.entry.clone(),
            matrix: MatrixSignature {
                rows: self.rows.clone(),
            },
        }
    }

    fn has_row_of(&self, row: &MatrixRow) -> bool {
        self.rows.iter().any(|r| r.signer == row.signer)
    }

    fn add_row(&mut self, row: &MatrixRow) {
        let at = self.rows.partition_point(|r| r.signer < row.signer);
        self.rows.insert(at, row.clone());
    }
}

/// Rows per `(client, request id, entry digest)`, for the configured clients only. Each
/// authentication member contributes at most one digest per `(client, request id)`, so a
/// client's candidates number at most `POOL_AHEAD_MAX * n_auth`; they are kept in
/// `(request id, digest)` order.
#[derive(Clone, Debug)]
pub(crate) struct RequestPool {
    /// Every configured client, with its candidates (a client without any keeps its empty,
    /// already allocated list: clients come back with their next request).
    by_client: BTreeMap<ClientId, Vec<Candidate>>,
    /// Candidates in all lists.
    len: usize,
}

/// What [`RequestPool::insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Inserted {
    /// A new row was stored.
    New,
    /// The signer already sent this row, or a row for another entry of this request.
    Duplicate,
    /// The signer's row for this entry replaced its older one.
    Refreshed,
    /// Too far ahead of the client's last ordered request.
    TooFarAhead,
    /// Not a configured client.
    UnknownClient,
}

impl RequestPool {
    /// An empty pool for the clients of `config`.
    pub fn new(config: &ClusterConfig) -> RequestPool {
        RequestPool {
            by_client: config.clients.iter().map(|c| (c.id, Vec::new())).collect(),
            len: 0,
        }
    }

    /// Whether `client` is a configured client.
    pub fn knows(&self, client: ClientId) -> bool {
        self.by_client.contains_key(&client)
    }

    /// `entry.digest()`, taken from a stored candidate with an equal entry if there is one (the
    /// same entry arrives from every authentication member: it is hashed once).
    pub fn digest_of(&self, entry: &RequestEntry) -> Digest {
        self.by_client
            .get(&entry.client)
            .and_then(|table| table.iter().find(|c| c.entry == *entry))
            .map_or_else(|| entry.digest(), |c| c.digest)
    }

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
        let Some(table) = self.by_client.get_mut(&entry.client) else {
            return Inserted::UnknownClient;
        };
        let rid = entry.request_id;
        if let Some(c) = table
            .iter_mut()
            .find(|c| c.entry.request_id == rid && c.has_row_of(row))
        {
            // The signer's newer row for the same entry replaces its old one: its MACs may be
            // under keys the old one's were not (key refresh: an authentication member seals a
            // retransmitted item afresh, and the old row may be under keys since retired).
            if c.digest == digest {
                if let Some(old) = c.rows.iter_mut().find(|r| r.signer == row.signer) {
                    if old != row {
                        *old = row.clone();
                        return Inserted::Refreshed;
                    }
                }
            }
            return Inserted::Duplicate;
        }
        let key = (rid, digest);
        let at = match table.binary_search_by(|c| (c.entry.request_id, c.digest).cmp(&key)) {
            Ok(at) => at,
            Err(at) => {
                table.insert(
                    at,
                    Candidate {
                        entry: entry.clone(),
                        digest,
                        rows: Vec::new(),
                    },
                );
                self.len += 1;
                at
            }
        };
        table[at].add_row(row);
        Inserted::New
    }

    /// Whether `rows` distinct authentication members sent this member (and it checked on
    /// arrival) a row for the entry of `(client, request_id)` with digest `digest`.
    pub fn vouched(&self, client: ClientId, request_id: RequestId, digest: Digest, rows: usize) -> bool {
        self.by_client.get(&client).is_some_and(|table| {
            table
                .iter()
                .any(|c| c.entry.request_id == request_id && c.digest == digest && c.rows.len() >= rows)
        })
    }

    /// The best-supported entry for `(client, request_id)` with at least `rows` rows (of equally
    /// supported ones, the one with the largest digest).
    pub fn ready(&self, client: ClientId, request_id: RequestId, rows: usize) -> Option<&Candidate> {
        self.by_client
            .get(&client)?
            .iter()
            .filter(|c| c.entry.request_id == request_id && c.rows.len() >= rows)
            .max_by_key(|c| c.rows.len())
    }

    /// The entry for `(client, request_id)` that authentication member `signer` sent a row for
    /// (the Quorum phase takes a request on its co-located member's word).
    pub fn with_row_of(
        &self,
        client: ClientId,
        request_id: RequestId,
        signer: crate::ids::ReplicaId,
    ) -> Option<&Candidate> {
        self.by_client
            .get(&client)?
            .iter()
            .find(|c| c.entry.request_id == request_id && c.rows.iter().any(|r| r.signer == signer))
    }

    /// Whether no client has a pending entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Clients with pending entries, in id order.
    pub fn clients(&self) -> impl Iterator<Item = ClientId> + '_ {
        self.by_client.iter().filter(|(_, t)| !t.is_empty()).map(|(c, _)| *c)
    }

    /// The clients with pending entries, starting after `after` and wrapping around (so a primary
    /// that resumes after the last client it ordered serves every client in turn).
    pub fn clients_after(&self, after: ClientId) -> impl Iterator<Item = ClientId> + '_ {
        use std::ops::Bound::{Excluded, Included, Unbounded};
        let tail = self.by_client.range((Excluded(after), Unbounded));
        let head = self.by_client.range((Unbounded, Included(after)));
        tail.chain(head).filter(|(_, t)| !t.is_empty()).map(|(c, _)| *c)
    }

    /// Drops a client's entries at or below `last_ordered`.
    pub fn gc(&mut self, client: ClientId, last_ordered: RequestId) {
        if let Some(table) = self.by_client.get_mut(&client) {
            // Sorted by request id: the entries to drop are a prefix.
            let drop = table.partition_point(|c| c.entry.request_id <= last_ordered);
            table.drain(..drop);
            self.len -= drop;
        }
    }

    /// Number of candidate entries (for tests and stats).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.len
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::Authenticator;
    use crate::ids::ReplicaId;

    /// A pool for clients 1 and 2.
    fn pool() -> RequestPool {
        RequestPool {
            by_client: [(ClientId(1), Vec::new()), (ClientId(2), Vec::new())].into(),
            len: 0,
        }
    }

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

    fn signers(signed: &SignedEntry) -> Vec<u32> {
        signed.matrix.rows.iter().map(|r| r.signer.0).collect()
    }

    #[test]
    fn rows_collect_per_entry_and_signers_count_once_per_request() {
        let mut pool = pool();
        assert_eq!(insert(&mut pool, entry(1, b"a"), row(0)), Inserted::New);
        assert_eq!(insert(&mut pool, entry(1, b"a"), row(1)), Inserted::New);
        // Signer 1 cannot also vouch for another body of the same request.
        assert_eq!(insert(&mut pool, entry(1, b"b"), row(1)), Inserted::Duplicate);
        assert_eq!(insert(&mut pool, entry(1, b"b"), row(2)), Inserted::New);
        assert_eq!(insert(&mut pool, entry(9, b"a"), row(0)), Inserted::TooFarAhead);
        let ready = pool.ready(ClientId(1), RequestId(1), 2).unwrap().signed();
        assert_eq!(ready.entry, entry(1, b"a"));
        assert_eq!(ready.matrix.rows.len(), 2);
        assert!(pool.ready(ClientId(1), RequestId(1), 3).is_none());
        pool.gc(ClientId(1), RequestId(1));
        assert_eq!(pool.len(), 0);
        assert!(pool.is_empty() && pool.clients().next().is_none());
    }

    #[test]
    fn rows_are_in_signer_order_and_ties_go_to_the_largest_digest() {
        let mut pool = pool();
        for signer in [2, 0, 3] {
            insert(&mut pool, entry(1, b"a"), row(signer));
        }
        insert(&mut pool, entry(1, b"b"), row(1));
        let best = pool.ready(ClientId(1), RequestId(1), 1).unwrap();
        assert_eq!(signers(&best.signed()), vec![0, 2, 3]);
        assert_eq!(best.digest(), entry(1, b"a").digest());
        // Two entries with two rows each: the one with the larger digest wins (as in a map
        // ordered by digest, whose last maximum is taken).
        let mut pool = self::pool();
        let (x, y) = (entry(1, b"x"), entry(1, b"y"));
        for (e, s) in [(&x, 0), (&y, 1), (&y, 2), (&x, 3)] {
            insert(&mut pool, e.clone(), row(s));
        }
        let larger = x.digest().max(y.digest());
        assert_eq!(pool.ready(ClientId(1), RequestId(1), 2).unwrap().digest(), larger);
    }

    #[test]
    fn a_clients_candidates_stay_bounded_and_ordered() {
        let n_auth = 4;
        let mut pool = pool();
        for rid in 1..=10 {
            for signer in 0..n_auth {
                // Every signer vouches for its own body, then tries another one.
                let own = format!("{rid}/{signer}");
                let outcome = insert(&mut pool, entry(rid, own.as_bytes()), row(signer));
                let expected = if rid > POOL_AHEAD_MAX {
                    Inserted::TooFarAhead
                } else {
                    Inserted::New
                };
                assert_eq!(outcome, expected);
                let other = insert(&mut pool, entry(rid, b"other"), row(signer));
                assert_ne!(other, Inserted::New);
            }
        }
        let table = &pool.by_client[&ClientId(1)];
        assert_eq!(table.len(), POOL_AHEAD_MAX as usize * n_auth as usize);
        assert_eq!(pool.len(), table.len());
        let keys: Vec<_> = table.iter().map(|c| (c.entry.request_id, c.digest)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "sorted by (request id, digest)");
        pool.gc(ClientId(1), RequestId(2));
        let table = &pool.by_client[&ClientId(1)];
        assert_eq!(pool.len(), 2 * n_auth as usize);
        assert!(table.iter().all(|c| c.entry.request_id > RequestId(2)));
        assert_eq!(pool.clients().collect::<Vec<_>>(), vec![ClientId(1)]);
    }

    #[test]
    fn unknown_clients_are_refused_and_digests_are_reused() {
        let mut pool = pool();
        let stranger = RequestEntry {
            client: ClientId(7),
            ..entry(1, b"a")
        };
        assert!(!pool.knows(ClientId(7)) && pool.knows(ClientId(2)));
        assert_eq!(insert(&mut pool, stranger.clone(), row(0)), Inserted::UnknownClient);
        assert_eq!(pool.digest_of(&stranger), stranger.digest());
        assert!(pool.is_empty());
        let e = entry(1, b"a");
        insert(&mut pool, e.clone(), row(0));
        assert_eq!(pool.digest_of(&e), e.digest());
        assert_eq!(pool.digest_of(&entry(1, b"b")), entry(1, b"b").digest());
        // Client 2 has nothing pending and is not offered.
        assert_eq!(pool.clients_after(ClientId(1)).collect::<Vec<_>>(), vec![ClientId(1)]);
    }
}
