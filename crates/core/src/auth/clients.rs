//! Per-client state of an authentication member: `lastSent`, pending-ness, the body cache.

use bytes::Bytes;
use std::collections::{BTreeMap, VecDeque};

use crate::config::ClusterConfig;
use crate::crypto::Digest;
use crate::ids::{ClientId, ReplicaId, RequestId};
use crate::message::AuthItem;
use crate::stage::Time;

use super::VOTES_TRACKED_MAX;

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
    /// Highest request id known ordered (from a BATCH-COMPLETE quorum).
    ordered: RequestId,
    /// BATCH-COMPLETE voters per request id above `ordered`, in request id order, at most
    /// VOTES_TRACKED_MAX ids, each voter once.
    votes: Vec<(RequestId, Vec<ReplicaId>)>,
    /// Newest bodies: (request id, digest, operation).
    bodies: VecDeque<(RequestId, Digest, Bytes)>,
}

impl ClientState {
    pub fn last_sent(&self) -> Option<&Forwarded> {
        self.last_sent.as_ref()
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
        self.votes.retain(|(id, _)| *id >= forwarded.request_id);
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

    /// The newest request known ordered (by a BATCH-COMPLETE quorum).
    pub fn ordered(&self) -> RequestId {
        self.ordered
    }

    pub fn ordered_vote(&mut self, exec: ReplicaId, request_id: RequestId, quorum: usize) {
        if request_id <= self.ordered {
            return;
        }
        // Only track ids we may still care about: not too far ahead of what we forwarded.
        let newest = self.last_sent.as_ref().map_or(RequestId(0), |l| l.request_id);
        let at = self.votes.binary_search_by_key(&request_id, |(id, _)| *id);
        if request_id > newest && self.votes.len() >= VOTES_TRACKED_MAX && at.is_err() {
            return;
        }
        let at = at.unwrap_or_else(|at| {
            self.votes.insert(at, (request_id, Vec::new()));
            at
        });
        let voters = &mut self.votes[at].1;
        if !voters.contains(&exec) {
            voters.push(exec);
        }
        if voters.len() >= quorum {
            self.ordered = request_id;
            self.votes.drain(..=at);
        }
        let excess = self.votes.len().saturating_sub(VOTES_TRACKED_MAX);
        self.votes.drain(..excess);
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
            votes: Vec::new(),
            bodies: VecDeque::new(),
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

    fn state() -> ClientState {
        ClientState {
            bodies_max: 1,
            last_sent: None,
            ordered: RequestId(0),
            votes: Vec::new(),
            bodies: VecDeque::new(),
        }
    }

    fn tracked(state: &ClientState) -> Vec<(u64, Vec<u32>)> {
        let ids = |v: &Vec<ReplicaId>| v.iter().map(|r| r.0).collect();
        state.votes.iter().map(|(id, v)| (id.0, ids(v))).collect()
    }

    #[test]
    fn votes_count_each_voter_once_and_a_quorum_drops_older_ids() {
        let mut s = state();
        s.ordered_vote(ReplicaId(0), RequestId(2), 2);
        s.ordered_vote(ReplicaId(0), RequestId(2), 2);
        s.ordered_vote(ReplicaId(1), RequestId(1), 2);
        assert_eq!(tracked(&s), vec![(1, vec![1]), (2, vec![0])]);
        assert_eq!(s.ordered, RequestId(0), "one voter, counted once");
        s.ordered_vote(ReplicaId(2), RequestId(2), 2);
        assert_eq!(s.ordered, RequestId(2));
        assert!(tracked(&s).is_empty(), "ids at or below the ordered one are dropped");
        s.ordered_vote(ReplicaId(0), RequestId(1), 2);
        assert!(tracked(&s).is_empty(), "votes at or below the ordered one are ignored");
    }

    #[test]
    fn votes_track_at_most_the_newest_ids_in_order() {
        let mut s = state();
        // Nothing forwarded: ids beyond it are tracked only while there is room.
        for id in (1..=VOTES_TRACKED_MAX as u64 + 3).rev() {
            s.ordered_vote(ReplicaId(0), RequestId(id), 3);
        }
        let ids: Vec<u64> = tracked(&s).iter().map(|(id, _)| *id).collect();
        let first: Vec<u64> = (4..=VOTES_TRACKED_MAX as u64 + 3).collect();
        assert_eq!(ids, first, "the first VOTES_TRACKED_MAX ids to arrive, in id order");
        // A vote for a tracked id still counts; a new id is refused when full.
        s.ordered_vote(ReplicaId(1), RequestId(4), 3);
        s.ordered_vote(ReplicaId(1), RequestId(1), 3);
        assert_eq!(tracked(&s)[0], (4, vec![0, 1]));
        assert_eq!(tracked(&s).len(), VOTES_TRACKED_MAX);
    }
}
