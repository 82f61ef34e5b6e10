//! The contract between ordering and execution (UpRight thesis ch. 5, "separating agreement from
//! execution"; docs/PROTOCOL.md "Normal case" step 4-5, "Checkpoints and the stage interlock",
//! "Catch-up of execution members"). It is all that execution knows of ordering: an ordering
//! protocol (PBFT's order stage today; Aliph, LCR and tentative execution next) is any stage that
//! keeps its side of it, and the execution stage runs unchanged on top.
//!
//! | message | direction | seal | accepted on |
//! |---|---|---|---|
//! | NEXT-BATCH `{view, seqno, history, time_us, entries}` | order -> exec | authenticator for the execution stage | `q.next_batch()` matching copies from distinct order members, or the co-located order member's alone ([`next_batch::BatchCollector`]) |
//! | CP-TOKEN `{seqno, exec_state}` | exec -> order | authenticator for the order stage | `q.checkpoint_token()` matching tokens name the execution state an order checkpoint certifies ([`tokens::TokenTally`]) |
//! | LAST-EXEC `{seqno}` | exec -> order | MAC | each: the order member answers with the committed NEXT-BATCHes after `seqno` it still holds, or with LOAD-CP when they are behind its stable checkpoint |
//! | TENTATIVE-BATCH `{view, seqno, history, time_us, entries}` | order -> exec | authenticator for the execution stage | the co-located order member's alone: a batch it prepared in `view` with every batch before committed, executed tentatively and confirmed or rolled back by the NEXT-BATCH at `seqno` (`exec/tentative.rs`) |
//! | LOAD-CP `{seqno, exec_state}` | order -> exec | MAC | `q.load_checkpoint()` matching from distinct order members ([`load::LoadVotes`]): the execution member fetches that state from its peers |
//! | RETRANSMIT `{client, request_id}` | order -> exec | MAC | each: resend the cached reply |
//! | WAKE-AT `{seqno, at_us}` | exec -> order | MAC | the newest per execution member; an idle primary orders an empty batch at the `q.small()`-th earliest pending wake-up (one correct member asked for it), and backups accept it on the same count ([`WakeUps`]) |
//!
//! The quorums are in [`crate::quorum::Quorums`] with their arguments. An ordering protocol
//! implements [`OrderSide`] and routes what execution sends with [`route_to_order`]; the
//! execution stage implements [`ExecSide`] and routes with [`route_to_exec`]. The messages are
//! built with the constructors below, so both sides agree on their form.

pub mod load;
pub mod next_batch;
pub mod tokens;

use crate::crypto::Digest;
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, View};
use crate::message::{Message, RequestEntry};
use crate::stage::{Action, Time};
use next_batch::Offered;

/// NEXT-BATCH: batch `seqno`, committed in `view`, with history digest `history` and agreed time
/// `time_us`.
pub fn next_batch(view: View, seqno: SeqNo, history: Digest, time_us: u64, entries: Vec<RequestEntry>) -> Message {
    Message::NextBatch {
        view,
        seqno,
        history,
        time_us,
        entries,
    }
}

/// CP-TOKEN: the digest of the execution checkpoint at `seqno`.
pub fn checkpoint_token(seqno: SeqNo, exec_state: Digest) -> Message {
    Message::CheckpointToken { seqno, exec_state }
}

/// LAST-EXEC: the last batch this execution member executed.
pub fn last_executed(seqno: SeqNo) -> Message {
    Message::LastExecuted { seqno }
}

/// LOAD-CP: load the execution checkpoint `exec_state` at `seqno` (certified by the order
/// stage's stable checkpoint there).
pub fn load_checkpoint(seqno: SeqNo, exec_state: Digest) -> Message {
    Message::LoadCheckpoint { seqno, exec_state }
}

/// RETRANSMIT: the client retransmitted an already ordered request; resend its reply.
pub fn retransmit(client: ClientId, request_id: RequestId) -> Message {
    Message::Retransmit { client, request_id }
}

/// WAKE-AT: after executing `seqno`, the service asks to be woken at agreed time `at_us`.
pub fn wake_at(seqno: SeqNo, at_us: Option<u64>) -> Message {
    Message::WakeAt { seqno, at_us }
}

/// The wake-ups execution members asked for (WAKE-AT), the newest per member, and the earliest
/// agreed time at which an empty batch is justified: one that `small` members asked for at or
/// before it, so at least one correct member did. A faulty member can neither hasten it (it needs
/// `small - 1` others) nor make it repeat (a wake-up at or before the last batch's time counts
/// for nothing), so a faulty primary gets no more empty batches than the service asked for.
#[derive(Clone, Debug, Default)]
pub struct WakeUps {
    newest: std::collections::BTreeMap<ReplicaId, (SeqNo, Option<u64>)>,
}

impl WakeUps {
    /// Records `from`'s wake-up after `seqno` (an older report than one held is ignored).
    pub fn offer(&mut self, from: ReplicaId, seqno: SeqNo, at_us: Option<u64>) {
        let slot = self.newest.entry(from).or_insert((seqno, at_us));
        if seqno >= slot.0 {
            *slot = (seqno, at_us);
        }
    }

