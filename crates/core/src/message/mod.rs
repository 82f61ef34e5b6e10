//! Every protocol message, the envelope that authenticates it, and its bounds.
//!
//! Tags and layouts follow the UpRight thesis Appendix A where it gives them; the order stage's
//! internal messages (which the thesis leaves open) follow PBFT. The wire format is in
//! [`crate::wire`]; the message bounds in [`crate::limits`].

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::config::Sabotage;
use crate::crypto::{AuthError, Authenticator, Digest, KeyRing, Mac, MatrixRow, MatrixSignature, Signature};
use crate::ids::{ClientId, Principal, Process, ReplicaId, RequestId, SeqNo, StageKind, View};
use crate::quorum::Quorums;

pub mod lcr;
pub mod pbft;
pub use crate::config::FastPhase;
pub use pbft::{
    CheckpointVote, NewView, NewViewMessage, PbftMessage, PbftTimer, PrePreparedClaim, PreparedClaim, SpeculativeClaim,
    StableCheckpoint, ViewChange, ViewChangeRef,
};

/// The body of a request as the order stage sees it: inline if small, otherwise its digest
/// (the body is then fetched from the authentication stage).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RequestBody {
    /// The operation itself.
    Inline(Bytes),
    /// The digest of the operation.
    Digest(Digest),
}

impl RequestBody {
    /// Digest of the operation, whether inline or not.
    pub fn operation_digest(&self) -> Digest {
        match self {
            RequestBody::Inline(op) => Digest::of(op),
            RequestBody::Digest(d) => *d,
        }
    }
}

/// A request as ordered (thesis "Entry"): who, which request number, and the body or its digest.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestEntry {
    /// The client.
    pub client: ClientId,
    /// Its request number.
    pub request_id: RequestId,
    /// The operation or its digest.
    pub body: RequestBody,
}

impl RequestEntry {
    /// Digest identifying the entry, the form of its body included: agreement on a batch fixes
    /// which entries travel inline, so every member that reads an inline body (the order stage
    /// reads the administrator's reconfigurations, [`crate::reconfig`]) reads the same ones.
    pub fn digest(&self) -> Digest {
        let domain = match self.body {
            RequestBody::Inline(_) => "upright entry v1",
            RequestBody::Digest(_) => "upright entry by digest v1",
        };
        Digest::of_parts(
            domain,
            &[
                &self.client.0.to_le_bytes(),
                &self.request_id.0.to_le_bytes(),
                &self.body.operation_digest().0,
            ],
        )
    }
}

/// One request in an AUTH-REQ: the entry and the sending authentication member's matrix row for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AuthItem {
    /// The entry (inline body if small, else digest).
    pub entry: RequestEntry,
    /// The sender's row over `entry.digest()`.
    pub row: MatrixRow,
}

/// What a client signs for an ordered request (`knobs.client_signatures`): its id, the
/// request id and the operation.
pub fn client_request_digest(client: ClientId, request_id: RequestId, operation: &[u8]) -> Digest {
    Digest::of_parts(
        "upright client request",
        &[&client.0.to_le_bytes(), &request_id.0.to_le_bytes(), operation],
    )
}

/// A request entry with the matrix signature that makes it one-step transferable.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SignedEntry {
    /// The entry.
    pub entry: RequestEntry,
    /// Rows from authentication members over `entry.digest()`.
    pub matrix: MatrixSignature,
}

/// A batch proposed by the primary: agreed time and requests.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Batch {
    /// Agreed time of the batch in microseconds; strictly increasing across non-empty batches.
    pub time_us: u64,
    /// The requests, with their matrix signatures. Empty for a null batch (view change gaps).
    pub entries: Vec<SignedEntry>,
}

/// Digest of a batch: its time and the digests of its entries (matrix signatures excluded, so a
/// batch re-proposed in a later view with other rows is the same batch).
pub fn batch_digest(time_us: u64, entries: impl Iterator<Item = Digest>) -> Digest {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"upright batch v1");
    hasher.update(&time_us.to_le_bytes());
    for digest in entries {
        hasher.update(&digest.0);
    }
    Digest(*hasher.finalize().as_bytes())
}

