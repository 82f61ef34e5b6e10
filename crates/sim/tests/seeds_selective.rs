//! Selective execution (ODRC, `selective_execution = true`; docs/ODRC.md): 300 seeds at
//! `u = r = 1` and 300 at `u = 2, r = 1` with every fault class the simulator draws (Byzantine
//! replicas, among them execution members lying in their object checkpoints and replies, and
//! Byzantine clients, crashes, power loss, loss, duplication, reordering, delay, partitions,
//! clock skew), and 100 under message mutation: zero violations; the Redis store at both, 200
//! and 150 seeds; the paged KV (a paged service: checkpoints, state transfer and restarts by
//! pages) at both, 100 each. The KV's watch events come in per-key push streams, which the
//! pushes checker follows (every push delivered once, in order, as correct members numbered
//! it). upright-zk at both, 150 seeds each: each node's watch events in the node's stream,
//! checked by the simulated ZooKeeper clients (a watched node never seen changed before its
//! event). Its sabotage modes (`weak-reply-quorum`, `single-object-copy`, `stale-streams`) are in
//! `sabotage.rs`.

use upright_sim::sweep::sweep;
use upright_sim::{ServiceKind, SimOptions};

fn selective(seed: u64, u: usize, r: usize) -> SimOptions {
    let mut opts = SimOptions::new(seed, u, r);
    opts.selective_execution = true;
    opts
}

/// [`selective`] at `r = 1` with another service than the KV.
fn selective_with(service: ServiceKind, seed: u64, u: usize) -> SimOptions {
    let mut opts = selective(seed, u, 1);
    opts.service = service;
    opts
}

#[test]
fn three_hundred_selective_seeds_u1_r1() {
    let result = sweep(0, 300, |seed| selective(seed, 1, 1));
    result.assert_clean(1, 300);
    let counts = result.counts();
    assert!(counts.get("byz_wrong_state") > 0, "no object checkpoint was lied about");
    // The KV's watch events come in each key's push stream, numbered by whichever members ran
    // the key's writes (docs/ODRC.md, "Per-object push streams"), forged pushes among them.
    let tallies = &result.summary.tallies;
    assert!(
        tallies.stream_pushes_delivered > 100,
        "too few watch events: {tallies:?}"
    );
    // A client that reads a watched key's new value has had the event first (the watch-order
    // checker), tested many times over.
    assert!(
        tallies.watch_order_checks > 100,
        "too few ordered reads after events: {tallies:?}"
    );
}

#[test]
fn three_hundred_selective_seeds_u2_r1() {
    let result = sweep(10_000, 300, |seed| selective(seed, 2, 1));
    result.assert_clean(1, 300);
}

#[test]
fn one_hundred_selective_seeds_under_mutation() {
    let result = sweep(20_000, 100, |seed| {
        let mut opts = selective(seed, 1, 1);
        opts.mutate = true;
        opts
    });
    result.assert_clean_with("byz_mutate", 100);
}

#[test]
fn one_hundred_selective_seeds_crash_only_u1_r0() {
    let result = sweep(30_000, 100, |seed| selective(seed, 1, 0));
    result.assert_clean(0, 100);
}

/// The Redis store users run (`--service redis`: strings, lists, sorted sets, hashes and sets,
/// MULTI/EXEC as global requests) under selective execution, with every fault class: each
/// request's keys' replies and key states depend only on those keys (docs/ODRC.md, "The Redis
/// store").
#[test]
fn two_hundred_selective_redis_seeds_u1_r1_and_one_hundred_fifty_u2_r1() {
    let redis = |seed, u| selective_with(ServiceKind::Redis, seed, u);
    let result = sweep(40_000, 200, |seed| redis(seed, 1));
    result.assert_clean(1, 200);
    assert!(
        result.counts().get("byz_wrong_state") > 0,
        "no key state was lied about"
    );
    sweep(60_000, 150, |seed| redis(seed, 2)).assert_clean(1, 150);
}

/// A paged service under selective execution (`--service paged-kv`: each key in the page its name
/// hashes to, so equal keys make equal pages whichever requests a member ran): checkpoints of
/// the changed pages, state transfer and proactive recovery by pages, restarts from the pages on
/// disk, with every fault class.
#[test]
fn one_hundred_selective_paged_seeds_u1_r1_and_one_hundred_u2_r1() {
    let paged = |seed, u| selective_with(ServiceKind::PagedKv, seed, u);
    let result = sweep(60_000, 100, |seed| paged(seed, 1));
    result.assert_clean(1, 100);
    let tallies = &result.summary.tallies;
    assert!(tallies.pages_transferred > 0, "no member caught up by pages");
    let result = sweep(61_100, 100, |seed| paged(seed, 2));
    result.assert_clean(1, 100);
}

/// upright-zk under selective execution (docs/ODRC.md, "ZooKeeper under selective execution"):
/// zxids from agreed positions, znodes as objects, watch events in each node's push stream
/// (sessions expiring on agreed time fire them from wake-ups), with every fault class.
#[test]
fn one_hundred_fifty_selective_zk_seeds_u1_r1_and_as_many_u2_r1() {
    let zk = |seed, u| selective_with(ServiceKind::Zk, seed, u);
    let result = sweep(70_000, 150, |seed| zk(seed, 1));
    result.assert_clean(1, 150);
    let tallies = &result.summary.tallies;
    assert!(tallies.watch_events > 100, "too few watch events: {tallies:?}");
    assert!(
        tallies.stream_pushes_delivered >= tallies.watch_events,
        "the events came in node streams: {tallies:?}"
    );
    assert!(tallies.sessions_expired > 0, "no session expired: {tallies:?}");
    sweep(72_000, 150, |seed| zk(seed, 2)).assert_clean(1, 150);
}
