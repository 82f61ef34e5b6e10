//! The client's protocol (UpRight thesis 5.1): request ids, preferred quorum then all (the
//! preferred quorum moves on by one member at each retransmission), retransmission with a
//! doubling timeout, and `r + 1` matching replies; plus the read-only path
//! (`read_only`: all execution members at once, fall back to the ordered path).
//!
//! The client is closed-loop: one outstanding request. Operations invoked while one is
//! outstanding wait in a bounded queue ([`CLIENT_QUEUE_MAX`]); further ones are refused with
//! [`Action::Deliver`] never coming (the host checks [`Client::can_invoke`] first).

mod keys;
mod pushes;
mod read_only;
mod reconfig;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;

use crate::config::{ClusterConfig, ConfigError};
use crate::crypto::{Digest, KeyRing};
use crate::ids::{ClientId, Principal, ReplicaId, RequestId};
use crate::message::{Envelope, Message, ReplyBody, SealFor};
use crate::quorum::Quorums;
use crate::stage::{Action, Input, ReadPath, Stage, Stats, Time, Timer};

use pushes::PushInbox;
use read_only::ReadOnlyAttempt;

pub use pushes::PUSH_POLL_US;
pub use read_only::READ_ONLY_NONCES_PER_REQUEST_ID;

pub use crate::limits::CLIENT_QUEUE_MAX;

struct Outstanding {
    request_id: RequestId,
    envelope: Arc<Envelope>,
    sent_at: Time,
    timeout_us: u64,
    /// Latest reply per execution member: result digest and the full body if it sent one (then
    /// the digest is the body's).
    replies: BTreeMap<ReplicaId, (Digest, Option<Bytes>)>,
    /// Latest tentative reply per execution member: result digest, the view and history of the
    /// tentatively executed batch, and the full body if it sent one.
    tentative: BTreeMap<ReplicaId, Tentative>,
    /// Under selective execution: whether it was already retransmitted because two members'
    /// replies differ (see `on_ordered_reply`).
    conflict_retransmitted: bool,
}

/// A TENTATIVE-REPLY as a client holds it.
struct Tentative {
    digest: Digest,
    view: crate::ids::View,
    history: Digest,
    body: Option<Bytes>,
}

/// A client's protocol state machine.
pub struct Client {
    config: Arc<ClusterConfig>,
    quorums: Quorums,
    id: ClientId,
    keys: Arc<KeyRing>,
    last_request_id: RequestId,
    outstanding: Option<Outstanding>,
    /// The read-only attempt in progress (never at the same time as `outstanding`).
    read_only: Option<ReadOnlyAttempt>,
    /// Read-only nonces used since `last_request_id` changed (see [`read_only`]).
    read_only_count: u64,
    queue: VecDeque<(Bytes, ReadPath)>,
    base_timeout_us: u64,
    /// The first authentication member of the preferred quorum: `client mod n_auth` at first,
    /// moved on by one at each retransmission, so a client whose preferred quorum holds a member
    /// that is down (or does not forward) stops waiting for the retransmission timeout on every
    /// request after at most `client_preferred()` of them.
    preferred_start: usize,
    /// Requests still sent to every authentication member at once after a retransmission
    /// (see [`WIDE_AFTER_RETRANSMIT`]).
    wide_remaining: u32,
    /// Read-only operations take the ordered path until then: the last read-only attempt timed
    /// out (an execution member is down or slow, so `q_r = n_exec` matching replies cannot come).
    read_only_paused_until: Time,
    /// The next pause after a read-only timeout: [`READ_ONLY_PAUSE_INITIAL_US`], doubled by each
    /// timeout up to [`READ_ONLY_PAUSE_MAX_US`], back to the initial value when a read-only
    /// attempt succeeds.
    read_only_pause_us: u64,
    /// Pushed messages: acceptance, order, gaps.
    pushes: PushInbox,
    /// Key refresh (`client/keys.rs`).
    key_schedule: crate::session::Schedule,
    key_repair: crate::session::KeyRepair,
    /// The change each authentication member last reported (CONFIGURATION), by digest.
    config_votes: BTreeMap<ReplicaId, Digest>,
    /// The configuration a change told us of and our keys in it (`client/reconfig.rs`), for
    /// CONFIGURATION copies from replicas the change renumbered.
    config_trial: Option<ConfigTrial>,
    stats: Stats,
}

/// After a retransmission, this many of the client's next requests go to every authentication
/// member at once instead of the preferred `n_auth - u`. The order stage needs
/// `matrix_collect` rows, as many as the preferred quorum has members, so one member of it
/// that is down, slow or lying stalls every request until its retransmission timeout; moving
/// the quorum on by one member per retransmission finds the good window only after several
/// timeouts, and loses it again at the next retransmission for any other reason. Sending to
/// all costs `u` more authentication checks per request while it lasts (measured with
/// `upright-sim --attack silence`: docs/SIMULATOR.md).
pub const WIDE_AFTER_RETRANSMIT: u32 = 256;

