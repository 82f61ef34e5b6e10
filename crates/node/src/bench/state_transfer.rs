//! `upright bench --workload state-transfer`: what paged state buys (PBFT thesis 5.3).
//!
//! 1. **Checkpoint cost**, in this process on the same code the execution stage runs: a paged
//!    test service of `objects` generated objects ([`ObjectStore`]), 1,000 of them changed, then
//!    one incremental checkpoint ([`PageCheckpoint::take`]: freeze, hash the changed pages, update
//!    the tree) against serializing and digesting the whole state the way a checkpoint did before
//!    paged state.
//! 2. **State transfer**, on a cluster of replica processes (`u = r = 1`, `--service objects`):
//!    a first round of writes, then one execution member (the victim) is SIGKILLed, `writes`
//!    objects are written while it is down, and it is started again while another (the liar)
//!    answers every state-transfer request wrongly ([`crate::replica::WRONG_STATE_ENV`]). The
//!    restarted member fetches pages only from peers that sent it the checkpoint's manifest, so
//!    the liar must be connected to it at once: of execution members 0 and 2 (1 is recovered
//!    proactively at the end), the one with the lower Ed25519 key is the victim, since it dials
//!    the other, the liar, as soon as it starts (a peer that dials it may wait out its reconnect
//!    back-off). So the liar is asked, and caught, in every run. The restarted replica
//!    recovers its own checkpoint from disk and fetches only what differs; the bytes it received
//!    are compared with the size of the state.

use std::path::Path;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use upright_core::config::Knobs;
use upright_core::exec::checkpoint::whole_blob_digest;
use upright_core::ids::SeqNo;
use upright_core::objects::{write_op, ObjectStore};
use upright_core::pages::{tree_of, PageCheckpoint};
use upright_core::service::Service;

use super::launch::{configure, start, Target};
use crate::client::{start_clients, ClientHandle};
use crate::files::{self, ClientFile, Cluster, FileError};
use crate::metrics::{http_get, parse_key_values, prometheus_label, prometheus_samples};
use crate::storage::FsyncPolicy;

/// Objects changed before the timed checkpoint.
pub const CHANGED_FOR_CHECKPOINT: u64 = 1000;

/// Concurrent writers.
const WRITERS: usize = 8;

/// Longest wait for the cluster to serve, and for the restarted replica to catch up.
const WAIT_MAX: Duration = Duration::from_secs(600);
/// Longest wait for the restarted replica's state transfer (one takes well under a second at the
/// test's size and tens of seconds at the default 1 GiB).
const TRANSFER_WAIT_MAX: Duration = Duration::from_secs(180);

/// What to run.
#[derive(Clone, Debug)]
pub struct StateTransferOptions {
    /// The `upright` binary.
    pub exe: PathBuf,
    /// Objects in the test service.
    pub objects: u64,
    /// Bytes per object.
    pub object_bytes: usize,
    /// Objects written while a replica is down.
    pub writes: u64,
    /// Log sync policy of the replicas.
    pub fsync: FsyncPolicy,
    /// Skip the cluster part (checkpoint cost only).
    pub checkpoint_only: bool,
}

/// What it measured.
#[derive(Clone, Debug, Default)]
pub struct StateTransferReport {
    /// Milliseconds of one incremental checkpoint after [`CHANGED_FOR_CHECKPOINT`] changes.
    pub checkpoint_ms: f64,
    /// Milliseconds of serializing and digesting the whole state.
    pub full_serialization_ms: f64,
    /// Bytes the restarted replica received during state transfer.
    pub transfer_bytes: u64,
    /// Size of the state it transferred to (pages plus the rest of the checkpoint).
    pub state_bytes: u64,
    /// Wrong answers it detected and refused.
    pub wrong_answers: u64,
    /// Pages it fetched.
    pub pages_fetched: u64,
    /// Seconds from its restart to its state transfer's end.
    pub catch_up_seconds: f64,
    /// The proactive recovery of replica 1 under the writers' load afterwards: seconds from the
    /// request to completion, state bytes and pages it fetched to check and repair its state.
    pub recovery_seconds: f64,
    /// See `recovery_seconds`.
    pub recovery_bytes: u64,
    /// See `recovery_seconds`.
    pub recovery_pages: u64,
}

impl StateTransferReport {
    /// The checkpoint line.
    pub fn checkpoint_line(&self) -> String {
        format!(
            "checkpoint after {CHANGED_FOR_CHECKPOINT} changed objects: {:.2} ms (full serialization: {:.2} ms)",
            self.checkpoint_ms, self.full_serialization_ms
        )
    }

