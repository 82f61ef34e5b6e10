//! LCR (`protocol = "lcr"`, crash-only): 300 seeds at `u = 1, r = 0` across every service and
//! 300 at `u = 2, r = 0`, with every fault class a crash-only cluster claims to survive
//! (crashes, power loss, loss, duplication, reordering, delay, partitions, clock skew, faulty
//! clients): zero violations. Its sabotage mode is in `sabotage.rs`.

use upright_core::config::OrderProtocol;
use upright_sim::sweep::sweep;
use upright_sim::{ServiceKind, SimOptions};

const SERVICES: [ServiceKind; 5] = [
    ServiceKind::Kv,
    ServiceKind::Redis,
    ServiceKind::Zk,
    ServiceKind::Fs,
    ServiceKind::PagedKv,
];

fn lcr(seed: u64, u: usize) -> SimOptions {
    let mut opts = SimOptions::new(seed, u, 0);
    opts.protocol = OrderProtocol::Lcr;
    opts.service = SERVICES[(seed % SERVICES.len() as u64) as usize];
    opts
}

#[test]
fn three_hundred_lcr_seeds_u1_r0_every_service() {
    let result = sweep(0, 300, |seed| lcr(seed, 1));
    result.assert_clean(0, 300);
}

#[test]
fn three_hundred_lcr_seeds_u2_r0() {
    let result = sweep(1_000, 300, |seed| lcr(seed, 2));
    result.assert_clean(0, 300);
}
