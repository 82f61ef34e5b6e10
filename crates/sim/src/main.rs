//! `upright-sim`: runs N seeds of the deterministic simulator and prints one summary line.

use clap::Parser;
use upright_sim::faults::expected_classes;
use upright_sim::{SabotageMode, SimOptions, Summary};

/// Runs simulated clusters with injected faults and checks them.
#[derive(Parser, Debug)]
#[command(name = "upright-sim")]
struct Args {
    /// Number of seeds to run.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Failures tolerated.
    #[arg(long, default_value_t = 1)]
    u: usize,
    /// Byzantine failures tolerated.
    #[arg(long, default_value_t = 1)]
    r: usize,
    /// Run a deliberately broken protocol or service: short-quorum, skip-mac, early-execute,
    /// weak-read-quorum, weak-serializable-quorum, weak-push-quorum, corrupt-service,
    /// unchecked-pages (with --service paged-kv), lying-disk, unordered-events (with
    /// --service zk), count-proposals-twice (with --mutate), skip-recovery-check,
    /// keep-retired-keys, shared-configuration-keys, lcr-deliver-unstable (r = 0),
    /// tentative-small-quorum, tentative-no-rollback, quorum-drop-speculative (u = r; runs
    /// --protocol quorum), chain-skip-check (r >= 1; runs --protocol chain), weak-reply-quorum,
    /// single-object-copy, stale-streams or unheld-replies (r >= 1; run --selective-execution).
    #[arg(long)]
    sabotage: Option<String>,
    /// Virtual seconds of client workload per seed.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Correct clients.
    #[arg(long, default_value_t = 3)]
    clients: u32,
    /// The replicated service: `kv` (the core's in-memory KV), `redis` (the Redis-compatible
    /// store `upright replica --service redis` runs, driven by Redis commands), `paged-kv` (the
    /// KV with its state in pages: checkpoints and state transfers by difference), `zk`
    /// (upright-zk, driven by ZooKeeper sessions: expiring sessions, ephemerals, watches, multi)
    /// `fs` (upright-fs, driven by NFSv3 calls: each key a chain of immutable version files) or
    /// `hdfs` (upright-hdfs's NameNode: each key a chain of version files written through
    /// CREATE, ADDBLOCK, COMPLETE and RENAME, the clients standing in for the DataNodes).
    #[arg(long, default_value = "kv", value_parser = ["kv", "redis", "paged-kv", "zk", "fs", "hdfs"])]
    service: String,
    /// The ordering protocol: `pbft` (the default), `lcr` (crash-only: needs --r 0), `quorum`
    /// (Aliph's Quorum with PBFT as Backup: needs --u equal to --r) or `chain` (Aliph's Chain
    /// with PBFT as Backup: needs --r of at least 1) or `aliph` (Quorum and Chain in turn, as
    /// Aliph switches: needs --u equal to --r).
    #[arg(long, default_value = "pbft", value_parser = ["pbft", "lcr", "quorum", "chain", "aliph"])]
    protocol: String,
    /// Print every violation (otherwise the first of each failing seed).
    #[arg(long)]
    verbose: bool,
    /// With violations, also print every stage's counters at the end of the run.
    #[arg(long)]
    stats: bool,
    /// Byzantine replicas mutate the messages they send (a sequence number or view one off, a
    /// digest bit flipped, a set element dropped or repeated, a payload byte flipped), re-sealed
    /// with their own keys; every seed with r > 0 has 1 to r of them.
    #[arg(long)]
    mutate: bool,
    /// The faulty replica runs as two correct copies sharing its identity and keys (Twins): each
    /// round of the fault phase puts every other process on one copy's side (and, half the time,
    /// cuts the two sides apart); every seed with r > 0 has one.
    #[arg(long, conflicts_with = "mutate")]
    twins: bool,
    /// Key refresh: every replica and client refreshes its receive keys (NEW-KEY) every 200-350
    /// ms of virtual time and retires the previous ones 80 ms later, through every fault.
    #[arg(long)]
    key_refresh: bool,
    /// Proactive recovery: the correct replicas recover one after another during the fault
    /// phase (restart, new key, recovery point from their peers, state checked against a
    /// certified checkpoint), half of them after an attacker rewrote their stored checkpoint.
    #[arg(long, conflicts_with_all = ["mutate", "twins"])]
    recovery: bool,
    /// Reconfiguration: an administrator grows the cluster by two replicas ((u, r) to (u + 1,
    /// r)) and shrinks it back while the workload and the faults run; new replicas join by state
    /// transfer, clients learn the membership from the replicas.
    #[arg(long, conflicts_with_all = ["mutate", "twins"])]
    reconfiguration: bool,
    /// With --reconfiguration: two thirds of the shrinks remove any two replicas, not the two
    /// added ones; the replicas above the new size take the removed ids (renumbered).
    #[arg(long, requires = "reconfiguration")]
    shrink_any: bool,
    /// Selective execution (ODRC, docs/ODRC.md): each object's requests run on the r + 1
    /// execution members that maintain it; the others catch up at each checkpoint from
    /// certified object checkpoints (with --service kv, redis or paged-kv; not with --protocol quorum or
    /// aliph).
    #[arg(long)]
    selective_execution: bool,
    /// Separate stages (docs/ODRC.md "Separated stages"): the execution members run in
    /// processes of their own, beside 2u + r + 1 authentication and order processes (PBFT only;
    /// not with --reconfiguration or tentative execution). Up to u processes of any kind fail.
    #[arg(long)]
    separate_stages: bool,
    /// With --separate-stages: the failures the execution stage is sized for (at least --u;
    /// default --u + 1, so that there are more execution members than order members).
    #[arg(long, requires = "separate_stages")]
    exec_u: Option<usize>,
    /// Prints every named Byzantine behaviour (replicas', then the client's), one per line, and
    /// exits.
    #[arg(long)]
    list_behaviours: bool,
    /// With each seed, print every stage's counters at the end of the run whose name contains
    /// this text (`all` for every counter): what a failing seed's members were doing.
    #[arg(long, value_name = "TEXT")]
    stage_stats: Option<String>,
    /// The throughput-under-attack checker: each seed runs with this one attack (a behaviour of
    /// --list-behaviours, or `all` for each in turn) and nothing else, and again without it; the
    /// attacked run must complete at least 90% of the other's operations.
    #[arg(long)]
    attack: Option<String>,
    /// `off`: the order stage watches the primary with PBFT's timer only (to show what the
    /// defences are worth).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    defences: String,
    /// Runs seeds across every configuration ((u, r) of (1,0), (1,1), (2,1); every --service;
    /// with a random Byzantine behaviour, with --mutate and with --twins where r > 0; with
    /// recoveries, key refresh, reconfiguration; every --protocol where it applies;
    /// --selective-execution and --separate-stages) until MINUTES have passed, on --threads threads;
    /// prints progress, every failing seed's replay command as found, seeds per second and the
    /// totals by lane and by fault class. Uses --first-seed, --seconds, --clients and --sabotage;
    /// ignores --seeds, --u, --r, --service, --mutate and --twins.
    #[arg(long, value_name = "MINUTES")]
    soak: Option<f64>,
    /// Threads for --soak (default: the machine's cores).
    #[arg(long)]
    threads: Option<usize>,
    /// With --soak, also append every failing seed's replay command to this file.
    #[arg(long, value_name = "FILE")]
    failures: Option<std::path::PathBuf>,
}

