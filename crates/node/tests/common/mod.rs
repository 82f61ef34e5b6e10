//! Set-up shared by the node's integration tests.

use std::path::Path;

use upright_node::files::{self, Cluster, InitPlan};
use upright_node::replica::{run_replica, ReplicaSpec};
use upright_node::storage::StorageOptions;

/// A free loopback port below Linux's ephemeral range (32768+), so the replicas' own outgoing
/// connections can never take it between the choice and the bind; distinct within this process.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919) % 12_000;
    loop {
        let port = 20_000 + ((start + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// A 4-replica (u = r = 1) cluster with 2 client identities on loopback, files in `dir`.
pub fn make_cluster(dir: &Path, name: &str) -> Cluster {
    let ports = (0..4).map(|_| (free_port(), free_port(), free_port())).collect();
    let plan = InitPlan {
        cluster_name: name.into(),
        u: 1,
        r: 1,
        hosts: vec!["127.0.0.1".into()],
        clients: 2,
        base_port: 0,
        ports: Some(ports),
        knobs: None,
        fsync: Default::default(),
        idle_spin_us: upright_node::spin::IDLE_SPIN_DEFAULT_US,
        unix_dir: None,
        metrics_host: Default::default(),
        metrics_token: false,
        recovery_interval_secs: 0,
        protocol: Default::default(),
        selective_execution: false,
        separate_stages: None,
    };
    files::init_cluster(&plan, dir).unwrap()
}

/// Starts the cluster's 4 replicas as tasks of the current tokio runtime (default storage options,
/// the default service).
#[allow(dead_code)] // each test file compiles this module; loopback.rs starts its own replicas
pub fn start_replicas(cluster: &Cluster) {
    for id in 0..4 {
        let spec = ReplicaSpec {
            cluster: cluster.clone(),
            id,
            keys: files::load_replica_keys(cluster, id, &cluster.key_path(id)).unwrap(),
            storage: StorageOptions::default(),
            service: upright_core::stages::kv_service(),
            stages: None,
            wrap: None,
        };
        tokio::spawn(async move { run_replica(spec, std::future::pending()).await.unwrap() });
    }
}
