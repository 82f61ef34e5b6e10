//! Aliph's Quorum over PBFT (`protocol = "quorum"`, `u = r`): 300 seeds at `u = r = 1` across
//! every service, with every fault class the simulator draws (Byzantine replicas and clients,
//! crashes, power loss, loss, duplication, reordering, delay, partitions, clock skew), and 100
//! each under Twins and message mutation: zero violations. Its sabotage mode is in
//! `sabotage.rs`.

use upright_core::config::OrderProtocol;
use upright_sim::sweep::sweep;
use upright_sim::{ServiceKind, SimOptions};

fn quorum(seed: u64) -> SimOptions {
    let mut opts = SimOptions::new(seed, 1, 1);
    opts.protocol = OrderProtocol::Quorum;
    opts.service = ServiceKind::ALL[(seed % ServiceKind::ALL.len() as u64) as usize];
    opts
}

#[test]
fn three_hundred_quorum_seeds_u1_r1_every_service() {
    let result = sweep(0, 300, quorum);
    result.assert_clean(0, 300);
}

#[test]
fn one_hundred_quorum_seeds_under_twins() {
    let result = sweep(2_000, 100, |seed| {
        let mut opts = quorum(seed);
        opts.twins = true;
        opts
    });
    result.assert_clean_with("twins", 100);
}

#[test]
fn one_hundred_quorum_seeds_under_mutation() {
    let result = sweep(3_000, 100, |seed| {
        let mut opts = quorum(seed);
        opts.mutate = true;
        opts
    });
    result.assert_clean_with("byz_mutate", 100);
}
