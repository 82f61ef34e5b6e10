//! 500 seeds of the real protocol with `u = 1, r = 1` running upright-zk (`upright replica
//! --service zk`), driven by ZooKeeper sessions: sessions expire (clients pause past their
//! timeout, faults delay others) and come back with their ephemeral node made again, data
//! watches fire and are checked to arrive before the data that changed, puts, appends and
//! deletes run as setData, create, check-and-setData multis and deletes. Zero violations, every
//! fault class injected somewhere. The same as `upright-sim --service zk --seeds 500 --u 1 --r 1`.

use upright_sim::sweep::sweep;
use upright_sim::{ServiceKind, SimOptions};

#[test]
fn five_hundred_seeds_u1_r1_zk() {
    let result = sweep(0, 500, |seed| {
        let mut opts = SimOptions::new(seed, 1, 1);
        opts.service = ServiceKind::Zk;
        opts
    });
    result.assert_clean(1, 500);
    let tallies = &result.summary.tallies;
    assert!(tallies.sessions_expired > 100, "too few sessions expired: {tallies:?}");
    assert!(tallies.watch_events > 1_000, "too few watch events: {tallies:?}");
}
