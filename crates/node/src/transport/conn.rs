//! Connections: dialing with reconnect and backoff, accepting with a fresh challenge and a checked
//! hello that answers it, reading frames into the inbox, writing from a bounded queue.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinHandle;
use upright_core::crypto::KeyRing;
use upright_core::ids::{ClientId, Principal, Process};

use super::endpoint::{Endpoint, Listener, ReadHalf, Stream, WriteHalf};
use super::mux::{ClientFrame, ClientRoutes, HelloList, HELLO_LIST_BYTES_MAX};
use super::{
    fresh_nonce, read_frame, write_frame, write_tagged_frame, Counters, FrameReader, Hello, Inbox, Nonce,
    HELLO_BYTES_MAX,
};

/// Most frames waiting to be written to one peer.
pub const OUTBOUND_QUEUE_MAX: usize = 4096;
/// Most queued frames written before one flush.
const WRITE_BATCH_FRAMES_MAX: usize = 1024;
/// Write buffer per connection: the frames queued since the last write go out in one system call.
const WRITE_BUFFER_BYTES: usize = 64 << 10;
/// Most simultaneous inbound connections per listener.
pub const CONNECTIONS_MAX: usize = 1024;
/// Time a new connection has to present its hello (and a dialled one its challenge).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// A frame that waited this long in a queue to a peer is dropped when its turn comes (counted
/// `net_dropped_stale`), not written. It waited for a peer that was down or not reading: a
/// replica that restarts after a second or more would otherwise first read the thousands of
/// agreement messages, NEXT-BATCHes and checkpoints its peers queued for it meanwhile, ahead of
/// the answers to what it asks now (its LAST-EXEC answered with LOAD-CP), and replay old batches
/// one by one as they trickle in instead of loading the stable checkpoint. The protocol resends
/// what still matters (the order tick, the execution retry, client retransmission: all below
/// this), and a connected peer's queue is written within milliseconds.
pub const QUEUED_AGE_MAX: Duration = Duration::from_millis(500);

pub(super) type Frame = Arc<Vec<u8>>;

/// A frame in a peer's outbound queue, with the time it was queued.
pub(super) struct Queued {
    at: Instant,
    frame: Frame,
}

/// The sending end of one outbound connection (reconnects by itself).
#[derive(Clone)]
pub struct Dialer {
    tx: mpsc::Sender<Queued>,
    counters: Arc<Counters>,
}

impl Dialer {
    /// Queues a frame body; drops it (counted) if the queue is full.
    pub fn send(&self, frame: Frame) {
        let queued = Queued {
            at: Instant::now(),
            frame,
        };
        if self.tx.try_send(queued).is_err() {
            self.counters.bump("net_dropped_outbound_full");
        }
    }

    /// Frames waiting.
    pub fn queue_depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

/// Outbound queues to the peer replicas that dial this one (those with lower ids): each queue is
/// written on that peer's accepted connection, after this replica's own [`Hello`] (one connection
/// per replica pair carries both directions, so a TCP ACK rides on data going the other way
/// instead of travelling alone).
#[derive(Default)]
pub struct PeerLinks {
    /// Per peer: its queue, and the writer of its newest connection.
    queues: std::sync::Mutex<BTreeMap<Process, (LinkQueue, Option<tokio::task::AbortHandle>)>>,
}

type LinkQueue = Arc<tokio::sync::Mutex<mpsc::Receiver<Queued>>>;

impl PeerLinks {
    /// The sending end for `peer`, whose frames go out on the connection `peer` dials to us (they
    /// wait in the bounded queue while there is none, as a dialer's do while it reconnects).
    pub fn register(&self, peer: Process, counters: Arc<Counters>) -> Dialer {
        let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE_MAX);
        let queue = Arc::new(tokio::sync::Mutex::new(rx));
        self.queues.lock().expect("links lock").insert(peer, (queue, None));
        Dialer { tx, counters }
    }

