//! Every `--sabotage` mode makes the checkers report violations.

use upright_sim::sweep::sweep;
use upright_sim::{SabotageMode, SimOptions};

/// Seeds tried per mode; each mode must be caught in at least one.
const SEEDS: u64 = 20;

fn caught(mode: SabotageMode) {
    caught_with(mode, 1, 1);
}

fn caught_with(mode: SabotageMode, u: usize, r: usize) {
    let result = sweep(0, SEEDS, |seed| {
        let mut opts = SimOptions::new(seed, u, r);
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

/// Read-only results on `r + 1` replies: with `u = 1, r = 0` that is the first reply, and a
/// lagging execution member (slow inbound link from the other replicas) serves stale reads, which
/// the linearizability checker must see.
#[test]
fn weak_read_quorum_is_caught() {
    caught_with(SabotageMode::WeakReadQuorum, 1, 0);
}
