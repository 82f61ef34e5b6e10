//! Unit tests of the execution stage: normal case. Messages are hand-built and sealed with real
//! key rings; the cluster is `u = 1, r = 1` (4 replicas, 3 execution members, NEXT-BATCH quorum 2).

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::reply_cache::SMALL_REPLY_BYTES;
use super::ExecStage;
use crate::config::{ClientInfo, ClusterConfig, Knobs, ReplicaInfo};
use crate::crypto::{Digest, KeyRing, SecretKeys};
use crate::ids::{ClientId, Principal, Process, ReplicaId, RequestId, SeqNo, StageKind, View};
use crate::kv::{KvOperation, KvReply, KvService};
use crate::message::{batch_digest, history_digest, Envelope, Message, ReplyBody, RequestBody, RequestEntry, SealFor};
use crate::quorum::Quorums;
use crate::service::{BatchContext, Effects, RestoreError, Service, ServiceRequest};
use crate::stage::{Action, Event, Input, Stage, Storage};

/// Client used by most tests.
pub(super) const CLIENT: ClientId = ClientId(7);

/// A test cluster: configuration and every replica's and client's key ring.
pub(super) struct Net {
    pub config: Arc<ClusterConfig>,
    pub q: Quorums,
    pub rings: Vec<Arc<KeyRing>>,
    pub client_rings: Vec<KeyRing>,
}

impl Net {
    pub fn new(knobs: Knobs) -> Net {
        let secrets: Vec<SecretKeys> = (0..4).map(|i| SecretKeys::from_seed([i as u8 + 1; 32])).collect();
        let clients: Vec<(ClientId, SecretKeys)> = [7u32, 8]
            .iter()
            .map(|&c| (ClientId(c), SecretKeys::from_seed([100 + c as u8; 32])))
            .collect();
        let config = ClusterConfig {
            cluster_name: "exec-test".into(),
            u: 1,
            r: 1,
            replicas: secrets
                .iter()
                .enumerate()
                .map(|(i, s)| ReplicaInfo {
                    id: ReplicaId(i as u32),
                    keys: s.public(),
                })
                .collect(),
            clients: clients
                .iter()
                .map(|(id, s)| ClientInfo {
                    id: *id,
                    keys: s.public(),
                })
                .collect(),
            knobs,
            admin: None,
            epoch: 0,
            origin: None,
            protocol: Default::default(),
            selective_execution: false,
            separate_stages: false,
            exec_u: None,
        };
        let q = config.validate().unwrap();
        let rings = (0..4)
            .map(|i| {
                Arc::new(KeyRing::new(
                    &config,
                    Process::Replica(ReplicaId(i)),
                    &secrets[i as usize],
                ))
            })
            .collect();
        let client_rings = clients
            .iter()
            .map(|(id, s)| KeyRing::new(&config, Process::Client(*id), s))
            .collect();
        Net {
            config: Arc::new(config),
            q,
            rings,
            client_rings,
        }
    }

    /// Default knobs, checkpoints every 4 batches.
    pub fn small() -> Net {
        Net::new(Knobs {
            checkpoint_interval: 4,
            log_window: 8,
            ..Knobs::default()
        })
    }

    pub fn stage(&self, id: u32, storage: &Storage, service: Box<dyn Service + Send>) -> ExecStage {
        let mut stage = ExecStage::new(
            self.config.clone(),
            ReplicaId(id),
            self.rings[id as usize].clone(),
            storage,
            service,
        )
        .unwrap();
        let mut out = Vec::new();
        stage.handle(0, Input::Start, &mut out);
        stage
    }

    pub fn kv_stage(&self, id: u32) -> ExecStage {
        self.stage(id, &Storage::new(), Box::new(KvService::new()))
    }

    /// PUSH-RESUME from client 8 (client ring 1) for its own pushes from `next` and `streams`.
    pub fn resume_of_client_8(&self, next: u64, streams: Vec<(Bytes, u64)>) -> Input {
        let client = ClientId(8);
        let message = Message::PushResume { client, next, streams };
        let from = Principal::Client(client);
        let envelope = Envelope::seal(
            &self.client_rings[1],
            &self.q,
            from,
            message,
            SealFor::Stage(StageKind::Exec),
        );
        Input::Message(Arc::new(envelope))
    }

    /// A message from `from` sealed with its replica's keys.
    pub fn input(&self, from: Principal, message: Message, seal: SealFor) -> Input {
        let ring = &self.rings[from.replica().expect("replica").0 as usize];
        Input::Message(Arc::new(Envelope::seal(ring, &self.q, from, message, seal)))
    }