    /// Starts writing `peer`'s queue on its newest connection: the writer of an older one is
    /// stopped (that connection may be half-open after a partition and never end by itself).
    fn attach(
        &self,
        peer: Process,
        writer: WriteHalf,
        hello_bytes: Vec<u8>,
        counters: Arc<Counters>,
    ) -> Option<JoinHandle<()>> {
        let mut queues = self.queues.lock().expect("links lock");
        let (queue, current) = queues.get_mut(&peer)?;
        let task = tokio::spawn(write_link(writer, hello_bytes, queue.clone(), counters));
        if let Some(older) = current.replace(task.abort_handle()) {
            older.abort();
        }
        Some(task)
    }
}

/// Whom a replica's peer connections speak as: its configuration's key ring, and while a
/// reconfiguration is under way a neighbouring configuration's (docs/PROTOCOL.md
/// "Reconfiguration"): a peer still in the previous configuration, or one the hand-over adds,
/// names both ends of a connection by that configuration's ids, which a shrink may have changed.
pub struct Identities {
    rings: std::sync::RwLock<Vec<Identity>>,
}

/// One configuration's key ring, and the peers it names with the id this replica's router knows
/// each by (its own configuration's id, or a member the hand-over adds by its next id).
#[derive(Clone)]
pub struct Identity {
    /// The key ring (this replica as the configuration numbers it).
    pub keys: Arc<KeyRing>,
    /// Peer as this configuration names it -> the router's id for it; `None`: every peer, by
    /// its own name (one configuration only). A hello from a peer not listed is refused.
    pub peers: Option<BTreeMap<Process, Process>>,
}

impl Identity {
    /// The router's id of `peer` as this identity's configuration names it.
    fn route(&self, peer: Process) -> Option<Process> {
        match &self.peers {
            None => Some(peer),
            Some(peers) => peers.get(&peer).copied(),
        }
    }
}

impl Identities {
    /// One key ring, every peer by its own name.
    pub fn single(keys: Arc<KeyRing>) -> Identities {
        Identities::new(vec![Identity { keys, peers: None }])
    }

    /// These identities, the first the replica's own configuration.
    pub fn new(rings: Vec<Identity>) -> Identities {
        assert!(!rings.is_empty(), "at least the replica's own configuration");
        Identities {
            rings: std::sync::RwLock::new(rings),
        }
    }

    /// Adds an identity (a configuration the replica hands over to).
    pub fn add(&self, identity: Identity) {
        self.rings.write().expect("identities lock").push(identity);
    }

    /// The replica's own configuration's key ring.
    pub fn primary(&self) -> Arc<KeyRing> {
        self.rings.read().expect("identities lock")[0].keys.clone()
    }

