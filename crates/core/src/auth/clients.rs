//! Per-client state of an authentication member: `lastSent`, pending-ness, the body cache.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use bytes::Bytes;

use crate::config::ClusterConfig;
use crate::crypto::Digest;
use crate::ids::{ClientId, ReplicaId, RequestId};
use crate::message::Envelope;
use crate::stage::Time;

use super::BODIES_PER_CLIENT_MAX;

/// The last request forwarded for a client.
pub(super) struct Forwarded {
    pub request_id: RequestId,
    pub operation: Bytes,
    pub operation_digest: Digest,
    pub envelope: Arc<Envelope>,
    pub forwarded_at: Time,
    pub forwards: u32,
}

/// One client's state.
#[derive(Default)]
pub(super) struct ClientState {
    last_sent: Option<Forwarded>,
    /// Highest request id known ordered (from a BATCH-COMPLETE quorum).
    ordered: RequestId,
    /// BATCH-COMPLETE votes for request ids above `ordered` (bounded by BODIES_PER_CLIENT_MAX ids).
    votes: BTreeMap<RequestId, BTreeSet<ReplicaId>>,
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

    /// The pending request's envelope, if a resend is due.
    pub fn retransmission_due(&mut self, now: Time, interval_us: u64) -> Option<Arc<Envelope>> {
        let last = self.last_sent.as_mut()?;
        if last.forwards == 1 || now.saturating_sub(last.forwarded_at) >= interval_us {
            last.forwards += 1;
            last.forwarded_at = now;
            Some(last.envelope.clone())
        } else {
            None
        }
    }

    pub fn accept(&mut self, forwarded: Forwarded) {
        if self.bodies.len() == BODIES_PER_CLIENT_MAX {
            self.bodies.pop_front();
        }
        self.bodies.push_back((
            forwarded.request_id,
            forwarded.operation_digest,
            forwarded.operation.clone(),
        ));
        self.votes.retain(|id, _| *id >= forwarded.request_id);
        self.last_sent = Some(forwarded);
    }

    pub fn ordered_vote(&mut self, exec: ReplicaId, request_id: RequestId, quorum: usize) {
        if request_id <= self.ordered {
            return;
        }
        // Only track ids we may still care about: not too far ahead of what we forwarded.
        let newest = self.last_sent.as_ref().map_or(RequestId(0), |l| l.request_id);
        if request_id > newest && self.votes.len() >= BODIES_PER_CLIENT_MAX && !self.votes.contains_key(&request_id) {
            return;
        }
        let voters = self.votes.entry(request_id).or_default();
        voters.insert(exec);
        if voters.len() >= quorum {
            self.ordered = request_id;
            self.votes.retain(|id, _| *id > request_id);
        }
        while self.votes.len() > BODIES_PER_CLIENT_MAX {
            self.votes.pop_first();
        }
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
    pub fn new(config: &ClusterConfig) -> ClientTable {
        ClientTable {
            states: config.clients.iter().map(|c| (c.id, ClientState::default())).collect(),
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

    /// After a restart: the persisted request is pending again (we do not know if it was ordered).
    pub fn restore(&mut self, forwarded: Forwarded) {
        let client = match &forwarded.envelope.message {
            crate::message::Message::AuthRequest { entry, .. } => entry.client,
            _ => unreachable!("built by AuthStage::build"),
        };
        self.get_mut(client).accept(forwarded);
    }
}
