//! Unit tests of paged state at the execution stage: incremental checkpoints, restart from stored
//! pages, and transfer of only the differing pages with a peer that lies.

use std::collections::BTreeSet;

use bytes::Bytes;

use super::checkpoint::CHECKPOINT_KEY_PREFIX;
use super::paged::page_key;
use super::tests::{chain, executed, replies, Net, TestBatch, CLIENT};
use super::tests_recovery::{apply_persists, checkpointed, pump};
use super::ExecStage;
use crate::config::Knobs;
use crate::crypto::Digest;
use crate::ids::{Principal, ReplicaId, RequestId, SeqNo};
use crate::message::{Message, RequestBody, RequestEntry, SealFor};
use crate::objects::{write_op, ObjectStore};
use crate::stage::{Action, Event, Input, Stage, Storage, Timer};

const OBJECTS: u64 = 5000;
const SIZE: usize = 40;

fn knobs() -> Knobs {
    Knobs {
        checkpoint_interval: 4,
        log_window: 8,
        state_chunk_bytes: 64,
        ..Knobs::default()
    }
}

fn store() -> Box<ObjectStore> {
    Box::new(ObjectStore::new(OBJECTS, SIZE))
}

fn object_stage(net: &Net, id: u32, storage: &Storage) -> ExecStage {
    net.stage(id, storage, store())
}

/// Twelve batches, each writing three objects spread over the state (request ids 1..=36).
fn workload() -> (Vec<TestBatch>, Vec<BTreeSet<u64>>) {
    let mut written = Vec::new();
    let batches = (0..12u64)
        .map(|b| {
            let objects: BTreeSet<u64> = (0..3).map(|k| (b * 3 + k) * 331 % OBJECTS).collect();
            let entries = objects
                .iter()
                .enumerate()
                .map(|(k, &index)| RequestEntry {
                    client: CLIENT,
                    request_id: RequestId(b * 3 + k as u64 + 1),
                    body: RequestBody::Inline(write_op(index, format!("batch {b} object {index}").as_bytes())),
                })
                .collect();
            written.push(objects);
            entries
        })
        .collect();
    (chain(batches), written)
}

/// LOAD-CP for `(seqno, digest)` from order members 0 and 1 (a quorum at u = r = 1) to
/// execution member 1; returns what it does.
fn load_from_two_orders(net: &Net, b: &mut ExecStage, seqno: SeqNo, digest: Digest) -> Vec<Action> {
    let load = Message::LoadCheckpoint {
        seqno,
        exec_state: digest,
    };
    let mut out = Vec::new();
    for order in [0, 1] {
        b.handle(
            10,
            net.input(
                Principal::Order(ReplicaId(order)),
                load.clone(),
                SealFor::One(Principal::Exec(ReplicaId(1))),
            ),
            &mut out,
        );
    }
    out
}

/// Retry ticks from `first` on (each 300 ms apart, every message pumped) until `b` loaded a
/// checkpoint, at most 19 of them.
fn retry_until_loaded(net: &Net, a: &mut ExecStage, b: &mut ExecStage, log: &mut Vec<Action>, first: u64) {
    for tick in first..first + 19 {
        if log.iter().any(|a| matches!(a, Action::Note(Event::StateLoaded { .. }))) {
            return;
        }
        let mut out = Vec::new();
        b.handle(tick * 300_000, Input::Timer(Timer::ExecRetry), &mut out);
        log.extend(pump(net, a, b, out, tick * 300_000));
    }
}

fn run(net: &Net, stage: &mut ExecStage, batches: &[TestBatch]) -> Vec<Action> {
    batches.iter().flat_map(|b| net.deliver(stage, b)).collect()
}

#[test]
fn a_checkpoint_persists_only_the_changed_pages() {
    let net = Net::new(knobs());
    let (batches, written) = workload();
    let mut a = object_stage(&net, 0, &Storage::new());
    let out = run(&net, &mut a, &batches[..8]);
    let pages: Vec<&String> = out
        .iter()
        .filter_map(|a| match a {
            Action::Persist { key, .. } if key.starts_with(super::paged::PAGE_KEY_PREFIX) => Some(key),
            _ => None,
        })
        .collect();
    let expected: usize = written[..8].iter().map(|w| w.len()).sum();
    assert_eq!(pages.len(), expected, "one record per changed page");
    assert_eq!(a.stats().get("checkpoint_pages_changed"), expected as u64);
    // Every member reaches the same checkpoints.
    let mut b = object_stage(&net, 1, &Storage::new());
    assert_eq!(checkpointed(&run(&net, &mut b, &batches[..8])), checkpointed(&out));
}