    /// A client connection's hello list, checked under the first identity it is meant for (a
    /// client that has not learnt of a reconfiguration yet names this replica by its id in an
    /// earlier configuration, and learns of the change once connected); else the error of
    /// checking it under the primary ring.
    fn check_clients(
        &self,
        body: &[u8],
        cluster_name: &str,
        admit: fn(Process) -> bool,
        challenge: &Nonce,
    ) -> Result<(Arc<KeyRing>, BTreeSet<ClientId>), &'static str> {
        self.first_checking(|identity| {
            HelloList::check(body, &identity.keys, cluster_name, admit, challenge)
                .map(|clients| (identity.keys.clone(), clients))
        })
    }

    /// The identity a replica hello is meant for and checks under, with the router's id of its
    /// sender; else the error of checking it under the primary ring (the counter to bump).
    fn check(
        &self,
        hello: &Hello,
        cluster_name: &str,
        challenge: &Nonce,
    ) -> Result<(Arc<KeyRing>, Process), &'static str> {
        self.first_checking(|identity| {
            hello.check(&identity.keys, cluster_name, challenge).map(|()| {
                identity
                    .route(hello.from)
                    .map(|router| (identity.keys.clone(), router))
                    .ok_or("net_hello_unknown_peer")
            })
        })?
    }

    /// What `check` makes of the first identity it accepts, in order; else its error for the
    /// primary one.
    fn first_checking<T>(&self, check: impl Fn(&Identity) -> Result<T, &'static str>) -> Result<T, &'static str> {
        let rings = self.rings.read().expect("identities lock");
        let mut first = None;
        for identity in rings.iter() {
            match check(identity) {
                Ok(found) => return Ok(found),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        Err(first.unwrap_or("net_hello_bad_mac"))
    }
}

/// Dials peer replica `peer` at `addr` (and redials on failure), answering each connection's
/// challenge with a hello from `keys.me()`, and writes our frames to it; the peer answers with its
/// own hello (answering our nonce) on the same connection and then writes its frames to us there
/// ([`PeerLinks`]), which go into `inbox`.
pub fn dial_peer(
    addr: Endpoint,
    keys: Arc<KeyRing>,
    cluster_name: String,
    peer: Process,
    inbox: Arc<Inbox>,
    max_frame: usize,
    counters: Arc<Counters>,
) -> Dialer {
    dial_peer_as(addr, vec![(keys, peer)], peer, cluster_name, inbox, max_frame, counters)
}

/// [`dial_peer`] for a peer that may run in another configuration than ours (a reconfiguration
/// under way): each `(keys, named)` is one configuration's key ring and the peer's id there.
/// A connection whose hello the peer does not answer is redialled with the next one; the one
/// it answered is kept. Its envelopes go into `inbox` as from `router` (our id for the peer).
pub fn dial_peer_as(
    addr: Endpoint,
    identities: Vec<(Arc<KeyRing>, Process)>,
    router: Process,
    cluster_name: String,
    inbox: Arc<Inbox>,
    max_frame: usize,
    counters: Arc<Counters>,
) -> Dialer {
    assert!(!identities.is_empty(), "at least one identity to dial as");
    let reader_counters = counters.clone();
    let identities = Arc::new(identities);
    let hello_cluster = cluster_name.clone();
    // Which identity this connection presents, whether the peer answered it, and whether one
    // was presented at all yet.
    let choice = Arc::new(std::sync::Mutex::new(DialChoice::default()));
    let (hello_choice, hello_identities) = (choice.clone(), identities.clone());
    dial_with(
        addr,
        move |challenge: &Nonce, nonce: &Nonce| {
            let mut c = hello_choice.lock().expect("dial choice lock");
            if c.presented && !c.answered {
                c.index = (c.index + 1) % hello_identities.len();
            }
            c.presented = true;
            c.answered = false;
            let (keys, named) = &hello_identities[c.index];
            let running = hello_identities[0].0.config_epoch();
            let hello = Hello::new_in(keys, &hello_cluster, *named, *challenge, *nonce, running);
            upright_core::codec::to_bytes(&hello)
        },
        move |reader, nonce| {
            let index = choice.lock().expect("dial choice lock").index;
            let (keys, named) = identities[index].clone();
            let running = identities[0].0.config_epoch();
            let cluster_name = cluster_name.clone();
            let (inbox, counters, choice) = (inbox.clone(), reader_counters.clone(), choice.clone());
            tokio::spawn(async move {
                let greeted = Greeted {
                    peer: named,
                    router,
                    nonce,
                    running,
                };
                read_from_peer(reader, greeted, keys, cluster_name, inbox, max_frame, counters, || {
                    choice.lock().expect("dial choice lock").answered = true;
                })
                .await
            })
        },
        counters,
    )
}

/// The identity a dialled connection presents ([`dial_peer_as`]).
#[derive(Default)]
struct DialChoice {
    index: usize,
    presented: bool,
    answered: bool,
}

/// Whom a dialled connection reaches (as the identity we presented names it, and as our router
/// knows it) and the nonce our hello sent it.
struct Greeted {
    peer: Process,
    router: Process,
    nonce: Nonce,
    /// The configuration epoch we run in.
    running: u64,
}

/// The dialling side's reader: the peer's hello (it must name the peer we dialled, be meant for
/// us and answer our nonce; then `answered` runs), then its frames.
#[allow(clippy::too_many_arguments)]
async fn read_from_peer(
    mut reader: ReadHalf,
    greeted: Greeted,
    keys: Arc<KeyRing>,
    cluster_name: String,
    inbox: Arc<Inbox>,
    max_frame: usize,
    counters: Arc<Counters>,
    answered: impl FnOnce(),
) {
    let Greeted {
        peer,
        router,
        nonce,
        running,
    } = greeted;
    let checked = match read_hello_frame(&mut reader, HELLO_BYTES_MAX).await {
        Ok(body) => checked_hello(&body, &keys, &cluster_name, &nonce).and_then(|hello| match hello.from == peer {
            true => Ok(hello.epoch),
            false => Err("net_closed_bad_hello"),
        }),
        Err(reason) => Err(reason),
    };
    let epoch = match checked {
        Ok(epoch) => epoch,
        Err(reason) => {
            counters.bump(reason);
            return;
        }
    };
    answered();
    inbox.note_peer_epoch(router, epoch);
    let peers = Peers::One {
        named: peer,
        router,
        foreign: epoch != running,
        exec_base: keys.exec_base(),
    };
    read_loop(reader, peers, inbox, max_frame, counters).await;
}

/// The first frame of a connection (at most `bound` bytes), within [`HELLO_TIMEOUT`].
async fn read_hello_frame(reader: &mut ReadHalf, bound: usize) -> Result<Vec<u8>, &'static str> {
    match tokio::time::timeout(HELLO_TIMEOUT, read_frame(reader, bound)).await {
        Ok(Ok(body)) => Ok(body),
        _ => Err("net_closed_bad_hello"),
    }
}

/// A replica hello, decoded and checked (right cluster, meant for us, answering `challenge`, MAC
/// from its sender).
fn checked_hello(body: &[u8], keys: &KeyRing, cluster_name: &str, challenge: &Nonce) -> Result<Hello, &'static str> {
    let hello = upright_core::codec::from_bytes::<Hello>(body).map_err(|_| "net_closed_bad_hello")?;
    hello.check(keys, cluster_name, challenge)?;
    Ok(hello)
}