impl Batch {
    /// See [`batch_digest`].
    pub fn digest(&self) -> Digest {
        batch_digest(self.time_us, self.entries.iter().map(|e| e.entry.digest()))
    }
}

/// History digest chain: `H_n = hash(H_{n-1}, batch digest of n)` (thesis 5.x). `H_0` is zero.
pub fn history_digest(previous: &Digest, batch: &Digest) -> Digest {
    Digest::of_parts("upright history v1", &[&previous.0, &batch.0])
}

/// The random seed of a batch, derived from its history digest (DESIGN: derived, not chosen, so a
/// faulty primary cannot pick it).
pub fn batch_seed(history: &Digest) -> [u8; 32] {
    Digest::of_parts("upright seed v1", &[&history.0]).0
}

/// The order stage's checkpoint at sequence number `seqno`: what a member needs to continue
/// ordering from there.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OrderCheckpoint {
    /// Last batch covered.
    pub seqno: SeqNo,
    /// History digest `H_seqno`.
    pub history: Digest,
    /// Time of the last non-empty batch up to `seqno`.
    pub time_us: u64,
    /// Digest of the execution checkpoint at `seqno` (from `checkpoint_token` matching CP-TOKENs).
    pub exec_state: Digest,
    /// Last ordered request id of each client, sorted by client (for OS3 well-formedness).
    pub last_ordered: Vec<(ClientId, RequestId)>,
    /// A reconfiguration ordered at or before `seqno` and not yet in effect (or, at a new
    /// epoch's first checkpoint, the one that made the epoch): [`crate::reconfig`].
    pub reconfiguration: Option<Box<crate::reconfig::Pending>>,
}

impl OrderCheckpoint {
    /// Digest of the encoded checkpoint.
    pub fn digest(&self) -> Digest {
        Digest::of_parts("upright order checkpoint v1", &[&crate::codec::to_bytes(self)])
    }
}

/// A value signed by an order member (for messages that must convince a third party).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Signed<T> {
    /// The value.
    pub value: T,
    /// The order member that signed.
    pub signer: ReplicaId,
    /// Ed25519 signature over the digest of the encoded value.
    pub signature: Signature,
}

impl<T: Serialize> Signed<T> {
    /// Signs `value` as order member `signer`.
    pub fn sign(keys: &KeyRing, signer: ReplicaId, value: T) -> Signed<T> {
        let digest = signed_digest(&value, keys.config_epoch());
        Signed {
            signature: keys.sign(&digest),
            signer,
            value,
        }
    }

    /// Checks the signature (as coming from order member `signer`).
    pub fn verify(&self, keys: &KeyRing, sabotage: Option<Sabotage>) -> Result<(), AuthError> {
        if sabotage == Some(Sabotage::SkipMac) {
            return Ok(());
        }
        keys.verify_signature(
            Principal::Order(self.signer),
            &signed_digest(&self.value, keys.config_epoch()),
            &self.signature,
        )
    }
}

/// What an order member signs: the value, and in a reconfigured cluster the configuration epoch
/// (so no signed vote of one configuration counts in another).
fn signed_digest<T: Serialize>(value: &T, config_epoch: u64) -> Digest {
    if config_epoch == 0 {
        Digest::of_parts("upright signed v1", &[&crate::codec::to_bytes(value)])
    } else {
        Digest::of_parts(
            "upright signed in a configuration v1",
            &[&config_epoch.to_le_bytes(), &crate::codec::to_bytes(value)],
        )
    }
}