    pub fn next_batch(&self, order: u32, batch: &TestBatch) -> Input {
        let message = Message::NextBatch {
            view: View(0),
            seqno: batch.seqno,
            history: batch.history,
            time_us: batch.time_us,
            entries: batch.entries.clone(),
        };
        self.input(
            Principal::Order(ReplicaId(order)),
            message,
            SealFor::Stage(StageKind::Exec),
        )
    }

    /// The batch from order members 0 and 1 (a quorum).
    pub fn deliver(&self, stage: &mut ExecStage, batch: &TestBatch) -> Vec<Action> {
        let mut out = Vec::new();
        stage.handle(1, self.next_batch(0, batch), &mut out);
        stage.handle(1, self.next_batch(1, batch), &mut out);
        out
    }
}

/// A batch with its history digest, built by [`chain`].
#[derive(Clone, Debug)]
pub(super) struct TestBatch {
    pub seqno: SeqNo,
    pub history: Digest,
    pub time_us: u64,
    pub entries: Vec<RequestEntry>,
}

/// Batches 1, 2, ... with their history chain from `H_0`.
pub(super) fn chain(batches: Vec<Vec<RequestEntry>>) -> Vec<TestBatch> {
    chain_from(SeqNo(0), Digest::default(), batches)
}

pub(super) fn chain_from(start: SeqNo, mut history: Digest, batches: Vec<Vec<RequestEntry>>) -> Vec<TestBatch> {
    let mut out = Vec::new();
    for (i, entries) in batches.into_iter().enumerate() {
        let seqno = SeqNo(start.0 + i as u64 + 1);
        let time_us = 1000 * seqno.0;
        history = history_digest(
            &history,
            &batch_digest(time_us, entries.iter().map(RequestEntry::digest)),
        );
        out.push(TestBatch {
            seqno,
            history,
            time_us,
            entries,
        });
    }
    out
}

pub(super) fn inline(client: ClientId, request_id: u64, op: KvOperation) -> RequestEntry {
    RequestEntry {
        client,
        request_id: RequestId(request_id),
        body: RequestBody::Inline(op.encode()),
    }
}

pub(super) fn put(request_id: u64, key: &str, value: &str) -> RequestEntry {
    inline(
        CLIENT,
        request_id,
        KvOperation::Put {
            key: key.to_string().into(),
            value: value.to_string().into(),
        },
    )
}

pub(super) fn append(client: ClientId, request_id: u64, key: &str, value: &str) -> RequestEntry {
    inline(
        client,
        request_id,
        KvOperation::Append {
            key: key.to_string().into(),
            value: value.to_string().into(),
        },
    )
}

pub(super) fn executed(out: &[Action]) -> Vec<SeqNo> {
    out.iter()
        .filter_map(|a| match a {
            Action::Note(Event::Executed { seqno, .. }) => Some(*seqno),
            _ => None,
        })
        .collect()
}

/// Every sent message with its recipients.
pub(super) fn sent(out: &[Action]) -> Vec<(Vec<Principal>, Message)> {
    out.iter()
        .filter_map(|a| match a {
            Action::Send { to, envelope } => Some((to.clone(), envelope.message.clone())),
            _ => None,
        })
        .collect()
}

/// Replies sent to `client`: (request id, body).
pub(super) fn replies(out: &[Action], client: ClientId) -> Vec<(RequestId, ReplyBody)> {
    sent(out)
        .into_iter()
        .filter(|(to, _)| to == &vec![Principal::Client(client)])
        .filter_map(|(_, m)| match m {
            Message::Reply { request_id, result, .. } => Some((request_id, result)),
            _ => None,
        })
        .collect()
}

/// A service that records every batch it executes, around a key-value store; with an alarm set,
/// it asks to be woken then, and pushes "rang" to [`CLIENT`] when it is.
pub(super) struct SpyService {
    pub kv: KvService,
    pub calls: Calls,
    pub alarm: Option<u64>,
}

impl Service for SpyService {
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], effects: &mut Effects) -> Vec<Bytes> {
        let ids = requests.iter().map(|r| (r.client, r.request_id)).collect();
        self.calls.lock().unwrap().push((context.seqno, ids));
        self.kv.execute(context, requests, effects)
    }
    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        self.kv.execute_read_only(operation)
    }
    fn checkpoint(&self) -> Bytes {
        self.kv.checkpoint()
    }
    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError> {
        self.kv.restore(checkpoint)
    }
    fn wake_at(&self) -> Option<u64> {
        self.alarm
    }
    fn wake(&mut self, _context: &BatchContext, effects: &mut Effects) {
        self.alarm = None;
        effects.push(CLIENT, Bytes::from_static(b"rang"));
    }
}

