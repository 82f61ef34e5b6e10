//! The shape every stage shares: `handle(now, input) -> actions` with no I/O inside.
//!
//! The host (simulator or runtime) feeds inputs and carries out the actions in order. The
//! durability rule: every [`Action::Persist`] must be durable before the host performs any
//! [`Action::Send`] that comes after it in the same action list (group commit is allowed: the host
//! may sync once for many persists, but never sends first). [`Action::PersistLazily`] writes keep
//! their place in the order of writes but do not hold sends back.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::crypto::Digest;
use crate::ids::{ClientId, Principal, RequestId, SeqNo, View};
use crate::message::Envelope;
pub use crate::message::PbftTimer;

/// Microseconds on the host's monotonic clock. The simulator's clock starts at 0; each member's
/// clock may be skewed.
pub type Time = u64;

/// Timers a stage can set. Setting a timer that is already set moves it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timer {
    /// Client: retransmit the outstanding request.
    ClientRetransmit,
    /// Client: ask the execution members for pushes it may have missed (PUSH-RESUME).
    PushResume,
    /// Authentication: periodic housekeeping (retransmission pacing).
    AuthTick,
    /// The order stage's timers (PBFT).
    Pbft(PbftTimer),
    /// Execution: retry fetches, LAST-EXEC and state transfer.
    ExecRetry,
    /// Client: refresh its session keys, or retire the previous ones (`crate::session`).
    KeyRefresh,
    /// The order stage's timers (LCR).
    Lcr(crate::message::lcr::LcrTimer),
    /// Never set by a stage: kept for a wrapper around one (the testing stand-ins for Byzantine
    /// replicas release the messages they hold back when it fires).
    Held,
}

/// A stage's durable storage as the host hands it back after a restart: key -> value.
pub type Storage = BTreeMap<String, Bytes>;

/// How a client's invoked operation is answered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReadPath {
    /// Ordered through agreement (any operation; linearizable).
    #[default]
    Ordered,
    /// The read-only path, linearizable: sent to every execution member and accepted only when
    /// all of them answer the same ([`crate::quorum::Quorums::read_only`]); otherwise ordered.
    ReadOnly,
    /// The read-only path, serializable: accepted on `r + 1` matching answers
    /// ([`crate::quorum::Quorums::reply`]), the state of at least one correct member, which may
    /// miss writes acknowledged moments ago (ZooKeeper's reads); otherwise ordered.
    Serializable,
}

impl ReadPath {
    /// Whether the operation takes the read-only path.
    pub fn is_read_only(self) -> bool {
        self != ReadPath::Ordered
    }
}

/// What a stage is told.
#[derive(Clone, Debug)]
pub enum Input {
    /// The stage was just created (fresh or from storage); set initial timers.
    Start,
    /// A message arrived (not yet authenticated: the stage checks its seal).
    Message(Arc<Envelope>),
    /// A timer fired.
    Timer(Timer),
    /// [`Input::Start`] for a proactive recovery (docs/PROTOCOL.md "Proactive recovery"; PBFT
    /// thesis 4.3): the process restarted to recover. Besides what it does at start, the
    /// authentication member starts a new key epoch, the order member estimates the recovery
    /// point from its peers, and the execution member distrusts its stored state (from before
    /// it executes anything) until it has checked it against a certified checkpoint. A client
    /// takes it as `Start`.
    Recover,
    /// Client only: the application invokes an operation.
    Invoke {
        /// The operation.
        operation: Bytes,
        /// How it is answered.
        path: ReadPath,
    },
}

/// What a stage asks its host to do.
#[derive(Clone, Debug)]
pub enum Action {
    /// Send one envelope to each of `to`.
    Send {
        /// Recipients.
        to: Vec<Principal>,
        /// The sealed message (shared among recipients).
        envelope: Arc<Envelope>,
    },
    /// Set (or move) a timer to fire at `at`.
    SetTimer {
        /// Which.
        timer: Timer,
        /// When (host clock).
        at: Time,
    },
    /// Cancel a timer.
    CancelTimer {
        /// Which.
        timer: Timer,
    },
    /// Write (`Some`) or delete (`None`) a key of the stage's durable storage.
    Persist {
        /// Key.
        key: String,
        /// Value, or `None` to delete.
        value: Option<Bytes>,
    },
    /// Like [`Action::Persist`], but later sends need not wait for it: the host writes it in order
    /// with the other persists and makes it durable with its next sync, and a crash before that
    /// may lose it (and every lazy write after the last synced one). For records that only speed
    /// up recovery and that no message depends on (the order stage's commit decision, which it can
    /// learn again from its prepared certificate and its peers).
    PersistLazily {
        /// Key.
        key: String,
        /// Value, or `None` to delete.
        value: Option<Bytes>,
    },
    /// Client only: the result of an invoked operation, accepted on a reply quorum.
    Deliver {
        /// Which request.
        request_id: RequestId,
        /// The result.
        result: Bytes,
    },
    /// Client only: pushed message `seq` of its stream (numbered from 1), accepted on
    /// `q.push()` matching copies; delivered in order, each once.
    DeliverPush {
        /// Its stream: `None` for the client's own, `Some(object)` for its pushes on an object
        /// under selective execution (docs/ODRC.md, "Per-object push streams").
        stream: Option<Bytes>,
        /// Its number in its stream.
        seq: u64,
        /// What the service pushed.
        payload: Bytes,
    },
    /// Client only: pushes `missed_from .. resume_at` are no longer kept by the execution
    /// members and will not be delivered; the next delivered is `resume_at`.
    PushGap {
        /// Its stream (as in [`Action::DeliverPush`]).
        stream: Option<Bytes>,
        /// The first push missed.
        missed_from: u64,
        /// The next push that will be delivered.
        resume_at: u64,
    },
    /// Something the host may record (metrics, logs, the simulator's checkers); no effect.
    Note(Event),
}