/// Every message of every stage.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Message {
    // ---- client -> authentication ----
    /// CLIENT-REQ (tag 1 / 16): a client's request. Sealed with an authenticator for the
    /// authentication stage.
    ClientRequest {
        /// Client.
        client: ClientId,
        /// Request number.
        request_id: RequestId,
        /// The operation.
        operation: Bytes,
        /// Read-only request (may be answered without ordering).
        read_only: bool,
        /// The client's Ed25519 signature over [`client_request_digest`] when the cluster asks
        /// for signed requests (`knobs.client_signatures`; ordered requests only).
        signature: Option<Signature>,
        /// The configuration epoch the client knows ([`crate::config::ClusterConfig::epoch`]):
        /// a replica in a later one answers with CONFIGURATION.
        config_epoch: u64,
    },
    // ---- authentication -> order ----
    /// AUTH-REQ (tag 19), batched: for each request the sender accepted since its last flush,
    /// the entry and the sender's row of its matrix signature (at most [`crate::limits::AUTH_ITEMS_MAX`]). Each
    /// row authenticates its own item, so the envelope is sealed with [`Seal::None`].
    AuthRequest {
        /// The requests, each with this authentication member's row.
        items: Vec<AuthItem>,
    },
    // ---- authentication -> execution ----
    /// COMMAND (tag 22): a request body, answering FETCH. MAC.
    Command {
        /// Client.
        client: ClientId,
        /// Request number.
        request_id: RequestId,
        /// The operation.
        operation: Bytes,
    },
    // ---- order <-> order ----
    /// The order stage's own messages: PBFT's agreement, checkpoints, view changes and order
    /// state transfer ([`pbft`]). A second ordering protocol adds its own variant and module;
    /// what every ordering protocol exchanges with execution is the contract below
    /// ([`crate::contract`]).
    Pbft(PbftMessage),
    // ---- order -> execution ----
    /// NEXT-BATCH (tag 13, committed): a committed batch. Authenticator.
    NextBatch {
        /// View in which it committed.
        view: View,
        /// Sequence number.
        seqno: SeqNo,
        /// History digest `H_seqno`.
        history: Digest,
        /// Agreed time.
        time_us: u64,
        /// The requests (no matrix signatures: execution trusts `next_batch` matching copies).
        entries: Vec<RequestEntry>,
    },
    /// LOAD-CP (tag 5): the execution member is behind the order stage's log; load the
    /// checkpoint with this digest (fetched from execution peers). Authenticator.
    LoadCheckpoint {
        /// Sequence number of the checkpoint.
        seqno: SeqNo,
        /// Digest of the execution checkpoint.
        exec_state: Digest,
    },
    /// RETRANSMIT (tag 4): an already ordered request was retransmitted by its client; resend
    /// the cached reply. MAC.
    Retransmit {
        /// Client.
        client: ClientId,
        /// Request number.
        request_id: RequestId,
    },
    // ---- execution -> order ----
    /// CP-TOKEN (tag 7): digest of the execution checkpoint at `seqno`. Authenticator.
    CheckpointToken {
        /// Sequence number.
        seqno: SeqNo,
        /// Digest of the execution checkpoint.
        exec_state: Digest,
    },
    /// LAST-EXEC (tag 6): the last batch this execution member executed; the order member
    /// answers with the committed batches after it or with LOAD-CP. MAC.
    LastExecuted {
        /// Sequence number.
        seqno: SeqNo,
    },
    // ---- execution -> authentication ----
    /// BATCH-COMPLETE (tag 20): these requests were ordered in batch `seqno` (or before it). Sent
    /// only to the co-located authentication member, by `Exec(i)` after executing the batch and by
    /// `Order(i)` when it commits it (and with every client's last ordered request at start and
    /// after a state transfer). MAC.
    BatchComplete {
        /// Sequence number.
        seqno: SeqNo,
        /// The ordered requests.
        requests: Vec<(ClientId, RequestId)>,
    },
    /// FETCH (tag 21): asks for the body of an ordered request. Authenticator.
    Fetch {
        /// Client.
        client: ClientId,
        /// Request number.
        request_id: RequestId,
        /// Digest of the operation.
        operation_digest: Digest,
    },
    // ---- execution -> client ----
    /// REPLY (tag 8 / 17). MAC.
    Reply {
        /// Request number being answered.
        request_id: RequestId,
        /// The result, or its digest (all but the designated replier send a digest).
        result: ReplyBody,
        /// Answer on the read-only path (not ordered).
        read_only: bool,
        /// Pushes the member has sent this client so far (a hint, not matched: a client that has
        /// had fewer asks for the rest, so a push whose every copy was lost is not lost for
        /// good).
        pushes_sent: u64,
    },
    // ---- any process <-> any process (key refresh) ----
    /// NEW-KEY (`crate::session`): the sender's next receive epoch, signed with its long-term
    /// key; sealed with nothing (the signature covers the sender's process). `hello`: the sender
    /// (re)started and asks for the recipient's current NEW-KEY in return.
    NewKey {
        /// The announcement.
        key: crate::crypto::NewKey,
        /// Whether the recipient should answer with its own announcement.
        hello: bool,
    },
    // ---- execution <-> execution (state transfer) ----
    /// Asks for part of the execution checkpoint `state_digest` at `seqno`. MAC.
    FetchState {
        /// Sequence number.
        seqno: SeqNo,
        /// Digest of the execution checkpoint.
        state_digest: Digest,
        /// `None` for the manifest, `Some(i)` for chunk `i`.
        chunk: Option<u32>,
    },
    /// The manifest of a checkpoint: its total size and the digest of every chunk. The
    /// checkpoint digest is computed from these, so the manifest verifies on its own. MAC.
    StateManifest {
        /// Sequence number.
        seqno: SeqNo,
        /// Total bytes.
        total_bytes: u64,
        /// Digest of each chunk.
        chunk_digests: Vec<Digest>,
    },
    /// One chunk of a checkpoint (verified against the manifest). MAC.
    StateChunk {
        /// Sequence number.
        seqno: SeqNo,
        /// Digest of the execution checkpoint.
        state_digest: Digest,
        /// Chunk index.
        index: u32,
        /// The bytes.
        data: Bytes,
    },
    // ---- client -> execution (read-only path) ----
    /// READ-ONLY request (PROTOCOL.md "Read-only path"): executed at once by every execution member
    /// on its current state, never ordered; answered with a [`Message::Reply`] flagged `read_only`.
    /// Sealed with an authenticator for the execution stage. A kind of its own (not a
    /// `ClientRequest`), so the authentication and order stages never take it for an ordered request.
    ReadOnlyRequest {
        /// Client.
        client: ClientId,
        /// Read-only nonce, strictly increasing per client; unrelated to the ordered request ids
        /// (the reply echoes it as its `request_id`).
        request_id: RequestId,
        /// The operation.
        operation: Bytes,
    },
    // ---- execution <-> client (pushed messages, PROTOCOL.md "Pushed messages") ----
    /// PUSH: the `seq`-th message the service pushed to the receiving client (numbered from 1 per
    /// client). MAC.
    Push {
        /// Its stream: `None` for the client's own (every push without selective execution),
        /// `Some(object)` for the client's stream of pushes on that object under selective
        /// execution (docs/ODRC.md, "Per-object push streams"), numbered on its own.
        stream: Option<Bytes>,
        /// Its number among the pushes of its stream to this client.
        seq: u64,
        /// What the service pushed (at most [`crate::limits::PUSH_BYTES_MAX`] bytes).
        payload: Bytes,
    },
    /// PUSH-RESUME: the client asks for its pushes from `next` on (it missed some). Sealed with an
    /// authenticator for the execution stage.
    PushResume {
        /// The client.
        client: ClientId,
        /// The first push of its own stream it has not received.
        next: u64,
        /// The object streams it follows, each with the first push it has not received (at most
        /// [`crate::limits::PUSH_STREAMS_MAX`]).
        streams: Vec<(Bytes, u64)>,
    },
    /// PUSH-GAP: the pushes to the receiving client from `next` up to `resume_at` (excluded) are
    /// no longer kept; the next one kept is `resume_at`. MAC.
    PushGap {
        /// The stream (as in PUSH).
        stream: Option<Bytes>,
        /// The first push the client asked for.
        next: u64,
        /// The oldest push still kept (or the next to be emitted, if none is kept).
        resume_at: u64,
    },
    // ---- order -> co-located authentication ----
    /// PRIMARY-HINT: the order member's view, so its co-located authentication member sends new
    /// AUTH-REQs to that view's primary at once and to the other order members only if still
    /// pending later. Sent when the view is installed or left, only to `Auth(i)` from `Order(i)`
    /// (one process). MAC.
    PrimaryHint {
        /// The current view.
        view: View,
        /// Whether the view is installed (`false`: a view change is running, the primary is not
        /// known).
        installed: bool,
    },
    // ---- execution <-> execution (paged state transfer) ----
    /// Asks a peer for parts of the paged state of the execution checkpoint `state_digest` at
    /// `seqno` (docs/PROTOCOL.md, "Paged state"): the children of tree nodes and page contents,
    /// at most [`crate::limits::PAGE_ITEMS_PER_FETCH`] of each. MAC.
    FetchPages {
        /// Sequence number.
        seqno: SeqNo,
        /// Digest of the execution checkpoint.
        state_digest: Digest,
        /// Tree nodes `(level, index)` whose children are wanted.
        nodes: Vec<(u32, u64)>,
        /// Pages wanted.
        pages: Vec<u64>,
    },
    /// The answer to FETCH-PAGES, each item verified by the receiver against the certified tree.
    /// MAC.
    PageAnswer {
        /// Sequence number.
        seqno: SeqNo,
        /// Digest of the execution checkpoint.
        state_digest: Digest,
        /// Each node asked for with its children's digests.
        nodes: Vec<((u32, u64), Vec<Digest>)>,
        /// Each page asked for with its contents.
        pages: Vec<(u64, Bytes)>,
    },
    // ---- execution <-> execution (selective execution, docs/ODRC.md) ----
    /// OBJECT-CP (ODRC's object checkpoint, sent at each checkpoint `seqno` under selective
    /// execution): the state at `seqno` of the objects the sender maintains that requests
    /// touched since the previous checkpoint, and the digests of its replies to those requests.
    /// A member that skipped requests takes an object's state, and a request's reply digest,
    /// on `r + 1` matching copies. With `ask` the sender has not yet certified everything it
    /// needs for `seqno` and asks the others to send theirs again. MAC.
    ObjectCheckpoint {
        /// The checkpoint.
        seqno: SeqNo,
        /// Each object touched since the previous checkpoint that the sender maintains, with its
        /// state (`None`: absent).
        objects: Vec<(Bytes, Option<Bytes>)>,
        /// `(client, request id, reply)` of each client's newest request that the sender
        /// executed since the previous checkpoint because it maintains one of its objects.
        replies: Vec<(ClientId, RequestId, Bytes)>,
        /// The push streams of those of `objects` that have any: per client, the stream's next
        /// number and kept pushes (part of the object's state: copies match when both match).
        streams: Vec<(Bytes, Vec<(ClientId, PushStream)>)>,
        /// Whether the sender still waits for copies of this checkpoint.
        ask: bool,
    },
    // ---- execution -> order (continued) ----
    /// WAKE-AT (not in the papers): after executing batch `seqno`, the service asks to be woken at agreed
    /// time `at_us` (`None`: it waits for nothing). An idle primary orders an empty batch at that
    /// time instead of waiting for the next heartbeat. MAC.
    WakeAt {
        /// The last batch the sender executed.
        seqno: SeqNo,
        /// The service's `wake_at` after it.
        at_us: Option<u64>,
    },
    // ---- authentication -> client (reconfiguration) ----
    /// CONFIGURATION: the change that made the sender's configuration, to a client whose request
    /// named an earlier epoch. MAC. A client adopts it on `r + 1` matching copies from replicas
    /// of the configuration it knows ([`crate::reconfig`]).
    Configuration {
        /// The administrator's signed change.
        change: Box<crate::reconfig::SignedReconfiguration>,
    },
    // ---- order <-> order (LCR) ----
    /// LCR's messages among order members ([`lcr`]), when the cluster runs `protocol = "lcr"`.
    Lcr(lcr::LcrMessage),
    // ---- tentative execution (PBFT thesis 5.1.3; docs/PROTOCOL.md "Tentative execution") ----
    /// TENTATIVE-BATCH: a batch this order member has prepared in `view` while every batch
    /// before it is committed; execute it tentatively. Only from the co-located order member
    /// (one process), never across the network. Authenticator.
    TentativeBatch {
        /// View in which it prepared.
        view: View,
        /// Sequence number.
        seqno: SeqNo,
        /// History digest `H_seqno` it would have once committed.
        history: Digest,
        /// Agreed time.
        time_us: u64,
        /// The requests.
        entries: Vec<RequestEntry>,
    },
    /// TENTATIVE-REPLY: the result of a tentatively executed request: batch `history` prepared
    /// in `view` at the sender's order member. A client accepts `q.tentative_reply()` matching
    /// ones (same result digest, view and history). MAC.
    TentativeReply {
        /// Request number being answered.
        request_id: RequestId,
        /// The result, or its digest.
        result: ReplyBody,
        /// View in which the batch prepared.
        view: View,
        /// History digest of the batch.
        history: Digest,
        /// Pushes the member has sent this client so far (as in REPLY).
        pushes_sent: u64,
    },
}

