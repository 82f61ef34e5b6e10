//! Named limits of the platform's newer parts (pushed messages), each with why it is what it is.
//! The message bounds still live beside the messages (`crate::message`), the stages' own bounds
//! in their modules.

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
