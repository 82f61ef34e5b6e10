//! Separate stages (`separate_stages = true`; docs/ODRC.md "Separated stages"): the execution
//! members run in processes of their own beside the authentication and order processes, with
//! every fault class the simulator draws (up to `u` faulty processes of any kind, Byzantine
//! execution members among them): zero violations at `u = r = 1` with the execution stage at
//! `u = 2` (4 + 5 processes), with selective execution (ODRC-6), and at `u = 2, r = 1`.

use upright_sim::sweep::{sweep, Sweep};
use upright_sim::SimOptions;

fn separate(seed: u64, u: usize, r: usize, exec_u: usize) -> SimOptions {
    let mut opts = SimOptions::new(seed, u, r);
    opts.separate_stages = Some(exec_u);
    opts
}

/// No violation, execution processes lied in replies and checkpoint tokens, processes crashed,
/// and at least 20 operations per seed. (The order-stage behaviours drawn onto an execution-only
/// process have nothing to lie in there, so not every class shows in every sweep.)
fn clean(result: &Sweep, seeds: u64) {
    result.assert_clean_with("loss", seeds);
    let counts = result.counts();
    assert!(
        counts.get("byz_wrong_reply") > 0,
        "no execution process lied in a reply"
    );
    assert!(
        counts.get("byz_wrong_cp_token") > 0,
        "no checkpoint token was lied about"
    );
    assert!(counts.get("crash") > 0, "no process crashed");
}

#[test]
fn two_hundred_separate_stage_seeds_u1_r1_exec_u2() {
    let result = sweep(40_000, 200, |seed| separate(seed, 1, 1, 2));
    clean(&result, 200);
}

#[test]
fn one_hundred_separate_stage_seeds_with_selective_execution() {
    let result = sweep(41_000, 100, |seed| {
        let mut opts = separate(seed, 1, 1, 2);
        opts.selective_execution = true;
        opts
    });
    clean(&result, 100);
}

/// Key refresh in every process, execution-only ones included (each its own key member): every
/// execution process refreshes, and nothing stalls.
#[test]
fn one_hundred_separate_stage_seeds_with_key_refresh() {
    let result = sweep(45_000, 100, |seed| {
        let mut opts = separate(seed, 1, 1, 2);
        opts.key_refresh = true;
        opts
    });
    result.assert_clean_with("loss", 100);
    // Nine processes and four clients, each refreshing every 200-350 ms of a 3 s run.
    assert!(
        result.summary.tallies.keys_refreshed >= 100 * 13 * 5,
        "{}",
        result.summary.tallies.keys_refreshed
    );
}

/// Proactive recovery of every correct process in turn, execution-only ones included (a new key
/// epoch, the stored state checked against a certified checkpoint, half of them after an
/// attacker rewrote it): every recovery completes.
#[test]
fn one_hundred_separate_stage_seeds_with_proactive_recovery() {
    let result = sweep(46_000, 100, |seed| {
        let mut opts = separate(seed, 1, 1, 2);
        opts.recovery = true;
        opts
    });
    result.assert_clean_with("recovery_damage", 100);
    let counts = result.counts();
    assert_eq!(counts.get("recoveries_completed"), counts.get("recoveries"));
}

/// An order member that hands the execution members fabricated batches, each chained onto the
/// honest history so one copy passes every check: with `q.next_batch()` matching copies
/// required, no execution member takes one (`sabotage.rs`: with one copy taken, every seed is
/// caught).
#[test]
fn an_order_member_fabricating_batches_changes_nothing() {
    let result = sweep(43_000, 30, |seed| {
        let mut opts = separate(seed, 1, 1, 2);
        opts.attack = Some(upright_sim::attack::Attack::Replica(
            upright_sim::faults::Behaviour::FabricatedBatch,
        ));
        opts
    });
    result.assert_clean_with("byz_fabricated_batch", 30);
}

/// Byzantine processes (order or execution) mutating what they send, re-sealed with their own
/// keys (ByzzFuzz style, `--mutate`).
#[test]
fn one_hundred_separate_stage_seeds_under_mutation() {
    let result = sweep(44_000, 100, |seed| {
        let mut opts = separate(seed, 1, 1, 2);
        opts.mutate = true;
        opts
    });
    result.assert_clean_with("byz_mutate", 100);
}

/// A faulty process run as two correct copies sharing its identity and keys, each talking to
/// a different part of the cluster (`--twins`).
#[test]
fn one_hundred_separate_stage_seeds_with_twins() {
    let result = sweep(45_000, 100, |seed| {
        let mut opts = separate(seed, 1, 1, 2);
        opts.twins = true;
        opts
    });
    result.assert_clean_with("twins", 100);
}

#[test]
fn one_hundred_separate_stage_seeds_u2_r1() {
    let result = sweep(42_000, 100, |seed| separate(seed, 2, 1, 2));
    clean(&result, 100);
}
