//! Multi-process tests on loopback: four `upright replica` child processes (u = r = 1) and
//! in-process clients. Replicas are killed with SIGKILL, stopped with SIGSTOP, cut off by a
//! network-namespace partition, have their files corrupted, and are attacked by a hostile peer;
//! every acknowledged write must stay readable.
//!
//! The tests run one at a time (each starts four processes; the machine may have two cores).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use upright_core::config::Knobs;
use upright_core::kv::{KvOperation, KvReply};
use upright_node::client::{start_client, ClientHandle};
use upright_node::files::{self, ClientFile, Cluster, InitPlan};

#[path = "common/storage.rs"]
mod storage;
use storage::corrupt_storage;
use upright_node::metrics::{http_get, parse_key_values};

static SERIAL: Mutex<()> = Mutex::new(());
const OP_TIMEOUT: Duration = Duration::from_secs(30);

#[path = "cluster/netns.rs"]
mod netns;

struct TestCluster {
    dir: tempfile::TempDir,
    cluster: Cluster,
    children: Vec<Option<Child>>,
    /// A replica that runs inside a network namespace, and that namespace's name.
    in_netns: Option<(usize, String)>,
    /// Environment variables of every replica process.
    env: Vec<(&'static str, String)>,
}

/// A free loopback port below Linux's ephemeral range (32768+), so the replicas' own outgoing
/// connections can never take it between the choice and the bind; distinct within this process.
fn free_port() -> u16 {
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

impl TestCluster {
    fn start() -> TestCluster {
        TestCluster::start_on(vec!["127.0.0.1".into()], None)
    }

    /// Starts replicas at `hosts` (one for all, or one each); `in_netns` runs one of them inside
    /// that network namespace.
    fn start_on(hosts: Vec<String>, in_netns: Option<(usize, String)>) -> TestCluster {
        TestCluster::start_running(hosts, in_netns, upright_core::config::OrderProtocol::Pbft, false)
    }

    /// Starts a cluster with separate stages (u = r = 1 for ordering, the execution stage at
    /// `exec_u`): four authentication and order processes, then the execution processes, each
    /// started as a user would (`upright replica --stages auth,order|exec --id i`).
    fn start_separate(exec_u: usize, selective_execution: bool) -> TestCluster {
        let n_exec = exec_u + exec_u.max(1) + 1;
        TestCluster::start_plan(
            vec!["127.0.0.1".into()],
            None,
            upright_core::config::OrderProtocol::Pbft,
            (selective_execution, Some(exec_u)),
            4 + n_exec,
        )
    }

    /// Starts a cluster ordering with `protocol`: four replicas (u = r = 1), or three (u = 1,
    /// r = 0) for LCR.
    fn start_running(
        hosts: Vec<String>,
        in_netns: Option<(usize, String)>,
        protocol: upright_core::config::OrderProtocol,
        selective_execution: bool,
    ) -> TestCluster {
        let lcr = protocol == upright_core::config::OrderProtocol::Lcr;
        let n = if lcr { 3 } else { 4 };
        TestCluster::start_plan(hosts, in_netns, protocol, (selective_execution, None), n)
    }

    /// Starts `n` replica processes of a cluster at u = 1 (r = 0 under LCR, 1 otherwise).
    fn start_plan(
        hosts: Vec<String>,
        in_netns: Option<(usize, String)>,
        protocol: upright_core::config::OrderProtocol,
        (selective_execution, separate_stages): (bool, Option<usize>),
        n: usize,
    ) -> TestCluster {
        let r = if protocol == upright_core::config::OrderProtocol::Lcr {
            0
        } else {
            1
        };
        let dir = tempfile::tempdir().unwrap();
        let knobs = Knobs {
            checkpoint_interval: 8,
            log_window: 16,
            view_change_timeout_us: 500_000,
            // Separated stages run with key refresh: execution-only processes keep their own keys.
            key_refresh_us: if separate_stages.is_some() { 2_000_000 } else { 0 },
            ..Knobs::default()
        };
        let plan = InitPlan {
            cluster_name: "multiprocess".into(),
            u: 1,
            r,
            hosts,
            clients: 4,
            base_port: 0,
            ports: Some((0..n).map(|_| (free_port(), free_port(), free_port())).collect()),
            knobs: Some(knobs),
            fsync: Default::default(),
            idle_spin_us: upright_node::spin::IDLE_SPIN_DEFAULT_US,
            unix_dir: None,
            // The test reads every replica's metrics, one of them in another network namespace.
            metrics_host: files::MetricsHost::Replica,
            metrics_token: false,
            recovery_interval_secs: 0,
            protocol,
            selective_execution,
            separate_stages,
        };
        let cluster = files::init_cluster(&plan, dir.path()).unwrap();
        let mut c = TestCluster {
            dir,
            cluster,
            children: (0..n).map(|_| None).collect(),
            in_netns,
            env: Vec::new(),
        };
        for id in 0..n {
            c.spawn(id);
        }
        c
    }

    /// Like [`TestCluster::start`], with `env` set for every replica process, and selective
    /// execution if `selective_execution`.
    fn start_with_env_selective(env: Vec<(&'static str, String)>, selective_execution: bool) -> TestCluster {
        let pbft = upright_core::config::OrderProtocol::Pbft;
        let mut c = TestCluster::start_running(vec!["127.0.0.1".into()], None, pbft, selective_execution);
        c.env = env;
        for id in 0..4 {
            c.kill(id);
            c.spawn(id);
        }
        c
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn spawn(&mut self, id: usize) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path().join(format!("replica-{id}.log")))
            .unwrap();
        let mut command = match &self.in_netns {
            // `ip netns exec` execs in place: the child's pid is the replica's.
            Some((r, ns)) if *r == id => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_upright")]);
                c
            }
            _ => Command::new(env!("CARGO_BIN_EXE_upright")),
        };
        command.envs(self.env.iter().map(|(k, v)| (*k, v.as_str())));
        command
            .args(["replica", "--config"])
            .arg(self.path().join("cluster.toml"));
        // With separate stages, as a user starts them: by stage and member index.
        let q = self.cluster.config.validate().unwrap();
        if q.separate_stages {
            let base = q.exec_process_base() as usize;
            match id.checked_sub(base) {
                Some(member) => command.args(["--stages", "exec", "--id", &member.to_string()]),
                None => command.args(["--stages", "auth,order", "--id", &id.to_string()]),
            };
        } else {
            command.args(["--id", &id.to_string()]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children[id] = Some(child);
    }

    fn kill(&mut self, id: usize) {
        if let Some(mut child) = self.children[id].take() {
            child.kill().unwrap(); // SIGKILL
            child.wait().unwrap();
        }
    }

    fn signal(&self, id: usize, signal: i32) {
        let pid = self.children[id].as_ref().unwrap().id() as i32;
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    fn client(&self, c: u32) -> ClientHandle {
        let setup = ClientFile::load(&self.path().join(format!("client-{c}.toml"))).unwrap();
        start_client(setup, Some(self.path().join(format!("client-{c}.id")))).unwrap()
    }

    /// Replica `id`'s (its slot's) status, if it answers.
    async fn status(&self, id: u32) -> Option<std::collections::BTreeMap<String, String>> {
        // cluster.toml as it is now: a reconfiguration adds replicas to it.
        let cluster = Cluster::load(&self.path().join("cluster.toml")).unwrap();
        let addr = files::resolve(&cluster.member_entry(id).unwrap().metrics_addr).unwrap();
        http_get(addr, "/status", None).await.ok().map(|b| parse_key_values(&b))
    }

    async fn executed(&self, id: u32) -> u64 {
        self.status(id)
            .await
            .and_then(|s| s.get("executed")?.parse().ok())
            .unwrap_or(0)
    }

    fn logs(&self) -> String {
        (0..self.children.len())
            .map(|i| std::fs::read_to_string(self.path().join(format!("replica-{i}.log"))).unwrap_or_default())
            .map(|l| {
                let lines: Vec<&str> = l.lines().collect();
                let at = lines.iter().position(|x| x.contains("panicked")).unwrap_or(lines.len());
                let mut panics: Vec<&str> = lines.iter().filter(|x| x.contains("WARN")).take(3).copied().collect();
                panics.extend(
                    lines[at..]
                        .iter()
                        .filter(|x| x.contains("upright") || x.contains("panicked"))
                        .take(14),
                );
                let tail: Vec<&str> = l
                    .lines()
                    .filter(|x| !x.trim_start().starts_with("at "))
                    .rev()
                    .take(8)
                    .collect();
                format!("{}\n{}", panics.join("\n"), tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n----\n")
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for id in 0..self.children.len() {
            if self.children[id].is_some() {
                self.signal(id, libc::SIGCONT);
            }
            self.kill(id);
        }
    }
}

fn put_op(key: &str, value: &str) -> Bytes {
    KvOperation::Put {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
    }
    .encode()
}

async fn put(client: &ClientHandle, key: &str, value: &str) -> bool {
    matches!(client.invoke_timeout(put_op(key, value), false, OP_TIMEOUT).await,
        Ok(r) if KvReply::decode(&r) == Some(KvReply::Done))
}

async fn get(client: &ClientHandle, key: &str) -> Option<String> {
    let op = KvOperation::Get {
        key: Bytes::copy_from_slice(key.as_bytes()),
    }
    .encode();
    match KvReply::decode(&client.invoke_timeout(op, false, OP_TIMEOUT).await.ok()?)? {
        KvReply::Value(Some(v)) => Some(String::from_utf8_lossy(&v).to_string()),
        _ => None,
    }
}

/// Writes `n` keys `prefix-i`; returns the acknowledged ones.
async fn write_many(client: &ClientHandle, prefix: &str, n: usize) -> Vec<(String, String)> {
    let mut acked = Vec::new();
    for i in 0..n {
        let (k, v) = (format!("{prefix}-{i}"), format!("value-{prefix}-{i}"));
        if put(client, &k, &v).await {
            acked.push((k, v));
        }
    }
    acked
}

async fn assert_all_readable(c: &TestCluster, client: &ClientHandle, acked: &[(String, String)]) {
    for (k, v) in acked {
        let got = get(client, k).await;
        assert_eq!(
            got.as_deref(),
            Some(v.as_str()),
            "acknowledged write {k} lost\n{}",
            c.logs()
        );
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn workload_continues_while_a_replica_is_killed_and_restarted() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let mut c = TestCluster::start();
        let client = c.client(0);
        let mut acked = write_many(&client, "before", 20).await;
        assert_eq!(acked.len(), 20, "{}", c.logs());
        c.kill(2);
        let during = write_many(&client, "during", 30).await;
        assert_eq!(during.len(), 30, "writes continue with one replica down\n{}", c.logs());
        assert_status_shows_replica_2_down(&c);
        acked.extend(during);
        c.spawn(2);
        acked.extend(write_many(&client, "after", 30).await);
        assert_all_readable(&c, &client, &acked).await;
        // The restarted replica catches up.
        let deadline = Instant::now() + Duration::from_secs(20);
        while c.executed(2).await < c.executed(0).await.saturating_sub(2) {
            assert!(Instant::now() < deadline, "replica 2 did not catch up\n{}", c.logs());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
}

/// LCR (`protocol = "lcr"`, u = 1, r = 0: three replicas): each replica in turn is SIGKILLed
/// while a client writes and restarted (the ring moves to a view without it, then to one with
/// it again), then all three are SIGKILLed at once and restarted: every acknowledged write is
/// readable, and a restarted replica catches up.
#[test]
fn lcr_serves_through_sigkill_of_each_replica_and_of_all_at_once() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let mut c = TestCluster::start_running(
            vec!["127.0.0.1".into()],
            None,
            upright_core::config::OrderProtocol::Lcr,
            false,
        );
        let client = c.client(0);
        let acked = write_many(&client, "before", 20).await;
        assert_eq!(acked.len(), 20, "{}", c.logs());
        kill_each_then_all(&mut c, &client, acked, 3, 3).await;
    });
}

/// SIGKILLs execution replicas `0..each` one at a time while `client` writes, restarting each,
/// then all `n` replicas at once: every write acknowledged (`acked` and the new ones) is
/// readable, and each of the first `each` catches up with the next.
async fn kill_each_then_all(
    c: &mut TestCluster,
    client: &ClientHandle,
    mut acked: Vec<(String, String)>,
    each: usize,
    n: usize,
) {
    for id in 0..each {
        c.kill(id);
        let during = write_many(client, &format!("without-{id}"), 20).await;
        assert_eq!(during.len(), 20, "writes continue with replica {id} down\n{}", c.logs());
        acked.extend(during);
        c.spawn(id);
        acked.extend(write_many(client, &format!("back-{id}"), 10).await);
    }
    for id in 0..n {
        c.kill(id);
    }
    for id in 0..n {
        c.spawn(id);
    }
    acked.extend(write_many(client, "after-all", 10).await);
    assert_all_readable(c, client, &acked).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    for id in 0..each as u32 {
        let next = (id + 1) % each as u32;
        while c.executed(id).await < c.executed(next).await.saturating_sub(2) {
            assert!(Instant::now() < deadline, "replica {id} did not catch up\n{}", c.logs());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Selective execution (`selective_execution = true`): each write runs on two of the three
/// execution replicas. Each execution replica in turn is SIGKILLed while a client writes and
/// restarted, then all four at once: every acknowledged write is readable, every replica skipped
/// requests, and the restarted ones catch up.
#[test]
fn selective_execution_serves_through_sigkill_of_each_execution_replica_and_of_all() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let mut c = TestCluster::start_running(
            vec!["127.0.0.1".into()],
            None,
            upright_core::config::OrderProtocol::Pbft,
            true,
        );
        let client = c.client(0);
        let acked = write_many(&client, "before", 20).await;
        assert_eq!(acked.len(), 20, "{}", c.logs());
        // Stage counters reach /status a moment later.
        let deadline = Instant::now() + Duration::from_secs(10);
        for id in 0..3u32 {
            loop {
                let status = c.status(id).await.unwrap_or_default();
                let skipped = status
                    .get("stat_exec_requests_skipped")
                    .and_then(|v| v.parse::<u64>().ok());
                if skipped.unwrap_or(0) > 0 {
                    break;
                }
                assert!(Instant::now() < deadline, "replica {id} ran every request: {status:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        kill_each_then_all(&mut c, &client, acked, 3, 4).await;
    });
}

/// Separate stages (ODRC-6, UpRight's deployment): four authentication and order processes and
/// five execution-only processes (ordering at u = r = 1, execution at u = 2), with selective
/// execution. Pairs of execution processes are SIGKILLed together while a client writes (every
/// process is in some pair, and pairs of neighbours, which maintain objects together), then
/// restarted: writes go on, every acknowledged write is readable, and the restarted processes
/// catch up.
#[test]
fn separate_stages_serve_through_sigkill_of_any_two_execution_processes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let mut c = TestCluster::start_separate(2, true);
        assert_eq!(c.children.len(), 9);
        let client = c.client(0);
        let mut acked = write_many(&client, "before", 20).await;
        assert_eq!(acked.len(), 20, "{}", c.logs());
        // Execution member i is process 4 + i.
        for (a, b) in [(0, 1), (2, 3), (4, 0), (1, 3)] {
            c.kill(4 + a);
            c.kill(4 + b);
            let during = write_many(&client, &format!("without-{a}-{b}"), 20).await;
            assert_eq!(
                during.len(),
                20,
                "writes continue with execution members {a} and {b} down\n{}",
                c.logs()
            );
            acked.extend(during);
            c.spawn(4 + a);
            c.spawn(4 + b);
            acked.extend(write_many(&client, &format!("back-{a}-{b}"), 10).await);
        }
        assert_all_readable(&c, &client, &acked).await;
        // The authentication and order processes execute nothing; every execution process
        // catches up with the others.
        assert_eq!(
            c.status(0).await.and_then(|s| s.get("executed").cloned()).as_deref(),
            Some("0")
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for id in 4..9u32 {
            let other = if id == 8 { 4 } else { id + 1 };
            while c.executed(id).await < c.executed(other).await.saturating_sub(2) {
                assert!(Instant::now() < deadline, "process {id} did not catch up\n{}", c.logs());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        // Key refresh runs in every process, the execution-only ones included (each its own key
        // member); a proactive recovery of an execution-only process and of an authentication
        // and order process completes while a client writes.
        // (Processes restarted above began a new epoch at their start; the next comes 2 s later.)
        let deadline = Instant::now() + Duration::from_secs(15);
        for id in 4..9u32 {
            loop {
                let status = c.status(id).await.expect("execution process answers");
                let refreshed: u64 = status.get("stat_exec_keys_refreshed").map_or(0, |v| v.parse().unwrap());
                if refreshed >= 2 {
                    break;
                }
                assert!(Instant::now() < deadline, "process {id} refreshed its keys: {status:?}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = spawn_writer(c.client(1), stop.clone());
        let config = c.path().join("cluster.toml");
        for id in [6u32, 1] {
            recover_with_the_command(&c, &config, id).await;
            let status = c.status(id).await.expect("recovered process answers");
            assert_eq!(status.get("proactive_recovery").map(String::as_str), Some("recovered"));
            let stage = if id >= 4 { "exec" } else { "auth" };
            assert_eq!(
                status
                    .get(&format!("stat_{stage}_recovery_new_key"))
                    .map(String::as_str),
                Some("1"),
                "new key epoch: {status:?}"
            );
        }
        let exec_6 = c.status(6).await.unwrap();
        assert_eq!(
            exec_6.get("stat_exec_recovery_state_checked").map(String::as_str),
            Some("1"),
            "state checked against a certified checkpoint: {exec_6:?}"
        );
        acked.extend(finish_writer(&stop, writer, "recoveries", &c.logs()).await);
        assert_all_readable(&c, &client, &acked).await;
    });
}

/// `upright status` as a user runs it: replica 2 is down, replica 3 hosts no execution member.
fn assert_status_shows_replica_2_down(c: &TestCluster) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_upright"))
        .arg("status")
        .arg("--config")
        .arg(c.path().join("cluster.toml"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = |id: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_else(|| panic!("no row for replica {id}:\n{text}"))
            .split_whitespace()
            .map(String::from)
            .collect::<Vec<_>>()
    };
    assert_eq!(row("2")[1], "down", "{text}");
    assert_eq!(row("0")[1], "ok", "{text}");
    assert!(
        row("0")[4].parse::<u64>().unwrap() > 0,
        "replica 0 executed batches:\n{text}"
    );
    assert_eq!((row("3")[4].as_str(), row("3")[6].as_str()), ("-", "-"), "{text}");
    assert!(text.contains("3 of 4 replicas answered"), "{text}");
}

#[test]
fn every_acknowledged_write_survives_sigkill_of_all_replicas() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let mut c = TestCluster::start();
        let client = c.client(1);
        let acked = write_many(&client, "k", 40).await;
        assert_eq!(acked.len(), 40, "{}", c.logs());
        for id in 0..4 {
            c.kill(id);
        }
        for id in 0..4 {
            c.spawn(id);
        }
        assert_all_readable(&c, &client, &acked).await;
        assert!(put(&client, "after-restart", "ok").await);
    });
}

#[test]
fn replica_with_corrupted_files_recovers_correct_state_from_peers() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let mut c = TestCluster::start();
        let client = c.client(2);
        let mut acked = write_many(&client, "a", 40).await;
        c.kill(1);
        assert!(corrupt_storage(&c.cluster.data_dir(1)) >= 2);
        c.spawn(1);
        acked.extend(write_many(&client, "b", 40).await);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = c.status(1).await.unwrap_or_default();
            let recovered = s.get("corrupt_storage_recoveries").is_some_and(|v| v != "0");
            if recovered && c.executed(1).await + 2 >= c.executed(0).await && c.executed(1).await > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replica 1 did not recover: {s:?}\n{}",
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let transfers = c
            .status(1)
            .await
            .and_then(|s| s.get("state_transfers")?.parse::<u64>().ok());
        assert!(
            transfers.unwrap_or(0) >= 1,
            "state not loaded from peers: {transfers:?}"
        );
        // With replica 2 down, replies need replica 1's execution state: it must be correct.
        c.kill(2);
        assert_all_readable(&c, &client, &acked).await;
    });
}

/// A SIGSTOPped replica loses no messages: its kernel keeps acknowledging TCP data into its
/// receive buffers and its peers hold the rest in their outbound queues (`OUTBOUND_QUEUE_MAX`
/// frames each), so after SIGCONT it catches up by processing that backlog (its `/status` shows
/// `state_transfers=0`). Catching up by state transfer, after messages really were lost, is
/// `partitioned_replica_catches_up_by_state_transfer`.
#[test]
fn stopped_replica_catches_up_from_buffered_messages_after_it_continues() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let c = TestCluster::start();
        let client = c.client(3);
        let mut acked = write_many(&client, "x", 5).await;
        c.signal(2, libc::SIGSTOP);
        acked.extend(write_many(&client, "y", 60).await); // several checkpoints past replica 2
        c.signal(2, libc::SIGCONT);
        acked.extend(write_many(&client, "z", 10).await);
        let deadline = Instant::now() + Duration::from_secs(30);
        while c.executed(2).await + 2 < c.executed(0).await {
            assert!(Instant::now() < deadline, "replica 2 did not catch up\n{}", c.logs());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_all_readable(&c, &client, &acked).await;
    });
}

/// A transport counter of replica `id` from its `/metrics` (0 if absent or unreachable).
async fn net_counter(c: &TestCluster, id: u32, name: &str) -> u64 {
    let addr = files::resolve(&c.cluster.file.replica(id).unwrap().metrics_addr).unwrap();
    let metrics = http_get(addr, "/metrics", None).await.unwrap_or_default();
    let needle = format!("name=\"{name}\"}} ");
    metrics
        .lines()
        .filter(|l| l.starts_with("upright_net_counter{"))
        .find_map(|l| l.split_once(&needle)?.1.trim().parse().ok())
        .unwrap_or(0)
}

/// Frames replicas 0, 1 and 3 dropped because an outbound queue was full.
async fn dropped_to_others(c: &TestCluster) -> u64 {
    let mut sum = 0;
    for id in [0, 1, 3] {
        sum += net_counter(c, id, "net_dropped_outbound_full").await;
    }
    sum
}

/// Most writes while replica 2 is cut off before its peers' outbound queues to it overflow.
const PARTITION_WRITES_MAX: usize = 20_000;

/// Replica 2 runs in its own network namespace; the veth into it goes down, so every packet to
/// and from it is lost while the others go on. Its peers' outbound queues to it fill up and then
/// drop (`net_dropped_outbound_full`): those messages are gone for good. The others then run
/// several log windows further, the link comes back, and replica 2 must load state from its
/// peers (`state_transfers >= 1`) to catch up. Skips, loudly, where namespaces cannot be made.
#[test]
fn partitioned_replica_catches_up_by_state_transfer() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(net) = netns::Netns::create() else {
        return;
    };
    rt().block_on(async {
        let h = net.host_addr.clone();
        let hosts = vec![h.clone(), h.clone(), net.ns_addr.clone(), h];
        let c = TestCluster::start_on(hosts, Some((2, net.name.clone())));
        let client = c.client(3);
        let mut acked = write_many(&client, "x", 5).await;
        assert_eq!(acked.len(), 5, "{}", c.logs());
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.executed(2).await < 5 {
            assert!(
                Instant::now() < deadline,
                "replica 2 unreachable before the cut\n{}",
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        net.cut();
        let started = Instant::now();
        let mut written = 0;
        while dropped_to_others(&c).await == 0 {
            assert!(
                written < PARTITION_WRITES_MAX,
                "outbound queues never overflowed\n{}",
                c.logs()
            );
            acked.extend(write_many(&client, &format!("y{written}"), 100).await);
            written += 100;
        }
        // Messages to replica 2 are now being lost; go several log windows (16) further.
        acked.extend(write_many(&client, "w", 64).await);
        eprintln!(
            "partition: {} writes in {:?}, {} frames dropped",
            written + 64,
            started.elapsed(),
            dropped_to_others(&c).await
        );
        net.heal();
        acked.extend(write_many(&client, "z", 10).await);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = c.status(2).await.unwrap_or_default();
            let transfers: u64 = status.get("state_transfers").and_then(|v| v.parse().ok()).unwrap_or(0);
            let executed: u64 = status.get("executed").and_then(|v| v.parse().ok()).unwrap_or(0);
            if transfers >= 1 && executed + 2 >= c.executed(0).await {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "replica 2 did not catch up by state transfer: {status:?}\n{}",
                c.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_all_readable(&c, &client, &acked).await;
    });
}

#[test]
fn hostile_peer_changes_nothing() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let c = TestCluster::start();
        let client = c.client(0);
        let mut acked = write_many(&client, "p", 10).await;
        let targets: Vec<_> = c
            .cluster
            .file
            .replicas
            .iter()
            .flat_map(|r| [r.replica_addr.clone(), r.client_addr.clone()])
            .map(|a| files::resolve(&a).unwrap())
            .collect();
        let attack = tokio::spawn(async move {
            for round in 0u32..50 {
                for addr in &targets {
                    if let Ok(mut s) = tokio::net::TcpStream::connect(addr).await {
                        let junk: Vec<u8> = (0..200u32).map(|i| (i * 31 + round) as u8).collect();
                        let _ = s.write_all(&junk).await;
                        let _ = s.write_all(&u32::MAX.to_be_bytes()).await;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        acked.extend(write_many(&client, "q", 40).await);
        attack.await.unwrap();
        assert_all_readable(&c, &client, &acked).await;
        let addr = files::resolve(&c.cluster.file.replica(0).unwrap().metrics_addr).unwrap();
        let metrics = http_get(addr, "/metrics", None).await.unwrap();
        assert!(metrics.contains("net_closed_bad_hello"), "{metrics}");
    });
}

/// Pushed messages across real processes: client 0 watches keys (an ordered GET sets a one-shot
/// watch) and client 1 writes them; replica 1 forges every push its service makes
/// (`UPRIGHT_TEST_FORGE_PUSHES=1`). Client 0 must receive exactly the honest pushes, each once,
/// numbered 1, 2, 3, ... in order, with no gap.
#[test]
fn pushed_messages_arrive_once_in_order_despite_a_replica_forging_them() {
    pushes_despite_forgery(false);
}

/// The same under selective execution (docs/ODRC.md, "Per-object push streams"): each key's
/// watch event comes in the key's own stream (push 1 of it), announced by the watcher's Get,
/// whichever two of the three execution replicas ran the key's requests. Where the forging
/// replica is one of the two, the third's copy comes once the next checkpoint installed the key
/// with its stream (the watcher's poll asks every replica).
#[test]
fn watch_events_come_in_each_keys_stream_under_selective_execution_despite_a_forging_replica() {
    pushes_despite_forgery(true);
}

fn pushes_despite_forgery(selective: bool) {
    use upright_core::kv::KvEvent;
    use upright_node::client::PushEvent;
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let env = vec![(upright_node::replica::FORGE_PUSHES_ENV, "1".into())];
        let c = TestCluster::start_with_env_selective(env, selective);
        let (watcher, writer) = (c.client(0), c.client(1));
        let mut pushes = watcher.pushes().expect("the push stream");
        assert!(watcher.pushes().is_none(), "the stream is taken once");
        // Under selective execution a push whose maintainers include the forger waits for the
        // next checkpoint (heartbeats make one in about 4 s): fewer keys.
        let n: u64 = if selective { 6 } else { 20 };
        for i in 1..=n {
            let key = format!("watched-{i}");
            assert_eq!(get(&watcher, &key).await, None, "{}", c.logs());
            assert!(put(&writer, &key, &format!("v{i}")).await, "{}", c.logs());
            let event = tokio::time::timeout(OP_TIMEOUT, pushes.recv())
                .await
                .unwrap_or_else(|_| panic!("push {i} did not arrive\n{}", c.logs()))
                .expect("stream open");
            let PushEvent::Message { stream, seq, payload } = event else {
                panic!("push {i}: {event:?}");
            };
            if selective {
                assert_eq!(stream, Some(Bytes::from(key.clone())), "the key's stream");
                assert_eq!(seq, 1, "the first push of its stream");
            } else {
                assert_eq!(stream, None, "the client's own stream");
                assert_eq!(seq, i, "pushes arrive numbered in order");
            }
            assert_eq!(
                KvEvent::decode(&payload),
                Some(KvEvent {
                    key: Bytes::from(key),
                    value: Some(Bytes::from(format!("v{i}"))),
                }),
                "push {i} is the honest one"
            );
        }
        // Nothing more: no duplicate, no forged copy, no gap.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(pushes.try_recv().is_err(), "an extra push arrived");
        let log = std::fs::read_to_string(c.path().join("replica-1.log")).unwrap();
        assert!(log.contains("forges every message its service pushes"), "{log}");
        let addr = files::resolve(&c.cluster.file.replica(1).unwrap().metrics_addr).unwrap();
        let metrics = http_get(addr, "/metrics", None).await.unwrap_or_default();
        let forged: u64 = metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix("upright_pushes_total{replica=\"1\"} ")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0);
        // Under selective execution replica 1 runs (and forges) only the writes of the keys it
        // maintains (two of every three, by their hashes).
        let least = if selective { 1 } else { n };
        assert!(forged >= least, "replica 1 pushed its forgeries ({forged})\n{metrics}");
    });
}

/// Serializable reads across real processes (the `r + 1` quorum itself is unit-tested in
/// `core::client::read_only`): with an execution replica stopped they return what was written.
#[test]
fn serializable_reads_answer_with_an_execution_replica_stopped() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let c = TestCluster::start();
        let client = c.client(0);
        assert!(put(&client, "s", "1").await, "{}", c.logs());
        c.signal(2, libc::SIGSTOP);
        let get_s = KvOperation::Get { key: Bytes::from("s") }.encode();
        for _ in 0..5 {
            let result = client.invoke_serializable(get_s.clone()).await.unwrap();
            assert_eq!(
                KvReply::decode(&result),
                Some(KvReply::Value(Some(Bytes::from("1")))),
                "{}",
                c.logs()
            );
        }
        c.signal(2, libc::SIGCONT);
    });
}

/// Proactive recovery (issue 28): every replica in turn is told to recover with `upright recover`
/// while a client keeps writing. Each restarts from the binary on disk (same process id: it
/// replaces its own image), starts a new key epoch, estimates its recovery point from its peers,
/// checks its state against a certified checkpoint and rejoins; `upright recover` reports it
/// recovered. No acknowledged write is lost, and no write waited longer than the bound.
#[test]
fn every_replica_recovers_proactively_in_turn_while_a_workload_runs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let c = TestCluster::start();
        let client = c.client(0);
        let mut acked = write_many(&client, "before", 20).await;
        assert_eq!(acked.len(), 20, "{}", c.logs());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = spawn_writer(c.client(1), stop.clone());
        let config = c.path().join("cluster.toml");
        let pids: Vec<u32> = c.children.iter().map(|ch| ch.as_ref().unwrap().id()).collect();
        for id in 0..4u32 {
            recover_with_the_command(&c, &config, id).await;
            let status = c.status(id).await.expect("recovered replica answers");
            assert_eq!(status.get("proactive_recovery").map(String::as_str), Some("recovered"));
            assert_eq!(
                status.get("stat_auth_recovery_new_key").map(String::as_str),
                Some("1"),
                "new key epoch"
            );
            if id < 3 {
                assert_eq!(
                    status.get("stat_exec_recovery_state_checked").map(String::as_str),
                    Some("1"),
                    "state checked against a certified checkpoint: {status:?}"
                );
            }
            // The process replaced its own image: same pid, a fresh start in its log.
            assert_eq!(c.children[id as usize].as_ref().unwrap().id(), pids[id as usize]);
            let log = std::fs::read_to_string(c.path().join(format!("replica-{id}.log"))).unwrap();
            assert!(log.contains("proactive recovery complete"), "{log}");
        }
        let during = finish_writer(&stop, writer, "recoveries", &c.logs()).await;
        acked.extend(during);
        assert_none_lost(&client, &acked, &c.logs()).await;
    });
}