/// The challenge an accepting side writes first, within [`HELLO_TIMEOUT`].
async fn read_challenge(reader: &mut ReadHalf) -> Result<Nonce, &'static str> {
    let body = read_hello_frame(reader, std::mem::size_of::<Nonce>()).await?;
    body.try_into().map_err(|_| "net_closed_bad_challenge")
}

/// Dials `addr` (and redials on failure); on every connection reads the accepting side's
/// challenge, writes `hello(challenge, nonce)` (with a fresh `nonce` of ours) as the first frame,
/// then writes the queued frames; `read(reader, nonce)` spawns the task that reads the connection
/// (its end closes the connection, which is then redialled).
pub(super) fn dial_with<H, F>(addr: Endpoint, hello: H, read: F, counters: Arc<Counters>) -> Dialer
where
    H: Fn(&Nonce, &Nonce) -> Vec<u8> + Send + 'static,
    F: Fn(ReadHalf, Nonce) -> JoinHandle<()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE_MAX);
    tokio::spawn(run_dial(addr, hello, rx, read, counters.clone()));
    Dialer { tx, counters }
}

async fn run_dial<H, F>(addr: Endpoint, hello: H, mut rx: mpsc::Receiver<Queued>, read: F, counters: Arc<Counters>)
where
    H: Fn(&Nonce, &Nonce) -> Vec<u8> + Send + 'static,
    F: Fn(ReadHalf, Nonce) -> JoinHandle<()> + Send + 'static,
{
    let mut backoff = BACKOFF_MIN;
    loop {
        let stream = match Stream::connect(&addr).await {
            Ok(stream) => stream,
            Err(_) => {
                counters.bump("net_connect_failures");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let (mut reader, writer) = stream.into_split();
        let challenge = match read_challenge(&mut reader).await {
            Ok(challenge) => challenge,
            Err(reason) => {
                counters.bump(reason);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
                continue;
            }
        };
        let nonce = fresh_nonce();
        let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
        if write_frame(&mut writer, &hello(&challenge, &nonce)).await.is_err() || writer.flush().await.is_err() {
            tokio::time::sleep(backoff).await;
            continue;
        }
        counters.bump("net_connects");
        let connected = Instant::now();
        let mut reading = read(reader, nonce);
        loop {
            tokio::select! {
                frame = rx.recv() => {
                    let Some(frame) = frame else {
                        reading.abort();
                        return;
                    };
                    if write_batch(&mut writer, frame, &mut rx, &counters).await.is_err() {
                        break;
                    }
                }
                _ = &mut reading => break,
            }
        }
        reading.abort();
        counters.bump("net_disconnects");
        // A connection that ended at once (its hello refused, say) is redialled after the
        // backoff, not in a tight loop; one that lasted, at once.
        if connected.elapsed() < BACKOFF_MAX {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        } else {
            backoff = BACKOFF_MIN;
        }
    }
}

/// A queued outbound frame: its body, and on a client connection the 4-byte tag (the client's
/// id, little-endian) written before it.
pub(super) trait Outgoing: Send + 'static {
    /// The bytes before the body, if any.
    fn tag(&self) -> Option<[u8; 4]>;
    /// The body.
    fn body(&self) -> &[u8];
    /// Whether, at `now`, it waited longer than [`QUEUED_AGE_MAX`] (then it is dropped, not
    /// written).
    fn stale(&self, _now: Instant) -> bool {
        false
    }
}

impl Outgoing for Queued {
    fn tag(&self) -> Option<[u8; 4]> {
        None
    }
    fn body(&self) -> &[u8] {
        &self.frame
    }
    fn stale(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.at) > QUEUED_AGE_MAX
    }
}

