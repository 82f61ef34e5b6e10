//! ByzzFuzz-style message mutation (`--mutate`): 300 seeds of `u = r = 1` in which every seed
//! has a Byzantine replica (the view-0 primary half the time) sending its messages with small
//! structured changes, re-sealed with its own keys, beside the benign faults. Zero violations,
//! and the mutations reached every kind of field. The same as `upright-sim --seeds 300 --u 1 --r 1
//! --mutate`.

use upright_sim::sweep::sweep;
use upright_sim::SimOptions;

#[test]
fn three_hundred_mutating_seeds_u1_r1() {
    let result = sweep(0, 300, |seed| {
        let mut opts = SimOptions::new(seed, 1, 1);
        opts.mutate = true;
        opts
    });
    let line = result.summary.line(&[]);
    println!("{line}");
    assert!(result.failures.is_empty(), "{}\n{line}", result.describe_failures(3));
    let counts = result.counts();
    assert!(counts.get("byz_mutate") > 10_000, "too few mutations: {line}");
    for kind in [
        "mutate_view",
        "mutate_seqno",
        "mutate_digest",
        "mutate_drop",
        "mutate_repeat",
        "mutate_time",
        "mutate_payload",
        "mutate_request_id",
        "mutate_count",
    ] {
        assert!(counts.get(kind) > 0, "{kind} never happened: {line}");
    }
    assert!(result.summary.ops_completed > 300 * 20, "too little work done: {line}");
}

/// An open finding of `--mutate` (session 22), kept here to reproduce it: with a paged service
/// (the paged KV, upright-zk), one replica mutating and an execution member lagging, the lagging
/// member starts a paged state transfer to the stable checkpoint, but the correct up-to-date
/// members serve FETCH-PAGES only from their newest checkpoint, which has moved past it
/// (`fetch_pages_stale`), and no newer checkpoint becomes stable without the lagging member: it
/// retries forever (`page_fetch_retried`) and the clients stop. 7 of 1,000 paged-kv seeds and 2
/// of 600 zk seeds; none of 1,000 with the unpaged KV. Replay: `upright-sim --seeds 1
/// --first-seed 722 --u 1 --r 1 --service paged-kv --mutate --stats` (or `--first-seed 339
/// --service zk`).
#[test]
#[ignore = "open finding: a paged state transfer targets a checkpoint no correct member serves any more"]
fn a_lagging_member_catches_up_by_pages_while_another_mutates() {
    for (seed, service) in [
        (722, upright_sim::ServiceKind::PagedKv),
        (339, upright_sim::ServiceKind::Zk),
    ] {
        let mut opts = SimOptions::new(seed, 1, 1);
        opts.service = service;
        opts.mutate = true;
        let report = upright_sim::run(opts);
        assert!(report.violations.is_empty(), "seed {seed}: {:?}", report.violations);
    }
}
