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
    build(u, r, None, clients, knobs)
}

/// [`fixture`] with separate stages (`separate_stages = true`, the execution stage sized for
/// `exec_u` failures): `2u + r + 1` authentication and order processes, then the execution-only
/// ones.
pub fn separated_fixture(u: usize, r: usize, exec_u: usize, clients: u32, knobs: Knobs) -> Fixture {
    build(u, r, Some(exec_u), clients, knobs)
}

fn build(u: usize, r: usize, exec_u: Option<usize>, clients: u32, knobs: Knobs) -> Fixture {
    let mut quorums = Quorums::new(u, r).unwrap();
    if let Some(exec_u) = exec_u {
        quorums = quorums.with_separate_stages(exec_u).unwrap();
    }
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
        separate_stages: exec_u.is_some(),
        exec_u,
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

/// The NEW-KEYs among `out`, with their recipients and hello flags.
pub fn new_keys(out: &[crate::stage::Action]) -> Vec<(Vec<crate::ids::Principal>, crate::session::NewKey, bool)> {
    out.iter()
        .filter_map(|a| match a {
            crate::stage::Action::Send { to, envelope } => match &envelope.message {
                crate::message::Message::NewKey { key, hello } => Some((to.clone(), key.clone(), *hello)),
                _ => None,
            },
            _ => None,
        })
        .collect()
}
