//! Cluster configuration: fault model, members and their public keys, protocol knobs.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::ids::{ClientId, Principal, ReplicaId};
use crate::quorum::{FaultModelError, Quorums};

/// A principal's long-term public keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PublicKeys {
    /// X25519 public key, used to derive pairwise MAC keys.
    pub x25519: [u8; 32],
    /// Ed25519 verifying key, used for signed control messages.
    pub ed25519: [u8; 32],
}

/// A replica of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    /// Its index; must equal its position in [`ClusterConfig::replicas`].
    pub id: ReplicaId,
    /// Its public keys.
    pub keys: PublicKeys,
}

/// An authorised client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientInfo {
    /// Its id (unique).
    pub id: ClientId,
    /// Its public keys.
    pub keys: PublicKeys,
}

/// A deliberately broken protocol, so anyone can see the checkers catch real bugs.
/// Never set outside the simulator's `--sabotage` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Sabotage {
    /// Order members prepare and commit with one vote fewer than the medium quorum.
    ShortQuorum,
    /// Every stage accepts messages without checking their MACs, authenticators or signatures.
    SkipMac,
    /// Order members release a batch to execution as soon as they accept its PRE-PREPARE.
    EarlyExecute,
    /// LCR members decide a broadcast as soon as they receive it: before it is stable, and in
    /// the order it arrived instead of LCR's total order.
    UnstableDelivery,
    /// Clients accept a read-only result on `r + 1` matching replies instead of
    /// [`Quorums::read_only`] (`n_exec`): a lagging execution member can then serve a stale read.
    WeakReadQuorum,
    /// Clients accept a serializable read on one answer instead of [`Quorums::reply`] (`r + 1`):
    /// a Byzantine execution member can then answer with a value nobody wrote.
    WeakSerializableQuorum,
    /// Clients accept a pushed message (or a push gap) on one copy instead of [`Quorums::push`]
    /// (`r + 1`): a Byzantine execution member can then push forged messages.
    WeakPushQuorum,
    /// Execution members install pages fetched during a state transfer without checking them
    /// against the certified tree: a Byzantine peer can then plant a state nobody executed.
    UncheckedPages,
    /// Order members count the primary's vote once for each distinct PRE-PREPARE they received
    /// from it for a slot in the view, instead of once: a faulty primary that proposes twice is
    /// counted twice.
    CountProposalsTwice,
    /// A recovering execution member keeps trusting its stored state (proactive recovery without
    /// the state check): a state an attacker rewrote consistently with its own digests is then
    /// executed on.
    SkipRecoveryCheck,
    /// Key rings keep the previous epoch's keys after retiring them: messages under retired
    /// keys (replayed, or from a sender that missed a NEW-KEY) are then accepted.
    KeepRetiredKeys,
    /// Replicas' MAC keys and signatures do not bind the configuration epoch: what a replica
    /// sealed in one configuration is accepted in another.
    SharedConfigurationKeys,
    /// Clients accept `q.reply()` (`r + 1`) matching tentative replies instead of
    /// `q.tentative_reply()`: a batch prepared at too few order members, which a view change may
    /// replace, is then reported done.
    TentativeSmallQuorum,
    /// Execution members do not roll a tentatively executed batch back when a different batch
    /// commits at its sequence number: they go on from a state no agreed history made.
    TentativeNoRollback,
    /// `protocol = "quorum"`: the view change leaves the members' speculative claims out (no
    /// abort history), so a batch a client committed in a Quorum phase may be replaced.
    QuorumDropSpeculative,
    /// `protocol = "chain"`: a member accepts a batch from its chain predecessor without the
    /// votes of the rest of its predecessor set, so one faulty member can hand its successors a
    /// batch the members before it never accepted.
    ChainSkipCheck,
    /// Clients accept an ordered reply on `r` matching copies instead of [`Quorums::reply`]
    /// (`r + 1`): under selective execution, where only an object's `r + 1` maintainers answer,
    /// a Byzantine maintainer's reply alone is then accepted.
    WeakReplyQuorum,
    /// Selective execution: members install an object's state from one maintainer's OBJECT-CP
    /// and a skipped reply's digest from one copy, instead of `r + 1` matching: a Byzantine
    /// maintainer can then plant a state nobody executed.
    SingleObjectCopy,
    /// Separate stages: an execution member accepts a NEXT-BATCH from the order member of its
    /// own index alone, as if the two shared a process (the co-located shortcut kept where it
    /// does not hold): one Byzantine order member can then have it execute a batch that was
    /// never agreed.
    SeparateNextBatch,
    /// Selective execution: a member installing an object from OBJECT-CP keeps its own stale
    /// push streams of the object instead of the certified ones, so it numbers the object's
    /// next pushes from where it stopped running the object's requests.
    StaleStreams,
    /// Selective execution: a client delivers a reply at once even when pushes before it of a
    /// stream its request announced have not come: a watcher can see a key's new value before
    /// the watch event of the write that made it.
    UnheldReplies,
}