#[test]
fn a_restart_installs_the_stored_pages_and_continues_identically() {
    let net = Net::new(knobs());
    let (batches, _) = workload();
    let mut a = object_stage(&net, 0, &Storage::new());
    let out = run(&net, &mut a, &batches[..10]);
    let mut storage = Storage::new();
    apply_persists(&mut storage, &out);
    let mut restarted = object_stage(&net, 0, &storage);
    assert_eq!(restarted.last_executed(), (SeqNo(8), batches[7].history));
    let rest_a = run(&net, &mut a, &batches[10..]);
    let rest = run(&net, &mut restarted, &batches[8..]);
    assert_eq!(checkpointed(&rest), checkpointed(&rest_a));

    // Pages of another checkpoint than the stored one (a torn write): nothing restored.
    let mut torn = storage.clone();
    torn.insert(page_key(1), Bytes::from_static(b"not checkpointed"));
    let mut fresh = object_stage(&net, 0, &torn);
    assert_eq!(fresh.last_executed().0, SeqNo(0));
    assert!(fresh.stats().get("stored_checkpoint_pages_mismatch") >= 1);
    // Those pages are no batch's state: batches from 1 are not executed on them (that made a
    // state no other member had: upright-sim --seeds 1 --first-seed 200037 --u 2 --r 1
    // --service fs); a transfer must bring a certified checkpoint first.
    assert!(fresh.state_is_partial());
    assert_eq!(fresh.stats().get("stored_pages_without_checkpoint"), 1);
    assert!(executed(&run(&net, &mut fresh, &batches[..3])).is_empty());
    // The same when the checkpoint's record was lost altogether (power lost before its sync).
    let mut lost = storage.clone();
    lost.retain(|key, _| !key.starts_with(CHECKPOINT_KEY_PREFIX));
    let mut fresh = object_stage(&net, 0, &lost);
    assert!(fresh.state_is_partial());
    assert!(executed(&run(&net, &mut fresh, &batches[..3])).is_empty());
}

/// A page store that outlives the stage holding it (a replica's disk across its restarts).
#[derive(Clone, Default)]
struct DiskStore(std::sync::Arc<std::sync::Mutex<DiskPages>>);

#[derive(Default)]
struct DiskPages {
    committed: std::collections::BTreeMap<u64, Bytes>,
    pending: Vec<(u64, Bytes)>,
    len: u64,
    seqno: u64,
    record: Bytes,
}

impl crate::pages::PageStore for DiskStore {
    fn committed(&self) -> (u64, Vec<u32>) {
        let d = self.0.lock().unwrap();
        let lens = (0..d.len)
            .map(|i| d.committed.get(&i).map_or(0, |b| b.len() as u32))
            .collect();
        (d.seqno, lens)
    }
    fn read(&self, index: u64) -> std::io::Result<Bytes> {
        Ok(self
            .0
            .lock()
            .unwrap()
            .committed
            .get(&index)
            .cloned()
            .unwrap_or_default())
    }
    fn committed_record(&self) -> Bytes {
        self.0.lock().unwrap().record.clone()
    }
    fn write(&mut self, index: u64, bytes: &[u8]) -> std::io::Result<()> {
        self.0
            .lock()
            .unwrap()
            .pending
            .push((index, Bytes::copy_from_slice(bytes)));
        Ok(())
    }
    fn commit(&mut self, seqno: u64, len: u64, record: &[u8]) -> std::io::Result<()> {
        let mut d = self.0.lock().unwrap();
        for (index, bytes) in std::mem::take(&mut d.pending) {
            d.committed.insert(index, bytes);
        }
        d.committed.retain(|i, _| *i < len);
        (d.len, d.seqno, d.record) = (len, seqno, Bytes::copy_from_slice(record));
        Ok(())
    }
}

fn stage_on_disk(net: &Net, storage: &Storage, disk: &DiskStore) -> ExecStage {
    let mut stage = ExecStage::with_page_store(
        net.config.clone(),
        ReplicaId(0),
        net.rings[0].clone(),
        storage,
        store(),
        Some(Box::new(disk.clone())),
    )
    .unwrap();
    stage.handle(0, Input::Start, &mut Vec::new());
    stage
}