impl Outgoing for ClientFrame {
    fn tag(&self) -> Option<[u8; 4]> {
        Some(self.0 .0.to_le_bytes())
    }
    fn body(&self) -> &[u8] {
        &self.1
    }
}

async fn write_one<T: Outgoing>(writer: &mut BufWriter<WriteHalf>, frame: &T) -> std::io::Result<()> {
    match frame.tag() {
        Some(tag) => write_tagged_frame(writer, &tag, frame.body()).await,
        None => write_frame(writer, frame.body()).await,
    }
}

/// Writes `first` and whatever else is already queued, then flushes once; stale frames (one
/// clock reading per batch) are dropped and counted.
async fn write_batch<T: Outgoing>(
    writer: &mut BufWriter<WriteHalf>,
    first: T,
    rx: &mut mpsc::Receiver<T>,
    counters: &Counters,
) -> std::io::Result<()> {
    let now = Instant::now();
    let mut stale = 0;
    let queued = std::iter::from_fn(|| rx.try_recv().ok()).take(WRITE_BATCH_FRAMES_MAX);
    for frame in std::iter::once(first).chain(queued) {
        if frame.stale(now) {
            stale += 1;
        } else {
            write_one(writer, &frame).await?;
        }
    }
    if stale > 0 {
        counters.add("net_dropped_stale", stale);
    }
    writer.flush().await
}

/// Whose envelopes an inbound connection may carry: one peer process (a replica), or the clients
/// its hello list named.
enum Peers {
    /// A peer replica, as the connection's hello named it (its envelopes must come from it) and
    /// as our router knows it (its envelopes go into the inbox as from it).
    /// `foreign`: the peer runs in another configuration than ours (its hello said so), where
    /// its id may differ from the one it is named by here: envelopes from any replica are taken
    /// (the stages check whose they are).
    One {
        named: Process,
        router: Process,
        foreign: bool,
        /// Where execution members' processes start (`Principal::process_at`).
        exec_base: u32,
    },
    Clients(BTreeSet<ClientId>),
}

impl Peers {
    /// Whether an envelope from `from` may come on this connection, and the sender the inbox
    /// queues it under.
    fn carries(&self, from: Principal) -> Option<Process> {
        let exec_base = match self {
            Peers::One { exec_base, .. } => *exec_base,
            Peers::Clients(_) => 0,
        };
        match (self, from.process_at(exec_base)) {
            (
                Peers::One {
                    named, router, foreign, ..
                },
                from,
            ) => (*named == from || (*foreign && matches!(from, Process::Replica(_)))).then_some(*router),
            (Peers::Clients(clients), Process::Client(c)) => clients.contains(&c).then_some(Process::Client(c)),
            (Peers::Clients(_), Process::Replica(_)) => None,
        }
    }
}

