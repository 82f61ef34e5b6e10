use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::config::Knobs;
use crate::ids::StageKind;
use crate::message::Seal;
use crate::testing::{fixture, Fixture};

fn request(f: &Fixture, client: u32, request_id: u64, operation: &[u8]) -> Arc<Envelope> {
    Arc::new(Envelope::seal(
        &f.clients[client as usize],
        &f.quorums,
        Principal::Client(ClientId(client)),
        Message::ClientRequest {
            client: ClientId(client),
            request_id: RequestId(request_id),
            operation: Bytes::copy_from_slice(operation),
            read_only: false,
        },
        SealFor::Stage(StageKind::Auth),
    ))
}

fn from_exec(f: &Fixture, exec: u32, message: Message) -> Arc<Envelope> {
    Arc::new(Envelope::seal(
        &f.replicas[exec as usize],
        &f.quorums,
        Principal::Exec(ReplicaId(exec)),
        message,
        SealFor::Stage(StageKind::Auth),
    ))
}

fn stage(f: &Fixture, id: u32, storage: &Storage) -> AuthStage {
    AuthStage::new(
        f.config.clone(),
        ReplicaId(id),
        f.replicas[id as usize].clone(),
        storage,
    )
    .unwrap()
}

fn run(stage: &mut AuthStage, now: Time, envelope: Arc<Envelope>) -> Vec<Action> {
    let mut out = Vec::new();
    stage.handle(now, Input::Message(envelope), &mut out);
    out
}

fn sent_auth_request(actions: &[Action]) -> Option<(Vec<Principal>, RequestEntry, MatrixRow)> {
    actions.iter().find_map(|a| match a {
        Action::Send { to, envelope } => match &envelope.message {
            Message::AuthRequest { entry, row } => Some((to.clone(), entry.clone(), row.clone())),
            _ => None,
        },
        _ => None,
    })
}

#[test]
fn valid_request_is_persisted_then_forwarded_to_all_order_members_with_a_valid_row() {
    let f = fixture(1, 1, 2, Knobs::default());
    let mut auth = stage(&f, 2, &Storage::new());
    let actions = run(&mut auth, 10, request(&f, 1, 1, b"put x"));
    let persist = actions
        .iter()
        .position(|a| matches!(a, Action::Persist { .. }))
        .expect("persisted");
    let send = actions
        .iter()
        .position(|a| matches!(a, Action::Send { .. }))
        .expect("sent");
    assert!(persist < send, "persist before send");
    let (to, entry, row) = sent_auth_request(&actions).unwrap();
    assert_eq!(to, ClusterConfig::order_members(&f.quorums).collect::<Vec<_>>());
    assert_eq!(entry.body, RequestBody::Inline(Bytes::from_static(b"put x")));
    let matrix = crate::crypto::MatrixSignature { rows: vec![row] };
    for o in 0..f.quorums.n_order {
        assert_eq!(
            f.replicas[o].count_valid_matrix_rows(o, f.quorums.n_auth, &entry.digest(), &matrix),
            1
        );
    }
}

#[test]
fn forged_or_unknown_client_requests_are_dropped() {
    let f = fixture(1, 1, 2, Knobs::default());
    let mut auth = stage(&f, 0, &Storage::new());
    let mut bad = (*request(&f, 0, 1, b"op")).clone();
    if let Seal::Authenticator(a) = &mut bad.seal {
        a.macs[0].0[3] ^= 0x40;
    }
    assert!(run(&mut auth, 0, Arc::new(bad)).is_empty());
    assert_eq!(auth.stats().get("dropped_bad_seal"), 1);
    // Claims to be client 1 but carries client 0's MACs.
    let mut impostor = (*request(&f, 0, 1, b"op")).clone();
    impostor.from = Principal::Client(ClientId(1));
    if let Message::ClientRequest { client, .. } = &mut impostor.message {
        *client = ClientId(1);
    }
    assert!(run(&mut auth, 0, Arc::new(impostor)).is_empty());
    // A client the configuration does not list.
    let unknown = Envelope {
        from: Principal::Client(ClientId(9)),
        ..(*request(&f, 0, 1, b"op")).clone()
    };
    assert!(run(&mut auth, 0, Arc::new(unknown)).is_empty());
    assert_eq!(auth.stats().get("dropped_unknown_client"), 1);
}