/// Observable progress of a stage, reported through [`Action::Note`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Order: batch `seqno` committed in `view` with history digest `history`.
    Committed {
        /// Sequence number.
        seqno: SeqNo,
        /// View.
        view: View,
        /// History digest `H_seqno`.
        history: Digest,
    },
    /// Order: a new view was installed (NEW-VIEW accepted or sent).
    ViewInstalled {
        /// The view.
        view: View,
    },
    /// Order: checkpoint `seqno` became stable.
    CheckpointStable {
        /// Sequence number.
        seqno: SeqNo,
    },
    /// Execution: batch `seqno` was executed; `history` is `H_seqno`.
    Executed {
        /// Sequence number.
        seqno: SeqNo,
        /// History digest.
        history: Digest,
    },
    /// Execution: the service pushed message `seq` to `client`; `digest` is its payload's.
    Pushed {
        /// The client.
        client: ClientId,
        /// Its stream (as in PUSH): `None` for the client's own.
        stream: Option<Bytes>,
        /// Its number among the pushes of its stream to this client.
        seq: u64,
        /// Digest of the payload.
        digest: Digest,
    },
    /// Execution: checkpoint taken at `seqno` with this state digest.
    Checkpointed {
        /// Sequence number.
        seqno: SeqNo,
        /// Digest of the execution checkpoint.
        state_digest: Digest,
    },
    /// Order: the configuration reached its boundary and this member, which the change keeps,
    /// hands over to the next configuration (`change` names its members and their endpoints).
    /// The host's owner connects to the members the next configuration adds: their votes count
    /// in this member's hand-over (docs/PROTOCOL.md "Reconfiguration").
    HandingOver {
        /// The change being handed over to.
        change: Box<crate::reconfig::SignedReconfiguration>,
    },
    /// Order: this replica's part in the current configuration ended; its host starts again in
    /// configuration epoch `epoch` ([`crate::order::configured`]) if `member`, else stops (the
    /// change removed it).
    Reconfigured {
        /// The new configuration epoch.
        epoch: u64,
        /// Whether this replica is a member of it.
        member: bool,
        /// Digest of the change ([`crate::reconfig::SignedReconfiguration::digest`]): equal at
        /// every correct member.
        change: Digest,
        /// The old configuration's last batch.
        boundary: SeqNo,
    },
    /// Execution: state transfer finished; the member now stands at `seqno`.
    StateLoaded {
        /// Sequence number.
        seqno: SeqNo,
        /// Digest of the loaded checkpoint.
        state_digest: Digest,
    },
}

impl Event {
    /// Whether the note reports progress that holds only once the stage's eager persists are
    /// durable (a commit, an execution, a checkpoint, a loaded state, a push): a host holds such
    /// a note back until its sync, like the sends that depend on it. The notes the host acts on
    /// (a hand-over, a switch) take effect at once.
    pub fn reports_durable_progress(&self) -> bool {
        !matches!(self, Event::HandingOver { .. } | Event::Reconfigured { .. })
    }
}

/// Counters a stage keeps (messages dropped by reason, work done). Names are stable strings so
/// hosts can export them as metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Counter name -> value.
    pub counters: BTreeMap<&'static str, u64>,
    /// Inputs refused because they prove their sender faulty: a seal that does not verify, two
    /// conflicting votes for one slot ([`Stats::reject`]). A host may compare it before and after
    /// an input to learn that the peer that sent it misbehaved (the runtime cuts off peers that
    /// keep doing so).
    pub rejected: u64,
}

impl Stats {
    /// Counts an input refused because it proves its sender faulty (also under `name`).
    pub fn reject(&mut self, name: &'static str) {
        self.bump(name);
        self.rejected += 1;
    }

    /// Adds one to a counter.
    pub fn bump(&mut self, name: &'static str) {
        self.add(name, 1);
    }

    /// Adds `n` to a counter (a counter that stays zero is not created).
    pub fn add(&mut self, name: &'static str, n: u64) {
        if n > 0 {
            *self.counters.entry(name).or_insert(0) += n;
        }
    }

    /// A counter's value.
    pub fn get(&self, name: &str) -> u64 {
        self.counters.get(name).copied().unwrap_or(0)
    }
}

/// A protocol stage: a deterministic state machine.
pub trait Stage {
    /// Who this stage is.
    fn principal(&self) -> Principal;
    /// Handles one input at host time `now`, appending the resulting actions to `out`.
    fn handle(&mut self, now: Time, input: Input, out: &mut Vec<Action>);
    /// Flush hook: the host has handed this stage every input that was ready; a stage that
    /// buffers outgoing messages (the authentication stage's AUTH-REQ items) emits them now.
    /// Stages that do not buffer ignore it (the default: no actions). Hosts call it after each
    /// round of inputs, before they make persists durable and perform the sends, so the usual
    /// durability rule covers the emitted sends. Calling it with nothing buffered is cheap and
    /// has no effect.
    fn flush(&mut self, now: Time, out: &mut Vec<Action>) {
        let _ = (now, out);
    }
    /// The stage's counters.
    fn stats(&self) -> &Stats;
}