/// Reads frames until the connection fails or misbehaves. Every frame that one read brought in is
/// decoded and queued with one inbox operation, each envelope under its sender's process (so the
/// inbox's per-peer bounds and turns stay per client on a shared connection).
async fn read_loop(reader: ReadHalf, peers: Peers, inbox: Arc<Inbox>, max_frame: usize, counters: Arc<Counters>) {
    let mut frames = FrameReader::new(reader, max_frame);
    let mut batch = Vec::new();
    loop {
        if frames.fill().await.is_err() {
            return;
        }
        let mut wrong_sender = 0;
        let closing = loop {
            match frames.next_frame() {
                Ok(Some(body)) => match upright_core::wire::decode(&body) {
                    Ok(envelope) => match peers.carries(envelope.from) {
                        Some(queue_as) => batch.push((queue_as, Arc::new(envelope))),
                        None => wrong_sender += 1,
                    },
                    Err(_) => break Some("net_closed_garbage"),
                },
                Ok(None) => break None,
                Err(e) => break Some(e.closing_counter()),
            }
        };
        if wrong_sender > 0 {
            counters.add("net_dropped_wrong_sender", wrong_sender);
        }
        if !batch.is_empty() {
            counters.add("net_frames_in", batch.len() as u64);
            inbox.push_each(batch.drain(..));
        }
        if let Some(reason) = closing {
            counters.bump(reason);
            return;
        }
    }
}

/// Accepts connections on `listener`. A connection must present a valid hello from a process
/// `admit` accepts; its envelopes then go to `inbox`. With `routes` it is a client listener: the
/// first frame is a hello list (one hello per client the connection carries, see
/// [`super::HelloList`]), every client in it is routed to this connection, and replies go back on
/// it tagged with the client's id.
#[allow(clippy::too_many_arguments)] // the listener's whole context, passed once at start-up
pub async fn serve(
    listener: Listener,
    identities: Arc<Identities>,
    cluster_name: String,
    admit: fn(Process) -> bool,
    inbox: Arc<Inbox>,
    routes: Option<Arc<ClientRoutes>>,
    links: Option<Arc<PeerLinks>>,
    max_frame: usize,
    counters: Arc<Counters>,
) {
    let context = Arc::new(Listening {
        identities,
        cluster_name,
        admit,
        inbox,
        routes,
        links,
        max_frame,
        counters,
    });
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    loop {
        let Ok(stream) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            context.counters.bump("net_refused_too_many_connections");
            continue;
        };
        let context = context.clone();
        tokio::spawn(async move {
            let _permit = permit;
            accept_one(stream, &context).await;
        });
    }
}

/// What a listener's connections share.
struct Listening {
    identities: Arc<Identities>,
    cluster_name: String,
    admit: fn(Process) -> bool,
    inbox: Arc<Inbox>,
    routes: Option<Arc<ClientRoutes>>,
    links: Option<Arc<PeerLinks>>,
    max_frame: usize,
    counters: Arc<Counters>,
}

impl Listening {
    /// Reads and checks the first frame: one hello (replica listener) or a hello list (client
    /// listener), answering `challenge`. With the peers, the dialler's nonce (for our hello to
    /// answer). The error names the counter to bump; the connection is then closed.
    async fn greet(&self, reader: &mut ReadHalf, challenge: &Nonce) -> Result<Greeting, &'static str> {
        let bound = if self.routes.is_some() {
            HELLO_LIST_BYTES_MAX
        } else {
            HELLO_BYTES_MAX
        };
        let body = read_hello_frame(reader, bound).await?;
        if self.routes.is_some() {
            let (keys, clients) = self
                .identities
                .check_clients(&body, &self.cluster_name, self.admit, challenge)?;
            return Ok(Greeting {
                peers: Peers::Clients(clients),
                nonce: [0; 32],
                keys,
            });
        }
        let hello = upright_core::codec::from_bytes::<Hello>(&body).map_err(|_| "net_closed_bad_hello")?;
        let (keys, router) = self.identities.check(&hello, &self.cluster_name, challenge)?;
        if !(self.admit)(hello.from) {
            return Err("net_closed_wrong_listener");
        }
        self.inbox.note_peer_epoch(router, hello.epoch);
        Ok(Greeting {
            peers: Peers::One {
                named: hello.from,
                router,
                foreign: hello.epoch != self.identities.primary().config_epoch(),
                exec_base: keys.exec_base(),
            },
            nonce: hello.nonce,
            keys,
        })
    }
}