#[test]
fn one_pending_request_per_client_until_r_plus_one_batch_completes() {
    let f = fixture(1, 1, 1, Knobs::default());
    let mut auth = stage(&f, 0, &Storage::new());
    assert!(sent_auth_request(&run(&mut auth, 0, request(&f, 0, 1, b"a"))).is_some());
    assert!(
        run(&mut auth, 1, request(&f, 0, 2, b"b")).is_empty(),
        "request 1 still pending"
    );
    let complete = |exec| {
        from_exec(
            &f,
            exec,
            Message::BatchComplete {
                seqno: crate::ids::SeqNo(1),
                requests: vec![(ClientId(0), RequestId(1))],
            },
        )
    };
    run(&mut auth, 2, complete(1));
    run(&mut auth, 2, complete(1));
    assert!(
        run(&mut auth, 3, request(&f, 0, 2, b"b")).is_empty(),
        "one exec member is not r + 1"
    );
    // The deferred request 2 is forwarded as soon as the quorum reports request 1 ordered.
    let resumed = run(&mut auth, 4, complete(2));
    let (_, entry, _) = sent_auth_request(&resumed).expect("deferred request forwarded");
    assert_eq!(entry.request_id, RequestId(2));
    assert_eq!(auth.stats().get("deferred_request_resumed"), 1);
    // Its retransmission is now an ordinary (paced) resend, not a new request.
    assert!(run(&mut auth, 5, request(&f, 0, 2, b"b"))
        .iter()
        .all(|a| !matches!(a, Action::Persist { .. })));
}

#[test]
fn pending_request_is_superseded_after_the_retransmission_interval() {
    let knobs = Knobs::default();
    let interval = knobs.auth_retransmit_interval_us;
    let f = fixture(1, 1, 1, knobs);
    let mut auth = stage(&f, 0, &Storage::new());
    run(&mut auth, 0, request(&f, 0, 1, b"a"));
    assert!(run(&mut auth, interval - 1, request(&f, 0, 2, b"b")).is_empty());
    assert!(sent_auth_request(&run(&mut auth, interval, request(&f, 0, 2, b"b"))).is_some());
}

#[test]
fn retransmissions_are_resent_once_then_paced_and_conflicts_dropped() {
    let knobs = Knobs::default();
    let interval = knobs.auth_retransmit_interval_us;
    let f = fixture(1, 1, 1, knobs);
    let mut auth = stage(&f, 0, &Storage::new());
    let first = sent_auth_request(&run(&mut auth, 0, request(&f, 0, 1, b"a"))).unwrap();
    let again = sent_auth_request(&run(&mut auth, 5, request(&f, 0, 1, b"a"))).expect("first resend at once");
    assert_eq!(first.1, again.1);
    assert!(run(&mut auth, 6, request(&f, 0, 1, b"a")).is_empty(), "paced");
    assert!(sent_auth_request(&run(&mut auth, 5 + interval, request(&f, 0, 1, b"a"))).is_some());
    assert!(run(&mut auth, 7, request(&f, 0, 1, b"different")).is_empty());
    assert_eq!(auth.stats().get("dropped_conflicting_request"), 1);
}

