//! Transport: length-prefixed frames carrying `upright_core::codec` envelopes, over TCP or, between
//! processes of one host, Unix-domain sockets ([`Endpoint`]; the same frames and checks on both).
//!
//! Each connection starts with a challenge: the accepting side writes a fresh random nonce as the
//! first frame. The dialling side answers with a hello naming itself and the intended receiver,
//! MACed with their pairwise key over that nonce (and its own fresh nonce, which the accepting
//! replica's hello answers in turn), so a connection is tied to its peers and a recorded hello
//! cannot open another one (it answers an old challenge: refused, counted
//! `net_hello_stale_challenge`). Every envelope that arrives at a replica must come from a
//! principal of the peer the connection's hello named (else it is dropped and counted); a client
//! takes envelopes from any replica on the connections it dialled (a reconfiguration may have
//! renumbered the replica; the client stage checks whose they are). During a reconfiguration a
//! replica answers hellos as each neighbouring configuration names it ([`Identities`]).
//! A replica pair shares one connection for both directions: the replica with the lower
//! Ed25519 key dials ([`dial_peer`]) and presents its [`Hello`], the other answers with its own
//! hello and writes its frames to the dialler on that connection ([`PeerLinks`]; the newest connection from a peer
//! takes over the queue). So a TCP ACK rides on data going the other way instead of travelling
//! alone (a batch of 16 Redis SETs cost 91-94 TCP segments with one connection per direction,
//! 68-72 with one per pair). All clients of one process share one connection
//! per replica ([`dial_clients`]): its first frame is a [`HelloList`] with one hello per client,
//! replies come back on it, each prefixed with its client's id, and the dialling process hands
//! them to the right client. Outbound traffic to each connection goes through one bounded queue
//! (a full queue drops the new message and counts it, and a frame that waited there longer than
//! [`QUEUED_AGE_MAX`] for a peer that was down is dropped when its turn comes; the protocol
//! retransmits). Inbound envelopes
//! go into the per-sender queues of an [`Inbox`] (per client, also on a shared connection), served
//! round-robin. Garbage, oversized frames or a bad hello close that connection and are counted;
//! nothing here panics on input.

mod conn;
mod endpoint;
mod frame;
mod inbox;
mod mux;

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use upright_core::crypto::{Digest, KeyRing, Mac};
use upright_core::ids::{Principal, Process};

pub use conn::{
    dial_peer, dial_peer_as, serve, Dialer, Identities, Identity, PeerLinks, CONNECTIONS_MAX, OUTBOUND_QUEUE_MAX,
    QUEUED_AGE_MAX,
};
pub use endpoint::{resolve_tcp, Endpoint, Listener, ReadHalf, Stream, WriteHalf, UNIX_PATH_BYTES_MAX, UNIX_PREFIX};
pub use frame::{read_frame, write_frame, write_tagged_frame, FrameError, FrameReader, READ_CHUNK_BYTES};
pub use inbox::{Inbox, INBOX_PER_PEER_MAX};
pub use mux::{
    dial_clients, ClientRoutes, HelloList, CLIENTS_PER_CONNECTION_MAX, CLIENT_TAG_BYTES, HELLO_LIST_BYTES_MAX,
};

/// Largest hello frame.
pub const HELLO_BYTES_MAX: usize = 1024;

/// A connection's challenge (or a dialler's nonce): 32 random bytes, fresh for each connection.
pub type Nonce = [u8; 32];

/// A fresh random nonce.
pub fn fresh_nonce() -> Nonce {
    let mut nonce = [0u8; 32];
    getrandom::fill(&mut nonce).expect("the operating system's random numbers");
    nonce
}

/// Named counters shared by the transport tasks (exported as metrics).
#[derive(Default)]
pub struct Counters {
    map: Mutex<BTreeMap<&'static str, u64>>,
}

impl Counters {
    /// Adds one.
    pub fn bump(&self, name: &'static str) {
        self.add(name, 1);
    }

    /// Adds `n`.
    pub fn add(&self, name: &'static str, n: u64) {
        *self.map.lock().expect("counters lock").entry(name).or_insert(0) += n;
    }

    /// A counter's value.
    pub fn get(&self, name: &str) -> u64 {
        self.map.lock().expect("counters lock").get(name).copied().unwrap_or(0)
    }

    /// All counters.
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.map.lock().expect("counters lock").clone()
    }
}

/// The first frame of a replica-to-replica connection; one entry of a client connection's
/// [`HelloList`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Cluster name (a connection to another cluster's member is refused).
    pub cluster_name: String,
    /// Who dials.
    pub from: Process,
    /// Whom it means to reach.
    pub to: Process,
    /// The nonce this hello answers: the accepting side's challenge (in a dialler's hello), or
    /// the dialler's `nonce` (in the hello a replica answers with).
    pub challenge: Nonce,
    /// The dialler's fresh nonce, for the accepting replica's hello to answer (zeros in that
    /// answer).
    pub nonce: Nonce,
    /// The configuration epoch the sender runs in (which may differ from the one whose ids
    /// name the two ends, during a reconfiguration: [`Identities`]). A peer running in another
    /// configuration sends what ours refuses without being faulty: the replica's cut-off spares
    /// it (`upright_core::cutoff`).
    pub epoch: u64,
    /// MAC with the pairwise key of `from` and `to` over the fields above.
    pub mac: Mac,
}

