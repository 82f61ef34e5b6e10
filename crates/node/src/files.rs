//! Cluster configuration, key files and client configuration on disk.
//!
//! - `cluster.toml` ([`ClusterFile`]): public information only: the fault model, every replica's
//!   public keys and addresses, every client's public keys, knobs, data directory, fsync policy.
//! - `keys/replica-<i>.key` ([`KeyFile`]): one replica's secret keys, mode 0600.
//! - `client-<c>.toml` ([`ClientFile`]): the public cluster information plus this client's own
//!   secret key, mode 0600; it holds no other principal's secret.
//!
//! Every misconfiguration is a [`FileError`] whose message fits on one line.

use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use upright_core::config::{ClientInfo, ClusterConfig, Knobs, OrderProtocol, PublicKeys, ReplicaInfo};
use upright_core::crypto::SecretKeys;
use upright_core::ids::{ClientId, Process, ReplicaId};

use crate::storage::FsyncPolicy;
use crate::transport::Endpoint;

/// A configuration problem, one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FileError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, FileError> {
    Err(FileError(msg.into()))
}

impl ReplicaEntry {
    /// Its public keys, parsed.
    pub fn public_keys(&self) -> Result<PublicKeys, FileError> {
        public_keys(&self.x25519, &self.ed25519, &format!("replica {}", self.id))
    }
}

/// A replica's entry in `cluster.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaEntry {
    /// Replica id (its position).
    pub id: u32,
    /// Listener for other replicas.
    pub replica_addr: String,
    /// Listener for clients.
    pub client_addr: String,
    /// Plain-HTTP metrics and status endpoint (`upright init` puts it on loopback unless told
    /// otherwise: it tells whoever reaches it the replica's progress and counters).
    pub metrics_addr: String,
    /// X25519 public key, hex.
    pub x25519: String,
    /// Ed25519 public key, hex.
    pub ed25519: String,
}

/// A client's entry in `cluster.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientEntry {
    /// Client id.
    pub id: u32,
    /// X25519 public key, hex.
    pub x25519: String,
    /// Ed25519 public key, hex.
    pub ed25519: String,
}

/// `cluster.toml`: everything public about a cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Cluster name (mixed into every MAC key).
    pub cluster_name: String,
    /// Failures of any kind tolerated while staying live.
    pub u: usize,
    /// Commission failures tolerated while staying safe.
    pub r: usize,
    /// Where replicas keep their logs (relative paths are relative to this file); replica `i`
    /// uses `<data_dir>/replica-<i>`.
    pub data_dir: String,
    /// Sync policy of the logs.
    #[serde(default)]
    pub fsync: FsyncPolicy,
    /// Microseconds a replica's event loop spins (yielding the CPU to any other runnable thread)
    /// after it runs out of input, before it sleeps; while it is not 0, log syncs are waited for
    /// the same way (up to `crate::spin::SYNC_SPIN_MAX`). 0: sleep at once. See `crate::spin`.
    #[serde(default = "default_idle_spin_us")]
    pub idle_spin_us: u64,
    /// The ordering protocol: `"pbft"` (the default), `"quorum"` (Aliph's Quorum over PBFT,
    /// `u = r`), `"chain"` (Aliph's Chain over PBFT, `r >= 1`), `"aliph"` (Quorum and Chain in
    /// turn over PBFT, `u = r`), `"backup"` (another name of `"pbft"`) or `"lcr"` (crash-only,
    /// `r = 0`).
    #[serde(default, skip_serializing_if = "OrderProtocol::is_default")]
    pub protocol: OrderProtocol,
    /// Selective execution (docs/ODRC.md): each object's requests run on the `r + 1` execution
    /// members that maintain it. Needs a service with object checkpoints (the core KV, the Redis
    /// store; the replica refuses to start otherwise).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub selective_execution: bool,
    /// Execution members in processes of their own (docs/ODRC.md "Separated stages"): replicas
    /// `0 .. 2u + r + 1` run authentication and order, the next `n_exec` one execution member
    /// each (`upright replica --stages exec --id i`). PBFT only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub separate_stages: bool,
    /// With `separate_stages`: the failures the execution stage tolerates (default `u`); it then
    /// has `exec_u + max(exec_u, r) + 1` members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_u: Option<usize>,
    /// Protocol knobs (all defaults if absent).
    #[serde(default)]
    pub knobs: Option<Knobs>,
    /// A file (relative paths are relative to this file) holding the token the metrics and
    /// status endpoints require (`Authorization: Bearer <token>`); none: they answer anyone who
    /// can reach them. Keep the file as secret as the replicas' keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_token_file: Option<String>,
    /// Proactive recovery's watchdog period `T_w` in seconds (docs/OPERATING.md): every
    /// replica recovers once per period, replica `i` at `i * T_w / n` into it. 0 (the default):
    /// replicas recover only when told (`upright recover`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub recovery_interval_secs: u64,
    /// Replicas, by id.
    pub replicas: Vec<ReplicaEntry>,
    /// Authorised clients.
    #[serde(default)]
    pub clients: Vec<ClientEntry>,
    /// The client whose ordered requests are reconfigurations signed with its key
    /// (`upright init` writes its secret to `admin.toml`); none: the membership is fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_client: Option<u32>,
    /// The administrator's signed changes (hex), oldest first: the cluster's configuration is
    /// the one the last of them makes from `replicas`, `u` and `r` above (docs/PROTOCOL.md
    /// "Reconfiguration"). A replica runs in the configuration its own log records.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reconfigurations: Vec<String>,
}

/// A loaded cluster configuration with resolved addresses.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// The core configuration (the latest one `cluster.toml` knows).
    pub config: Arc<ClusterConfig>,
    /// The configuration the cluster was initialised with (epoch 0).
    pub initial: Arc<ClusterConfig>,
    /// Its replicas (`cluster.toml`'s own list).
    initial_replicas: Vec<ReplicaEntry>,
    /// The keys of every replica the cluster has had, by slot ([`Cluster::slots`]).
    slots: Vec<PublicKeys>,
    /// The file it came from.
    pub file: ClusterFile,
    /// Directory of the file (relative paths resolve against it).
    pub base: PathBuf,
}