/// Protocol knobs. Times are in microseconds of the host's monotonic clock unless named `_ms`.
/// A knob missing from a configuration file takes its default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Knobs {
    /// Most requests in one batch.
    pub batch_size_max: usize,
    /// How long the primary waits to fill a batch before closing it, while it has room in the
    /// pipeline; 0 closes a batch as soon as one request is ready.
    pub batch_delay_us: u64,
    /// Most batches the primary has pre-prepared but not yet committed.
    pub pipeline_window: u64,
    /// `CP_INTERVAL`: the execution stage checkpoints every this many batches.
    pub checkpoint_interval: u64,
    /// Log window `L`: the order stage accepts sequence numbers `h < n <= h + L`, where `h` is
    /// the last stable checkpoint. Must be `2 * checkpoint_interval` (the stage interlock).
    pub log_window: u64,
    /// Requests whose operation is at most this many bytes travel inline through the order stage;
    /// larger ones are ordered by digest and fetched from the authentication stage.
    pub inline_request_bytes_max: usize,
    /// Largest operation a client may send.
    pub request_bytes_max: usize,
    /// Largest reply the service may return.
    pub reply_bytes_max: usize,
    /// First client retransmission timeout (UpRight: 500 ms).
    pub client_retransmit_initial_us: u64,
    /// Cap of the doubling client retransmission timeout (UpRight: 4 s).
    pub client_retransmit_max_us: u64,
    /// View-change timeout of the first view change; doubles for each consecutive one.
    pub view_change_timeout_us: u64,
    /// Largest allowed difference between the primary's proposed batch time and a backup's clock
    /// (in the future direction); a batch further ahead is refused.
    pub batch_time_skew_us_max: u64,
    /// Execution members resend LAST-EXEC / retry fetches after this long without progress.
    pub exec_retry_us: u64,
    /// Authentication members forward a retransmitted request at most once per this interval
    /// (UpRight: 4 s).
    pub auth_retransmit_interval_us: u64,
    /// Size of one state-transfer chunk.
    pub state_chunk_bytes: usize,
    /// Read-only path: how long a client waits for [`Quorums::read_only`] matching read-only
    /// replies before it falls back to the ordered path for the same operation.
    #[serde(default = "default_read_only_timeout_us")]
    pub read_only_timeout_us: u64,
    /// An idle primary orders an empty batch (a heartbeat) once this long has passed since the
    /// last batch's agreed time, checked every `view_change_timeout_us / 4`, so agreed time
    /// keeps moving and services are woken at the times they asked for ([`crate::service`]).
    /// Backups refuse an empty batch less than half of it after the previous batch. 0: no
    /// heartbeats (an idle cluster's agreed time stands still).
    #[serde(default = "default_heartbeat_interval_us")]
    pub heartbeat_interval_us: u64,
    /// Backups watch the primary beyond PBFT's view-change timer (Aardvark,
    /// `crates/core/src/order/monitor.rs`): a request ready at a backup may wait at most
    /// `view_change_timeout_us / 5` for the primary to order it, and a primary whose throughput
    /// falls below the recent views' best while requests wait is replaced. Off only to measure
    /// what the defences are worth (`upright bench --attack`, `upright-sim --attack`).
    #[serde(default = "default_true")]
    pub watch_primary: bool,
    /// Clients sign their ordered requests (Ed25519) and authentication members check the
    /// signature after the MAC, once per new request; a client whose request has a good MAC but
    /// a bad or missing signature, or that sends two operations under one request id, is
    /// ignored for a growing period (Aardvark's blacklist; `crates/core/src/auth/clients.rs`).
    /// Costs a signature per request at the client and a verification at each authentication
    /// member it reaches.
    pub client_signatures: bool,
    /// The runtime cuts off a peer replica whose messages keep failing checks that prove it
    /// faulty (bad seals, conflicting votes) for a growing period (`crates/node/src/cutoff.rs`).
    /// Off only to measure what it is worth (`upright bench --attack flood-peers --defences off`).
    #[serde(default = "default_true")]
    pub peer_cut_off: bool,
    /// Key refresh (`crate::session`, PBFT's `T_k`): every process starts a new receive epoch
    /// this often, sending a signed NEW-KEY to its peers. 0: never (the long-term pairwise keys
    /// stay in use).
    #[serde(default)]
    pub key_refresh_us: u64,
    /// How long after a refresh the previous epoch's keys are still accepted (messages a peer
    /// sealed before it had the NEW-KEY); refused after it.
    #[serde(default = "default_key_overlap_us")]
    pub key_overlap_us: u64,
    /// Tentative execution (PBFT thesis 5.1.3; docs/PROTOCOL.md "Tentative execution"): an
    /// order member hands a batch of at most this many requests to its co-located execution
    /// member once prepared, before it commits, and clients accept `q.tentative_reply()`
    /// matching tentative replies; one message delay less per request while load is light.
    /// Larger batches (heavy load, where latency is queueing) take the committed path only.
    /// 0 (the default): off.
    #[serde(default = "default_tentative_entries_max")]
    pub tentative_entries_max: usize,
    /// `protocol = "quorum"` or `"chain"` (Aliph's Quorum or Chain over PBFT; docs/PROTOCOL.md
    /// "Quorum", "Chain"): the batches each view orders through the three-phase path (Aliph's
    /// Backup) after its NEW-VIEW before its members switch to the fast phase, when the Quorum phase before went well (doubled, up to
    /// `QUORUM_BACKUP_BATCHES_MAX`, after each that committed fewer; an empty batch ends the
    /// phase early when nothing waits). At least 1.
    #[serde(default = "default_quorum_backup_batches")]
    pub quorum_backup_batches: u64,
    /// `protocol = "quorum"`: how long a member waits for every order member's vote on the batch
    /// it executed speculatively before it aborts the Quorum phase (moves to the next view, whose
    /// Backup phase orders what was pending).
    #[serde(default = "default_quorum_commit_timeout_us")]
    pub quorum_commit_timeout_us: u64,
    /// `protocol = "aliph"`: a view's Chain phase ends (back to Quorum) once at most one client
    /// has had a request accepted in it for this long (Aliph's 2 s; docs/PROTOCOL.md "Aliph").
    #[serde(default = "default_aliph_one_client_us")]
    pub aliph_one_client_us: u64,
    /// Testing only: a deliberately broken protocol (see [`Sabotage`]).
    pub sabotage: Option<Sabotage>,
}

