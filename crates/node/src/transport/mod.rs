//! TCP transport: length-prefixed frames carrying `upright_core::codec` envelopes.
//!
//! Each connection starts with a [`Hello`] frame naming the sending process and the intended
//! receiver, MACed with their pairwise key, so a connection is tied to one peer; every envelope that
//! arrives on it must come from a principal of that process (else it is dropped and counted).
//! Replica-to-replica traffic uses one connection per direction (each replica dials every peer and
//! only writes on it); clients dial each replica's client listener and receive replies on the same
//! connection. Outbound traffic to each peer goes through one bounded queue (a full queue drops
//! the new message and counts it; the protocol retransmits). Inbound envelopes go into the
//! per-peer queues of an [`Inbox`], served round-robin. Garbage, oversized frames or a bad hello
//! close that connection and are counted; nothing here panics on input.

mod conn;
mod frame;
mod inbox;

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use upright_core::crypto::{Digest, KeyRing, Mac};
use upright_core::ids::{Principal, Process, StageKind};
use upright_core::message::Message;

pub use conn::{dial, serve, ClientRoutes, Dialer, OUTBOUND_QUEUE_MAX};
pub use frame::{read_frame, write_frame, FrameError};
pub use inbox::{Inbox, INBOX_PER_PEER_MAX};

/// Largest hello frame.
pub const HELLO_BYTES_MAX: usize = 1024;

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

/// The first frame of every connection.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// Cluster name (a connection to another cluster's member is refused).
    pub cluster_name: String,
    /// Who dials.
    pub from: Process,
    /// Whom it means to reach.
    pub to: Process,
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

fn hello_digest(cluster_name: &str, from: Process, to: Process) -> Digest {
    Digest::of_parts(
        "upright hello v1",
        &[&upright_core::codec::to_bytes(&(cluster_name, from, to))],
    )
}

impl Hello {
    /// A hello from `keys.me()` to `to`.
    pub fn new(keys: &KeyRing, cluster_name: &str, to: Process) -> Hello {
        let from = keys.me();
        Hello {
            cluster_name: cluster_name.to_string(),
            from,
            to,
            mac: keys.mac_for(key_principal(to), &hello_digest(cluster_name, from, to)),
        }
    }

    /// Checks a received hello: right cluster, meant for us, MAC from the claimed sender.
    pub fn check(&self, keys: &KeyRing, cluster_name: &str) -> Result<(), &'static str> {
        if self.cluster_name != cluster_name {
            return Err("net_hello_wrong_cluster");
        }
        if self.to != keys.me() {
            return Err("net_hello_wrong_receiver");
        }
        keys.verify_mac(
            key_principal(self.from),
            &hello_digest(&self.cluster_name, self.from, self.to),
            &self.mac,
        )
        .map_err(|_| "net_hello_bad_mac")
    }
}

/// The stage of a replica that handles a message kind (`None`: a message only clients receive).
pub fn stage_for(message: &Message) -> Option<StageKind> {
    use Message::*;
    match message {
        ClientRequest { .. } | BatchComplete { .. } | Fetch { .. } => Some(StageKind::Auth),
        AuthRequest { .. }
        | PrePrepare { .. }
        | Prepare { .. }
        | Commit { .. }
        | Checkpoint(_)
        | ViewChange(_)
        | NewView(_)
        | FetchOrderCheckpoint { .. }
        | OrderCheckpointState(_)
        | CheckpointToken { .. }
        | LastExecuted { .. } => Some(StageKind::Order),
        Command { .. }
        | NextBatch { .. }
        | LoadCheckpoint { .. }
        | Retransmit { .. }
        | FetchState { .. }
        | StateManifest { .. }
        | StateChunk { .. } => Some(StageKind::Exec),
        Reply { .. } => None,
    }
}
