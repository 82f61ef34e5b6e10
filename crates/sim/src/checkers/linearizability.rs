//! Linearizability of the correct clients' histories over the key-value model, checked per key
//! (P-compositionality) with a Wing-Gong search memoised on (set of linearized operations, model
//! state), as in Lowe's and Porcupine's checkers.
//!
//! An operation that never got a response may or may not have taken effect: it can be linearized
//! anywhere after its invocation, or not at all. The search has a step budget; a key whose search
//! exceeds it is reported "undecided", which counts as a violation so that it is noticed.

use std::collections::{BTreeMap, HashSet};

use bytes::Bytes;
use upright_core::kv::{KvOperation, KvReply};
use upright_core::stage::Time;

use crate::history::{describe, Operation};

/// Search steps allowed per key.
pub const STEPS_PER_KEY_MAX: u64 = 2_000_000;

struct KeyOp {
    invoke: Time,
    /// `Time::MAX` when pending.
    response: Time,
    op: KvOperation,
    /// `None` when pending: any output is accepted.
    output: Option<KvReply>,
}

/// The key-value model applied to one key's value: new value and the reply.
fn apply(value: &Option<Bytes>, op: &KvOperation) -> (Option<Bytes>, KvReply) {
    match op {
        KvOperation::Get { .. } => (value.clone(), KvReply::Value(value.clone())),
        KvOperation::Put { value: v, .. } => (Some(v.clone()), KvReply::Done),
        KvOperation::Append { value: v, .. } => {
            let mut joined = value.as_ref().map(|b| b.to_vec()).unwrap_or_default();
            joined.extend_from_slice(v);
            let joined = Bytes::from(joined);
            (Some(joined.clone()), KvReply::Value(Some(joined)))
        }
        KvOperation::Delete { .. } => (None, KvReply::Done),
        KvOperation::Burn { micros, .. } => {
            let burnt = upright_core::kv::burn(value.as_deref(), *micros);
            (Some(burnt.clone()), KvReply::Value(Some(burnt)))
        }
    }
}

struct Search {
    ops: Vec<KeyOp>,
    linearized: Vec<u64>,
    seen: HashSet<(Vec<u64>, Option<Bytes>)>,
    steps: u64,
}

enum Outcome {
    Linearizable,
    NotLinearizable,
    Undecided,
}

impl Search {
    fn is_done(&self, i: usize) -> bool {
        self.linearized[i / 64] & (1 << (i % 64)) != 0
    }

    fn flip(&mut self, i: usize) {
        self.linearized[i / 64] ^= 1 << (i % 64);
    }

