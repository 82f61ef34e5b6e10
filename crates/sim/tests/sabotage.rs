//! Every `--sabotage` mode makes the checkers report violations.

use upright_core::config::OrderProtocol;
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
    caught_under(mode, u, r, service, OrderProtocol::Pbft, seeds);
}

/// `caught_in` with the order members running `protocol` (a sabotage mode of a fast phase runs
/// its own protocol unless this is Aliph, which has both).
fn caught_under(mode: SabotageMode, u: usize, r: usize, service: ServiceKind, protocol: OrderProtocol, seeds: u64) {
    let result = sweep(0, seeds, |seed| {
        let mut opts = SimOptions::new(seed, u, r);
        opts.sabotage = Some(mode);
        opts.service = service;
        opts.protocol = protocol;
        opts.workload_us = 1_500_000;
        opts
    });
    assert!(
        result.summary.violations > 0,
        "--sabotage {} (--service {}, --protocol {}) was not caught in {seeds} seeds: {}",
        mode.name(),
        service.name(),
        protocol.name(),
        result.summary.line(&[])
    );
    println!(
        "{} (--service {}, --protocol {}): {} of {seeds} seeds caught; first: {}",
        mode.name(),
        service.name(),
        protocol.name(),
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
    caught_running(SabotageMode::CorruptService, 1, 1, ServiceKind::Fs);
    caught_running(SabotageMode::CorruptService, 1, 1, ServiceKind::Hdfs);
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

/// The twins generator catches broken quorum and commit rules with no hand-written behaviour: a
/// twinned primary's copies propose different batches to the processes of their sides.
#[test]
fn twins_catch_a_short_quorum_and_early_execution() {
    for mode in [SabotageMode::ShortQuorum, SabotageMode::EarlyExecute] {
        let result = sweep(0, SEEDS, |seed| {
            let mut opts = SimOptions::new(seed, 1, 1);
            opts.sabotage = Some(mode);
            opts.twins = true;
            opts
        });
        assert!(
            result.summary.violations > 0,
            "--twins --sabotage {} was not caught: {}",
            mode.name(),
            result.summary.line(&[])
        );
        assert!(result.counts().get("twins") == SEEDS && result.counts().get("byz_equivocation") == 0);
    }
}

/// Twelve seeds of `--u 1 --r 1` from here hold two that `--mutate` catches
/// `count-proposals-twice` in (147 and 156; 17 of seeds 0-199 are caught).
const FIRST_CAUGHT_BY_MUTATION: u64 = 145;

/// The primary counted once per distinct PRE-PREPARE: `--mutate` catches it (a mutating primary
/// now and then sends an altered PRE-PREPARE beside the honest one, and a backup then prepares
/// with one vote short), the same seeds with random behaviours or with twins do not (over 300
/// seeds: 32 with `--mutate`, 0 with random behaviours, 1 with `--twins`).
#[test]
fn counting_the_primarys_proposals_twice_is_caught_by_mutation_only() {
    let run = |mutate: bool, twins: bool| {
        sweep(FIRST_CAUGHT_BY_MUTATION, 12, |seed| {
            let mut opts = SimOptions::new(seed, 1, 1);
            opts.sabotage = Some(SabotageMode::CountProposalsTwice);
            opts.mutate = mutate;
            opts.twins = twins;
            opts
        })
    };
    let mutating = run(true, false);
    assert!(
        mutating.summary.violations > 0,
        "not caught with --mutate: {}",
        mutating.summary.line(&[])
    );
    println!("--mutate: {}", mutating.describe_failures(1));
    for (name, result) in [("random behaviours", run(false, false)), ("twins", run(false, true))] {
        assert_eq!(result.summary.violations, 0, "{name}: {}", result.describe_failures(1));
    }
}

/// Proactive recovery that skips the state check: every replica recovers after an attacker
/// rewrote its stored checkpoint, and its execution member executes on that state; the
/// agreement checker sees the correct members' checkpoints differ.
#[test]
fn skip_recovery_check_is_caught() {
    caught(SabotageMode::SkipRecoveryCheck);
}

/// Key rings that keep the keys they retire: with key refresh on, lossy links and a replica
/// replaying old envelopes, correct processes accept MACs under retired keys, which every key
/// ring counts and the simulator checks is zero.
#[test]
fn keep_retired_keys_is_caught() {
    caught(SabotageMode::KeepRetiredKeys);
}

/// Replica keys that do not bind the configuration epoch: while the administrator grows and
/// shrinks the cluster, a replica accepts a MAC sealed in another configuration, which the
/// old-configuration checker reports.
#[test]
fn shared_configuration_keys_is_caught() {
    caught(SabotageMode::SharedConfigurationKeys);
}

/// LCR deciding what arrives, in arrival order, without waiting for it to be stable: members
/// decide different batches at one sequence number.
#[test]
fn lcr_deliver_unstable_is_caught() {
    caught_with(SabotageMode::LcrDeliverUnstable, 1, 0);
}

/// Tentative execution with clients that accept `r + 1` tentative replies: at `u = 1, r = 0` one
/// member's word that it prepared a batch is taken, and a view change that leaves that member
/// out replaces the batch (the plan cuts the primaries off in turn over lossy links), so a
/// result the client was given never happened. About 2% of seeds catch it (a view change must
/// replace a batch one member executed tentatively), hence 500 seeds: since NEW-VIEW waits count
/// from the view-change quorum (session 40) none of the first 100 does.
#[test]
fn tentative_small_quorum_is_caught() {
    caught_in(SabotageMode::TentativeSmallQuorum, 1, 0, ServiceKind::Kv, 25 * SEEDS);
}

/// Tentative execution without the rollback: a member that executed a batch a view change then
/// replaced goes on from a state no agreed history made, and its checkpoint differs.
#[test]
fn tentative_no_rollback_is_caught() {
    caught_in(SabotageMode::TentativeNoRollback, 1, 0, ServiceKind::Kv, 5 * SEEDS);
}

/// Aliph's Quorum without the abort history: a view change that forgets the batches members
/// executed speculatively replaces what clients committed (the plan crashes members in turn, so
/// Quorum phases abort while clients commit in them).
#[test]
fn quorum_drop_speculative_is_caught() {
    caught_in(SabotageMode::QuorumDropSpeculative, 1, 1, ServiceKind::Kv, 3 * SEEDS);
}

/// Aliph's Chain without the predecessor-set check: a faulty member inside the chain forwards
/// altered batches, its successors accept them on its CHAIN alone and commit them, while the
/// members before it hold the true batch; the view change then picks one of the two.
#[test]
fn chain_skip_check_is_caught() {
    caught_in(SabotageMode::ChainSkipCheck, 1, 1, ServiceKind::Kv, SEEDS);
}

/// Under Aliph both fast phases' sabotage modes are caught too: its Chain views without the
/// predecessor-set check, its Quorum views without the abort history.
#[test]
fn fast_phase_sabotage_is_caught_under_aliph() {
    let aliph = OrderProtocol::Aliph;
    caught_under(SabotageMode::ChainSkipCheck, 1, 1, ServiceKind::Kv, aliph, 2 * SEEDS);
    caught_under(
        SabotageMode::QuorumDropSpeculative,
        1,
        1,
        ServiceKind::Kv,
        aliph,
        3 * SEEDS,
    );
}

/// Separate stages: an execution member that takes its same-index order member's NEXT-BATCH
/// alone (as if they shared a process) executes that member's fabricated batch; the agreement
/// checker sees its history differ. (`seeds_separate.rs` runs the same fabricating member
/// against the correct rule: nothing is caught there.)
#[test]
fn separate_next_batch_is_caught() {
    caught(SabotageMode::SeparateNextBatch);
}

/// Selective execution: a client that takes `r` matching replies takes a Byzantine maintainer's
/// reply alone.
#[test]
fn weak_reply_quorum_is_caught() {
    caught(SabotageMode::WeakReplyQuorum);
}

/// Selective execution: a member that installs an object from one maintainer's OBJECT-CP
/// installs a lying maintainer's state (the agreement checker sees its checkpoint differ).
#[test]
fn single_object_copy_is_caught() {
    caught(SabotageMode::SingleObjectCopy);
}

/// Selective execution: a member that installs an object from OBJECT-CP without the object's
/// push streams numbers the key's next watch events from where it stopped running the key's
/// writes (the pushes checker sees correct members number one push differently, the agreement
/// checker their checkpoints differ).
#[test]
fn stale_streams_are_caught() {
    caught(SabotageMode::StaleStreams);
}

/// Selective execution: a client that delivers a reply without waiting for the pushes before
/// it of the streams its request announced lets a watcher read a key's new value before the
/// watch event of the write that made it (the watch-order checker).
#[test]
fn unheld_replies_are_caught() {
    caught(SabotageMode::UnheldReplies);
}

/// Both selective-execution sabotage modes with the Redis store's keys as the objects.
#[test]
fn selective_sabotage_is_caught_with_the_redis_store() {
    caught_running(SabotageMode::SingleObjectCopy, 1, 1, ServiceKind::Redis);
    caught_running(SabotageMode::WeakReplyQuorum, 1, 1, ServiceKind::Redis);
}

/// The push-stream sabotage modes with ZooKeeper's watches (upright-zk under selective
/// execution: each node's events in its own stream): delivering a reply at once lets a client
/// see a watched node change before its event (the simulated ZooKeeper clients' watch check),
/// and installing a node without its streams makes the members disagree.
#[test]
fn stream_sabotage_is_caught_with_zookeepers_watches() {
    for (mode, symptom) in [
        (SabotageMode::UnheldReplies, "before its watch event"),
        (SabotageMode::StaleStreams, "agreement"),
    ] {
        let result = sweep(0, SEEDS, |seed| {
            let mut opts = SimOptions::new(seed, 1, 1);
            opts.sabotage = Some(mode);
            opts.service = ServiceKind::Zk;
            opts.workload_us = 1_500_000;
            opts
        });
        let failures = result.describe_failures(usize::MAX);
        assert!(
            result.summary.violations > 0 && failures.contains(symptom),
            "--sabotage {} --service zk was not caught in {SEEDS} seeds: {}",
            mode.name(),
            result.summary.line(&[])
        );
        assert!(
            !failures.contains("undecodable"),
            "the run used ZooKeeper's clients: {failures}"
        );
        println!(
            "{} (--service zk): {} of {SEEDS} seeds caught",
            mode.name(),
            result.summary.violations
        );
    }
}
