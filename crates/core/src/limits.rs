//! Named limits, each with why it is what it is, in one place: the fault model's, every
//! message's bounds (the codec checks them before allocating), the pushed messages', and the
//! stages' working bounds (every queue, cache and in-flight set; their modules re-export them
//! where they are used).

/// Largest `u` a configuration may use. Bounds the stage sizes (`n <= 3 * MAX_FAULTS + 1`) and with
/// them every per-member table.
pub const MAX_FAULTS: usize = 10;

/// Most requests in one batch.
pub const BATCH_REQUESTS_MAX: usize = 1024;
/// Largest client operation or reply, in bytes.
pub const OPERATION_BYTES_MAX: usize = 4 << 20;
/// Largest state-transfer chunk.
pub const STATE_CHUNK_BYTES_MAX: usize = 1 << 20;
/// Most chunks in one checkpoint (bounds the manifest): with 1 MiB chunks, 64 GiB of state.
pub const STATE_CHUNKS_MAX: usize = 65_536;
/// Largest page of a paged service's state (a BFS file block is 4 KiB; a ZooKeeper node's data
/// at most 1 MiB spans several pages).
pub const PAGE_BYTES_MAX: usize = 64 * 1024;
/// Most tree nodes or pages asked for in one FETCH-PAGES (bounds the request and, with
/// [`PAGE_BYTES_MAX`], the answer: 4 MiB of pages plus 64 nodes of 16 digests).
pub const PAGE_ITEMS_PER_FETCH: usize = 64;
/// Most entries in any list carried by a control message (view-change sets, certificates,
/// client tables).
pub const LIST_ENTRIES_MAX: usize = 65_536;
/// Most (entry, row) items in one AUTH-REQ: an authentication member sends a larger round as
/// several messages (never drops an item).
pub const AUTH_ITEMS_MAX: usize = 512;
/// Largest encoded message. Frames above this are rejected before decoding.
pub const MESSAGE_BYTES_MAX: usize = 64 << 20;

/// Largest pushed message, in bytes (a watch event or a pub/sub message, not bulk data).
pub const PUSH_BYTES_MAX: usize = 64 * 1024;

/// Pushes an execution member keeps per client for a client that missed some (network loss, a
/// restart): it resends them on PUSH-RESUME; older ones are reported as a gap. Bounds the push
/// log in memory and in every checkpoint to this many per configured client.
pub const PUSHES_KEPT_PER_CLIENT: usize = 64;

/// Pushes an execution member resends for one PUSH-RESUME (the client asks again for more).
pub const PUSHES_RESENT_MAX: usize = 16;

/// How far past its next expected push a client keeps candidates (sequence numbers
/// `next .. next + PUSH_WINDOW`); pushes further ahead are dropped and fetched again later.
pub const PUSH_WINDOW: u64 = 2 * PUSHES_KEPT_PER_CLIENT as u64;

/// Object streams of pushes (selective execution, docs/ODRC.md "Per-object push streams") one
/// PUSH-RESUME lists: the streams with a hole first, then the others in turn, so each followed
/// stream is asked about within `PUSH_STREAMS_FOLLOWED_MAX / PUSH_STREAMS_MAX` polls.
pub const PUSH_STREAMS_MAX: usize = 64;

/// Object streams a client follows (a ZooKeeper gateway's sessions watch many znodes through
/// one client; `upright demo`'s gateway runs 64 clients); past it the client forgets the one
/// idle longest.
pub const PUSH_STREAMS_FOLLOWED_MAX: usize = 1024;

/// Bytes of object-stream pushes a client holds ahead of a stream's next one (a push missing,
/// or copies short of a quorum); past it such a push is dropped and fetched again by the poll,
/// so a lying member sending far-ahead copies on every followed stream cannot make the client
/// hold more (copies of each stream's next push are always taken: progress never waits on this
/// bound, and they are at most one per member per followed stream).
pub const PUSH_HELD_BYTES_MAX: usize = 16 << 20;

/// Pushes an execution member keeps per object stream (one client's pushes on one object) for a
/// client that missed some; a stream's kept pushes are part of its object's state, so the bound
/// is per stream (a bound across streams would make objects depend on each other).
pub const PUSHES_KEPT_PER_STREAM: usize = 16;

/// Longest name of an object stream, in bytes: a push on a longer object is dropped (counted
/// `push_stream_name_too_long`) and its stream not announced.
pub const PUSH_STREAM_NAME_MAX: usize = 4096;

// ---- the stages' working bounds (each queue, cache and in-flight set), by stage ----

// Replica host

/// Most local (co-located) deliveries handled in one flush before yielding back to the network.
pub const LOCAL_ROUNDS_MAX: usize = 10_000;

// Client

/// Most operations waiting behind the outstanding one.
pub const CLIENT_QUEUE_MAX: usize = 1024;

// Authentication stage