/// One client's pushes in one stream at an execution member: the next number, and the newest
/// pushes kept for a client that missed some.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PushStream {
    /// Number of the next push (the first is 1).
    pub next_seq: u64,
    /// The newest pushes, oldest first (at most [`crate::limits::PUSHES_KEPT_PER_CLIENT`] in a
    /// client's own stream, [`crate::limits::PUSHES_KEPT_PER_STREAM`] in an object's).
    pub kept: std::collections::VecDeque<(u64, Bytes)>,
}

impl PushStream {
    /// Bytes its kept pushes count for in an OBJECT-CP's bound (payload and number).
    pub fn bytes(&self) -> usize {
        self.kept.iter().map(|(_, payload)| payload.len() + 8).sum()
    }
}

/// Under selective execution, an ordered reply's result as sent, cached and certified: the
/// service's `result` behind the positions of the push streams the request announced to its
/// client ([`crate::service::Effects::announce_stream`]; each the number the stream's next push
/// gets), so a client takes them on the same `r + 1` matching copies as the result. Tag 0 and the
/// result when there are none.
pub fn wrap_announced(result: &Bytes, streams: &[(Bytes, u64)]) -> Bytes {
    if streams.is_empty() {
        let mut out = Vec::with_capacity(1 + result.len());
        out.push(0);
        out.extend_from_slice(result);
        return Bytes::from(out);
    }
    let mut out = vec![1];
    out.extend_from_slice(&crate::codec::to_bytes(&(streams, result)));
    Bytes::from(out)
}

