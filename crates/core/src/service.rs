//! The application interface (UpRight thesis Appendix B, reduced): a deterministic service.
//!
//! Besides replies, executing a batch may push messages to clients ([`Effects::push`]: a
//! ZooKeeper watch event, a Redis pub/sub message). Every correct execution member emits the same
//! pushes in the same order (execution is deterministic); each client numbers the pushes meant for
//! it from 1, accepts one only when `r + 1` execution members sent the same, and receives them in
//! order, exactly once, or an explicit gap where they are no longer kept (docs/PROTOCOL.md,
//! "Pushed messages").

use std::collections::BTreeSet;

use bytes::Bytes;

use crate::ids::{ClientId, RequestId, SeqNo};
use crate::pages::Pages;

/// Agreed context of a batch: the same at every correct execution member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchContext {
    /// Sequence number of the batch.
    pub seqno: SeqNo,
    /// Agreed time in microseconds (strictly increasing across batches). Use it instead of the
    /// local clock.
    pub time_us: u64,
    /// Agreed random seed. Use it instead of local randomness.
    pub seed: [u8; 32],
    /// Index within the batch of the first request handed with this context (0 for a whole
    /// batch; the i-th request handed is at index `index + i`). With `seqno`, a request's agreed
    /// position: the same at every member and in a replay (under selective execution a member
    /// runs one request at a time, or replays it later, with its original position), so a
    /// service may name what a request creates after it instead of after a counter that requests
    /// the member skipped would have moved.
    pub index: u32,
}

/// One request of a batch, as the service sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRequest {
    /// Client that sent it.
    pub client: ClientId,
    /// Its request number.
    pub request_id: RequestId,
    /// The operation bytes.
    pub operation: Bytes,
}

/// A message the service pushes to a client while executing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Push {
    /// The client it is for.
    pub client: ClientId,
    /// What it says (at most [`crate::limits::PUSH_BYTES_MAX`] bytes; longer ones are dropped and
    /// counted by the execution stage).
    pub payload: Bytes,
    /// The object whose write emitted it ([`Effects::push_on`]), if any: under selective
    /// execution its stream.
    pub object: Option<Bytes>,
}

/// What executing a batch does besides its replies, collected in emission order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    pushes: Vec<Push>,
    /// `(client, object, always)`: streams whose position the running request's reply
    /// announces (`always` false: only if the stream has had a push).
    announced: Vec<(ClientId, Bytes, bool)>,
}

impl Effects {
    /// Pushes `payload` to `client` after this batch's replies.
    pub fn push(&mut self, client: ClientId, payload: Bytes) {
        self.pushes.push(Push {
            client,
            payload,
            object: None,
        });
    }

    /// Pushes `payload` to `client` on behalf of `object`, which the running request (or
    /// wake-up) writes: a ZooKeeper watch event of the node, a key's watch. Without selective
    /// execution it is a [`Effects::push`]. Under selective execution (docs/ODRC.md, "Per-object
    /// push streams") it goes in the stream of `(object, client)`, numbered by whichever members
    /// run the object's requests and carried with the object's state at checkpoints, so members
    /// that ran different requests number it alike; a push on an object the request did not
    /// declare is dropped (counted `push_object_undeclared`).
    pub fn push_on(&mut self, object: Bytes, client: ClientId, payload: Bytes) {
        self.pushes.push(Push {
            client,
            payload,
            object: Some(object),
        });
    }

    /// Tells the running request's client, in its reply, where its stream of pushes on
    /// `object` stands (under selective execution; nothing otherwise): call it when the request
    /// makes the client wait for such pushes (sets a watch), so the client asks for them even if
    /// every copy of the first one is lost. `client` must be the request's own client (others
    /// are ignored).
    pub fn announce_stream(&mut self, client: ClientId, object: Bytes) {
        self.announced.push((client, object, true));
    }

