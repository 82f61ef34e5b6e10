//! `upright bench`: closed-loop clients against a local cluster of replica processes, beside the
//! NO-REP baseline (the same KV service, client and transport on one unreplicated server process,
//! see [`crate::norep`]) measured right after each point in the same run.
//!
//! For every `(u, r)`, batch size, workload and client count it measures throughput, latency
//! percentiles and CPU time per operation (all server processes, from `/proc/<pid>/stat`), prints
//! the figures with the ratio to NO-REP, and optionally writes JSON and one SVG plot per workload.
//!
//! Read workloads (`0/4`, `0/0get`) are ordered GETs; the `ro` suffix (`0/0ro`, `0/4ro`) sends the
//! same GET on the read-only path (all execution members answer at once; fallback to the ordered
//! path if they do not all match within `read_only_timeout_us`). NO-REP answers the read-only GET
//! from its state directly.

pub mod attack;
mod cpu_limit;
mod launch;
mod load;
mod report;
pub mod state_transfer;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use upright_core::config::{Knobs, OrderProtocol};

pub use launch::{cpu_us, parse_stat_cpu_ticks};
pub use load::{Measurement, Workload};
pub use report::{svg_path, to_json, to_svg};

use crate::client::{start_clients, ClientHandle};
use crate::files::{ClientFile, FileError};
use crate::storage::FsyncPolicy;
use launch::{launch, Processes, Target};

/// Note printed with results and written to the JSON.
pub const READ_ONLY_NOTE: &str =
    "reads A/B (B > 0) and A/Bget are ordered GETs; A/Bro is the same GET on the read-only path (q_r = n_exec, ordered fallback)";

/// What to run.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// The `upright` binary (it is started as `upright replica` and `upright norep`).
    pub exe: PathBuf,
    /// Workloads.
    pub workloads: Vec<Workload>,
    /// Client counts.
    pub clients: Vec<u32>,
    /// `(u, r)` settings.
    pub faults: Vec<(usize, usize)>,
    /// Ordering protocols, each run at every `(u, r)` (LCR at `(u, 0)`: it tolerates crashes
    /// only).
    pub protocols: Vec<OrderProtocol>,
    /// Batch sizes (`batch_size_max`).
    pub batch_sizes: Vec<usize>,
    /// `pipeline_window` of the replicas (`None`: the default knob).
    pub pipeline_window: Option<u64>,
    /// `batch_delay_us` of the replicas (`None`: the default knob).
    pub batch_delay_us: Option<u64>,
    /// `tentative_entries_max` of the replicas (`None`: the default knob; 0: no tentative
    /// execution).
    pub tentative_entries_max: Option<usize>,
    /// `key_refresh_us` of the replicas and clients (0: no key refresh).
    pub key_refresh_us: u64,
    /// Length of each measurement window.
    pub duration: Duration,
    /// Warm-up before each window.
    pub warmup: Duration,
    /// Log sync policy of the replicas.
    pub fsync: FsyncPolicy,
    /// The replicas' `idle_spin_us` (`crate::spin`).
    pub idle_spin_us: u64,
    /// Measure the NO-REP baseline.
    pub baseline: bool,
    /// Selective execution off, on, or both (each cluster setting measured once per entry).
    pub selective: Vec<bool>,
    /// Separate stages with this execution fault bound (`None`: stages share processes).
    pub separate_stages: Option<usize>,
    /// Each process (every replica, the NO-REP server) limited to this share of one core.
    pub cpu_per_process: Option<f64>,
}

/// One measured point.
#[derive(Clone, Debug)]
pub struct Point {
    /// Workload.
    pub workload: Workload,
    /// Concurrent clients.
    pub clients: u32,
    /// Fault model.
    pub u: usize,
    /// Byzantine faults tolerated.
    pub r: usize,
    /// The ordering protocol.
    pub protocol: OrderProtocol,
    /// Selective execution.
    pub selective: bool,
    /// Separate stages (execution members in processes of their own).
    pub separate_stages: bool,
    /// `batch_size_max`.
    pub batch_size: usize,
    /// Log sync policy.
    pub fsync: FsyncPolicy,
    /// upright's figures.
    pub upright: Measurement,
    /// NO-REP's figures.
    pub baseline: Option<Measurement>,
}

