use std::sync::Arc;

use bytes::Bytes;

use super::*;
use crate::config::Knobs;
use crate::ids::{Process, StageKind};
use crate::message::Seal;
use crate::testing::{fixture, new_keys, Fixture};

fn request(f: &Fixture, client: u32, request_id: u64, operation: &[u8]) -> Arc<Envelope> {
    request_signed_with(f, client, request_id, operation, None)
}

fn request_signed_with(
    f: &Fixture,
    client: u32,
    request_id: u64,
    operation: &[u8],
    signature: Option<crate::crypto::Signature>,
) -> Arc<Envelope> {
    Arc::new(Envelope::seal(
        &f.clients[client as usize],
        &f.quorums,
        Principal::Client(ClientId(client)),
        Message::ClientRequest {
            client: ClientId(client),
            request_id: RequestId(request_id),
            operation: Bytes::copy_from_slice(operation),
            read_only: false,
            signature,
            config_epoch: 0,
        },
        SealFor::Stage(StageKind::Auth),
    ))
}

/// A request signed by its client with `signer`'s key (the client's own, or another's to make
/// the signature bad), sealed with the client's MAC keys.
fn signed_request(f: &Fixture, client: u32, request_id: u64, operation: &[u8], signer: u32) -> Arc<Envelope> {
    let digest = crate::message::client_request_digest(ClientId(client), RequestId(request_id), operation);
    let signature = f.clients[signer as usize].sign(&digest);
    request_signed_with(f, client, request_id, operation, Some(signature))
}

/// A `u = r = 1` fixture with `clients` clients that sign their requests.
fn signing_fixture(clients: u32) -> Fixture {
    let knobs = Knobs {
        client_signatures: true,
        ..Knobs::default()
    };
    fixture(1, 1, clients, knobs)
}

/// With signed requests: a good signature is forwarded; a good MAC with a bad or missing
/// signature blacklists the client for a growing period (its requests, good ones too, are
/// dropped before any check but the cheapest), and a client that signs correctly is not
/// affected by another's blacklisting.
#[test]
fn with_signed_requests_a_bad_signature_blacklists_its_client_for_a_growing_period() {
    let f = signing_fixture(2);
    let mut a = stage(&f, 0, &Storage::new());
    assert!(sent_auth_request(&run(&mut a, 0, signed_request(&f, 0, 1, b"op", 0))).is_some());
    assert_eq!(a.stats().get("signature_checked"), 1);
    // Unsigned, and signed by another key: both are bad.
    assert!(sent_auth_request(&run(&mut a, 1, request(&f, 1, 1, b"op"))).is_none());
    assert_eq!(a.stats().get("dropped_bad_signature"), 1);
    let s = crate::auth::clients::BLACKLIST_INITIAL_US;
    // Blacklisted: even a well-signed request is dropped until the period ends.
    assert!(sent_auth_request(&run(&mut a, 2, signed_request(&f, 1, 1, b"op", 1))).is_none());
    assert_eq!(a.stats().get("dropped_blacklisted"), 1);
    assert_eq!(
        a.stats().get("signature_checked"),
        2,
        "no signature is checked while blacklisted"
    );
    // Client 0 goes on.
    let done = completed(&f, Principal::Order(ReplicaId(0)), 0, 0, 1);
    run(&mut a, 3, done);
    assert!(sent_auth_request(&run(&mut a, 4, signed_request(&f, 0, 2, b"op2", 0))).is_some());
    // After the period client 1 is heard again; a second bad signature doubles the period.
    assert!(sent_auth_request(&run(&mut a, 1 + s, signed_request(&f, 1, 1, b"op", 0))).is_none());
    assert_eq!(a.stats().get("client_blacklisted"), 2);
    assert!(sent_auth_request(&run(&mut a, 2 + 2 * s, signed_request(&f, 1, 1, b"op", 1))).is_none());
    assert!(sent_auth_request(&run(&mut a, 2 + 3 * s, signed_request(&f, 1, 1, b"op", 1))).is_some());
}

