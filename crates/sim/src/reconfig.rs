//! `--reconfiguration`: the administrator grows the cluster by two replicas, one more fault of
//! each kind it stays up despite (`(u, r)` to `(u + 1, r)`), and shrinks it back, while the
//! workload and the seed's faults run (docs/SIMULATOR.md).
//!
//! The administrator is one more correct client, whose ordered requests are the signed changes.
//! It orders the next change after a pause once the previous one was ordered; a change ordered
//! before the cluster reached the epoch it follows is refused, and the administrator tries again
//! a little later. The two new replicas start (empty) in the grown configuration as soon as its
//! change is ordered; the shrinking change removes them.

use std::sync::Arc;

use upright_core::config::{ClusterConfig, PublicKeys};
use upright_core::crypto::{Digest, SecretKeys};
use upright_core::quorum::Quorums;
use upright_core::reconfig::{self, Reconfiguration, SignedReconfiguration};
use upright_core::stage::Time;

/// Replica processes the grown configuration adds.
pub const ADDED_REPLICAS: usize = 2;
/// The administrator's first change is ordered at a random time in this range (virtual µs).
pub const FIRST_CHANGE_US: (Time, Time) = (50_000, 400_000);
/// Pause between a change being ordered and the next one (virtual µs, uniform).
pub const NEXT_CHANGE_US: (Time, Time) = (100_000, 500_000);
/// Pause before a refused change is tried again.
pub const RETRY_US: Time = 50_000;

/// The administrator's plan and where it stands.
pub struct Admin {
    /// Its client id.
    pub client: u32,
    /// The changes, in order.
    pub changes: Vec<SignedReconfiguration>,
    /// The configuration each change makes.
    pub configs: Vec<Arc<ClusterConfig>>,
    /// Changes ordered so far.
    pub ordered: usize,
    /// A change is in flight.
    pub busy: bool,
    /// Replies that refused a change (tried again).
    pub refused: u64,
}

impl Admin {
    /// The grow and shrink changes of `base`, signed with `admin`'s key; `added`: the new
    /// replicas' public keys; `removed`: the ids (in the grown configuration) the shrink
    /// removes ([`reconfig::without`] renumbers the members above the new size into them).
    pub fn new(
        client: u32,
        base: &ClusterConfig,
        admin: &SecretKeys,
        added: &[PublicKeys],
        removed: &[usize],
    ) -> Admin {
        let base_keys: Vec<PublicKeys> = base.replicas.iter().map(|r| r.keys).collect();
        let mut grown = base_keys.clone();
        grown.extend_from_slice(added);
        let n_exec = |u: usize, r: usize| Quorums::new(u, r).expect("valid (u, r)").n_exec;
        let small = reconfig::without(&grown, removed, n_exec(base.u + 1, base.r), n_exec(base.u, base.r));
        let plans = [(1, base.u + 1, base.r, grown), (2, base.u, base.r, small)];
        let mut changes = Vec::new();
        let mut configs = Vec::new();
        let mut current = base.clone();
        for (epoch, u, r, replicas) in plans {
            let change = Reconfiguration {
                epoch,
                from_u: current.u,
                from_r: current.r,
                from_replicas: current.replicas.iter().map(|r| r.keys).collect(),
                u,
                r,
                endpoints: vec![String::new(); replicas.len()],
                replicas,
            }
            .sign(&base.cluster_name, admin);
            current = reconfig::successor(&current, &change, false).expect("the simulator's changes are valid");
            changes.push(change);
            configs.push(Arc::new(current.clone()));
        }
        Admin {
            client,
            changes,
            configs,
            ordered: 0,
            busy: false,
            refused: 0,
        }
    }

    /// Whether replica process `keys` is a member of the last configuration.
    pub fn stays(&self, keys: &PublicKeys) -> bool {
        self.configs.last().is_some_and(|c| c.replica_with(keys).is_some())
    }

    /// The next change to order, if any is left.
    pub fn next(&self) -> Option<&SignedReconfiguration> {
        self.changes.get(self.ordered)
    }

    /// Whether every change was ordered.
    pub fn done(&self) -> bool {
        self.ordered == self.changes.len()
    }

    /// The epoch the cluster ends in.
    pub fn final_epoch(&self) -> u64 {
        self.changes.len() as u64
    }

    /// The digest of the change that makes `epoch`.
    pub fn digest_of(&self, epoch: u64) -> Option<Digest> {
        let index = (epoch as usize).checked_sub(1)?;
        self.changes.get(index).map(SignedReconfiguration::digest)
    }
}