    /// The recovery line.
    pub fn recovery_line(&self) -> String {
        format!(
            "proactive recovery of replica 1: {:.2} s, {} bytes fetched ({} pages) of {}",
            self.recovery_seconds, self.recovery_bytes, self.recovery_pages, self.state_bytes
        )
    }

    /// The transfer line.
    pub fn transfer_line(&self) -> String {
        let percent = if self.state_bytes == 0 {
            0.0
        } else {
            100.0 * self.transfer_bytes as f64 / self.state_bytes as f64
        };
        format!(
            "state transfer: {} bytes of {} ({percent:.2}%)",
            self.transfer_bytes, self.state_bytes
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Distinct objects `first .. first + count` of a fixed permutation of `0..objects`.
fn object_at(i: u64, objects: u64) -> u64 {
    // 1_000_003 is prime, so coprime with any count it does not divide.
    let step = if objects.is_multiple_of(1_000_003) {
        7919
    } else {
        1_000_003
    };
    (i.wrapping_mul(step) + 17) % objects
}

/// Part 1: times one incremental checkpoint and the whole-state serialization.
pub fn measure_checkpoint(objects: u64, object_bytes: usize) -> (f64, f64) {
    let started = Instant::now();
    let mut store = ObjectStore::new(objects, object_bytes);
    let mut tree = tree_of(store.pages().expect("paged"));
    eprintln!(
        "state-transfer: generated {objects} objects of {object_bytes} bytes ({} bytes) and their page tree in {:.1} s",
        store.pages().expect("paged").total_bytes(),
        started.elapsed().as_secs_f64()
    );
    let pages = store.pages_mut().expect("paged");
    for i in 0..CHANGED_FOR_CHECKPOINT.min(objects) {
        let index = object_at(i, objects);
        pages.set(index, Bytes::from(vec![(i % 251) as u8; object_bytes]));
    }
    let t = Instant::now();
    let cp = PageCheckpoint::take(&mut tree, pages);
    let checkpoint = t.elapsed();
    assert_eq!(cp.changed.len() as u64, CHANGED_FOR_CHECKPOINT.min(objects));
    let t = Instant::now();
    let blob = store.serialize_whole();
    // Chunks as large as needed to stay within the manifest's bound (states above 4 GiB).
    let chunk_bytes = Knobs::default()
        .state_chunk_bytes
        .max(blob.len().div_ceil(upright_core::limits::STATE_CHUNKS_MAX));
    let digest = whole_blob_digest(SeqNo(1), blob, chunk_bytes);
    let full = t.elapsed();
    std::hint::black_box(digest);
    (ms(checkpoint), ms(full))
}

async fn status(cluster: &Cluster, id: u32) -> Option<std::collections::BTreeMap<String, String>> {
    let entry = cluster.file.replicas.iter().find(|r| r.id == id)?;
    let addr = files::resolve(&entry.metrics_addr).ok()?;
    let token = cluster.metrics_token().ok()?;
    http_get(addr, "/status", token.as_deref())
        .await
        .ok()
        .map(|body| parse_key_values(&body))
}

/// What each replica reports about its progress, recovery and catch-up (for a failed run):
/// its progress lines, its recovery outcomes, and its nonzero counters about checkpoints,
/// LOAD-CP, NEXT-BATCH hand-off and state transfer.
async fn diagnosis(cluster: &Cluster) -> String {
    const PROGRESS: [&str; 6] = [
        "view",
        "committed",
        "executed",
        "stable_checkpoint",
        "exec_checkpoint",
        "state_transfers",
    ];
    const COUNTERS: [&str; 10] = [
        "checkpoint",
        "load_",
        "next_batch",
        "state_",
        "page",
        "recovered",
        "batch_agreed",
        "last_exec",
        "view_change",
        "stable",
    ];
    let token = cluster.metrics_token().ok().flatten();
    let mut o = String::new();
    for entry in &cluster.file.replicas {
        let Some(kv) = status(cluster, entry.id).await else {
            o.push_str(&format!("state-transfer: replica {}: no status\n", entry.id));
            continue;
        };
        let mut fields: Vec<String> = PROGRESS
            .iter()
            .map(|k| format!("{k}={}", kv.get(*k).map_or("-", |v| v.as_str())))
            .collect();
        for (k, v) in &kv {
            let counter = k.starts_with("stat_") && COUNTERS.iter().any(|c| k.contains(c));
            if k.starts_with("recovery_") || (counter && v != "0") {
                fields.push(format!("{k}={v}"));
            }
        }
        // The transport's nonzero counters (drops and closes by reason), from the metrics page.
        if let Ok(metrics) = files::resolve(&entry.metrics_addr) {
            if let Ok(text) = http_get(metrics, "/metrics", token.as_deref()).await {
                let net = prometheus_samples(&text).filter(|(s, v)| s.starts_with("upright_net_counter{") && *v > 0);
                for (series, value) in net {
                    if let Some(name) = prometheus_label(series, "name") {
                        fields.push(format!("{name}={value}"));
                    }
                }
            }
        }
        o.push_str(&format!("state-transfer: replica {}: {}\n", entry.id, fields.join(" ")));
    }
    o
}

fn number(kv: &std::collections::BTreeMap<String, String>, key: &str) -> u64 {
    kv.get(key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Writes objects `first..first + count` (of the permutation) with [`WRITERS`] clients; each write
/// must be acknowledged.
async fn write_objects(
    clients: &[ClientHandle],
    objects: u64,
    object_bytes: usize,
    first: u64,
    count: u64,
    what: &str,
) -> Result<(), FileError> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (w, client) in clients.iter().enumerate().take(WRITERS) {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut i = first + w as u64;
            while i < first + count {
                let index = object_at(i, objects);
                let value = vec![(i % 253) as u8 ^ 0x5a; object_bytes];
                let reply = client
                    .invoke_timeout(write_op(index, &value), false, Duration::from_secs(60))
                    .await
                    .map_err(|e| format!("write of object {index}: {e}"))?;
                if &reply[..] != b"OK" {
                    return Err(format!("write of object {index} answered {reply:?}"));
                }
                i += WRITERS as u64;
            }
            Ok(())
        }));
    }
    for task in tasks {
        task.await.map_err(|e| FileError(e.to_string()))?.map_err(FileError)?;
    }
    let secs = started.elapsed().as_secs_f64();
    if count <= 64 {
        return Ok(());
    }
    eprintln!(
        "state-transfer: {what}: {count} writes in {secs:.1} s ({:.0}/s)",
        count as f64 / secs
    );
    Ok(())
}

/// Runs both parts.
pub async fn run(options: &StateTransferOptions) -> Result<StateTransferReport, FileError> {
    if options.objects == 0 || options.writes > options.objects {
        return Err(FileError("--objects must be at least 1 and at least the writes".into()));
    }
    let (checkpoint_ms, full_serialization_ms) = {
        let (objects, bytes) = (options.objects, options.object_bytes);
        tokio::task::spawn_blocking(move || measure_checkpoint(objects, bytes))
            .await
            .map_err(|e| FileError(e.to_string()))?
    };
    let mut report = StateTransferReport {
        checkpoint_ms,
        full_serialization_ms,
        ..Default::default()
    };
    println!("{}", report.checkpoint_line());
    if options.checkpoint_only {
        return Ok(report);
    }

    let dir = tempfile::Builder::new()
        .prefix("upright-state-transfer-")
        .tempdir()
        .map_err(|e| FileError(format!("cannot create a temporary directory: {e}")))?;
    let outcome = transfer(options, dir.path(), &mut report).await;
    if outcome.is_err() {
        // The error names this directory for its logs: keep it.
        let _ = dir.keep();
    }
    outcome.map(|()| report)
}

/// The victim and the liar (replica ids) of a configured cluster: of execution members 0 and 2,
/// the one with the lower Ed25519 key (which dials the other) and the other (see the module's
/// comment).
fn roles(cluster: &Cluster) -> Result<(u32, u32), FileError> {
    let (a, b) = (cluster.file.replica(0)?, cluster.file.replica(2)?);
    Ok(if a.ed25519 < b.ed25519 { (0, 2) } else { (2, 0) })
}

/// The multi-process part: a cluster in `dir`, a replica killed, brought back by transfer.
async fn transfer(
    options: &StateTransferOptions,
    dir: &Path,
    report: &mut StateTransferReport,
) -> Result<(), FileError> {
    let target = Target {
        u: 1,
        r: 1,
        knobs: Knobs::default(),
        fsync: options.fsync,
        idle_spin_us: 0,
        clients: WRITERS as u32,
        norep: false,
        replica_args: vec![
            "--service".into(),
            "objects".into(),
            "--objects".into(),
            options.objects.to_string(),
            "--object-bytes".into(),
            options.object_bytes.to_string(),
        ],
        replica_env: Vec::new(),
        attackers: 0,
        selective_execution: false,
        protocol: Default::default(),
        separate_stages: None,
        cpu_per_process: None,
    };
    configure(dir, &target)?;
    let cluster = Cluster::load(&dir.join("cluster.toml"))?;
    let (victim, liar) = roles(&cluster)?;
    let target = Target {
        replica_env: vec![(crate::replica::WRONG_STATE_ENV.into(), liar.to_string())],
        ..target
    };
    let mut processes = start(&options.exe, dir, &target)?;
    let mut setups = Vec::new();
    for c in 0..target.clients {
        setups.push((ClientFile::load(&dir.join(format!("client-{c}.toml")))?, None));
    }
    let clients = start_clients(setups)?;
    let logs = dir.display().to_string();
    let fail = |what: String| FileError(format!("{what}; logs in {logs}"));

    // Wait until the cluster (each member generating and hashing its objects) serves.
    let started = Instant::now();
    loop {
        let probe = clients[0]
            .invoke_timeout(
                write_op(0, &vec![1; options.object_bytes]),
                false,
                Duration::from_secs(10),
            )
            .await;
        if probe.is_ok() {
            break;
        }
        if started.elapsed() > WAIT_MAX || !processes.all_running() {
            return Err(fail("the cluster did not serve a first write".into()));
        }
    }
    eprintln!(
        "state-transfer: cluster of {} objects serving after {:.1} s",
        options.objects,
        started.elapsed().as_secs_f64()
    );
    // A first round with every replica up, until the victim has a checkpoint on disk.
    let before = options.writes / 10;
    write_objects(
        &clients,
        options.objects,
        options.object_bytes,
        0,
        before.max(1),
        "all up",
    )
    .await?;
    let waited = Instant::now();
    while status(&cluster, victim)
        .await
        .is_none_or(|kv| number(&kv, "exec_checkpoint") == 0)
    {
        if waited.elapsed() > WAIT_MAX {
            return Err(fail(format!("replica {victim} took no checkpoint")));
        }
        write_objects(
            &clients,
            options.objects,
            options.object_bytes,
            0,
            WRITERS as u64,
            "top-up",
        )
        .await?;
    }

    let stored = number(&status(&cluster, victim).await.unwrap_or_default(), "exec_checkpoint");
    processes.kill(victim as usize)?;
    eprintln!("state-transfer: replica {victim} SIGKILLed (its newest checkpoint: {stored})");
    write_objects(
        &clients,
        options.objects,
        options.object_bytes,
        before.max(1),
        options.writes,
        "victim down",
    )
    .await?;
    // Replica 2 comes back by state transfer only if the cluster's stable checkpoint is past
    // its own newest checkpoint (otherwise it catches up by replay, which this bench does not
    // measure): make sure of it, topping up until the others executed three checkpoint
    // intervals past it.
    let interval = Knobs::default().checkpoint_interval;
    let waited = Instant::now();
    while number(&status(&cluster, liar).await.unwrap_or_default(), "executed") < stored + 3 * interval {
        if waited.elapsed() > WAIT_MAX {
            return Err(fail(format!(
                "the cluster did not move three checkpoints past replica {victim}"
            )));
        }
        write_objects(
            &clients,
            options.objects,
            options.object_bytes,
            before.max(1),
            WRITERS as u64 * 8,
            "top-up while the victim is down",
        )
        .await?;
    }

    processes.restart(&options.exe, &target, victim as usize)?;
    let restarted = Instant::now();
    eprintln!("state-transfer: replica {victim} restarted; replica {liar} answers state requests wrongly");
    let mut last_report = Instant::now();
    let mut diagnosed = false;
    let kv = loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        if !processes.all_running() {
            return Err(fail("a replica process exited".into()));
        }
        if restarted.elapsed() > TRANSFER_WAIT_MAX {
            eprint!("{}", diagnosis(&cluster).await);
            return Err(fail(format!("replica {victim} did not complete a state transfer")));
        }
        let Some(kv) = status(&cluster, victim).await else {
            continue;
        };
        if number(&kv, "stat_exec_state_transfer_completed") > 0 {
            break kv;
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            if !std::mem::replace(&mut diagnosed, true) {
                // The first report says how each replica stands, once (the failure is diagnosed
                // from it if no transfer comes).
                eprint!("{}", diagnosis(&cluster).await);
            }
            last_report = Instant::now();
            eprintln!(
                "state-transfer: waiting for replica {victim}: executed {}, {} bytes fetched",
                number(&kv, "executed"),
                number(&kv, "stat_exec_state_transfer_bytes")
            );
        }
    };
    report.catch_up_seconds = restarted.elapsed().as_secs_f64();
    report.transfer_bytes = number(&kv, "stat_exec_state_transfer_bytes");
    report.state_bytes = number(&kv, "stat_exec_state_transfer_state_bytes");
    report.wrong_answers = number(&kv, "stat_exec_page_answer_wrong") + number(&kv, "stat_exec_state_chunk_bad");
    report.pages_fetched = number(&kv, "stat_exec_state_transfer_pages");

