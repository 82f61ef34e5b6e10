//! `upright demo`: a local cluster of 4 replicas (u = r = 1) on this host, each a child process,
//! talking over Unix-domain sockets (loopback TCP with `--tcp`), with generated config and keys
//! in a temporary directory. `--smoke` runs a client workload,
//! SIGKILLs one replica and restarts it mid-run, then reads every acknowledged write back.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use upright_core::config::OrderProtocol;
use upright_core::kv::{KvOperation, KvReply};
use upright_node::client::{start_client, ClientHandle};
use upright_node::files::{self, ClientFile, FileError, InitPlan};
use upright_node::transport::Endpoint;

/// Replicas of the demo cluster.
/// Replicas of the demo under PBFT, Quorum, Chain and Aliph (u = r = 1); LCR's runs one fewer (u = 1, r = 0).
const REPLICAS: usize = 4;

/// `(u, r, replicas)` of the demo ordering with `protocol`.
fn shape(protocol: OrderProtocol) -> (usize, usize, usize) {
    match protocol {
        OrderProtocol::Pbft | OrderProtocol::Quorum | OrderProtocol::Chain | OrderProtocol::Aliph => (1, 1, REPLICAS),
        OrderProtocol::Lcr => (1, 0, REPLICAS - 1),
    }
}
/// The replica the smoke run kills and restarts.
const VICTIM: usize = 1;
const OP_TIMEOUT: Duration = Duration::from_secs(20);

/// The replica child processes; all are SIGKILLed when dropped.
pub struct Cluster {
    exe: PathBuf,
    dir: PathBuf,
    service: String,
    children: Vec<Option<Child>>,
    /// Other processes of the demo (HDFS's DataNodes), restarted like the replicas.
    helpers: Vec<Helper>,
}

/// A process of the demo besides the replicas: its name (and log file's), its arguments.
struct Helper {
    name: String,
    args: Vec<String>,
    child: Option<Child>,
}

