//! PBFT's order-stage vocabulary: the messages order members exchange among themselves
//! (agreement, checkpoints, view changes, order state transfer) and the order stage's timers.
//! They nest in [`Message::Pbft`] and [`crate::stage::Timer::Pbft`], so that another ordering
//! protocol (Aliph's Chain, LCR) adds a module like this one and one variant in each enum,
//! without touching these.

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::Message;
use super::{Batch, OrderCheckpoint, Signed};
use crate::config::FastPhase;
use crate::crypto::Digest;
use crate::ids::ReplicaId;
use crate::ids::{SeqNo, View};

/// The order stage's messages among order members (PBFT).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PbftMessage {
    /// PRE-PREPARE (PBFT): the primary assigns `seqno` to `batch` in `view`. Authenticator.
    PrePrepare {
        /// View.
        view: View,
        /// Sequence number.
        seqno: SeqNo,
        /// The batch.
        batch: Batch,
    },
    /// PREPARE (PBFT). Authenticator.
    Prepare {
        /// View.
        view: View,
        /// Sequence number.
        seqno: SeqNo,
        /// Batch digest.
        digest: Digest,
    },
    /// COMMIT (PBFT). Authenticator.
    Commit {
        /// View.
        view: View,
        /// Sequence number.
        seqno: SeqNo,
        /// Batch digest.
        digest: Digest,
    },
    /// CHECKPOINT (PBFT), signed so it can go into stable-checkpoint certificates.
    Checkpoint(Signed<CheckpointVote>),
    /// VIEW-CHANGE, signed.
    ViewChange(Signed<ViewChange>),
    /// NEW-VIEW, signed.
    NewView(NewViewMessage),
    /// Asks an order member for the full order checkpoint with this digest (order state transfer).
    FetchOrderCheckpoint {
        /// Sequence number.
        seqno: SeqNo,
        /// Digest of the wanted [`OrderCheckpoint`].
        digest: Digest,
    },
    /// Answer to [`PbftMessage::FetchOrderCheckpoint`]: a stable checkpoint with its certificate.
    OrderCheckpointState(StableCheckpoint),
    /// SUSPECT: the sender's watch gave up on the primary of `view` (`order/monitor.rs`). A
    /// member starts the view change once `view_change_join()` members, itself included, suspect
    /// the primary of its view, so one member's mistaken suspicion does not take it out of the
    /// view. Authenticator.
    Suspect {
        /// The view whose primary is suspected.
        view: View,
    },
    /// QUERY-STABLE (PBFT thesis 4.3.2, estimation): a member in proactive recovery asks for
    /// each peer's stable checkpoint (`order/recovery.rs`). MAC per recipient.
    QueryStable {
        /// Fresh per recovery, echoed in the answer (an old answer does not count).
        nonce: u64,
    },
    /// REPLY-STABLE: the sender's latest stable checkpoint certificate (`None`: none yet),
    /// answering the QUERY-STABLE with `nonce`. MAC.
    ReplyStable {
        /// The query's nonce.
        nonce: u64,
        /// The certificate (checked by the receiver).
        stable: Option<StableCheckpoint>,
    },
    /// CHAIN (Aliph's Chain, `protocol = "chain"`; docs/PROTOCOL.md "Chain"): in a view's fast
    /// phase the sender accepted `batch` at `seqno` and hands it to its successor in the view's
    /// chain (it counts as the sender's vote). MAC.
    Chain {
        /// View.
        view: View,
        /// Sequence number.
        seqno: SeqNo,
        /// The batch.
        batch: Batch,
    },
}

impl PbftMessage {
    /// Whether the message authenticates itself (signed votes and certificates, sent with no
    /// seal); the others travel under a MAC or an authenticator.
    pub fn self_authenticating(&self) -> bool {
        matches!(
            self,
            PbftMessage::Checkpoint(_)
                | PbftMessage::ViewChange(_)
                | PbftMessage::NewView(_)
                | PbftMessage::OrderCheckpointState(_)
        )
    }
}

/// The order stage's timers (PBFT).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PbftTimer {
    /// Close the batch being filled.
    BatchClose,
    /// The primary has not made progress on known requests; start a view change.
    ViewChange,
    /// Periodic housekeeping (resend of VIEW-CHANGE, checkpoint votes, fetches).
    OrderTick,
    /// (Backup) a PREPARE that left the primary out has not led to a commit in time; send it to
    /// the primary too.
    PrimaryHelp,
    /// (Primary) a wake-up the execution members asked for is due: order an empty batch.
    Wake,
    /// (Backup) a request ready here reaches the longest it may wait for the primary
    /// (`order/monitor.rs`).
    Watch,
    /// (`protocol = "quorum"`) the oldest request waiting in the Quorum phase has waited
    /// `quorum_commit_timeout_us`: abort the phase (`order/quorum.rs`).
    QuorumAbort,
}

/// CHECKPOINT (PBFT): an order member states the digest of its order checkpoint at `seqno`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CheckpointVote {
    /// The checkpoint's sequence number.
    pub seqno: SeqNo,
    /// Digest of the [`OrderCheckpoint`].
    pub digest: Digest,
}