fn fsync_name(f: FsyncPolicy) -> &'static str {
    match f {
        FsyncPolicy::Always => "always",
        FsyncPolicy::Never => "never",
    }
}

/// The replicas' knobs for one batch size of a sweep.
fn bench_knobs(options: &BenchOptions, batch_size: usize) -> Knobs {
    let defaults = Knobs::default();
    Knobs {
        batch_size_max: batch_size,
        pipeline_window: options.pipeline_window.unwrap_or(defaults.pipeline_window),
        batch_delay_us: options.batch_delay_us.unwrap_or(defaults.batch_delay_us),
        tentative_entries_max: options.tentative_entries_max.unwrap_or(defaults.tentative_entries_max),
        key_refresh_us: options.key_refresh_us,
        ..defaults
    }
}

struct Running {
    processes: Processes,
    clients: Vec<ClientHandle>,
    _dir: tempfile::TempDir,
}

async fn start(options: &BenchOptions, target: Target) -> Result<Running, FileError> {
    let dir = tempfile::Builder::new()
        .prefix(if target.norep {
            "upright-norep-"
        } else {
            "upright-bench-"
        })
        .tempdir()
        .map_err(|e| FileError(format!("cannot create a temporary directory: {e}")))?;
    let processes = launch(&options.exe, dir.path(), &target)?;
    // All clients of the run share one connection per server (the NO-REP run too, so the
    // baseline pays the same transport).
    let mut setups = Vec::new();
    for c in 0..target.clients {
        setups.push((ClientFile::load(&dir.path().join(format!("client-{c}.toml")))?, None));
    }
    let clients = start_clients(setups)?;
    let probe = load::Workload::parse("0/0").expect("valid");
    let started = Instant::now();
    // The last client probes: client 0 is the one a starving primary (`--attack starve-client`)
    // ignores.
    let prober = clients.last().expect("at least one client");
    if let Err(e) = prober
        .invoke_timeout(probe.operation(usize::MAX >> 1), false, Duration::from_secs(60))
        .await
    {
        return Err(FileError(format!(
            "the {} did not serve a first request ({e}); logs in {}",
            if target.norep { "NO-REP server" } else { "cluster" },
            dir.path().display()
        )));
    }
    println!(
        "{} ready in {:.2?} (logs in {})",
        if target.norep {
            "NO-REP server".to_string()
        } else {
            format!(
                "cluster u={} r={} batch={}",
                target.u, target.r, target.knobs.batch_size_max
            )
        },
        started.elapsed(),
        dir.path().display()
    );
    Ok(Running {
        processes,
        clients,
        _dir: dir,
    })
}

