//! `upright bench` and `upright norep`: argument parsing; the logic is in `upright_node::bench`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use upright_node::bench::{self, BenchOptions, Workload};
use upright_node::files::{self, Cluster, FileError};
use upright_node::storage::FsyncPolicy;

/// Options of `upright bench`.
#[derive(Args)]
pub struct BenchArgs {
    /// Workloads A/B (A KiB request, B KiB reply, 0 = 8 bytes) or cpuN (an operation that
    /// burns N microseconds of CPU on the client's key), comma-separated; or
    /// `state-transfer` alone: the cost of incremental checkpoints and of bringing a replica
    /// back by state transfer, on a paged test service of `--objects` objects.
    #[arg(long, value_delimiter = ',', default_value = "0/0")]
    workload: Vec<String>,
    /// `state-transfer`: objects in the test service.
    #[arg(long, default_value_t = 1_000_000)]
    objects: u64,
    /// `state-transfer`: bytes per object (the default makes 10^6 objects 1.01 GiB).
    #[arg(long, default_value_t = 1088,
          value_parser = clap::value_parser!(u64).range(1..=upright_core::limits::PAGE_BYTES_MAX as u64))]
    object_bytes: u64,
    /// `state-transfer`: objects written while one replica is down.
    #[arg(long, default_value_t = 10_000)]
    writes: u64,
    /// `state-transfer`: measure the checkpoint cost only (no cluster).
    #[arg(long)]
    checkpoint_only: bool,
    /// Concurrent closed-loop clients, comma-separated (a sweep).
    #[arg(long, value_delimiter = ',', default_value = "16")]
    clients: Vec<u32>,
    /// Length of each measurement window (e.g. 10s, 500ms).
    #[arg(long, default_value = "5s")]
    duration: String,
    /// Warm-up before each window.
    #[arg(long, default_value = "1s")]
    warmup: String,
    /// Fault settings u/r, comma-separated (2u + r + 1 replica processes each).
    #[arg(long, value_delimiter = ',', default_value = "1/1")]
    ur: Vec<String>,
    /// Ordering protocols to measure, comma-separated: `pbft`, `quorum` (Aliph's Quorum with
    /// PBFT as Backup: runs at r = u with each --ur's u), `chain` (Aliph's Chain with PBFT as
    /// Backup: at least r = 1), `aliph` (Quorum and Chain in turn: at r = u), `backup` (another
    /// name of pbft), `lcr` (LCR tolerates crashes only: it runs at r = 0 with each --ur's u).
    /// Each result carries its protocol.
    #[arg(long, value_delimiter = ',', default_value = "pbft", value_parser = ["pbft", "backup", "quorum", "chain", "aliph", "lcr"])]
    protocol: Vec<String>,
    /// Batch sizes (batch_size_max), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "128")]
    batch: Vec<usize>,
    /// Batches in flight at the primary (the pipeline_window knob; default: the knob's default).
    #[arg(long)]
    pipeline: Option<u64>,
    /// How long the primary waits to fill a batch, in microseconds (the batch_delay_us knob;
    /// default: the knob's default).
    #[arg(long)]
    batch_delay_us: Option<u64>,
    /// Tentative execution: batches of at most this many requests are executed once prepared
    /// (the tentative_entries_max knob; 0: off; default: the knob's default, off).
    #[arg(long)]
    tentative: Option<usize>,
    /// Key refresh of the replicas and clients every this many seconds (the key_refresh_us
    /// knob; 0: none).
    #[arg(long, default_value_t = 0)]
    key_refresh_secs: u64,
    /// Log sync policy of the replicas: always (the protocol's rule) or never (benchmark only).
    #[arg(long, default_value = "always")]
    fsync: String,
    /// The replicas' idle spin in microseconds (cluster.toml's idle_spin_us; 0: sleep at once).
    #[arg(long, default_value_t = upright_node::spin::IDLE_SPIN_DEFAULT_US,
          value_parser = clap::value_parser!(u64).range(0..=upright_node::files::IDLE_SPIN_US_MAX))]
    idle_spin_us: u64,
    /// Skip the NO-REP baseline.
    #[arg(long)]
    no_baseline: bool,
    /// Selective execution (ODRC, docs/ODRC.md): `off`, `on`, or `both` (each cluster measured
    /// without, then with, in the same run; results name it `pbft+selective`). Use it with the
    /// CPU-heavy workload `cpuN` (an operation that burns N microseconds of CPU on its key).
    #[arg(long, default_value = "off", value_parser = ["off", "on", "both"])]
    selective_execution: String,
    /// Run the execution members in processes of their own (docs/ODRC.md "Separated stages"):
    /// 2u + r + 1 authentication and order processes, then the execution processes (results
    /// name it `pbft+separate`). PBFT only.
    #[arg(long)]
    separate_stages: bool,
    /// With --separate-stages: the failures the execution stage tolerates (default u), which
    /// sets the execution processes (exec_u + max(exec_u, r) + 1).
    #[arg(long, requires = "separate_stages")]
    exec_u: Option<usize>,
    /// Limit each process (every replica, the NO-REP server) to this share of one core, each in
    /// a cgroup of its own, so that processes sharing this host behave like machines with a fixed
    /// CPU each (e.g. 0.18 for 11 processes on 2 cores). Needs root and the cgroup cpu
    /// controller.
    #[arg(long)]
    cpu_per_process: Option<f64>,
    /// Write the results as JSON here, and one SVG plot per workload next to it (with
    /// `--attack`: one object per attack, and a plot of throughput over time).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Run Aardvark's attacks instead of a sweep: `all` or a comma-separated list of
    /// client-flood, slow-primary, starve-client, flood-peers, silence,
    /// client-inconsistent-auth, or wrong-replies (an execution member answering wrongly: not in
    /// `all`; with --selective-execution on it is ODRC's fault experiment); each beside the
    /// fault-free runs of the same invocation, one
    /// before the attacks and one after, the faster the reference (one workload, client count,
    /// u/r and batch size).
    #[arg(long)]
    attack: Option<String>,
    /// With `--attack`: the defences beyond PBFT's (the primary watch, signed requests and the
    /// blacklist, the cut-off of flooding peers) on or off.
    #[arg(long, default_value = "on")]
    defences: String,
}

