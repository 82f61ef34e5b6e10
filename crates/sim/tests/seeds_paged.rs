//! Seeds of the real protocol running the KV with its state in pages (`--service paged-kv`):
//! checkpoints by difference and state transfers page by page, with an execution member that
//! serves wrong state among the Byzantine behaviours. Zero violations, every fault class
//! injected, and pages really transferred. The same as
//! `upright-sim --service paged-kv --seeds 200 --u 2 --r 1`.

use upright_sim::sweep::sweep;
use upright_sim::{ServiceKind, SimOptions};

#[test]
fn two_hundred_seeds_u2_r1_paged_kv() {
    let result = sweep(0, 200, |seed| {
        let mut opts = SimOptions::new(seed, 2, 1);
        opts.service = ServiceKind::PagedKv;
        opts
    });
    result.assert_clean(1, 200);
    let summary = &result.summary;
    assert!(summary.tallies.state_transfers > 0, "no state transfer ran");
    assert!(summary.tallies.pages_transferred > 0, "no page was transferred");
    assert!(
        summary.counts.get(upright_sim::byzantine::WRONG_STATE_CLASS) > 0,
        "no wrong state was served: {}",
        summary.line(&[])
    );
}
