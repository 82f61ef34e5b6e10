//! The `upright` command: initialise a cluster, run replicas, show status, run a local demo.

// The doc comments of the command-line arguments are `--help` text, where `<id>` is a
// placeholder, not an HTML tag.
#![allow(rustdoc::invalid_html_tags)]

mod bench;
mod demo;
mod hdfs_bench;
mod zk_bench;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use bytes::Bytes;
use clap::{Parser, Subcommand};
use upright_core::ids::{ClientId, Process, ReplicaId};
use upright_core::kv::{KvOperation, KvReply};
use upright_node::files::{self, ClientFile, Cluster, FileError, InitPlan};
use upright_node::replica::{run_replica, ReplicaSpec};
use upright_node::storage::StorageOptions;

/// mimalloc instead of glibc's allocator: every message is decoded into fresh buffers, and the
/// allocator was ~14% of a replica's CPU in the profile (docs/PERFORMANCE.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "upright",
    version,
    about = "Byzantine-fault-tolerant replication: run and manage an upright cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a key pair: prints the public keys; writes the secret key file (mode 0600) with --out.
    Keygen {
        /// Where to write the key file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Cluster name recorded in the key file.
        #[arg(long, default_value = "upright")]
        cluster: String,
        /// Replica id the key is for (default: client 0 unless --replica is given).
        #[arg(long)]
        replica: Option<u32>,
        /// Client id the key is for.
        #[arg(long)]
        client: Option<u32>,
    },
    /// Write a cluster config, one key file per replica and one config per client into a directory.
    Init {
        /// Number of replicas (must be 2u + r + 1).
        #[arg(long)]
        replicas: usize,
        /// Failures of any kind tolerated.
        #[arg(long)]
        u: usize,
        /// Byzantine failures tolerated.
        #[arg(long)]
        r: usize,
        /// Comma-separated hosts, one per replica (or one for all).
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
        /// Number of client identities to create.
        #[arg(long, default_value_t = 4)]
        clients: u32,
        /// Cluster name.
        #[arg(long, default_value = "upright")]
        name: String,
        /// Replica i listens on base+i (replicas), base+100+i (clients), base+200+i (metrics).
        #[arg(long, default_value_t = 7000)]
        base_port: u16,
        /// Host the metrics and status endpoints listen on (default: 127.0.0.1, so only the
        /// replica's own machine can read them); `replica` for each replica's own host, or an
        /// address such as 0.0.0.0, to let a monitoring host in (preferably with --metrics-token).
        #[arg(long)]
        metrics_host: Option<String>,
        /// Write a token (keys/metrics.token) that the metrics and status endpoints then require
        /// (`Authorization: Bearer <token>`; `upright status` sends it).
        #[arg(long)]
        metrics_token: bool,
        /// Key refresh (PBFT's T_k): every replica and client starts new session keys this often
        /// (a signed NEW-KEY to its peers) and refuses the old ones 2 s later. 0: the long-term
        /// keys stay in use. Written to cluster.toml as `key_refresh_us`.
        #[arg(long, default_value_t = 0)]
        key_refresh_secs: u64,
        /// Proactive recovery (PBFT's watchdog period T_w): every replica recovers once this
        /// often, replica i at i * T_w / n into each period (at least 10 s per replica). 0: only
        /// when told (`upright recover`). Written to cluster.toml as `recovery_interval_secs`.
        #[arg(long, default_value_t = 0)]
        recovery_interval_secs: u64,
        /// Selective execution (ODRC, docs/ODRC.md): each object's requests run on r + 1
        /// execution replicas only; the others catch up at each checkpoint. Needs a service
        /// with object checkpoints (`--service kv` or `redis`). Written to cluster.toml as
        /// `selective_execution`.
        #[arg(long)]
        selective_execution: bool,
        /// Run the execution members in processes of their own (docs/ODRC.md "Separated
        /// stages"): replicas 0 .. 2u + r + 1 run authentication and order, the next n_exec one
        /// execution member each (start them with `upright replica --stages exec --id i`).
        /// --replicas then counts both. PBFT only. Written to cluster.toml as `separate_stages`.
        #[arg(long)]
        separate_stages: bool,
        /// With --separate-stages: the failures the execution stage tolerates (at least --u;
        /// default --u); it has exec_u + max(exec_u, r) + 1 members. Written as `exec_u`.
        #[arg(long, requires = "separate_stages")]
        exec_u: Option<usize>,
        /// The ordering protocol: `pbft` (Byzantine faults), `quorum` (Aliph's Quorum with PBFT
        /// as its Backup: fastest for one client at a time; needs --u equal to --r, no admin.toml),
        /// `chain` (Aliph's Chain with PBFT as its Backup: for many clients; needs --r of at
        /// least 1, no admin.toml), `aliph` (Quorum and Chain in turn with PBFT as Backup, as
        /// Aliph switches between them; needs --u equal to --r, no admin.toml), `backup` (another
        /// name of pbft: Aliph's Backup is the three-phase path) or `lcr` (crashes only, needs
        /// --r 0; its membership is fixed, so no admin.toml is written). Default: lcr with --r 0, pbft otherwise (give --protocol pbft for an r = 0
        /// cluster that is to be reconfigured). Written to cluster.toml as `protocol`.
        #[arg(long, value_parser = ["pbft", "backup", "quorum", "chain", "aliph", "lcr"])]
        protocol: Option<String>,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Run one replica (all its co-located stages) until interrupted.
    Replica {
        /// Cluster config.
        #[arg(long)]
        config: PathBuf,
        /// Replica id: its position in cluster.toml; with --stages, the member's index in
        /// those stages.
        #[arg(long)]
        id: u32,
        /// The stages this process runs, comma-separated (`auth,order` or `exec`), when the
        /// cluster runs them in separate processes (`separate_stages = true`): `--stages exec
        /// --id i` is execution member i. Refused when cluster.toml places other stages there.
        /// Default: whatever cluster.toml places on replica --id.
        #[arg(long, value_delimiter = ',', value_parser = ["auth", "order", "exec"])]
        stages: Vec<String>,
        /// Key file (default: keys/replica-<id>.key next to the config).
        #[arg(long)]
        key: Option<PathBuf>,
        /// The replicated service: `kv` (the core's in-memory KV), `redis` (the Redis-compatible
        /// store of upright-kv), `zk` (the ZooKeeper-compatible service of upright-zk), `fs` (the
        /// NFSv3 file system of upright-fs), `hdfs` (the HDFS NameNode of upright-hdfs) or
        /// `objects` (a paged test service of `--objects` generated objects, for the
        /// state-transfer benchmark). Every replica of a cluster must run the same one.
        #[arg(long, default_value = "kv", value_parser = ["kv", "redis", "zk", "fs", "hdfs", "objects"])]
        service: String,
        /// `--service objects`: how many objects.
        #[arg(long, default_value_t = 1_000_000)]
        objects: u64,
        /// `--service objects`: bytes per object (at most 65536).
        #[arg(long, default_value_t = 1088,
              value_parser = clap::value_parser!(u64).range(1..=upright_core::limits::PAGE_BYTES_MAX as u64))]
        object_bytes: u64,
    },
    /// Show every replica's view, last executed batch, checkpoint and health.
    Status {
        /// Cluster config.
        #[arg(long)]
        config: PathBuf,
    },
    /// Proactive recovery of one replica (docs/OPERATING.md): it restarts from the binary on
    /// disk with nothing of its memory, starts a new key epoch, estimates its recovery point
    /// from its peers, checks its state against a certified checkpoint (fetching what differs)
    /// and rejoins while the others serve. Waits until it has recovered, showing progress.
    Recover {
        /// Cluster config.
        #[arg(long)]
        config: PathBuf,
        /// Replica id.
        #[arg(long)]
        id: u32,
        /// Give up waiting after this many seconds (the recovery itself goes on).
        #[arg(long, default_value_t = 300)]
        timeout_secs: u64,
        /// Only ask; do not wait for the recovery to complete.
        #[arg(long)]
        no_wait: bool,
    },
    /// Changes the cluster's replicas or its fault model while it serves (docs/OPERATING.md
    /// "Reconfiguration"): signs the change with the administrator's key (admin.toml from
    /// `upright init`), orders it, records it in cluster.toml, and waits until the replicas of
    /// the new configuration run in it. Added replicas get fresh keys and the next free ids
    /// (keys/replica-<id>.key); start each with `upright replica --config cluster.toml --id <id>`.
    Reconfigure {
        /// Cluster config (updated with the change).
        #[arg(long)]
        config: PathBuf,
        /// Add a replica listening for replicas on HOST:PORT (clients on PORT + 100, metrics on
        /// 127.0.0.1:PORT + 200, as `upright init` lays them out); repeatable.
        #[arg(long, value_name = "HOST:PORT")]
        add: Vec<String>,
        /// Remove replica ID (the id `upright status` shows and `upright replica --id` takes);
        /// repeatable. The others keep their ids; inside the protocol some may move to the
        /// removed one's position (docs/OPERATING.md).
        #[arg(long, value_name = "ID")]
        remove: Vec<u32>,
        /// The new u (default: unchanged).
        #[arg(long)]
        u: Option<usize>,
        /// The new r (default: unchanged).
        #[arg(long)]
        r: Option<usize>,
        /// The administrator's client file (default: admin.toml beside the config).
        #[arg(long)]
        admin: Option<PathBuf>,
        /// Give up waiting after this many seconds.
        #[arg(long, default_value_t = 120)]
        timeout_secs: u64,
    },
    /// Key-value operations against a running cluster.
    Kv {
        /// Client config (client-<c>.toml from `upright init`).
        #[arg(long)]
        client: PathBuf,
        /// put KEY VALUE | get KEY | append KEY VALUE | delete KEY
        #[arg(num_args = 2..=3)]
        args: Vec<String>,
    },
    /// Serve Redis clients (RESP2/RESP3) from a running cluster whose replicas run
    /// `--service redis`; runs until Ctrl-C or SIGTERM. The gateway is a client of the cluster: run
    /// it beside the applications it serves.
    Redis {
        /// Client config of the pool's first member (client-<c>.toml from `upright init`); a pool
        /// of N also uses client-<c+1>.toml .. client-<c+N-1>.toml beside it. Each member keeps its
        /// request id in client-<id>.last-request-id beside its file.
        #[arg(long)]
        client: PathBuf,
        /// Address to serve Redis clients on (host:port).
        #[arg(long, default_value = "127.0.0.1:6379")]
        listen: String,
        /// Upright clients in the gateway's pool: the most operations in flight at once (one
        /// client identity each).
        #[arg(long, default_value_t = demo::GATEWAY_POOL,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(upright_node::gateway::clients::POOL_MAX)))]
        pool: u32,
        /// Users that AUTH selects, each with its own upright client identities and command set
        /// (a TOML file of `[[user]]` tables: name, password, client, pool, commands; see
        /// docs/OPERATING.md). Without it anyone may run every command as `default`, through
        /// --client's pool.
        #[arg(long)]
        users: Option<PathBuf>,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Serve ZooKeeper clients (kazoo, zkCli.sh, the C and Java clients) from a running cluster
    /// whose replicas run `--service zk`; runs until Ctrl-C or SIGTERM. The gateway is a client of
    /// the cluster: run it beside the applications it serves; a client may be given several
    /// gateways in its connect string and keeps its session when it moves between them.
    Zk {
        /// Client config of the pool's first member (client-<c>.toml from `upright init`); a pool
        /// of N also uses client-<c+1>.toml .. client-<c+N-1>.toml beside it. Each member keeps its
        /// request id in client-<id>.last-request-id beside its file. Two gateways of one cluster
        /// need distinct client identities.
        #[arg(long)]
        client: PathBuf,
        /// Address to serve ZooKeeper clients on (host:port).
        #[arg(long, default_value = "127.0.0.1:2181")]
        listen: String,
        /// Upright clients in the gateway's pool (each session's requests go through one of them).
        #[arg(long, default_value_t = 1,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(upright_node::gateway::clients::POOL_MAX)))]
        pool: u32,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Serve NFS version 3 clients (the Linux kernel client, libnfs and its nfs-ls / nfs-cp /
    /// nfs-cat, Python NFS clients) from a running cluster whose replicas run `--service fs`;
    /// runs until Ctrl-C or SIGTERM. MOUNT is served on the same port, so a client needs no
    /// portmapper (libnfs: `nfs://127.0.0.1/?nfsport=P&mountport=P&version=3`). The gateway is a
    /// client of the cluster: run it beside the applications it serves.
    Nfs {
        /// Client config of the pool's first member (client-<c>.toml from `upright init`); a pool
        /// of N also uses client-<c+1>.toml .. client-<c+N-1>.toml beside it. Each member keeps its
        /// request id in client-<id>.last-request-id beside its file. Two gateways of one cluster
        /// need distinct client identities.
        #[arg(long)]
        client: PathBuf,
        /// Address to serve NFS and MOUNT clients on (host:port).
        #[arg(long, default_value = "127.0.0.1:2049")]
        listen: String,
        /// Upright clients in the gateway's pool (operations in flight at once; each packs the
        /// calls of many connections).
        #[arg(long, default_value_t = 4,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(upright_node::gateway::clients::POOL_MAX)))]
        pool: u32,
        #[command(flatten)]
        tls: TlsArgs,
    },
    /// Serve HDFS clients over WebHDFS (hdfscli, Hadoop's `webhdfs://` file system and FsShell)
    /// from a running cluster whose replicas run `--service hdfs` (the NameNode) and its
    /// DataNodes (`upright datanode`); runs until Ctrl-C or SIGTERM. The gateway writes each
    /// block to its DataNodes while hashing it and commits the hash; every read is checked
    /// against the committed hashes (docs/HDFS.md).
    Hdfs {
        /// Client config of the pool's first member (client-<c>.toml from `upright init`); a pool
        /// of N also uses client-<c+1>.toml .. client-<c+N-1>.toml beside it. The gateway's
        /// clients and the DataNodes' need distinct identities.
        #[arg(long)]
        client: PathBuf,
        /// Address to serve WebHDFS on (host:port; HDFS's NameNode web port is 9870).
        #[arg(long, default_value = "127.0.0.1:9870")]
        listen: String,
        /// Upright clients in the gateway's pool (NameNode commands in flight at once).
        #[arg(long, default_value_t = 8,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(upright_node::gateway::clients::POOL_MAX)))]
        pool: u32,
    },
    /// Run an HDFS DataNode for a cluster whose replicas run `--service hdfs`: stores block
    /// replicas with their 64 KiB sub-block hashes in --dir, serves them to the WebHDFS gateway
    /// and to other DataNodes, registers and heartbeats with the NameNode as an upright client
    /// (its DataNode id is that client's id) and scans its replicas in the background; runs until
    /// Ctrl-C or SIGTERM.
    Datanode {
        /// Its upright client identity (client-<c>.toml from `upright init`; the DataNode's id is
        /// c). Its request id is kept in client-<c>.last-request-id beside it.
        #[arg(long)]
        client: PathBuf,
        /// Address to serve blocks on (host:port).
        #[arg(long, default_value = "127.0.0.1:9864")]
        listen: String,
        /// The host:port the gateway and other DataNodes reach it on (default: --listen's bound
        /// address).
        #[arg(long)]
        advertise: Option<String>,
        /// Directory of its block replicas (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// Bytes it offers (reported to the NameNode).
        #[arg(long, default_value_t = 1 << 40)]
        capacity: u64,
        /// Seconds between background scans of every replica.
        #[arg(long, default_value_t = upright_hdfs::dataserver::SCAN_INTERVAL_DEFAULT.as_secs(),
              value_parser = clap::value_parser!(u64).range(1..))]
        scan_interval_secs: u64,
    },
    /// Start a local 4-replica cluster (u = r = 1; with --protocol lcr 3 replicas, u = 1, r = 0)
    /// on this host; runs until Ctrl-C.
    Demo {
        /// Run a client workload with a replica SIGKILLed and restarted, report, and exit.
        #[arg(long)]
        smoke: bool,
        /// Length of the smoke workload in seconds.
        #[arg(long, default_value_t = 6)]
        seconds: u64,
        /// Concurrent clients of the smoke workload.
        #[arg(long, default_value_t = 4)]
        clients: u32,
        /// Loopback port of the gateway: Redis protocol with `--service redis` (default 6379),
        /// ZooKeeper protocol with `--service zk` (default 2181), NFS version 3 and MOUNT with
        /// `--service fs` (default 2049), WebHDFS with `--service hdfs` (default 9870).
        #[arg(long)]
        port: Option<u16>,
        /// The replicated service: `redis` (Redis-compatible, served on --port), `zk`
        /// (ZooKeeper-compatible, served on --port), `fs` (an NFSv3 file system exporting `/`,
        /// served on --port), `hdfs` (UpRight-HDFS: the NameNode replicated, 3 DataNodes,
        /// WebHDFS served on --port) or `kv`. `--smoke` always uses `kv`.
        #[arg(long, default_value = "redis", value_parser = ["kv", "redis", "zk", "fs", "hdfs"])]
        service: String,
        /// Upright clients in the gateway's pool (operations in flight at once). Default: 1 for
        /// redis, whose gateway packs many connections' commands into one operation; 64 for zk,
        /// whose sessions each have one request at the cluster through their pool member; 4 for
        /// fs; 8 for hdfs (the DataNodes take the client identities after the pool's).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=64))]
        gateway_pool: Option<u32>,
        /// How long each replica spins (yielding its CPU to other threads) after it runs out of
        /// input, before it sleeps, in microseconds; 0 sleeps at once (cluster.toml's idle_spin_us).
        #[arg(long, default_value_t = upright_node::spin::IDLE_SPIN_DEFAULT_US,
              value_parser = clap::value_parser!(u64).range(0..=upright_node::files::IDLE_SPIN_US_MAX))]
        idle_spin_us: u64,
        /// Connect the replicas and the gateway over loopback TCP ports, as a cluster spread over
        /// machines would, instead of Unix-domain sockets in the demo's directory.
        #[arg(long)]
        tcp: bool,
        /// The ordering protocol: `pbft` (4 replicas, u = r = 1), `quorum` (Aliph's Quorum with
        /// PBFT as its Backup, 4 replicas, u = r = 1), `chain` (Aliph's Chain with PBFT as its
        /// Backup, 4 replicas, u = r = 1), `aliph` (Quorum and Chain in turn, 4 replicas, u = r =
        /// 1), `backup` (another name of pbft) or `lcr` (3 replicas, u = 1, r = 0: crashes only).
        #[arg(long, default_value = "pbft", value_parser = ["pbft", "backup", "quorum", "chain", "aliph", "lcr"])]
        protocol: String,
        /// Selective execution (ODRC, docs/ODRC.md): each request runs on the r + 1 execution
        /// replicas that maintain its keys or znodes (`--service redis`, `zk` or `kv`; with
        /// Redis, blocking commands, WATCH and keyspace notifications are refused; with
        /// ZooKeeper, persistent-recursive watches).
        #[arg(long)]
        selective_execution: bool,
    },
    /// Benchmark a local cluster beside the NO-REP baseline: throughput, latency, CPU per operation.
    Bench(Box<bench::BenchArgs>),
    /// Load any ZooKeeper service (upright-zk or Apache ZooKeeper) with closed-loop clients:
    /// creates, setData, getData or a 90/10 mix; throughput and p50/p99 latency.
    ZkBench(zk_bench::ZkBenchArgs),
    /// Load any WebHDFS service (upright-hdfs's gateway or Apache HDFS's NameNode) with clients
    /// that write files and read them back, checking every byte: throughput per phase, and the
    /// server's CPU with --server-pid.
    HdfsBench(hdfs_bench::HdfsBenchArgs),
    /// Run the unreplicated NO-REP baseline server of a u = r = 0 config (used by `bench`, and
    /// by scripts/nfs-bench.sh with `--service fs`): the service in memory, no agreement.
    Norep {
        /// Cluster config with u = r = 0.
        #[arg(long)]
        config: PathBuf,
        /// The service, as for `upright replica --service`: `kv`, `redis` or `fs` (NO-REP sends no
        /// pushes and sets no agreed-time wake-ups, so not `zk`).
        #[arg(long, default_value = "kv", value_parser = ["kv", "redis", "fs"])]
        service: String,
    },
}