/// The signatures of one round's new requests are checked together at the flush: nothing is
/// forwarded before it; a good batch forwards every request in one AUTH-REQ; a batch with one bad
/// signature is checked one by one, which forwards the good requests and blacklists only the
/// client whose signature is bad.
#[test]
fn signatures_of_one_round_are_checked_together_at_the_flush() {
    let f = signing_fixture(4);
    let mut a = stage(&f, 0, &Storage::new());
    let mut out = Vec::new();
    for c in 0..3 {
        out.extend(handle(&mut a, 0, signed_request(&f, c, 1, b"op", c)));
    }
    assert!(auth_requests(&out).is_empty(), "nothing is forwarded before the flush");
    assert_eq!(a.stats().get("signature_deferred"), 3);
    assert_eq!(a.stats().get("signature_checked"), 0);
    a.flush(0, &mut out);
    let sent = auth_requests(&out);
    assert_eq!(sent.len(), 1);
    let clients: Vec<u32> = sent[0].1.iter().map(|i| i.entry.client.0).collect();
    assert_eq!(clients, vec![0, 1, 2], "in arrival order");
    assert_eq!(a.stats().get("signature_batch_verified"), 3);
    assert_eq!(a.stats().get("signature_checked"), 3);
    // Client 1 signs with client 3's key: the batch fails, each is checked alone.
    let mut out = Vec::new();
    for c in 0..3 {
        run(&mut a, 1, completed(&f, Principal::Order(ReplicaId(0)), 0, c, 1));
    }
    for (c, signer) in [(0, 0), (1, 3), (2, 2)] {
        out.extend(handle(&mut a, 2, signed_request(&f, c, 2, b"op2", signer)));
    }
    a.flush(2, &mut out);
    assert_eq!(a.stats().get("signature_batch_failed"), 1);
    assert_eq!(a.stats().get("dropped_bad_signature"), 1);
    assert_eq!(a.stats().get("client_blacklisted"), 1);
    let sent = auth_requests(&out);
    let clients: Vec<u32> = sent
        .iter()
        .flat_map(|(_, items)| items.iter().map(|i| i.entry.client.0))
        .collect();
    assert_eq!(clients, vec![0, 2]);
    assert!(a.clients.get(ClientId(1)).blacklisted(3));
}

/// Without signed requests the signature field is ignored.
#[test]
fn without_signed_requests_no_signature_is_checked() {
    let f = fixture(1, 1, 1, Knobs::default());
    let mut a = stage(&f, 0, &Storage::new());
    assert!(sent_auth_request(&run(&mut a, 0, request(&f, 0, 1, b"op"))).is_some());
    assert_eq!(a.stats().get("signature_checked"), 0);
}

/// `message` from a stage member, sealed with its replica's keys.
fn from_member(f: &Fixture, from: Principal, message: Message, seal: SealFor) -> Arc<Envelope> {
    let replica = from.replica().expect("a stage member");
    Arc::new(Envelope::seal(
        &f.replicas[replica.0 as usize],
        &f.quorums,
        from,
        message,
        seal,
    ))
}

fn from_exec(f: &Fixture, exec: u32, message: Message) -> Arc<Envelope> {
    from_member(
        f,
        Principal::Exec(ReplicaId(exec)),
        message,
        SealFor::Stage(StageKind::Auth),
    )
}

