//! Progress after the faults heal: every correct client completes a new operation within a bound
//! after the heal point, and the final reads complete.

use upright_core::stage::Time;

use crate::history::{describe, Operation};

/// Virtual time after the heal point within which every correct client must complete an operation
/// (view-change timeouts double, so this leaves a wide margin).
pub const PROGRESS_BOUND_US: Time = 10_000_000;

/// Checks progress of `clients` after `heal_at`.
pub fn check(history: &[Operation], clients: &[u32], heal_at: Time) -> Vec<String> {
    let mut violations = Vec::new();
    for &c in clients {
        let progressed = history.iter().any(|o| {
            o.client == c
                && o.response
                    .as_ref()
                    .is_some_and(|(t, _)| *t > heal_at && *t <= heal_at + PROGRESS_BOUND_US)
        });
        if !progressed {
            violations.push(format!(
                "liveness: client {c} completed no operation within {} ms after the heal point ({} ms)",
                PROGRESS_BOUND_US / 1000,
                heal_at / 1000
            ));
        }
    }
    if let Some(stuck) = history.iter().find(|o| o.final_read && o.response.is_none()) {
        violations.push(format!("liveness: final read did not complete: {}", describe(stuck)));
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use upright_core::kv::{KvOperation, KvReply};

    fn get(c: u32, invoke: Time, resp: Option<Time>, final_read: bool) -> Operation {
        Operation {
            client: c,
            op: KvOperation::Get {
                key: Bytes::from_static(b"a"),
            },
            invoke,
            response: resp.map(|t| (t, KvReply::Value(None).encode())),
            final_read,
            serializable: false,
        }
    }

    #[test]
    fn progress_after_heal_is_required() {
        let ok = vec![
            get(0, 0, Some(5), false),
            get(0, 1000, Some(1100), true),
            get(1, 900, Some(1200), false),
        ];
        assert!(check(&ok, &[0, 1], 1000).is_empty());
        let stuck = vec![get(0, 0, Some(5), false), get(1, 900, None, false)];
        assert_eq!(check(&stuck, &[0, 1], 1000).len(), 2);
        let final_pending = vec![get(0, 1000, Some(1100), false), get(0, 1200, None, true)];
        let v = check(&final_pending, &[0], 1000);
        assert_eq!(v.len(), 1);
        assert!(v[0].contains("final read"));
    }
}