    /// The earliest time after `after` at which `small` members have asked to be woken.
    pub fn due(&self, after: u64, small: usize) -> Option<u64> {
        let mut pending: Vec<u64> = self
            .newest
            .values()
            .filter_map(|&(_, at)| at.filter(|&at| at > after))
            .collect();
        pending.sort_unstable();
        pending.get(small.checked_sub(1)?).copied()
    }
}

/// What became of a message offered to one side of the contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routed {
    /// A contract message from a stage allowed to send it: handed to the side.
    Handled,
    /// A contract message from a stage that may not send it (count and drop it).
    WrongSender,
    /// Not a contract message for this side: the stage handles it itself.
    NotContract,
}

/// The order side: what every ordering protocol does with what execution sends it.
pub trait OrderSide {
    /// CP-TOKEN from execution member `from` (authenticated by the caller).
    fn checkpoint_token(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, exec_state: Digest, out: &mut Vec<Action>);
    /// LAST-EXEC from execution member `from`: answer with the committed NEXT-BATCHes after
    /// `seqno`, or with LOAD-CP if they are no longer held.
    fn last_executed(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, out: &mut Vec<Action>);
    /// WAKE-AT from execution member `from`: its service's next wake-up after `seqno`.
    fn wake_at(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, at_us: Option<u64>, out: &mut Vec<Action>);
}

