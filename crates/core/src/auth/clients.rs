//! Per-client state of an authentication member: `lastSent`, pending-ness, the body cache.

use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

use crate::config::ClusterConfig;
use crate::crypto::Digest;
use crate::ids::{ClientId, RequestId};
use crate::message::AuthItem;
use crate::stage::Time;

/// The last request forwarded for a client.
pub(super) struct Forwarded {
    pub request_id: RequestId,
    pub operation: Bytes,
    pub operation_digest: Digest,
    /// What this member sends the order stage for it (entry and row).
    pub item: AuthItem,
    pub forwarded_at: Time,
    pub forwards: u32,
}

/// One client's state.
pub(super) struct ClientState {
    /// Most bodies kept (see `bodies_per_client`).
    bodies_max: usize,
    last_sent: Option<Forwarded>,
    /// Highest request id known ordered (from the co-located order or execution member).
    ordered: RequestId,
    /// Newest bodies: (request id, digest, operation).
    bodies: VecDeque<(RequestId, Digest, Bytes)>,
    /// Ignored until then (blacklisted), and the next blacklisting's length.
    blacklisted_until: Time,
    blacklist_period: Time,
}

/// First blacklisting of a client: one second. Each further one doubles it, up to
/// [`BLACKLIST_MAX_US`].
pub const BLACKLIST_INITIAL_US: Time = 1_000_000;
/// Longest blacklisting: Aardvark's ten minutes.
pub const BLACKLIST_MAX_US: Time = 600_000_000;

impl ClientState {
    pub fn last_sent(&self) -> Option<&Forwarded> {
        self.last_sent.as_ref()
    }

    /// Whether the client is being ignored at `now`.
    pub fn blacklisted(&self, now: Time) -> bool {
        now < self.blacklisted_until
    }

    /// Ignores the client from `now` for the next period (each one twice the last).
    pub fn blacklist(&mut self, now: Time) {
        self.blacklisted_until = now.saturating_add(self.blacklist_period);
        self.blacklist_period = self.blacklist_period.saturating_mul(2).min(BLACKLIST_MAX_US);
    }

    /// Whether a new request may replace the pending one.
    pub fn may_accept_new(&self, now: Time, interval_us: u64) -> bool {
        match &self.last_sent {
            None => true,
            Some(last) => self.ordered >= last.request_id || now.saturating_sub(last.forwarded_at) >= interval_us,
        }
    }

    /// The pending request's AUTH-REQ item, if a resend is due.
    pub fn retransmission_due(&mut self, now: Time, interval_us: u64) -> Option<AuthItem> {
        let last = self.last_sent.as_mut()?;
        if last.forwards == 1 || now.saturating_sub(last.forwarded_at) >= interval_us {
            last.forwards += 1;
            last.forwarded_at = now;
            Some(last.item.clone())
        } else {
            None
        }
    }

    /// Makes `forwarded` the last sent request and caches its body; returns the request id and
    /// body of one evicted to stay within the bound (its stored copy, if it has one, must be deleted).
    pub fn accept(&mut self, forwarded: Forwarded) -> Option<(RequestId, Bytes)> {
        let evicted = self.push_body(
            forwarded.request_id,
            forwarded.operation_digest,
            forwarded.operation.clone(),
        );
        self.last_sent = Some(forwarded);
        evicted
    }

    /// After a restart: puts an older stored body back into the cache (not `last_sent`).
    pub fn cache_body(&mut self, request_id: RequestId, operation: Bytes) {
        // Restored oldest first and at most `bodies_max` are stored: nothing is evicted here.
        let _ = self.push_body(request_id, Digest::of(&operation), operation);
    }

    fn push_body(&mut self, request_id: RequestId, digest: Digest, operation: Bytes) -> Option<(RequestId, Bytes)> {
        let evicted = if self.bodies.len() >= self.bodies_max {
            self.bodies.pop_front().map(|body| (body.0, body.2))
        } else {
            None
        };
        self.bodies.push_back((request_id, digest, operation));
        evicted
    }