/// `upright recover --id id` as a user runs it: it must report the replica recovered.
async fn recover_with_the_command(c: &TestCluster, config: &Path, id: u32) {
    let config = config.to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_upright"))
            .args(["recover", "--config"])
            .arg(&config)
            .args(["--id", &id.to_string(), "--timeout-secs", "60"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "upright recover --id {id}: {printed}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.logs()
    );
    assert!(
        printed.contains(&format!("replica {id}: recovery requested")),
        "{printed}"
    );
    assert!(printed.contains(&format!("replica {id}: recovered in ")), "{printed}");
    println!("{printed}");
}

/// A client that writes `during-<i>` keys until `stop`: what was acknowledged, and the slowest
/// write.
fn spawn_writer(
    client: ClientHandle,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<(String, String)>, Duration)> {
    tokio::spawn(async move {
        let (mut acked, mut slowest, mut i) = (Vec::new(), Duration::ZERO, 0);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let (k, v) = (format!("during-{i}"), format!("value-{i}"));
            let started = Instant::now();
            if put(&client, &k, &v).await {
                acked.push((k, v));
            }
            slowest = slowest.max(started.elapsed());
            i += 1;
        }
        (acked, slowest)
    })
}

/// Stops the writer of [`spawn_writer`] and checks the cluster kept serving it during `what`:
/// at least 20 writes, none slower than 10 s. Returns the acknowledged writes.
async fn finish_writer(
    stop: &std::sync::atomic::AtomicBool,
    writer: tokio::task::JoinHandle<(Vec<(String, String)>, Duration)>,
    what: &str,
    logs: &str,
) -> Vec<(String, String)> {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (during, slowest) = writer.await.unwrap();
    println!(
        "{} writes acknowledged during the {what}; the slowest took {slowest:?}",
        during.len()
    );
    assert!(
        during.len() >= 20,
        "the cluster kept serving: {} writes\n{logs}",
        during.len()
    );
    assert!(slowest < Duration::from_secs(10), "a write waited {slowest:?}\n{logs}");
    during
}