pub(super) type Calls = Arc<Mutex<Vec<(SeqNo, Vec<(ClientId, RequestId)>)>>>;

/// A value whose result is longer than `SMALL_REPLY_BYTES` (sent in full only by the designated member).
const LONG_RESULT: &str = "012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789";

fn spy_stage(net: &Net, id: u32) -> (ExecStage, Calls) {
    let calls: Calls = Arc::default();
    let spy = SpyService {
        kv: KvService::new(),
        calls: calls.clone(),
        alarm: None,
    };
    (net.stage(id, &Storage::new(), Box::new(spy)), calls)
}

#[test]
fn needs_r_plus_one_matching_next_batches() {
    let net = Net::small();
    let mut stage = net.kv_stage(0);
    let batches = chain(vec![vec![put(1, "a", "1")]]);
    let mut out = Vec::new();
    // r = 1 copy, even repeated, is not enough.
    stage.handle(1, net.next_batch(1, &batches[0]), &mut out);
    stage.handle(1, net.next_batch(1, &batches[0]), &mut out);
    assert!(executed(&out).is_empty());
    assert_eq!(stage.stats().get("next_batch_duplicate"), 1);
    // A conflicting copy (other time, so other digest and history) does not count either.
    let mut other = chain(vec![vec![put(1, "a", "1")]]).remove(0);
    other.time_us += 1;
    other.history = history_digest(
        &Digest::default(),
        &batch_digest(other.time_us, other.entries.iter().map(|e| e.digest())),
    );
    stage.handle(1, net.next_batch(2, &other), &mut out);
    assert!(executed(&out).is_empty());
    // A second matching copy from a distinct order member completes the quorum.
    stage.handle(1, net.next_batch(3, &batches[0]), &mut out);
    assert_eq!(executed(&out), vec![SeqNo(1)]);
    assert_eq!(stage.last_executed(), (SeqNo(1), batches[0].history));
    // BATCH-COMPLETE to the co-located auth member only.
    let complete: Vec<_> = sent(&out)
        .into_iter()
        .filter(|(_, m)| matches!(m, Message::BatchComplete { .. }))
        .collect();
    assert_eq!(complete.len(), 1);
    assert_eq!(complete[0].0, vec![Principal::Auth(ReplicaId(0))]);
    assert_eq!(
        complete[0].1,
        Message::BatchComplete {
            seqno: SeqNo(1),
            requests: vec![(CLIENT, RequestId(1))]
        }
    );
}

#[test]
fn executes_in_order_despite_out_of_order_arrival_and_null_batches() {
    let net = Net::small();
    let (mut stage, calls) = spy_stage(&net, 0);
    let batches = chain(vec![vec![put(1, "a", "1")], vec![], vec![put(2, "b", "2")]]);
    let mut out = net.deliver(&mut stage, &batches[2]);
    out.extend(net.deliver(&mut stage, &batches[1]));
    assert!(executed(&out).is_empty(), "batch 1 is missing");
    out.extend(net.deliver(&mut stage, &batches[0]));
    assert_eq!(executed(&out), vec![SeqNo(1), SeqNo(2), SeqNo(3)]);
    assert_eq!(stage.last_executed(), (SeqNo(3), batches[2].history));
    // The null batch did not call the service.
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            (SeqNo(1), vec![(CLIENT, RequestId(1))]),
            (SeqNo(3), vec![(CLIENT, RequestId(2))])
        ]
    );
}

#[test]
fn history_chain_is_checked_when_previous_is_known() {
    let net = Net::small();
    let mut stage = net.kv_stage(0);
    let mut bad = chain(vec![vec![put(1, "a", "1")]]).remove(0);
    bad.history = Digest::of(b"not chained to H_0");
    let out = net.deliver(&mut stage, &bad);
    assert!(executed(&out).is_empty());
    assert_eq!(stage.stats().get("next_batch_history_mismatch"), 2);
}

#[test]
fn far_future_batches_are_dropped_and_counted() {
    let net = Net::small();
    let mut stage = net.kv_stage(0);
    let batches = chain(vec![vec![]; 10]);
    let mut out = Vec::new();
    stage.handle(1, net.next_batch(0, &batches[9]), &mut out); // seqno 10 > 0 + log_window 8
    assert_eq!(stage.stats().get("next_batch_beyond_window"), 1);
    assert_eq!(stage.batches.buffered(), 0);
    stage.handle(1, net.next_batch(0, &batches[7]), &mut out); // seqno 8 is within
    assert_eq!(stage.batches.buffered(), 1);
}