/// BATCH-COMPLETE from `from` to auth member `to`: request `request_id` of `client` is ordered.
fn completed(f: &Fixture, from: Principal, to: u32, client: u32, request_id: u64) -> Arc<Envelope> {
    let message = Message::BatchComplete {
        seqno: crate::ids::SeqNo(1),
        requests: vec![(ClientId(client), RequestId(request_id))],
    };
    from_member(f, from, message, SealFor::One(Principal::Auth(ReplicaId(to))))
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

/// One host round: the input, then the flush hook.
fn run(stage: &mut AuthStage, now: Time, envelope: Arc<Envelope>) -> Vec<Action> {
    let mut out = handle(stage, now, envelope);
    stage.flush(now, &mut out);
    out
}

/// The input alone (no flush).
fn handle(stage: &mut AuthStage, now: Time, envelope: Arc<Envelope>) -> Vec<Action> {
    let mut out = Vec::new();
    stage.handle(now, Input::Message(envelope), &mut out);
    out
}

/// Every AUTH-REQ sent: recipients and items.
fn auth_requests(actions: &[Action]) -> Vec<(Vec<Principal>, Vec<AuthItem>)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send { to, envelope } => match &envelope.message {
                Message::AuthRequest { items } => Some((to.clone(), items.clone())),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// The single request of the single AUTH-REQ sent, if any.
fn sent_auth_request(actions: &[Action]) -> Option<(Vec<Principal>, RequestEntry, MatrixRow)> {
    let mut sent = auth_requests(actions);
    assert!(sent.len() <= 1, "one AUTH-REQ per round");
    let (to, mut items) = sent.pop()?;
    assert_eq!(items.len(), 1, "one request per round here");
    let item = items.pop().unwrap();
    Some((to, item.entry, item.row))
}

#[test]
fn valid_request_is_persisted_then_forwarded_to_all_order_members_with_a_valid_row() {
    let f = fixture(1, 1, 2, Knobs::default());
    let mut auth = stage(&f, 2, &Storage::new());
    let big = vec![b'b'; f.config.knobs.inline_request_bytes_max + 1];
    let actions = run(&mut auth, 10, request(&f, 1, 1, &big));
    let persist = actions
        .iter()
        .position(|a| matches!(a, Action::Persist { .. }))
        .expect("persisted");
    let send = actions
        .iter()
        .position(|a| matches!(a, Action::Send { .. }))
        .expect("sent");
    assert!(persist < send, "persist before send");
    let (to, entry, _) = sent_auth_request(&actions).unwrap();
    assert_eq!(to, ClusterConfig::order_members(&f.quorums).collect::<Vec<_>>());
    assert_eq!(entry.body, RequestBody::Digest(Digest::of(&big)));

    // An inline body rides in the AUTH-REQ (the order stage logs it): no write here.
    let actions = run(&mut auth, 20, request(&f, 0, 1, b"put x"));
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Persist { .. })),
        "inline: not persisted"
    );
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
    let mut unknown = (*request(&f, 0, 1, b"op")).clone();
    unknown.from = Principal::Client(ClientId(9));
    assert!(run(&mut auth, 0, Arc::new(unknown)).is_empty());
    assert_eq!(auth.stats().get("dropped_unknown_client"), 1);
}

#[test]
fn one_pending_request_per_client_until_the_co_located_order_or_exec_member_reports_it_ordered() {
    let f = fixture(1, 1, 1, Knobs::default());
    let mut auth = stage(&f, 0, &Storage::new());
    assert!(sent_auth_request(&run(&mut auth, 0, request(&f, 0, 1, b"a"))).is_some());
    assert!(
        auth_requests(&run(&mut auth, 1, request(&f, 0, 2, b"b"))).is_empty(),
        "request 1 still pending"
    );
    // Other processes' members are not believed, however many report it.
    for r in 1..4 {
        run(&mut auth, 2, completed(&f, Principal::Exec(ReplicaId(r)), 0, 0, 1));
        run(&mut auth, 2, completed(&f, Principal::Order(ReplicaId(r)), 0, 0, 1));
    }
    assert_eq!(auth.stats().get("dropped_wrong_sender"), 6);
    // A forged seal from the co-located order member's name is not believed either.
    let mut forged = (*completed(&f, Principal::Order(ReplicaId(1)), 0, 0, 1)).clone();
    forged.from = Principal::Order(ReplicaId(0));
    run(&mut auth, 2, Arc::new(forged));
    assert_eq!(auth.stats().get("dropped_bad_seal"), 1);
    assert!(
        auth_requests(&run(&mut auth, 3, request(&f, 0, 2, b"b"))).is_empty(),
        "still pending"
    );
    // The deferred request 2 is forwarded as soon as the co-located order member reports request 1
    // ordered.
    let resumed = run(&mut auth, 4, completed(&f, Principal::Order(ReplicaId(0)), 0, 0, 1));
    let (_, entry, _) = sent_auth_request(&resumed).expect("deferred request forwarded");
    assert_eq!(entry.request_id, RequestId(2));
    assert_eq!(auth.stats().get("deferred_request_resumed"), 1);
    // Its retransmission is now an ordinary (paced) resend, not a new request.
    assert!(run(&mut auth, 5, request(&f, 0, 2, b"b"))
        .iter()
        .all(|a| !matches!(a, Action::Persist { .. })));
    // The co-located execution member's report alone is enough too.
    assert!(auth_requests(&run(&mut auth, 6, request(&f, 0, 3, b"c"))).is_empty());
    let resumed = run(&mut auth, 7, completed(&f, Principal::Exec(ReplicaId(0)), 0, 0, 2));
    assert_eq!(
        sent_auth_request(&resumed).expect("forwarded").1.request_id,
        RequestId(3)
    );
}