/// First pause of the read-only path after a read-only timeout.
pub const READ_ONLY_PAUSE_INITIAL_US: u64 = 100_000;
/// Longest pause of the read-only path: with an execution member down, one read in this long
/// pays the read-only timeout before it is ordered.
pub const READ_ONLY_PAUSE_MAX_US: u64 = 10_000_000;

/// The configuration the last change told of made from ours (`client/reconfig.rs`).
struct ConfigTrial {
    digest: Digest,
    config: Arc<ClusterConfig>,
    /// Our keys in it, once a copy from a renumbered replica needed them.
    keys: Option<Arc<crate::crypto::KeyRing>>,
}

impl Client {
    /// This client's id.
    pub fn id(&self) -> ClientId {
        self.id
    }

    /// A new client `id` of `config` with its key ring; its first request id is 1.
    pub fn new(config: Arc<ClusterConfig>, id: ClientId, keys: Arc<KeyRing>) -> Result<Client, ConfigError> {
        Client::resume(config, id, keys, RequestId(0))
    }

    /// A restarted client: request ids continue after `last_request_id`, the last id it used
    /// (UpRight CS3: the client persists it).
    pub fn resume(
        config: Arc<ClusterConfig>,
        id: ClientId,
        keys: Arc<KeyRing>,
        last_request_id: RequestId,
    ) -> Result<Client, ConfigError> {
        let quorums = config.validate()?;
        let base_timeout_us = config.knobs.client_retransmit_initial_us;
        Ok(Client {
            config,
            quorums,
            id,
            keys,
            last_request_id,
            outstanding: None,
            read_only: None,
            read_only_count: 0,
            queue: VecDeque::new(),
            base_timeout_us,
            preferred_start: id.0 as usize % quorums.n_auth,
            wide_remaining: 0,
            read_only_paused_until: 0,
            read_only_pause_us: READ_ONLY_PAUSE_INITIAL_US,
            pushes: PushInbox::default(),
            key_schedule: crate::session::Schedule::default(),
            key_repair: Default::default(),
            config_votes: BTreeMap::new(),
            config_trial: None,
            stats: Stats::default(),
        })
    }

    /// Whether another operation can be queued.
    pub fn can_invoke(&self) -> bool {
        self.queue.len() < CLIENT_QUEUE_MAX
    }

    /// Whether a request is outstanding (ordered or read-only).
    pub fn is_busy(&self) -> bool {
        self.outstanding.is_some() || self.read_only.is_some() || self.pushes.holding()
    }

    /// The last request id used.
    pub fn last_request_id(&self) -> RequestId {
        self.last_request_id
    }

    fn start_next(&mut self, now: Time, out: &mut Vec<Action>) {
        if self.is_busy() {
            return;
        }
        let Some((operation, path)) = self.queue.pop_front() else {
            return;
        };
        if path == ReadPath::ReadOnly && self.config.selective_execution {
            // Under selective execution only an object's maintainers answer a read, so the
            // linearizable quorum (every execution member) never forms: order it at once.
            self.stats.bump("read_only_selective_ordered");
        } else if path.is_read_only() && now < self.read_only_paused_until {
            self.stats.bump("read_only_paused");
        } else if path.is_read_only() && self.start_read_only(now, operation.clone(), path, out) {
            return;
        }
        self.start_ordered(now, operation, out);
    }

    /// Sends `operation` down the ordered path under the next request id.
    fn start_ordered(&mut self, now: Time, operation: Bytes, out: &mut Vec<Action>) {
        let request_id = self.last_request_id.next();
        self.last_request_id = request_id;
        self.read_only_count = 0;
        let signature = self.config.knobs.client_signatures.then(|| {
            self.keys
                .sign(&crate::message::client_request_digest(self.id, request_id, &operation))
        });
        let message = Message::ClientRequest {
            client: self.id,
            request_id,
            operation,
            read_only: false,
            signature,
            config_epoch: self.config.epoch(),
        };
        let envelope = Arc::new(Envelope::seal(
            &self.keys,
            &self.quorums,
            Principal::Client(self.id),
            message,
            SealFor::Stage(crate::ids::StageKind::Auth),
        ));
        // First send: the preferred quorum, n_auth - u members from `preferred_start` (at first
        // c mod n_auth); every member for a while after a retransmission.
        let n = self.quorums.n_auth;
        let start = self.preferred_start;
        // Under Aliph's Quorum every order member executes the request as it arrives from its
        // own authentication member: every one of them gets it at once.
        let quorum = self.config.protocol.speculates();
        let to = if self.wide_remaining > 0 || quorum {
            self.wide_remaining = self.wide_remaining.saturating_sub(1);
            ClusterConfig::auth_members(&self.quorums).collect()
        } else {
            (0..self.quorums.client_preferred())
                .map(|k| Principal::Auth(ReplicaId(((start + k) % n) as u32)))
                .collect()
        };
        out.push(Action::Send {
            to,
            envelope: envelope.clone(),
        });
        let timeout_us = self.base_timeout_us;
        out.push(Action::SetTimer {
            timer: Timer::ClientRetransmit,
            at: now + timeout_us,
        });
        self.outstanding = Some(Outstanding {
            request_id,
            envelope,
            sent_at: now,
            timeout_us,
            replies: BTreeMap::new(),
            tentative: BTreeMap::new(),
            conflict_retransmitted: false,
        });
    }

