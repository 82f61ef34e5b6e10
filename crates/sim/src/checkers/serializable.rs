//! Serializable reads (`ReadPath::Serializable`, accepted on `r + 1` matching answers) may be
//! stale, so they are not checked for linearizability; what must hold is that they return a state
//! some correct replica had: every value they read is made only of values that clients wrote to
//! that key (each write's value is unique in a run, so a value names its writes) before the read
//! was answered. A value a lying replica made up, or one from another key, is caught.

use std::collections::BTreeMap;

use bytes::Bytes;
use upright_core::kv::{KvOperation, KvReply};
use upright_core::stage::Time;

use crate::history::{describe, Operation};

/// Splits a value into the written values it is made of: each starts with `<` (the workload's
/// values are `<client.n>`, some followed by padding).
fn parts(value: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=value.len() {
        if i == value.len() || value[i] == b'<' {
            out.push(&value[start..i]);
            start = i;
        }
    }
    out
}

/// Checks every answered serializable read of `history`.
pub fn check(history: &[Operation]) -> Vec<String> {
    // Key -> written value -> when its write was invoked.
    let mut written: BTreeMap<&Bytes, BTreeMap<&[u8], Time>> = BTreeMap::new();
    for op in history {
        if let KvOperation::Put { key, value } | KvOperation::Append { key, value } = &op.op {
            written.entry(key).or_default().insert(&value[..], op.invoke);
        }
    }
    let mut violations = Vec::new();
    for op in history.iter().filter(|o| o.serializable) {
        let Some((answered, _)) = op.response else { continue };
        let value = match op.reply() {
            Some(KvReply::Value(Some(v))) => v,
            Some(KvReply::Value(None)) => continue,
            _ => {
                violations.push(format!("serializable: not a read's reply: {}", describe(op)));
                continue;
            }
        };
        let writes = written.get(op.key());
        let made_up = parts(&value).into_iter().any(|part| {
            writes
                .and_then(|w| w.get(part))
                .is_none_or(|&invoked| invoked >= answered)
        });
        if made_up {
            violations.push(format!(
                "serializable: read a value no client had written to the key before: {}",
                describe(op)
            ));
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(invoke: Time, op: KvOperation, response: Option<(Time, KvReply)>, serializable: bool) -> Operation {
        Operation {
            client: 0,
            op,
            invoke,
            response: response.map(|(t, r)| (t, r.encode())),
            final_read: false,
            serializable,
        }
    }

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn read(at: Time, value: &str) -> Operation {
        let get = KvOperation::Get { key: b("k") };
        op(at, get, Some((at + 1, KvReply::Value(Some(b(value))))), true)
    }

    #[test]
    fn stale_values_pass_and_made_up_ones_are_caught() {
        let put = |t, v: &str| {
            op(
                t,
                KvOperation::Put {
                    key: b("k"),
                    value: b(v),
                },
                None,
                false,
            )
        };
        let append = |t, v: &str| {
            op(
                t,
                KvOperation::Append {
                    key: b("k"),
                    value: b(v),
                },
                None,
                false,
            )
        };
        let mut history = vec![put(10, "<0.1>"), append(20, "<1.2>---"), put(30, "<0.3>")];
        // Stale (an older state) is fine for a serializable read; so is a concatenation.
        history.push(read(40, "<0.1>"));
        history.push(read(41, "<0.1><1.2>---"));
        assert!(check(&history).is_empty(), "{:?}", check(&history));
        history.push(read(42, "byzantine"));
        history.push(read(43, "<0.1><9.9>"));
        history.push(read(5, "<0.3>")); // answered before the write was invoked
        assert_eq!(check(&history).len(), 3, "{:?}", check(&history));
    }
}
