//! Stage sizes and every quorum, computed in one place from `u` and `r` (UpRight thesis ch. 6).
//!
//! Notation: the cluster is *up* (live) despite up to `u` failures of any kind and *right* (safe)
//! despite up to `r` commission (Byzantine) failures, `u >= r`. In a stage of `n` members:
//! small = `r + 1` (contains at least one correct member), medium = `n - u` (still reachable with
//! `u` members down), large = `n`.

use crate::ids::{Principal, Process, ReplicaId};
use crate::limits::MAX_FAULTS;

/// Why `(u, r)` is not a fault model upright supports.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FaultModelError {
    /// `r > u`.
    #[error("r = {r} exceeds u = {u}: the cluster cannot be right despite more failures than it stays up despite (need u >= r)")]
    RExceedsU {
        /// u
        u: usize,
        /// r
        r: usize,
    },
    /// `u` is too large.
    #[error("u = {u} is larger than the supported maximum {max}")]
    TooManyFaults {
        /// u
        u: usize,
        /// maximum
        max: usize,
    },
}

/// Sizes of the three stages and every quorum the protocol uses, derived from `(u, r)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quorums {
    /// Failures of any kind tolerated while staying live.
    pub u: usize,
    /// Commission failures tolerated while staying safe.
    pub r: usize,
    /// Authentication members: `u + max(u, r) + r + 1` (thesis Table 6.1), which is `2u + r + 1`
    /// because `u >= r`. Enough that `u + r + 1` matrix-signature rows can be collected with `u`
    /// members down, of which `r` may be lies.
    pub n_auth: usize,
    /// Order members: `2u + r + 1` (thesis Table 2.1, UpRight acceptors), so two medium quorums
    /// intersect in `r + 1` members, at least one of them correct.
    pub n_order: usize,
    /// Execution members: `u_exec + max(u_exec, r) + 1` (thesis Table 6.1): indirect learning of
    /// a checkpoint hash needs `max(u_exec, r) + 1` matching tokens from members that stay up.
    pub n_exec: usize,
    /// Failures of any kind the execution stage tolerates while staying live: `u` unless the
    /// stages run in processes of their own ([`Quorums::with_separate_stages`]), where the
    /// execution stage may be sized for more (UpRight ran ZooKeeper's execution at `u = 3`
    /// beside ordering at `u = 2`).
    pub u_exec: usize,
    /// Whether the execution members run in processes of their own (docs/ODRC.md "Separated
    /// stages"): replicas `0 .. n_order` host an authentication and an order member, replicas
    /// `n_order .. n_order + n_exec` one execution member each.
    pub separate_stages: bool,
}

impl Quorums {
    /// Computes the sizes for `(u, r)`. Fails when `r > u` (the model requires `u >= r`).
    pub fn new(u: usize, r: usize) -> Result<Quorums, FaultModelError> {
        if r > u {
            return Err(FaultModelError::RExceedsU { u, r });
        }
        if u > MAX_FAULTS {
            return Err(FaultModelError::TooManyFaults { u, max: MAX_FAULTS });
        }
        let max_ur = u.max(r);
        Ok(Quorums {
            u,
            r,
            n_auth: u + max_ur + r + 1,
            n_order: 2 * u + r + 1,
            n_exec: u + max_ur + 1,
            u_exec: u,
            separate_stages: false,
        })
    }

    /// These sizes with the execution members in processes of their own, sized for `u_exec`
    /// failures (`u_exec >= u`, at most [`MAX_FAULTS`]): `n_exec = u_exec + max(u_exec, r) + 1`.
    pub fn with_separate_stages(mut self, u_exec: usize) -> Result<Quorums, FaultModelError> {
        if u_exec > MAX_FAULTS {
            return Err(FaultModelError::TooManyFaults {
                u: u_exec,
                max: MAX_FAULTS,
            });
        }
        let u_exec = u_exec.max(self.u);
        self.u_exec = u_exec;
        self.n_exec = u_exec + u_exec.max(self.r) + 1;
        self.separate_stages = true;
        Ok(self)
    }

    /// The process that hosts `principal` (and holds its keys): replica `i` for authentication
    /// and order member `i`; for execution member `i`, replica `i` when the stages share
    /// processes and replica `n_order + i` when they do not ([`Quorums::separate_stages`]).
    pub fn process_of(&self, principal: Principal) -> Process {
        principal.process_at(self.exec_process_base())
    }

    /// The first replica process hosting an execution member: 0, or `n_order` with separate
    /// stages.
    pub fn exec_process_base(&self) -> u32 {
        if self.separate_stages {
            self.n_order as u32
        } else {
            0
        }
    }