    fn retransmit(&mut self, now: Time, out: &mut Vec<Action>) {
        let max = self.config.knobs.client_retransmit_max_us;
        if self.outstanding.is_none() {
            return;
        }
        // Maybe our hello and every NEW-KEY since were lost (sent before the connections were
        // up): ask the replicas for their keys again.
        self.hello_again(out);
        let Some(outstanding) = self.outstanding.as_mut() else {
            return;
        };
        self.stats.bump("retransmissions");
        // The preferred quorum did not get this request ordered in time: one of its members may
        // be down, so later requests start at the next member (the n_auth - u window then leaves
        // out another one; after at most n_auth - u moves it leaves out the one that is down).
        self.preferred_start = (self.preferred_start + 1) % self.quorums.n_auth;
        self.wide_remaining = WIDE_AFTER_RETRANSMIT;
        let to = ClusterConfig::auth_members(&self.quorums).collect();
        // Sealed afresh: the keys of the first send may be retired by now (a replica refreshed
        // its keys, or recovered proactively and started a new epoch).
        outstanding.envelope = Arc::new(Envelope::seal(
            &self.keys,
            &self.quorums,
            Principal::Client(self.id),
            outstanding.envelope.message.clone(),
            SealFor::Stage(crate::ids::StageKind::Auth),
        ));
        out.push(Action::Send {
            to,
            envelope: outstanding.envelope.clone(),
        });
        outstanding.timeout_us = (outstanding.timeout_us * 2).min(max);
        out.push(Action::SetTimer {
            timer: Timer::ClientRetransmit,
            at: now + outstanding.timeout_us,
        });
    }

    fn on_message(&mut self, now: Time, envelope: &Envelope, out: &mut Vec<Action>) {
        if matches!(envelope.message, Message::NewKey { .. }) {
            return self.on_new_key(envelope, out);
        }
        if let (Message::Configuration { change }, Principal::Auth(r)) = (&envelope.message, envelope.from) {
            // Under the long-term keys (`Envelope::seal_static`).
            if let Some(voter) = self.renumbered_voter(envelope, change) {
                self.on_configuration(now, voter, change, out);
            } else if (r.0 as usize) < self.quorums.n_auth
                && envelope.open_static(&self.keys, self.config.knobs.sabotage).is_ok()
            {
                self.on_configuration(now, r, change, out);
            } else {
                self.stats.bump("dropped_bad_seal");
            }
            return;
        }
        let exec = match envelope.from {
            Principal::Exec(r) if (r.0 as usize) < self.quorums.n_exec => r,
            _ => {
                self.stats.bump("dropped_wrong_sender");
                return;
            }
        };
        match &envelope.message {
            Message::Reply { .. } | Message::TentativeReply { .. } => self.on_reply(now, exec, envelope, out),
            Message::Push { stream, seq, payload } => {
                if self.sealed_for_me(envelope, out) {
                    self.on_push(now, exec, stream.as_ref(), *seq, payload, out);
                }
            }
            Message::PushGap {
                stream,
                next,
                resume_at,
            } => {
                if self.sealed_for_me(envelope, out) {
                    self.on_push_gap(now, exec, stream.as_ref(), *next, *resume_at, out);
                }
            }
            _ => self.stats.bump("dropped_unexpected_message"),
        }
    }

    /// Sends `message` to every execution member, sealed with an authenticator for that stage
    /// (a read-only request, a PUSH-RESUME).
    fn send_to_exec(&self, message: Message, out: &mut Vec<Action>) {
        let envelope = Envelope::seal(
            &self.keys,
            &self.quorums,
            Principal::Client(self.id),
            message,
            SealFor::Stage(crate::ids::StageKind::Exec),
        );
        out.push(Action::Send {
            to: ClusterConfig::exec_members(&self.quorums).collect(),
            envelope: Arc::new(envelope),
        });
    }

    /// Whether the envelope's seal verifies for this client (a bad one is counted).
    fn sealed_for_me(&mut self, envelope: &Envelope, out: &mut Vec<Action>) -> bool {
        let ok = envelope
            .open(&self.keys, Principal::Client(self.id), self.config.knobs.sabotage)
            .is_ok();
        if !ok {
            self.stats.bump("dropped_bad_seal");
            let me = Principal::Client(self.id);
            self.key_repair
                .after_bad_seal(&self.keys, &self.quorums, me, envelope, out);
        }
        ok
    }

