//! Seeds of the real protocol with `u = 1, r = 1` running upright-fs (`upright replica
//! --service fs`, BFS), driven by NFSv3 calls: each key is a chain of immutable version files in
//! the exported root, found by LOOKUPs, read by READ, and extended by CREATE, SETATTR, WRITEs,
//! LINK (compare-and-set on the next version's name) and REMOVE, with gets on the ordered,
//! read-only and serializable paths. Zero violations, every fault class injected somewhere,
//! commits that lose the race for a version and find again. 250 seeds here to keep CI within its
//! budget; `upright-sim --service fs --seeds 500 --u 1 --r 1` runs the 500 of the issue.

use upright_sim::sweep::sweep;
use upright_sim::{ServiceKind, SimOptions};

#[test]
fn two_hundred_fifty_seeds_u1_r1_fs() {
    let result = sweep(0, 250, |seed| {
        let mut opts = SimOptions::new(seed, 1, 1);
        opts.service = ServiceKind::Fs;
        opts
    });
    result.assert_clean(1, 250);
    let tallies = &result.summary.tallies;
    assert!(tallies.version_conflicts > 1_000, "too few racing commits: {tallies:?}");
    assert!(tallies.ops_completed > 20_000, "too few operations: {tallies:?}");
    assert!(
        tallies.serializable_reads > 500,
        "too few serializable gets: {tallies:?}"
    );
}