/// The stream positions and the service's result of a reply [`wrap_announced`] made (`None`:
/// not such a reply).
pub fn unwrap_announced(reply: &Bytes) -> Option<(Vec<(Bytes, u64)>, Bytes)> {
    match reply.first()? {
        0 => Some((Vec::new(), reply.slice(1..))),
        1 => crate::codec::from_bytes(&reply[1..]).ok(),
        _ => None,
    }
}

/// A reply's result, full or as a digest.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReplyBody {
    /// The full result.
    Full(Bytes),
    /// Its digest.
    Digest(Digest),
}

impl ReplyBody {
    /// Digest of the result.
    pub fn result_digest(&self) -> Digest {
        match self {
            ReplyBody::Full(bytes) => Digest::of(bytes),
            ReplyBody::Digest(d) => *d,
        }
    }
}

/// Digest of an execution checkpoint from its manifest: the checkpoint identity used in CP-TOKEN,
/// LOAD-CP and state transfer.
pub fn state_digest(seqno: SeqNo, total_bytes: u64, chunk_digests: &[Digest]) -> Digest {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"upright exec state v1");
    hasher.update(&seqno.0.to_le_bytes());
    hasher.update(&total_bytes.to_le_bytes());
    for d in chunk_digests {
        hasher.update(&d.0);
    }
    Digest(*hasher.finalize().as_bytes())
}