/// Default of [`Knobs::tentative_entries_max`]: off. Measured on this 2-core machine (session
/// 37, docs/PERFORMANCE.md) at u = r = 1 it made one client slower, not faster (p50 0.41 ->
/// 0.54 ms with fsync, 0.21 -> 0.25 ms without): at `u = r` the tentative quorum is every
/// execution member, so a request waits for the slowest of them rather than the fastest `r + 1`,
/// and the primary's prepare, sync and COMMIT plus the second round of replies cost CPU the
/// saved message delay does not repay; 16 clients lost 16% of their throughput.
pub const TENTATIVE_ENTRIES_MAX_DEFAULT: usize = 0;

fn default_tentative_entries_max() -> usize {
    TENTATIVE_ENTRIES_MAX_DEFAULT
}

/// Default of [`Knobs::quorum_backup_batches`]: 16 batches of Backup after each abort, about one
/// checkpoint interval's quarter: enough that a client whose request aborted Quorum (contention,
/// a slow member) gets it ordered there, short enough that the fast path soon returns.
pub const QUORUM_BACKUP_BATCHES_DEFAULT: u64 = 16;

fn default_quorum_backup_batches() -> u64 {
    QUORUM_BACKUP_BATCHES_DEFAULT
}

/// Default of [`Knobs::quorum_commit_timeout_us`]: 20 ms, tens of LAN round trips (every vote
/// is one message delay after the speculative execution).
pub const QUORUM_COMMIT_TIMEOUT_US_DEFAULT: u64 = 20_000;

/// Default of [`Knobs::aliph_one_client_us`]: Aliph's two seconds (Quéma 3.5.1.3).
pub const ALIPH_ONE_CLIENT_US_DEFAULT: u64 = 2_000_000;

fn default_aliph_one_client_us() -> u64 {
    ALIPH_ONE_CLIENT_US_DEFAULT
}

fn default_quorum_commit_timeout_us() -> u64 {
    QUORUM_COMMIT_TIMEOUT_US_DEFAULT
}

/// Default of [`Knobs::key_overlap_us`]: 2 s, far above a NEW-KEY's trip to a peer and the
/// time a message sealed before it waits in queues.
pub const KEY_OVERLAP_US_DEFAULT: u64 = 2_000_000;

fn default_key_overlap_us() -> u64 {
    KEY_OVERLAP_US_DEFAULT
}

fn default_true() -> bool {
    true
}

/// Default of [`Knobs::read_only_timeout_us`]: 5 ms (a read-only round trip on a LAN is well under
/// 1 ms; a slower one is cheaper to retry on the ordered path than to wait for).
pub const READ_ONLY_TIMEOUT_US_DEFAULT: u64 = 5_000;

/// Default of [`Knobs::heartbeat_interval_us`]: 500 ms, a wake-up resolution of well under a
/// second (ZooKeeper session timeouts are seconds) for one agreement round and log sync per
/// interval on an idle cluster.
pub const HEARTBEAT_INTERVAL_US_DEFAULT: u64 = 500_000;

fn default_heartbeat_interval_us() -> u64 {
    HEARTBEAT_INTERVAL_US_DEFAULT
}

fn default_read_only_timeout_us() -> u64 {
    READ_ONLY_TIMEOUT_US_DEFAULT
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            // Measured (bench 0/0, 256 clients, fsync always, 2 runs each, same minute): 64:
            // 16,203-16,297 ops/s; 128: 18,012-18,608; 256: 17,592-18,056. Below ~128 clients
            // batches do not fill either way.
            batch_size_max: 128,
            batch_delay_us: 0,
            // Measured (bench 0/0, 16 and 64 clients, fsync always and never, 2 runs each):
            // one batch in flight lets the next batch fill while the current one is agreed on,
            // and beat 2 and 4 on CPU per operation and throughput at every point.
            pipeline_window: 1,
            checkpoint_interval: 64,
            log_window: 128,
            // A request of up to 16 KiB rides inline through the order stage (logged with the
            // batch): by digest it would cost the execution stage a FETCH round trip to an
            // authentication member and that member a body write before forwarding. 16 KiB holds
            // a Redis gateway operation of 16 SETs of values up to ~1,000 bytes. Measured at 16
            // connections (docs/PERFORMANCE.md, session 12): with 100-byte values (2 KiB
            // operations) inline SET ran 15-26% faster than by digest; with 1,000-3,000-byte
            // values (16-48 KiB) the two were even within the noise, one way or the other from
            // run to run; at 4,000 bytes (64 KiB) inline was 15% slower (the primary sends the
            // whole body to every backup).
            inline_request_bytes_max: 16 * 1024,
            request_bytes_max: 1 << 20,
            reply_bytes_max: 1 << 20,
            client_retransmit_initial_us: 500_000,
            client_retransmit_max_us: 4_000_000,
            view_change_timeout_us: 1_000_000,
            batch_time_skew_us_max: 2_000_000,
            exec_retry_us: 200_000,
            auth_retransmit_interval_us: 4_000_000,
            state_chunk_bytes: 64 * 1024,
            read_only_timeout_us: READ_ONLY_TIMEOUT_US_DEFAULT,
            heartbeat_interval_us: HEARTBEAT_INTERVAL_US_DEFAULT,
            watch_primary: true,
            peer_cut_off: true,
            client_signatures: false,
            key_refresh_us: 0,
            key_overlap_us: KEY_OVERLAP_US_DEFAULT,
            tentative_entries_max: TENTATIVE_ENTRIES_MAX_DEFAULT,
            quorum_backup_batches: QUORUM_BACKUP_BATCHES_DEFAULT,
            quorum_commit_timeout_us: QUORUM_COMMIT_TIMEOUT_US_DEFAULT,
            aliph_one_client_us: ALIPH_ONE_CLIENT_US_DEFAULT,
            sabotage: None,
        }
    }
}

