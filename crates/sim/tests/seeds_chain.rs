//! Aliph's Chain over PBFT (`protocol = "chain"`, `r >= 1`): 300 seeds at `u = r = 1` across
//! every service, with every fault class the simulator draws (Byzantine replicas and clients,
//! crashes, power loss, loss, duplication, reordering, delay, partitions, clock skew), 100 each
//! under Twins and message mutation, and 100 at `u = 2, r = 1`: zero violations. Its sabotage
//! mode is in `sabotage.rs`.

use upright_core::config::OrderProtocol;
use upright_sim::sweep::sweep;
use upright_sim::{ServiceKind, SimOptions};

fn chain(seed: u64, u: usize) -> SimOptions {
    let mut opts = SimOptions::new(seed, u, 1);
    opts.protocol = OrderProtocol::Chain;
    opts.service = ServiceKind::ALL[(seed % ServiceKind::ALL.len() as u64) as usize];
    opts
}

#[test]
fn three_hundred_chain_seeds_u1_r1_every_service() {
    let result = sweep(0, 300, |seed| chain(seed, 1));
    result.assert_clean(1, 300);
}

#[test]
fn one_hundred_chain_seeds_u2_r1() {
    let result = sweep(5_000, 100, |seed| chain(seed, 2));
    result.assert_clean_with("crash", 20);
}

#[test]
fn one_hundred_chain_seeds_under_twins() {
    let result = sweep(2_000, 100, |seed| {
        let mut opts = chain(seed, 1);
        opts.twins = true;
        opts
    });
    result.assert_clean_with("twins", 100);
}

#[test]
fn one_hundred_chain_seeds_under_mutation() {
    let result = sweep(3_000, 100, |seed| {
        let mut opts = chain(seed, 1);
        opts.mutate = true;
        opts
    });
    result.assert_clean_with("byz_mutate", 100);
}