fn parse_duration(text: &str) -> Result<Duration, FileError> {
    let t = text.trim();
    let bad = || FileError(format!("duration {text:?}: expected e.g. 10s, 500ms or 2"));
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    if !(0.0..=3600.0).contains(&(v * scale)) {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(v * scale))
}

fn parse_ur(text: &str) -> Result<(usize, usize), FileError> {
    let bad = || FileError(format!("--ur {text:?}: expected u/r, e.g. 1/1"));
    let (u, r) = text.split_once('/').ok_or_else(bad)?;
    let (u, r) = (
        u.trim().parse().map_err(|_| bad())?,
        r.trim().parse().map_err(|_| bad())?,
    );
    if u == 0 || r > u {
        return Err(FileError(format!("--ur {text:?}: need u >= 1 and r <= u")));
    }
    Ok((u, r))
}

fn options(args: &BenchArgs) -> Result<BenchOptions, FileError> {
    let workloads = args
        .workload
        .iter()
        .map(|w| Workload::parse(w).map_err(FileError))
        .collect::<Result<Vec<_>, _>>()?;
    if args.clients.is_empty() || args.clients.iter().any(|c| *c == 0 || *c > 1000) {
        return Err(FileError("--clients: give counts between 1 and 1000".into()));
    }
    if args.batch.contains(&0) {
        return Err(FileError("--batch: batch sizes must be at least 1".into()));
    }
    if args.pipeline == Some(0) {
        return Err(FileError("--pipeline: the pipeline window must be at least 1".into()));
    }
    let fsync = parse_fsync(&args.fsync)?;
    if let Some(share) = args.cpu_per_process {
        if !(share > 0.0 && share <= 64.0) {
            return Err(FileError(format!(
                "--cpu-per-process {share}: give a share of one core above 0 (e.g. 0.2)"
            )));
        }
    }
    let separate_stages = match (args.separate_stages, args.exec_u) {
        (false, _) => None,
        (true, exec_u) => {
            if args.protocol.iter().any(|p| p != "pbft" && p != "backup") || args.attack.is_some() {
                return Err(FileError(
                    "--separate-stages runs with --protocol pbft only, and not with --attack".into(),
                ));
            }
            if args.tentative.is_some_and(|t| t > 0) {
                return Err(FileError(
                    "--separate-stages does not go with --tentative (docs/ODRC.md)".into(),
                ));
            }
            let (u, _) = parse_ur(args.ur.first().map_or("1/1", String::as_str))?;
            Some(exec_u.unwrap_or(u))
        }
    };
    if separate_stages.is_some() && args.ur.len() > 1 && args.exec_u.is_none() {
        return Err(FileError(
            "--separate-stages with several --ur: give --exec-u (the execution fault bound of every cluster)".into(),
        ));
    }
    Ok(BenchOptions {
        exe: std::env::current_exe().map_err(|e| FileError(format!("cannot find own executable: {e}")))?,
        workloads,
        clients: args.clients.clone(),
        faults: args.ur.iter().map(|s| parse_ur(s)).collect::<Result<_, _>>()?,
        protocols: args
            .protocol
            .iter()
            .map(|p| upright_core::config::OrderProtocol::from_name(p).expect("clap checked the name"))
            .collect(),
        batch_sizes: args.batch.clone(),
        pipeline_window: args.pipeline,
        batch_delay_us: args.batch_delay_us,
        tentative_entries_max: args.tentative,
        key_refresh_us: args.key_refresh_secs.saturating_mul(1_000_000),
        duration: parse_duration(&args.duration)?,
        warmup: parse_duration(&args.warmup)?,
        fsync,
        idle_spin_us: args.idle_spin_us,
        baseline: !args.no_baseline,
        selective: match args.selective_execution.as_str() {
            "on" => vec![true],
            "both" => vec![false, true],
            _ => vec![false],
        },
        separate_stages,
        cpu_per_process: args.cpu_per_process,
    })
}

