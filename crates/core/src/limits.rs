//! Named limits, each with why it is what it is: the fault model's, every message's bounds (the
//! codec checks them before allocating), and the pushed messages'. The stages' own working
//! bounds (queues, caches) are named in their modules.

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
