//! The client's read-only path (PROTOCOL.md "Read-only path"): a read-only operation is sent
//! straight to every execution member as a READ-ONLY request; the result is accepted on
//! [`Quorums::read_only`](crate::quorum::Quorums::read_only) matching replies, each carrying the
//! full result, from distinct execution members. If the replies cannot match any more, or the
//! quorum is not complete within `knobs.read_only_timeout_us`, the same operation goes down the
//! ordered path as a normal request; the application gets exactly one result either way. After a
//! timeout the client orders its reads for a pause (100 ms, doubling with each timeout in a row up
//! to 10 s, reset by a read-only success), so a member that is down does not cost every read the
//! timeout.
//!
//! Nonces: a READ-ONLY request carries a nonce, not an ordered request id (ordered ids must stay
//! gapless for the order stage). The nonce is `last_request_id * 2^16 + k` for the `k`-th read
//! since the last ordered request, so nonces only grow over the client's life (execution members
//! answer each nonce once and never an older one) and a late reply to an earlier read can never be
//! counted for a later one. After [`READ_ONLY_NONCES_PER_REQUEST_ID`] reads without an ordered
//! request, the next read takes the ordered path (which moves `last_request_id` on).

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::config::Sabotage;
use crate::crypto::Digest;
use crate::ids::{ReplicaId, RequestId};
use crate::message::{Message, ReplyBody};
use crate::stage::{Action, ReadPath, Time, Timer};

use super::Client;

/// Read-only nonces available per ordered request id (`k` in `1..=` this).
pub const READ_ONLY_NONCES_PER_REQUEST_ID: u64 = (1 << 16) - 1;

/// A read-only attempt in progress.
pub(super) struct ReadOnlyAttempt {
    nonce: RequestId,
    operation: Bytes,
    /// Linearizable ([`ReadPath::ReadOnly`]) or serializable.
    path: ReadPath,
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
        counts.into_values().max_by_key(|(n, _)| *n).map(|(n, body)| (body, n))
    }
}

impl Client {
    /// `q_r` for `path`: [`Quorums::read_only`](crate::quorum::Quorums::read_only) for a
    /// linearizable read (or `r + 1` under [`Sabotage::WeakReadQuorum`]); `r + 1`
    /// ([`Quorums::reply`](crate::quorum::Quorums::reply)) for a serializable one.
    fn read_quorum(&self, path: ReadPath) -> usize {
        let sabotage = self.config.knobs.sabotage;
        if path == ReadPath::Serializable && sabotage == Some(Sabotage::WeakSerializableQuorum) {
            return 1;
        }
        if path == ReadPath::Serializable || sabotage == Some(Sabotage::WeakReadQuorum) {
            self.quorums.reply()
        } else {
            self.quorums.read_only()
        }
    }

    /// Starts a read-only attempt for `operation`; false if no nonce is left (then the caller
    /// uses the ordered path).
    pub(super) fn start_read_only(
        &mut self,
        now: Time,
        operation: Bytes,
        path: ReadPath,
        out: &mut Vec<Action>,
    ) -> bool {
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
        self.send_to_exec(message, out);
        out.push(Action::SetTimer {
            timer: Timer::ClientRetransmit,
            at: now + self.config.knobs.read_only_timeout_us,
        });
        self.read_only = Some(ReadOnlyAttempt {
            nonce: RequestId(nonce),
            operation,
            path,
            replies: BTreeMap::new(),
        });
        self.stats.bump(if path == ReadPath::Serializable {
            "serializable_sent"
        } else {
            "read_only_sent"
        });
        true
    }