/// How an envelope is authenticated.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Seal {
    /// Not sealed: the message authenticates itself (AUTH-REQ rows, signed control messages).
    None,
    /// A MAC for the single recipient.
    Mac(Mac),
    /// A MAC authenticator for every member of one stage, indexed by member.
    Authenticator(Authenticator),
}

/// A message with its sender and authentication.
///
/// Besides its three fields an envelope may remember what this process already computed about its
/// encoding (see [`Envelope::seal`] and [`crate::wire::decode`]), so that a message is serialized
/// once when sent and its seal digest is computed once when received. That memory is not part of
/// the envelope's value: `==`, `Hash`, `Debug` and serde ignore it, and `clone()` drops it (a copy
/// that is then changed never carries the encoding of the original). Construct envelopes with
/// [`Envelope::new`] or [`Envelope::seal`], and change a sealed envelope only through a clone.
#[derive(PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Envelope {
    /// Claimed sender (checked by the seal).
    pub from: Principal,
    /// The message.
    pub message: Message,
    /// Its authentication.
    pub seal: Seal,
    #[serde(skip)]
    encoding: Encoding,
}

impl Clone for Envelope {
    fn clone(&self) -> Envelope {
        Envelope::new(self.from, self.message.clone(), self.seal.clone())
    }
}

