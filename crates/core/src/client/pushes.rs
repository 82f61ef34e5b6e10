//! Pushed messages at the client (PROTOCOL.md "Pushed messages"): a push is accepted once
//! `q.push()` distinct execution members sent the same payload under the same number, and
//! delivered in number order, each once; where pushes are no longer kept, `q.push()` matching
//! PUSH-GAPs deliver an explicit gap instead. A hole (a later push seen, an earlier one missing)
//! makes the client ask for its pushes again (PUSH-RESUME) until it is filled; once it has had a
//! push (or a reply saying pushes were sent to it), it also asks every [`PUSH_POLL_US`], so the
//! last push of a burst, or the first, is not lost for good when its copies were.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::Client;
use crate::crypto::Digest;
use crate::ids::ReplicaId;
use crate::limits::PUSH_WINDOW;
use crate::message::Message;
use crate::stage::{Action, Time, Timer};

/// How often a client that has received pushes asks for any it may have missed.
pub const PUSH_POLL_US: u64 = 1_000_000;

/// The client's side of pushed messages.
#[derive(Debug)]
pub(super) struct PushInbox {
    /// The first push not yet delivered (numbers start at 1).
    next: u64,
    /// Pushes `next .. next + PUSH_WINDOW` seen: number -> member -> its payload's digest and the
    /// payload.
    candidates: BTreeMap<u64, BTreeMap<ReplicaId, (Digest, Bytes)>>,
    /// PUSH-GAP claims for `next`: member -> the push it says comes next.
    gaps: BTreeMap<ReplicaId, u64>,
    /// Whether the client has received any push (then it polls).
    active: bool,
    /// When [`Timer::PushResume`] is set to fire, if it is.
    armed: Option<Time>,
}

impl Default for PushInbox {
    fn default() -> PushInbox {
        PushInbox {
            next: 1,
            candidates: BTreeMap::new(),
            gaps: BTreeMap::new(),
            active: false,
            armed: None,
        }
    }
}

impl PushInbox {
    /// Whether a push after `next` was seen while `next` is missing.
    fn hole(&self) -> bool {
        !self.candidates.is_empty() || !self.gaps.is_empty()
    }
}

impl Client {
    /// PUSH from execution member `exec` (sender and seal checked).
    pub(super) fn on_push(&mut self, now: Time, exec: ReplicaId, seq: u64, payload: &Bytes, out: &mut Vec<Action>) {
        let inbox = &mut self.pushes;
        inbox.active = true;
        if seq < inbox.next {
            self.stats.bump("push_duplicate");
            return;
        }
        if seq >= inbox.next + PUSH_WINDOW {
            self.stats.bump("push_too_far_ahead");
            self.arm_push_resume(now, self.config.knobs.client_retransmit_initial_us, out);
            return;
        }
        inbox
            .candidates
            .entry(seq)
            .or_default()
            .insert(exec, (Digest::of(payload), payload.clone()));
        self.deliver_pushes(out);
        self.arm_push_resume(now, self.push_resume_wait(), out);
    }

    /// A reply from an execution member says it has sent this client `sent` pushes: if some are
    /// missing, the client starts asking for its pushes (every copy of a client's first push
    /// may have been lost, and then nothing else would tell it). A lying member costs one
    /// PUSH-RESUME per poll interval.
    pub(super) fn pushes_owed(&mut self, now: Time, sent: u64, out: &mut Vec<Action>) {
        if sent >= self.pushes.next && !self.pushes.active {
            self.pushes.active = true;
            self.stats.bump("pushes_owed");
            self.arm_push_resume(now, self.push_resume_wait(), out);
        }
    }

    /// PUSH-GAP from execution member `exec` (sender and seal checked).
    pub(super) fn on_push_gap(&mut self, exec: ReplicaId, next: u64, resume_at: u64, out: &mut Vec<Action>) {
        let quorum = self.push_quorum();
        let inbox = &mut self.pushes;
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
            missed_from: next,
            resume_at,
        });
        self.stats.bump("push_gaps_delivered");
        inbox.next = resume_at;
        inbox.gaps.clear();
        inbox.candidates.retain(|&seq, _| seq >= resume_at);
        self.deliver_pushes(out);
    }

    /// Matching copies that make a push (or a gap) accepted: `q.push()`, or one when sabotaged.
    fn push_quorum(&self) -> usize {
        if self.config.knobs.sabotage == Some(crate::config::Sabotage::WeakPushQuorum) {
            1
        } else {
            self.quorums.push()
        }
    }

    /// Delivers every accepted push from `next` on, in order.
    fn deliver_pushes(&mut self, out: &mut Vec<Action>) {
        let quorum = self.push_quorum();
        let inbox = &mut self.pushes;
        while let Some(claims) = inbox.candidates.get(&inbox.next) {
            let accepted = claims.values().find_map(|(digest, payload)| {
                let matching = claims.values().filter(|(d, _)| d == digest).count();
                (matching >= quorum).then(|| payload.clone())
            });
            let Some(payload) = accepted else { break };
            inbox.candidates.remove(&inbox.next);
            inbox.gaps.clear();
            out.push(Action::DeliverPush {
                seq: inbox.next,
                payload,
            });
            self.stats.bump("pushes_delivered");
            inbox.next += 1;
        }
    }

    /// How long until the next PUSH-RESUME: a retransmission interval while a hole is known,
    /// otherwise the poll interval.
    fn push_resume_wait(&self) -> u64 {
        if self.pushes.hole() {
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

    /// [`Timer::PushResume`]: ask every execution member for the pushes from `next` on.
    pub(super) fn push_resume(&mut self, now: Time, out: &mut Vec<Action>) {
        self.pushes.armed = None;
        if !self.pushes.active {
            return;
        }
        let message = Message::PushResume {
            client: self.id,
            next: self.pushes.next,
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
        from_exec(f, exec, Message::Push { seq, payload })
    }

    fn delivered(out: &[Action]) -> Vec<(u64, Bytes)> {
        out.iter()
            .filter_map(|a| match a {
                Action::DeliverPush { seq, payload } => Some((*seq, payload.clone())),
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
                next: 1
            }
        );
        // One member's gap claim is not enough; a stale one (not for `next`) counts for nothing.
        let gap = |exec, next, resume_at| from_exec(&f, exec, Message::PushGap { next, resume_at });
        assert!(step(&mut c, gap(0, 1, 5)).is_empty());
        step(&mut c, gap(1, 2, 5));
        assert_eq!(c.stats().get("push_gap_stale"), 1);
        let out = step(&mut c, gap(2, 1, 5));
        assert!(matches!(
            out[0],
            Action::PushGap {
                missed_from: 1,
                resume_at: 5
            }
        ));
        step(&mut c, push(&f, 1, 5, "e"));
        assert_eq!(c.pushes.next, 6, "push 5 delivered after the gap");
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
}
