//! The backups leave the primary out of the prepare phase while they all keep up, ask it in when
//! a slot stalls (a backup crashed, cut off, slow or silent), and leave it out again once the
//! stall passes; the simulator's faults drive every one of these paths, with no violations.

use upright_sim::SimOptions;

#[test]
fn the_primary_is_left_out_asked_in_and_left_out_again() {
    let (mut quiet, mut helped, mut again, mut prepared) = (0u64, 0u64, 0u64, 0u64);
    for seed in 0..12 {
        let report = upright_sim::run(SimOptions::new(seed, 1, 1));
        assert!(report.violations.is_empty(), "seed {seed}: {:?}", report.violations);
        for (_, counters) in &report.stage_stats {
            let get = |name: &str| counters.get(name).copied().unwrap_or(0);
            quiet += get("prepare_quiet");
            helped += get("prepare_primary_helped");
            again += get("prepare_quiet_again");
            prepared += get("prepared");
        }
    }
    eprintln!("quiet PREPAREs {quiet}, sent to the primary after a stall {helped}, left out again {again}, prepared {prepared}");
    assert!(quiet > 0, "backups left the primary out");
    assert!(helped > 0, "stalls brought the primary in");
    assert!(again > 0, "and it was left out again after them");
}
