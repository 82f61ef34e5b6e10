//! 500 seeds of the real protocol with `u = 1, r = 1` running the Redis store users run (`upright
//! replica --service redis`), driven by Redis commands: zero violations, every fault class
//! injected somewhere. The same as `upright-sim --service redis --seeds 500 --u 1 --r 1`.

use upright_sim::sweep::sweep;
use upright_sim::{ServiceKind, SimOptions};

#[test]
fn five_hundred_seeds_u1_r1_redis() {
    let result = sweep(0, 500, |seed| {
        let mut opts = SimOptions::new(seed, 1, 1);
        opts.service = ServiceKind::Redis;
        opts
    });
    result.assert_clean(1, 500);
}