/// The whole cluster's configuration, identical at every member and client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    /// A name that distinguishes this cluster from others; mixed into every MAC key, so members
    /// of different clusters never accept each other's messages.
    pub cluster_name: String,
    /// Failures of any kind tolerated while staying live.
    pub u: usize,
    /// Commission failures tolerated while staying safe.
    pub r: usize,
    /// The replicas, indexed by id. Replica `i` hosts authentication and order member `i`, and
    /// execution member `i` if `i < n_exec`.
    pub replicas: Vec<ReplicaInfo>,
    /// The authorised clients.
    pub clients: Vec<ClientInfo>,
    /// Protocol knobs.
    pub knobs: Knobs,
    /// The client whose ordered requests are reconfigurations signed with its key
    /// ([`crate::reconfig`]); none: the membership is fixed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin: Option<ClientId>,
    /// The configuration epoch: 0 as initialised, one more with each reconfiguration.
    #[serde(default)]
    pub epoch: u64,
    /// The encoded signed change that made this configuration (`crate::reconfig`; none for
    /// epoch 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<Vec<u8>>,
    /// The ordering protocol the order members run (`protocol = "pbft" | "backup" | "quorum" | "chain" | "aliph" | "lcr"`).
    #[serde(default, skip_serializing_if = "OrderProtocol::is_default")]
    pub protocol: OrderProtocol,
    /// ODRC's selective execution (docs/ODRC.md): each object's requests run on the `r + 1`
    /// execution members that maintain it; the others bring it up to date at each checkpoint
    /// from their certified object checkpoints. Needs a service with object checkpoints
    /// (`Service::object_state`); not with tentative execution or the Quorum phase.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub selective_execution: bool,
    /// Run the execution members in processes of their own (docs/ODRC.md "Separated stages"):
    /// the first `2u + r + 1` replicas host an authentication and an order member, the next
    /// `n_exec` one execution member each (`upright replica --stages exec`). PBFT only, without
    /// tentative execution or an administrator.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub separate_stages: bool,
    /// With `separate_stages`: failures of any kind the execution stage tolerates while staying
    /// live, at least `u` (default `u`); `n_exec = exec_u + max(exec_u, r) + 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_u: Option<usize>,
}

/// What a view runs after its Backup phase (docs/PROTOCOL.md "Quorum", "Chain", "Aliph").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FastPhase {
    /// Nothing: the three-phase path throughout (PBFT).
    #[default]
    None,
    /// Aliph's Quorum (`order/quorum.rs`).
    Quorum,
    /// Aliph's Chain (`order/chain.rs`).
    Chain,
}

/// The ordering protocol of a cluster's order stage. The execution stage is the same under every
/// one of them ([`crate::contract`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OrderProtocol {
    /// PBFT's three-phase agreement with UpRight's and Aardvark's changes (`crate::order`).
    /// `"backup"` names it too: Aliph's Backup instance is this path.
    #[default]
    #[serde(alias = "backup")]
    Pbft,
    /// LCR, the crash-only ring with vector clocks (Quéma ch. 2; `crate::lcr`): `r = 0` only.
    Lcr,
    /// Aliph's Quorum (Quéma ch. 3) with PBFT as its Backup (`crate::order::quorum`): each view
    /// orders `quorum_backup_batches` batches through the three-phase path, then every member
    /// executes requests speculatively in the order they reach it, and an abort is a view
    /// change. `u = r >= 1`; an execution member on every replica.
    Quorum,
    /// Aliph's Chain (Quéma ch. 3) with PBFT as its Backup (`crate::order::chain`): each view
    /// orders `quorum_backup_batches` batches through the three-phase path, then its primary
    /// (the head) batches requests down a chain of the order members, each accepting a batch
    /// from its predecessor once the `r + 1` members before it vouch for it; the last `r + 1`
    /// commit it. An abort is a view change. `u >= r >= 1`.
    Chain,
    /// Aliph (Quéma ch. 3): views whose fast phase is Quorum or Chain, chosen by each new
    /// primary (Quorum to Chain after a poor Quorum phase, back to Quorum after a Chain phase),
    /// each after a Backup phase. `u = r >= 1`; an execution member on every replica.
    Aliph,
}

impl OrderProtocol {
    /// Whether this is the default (PBFT).
    pub fn is_default(&self) -> bool {
        *self == OrderProtocol::Pbft
    }

