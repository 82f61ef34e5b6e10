//! Clients started as one group share one connection per replica, and each still gets exactly its
//! own results (the replicas' tagged replies reach the right client).

mod common;

use std::time::Duration;

use bytes::Bytes;
use upright_core::kv::{KvOperation, KvReply};
use upright_node::client::{start_clients, ClientHandle};
use upright_node::files::ClientFile;

const OP_TIMEOUT: Duration = Duration::from_secs(20);

async fn run(client: ClientHandle, c: usize, n: usize) -> Vec<Option<Bytes>> {
    let mut seen = Vec::new();
    for i in 0..n {
        let key = Bytes::from(format!("key-{c}"));
        let value = Bytes::from(format!("value-{c}-{i}"));
        let put = KvOperation::Put {
            key: key.clone(),
            value,
        }
        .encode();
        let done = client.invoke_timeout(put, false, OP_TIMEOUT).await.unwrap();
        assert_eq!(KvReply::decode(&done), Some(KvReply::Done));
        // Alternate the ordered and the read-only path for the read back.
        let get = KvOperation::Get { key }.encode();
        let read = client.invoke_timeout(get, i % 2 == 0, OP_TIMEOUT).await.unwrap();
        match KvReply::decode(&read) {
            Some(KvReply::Value(v)) => seen.push(v),
            other => panic!("client {c}: unexpected reply {other:?}"),
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_one_group_share_connections_and_each_gets_its_own_results() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::make_cluster(dir.path(), "shared");
    common::start_replicas(&cluster);
    let setup = |c: u32| ClientFile::load(&dir.path().join(format!("client-{c}.toml"))).unwrap();
    let state = dir.path().join("client-0.ids");

    let twice = start_clients(vec![(setup(1), None), (setup(1), None)]);
    assert!(twice.err().expect("refused").0.contains("listed twice"));

    let clients = start_clients(vec![(setup(0), Some(state.clone())), (setup(1), None)]).unwrap();
    let n = 6;
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(c, h)| tokio::spawn(run(h.clone(), c, n)))
        .collect();
    for (c, task) in tasks.into_iter().enumerate() {
        let seen = task.await.unwrap();
        let expected: Vec<Option<Bytes>> = (0..n).map(|i| Some(Bytes::from(format!("value-{c}-{i}")))).collect();
        assert_eq!(seen, expected, "client {c}");
    }
    // One connection per replica for both clients (their transport counters are shared).
    assert_eq!(clients[0].counters().get("net_connects"), 4);
    assert_eq!(clients[1].counters().get("net_connects"), 4);
    assert_eq!(clients[0].counters().get("net_dropped_unknown_client"), 0);
    // Client 0 kept its state file as a lone client would.
    let text = std::fs::read_to_string(&state).unwrap();
    assert!(text.lines().next().unwrap().parse::<u64>().unwrap() >= n as u64);
}
