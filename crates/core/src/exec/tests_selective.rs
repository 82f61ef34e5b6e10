//! Unit tests of selective execution (`selective.rs`): `u = r = 1`, three execution members, each
//! object kept by two; checkpoints every 4 batches.

use std::sync::Arc;

use bytes::Bytes;

use super::tests::{chain, inline, sent, Net, SpyService, TestBatch, CLIENT};
use super::ExecStage;
use crate::crypto::Digest;
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, SeqNo, StageKind};
use crate::kv::{KvEvent, KvOperation, KvReply, KvService};
use crate::message::{Message, ReplyBody, RequestEntry, SealFor};
use crate::service::Service;
use crate::stage::{Action, Event, Input, Stage, Storage, Timer};

/// The replies sent to `client`, each full result as the service gave it (unwrapped from the
/// positions of the streams its request announced, which every ordered reply under selective
/// execution carries).
fn replies(out: &[Action], client: ClientId) -> Vec<(RequestId, ReplyBody)> {
    let replies = super::tests::replies(out, client).into_iter();
    replies
        .map(|(id, body)| match body {
            ReplyBody::Full(b) => {
                let (_, result) = crate::message::unwrap_announced(&b).expect("a wrapped reply");
                (id, ReplyBody::Full(result))
            }
            digest => (id, digest),
        })
        .collect()
}

fn selective_net() -> Net {
    let mut net = Net::small();
    let mut config = (*net.config).clone();
    config.selective_execution = true;
    net.config = Arc::new(config);
    net
}

/// An object kept by members `keepers` (and not by the third).
fn key_kept_by(keepers: [usize; 2]) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| {
            let mut m = super::selector::maintainers(k.as_bytes(), 3, 2);
            m.sort();
            m == keepers
        })
        .expect("some key")
}

fn put_on(client: ClientId, id: u64, key: &str, value: &str) -> RequestEntry {
    inline(
        client,
        id,
        KvOperation::Put {
            key: key.to_string().into(),
            value: value.to_string().into(),
        },
    )
}

fn get_on(client: ClientId, id: u64, key: &str) -> RequestEntry {
    inline(
        client,
        id,
        KvOperation::Get {
            key: key.to_string().into(),
        },
    )
}

/// Delivers `batch` to every stage; returns each stage's actions.
fn deliver_all(net: &Net, stages: &mut [ExecStage], batch: &TestBatch) -> Vec<Vec<Action>> {
    stages.iter_mut().map(|s| net.deliver(s, batch)).collect()
}

/// Delivers `batches` in order to every stage; returns each stage's actions over all of them.
fn deliver_each(net: &Net, stages: &mut [ExecStage], batches: &[TestBatch]) -> Vec<Vec<Action>> {
    let mut outs: Vec<Vec<Action>> = vec![Vec::new(); stages.len()];
    for batch in batches {
        for (i, out) in deliver_all(net, stages, batch).into_iter().enumerate() {
            outs[i].extend(out);
        }
    }
    outs
}

/// The OBJECT-CPs in `out` as inputs from `from`, one per recipient.
fn object_cps(net: &Net, from: u32, out: &[Action]) -> Vec<(Principal, Input)> {
    out.iter()
        .filter_map(|a| match a {
            Action::Send { to, envelope } if matches!(envelope.message, Message::ObjectCheckpoint { .. }) => {
                Some((to[0], envelope.message.clone()))
            }
            _ => None,
        })
        .map(|(to, message)| {
            let input = net.input(Principal::Exec(ReplicaId(from)), message, SealFor::One(to));
            (to, input)
        })
        .collect()
}

fn checkpoint_digest(out: &[Action]) -> Option<(SeqNo, Digest)> {
    out.iter().find_map(|a| match a {
        Action::Note(Event::Checkpointed { seqno, state_digest }) => Some((*seqno, *state_digest)),
        _ => None,
    })
}

/// Hands every OBJECT-CP of `outs` (indexed by sender) to its recipient; returns the recipients'
/// actions.
fn exchange(net: &Net, stages: &mut [ExecStage], outs: &[Vec<Action>]) -> Vec<Vec<Action>> {
    let mut results: Vec<Vec<Action>> = vec![Vec::new(); stages.len()];
    for (from, out) in outs.iter().enumerate() {
        for (to, input) in object_cps(net, from as u32, out) {
            let Principal::Exec(ReplicaId(i)) = to else {
                panic!("to an execution member")
            };
            stages[i as usize].handle(2, input, &mut results[i as usize]);
        }
    }
    results
}

