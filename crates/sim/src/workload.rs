//! The clients' random key-value workload and the history it produces.

use std::collections::BTreeMap;

use bytes::Bytes;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use upright_core::kv::KvOperation;
use upright_core::stage::Time;

use crate::history::Operation;

/// Closed-loop workload of the correct clients: random Get/Put/Append over a few keys, with
/// values unique across the run (so a value names the write that produced it), then one final
/// read of every key per client.
pub struct Workload {
    keys: Vec<Bytes>,
    /// Every operation invoked so far.
    pub history: Vec<Operation>,
    outstanding: BTreeMap<u32, usize>,
    final_reads: BTreeMap<u32, usize>,
    next_value: u64,
}

impl Workload {
    /// A workload over `keys` keys named `k0`, `k1`, ...
    pub fn new(keys: u32) -> Workload {
        Workload {
            keys: (0..keys.max(1)).map(|k| Bytes::from(format!("k{k}"))).collect(),
            history: Vec::new(),
            outstanding: BTreeMap::new(),
            final_reads: BTreeMap::new(),
            next_value: 0,
        }
    }

    /// A random operation for `client`; some values are long enough to travel by digest.
    pub fn random_op(&mut self, rng: &mut ChaCha8Rng, client: u32) -> KvOperation {
        let key = self.keys[rng.random_range(0..self.keys.len())].clone();
        self.next_value += 1;
        let mut value = format!("<{client}.{}>", self.next_value);
        match rng.random_range(0..10) {
            0..=2 => KvOperation::Get { key },
            3..=5 => {
                if rng.random_bool(0.25) {
                    value.push_str(&"-".repeat(600)); // past the inline request and small reply sizes
                }
                KvOperation::Put {
                    key,
                    value: Bytes::from(value),
                }
            }
            _ => KvOperation::Append {
                key,
                value: Bytes::from(value),
            },
        }
    }

    /// The next final read of `client`, or `None` when it has read every key.
    pub fn next_final_read(&mut self, client: u32) -> Option<KvOperation> {
        let index = self.final_reads.entry(client).or_insert(0);
        let key = self.keys.get(*index)?.clone();
        *index += 1;
        Some(KvOperation::Get { key })
    }

    /// Whether `client` finished its final reads.
    pub fn finished(&self, client: u32) -> bool {
        self.final_reads.get(&client).is_some_and(|&i| i >= self.keys.len()) && !self.busy(client)
    }

    /// Whether some client still has an operation of the random workload (not a final read)
    /// outstanding.
    pub fn workload_outstanding(&self) -> bool {
        self.outstanding.values().any(|&i| !self.history[i].final_read)
    }

    /// Whether `client` has an operation outstanding.
    pub fn busy(&self, client: u32) -> bool {
        self.outstanding.contains_key(&client)
    }

    /// Records an invocation.
    pub fn invoke(&mut self, client: u32, op: KvOperation, now: Time, final_read: bool, serializable: bool) {
        self.outstanding.insert(client, self.history.len());
        self.history.push(Operation {
            client,
            op,
            invoke: now,
            response: None,
            final_read,
            serializable,
        });
    }

    /// The operation `client` has outstanding, if any.
    pub fn outstanding_op(&self, client: u32) -> Option<&Operation> {
        self.outstanding.get(&client).map(|&i| &self.history[i])
    }

    /// Records a delivered result, in the model's encoding as `translate` makes it from the
    /// operation; false if nothing was outstanding (a protocol error).
    pub fn complete(&mut self, client: u32, now: Time, translate: impl FnOnce(&KvOperation) -> Bytes) -> bool {
        match self.outstanding.remove(&client) {
            Some(i) => {
                let result = translate(&self.history[i].op);
                self.history[i].response = Some((now, result));
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn values_are_unique_and_final_reads_cover_every_key() {
        let mut w = Workload::new(3);
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        let mut values = std::collections::BTreeSet::new();
        for i in 0..200 {
            match w.random_op(&mut rng, i % 3) {
                KvOperation::Put { value, .. } | KvOperation::Append { value, .. } => assert!(values.insert(value)),
                _ => {}
            }
        }
        let mut finals = 0;
        while let Some(op) = w.next_final_read(1) {
            w.invoke(1, op, 5, true, false);
            assert!(!w.finished(1));
            assert!(w.complete(1, 6, |_| Bytes::new()));
            finals += 1;
        }
        assert_eq!(finals, 3);
        assert!(w.finished(1));
        assert!(!w.complete(1, 7, |_| Bytes::new()));
    }
}