/// Runs `upright bench --workload state-transfer`.
async fn run_state_transfer(args: &BenchArgs) -> Result<ExitCode, FileError> {
    let options = bench::state_transfer::StateTransferOptions {
        exe: std::env::current_exe().map_err(|e| FileError(format!("cannot find own executable: {e}")))?,
        objects: args.objects,
        object_bytes: args.object_bytes as usize,
        writes: args.writes,
        fsync: parse_fsync(&args.fsync)?,
        checkpoint_only: args.checkpoint_only,
    };
    tokio::select! {
        report = bench::state_transfer::run(&options) => { report?; }
        _ = crate::stop_requested() => {
            eprintln!("upright bench: stopped; its cluster processes were killed");
            return Ok(ExitCode::from(130));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_fsync(text: &str) -> Result<FsyncPolicy, FileError> {
    match text {
        "always" => Ok(FsyncPolicy::Always),
        "never" => Ok(FsyncPolicy::Never),
        other => Err(FileError(format!("--fsync {other:?}: expected always or never"))),
    }
}

/// Runs `upright bench`.
pub async fn run(args: BenchArgs) -> Result<ExitCode, FileError> {
    if args.workload.iter().any(|w| w == "state-transfer") {
        if args.workload.len() != 1 {
            return Err(FileError("--workload state-transfer runs alone".into()));
        }
        return run_state_transfer(&args).await;
    }
    let options = options(&args)?;
    if let Some(attacks) = &args.attack {
        return run_attacks(&args, &options, attacks).await;
    }
    if args.defences != "on" {
        return Err(FileError("--defences goes with --attack".into()));
    }
    // Stopped early (Ctrl-C, SIGTERM): the run's future is dropped, and with it the replica and
    // NO-REP child processes (they are killed on drop, so none outlives a stopped bench).
    let points = tokio::select! {
        points = bench::run(&options) => points?,
        _ = crate::stop_requested() => {
            eprintln!("upright bench: stopped; its cluster processes were killed");
            return Ok(ExitCode::from(130));
        }
    };
    println!("\n{}", bench::table(&points));
    if let Some(path) = &args.json {
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        write_file(path, bench::to_json(&points, bench::cores(), &command))?;
        println!("wrote {}", path.display());
        for &w in &options.workloads {
            let svg = bench::svg_path(path, w);
            write_file(&svg, bench::to_svg(&points, w))?;
            println!("wrote {}", svg.display());
        }
    }
    let failed = points.iter().any(|p| p.upright.ops == 0);
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Writes `text` to `path`, creating its directory.
fn write_file(path: &Path, text: String) -> Result<(), FileError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(path, text).map_err(|e| FileError(format!("cannot write {}: {e}", path.display())))
}

/// Runs `upright bench --attack`.
async fn run_attacks(args: &BenchArgs, options: &BenchOptions, attacks: &str) -> Result<ExitCode, FileError> {
    use bench::attack;
    let attacks = attack::Attack::parse_list(attacks).map_err(FileError)?;
    let defences = match args.defences.as_str() {
        "on" => true,
        "off" => false,
        other => return Err(FileError(format!("--defences {other:?}: expected on or off"))),
    };
    if options.protocols != [upright_core::config::OrderProtocol::Pbft] {
        return Err(FileError(
            "--attack measures PBFT's and Aardvark's defences: give no --protocol, or --protocol pbft".into(),
        ));
    }
    if options.workloads.len() > 1
        || options.clients.len() > 1
        || options.faults.len() > 1
        || options.batch_sizes.len() > 1
        || options.selective.len() > 1
    {
        return Err(FileError(
            "--attack measures one point: give one --workload, --clients, --ur and --batch, and --selective-execution on or off".into(),
        ));
    }
    let points = tokio::select! {
        points = attack::run(options, &attacks, defences) => points?,
        _ = crate::stop_requested() => {
            eprintln!("upright bench: stopped; its cluster processes were killed");
            return Ok(ExitCode::from(130));
        }
    };
    println!("\n{}", attack::table(&points));
    if let Some(path) = &args.json {
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        write_file(path, attack::to_json(&points, bench::cores(), &command))?;
        println!("wrote {}", path.display());
        let svg = attack::svg_path(path);
        write_file(&svg, attack::to_svg(&points))?;
        println!("wrote {}", svg.display());
    }
    let failed = points.iter().any(|p| p.fault_free.ops == 0);
    Ok(if failed { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// Runs the NO-REP server of a `u = r = 0` cluster config with `service` until interrupted.
pub async fn norep(config: &Path, service: upright_core::stages::ServiceFactory) -> Result<ExitCode, FileError> {
    let cluster = Cluster::load(config)?;
    let keys = files::load_replica_keys(&cluster, 0, &cluster.key_path(0))?;
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    upright_node::norep::run_norep_server(cluster, keys, service(), shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