fn stages(net: &Net) -> Vec<ExecStage> {
    (0..3).map(|i| net.kv_stage(i)).collect()
}

#[test]
fn a_request_runs_on_its_two_maintainers_only_and_every_member_catches_up_at_the_checkpoint() {
    let net = selective_net();
    let mut stages = stages(&net);
    let on01 = key_kept_by([0, 1]);
    let on12 = key_kept_by([1, 2]);
    let batches = chain(vec![
        vec![put_on(CLIENT, 1, &on01, "a")],
        vec![put_on(ClientId(8), 1, &on12, "b")],
        vec![put_on(CLIENT, 2, &on12, "c")],
        vec![],
    ]);
    let outs = deliver_each(&net, &mut stages, &batches[..3]);
    // Client 7's first put: members 0 and 1 answer, member 2 skips it.
    let answered = |out: &[Action], client, id| replies(out, client).iter().any(|(r, _)| *r == RequestId(id));
    assert!(answered(&outs[0], CLIENT, 1) && answered(&outs[1], CLIENT, 1));
    assert!(!answered(&outs[2], CLIENT, 1));
    assert!(!answered(&outs[0], ClientId(8), 1) && !answered(&outs[0], CLIENT, 2));
    assert_eq!(stages[2].stats().get("requests_skipped"), 1);
    assert_eq!(stages[0].stats().get("requests_skipped"), 2);
    // Batch 4 is a checkpoint: each member sends OBJECT-CP and the skippers wait for them.
    let at_cp = deliver_all(&net, &mut stages, &batches[3]);
    assert_eq!(
        checkpoint_digest(&at_cp[1]).map(|c| c.0),
        Some(SeqNo(4)),
        "member 1 skipped nothing"
    );
    assert!(
        checkpoint_digest(&at_cp[0]).is_none(),
        "member 0 waits for the objects it skipped"
    );
    assert!(checkpoint_digest(&at_cp[2]).is_none());
    let after = exchange(&net, &mut stages, &at_cp);
    let digests: Vec<_> = [&after[0], &at_cp[1], &after[2]]
        .iter()
        .map(|out| checkpoint_digest(out).expect("checkpoint taken"))
        .collect();
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    assert_eq!(stages[0].stats().get("selective_sync_certified"), 1);
    assert_eq!(stages[0].stats().get("objects_installed"), 1);
    // Member 1 finished its checkpoint before anyone's copy arrived, needing none: it suspects
    // nobody, so it does not stand in for members 0 and 2 on the next request.
    let on02 = key_kept_by([0, 2]);
    let next = super::tests::chain_from(SeqNo(4), batches[3].history, vec![vec![put_on(CLIENT, 3, &on02, "d")]]);
    let outs = deliver_all(&net, &mut stages, &next[0]);
    assert!(!replies(&outs[1], CLIENT).iter().any(|(id, _)| *id == RequestId(3)));
    assert!(replies(&outs[0], CLIENT).iter().any(|(id, _)| *id == RequestId(3)));
}

/// Member 0 and two batches on an object it does not keep: a put by `CLIENT`, then client 8's
/// Get of it; the first delivered (and skipped).
fn member0_after_a_skipped_put(net: &Net) -> (ExecStage, Vec<TestBatch>) {
    let mut member0 = net.kv_stage(0);
    let on12 = key_kept_by([1, 2]);
    let batches = chain(vec![
        vec![put_on(CLIENT, 1, &on12, "x")],
        vec![get_on(ClientId(8), 1, &on12)],
        vec![put_on(CLIENT, 2, &on12, "y")],
    ]);
    let out = net.deliver(&mut member0, &batches[0]);
    assert!(replies(&out, CLIENT).is_empty(), "skipped");
    (member0, batches)
}

/// An order member's RETRANSMIT of client 8's request `request_id`.
fn retransmit_of_client_8(net: &Net, request_id: u64) -> Input {
    net.input(
        Principal::Order(ReplicaId(1)),
        Message::Retransmit {
            client: ClientId(8),
            request_id: RequestId(request_id),
        },
        SealFor::Stage(StageKind::Exec),
    )
}