    /// REPLY or TENTATIVE-REPLY (with the view and history of the tentatively executed batch).
    fn on_reply(&mut self, now: Time, exec: ReplicaId, envelope: &Envelope, out: &mut Vec<Action>) {
        let (request_id, result, read_only, pushes_sent, tentative) = match &envelope.message {
            Message::Reply {
                request_id,
                result,
                read_only,
                pushes_sent,
            } => (request_id, result, read_only, pushes_sent, None),
            Message::TentativeReply {
                request_id,
                result,
                view,
                history,
                pushes_sent,
            } => (request_id, result, &false, pushes_sent, Some((*view, *history))),
            _ => unreachable!("dispatched on message kind"),
        };
        // Cheap checks before the MAC: a reply this client would ignore whatever its seal (request
        // already delivered, another request id, a member already heard on the read-only path)
        // costs no MAC check. A reply is still counted only after its MAC verifies.
        if let Err(reason) = self.reply_wanted(exec, *request_id, *read_only) {
            self.stats.bump(reason);
            return;
        }
        if !self.sealed_for_me(envelope, out) {
            return;
        }
        self.pushes_owed(now, *pushes_sent, out);
        if *read_only {
            self.on_read_only_reply(now, exec, *request_id, result, out);
        } else {
            self.on_ordered_reply(now, exec, *request_id, result, tentative, out);
        }
    }

    /// Whether a reply from execution member `exec` for `request_id` could count towards the
    /// request in progress; `Err` names the counter of a reply to drop (seal not checked).
    fn reply_wanted(&self, exec: ReplicaId, request_id: RequestId, read_only: bool) -> Result<(), &'static str> {
        if read_only {
            return self.read_only_reply_wanted(exec, request_id);
        }
        match &self.outstanding {
            Some(outstanding) if outstanding.request_id == request_id => Ok(()),
            _ => Err("dropped_stale_reply"),
        }
    }

    /// An ordered reply (sender, request id and seal already checked): committed, or, with
    /// `tentative` (view and history of the batch), a TENTATIVE-REPLY. Delivered on
    /// `q.reply()` matching committed replies or `q.tentative_reply()` matching tentative ones
    /// (same result digest, view and history), with a full body of that digest from either.
    fn on_ordered_reply(
        &mut self,
        now: Time,
        exec: ReplicaId,
        request_id: RequestId,
        result: &ReplyBody,
        tentative: Option<(crate::ids::View, Digest)>,
        out: &mut Vec<Action>,
    ) {
        let tentative_quorum = if self.config.knobs.sabotage == Some(crate::config::Sabotage::TentativeSmallQuorum) {
            self.quorums.reply()
        } else if self.config.protocol.speculates() {
            self.quorums.speculative_reply()
        } else {
            self.quorums.tentative_reply()
        };
        let outstanding = self
            .outstanding
            .as_mut()
            .filter(|o| o.request_id == request_id)
            .expect("reply_wanted checked the request id");
        let mut bodies = outstanding
            .replies
            .values()
            .filter_map(|(d, b)| Some((*d, b.as_ref()?)))
            .chain(
                outstanding
                    .tentative
                    .values()
                    .filter_map(|t| Some((t.digest, t.body.as_ref()?))),
            );
        // A full body equal to one already held has that one's digest: no hashing.
        let digest = match result {
            ReplyBody::Full(bytes) => bodies
                .find_map(|(d, b)| (b == bytes).then_some(d))
                .unwrap_or_else(|| Digest::of(bytes)),
            ReplyBody::Digest(d) => *d,
        };
        let body = match result {
            ReplyBody::Full(bytes) => Some(bytes.clone()),
            ReplyBody::Digest(_) => None,
        };
        let quorum_met = match tentative {
            None => {
                // Keep a full body we already have from this member if it now sends the same
                // digest.
                let entry = outstanding.replies.entry(exec).or_insert((digest, None));
                if entry.0 != digest {
                    *entry = (digest, body);
                } else if body.is_some() {
                    entry.1 = body;
                }
                let matching = outstanding.replies.values().filter(|(d, _)| *d == digest).count();
                let quorum = if self.config.knobs.sabotage == Some(crate::config::Sabotage::WeakReplyQuorum) {
                    self.quorums.reply().saturating_sub(1).max(1)
                } else {
                    self.quorums.reply()
                };
                matching >= quorum
            }
            Some((view, history)) => {
                let fresh = Tentative {
                    digest,
                    view,
                    history,
                    body: None,
                };
                let entry = outstanding.tentative.entry(exec).or_insert(fresh);
                if (entry.digest, entry.view, entry.history) != (digest, view, history) {
                    *entry = Tentative {
                        digest,
                        view,
                        history,
                        body,
                    };
                } else if body.is_some() {
                    entry.body = body;
                }
                let matching = outstanding
                    .tentative
                    .values()
                    .filter(|t| (t.digest, t.view, t.history) == (digest, view, history))
                    .count();
                matching >= tentative_quorum
            }
        };
        if !quorum_met {
            // Under selective execution only an object's r + 1 maintainers reply: two different
            // results mean one of them lied and no quorum will form until another member runs
            // the request. Retransmitting now (once) makes the others force it, instead of
            // waiting out the retransmission timer.
            let conflict = || {
                let mut digests = outstanding.replies.values().map(|(d, _)| d);
                digests.next().is_some_and(|first| digests.any(|d| d != first))
            };
            if self.config.selective_execution && !outstanding.conflict_retransmitted && conflict() {
                outstanding.conflict_retransmitted = true;
                self.stats.bump("retransmitted_on_conflict");
                self.retransmit(now, out);
            }
            return;
        }
        let full = outstanding
            .replies
            .values()
            .find_map(|(d, b)| if *d == digest { b.clone() } else { None })
            .or_else(|| {
                outstanding
                    .tentative
                    .values()
                    .find_map(|t| if t.digest == digest { t.body.clone() } else { None })
            });
        let Some(full) = full else {
            return;
        };
        if tentative.is_some() {
            self.stats.bump("delivered_tentative");
        }
        let latency = now.saturating_sub(outstanding.sent_at);
        let request_id = outstanding.request_id;
        self.outstanding = None;
        // UpRight: after a response the base timeout is max(initial, last observed latency).
        self.base_timeout_us = self
            .config
            .knobs
            .client_retransmit_initial_us
            .max(latency)
            .min(self.config.knobs.client_retransmit_max_us);
        out.push(Action::CancelTimer {
            timer: Timer::ClientRetransmit,
        });
        if self.config.selective_execution {
            // The result behind the positions of the push streams the request announced.
            match crate::message::unwrap_announced(&full) {
                Some((streams, result)) => return self.deliver_after_pushes(now, request_id, result, streams, out),
                None => self.stats.bump("reply_not_wrapped"),
            }
        }
        out.push(Action::Deliver {
            request_id,
            result: full,
        });
        self.stats.bump("delivered");
        self.start_next(now, out);
    }
}

