//! `upright-sim --soak`: seeds dealt to every lane (configuration, service, mutation), totals
//! per lane, and every failing seed reported with the command that replays it.

use std::time::Duration;

use upright_sim::soak::{soak, Lane, SoakOptions};
use upright_sim::SabotageMode;

fn options(max_seeds: u64, sabotage: Option<SabotageMode>) -> SoakOptions {
    SoakOptions {
        duration: Duration::from_secs(600),
        threads: 2,
        first_seed: 0,
        workload_us: 500_000,
        clients: 3,
        max_seeds: Some(max_seeds),
        sabotage,
    }
}

#[test]
fn a_soak_deals_seeds_to_every_lane_and_finds_nothing_in_a_correct_protocol() {
    let lanes = Lane::all();
    assert_eq!(
        lanes.len(),
        263,
        "3 configurations x 6 services, mutation and twins where r > 0, recovery, key refresh, reconfiguration, \
         LCR with and without key refresh where r = 0, Chain plain, with twins and with mutation where r > 0, \
         Quorum and Aliph plain, with twins and with mutation where u = r; selective execution with kv, redis, paged-kv and zk \
         (plain, mutation and twins where r > 0, recovery, key refresh); separate stages with every service, \
         the kv also with mutation and twins where r > 0, recovery, key refresh and selective execution"
    );
    let result = soak(
        &options(lanes.len() as u64, None),
        Duration::from_secs(3600),
        |_, _| {},
        |_| {},
    );
    assert_eq!(result.total.seeds, lanes.len() as u64);
    for (lane, summary) in &result.lanes {
        assert_eq!(summary.seeds, 1, "{}", lane.name());
        assert!(summary.ops_completed > 0, "{} completed operations", lane.name());
    }
    assert_eq!(result.total.violations, 0, "{:?}", result.failures);
    assert!(result.failures.is_empty());
}

#[test]
fn a_soak_reports_every_failing_seed_with_its_replay_command() {
    let lanes = Lane::all().len() as u64;
    let found = std::sync::Mutex::new(Vec::new());
    let result = soak(
        &options(lanes, Some(SabotageMode::ShortQuorum)),
        Duration::from_secs(3600),
        |_, _| {},
        |failure| found.lock().unwrap().push(failure.replay.clone()),
    );
    assert!(result.total.violations > 0, "a short quorum is caught");
    assert_eq!(result.failures.len() as u64, result.total.violations);
    let found = found.into_inner().unwrap();
    assert_eq!(found.len(), result.failures.len(), "each reported as found");
    for failure in &result.failures {
        assert!(failure.replay.contains("--sabotage short-quorum"), "{}", failure.replay);
        assert!(
            failure.replay.contains(&format!(
                "--first-seed {} --u {} --r {}",
                failure.seed, failure.lane.u, failure.lane.r
            )),
            "{}",
            failure.replay
        );
        assert_eq!(failure.replay.contains("--mutate"), failure.lane.mutate);
    }
}
