//! Every `--sabotage` mode makes the checkers report violations.

use upright_sim::sweep::sweep;
use upright_sim::{SabotageMode, SimOptions};

/// Seeds tried per mode; each mode must be caught in at least one.
const SEEDS: u64 = 20;

fn caught(mode: SabotageMode) {
    let result = sweep(0, SEEDS, |seed| {
        let mut opts = SimOptions::new(seed, 1, 1);
        opts.sabotage = Some(mode);
        opts.workload_us = 1_500_000;
        opts
    });
    assert!(
        result.summary.violations > 0,
        "--sabotage {} was not caught in {SEEDS} seeds: {}",
        mode.name(),
        result.summary.line(&[])
    );
    println!(
        "{}: {} of {SEEDS} seeds caught; first: {}",
        mode.name(),
        result.summary.violations,
        result.describe_failures(1)
    );
}

#[test]
fn short_quorum_is_caught() {
    caught(SabotageMode::ShortQuorum);
}

#[test]
fn skip_mac_is_caught() {
    caught(SabotageMode::SkipMac);
}

#[test]
fn early_execute_is_caught() {
    caught(SabotageMode::EarlyExecute);
}
