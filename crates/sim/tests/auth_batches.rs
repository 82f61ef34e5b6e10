//! The simulator exercises both single-item and multi-item AUTH-REQs (deferred flush hooks), with
//! no violations.

use upright_sim::SimOptions;

#[test]
fn single_and_multi_item_auth_requests_both_occur() {
    let (mut messages, mut multi, mut forwarded) = (0u64, 0u64, 0u64);
    for seed in 0..6 {
        let mut opts = SimOptions::new(seed, 1, 1);
        opts.clients = 8;
        let report = upright_sim::run(opts);
        assert!(report.violations.is_empty(), "seed {seed}: {:?}", report.violations);
        for (_, counters) in &report.stage_stats {
            messages += counters.get("auth_request_messages").copied().unwrap_or(0);
            multi += counters.get("auth_request_messages_multi").copied().unwrap_or(0);
            forwarded += counters.get("forwarded").copied().unwrap_or(0);
        }
    }
    eprintln!("messages {messages}, multi-item {multi}, requests forwarded {forwarded}");
    assert!(multi > 0, "some AUTH-REQs carry several items");
    assert!(messages > multi, "and some carry one");
}