#[test]
fn a_forced_request_runs_after_the_skipped_requests_it_depends_on() {
    let net = selective_net();
    let (mut member0, batches) = member0_after_a_skipped_put(&net);
    // The Get is skipped as well; its client's vote does not complete, so it retransmits.
    let out = net.deliver(&mut member0, &batches[1]);
    assert!(replies(&out, ClientId(8)).is_empty());
    let mut out = Vec::new();
    member0.handle(3, retransmit_of_client_8(&net, 1), &mut out);
    let got = replies(&out, ClientId(8));
    assert_eq!(
        got,
        vec![(
            RequestId(1),
            ReplyBody::Full(KvReply::Value(Some(Bytes::from_static(b"x"))).encode())
        )],
        "the forced Get ran after the put it depends on"
    );
    assert_eq!(member0.stats().get("requests_forced"), 1);
    assert_eq!(member0.stats().get("requests_replayed"), 2, "the put, then the Get");
}

/// A client whose maintainers disagree retransmits at once, usually before a member that skips
/// its request has it (the order members then pace the next RETRANSMIT at seconds): that member
/// remembers the RETRANSMIT, runs the request when it comes and answers it.
#[test]
fn a_retransmission_that_comes_before_its_request_is_answered_when_the_request_comes() {
    let net = selective_net();
    let (mut member0, batches) = member0_after_a_skipped_put(&net);
    let mut out = Vec::new();
    member0.handle(3, retransmit_of_client_8(&net, 1), &mut out);
    assert!(replies(&out, ClientId(8)).is_empty(), "not agreed here yet");
    assert_eq!(member0.stats().get("retransmit_not_cached"), 1);
    let out = net.deliver(&mut member0, &batches[1]);
    assert_eq!(
        replies(&out, ClientId(8)),
        vec![(
            RequestId(1),
            ReplyBody::Full(KvReply::Value(Some(Bytes::from_static(b"x"))).encode())
        )],
        "run and answered when it came"
    );
    assert_eq!(member0.stats().get("retransmit_answered_later"), 1);
    assert_eq!(member0.stats().get("requests_forced"), 1);
    // A RETRANSMIT of a request already answered is not remembered for later.
    let mut out = Vec::new();
    member0.handle(4, retransmit_of_client_8(&net, 0), &mut out);
    let out = net.deliver(&mut member0, &batches[2]);
    assert!(replies(&out, CLIENT).is_empty(), "skipped as usual");
    assert_eq!(member0.stats().get("retransmit_answered_later"), 1);
}

#[test]
fn a_lying_maintainer_is_not_believed_and_the_member_replays_what_it_lied_about() {
    let net = selective_net();
    let mut stages = stages(&net);
    let on12 = key_kept_by([1, 2]);
    let batches = chain(vec![vec![put_on(CLIENT, 1, &on12, "true")], vec![], vec![], vec![]]);
    let mut at_cp = Vec::new();
    for batch in &batches {
        at_cp = deliver_all(&net, &mut stages, batch);
    }
    // Member 2 lies about the object in its OBJECT-CP.
    for action in at_cp[2].iter_mut() {
        if let Action::Send { envelope, .. } = action {
            if let Message::ObjectCheckpoint {
                seqno,
                objects,
                replies,
                streams,
                ask,
            } = &envelope.message
            {
                let planted: Vec<_> = objects
                    .iter()
                    .map(|(name, _)| {
                        let mut kv = KvService::new();
                        kv.apply(&KvOperation::Put {
                            key: name.clone(),
                            value: Bytes::from_static(b"planted"),
                        });
                        (name.clone(), kv.object_state(name).flatten())
                    })
                    .collect();
                let message = Message::ObjectCheckpoint {
                    seqno: *seqno,
                    objects: planted,
                    replies: replies.clone(),
                    streams: streams.clone(),
                    ask: *ask,
                };
                *envelope = Arc::new(crate::message::Envelope::seal(
                    &net.rings[2],
                    &net.q,
                    Principal::Exec(ReplicaId(2)),
                    message,
                    SealFor::One(Principal::Exec(ReplicaId(0))),
                ));
            }
        }
    }
    let after = exchange(&net, &mut stages, &at_cp);
    // Both maintainers answered and disagree: member 0 replays the put at once instead of
    // waiting, and its checkpoint is the honest one.
    let replayed = checkpoint_digest(&after[0]).expect("checkpoint after the replay");
    assert_eq!(Some(replayed), checkpoint_digest(&at_cp[1]), "the honest state");
    assert_eq!(stages[0].stats().get("selective_sync_replayed"), 1);
    assert_eq!(stages[0].stats().get("requests_replayed_at_checkpoint"), 1);
    assert_eq!(
        stages[0].stats().get("objects_installed"),
        0,
        "the planted state is not installed"
    );
}

