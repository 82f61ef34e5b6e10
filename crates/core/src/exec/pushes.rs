//! Pushed messages at an execution member (PROTOCOL.md "Pushed messages"): numbering per client,
//! the pushes kept for clients that missed some, and the answer to PUSH-RESUME.
//!
//! Every correct member numbers a client's pushes the same way (they come out of the agreed
//! execution in order), so a push is identified by `(client, seq)` and a client accepts it on
//! `q.push()` matching copies. The log is part of the execution checkpoint, so a member that
//! loads a checkpoint numbers on from where the others were.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::ExecStage;
use crate::ids::{ClientId, Principal};
use crate::limits::{
    PUSHES_KEPT_PER_CLIENT, PUSHES_KEPT_PER_STREAM, PUSHES_RESENT_MAX, PUSH_BYTES_MAX, PUSH_STREAM_NAME_MAX,
};
use crate::message::{Message, PushStream, SealFor};
use crate::service::Push;
use crate::stage::{Action, Event};

/// One client's pushes in one stream: the next number, and the newest pushes kept.
pub type ClientPushes = PushStream;

/// What an execution member answers to PUSH-RESUME from `next`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resume {
    /// The kept pushes from `next` on (at most [`PUSHES_RESENT_MAX`]).
    Pushes(Vec<(u64, Bytes)>),
    /// Pushes from `next` are no longer kept; the oldest kept (or the next to come) is this one.
    Gap(u64),
    /// Nothing emitted from `next` on yet.
    Nothing,
}

/// Numbers and keeps a push in `stream` (keeping at most `kept_max`); returns its number.
fn emit_in(stream: &mut PushStream, payload: Bytes, kept_max: usize) -> u64 {
    let seq = stream.next_seq.max(1);
    stream.next_seq = seq + 1;
    if stream.kept.len() >= kept_max {
        stream.kept.pop_front();
    }
    stream.kept.push_back((seq, payload));
    seq
}

/// The answer to PUSH-RESUME from `next` in `stream`.
fn resume_in(stream: Option<&PushStream>, next: u64) -> Resume {
    let Some(pushes) = stream else {
        return Resume::Nothing;
    };
    if next >= pushes.next_seq {
        return Resume::Nothing;
    }
    match pushes.kept.front() {
        Some(&(oldest, _)) if next >= oldest => Resume::Pushes(
            pushes
                .kept
                .iter()
                .filter(|(seq, _)| *seq >= next)
                .take(PUSHES_RESENT_MAX)
                .cloned()
                .collect(),
        ),
        Some(&(oldest, _)) => Resume::Gap(oldest),
        None => Resume::Gap(pushes.next_seq),
    }
}

/// Every configured client's pushes: its own stream (every push without selective execution, a
/// global request's under it), sorted by client, and under selective execution the object
/// streams (docs/ODRC.md, "Per-object push streams"), sorted by object and client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushLog {
    clients: BTreeMap<ClientId, PushStream>,
    objects: BTreeMap<Bytes, BTreeMap<ClientId, PushStream>>,
}

/// The object streams as checkpointed and carried in OBJECT-CP: per object, per client.
pub type ObjectStreams = Vec<(Bytes, Vec<(ClientId, PushStream)>)>;

impl PushLog {
    /// Numbers and keeps a push in the client's own stream; returns its number.
    pub fn emit(&mut self, client: ClientId, payload: Bytes) -> u64 {
        emit_in(self.clients.entry(client).or_default(), payload, PUSHES_KEPT_PER_CLIENT)
    }

    /// Numbers and keeps a push in the client's stream on `object`; returns its number.
    pub fn emit_on(&mut self, object: &Bytes, client: ClientId, payload: Bytes) -> u64 {
        let streams = self.objects.entry(object.clone()).or_default();
        emit_in(streams.entry(client).or_default(), payload, PUSHES_KEPT_PER_STREAM)
    }

    /// Pushes emitted to `client` in its own stream so far.
    pub fn sent(&self, client: ClientId) -> u64 {
        self.clients.get(&client).map_or(0, |p| p.next_seq.saturating_sub(1))
    }

    /// The number the next push of `client`'s stream on `object` will get.
    pub fn next_on(&self, object: &[u8], client: ClientId) -> u64 {
        let stream = self.objects.get(object).and_then(|s| s.get(&client));
        stream.map_or(1, |s| s.next_seq.max(1))
    }