    /// Its name in cluster.toml and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            OrderProtocol::Pbft => "pbft",
            OrderProtocol::Lcr => "lcr",
            OrderProtocol::Quorum => "quorum",
            OrderProtocol::Chain => "chain",
            OrderProtocol::Aliph => "aliph",
        }
    }

    /// The stage sizes and quorums for `(u, r)` under this protocol: Quorum runs an execution
    /// member on every replica ([`Quorums::with_exec_on_every_replica`]).
    pub fn quorums(self, u: usize, r: usize) -> Result<Quorums, FaultModelError> {
        let q = Quorums::new(u, r)?;
        Ok(match self {
            OrderProtocol::Quorum | OrderProtocol::Aliph => q.with_exec_on_every_replica(),
            OrderProtocol::Pbft | OrderProtocol::Lcr | OrderProtocol::Chain => q,
        })
    }

    /// Whether each view runs a fast phase after a Backup phase of PBFT batches (Aliph's Quorum
    /// or Chain: `crate::order::quorum`).
    pub fn has_fast_phase(self) -> bool {
        !matches!(self.first_fast_phase(), FastPhase::None)
    }

    /// The fast phase of view 0 (and of every view, except under Aliph).
    pub fn first_fast_phase(self) -> FastPhase {
        match self {
            OrderProtocol::Pbft | OrderProtocol::Lcr => FastPhase::None,
            OrderProtocol::Quorum | OrderProtocol::Aliph => FastPhase::Quorum,
            OrderProtocol::Chain => FastPhase::Chain,
        }
    }

    /// Whether a NEW-VIEW may choose `phase` under this protocol.
    pub fn allows_fast_phase(self, phase: FastPhase) -> bool {
        match self {
            OrderProtocol::Aliph => matches!(phase, FastPhase::Quorum | FastPhase::Chain),
            _ => phase == self.first_fast_phase(),
        }
    }

    /// Whether clients send every request to every authentication member and accept the
    /// speculative reply quorum (a Quorum phase may run).
    pub fn speculates(self) -> bool {
        matches!(self, OrderProtocol::Quorum | OrderProtocol::Aliph)
    }

    /// The protocol named `name`, if there is one.
    pub fn from_name(name: &str) -> Option<OrderProtocol> {
        [
            OrderProtocol::Pbft,
            OrderProtocol::Lcr,
            OrderProtocol::Quorum,
            OrderProtocol::Chain,
            OrderProtocol::Aliph,
        ]
        .into_iter()
        .find(|p| p.name() == name)
        .or((name == "backup").then_some(OrderProtocol::Pbft))
    }
}

/// Why a configuration is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The fault model itself is not valid.
    #[error(transparent)]
    FaultModel(#[from] FaultModelError),
    /// Wrong number of replicas.
    #[error("u = {u}, r = {r} needs exactly {needed} replicas (2u + r + 1, and n_exec more with separate_stages), the config lists {listed}")]
    WrongReplicaCount {
        /// u
        u: usize,
        /// r
        r: usize,
        /// needed
        needed: usize,
        /// listed
        listed: usize,
    },
    /// A replica's id does not match its position.
    #[error("replica at position {position} has id {id}; replica ids must be 0, 1, 2, ... in order")]
    ReplicaIdOutOfOrder {
        /// position
        position: usize,
        /// id
        id: u32,
    },
    /// Two clients share an id.
    #[error("client id {0} is listed twice")]
    DuplicateClientId(u32),
    /// Two principals share a key.
    #[error("{0} and {1} have the same public key; every principal needs its own key pair")]
    DuplicateKey(String, String),
    /// A knob is out of range.
    #[error("knob {name} = {value} is invalid: {why}")]
    BadKnob {
        /// name
        name: &'static str,
        /// value
        value: u64,
        /// why
        why: &'static str,
    },
    /// No cluster name.
    #[error("cluster_name is empty")]
    EmptyName,
    /// The admin client is not a configured client.
    #[error("admin client {0} is not a configured client")]
    UnknownAdmin(u32),
    /// `selective_execution = true` with a service that cannot run selectively.
    #[error(
        "selective_execution = true needs a service with object checkpoints (Service::object_state) that can run selectively; this service cannot: run the kv or redis service, or set selective_execution = false"
    )]
    SelectiveExecutionUnsupported,
}

impl ClusterConfig {
    /// The first replica process hosting an execution member: 0 when the stages share processes,
    /// `2u + r + 1` (after the authentication and order processes) with `separate_stages`.
    pub fn exec_process_base(&self) -> u32 {
        match Quorums::new(self.u, self.r) {
            Ok(q) if self.separate_stages => q.n_order as u32,
            _ => 0,
        }
    }