/// `--soak`: seeds across every configuration until the time is up.
fn run_soak(args: &Args, minutes: f64, sabotage: Option<SabotageMode>) -> ! {
    use std::io::Write;
    use std::time::Duration;
    use upright_sim::soak::{soak, SoakOptions};
    if !(minutes > 0.0 && minutes.is_finite()) {
        eprintln!("--soak needs a positive number of minutes, not {minutes}");
        std::process::exit(2);
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        eprintln!("--threads must be at least 1");
        std::process::exit(2);
    }
    let failures_file = args.failures.as_ref().map(|path| {
        std::sync::Mutex::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .unwrap_or_else(|e| {
                    eprintln!("cannot open --failures {}: {e}", path.display());
                    std::process::exit(2);
                }),
        )
    });
    let options = SoakOptions {
        duration: Duration::from_secs_f64(minutes * 60.0),
        threads,
        first_seed: args.first_seed,
        workload_us: (args.seconds * 1e6) as u64,
        clients: args.clients,
        max_seeds: None,
        sabotage,
    };
    println!(
        "soak: {minutes} min on {threads} threads, from seed {}",
        args.first_seed
    );
    let result = soak(
        &options,
        Duration::from_secs(30),
        |seeds, elapsed| {
            println!(
                "soak: {seeds} seeds in {:.0} s ({:.1} seeds/s)",
                elapsed.as_secs_f64(),
                seeds as f64 / elapsed.as_secs_f64().max(1e-9)
            )
        },
        |failure| {
            println!("seed {} ({}): {}", failure.seed, failure.lane.name(), failure.violation);
            println!("replay: {}", failure.replay);
            if let Some(file) = &failures_file {
                let mut file = file.lock().expect("no panic holding it");
                if let Err(e) = writeln!(file, "{}", failure.replay) {
                    eprintln!("cannot write --failures: {e}");
                }
            }
        },
    );
    for (lane, summary) in &result.lanes {
        println!(
            "lane {}: seeds {}, violations {}, ops {}",
            lane.name(),
            summary.seeds,
            summary.violations,
            summary.ops_completed
        );
    }
    println!("{}", result.total.line(&expected_classes(1)));
    println!(
        "soak: {} seeds in {:.1} s ({:.1} seeds/s, {threads} threads), violations: {}",
        result.total.seeds,
        result.elapsed.as_secs_f64(),
        result.seeds_per_second(),
        result.total.violations
    );
    std::process::exit(if result.total.violations > 0 { 1 } else { 0 })
}