    /// Like [`Effects::announce_stream`], but only if the stream has had a push: call it for
    /// every object a request reads or writes that its client may have a push of still on its
    /// way (a ZooKeeper watch that fired), so the reply comes after that push (a client sees a
    /// node's event before the data that changed it) without making the client follow streams
    /// that never had one.
    pub fn announce_if_pushed(&mut self, client: ClientId, object: Bytes) {
        self.announced.push((client, object, false));
    }

    /// Takes the announced streams (`(client, object, always)`), leaving none.
    pub fn take_announced(&mut self) -> Vec<(ClientId, Bytes, bool)> {
        std::mem::take(&mut self.announced)
    }

    /// Emits a push as it is (one taken with [`Effects::take_pushes`] and altered, say), its
    /// object kept.
    pub fn add_push(&mut self, push: Push) {
        self.pushes.push(push);
    }

    /// The pushes, in the order they were emitted.
    pub fn pushes(&self) -> &[Push] {
        &self.pushes
    }

    /// Takes the pushes, leaving none.
    pub fn take_pushes(&mut self) -> Vec<Push> {
        std::mem::take(&mut self.pushes)
    }
}

/// The objects one operation may read and write, named by the service (ODRC's request analysis
/// function). Conservative: the operation may touch fewer objects, never others. An object named
/// only in `writes` may be read too.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// Objects it may read.
    pub reads: BTreeSet<Bytes>,
    /// Objects it may write.
    pub writes: BTreeSet<Bytes>,
}

impl Access {
    /// An operation that reads `objects`.
    pub fn reading(objects: impl IntoIterator<Item = Bytes>) -> Access {
        Access {
            reads: objects.into_iter().collect(),
            writes: BTreeSet::new(),
        }
    }

    /// An operation that writes `objects`.
    pub fn writing(objects: impl IntoIterator<Item = Bytes>) -> Access {
        Access {
            reads: BTreeSet::new(),
            writes: objects.into_iter().collect(),
        }
    }

    /// Adds another operation's objects (the access of a sequence of operations).
    pub fn merge(&mut self, other: Access) {
        self.reads.extend(other.reads);
        self.writes.extend(other.writes);
    }

    /// Whether the operation only reads.
    pub fn is_read_only(&self) -> bool {
        self.writes.is_empty()
    }
}

/// Error restoring a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint could not be restored: {0}")]
pub struct RestoreError(pub String);

/// A deterministic replicated service.
///
/// Determinism is the contract: given the same sequence of batches (with their contexts), every
/// replica must return the same replies and produce byte-identical checkpoints.
pub trait Service {
    /// Executes a whole batch in order, returning one reply per request; pushes to clients go
    /// into `effects`, in order.
    fn execute(&mut self, context: &BatchContext, requests: &[ServiceRequest], effects: &mut Effects) -> Vec<Bytes>;

    /// The objects `operation` may read and write (ODRC's request analysis: the replicas can then
    /// run it on fewer replicas and bring stale objects up to date on demand). `None`: unknown, or
    /// it may touch anything (a malformed operation, a whole-store command). It must depend on
    /// the operation's bytes only, never on the state, and may name more objects than the
    /// operation touches, never fewer. Optional: the default says `None` for everything.
    fn access(&self, operation: &[u8]) -> Option<Access> {
        let _ = operation;
        None
    }

    /// Called once, before anything else, by an execution stage of a cluster that runs selective
    /// execution (`selective_execution = true`): a service that can run selectively switches to
    /// the rules that needs (docs/ODRC.md, "What a service must do": a reply and the state it
    /// leaves depend only on the declared objects and the request's own agreed context) and says
    /// `true`; the default says `false`, and the execution stage refuses to start. A service with
    /// [`Service::pages`] may say `true` only if its pages are a function of its objects' states
    /// (a key's bytes in the page its name hashes to, say), not of the order writes came in (a
    /// page allocator): members that ran different requests have equal objects at each
    /// checkpoint, and must then have equal pages.
    fn enable_selective_execution(&mut self) -> bool {
        false
    }