fn parse_key(hex_str: &str, what: &str) -> Result<[u8; 32], FileError> {
    let bytes = hex::decode(hex_str.trim()).map_err(|_| FileError(format!("{what}: not hex")))?;
    bytes
        .try_into()
        .map_err(|_| FileError(format!("{what}: expected 32 bytes")))
}

fn public_keys(x: &str, e: &str, who: &str) -> Result<PublicKeys, FileError> {
    Ok(PublicKeys {
        x25519: parse_key(x, &format!("{who} x25519 key"))?,
        ed25519: parse_key(e, &format!("{who} ed25519 key"))?,
    })
}

/// Resolves `host:port` (names allowed) to one socket address: for listeners that are TCP only
/// (the metrics endpoint). Replica and client listeners take [`endpoint`].
pub fn resolve(addr: &str) -> Result<SocketAddr, FileError> {
    if addr.starts_with(crate::transport::UNIX_PREFIX) {
        return err(format!("{addr:?}: this listener is HTTP over TCP; give host:port"));
    }
    crate::transport::resolve_tcp(addr).map_err(FileError)
}

/// Parses a replica or client listener's address: `host:port` (names allowed) or
/// `unix:/absolute/path` for a Unix-domain socket (processes on one host;
/// `crate::transport::Endpoint`).
pub fn endpoint(addr: &str) -> Result<Endpoint, FileError> {
    Endpoint::parse(addr).map_err(FileError)
}

fn default_idle_spin_us() -> u64 {
    crate::spin::IDLE_SPIN_DEFAULT_US
}

/// Largest accepted `idle_spin_us`: spinning longer than this between messages only burns CPU.
pub const IDLE_SPIN_US_MAX: u64 = 10_000;

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// Shortest proactive-recovery period per replica (`recovery_interval_secs / n`): a recovery
/// restarts the process and loads state, which takes seconds.
pub const RECOVERY_SLOT_SECS_MIN: u64 = 10;

impl ClusterFile {
    /// Builds the core configuration and validates it.
    pub fn to_config(&self) -> Result<ClusterConfig, FileError> {
        let n = self.replicas.len().max(1) as u64;
        if self.recovery_interval_secs != 0 && self.recovery_interval_secs < RECOVERY_SLOT_SECS_MIN * n {
            return err(format!(
                "recovery_interval_secs = {} is too short for {n} replicas: each recovers in its own slot of \
                 recovery_interval_secs / n, which must be at least {RECOVERY_SLOT_SECS_MIN} s (0 turns the schedule off)",
                self.recovery_interval_secs
            ));
        }
        if self.idle_spin_us > IDLE_SPIN_US_MAX {
            return err(format!(
                "idle_spin_us = {} is too large (at most {IDLE_SPIN_US_MAX}; 0 turns spinning off)",
                self.idle_spin_us
            ));
        }
        let mut replicas = Vec::new();
        for r in &self.replicas {
            replicas.push(ReplicaInfo {
                id: ReplicaId(r.id),
                keys: public_keys(&r.x25519, &r.ed25519, &format!("replica {}", r.id))?,
            });
        }
        let mut clients = Vec::new();
        for c in &self.clients {
            clients.push(ClientInfo {
                id: ClientId(c.id),
                keys: public_keys(&c.x25519, &c.ed25519, &format!("client {}", c.id))?,
            });
        }
        let config = ClusterConfig {
            cluster_name: self.cluster_name.clone(),
            u: self.u,
            r: self.r,
            replicas,
            clients,
            knobs: self.knobs.clone().unwrap_or_default(),
            admin: self.admin_client.map(ClientId),
            epoch: 0,
            origin: None,
            protocol: self.protocol,
            selective_execution: self.selective_execution,
            separate_stages: self.separate_stages,
            exec_u: self.exec_u,
        };
        config
            .validate()
            .map_err(|e| FileError(format!("invalid cluster config: {e}")))?;
        Ok(config)
    }

    /// The entry of replica `id`.
    pub fn replica(&self, id: u32) -> Result<&ReplicaEntry, FileError> {
        self.replicas.iter().find(|r| r.id == id).ok_or_else(|| {
            FileError(format!(
                "replica id {id} is not in the config (it lists {} replicas: 0..{})",
                self.replicas.len(),
                self.replicas.len()
            ))
        })
    }
}

impl Cluster {
    /// The metrics token the cluster file names (`metrics_token_file`), if any: an error if the
    /// file is named but cannot be read or holds no token.
    pub fn metrics_token(&self) -> Result<Option<String>, FileError> {
        let Some(file) = &self.file.metrics_token_file else {
            return Ok(None);
        };
        let path = self.base.join(file);
        let text = fs::read_to_string(&path)
            .map_err(|e| FileError(format!("cannot read the metrics token {}: {e}", path.display())))?;
        let token = text.trim();
        if token.is_empty() || token.contains(char::is_whitespace) {
            return err(format!("{}: not a metrics token (one word expected)", path.display()));
        }
        Ok(Some(token.to_string()))
    }

    /// Reads and validates `cluster.toml`.
    pub fn load(path: &Path) -> Result<Cluster, FileError> {
        let text = fs::read_to_string(path).map_err(|e| FileError(format!("cannot read {}: {e}", path.display())))?;
        let file: ClusterFile = toml::from_str(&text)
            .map_err(|e| FileError(format!("{}: {}", path.display(), one_line(&e.to_string()))))?;
        Cluster::from_file(file, path.parent().unwrap_or(Path::new(".")))
    }

    /// Validates an in-memory cluster file whose relative paths resolve against `base`.
    pub fn from_file(file: ClusterFile, base: &Path) -> Result<Cluster, FileError> {
        let initial = Arc::new(file.to_config()?);
        let mut config = initial.clone();
        let mut slots: Vec<PublicKeys> = initial.replicas.iter().map(|r| r.keys).collect();
        for (i, text) in file.reconfigurations.iter().enumerate() {
            let signed = parse_change(text).map_err(|e| FileError(format!("reconfigurations[{i}]: {e}")))?;
            let next = upright_core::reconfig::successor(&config, &signed, false)
                .map_err(|e| FileError(format!("reconfigurations[{i}] does not follow: {e}")))?;
            for replica in &next.replicas {
                if !slots.contains(&replica.keys) {
                    slots.push(replica.keys);
                }
            }
            config = Arc::new(next);
        }
        let cluster = Cluster {
            config: initial.clone(),
            initial,
            initial_replicas: file.replicas.clone(),
            slots,
            file,
            base: base.to_path_buf(),
        };
        cluster.in_config(config)
    }

