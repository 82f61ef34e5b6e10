//! Fair queues: one bounded FIFO per key (a sending process), served round-robin, so that a key
//! that floods fills only its own queue and gets only its turn (Aardvark's isolation). The
//! runtime's inbox (`upright-node`'s `transport::Inbox`) keeps its waiting envelopes in one, and
//! the simulator's busy replicas keep theirs the same way.

use std::collections::{BTreeMap, VecDeque};

/// One bounded FIFO per key, served round-robin.
#[derive(Debug)]
pub struct FairQueues<K, T> {
    queues: BTreeMap<K, VecDeque<T>>,
    /// Keys with a non-empty queue, in service order.
    ring: VecDeque<K>,
    total: usize,
    per_key_max: usize,
}

impl<K: Ord + Copy, T> FairQueues<K, T> {
    /// Empty queues of at most `per_key_max` items each.
    pub fn new(per_key_max: usize) -> FairQueues<K, T> {
        FairQueues {
            queues: BTreeMap::new(),
            ring: VecDeque::new(),
            total: 0,
            per_key_max,
        }
    }

    /// Queues `item` under `key`; false (not queued) when that key's queue is full.
    pub fn push(&mut self, key: K, item: T) -> bool {
        self.push_many(key, std::iter::once(item)).0 == 1
    }

    /// Queues `items` under `key` (one lookup for all) while its queue has room; returns how many
    /// were queued and how many were not (the queue was full).
    pub fn push_many(&mut self, key: K, items: impl IntoIterator<Item = T>) -> (usize, usize) {
        let queue = self.queues.entry(key).or_default();
        let was_empty = queue.is_empty();
        let (mut queued, mut refused) = (0, 0);
        for item in items {
            if queue.len() < self.per_key_max {
                queue.push_back(item);
                queued += 1;
            } else {
                refused += 1;
            }
        }
        if was_empty && queued > 0 {
            self.ring.push_back(key);
        }
        self.total += queued;
        (queued, refused)
    }

    /// The next item of the next key in turn.
    pub fn pop(&mut self) -> Option<(K, T)> {
        let key = self.ring.pop_front()?;
        let queue = self.queues.get_mut(&key).expect("the ring lists only queued keys");
        let item = queue.pop_front().expect("the ring lists only non-empty queues");
        if !queue.is_empty() {
            self.ring.push_back(key);
        }
        self.total -= 1;
        Some((key, item))
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Drops everything waiting.
    pub fn clear(&mut self) {
        self.queues.clear();
        self.ring.clear();
        self.total = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_served_in_turn_and_only_a_full_key_refuses() {
        let mut q = FairQueues::new(2);
        assert!(q.push('a', 1) && q.push('a', 2));
        assert!(!q.push('a', 3), "a's queue is full");
        assert!(q.push('b', 10));
        assert_eq!(q.len(), 3);
        let order: Vec<(char, i32)> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![('a', 1), ('b', 10), ('a', 2)]);
        assert!(q.is_empty());
        q.push('c', 0);
        q.clear();
        assert_eq!(q.pop(), None);
    }
}