    /// Checks the configuration; every stage constructor calls this first.
    pub fn validate(&self) -> Result<Quorums, ConfigError> {
        let mut q = self.protocol.quorums(self.u, self.r)?;
        let bad = |name, value: u64, why| Err(ConfigError::BadKnob { name, value, why });
        if self.separate_stages {
            let exec_u = self.exec_u.unwrap_or(self.u);
            if exec_u < self.u {
                return bad(
                    "exec_u",
                    exec_u as u64,
                    "must be at least u (the execution stage tolerates at least the failures the cluster does)",
                );
            }
            q = q.with_separate_stages(exec_u)?;
            if self.protocol != OrderProtocol::Pbft {
                return bad(
                    "separate_stages",
                    1,
                    "needs protocol = \"pbft\" (the fast phases and LCR hand batches to a co-located execution member)",
                );
            }
            if self.knobs.tentative_entries_max > 0 {
                return bad(
                    "tentative_entries_max",
                    self.knobs.tentative_entries_max as u64,
                    "must be 0 with separate_stages = true (tentative execution runs beside a co-located order member)",
                );
            }
            if self.admin.is_some() {
                return bad(
                    "admin",
                    1,
                    "must be unset with separate_stages = true (reconfiguration moves co-located members)",
                );
            }
        } else if let Some(exec_u) = self.exec_u {
            return bad(
                "exec_u",
                exec_u as u64,
                "needs separate_stages = true (co-located execution members number at most the order members)",
            );
        }
        if self.cluster_name.is_empty() {
            return Err(ConfigError::EmptyName);
        }
        if self.replicas.len() != q.n_replicas() {
            return Err(ConfigError::WrongReplicaCount {
                u: self.u,
                r: self.r,
                needed: q.n_replicas(),
                listed: self.replicas.len(),
            });
        }
        for (position, replica) in self.replicas.iter().enumerate() {
            if replica.id.0 as usize != position {
                return Err(ConfigError::ReplicaIdOutOfOrder {
                    position,
                    id: replica.id.0,
                });
            }
        }
        let mut client_ids = BTreeSet::new();
        for client in &self.clients {
            if !client_ids.insert(client.id) {
                return Err(ConfigError::DuplicateClientId(client.id.0));
            }
        }
        let mut x_keys = std::collections::BTreeMap::new();
        let mut e_keys = std::collections::BTreeMap::new();
        let named = self
            .replicas
            .iter()
            .map(|r| (format!("replica {}", r.id.0), r.keys))
            .chain(self.clients.iter().map(|c| (format!("client {}", c.id.0), c.keys)));
        for (name, keys) in named {
            if let Some(other) = x_keys.insert(keys.x25519, name.clone()) {
                return Err(ConfigError::DuplicateKey(other, name));
            }
            if let Some(other) = e_keys.insert(keys.ed25519, name.clone()) {
                return Err(ConfigError::DuplicateKey(other, name));
            }
        }
        if let Some(admin) = self.admin {
            if self.client_keys(admin).is_none() {
                return Err(ConfigError::UnknownAdmin(admin.0));
            }
        }
        let k = &self.knobs;
        if self.protocol == OrderProtocol::Lcr {
            if self.r != 0 {
                return bad(
                    "r",
                    self.r as u64,
                    "must be 0 with protocol = \"lcr\" (LCR tolerates crashes only)",
                );
            }
            if self.admin.is_some() {
                return bad(
                    "admin",
                    1,
                    "must be unset with protocol = \"lcr\" (its membership changes only through its own views)",
                );
            }
        }
        if self.protocol.speculates() {
            if self.r != self.u || self.r == 0 {
                return bad(
                    "r",
                    self.r as u64,
                    if self.protocol == OrderProtocol::Quorum {
                        "must equal u and be at least 1 with protocol = \"quorum\" (Aliph's model: 3f + 1 replicas; use \"lcr\" or \"pbft\" otherwise)"
                    } else {
                        "must equal u and be at least 1 with protocol = \"aliph\" (Aliph's model: 3f + 1 replicas; use \"chain\", \"lcr\" or \"pbft\" otherwise)"
                    },
                );
            }
            if self.admin.is_some() {
                return bad(
                    "admin",
                    1,
                    "must be unset with protocol = \"quorum\" or \"aliph\" (reconfiguration runs under \"pbft\" only)",
                );
            }
        }
        if self.protocol == OrderProtocol::Chain {
            if self.r == 0 {
                return bad(
                    "r",
                    0,
                    "must be at least 1 with protocol = \"chain\" (a crash-only cluster runs \"lcr\")",
                );
            }
            if self.admin.is_some() {
                return bad(
                    "admin",
                    1,
                    "must be unset with protocol = \"chain\" (reconfiguration runs under \"pbft\" only)",
                );
            }
        }
        if self.protocol.has_fast_phase() {
            if k.quorum_backup_batches == 0 {
                return bad("quorum_backup_batches", 0, "must be at least 1");
            }
            if k.aliph_one_client_us == 0 {
                return bad("aliph_one_client_us", 0, "must be positive");
            }
            if k.quorum_commit_timeout_us == 0 {
                return bad("quorum_commit_timeout_us", 0, "must be positive");
            }
        }
        if self.selective_execution {
            if k.tentative_entries_max > 0 {
                return bad(
                    "tentative_entries_max",
                    k.tentative_entries_max as u64,
                    "must be 0 with selective_execution = true (a tentative batch would be rolled back on members that skipped part of it)",
                );
            }
            if self.admin.is_some() {
                return bad(
                    "admin",
                    1,
                    "must be unset with selective_execution = true (a reconfiguration would move objects to other maintainers)",
                );
            }
            if matches!(self.protocol, OrderProtocol::Quorum | OrderProtocol::Aliph) {
                return bad(
                    "selective_execution",
                    1,
                    "must be false with protocol = \"quorum\" or \"aliph\" (their Quorum phase executes on every replica)",
                );
            }
        }
        if k.batch_size_max == 0 || k.batch_size_max > crate::limits::BATCH_REQUESTS_MAX {
            return bad(
                "batch_size_max",
                k.batch_size_max as u64,
                "must be 1 to BATCH_REQUESTS_MAX",
            );
        }
        if k.checkpoint_interval == 0 {
            return bad("checkpoint_interval", 0, "must be at least 1");
        }
        if k.heartbeat_interval_us != 0 && k.heartbeat_interval_us < 1_000 {
            return bad(
                "heartbeat_interval_us",
                k.heartbeat_interval_us,
                "must be 0 (off) or at least 1000",
            );
        }
        if k.log_window != 2 * k.checkpoint_interval {
            return bad("log_window", k.log_window, "must be 2 * checkpoint_interval");
        }
        if k.pipeline_window == 0 || k.pipeline_window > k.log_window {
            return bad("pipeline_window", k.pipeline_window, "must be 1 to log_window");
        }
        if k.client_retransmit_initial_us == 0 || k.client_retransmit_max_us < k.client_retransmit_initial_us {
            return bad(
                "client_retransmit_max_us",
                k.client_retransmit_max_us,
                "must be >= client_retransmit_initial_us > 0",
            );
        }
        if k.read_only_timeout_us == 0 || k.read_only_timeout_us > k.client_retransmit_max_us {
            return bad(
                "read_only_timeout_us",
                k.read_only_timeout_us,
                "must be 1 to client_retransmit_max_us",
            );
        }
        if k.view_change_timeout_us == 0 {
            return bad("view_change_timeout_us", 0, "must be positive");
        }
        if k.request_bytes_max > crate::limits::OPERATION_BYTES_MAX {
            return bad(
                "request_bytes_max",
                k.request_bytes_max as u64,
                "must be at most OPERATION_BYTES_MAX",
            );
        }
        if k.reply_bytes_max > crate::limits::OPERATION_BYTES_MAX {
            return bad(
                "reply_bytes_max",
                k.reply_bytes_max as u64,
                "must be at most OPERATION_BYTES_MAX",
            );
        }
        if k.inline_request_bytes_max > k.request_bytes_max {
            return bad(
                "inline_request_bytes_max",
                k.inline_request_bytes_max as u64,
                "must be at most request_bytes_max",
            );
        }
        if k.state_chunk_bytes == 0 || k.state_chunk_bytes > crate::limits::STATE_CHUNK_BYTES_MAX {
            return bad(
                "state_chunk_bytes",
                k.state_chunk_bytes as u64,
                "must be 1 to STATE_CHUNK_BYTES_MAX",
            );
        }
        Ok(q)
    }

