//! The simulator's event queue (virtual time, ties broken by insertion order) and its timer table
//! (one instance per `(principal, timer)`; setting moves it, cancelling removes it, stale firings
//! are recognised by a generation number).

use std::cmp::{Ordering, Reverse};
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Arc;

use upright_core::crypto::Digest;
use upright_core::ids::Principal;
use upright_core::message::Envelope;
use upright_core::stage::{Time, Timer};

/// Something that happens at a virtual instant.
#[derive(Clone, Debug)]
pub enum Event {
    /// A message arrives at `to`.
    Deliver {
        /// The network sender (may differ from `envelope.from` for forged or replayed copies).
        from: Principal,
        /// The recipient.
        to: Principal,
        /// The replica process it arrives at, if `to` is a member (a twin's copy, or replica
        /// `to.replica()`).
        process: u32,
        /// The message.
        envelope: Arc<Envelope>,
        /// Digest of the encoded envelope (for the trace hash).
        digest: Digest,
        /// The configuration epoch of the correct replica process that sealed it, if one did
        /// (the old-configuration checker).
        sealed_in: Option<u64>,
    },
    /// A timer fires (if `generation` is still the current one for `(principal, timer)`).
    Timer {
        /// Whose timer.
        principal: Principal,
        /// Which.
        timer: Timer,
        /// Generation at the time it was set.
        generation: u64,
    },
    /// A replica host's next timer is due (if `generation` is still its current wake-up).
    HostWake {
        /// Which replica.
        replica: u32,
        /// Generation at the time it was scheduled.
        generation: u64,
    },
    /// A replica whose flush was deferred ends its round now (see `Sim::after_delivery`).
    Flush(u32),
    /// Index into the fault plan's list of scheduled fault steps.
    Fault(usize),
    /// A correct client's think time is over: invoke its next operation.
    ClientWake(u32),
    /// The twins' next round of sides (`--twins`, [`crate::twins`]).
    TwinsRound,
    /// A replica with [`crate::SimOptions::cpu_us_per_message`] is free: it handles the next
    /// message that waited for it.
    CpuFree(u32),
    /// The administrator orders its next change (`--reconfiguration`, [`crate::reconfig`]).
    AdminStep,
    /// A replica whose order member ended its configuration starts again in the next one (or
    /// stops, if the change removed it).
    Switch(u32),
}

struct Scheduled {
    time: Time,
    sequence: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.sequence) == (other.time, other.sequence)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.time, self.sequence).cmp(&(other.time, other.sequence))
    }
}

/// Upper bound on queued events; a run that exceeds it is a simulator or protocol bug (message
/// storm), reported rather than exhausting memory.
pub const QUEUE_EVENTS_MAX: usize = 2_000_000;

/// A priority queue of events by `(time, insertion sequence)`.
#[derive(Default)]
pub struct EventQueue {
    heap: BinaryHeap<Reverse<Scheduled>>,
    next_sequence: u64,
}

impl EventQueue {
    /// Schedules `event` at `time`. Returns false (and drops it) when the queue is full.
    pub fn push(&mut self, time: Time, event: Event) -> bool {
        if self.heap.len() >= QUEUE_EVENTS_MAX {
            return false;
        }
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.heap.push(Reverse(Scheduled { time, sequence, event }));
        true
    }

    /// The earliest event, if any.
    pub fn pop(&mut self) -> Option<(Time, Event)> {
        self.heap.pop().map(|Reverse(s)| (s.time, s.event))
    }

    /// Time of the earliest event.
    pub fn peek_time(&self) -> Option<Time> {
        self.heap.peek().map(|Reverse(s)| s.time)
    }

    /// Number of queued events.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

/// The set timers: `(principal, timer) -> generation`.
#[derive(Default)]
pub struct Timers {
    set: BTreeMap<(Principal, Timer), u64>,
    next_generation: u64,
}

impl Timers {
    /// Sets (or moves) a timer; returns the generation to put in the scheduled event.
    pub fn set(&mut self, principal: Principal, timer: Timer) -> u64 {
        self.next_generation += 1;
        self.set.insert((principal, timer), self.next_generation);
        self.next_generation
    }

    /// Cancels a timer.
    pub fn cancel(&mut self, principal: Principal, timer: Timer) {
        self.set.remove(&(principal, timer));
    }

    /// Called when a timer event pops: true (and the timer is cleared) if it is still current.
    pub fn fire(&mut self, principal: Principal, timer: Timer, generation: u64) -> bool {
        if self.set.get(&(principal, timer)) == Some(&generation) {
            self.set.remove(&(principal, timer));
            true
        } else {
            false
        }
    }

    /// Drops every timer of the principals for which `matches` is true (a crash).
    pub fn clear(&mut self, matches: impl Fn(Principal) -> bool) {
        self.set.retain(|(p, _), _| !matches(*p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use upright_core::ids::ReplicaId;
    use upright_core::stage::PbftTimer;

    #[test]
    fn queue_orders_by_time_then_insertion() {
        let mut q = EventQueue::default();
        q.push(5, Event::ClientWake(1));
        q.push(3, Event::ClientWake(2));
        q.push(5, Event::ClientWake(3));
        q.push(3, Event::ClientWake(4));
        let order: Vec<(Time, u32)> = std::iter::from_fn(|| q.pop())
            .map(|(t, e)| match e {
                Event::ClientWake(c) => (t, c),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(order, vec![(3, 2), (3, 4), (5, 1), (5, 3)]);
    }

    #[test]
    fn timers_move_cancel_and_ignore_stale_firings() {
        let p = Principal::Order(ReplicaId(1));
        let mut t = Timers::default();
        let g1 = t.set(p, Timer::Pbft(PbftTimer::ViewChange));
        let g2 = t.set(p, Timer::Pbft(PbftTimer::ViewChange)); // moved
        assert!(!t.fire(p, Timer::Pbft(PbftTimer::ViewChange), g1));
        assert!(t.fire(p, Timer::Pbft(PbftTimer::ViewChange), g2));
        assert!(!t.fire(p, Timer::Pbft(PbftTimer::ViewChange), g2), "fires once");
        let g3 = t.set(p, Timer::Pbft(PbftTimer::OrderTick));
        t.cancel(p, Timer::Pbft(PbftTimer::OrderTick));
        assert!(!t.fire(p, Timer::Pbft(PbftTimer::OrderTick), g3));
        let g4 = t.set(p, Timer::Pbft(PbftTimer::OrderTick));
        t.clear(|q| q.replica() == Some(ReplicaId(1)));
        assert!(!t.fire(p, Timer::Pbft(PbftTimer::OrderTick), g4));
    }
}
