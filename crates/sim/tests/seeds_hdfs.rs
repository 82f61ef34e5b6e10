//! Seeds of the real protocol running upright-hdfs's NameNode (`upright replica --service hdfs`),
//! driven by clients that also stand in for the DataNodes: each key is a chain of immutable
//! version files, written under a temporary name through CREATE, ADDBLOCK, the block's report,
//! COMPLETE (a block commits only when its writer's hash is matched by a DataNode's), and RENAMEd
//! to the next version (compare-and-set), with gets on the ordered, read-only and serializable
//! paths. Zero violations, every fault class injected somewhere, renames that lose the race. 150
//! seeds at `u = r = 1` and 150 at `u = 2, r = 1` here; `upright-sim --service hdfs --seeds 500`
//! runs the 500 of the issue.

use upright_sim::sweep::sweep;
use upright_sim::{ServiceKind, SimOptions};

fn hdfs(seed: u64, u: usize, r: usize) -> SimOptions {
    let mut opts = SimOptions::new(seed, u, r);
    opts.service = ServiceKind::Hdfs;
    opts
}

#[test]
fn one_hundred_fifty_seeds_u1_r1_hdfs() {
    let result = sweep(0, 150, |seed| hdfs(seed, 1, 1));
    result.assert_clean(1, 150);
    let tallies = &result.summary.tallies;
    assert!(tallies.version_conflicts > 500, "too few racing renames: {tallies:?}");
    assert!(
        tallies.serializable_reads > 100,
        "too few serializable gets: {tallies:?}"
    );
}

#[test]
fn one_hundred_fifty_seeds_u2_r1_hdfs() {
    sweep(10_000, 150, |seed| hdfs(seed, 2, 1)).assert_clean(1, 150);
}