#[test]
fn a_silent_maintainer_is_waited_for_once_then_a_stand_in_runs_its_objects() {
    let net = selective_net();
    let mut stages = stages(&net);
    let on12 = key_kept_by([1, 2]);
    let on01 = key_kept_by([0, 1]);
    let batches = chain(vec![
        vec![put_on(CLIENT, 1, &on12, "a")],
        vec![],
        vec![],
        vec![],
        vec![put_on(CLIENT, 2, &on12, "b")],
        vec![put_on(ClientId(8), 1, &on01, "c")],
        vec![],
        vec![],
    ]);
    let mut at_cp = Vec::new();
    for batch in &batches[..4] {
        at_cp = deliver_all(&net, &mut stages, batch);
    }
    // Member 2 is silent: only member 1's OBJECT-CP reaches member 0.
    at_cp[2].clear();
    let after = exchange(&net, &mut stages, &at_cp);
    assert!(checkpoint_digest(&after[0]).is_none(), "one of two copies: wait");
    // Two retry ticks: the first asks again, the second replays.
    let mut out = Vec::new();
    stages[0].handle(5, Input::Timer(Timer::ExecRetry), &mut out);
    assert!(sent(&out)
        .iter()
        .any(|(_, m)| matches!(m, Message::ObjectCheckpoint { ask: true, .. })));
    assert!(checkpoint_digest(&out).is_none());
    stages[0].handle(6, Input::Timer(Timer::ExecRetry), &mut out);
    assert_eq!(
        checkpoint_digest(&out),
        checkpoint_digest(&at_cp[1]),
        "the honest state"
    );
    // Next interval: member 2 is suspected. Member 0, the first member after the object's
    // keepers {1, 2}, stands in for it: it runs the put at its turn and answers, so the client
    // still gets two replies, and has nothing to wait for at the checkpoint.
    let outs = deliver_each(&net, &mut stages, &batches[4..]);
    assert!(replies(&outs[0], CLIENT).iter().any(|(id, _)| *id == RequestId(2)));
    assert_eq!(
        checkpoint_digest(&outs[0]),
        checkpoint_digest(&outs[1]),
        "no wait, same state"
    );
    assert_eq!(stages[0].stats().get("selective_sync_replayed"), 1);
    assert_eq!(stages[0].stats().get("requests_replayed_at_checkpoint"), 1);
}

#[test]
fn read_only_requests_are_answered_only_by_members_that_maintain_what_they_read() {
    let net = selective_net();
    let mut stages = stages(&net);
    let on12 = key_kept_by([1, 2]);
    let ring = &net.client_rings[0];
    for (member, answers) in [(0u32, false), (1, true)] {
        let message = Message::ReadOnlyRequest {
            client: CLIENT,
            request_id: RequestId(1),
            operation: KvOperation::Get {
                key: on12.clone().into(),
            }
            .encode(),
        };
        let envelope = crate::message::Envelope::seal(
            ring,
            &net.q,
            Principal::Client(CLIENT),
            message,
            SealFor::Stage(StageKind::Exec),
        );
        let mut out = Vec::new();
        stages[member as usize].handle(1, Input::Message(Arc::new(envelope)), &mut out);
        assert_eq!(!replies(&out, CLIENT).is_empty(), answers, "member {member}");
    }
    assert_eq!(stages[0].stats().get("read_only_not_maintained"), 1);
}

#[test]
fn selective_execution_is_refused_for_a_service_without_object_checkpoints() {
    let net = selective_net();
    let refused = ExecStage::new(
        net.config.clone(),
        ReplicaId(0),
        net.rings[0].clone(),
        &Storage::new(),
        // A service without object checkpoints.
        Box::new(SpyService {
            kv: KvService::new(),
            calls: Default::default(),
            alarm: None,
        }),
    );
    let Err(error) = refused else { panic!("accepted") };
    assert!(error.to_string().contains("selective_execution"), "{error}");
}