impl std::fmt::Debug for Envelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envelope")
            .field("from", &self.from)
            .field("message", &self.message)
            .field("seal", &self.seal)
            .finish()
    }
}

/// Who may trust a remembered seal digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Trust {
    /// Computed by [`crate::wire::decode`] from the received bytes the envelope was decoded from:
    /// the process that decoded it (the only one that ever holds it: decoded envelopes are handed to
    /// the decoding process's own stages and never sent on as values).
    Received,
    /// Computed by [`Envelope::seal`] in this process from the bytes it encoded: trusted only there
    /// (a local delivery between co-located stages). Another process re-encodes (the simulator
    /// passes envelope values between processes).
    SealedBy(Process),
}

/// What this process computed about an envelope's encoding (see [`Envelope`]).
#[derive(Default)]
struct Encoding {
    /// The postcard encoding of `(from, message)` that [`Envelope::seal`] hashed: the first part of
    /// the envelope's wire encoding, reused by [`crate::wire::encode`].
    prefix: Option<Vec<u8>>,
    /// [`Envelope::auth_digest`] of `(from, message)` and who may trust it.
    digest: Option<(Trust, Digest)>,
}

impl PartialEq for Encoding {
    fn eq(&self, _: &Encoding) -> bool {
        true
    }
}

impl Eq for Encoding {}

impl std::hash::Hash for Encoding {
    fn hash<H: std::hash::Hasher>(&self, _: &mut H) {}
}

/// How to seal an outgoing message.
#[derive(Clone, Copy, Debug)]
pub enum SealFor {
    /// Nothing (self-authenticating messages).
    Nothing,
    /// MAC for one recipient.
    One(Principal),
    /// Authenticator for every member of a stage.
    Stage(StageKind),
}

/// Why an incoming envelope was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// The seal does not verify.
    Auth(AuthError),
    /// The message kind is not sealed the way it must be, or not meant for this stage.
    WrongSeal,
    /// The sender is not a principal allowed to send this message.
    WrongSender,
}

impl Envelope {
    /// An envelope with nothing remembered about its encoding.
    pub fn new(from: Principal, message: Message, seal: Seal) -> Envelope {
        Envelope {
            from,
            message,
            seal,
            encoding: Encoding::default(),
        }
    }

    /// Digest the seal covers: the encoded sender and message.
    pub fn auth_digest(from: Principal, message: &Message) -> Digest {
        Self::prefix_digest(&crate::codec::to_bytes(&(from, message)))
    }

    /// [`Envelope::auth_digest`] from the encoding of `(from, message)` (which is the start of the
    /// envelope's own encoding: postcard writes a struct's fields in order, with nothing between).
    pub(crate) fn prefix_digest(prefix: &[u8]) -> Digest {
        Digest::of_parts("upright envelope v1", &[prefix])
    }

    /// An envelope decoded from received bytes, remembering the digest of the received encoding of
    /// its `from` and `message` (only [`crate::wire::decode`] calls this, with those bytes).
    pub(crate) fn received(from: Principal, message: Message, seal: Seal, prefix: &[u8]) -> Envelope {
        let digest = match seal {
            Seal::None => None,
            Seal::Mac(_) | Seal::Authenticator(_) => Some((Trust::Received, Self::prefix_digest(prefix))),
        };
        Envelope {
            from,
            message,
            seal,
            encoding: Encoding { prefix: None, digest },
        }
    }

    /// The encoding of `(from, message)` that [`Envelope::seal`] hashed, if it sealed this envelope.
    pub(crate) fn encoded_prefix(&self) -> Option<&[u8]> {
        let prefix = self.encoding.prefix.as_deref()?;
        debug_assert!(
            prefix == crate::codec::to_bytes(&(self.from, &self.message)),
            "a sealed envelope was changed in place; change a clone"
        );
        Some(prefix)
    }

