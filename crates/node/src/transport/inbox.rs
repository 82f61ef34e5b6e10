//! The inbound side's fairness: one bounded queue per sending process, served round-robin
//! (Aardvark's isolation: a flooding peer fills only its own queue and gets only its turn;
//! [`upright_core::fair::FairQueues`]).

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use upright_core::fair::FairQueues;
use upright_core::ids::Process;
use upright_core::message::Envelope;

use super::Counters;

/// Most envelopes waiting from one process.
pub const INBOX_PER_PEER_MAX: usize = 4096;

/// Shared inbound queues of one process, plus the wake-up of its event loop.
pub struct Inbox {
    state: Mutex<FairQueues<Process, Arc<Envelope>>>,
    notify: Notify,
    counters: Arc<Counters>,
    /// The configuration epoch each peer replica's latest connection said it runs in.
    peer_epochs: Mutex<std::collections::BTreeMap<Process, u64>>,
}

impl Inbox {
    /// An empty inbox that counts drops in `counters`.
    pub fn new(counters: Arc<Counters>) -> Inbox {
        Inbox::with_bound(counters, INBOX_PER_PEER_MAX)
    }

    /// An inbox with a custom per-peer bound.
    pub fn with_bound(counters: Arc<Counters>, per_peer_max: usize) -> Inbox {
        Inbox {
            state: Mutex::new(FairQueues::new(per_peer_max)),
            notify: Notify::new(),
            counters,
            peer_epochs: Mutex::default(),
        }
    }

    /// Notes the configuration epoch peer `from`'s newest connection said (in its hello) it
    /// runs in.
    pub fn note_peer_epoch(&self, from: Process, epoch: u64) {
        self.peer_epochs.lock().expect("inbox lock").insert(from, epoch);
    }

    /// The configuration epoch peer `from` last said it runs in, if it connected.
    pub fn peer_epoch(&self, from: Process) -> Option<u64> {
        self.peer_epochs.lock().expect("inbox lock").get(&from).copied()
    }

    /// Queues an envelope from `from`; drops it (counted) if that peer's queue is full.
    pub fn push(&self, from: Process, envelope: Arc<Envelope>) {
        self.push_many(from, std::iter::once(envelope));
    }

    /// Queues several envelopes from `from` under one lock and with one wake-up; those that do not
    /// fit in that peer's queue are dropped (counted).
    pub fn push_many(&self, from: Process, envelopes: impl IntoIterator<Item = Arc<Envelope>>) {
        let (accepted, dropped) = self.state.lock().expect("inbox lock").push_many(from, envelopes);
        self.counted(accepted as u64, dropped as u64);
    }

    /// Queues envelopes each under its own sender process (a connection that carries several
    /// clients), under one lock and with one wake-up; those that do not fit in their sender's
    /// queue are dropped (counted).
    pub fn push_each(&self, envelopes: impl IntoIterator<Item = (Process, Arc<Envelope>)>) {
        let (mut accepted, mut dropped) = (0u64, 0u64);
        {
            let mut queues = self.state.lock().expect("inbox lock");
            for (from, envelope) in envelopes {
                if queues.push(from, envelope) {
                    accepted += 1;
                } else {
                    dropped += 1;
                }
            }
        }
        self.counted(accepted, dropped);
    }

    /// After queueing: wakes the event loop if anything was queued, counts what was dropped.
    fn counted(&self, accepted: u64, dropped: u64) {
        if accepted > 0 {
            self.notify.notify_one();
        }
        if dropped > 0 {
            self.counters.add("net_dropped_inbox_full", dropped);
        }
    }

    /// Takes up to `max` envelopes, one per peer in turn.
    pub fn pop_round_robin(&self, max: usize) -> Vec<(Process, Arc<Envelope>)> {
        let mut queues = self.state.lock().expect("inbox lock");
        std::iter::from_fn(|| queues.pop()).take(max).collect()
    }

    /// Envelopes waiting.
    pub fn len(&self) -> usize {
        self.state.lock().expect("inbox lock").len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until something was pushed since the last wait.
    pub async fn notified(&self) {
        self.notify.notified().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use upright_core::ids::{ClientId, ReplicaId};
    use upright_core::message::{Message, Seal};

    fn env(from: Process) -> Arc<Envelope> {
        let principal = match from {
            Process::Replica(r) => upright_core::ids::Principal::Order(r),
            Process::Client(c) => upright_core::ids::Principal::Client(c),
        };
        Arc::new(Envelope::new(
            principal,
            Message::LastExecuted {
                seqno: Default::default(),
            },
            Seal::None,
        ))
    }

    #[test]
    fn a_flooding_peer_gets_only_its_turn_and_its_own_queue_overflows() {
        let counters = Arc::new(Counters::default());
        let inbox = Inbox::with_bound(counters.clone(), 10);
        let flooder = Process::Client(ClientId(7));
        let honest = Process::Replica(ReplicaId(1));
        for _ in 0..100 {
            inbox.push(flooder, env(flooder));
        }
        inbox.push(honest, env(honest));
        inbox.push(honest, env(honest));
        assert_eq!(counters.get("net_dropped_inbox_full"), 90);
        let first = inbox.pop_round_robin(4);
        let from: Vec<Process> = first.iter().map(|(p, _)| *p).collect();
        assert_eq!(from, vec![flooder, honest, flooder, honest]);
        assert_eq!(inbox.len(), 8);
    }

    #[test]
    fn envelopes_of_one_connection_queue_under_each_sender() {
        let counters = Arc::new(Counters::default());
        let inbox = Inbox::with_bound(counters.clone(), 2);
        let (a, b) = (Process::Client(ClientId(1)), Process::Client(ClientId(2)));
        inbox.push_each([(a, env(a)), (a, env(a)), (a, env(a)), (b, env(b))]);
        assert_eq!(counters.get("net_dropped_inbox_full"), 1);
        let from: Vec<Process> = inbox.pop_round_robin(10).iter().map(|(p, _)| *p).collect();
        assert_eq!(from, vec![a, b, a]);
        assert!(inbox.is_empty());
    }
}
