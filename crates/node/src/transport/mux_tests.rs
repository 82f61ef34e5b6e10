//! Tests of shared connections: client multiplexing (the replica's checks of a hello list and of
//! who may send on a shared connection, and the client side's split of tagged replies), and the
//! one connection a replica pair shares for both directions ([`PeerLinks`]).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use upright_core::config::{ClientInfo, ClusterConfig, Knobs, ReplicaInfo};
use upright_core::crypto::SecretKeys;
use upright_core::ids::{Principal, SeqNo};
use upright_core::message::{Message, Seal};

use super::*;
use crate::transport::{
    dial_peer, dial_peer_as, fresh_nonce, read_frame, serve, write_frame, write_tagged_frame, Identities, Identity,
    Listener, PeerLinks, HELLO_BYTES_MAX,
};

const NAME: &str = "mux";

struct Keys {
    config: ClusterConfig,
    replicas: Vec<SecretKeys>,
    clients: Vec<SecretKeys>,
}

impl Keys {
    fn new() -> Keys {
        let replicas: Vec<SecretKeys> = (0..4u8).map(|i| SecretKeys::from_seed([i + 1; 32])).collect();
        let clients: Vec<SecretKeys> = (0..4u8).map(|i| SecretKeys::from_seed([i + 100; 32])).collect();
        let config = ClusterConfig {
            cluster_name: NAME.into(),
            u: 1,
            r: 1,
            replicas: replicas
                .iter()
                .enumerate()
                .map(|(i, s)| ReplicaInfo {
                    id: ReplicaId(i as u32),
                    keys: s.public(),
                })
                .collect(),
            clients: clients
                .iter()
                .enumerate()
                .map(|(i, s)| ClientInfo {
                    id: ClientId(i as u32),
                    keys: s.public(),
                })
                .collect(),
            knobs: Knobs::default(),
            admin: None,
            epoch: 0,
            origin: None,
            protocol: Default::default(),
            selective_execution: false,
            separate_stages: false,
            exec_u: None,
        };
        Keys {
            config,
            replicas,
            clients,
        }
    }

    fn replica(&self, r: u32) -> KeyRing {
        KeyRing::new(&self.config, Process::Replica(ReplicaId(r)), &self.replicas[r as usize])
    }

    fn client(&self, c: u32) -> KeyRing {
        KeyRing::new(&self.config, Process::Client(ClientId(c)), &self.clients[c as usize])
    }
}

/// Replica 0's client listener: its inbox, routes and counters.
struct Server {
    addr: SocketAddr,
    inbox: Arc<Inbox>,
    routes: Arc<ClientRoutes>,
    counters: Arc<Counters>,
}

/// A free loopback TCP port.
fn tcp_any() -> Endpoint {
    Endpoint::Tcp("127.0.0.1:0".parse().unwrap())
}

fn tcp(at: &Endpoint) -> SocketAddr {
    match at {
        Endpoint::Tcp(addr) => *addr,
        Endpoint::Unix(path) => panic!("not TCP: {}", path.display()),
    }
}

/// A listener of replica `me` at `at`: its address, inbox and counters.
async fn listen(
    keys: &Keys,
    me: u32,
    at: Endpoint,
    admit: fn(Process) -> bool,
    routes: Option<Arc<ClientRoutes>>,
    links: Option<Arc<PeerLinks>>,
    counters: Arc<Counters>,
) -> (Endpoint, Arc<Inbox>) {
    let listener = Listener::bind(&at).await.unwrap();
    let addr = listener.local_endpoint().unwrap();
    let inbox = Arc::new(Inbox::new(counters.clone()));
    let keys = Arc::new(keys.replica(me));
    let name = NAME.into();
    tokio::spawn(serve(
        listener,
        Arc::new(crate::transport::Identities::single(keys)),
        name,
        admit,
        inbox.clone(),
        routes,
        links,
        1 << 16,
        counters,
    ));
    (addr, inbox)
}

async fn server(keys: &Keys) -> Server {
    let counters = Arc::new(Counters::default());
    let routes = Arc::new(ClientRoutes::default());
    let admit = |p| matches!(p, Process::Client(_));
    let (addr, inbox) = listen(keys, 0, tcp_any(), admit, Some(routes.clone()), None, counters.clone()).await;
    Server {
        addr: tcp(&addr),
        inbox,
        routes,
        counters,
    }
}