#[test]
fn forged_or_misdirected_messages_are_dropped() {
    let net = Net::small();
    let mut stage = net.kv_stage(0);
    let batch = &chain(vec![vec![put(1, "a", "1")]])[0];
    let message = Message::NextBatch {
        view: View(0),
        seqno: batch.seqno,
        history: batch.history,
        time_us: batch.time_us,
        entries: batch.entries.clone(),
    };
    let mut out = Vec::new();
    // Correctly sealed, but an authentication member may not send NEXT-BATCH.
    for from in [
        Principal::Auth(ReplicaId(1)),
        Principal::Auth(ReplicaId(2)),
        Principal::Exec(ReplicaId(1)),
    ] {
        stage.handle(
            1,
            net.input(from, message.clone(), SealFor::Stage(StageKind::Exec)),
            &mut out,
        );
    }
    assert_eq!(stage.stats().get("wrong_sender"), 3);
    // From a client (sealed with its own keys).
    let client_env = Envelope::seal(
        &net.client_rings[0],
        &net.q,
        Principal::Client(CLIENT),
        message.clone(),
        SealFor::Stage(StageKind::Exec),
    );
    stage.handle(1, Input::Message(Arc::new(client_env)), &mut out);
    assert_eq!(stage.stats().get("wrong_sender"), 4);
    // Claims to be order member 2 but sealed with replica 3's keys: bad seal.
    let forged = Envelope::seal(
        &net.rings[3],
        &net.q,
        Principal::Order(ReplicaId(2)),
        message.clone(),
        SealFor::Stage(StageKind::Exec),
    );
    stage.handle(1, Input::Message(Arc::new(forged)), &mut out);
    assert_eq!(stage.stats().get("bad_seal"), 1);
    // One genuine copy is still not a quorum: the forgeries did not count.
    stage.handle(1, net.next_batch(1, batch), &mut out);
    assert!(executed(&out).is_empty());
    stage.handle(1, net.next_batch(0, batch), &mut out);
    assert_eq!(executed(&out), vec![SeqNo(1)]);
}

#[test]
fn digest_bodies_are_fetched_and_verified() {
    let net = Net::small();
    let mut stage = net.kv_stage(0);
    let client = ClientId(8);
    let op = KvOperation::Put {
        key: "big".into(),
        value: Bytes::from(vec![b'x'; 100]),
    }
    .encode();
    let entry = RequestEntry {
        client,
        request_id: RequestId(1),
        body: RequestBody::Digest(Digest::of(&op)),
    };
    let batches = chain(vec![vec![entry.clone()]]);
    let out = net.deliver(&mut stage, &batches[0]);
    assert!(executed(&out).is_empty(), "body missing");
    let fetch = Message::Fetch {
        client,
        request_id: RequestId(1),
        operation_digest: Digest::of(&op),
    };
    // First to auth member client mod n_auth = 8 mod 4 = 0.
    assert_eq!(sent(&out), vec![(vec![Principal::Auth(ReplicaId(0))], fetch.clone())]);
    // On retry, to every auth member.
    let mut out = Vec::new();
    stage.handle(300_000, Input::Timer(crate::stage::Timer::ExecRetry), &mut out);
    let retries: Vec<_> = sent(&out).into_iter().filter(|(_, m)| m == &fetch).collect();
    assert_eq!(retries.len(), 1);
    assert_eq!(retries[0].0.len(), 4);
    // A wrong body is rejected.
    let command = |operation: Bytes| Message::Command {
        client,
        request_id: RequestId(1),
        operation,
    };
    let wrong = KvOperation::Put {
        key: "big".into(),
        value: "evil".into(),
    }
    .encode();
    let mut out = Vec::new();
    stage.handle(
        2,
        net.input(
            Principal::Auth(ReplicaId(0)),
            command(wrong),
            SealFor::Stage(StageKind::Exec),
        ),
        &mut out,
    );
    assert_eq!(stage.stats().get("command_wrong_digest"), 1);
    assert!(executed(&out).is_empty());
    // A COMMAND from a non-auth principal is dropped.
    stage.handle(
        2,
        net.input(
            Principal::Order(ReplicaId(1)),
            command(op.clone()),
            SealFor::One(stage.me()),
        ),
        &mut out,
    );
    assert_eq!(stage.stats().get("wrong_sender"), 1);
    assert!(executed(&out).is_empty());
    // The right body (from any auth member, MAC-sealed) executes the batch.
    stage.handle(
        2,
        net.input(Principal::Auth(ReplicaId(2)), command(op), SealFor::One(stage.me())),
        &mut out,
    );
    assert_eq!(executed(&out), vec![SeqNo(1)]);
    assert_eq!(
        replies(&out, client),
        vec![(RequestId(1), ReplyBody::Full(KvReply::Done.encode()))]
    );
    assert_eq!(stage.fetcher.len(), 0);
}