    /// ODRC's object checkpoint function (docs/ODRC.md): the state of object `object` (a name
    /// [`Service::access`] gives) as deterministic bytes, `Some(None)` when the object is absent.
    /// `None`, the default, says the service does not support selective execution. The bytes must
    /// cover everything requests on the object can observe or change, and nothing else: under
    /// selective execution an operation's reply and effects may depend only on the state of the
    /// objects it declares (no store-wide counts or limits).
    fn object_state(&self, object: &[u8]) -> Option<Option<Bytes>> {
        let _ = object;
        None
    }

    /// ODRC's object update function: replaces object `object`'s state with one
    /// [`Service::object_state`] gave (`None`: the object is absent). Supported exactly when
    /// `object_state` is.
    fn restore_object(&mut self, object: &[u8], state: Option<&[u8]>) -> Result<(), RestoreError> {
        let _ = (object, state);
        Err(RestoreError("this service does not restore single objects".into()))
    }

    /// Which objects share maintainers under selective execution (ODRC's locality policy:
    /// objects with equal placements are kept by the same `r + 1` execution members, so a request
    /// on several of them is not cross-border). The default places each object by itself.
    fn placement(&self, object: &[u8]) -> Bytes {
        Bytes::copy_from_slice(object)
    }

    /// Whether [`Service::wake_at`] depends only on state every member keeps current under
    /// selective execution (state only global requests write: ZooKeeper's sessions), so every
    /// member wakes at the same batch and the wake-up's pushes can be numbered alike (as a
    /// global request's). Otherwise (the default: a key's expiry time lives with the key)
    /// members may wake at different batches and a wake-up's pushes are dropped under
    /// selective execution.
    fn wakes_on_global_state(&self) -> bool {
        false
    }

    /// The agreed time (microseconds, as [`BatchContext::time_us`]) at which the service wants
    /// [`Service::wake`] called, if any: session expiry, a timer. Asked before every batch;
    /// the default asks for nothing.
    fn wake_at(&self) -> Option<u64> {
        None
    }

    /// Called with the first batch whose agreed time reached [`Service::wake_at`], before that
    /// batch's requests. When the cluster is idle the execution stage tells the order stage the
    /// next wake-up (WAKE-AT) and the primary orders an empty batch then (besides heartbeat
    /// batches every `Knobs::heartbeat_interval_us`), so a wake-up comes about one agreement
    /// round after its time. Part of the deterministic execution: it may change the state and push.
    fn wake(&mut self, context: &BatchContext, effects: &mut Effects) {
        let _ = (context, effects);
    }

    /// Answers a read-only operation from the current state, or `None` if the operation is not
    /// read-only (the client then uses the ordered path).
    fn execute_read_only(&self, operation: &[u8]) -> Option<Bytes>;

    /// Deterministic serialization of the state, except its pages (for a service without pages:
    /// the whole state).
    fn checkpoint(&self) -> Bytes;

    /// Replaces the state with a checkpoint's. For a paged service the pages are already in
    /// place (loaded from storage or fetched from peers) when this is called: rebuild whatever
    /// the service derives from them here.
    fn restore(&mut self, checkpoint: &[u8]) -> Result<(), RestoreError>;

    /// The service's paged state, if it keeps one (PBFT's partition tree; docs/SERVICES.md,
    /// "Paged state"): the execution stage checkpoints only the pages changed since the previous
    /// checkpoint, persists them, and a member that fell behind fetches only the pages that
    /// differ. A large state belongs here; [`Service::checkpoint`] then carries only the rest.
    /// The default has no pages.
    fn pages(&self) -> Option<&Pages> {
        None
    }

    /// The paged state, to write (the execution stage installs loaded and fetched pages and
    /// freezes the state at each checkpoint). Must be `Some` exactly when [`Service::pages`] is.
    fn pages_mut(&mut self) -> Option<&mut Pages> {
        None
    }
}
