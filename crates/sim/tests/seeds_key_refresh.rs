//! Seeds of the real protocol with key refresh (`upright-sim --key-refresh`): every replica and
//! client starts new receive keys every 200-350 ms of virtual time and refuses the previous ones
//! 80 ms later, through every fault class (a crash loses a replica's session keys), at `u = r =
//! 1` and, with mutating Byzantine replicas, at `u = 2, r = 1`. Zero violations, and refreshes
//! happened throughout. 80 + 30 seeds here for CI's budget; `upright-sim --key-refresh --seeds N` runs more.

use upright_sim::sweep::sweep;
use upright_sim::SimOptions;

#[test]
fn seeds_with_key_refresh() {
    let result = sweep(0, 80, |seed| {
        let mut opts = SimOptions::new(seed, 1, 1);
        opts.key_refresh = true;
        opts
    });
    result.assert_clean(1, 80);
    let tallies = &result.summary.tallies;
    assert!(tallies.keys_refreshed > 80 * 40, "too few refreshes: {tallies:?}");
    assert!(tallies.ops_completed > 3_000, "too few operations: {tallies:?}");
    let result = sweep(10_000, 30, |seed| {
        let mut opts = SimOptions::new(seed, 2, 1);
        opts.key_refresh = true;
        opts.mutate = true;
        opts
    });
    let line = result.summary.line(&[]);
    println!("{line}");
    assert!(result.failures.is_empty(), "{}\n{line}", result.describe_failures(3));
    assert!(result.summary.tallies.keys_refreshed > 30 * 40, "{line}");
}