fn envelope(from: Principal, seqno: u64) -> Vec<u8> {
    upright_core::wire::encode(&Envelope::new(
        from,
        Message::LastExecuted { seqno: SeqNo(seqno) },
        Seal::None,
    ))
}

fn seqno(envelope: &Envelope) -> u64 {
    match envelope.message {
        Message::LastExecuted { seqno } => seqno.0,
        _ => panic!("unexpected message {envelope:?}"),
    }
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The challenge an accepting side writes first on `stream`.
async fn challenge_of(stream: &mut TcpStream) -> Nonce {
    read_frame(stream, 32).await.unwrap().try_into().expect("32 bytes")
}

/// A connection to the client listener at `addr` presenting `list(challenge)`.
async fn present(addr: SocketAddr, list: impl FnOnce(Nonce) -> HelloList) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let challenge = challenge_of(&mut s).await;
    write_frame(&mut s, &list(challenge).encode()).await.unwrap();
    s
}

/// Whether the peer closed `stream` (reads hit the end within the deadline).
async fn closed(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test]
async fn a_bad_mac_in_one_hello_closes_the_whole_connection() {
    let keys = Keys::new();
    let server = server(&keys).await;
    let mut s = present(server.addr, |challenge| {
        let mut forged = Hello::new(
            &keys.client(3),
            NAME,
            Process::Replica(ReplicaId(0)),
            challenge,
            [0; 32],
        );
        forged.from = Process::Client(ClientId(2)); // claims client 2, MACed with client 3's key
        let mut list = HelloList::new([&keys.client(1)], NAME, ReplicaId(0), challenge);
        list.0.push(forged);
        list
    })
    .await;
    assert!(closed(&mut s).await);
    assert_eq!(server.counters.get("net_hello_bad_mac"), 1);
    assert!(!server.routes.is_connected(ClientId(1)) && !server.routes.is_connected(ClientId(2)));

    // A replica's hello, an empty list and a client listed twice are refused as well.
    let (r1, c1) = (keys.replica(1), keys.client(1));
    let lists: [&dyn Fn(Nonce) -> HelloList; 3] = [
        &|ch| HelloList::new([&r1], NAME, ReplicaId(0), ch),
        &|_| HelloList(vec![]),
        &|ch| HelloList::new([&c1, &c1], NAME, ReplicaId(0), ch),
    ];
    for list in lists {
        let mut s = present(server.addr, list).await;
        assert!(closed(&mut s).await);
    }
    assert_eq!(server.counters.get("net_closed_wrong_listener"), 1);
    assert_eq!(server.counters.get("net_closed_bad_hello_list"), 2);
    assert!(server.inbox.is_empty());
}

#[tokio::test]
async fn a_client_not_in_the_hello_list_cannot_inject() {
    let keys = Keys::new();
    let server = server(&keys).await;
    let (c1, c2) = (keys.client(1), keys.client(2));
    let mut s = present(server.addr, |ch| HelloList::new([&c1, &c2], NAME, ReplicaId(0), ch)).await;
    write_frame(&mut s, &envelope(Principal::Client(ClientId(3)), 30))
        .await
        .unwrap();
    write_frame(&mut s, &envelope(Principal::Order(ReplicaId(1)), 40))
        .await
        .unwrap();
    write_frame(&mut s, &envelope(Principal::Client(ClientId(2)), 20))
        .await
        .unwrap();
    write_frame(&mut s, &envelope(Principal::Client(ClientId(1)), 10))
        .await
        .unwrap();
    eventually("two envelopes", || server.inbox.len() == 2).await;
    eventually("the drops", || server.counters.get("net_dropped_wrong_sender") == 2).await;
    let mut got: Vec<(Process, u64)> = server
        .inbox
        .pop_round_robin(10)
        .iter()
        .map(|(p, e)| (*p, seqno(e)))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![(Process::Client(ClientId(1)), 10), (Process::Client(ClientId(2)), 20)]
    );
    assert!(server.routes.is_connected(ClientId(1)) && server.routes.is_connected(ClientId(2)));
    assert!(!server.routes.is_connected(ClientId(3)));
    drop(s);
    eventually("unregistered", || !server.routes.is_connected(ClientId(1))).await;
    assert!(!server.routes.is_connected(ClientId(2)));
}

