//! Client multiplexing: all clients of one process share one connection per replica.
//!
//! The first frame a client connection sends (in answer to the replica's challenge) is a
//! [`HelloList`]: one [`Hello`] per client the connection carries, each MACed with that client's
//! own key over the challenge, as a lone client's would be. The
//! replica registers every client of the list in its [`ClientRoutes`] and accepts on the
//! connection only envelopes from those clients (each queued in the inbox under its own client,
//! so per-client bounds and turns hold). Frames the replica writes back carry the client's id as a
//! 4-byte little-endian prefix before the envelope; the dialling process strips it and queues the
//! envelope in that client's own inbox ([`dial_clients`]). So a process with many clients moves a
//! whole batch of requests, and the replica a whole batch of replies, with one system call per
//! replica instead of one per client.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use upright_core::crypto::KeyRing;
use upright_core::ids::{ClientId, Process, ReplicaId};
use upright_core::message::Envelope;

use super::conn::{dial_with, Frame};
use super::{Counters, Dialer, Endpoint, FrameReader, Hello, Inbox, Nonce, ReadHalf};

/// Most clients one connection may carry (the length of a hello list).
pub const CLIENTS_PER_CONNECTION_MAX: usize = 1024;
/// Largest hello-list frame (256 bytes per hello; a hello with a short cluster name is ~80).
pub const HELLO_LIST_BYTES_MAX: usize = 256 * CLIENTS_PER_CONNECTION_MAX;
/// Bytes of the client-id prefix on frames written to a client connection.
pub const CLIENT_TAG_BYTES: usize = 4;

/// A frame routed to a client connection, with the client it is for.
pub(super) type ClientFrame = (ClientId, Frame);

/// The first frame of a client connection: the hellos of every client it carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloList(pub Vec<Hello>);

impl HelloList {
    /// The hellos of the clients whose key rings are `clients`, to replica `to`, answering
    /// `challenge` (replicas answer client connections with no hello, so no nonce of ours).
    pub fn new<'a>(
        clients: impl IntoIterator<Item = &'a KeyRing>,
        cluster_name: &str,
        to: ReplicaId,
        challenge: Nonce,
    ) -> HelloList {
        HelloList(
            clients
                .into_iter()
                .map(|keys| Hello::new(keys, cluster_name, Process::Replica(to), challenge, [0; 32]))
                .collect(),
        )
    }

    /// The frame body.
    pub fn encode(&self) -> Vec<u8> {
        upright_core::codec::to_bytes(self)
    }

    /// Checks a received hello list: at least one and at most [`CLIENTS_PER_CONNECTION_MAX`]
    /// hellos, each valid and answering `challenge` ([`Hello::check`]), from a client `admit`
    /// accepts, no client twice. Any bad hello refuses the whole connection; the error names the
    /// counter to bump.
    pub fn check(
        body: &[u8],
        keys: &KeyRing,
        cluster_name: &str,
        admit: fn(Process) -> bool,
        challenge: &Nonce,
    ) -> Result<BTreeSet<ClientId>, &'static str> {
        let HelloList(hellos) = upright_core::codec::from_bytes(body).map_err(|_| "net_closed_bad_hello")?;
        if hellos.is_empty() || hellos.len() > CLIENTS_PER_CONNECTION_MAX {
            return Err("net_closed_bad_hello_list");
        }
        let mut clients = BTreeSet::new();
        for hello in &hellos {
            hello.check(keys, cluster_name, challenge)?;
            let Process::Client(client) = hello.from else {
                return Err("net_closed_wrong_listener");
            };
            if !admit(hello.from) {
                return Err("net_closed_wrong_listener");
            }
            if !clients.insert(client) {
                return Err("net_closed_bad_hello_list");
            }
        }
        Ok(clients)
    }
}

/// Where replies to clients go: the latest connection that carries each client.
#[derive(Default)]
pub struct ClientRoutes {
    routes: Mutex<BTreeMap<ClientId, (u64, mpsc::Sender<ClientFrame>)>>,
    generation: AtomicU64,
}

impl ClientRoutes {
    /// Queues a frame to `client` (tagged with its id on the wire); returns false (and the caller
    /// counts) if it is not connected or its connection's queue is full.
    pub fn send(&self, client: ClientId, frame: Frame) -> bool {
        let routes = self.routes.lock().expect("routes lock");
        match routes.get(&client) {
            Some((_, tx)) => tx.try_send((client, frame)).is_ok(),
            None => false,
        }
    }

    /// Whether `client` is connected.
    pub fn is_connected(&self, client: ClientId) -> bool {
        self.routes.lock().expect("routes lock").contains_key(&client)
    }