/// The KV with its `execute` replaced by `run` (which may call the KV's): the object API and the
/// rest are the KV's.
struct Around {
    kv: KvService,
    run: fn(
        &mut KvService,
        &crate::service::BatchContext,
        &[crate::service::ServiceRequest],
        &mut crate::service::Effects,
    ) -> Vec<Bytes>,
}

impl Service for Around {
    fn execute(
        &mut self,
        context: &crate::service::BatchContext,
        requests: &[crate::service::ServiceRequest],
        effects: &mut crate::service::Effects,
    ) -> Vec<Bytes> {
        (self.run)(&mut self.kv, context, requests, effects)
    }
    fn access(&self, operation: &[u8]) -> Option<crate::service::Access> {
        self.kv.access(operation)
    }
    fn enable_selective_execution(&mut self) -> bool {
        self.kv.enable_selective_execution()
    }
    fn object_state(&self, object: &[u8]) -> Option<Option<Bytes>> {
        self.kv.object_state(object)
    }
    fn restore_object(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), crate::service::RestoreError> {
        self.kv.restore_object(object, state)
    }
    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        self.kv.execute_read_only(operation)
    }
    fn checkpoint(&self) -> Bytes {
        self.kv.checkpoint()
    }
    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), crate::service::RestoreError> {
        self.kv.restore(checkpoint)
    }
}

/// The KV, plus: every request pushes "keyed" (a Put or Get) or "global" (the operation
/// `publish`, which names no object) to [`CLIENT`].
fn publishing(kv: KvService) -> Around {
    Around {
        kv,
        run: |kv, context, requests, effects| {
            requests
                .iter()
                .map(|r| {
                    if &r.operation[..] == b"publish" {
                        effects.push(CLIENT, Bytes::from_static(b"global"));
                        Bytes::from_static(b"published")
                    } else {
                        effects.push(CLIENT, Bytes::from_static(b"keyed"));
                        kv.execute(context, std::slice::from_ref(r), effects).remove(0)
                    }
                })
                .collect()
        },
    }
}

/// A global request runs on every member after everything, in agreed order, so its pushes are
/// numbered alike everywhere and sent (before its reply); pushes of a request only some members
/// run are dropped.
#[test]
fn pushes_of_global_requests_are_sent_and_those_of_keyed_requests_dropped() {
    let net = selective_net();
    let mut stages: Vec<ExecStage> = (0..3)
        .map(|i| net.stage(i, &Storage::new(), Box::new(publishing(KvService::new()))))
        .collect();
    let on01 = key_kept_by([0, 1]);
    let publish = RequestEntry {
        client: ClientId(8),
        request_id: RequestId(1),
        body: crate::message::RequestBody::Inline(Bytes::from_static(b"publish")),
    };
    let batches = chain(vec![vec![put_on(CLIENT, 1, &on01, "a"), publish]]);
    let outs = deliver_each(&net, &mut stages, &batches);
    for (member, out) in outs.iter().enumerate() {
        let pushes: Vec<(u64, Bytes)> = sent(out)
            .into_iter()
            .filter_map(|(_, m)| match m {
                Message::Push { seq, payload, .. } => Some((seq, payload)),
                _ => None,
            })
            .collect();
        assert_eq!(pushes, vec![(1, Bytes::from_static(b"global"))], "member {member}");
        let published = replies(out, ClientId(8));
        assert_eq!(published.len(), 1, "member {member} answers the global request");
        // Members 0 and 1 ran the put; member 2 replayed it before the global request.
        assert_eq!(
            stages[member].stats().get("pushes_dropped_selective"),
            1,
            "member {member}"
        );
        assert_eq!(stages[member].stats().get("requests_replayed"), u64::from(member == 2));
    }
}

/// The KV, answering each request with its agreed position `seqno.index` (what a service that
/// names what a request creates after its position, as ZooKeeper's zxids would, sees).
fn positioned(kv: KvService) -> Around {
    Around {
        kv,
        run: |kv, context, requests, effects| {
            kv.execute(context, requests, effects);
            (0..requests.len() as u32)
                .map(|i| Bytes::from(format!("{}.{}", context.seqno.0, context.index + i)))
                .collect()
        },
    }
}

