//! Tests of the order stage on an in-test cluster ([`cluster`]).

mod auth_requests;
mod cluster;

use crate::message::PbftMessage;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use self::cluster::{cut_off, small_knobs, Cluster, CLIENTS};
use super::BATCH_INLINE_BYTES_MAX;
use crate::config::Knobs;
use crate::crypto::{Digest, MatrixSignature};
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, View};
use crate::message::{
    history_digest, AuthItem, Batch, Envelope, Message, RequestBody, RequestEntry, Seal, SealFor, SignedEntry,
};
use crate::stage::{Action, Event, Input, Stage};

#[test]
fn normal_case_commits_for_each_configuration() {
    for (u, r) in [(1, 0), (1, 1), (2, 1)] {
        let mut c = Cluster::new(u, r, small_knobs());
        for round in 1..=3u64 {
            for client in 0..CLIENTS {
                c.submit(client);
            }
            c.pump();
            let ordered = c.ordered_requests();
            for client in 0..CLIENTS {
                assert!(
                    ordered.contains(&(ClientId(client), RequestId(round))),
                    "u={u} r={r} round {round}"
                );
            }
        }
        let last = c.member(0).last_committed();
        assert!(last >= SeqNo(3), "u={u} r={r}");
        for i in c.up() {
            assert_eq!(c.member(i).last_committed(), last, "u={u} r={r} member {i}");
            assert_eq!(c.member(i).view(), View(0));
        }
        assert!(c.member(0).is_primary() && !c.member(1).is_primary());
        // Every execution member got what it needs for every batch (its co-located order
        // member's NEXT-BATCH, or r + 1 of them), and every NEXT-BATCH carried the same history.
        for (seqno, by_exec) in &c.next_batches {
            for e in 0..c.q.n_exec {
                assert!(
                    c.exec_agreed(*seqno, ReplicaId(e as u32)),
                    "u={u} r={r} seqno {seqno:?} exec {e}"
                );
            }
            let histories: BTreeSet<_> = by_exec.values().flat_map(|s| s.values()).collect();
            assert_eq!(histories.len(), 1, "u={u} r={r} seqno {seqno:?}");
        }
        assert_eq!(c.committed.len() as u64, last.0);
        // Every COMMIT arrived: after a tick, no NEXT-BATCH went to another process's execution
        // member, and some were held back and then found not needed.
        c.run(c.config.knobs.view_change_timeout_us / 4);
        let remote: u64 = c.up().iter().map(|i| c.stat(*i, "next_batch_remote")).sum();
        let not_needed: u64 = c.up().iter().map(|i| c.stat(*i, "next_batch_not_needed")).sum();
        assert_eq!(remote, 0, "u={u} r={r}");
        // With five backups (u = 2) a commit needs four of their COMMITs, so the fifth is often
        // still missing then; with fewer every backup's COMMIT is in before anyone commits.
        if u == 2 {
            assert!(not_needed > 0, "u={u} r={r}");
        }
        // The primary took no part in the prepare phase: every backup's PREPARE left it out, so it
        // never became prepared (nor synced a certificate or sent a COMMIT), and nobody needed it.
        assert_eq!(c.stat(0, "prepared"), 0, "u={u} r={r}");
        for i in 1..c.q.n_order {
            assert_eq!(c.stat(i, "prepared"), last.0, "u={u} r={r} member {i}");
            assert_eq!(c.stat(i, "prepare_quiet"), last.0, "u={u} r={r} member {i}");
            assert_eq!(c.stat(i, "prepare_primary_helped"), 0, "u={u} r={r} member {i}");
        }
        // Each member told its co-located auth member every request it committed.
        for i in c.up() {
            let expected: BTreeMap<_, _> = (0..CLIENTS).map(|k| (ClientId(k), RequestId(3))).collect();
            assert_eq!(c.reported[i], expected, "u={u} r={r} member {i}");
            assert_eq!(c.last_ordered(i), expected, "u={u} r={r} member {i}");
        }
    }
}

#[test]
fn an_execution_member_whose_order_member_is_cut_off_gets_next_batch_from_the_others() {
    let mut c = Cluster::new(1, 1, small_knobs());
    // Order(2) neither sends nor receives: it commits nothing, so Exec(2) depends on the others.
    c.filter = cut_off(2);
    for client in 0..CLIENTS {
        c.submit(client);
    }
    c.pump();
    // Without Order(2)'s COMMIT the backups' PREPAREs, sent to the backups only, commit nothing;
    // after the hold they go to the primary too, and its COMMIT completes the quorum.
    assert_eq!(c.member(0).last_committed(), SeqNo(0));
    c.run(primary_help_hold(&c));
    let last = c.member(0).last_committed();
    assert!(last >= SeqNo(1));
    assert_eq!(c.member(2).last_committed(), SeqNo(0));
    // The others hold their NEXT-BATCHes for Exec(2) back (no time passed in this exchange)...
    let got = |c: &Cluster, n: u64| {
        c.next_batches
            .get(&SeqNo(n))
            .is_some_and(|m| m.contains_key(&ReplicaId(2)))
    };
    for n in 1..=last.0 {
        assert!(!got(&c, n), "seqno {n}: held back");
    }
    // ... and their next tick sends them, Order(2)'s COMMIT still missing.
    c.run(c.config.knobs.view_change_timeout_us / 4);
    for n in 1..=last.0 {
        for e in 0..c.q.n_exec {
            assert!(c.exec_agreed(SeqNo(n), ReplicaId(e as u32)), "seqno {n} exec {e}");
        }
        // Exec(2) got it from every member that committed, none of which saw Order(2)'s COMMIT.
        let senders: Vec<_> = c.next_batches[&SeqNo(n)][&ReplicaId(2)].keys().copied().collect();
        assert_eq!(senders, vec![ReplicaId(0), ReplicaId(1), ReplicaId(3)]);
    }
    assert!(c.stat(0, "next_batch_remote") >= last.0);
    // A slot a stable checkpoint discards: its held-back NEXT-BATCH goes when the checkpoint
    // becomes stable (afterwards Exec(2) would need the whole checkpoint).
    c.submit(0);
    c.pump();
    let cp = c.member(0).last_committed();
    assert_eq!(cp, SeqNo(c.config.knobs.checkpoint_interval));
    assert_eq!(c.member(0).low_watermark(), cp, "stable");
    assert!(got(&c, cp.0), "sent before the slot was discarded");
    // Under load: a held-back NEXT-BATCH goes at the first commit at least the hold time later.
    let hold = c.config.knobs.view_change_timeout_us / crate::order::NEXT_BATCH_HOLD_FRACTION;
    c.submit(1);
    c.pump();
    let held = c.member(0).last_committed();
    assert_eq!(held, cp.next());
    c.run(hold / 2);
    c.submit(2);
    c.pump();
    assert_eq!(c.member(0).last_committed(), held.next());
    assert!(!got(&c, held.0), "committed again within the hold time: still held");
    c.run(hold);
    c.submit(0);
    c.pump();
    assert_eq!(c.member(0).last_committed(), held.next().next());
    assert!(got(&c, held.0), "sent at the first commit after the hold time");
    assert!(!got(&c, held.0 + 2), "the newest one is held");
}