    /// Routes every client of one connection to its queue; returns the connection's generation.
    pub(super) fn register(&self, clients: &BTreeSet<ClientId>, tx: mpsc::Sender<ClientFrame>) -> u64 {
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let mut routes = self.routes.lock().expect("routes lock");
        for client in clients {
            routes.insert(*client, (generation, tx.clone()));
        }
        generation
    }

    /// Removes the routes of a closed connection (a client that reconnected since keeps its newer
    /// route).
    pub(super) fn unregister(&self, clients: &[ClientId], generation: u64) {
        let mut routes = self.routes.lock().expect("routes lock");
        for client in clients {
            if routes.get(client).is_some_and(|(g, _)| *g == generation) {
                routes.remove(client);
            }
        }
    }
}

/// Dials replica `replica`'s client listener at `addr` (and redials on failure, answering each
/// connection's challenge with a new list) for the clients whose key rings are `clients`. The
/// returned dialer is shared by all of them (their envelopes name their sender). Frames read back
/// are split by their client-id prefix and queued in that client's inbox in `inboxes`, as coming
/// from `replica`.
pub fn dial_clients(
    addr: Endpoint,
    replica: ReplicaId,
    clients: Vec<Arc<KeyRing>>,
    cluster_name: String,
    inboxes: Arc<BTreeMap<ClientId, Arc<Inbox>>>,
    max_frame: usize,
    counters: Arc<Counters>,
) -> Dialer {
    let reading = counters.clone();
    let hellos = move |challenge: &Nonce, _: &Nonce| {
        HelloList::new(clients.iter().map(|k| k.as_ref()), &cluster_name, replica, *challenge).encode()
    };
    let read = move |reader, _: Nonce| {
        tokio::spawn(demux_loop(
            reader,
            Process::Replica(replica),
            inboxes.clone(),
            max_frame + CLIENT_TAG_BYTES,
            reading.clone(),
        ))
    };
    dial_with(addr, hellos, read, counters)
}

/// One frame read from a client connection.
enum Demuxed {
    /// An envelope for a client of this process, from a replica.
    For(ClientId, Arc<Envelope>),
    /// Dropped (counted under the name).
    Dropped(&'static str),
}

/// Splits a frame into its client and envelope. `Err`: garbage, the connection closes.
fn demux_frame(body: &[u8], inboxes: &BTreeMap<ClientId, Arc<Inbox>>) -> Result<Demuxed, &'static str> {
    if body.len() <= CLIENT_TAG_BYTES {
        return Err("net_closed_garbage");
    }
    let (tag, envelope) = body.split_at(CLIENT_TAG_BYTES);
    let client = ClientId(u32::from_le_bytes([tag[0], tag[1], tag[2], tag[3]]));
    if !inboxes.contains_key(&client) {
        return Ok(Demuxed::Dropped("net_dropped_unknown_client"));
    }
    let envelope = upright_core::wire::decode(envelope).map_err(|_| "net_closed_garbage")?;
    // From a replica; not necessarily the id dialled: a reconfiguration may have renumbered it
    // (it answers a client that has not learnt of the change yet under its new id). The client
    // stage checks whose it is.
    if matches!(envelope.from, upright_core::ids::Principal::Client(_)) {
        return Ok(Demuxed::Dropped("net_dropped_wrong_sender"));
    }
    Ok(Demuxed::For(client, Arc::new(envelope)))
}

/// Reads a client connection until it fails or misbehaves: every frame one read brought in is
/// split by client and queued with one inbox operation per client.
async fn demux_loop(
    reader: ReadHalf,
    replica: Process,
    inboxes: Arc<BTreeMap<ClientId, Arc<Inbox>>>,
    max_frame: usize,
    counters: Arc<Counters>,
) {
    let mut frames = FrameReader::new(reader, max_frame);
    let mut batch: BTreeMap<ClientId, Vec<Arc<Envelope>>> = BTreeMap::new();
    loop {
        if frames.fill().await.is_err() {
            return;
        }
        let closing = loop {
            match frames.next_frame() {
                Ok(Some(body)) => match demux_frame(&body, &inboxes) {
                    Ok(Demuxed::For(client, envelope)) => batch.entry(client).or_default().push(envelope),
                    Ok(Demuxed::Dropped(reason)) => counters.bump(reason),
                    Err(reason) => break Some(reason),
                },
                Ok(None) => break None,
                Err(e) => break Some(e.closing_counter()),
            }
        };
        for (client, envelopes) in std::mem::take(&mut batch) {
            counters.add("net_frames_in", envelopes.len() as u64);
            inboxes[&client].push_many(replica, envelopes);
        }
        if let Some(reason) = closing {
            counters.bump(reason);
            return;
        }
    }
}

#[cfg(test)]
#[path = "mux_tests.rs"]
mod tests;