/// `--attack`: each attack over the seeds, one line per attack.
fn run_attacks(args: &Args, defences: bool) -> ! {
    use upright_sim::attack::{run_attack, Attack};
    let attacks = match args.attack.as_deref() {
        Some("all") => Attack::all(),
        Some(name) => match Attack::parse(name) {
            Some(a) => vec![a],
            None => {
                let names: Vec<&str> = Attack::all().iter().map(|a| a.name()).collect();
                eprintln!("unknown --attack {name}; expected all or one of {}", names.join(", "));
                std::process::exit(2);
            }
        },
        None => unreachable!("called with --attack"),
    };
    let mut failed = 0;
    for attack in attacks {
        if !attack.fits(args.r) {
            println!("attack: {}, skipped: needs r >= 1", attack.name());
            continue;
        }
        let (mut ops, mut base, mut lowest, mut violations) = (0u64, 0u64, f64::INFINITY, 0u64);
        for seed in args.first_seed..args.first_seed + args.seeds {
            let outcome = run_attack(seed, args.u, args.r, attack, defences);
            ops += outcome.attacked.ops_completed;
            base += outcome.fault_free_ops;
            lowest = lowest.min(outcome.ratio());
            if !outcome.attacked.violations.is_empty() {
                violations += 1;
                println!("seed {seed}: {}", outcome.attacked.violations[0]);
                let opts = upright_sim::attack::attack_options(seed, args.u, args.r, Some(attack), defences);
                println!("replay: {}", opts.replay_command());
                if args.stats {
                    for (principal, counters) in &outcome.attacked.stage_stats {
                        println!("  {principal:?}: {counters:?}");
                    }
                }
            }
        }
        failed += violations;
        println!(
            "attack: {}, defences: {}, seeds: {}, violations: {violations}, ops: {ops}, fault_free_ops: {base}, throughput: {:.1}% of fault-free (lowest seed {:.1}%)",
            attack.name(),
            if defences { "on" } else { "off" },
            args.seeds,
            ops as f64 * 100.0 / base.max(1) as f64,
            lowest * 100.0
        );
    }
    std::process::exit(if failed > 0 { 1 } else { 0 })
}