#[test]
fn fetches_move_on_from_an_auth_member_that_did_not_answer() {
    let net = Net::small();
    let mut stage = net.kv_stage(0);
    let client = ClientId(8);
    let body = |request_id: u64| {
        let op = KvOperation::Put {
            key: format!("big{request_id}").into(),
            value: Bytes::from(vec![b'x'; 100]),
        }
        .encode();
        let entry = RequestEntry {
            client,
            request_id: RequestId(request_id),
            body: RequestBody::Digest(Digest::of(&op)),
        };
        (op, entry)
    };
    let fetched_from = |out: &[Action]| -> Vec<Vec<Principal>> {
        sent(out)
            .into_iter()
            .filter(|(_, m)| matches!(m, Message::Fetch { .. }))
            .map(|(to, _)| to)
            .collect()
    };
    let command = |request_id: u64, operation: Bytes| Message::Command {
        client,
        request_id: RequestId(request_id),
        operation,
    };
    let (op1, e1) = body(1);
    let (op2, e2) = body(2);
    let (op3, e3) = body(3);
    let batches = chain(vec![vec![e1.clone()], vec![e2.clone()], vec![e3.clone()]]);
    // Client 8's preferred quorum is auth members 0, 1 and 2 (from 8 mod 4); the co-located
    // member 0 is one of them, so it is asked alone first. It does not answer.
    let out = net.deliver(&mut stage, &batches[0]);
    assert_eq!(fetched_from(&out), vec![vec![Principal::Auth(ReplicaId(0))]]);
    // The retry tick asks everyone, and moves the first choice on.
    let mut out = Vec::new();
    stage.handle(300_000, Input::Timer(crate::stage::Timer::ExecRetry), &mut out);
    assert_eq!(fetched_from(&out).len(), 1);
    assert_eq!(fetched_from(&out)[0].len(), 4);
    assert_eq!(stage.stats().get("fetch_first_moved"), 1);
    let mut out = Vec::new();
    let me = stage.me();
    let from_1 = |m| net.input(Principal::Auth(ReplicaId(1)), m, SealFor::One(me));
    stage.handle(300_001, from_1(command(1, op1)), &mut out);
    assert_eq!(executed(&out), vec![SeqNo(1)]);
    // Member 0 is now a suspect: the next body is asked of two members of the preferred quorum
    // at once, from (client + fetch_from) mod 4 = 1 on.
    let both = vec![vec![Principal::Auth(ReplicaId(1)), Principal::Auth(ReplicaId(2))]];
    let out = net.deliver(&mut stage, &batches[1]);
    assert_eq!(fetched_from(&out), both);
    let mut out = Vec::new();
    stage.handle(300_002, from_1(command(2, op2)), &mut out);
    assert_eq!(executed(&out), vec![SeqNo(2)]);
    // A retry tick with nothing missing leaves the choice where it is.
    stage.handle(600_000, Input::Timer(crate::stage::Timer::ExecRetry), &mut Vec::new());
    assert_eq!(stage.stats().get("fetch_first_moved"), 1);
    let out = net.deliver(&mut stage, &batches[2]);
    assert_eq!(fetched_from(&out), both);
    let mut out = Vec::new();
    stage.handle(600_001, from_1(command(3, op3)), &mut out);
    assert_eq!(executed(&out), vec![SeqNo(3)]);
    // Member 0 answers a COMMAND again (to the retry tick's fetch): no longer a suspect, it is
    // asked alone again.
    let from_0 = |m| net.input(Principal::Auth(ReplicaId(0)), m, SealFor::One(me));
    let (op4, e4) = body(4);
    stage.handle(600_002, from_0(command(4, op4)), &mut Vec::new());
    let fourth = chain(vec![vec![e1], vec![e2], vec![e3], vec![e4]]);
    let out = net.deliver(&mut stage, &fourth[3]);
    assert_eq!(fetched_from(&out), vec![vec![Principal::Auth(ReplicaId(0))]]);
}