#[test]
fn large_bodies_are_ordered_by_digest_and_served_on_fetch() {
    let f = fixture(1, 1, 1, Knobs::default());
    let mut auth = stage(&f, 1, &Storage::new());
    let big = vec![7u8; 1000];
    let (_, entry, _) = sent_auth_request(&run(&mut auth, 0, request(&f, 0, 1, &big))).unwrap();
    let digest = Digest::of(&big);
    assert_eq!(entry.body, RequestBody::Digest(digest));
    let fetch = |d| {
        from_exec(
            &f,
            2,
            Message::Fetch {
                client: ClientId(0),
                request_id: RequestId(1),
                operation_digest: d,
            },
        )
    };
    let actions = run(&mut auth, 1, fetch(digest));
    let Some(Action::Send { to, envelope }) = actions.first() else {
        panic!("no command sent")
    };
    assert_eq!(to, &vec![Principal::Exec(ReplicaId(2))]);
    assert!(envelope
        .open(&f.replicas[2], Principal::Exec(ReplicaId(2)), None)
        .is_ok());
    assert!(matches!(&envelope.message, Message::Command { operation, .. } if operation[..] == big[..]));
    assert!(run(&mut auth, 2, fetch(Digest::of(b"other"))).is_empty());
    // FETCH from something that is not an execution member.
    let mut wrong = (*fetch(digest)).clone();
    wrong.from = Principal::Order(ReplicaId(2));
    assert!(run(&mut auth, 3, Arc::new(wrong)).is_empty());
}

#[test]
fn restart_from_storage_resends_the_same_auth_request() {
    let f = fixture(1, 1, 1, Knobs::default());
    let mut auth = stage(&f, 0, &Storage::new());
    let actions = run(&mut auth, 0, request(&f, 0, 1, b"a"));
    let mut storage = Storage::new();
    for action in &actions {
        if let Action::Persist { key, value: Some(v) } = action {
            storage.insert(key.clone(), v.clone());
        }
    }
    let before = sent_auth_request(&actions).unwrap();
    let mut restarted = stage(&f, 0, &storage);
    let after = sent_auth_request(&run(&mut restarted, 100, request(&f, 0, 1, b"a"))).expect("resent after restart");
    assert_eq!(before.1, after.1);
    assert!(
        run(&mut restarted, 101, request(&f, 0, 1, b"changed")).is_empty(),
        "still remembers the operation"
    );
}

#[test]
fn bodies_of_three_checkpoint_intervals_survive_a_restart_and_older_ones_are_deleted() {
    let knobs = Knobs {
        checkpoint_interval: 2,
        log_window: 4,
        ..Knobs::default()
    };
    let kept = bodies_per_client(&knobs);
    assert_eq!(kept, 7);
    let f = fixture(1, 1, 1, knobs);
    let mut auth = stage(&f, 0, &Storage::new());
    let mut storage = Storage::new();
    let big = |n: u64| vec![n as u8; 200];
    for n in 1..=10u64 {
        let actions = run(&mut auth, n * 10_000_000, request(&f, 0, n, &big(n)));
        assert!(sent_auth_request(&actions).is_some(), "request {n} forwarded");
        for action in &actions {
            if let Action::Persist { key, value } = action {
                match value {
                    Some(v) => storage.insert(key.clone(), v.clone()),
                    None => storage.remove(key),
                };
            }
        }
    }
    assert_eq!(storage.len(), kept, "evicted bodies are deleted from storage");
    let mut restarted = stage(&f, 0, &storage);
    let fetch = |n: u64| {
        from_exec(
            &f,
            1,
            Message::Fetch {
                client: ClientId(0),
                request_id: RequestId(n),
                operation_digest: Digest::of(&big(n)),
            },
        )
    };
    for n in 4..=10 {
        assert_eq!(
            run(&mut restarted, 0, fetch(n)).len(),
            1,
            "body {n} served after restart"
        );
    }
    assert!(run(&mut restarted, 0, fetch(3)).is_empty(), "body 3 was evicted");
    // The newest request is pending again after the restart.
    assert!(run(&mut restarted, 1, request(&f, 0, 11, b"x")).is_empty());
}