#[test]
fn pending_request_is_superseded_after_the_retransmission_interval() {
    let knobs = Knobs::default();
    let interval = knobs.auth_retransmit_interval_us;
    let f = fixture(1, 1, 1, knobs);
    let mut auth = stage(&f, 0, &Storage::new());
    // The co-located order member is in an installed view: it reports what it commits.
    run(&mut auth, 0, hint(&f, 0, 0, 0, true));
    run(&mut auth, 0, request(&f, 0, 1, b"a"));
    assert!(auth_requests(&run(&mut auth, interval - 1, request(&f, 0, 2, b"b"))).is_empty());
    assert!(sent_auth_request(&run(&mut auth, interval, request(&f, 0, 2, b"b"))).is_some());
}

/// One host round that starts with AuthTick: the timer, then the flush hook.
fn tick_round(stage: &mut AuthStage, now: Time) -> Vec<Action> {
    let mut out = timer(stage, now);
    stage.flush(now, &mut out);
    out
}

/// When the last AuthTick timer `actions` set is due, if they set one.
fn armed(actions: &[Action]) -> Option<Time> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::SetTimer {
                timer: Timer::AuthTick,
                at,
            } => Some(*at),
            _ => None,
        })
        .last()
}

/// Twins seed 38 (`upright-sim --twins --service zk`): a correct order member drawn into a view
/// change the others did not join learned no commits for seconds, and its authentication member
/// held each client's next request for the whole retransmission interval; a client that needed
/// its row waited that long for every request. While the order member is out of a view, a
/// deferred request goes after the backup delay; in either case on the member's own timer, not
/// the client's next retransmission.
#[test]
fn while_the_order_member_is_out_of_a_view_a_deferred_request_goes_after_the_backup_delay() {
    let knobs = Knobs::default();
    let (interval, delay) = (
        knobs.auth_retransmit_interval_us,
        knobs.view_change_timeout_us / BACKUP_DELAY_FRACTION,
    );
    let f = fixture(1, 1, 1, knobs);
    let mut auth = stage(&f, 0, &Storage::new());
    run(&mut auth, 0, hint(&f, 0, 0, 0, true));
    assert_eq!(
        armed(&run(&mut auth, 0, request(&f, 0, 1, b"a"))),
        Some(delay),
        "for the backups"
    );
    // In an installed view: deferred until reported ordered or the interval's end, when the
    // member's timer (armed once the backups got request 1) sends it without a retransmission.
    assert!(auth_requests(&run(&mut auth, 10, request(&f, 0, 2, b"b"))).is_empty());
    let backups = tick_round(&mut auth, delay);
    assert_eq!(auth_requests(&backups).len(), 1, "request 1 to the backups");
    assert_eq!(armed(&backups), Some(interval));
    assert!(auth_requests(&tick_round(&mut auth, interval - 1)).is_empty());
    let resumed = tick_round(&mut auth, interval);
    assert_eq!(sent_auth_request(&resumed).expect("resumed").1.request_id, RequestId(2));
    assert_eq!(auth.stats().get("deferred_request_resumed_paced"), 1);

    // The order member leaves the view (and learns no commits): the next request waits only
    // the backup delay after the pending one was forwarded, and goes to every order member.
    run(&mut auth, interval + 1, hint(&f, 0, 0, 1, false));
    assert!(auth_requests(&run(&mut auth, interval + 2, request(&f, 0, 3, b"c"))).is_empty());
    let due = interval + delay;
    assert!(auth_requests(&tick_round(&mut auth, due - 1)).is_empty());
    let resumed = tick_round(&mut auth, due);
    let sent = auth_requests(&resumed);
    let (to, items) = sent.last().expect("resumed");
    assert_eq!(items[0].entry.request_id, RequestId(3));
    assert_eq!(*to, ClusterConfig::order_members(&f.quorums).collect::<Vec<_>>());
    assert_eq!(auth.stats().get("deferred_request_resumed_paced"), 2);
    // Within the delay the next one is still held.
    assert!(auth_requests(&run(&mut auth, due + 1, request(&f, 0, 4, b"d"))).is_empty());
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
    let big = vec![7u8; f.config.knobs.inline_request_bytes_max + 1];
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
    let a = vec![b'a'; f.config.knobs.inline_request_bytes_max + 1];
    let actions = run(&mut auth, 0, request(&f, 0, 1, &a));
    let mut storage = Storage::new();
    for action in &actions {
        if let Action::Persist { key, value: Some(v) } = action {
            storage.insert(key.clone(), v.clone());
        }
    }
    let before = sent_auth_request(&actions).unwrap();
    let mut restarted = stage(&f, 0, &storage);
    let after = sent_auth_request(&run(&mut restarted, 100, request(&f, 0, 1, &a))).expect("resent after restart");
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
    let big = |n: u64| vec![n as u8; f.config.knobs.inline_request_bytes_max + 200];
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
    assert!(auth_requests(&run(&mut restarted, 1, request(&f, 0, 11, b"x"))).is_empty());
}

