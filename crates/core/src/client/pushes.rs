//! Pushed messages at the client (PROTOCOL.md "Pushed messages"): a push is accepted once
//! `q.push()` distinct execution members sent the same payload under the same number, and
//! delivered in number order, each once; where pushes are no longer kept, `q.push()` matching
//! PUSH-GAPs deliver an explicit gap instead. A hole (a later push seen, an earlier one missing)
//! makes the client ask for its pushes again (PUSH-RESUME) until it is filled; once it has had a
//! push (or a reply saying pushes were sent to it), it also asks every [`PUSH_POLL_US`], so the
//! last push of a burst, or the first, is not lost for good when its copies were.
//!
//! Under selective execution pushes also come in object streams (docs/ODRC.md, "Per-object push
//! streams"), each numbered on its own: the client follows the streams its replies announced (at
//! most [`PUSH_STREAMS_FOLLOWED_MAX`], forgetting the one idle longest), takes each as above, and
//! lists them in its PUSH-RESUMEs ([`PUSH_STREAMS_MAX`] at a time: those with a hole first, the
//! others in turn).

use std::collections::BTreeMap;

use bytes::Bytes;

use super::Client;
use crate::crypto::Digest;
use crate::ids::{ReplicaId, RequestId};
use crate::limits::{PUSH_HELD_BYTES_MAX, PUSH_STREAMS_FOLLOWED_MAX, PUSH_STREAMS_MAX, PUSH_WINDOW};
use crate::message::Message;
use crate::stage::{Action, Time, Timer};

/// How often a client that has received pushes asks for any it may have missed.
pub const PUSH_POLL_US: u64 = 1_000_000;

/// Streams not (yet) followed whose pushes a client holds for when the reply announcing the
/// stream comes (a write's push can overtake the reply to the watcher's request).
const PENDING_STREAMS_MAX: usize = 8;

/// Pushes held per stream not followed (the lowest numbers seen).
const PENDING_PUSHES_MAX: usize = 4;

/// A reply held for pushes: its request id, result and the stream positions it announced.
type HeldReply = (RequestId, Bytes, Vec<(Bytes, u64)>);

/// Copies of pushes seen: number -> member -> its payload's digest and the payload.
type Candidates = BTreeMap<u64, BTreeMap<ReplicaId, (Digest, Bytes)>>;

/// The payload that `quorum` of the members' copies of one push agree on, if any.
fn accepted(claims: &BTreeMap<ReplicaId, (Digest, Bytes)>, quorum: usize) -> Option<Bytes> {
    claims.values().find_map(|(digest, payload)| {
        let matching = claims.values().filter(|(d, _)| d == digest).count();
        (matching >= quorum).then(|| payload.clone())
    })
}

/// One stream's pushes at the client.
#[derive(Debug)]
struct Stream {
    /// The first push not yet delivered (numbers start at 1).
    next: u64,
    /// Pushes `next .. next + PUSH_WINDOW` seen: number -> member -> its payload's digest and the
    /// payload.
    candidates: Candidates,
    /// PUSH-GAP claims for `next`: member -> the push it says comes next.
    gaps: BTreeMap<ReplicaId, u64>,
    /// When it last delivered or was announced (which stream to forget when too many).
    touched: Time,
}

impl Stream {
    fn starting_at(next: u64, now: Time) -> Stream {
        Stream {
            next,
            candidates: BTreeMap::new(),
            gaps: BTreeMap::new(),
            touched: now,
        }
    }

    /// Whether a push after `next` was seen while `next` is missing, or one was seen without
    /// enough matching copies yet (in an object stream, accepted pushes may wait for the
    /// client's reply: those are no hole).
    fn hole(&self, quorum: usize) -> bool {
        let mut numbers = self.next..;
        let hole = (self.candidates.iter())
            .any(|(&seq, claims)| Some(seq) != numbers.next() || accepted(claims, quorum).is_none());
        hole || !self.gaps.is_empty()
    }
}

/// The client's side of pushed messages.
#[derive(Debug)]
pub(super) struct PushInbox {
    /// The client's own stream.
    own: Stream,
    /// The object streams it follows (selective execution).
    streams: BTreeMap<Bytes, Stream>,
    /// Pushes of object streams it does not follow yet, held for the announcing reply: stream
    /// -> number -> member -> digest and payload (bounded by [`PENDING_STREAMS_MAX`] and
    /// [`PENDING_PUSHES_MAX`]; the oldest stream goes first).
    pending: BTreeMap<Bytes, (Time, Candidates)>,
    /// Whether the client has received any push in its own stream (then it polls).
    active: bool,
    /// When [`Timer::PushResume`] is set to fire, if it is.
    armed: Option<Time>,
    /// An accepted reply held until the pushes before it of the streams it announced are
    /// delivered (or skipped by a gap): request id, result, the announced positions.
    held: Option<HeldReply>,
    /// Bytes put in object streams' candidates since they were last counted exactly (at
    /// least what they hold; counted again when it passes [`PUSH_HELD_BYTES_MAX`]).
    held_bytes: usize,
    /// The last stream the previous PUSH-RESUME listed in turn (the next one starts after it).
    poll_cursor: Option<Bytes>,
}

