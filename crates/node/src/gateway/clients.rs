//! The upright clients of a gateway's pool, from the client files `upright init` writes.
//!
//! Member `k` of a pool of `n` started from `client-<c>.toml` is client `c + k`, read from
//! `client-<c+k>.toml` beside it: every member needs an identity of its own, since each has one
//! request outstanding and its own request ids. A standalone gateway keeps each member's request
//! id durable (UpRight CS3, [`crate::client`]) in `client-<c+k>.last-request-id` beside its file, so
//! a gateway that is killed and restarted continues its ids where they ended instead of being
//! ignored as a replay. `upright demo` keeps none: its cluster lives exactly as long as it does.

use std::path::{Path, PathBuf};

use crate::client::{start_clients, ClientHandle};
use crate::files::{ClientFile, ClientSetup, FileError};

/// Most members of one gateway pool.
pub const POOL_MAX: u32 = 64;

/// Whether pool members keep their request ids durable across restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestIds {
    /// Durable, beside each client file (a gateway against a long-lived cluster).
    Durable,
    /// Not kept (a cluster that lives exactly as long as the gateway's process).
    Volatile,
}

/// The file of client `id` beside `first` (a `client-<c>.toml`).
fn sibling(first: &Path, id: u32) -> PathBuf {
    first.with_file_name(format!("client-{id}.toml"))
}

/// Loads the `pool` client identities that start at `first` and checks that they are distinct
/// clients of one cluster.
pub fn load(first: &Path, pool: u32) -> Result<Vec<(PathBuf, ClientSetup)>, FileError> {
    if pool == 0 || pool > POOL_MAX {
        return Err(FileError(format!("the pool size must be 1 to {POOL_MAX}, not {pool}")));
    }
    let head = ClientFile::load(first)?;
    let c = head.id.0;
    let mut setups = vec![(first.to_path_buf(), head)];
    for k in 1..pool {
        let id = c + k;
        let path = sibling(first, id);
        if !path.exists() {
            return Err(FileError(format!(
                "a pool of {pool} needs client identities {c}..{}: {} is missing (make more with `upright init --clients N`, or use a smaller pool)",
                c + pool - 1,
                path.display()
            )));
        }
        let setup = ClientFile::load(&path)?;
        if setup.id.0 != id {
            return Err(FileError(format!(
                "{} holds client {}, not client {id}",
                path.display(),
                setup.id.0
            )));
        }
        setups.push((path, setup));
    }
    Ok(setups)
}

/// Starts the pool's clients (inside a tokio runtime) from what [`load`] read, sharing one
/// connection per replica.
pub fn start(members: Vec<(PathBuf, ClientSetup)>, ids: RequestIds) -> Result<Vec<ClientHandle>, FileError> {
    let setups = members
        .into_iter()
        .map(|(path, setup)| {
            let state = match ids {
                RequestIds::Durable => Some(path.with_extension("last-request-id")),
                RequestIds::Volatile => None,
            };
            (setup, state)
        })
        .collect();
    start_clients(setups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::{init_cluster, InitPlan};

    fn cluster(clients: u32) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let plan = InitPlan {
            cluster_name: "pool".into(),
            u: 1,
            r: 1,
            hosts: vec!["127.0.0.1".into()],
            clients,
            base_port: 7000,
            ports: None,
            knobs: None,
            fsync: Default::default(),
            idle_spin_us: 0,
            unix_dir: None,
            metrics_host: Default::default(),
            metrics_token: false,
            recovery_interval_secs: 0,
            protocol: Default::default(),
            selective_execution: false,
            separate_stages: None,
        };
        init_cluster(&plan, dir.path()).unwrap();
        dir
    }

    #[test]
    fn members_are_the_client_files_after_the_first() {
        let dir = cluster(4);
        let loaded = load(&dir.path().join("client-1.toml"), 3).unwrap();
        let ids: Vec<u32> = loaded.iter().map(|(_, s)| s.id.0).collect();
        assert_eq!(ids, vec![1, 2, 3]);
        assert_eq!(loaded[2].0, dir.path().join("client-3.toml"));
    }

    #[test]
    fn a_pool_larger_than_the_identities_is_refused_with_the_missing_file() {
        let dir = cluster(2);
        let err = load(&dir.path().join("client-0.toml"), 3).err().unwrap().0;
        assert!(err.contains("client-2.toml is missing"), "{err}");
        assert!(err.contains("identities 0..2"), "{err}");
        let err = load(&dir.path().join("client-0.toml"), 0).err().unwrap().0;
        assert!(err.contains("1 to 64"), "{err}");
    }

    #[test]
    fn a_file_holding_another_identity_is_refused() {
        let dir = cluster(3);
        std::fs::copy(dir.path().join("client-0.toml"), dir.path().join("client-2.toml")).unwrap();
        let err = load(&dir.path().join("client-1.toml"), 2).err().unwrap().0;
        assert!(err.contains("holds client 0, not client 2"), "{err}");
    }
}