/// Each request runs with its own agreed position, as a whole batch gives it without selective
/// execution: when its maintainers run it, and when a member that stored it is made to run it
/// later (forced by a retransmission).
#[test]
fn a_request_runs_at_its_agreed_position_when_run_and_when_forced() {
    let net = selective_net();
    let mut stages: Vec<ExecStage> = (0..3)
        .map(|i| net.stage(i, &Storage::new(), Box::new(positioned(KvService::new()))))
        .collect();
    let (on12, on01) = (key_kept_by([1, 2]), key_kept_by([0, 1]));
    let batches = chain(vec![vec![
        put_on(CLIENT, 1, &on12, "x"),
        put_on(ClientId(8), 1, &on01, "y"),
    ]]);
    let seqno = batches[0].seqno.0;
    let at = |index: u32| ReplyBody::Full(Bytes::from(format!("{seqno}.{index}")));
    let outs = deliver_each(&net, &mut stages, &batches);
    assert_eq!(replies(&outs[0], ClientId(8)), vec![(RequestId(1), at(1))]);
    assert_eq!(replies(&outs[1], CLIENT), vec![(RequestId(1), at(0))]);
    assert_eq!(replies(&outs[1], ClientId(8)), vec![(RequestId(1), at(1))]);
    assert!(replies(&outs[0], CLIENT).is_empty(), "member 0 stored it");
    // Member 0 is made to run the request it stored: at its own position still.
    let retransmit = net.input(
        Principal::Order(ReplicaId(1)),
        Message::Retransmit {
            client: CLIENT,
            request_id: RequestId(1),
        },
        SealFor::Stage(StageKind::Exec),
    );
    let mut out = Vec::new();
    stages[0].handle(3, retransmit, &mut out);
    assert_eq!(replies(&out, CLIENT), vec![(RequestId(1), at(0))]);
    // Without selective execution the whole batch runs at once, from index 0.
    let mut whole = Net::small().stage(0, &Storage::new(), Box::new(positioned(KvService::new())));
    let out = Net::small().deliver(&mut whole, &batches[0]);
    let plain = |client| super::tests::replies(&out, client);
    assert_eq!(plain(CLIENT), vec![(RequestId(1), at(0))]);
    assert_eq!(plain(ClientId(8)), vec![(RequestId(1), at(1))]);
}

/// The pushes sent in `out`: `(to, stream, seq, payload)`.
fn pushes_sent(out: &[Action]) -> Vec<(Vec<Principal>, Option<Bytes>, u64, Bytes)> {
    let sent = sent(out).into_iter();
    sent.filter_map(|(to, m)| match m {
        Message::Push { stream, seq, payload } => Some((to, stream, seq, payload)),
        _ => None,
    })
    .collect()
}