    /// The same cluster seen in configuration `config` (one of its configurations): the replica
    /// entries, `u` and `r` are the ones it names (addresses from the change's endpoints).
    pub fn in_config(&self, config: Arc<ClusterConfig>) -> Result<Cluster, FileError> {
        let mut view = self.clone();
        if config.epoch() == 0 {
            view.file.replicas = self.initial_replicas.clone();
            view.file.u = self.initial.u;
            view.file.r = self.initial.r;
        } else {
            let signed = upright_core::reconfig::origin(&config)
                .ok_or_else(|| FileError(format!("configuration epoch {} has no change", config.epoch())))?;
            let change = &signed.change;
            view.file.replicas = change
                .replicas
                .iter()
                .zip(&change.endpoints)
                .enumerate()
                .map(|(i, (keys, endpoint))| replica_entry(i as u32, keys, endpoint))
                .collect::<Result<_, _>>()?;
            view.file.u = change.u;
            view.file.r = change.r;
        }
        view.config = config;
        Ok(view)
    }

    /// The keys of every replica the cluster has had, by slot: the name of its key file, its
    /// data directory, and what `upright replica --id`, `recover --id`, `reconfigure --remove`
    /// and `status` call it. The replicas `upright init` made have slots `0..n` (their ids in
    /// the first configuration); each replica a reconfiguration adds takes the next free slot.
    /// A replica's id in the protocol is its position in the configuration it runs in, which a
    /// shrink may change; its slot never changes.
    pub fn slots(&self) -> &[PublicKeys] {
        &self.slots
    }

    /// The slot of the replica with `keys`.
    pub fn slot_of(&self, keys: &PublicKeys) -> Option<u32> {
        self.slots.iter().position(|k| k == keys).map(|s| s as u32)
    }

    /// The keys of the replica in `slot`.
    pub fn slot_keys(&self, slot: u32) -> Result<PublicKeys, FileError> {
        self.slots.get(slot as usize).copied().ok_or_else(|| {
            FileError(format!(
                "there is no replica {slot} (the cluster has had replicas 0..{})",
                self.slots.len().saturating_sub(1)
            ))
        })
    }

    /// The entry (in this view's configuration) of the replica in `slot`, if it is a member.
    pub fn member_entry(&self, slot: u32) -> Result<&ReplicaEntry, FileError> {
        let keys = self.slot_keys(slot)?;
        let position = self.config.replica_with(&keys).ok_or_else(|| {
            FileError(format!(
                "replica {slot} is not a member of configuration epoch {} (a reconfiguration removed it)",
                self.config.epoch()
            ))
        })?;
        self.file.replica(position.0)
    }

    /// Data directory of the replica in slot `id`.
    pub fn data_dir(&self, id: u32) -> PathBuf {
        self.base.join(&self.file.data_dir).join(format!("replica-{id}"))
    }

    /// Default key file of the replica in slot `id`.
    pub fn key_path(&self, id: u32) -> PathBuf {
        self.base.join("keys").join(format!("replica-{id}.key"))
    }
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A secret key file: whose key it is, for which cluster, and the secret.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KeyFile {
    /// Cluster the key belongs to.
    pub cluster_name: String,
    /// `replica <i>` or `client <c>`.
    pub principal: String,
    /// `SecretKeys::to_bytes`, hex (128 digits).
    pub secret: String,
}

/// Name of a process in key files and messages.
pub fn process_name(process: Process) -> String {
    match process {
        Process::Replica(r) => format!("replica {}", r.0),
        Process::Client(c) => format!("client {}", c.0),
    }
}

/// Fresh secret keys from the operating system's randomness.
pub fn fresh_keys() -> SecretKeys {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).expect("the operating system's random source failed");
    SecretKeys::from_seed(seed)
}

/// Hex of a secret key.
pub fn secret_hex(keys: &SecretKeys) -> String {
    hex::encode(keys.to_bytes())
}

/// Parses a hex secret.
pub fn parse_secret(text: &str, what: &str) -> Result<SecretKeys, FileError> {
    let bytes = hex::decode(text.trim()).map_err(|_| FileError(format!("{what}: secret is not hex")))?;
    let bytes: [u8; 64] = bytes
        .try_into()
        .map_err(|_| FileError(format!("{what}: secret must be 64 bytes")))?;
    Ok(SecretKeys::from_bytes(&bytes))
}

/// Writes `text` to `path` readable by the owner only (0600), replacing it atomically.
pub fn write_private(path: &Path, text: &str) -> Result<(), FileError> {
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e: std::io::Error| FileError(format!("cannot write {}: {e}", path.display()));
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(fail)?;
    }
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(fail)?;
    file.write_all(text.as_bytes()).map_err(fail)?;
    file.sync_all().map_err(fail)?;
    fs::rename(&tmp, path).map_err(fail)
}

/// Writes a key file (0600).
pub fn write_key_file(path: &Path, cluster_name: &str, process: Process, keys: &SecretKeys) -> Result<(), FileError> {
    let file = KeyFile {
        cluster_name: cluster_name.to_string(),
        principal: process_name(process),
        secret: secret_hex(keys),
    };
    write_private(path, &toml::to_string(&file).expect("key file serializes"))
}

/// Loads the key file of the replica in slot `id` ([`Cluster::slots`]) and checks it against the
/// configuration.
pub fn load_replica_keys(cluster: &Cluster, id: u32, path: &Path) -> Result<SecretKeys, FileError> {
    let text =
        fs::read_to_string(path).map_err(|e| FileError(format!("cannot read key file {}: {e}", path.display())))?;
    let file: KeyFile = toml::from_str(&text)
        .map_err(|e| FileError(format!("key file {}: {}", path.display(), one_line(&e.to_string()))))?;
    let expected = process_name(Process::Replica(ReplicaId(id)));
    if file.cluster_name != cluster.config.cluster_name {
        return err(format!(
            "key file {} is for cluster {:?}, the config is for cluster {:?}",
            path.display(),
            file.cluster_name,
            cluster.config.cluster_name
        ));
    }
    if file.principal != expected {
        return err(format!(
            "key file {} belongs to {}, not {expected}",
            path.display(),
            file.principal
        ));
    }
    let keys = parse_secret(&file.secret, &path.display().to_string())?;
    let configured = cluster.slots().get(id as usize).copied();
    if configured != Some(keys.public()) {
        return err(format!(
            "key file {} does not match the public keys of {expected} in the config",
            path.display()
        ));
    }
    Ok(keys)
}

