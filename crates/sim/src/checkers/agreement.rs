//! Agreement of correct replicas: equal history digests at equal sequence numbers (from order
//! members' `Committed` and execution members' `Executed` notes) and equal state digests at equal
//! checkpoints (`Checkpointed`, `StateLoaded`).

use std::collections::BTreeMap;

use upright_core::crypto::Digest;
use upright_core::ids::Principal;
use upright_core::stage::Event;

/// Most violation messages kept (the first ones are the interesting ones).
pub const VIOLATIONS_MAX: usize = 16;

/// Watches the notes of correct members.
#[derive(Default)]
pub struct Agreement {
    history: BTreeMap<u64, (Digest, Principal)>,
    state: BTreeMap<u64, (Digest, Principal)>,
    violations: Vec<String>,
}

impl Agreement {
    /// Records a note from a correct member.
    pub fn observe(&mut self, who: Principal, event: &Event) {
        match event {
            Event::Committed { seqno, history, .. } | Event::Executed { seqno, history } => {
                Self::compare(
                    &mut self.history,
                    &mut self.violations,
                    "history",
                    who,
                    seqno.0,
                    *history,
                );
            }
            Event::Checkpointed { seqno, state_digest } | Event::StateLoaded { seqno, state_digest } => {
                Self::compare(
                    &mut self.state,
                    &mut self.violations,
                    "state",
                    who,
                    seqno.0,
                    *state_digest,
                );
            }
            Event::ViewInstalled { .. }
            | Event::CheckpointStable { .. }
            | Event::Pushed { .. }
            | Event::Reconfigured { .. }
            | Event::HandingOver { .. } => {}
        }
    }

    fn compare(
        seen: &mut BTreeMap<u64, (Digest, Principal)>,
        violations: &mut Vec<String>,
        what: &str,
        who: Principal,
        seqno: u64,
        digest: Digest,
    ) {
        match seen.get(&seqno) {
            None => {
                seen.insert(seqno, (digest, who));
            }
            Some((first, first_by)) if *first != digest => {
                if violations.len() < VIOLATIONS_MAX {
                    violations.push(format!(
                        "agreement: {what} digest at seqno {seqno}: {who:?} has {digest:?}, {first_by:?} has {first:?}"
                    ));
                }
            }
            Some(_) => {}
        }
    }

    /// Highest sequence number any correct member reported.
    pub fn highest(&self) -> u64 {
        self.history.keys().next_back().copied().unwrap_or(0)
    }

    /// The violations found.
    pub fn violations(&self) -> &[String] {
        &self.violations
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use upright_core::ids::{ReplicaId, SeqNo, View};

    #[test]
    fn divergent_history_and_state_are_caught_equal_ones_are_not() {
        let mut a = Agreement::default();
        let d1 = Digest::of(b"1");
        let d2 = Digest::of(b"2");
        a.observe(
            Principal::Order(ReplicaId(0)),
            &Event::Committed {
                seqno: SeqNo(1),
                view: View(0),
                history: d1,
            },
        );
        a.observe(
            Principal::Exec(ReplicaId(1)),
            &Event::Executed {
                seqno: SeqNo(1),
                history: d1,
            },
        );
        a.observe(
            Principal::Exec(ReplicaId(2)),
            &Event::Executed {
                seqno: SeqNo(2),
                history: d2,
            },
        );
        a.observe(
            Principal::Exec(ReplicaId(0)),
            &Event::Checkpointed {
                seqno: SeqNo(8),
                state_digest: d1,
            },
        );
        a.observe(
            Principal::Exec(ReplicaId(1)),
            &Event::StateLoaded {
                seqno: SeqNo(8),
                state_digest: d1,
            },
        );
        assert!(a.violations().is_empty());
        assert_eq!(a.highest(), 2);
        a.observe(
            Principal::Order(ReplicaId(2)),
            &Event::Committed {
                seqno: SeqNo(1),
                view: View(1),
                history: d2,
            },
        );
        a.observe(
            Principal::Exec(ReplicaId(2)),
            &Event::Checkpointed {
                seqno: SeqNo(8),
                state_digest: d2,
            },
        );
        assert_eq!(a.violations().len(), 2);
        assert!(a.violations()[0].starts_with("agreement: history digest at seqno 1"));
        assert!(a.violations()[1].starts_with("agreement: state digest at seqno 8"));
    }
}