    /// Whether a read-only reply from `exec` for `nonce` could count: the attempt in progress is
    /// for `nonce` and `exec` has not answered it yet (only a member's first reply counts). `Err`
    /// names the counter of a reply to drop, checked before its seal.
    pub(super) fn read_only_reply_wanted(&self, exec: ReplicaId, nonce: RequestId) -> Result<(), &'static str> {
        match &self.read_only {
            Some(attempt) if attempt.nonce == nonce => {
                if attempt.replies.contains_key(&exec) {
                    Err("dropped_duplicate_read_only_reply")
                } else {
                    Ok(())
                }
            }
            _ => Err("dropped_stale_read_only_reply"),
        }
    }

    /// A read-only reply (sender, nonce, first from `exec`, seal: all checked).
    pub(super) fn on_read_only_reply(
        &mut self,
        now: Time,
        exec: ReplicaId,
        nonce: RequestId,
        result: &ReplyBody,
        out: &mut Vec<Action>,
    ) {
        let n_exec = self.quorums.n_exec;
        let path = self.read_only.as_ref().expect("read_only_reply_wanted checked").path;
        let q_r = self.read_quorum(path);
        let attempt = self
            .read_only
            .as_mut()
            .filter(|a| a.nonce == nonce && !a.replies.contains_key(&exec))
            .expect("read_only_reply_wanted checked");
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
            self.read_only_pause_us = super::READ_ONLY_PAUSE_INITIAL_US;
            self.start_next(now, out);
            return;
        }
        let unanswered = n_exec - attempt.replies.len();
        if matching + unanswered < q_r {
            // Concurrent writes, or an execution member that lies: either way the next reads
            // would likely pay the extra round trip too, so they take the ordered path for a
            // while, as after a timeout.
            self.stats.bump("read_only_mismatch");
            self.pause_read_only(now);
            self.fall_back(now, out);
        }
    }

    /// The read-only timer expired before a quorum matched: an execution member is probably down
    /// or slow, so the next read-only operations take the ordered path for a while (doubling with
    /// each timeout in a row) instead of each paying the timeout first.
    pub(super) fn read_only_timeout(&mut self, now: Time, out: &mut Vec<Action>) {
        self.stats.bump("read_only_timeout");
        self.pause_read_only(now);
        self.fall_back(now, out);
    }

    /// Read-only operations take the ordered path for the next pause, which doubles.
    fn pause_read_only(&mut self, now: Time) {
        self.read_only_paused_until = now.saturating_add(self.read_only_pause_us);
        self.read_only_pause_us = (self.read_only_pause_us * 2).min(super::READ_ONLY_PAUSE_MAX_US);
    }

    /// Abandons the read-only attempt and sends its operation down the ordered path.
    fn fall_back(&mut self, now: Time, out: &mut Vec<Action>) {
        let attempt = self.read_only.take().expect("a read-only attempt is in progress");
        self.stats.bump("read_only_fallback");
        self.start_ordered(now, attempt.operation, out);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::client::tests::delivered;
    use crate::config::Knobs;
    use crate::ids::{ClientId, Principal};
    use crate::message::{Envelope, SealFor};
    use crate::stage::{Input, Stage};
    use crate::testing::{fixture, Fixture};

    fn reply(f: &Fixture, exec: u32, nonce: u64, result: ReplyBody, read_only: bool) -> Input {
        Input::Message(Arc::new(Envelope::seal(
            &f.replicas[exec as usize],
            &f.quorums,
            Principal::Exec(ReplicaId(exec)),
            Message::Reply {
                request_id: RequestId(nonce),
                result,
                read_only,
                pushes_sent: 0,
            },
            SealFor::One(Principal::Client(ClientId(0))),
        )))
    }

    fn step(c: &mut Client, now: Time, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        c.handle(now, input, &mut out);
        out
    }

    fn invoke_ro(c: &mut Client, now: Time) -> Vec<Action> {
        step(
            c,
            now,
            Input::Invoke {
                operation: Bytes::from_static(b"get"),
                path: ReadPath::ReadOnly,
            },
        )
    }

    fn ordered_request(actions: &[Action]) -> Option<(RequestId, Vec<Principal>)> {
        actions.iter().find_map(|a| match a {
            Action::Send { to, envelope } => match &envelope.message {
                Message::ClientRequest { request_id, .. } => Some((*request_id, to.clone())),
                _ => None,
            },
            _ => None,
        })
    }

    fn client(f: &Fixture) -> Client {
        Client::new(f.config.clone(), ClientId(0), f.clients[0].clone()).unwrap()
    }

    fn full(s: &'static [u8]) -> ReplyBody {
        ReplyBody::Full(Bytes::from_static(s))
    }

    #[test]
    fn read_only_goes_to_every_exec_member_and_needs_all_of_them_to_match() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = client(&f);
        let actions = invoke_ro(&mut c, 0);
        let Action::Send { to, envelope } = &actions[0] else {
            panic!("no send")
        };
        assert_eq!(to.len(), 3, "all n_exec members");
        assert!(matches!(
            envelope.message,
            Message::ReadOnlyRequest {
                request_id: RequestId(1),
                ..
            }
        ));
        for e in 0..3u32 {
            assert!(envelope
                .open(&f.replicas[e as usize], Principal::Exec(ReplicaId(e)), None)
                .is_ok());
        }
        assert!(matches!(actions[1], Action::SetTimer { at: 5_000, .. }));
        // r + 1 = 2 matching full replies are not enough; a digest does not count; an ordered
        // reply with the same number is not a read-only reply.
        assert!(delivered(&step(&mut c, 1, reply(&f, 0, 1, full(b"v"), true))).is_empty());
        assert!(delivered(&step(&mut c, 2, reply(&f, 1, 1, full(b"v"), true))).is_empty());
        assert!(delivered(&step(&mut c, 2, reply(&f, 1, 1, full(b"v"), true))).is_empty());
        assert!(delivered(&step(&mut c, 3, reply(&f, 2, 1, full(b"v"), false))).is_empty());
        let actions = step(&mut c, 4, reply(&f, 2, 1, full(b"v"), true));
        assert_eq!(delivered(&actions), vec![Bytes::from_static(b"v")]);
        assert!(!c.is_busy());
        assert_eq!(c.last_request_id(), RequestId(0), "no ordered id consumed");
        // A late duplicate changes nothing; the next read uses a new nonce.
        assert!(step(&mut c, 5, reply(&f, 0, 1, full(b"v"), true)).is_empty());
        let actions = invoke_ro(&mut c, 6);
        assert!(matches!(&actions[0], Action::Send { envelope, .. }
            if matches!(envelope.message, Message::ReadOnlyRequest { request_id: RequestId(2), .. })));
    }

    fn invoke_serializable(c: &mut Client, now: Time) -> Vec<Action> {
        step(
            c,
            now,
            Input::Invoke {
                operation: Bytes::from_static(b"get"),
                path: ReadPath::Serializable,
            },
        )
    }

    /// A serializable read is accepted on r + 1 = 2 matching answers (one member slow, down or
    /// lying does not matter), and falls back to the ordered path once 2 can no longer match.
    #[test]
    fn a_serializable_read_needs_r_plus_one_matching_answers() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = client(&f);
        let actions = invoke_serializable(&mut c, 0);
        let Action::Send { to, .. } = &actions[0] else {
            panic!("no send")
        };
        assert_eq!(to.len(), 3, "asks every exec member");
        assert!(delivered(&step(&mut c, 1, reply(&f, 0, 1, full(b"lie"), true))).is_empty());
        assert!(delivered(&step(&mut c, 2, reply(&f, 1, 1, full(b"v"), true))).is_empty());
        let actions = step(&mut c, 3, reply(&f, 2, 1, full(b"v"), true));
        assert_eq!(delivered(&actions), vec![Bytes::from_static(b"v")]);
        assert_eq!(c.stats().get("serializable_sent"), 1);
        // Three different answers: 2 cannot match, so it is ordered at once.
        invoke_serializable(&mut c, 10);
        step(&mut c, 11, reply(&f, 0, 2, full(b"a"), true));
        step(&mut c, 12, reply(&f, 1, 2, full(b"b"), true));
        let actions = step(&mut c, 13, reply(&f, 2, 2, full(b"c"), true));
        assert!(delivered(&actions).is_empty());
        assert!(ordered_request(&actions).is_some(), "fell back to the ordered path");
        assert_eq!(c.stats().get("read_only_fallback"), 1);
    }

    #[test]
    fn mismatch_or_digest_falls_back_at_once_and_delivers_exactly_once() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = client(&f);
        invoke_ro(&mut c, 0);
        step(&mut c, 1, reply(&f, 0, 1, full(b"v"), true));
        let actions = step(&mut c, 2, reply(&f, 1, 1, full(b"lie"), true));
        let (id, to) = ordered_request(&actions).expect("fell back to the ordered path");
        assert_eq!(id, RequestId(1));
        assert_eq!(to.len(), f.quorums.client_preferred());
        assert_eq!(c.stats().get("read_only_mismatch"), 1);
        // The remaining read-only reply is stale now; the ordered replies deliver once.
        assert!(step(&mut c, 3, reply(&f, 2, 1, full(b"v"), true)).is_empty());
        assert!(delivered(&step(&mut c, 4, reply(&f, 0, 1, full(b"v"), false))).is_empty());
        assert_eq!(delivered(&step(&mut c, 5, reply(&f, 1, 1, full(b"v"), false))).len(), 1);
        assert!(delivered(&step(&mut c, 6, reply(&f, 2, 1, full(b"v"), false))).is_empty());
        // The mismatch paused the read-only path: the next read is ordered at once.
        let actions = invoke_ro(&mut c, 10);
        assert_eq!(ordered_request(&actions).map(|(id, _)| id), Some(RequestId(2)));
        assert_eq!(c.stats().get("read_only_paused"), 1);
        step(&mut c, 11, reply(&f, 0, 2, full(b"v"), false));
        step(&mut c, 12, reply(&f, 1, 2, full(b"v"), false));
        // After the pause: a digest-only read-only reply is unusable; with q_r = n_exec that is
        // a fallback too.
        let later = crate::client::READ_ONLY_PAUSE_INITIAL_US + 100;
        invoke_ro(&mut c, later);
        let nonce = (2 << 16) + 1;
        let actions = step(
            &mut c,
            later + 1,
            reply(&f, 0, nonce, ReplyBody::Digest(Digest::of(b"v")), true),
        );
        assert_eq!(ordered_request(&actions).map(|(id, _)| id), Some(RequestId(3)));
    }

    /// `input` with its MAC zeroed: a seal that never verifies.
    fn forged(input: Input) -> Input {
        let Input::Message(envelope) = input else {
            unreachable!()
        };
        let mut envelope = (*envelope).clone();
        envelope.seal = crate::message::Seal::Mac(crate::crypto::Mac::default());
        Input::Message(Arc::new(envelope))
    }

    #[test]
    fn duplicate_and_stale_read_only_replies_are_dropped_before_their_mac_is_checked() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = client(&f);
        invoke_ro(&mut c, 0);
        // A forged first reply from member 0 is checked and refused; it does not take 0's vote.
        step(&mut c, 1, forged(reply(&f, 0, 1, full(b"lie"), true)));
        assert_eq!(c.stats().get("dropped_bad_seal"), 1);
        step(&mut c, 2, reply(&f, 0, 1, full(b"v"), true));
        // Member 0 was heard: a second reply from it is dropped unchecked, forged or not.
        step(&mut c, 3, forged(reply(&f, 0, 1, full(b"lie"), true)));
        step(&mut c, 3, reply(&f, 0, 1, full(b"v"), true));
        assert_eq!(c.stats().get("dropped_duplicate_read_only_reply"), 2);
        // Another nonce: stale, unchecked.
        step(&mut c, 4, forged(reply(&f, 1, 7, full(b"v"), true)));
        assert_eq!(c.stats().get("dropped_stale_read_only_reply"), 1);
        assert_eq!(c.stats().get("dropped_bad_seal"), 1);
        step(&mut c, 5, reply(&f, 1, 1, full(b"v"), true));
        let actions = step(&mut c, 6, reply(&f, 2, 1, full(b"v"), true));
        assert_eq!(delivered(&actions), vec![Bytes::from_static(b"v")]);
    }

    fn read_only_sent(actions: &[Action]) -> bool {
        actions.iter().any(|a| {
            matches!(a, Action::Send { envelope, .. } if matches!(envelope.message, Message::ReadOnlyRequest { .. }))
        })
    }

    /// Execution member 2 is down, so no read-only quorum (all three) can form: the first read
    /// pays the timeout, the reads within the pause are ordered at once, the pause doubles with
    /// each timeout in a row, and a read-only success resets it.
    #[test]
    fn a_read_only_timeout_pauses_the_read_only_path_with_doubling() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = client(&f);
        let timeout = Knobs::default().read_only_timeout_us;
        let mut ordered = 0u64;
        // Answers the outstanding ordered request from execution members 0 and 1.
        let mut answer = |c: &mut Client, now: Time| {
            ordered += 1;
            step(c, now, reply(&f, 0, ordered, full(b"v"), false));
            let actions = step(c, now, reply(&f, 1, ordered, full(b"v"), false));
            assert_eq!(delivered(&actions).len(), 1);
        };
        let mut now = 0;
        assert!(read_only_sent(&invoke_ro(&mut c, now)));
        now += timeout;
        let actions = step(&mut c, now, Input::Timer(Timer::ClientRetransmit));
        assert!(ordered_request(&actions).is_some(), "fell back");
        answer(&mut c, now);
        // Within the pause (100 ms): ordered at once.
        now += 50_000;
        let actions = invoke_ro(&mut c, now);
        assert!(!read_only_sent(&actions) && ordered_request(&actions).is_some());
        answer(&mut c, now);
        assert_eq!(c.stats().get("read_only_paused"), 1);
        // After it: read-only again, another timeout, and now a 200 ms pause.
        now += 60_000;
        assert!(read_only_sent(&invoke_ro(&mut c, now)));
        now += timeout;
        step(&mut c, now, Input::Timer(Timer::ClientRetransmit));
        answer(&mut c, now);
        now += 150_000;
        assert!(!read_only_sent(&invoke_ro(&mut c, now)), "still paused at 150 ms");
        answer(&mut c, now);
        now += 60_000;
        // Member 2 is back: the read-only attempt succeeds and the pause is reset to 100 ms.
        assert!(read_only_sent(&invoke_ro(&mut c, now)));
        let nonce = (ordered << 16) + 1;
        for e in 0..3 {
            step(&mut c, now, reply(&f, e, nonce, full(b"v"), true));
        }
        assert_eq!(c.stats().get("read_only_delivered"), 1);
        assert_eq!(c.read_only_pause_us, crate::client::READ_ONLY_PAUSE_INITIAL_US);
        assert_eq!(c.stats().get("read_only_timeout"), 2);
    }

    #[test]
    fn timeout_falls_back_and_the_sabotaged_quorum_accepts_r_plus_one() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = client(&f);
        invoke_ro(&mut c, 0);
        step(&mut c, 1, reply(&f, 0, 1, full(b"v"), true));
        step(&mut c, 2, reply(&f, 1, 1, full(b"v"), true));
        let actions = step(&mut c, 5_000, Input::Timer(Timer::ClientRetransmit));
        assert_eq!(ordered_request(&actions).map(|(id, _)| id), Some(RequestId(1)));
        assert_eq!(c.stats().get("read_only_timeout"), 1);
        assert_eq!(c.stats().get("read_only_fallback"), 1);
        // Later timer expiries are ordinary retransmissions.
        let actions = step(&mut c, 600_000, Input::Timer(Timer::ClientRetransmit));
        assert_eq!(ordered_request(&actions).map(|(_, to)| to.len()), Some(4));

        let weak = fixture(
            1,
            1,
            1,
            Knobs {
                sabotage: Some(Sabotage::WeakReadQuorum),
                ..Knobs::default()
            },
        );
        let mut c = client(&weak);
        invoke_ro(&mut c, 0);
        step(&mut c, 1, reply(&weak, 0, 1, full(b"stale"), true));
        let actions = step(&mut c, 2, reply(&weak, 1, 1, full(b"stale"), true));
        assert_eq!(delivered(&actions), vec![Bytes::from_static(b"stale")]);
    }
}
