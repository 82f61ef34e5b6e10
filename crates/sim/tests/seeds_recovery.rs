//! Seeds of the real protocol with proactive recovery (`upright-sim --recovery`): the correct
//! replicas recover one after another during the fault phase (restart, new key epoch, recovery
//! point estimated from their peers, state checked against a certified checkpoint), half of
//! them after an attacker rewrote their stored checkpoint, among network faults, a Byzantine
//! client and (at `u = 2, r = 1`) a Byzantine replica. Zero violations, every recovery
//! completes, and the rewritten states were repaired (the agreement checker compares every
//! checkpoint). 80 + 30 + 30 seeds for CI's budget; `upright-sim --recovery --seeds N` runs
//! more.

use upright_sim::sweep::sweep;
use upright_sim::SimOptions;

fn recovering(first: u64, seeds: u64, u: usize, r: usize) {
    let result = sweep(first, seeds, |seed| {
        let mut opts = SimOptions::new(seed, u, r);
        opts.recovery = true;
        opts
    });
    let line = result.summary.line(&[]);
    println!("u = {u}, r = {r}: {line}");
    assert!(result.failures.is_empty(), "{}\n{line}", result.describe_failures(3));
    let tallies = &result.summary.tallies;
    assert!(tallies.recoveries >= seeds * 2, "too few recoveries: {line}");
    assert_eq!(tallies.recoveries, tallies.recoveries_completed, "{line}");
    assert!(
        result.summary.counts.get("recovery_damage") >= seeds / 2,
        "too few damaged: {line}"
    );
}

#[test]
fn seeds_with_proactive_recovery_u1_r1() {
    recovering(0, 80, 1, 1);
}

#[test]
fn seeds_with_proactive_recovery_u2_r1_and_u1_r0() {
    recovering(20_000, 30, 2, 1);
    recovering(30_000, 30, 1, 0);
}