/// A principal of `process` whose key is the process's key.
pub fn key_principal(process: Process) -> Principal {
    match process {
        Process::Replica(r) => Principal::Auth(r),
        Process::Client(c) => Principal::Client(c),
    }
}

fn hello_digest(hello: &Hello) -> Digest {
    Digest::of_parts(
        "upright hello v3",
        &[&upright_core::codec::to_bytes(&(
            &hello.cluster_name,
            hello.from,
            hello.to,
            &hello.challenge,
            &hello.nonce,
            hello.epoch,
        ))],
    )
}

impl Hello {
    /// A hello from `keys.me()` to `to` answering `challenge`, with the dialler's `nonce`, from a
    /// sender running in the configuration of `keys`.
    pub fn new(keys: &KeyRing, cluster_name: &str, to: Process, challenge: Nonce, nonce: Nonce) -> Hello {
        Hello::new_in(keys, cluster_name, to, challenge, nonce, keys.config_epoch())
    }

    /// [`Hello::new`] from a sender running in configuration `epoch` (`keys` may be a
    /// neighbouring configuration's).
    pub fn new_in(
        keys: &KeyRing,
        cluster_name: &str,
        to: Process,
        challenge: Nonce,
        nonce: Nonce,
        epoch: u64,
    ) -> Hello {
        let mut hello = Hello {
            cluster_name: cluster_name.to_string(),
            from: keys.me(),
            to,
            challenge,
            nonce,
            epoch,
            mac: Mac::default(),
        };
        hello.mac = keys.static_mac_for(key_principal(to), &hello_digest(&hello));
        hello
    }

    /// Checks a received hello: right cluster, meant for us, answering `challenge` (the nonce we
    /// sent on this connection), MAC from the claimed sender.
    pub fn check(&self, keys: &KeyRing, cluster_name: &str, challenge: &Nonce) -> Result<(), &'static str> {
        if self.cluster_name != cluster_name {
            return Err("net_hello_wrong_cluster");
        }
        if self.to != keys.me() {
            return Err("net_hello_wrong_receiver");
        }
        if self.challenge != *challenge {
            return Err("net_hello_stale_challenge");
        }
        keys.verify_static_mac(key_principal(self.from), &hello_digest(self), &self.mac)
            .map_err(|_| "net_hello_bad_mac")
    }
}

pub use upright_core::host::stage_for;

#[cfg(test)]
mod tests {
    use super::*;
    use upright_core::config::{ClusterConfig, Knobs, ReplicaInfo};
    use upright_core::crypto::SecretKeys;
    use upright_core::ids::ReplicaId;
    use upright_core::ids::StageKind;
    use upright_core::message::Message;

    fn config() -> (ClusterConfig, Vec<SecretKeys>) {
        let secrets: Vec<SecretKeys> = (0..4u8).map(|i| SecretKeys::from_seed([i + 1; 32])).collect();
        let config = ClusterConfig {
            cluster_name: "hello".into(),
            u: 1,
            r: 1,
            replicas: secrets
                .iter()
                .enumerate()
                .map(|(i, s)| ReplicaInfo {
                    id: ReplicaId(i as u32),
                    keys: s.public(),
                })
                .collect(),
            clients: vec![],
            knobs: Knobs::default(),
            admin: None,
            epoch: 0,
            origin: None,
            protocol: Default::default(),
            selective_execution: false,
            separate_stages: false,
            exec_u: None,
        };
        (config, secrets)
    }

    #[test]
    fn hello_checks_cluster_receiver_and_mac() {
        let (config, secrets) = config();
        let ring = |i: u32| KeyRing::new(&config, Process::Replica(ReplicaId(i)), &secrets[i as usize]);
        let (r0, r1, r2) = (ring(0), ring(1), ring(2));
        let (challenge, nonce) = (fresh_nonce(), fresh_nonce());
        assert_ne!(challenge, nonce);
        let hello = Hello::new(&r0, "hello", Process::Replica(ReplicaId(1)), challenge, nonce);
        assert_eq!(hello.check(&r1, "hello", &challenge), Ok(()));
        assert_eq!(hello.check(&r1, "other", &challenge), Err("net_hello_wrong_cluster"));
        assert_eq!(hello.check(&r2, "hello", &challenge), Err("net_hello_wrong_receiver"));
        // A recorded hello answers an old challenge, not the one a new connection gets.
        assert_eq!(
            hello.check(&r1, "hello", &fresh_nonce()),
            Err("net_hello_stale_challenge")
        );
        let mut forged = hello.clone();
        forged.from = Process::Replica(ReplicaId(3));
        assert_eq!(forged.check(&r1, "hello", &challenge), Err("net_hello_bad_mac"));
        // The challenge and the nonce are under the MAC.
        let mut forged = hello.clone();
        forged.nonce = fresh_nonce();
        assert_eq!(forged.check(&r1, "hello", &challenge), Err("net_hello_bad_mac"));
        let mut forged = hello.clone();
        forged.challenge = [0; 32];
        assert_eq!(forged.check(&r1, "hello", &[0; 32]), Err("net_hello_bad_mac"));
    }

    #[test]
    fn every_message_kind_but_reply_has_a_replica_stage() {
        let m = Message::LastExecuted {
            seqno: Default::default(),
        };
        assert_eq!(stage_for(&m), Some(StageKind::Order));
        let m = Message::Reply {
            request_id: Default::default(),
            result: upright_core::message::ReplyBody::Full(Default::default()),
            read_only: false,
            pushes_sent: 0,
        };
        assert_eq!(stage_for(&m), None);
    }
}