/// Per-object push streams (docs/ODRC.md): a watch on a key announces the key's stream to its
/// client in the (wrapped) reply; a write to the key pushes the event in that stream, numbered
/// by the key's maintainers; the member that skipped both installs the stream with the key at
/// the checkpoint (every member's checkpoint is then the same) and answers a PUSH-RESUME for
/// it. (`stale-streams` in the simulator shows what goes wrong when the stream is not
/// installed.)
#[test]
fn a_keys_watch_events_go_in_its_stream_which_travels_with_the_key() {
    let net = selective_net();
    let mut stages = stages(&net);
    let on01 = key_kept_by([0, 1]);
    let watcher = ClientId(8);
    let batches = chain(vec![
        vec![get_on(watcher, 1, &on01)],
        vec![put_on(CLIENT, 1, &on01, "a")],
        vec![get_on(watcher, 2, &on01)],
        vec![],
    ]);
    let outs = deliver_each(&net, &mut stages, &batches[..3]);
    for member in [0, 1] {
        // The first Get announces the stream from push 1; the second, after the put's event,
        // from push 2.
        let announced: Vec<Vec<(Bytes, u64)>> = super::tests::replies(&outs[member], watcher)
            .into_iter()
            .map(|(_, body)| match body {
                ReplyBody::Full(b) => crate::message::unwrap_announced(&b).expect("wrapped").0,
                ReplyBody::Digest(_) => panic!("full replies here"),
            })
            .collect();
        let key = Bytes::from(on01.clone());
        assert_eq!(announced, vec![vec![(key.clone(), 1)], vec![(key.clone(), 2)]]);
        let event = KvEvent {
            key: key.clone(),
            value: Some(Bytes::from_static(b"a")),
        }
        .encode();
        assert_eq!(
            pushes_sent(&outs[member]),
            vec![(vec![Principal::Client(watcher)], Some(key), 1, event)],
            "member {member}"
        );
    }
    assert!(pushes_sent(&outs[2]).is_empty(), "member 2 ran none of it");
    // The checkpoint: member 2 installs the key with its stream.
    let at_cp = deliver_all(&net, &mut stages, &batches[3]);
    let after = exchange(&net, &mut stages, &at_cp);
    let digests: Vec<_> = [&at_cp[0], &at_cp[1], &after[2]]
        .iter()
        .map(|out| checkpoint_digest(out).expect("checkpoint taken"))
        .collect();
    assert!(digests.iter().all(|d| *d == digests[0]), "{digests:?}");
    let streams: Vec<_> = stages.iter().map(|s| s.pushes.objects_sorted()).collect();
    assert_eq!(streams[2], streams[0]);
    assert_eq!(streams[0].len(), 1);
    // Member 2 answers the watcher's PUSH-RESUME for the stream from its installed copy.
    let resume = net.resume_of_client_8(1, vec![(Bytes::from(on01.clone()), 1)]);
    let mut out = Vec::new();
    stages[2].handle(5, resume, &mut out);
    let resent = pushes_sent(&out);
    assert_eq!(resent.len(), 1);
    assert_eq!((resent[0].1.as_deref(), resent[0].2), (Some(on01.as_bytes()), 1));
}

/// An object named in more than `PUSH_STREAM_NAME_MAX` bytes gets no stream: its watch is not
/// announced and its events are dropped and counted, instead of being sent in PUSHes no client
/// could take.
#[test]
fn an_object_too_long_to_name_a_stream_pushes_nothing() {
    let net = selective_net();
    let mut stages = stages(&net);
    let long = "k".repeat(crate::limits::PUSH_STREAM_NAME_MAX + 1);
    let batches = chain(vec![
        vec![get_on(ClientId(8), 1, &long)],
        vec![put_on(CLIENT, 1, &long, "a")],
    ]);
    let outs = deliver_each(&net, &mut stages, &batches);
    assert!(outs.iter().all(|out| pushes_sent(out).is_empty()), "no member pushed");
    for (member, out) in outs.iter().enumerate() {
        for (_, body) in super::tests::replies(out, ClientId(8)) {
            let ReplyBody::Full(b) = body else { continue };
            let (announced, _) = crate::message::unwrap_announced(&b).expect("wrapped");
            assert!(announced.is_empty(), "member {member} announced no stream");
        }
    }
    let dropped: u64 = stages.iter().map(|s| s.stats().get("push_stream_name_too_long")).sum();
    assert_eq!(dropped, 2, "the event, dropped by each of the key's two maintainers");
}

/// The KV, plus one wake-up at agreed time 2 ms that pushes "woken" to client 8 on `key`'s
/// stream; `global`: the service says its wake-ups depend on global state only.
struct Waking {
    kv: KvService,
    key: Bytes,
    woken: bool,
    global: bool,
}

impl Service for Waking {
    fn execute(
        &mut self,
        context: &crate::service::BatchContext,
        requests: &[crate::service::ServiceRequest],
        effects: &mut crate::service::Effects,
    ) -> Vec<Bytes> {
        self.kv.execute(context, requests, effects)
    }
    fn access(&self, operation: &[u8]) -> Option<crate::service::Access> {
        self.kv.access(operation)
    }
    fn enable_selective_execution(&mut self) -> bool {
        self.kv.enable_selective_execution()
    }
    fn object_state(&self, object: &[u8]) -> Option<Option<Bytes>> {
        self.kv.object_state(object)
    }
    fn restore_object(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), crate::service::RestoreError> {
        self.kv.restore_object(object, state)
    }
    fn wakes_on_global_state(&self) -> bool {
        self.global
    }
    fn wake_at(&self) -> Option<u64> {
        (!self.woken).then_some(2_000)
    }
    fn wake(&mut self, _: &crate::service::BatchContext, effects: &mut crate::service::Effects) {
        self.woken = true;
        effects.push_on(self.key.clone(), ClientId(8), Bytes::from_static(b"woken"));
    }
    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes> {
        self.kv.execute_read_only(operation)
    }
    fn checkpoint(&self) -> Bytes {
        let kv = self.kv.checkpoint();
        Bytes::from([&[u8::from(self.woken)][..], &kv[..]].concat())
    }
    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), crate::service::RestoreError> {
        self.woken = checkpoint.first() == Some(&1);
        self.kv.restore(checkpoint.get(1..).unwrap_or_default())
    }
}

