//! The client's state file as a restarted client uses it: a restarted client continues with the
//! next id, a request persisted but never answered is sent again first (so it cannot wedge the
//! client), an unwritable file stops the client (callers get an error, nothing panics) instead of
//! sending requests whose ids a restart could reuse, and an unreadable one is an error at start.

mod common;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use upright_core::kv::{KvOperation, KvReply};
use upright_node::client::{start_client, ClientError, ClientHandle};
use upright_node::files::ClientFile;

const OP_TIMEOUT: Duration = Duration::from_secs(20);

async fn put(client: &ClientHandle, key: &str, value: &str) -> Result<Bytes, ClientError> {
    let op = KvOperation::Put {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
    };
    client.invoke_timeout(op.encode(), false, OP_TIMEOUT).await
}

async fn get(client: &ClientHandle, key: &str) -> Option<Bytes> {
    let op = KvOperation::Get {
        key: Bytes::copy_from_slice(key.as_bytes()),
    };
    match KvReply::decode(&client.invoke_timeout(op.encode(), false, OP_TIMEOUT).await.ok()?)? {
        KvReply::Value(v) => v,
        _ => None,
    }
}

fn stored_id(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

fn answered_id(path: &Path) -> u64 {
    let done = path.with_file_name(format!("{}.done", path.file_name().unwrap().to_string_lossy()));
    std::fs::read_to_string(done).unwrap().trim().parse().unwrap()
}

fn put_op(key: &str, value: &str) -> Bytes {
    KvOperation::Put {
        key: Bytes::copy_from_slice(key.as_bytes()),
        value: Bytes::copy_from_slice(value.as_bytes()),
    }
    .encode()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_client_continues_with_the_next_id_and_an_unwritable_file_stops_it() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::make_cluster(dir.path(), "client-ids");
    common::start_replicas(&cluster);
    let setup = || ClientFile::load(&dir.path().join("client-0.toml")).unwrap();
    let state = dir.path().join("client-0.ids");

    let client = start_client(setup(), Some(state.clone())).unwrap();
    for i in 0..3 {
        let reply = put(&client, "k", &format!("v{i}")).await.unwrap();
        assert_eq!(KvReply::decode(&reply), Some(KvReply::Done));
    }
    assert_eq!(stored_id(&state), 3);
    assert_eq!(
        answered_id(&state),
        3,
        "the answer to request 3 is noted: no replay needed"
    );
    drop(client);

    // The restarted client continues with id 4: its write is executed, not answered from the
    // reply cache of an old request with the same id.
    let client = start_client(setup(), Some(state.clone())).unwrap();
    let reply = put(&client, "k", "after restart").await.unwrap();
    assert_eq!(KvReply::decode(&reply), Some(KvReply::Done));
    assert_eq!(get(&client, "k").await.as_deref(), Some(&b"after restart"[..]));
    assert_eq!(stored_id(&state), 5);
    drop(client);

    // A state file that cannot be written: the caller gets an error, nothing panics.
    let broken = start_client(setup(), Some(dir.path().join("missing-dir").join("ids"))).unwrap();
    assert!(matches!(put(&broken, "k", "lost").await, Err(ClientError::Stopped)));
    let client = start_client(setup(), Some(state.clone())).unwrap();
    assert_eq!(get(&client, "k").await.as_deref(), Some(&b"after restart"[..]));
    drop(client);

    // A crash after request 7 was persisted but before it was answered (here: before it reached
    // any replica): the restarted client sends it first under id 7, then orders its new requests
    // after it. Without that, request 8 would wait forever for the missing 7.
    assert_eq!(stored_id(&state), 6);
    let unsent = put_op("k", "persisted, never sent");
    std::fs::write(&state, format!("7\n{}\n", hex::encode(&unsent))).unwrap();
    let client = start_client(setup(), Some(state.clone())).unwrap();
    let reply = put(&client, "other", "x")
        .await
        .expect("not wedged by the unanswered request");
    assert_eq!(KvReply::decode(&reply), Some(KvReply::Done));
    assert_eq!(get(&client, "k").await.as_deref(), Some(&b"persisted, never sent"[..]));
    assert_eq!((stored_id(&state), answered_id(&state)), (9, 9));
    drop(client);

    // An unreadable state file is an error at start, not a silent restart from id 0.
    std::fs::write(&state, "not a number").unwrap();
    let err = start_client(setup(), Some(state.clone())).err().expect("refused");
    assert!(err.to_string().contains("refusing to guess"), "{err}");
}
