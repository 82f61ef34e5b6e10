//! Seeds of the real protocol with reconfiguration (`upright-sim --reconfiguration`): an
//! administrator grows the cluster by two replicas (`(u, r)` to `(u + 1, r)`) and shrinks it back
//! while the workload runs, among the usual faults (crashes, power loss, partitions, lossy links,
//! a Byzantine replica and client), and with proactive recoveries too. Zero violations: the
//! replicas agree on every batch and state across the changes, every correct replica ends in the
//! last configuration (the removed ones stopped), no replica accepts a MAC sealed in another
//! configuration, and the clients learn each membership from the replicas. 60 + 40 + 30 seeds
//! for CI's budget, and 60 + 30 where the shrink removes any two replicas (`--shrink-any`,
//! renumbering the ones above the new size); `upright-sim --reconfiguration --seeds N` runs more.

use upright_sim::sweep::sweep;
use upright_sim::SimOptions;

fn reconfiguring(first: u64, seeds: u64, u: usize, r: usize, recovery: bool) {
    let result = sweep(first, seeds, |seed| {
        let mut opts = SimOptions::new(seed, u, r);
        opts.reconfiguration = true;
        opts.recovery = recovery;
        opts
    });
    let line = result.summary.line(&[]);
    println!("u = {u}, r = {r}, recovery {recovery}: {line}");
    assert!(result.failures.is_empty(), "{}\n{line}", result.describe_failures(3));
    let counts = &result.summary.counts;
    // Two changes per seed; each carried replica switches twice, each added one is removed.
    let carried = (2 * u + r + 1) as u64;
    assert!(
        counts.get("reconfiguration_switch") >= seeds * carried,
        "too few switches: {line}"
    );
    assert_eq!(counts.get("reconfiguration_removed"), seeds * 2, "{line}");
    if recovery {
        let tallies = &result.summary.tallies;
        assert_eq!(tallies.recoveries, tallies.recoveries_completed, "{line}");
    }
}

#[test]
fn seeds_with_reconfiguration_u1_r1() {
    reconfiguring(0, 60, 1, 1, false);
}

#[test]
fn seeds_with_reconfiguration_and_recovery_u1_r1() {
    reconfiguring(10_000, 40, 1, 1, true);
}

#[test]
fn seeds_with_reconfiguration_u1_r0() {
    reconfiguring(20_000, 30, 1, 0, false);
}

/// `--shrink-any`: the shrink removes any two replicas; the ones above the new size take their
/// ids. Renumbered replicas switch like the others, a client counts a renumbered replica's copy
/// of the change as the vote of the replica with its keys, and a removed replica keeps serving
/// the boundary's state until the next configuration started.
fn shrinking_any(first: u64, seeds: u64, u: usize, r: usize) {
    let result = sweep(first, seeds, |seed| {
        let mut opts = SimOptions::new(seed, u, r);
        opts.reconfiguration = true;
        opts.shrink_any = true;
        opts
    });
    let line = result.summary.line(&[]);
    println!("u = {u}, r = {r}, shrink any: {line}");
    assert!(result.failures.is_empty(), "{}\n{line}", result.describe_failures(3));
    let counts = &result.summary.counts;
    assert!(
        counts.get("reconfiguration_renumbered") >= seeds / 2,
        "too few renumbered replicas: {line}"
    );
    assert!(counts.get("reconfiguration_removed") <= seeds * 2, "{line}");
}

#[test]
fn seeds_with_reconfiguration_shrinking_any_u1_r1() {
    shrinking_any(30_000, 60, 1, 1);
}

#[test]
fn seeds_with_reconfiguration_shrinking_any_u1_r0() {
    shrinking_any(40_000, 30, 1, 0);
}

/// `--shrink-any --recovery` seeds 10, 40, 325 and 434 (u = r = 1) began a proactive recovery
/// while another replica's ran: the simulator counted a recovering replica that a later change
/// removes as done (in 325 three execution members recovered at once and none completed). A
/// recovery now waits for the previous one to complete or its replica to stop.
#[test]
fn a_recovery_waits_for_one_that_a_later_change_ends() {
    for seed in [10, 40, 325, 434] {
        let result = sweep(seed, 1, |seed| {
            let mut opts = SimOptions::new(seed, 1, 1);
            opts.reconfiguration = true;
            opts.shrink_any = true;
            opts.recovery = true;
            opts
        });
        let line = result.summary.line(&[]);
        assert!(
            result.failures.is_empty(),
            "seed {seed}: {}\n{line}",
            result.describe_failures(3)
        );
        let tallies = &result.summary.tallies;
        assert!(tallies.recoveries >= 2, "seed {seed}: {line}");
        assert_eq!(tallies.recoveries, tallies.recoveries_completed, "seed {seed}: {line}");
    }
}

/// Seed 152 at u = 1, r = 0 with recoveries and changes: an order member noted batch 85
/// committed, then crashed for a proactive recovery before its prepare was durable, and the next
/// view ordered another batch at 85 (nothing had executed it). The host now holds a note of
/// progress back until the sync that makes it true, like the sends that depend on it.
#[test]
fn a_commit_is_noted_once_it_is_durable() {
    let result = sweep(152, 1, |seed| {
        let mut opts = SimOptions::new(seed, 1, 0);
        opts.reconfiguration = true;
        opts.recovery = true;
        opts
    });
    let line = result.summary.line(&[]);
    assert!(result.failures.is_empty(), "{}\n{line}", result.describe_failures(3));
    assert!(result.summary.tallies.recoveries >= 2, "{line}");
}