#[test]
fn requests_of_one_round_go_to_each_order_member_in_one_auth_request_after_the_flush() {
    let f = fixture(1, 1, 5, Knobs::default());
    let mut auth = stage(&f, 1, &Storage::new());
    let mut actions = Vec::new();
    for c in 0..5 {
        let out = handle(
            &mut auth,
            10 + c as u64,
            request(
                &f,
                c,
                1,
                format!("put {c} {}", "v".repeat(f.config.knobs.inline_request_bytes_max)).as_bytes(),
            ),
        );
        assert!(auth_requests(&out).is_empty(), "buffered until the flush");
        assert!(
            out.iter().any(|a| matches!(a, Action::Persist { .. })),
            "persisted at once"
        );
        actions.extend(out);
    }
    let persists = actions.len();
    auth.flush(20, &mut actions);
    let sent = auth_requests(&actions[persists..]);
    assert_eq!(sent.len(), 1, "one message for the round");
    let (to, items) = &sent[0];
    assert_eq!(to, &ClusterConfig::order_members(&f.quorums).collect::<Vec<_>>());
    let clients: Vec<u32> = items.iter().map(|i| i.entry.client.0).collect();
    assert_eq!(clients, vec![0, 1, 2, 3, 4], "every accepted request, in order");
    for item in items {
        assert_eq!(item.row.signer, ReplicaId(1));
        let matrix = crate::crypto::MatrixSignature {
            rows: vec![item.row.clone()],
        };
        for o in 0..f.quorums.n_order {
            assert_eq!(
                f.replicas[o].count_valid_matrix_rows(o, f.quorums.n_auth, &item.entry.digest(), &matrix),
                1
            );
        }
    }
    // Nothing buffered: the flush does nothing.
    let mut again = Vec::new();
    auth.flush(21, &mut again);
    assert!(again.is_empty());
    assert_eq!(auth.stats().get("auth_request_messages"), 1);
}

#[test]
fn a_full_buffer_is_sent_at_once_and_the_rest_on_the_flush() {
    let f = fixture(1, 1, 1, Knobs::default());
    let mut auth = stage(&f, 0, &Storage::new());
    let item = auth.build(ClientId(0), RequestId(1), Bytes::from_static(b"op"), 0).item;
    let mut out = Vec::new();
    for i in 0..AUTH_ITEMS_MAX + 3 {
        auth.queue_for_order(0, item.clone(), false, &mut out);
        let expected = if i + 1 < AUTH_ITEMS_MAX { 0 } else { 1 };
        assert_eq!(auth_requests(&out).len(), expected, "after {} items", i + 1);
    }
    assert_eq!(auth_requests(&out)[0].1.len(), AUTH_ITEMS_MAX);
    auth.flush(1, &mut out);
    let sent = auth_requests(&out);
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1].1.len(), 3, "split, nothing dropped");
    for (_, items) in sent {
        let envelope = Envelope::seal(
            &f.replicas[0],
            &f.quorums,
            Principal::Auth(ReplicaId(0)),
            Message::AuthRequest { items },
            SealFor::Nothing,
        );
        assert!(
            crate::wire::decode(&crate::wire::encode(&envelope)).is_ok(),
            "within the codec limit"
        );
    }
}

#[test]
fn a_retransmission_of_an_unsent_request_is_not_duplicated() {
    let f = fixture(1, 1, 1, Knobs::default());
    let mut auth = stage(&f, 0, &Storage::new());
    let mut out = handle(&mut auth, 0, request(&f, 0, 1, b"a"));
    out.extend(handle(&mut auth, 1, request(&f, 0, 1, b"a")));
    auth.flush(2, &mut out);
    let sent = auth_requests(&out);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].1.len(), 1);
    assert_eq!(auth.stats().get("dropped_retransmission_unsent"), 1);
    // After the flush, a retransmission is resent at once (the first one is not paced).
    assert!(sent_auth_request(&run(&mut auth, 3, request(&f, 0, 1, b"a"))).is_some());
}