#[tokio::test]
async fn replies_reach_the_right_client_of_a_shared_connection() {
    let keys = Keys::new();
    let server = server(&keys).await;
    let counters = Arc::new(Counters::default());
    let inboxes: BTreeMap<ClientId, Arc<Inbox>> = [1, 2]
        .into_iter()
        .map(|c| (ClientId(c), Arc::new(Inbox::new(counters.clone()))))
        .collect();
    let inboxes = Arc::new(inboxes);
    let dialer = dial_clients(
        Endpoint::Tcp(server.addr),
        ReplicaId(0),
        vec![Arc::new(keys.client(1)), Arc::new(keys.client(2))],
        NAME.into(),
        inboxes.clone(),
        1 << 16,
        counters.clone(),
    );
    // Requests of both clients go out on the one connection, each queued under its client.
    dialer.send(Arc::new(envelope(Principal::Client(ClientId(1)), 1)));
    dialer.send(Arc::new(envelope(Principal::Client(ClientId(2)), 2)));
    eventually("both requests", || server.inbox.len() == 2).await;
    let from: Vec<Process> = server.inbox.pop_round_robin(10).iter().map(|(p, _)| *p).collect();
    assert_eq!(from, vec![Process::Client(ClientId(1)), Process::Client(ClientId(2))]);
    assert!(server.routes.is_connected(ClientId(1)) && server.routes.is_connected(ClientId(2)));
    // Replies: two to client 2, one to client 1, on the same connection.
    let reply = |n| Arc::new(envelope(Principal::Exec(ReplicaId(0)), n));
    assert!(server.routes.send(ClientId(2), reply(21)));
    assert!(server.routes.send(ClientId(1), reply(11)));
    assert!(server.routes.send(ClientId(2), reply(22)));
    assert!(!server.routes.send(ClientId(3), reply(31)));
    let (in1, in2) = (&inboxes[&ClientId(1)], &inboxes[&ClientId(2)]);
    eventually("the replies", || in1.len() == 1 && in2.len() == 2).await;
    let take = |inbox: &Inbox| -> Vec<(Process, u64)> {
        inbox.pop_round_robin(10).iter().map(|(p, e)| (*p, seqno(e))).collect()
    };
    let r0 = Process::Replica(ReplicaId(0));
    assert_eq!(take(in1), vec![(r0, 11)]);
    assert_eq!(take(in2), vec![(r0, 21), (r0, 22)]);
    assert_eq!(counters.get("net_connects"), 1);
}

#[tokio::test]
async fn the_client_side_drops_unknown_ids_and_non_replica_senders_and_closes_on_garbage() {
    let keys = Keys::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counters = Arc::new(Counters::default());
    let inbox = Arc::new(Inbox::new(counters.clone()));
    let inboxes = Arc::new(BTreeMap::from([(ClientId(1), inbox.clone())]));
    let _dialer = dial_clients(
        Endpoint::Tcp(addr),
        ReplicaId(0),
        vec![Arc::new(keys.client(1))],
        NAME.into(),
        inboxes,
        1 << 16,
        counters.clone(),
    );
    let admit = |p| matches!(p, Process::Client(_));
    let (mut s, _) = listener.accept().await.unwrap();
    let challenge = fresh_nonce();
    write_frame(&mut s, &challenge).await.unwrap();
    let first = read_frame(&mut s, HELLO_LIST_BYTES_MAX).await.unwrap();
    let clients = HelloList::check(&first, &keys.replica(0), NAME, admit, &challenge).unwrap();
    assert_eq!(clients, BTreeSet::from([ClientId(1)]));
    let tag = |c: u32| c.to_le_bytes();
    let exec = |r: u32| envelope(Principal::Exec(ReplicaId(r)), 5);
    write_tagged_frame(&mut s, &tag(99), &exec(0)).await.unwrap(); // not a client of this process
    let from_client = envelope(Principal::Client(ClientId(7)), 5);
    write_tagged_frame(&mut s, &tag(1), &from_client).await.unwrap(); // not from a replica
    write_tagged_frame(&mut s, &tag(1), &exec(0)).await.unwrap();
    s.flush().await.unwrap();
    eventually("the reply", || inbox.len() == 1).await;
    assert_eq!(counters.get("net_dropped_unknown_client"), 1);
    assert_eq!(counters.get("net_dropped_wrong_sender"), 1);
    write_frame(&mut s, &[1, 0, 0]).await.unwrap(); // shorter than a tag
    s.flush().await.unwrap();
    eventually("the close", || counters.get("net_closed_garbage") == 1).await;
    // It redials and presents the whole list again, answering the new connection's challenge
    // (the old list would not do there).
    let (mut again, _) = listener.accept().await.unwrap();
    let challenge = fresh_nonce();
    write_frame(&mut again, &challenge).await.unwrap();
    let list = read_frame(&mut again, HELLO_LIST_BYTES_MAX).await.unwrap();
    let clients = HelloList::check(&list, &keys.replica(0), NAME, admit, &challenge).unwrap();
    assert_eq!(clients, BTreeSet::from([ClientId(1)]));
    let stale = HelloList::check(&first, &keys.replica(0), NAME, admit, &challenge);
    assert_eq!(stale, Err("net_hello_stale_challenge"));
}

