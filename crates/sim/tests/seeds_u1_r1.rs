//! 500 seeds of the real protocol with `u = 1, r = 1` and every fault class: zero violations,
//! and every class injected somewhere.

use upright_sim::sweep::sweep;
use upright_sim::SimOptions;

#[test]
fn five_hundred_seeds_u1_r1() {
    let result = sweep(0, 500, |seed| SimOptions::new(seed, 1, 1));
    result.assert_clean(1, 500);
}