fn hint(f: &Fixture, from: u32, to: u32, view: u64, installed: bool) -> Arc<Envelope> {
    let message = Message::PrimaryHint {
        view: crate::ids::View(view),
        installed,
    };
    let seal = SealFor::One(Principal::Auth(ReplicaId(to)));
    from_member(f, Principal::Order(ReplicaId(from)), message, seal)
}

fn timer(stage: &mut AuthStage, now: Time) -> Vec<Action> {
    let mut out = Vec::new();
    stage.handle(now, Input::Timer(Timer::AuthTick), &mut out);
    out
}

fn order(ids: &[u32]) -> Vec<Principal> {
    ids.iter().map(|i| Principal::Order(ReplicaId(*i))).collect()
}

#[test]
fn with_a_known_primary_a_request_goes_to_it_at_once_and_to_the_others_only_if_still_pending() {
    let f = fixture(1, 1, 2, Knobs::default());
    let mut auth = stage(&f, 2, &Storage::new());
    // View 5 installed: the primary is Order(1) (5 mod 4).
    assert!(run(&mut auth, 0, hint(&f, 2, 2, 5, true)).is_empty());
    let actions = run(&mut auth, 10, request(&f, 0, 1, b"put x"));
    let (to, entry, _) = sent_auth_request(&actions).unwrap();
    assert_eq!(to, order(&[1, 2]), "the primary and the co-located order member");
    let tick = armed(&actions).expect("a timer for the rest");
    let delay = f.config.knobs.view_change_timeout_us / BACKUP_DELAY_FRACTION;
    assert_eq!(tick, 10 + delay);
    // Early tick: nothing is due yet.
    assert!(auth_requests(&timer(&mut auth, tick - 1)).is_empty());
    // Still not known ordered when it is due: the other order members get it.
    let sent = auth_requests(&timer(&mut auth, tick));
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].0, order(&[0, 3]));
    assert_eq!(sent[0].1[0].entry, entry);
    // Nothing is sent twice.
    assert!(auth_requests(&timer(&mut auth, tick + delay)).is_empty());

    // Known ordered in time (the co-located order member committed it): the other order members
    // never get it.
    let actions = run(&mut auth, 20, request(&f, 1, 1, b"put y"));
    assert_eq!(sent_auth_request(&actions).unwrap().0, order(&[1, 2]));
    run(&mut auth, 30, completed(&f, Principal::Order(ReplicaId(2)), 2, 1, 1));
    assert!(auth_requests(&timer(&mut auth, 20 + delay)).is_empty());
    assert_eq!(auth.stats().get("auth_later_known_ordered"), 1);
}

#[test]
fn without_a_known_primary_or_for_a_retransmission_every_order_member_gets_it_at_once() {
    let f = fixture(1, 1, 2, Knobs::default());
    let mut auth = stage(&f, 2, &Storage::new());
    let all = ClusterConfig::order_members(&f.quorums).collect::<Vec<_>>();
    // A hint from another replica's order member is not believed.
    run(&mut auth, 0, hint(&f, 1, 2, 1, true));
    assert_eq!(auth.stats().get("dropped_wrong_sender"), 1);
    let actions = run(&mut auth, 10, request(&f, 0, 1, b"put x"));
    assert_eq!(sent_auth_request(&actions).unwrap().0, all);
    // Primary known: the retransmission of a pending request still goes to everyone at once.
    run(&mut auth, 20, hint(&f, 2, 2, 0, true));
    let actions = run(&mut auth, 30, request(&f, 0, 1, b"put x"));
    assert_eq!(sent_auth_request(&actions).unwrap().0, all);
    // A view change is running: the primary is not known.
    run(&mut auth, 40, hint(&f, 2, 2, 1, false));
    run(&mut auth, 50, completed(&f, Principal::Exec(ReplicaId(2)), 2, 0, 1));
    let actions = run(&mut auth, 60, request(&f, 0, 2, b"put z"));
    assert_eq!(sent_auth_request(&actions).unwrap().0, all);
}