/// Replica 1's replica listener with a link registered for replica 0: its inbox, counters, and the
/// sending end of the link.
async fn linked_replica(keys: &Keys, at: Endpoint) -> (Endpoint, Arc<Inbox>, Arc<Counters>, Dialer) {
    let counters = Arc::new(Counters::default());
    let links = Arc::new(PeerLinks::default());
    let to_0 = links.register(Process::Replica(ReplicaId(0)), counters.clone());
    let admit = |p| matches!(p, Process::Replica(_));
    let (addr, inbox) = listen(keys, 1, at, admit, None, Some(links), counters.clone()).await;
    (addr, inbox, counters, to_0)
}

/// Replica 0 dialling replica 1 at `addr`: its inbox, counters and sending end.
fn replica_0_dials_1(keys: &Keys, addr: Endpoint) -> (Arc<Inbox>, Arc<Counters>, Dialer) {
    let counters = Arc::new(Counters::default());
    let inbox = Arc::new(Inbox::new(counters.clone()));
    let dialer = dial_peer(
        addr,
        Arc::new(keys.replica(0)),
        NAME.into(),
        Process::Replica(ReplicaId(1)),
        inbox.clone(),
        1 << 16,
        counters.clone(),
    );
    (inbox, counters, dialer)
}

fn from_replica(inbox: &Inbox) -> Vec<(Process, u64)> {
    inbox.pop_round_robin(10).iter().map(|(p, e)| (*p, seqno(e))).collect()
}

/// Replica 1 listening at `at` and replica 0 dialling it: one frame each way over the one
/// connection. Replica 0's inbox and counters, and both sending ends (replica 1's to replica 0
/// first; dropping replica 0's closes the connection).
async fn pair_exchanges_both_ways(keys: &Keys, at: Endpoint) -> (Arc<Inbox>, Arc<Counters>, Dialer, Dialer) {
    let (addr, inbox_1, counters_1, to_0) = linked_replica(keys, at).await;
    let (inbox_0, counters_0, to_1) = replica_0_dials_1(keys, addr);
    to_1.send(Arc::new(envelope(Principal::Order(ReplicaId(0)), 1)));
    to_0.send(Arc::new(envelope(Principal::Order(ReplicaId(1)), 2)));
    eventually("0 -> 1", || inbox_1.len() == 1).await;
    eventually("1 -> 0", || inbox_0.len() == 1).await;
    assert_eq!(from_replica(&inbox_1), vec![(Process::Replica(ReplicaId(0)), 1)]);
    assert_eq!(from_replica(&inbox_0), vec![(Process::Replica(ReplicaId(1)), 2)]);
    assert_eq!(counters_0.get("net_connects"), 1, "one connection");
    assert_eq!(counters_1.get("net_links"), 1);
    (inbox_0, counters_0, to_0, to_1)
}

