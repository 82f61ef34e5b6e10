//! Four replicas in one process over real TCP on loopback, with the real authentication stage and
//! a recording stand-in for the order stage: client -> auth -> order traffic, durability of the
//! auth stage's log, the metrics endpoint, and a hostile peer and client that change nothing.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::AsyncWriteExt;
use upright_core::auth::AuthStage;
use upright_core::crypto::{Authenticator, KeyRing, Mac};
use upright_core::ids::{ClientId, Principal, Process, ReplicaId, RequestId, StageKind};
use upright_core::message::{Envelope, Message, Seal};
use upright_core::stage::{Action, Input, Stage, Stats, Time};
use upright_node::client::start_client;
use upright_node::files::{self, ClientFile, Cluster};
use upright_node::metrics::http_get;
use upright_node::replica::{run_replica, ReplicaSpec, StageFactory};
use upright_node::storage::StorageOptions;
use upright_node::transport::{read_frame, write_frame, Hello, HelloList, Nonce};

type Seen = Arc<Mutex<BTreeSet<(u32, u32, u64, u32)>>>; // (at replica, client, request, from auth)

/// Records every AUTH-REQ it receives (order stand-in); does nothing else.
struct Recorder {
    me: ReplicaId,
    kind: StageKind,
    seen: Seen,
    stats: Stats,
}

impl Stage for Recorder {
    fn principal(&self) -> Principal {
        match self.kind {
            StageKind::Order => Principal::Order(self.me),
            _ => Principal::Exec(self.me),
        }
    }
    fn handle(&mut self, _now: Time, input: Input, _out: &mut Vec<Action>) {
        if let Input::Message(envelope) = input {
            if let (Message::AuthRequest { items }, Principal::Auth(from)) = (&envelope.message, envelope.from) {
                for item in items {
                    let key = (self.me.0, item.entry.client.0, item.entry.request_id.0, from.0);
                    self.seen.lock().unwrap().insert(key);
                }
            }
        }
    }
    fn stats(&self) -> &Stats {
        &self.stats
    }
}

fn start_replica(cluster: &Cluster, id: u32, seen: Seen) {
    let keys = files::load_replica_keys(cluster, id, &cluster.key_path(id)).unwrap();
    let config = cluster.config.clone();
    let factory: StageFactory = Arc::new(move |kind, storage, ring: Arc<KeyRing>| {
        Ok(match kind {
            StageKind::Auth => Box::new(AuthStage::new(config.clone(), ReplicaId(id), ring, storage)?),
            kind => Box::new(Recorder {
                me: ReplicaId(id),
                kind,
                seen: seen.clone(),
                stats: Stats::default(),
            }),
        })
    });
    let spec = ReplicaSpec {
        cluster: cluster.clone(),
        id,
        keys,
        storage: StorageOptions::default(),
        service: upright_core::stages::kv_service(),
        stages: Some(factory),
        wrap: None,
    };
    tokio::spawn(async move { run_replica(spec, std::future::pending()).await.unwrap() });
}