/// Runs every configured point; prints progress and one result line per point.
pub async fn run(options: &BenchOptions) -> Result<Vec<Point>, FileError> {
    let most = *options.clients.iter().max().unwrap_or(&1);
    println!("upright bench: {} cores; {READ_ONLY_NOTE}", cores());
    if let Some(share) = options.cpu_per_process {
        println!("upright bench: every replica and NO-REP process limited to {share} of one core (its own cgroup)");
    }
    let mut norep = None;
    if options.baseline {
        let target = Target {
            u: 0,
            r: 0,
            knobs: Knobs::default(),
            fsync: FsyncPolicy::Never,
            idle_spin_us: options.idle_spin_us,
            clients: most,
            norep: true,
            replica_args: Vec::new(),
            replica_env: Vec::new(),
            attackers: 0,
            protocol: OrderProtocol::Pbft,
            selective_execution: false,
            separate_stages: None,
            cpu_per_process: options.cpu_per_process,
        };
        norep = Some(start(options, target).await?);
    }
    let mut points = Vec::new();
    for (protocol, u, r) in settings(options) {
        for (&batch_size, &selective) in options
            .batch_sizes
            .iter()
            .flat_map(|b| options.selective.iter().map(move |s| (b, s)))
        {
            let target = Target {
                u,
                r,
                protocol,
                knobs: bench_knobs(options, batch_size),
                fsync: options.fsync,
                idle_spin_us: options.idle_spin_us,
                clients: most,
                norep: false,
                replica_args: Vec::new(),
                replica_env: Vec::new(),
                attackers: 0,
                selective_execution: selective,
                separate_stages: options.separate_stages,
                cpu_per_process: options.cpu_per_process,
            };
            let mut cluster = start(options, target).await?;
            for &workload in &options.workloads {
                let point = |clients| Point {
                    workload,
                    clients,
                    u,
                    r,
                    protocol,
                    selective,
                    separate_stages: options.separate_stages.is_some(),
                    batch_size,
                    fsync: options.fsync,
                    upright: Measurement::default(),
                    baseline: None,
                };
                sweep(options, &mut cluster, norep.as_mut(), point, &mut points).await?;
            }
        }
    }
    Ok(points)
}

/// Every `(protocol, u, r)` the run measures, in order: each protocol at each `--ur` (LCR at
/// `r = 0`, Quorum and Aliph at `r = u`, Chain at `r >= 1`, once per `u`).
fn settings(options: &BenchOptions) -> Vec<(OrderProtocol, usize, usize)> {
    let mut out = Vec::new();
    for &protocol in &options.protocols {
        for &(u, r) in &options.faults {
            let r = match protocol {
                OrderProtocol::Lcr => 0,
                OrderProtocol::Quorum | OrderProtocol::Aliph => u,
                OrderProtocol::Chain => r.max(1),
                OrderProtocol::Pbft => r,
            };
            if !out.contains(&(protocol, u, r)) {
                out.push((protocol, u, r));
            }
        }
    }
    out
}

async fn sweep(
    options: &BenchOptions,
    cluster: &mut Running,
    mut norep: Option<&mut Running>,
    point: impl Fn(u32) -> Point,
    points: &mut Vec<Point>,
) -> Result<(), FileError> {
    let first = point(0);
    let workload = first.workload;
    load::prepare(&cluster.clients, workload).await.map_err(FileError)?;
    if let Some(norep) = norep.as_deref_mut() {
        load::prepare(&norep.clients, workload).await.map_err(FileError)?;
    }
    for &n in &options.clients {
        let mut p = point(n);
        let label = format!(
            "upright {} u={} r={} batch={} {} {n:>3} clients",
            report::protocol_label(&p),
            p.u,
            p.r,
            p.batch_size,
            workload.name()
        );
        let pids = cluster.processes.pids();
        let handles = &cluster.clients[..n as usize];
        p.upright = load::measure(&label, handles, workload, &pids, options.warmup, options.duration).await;
        if !cluster.processes.all_running() {
            return Err(FileError(format!(
                "a replica process exited; logs in {}",
                cluster.processes.dir.display()
            )));
        }
        if let Some(norep) = norep.as_deref_mut() {
            let label = format!("NO-REP {} {n:>3} clients", workload.name());
            let pids = norep.processes.pids();
            let handles = &norep.clients[..n as usize];
            p.baseline = Some(load::measure(&label, handles, workload, &pids, options.warmup, options.duration).await);
        }
        println!("{}", report::result_line(&p));
        points.push(p);
    }
    Ok(())
}

/// Online CPUs of this machine.
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The header and one row per point of the summary table.
pub fn table(points: &[Point]) -> String {
    report::table(points)
}

/// `fsync` policy name as written in configs and JSON.
pub fn fsync_policy_name(f: FsyncPolicy) -> &'static str {
    fsync_name(f)
}