impl Cluster {
    fn spawn(&mut self, id: usize) -> Result<(), FileError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("replica-{id}.log")))
            .map_err(|e| FileError(format!("cannot create log file: {e}")))?;
        let child = Command::new(&self.exe)
            .arg("replica")
            .arg("--config")
            .arg(self.dir.join("cluster.toml"))
            .arg("--id")
            .arg(id.to_string())
            .arg("--service")
            .arg(&self.service)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| FileError(e.to_string()))?)
            .stderr(log)
            .spawn()
            .map_err(|e| FileError(format!("cannot start replica {id}: {e}")))?;
        self.children[id] = Some(child);
        Ok(())
    }

    /// Starts helper `i` (again).
    fn spawn_helper(&mut self, i: usize) -> Result<(), FileError> {
        let helper = &mut self.helpers[i];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", helper.name)))
            .map_err(|e| FileError(format!("cannot create log file: {e}")))?;
        let child = Command::new(&self.exe)
            .args(&helper.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| FileError(e.to_string()))?)
            .stderr(log)
            .spawn()
            .map_err(|e| FileError(format!("cannot start {}: {e}", helper.name)))?;
        helper.child = Some(child);
        Ok(())
    }

    /// The first helper process that has exited, with how it ended and its log's last line.
    fn helper_exited(&mut self) -> Option<(usize, String)> {
        let dir = &self.dir;
        self.helpers.iter_mut().enumerate().find_map(|(i, helper)| {
            let child = helper.child.as_mut()?;
            exit_of(child, &dir.join(format!("{}.log", helper.name))).map(|how| (i, how))
        })
    }

    /// The first replica process that has exited, with how it ended and the last line of its log
    /// (a replica that fails at start-up says why there).
    fn exited(&mut self) -> Option<(usize, String)> {
        let dir = &self.dir;
        self.children.iter_mut().enumerate().find_map(|(id, child)| {
            exit_of(child.as_mut()?, &dir.join(format!("replica-{id}.log"))).map(|how| (id, how))
        })
    }

    /// SIGKILL one replica.
    fn kill(&mut self, id: usize) {
        if let Some(mut child) = self.children[id].take() {
            let _ = child.kill(); // SIGKILL
            let _ = child.wait();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for id in 0..self.children.len() {
            self.kill(id);
        }
        for helper in &mut self.helpers {
            if let Some(mut child) = helper.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// How `child` ended, with the last line of its log `log`; `None` while it runs.
fn exit_of(child: &mut Child, log: &Path) -> Option<String> {
    let status = child.try_wait().ok()??;
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let last = log.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    Some(format!("{status}; its log ends: {last}"))
}

/// A free loopback port below Linux's ephemeral range (32768+), so the replicas' own outgoing
/// connections can never take it between the choice and the bind; distinct within this process.
fn free_port() -> Result<u16, FileError> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(7919) % 12_000;
    for _ in 0..12_000 {
        let port = 20_000 + ((start + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Err(FileError("no free loopback port between 20000 and 32000".into()))
}

/// How the demo's processes reach each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Unix-domain sockets in the demo's directory (the default: every process is on this host).
    Unix,
    /// Loopback TCP ports, as a cluster spread over machines would use.
    Tcp,
}

/// Writes the demo's config into `dir` and starts the replicas with the replicated service
/// `service` (`kv` or `redis`). With [`Transport::Unix`], the replica and client listeners are
/// Unix-domain sockets in `dir`, unless its path is too long for one (then TCP).
pub fn start_local_cluster_with(
    dir: &Path,
    clients: u32,
    service: &str,
    idle_spin_us: u64,
    (transport, protocol, selective_execution): (Transport, OrderProtocol, bool),
) -> Result<Cluster, FileError> {
    let (u, r, replicas) = shape(protocol);
    let mut ports = Vec::new();
    for _ in 0..replicas {
        ports.push((free_port()?, free_port()?, free_port()?));
    }
    let plan = InitPlan {
        cluster_name: "upright-demo".into(),
        u,
        r,
        hosts: vec!["127.0.0.1".into()],
        clients,
        base_port: 0,
        ports: Some(ports),
        // The demo runs in robust mode: signed client requests (Aardvark's blacklisting).
        knobs: Some(upright_core::config::Knobs {
            client_signatures: true,
            ..Default::default()
        }),
        fsync: Default::default(),
        idle_spin_us,
        unix_dir: (transport == Transport::Unix && unix_paths_fit(dir)).then(|| dir.to_path_buf()),
        metrics_host: Default::default(),
        metrics_token: false,
        recovery_interval_secs: 0,
        protocol,
        selective_execution,
        separate_stages: None,
    };
    files::init_cluster(&plan, dir)?;
    let exe = std::env::current_exe().map_err(|e| FileError(format!("cannot find own executable: {e}")))?;
    let mut cluster = Cluster {
        exe,
        dir: dir.to_path_buf(),
        service: service.to_string(),
        children: (0..replicas).map(|_| None).collect(),
        helpers: Vec::new(),
    };
    for id in 0..replicas {
        cluster.spawn(id)?;
    }
    Ok(cluster)
}

fn client(dir: &Path, c: u32) -> Result<ClientHandle, FileError> {
    let setup = ClientFile::load(&dir.join(format!("client-{c}.toml")))?;
    start_client(setup, Some(dir.join(format!("client-{c}.last-request-id"))))
}

/// The clients of the gateway's pool (identities `0..n`), sharing one connection per replica.
/// They keep no request-id file: the demo's cluster (its config, keys and client identities, all
/// in a temporary directory) lives exactly as long as this process, so a pool client never
/// restarts against the same cluster, and the file would cost a create + fsync + rename +
/// directory fsync on the async runtime's threads for every operation (that blocking I/O made the
/// gateway about 5x slower than the bench client, which keeps none).
fn gateway_clients(dir: &Path, n: u32) -> Result<Vec<ClientHandle>, FileError> {
    use upright_node::gateway::clients::{load, start, RequestIds};
    start(load(&dir.join("client-0.toml"), n)?, RequestIds::Volatile)
}

/// The default pool size of the Redis gateway.
pub const GATEWAY_POOL: u32 = redis_gateway::POOL;

/// The default pool size of the demo's ZooKeeper gateway: a session's requests go one at a time
/// through the member its id picks, so the pool bounds the writes in flight. With `upright
/// zk-bench --workload set` (1 KiB setData): 1 member served 1,487/s at 16 clients and 1,494/s
/// at 64; 16 members 6,610/s and 6,316/s; 64 members 6,473/s and 11,093/s (docs/PERFORMANCE.md).
pub const ZK_GATEWAY_POOL: u32 = 64;
/// Upright clients of the NFS gateway's pool in the demo (each operation packs the calls of
/// every connection waiting, so a few suffice for many outstanding RPCs).
pub const NFS_GATEWAY_POOL: u32 = 4;

/// Upright clients of the demo's WebHDFS gateway (NameNode commands in flight at once: each
/// write holds one while it adds a block or completes, each read while it locates blocks).
pub const HDFS_GATEWAY_POOL: u32 = 8;

/// Settings of the demo's Redis gateway.
pub struct Gateway {
    /// Loopback port.
    pub port: u16,
    /// Upright clients in its pool.
    pub pool: u32,
}

/// Whether the socket paths the demo would put in `dir` make valid addresses (the longest one
/// fits a Unix-domain socket address).
fn unix_paths_fit(dir: &Path) -> bool {
    let longest = Endpoint::Unix(dir.join(format!("replica-{}.sock", REPLICAS - 1)));
    files::endpoint(&longest.to_string()).is_ok()
}

/// Runs the demo.
pub async fn run(
    smoke: bool,
    seconds: u64,
    clients: u32,
    service: &str,
    gateway: Gateway,
    idle_spin_us: u64,
    (transport, protocol, selective): (Transport, OrderProtocol, bool),
) -> Result<ExitCode, FileError> {
    let Gateway { port, pool: pool_size } = gateway;
    let redis = service == "redis";
    let zk = service == "zk";
    let fs = service == "fs";
    let hdfs = service == "hdfs";
    // Bind the gateway's port first so a busy port fails before anything starts.
    let listener = if hdfs {
        Some(hdfs_gateway::bind(port).await?)
    } else if redis {
        Some(redis_gateway::bind(port).await?)
    } else if zk {
        Some(zk_gateway::bind(port).await?)
    } else if fs {
        Some(nfs_gateway::bind(port).await?)
    } else {
        None
    };
    let clients = if hdfs {
        // The gateway's pool, then one identity per DataNode.
        clients.max(pool_size + hdfs_gateway::DATANODES)
    } else if redis || zk || fs {
        clients.max(pool_size)
    } else {
        clients
    };
    let temp = tempfile::Builder::new()
        .prefix("upright-demo-")
        .tempdir()
        .map_err(|e| FileError(format!("cannot create a temporary directory: {e}")))?;
    let dir = temp.path().to_path_buf();
    let mut cluster = start_local_cluster_with(
        &dir,
        clients.max(1) + 1,
        service,
        idle_spin_us,
        (transport, protocol, selective),
    )?;
    let cfg = files::Cluster::load(&dir.join("cluster.toml"))?.file;
    let what = if redis {
        "Redis-compatible KV service"
    } else if zk {
        "ZooKeeper-compatible coordination service"
    } else if fs {
        "NFSv3 file system (BFS)"
    } else if hdfs {
        "HDFS NameNode (UpRight-HDFS)"
    } else {
        "in-memory KV service"
    };
    let over = if cfg
        .replicas
        .iter()
        .all(|r| r.replica_addr.starts_with(upright_node::transport::UNIX_PREFIX))
    {
        "Unix-domain sockets"
    } else {
        "loopback TCP"
    };
    let (u, r, replicas) = shape(protocol);
    println!(
        "upright demo: {replicas} replicas (u = {u}, r = {r}, {}{}) on this host over {over}, {what}",
        protocol.name(),
        if selective { ", selective execution" } else { "" }
    );
    for r in &cfg.replicas {
        println!(
            "  replica {}: replicas {}  clients {}  metrics http://{}/metrics  log {}/replica-{}.log",
            r.id,
            r.replica_addr,
            r.client_addr,
            r.metrics_addr,
            dir.display(),
            r.id
        );
    }
    println!("  config and keys: {} (removed on exit)", dir.display());
    // Wait until the cluster serves a request.
    let probe = client(&dir, clients.max(1))?;
    let started = Instant::now();
    let first = if redis {
        redis_gateway::probe()
    } else if zk {
        upright_zk::service::Command::Touch { sessions: Vec::new() }.encode()
    } else if fs {
        nfs_gateway::probe()
    } else if hdfs {
        hdfs_gateway::probe()
    } else {
        put(b"demo-ready", b"1")
    };
    // A replica that stops at start-up (bad configuration, port taken) ends the wait at once; so
    // does Ctrl-C or SIGTERM (the replicas are stopped and the directory removed, as later).
    let ready = tokio::select! {
        _ = crate::stop_requested() => {
            drop(cluster);
            return Ok(ExitCode::SUCCESS);
        }
        ready = probe.invoke_timeout(first, false, Duration::from_secs(60)) => ready,
        (id, how) = async {
            loop {
                if let Some(exited) = cluster.exited() {
                    break exited;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        } => {
            return Err(FileError(format!("replica {id} exited before the cluster served a request ({how})")));
        }
    };
    if let Err(e) = ready {
        return Err(FileError(format!(
            "the cluster did not serve a first request ({e}); see the replica logs in {}",
            dir.display()
        )));
    }
    println!("  cluster is serving (first write took {:.2?})", started.elapsed());
    if let Some(listener) = listener {
        let pool = gateway_clients(&dir, pool_size)?;
        let exe = cluster.exe.display().to_string();
        if hdfs {
            hdfs_gateway::start_datanodes(&mut cluster, pool_size, &probe).await?;
            let namenode = upright_hdfs::client::NameNodeClient::new(pool, "demo");
            tokio::spawn(upright_hdfs::gateway::serve(listener, namenode));
            hdfs_gateway::announce(port, pool_size, &exe, &dir);
        } else if zk {
            tokio::spawn(upright_zk::gateway::serve(listener, pool));
            zk_gateway::announce(port, pool_size, &exe, &dir);
        } else if fs {
            tokio::spawn(upright_fs::gateway::serve(listener, pool));
            nfs_gateway::announce(port, pool_size, &exe, &dir);
        } else {
            tokio::spawn(upright_kv::gateway::serve(listener, pool));
            redis_gateway::announce(port, pool_size, &exe, &dir);
        }
        tokio::select! {
            _ = crate::stop_requested() => {}
            e = supervise(&mut cluster) => return Err(e),
        }
        drop(cluster);
        return Ok(ExitCode::SUCCESS);
    }
    if !smoke {
        let exe = cluster.exe.display().to_string();
        println!("try, in another terminal:");
        println!("  {exe} kv --client {}/client-0.toml put hello world", dir.display());
        println!("  {exe} kv --client {}/client-0.toml get hello", dir.display());
        println!("  {exe} status --config {}/cluster.toml", dir.display());
        println!("press Ctrl-C to stop");
        crate::stop_requested().await;
        drop(cluster);
        return Ok(ExitCode::SUCCESS);
    }
    let report = smoke_run(&dir, &mut cluster, seconds, clients.max(1)).await?;
    drop(cluster);
    Ok(report)
}

/// How long the demo waits before restarting a replica process that ended, doubled (up to
/// [`RESTART_DELAY_MAX`]) while restarted replicas keep ending within [`RESTART_STABLE`].
const RESTART_DELAY: Duration = Duration::from_secs(1);
const RESTART_DELAY_MAX: Duration = Duration::from_secs(30);
const RESTART_STABLE: Duration = Duration::from_secs(30);

/// Restarts every replica process that ends (killed, crashed) while the demo serves, as a
/// service manager would: it recovers from its disk and catches up from the others. Returns
/// only if a replica cannot be started again.
async fn supervise(cluster: &mut Cluster) -> FileError {
    let mut delay = RESTART_DELAY;
    let mut last_restart: Option<Instant> = None;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Some((i, how)) = cluster.helper_exited() {
            cluster.helpers[i].child = None;
            let name = cluster.helpers[i].name.clone();
            println!("  {name} exited ({how}); restarting it in {RESTART_DELAY:?}");
            tokio::time::sleep(RESTART_DELAY).await;
            if let Err(e) = cluster.spawn_helper(i) {
                return e;
            }
            println!("  {name} restarted");
            continue;
        }
        let Some((id, how)) = cluster.exited() else { continue };
        cluster.children[id] = None;
        if last_restart.is_some_and(|at| at.elapsed() < RESTART_STABLE) {
            delay = (delay * 2).min(RESTART_DELAY_MAX);
        } else {
            delay = RESTART_DELAY;
        }
        println!("  replica {id} exited ({how}); restarting it in {delay:?}");
        tokio::time::sleep(delay).await;
        if let Err(e) = cluster.spawn(id) {
            return e;
        }
        last_restart = Some(Instant::now());
        println!("  replica {id} restarted");
    }
}

fn put(key: &[u8], value: &[u8]) -> Bytes {
    KvOperation::Put {
        key: Bytes::copy_from_slice(key),
        value: Bytes::copy_from_slice(value),
    }
    .encode()
}

#[derive(Default)]
struct Tally {
    acked: Vec<(Bytes, Bytes)>,
    failed: u64,
}

async fn workload(
    handle: ClientHandle,
    c: u32,
    until: Instant,
    tally: Arc<Mutex<Tally>>,
    hist: Arc<Mutex<Histogram<u64>>>,
) {
    let mut k = 0u64;
    while Instant::now() < until {
        let key = Bytes::from(format!("c{c}-k{k}"));
        let value = Bytes::from(format!("v{k}-{}", k * 7 + c as u64));
        let start = Instant::now();
        match handle.invoke_timeout(put(&key, &value), false, OP_TIMEOUT).await {
            Ok(reply) if KvReply::decode(&reply) == Some(KvReply::Done) => {
                let micros = start.elapsed().as_micros() as u64;
                let _ = hist.lock().expect("hist").record(micros.max(1));
                tally.lock().expect("tally").acked.push((key, value));
            }
            _ => tally.lock().expect("tally").failed += 1,
        }
        k += 1;
    }
}

async fn smoke_run(dir: &Path, cluster: &mut Cluster, seconds: u64, clients: u32) -> Result<ExitCode, FileError> {
    let seconds = seconds.max(3);
    println!("smoke: {clients} clients writing for {seconds} s; replica {VICTIM} is SIGKILLed and restarted mid-run");
    let tally = Arc::new(Mutex::new(Tally::default()));
    let hist = Arc::new(Mutex::new(Histogram::<u64>::new(3).expect("histogram")));
    let start = Instant::now();
    let until = start + Duration::from_secs(seconds);
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let handle = client(dir, c)?;
        handles.push(handle.clone());
        tasks.push(tokio::spawn(workload(handle, c, until, tally.clone(), hist.clone())));
    }
    tokio::time::sleep(Duration::from_secs(seconds) / 3).await;
    cluster.kill(VICTIM);
    println!(
        "  t={:.1}s: replica {VICTIM} killed (SIGKILL)",
        start.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(seconds) / 3).await;
    cluster.spawn(VICTIM)?;
    println!("  t={:.1}s: replica {VICTIM} restarted", start.elapsed().as_secs_f64());
    for task in tasks {
        let _ = task.await;
    }
    let elapsed = start.elapsed();
    let (acked, failed) = {
        let t = tally.lock().expect("tally");
        (t.acked.clone(), t.failed)
    };
    // Read back every acknowledged write.
    let mut lost = 0u64;
    let mut unreadable = 0u64;
    for (i, (key, value)) in acked.iter().enumerate() {
        let handle = &handles[i % handles.len()];
        let get = KvOperation::Get { key: key.clone() }.encode();
        match handle.invoke_timeout(get, false, OP_TIMEOUT).await {
            Ok(reply) => {
                if KvReply::decode(&reply) != Some(KvReply::Value(Some(value.clone()))) {
                    lost += 1;
                }
            }
            Err(_) => unreadable += 1,
        }
    }
    let hist = hist.lock().expect("hist");
    println!(
        "operations: {} acknowledged writes, {failed} failed or timed out",
        acked.len()
    );
    println!(
        "throughput: {:.0} ops/s over {:.1} s",
        acked.len() as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    println!(
        "latency: p50 {:.2} ms, p99 {:.2} ms",
        hist.value_at_quantile(0.5) as f64 / 1000.0,
        hist.value_at_quantile(0.99) as f64 / 1000.0
    );
    println!("read back: {} writes checked, {unreadable} reads failed", acked.len());
    println!("lost acknowledged writes: {lost}");
    // The restarted replica must still be running (it rebinds its listeners: over Unix-domain
    // sockets, the files its killed predecessor left).
    let exited = cluster.exited();
    if let Some((id, how)) = &exited {
        println!("replica {id} exited: {how}");
    }
    if lost == 0 && unreadable == 0 && !acked.is_empty() && exited.is_none() {
        Ok(ExitCode::SUCCESS)
    } else {
        println!("smoke FAILED (replica logs in {})", dir.display());
        Ok(ExitCode::from(1))
    }
}

/// The demo's Redis-protocol gateway.
mod zk_gateway {
    use std::path::Path;

    use upright_node::files::FileError;

    /// Binds the gateway's loopback port.
    pub async fn bind(port: u16) -> Result<tokio::net::TcpListener, FileError> {
        tokio::net::TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| {
            FileError(format!(
                "cannot listen on 127.0.0.1:{port} for ZooKeeper clients ({e}); is a ZooKeeper server running? choose another with --port"
            ))
        })
    }

    /// Tells the user how to connect.
    pub fn announce(port: u16, pool: u32, exe: &str, dir: &Path) {
        println!("ZooKeeper protocol on 127.0.0.1:{port}, served by the BFT cluster");
        println!("  gateway: {pool} upright client(s); writes and watches are ordered by agreement; reads take r + 1 matching replies (ZooKeeper's read semantics)");
        println!("try, in another terminal:");
        println!("  zkCli.sh -server 127.0.0.1:{port} create /hello world");
        println!("  python3 -c \"from kazoo.client import KazooClient as K; z=K('127.0.0.1:{port}'); z.start(); print(z.get('/hello'))\"");
        println!("  echo ruok | nc 127.0.0.1 {port}");
        println!("  {exe} status --config {}/cluster.toml", dir.display());
        println!("press Ctrl-C to stop");
    }
}

mod nfs_gateway {
    use std::path::Path;

    use bytes::Bytes;
    use upright_fs::nfs3::proc3;
    use upright_fs::rpc::Credential;
    use upright_node::files::FileError;

    /// Binds the gateway's loopback port.
    pub async fn bind(port: u16) -> Result<tokio::net::TcpListener, FileError> {
        tokio::net::TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| {
            FileError(format!(
                "cannot listen on 127.0.0.1:{port} for NFS clients ({e}); is an NFS server running? choose another with --port"
            ))
        })
    }

    /// The readiness probe: GETATTR of the root, ordered.
    pub fn probe() -> Bytes {
        let fs = upright_fs::fs::FileSystem::new();
        let root = upright_fs::procedures::root_handle(&fs).expect("a new file system has its root");
        let mut args = upright_fs::xdr::Writer::new();
        args.opaque(&root);
        let call = upright_fs::procedures::operation(proc3::GETATTR, &Credential::anonymous(), &args.finish());
        upright_fs::service::encode_calls(&[call])
    }

    /// Tells the user how to connect.
    pub fn announce(port: u16, pool: u32, exe: &str, dir: &Path) {
        println!("NFS version 3 (and MOUNT, same port) on 127.0.0.1:{port}, exporting / from the BFT cluster");
        println!("  gateway: {pool} upright client(s); changes are ordered by agreement; reads go to every execution replica (read-only path) and fall back to agreement when the answers differ");
        println!("try, in another terminal (Debian: apt install libnfs-utils):");
        println!("  echo hello > /tmp/hello.txt");
        println!("  nfs-cp /tmp/hello.txt 'nfs://127.0.0.1/hello.txt?nfsport={port}&mountport={port}&version=3'");
        println!("  nfs-ls 'nfs://127.0.0.1/?nfsport={port}&mountport={port}&version=3'");
        println!("  nfs-cat 'nfs://127.0.0.1/hello.txt?nfsport={port}&mountport={port}&version=3'");
        println!("  {exe} status --config {}/cluster.toml", dir.display());
        println!("press Ctrl-C to stop");
    }
}

mod redis_gateway {
    use std::path::Path;

    use bytes::Bytes;
    use upright_node::files::FileError;

    /// Upright clients of the gateway's pool (client identities 0..POOL), the default of
    /// `--gateway-pool`. The cluster's cost is per operation, so fewer members put more commands
    /// in each operation: with `redis-benchmark -t set,get -n 50000 -c 16` (same minute), 1
    /// member served 16,534 SET/s and 49,213 GET/s, 2 members 11,238 and 48,685. Earlier
    /// figures, with a Byzantine replica, and before the gateway waited for the connections it
    /// answered, are in docs/PERFORMANCE.md.
    pub const POOL: u32 = 1;

    /// Binds the gateway's loopback port.
    pub async fn bind(port: u16) -> Result<tokio::net::TcpListener, FileError> {
        tokio::net::TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| {
            FileError(format!(
                "cannot listen on 127.0.0.1:{port} for Redis clients ({e}); is redis-server running? choose another with --port"
            ))
        })
    }

    /// The readiness probe: one SET.
    pub fn probe() -> Bytes {
        let argv: Vec<Bytes> = ["SET", "demo-ready", "1"]
            .iter()
            .map(|w| Bytes::from_static(w.as_bytes()))
            .collect();
        upright_kv::encode_operation(&[argv])
    }

    /// Tells the user how to connect.
    pub fn announce(port: u16, pool: u32, exe: &str, dir: &Path) {
        println!("Redis protocol (RESP2/RESP3) on 127.0.0.1:{port}, served by the BFT cluster");
        println!("  gateway: {pool} upright client(s); writes are ordered by agreement; reads go to every execution replica (read-only path) and fall back to agreement when the answers differ");
        println!("try, in another terminal:");
        println!("  redis-cli -p {port} set hello world");
        println!("  redis-cli -p {port} get hello");
        println!("  redis-benchmark -p {port} -t set,get -n 10000 -q");
        println!("  {exe} status --config {}/cluster.toml", dir.display());
        println!("press Ctrl-C to stop");
    }
}

mod hdfs_gateway {
    use std::path::Path;
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use upright_hdfs::namenode::{Answer, Command};
    use upright_node::client::ClientHandle;
    use upright_node::files::FileError;

    use super::{free_port, Cluster, Helper};

    /// DataNodes of the demo.
    pub const DATANODES: u32 = 3;
    /// How long the demo waits for its DataNodes to register.
    const REGISTER_WAIT: Duration = Duration::from_secs(60);

    /// Binds the gateway's loopback port.
    pub async fn bind(port: u16) -> Result<tokio::net::TcpListener, FileError> {
        tokio::net::TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| {
            FileError(format!(
                "cannot listen on 127.0.0.1:{port} for WebHDFS clients ({e}); is an HDFS NameNode running? choose another with --port"
            ))
        })
    }

    /// The readiness probe: the root's status, ordered.
    pub fn probe() -> Bytes {
        upright_hdfs::service::encode(&Command::GetFileStatus { path: "/".into() })
    }

    /// Starts the DataNodes (client identities `first..first + DATANODES`, each with a directory
    /// of its own in the demo's) and waits until the NameNode counts them all.
    pub async fn start_datanodes(cluster: &mut Cluster, first: u32, probe: &ClientHandle) -> Result<(), FileError> {
        for k in 0..DATANODES {
            let id = first + k;
            let port = free_port()?;
            let dir = cluster.dir.clone();
            let args = vec![
                "datanode".to_string(),
                "--client".into(),
                dir.join(format!("client-{id}.toml")).display().to_string(),
                "--listen".into(),
                format!("127.0.0.1:{port}"),
                "--dir".into(),
                dir.join(format!("datanode-{id}")).display().to_string(),
            ];
            cluster.helpers.push(Helper {
                name: format!("datanode-{id}"),
                args,
                child: None,
            });
            let i = cluster.helpers.len() - 1;
            cluster.spawn_helper(i)?;
            println!(
                "  DataNode {id}: blocks on 127.0.0.1:{port}, replicas in {}/datanode-{id}, log {}/datanode-{id}.log",
                dir.display(),
                dir.display()
            );
        }
        let started = Instant::now();
        let list = upright_hdfs::service::encode(&Command::ListDataNodes);
        loop {
            if let Some((i, how)) = cluster.helper_exited() {
                return Err(FileError(format!(
                    "{} exited before registering ({how})",
                    cluster.helpers[i].name
                )));
            }
            if let Ok(reply) = probe.invoke_timeout(list.clone(), true, Duration::from_secs(10)).await {
                if let Some(Answer::DataNodes(nodes)) = upright_hdfs::service::decode_answer(&reply) {
                    if nodes.iter().filter(|n| !n.dead).count() >= DATANODES as usize {
                        println!("  {DATANODES} DataNodes registered ({:.2?})", started.elapsed());
                        return Ok(());
                    }
                }
            }
            if started.elapsed() > REGISTER_WAIT {
                return Err(FileError(format!(
                    "the DataNodes did not register within {REGISTER_WAIT:?}; see datanode-*.log in {}",
                    cluster.dir.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Tells the user how to connect.
    pub fn announce(port: u16, pool: u32, exe: &str, dir: &Path) {
        println!("WebHDFS on http://127.0.0.1:{port}/webhdfs/v1/, served by the BFT NameNode cluster and {DATANODES} DataNodes");
        println!("  gateway: {pool} upright client(s); namespace changes are ordered by agreement; every block read is checked against the hash the NameNode committed");
        println!("try, in another terminal (pip install hdfs):");
        println!("  echo hello > /tmp/hello.txt");
        println!("  hdfscli upload --alias=upright /tmp/hello.txt /hello.txt   # ~/.hdfscli.cfg: [upright.alias] url = http://127.0.0.1:{port}");
        println!("  curl -s 'http://127.0.0.1:{port}/webhdfs/v1/?op=LISTSTATUS'");
        println!("  curl -sL 'http://127.0.0.1:{port}/webhdfs/v1/hello.txt?op=OPEN'");
        println!("  {exe} status --config {}/cluster.toml", dir.display());
        println!("press Ctrl-C to stop");
    }
}