#[tokio::test]
async fn a_replica_pair_shares_one_connection_for_both_directions() {
    let keys = Keys::new();
    let (inbox_0, counters_0, to_0, _to_1) = pair_exchanges_both_ways(&keys, tcp_any()).await;
    // An envelope from anyone but the peer is dropped on the dialling side too.
    to_0.send(Arc::new(envelope(Principal::Order(ReplicaId(2)), 3)));
    eventually("the drop", || counters_0.get("net_dropped_wrong_sender") == 1).await;
    assert!(inbox_0.is_empty());
}

#[tokio::test]
async fn a_replica_pair_links_over_a_unix_socket() {
    let keys = Keys::new();
    let dir = tempfile::tempdir().unwrap();
    pair_exchanges_both_ways(&keys, Endpoint::Unix(dir.path().join("replica-1.sock"))).await;
}

#[tokio::test]
async fn the_dialler_checks_the_peer_hello_and_the_newest_connection_takes_the_link() {
    let keys = Keys::new();
    // A listener that answers as replica 2 where replica 1 was dialled: refused, nothing read.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let impostor = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        write_frame(&mut s, &fresh_nonce()).await.unwrap();
        let theirs: Hello =
            upright_core::codec::from_bytes(&read_frame(&mut s, HELLO_BYTES_MAX).await.unwrap()).unwrap();
        // It answers the dialler's nonce, but as replica 2.
        let wrong = Hello::new(
            &keys.replica(2),
            NAME,
            Process::Replica(ReplicaId(0)),
            theirs.nonce,
            [0; 32],
        );
        write_frame(&mut s, &upright_core::codec::to_bytes(&wrong))
            .await
            .unwrap();
        write_frame(&mut s, &envelope(Principal::Order(ReplicaId(1)), 9))
            .await
            .unwrap();
        closed(&mut s).await
    });
    let keys = Keys::new();
    let (inbox, counters, _to_1) = replica_0_dials_1(&keys, Endpoint::Tcp(addr));
    assert!(impostor.await.unwrap(), "the dialler closed the connection");
    assert_eq!(counters.get("net_closed_bad_hello"), 1);
    assert!(inbox.is_empty());

    // Replica 1's side: a second connection from replica 0 (the first one never closed, as after
    // a partition) takes the link; frames go out on it.
    let (addr, _, counters_1, to_0) = linked_replica(&keys, tcp_any()).await;
    let addr = tcp(&addr);
    let r0 = keys.replica(0);
    let (mut first, hello, nonce) = replica_0_greets(&r0, addr).await;
    let answer: Hello =
        upright_core::codec::from_bytes(&read_frame(&mut first, HELLO_BYTES_MAX).await.unwrap()).unwrap();
    assert_eq!(answer.from, Process::Replica(ReplicaId(1)));
    answer.check(&r0, NAME, &nonce).unwrap();
    eventually("first link", || counters_1.get("net_links") == 1).await;
    // A recorded hello does not open another connection: it answers the first one's challenge.
    let mut replayed = TcpStream::connect(addr).await.unwrap();
    let _ = challenge_of(&mut replayed).await;
    write_frame(&mut replayed, &hello).await.unwrap();
    assert!(closed(&mut replayed).await, "a replayed hello is refused");
    assert_eq!(counters_1.get("net_hello_stale_challenge"), 1);
    assert_eq!(counters_1.get("net_links"), 1, "the link stays where it was");
    let (mut second, _, _) = replica_0_greets(&r0, addr).await;
    let _ = read_frame(&mut second, HELLO_BYTES_MAX).await.unwrap();
    eventually("second link", || counters_1.get("net_links") == 2).await;
    to_0.send(Arc::new(envelope(Principal::Order(ReplicaId(1)), 5)));
    let frame = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut second, 1 << 16))
        .await
        .expect("a frame on the newest connection")
        .unwrap();
    assert_eq!(seqno(&upright_core::wire::decode(&frame).unwrap()), 5);
}