/// Key refresh at a replica: a NEW-KEY (hello) to every other replica and every client at
/// start, its epoch persisted first; a refresh each period and the previous keys retired after
/// the overlap; a peer's NEW-KEY installed once and its hello answered; after a restart the
/// stored epoch is never announced again.
#[test]
fn the_authentication_member_refreshes_retires_and_installs_keys() {
    let knobs = Knobs {
        key_refresh_us: 1_000_000,
        key_overlap_us: 300_000,
        ..Knobs::default()
    };
    let f = fixture(1, 1, 2, knobs);
    let mut a = stage(&f, 0, &Storage::new());
    let mut out = Vec::new();
    a.handle(10, Input::Start, &mut out);
    let persisted = out
        .iter()
        .position(|x| matches!(x, Action::Persist { key, .. } if key == super::keys::EPOCH_KEY));
    let sent = out.iter().position(|x| matches!(x, Action::Send { .. }));
    assert!(
        persisted.unwrap() < sent.unwrap(),
        "the epoch is persisted before it is announced"
    );
    let keys = new_keys(&out);
    let [(to, first, true)] = &keys[..] else {
        panic!("{keys:?}")
    };
    let expected: Vec<Principal> = [1, 2, 3]
        .map(|r| Principal::Auth(ReplicaId(r)))
        .into_iter()
        .chain([0, 1].map(|c| Principal::Client(ClientId(c))))
        .collect();
    assert_eq!(to, &expected);
    assert_eq!(f.replicas[0].epoch(), first.epoch);
    // A peer installs it and seals for us under it; our old (long-term) key is retiring.
    let d = crate::crypto::Digest::of(b"x");
    let before = f.replicas[1].mac_for(Principal::Order(ReplicaId(0)), &d);
    f.replicas[1]
        .accept_new_key(Process::Replica(ReplicaId(0)), first)
        .unwrap();
    let after = f.replicas[1].mac_for(Principal::Order(ReplicaId(0)), &d);
    assert!(f.replicas[0]
        .verify_mac(Principal::Auth(ReplicaId(1)), &d, &before)
        .is_ok());
    // The retirement comes with a tick after the overlap; the old key is refused from then on.
    let mut out = Vec::new();
    a.handle(300_010, Input::Timer(Timer::AuthTick), &mut out);
    assert_eq!(a.stats().get("keys_retired"), 1);
    assert!(f.replicas[0]
        .verify_mac(Principal::Auth(ReplicaId(1)), &d, &before)
        .is_err());
    assert!(f.replicas[0]
        .verify_mac(Principal::Auth(ReplicaId(1)), &d, &after)
        .is_ok());
    // The next refresh a period after the first.
    let mut out = Vec::new();
    a.handle(1_000_010, Input::Timer(Timer::AuthTick), &mut out);
    let keys = new_keys(&out);
    let second = &keys.iter().find(|(_, _, hello)| !hello).expect("a refresh").1;
    assert!(second.epoch > first.epoch);
    // Replicas whose NEW-KEY we lack are asked again (none answered here).
    assert!(a.stats().get("new_key_hello_again") >= 1);
    // A peer's hello: installed and answered with our current NEW-KEY, to it alone; a replay
    // of it is stale and changes nothing.
    let peer = f.replicas[2].refresh(5).unwrap();
    let hello = |key: crate::session::NewKey| {
        Arc::new(Envelope::seal(
            &f.replicas[2],
            &f.quorums,
            Principal::Auth(ReplicaId(2)),
            Message::NewKey { key, hello: true },
            SealFor::Nothing,
        ))
    };
    let out = run(&mut a, 1_000_020, hello(peer.clone()));
    assert_eq!(a.stats().get("new_key_installed"), 1);
    let keys = new_keys(&out);
    assert_eq!(keys.len(), 1);
    assert_eq!((&keys[0].0, &keys[0].1), (&vec![Principal::Auth(ReplicaId(2))], second));
    assert_eq!(f.replicas[0].peer_epoch(Process::Replica(ReplicaId(2))), 5);
    run(&mut a, 1_000_030, hello(peer));
    assert_eq!(a.stats().get("new_key_stale"), 1);
    // Forged: replica 2's announcement claimed by replica 3 (its signature does not match).
    let forged = Arc::new(Envelope::seal(
        &f.replicas[3],
        &f.quorums,
        Principal::Auth(ReplicaId(3)),
        Message::NewKey {
            key: f.replicas[2].refresh(6).unwrap(),
            hello: false,
        },
        SealFor::Nothing,
    ));
    run(&mut a, 1_000_040, forged);
    assert_eq!(a.stats().get("new_key_bad_signature"), 1);
    // A restart: the stored epoch is the floor of the next one, whatever the clock says.
    let mut storage = Storage::new();
    storage.insert(
        super::keys::EPOCH_KEY.to_string(),
        Bytes::copy_from_slice(&second.epoch.to_le_bytes()),
    );
    f.replicas[0].reset_session();
    let mut again = stage(&f, 0, &storage);
    let mut out = Vec::new();
    again.handle(5, Input::Start, &mut out);
    let keys = new_keys(&out);
    assert_eq!(keys[0].1.epoch, second.epoch + 1);
}

