//! Identifiers of principals, views, sequence numbers and requests.

use serde::{Deserialize, Serialize};

/// Index of a replica (a process that hosts at most one member of each stage).
///
/// Replica `i` hosts authentication member `i`, order member `i`, and execution member `i` when
/// `i < n_execution`; with separate stages, replicas from `n_order` on host one execution member
/// each ([`crate::quorum::Quorums::process_of`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ReplicaId(pub u32);

/// Identifier of an authorised client, as listed in the cluster configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClientId(pub u32);

/// A view of the order stage; the primary of view `v` is order member `v mod n_order`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct View(pub u64);

/// Sequence number of an ordered batch. Batch 1 is the first; 0 is the initial (empty) state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SeqNo(pub u64);

/// A client's request number `n_c`: starts at 1 and grows by one per request (UpRight CS1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId(pub u64);

/// The stage a member belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum StageKind {
    /// Authentication stage (the papers' "filter" / "RQ").
    Auth,
    /// Order stage (PBFT agreement).
    Order,
    /// Execution stage (runs the service).
    Exec,
}

impl StageKind {
    /// Replica `replica`'s member of this stage.
    pub fn member(self, replica: ReplicaId) -> Principal {
        match self {
            StageKind::Auth => Principal::Auth(replica),
            StageKind::Order => Principal::Order(replica),
            StageKind::Exec => Principal::Exec(replica),
        }
    }
}

/// Anyone who sends or receives protocol messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Principal {
    /// A client.
    Client(ClientId),
    /// Authentication member `i` (hosted by replica `i`).
    Auth(ReplicaId),
    /// Order member `i` (hosted by replica `i`).
    Order(ReplicaId),
    /// Execution member `i` (hosted by replica `i`, or `n_order + i` with separate stages).
    Exec(ReplicaId),
}

/// A process that owns long-term keys: a replica (all its co-located stage members) or a client.
///
/// MAC keys are pairwise between *processes*, so a replica's stage members share its keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Process {
    /// A replica process.
    Replica(ReplicaId),
    /// A client process.
    Client(ClientId),
}

impl Principal {
    /// The process that holds this principal's keys, when execution members start at replica
    /// `exec_base` (0 when the stages share processes, `n_order` when they do not; see
    /// [`crate::quorum::Quorums::process_of`]).
    pub fn process_at(self, exec_base: u32) -> Process {
        match self {
            Principal::Client(c) => Process::Client(c),
            Principal::Auth(r) | Principal::Order(r) => Process::Replica(r),
            Principal::Exec(r) => Process::Replica(ReplicaId(r.0 + exec_base)),
        }
    }

    /// The index of the replica process hosting this principal (see [`Principal::process_at`]),
    /// if it is a stage member.
    pub fn process_index(self, exec_base: u32) -> Option<u32> {
        match self.process_at(exec_base) {
            Process::Replica(r) => Some(r.0),
            Process::Client(_) => None,
        }
    }

    /// The replica index, if this is a stage member.
    pub fn replica(self) -> Option<ReplicaId> {
        match self {
            Principal::Client(_) => None,
            Principal::Auth(r) | Principal::Order(r) | Principal::Exec(r) => Some(r),
        }
    }

    /// The stage, if this is a stage member.
    pub fn stage(self) -> Option<StageKind> {
        match self {
            Principal::Client(_) => None,
            Principal::Auth(_) => Some(StageKind::Auth),
            Principal::Order(_) => Some(StageKind::Order),
            Principal::Exec(_) => Some(StageKind::Exec),
        }
    }
}

impl SeqNo {
    /// The next sequence number.
    pub fn next(self) -> SeqNo {
        SeqNo(self.0 + 1)
    }
}

impl RequestId {
    /// The next request id.
    pub fn next(self) -> RequestId {
        RequestId(self.0 + 1)
    }
}

impl View {
    /// The next view.
    pub fn next(self) -> View {
        View(self.0 + 1)
    }
}