/// Waits until every replica's order stand-in saw request `request_id` of `client` from at least
/// three distinct auth members.
async fn wait_forwarded(seen: &Seen, client: u32, request_id: u64) {
    for _ in 0..200 {
        let ok = {
            let seen = seen.lock().unwrap();
            (0..4).all(|r| {
                seen.iter()
                    .filter(|(at, c, id, _)| *at == r && *c == client && *id == request_id)
                    .count()
                    >= 3
            })
        };
        if ok {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "request {request_id} of client {client} was not forwarded: {:?}",
        seen.lock().unwrap()
    );
}

async fn counter(cluster: &Cluster, id: u32, name: &str) -> u64 {
    let addr = files::resolve(&cluster.file.replica(id).unwrap().metrics_addr).unwrap();
    let text = http_get(addr, "/metrics", None).await.unwrap();
    text.lines()
        .filter(|l| l.contains(&format!("name=\"{name}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_requests_reach_every_order_member_and_hostile_input_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = common::make_cluster(dir.path(), "loopback");
    let seen: Seen = Arc::default();
    for id in 0..4 {
        start_replica(&cluster, id, seen.clone());
    }
    let setup = ClientFile::load(&dir.path().join("client-0.toml")).unwrap();
    let client = start_client(setup, None).unwrap();
    // Longer than the inline limit: the body travels by digest, so the auth member must keep it.
    let put = Bytes::from(b"first operation".repeat(cluster.config.knobs.inline_request_bytes_max / 15 + 1));
    assert!(put.len() > cluster.config.knobs.inline_request_bytes_max);
    let c = client.clone();
    tokio::spawn(async move { c.invoke(put, false).await });
    wait_forwarded(&seen, 0, 1).await;
    // The auth member persisted the request before forwarding it.
    let log = std::fs::read(cluster.data_dir(0).join("auth").join("log")).unwrap();
    let (records, _) = upright_node::storage::parse_records(&log);
    let holds_request = |r: &upright_node::storage::Record| {
        r.key.starts_with("auth/")
            && r.value
                .as_ref()
                .is_some_and(|v| v.windows(15).any(|w| w == b"first operation"))
    };
    assert!(records.iter().any(holds_request), "{records:?}");

    // A Byzantine replica 3 (it has its own keys) dials replica 0 and misbehaves.
    let ring3 = KeyRing::new(
        &cluster.config,
        Process::Replica(ReplicaId(3)),
        &files::load_replica_keys(&cluster, 3, &cluster.key_path(3)).unwrap(),
    );
    let replica_addr = files::resolve(&cluster.file.replica(0).unwrap().replica_addr).unwrap();
    let hello = |challenge| {
        let hello = Hello::new(&ring3, "loopback", Process::Replica(ReplicaId(0)), challenge, [7; 32]);
        upright_core::codec::to_bytes(&hello)
    };
    // 1. Garbage instead of a hello.
    let mut s = tokio::net::TcpStream::connect(replica_addr).await.unwrap();
    s.write_all(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]).await.unwrap();
    // 2. A valid hello, then an oversized frame header.
    let (mut s2, recorded) = greeted(replica_addr, hello).await;
    s2.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    // 3. A valid hello, then a garbage frame.
    let (mut s3, _) = greeted(replica_addr, hello).await;
    write_frame(&mut s3, b"\x01not an envelope").await.unwrap();
    // 4. A valid hello, then a message claiming to come from another replica.
    let (mut s4, _) = greeted(replica_addr, hello).await;
    let forged = Envelope::new(
        Principal::Order(ReplicaId(1)),
        Message::LastExecuted {
            seqno: Default::default(),
        },
        Seal::None,
    );
    write_frame(&mut s4, &upright_core::wire::encode(&forged))
        .await
        .unwrap();
    // 5. A client (1) with a valid hello sends a request with a forged authenticator.
    let ring_c1 = KeyRing::new(
        &cluster.config,
        Process::Client(ClientId(1)),
        &ClientFile::load(&dir.path().join("client-1.toml")).unwrap().keys,
    );
    let client_addr = files::resolve(&cluster.file.replica(0).unwrap().client_addr).unwrap();
    let (mut s5, _) = greeted(client_addr, |challenge| {
        HelloList::new([&ring_c1], "loopback", ReplicaId(0), challenge).encode()
    })
    .await;
    // 6. Replica 3's recorded hello (connection 2's) replayed on a new connection.
    let mut s6 = tokio::net::TcpStream::connect(replica_addr).await.unwrap();
    let _challenge = read_frame(&mut s6, 32).await.unwrap();
    write_frame(&mut s6, &recorded).await.unwrap();
    let forged_request = Envelope::new(
        Principal::Client(ClientId(1)),
        Message::ClientRequest {
            client: ClientId(1),
            request_id: RequestId(1),
            operation: Bytes::from_static(b"forged"),
            read_only: false,
            signature: None,
            config_epoch: 0,
        },
        Seal::Authenticator(Authenticator {
            macs: vec![Mac::default(); 4],
        }),
    );
    write_frame(&mut s5, &upright_core::wire::encode(&forged_request))
        .await
        .unwrap();
    s5.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;

    assert!(counter(&cluster, 0, "net_closed_bad_hello").await >= 1);
    assert_eq!(
        counter(&cluster, 0, "net_hello_stale_challenge").await,
        1,
        "the replayed hello"
    );
    assert_eq!(counter(&cluster, 0, "net_closed_oversized").await, 1);
    assert_eq!(counter(&cluster, 0, "net_closed_garbage").await, 1);
    assert_eq!(counter(&cluster, 0, "net_dropped_wrong_sender").await, 1);
    assert_eq!(counter(&cluster, 0, "dropped_bad_seal").await, 1);
    assert!(
        !seen.lock().unwrap().iter().any(|(_, c, _, _)| *c == 1),
        "the forged request was never forwarded"
    );
    // The cluster keeps serving: client 1's honest first request goes through everywhere.
    let honest = start_client(ClientFile::load(&dir.path().join("client-1.toml")).unwrap(), None).unwrap();
    tokio::spawn(async move { honest.invoke(Bytes::from_static(b"honest"), false).await });
    wait_forwarded(&seen, 1, 1).await;
    let status = http_get(
        files::resolve(&cluster.file.replica(0).unwrap().metrics_addr).unwrap(),
        "/status",
        None,
    )
    .await
    .unwrap();
    assert!(status.contains("replica=0"), "{status}");
    drop((s, s2, s3, s4, s5));
}

/// A connection to `addr` that read the listener's challenge and wrote `hello(challenge)`; the
/// stream and the hello written.
async fn greeted(addr: std::net::SocketAddr, hello: impl FnOnce(Nonce) -> Vec<u8>) -> (tokio::net::TcpStream, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let challenge: Nonce = read_frame(&mut s, 32).await.unwrap().try_into().unwrap();
    let bytes = hello(challenge);
    write_frame(&mut s, &bytes).await.unwrap();
    (s, bytes)
}
