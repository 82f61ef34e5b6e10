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

/// What a member holds of a client's last reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CachedResult {
    /// The result: this member executed the request.
    Full(Bytes),
    /// Nothing yet (selective execution: the request is agreed but this member skipped it).
    Skipped,
}

/// A client's last reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CachedReply {
    /// The request it answers.
    pub request_id: RequestId,
    /// The result, or what this member holds of it.
    pub result: CachedResult,
}

/// Last reply per client (bounded by the configured clients: the stage only executes theirs) and
/// the time of the last RETRANSMIT answered per client.
#[derive(Default)]
pub(crate) struct ReplyCache {
    replies: BTreeMap<ClientId, CachedReply>,
    resent_at: BTreeMap<ClientId, (RequestId, Time)>,
}

impl ReplyCache {
    /// The client's cached reply.
    pub fn get(&self, client: ClientId) -> Option<&CachedReply> {
        self.replies.get(&client)
    }

    /// Last agreed request id of the client that this member executed or skipped (0 if none).
    pub fn last_id(&self, client: ClientId) -> RequestId {
        self.replies.get(&client).map_or(RequestId(0), |c| c.request_id)
    }

    /// Records the reply to a newly executed request.
    pub fn record(&mut self, client: ClientId, request_id: RequestId, result: Bytes) {
        self.insert(client, request_id, CachedResult::Full(result));
    }

    /// Records a newly agreed request this member skipped (selective execution).
    pub fn record_skipped(&mut self, client: ClientId, request_id: RequestId) {
        self.insert(client, request_id, CachedResult::Skipped);
    }

    fn insert(&mut self, client: ClientId, request_id: RequestId, result: CachedResult) {
        assert!(request_id > self.last_id(client), "request executed twice");
        self.replies.insert(client, CachedReply { request_id, result });
    }

    /// A skipped request ran here later (replayed or forced): its result replaces what the cache
    /// holds if it is still the client's last request.
    pub fn record_replayed(&mut self, client: ClientId, request_id: RequestId, result: Bytes) {
        if let Some(cached) = self.replies.get_mut(&client).filter(|c| c.request_id == request_id) {
            cached.result = CachedResult::Full(result);
        }
    }

    /// `r + 1` members sent the same reply to a skipped request (selective execution).
    pub fn certify(&mut self, client: ClientId, request_id: RequestId, result: Bytes) {
        if let Some(cached) = self.replies.get_mut(&client).filter(|c| c.request_id == request_id) {
            if cached.result == CachedResult::Skipped {
                cached.result = CachedResult::Full(result);
            }
        }
    }

    /// The cache as stored in a checkpoint: sorted by client. Every entry has its result (under
    /// selective execution the checkpoint is taken once the skipped replies are certified).
    pub fn to_sorted(&self) -> Vec<(ClientId, RequestId, Bytes)> {
        self.replies
            .iter()
            .map(|(c, r)| {
                let result = match &r.result {
                    CachedResult::Full(result) => result.clone(),
                    CachedResult::Skipped => unreachable!("a checkpoint waits for skipped replies"),
                };
                (*c, r.request_id, result)
            })
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
                        result: CachedResult::Full(result.clone()),
                    },
                )
            })
            .collect();
        self.resent_at.clear();
    }

    /// Every client whose last request is skipped here, with its id.
    pub fn skipped(&self) -> impl Iterator<Item = (ClientId, RequestId)> + '_ {
        self.replies
            .iter()
            .filter(|(_, r)| r.result == CachedResult::Skipped)
            .map(|(c, r)| (*c, r.request_id))
    }

    /// Whether a RETRANSMIT for `client`'s request `request_id` may be answered at `now` (at
    /// most once per request per `interval`; all order members forward the same retransmission).
    /// Per request, not per client: under selective execution a client whose object's
    /// maintainer lies retransmits each request as soon as its replies disagree, often within
    /// `interval` of the previous request's; the order members then pace the next RETRANSMIT
    /// of that request at `auth_retransmit_interval_us` (seconds), so refusing this one cost
    /// the client seconds per request (session 42: 12 of 16 clients at 1 operation in 8 s).
    pub fn may_resend(&mut self, client: ClientId, request_id: RequestId, now: Time, interval: u64) -> bool {
        match self.resent_at.get(&client) {
            Some(&(id, at)) if id == request_id && now < at.saturating_add(interval) => false,
            _ => {
                self.resent_at.insert(client, (request_id, now));
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