#[test]
fn reply_is_full_from_the_designated_member_and_for_small_results() {
    let net = Net::small();
    let long = LONG_RESULT;
    // n_exec - r = 2 designated repliers from (client + request id) mod 3: members 2 and 0 for
    // request 1 ((7 + 1) mod 3 = 2), members 0 and 1 for request 2; any 2 replies hold a body.
    let batches = chain(vec![
        vec![append(CLIENT, 1, "k", long)],
        vec![append(CLIENT, 2, "k", "!")],
        vec![put(3, "s", "v")],
    ]);
    let mut stages: Vec<ExecStage> = (0..3).map(|i| net.kv_stage(i)).collect();
    let outs: Vec<Vec<Action>> = stages
        .iter_mut()
        .map(|s| batches.iter().flat_map(|b| net.deliver(s, b)).collect())
        .collect();
    let result1 = KvReply::Value(Some(long.into())).encode();
    let result2 = KvReply::Value(Some(format!("{long}!").into())).encode();
    assert!(result1.len() > SMALL_REPLY_BYTES);
    let full1 = ReplyBody::Full(result1.clone());
    let digest1 = ReplyBody::Digest(Digest::of(&result1));
    let full2 = ReplyBody::Full(result2.clone());
    let digest2 = ReplyBody::Digest(Digest::of(&result2));
    let small = ReplyBody::Full(KvReply::Done.encode());
    assert_eq!(
        replies(&outs[0], CLIENT),
        vec![
            (RequestId(1), full1.clone()),
            (RequestId(2), full2.clone()),
            (RequestId(3), small.clone())
        ]
    );
    assert_eq!(
        replies(&outs[1], CLIENT),
        vec![
            (RequestId(1), digest1),
            (RequestId(2), full2),
            (RequestId(3), small.clone())
        ]
    );
    assert_eq!(
        replies(&outs[2], CLIENT),
        vec![(RequestId(1), full1), (RequestId(2), digest2), (RequestId(3), small)]
    );
}

/// RETRANSMIT of `request_id` from `from` to exec member 1.
fn retransmit(net: &Net, from: Principal, request_id: u64) -> Input {
    let message = Message::Retransmit {
        client: CLIENT,
        request_id: RequestId(request_id),
    };
    net.input(from, message, SealFor::One(Principal::Exec(ReplicaId(1))))
}

#[test]
fn retransmit_resends_the_cached_reply_in_full() {
    let net = Net::small();
    let long = LONG_RESULT;
    let mut stage = net.kv_stage(1);
    // (7 + 1) mod 3 = 2: members 2 and 0 are the designated repliers, member 1 sends a digest of
    // the long result.
    let batch = &chain(vec![vec![append(CLIENT, 1, "k", long)]])[0];
    let out = net.deliver(&mut stage, batch);
    let result = KvReply::Value(Some(long.into())).encode();
    assert_eq!(
        replies(&out, CLIENT),
        vec![(RequestId(1), ReplyBody::Digest(Digest::of(&result)))]
    );
    // On RETRANSMIT from an order member: in full.
    let mut out = Vec::new();
    stage.handle(5, retransmit(&net, Principal::Order(ReplicaId(3)), 1), &mut out);
    assert_eq!(
        replies(&out, CLIENT),
        vec![(RequestId(1), ReplyBody::Full(result.clone()))]
    );
    // Not again right away (every order member forwards the same retransmission), not for
    // another request, not from a non-order sender.
    let mut out = Vec::new();
    stage.handle(6, retransmit(&net, Principal::Order(ReplicaId(0)), 1), &mut out);
    stage.handle(6, retransmit(&net, Principal::Order(ReplicaId(0)), 2), &mut out);
    stage.handle(1_000_000, retransmit(&net, Principal::Auth(ReplicaId(0)), 1), &mut out);
    assert!(replies(&out, CLIENT).is_empty());
    assert_eq!(stage.stats().get("retransmit_rate_limited"), 1);
    assert_eq!(stage.stats().get("retransmit_not_cached"), 1);
    assert_eq!(stage.stats().get("wrong_sender"), 1);
    // Later it is answered again.
    stage.handle(2_000_000, retransmit(&net, Principal::Order(ReplicaId(2)), 1), &mut out);
    assert_eq!(replies(&out, CLIENT), vec![(RequestId(1), ReplyBody::Full(result))]);
    // The pace is per request: the client's next request, retransmitted right after, is
    // answered at once.
    let batches = chain(vec![
        vec![append(CLIENT, 1, "k", long)],
        vec![append(CLIENT, 2, "k", "x")],
    ]);
    net.deliver(&mut stage, &batches[1]);
    let mut out = Vec::new();
    stage.handle(2_000_001, retransmit(&net, Principal::Order(ReplicaId(2)), 2), &mut out);
    assert_eq!(replies(&out, CLIENT).len(), 1, "{:?}", stage.stats());
    assert_eq!(stage.stats().get("retransmit_rate_limited"), 1);
}