/// The page store commits a checkpoint's pages at once and its storage record is synced later: a
/// power loss in between left pages that no stored record described, and the member executed
/// from batch 1 on checkpoint 8's pages (soak seed 200037: `upright-sim --seeds 1 --first-seed
/// 200037 --u 2 --r 1 --service fs --seconds 0.5`). The store now commits the record with the
/// pages, and a restart restores from it.
#[test]
fn a_power_loss_after_the_store_commit_restores_from_the_stores_record() {
    let net = Net::new(knobs());
    let (batches, _) = workload();
    let disk = DiskStore::default();
    let mut a = stage_on_disk(&net, &Storage::new(), &disk);
    let out = run(&net, &mut a, &batches[..10]);
    assert_eq!(disk.0.lock().unwrap().seqno, 8);
    // Not one storage write survived.
    let mut restarted = stage_on_disk(&net, &Storage::new(), &disk);
    assert_eq!(restarted.last_executed(), (SeqNo(8), batches[7].history));
    assert!(!restarted.state_is_partial());
    let rest = run(&net, &mut restarted, &batches[8..]);
    let mut reference = object_stage(&net, 0, &Storage::new());
    let all = run(&net, &mut reference, &batches);
    assert_eq!(checkpointed(&out), checkpointed(&all)[..2]);
    assert_eq!(checkpointed(&rest), checkpointed(&all)[2..]);

    // A store whose record is unreadable: its pages are no batch's state until a transfer.
    disk.0.lock().unwrap().record = Bytes::from_static(b"torn");
    let mut fresh = stage_on_disk(&net, &Storage::new(), &disk);
    assert_eq!(fresh.last_executed().0, SeqNo(0));
    assert_eq!(fresh.stats().get("store_checkpoint_record_missing"), 1);
    assert!(fresh.state_is_partial());
    assert!(executed(&run(&net, &mut fresh, &batches[..3])).is_empty());
}

/// A member asked to load a checkpoint its peers no longer keep (they restarted from their page
/// stores, which hold only the newest) loads the newer one `r + 1` peers offer instead; one offer
/// alone (a faulty peer's, as far as it knows) moves nothing.
#[test]
fn a_member_loads_a_newer_checkpoint_that_r_plus_1_peers_offer() {
    let net = Net::new(knobs());
    let (batches, _) = workload();
    let disk = DiskStore::default();
    let mut a = stage_on_disk(&net, &Storage::new(), &disk);
    let cps = checkpointed(&run(&net, &mut a, &batches));
    assert_eq!(cps.iter().map(|c| c.0 .0).collect::<Vec<_>>(), [4, 8, 12]);
    // a restarts: only checkpoint 12, from the store, is kept.
    let mut a = stage_on_disk(&net, &Storage::new(), &disk);
    assert_eq!(a.last_executed().0, SeqNo(12));
    let mut b = object_stage(&net, 1, &Storage::new());
    let out = load_from_two_orders(&net, &mut b, cps[0].0, cps[0].1);
    let mut log = pump(&net, &mut a, &mut b, out, 10);
    retry_until_loaded(&net, &mut a, &mut b, &mut log, 1);
    assert!(a.stats().get("fetch_state_newer_offered") >= 1);
    assert!(b.stats().get("state_transfer_newer_offered") >= 1);
    assert_eq!(b.stats().get("state_transfer_moved_to_offered"), 0, "one peer's offer");
    assert_eq!(b.last_executed().0, SeqNo(0));
    // A second peer offers the same checkpoint: b loads it.
    let newest = a.checkpoints.newest().unwrap().clone();
    let offer = Message::StateManifest {
        seqno: newest.seqno,
        total_bytes: newest.blob.len() as u64,
        chunk_digests: newest.chunk_digests.clone(),
    };
    let mut out = Vec::new();
    let from = Principal::Exec(ReplicaId(2));
    b.handle(
        30_000_000,
        net.input(from, offer, SealFor::One(Principal::Exec(ReplicaId(1)))),
        &mut out,
    );
    assert_eq!(b.stats().get("state_transfer_moved_to_offered"), 1);
    let mut log = pump(&net, &mut a, &mut b, out, 30_000_000);
    retry_until_loaded(&net, &mut a, &mut b, &mut log, 101);
    assert!(log
        .iter()
        .any(|x| matches!(x, Action::Note(Event::StateLoaded { seqno, state_digest })
        if (*seqno, *state_digest) == cps[2])));
    assert_eq!(b.last_executed(), a.last_executed());
}

