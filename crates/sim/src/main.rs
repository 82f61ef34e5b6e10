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
    /// unchecked-pages (with --service paged-kv), lying-disk or unordered-events (with
    /// --service zk).
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
    /// KV with its state in pages: checkpoints and state transfers by difference) or `zk`
    /// (upright-zk, driven by ZooKeeper sessions: expiring sessions, ephemerals, watches, multi).
    #[arg(long, default_value = "kv", value_parser = ["kv", "redis", "paged-kv", "zk"])]
    service: String,
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
}

fn main() {
    let args = Args::parse();
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
    // Stage panics are caught and reported as violations with their message; the default hook
    // would also print a backtrace for each.
    std::panic::set_hook(Box::new(|_| {}));
    let mut summary = Summary::default();
    for seed in args.first_seed..args.first_seed + args.seeds {
        let mut opts = SimOptions::new(seed, args.u, args.r);
        opts.workload_us = (args.seconds * 1e6) as u64;
        opts.clients = args.clients;
        opts.sabotage = sabotage;
        opts.mutate = args.mutate;
        opts.service = upright_sim::ServiceKind::parse(&args.service).expect("clap checked the name");
        let report = upright_sim::run(opts.clone());
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
    println!("{}", summary.line(&expected_classes(args.r.max(1))));
    if summary.violations > 0 {
        std::process::exit(1);
    }
}