#[test]
fn duplicate_requests_are_not_executed_again() {
    let net = Net::small();
    let (mut stage, calls) = spy_stage(&net, 0);
    let client = ClientId(8);
    let batches = chain(vec![
        vec![append(client, 1, "k", "a")],
        // Request 1 again (with the same body), then request 2, then request 2 again in the same batch.
        vec![
            append(client, 1, "k", "a"),
            append(client, 2, "k", "b"),
            append(client, 2, "k", "b"),
        ],
        // Only duplicates: the service is not called.
        vec![append(client, 2, "k", "b")],
    ]);
    let mut out = Vec::new();
    for b in &batches {
        out.extend(net.deliver(&mut stage, b));
    }
    assert_eq!(executed(&out), vec![SeqNo(1), SeqNo(2), SeqNo(3)]);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        vec![
            (SeqNo(1), vec![(client, RequestId(1))]),
            (SeqNo(2), vec![(client, RequestId(2))])
        ]
    );
    // The cached replies were resent for the duplicates (request 1 in batch 2, request 2 in batch 3).
    let value = |s: &str| ReplyBody::Full(KvReply::Value(Some(s.to_string().into())).encode());
    assert_eq!(
        replies(&out, client),
        vec![
            (RequestId(1), value("a")),
            (RequestId(1), value("a")),
            (RequestId(2), value("ab")),
            (RequestId(2), value("ab"))
        ]
    );
    assert_eq!(stage.stats().get("request_duplicate"), 3);
}

#[test]
fn last_executed_is_sent_on_start_and_when_not_progressing() {
    let net = Net::small();
    let mut stage = ExecStage::new(
        net.config.clone(),
        ReplicaId(1),
        net.rings[1].clone(),
        &Storage::new(),
        Box::new(KvService::new()),
    )
    .unwrap();
    let mut out = Vec::new();
    stage.handle(0, Input::Start, &mut out);
    let last_exec = |out: &[Action]| {
        sent(out)
            .into_iter()
            .filter(|(_, m)| m == &Message::LastExecuted { seqno: SeqNo(0) })
            .map(|(to, _)| to[0])
            .collect::<Vec<_>>()
    };
    assert_eq!(
        last_exec(&out),
        (0..4).map(|i| Principal::Order(ReplicaId(i))).collect::<Vec<_>>()
    );
    assert!(out.iter().any(|a| matches!(
        a,
        Action::SetTimer {
            timer: crate::stage::Timer::ExecRetry,
            at: 200_000
        }
    )));
    let mut out = Vec::new();
    stage.handle(200_000, Input::Timer(crate::stage::Timer::ExecRetry), &mut out);
    assert_eq!(last_exec(&out).len(), 4);
    // After progress, the next tick stays quiet.
    let batch = &chain(vec![vec![]])[0];
    net.deliver(&mut stage, batch);
    let mut out = Vec::new();
    stage.handle(400_000, Input::Timer(crate::stage::Timer::ExecRetry), &mut out);
    assert!(sent(&out)
        .iter()
        .all(|(_, m)| !matches!(m, Message::LastExecuted { .. })));
}

/// A watch set by client 8's ordered GET fires when client 7 writes the key: every execution
/// member sends the same numbered PUSH to client 8, and the push log travels in the checkpoint.
#[test]
fn a_write_pushes_to_the_watcher_numbered_the_same_at_every_member() {
    let net = Net::small();
    let watcher = ClientId(8);
    let get = inline(watcher, 1, KvOperation::Get { key: "a".into() });
    let batches = chain(vec![vec![get], vec![put(1, "a", "1")], vec![put(2, "a", "2")], vec![]]);
    let mut pushes_at = Vec::new();
    let mut checkpoints = Vec::new();
    for member in 0..3 {
        let mut stage = net.kv_stage(member);
        let out: Vec<Action> = batches.iter().flat_map(|b| net.deliver(&mut stage, b)).collect();
        let pushes: Vec<(Vec<Principal>, u64, Bytes)> = sent(&out)
            .into_iter()
            .filter_map(|(to, m)| match m {
                Message::Push { seq, payload, .. } => Some((to, seq, payload)),
                _ => None,
            })
            .collect();
        pushes_at.push(pushes);
        let digests: Vec<Digest> = out
            .iter()
            .filter_map(|a| match a {
                Action::Note(Event::Checkpointed { state_digest, .. }) => Some(*state_digest),
                _ => None,
            })
            .collect();
        checkpoints.push(digests);
    }
    let expected = crate::kv::KvEvent {
        key: "a".into(),
        value: Some("1".into()),
    };
    assert_eq!(
        pushes_at[0],
        vec![(vec![Principal::Client(watcher)], 1, expected.encode())],
        "one push, for the first write only (a watch fires once)"
    );
    assert!(
        pushes_at.iter().all(|p| *p == pushes_at[0]),
        "every member pushes the same"
    );
    assert_eq!(checkpoints[0].len(), 1, "checkpoint at batch 4");
    assert!(checkpoints.iter().all(|c| *c == checkpoints[0]));
    let mut stage = net.kv_stage(0);
    for b in &batches {
        net.deliver(&mut stage, b);
    }
    let next = stage.pushes.to_sorted();
    assert_eq!(
        next,
        vec![(
            watcher,
            super::pushes::ClientPushes {
                next_seq: 2,
                kept: [(1, expected.encode())].into()
            }
        )]
    );
}

