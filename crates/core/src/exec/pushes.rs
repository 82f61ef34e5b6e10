//! Pushed messages at an execution member (PROTOCOL.md "Pushed messages"): numbering per client,
//! the pushes kept for clients that missed some, and the answer to PUSH-RESUME.
//!
//! Every correct member numbers a client's pushes the same way (they come out of the agreed
//! execution in order), so a push is identified by `(client, seq)` and a client accepts it on
//! `q.push()` matching copies. The log is part of the execution checkpoint, so a member that
//! loads a checkpoint numbers on from where the others were.

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::ExecStage;
use crate::ids::{ClientId, Principal};
use crate::limits::{PUSHES_KEPT_PER_CLIENT, PUSHES_RESENT_MAX, PUSH_BYTES_MAX};
use crate::message::{Message, SealFor};
use crate::service::Push;
use crate::stage::{Action, Event};

/// One client's pushes: the next number, and the newest pushes kept.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientPushes {
    /// Number of the next push (the first is 1).
    pub next_seq: u64,
    /// The newest pushes, oldest first, at most [`PUSHES_KEPT_PER_CLIENT`].
    pub kept: VecDeque<(u64, Bytes)>,
}

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

/// Every configured client's pushes, sorted by client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushLog {
    clients: BTreeMap<ClientId, ClientPushes>,
}

impl PushLog {
    /// Numbers and keeps a push; returns its number.
    pub fn emit(&mut self, client: ClientId, payload: Bytes) -> u64 {
        let pushes = self.clients.entry(client).or_insert_with(|| ClientPushes {
            next_seq: 1,
            kept: VecDeque::new(),
        });
        let seq = pushes.next_seq;
        pushes.next_seq += 1;
        if pushes.kept.len() == PUSHES_KEPT_PER_CLIENT {
            pushes.kept.pop_front();
        }
        pushes.kept.push_back((seq, payload));
        seq
    }

    /// Pushes emitted to `client` so far.
    pub fn sent(&self, client: ClientId) -> u64 {
        self.clients.get(&client).map_or(0, |p| p.next_seq.saturating_sub(1))
    }

    /// The answer to PUSH-RESUME of `client` from `next`.
    pub fn resume(&self, client: ClientId, next: u64) -> Resume {
        let Some(pushes) = self.clients.get(&client) else {
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

    /// The log as checkpointed: sorted by client, so equal logs encode equally.
    pub fn to_sorted(&self) -> Vec<(ClientId, ClientPushes)> {
        self.clients.iter().map(|(c, p)| (*c, p.clone())).collect()
    }

    /// Replaces the log with a checkpoint's.
    pub fn restore(&mut self, sorted: &[(ClientId, ClientPushes)]) {
        self.clients = sorted.iter().cloned().collect();
    }
}

impl ExecStage {
    /// Numbers, keeps and sends the pushes a batch emitted, in emission order.
    pub(super) fn send_pushes(&mut self, pushes: Vec<Push>, out: &mut Vec<Action>) {
        for Push { client, payload } in pushes {
            if !self.clients.contains(&client) {
                self.stats.bump("push_unknown_client");
                continue;
            }
            if payload.len() > PUSH_BYTES_MAX {
                self.stats.bump("push_too_large");
                continue;
            }
            let seq = self.pushes.emit(client, payload.clone());
            out.push(Action::Note(Event::Pushed {
                client,
                seq,
                digest: crate::crypto::Digest::of(&payload),
            }));
            self.send_push(client, seq, payload, out);
            self.stats.bump("pushes_sent");
        }
    }

    fn send_push(&self, client: ClientId, seq: u64, payload: Bytes, out: &mut Vec<Action>) {
        let to = Principal::Client(client);
        self.send(vec![to], Message::Push { seq, payload }, SealFor::One(to), out);
    }

    /// PUSH-RESUME from a client (its sender and seal not yet checked): resend the kept pushes
    /// from `next`, or say which are gone.
    pub(super) fn on_push_resume(&mut self, envelope: &crate::message::Envelope, out: &mut Vec<Action>) {
        let Message::PushResume { client, next } = envelope.message else {
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
            return self.stats.bump("push_resume_tentative");
        }
        match self.pushes.resume(client, next) {
            Resume::Pushes(pushes) => {
                self.stats.bump("push_resume_resent");
                for (seq, payload) in pushes.into_iter().filter(|(seq, _)| *seq < tentative_from) {
                    self.send_push(client, seq, payload, out);
                }
            }
            Resume::Gap(resume_at) => {
                self.stats.bump("push_resume_gap");
                let to = Principal::Client(client);
                self.send(vec![to], Message::PushGap { next, resume_at }, SealFor::One(to), out);
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
        restored.restore(&log.to_sorted());
        assert_eq!(restored, log);
    }
}