/// Every acknowledged write reads back.
async fn assert_none_lost(client: &ClientHandle, acked: &[(String, String)], logs: &str) {
    let mut lost = Vec::new();
    for (k, v) in acked {
        if get(client, k).await.as_deref() != Some(v.as_str()) {
            lost.push(k.clone());
        }
    }
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost: {:?}\n{logs}",
        lost.len(),
        acked.len(),
        &lost[..lost.len().min(20)]
    );
}

/// `upright reconfigure` with `args`, to completion (it waits for the new configuration).
async fn reconfigure(config: &Path, args: &[String]) -> (bool, String) {
    let (config, args) = (config.to_path_buf(), args.to_vec());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_upright"))
            .args(["reconfigure", "--config"])
            .arg(&config)
            .args(&args)
            .args(["--timeout-secs", "90"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), printed)
}

/// The replicas `ids`, removed by a reconfiguration, stop by themselves (successfully, saying so).
async fn removed_ones_stop(c: &mut TestCluster, ids: &[usize]) {
    for &id in ids {
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = c.children[id].as_mut().unwrap().try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "replica {id} still runs after its removal");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(status.success(), "replica {id} exited with {status}");
        let log = std::fs::read_to_string(c.path().join(format!("replica-{id}.log"))).unwrap();
        assert!(log.contains("removed from the cluster"), "{log}");
        c.children[id] = None;
    }
}