/// `client-<c>.toml`: the cluster's public information plus one client's own secret.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClientFile {
    /// This client's id.
    pub client_id: u32,
    /// Its secret keys, hex.
    pub secret: String,
    /// The public cluster configuration.
    pub cluster: ClusterFile,
}

/// A loaded client configuration.
pub struct ClientSetup {
    /// The cluster.
    pub cluster: Cluster,
    /// This client.
    pub id: ClientId,
    /// Its keys.
    pub keys: SecretKeys,
}

impl ClientFile {
    /// Reads and checks a client file.
    pub fn load(path: &Path) -> Result<ClientSetup, FileError> {
        let text = fs::read_to_string(path).map_err(|e| FileError(format!("cannot read {}: {e}", path.display())))?;
        let file: ClientFile = toml::from_str(&text)
            .map_err(|e| FileError(format!("{}: {}", path.display(), one_line(&e.to_string()))))?;
        file.check(path.parent().unwrap_or(Path::new(".")))
    }

    /// Validates the contents.
    pub fn check(self, base: &Path) -> Result<ClientSetup, FileError> {
        let cluster = Cluster::from_file(self.cluster, base)?;
        let keys = parse_secret(&self.secret, "client file")?;
        let id = ClientId(self.client_id);
        match cluster.config.client_keys(id) {
            None => err(format!("client {} is not authorised in the cluster config", id.0)),
            Some(k) if *k != keys.public() => err(format!(
                "the client file's secret does not match client {}'s public keys in the config",
                id.0
            )),
            Some(_) => Ok(ClientSetup { cluster, id, keys }),
        }
    }
}

/// The endpoint string of a replica in a change: its replica, client and metrics addresses,
/// separated by single spaces.
pub fn endpoint_string(entry: &ReplicaEntry) -> String {
    format!("{} {} {}", entry.replica_addr, entry.client_addr, entry.metrics_addr)
}

/// A replica's endpoint string in a change ([`endpoint_string`]): its replica, client and
/// metrics addresses.
fn endpoint_parts(endpoint: &str) -> Option<[&str; 3]> {
    let parts: Vec<&str> = endpoint.split(' ').collect();
    parts.try_into().ok()
}

/// The replica-to-replica address in a replica's endpoint string.
pub fn endpoint_replica_addr(endpoint: &str) -> Option<&str> {
    endpoint_parts(endpoint).map(|[replica, _, _]| replica)
}

/// The client address in a replica's endpoint string.
pub fn endpoint_client_addr(endpoint: &str) -> Option<&str> {
    endpoint_parts(endpoint).map(|[_, client, _]| client)
}

/// A replica entry from its keys and its endpoint string in a change.
fn replica_entry(id: u32, keys: &upright_core::config::PublicKeys, endpoint: &str) -> Result<ReplicaEntry, FileError> {
    let Some([replica_addr, client_addr, metrics_addr]) = endpoint_parts(endpoint) else {
        return err(format!(
            "replica {id}'s endpoint {endpoint:?} is not \"REPLICA_ADDR CLIENT_ADDR METRICS_ADDR\""
        ));
    };
    Ok(ReplicaEntry {
        id,
        replica_addr: replica_addr.to_string(),
        client_addr: client_addr.to_string(),
        metrics_addr: metrics_addr.to_string(),
        x25519: hex::encode(keys.x25519),
        ed25519: hex::encode(keys.ed25519),
    })
}

/// The entry of a replica a reconfiguration adds on `host:port`, laid out as `upright init` lays
/// replicas out: clients on `port + 100`, metrics on `127.0.0.1:port + 200`.
pub fn added_replica(id: u32, host: &str, port: u16, keys: &SecretKeys) -> Result<ReplicaEntry, FileError> {
    if host.is_empty() || host.contains(char::is_whitespace) {
        return err(format!("{host:?} is not a host name"));
    }
    let (Some(client_port), Some(metrics_port)) = (port.checked_add(100), port.checked_add(200)) else {
        return err(format!(
            "port {port} leaves no room for the client and metrics ports (+100, +200)"
        ));
    };
    let public = keys.public();
    Ok(ReplicaEntry {
        id,
        replica_addr: format!("{host}:{port}"),
        client_addr: format!("{host}:{client_port}"),
        metrics_addr: format!("127.0.0.1:{metrics_port}"),
        x25519: hex::encode(public.x25519),
        ed25519: hex::encode(public.ed25519),
    })
}

/// Appends an ordered change to `cluster.toml` at `path` (written whole to a temporary file,
/// synced, then renamed over it).
pub fn record_change(path: &Path, signed: &upright_core::reconfig::SignedReconfiguration) -> Result<(), FileError> {
    let text = fs::read_to_string(path).map_err(|e| FileError(format!("cannot read {}: {e}", path.display())))?;
    let mut file: ClusterFile =
        toml::from_str(&text).map_err(|e| FileError(format!("{}: {}", path.display(), one_line(&e.to_string()))))?;
    file.reconfigurations.push(hex::encode(signed.to_operation()));
    let text = toml::to_string(&file).map_err(|e| FileError(e.to_string()))?;
    let tmp = path.with_extension("toml.tmp");
    let io = |e: std::io::Error| FileError(format!("cannot write {}: {e}", path.display()));
    {
        use std::io::Write;
        let mut f = fs::File::create(&tmp).map_err(io)?;
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    fs::rename(&tmp, path).map_err(io)?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        crate::storage::sync_dir(dir).map_err(io)?;
    }
    Ok(())
}

/// A signed change from its hex text.
pub fn parse_change(text: &str) -> Result<upright_core::reconfig::SignedReconfiguration, FileError> {
    let bytes = hex::decode(text.trim()).map_err(|_| FileError("not hex".into()))?;
    upright_core::codec::from_bytes(&bytes).map_err(|_| FileError("not a signed reconfiguration".into()))
}