/// A replica in a later configuration answers a client that names an earlier epoch with the
/// change that made its configuration (MACed for the client), at most once per half initial
/// retransmission timeout, and still forwards the request.
#[test]
fn a_client_behind_the_configuration_is_told_the_change() {
    use crate::config::PublicKeys;
    use crate::crypto::SecretKeys;
    use crate::reconfig::Reconfiguration;
    let f = fixture(1, 1, 2, Knobs::default());
    let mut base = (*f.config).clone();
    base.admin = Some(ClientId(1));
    let keys: Vec<PublicKeys> = base.replicas.iter().map(|r| r.keys).collect();
    let change = Reconfiguration {
        epoch: 1,
        from_u: 1,
        from_r: 1,
        from_replicas: keys.clone(),
        u: 1,
        r: 1,
        endpoints: vec![String::new(); 4],
        replicas: keys,
    }
    .sign(&base.cluster_name, &SecretKeys::from_seed([101; 32]));
    let next = Arc::new(crate::reconfig::successor(&base, &change, false).unwrap());
    let ring = Arc::new(f.replicas[0].successor(&next, Process::Replica(ReplicaId(0)), false));
    let mut stage = AuthStage::new(next, ReplicaId(0), ring, &Storage::new()).unwrap();
    let told = |actions: &[Action]| {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send { to, envelope } => match &envelope.message {
                    Message::Configuration { change } => Some((to.clone(), (**change).clone(), envelope.clone())),
                    _ => None,
                },
                _ => None,
            })
            .collect::<Vec<_>>()
    };
    let out = run(&mut stage, 0, request(&f, 0, 1, b"op"));
    let answers = told(&out);
    assert_eq!(answers.len(), 1);
    let (to, got, envelope) = &answers[0];
    assert_eq!(to, &vec![Principal::Client(ClientId(0))]);
    assert_eq!(got, &change);
    assert!(envelope.open_static(&f.clients[0], None).is_ok());
    assert!(!auth_requests(&out).is_empty(), "the request is forwarded all the same");
    // Not again at once.
    let out = run(&mut stage, 1_000, request(&f, 0, 2, b"op2"));
    assert!(told(&out).is_empty());
}

/// A member a shrink renumbered cannot check a MAC a client of the earlier configuration made
/// for its old id; it still tells that client the change (nothing else of the request counts).
#[test]
fn a_client_behind_whose_mac_does_not_verify_here_is_told_the_change_and_nothing_more() {
    let f = fixture(1, 1, 2, Knobs::default());
    let mut base = (*f.config).clone();
    base.admin = Some(ClientId(1));
    let change = crate::testing::swap_change(&base, 0, 3);
    let next = Arc::new(crate::reconfig::successor(&base, &change, false).unwrap());
    // Replica 3's process, renumbered to 0.
    let ring = Arc::new(f.replicas[3].successor(&next, Process::Replica(ReplicaId(0)), false));
    let mut stage = AuthStage::new(next, ReplicaId(0), ring, &Storage::new()).unwrap();
    // The client sealed for replica 0 of epoch 0 (another process).
    let out = run(&mut stage, 0, request(&f, 0, 1, b"op"));
    let told: Vec<&Arc<Envelope>> = out
        .iter()
        .filter_map(|a| match a {
            Action::Send { envelope, .. } if matches!(envelope.message, Message::Configuration { .. }) => {
                Some(envelope)
            }
            _ => None,
        })
        .collect();
    assert_eq!(told.len(), 1, "{out:?}");
    assert!(
        auth_requests(&out).is_empty(),
        "a request whose MAC failed goes nowhere"
    );
    assert_eq!(stage.stats().get("dropped_bad_seal"), 1);
}
