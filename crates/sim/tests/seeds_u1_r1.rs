//! 500 seeds of the real protocol with `u = 1, r = 1` and every fault class: zero violations,
//! and every class injected somewhere.

use upright_sim::sweep::sweep;
use upright_sim::SimOptions;

#[test]
fn five_hundred_seeds_u1_r1() {
    let result = sweep(0, 500, |seed| SimOptions::new(seed, 1, 1));
    let line = result.summary.line(&upright_sim::faults::expected_classes(1));
    println!("{line}");
    assert!(result.failures.is_empty(), "{}\n{line}", result.describe_failures(3));
    let missing = result.missing_classes(1);
    assert!(missing.is_empty(), "fault classes never injected: {missing:?}\n{line}");
    assert!(result.summary.ops_completed > 500 * 20, "too little work done: {line}");
}
