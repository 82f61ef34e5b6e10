//! The client's read-only path (PROTOCOL.md "Read-only path"): a read-only operation is sent
//! straight to every execution member as a READ-ONLY request; the result is accepted on
//! [`Quorums::read_only`](crate::quorum::Quorums::read_only) matching replies, each carrying the
//! full result, from distinct execution members. If the replies cannot match any more, or the
//! quorum is not complete within `knobs.read_only_timeout_us`, the same operation goes down the
//! ordered path as a normal request; the application gets exactly one result either way.
//!
//! Nonces: a READ-ONLY request carries a nonce, not an ordered request id (ordered ids must stay
//! gapless for the order stage). The nonce is `last_request_id * 2^16 + k` for the `k`-th read
//! since the last ordered request, so nonces only grow over the client's life (execution members
//! answer each nonce once and never an older one) and a late reply to an earlier read can never be
//! counted for a later one. After [`READ_ONLY_NONCES_PER_REQUEST_ID`] reads without an ordered
//! request, the next read takes the ordered path (which moves `last_request_id` on).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::config::Sabotage;
use crate::crypto::Digest;
use crate::ids::{Principal, ReplicaId, RequestId, StageKind};
use crate::message::{Envelope, Message, ReplyBody, SealFor};
use crate::stage::{Action, Time, Timer};

use super::Client;

/// Read-only nonces available per ordered request id (`k` in `1..=` this).
pub const READ_ONLY_NONCES_PER_REQUEST_ID: u64 = (1 << 16) - 1;

/// A read-only attempt in progress.
pub(super) struct ReadOnlyAttempt {
    nonce: RequestId,
    operation: Bytes,
    /// First reply of each execution member: its full result and digest, or `None` if the
    /// member sent only a digest (unusable: a digest is never accepted without its body).
    replies: BTreeMap<ReplicaId, Option<(Digest, Bytes)>>,
}

impl ReadOnlyAttempt {
    /// The result with the most matching full replies and their number.
    fn best(&self) -> Option<(&Bytes, usize)> {
        let mut counts: BTreeMap<Digest, (usize, &Bytes)> = BTreeMap::new();
        for (digest, body) in self.replies.values().flatten() {
            counts.entry(*digest).or_insert((0, body)).0 += 1;
        }
        counts
            .into_values()
            .max_by_key(|(n, _)| *n)
            .map(|(n, body)| (body, n))
    }
}

impl Client {
    /// `q_r`: [`Quorums::read_only`](crate::quorum::Quorums::read_only), or `r + 1` under
    /// [`Sabotage::WeakReadQuorum`].
    fn read_quorum(&self) -> usize {
        if self.config.knobs.sabotage == Some(Sabotage::WeakReadQuorum) {
            self.quorums.r + 1
        } else {
            self.quorums.read_only()
        }
    }

    /// Starts a read-only attempt for `operation`; false if no nonce is left (then the caller
    /// uses the ordered path).
    pub(super) fn start_read_only(&mut self, now: Time, operation: Bytes, out: &mut Vec<Action>) -> bool {
        if self.read_only_count >= READ_ONLY_NONCES_PER_REQUEST_ID {
            self.stats.bump("read_only_nonces_exhausted");
            return false;
        }
        let Some(nonce) = self
            .last_request_id
            .0
            .checked_mul(READ_ONLY_NONCES_PER_REQUEST_ID + 1)
            .and_then(|base| base.checked_add(self.read_only_count + 1))
        else {
            self.stats.bump("read_only_nonces_exhausted");
            return false;
        };
        self.read_only_count += 1;
        let message = Message::ReadOnlyRequest {
            client: self.id,
            request_id: RequestId(nonce),
            operation: operation.clone(),
        };
        let envelope = Envelope::seal(
            &self.keys,
            &self.quorums,
            Principal::Client(self.id),
            message,
            SealFor::Stage(StageKind::Exec),
        );
        out.push(Action::Send {
            to: crate::config::ClusterConfig::exec_members(&self.quorums).collect(),
            envelope: Arc::new(envelope),
        });
        out.push(Action::SetTimer {
            timer: Timer::ClientRetransmit,
            at: now + self.config.knobs.read_only_timeout_us,
        });
        self.read_only = Some(ReadOnlyAttempt {
            nonce: RequestId(nonce),
            operation,
            replies: BTreeMap::new(),
        });
        self.stats.bump("read_only_sent");
        true
    }

    /// A read-only reply (seal and sender already checked).
    pub(super) fn on_read_only_reply(
        &mut self,
        now: Time,
        exec: ReplicaId,
        nonce: RequestId,
        result: &ReplyBody,
        out: &mut Vec<Action>,
    ) {
        let q_r = self.read_quorum();
        let n_exec = self.quorums.n_exec;
        let Some(attempt) = self.read_only.as_mut().filter(|a| a.nonce == nonce) else {
            self.stats.bump("dropped_stale_read_only_reply");
            return;
        };
        if attempt.replies.contains_key(&exec) {
            self.stats.bump("dropped_duplicate_read_only_reply");
            return;
        }
        let vote = match result {
            ReplyBody::Full(body) => Some((Digest::of(body), body.clone())),
            ReplyBody::Digest(_) => None,
        };
        attempt.replies.insert(exec, vote);
        let (best, matching) = attempt.best().map_or((None, 0), |(b, n)| (Some(b.clone()), n));
        if matching >= q_r {
            let result = best.expect("a quorum has a body");
            self.read_only = None;
            out.push(Action::CancelTimer {
                timer: Timer::ClientRetransmit,
            });
            out.push(Action::Deliver {
                request_id: nonce,
                result,
            });
            self.stats.bump("read_only_delivered");
            self.stats.bump("delivered");
            self.start_next(now, out);
            return;
        }
        let unanswered = n_exec - attempt.replies.len();
        if matching + unanswered < q_r {
            self.stats.bump("read_only_mismatch");
            self.fall_back(now, out);
        }
    }

    /// The read-only timer expired before a quorum matched.
    pub(super) fn read_only_timeout(&mut self, now: Time, out: &mut Vec<Action>) {
        self.stats.bump("read_only_timeout");
        self.fall_back(now, out);
    }

    /// Abandons the read-only attempt and sends its operation down the ordered path.
    fn fall_back(&mut self, now: Time, out: &mut Vec<Action>) {
        let attempt = self.read_only.take().expect("a read-only attempt is in progress");
        self.stats.bump("read_only_fallback");
        self.start_ordered(now, attempt.operation, out);
    }
}
