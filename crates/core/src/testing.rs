//! Test fixtures: a cluster configuration with real keys (the unit tests' and the fuzz targets').

use std::sync::Arc;

use crate::config::{ClientInfo, ClusterConfig, Knobs, ReplicaInfo};
use crate::crypto::{KeyRing, SecretKeys};
use crate::ids::{ClientId, Process, ReplicaId};
use crate::quorum::Quorums;

/// A configured cluster with every principal's key ring.
pub struct Fixture {
    /// The configuration (validated).
    pub config: Arc<ClusterConfig>,
    /// Its quorums.
    pub quorums: Quorums,
    /// Each replica's key ring, by id.
    pub replicas: Vec<Arc<KeyRing>>,
    /// Each client's key ring, by id.
    pub clients: Vec<Arc<KeyRing>>,
}

/// A cluster for `(u, r)` with `clients` clients (ids 0..clients) and the given knobs.
pub fn fixture(u: usize, r: usize, clients: u32, knobs: Knobs) -> Fixture {
    let quorums = Quorums::new(u, r).unwrap();
    let replica_secrets: Vec<SecretKeys> = (0..quorums.n_replicas())
        .map(|i| SecretKeys::from_seed([i as u8 + 1; 32]))
        .collect();
    let client_secrets: Vec<SecretKeys> = (0..clients)
        .map(|i| SecretKeys::from_seed([100 + i as u8; 32]))
        .collect();
    let config = Arc::new(ClusterConfig {
        cluster_name: "test".into(),
        u,
        r,
        replicas: replica_secrets
            .iter()
            .enumerate()
            .map(|(i, s)| ReplicaInfo {
                id: ReplicaId(i as u32),
                keys: s.public(),
            })
            .collect(),
        clients: client_secrets
            .iter()
            .enumerate()
            .map(|(i, s)| ClientInfo {
                id: ClientId(i as u32),
                keys: s.public(),
            })
            .collect(),
        knobs,
        admin: None,
        epoch: 0,
        origin: None,
        protocol: Default::default(),
        selective_execution: false,
        separate_stages: false,
        exec_u: None,
    });
    config.validate().unwrap();
    let replicas = replica_secrets
        .iter()
        .enumerate()
        .map(|(i, s)| Arc::new(KeyRing::new(&config, Process::Replica(ReplicaId(i as u32)), s)))
        .collect();
    let clients = client_secrets
        .iter()
        .enumerate()
        .map(|(i, s)| Arc::new(KeyRing::new(&config, Process::Client(ClientId(i as u32)), s)))
        .collect();
    Fixture {
        config,
        quorums,
        replicas,
        clients,
    }
}

/// A change of `config` (epoch 0, its (u, r) kept) to the replicas `replicas`, signed by the
/// fixture's client 1 as administrator (seeded with 101; set `config.admin` to client 1).
pub fn membership_change(
    config: &ClusterConfig,
    replicas: Vec<crate::config::PublicKeys>,
) -> crate::reconfig::SignedReconfiguration {
    crate::reconfig::Reconfiguration {
        epoch: 1,
        from_u: config.u,
        from_r: config.r,
        from_replicas: config.replicas.iter().map(|r| r.keys).collect(),
        u: config.u,
        r: config.r,
        endpoints: vec![String::new(); replicas.len()],
        replicas,
    }
    .sign(&config.cluster_name, &SecretKeys::from_seed([101; 32]))
}

/// [`membership_change`] that swaps replicas `a` and `b`.
pub fn swap_change(config: &ClusterConfig, a: usize, b: usize) -> crate::reconfig::SignedReconfiguration {
    let mut replicas: Vec<_> = config.replicas.iter().map(|r| r.keys).collect();
    replicas.swap(a, b);
    membership_change(config, replicas)
}
