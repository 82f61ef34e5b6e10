//! Twins (Bano, Sonnino, Chursin, Perelman and Malkhi, "Twins: BFT Systems Made Robust", 2021)
//! (`--twins`): the faulty replica runs as two processes, each a correct replica with the same
//! identity and keys, and the network decides which copy each other process talks to.
//! Equivocation then comes from correct code seeing different inputs (two primaries proposing
//! different batches for one sequence number, two backups voting in different views, two
//! execution members with different progress), not from hand-written behaviour.
//!
//! Like Twins' scenario generator, the run is cut into rounds; each round of the fault phase
//! draws two sides: the first copy is on one, the second copy on the other (or, in a third of
//! the rounds, on the same one), and every other replica and every client on either. In about
//! half of the rounds the correct processes of the two sides are also separated from each other.
//! A message to the twin reaches every copy on the sender's side (none, if both copies are on
//! the other side); a copy's messages reach only its side. When the faults heal the last sides
//! stay as they are but the partition between correct processes ends, so the cluster of correct
//! replicas can make progress with the twin as one more faulty member.

use rand::Rng;
use rand_chacha::ChaCha8Rng;
use upright_core::ids::Principal;
use upright_core::stage::Time;

/// Shortest round of the fault phase (virtual microseconds).
pub const ROUND_US_MIN: Time = 50_000;
/// Longest round of the fault phase.
pub const ROUND_US_MAX: Time = 400_000;
/// Probability that a round also separates the correct processes of the two sides.
pub const PARTITION_PROBABILITY: f64 = 0.5;
/// Probability that a round puts both copies on the same side (whose processes then hear both).
pub const TOGETHER_PROBABILITY: f64 = 1.0 / 3.0;

/// A process that sends or receives: a replica process (by index: `0..n` are the replicas with
/// the identity of their index, `n` is the twin's second copy) or a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// Replica process by index.
    Replica(u32),
    /// Client by id.
    Client(u32),
}

/// The twinned replica and the current round's sides.
#[derive(Clone, Debug)]
pub struct Twins {
    /// The identity both copies run as (its first copy is the replica process of that index).
    pub identity: u32,
    /// Process index of the second copy.
    pub copy: u32,
    /// Per replica process index (the copies included): on the second copy's side.
    replica_side: Vec<bool>,
    /// Per client: on the second copy's side.
    client_side: Vec<bool>,
    /// Whether correct processes on different sides are separated this round.
    partitioned: bool,
}

impl Twins {
    /// Twins of replica `identity` among `n_replicas`, with `clients` clients (the Byzantine one
    /// included); the second copy is process `n_replicas`. Until the first round every process
    /// is on the first copy's side.
    pub fn new(identity: u32, n_replicas: usize, clients: usize) -> Twins {
        let mut replica_side = vec![false; n_replicas + 1];
        replica_side[n_replicas] = true;
        Twins {
            identity,
            copy: n_replicas as u32,
            replica_side,
            client_side: vec![false; clients],
            partitioned: false,
        }
    }

    /// Whether replica process `p` is one of the two copies.
    pub fn is_copy(&self, p: u32) -> bool {
        p == self.identity || p == self.copy
    }

    /// Draws the sides of a new round; `healed`: the fault phase is over (the sides stay, the
    /// partition between correct processes ends). Returns whether the round separates the
    /// correct processes.
    pub fn new_round(&mut self, rng: &mut ChaCha8Rng, healed: bool) -> bool {
        if healed {
            self.partitioned = false;
            return false;
        }
        let (identity, copy) = (self.identity as usize, self.copy as usize);
        let together = rng.random_bool(TOGETHER_PROBABILITY);
        for (p, side) in self.replica_side.iter_mut().enumerate() {
            *side = match p {
                _ if p == identity => false,
                _ if p == copy => !together,
                _ => rng.random_bool(0.5),
            };
        }
        for side in &mut self.client_side {
            *side = rng.random_bool(0.5);
        }
        self.partitioned = rng.random_bool(PARTITION_PROBABILITY);
        self.partitioned
    }

    /// The length of the next round.
    pub fn round_length(rng: &mut ChaCha8Rng) -> Time {
        rng.random_range(ROUND_US_MIN..=ROUND_US_MAX)
    }

    fn side(&self, node: Node) -> bool {
        match node {
            Node::Replica(p) => self.replica_side.get(p as usize).copied().unwrap_or(false),
            Node::Client(c) => self.client_side.get(c as usize).copied().unwrap_or(false),
        }
    }

    /// The replica processes a message from `from` to a member of replica `to_replica` goes
    /// to: when that is the twin, each copy on the sender's side (the sender's own copy for a
    /// co-located member), else the replica of that identity.
    pub fn destinations(&self, from: Node, to_replica: u32) -> Vec<u32> {
        if to_replica != self.identity {
            return vec![to_replica];
        }
        match from {
            Node::Replica(p) if self.is_copy(p) => vec![p],
            _ => [self.identity, self.copy]
                .into_iter()
                .filter(|&c| self.side(Node::Replica(c)) == self.side(from))
                .collect(),
        }
    }

    /// Whether a message from `from` reaches `to` this round: a copy reaches only its side, and
    /// in a partitioned round correct processes reach only their side.
    pub fn connected(&self, from: Node, to: Node) -> bool {
        let copy = |n: Node| matches!(n, Node::Replica(p) if self.is_copy(p));
        if copy(from) || copy(to) || self.partitioned {
            return self.side(from) == self.side(to);
        }
        true
    }

    /// The node `principal` is, at replica process `process` if it is a member.
    pub fn node(principal: Principal, process: u32) -> Node {
        match principal {
            Principal::Client(c) => Node::Client(c.0),
            _ => Node::Replica(process),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn each_process_talks_to_the_copy_on_its_side_only() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut twins = Twins::new(1, 4, 2);
        let (mut split, mut together) = (0, 0);
        for _ in 0..60 {
            let partitioned = twins.new_round(&mut rng, false);
            let apart = twins.side(Node::Replica(1)) != twins.side(Node::Replica(twins.copy));
            if apart {
                split += 1;
            } else {
                together += 1;
            }
            for p in [0u32, 2, 3] {
                let copies = twins.destinations(Node::Replica(p), 1);
                assert!(copies.iter().all(|&c| twins.is_copy(c)));
                for c in [1, twins.copy] {
                    let reached = copies.contains(&c);
                    assert_eq!(twins.connected(Node::Replica(p), Node::Replica(c)), reached);
                    assert_eq!(twins.connected(Node::Replica(c), Node::Replica(p)), reached);
                }
                if apart {
                    assert_eq!(copies.len(), 1, "exactly one copy on each side");
                }
                for q in [0u32, 2, 3] {
                    let same = twins.side(Node::Replica(p)) == twins.side(Node::Replica(q));
                    assert_eq!(
                        twins.connected(Node::Replica(p), Node::Replica(q)),
                        same || !partitioned,
                        "{p} -> {q}"
                    );
                }
            }
            // Co-located members stay with their own copy.
            assert_eq!(twins.destinations(Node::Replica(twins.copy), 1), vec![twins.copy]);
            assert_eq!(twins.destinations(Node::Replica(1), 1), vec![1]);
            assert_eq!(twins.destinations(Node::Replica(0), 2), vec![2]);
        }
        assert!(split > 20 && together > 10, "{split} split rounds, {together} together");
        twins.new_round(&mut rng, true);
        for p in [0u32, 2, 3] {
            for q in [0u32, 2, 3] {
                assert!(twins.connected(Node::Replica(p), Node::Replica(q)), "healed");
            }
        }
    }
}