/// The primary's part in the prepare phase: left out while every backup keeps up, asked in
/// after the hold when a backup is down (once per view-change timeout, not once per batch), and
/// left out again once the backups complete slots without it.
#[test]
fn backups_include_the_primary_only_while_a_backup_is_missing() {
    let mut c = Cluster::new(1, 1, small_knobs());
    let hold = primary_help_hold(&c);
    let span = c.config.knobs.view_change_timeout_us;
    // Member 3 down: the first batch waits for the hold, then commits with the primary's COMMIT.
    c.filter = cut_off(3);
    c.submit(0);
    c.pump();
    assert_eq!(c.min_committed_of(&[0, 1, 2]), SeqNo(0));
    c.run(hold);
    assert_eq!(c.min_committed_of(&[0, 1, 2]), SeqNo(1));
    assert_eq!(c.stat(1, "prepare_primary_helped"), 1);
    assert_eq!(c.stat(0, "prepared"), 1, "the primary prepared once asked");
    // Within the span the next batches include the primary at once: no waiting.
    for n in 2..=4u64 {
        c.submit((n % CLIENTS as u64) as u32);
        c.pump();
        assert_eq!(
            c.min_committed_of(&[0, 1, 2]),
            SeqNo(n),
            "batch {n} committed without a hold"
        );
    }
    assert_eq!(c.stat(1, "prepare_quiet"), 1);
    assert_eq!(c.stat(0, "prepared"), 4);
    // After the span the backups try without the primary again, and wait once more.
    c.run(span);
    c.submit(0);
    c.pump();
    assert_eq!(c.min_committed_of(&[0, 1, 2]), SeqNo(4));
    c.run(hold);
    assert_eq!(c.min_committed_of(&[0, 1, 2]), SeqNo(5));
    assert_eq!(c.stat(1, "prepare_primary_helped"), 2);
    // Member 3 back (it catches up by the tick's retransmissions and its state transfer): after
    // QUIET_AGAIN_AFTER slots with every backup's COMMIT the backups leave the primary out again,
    // well before the span ends.
    c.filter = Box::new(|_, _, _| true);
    c.run(span / 2);
    let prepared_before = c.stat(0, "prepared");
    commit_until_quiet_again(&mut c, 4 * crate::order::QUIET_AGAIN_AFTER);
    let quiet_before = c.stat(1, "prepare_quiet");
    for k in 0..3u64 {
        c.submit((k % CLIENTS as u64) as u32);
        c.pump();
    }
    assert_eq!(c.stat(1, "prepare_quiet"), quiet_before + 3, "left out again");
    let prepared_after = c.stat(0, "prepared");
    c.run(span / 4);
    assert_eq!(
        c.stat(0, "prepared"),
        prepared_after,
        "no PREPARE reached the primary since"
    );
    assert!(prepared_after > prepared_before);
    assert_eq!(c.stat(1, "prepare_primary_helped"), 2, "no stall with every backup up");
    // A stall soon after that (member 3 flapping, or withholding its COMMIT on purpose): the
    // primary is asked in again, and leaving it out takes twice the streak this time.
    c.filter = cut_off(3);
    c.submit(1);
    c.run(hold);
    assert_eq!(c.stat(1, "prepare_primary_helped"), 3);
    c.filter = Box::new(|_, _, _| true);
    c.run(span / 4);
    let slots = commit_until_quiet_again(&mut c, 8 * crate::order::QUIET_AGAIN_AFTER);
    assert!(
        slots >= 2 * crate::order::QUIET_AGAIN_AFTER,
        "doubled streak: {slots} slots"
    );
    let last = c.member(0).last_committed();
    for i in 0..c.q.n_order {
        assert_eq!(c.member(i).last_committed(), last, "member {i}");
    }
}

#[test]
fn history_chains_batch_digests() {
    let mut c = Cluster::new(1, 1, small_knobs());
    c.submit(0);
    c.pump();
    let slot = &c.member(1).log[&SeqNo(1)];
    let digest = slot.record.accepted.as_ref().unwrap().digest;
    assert_eq!(c.committed[&SeqNo(1)], history_digest(&Digest::default(), &digest));
}