    /// Whether `a` and `b` are hosted by one process (correct or faulty together, one key ring).
    pub fn co_located(&self, a: Principal, b: Principal) -> bool {
        self.process_of(a) == self.process_of(b)
    }

    /// The members replica process `replica` hosts, authentication first.
    pub fn members_of(&self, replica: ReplicaId) -> Vec<Principal> {
        let i = replica.0 as usize;
        if self.separate_stages {
            if i < self.n_order {
                vec![Principal::Auth(replica), Principal::Order(replica)]
            } else if i < self.n_order + self.n_exec {
                vec![Principal::Exec(ReplicaId(replica.0 - self.n_order as u32))]
            } else {
                Vec::new()
            }
        } else {
            let mut members = Vec::new();
            if i < self.n_auth {
                members.push(Principal::Auth(replica));
            }
            if i < self.n_order {
                members.push(Principal::Order(replica));
            }
            if i < self.n_exec {
                members.push(Principal::Exec(replica));
            }
            members
        }
    }

    /// The member of replica process `replica` that runs its key schedule and takes NEW-KEYs
    /// (`crate::session::ReplicaKeys`): its authentication member, or the execution member of an
    /// execution-only process.
    pub fn key_member(&self, replica: ReplicaId) -> Option<Principal> {
        self.members_of(replica).first().copied()
    }