/// Most items waiting for the backup delay; the oldest go at once beyond it.
pub const LATER_MAX: usize = 4 * AUTH_ITEMS_MAX;

// Order stage

/// How far beyond its last ordered request a client's requests are kept (clients have one
/// outstanding request; a little slack covers a member that lags behind the commit point).
pub const POOL_AHEAD_MAX: u64 = 4;

/// Most pre-prepared claims (`Q` entries, one per distinct digest) kept per sequence number; the
/// claims with the lowest views are dropped first (PBFT's bound `M`, thesis 3.2.5). Safe: after a
/// batch commits at `(v, n)`, correct members only ever pre-prepare that batch at `n` in views
/// above `v`, so its claim is always among the newest.
pub const Q_CLAIMS_PER_SLOT_MAX: usize = 2;

/// Largest exponent of the doubling view-change timeout.
pub const VIEW_CHANGE_BACKOFF_MAX: u32 = 10;

/// Upper bound of the doubled [`crate::order::QUIET_AGAIN_AFTER`].
pub const QUIET_AGAIN_AFTER_MAX: u64 = 4096;

/// Most NEXT-BATCH messages resent in answer to one LAST-EXEC.
pub const LAST_EXEC_RESEND_MAX: u64 = 32;

/// Most bytes of inline request bodies the primary puts in one batch after its first entry
/// (PROTOCOL.md step 3). With inline bodies of up to `inline_request_bytes_max` (16 KiB by
/// default) and `batch_size_max` (128) entries a batch could otherwise reach 2 MiB, and the 128
/// slots of the log window 256 MiB; with it, a batch stays within 1 MiB plus one body (or the
/// configured inline bound times `batch_size_max`, if that is less).
pub const BATCH_INLINE_BYTES_MAX: usize = 1 << 20;

/// Most checkpoint votes kept per order member (the lowest are dropped first). Correct members
/// have at most two unstable checkpoints at a time (the interlock); a little slack lets a lagging
/// member collect the votes of a checkpoint far ahead of it.
pub const VOTES_PER_MEMBER_MAX: usize = 4;

// Execution stage

/// Most bodies being fetched for batches after the next one to execute. The next batch's bodies
/// are always fetched (at most `BATCH_REQUESTS_MAX` more), so a later batch can never starve it.
pub const FETCHES_OUTSTANDING_MAX: usize = 1024;

/// Checkpoints kept in memory and in storage (the newest ones), and served to peers: three,
/// because the order stage's stable checkpoint, the one a lagging member loads, can be two
/// behind a member's newest (the interlock orders up to `2 * checkpoint_interval` past it).
pub const CHECKPOINTS_KEPT: usize = 3;

/// A kept checkpoint a peer fetched from (manifest or chunk) stays kept, beside the newest
/// [`CHECKPOINTS_KEPT`], until this many newer checkpoints were taken since it was last served:
/// a transfer over lossy links that retries each `exec_retry_us` then finishes while the cluster
/// checkpoints fast (under Aliph's Quorum every request is a batch), instead of chasing newer
/// checkpoints that are dropped in turn before it is done. At most one such extra checkpoint per
/// execution peer (its latest fetch).
pub const CHECKPOINT_SERVED_PIN: u32 = 8;

/// Most client signatures an authentication member checks in one batch (`KeyRing::verify_signatures`):
/// the new signed requests of one round, checked at its flush; a round with more checks each full
/// batch at once.
pub const SIGNATURE_BATCH_MAX: usize = 64;

/// Most chunk requests outstanding at once during a state transfer.
pub const CHUNKS_IN_FLIGHT_MAX: usize = 4;

/// Most bytes of stored pages a paged service keeps cached in memory (its pages changed since
/// the last checkpoint are held besides, until the next checkpoint writes them to the store).
pub const PAGE_CACHE_BYTES: u64 = 256 << 20;

/// Items (nodes and pages) asked for and not yet answered, across all peers. With
/// [`PAGE_ITEMS_PER_FETCH`] per request, several requests per peer are outstanding at once.
pub const PAGE_ITEMS_IN_FLIGHT_MAX: usize = 8 * PAGE_ITEMS_PER_FETCH;

// Services

/// Most keys with watches at once; a `Get` past it sets no watch (deterministically: every
/// replica has the same watches).
pub const WATCHED_KEYS_MAX: usize = 65_536;

/// Most batches a view's Backup phase may order under `protocol = "quorum"` (Aliph's `k`,
/// doubled after each Quorum phase that committed fewer batches than the Backup phase before
/// it): a faulty primary can keep the cluster on the three-phase path at most this long per view.
pub const QUORUM_BACKUP_BATCHES_MAX: u64 = 4096;

/// Object states in one OBJECT-CP (selective execution, docs/ODRC.md), in bytes: objects beyond
/// it are left out, and the members that need them bring them up to date by replay instead.
pub const OBJECT_CP_BYTES_MAX: usize = 8 << 20;