    /// Depth-first search; `remaining` = completed operations not yet linearized.
    fn dfs(&mut self, value: Option<Bytes>, remaining: usize) -> Result<bool, ()> {
        if remaining == 0 {
            return Ok(true);
        }
        if !self.seen.insert((self.linearized.clone(), value.clone())) {
            return Ok(false);
        }
        self.steps += 1;
        if self.steps > STEPS_PER_KEY_MAX {
            return Err(());
        }
        // An operation can go next only if no unlinearized operation finished before it began.
        let horizon = (0..self.ops.len())
            .filter(|&i| !self.is_done(i))
            .map(|i| self.ops[i].response)
            .min()
            .unwrap_or(Time::MAX);
        for i in 0..self.ops.len() {
            if self.ops[i].invoke > horizon {
                break; // sorted by invocation
            }
            if self.is_done(i) {
                continue;
            }
            let (next, reply) = apply(&value, &self.ops[i].op);
            if self.ops[i].output.as_ref().is_some_and(|o| *o != reply) {
                continue;
            }
            let completed = self.ops[i].output.is_some() as usize;
            self.flip(i);
            let found = self.dfs(next, remaining - completed)?;
            self.flip(i);
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }
}

fn check_key(ops: Vec<KeyOp>) -> Outcome {
    let remaining = ops.iter().filter(|o| o.output.is_some()).count();
    let words = ops.len().div_ceil(64).max(1);
    let mut search = Search {
        ops,
        linearized: vec![0; words],
        seen: HashSet::new(),
        steps: 0,
    };
    match search.dfs(None, remaining) {
        Ok(true) => Outcome::Linearizable,
        Ok(false) => Outcome::NotLinearizable,
        Err(()) => Outcome::Undecided,
    }
}

/// Checks a history; returns one violation message per failing key.
pub fn check(history: &[Operation]) -> Vec<String> {
    let mut by_key: BTreeMap<Bytes, Vec<&Operation>> = BTreeMap::new();
    let mut violations = Vec::new();
    // Serializable reads may rightly be stale: the serializable checker looks at them.
    for op in history.iter().filter(|o| !o.serializable) {
        if op.response.is_some() && op.reply().is_none() {
            violations.push(format!("linearizability: undecodable reply: {}", describe(op)));
            continue;
        }
        by_key.entry(op.key().clone()).or_default().push(op);
    }
    for (key, mut ops) in by_key {
        ops.sort_by_key(|o| o.invoke);
        let key_ops = ops
            .iter()
            .map(|o| KeyOp {
                invoke: o.invoke,
                response: o.response.as_ref().map_or(Time::MAX, |(t, _)| *t),
                op: o.op.clone(),
                output: o.reply(),
            })
            .collect();
        let key_text = String::from_utf8_lossy(&key).into_owned();
        match check_key(key_ops) {
            Outcome::Linearizable => {}
            Outcome::NotLinearizable => {
                let tail: Vec<String> = ops.iter().rev().take(8).rev().map(|o| describe(o)).collect();
                violations.push(format!(
                    "linearizability: key {key_text}: {} operations are not linearizable; last ones: [{}]",
                    ops.len(),
                    tail.join("; ")
                ));
            }
            Outcome::Undecided => violations.push(format!(
                "linearizability: key {key_text}: undecided after {STEPS_PER_KEY_MAX} steps ({} operations)",
                ops.len()
            )),
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(client: u32, op: KvOperation, invoke: Time, response: Option<(Time, KvReply)>) -> Operation {
        Operation {
            client,
            op,
            invoke,
            response: response.map(|(t, r)| (t, r.encode())),
            final_read: false,
            serializable: false,
        }
    }
    fn get(k: &str) -> KvOperation {
        KvOperation::Get {
            key: Bytes::copy_from_slice(k.as_bytes()),
        }
    }
    fn put(k: &str, v: &str) -> KvOperation {
        KvOperation::Put {
            key: Bytes::copy_from_slice(k.as_bytes()),
            value: Bytes::copy_from_slice(v.as_bytes()),
        }
    }
    fn append(k: &str, v: &str) -> KvOperation {
        KvOperation::Append {
            key: Bytes::copy_from_slice(k.as_bytes()),
            value: Bytes::copy_from_slice(v.as_bytes()),
        }
    }
    fn val(v: &str) -> KvReply {
        KvReply::Value(Some(Bytes::copy_from_slice(v.as_bytes())))
    }

    #[test]
    fn sequential_history_is_linearizable() {
        let h = vec![
            op(0, put("a", "1"), 0, Some((10, KvReply::Done))),
            op(1, get("a"), 20, Some((30, val("1")))),
            op(0, append("a", "2"), 40, Some((50, val("12")))),
            op(1, get("b"), 60, Some((70, KvReply::Value(None)))),
        ];
        assert!(check(&h).is_empty());
    }

    #[test]
    fn stale_read_is_caught() {
        let h = vec![
            op(0, put("a", "1"), 0, Some((10, KvReply::Done))),
            op(0, put("a", "2"), 20, Some((30, KvReply::Done))),
            op(1, get("a"), 40, Some((50, val("1")))),
        ];
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("key a"));
    }

    #[test]
    fn concurrent_operations_may_take_effect_in_either_order() {
        let h = vec![
            op(0, append("a", "x"), 0, Some((100, val("yx")))),
            op(1, append("a", "y"), 10, Some((90, val("y")))),
            op(2, get("a"), 20, Some((50, val("y")))),
            op(2, get("a"), 110, Some((120, val("yx")))),
        ];
        assert!(check(&h).is_empty());
    }

    #[test]
    fn lost_acknowledged_append_is_caught() {
        let h = vec![
            op(0, append("a", "x"), 0, Some((10, val("x")))),
            op(1, append("a", "y"), 20, Some((30, val("y")))),
        ];
        assert_eq!(check(&h).len(), 1);
    }

    #[test]
    fn pending_write_may_or_may_not_take_effect() {
        let took = vec![
            op(0, put("a", "1"), 0, None),
            op(1, get("a"), 50, Some((60, val("1")))),
            op(1, get("a"), 70, Some((80, val("1")))),
        ];
        assert!(check(&took).is_empty());
        let did_not = vec![
            op(0, put("a", "1"), 0, None),
            op(1, get("a"), 50, Some((60, KvReply::Value(None)))),
        ];
        assert!(check(&did_not).is_empty());
        // But it cannot take effect before it was invoked.
        let too_early = vec![op(1, get("a"), 0, Some((10, val("1")))), op(0, put("a", "1"), 20, None)];
        assert_eq!(check(&too_early).len(), 1);
        // And a value cannot disappear again.
        let flicker = vec![
            op(0, put("a", "1"), 0, None),
            op(1, get("a"), 50, Some((60, val("1")))),
            op(1, get("a"), 70, Some((80, KvReply::Value(None)))),
        ];
        assert_eq!(check(&flicker).len(), 1);
    }

    #[test]
    fn keys_are_checked_separately_and_wrong_reply_kinds_fail() {
        let h = vec![
            op(0, put("a", "1"), 0, Some((10, KvReply::Done))),
            op(1, put("b", "2"), 0, Some((10, val("2")))),
        ];
        let v = check(&h);
        assert_eq!(v.len(), 1);
        assert!(v[0].contains("key b"));
        let garbage = vec![Operation {
            client: 0,
            op: get("a"),
            invoke: 0,
            response: Some((1, Bytes::from_static(b"\xff\xff\xff"))),
            final_read: false,
            serializable: false,
        }];
        assert_eq!(check(&garbage).len(), 1);
    }

    #[test]
    fn many_concurrent_clients_stay_within_budget() {
        // 4 clients, 60 rounds of overlapping appends and reads each on one key.
        let mut h = Vec::new();
        let mut value = String::new();
        for round in 0..60u64 {
            let base = round * 100;
            let mut expected = Vec::new();
            for c in 0..4u32 {
                let s = format!("<{c}.{round}>");
                value.push_str(&s);
                expected.push((c, s, value.clone()));
            }
            for (c, s, after) in expected {
                h.push(op(
                    c,
                    append("k", &s),
                    base + c as u64,
                    Some((base + 50 + c as u64, val(&after))),
                ));
            }
        }
        assert!(check(&h).is_empty());
    }
}