/// A connection from replica 0 (keys `r0`) to replica 1's listener at `addr`, greeted: the
/// stream, the hello it sent (answering the connection's challenge) and the nonce in it.
async fn replica_0_greets(r0: &KeyRing, addr: SocketAddr) -> (TcpStream, Vec<u8>, Nonce) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let challenge = challenge_of(&mut s).await;
    let nonce = fresh_nonce();
    let hello = upright_core::codec::to_bytes(&Hello::new(r0, NAME, Process::Replica(ReplicaId(1)), challenge, nonce));
    write_frame(&mut s, &hello).await.unwrap();
    (s, hello, nonce)
}

/// Frames that waited longer than [`crate::transport::QUEUED_AGE_MAX`] for their peer (down or
/// restarting) are dropped when a connection comes, not written ahead of the fresh ones; a fresh
/// frame still waits for the connection. On both ends of a pair: the one that dials and the one
/// whose frames go out on the connection the other dials.
#[tokio::test]
async fn frames_that_waited_too_long_for_a_peer_are_dropped_and_fresh_ones_delivered() {
    use crate::transport::QUEUED_AGE_MAX;
    let keys = Keys::new();
    let old = |k| Arc::new(envelope(Principal::Order(ReplicaId(k)), 1));
    let fresh = |k| Arc::new(envelope(Principal::Order(ReplicaId(k)), 2));

    // The dialling side: replica 0 queues for replica 1 before replica 1 listens.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (_inbox_0, counters_0, to_1) = replica_0_dials_1(&keys, Endpoint::Tcp(free));
    to_1.send(old(0));
    tokio::time::sleep(QUEUED_AGE_MAX + Duration::from_millis(100)).await;
    to_1.send(fresh(0));
    let (_, inbox_1, _, _) = linked_replica(&keys, Endpoint::Tcp(free)).await;
    eventually("the fresh frame at replica 1", || !inbox_1.is_empty()).await;
    eventually("the stale count", || counters_0.get("net_dropped_stale") == 1).await;
    assert_eq!(from_replica(&inbox_1), vec![(Process::Replica(ReplicaId(0)), 2)]);

    // The answering side: replica 1 queues for replica 0 before replica 0 dials it.
    let (addr, _, counters_1, to_0) = linked_replica(&keys, tcp_any()).await;
    to_0.send(old(1));
    tokio::time::sleep(QUEUED_AGE_MAX + Duration::from_millis(100)).await;
    to_0.send(fresh(1));
    let (inbox_0, _, _to_1) = replica_0_dials_1(&keys, addr);
    eventually("the fresh frame at replica 0", || !inbox_0.is_empty()).await;
    eventually("the stale count", || counters_1.get("net_dropped_stale") == 1).await;
    assert_eq!(from_replica(&inbox_0), vec![(Process::Replica(ReplicaId(1)), 2)]);
}

/// `Keys`' configuration after a change that swapped replicas 2 and 3 (the keys of the first
/// configuration's replica 2 at position 3, and the other way round), as a shrink may renumber.
fn swapped(keys: &Keys) -> ClusterConfig {
    let mut config = keys.config.clone();
    config.replicas.swap(2, 3);
    for (i, r) in config.replicas.iter_mut().enumerate() {
        r.id = ReplicaId(i as u32);
    }
    config.epoch = 1;
    config
}

