//! Every `--sabotage` mode makes the checkers report violations.

use upright_sim::sweep::sweep;
use upright_sim::{SabotageMode, ServiceKind, SimOptions};

/// Seeds tried per mode; each mode must be caught in at least one.
const SEEDS: u64 = 20;

fn caught(mode: SabotageMode) {
    caught_with(mode, 1, 1);
}

fn caught_with(mode: SabotageMode, u: usize, r: usize) {
    caught_running(mode, u, r, ServiceKind::Kv);
}

fn caught_running(mode: SabotageMode, u: usize, r: usize, service: ServiceKind) {
    caught_in(mode, u, r, service, SEEDS);
}

fn caught_in(mode: SabotageMode, u: usize, r: usize, service: ServiceKind, seeds: u64) {
    let result = sweep(0, seeds, |seed| {
        let mut opts = SimOptions::new(seed, u, r);
        opts.sabotage = Some(mode);
        opts.service = service;
        opts.workload_us = 1_500_000;
        opts
    });
    assert!(
        result.summary.violations > 0,
        "--sabotage {} (--service {}) was not caught in {seeds} seeds: {}",
        mode.name(),
        service.name(),
        result.summary.line(&[])
    );
    println!(
        "{} (--service {}): {} of {seeds} seeds caught; first: {}",
        mode.name(),
        service.name(),
        result.summary.violations,
        result.describe_failures(1)
    );
}

#[test]
fn short_quorum_is_caught() {
    caught(SabotageMode::ShortQuorum);
}

#[test]
fn skip_mac_is_caught() {
    caught(SabotageMode::SkipMac);
}

#[test]
fn early_execute_is_caught() {
    caught(SabotageMode::EarlyExecute);
}

/// Read-only results on `r + 1` replies: with `u = 1, r = 0` that is the first reply, and a
/// lagging execution member (slow inbound link from the other replicas) serves stale reads, which
/// the linearizability checker must see.
#[test]
fn weak_read_quorum_is_caught() {
    caught_with(SabotageMode::WeakReadQuorum, 1, 0);
}

/// A service bug every replica shares: agreement holds and every quorum matches, so only the model
/// of the service's commands (linearizability, durability) can catch it.
#[test]
fn a_corrupt_service_is_caught_for_each_service() {
    caught_running(SabotageMode::CorruptService, 1, 1, ServiceKind::Kv);
    caught_running(SabotageMode::CorruptService, 1, 1, ServiceKind::Redis);
    caught_running(SabotageMode::CorruptService, 1, 1, ServiceKind::Zk);
}

/// The protocol's sabotage modes are caught with the Redis store as the service too.
#[test]
fn protocol_sabotage_is_caught_running_the_redis_store() {
    caught_running(SabotageMode::ShortQuorum, 1, 1, ServiceKind::Redis);
    caught_running(SabotageMode::EarlyExecute, 1, 1, ServiceKind::Redis);
    caught_running(SabotageMode::WeakReadQuorum, 1, 0, ServiceKind::Redis);
}

/// Pushes accepted on one copy: the replica that sends wrong replies forges pushes, and the push
/// checker must see a forged one delivered.
#[test]
fn weak_push_quorum_is_caught() {
    caught(SabotageMode::WeakPushQuorum);
}

/// Serializable reads accepted on one answer: the replica that sends wrong replies gets a value
/// nobody wrote accepted, and the serializable checker sees it.
#[test]
fn weak_serializable_quorum_is_caught() {
    caught(SabotageMode::WeakSerializableQuorum);
}

/// Pages installed unchecked during state transfer: an execution member serving wrong state plants
/// pages nobody wrote at a member that falls behind, and its next checkpoint disagrees with the
/// correct members' (the agreement checker) or its answers break linearizability.
#[test]
fn unchecked_pages_are_caught_running_the_paged_kv() {
    // Only pages the wrong-state member is asked for expose it, and correct members serve every
    // kept checkpoint since session 23, so it is asked less: twice the seeds.
    caught_in(SabotageMode::UncheckedPages, 2, 1, ServiceKind::PagedKv, 2 * SEEDS);
}

#[test]
fn a_disk_that_lies_about_syncs_is_caught() {
    caught(SabotageMode::LyingDisk);
}

/// ZooKeeper clients that take replies and watch events as they arrive, not in the service's
/// order: the watch checker sees a client read a watched node's new data before its event.
#[test]
fn unordered_watch_events_are_caught_running_upright_zk() {
    caught_running(SabotageMode::UnorderedEvents, 1, 1, ServiceKind::Zk);
}
