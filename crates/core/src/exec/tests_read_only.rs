//! Unit tests of the read-only path at an execution member.

use std::sync::Arc;

use bytes::Bytes;

use super::tests::{chain, put, replies, sent, Net, CLIENT};
use crate::ids::{ClientId, Principal, ReplicaId, RequestId, StageKind};
use crate::kv::{KvOperation, KvReply};
use crate::message::{Envelope, Message, ReplyBody, SealFor};
use crate::stage::{Action, Input, Stage};

fn get(key: &str) -> Bytes {
    KvOperation::Get {
        key: key.to_string().into(),
    }
    .encode()
}

/// A READ-ONLY request from client `client_index` (0 = CLIENT) sealed for the execution stage.
fn read_only(net: &Net, client_index: usize, nonce: u64, operation: Bytes) -> Envelope {
    let client = [CLIENT, ClientId(8)][client_index];
    Envelope::seal(
        &net.client_rings[client_index],
        &net.q,
        Principal::Client(client),
        Message::ReadOnlyRequest {
            client,
            request_id: RequestId(nonce),
            operation,
        },
        SealFor::Stage(StageKind::Exec),
    )
}

fn step(stage: &mut super::ExecStage, envelope: Envelope) -> Vec<Action> {
    let mut out = Vec::new();
    stage.handle(5, Input::Message(Arc::new(envelope)), &mut out);
    out
}

fn value(v: Option<&str>) -> ReplyBody {
    ReplyBody::Full(KvReply::Value(v.map(|s| Bytes::copy_from_slice(s.as_bytes()))).encode())
}

#[test]
fn read_only_get_is_answered_in_full_from_the_current_state_without_changing_anything() {
    let net = Net::small();
    let mut stage = net.kv_stage(2);
    let batches = chain(vec![vec![put(1, "a", "1")]]);
    net.deliver(&mut stage, &batches[0]);
    let checkpoint_before = stage.service.checkpoint();
    let executed_before = stage.last_executed();
    let out = step(&mut stage, read_only(&net, 0, 7, get("a")));
    // Every member (not just the designated one) sends the full result, flagged read-only.
    let sent = sent(&out);
    assert_eq!(sent.len(), 1);
    assert!(matches!(
        &sent[0].1,
        Message::Reply { request_id: RequestId(7), read_only: true, result, .. } if *result == value(Some("1"))
    ));
    assert!(
        !out.iter().any(|a| matches!(a, Action::Persist { .. })),
        "no storage writes"
    );
    assert_eq!(stage.service.checkpoint(), checkpoint_before);
    assert_eq!(stage.last_executed(), executed_before);
    // The reply cache still holds the ordered reply: a RETRANSMIT is answered with it.
    assert_eq!(stage.replies.get(CLIENT).map(|c| c.request_id), Some(RequestId(1)));
    assert_eq!(stage.stats.get("read_only_answered"), 1);
}

#[test]
fn write_operations_stale_nonces_forgeries_and_unknown_clients_get_no_reply() {
    let net = Net::small();
    let mut stage = net.kv_stage(0);
    let write = KvOperation::Put {
        key: "a".into(),
        value: "x".into(),
    }
    .encode();
    // A write flagged read-only: no reply, no effect.
    assert!(sent(&step(&mut stage, read_only(&net, 0, 3, write))).is_empty());
    assert_eq!(stage.stats.get("read_only_refused_write"), 1);
    assert_eq!(
        stage.service.execute_read_only(&get("a")),
        Some(KvReply::Value(None).encode())
    );
    // Nonce 3 is spent even though it was refused; 2 is older; 4 is answered once.
    assert!(sent(&step(&mut stage, read_only(&net, 0, 3, get("a")))).is_empty());
    assert!(sent(&step(&mut stage, read_only(&net, 0, 2, get("a")))).is_empty());
    assert_eq!(
        replies(&step(&mut stage, read_only(&net, 0, 4, get("a"))), CLIENT).len(),
        1
    );
    assert!(sent(&step(&mut stage, read_only(&net, 0, 4, get("a")))).is_empty());
    assert_eq!(stage.stats.get("read_only_stale_nonce"), 3);
    // Another client's nonces are its own.
    assert_eq!(
        replies(&step(&mut stage, read_only(&net, 1, 1, get("a"))), ClientId(8)).len(),
        1
    );
    // A bad seal: client 8's request claiming to be CLIENT.
    let mut forged = read_only(&net, 1, 9, get("a"));
    forged.from = Principal::Client(CLIENT);
    if let Message::ReadOnlyRequest { client, .. } = &mut forged.message {
        *client = CLIENT;
    }
    assert!(sent(&step(&mut stage, forged)).is_empty());
    assert_eq!(stage.stats.get("bad_seal"), 1);
    // A request whose sender is not the client it names, and a replica posing as a client.
    let mut mismatched = read_only(&net, 1, 10, get("a"));
    mismatched.from = Principal::Client(CLIENT);
    assert!(sent(&step(&mut stage, mismatched)).is_empty());
    let by_replica = Envelope::seal(
        &net.rings[1],
        &net.q,
        Principal::Exec(ReplicaId(1)),
        Message::ReadOnlyRequest {
            client: CLIENT,
            request_id: RequestId(11),
            operation: get("a"),
        },
        SealFor::Stage(StageKind::Exec),
    );
    assert!(sent(&step(&mut stage, by_replica)).is_empty());
    assert_eq!(stage.stats.get("read_only_wrong_sender"), 2);
    // Nonce 0 is never valid.
    assert!(sent(&step(&mut stage, read_only(&net, 1, 0, get("a")))).is_empty());
    assert_eq!(stage.stats.get("read_only_bad_request"), 1);
}
