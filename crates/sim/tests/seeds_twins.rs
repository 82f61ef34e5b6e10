//! Twins (`--twins`): seeds in which the faulty replica (the view-0 primary half the time) runs as
//! two correct copies sharing its identity and keys, each round of the fault phase putting every
//! other process on one copy's side (or both copies on one side) and, half the time, cutting the
//! sides apart, beside the benign faults. Zero violations. The same as `upright-sim --seeds 200
//! --u 1 --r 1 --twins` (and `--seeds 60 --u 2 --r 1 --twins`).

use upright_sim::sweep::sweep;
use upright_sim::SimOptions;

fn twins(first: u64, n: u64, u: usize, r: usize) {
    let result = sweep(first, n, |seed| {
        let mut opts = SimOptions::new(seed, u, r);
        opts.twins = true;
        opts
    });
    let line = result.summary.line(&[]);
    println!("{line}");
    assert!(result.failures.is_empty(), "{}\n{line}", result.describe_failures(3));
    let counts = result.counts();
    assert_eq!(counts.get("twins"), n, "every seed has a twin: {line}");
    assert!(counts.get("twins_round") >= 5 * n, "too few rounds: {line}");
    assert!(counts.get("twins_partition") >= n, "too few partitioned rounds: {line}");
    assert!(
        counts.get("twins_cut") > 100 * n,
        "the sides kept too little apart: {line}"
    );
    assert!(result.summary.ops_completed > n * 20, "too little work done: {line}");
}

#[test]
fn two_hundred_seeds_with_twins_u1_r1() {
    twins(0, 200, 1, 1);
}

#[test]
fn sixty_seeds_with_twins_u2_r1() {
    twins(0, 60, 2, 1);
}

/// With `r = 0` no replica may be faulty: `--twins` runs none.
#[test]
fn no_twin_where_no_replica_may_be_faulty() {
    let result = sweep(0, 10, |seed| {
        let mut opts = SimOptions::new(seed, 1, 0);
        opts.twins = true;
        opts
    });
    assert!(result.failures.is_empty(), "{}", result.describe_failures(3));
    assert_eq!(result.counts().get("twins"), 0);
    assert_eq!(result.counts().get("twins_cut"), 0);
}