/// What `upright init` produces.
pub struct InitPlan {
    /// Cluster name.
    pub cluster_name: String,
    /// u.
    pub u: usize,
    /// r.
    pub r: usize,
    /// One host per replica (a single host is used for all).
    pub hosts: Vec<String>,
    /// Number of clients to create.
    pub clients: u32,
    /// First port: replica `i` listens on `base + i` (replicas), `base + 100 + i` (clients),
    /// `base + 200 + i` (metrics).
    pub base_port: u16,
    /// Explicit ports per replica `(replica, client, metrics)`, overriding `base_port`.
    pub ports: Option<Vec<(u16, u16, u16)>>,
    /// Knobs.
    pub knobs: Option<Knobs>,
    /// Sync policy.
    pub fsync: FsyncPolicy,
    /// The cluster file's `idle_spin_us` (`crate::spin::IDLE_SPIN_DEFAULT_US` unless measuring).
    pub idle_spin_us: u64,
    /// For a cluster on one host: the replica and client listeners are Unix-domain sockets in
    /// this directory (`replica-<i>.sock`, `clients-<i>.sock`) instead of TCP ports; metrics stay
    /// on TCP.
    pub unix_dir: Option<PathBuf>,
    /// The host the metrics endpoints listen on.
    pub metrics_host: MetricsHost,
    /// Whether to write a metrics token (`keys/metrics.token`) that the endpoints then require.
    pub metrics_token: bool,
    /// Proactive recovery's period `T_w` in seconds (0: only on command).
    pub recovery_interval_secs: u64,
    /// The ordering protocol. Under LCR, Quorum, Chain and Aliph the membership is fixed (no administrator).
    pub protocol: OrderProtocol,
    /// Selective execution (`selective_execution` in cluster.toml).
    pub selective_execution: bool,
    /// Separate stages with the execution stage sized for this many failures
    /// (`separate_stages = true` and `exec_u` in cluster.toml); none: co-located stages.
    pub separate_stages: Option<usize>,
}

/// Where the metrics endpoints listen (`upright init --metrics-host`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum MetricsHost {
    /// 127.0.0.1: only the replica's own machine can read them.
    #[default]
    Loopback,
    /// Each replica's own host (from `--hosts`).
    Replica,
    /// This host or address for every replica (e.g. `0.0.0.0`).
    Host(String),
}

impl MetricsHost {
    /// `--metrics-host`: `replica`, or a host.
    pub fn parse(text: &str) -> MetricsHost {
        match text {
            "replica" => MetricsHost::Replica,
            host => MetricsHost::Host(host.to_string()),
        }
    }
}

/// Where `upright init` writes the administrator's client file (its key signs
/// reconfigurations), relative to the cluster file.
pub const ADMIN_FILE: &str = "admin.toml";

/// Where `upright init` writes the metrics token, relative to the cluster file.
pub const METRICS_TOKEN_FILE: &str = "keys/metrics.token";