/// The service is woken by the first batch whose agreed time reached its `wake_at`, an empty
/// heartbeat batch included, before that batch's requests; a null batch (time 0) wakes nothing.
#[test]
fn the_service_is_woken_at_the_agreed_time_by_a_heartbeat_batch() {
    let net = Net::small();
    let alarm = SpyService {
        kv: KvService::new(),
        calls: Calls::default(),
        alarm: Some(2_500),
    };
    let mut stage = net.stage(0, &Storage::new(), Box::new(alarm));
    // Batches at times 1000 (a put), 2000 (heartbeat), 3000 (heartbeat), 4000 (a put).
    let batches = chain(vec![vec![put(1, "a", "1")], vec![], vec![], vec![put(2, "a", "2")]]);
    let pushes = |out: &[Action]| -> Vec<(u64, Bytes)> {
        sent(out)
            .into_iter()
            .filter_map(|(_, m)| match m {
                Message::Push { seq, payload, .. } => Some((seq, payload)),
                _ => None,
            })
            .collect()
    };
    let out: Vec<Action> = batches[..2].iter().flat_map(|b| net.deliver(&mut stage, b)).collect();
    assert!(pushes(&out).is_empty(), "not yet: 2000 < 2500");
    let out = net.deliver(&mut stage, &batches[2]);
    assert_eq!(
        pushes(&out),
        vec![(1, Bytes::from_static(b"rang"))],
        "woken by the heartbeat at 3000"
    );
    let out = net.deliver(&mut stage, &batches[3]);
    assert!(pushes(&out).is_empty(), "woken once");
    assert_eq!(stage.stats().get("service_woken"), 1);
}

/// After a batch, an execution member tells every order member (WAKE-AT) when its service wants
/// to be woken, only when that changed; so the primary can order an empty batch then.
#[test]
fn the_order_stage_is_told_each_new_wake_up() {
    let net = Net::small();
    let alarm = SpyService {
        kv: KvService::new(),
        calls: Calls::default(),
        alarm: Some(2_500),
    };
    let mut stage = ExecStage::new(
        net.config.clone(),
        ReplicaId(0),
        net.rings[0].clone(),
        &Storage::new(),
        Box::new(alarm),
    )
    .unwrap();
    let batches = chain(vec![vec![put(1, "a", "1")], vec![], vec![], vec![put(2, "a", "2")]]);
    let wakes = |out: &[Action]| -> Vec<(Vec<Principal>, SeqNo, Option<u64>)> {
        sent(out)
            .into_iter()
            .filter_map(|(to, m)| match m {
                Message::WakeAt { seqno, at_us } => Some((to, seqno, at_us)),
                _ => None,
            })
            .collect()
    };
    let order: Vec<Principal> = ClusterConfig::order_members(&net.q).collect();
    let mut out = Vec::new();
    stage.handle(0, Input::Start, &mut out);
    let expected: Vec<_> = order.iter().map(|&to| (vec![to], SeqNo(0), Some(2_500))).collect();
    assert_eq!(
        wakes(&out),
        expected,
        "the first report, at start, goes to every order member"
    );
    let out = net.deliver(&mut stage, &batches[0]);
    assert!(wakes(&out).is_empty(), "unchanged: not sent again");
    let out = net.deliver(&mut stage, &batches[1]);
    assert!(wakes(&out).is_empty(), "unchanged: not sent again");
    let out = net.deliver(&mut stage, &batches[2]);
    let expected: Vec<_> = order.iter().map(|&to| (vec![to], SeqNo(3), None)).collect();
    assert_eq!(wakes(&out), expected, "woken: it now waits for nothing");
    let out = net.deliver(&mut stage, &batches[3]);
    assert!(wakes(&out).is_empty());
}
