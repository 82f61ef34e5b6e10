//! The throughput-under-attack checker (issue 24): a slow primary (holding each PRE-PREPARE for
//! three quarters of the view-change timeout, so that PBFT's timer never fires) and a primary
//! that starves one client are replaced when backups watch the primary (`knobs.watch_primary`),
//! keeping at least 90% of the fault-free throughput over the seeds and every client served;
//! with the watch off the checker catches both. The same as `upright-sim --attack slow-primary
//! --seeds 4 --u 1 --r 1 [--defences off]`.

use upright_sim::attack::{run_attack, Attack, ATTACK_THROUGHPUT_MIN};
use upright_sim::faults::Behaviour;

/// Attacked and fault-free operations summed over seeds 0..4, and the attacked runs' violations.
fn over_seeds(attack: Attack, defences: bool) -> (u64, u64, Vec<String>) {
    let (mut ops, mut base, mut violations) = (0, 0, Vec::new());
    for seed in 0..4 {
        let outcome = run_attack(seed, 1, 1, attack, defences);
        ops += outcome.attacked.ops_completed;
        base += outcome.fault_free_ops;
        violations.extend(outcome.attacked.violations.iter().map(|v| format!("seed {seed}: {v}")));
    }
    (ops, base, violations)
}

fn not_throughput(violations: &[String]) -> Vec<&String> {
    violations
        .iter()
        .filter(|v| !v.contains("throughput under attack"))
        .collect()
}

/// With the defences, `attack` passes every checker but the per-seed throughput one and keeps
/// [`ATTACK_THROUGHPUT_MIN`] of the fault-free operations over the seeds.
fn keeps_throughput_with_the_defences(attack: Attack) {
    let (ops, base, violations) = over_seeds(attack, true);
    assert!(not_throughput(&violations).is_empty(), "{violations:?}");
    assert!(
        ops as f64 >= base as f64 * ATTACK_THROUGHPUT_MIN,
        "{ops} of {base} operations under attack: {violations:?}"
    );
}

#[test]
fn a_slow_primary_is_replaced_with_the_watch_and_stays_without_it() {
    let attack = Attack::Replica(Behaviour::SlowPrimary);
    keeps_throughput_with_the_defences(attack);
    let (ops_off, base_off, violations_off) = over_seeds(attack, false);
    assert!(not_throughput(&violations_off).is_empty(), "{violations_off:?}");
    assert!(
        (ops_off as f64) < base_off as f64 * 0.5,
        "without the watch the slow primary should cost most of the throughput: {ops_off} of {base_off}"
    );
    for seed in 0..4 {
        assert!(
            violations_off
                .iter()
                .any(|v| v.starts_with(&format!("seed {seed}: throughput"))),
            "the checker flags every seed without the watch: {violations_off:?}"
        );
    }
}

#[test]
fn a_starving_primary_is_replaced_with_the_watch_and_starves_its_victim_without_it() {
    let attack = Attack::Replica(Behaviour::StarveClient);
    let (ops, base, violations) = over_seeds(attack, true);
    assert!(not_throughput(&violations).is_empty(), "{violations:?}");
    assert!(
        violations.iter().all(|v| !v.contains("client 0 completed")),
        "the victim was served: {violations:?}"
    );
    assert!(ops as f64 >= base as f64 * ATTACK_THROUGHPUT_MIN, "{ops} of {base}");
    let (_, _, violations_off) = over_seeds(attack, false);
    for seed in 0..4 {
        assert!(
            violations_off.iter().any(|v| v.starts_with(&format!(
                "seed {seed}: throughput under attack starve-client: client 0 completed"
            ))),
            "without the watch the victim starves in every seed: {violations_off:?}"
        );
    }
}

/// A replica whose every message arrives 50-300 ms late keeps the others at 90% of the fault-free
/// throughput: execution members fetch request bodies from their co-located authentication member
/// or from two at once, never from the slow one alone (57% of fault-free before, session 26).
#[test]
fn a_slow_replica_costs_less_than_a_tenth_of_the_throughput() {
    keeps_throughput_with_the_defences(Attack::Replica(Behaviour::Slowness));
}