#[test]
fn a_member_behind_fetches_only_the_differing_pages_despite_a_lying_peer() {
    let net = Net::new(knobs());
    let (batches, written) = workload();
    let mut a = object_stage(&net, 0, &Storage::new());
    let out_a = run(&net, &mut a, &batches[..12]);
    let (seqno, digest) = *checkpointed(&out_a).last().unwrap();
    assert_eq!(seqno, SeqNo(12));

    // b executed up to 4 (checkpointed), then fell behind; it also executed batch 5 (a live
    // change past its checkpoint that the transfer must undo or keep, as the certified state says).
    let mut b = object_stage(&net, 1, &Storage::new());
    run(&net, &mut b, &batches[..5]);
    let out = load_from_two_orders(&net, &mut b, seqno, digest);
    let mut log = pump(&net, &mut a, &mut b, out, 10);
    // Retries move every outstanding item away from the liar.
    retry_until_loaded(&net, &mut a, &mut b, &mut log, 1);
    assert!(
        log.iter().any(
            |a| matches!(a, Action::Note(Event::StateLoaded { seqno: s, state_digest: d }) if *s == seqno && *d == digest)
        ),
        "{:?}",
        b.stats()
    );
    assert!(b.stats().get("page_answer_wrong") > 0, "the liar was asked and caught");
    let changed: BTreeSet<u64> = written[4..12].iter().flatten().copied().collect();
    let fetched = b.stats().get("state_transfer_pages");
    assert!(
        fetched as usize <= changed.len() && fetched as usize >= changed.len() - written[4].len(),
        "fetched {fetched} pages, {} changed",
        changed.len()
    );
    assert_eq!(b.last_executed(), a.last_executed());
    assert!(b.stats().get("state_transfer_bytes") < OBJECTS * SIZE as u64 / 5);

    // b serves the loaded checkpoint and both continue identically.
    let next = super::tests::chain_from(
        SeqNo(12),
        batches[11].history,
        vec![
            vec![RequestEntry {
                client: CLIENT,
                request_id: RequestId(100),
                body: RequestBody::Inline(write_op(9, b"after")),
            }];
            4
        ]
        .into_iter()
        .enumerate()
        .map(|(i, mut e)| {
            e[0].request_id = RequestId(100 + i as u64);
            e
        })
        .collect(),
    );
    let out_a = run(&net, &mut a, &next);
    let out_b = run(&net, &mut b, &next);
    assert_eq!(executed(&out_b), (13..=16).map(SeqNo).collect::<Vec<_>>());
    assert_eq!(checkpointed(&out_a), checkpointed(&out_b));
    assert_eq!(replies(&out_a, CLIENT).len(), replies(&out_b, CLIENT).len());
}

