//! LCR's order-stage vocabulary (Quéma, ch. 2; docs/PROTOCOL.md "LCR"): the ring's records, the
//! per-link acknowledgements that give FIFO delivery over a lossy network, and the view change
//! that replaces LCR's perfect failure detector and group membership (RECOVER / NEW-VIEW /
//! ACCEPTED / END). They nest in [`super::Message::Lcr`] and [`crate::stage::Timer::Lcr`].

use serde::{Deserialize, Serialize};

use super::RequestEntry;
use crate::crypto::Digest;
use crate::ids::{ClientId, ReplicaId, RequestId, SeqNo};

/// A broadcast's identity within a view: its origin's ring position and its index among that
/// origin's broadcasts (`C_m[origin]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BroadcastId {
    /// View in which it was broadcast.
    pub view: u64,
    /// The origin's position on that view's ring.
    pub origin: u32,
    /// `C_m[origin]`: 1 for the origin's first broadcast of the view.
    pub index: u64,
}

/// A batch an order member broadcast on the ring, stamped with its vector clock.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Broadcast {
    /// Its identity.
    pub id: BroadcastId,
    /// The origin's vector clock when it sent it (one entry per ring position).
    pub clock: Vec<u64>,
    /// The origin's clock reading, the batch's proposed time.
    pub time_us: u64,
    /// The requests (a wake-up batch has none).
    pub entries: Vec<RequestEntry>,
}

/// One record of a RING message.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RingRecord {
    /// A broadcast travelling around the ring.
    Data(Broadcast),
    /// The broadcast completed the ring: every member has it (it is stable).
    Ack(BroadcastId),
}

/// A batch in the decided sequence.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Decided {
    /// Its sequence number.
    pub seqno: SeqNo,
    /// The broadcast it came from (to tell a reported broadcast that is already decided).
    pub from: BroadcastId,
    /// Agreed time: `max(previous + 1, proposed)`.
    pub time_us: u64,
    /// `H_seqno`.
    pub history: Digest,
    /// The broadcast's requests that were not ordered before it.
    pub entries: Vec<RequestEntry>,
}

/// The decided prefix at a checkpoint: what a member that is behind adopts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Snapshot {
    /// Sequence number.
    pub seqno: SeqNo,
    /// `H_seqno`.
    pub history: Digest,
    /// The agreed time of batch `seqno`.
    pub time_us: u64,
    /// Each client's last ordered request.
    pub last_ordered: Vec<(ClientId, RequestId)>,
    /// The execution checkpoint at `seqno` its tokens certified (none at 0).
    pub exec_state: Option<Digest>,
}

/// RECOVER: a member's state, to the leader of the view it moves to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Recover {
    /// The view being moved to.
    pub view: u64,
    /// The last view whose NEW-VIEW the sender accepted.
    pub installed: u64,
    /// Its oldest kept prefix.
    pub low: Snapshot,
    /// Its decided batches after `low` (the last ones may be a NEW-VIEW's, not yet released).
    pub log: Vec<Decided>,
    /// The broadcasts of `installed` it received and has not decided, stable or not.
    pub pending: Vec<Broadcast>,
}

/// NEW-VIEW: the leader's decision for a view: its ring and the decided sequence it starts from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NewView {
    /// The view.
    pub view: u64,
    /// Its ring, in ring order (ascending replica ids).
    pub ring: Vec<ReplicaId>,
    /// The prefix the entries follow.
    pub low: Snapshot,
    /// The decided batches after `low`.
    pub entries: Vec<Decided>,
}

/// LCR's messages among order members.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LcrMessage {
    /// RING: records for the successor, numbered per link and view from 1. MAC.
    Ring {
        /// View.
        view: u64,
        /// Link sequence number.
        seq: u64,
        /// Data and acknowledgements, in the order the sender forwards them.
        records: Vec<RingRecord>,
    },
    /// LINK-ACK: the successor holds every RING of `view` through `through`. MAC.
    LinkAck {
        /// View.
        view: u64,
        /// Highest link sequence number received in order.
        through: u64,
    },
    /// CHANGE: the sender moves to `view` (it sent its RECOVER to the leader). MAC.
    Change {
        /// The view.
        view: u64,
    },
    /// RECOVER, to the leader of its view. MAC.
    Recover(Box<Recover>),
    /// NEW-VIEW, from the leader to the ring's members. MAC.
    NewView(Box<NewView>),
    /// ACCEPTED: the sender holds `view`'s NEW-VIEW durably. MAC.
    Accepted {
        /// The view.
        view: u64,
    },
    /// END: every member of the ring accepted the NEW-VIEW; decide its entries and start. MAC.
    End {
        /// The view.
        view: u64,
    },
}

/// LCR's timers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LcrTimer {
    /// Housekeeping: link retransmission, progress watch, view-change resends.
    Tick,
    /// Close the batch being filled.
    BatchClose,
    /// The leader stops waiting for more RECOVERs than the quorum.
    Collect,
    /// A wake-up the execution members asked for is due: broadcast an empty batch.
    Wake,
}
