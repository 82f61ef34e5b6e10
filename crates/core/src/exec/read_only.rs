//! The read-only path at an execution member (PROTOCOL.md "Read-only path"): a client's
//! READ-ONLY request is executed at once on the member's current state, outside the agreed order,
//! and answered with a full reply flagged `read_only`.
//!
//! Nothing here touches the service state (`Service::execute_read_only` takes `&self`), the reply
//! cache, the checkpoints or storage. An operation the service does not call read-only gets **no
//! reply** (counted `read_only_refused_write`): the client's read-only timeout then sends it down the
//! ordered path. Bounds: one entry per configured client (its newest answered nonce); each nonce is
//! answered at most once and older nonces never, so a replayed request costs nothing and a client
//! has at most one read-only answer outstanding per nonce it chose. The member keeps no queue of
//! read-only work: it answers within the same `handle` call or drops the request.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::ids::{ClientId, Principal, RequestId};
use crate::message::{Envelope, Message, ReplyBody, SealFor};
use crate::stage::Action;

use super::ExecStage;

/// Per client: the newest read-only nonce answered. Bounded by the configured clients (requests of
/// unknown clients are dropped before they reach it).
#[derive(Debug, Default)]
pub(super) struct ReadOnlyNonces {
    newest: BTreeMap<ClientId, RequestId>,
}

impl ReadOnlyNonces {
    /// Records `nonce` for `client` if it is newer than every nonce answered before.
    fn admit(&mut self, client: ClientId, nonce: RequestId) -> bool {
        let newest = self.newest.entry(client).or_insert(RequestId(0));
        if nonce <= *newest {
            return false;
        }
        *newest = nonce;
        true
    }
}

impl ExecStage {
    /// A READ-ONLY request (already dispatched on its kind, seal not yet checked).
    pub(super) fn on_read_only_request(&mut self, envelope: &Envelope, out: &mut Vec<Action>) {
        let Message::ReadOnlyRequest {
            client,
            request_id,
            operation,
        } = &envelope.message
        else {
            unreachable!("dispatched on message kind");
        };
        if envelope.from != Principal::Client(*client) || !self.clients.contains(client) {
            self.stats.bump("read_only_wrong_sender");
            return;
        }
        if self.state_is_partial() {
            self.stats.bump("read_only_during_transfer");
            return;
        }
        if self.tentative_outstanding() {
            // The state holds a batch not yet committed: reading it could return a write that
            // a view change undoes. The client's read-only timeout sends it on the ordered path.
            self.stats.bump("read_only_during_tentative");
            return;
        }
        if operation.len() > self.config.knobs.request_bytes_max || request_id.0 == 0 {
            self.stats.bump("read_only_bad_request");
            return;
        }
        if !self.seal_ok(envelope, out) {
            return;
        }
        if self.selective.is_some() && !self.reads_maintained(operation) {
            // Its copies of other objects may be stale; their maintainers answer.
            self.stats.bump("read_only_not_maintained");
            return;
        }
        if !self.read_only_nonces.admit(*client, *request_id) {
            self.stats.bump("read_only_stale_nonce");
            return;
        }
        let Some(result) = self.service.execute_read_only(operation) else {
            self.stats.bump("read_only_refused_write");
            return;
        };
        if result.len() > self.config.knobs.reply_bytes_max {
            self.stats.bump("read_only_reply_too_large");
            return;
        }
        self.stats.bump("read_only_answered");
        self.send_read_only_reply(*client, *request_id, result, out);
    }

    fn send_read_only_reply(&self, client: ClientId, nonce: RequestId, result: Bytes, out: &mut Vec<Action>) {
        let message = Message::Reply {
            request_id: nonce,
            result: ReplyBody::Full(result),
            read_only: true,
            pushes_sent: self.pushes.sent(client),
        };
        let to = Principal::Client(client);
        self.send(vec![to], message, SealFor::One(to), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_are_answered_once_and_in_increasing_order() {
        let mut n = ReadOnlyNonces::default();
        assert!(n.admit(ClientId(1), RequestId(5)));
        assert!(!n.admit(ClientId(1), RequestId(5)), "a nonce is answered once");
        assert!(!n.admit(ClientId(1), RequestId(4)), "older nonces never");
        assert!(n.admit(ClientId(2), RequestId(1)), "per client");
        assert!(n.admit(ClientId(1), RequestId(6)));
    }
}