/// A connection's checked first frame: whom it carries, the dialler's nonce (for our hello to
/// answer) and the key ring its hello checked under (ours answers under it too).
struct Greeting {
    peers: Peers,
    nonce: Nonce,
    keys: Arc<KeyRing>,
}

async fn accept_one(stream: Stream, context: &Listening) {
    let (mut reader, mut writer) = stream.into_split();
    // A fresh challenge first: the dialler's hello must answer it, so a recorded hello is no use.
    let challenge = fresh_nonce();
    if write_frame(&mut writer, &challenge).await.is_err() || writer.flush().await.is_err() {
        return;
    }
    let Greeting { peers, nonce, keys } = match context.greet(&mut reader, &challenge).await {
        Ok(greeted) => greeted,
        Err(reason) => {
            context.counters.bump(reason);
            return;
        }
    };
    let mut writer = Some(writer);
    let registered = match (&context.routes, &peers) {
        (Some(routes), Peers::Clients(clients)) => {
            let (tx, rx) = mpsc::channel(OUTBOUND_QUEUE_MAX);
            let generation = routes.register(clients, tx);
            tokio::spawn(write_loop(writer.take().expect("unused"), rx, context.counters.clone()));
            let clients: Vec<ClientId> = clients.iter().copied().collect();
            Some((routes.clone(), clients, generation))
        }
        _ => None,
    };
    // A peer replica that dials us also carries our frames to it.
    let link = match (&context.links, &peers, writer) {
        (Some(links), Peers::One { named, router, .. }, Some(writer)) => {
            let running = context.identities.primary().config_epoch();
            let hello = Hello::new_in(&keys, &context.cluster_name, *named, nonce, [0; 32], running);
            let hello_bytes = upright_core::codec::to_bytes(&hello);
            links.attach(*router, writer, hello_bytes, context.counters.clone())
        }
        _ => None,
    };
    read_loop(
        reader,
        peers,
        context.inbox.clone(),
        context.max_frame,
        context.counters.clone(),
    )
    .await;
    if let Some((routes, clients, generation)) = registered {
        routes.unregister(&clients, generation);
    }
    if let Some(link) = link {
        // Gives the queue back for the peer's next connection.
        link.abort();
    }
}

/// Writes our hello, then the frames queued for the peer that dialled this connection. The queue
/// is held while writing; a newer connection's writer waits until this one has stopped (its
/// connection ended, or the newer one replaced it: [`PeerLinks::attach`]).
async fn write_link(writer: WriteHalf, hello_bytes: Vec<u8>, queue: LinkQueue, counters: Arc<Counters>) {
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
    if write_frame(&mut writer, &hello_bytes).await.is_err() || writer.flush().await.is_err() {
        return;
    }
    let mut rx = queue.lock().await;
    counters.bump("net_links");
    write_queued(&mut writer, &mut rx, &counters).await;
}

/// Writes the frames routed to a client connection, each tagged with its client's id.
async fn write_loop(writer: WriteHalf, mut rx: mpsc::Receiver<ClientFrame>, counters: Arc<Counters>) {
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, writer);
    write_queued(&mut writer, &mut rx, &counters).await;
}

/// Writes what `rx` delivers, in batches, until it closes or a write fails.
async fn write_queued<T: Outgoing>(writer: &mut BufWriter<WriteHalf>, rx: &mut mpsc::Receiver<T>, counters: &Counters) {
    while let Some(frame) = rx.recv().await {
        if write_batch(writer, frame, rx, counters).await.is_err() {
            return;
        }
    }
}