impl Default for PushInbox {
    fn default() -> PushInbox {
        PushInbox {
            own: Stream::starting_at(1, 0),
            streams: BTreeMap::new(),
            pending: BTreeMap::new(),
            active: false,
            armed: None,
            held: None,
            held_bytes: 0,
            poll_cursor: None,
        }
    }
}

impl PushInbox {
    /// Whether any stream has a hole (`quorum`: matching copies that accept a push).
    fn hole(&self, quorum: usize) -> bool {
        self.own.hole(quorum) || self.streams.values().any(|s| s.hole(quorum))
    }

    /// Whether an object-stream candidate of `len` bytes fits in [`PUSH_HELD_BYTES_MAX`]
    /// (counted exactly again when the running count says it may not); counts it if so.
    fn room_for(&mut self, len: usize) -> bool {
        if self.held_bytes + len > PUSH_HELD_BYTES_MAX {
            self.held_bytes = (self.streams.values())
                .flat_map(|s| s.candidates.values())
                .flat_map(|claims| claims.values())
                .map(|(_, payload)| payload.len())
                .sum();
        }
        let fits = self.held_bytes + len <= PUSH_HELD_BYTES_MAX;
        if fits {
            self.held_bytes += len;
        }
        fits
    }

    /// The object streams one PUSH-RESUME lists, with each one's next push: those with a hole
    /// first, then the others in turn after the last one listed before, at most
    /// [`PUSH_STREAMS_MAX`] in all.
    fn polled_streams(&mut self, quorum: usize) -> Vec<(Bytes, u64)> {
        let mut listed: Vec<(Bytes, u64)> = (self.streams.iter())
            .filter(|(_, s)| s.hole(quorum))
            .take(PUSH_STREAMS_MAX)
            .map(|(name, s)| (name.clone(), s.next))
            .collect();
        let room = PUSH_STREAMS_MAX - listed.len();
        let start = self.poll_cursor.take();
        let after = match &start {
            Some(name) => self
                .streams
                .range::<Bytes, _>((std::ops::Bound::Excluded(name), std::ops::Bound::Unbounded)),
            None => self.streams.range::<Bytes, _>(..),
        };
        let before = match &start {
            Some(name) => self.streams.range::<Bytes, _>(..=name),
            None => self.streams.range::<Bytes, _>(..Bytes::new()),
        };
        let in_turn: Vec<(Bytes, u64)> = after
            .chain(before)
            .filter(|(_, s)| !s.hole(quorum))
            .take(room)
            .map(|(name, s)| (name.clone(), s.next))
            .collect();
        self.poll_cursor = in_turn.last().map(|(name, _)| name.clone()).or(start);
        listed.extend(in_turn);
        listed
    }

    /// The stream a push names, if the client takes it.
    fn stream(&mut self, stream: Option<&Bytes>) -> Option<&mut Stream> {
        match stream {
            None => Some(&mut self.own),
            Some(name) => self.streams.get_mut(name),
        }
    }

    /// Whether a reply is held for pushes before it.
    pub(super) fn holding(&self) -> bool {
        self.held.is_some()
    }

    /// Whether a followed stream among `announced` has not delivered every push before the
    /// announced position.
    fn owed_before(&self, announced: &[(Bytes, u64)]) -> bool {
        (announced.iter()).any(|(name, at)| self.streams.get(name).is_some_and(|s| s.next < *at))
    }

    /// The first push not yet delivered in the client's own stream.
    #[cfg(test)]
    pub(super) fn next(&self) -> u64 {
        self.own.next
    }
}

impl Client {
    /// PUSH from execution member `exec` (sender and seal checked).
    pub(super) fn on_push(
        &mut self,
        now: Time,
        exec: ReplicaId,
        stream: Option<&Bytes>,
        seq: u64,
        payload: &Bytes,
        out: &mut Vec<Action>,
    ) {
        if stream.is_none() {
            self.pushes.active = true;
        }
        let Some(inbox) = self.pushes.stream(stream) else {
            // A stream the client does not follow (yet: the reply announcing it may come
            // after): held, within bounds; what is not is fetched by the poll.
            if let Some(name) = stream {
                self.hold_pending(now, name, exec, seq, payload);
            }
            return self.stats.bump("push_unfollowed_stream");
        };
        if seq < inbox.next {
            self.stats.bump("push_duplicate");
            return;
        }
        if seq >= inbox.next + PUSH_WINDOW {
            self.stats.bump("push_too_far_ahead");
            self.arm_push_resume(now, self.config.knobs.client_retransmit_initial_us, out);
            return;
        }
        let ahead = seq > inbox.next;
        if stream.is_some() && ahead && !self.pushes.room_for(payload.len()) {
            self.stats.bump("push_held_bytes_full");
            self.arm_push_resume(now, self.config.knobs.client_retransmit_initial_us, out);
            return;
        }
        let Some(inbox) = self.pushes.stream(stream) else {
            return;
        };
        inbox
            .candidates
            .entry(seq)
            .or_default()
            .insert(exec, (Digest::of(payload), payload.clone()));
        self.deliver_pushes(now, stream, out);
        self.arm_push_resume(now, self.push_resume_wait(), out);
    }

