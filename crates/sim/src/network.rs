//! The simulated network: random delays, loss, duplication, reordering, long delays and
//! partitions. Deliveries between co-located members of one replica take a short hop and are
//! never lost (the replica being down is handled at delivery).

use std::collections::BTreeSet;

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use upright_core::ids::Principal;
use upright_core::stage::Time;

use crate::faults::{FaultCounts, NetworkFaults};

/// Base one-way delay range between processes, microseconds.
pub const BASE_DELAY_US: std::ops::Range<Time> = 100..5_000;
/// Hop between co-located members of one replica.
pub const LOCAL_DELAY_US: std::ops::Range<Time> = 10..100;
/// Extra delay of a reordered copy.
pub const REORDER_DELAY_US: std::ops::Range<Time> = 5_000..40_000;
/// Extra delay of a badly delayed copy.
pub const LONG_DELAY_US: std::ops::Range<Time> = 50_000..200_000;
/// Extra delay of every message from another replica to a lagging replica.
pub const LAG_DELAY_US: std::ops::Range<Time> = 20_000..150_000;

/// Network state.
#[derive(Clone, Debug, Default)]
pub struct Network {
    /// Active misbehaviour (zero outside the fault phase).
    pub faults: NetworkFaults,
    /// Replicas currently cut off from everyone else (clients stay with the majority side).
    pub partition: Option<BTreeSet<u32>>,
    /// A replica whose inbound link from the other replicas is slow (clients reach it at the usual
    /// speed): its execution member lags behind the others while still answering read-only
    /// requests promptly, from a stale state.
    pub lagging: Option<u32>,
    /// The first replica process hosting an execution member (`Principal::process_at`; 0
    /// unless the stages run apart).
    pub exec_base: u32,
}

impl Network {
    /// Whether a partition separates `a` from `b`.
    pub fn separated(&self, a: Principal, b: Principal) -> bool {
        let Some(cut) = &self.partition else { return false };
        let side = |p: Principal| p.process_index(self.exec_base).is_some_and(|r| cut.contains(&r));
        side(a) != side(b)
    }

    /// The delays after which copies of one message from `from` reach `to` (empty: lost).
    pub fn route(&self, rng: &mut ChaCha8Rng, from: Principal, to: Principal, counts: &mut FaultCounts) -> Vec<Time> {
        let (from_process, to_process) = (from.process_index(self.exec_base), to.process_index(self.exec_base));
        if from_process.is_some() && from_process == to_process {
            return vec![rng.random_range(LOCAL_DELAY_US)];
        }
        if self.separated(from, to) {
            return Vec::new();
        }
        let f = self.faults;
        if f.loss > 0.0 && rng.random_bool(f.loss) {
            counts.bump("loss");
            return Vec::new();
        }
        let mut copies = vec![self.delay(rng, counts)];
        if f.duplication > 0.0 && rng.random_bool(f.duplication) {
            counts.bump("duplication");
            copies.push(self.delay(rng, counts));
        }
        if to_process.is_some() && to_process == self.lagging && from_process.is_some() {
            counts.bump("lagging_replica");
            for copy in &mut copies {
                *copy += rng.random_range(LAG_DELAY_US);
            }
        }
        copies
    }

    fn delay(&self, rng: &mut ChaCha8Rng, counts: &mut FaultCounts) -> Time {
        let mut delay = rng.random_range(BASE_DELAY_US);
        if self.faults.reordering > 0.0 && rng.random_bool(self.faults.reordering) {
            counts.bump("reordering");
            delay += rng.random_range(REORDER_DELAY_US);
        }
        if self.faults.delay > 0.0 && rng.random_bool(self.faults.delay) {
            counts.bump("delay");
            delay += rng.random_range(LONG_DELAY_US);
        }
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use upright_core::ids::{ClientId, ReplicaId};

    #[test]
    fn partitions_cut_only_across_and_local_hops_survive() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut counts = FaultCounts::default();
        let net = Network {
            faults: NetworkFaults {
                loss: 1.0,
                ..Default::default()
            },
            partition: Some([1].into_iter().collect()),
            lagging: None,
            exec_base: 0,
        };
        let a1 = Principal::Auth(ReplicaId(1));
        let o1 = Principal::Order(ReplicaId(1));
        let o0 = Principal::Order(ReplicaId(0));
        let c = Principal::Client(ClientId(0));
        assert_eq!(
            net.route(&mut rng, a1, o1, &mut counts).len(),
            1,
            "co-located: never lost"
        );
        assert!(net.route(&mut rng, o1, o0, &mut counts).is_empty());
        assert!(net.route(&mut rng, c, a1, &mut counts).is_empty());
        assert_eq!(counts.get("loss"), 0, "partition drops are not counted as loss");
        assert!(net.route(&mut rng, c, o0, &mut counts).is_empty());
        assert_eq!(counts.get("loss"), 1);
    }

    #[test]
    fn duplication_makes_two_copies() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let mut counts = FaultCounts::default();
        let net = Network {
            faults: NetworkFaults {
                duplication: 1.0,
                ..Default::default()
            },
            partition: None,
            lagging: None,
            exec_base: 0,
        };
        let copies = net.route(
            &mut rng,
            Principal::Order(ReplicaId(0)),
            Principal::Order(ReplicaId(1)),
            &mut counts,
        );
        assert_eq!(copies.len(), 2);
        assert_eq!(counts.get("duplication"), 1);
    }
}