/// A gateway's TLS settings (both or neither).
#[derive(clap::Args, Debug, Default)]
struct TlsArgs {
    /// Serve clients over TLS with this PEM certificate chain (leaf first); needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// `listener`, with TLS on its connections if a certificate was given (and a line saying so).
    fn listener(
        &self,
        listener: tokio::net::TcpListener,
    ) -> Result<upright_node::gateway::tls::GatewayListener, FileError> {
        use upright_node::gateway::tls::{GatewayListener, Tls};
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let tls = Tls::load(cert, key)?;
                println!("  TLS: clients must connect with TLS; certificate {}", cert.display());
                Some(tls)
            }
            _ => None,
        };
        Ok(GatewayListener::new(listener, tls))
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Keygen {
            out,
            cluster,
            replica,
            client,
        } => keygen(out, &cluster, replica, client),
        Command::Init {
            replicas,
            u,
            r,
            hosts,
            clients,
            name,
            base_port,
            metrics_host,
            metrics_token,
            key_refresh_secs,
            recovery_interval_secs,
            selective_execution,
            separate_stages,
            exec_u,
            protocol,
            out,
        } => init(
            (replicas, u, r),
            (
                protocol
                    .as_deref()
                    .unwrap_or(if r == 0 && !separate_stages { "lcr" } else { "pbft" }),
                selective_execution,
                separate_stages.then_some(exec_u.unwrap_or(u)),
            ),
            hosts,
            clients,
            name,
            (base_port, key_refresh_secs, recovery_interval_secs),
            (metrics_host, metrics_token),
            &out,
        ),
        Command::Replica {
            config,
            id,
            stages,
            key,
            service,
            objects,
            object_bytes,
        } => replica(&config, (id, &stages), key, &service, (objects, object_bytes as usize)),
        Command::Status { config } => runtime().block_on(status(&config)),
        Command::Recover {
            config,
            id,
            timeout_secs,
            no_wait,
        } => runtime().block_on(recover(&config, id, timeout_secs, !no_wait)),
        Command::Reconfigure {
            config,
            add,
            remove,
            u,
            r,
            admin,
            timeout_secs,
        } => {
            let change = ChangeArgs { add, remove, u, r };
            runtime().block_on(reconfigure(&config, &change, admin, timeout_secs))
        }
        Command::Kv { client, args } => runtime().block_on(kv(&client, &args)),
        Command::Redis {
            client,
            listen,
            pool,
            users,
            tls,
        } => {
            init_logging("warn");
            // One thread, as in the demo: the gateway is one event loop.
            single_thread_runtime().block_on(redis(&client, &listen, pool, users.as_deref(), &tls))
        }
        Command::Zk {
            client,
            listen,
            pool,
            tls,
        } => {
            init_logging("warn");
            single_thread_runtime().block_on(zk(&client, &listen, pool, &tls))
        }
        Command::Nfs {
            client,
            listen,
            pool,
            tls,
        } => {
            init_logging("warn");
            single_thread_runtime().block_on(nfs(&client, &listen, pool, &tls))
        }
        Command::Hdfs { client, listen, pool } => {
            init_logging("warn");
            runtime().block_on(hdfs(&client, &listen, pool))
        }
        Command::Datanode {
            client,
            listen,
            advertise,
            dir,
            capacity,
            scan_interval_secs,
        } => {
            init_logging("info");
            let settings = DatanodeSettings {
                advertise,
                dir,
                capacity,
                scan_interval: std::time::Duration::from_secs(scan_interval_secs),
            };
            runtime().block_on(datanode(&client, &listen, settings))
        }
        Command::Demo {
            smoke,
            seconds,
            clients,
            port,
            service,
            gateway_pool,
            idle_spin_us,
            tcp,
            protocol,
            selective_execution,
        } => {
            init_logging("warn");
            let service = if smoke { "kv" } else { service.as_str() };
            if selective_execution && !matches!(service, "redis" | "kv" | "zk") {
                eprintln!(
                    "error: --selective-execution needs a service with object checkpoints: --service redis, zk or kv, not {service}"
                );
                return ExitCode::from(2);
            }
            let gateway = demo::Gateway {
                port: port.unwrap_or(match service {
                    "zk" => 2181,
                    "fs" => 2049,
                    "hdfs" => 9870,
                    _ => 6379,
                }),
                pool: gateway_pool.unwrap_or(match service {
                    "zk" => demo::ZK_GATEWAY_POOL,
                    "fs" => demo::NFS_GATEWAY_POOL,
                    "hdfs" => demo::HDFS_GATEWAY_POOL,
                    _ => demo::GATEWAY_POOL,
                }),
            };
            // One thread, like a replica: the Redis gateway is one event loop. With two workers,
            // its connection tasks woke each other across threads (futex) and the workers
            // took turns on one core: 30% more gateway CPU per operation (docs/PERFORMANCE.md).
            let transport = if tcp {
                demo::Transport::Tcp
            } else {
                demo::Transport::Unix
            };
            single_thread_runtime().block_on(demo::run(
                smoke,
                seconds,
                clients,
                service,
                gateway,
                idle_spin_us,
                (
                    transport,
                    upright_core::config::OrderProtocol::from_name(&protocol).expect("clap checked the name"),
                    selective_execution,
                ),
            ))
        }
        Command::Bench(args) => {
            init_logging("warn");
            runtime().block_on(bench::run(*args))
        }
        Command::HdfsBench(args) => {
            init_logging("warn");
            runtime().block_on(hdfs_bench::run(args))
        }
        Command::ZkBench(args) => {
            init_logging("warn");
            runtime().block_on(zk_bench::run(args))
        }
        Command::Norep { config, service } => {
            init_logging("info");
            runtime().block_on(bench::norep(&config, replica_service(&service, 0, 0, 1)))
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn single_thread_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn init_logging(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colours only on a terminal: a replica the demo starts logs to a file.
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .try_init();
}

fn keygen(
    out: Option<PathBuf>,
    cluster: &str,
    replica: Option<u32>,
    client: Option<u32>,
) -> Result<ExitCode, FileError> {
    let process = match (replica, client) {
        (Some(r), None) => Process::Replica(ReplicaId(r)),
        (None, c) => Process::Client(ClientId(c.unwrap_or(0))),
        (Some(_), Some(_)) => return Err(FileError("give --replica or --client, not both".into())),
    };
    let keys = files::fresh_keys();
    let public = keys.public();
    println!(
        "# public keys of {} (paste into cluster.toml)",
        files::process_name(process)
    );
    println!("x25519 = \"{}\"", hex_of(&public.x25519));
    println!("ed25519 = \"{}\"", hex_of(&public.ed25519));
    if let Some(path) = out {
        files::write_key_file(&path, cluster, process, &keys)?;
        println!("# secret key written to {} (mode 0600)", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[allow(clippy::too_many_arguments)]
fn init(
    (replicas, u, r): (usize, usize, usize),
    (protocol, selective_execution, separate_stages): (&str, bool, Option<usize>),
    hosts: Vec<String>,
    clients: u32,
    name: String,
    (base_port, key_refresh_secs, recovery_interval_secs): (u16, u64, u64),
    (metrics_host, metrics_token): (Option<String>, bool),
    out: &Path,
) -> Result<ExitCode, FileError> {
    match separate_stages {
        None if replicas != 2 * u + r + 1 => {
            return Err(FileError(format!(
                "--replicas {replicas} does not match u = {u}, r = {r}: the cluster needs 2u + r + 1 = {} replicas",
                2 * u + r + 1
            )));
        }
        Some(exec_u) => {
            if exec_u < u {
                return Err(FileError(format!(
                    "--exec-u {exec_u} is below --u {u}: the execution stage must tolerate at least the failures the cluster does"
                )));
            }
            let q = upright_core::quorum::Quorums::new(u, r)
                .and_then(|q| q.with_separate_stages(exec_u))
                .map_err(|e| FileError(e.to_string()))?;
            if replicas != q.n_replicas() {
                return Err(FileError(format!(
                    "--replicas {replicas} does not match u = {u}, r = {r}, exec_u = {exec_u} with --separate-stages: the cluster needs 2u + r + 1 = {} authentication and order replicas and exec_u + max(exec_u, r) + 1 = {} execution replicas, {} in all",
                    q.n_order,
                    q.n_exec,
                    q.n_replicas()
                )));
            }
        }
        None => {}
    }
    if hosts.is_empty() {
        return Err(FileError(
            "--hosts is required (one per replica, or one for all)".into(),
        ));
    }
    let plan = InitPlan {
        cluster_name: name,
        u,
        r,
        hosts,
        clients,
        base_port,
        ports: None,
        knobs: (key_refresh_secs > 0).then(|| upright_core::config::Knobs {
            key_refresh_us: key_refresh_secs.saturating_mul(1_000_000),
            ..Default::default()
        }),
        fsync: Default::default(),
        idle_spin_us: upright_node::spin::IDLE_SPIN_DEFAULT_US,
        unix_dir: None,
        metrics_host: metrics_host
            .as_deref()
            .map(files::MetricsHost::parse)
            .unwrap_or_default(),
        metrics_token,
        recovery_interval_secs,
        protocol: upright_core::config::OrderProtocol::from_name(protocol).expect("clap checked the name"),
        selective_execution,
        separate_stages,
    };
    let cluster = files::init_cluster(&plan, out)?;
    println!(
        "wrote {}/cluster.toml (public: share with every machine); ordering protocol {}{}",
        out.display(),
        protocol,
        if protocol == "lcr" {
            " (crashes only; the membership is fixed)"
        } else {
            ""
        }
    );
    for i in 0..replicas as u32 {
        println!(
            "wrote {} (secret: copy only to replica {i}'s machine)",
            cluster.key_path(i).display()
        );
    }
    for c in 0..clients {
        println!("wrote {}/client-{c}.toml (secret: client {c} only)", out.display());
    }
    if cluster.file.metrics_token_file.is_some() {
        println!(
            "wrote {}/{} (secret: every replica's machine and whoever reads the metrics)",
            out.display(),
            files::METRICS_TOKEN_FILE
        );
    }
    if separate_stages.is_some() {
        println!(
            "run authentication and order member i with: upright replica --config {0}/cluster.toml --stages auth,order --id i\nrun execution member i with: upright replica --config {0}/cluster.toml --stages exec --id i",
            out.display()
        );
    } else {
        println!(
            "run replica i with: upright replica --config {}/cluster.toml --id i",
            out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Wraps each stage of replica `spec.id` in the simulator's Byzantine filter for `behaviour`
/// (one filter shared by the replica's stages, made on first use from its key ring).
fn byzantine_wrapper(
    spec: &ReplicaSpec,
    behaviour: upright_sim::faults::Behaviour,
) -> Result<upright_node::replica::StageWrapper, FileError> {
    use upright_sim::runtime::{ByzantineStage, Shared};
    let quorums = spec.cluster.config.validate().map_err(|e| FileError(e.to_string()))?;
    let timeout = spec.cluster.config.knobs.view_change_timeout_us;
    let me = upright_core::ids::ReplicaId(spec.id);
    let shared = std::sync::OnceLock::new();
    Ok(Arc::new(move |stage, keys| {
        let shared = shared.get_or_init(|| Shared::new(behaviour, me, keys.clone(), quorums, timeout));
        Box::new(ByzantineStage::new(stage, shared.clone()))
    }))
}

/// The replica process that runs member `id` of `stages` (`upright replica --stages`): `id`
/// itself without `--stages`; refused when cluster.toml places other stages on that process.
fn replica_process(cluster: &Cluster, id: u32, stages: &[String]) -> Result<u32, FileError> {
    if stages.is_empty() {
        return Ok(id);
    }
    let q = cluster.config.validate().map_err(|e| FileError(e.to_string()))?;
    let mut wanted: Vec<&str> = stages.iter().map(String::as_str).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let process = if wanted == ["exec"] && q.separate_stages {
        if id as usize >= q.n_exec {
            return Err(FileError(format!(
                "--stages exec --id {id}: the cluster has {} execution members (0 to {})",
                q.n_exec,
                q.n_exec - 1
            )));
        }
        id + q.exec_process_base()
    } else {
        id
    };
    let hosted: Vec<&str> = q
        .members_of(upright_core::ids::ReplicaId(process))
        .iter()
        .map(|p| match p.stage() {
            Some(upright_core::ids::StageKind::Auth) => "auth",
            Some(upright_core::ids::StageKind::Order) => "order",
            _ => "exec",
        })
        .collect();
    let mut sorted = hosted.clone();
    sorted.sort_unstable();
    if sorted != wanted {
        return Err(FileError(format!(
            "--stages {} --id {id}: cluster.toml places {} on that replica{}",
            stages.join(","),
            if hosted.is_empty() {
                "nothing".to_string()
            } else {
                hosted.join(",")
            },
            if q.separate_stages {
                ""
            } else {
                " (its stages share processes: set separate_stages = true with upright init --separate-stages to run them apart)"
            }
        )));
    }
    Ok(process)
}

fn replica(
    config: &Path,
    (id, stages): (u32, &[String]),
    key: Option<PathBuf>,
    service: &str,
    (objects, object_bytes): (u64, usize),
) -> Result<ExitCode, FileError> {
    init_logging("info");
    let cluster = Cluster::load(config)?;
    let id = replica_process(&cluster, id, stages)?;
    cluster.slot_keys(id)?;
    let key_path = key.unwrap_or_else(|| cluster.key_path(id));
    let keys = files::load_replica_keys(&cluster, id, &key_path)?;
    let storage = StorageOptions {
        fsync: cluster.file.fsync,
        fsync_delay: StorageOptions::fsync_delay_from_env().map_err(FileError)?,
        sync_spin: if cluster.file.idle_spin_us == 0 {
            std::time::Duration::ZERO
        } else {
            upright_node::spin::SYNC_SPIN_MAX
        },
        ..StorageOptions::default()
    };
    if !storage.fsync_delay.is_zero() {
        tracing::warn!(delay = ?storage.fsync_delay, "TESTING: every log sync (group commit) is followed by this delay (a slower disk)");
    }
    let mut spec = ReplicaSpec {
        cluster,
        id,
        keys,
        storage,
        service: replica_service(service, id, objects, object_bytes),
        stages: None,
        wrap: None,
    };
    if upright_node::replica::wrong_state_requested(id) {
        tracing::warn!("TESTING: this replica answers every state-transfer request wrongly (Byzantine stand-in)");
        spec.stages = Some(upright_node::replica::wrong_state_stages(
            spec.cluster.config.clone(),
            id,
            spec.service.clone(),
        ));
    }
    let byzantine = match std::env::var(upright_node::replica::BYZANTINE_ENV) {
        Ok(value) => upright_sim::runtime::parse_request(&value, id)
            .map_err(|e| FileError(format!("{}: {e}", upright_node::replica::BYZANTINE_ENV)))?,
        Err(_) => None,
    };
    if let Some(behaviour) = byzantine {
        tracing::warn!(
            behaviour = behaviour.name(),
            "TESTING: this replica is Byzantine (the simulator's behaviour, for upright bench --attack)"
        );
        spec.wrap = Some(byzantine_wrapper(&spec, behaviour)?);
    }
    if upright_node::replica::forge_pushes_requested(id) {
        tracing::warn!("TESTING: this replica forges every message its service pushes (Byzantine stand-in)");
        spec.service = upright_node::replica::forging_pushes(spec.service);
    }
    // One thread: the stages are one state machine per replica anyway, and on a small machine
    // hosting several processes cross-thread wake-ups cost more than they buy.
    // The replica runs as a spawned task, not as the `block_on` future itself: waking that future
    // from another task (a connection's reader, every message) goes through the runtime's
    // driver (an eventfd write and one more `epoll_wait`); waking a task is a queue push.
    let ended = single_thread_runtime().block_on(async move {
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        tokio::spawn(run_replica(spec, shutdown))
            .await
            .map_err(|e| FileError(format!("the replica task failed: {e}")))?
    })?;
    match ended {
        upright_node::replica::Ended::Recover | upright_node::replica::Ended::Reconfigure => {
            // Proactive recovery: nothing of this process's memory survives; the fresh process
            // finds the marker and recovers (upright_node::recovery). Reconfiguration: the fresh
            // process starts in the configuration its order log now records.
            let e = upright_node::recovery::exec_fresh();
            Err(FileError(format!("cannot restart the replica: {e}")))
        }
        upright_node::replica::Ended::Removed => {
            println!("replica {id}: removed from the cluster by a reconfiguration; stopping");
            Ok(ExitCode::SUCCESS)
        }
        upright_node::replica::Ended::Shutdown => Ok(ExitCode::SUCCESS),
    }
}

async fn status(config: &Path) -> Result<ExitCode, FileError> {
    let cluster = Cluster::load(config)?;
    println!(
        "{:<8} {:<11} {:>6} {:>10} {:>10} {:>11} {:>10}",
        "replica", "health", "view", "committed", "executed", "stable_cp", "exec_cp"
    );
    let q = cluster.config.validate().map_err(|e| FileError(e.to_string()))?;
    let token = cluster.metrics_token()?;
    let mut up = 0;
    for entry in &cluster.file.replicas {
        // A replica without an execution member (past the first n_exec, or an authentication
        // and order process of separate stages) or without an order member (an execution
        // process): nothing to show in those columns.
        let members = q.members_of(upright_core::ids::ReplicaId(entry.id));
        let hosts = |kind| members.iter().any(|p| p.stage() == Some(kind));
        let hosts_exec = hosts(upright_core::ids::StageKind::Exec);
        let hosts_order = hosts(upright_core::ids::StageKind::Order);
        let slot = entry
            .public_keys()
            .ok()
            .and_then(|k| cluster.slot_of(&k))
            .unwrap_or(entry.id);
        let addr = files::resolve(&entry.metrics_addr)?;
        match upright_node::metrics::http_get(addr, "/status", token.as_deref()).await {
            Ok(body) => {
                up += 1;
                let kv = upright_node::metrics::parse_key_values(&body);
                let g = |k: &str| kv.get(k).cloned().unwrap_or_else(|| "-".into());
                println!(
                    "{:<8} {:<11} {:>6} {:>10} {:>10} {:>11} {:>10}",
                    slot,
                    g("health"),
                    if hosts_order { g("view") } else { "-".into() },
                    if hosts_order { g("committed") } else { "-".into() },
                    if hosts_exec { g("executed") } else { "-".into() },
                    if hosts_order {
                        g("stable_checkpoint")
                    } else {
                        "-".into()
                    },
                    if hosts_exec { g("exec_checkpoint") } else { "-".into() }
                );
            }
            Err(e) => println!("{:<8} {:<11} ({}: {e})", slot, "down", entry.metrics_addr),
        }
    }
    println!("{up} of {} replicas answered", cluster.file.replicas.len());
    Ok(ExitCode::SUCCESS)
}

/// `upright recover`: asks replica `id` to recover and (with `wait`) follows its status until
/// the recovery it started has completed.
/// What `upright reconfigure` changes.
struct ChangeArgs {
    add: Vec<String>,
    remove: Vec<u32>,
    u: Option<usize>,
    r: Option<usize>,
}

/// The change `upright reconfigure` asks for, planned.
struct PlannedChange {
    /// The new configuration's replica entries (ids: positions).
    entries: Vec<files::ReplicaEntry>,
    /// Each entry's slot ([`Cluster::slots`]; the added ones take the next free ones).
    slots: Vec<u32>,
    /// The added replicas' slots and fresh secrets.
    secrets: Vec<(u32, upright_core::crypto::SecretKeys)>,
    u: usize,
    r: usize,
}

/// Plans `change` against `cluster`'s latest configuration: the removed replicas go (the
/// others keep their positions where they can, execution positions filled first:
/// `upright_core::reconfig::without`), then the added ones come last.
fn planned_change(cluster: &Cluster, change: &ChangeArgs) -> Result<PlannedChange, FileError> {
    let current = &cluster.config;
    let u = change.u.unwrap_or(current.u);
    let r = change.r.unwrap_or(current.r);
    let q_old = current.validate().map_err(|e| FileError(e.to_string()))?;
    let q = upright_core::quorum::Quorums::new(u, r).map_err(|e| FileError(e.to_string()))?;
    let mut removed = Vec::new();
    for slot in &change.remove {
        let keys = cluster.slot_keys(*slot)?;
        let position = current.replica_with(&keys).ok_or_else(|| {
            FileError(format!(
                "cannot remove replica {slot}: it is not a member of the cluster (epoch {})",
                current.epoch()
            ))
        })?;
        removed.push(position.0 as usize);
    }
    removed.sort_unstable();
    removed.dedup();
    let members: Vec<_> = current.replicas.iter().map(|m| m.keys).collect();
    let kept = upright_core::reconfig::without(&members, &removed, q_old.n_exec, q.n_exec);
    let mut entries = Vec::new();
    let mut slots = Vec::new();
    for (position, keys) in kept.iter().enumerate() {
        let old = current.replica_with(keys).expect("kept members are members");
        let mut entry = cluster.file.replica(old.0)?.clone();
        entry.id = position as u32;
        entries.push(entry);
        slots.push(cluster.slot_of(keys).expect("members have slots"));
    }
    let mut secrets = Vec::new();
    for addr in &change.add {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| p.parse::<u16>().ok().map(|p| (h, p)))
            .ok_or_else(|| FileError(format!("--add {addr}: expected HOST:PORT")))?;
        let keys = files::fresh_keys();
        let entry = files::added_replica(entries.len() as u32, host, port, &keys)
            .map_err(|e| FileError(format!("--add {addr}: {e}")))?;
        if let Some(clash) = entries.iter().find(|e| e.replica_addr == entry.replica_addr) {
            return Err(FileError(format!(
                "--add {addr}: replica {} already listens there",
                slots[clash.id as usize]
            )));
        }
        let slot = (cluster.slots().len() + secrets.len()) as u32;
        entries.push(entry);
        slots.push(slot);
        secrets.push((slot, keys));
    }
    if entries.len() != q.n_replicas() {
        return Err(FileError(format!(
            "u = {u}, r = {r} needs {} replicas; the change would leave {} (use --add / --remove / --u / --r)",
            q.n_replicas(),
            entries.len()
        )));
    }
    if entries == cluster.file.replicas && (u, r) == (current.u, current.r) {
        return Err(FileError("nothing to change (give --add, --remove, --u or --r)".into()));
    }
    Ok(PlannedChange {
        entries,
        slots,
        secrets,
        u,
        r,
    })
}

async fn reconfigure(
    config_path: &Path,
    change: &ChangeArgs,
    admin: Option<PathBuf>,
    timeout_secs: u64,
) -> Result<ExitCode, FileError> {
    use upright_core::reconfig::Reconfiguration;
    use upright_node::metrics::{http_get, parse_key_values};
    let cluster = Cluster::load(config_path)?;
    let dir = config_path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let admin_path = admin.unwrap_or_else(|| dir.join(files::ADMIN_FILE));
    let mut setup = ClientFile::load(&admin_path).map_err(|e| {
        FileError(format!(
            "{e} (the administrator's client file; clusters made before upright init wrote admin.toml have none)"
        ))
    })?;
    if cluster.config.admin != Some(setup.id) {
        return Err(FileError(format!(
            "{} is client {}, but the cluster's administrator is {:?}",
            admin_path.display(),
            setup.id.0,
            cluster.config.admin.map(|c| c.0)
        )));
    }
    let PlannedChange {
        entries,
        slots,
        secrets,
        u,
        r,
    } = planned_change(&cluster, change)?;
    let epoch = cluster.config.epoch() + 1;
    let signed = Reconfiguration {
        epoch,
        from_u: cluster.config.u,
        from_r: cluster.config.r,
        from_replicas: cluster.config.replicas.iter().map(|r| r.keys).collect(),
        u,
        r,
        replicas: entries
            .iter()
            .map(files::ReplicaEntry::public_keys)
            .collect::<Result<_, _>>()?,
        endpoints: entries.iter().map(files::endpoint_string).collect(),
    }
    .sign(&cluster.config.cluster_name, &setup.keys);
    // Refused here what the cluster would refuse (say a hand-over that could not complete).
    upright_core::reconfig::successor(&cluster.config, &signed, false)
        .map_err(|e| FileError(format!("the change cannot be made: {e}")))?;
    for (position, slot) in slots.iter().enumerate() {
        let before = cluster
            .slot_keys(*slot)
            .ok()
            .and_then(|k| cluster.config.replica_with(&k));
        if before.is_some_and(|b| b.0 as usize != position) {
            println!("replica {slot} runs as member {position} of the new configuration");
        }
    }
    // The new replicas' keys first: a change that names them is useless without them.
    for (id, keys) in &secrets {
        let path = cluster.key_path(*id);
        files::write_key_file(
            &path,
            &cluster.config.cluster_name,
            Process::Replica(ReplicaId(*id)),
            keys,
        )?;
        println!("wrote {} (secret: replica {id} only)", path.display());
    }
    setup.cluster = cluster.clone();
    let state = dir.join("admin.last-request-id");
    let client = upright_node::client::start_client(setup, Some(state))?;
    println!(
        "ordering the change to epoch {epoch}: {} replicas, u = {u}, r = {r}",
        entries.len()
    );
    let reply = client
        .invoke_timeout(
            bytes::Bytes::from(signed.to_operation()),
            false,
            std::time::Duration::from_secs(timeout_secs),
        )
        .await
        .map_err(|e| FileError(format!("the change was not answered: {e}")))?;
    let text = String::from_utf8_lossy(&reply).to_string();
    println!("cluster: {text}");
    if !text.starts_with("ordered") {
        return Err(FileError(format!("the cluster refused the change: {text}")));
    }
    files::record_change(config_path, &signed)?;
    println!("recorded the change in {}", config_path.display());
    for (id, _) in &secrets {
        println!(
            "start the new replica: upright replica --config {} --id {id}",
            config_path.display()
        );
    }
    // Wait until every replica of the new configuration that answers runs in it, the added ones
    // answer, and enough answer for its quorums (n - u): a replica that is down (the reason to
    // grow a cluster is often one that went down) catches up to the new configuration when it
    // comes back.
    let token = cluster.metrics_token()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(timeout_secs);
    let added: Vec<u32> = secrets.iter().map(|(id, _)| *id).collect();
    let quorum = entries.len().saturating_sub(u);
    let mut shown = String::new();
    // Since when each replica has not answered: one restarting into the new configuration is
    // silent for a moment, one that is down stays so.
    let mut silent_since: std::collections::BTreeMap<u32, std::time::Instant> = Default::default();
    loop {
        let (mut switched, mut silent) = (0, Vec::new());
        for (entry, slot) in entries.iter().zip(&slots) {
            let body = match files::resolve(&entry.metrics_addr) {
                Ok(addr) => http_get(addr, "/status", token.as_deref()).await.ok(),
                Err(_) => None,
            };
            match body {
                Some(body) => {
                    let kv = parse_key_values(&body);
                    if kv.get("config_epoch").and_then(|e| e.parse::<u64>().ok()) == Some(epoch) {
                        switched += 1;
                    }
                }
                None => silent.push(*slot),
            }
        }
        silent_since.retain(|id, _| silent.contains(id));
        for id in &silent {
            silent_since.entry(*id).or_insert_with(std::time::Instant::now);
        }
        let settled = silent_since
            .values()
            .all(|t| t.elapsed() >= std::time::Duration::from_secs(2));
        let answering = entries.len() - silent.len();
        let mut line = format!("{switched} of {} replicas run in epoch {epoch}", entries.len());
        if !silent.is_empty() {
            line += &format!(" (not answering: {silent:?})");
        }
        if line != shown {
            println!("{line}");
            shown = line;
        }
        if switched == answering && switched >= quorum && settled && !silent.iter().any(|id| added.contains(id)) {
            for id in &silent {
                println!("replica {id} does not answer: when it runs again it catches up to epoch {epoch} by itself");
            }
            println!(
                "reconfigured: epoch {epoch}, {} replicas, u = {u}, r = {r}",
                entries.len()
            );
            return Ok(ExitCode::SUCCESS);
        }
        if std::time::Instant::now() >= deadline {
            return Err(FileError(format!(
                "the change is ordered, but after {timeout_secs} s only {switched} of {} replicas run in epoch {epoch} \
                 (not answering: {silent:?}; are the new replicas started?)",
                entries.len()
            )));
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

async fn recover(config: &Path, id: u32, timeout_secs: u64, wait: bool) -> Result<ExitCode, FileError> {
    use upright_node::metrics::{http_get, http_request, parse_key_values};
    let cluster = Cluster::load(config)?;
    let entry = cluster.member_entry(id)?;
    // An execution-only process (separate stages) has no order member and no recovery point.
    let exec_only = cluster
        .config
        .validate()
        .is_ok_and(|q| q.separate_stages && id >= q.exec_process_base());
    let addr = files::resolve(&entry.metrics_addr)?;
    let token = cluster.metrics_token()?;
    let unreachable = |e: std::io::Error| {
        FileError(format!(
            "replica {id} does not answer on {} ({e}): is it running?",
            entry.metrics_addr
        ))
    };
    let before = http_get(addr, "/status", token.as_deref()).await.map_err(unreachable)?;
    let old_id = parse_key_values(&before)
        .get("proactive_recovery_id")
        .cloned()
        .unwrap_or_default();
    let (code, line, body) = http_request(addr, "POST", "/recover", token.as_deref())
        .await
        .map_err(unreachable)?;
    match code {
        202 => println!("replica {id}: recovery requested"),
        409 => return Err(FileError(format!("replica {id}: {}", body.trim()))),
        _ => {
            return Err(FileError(format!(
                "replica {id} refused the recovery: {line} {}",
                body.trim()
            )))
        }
    }
    if !wait {
        return Ok(ExitCode::SUCCESS);
    }
    let started = std::time::Instant::now();
    let deadline = started + std::time::Duration::from_secs(timeout_secs);
    let mut shown = String::new();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let progress = match http_get(addr, "/status", token.as_deref()).await {
            Err(_) => "restarting".to_string(),
            Ok(body) => {
                let kv = parse_key_values(&body);
                let g = |k: &str| kv.get(k).cloned().unwrap_or_default();
                let ours = g("proactive_recovery_id") != old_id;
                match g("proactive_recovery").as_str() {
                    "recovered" if ours => {
                        let millis: f64 = g("proactive_recovery_millis").parse().unwrap_or(0.0);
                        let point = if exec_only {
                            "execution only".to_string()
                        } else {
                            format!("recovery point {}", g("proactive_recovery_point"))
                        };
                        println!(
                            "replica {id}: recovered in {:.2} s ({point}; state fetched: {} bytes, {} pages)",
                            millis / 1e3,
                            g("proactive_recovery_state_bytes"),
                            g("proactive_recovery_state_pages")
                        );
                        return Ok(ExitCode::SUCCESS);
                    }
                    "recovering" if ours && exec_only => {
                        format!(
                            "recovering (state being checked against a certified checkpoint, executed {})",
                            g("executed")
                        )
                    }
                    "recovering" if ours => {
                        let point = g("proactive_recovery_point");
                        let point = if point == "0" { "estimating".to_string() } else { point };
                        format!(
                            "recovering (recovery point {point}, stable checkpoint {}, executed {})",
                            g("stable_checkpoint"),
                            g("executed")
                        )
                    }
                    _ => "restarting".to_string(),
                }
            }
        };
        if progress != shown {
            println!("replica {id}: {progress}");
            shown = progress;
        }
        if std::time::Instant::now() >= deadline {
            return Err(FileError(format!(
                "replica {id} has not completed its recovery after {timeout_secs} s (last: {shown}); it goes on, see `upright status`"
            )));
        }
    }
}

async fn kv(client: &Path, args: &[String]) -> Result<ExitCode, FileError> {
    let setup = ClientFile::load(client)?;
    let state = client.with_extension("last-request-id");
    let handle = upright_node::client::start_client(setup, Some(state))?;
    let b = |s: &String| Bytes::copy_from_slice(s.as_bytes());
    let op = match (args[0].as_str(), args.get(1), args.get(2)) {
        ("put", Some(k), Some(v)) => KvOperation::Put { key: b(k), value: b(v) },
        ("append", Some(k), Some(v)) => KvOperation::Append { key: b(k), value: b(v) },
        ("get", Some(k), None) => KvOperation::Get { key: b(k) },
        ("delete", Some(k), None) => KvOperation::Delete { key: b(k) },
        _ => {
            return Err(FileError(
                "usage: upright kv --client FILE (put K V | get K | append K V | delete K)".into(),
            ))
        }
    };
    let result = handle
        .invoke_timeout(op.encode(), false, std::time::Duration::from_secs(30))
        .await
        .map_err(|e| FileError(format!("operation failed: {e}")))?;
    match KvReply::decode(&result) {
        Some(KvReply::Value(Some(v))) => println!("{}", String::from_utf8_lossy(&v)),
        Some(KvReply::Value(None)) => println!("(absent)"),
        Some(KvReply::Done) => println!("ok"),
        _ => println!("invalid operation"),
    }
    Ok(ExitCode::SUCCESS)
}

/// `upright redis`: the Redis-protocol gateway against the cluster of `client`'s file.
async fn redis(
    client: &Path,
    listen: &str,
    pool: u32,
    users: Option<&Path>,
    tls: &TlsArgs,
) -> Result<ExitCode, FileError> {
    use upright_node::gateway::clients::{self, RequestIds};
    let members = clients::load(client, pool)?;
    let cluster = &members[0].1.cluster;
    let (name, replicas) = (cluster.config.cluster_name.clone(), cluster.file.replicas.len());
    // With --users, each user's own pool (and none for --client alone).
    let mut user_members = Vec::new();
    if let Some(file) = users {
        let mut taken = std::collections::BTreeSet::new();
        for (spec, commands) in upright_kv::gateway::users::read_users(file).map_err(FileError)? {
            let own = clients::load(&spec.client, spec.pool)?;
            for (path, setup) in &own {
                if setup.cluster.config.cluster_name != name {
                    return Err(FileError(format!(
                        "{}: user {:?}'s client {} belongs to cluster {:?}, not {name:?}",
                        file.display(),
                        spec.name,
                        path.display(),
                        setup.cluster.config.cluster_name
                    )));
                }
                if !taken.insert(setup.id.0) {
                    return Err(FileError(format!(
                        "{}: client {} ({}) serves two users; each user needs its own client identities",
                        file.display(),
                        setup.id.0,
                        path.display()
                    )));
                }
            }
            user_members.push((spec, commands, own));
        }
    }
    let (u, r) = (cluster.config.u, cluster.config.r);
    let first = members[0].1.id.0;
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        FileError(format!(
            "cannot listen on {listen} for Redis clients ({e}); choose another with --listen"
        ))
    })?;
    let addr = listener.local_addr().map_err(|e| FileError(e.to_string()))?;
    let gateway_users = if user_members.is_empty() {
        vec![upright_kv::gateway::users::GatewayUser::open(clients::start(
            members,
            RequestIds::Durable,
        )?)]
    } else {
        let mut out = Vec::new();
        for (spec, commands, own) in user_members {
            out.push(upright_kv::gateway::users::GatewayUser {
                name: spec.name,
                password: spec.password,
                clients: clients::start(own, RequestIds::Durable)?,
                commands,
            });
        }
        out
    };
    println!(
        "Redis protocol (RESP2/RESP3) on {addr}, served by cluster {name:?} ({replicas} replicas, u = {u}, r = {r})"
    );
    if users.is_some() {
        let names: Vec<&str> = gateway_users.iter().map(|u| u.name.as_str()).collect();
        println!("  users (AUTH): {}", names.join(", "));
    }
    if users.is_none() {
        println!(
            "  gateway: {pool} upright client(s) (clients {first}..{}); a result is accepted only from matching replies of enough replicas, so a lying replica cannot change it",
            first + pool - 1
        );
    }
    let listener = tls.listener(listener)?;
    println!("press Ctrl-C to stop");
    tokio::select! {
        result = upright_kv::gateway::serve_users(listener, gateway_users) => {
            result.map_err(|e| FileError(format!("the gateway stopped: {e}")))?;
        }
        _ = stop_requested() => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// The service a replica (or the NO-REP server) runs, by its `--service` name; replica `id`
/// corrupts its replies when the testing variable asks it to.
fn replica_service(service: &str, id: u32, objects: u64, object_bytes: usize) -> upright_core::stages::ServiceFactory {
    // Whether this replica is told to lie (testing only), said in its log with what it corrupts.
    let lying = |what: &str| {
        let corrupt = upright_kv::replica::corrupt_requested(id);
        if corrupt {
            tracing::warn!("TESTING: this replica corrupts {what} (Byzantine stand-in)");
        }
        corrupt
    };
    if service == "redis" {
        upright_kv::replica::service(lying("its stored values and replies"))
    } else if service == "zk" {
        upright_zk::replica::service(lying("its replies and pushed events"))
    } else if service == "fs" {
        upright_fs::replica::service(lying("its replies"))
    } else if service == "hdfs" {
        upright_hdfs::replica::service(lying("its replies"))
    } else if service == "objects" {
        tracing::info!(
            objects,
            object_bytes,
            "service: generated objects (a paged test service)"
        );
        Arc::new(move || Box::new(upright_core::objects::ObjectStore::new(objects, object_bytes)))
    } else {
        upright_core::stages::kv_service()
    }
}

/// A standalone gateway's start: its pool's clients and its bound listener, with the banner's
/// first two lines printed (`what` names the protocol; `clients` says who to stop first when
/// the port is taken).
async fn start_gateway(
    client: &Path,
    listen: &str,
    pool: u32,
    what: &str,
    clients_hint: &str,
) -> Result<(tokio::net::TcpListener, Vec<upright_node::client::ClientHandle>), FileError> {
    use upright_node::gateway::clients::{self, RequestIds};
    let members = clients::load(client, pool)?;
    let cluster = &members[0].1.cluster;
    let (name, replicas) = (cluster.config.cluster_name.clone(), cluster.file.replicas.len());
    let (u, r) = (cluster.config.u, cluster.config.r);
    let first = members[0].1.id.0;
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        FileError(format!(
            "cannot listen on {listen} for {clients_hint} ({e}); choose another with --listen"
        ))
    })?;
    let addr = listener.local_addr().map_err(|e| FileError(e.to_string()))?;
    let handles = clients::start(members, RequestIds::Durable)?;
    println!("{what} on {addr}, served by cluster {name:?} ({replicas} replicas, u = {u}, r = {r})");
    println!(
        "  gateway: {pool} upright client(s) (clients {first}..{}); a result is accepted only from matching replies of enough replicas, so a lying replica cannot change it",
        first + pool - 1
    );
    Ok((listener, handles))
}

/// Serves until the gateway fails or Ctrl-C / SIGTERM.
async fn run_gateway(serve: impl std::future::Future<Output = std::io::Result<()>>) -> Result<ExitCode, FileError> {
    println!("press Ctrl-C to stop");
    tokio::select! {
        result = serve => {
            result.map_err(|e| FileError(format!("the gateway stopped: {e}")))?;
        }
        _ = stop_requested() => {}
    }
    Ok(ExitCode::SUCCESS)
}

/// `upright zk`: the ZooKeeper-protocol gateway against the cluster of `client`'s file.
async fn zk(client: &Path, listen: &str, pool: u32, tls: &TlsArgs) -> Result<ExitCode, FileError> {
    let (listener, handles) = start_gateway(client, listen, pool, "ZooKeeper protocol", "ZooKeeper clients").await?;
    let listener = tls.listener(listener)?;
    run_gateway(upright_zk::gateway::serve(listener, handles)).await
}

/// `upright nfs`: the NFS gateway against the cluster of `client`'s file.
async fn nfs(client: &Path, listen: &str, pool: u32, tls: &TlsArgs) -> Result<ExitCode, FileError> {
    let (listener, handles) = start_gateway(
        client,
        listen,
        pool,
        "NFS version 3 and MOUNT version 3",
        "NFS clients (is an NFS server running?)",
    )
    .await?;
    let addr = listener.local_addr().map_err(|e| FileError(e.to_string()))?;
    println!(
        "  libnfs: nfs://{}//FILE?nfsport={}&mountport={}&version=3",
        addr.ip(),
        addr.port(),
        addr.port()
    );
    let listener = tls.listener(listener)?;
    run_gateway(upright_fs::gateway::serve(listener, handles)).await
}

/// `upright hdfs`: the WebHDFS gateway against the cluster of `client`'s file.
async fn hdfs(client: &Path, listen: &str, pool: u32) -> Result<ExitCode, FileError> {
    let (listener, handles) =
        start_gateway(client, listen, pool, "WebHDFS", "HDFS clients (is a NameNode running?)").await?;
    let addr = listener.local_addr().map_err(|e| FileError(e.to_string()))?;
    println!("  hdfscli: --url http://{addr}; Hadoop: webhdfs://{addr}/");
    let namenode = upright_hdfs::client::NameNodeClient::new(handles, client_name(client));
    run_gateway(upright_hdfs::gateway::serve(listener, namenode)).await
}

/// The client file's stem (`client-3`), naming a gateway in its lease holders.
fn client_name(client: &Path) -> String {
    client
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("gateway")
        .to_string()
}

/// `upright datanode`'s settings besides its client and address.
struct DatanodeSettings {
    advertise: Option<String>,
    dir: PathBuf,
    capacity: u64,
    scan_interval: std::time::Duration,
}

/// Testing only: the DataNode with this id flips a bit of the first replica it stores on disk
/// and serves reads unchecked (the faulty DataNode of the WebHDFS tests).
pub(crate) const FLIP_DATANODE_ENV: &str = "UPRIGHT_TEST_FLIP_DATANODE";

/// `upright datanode`: a DataNode of the cluster of `client`'s file.
async fn datanode(client: &Path, listen: &str, settings: DatanodeSettings) -> Result<ExitCode, FileError> {
    use upright_node::gateway::clients::{self, RequestIds};
    let members = clients::load(client, 1)?;
    let id = members[0].1.id.0;
    let listener = tokio::net::TcpListener::bind(listen).await.map_err(|e| {
        FileError(format!(
            "cannot listen on {listen} for block reads and writes ({e}); choose another with --listen"
        ))
    })?;
    let bound = listener.local_addr().map_err(|e| FileError(e.to_string()))?;
    let advertise = settings.advertise.unwrap_or_else(|| bound.to_string());
    let handles = clients::start(members, RequestIds::Durable)?;
    let flip = std::env::var(FLIP_DATANODE_ENV).is_ok_and(|v| v.trim() == id.to_string());
    if flip {
        tracing::warn!("TESTING: this DataNode flips a bit of the first replica it stores and serves reads unchecked");
    }
    println!(
        "DataNode {id} on {bound} (advertised as {advertise}), replicas in {}",
        settings.dir.display()
    );
    let config = upright_hdfs::dataserver::DataNodeConfig {
        id,
        advertise,
        dir: settings.dir,
        capacity: settings.capacity,
        scan_interval: settings.scan_interval,
        flip_first_block: flip,
    };
    let namenode = upright_hdfs::client::NameNodeClient::new(handles, format!("datanode-{id}"));
    run_gateway(upright_hdfs::dataserver::run(listener, namenode, config)).await
}

/// Waits for Ctrl-C (SIGINT) or SIGTERM (`kill`, a service manager stopping the demo or a bench):
/// either way the caller drops its cluster, which stops the replica processes (without the SIGTERM
/// arm they outlived a `kill`ed demo).
pub(crate) async fn stop_requested() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