    /// The newest request known ordered.
    pub fn ordered(&self) -> RequestId {
        self.ordered
    }

    /// `request_id` is known ordered (so is every older one: a client's requests are ordered in
    /// sequence).
    pub fn mark_ordered(&mut self, request_id: RequestId) {
        self.ordered = self.ordered.max(request_id);
    }

    pub fn body(&self, request_id: RequestId, digest: &Digest) -> Option<Bytes> {
        self.bodies
            .iter()
            .find(|(id, d, _)| *id == request_id && d == digest)
            .map(|(_, _, op)| op.clone())
    }
}

/// All configured clients' states.
pub(super) struct ClientTable {
    states: BTreeMap<ClientId, ClientState>,
}

impl ClientTable {
    pub fn new(config: &ClusterConfig, bodies_max: usize) -> ClientTable {
        let state = || ClientState {
            bodies_max,
            last_sent: None,
            ordered: RequestId(0),
            bodies: VecDeque::new(),
            blacklisted_until: 0,
            blacklist_period: BLACKLIST_INITIAL_US,
        };
        ClientTable {
            states: config.clients.iter().map(|c| (c.id, state())).collect(),
        }
    }

    pub fn contains(&self, client: ClientId) -> bool {
        self.states.contains_key(&client)
    }

    pub fn get(&self, client: ClientId) -> &ClientState {
        self.states.get(&client).expect("caller checked contains()")
    }

    pub fn get_mut(&mut self, client: ClientId) -> &mut ClientState {
        self.states.get_mut(&client).expect("caller checked contains()")
    }

    /// The state of `client` if it is configured (one lookup for checking and using it).
    pub fn find_mut(&mut self, client: ClientId) -> Option<&mut ClientState> {
        self.states.get_mut(&client)
    }

    /// After a restart: the persisted request is pending again (we do not know if it was ordered).
    pub fn restore(&mut self, forwarded: Forwarded) {
        let client = forwarded.item.entry.client;
        // Restored in key order, oldest first: nothing is evicted that was not already deleted.
        let _ = self.get_mut(client).accept(forwarded);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crypto::MatrixRow;
    use crate::ids::ReplicaId;
    use crate::message::{RequestBody, RequestEntry};

    fn state() -> ClientState {
        ClientState {
            bodies_max: 1,
            last_sent: None,
            ordered: RequestId(0),
            bodies: VecDeque::new(),
            blacklisted_until: 0,
            blacklist_period: BLACKLIST_INITIAL_US,
        }
    }

    fn forwarded(id: u64, at: Time) -> Forwarded {
        let operation = Bytes::from_static(b"op");
        Forwarded {
            request_id: RequestId(id),
            operation_digest: Digest::of(&operation),
            item: AuthItem {
                entry: RequestEntry {
                    client: ClientId(0),
                    request_id: RequestId(id),
                    body: RequestBody::Inline(operation.clone()),
                },
                row: MatrixRow {
                    signer: ReplicaId(0),
                    authenticator: crate::crypto::Authenticator { macs: Vec::new() },
                },
            },
            operation,
            forwarded_at: at,
            forwards: 1,
        }
    }

    #[test]
    fn a_new_request_waits_until_the_pending_one_is_known_ordered_or_the_interval_passed() {
        let mut s = state();
        assert!(s.may_accept_new(0, 100), "nothing pending");
        let _ = s.accept(forwarded(2, 10));
        assert!(!s.may_accept_new(50, 100), "request 2 pending");
        s.mark_ordered(RequestId(1));
        assert!(!s.may_accept_new(50, 100), "an older request ordered is not enough");
        assert!(s.may_accept_new(110, 100), "the interval passed");
        s.mark_ordered(RequestId(2));
        assert!(s.may_accept_new(50, 100));
        s.mark_ordered(RequestId(1));
        assert_eq!(s.ordered(), RequestId(2), "never goes back");
    }
}