/// Waits (at most 60 s) until replica `id` answers that it runs in configuration `epoch`.
async fn wait_for_epoch(c: &TestCluster, id: u32, epoch: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = c.status(id).await.and_then(|s| s.get("config_epoch").cloned());
        if now == Some(epoch.to_string()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replica {id} did not reach epoch {epoch}: {now:?}\n{}",
            c.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Grows the 4-replica test cluster to 6 (u = 2, r = 1) with `upright reconfigure`, starting
/// the two new replicas once the change is ordered (recorded in cluster.toml).
async fn grow_to_six(c: &mut TestCluster, config: &Path) {
    let grow: Vec<String> = vec![
        "--add".into(),
        format!("127.0.0.1:{}", free_port()),
        "--add".into(),
        format!("127.0.0.1:{}", free_port()),
        "--u".into(),
        "2".into(),
    ];
    let growing = tokio::spawn({
        let config = config.to_path_buf();
        async move { reconfigure(&config, &grow).await }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(config).unwrap().contains("reconfigurations") {
        assert!(Instant::now() < deadline, "the change was not ordered\n{}", c.logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.children.extend([None, None]);
    c.spawn(4);
    c.spawn(5);
    let (ok, printed) = growing.await.unwrap();
    println!("{printed}");
    assert!(ok, "upright reconfigure (grow): {printed}\n{}", c.logs());
    assert!(
        printed.contains("reconfigured: epoch 1, 6 replicas, u = 2, r = 1"),
        "{printed}"
    );
}

/// A test cluster grown to 6 replicas while client 1 writes (still writing), and client 0's
/// acknowledged writes from before.
struct Grown {
    c: TestCluster,
    client: ClientHandle,
    acked: Vec<(String, String)>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    writer: tokio::task::JoinHandle<(Vec<(String, String)>, Duration)>,
    config: std::path::PathBuf,
}

async fn grown_under_load() -> Grown {
    let mut c = TestCluster::start();
    let client = c.client(0);
    let acked = write_many(&client, "before", 10).await;
    assert_eq!(acked.len(), 10, "{}", c.logs());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = spawn_writer(c.client(1), stop.clone());
    let config = c.path().join("cluster.toml");
    grow_to_six(&mut c, &config).await;
    Grown {
        c,
        client,
        acked,
        stop,
        writer,
        config,
    }
}

/// Reconfiguration (docs/PROTOCOL.md "Reconfiguration"): a 4-replica cluster (u = 1, r = 1)
/// grows to 6 (u = 2, r = 1) and shrinks back to 4 while a client writes; the new replicas join
/// by state transfer, the removed ones stop by themselves, no acknowledged write is lost, and
/// the client, which knew only the first 4 replicas, keeps being served throughout.
#[test]
fn a_four_replica_cluster_grows_to_six_and_shrinks_back_under_load() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let Grown {
            mut c,
            client,
            mut acked,
            stop,
            writer,
            config,
        } = grown_under_load().await;
        let shrink: Vec<String> = ["--remove", "4", "--remove", "5", "--u", "1"]
            .map(String::from)
            .to_vec();
        let (ok, printed) = reconfigure(&config, &shrink).await;
        println!("{printed}");
        assert!(ok, "upright reconfigure (shrink): {printed}\n{}", c.logs());
        assert!(
            printed.contains("reconfigured: epoch 2, 4 replicas, u = 1, r = 1"),
            "{printed}"
        );
        // The removed replicas stop by themselves.
        removed_ones_stop(&mut c, &[4, 5]).await;
        for id in 0..4 {
            let status = c.status(id).await.expect("a member answers");
            assert_eq!(status.get("config_epoch").map(String::as_str), Some("2"), "{status:?}");
        }
        // The changes can take well under a second: the writer goes on in the last
        // configuration for a while too.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let during = finish_writer(&stop, writer, "reconfigurations and a second after", &c.logs()).await;
        acked.extend(during);
        assert_none_lost(&client, &acked, &c.logs()).await;
    });
}

/// Removing replicas from the middle (docs/OPERATING.md "Reconfiguration"): the cluster grows
/// to 6 (u = 2, r = 1), then replicas 1 and 2 are removed (u = 1) under load while replica 3 is
/// down. Replicas 3, 4 and 5 move to other positions in the protocol (ids are positions there,
/// and execution positions are filled first); the operator keeps calling every replica by its
/// id. Replica 3 comes back in the old configuration, and it and the others, now in the new
/// one, connect as each one's configuration names them: it catches up to its new position. A
/// moved replica killed and restarted afterwards comes back in its new position too; no
/// acknowledged write is lost.
#[test]
fn replicas_removed_from_the_middle_leave_the_others_serving_at_their_new_positions() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let Grown {
            mut c,
            client,
            mut acked,
            stop,
            writer,
            config,
        } = grown_under_load().await;
        // Replica 3 is down while it changes position: it comes back in the old configuration.
        c.kill(3);
        let shrink: Vec<String> = ["--remove", "1", "--remove", "2", "--u", "1"]
            .map(String::from)
            .to_vec();
        let (ok, printed) = reconfigure(&config, &shrink).await;
        println!("{printed}");
        assert!(ok, "upright reconfigure (shrink): {printed}\n{}", c.logs());
        assert!(
            printed.contains("reconfigured: epoch 2, 4 replicas, u = 1, r = 1"),
            "{printed}"
        );
        assert!(
            printed.contains("replica 4 runs as member 1 of the new configuration"),
            "{printed}"
        );
        assert!(printed.contains("replica 3 does not answer"), "{printed}");
        c.spawn(3);
        removed_ones_stop(&mut c, &[1, 2]).await;
        for id in [0, 3, 4, 5] {
            wait_for_epoch(&c, id, 2).await;
        }
        let log = std::fs::read_to_string(c.path().join("replica-3.log")).unwrap();
        assert!(log.contains("it is member 2 of its configuration"), "{log}");
        // A moved replica restarts into its new position (its data directory and key keep its id).
        c.kill(4);
        tokio::time::sleep(Duration::from_millis(500)).await;
        c.spawn(4);
        wait_for_epoch(&c, 4, 2).await;
        let log = std::fs::read_to_string(c.path().join("replica-4.log")).unwrap();
        assert!(log.contains("it is member 1 of its configuration"), "{log}");
        // The client (which knew only the first configuration) learns the change with its
        // next requests: r + 1 of the replicas it knows tell it, replica 3 under its new id.
        let shrunk = write_many(&client, "shrunk", 10).await;
        assert_eq!(shrunk.len(), 10, "{}", c.logs());
        acked.extend(shrunk);
        // Served with replica 0 down too: the three others, all at new positions, are a quorum.
        c.kill(0);
        let after = write_many(&client, "after", 10).await;
        assert_eq!(after.len(), 10, "served with replica 0 down\n{}", c.logs());
        acked.extend(after);
        let during = finish_writer(&stop, writer, "shrink from the middle", &c.logs()).await;
        acked.extend(during);
        assert_none_lost(&client, &acked, &c.logs()).await;
    });
}