    // It serves again: more writes, and it executes them with the others.
    write_objects(
        &clients,
        options.objects,
        options.object_bytes,
        0,
        200,
        "after the transfer",
    )
    .await?;
    let target_seqno = number(&status(&cluster, liar).await.unwrap_or_default(), "executed");
    let waited = Instant::now();
    while status(&cluster, victim)
        .await
        .is_none_or(|kv| number(&kv, "executed") < target_seqno)
    {
        if waited.elapsed() > WAIT_MAX {
            return Err(fail(format!(
                "replica {victim} did not execute after its state transfer"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its state is the others': the same checkpoint digest at the same sequence number. Writes
    // continue until both reach one checkpoint.
    let waited = Instant::now();
    let mut round = 0;
    loop {
        if waited.elapsed() > WAIT_MAX {
            return Err(fail(format!(
                "replicas {liar} and {victim} reached no common checkpoint"
            )));
        }
        let (a, b) = (
            status(&cluster, liar).await.unwrap_or_default(),
            status(&cluster, victim).await.unwrap_or_default(),
        );
        let seqno = number(&b, "exec_checkpoint");
        if seqno > number(&kv, "exec_checkpoint") && number(&a, "exec_checkpoint") == seqno {
            if a.get("exec_checkpoint_digest") != b.get("exec_checkpoint_digest") {
                return Err(fail(format!(
                    "replica {victim}'s checkpoint {seqno} differs from replica {liar}'s: {:?} against {:?}",
                    b.get("exec_checkpoint_digest"),
                    a.get("exec_checkpoint_digest")
                )));
            }
            eprintln!(
                "state-transfer: replicas {liar} and {victim} agree on checkpoint {seqno} ({})",
                b.get("exec_checkpoint_digest").map_or("-", |d| d.as_str())
            );
            break;
        }
        round += 1;
        write_objects(
            &clients,
            options.objects,
            options.object_bytes,
            round * 64,
            64,
            "checkpoint round",
        )
        .await?;
    }
    eprintln!(
        "state-transfer: replica {victim} caught up in {:.1} s: {} pages fetched, {} wrong answers refused, executing again at {}",
        report.catch_up_seconds, report.pages_fetched, report.wrong_answers, target_seqno
    );
    println!("{}", report.transfer_line());
    recover_replica_1(options, &cluster, &clients, report)
        .await
        .map_err(|e| fail(e.0))?;
    println!("{}", report.recovery_line());
    Ok(())
}

/// Proactive recovery of replica 1 (`POST /recover`, what `upright recover` does) while the
/// writers keep writing: the time from the request to completion and what it fetched.
async fn recover_replica_1(
    options: &StateTransferOptions,
    cluster: &Cluster,
    clients: &[ClientHandle],
    report: &mut StateTransferReport,
) -> Result<(), FileError> {
    let entry = cluster.file.replica(1)?;
    let addr = crate::files::resolve(&entry.metrics_addr)?;
    let token = cluster.metrics_token()?;
    let (code, line, _) = crate::metrics::http_request(addr, "POST", "/recover", token.as_deref())
        .await
        .map_err(|e| FileError(format!("POST /recover to replica 1: {e}")))?;
    if code != 202 {
        return Err(FileError(format!("replica 1 refused the recovery: {line}")));
    }
    eprintln!("state-transfer: proactive recovery of replica 1 requested");
    let asked = Instant::now();
    let mut round = 0;
    loop {
        if asked.elapsed() > TRANSFER_WAIT_MAX {
            return Err(FileError("replica 1 did not complete its proactive recovery".into()));
        }
        round += 1;
        write_objects(
            clients,
            options.objects,
            options.object_bytes,
            round * 32,
            32,
            "during the recovery",
        )
        .await?;
        let Some(kv) = status(cluster, 1).await else { continue };
        if kv.get("proactive_recovery").map(String::as_str) == Some("recovered") {
            report.recovery_seconds = number(&kv, "proactive_recovery_millis") as f64 / 1e3;
            report.recovery_bytes = number(&kv, "proactive_recovery_state_bytes");
            report.recovery_pages = number(&kv, "proactive_recovery_state_pages");
            return Ok(());
        }
    }
}