/// Writes `cluster.toml`, `keys/replica-<i>.key` and `client-<c>.toml` into `out`.
pub fn init_cluster(plan: &InitPlan, out: &Path) -> Result<Cluster, FileError> {
    let mut q = upright_core::quorum::Quorums::new(plan.u, plan.r).map_err(|e| FileError(e.to_string()))?;
    if let Some(exec_u) = plan.separate_stages {
        q = q.with_separate_stages(exec_u).map_err(|e| FileError(e.to_string()))?;
    }
    let n = q.n_replicas();
    if plan.hosts.len() != 1 && plan.hosts.len() != n {
        return err(format!(
            "--hosts lists {} hosts; u = {}, r = {} needs {n} replicas (give {n} hosts or one)",
            plan.hosts.len(),
            plan.u,
            plan.r
        ));
    }
    let key = |k: &SecretKeys| (hex::encode(k.public().x25519), hex::encode(k.public().ed25519));
    let mut replicas = Vec::new();
    let mut replica_keys = Vec::new();
    for i in 0..n {
        let host = &plan.hosts[if plan.hosts.len() == 1 { 0 } else { i }];
        let (rp, cp, mp) = match &plan.ports {
            Some(p) => p[i],
            None => {
                let b = plan.base_port + i as u16;
                (b, b + 100, b + 200)
            }
        };
        let keys = fresh_keys();
        let (x25519, ed25519) = key(&keys);
        let (replica_addr, client_addr) = match &plan.unix_dir {
            Some(dir) => {
                let socket = |name: String| {
                    let addr = Endpoint::Unix(dir.join(name)).to_string();
                    endpoint(&addr).map(|_| addr)
                };
                (
                    socket(format!("replica-{i}.sock"))?,
                    socket(format!("clients-{i}.sock"))?,
                )
            }
            None => (format!("{host}:{rp}"), format!("{host}:{cp}")),
        };
        replicas.push(ReplicaEntry {
            id: i as u32,
            replica_addr,
            client_addr,
            metrics_addr: match &plan.metrics_host {
                MetricsHost::Loopback => format!("127.0.0.1:{mp}"),
                MetricsHost::Replica => format!("{host}:{mp}"),
                MetricsHost::Host(metrics) => format!("{metrics}:{mp}"),
            },
            x25519,
            ed25519,
        });
        replica_keys.push(keys);
    }
    let client_keys: Vec<SecretKeys> = (0..plan.clients).map(|_| fresh_keys()).collect();
    let clients = client_keys
        .iter()
        .enumerate()
        .map(|(c, k)| {
            let (x25519, ed25519) = key(k);
            ClientEntry {
                id: c as u32,
                x25519,
                ed25519,
            }
        })
        .collect();
    // The administrator: one more client, after the others (`admin.toml`). An LCR, Quorum, Chain or
    // Aliph cluster's membership is fixed: it has none; so is one with selective execution.
    let administered = plan.protocol.is_default() && !plan.selective_execution && plan.separate_stages.is_none();
    let admin_keys = fresh_keys();
    let admin_id = plan.clients;
    let mut clients: Vec<ClientEntry> = clients;
    let (x25519, ed25519) = key(&admin_keys);
    if administered {
        clients.push(ClientEntry {
            id: admin_id,
            x25519,
            ed25519,
        });
    }
    let file = ClusterFile {
        cluster_name: plan.cluster_name.clone(),
        u: plan.u,
        r: plan.r,
        data_dir: "data".into(),
        fsync: plan.fsync,
        idle_spin_us: plan.idle_spin_us,
        protocol: plan.protocol,
        selective_execution: plan.selective_execution,
        separate_stages: plan.separate_stages.is_some(),
        exec_u: plan.separate_stages.filter(|u| *u != plan.u),
        knobs: plan.knobs.clone(),
        metrics_token_file: plan.metrics_token.then(|| METRICS_TOKEN_FILE.to_string()),
        recovery_interval_secs: plan.recovery_interval_secs,
        replicas,
        clients,
        admin_client: administered.then_some(admin_id),
        reconfigurations: Vec::new(),
    };
    let cluster = Cluster::from_file(file.clone(), out)?;
    fs::create_dir_all(out).map_err(|e| FileError(format!("cannot create {}: {e}", out.display())))?;
    let text = toml::to_string(&file).map_err(|e| FileError(e.to_string()))?;
    fs::write(out.join("cluster.toml"), text).map_err(|e| FileError(format!("cannot write cluster.toml: {e}")))?;
    for (i, keys) in replica_keys.iter().enumerate() {
        let process = Process::Replica(ReplicaId(i as u32));
        write_key_file(&cluster.key_path(i as u32), &plan.cluster_name, process, keys)?;
    }
    if plan.metrics_token {
        let mut token = [0u8; 32];
        getrandom::fill(&mut token).map_err(|e| FileError(format!("no random numbers for the metrics token: {e}")))?;
        let path = out.join(METRICS_TOKEN_FILE);
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(|e| FileError(format!("cannot create {}: {e}", dir.display())))?;
        }
        write_private(&path, &format!("{}\n", hex::encode(token)))?;
    }
    for (c, keys) in client_keys.iter().enumerate() {
        let client = ClientFile {
            client_id: c as u32,
            secret: secret_hex(keys),
            cluster: file.clone(),
        };
        let text = toml::to_string(&client).map_err(|e| FileError(e.to_string()))?;
        write_private(&out.join(format!("client-{c}.toml")), &text)?;
    }
    if administered {
        let admin = ClientFile {
            client_id: admin_id,
            secret: secret_hex(&admin_keys),
            cluster: file.clone(),
        };
        let text = toml::to_string(&admin).map_err(|e| FileError(e.to_string()))?;
        write_private(&out.join(ADMIN_FILE), &text)?;
    }
    Ok(cluster)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn plan() -> InitPlan {
        InitPlan {
            cluster_name: "test".into(),
            u: 1,
            r: 1,
            hosts: vec!["127.0.0.1".into()],
            clients: 2,
            base_port: 7000,
            ports: None,
            knobs: None,
            fsync: FsyncPolicy::Always,
            idle_spin_us: crate::spin::IDLE_SPIN_DEFAULT_US,
            unix_dir: None,
            metrics_host: Default::default(),
            metrics_token: false,
            recovery_interval_secs: 0,
            protocol: Default::default(),
            selective_execution: false,
            separate_stages: None,
        }
    }

    #[test]
    fn a_single_host_plan_gets_unix_socket_listeners_and_metrics_stay_tcp() {
        let dir = tempfile::tempdir().unwrap();
        let local = InitPlan {
            unix_dir: Some(dir.path().to_path_buf()),
            ..plan()
        };
        init_cluster(&local, dir.path()).unwrap();
        let cluster = Cluster::load(&dir.path().join("cluster.toml")).unwrap();
        let entry = cluster.file.replica(2).unwrap();
        let sock = |name: &str| format!("unix:{}", dir.path().join(name).display());
        assert_eq!(entry.replica_addr, sock("replica-2.sock"));
        assert_eq!(entry.client_addr, sock("clients-2.sock"));
        assert_eq!(
            endpoint(&entry.client_addr).unwrap(),
            Endpoint::Unix(dir.path().join("clients-2.sock"))
        );
        assert_eq!(entry.metrics_addr, "127.0.0.1:7202");
        let e = resolve(&entry.replica_addr).unwrap_err().to_string();
        assert!(e.contains("HTTP over TCP; give host:port"), "{e}");
        let long = InitPlan {
            unix_dir: Some(PathBuf::from(format!("/{}", "d".repeat(120)))),
            ..plan()
        };
        let e = init_cluster(&long, dir.path()).err().unwrap().to_string();
        assert!(e.contains("at most 107 bytes"), "{e}");
    }

    /// A cluster.toml may name Aliph's Backup instance `protocol = "backup"`: it is PBFT.
    #[test]
    fn protocol_backup_in_cluster_toml_runs_pbft() {
        let dir = tempfile::tempdir().unwrap();
        init_cluster(&plan(), dir.path()).unwrap();
        let path = dir.path().join("cluster.toml");
        let text = fs::read_to_string(&path).unwrap();
        assert!(!text.contains("protocol"), "PBFT, the default, is not written");
        fs::write(&path, format!("protocol = \"backup\"\n{text}")).unwrap();
        let cluster = Cluster::load(&path).unwrap();
        assert_eq!(cluster.config.protocol, OrderProtocol::Pbft);
    }

    #[test]
    fn init_writes_loadable_files_with_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        init_cluster(&plan(), dir.path()).unwrap();
        let cluster = Cluster::load(&dir.path().join("cluster.toml")).unwrap();
        assert_eq!(cluster.config.replicas.len(), 4);
        assert_eq!(cluster.file.replica(2).unwrap().client_addr, "127.0.0.1:7102");
        for i in 0..4 {
            let path = cluster.key_path(i);
            assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
            load_replica_keys(&cluster, i, &path).unwrap();
        }
        let client = ClientFile::load(&dir.path().join("client-1.toml")).unwrap();
        assert_eq!(client.id, ClientId(1));
        let text = fs::read_to_string(dir.path().join("client-1.toml")).unwrap();
        assert_eq!(text.matches("secret").count(), 1, "only the client's own secret");
    }

    #[test]
    fn init_names_an_administrator_and_listed_changes_make_the_latest_configuration() {
        use upright_core::reconfig::Reconfiguration;
        let dir = tempfile::tempdir().unwrap();
        init_cluster(&plan(), dir.path()).unwrap();
        let path = dir.path().join("cluster.toml");
        let cluster = Cluster::load(&path).unwrap();
        assert_eq!(cluster.file.admin_client, Some(2), "after clients 0 and 1");
        assert_eq!(cluster.config.admin, Some(ClientId(2)));
        let admin = ClientFile::load(&dir.path().join(ADMIN_FILE)).unwrap();
        assert_eq!(admin.id, ClientId(2));
        assert_eq!(
            fs::metadata(dir.path().join(ADMIN_FILE)).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // Grow to six replicas (u = 2): the new ones' addresses come from the change.
        let mut grown: Vec<String> = cluster.file.replicas.iter().map(endpoint_string).collect();
        let mut keys: Vec<_> = cluster.config.replicas.iter().map(|r| r.keys).collect();
        for i in 4..6 {
            grown.push(format!(
                "127.0.0.1:{} 127.0.0.1:{} 127.0.0.1:{}",
                7000 + i,
                7100 + i,
                7200 + i
            ));
            keys.push(fresh_keys().public());
        }
        let change = Reconfiguration {
            epoch: 1,
            from_u: 1,
            from_r: 1,
            from_replicas: cluster.config.replicas.iter().map(|r| r.keys).collect(),
            u: 2,
            r: 1,
            replicas: keys,
            endpoints: grown,
        }
        .sign(&cluster.config.cluster_name, &admin.keys);
        let mut file = cluster.file.clone();
        file.reconfigurations.push(hex::encode(change.to_operation()));
        let text = toml::to_string(&file).unwrap();
        fs::write(&path, text).unwrap();
        let latest = Cluster::load(&path).unwrap();
        assert_eq!((latest.config.epoch(), latest.config.replicas.len()), (1, 6));
        assert_eq!((latest.file.u, latest.file.replicas.len()), (2, 6));
        assert_eq!(latest.file.replica(5).unwrap().client_addr, "127.0.0.1:7105");
        let initial = latest.in_config(latest.initial.clone()).unwrap();
        assert_eq!((initial.file.u, initial.file.replicas.len()), (1, 4));
        assert_eq!(initial.file.replicas, cluster.file.replicas);
        // A change that does not follow is a clear error.
        file.reconfigurations.push(hex::encode(change.to_operation()));
        let e = Cluster::from_file(file.clone(), dir.path()).err().unwrap().to_string();
        assert!(e.contains("reconfigurations[1] does not follow"), "{e}");
        file.reconfigurations = vec!["zz".into()];
        let e = Cluster::from_file(file, dir.path()).err().unwrap().to_string();
        assert!(e.contains("reconfigurations[0]: not hex"), "{e}");
    }

    #[test]
    fn replicas_keep_their_slot_when_a_change_moves_them_and_added_ones_take_fresh_slots() {
        use upright_core::reconfig::Reconfiguration;
        let dir = tempfile::tempdir().unwrap();
        init_cluster(&plan(), dir.path()).unwrap();
        let path = dir.path().join("cluster.toml");
        let admin = ClientFile::load(&dir.path().join(ADMIN_FILE)).unwrap();
        // Applies a change to `keys` with `endpoints` and (u, r), as `upright reconfigure` would.
        let change = |keys: Vec<PublicKeys>, endpoints: Vec<String>, u: usize| {
            let cluster = Cluster::load(&path).unwrap();
            let signed = Reconfiguration {
                epoch: cluster.config.epoch() + 1,
                from_u: cluster.config.u,
                from_r: cluster.config.r,
                from_replicas: cluster.config.replicas.iter().map(|r| r.keys).collect(),
                u,
                r: 1,
                replicas: keys,
                endpoints,
            }
            .sign(&cluster.config.cluster_name, &admin.keys);
            record_change(&path, &signed).unwrap();
            Cluster::load(&path).unwrap()
        };
        let first = Cluster::load(&path).unwrap();
        let endpoint = |i: u32| format!("127.0.0.1:{} 127.0.0.1:{} 127.0.0.1:{}", 7000 + i, 7100 + i, 7200 + i);
        let mut keys: Vec<_> = first.config.replicas.iter().map(|r| r.keys).collect();
        let mut endpoints: Vec<String> = first.file.replicas.iter().map(endpoint_string).collect();
        let added = [fresh_keys().public(), fresh_keys().public()];
        keys.extend(added);
        endpoints.extend([endpoint(4), endpoint(5)]);
        let grown = change(keys.clone(), endpoints.clone(), 2);
        assert_eq!(grown.slots(), &keys[..]);
        // Remove slots 1 and 2 (u = 1): the others move to the positions reconfig::without gives.
        let kept = upright_core::reconfig::without(&keys, &[1, 2], 5, 3);
        let kept_endpoints: Vec<String> = kept
            .iter()
            .map(|k| endpoints[keys.iter().position(|x| x == k).unwrap()].clone())
            .collect();
        let shrunk = change(kept.clone(), kept_endpoints.clone(), 1);
        assert_eq!(shrunk.slots(), &keys[..], "slots never change");
        assert_eq!(shrunk.slot_of(&keys[4]), Some(4));
        let moved = shrunk.config.replica_with(&keys[4]).unwrap();
        assert_ne!(moved.0, 4, "slot 4 moved");
        assert_eq!(shrunk.member_entry(4).unwrap().id, moved.0);
        assert_eq!(shrunk.member_entry(4).unwrap().replica_addr, "127.0.0.1:7004");
        let e = shrunk.member_entry(1).err().unwrap().to_string();
        assert!(e.contains("replica 1 is not a member of configuration epoch 2"), "{e}");
        let e = shrunk.slot_keys(6).err().unwrap().to_string();
        assert!(
            e.contains("there is no replica 6 (the cluster has had replicas 0..5)"),
            "{e}"
        );
        // A replica added now takes slot 6, not a freed position's number.
        let mut regrown = kept.clone();
        regrown.extend([fresh_keys().public(), fresh_keys().public()]);
        let mut regrown_endpoints = kept_endpoints;
        regrown_endpoints.extend([endpoint(6), endpoint(7)]);
        let again = change(regrown.clone(), regrown_endpoints, 2);
        assert_eq!(again.slot_of(&regrown[4]), Some(6));
        assert_eq!(again.slot_of(&regrown[5]), Some(7));
        assert_eq!(again.member_entry(6).unwrap().id, 4);
        // The key file of a moved replica loads by its slot.
        let moved = again.config.replica_with(&keys[3]).unwrap();
        assert_ne!(moved.0, 3, "slot 3 moved");
        let secret = load_replica_keys(&again, 3, &again.key_path(3)).unwrap();
        assert_eq!(secret.public(), keys[3]);
    }

    #[test]
    fn metrics_stay_on_loopback_unless_told_and_a_token_file_is_private_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let spread = InitPlan {
            hosts: (1..=4).map(|i| format!("10.0.0.{i}")).collect(),
            ..plan()
        };
        let cluster = init_cluster(&spread, dir.path()).unwrap();
        let entry = cluster.file.replica(1).unwrap();
        assert_eq!(entry.client_addr, "10.0.0.2:7101");
        assert_eq!(entry.metrics_addr, "127.0.0.1:7201");
        assert_eq!(cluster.metrics_token().unwrap(), None);
        let text = fs::read_to_string(dir.path().join("cluster.toml")).unwrap();
        assert!(!text.contains("metrics_token_file"), "{text}");

        let dir = tempfile::tempdir().unwrap();
        let exposed = InitPlan {
            metrics_host: MetricsHost::Host("0.0.0.0".into()),
            metrics_token: true,
            ..spread
        };
        init_cluster(&exposed, dir.path()).unwrap();
        let cluster = Cluster::load(&dir.path().join("cluster.toml")).unwrap();
        assert_eq!(cluster.file.replica(3).unwrap().metrics_addr, "0.0.0.0:7203");
        let own = InitPlan {
            metrics_host: MetricsHost::parse("replica"),
            hosts: (1..=4).map(|i| format!("10.0.0.{i}")).collect(),
            ..plan()
        };
        let elsewhere = tempfile::tempdir().unwrap();
        let each = init_cluster(&own, elsewhere.path()).unwrap();
        assert_eq!(each.file.replica(2).unwrap().metrics_addr, "10.0.0.3:7202");
        let path = dir.path().join(METRICS_TOKEN_FILE);
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let token = cluster.metrics_token().unwrap().expect("a token");
        assert_eq!(token.len(), 64);
        assert_eq!(fs::read_to_string(&path).unwrap().trim(), token);
        let client = fs::read_to_string(dir.path().join("client-0.toml")).unwrap();
        assert!(!client.contains(&token), "clients never get the token");
        // A named token file that is missing or empty is an error, not an open endpoint.
        fs::write(&path, "\n").unwrap();
        assert!(cluster
            .metrics_token()
            .unwrap_err()
            .to_string()
            .contains("not a metrics token"));
        fs::remove_file(&path).unwrap();
        assert!(cluster
            .metrics_token()
            .unwrap_err()
            .to_string()
            .contains("cannot read the metrics token"));
    }

    #[test]
    fn misconfigurations_are_one_line_errors() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = init_cluster(&plan(), dir.path()).unwrap();
        let e = |r: Result<SecretKeys, FileError>| {
            let msg = r.err().expect("must fail").to_string();
            assert!(!msg.contains('\n'), "{msg}");
            msg
        };
        assert!(e(load_replica_keys(&cluster, 0, &dir.path().join("missing.key"))).contains("cannot read key file"));
        assert!(e(load_replica_keys(&cluster, 1, &cluster.key_path(0))).contains("belongs to replica 0, not replica 1"));
        let other = tempfile::tempdir().unwrap();
        let mut p = plan();
        p.cluster_name = "other".into();
        init_cluster(&p, other.path()).unwrap();
        let other_key = other.path().join("keys/replica-0.key");
        assert!(e(load_replica_keys(&cluster, 0, &other_key)).contains("is for cluster \"other\""));
        // Same cluster name, different keys.
        let same = tempfile::tempdir().unwrap();
        init_cluster(&plan(), same.path()).unwrap();
        assert!(e(load_replica_keys(&cluster, 0, &same.path().join("keys/replica-0.key"))).contains("does not match"));
        assert!(cluster
            .file
            .replica(9)
            .unwrap_err()
            .to_string()
            .contains("not in the config"));
        let mut bad = plan();
        bad.hosts = vec!["a".into(), "b".into()];
        assert!(init_cluster(&bad, dir.path())
            .err()
            .unwrap()
            .to_string()
            .contains("needs 4 replicas"));
    }

    #[test]
    fn idle_spin_defaults_when_absent_and_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        init_cluster(&plan(), dir.path()).unwrap();
        let path = dir.path().join("cluster.toml");
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("idle_spin_us = 100"), "init writes the default: {text}");
        // A file written before the setting existed gets the default.
        let without: String = text
            .lines()
            .filter(|l| !l.starts_with("idle_spin_us"))
            .map(|l| format!("{l}\n"))
            .collect();
        fs::write(&path, &without).unwrap();
        assert_eq!(
            Cluster::load(&path).unwrap().file.idle_spin_us,
            crate::spin::IDLE_SPIN_DEFAULT_US
        );
        fs::write(&path, text.replace("idle_spin_us = 100", "idle_spin_us = 0")).unwrap();
        assert_eq!(Cluster::load(&path).unwrap().file.idle_spin_us, 0);
        fs::write(&path, text.replace("idle_spin_us = 100", "idle_spin_us = 20000")).unwrap();
        let msg = Cluster::load(&path).unwrap_err().to_string();
        assert!(msg.contains("idle_spin_us = 20000 is too large"), "{msg}");
    }

    #[test]
    fn a_partial_knobs_table_takes_the_defaults_for_the_rest_and_bad_values_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        init_cluster(&plan(), dir.path()).unwrap();
        let path = dir.path().join("cluster.toml");
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, format!("{text}\n[knobs]\nheartbeat_interval_us = 0\n")).unwrap();
        let knobs = Cluster::load(&path).unwrap().config.knobs.clone();
        assert_eq!(knobs.heartbeat_interval_us, 0);
        assert_eq!(
            Knobs {
                heartbeat_interval_us: 0,
                ..Knobs::default()
            },
            knobs
        );
        fs::write(&path, format!("{text}\n[knobs]\nheartbeat_interval_us = 5\n")).unwrap();
        let msg = Cluster::load(&path).unwrap_err().to_string();
        assert!(msg.contains("heartbeat_interval_us"), "{msg}");
    }
}