/// PAGE-ANSWERs in `out`: (nodes, pages).
#[allow(clippy::type_complexity)]
fn page_answers(out: &[Action]) -> Vec<(Vec<((u32, u64), Vec<Digest>)>, Vec<(u64, Bytes)>)> {
    out.iter()
        .filter_map(|act| match act {
            Action::Send { envelope, .. } => match &envelope.message {
                Message::PageAnswer { nodes, pages, .. } => Some((nodes.clone(), pages.clone())),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Every kept checkpoint is served as it was, not only the newest: the stable checkpoint a
/// lagging member loads can be two behind (session 22's `--mutate` finding). A checkpoint no
/// longer kept, or named with a wrong digest, is not served.
#[test]
fn pages_are_served_from_every_kept_checkpoint() {
    let net = Net::new(knobs());
    let (batches, written) = workload();
    let mut a = object_stage(&net, 0, &Storage::new());
    let cps = checkpointed(&run(&net, &mut a, &batches));
    assert_eq!(
        cps.iter().map(|c| c.0).collect::<Vec<_>>(),
        vec![SeqNo(4), SeqNo(8), SeqNo(12)]
    );
    // Every page some batch wrote, and one past the end.
    let wanted: Vec<u64> = written.iter().flatten().copied().chain([OBJECTS + 5]).collect();
    assert!(wanted.len() <= crate::limits::PAGE_ITEMS_PER_FETCH);
    let nodes: Vec<(u32, u64)> = vec![(1, 0), (1, 184), (2, 11), (3, 1), (4, 0), (4, 1), (5, 0)];
    let ask = |(seqno, state_digest): (SeqNo, Digest)| {
        net.input(
            Principal::Exec(ReplicaId(1)),
            Message::FetchPages {
                seqno,
                state_digest,
                nodes: nodes.clone(),
                pages: wanted.clone(),
            },
            SealFor::One(Principal::Exec(ReplicaId(0))),
        )
    };
    for (k, cp) in cps.iter().enumerate() {
        // A member that executed up to this checkpoint only: what the answer must be.
        let mut reference = object_stage(&net, 2, &Storage::new());
        run(&net, &mut reference, &batches[..4 * (k + 1)]);
        let ref_pages = reference.service.pages().unwrap();
        let ref_tree = &reference.paged.as_ref().unwrap().tree;
        let mut out = Vec::new();
        a.handle(1, ask(*cp), &mut out);
        let answers = page_answers(&out);
        assert_eq!(answers.len(), 1, "checkpoint {} is served", cp.0 .0);
        let expected_nodes: Vec<_> = nodes
            .iter()
            .filter_map(|n| Some((*n, ref_tree.children(*n)?.to_vec())))
            .collect();
        assert_eq!(answers[0].0, expected_nodes, "checkpoint {}'s tree", cp.0 .0);
        assert_eq!(
            answers[0].0.len(),
            5,
            "(4, 0) is the root: (4, 1) and (5, 0) do not exist"
        );
        let expected_pages: Vec<_> = wanted.iter().filter_map(|i| Some((*i, ref_pages.get(*i)?))).collect();
        assert_eq!(answers[0].1, expected_pages, "checkpoint {}'s pages", cp.0 .0);
        assert_eq!(
            answers[0].1.len(),
            wanted.len() - 1,
            "the page past the end is left out"
        );
    }
    assert_eq!(a.stats().get("fetch_pages_served_older"), 2);
    let mut out = Vec::new();
    a.handle(1, ask((cps[0].0, cps[1].1)), &mut out);
    assert!(page_answers(&out).is_empty());
    assert_eq!(a.stats().get("fetch_pages_stale"), 1);

    // Checkpoint 16 pushes checkpoint 4 out.
    let next = super::tests::chain_from(
        SeqNo(12),
        batches[11].history,
        (0..4)
            .map(|i| {
                vec![RequestEntry {
                    client: CLIENT,
                    request_id: RequestId(100 + i),
                    body: RequestBody::Inline(write_op(7, b"after")),
                }]
            })
            .collect(),
    );
    assert_eq!(checkpointed(&run(&net, &mut a, &next)).len(), 1);
    let mut out = Vec::new();
    a.handle(1, ask(cps[0]), &mut out);
    assert!(page_answers(&out).is_empty());
    assert_eq!(a.stats().get("fetch_pages_stale"), 2);
    a.handle(1, ask(cps[1]), &mut out);
    assert_eq!(page_answers(&out).len(), 1, "checkpoint 8 is still kept");
}

/// The object store, except that restoring any checkpoint fails.
struct Unrestorable(ObjectStore);

impl crate::service::Service for Unrestorable {
    fn execute(
        &mut self,
        context: &crate::service::BatchContext,
        requests: &[crate::service::ServiceRequest],
        effects: &mut crate::service::Effects,
    ) -> Vec<Bytes> {
        self.0.execute(context, requests, effects)
    }
    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        self.0.execute_read_only(operation)
    }
    fn checkpoint(&self) -> Bytes {
        self.0.checkpoint()
    }
    fn restore(&mut self, _checkpoint: &[u8]) -> Result<(), crate::service::RestoreError> {
        Err(crate::service::RestoreError("refused".into()))
    }
    fn pages(&self) -> Option<&crate::pages::Pages> {
        self.0.pages()
    }
    fn pages_mut(&mut self) -> Option<&mut crate::pages::Pages> {
        self.0.pages_mut()
    }
}

/// Pages installed by a transfer whose rest cannot be restored are no batch's state: the member
/// executes nothing on them.
#[test]
fn after_an_unrestorable_transfer_nothing_executes_on_the_installed_pages() {
    let net = Net::new(knobs());
    let (batches, _) = workload();
    let mut a = object_stage(&net, 0, &Storage::new());
    let out_a = run(&net, &mut a, &batches[..12]);
    let (seqno, digest) = *checkpointed(&out_a).last().unwrap();
    let mut b = net.stage(
        1,
        &Storage::new(),
        Box::new(Unrestorable(ObjectStore::new(OBJECTS, SIZE))),
    );
    run(&net, &mut b, &batches[..4]);
    let out = load_from_two_orders(&net, &mut b, seqno, digest);
    pump(&net, &mut a, &mut b, out, 10);
    for tick in 1..20 {
        if b.stats().get("state_transfer_unrestorable") > 0 {
            break;
        }
        let mut out = Vec::new();
        b.handle(tick * 300_000, Input::Timer(Timer::ExecRetry), &mut out);
        pump(&net, &mut a, &mut b, out, tick * 300_000);
    }
    assert_eq!(b.stats().get("state_transfer_unrestorable"), 1, "{:?}", b.stats());
    assert!(b.state_is_partial());
    assert_eq!(b.last_executed().0, SeqNo(4));
    // Batch 5 is next for b, but its pages are checkpoint 12's: it is not executed.
    assert!(executed(&run(&net, &mut b, &batches[4..5])).is_empty());
}

/// A paged transfer that is getting its pages goes on when a newer checkpoint is agreed (as an
/// unpaged one does, `tests_recovery.rs`): restarting it for every newer LOAD-CP left a member
/// behind for good in `upright-sim --twins --service paged-kv` (seeds 43, 73, 260, 476 of a
/// session-28 soak).
#[test]
fn a_paged_transfer_that_gets_its_pages_is_not_restarted_for_a_newer_checkpoint() {
    let net = Net::new(knobs());
    let (batches, _) = workload();
    let mut a = object_stage(&net, 0, &Storage::new());
    let cps = checkpointed(&run(&net, &mut a, &batches[..12]));
    let (older, older_digest) = cps[cps.len() - 2];
    let (newest, newest_digest) = cps[cps.len() - 1];
    let mut b = object_stage(&net, 1, &Storage::new());
    run(&net, &mut b, &batches[..2]);
    let out = load_from_two_orders(&net, &mut b, older, older_digest);
    // Only exec 0's answers are delivered until the paged phase begins (the liar and the
    // retries stay out of it).
    let mut log = Vec::new();
    let mut pending = out;
    let mut tick = 1;
    while !b.installing_pages() && tick < 20 {
        let mut queue: std::collections::VecDeque<Action> = std::mem::take(&mut pending).into();
        while let Some(action) = queue.pop_front() {
            let Action::Send { to, envelope } = action else {
                continue;
            };
            if !to.contains(&Principal::Exec(ReplicaId(0))) || b.installing_pages() {
                continue;
            }
            let mut answer = Vec::new();
            a.handle(tick * 300_000, Input::Message(envelope), &mut answer);
            for reply in answer {
                if let Action::Send { envelope, .. } = reply {
                    let mut more = Vec::new();
                    b.handle(tick * 300_000, Input::Message(envelope), &mut more);
                    queue.extend(more);
                }
            }
        }
        if !b.installing_pages() {
            b.handle(tick * 300_000, Input::Timer(Timer::ExecRetry), &mut pending);
            tick += 1;
        }
    }
    assert!(b.installing_pages(), "in the paged phase: {:?}", b.stats());
    let newer = load_from_two_orders(&net, &mut b, newest, newest_digest);
    assert!(super::tests::sent(&newer).is_empty(), "no second transfer");
    assert_eq!(b.stats().get("state_transfer_newer_deferred"), 1);
    assert_eq!(b.transfer.as_ref().map(|t| t.seqno()), Some(older));
    retry_until_loaded(&net, &mut a, &mut b, &mut log, tick);
    assert!(
        log.iter()
            .any(|a| matches!(a, Action::Note(Event::StateLoaded { seqno, .. }) if *seqno == older)),
        "{:?}",
        b.stats()
    );
    assert_eq!(b.stats().get("state_transfer_started"), 1);
}