/// A replica that switched to the swapped configuration (the first one's replica 2, now 3) and
/// one still in the first (replica 3 there, 2 now) connect: the straggler's hello, naming both
/// ends as the first configuration does, checks under the switched replica's previous identity;
/// the link is attributed to the straggler's id in the new configuration, and the switched
/// replica's answer (as the first configuration names it) passes the straggler's check. The
/// other way round, a dialler in the new configuration whose hello the straggler refuses
/// presents its identity in the first configuration next.
#[tokio::test]
async fn replicas_in_neighbouring_configurations_connect_as_each_names_the_other() {
    let keys = Keys::new();
    let next = swapped(&keys);
    let counters = Arc::new(Counters::default());
    // The switched replica: its own configuration's ring and the previous one's.
    let current = Arc::new(KeyRing::new(&next, Process::Replica(ReplicaId(3)), &keys.replicas[2]));
    let previous = Identity {
        keys: Arc::new(keys.replica(2)),
        peers: Some(
            (0..4u32)
                .filter(|j| *j != 2)
                .map(|j| {
                    let routed = next.replica_with(&keys.replicas[j as usize].public()).unwrap();
                    (Process::Replica(ReplicaId(j)), Process::Replica(routed))
                })
                .collect(),
        ),
    };
    let identities = Arc::new(Identities::new(vec![
        Identity {
            keys: current.clone(),
            peers: None,
        },
        previous,
    ]));
    let links = Arc::new(PeerLinks::default());
    // The straggler is replica 2 of the new configuration: it dials (the test's choice).
    let to_straggler = links.register(Process::Replica(ReplicaId(2)), counters.clone());
    let listener = Listener::bind(&tcp_any()).await.unwrap();
    let addr = listener.local_endpoint().unwrap();
    let inbox = Arc::new(Inbox::new(counters.clone()));
    tokio::spawn(serve(
        listener,
        identities,
        NAME.into(),
        |p| matches!(p, Process::Replica(_)),
        inbox.clone(),
        None,
        Some(links),
        1 << 16,
        counters.clone(),
    ));
    // The straggler: replica 3 of the first configuration, dialling replica 2 there.
    let straggler_counters = Arc::new(Counters::default());
    let straggler_inbox = Arc::new(Inbox::new(straggler_counters.clone()));
    let to_switched = dial_peer(
        addr.clone(),
        Arc::new(keys.replica(3)),
        NAME.into(),
        Process::Replica(ReplicaId(2)),
        straggler_inbox.clone(),
        1 << 16,
        straggler_counters.clone(),
    );
    to_switched.send(Arc::new(envelope(Principal::Order(ReplicaId(3)), 1)));
    to_straggler.send(Arc::new(envelope(Principal::Order(ReplicaId(3)), 2)));
    eventually("straggler -> switched", || inbox.len() == 1).await;
    eventually("switched -> straggler", || straggler_inbox.len() == 1).await;
    // Queued as from the straggler's id in the new configuration; the answer as from replica 2
    // of the first.
    assert_eq!(from_replica(&inbox), vec![(Process::Replica(ReplicaId(2)), 1)]);
    assert_eq!(
        from_replica(&straggler_inbox),
        vec![(Process::Replica(ReplicaId(2)), 2)]
    );
    assert_eq!(counters.get("net_links"), 1);

    // A dialler of the new configuration (its replica 2) to the straggler's listener, which
    // knows only the first configuration (where it is replica 2 as well: the swapped pair).
    let straggler_links = Arc::new(PeerLinks::default());
    let _to_dialler = straggler_links.register(Process::Replica(ReplicaId(3)), straggler_counters.clone());
    let (straggler_addr, straggler_listener_inbox) = listen(
        &keys,
        2,
        tcp_any(),
        |p| matches!(p, Process::Replica(_)),
        None,
        Some(straggler_links),
        straggler_counters.clone(),
    )
    .await;
    let dialler_counters = Arc::new(Counters::default());
    let dialler = dial_peer_as(
        straggler_addr,
        vec![
            (
                Arc::new(KeyRing::new(&next, Process::Replica(ReplicaId(2)), &keys.replicas[3])),
                Process::Replica(ReplicaId(3)),
            ),
            (Arc::new(keys.replica(3)), Process::Replica(ReplicaId(2))),
        ],
        Process::Replica(ReplicaId(3)),
        NAME.into(),
        Arc::new(Inbox::new(dialler_counters.clone())),
        1 << 16,
        dialler_counters.clone(),
    );
    // Frames written on the refused connection are lost (the protocol resends): send until one
    // arrives.
    for _ in 0..100 {
        dialler.send(Arc::new(envelope(Principal::Order(ReplicaId(3)), 7)));
        tokio::time::sleep(Duration::from_millis(50)).await;
        if !straggler_listener_inbox.is_empty() {
            break;
        }
    }
    eventually("the second identity", || !straggler_listener_inbox.is_empty()).await;
    assert_eq!(
        straggler_counters.get("net_hello_wrong_receiver"),
        1,
        "the first refused"
    );
    assert_eq!(
        from_replica(&straggler_listener_inbox)[0],
        (Process::Replica(ReplicaId(3)), 7)
    );
    assert_eq!(dialler_counters.get("net_connects"), 2, "the second identity was kept");
}