    /// The answer to PUSH-RESUME of `client` from `next` in its own stream.
    pub fn resume(&self, client: ClientId, next: u64) -> Resume {
        resume_in(self.clients.get(&client), next)
    }

    /// The answer to PUSH-RESUME of `client` from `next` in its stream on `object`.
    pub fn resume_on(&self, object: &[u8], client: ClientId, next: u64) -> Resume {
        resume_in(self.objects.get(object).and_then(|s| s.get(&client)), next)
    }

    /// The streams of `object`, sorted by client (empty if it has none).
    pub fn object_streams(&self, object: &[u8]) -> Vec<(ClientId, PushStream)> {
        let streams = self.objects.get(object).into_iter().flatten();
        streams.map(|(c, s)| (*c, s.clone())).collect()
    }

    /// Replaces the streams of `object` with a certified copy's.
    pub fn set_object_streams(&mut self, object: &Bytes, streams: &[(ClientId, PushStream)]) {
        if streams.is_empty() {
            self.objects.remove(object);
        } else {
            self.objects.insert(object.clone(), streams.iter().cloned().collect());
        }
    }

    /// The clients' own streams as checkpointed: sorted by client, so equal logs encode equally.
    pub fn to_sorted(&self) -> Vec<(ClientId, PushStream)> {
        self.clients.iter().map(|(c, p)| (*c, p.clone())).collect()
    }

    /// The object streams as checkpointed, sorted by object and client.
    pub fn objects_sorted(&self) -> ObjectStreams {
        let objects = self.objects.iter();
        objects
            .map(|(o, s)| (o.clone(), s.iter().map(|(c, p)| (*c, p.clone())).collect()))
            .collect()
    }

    /// Replaces the log with a checkpoint's.
    pub fn restore(&mut self, sorted: &[(ClientId, PushStream)], objects: &ObjectStreams) {
        self.clients = sorted.iter().cloned().collect();
        self.objects = objects
            .iter()
            .map(|(o, s)| (o.clone(), s.iter().cloned().collect()))
            .collect();
    }
}

impl ExecStage {
    /// Numbers, keeps and sends the pushes a batch emitted, in emission order, each in its
    /// client's own stream (without selective execution an object names no stream).
    pub(super) fn send_pushes(&mut self, pushes: Vec<Push>, out: &mut Vec<Action>) {
        for Push { client, payload, .. } in pushes {
            if !self.push_acceptable(client, &payload) {
                continue;
            }
            let seq = self.pushes.emit(client, payload.clone());
            self.note_pushed(client, None, seq, &payload, out);
            self.send_push(client, None, seq, payload, out);
            self.stats.bump("pushes_sent");
        }
    }

    /// Under selective execution: numbers and keeps a push in `client`'s stream on `object`
    /// (the caller checked that the request declared it, or runs everywhere), and sends it if
    /// `live` (a replay's pushes are only numbered, for the streams to stay as current as their
    /// object: a client that missed one asks for it).
    pub(super) fn emit_on_stream(
        &mut self,
        object: &Bytes,
        client: ClientId,
        payload: Bytes,
        out: &mut Vec<Action>,
        live: bool,
    ) {
        if !self.push_acceptable(client, &payload) {
            return;
        }
        if object.len() > PUSH_STREAM_NAME_MAX {
            // Its stream could not be named in a PUSH (nor announced).
            return self.stats.bump("push_stream_name_too_long");
        }
        let seq = self.pushes.emit_on(object, client, payload.clone());
        self.note_pushed(client, Some(object.clone()), seq, &payload, out);
        if live {
            self.send_push(client, Some(object.clone()), seq, payload, out);
            self.stats.bump("pushes_sent");
        } else {
            self.stats.bump("stream_pushes_numbered_in_replay");
        }
    }

    /// Whether a push may be numbered: its client is configured and it is within the bound.
    fn push_acceptable(&mut self, client: ClientId, payload: &Bytes) -> bool {
        if !self.clients.contains(&client) {
            self.stats.bump("push_unknown_client");
            return false;
        }
        if payload.len() > PUSH_BYTES_MAX {
            self.stats.bump("push_too_large");
            return false;
        }
        true
    }