    /// The digest the seal covers, as `me` may trust it: remembered if this process computed it
    /// from bytes it received or sealed, else computed again from the fields.
    fn digest_for(&self, me: Process) -> Digest {
        match self.encoding.digest {
            Some((trust, digest)) if trust == Trust::Received || trust == Trust::SealedBy(me) => {
                debug_assert!(
                    digest == Self::auth_digest(self.from, &self.message),
                    "an envelope was changed in place after its digest was computed; change a clone"
                );
                digest
            }
            _ => Self::auth_digest(self.from, &self.message),
        }
    }

    /// Builds and seals an envelope from `from`. A MAC or authenticator seal remembers the encoding
    /// it hashed, for the wire encoding and for opening by a co-located stage.
    pub fn seal(keys: &KeyRing, quorums: &Quorums, from: Principal, message: Message, seal_for: SealFor) -> Envelope {
        use crate::config::ClusterConfig;
        let prefix = match seal_for {
            SealFor::Nothing => return Envelope::new(from, message, Seal::None),
            SealFor::One(_) | SealFor::Stage(_) => crate::codec::to_bytes(&(from, &message)),
        };
        let digest = Self::prefix_digest(&prefix);
        let seal = match seal_for {
            SealFor::Nothing => Seal::None,
            SealFor::One(to) => Seal::Mac(keys.mac_for(to, &digest)),
            SealFor::Stage(StageKind::Auth) => {
                Seal::Authenticator(keys.authenticator(ClusterConfig::auth_members(quorums), &digest))
            }
            SealFor::Stage(StageKind::Order) => {
                Seal::Authenticator(keys.authenticator(ClusterConfig::order_members(quorums), &digest))
            }
            SealFor::Stage(StageKind::Exec) => {
                Seal::Authenticator(keys.authenticator(ClusterConfig::exec_members(quorums), &digest))
            }
        };
        Envelope {
            from,
            message,
            seal,
            encoding: Encoding {
                prefix: Some(prefix),
                digest: Some((Trust::SealedBy(keys.me()), digest)),
            },
        }
    }

    /// Sealed for `to` with the long-term pairwise key (not a session key): CONFIGURATION, which
    /// must verify whatever either side's session keys are (a replica that just started in a
    /// new configuration, maybe under another id, shares none yet with a client behind it).
    pub fn seal_static(keys: &KeyRing, from: Principal, message: Message, to: Principal) -> Envelope {
        let digest = Self::auth_digest(from, &message);
        Envelope::new(from, message, Seal::Mac(keys.static_mac_for(to, &digest)))
    }

    /// Checks a seal of [`Envelope::seal_static`].
    pub fn open_static(&self, keys: &KeyRing, sabotage: Option<Sabotage>) -> Result<(), Rejection> {
        if sabotage == Some(Sabotage::SkipMac) {
            return Ok(());
        }
        match &self.seal {
            Seal::Mac(mac) => keys
                .verify_static_mac(self.from, &self.digest_for(keys.me()), mac)
                .map_err(Rejection::Auth),
            _ => Err(Rejection::WrongSeal),
        }
    }

    /// Checks the seal as received by `me`. Self-authenticating messages (sealed with
    /// [`Seal::None`]) must be checked by the stage itself (matrix rows, signatures).
    pub fn open(&self, keys: &KeyRing, me: Principal, sabotage: Option<Sabotage>) -> Result<(), Rejection> {
        if sabotage == Some(Sabotage::SkipMac) {
            return Ok(());
        }
        match &self.seal {
            Seal::None => match self.message {
                Message::AuthRequest { .. } => Ok(()),
                Message::Pbft(ref pbft) if pbft.self_authenticating() => Ok(()),
                _ => Err(Rejection::WrongSeal),
            },
            Seal::Mac(mac) => keys
                .verify_mac(self.from, &self.digest_for(keys.me()), mac)
                .map_err(Rejection::Auth),
            Seal::Authenticator(authenticator) => {
                let index = match me {
                    Principal::Client(_) => return Err(Rejection::WrongSeal),
                    Principal::Auth(r) | Principal::Order(r) | Principal::Exec(r) => r.0 as usize,
                };
                keys.verify_authenticator(self.from, index, &self.digest_for(keys.me()), authenticator)
                    .map_err(Rejection::Auth)
            }
        }
    }
}

#[cfg(test)]
mod tests;
