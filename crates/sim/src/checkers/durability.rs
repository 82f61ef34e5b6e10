//! No acknowledged write is lost: the final value of each key (read through a client after the
//! quiet phase) must come from a write that does not strictly precede any acknowledged write of
//! that key. Values are unique per write, so the write that produced a value can be named.

use std::collections::BTreeMap;

use bytes::Bytes;
use upright_core::kv::{KvOperation, KvReply};

use crate::history::{describe, Operation};

/// Checks the final reads of a history against its acknowledged writes.
pub fn check(history: &[Operation]) -> Vec<String> {
    let mut finals: BTreeMap<&Bytes, &Operation> = BTreeMap::new();
    for op in history.iter().filter(|o| o.final_read && o.response.is_some()) {
        let later = finals
            .get(op.key())
            .is_none_or(|f| f.response.as_ref().unwrap().0 < op.response.as_ref().unwrap().0);
        if later {
            finals.insert(op.key(), op);
        }
    }
    let mut violations = Vec::new();
    for (key, read) in finals {
        let key_text = String::from_utf8_lossy(key);
        let Some(KvReply::Value(value)) = read.reply() else {
            violations.push(format!(
                "durability: final read of {key_text} returned no value: {}",
                describe(read)
            ));
            continue;
        };
        let writes: Vec<&Operation> = history.iter().filter(|o| o.key() == key && o.is_write()).collect();
        let acknowledged = writes.iter().filter(|w| w.response.is_some());
        let Some(value) = value else {
            if let Some(w) = acknowledged.clone().next() {
                violations.push(format!(
                    "durability: {key_text} is absent at the end, but {} was acknowledged",
                    describe(w)
                ));
            }
            continue;
        };
        let producer = writes.iter().find(|w| match &w.op {
            KvOperation::Put { value: v, .. } => *v == value,
            KvOperation::Append { value: v, .. } => value.ends_with(v),
            _ => false,
        });
        let Some(producer) = producer else {
            violations.push(format!(
                "durability: final value of {key_text} ({}) was written by nobody",
                String::from_utf8_lossy(&value)
            ));
            continue;
        };
        let produced_before = producer.response.as_ref().map(|(t, _)| *t);
        for w in acknowledged {
            if produced_before.is_some_and(|t| t < w.invoke) {
                violations.push(format!(
                    "durability: final value of {key_text} comes from {}, older than acknowledged {}",
                    describe(producer),
                    describe(w)
                ));
                break;
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use upright_core::stage::Time;

    fn op(c: u32, op: KvOperation, invoke: Time, resp: Option<(Time, KvReply)>, final_read: bool) -> Operation {
        Operation {
            client: c,
            op,
            invoke,
            response: resp.map(|(t, r)| (t, r.encode())),
            final_read,
            serializable: false,
        }
    }
    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn final_value_from_the_last_write_passes() {
        let h = vec![
            op(
                0,
                KvOperation::Put {
                    key: b("a"),
                    value: b("1"),
                },
                0,
                Some((10, KvReply::Done)),
                false,
            ),
            op(
                1,
                KvOperation::Append {
                    key: b("a"),
                    value: b("2"),
                },
                20,
                Some((30, KvReply::Value(Some(b("12"))))),
                false,
            ),
            op(
                0,
                KvOperation::Get { key: b("a") },
                40,
                Some((50, KvReply::Value(Some(b("12"))))),
                true,
            ),
        ];
        assert!(check(&h).is_empty());
    }

    #[test]
    fn lost_acknowledged_write_is_caught() {
        let h = vec![
            op(
                0,
                KvOperation::Put {
                    key: b("a"),
                    value: b("1"),
                },
                0,
                Some((10, KvReply::Done)),
                false,
            ),
            op(
                1,
                KvOperation::Put {
                    key: b("a"),
                    value: b("2"),
                },
                20,
                Some((30, KvReply::Done)),
                false,
            ),
            op(
                0,
                KvOperation::Get { key: b("a") },
                40,
                Some((50, KvReply::Value(Some(b("1"))))),
                true,
            ),
        ];
        let v = check(&h);
        assert_eq!(v.len(), 1, "{v:?}");
        assert!(v[0].contains("older than acknowledged"));
        let absent = vec![
            op(
                0,
                KvOperation::Put {
                    key: b("a"),
                    value: b("1"),
                },
                0,
                Some((10, KvReply::Done)),
                false,
            ),
            op(
                0,
                KvOperation::Get { key: b("a") },
                40,
                Some((50, KvReply::Value(None))),
                true,
            ),
        ];
        assert_eq!(check(&absent).len(), 1);
        let invented = vec![op(
            0,
            KvOperation::Get { key: b("a") },
            40,
            Some((50, KvReply::Value(Some(b("zz"))))),
            true,
        )];
        assert_eq!(check(&invented).len(), 1);
    }

    #[test]
    fn pending_or_concurrent_writes_may_win() {
        let h = vec![
            op(
                0,
                KvOperation::Put {
                    key: b("a"),
                    value: b("1"),
                },
                0,
                None,
                false,
            ),
            op(
                1,
                KvOperation::Put {
                    key: b("a"),
                    value: b("2"),
                },
                20,
                Some((30, KvReply::Done)),
                false,
            ),
            op(
                0,
                KvOperation::Get { key: b("a") },
                40,
                Some((50, KvReply::Value(Some(b("1"))))),
                true,
            ),
        ];
        assert!(check(&h).is_empty());
    }
}