    /// Holds a push of a stream the client does not follow, for when it does.
    fn hold_pending(&mut self, now: Time, name: &Bytes, exec: ReplicaId, seq: u64, payload: &Bytes) {
        let pending = &mut self.pushes.pending;
        if !pending.contains_key(name) && pending.len() >= PENDING_STREAMS_MAX {
            let oldest = pending.iter().min_by_key(|(_, (at, _))| *at).map(|(n, _)| n.clone());
            if let Some(oldest) = oldest {
                pending.remove(&oldest);
            }
        }
        let (_, held) = pending.entry(name.clone()).or_insert_with(|| (now, BTreeMap::new()));
        held.entry(seq)
            .or_default()
            .insert(exec, (Digest::of(payload), payload.clone()));
        while held.len() > PENDING_PUSHES_MAX {
            held.pop_last();
        }
    }

    /// A reply from an execution member says it has sent this client `sent` pushes: if some are
    /// missing, the client starts asking for its pushes (every copy of a client's first push
    /// may have been lost, and then nothing else would tell it). A lying member costs one
    /// PUSH-RESUME per poll interval.
    pub(super) fn pushes_owed(&mut self, now: Time, sent: u64, out: &mut Vec<Action>) {
        if sent >= self.pushes.own.next && !self.pushes.active {
            self.pushes.active = true;
            self.stats.bump("pushes_owed");
            self.arm_push_resume(now, self.push_resume_wait(), out);
        }
    }

    /// An accepted reply announced these object streams with the number of each one's next
    /// push: the client follows them from there (or, following one already, asks for what it
    /// lacks), and polls for them.
    pub(super) fn follow_streams(&mut self, now: Time, streams: Vec<(Bytes, u64)>, out: &mut Vec<Action>) {
        for (name, next) in streams {
            if let Some(stream) = self.pushes.streams.get_mut(&name) {
                stream.touched = now;
                if next > stream.next {
                    self.stats.bump("stream_pushes_owed");
                    self.arm_push_resume(now, self.config.knobs.client_retransmit_initial_us, out);
                }
                continue;
            }
            if self.pushes.streams.len() >= PUSH_STREAMS_FOLLOWED_MAX {
                // Forget the stream idle longest, preferring one without a hole.
                let quorum = self.push_quorum();
                let victim = (self.pushes.streams.iter())
                    .min_by_key(|(_, s)| (s.hole(quorum), s.touched))
                    .map(|(name, _)| name.clone());
                if let Some(victim) = victim {
                    self.pushes.streams.remove(&victim);
                    self.stats.bump("push_stream_forgotten");
                }
            }
            let mut stream = Stream::starting_at(next.max(1), now);
            if let Some((_, held)) = self.pushes.pending.remove(&name) {
                let window = stream.next..stream.next + PUSH_WINDOW;
                stream.candidates = held.into_iter().filter(|(seq, _)| window.contains(seq)).collect();
            }
            self.pushes.streams.insert(name.clone(), stream);
            self.stats.bump("push_streams_followed");
            self.deliver_pushes(now, Some(&name), out);
        }
        self.arm_push_resume(now, self.push_resume_wait(), out);
    }

    /// PUSH-GAP from execution member `exec` (sender and seal checked).
    pub(super) fn on_push_gap(
        &mut self,
        now: Time,
        exec: ReplicaId,
        stream: Option<&Bytes>,
        next: u64,
        resume_at: u64,
        out: &mut Vec<Action>,
    ) {
        let quorum = self.push_quorum();
        let Some(inbox) = self.pushes.stream(stream) else {
            return self.stats.bump("push_unfollowed_stream");
        };
        if next != inbox.next || resume_at <= next {
            self.stats.bump("push_gap_stale");
            return;
        }
        inbox.gaps.insert(exec, resume_at);
        let matching = inbox.gaps.values().filter(|&&r| r == resume_at).count();
        if matching < quorum {
            return;
        }
        out.push(Action::PushGap {
            stream: stream.cloned(),
            missed_from: next,
            resume_at,
        });
        self.stats.bump("push_gaps_delivered");
        inbox.next = resume_at;
        inbox.gaps.clear();
        inbox.candidates.retain(|&seq, _| seq >= resume_at);
        self.deliver_pushes(now, stream, out);
    }

    /// Matching copies that make a push (or a gap) accepted: `q.push()`, or one when sabotaged.
    fn push_quorum(&self) -> usize {
        if self.config.knobs.sabotage == Some(crate::config::Sabotage::WeakPushQuorum) {
            1
        } else {
            self.quorums.push()
        }
    }