/// A stable-checkpoint certificate: `checkpoint_stable` signed votes for the same checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StableCheckpoint {
    /// The checkpoint itself.
    pub checkpoint: OrderCheckpoint,
    /// Signed votes from distinct order members for `(checkpoint.seqno, checkpoint.digest())`.
    pub votes: Vec<Signed<CheckpointVote>>,
}

/// An entry of a VIEW-CHANGE's prepared set `P`: the member prepared `digest` at `seqno` in
/// `view` (the latest such view), and carries the batch so the new primary can re-propose it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// Sequence number.
    pub seqno: SeqNo,
    /// View in which it prepared.
    pub view: View,
    /// Batch digest.
    pub digest: Digest,
    /// The batch.
    pub batch: Batch,
}

/// An entry of a VIEW-CHANGE's pre-prepared set `Q`: the member accepted a PRE-PREPARE for
/// `digest` at `seqno` in `view` (latest view per distinct digest, at most a few per seqno).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PrePreparedClaim {
    /// Sequence number.
    pub seqno: SeqNo,
    /// View of the PRE-PREPARE.
    pub view: View,
    /// Batch digest.
    pub digest: Digest,
}

/// An entry of a VIEW-CHANGE's speculative set (`protocol = "quorum"`, docs/PROTOCOL.md
/// "Quorum"): the member executed `batch` speculatively at `seqno` in the Quorum phase of `view`,
/// where its history became `history` (so two claims with the same history at one seqno agree
/// on every batch before it too). Aliph's abort history, one position per claim.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpeculativeClaim {
    /// Sequence number.
    pub seqno: SeqNo,
    /// The view whose Quorum phase it was executed in.
    pub view: View,
    /// The member's history digest after it.
    pub history: Digest,
    /// The batch.
    pub batch: Batch,
}

/// VIEW-CHANGE body (signed by its sender).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ViewChange {
    /// The view being moved to.
    pub new_view: View,
    /// The sender's latest stable checkpoint (`None` = the initial state at seqno 0).
    pub stable: Option<StableCheckpoint>,
    /// Prepared set `P` for seqnos above the stable checkpoint.
    pub prepared: Vec<PreparedClaim>,
    /// Pre-prepared set `Q` for seqnos above the stable checkpoint.
    pub pre_prepared: Vec<PrePreparedClaim>,
    /// Speculative set for seqnos above the stable checkpoint (empty unless `protocol =
    /// "quorum"`).
    pub speculative: Vec<SpeculativeClaim>,
}

/// A VIEW-CHANGE named by a NEW-VIEW: its signer and its signature, which binds its body (a
/// member that holds a checked VIEW-CHANGE with this signer and signature holds that one).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ViewChangeRef {
    /// The member that signed it.
    pub signer: ReplicaId,
    /// Its signature.
    pub signature: crate::crypto::Signature,
}

impl ViewChangeRef {
    /// The reference of `vc`.
    pub fn of(vc: &Signed<ViewChange>) -> ViewChangeRef {
        ViewChangeRef {
            signer: vc.signer,
            signature: vc.signature,
        }
    }

    /// Whether `vc` is the VIEW-CHANGE this names.
    pub fn names(&self, vc: &Signed<ViewChange>) -> bool {
        vc.signer == self.signer && vc.signature == self.signature
    }
}

/// The NEW-VIEW message: the signed body and the VIEW-CHANGEs it names. The new primary's first
/// multicast leaves them out (`view_changes` empty): every member got them from their senders,
/// and a NEW-VIEW under load was megabytes of VIEW-CHANGEs each member already held. A member
/// that lacks one gets the NEW-VIEW again with all of them when it resends its own VIEW-CHANGE
/// (the primary's relay).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NewViewMessage {
    /// The signed NEW-VIEW.
    pub new_view: Signed<NewView>,
    /// The VIEW-CHANGEs it names, or none.
    pub view_changes: Vec<Signed<ViewChange>>,
}

/// NEW-VIEW body (signed by the new primary): the view-change quorum it used (by reference) and
/// its decisions, which every backup re-derives from the quorum before accepting.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NewView {
    /// The new view.
    pub view: View,
    /// `view_change` signed VIEW-CHANGE messages for `view` from distinct members.
    pub view_changes: Vec<ViewChangeRef>,
    /// The checkpoint the new view starts from (`None` = initial state).
    pub stable: Option<StableCheckpoint>,
    /// For each seqno above it up to the highest chosen one: the batch re-proposed in `view`
    /// (an empty batch is a null request).
    pub batches: Vec<(SeqNo, Batch)>,
    /// `protocol = "quorum"`, `"chain"` or `"aliph"`: the batches the view orders through the
    /// three-phase path after these before its fast phase (Aliph's Backup `k`, chosen by the
    /// primary: `order/quorum.rs`); 0 under other protocols.
    pub backup_batches: u64,
    /// The view's fast phase after its Backup phase (chosen by the primary under `protocol =
    /// "aliph"`; fixed by the protocol otherwise).
    pub fast_phase: FastPhase,
}