/// The execution side: what the execution stage does with what ordering sends it.
pub trait ExecSide {
    /// A NEXT-BATCH (authenticated by the caller, from an order member).
    fn next_batch(&mut self, now: Time, offered: Offered<'_>, out: &mut Vec<Action>);
    /// A LOAD-CP from order member `from`.
    fn load_checkpoint(&mut self, now: Time, from: ReplicaId, seqno: SeqNo, exec_state: Digest, out: &mut Vec<Action>);
    /// A RETRANSMIT from an order member.
    fn retransmit(&mut self, now: Time, client: ClientId, request_id: RequestId, out: &mut Vec<Action>);
    /// A TENTATIVE-BATCH (prepared in `view`, not yet committed) from an order member; the side
    /// checks that it is the co-located one.
    fn tentative_batch(&mut self, now: Time, view: View, offered: Offered<'_>, out: &mut Vec<Action>);
}

/// Hands an authenticated message from `from` to the order side if it is CP-TOKEN, LAST-EXEC or
/// WAKE-AT.
pub fn route_to_order(
    side: &mut impl OrderSide,
    now: Time,
    from: Principal,
    message: &Message,
    out: &mut Vec<Action>,
) -> Routed {
    match (message, from) {
        (Message::CheckpointToken { seqno, exec_state }, Principal::Exec(r)) => {
            side.checkpoint_token(now, r, *seqno, *exec_state, out)
        }
        (Message::LastExecuted { seqno }, Principal::Exec(r)) => side.last_executed(now, r, *seqno, out),
        (Message::WakeAt { seqno, at_us }, Principal::Exec(r)) => side.wake_at(now, r, *seqno, *at_us, out),
        (Message::CheckpointToken { .. } | Message::LastExecuted { .. } | Message::WakeAt { .. }, _) => {
            return Routed::WrongSender
        }
        _ => return Routed::NotContract,
    }
    Routed::Handled
}

/// Hands an authenticated message from `from` to the execution side if it is NEXT-BATCH,
/// LOAD-CP or RETRANSMIT.
pub fn route_to_exec(
    side: &mut impl ExecSide,
    now: Time,
    from: Principal,
    message: &Message,
    out: &mut Vec<Action>,
) -> Routed {
    match (message, from) {
        (
            Message::NextBatch {
                seqno,
                history,
                time_us,
                entries,
                ..
            }
            | Message::TentativeBatch {
                seqno,
                history,
                time_us,
                entries,
                ..
            },
            Principal::Order(r),
        ) => {
            let offered = Offered {
                from: r,
                seqno: *seqno,
                history: *history,
                time_us: *time_us,
                entries,
            };
            match message {
                Message::TentativeBatch { view, .. } => side.tentative_batch(now, *view, offered, out),
                _ => side.next_batch(now, offered, out),
            }
        }
        (Message::LoadCheckpoint { seqno, exec_state }, Principal::Order(r)) => {
            side.load_checkpoint(now, r, *seqno, *exec_state, out)
        }
        (Message::Retransmit { client, request_id }, Principal::Order(_)) => {
            side.retransmit(now, *client, *request_id, out)
        }
        (
            Message::NextBatch { .. }
            | Message::TentativeBatch { .. }
            | Message::LoadCheckpoint { .. }
            | Message::Retransmit { .. },
            _,
        ) => return Routed::WrongSender,
        _ => return Routed::NotContract,
    }
    Routed::Handled
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ClientId;

    #[derive(Default)]
    struct Recorder(Vec<String>);

    impl OrderSide for Recorder {
        fn checkpoint_token(&mut self, _: Time, from: ReplicaId, seqno: SeqNo, _: Digest, _: &mut Vec<Action>) {
            self.0.push(format!("token {} {}", from.0, seqno.0));
        }
        fn last_executed(&mut self, _: Time, from: ReplicaId, seqno: SeqNo, _: &mut Vec<Action>) {
            self.0.push(format!("last {} {}", from.0, seqno.0));
        }
        fn wake_at(&mut self, _: Time, from: ReplicaId, seqno: SeqNo, at: Option<u64>, _: &mut Vec<Action>) {
            self.0.push(format!("wake {} {} {at:?}", from.0, seqno.0));
        }
    }

    impl ExecSide for Recorder {
        fn next_batch(&mut self, _: Time, offered: Offered<'_>, _: &mut Vec<Action>) {
            self.0.push(format!(
                "batch {} {} {}",
                offered.from.0,
                offered.seqno.0,
                offered.entries.len()
            ));
        }
        fn load_checkpoint(&mut self, _: Time, from: ReplicaId, seqno: SeqNo, _: Digest, _: &mut Vec<Action>) {
            self.0.push(format!("load {} {}", from.0, seqno.0));
        }
        fn retransmit(&mut self, _: Time, client: ClientId, request_id: RequestId, _: &mut Vec<Action>) {
            self.0.push(format!("retransmit {} {}", client.0, request_id.0));
        }
        fn tentative_batch(&mut self, _: Time, view: View, offered: Offered<'_>, _: &mut Vec<Action>) {
            self.0
                .push(format!("tentative {} {} {}", view.0, offered.from.0, offered.seqno.0));
        }
    }

    #[test]
    fn each_side_takes_its_messages_from_the_stage_allowed_to_send_them() {
        let (exec, order, auth) = (
            Principal::Exec(ReplicaId(2)),
            Principal::Order(ReplicaId(1)),
            Principal::Auth(ReplicaId(1)),
        );
        let mut side = Recorder::default();
        let out = &mut Vec::new();
        let token = checkpoint_token(SeqNo(8), Digest::default());
        let last = last_executed(SeqNo(3));
        let wake = wake_at(SeqNo(3), Some(90));
        assert_eq!(route_to_order(&mut side, 0, exec, &token, out), Routed::Handled);
        assert_eq!(route_to_order(&mut side, 0, exec, &last, out), Routed::Handled);
        assert_eq!(route_to_order(&mut side, 0, exec, &wake, out), Routed::Handled);
        assert_eq!(route_to_order(&mut side, 0, order, &token, out), Routed::WrongSender);
        assert_eq!(route_to_order(&mut side, 0, auth, &wake, out), Routed::WrongSender);
        assert_eq!(
            route_to_order(&mut side, 0, exec, &retransmit(ClientId(0), RequestId(1)), out),
            Routed::NotContract
        );

        let batch = next_batch(View(0), SeqNo(4), Digest::default(), 7, Vec::new());
        let load = load_checkpoint(SeqNo(8), Digest::default());
        let again = retransmit(ClientId(5), RequestId(9));
        let tentative = Message::TentativeBatch {
            view: View(2),
            seqno: SeqNo(5),
            history: Digest::default(),
            time_us: 8,
            entries: Vec::new(),
        };
        for m in [&batch, &load, &again, &tentative] {
            assert_eq!(route_to_exec(&mut side, 0, order, m, out), Routed::Handled);
            assert_eq!(route_to_exec(&mut side, 0, auth, m, out), Routed::WrongSender);
        }
        assert_eq!(route_to_exec(&mut side, 0, order, &token, out), Routed::NotContract);
        assert_eq!(
            side.0,
            [
                "token 2 8",
                "last 2 3",
                "wake 2 3 Some(90)",
                "batch 1 4 0",
                "load 1 8",
                "retransmit 5 9",
                "tentative 2 1 5"
            ],
            "only the allowed senders reached the sides, with their fields"
        );
        assert!(out.is_empty());
    }

    #[test]
    fn a_wake_up_is_due_when_small_members_asked_for_it() {
        let mut wakes = WakeUps::default();
        assert_eq!(wakes.due(0, 2), None);
        wakes.offer(ReplicaId(0), SeqNo(5), Some(100));
        assert_eq!(wakes.due(0, 2), None, "one member alone may be the faulty one");
        assert_eq!(wakes.due(0, 1), Some(100));
        wakes.offer(ReplicaId(1), SeqNo(5), Some(120));
        wakes.offer(ReplicaId(2), SeqNo(4), Some(1));
        assert_eq!(
            wakes.due(0, 2),
            Some(100),
            "the second earliest: a correct member asked by then"
        );
        assert_eq!(
            wakes.due(1, 2),
            Some(120),
            "a wake-up at or before the last batch counts for nothing"
        );
        wakes.offer(ReplicaId(1), SeqNo(3), None);
        assert_eq!(
            wakes.due(1, 2),
            Some(120),
            "an older report does not replace a newer one"
        );
        wakes.offer(ReplicaId(1), SeqNo(6), None);
        assert_eq!(
            wakes.due(1, 2),
            None,
            "a member that waits for nothing counts for nothing"
        );
        assert_eq!(wakes.due(0, 0), None);
    }
}