    /// The first push of object stream `name` that may not be delivered yet, if any: a push
    /// may come after the reply to the request in progress (the reply announces where the
    /// stream stood when the request ran), so while a request waits for its reply no object
    /// stream's push is delivered, and while an accepted reply is held, only the pushes before
    /// the positions it announced.
    fn stream_limit(&self, name: &Bytes) -> Option<u64> {
        if let Some((_, _, announced)) = &self.pushes.held {
            let at = announced.iter().find(|(n, _)| n == name).map(|(_, at)| *at);
            return Some(at.unwrap_or(0));
        }
        (self.outstanding.is_some() || self.read_only.is_some()).then_some(0)
    }

    /// Delivers every accepted push of `stream` from its `next` on, in order (for an object
    /// stream, up to its [`Client::stream_limit`]).
    fn deliver_pushes(&mut self, now: Time, stream: Option<&Bytes>, out: &mut Vec<Action>) {
        let quorum = self.push_quorum();
        let limit = stream.and_then(|name| self.stream_limit(name)).unwrap_or(u64::MAX);
        let Some(inbox) = self.pushes.stream(stream) else {
            return;
        };
        while let Some(claims) = inbox.candidates.get(&inbox.next).filter(|_| inbox.next < limit) {
            let Some(payload) = accepted(claims, quorum) else { break };
            inbox.candidates.remove(&inbox.next);
            inbox.gaps.clear();
            inbox.touched = now;
            out.push(Action::DeliverPush {
                stream: stream.cloned(),
                seq: inbox.next,
                payload,
            });
            self.stats.bump("pushes_delivered");
            inbox.next += 1;
        }
        if stream.is_some() {
            self.release_held(now, out);
        }
    }

    /// Delivers an accepted reply whose request announced `streams` (selective execution): if a
    /// stream the client already follows has not yet delivered every push before the announced
    /// position, the reply is held until it has (a watcher sees a key's or node's event before
    /// data that came after it) and nothing else starts; the client follows the streams once
    /// the reply is delivered ([`Client::finish_reply`]).
    pub(super) fn deliver_after_pushes(
        &mut self,
        now: Time,
        request_id: RequestId,
        result: Bytes,
        streams: Vec<(Bytes, u64)>,
        out: &mut Vec<Action>,
    ) {
        let owed = self.pushes.owed_before(&streams);
        if owed && self.config.knobs.sabotage != Some(crate::config::Sabotage::UnheldReplies) {
            self.stats.bump("reply_held_for_pushes");
            self.pushes.held = Some((request_id, result, streams.clone()));
            // The pushes it waits for may be here already, waiting for it.
            for (name, _) in &streams {
                self.deliver_pushes(now, Some(name), out);
            }
            if self.pushes.held.is_some() {
                self.arm_push_resume(now, self.config.knobs.client_retransmit_initial_us, out);
            }
            return;
        }
        self.finish_reply(now, request_id, result, streams, out);
    }