impl Stage for Client {
    fn principal(&self) -> Principal {
        Principal::Client(self.id)
    }

    fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>) {
        match input {
            Input::Start | Input::Recover => self.start_keys(now, out),
            Input::Invoke { operation, path } => {
                if !self.can_invoke() || operation.len() > self.config.knobs.request_bytes_max {
                    self.stats.bump("invoke_refused");
                    return;
                }
                self.queue.push_back((operation, path));
                self.start_next(now, out);
            }
            // On the read-only path the same timer is the read-only timeout.
            Input::Timer(Timer::ClientRetransmit) if self.read_only.is_some() => self.read_only_timeout(now, out),
            Input::Timer(Timer::ClientRetransmit) => self.retransmit(now, out),
            Input::Timer(Timer::PushResume) => self.push_resume(now, out),
            Input::Timer(Timer::KeyRefresh) => self.key_timer(now, out),
            Input::Timer(_) => {}
            Input::Message(envelope) => self.on_message(now, &envelope, out),
        }
    }

    fn stats(&self) -> &Stats {
        &self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Knobs;
    use crate::testing::{fixture, Fixture};

    fn client(f: &Fixture, id: u32) -> Client {
        Client::new(f.config.clone(), ClientId(id), f.clients[id as usize].clone()).unwrap()
    }

    fn reply(f: &Fixture, exec: u32, to: u32, request_id: u64, result: ReplyBody) -> Arc<Envelope> {
        Arc::new(Envelope::seal(
            &f.replicas[exec as usize],
            &f.quorums,
            Principal::Exec(ReplicaId(exec)),
            Message::Reply {
                request_id: RequestId(request_id),
                result,
                read_only: false,
                pushes_sent: 0,
            },
            SealFor::One(Principal::Client(ClientId(to))),
        ))
    }

    fn tentative_reply(f: &Fixture, exec: u32, request_id: u64, result: ReplyBody, view: u64) -> Arc<Envelope> {
        Arc::new(Envelope::seal(
            &f.replicas[exec as usize],
            &f.quorums,
            Principal::Exec(ReplicaId(exec)),
            Message::TentativeReply {
                request_id: RequestId(request_id),
                result,
                view: crate::ids::View(view),
                history: Digest::of(b"batch"),
                pushes_sent: 0,
            },
            SealFor::One(Principal::Client(ClientId(0))),
        ))
    }

    /// The results delivered by `actions` (also used by `read_only`'s tests).
    pub(super) fn delivered(actions: &[Action]) -> Vec<Bytes> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Deliver { result, .. } => Some(result.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn tentative_replies_deliver_only_on_the_tentative_quorum_of_one_view_and_history() {
        let f = fixture(1, 1, 1, Knobs::default());
        assert_eq!(f.quorums.tentative_reply(), 3);
        let mut c = client(&f, 0);
        step(&mut c, 0, invoke(b"op"));
        let good = Bytes::from_static(b"result");
        let digest = Digest::of(&good);
        // r + 1 = 2 tentative replies are not enough (a committed result would be).
        assert!(delivered(&step(
            &mut c,
            1,
            Input::Message(tentative_reply(&f, 0, 1, ReplyBody::Full(good.clone()), 0))
        ))
        .is_empty());
        assert!(delivered(&step(
            &mut c,
            2,
            Input::Message(tentative_reply(&f, 1, 1, ReplyBody::Digest(digest), 0))
        ))
        .is_empty());
        // A third from another view does not match.
        assert!(delivered(&step(
            &mut c,
            3,
            Input::Message(tentative_reply(&f, 2, 1, ReplyBody::Digest(digest), 1))
        ))
        .is_empty());
        // The same member in the same view completes it.
        let out = step(
            &mut c,
            4,
            Input::Message(tentative_reply(&f, 2, 1, ReplyBody::Digest(digest), 0)),
        );
        assert_eq!(delivered(&out), [good]);
        assert_eq!(c.stats().get("delivered_tentative"), 1);
    }

    #[test]
    fn committed_replies_complete_with_a_body_from_a_tentative_one() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = client(&f, 0);
        step(&mut c, 0, invoke(b"op"));
        let good = Bytes::from_static(b"result");
        let digest = Digest::of(&good);
        // One member's tentative reply carried the body; two committed digests (r + 1) follow
        // while the third member is down.
        step(
            &mut c,
            1,
            Input::Message(tentative_reply(&f, 0, 1, ReplyBody::Full(good.clone()), 0)),
        );
        assert!(delivered(&step(
            &mut c,
            2,
            Input::Message(reply(&f, 1, 0, 1, ReplyBody::Digest(digest)))
        ))
        .is_empty());
        let out = step(&mut c, 3, Input::Message(reply(&f, 0, 0, 1, ReplyBody::Digest(digest))));
        assert_eq!(delivered(&out), [good]);
        assert_eq!(c.stats().get("delivered_tentative"), 0);
    }

    /// Under selective execution two different results from the two members that ran the
    /// request mean no quorum until a third runs it: the client retransmits at once (once),
    /// not after its timer; without selective execution it waits for the third reply.
    #[test]
    fn under_selective_execution_conflicting_replies_make_the_client_retransmit_at_once() {
        for selective in [false, true] {
            let mut f = fixture(1, 1, 3, Knobs::default());
            let mut config = (*f.config).clone();
            config.selective_execution = selective;
            f.config = Arc::new(config);
            let mut c = client(&f, 2);
            step(&mut c, 0, invoke(b"op"));
            let good = Bytes::from_static(b"good");
            let out = step(
                &mut c,
                1,
                Input::Message(reply(&f, 0, 2, 1, ReplyBody::Full(good.clone()))),
            );
            assert!(out.is_empty());
            let lie = ReplyBody::Full(Bytes::from_static(b"lie"));
            let out = step(&mut c, 2, Input::Message(reply(&f, 1, 2, 1, lie.clone())));
            let resent = out
                .iter()
                .any(|a| matches!(a, Action::Send { to, .. } if to.len() == 4));
            assert_eq!(resent, selective, "selective: {selective}");
            assert_eq!(c.stats().get("retransmitted_on_conflict"), u64::from(selective));
            // Once per request.
            let out = step(&mut c, 3, Input::Message(reply(&f, 1, 2, 1, lie)));
            assert!(!out.iter().any(|a| matches!(a, Action::Send { .. })));
            let out = step(
                &mut c,
                4,
                Input::Message(reply(&f, 2, 2, 1, ReplyBody::Full(good.clone()))),
            );
            assert_eq!(delivered(&out), [good]);
        }
    }

    /// Under selective execution a linearizable read goes down the ordered path at once (only
    /// the maintainers of its objects would answer it); a serializable one still tries its
    /// `r + 1` maintainers first.
    #[test]
    fn under_selective_execution_a_linearizable_read_is_ordered_at_once() {
        for (selective, path, ordered) in [
            (false, ReadPath::ReadOnly, false),
            (true, ReadPath::ReadOnly, true),
            (true, ReadPath::Serializable, false),
        ] {
            let mut f = fixture(1, 1, 3, Knobs::default());
            let mut config = (*f.config).clone();
            config.selective_execution = selective;
            f.config = Arc::new(config);
            let mut c = client(&f, 2);
            let out = step(
                &mut c,
                0,
                Input::Invoke {
                    operation: Bytes::from_static(b"get"),
                    path,
                },
            );
            let Some(Action::Send { envelope, .. }) = out.first() else {
                panic!("nothing sent")
            };
            let read_only = matches!(envelope.message, Message::ReadOnlyRequest { .. });
            assert_eq!(!read_only, ordered, "selective {selective}, {path:?}");
            assert_eq!(c.stats().get("read_only_selective_ordered"), u64::from(ordered));
        }
    }

    fn step(c: &mut Client, now: Time, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        c.handle(now, input, &mut out);
        out
    }

    fn invoke(op: &'static [u8]) -> Input {
        Input::Invoke {
            operation: Bytes::from_static(op),
            path: ReadPath::Ordered,
        }
    }

    #[test]
    fn first_send_goes_to_the_preferred_quorum_and_retransmissions_to_all_with_doubling() {
        let f = fixture(1, 1, 3, Knobs::default());
        let mut c = client(&f, 2);
        let actions = step(&mut c, 0, invoke(b"op"));
        let Action::Send { to, envelope } = &actions[0] else {
            panic!("no send")
        };
        // n_auth - u = 3 members starting at 2 mod 4.
        assert_eq!(
            to,
            &vec![
                Principal::Auth(ReplicaId(2)),
                Principal::Auth(ReplicaId(3)),
                Principal::Auth(ReplicaId(0))
            ]
        );
        assert!(matches!(
            envelope.message,
            Message::ClientRequest {
                request_id: RequestId(1),
                ..
            }
        ));
        for a in 0..4u32 {
            assert!(envelope
                .open(&f.replicas[a as usize], Principal::Auth(ReplicaId(a)), None)
                .is_ok());
        }
        assert!(matches!(
            actions[1],
            Action::SetTimer {
                timer: Timer::ClientRetransmit,
                at: 500_000
            }
        ));
        let actions = step(&mut c, 500_000, Input::Timer(Timer::ClientRetransmit));
        let Action::Send { to, .. } = &actions[0] else {
            panic!("no resend")
        };
        assert_eq!(to.len(), 4);
        assert!(matches!(actions[1], Action::SetTimer { at: 1_500_000, .. }));
        let mut now = 1_500_000;
        for _ in 0..5 {
            let actions = step(&mut c, now, Input::Timer(Timer::ClientRetransmit));
            let Action::SetTimer { at, .. } = actions[1] else {
                panic!("no timer")
            };
            assert!(at - now <= 4_000_000, "capped");
            now = at;
        }
    }

    /// Auth(1) is down, and client 0's preferred quorum (3 of 4 members from Auth(0)) holds it:
    /// the request that times out is retransmitted to everyone, the next
    /// [`WIDE_AFTER_RETRANSMIT`] requests go to every member at once (no further retransmission),
    /// and then the preferred quorum, moved on by one, is used again.
    #[test]
    fn after_a_retransmission_requests_go_to_every_member_for_a_while() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = client(&f, 0);
        let auth = |ids: &[u32]| ids.iter().map(|&i| Principal::Auth(ReplicaId(i))).collect::<Vec<_>>();
        let mut now = 0;
        let mut windows = Vec::new();
        for round in 1..=u64::from(WIDE_AFTER_RETRANSMIT) + 2 {
            let actions = step(&mut c, now, invoke(b"op"));
            let Action::Send { to, .. } = &actions[0] else {
                panic!("no send")
            };
            windows.push(to.clone());
            if round == 1 {
                assert!(to.contains(&Principal::Auth(ReplicaId(1))));
                // Auth(1) never forwards it: the client retransmits to everyone.
                now += 500_000;
                let actions = step(&mut c, now, Input::Timer(Timer::ClientRetransmit));
                assert!(matches!(&actions[0], Action::Send { to, .. } if to.len() == 4));
            }
            let body = ReplyBody::Full(Bytes::from_static(b"done"));
            step(&mut c, now, Input::Message(reply(&f, 0, 0, round, body.clone())));
            let actions = step(&mut c, now, Input::Message(reply(&f, 2, 0, round, body)));
            assert!(
                actions.iter().any(|a| matches!(a, Action::Deliver { .. })),
                "round {round} delivered"
            );
            now += 1_000;
        }
        assert_eq!(windows[0], auth(&[0, 1, 2]));
        let wide = WIDE_AFTER_RETRANSMIT as usize;
        assert!(windows[1..=wide].iter().all(|w| *w == auth(&[0, 1, 2, 3])));
        assert_eq!(
            windows[wide + 1],
            auth(&[1, 2, 3]),
            "the preferred quorum moved on by one"
        );
        assert_eq!(c.stats().get("retransmissions"), 1);
    }

    #[test]
    fn delivers_on_r_plus_one_matching_replies_with_a_full_body() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = client(&f, 0);
        step(&mut c, 0, invoke(b"op"));
        step(&mut c, 0, invoke(b"queued"));
        let good = Bytes::from_static(b"result");
        let digest = Digest::of(&good);
        // One full reply is not r + 1 = 2.
        assert!(step(
            &mut c,
            10,
            Input::Message(reply(&f, 0, 0, 1, ReplyBody::Full(good.clone())))
        )
        .is_empty());
        // A different result from another member does not match.
        let wrong = ReplyBody::Full(Bytes::from_static(b"lie"));
        assert!(step(&mut c, 11, Input::Message(reply(&f, 1, 0, 1, wrong))).is_empty());
        // The same member repeating itself is still one vote.
        assert!(step(
            &mut c,
            12,
            Input::Message(reply(&f, 0, 0, 1, ReplyBody::Digest(digest)))
        )
        .is_empty());
        // A matching digest from a second member completes the quorum.
        let actions = step(
            &mut c,
            20,
            Input::Message(reply(&f, 2, 0, 1, ReplyBody::Digest(digest))),
        );
        let delivered: Vec<_> = actions
            .iter()
            .filter_map(|a| match a {
                Action::Deliver { request_id, result } => Some((*request_id, result.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(delivered, vec![(RequestId(1), good)]);
        // The queued operation starts at once as request 2.
        assert!(actions.iter().any(|a| matches!(a, Action::Send { envelope, .. }
            if matches!(envelope.message, Message::ClientRequest { request_id: RequestId(2), .. }))));
    }

    #[test]
    fn digest_only_quorum_waits_for_a_full_body() {
        let f = fixture(1, 0, 1, Knobs::default());
        let mut c = client(&f, 0);
        step(&mut c, 0, invoke(b"op"));
        let body = Bytes::from_static(b"r");
        let d = Digest::of(&body);
        // u = 1, r = 0: one reply suffices, but a digest alone cannot be delivered.
        assert!(step(&mut c, 1, Input::Message(reply(&f, 1, 0, 1, ReplyBody::Digest(d)))).is_empty());
        let actions = step(&mut c, 2, Input::Message(reply(&f, 2, 0, 1, ReplyBody::Full(body))));
        assert!(actions.iter().any(|a| matches!(a, Action::Deliver { .. })));
    }

    #[test]
    fn replies_that_cannot_count_are_dropped_before_their_mac_is_checked() {
        let f = fixture(1, 1, 2, Knobs::default());
        let mut c = client(&f, 0);
        step(&mut c, 0, invoke(b"op"));
        let full = ReplyBody::Full(Bytes::from_static(b"x"));
        // A forged reply for the outstanding request is checked, refused, and not counted.
        step(&mut c, 1, Input::Message(reply(&f, 1, 1, 1, full.clone())));
        assert_eq!(c.stats().get("dropped_bad_seal"), 1);
        assert!(step(&mut c, 2, Input::Message(reply(&f, 0, 0, 1, full.clone()))).is_empty());
        let actions = step(&mut c, 3, Input::Message(reply(&f, 2, 0, 1, full.clone())));
        assert!(actions.iter().any(|a| matches!(a, Action::Deliver { .. })));
        // The third reply after the quorum matched: request done, dropped unchecked.
        assert!(step(&mut c, 4, Input::Message(reply(&f, 1, 0, 1, full.clone()))).is_empty());
        assert_eq!(c.stats().get("dropped_stale_reply"), 1);
        // Forged replies for a finished or a future request are dropped by id, not by MAC.
        step(&mut c, 5, Input::Message(reply(&f, 1, 1, 1, full.clone())));
        step(&mut c, 5, Input::Message(reply(&f, 1, 1, 9, full.clone())));
        assert_eq!(c.stats().get("dropped_stale_reply"), 3);
        assert_eq!(c.stats().get("dropped_bad_seal"), 1, "no MAC checked for them");
        assert_eq!(c.stats().get("delivered"), 1);
    }

    #[test]
    fn forged_stale_and_misrouted_replies_are_dropped() {
        let f = fixture(1, 1, 2, Knobs::default());
        let mut c = client(&f, 0);
        step(&mut c, 0, invoke(b"op"));
        let full = ReplyBody::Full(Bytes::from_static(b"x"));
        // Sealed for client 1, not us.
        step(&mut c, 1, Input::Message(reply(&f, 0, 1, 1, full.clone())));
        step(&mut c, 1, Input::Message(reply(&f, 1, 1, 1, full.clone())));
        assert_eq!(c.stats().get("dropped_bad_seal"), 2);
        // Stale request id.
        step(&mut c, 2, Input::Message(reply(&f, 0, 0, 7, full.clone())));
        assert_eq!(c.stats().get("dropped_stale_reply"), 1);
        // Replica 3 hosts no execution member.
        let mut wrong = (*reply(&f, 0, 0, 1, full.clone())).clone();
        wrong.from = Principal::Exec(ReplicaId(3));
        step(&mut c, 3, Input::Message(Arc::new(wrong)));
        assert_eq!(c.stats().get("dropped_wrong_sender"), 1);
        assert!(c.is_busy());
    }
}