fn main() {
    let args = Args::parse();
    if args.list_behaviours {
        for b in upright_sim::faults::Behaviour::ALL
            .iter()
            .chain(std::iter::once(&upright_sim::faults::Behaviour::Mutate))
        {
            println!("{}", b.name());
        }
        for c in upright_sim::faults::ClientBehaviour::ALL {
            println!("{}", c.name());
        }
        return;
    }
    let defences = args.defences == "on";
    let sabotage = match args.sabotage.as_deref().map(|s| (s, SabotageMode::parse(s))) {
        None => None,
        Some((_, Some(mode))) => Some(mode),
        Some((name, None)) => {
            let names: Vec<&str> = SabotageMode::ALL.iter().map(|m| m.name()).collect();
            eprintln!("unknown --sabotage {name}; expected one of {}", names.join(", "));
            std::process::exit(2);
        }
    };
    if args.r > args.u || args.u == 0 {
        eprintln!("need u >= 1 and u >= r");
        std::process::exit(2);
    }
    if args.protocol == "lcr" {
        let unsupported = [
            (args.r > 0, "--r above 0 (LCR tolerates crashes only)"),
            (args.recovery, "--recovery (LCR has no proactive recovery)"),
            (
                args.reconfiguration,
                "--reconfiguration (an LCR cluster's membership is fixed)",
            ),
            (args.mutate || args.twins, "--mutate or --twins (they need r > 0)"),
            (
                args.attack.is_some() || args.soak.is_some(),
                "--attack or --soak (they choose their own protocols)",
            ),
        ];
        if let Some((_, what)) = unsupported.iter().find(|(bad, _)| *bad) {
            eprintln!("--protocol lcr does not go with {what}");
            std::process::exit(2);
        }
    }
    if args.protocol == "quorum" || args.protocol == "aliph" {
        let unsupported = [
            (args.r != args.u, "--r other than --u (Aliph's model is u = r)"),
            (
                args.reconfiguration,
                "--reconfiguration (reconfiguration runs under pbft only)",
            ),
            (
                args.attack.is_some() || args.soak.is_some(),
                "--attack or --soak (they choose their own protocols)",
            ),
        ];
        if let Some((_, what)) = unsupported.iter().find(|(bad, _)| *bad) {
            eprintln!("--protocol {} does not go with {what}", args.protocol);
            std::process::exit(2);
        }
    }
    if args.protocol == "chain" {
        let unsupported = [
            (args.r == 0, "--r 0 (a crash-only cluster runs lcr)"),
            (
                args.reconfiguration,
                "--reconfiguration (reconfiguration runs under pbft only)",
            ),
            (
                args.attack.is_some() || args.soak.is_some(),
                "--attack or --soak (they choose their own protocols)",
            ),
        ];
        if let Some((_, what)) = unsupported.iter().find(|(bad, _)| *bad) {
            eprintln!("--protocol chain does not go with {what}");
            std::process::exit(2);
        }
    }
    if args.selective_execution {
        let unsupported = [
            (
                !matches!(args.service.as_str(), "kv" | "redis" | "paged-kv" | "zk"),
                "--service fs or hdfs (no object checkpoints yet)",
            ),
            (
                args.protocol == "quorum" || args.protocol == "aliph",
                "--protocol quorum or aliph (their Quorum phase executes on every replica)",
            ),
            (args.reconfiguration, "--reconfiguration"),
            (
                args.attack.is_some() || args.soak.is_some(),
                "--attack or --soak (they choose their own configurations)",
            ),
        ];
        if let Some((_, what)) = unsupported.iter().find(|(bad, _)| *bad) {
            eprintln!("--selective-execution does not go with {what}");
            std::process::exit(2);
        }
    }
    if args.separate_stages {
        let unsupported = [
            (args.protocol != "pbft", "--protocol other than pbft"),
            (args.reconfiguration, "--reconfiguration"),
            (
                args.attack.is_some() || args.soak.is_some(),
                "--attack or --soak (they choose their own configurations)",
            ),
            (args.exec_u.is_some_and(|e| e < args.u), "--exec-u below --u"),
        ];
        if let Some((_, what)) = unsupported.iter().find(|(bad, _)| *bad) {
            eprintln!("--separate-stages does not go with {what}");
            std::process::exit(2);
        }
    }
    // Stage panics are caught and reported as violations with their message; the default hook
    // would also print a backtrace for each.
    // `UPRIGHT_SIM_PANICS=1` keeps the default hook (a panic of the simulator itself).
    if std::env::var_os("UPRIGHT_SIM_PANICS").is_none() {
        std::panic::set_hook(Box::new(|_| {}));
    }
    if args.attack.is_some() {
        run_attacks(&args, defences);
    }
    if let Some(minutes) = args.soak {
        run_soak(&args, minutes, sabotage);
    }
    let mut summary = Summary::default();
    for seed in args.first_seed..args.first_seed + args.seeds {
        let mut opts = SimOptions::new(seed, args.u, args.r);
        opts.workload_us = (args.seconds * 1e6) as u64;
        opts.clients = args.clients;
        opts.sabotage = sabotage;
        opts.mutate = args.mutate;
        opts.twins = args.twins;
        opts.key_refresh = args.key_refresh;
        opts.recovery = args.recovery;
        opts.reconfiguration = args.reconfiguration || sabotage == Some(SabotageMode::SharedConfigurationKeys);
        opts.shrink_any = args.shrink_any;
        opts.selective_execution = args.selective_execution;
        opts.separate_stages = args.separate_stages.then(|| args.exec_u.unwrap_or(args.u + 1));
        opts.defences = defences;
        opts.protocol = upright_core::config::OrderProtocol::from_name(&args.protocol).expect("clap checked the name");
        opts.service = upright_sim::ServiceKind::parse(&args.service).expect("clap checked the name");
        let report = upright_sim::run(opts.clone());
        if let Some(filter) = &args.stage_stats {
            for (who, counters) in &report.stage_stats {
                let shown: Vec<String> = counters
                    .iter()
                    .filter(|(name, _)| filter == "all" || name.contains(filter.as_str()))
                    .map(|(name, value)| format!("{name}={value}"))
                    .collect();
                if !shown.is_empty() {
                    println!("seed {seed}: {who:?}: {}", shown.join(" "));
                }
            }
        }
        if args.verbose {
            println!(
                "seed {seed}: {} operations, {} ms virtual, faults {:?}",
                report.ops_completed,
                report.end_us / 1000,
                report.fault_counts
            );
        }
        if !report.violations.is_empty() {
            let shown = if args.verbose { report.violations.len() } else { 1 };
            for v in report.violations.iter().take(shown) {
                println!("seed {seed}: {v}");
            }
            if !args.verbose && report.violations.len() > 1 {
                println!("seed {seed}: ... {} more (--verbose)", report.violations.len() - 1);
            }
            if args.stats {
                for (principal, counters) in &report.stage_stats {
                    println!("  {principal:?}: {counters:?}");
                }
            }
            println!("replay: {}", opts.replay_command());
        }
        summary.add(&report);
    }
    let classes = if args.twins {
        // No hand-written behaviour runs beside the twin.
        let mut classes = upright_sim::faults::BENIGN_CLASSES.to_vec();
        classes.extend(["twins", "twins_round", "twins_partition", "twins_cut"]);
        classes
    } else {
        expected_classes(args.r.max(1))
    };
    println!("{}", summary.line(&classes));
    if summary.violations > 0 {
        std::process::exit(1);
    }
}