    /// The key member of every replica process, in index order (whom a client's NEW-KEY goes to).
    pub fn key_members(&self) -> impl Iterator<Item = Principal> + '_ {
        (0..self.n_replicas() as u32).filter_map(|r| self.key_member(ReplicaId(r)))
    }

    /// These sizes with an execution member on every replica (`n_exec = n_order`), as Aliph's
    /// Quorum runs (`protocol = "quorum"`, [`crate::config::OrderProtocol::quorums`]): a client
    /// commits there on matching speculative replies from every order member
    /// (`speculative_reply`).
    pub fn with_exec_on_every_replica(mut self) -> Quorums {
        self.n_exec = self.n_order;
        self
    }

    /// Speculative reply quorum under Aliph's Quorum (`protocol = "quorum"`): matching
    /// TENTATIVE-REPLYs (same result, view and history) from every execution member, one per
    /// order member ([`Quorums::with_exec_on_every_replica`]). Each executed the request speculatively at the
    /// same position of the same history, written before it executed, so every view-change
    /// quorum (`order_medium`) holds at least `order_medium - r >= r + 1` correct members that
    /// report that history and the view change keeps it (`order::view_change::select`). Quéma's
    /// Q3: all `3f + 1` replies.
    pub fn speculative_reply(&self) -> usize {
        self.n_exec
    }

    /// Number of replica processes: every replica hosts an authentication and an order member;
    /// the first `n_exec` also host an execution member. With separate stages, `n_order`
    /// replicas host authentication and order, and `n_exec` more one execution member each.
    pub fn n_replicas(&self) -> usize {
        if self.separate_stages {
            self.n_order.max(self.n_auth) + self.n_exec
        } else {
            self.n_order.max(self.n_auth).max(self.n_exec)
        }
    }

    /// Small quorum, `r + 1`: any such set contains a correct member, so `r + 1` matching
    /// messages prove a fact vouched for by a correct member (client replies, NEXT-BATCH at the
    /// execution stage, LOAD-CP, view-change join).
    pub fn small(&self) -> usize {
        self.r + 1
    }

    /// The order primary of `view`: `Order(view mod n_order)`.
    pub fn primary(&self, view: crate::ids::View) -> crate::ids::ReplicaId {
        crate::ids::ReplicaId((view.0 % self.n_order as u64) as u32)
    }

    /// Order-stage medium quorum, `n_order - u`: prepare, commit, view change, stable checkpoint.
    /// Two such quorums intersect in `2(n - u) - n = r + 1` members, one of them correct, and the
    /// quorum is reachable with `u` members down.
    pub fn order_medium(&self) -> usize {
        self.n_order - self.u
    }

    /// Client reply quorum: `r + 1` matching replies from distinct execution members; at least one
    /// is from a correct member that executed the agreed batch. Reachable: `n_exec - u >= r + 1`.
    pub fn reply(&self) -> usize {
        self.r + 1
    }

    /// Tentative reply quorum (PBFT thesis 5.1.3, tentative execution): matching TENTATIVE-REPLYs
    /// (same result digest, view and history) from this many distinct execution members before a
    /// client accepts a result that is not yet committed: `order_medium() = u + r + 1`.
    ///
    /// Execution member `i` executes a batch tentatively only once its co-located order member
    /// (one process with it) has prepared the batch in that view and synced the prepared
    /// certificate, with every batch before it committed. So the replies show `u + r + 1` order
    /// members prepared the batch in one view, of which at most `r` lie: exactly what a commit
    /// certificate (`order_medium` COMMITs, each sent only after preparing) shows, and the view
    /// change keeps such a batch (PROTOCOL.md "View change"). Reachable only while `u + r + 1`
    /// execution members are up (`n_exec = 2u + 1` of them, so all of them at `u = r`); otherwise
    /// the client waits for `reply()` committed replies, which every execution member also sends
    /// once the batch commits.
    pub fn tentative_reply(&self) -> usize {
        self.order_medium()
    }

    /// Read-only reply quorum `q_r`: matching read-only replies, each with a full body, from this
    /// many distinct execution members before a client accepts a read-only result.
    ///
    /// Writes are acknowledged on `q_w = reply() = r + 1` replies, so a read is linearizable when
    /// every read quorum meets every write quorum in `r + 1` members (one of them correct):
    /// `q_w + q_r >= n_exec + r + 1`, hence `q_r = n_exec`: every execution member. Then every correct
    /// member answered with the same result, in particular the most advanced one, whose state
    /// includes every write acknowledged before the read began (some correct member of that write's
    /// quorum executed it) and every read result delivered before (its state only grows); the
    /// result is the value at that state, committed before the reply. Not reachable with a member
    /// down: the client then falls back to the ordered path (liveness comes from there).
    pub fn read_only(&self) -> usize {
        self.n_exec + self.r + 1 - self.reply()
    }

    /// Matching copies of a pushed message (same sequence number and payload) from distinct
    /// execution members before a client accepts it, and of a push gap: `r + 1`, so at least one
    /// correct member, which emits only what the agreed execution emitted, sent it.
    pub fn push(&self) -> usize {
        self.r + 1
    }

    /// Matching NEXT-BATCH messages an execution member needs for a committed batch: `r + 1`
    /// (one correct order member saw the commit quorum).
    pub fn next_batch(&self) -> usize {
        self.r + 1
    }

    /// Rows of a matrix signature the order primary collects (each valid for itself) before it
    /// batches a request: `max(u, r) + r + 1`. At most `r` rows come from lying authentication
    /// members, so at least `max(u, r) + 1 >= r + 1` rows are from correct members and verify at
    /// every order member (one-step transferability). Reachable: `n_auth - u` members are up.
    pub fn matrix_collect(&self) -> usize {
        self.u.max(self.r) + self.r + 1
    }

    /// Rows of a matrix signature that must verify at an order member for it to accept the
    /// request in a batch: `r + 1`, so at least one correct authentication member checked it.
    pub fn matrix_accept(&self) -> usize {
        self.r + 1
    }

    /// Matching CP-TOKENs from execution members before the order stage certifies a checkpoint:
    /// `max(u_exec, r) + 1` (indirect learning: at least one correct member that holds the state
    /// stays available to serve it, since at most `u_exec` fail and at most `r` lie).
    pub fn checkpoint_token(&self) -> usize {
        self.u_exec.max(self.r) + 1
    }

    /// Signed CHECKPOINT messages from distinct order members that make a checkpoint stable:
    /// the medium quorum, so any later view-change quorum includes a correct member that knows it.
    pub fn checkpoint_stable(&self) -> usize {
        self.order_medium()
    }

    /// VIEW-CHANGE messages (for the same new view) from which the new primary builds NEW-VIEW:
    /// the medium quorum (intersects every commit quorum in a correct member).
    pub fn view_change(&self) -> usize {
        self.order_medium()
    }

    /// VIEW-CHANGE messages for a higher view that make a member join that view change even if
    /// its own timer has not expired: `r + 1` (at least one correct member timed out).
    pub fn view_change_join(&self) -> usize {
        self.r + 1
    }

    /// Matching LOAD-CP messages from distinct order members before an execution member fetches
    /// and loads a checkpoint: `r + 1`.
    pub fn load_checkpoint(&self) -> usize {
        self.r + 1
    }

    /// Authentication members a client sends to first (its preferred quorum): `n_auth - u`.
    /// Enough that `matrix_collect` correct rows arrive if all of them are up and correct.
    pub fn client_preferred(&self) -> usize {
        self.n_auth - self.u
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Table test for every `(u, r)` with `u <= 3`: sizes as in thesis Table 6.1 and the
    /// intersection / availability arguments the comments above make.
    #[test]
    fn sizes_and_quorums_for_every_small_configuration() {
        #[rustfmt::skip]
        let table: &[(usize, usize, usize, usize, usize)] = &[
            // u, r, n_auth, n_order, n_exec
            (0, 0, 1, 1, 1),
            (1, 0, 3, 3, 3),
            (1, 1, 4, 4, 3),
            (2, 0, 5, 5, 5),
            (2, 1, 6, 6, 5),
            (2, 2, 7, 7, 5),
            (3, 0, 7, 7, 7),
            (3, 1, 8, 8, 7),
            (3, 2, 9, 9, 7),
            (3, 3, 10, 10, 7),
        ];
        for &(u, r, n_auth, n_order, n_exec) in table {
            let q = Quorums::new(u, r).unwrap();
            assert_eq!(
                (q.n_auth, q.n_order, q.n_exec),
                (n_auth, n_order, n_exec),
                "u={u} r={r}"
            );
            assert_eq!(q.n_replicas(), n_order);
            // Two medium order quorums intersect in at least r + 1 members.
            assert!(2 * q.order_medium() - q.n_order > r, "u={u} r={r}");
            assert_eq!(2 * q.order_medium() - q.n_order, r + 1);
            // Medium quorum reachable with u down.
            assert!(q.order_medium() <= q.n_order - u);
            // Replies: r + 1 reachable from the n_exec - u members that are up.
            assert!(q.reply() <= q.n_exec - u);
            // Checkpoint tokens: more than u (one survives) and more than r (one is honest).
            assert!(q.checkpoint_token() > u && q.checkpoint_token() > r);
            assert!(q.checkpoint_token() <= q.n_exec - u);
            // Matrix rows: reachable, and after removing r liars at least r + 1 honest rows remain.
            assert!(q.matrix_collect() <= q.n_auth - u);
            assert!(q.matrix_collect() - r >= q.matrix_accept());
            assert!(q.client_preferred() >= q.matrix_collect());
            // Small quorums contain a correct member.
            assert!(q.small() > r);
            // Read-only quorum: every write quorum and every read quorum share r + 1 members,
            // so at least one correct one; with writes at r + 1 that is all execution members.
            assert!(q.reply() + q.read_only() > q.n_exec + r, "u={u} r={r}"); // q_w + q_r >= n_exec + r + 1
            assert!(q.reply() + q.read_only() - q.n_exec > r);
            assert_eq!(q.read_only(), q.n_exec, "u={u} r={r}");
            // Tentative replies: as many as a commit certificate, and from execution members.
            assert_eq!(q.tentative_reply(), q.order_medium());
            assert!(q.tentative_reply() <= q.n_exec, "u={u} r={r}");
            assert!(
                q.tentative_reply() - r > u,
                "u={u} r={r}: more than u correct members prepared"
            );
        }
    }

    /// Separate stages: the execution stage sized for its own `u_exec`, in processes after the
    /// authentication and order ones; every principal's process and every process's members.
    #[test]
    fn separate_stages_place_execution_members_in_processes_of_their_own() {
        let q = Quorums::new(1, 1).unwrap();
        assert_eq!(
            q.process_of(Principal::Exec(ReplicaId(2))),
            Process::Replica(ReplicaId(2))
        );
        assert!(q.co_located(Principal::Order(ReplicaId(1)), Principal::Exec(ReplicaId(1))));
        assert_eq!(
            q.members_of(ReplicaId(3)).len(),
            2,
            "replica 3 hosts no execution member"
        );
        let s = q.with_separate_stages(2).unwrap();
        assert_eq!(
            (s.n_order, s.n_exec, s.n_replicas(), s.exec_process_base()),
            (4, 5, 9, 4)
        );
        assert_eq!(s.checkpoint_token(), 3, "max(u_exec, r) + 1");
        assert!(s.checkpoint_token() <= s.n_exec - s.u_exec && s.reply() <= s.n_exec - s.u_exec);
        assert_eq!(
            s.process_of(Principal::Exec(ReplicaId(2))),
            Process::Replica(ReplicaId(6))
        );
        assert_eq!(
            s.process_of(Principal::Order(ReplicaId(2))),
            Process::Replica(ReplicaId(2))
        );
        assert!(!s.co_located(Principal::Order(ReplicaId(1)), Principal::Exec(ReplicaId(1))));
        for p in 0..s.n_replicas() as u32 {
            for member in s.members_of(ReplicaId(p)) {
                assert_eq!(s.process_of(member), Process::Replica(ReplicaId(p)));
            }
        }
        assert_eq!(s.members_of(ReplicaId(8)), vec![Principal::Exec(ReplicaId(4))]);
        assert!(s.members_of(ReplicaId(9)).is_empty());
        // At least u: a smaller exec_u is raised to u.
        assert_eq!(q.with_separate_stages(0).unwrap().n_exec, 3);
        assert!(q.with_separate_stages(MAX_FAULTS + 1).is_err());
    }

    #[test]
    fn r_greater_than_u_is_rejected() {
        assert_eq!(Quorums::new(1, 2), Err(FaultModelError::RExceedsU { u: 1, r: 2 }));
        assert!(Quorums::new(MAX_FAULTS + 1, 0).is_err());
    }
}