    /// Notes a numbered push for the host (the simulator's checkers compare members' pushes).
    fn note_pushed(&self, client: ClientId, stream: Option<Bytes>, seq: u64, payload: &Bytes, out: &mut Vec<Action>) {
        let digest = crate::crypto::Digest::of(payload);
        out.push(Action::Note(Event::Pushed {
            client,
            stream,
            seq,
            digest,
        }));
    }

    fn send_push(&self, client: ClientId, stream: Option<Bytes>, seq: u64, payload: Bytes, out: &mut Vec<Action>) {
        let to = Principal::Client(client);
        self.send(vec![to], Message::Push { stream, seq, payload }, SealFor::One(to), out);
    }

    /// PUSH-RESUME from a client (its sender and seal not yet checked): resend the kept pushes
    /// from `next` of its own stream and of each object stream it lists, or say which are gone.
    /// A member answers for every object, maintained or not: its copy of a stream it does not
    /// maintain is as of the last checkpoint, whose pushes are numbered as the maintainers
    /// numbered them.
    pub(super) fn on_push_resume(&mut self, envelope: &crate::message::Envelope, out: &mut Vec<Action>) {
        let Message::PushResume {
            client,
            next,
            ref streams,
        } = envelope.message
        else {
            unreachable!("dispatched on message kind");
        };
        if envelope.from != Principal::Client(client) || !self.clients.contains(&client) {
            self.stats.bump("push_resume_wrong_sender");
            return;
        }
        if !self.seal_ok(envelope, out) {
            return;
        }
        if self.distrusted {
            // The kept pushes are the distrusted state's.
            return self.stats.bump("push_resume_state_distrusted");
        }
        // The kept pushes a tentative batch emitted (to any client: a write wakes another
        // client's watch) go out only when it commits.
        let tentative_from = self.tentative_first_push(client).unwrap_or(u64::MAX);
        if next >= tentative_from {
            self.stats.bump("push_resume_tentative");
        } else {
            let resume = self.pushes.resume(client, next);
            self.answer_resume(client, None, next, resume, tentative_from, out);
        }
        for (object, next) in streams {
            let resume = self.pushes.resume_on(object, client, *next);
            self.answer_resume(client, Some(object.clone()), *next, resume, u64::MAX, out);
        }
    }

    fn answer_resume(
        &mut self,
        client: ClientId,
        stream: Option<Bytes>,
        next: u64,
        resume: Resume,
        tentative_from: u64,
        out: &mut Vec<Action>,
    ) {
        match resume {
            Resume::Pushes(pushes) => {
                self.stats.bump("push_resume_resent");
                for (seq, payload) in pushes.into_iter().filter(|(seq, _)| *seq < tentative_from) {
                    self.send_push(client, stream.clone(), seq, payload, out);
                }
            }
            Resume::Gap(resume_at) => {
                self.stats.bump("push_resume_gap");
                let to = Principal::Client(client);
                let gap = Message::PushGap {
                    stream,
                    next,
                    resume_at,
                };
                self.send(vec![to], gap, SealFor::One(to), out);
            }
            Resume::Nothing => self.stats.bump("push_resume_nothing"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn pushes_are_numbered_per_client_from_one() {
        let mut log = PushLog::default();
        assert_eq!(log.emit(ClientId(1), b("a")), 1);
        assert_eq!(log.emit(ClientId(2), b("b")), 1);
        assert_eq!(log.emit(ClientId(1), b("c")), 2);
        assert_eq!(log.resume(ClientId(1), 2), Resume::Pushes(vec![(2, b("c"))]));
        assert_eq!(log.resume(ClientId(1), 3), Resume::Nothing);
        assert_eq!(log.resume(ClientId(3), 1), Resume::Nothing);
    }

    #[test]
    fn old_pushes_become_a_gap_and_resends_are_bounded() {
        let mut log = PushLog::default();
        let total = PUSHES_KEPT_PER_CLIENT as u64 + 10;
        for i in 1..=total {
            log.emit(ClientId(1), Bytes::from(i.to_string()));
        }
        assert_eq!(log.resume(ClientId(1), 1), Resume::Gap(11));
        match log.resume(ClientId(1), 11) {
            Resume::Pushes(p) => {
                assert_eq!(p.len(), PUSHES_RESENT_MAX);
                assert_eq!(p[0], (11, b("11")));
            }
            other => panic!("{other:?}"),
        }
        let mut restored = PushLog::default();
        restored.restore(&log.to_sorted(), &log.objects_sorted());
        assert_eq!(restored, log);
    }
}