    /// Delivers a reply whose announced pushes before it have come, then the object streams'
    /// pushes that waited for it, then starts the next request.
    fn finish_reply(
        &mut self,
        now: Time,
        request_id: RequestId,
        result: Bytes,
        streams: Vec<(Bytes, u64)>,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::Deliver { request_id, result });
        self.stats.bump("delivered");
        if !streams.is_empty() {
            self.follow_streams(now, streams, out);
        }
        let followed: Vec<Bytes> = self.pushes.streams.keys().cloned().collect();
        for name in followed {
            self.deliver_pushes(now, Some(&name), out);
        }
        self.start_next(now, out);
    }

    /// Delivers the held reply once the pushes it waits for are delivered.
    fn release_held(&mut self, now: Time, out: &mut Vec<Action>) {
        let ready = (self.pushes.held.as_ref()).is_some_and(|(_, _, streams)| !self.pushes.owed_before(streams));
        if !ready {
            return;
        }
        let (request_id, result, streams) = self.pushes.held.take().expect("checked");
        self.finish_reply(now, request_id, result, streams, out);
    }

    /// How long until the next PUSH-RESUME: a retransmission interval while a hole is known,
    /// otherwise the poll interval.
    fn push_resume_wait(&self) -> u64 {
        if self.pushes.hole(self.push_quorum()) {
            self.config.knobs.client_retransmit_initial_us
        } else {
            PUSH_POLL_US
        }
    }

    fn arm_push_resume(&mut self, now: Time, wait_us: u64, out: &mut Vec<Action>) {
        // An earlier deadline replaces a later one: a hole found while the timer waits out the
        // poll interval is asked about after a retransmission interval, not the poll's rest.
        let at = now + wait_us;
        if self.pushes.armed.is_none_or(|armed| at < armed) {
            self.pushes.armed = Some(at);
            out.push(Action::SetTimer {
                timer: Timer::PushResume,
                at,
            });
        }
    }

    /// [`Timer::PushResume`]: ask every execution member for the pushes from `next` on, in the
    /// client's own stream and in each object stream it follows.
    pub(super) fn push_resume(&mut self, now: Time, out: &mut Vec<Action>) {
        self.pushes.armed = None;
        if !self.pushes.active && self.pushes.streams.is_empty() {
            return;
        }
        let quorum = self.push_quorum();
        let message = Message::PushResume {
            client: self.id,
            next: self.pushes.own.next,
            streams: self.pushes.polled_streams(quorum),
        };
        self.send_to_exec(message, out);
        self.stats.bump("push_resumes_sent");
        self.arm_push_resume(now, self.push_resume_wait(), out);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::Knobs;
    use crate::ids::ClientId;
    use crate::ids::Principal;
    use crate::message::{Envelope, SealFor};
    use crate::stage::{Input, Stage};
    use crate::testing::{fixture, Fixture};

    /// `message` from `from` (a member of replica `replica`), sealed for client 0.
    fn sealed(f: &Fixture, replica: u32, from: Principal, message: Message) -> Envelope {
        let to = Principal::Client(ClientId(0));
        Envelope::seal(
            &f.replicas[replica as usize],
            &f.quorums,
            from,
            message,
            SealFor::One(to),
        )
    }

    fn from_exec(f: &Fixture, exec: u32, message: Message) -> Input {
        Input::Message(Arc::new(sealed(f, exec, Principal::Exec(ReplicaId(exec)), message)))
    }

    fn push(f: &Fixture, exec: u32, seq: u64, payload: &'static str) -> Input {
        let payload = Bytes::from_static(payload.as_bytes());
        from_exec(
            f,
            exec,
            Message::Push {
                stream: None,
                seq,
                payload,
            },
        )
    }

    fn delivered(out: &[Action]) -> Vec<(u64, Bytes)> {
        out.iter()
            .filter_map(|a| match a {
                Action::DeliverPush {
                    stream: None,
                    seq,
                    payload,
                } => Some((*seq, payload.clone())),
                _ => None,
            })
            .collect()
    }

    /// The pushes delivered in `out`: stream, number, payload.
    fn delivered_on_streams(out: &[Action]) -> Vec<(Option<Bytes>, u64, Bytes)> {
        out.iter()
            .filter_map(|a| match a {
                Action::DeliverPush { stream, seq, payload } => Some((stream.clone(), *seq, payload.clone())),
                _ => None,
            })
            .collect()
    }

    fn step(c: &mut Client, input: Input) -> Vec<Action> {
        let mut out = Vec::new();
        c.handle(0, input, &mut out);
        out
    }

    fn setup() -> (Fixture, Client) {
        let f = fixture(1, 1, 1, Knobs::default());
        let c = Client::new(f.config.clone(), ClientId(0), f.clients[0].clone()).unwrap();
        (f, c)
    }

    #[test]
    fn a_push_is_delivered_on_r_plus_one_matching_copies_once_and_in_order() {
        let (f, mut c) = setup();
        assert!(delivered(&step(&mut c, push(&f, 0, 2, "b"))).is_empty());
        assert!(
            delivered(&step(&mut c, push(&f, 1, 1, "forged"))).is_empty(),
            "one copy is not enough"
        );
        assert!(
            delivered(&step(&mut c, push(&f, 0, 1, "a"))).is_empty(),
            "two members, two payloads"
        );
        // The second copy of "a" accepts push 1, and push 2 waits for its own second copy.
        assert_eq!(
            delivered(&step(&mut c, push(&f, 2, 1, "a"))),
            vec![(1, Bytes::from("a"))]
        );
        assert_eq!(
            delivered(&step(&mut c, push(&f, 1, 2, "b"))),
            vec![(2, Bytes::from("b"))]
        );
        assert!(
            delivered(&step(&mut c, push(&f, 2, 2, "b"))).is_empty(),
            "delivered once"
        );
        assert!(delivered(&step(&mut c, push(&f, 2, 1, "a"))).is_empty());
        assert_eq!(c.stats().get("push_duplicate"), 2);
    }

    #[test]
    fn a_forged_push_from_someone_else_or_with_a_bad_seal_is_dropped() {
        let (f, mut c) = setup();
        let x = || Message::Push {
            stream: None,
            seq: 1,
            payload: Bytes::from("x"),
        };
        let mut forged = sealed(&f, 0, Principal::Exec(ReplicaId(0)), x());
        forged.from = Principal::Exec(ReplicaId(1));
        step(&mut c, Input::Message(Arc::new(forged)));
        step(&mut c, push(&f, 0, 1, "x"));
        assert_eq!(c.stats().get("dropped_bad_seal"), 1);
        let order = sealed(&f, 3, Principal::Order(ReplicaId(3)), x());
        assert!(delivered(&step(&mut c, Input::Message(Arc::new(order)))).is_empty());
        assert_eq!(c.stats().get("dropped_wrong_sender"), 1);
    }

    #[test]
    fn a_hole_asks_again_and_matching_gaps_skip_it() {
        let (f, mut c) = setup();
        let out = step(&mut c, push(&f, 0, 5, "e"));
        assert!(out.iter().any(|a| matches!(
            a,
            Action::SetTimer {
                timer: Timer::PushResume,
                ..
            }
        )));
        let out = step(&mut c, Input::Timer(Timer::PushResume));
        let resume = out
            .iter()
            .find_map(|a| match a {
                Action::Send { to, envelope } => Some((to.clone(), envelope.message.clone())),
                _ => None,
            })
            .expect("PUSH-RESUME sent");
        assert_eq!(resume.0.len(), f.quorums.n_exec);
        assert_eq!(
            resume.1,
            Message::PushResume {
                client: ClientId(0),
                next: 1,
                streams: Vec::new(),
            }
        );
        // One member's gap claim is not enough; a stale one (not for `next`) counts for nothing.
        let gap = |exec, next, resume_at| {
            let stream = None;
            from_exec(
                &f,
                exec,
                Message::PushGap {
                    stream,
                    next,
                    resume_at,
                },
            )
        };
        assert!(step(&mut c, gap(0, 1, 5)).is_empty());
        step(&mut c, gap(1, 2, 5));
        assert_eq!(c.stats().get("push_gap_stale"), 1);
        let out = step(&mut c, gap(2, 1, 5));
        assert!(matches!(
            out[0],
            Action::PushGap {
                stream: None,
                missed_from: 1,
                resume_at: 5
            }
        ));
        step(&mut c, push(&f, 1, 5, "e"));
        assert_eq!(c.pushes.next(), 6, "push 5 delivered after the gap");
    }

    #[test]
    fn a_reply_saying_pushes_were_sent_makes_a_client_that_had_none_ask_for_them() {
        let (f, mut c) = setup();
        let invoke = Input::Invoke {
            operation: Bytes::from_static(b"op"),
            path: crate::stage::ReadPath::Ordered,
        };
        step(&mut c, invoke);
        let reply = |exec, pushes_sent| {
            let message = Message::Reply {
                request_id: crate::ids::RequestId(1),
                result: crate::message::ReplyBody::Full(Bytes::from_static(b"ok")),
                read_only: false,
                pushes_sent,
            };
            from_exec(&f, exec, message)
        };
        let armed = |out: &[Action]| {
            out.iter().any(|a| {
                matches!(
                    a,
                    Action::SetTimer {
                        timer: Timer::PushResume,
                        ..
                    }
                )
            })
        };
        assert!(!armed(&step(&mut c, reply(0, 0))), "no push owed");
        // Every copy of push 1 was lost; the reply says it was sent.
        assert!(armed(&step(&mut c, reply(1, 1))));
        assert_eq!(c.stats().get("pushes_owed"), 1);
        let out = step(&mut c, Input::Timer(Timer::PushResume));
        let asked = out.iter().any(|a| match a {
            Action::Send { envelope, .. } => {
                envelope.message
                    == Message::PushResume {
                        client: ClientId(0),
                        next: 1,
                        streams: Vec::new(),
                    }
            }
            _ => false,
        });
        assert!(asked, "PUSH-RESUME from 1 sent");
    }

    /// The resume timer waits out the poll interval while nothing is missing; a hole found
    /// meanwhile brings it forward to a retransmission interval (session 37: a client whose
    /// every copy of one push was lost heard of the hole from the next push, and then waited
    /// out the rest of the poll interval, past the simulator's progress bound).
    #[test]
    fn a_hole_brings_the_resume_timer_forward() {
        let (f, mut c) = setup();
        let at = |out: &[Action]| {
            out.iter().find_map(|a| match a {
                Action::SetTimer {
                    timer: Timer::PushResume,
                    at,
                } => Some(*at),
                _ => None,
            })
        };
        step(&mut c, push(&f, 0, 1, "one"));
        step(&mut c, push(&f, 1, 1, "one"));
        let polling = at(&step(&mut c, Input::Timer(Timer::PushResume)));
        assert_eq!(polling, Some(PUSH_POLL_US), "nothing missing: polling");
        // Push 2 is lost; push 3 arrives: a hole.
        let sooner = at(&step(&mut c, push(&f, 0, 3, "three")));
        assert_eq!(sooner, Some(f.config.knobs.client_retransmit_initial_us));
        // A later deadline does not replace it.
        assert_eq!(at(&step(&mut c, push(&f, 1, 3, "three"))), None);
    }

    fn stream_push(f: &Fixture, exec: u32, stream: &'static str, seq: u64, payload: &'static str) -> Input {
        let message = Message::Push {
            stream: Some(Bytes::from_static(stream.as_bytes())),
            seq,
            payload: Bytes::from_static(payload.as_bytes()),
        };
        from_exec(f, exec, message)
    }

    fn resume_sent(out: &[Action]) -> Option<Message> {
        out.iter().find_map(|a| match a {
            Action::Send { envelope, .. } if matches!(envelope.message, Message::PushResume { .. }) => {
                Some(envelope.message.clone())
            }
            _ => None,
        })
    }

    /// Selective execution: a reply announcing a key's stream (wrapped in the result, taken on
    /// the reply's matching copies) makes the client follow it from the announced number: it
    /// takes that stream's pushes on `r + 1` matching copies, in the stream's own order, drops
    /// pushes of streams it does not follow, and lists the stream in its PUSH-RESUMEs.
    #[test]
    fn a_reply_announcing_a_stream_makes_the_client_follow_it() {
        let (f, _) = setup();
        let mut config = (*f.config).clone();
        config.selective_execution = true;
        let mut c = Client::new(Arc::new(config), ClientId(0), f.clients[0].clone()).unwrap();
        step(
            &mut c,
            Input::Invoke {
                operation: Bytes::from_static(b"get k"),
                path: crate::stage::ReadPath::Ordered,
            },
        );
        let announced = crate::message::wrap_announced(&Bytes::from_static(b"ok"), &[(Bytes::from_static(b"k"), 3)]);
        let reply = |exec| {
            let message = Message::Reply {
                request_id: crate::ids::RequestId(1),
                result: crate::message::ReplyBody::Full(announced.clone()),
                read_only: false,
                pushes_sent: 0,
            };
            from_exec(&f, exec, message)
        };
        step(&mut c, reply(0));
        let out = step(&mut c, reply(1));
        let result = out.iter().find_map(|a| match a {
            Action::Deliver { result, .. } => Some(result.clone()),
            _ => None,
        });
        assert_eq!(result, Some(Bytes::from_static(b"ok")), "the service's result");
        assert_eq!(c.stats().get("push_streams_followed"), 1);
        // Push 3 of the stream is the first it takes; one copy is not enough.
        let in_stream = |out: &[Action]| -> Vec<(Option<Bytes>, u64)> {
            let delivered = out.iter().filter_map(|a| match a {
                Action::DeliverPush { stream, seq, .. } => Some((stream.clone(), *seq)),
                _ => None,
            });
            delivered.collect()
        };
        assert!(in_stream(&step(&mut c, stream_push(&f, 0, "k", 3, "e3"))).is_empty());
        assert_eq!(
            in_stream(&step(&mut c, stream_push(&f, 1, "k", 3, "e3"))),
            vec![(Some(Bytes::from_static(b"k")), 3)]
        );
        // Another stream's push, and the client's own stream, are apart.
        step(&mut c, stream_push(&f, 0, "other", 1, "x"));
        assert_eq!(c.stats().get("push_unfollowed_stream"), 1);
        assert_eq!(c.pushes.next(), 1, "the client's own stream is untouched");
        let out = step(&mut c, Input::Timer(Timer::PushResume));
        assert_eq!(
            resume_sent(&out),
            Some(Message::PushResume {
                client: ClientId(0),
                next: 1,
                streams: vec![(Bytes::from_static(b"k"), 4)],
            })
        );
    }

    /// A client follows at most `PUSH_STREAMS_FOLLOWED_MAX` streams: past it, it forgets the one
    /// idle longest (one without a hole first). A PUSH-RESUME lists `PUSH_STREAMS_MAX` of them:
    /// those with a hole first, the others in turn, so successive polls go through them all.
    #[test]
    fn a_client_follows_a_bounded_number_of_streams_and_polls_them_in_turn() {
        let (f, mut c) = setup();
        let mut out = Vec::new();
        let name = |i: u64| Bytes::from(format!("s{i:05}"));
        for i in 0..PUSH_STREAMS_FOLLOWED_MAX as u64 + 3 {
            c.follow_streams(i, vec![(name(i), 1)], &mut out);
        }
        assert_eq!(c.pushes.streams.len(), PUSH_STREAMS_FOLLOWED_MAX);
        assert_eq!(c.stats().get("push_stream_forgotten"), 3);
        assert!(!c.pushes.streams.contains_key(&name(0)), "the oldest went first");
        // A hole in the last stream: push 2 without push 1.
        let last = format!("s{:05}", PUSH_STREAMS_FOLLOWED_MAX + 2);
        let last: &'static str = Box::leak(last.into_boxed_str());
        step(&mut c, stream_push(&f, 0, last, 2, "two"));
        let mut polled = std::collections::BTreeSet::new();
        // One stream with a hole and the others in turn: every stream within this many polls.
        let polls = (PUSH_STREAMS_FOLLOWED_MAX - 1).div_ceil(PUSH_STREAMS_MAX - 1);
        for poll in 0..polls {
            let Some(Message::PushResume { streams, .. }) = resume_sent(&step(&mut c, Input::Timer(Timer::PushResume)))
            else {
                panic!("a PUSH-RESUME");
            };
            assert_eq!(streams.len(), PUSH_STREAMS_MAX, "poll {poll}");
            assert_eq!(
                streams[0],
                (Bytes::from(last), 1),
                "the stream with a hole first, poll {poll}"
            );
            polled.extend(streams.into_iter().map(|(name, _)| name));
        }
        assert_eq!(
            polled.len(),
            PUSH_STREAMS_FOLLOWED_MAX,
            "every followed stream asked about"
        );
    }

    /// Copies of pushes ahead of their stream's next one are held within `PUSH_HELD_BYTES_MAX`
    /// (a liar's far-ahead copies on every followed stream); past it they are dropped and the
    /// client asks again, while copies of a stream's next push are always taken.
    #[test]
    fn pushes_held_ahead_of_their_streams_are_bounded_in_bytes() {
        let (f, mut c) = setup();
        let mut out = Vec::new();
        let big: &'static str = Box::leak("x".repeat(crate::limits::PUSH_BYTES_MAX).into_boxed_str());
        let streams = PUSH_HELD_BYTES_MAX / crate::limits::PUSH_BYTES_MAX + 2;
        let names: Vec<&'static str> = (0..streams)
            .map(|i| &*Box::leak(format!("k{i:04}").into_boxed_str()))
            .collect();
        for (i, name) in names.iter().enumerate() {
            c.follow_streams(i as u64, vec![(Bytes::from(*name), 1)], &mut out);
            step(&mut c, stream_push(&f, 2, name, 2, big));
        }
        assert_eq!(c.stats().get("push_held_bytes_full"), 2, "{:?}", c.stats());
        // The next push of a stream is still taken and delivered on matching copies.
        let last = names[streams - 1];
        step(&mut c, stream_push(&f, 0, last, 1, "one"));
        let out = step(&mut c, stream_push(&f, 1, last, 1, "one"));
        let delivered = delivered_on_streams(&out);
        assert_eq!(
            delivered,
            vec![(Some(Bytes::from(last)), 1, Bytes::from_static(b"one"))]
        );
    }

    /// A push that overtakes the reply announcing its stream is held, and delivered as soon as
    /// the client follows the stream (not a poll later); what is below the announced number is
    /// not.
    #[test]
    fn a_push_before_its_streams_announcement_is_held_for_it() {
        let (f, mut c) = setup();
        step(&mut c, stream_push(&f, 0, "k", 2, "old"));
        step(&mut c, stream_push(&f, 0, "k", 3, "e3"));
        step(&mut c, stream_push(&f, 1, "k", 3, "e3"));
        assert_eq!(c.stats().get("push_unfollowed_stream"), 3);
        let mut out = Vec::new();
        c.follow_streams(5, vec![(Bytes::from_static(b"k"), 3)], &mut out);
        let delivered = delivered_on_streams(&out);
        assert_eq!(
            delivered,
            vec![(Some(Bytes::from_static(b"k")), 3, Bytes::from_static(b"e3"))]
        );
    }

    /// The order of a stream's pushes and the replies that announce it: a push that comes
    /// while a request waits for its reply is not delivered yet; the reply then says where the
    /// stream stood when the request ran. A push before that position is delivered before the
    /// reply (the reply is held for it), one at or after it after the reply.
    #[test]
    fn a_reply_comes_after_the_pushes_before_it_and_before_those_after_it() {
        let (f, _) = setup();
        let mut config = (*f.config).clone();
        config.selective_execution = true;
        let mut c = Client::new(Arc::new(config), ClientId(0), f.clients[0].clone()).unwrap();
        let mut out = Vec::new();
        c.follow_streams(0, vec![(Bytes::from_static(b"k"), 1)], &mut out);
        // Request 1 is in flight when push 1 and push 2 of the stream come.
        let invoke = || Input::Invoke {
            operation: Bytes::from_static(b"get k"),
            path: crate::stage::ReadPath::Ordered,
        };
        step(&mut c, invoke());
        for exec in [0, 1] {
            let out = step(&mut c, stream_push(&f, exec, "k", 1, "e1"));
            assert!(
                !out.iter().any(|a| matches!(a, Action::DeliverPush { .. })),
                "request in flight"
            );
            step(&mut c, stream_push(&f, exec, "k", 2, "e2"));
        }
        // Its reply says the stream stood at 2 when it ran: push 1 first, then the reply, then
        // push 2.
        let reply = |exec, request, at| {
            let announced =
                crate::message::wrap_announced(&Bytes::from_static(b"ok"), &[(Bytes::from_static(b"k"), at)]);
            let message = Message::Reply {
                request_id: crate::ids::RequestId(request),
                result: crate::message::ReplyBody::Full(announced),
                read_only: false,
                pushes_sent: 0,
            };
            from_exec(&f, exec, message)
        };
        step(&mut c, reply(0, 1, 2));
        let out = step(&mut c, reply(1, 1, 2));
        let order: Vec<String> = out
            .iter()
            .filter_map(|a| match a {
                Action::DeliverPush { seq, .. } => Some(format!("push {seq}")),
                Action::Deliver { .. } => Some("reply".to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(order, vec!["push 1", "reply", "push 2"]);
        assert_eq!(c.stats().get("reply_held_for_pushes"), 1);
    }
}