#[test]
fn pipeline_window_bounds_batches_in_flight() {
    let knobs = Knobs {
        batch_size_max: 1,
        pipeline_window: 2,
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    c.filter = Box::new(|_, _, m| !matches!(m, Message::Pbft(PbftMessage::Commit { .. })));
    for client in 0..CLIENTS {
        c.submit(client);
    }
    c.pump();
    let primary = c.member(0);
    assert_eq!(
        primary.next_accept(),
        SeqNo(3),
        "two batches in flight, the third waits"
    );
    assert_eq!(c.min_committed(), SeqNo(0));
    c.filter = Box::new(|_, _, _| true);
    c.run(c.config.knobs.view_change_timeout_us / 2);
    assert_eq!(c.min_committed(), SeqNo(3));
}

#[test]
fn interlock_stops_at_the_window_until_tokens_make_a_checkpoint_stable() {
    let knobs = Knobs {
        batch_size_max: 1,
        checkpoint_interval: 2,
        log_window: 4,
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    c.auto_tokens = false;
    for _ in 0..3 {
        for client in 0..CLIENTS {
            c.submit(client);
        }
    }
    c.pump();
    assert_eq!(
        c.min_committed(),
        SeqNo(4),
        "no batch beyond h + L = 4 without a stable checkpoint"
    );
    assert_eq!(c.member(0).low_watermark(), SeqNo(0));
    c.send_tokens(SeqNo(2));
    c.pump();
    assert_eq!(c.member(0).low_watermark(), SeqNo(2));
    assert_eq!(c.min_committed(), SeqNo(6));
    c.auto_tokens = true;
    c.send_tokens(SeqNo(4));
    c.send_tokens(SeqNo(6));
    c.pump();
    assert_eq!(c.min_committed(), SeqNo(9));
    assert_eq!(c.ordered_requests().len(), 9);
}

#[test]
fn checkpoints_become_stable_and_garbage_collect() {
    let knobs = Knobs {
        batch_size_max: 1,
        checkpoint_interval: 2,
        log_window: 4,
        ..small_knobs()
    };
    let mut c = Cluster::new(2, 1, knobs);
    for _ in 0..3 {
        for client in 0..CLIENTS {
            c.submit(client);
        }
    }
    c.pump();
    assert_eq!(c.min_committed(), SeqNo(9));
    for i in c.up() {
        let m = c.member(i);
        assert_eq!(m.low_watermark(), SeqNo(8), "member {i}");
        assert!(m.log.keys().all(|n| *n > SeqNo(8)));
        assert!(
            m.checkpoints.votes.keys().all(|n| *n > SeqNo(8)) && m.checkpoints.tokens.seqnos().all(|n| n > SeqNo(8))
        );
        assert!(c.storage[i].keys().filter(|k| k.starts_with("order/slot/")).count() <= 1);
        assert!(c.storage[i].keys().filter(|k| k.starts_with("order/mark/")).count() <= 1);
        assert!(c.storage[i].contains_key("order/stable"));
        let stable = m.stable.as_ref().unwrap();
        assert!(super::checkpoint::verify_stable(&c.config, &c.q, &c.rings[i], stable));
        assert_eq!(stable.checkpoint.last_ordered.len(), CLIENTS as usize);
    }
    let stable_events = c
        .events
        .iter()
        .filter(|(_, e)| matches!(e, Event::CheckpointStable { .. }))
        .count();
    assert_eq!(stable_events, 4 * c.q.n_order);
}

/// Drops all COMMITs so a batch prepares everywhere but commits nowhere, silences the primary, and
/// checks that the new view re-proposes and commits the prepared batch.
#[test]
fn view_change_after_primary_silence_carries_prepared_batch() {
    let mut c = Cluster::new(1, 1, small_knobs());
    c.filter = Box::new(|_, _, m| !matches!(m, Message::Pbft(PbftMessage::Commit { .. })));
    c.submit(1);
    c.pump();
    let prepared = c.member(1).log[&SeqNo(1)]
        .record
        .prepared
        .clone()
        .expect("prepared at backup");
    assert_eq!(c.min_committed(), SeqNo(0));
    c.crash(0);
    // Commits of view 0 stay lost (retransmissions too).
    c.filter = Box::new(|from, to, m| {
        from != Principal::Order(ReplicaId(0))
            && to != Principal::Order(ReplicaId(0))
            && !matches!(m, Message::Pbft(PbftMessage::Commit { view: View(0), .. }))
    });
    c.run(5 * c.config.knobs.view_change_timeout_us);
    for i in c.up() {
        assert_eq!(c.member(i).view(), View(1), "member {i}");
        assert!(!c.member(i).is_changing_view());
        assert_eq!(c.member(i).last_committed(), SeqNo(1), "member {i}");
    }
    assert!(c.member(1).is_primary());
    assert_eq!(
        c.committed[&SeqNo(1)],
        history_digest(&Digest::default(), &prepared.digest)
    );
    assert!(c
        .events
        .iter()
        .any(|(i, e)| *i == 1 && *e == Event::ViewInstalled { view: View(1) }));
    // Member 1 told its co-located authentication member the view at start, when it left view
    // 0 and when it installed view 1 (retransmitted VIEW-CHANGEs may repeat the middle one).
    let hints: Vec<(View, bool)> = c
        .hints
        .iter()
        .filter(|(i, to, _, _)| {
            assert_eq!(
                *to,
                Principal::Auth(ReplicaId(*i as u32)),
                "only to the co-located member"
            );
            *i == 1
        })
        .map(|(_, _, v, installed)| (*v, *installed))
        .collect();
    assert_eq!(hints.first(), Some(&(View(0), true)));
    assert!(hints.contains(&(View(1), false)));
    assert_eq!(hints.last(), Some(&(View(1), true)));
    // The new primary orders new requests. Member 0 is down, so the backups' PREPAREs reach the
    // new primary only after the hold, and its COMMIT completes the quorum.
    c.submit(2);
    c.run(1);
    assert_eq!(c.min_committed(), SeqNo(1));
    c.run(primary_help_hold(&c));
    assert_eq!(c.min_committed(), SeqNo(2));
}

/// u = r = 1 with member 3 silent. Member 1's COMMITs of view 0 never reach members 0 (the
/// primary) and 2, so only member 1 commits batch 1. Member 2 times out and changes views alone:
/// one VIEW-CHANGE does not pull the others (`q.view_change_join()` = 2), member 1 has nothing
/// pending, and the primary waits for COMMITs member 2 no longer sends in view 0. The primary's
/// own view-change timer breaks the deadlock (simulator seed 173 with a held-back NEXT-BATCH
/// reached this state); without it nothing moves, ever.
#[test]
fn a_primary_whose_batch_does_not_commit_starts_the_view_change_itself() {
    let mut c = Cluster::new(1, 1, small_knobs());
    let silent = Principal::Order(ReplicaId(3));
    c.filter = Box::new(move |from, to, m| {
        let lost_commit = from == Principal::Order(ReplicaId(1))
            && to != Principal::Order(ReplicaId(1))
            && matches!(m, Message::Pbft(PbftMessage::Commit { view: View(0), .. }));
        from != silent && !lost_commit
    });
    c.submit(1);
    // With member 3 silent the backups' PREPAREs reach the primary after the hold; then member 1
    // has the primary's and member 2's COMMITs, and the others lack member 1's.
    c.run(primary_help_hold(&c));
    assert_eq!(c.member(1).last_committed(), SeqNo(1));
    assert_eq!(c.member(0).last_committed(), SeqNo(0));
    assert_eq!(c.member(2).last_committed(), SeqNo(0));
    let timeout = c.config.knobs.view_change_timeout_us;
    c.run(10 * timeout);
    for i in 0..3 {
        assert_eq!(c.member(i).last_committed(), SeqNo(1), "member {i}");
        assert_eq!(c.member(i).view(), View(1), "member {i}");
        assert!(!c.member(i).is_changing_view(), "member {i}");
    }
    assert_eq!(c.stat(2, "view_change_timeout"), 1, "member 2 gave up on view 0");
    assert_eq!(c.stat(0, "view_change_timeout_primary"), 1, "and so did the primary");
    // The new view orders new requests.
    c.submit(2);
    c.run(timeout);
    assert_eq!(c.member(0).last_committed(), SeqNo(2));
    assert_eq!(c.member(2).last_committed(), SeqNo(2));
}

/// A Byzantine primary sends batch A to two backups and batch B to the third for the same seqno,
/// then falls silent. No two correct members commit different batches, and a view change
/// replaces it.
#[test]
fn equivocating_primary_causes_no_divergent_commits() {
    for split in [1usize, 2] {
        let mut c = Cluster::new(1, 1, small_knobs());
        c.crash(0);
        let entry = c.submit(1);
        c.pump();
        let signed = c.signed(&entry);
        let a = Batch {
            time_us: c.now,
            entries: vec![signed.clone()],
        };
        let b = Batch {
            time_us: c.now + 1,
            entries: vec![signed],
        };
        for to in 1..=3 {
            let batch = if to <= split { a.clone() } else { b.clone() };
            let env = c.forge(
                0,
                Message::Pbft(PbftMessage::PrePrepare {
                    view: View(0),
                    seqno: SeqNo(1),
                    batch,
                }),
            );
            c.deliver(to, env);
        }
        c.pump();
        assert_eq!(
            c.min_committed(),
            SeqNo(0),
            "split {split}: an equivocated batch must not commit in view 0"
        );
        c.run(5 * c.config.knobs.view_change_timeout_us);
        for i in c.up() {
            assert!(c.member(i).view() >= View(1), "split {split} member {i}");
            assert!(c.member(i).last_committed() >= SeqNo(1), "split {split} member {i}");
        }
        // The request was ordered exactly once, whatever batch won.
        let ordered: Vec<_> = c.ordered.values().flatten().collect();
        assert_eq!(ordered, vec![&(ClientId(1), RequestId(1))], "split {split}");
    }
}

#[test]
fn restart_from_storage_mid_run_and_after_whole_cluster_power_loss() {
    let mut c = Cluster::new(1, 1, small_knobs());
    for client in 0..CLIENTS {
        c.submit(client);
        c.pump();
    }
    let before = c.member(2).last_committed();
    assert_eq!(before, SeqNo(3));
    let accepted = c.member(2).log[&SeqNo(3)].record.accepted.clone().unwrap();
    c.crash(2);
    c.start(2);
    assert_eq!(c.member(2).last_committed(), before);
    // At start it tells its auth member every client's last ordered request again.
    assert_eq!(c.reported[2], c.last_ordered(0));
    assert_eq!(c.reported[2].len(), CLIENTS as usize);
    // A conflicting PRE-PREPARE for an already accepted (view, seqno) is not prepared again.
    let entry = RequestEntry {
        client: ClientId(0),
        request_id: RequestId(1),
        body: RequestBody::Inline("x".into()),
    };
    let other = Batch {
        time_us: accepted.batch.time_us + 5,
        entries: vec![c.signed(&entry)],
    };
    let env = c.forge(
        0,
        Message::Pbft(PbftMessage::PrePrepare {
            view: View(0),
            seqno: SeqNo(3),
            batch: other,
        }),
    );
    c.deliver(2, env);
    c.pump();
    assert_eq!(
        c.member(2).log[&SeqNo(3)].record.accepted.as_ref().unwrap().digest,
        accepted.digest
    );
    // Whole-cluster power loss: everything committed survives.
    for i in 0..c.q.n_order {
        c.crash(i);
    }
    for i in 0..c.q.n_order {
        c.start(i);
        assert_eq!(c.member(i).last_committed(), before, "member {i}");
        // Each may have voted in view 0 for batches its storage lost: it stays silent there.
        assert!(c.member(i).is_abstaining(), "member {i}");
    }
    c.submit(0);
    c.run(20 * c.config.knobs.view_change_timeout_us);
    assert_eq!(c.min_committed(), SeqNo(4), "committed after a view change");
    assert!(c.member(0).view() > View(0));
}

#[test]
fn commit_marks_are_lazy_and_a_power_loss_that_drops_them_loses_nothing() {
    let mut c = Cluster::new(1, 1, small_knobs());
    // Every lazy write is lost: what survives is exactly what the protocol synced.
    c.lazy_writes_lost = true;
    for client in 0..CLIENTS {
        c.submit(client);
        c.pump();
    }
    let before = c.member(1).last_committed();
    assert_eq!(before, SeqNo(CLIENTS as u64));
    let committed = c.committed.clone();
    // Whole-cluster power loss: each backup comes back with the batches prepared (synced before
    // its COMMIT went out) but not committed (the commit decision was a lazy write); the primary,
    // which no PREPARE reached in the normal case, holds none (its accepted batches were lazy
    // writes too), and nothing needs it: the backups' certificates are the commit quorum's. The
    // cluster commits the batches again with the same histories (the harness's agreement check)
    // and goes on.
    for i in 0..c.q.n_order {
        c.crash(i);
    }
    for i in 0..c.q.n_order {
        c.start(i);
        assert!(
            c.member(i).last_committed() < before,
            "member {i}: the commit marks were lazy"
        );
        let prepared = c.member(i).log.values().filter(|s| s.record.prepared.is_some()).count();
        let expected = if i == 0 { 0 } else { before.0 };
        assert_eq!(prepared as u64, expected, "member {i} kept every prepared certificate");
    }
    c.submit(0);
    c.run(2_000_000);
    assert!(c.min_committed() > before, "progress after the power loss");
    for (seqno, history) in committed {
        assert_eq!(
            c.committed[&seqno], history,
            "{seqno:?} agreed again with the same history"
        );
    }
}

#[test]
fn restart_during_view_change_resumes_it_without_going_back() {
    let mut c = Cluster::new(1, 0, small_knobs());
    c.submit(0);
    c.pump();
    c.crash(0);
    c.filter = cut_off(0);
    let pending = c.submit(1);
    // Member 2 starts a view change, crashes before the NEW-VIEW, and restarts.
    c.filter = Box::new(|from, to, _| {
        ![from, to].contains(&Principal::Order(ReplicaId(0))) && to != Principal::Order(ReplicaId(1))
    });
    c.run(2 * c.config.knobs.view_change_timeout_us);
    assert!(c.member(2).is_changing_view());
    let view = c.member(2).view();
    c.crash(2);
    c.start(2);
    assert!(c.member(2).is_changing_view());
    assert_eq!(c.member(2).view(), view);
    c.filter = cut_off(0);
    // The request rows were volatile at member 2; the authentication stage retransmits them.
    c.resubmit(&pending);
    c.run(20 * c.config.knobs.view_change_timeout_us);
    assert!(c.member(2).view() >= view);
    assert_eq!(c.min_committed(), SeqNo(2));
}

#[test]
fn lossy_network_still_makes_progress_once_it_heals() {
    let knobs = Knobs {
        batch_size_max: 2,
        checkpoint_interval: 2,
        log_window: 4,
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    let mut seed = 12345u64;
    c.filter = Box::new(move |_, _, _| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) % 100 >= 30
    });
    for _ in 0..4 {
        for client in 0..CLIENTS {
            c.submit(client);
        }
        c.run(c.config.knobs.view_change_timeout_us);
    }
    c.filter = Box::new(|_, _, _| true);
    // Lost AUTH-REQs are retransmitted by the authentication stage; here: resubmit the same rows.
    for client in 0..CLIENTS {
        for rid in 1..=4 {
            let entry = RequestEntry {
                client: ClientId(client),
                request_id: RequestId(rid),
                body: RequestBody::Inline(format!("op {client} {rid}").into_bytes().into()),
            };
            c.resubmit(&entry);
        }
        c.run(c.config.knobs.view_change_timeout_us);
    }
    // Checkpoint tokens lost while the network was lossy are resent (the execution stage does
    // so on its tick), else the window stays shut at the last stable checkpoint.
    for _ in 0..4 {
        c.run(10 * c.config.knobs.view_change_timeout_us);
        c.resend_tokens();
    }
    c.run(10 * c.config.knobs.view_change_timeout_us);
    assert_eq!(c.ordered_requests().len(), 12);
    // A member whose NEW-VIEW was lost may stay in its view change until the next one (PBFT); all
    // others, at least a medium quorum, are in one view and agree on the committed prefix.
    let normal: Vec<usize> = c
        .up()
        .into_iter()
        .filter(|i| !c.member(*i).is_changing_view())
        .collect();
    assert!(normal.len() >= c.q.order_medium());
    let last = c.member(normal[0]).last_committed();
    for &i in &normal {
        assert_eq!(c.member(i).last_committed(), last, "member {i}");
        assert_eq!(c.member(i).view(), c.member(normal[0]).view(), "member {i}");
    }
}

/// A backup accepts a batch entry whose matrix it cannot check (no rows here; with key refresh,
/// rows under keys it has retired since) when the authentication members sent it rows for that
/// entry themselves, checked as they arrived.
#[test]
fn a_backup_accepts_an_entry_its_own_rows_vouch_for_whatever_the_matrix() {
    let mut c = Cluster::new(1, 1, small_knobs());
    let entry = c.submit(0);
    c.crash(0);
    c.pump();
    let unsigned = SignedEntry {
        entry,
        matrix: MatrixSignature::default(),
    };
    let batch = Batch {
        time_us: c.now,
        entries: vec![unsigned],
    };
    let pre_prepare = Message::Pbft(PbftMessage::PrePrepare {
        view: View(0),
        seqno: SeqNo(1),
        batch,
    });
    c.deliver(1, c.forge(0, pre_prepare));
    c.pump();
    assert_eq!(c.stat(1, "drop_batch_invalid_matrix"), 0);
    assert_eq!(c.stat(1, "pre_prepare_accepted"), 1);
}

#[test]
fn bad_input_is_dropped_and_counted() {
    let mut c = Cluster::new(1, 1, small_knobs());
    let entry = c.submit(0);
    c.crash(0);
    c.pump();
    // Bad MAC.
    let mut env = (*c.forge(
        2,
        Message::Pbft(PbftMessage::Prepare {
            view: View(0),
            seqno: SeqNo(1),
            digest: Digest::of(b"d"),
        }),
    ))
    .clone();
    if let Seal::Authenticator(a) = &mut env.seal {
        a.macs[1].0[0] ^= 1;
    }
    c.deliver(1, Arc::new(env));
    // Pre-prepare from a backup.
    let batch = Batch {
        time_us: c.now,
        entries: vec![c.signed(&entry)],
    };
    c.deliver(
        1,
        c.forge(
            2,
            Message::Pbft(PbftMessage::PrePrepare {
                view: View(0),
                seqno: SeqNo(1),
                batch: batch.clone(),
            }),
        ),
    );
    // Wrong view.
    c.deliver(
        1,
        c.forge(
            0,
            Message::Pbft(PbftMessage::PrePrepare {
                view: View(3),
                seqno: SeqNo(1),
                batch: batch.clone(),
            }),
        ),
    );
    // Out of window.
    c.deliver(
        1,
        c.forge(
            0,
            Message::Pbft(PbftMessage::PrePrepare {
                view: View(0),
                seqno: SeqNo(100),
                batch: batch.clone(),
            }),
        ),
    );
    // Invalid matrix: no rows, for an entry no authentication member vouched for to member 1
    // (its own rows for an entry are enough: see the next test).
    let unvouched = RequestEntry {
        body: RequestBody::Inline(bytes::Bytes::from_static(b"never submitted")),
        ..entry.clone()
    };
    let unsigned = SignedEntry {
        entry: unvouched,
        matrix: MatrixSignature::default(),
    };
    let bad = Batch {
        time_us: c.now,
        entries: vec![unsigned],
    };
    c.deliver(
        1,
        c.forge(
            0,
            Message::Pbft(PbftMessage::PrePrepare {
                view: View(0),
                seqno: SeqNo(1),
                batch: bad,
            }),
        ),
    );
    // Batch time too far in the future.
    let future = Batch {
        time_us: c.now + 10 * c.config.knobs.batch_time_skew_us_max,
        ..batch.clone()
    };
    c.deliver(
        1,
        c.forge(
            0,
            Message::Pbft(PbftMessage::PrePrepare {
                view: View(0),
                seqno: SeqNo(1),
                batch: future,
            }),
        ),
    );
    // A message kind order members never receive from order members.
    c.deliver(1, c.forge(2, Message::LastExecuted { seqno: SeqNo(0) }));
    c.pump();
    assert_eq!(c.stat(1, "drop_bad_seal"), 1);
    assert_eq!(c.stat(1, "drop_pre_prepare_not_primary"), 1);
    assert_eq!(c.stat(1, "drop_wrong_view"), 1);
    assert_eq!(c.stat(1, "drop_out_of_window"), 1);
    assert_eq!(c.stat(1, "drop_batch_invalid_matrix"), 1);
    assert_eq!(c.stat(1, "drop_batch_time_in_future"), 1);
    assert_eq!(c.stat(1, "drop_wrong_sender_or_kind"), 1);
    // Only the bad seal proves its sender faulty; the others can come from a correct member
    // that is behind or ahead.
    assert_eq!(c.member(1).stats().rejected, 1);
    // Two PREPAREs of one member for one slot and view with different digests: the second proves
    // it faulty; the same vote again does not.
    let prepare = |d: &[u8]| {
        Message::Pbft(PbftMessage::Prepare {
            view: View(0),
            seqno: SeqNo(2),
            digest: Digest::of(d),
        })
    };
    c.deliver(1, c.forge(2, prepare(b"x")));
    c.deliver(1, c.forge(2, prepare(b"x")));
    c.pump();
    assert_eq!(c.member(1).stats().rejected, 1);
    c.deliver(1, c.forge(2, prepare(b"y")));
    c.pump();
    assert_eq!(c.stat(1, "conflicting_prepare"), 1);
    assert_eq!(c.member(1).stats().rejected, 2);
    assert!(c
        .member(1)
        .log
        .get(&SeqNo(1))
        .and_then(|s| s.record.accepted.as_ref())
        .is_none());
    // The valid one is accepted.
    c.deliver(
        1,
        c.forge(
            0,
            Message::Pbft(PbftMessage::PrePrepare {
                view: View(0),
                seqno: SeqNo(1),
                batch,
            }),
        ),
    );
    c.pump();
    assert!(c.member(1).log[&SeqNo(1)].record.accepted.is_some());
}

#[test]
fn lagging_member_catches_up_by_order_state_transfer() {
    let knobs = Knobs {
        batch_size_max: 1,
        checkpoint_interval: 2,
        log_window: 4,
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    c.filter = cut_off(3);
    for _ in 0..3 {
        for client in 0..CLIENTS {
            c.submit(client);
        }
    }
    // Member 3 cut off: the backups' PREPAREs reach the primary after the hold.
    c.run(primary_help_hold(&c));
    assert_eq!(c.member(0).last_committed(), SeqNo(9));
    assert_eq!(c.member(3).last_committed(), SeqNo(0));
    c.filter = Box::new(|_, _, _| true);
    c.submit(0);
    c.run(10 * c.config.knobs.view_change_timeout_us);
    assert_eq!(c.member(3).low_watermark(), SeqNo(10));
    assert_eq!(c.member(3).last_committed(), SeqNo(10));
    assert!(c.stat(3, "order_state_transferred") >= 1);
    // The state transfer told its auth member what was ordered in the batches it skipped.
    assert_eq!(c.reported[3], c.last_ordered(0));
    assert_eq!(c.reported[3].len(), CLIENTS as usize);
}

#[test]
fn last_executed_gets_next_batches_or_load_checkpoint() {
    let knobs = Knobs {
        batch_size_max: 1,
        checkpoint_interval: 2,
        log_window: 4,
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 0, knobs);
    for _ in 0..2 {
        for client in 0..CLIENTS {
            c.submit(client);
        }
    }
    c.pump();
    assert_eq!(c.member(1).last_committed(), SeqNo(6));
    assert_eq!(c.member(1).low_watermark(), SeqNo(6));
    let ask = |c: &mut Cluster, seqno: u64| {
        let from = Principal::Exec(ReplicaId(2));
        let to = Principal::Order(ReplicaId(1));
        let message = Message::LastExecuted { seqno: SeqNo(seqno) };
        let env = Arc::new(Envelope::seal(&c.rings[2], &c.q, from, message, SealFor::One(to)));
        let mut out = Vec::new();
        c.members[1]
            .as_mut()
            .unwrap()
            .handle(c.now, Input::Message(env), &mut out);
        out.into_iter()
            .filter_map(|a| match a {
                Action::Send { envelope, .. } => Some(envelope.message.clone()),
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let answer = ask(&mut c, 3);
    assert!(
        matches!(answer[..], [Message::LoadCheckpoint { seqno: SeqNo(6), .. }]),
        "{answer:?}"
    );
    c.auto_tokens = false;
    c.submit(0);
    c.submit(1);
    c.pump();
    let answer = ask(&mut c, 6);
    let seqnos: Vec<SeqNo> = answer
        .iter()
        .filter_map(|m| match m {
            Message::NextBatch { seqno, .. } => Some(*seqno),
            _ => None,
        })
        .collect();
    assert_eq!(seqnos, vec![SeqNo(7), SeqNo(8)]);
}

#[test]
fn already_ordered_request_triggers_rate_limited_retransmit() {
    let mut c = Cluster::new(1, 0, small_knobs());
    let entry = c.submit(0);
    c.pump();
    let row = c.row(0, &entry);
    let env = Arc::new(Envelope::new(
        Principal::Auth(ReplicaId(0)),
        Message::AuthRequest {
            items: vec![AuthItem { entry, row }],
        },
        Seal::None,
    ));
    let mut retransmits = 0;
    for _ in 0..2 {
        let mut out = Vec::new();
        c.members[1]
            .as_mut()
            .unwrap()
            .handle(c.now, Input::Message(env.clone()), &mut out);
        retransmits += out
            .iter()
            .filter(|a| matches!(a, Action::Send { envelope, .. } if matches!(envelope.message, Message::Retransmit { .. })))
            .count();
    }
    assert_eq!(
        retransmits, c.q.n_exec,
        "one RETRANSMIT per execution member, once per interval"
    );
}

#[test]
fn sabotage_short_quorum_commits_with_one_vote_less() {
    let knobs = Knobs {
        sabotage: Some(crate::config::Sabotage::ShortQuorum),
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    // Only the primary and one backup talk: 2 votes = order_medium - 1.
    let allowed = [Principal::Order(ReplicaId(0)), Principal::Order(ReplicaId(1))];
    c.filter = Box::new(move |from, to, _| {
        !matches!(from, Principal::Order(_)) || (allowed.contains(&from) && allowed.contains(&to))
    });
    c.submit(0);
    // Member 1's PREPARE reaches the primary after the hold; the primary's COMMIT then makes the
    // short quorum.
    c.run(primary_help_hold(&c));
    assert_eq!(c.member(1).last_committed(), SeqNo(1));
}

#[test]
fn sabotage_early_execute_releases_batches_before_commit() {
    let knobs = Knobs {
        sabotage: Some(crate::config::Sabotage::EarlyExecute),
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    c.filter = Box::new(|_, _, m| {
        !matches!(
            m,
            Message::Pbft(PbftMessage::Prepare { .. }) | Message::Pbft(PbftMessage::Commit { .. })
        )
    });
    c.submit(0);
    c.pump();
    assert_eq!(c.min_committed(), SeqNo(0));
    assert_eq!(c.next_batches[&SeqNo(1)][&ReplicaId(0)].len(), c.q.n_order);
}

#[test]
fn a_primary_with_more_ready_clients_than_a_batch_holds_serves_them_in_turn() {
    let knobs = Knobs {
        batch_size_max: 2,
        pipeline_window: 1,
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    assert_eq!(CLIENTS, 3);
    // Queued before anything is delivered: 0:1 is ready first and goes alone in batch 1 (window
    // 1); while it is agreed on, 2:1, 1:1, 0:2 and 1:2 reach the pool. Batch 2 then has three
    // ready clients for two places. In id order it would take 0:2 and 1:1, and client 2 would wait
    // behind clients that keep coming back; in turn (after client 0, the last one served) it takes
    // 1:1 and 2:1.
    c.submit(0);
    let victim = c.submit(2);
    c.submit(1);
    c.submit(0);
    c.submit(1);
    c.pump();
    let served = |c: &Cluster, who: (ClientId, RequestId)| {
        c.ordered
            .iter()
            .find(|(_, entries)| entries.contains(&who))
            .map(|(n, _)| *n)
    };
    assert_eq!(served(&c, (ClientId(0), RequestId(1))), Some(SeqNo(1)));
    assert_eq!(
        served(&c, (victim.client, victim.request_id)),
        Some(SeqNo(2)),
        "{:?}",
        c.ordered
    );
    assert_eq!(served(&c, (ClientId(1), RequestId(1))), Some(SeqNo(2)));
    assert_eq!(served(&c, (ClientId(0), RequestId(2))), Some(SeqNo(3)));
}

#[test]
fn a_batch_holds_at_most_its_byte_bound_of_inline_bodies_and_then_goes_without_waiting() {
    let knobs = Knobs {
        batch_size_max: 8,
        pipeline_window: 1,
        // A batch that is not full waits this long for more requests: only a full one goes at once.
        batch_delay_us: 1_000_000,
        inline_request_bytes_max: 1 << 20,
        request_bytes_max: 1 << 20,
        // Longer than the delay: backups do not suspect the primary while a batch waits.
        view_change_timeout_us: 10_000_000,
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    let big = BATCH_INLINE_BYTES_MAX * 3 / 5;
    c.submit(0);
    c.submit_body(1, vec![1; big]);
    c.submit_body(2, vec![2; big]);
    c.pump();
    // Client 2's body would take batch 1 over the bound: the batch is full with two entries and
    // is ordered without waiting out the delay.
    let batches: Vec<_> = c.ordered.values().cloned().collect();
    assert_eq!(
        batches,
        vec![vec![(ClientId(0), RequestId(1)), (ClientId(1), RequestId(1))]],
        "{:?}",
        c.ordered
    );
    // Alone, client 2's request is below both bounds, so batch 2 waits for the delay.
    c.run(999_000);
    assert_eq!(c.ordered.len(), 1);
    c.run(2_000);
    assert_eq!(c.ordered.get(&SeqNo(2)), Some(&vec![(ClientId(2), RequestId(1))]));
    // A single entry above the bound still goes (alone): the bound applies after the first entry.
    c.submit_body(0, vec![3; (1 << 20) - 16]);
    c.run(1_000_000);
    assert_eq!(c.ordered.get(&SeqNo(3)), Some(&vec![(ClientId(0), RequestId(2))]));
}

#[test]
fn a_member_that_lost_its_lazy_accept_abstains_in_that_view() {
    let mut c = Cluster::new(1, 1, small_knobs());
    c.lazy_writes_lost = true;
    // Only member 2 gets the PRE-PREPARE; every PREPARE is lost, so nothing prepares anywhere.
    c.filter = Box::new(|_, to, m| match m {
        Message::AuthRequest { .. } => true,
        Message::Pbft(PbftMessage::PrePrepare { .. }) => to == Principal::Order(ReplicaId(2)),
        _ => false,
    });
    c.submit(0);
    c.pump();
    let accepted = c.member(2).log[&SeqNo(1)].record.accepted.as_ref().unwrap().digest;
    assert!(
        !c.storage[2].contains_key(&super::persist::slot_key(SeqNo(1))),
        "the accept was lazy"
    );
    // It sent PREPARE for `accepted`, then lost the record in a crash.
    c.crash(2);
    c.start(2);
    assert!(!c.member(2).log.contains_key(&SeqNo(1)));
    assert!(c.member(2).is_abstaining());
    // An equivocating primary now offers it another batch for the same view and seqno: a member
    // that accepted would vote for two batches at (0, 1) -- it must not accept.
    let other = RequestEntry {
        client: ClientId(1),
        request_id: RequestId(1),
        body: RequestBody::Inline(b"other".to_vec().into()),
    };
    let batch = Batch {
        time_us: c.now,
        entries: vec![c.signed(&other)],
    };
    let forged = c.forge(
        0,
        Message::Pbft(PbftMessage::PrePrepare {
            view: View(0),
            seqno: SeqNo(1),
            batch,
        }),
    );
    c.filter = Box::new(|_, to, _| to == Principal::Order(ReplicaId(2)));
    c.deliver(2, forged);
    c.pump();
    assert_eq!(c.stat(2, "abstain_pre_prepare"), 1);
    assert!(!c.member(2).log.contains_key(&SeqNo(1)), "no vote for a second batch");
    assert_ne!(batch_digest_of(&c, &other), accepted);
    // Once the network heals, the other three (a quorum) commit without it, and it never votes
    // in view 0 again.
    let votes = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    c.filter = Box::new({
        let votes = votes.clone();
        move |from, _, m| {
            if let (Principal::Order(ReplicaId(2)), Message::Pbft(PbftMessage::Prepare { view: View(0), .. })) =
                (from, m)
            {
                votes.borrow_mut().push(m.clone());
            }
            true
        }
    });
    c.submit(2);
    c.run(2 * c.config.knobs.view_change_timeout_us);
    assert!(c.member(1).last_committed() >= SeqNo(1));
    assert_eq!(*votes.borrow(), Vec::<Message>::new());
    // The primary crashes: progress now needs member 2, which rejoins at the view change.
    c.crash(0);
    let before = c.member(1).last_committed();
    c.submit(1);
    c.run(20 * c.config.knobs.view_change_timeout_us);
    assert!(c.min_committed() > before, "progress with the restarted member");
    assert!(c.member(2).view() > View(0) && !c.member(2).is_abstaining());
}

/// Commits one batch at a time until member 1 leaves the primary out again; the batches it
/// took (at most `bound`).
fn commit_until_quiet_again(c: &mut Cluster, bound: u64) -> u64 {
    let before = c.stat(1, "prepare_quiet_again");
    let mut slots = 0;
    while c.stat(1, "prepare_quiet_again") == before {
        slots += 1;
        assert!(slots <= bound, "never left out again");
        c.submit((slots % CLIENTS as u64) as u32);
        c.pump();
    }
    slots
}

/// How long a backup waits before it sends a quiet PREPARE to the primary too.
fn primary_help_hold(c: &Cluster) -> u64 {
    c.config.knobs.view_change_timeout_us / crate::order::PRIMARY_HELP_HOLD_FRACTION
}

fn batch_digest_of(c: &Cluster, entry: &RequestEntry) -> Digest {
    crate::message::batch_digest(c.now, std::iter::once(entry.digest()))
}

/// Heartbeats: an idle primary orders empty batches about once per `heartbeat_interval_us`, each
/// with a later agreed time, and they commit like any batch; a request in flight holds them back;
/// backups refuse an empty batch that comes too soon after the previous one (a faulty primary
/// cannot flood the log).
#[test]
fn an_idle_primary_orders_heartbeats_that_move_agreed_time() {
    let knobs = Knobs {
        heartbeat_interval_us: 200_000,
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    c.run(1_000_000);
    let sent = c.stat(0, "heartbeat_sent");
    // Ticks every 25 ms; a heartbeat is due 200 ms after the last batch's time.
    assert!((4..=5).contains(&sent), "{sent} heartbeats in 1 s");
    assert_eq!(c.min_committed(), SeqNo(sent), "every heartbeat committed");
    let times: Vec<u64> = c.batch_times.values().copied().collect();
    assert_eq!(times.len() as u64, sent);
    assert!(times.windows(2).all(|w| w[1] >= w[0] + 200_000), "{times:?}");
    // A request ordered now is the next batch; no heartbeat while it is in flight.
    c.submit(0);
    c.pump();
    assert_eq!(c.min_committed(), SeqNo(sent + 1));
    // An empty batch too soon after the last one is refused by the backups.
    let n = c.member(0).last_committed().next();
    let last_time = *c.batch_times.values().last().unwrap();
    let early = c.forge(
        0,
        Message::Pbft(PbftMessage::PrePrepare {
            view: View(0),
            seqno: n,
            batch: Batch {
                time_us: last_time + 1,
                entries: Vec::new(),
            },
        }),
    );
    c.deliver(1, early);
    c.pump();
    assert_eq!(c.stat(1, "drop_heartbeat_too_soon"), 1, "{:?}", c.member(1).stats());
}

/// WAKE-AT from `execs` (each reporting `at` after `seqno`) to every order member.
fn report_wake(c: &mut Cluster, execs: &[u32], seqno: SeqNo, at: u64) {
    for &e in execs {
        let env = Arc::new(Envelope::seal(
            &c.rings[e as usize],
            &c.q,
            Principal::Exec(ReplicaId(e)),
            Message::WakeAt { seqno, at_us: Some(at) },
            SealFor::Stage(crate::ids::StageKind::Order),
        ));
        for o in 0..c.q.n_order {
            c.deliver(o, env.clone());
        }
    }
}

/// A wake-up that `r + 1` execution members asked for (WAKE-AT) makes an idle primary order an
/// empty batch at that time, well before the next heartbeat, and backups accept it; one member
/// alone (it may be the faulty one) moves nothing, and a backup then still refuses an early empty
/// batch; a wake-up already passed by agreed time counts for nothing.
#[test]
fn an_idle_primary_orders_an_empty_batch_when_a_wake_up_is_due() {
    let knobs = Knobs {
        heartbeat_interval_us: 200_000,
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    c.run(30_000);
    assert_eq!(c.min_committed(), SeqNo(1), "the first heartbeat {:?}", c.batch_times);
    let last_time = *c.batch_times.values().last().unwrap();

    // One member alone asks for a wake-up 30 ms on: nothing happens before the next heartbeat.
    report_wake(&mut c, &[1], SeqNo(1), last_time + 30_000);
    c.run(60_000);
    assert_eq!(c.min_committed(), SeqNo(1), "{:?}", c.batch_times);
    assert!(c.now < last_time + 100_000, "before half a heartbeat interval");
    let early = c.forge(
        0,
        Message::Pbft(PbftMessage::PrePrepare {
            view: View(0),
            seqno: SeqNo(2),
            batch: Batch {
                time_us: c.now,
                entries: Vec::new(),
            },
        }),
    );
    c.deliver(1, early);
    c.pump();
    assert_eq!(
        c.stat(1, "drop_heartbeat_too_soon"),
        1,
        "one report justifies no early batch"
    );

    // A second member asks for it too: the primary orders an empty batch at once (it is due).
    let woken_at = c.now;
    report_wake(&mut c, &[2], SeqNo(1), last_time + 30_000);
    c.run(10_000);
    assert_eq!(c.min_committed(), SeqNo(2), "{:?}", c.member(0).stats());
    assert_eq!(c.stat(0, "heartbeat_woken"), 1);
    let time = c.batch_times[&SeqNo(2)];
    assert!(time >= woken_at && time < last_time + 200_000, "{time} vs {last_time}");

    // A wake-up ahead: the primary sets a timer for it and orders the batch then, not before.
    report_wake(&mut c, &[0, 2], SeqNo(2), time + 50_000);
    c.run(40_000);
    assert_eq!(c.min_committed(), SeqNo(2), "not yet due");
    c.run(20_000);
    assert_eq!(c.min_committed(), SeqNo(3));
    let woken = c.batch_times[&SeqNo(3)];
    assert!(
        (time + 50_000..time + 52_000).contains(&woken),
        "{woken} vs {}",
        time + 50_000
    );
    assert_eq!(c.stat(0, "heartbeat_woken"), 2);

    // The same wake-up again: agreed time passed it, so the next batch is the heartbeat.
    report_wake(&mut c, &[0, 1, 2], SeqNo(3), time + 50_000);
    c.run(150_000);
    assert_eq!(c.min_committed(), SeqNo(3));
    c.run(60_000);
    assert_eq!(c.min_committed(), SeqNo(4));
    assert_eq!(c.stat(0, "heartbeat_woken"), 2);
}

#[test]
fn one_suspicion_keeps_a_member_in_the_view_and_view_change_join_suspicions_change_it() {
    let mut c = Cluster::new(1, 1, small_knobs());
    let suspect = |view| Message::Pbft(PbftMessage::Suspect { view });
    // One other member suspects the primary of view 0: member 1 stays in the view.
    c.deliver(1, c.forge(2, suspect(View(0))));
    c.pump();
    assert_eq!(c.stat(1, "suspect_received"), 1);
    assert!(!c.member(1).is_changing_view());
    // The same suspicion again, and one of an older view, count nothing more.
    c.deliver(1, c.forge(2, suspect(View(0))));
    c.pump();
    assert_eq!(c.stat(1, "drop_old_suspect"), 1);
    assert!(!c.member(1).is_changing_view());
    // A second member (view_change_join() = r + 1 = 2): at least one correct member suspects.
    c.deliver(1, c.forge(3, suspect(View(0))));
    c.pump();
    assert_eq!(c.stat(1, "view_change_suspected"), 1);
    assert!(c.member(1).is_changing_view());
    assert_eq!(c.member(1).view(), View(1));
}

/// A backup that no longer hears one peer (it cut the peer off) while the other backups still
/// do: they commit every slot with that peer's COMMIT, so only the cut-off backup stalls and
/// asks the primary in, and the primary, one PREPARE short, would never prepare. The stuck
/// backup's PREPARE after the hold also reaches the other backups; a backup that committed the
/// slot without the primary's COMMIT then sends the primary its PREPAREs and includes it, so every
/// slot commits everywhere within a few holds, long before the retransmission tick. When that
/// backup leaves the primary out again (its streak of complete slots), the stuck one waits the
/// longer stuck-signal hold once, and the streak doubles each time.
#[test]
fn a_backup_that_cut_a_peer_off_alone_is_not_left_behind() {
    let mut c = Cluster::new(1, 1, small_knobs());
    let hold = primary_help_hold(&c);
    let stuck_hold = c.config.knobs.view_change_timeout_us / crate::order::STUCK_SIGNAL_HOLD_FRACTION;
    let (deaf, peer) = (Principal::Order(ReplicaId(1)), Principal::Order(ReplicaId(3)));
    c.filter = Box::new(move |from, to, _| !(from == peer && to == deaf));
    let mut slow = 0;
    for n in 1..=40u64 {
        c.submit((n % CLIENTS as u64) as u32);
        c.run(4 * hold);
        if c.min_committed_of(&[0, 1, 2, 3]) < SeqNo(n) {
            slow += 1;
            c.run(stuck_hold);
        }
        assert_eq!(
            c.min_committed_of(&[0, 1, 2, 3]),
            SeqNo(n),
            "batch {n} committed everywhere within the stuck-signal hold and four holds"
        );
    }
    assert!(slow <= 3, "{slow} of 40 batches waited for the stuck-signal hold");
    assert!(c.stat(1, "prepare_primary_helped") >= 1);
    assert!(c.stat(1, "prepare_stuck_signalled") >= 1);
    assert!(
        c.stat(2, "prepare_primary_asked_in") + c.stat(3, "prepare_primary_asked_in") >= 1,
        "a backup that committed without the primary brought it in"
    );
    let last = c.member(0).last_committed();
    for i in 0..c.q.n_order {
        assert_eq!(c.member(i).last_committed(), last, "member {i}");
    }
}

/// Tentative execution (`handoff.rs`): each order member with an execution member hands every
/// small batch over once prepared (before it commits), and at `u = r` the backups send the
/// primary their PREPAREs so that its execution member, needed for the tentative reply quorum,
/// executes too; a batch larger than `tentative_entries_max` takes the committed path alone.
#[test]
fn prepared_batches_are_handed_to_the_own_execution_member_before_they_commit() {
    let knobs = Knobs {
        tentative_entries_max: 1,
        pipeline_window: 1,
        ..small_knobs()
    };
    let mut c = Cluster::new(1, 1, knobs);
    for n in 1..=3u32 {
        c.submit(n % CLIENTS);
        c.pump();
    }
    assert_eq!(c.min_committed(), SeqNo(3));
    for i in 0..c.q.n_exec {
        assert_eq!(c.stat(i, "tentative_batch_sent"), 3, "member {i}");
    }
    assert_eq!(c.stat(3, "tentative_batch_sent"), 0, "member 3 has no execution member");
    assert_eq!(
        c.stat(0, "prepared"),
        3,
        "the primary prepared: its execution member is needed"
    );
    assert_eq!(c.stat(1, "prepare_quiet"), 0);

    // Three requests at once: a batch of more than tentative_entries_max takes the committed
    // path alone, and its PREPAREs leave the primary out.
    c.submit(1);
    c.submit(2);
    c.submit(0);
    c.pump();
    let committed = c.min_committed().0;
    assert!(committed > 3);
    for i in 0..c.q.n_exec {
        assert!(c.stat(i, "tentative_batch_sent") < committed, "member {i}");
    }
    assert!(c.stat(1, "prepare_quiet") >= 1, "the primary is left out again");
}

/// Aliph's Quorum (`protocol = "quorum"`, `order/quorum.rs`): with every member up, each
/// executes the request at once on its own authentication member's word and commits it on every
/// member's COMMIT; with one member cut off nothing commits that way, the members abort to the
/// next view, whose NEW-VIEW keeps the batch they share (their speculative claims), orders the
/// Backup phase and then speculates again.
#[test]
fn quorum_phase_commits_on_every_vote_and_aborts_to_a_view_that_keeps_it() {
    let knobs = Knobs {
        quorum_backup_batches: 3,
        quorum_commit_timeout_us: 20_000,
        ..small_knobs()
    };
    let mut c = Cluster::with_protocol(1, 1, knobs, crate::config::OrderProtocol::Quorum);
    c.submit(0);
    c.pump();
    for i in 0..4 {
        assert_eq!(c.member(i).last_committed(), SeqNo(1), "member {i}");
        assert_eq!(c.member(i).view(), View(0));
    }
    assert_eq!(c.ordered[&SeqNo(1)], vec![(ClientId(0), RequestId(1))]);
    // Not a PRE-PREPARE in sight: the members speculated, the primary proposed nothing.
    assert_eq!(c.member(0).stats().get("pre_prepare_sent"), 0);
    assert_eq!(c.member(1).stats().get("speculated"), 1);

    c.filter = cut_off(3);
    c.submit(1);
    c.run(5_000);
    for i in 0..3 {
        assert_eq!(
            c.member(i).last_committed(),
            SeqNo(1),
            "three votes of four do not commit"
        );
    }
    c.run(200_000);
    for i in 0..3 {
        let m = c.member(i);
        assert_eq!(m.view(), View(1), "member {i} aborted to view 1");
        assert!(m.stats().get("quorum_abort_timeout") + m.stats().get("quorum_abort_joined") >= 1);
        // The NEW-VIEW kept seqno 2; nothing else waited, so the Backup phase ended with one
        // empty batch.
        assert_eq!(m.last_committed(), SeqNo(3), "member {i}");
        assert_eq!(
            m.stats().get("pre_prepare_sent") + m.stats().get("pre_prepare_accepted"),
            1
        );
    }
    assert!(
        (0..3).any(|i| c.member(i).stats().get("quorum_abort_timeout") >= 1),
        "one timed out, the others joined it"
    );
    assert_eq!(c.ordered[&SeqNo(2)], vec![(ClientId(1), RequestId(1))]);
    // Member 3 back: it catches up (or the others abort once more for it) and the next request
    // commits at every member.
    c.filter = Box::new(|_, _, _| true);
    c.submit(2);
    c.run(1_000_000);
    let (at, _) = c
        .ordered
        .iter()
        .find(|(_, entries)| entries.contains(&(ClientId(2), RequestId(1))))
        .expect("client 2's request was ordered");
    let committed: Vec<SeqNo> = (0..4).map(|i| c.member(i).last_committed()).collect();
    assert!(committed.iter().all(|n| n >= at), "{committed:?} {at:?}");
}

/// Contention (two requests waiting at once) aborts a Quorum phase at once, without waiting for
/// the commit timeout; the next view's Backup phase orders both, and its `k` doubles because
/// the Quorum phase before committed less than its Backup phase.
#[test]
fn contention_aborts_the_quorum_phase_and_doubles_the_backup_phase() {
    let knobs = Knobs {
        quorum_backup_batches: 3,
        quorum_commit_timeout_us: 20_000,
        ..small_knobs()
    };
    let mut c = Cluster::with_protocol(1, 1, knobs, crate::config::OrderProtocol::Quorum);
    let (a, b) = (c.submit(0), c.submit(1));
    c.run(1_000);
    for i in 0..4 {
        let m = c.member(i);
        assert_eq!(m.view(), View(1), "member {i}");
        assert!(m.stats().get("quorum_abort_contention") + m.stats().get("quorum_abort_joined") >= 1);
        assert_eq!(m.stats().get("quorum_abort_timeout"), 0, "no timeout needed");
    }
    let ordered: Vec<(ClientId, RequestId)> = c.ordered.values().flatten().copied().collect();
    for entry in [&a, &b] {
        assert!(ordered.contains(&(entry.client, entry.request_id)), "{ordered:?}");
    }
    assert_eq!(
        c.member(1).stats().get("new_view_backup_batches"),
        3,
        "view 0 had no Backup: k at its base"
    );
    // View 1's Backup ends once idle; contention in its Quorum phase: view 2's k doubles.
    c.run(200_000);
    assert!(c.member(0).stats().get("backup_filled") + c.member(1).stats().get("backup_filled") >= 1);
    c.submit(2);
    c.submit(0);
    c.run(1_000);
    assert_eq!(c.member(2).view(), View(2));
    assert_eq!(
        c.member(2).stats().get("new_view_backup_batches"),
        6,
        "k doubled from 3"
    );
}

/// `protocol = "chain"`: view 0 has no Backup phase, so the head (the primary) accepts a batch
/// at once and it travels down the chain 0, 1, 2, 3 in CHAINs, each member voting; every member
/// commits it on the votes of the last `r + 1` (members 2 and 3), with no PRE-PREPARE, PREPARE
/// or three-phase COMMIT quorum.
#[test]
fn chain_phase_passes_a_batch_down_the_chain_and_commits_on_the_committers_votes() {
    let mut c = Cluster::with_protocol(1, 1, small_knobs(), crate::config::OrderProtocol::Chain);
    c.submit(0);
    c.pump();
    for i in 0..4 {
        let m = c.member(i);
        assert_eq!(m.last_committed(), SeqNo(1), "member {i}");
        assert_eq!(m.view(), View(0));
        assert_eq!(m.stats().get("chain_accepted"), 1, "member {i}");
        assert_eq!(
            m.stats().get("pre_prepare_sent") + m.stats().get("prepared"),
            0,
            "member {i}"
        );
    }
    assert_eq!(c.ordered[&SeqNo(1)], vec![(ClientId(0), RequestId(1))]);
}

/// A member accepts its predecessor's CHAIN only with the votes of its whole predecessor set:
/// member 2 (chain position 2 in view 0) needs the head's vote as well as member 1's CHAIN. With
/// the head's messages to member 2 cut, member 2 waits, nothing commits (the committers' votes
/// are missing), the members that accepted it end the view once it has waited half the
/// view-change timeout (`CHAIN_STALL_FRACTION`), and view 1's Backup phase orders the request.
/// `Sabotage::ChainSkipCheck` accepts on the CHAIN alone.
#[test]
fn a_chain_member_waits_for_its_whole_predecessor_set() {
    let cut = |from: Principal, to: Principal, _: &Message| {
        !(from == Principal::Order(ReplicaId(0)) && to == Principal::Order(ReplicaId(2)))
    };
    // A stall ends the view after half PBFT's view-change timeout, before that timer would.
    let mut c = Cluster::with_protocol(1, 1, small_knobs(), crate::config::OrderProtocol::Chain);
    c.filter = Box::new(cut);
    c.submit(0);
    c.run(1_000);
    assert!(c.member(2).stats().get("chain_waiting_vouchers") >= 1);
    for i in 0..4 {
        assert_eq!(c.member(i).last_committed(), SeqNo(0), "member {i}");
    }
    assert_eq!(c.member(2).stats().get("chain_accepted"), 0);
    c.run(2_000_000);
    let (at, _) = c
        .ordered
        .iter()
        .find(|(_, entries)| entries.contains(&(ClientId(0), RequestId(1))))
        .expect("the request was ordered after the view change");
    for i in 0..4 {
        let m = c.member(i);
        assert!(m.view() >= View(1), "member {i} left view 0");
        assert!(m.last_committed() >= *at, "member {i}");
    }
    assert!(
        (0..4).any(|i| c.member(i).stats().get("chain_abort_stalled") >= 1),
        "the members that accepted the batch ended the stalled view themselves"
    );

    let knobs = Knobs {
        sabotage: Some(crate::config::Sabotage::ChainSkipCheck),
        ..small_knobs()
    };
    let mut c = Cluster::with_protocol(1, 1, knobs, crate::config::OrderProtocol::Chain);
    c.filter = Box::new(cut);
    c.submit(0);
    c.run(1_000);
    assert_eq!(
        c.member(2).stats().get("chain_accepted"),
        1,
        "sabotaged: accepted on the CHAIN alone"
    );
}

/// `protocol = "aliph"`: view 0 runs Quorum; contention aborts it, and the new primary, whose
/// last Quorum phase committed less than its Backup phase, starts a Chain view; a Chain phase
/// with at most one client for `aliph_one_client_us` ends, and the next view runs Quorum again.
#[test]
fn aliph_switches_quorum_to_chain_on_contention_and_back_with_one_client() {
    let knobs = Knobs {
        quorum_backup_batches: 2,
        aliph_one_client_us: 400_000,
        ..small_knobs()
    };
    let mut c = Cluster::with_protocol(1, 1, knobs, crate::config::OrderProtocol::Aliph);
    c.submit(0);
    c.submit(1);
    c.run(100_000);
    let primary = c.member(1);
    assert_eq!(primary.view(), View(1));
    assert_eq!(primary.stats().get("aliph_new_view_chain"), 1, "contention: Chain next");
    // A load of two clients in view 1's Chain phase (after its Backup phase ended idle).
    c.run(100_000);
    c.submit(0);
    c.submit(2);
    c.run(50_000);
    assert!((0..4).all(|i| c.member(i).stats().get("chain_accepted") >= 1));
    // Then one client only: the Chain phase ends and view 2 runs Quorum.
    c.run(600_000);
    assert!((0..4).any(|i| c.member(i).stats().get("aliph_chain_one_client") >= 1));
    assert_eq!(c.member(2).view(), View(2));
    assert_eq!(c.member(2).stats().get("aliph_new_view_quorum"), 1);
    c.run(300_000);
    c.submit(1);
    c.run(50_000);
    assert!(
        (0..4).all(|i| c.member(i).stats().get("speculated") >= 1),
        "Quorum again"
    );
    let ordered: Vec<(ClientId, RequestId)> = c.ordered.values().flatten().copied().collect();
    assert_eq!(ordered.len(), 5, "{ordered:?}");
}

/// A Quorum phase does not advance agreed time (each batch is one microsecond after the last),
/// so a request that arrives when agreed time lags the member's clock by more than the heartbeat
/// interval ends the phase instead of running at a stale time (a Redis `SET .. EX 100` at agreed
/// time 0 expired at the next Backup batch: the CI failure of session 39). The abort is not
/// contention: the next view keeps Quorum and the base Backup length.
#[test]
fn a_stale_agreed_time_ends_the_quorum_phase_without_counting_as_contention() {
    let knobs = Knobs {
        quorum_backup_batches: 2,
        heartbeat_interval_us: 200_000,
        ..small_knobs()
    };
    let mut c = Cluster::with_protocol(1, 1, knobs, crate::config::OrderProtocol::Aliph);
    // The cluster's clock is at 1 s, its agreed time at 0.
    let start = c.now;
    c.submit(0);
    c.run(50_000);
    for i in 0..4 {
        let m = c.member(i);
        assert_eq!(m.view(), View(1), "member {i}");
        assert_eq!(m.stats().get("speculated"), 0, "member {i} ran nothing at time 0");
        assert!(
            m.prefix.max_time >= start,
            "member {i}: agreed time {}",
            m.prefix.max_time
        );
    }
    assert!((0..4).any(|i| c.member(i).stats().get("quorum_abort_clock") >= 1));
    let primary = c.member(1);
    assert_eq!(primary.stats().get("aliph_new_view_quorum"), 1, "still Quorum");
    assert_eq!(primary.stats().get("new_view_backup_batches"), 2, "k at its base");
    assert!(c.ordered.values().flatten().any(|&e| e == (ClientId(0), RequestId(1))));
    // View 1's Backup phase ends idle (its empty batch at the primary's time); a request soon
    // after runs in the Quorum phase.
    c.run(150_000);
    c.submit(1);
    c.run(50_000);
    assert!((0..4).all(|i| c.member(i).stats().get("speculated") == 1));
    assert_eq!(c.member(0).view(), View(1));
    // Idle past the interval: the next request ends view 1's Quorum phase too.
    c.run(300_000);
    c.submit(2);
    c.run(50_000);
    assert!((0..4).all(|i| c.member(i).view() == View(2) && c.member(i).stats().get("speculated") == 1));
    assert!(c.ordered.values().flatten().any(|&e| e == (ClientId(2), RequestId(1))));
}

/// The new primary's NEW-VIEW names the VIEW-CHANGEs it was built on instead of carrying them
/// (under load they were megabytes each); members install it from the VIEW-CHANGEs they hold.
/// A member that missed one (here: member 3 never gets member 2's VIEW-CHANGE) keeps the
/// NEW-VIEW, asks the primary, and installs the relayed NEW-VIEW that carries them all.
#[test]
fn a_new_view_names_its_view_changes_and_a_member_missing_one_gets_them_relayed() {
    let mut c = Cluster::new(1, 1, small_knobs());
    c.submit(1);
    c.pump();
    assert_eq!(c.min_committed(), SeqNo(1));
    c.crash(0);
    let attached = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let seen = attached.clone();
    c.filter = Box::new(move |from, to, m| {
        if let Message::Pbft(PbftMessage::NewView(nv)) = m {
            seen.borrow_mut()
                .push((to, nv.view_changes.len(), nv.new_view.value.view_changes.len()));
        }
        let lost = from == Principal::Order(ReplicaId(2))
            && to == Principal::Order(ReplicaId(3))
            && matches!(m, Message::Pbft(PbftMessage::ViewChange(_)));
        !lost && from != Principal::Order(ReplicaId(0)) && to != Principal::Order(ReplicaId(0))
    });
    // Member 1 alone times out (a request waits there); it and 2 and 3 change views.
    c.submit(2);
    c.run(5 * c.config.knobs.view_change_timeout_us);
    for i in c.up() {
        assert_eq!(c.member(i).view(), View(1), "member {i}");
        assert!(!c.member(i).is_changing_view(), "member {i} installed view 1");
    }
    let sent = attached.borrow();
    let first: Vec<_> = sent
        .iter()
        .filter(|(to, ..)| *to != Principal::Order(ReplicaId(0)))
        .collect();
    assert!(
        first
            .iter()
            .any(|&&(_, carried, named)| carried == 0 && named == c.q.view_change()),
        "the multicast names {} VIEW-CHANGEs and carries none: {sent:?}",
        c.q.view_change()
    );
    assert!(c.member(2).stats().get("new_view_awaits_view_changes") == 0);
    assert!(c.member(3).stats().get("new_view_awaits_view_changes") >= 1);
    assert!(
        first
            .iter()
            .any(|&&(to, carried, _)| to == Principal::Order(ReplicaId(3)) && carried == c.q.view_change()),
        "member 3 got the relay with them: {sent:?}"
    );
    assert!(c.ordered_requests().contains(&(ClientId(2), RequestId(1))));
}
