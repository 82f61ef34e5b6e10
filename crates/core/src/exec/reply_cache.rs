//! The reply cache: each client's last executed request id and its reply (PROTOCOL.md, normal
//! case steps 5-6), and which execution member sends the full reply.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::crypto::Digest;
use crate::ids::{ClientId, ReplicaId, RequestId};
use crate::message::ReplyBody;
use crate::stage::Time;

/// Results at most this long are sent in full by every execution member. Sending a small result
/// three times costs less than what a lying designated member can otherwise cost: the client holds
/// matching digests but no body and waits a retransmission interval for it. Above this size only
/// the designated members send the body (PBFT's digest-reply optimisation; `reply_body` says which).
pub const SMALL_REPLY_BYTES: usize = 512;

/// A client's last reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CachedReply {
    /// The request it answers.
    pub request_id: RequestId,
    /// The result.
    pub result: Bytes,
}

/// Last reply per client (bounded by the configured clients: the stage only executes theirs) and
/// the time of the last RETRANSMIT answered per client.
#[derive(Default)]
pub(crate) struct ReplyCache {
    replies: BTreeMap<ClientId, CachedReply>,
    resent_at: BTreeMap<ClientId, Time>,
}

impl ReplyCache {
    /// The client's cached reply.
    pub fn get(&self, client: ClientId) -> Option<&CachedReply> {
        self.replies.get(&client)
    }

    /// Last executed request id of the client (0 if none).
    pub fn last_id(&self, client: ClientId) -> RequestId {
        self.replies.get(&client).map_or(RequestId(0), |c| c.request_id)
    }

    /// Records the reply to a newly executed request.
    pub fn record(&mut self, client: ClientId, request_id: RequestId, result: Bytes) {
        assert!(request_id > self.last_id(client), "request executed twice");
        self.replies.insert(client, CachedReply { request_id, result });
    }

    /// The cache as stored in a checkpoint: sorted by client.
    pub fn to_sorted(&self) -> Vec<(ClientId, RequestId, Bytes)> {
        self.replies
            .iter()
            .map(|(c, r)| (*c, r.request_id, r.result.clone()))
            .collect()
    }

    /// Replaces the cache with a checkpoint's.
    pub fn restore(&mut self, entries: &[(ClientId, RequestId, Bytes)]) {
        self.replies = entries
            .iter()
            .map(|(c, id, result)| {
                (
                    *c,
                    CachedReply {
                        request_id: *id,
                        result: result.clone(),
                    },
                )
            })
            .collect();
        self.resent_at.clear();
    }

    /// Whether a RETRANSMIT for `client` may be answered at `now` (at most once per `interval`;
    /// all order members forward the same retransmission).
    pub fn may_resend(&mut self, client: ClientId, now: Time, interval: u64) -> bool {
        match self.resent_at.get(&client) {
            Some(&at) if now < at.saturating_add(interval) => false,
            _ => {
                self.resent_at.insert(client, now);
                true
            }
        }
    }
}

/// The body execution member `me` sends for a reply: `Full` from the `n_exec - r` designated
/// repliers (the members `(client + request_id + k) mod n_exec` for `k < n_exec - r`), for small
/// results and for retransmissions, else `Digest`.
///
/// `n_exec - r` of them, not PBFT's one: then at most `r` members send only a digest, so any
/// `r + 1` matching replies (the client's quorum) include a body. With one designated replier a
/// member that was merely behind (catching up, or slow) made every client whose request it was
/// designated for hold matching digests and no body until its retransmission timer fired: in
/// the simulator's fault-free attack baseline that was one request in 25 (178 retransmissions of
/// 4,297 operations, each a 100 ms stall, every one with two matching digests and no body).
pub(crate) fn reply_body(
    q: &crate::quorum::Quorums,
    me: ReplicaId,
    client: ClientId,
    request_id: RequestId,
    result: &Bytes,
    retransmit: bool,
) -> ReplyBody {
    let n_exec = q.n_exec as u64;
    let base = (client.0 as u64).wrapping_add(request_id.0) % n_exec;
    let offset = (me.0 as u64 + n_exec - base) % n_exec;
    let designated = offset < n_exec.saturating_sub(q.r as u64).max(1);
    if designated || retransmit || result.len() <= SMALL_REPLY_BYTES {
        ReplyBody::Full(result.clone())
    } else {
        ReplyBody::Digest(Digest::of(result))
    }
}
