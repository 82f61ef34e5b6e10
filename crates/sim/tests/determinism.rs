//! One seed, one run: the same seed twice gives the same trace hash and report; different seeds
//! give different traces.

use upright_sim::SimOptions;

#[test]
fn same_seed_same_trace_different_seed_different_trace() {
    for (u, r) in [(1, 0), (1, 1), (2, 1)] {
        let a = upright_sim::run(SimOptions::new(11, u, r));
        let b = upright_sim::run(SimOptions::new(11, u, r));
        assert_eq!(a.trace_hash, b.trace_hash, "u={u} r={r}");
        assert_eq!(a, b);
        let c = upright_sim::run(SimOptions::new(12, u, r));
        assert_ne!(a.trace_hash, c.trace_hash, "u={u} r={r}");
    }
}