/// A wake-up's push on an object's stream (ZooKeeper's expiry firing a watch on the ephemeral
/// node) is numbered and sent by every member when the service wakes on global state only
/// (every member wakes at the same batch, every object brought up to date first), and dropped
/// otherwise (members might wake at different batches and number it differently).
#[test]
fn a_wake_ups_pushes_are_numbered_only_when_it_wakes_on_global_state() {
    let net = selective_net();
    let on01 = key_kept_by([0, 1]);
    for global in [true, false] {
        let mut stages: Vec<ExecStage> = (0..3)
            .map(|i| {
                let service = Waking {
                    kv: KvService::new(),
                    key: Bytes::from(on01.clone()),
                    woken: false,
                    global,
                };
                net.stage(i, &Storage::new(), Box::new(service))
            })
            .collect();
        let batches = chain(vec![vec![get_on(ClientId(8), 1, &on01)], vec![]]);
        let outs = deliver_each(&net, &mut stages, &batches);
        for (member, out) in outs.iter().enumerate() {
            let expected = match global {
                true => vec![(
                    vec![Principal::Client(ClientId(8))],
                    Some(Bytes::from(on01.clone())),
                    1,
                    Bytes::from_static(b"woken"),
                )],
                false => Vec::new(),
            };
            assert_eq!(pushes_sent(out), expected, "member {member}, global {global}");
            assert_eq!(
                stages[member].stats().get("pushes_dropped_selective"),
                u64::from(!global),
                "member {member}"
            );
        }
    }
}

/// A stream announced outright stands where it stood before the request's own pushes (a
/// client that starts to follow it there gets them); one announced if pushed stands after them,
/// and is left out while the stream has had no push.
#[test]
fn announced_positions_come_before_or_after_the_requests_own_pushes() {
    let net = selective_net();
    let on01 = key_kept_by([0, 1]);
    let mut stages: Vec<ExecStage> = (0..3)
        .map(|i| {
            let around = Around {
                kv: KvService::new(),
                run: |kv, context, requests, effects| {
                    let key =
                        Bytes::copy_from_slice(kv.access(&requests[0].operation).unwrap().writes.first().unwrap());
                    let client = requests[0].client;
                    effects.announce_if_pushed(client, key.clone());
                    if requests[0].request_id.0 >= 2 {
                        effects.push_on(key.clone(), client, Bytes::from_static(b"own"));
                    }
                    if requests[0].request_id.0 == 3 {
                        effects.announce_stream(client, key.clone());
                    }
                    kv.execute(context, requests, effects)
                },
            };
            net.stage(i, &Storage::new(), Box::new(around))
        })
        .collect();
    let client = ClientId(8);
    let batches = chain(vec![
        vec![put_on(client, 1, &on01, "a")],
        vec![put_on(client, 2, &on01, "b")],
        vec![put_on(client, 3, &on01, "c")],
    ]);
    let outs = deliver_each(&net, &mut stages, &batches);
    let key = Bytes::from(on01.clone());
    for member in [0, 1] {
        let announced: Vec<Vec<(Bytes, u64)>> = super::tests::replies(&outs[member], client)
            .into_iter()
            .map(|(_, body)| match body {
                ReplyBody::Full(b) => crate::message::unwrap_announced(&b).expect("wrapped").0,
                ReplyBody::Digest(_) => panic!("full replies here"),
            })
            .collect();
        assert_eq!(
            announced,
            vec![vec![], vec![(key.clone(), 2)], vec![(key.clone(), 2)]],
            "member {member}: none before any push; after push 1; before push 2"
        );
    }
}