    /// The configuration epoch: 0 as initialised, one more with each reconfiguration.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The id of the replica with long-term keys `keys` here (ids are positions, so the same
    /// replica may have another id in another configuration).
    pub fn replica_with(&self, keys: &PublicKeys) -> Option<ReplicaId> {
        self.replicas
            .iter()
            .position(|r| r.keys == *keys)
            .map(|i| ReplicaId(i as u32))
    }

    /// Whether `principal` is a member or client of this configuration.
    pub fn contains(&self, principal: Principal, quorums: &Quorums) -> bool {
        match principal {
            Principal::Client(c) => self.client_keys(c).is_some(),
            Principal::Auth(r) => (r.0 as usize) < quorums.n_auth,
            Principal::Order(r) => (r.0 as usize) < quorums.n_order,
            Principal::Exec(r) => (r.0 as usize) < quorums.n_exec,
        }
    }

    /// A client's public keys, if it is authorised.
    pub fn client_keys(&self, client: ClientId) -> Option<&PublicKeys> {
        // Clients are few and looked up at key-derivation time only.
        self.clients.iter().find(|c| c.id == client).map(|c| &c.keys)
    }

    /// All members of one stage, in index order.
    pub fn auth_members(quorums: &Quorums) -> impl Iterator<Item = Principal> + Clone {
        (0..quorums.n_auth as u32).map(|i| Principal::Auth(ReplicaId(i)))
    }

    /// All order members, in index order.
    pub fn order_members(quorums: &Quorums) -> impl Iterator<Item = Principal> + Clone {
        (0..quorums.n_order as u32).map(|i| Principal::Order(ReplicaId(i)))
    }