/// Clients learn the membership from the replicas: a client that knew only the first four
/// replicas keeps being served after the cluster grew to six (u = 2) and two of those four were
/// killed; it needs the new replicas for that (four authentication members' rows), which it
/// found in the change the replicas told it and connected to by itself.
#[test]
fn a_client_follows_a_grown_cluster_when_two_original_replicas_go_down() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let mut c = TestCluster::start();
        let client = c.client(0);
        let mut acked = write_many(&client, "before", 10).await;
        assert_eq!(acked.len(), 10, "{}", c.logs());
        let config = c.path().join("cluster.toml");
        grow_to_six(&mut c, &config).await;
        // The client learns the change with its next requests.
        acked.extend(write_many(&client, "grown", 10).await);
        c.kill(0);
        c.kill(1);
        let after = write_many(&client, "after", 10).await;
        assert_eq!(after.len(), 10, "served with replicas 0 and 1 down\n{}", c.logs());
        acked.extend(after);
        assert_none_lost(&client, &acked, &c.logs()).await;
    });
}

/// The reason to grow a cluster is often a replica that went down: a 4-replica cluster with
/// replica 3 down grows to 6 (u = 2, r = 1) under load. The next configuration's first
/// certificate needs 4 votes and only 3 old members are up, so the hand-over needs the new
/// members' votes: the old members connect to the members the change adds. Replica 3 comes back
/// afterwards, still in the old configuration, and catches up to the new one by itself.
#[test]
fn a_cluster_grows_while_one_of_its_replicas_is_down_and_the_replica_catches_up_later() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    rt().block_on(async {
        let mut c = TestCluster::start();
        let client = c.client(0);
        let mut acked = write_many(&client, "before", 10).await;
        assert_eq!(acked.len(), 10, "{}", c.logs());
        c.kill(3);
        acked.extend(write_many(&client, "down", 10).await);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = spawn_writer(c.client(1), stop.clone());
        let config = c.path().join("cluster.toml");
        grow_to_six(&mut c, &config).await;
        for id in [0, 1, 2, 4, 5] {
            let status = c.status(id).await.expect("a member answers");
            assert_eq!(status.get("config_epoch").map(String::as_str), Some("1"), "{status:?}");
        }
        let log = std::fs::read_to_string(c.path().join("replica-0.log")).unwrap();
        assert!(log.contains("connected to the replicas it adds"), "{log}");
        c.spawn(3);
        wait_for_epoch(&c, 3, 1).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let during = finish_writer(&stop, writer, "grow with a replica down", &c.logs()).await;
        acked.extend(during);
        assert_none_lost(&client, &acked, &c.logs()).await;
    });
}