    /// All execution members, in index order.
    pub fn exec_members(quorums: &Quorums) -> impl Iterator<Item = Principal> + Clone {
        (0..quorums.n_exec as u32).map(|i| Principal::Exec(ReplicaId(i)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::fixture;

    fn base() -> ClusterConfig {
        (*fixture(1, 1, 2, Knobs::default()).config).clone()
    }

    fn error(config: &ClusterConfig) -> String {
        config.validate().unwrap_err().to_string()
    }

    #[test]
    fn bad_configurations_are_clear_errors() {
        let mut c = base();
        c.r = 2;
        assert!(error(&c).contains("r = 2 exceeds u = 1"));
        let mut c = base();
        c.replicas.pop();
        assert!(error(&c).contains("needs exactly 4 replicas"), "{}", error(&c));
        let mut c = base();
        c.replicas.swap(0, 1);
        assert!(error(&c).contains("position 0 has id 1"));
        let mut c = base();
        c.clients[1].id = c.clients[0].id;
        assert!(error(&c).contains("client id 0 is listed twice"));
        let mut c = base();
        c.clients[1].keys = c.replicas[2].keys;
        assert!(
            error(&c).contains("replica 2 and client 1 have the same public key"),
            "{}",
            error(&c)
        );
        let mut c = base();
        c.knobs.log_window = 3;
        assert!(error(&c).contains("log_window"));
        let mut c = base();
        c.knobs.batch_size_max = 0;
        assert!(error(&c).contains("batch_size_max"));
        let mut c = base();
        c.knobs.read_only_timeout_us = 0;
        assert!(error(&c).contains("read_only_timeout_us"));
        c.knobs.read_only_timeout_us = READ_ONLY_TIMEOUT_US_DEFAULT;
        c.knobs.heartbeat_interval_us = 999;
        assert!(error(&c).contains("heartbeat_interval_us"));
        c.knobs.heartbeat_interval_us = 0;
        assert!(c.validate().is_ok(), "0 turns heartbeats off");
        c.knobs.read_only_timeout_us = 0;
        c.knobs.read_only_timeout_us = c.knobs.client_retransmit_max_us + 1;
        assert!(error(&c).contains("read_only_timeout_us"));
        let mut c = base();
        c.cluster_name.clear();
        assert!(error(&c).contains("cluster_name"));
        assert!(base().validate().is_ok());
    }

    /// `c` is refused with tentative execution on and with an administrator; left as it was.
    fn refuses_tentative_execution_and_an_admin(c: &mut ClusterConfig) {
        c.knobs.tentative_entries_max = 8;
        assert!(error(c).contains("tentative_entries_max"), "{}", error(c));
        c.knobs.tentative_entries_max = 0;
        c.admin = Some(c.clients[0].id);
        assert!(error(c).contains("admin"), "{}", error(c));
        c.admin = None;
    }

    #[test]
    fn selective_execution_refuses_what_it_does_not_go_with() {
        let mut c = base();
        c.selective_execution = true;
        assert!(c.validate().is_ok());
        refuses_tentative_execution_and_an_admin(&mut c);
        for protocol in [OrderProtocol::Quorum, OrderProtocol::Aliph] {
            c.protocol = protocol;
            assert!(error(&c).contains("selective_execution"), "{}", error(&c));
        }
        c.protocol = OrderProtocol::Chain;
        assert!(c.validate().is_ok());
    }

    #[test]
    fn separate_stages_need_their_replicas_and_refuse_what_they_do_not_go_with() {
        let mut c = base();
        c.exec_u = Some(2);
        assert!(error(&c).contains("needs separate_stages = true"), "{}", error(&c));
        c.separate_stages = true;
        // u = r = 1 with the execution stage at u = 2: 4 + 5 processes.
        assert!(error(&c).contains("needs exactly 9 replicas"), "{}", error(&c));
        let f = fixture(1, 1, 2, Knobs::default());
        c.replicas = f.config.replicas.clone();
        c.replicas.extend((0..5u8).map(|i| ReplicaInfo {
            id: ReplicaId(4 + i as u32),
            keys: crate::crypto::SecretKeys::from_seed([200 + i; 32]).public(),
        }));
        let q = c.validate().expect("4 + 5 processes");
        assert_eq!((q.n_order, q.n_exec, q.u_exec, q.checkpoint_token()), (4, 5, 2, 3));
        assert_eq!(c.exec_process_base(), 4);
        c.exec_u = Some(0);
        assert!(error(&c).contains("exec_u"), "{}", error(&c));
        c.exec_u = Some(2);
        refuses_tentative_execution_and_an_admin(&mut c);
        c.knobs.key_refresh_us = 1_000_000;
        assert!(
            c.validate().is_ok(),
            "execution-only processes keep their own key schedule"
        );
        c.knobs.key_refresh_us = 0;
        for protocol in [OrderProtocol::Quorum, OrderProtocol::Chain, OrderProtocol::Aliph] {
            c.protocol = protocol;
            assert!(error(&c).contains("separate_stages"), "{}", error(&c));
        }
        c.protocol = OrderProtocol::Pbft;
        c.selective_execution = true;
        assert!(
            c.validate().is_ok(),
            "selective execution on execution-only replicas (ODRC-6)"
        );
    }

    #[test]
    fn quorum_protocol_needs_u_equal_r_and_runs_execution_on_every_replica() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = (*f.config).clone();
        c.protocol = OrderProtocol::Quorum;
        let q = c.validate().expect("u = r = 1 runs Quorum");
        assert_eq!((q.n_order, q.n_exec, q.speculative_reply()), (4, 4, 4));
        assert_eq!(ClusterConfig::exec_members(&q).count(), 4);
        c.knobs.quorum_backup_batches = 0;
        assert!(c.validate().unwrap_err().to_string().contains("quorum_backup_batches"));
        let f = fixture(1, 0, 1, Knobs::default());
        let mut c = (*f.config).clone();
        c.protocol = OrderProtocol::Quorum;
        assert!(c.validate().unwrap_err().to_string().contains("must equal u"));
        assert_eq!(OrderProtocol::from_name("quorum"), Some(OrderProtocol::Quorum));
    }

    #[test]
    fn chain_protocol_needs_r_of_at_least_one_and_keeps_the_stage_sizes() {
        let f = fixture(2, 1, 1, Knobs::default());
        let mut c = (*f.config).clone();
        c.protocol = OrderProtocol::Chain;
        let q = c.validate().expect("u = 2, r = 1 runs Chain");
        assert_eq!((q.n_order, q.n_exec), (6, 5));
        c.knobs.quorum_backup_batches = 0;
        assert!(c.validate().unwrap_err().to_string().contains("quorum_backup_batches"));
        let f = fixture(1, 0, 1, Knobs::default());
        let mut c = (*f.config).clone();
        c.protocol = OrderProtocol::Chain;
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("must be at least 1 with protocol = \"chain\""), "{e}");
        assert_eq!(OrderProtocol::from_name("chain"), Some(OrderProtocol::Chain));
        assert!(OrderProtocol::Chain.has_fast_phase() && !OrderProtocol::Pbft.has_fast_phase());
    }

    #[test]
    fn aliph_protocol_needs_u_equal_r_and_backup_names_pbft() {
        let f = fixture(1, 1, 1, Knobs::default());
        let mut c = (*f.config).clone();
        c.protocol = OrderProtocol::Aliph;
        let q = c.validate().expect("u = r = 1 runs Aliph");
        assert_eq!(
            (q.n_order, q.n_exec),
            (4, 4),
            "Quorum views: execution on every replica"
        );
        c.knobs.aliph_one_client_us = 0;
        assert!(c.validate().unwrap_err().to_string().contains("aliph_one_client_us"));
        let f = fixture(2, 1, 1, Knobs::default());
        let mut c = (*f.config).clone();
        c.protocol = OrderProtocol::Aliph;
        let e = c.validate().unwrap_err().to_string();
        assert!(
            e.contains("must equal u and be at least 1 with protocol = \"aliph\""),
            "{e}"
        );
        let aliph = OrderProtocol::Aliph;
        assert_eq!(aliph.first_fast_phase(), FastPhase::Quorum);
        assert!(aliph.allows_fast_phase(FastPhase::Chain) && aliph.allows_fast_phase(FastPhase::Quorum));
        assert!(!aliph.allows_fast_phase(FastPhase::None));
        assert!(!OrderProtocol::Quorum.allows_fast_phase(FastPhase::Chain));
        assert!(!OrderProtocol::Pbft.allows_fast_phase(FastPhase::Quorum));
        assert_eq!(OrderProtocol::from_name("aliph"), Some(aliph));
        assert_eq!(OrderProtocol::from_name("backup"), Some(OrderProtocol::Pbft));
    }
}
